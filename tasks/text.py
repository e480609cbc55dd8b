"""Byte-level language modelling on a small real corpus that every machine has offline.

Why this corpus: the gap-recovery experiment (paper app. "Comparison with Exact Sequential
Training") needs a language-like task with a BPB metric that a CPU can train on in minutes, with
no download. Two corpora ship with every CPython:

  "stdlib" (default): the top-level `*.py` files of the running interpreter's standard library
      (`sysconfig.get_paths()["stdlib"]`, 168 files / 4.7 MB on CPython 3.11): real, varied text
      with long-range structure (indentation, names reused across lines, docstrings in English).
  "pydoc": the English reference-manual topics in `pydoc_data.topics` (~465k characters).

Tokenizer: raw UTF-8 bytes, vocab_size = 256, so every token is one byte and
BPB = mean cross-entropy in nats / ln 2 (the paper's metric; `lrt_lab.run.metrics.bits_per_byte`).

Split by file, never by offset: a file (or pydoc topic) is in the validation split when the first
byte of sha256(its name) is < 26 (about 10%), so adding a file never moves the others.
Which split `sample` draws from: `split="train"|"val"`, or by default the validation split when the
generator was seeded with an evaluation seed (>= 2**62, `lrt_tasks.eval_sets.EVAL_SEED_OFFSET`;
training seeds are small run seeds), so `make_eval_sets` and the training loop's evaluation read
held-out text without any change to them.

Batch: inputs = bytes[o : o+T], targets = bytes[o+1 : o+T+1] (next byte, already shifted), every
position counts; state = inputs (the byte just read: what a probe of "does the memory carry the
previous token" decodes). A different Python version gives a different corpus: `eval_key` carries
the corpus fingerprint, and BPB is comparable only between runs with the same fingerprint.
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
from pathlib import Path

import torch

from lrt_tasks.base import Batch, Task, fail
from lrt_tasks.curriculum import LengthCurriculum
from lrt_tasks.eval_sets import EVAL_SEED_OFFSET

CORPORA = ("stdlib", "pydoc")
SPLITS = ("train", "val")
VAL_CUTOFF = 26  # first sha256 byte < 26 of 256: ~10% of documents are held out


def _is_val(name: str) -> bool:
    return hashlib.sha256(name.encode()).digest()[0] < VAL_CUTOFF


def _documents(corpus: str) -> list[tuple[str, bytes]]:
    if corpus == "stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        return [(p.name, p.read_bytes()) for p in sorted(root.glob("*.py"))]
    from pydoc_data.topics import topics

    return [(k, topics[k].encode("utf-8")) for k in sorted(topics)]


@functools.cache
def load_corpus(corpus: str = "stdlib") -> dict:
    """{"train": uint8 tensor, "val": uint8 tensor, "fingerprint": str, "files": {split: n}}."""
    if corpus not in CORPORA:
        fail("corpus", corpus, ", ".join(map(repr, CORPORA)))
    docs = _documents(corpus)
    parts = {s: [] for s in SPLITS}
    for name, data in docs:
        parts["val" if _is_val(name) else "train"].append(data)
    digest = hashlib.sha256()
    for name, data in docs:
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    out = {"fingerprint": digest.hexdigest()[:12], "files": {s: len(parts[s]) for s in SPLITS}}
    for s in SPLITS:
        out[s] = torch.frombuffer(bytearray(b"".join(parts[s])), dtype=torch.uint8)
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
