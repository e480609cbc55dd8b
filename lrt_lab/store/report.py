"""Tables for the terminal: one run's figures, and a paper-style comparison across runs."""

from __future__ import annotations

import json
import math
import os
import re
import sys

import pandas as pd

from lrt_lab.store.results import Run, diverged_line, first_names, load_runs
from lrt_lab.store.run_groups import (
    IDENTITY_FIELDS,
    INTERVAL_NOTE,
    canonical,
    default_metric,
    eval_columns,
    group_labels,
    method_label,
    with_train_length_metric,
)
from lrt_lab.store.stats import mean_ci, seed_stats

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
    wall clock), final_loss (training), and pos90_exact@N / pos90_parallel@N at every evaluated
    length N."""
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
    method = sub.apply(method_label, axis=1)
    evals = [
        c
        for c in sub.columns
        if c.startswith(("summary.eval.pos90_exact@", "summary.eval.pos90_parallel@"))
        and sub[c].notna().any()
    ]
    out = pd.DataFrame(
        {
            "trainer": method + steps_suffix(sub, method),
            "seed": sub["config.train.seed"].astype(int),
            "compute": sub["summary.compute_tokens"] / 1e6,
            "wall_min": sub["summary.wall_time_s"] / 60,
            "final_loss": sub["summary.final_loss"],
            **{c.removeprefix("summary.eval."): sub[c] for c in evals},
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


def runs_lacking(df: pd.DataFrame, metric: str) -> list[str]:
    """Names of the runs with no value for `metric`."""
    return df.loc[df[metric].isna(), "run"].tolist() if "run" in df.columns else []


def comparison_table(
    df: pd.DataFrame, metric: str | None = None, group_by: str | None = None
) -> pd.DataFrame:
    """Mean, 95% t-interval and std over seeds of `metric` per group of runs.

    group_by None: lrt_lab.store.run_groups' rule (one group per config up to the seed, labelled by
    what
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
        raise ValueError(
            f"metric={metric!r} is invalid; allowed: "
            f"{', '.join(eval_columns(df)) or 'summary.* columns'}"
        )
    if group_by is None:
        df["group"] = group_labels(df)
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


def print_report(root, metric: str | None = None, group_by: str | None = None) -> pd.DataFrame:
    """Print comparison_table: one row per group, `mean [95%
    t-interval] (n)` and std; returns it."""
    runs = load_runs(root)
    diverged = sorted(runs.loc[runs["status"] == "diverged", "run"]) if "status" in runs else []
    if diverged and len(diverged) == len(runs):
        raise ValueError(
            f"runs: the store has no complete runs; {len(diverged)} diverged (NaN or "
            f"inf loss): {first_names(diverged)}"
        )
    table = comparison_table(
        runs[runs["status"] != "diverged"] if diverged else runs, metric, group_by
    )
    metric = table.attrs["metric"]
    keys = ["group"] if group_by is None else [k.strip() for k in group_by.split(",")]
    shown = table[keys].copy()
    for k in keys:  # names read left-aligned
        text = shown[k].astype(str)
        shown[k] = text.str.ljust(text.str.len().max())
    shown[metric] = [
        format_mean_ci(m, lo, hi, int(n))
        for m, lo, hi, n in zip(table["mean"], table["ci_low"], table["ci_high"], table["n"])
    ]
    shown["std"] = [f"{v:.2g}" if not math.isnan(v) else "-" for v in table["std"]]
    for c in ("seeds", "forwards_per_token", "cost", "wall_time_s"):
        if c in table.columns:
            shown[c] = table[c].round(1) if c == "wall_time_s" else table[c]
    print(f"{metric}: mean [{INTERVAL_NOTE}] (n seeds); std: sample standard deviation over seeds")
    print(shown.to_string(index=False))
    if table.attrs["lacking"]:
        print(
            f"\n{len(table.attrs['lacking'])} run(s) have no {metric} and are not counted: "
            + ", ".join(table.attrs["lacking"])
        )
    if diverged:
        print(
            f"\n{len(diverged)} run(s) diverged (NaN or inf loss; summary.json status "
            "'diverged') and are not "
            "counted: " + ", ".join(diverged)
        )
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
    """A run's figures (stdout) when it is complete; one line saying what it is otherwise: a
    diverged run's step and loss (stderr), or that it is incomplete."""
    s = run.summary
    if s is None:
        print(f"{run.name}: incomplete (resume with --resume)")
        return
    if s.get("status", "complete") != "complete":  # diverged: no final loss, no evaluation
        print(
            diverged_line(run.name, s)
            if s.get("status") == "diverged"
            else f"{run.name}: status {s.get('status')!r} in summary.json",
            file=sys.stderr,
        )
        return
    print(
        f"\n{run.name}: loss {s['final_loss']:.4f}, {s['wall_time_s']:.0f} s, "
        f"{s['tokens']:,} tokens "
        f"(x{s['schedule_cost']:g} compute)"
    )
    print(run_figures(run).to_string())
    print(f"run folder: {run.path}")


# Comparing the methods of one study
# -----------------------------------------------------------------
# A study is the runs of one task trained at one length; a method is what a run asked for: the model
# kind, the trainer and every training option (preset, memory preset, overrides, task options,
# steps,
# ...), so the runs of a method differ only by seed and name. The model config follows from those
# options and the code that built it, and counts only where every run of a kind records a field: a
# run that lacks one was trained before the field existed (config.model.memory.update) and built
# what
# its default builds now, so it stays a seed of its method.

# Training options that only repeat config.kind / config.schedule, or name a run instead of
# configuring it.
ASKED_REPEATS = IDENTITY_FIELDS + ("config.train.model", "config.train.schedule")
# Options that change neither the model trained nor what is measured: named only where nothing else
# tells two methods apart (runs of an older sweep may have checkpointed less often, say).
BOOKKEEPING = (
    "config.train.checkpoint_every",
    "config.train.eval_every",
    "config.train.device",
    "config.train.compile",
)
# Reading order of the fields a label names after the method: what was learned (the task, the
# training length) first, where the labels shown span several.
LABEL_ORDER = (
    "config.train.task",
    "config.train.length",
    "config.train.preset",
    "config.train.memory_preset",
    "config.train.overrides.",
    "config.train.task_options.",
    "config.train.steps",
    "config.train.",
    "config.model.",
)
LABEL_PREFIXES = (
    "config.train.task_options.",
    "config.train.overrides.",
    "config.train.",
    "config.model.",
)
# The evaluation lengths a study compares, as multiples of its training length.
LENGTH_MULTIPLES = (1, 2, 4)
COMPARE_METRICS = ("pos90_exact", "pos90_parallel")


def method_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The config fields that define a method, one row per run, one spelling per value (None:
    unset)."""
    asked = [
        c
        for c in df.columns
        if c in ("config.kind", "config.schedule")
        or (c.startswith("config.train.") and c not in ASKED_REPEATS)
    ]
    frame = pd.DataFrame({c: _canonical_values(df[c]) for c in asked}, index=df.index)
    if "config.train.memory_preset" in frame:
        # runs from before presets built the "paper" memory (memory_label); a model without memory
        # has none
        lrt = (
            (df["config.kind"] == "lrt")
            if "config.kind" in df
            else pd.Series(False, index=df.index)
        )
        presets = [
            ("paper" if v is None else v) if is_lrt else None
            for v, is_lrt in zip(frame["config.train.memory_preset"], lrt)
        ]
        frame["config.train.memory_preset"] = pd.Series(presets, index=df.index, dtype=object)
    kinds = df["config.kind"].fillna("?") if "config.kind" in df else pd.Series("?", index=df.index)
    for c in (c for c in df.columns if c.startswith("config.model.")):
        recorded = df[c].notna().groupby(kinds).transform("all")  # by every run of its kind
        if recorded.any():
            values = [v if keep else None for v, keep in zip(_canonical_values(df[c]), recorded)]
            frame[c] = pd.Series(values, index=df.index, dtype=object)
    return frame


def _canonical_values(column: pd.Series) -> pd.Series:
    """Python values, not a pandas dtype: 4 stays 4 (not 4.0) and an unset field stays None (not
    NaN)."""
    return pd.Series(
        [canonical(v) for v in column.astype(object)], index=column.index, dtype=object
    )


def method_keys(df: pd.DataFrame) -> pd.Series:
    """One string per run, equal for the runs of one method (method_frame's fields)."""
    frame = method_frame(df)
    return pd.Series(
        [json.dumps(row, sort_keys=True, default=str) for row in frame.to_dict("records")],
        index=df.index,
        dtype=object,
    )


def method_labels(df: pd.DataFrame) -> pd.Series:
    """A short label per run, the same for the runs of one method: `lrt rollout:1`, then the
    training
    options whose values differ between the methods of `df` (the selection being compared), each
    named
    only where a method departs from the reference: unset (the default) where some method leaves the
    option unset, else the value most methods share (none on a tie). So `lrt interleaved:2 |
    steps=3000`
    next to `lrt rollout:1`, never the whole config. Options that change neither what is trained nor
    what is measured (BOOKKEEPING), then the model config, are named only where they alone tell
    methods
    apart."""
    if df.empty:
        return pd.Series([], index=df.index, dtype=object)
    frame, keys = method_frame(df), method_keys(df)
    methods = frame.assign(_key=keys, _base=df.apply(method_label, axis=1).values).drop_duplicates(
        "_key"
    )
    varying = _ordered_label_fields(
        [
            c
            for c in frame.columns
            if c not in ("config.kind", "config.schedule") and methods[c].map(str).nunique() > 1
        ]
    )
    chosen = [c for c in varying if c not in BOOKKEEPING and not c.startswith("config.model.")]
    memo = {}  # what each field's column says, worked out once (_label asks per run and field)
    # in reading order: bookkeeping, then the model
    for c in (c for c in varying if c not in chosen):
        if _distinct_labels(methods, chosen, memo) == len(methods):
            break
        if _distinct_labels(methods, chosen + [c], memo) > _distinct_labels(methods, chosen, memo):
            chosen.append(c)
    labels = {r["_key"]: _label(r, chosen, methods, memo=memo) for _, r in methods.iterrows()}
    clashing = pd.Series(labels).duplicated(keep=False)
    for key in clashing[
        clashing
    ].index:  # e.g. a field unset in one and at its default in the other
        labels[key] = _label(
            methods[methods["_key"] == key].iloc[0], varying, methods, spell_out=True, memo=memo
        )
    return keys.map(labels)


def _distinct_labels(methods: pd.DataFrame, fields: list[str], memo: dict | None = None) -> int:
    return len({_label(r, fields, methods, memo=memo) for _, r in methods.iterrows()})


def _ordered_label_fields(cols: list[str]) -> list[str]:
    ordered = [
        c for p in LABEL_ORDER for c in cols if c == p or (p.endswith(".") and c.startswith(p))
    ]
    return list(dict.fromkeys(ordered))


def _unset(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _label(
    row, fields: list[str], methods: pd.DataFrame, spell_out: bool = False, memo: dict | None = None
) -> str:
    """memo: a dict kept across calls on the same `methods`, for the per-column facts."""
    memo = {} if memo is None else memo
    parts = [row["_base"]]
    kind = row["config.kind"] if "config.kind" in methods else None
    for c in fields:
        value = row[c]
        if ("unset", kind, c) not in memo:
            same_kind = methods["config.kind"] == kind if "config.kind" in methods else True
            memo[("unset", kind, c)] = bool(methods.loc[same_kind, c].isna().all())
        if memo[("unset", kind, c)]:
            # a field no method of this kind sets (the memory preset of a plain transformer)
            continue
        if not spell_out and _is_reference(value, methods[c], methods, memo):
            continue
        name = next((c[len(p) :] for p in LABEL_PREFIXES if c.startswith(p)), c)
        parts.append(f"{name}={'default' if _unset(value) else value}")
    return " | ".join(parts)


def _is_reference(
    value, column: pd.Series, methods: pd.DataFrame, memo: dict | None = None
) -> bool:
    """Whether `value` is the one a label leaves unsaid: unset (the default) where some method of
    the
    kinds the field applies to leaves it unset, else the value strictly most methods share."""
    memo = {} if memo is None else memo
    if ("reference", column.name) not in memo:
        if "config.kind" in methods:
            column = column[
                methods["config.kind"].isin(set(methods.loc[column.notna(), "config.kind"]))
            ]
        if column.isna().any():
            memo[("reference", column.name)] = ("unset", None)
        else:
            counts = column.map(str).value_counts()
            most_shared = len(counts) == 1 or counts.iloc[0] > counts.iloc[1]
            memo[("reference", column.name)] = (
                ("value", counts.index[0]) if most_shared else ("none", None)
            )
    reference, text = memo[("reference", column.name)]
    if reference == "unset":
        return _unset(value)
    return reference == "value" and not _unset(value) and str(value) == text


def study_runs(df: pd.DataFrame, task: str, length: int) -> pd.DataFrame:
    if df.empty or "config.train.task" not in df or "config.train.length" not in df:
        return df.iloc[:0]
    return df[(df["config.train.task"] == task) & (df["config.train.length"] == length)]


def compare_lengths(df: pd.DataFrame, length: int) -> list[int]:
    """The evaluation lengths at 1x / 2x / 4x the training length that some run of `df` measured."""

    def measured(column: str) -> bool:
        return column in df and df[column].notna().any()

    return [
        m * length
        for m in LENGTH_MULTIPLES
        if any(measured(f"summary.eval.{metric}@{m * length}") for metric in COMPARE_METRICS)
    ]


def compare_table(df: pd.DataFrame, task: str, length: int) -> pd.DataFrame:
    """One row per method (method_labels) of the runs of `task` trained at `length`, cheapest first.

    Columns: method, n (runs), seeds (sorted), then for each figure F: F.mean, F.ci_low, F.ci_high
    (the 95% t-interval over seeds of lrt_lab.store.stats.mean_ci, NaN for one seed) and
    F.per_seed (a tuple in the order of `seeds`). The figures: pos90_exact@N and pos90_parallel@N at
    every length of compare_lengths, acc_exact@L and acc_parallel@L at the training length L,
    compute (M token-forwards the trainer ran) and wall_min (each run's wall clock, minutes)."""

    runs = study_runs(df, task, length)
    if runs.empty:
        return pd.DataFrame()
    runs = runs.assign(_method=method_labels(runs)).sort_values("config.train.seed")
    figures = _compare_figures(runs, length)
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


def _compare_figures(runs: pd.DataFrame, length: int) -> dict[str, pd.Series]:
    """figure name -> its value per run (NaN where a run did not measure it)."""

    def column(name: str) -> pd.Series:
        if name not in runs:
            return pd.Series(math.nan, index=runs.index)
        return pd.to_numeric(runs[name], errors="coerce")

    figures = {
        f"{metric}@{n}": column(f"summary.eval.{metric}@{n}")
        for metric in COMPARE_METRICS
        for n in compare_lengths(runs, length)
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
