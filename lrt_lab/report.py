"""Tables for the terminal: one run's figures, and a paper-style comparison across runs."""

from __future__ import annotations

import math
import re

import pandas as pd

from .analysis.stats import seed_stats
from .groups import (AT_TRAIN_LENGTH, INTERVAL_NOTE, default_metric, eval_columns, group_labels,
                     method_label, with_train_length_metric)
from .results import Run, load_runs

__all__ = ["comparison_table", "default_metric", "format_mean_ci", "format_mean_std", "frontier_points",
           "memory_label", "method_label", "model_label", "print_report", "print_run", "run_figures",
           "supervised_every"]


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


def model_label(row) -> str:
    """`transformer (4 layers)`, `lrt exact (4 layers)`; for an LRT, what differs from the paper
    preset's memory: `lrt exact (4 layers, memory from block 4, normed)`, or `released preset`."""
    text = f"{method_label(row)} ({int(row['config.model.n_layer'])} layers"
    if row.get("config.kind") == "lrt" and row.get("config.train.memory_preset") == "released":
        text += ", released preset"
    elif row.get("config.kind") == "lrt":
        src = row.get("config.model.memory.source_layer")
        if src is not None and not pd.isna(src):
            text += f", memory from block {int(src)}"
        for field, default in (("source_tap", "resid"), ("projections", "shared")):
            value = row.get(f"config.model.memory.{field}")
            if isinstance(value, str) and value != default:  # NaN: a run from before the field
                text += f", {value}"
    return text + ")"


def supervised_every(row) -> int:
    """The task option supervise_every of a run (1: every position counts, also for runs and tasks
    without the option)."""
    k = row.get("config.train.task_options.supervise_every")
    return 1 if k is None or pd.isna(k) else int(k)


def frontier_points(df: pd.DataFrame, task: str = "a5_prefix", length: int = 16) -> pd.DataFrame:
    """One row per run of the trainer frontier: the runs of `task` trained at `length` with every
    position supervised that differ only in their trainer (the plain transformer, or an LRT of the
    paper preset and init with nothing else overridden); a trainer run for a different number of
    steps than the rest of its method is its own trainer ("lrt interleaved:2 (3000 steps)").

    Columns: trainer, seed, compute (M token-forwards the trainer ran), wall_min (the run's own
    wall clock), and pos90_exact@N / pos90_parallel@N at every evaluated length N."""
    if df.empty or "config.train.task" not in df:
        return pd.DataFrame()
    sub = df[(df["config.train.task"] == task) & (df["config.train.length"] == length)].copy()
    sub = sub[sub.apply(supervised_every, axis=1) == 1]
    plain = sub["config.kind"] == "transformer"
    model = sub.apply(model_label, axis=1)
    memory = sub.apply(memory_label, axis=1)
    n_layer = sub["config.model.n_layer"].astype(int).astype(str)
    baseline_lrt = (model == sub.apply(method_label, axis=1) + " (" + n_layer + " layers)") & \
        (memory == "paper preset, paper init (gamma 0.1, uniform W_rec)")
    sub = sub[plain | ((sub["config.kind"] == "lrt") & baseline_lrt)]
    if sub.empty:
        return pd.DataFrame()
    method = sub.apply(method_label, axis=1)
    evals = [c for c in sub.columns if c.startswith(("summary.eval.pos90_exact@", "summary.eval.pos90_parallel@"))
             and sub[c].notna().any()]
    out = pd.DataFrame({
        "trainer": method + steps_suffix(sub, method),
        "seed": sub["config.train.seed"].astype(int),
        "compute": sub["summary.compute_tokens"] / 1e6,
        "wall_min": sub["summary.wall_time_s"] / 60,
        **{c.removeprefix("summary.eval."): sub[c] for c in evals},
    })
    return out.sort_values(["compute", "trainer", "seed"]).reset_index(drop=True)


def steps_suffix(df: pd.DataFrame, by) -> pd.Series:
    """" (N steps)" for the runs whose group (rows sharing the values `by`: column names or a Series)
    mixes numbers of training steps, "" elsewhere: a run trained longer is a different config, not
    one more seed of its group."""
    mixed = df.groupby(by)["config.train.steps"].transform("nunique") > 1
    return df["config.train.steps"].map(lambda n: f" ({int(n)} steps)").where(mixed, "")


def runs_lacking(df: pd.DataFrame, metric: str) -> list[str]:
    """Names of the runs with no value for `metric`."""
    return df.loc[df[metric].isna(), "run"].tolist() if "run" in df.columns else []


def comparison_table(df: pd.DataFrame, metric: str | None = None, group_by: str | None = None) -> pd.DataFrame:
    """Mean, 95% t-interval and std over seeds of `metric` per group of runs.

    group_by None: lrt_lab.groups' rule (one group per config up to the seed, labelled by what
    differs), as in the dashboard and lrt_lab.analysis.seed_stats; or a comma list of columns
    ("method" is what was trained). The runs without a value for `metric` are listed in
    .attrs["lacking"]; metric None picks one every run has (default_metric)."""
    if df.empty:
        raise ValueError("runs: the store has no complete runs")
    df = with_train_length_metric(df)
    df["method"] = df.apply(method_label, axis=1)
    df["memory"] = df.apply(memory_label, axis=1)
    metric = metric or default_metric(df)
    if metric not in df.columns:
        raise ValueError(f"metric={metric!r} is invalid; allowed: {', '.join(eval_columns(df)) or 'summary.* columns'}")
    if group_by is None:
        df["group"] = group_labels(df)
        keys = ["group", "method"]
    else:
        keys = [k.strip() for k in group_by.split(",")]
        for k in keys:
            if k not in df.columns:
                raise ValueError(f"group_by={k!r} is invalid; allowed: method or a column of load_runs")
    table = seed_stats(df, metric, group_by=keys)
    extra = {"forwards_per_token": "config.forwards_per_token",
             "cost": "summary.schedule_cost",  # schedule x the model's own forward_cost (loops, ponder)
             "wall_time_s": "summary.wall_time_s"}
    per_group = df.groupby(keys, dropna=False).agg(
        **{name: (col, "mean" if name == "wall_time_s" else "first") for name, col in extra.items() if col in df})
    table = table.merge(per_group.reset_index(), on=keys, how="left")
    table.attrs.update(metric=metric, lacking=runs_lacking(df, metric), interval=INTERVAL_NOTE)
    return table


def format_mean_ci(mean: float, lo: float, hi: float, n: int | None = None) -> str:
    """`mean [lo, hi] (n=3)`, the README's cell; `mean (n=1)` where one seed gives no interval."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    n_text = f" (n={n})" if n is not None else ""
    if lo is None or (isinstance(lo, float) and math.isnan(lo)):
        return f"{mean:.3g}{n_text}"
    return f"{mean:.3g} [{lo:.3g}, {hi:.3g}]{n_text}"


def format_mean_std(mean: float, std: float) -> str:
    if std is None or (isinstance(std, float) and math.isnan(std)):
        return f"{mean:.3g}"
    return f"{mean:.3g} +- {std:.2g}"


def print_report(root, metric: str | None = None, group_by: str | None = None) -> pd.DataFrame:
    """Print comparison_table: one row per group, `mean [95% t-interval] (n)` and std; returns it."""
    runs = load_runs(root)
    diverged = sorted(runs.loc[runs["status"] == "diverged", "run"]) if "status" in runs else []
    table = comparison_table(runs[runs["status"] != "diverged"] if diverged else runs, metric, group_by)
    metric = table.attrs["metric"]
    keys = ["group"] if group_by is None else [k.strip() for k in group_by.split(",")]
    shown = table[keys].copy()
    for k in keys:  # names read left-aligned
        text = shown[k].astype(str)
        shown[k] = text.str.ljust(text.str.len().max())
    shown[metric] = [format_mean_ci(m, lo, hi, int(n)) for m, lo, hi, n in
                     zip(table["mean"], table["ci_low"], table["ci_high"], table["n"])]
    shown["std"] = [f"{v:.2g}" if not math.isnan(v) else "-" for v in table["std"]]
    for c in ("seeds", "forwards_per_token", "cost", "wall_time_s"):
        if c in table.columns:
            shown[c] = table[c].round(1) if c == "wall_time_s" else table[c]
    print(f"{metric}: mean [{INTERVAL_NOTE}] (n seeds); std: sample standard deviation over seeds")
    print(shown.to_string(index=False))
    if table.attrs["lacking"]:
        print(f"\n{len(table.attrs['lacking'])} run(s) have no {metric} and are not counted: "
              + ", ".join(table.attrs["lacking"]))
    if diverged:
        print(f"\n{len(diverged)} run(s) diverged (NaN or inf loss; summary.json status 'diverged') and are not "
              "counted: " + ", ".join(diverged))
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
