"""The Latent Recurrent Transformer: a nanochat-style decoder with a cross-token memory pathway.

One compute primitive, `LRT.stage(tokens, P, buffer)`: recompute positions P against a shared
K/V + memory buffer (docs/design.md). Training schedules, prefill strategies and decoding are all
orders of stages (`lrt_lab.run.schedules`, `lrt_lab.run.decode`); the model's own `forward` is
the simplest, one stage over every position. With `config.memory=None` the same
class is the plain transformer baseline, so both share every line of the backbone.

The forward reads top to bottom: `LRT.forward` (one stage over every position, and the loss) ->
`LRT.stage` -> `LRT.run_blocks` -> `Block.forward` -> `Attention.forward` -> the attention kernel
(`attention_kernel`: SDPA, flash-attn or FlexAttention); a block's math before and after attention
sits in `before_attention` (with `Attention.qkv`) and `after_attention`, the regions
`compile_blocks` compiles, one graph for every layer (a block reads no layer index: `LayerInputs`).
Other orders of stages (the trainers, prefill, decoding) call `LRT.stage` from `lrt_lab.run`.
The fast paths sit in named functions beside the equations: `mix_residual` and `gated_sum` (fused
kernels), `MemoryRead` (what a stage forms once for all its layers), `HookPoint.hooked` (hook
points cost nothing while unhooked), `Rotary`'s table cache, `FrontierStorage` (in-place appends
without autograd).

The backbone (`Block`, `Attention`, `MLP`) are ordinary modules with a `forward`, called as
modules by every stage, so module hooks, activation checkpointing and regional compilation work.
All the LRT's own math lives in `lrt_lab.core.memory.MemoryPathway` (the extension point): a stage
calls its `read` (m = m_{t-lag} for each position t) and `emit` (m_t), and a block calls it at
three places:
- residual injection (sec. 2.2):  x_bar = alpha_l * x + beta_l * x0 + gamma_l * m
- gated KV projection (sec. 2.1, eqs. 2-4): k~ = g_loc * k_local + g_rec * W_k,rec m (same for
  v), (g_loc, g_rec) = 2 * sigmoid(W_g x) per KV head, W_g zero-initialised;
- the combined key then goes through QK-norm and RoPE at t, like the local key (eq. 5);
and the source blocks' outputs become m_t (`MemoryPathway.emit`).
"""

from __future__ import annotations

import dataclasses
import math
import types
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from lrt_lab.core.attention import as_range, attend_explicit, attention_kernel
from lrt_lab.core.buffer import DecodeCache, SequenceBuffer
from lrt_lab.core.config import ModelConfig
from lrt_lab.core.hook_points import HookPoint, any_hooked
from lrt_lab.core.loss import check_inputs, cross_entropy
from lrt_lab.core.memory import (
    ROUTE_PROJECTIONS,
    MemoryPathway,
    MemoryRead,
    build_memory,
    memory_routes,
    norm,
)

VE_GATE_CHANNELS = 32  # nanochat gates value embeddings from the first 32 input channels


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on (B, T, H, D): rotate the pairs (x[:D/2], x[D/2:]) by the position's angles.

    cos, sin: full-width tables from `Rotary` (cos = [c, c], sin = [s, -s]), so the rotation is
    x * cos + swap_halves(x) * sin = [x1 c + x2 s, x2 c - x1 s] in three kernels."""
    x1, x2 = x.chunk(2, dim=-1)
    swapped = torch.cat([x2, x1], dim=-1)
    return torch.addcmul(x * cos, swapped, sin)


class Rotary(nn.Module):
    """Cos/sin for arbitrary positions (RoPE at t, eq. 5), so decoding can run past sequence_len.

    Angles are formed in float64 and only then cast, so bf16/fp32 models get correctly rounded
    values and float64 tests are exact.

    `table_cache` is a cache, not state: per (device, dtype), the tables of positions 0..n-1,
    grown by doubling, so a stage only slices them (no per-stage trigonometry). A row depends on
    its position, head_dim, base and dtype alone, so a cached row is exactly what a rebuild gives
    and emptying the cache changes nothing but time. It is a plain attribute, not a buffer:
    `model.to(dtype)` never rounds it and it never enters a state_dict.
    """

    def __init__(self, head_dim: int, base: float):
        super().__init__()
        self.head_dim, self.base = head_dim, base
        self.table_cache: dict[
            tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]
        ] = {}

    def _build(self, n: int, device, dtype: torch.dtype):
        """(cos, sin), each (1, n, 1, D), for positions 0..n-1."""
        exponent = torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float64)
        exponent = exponent / self.head_dim  # 2i / D
        inv_freq = self.base ** (-exponent)
        pos = torch.arange(n, device=device, dtype=torch.float64)
        angles = pos[:, None] * inv_freq[None, :]  # (n, D/2)
        cos, sin = angles.cos(), angles.sin()
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, -sin], -1)
        return cos.to(dtype)[None, :, None, :], sin.to(dtype)[None, :, None, :]

    def forward(self, P: range, device, dtype: torch.dtype):
        """(cos, sin), each (1, |P|, 1, D), for the positions in P."""
        cos, sin = self._tables(P.stop, device, dtype)
        return cos[:, P.start : P.stop : P.step], sin[:, P.start : P.stop : P.step]

    def _tables(self, n: int, device, dtype: torch.dtype):
        """(cos, sin) covering at least positions 0..n-1: from `table_cache`, else built and
        cached (at least doubled, so a growing decoder rebuilds O(log n) times)."""
        key = (torch.device(device), dtype)
        cos, sin = self.table_cache.get(key, (None, None))
        if cos is not None and cos.size(1) >= n:
            return cos, sin
        n = max(n, 2 * cos.size(1) if cos is not None else 0, 64)
        with torch.inference_mode(False):  # a cached table must be usable by autograd later
            cos, sin = self._build(n, device, dtype)
        if not torch.compiler.is_compiling():
            self.table_cache[key] = (cos, sin)
        return cos, sin


@dataclass
class StageContext:
    """What every block of one stage shares (passed as an argument, never stored on a module)."""

    positions: range  # the sequence positions this stage computes (buffer rows)
    cos: torch.Tensor  # RoPE tables at those positions
    sin: torch.Tensor
    buffer: object  # SequenceBuffer or DecodeCache: K/V of every layer, memory
    x0: torch.Tensor  # the normed token embedding (nanochat's x0 skip)
    read: MemoryRead | None  # what the positions read (None: no memory pathway)
    pathway: MemoryPathway | None
    # what the hook points receive as `positions`: the stage's positions, or None for a pass whose
    # rows are not the model's output (`lrt_lab.run.hooks` skips those calls)
    hook_positions: range | None
    # buffer rows per token: sliding windows count tokens, so a stage over rows that interleave
    # other vectors with the tokens widens them by this factor
    rows_per_token: int = 1
    # the attention masks built for this stage, by kernel, positions and window: every layer with
    # that window reuses one (a compiled stage builds each once, not once per layer)
    masks: dict = field(default_factory=dict)


class Output(NamedTuple):
    logits: torch.Tensor  # (B, T, V)
    loss: torch.Tensor | None  # mean cross-entropy over the counted targets, or None


class LayerInputs(NamedTuple):
    """What one block of a stage reads besides the residual stream, formed by `run_blocks` before
    the block runs. Everything that differs between layers is here as data (tensors, and the
    layer's memory read with its parameters, `MemoryPathway.for_layer`), so every block runs the
    same code: one compiled graph serves every layer (`LanguageModel.compile_blocks`)."""

    alpha: torch.Tensor | None  # alpha_l (None: 1)
    beta: torch.Tensor | None  # beta_l (None: 0)
    value_embed: torch.Tensor | None  # this layer's value embedding of the tokens, or None
    read: MemoryRead | None  # this layer's memory read, or None (no memory pathway)


class BlockOutput(NamedTuple):
    x: torch.Tensor  # residual stream after the block
    k: torch.Tensor  # the K this layer's attention saw (buffer, P's rows replaced)
    v: torch.Tensor
    attn_out: torch.Tensor  # the attention output added to the residual stream


def mix_residual(x: torch.Tensor, x0: torch.Tensor, alpha, beta) -> torch.Tensor:
    """alpha x + beta x0 (nanochat's per-layer scalars; alpha None is 1, beta None is 0).

    Fused into at most two kernels (beta * x0, then one addcmul) rather than three: decoding and
    the rollout run one position per stage, where each kernel launch costs more than its math."""
    if beta is not None:
        return beta * x0 + x if alpha is None else torch.addcmul(beta * x0, alpha, x)
    return x if alpha is None else alpha * x


class Attention(nn.Module):
    """Causal self-attention of one layer, with the memory injected into Q/K/V (sec. 2.1)."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        d, kv = config.n_embd, config.n_kv_head * config.head_dim
        self.layer = layer
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.head_dim
        self.window = config.window_sizes()[layer]  # keys a query sees, its own included
        # whether the memory's local gate also scales the value embedding (MemoryConfig)
        self.gate_value_embeds = config.memory is not None and config.memory.gate_value_embeds
        self.c_q = nn.Linear(d, config.n_head * config.head_dim, bias=False)
        self.c_k = nn.Linear(d, kv, bias=False)
        self.c_v = nn.Linear(d, kv, bias=False)
        self.c_proj = nn.Linear(config.n_head * config.head_dim, d, bias=False)
        self.ve_gate = (
            nn.Linear(min(VE_GATE_CHANNELS, d), config.n_kv_head, bias=False)
            if config.use_value_embeds
            else None
        )
        # TransformerLens's names: hook_q / hook_k before QK-norm and RoPE (with the memory
        # injected), hook_rot_q / hook_rot_k what attention sees; hook_z the heads' outputs before
        # c_proj; hook_attn_scores / hook_pattern (B, H, q, k) computed only while hooked
        names = [
            "hook_q",
            "hook_k",
            "hook_v",
            "hook_rot_q",
            "hook_rot_k",
            "hook_attn_scores",
            "hook_pattern",
            "hook_z",
        ]
        if config.memory is not None and config.memory.gated:
            names += ["hook_gate_local", "hook_gate_rec"]
        # the memory as each recurrent projection of this layer reads it (hook_mem_q / _k / _v),
        # only for the projections the config has: patching one re-forms that projection alone
        self.mem_routes = tuple(
            (f"hook_mem_{r}", ROUTE_PROJECTIONS[r])
            for r in memory_routes(config)
            if r in ROUTE_PROJECTIONS
        )
        names += [point for point, _ in self.mem_routes]
        for name in names:
            setattr(self, name, HookPoint())

    def qkv(self, h, cos, sin, pathway, read: MemoryRead | None, value_embed, hp):
        """(q, k, v) of the normed residual stream h (B, n, d), with k~ = g_loc k + g_rec W_k,rec m
        (same for v; sec. 2.1, eqs. 2-4), then QK-norm and RoPE at t (eq. 5): the position-free
        part of attention, which the compiled block runs (`before_attention`). read: the layer's
        read (`MemoryPathway.for_layer`), or None; cos, sin: the stage's RoPE tables."""
        B, n, _ = h.shape
        q = self.c_q(h).view(B, n, self.n_head, self.head_dim)
        k = self.c_k(h).view(B, n, self.n_kv_head, self.head_dim)
        v = self.c_v(h).view(B, n, self.n_kv_head, self.head_dim)
        if value_embed is not None and self.gate_value_embeds:
            v = self._add_value_embed(v, h, value_embed)  # then under g_loc (the old convention)
        if read is not None:
            q, k, v = self._inject_memory(h, q, k, v, pathway, read, hp)
        if value_embed is not None and not self.gate_value_embeds:
            # v = g_loc c_v h + g_rec W_v,rec m + g_ve ve: a baseline component, outside the
            # memory's gates (app. A; the released code's triple gate)
            v = self._add_value_embed(v, h, value_embed)
        q, k, v = (
            self.hook_q(q, positions=hp),
            self.hook_k(k, positions=hp),
            self.hook_v(v, positions=hp),
        )
        # QK-norm, then RoPE at t: the recurrent key is encoded at t like the local one (eq. 5)
        q = self.hook_rot_q(apply_rotary(norm(q), cos, sin).to(v.dtype), positions=hp)
        k = self.hook_rot_k(apply_rotary(norm(k), cos, sin).to(v.dtype), positions=hp)
        return q, k, v

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: StageContext):
        """Attention of the stage's positions over the buffer: q (B, n, H, D), k, v (B, n, Hkv, D)
        at ctx.positions (from `qkv`). Returns (the heads' outputs (B, n, H * D), before c_proj;
        the K and V attention saw, for the buffer). What depends on the positions and the layer's
        window (the buffer's rows, the kernel, its mask) is here, outside the compiled regions."""
        B, n = q.shape[:2]
        hp = ctx.hook_positions
        K, V = ctx.buffer.splice_kv(self.layer, ctx.positions, k, v)
        # softmax(q K^T / sqrt(D)) V, causal within this layer's window, over the keys up to the
        # stage's last position: a fused kernel, or written out while scores or pattern are hooked
        # the buffer may hold rows past the stage (a prefix refined again)
        stop = ctx.positions.stop
        Ks, Vs = (K, V) if K.size(1) == stop else (K[:, :stop], V[:, :stop])
        P, window = as_range(ctx.positions, n), self.window
        if window is not None:  # windows count tokens; rows may interleave other vectors
            window *= ctx.rows_per_token
        if self.hook_attn_scores.hooked or self.hook_pattern.hooked:
            y = self._attend_explicit(q, Ks, Vs, P, window, hp)
        else:
            y = attention_kernel(q, P, Ks.size(1), window)(q, Ks, Vs, P, window, masks=ctx.masks)
        y = self.hook_z(y, positions=hp)
        return y.reshape(B, n, -1), K, V

    def _add_value_embed(self, v, h, value_embed) -> torch.Tensor:
        """v + g * ve: nanochat's value embeddings, gated per KV head by g = 2 sigmoid(W h[:32]),
        added in one fused addcmul."""
        g = 2 * torch.sigmoid(self.ve_gate(h[..., : self.ve_gate.in_features]))
        return torch.addcmul(v, g.unsqueeze(-1), value_embed.to(v.dtype))

    def _inject_memory(self, h, q, k, v, pathway: MemoryPathway, read: MemoryRead, hp):
        """(q, k, v) with the memory gated in (eqs. 2-4), the gates (eq. 3) passed through their
        hook points."""
        g_loc, g_rec = pathway.gate_values(h, read)
        if g_loc is not None:
            g_loc = self.hook_gate_local(g_loc, positions=hp)
            g_rec = self.hook_gate_rec(g_rec, positions=hp)
        read = self._route_memory(read, hp)
        return pathway.inject_qkv(q, k, v, read, g_loc, g_rec)

    def _route_memory(self, read: MemoryRead, hp) -> MemoryRead:
        """`read` with each recurrent projection's memory passed through its hook point
        (hook_mem_q / hook_mem_k / hook_mem_v): a patched one is that projection's alone
        (`MemoryRead.with_routes`), so one route of the memory can be ablated or patched while the
        others, and the residual injection, read the memory as it was."""
        routes = {}
        for point, projection in self.mem_routes:
            m = getattr(self, point)(read.m, positions=hp)
            if m is not read.m:
                routes[projection] = m
        return read.with_routes(routes) if routes else read

    def _attend_explicit(self, q, K, V, P: range, window, hp) -> torch.Tensor:
        """The same attention written out, its scores and pattern passed through their hook
        points."""
        return attend_explicit(
            q,
            K,
            V,
            P,
            window,
            on_scores=lambda s: self.hook_attn_scores(s, positions=hp),
            on_pattern=lambda a: self.hook_pattern(a, positions=hp),
        )


class MLP(nn.Module):
    """nanochat's MLP: c_proj(relu(c_fc x)^2)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    """One layer: residual mix and memory injection (sec. 2.2), attention (sec. 2.1), MLP."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.attn = Attention(config, layer)
        self.mlp = MLP(config)
        # hook_resid_pre: the block's input; hook_resid_injected: what attention's norm reads,
        # alpha x + beta x0 (+ gamma m: the memory injected, sec. 2.2)
        names = [
            "hook_resid_pre",
            "hook_resid_injected",
            "hook_attn_out",
            "hook_mlp_out",
            "hook_resid_post",
        ]
        if config.memory is not None:
            names.append("hook_mem_in")
        # hook_mem_resid: the memory as the residual injection reads it (gamma_l m), only where
        # the config injects it; patching it leaves the layer's projections alone
        if "resid" in memory_routes(config):
            names.append("hook_mem_resid")
        for name in names:
            setattr(self, name, HookPoint())
        # (before_attention, after_attention) compiled, or None: eager (`compile_blocks`)
        self.compiled_regions = None

    def forward(self, x: torch.Tensor, ctx: StageContext, layer: LayerInputs) -> BlockOutput:
        """x_bar = alpha x + beta x0 + gamma m (sec. 2.2), then x_bar + attn(norm(x_bar)) and
        the MLP, pre-norm. layer: what this layer reads besides x (its scalars, value embedding
        and memory read), as data. The position-free math before and after attention runs as two
        regions (`before_attention`, `after_attention`), compiled by `compile_blocks`; attention
        over the buffer runs between them."""
        hp = ctx.hook_positions
        before, after = before_attention, after_attention
        if self.compiled_regions is not None and not any_hooked():
            # compiled code never sees a hook; positions reach hook points alone, so pass none
            zero = layer.read is not None and layer.read.zero
            (before, after), hp = self.compiled_regions.get(zero), None
        x, q, k, v = before(self, x, ctx.x0, ctx.cos, ctx.sin, ctx.pathway, layer, hp)
        y, K, V = self.attn(q, k, v, ctx)
        x, attn_out = after(self, x, y, hp)
        return BlockOutput(x, K, V, attn_out)

    def _residual_memory(self, read: MemoryRead, P) -> MemoryRead:
        """The read the residual injection uses: `read`, its m passed through hook_mem_resid (when
        the config injects into the residual); a patched m reaches gamma_l m alone, attention
        still reads `read`."""
        point = getattr(self, "hook_mem_resid", None)
        if point is None:
            return read
        m = point(read.m, positions=P)
        return read if m is read.m else read.patched(m)


def before_attention(
    block: Block, x, x0, cos, sin, pathway: MemoryPathway | None, layer: LayerInputs, hp
):
    """A block up to attention: (x_bar, q, k, v), x_bar = alpha x + beta x0 + gamma m (sec. 2.2)
    and q, k, v from norm(x_bar) (`Attention.qkv`). Everything that differs between layers comes
    in as tensors (`layer`), never as a layer index, so one compiled graph serves every layer."""
    x = block.hook_resid_pre(x, positions=hp)
    x = mix_residual(x, x0, layer.alpha, layer.beta)
    read = layer.read
    if read is not None:
        m = block.hook_mem_in(read.m, positions=hp)
        if m is not read.m:  # patched for this layer only: its projections follow the patch
            read = read.patched(m)
        x = pathway.inject_residual(x, block._residual_memory(read, hp))
    x = block.hook_resid_injected(x, positions=hp)
    q, k, v = block.attn.qkv(norm(x), cos, sin, pathway, read, layer.value_embed, hp)
    return x, q, k, v


def after_attention(block: Block, x, y, hp):
    """A block after attention: (x + attn_out + MLP, attn_out), attn_out = c_proj(y), y the heads'
    outputs (B, n, H * D)."""
    attn_out = block.hook_attn_out(block.attn.c_proj(y), positions=hp)
    x = x + attn_out
    mlp_out = block.hook_mlp_out(block.mlp(norm(x)), positions=hp)
    x = block.hook_resid_post(x + mlp_out, positions=hp)
    return x, attn_out


def _compiled_block_inputs(x: torch.Tensor, ctx: StageContext):
    """(x, ctx) as compiled blocks take them: a compiled graph guards on its inputs' strides and
    aliases, so the views a stage hands its blocks (RoPE tables sliced at the positions, the memory
    rows a strided view of the buffer, whose strides grow with it) come contiguous, and x, when it
    is x0 itself (the first block of a stage), as a copy; then every stage of one shape, at any
    positions, reuses the same graphs. The values are the same."""
    if x is ctx.x0:
        x = x.clone()
    read = ctx.read
    if read is not None:
        read = dataclasses.replace(read, m=read.m.contiguous())
    return x, dataclasses.replace(
        ctx, cos=ctx.cos.contiguous(), sin=ctx.sin.contiguous(), read=read
    )


class CompiledRegions:
    """`before_attention` and `after_attention` compiled (torch.compile with `options`), one pair
    per variant of the call: the grad mode (training, no_grad, inference mode: a decoder) and,
    before attention, whether the stage's memory is zero (an init stage skips the memory terms).
    Each variant compiles its own copy of the function, and dynamo keeps graphs and counts its
    recompile limit (8) per code object: one copy for all would hold every variant's graphs
    (3 x 2, times the shapes' specialisations) and pass the limit, after which it runs eager."""

    def __init__(self, options: dict):
        self.options = dict(options)
        self.compiled: dict[tuple, object] = {}

    def get(self, zero: bool):
        """(before, after) for the current grad mode and the memory being zero or not."""
        if torch.is_inference_mode_enabled():
            mode = "inference"
        else:
            mode = "train" if torch.is_grad_enabled() else "no_grad"
        return self._region(before_attention, mode, zero), self._region(after_attention, mode)

    def _region(self, fn, *variant):
        key = (fn.__name__, *variant)
        if key not in self.compiled:
            name = "_".join(str(v) for v in key)
            code = fn.__code__.replace(co_name=name, co_qualname=name)  # a code object of its own
            copy = types.FunctionType(code, fn.__globals__, name, fn.__defaults__)
            self.compiled[key] = torch.compile(copy, **self.options)
        return self.compiled[key]


def _renamed_pathway_keys(module, state_dict, prefix, *args) -> None:
    """State dicts saved while the pathway was `model.memory`: its keys under `pathway.`."""
    old = prefix + "memory."
    for key in [k for k in state_dict if k.startswith(old)]:
        state_dict[prefix + "pathway." + key[len(old) :]] = state_dict.pop(key)


class LanguageModel(nn.Module):
    """The nanochat-style backbone every model kind shares: embedding, blocks, head, their init and
    optimizer roles, and one pass of the block stack (`run_blocks`). A kind defines `stage` (and,
    where it keeps other state, its buffers): `LRT` adds the memory pathway, the baselines
    (`lrt_lab.core.baselines`) loops and thoughts."""

    # lrt_lab.core.interface.SequenceModel's costs: one pass of the stack per token, and a parallel
    # forward that equals decoding (tested), so evaluation decodes only for the memory; the
    # baselines override these
    forward_cost: float = 1.0
    forwards_per_token: int = 1
    has_sequential_decoding: bool = False

    def __init__(self, config: ModelConfig):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise ValueError(f"config={config!r} is invalid; allowed: a ModelConfig")
        self.config = config
        n_layer = config.n_layer
        # Module constructors draw default inits we overwrite; keep them off the caller's RNG so
        # reset_parameters alone decides the weights: the same seed gives the same backbone with
        # or without a memory pathway (controlled LRT-vs-transformer comparisons).
        with torch.random.fork_rng(devices=[]):
            self._build_modules(config)
        self.resid_lambdas = nn.Parameter(torch.ones(n_layer)) if config.use_resid_lambdas else None
        self.x0_lambdas = nn.Parameter(torch.zeros(n_layer)) if config.use_x0_residual else None
        self.rotary = Rotary(config.head_dim, config.rope_base)
        self.hook_embed = HookPoint()
        self.reset_parameters()

    def _build_modules(self, config: ModelConfig) -> None:
        """The modules whose default initialisation reset_parameters overwrites (built with the
        caller's RNG state untouched)."""
        d, n_layer = config.n_embd, config.n_layer
        self.wte = nn.Embedding(config.vocab_size, d)
        self.blocks = nn.ModuleList(Block(config, l) for l in range(n_layer))
        kv = config.n_kv_head * config.head_dim
        self.value_embeds = (
            nn.ModuleList(nn.Embedding(config.vocab_size, kv) for _ in range(n_layer))
            if config.use_value_embeds
            else None
        )
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        self.pathway = None  # a model with a memory pathway builds it here (LRT)

    @torch.no_grad()
    def reset_parameters(self):
        """nanochat's init."""
        s = math.sqrt(3.0 / self.config.n_embd)  # uniform with the std of N(0, 1/d)
        nn.init.normal_(self.wte.weight, std=1.0)
        nn.init.normal_(self.lm_head.weight, std=0.001)
        for block in self.blocks:
            for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_fc):
                nn.init.uniform_(lin.weight, -s, s)
            nn.init.zeros_(block.attn.c_proj.weight)  # blocks start as the identity
            nn.init.zeros_(block.mlp.c_proj.weight)
            if block.attn.ve_gate is not None:
                nn.init.zeros_(block.attn.ve_gate.weight)
        for emb in self.value_embeds or []:
            nn.init.uniform_(emb.weight, -s, s)
        if self.resid_lambdas is not None:
            self.resid_lambdas.fill_(1.0)
        if self.x0_lambdas is not None:
            self.x0_lambdas.fill_(0.1)

    def param_roles(self) -> dict[str, str]:
        """Optimizer role of the backbone's parameters (patterns; lrt_lab.training.optim)."""
        return {
            "wte.weight": "embedding",
            "value_embeds.*": "embedding",
            "lm_head.weight": "head",
            "blocks.*.attn.c_*": "matrix",
            "blocks.*.attn.ve_gate.weight": "matrix",
            "blocks.*.mlp.*": "matrix",
            "resid_lambdas": "resid_scalar",
            "x0_lambdas": "x0_scalar",
        }

    def stage(self, tokens: torch.Tensor, P: range, buffer):
        """Recompute positions P against `buffer`: (logits at P, the buffer to use next). Each
        model kind writes its own (LRT: the memory pathway's stage; the baselines: loops,
        thoughts)."""
        raise NotImplementedError

    def run_blocks(
        self,
        x: torch.Tensor,
        ctx: StageContext,
        tokens: torch.Tensor | None,
        layers: range,
        ve_keep: torch.Tensor | None = None,
        source_blocks=(),
    ):
        """x through the blocks `layers` over the rows of one stage, each reading ctx.read: the
        one block loop (the LRT's stages and the loop/ponder baselines' passes). tokens: the ids
        at the rows, for the value embeddings (None: rows without a token get none); ve_keep:
        (1, n, 1, 1) 0/1 per row, or None (all); source_blocks: the blocks whose outputs feed m_t.
        Returns (residual stream, [K per layer], [V per layer], {source layer: BlockOutput})."""
        alphas, betas = self._layer_scalars()
        if self.blocks[layers.start].compiled_regions is not None:
            x, ctx = _compiled_block_inputs(x, ctx)
        ks, vs, sources = [], [], {}
        for l in layers:
            read = ctx.pathway.for_layer(l, ctx.read) if ctx.read is not None else None
            layer = LayerInputs(alphas[l], betas[l], self._value_embed(l, tokens, ve_keep), read)
            out = self.blocks[l](x, ctx, layer)
            x = out.x
            ks.append(out.k)
            vs.append(out.v)
            if l in source_blocks:
                sources[l] = out
        return x, ks, vs, sources

    def _layer_scalars(self):
        """(alpha_l per layer, beta_l per layer), None where the model has none: split once per
        stage into views, so a layer launches no indexing kernel for its scalar."""
        absent = (None,) * self.config.n_layer
        alphas = self.resid_lambdas.unbind(0) if self.resid_lambdas is not None else absent
        betas = self.x0_lambdas.unbind(0) if self.x0_lambdas is not None else absent
        return alphas, betas

    def _value_embed(self, l: int, tokens: torch.Tensor | None, ve_keep: torch.Tensor | None):
        """Layer l's value embedding of the tokens, (B, n, n_kv_head, head_dim), zero on the rows
        ve_keep drops; None without value embeddings or tokens."""
        if self.value_embeds is None or tokens is None:
            return None
        ve = self.value_embeds[l](tokens).view(*tokens.shape, self.config.n_kv_head, -1)
        return ve if ve_keep is None else ve * ve_keep

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from the final residual stream: lm_head(norm(x)), soft-capped."""
        logits = self.lm_head(norm(x))
        if self.config.softcap is not None:
            logits = self.config.softcap * torch.tanh(logits / self.config.softcap)
        return logits

    def exact_split(self, chunk: int = 1) -> int | None:
        """None: without a memory nothing runs position by position (`LRT.exact_split`)."""
        return None

    def compile_blocks(self, **options):
        """Compile the blocks regionally, in place (torch.compile with `options`; the default way
        to compile, docs/scale.md says why): the position-free math of a block before attention
        and after it (`before_attention`, `after_attention`), as two compiled functions that every
        block shares. A block reads no layer index (`LayerInputs`), so every layer runs the same
        graphs; a graph is specialised on the stage's shapes, the grad mode and the config, never
        on the layer or the positions, so a deep model and a schedule of one stage per position
        compile a few graphs. Attention over the buffer runs between the two regions, its kernel
        chosen per stage and window (FlexAttention compiled on its own). While any hook point is
        hooked the blocks run eagerly. Returns the model."""
        self.fill_rotary_tables()
        regions = CompiledRegions(options)
        for block in self.blocks:
            block.compiled_regions = regions
        return self

    def compile_stage(self, **options):
        """Compile the whole stage primitive in place (`model.stage`, torch.compile with
        `options`): one graph per stage kind, the blocks unrolled inside it, so compile time
        grows with depth and a schedule of one stage per position compiles a graph per position.
        Returns the model."""
        self.fill_rotary_tables()
        self.stage = torch.compile(self.stage, **options)
        return self

    def fill_rotary_tables(self, n: int | None = None) -> None:
        """Fill `Rotary.table_cache` for the embedding's device and dtype (and float32, what
        autocast's norms give) up to n positions (default 4 x sequence_len) before compiling: a
        compiled stage guards on the cache, so a table built later by an eager call (an
        evaluation between training steps) would recompile it."""
        w = self.wte.weight
        n = 4 * self.config.sequence_len if n is None else n
        for dtype in dict.fromkeys((w.dtype, torch.float32)):
            self.rotary._tables(n, w.device, dtype)

    # The model's own forward --------------------------------------------------------------------
    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> Output:
        """One stage over every position from an empty buffer (zero memory): the plain
        transformer's forward, and an LRT's one-pass prefill. Returns (logits (B, T, V), the mean
        cross-entropy against targets, or None). Other orders of stages (the paper's trainers,
        Exact) run through `lrt_lab.run_schedule(model, idx, targets, schedule)`."""
        check_inputs(idx, targets, self.config.vocab_size)
        logits, _ = self.stage(idx, range(0, idx.size(1)), self.empty_buffer(idx))
        return Output(logits, None if targets is None else cross_entropy(logits, targets))

    def empty_buffer(
        self, tokens: torch.Tensor, memory_rows: torch.Tensor | None = None
    ) -> SequenceBuffer:
        """The buffer a schedule starts from: no K/V, and zero memory or the given memory rows
        (models with other state override this)."""
        return SequenceBuffer.empty(self.config, tokens, memory_rows)

    def new_decode_cache(
        self, batch_size: int, max_len: int, device=None, dtype=None, keep_memory: bool = False
    ) -> DecodeCache:
        """The in-place state the Decoder appends to (models with other state override this);
        keep_memory keeps every memory row it produces (`DecodeCache.memory_rows`)."""
        return DecodeCache(
            self.config, batch_size, max_len, device=device, dtype=dtype, keep_memory=keep_memory
        )

    def param_report(self) -> dict:
        """Parameters the memory pathway adds, absolute and relative.

        The paper's "+0.3% / +4.8%" (d20 shared / layerwise) match added / total-with-memory;
        both ratios are reported.
        """
        total = sum(p.numel() for p in self.parameters())
        added = sum(p.numel() for p in self.pathway.parameters()) if self.pathway is not None else 0
        baseline = total - added
        return {
            "total": total,
            "baseline": baseline,
            "added": added,
            "added_pct_of_baseline": 100.0 * added / baseline,
            "added_pct_of_total": 100.0 * added / total,
        }


class LRT(LanguageModel):
    """Decoder-only transformer with optional latent recurrence (config.memory): the backbone plus
    the memory pathway (`lrt_lab.core.memory`) and the stage primitive that reads and writes it.
    With config.memory=None it is the plain transformer."""

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        # checkpoints written before the pathway had its own name keep loading
        self.register_load_state_dict_pre_hook(_renamed_pathway_keys)
        if self.pathway is not None:
            self.hook_mem_in, self.hook_mem_out = HookPoint(), HookPoint()

    def _build_modules(self, config: ModelConfig) -> None:
        super()._build_modules(config)
        self.pathway = build_memory(config) if config.memory is not None else None

    @torch.no_grad()
    def reset_parameters(self):
        """nanochat's init; the memory pathway's per paper sec. 2 (gates at 1, gamma at
        gamma_init)."""
        super().reset_parameters()
        if self.pathway is not None:
            self.pathway.reset_parameters()

    # The stage primitive ----------------------------------------------------------------------
    def stage(
        self,
        tokens: torch.Tensor,
        P: range,
        buffer,
        layers: range | None = None,
        resid: torch.Tensor | None = None,
    ):
        """Recompute positions P against `buffer`: embed, read m_{t-lag} (sec. 2), run the blocks,
        write P's K/V and m_t back (docs/design.md).

        tokens: (B, |P|), the inputs at P. Returns (logits at P: (B, |P|, V), the buffer with P's
        K/V and source states written).
        layers: the contiguous blocks to run (default: all). A stage that starts above block 0
        takes `resid`, the residual stream entering its first block at P; one that stops below
        the top returns that residual stream (B, |P|, d) instead of logits. The K/V of blocks
        outside `layers` are left as they were (see `exact_split`).
        """
        layers = self._check_layers(layers, resid)
        x0 = self.hook_embed(norm(self.wte(tokens)), positions=P)
        x = x0 if resid is None else resid
        cos, sin = self.rotary(P, x.device, x.dtype)
        ctx = StageContext(
            P, cos, sin, buffer, x0, self._read_memory(buffer, P, x0), self.pathway, P
        )
        source_blocks = self.pathway.source_blocks if self.pathway is not None else ()
        x, k_new, v_new, sources = self.run_blocks(x, ctx, tokens, layers, None, source_blocks)
        k_all, v_all = list(buffer.k), list(buffer.v)
        for l, k, v in zip(layers, k_new, v_new):
            k_all[l], v_all[l] = k, v
        buffer = buffer.updated(P, k_all, v_all, self._emit_memory(sources, ctx, layers))
        if layers.stop < self.config.n_layer:
            return x, buffer
        return self.head(x), buffer

    def _emit_memory(self, sources: dict, ctx: StageContext, layers: range):
        """m_t at the stage's positions (`MemoryPathway.emit`), or None when the stage ran no
        source block."""
        if not sources:
            return None
        if len(sources) != len(self.pathway.source_blocks):
            raise ValueError(
                f"layers={layers} is invalid; allowed: a range holding all of the "
                f"source blocks {self.pathway.source_blocks} or none of them"
            )
        return self.hook_mem_out(self.pathway.emit(sources, ctx.read), positions=ctx.positions)

    def _read_memory(self, buffer, P: range, like: torch.Tensor) -> MemoryRead | None:
        """What the positions P read (sec. 2: m_{t-lag}), after the model-level hook_mem_in."""
        if self.pathway is None:
            return None
        mem = self.pathway.read(buffer, P, like.size(0), like, hook_positions=P)
        m = self.hook_mem_in(mem.m, positions=P)
        return mem if m is mem.m else mem.patched(m)

    def _check_layers(self, layers, resid) -> range:
        L = self.config.n_layer
        layers = range(L) if layers is None else layers
        if not (
            isinstance(layers, range) and layers.step == 1 and 0 <= layers.start < layers.stop <= L
        ):
            raise ValueError(
                f"layers={layers!r} is invalid; allowed: range(a, b) with 0 <= a < b <= n_layer={L}"
            )
        if (layers.start > 0) != (resid is not None):
            raise ValueError(
                "resid is invalid: allowed: the residual stream (B, |P|, d) exactly "
                f"when layers starts above block 0 (layers={layers})"
            )
        return layers

    def exact_split(self, chunk: int = 1) -> int | None:
        """Where Chunked(chunk) / Exact may split the stack (0-based index of the first block above
        the source layers), or None. Only the source blocks and those below them at position t
        feed m_t; the blocks above read m_{t-lag} but feed nothing sequential, so they can run for
        every position in one parallel stage once the lower blocks have run chunk by chunk (same
        logits). That holds while chunk <= memory.exact_chunk (the nearest row a position reads): a
        longer chunk reads zero memory inside itself (sec. 3.2), which a pass over the finished
        memory would not reproduce."""
        if self.pathway is None or chunk > self.config.memory.exact_chunk:
            return None
        split = max(self.pathway.source_blocks) + 1
        return split if split < self.config.n_layer else None


def __getattr__(name):
    # The base was called `Transformer` though every kind extends it, the plain transformer being
    # `LRT(memory=None)`; code written against the old name keeps importing it, with a warning.
    if name == "Transformer":
        import warnings

        warnings.warn(
            "lrt_lab.core.model.Transformer is deprecated: it is LanguageModel, the base of LRT "
            "and the baselines",
            DeprecationWarning,
            stacklevel=2,
        )
        return LanguageModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
