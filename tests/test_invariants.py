"""The core's invariants, generated from MemoryConfig's declared option space (not a hand list).

Every categorical field declares its choices and every integer field its minimum in the dataclass
field metadata (lrt_lab/config.py); `config_space()` reads them, so a field added to MemoryConfig is
enumerated here without editing this file. `pairwise_configs()` is a covering set: every pair of
values of any two options (source layer and lag included) occurs in some configuration. On each, in
float64 on a tiny model with every weight random:

- Exact == Chunked(1) == Chunked(lag) == Interleaved(T) == FullSequence(T) == token-by-token
  decoding (1e-10), at B*T > 64;
- the same logits with autograd on and off, and with hook points captured, replaced by themselves,
  or untouched;
- Rollout(G) (G = 1..3) gives Exact's logits, with autograd on and off and under hooks, and its
  loss and every gradient equal FixedPoint(0, T+G, G)'s (the same truncated gradient reached by
  Jacobi sweeps instead of a rollout);
- the memory rows a keep_memory decoder produced, given to one differentiated full stage, give the
  decoder's logits (cached rollout states, the paper's SFT/RL recipe);
- Exact and Interleaved(2) equal the independent per-position reference (tests/reference.py);
- every memory parameter receives gradient.
A hypothesis test draws further random combinations.
"""

import dataclasses
import itertools
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lrt_lab import MemoryConfig, preset
from lrt_lab.hooks import hook_points, hooks
from lrt_lab.decode import Decoder
from lrt_lab.schedules import Chunked, Exact, FixedPoint, FullSequence, Interleaved, Rollout, run_schedule
from reference import NaiveLRT
from test_core import decode_all, make_model, maxdiff, tokens

N_LAYER, T, B, TOL = 3, 10, 7, 1e-10   # B * T = 70 > 64
# fields enumerated by hand: the source layer's range depends on the depth; a float init is not
# an option of the math (the weights are random here)
NOT_ENUMERATED = {"source_layer": tuple(range(1, N_LAYER + 1)), "gamma_init": None}


def config_space() -> dict[str, tuple]:
    """{field: values to try}: declared choices, integers from their minimum to minimum + 1."""
    space = {}
    for f in dataclasses.fields(MemoryConfig):
        if "choices" in f.metadata:
            space[f.name] = tuple(f.metadata["choices"])
        elif "min" in f.metadata:
            space[f.name] = (f.metadata["min"], f.metadata["min"] + 1)
        elif f.name in NOT_ENUMERATED:
            if NOT_ENUMERATED[f.name] is not None:
                space[f.name] = NOT_ENUMERATED[f.name]
        else:
            raise AssertionError(f"MemoryConfig.{f.name} declares neither choices nor min in its metadata: "
                                 "declare its values so the invariant tests cover it")
    return space


def make_config(values: dict) -> MemoryConfig | None:
    """The MemoryConfig for `values`, or None for combinations the config rightly rejects."""
    try:
        cfg = MemoryConfig(**values)
        preset("tiny", memory=cfg, n_layer=N_LAYER, bos_token_id=0)
    except ValueError:
        return None
    return cfg


def pairwise_configs(seed: int = 0) -> list[MemoryConfig]:
    """A covering set (greedy, AETG-style): every value pair of every two fields appears."""
    space = config_space()
    names = list(space)
    uncovered = {(a, va, b, vb) for a, b in itertools.combinations(names, 2)
                 for va in space[a] for vb in space[b]}
    rng = random.Random(seed)
    rows = []

    def gain(row):
        return sum((a, row[a], b, row[b]) in uncovered for a, b in itertools.combinations(names, 2))

    stalls = 0
    while uncovered and stalls < 200:
        a, va, b, vb = sorted(uncovered, key=repr)[rng.randrange(len(uncovered))]
        candidates = []
        for _ in range(60):
            row = {n: rng.choice(space[n]) for n in names}
            row[a], row[b] = va, vb
            if make_config(row) is not None:
                candidates.append(row)
        if not candidates:  # an impossible pair (e.g. source_avg 2 at source_layer 1)
            uncovered.discard((a, va, b, vb))
            stalls += 1
            continue
        best = max(candidates, key=gain)
        uncovered -= {(x, best[x], y, best[y]) for x, y in itertools.combinations(names, 2)}
        rows.append(best)
    return [make_config(r) for r in rows]


CONFIGS = pairwise_configs()


def check_invariants(memory: MemoryConfig):
    model = make_model(memory, n_layer=N_LAYER)
    idx = tokens(B=B)
    with torch.no_grad():
        exact = run_schedule(model, idx, None, Exact()).logits
        for sched in (Chunked(1), Chunked(memory.lag), Interleaved(T), FullSequence(T)):
            assert maxdiff(run_schedule(model, idx, None, sched).logits, exact) <= TOL, sched
        assert maxdiff(decode_all(model, idx), exact) <= TOL, "decoder"
        # hook points: captured, or replaced by an equal tensor everywhere, change nothing
        cache = {}
        assert maxdiff(run_schedule(model, idx, None, Exact(), cache=cache).logits, exact) <= TOL
        assert set(cache) == set(hook_points(model))
        with hooks(model, {name: (lambda x, P: x.clone()) for name in hook_points(model)}):
            assert maxdiff(run_schedule(model, idx, None, Exact()).logits, exact) <= TOL
            assert maxdiff(decode_all(model, idx), exact) <= TOL
        no_grad = run_schedule(model, idx, None, Interleaved(2)).logits
        assert maxdiff(run_schedule(model, idx, None, Rollout()).logits, exact) <= TOL, "rollout"
        with hooks(model, {name: (lambda x, P: x.clone()) for name in hook_points(model)}):
            assert maxdiff(run_schedule(model, idx, None, Rollout(2)).logits, exact) <= TOL, "rollout, hooked"
    check_rollout_gradients(model, idx, exact)
    check_decoded_memory_rows(model, idx)
    # autograd on: the same logits, and every memory parameter gets gradient
    targets = tokens(B=B, seed=5)
    out = run_schedule(model, idx, targets, Interleaved(2))
    assert maxdiff(out.logits, no_grad) <= TOL
    out.loss.backward()
    if cache["hook_mem_out"].abs().max() == 0:
        # the one configuration whose memory is identically zero: the source is block 1's attention
        # output, whose values are replaced by W_v,rec m (= 0 from the zero initial memory)
        assert memory.source_tap == "attn_out" and memory.kv_mode == "replace" and \
            memory.kv in ("both", "values") and memory.source_layer == 1, memory
        return
    for name, p in model.memory.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    # the independent per-position reference, for the exact recurrence and a parallel schedule
    one = tokens(B=1, T=6)
    naive = NaiveLRT(model)
    with torch.no_grad():
        ref_exact, _ = naive.run(one, [[t] for t in range(6)])
        assert maxdiff(run_schedule(model, one, None, Exact()).logits, ref_exact) <= TOL
        ref_inter, _ = naive.run(one, [list(P) for P in Interleaved(2).stages(6)])
        assert maxdiff(run_schedule(model, one, None, Interleaved(2)).logits, ref_inter) <= TOL


def grads(model, loss):
    params = list(model.parameters())
    return [torch.zeros_like(p) if g is None else g
            for p, g in zip(params, torch.autograd.grad(loss, params, allow_unused=True))]


def check_rollout_gradients(model, idx, exact):
    """Rollout(G) == FixedPoint(0, T+G, G) in loss and gradients; its logits are Exact's."""
    targets = tokens(B=B, seed=7)
    for G in (1, 2, 3):
        out = run_schedule(model, idx, targets, Rollout(G))
        ref = run_schedule(model, idx, targets, FixedPoint(0.0, T + G, G))
        assert maxdiff(out.logits, exact) <= TOL, ("rollout logits", G)
        assert abs(out.loss.item() - ref.loss.item()) <= TOL, ("rollout loss", G)
        for g_out, g_ref in zip(grads(model, out.loss), grads(model, ref.loss)):
            assert maxdiff(g_out, g_ref) <= TOL, ("rollout gradient", G)


def check_decoded_memory_rows(model, idx):
    """Decode token by token keeping the memory rows; one differentiated full stage from them
    reproduces every step's logits."""
    decoder = Decoder(model, idx.size(0), idx.size(1), keep_memory=True)
    steps = torch.stack([decoder.step(idx[:, t]) for t in range(idx.size(1))], dim=1)
    rows = decoder.memory_rows()
    assert rows.shape == (idx.size(0), idx.size(1), model.config.n_embd)
    out = run_schedule(model, idx, tokens(B=B, seed=7), FullSequence(0), memory=rows)
    assert maxdiff(out.logits, steps) <= TOL, "full stage from decoded memory rows"
    out.loss.backward()  # the rows are normal tensors: autograd can save them
    model.zero_grad()


def test_the_covering_set_covers_every_option_value():
    space = config_space()
    for name, values in space.items():
        seen = {getattr(c, name) for c in CONFIGS}
        assert seen == set(values), name
    assert len(CONFIGS) < 40  # pairwise, not the full product


@pytest.mark.parametrize("memory", CONFIGS, ids=lambda c: ",".join(
    f"{f.name}={getattr(c, f.name)}" for f in dataclasses.fields(c) if getattr(c, f.name) != f.default))
def test_invariants_hold_across_the_config_space(memory):
    check_invariants(memory)


@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.fixed_dictionaries({name: st.sampled_from(values) for name, values in config_space().items()}))
def test_invariants_hold_for_random_combinations(values):
    memory = make_config(values)
    if memory is not None:
        check_invariants(memory)
