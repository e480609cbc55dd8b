"""Byte-level BPE tokenizer for FineWeb pretraining: train with HF ``tokenizers``, encode with
``tiktoken``.

Why these two libraries
-----------------------
* **Training** uses Hugging Face ``tokenizers`` (Rust, multi-threaded, maintained by HF, already a
project
  dependency). Its ``BpeTrainer`` learns byte-level BPE over the chunks of a custom split regex,
  which is all we need; nanochat's ``rustbpe`` does the same job but would add a dependency for no
  gain here.
* **Encoding** uses OpenAI's ``tiktoken`` (Rust, the fastest BPE encoder around, with a
thread-pooled
  ``encode_ordinary_batch``). nanochat makes the same choice. The learned merges are exported as
  tiktoken "mergeable ranks": the 256 single bytes get ranks 0..255 and the i-th merge rank 256+i,
  so the token id of an ordinary token *is* its rank and both libraries produce the same ids.

Conventions (nanochat's)
------------------------
* Split pattern: GPT-4's (cl100k) regex, with numbers split into at most 2 digits instead of 3
  (nanochat's choice; it wastes fewer merges on number chunks at a 32K vocabulary).
* Special tokens come *after* all ordinary tokens: ids ``n_ordinary .. vocab_size-1``. ``<|bos|>``
is the
  first of them and is the document delimiter the loader prepends to every document.
* ``encode`` never parses special tokens out of text: a document that literally contains ``<|bos|>``
  is encoded as ordinary bytes, so data can never inject control tokens.
* ``token_bytes()`` gives the UTF-8 byte length of every token id (0 for special tokens). Bits per
  byte is then ``sum(nats) / (ln 2 * sum(token_bytes[targets]))``, with special-token targets
  counting zero bytes (mask them out of the nats too), which makes the metric independent of
  vocabulary size.

Files written by ``save(dir)``: ``tokenizer.tiktoken`` (tiktoken's own format: base64 token bytes
and rank per line) and ``tokenizer.json`` (split pattern, special tokens, format version).
"""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import tiktoken
import torch

# GPT-4's split pattern with \p{N}{1,2} instead of \p{N}{1,3} (as nanochat).
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)
BOS = "<|bos|>"
# nanochat's special tokens: BOS first (document delimiter), then the chat/tool-use markers for
# later stages.
SPECIAL_TOKENS = (
    BOS,
    "<|user_start|>",
    "<|user_end|>",
    "<|assistant_start|>",
    "<|assistant_end|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|output_start|>",
    "<|output_end|>",
)
DEFAULT_VOCAB_SIZE = 32768
RANKS_FILE = "tokenizer.tiktoken"
CONFIG_FILE = "tokenizer.json"
FORMAT_VERSION = 1


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-char table, used by HF's ByteLevel pre-tokenizer for its vocab
    strings."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


def _hf_token_to_bytes(token: str) -> bytes:
    return bytes(_UNICODE_TO_BYTE[ch] for ch in token)


class Tokenizer:
    """A trained byte-level BPE: tiktoken encoder plus the metadata the loader and BPB need."""

    def __init__(
        self,
        mergeable_ranks: dict[bytes, int],
        special_tokens: Sequence[str] = SPECIAL_TOKENS,
        pattern: str = SPLIT_PATTERN,
        name: str = "lrt_bpe",
    ):
        special_tokens = tuple(special_tokens)
        if not special_tokens or special_tokens[0] != BOS:
            raise ValueError(f"special_tokens: must start with {BOS!r}, got {special_tokens[:1]!r}")
        if len(set(special_tokens)) != len(special_tokens):
            raise ValueError("special_tokens: duplicates are not allowed")
        ranks = sorted(mergeable_ranks.values())
        if ranks != list(range(len(ranks))):
            raise ValueError("mergeable_ranks: ranks must be exactly 0..n-1")
        missing = [b for b in range(256) if bytes([b]) not in mergeable_ranks]
        if missing:
            raise ValueError(
                f"mergeable_ranks: missing {len(missing)} single-byte tokens (e.g. byte "
                f"{missing[0]})"
            )
        self.mergeable_ranks = dict(mergeable_ranks)
        self.pattern = pattern
        self.special_tokens = special_tokens
        n = len(self.mergeable_ranks)
        self._special_ids = {tok: n + i for i, tok in enumerate(special_tokens)}
        self._enc = tiktoken.Encoding(
            name=name,
            pat_str=pattern,
            mergeable_ranks=self.mergeable_ranks,
            special_tokens=self._special_ids,
        )

    # ------------------------------------------------------------------ properties
    @property
    def vocab_size(self) -> int:
        return len(self.mergeable_ranks) + len(self.special_tokens)

    @property
    def n_ordinary(self) -> int:
        """Number of ordinary (byte-sequence) tokens; ids below
        this are ordinary, the rest special."""
        return len(self.mergeable_ranks)

    @property
    def bos_token_id(self) -> int:
        return self._special_ids[BOS]

    def special_token_id(self, token: str) -> int:
        if token not in self._special_ids:
            raise ValueError(f"token: {token!r} is not a special token of this tokenizer")
        return self._special_ids[token]

    # ------------------------------------------------------------------ encode / decode
    def encode(self, text: str, prepend_bos: bool = False) -> list[int]:
        """Encode ``text`` as ordinary bytes (special-token strings in it are *not* parsed)."""
        ids = self._enc.encode_ordinary(text)
        return [self.bos_token_id, *ids] if prepend_bos else ids

    def encode_batch(
        self, texts: Sequence[str], prepend_bos: bool = False, num_threads: int = 8
    ) -> list[list[int]]:
        """Encode many texts on ``num_threads`` tiktoken threads (the GIL is released in Rust)."""
        if num_threads < 1:
            raise ValueError(f"num_threads: must be >= 1, got {num_threads}")
        out = self._enc.encode_ordinary_batch(list(texts), num_threads=num_threads)
        if prepend_bos:
            bos = self.bos_token_id
            out = [[bos, *ids] for ids in out]
        return out

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Exact bytes of ``ids`` (special tokens rendered as their names)."""
        return self._enc.decode_bytes(self._check_ids(ids))

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Text of ``ids``; a slice that cuts a multi-byte character decodes with U+FFFD
        (``errors``)."""
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids: {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        return ids

    def id_to_bytes(self, token_id: int) -> bytes:
        return self._enc.decode_single_token_bytes(self._check_ids([token_id])[0])

    # ------------------------------------------------------------------ BPB support
    def token_bytes(self) -> torch.Tensor:
        """LongTensor [vocab_size]: UTF-8 byte length of each token id; 0 for special tokens."""
        lengths = [0] * self.vocab_size
        for tok, rank in self.mergeable_ranks.items():
            lengths[rank] = len(tok)
        return torch.tensor(lengths, dtype=torch.long)

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | os.PathLike) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        lines = [
            f"{base64.b64encode(tok).decode('ascii')} {rank}"
            for tok, rank in sorted(self.mergeable_ranks.items(), key=lambda kv: kv[1])
        ]
        _atomic_write(d / RANKS_FILE, "\n".join(lines) + "\n")
        cfg = {
            "format_version": FORMAT_VERSION,
            "pattern": self.pattern,
            "special_tokens": list(self.special_tokens),
            "vocab_size": self.vocab_size,
        }
        _atomic_write(d / CONFIG_FILE, json.dumps(cfg, indent=2) + "\n")
        return d

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Tokenizer:
        d = Path(directory)
        if not (d / RANKS_FILE).is_file() or not (d / CONFIG_FILE).is_file():
            raise ValueError(
                f"directory: {d} holds no saved tokenizer ({RANKS_FILE} and {CONFIG_FILE})"
            )
        cfg = json.loads((d / CONFIG_FILE).read_text())
        if cfg.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"format_version: expected {FORMAT_VERSION}, got {cfg.get('format_version')!r}"
            )
        ranks = {}
        for line in (d / RANKS_FILE).read_text().splitlines():
            if line:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
        tok = cls(ranks, special_tokens=cfg["special_tokens"], pattern=cfg["pattern"])
        if tok.vocab_size != cfg["vocab_size"]:
            raise ValueError(
                f"vocab_size: config says {cfg['vocab_size']}, files give {tok.vocab_size}"
            )
        return tok

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, n_special={len(self.special_tokens)})"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _capped(text_iter: Iterable[str], max_chars: int | None, doc_cap: int | None) -> Iterator[str]:
    total = 0
    for text in text_iter:
        if doc_cap is not None:
            text = text[:doc_cap]
        if max_chars is not None and total + len(text) > max_chars:
            text = text[: max_chars - total]
        if text:
            yield text
        total += len(text)
        if max_chars is not None and total >= max_chars:
            return


def train_tokenizer(
    text_iter: Iterable[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
    *,
    pattern: str = SPLIT_PATTERN,
    max_chars: int | None = None,
    doc_cap: int | None = 10_000,
) -> Tokenizer:
    """Train a byte-level BPE on ``text_iter`` and return a tiktoken-backed :class:`Tokenizer`.

    ``vocab_size`` counts the 256 byte tokens, the merges and the special tokens, so the model's
    embedding table has exactly this many rows. ``doc_cap`` truncates each document (long documents
    mostly repeat themselves and would dominate pair counts) and ``max_chars`` bounds the whole
    training text (nanochat trains on ~2B characters). If the text is too small to learn every
    merge, the returned tokenizer has fewer tokens than asked; check ``tokenizer.vocab_size``.
    """
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as HFTokenizer

    special_tokens = tuple(special_tokens)
    if vocab_size < 256 + len(special_tokens) + 1:
        raise ValueError(
            f"vocab_size: must exceed 256 bytes + {len(special_tokens)} special tokens, got "
            f"{vocab_size}"
        )
    for name, val in (("max_chars", max_chars), ("doc_cap", doc_cap)):
        if val is not None and val < 1:
            raise ValueError(f"{name}: must be >= 1 or None, got {val}")

    hf = HFTokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(special_tokens),  # special tokens are appended after training
        min_frequency=2,  # a pair seen once is noise, not a merge
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    hf.train_from_iterator(_capped(text_iter, max_chars, doc_cap), trainer=trainer)

    merges = json.loads(hf.to_str())["model"]["merges"]
    ranks = {bytes([b]): b for b in range(256)}
    for merge in merges:
        # tokenizers < 0.20 uses "a b"
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        tok = _hf_token_to_bytes(left) + _hf_token_to_bytes(right)
        # cannot happen for a BPE trainer (each merge makes a new token); guard anyway
        if tok in ranks:
            raise RuntimeError(f"duplicate merge result {tok!r}")
        ranks[tok] = len(ranks)
    return Tokenizer(ranks, special_tokens=special_tokens, pattern=pattern)


# Command line -----------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """`python -m lrt_scale.tokenizer train|info`: train the BPE on the shards' training split and
    save it (what `lrt_scale.train --tokenizer-dir` loads), or describe a saved one."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m lrt_scale.tokenizer", description=main.__doc__.split("\n")[0]
    )
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser(
        "train", help="train a tokenizer on the training split of --data-dir and save it"
    )
    t.add_argument(
        "--data-dir",
        required=True,
        help="parquet shards (lrt_scale.data; the last one is validation)",
    )
    t.add_argument("--out", required=True, help="folder to save the tokenizer in")
    t.add_argument(
        "--vocab-size",
        type=int,
        default=DEFAULT_VOCAB_SIZE,
        help="tokens, bytes and specials included",
    )
    t.add_argument(
        "--max-chars", type=int, default=2_000_000_000, help="training text budget (nanochat: ~2B)"
    )
    t.add_argument("--doc-cap", type=int, default=10_000, help="characters kept per document")
    i = sub.add_parser("info", help="vocabulary size and compression of a saved tokenizer")
    i.add_argument("--dir", required=True, help="a folder written by `train`")
    args = ap.parse_args(argv)
    try:
        if args.command == "train":
            from .data import text_iterator  # the data side is only needed to train

            tok = train_tokenizer(
                text_iterator(args.data_dir, split="train"),
                vocab_size=args.vocab_size,
                max_chars=args.max_chars,
                doc_cap=args.doc_cap,
            )
            path = tok.save(args.out)
            print(f"tokenizer with {tok.vocab_size:,} tokens saved to {path}")
        else:
            tok = Tokenizer.load(args.dir)
            print(
                f"{args.dir}: {tok.vocab_size:,} tokens, specials {', '.join(tok.special_tokens)}"
            )
    except (ValueError, OSError) as e:
        print(f"python -m lrt_scale.tokenizer: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
