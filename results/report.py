"""Tables for the terminal: a paper-style comparison across runs (one run's figures:
lrt_lab.store.run_summary, re-exported here)."""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap

import pandas as pd

from lrt_lab.store.markdown import markdown_lines
from lrt_lab.store.metrics import LN2, TEXT_TASKS, bounds
from lrt_lab.store.results import first_names, load_runs, load_table
from lrt_lab.store.run_groups import (
    INTERVAL_NOTE,
    _unset,
    canonical,
    default_metric,
    eval_columns,
    group_labels,
    method_keys,
    method_label,
    method_labels,
    one_run_per_seed,
    seed_groups,
    with_train_length_metric,
)
from lrt_lab.store.run_summary import memory_label, model_label, print_run, run_figures
from lrt_results.stats import mean_ci, seed_stats

__all__ = [
    "compare_table",
    "comparison_table",
    "default_metric",
    "format_mean_ci",
    "format_mean_std",
    "frontier_points",
    "memory_label",
    "method_keys",
    "method_label",
    "method_labels",
    "model_label",
    "print_report",
    "print_run",
    "run_figures",
    "studies_by_recency",
    "supervised_every",
]


def supervised_every(row) -> int:
    """The task option supervise_every of a run (1: every position counts, also for runs and tasks
    without the option)."""
    k = row.get("config.train.task_options.supervise_every")
    return 1 if k is None or pd.isna(k) else int(k)


def frontier_points(df: pd.DataFrame, task: str = "a5_prefix", length: int = 16) -> pd.DataFrame:
    """One row per run of the trainer frontier: the runs of `task` trained at `length` with every
    position supervised that differ only in their trainer (the plain transformer, or an LRT of the
    paper preset and init with nothing else overridden), one run per seed of a group; a trainer
    run for a different number of steps, or with another recipe, than the rest of its method is
    its own trainer, named as every view names its group (run_groups.seed_groups: "lrt
    interleaved:2 | steps=3000").

    Columns: trainer, run (its name), seed, compute (M token-forwards the trainer ran), wall_min
    (the run's own wall clock), final_loss (training), and pos90_exact@N / pos90_parallel@N,
    ce_exact@N / ce_parallel@N at every evaluated length N (a byte-level text task: bpb_exact@N /
    bpb_parallel@N too, its figure)."""
    if df.empty or "config.train.task" not in df:
        return pd.DataFrame()
    sub = df[(df["config.train.task"] == task) & (df["config.train.length"] == length)].copy()
    sub = sub[sub.apply(supervised_every, axis=1) == 1]
    plain = sub["config.kind"] == "transformer"
    model = sub.apply(model_label, axis=1)
    memory = sub.apply(memory_label, axis=1)
    n_layer = sub["config.model.n_layer"].astype(int).astype(str)
    baseline_lrt = (model == sub.apply(method_label, axis=1) + " (" + n_layer + " layers)") & (
        memory == "paper preset, paper init (gamma 0.1, uniform W_rec)"
    )
    sub = sub[plain | ((sub["config.kind"] == "lrt") & baseline_lrt)]
    if sub.empty:
        return pd.DataFrame()
    sub = one_run_per_seed(sub)  # a seed run twice is one point
    # the one name per group (run_groups.seed_groups), against the runs of the frontier's study
    trainer = seed_groups(
        df[(df["config.train.task"] == task) & (df["config.train.length"] == length)]
    )["group"].loc[sub.index]
    evals = [
        c
        for c in sub.columns
        if c.startswith(
            (
                "summary.eval.pos90_exact@",
                "summary.eval.pos90_parallel@",
                "summary.eval.ce_exact@",
                "summary.eval.ce_parallel@",
            )
        )
        and sub[c].notna().any()
    ]
    # a byte-level text task is read by bits per byte (its pos@90 is 0 for every run)
    bpb = {
        "bpb" + c.removeprefix("summary.eval.ce"): sub[c] / LN2
        for c in evals
        if task in TEXT_TASKS and c.startswith("summary.eval.ce_")
    }
    out = pd.DataFrame(
        {
            "trainer": trainer,
            "run": sub["run"] if "run" in sub else sub.index.map(str),
            "seed": sub["config.train.seed"].astype(int),
            "compute": sub["summary.compute_tokens"] / 1e6,
            "wall_min": sub["summary.wall_time_s"] / 60,
            "final_loss": sub["summary.final_loss"],
            **{c.removeprefix("summary.eval."): sub[c] for c in evals},
            **bpb,
        }
    )
    return out.sort_values(["compute", "trainer", "seed"]).reset_index(drop=True)


def steps_suffix(df: pd.DataFrame, by) -> pd.Series:
    """ " (N steps)" for the runs whose group (rows sharing the values `by`: column names or a
    Series)
    mixes numbers of training steps, "" elsewhere: a run trained longer is a different config, not
    one more seed of its group."""
    mixed = df.groupby(by)["config.train.steps"].transform("nunique") > 1
    return df["config.train.steps"].map(lambda n: f" ({int(n)} steps)").where(mixed, "")


# training options a frontier's runs may differ in besides their trainer and steps: a learning
# rate, a warm-down or a curriculum of its own makes another recipe, not one more seed
RECIPE_FIELDS = {
    "config.train.matrix_lr": "Muon",
    "config.train.warmdown_frac": "warm-down",
    "config.train.task_options.curriculum_steps": "curriculum",
}


def recipe_suffix(df: pd.DataFrame, by) -> pd.Series:
    """ " (Muon 0.04, curriculum 200)" for the runs whose group (rows sharing the values `by`)
    mixes values of a RECIPE_FIELDS option, naming each option that is mixed; "" elsewhere."""
    by = by.astype(str) + df["config.train.steps"].astype(str) if isinstance(by, pd.Series) else by
    parts = pd.Series([[] for _ in range(len(df))], index=df.index, dtype=object)
    for field, name in RECIPE_FIELDS.items():
        if field not in df.columns:
            continue
        mixed = df.groupby(by)[field].transform("nunique") > 1
        for i in df.index[mixed]:
            parts[i] = [*parts[i], f"{name} {df.at[i, field]:g}"]
    return parts.map(lambda p: f" ({', '.join(p)})" if p else "")


def runs_lacking(df: pd.DataFrame, metric: str) -> list[str]:
    """Names of the runs with no value for `metric`."""
    return df.loc[df[metric].isna(), "run"].tolist() if "run" in df.columns else []


def comparison_table(
    df: pd.DataFrame, metric: str | None = None, group_by: str | None = None
) -> pd.DataFrame:
    """Mean, 95% t-interval and std over seeds of `metric` per group of runs.

    group_by None: lrt_lab.store.run_groups' rule (one group per config up to the seed, labelled by
    what differs), as in the dashboard and lrt_lab.analysis.seed_stats; or a comma list of columns
    ("method" is what was trained). The runs without a value for `metric` are listed in
    .attrs["lacking"]; metric None picks one every run has (default_metric)."""
    if df.empty:
        raise ValueError("runs: the store has no complete runs")
    df = with_train_length_metric(df)
    df["method"] = df.apply(method_label, axis=1)
    df["memory"] = df.apply(memory_label, axis=1)
    metric = metric or default_metric(df)
    if metric not in df.columns:
        raise ValueError(
            f"metric={metric!r} is invalid; allowed: "
            f"{', '.join(eval_columns(df)) or 'summary.* columns'}"
        )
    if group_by is None:
        df = one_run_per_seed(df)
        df["group"] = method_labels(df)
        keys = ["group", "method"]
    else:
        keys = [k.strip() for k in group_by.split(",")]
        for k in keys:
            if k not in df.columns:
                raise ValueError(
                    f"group_by={k!r} is invalid; allowed: method or a column of load_runs"
                )
    table = seed_stats(df, metric, group_by=keys)
    extra = {
        "forwards_per_token": "config.forwards_per_token",
        "cost": "summary.schedule_cost",  # schedule x the model's own forward_cost (loops, ponder)
        "wall_time_s": "summary.wall_time_s",
    }
    per_group = df.groupby(keys, dropna=False).agg(
        **{
            name: (col, "mean" if name == "wall_time_s" else "first")
            for name, col in extra.items()
            if col in df
        }
    )
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


# `lrt-lab report`: one table per study (a task at a training length), its metric chosen by the
# task, its rows labelled by what tells them apart -------------------------------------------------
# Byte-level text tasks: their figure is bits per byte (lrt_tasks names them; lrt_lab imports no
# task code). Every other task is scored by pos@90, the state-tracking figure.
FORMATS = ("table", "md", "csv")
METRIC_DIGITS = 4  # significant digits of a mean, interval bound or std in the table and md
WALL_DIGITS = 3
WIDTH = 100  # the prose of a table report wraps here (the table's rows do not)
CSV_COLUMNS = (
    "task",
    "length",
    "group",
    "metric",
    "mean",
    "ci_low",
    "ci_high",
    "std",
    "n",
    "seeds",
    "cost",
    "forwards_per_token",
    "wall_time_s",
    "clipped",
)
LEGEND = (
    f"Cells: mean [{INTERVAL_NOTE}]; n: seeds; std: their sample standard deviation;",
    "cost: training forwards per token relative to one pass; wall s: mean seconds per run;",
    "*: the t-interval reached outside the metric's range and is clipped to it (a normal",
    "approximation that a few seeds of a bounded metric do not support).",
)


def metric_range(name: str, column: str | None, length: int) -> tuple:
    """The range a study metric cannot leave (lrt_lab.store.metrics): pos@90 at length n in
    [0, n], bits per byte or token >= 0, a summary column as the metric table says."""
    if name.startswith("pos@90"):
        return (0.0, float(length))
    if name.startswith(("BPB", "bits/")):
        return (0.0, None)
    return bounds(column) if column else (None, None)


def format_number(value, digits: int = METRIC_DIGITS) -> str:
    """`digits` significant digits without an exponent and without trailing zeros: 7.333, 2.37,
    14, 12345, 0.000123; "-" for a missing value."""
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    if magnitude >= digits - 1:
        return f"{value:.0f}"
    text = f"{value:.{digits - 1 - magnitude}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _format_interval(mean, lo, hi) -> str:
    if _unset(mean):
        return "-"
    if _unset(lo) or _unset(hi):
        return format_number(mean)
    return f"{format_number(mean)} [{format_number(lo)}, {format_number(hi)}]"


def _value(text: str):
    """A --where value as JSON (16, 0.1, true, null, [16, 32]) or else the plain string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def where_column(df: pd.DataFrame, field: str) -> str:
    """The config column a --where FIELD names: `train.length` or `config.train.length`, or a name
    only one config column ends with (`n_layer`)."""
    columns = [c for c in df.columns if c.startswith("config.")]
    full = field if field.startswith("config.") else f"config.{field}"
    if full in columns:
        return full
    ending = [c for c in columns if c.endswith(f".{field}")]
    # what a run is (its model, its training) before what repeats it (overrides, parameter counts)
    primary = [c for c in ending if not c.startswith(("config.train.overrides.", "config.params."))]
    if len(ending) == 1 or len(primary) == 1:
        return (primary or ending)[0]
    examples = ", ".join(
        c.removeprefix("config.")
        for c in ("config.train.task", "config.train.length", "config.kind", "config.schedule")
        if c in columns
    )
    if ending:
        raise ValueError(
            f"--where {field!r} is ambiguous: "
            f"{', '.join(c.removeprefix('config.') for c in ending)}; allowed: one of them in full"
        )
    raise ValueError(
        f"--where {field!r} is invalid: no run's config has that field; allowed: a config field "
        f"such as {examples or 'train.length'}, model.n_layer, train.task_options.group"
    )


def _matches(cell, wanted) -> bool:
    cell, wanted = canonical(cell), canonical(wanted)
    if cell == wanted:
        return True
    if isinstance(cell, str) and not isinstance(wanted, str):  # a list, stored as its JSON text
        try:
            return json.loads(cell) == wanted
        except json.JSONDecodeError:
            return False
    return str(cell) == str(wanted)


def filter_runs(df: pd.DataFrame, task=None, where=(), prefix: str | None = None) -> pd.DataFrame:
    """The runs of `df` that are of `task` (a name or a list of names), whose config has every
    FIELD=VALUE of `where` (`train.length=16`, `kind=lrt`, `model.n_layer=4`, `schedule=exact`;
    `null` for an unset field), and whose names start with `prefix`."""
    keep = pd.Series(True, index=df.index)
    if task:
        tasks = [task] if isinstance(task, str) else list(task)
        tasks = [t.strip() for item in tasks for t in item.split(",") if t.strip()]
        known = sorted(df["config.train.task"].dropna().unique()) if not df.empty else []
        unknown = [t for t in tasks if t not in known]
        if unknown:
            raise ValueError(
                f"--task {','.join(unknown)!r} is invalid: no run of the store has it; allowed: "
                f"{', '.join(known) or 'none (the store has no complete runs)'}"
            )
        keep &= df["config.train.task"].isin(tasks)
    for pair in where or ():
        field, sep, text = pair.partition("=")
        if not sep or not field.strip():
            raise ValueError(
                f"--where {pair!r} is invalid; allowed: FIELD=VALUE, e.g. train.length=16"
            )
        column = where_column(df, field.strip())
        wanted = _value(text.strip())
        keep &= df[column].map(lambda cell, w=wanted: _matches(cell, w)).astype(bool)
    if prefix:
        keep &= df["run"].str.startswith(prefix)
    return df[keep]


def _metric_column(df: pd.DataFrame, metric: str) -> str:
    for column in (metric, f"summary.eval.{metric}", f"summary.{metric}"):
        if column in df.columns:
            return column
    raise ValueError(
        f"--metric {metric!r} is invalid: no run has it; allowed: bpb, pos90, or a summary "
        f"column such as {', '.join(c.removeprefix('summary.eval.') for c in eval_columns(df)[:4])}"
        " or final_loss"
    )


def _bpb_from_tables(runs: pd.DataFrame) -> pd.Series:
    """BPB with exact decoding from each run's tables/bpb.csv (lrt-lab analyze gap writes it),
    NaN where a run has none."""
    values = {}
    for index, path in runs["path"].items():
        table = load_table(path, "bpb")
        rows = table[table["mode"] == "exact"] if table is not None and "mode" in table else None
        values[index] = float(rows["bpb"].iloc[0]) if rows is not None and len(rows) else math.nan
    return pd.Series(values, index=runs.index, dtype=float)


def study_metric(runs: pd.DataFrame, task: str, length: int, metric: str | None = None):
    """(per-run values, the metric's name, a sentence saying what it is, notes) for the runs of
    one study. Default: a byte-level text task's BPB with exact decoding at the training length
    (the evaluation's ce_exact@L / ln 2; runs from before that was recorded: their
    tables/bpb.csv), every other task's pos@90 with exact decoding at the training length."""
    notes = []
    kind = metric or ("bpb" if task in TEXT_TASKS else "pos90")
    if kind == "bpb":
        column = f"summary.eval.ce_exact@{length}"
        ce = pd.to_numeric(runs[column], errors="coerce") if column in runs else None
        values = (ce / LN2) if ce is not None else pd.Series(math.nan, index=runs.index)
        missing = values.isna() if task in TEXT_TASKS else values.isna() & False
        if missing.any():  # older runs recorded no cross-entropy: tables/bpb.csv, if analysed
            values[missing] = _bpb_from_tables(runs[missing])
            from_tables = runs.loc[missing & values.notna(), "run"].tolist()
            if from_tables:
                notes.append(
                    f"BPB of {len(from_tables)} run(s) from tables/bpb.csv (trained before the "
                    f"evaluation recorded ce_exact): {first_names(from_tables)}"
                )
        name = f"BPB exact@{length}" if task in TEXT_TASKS else f"bits/token exact@{length}"
        unit = "byte" if task in TEXT_TASKS else "token"
        what = f"bits per {unit} with exact decoding at length {length} (lower is better)"
    elif kind == "pos90":
        column = f"summary.eval.pos90_exact@{length}"
        values = runs[column] if column in runs else pd.Series(math.nan, index=runs.index)
        name = f"pos@90 exact@{length}"
        what = (
            f"pos@90, exact decoding, length {length}: last position up to which accuracy is "
            ">= 0.9 (higher is better)"
        )
    else:
        column = metric  # a column of the whole store (report_table); this study may lack it
        values = runs[column] if column in runs else pd.Series(math.nan, index=runs.index)
        name = column.removeprefix("summary.eval.").removeprefix("summary.")
        what = f"{name} (the runs' {column})"
    return pd.to_numeric(values, errors="coerce"), name, what, notes


def _group_labels(runs: pd.DataFrame, keys: pd.Series) -> pd.Series:
    """method_labels of the runs, made distinct between groups (configs up to the seed) that only
    a field no method label names tells apart (a derived or recorded field): those get what
    group_labels says of them, then a number if even that is the same."""
    labels = method_labels(runs)
    clashing = labels.groupby(labels).transform(lambda s: keys[s.index].nunique() > 1)
    for label in labels[clashing.astype(bool)].unique():
        rows = labels.index[labels == label]
        extra = group_labels(runs.loc[rows]).str.split(" | ", n=1, regex=False).str[1].fillna("")
        labels[rows] = [f"{label} | {e}" if e else label for e in extra]
    for label in labels.unique():
        rows = labels.index[labels == label]
        if keys[rows].nunique() > 1:
            number = {k: i + 1 for i, k in enumerate(dict.fromkeys(keys[rows]))}
            labels[rows] = [f"{label} #{number[k]}" for k in keys[rows]]
    return labels


def report_table(
    df: pd.DataFrame, metric: str | None = None, group_by: str | None = None
) -> pd.DataFrame:
    """One row per group of runs per study (task, training length), in the order a report prints
    them: the study's task and length, the group's label, the metric's name, its mean, 95%
    t-interval (ci_low, ci_high), std and n over seeds, the seeds, the schedule's cost, the
    model's forwards per token and the mean wall clock (s).

    group_by None: one group per method up to the seed (run_groups.seed_groups: method_keys, the
    bookkeeping options never splitting a group, a seed run twice counted once), labelled by
    method_labels (only what differs between the groups of the study); or a comma list of
    columns ("method": what was trained). metric None: each study's own (study_metric); "bpb",
    "pos90", or a summary column. attrs: notes (what a reader must know: runs without the metric,
    BPB read from tables), per study."""
    if df.empty:
        raise ValueError("runs: no complete run to report")
    df = df.copy()
    df["method"] = df.apply(method_label, axis=1)
    df["memory"] = df.apply(memory_label, axis=1)
    columns = [k.strip() for k in group_by.split(",")] if group_by else None
    for k in columns or ():
        if k not in df.columns:
            raise ValueError(f"group_by={k!r} is invalid; allowed: method or a column of load_runs")
    if metric not in (None, "bpb", "pos90"):
        metric = _metric_column(df, metric)
    rows, notes = [], {}
    task = df["config.train.task"].fillna("?").astype(str)
    length = pd.to_numeric(df["config.train.length"], errors="coerce").fillna(0).astype(int)
    for (t, n), runs in df.groupby([task, length], sort=True):
        runs = runs.dropna(axis=1, how="all")  # the fields of other tasks' runs
        values, name, what, study_notes = study_metric(runs, t, n, metric)
        study_notes += _missing_notes(runs, values, name, n)
        if columns is None:
            # the one grouping (run_groups.seed_groups): a method up to the seed and the
            # bookkeeping options, a seed run twice counted once
            runs = one_run_per_seed(runs)
            values = values[runs.index]
            for dropped, kept in runs.attrs.get("duplicates", []):
                study_notes.append(f"{dropped} repeats {kept} (same config and seed): counted once")
            keys = method_keys(runs)
            label = _group_labels(runs, keys)
        else:
            keys = runs[columns].astype(str).agg(" | ".join, axis=1)
            label = keys
        notes[(t, n)] = {"what": what, "notes": study_notes}
        low, high = metric_range(name, metric, n)
        clipped_groups = 0
        for key in sorted(set(keys), key=lambda k: label[keys == k].iloc[0]):
            members = runs[keys == key]
            row = _group_row(members, values[members.index], label[members.index[0]], (low, high))
            rows.append({"task": t, "length": n, "group": row.pop("group"), "metric": name} | row)
            clipped_groups += row["clipped"]
        if clipped_groups:
            bound = f"[{format_number(low)}, {'inf' if high is None else format_number(high)}]"
            study_notes.append(
                f"the t-interval of {clipped_groups} group(s) reached outside {name}'s range "
                f"{bound} and is clipped to it (marked *)"
            )
    table = pd.DataFrame(rows, columns=list(CSV_COLUMNS))
    table.attrs.update(notes=notes, interval=INTERVAL_NOTE)
    return table


def _missing_notes(runs: pd.DataFrame, values: pd.Series, name: str, n: int) -> list[str]:
    """What a reader must know of a study's runs that lack its metric (none, some or all)."""
    lacking = runs.loc[values.isna(), "run"].tolist()
    if len(lacking) == len(runs):
        why = (
            f": no ce_exact@{n} in their summaries and no tables/bpb.csv (lrt-lab analyze gap "
            "writes it)"
            if name.startswith("BPB")
            else ""
        )
        return [f"{name} is missing in every run of this study{why}"]
    if lacking:
        return [
            f"{len(lacking)} run(s) have no {name} and are not counted: " + first_names(lacking, 8)
        ]
    return []


def _group_row(members: pd.DataFrame, values: pd.Series, group: str, bounds: tuple) -> dict:
    """One group's figures for report_table: mean, t-interval clipped to the metric's range
    `bounds` (low, high; None: unbounded), std, n, seeds, cost and wall clock."""
    low, high = bounds
    stats = mean_ci(values)
    lo, hi = stats["ci_low"], stats["ci_high"]
    clipped = bool(
        (low is not None and lo < low) or (high is not None and hi > high)
    )  # NaN bounds compare False: no interval, nothing clipped
    if clipped:
        lo = max(lo, low) if low is not None else lo
        hi = min(hi, high) if high is not None else hi
        stats = {**stats, "ci_low": lo, "ci_high": hi}
    seeds = members.loc[values.notna(), "config.train.seed"]
    return {
        "group": group,
        "mean": stats["mean"],
        "ci_low": stats["ci_low"],
        "ci_high": stats["ci_high"],
        "std": stats["std"],
        "n": stats["n"],
        "seeds": " ".join(str(canonical(s)) for s in sorted(seeds)),
        "cost": _first(members, "summary.schedule_cost"),
        "forwards_per_token": _first(members, "config.forwards_per_token"),
        "wall_time_s": _mean(members, "summary.wall_time_s"),
        "clipped": clipped,
    }


def _first(runs: pd.DataFrame, column: str) -> float:
    return (
        float(runs[column].iloc[0]) if column in runs and runs[column].notna().any() else math.nan
    )


def _mean(runs: pd.DataFrame, column: str) -> float:
    return (
        float(pd.to_numeric(runs[column], errors="coerce").mean()) if column in runs else math.nan
    )


def _text_rows(study: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    header = ["group", study["metric"].iloc[0], "n", "std", "seeds", "cost", "wall s"]
    body = [
        [
            r.group,
            _format_interval(r.mean, r.ci_low, r.ci_high) + ("*" if r.clipped else ""),
            str(int(r.n)),
            format_number(r.std),
            r.seeds or "-",
            "-" if _unset(r.cost) else f"{r.cost:.2f}",
            format_number(r.wall_time_s, WALL_DIGITS),
        ]
        for r in study.itertuples(index=False)
    ]
    return header, body


def _aligned(header: list[str], body: list[list[str]], left=(0, 4)) -> list[str]:
    """Text columns (the label, seeds) left-aligned, figures right-aligned."""
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    return [
        "  ".join(
            cell.ljust(w) if i in left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in [header, *body]
    ]


def render_report(table: pd.DataFrame, fmt: str = "table") -> tuple[str, str]:
    """(stdout, stderr) text of a report_table: `table` (aligned text), `md` (GitHub markdown) or
    `csv` (every figure at full precision; the notes go to stderr)."""
    if fmt not in FORMATS:
        raise ValueError(f"format={fmt!r} is invalid; allowed: {', '.join(FORMATS)}")
    notes = table.attrs.get("notes", {})
    if fmt == "csv":
        import io

        text = io.StringIO()
        table.to_csv(text, index=False)
        lines = [f"{t} L{n}: {note}" for (t, n), s in notes.items() for note in s["notes"]]
        return text.getvalue(), "".join(line + "\n" for line in lines)
    out = list(LEGEND) if fmt == "table" else [f"_{' '.join(LEGEND)}_"]
    for (t, n), study in table.groupby(["task", "length"], sort=False):
        header, body = _text_rows(study)
        about = notes.get((t, n), {})
        measured = bool(study["n"].sum() > 0)  # else a table of dashes: the note says it is missing
        if fmt == "md":
            out += ["", f"### {t}, trained at length {n}", "", f"{about.get('what', '')}.", ""]
            out += markdown_lines(header, body, left=(0, 4)) if measured else []
            out += [""] * (bool(about.get("notes")) and measured)
            out += [f"- {note}" for note in about.get("notes", [])]
        else:
            out += ["", f"{t}, trained at length {n}"]
            out += textwrap.wrap(
                about.get("what", ""), WIDTH, initial_indent="  ", subsequent_indent="  "
            )
            out += _aligned(header, body) if measured else []
            for note in about.get("notes", []):
                out += textwrap.wrap(
                    note,
                    WIDTH,
                    initial_indent="  note: ",
                    subsequent_indent="    ",
                    break_on_hyphens=False,
                )
    return "\n".join(out).rstrip() + "\n", ""


def print_report(
    root,
    metric: str | None = None,
    group_by: str | None = None,
    fmt: str = "table",
    task=None,
    where=(),
    prefix: str | None = None,
) -> pd.DataFrame:
    """Print report_table over the complete runs of the store `root` that pass the filters
    (filter_runs) in `fmt` (render_report); returns the table. Diverged runs are named and left
    out."""
    runs = _store_runs(root, fmt, task, where, prefix)
    if runs.empty:
        raise ValueError("no run of the store passes the filters (--task, --where, --prefix)")
    diverged = sorted(runs.loc[runs["status"] == "diverged", "run"]) if "status" in runs else []
    if diverged and len(diverged) == len(runs):
        raise ValueError(
            f"runs: the store has no complete runs; {len(diverged)} diverged (NaN or "
            f"inf loss): {first_names(diverged)}"
        )
    table = report_table(runs[runs["status"] != "diverged"] if diverged else runs, metric, group_by)
    out, err = render_report(table, fmt)
    if diverged:
        line = (
            f"{len(diverged)} run(s) diverged (NaN or inf loss; summary.json status 'diverged') "
            f"and are not counted: {', '.join(diverged)}\n"
        )
        out, err = (out, err + line) if fmt == "csv" else (out + "\n" + line, err)
    sys.stdout.write(out)
    if err:
        sys.stderr.write(err)
    return table


SCOREBOARD_LEGEND = (
    "Training forward against exact decoding, per group of LRT runs: gap@L = cross-entropy of the",
    "schedule's parallel forward minus exact decoding's at evaluation length L (nats per token;",
    f"mean [{INTERVAL_NOTE}]); agree@L = share of positions where both pick the same token.",
)


def render_scoreboard(
    table: pd.DataFrame, fmt: str = "table", legend: bool = True, headings: bool = True
) -> str:
    """The scoreboard (lrt_results.scoreboard) as aligned text, markdown or csv: one row per
    group, the gap and agreement at each evaluation length (1x, 2x, 4x the training length).
    A page that explains the columns itself (docs/results.md, docs/scaling.md) leaves out the
    legend, and the per-task headings where it shows a single task."""
    if fmt not in FORMATS:
        raise ValueError(f"format={fmt!r} is invalid; allowed: {', '.join(FORMATS)}")
    if fmt == "csv":
        return table.to_csv(index=False)
    out = []
    if legend:
        out = list(SCOREBOARD_LEGEND) if fmt == "table" else [f"_{' '.join(SCOREBOARD_LEGEND)}_"]
    for (t, n), study in table.groupby(["task", "length"], sort=False):
        lengths = sorted(study["eval_length"].unique())
        header = ["group", "n", *(f"{k}@{L}" for L in lengths for k in ("gap", "agree"))]
        body = []
        for g, sub in study.groupby("group", sort=False):
            at = sub.set_index("eval_length")
            row = [g, str(int(sub["n"].max()))]
            for L in lengths:
                r = at.loc[L] if L in at.index else None
                row.append(
                    "-" if r is None else _format_interval(r.ce_gap, r.ce_gap_low, r.ce_gap_high)
                )
                row.append("-" if r is None or _unset(r.agreement) else f"{r.agreement:.3f}")
            body.append(row)
        title = (
            [f"### {t}, trained at length {n}", ""]
            if fmt == "md"
            else [f"{t}, trained at length {n}"]
        )
        rows = (
            markdown_lines(header, body, left=(0,))
            if fmt == "md"
            else _aligned(header, body, left=(0,))
        )
        out += [""] + (title if headings else []) + rows
    left_out = table.attrs.get("left_out", [])
    if left_out:
        note = (
            f"{len(left_out)} LRT run(s) recorded no cross-entropy of both forwards (trained "
            f"before it was recorded) and are not shown: {first_names(left_out, 4)}"
        )
        if fmt == "md":
            out += ["", f"- {note}"]
        else:
            out += [""] + textwrap.wrap(
                note, WIDTH, initial_indent="note: ", subsequent_indent="  "
            )
    if table.empty:
        out += ["", "no LRT run in the store recorded both forwards' cross-entropy"]
    return "\n".join(out).strip("\n") + "\n"


def _store_runs(root, fmt: str, task, where, prefix) -> pd.DataFrame:
    """The complete runs of the store `root` that pass the filters, after checking `fmt`; a
    store with no complete run is refused in one line."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r} is invalid; allowed: {', '.join(FORMATS)}")
    runs = load_runs(root)
    if runs.empty:
        raise ValueError(f"runs={str(root)!r}: the store has no complete runs")
    return filter_runs(runs, task, where, prefix)


def print_scoreboard(
    root, fmt: str = "table", task=None, where=(), prefix: str | None = None
) -> pd.DataFrame:
    """Print the scoreboard of the complete runs of the store `root` that pass the filters."""
    from lrt_results.scoreboard import scoreboard

    runs = _store_runs(root, fmt, task, where, prefix)
    if "status" in runs:
        runs = runs[runs["status"] != "diverged"]
    table = scoreboard(runs)
    sys.stdout.write(render_scoreboard(table, fmt))
    return table


# The evaluation lengths a study compares, as multiples of its training length.
LENGTH_MULTIPLES = (1, 2, 4)
COMPARE_METRICS = ("pos90_exact", "pos90_parallel")
# a byte-level text task's figures: bits per byte (its pos@90 is 0 for every run: no model of
# text is 90% right at every position)
TEXT_COMPARE_METRICS = ("bpb_exact", "bpb_parallel")


def compare_metrics(task: str | None) -> tuple[str, str]:
    """The figures a study's comparison shows per decoding: BPB for a byte-level text task,
    pos@90 for every other task."""
    return TEXT_COMPARE_METRICS if task in TEXT_TASKS else COMPARE_METRICS


def figure_column(runs: pd.DataFrame, name: str) -> pd.Series:
    """A figure per run: summary.eval.NAME, where `bpb_<mode>@N` is ce_<mode>@N / ln 2 (NaN where
    a run did not measure it)."""
    if name.startswith("bpb_"):
        ce = figure_column(runs, "ce_" + name[len("bpb_") :])
        return ce / LN2
    column = f"summary.eval.{name}"
    if column not in runs:
        return pd.Series(math.nan, index=runs.index)
    return pd.to_numeric(runs[column], errors="coerce")


def study_runs(df: pd.DataFrame, task: str, length: int) -> pd.DataFrame:
    if df.empty or "config.train.task" not in df or "config.train.length" not in df:
        return df.iloc[:0]
    return df[(df["config.train.task"] == task) & (df["config.train.length"] == length)]


def compare_lengths(df: pd.DataFrame, length: int, metrics=COMPARE_METRICS) -> list[int]:
    """The evaluation lengths at 1x / 2x / 4x the training length that some run of `df` measured
    (a figure of `metrics`: compare_metrics of the study's task)."""
    return [
        m * length
        for m in LENGTH_MULTIPLES
        if any(figure_column(df, f"{metric}@{m * length}").notna().any() for metric in metrics)
    ]


def compare_table(df: pd.DataFrame, task: str, length: int) -> pd.DataFrame:
    """One row per method (method_labels) of the runs of `task` trained at `length`, cheapest first.

    Columns: method, n (runs), seeds (sorted), then for each figure F: F.mean, F.ci_low, F.ci_high
    (the 95% t-interval over seeds of lrt_results.stats.mean_ci, NaN for one seed) and
    F.per_seed (a tuple in the order of `seeds`). The figures: pos90_exact@N and pos90_parallel@N at
    every length of compare_lengths (a byte-level text task: bpb_exact@N and bpb_parallel@N
    instead, compare_metrics), acc_exact@L and acc_parallel@L at the training length L,
    compute (M token-forwards the trainer ran) and wall_min (each run's wall clock, minutes).
    One run per seed of a method (run_groups.one_run_per_seed)."""

    runs = study_runs(df, task, length)
    if runs.empty:
        return pd.DataFrame()
    runs = one_run_per_seed(runs)
    runs = runs.assign(_method=method_labels(runs)).sort_values("config.train.seed")
    figures = _compare_figures(runs, length, compare_metrics(task))
    rows = []
    for method, sub in runs.groupby("_method", sort=False):
        row = {
            "method": method,
            "n": len(sub),
            "seeds": tuple(int(s) for s in sub["config.train.seed"]),
        }
        for name, values in figures.items():
            per_seed = values[sub.index]
            stats = mean_ci(per_seed)
            row |= {
                f"{name}.mean": stats["mean"],
                f"{name}.ci_low": stats["ci_low"],
                f"{name}.ci_high": stats["ci_high"],
                f"{name}.per_seed": tuple(per_seed.tolist()),
            }
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["compute.mean", "method"]).reset_index(drop=True)


def _compare_figures(runs: pd.DataFrame, length: int, metrics=COMPARE_METRICS) -> dict:
    """figure name -> its value per run (NaN where a run did not measure it)."""

    def column(name: str) -> pd.Series:
        if name not in runs:
            return pd.Series(math.nan, index=runs.index)
        return pd.to_numeric(runs[name], errors="coerce")

    figures = {
        f"{metric}@{n}": figure_column(runs, f"{metric}@{n}")
        for metric in metrics
        for n in compare_lengths(runs, length, metrics)
    }
    figures |= {
        f"acc_{mode}@{length}": column(f"summary.eval.acc_{mode}@{length}")
        for mode in ("exact", "parallel")
    }
    figures["compute"] = column("summary.compute_tokens") / 1e6
    figures["wall_min"] = column("summary.wall_time_s") / 60
    return figures


def finished_order(df: pd.DataFrame, mtime=None) -> pd.Series:
    """A sortable (recorded, time) per run, later runs larger: summary.trained_by.finished where the
    run recorded it, else the modification time of its summary.json. A run that records the time was
    trained after every run that does not (the field came later), and a copied or checked-out store
    gives its files new modification times, so a recorded time always ranks above a file's."""
    mtime = mtime or _summary_mtime
    finished = (
        df["summary.trained_by.finished"]
        if "summary.trained_by.finished" in df
        else pd.Series(math.nan, index=df.index)
    )
    return pd.Series(
        [
            (True, float(t)) if not _unset(t) else (False, mtime(path))
            for t, path in zip(finished, df.get("path", pd.Series("", index=df.index)))
        ],
        index=df.index,
        dtype=object,
    )


def _summary_mtime(path) -> float:
    try:
        return os.stat(os.path.join(str(path), "summary.json")).st_mtime
    except OSError:
        return 0.0


def studies_by_recency(df: pd.DataFrame, mtime=None) -> list[tuple[str, int]]:
    """(task, training length) pairs of `df`, the study whose latest run finished last first."""
    if df.empty or "config.train.task" not in df or "config.train.length" not in df:
        return []
    known = df[df["config.train.task"].notna() & df["config.train.length"].notna()]
    latest = (
        known.assign(_finished=finished_order(known, mtime))
        .groupby(["config.train.task", "config.train.length"])["_finished"]
        .max()
    )
    return [
        (str(task), int(length))
        for (task, length), _ in sorted(latest.items(), key=lambda item: item[1], reverse=True)
    ]
