"""An independent, readable reference for the LRT: loops over sequences, positions, layers and
heads.

It shares no code with lrt_lab.core.model: it reads the model's weights by name and redoes the
paper's
math (sec. 2, eqs. 1-6) one position at a time, in float64, with a hand-written softmax
attention. A stage over positions P visits P in order; position t attends to keys s <= t inside
its window, taking the fresh key when s is in P (already computed in this loop) and the buffer's
key otherwise; memory is always read from the buffer as it was when the stage began.
"""

from __future__ import annotations

import math

import torch


def rms(x):
    return x / torch.sqrt((x * x).mean() + torch.finfo(x.dtype).eps)


def rope(x, t, base):
    """x: (heads, D). Rotate pair (x[i], x[i+D/2]) by angle t * base^(-2i/D)."""
    D = x.shape[-1]
    out = torch.empty_like(x)
    for i in range(D // 2):
        theta = t * base ** (-2 * i / D)
        c, s = math.cos(theta), math.sin(theta)
        a, b = x[:, i], x[:, i + D // 2]
        out[:, i] = a * c + b * s
        out[:, i + D // 2] = b * c - a * s
    return out


class NaiveLRT:
    def __init__(self, model):
        self.cfg = model.config
        self.W = {k: v.detach().double() for k, v in model.state_dict().items()}
        c = self.cfg
        self.windows = []
        pattern = c.window_pattern.upper()
        short = c.short_window or c.sequence_len // 2
        # keys a query sees, its own included: a window of N covers the query and the N before it
        # ("nanochat"), or N keys in all ("keys", the earlier convention)
        short += 1 if c.window_convention == "nanochat" else 0
        for l in range(c.n_layer):
            self.windows.append(
                None if (l == c.n_layer - 1 or pattern[l % len(pattern)] == "L") else short
            )

    # --- one position -------------------------------------------------------------------------
    def _memory(self, buf, tokens, t):
        """The memory read by position t from the (old) buffer: m_{t-lag}, or a learned average."""
        c, m = self.cfg, self.cfg.memory
        rows = []
        for j in range(m.lag_avg):
            s = t - m.lag - j
            row = buf["mem"].get(s) if s >= 0 else None
            if row is not None and m.reset_memory_at_bos:
                # same document iff no BOS in (s, t]
                if any(int(tokens[u]) == c.bos_token_id for u in range(s + 1, t + 1)):
                    row = None
            rows.append(row if row is not None else torch.zeros(c.n_embd, dtype=torch.float64))
        if m.lag_avg == 1:
            return rows[0]
        w = torch.softmax(self.W["pathway.lag_weights"], 0)
        return sum(w[j] * rows[j] for j in range(m.lag_avg))

    def _position(self, tokens, t, P_set, buf, fresh):
        c, W, m = self.cfg, self.W, self.cfg.memory
        H, Hkv, D = c.n_head, c.n_kv_head, c.head_dim
        tok = int(tokens[t])
        x = rms(W["wte.weight"][tok])
        x0 = x
        mem = self._memory(buf, tokens, t) if m is not None else None
        src_layer = c.source_layer
        sources = []
        for l in range(c.n_layer):
            p = f"blocks.{l}."
            alpha = W["resid_lambdas"][l] if c.use_resid_lambdas else 1.0
            x = alpha * x
            if c.use_x0_residual:
                x = x + W["x0_lambdas"][l] * x0
            if m is not None and m.residual:
                x = x + W["pathway.gamma"][l] * mem
            h = rms(x)
            q = (W[p + "attn.c_q.weight"] @ h).view(H, D)
            k = (W[p + "attn.c_k.weight"] @ h).view(Hkv, D)
            v = (W[p + "attn.c_v.weight"] @ h).view(Hkv, D)
            ve = None
            if c.use_value_embeds:
                g = 2 * torch.sigmoid(W[p + "attn.ve_gate.weight"] @ h[:32])
                ve = g[:, None] * W[f"value_embeds.{l}.weight"][tok].view(Hkv, D)
            if ve is not None and m is not None and m.gate_value_embeds:
                v = v + ve  # the earlier convention: the value embedding under the local gate
                ve = None
            if m is not None and (m.kv != "none" or m.queries):
                i = 0 if m.projections == "shared" else l
                if m.gate:
                    # the first gate_channels channels (None: all)
                    gc = m.gate_channels or h.numel()
                    g = 2 * torch.sigmoid(W[f"pathway.gates.{l}.weight"] @ h[:gc]).view(2, Hkv)
                    g_loc, g_rec = g[0][:, None], g[1][:, None]
                else:
                    g_loc = g_rec = 1.0
                replace = m.kv_mode == "replace" and l < max(1, c.n_layer // 3)
                if m.kv in ("both", "keys"):
                    k_rec = (W[f"pathway.k_rec.{i}.weight"] @ mem).view(Hkv, D)
                    k = (0 if replace else g_loc * k) + g_rec * k_rec
                if m.kv in ("both", "values"):
                    v_rec = (W[f"pathway.v_rec.{i}.weight"] @ mem).view(Hkv, D)
                    v = (0 if replace else g_loc * v) + g_rec * v_rec
                if m.queries:  # each query head uses the gates of its KV head (GQA grouping)
                    q_rec = (W[f"pathway.q_rec.{i}.weight"] @ mem).view(H, D)
                    group = H // Hkv
                    for hq in range(H):
                        gl = g_loc if isinstance(g_loc, float) else g_loc[hq // group]
                        gr = g_rec if isinstance(g_rec, float) else g_rec[hq // group]
                        q[hq] = gl * q[hq] + gr * q_rec[hq]
            if ve is not None:  # a baseline component, outside the memory's gates
                v = v + ve
            q = torch.stack([rms(q[i]) for i in range(H)])
            k = torch.stack([rms(k[i]) for i in range(Hkv)])
            q, k = rope(q, t, c.rope_base), rope(k, t, c.rope_base)
            fresh["k"][l][t], fresh["v"][l][t] = k, v
            window = self.windows[l]
            lo = 0 if window is None else max(0, t - window + 1)
            heads = []
            for hq in range(H):
                hk = hq // (H // Hkv)
                keys, vals = [], []
                for s in range(lo, t + 1):
                    src = fresh if s in P_set else buf
                    keys.append(src["k"][l].get(s, torch.zeros(Hkv, D, dtype=torch.float64))[hk])
                    vals.append(src["v"][l].get(s, torch.zeros(Hkv, D, dtype=torch.float64))[hk])
                scores = torch.stack([q[hq] @ kk for kk in keys]) / math.sqrt(D)
                probs = torch.exp(scores - scores.max())
                probs = probs / probs.sum()
                heads.append(sum(pr * vv for pr, vv in zip(probs, vals)))
            attn_out = W[p + "attn.c_proj.weight"] @ torch.cat(heads)
            x = x + attn_out
            hmlp = torch.relu(W[p + "mlp.c_fc.weight"] @ rms(x)) ** 2
            x = x + W[p + "mlp.c_proj.weight"] @ hmlp
            if m is not None and src_layer - m.source_avg <= l < src_layer:
                tap = {"resid": x, "normed": rms(x), "attn_out": attn_out}[m.source_tap]
                sources.append(tap)
        if m is not None:
            if m.source_avg == 1:
                h_src = sources[0]
            else:
                w = torch.softmax(W["pathway.source_weights"], 0)
                h_src = sum(w[j] * sources[j] for j in range(m.source_avg))
            if m.update == "gated":  # m_t = z m_{t-lag} + (1 - z) h_t, z = sigmoid(W_z h_t)
                z = torch.sigmoid(W["pathway.update_gate.weight"] @ h_src)
                h_src = z * mem + (1 - z) * h_src
            fresh["mem"][t] = h_src
        logits = W["lm_head.weight"] @ rms(x)
        if c.softcap is not None:
            logits = c.softcap * torch.tanh(logits / c.softcap)
        return logits

    # --- stages and schedules -------------------------------------------------------------------
    def empty_buffer(self):
        L = self.cfg.n_layer
        return {"k": [dict() for _ in range(L)], "v": [dict() for _ in range(L)], "mem": {}}

    def stage(self, tokens, P, buf):
        """tokens: (T,) one sequence. Returns ({t: logits}, new buffer)."""
        P = sorted(P)
        fresh = self.empty_buffer()
        logits = {t: self._position(tokens, t, set(P), buf, fresh) for t in P}
        new = {
            "k": [{**buf["k"][l], **fresh["k"][l]} for l in range(self.cfg.n_layer)],
            "v": [{**buf["v"][l], **fresh["v"][l]} for l in range(self.cfg.n_layer)],
            "mem": {**buf["mem"], **fresh["mem"]},
        }
        return logits, new

    def run(self, tokens, stages):
        """tokens: (B, T). Returns final logits (B, T', V) over the positions any stage computed,
        and
        the per-stage logits [(P, (B, |P|, V))]."""
        per_seq_final, per_seq_stages = [], []
        for b in range(tokens.size(0)):
            buf, final, stage_out = self.empty_buffer(), {}, []
            for P in stages:
                out, buf = self.stage(tokens[b], P, buf)
                final.update(out)
                stage_out.append(torch.stack([out[t] for t in sorted(P)]))
            per_seq_final.append(torch.stack([final[t] for t in sorted(final)]))
            per_seq_stages.append(stage_out)
        stage_logits = [torch.stack([s[i] for s in per_seq_stages]) for i in range(len(stages))]
        return torch.stack(per_seq_final), stage_logits


def naive_cross_entropy(logits, targets):
    """Mean over counted positions of -log softmax(logits)[target], written out by hand."""
    total, count = 0.0, 0
    for b in range(targets.size(0)):
        for t in range(targets.size(1)):
            if targets[b, t] < 0:
                continue
            z = logits[b, t].double()
            total += -(z[targets[b, t]] - (z - z.max()).exp().sum().log() - z.max())
            count += 1
    return total / max(count, 1)
