"""The Latent Recurrent Transformer: a nanochat-style decoder plus a cross-token memory pathway.

One compute primitive, `LRT.stage(tokens, P, buffer)`: recompute positions P against a shared
K/V + memory buffer (DESIGN.md). Training schedules, prefill strategies and decoding are all
orders of stages (`lrt_lab.schedules`, `lrt_lab.decode`). With `config.memory=None` the same class
is the plain transformer baseline, so both share every line of the backbone.

Memory pathway (paper sec. 2), for a position t reading m = m_{t-lag}:
- residual injection (sec. 2.2):  x_bar = alpha_l * x + beta_l * x0 + gamma_l * m
- KV projection (sec. 2.1, eqs. 2-5): k~ = g_loc * k~_local + g_rec * W_k,rec m (same for v),
  gates (g_loc, g_rec) = 2 * sigmoid(W_g x) per KV head with W_g zero-initialised; the combined
  key then goes through QK-norm and RoPE at position t, like the local key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import attend
from .buffer import DecodeCache, SequenceBuffer
from .config import ModelConfig

VE_GATE_CHANNELS = 32  # nanochat gates value embeddings from the first 32 input channels


def norm(x: torch.Tensor) -> torch.Tensor:
    """Parameter-free RMSNorm over the last dimension."""
    return F.rms_norm(x, (x.size(-1),))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on (B, T, H, D): rotate the pairs (x[:D/2], x[D/2:]) by the position's angles.

    cos, sin: full-width tables from `Rotary` (cos = [c, c], sin = [s, -s]), so the rotation is
    x * cos + swap_halves(x) * sin = [x1 c + x2 s, x2 c - x1 s] in three kernels."""
    x1, x2 = x.chunk(2, dim=-1)
    swapped = torch.cat([x2, x1], dim=-1)
    return torch.addcmul(x * cos, swapped, sin)


class Rotary(nn.Module):
    """Cos/sin for arbitrary positions, so decoding can run past sequence_len.

    Angles are formed in float64 and only then cast, so bf16/fp32 models get correctly rounded
    values and float64 tests are exact. The tables are cached per (device, dtype) and grown by
    doubling (a stage slices them: no per-stage trigonometry); they are plain attributes, not
    buffers, so `model.to(dtype)` never rounds them and they never enter a state_dict.
    """

    def __init__(self, head_dim: int, base: float):
        super().__init__()
        self.head_dim, self.base = head_dim, base
        self._tables: dict = {}

    def _build(self, n: int, device, dtype: torch.dtype):
        exponent = torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float64) / self.head_dim
        inv_freq = self.base ** (-exponent)
        pos = torch.arange(n, device=device, dtype=torch.float64)
        angles = pos[:, None] * inv_freq[None, :]                  # (n, D/2)
        cos, sin = angles.cos(), angles.sin()
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, -sin], -1)
        return cos.to(dtype)[None, :, None, :], sin.to(dtype)[None, :, None, :]

    def forward(self, P: range, device, dtype: torch.dtype):
        """(cos, sin), each (1, |P|, 1, D), for the positions in P."""
        key = (torch.device(device), dtype)
        cos, sin = self._tables.get(key, (None, None))
        if cos is None or cos.size(1) < P.stop:
            n = max(P.stop, 2 * cos.size(1) if cos is not None else 0, 64)
            with torch.inference_mode(False):  # a cached table must be usable by autograd later
                cos, sin = self._build(n, device, dtype)
            if not torch.compiler.is_compiling():
                self._tables[key] = (cos, sin)
        return cos[:, P.start:P.stop:P.step], sin[:, P.start:P.stop:P.step]


@dataclass
class StageWeights:
    """Fused projection weights shared by every stage over one buffer (see LRT._stage_weights)."""

    inp: list       # per layer: [W_q; W_k; W_v; W_g (LRT gates); W_ve_gate zero-padded to d]
    rec: list | None  # [W_k,rec; W_v,rec]: one entry (shared projections) or one per layer


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d, kv = config.n_embd, config.n_kv_head * config.head_dim
        self.c_q = nn.Linear(d, config.n_head * config.head_dim, bias=False)
        self.c_k = nn.Linear(d, kv, bias=False)
        self.c_v = nn.Linear(d, kv, bias=False)
        self.c_proj = nn.Linear(config.n_head * config.head_dim, d, bias=False)
        self.ve_gate = (nn.Linear(min(VE_GATE_CHANNELS, d), config.n_kv_head, bias=False)
                        if config.use_value_embeds else None)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn = Attention(config)
        self.mlp = MLP(config)


class MemoryPathway(nn.Module):
    """Every parameter the LRT adds to the backbone lives here (so param_report can count them)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        m = config.memory
        d, n_layer = config.n_embd, config.n_layer
        kv_dim = config.n_kv_head * config.head_dim
        n_proj = 1 if m.projections == "shared" else n_layer
        self.gamma = nn.Parameter(torch.zeros(n_layer)) if m.residual else None
        self.k_rec = (nn.ModuleList(nn.Linear(d, kv_dim, bias=False) for _ in range(n_proj))
                      if m.kv in ("both", "keys") else None)
        self.v_rec = (nn.ModuleList(nn.Linear(d, kv_dim, bias=False) for _ in range(n_proj))
                      if m.kv in ("both", "values") else None)
        self.gates = (nn.ModuleList(nn.Linear(d, 2 * config.n_kv_head, bias=False) for _ in range(n_layer))
                      if m.uses_kv and m.gate else None)
        self.source_weights = nn.Parameter(torch.zeros(m.source_avg)) if m.source_avg > 1 else None
        self.lag_weights = nn.Parameter(torch.zeros(m.lag_avg)) if m.lag_avg > 1 else None


class LRT(nn.Module):
    """Decoder-only transformer with optional latent recurrence (config.memory)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise ValueError(f"config={config!r} is invalid; allowed: a ModelConfig")
        self.config = config
        d, n_layer = config.n_embd, config.n_layer
        # Module constructors draw default inits we overwrite; keep them off the caller's RNG so
        # reset_parameters alone decides the weights: the same seed gives the same backbone with
        # or without a memory pathway (controlled LRT-vs-transformer comparisons).
        with torch.random.fork_rng(devices=[]):
            self.wte = nn.Embedding(config.vocab_size, d)
            self.blocks = nn.ModuleList(Block(config) for _ in range(n_layer))
            self.value_embeds = (nn.ModuleList(nn.Embedding(config.vocab_size, config.n_kv_head * config.head_dim)
                                               for _ in range(n_layer)) if config.use_value_embeds else None)
            self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
            self.memory = MemoryPathway(config) if config.memory is not None else None
        self.resid_lambdas = nn.Parameter(torch.ones(n_layer)) if config.use_resid_lambdas else None
        self.x0_lambdas = nn.Parameter(torch.zeros(n_layer)) if config.use_x0_residual else None
        self.rotary = Rotary(config.head_dim, config.rope_base)
        self.windows = config.window_sizes()
        src = config.source_layer
        # 0-based indices of the layers whose outputs form m_t
        self.source_layers = (list(range(src - config.memory.source_avg, src))
                              if config.memory is not None else [])
        n_replace = max(1, n_layer // 3)  # "KV replace, early 1/3 layers" (app. B)
        self.replace_layers = (set(range(n_replace))
                               if config.memory is not None and config.memory.kv_mode == "replace" else set())
        self.reset_parameters()

    # Initialisation -------------------------------------------------------------------------
    @torch.no_grad()
    def reset_parameters(self):
        """nanochat's init; LRT additions per paper sec. 2 (gates at 1, gamma at gamma_init)."""
        cfg = self.config
        s = math.sqrt(3.0 / cfg.n_embd)  # uniform with the std of N(0, 1/d)
        nn.init.normal_(self.wte.weight, std=1.0)
        nn.init.normal_(self.lm_head.weight, std=0.001)
        for block in self.blocks:
            for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_fc):
                nn.init.uniform_(lin.weight, -s, s)
            nn.init.zeros_(block.attn.c_proj.weight)  # blocks start as the identity
            nn.init.zeros_(block.mlp.c_proj.weight)
            if block.attn.ve_gate is not None:
                nn.init.zeros_(block.attn.ve_gate.weight)
        if self.value_embeds is not None:
            for emb in self.value_embeds:
                nn.init.uniform_(emb.weight, -s, s)
        if self.resid_lambdas is not None:
            self.resid_lambdas.fill_(1.0)
        if self.x0_lambdas is not None:
            self.x0_lambdas.fill_(0.1)
        mem = self.memory
        if mem is not None:
            mcfg = cfg.memory
            if mem.gamma is not None:
                mem.gamma.fill_(mcfg.gamma_init)
            for projs in (mem.k_rec, mem.v_rec):
                for lin in projs or []:
                    if mcfg.rec_init == "zero":
                        nn.init.zeros_(lin.weight)
                    else:
                        nn.init.uniform_(lin.weight, -s, s)
            for gate in mem.gates or []:
                nn.init.zeros_(gate.weight)  # 2*sigmoid(0) = 1: neutral gates (eq. 3)
            for w in (mem.source_weights, mem.lag_weights):
                if w is not None:
                    w.zero_()  # a uniform average to start

    # The stage primitive ----------------------------------------------------------------------
    def read_memory(self, buffer, P: range) -> torch.Tensor | None:
        """m_{t-lag} for t in P (or the learned average of the last lag_avg states); None = zero."""
        mcfg = self.config.memory
        if mcfg is None:
            return None
        rows = buffer.read_memory(P, mcfg.lag, mcfg.lag_avg)
        if rows is None:
            return None
        valid = buffer.memory_valid(P, mcfg.lag, mcfg.lag_avg)
        if valid is not None:
            rows = rows * valid[..., None].to(rows.dtype)
        if mcfg.lag_avg == 1:
            return rows[:, :, 0]
        return torch.einsum("bpnd,n->bpd", rows, self.memory.lag_weights.softmax(0).to(rows.dtype))

    # Fused projections --------------------------------------------------------------------------
    def _fused_params(self) -> list[torch.Tensor]:
        ps = []
        for l, block in enumerate(self.blocks):
            a = block.attn
            ps += [a.c_q.weight, a.c_k.weight, a.c_v.weight]
            if a.ve_gate is not None:
                ps.append(a.ve_gate.weight)
        mem = self.memory
        if mem is not None:
            for mods in (mem.gates, mem.k_rec, mem.v_rec):
                ps += [m.weight for m in mods or []]
        return ps

    def _stage_weights(self, buffer) -> "StageWeights":
        """The fused projection weights a stage uses, built once per buffer (one schedule run, or
        one decoder) and rebuilt when any weight, the grad mode or the autocast dtype changes.

        Under autograd the fused weights are part of the graph (one cat forward, one split
        backward per schedule run), so gradients reach the parameters as before."""
        device_type = self.wte.weight.device.type
        cast = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
        mode = (torch.is_grad_enabled(), cast)
        scratch = getattr(buffer, "scratch", None)
        hit = scratch.get("stage_weights") if scratch is not None else None
        if hit is not None:
            params, versions, hit_mode, weights = hit
            # in-place updates (optimizer steps, load_state_dict) bump a parameter's version
            if hit_mode == mode and all(p._version == v for p, v in zip(params, versions)):
                return weights
        params = self._fused_params()
        weights = self._build_stage_weights(cast)
        if scratch is not None:
            scratch["stage_weights"] = (params, [p._version for p in params], mode, weights)
        return weights

    def _build_stage_weights(self, cast: torch.dtype | None) -> "StageWeights":
        d, mem = self.config.n_embd, self.memory
        # The dual gates are 2*sigmoid(W_g h) (eq. 3). Every gated term is doubled in the weights
        # instead (exact: a power of two), so a stage applies plain sigmoid(W_g h).
        gated = mem is not None and mem.gates is not None
        k_x2 = 2 if gated and mem.k_rec is not None else 1
        v_x2 = 2 if gated and mem.v_rec is not None else 1
        inp = []
        for l, block in enumerate(self.blocks):
            a = block.attn
            rows = [a.c_q.weight, a.c_k.weight * k_x2 if k_x2 != 1 else a.c_k.weight,
                    a.c_v.weight * v_x2 if v_x2 != 1 else a.c_v.weight]
            if gated:
                rows.append(mem.gates[l].weight)
            if a.ve_gate is not None:  # reads only the first VE_GATE_CHANNELS inputs: zero-pad to d
                rows.append(F.pad(a.ve_gate.weight, (0, d - a.ve_gate.weight.size(1))))
            inp.append(torch.cat(rows, 0))
        rec = None
        if mem is not None and (mem.k_rec is not None or mem.v_rec is not None):
            mods = [m for m in (mem.k_rec, mem.v_rec) if m is not None]
            rec = [torch.cat([m[i].weight for m in mods], 0) if len(mods) > 1 else mods[0][i].weight
                   for i in range(len(mods[0]))]
            if gated:
                rec = [2 * w for w in rec]
        if cast is not None:
            inp = [w.to(cast) for w in inp]
            rec = [w.to(cast) for w in rec] if rec is not None else None
        return StageWeights(inp, rec)

    def _recurrent_kv(self, mem: torch.Tensor | None, weights: "StageWeights", i: int):
        """W_k,rec m and W_v,rec m, (B, n, n_kv_head, head_dim) each, in one matmul (i: projection
        index; shared projections have one, computed once per stage for every layer)."""
        if mem is None or weights.rec is None:
            return None, None, None
        cfg, mod = self.config, self.memory
        B, n = mem.shape[:2]
        out = F.linear(mem, weights.rec[i])
        kvd = cfg.n_kv_head * cfg.head_dim
        parts = iter(out.split(kvd, dim=-1))
        k = next(parts).view(B, n, cfg.n_kv_head, cfg.head_dim) if mod.k_rec is not None else None
        v = next(parts).view(B, n, cfg.n_kv_head, cfg.head_dim) if mod.v_rec is not None else None
        # both: also [k; v] as one (B, n, 2, n_kv_head, head_dim) view, for the joint gating below
        kv = out.view(B, n, 2, cfg.n_kv_head, cfg.head_dim) if k is not None and v is not None else None
        return k, v, kv

    def deferred_layers(self, chunk: int = 1) -> int | None:
        """Where Chunked(chunk) / Exact may split the stack (0-based index of the first block above
        the source layer), or None. Only blocks 1..source_layer of position t feed m_t; the blocks
        above read m_{t-lag} but feed nothing sequential, so they can run for every position in one
        parallel stage once the lower blocks have run chunk by chunk (same logits). That holds
        while chunk <= lag: a longer chunk reads zero memory inside itself (sec. 3.2), which a
        pass over the finished memory would not reproduce."""
        if self.memory is None or chunk > self.config.memory.lag:
            return None
        split = self.config.source_layer
        return split if split < self.config.n_layer else None

    def stage(self, tokens: torch.Tensor, P: range, buffer, hooks: dict | None = None,
              layers: range | None = None, resid: torch.Tensor | None = None):
        """Recompute positions P (tokens: (B, |P|), the inputs at P) against `buffer`.

        Returns (logits at P: (B, |P|, V), the buffer with P's K/V and source states written).
        `hooks`, when a dict, receives the stage's activations at P by their stable names.

        layers: the contiguous blocks to run (default: all). A stage that starts above block 0
        takes `resid`, the residual stream entering its first block at P; one that stops below
        the top returns that residual stream (B, |P|, d) instead of logits. The buffer's K/V of
        the blocks outside `layers` are left as they were (see `deferred_layers`).
        """
        cfg, mem_module = self.config, self.memory
        B, n = tokens.shape
        H, Hkv, D = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        qd, kvd = H * D, Hkv * D
        L = cfg.n_layer
        layers = range(L) if layers is None else layers
        if not (isinstance(layers, range) and layers.step == 1 and 0 <= layers.start < layers.stop <= L):
            raise ValueError(f"layers={layers!r} is invalid; allowed: range(a, b) with 0 <= a < b <= n_layer={L}")
        if (layers.start > 0) != (resid is not None):
            raise ValueError("resid is invalid: allowed: the residual stream (B, |P|, d) exactly when "
                             f"layers starts above block 0 (layers={layers})")
        weights = self._stage_weights(buffer)
        x0 = norm(self.wte(tokens))
        x = x0 if resid is None else resid
        cos, sin = self.rotary(P, x.device, x.dtype)
        mem = self.read_memory(buffer, P)
        kv_memory = mem_module is not None and cfg.memory.uses_kv
        gated = kv_memory and mem_module.gates is not None
        keys_local = not (kv_memory and mem_module.k_rec is not None)  # keys = W_k h only
        shared = kv_memory and cfg.memory.projections == "shared"
        rec_shared = self._recurrent_kv(mem, weights, 0) if shared else None  # once per stage
        extra_sizes = ([2 * Hkv] if gated else []) + ([Hkv] if cfg.use_value_embeds else [])
        # Without autograd (decoding, prefill) the gated K/V injection runs in place on the fused
        # projection: K and V gated together (they share the gates, eq. 3) in two kernels, and q, k
        # stay adjacent for one norm + rotation, as in the transformer (docs/performance.md)
        inplace_kv = (gated and hooks is None and not torch.is_grad_enabled()
                      and mem_module.k_rec is not None and mem_module.v_rec is not None)
        if hooks is not None and layers.start == 0:
            hooks["embed"] = x0
            if cfg.memory is not None:
                hooks["mem_in"] = mem if mem is not None else x.new_zeros(B, n, cfg.n_embd)
        # per-layer scalars as views made once per stage (indexing a parameter is a kernel call)
        alphas = self.resid_lambdas.unbind(0) if self.resid_lambdas is not None else [None] * L
        betas = self.x0_lambdas.unbind(0) if self.x0_lambdas is not None else [None] * L
        gammas = (mem_module.gamma.unbind(0) if mem is not None and mem_module.gamma is not None
                  else [None] * L)
        k_full, v_full, sources = list(buffer.k), list(buffer.v), []
        for l in layers:
            block = self.blocks[l]
            # x' = alpha_l x + beta_l x0 + gamma_l m (residual injection, sec. 2.2) in as few
            # kernels as the enabled terms need
            side = betas[l] * x0 if betas[l] is not None else None
            if gammas[l] is not None:
                side = gammas[l] * mem if side is None else torch.addcmul(side, gammas[l], mem)
            if alphas[l] is not None:
                x = alphas[l] * x if side is None else torch.addcmul(side, alphas[l], x)
            elif side is not None:
                x = x + side
            if hooks is not None:
                hooks[f"blocks.{l}.resid_pre"] = x
                if cfg.memory is not None:
                    inj = (mem if mem is not None else x.new_zeros(B, n, cfg.n_embd))
                    hooks[f"blocks.{l}.mem_in"] = inj * mem_module.gamma[l] if mem_module.gamma is not None else inj
            h = norm(x)
            attn = block.attn
            # one matmul for q, k, v, the LRT gates and the value-embedding gate (fused weights)
            proj = F.linear(h, weights.inp[l])
            if inplace_kv and l not in self.replace_layers:
                rec = rec_shared if shared else self._recurrent_kv(mem, weights, l)
                qk, v = self._inject_kv_inplace(l, proj, tokens, rec[2], extra_sizes)
                q, k = apply_rotary(norm(qk), cos, sin).split([H, Hkv], dim=2)
            else:
                # split (not slicing): its backward is one concatenation, not a zero-filled
                # proj-sized gradient per slice
                if keys_local:  # q and k stay adjacent: normalised and rotated together below
                    qk, v, *rest = proj.split([qd + kvd, kvd] + extra_sizes, dim=-1)
                    k = None
                else:
                    q, k, v, *rest = proj.split([qd, kvd, kvd] + extra_sizes, dim=-1)
                    q, k = q.view(B, n, H, D), k.view(B, n, Hkv, D)
                v = v.view(B, n, Hkv, D)
                gate_logits = rest.pop(0) if gated else None
                if attn.ve_gate is not None:
                    # v + 2 sigmoid(W_ve h) * ve: the factor 2 rides in addcmul (exact: a power of 2;
                    # 4 when the values' gate factor 2 is folded into the weights, see above)
                    ve_gate = torch.sigmoid(rest.pop(0))
                    ve = self._value_embedding(l, tokens, v.dtype)
                    v = torch.addcmul(v, ve_gate[..., None], ve,
                                      value=4 if gated and mem_module.v_rec is not None else 2)
                if kv_memory:
                    rec = rec_shared if shared else self._recurrent_kv(mem, weights, l)
                    k, v = self._inject_kv(l, gate_logits, k, v, rec, hooks)
                # QK-norm, then RoPE: the recurrent key is encoded at t (eq. 5)
                # q and k side by side: one norm and one rotation for both. They are adjacent in `proj`
                # when the keys are local only; after the KV injection they are concatenated when the
                # stage is small (kernel launches dominate: decoding, Exact), else normalised apart
                # (a concatenation is one more pass over q and k where bandwidth dominates)
                if keys_local or B * n <= 64:
                    qk = qk.view(B, n, H + Hkv, D) if keys_local else torch.cat([q, k], dim=2)
                    q, k = apply_rotary(norm(qk), cos, sin).split([H, Hkv], dim=2)
                else:
                    q, k = apply_rotary(norm(q), cos, sin), apply_rotary(norm(k), cos, sin)
            q, k = q.to(v.dtype), k.to(v.dtype)
            K, V = buffer.splice_kv(l, P, k, v)
            k_full[l], v_full[l] = K, V
            if K.size(1) > P.stop:  # (only then: slicing is not free under autograd)
                K, V = K[:, :P.stop], V[:, :P.stop]
            y = attend(q, K, V, P, self.windows[l])
            attn_out = attn.c_proj(y.reshape(B, n, H * D))
            x = x + attn_out
            mlp_out = block.mlp(norm(x))
            x = x + mlp_out
            if hooks is not None:
                hooks[f"blocks.{l}.attn_out"] = attn_out
                hooks[f"blocks.{l}.mlp_out"] = mlp_out
                hooks[f"blocks.{l}.resid_post"] = x
            if l in self.source_layers:
                sources.append(x)
        mem_out = None
        if sources:
            if len(sources) == 1:
                mem_out = sources[0]
            else:
                w = mem_module.source_weights.softmax(0).to(x.dtype)
                mem_out = sum(wi * s for wi, s in zip(w, sources))
            if hooks is not None:
                hooks["mem_out"] = mem_out
        if layers.stop < L:
            return x, buffer.updated(P, k_full, v_full, mem_out)
        logits = self.lm_head(norm(x))
        if cfg.softcap is not None:
            logits = cfg.softcap * torch.tanh(logits / cfg.softcap)
        return logits, buffer.updated(P, k_full, v_full, mem_out)

    def _value_embedding(self, l: int, tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Layer l's value embedding of `tokens` as (B, n, n_kv_head, head_dim) in v's dtype (under
        bf16 autocast an fp32 embedding would promote v, and with it attention, to fp32)."""
        B, n = tokens.shape
        return self.value_embeds[l](tokens).view(B, n, self.config.n_kv_head, self.config.head_dim).to(dtype)

    def _inject_kv_inplace(self, l, proj, tokens, rec_kv, extra_sizes):
        """Without autograd: value embedding and the gated KV injection (eqs. 2-4) written into the
        fused projection `proj` in place. Returns (q and k side by side: (B, n, H + Hkv, D), v).

        Same arithmetic as the out-of-place path (v + 4 sigmoid(W_ve h) ve, then g_loc * local +
        g_rec * W_rec m with the gates' 2 folded into the weights), with K and V gated together."""
        cfg = self.config
        B, n = proj.shape[:2]
        H, Hkv, D = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        qd, kvd = H * D, Hkv * D
        _, kv, gate_logits, *rest = proj.split([qd, 2 * kvd] + extra_sizes, dim=-1)
        kv = kv.view(B, n, 2, Hkv, D)                 # [k; v], a view into proj
        v = kv.select(2, 1)
        if self.blocks[l].attn.ve_gate is not None:
            ve = self._value_embedding(l, tokens, kv.dtype)
            v.addcmul_(torch.sigmoid(rest[0]).unsqueeze(-1), ve, value=4)
        g_loc, g_rec = torch.sigmoid(gate_logits).view(B, n, 2, 1, Hkv, 1).unbind(2)
        kv.mul_(g_loc)
        if rec_kv is not None:  # zero memory contributes nothing; the local gate still applies
            kv.addcmul_(g_rec, rec_kv)
        return proj.narrow(-1, 0, qd + kvd).view(B, n, H + Hkv, D), v

    def _inject_kv(self, l, gate_logits, k, v, rec, hooks):
        """KV projection (eqs. 2-4): gate and add (or, in replace layers, substitute) W_rec m."""
        cfg, mem_module = self.config, self.memory
        B, n = v.shape[:2]
        Hkv = cfg.n_kv_head
        if gate_logits is not None:
            # sigmoid only: the gates' factor 2 is folded into the gated weights (_build_stage_weights)
            g_loc, g_rec = torch.sigmoid(gate_logits).view(B, n, 2, Hkv, 1).unbind(2)
            if hooks is not None:
                hooks[f"blocks.{l}.gate_local"] = 2 * g_loc[..., 0]
                hooks[f"blocks.{l}.gate_rec"] = 2 * g_rec[..., 0]
        else:
            g_loc = g_rec = None
        replace = l in self.replace_layers

        def combine(local, rec):
            # zero memory contributes nothing, but the local gate still applies (same function
            # for every stage, so the init stage is the t-1 = "no memory" case of the same model)
            base = None if replace else (local if g_loc is None else g_loc * local)
            if rec is None:
                return base if base is not None else torch.zeros_like(local)
            if base is None:
                return rec if g_rec is None else g_rec * rec
            return base + rec if g_rec is None else torch.addcmul(base, g_rec, rec)

        k_rec, v_rec, _ = rec
        if mem_module.k_rec is not None:
            k = combine(k, k_rec)
        if mem_module.v_rec is not None:
            v = combine(v, v_rec)
        return k, v

    # Conveniences ------------------------------------------------------------------------------
    def forward(self, idx, targets=None, schedule=None, cache: dict | None = None):
        """Run a schedule (default OnePass) on idx; returns a ScheduleOutput (logits, loss, ...)."""
        from .schedules import OnePass, run_schedule
        return run_schedule(self, idx, targets, schedule or OnePass(), cache=cache)

    def empty_buffer(self, tokens: torch.Tensor) -> SequenceBuffer:
        """The all-zero buffer a schedule starts from (models with other state override this)."""
        return SequenceBuffer.empty(self.config, tokens)

    def new_decode_cache(self, batch_size: int, max_len: int, device=None, dtype=None) -> DecodeCache:
        """The in-place state the Decoder appends to (models with other state override this)."""
        return DecodeCache(self.config, batch_size, max_len, device=device, dtype=dtype)

    @torch.no_grad()
    def generate(self, prompt_ids, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 seed: int | None = None, prefill=None):
        """Sample continuations with one forward per generated token (recurrent decoding)."""
        from .decode import generate
        return generate(self, prompt_ids, max_new_tokens, temperature, top_k, seed, prefill)

    def param_report(self) -> dict:
        """Parameters the memory pathway adds, absolute and relative.

        The paper's "+0.3% / +4.8%" (d20 shared / layerwise) match added / total-with-memory;
        both ratios are reported.
        """
        total = sum(p.numel() for p in self.parameters())
        added = sum(p.numel() for p in self.memory.parameters()) if self.memory is not None else 0
        baseline = total - added
        return {"total": total, "baseline": baseline, "added": added,
                "added_pct_of_baseline": 100.0 * added / baseline,
                "added_pct_of_total": 100.0 * added / total}

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Optimizer groups (paper app. A "Optimization"): Muon for 2-D hidden matrices including
        the LRT projections; AdamW for embeddings, head, and scalars/gates."""
        groups = {"matrix": [], "embedding": [], "head": [], "scalar": []}
        for name, p in self.named_parameters():
            if name.startswith("wte.") or name.startswith("value_embeds."):
                groups["embedding"].append(p)
            elif name.startswith("lm_head."):
                groups["head"].append(p)
            elif p.ndim == 2 and ".ve_gate." not in name and not name.startswith("memory.gates."):
                groups["matrix"].append(p)
            else:
                groups["scalar"].append(p)
        return groups
