"""FixedPoint (refine until the memory converges), in float64 against independent computations:
Exact, FullSequence(k) through the static code path, and a hand-driven loop over `model.stage`."""

import pytest
import torch
from helpers import CONFIGS, SCHEDULE_SPELLINGS, make_model, maxdiff, tiny_train_config, tokens

from lrt_lab import MemoryConfig
from lrt_lab.core.loss import cross_entropy
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Exact, FixedPoint, FullSequence

T = 8
TOL = 1e-10


def grads(model, loss):
    return [
        g if g is not None else torch.zeros_like(p)
        for p, g in zip(
            model.parameters(),
            torch.autograd.grad(loss, list(model.parameters()), allow_unused=True),
        )
    ]


def contracting_model(name="default", factor=0.1):
    """make_model with the memory pathway's weights scaled down: a recurrence that converges
    before T sweeps (the fully random one only becomes exact at sweep T)."""
    model = make_model(CONFIGS[name])
    with torch.no_grad():
        for p in model.pathway.parameters():
            p.mul_(factor)
    return model


def rel_change(prev, new):
    """The residual restated: max over (b, t) of ||dm|| / RMS_{b,t} ||m_new||."""
    prev = torch.zeros_like(new) if prev is None else prev
    return ((new - prev).norm(dim=-1).max() / new.norm(dim=-1).pow(2).mean().sqrt()).item()


@pytest.mark.parametrize("name", ["default", "source1_lag2", "averages", "reset_at_bos"])
@pytest.mark.parametrize("grad_sweeps", [1, T])
def test_tol_zero_with_T_sweeps_is_exact(name, grad_sweeps):
    model = make_model(CONFIGS[name])
    idx = tokens(T=T)
    out = run_schedule(model, idx, None, FixedPoint(0.0, T, grad_sweeps))
    exact = run_schedule(model, idx, None, Exact()).logits
    assert maxdiff(out.logits, exact) <= TOL
    assert out.measured.sweeps <= T


def test_loose_tolerance_stops_early_and_reports_its_residuals():
    model = contracting_model()
    idx = tokens(T=T)
    # the residual trajectory, computed independently from FullSequence(k)'s buffers
    mems = [run_schedule(model, idx, None, FullSequence(k)).buffer.mem for k in range(T + 1)]
    traj = [rel_change(a, b) for a, b in zip(mems, mems[1:])]
    assert traj[-1] <= TOL < traj[0]  # converges within T sweeps, not at once
    tol = traj[3] * 1.0001  # a tolerance first met at sweep 4 (the trajectory decreases here)
    assert all(r > tol for r in traj[:3])
    for G in (1, 2, T):
        out = run_schedule(model, idx, tokens(T=T, seed=3), FixedPoint(tol, T, G))
        m = out.measured
        # truncated: converge without grad (4 sweeps), then G differentiated sweeps
        expect = 4 if G >= T else 4 + G
        assert m.sweeps == expect < T and m.converged
        assert m.residuals == pytest.approx(traj[:expect], rel=1e-9, abs=1e-13)
        assert m.residual_per_position.shape == (expect, T)
        assert m.residual_per_position.amax(1).tolist() == pytest.approx(m.residuals, rel=1e-12)
        # the final logits are those of FullSequence(k) for the sweeps it used
        ref = run_schedule(model, idx, None, FullSequence(expect)).logits
        assert maxdiff(out.logits, ref) <= TOL


def test_max_sweeps_caps_an_unconverged_run():
    model = make_model(CONFIGS["default"])
    idx = tokens(T=T)
    out = run_schedule(model, idx, None, FixedPoint(1e-12, 3, 1))
    assert out.measured.sweeps == 3 and not out.measured.converged
    assert maxdiff(out.logits, run_schedule(model, idx, None, FullSequence(3)).logits) <= TOL


@pytest.mark.parametrize("name", ["default", "layerwise", "kv_only"])
def test_untruncated_equals_fullsequence_with_gradients(name):
    """grad_sweeps covering every sweep: the same loss and gradients as FullSequence(k)."""
    model = contracting_model(name)
    idx, targets = tokens(T=T), tokens(T=T, seed=5)
    targets[0, 2] = -1
    out = run_schedule(model, idx, targets, FixedPoint(0.3, T, T))
    k = out.measured.sweeps
    assert 1 <= k < T  # it stopped early, so the comparison is not the trivial K = T one
    ref = run_schedule(model, idx, targets, FullSequence(k))
    assert len(out.stages) == k + 1
    assert abs(out.loss.item() - ref.loss.item()) <= TOL
    for a, b in zip(grads(model, out.loss), grads(model, ref.loss)):
        assert maxdiff(a, b) <= 1e-9


@pytest.mark.parametrize("G", [1, 2])
def test_truncated_gradient_flows_only_through_the_last_sweeps(G):
    """The loss is the mean CE of the last G sweeps, run from the detached memory of the earlier
    ones; checked against a hand-driven loop over model.stage."""
    model = make_model(CONFIGS["default"])
    idx, targets = tokens(T=T), tokens(T=T, seed=5)
    sched = FixedPoint(0.0, 5, G)
    out = run_schedule(model, idx, targets, sched)
    assert out.measured.sweeps == 5 and len(out.stages) == G
    full = range(0, T)
    with torch.no_grad():
        buf = run_schedule(model, idx, None, FullSequence(5 - G)).buffer
    buf.mem = buf.mem.detach()
    losses = []
    for _ in range(G):
        logits, buf = model.stage(idx, full, buf)
        losses.append(cross_entropy(logits, targets))
    expected = sum(losses) / G
    assert abs(out.loss.item() - expected.item()) <= TOL
    got = grads(model, out.loss)
    for a, b in zip(got, grads(model, expected)):
        assert maxdiff(a, b) <= 1e-9
    # and it is a truncation: FullSequence's gradient (through every sweep) differs
    ref = run_schedule(model, idx, targets, FullSequence(5, (0,) * (6 - G) + (1,) * G))
    assert abs(ref.loss.item() - expected.item()) <= TOL
    assert max(maxdiff(a, b) for a, b in zip(got, grads(model, ref.loss))) > 1e-6


def test_cost_counts_the_passes_run():
    model = make_model(MemoryConfig())  # 3 layers, source layer 2: no_grad passes run 2 of 3 blocks
    split = model.exact_split(1)
    idx = tokens(T=T)
    out = run_schedule(model, idx, None, FixedPoint(0.0, 5, 2))
    # init + 3 no_grad sweeps (split/L each) + 2 full differentiated sweeps
    assert out.measured.cost == pytest.approx(4 * split / 3 + 2)
    out = run_schedule(model, idx, None, FixedPoint(0.0, 5, 5))
    assert out.measured.cost == pytest.approx(6)


def test_no_memory_pathway_converges_at_once():
    model = make_model(None)
    out = run_schedule(model, tokens(T=T), None, FixedPoint(0.0, 4, 1))
    # one no_grad sweep finds nothing changed, then the one differentiated sweep
    assert out.measured.residuals == [0.0, 0.0] and out.measured.converged


def test_parse_and_spec_round_trip():
    for spec in ("fixedpoint:0.001:8", "fixedpoint:0:16:4", "fixedpoint:1e-05:3:2"):
        assert parse_schedule(spec).spec == spec
    assert parse_schedule("fixedpoint:0.01:6:1") == FixedPoint(0.01, 6, 1)
    assert parse_schedule("FixedPoint:0.01:6").spec == "fixedpoint:0.01:6"


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: FixedPoint(-1.0, 4), "FixedPoint.tol"),
        (lambda: FixedPoint(float("nan"), 4), "FixedPoint.tol"),
        (lambda: FixedPoint(0.1, 0), "FixedPoint.max_sweeps"),
        (lambda: FixedPoint(0.1, 4, 0), "FixedPoint.grad_sweeps"),
        (lambda: parse_schedule("fixedpoint:0.1"), "fixedpoint:TOL:MAX"),
        (lambda: parse_schedule("fixedpoint:x:4"), "fixedpoint:TOL:MAX"),
    ],
)
def test_invalid_input_names_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_training_logs_sweeps_and_accounts_the_passes_run(tmp_path):
    from lrt_lab.store.results import load_metrics
    from lrt_lab.training.loop import build_model, train

    cfg = tiny_train_config(schedule="fixedpoint:0.05:4:1")
    run = train(cfg, out=tmp_path, progress=False)
    m = load_metrics(run, kind="train")
    model = build_model(cfg, 8)
    frac = model.exact_split(1) / model.config.n_layer
    assert ((m["sweeps"] >= 1) & (m["sweeps"] <= 4)).all()
    # init + (sweeps - 1) no_grad passes through the lower blocks, then one full differentiated
    # sweep
    expected = (1 + (m["sweeps"] - 1)) * frac + 1
    assert m["step_cost"].tolist() == pytest.approx(expected.tolist())
    tokens_per_step = cfg.batch_size * cfg.length
    assert m["compute_tokens"].tolist() == pytest.approx(
        (expected * tokens_per_step).cumsum().tolist()
    )
    assert run.summary["schedule_cost"] == pytest.approx(expected.mean())


# Convergence diagnostics
# ---------------------------------------------------------------------------
def test_convergence_trace_against_fixedpoint_and_the_jacobi_bound():
    from lrt_lab.analysis.convergence import convergence_trace, residual_per_sweep

    model = contracting_model()
    idx, targets = tokens(B=3, T=T), tokens(B=3, T=T, seed=4)
    # two chunks: maxima over the batch combine
    trace = convergence_trace(model, idx, targets, chunk=2)
    assert len(trace) == (T + 1) * T
    res = torch.tensor(trace.pivot(index="sweep", columns="position", values="residual").to_numpy())
    err = torch.tensor(trace.pivot(index="sweep", columns="position", values="error").to_numpy())
    # a second code path: FixedPoint's own per-position residuals (sweeps 1..T)
    fp = run_schedule(model, idx, None, FixedPoint(0.0, T, T)).measured.residual_per_position
    assert maxdiff(res[1 : fp.size(0) + 1], fp) <= 1e-9
    # Jacobi on a triangular recurrence (lag 1): position t is exact after t sweeps, not before
    for k in range(T):
        assert err[k, : k + 1].max() <= 1e-9
        if k + 1 < T:
            assert err[k, k + 1] > 1e-6
    # sweep k's loss is FullSequence(k)'s final-stage loss
    per = residual_per_sweep(trace)
    for k in (0, 2, T):
        ref = run_schedule(model, idx, targets, FullSequence(k)).stage_losses[-1].item()
        assert per.loc[per["sweep"] == k, "loss"].item() == pytest.approx(ref, rel=1e-9)
    assert per["exact_loss"].iloc[0] == pytest.approx(per["loss"].iloc[-1], rel=1e-9)


def test_sweeps_to_converge_on_a_hand_made_trace():
    import pandas as pd

    from lrt_lab.analysis.convergence import plot_convergence, sweeps_to_converge

    # position 0 settles at sweep 1; position 1 dips below 0.1 at sweep 1 but rises again, settles
    # at 3
    r = {0: [1.0, 0.05, 0.0, 0.0, 0.0], 1: [1.0, 0.05, 0.5, 0.01, 0.0]}
    trace = pd.DataFrame(
        [
            {"sweep": k, "position": t, "residual": v, "error": v}
            for t, vs in r.items()
            for k, v in enumerate(vs)
        ]
    )
    need = sweeps_to_converge(trace, tols=(0.1, 1e-3))
    got = {(row.tol, row.position): row.sweeps for row in need.itertuples()}
    assert got == {
        (0.1, 0): 1.0,
        (0.1, 1): 3.0,
        (0.1, "all"): 3.0,
        (1e-3, 0): 2.0,
        (1e-3, 1): 4.0,
        (1e-3, "all"): 4.0,
    }
    assert sweeps_to_converge(trace, tols=(1e-9,), measure="error")["sweeps"].tolist() == [
        2.0,
        4.0,
        4.0,
    ]
    with pytest.raises(ValueError, match="measure"):
        sweeps_to_converge(trace, measure="loss")
    fig = plot_convergence(trace, tols=(0.1,))
    assert len(fig.axes) == 2


def test_convergence_of_a_trained_run_from_the_cli_and_the_dashboard(tmp_path, capsys, monkeypatch):
    from lrt_lab.commands.analyze import main
    from lrt_lab.store.results import load_table
    from lrt_lab.training.loop import train

    cfg = tiny_train_config(schedule="fixedpoint:0.01:6:2", steps=3)
    run = train(cfg, out=tmp_path, progress=False)
    assert main(["convergence", str(run.path), "--n-sequences", "16", "--tols", "0.1"]) == 0
    table = load_table(run, "convergence")
    assert set(table.columns) >= {
        "run",
        "sweep",
        "position",
        "residual",
        "error",
        "loss",
        "exact_loss",
    }
    assert len(table) == 7 * 6  # sweeps 0..T, T positions
    assert (run.path / "convergence.png").exists()
    assert "plot:" in capsys.readouterr().out
    # the dashboard's Convergence page draws both charts from this store
    pytest.importorskip("streamlit")
    from app_helpers import assert_clean, run_app

    at = run_app(monkeypatch, tmp_path)
    assert_clean(at)
    (tab,) = [t for t in at.tabs if t.label == "Convergence"]
    assert len([e for e in tab if getattr(e, "type", "") == "vega_lite_chart"]) == 2


def test_dashboard_tables_of_sweeps_and_traces():
    import pandas as pd

    pytest.importorskip("streamlit")
    from lrt_app.convergence_page import sweeps_table, trace_table

    runs = pd.DataFrame({"run": ["fp", "plain"], "path": ["p/fp", "p/plain"]})
    metrics = {
        "p/fp": pd.DataFrame(
            {"step": [1, 2], "loss": [1.0, 0.9], "sweeps": [4, 3], "residual": [0.1, 0.01]}
        ),
        "p/plain": pd.DataFrame({"step": [1, 2], "loss": [1.0, 0.9]}),
    }
    s = sweeps_table(runs, loader=lambda path, kind: metrics[path])
    assert s.to_dict("list") == {
        "run": ["fp", "fp"],
        "step": [1, 2],
        "sweeps": [4, 3],
        "residual": [0.1, 0.01],
    }
    trace = pd.DataFrame(
        {
            "sweep": [0, 0, 1, 1],
            "position": [0, 1, 0, 1],
            "residual": [1.0, 2.0, 0.0, 0.5],
            "error": [0.0, 3.0, 0.0, 0.0],
        }
    )
    t = trace_table(runs, loader=lambda path, name: trace if path == "p/fp" else None)
    got = {(r.sweep, r.measure): r.value for r in t.itertuples()}
    assert got == {(0, "residual"): 2.0, (1, "residual"): 0.5, (0, "error"): 3.0, (1, "error"): 0.0}
    assert set(t["run"]) == {"fp"}


def test_every_registered_schedule_satisfies_the_protocol_and_spells_itself_back():
    """run_schedule drives any object with the Schedule protocol's members through `run`: every
    registered spelling parses to one, its `spec` parses back to an equal schedule, and its
    stage weights (where it states them) match its stages."""
    from lrt_lab.core.interface import Schedule
    from lrt_lab.run.registry import registered

    specs = SCHEDULE_SPELLINGS
    assert {s.split(":")[0] for s in specs} == set(registered())
    for spec in specs:
        schedule = parse_schedule(spec)
        assert isinstance(schedule, Schedule)
        assert schedule.spec == spec and parse_schedule(schedule.spec) == schedule
        weights = schedule.stage_weights(8)
        assert weights is None or len(weights) == len(schedule.stages(8))
