"""The paper's released LRT forward, written out one position at a time in float64.

An independent statement of what the authors' code computes (their nanochat fork's GPT with
`use_interleaved`), from its equations, in its own parameter names and layout; it shares no code
with lrt_lab and none of lrt_lab's conventions. Per layer l, at position t with feedback
h = h_final[t-1] (zero at t = 0 and in the first full pass):

    x   <- lambda_resid[l] * x + lambda_x0[l] * x0 + lambda_fb[l] * h
    n   =  rms(x)
    (g_loc, g_fb, g_ve) = 2 sigmoid(W_triple[l] n[:32])      (one matrix, three KV-head gates)
    k   =  g_loc * W_k n + g_fb * W_kfb[l] h
    v   =  g_loc * W_v n + g_fb * W_vfb[l] h + g_ve * VE[l][token]   (the value embedding outside
                                                                    the local gate)
    q, k <- rms(rope(q)), rms(rope(k))                       (rotary first, then QK-norm)
    attention over keys s in [t - N, t] for a window (N, 0): N + 1 keys (N = sequence_len // 2 for
    "S" layers; the last layer sees everything)
    x   <- x + W_o attn;  x <- x + W_2 relu(W_1 rms(x))^2
    h_final[t] = rms(x);  logits = 15 tanh(W_head h_final[t] / 15)

A pass recomputes a set of positions against a buffer of every layer's K/V and h_final: each
position of the pass reads its feedback from the buffer as it was when the pass began, and
attends to the pass's own fresh K/V at earlier positions of the pass and the buffer's elsewhere.
Training with interleaving: one full pass (zero feedback), then for i = 0..N-1 the pass over
{t : t % N == i}; the loss is the mean of the passes' mean cross-entropies. Decoding is the pass
over one new position at a time.
"""

from __future__ import annotations

import math

import torch

GATE_CHANNELS = 32  # the released code's ve_gate_channels
SOFTCAP = 15.0


def rms(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dimension (torch's rms_norm with eps=None)."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)


def rope(x: torch.Tensor, t: int, base: float = 10000.0) -> torch.Tensor:
    """x: (heads, D). The pair (x[i], x[i + D/2]) rotated by t * base^(-2i/D)."""
    D = x.size(-1)
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    cos, sin = torch.cos(t * inv), torch.sin(t * inv)
    x1, x2 = x[:, : D // 2], x[:, D // 2 :]
    return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)


class ReleasedLRT:
    """The released forward over a dict of float64 leaf tensors in the released code's names:
    wte, lm_head, resid_lambdas, x0_lambdas, interleaved_lambdas, and per layer i
    h.{i}.c_q / c_k / c_v / c_proj / c_fc / mlp_proj / triple_gate, fb_v.{i}, fb_k.{i}, ve.{i}."""

    def __init__(
        self, params: dict, n_layer: int, n_head: int, n_kv_head: int, seq_len: int, pattern: str
    ):
        self.p, self.L, self.H, self.Hkv = params, n_layer, n_head, n_kv_head
        self.d = params["wte"].size(1)
        self.D = self.d // n_head
        long, short = seq_len, seq_len // 2
        pattern = pattern.upper()
        self.left = [short if pattern[i % len(pattern)] == "S" else long for i in range(n_layer)]
        self.left[-1] = long  # the final layer always gets the long window

    def _position(self, tok: int, t: int, h_prev, fresh, buf, in_pass: set):
        p, H, Hkv, D = self.p, self.H, self.Hkv, self.D
        x = rms(p["wte"][tok])
        x0 = x
        for i in range(self.L):
            x = p["resid_lambdas"][i] * x + p["x0_lambdas"][i] * x0
            x = x + p["interleaved_lambdas"][i] * h_prev
            n = rms(x)
            g = 2 * torch.sigmoid(p[f"h.{i}.triple_gate"] @ n[:GATE_CHANNELS])
            g_loc, g_fb, g_ve = g[:Hkv, None], g[Hkv : 2 * Hkv, None], g[2 * Hkv :, None]
            q = (p[f"h.{i}.c_q"] @ n).view(H, D)
            k = (p[f"h.{i}.c_k"] @ n).view(Hkv, D)
            v = (p[f"h.{i}.c_v"] @ n).view(Hkv, D)
            k = g_loc * k + g_fb * (p[f"fb_k.{i}"] @ h_prev).view(Hkv, D)
            v = (
                g_loc * v
                + g_fb * (p[f"fb_v.{i}"] @ h_prev).view(Hkv, D)
                + g_ve * p[f"ve.{i}"][tok].view(Hkv, D)
            )
            q, k = rms(rope(q, t)), rms(rope(k, t))
            fresh["k"][i][t], fresh["v"][i][t] = k, v
            keys, vals = [], []
            for s in range(max(0, t - self.left[i]), t + 1):  # window (N, 0): N + 1 keys
                src = fresh if s in in_pass else buf
                zero = torch.zeros(Hkv, D, dtype=torch.float64)
                keys.append(src["k"][i].get(s, zero))
                vals.append(src["v"][i].get(s, zero))
            K, V = torch.stack(keys, 1), torch.stack(vals, 1)  # (Hkv, n_keys, D)
            K = K.repeat_interleave(H // Hkv, dim=0)
            V = V.repeat_interleave(H // Hkv, dim=0)
            att = torch.softmax((K @ q[:, :, None])[..., 0] / math.sqrt(D), dim=-1)  # (H, keys)
            y = (att[:, :, None] * V).sum(1).reshape(-1)
            x = x + p[f"h.{i}.c_proj"] @ y
            x = x + p[f"h.{i}.mlp_proj"] @ torch.relu(p[f"h.{i}.c_fc"] @ rms(x)).square()
        h_final = rms(x)
        logits = SOFTCAP * torch.tanh(p["lm_head"] @ h_final / SOFTCAP)
        return logits, h_final

    def empty_buffer(self) -> dict:
        return {"k": [{} for _ in range(self.L)], "v": [{} for _ in range(self.L)], "h": {}}

    def run_pass(self, tokens, positions, buf: dict):
        """One pass over `positions` of one sequence (tokens (T,)). Returns ({t: logits}, the
        buffer after it)."""
        positions = sorted(positions)
        fresh = self.empty_buffer()
        zero = torch.zeros(self.d, dtype=torch.float64)
        out = {}
        for t in positions:
            h_prev = buf["h"].get(t - 1, zero)  # feedback as the buffer held it at the pass start
            out[t], fresh["h"][t] = self._position(
                int(tokens[t]), t, h_prev, fresh, buf, set(positions)
            )
        merged = {
            key: [{**buf[key][i], **fresh[key][i]} for i in range(self.L)] for key in ("k", "v")
        }
        merged["h"] = {**buf["h"], **fresh["h"]}
        return out, merged

    def run(self, tokens: torch.Tensor, passes, targets: torch.Tensor | None = None):
        """tokens (B, T); passes: lists of positions. Returns (final logits (B, T, V): each
        position's from the last pass that computed it, the mean over passes of each pass's mean
        cross-entropy, or None)."""
        finals, pass_losses = [], [[] for _ in passes]
        for b in range(tokens.size(0)):
            buf, final = self.empty_buffer(), {}
            for j, P in enumerate(passes):
                out, buf = self.run_pass(tokens[b], P, buf)
                final.update(out)
                if targets is not None:
                    pass_losses[j] += [
                        -torch.log_softmax(out[t], -1)[targets[b, t]] for t in sorted(P)
                    ]
            finals.append(torch.stack([final[t] for t in sorted(final)]))
        loss = None
        if targets is not None:
            loss = sum(torch.stack(ls).mean() for ls in pass_losses) / len(passes)
        return torch.stack(finals), loss


def interleaved_passes(N: int, T: int) -> list[list[int]]:
    """The released trainer's passes: one full pass, then {t : t % N == i} for i = 0..N-1."""
    return [list(range(T))] + [[t for t in range(T) if t % N == i] for i in range(N)]


def decoding_passes(T: int) -> list[list[int]]:
    """Recurrent decoding: one new position per pass."""
    return [[t] for t in range(T)]
