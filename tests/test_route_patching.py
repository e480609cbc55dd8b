"""Route-split memory patching (lrt_lab.run.patching): each route's hook point changes that route
alone, and the "fixed", "free" and "generate" modes agree with position-by-position loops that
patch by hand (weights zeroed in a model copy, memory rows overwritten in the buffer), in float64.
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import make_model, maxdiff, tokens

from lrt_lab import MemoryConfig, hook_points
from lrt_lab.run.patching import (
    clean_run,
    generate_patched,
    route_effects,
    run_patched,
)
from lrt_lab.run.runner import run_schedule, run_with_cache
from lrt_lab.run.schedules import Exact

TOL = 1e-10
T, AT = 12, 3  # sequence length, the patched position


def naive(model, idx, before=None, model_at=None, feed=None):
    """Exact by hand: one full-stack stage per position from the model's empty buffer.
    before(p, buffer) -> buffer edits the buffer ahead of position p's stage; model_at(p) picks
    the model that runs it; feed(p, logits) -> token id (B,) replaces idx[:, p + 1] (greedy
    generation). Returns (logits (B, T, V), the memory rows m_t (B, T, d), the tokens)."""
    idx = idx.clone()
    buffer, logits = model.empty_buffer(idx), []
    with torch.no_grad():
        for p in range(idx.size(1)):
            if before is not None:
                buffer = before(p, buffer)
            stage_model = model if model_at is None else model_at(p)
            out, buffer = stage_model.stage(idx[:, p : p + 1], range(p, p + 1), buffer)
            logits.append(out[:, 0])
            if feed is not None and p + 1 < idx.size(1):
                idx[:, p + 1] = feed(p, out[:, 0])
    return torch.stack(logits, 1), buffer.mem, idx


def at(position, patched_model, model):
    """model_at for `naive`: the patched model at `position` only."""
    return lambda p: patched_model if p == position else model


def feed_clean_memory(position, clean_mem):
    """before for `naive`: every position after `position` reads the clean run's memory rows
    (mode "fixed" by hand: the buffer's rows overwritten, no hook involved)."""
    return lambda p, buf: buf.with_memory_rows(clean_mem) if p > position else buf


def zeroed_route(model, route, layers=None):
    """A copy of model whose weights make `route` read zero memory in the given layers: gamma_l
    for the residual route, the projection's weight (shared, or layer l's) for q, k, v."""
    patched = copy.deepcopy(model)
    pathway = patched.pathway
    L = model.config.n_layer
    layers = range(L) if layers is None else layers
    with torch.no_grad():
        if route == "resid":
            for l in layers:
                pathway.gamma[l] = 0.0
        else:
            projs = getattr(pathway, f"{route}_rec")
            for l in layers if len(projs) > 1 else [0]:
                projs[l].weight.zero_()
    return patched


class ConstantProjection(nn.Module):
    """W r for every input row: a projection that reads `r` (B, d) instead of the memory."""

    def __init__(self, linear: nn.Linear, r: torch.Tensor):
        super().__init__()
        self.weight, self.r = linear.weight, r

    def forward(self, m):
        return F.linear(self.r, self.weight)[:, None].expand(*m.shape[:-1], -1)


# (a), (b): no patch, and a patch with the clean value, change nothing ---------------------------
def test_without_a_patch_every_mode_reproduces_the_clean_logits():
    model = make_model(MemoryConfig(source_layer=2))
    idx = tokens(B=2, T=T)
    clean, cache = clean_run(model, idx)
    fixed, _ = run_patched(model, idx, None, AT, None, "fixed", cache["hook_mem_in"])
    free, _ = run_patched(model, idx, None, AT, None, "free")
    assert torch.equal(fixed, clean) and torch.equal(free, clean)
    by_hand, _, _ = naive(model, idx)
    assert maxdiff(clean, by_hand) <= TOL  # the clean run is the exact recurrence
    # generation: greedy from the prompt ending at AT, against Exact over what it generated
    logits, generated = generate_patched(model, idx[:, : AT + 1], 5)
    sequence = torch.cat([idx[:, : AT + 1], generated], 1)
    exact = run_schedule(model, sequence, None, Exact()).logits
    assert maxdiff(logits, exact[:, AT:]) <= TOL
    assert torch.equal(generated, exact[:, AT:-1].argmax(-1))


@pytest.mark.parametrize("route", ["resid", "q", "k", "v", "all"])
def test_patching_a_route_with_its_clean_value_changes_nothing(route):
    model = make_model(MemoryConfig(source_layer=2, queries=True))
    idx = tokens(B=2, T=T)
    clean, cache = clean_run(model, idx)
    value = cache["hook_mem_in"][:, AT]
    for mode in ("fixed", "free"):
        out, _ = run_patched(model, idx, route, AT, value, mode, cache["hook_mem_in"])
        assert maxdiff(out, clean) <= 1e-12, mode
    clean_gen, clean_tokens = generate_patched(model, idx[:, : AT + 1], 4)
    gen, gen_tokens = generate_patched(model, idx[:, : AT + 1], 4, route, value)
    assert maxdiff(gen, clean_gen) <= 1e-12 and torch.equal(gen_tokens, clean_tokens)
    # while another value does change the output from AT on, and only from AT on
    other, _ = run_patched(model, idx, route, AT, torch.ones_like(value), "free")
    assert maxdiff(other[:, :AT], clean[:, :AT]) <= 1e-12 and maxdiff(other, clean) > 1e-3


# (c): zeroing one route is zeroing its weights at that position ----------------------------------
@pytest.mark.parametrize(
    "memory, route, layers",
    [
        (MemoryConfig(source_layer=2), "k", None),
        (MemoryConfig(source_layer=2), "v", None),
        (MemoryConfig(source_layer=2), "resid", None),
        (MemoryConfig(source_layer=2, queries=True), "q", None),
        (MemoryConfig(source_layer=2, projections="layerwise"), "k", [1]),
        (MemoryConfig(source_layer=1, kv_mode="replace", projections="layerwise"), "k", [0, 2]),
    ],
)
def test_zeroing_a_route_equals_a_copy_with_its_weights_zeroed_at_that_position(
    memory, route, layers
):
    """The hook patch at AT against a by-hand loop whose stage AT runs a copy with the route's
    weights zeroed (gamma_l, W_rec or layer l's W_rec): free-running, and fixed (later positions
    read the clean memory rows, written into the buffer by hand)."""
    model = make_model(memory)
    idx = tokens(B=2, T=T)
    zero = torch.zeros(model.config.n_embd, dtype=torch.float64)
    copy_at = at(AT, zeroed_route(model, route, layers), model)
    _, clean_mem, _ = naive(model, idx)
    free, _ = run_patched(model, idx, route, AT, zero, "free", layers=layers)
    by_hand, _, _ = naive(model, idx, model_at=copy_at)
    assert maxdiff(free, by_hand) <= TOL
    _, cache = clean_run(model, idx)
    fixed, _ = run_patched(model, idx, route, AT, zero, "fixed", cache["hook_mem_in"], layers)
    fixed_by_hand, _, _ = naive(
        model, idx, before=feed_clean_memory(AT, clean_mem), model_at=copy_at
    )
    assert maxdiff(fixed, fixed_by_hand) <= TOL
    assert maxdiff(free[:, AT + 2 :], fixed[:, AT + 2 :]) > 1e-3  # the modes do differ


def test_a_route_patch_leaves_the_other_routes_reading_the_clean_memory():
    """Patching the key route alone gives what zeroing W_k,rec alone does, not what zeroing the
    whole memory read does (which moves the residual and value routes as well)."""
    model = make_model(MemoryConfig(source_layer=2))
    idx = tokens(B=2, T=T)
    zero = torch.zeros(model.config.n_embd, dtype=torch.float64)
    keys, _ = run_patched(model, idx, "k", AT, zero, "free")
    every, _ = run_patched(model, idx, "all", AT, zero, "free")
    assert maxdiff(keys[:, AT:], every[:, AT:]) > 1e-3


# (d): what each mode lets the patch reach ---------------------------------------------------------
def test_fixed_and_free_agree_until_the_recurrence_reads_the_patch():
    """With lag 2, positions AT and AT + 1 read memory the patch at AT cannot have reached
    (m_{AT-2}, m_{AT-1}): fixed equals free there, and they part at AT + 2, which reads m_AT.
    Fixed feeds every later position the clean memory; free reads the m_AT the patch changed."""
    model = make_model(MemoryConfig(source_layer=2, lag=2))
    idx, corrupt = tokens(B=2, T=T), tokens(B=2, T=T, seed=9)
    clean, cache = clean_run(model, idx)
    _, corrupt_cache = clean_run(model, corrupt)
    value = corrupt_cache["hook_mem_in"][:, AT]
    names = ("hook_mem_in", "hook_mem_out")
    fixed, fixed_cache = run_patched(
        model, idx, "k", AT, value, "fixed", cache["hook_mem_in"], names=names
    )
    free, free_cache = run_patched(model, idx, "k", AT, value, "free", names=names)
    assert maxdiff(fixed[:, : AT + 2], free[:, : AT + 2]) <= 1e-12
    assert maxdiff(fixed[:, AT + 2], free[:, AT + 2]) > 1e-3
    # fixed: every read after AT is the clean one, though m_AT (emitted, read by no one) moved
    assert torch.equal(fixed_cache["hook_mem_in"][:, AT + 1 :], cache["hook_mem_in"][:, AT + 1 :])
    assert maxdiff(fixed_cache["hook_mem_out"][:, AT], cache["hook_mem_out"][:, AT]) > 1e-3
    # free: AT + 2 reads the m_AT the patch changed
    read = free_cache["hook_mem_in"][:, AT + 2]
    assert maxdiff(read, free_cache["hook_mem_out"][:, AT]) <= 1e-12
    assert maxdiff(read, cache["hook_mem_in"][:, AT + 2]) > 1e-3
    assert maxdiff(fixed[:, :AT], clean[:, :AT]) <= 1e-12


# (e): free-running against a position-by-position loop -------------------------------------------
def test_free_running_and_generation_equal_a_by_hand_loop_with_the_memory_replaced():
    """A replacement vector r: route "all" by overwriting the buffer's memory row AT - 1 before
    stage AT (no hook), route "v" by a copy whose W_v,rec reads r; in the free mode and in greedy
    generation (the loop feeding back its own argmax after AT)."""
    model = make_model(MemoryConfig(source_layer=2))
    idx = tokens(B=2, T=T)
    r = torch.randn(2, model.config.n_embd, generator=torch.Generator().manual_seed(3))
    r = r.double()

    def overwrite_row(p, buf):
        if p != AT:
            return buf
        mem = buf.mem.clone()
        mem[:, AT - 1] = r
        return buf.with_memory_rows(mem)

    v_copy = copy.deepcopy(model)
    v_copy.pathway.v_rec[0] = ConstantProjection(model.pathway.v_rec[0], r)
    for route, kwargs in (
        ("all", {"before": overwrite_row}),
        ("v", {"model_at": at(AT, v_copy, model)}),
    ):
        free, _ = run_patched(model, idx, route, AT, r, "free")
        by_hand, _, _ = naive(model, idx, **kwargs)
        assert maxdiff(free, by_hand) <= TOL, route
        gen, gen_tokens = generate_patched(model, idx[:, : AT + 1], T - AT - 1, route, r)
        greedy = lambda p, logits: logits.argmax(-1) if p >= AT else idx[:, p + 1]
        gen_by_hand, _, seq = naive(model, idx, feed=greedy, **kwargs)
        assert maxdiff(gen, gen_by_hand[:, AT:]) <= TOL, route
        assert torch.equal(gen_tokens, seq[:, AT + 1 :]), route


# route_effects --------------------------------------------------------------------------------
def test_route_effects_tabulates_each_route_against_the_whole_read():
    model = make_model(MemoryConfig(source_layer=2))
    idx, corrupt = tokens(B=2, T=T), tokens(B=2, T=T, seed=9)
    table = route_effects(
        model, idx, corrupt, AT, offsets=(1, 5), modes=("fixed", "free", "generate")
    )
    assert len(table) == 4 * 3 * 2
    assert set(table["route"]) == {"resid", "k", "v", "all"}
    # one row recomputed: the KL at AT + 5 of the free-running key patch, from the logits
    clean, _ = clean_run(model, idx)
    _, corrupt_cache = clean_run(model, corrupt)
    free, _ = run_patched(model, idx, "k", AT, corrupt_cache["hook_mem_in"][:, AT], "free")
    p, q = clean[:, AT + 5].softmax(-1), free[:, AT + 5].softmax(-1)
    kl = (p * (p.log() - q.log())).sum(-1).mean().item()
    row = table.query("route == 'k' and mode == 'free' and offset == 5").iloc[0]
    assert row["kl"] == pytest.approx(kl, rel=1e-9) and row["position"] == AT + 5
    whole = table.query("route == 'all' and mode == 'free' and offset == 5").iloc[0]
    assert row["share"] == pytest.approx(kl / whole["kl"], rel=1e-9)
    assert (table.query("route == 'all'")["share"] == 1).all()
    assert table.query("mode != 'generate'")["tokens_changed"].isna().all()
    # a patch that equals the clean read has no effect anywhere
    clean_read = clean_run(model, idx)[1]["hook_mem_in"][:, AT]
    none = route_effects(model, idx, clean_read, AT, offsets=(0, 4))
    assert (none["kl"].abs() <= 1e-12).all() and none["share"].isna().all()


# hook points per route -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "memory, present",
    [
        (MemoryConfig(), {"hook_mem_resid", "attn.hook_mem_k", "attn.hook_mem_v"}),
        (MemoryConfig(residual=False, kv="keys"), {"attn.hook_mem_k"}),
        (MemoryConfig(kv="none"), {"hook_mem_resid"}),
        (
            MemoryConfig(queries=True, kv="values"),
            {"hook_mem_resid", "attn.hook_mem_q", "attn.hook_mem_v"},
        ),
    ],
)
def test_route_hook_points_exist_exactly_where_their_route_does(memory, present):
    model = make_model(memory)
    every = {"hook_mem_resid", "attn.hook_mem_q", "attn.hook_mem_k", "attn.hook_mem_v"}
    for l in range(model.config.n_layer):
        names = set(hook_points(model))
        assert {p for p in every if f"blocks.{l}.{p}" in names} == present
    _, cache = run_with_cache(model, tokens(B=1, T=6), Exact())
    for name in (f"blocks.{l}.{p}" for l in range(model.config.n_layer) for p in present):
        assert torch.equal(cache[name], cache["hook_mem_in"]), name
    assert not any("hook_mem_" in n for n in hook_points(make_model(None)))


def test_bad_arguments_are_rejected_naming_the_allowed_values():
    model = make_model(MemoryConfig(kv="keys"))
    idx = tokens(B=1, T=8)
    cases = [
        (dict(routes=("k", "v")), "route='v' is invalid; allowed: 'resid', 'k', 'all'"),
        (dict(position=8), "position=8 is invalid; allowed: an integer in [0, 6]"),
        (dict(position=-1), "position=-1 is invalid"),
        (dict(modes=("frozen",)), "mode='frozen' is invalid; allowed: 'fixed', 'free', 'generate'"),
        (dict(offsets=(-1,)), "offsets=(-1,) is invalid"),
        (dict(layers=[3]), "layers=[3] is invalid"),
        (dict(patch=torch.zeros(5)), "patch=tensor"),
    ]
    for kwargs, message in cases:
        args = dict(patch="zero", position=2, offsets=(1,)) | kwargs
        with pytest.raises(ValueError) as err:
            route_effects(model, idx, **args)
        assert message in str(err.value) and "\n" not in str(err.value), kwargs
    with pytest.raises(ValueError, match="model='LRT' is invalid"):
        route_effects(make_model(None), idx, "zero", 2)
