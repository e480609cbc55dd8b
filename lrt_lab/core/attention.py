"""One attention entry point for every stage: `attend(q, k, v, q_pos, window)`.

A stage recomputes a set of query positions against keys 0..Tk-1 (the buffer with the stage's
own rows replaced). Every position set our schedules produce is a `range`: the full sequence
(init, one-pass, full-sequence refinement), a contiguous chunk (Chunked, Exact, decoding), or a
strided subset (Interleaved). Keeping the set a `range` lets us pick a kernel without a device
sync:

- full sequence, no effective window  -> SDPA `is_causal=True` (or flash-attn): the fast path;
- contiguous block ending at the last key -> flash-attn (bottom-right causal) on CUDA, else SDPA
  with a lower-right causal bias (CUDA) or a small explicit mask (CPU); a decoding query with a
  window attends to the window's keys only (sliced), with no mask;
- strided subset, or an active sliding window without flash-attn -> FlexAttention with a cached
  block mask on CUDA (fully masked blocks are skipped), or a cached explicit mask on SDPA (CPU).

Tensors use the flash-attn layout (B, T, H, head_dim); keys/values may have fewer heads (GQA).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "sdpa", "flash", "flex")


def as_range(q_pos, n_queries: int) -> range:
    """Normalise q_pos (an int offset or a range) to a range of n_queries positions."""
    if isinstance(q_pos, int):
        return range(q_pos, q_pos + n_queries)
    if isinstance(q_pos, range):
        if len(q_pos) != n_queries:
            raise ValueError(f"q_pos has {len(q_pos)} positions but q has {n_queries} queries")
        if len(q_pos) and q_pos.step < 1:
            raise ValueError(f"q_pos={q_pos} is invalid; allowed: increasing positions")
        # canonical form: stop = last position + 1, so `stop` means "keys needed"
        return range(q_pos.start, q_pos[-1] + 1, q_pos.step) if len(q_pos) else q_pos
    raise ValueError(f"q_pos={q_pos!r} is invalid; allowed: an int offset or a range of positions")


def visible_mask(q_pos: range, n_keys: int, window: int | None, device) -> torch.Tensor:
    """Boolean (Tq, Tk) mask: key j is visible to query at position p iff j <= p and
    p - j < window."""
    qp = torch.arange(q_pos.start, q_pos.stop, q_pos.step, device=device)[:, None]
    kp = torch.arange(n_keys, device=device)[None, :]
    mask = kp <= qp
    if window is not None:
        mask &= kp > qp - window
    return mask


@functools.cache
def _flash_attn_func():
    try:
        from flash_attn import flash_attn_func  # optional extra `gpu`
    except Exception:  # not installed, or built for another CUDA: fall back quietly
        return None
    return flash_attn_func


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    # FlexAttention is only fast compiled; compiling once per process is the documented usage.
    return torch.compile(flex_attention, dynamic=False)


@torch.compiler.assume_constant_result
def flash_attn_available() -> bool:
    """Whether the optional flash-attn package imports here (the extra `gpu`). A compiled stage
    reads this as a constant: tracing the import itself, which fails where the package is absent,
    broke the graph at every attention call on CUDA."""
    return _flash_attn_func() is not None


@functools.lru_cache(maxsize=128)
def _cached_mask(
    start: int, stop: int, step: int, n_keys: int, window: int | None, device
) -> torch.Tensor:
    # the same mask serves every layer with this window, and every step with these positions;
    # built outside inference mode so autograd may save it later
    with torch.inference_mode(False):
        return visible_mask(range(start, stop, step), n_keys, window, device)


def _memo(masks: dict | None, key: tuple, build):
    """build(), kept in `masks` under key when a dict is given: a stage's layers share one mask per
    (positions, window). The lru_caches below do the same eagerly, but a compiled stage traces
    through them (dynamo ignores the cache) and would build the mask again at every layer."""
    if masks is None:
        return build()
    if key not in masks:
        masks[key] = build()
    return masks[key]


def _sdpa(q, k, v, q_pos: range, window: int | None, masks: dict | None = None) -> torch.Tensor:
    if window is not None and q_pos.start - window + 1 > 0:
        # keys before the first query's window are invisible to every query: drop them, so
        # a windowed decoding step or chunk attends over at most window + |chunk| keys
        lo = q_pos.start - window + 1
        k, v = k[:, lo:], v[:, lo:]
        q_pos = range(q_pos.start - lo, q_pos.stop - lo, q_pos.step)
    n_keys = k.size(1)
    gqa = q.size(2) != k.size(2)
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    window_inactive = window is None or window >= q_pos.stop
    if q_pos.step == 1 and q_pos.start == 0 and q_pos.stop == n_keys and window_inactive:
        y = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=gqa)
    elif len(q_pos) == 1 and q_pos.start == n_keys - 1 and window_inactive:
        y = F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=gqa)  # one query sees all keys
    elif q.is_cuda and q_pos.step == 1 and q_pos.stop == n_keys and window_inactive and not gqa:
        # a chunk ending at the last key: causal aligned bottom-right, which SDPA runs on its
        # fused kernels without materialising a mask (its flash path ignores enable_gqa: MHA only)
        # imported here: the module loads torch._dynamo (about 2 s on CPU) for a GPU-only path
        from torch.nn.attention.bias import causal_lower_right

        bias = causal_lower_right(len(q_pos), n_keys)
        y = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias, enable_gqa=gqa)
    else:
        args = (q_pos.start, q_pos.stop, q_pos.step, n_keys, window, q.device)
        mask = _memo(masks, ("sdpa", *args), lambda: _cached_mask(*args))
        y = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=gqa)
    return y.transpose(1, 2)


def _flash(q, k, v, q_pos: range, window: int | None, masks: dict | None = None) -> torch.Tensor:
    # flash-attn aligns the causal mask bottom-right when Tq < Tk: query i sits at key Tk-Tq+i,
    # which is exactly a contiguous block ending at the last key.
    left = -1 if window is None else window - 1
    return _flash_attn_func()(q, k, v, causal=True, window_size=(left, 0))


@functools.lru_cache(maxsize=64)
def _flex_block_mask(
    start: int, step: int, n_queries: int, n_keys: int, window: int | None, device
):
    """FlexAttention block mask for queries at start + i*step over keys 0..n_keys-1, cached: one
    serves every layer with this window and every step with these positions, so strided stages
    skip the fully masked key blocks without building a mask per layer."""
    from torch.nn.attention.flex_attention import create_block_mask

    win = window if window is not None else n_keys + 1
    # The offsets as tensors: the compiled kernel reads them instead of guarding on their values.
    # Captured ints recompiled FlexAttention for every (start, step, window), which passed dynamo's
    # limit of 8 within one model (stage kinds x layer windows), after which it ran unfused.
    # They and the mask are built outside inference mode (a decoder's prefill), so a training stage
    # may reuse them.
    with torch.inference_mode(False):
        start_t, step_t, win_t = (torch.tensor(v, device=device) for v in (start, step, win))

        def mask_mod(b, h, q_idx, kv_idx):
            p = start_t + q_idx * step_t
            return (kv_idx <= p) & (p - kv_idx < win_t)

        return create_block_mask(
            mask_mod, B=None, H=None, Q_LEN=n_queries, KV_LEN=n_keys, device=device
        )


def _flex(q, k, v, q_pos: range, window: int | None, masks: dict | None = None) -> torch.Tensor:
    args = (q_pos.start, q_pos.step, q.size(1), k.size(1), window, q.device)
    block_mask = _memo(masks, ("flex", *args), lambda: _flex_block_mask(*args))
    y = _compiled_flex()(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        block_mask=block_mask,
        enable_gqa=q.size(2) != k.size(2),
    )
    return y.transpose(1, 2)


def _window_active(q_pos: range, window: int | None) -> bool:
    """Whether some query's window hides a key the causal mask alone would show (after keys
    before the first query's window are dropped)."""
    if window is None:
        return False
    return q_pos.stop - max(0, q_pos.start - window + 1) > window


def contiguous_tail(q_pos: range, n_keys: int) -> bool:
    """Whether the queries are a contiguous block ending at the last key: the only sets flash-attn
    (bottom-right causal) runs, and SDPA's fast paths."""
    return q_pos.step == 1 and q_pos.stop == n_keys


def pick_backend(q: torch.Tensor, q_pos: range, n_keys: int, window: int | None = None) -> str:
    """The fastest backend that is exact for this call (flash-attn only for contiguous blocks)."""
    if not q.is_cuda:
        return "sdpa"
    tail = contiguous_tail(q_pos, n_keys)
    half_precision = q.dtype in (torch.float16, torch.bfloat16)
    if tail and half_precision and flash_attn_available():
        return "flash"
    if tail and (len(q_pos) == 1 or not _window_active(q_pos, window)):
        # SDPA's flash/efficient kernels: is_causal for the full sequence, a lower-right causal
        # bias for a chunk, no mask for one decoding query (its window is cut by slicing keys)
        return "sdpa"
    return "flex"  # strided subsets and sliding windows: block-sparse, no dense T x T mask


def attend_explicit(
    q, k, v, q_pos: range, window: int | None, on_scores=None, on_pattern=None
) -> torch.Tensor:
    """The same attention as `attend`, written out so its scores and pattern can be read or
    replaced (TransformerLens's hook_attn_scores / hook_pattern): scores (B, H, Tq, Tk) =
    q k^T / sqrt(D), -inf where a key is invisible; pattern = softmax(scores). on_scores /
    on_pattern map the tensor to its replacement. Slower than the fused kernels: used only while
    such a hook is active."""
    group = q.size(2) // k.size(2)
    kh = k.repeat_interleave(group, dim=2) if group > 1 else k
    vh = v.repeat_interleave(group, dim=2) if group > 1 else v
    scores = torch.einsum("bqhd,bkhd->bhqk", q, kh) / math.sqrt(q.size(-1))
    visible = visible_mask(q_pos, k.size(1), window, q.device)
    scores = scores.masked_fill(~visible, float("-inf"))
    if on_scores is not None:
        scores = on_scores(scores)
    pattern = torch.softmax(scores, dim=-1)
    if on_pattern is not None:
        pattern = on_pattern(pattern)
    return torch.einsum("bhqk,bkhd->bqhd", pattern, vh)


KERNELS = {"sdpa": lambda: _sdpa, "flash": lambda: _flash, "flex": lambda: _flex}


def attention_kernel(q: torch.Tensor, q_pos: range, n_keys: int, window: int | None = None):
    """The kernel `attend` would pick for this call, as a function (q, k, v, q_pos, window,
    masks=None) -> (B, Tq, H, D): what the model's attention calls directly, its positions already
    a canonical range (`as_range`) within the keys, so the call reaches the kernel without a
    dispatch frame. masks: a dict in which the kernel keeps the mask it builds for its positions
    and window, so the other layers of a stage reuse it."""
    return KERNELS[pick_backend(q, q_pos, n_keys, window)]()


def attend(q, k, v, q_pos, window: int | None = None, backend: str = "auto") -> torch.Tensor:
    """Causal (optionally sliding-window) attention of queries at q_pos over keys 0..Tk-1.

    q: (B, Tq, H, D); k, v: (B, Tk, Hkv, D) with H % Hkv == 0. q_pos: an int offset (queries at
    q_pos..q_pos+Tq-1) or a range. window: a query at p sees keys p-window+1..p (None = all).
    Returns (B, Tq, H, D).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is invalid; allowed: {', '.join(BACKENDS)}")
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"window={window!r} is invalid; allowed: a positive int or None")
    q_pos = as_range(q_pos, q.size(1))
    n_keys = k.size(1)
    if len(q_pos) and (q_pos[-1] >= n_keys or q_pos[0] < 0):
        raise ValueError(f"q_pos={q_pos} reaches beyond the {n_keys} keys given")
    if backend == "auto":
        backend = pick_backend(q, q_pos, n_keys, window)
    if backend == "flash":
        if not contiguous_tail(q_pos, n_keys):
            raise ValueError(
                "backend='flash' needs a contiguous block of queries ending at the last key"
            )
        if not flash_attn_available():
            raise ValueError(
                "backend='flash' needs the flash-attn package (pip install 'lrt-lab[gpu]')"
            )
        return _flash(q, k, v, q_pos, window)
    if backend == "flex":
        return _flex(q, k, v, q_pos, window)
    return _sdpa(q, k, v, q_pos, window)
