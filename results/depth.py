"""How much depth is the memory worth: pos@90 of plain transformers of growing depth versus an
LRT at a fixed depth, on one task (driven by a sweep spec, e.g. experiments/depth_sweep.toml).

    lrt-lab sweep experiments/depth_sweep.toml          # transformers at depths 1..D, an LRT at
    depth d
    tables = analyze_depth_sweep("runs/depth")           # .analysis/tables/depth_sweep.csv,
    depth_worth.csv
    fig = plot_depth_curve(tables["depth_sweep"])

depth_worth: for each LRT configuration, the smallest transformer depth whose mean pos@90 (over
seeds) reaches the LRT's mean pos@90 (NaN when no swept depth does: the memory is worth more
depth than the sweep covers), and, for each requested target pos@90, the smallest transformer
depth reaching it next to whether the LRT reaches it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lrt_lab.store.folders import write_store_table
from lrt_lab.store.results import load_runs
from lrt_lab.store.run_groups import default_metric
from lrt_results.stats import method_column, seed_stats

DEPTH = "config.model.n_layer"
TASK = "config.train.task"


def depth_table(
    df: pd.DataFrame, metric: str | None = None, confidence: float = 0.95
) -> pd.DataFrame:
    """Mean, std, CI over seeds of `metric` (default: the first summary.eval.pos90_exact@L column)
    per (task, method, depth)."""
    if df.empty:
        raise ValueError("df is empty; allowed: load_runs of a store with complete runs")
    metric = metric or default_metric(df)
    for c in (DEPTH, TASK):
        if c not in df.columns:
            raise ValueError(f"df has no {c!r} column; allowed: a load_runs table")
    df = df.copy()
    df["method"] = method_column(df)
    out = seed_stats(df, metric, [TASK, "method", DEPTH], confidence)
    out = out.rename(columns={TASK: "task", DEPTH: "n_layer"})
    out["n_layer"] = out["n_layer"].astype(int)
    out.attrs["metric"] = metric
    return out


def min_depth(table: pd.DataFrame, target: float, method: str = "transformer") -> pd.Series:
    """Per task: the smallest depth of `method` whose mean metric reaches `target` (NaN if none)."""
    out = {}
    for task, sub in table[table["method"] == method].groupby("task"):
        ok = sub[sub["mean"] >= target - 1e-9].sort_values("n_layer")
        out[task] = int(ok["n_layer"].iloc[0]) if len(ok) else math.nan
    return pd.Series(out, name=f"min_depth@{target:g}", dtype=float)


def depth_worth(table: pd.DataFrame, transformer: str = "transformer", targets=()) -> pd.DataFrame:
    """One row per non-transformer (task, method, depth): its mean metric, the smallest transformer
    depth that matches it, the transformer's metric at the same depth, and the depth saved."""
    rows = []
    for (task, method, depth), sub in table.groupby(["task", "method", "n_layer"]):
        if method == transformer:
            continue
        value = float(sub["mean"].iloc[0])
        tr = table[(table["task"] == task) & (table["method"] == transformer)].sort_values(
            "n_layer"
        )
        match = tr[tr["mean"] >= value - 1e-9]
        need = int(match["n_layer"].iloc[0]) if len(match) else math.nan
        same = tr[tr["n_layer"] == depth]["mean"]
        row = {
            "task": task,
            "method": method,
            "n_layer": depth,
            "value": value,
            "transformer_depth_to_match": need,
            "max_transformer_depth_swept": int(tr["n_layer"].max()) if len(tr) else math.nan,
            "transformer_value_same_depth": float(same.iloc[0]) if len(same) else math.nan,
            "depth_saved": need - depth
            if not (isinstance(need, float) and math.isnan(need))
            else math.nan,
        }
        for target in targets:
            md = min_depth(table, target, transformer).get(task, math.nan)
            row[f"transformer_min_depth@{target:g}"] = md
            row[f"reaches@{target:g}"] = bool(value >= target - 1e-9)
        rows.append(row)
    out = pd.DataFrame(rows)
    out.attrs["metric"] = table.attrs.get("metric")
    return out


def analyze_depth_sweep(store, metric: str | None = None, targets=(), write: bool = True) -> dict:
    """load_runs(store) -> depth_sweep (per task/method/depth stats) and depth_worth tables, written
    to <store>/.analysis/tables/ when write=True. Returns {name: DataFrame}."""
    table = depth_table(load_runs(store), metric)
    tables = {"depth_sweep": table, "depth_worth": depth_worth(table, targets=targets)}
    if write:
        for name, t in tables.items():
            t = t.copy()
            t["metric"] = table.attrs["metric"]
            write_store_table(store, name, t)
    return tables


def plot_depth_curve(
    table: pd.DataFrame, transformer: str = "transformer", ax=None, title: str | None = None
):
    """Transformer metric vs depth (mean, CI bars) with each LRT as a marker at its own depth and a
    dashed line at its level; returns the Figure."""
    import matplotlib.pyplot as plt

    if table.empty:
        raise ValueError("table is empty; allowed: the output of depth_table")
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(5, 3.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, ((task, method), sub) in enumerate(table.groupby(["task", "method"])):
        sub = sub.sort_values("n_layer")
        c = colors[i % len(colors)]
        lo = (sub["mean"] - sub["ci_low"]).fillna(0).clip(lower=0)
        hi = (sub["ci_high"] - sub["mean"]).fillna(0).clip(lower=0)
        label = method if table["task"].nunique() == 1 else f"{task}: {method}"
        if method == transformer:
            ax.errorbar(
                sub["n_layer"],
                sub["mean"],
                yerr=[lo, hi],
                marker="o",
                color=c,
                capsize=3,
                label=label,
            )
        else:
            ax.errorbar(
                sub["n_layer"],
                sub["mean"],
                yerr=[lo, hi],
                marker="*",
                ms=12,
                ls="none",
                color=c,
                capsize=3,
                label=label,
            )
            for v in sub["mean"]:
                ax.axhline(v, ls="--", color=c, lw=1)
    ax.set_xticks(np.unique(table["n_layer"]))
    ax.set_xlabel("depth (layers)")
    ax.set_ylabel(table.attrs.get("metric") or "metric")
    ax.set_title(title or "how much depth is the memory worth")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
