"""The contraction monitor (lrt_lab.run.contraction_monitor): the Lyapunov estimator against
hand-built linear recurrences whose answer is known, the model's memory-map Jacobian against finite
differences of exact decoding, and the sweep change against the convergence analysis."""

import math

import pytest
import torch
from helpers import CONFIGS, make_model, tokens

from lrt_lab.analysis.convergence import convergence_trace, residual_per_sweep
from lrt_lab.run.contraction_monitor import (
    contraction_record,
    lyapunov,
    lyapunov_exponent,
    memory_map_vjp,
    sweep_changes,
)
from lrt_lab.run.hooks import hooks
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Exact


def _orthogonal(d, gen):
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    return q


def _linear(maps):
    """u -> A_t^T u for the hand-built recurrence m_t = A_t m_(t-1), maps[t] = A_t."""
    return lambda t, u: u @ maps[t]


@pytest.mark.parametrize("scale, sign", [(0.5, -1), (1.5, 1), (1.0, 0)])
def test_scaled_rotations_give_log_scale(scale, sign):
    # m_t = a Q_t m_(t-1), Q_t orthogonal: every step multiplies every norm by a, so the exponent
    # is log a exactly: negative for a contraction, positive for an expansion, 0 for an isometry
    gen = torch.Generator().manual_seed(0)
    T, d = 40, 5
    maps = [scale * _orthogonal(d, gen) for _ in range(T)]
    start = torch.randn(3, d, generator=gen, dtype=torch.float64)
    exponent, growth = lyapunov_exponent(_linear(maps), T, start)
    assert growth.shape == (T - 1, 3)
    torch.testing.assert_close(exponent, torch.full((3,), math.log(scale), dtype=torch.float64))
    assert (exponent.sign() == sign).all() or sign == 0


def test_growth_telescopes_to_the_explicit_product():
    # random (not normal) maps: the summed log growth is log ||(A_(T-1) ... A_1)^T u|| for the
    # unit start u, computed here from the explicit matrix product
    gen = torch.Generator().manual_seed(1)
    T, d = 30, 4
    maps = [torch.randn(d, d, generator=gen, dtype=torch.float64) * 0.6 for _ in range(T)]
    start = torch.randn(2, d, generator=gen, dtype=torch.float64)
    exponent, growth = lyapunov_exponent(_linear(maps), T, start)
    product = torch.eye(d, dtype=torch.float64)
    for t in range(1, T):
        product = maps[t] @ product
    u = start / start.norm(dim=-1, keepdim=True)
    expected = (u @ product).norm(dim=-1).log()
    torch.testing.assert_close(growth.sum(0), expected)
    torch.testing.assert_close(exponent, expected / (T - 1))
    # and it approaches log of the top singular value per step from below
    top = torch.linalg.matrix_norm(product, ord=2).log() / (T - 1)
    assert (exponent <= top + 1e-12).all() and (exponent > top - 0.2).all()


def test_a_single_position_needs_two():
    with pytest.raises(ValueError, match="T >= 2"):
        lyapunov_exponent(lambda t, u: u, 1, torch.ones(1, 2))


def _fd_directional(model, idx, t, v, eps=1e-3):
    """J_t v = dm_t/dm_(t-1) v by central differences of exact decoding (the Exact schedule from
    an empty buffer, the read at t nudged along v through hook_mem_in): a second code path to
    the map. At eps 1e-3 the truncation error is ~1e-8; below 1e-4 rounding dominates."""
    outs = []
    for sign in (1, -1):

        def nudge(x, P, sign=sign):
            if t not in P:
                return x
            x = x.clone()
            x[:, P.index(t)] += sign * eps * v
            return x

        with hooks(model, {"hook_mem_in": nudge}):
            outs.append(run_schedule(model, idx, None, Exact()).buffer.mem[:, t])
    return (outs[0] - outs[1]) / (2 * eps)


@pytest.mark.parametrize("name", ["default", "layerwise", "residual_only", "kv_only"])
def test_memory_map_vjp_matches_finite_differences(name):
    # <u, J v> from finite differences of exact decoding = <J^T u, v> from the VJP, for random
    # u and v: the transpose-free identity that pins J^T u down direction by direction
    model = make_model(CONFIGS[name]).eval()
    idx = tokens(B=2, T=7)
    buffer = run_schedule(model, idx, None, Exact()).buffer
    step = memory_map_vjp(model, idx, buffer)
    gen = torch.Generator().manual_seed(3)
    d = model.config.n_embd
    for t in (1, 6):
        u = torch.randn(2, d, generator=gen, dtype=torch.float64)
        vjp = step(t, u)
        for _ in range(3):
            v = torch.randn(2, d, generator=gen, dtype=torch.float64)
            jv = _fd_directional(model, idx, t, v)
            torch.testing.assert_close((vjp * v).sum(-1), (u * jv).sum(-1), atol=1e-6, rtol=1e-6)


def test_a_memory_reset_is_a_zero_map():
    # reset_memory_at_bos: position 4 holds a BOS, so what it reads is zeroed and m_4 does not
    # depend on m_3: that step's growth is -inf; the iteration restarts, the others are finite,
    # and the exponent is their mean
    model = make_model(CONFIGS["reset_at_bos"])
    exponent, growth = lyapunov(model, tokens(B=1, T=8))
    assert growth[4 - 1].item() == -math.inf
    others = growth[[i for i in range(7) if i != 3]]
    assert others.isfinite().all()
    torch.testing.assert_close(exponent, others.mean(0))


def test_lyapunov_refuses_a_map_with_a_longer_lag():
    with pytest.raises(ValueError, match="lag=1"):
        lyapunov(make_model(CONFIGS["source1_lag2"]), tokens(B=1, T=6))


def test_sweep_changes_agree_with_the_convergence_trace():
    # FixedPoint's residual (memory_change, what the monitor logs) against the analysis table's
    # chunked accumulation of it
    model = make_model(CONFIGS["default"])
    idx = tokens(B=3, T=6)
    changes = sweep_changes(model, idx, sweeps=7)
    per = residual_per_sweep(convergence_trace(model, idx, max_sweeps=7))
    torch.testing.assert_close(
        torch.tensor(changes, dtype=torch.float64),
        torch.tensor(per["residual"].to_numpy()[1:8]),
        rtol=1e-9,
        atol=0,
    )
    # Jacobi on a lag-1 recurrence: position t is exact after sweep t, so sweep T changes nothing
    assert changes[4] > 0 and changes[5] == changes[6] == 0  # sweeps 5, 6, 7: position 5 last


def test_the_record_is_logged_for_lag_one_models_only():
    rec = contraction_record(make_model(CONFIGS["default"]), tokens(B=2, T=6))
    assert set(rec) == {"lyap", "sweep_change_1", "sweep_change_2", "sweep_change_4"}
    assert math.isfinite(rec["lyap"])
    assert contraction_record(make_model(CONFIGS["source1_lag2"]), tokens(B=2, T=6)) == {}
    assert contraction_record(make_model(None), tokens(B=2, T=6)) == {}


def test_predicted_sweeps_follow_the_exponential():
    from lrt_lab.analysis.contraction import predicted_sweeps

    # e0 = 1 shrinking by e^-1 per sweep reaches 0.01 after ceil(ln 100) = 5 sweeps
    assert predicted_sweeps(-1.0, 1.0, 0.01) == 5
    assert predicted_sweeps(-0.5, 0.05, 0.1) == 0
    assert predicted_sweeps(0.2, 1.0, 0.1) == math.inf


def test_contraction_tables_measure_the_same_sweeps_as_the_convergence_analysis():
    from lrt_lab.analysis.contraction import contraction_tables
    from lrt_lab.analysis.convergence import sweeps_to_converge

    model = make_model(CONFIGS["default"])
    idx = tokens(B=3, T=8)
    tables = contraction_tables(model, idx, tols=(0.1,))
    row = tables["summary"].iloc[0]
    exponent, _ = lyapunov(model, idx)
    assert row["lyapunov"] == pytest.approx(float(exponent.mean()))
    assert row["lyapunov_lo"] < row["lyapunov"] < row["lyapunov_hi"]
    need = sweeps_to_converge(convergence_trace(model, idx), (0.1,), "residual")
    assert row["sweeps_by_change"] == float(need[need["position"] == "all"]["sweeps"].iloc[0])
    assert len(tables["growth"]) == 7 and tables["growth"]["log_growth"].notna().all()


def test_the_command_on_a_trained_run(tmp_path, capsys):
    from test_exactness import trained_run

    from lrt_lab.commands.analyze import main
    from lrt_lab.store.results import load_table

    run = trained_run(tmp_path)
    assert main(["contraction", str(run.path), "--n-sequences", "4", "--tols", "0.1"]) == 0
    assert "predicted_sweeps" in capsys.readouterr().out
    assert (run.path / "contraction.png").exists()
    summary = load_table(run, "contraction")
    assert summary["tol"].tolist() == [0.1] and summary["sequences"].iloc[0] == 4
    assert len(load_table(run, "contraction_growth")) == 5


def test_the_dashboard_offers_the_monitor_as_a_training_curve(tmp_path):
    from test_exactness import trained_run

    from lrt_app.store_data import curves, metric_options
    from lrt_lab.store.results import load_metrics, load_runs

    run = trained_run(tmp_path)
    df = load_runs(tmp_path)
    options = metric_options(df)
    assert {"lyap", "sweep_change_1", "sweep_change_4"} <= set(options)
    long, notes = curves(df, "lyap", "steps")
    logged = load_metrics(run, kind="eval")
    assert not notes and long["y"].tolist() == logged["lyap"].tolist()
