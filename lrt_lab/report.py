"""Tables for the terminal: one run's figures, and a paper-style comparison across runs."""

from __future__ import annotations

import math
import re

import pandas as pd

from .results import Run, load_runs


def method_label(row) -> str:
    """`transformer`, `lrt interleaved:2`, `loop:3`, ...: what was trained and how."""
    kind = row.get("config.kind", "?")
    sched = row.get("config.schedule", "onepass")
    return kind if sched == "onepass" and kind != "lrt" else f"{kind} {sched}"


def memory_label(row) -> str:
    """Which memory preset and which initialisation an LRT run used; "-" for a model without memory.
    Runs made before presets existed built MemoryConfig's defaults, i.e. the "paper" preset."""
    if row.get("config.kind") != "lrt":
        return "-"
    preset = row.get("config.train.memory_preset")
    preset = "paper" if not isinstance(preset, str) else preset
    g, rec = row.get("config.model.memory.gamma_init"), row.get("config.model.memory.rec_init")
    if g == 0 and rec == "zero":
        init = "start-as-transformer init (gamma 0, zero W_rec)"
    elif g == 0.1 and rec == "uniform":
        init = "paper init (gamma 0.1, uniform W_rec)"
    else:
        init = f"init gamma {g}, {rec} W_rec"
    return f"{preset} preset, {init}"


def eval_columns(df: pd.DataFrame, prefix: str = "summary.eval.") -> list[str]:
    return sorted((c for c in df.columns if c.startswith(prefix)), key=_length_key)


def _length_key(col: str):
    m = re.search(r"(.*)@(\d+)$", col)
    return (m.group(1), int(m.group(2))) if m else (col, 0)


def default_metric(df: pd.DataFrame) -> str:
    cols = [c for c in eval_columns(df) if "pos90_exact@" in c]
    if not cols:
        raise ValueError("metric: the store has no pos90_exact columns; pass --metric with a summary column")
    return cols[0]


def comparison_table(df: pd.DataFrame, metric: str | None = None, group_by: str = "method") -> pd.DataFrame:
    """Mean +- std over seeds of `metric` per method (or per the given columns)."""
    if df.empty:
        raise ValueError("runs: the store has no complete runs")
    df = df.copy()
    df["method"] = df.apply(method_label, axis=1)
    df["memory"] = df.apply(memory_label, axis=1)
    metric = metric or default_metric(df)
    if metric not in df.columns:
        raise ValueError(f"metric={metric!r} is invalid; allowed: {', '.join(eval_columns(df)) or 'summary.* columns'}")
    keys = [k.strip() for k in group_by.split(",")]
    for k in keys:
        if k not in df.columns:
            raise ValueError(f"group_by={k!r} is invalid; allowed: method or a column of load_runs")
    if "config.train.task" in df.columns and "config.train.task" not in keys:
        keys = ["config.train.task"] + keys
    if "method" in keys and "memory" not in keys:  # every table says which preset and init it used
        keys.insert(keys.index("method") + 1, "memory")
    agg = df.groupby(keys, dropna=False).agg(
        n=(metric, "count"), mean=(metric, "mean"), std=(metric, "std"),
        forwards_per_token=("config.forwards_per_token", "first"),
        cost=("summary.schedule_cost", "first"),  # schedule x the model's own forward_cost (loops, ponder)
        wall_time_s=("summary.wall_time_s", "mean"),
    ).reset_index()
    agg.attrs["metric"] = metric
    return agg


def format_mean_std(mean: float, std: float) -> str:
    if std is None or (isinstance(std, float) and math.isnan(std)):
        return f"{mean:.3g}"
    return f"{mean:.3g} +- {std:.2g}"


def print_report(root, metric: str | None = None, group_by: str = "method") -> pd.DataFrame:
    table = comparison_table(load_runs(root), metric, group_by)
    shown = table.copy()
    shown[table.attrs["metric"]] = [format_mean_std(m, s) for m, s in zip(table["mean"], table["std"])]
    shown = shown.drop(columns=["mean", "std"])
    print(shown.to_string(index=False))
    return table


def run_figures(run: Run) -> pd.DataFrame:
    """pos@90 / accuracy per evaluation length and decoding mode, from summary.json."""
    ev = (run.summary or {}).get("eval", {})
    rows = {}
    for key, value in ev.items():
        m = re.match(r"(pos90|acc)_(parallel|exact)@(\d+)", key)
        if m:
            rows.setdefault(int(m.group(3)), {})[f"{m.group(1)}_{m.group(2)}"] = value
    return pd.DataFrame.from_dict(rows, orient="index").sort_index().rename_axis("length")


def print_run(run: Run) -> None:
    s = run.summary
    if s is None:
        print(f"{run.name}: incomplete (resume with --resume)")
        return
    print(f"\n{run.name}: loss {s['final_loss']:.4f}, {s['wall_time_s']:.0f} s, {s['tokens']:,} tokens "
          f"(x{s['schedule_cost']:g} compute)")
    print(run_figures(run).to_string())
    print(f"run folder: {run.path}")
