"""The core's invariants, generated from MemoryConfig's declared option space (not a hand list).

Every categorical field declares its choices and every integer field its minimum in the dataclass
field metadata (lrt_lab/core/config.py); `config_space()` reads them, so a field added to
MemoryConfig is
enumerated here without editing this file. `pairwise_configs()` is a covering set: every pair of
values of any two options (source layer and lag included) occurs in some configuration. On each, in
float64 on a tiny model with every weight random:

- Exact == Chunked(1) == Chunked(lag) == Interleaved(T) == FullSequence(T) == GaussSeidel(T, 1) ==
  GaussSeidel(3, ceil(T/3)) == token-by-token decoding (1e-10), at B*T > 64;
- the same logits with autograd on and off, and with hook points captured, replaced by themselves,
  or untouched;
- Rollout(G) (G = 1..3) gives Exact's logits, with autograd on and off and under hooks, and its
  loss and every gradient equal FixedPoint(0, T+G, G)'s (the same truncated gradient reached by
  Jacobi sweeps instead of a rollout);
- GaussSeidel(2, 1) equals Interleaved(2), and GaussSeidel(T, 2) (one exact sweep without grad,
  one differentiated) equals Exact, in loss and every gradient;
- the memory rows a keep_memory decoder produced, given to one differentiated full stage, give the
  decoder's logits (cached rollout states, the paper's SFT/RL recipe);
- Exact and Interleaved(2) equal the independent per-position reference (tests/reference.py);
- every memory parameter receives gradient;
- the prefill -> decoding handoff: a Decoder prefilled with every strategy (static and dynamic) at
  several prompt lengths, then stepped, equals the same prompt schedule continued one position at a
  time on a SequenceBuffer (no DecodeCache, no load), with and without keep_memory; after an exact
  prefill both equal Exact.
A memory mechanism registered outside the package (`lrt_lab.register_memory`) joins the option
space when its file is loaded: `pytest tests/test_invariants.py --memory-plugin my_memory.py`.
Tolerances scale with the logits and the sequence length (`close`). Further random combinations
are drawn per field from a seeded generator keyed by the field's name, so adding a field to
MemoryConfig leaves the other fields' draws as they were.
"""

import dataclasses
import itertools
import random

import pytest
import torch
from helpers import decode_all, make_model, maxdiff, tokens
from reference import NaiveLRT

from lrt_lab import MemoryConfig, preset
from lrt_lab.core.buffer import SequenceBuffer
from lrt_lab.core.hook_points import hook_points
from lrt_lab.run.decode import Decoder
from lrt_lab.run.hooks import hooks
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import (
    Chunked,
    Exact,
    FixedPoint,
    FullSequence,
    GaussSeidel,
    Interleaved,
    OnePass,
    Rollout,
)

N_LAYER, T, B = 3, 10, 7  # B * T = 70 > 64
EPS = 1e-12  # float64 rounding per position and unit of logit scale


def close(a: torch.Tensor, b: torch.Tensor, length: int = T) -> bool:
    """|a - b| within float64 rounding grown over `length` positions, relative to the logits'
    scale (a multiplicative injection amplifies rounding with the scale of what it multiplies)."""
    return maxdiff(a, b) <= EPS * length * max(1.0, b.abs().max().item()) * 10


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
            raise AssertionError(
                f"MemoryConfig.{f.name} declares neither choices nor min in its metadata: "
                "declare its values so the invariant tests cover it"
            )
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
    uncovered = {
        (a, va, b, vb)
        for a, b in itertools.combinations(names, 2)
        for va in space[a]
        for vb in space[b]
    }
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
# the mechanisms tests/reference.py recomputes independently; others registered (a plugin's) are
# held to every invariant but that one
REFERENCE_MECHANISMS = {"lrt"}


def check_invariants(memory: MemoryConfig):
    model = make_model(memory, n_layer=N_LAYER)
    idx = tokens(B=B)
    with torch.no_grad():
        exact = run_schedule(model, idx, None, Exact()).logits
        limits = (
            Chunked(1),
            Chunked(memory.exact_chunk),
            Interleaved(T),
            FullSequence(T),
            GaussSeidel(T, 1),
            GaussSeidel(3, -(-T // 3)),  # after sweep n the positions < 3n are exact
        )
        for sched in limits:
            assert close(run_schedule(model, idx, None, sched).logits, exact), sched
        # exact_chunk is the longest exact chunk: one more position reads zero memory inside itself
        # memory matters
        if not close(run_schedule(model, idx, None, FullSequence(0)).logits, exact):
            longer = run_schedule(model, idx, None, Chunked(memory.exact_chunk + 1)).logits
            assert not close(longer, exact), "Chunked(exact_chunk + 1) matched Exact"
        assert close(decode_all(model, idx), exact), "decoder"
        # hook points: captured, or replaced by an equal tensor everywhere, change nothing
        cache = {}
        assert close(run_schedule(model, idx, None, Exact(), cache=cache).logits, exact)
        assert set(cache) == set(hook_points(model))
        with hooks(model, {name: (lambda x, P: x.clone()) for name in hook_points(model)}):
            assert close(run_schedule(model, idx, None, Exact()).logits, exact)
            assert close(decode_all(model, idx), exact)
        no_grad = run_schedule(model, idx, None, Interleaved(2)).logits
        assert close(run_schedule(model, idx, None, Rollout()).logits, exact), "rollout"
        with hooks(model, {name: (lambda x, P: x.clone()) for name in hook_points(model)}):
            assert close(run_schedule(model, idx, None, Rollout(2)).logits, exact), (
                "rollout, hooked"
            )
    check_rollout_gradients(model, idx, exact)
    check_gauss_seidel_gradients(model, idx)
    check_decoded_memory_rows(model, idx)
    # autograd on: the same logits, and every memory parameter gets gradient
    targets = tokens(B=B, seed=5)
    out = run_schedule(model, idx, targets, Interleaved(2))
    assert close(out.logits, no_grad)
    out.loss.backward()
    if cache["hook_mem_out"].abs().max() == 0:
        # the one configuration whose memory is identically zero: the source is block 1's attention
        # output, whose values are replaced by W_v,rec m (= 0 from the zero initial memory)
        assert (
            memory.source_tap == "attn_out"
            and memory.kv_mode == "replace"
            and memory.kv in ("both", "values")
            and memory.source_layer == 1
        ), memory
        return
    for name, p in model.pathway.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    check_prefill_handoff(model, idx[:3], exact[:3])
    if memory.mechanism not in REFERENCE_MECHANISMS:  # a registered mechanism: its own math
        return
    # the independent per-position reference, for the exact recurrence and a parallel schedule
    one = tokens(B=1, T=6)
    naive = NaiveLRT(model)
    with torch.no_grad():
        ref_exact, _ = naive.run(one, [[t] for t in range(6)])
        assert close(run_schedule(model, one, None, Exact()).logits, ref_exact, 6)
        ref_inter, _ = naive.run(one, [list(P) for P in Interleaved(2).stages(6)])
        assert close(run_schedule(model, one, None, Interleaved(2)).logits, ref_inter, 6)


PREFILLS = (
    OnePass(),
    Interleaved(2),
    FullSequence(1),
    Chunked(2),
    Exact(),
    FixedPoint(0.0, T, 1),
    Rollout(),
    GaussSeidel(2, 2),
)
EXACT_PREFILLS = (Exact, FixedPoint, Rollout)  # FixedPoint at tol 0 with T sweeps


def continued_on_a_sequence_buffer(model, idx, strategies, p):
    """[(the prompt's last logits, the logits of each later position)] per strategy: `strategy`
    on idx[:, :p], then one position per stage on the same functional SequenceBuffer (the second
    code path). The strategies' buffers are stacked along the batch and stepped together (rows
    never interact: the same logits as one continuation per strategy, in one pass)."""
    bufs = [run_schedule(model, idx[:, :p], None, s) for s in strategies]
    last = [out.logits[:, -1] for out in bufs]
    bufs = [out.buffer for out in bufs]

    def stacked(tensors):
        assert all(t is None for t in tensors) or all(t is not None for t in tensors)
        return None if tensors[0] is None else torch.cat(tensors)

    rows = idx.repeat(len(bufs), 1)
    buf = SequenceBuffer(
        [stacked([b.k[l] for b in bufs]) for l in range(len(bufs[0].k))],
        [stacked([b.v[l] for b in bufs]) for l in range(len(bufs[0].v))],
        stacked([b.mem for b in bufs]),
        model.empty_buffer(rows).doc,
    )  # documents of the whole row
    steps = []
    for t in range(p, idx.size(1)):
        logits, buf = model.stage(rows[:, t : t + 1], range(t, t + 1), buf)
        steps.append(logits[:, 0])
    return list(zip(last, torch.stack(steps, dim=1).chunk(len(bufs))))


def check_prefill_handoff(model, idx, exact):
    """Every prefill strategy at several prompt lengths, then decoding: the Decoder (DecodeCache,
    `load`) against the SequenceBuffer continuation; exact strategies also against Exact
    (`exact`: its logits on idx)."""
    for p in (1, 4, idx.size(1) - 1):
        # (Interleaved with more subsets than prompt positions is refused)
        strategies = [
            s for s in PREFILLS if not (isinstance(s, (Interleaved, GaussSeidel)) and s.S > p)
        ]
        refs = continued_on_a_sequence_buffer(model, idx, strategies, p)
        for strategy, (ref_last, ref_steps) in zip(strategies, refs):
            for keep in (False, True) if isinstance(strategy, Interleaved) else (False,):
                decoder = Decoder(model, idx.size(0), idx.size(1), keep_memory=keep)
                last = decoder.prefill(idx[:, :p], strategy)
                steps = torch.stack([decoder.step(idx[:, t]) for t in range(p, idx.size(1))], dim=1)
                where = (type(strategy).__name__, p, keep)
                assert close(last, ref_last) and close(steps, ref_steps), ("prefill handoff", where)
            if isinstance(strategy, EXACT_PREFILLS):
                assert close(ref_last, exact[:, p - 1]) and close(ref_steps, exact[:, p:]), (
                    "exact",
                    strategy,
                    p,
                )


def grads(model, loss):
    params = list(model.parameters())
    return [
        torch.zeros_like(p) if g is None else g
        for p, g in zip(params, torch.autograd.grad(loss, params, allow_unused=True))
    ]


def check_rollout_gradients(model, idx, exact):
    """Rollout(G) == FixedPoint(0, T+G, G) in loss and gradients; its logits are Exact's."""
    targets = tokens(B=B, seed=7)
    for G in (1, 2, 3):
        out = run_schedule(model, idx, targets, Rollout(G))
        ref = run_schedule(model, idx, targets, FixedPoint(0.0, T + G, G))
        assert close(out.logits, exact), ("rollout logits", G)
        assert close(out.loss, ref.loss), ("rollout loss", G)
        for g_out, g_ref in zip(grads(model, out.loss), grads(model, ref.loss)):
            assert close(g_out, g_ref), ("rollout gradient", G)


def check_gauss_seidel_gradients(model, idx):
    """GaussSeidel(S, 1) is Interleaved(S); GaussSeidel(T, 2) is Exact in loss and gradients (its
    differentiated sweep visits one position per stage in order, from a detached exact buffer it
    never reads: every row a position reads was written earlier in that sweep)."""
    targets = tokens(B=B, seed=7)
    for sched, ref in ((GaussSeidel(2, 1), Interleaved(2)), (GaussSeidel(T, 2), Exact())):
        out = run_schedule(model, idx, targets, sched)
        want = run_schedule(model, idx, targets, ref)
        assert close(out.loss, want.loss), ("gauss-seidel loss", sched)
        for g_out, g_ref in zip(grads(model, out.loss), grads(model, want.loss)):
            assert close(g_out, g_ref), ("gauss-seidel gradient", sched)


def check_decoded_memory_rows(model, idx):
    """Decode token by token keeping the memory rows; one differentiated full stage from them
    reproduces every step's logits."""
    decoder = Decoder(model, idx.size(0), idx.size(1), keep_memory=True)
    steps = torch.stack([decoder.step(idx[:, t]) for t in range(idx.size(1))], dim=1)
    rows = decoder.memory_rows()
    assert rows.shape == (idx.size(0), idx.size(1), model.config.n_embd)
    out = run_schedule(model, idx, tokens(B=B, seed=7), FullSequence(0), memory_rows=rows)
    assert close(out.logits, steps), "full stage from decoded memory rows"
    out.loss.backward()  # the rows are normal tensors: autograd can save them
    model.zero_grad()


def test_the_covering_set_covers_every_option_value():
    space = config_space()
    for name, values in space.items():
        seen = {getattr(c, name) for c in CONFIGS}
        assert seen == set(values), name
    assert len(CONFIGS) < 40  # pairwise, not the full product


@pytest.mark.parametrize(
    "memory",
    CONFIGS,
    ids=lambda c: ",".join(
        f"{f.name}={getattr(c, f.name)}"
        for f in dataclasses.fields(c)
        if getattr(c, f.name) != f.default
    ),
)
def test_invariants_hold_across_the_config_space(memory):
    check_invariants(memory)


def drawn_values(space: dict, draw: int) -> dict:
    """Draw number `draw`: each field's value from its own generator, seeded with (draw, name)."""
    return {
        name: random.Random(f"{draw}:{name}").choice(choices) for name, choices in space.items()
    }


def random_configs(n: int = 5) -> list[MemoryConfig]:
    """The first n valid draws (drawn_values): adding a field to MemoryConfig does not change
    what the other fields draw."""
    space, configs, draw = config_space(), [], 0
    while len(configs) < n:
        config = make_config(drawn_values(space, draw))
        draw += 1
        if config is not None:
            configs.append(config)
    return configs


def test_random_draws_do_not_move_when_a_field_is_added():
    space = config_space()
    for draw in range(20):
        wider = drawn_values({**space, "a_new_field": (1, 2, 3)}, draw)
        assert {k: v for k, v in wider.items() if k != "a_new_field"} == drawn_values(space, draw)


@pytest.mark.parametrize(
    "memory",
    random_configs(),
    ids=lambda c: ",".join(
        f"{f.name}={getattr(c, f.name)}"
        for f in dataclasses.fields(c)
        if getattr(c, f.name) != f.default
    ),
)
@pytest.mark.slow
def test_invariants_hold_for_random_combinations(memory):
    check_invariants(memory)
