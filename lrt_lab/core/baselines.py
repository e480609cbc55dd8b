"""Baselines that buy accuracy with more forwards per generated token (paper sec. "Comparison with
Depth Recurrent and Looped Baselines", table "compare_other").

Both are the nanochat-style backbone of `lrt_lab.core.model` (`LanguageModel`, which `LRT` also
extends: parameter names, `param_groups`, initialisation and checkpoints are shared, and nothing of
the memory pathway is inherited), and every pass of theirs runs its blocks through
`LanguageModel.run_blocks`: the same `Block` modules, math and hook points as the LRT's stages. They
are driven through the same `stage(tokens, P, buffer)` primitive, so `run_schedule`, the training
loop, the evaluation, the run store and the `Decoder` run them unchanged. Hooks: the loop
transformer's block hooks fire in every loop (positions P); PonderLM's fire in every row pass with
row positions ((N+1) t + j; a capture is (B, (N+1) T, ...), its init pass over the tokens alone is
not reported); `hook_embed` is per token.

`LoopTransformer` (`loop:N`, `loop:N:LO-HI`): the whole stack applied N times per token, weights
tied across loops:
    e = norm(wte(x_t));  h^0 = e;  h^i = Stack(h^(i-1) + [i > 0] * e)  for i = 0..N-1;
    logits = head(norm(h^(N-1))).
The input embedding is re-injected additively at the start of every loop after the first (so
`loop:1` is exactly the plain transformer, tested); inside every loop the nanochat x0 skip
(`x <- lambda_l x + beta_l x0`, x0 = e) also sees the embedding, as in the baseline. Each loop's
layers keep their own K/V per position: loop i's layer l attends to loop i's layer-l keys of the
earlier positions, so the cache holds N * n_layer layers (the paper's 1.8x decoding memory for 2
loops) and token-by-token decoding equals the parallel forward exactly (tested). Training with
`loop:N:LO-HI` draws the loop count uniformly from LO..HI for every training forward (fixed counts
are known to overfit to that count; Huginn draws from a log-normal Poisson, we draw uniformly);
evaluation and decoding use N. Departures: no loop-specific adapters or per-loop scalars (the
PonderLM-2 repository's "loop" baseline also ties the whole stack), no truncated backpropagation.

`PonderLM` (`ponder:N`, `ponder:N:K`, `ponder:N:LO-HI`), after PonderLM-2 (Zeng et al. 2025,
arXiv 2509.23184): before predicting token t+1 the model emits N latent thoughts, each the last
hidden state of the position before it, fed back as the next position's input embedding:
    rows  [x_0, th_0^1 .. th_0^N, x_1, th_1^1 .. th_1^N, ...]  (stride s = N+1, row s*t+j);
    input(x_t) = norm(wte(x_t)),  input(th_t^j) = norm(h(previous row)),
and the logits for t+1 come from the last thought th_t^N (h: the residual stream after the last
block; norm(h) is exactly what the head reads, so thoughts and tokens enter at the same scale,
which PonderLM-2 gets by scaling token embeddings by sqrt(2.5 d)). Thoughts share their token's
RoPE position (as in PonderLM-2's position ids); sliding windows count rows (w tokens -> s*w rows);
thought rows get no value embedding (they have no token). Decoding does this sequentially: N+1
forwards per generated token through one KV cache of s*T rows (`forwards_per_token = N+1`).
Training runs it in parallel with Jacobi iterations, as PonderLM-2 does: an init pass of the plain
model over the tokens alone gives every thought its first input (norm of the token's plain hidden
state), then K refinement passes over all s*T rows each replace every thought input by norm(h)
of the row before it from the previous pass, and a final pass gives the logits; the loss is on the
final pass only and gradients flow through every pass (nothing is detached). With K >= N*|P| the
iteration has reached its fixed point, which is exactly the sequential model (tested against the
decoder), so K is capped there. With the default K = 3 it is an approximation (from the start
of a sequence the first floor((K+1)/N) tokens are exact, tested), hence
`has_sequential_decoding = True`: evaluation must run the Decoder to see what the model really
does at inference. `ponder:N:LO-HI` draws K uniformly from LO..HI per training forward
(PonderLM-2's `random_jacobi_iterations` draws 2..3); its parallel forward outside training uses
K = HI. Departures: with N > 1 all thoughts start from the token's plain hidden state
(PonderLM-2 grows the thought chain over N extra init passes); no embedding scaling (see above).
Any contiguous position set works (`onepass`, `chunked:C`, `exact`; the buffer keeps the init
pass's K/V in n_layer extra layers so chunks continue it); `exact` (one token per chunk) is exact
whenever K >= N. Strided sets (`interleaved:S`) are refused: a thought chain cannot skip tokens.

`forward_cost` (what the training loop multiplies its compute accounting by) is the training
forward's cost in plain-transformer forwards: N for loops (the mean for random counts), 1 +
(K+1)(N+1) for ponder (init pass + K refinements + final pass over (N+1)x the rows).
"""

from __future__ import annotations

import re

import torch

from lrt_lab.core.buffer import DecodeCache, SequenceBuffer
from lrt_lab.core.config import ModelConfig
from lrt_lab.core.model import LanguageModel, StageContext, norm
from lrt_lab.core.validation import check_int

BASELINE_KINDS = {
    "loop:N": "loop transformer, the stack applied N >= 1 times per token (N forwards per token)",
    "loop:N:LO-HI": "loop:N trained with a loop count drawn uniformly from LO..HI per step; "
    "evaluated at N",
    "ponder:N": "PonderLM-2-style N >= 1 latent thoughts per token (N+1 forwards per token), "
    "trained with K=3 Jacobi refinements",
    "ponder:N:K": "ponder:N trained with K >= 0 Jacobi refinements",
    "ponder:N:LO-HI": "ponder:N trained with K drawn uniformly from LO..HI per step; "
    "evaluated with K=HI",
}

_KIND = re.compile(r"(loop|ponder):(\d+)(?::(\d+)(?:-(\d+))?)?")


def _allowed_kinds() -> str:
    return ", ".join(BASELINE_KINDS)


def is_baseline_kind(kind) -> bool:
    """True for the spellings `build_baseline` accepts (valid or not): `loop:...`, `ponder:...`."""
    return isinstance(kind, str) and kind.split(":", 1)[0] in ("loop", "ponder")


def build_baseline(kind: str, config: ModelConfig) -> LanguageModel:
    """`loop:N[:LO-HI]` -> LoopTransformer, `ponder:N[:K|:LO-HI]` -> PonderLM over `config`."""
    m = _KIND.fullmatch(kind.strip()) if isinstance(kind, str) else None
    if m is None:
        raise ValueError(
            f"model={kind!r} is invalid; allowed: {_allowed_kinds()} (N, K, LO, HI integers)"
        )
    name, n = m.group(1), int(m.group(2))
    third, hi = m.group(3), m.group(4)
    if name == "loop" and third is not None and hi is None:
        raise ValueError(
            f"model={kind!r} is invalid; allowed: loop:N or loop:N:LO-HI (a range of loop "
            "counts for training)"
        )
    try:
        if name == "loop":
            random = (int(third), int(hi)) if hi is not None else None
            return LoopTransformer(config, n_loops=n, random_loops=random)
        if hi is not None:
            return PonderLM(
                config, n_thoughts=n, jacobi=int(hi), random_jacobi=(int(third), int(hi))
            )
        return PonderLM(config, n_thoughts=n, jacobi=int(third) if third is not None else 3)
    except ValueError as e:
        raise ValueError(f"model={kind!r}: {e}") from None


def _check_range(name: str, value, low: int):
    if value is None:
        return None
    ok = (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and low <= value[0] <= value[1]
    )
    if not ok:
        raise ValueError(
            f"{name}={value!r} is invalid; allowed: None or (lo, hi) integers with {low} <= lo <= "
            "hi"
        )
    return (int(value[0]), int(value[1]))


def _draw(bounds: tuple[int, int]) -> int:
    """A count from lo..hi, from torch's global RNG (seeded
    and checkpointed by the training loop)."""
    return int(torch.randint(bounds[0], bounds[1] + 1, (1,)).item())


class _LayerOffset:
    """A buffer seen from layer `offset` on: the blocks' layer l writes the buffer's layer
    offset + l (a loop's or PonderLM's init pass's own K/V layers)."""

    def __init__(self, buffer, offset: int):
        self.buffer, self.offset = buffer, offset

    def splice_kv(self, layer: int, P: range, k, v):
        return self.buffer.splice_kv(self.offset + layer, P, k, v)


class _Baseline(LanguageModel):
    """The plain transformer's modules and a pass of its block stack over arbitrary input vectors.
    The subclasses override the backbone's `forward_cost` and `forwards_per_token` (and PonderLM
    `has_sequential_decoding`): the costs the training loop and the run's config report."""

    def __init__(self, config: ModelConfig):
        if not isinstance(config, ModelConfig):
            raise ValueError(f"config={config!r} is invalid; allowed: a ModelConfig")
        if config.memory is not None:
            raise ValueError(
                "memory is invalid for a loop/ponder baseline; allowed: None (they are plain "
                "transformers underneath; use model='lrt' for the memory pathway)"
            )
        super().__init__(config)

    def _stack(
        self,
        x,
        tokens,
        ve_keep,
        cos,
        sin,
        rows: range,
        buffer,
        layer0: int,
        rows_per_token: int = 1,
        hooked: bool = True,
    ):
        """One pass of the blocks (`LanguageModel.run_blocks`, the same modules and hook points)
        over buffer rows `rows` (contiguous), writing buffer layers layer0..layer0+n_layer-1.
        x: (B, n, d) input vectors (also the x0 of the x0 skip); tokens: (B, n) ids for the value
        embeddings (None: none); ve_keep: (1, n, 1, 1) 0/1 per row, or None (all rows). Returns
        (residual stream after the last block, per-layer K, per-layer V). hooked=False: the hook
        points skip this pass."""
        target = buffer if layer0 == 0 else _LayerOffset(buffer, layer0)
        ctx = StageContext(
            rows, cos, sin, target, x, None, None, rows if hooked else None, rows_per_token
        )
        x, ks, vs, _ = self.run_blocks(x, ctx, tokens, range(self.config.n_layer), ve_keep)
        return x, ks, vs

    def _layers_config(self, n_layer: int) -> ModelConfig:
        """The config of a buffer/cache holding n_layer layers of K/V."""
        return self.config.replace(n_layer=n_layer)


class LoopTransformer(_Baseline):
    """The stack applied n_loops times per token (see the module docstring)."""

    def __init__(
        self, config: ModelConfig, n_loops: int = 2, random_loops: tuple[int, int] | None = None
    ):
        check_int("n_loops", n_loops, 1)
        random_loops = _check_range("random_loops", random_loops, 1)
        super().__init__(config)
        self.n_loops, self.random_loops = n_loops, random_loops

    @property
    def forwards_per_token(self) -> int:
        return self.n_loops

    @property
    def forward_cost(self) -> float:
        if self.random_loops is not None:
            return (self.random_loops[0] + self.random_loops[1]) / 2
        return float(self.n_loops)

    def empty_buffer(self, tokens: torch.Tensor) -> SequenceBuffer:
        """A buffer with loops * n_layer layers; a training forward draws its loop count here."""
        n = self.n_loops
        if self.random_loops is not None and self.training and torch.is_grad_enabled():
            n = _draw(self.random_loops)
        return SequenceBuffer.empty(self._layers_config(n * self.config.n_layer), tokens)

    def new_decode_cache(
        self, batch_size: int, max_len: int, device=None, dtype=None
    ) -> DecodeCache:
        return DecodeCache(
            self._layers_config(self.n_loops * self.config.n_layer),
            batch_size,
            max_len,
            device=device,
            dtype=dtype,
        )

    def stage(self, tokens: torch.Tensor, P: range, buffer):
        """Positions P through all loops; the loop count is the buffer's (layers // n_layer).
        The block hook points fire in every loop (an intervention acts on each; a capture keeps
        the last loop's activations)."""
        L = self.config.n_layer
        n_loops, rest = divmod(len(buffer.k), L)
        if rest or n_loops < 1:
            raise ValueError(
                f"buffer has {len(buffer.k)} layers; allowed: a multiple of n_layer={L} "
                "(make it with model.empty_buffer / model.new_decode_cache)"
            )
        e = self.hook_embed(norm(self.wte(tokens)), positions=P)
        cos, sin = self.rotary(P, e.device, e.dtype)
        x, k_all, v_all = e, [], []
        for i in range(n_loops):
            if i:
                x = x + e  # re-inject the input embedding at every loop after the first
            x, ks, vs = self._stack(x, tokens, None, cos, sin, P, buffer, i * L)
            k_all += ks
            v_all += vs
        return self.head(x), buffer.updated(P, k_all, v_all, None)


class PonderDecodeCache:
    """The decoder's state for PonderLM: one DecodeCache of (N+1) rows per token, seen by the
    Decoder in token units (`length`, `max_len`)."""

    in_place = True

    def __init__(
        self,
        config: ModelConfig,
        stride: int,
        batch_size: int,
        max_len: int,
        device=None,
        dtype=None,
    ):
        self.stride = stride
        self.rows = DecodeCache(config, batch_size, max_len * stride, device=device, dtype=dtype)
        self.max_len = max_len

    @property
    def length(self) -> int:
        return self.rows.length // self.stride

    def append_tokens(self, tokens: torch.Tensor):
        pass  # no memory, so no document ids to track

    def load(self, buffer: SequenceBuffer, tokens: torch.Tensor):
        """Fill an empty cache from a prefilled buffer (its
        first n_layer layers are the row K/V)."""
        n = tokens.size(1) * self.stride
        if self.rows.length != 0 or n > self.rows.max_len:
            raise ValueError(
                f"prefill of {tokens.size(1)} tokens needs an empty cache with max_len >= "
                f"{tokens.size(1)}"
            )
        for layer in range(len(self.rows.k)):
            self.rows.k[layer][:, :n] = buffer.k[layer][:, :n]
            self.rows.v[layer][:, :n] = buffer.v[layer][:, :n]
        self.rows.length = n


class PonderLM(_Baseline):
    """PonderLM-2-style latent thoughts (see the module docstring)."""

    has_sequential_decoding = True  # the parallel (Jacobi) forward is an approximation of decoding

    def __init__(
        self,
        config: ModelConfig,
        n_thoughts: int = 1,
        jacobi: int = 3,
        random_jacobi: tuple[int, int] | None = None,
    ):
        check_int("n_thoughts", n_thoughts, 1)
        check_int("jacobi", jacobi, 0)
        random_jacobi = _check_range("random_jacobi", random_jacobi, 0)
        super().__init__(config)
        self.n_thoughts, self.jacobi, self.random_jacobi = n_thoughts, jacobi, random_jacobi
        self.stride = n_thoughts + 1  # rows per token: windows of w tokens span stride * w rows

    @property
    def forwards_per_token(self) -> int:
        return self.stride

    @property
    def forward_cost(self) -> float:
        K = self.jacobi if self.random_jacobi is None else sum(self.random_jacobi) / 2
        return 1.0 + (K + 1) * self.stride

    def empty_buffer(self, tokens: torch.Tensor) -> SequenceBuffer:
        """Layers 0..L-1: K/V of the thought-interleaved rows;
        L..2L-1: the plain init pass's K/V."""
        return SequenceBuffer.empty(self._layers_config(2 * self.config.n_layer), tokens)

    def new_decode_cache(
        self, batch_size: int, max_len: int, device=None, dtype=None
    ) -> PonderDecodeCache:
        return PonderDecodeCache(
            self.config, self.stride, batch_size, max_len, device=device, dtype=dtype
        )

    def stage(self, tokens: torch.Tensor, P: range, buffer):
        """Logits for the tokens at P (predicting P+1): Jacobi over a SequenceBuffer, sequential
        (the definition; N+1 forwards per token) over the Decoder's in-place cache."""
        if len(P) and P.step != 1:
            raise ValueError(
                f"positions {P} are invalid for ponder; allowed: a contiguous range (schedules "
                "onepass, chunked:C, exact)"
            )
        if buffer.in_place:  # the Decoder's PonderDecodeCache
            return self._sequential(tokens, P, buffer)
        if len(buffer.k) != 2 * self.config.n_layer:
            raise ValueError(
                f"buffer has {len(buffer.k)} layers; allowed: 2 * n_layer = "
                f"{2 * self.config.n_layer} (make it with model.empty_buffer)"
            )
        return self._jacobi(tokens, P, buffer)

    def _iterations(self) -> int:
        if self.random_jacobi is not None and self.training and torch.is_grad_enabled():
            return _draw(self.random_jacobi)
        return self.jacobi

    def _jacobi(self, tokens, P: range, buffer):
        cfg, N, s = self.config, self.n_thoughts, self.stride
        L, d = cfg.n_layer, cfg.n_embd
        B, C = tokens.shape
        e = self.hook_embed(norm(self.wte(tokens)), positions=P)
        cos_t, sin_t = self.rotary(P, e.device, e.dtype)
        # init: the plain model over the tokens alone (its own K/V layers, so chunks continue it)
        h, k_plain, v_plain = self._stack(e, tokens, None, cos_t, sin_t, P, buffer, L, hooked=False)
        thoughts = norm(h)[:, :, None].expand(B, C, N, d)
        rows = range(s * P.start, s * P.stop)
        cos, sin = (
            cos_t.repeat_interleave(s, dim=1),
            sin_t.repeat_interleave(s, dim=1),
        )  # shared positions
        ids = tokens.repeat_interleave(s, dim=1)
        keep = torch.zeros(s, dtype=e.dtype, device=e.device)
        keep[0] = 1.0  # value embeddings at token rows only
        keep = keep.repeat(C).view(1, C * s, 1, 1)
        # beyond C*N refinements the iteration is at its fixed point
        K = min(self._iterations(), C * N)
        for _ in range(K + 1):
            x = torch.cat([e[:, :, None], thoughts], dim=2).reshape(B, C * s, d)
            out, ks, vs = self._stack(x, ids, keep, cos, sin, rows, buffer, 0, rows_per_token=s)
            out = out.view(B, C, s, d)
            thoughts = norm(out[:, :, :N])  # each thought's next input: the row before it
        # the rows that predict: the last thoughts
        return self.head(out[:, :, N]), buffer.updated(P, ks + k_plain, vs + v_plain, None)

    def _sequential(self, tokens, P: range, cache: PonderDecodeCache):
        if P.start != cache.length:
            raise ValueError(
                f"positions {P} cannot be appended to a cache holding {cache.length} tokens"
            )
        s = self.stride
        logits = []
        for i, t in enumerate(P):
            tok = tokens[:, i : i + 1]
            x = self.hook_embed(norm(self.wte(tok)), positions=range(t, t + 1))
            cos, sin = self.rotary(range(t, t + 1), x.device, x.dtype)
            for j in range(s):
                row = range(s * t + j, s * t + j + 1)
                h, ks, vs = self._stack(
                    x, tok if j == 0 else None, None, cos, sin, row, cache.rows, 0, rows_per_token=s
                )
                cache.rows.updated(row, ks, vs, None)
                x = norm(h)  # the next thought's input
            logits.append(self.head(h))
        return torch.cat(logits, dim=1), cache
