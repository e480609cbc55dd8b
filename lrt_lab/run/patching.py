"""Route-split memory patching: how much of the memory's effect goes through each route, with the
recurrence held fixed or left to run.

The memory a layer reads enters it by up to four routes (paper sec. 2): the residual injection
gamma_l m (sec. 2.2, route "resid") and the recurrent projections W_q,rec m, W_k,rec m, W_v,rec m
(sec. 2.1, routes "q", "k", "v"); "all" is the memory read itself (`hook_mem_in`: every route of
every layer, and, with update="gated", the part of m carried into m_t). Each route has a hook
point per layer (`blocks.{l}.hook_mem_resid`, `blocks.{l}.attn.hook_mem_k`, ...;
`lrt_lab.run.hooks`), so patching the memory read at one position t can be restricted to one
route. What the patch changes later depends on whether the recurrence carries it on:

- "fixed" (its immediate effect): only t reads the patched memory; every later position reads
  the clean run's memory (fed back through `hook_mem_in`), so the patch reaches later positions
  only through attention to t's keys and values (and what t's residual stream wrote into them);
- "free" (free-running): the exact recurrence (`Exact`) runs on: the m_t that t emits from the
  patched read is what t + lag reads, and so on, the tokens held at the clean ones;
- "generate": free-running while the decoder generates greedily from the prompt ending at t, so
  the tokens themselves may change.

    table = route_effects(model, clean_idx, corrupt_idx, position=5, offsets=(1, 10))

gives per route, mode and offset the KL between the clean and patched next-token distributions at
t + offset and the share of the "all" effect each route carries. Routes interact (the residual
route moves the gates and the keys of every layer above it), so shares need not sum to 1.
"""

from __future__ import annotations

import pandas as pd
import torch
import torch.nn.functional as F

from lrt_lab.core.memory import memory_routes
from lrt_lab.core.validation import check_int, fail, is_int
from lrt_lab.run.decode import Decoder
from lrt_lab.run.hooks import HookFn, capture, hooks
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Exact

MODES = ("fixed", "free", "generate")
METRICS = ("kl", "logit_diff")


def routes_of(model) -> tuple[str, ...]:
    """The routes `model`'s memory can be patched by: those its config has, then "all"."""
    return memory_routes(model.config) + ("all",)


def route_hook_names(model, route: str, layers=None) -> list[str]:
    """The hook points that carry `route` into the given layers (default: all): "all" is the
    model-level `hook_mem_in` (every layer reads it); a route of one projection is its
    `blocks.{l}.attn.hook_mem_{route}` per layer, the residual route `blocks.{l}.hook_mem_resid`."""
    _check_route(model, route)
    layers = _check_layers(model, layers)
    if route == "all":
        if len(layers) != model.config.n_layer:
            fail("layers", layers, 'all layers (None) for route "all" (the memory read itself)')
        return ["hook_mem_in"]
    if route == "resid":
        return [f"blocks.{l}.hook_mem_resid" for l in layers]
    return [f"blocks.{l}.attn.hook_mem_{route}" for l in layers]


def replace_at(position: int, value: torch.Tensor) -> HookFn:
    """Replace the activation's row at sequence `position` by `value` ((d,) or (B, d)); other
    rows and calls that do not compute `position` are left alone."""

    def fn(x, positions):
        if position not in positions:
            return None
        out = x.clone()
        out[:, positions.index(position)] = value.to(device=x.device, dtype=x.dtype)
        return out

    return fn


def feed_after(position: int, memory: torch.Tensor) -> HookFn:
    """Replace the rows at sequence positions after `position` by `memory[:, p]` ((B, T, d), a
    clean run's `hook_mem_in`): teacher-forcing the memory read, so a change at `position`
    reaches later positions only through attention."""

    def fn(x, positions):
        local = [i for i, p in enumerate(positions) if p > position]
        if not local:
            return None
        out = x.clone()
        rows = torch.tensor([positions[i] for i in local], device=memory.device)
        out[:, torch.tensor(local, device=x.device)] = memory[:, rows].to(x.device, x.dtype)
        return out

    return fn


def _chain(first: HookFn, then: HookFn) -> HookFn:
    """One hook function applying `first`, then `then` to its result (one hook point, two
    interventions)."""

    def fn(x, positions):
        y = first(x, positions)
        y = x if y is None else y
        z = then(y, positions)
        return y if z is None else z

    return fn


def patch_hooks(
    model, route: str, position: int, value: torch.Tensor, mode: str, clean_memory=None, layers=None
) -> dict[str, HookFn]:
    """The hook functions of one patch: `route`'s memory at `position` replaced by `value` (route
    None: none), and in mode "fixed" every later position's memory read fed from `clean_memory`
    ((B, T, d), the clean run's `hook_mem_in`)."""
    check_mode(mode)
    names = [] if route is None else route_hook_names(model, route, layers)
    fns = {name: replace_at(position, value) for name in names}
    if mode == "fixed":
        if clean_memory is None:
            fail("clean_memory", None, 'the clean run\'s hook_mem_in (B, T, d) in mode "fixed"')
        feed = feed_after(position, clean_memory)
        fns["hook_mem_in"] = _chain(fns["hook_mem_in"], feed) if "hook_mem_in" in fns else feed
    return fns


def run_patched(
    model,
    idx: torch.Tensor,
    route: str,
    position: int,
    value: torch.Tensor,
    mode: str = "free",
    clean_memory: torch.Tensor | None = None,
    layers=None,
    names=(),
):
    """(logits (B, T, V), cache) of the exact recurrence (`Exact`) on idx with `route`'s memory at
    `position` replaced by `value` ((d,) or (B, d); route None: no patch), in mode "fixed" (later
    reads fed from `clean_memory`, the clean run's hook_mem_in; see `clean_run`) or "free". cache
    holds the hook points in `names` as the patched run computed them (e.g. "hook_mem_out")."""
    if mode not in ("fixed", "free"):
        fail("mode", mode, "'fixed', 'free' (generation: generate_patched)")
    _check_position(idx, position)
    fns = patch_hooks(model, route, position, value, mode, clean_memory, layers)
    with hooks(model, fns), capture(model, names) as recorded:
        logits = run_schedule(model, idx, None, Exact()).logits
    return logits, recorded.assembled(idx.size(1))


def clean_run(model, idx: torch.Tensor, names=("hook_mem_in", "hook_mem_out")):
    """(logits, cache) of the unpatched exact recurrence: what every mode compares against, and
    the memory reads mode "fixed" feeds back."""
    with capture(model, names) as recorded:
        logits = run_schedule(model, idx, None, Exact()).logits
    return logits, recorded.assembled(idx.size(1))


def generate_patched(
    model, prompt: torch.Tensor, new_tokens: int, route=None, value=None, layers=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy free-running generation with `route`'s memory read at the prompt's last position
    t replaced by `value` (route None: no patch). The prompt is prefilled exactly (`Exact`), then
    `new_tokens` decoder steps each feed the argmax back. Returns (logits at t .. t + new_tokens:
    (B, new_tokens + 1, V), the generated tokens at t + 1 .. t + new_tokens: (B, new_tokens))."""
    check_int("new_tokens", new_tokens, 0)
    t = prompt.size(1) - 1
    fns = {} if route is None else patch_hooks(model, route, t, value, "free", layers=layers)
    decoder = Decoder(model, prompt.size(0), prompt.size(1) + new_tokens)
    with hooks(model, fns):
        logits = [decoder.prefill(prompt, Exact())]
        generated = []
        for _ in range(new_tokens):
            generated.append(logits[-1].argmax(-1))
            logits.append(decoder.step(generated[-1], check_values=False))
    tokens = torch.stack(generated, 1) if generated else prompt.new_zeros(prompt.size(0), 0)
    return torch.stack(logits, 1).clone(), tokens.clone()


# Effects ------------------------------------------------------------------------------------
def kl_divergence(clean: torch.Tensor, patched: torch.Tensor) -> torch.Tensor:
    """KL(clean || patched) of the next-token distributions, in nats, per row (..., V) -> (...):
    how much the patch moves the prediction, weighted by where the clean run puts its mass."""
    log_p, log_q = F.log_softmax(clean.double(), -1), F.log_softmax(patched.double(), -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def logit_diff(clean: torch.Tensor, patched: torch.Tensor) -> torch.Tensor:
    """||delta logits|| per row, each centred first (logits are defined up to a constant shift)."""
    delta = (patched - clean).double()
    return (delta - delta.mean(-1, keepdim=True)).norm(dim=-1)


@torch.no_grad()  # a measurement: no graph is kept across the many runs
def route_effects(
    model,
    clean_idx: torch.Tensor,
    patch,
    position: int,
    offsets=(1, 10),
    routes=None,
    modes=("fixed", "free"),
    layers=None,
    metric: str = "kl",
) -> pd.DataFrame:
    """Per route, mode and offset, the effect of patching the memory read at `position` on the
    next-token distribution at position + offset, averaged over the batch.

    patch: a corrupted token sequence like clean_idx (its exact run's memory read at `position`
    is patched in), a replacement memory ((d,) or (B, d)), or "zero" (an ablation).
    routes: of `routes_of(model)` (default: all of them). modes: of "fixed", "free", "generate"
    (the module docstring). layers: restrict the routes' hook points to these layers (default all;
    route "all" is the whole read, every layer).
    Columns: route, mode, offset, position (= position + offset), kl (nats), logit_diff,
    share (the route's `metric` over route "all"'s in the same mode and offset; NaN where
    that is 0), tokens_changed (mode "generate": the fraction of sequences whose greedy
    continuation up to the position differs from the clean one; NaN otherwise)."""
    routes = tuple(routes_of(model)) if routes is None else tuple(routes)
    for route in routes:
        _check_route(model, route)
    modes = tuple(modes)
    for mode in modes:
        check_mode(mode)
    offsets = _check_offsets(offsets)
    _check_layers(model, layers)
    if metric not in METRICS:
        fail("metric", metric, ", ".join(repr(m) for m in METRICS))
    teacher_forced = [m for m in modes if m != "generate"]
    _check_position(clean_idx, position, max(offsets) if teacher_forced else 0)
    value = replacement(model, clean_idx, patch, position)
    needed = routes if "all" in routes else routes + ("all",)  # "all" is every share's base
    rows = []
    if teacher_forced:
        clean_logits, clean_cache = clean_run(model, clean_idx)
        for mode in teacher_forced:
            for route in needed:
                logits, _ = run_patched(
                    model,
                    clean_idx,
                    route,
                    position,
                    value,
                    mode,
                    clean_cache["hook_mem_in"],
                    None if route == "all" else layers,
                )
                rows += _rows(route, mode, position, offsets, clean_logits, logits, 0)
    if "generate" in modes:
        prompt, k = clean_idx[:, : position + 1], max(offsets)
        clean_logits, clean_tokens = generate_patched(model, prompt, k)
        for route in needed:
            use_layers = None if route == "all" else layers
            logits, tokens = generate_patched(model, prompt, k, route, value, use_layers)
            changed = tokens != clean_tokens
            rows += _rows(
                route, "generate", position, offsets, clean_logits, logits, -position, changed
            )
    table = pd.DataFrame(rows)
    return _with_shares(table, metric)[lambda t: t["route"].isin(routes)].reset_index(drop=True)


def replacement(model, clean_idx: torch.Tensor, patch, position: int) -> torch.Tensor:
    """The memory to patch in at `position`, (B, d) or (d,): a corrupted run's memory read there
    (`patch` a token sequence like clean_idx), the given vector, or zeros ("zero")."""
    d = model.config.n_embd
    ref = next(model.parameters())
    if isinstance(patch, str) and patch == "zero":
        return ref.new_zeros(d)
    if isinstance(patch, torch.Tensor) and not patch.is_floating_point():
        if patch.shape != clean_idx.shape:
            fail("patch", patch, f"corrupted tokens of clean_idx's shape {tuple(clean_idx.shape)}")
        _, cache = clean_run(model, patch, ("hook_mem_in",))
        return cache["hook_mem_in"][:, position]
    B = clean_idx.size(0)
    if isinstance(patch, torch.Tensor) and patch.shape in ((d,), (B, d)):
        return patch
    fail("patch", patch, f'corrupted token ids (B, T), a memory (d={d},) or (B={B}, d), or "zero"')


def _rows(route, mode, position, offsets, clean, patched, shift, changed=None) -> list[dict]:
    """One table row per offset: the effects at position + offset (logits indexed from `shift`
    + position: 0 for a whole sequence's logits, -position for logits that start at it)."""
    rows = []
    for o in offsets:
        i = position + o + shift
        rows.append(
            {
                "route": route,
                "mode": mode,
                "offset": o,
                "position": position + o,
                "kl": kl_divergence(clean[:, i], patched[:, i]).mean().item(),
                "logit_diff": logit_diff(clean[:, i], patched[:, i]).mean().item(),
                "tokens_changed": float("nan")
                if changed is None
                else changed[:, :o].any(1).double().mean().item(),
            }
        )
    return rows


def _with_shares(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """table with `share`: each row's metric over route "all"'s in its mode and offset."""
    base = table[table["route"] == "all"].set_index(["mode", "offset"])[metric]
    whole = table.join(base.rename("_all"), on=["mode", "offset"])
    share = whole[metric] / whole["_all"].where(whole["_all"] > 0)
    columns = ["route", "mode", "offset", "position", "kl", "logit_diff", "share"]
    return whole.assign(share=share)[columns + ["tokens_changed"]]


# Checks ---------------------------------------------------------------------------------------
def check_mode(mode) -> None:
    if mode not in MODES:
        fail("mode", mode, ", ".join(repr(m) for m in MODES))


def _check_route(model, route) -> None:
    if model.pathway is None:
        fail("model", type(model).__name__, "a model with a memory pathway (config.memory set)")
    allowed = routes_of(model)
    if route not in allowed:
        fail("route", route, ", ".join(repr(r) for r in allowed))


def _check_layers(model, layers) -> list[int]:
    L = model.config.n_layer
    if layers is None:
        return list(range(L))
    layers = [layers] if is_int(layers) else list(layers)
    if not layers or not all(is_int(l) and 0 <= l < L for l in layers):
        fail("layers", layers, f"None (all) or layer indices in [0, {L - 1}]")
    return layers


def _check_offsets(offsets) -> tuple[int, ...]:
    offsets = (offsets,) if is_int(offsets) else tuple(offsets)
    if not offsets or not all(is_int(o) and o >= 0 for o in offsets):
        fail("offsets", offsets, "non-negative integers (0: the patched position itself)")
    return offsets


def _check_position(idx: torch.Tensor, position, reach: int = 0) -> None:
    """position must be a position of idx with position + reach one as well."""
    last = idx.size(1) - 1 - reach
    if not (is_int(position) and 0 <= position <= last):
        fail("position", position, f"an integer in [0, {last}] (T={idx.size(1)}, offsets {reach})")
