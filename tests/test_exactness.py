"""Passes to exactness (lrt_lab.analysis.exactness): every schedule's sweep reaches exact
decoding within its bound, its sweeps are the schedules' own runs (FullSequence, Interleaved,
GaussSeidel) computed by a second code path, the earlier spellings still read, and the behaviour
labels follow their rules."""

import math

import pandas as pd
import pytest
import torch
from helpers import CONFIGS, make_model, tiny_train_config, tokens

from lrt_lab.analysis.exactness import (
    behaviour,
    default_sweep_schedules,
    exactness_trace,
    passes_to_exactness,
    sweep_stages,
)
from lrt_lab.core.loss import cross_entropy
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import FullSequence, GaussSeidel, Interleaved

T = 9


@pytest.fixture(scope="module")
def model():
    return make_model(CONFIGS["default"])


@pytest.fixture(scope="module")
def batch():
    return tokens(B=2, T=T), tokens(B=2, T=T, seed=7)


@pytest.mark.parametrize(
    "schedule, bound",
    [
        ("fullseq:1", T),
        ("interleaved:2", 5),
        ("gaussseidel:3:1", 3),
        ("interleaved:9", 1),
        ("chunked:4", T),
        ("exact", 1),
        ("fixedpoint:0:3", T),
    ],
)
def test_every_schedules_sweep_is_exact_within_its_bound(model, batch, schedule, bound):
    trace = exactness_trace(model, *batch, schedule, max_sweeps=T + 2)
    # the state after sweep `bound`: that sweep's row, or the fixed point's found before it
    row = trace[trace["sweep"] <= bound].iloc[-1]
    assert row["logit_error"] < 1e-10 and row["memory_error"] < 1e-10
    assert abs(row["loss_gap"]) < 1e-10
    if bound > 1:  # before its bound a random model is far from exact
        assert trace.set_index("sweep").loc[1, "logit_error"] > 1e-3
    # once a sweep leaves the buffer unchanged, one row flagged `repeated` at the last sweep
    # stands for the rest, equal to the sweep that found the fixed point
    repeated = trace[trace["repeated"]]
    assert repeated["sweep"].tolist() == [T + 2]
    found = trace[~trace["repeated"]].iloc[-1]
    assert repeated["logit_error"].item() == found["logit_error"] and found["sweep"] <= bound + 1


@torch.no_grad()
def _loss(model, batch, schedule):
    x, y = batch
    return float(cross_entropy(run_schedule(model, x, None, schedule).logits, y))


@pytest.mark.parametrize(
    "spec, sweep, schedule",
    [
        ("fullseq:1", 2, FullSequence(2)),
        ("fullseq:3", 5, FullSequence(5)),
        ("interleaved:2", 1, Interleaved(2)),
        ("interleaved:3", 1, Interleaved(3)),
        ("gaussseidel:2:1", 3, GaussSeidel(2, 3)),
    ],
)
def test_sweeps_are_the_schedules_own_runs(model, batch, spec, sweep, schedule):
    # the trace's k-th sweep is what the schedule computes (its final logits), by the schedule's
    # own code path
    trace = exactness_trace(model, *batch, spec, max_sweeps=sweep).set_index("sweep")
    assert trace.loc[sweep, "loss"] == pytest.approx(_loss(model, batch, schedule), abs=1e-12)


def test_sweeps_are_schedule_specs_and_checked():
    assert sweep_stages("interleaved:3", 7) == [range(0, 7, 3), range(1, 7, 3), range(2, 7, 3)]
    assert sweep_stages("chunked:3", 7) == [range(0, 3), range(3, 6), range(6, 7)]
    assert sweep_stages("fullseq:1", 7) == [range(0, 7)]
    for bad in ("interleaved:8", "interleaved:0", "chunked:", "onepass", "seidel"):
        with pytest.raises(ValueError, match="schedule="):
            sweep_stages(bad, 7)
    assert default_sweep_schedules(256) == [
        "fullseq:1",
        "interleaved:2",
        "interleaved:4",
        "interleaved:8",
        "interleaved:16",
        "chunked:128",
        "chunked:32",
    ]
    assert default_sweep_schedules(16) == [
        "fullseq:1",
        "interleaved:2",
        "interleaved:4",
        "interleaved:8",
        "chunked:2",
        "chunked:8",
    ]


@pytest.mark.parametrize(
    "old, new", [("jacobi", "fullseq:1"), ("gs:3", "interleaved:3"), ("chunks:3", "chunked:3")]
)
def test_the_earlier_spellings_read_with_a_warning_naming_the_spec(model, batch, old, new):
    with pytest.warns(DeprecationWarning, match=f"write '{new}'"):
        assert sweep_stages(old, 7) == sweep_stages(new, 7)
    with pytest.warns(DeprecationWarning, match=f"write '{new}'"):
        trace = exactness_trace(model, *batch, old, max_sweeps=2)
    pd.testing.assert_frame_equal(
        trace.drop(columns="wall_s"),
        exactness_trace(model, *batch, new, max_sweeps=2).drop(columns="wall_s"),
    )
    assert set(trace["schedule"]) == {new}
    for bad in ("jacobi:2", "chunks:"):  # not earlier spellings either: refused
        with pytest.raises(ValueError, match="schedule="):
            sweep_stages(bad, 7)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="interleaved:0"):
        sweep_stages("gs:0", 7)  # an earlier spelling of a spec that is refused


def test_a_table_stored_with_an_ordering_column_still_reads():
    old = _table([1.0, 0.1, 1e-4], "jacobi").rename(columns={"schedule": "ordering"})
    out = passes_to_exactness(old, at=(2,))
    assert out["schedule"].tolist() == ["jacobi"] and out["sweeps_to_logits"].item() == 2


def _table(errors, schedule="o"):
    n = len(errors)
    return pd.DataFrame(
        {
            "schedule": schedule,
            "sweep": range(n),
            "stages": 2,
            "logit_error": errors,
            "loss_gap": [e / 10 for e in errors],
            "wall_s": [0.5 * (k + 1) for k in range(n)],
            "repeated": False,
        }
    )


def test_behaviour_labels_follow_their_rules():
    assert behaviour(_table([1.0, 0.1, 1e-4]), 2) == "exact"
    assert behaviour(_table([1.0, 0.5, 0.4, 0.45]), 3) == "plateau"
    assert behaviour(_table([1.0, 0.01, 0.2]), 2) == "diverged"  # 20x its best: grew again
    assert behaviour(_table([1.0, math.inf]), 1) == "diverged"
    assert behaviour(_table([1.0, 0.5]), 5) == ""  # the trace stops before
    # a fixed point found at sweep 2 of 1000: sweep 30 is the fixed point's
    fixed = _table([1.0, 0.1, 1e-4, 1e-4])
    fixed.loc[3, ["sweep", "repeated"]] = (1000, True)
    assert behaviour(fixed, 30) == "exact" and behaviour(fixed, 1000) == "exact"
    assert behaviour(fixed, 1) == "plateau"  # before the fixed point: sweep 1's own row
    assert behaviour(fixed.iloc[:3], 30) == ""


def test_passes_to_exactness_reads_the_first_sweep_within_tolerance():
    trace = pd.concat([_table([1.0, 0.1, 1e-4, 1e-5], "a"), _table([1.0, 0.9, 0.8, 0.7], "b")])
    out = passes_to_exactness(trace, logit_tol=1e-3, loss_eps=1e-3, at=(3,)).set_index("schedule")
    assert out.loc["a", "sweeps_to_logits"] == 2 and out.loc["a", "wall_s_to_logits"] == 1.5
    assert out.loc["a", "sweeps_to_loss"] == 2  # loss gaps 0.1, 0.01, 1e-5
    assert math.isnan(out.loc["b", "sweeps_to_logits"]) and out.loc["b", "at_3"] == "plateau"
    assert out.loc["a", "at_3"] == "exact" and out.loc["a", "stages_per_sweep"] == 2


def test_a_model_without_memory_is_refused():
    with pytest.raises(ValueError, match="memory pathway"):
        exactness_trace(make_model(None), tokens(B=1, T=4), None, "fullseq:1", 2)
    with pytest.raises(ValueError, match="max_sweeps"):
        exactness_trace(make_model(CONFIGS["default"]), tokens(B=1, T=4), None, "fullseq:1", 0)


def trained_run(tmp_path, schedule="interleaved:2"):
    """A tiny LRT trained for a few steps, with evaluations (and so the contraction monitor)."""
    from lrt_lab.training.loop import train

    cfg = tiny_train_config(schedule=schedule, eval_every=2, eval_size=8)
    return train(cfg, out=tmp_path, progress=False)


def test_the_command_on_a_trained_run(tmp_path, capsys):
    from lrt_lab.commands.analyze import main
    from lrt_lab.store.results import load_table

    run = trained_run(tmp_path)
    assert main(["exactness", str(run.path), "--sweeps", "8", "--n-sequences", "4"]) == 0
    out = capsys.readouterr().out
    assert "sweeps_to_logits" in out and (run.path / "exactness.png").exists()
    table = load_table(run, "exactness")
    assert list(table["schedule"].unique()) == default_sweep_schedules(6)
    # every schedule's sweep is exact by sweep T = 6 (float32: to rounding)
    assert (table[table["sweep"] == 6]["logit_error"] < 1e-4).all()
    # another length: its own table and figure, the training length's kept
    assert main(["exactness", str(run.path), "--sweeps", "2", "--length", "12"]) == 0
    assert load_table(run, "exactness_L12")["sweep"].max() == 2
    assert (run.path / "exactness_L12.png").exists() and len(load_table(run, "exactness"))
    assert main(["exactness", str(run.path), "--schedules", "interleaved:9"]) == 2
    assert "interleaved:9" in capsys.readouterr().err
    # the earlier option and spellings still read
    with pytest.warns(DeprecationWarning, match="write 'interleaved:2'"):
        assert main(["exactness", str(run.path), "--orderings", "gs:2", "--sweeps", "1"]) == 0
    assert list(load_table(run, "exactness")["schedule"].unique()) == ["interleaved:2"]
