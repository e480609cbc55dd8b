"""Rollout (exact memory, then G differentiated sweeps) and starting a schedule from given memory,
in float64 against independent computations: Exact's memory rows fed to FullSequence through the
static code path, the decoder's step logits, and a hand count of the cost.

The generated suite (tests/test_invariants.py) holds Rollout == Exact (logits) and
Rollout(G) == FixedPoint(0, T+G, G) (loss and gradients) over the whole config space."""

import pytest
import torch
from helpers import CONFIGS, make_model, maxdiff, tokens

from lrt_lab import MemoryConfig, preset
from lrt_lab.core.baselines import LoopTransformer
from lrt_lab.run.decode import Decoder
from lrt_lab.run.execution import rollout_memory
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import (
    Exact,
    FullSequence,
    Interleaved,
    OnePass,
    Rollout,
)

T = 10
TOL = 1e-10


def grads(model, loss):
    params = list(model.parameters())
    return [
        torch.zeros_like(p) if g is None else g
        for p, g in zip(params, torch.autograd.grad(loss, params, allow_unused=True))
    ]


def test_specs_parse_and_round_trip():
    assert parse_schedule("rollout") == Rollout(1) and parse_schedule("rollout:3") == Rollout(3)
    assert Rollout(2).spec == "rollout:2" and parse_schedule(Rollout(2).spec) == Rollout(2)
    for bad in ("rollout:0", "rollout:x", "rollout:1:2", "rollout:-1"):
        with pytest.raises(ValueError, match="rollout"):
            parse_schedule(bad)
    with pytest.raises(ValueError, match="grad_sweeps"):
        Rollout(0)


@pytest.mark.parametrize("name", ["default", "source1_lag2", "averages", "reset_at_bos"])
def test_rolled_out_rows_are_exacts_memory(name):
    model = make_model(CONFIGS[name])
    idx = tokens(T=T)
    rows, layers = rollout_memory(model, idx)
    exact = run_schedule(model, idx, None, Exact()).buffer.mem
    read = T - CONFIGS[name].lag  # the rows some position of the sequence reads: m_0 .. m_{T-1-lag}
    assert rows.shape == exact[:, :read].shape and maxdiff(rows, exact[:, :read]) <= TOL
    assert layers == range(0, model.exact_split(1))  # only the blocks that feed m_t


@pytest.mark.parametrize("G", [1, 2, 3])
def test_gradient_is_full_sequence_from_detached_exact_memory(G):
    """Rollout(G) == FullSequence(G-1) started from Exact's memory rows (detached): a second code
    path for what the G differentiated sweeps compute, loss and every gradient. With G = 1 no
    gradient crosses a memory hop."""
    model = make_model(CONFIGS["default"])
    idx, targets = tokens(T=T), tokens(T=T, seed=3)
    with torch.no_grad():
        rows = run_schedule(model, idx, None, Exact()).buffer.mem
    ref = run_schedule(model, idx, targets, FullSequence(G - 1), memory_rows=rows)
    out = run_schedule(model, idx, targets, Rollout(G))
    assert abs(out.loss.item() - ref.loss.item()) <= TOL
    g_out = grads(model, out.loss)
    for a, b in zip(g_out, grads(model, ref.loss)):
        assert maxdiff(a, b) <= TOL
    if G == 1:  # and not Exact's BPTT gradient (the same loss here): the truncation is real
        exact = run_schedule(model, idx, targets, Exact())
        assert abs(exact.loss.item() - out.loss.item()) <= TOL
        assert max(maxdiff(a, b) for a, b in zip(g_out, grads(model, exact.loss))) > 1e-6


def test_measured_cost_is_the_rollout_fraction_plus_the_sweeps():
    model = make_model(CONFIGS["default"])  # 3 layers, source layer 2 of 3: split 2
    out = run_schedule(model, tokens(T=T), tokens(T=T, seed=3), Rollout(2))
    m = out.measured
    # positions 0 .. T-2 are rolled out: the last one's memory would be read only at position T
    rolled = 2 / 3 * (T - 1) / T
    assert m.rollout_cost == pytest.approx(rolled) and m.cost == pytest.approx(2 + rolled)
    assert m.rollout_s > 0 and m.grad_sweeps == 2
    assert len(out.stages) == 2 and len(out.stage_losses) == 2
    assert out.loss.item() == pytest.approx(sum(l.item() for l in out.stage_losses) / 2, rel=1e-12)
    top = make_model(MemoryConfig(source_layer=3))  # the source is the top block: no split
    assert run_schedule(top, tokens(T=T), None, Rollout()).measured.cost == pytest.approx(
        1 + (T - 1) / T
    )
    # position t reads m_{t-2}: T-2 rolled out
    lag2 = make_model(MemoryConfig(source_layer=3, lag=2))
    assert run_schedule(lag2, tokens(T=T), None, Rollout()).measured.cost == pytest.approx(
        1 + (T - 2) / T
    )


def test_a_plain_transformer_just_runs_the_sweeps():
    model = make_model(None)
    idx = tokens(T=T)
    out = run_schedule(model, idx, tokens(T=T, seed=3), Rollout(2))
    assert maxdiff(out.logits, run_schedule(model, idx, None, OnePass()).logits) <= TOL
    assert out.measured.cost == 2.0 and out.measured.rollout_cost == 0.0


def test_the_caller_thread_count_is_restored():
    model = make_model(CONFIGS["default"])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        run_schedule(model, tokens(T=T), None, Rollout())
        assert torch.get_num_threads() == 2
        from lrt_lab.run.hooks import hooks

        def boom(x, P):
            raise RuntimeError("hook failed")

        with pytest.raises(RuntimeError, match="hook failed"), hooks(model, {"hook_mem_out": boom}):
            rollout_memory(model, tokens(T=T))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# Starting from given memory
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["default", "source1_lag2", "averages", "reset_at_bos", "layerwise"]
)
@pytest.mark.parametrize("prompt_len", [0, 1, 4])
def test_decoded_rows_score_the_sequence_in_one_parallel_pass(name, prompt_len):
    """Prefill a prompt exactly (or none), decode the rest keeping the memory rows; one
    differentiated full stage from those rows gives the decoder's logits at every position."""
    model = make_model(CONFIGS[name])
    idx = tokens(B=3, T=T)
    decoder = Decoder(model, 3, T, keep_memory=True)
    logits = []
    if prompt_len:
        prompt = run_schedule(model, idx[:, :prompt_len], None, Exact()).logits
        assert maxdiff(decoder.prefill(idx[:, :prompt_len], Exact()), prompt[:, -1]) <= TOL
        logits = list(prompt.unbind(1))
    logits += [decoder.step(idx[:, t]) for t in range(prompt_len, T)]
    rows = decoder.memory_rows()
    assert rows.shape == (3, T, model.config.n_embd) and not rows.is_inference()
    out = run_schedule(model, idx, tokens(B=3, T=T, seed=3), FullSequence(0), memory_rows=rows)
    assert maxdiff(out.logits, torch.stack(logits, dim=1)) <= TOL
    out.loss.backward()
    assert model.pathway.k_rec[0].weight.grad.abs().sum() > 0  # the rows feed W_k,rec: a gradient


def test_an_approximate_prefill_hands_out_its_final_rows():
    """After an Interleaved(2) prefill the rows are that schedule's final memory (its buffer); the
    cached keys were not all computed from it, so only an exact prefill scores as the steps do."""
    model = make_model(CONFIGS["default"])
    idx = tokens(B=3, T=T)
    decoder = Decoder(model, 3, T, keep_memory=True)
    decoder.prefill(idx[:, :6], Interleaved(2))
    expect = run_schedule(model, idx[:, :6], None, Interleaved(2)).buffer.mem
    assert maxdiff(decoder.memory_rows(), expect) <= TOL


def test_given_memory_is_read_and_exact_schedules_ignore_it():
    model = make_model(CONFIGS["default"])
    idx = tokens(T=T)
    rows = torch.randn(2, T, model.config.n_embd, dtype=torch.float64)
    plain = run_schedule(model, idx, None, FullSequence(0)).logits
    given = run_schedule(model, idx, None, FullSequence(0), memory_rows=rows).logits
    assert maxdiff(plain, given) > 1e-3  # read: the init stage no longer sees zero memory
    exact = run_schedule(model, idx, None, Exact()).logits
    for sched in (Exact(), Rollout()):  # every row they read, they compute
        assert maxdiff(run_schedule(model, idx, None, sched, memory_rows=rows).logits, exact) <= TOL
    # later rows zero
    short = run_schedule(model, idx, None, FullSequence(0), memory_rows=rows[:, :4]).logits
    padded = torch.cat([rows[:, :4], torch.zeros_like(rows[:, 4:])], dim=1)
    assert (
        maxdiff(short, run_schedule(model, idx, None, FullSequence(0), memory_rows=padded).logits)
        <= TOL
    )


def test_given_memory_is_checked():
    model = make_model(CONFIGS["default"])
    idx = tokens(T=T)
    d = model.config.n_embd
    for bad in (
        torch.zeros(2, T, d + 1, dtype=torch.float64),
        torch.zeros(3, T, d, dtype=torch.float64),
        torch.zeros(2, T + 1, d, dtype=torch.float64),
        torch.zeros(2, T, d, dtype=torch.long),
        torch.full((2, T, d), float("nan"), dtype=torch.float64),
        [[0.0]],
    ):
        with pytest.raises(ValueError, match="memory"):
            run_schedule(model, idx, None, FullSequence(0), memory_rows=bad)
    with pytest.raises(ValueError, match="memory pathway"):
        run_schedule(
            make_model(None),
            idx,
            None,
            OnePass(),
            memory_rows=torch.zeros(2, T, d, dtype=torch.float64),
        )


def test_memory_rows_need_keep_memory_and_are_none_without_a_memory():
    model = make_model(CONFIGS["default"])
    decoder = Decoder(model, 2, T)
    with pytest.raises(ValueError, match="keep_memory"):
        decoder.memory_rows()
    for plain in (make_model(None), LoopTransformer(preset("tiny", n_layer=2), n_loops=2)):
        dec = Decoder(plain.double(), 2, T, keep_memory=True)
        dec.step(tokens(T=1)[:, 0])
        assert dec.memory_rows() is None


def test_rollout_trains_through_the_training_loop(tmp_path):
    from lrt_lab.training.loop import TrainConfig, train

    cfg = TrainConfig(
        task="a5_prefix",
        length=6,
        preset="small",
        schedule="rollout:2",
        steps=3,
        batch_size=4,
        eval_size=4,
        eval_lengths=(6,),
        eval_every=0,
        checkpoint_every=0,
        seed=0,
        name="rollout",
    )
    run = train(cfg, out=tmp_path, progress=False)
    records = [r for r in run.metrics_records() if r["kind"] == "train"]
    assert len(records) == 3
    # the small preset; the paper's source layer round(0.6 * 4) = 2: the rollout runs 2 of 4 blocks
    n_layer = 4
    split = 2
    costs = [
        2 + split / n_layer * (r["length"] - 1) / r["length"] for r in records
    ]  # the last position not rolled out
    for r, cost in zip(records, costs):
        assert r["step_cost"] == pytest.approx(cost)
        assert 0 < r["rollout_share"] < 1
    assert run.summary["schedule_cost"] == pytest.approx(sum(costs) / len(costs))


def test_the_tour_recipe_runs():
    """The tour's "Start from given memory" example, run as written."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "tour.md").read_text()
    blocks = [b.split("```")[0] for b in text.split("```python\n")[1:]]
    recipe = [b for b in blocks if "keep_memory=True" in b and "memory_rows=rows" in b]
    assert len(recipe) == 1
    exec(compile(recipe[0], "docs/tour.md", "exec"), {})
