"""Distributed, resumable, best-fit packing loader for FineWeb shards.

What it yields
--------------
``(inputs, targets)``, two LongTensors of shape ``(B, T)`` on ``device``, cut from rows of ``T+1``
tokens:
``inputs = row[:-1]``, ``targets = row[1:]``. Rows are packed from whole documents, each with
``<|bos|>``
prepended, with **no padding**: every token of every row is real data.

Who reads what
--------------
The split's row groups are enumerated in order across shards (shard 0's groups, then shard 1's,
...); rank ``r`` of ``world_size`` reads groups ``r, r + world_size, r + 2*world_size, ...``. Ranks
therefore read disjoint documents, and together they read each document of the split exactly once
per epoch. The last shard of a directory is the ``val`` split (see ``lrt_scale.data``). With
``epochs=None`` (the default) the loader cycles forever, so ranks with one row group more or less
never run dry at different steps; ``epochs=k`` stops after ``k`` passes (handy for a fixed
validation pass).

Packing (best fit, BOS-aligned, as nanochat)
--------------------------------------------
A buffer holds ``buffer_docs`` tokenized documents (topped up before every placement). A row is
filled by repeatedly taking the **longest buffered document that fits** in the space left (the
oldest among equals). When none fits, the **shortest** buffered document is cropped to fill the row
exactly. What happens to the cropped remainder is the ``remainder`` option:

* ``"drop"`` (default, nanochat): the remainder is discarded. Every row then starts with ``<|bos|>``
  and every document is seen from its beginning; the cost is the cropped tokens (counted in
  ``stats["tokens_cropped"]``). Token accounting per epoch: each document's emitted tokens are a
  prefix of ``[bos] + encode(text)``, and ``read == emitted + cropped + tail``.
* ``"carry"``: the remainder goes back into the buffer as a continuation (no BOS of its own) and is
  placed later like any document, so nothing is lost; a row may then start mid-document. Per epoch
  every document's tokens are emitted exactly once and in order, and ``read == emitted + tail``.

``tail`` counts tokens of a finite run (``epochs=k``) left over when the data ends with an
incomplete batch; that batch is dropped rather than padded.

LRT memory and document boundaries
----------------------------------
A packed row holds several documents, and the LRT's latent memory is carried along the row, so a
document's first tokens receive memory computed from the previous, unrelated document. That is the
paper's setup (and the usual one for packed pretraining: attention in a plain GPT also crosses
documents). To cut that flow, set ``lrt_lab.MemoryConfig(reset_memory_at_bos=True)`` together with
``ModelConfig.bos_token_id = tokenizer.bos_token_id``: a position's injected memory is then zeroed
when its memory source lies in an earlier document. The loader is the same either way.

Resuming
--------
``state_dict()`` (plain ints and lists, JSON- and ``torch.save``-able) describes the position after
the last batch returned: the cursor ``(epoch, shard, row_group, doc)`` of the next document to read
and a compact reference ``(seq, epoch, rg_pos, doc, offset)`` to every document still in the buffer.
Passing it back as ``state=`` re-reads those few row groups, re-tokenizes the buffered documents and
continues **exactly**: the batches after a resume are the batches an uninterrupted run would have
produced. The state is per rank; resuming needs the same ``split``, ``rank``, ``world_size``,
``remainder`` and data (appending train shards before the val shard is fine: earlier row groups keep
their positions).

Host -> device
--------------
For a CUDA device each batch is assembled in one of two alternating pinned host buffers and copied
with ``non_blocking=True`` (a CUDA event guards a buffer's reuse). On CPU nothing is pinned.

Prefetching
-----------
``prefetch=k`` (k >= 1; the training launcher uses 2) reads, tokenizes and packs up to k batches
ahead in a background thread with a bounded queue, so the next batch is ready when the training
step asks for it (the tokenizer's batch encoding runs outside the GIL). The batches are the same
as without it, and ``state_dict()``, ``stats`` and ``epoch`` describe the last batch *returned*,
not the last one packed: a resume is as exact as without it. ``close()`` stops the thread.
"""

from __future__ import annotations

import bisect
import copy
import os
import queue
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from .data import SPLITS, RowGroup, check_rank, resolve_shards, row_groups

STATE_VERSION = 1
REMAINDER_POLICIES = ("drop", "carry")


class TokenizerLike(Protocol):
    bos_token_id: int

    def encode_batch(
        self, texts: Sequence[str], prepend_bos: bool = ..., num_threads: int = ...
    ) -> list[list[int]]: ...


def dist_rank_world() -> tuple[int, int]:
    """``(rank, world_size)`` from ``torch.distributed`` if initialized, else
    ``RANK``/``WORLD_SIZE``, else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _check_options(
    split,
    batch_size,
    seq_len,
    buffer_docs,
    tokenizer_threads,
    tokenizer_batch_size,
    prefetch,
    remainder,
    epochs,
) -> None:
    """The loader's options, refused before any shard is read."""
    if split not in SPLITS:
        raise ValueError(f"split: must be one of {SPLITS}, got {split!r}")
    for name, val in (
        ("batch_size", batch_size),
        ("seq_len", seq_len),
        ("buffer_docs", buffer_docs),
        ("tokenizer_threads", tokenizer_threads),
        ("tokenizer_batch_size", tokenizer_batch_size),
    ):
        if not isinstance(val, int) or val < 1:
            raise ValueError(f"{name}: must be an int >= 1, got {val!r}")
    if not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch: must be an int >= 0, got {prefetch!r}")
    if remainder not in REMAINDER_POLICIES:
        raise ValueError(f"remainder: must be one of {REMAINDER_POLICIES}, got {remainder!r}")
    if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
        raise ValueError(f"epochs: must be None (forever) or an int >= 1, got {epochs!r}")


def _rank_row_groups(source, split: str, rank: int, world_size: int) -> list[RowGroup]:
    """This rank's share of the split's row groups (every world_size-th), refused if empty."""
    all_rgs = row_groups(resolve_shards(source, split))
    mine: list[RowGroup] = all_rgs[rank::world_size]
    if not mine:
        raise ValueError(
            f"world_size: split {split!r} has {len(all_rgs)} row groups, so rank {rank} "
            f"of world_size={world_size} gets none"
        )
    if not any(rg.num_rows for rg in mine):
        # every pass over them yields nothing, so an endless loader would wrap epochs forever
        raise ValueError(
            f"split: {split!r} holds no documents for rank {rank} of world_size={world_size} "
            f"({len(mine)} row groups, all empty)"
        )
    return mine


class DistributedPackingLoader:
    """Iterator of ``(inputs, targets)`` batches ``(B, T)``; see the module docstring for the
    policies."""

    def __init__(
        self,
        source: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: TokenizerLike,
        batch_size: int,
        seq_len: int,
        rank: int | None = None,
        world_size: int | None = None,
        split: str = "train",
        device: str | torch.device = "cpu",
        buffer_docs: int = 1000,
        state: dict[str, Any] | None = None,
        *,
        remainder: str = "drop",
        epochs: int | None = None,
        tokenizer_threads: int = 4,
        tokenizer_batch_size: int = 128,
        prefetch: int = 0,
    ):
        _check_options(
            split,
            batch_size,
            seq_len,
            buffer_docs,
            tokenizer_threads,
            tokenizer_batch_size,
            prefetch,
            remainder,
            epochs,
        )
        if rank is None or world_size is None:
            env_rank, env_world = dist_rank_world()
            rank = env_rank if rank is None else rank
            world_size = env_world if world_size is None else world_size
        check_rank(rank, world_size)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} requested but CUDA is not available")

        self.tokenizer = tokenizer
        self.bos_token_id = int(tokenizer.bos_token_id)
        self.batch_size, self.seq_len = batch_size, seq_len
        self.rank, self.world_size, self.split = rank, world_size, split
        self.buffer_docs, self.remainder, self.epochs = buffer_docs, remainder, epochs
        self.tokenizer_threads, self.tokenizer_batch_size = tokenizer_threads, tokenizer_batch_size

        self.row_groups = _rank_row_groups(source, split, rank, world_size)

        self._init_stream()
        # host staging (pinned + double-buffered only for CUDA)
        self._pin = self.device.type == "cuda"
        self._host = [
            torch.empty(2 * batch_size * seq_len, dtype=torch.long, pin_memory=self._pin)
            for _ in range(2 if self._pin else 0)
        ]
        self._events: list[Any] = [None, None]
        self._flip = 0
        # background packing (prefetch > 0): a thread packs up to `prefetch` batches ahead into a
        # bounded queue, each with the loader's state after it; what the caller sees (state_dict,
        # stats, epoch) is that of the last batch it was handed, so a resume is exact either way
        self.prefetch = prefetch
        self._worker: threading.Thread | None = None
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()
        self._seen: tuple[dict[str, Any], dict[str, int], int] | None = None
        if state is not None:
            self.load_state_dict(state)

    def _init_stream(self) -> None:
        """The stream at its start: cursor, buffer, token accounting, row group caches."""
        # cursor: next document to move into the buffer
        self._epoch, self._rg_pos, self._doc = 0, 0, 0
        # buffer: keys sorted by (length, seq); entries[seq] = (epoch, rg_pos, doc, offset, tokens)
        self._keys: list[tuple[int, int]] = []
        self._entries: dict[int, tuple[int, int, int, int, np.ndarray]] = {}
        self._seq = 0
        self._stats = {
            "batches": 0,
            "docs_read": 0,
            "tokens_read": 0,
            "tokens_emitted": 0,
            "tokens_cropped": 0,
            "tokens_tail": 0,
        }
        # caches of the row group under the cursor
        self._texts_key: int | None = None
        self._texts: list[str] = []
        self._chunk_start, self._chunk = 0, []
        self._exhausted = False

    # ------------------------------------------------------------------ properties
    @property
    def epoch(self) -> int:
        """The data epoch of the last batch returned."""
        return self._epoch if self._seen is None else self._seen[2]

    @property
    def stats(self) -> dict[str, int]:
        """Token accounting up to the last batch returned (see the module docstring)."""
        return self._stats if self._seen is None else self._seen[1]

    @property
    def tokens_per_batch(self) -> int:
        """Target tokens per batch on this rank (``B * T``)."""
        return self.batch_size * self.seq_len

    # ------------------------------------------------------------------ document stream
    def _read_texts(self, rg_pos: int) -> list[str]:
        if self._texts_key != rg_pos:
            self._texts = [t if t is not None else "" for t in self.row_groups[rg_pos].read()]
            self._texts_key = rg_pos
            self._chunk_start, self._chunk = 0, []
        return self._texts

    def _tokenize(self, texts: Sequence[str]) -> list[np.ndarray]:
        ids = self.tokenizer.encode_batch(
            list(texts), prepend_bos=True, num_threads=self.tokenizer_threads
        )
        return [np.asarray(x, dtype=np.int64) for x in ids]

    def _next_doc(self) -> tuple[int, int, int, np.ndarray] | None:
        """Advance the cursor by one document; ``None`` once ``epochs`` passes are done."""
        while True:
            if self.epochs is not None and self._epoch >= self.epochs:
                return None
            if self._rg_pos >= len(self.row_groups):
                self._epoch, self._rg_pos, self._doc = self._epoch + 1, 0, 0
                continue
            texts = self._read_texts(self._rg_pos)
            if self._doc >= len(texts):
                self._rg_pos, self._doc = self._rg_pos + 1, 0
                continue
            i = self._doc - self._chunk_start
            if not 0 <= i < len(self._chunk):
                self._chunk_start = self._doc
                self._chunk = self._tokenize(
                    texts[self._doc : self._doc + self.tokenizer_batch_size]
                )
                i = 0
            ref = (self._epoch, self._rg_pos, self._doc, self._chunk[i])
            self._doc += 1
            return ref

    # ------------------------------------------------------------------ buffer
    def _insert(
        self, seq: int, epoch: int, rg_pos: int, doc: int, offset: int, tokens: np.ndarray
    ) -> None:
        bisect.insort(self._keys, (len(tokens), seq))
        self._entries[seq] = (epoch, rg_pos, doc, offset, tokens)

    def _top_up(self) -> None:
        while not self._exhausted and len(self._keys) < self.buffer_docs:
            nxt = self._next_doc()
            if nxt is None:
                self._exhausted = True
                return
            epoch, rg_pos, doc, tokens = nxt
            self._stats["docs_read"] += 1
            self._stats["tokens_read"] += len(tokens)
            self._insert(self._seq, epoch, rg_pos, doc, 0, tokens)
            self._seq += 1

    def _fill_row(self, row: np.ndarray) -> bool:
        """Best-fit fill of ``row`` (length T+1); False if the data ran out first (finite
        ``epochs``)."""
        cap, pos = len(row), 0
        while pos < cap:
            self._top_up()
            if not self._keys:
                self._stats["tokens_tail"] += pos
                return False
            space = cap - pos
            i = bisect.bisect_right(self._keys, (space, float("inf"))) - 1
            if i >= 0:  # longest that fits; the oldest of that length
                i = bisect.bisect_left(self._keys, (self._keys[i][0], -1))
                _, seq = self._keys.pop(i)
                *_, tokens = self._entries.pop(seq)
                row[pos : pos + len(tokens)] = tokens
                pos += len(tokens)
            else:  # nothing fits: crop the shortest to fill the row exactly
                _, seq = self._keys.pop(0)
                epoch, rg_pos, doc, offset, tokens = self._entries.pop(seq)
                row[pos:] = tokens[:space]
                pos = cap
                if self.remainder == "carry":
                    self._insert(self._seq, epoch, rg_pos, doc, offset + space, tokens[space:])
                    self._seq += 1
                else:
                    self._stats["tokens_cropped"] += len(tokens) - space
        return True

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> DistributedPackingLoader:
        return self

    def _pack(self) -> np.ndarray | None:
        """The next batch's (B, T+1) rows; None once the data ends (finite ``epochs``)."""
        B, T = self.batch_size, self.seq_len
        rows = np.empty((B, T + 1), dtype=np.int64)
        for b in range(B):
            if not self._fill_row(rows[b]):
                self._stats["tokens_tail"] += b * (T + 1)
                return None
        self._stats["batches"] += 1
        self._stats["tokens_emitted"] += B * (T + 1)
        return rows

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.prefetch:
            rows = self._pack()
            if rows is None:
                raise StopIteration
            return self._to_device(rows)
        if self._worker is None:
            self._start_worker()
        item = self._queue.get()
        if isinstance(item, BaseException):
            self._worker = None
            raise item
        if item is None:  # the data ended: the packing's own state is final now
            self._worker.join()
            self._worker, self._queue, self._seen = None, None, None
            raise StopIteration
        rows, self._seen = item
        return self._to_device(rows)

    def _start_worker(self) -> None:
        self._seen = self._snapshot()
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._stop = threading.Event()
        self._worker = threading.Thread(
            target=self._work, args=(self._queue, self._stop), daemon=True, name="packing-loader"
        )
        self._worker.start()

    def _snapshot(self) -> tuple[dict[str, Any], dict[str, int], int]:
        return self._state_now(), dict(self._stats), self._epoch

    def _work(self, q: queue.Queue, stop: threading.Event) -> None:
        def put(item) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            while not stop.is_set():
                rows = self._pack()
                if rows is None:
                    put(None)
                    return
                if not put((rows, self._snapshot())):
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the caller's next()
            put(e)

    def close(self) -> None:
        """Stop the background packing (prefetch > 0); the state stays that of the last batch
        returned, and the next batch starts the packing again from there."""
        if self._worker is None:
            return
        self._stop.set()
        self._worker.join()
        self._worker, self._queue = None, None
        state, _, _ = self._seen
        self._seen = None
        self.load_state_dict(state)  # rewind the packing to what the caller has seen

    def __del__(self):
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    def _to_device(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = self.batch_size, self.seq_len
        n = B * T
        if self._pin:
            k = self._flip
            self._flip ^= 1
            if self._events[k] is not None:
                self._events[k].synchronize()  # the previous copy out of this buffer must be done
            host = self._host[k]
        else:
            host = torch.empty(2 * n, dtype=torch.long)
        flat = host.numpy()
        flat[:n].reshape(B, T)[:] = rows[:, :-1]
        flat[n:].reshape(B, T)[:] = rows[:, 1:]
        if self._pin:
            out = torch.empty(2 * n, dtype=torch.long, device=self.device)
            out.copy_(host, non_blocking=True)
            self._events[k] = torch.cuda.Event()
            self._events[k].record(torch.cuda.current_stream(self.device))
        else:
            out = host if self.device.type == "cpu" else host.to(self.device)
        return out[:n].view(B, T), out[n:].view(B, T)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Position after the last batch returned (see "Resuming" in the module docstring)."""
        if self._seen is not None:
            return copy.deepcopy(self._seen[0])
        return self._state_now()

    def _state_now(self) -> dict[str, Any]:
        rg = self.row_groups[min(self._rg_pos, len(self.row_groups) - 1)]
        buffer = [[seq, e, p, d, o] for seq, (e, p, d, o, _) in sorted(self._entries.items())]
        return {
            "version": STATE_VERSION,
            "split": self.split,
            "rank": self.rank,
            "world_size": self.world_size,
            "remainder": self.remainder,
            "epoch": self._epoch,
            "rg_pos": self._rg_pos,
            "shard": rg.shard,
            "row_group": rg.row_group,
            "doc": self._doc,
            "seq": self._seq,
            "buffer": buffer,
            "stats": dict(self._stats),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._worker is not None:
            self.close()
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"state: version must be {STATE_VERSION}, got {state.get('version')!r}"
            )
        for key in ("split", "rank", "world_size", "remainder"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"state: saved with {key}={state[key]!r}, "
                    f"but this loader has {key}={getattr(self, key)!r}"
                )
        rg_pos = int(state["rg_pos"])
        if not 0 <= rg_pos <= len(self.row_groups):
            raise ValueError(
                f"state: rg_pos={rg_pos} is outside this rank's {len(self.row_groups)} row groups"
            )
        rg = self.row_groups[min(rg_pos, len(self.row_groups) - 1)]
        if (rg.shard, rg.row_group) != (state["shard"], state["row_group"]):
            raise ValueError(
                f"state: saved at shard {state['shard']} row group {state['row_group']}, but that "
                f"position now holds shard {rg.shard} row group {rg.row_group} (different data?)"
            )
        self._epoch, self._rg_pos, self._doc = int(state["epoch"]), rg_pos, int(state["doc"])
        self._seq = int(state["seq"])
        self._exhausted = self.epochs is not None and self._epoch >= self.epochs
        self._stats = dict(state["stats"])
        self._keys, self._entries = [], {}
        by_rg: dict[int, list[list[int]]] = {}
        for ref in state["buffer"]:
            by_rg.setdefault(int(ref[2]), []).append([int(x) for x in ref])
        for p, refs in sorted(by_rg.items()):
            texts = self._read_texts(p)
            if any(not 0 <= d < len(texts) for _, _, _, d, _ in refs):
                raise ValueError(
                    f"state: buffered document outside row group {p} (different data?)"
                )
            toks = self._tokenize([texts[d] for _, _, _, d, _ in refs])
            for (seq, e, _, d, o), t in zip(refs, toks):
                self._insert(seq, e, p, d, o, t[o:])
        self._texts_key = None  # re-read the cursor's row group lazily


def describe(loader: DistributedPackingLoader) -> str:
    """One line for logs: what this rank reads."""
    n_docs = sum(rg.num_rows for rg in loader.row_groups)
    shards = sorted({Path(rg.path).name for rg in loader.row_groups})
    return (
        f"rank {loader.rank}/{loader.world_size} {loader.split}: {len(loader.row_groups)} row "
        "groups, "
        f"{n_docs} docs from {len(shards)} shards, B={loader.batch_size} T={loader.seq_len}, "
        f"remainder={loader.remainder}"
    )
