"""The LRT memory pathway (paper sec. 2): the one place the recurrence is written, and the
extension point for new ones (docs/extending.md).

The backbone calls these methods and knows nothing else about the memory:

    read(buffer, positions)        -> MemoryRead     what each position reads: m_{t-lag} (sec. 2)
    for_layer(l, read)             -> MemoryRead     the read as layer l uses it: with that layer's
                                                     gamma_l, W_g, W_rec and W_rec m as data
    inject_residual(x, mem)        -> x              x + gamma_l * m (sec. 2.2)
    gate_values(h, mem)            -> (g_loc, g_rec) 2 * sigmoid(W_g h[:gate_channels]) per KV
                                                     head (eq. 3)
    inject_qkv(q, k, v, mem, g)    -> (q, k, v)      g_loc * local + g_rec * W_rec m (eqs. 2, 4)
    emit(outputs, read)            -> m_t            from the source blocks' activations (and,
                                                     for a memory that updates itself, what t
                                                     read)
    source_blocks                                    the one statement of which blocks (0-based)
                                                     feed m_t

Only `for_layer` sees a layer index: it runs before each block, outside the block's code, so
every layer runs the same code on its own tensors (one compiled graph serves all layers,
`LanguageModel.compile_blocks`; a layer index read inside the block is a guard per layer).

How far back a position's memory reaches is stated once, by the config
(`MemoryConfig.read_offsets`): `read` reads those rows, and the Exact split, Chunked's exact limit
and the decoder's ring follow.
The pathway's own hook points (`pathway.hook_source`, and `pathway.hook_update_gate` for
update="gated") are modules of this class, called with `read.positions`: a new mechanism declares
its internal values' hook points here, next to its math, and `lrt_lab.run.hooks` finds them by name.

Every schedule, the Exact split (`LRT.exact_split`), the decoder, the hook points, the
parameter report and the optimizer roles (`param_roles`) follow from these, so a new mechanism is
written here (plus its `MemoryConfig` field) and nowhere else; or, without touching the package,
as a subclass in the user's own file registered by name (`register_memory`), chosen with
`MemoryConfig(mechanism=name)`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from lrt_lab.core.config import MEMORY_MECHANISMS, ModelConfig
from lrt_lab.core.hook_points import HookPoint


def norm(x: torch.Tensor) -> torch.Tensor:
    """Parameter-free RMSNorm over the last dimension."""
    return F.rms_norm(x, (x.size(-1),))


@dataclass
class MemoryRead:
    """The memory m (B, |P|, d) a stage's positions read, and what every layer of the stage
    derives from it, formed once per stage and handed to each layer with the read."""

    m: torch.Tensor
    # nothing has been written yet (an init stage): m is zero, so every term it feeds is zero and
    # is skipped (exact, and the init stage costs what the plain model's forward does)
    zero: bool = False
    # the stage's positions as its hook points report them (None: a pass hooks skip); the
    # pathway's own hook points are called with them
    positions: range | None = None
    # gamma_l of every layer, split once per stage so that a layer reads its own as a view instead
    # of launching an indexing kernel (empty: no residual injection)
    gammas: tuple[torch.Tensor, ...] = ()
    # W_q,rec m, W_k,rec m, W_v,rec m (B, |P|, heads, head_dim) by projection name ("q_rec", ...):
    # in the stage's read, the shared projections (projections="shared"), formed once for every
    # layer; in a layer's read (`MemoryPathway.for_layer`), what that layer adds, formed before
    # its block runs (a read patched inside the block forms its own, `project_memory`)
    projected: dict[str, torch.Tensor] = field(default_factory=dict)
    # per projection name, the memory that projection reads instead of m (a hook on one route,
    # `blocks.{l}.attn.hook_mem_k` ...): only that route follows the patch; empty: all read m
    routes: dict[str, torch.Tensor] = field(default_factory=dict)
    # a layer's read only (`MemoryPathway.for_layer`): what is the layer's own, as inputs the
    # block's code reads like any other (never an index into the pathway's lists): gamma_l (None:
    # no residual injection), the gate W_g (None: no gates) and the W_rec modules by projection
    # name, and whether it is a replace layer
    gamma: torch.Tensor | None = None
    gate: nn.Module | None = None
    projections: dict[str, nn.Module] = field(default_factory=dict)
    drop_local: bool = False

    def patched(self, m: torch.Tensor) -> MemoryRead:
        """The same read with m replaced (a hook's intervention): the projections of m are formed
        again, the layer's parameters (independent of m) are kept."""
        return MemoryRead(
            m,
            positions=self.positions,
            gammas=self.gammas,
            gamma=self.gamma,
            gate=self.gate,
            projections=self.projections,
            drop_local=self.drop_local,
        )

    def with_routes(self, routes: dict[str, torch.Tensor]) -> MemoryRead:
        """The same read with the named projections ("q_rec", "k_rec", "v_rec") reading the given
        memory instead of m (a route-level intervention); the other projections, the residual
        injection and what the cache of shared projections holds are m's."""
        return dataclasses.replace(self, routes=routes)


def gated_sum(local, rec, g_loc, g_rec, drop_local: bool) -> torch.Tensor:
    """g_loc * local + g_rec * rec (eq. 2) in as few kernels as the absent terms allow: a gate None
    is 1, rec None is zero memory (W_rec 0 = 0), drop_local drops the local term (the replace
    layers); the gated term is one fused addcmul (decoding is launch-bound)."""
    base = torch.zeros_like(local) if drop_local else (local if g_loc is None else g_loc * local)
    if rec is None:
        return base
    return base + rec if g_rec is None else torch.addcmul(base, g_rec, rec)


# The routes by which the memory a layer reads enters it, by short name: the residual injection
# (sec. 2.2) and the recurrent query, key and value projections (sec. 2.1); each has its own
# hook point per layer (`lrt_lab.run.hooks`), the projections' under their projection names.
ROUTE_PROJECTIONS = {"q": "q_rec", "k": "k_rec", "v": "v_rec"}


def memory_routes(config: ModelConfig) -> tuple[str, ...]:
    """The routes the memory enters each layer by under `config`, of "resid", "q", "k", "v": the
    one statement of which route hook points exist (none without a memory pathway)."""
    m = config.memory
    if m is None:
        return ()
    present = {
        "resid": m.residual,
        "q": m.queries,
        "k": m.kv in ("both", "keys"),
        "v": m.kv in ("both", "values"),
    }
    return tuple(route for route, on in present.items() if on)


def register_memory(name: str):
    """Class decorator: `MemoryConfig(mechanism=name)` builds this MemoryPathway subclass. One
    line beside a mechanism defined anywhere; the generated invariant tests then include it
    (`pytest tests/test_invariants.py --memory-plugin FILE`, docs/extending.md)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name={name!r} is invalid; allowed: a Python identifier")

    def register(cls):
        if not (isinstance(cls, type) and issubclass(cls, MemoryPathway)):
            raise ValueError(f"{cls!r} is invalid; allowed: a subclass of MemoryPathway")
        MEMORY_MECHANISMS[name] = cls
        return cls

    return register


def build_memory(config: ModelConfig) -> MemoryPathway:
    """The pathway `config.memory.mechanism` names."""
    return MEMORY_MECHANISMS[config.memory.mechanism](config)


class MemoryPathway(nn.Module):
    """Every parameter the LRT adds to the backbone, and the math that uses them."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        m = config.memory
        self.config = config
        d, L = config.n_embd, config.n_layer
        H, Hkv, D = config.n_head, config.n_kv_head, config.head_dim
        src = config.source_layer  # 1-based
        # which blocks (0-based) feed m_t: stated here once; the Exact split is derived from it
        self.source_blocks: tuple[int, ...] = tuple(range(src - m.source_avg, src))
        # "KV replace, early 1/3 layers" (app. B): these layers take W_rec m instead of adding it
        self.replace_layers = (
            frozenset(range(max(1, L // 3))) if m.kv_mode == "replace" else frozenset()
        )
        n_proj = 1 if m.projections == "shared" else L

        def projections(out_dim):
            return nn.ModuleList(nn.Linear(d, out_dim, bias=False) for _ in range(n_proj))

        self.gamma = nn.Parameter(torch.zeros(L)) if m.residual else None
        self.q_rec = projections(H * D) if m.queries else None
        self.k_rec = projections(Hkv * D) if m.kv in ("both", "keys") else None
        self.v_rec = projections(Hkv * D) if m.kv in ("both", "values") else None
        # the gates read the first gate_channels channels (None: all d; 32: the released code)
        self.gate_channels = m.gate_channels or d
        self.gates = (
            nn.ModuleList(nn.Linear(self.gate_channels, 2 * Hkv, bias=False) for _ in range(L))
            if m.gated
            else None
        )
        self.source_weights = nn.Parameter(torch.zeros(m.source_avg)) if m.source_avg > 1 else None
        # the gated update's W_z: z = sigmoid(W_z h_t) per channel (config: update="gated")
        self.update_gate = nn.Linear(d, d, bias=False) if m.update == "gated" else None
        self.lag_weights = nn.Parameter(torch.zeros(m.lag_avg)) if m.lag_avg > 1 else None
        # hook points of the pathway's own values (module paths memory.hook_*)
        self.hook_source = HookPoint()  # h_t: the source taps mixed, before any update
        self.hook_update_gate = HookPoint() if self.update_gate is not None else None  # z

    def param_roles(self) -> dict[str, str]:
        """Optimizer role of every parameter (lrt_lab.training.optim): the projections and the gate
        matrices are hidden matrices (Muon, as in the paper's released code, where the gates stay
        unsaturated), gamma and the mixing weights are scalars."""
        return {
            "gamma": "scalar",
            "source_weights": "scalar",
            "lag_weights": "scalar",
            "q_rec.*": "matrix",
            "k_rec.*": "matrix",
            "v_rec.*": "matrix",
            "gates.*": "matrix",
            "update_gate.*": "matrix",
        }

    @torch.no_grad()
    def reset_parameters(self):
        mcfg = self.config.memory
        s = math.sqrt(3.0 / self.config.n_embd)  # uniform with the std of N(0, 1/d), as W_k, W_v
        if self.gamma is not None:
            self.gamma.fill_(mcfg.gamma_init)  # paper: 0.1
        for projs in (self.q_rec, self.k_rec, self.v_rec):
            for lin in projs or []:
                if mcfg.rec_init == "zero":
                    nn.init.zeros_(lin.weight)
                else:
                    nn.init.uniform_(lin.weight, -s, s)
        for gate in self.gates or []:
            nn.init.zeros_(gate.weight)  # 2*sigmoid(0) = 1: neutral gates (eq. 3)
        if self.update_gate is not None:
            nn.init.zeros_(self.update_gate.weight)  # z = 1/2: keep half, take half
        for w in (self.source_weights, self.lag_weights):
            if w is not None:
                w.zero_()  # a uniform average to start

    # Reading ------------------------------------------------------------------------------------
    def read(
        self, buffer, P: range, batch: int, like: torch.Tensor, hook_positions: range | None = None
    ) -> MemoryRead:
        """m_{t-lag} for t in P, or the learned average of m_{t-lag} .. m_{t-lag-lag_avg+1}
        (`MemoryConfig.read_offsets`); zero before position 0, before anything was written (an
        init stage), and, with reset_memory_at_bos, across document boundaries. hook_positions:
        what the pathway's hook points report for this stage (None: hooks skip it)."""
        offsets = self.config.memory.read_offsets
        # a view per layer, formed here once for the whole stage (MemoryRead.gammas)
        gammas = self.gamma.unbind(0) if self.gamma is not None else ()
        rows = buffer.read_memory(P, offsets.start, len(offsets))
        if rows is None:
            zeros = like.new_zeros(batch, len(P), self.config.n_embd)
            return MemoryRead(zeros, zero=True, positions=hook_positions, gammas=gammas)
        valid = buffer.memory_valid(P, offsets.start, len(offsets))
        if valid is not None:
            rows = rows * valid[..., None].to(rows.dtype)
        if len(offsets) == 1:
            m = rows[:, :, 0]
        else:
            m = torch.einsum("bpnd,n->bpd", rows, self.lag_weights.softmax(0).to(rows.dtype))
        return MemoryRead(m, positions=hook_positions, gammas=gammas)

    # A layer's view ------------------------------------------------------------------------------
    def _projections(self) -> dict[str, nn.ModuleList]:
        """The recurrent projections the config has, by name (one module, or one per layer)."""
        projs = {"q_rec": self.q_rec, "k_rec": self.k_rec, "v_rec": self.v_rec}
        return {name: p for name, p in projs.items() if p is not None}

    def for_layer(self, l: int, read: MemoryRead) -> MemoryRead:
        """`read` as layer l uses it: with gamma_l, W_g and W_rec of layer l, and W_rec m formed
        (a shared projection once per stage, kept in `read.projected`; a layerwise one here, for
        this layer). Called before block l runs: the block's code then reads no layer index, so
        every layer runs the same code (one compiled graph for all of them)."""
        own, projected = {}, {}
        for name, projs in self._projections().items():
            own[name] = projs[l if len(projs) > 1 else 0]
            if read.zero:
                continue
            if len(projs) > 1:
                projected[name] = self._split_heads(own[name](read.m))
            else:
                if name not in read.projected:
                    read.projected[name] = self._split_heads(own[name](read.m))
                projected[name] = read.projected[name]
        return dataclasses.replace(
            read,
            projected=projected,
            gamma=read.gammas[l] if read.gammas else None,
            gate=self.gates[l] if self.gates is not None else None,
            projections=own,
            drop_local=l in self.replace_layers,
        )

    # Injection ----------------------------------------------------------------------------------
    def inject_residual(self, x: torch.Tensor, mem: MemoryRead) -> torch.Tensor:
        """x_bar = x + gamma_l * m (sec. 2.2; the backbone has already formed
        alpha_l x + beta_l x0); mem: the layer's read (`for_layer`)."""
        if mem.gamma is None or mem.zero:
            return x
        return torch.addcmul(x, mem.gamma, mem.m)

    def gate_values(self, h: torch.Tensor, mem: MemoryRead):
        """(g_loc, g_rec), each (B, n, n_kv_head): 2 * sigmoid(W_g h) (eq. 3) with the layer's
        W_g (`for_layer`); (None, None) when the gates are off (both fixed at 1)."""
        if mem.gate is None:
            return None, None
        x = h if self.gate_channels == h.size(-1) else h[..., : self.gate_channels]
        return (2 * torch.sigmoid(mem.gate(x))).chunk(2, dim=-1)

    def project_memory(self, name: str, mem: MemoryRead) -> torch.Tensor | None:
        """W_name,rec m as (B, n, heads, head_dim) for the layer's read (`for_layer`), name one of
        "q_rec", "k_rec", "v_rec" (None: zero memory): formed before the block, or, for a read
        patched inside the block (a hook on hook_mem_in), here from its m. A projection the read
        routes elsewhere (`MemoryRead.routes`: a hook on that route) is formed from its own memory
        and not kept."""
        if name in mem.routes:
            return self._split_heads(mem.projections[name](mem.routes[name]))
        if mem.zero:
            return None
        if name not in mem.projected:
            mem.projected[name] = self._split_heads(mem.projections[name](mem.m))
        return mem.projected[name]

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:2], -1, self.config.head_dim)

    def inject_qkv(self, q, k, v, mem: MemoryRead, g_loc, g_rec):
        """Eqs. 2-4: k~ = g_loc * k_local + g_rec * W_k,rec m (same for v; and for q when
        memory.queries). In the replace layers the local term is dropped for K and V. The result
        then goes through QK-norm and RoPE at t like a local key (eq. 5; done by the caller)."""
        g_loc = g_loc.unsqueeze(-1) if g_loc is not None else None  # broadcast over head_dim
        g_rec = g_rec.unsqueeze(-1) if g_rec is not None else None
        drop_local = mem.drop_local
        if self.q_rec is not None:
            gq_loc, gq_rec, group = g_loc, g_rec, q.size(2) // k.size(2)
            if group > 1 and g_loc is not None:  # query heads share their KV head's gates (GQA)
                gq_loc = g_loc.repeat_interleave(group, dim=2)
                gq_rec = g_rec.repeat_interleave(group, dim=2)
            q = gated_sum(q, self.project_memory("q_rec", mem), gq_loc, gq_rec, False)
        if self.k_rec is not None:
            k = gated_sum(k, self.project_memory("k_rec", mem), g_loc, g_rec, drop_local)
        if self.v_rec is not None:
            v = gated_sum(v, self.project_memory("v_rec", mem), g_loc, g_rec, drop_local)
        return q, k, v

    # Emitting -----------------------------------------------------------------------------------
    def tap(self, out) -> torch.Tensor:
        """The activation of a source block (a `BlockOutput`) that becomes (part of) m_t."""
        tap = self.config.memory.source_tap
        if tap == "normed":
            return norm(out.x)
        if tap == "attn_out":
            return out.attn_out
        return out.x

    def emit(self, outputs: dict, read: MemoryRead) -> torch.Tensor:
        """m_t from the outputs of the source blocks {layer: BlockOutput} (a learned softmax
        average when memory.source_avg > 1) and `read`, the memory the positions read: with
        update="gated", m_t = z * m_{t-lag} + (1 - z) * h_t, z = sigmoid(W_z h_t)."""
        taps = [self.tap(outputs[l]) for l in self.source_blocks]
        if len(taps) == 1:
            h = taps[0]
        else:
            w = self.source_weights.softmax(0).to(taps[0].dtype)
            h = sum(wi * t for wi, t in zip(w, taps))
        h = self.hook_source(h, positions=read.positions)
        if self.update_gate is None:
            return h
        z = self.hook_update_gate(torch.sigmoid(self.update_gate(h)), positions=read.positions)
        if read.zero:  # nothing written yet: the kept part is zero
            return (1 - z) * h
        return z * read.m + (1 - z) * h


register_memory("lrt")(MemoryPathway)
