"""The state a stage reads and writes (docs/design.md "One primitive: a stage over a shared
buffer").

For every layer, the K and V that attention sees at each position, and the memory row
m[t] = h^src_t for every position. A stage over positions P reads memory m[t-lag] for t in P,
attends against the buffer with the rows at P replaced by fresh K/V, and writes its fresh K/V
and source states back.

Two implementations share that interface, so `LRT.stage` is one function for training,
prefill and decoding:

- `SequenceBuffer` (training, prefill): functional. Writes are out of place so autograd flows
  through the buffer: a refinement stage backpropagates into the stage that wrote what it read
  (paper sec. 3.1: "We backpropagate jointly through the initialization and refinement
  forwards"). Rows not yet computed hold zeros and are stored implicitly (a tensor shorter than
  the sequence), so chunked schedules never touch positions they have not reached. Without
  autograd, appends at the frontier go into preallocated `FrontierStorage` (an optimisation).
- `DecodeCache` (generation): preallocated, written in place under inference mode. Its state is the
  standard KV cache plus the last `memory.history` source states per sequence: one d-vector with
  the default lag 1 (paper app. "Parallel prefill": "stores only one additional d-dimensional
  recurrent state per sequence"). With `keep_memory=True` it keeps every source state it produced
  instead (Rollout's exact rollout, and a decoder whose rows seed a parallel pass: the paper's
  SFT/RL recipe).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lrt_lab.core.config import ModelConfig


def compute_dtype(device: torch.device, param_dtype: torch.dtype) -> torch.dtype:
    """The dtype keys and values are computed in on `device` right now: the autocast dtype inside
    autocast (bf16 activations from fp32 weights), else the parameters'. The KV cache must hold that
    dtype: a cache in the parameters' fp32 would hand fp32 keys to bf16 queries, which flash-attn
    (and SDPA on CUDA) reject."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return param_dtype


def _rows(t: torch.Tensor, n: int, like: torch.Tensor) -> torch.Tensor:
    """t[:, :n], zero-padded to n rows when t is shorter (or None: nothing computed yet)."""
    if t is None:
        return like.new_zeros((like.size(0), n) + tuple(like.shape[2:]))
    if t.size(1) == n:
        return t  # not t[:, :n]: a slice's backward zero-fills and copies a gradient this size
    if t.size(1) > n:
        return t[:, :n]
    pad = t.new_zeros((t.size(0), n - t.size(1)) + tuple(t.shape[2:]))
    return torch.cat([t, pad], dim=1)


def splice(old: torch.Tensor | None, P: range, new: torch.Tensor) -> torch.Tensor:
    """Out-of-place: `old` with the rows at positions P replaced by `new` (dim 1).

    The result covers positions 0..max(P.stop, len(old))-1. Only what P needs is copied: a stage
    over the whole prefix writes nothing from `old`, a contiguous block concatenates, a strided
    subset uses index_copy (differentiable with respect to both inputs).
    """
    if P.start == 0 and P.step == 1:
        head = new
    elif P.step == 1:
        head = torch.cat([_rows(old, P.start, new), new], dim=1)
    else:
        index = torch.arange(P.start, P.stop, P.step, device=new.device)
        head = _rows(old, P.stop, new).index_copy(1, index, new)
    if old is not None and old.size(1) > P.stop:
        return torch.cat([head, old[:, P.stop :]], dim=1)
    return head


def shifted_rows(mem: torch.Tensor, P: range, shift: int) -> torch.Tensor:
    """(B, |P|, ...): mem[:, t - shift] for t in P, zero where t - shift is before 0 or past the
    rows mem holds. A strided view of mem when every row exists (no copy); otherwise the view
    with zero rows attached at the ends."""
    a, step, count = P.start - shift, P.step, len(P)
    lead = min(count, -(a // step)) if a < 0 else 0  # t - shift < 0
    first = a + lead * step
    valid = 0
    if first < mem.size(1):
        valid = max(0, min(count - lead, (mem.size(1) - 1 - first) // step + 1))
    trail = count - lead - valid  # t - shift >= rows held
    if not lead and not trail:
        return mem[:, first : first + (valid - 1) * step + 1 : step] if valid else mem[:, :0]
    if step == 1 and valid:
        # one constant_pad_nd (negative padding crops): cheaper under autograd than slice + cat
        pads = (0, 0) * (mem.dim() - 2) + (-a, a + count - mem.size(1))
        return F.pad(mem, pads)
    body = mem[:, first : first + (valid - 1) * step + 1 : step] if valid else mem[:, :0]
    zeros = lambda k: mem.new_zeros((mem.size(0), k) + tuple(mem.shape[2:]))
    parts = ([zeros(lead)] if lead else []) + [body] + ([zeros(trail)] if trail else [])
    return torch.cat(parts, dim=1)


def document_ids(tokens: torch.Tensor, bos_token_id: int) -> torch.Tensor:
    """Index of the document each position belongs to (a new document starts at every BOS)."""
    return (tokens == bos_token_id).long().cumsum(dim=1)


class FrontierStorage:
    """Preallocated rows for no-grad appends at the frontier: an optimisation, not state.

    Without autograd, a stage appending the positions right after the last row a buffer holds (a
    chunked or exact prefill, a rollout) would copy every earlier row again with `splice`: O(t)
    per stage, O(T^2) per sequence. Instead the rows are written into storage of `capacity` rows
    allocated once, and the buffer holds a view of its first rows: O(|P|) per stage.

    Every buffer derived from one `SequenceBuffer.empty` shares this object. That is safe because
    a row is written in place only where no buffer shows it: the old tensor must be the view of
    this very storage that ends at its frontier. A stage re-run from an older buffer (a branch)
    gets fresh storage instead, so the values every buffer shows are exactly `splice`'s.
    """

    def __init__(self, capacity: int = 0):
        self.capacity = capacity  # rows allocated at once (the sequence length; grows if exceeded)
        # per slot (("k", layer), ("v", layer) or "mem"): the storage and the row its extent ends at
        self._extents: dict[object, tuple[torch.Tensor, int]] = {}

    def append(self, slot, old: torch.Tensor | None, P: range, new: torch.Tensor) -> torch.Tensor:
        """splice(old, P, new), written in place when P appends to the newest extent of `slot`
        without autograd (a differentiable splice must stay out of place)."""
        if (
            torch.is_grad_enabled()
            or old is None
            or P.step != 1
            or P.start != old.size(1)
            or P.start == 0
        ):
            return splice(old, P, new)
        store, frontier = self._extents.get(slot, (None, 0))
        # only the newest extent may grow in place: a stage re-run from an older buffer (a branch)
        # must not overwrite rows a newer buffer's views still show
        if (
            store is None
            or frontier != P.start
            or store.data_ptr() != old.data_ptr()
            or store.size(1) < P.stop
            or store.dtype != new.dtype
            or store.stride() != old.stride()
        ):
            store = old.new_empty((old.size(0), max(P.stop, self.capacity)) + tuple(old.shape[2:]))
            store[:, : P.start] = old
        store[:, P.start : P.stop] = new
        self._extents[slot] = (store, P.stop)
        return store[:, : P.stop]


class SequenceBuffer:
    """Functional per-batch buffer for a whole sequence.

    Both buffers answer `updated(P, k, v, mem)` with the buffer to use next, and a stage always
    continues from what it returned: this one returns a new buffer (autograd needs the tensors a
    stage read), a DecodeCache writes in place and returns itself. `in_place` says which."""

    in_place = False

    def __init__(self, k, v, mem, doc, storage: FrontierStorage | None = None):
        self.k: list[torch.Tensor | None] = k  # per layer (B, <=T, n_kv_head, head_dim)
        self.v: list[torch.Tensor | None] = v
        self.mem: torch.Tensor | None = mem  # (B, <=T, n_embd) source states
        self.doc: torch.Tensor | None = doc  # (B, T) document ids, for reset_memory_at_bos
        # where no-grad appends at the frontier are written; shared by the buffers derived from
        # this one (safe: see FrontierStorage)
        self.storage = FrontierStorage() if storage is None else storage

    @classmethod
    def empty(
        cls, config: ModelConfig, tokens: torch.Tensor, memory_rows: torch.Tensor | None = None
    ) -> SequenceBuffer:
        """No K/V yet; memory rows (B, <=T, d) when given (cached rollout states, paper
        sec. "SFT and Reinforcement Learning"), else none (every read is zero)."""
        doc = None
        if config.memory is not None and config.memory.reset_memory_at_bos:
            doc = document_ids(tokens, config.bos_token_id)
        return cls(
            [None] * config.n_layer,
            [None] * config.n_layer,
            memory_rows,
            doc,
            FrontierStorage(capacity=tokens.size(1)),
        )

    def with_memory_rows(self, rows: torch.Tensor) -> SequenceBuffer:
        """This buffer with its memory rows replaced by `rows` (B, <=T, d)."""
        return SequenceBuffer(self.k, self.v, rows, self.doc, self.storage)

    def splice_kv(self, layer: int, P: range, k, v):
        """K/V for attention at P: the buffer's rows with P's rows replaced (covers >= P.stop)."""
        return (
            self.storage.append(("k", layer), self.k[layer], P, k),
            self.storage.append(("v", layer), self.v[layer], P, v),
        )

    def read_memory(self, P: range, lag: int, n: int) -> torch.Tensor | None:
        """(B, |P|, n, d): rows m[t-lag-j] for t in P, j < n; zeros before position 0.

        None when no source state has been written yet (the init stage: zero memory)."""
        if self.mem is None:
            return None
        cols = [shifted_rows(self.mem, P, lag + j) for j in range(n)]
        return cols[0].unsqueeze(2) if n == 1 else torch.stack(cols, dim=2)

    def memory_valid(self, P: range, lag: int, n: int) -> torch.Tensor | None:
        """(B, |P|, n) bool: the memory source lies in the same document as the reader."""
        if self.doc is None:
            return None
        front = lag + n - 1
        padded = F.pad(self.doc, (front, 0), value=-1)
        here = self.doc[:, P.start : P.stop : P.step]
        shift = front - lag
        cols = [padded[:, P.start + shift - j : P.stop + shift - j : P.step] for j in range(n)]
        return torch.stack(cols, dim=2) == here[:, :, None]

    def updated(self, P: range, k_full: list, v_full: list, mem_new) -> SequenceBuffer:
        mem = self.mem if mem_new is None else self.storage.append("mem", self.mem, P, mem_new)
        return SequenceBuffer(k_full, v_full, mem, self.doc, self.storage)


class DecodeCache:
    """Preallocated KV cache + the last `history` source states, written in place (no autograd).

    keep_memory=True keeps every source state instead of a ring of `history` (`memory_rows`).
    `updated` writes in place and returns the cache itself (SequenceBuffer: a new buffer)."""

    in_place = True

    def __init__(
        self,
        config: ModelConfig,
        batch_size: int,
        max_len: int,
        device=None,
        dtype=None,
        keep_memory: bool = False,
    ):
        shape = (batch_size, max_len, config.n_kv_head, config.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.history = config.memory.history if config.memory is not None else 0
        self.keep_memory = keep_memory
        # ring of the last `history` source states: slot p % history holds m[p]. Kept whole: row p
        # holds m[p], allocated at the first write in the dtype the source states come in (None
        # until then: the first position reads zero memory, as in a SequenceBuffer)
        self.mem = (
            torch.zeros(batch_size, self.history, config.n_embd, device=device, dtype=dtype)
            if self.history and not self.keep_memory
            else None
        )
        self.bos_token_id = config.bos_token_id
        self.doc = (
            torch.zeros(batch_size, max_len, dtype=torch.long, device=device)
            if config.memory is not None and config.memory.reset_memory_at_bos
            else None
        )
        self.max_len = max_len
        self.length = 0

    def _check_append(self, P: range):
        if P.start != self.length or P.step != 1 or P.stop > self.max_len:
            raise ValueError(
                f"positions {P} cannot be appended to a cache holding {self.length} "
                f"of max_len={self.max_len} positions"
            )

    def append_tokens(self, tokens: torch.Tensor):
        """Record document ids for the tokens about to be decoded (reset_memory_at_bos only)."""
        if self.doc is None:
            return
        t = self.length
        prev = self.doc[:, t - 1 : t] if t > 0 else torch.zeros_like(tokens[:, :1])
        self.doc[:, t : t + tokens.size(1)] = prev + (tokens == self.bos_token_id).long().cumsum(1)

    def splice_kv(self, layer: int, P: range, k, v):
        self._check_append(P)
        self.k[layer][:, P.start : P.stop] = k
        self.v[layer][:, P.start : P.stop] = v
        return self.k[layer][:, : P.stop], self.v[layer][:, : P.stop]

    def read_memory(self, P: range, lag: int, n: int):
        if self.mem is None:
            return None
        if self.keep_memory:
            held = self.mem[:, : self.length]
            if n == 1 and len(P) == 1 and P.start >= lag:  # one step: a view of its row
                return held[:, P.start - lag : P.start - lag + 1, None]
            cols = [shifted_rows(held, P, lag + j) for j in range(n)]
            return torch.stack(cols, dim=2)
        h = self.history
        if h == 1 and len(P) == 1 and P.start >= 1:
            return self.mem[:, :, None]  # the default decoding step: m[t-1], (B, 1, 1, d), a view
        rows = []
        for t in P:
            per_j = [
                self.mem[:, (t - lag - j) % h]
                if t - lag - j >= 0
                else self.mem.new_zeros(self.mem.size(0), self.mem.size(2))
                for j in range(n)
            ]
            rows.append(torch.stack(per_j, dim=1))
        return torch.stack(rows, dim=1)

    def memory_valid(self, P: range, lag: int, n: int):
        if self.doc is None:
            return None
        cols = [[self.doc[:, max(t - lag - j, 0)] == self.doc[:, t] for j in range(n)] for t in P]
        return torch.stack([torch.stack(c, dim=1) for c in cols], dim=1)

    def updated(self, P: range, k_full, v_full, mem_new) -> DecodeCache:
        if mem_new is not None and self.keep_memory:
            if self.mem is None:
                self.mem = mem_new.new_zeros((mem_new.size(0), self.max_len, mem_new.size(2)))
            self.mem[:, P.start : P.stop] = mem_new  # each row is written once: views stay valid
        elif mem_new is not None:
            if self.history == 1:
                # rebind rather than write in place: views handed out by read_memory (and hooks
                # holding them) keep the row they were given
                self.mem = mem_new[:, -1:].to(self.mem.dtype)
            else:
                for i, t in enumerate(P):
                    self.mem[:, t % self.history] = mem_new[:, i]
        self.length = P.stop
        return self

    def load(self, buffer: SequenceBuffer, tokens: torch.Tensor):
        """Fill an empty cache from a prefilled SequenceBuffer (any schedule run on the prompt)."""
        n = tokens.size(1)
        if self.length != 0 or n > self.max_len:
            raise ValueError(f"prefill of {n} tokens needs an empty cache with max_len >= {n}")
        for layer in range(len(self.k)):
            self.k[layer][:, :n] = buffer.k[layer][:, :n]
            self.v[layer][:, :n] = buffer.v[layer][:, :n]
        if self.keep_memory and buffer.mem is not None:
            self.mem = buffer.mem.new_zeros((buffer.mem.size(0), self.max_len, buffer.mem.size(2)))
            self.mem[:, :n] = buffer.mem[:, :n]
        elif self.mem is not None:
            for p in range(max(0, n - self.history), n):
                self.mem[:, p % self.history] = buffer.mem[:, p]
        if self.doc is not None:
            self.doc[:, :n] = buffer.doc[:, :n]
        self.length = n

    def memory_rows(self) -> torch.Tensor | None:
        """(B, length, d): every source state so far (keep_memory only; None before any was
        written)."""
        if not self.keep_memory:
            raise ValueError(
                "memory_rows needs a cache made with keep_memory=True (a plain decode "
                "cache keeps only the last memory.history rows)"
            )
        return None if self.mem is None else self.mem[:, : self.length]
