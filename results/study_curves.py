"""How each arm of a study learns: the metrics its contrasts read, at every evaluation, against
training time, as a seed mean with its band.

A study's verdict reads each run at its end. These curves say what that end was: a plateau, or a
point on a descent that the budget cut short (a censored outcome, which a longer budget could
reverse). They are the check a recipe pilot makes before its study runs.

    plot_learning_curves(store, study, "curves.png", run_names=names)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from lrt_lab.store.results import evaluations
from lrt_results.figures import save_figure
from lrt_results.stats import seeds_interval
from lrt_results.study import Study, arm_runs
from lrt_results.time_to_event import AXIS_TITLES

COLUMNS = ["arm", "metric", "step", "x", "mean", "low", "high", "band", "seeds"]


def learning_curves(runs, study: Study, run_names=None, x: str | None = None) -> pd.DataFrame:
    """One curve per (arm, metric) the study's contrasts read, over the arm's complete runs.

    Seeds are matched by step (a study's arms evaluate on a fixed step grid); a step counts only
    where every run of the arm evaluated it, and its x is the runs' mean there (x: the study's
    time axis unless given). mean/low/high follow lrt_results.stats.seeds_interval, named in
    `band`. A non-primary metric whose curve equals the primary one of the same arm (a
    transformer's parallel forward is its exact decoding) is left out."""
    x = x or study.time_axis
    wanted = dict.fromkeys((arm, c.metric) for c in study.contrasts for arm in (c.a, c.b))
    by_arm = arm_runs(runs, study, run_names)
    curves = {}
    for arm, metric in wanted:
        evals = evaluations(by_arm[arm], metric, x)
        if evals.empty:
            continue
        wide = evals.pivot_table(index="step", columns="run", values="value", aggfunc="last")
        wide = wide.dropna()
        if wide.empty:
            continue
        at = evals.groupby("step")["x"].mean().loc[wide.index]
        mean, low, high, band = seeds_interval(wide.to_numpy().T)
        curves[arm, metric] = pd.DataFrame(
            {
                "arm": arm,
                "metric": metric,
                "step": wide.index.to_numpy(),
                "x": at.to_numpy(),
                "mean": mean,
                "low": low,
                "high": high,
                "band": band,
                "seeds": wide.shape[1],
            }
        )
    keep = [
        c
        for (arm, metric), c in curves.items()
        if metric == study.primary
        or (arm, study.primary) not in curves
        or not _same_curve(c, curves[arm, study.primary])
    ]
    return pd.concat(keep, ignore_index=True) if keep else pd.DataFrame(columns=COLUMNS)


def _same_curve(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    return len(a) == len(b) and np.allclose(a["mean"].to_numpy(), b["mean"].to_numpy())


def plot_learning_curves(runs, study: Study, path, run_names=None) -> Path | None:
    """learning_curves drawn one colour per arm: the primary metric solid, any other metric a
    contrast reads dashed, log y when every value is positive; None (nothing written) when no arm
    has an evaluation yet."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = learning_curves(runs, study, run_names)
    if curves.empty:
        return None
    fig, ax = plt.subplots(figsize=(9, 4.2))
    colors = {arm: f"C{i % 10}" for i, arm in enumerate(dict.fromkeys(curves["arm"]))}
    for (arm, metric), c in curves.groupby(["arm", "metric"], sort=False):
        style = "-" if metric == study.primary else "--"
        seeds = int(c["seeds"].iloc[0])
        label = f"{arm}, {metric} ({seeds} seed{'s' if seeds != 1 else ''})"
        ax.plot(c["x"], c["mean"], style, color=colors[arm], marker="o", ms=3, label=label)
        ax.fill_between(c["x"], c["low"], c["high"], color=colors[arm], alpha=0.12)
    if (curves[["mean", "low"]].to_numpy() > 0).all():
        from matplotlib.ticker import FormatStrFormatter

        ax.set_yscale("log")  # learning shows as a slope over orders of magnitude
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis(FormatStrFormatter("%g"))
    bands = ", ".join(sorted(set(curves["band"]) - {"none"})) or "one seed: no band"
    ax.set_xlabel(AXIS_TITLES[study.time_axis])
    ax.set_ylabel("at each evaluation (seed mean)")
    ax.set_title(f"{study.primary} and the contrasts' other metrics; band: {bands}", fontsize=9)
    ax.grid(True, alpha=0.3)
    # beside the plot, not on it: four arms' curves end where an inside legend would sit
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return save_figure(fig, path)
