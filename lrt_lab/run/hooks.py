"""Hook points: every activation a probe or an intervention needs, by one stable name.

A `HookPoint` (`lrt_lab.core.hook_points`) is an identity module placed where an activation is
formed; its name is its module
path, in TransformerLens's convention: `hook_embed`, `hook_mem_in` (the memory m_{t-lag} each
position reads), `blocks.{l}.hook_mem_in` (the same quantity as layer l reads it; patching it
changes every route of layer l), the memory as each route into layer l reads it, each (B, |P|, d)
and patched for that route alone: `blocks.{l}.hook_mem_resid` (the residual injection gamma_l m),
`blocks.{l}.attn.hook_mem_k` / `hook_mem_v` / `hook_mem_q` (the recurrent projections W_k,rec m,
W_v,rec m, W_q,rec m, re-formed from the patched m for that projection only), each present only
where the config has the route (`lrt_lab.core.memory.memory_routes`; route-split patching:
`lrt_lab.run.patching`),
`blocks.{l}.hook_resid_pre` (the block's input), `blocks.{l}.hook_resid_injected` (alpha x + beta x0
+ gamma m: the stream with the memory injected, what attention's norm reads),
`blocks.{l}.attn.hook_q` / `hook_k` / `hook_v` (with the memory injected, before QK-norm and RoPE),
`blocks.{l}.attn.hook_rot_q` / `hook_rot_k` (after them: what attention sees),
`blocks.{l}.attn.hook_attn_scores` / `hook_pattern` (B, heads, q, k; attention is written out only
while one of them is hooked), `blocks.{l}.attn.hook_z` (the heads' outputs before c_proj),
`blocks.{l}.attn.hook_gate_local` / `hook_gate_rec` (the gates 2*sigmoid(W_g x), per KV head),
`blocks.{l}.hook_attn_out`, `blocks.{l}.hook_mlp_out`, `blocks.{l}.hook_resid_post`, `hook_mem_out`
(the m_t a position emits). `run_with_cache(model, idx, schedule)` (lrt_lab.run.runner) returns
(logits, cache) as
TransformerLens's `model.run_with_cache` does.
The memory pathway declares the hook points of its own values (`pathway.hook_source`, the source
activation before any update; `pathway.hook_update_gate`, z of update="gated"; lrt_lab.core.memory),
so
a new mechanism's internal values are hookable without touching the backbone.

Because hook points are modules called by every stage, one mechanism serves every training
schedule, prefill schedule and decoding step. Each call passes the stage's positions as the keyword
`positions` (a range), so a hook knows which sequence positions its rows are:

    with hooks(model, {"hook_mem_in": zero_at(range(5, 9))}):   # ablate the memory read at 5..8
        out = run_schedule(model, idx, targets, Exact())

A hook function is `fn(activation, positions) -> replacement or None` (None keeps the value), or
in TransformerLens's form `fn(activation, hook)` (its second parameter named `hook`): `hook.name`
is the hook point's name and `hook.positions` the stage's positions.
A pass whose rows are not the model's output (PonderLM's init pass over the tokens alone) calls
its hook points with `positions=None`; `hooks` and `capture` skip those calls.

Activations are position-major (B, |P|, ...), except the attention scores and pattern, which keep
TransformerLens's layout (B, heads, queries, keys): a stage's queries against the keys 0..P[-1].
`capture` and `run_with_cache` assemble them to (B, heads, T, T).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.nn as nn

from lrt_lab.core.hook_points import Hook, HookPoint, hook_points
from lrt_lab.core.positions import assemble

HookFn = Callable[[torch.Tensor, range], "torch.Tensor | None"]
# hook points whose activations are (B, heads, queries, keys): positions on dim 2, keys on dim 3
ATTENTION_MAPS = ("hook_attn_scores", "hook_pattern")


def takes_hook(fn) -> bool:
    """Whether fn is written in TransformerLens's form fn(activation, hook)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: the positions form
        return False
    return len(params) >= 2 and params[1] == "hook"


def _resolve(model: nn.Module, names) -> dict[str, HookPoint]:
    points = hook_points(model)
    unknown = [n for n in names if n not in points]
    if unknown:
        raise ValueError(f"hook names {unknown} are invalid; allowed: {', '.join(points)}")
    return {n: points[n] for n in names}


@contextmanager
def hooks(model: nn.Module, fns: dict[str, HookFn]):
    """Run `fns[name](activation, positions)` (or `fn(activation, hook)`, TransformerLens's form)
    at each named hook point while the block runs."""
    if not isinstance(fns, dict) or not all(callable(f) for f in fns.values()):
        raise ValueError(
            "hooks is invalid; allowed: a dict {hook name: fn(activation, positions) "
            "or fn(activation, hook)}"
        )
    points = _resolve(model, list(fns))
    handles = []
    try:
        for name, fn in fns.items():
            # the defaults bind this iteration's fn and name (and its form, decided once)
            def call(module, args, kwargs, output, fn=fn, name=name, tl_form=takes_hook(fn)):  # noqa: B008
                positions = kwargs["positions"]
                if positions is None:
                    return None
                return fn(output, Hook(name, positions)) if tl_form else fn(output, positions)

            handles.append(points[name].register_forward_hook(call, with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


class Capture:
    """What `capture` records: per hook name, the (positions, activation) of every call in order."""

    def __init__(self):
        self.calls: dict[str, list[tuple[range, torch.Tensor]]] = {}

    def record(self, name: str) -> HookFn:
        def fn(x, positions):
            # recorded while decoding: a normal tensor, so probes can train on it
            if x.is_inference():
                with torch.inference_mode(False):
                    x = x.clone()
            self.calls.setdefault(name, []).append((positions, x))

        return fn

    def assembled(self, T: int) -> dict[str, torch.Tensor]:
        """(B, T, ...) per name, each position taken from the last call that computed it (as a
        schedule's final logits are); longer where the calls' positions are rows beyond T
        (PonderLM's blocks run over (N+1) rows per token). Attention scores and patterns come out
        (B, heads, T, T), keys a stage did not see filled as masked (-inf scores, 0 weight)."""
        out = {}
        for name, parts in self.calls.items():
            n = max(T, max(P.stop for P, _ in parts))
            if name.rsplit(".", 1)[-1] in ATTENTION_MAPS:
                fill = float("-inf") if name.endswith("hook_attn_scores") else 0.0
                parts = [(P, _keys_padded(x, n, fill).transpose(1, 2)) for P, x in parts]
                out[name] = assemble(parts, n).transpose(1, 2)
            else:
                out[name] = assemble(parts, n)
        return out

    def per_stage(self, T: int) -> dict[str, torch.Tensor]:
        """{"stage.<k>.<name>": (B, T, ...)}: what the k-th call of each hook point computed (the
        k-th stage of a schedule: every hook point runs once per stage), NaN at the positions that
        stage did not compute. Attention maps are left out (their key axis differs per stage)."""
        out = {}
        for name, parts in self.calls.items():
            if name.rsplit(".", 1)[-1] in ATTENTION_MAPS:
                continue
            for k, (P, x) in enumerate(parts):
                n = max(T, P.stop)
                full = x.new_full((x.size(0), n, *x.shape[2:]), float("nan"))
                full[:, P.start : P.stop : P.step] = x
                out[f"stage.{k}.{name}"] = full
        return out


def _keys_padded(x: torch.Tensor, n_keys: int, fill: float) -> torch.Tensor:
    """(B, H, q, k) padded with `fill` to n_keys keys (a stage sees the keys up to its last
    query)."""
    return torch.nn.functional.pad(x, (0, n_keys - x.size(-1)), value=fill)


@contextmanager
def capture(model: nn.Module, names=None):
    """Record the named hook points (default: all) while the block runs; yields a `Capture`."""
    names = list(hook_points(model)) if names is None else list(names)
    cap = Capture()
    with hooks(model, {n: cap.record(n) for n in names}):
        yield cap


# Interventions ---------------------------------------------------------------------------------
def _rows_at(positions: range, selected) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(local row indices, sequence positions) of the stage rows whose position is selected."""
    chosen = set(selected)
    pairs = [(i, p) for i, p in enumerate(positions) if p in chosen]
    if not pairs:
        return None
    local, pos = zip(*pairs)
    return torch.tensor(local), torch.tensor(pos)


def zero_at(selected) -> HookFn:
    """Zero the activation at the given sequence positions (e.g. a memory ablation over a span)."""
    selected = list(selected)

    def fn(x, positions):
        rows = _rows_at(positions, selected)
        if rows is None:
            return None
        keep = torch.ones(x.size(1), dtype=x.dtype, device=x.device)
        keep[rows[0].to(x.device)] = 0
        return x * keep.view(1, -1, *([1] * (x.dim() - 2)))

    return fn


def patch_from(source: torch.Tensor, selected=None) -> HookFn:
    """Replace the activation at the selected positions (default: all) by `source[:, position]`,
    e.g. a (B, T, ...) tensor captured from another run (activation patching)."""

    def fn(x, positions):
        rows = _rows_at(positions, selected if selected is not None else positions)
        if rows is None:
            return None
        local, pos = rows[0].to(x.device), rows[1].to(source.device)
        out = x.clone()
        out[:, local] = source[:, pos].to(device=x.device, dtype=x.dtype)
        return out

    return fn
