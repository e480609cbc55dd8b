"""Does the memory map contract, and does that predict the sweeps a fixed-point trainer needs?

The monitor (`lrt_lab.run.contraction_monitor`, logged at every evaluation) estimates lambda, the
largest Lyapunov exponent of m_(t-1) -> m_t along held-out data. Jacobi sweeps propagate the init
pass's memory error through the same maps, one position per sweep: after k sweeps the error at t is
roughly J_t ... J_(t-k+1) e_0, so it shrinks like exp(lambda k) when lambda < 0. The predicted
sweeps to a relative tolerance tol are then ceil(log(tol / e_0) / lambda), e_0 the init pass's
relative memory error; `contraction_run` sets that beside the sweeps measured by the convergence
analysis (FixedPoint's stopping rule: the change between sweeps; and the error to exact).
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from lrt_lab.analysis.convergence import convergence_trace, sweeps_to_converge
from lrt_lab.analysis.exactness import table_name
from lrt_lab.analysis.loading import as_run, eval_batch, load_model, load_task
from lrt_lab.core.plugins import provided
from lrt_lab.run.contraction_monitor import lyapunov


def predicted_sweeps(exponent: float, initial_error: float, tol: float) -> float:
    """Sweeps for an error `initial_error` shrinking by exp(exponent) per sweep to reach tol: 0 if
    already there, inf when the map does not contract (exponent >= 0)."""
    if initial_error <= tol:
        return 0.0
    if not exponent < 0:
        return math.inf
    return float(math.ceil(math.log(tol / initial_error) / exponent))


def contraction_tables(
    model, inputs: torch.Tensor, tols=(0.1, 0.01), n_starts: int = 1
) -> dict[str, pd.DataFrame]:
    """{"growth": per position (mean and SD over sequences of the log growth of step t),
    "summary": one row per tolerance (the exponent with its 95% interval over sequences, e_0,
    the predicted sweeps, and the sweeps measured: by the change between sweeps, FixedPoint's
    rule, and by the error to exact decoding's memory)}."""
    exponent, growth = lyapunov(model, inputs, n_starts=n_starts)
    finite = growth.masked_fill(~growth.isfinite(), float("nan"))
    per_position = pd.DataFrame(
        {
            "position": range(1, inputs.size(1)),
            "log_growth": finite.nanmean(1).numpy(),
            "sd": pd.DataFrame(finite.numpy()).std(axis=1).to_numpy(),
        }
    )
    # the t-interval is statistics: lrt_results.stats.mean_ci, found through the entry point
    ci = provided("mean_ci")(
        exponent.numpy()
    )  # over sequences; a NaN (no step within a document) dropped
    trace = convergence_trace(model, inputs)
    e0 = float(trace[trace["sweep"] == 0]["error"].max())
    rows = []
    for tol in tols:
        by = {m: sweeps_to_converge(trace, (tol,), m) for m in ("residual", "error")}
        rows.append(
            {
                "lyapunov": ci["mean"],
                "lyapunov_lo": ci["ci_low"],
                "lyapunov_hi": ci["ci_high"],
                "sequences": ci["n"],
                "initial_error": e0,
                "tol": tol,
                "predicted_sweeps": predicted_sweeps(ci["mean"], e0, tol),
                "sweeps_by_change": _all(by["residual"]),
                "sweeps_by_error": _all(by["error"]),
                "length": inputs.size(1),
            }
        )
    return {"growth": per_position, "summary": pd.DataFrame(rows)}


def _all(need: pd.DataFrame) -> float:
    return float(need[need["position"] == "all"]["sweeps"].iloc[0])


def plot_contraction(tables: dict, history: pd.DataFrame | None = None, title: str | None = None):
    """Left: the log growth of each step along the sequence (0: neutral; below: contracting).
    Right: the exponent logged at each evaluation during training, when the run logged it."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4))
    g = tables["growth"]
    a.plot(g["position"], g["log_growth"], "o-", ms=2.5)
    a.fill_between(g["position"], g["log_growth"] - g["sd"], g["log_growth"] + g["sd"], alpha=0.2)
    a.axhline(0, color="grey", lw=0.7, ls=":")
    a.set(xlabel="position t (the map m_(t-1) -> m_t)", ylabel="log growth (nats)")
    a.set_title("contraction along the sequence (mean +- SD over sequences)", fontsize=9)
    if history is not None and not history.empty:
        b.plot(history["step"], history["lyap"], "o-", ms=3)
        b.axhline(0, color="grey", lw=0.7, ls=":")
    else:
        b.text(0.5, 0.5, "not logged: the run predates the monitor", ha="center", va="center")
        b.set(xticks=[], yticks=[])
    b.set(xlabel="training step", ylabel="Lyapunov exponent (nats / position)")
    b.set_title("the monitor during training", fontsize=9)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def contraction_run(
    run,
    n_sequences: int = 16,
    length: int | None = None,
    tols=(0.1, 0.01),
    write: bool = True,
    eval_seed: int = 1,
) -> dict[str, pd.DataFrame]:
    """contraction_tables on a trained run (latest checkpoint) and a held-out batch of its task,
    plus "history": the monitor's values from the run's evaluation lines (empty for a run trained
    before the monitor existed). Writes tables/contraction.csv (the summary) and
    tables/contraction_growth.csv when write=True (`_L<T>` after the stem at another length than
    the training length)."""
    run = as_run(run)
    model = load_model(run)
    T = length or run.config["train"]["length"]
    batch = eval_batch(load_task(run), T, n_sequences, seed=eval_seed)
    tables = contraction_tables(model, batch.inputs, tols)
    evals = [r for r in run.metrics_records(kind="eval") if "lyap" in r]
    keys = ["step", "lyap", "sweep_change_1", "sweep_change_2", "sweep_change_4"]
    tables["history"] = pd.DataFrame([{k: r.get(k) for k in keys} for r in evals], columns=keys)
    for t in tables.values():
        t.insert(0, "run", run.name)
    if write:
        run.write_table(table_name("contraction", run, T), tables["summary"])
        run.write_table(table_name("contraction_growth", run, T), tables["growth"])
    return tables
