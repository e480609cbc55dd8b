"""What the dashboard reads and how it shapes it.

Reads go only through `lrt_lab.store.results` (load_runs, load_metrics, load_table, Run) and are
cached with `st.cache_data`, keyed by the files' modification times, so a run that finishes or a
table an analysis writes shows up on the next rerun without a restart. Everything else here is plain
pandas (labels, curves with a seed band, config diff, depth x length, tolerant readers of the
analysis tables), so the views stay thin and the tests can check the numbers without a browser.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from lrt_lab.store import run_groups
from lrt_lab.store.metrics import LN2, TEXT_TASKS, metric_info, primary_metric
from lrt_lab.store.results import (
    METRICS,
    METRICS_XZ,
    Run,
    load_metrics,
    load_runs,
    load_table,
    metrics_file,
)
from lrt_lab.store.run_groups import method_label, method_labels
from lrt_results.gap import gap_recovery, mismatch_table, read_bpb, refinement_table
from lrt_results.report import format_mean_ci, run_figures
from lrt_results.stats import mean_ci, seeds_interval
from lrt_results.study import store_studies, study_selection, study_table, verdict

KNOWN_KINDS = ("transformer", "lrt")
KNOWN_KIND_PREFIXES = ("loop:", "ponder:")

# x axis name -> (metrics record field, axis label). "compute" is the paper's convention: a run
# whose schedule costs c forward passes per token (Interleaved(2): c = 2) is plotted at c x its
# tokens.
X_AXES = {
    "steps": ("step", "training step"),
    "tokens": ("tokens", "tokens seen"),
    "compute": ("compute_tokens", "baseline-equivalent compute (tokens x schedule cost)"),
    "wall-clock": ("time", "wall-clock time (s)"),
    # counted by the trainer since FLOPs were logged (forward + backward, every train/eval line)
    "FLOPs": ("flops", "training FLOPs (forward + backward)"),
}
BANDS = {
    "95% t-interval": "95% t-interval over seeds (the README's convention)",
    "min-max": "min to max over seeds",
    "none": None,
}

# Columns the runs table shows first (short names made by `annotate`), then summary figures.
RUN_COLUMNS = ["run", "status", "task", "method", "seed", "length", "preset", "n_layer"]

# Filters in the sidebar: label -> column of `annotate`.
FILTERS = {
    "group": "store_group",
    "task": "task",
    "model": "kind",
    "schedule": "schedule",
    "seed": "seed",
}

# Where the store is
# --------------------------------------------------------------------------------
# the run store committed with the repository, next to the experiments that produced it
COMMITTED_STORE = "experiments/results"


def default_runs_dir(argv=None, environ=None, cwd=None) -> str:
    """`-- --runs DIR` on the command line, else $LRT_RUNS, else ./runs if it exists, else
    ./results."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--runs", default=None)
    try:
        args, _ = parser.parse_known_args(argv)
    except SystemExit:  # `--runs` without a value: fall through to the defaults
        args = argparse.Namespace(runs=None)
    if args.runs:
        return args.runs
    environ = os.environ if environ is None else environ
    if environ.get("LRT_RUNS"):
        return environ["LRT_RUNS"]
    cwd = Path.cwd() if cwd is None else Path(cwd)
    if (cwd / "runs").is_dir() or not (cwd / COMMITTED_STORE).is_dir():
        return "runs"
    return COMMITTED_STORE


ROOTS_ENV = "LRT_APP_ROOTS"  # more folders the sidebar may open, os.pathsep-separated


def allowed_roots(argv=None, environ=None, cwd=None) -> list[Path]:
    """The folders the sidebar's store path may name (resolved): the store the dashboard was
    started on (default_runs_dir), every `-- --allow-root DIR`, and those in $LRT_APP_ROOTS. A
    visitor cannot read anything else of the machine through it, such as the folder list of `/`."""
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else Path(cwd)
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--allow-root", action="append", default=[])
    try:
        args, _ = parser.parse_known_args(argv)
    except SystemExit:
        args = argparse.Namespace(allow_root=[])
    extra = [r for r in environ.get(ROOTS_ENV, "").split(os.pathsep) if r]
    start = default_runs_dir(argv, environ, cwd)
    return [(cwd / Path(r).expanduser()).resolve() for r in [start, *args.allow_root, *extra]]


def store_allowed(path: str, roots: list[Path], cwd=None) -> bool:
    """Whether `path` (as typed; relative to cwd) is one of `roots` or inside one, symbolic links
    followed (a link out of an allowed folder leads outside it)."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    try:
        target = (cwd / Path(path).expanduser()).resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    return any(target == r or target.is_relative_to(r) for r in roots)


def _stat(path) -> tuple | None:
    try:
        s = os.stat(path)
    except OSError:
        return None
    return (s.st_mtime_ns, s.st_size)


def store_signature(root) -> tuple:
    """Cheap fingerprint of a store (names, mtimes and sizes of the files the app reads)."""
    root = Path(root)
    if not root.is_dir():
        return ()
    sig = [("<store tables>", _stat(root / ".analysis" / "tables"), _stat(root / "tables"))]
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        sig.append(
            (
                entry.name,
                *(
                    _stat(os.path.join(entry.path, f))
                    for f in ("config.json", "summary.json", METRICS, METRICS_XZ, "tables")
                ),
            )
        )
    return tuple(sig)


def file_signature(path) -> tuple | None:
    return _stat(path)


# Cached reads
# --------------------------------------------------------------------------------------
@st.cache_data(show_spinner=False, max_entries=16)
def cached_runs(root: str, include_incomplete: bool, signature: tuple) -> tuple[pd.DataFrame, list]:
    """(annotated load_runs table, skipped folders as (name,
    reason)); `signature` keys the cache."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skipped folders are shown in the app instead
        df = load_runs(root, include_incomplete=include_incomplete)
    store_tables = Path(root) / "tables"
    skipped = [
        (name, reason)
        for name, reason in df.attrs.get("skipped", [])
        if not (name == "tables" and store_tables.is_dir())
    ]
    return annotate(df), skipped


@st.cache_data(show_spinner=False, max_entries=512)
def cached_metrics(path: str, kind: str | None, signature) -> pd.DataFrame:
    return load_metrics(path, kind=kind)


@st.cache_data(show_spinner=False, max_entries=512)
def cached_table(path: str, name: str, signature) -> pd.DataFrame | None:
    try:
        return load_table(path, name)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError):
        return None


@st.cache_data(show_spinner=False, max_entries=512)
def cached_figures(path: str, signature) -> pd.DataFrame:
    return run_figures(Run(path))


def metrics_of(path: str, kind: str | None) -> pd.DataFrame:
    # keyed on the file the log is read from: metrics.jsonl, or its .xz once compacted
    log = metrics_file(path)
    return cached_metrics(path, kind, (log and log.name, file_signature(log) if log else None))


def table_of(path: str, name: str) -> pd.DataFrame | None:
    return cached_table(path, name, file_signature(Path(path) / "tables" / f"{name}.csv"))


def figures_of(path: str) -> pd.DataFrame:
    return cached_figures(path, file_signature(Path(path) / "summary.json"))


# The runs table
# ------------------------------------------------------------------------------------
def _column(df: pd.DataFrame, name: str, default=None) -> pd.Series:
    return df[name] if name in df.columns else pd.Series(default, index=df.index, dtype=object)


def _task_label(row) -> str:
    task = row.get("config.train.task")
    task = "?" if task is None or (isinstance(task, float) and np.isnan(task)) else str(task)
    opts = {
        k[len("config.train.task_options.") :]: v
        for k, v in row.items()
        if k.startswith("config.train.task_options.") and not pd.isna(v)
    }
    text = ", ".join(f"{k}={run_groups.canonical(v)}" for k, v in sorted(opts.items()))
    return f"{task}({text})" if opts else task


def annotate(df: pd.DataFrame) -> pd.DataFrame:
    """Short columns for filters and labels: task, kind, schedule, method, seed, length, preset,
    n_layer."""
    df = df.copy()
    if df.empty:
        for c in RUN_COLUMNS + ["kind", "schedule", "known_kind", "store_group"]:
            df[c] = pd.Series(dtype=object)
        return df
    df["kind"] = _column(df, "config.kind", "?").fillna("?").astype(str)
    df["schedule"] = _column(df, "config.schedule", "onepass").fillna("onepass").astype(str)
    df["method"] = [
        method_label({"config.kind": k, "config.schedule": s})
        for k, s in zip(df["kind"], df["schedule"])
    ]
    df["task"] = [_task_label(r) for _, r in df.iterrows()]
    df["seed"] = pd.to_numeric(_column(df, "config.train.seed"), errors="coerce").astype("Int64")
    df["length"] = pd.to_numeric(_column(df, "config.train.length"), errors="coerce").astype(
        "Int64"
    )
    df["n_layer"] = pd.to_numeric(_column(df, "config.model.n_layer"), errors="coerce").astype(
        "Int64"
    )
    df["preset"] = _column(df, "config.train.preset", "?").fillna("?").astype(str)
    df["known_kind"] = [k in KNOWN_KINDS or k.startswith(KNOWN_KIND_PREFIXES) for k in df["kind"]]
    # labelled against the whole store: stable filter options
    df["store_group"] = group_labels(df)
    return df


def filter_options(df: pd.DataFrame, column: str) -> list:
    if df.empty or column not in df.columns:
        return []
    return sorted(v for v in df[column].dropna().unique().tolist())


def filter_runs(df: pd.DataFrame, selections: dict) -> pd.DataFrame:
    """Keep rows whose column value is in the selection; an empty selection keeps everything."""
    for column, values in selections.items():
        if values and column in df.columns:
            df = df[df[column].isin(list(values))]
    return df


def _eval_key(col: str):
    m = re.search(r"(.*)@(\d+)$", col)
    return (m.group(1), int(m.group(2))) if m else (col, 0)


def runs_overview(df: pd.DataFrame) -> pd.DataFrame:
    """The runs table: identity columns (the run's group labelled as on every page), then loss,
    pos@90 per length and mode, time, parameters."""
    cols = [c for c in RUN_COLUMNS if c in df.columns]
    out = df[cols].copy()
    if not df.empty:
        out.insert(1 if "run" in cols else 0, "group", group_labels(df))
    extra = {
        "summary.final_loss": "final_loss",
        "summary.wall_time_s": "wall_time_s",
        "config.params.total": "params",
        "summary.steps": "steps",
    }
    evals = sorted((c for c in df.columns if c.startswith("summary.eval.pos90_")), key=_eval_key)
    for c in evals:
        out[c[len("summary.eval.") :].replace("pos90_", "pos@90 ")] = df[c]
    for c, short in extra.items():
        if c in df.columns:
            out[short] = df[c]
    return out.reset_index(drop=True)


def group_overview(df: pd.DataFrame) -> pd.DataFrame:
    """One row per group of seeds: its label, number of runs, seeds, and the runs in it."""
    if df.empty:
        return pd.DataFrame(columns=["group", "runs", "seeds", "run names"])
    t = df.assign(group=group_labels(df))
    out = t.groupby("group", sort=True).agg(
        runs=("run", "size"),
        seeds=("seed", lambda v: ", ".join(str(x) for x in sorted(v.dropna().tolist()))),
        names=("run", lambda v: ", ".join(v)),
    )
    return out.reset_index().rename(columns={"names": "run names"})


def _config_text(v) -> str:
    if v is None:
        return "—"  # not set for this run (e.g. the memory settings of a plain transformer)
    if isinstance(v, float) and v.is_integer():
        return str(int(v))  # pandas turns int columns with a gap into floats
    return str(v)


def config_diff(df: pd.DataFrame) -> pd.DataFrame:
    """Config keys whose values differ among the given runs: one row per key, one column per run."""
    cols = [c for c in df.columns if c.startswith("config.")]
    if len(df) < 2 or not cols:
        return pd.DataFrame()
    values = df.set_index("run")[cols].astype(object).where(df.set_index("run")[cols].notna(), None)
    values = values.map(_config_text)
    differ = [c for c in cols if values[c].nunique() > 1]
    out = values[differ].T
    out.index = [c[len("config.") :] for c in differ]
    out.index.name = "config"
    out.columns.name = None
    return out


def config_of(row: pd.Series) -> dict:
    return {
        k[len("config.") :]: v
        for k, v in row.items()
        if k.startswith("config.") and not (isinstance(v, float) and np.isnan(v))
    }


# Groups of seeds
# -----------------------------------------------------------------------------------
SHORT_TO_CONFIG = {
    "task": "config.train.task",
    "length": "config.train.length",
    "preset": "config.train.preset",
    "n_layer": "config.model.n_layer",
}


def group_labels(df: pd.DataFrame, exclude=()) -> pd.Series:
    """The Compare page's labels (lrt_lab.store.run_groups.method_labels) on every page: runs
    share a label exactly when they differ only by seed (and name), and the label names only what
    tells the groups of `df` apart, so label the runs a chart shows, not the whole store.
    exclude: short names (n_layer, ...) or config columns a view puts on an axis of its own: left
    out of the labels, and runs that differ only there share one."""
    if df.empty:
        return pd.Series([], index=df.index, dtype=object)
    asked = {SHORT_TO_CONFIG.get(c, c) for c in exclude}
    # a model field set on the command line is also in the training options, as an override
    asked |= {
        "config.train.overrides." + c[len("config.model.") :]
        for c in asked
        if c.startswith("config.model.")
    }
    drop = tuple(sorted(c for c in asked if c in df))
    paths = tuple(df["path"].astype(str)) if "path" in df.columns else ()
    if not paths or len(set(paths)) != len(paths):  # not runs of a store: nothing to key a cache
        return method_labels(df.drop(columns=list(drop)))
    signature = tuple(file_signature(Path(p) / "config.json") for p in paths)
    labels = _cached_labels(paths, drop, signature, df)
    return pd.Series(labels, index=df.index, dtype=object)


@st.cache_data(show_spinner=False, max_entries=64)
def _cached_labels(paths: tuple, drop: tuple, signature: tuple, _df: pd.DataFrame) -> list:
    """method_labels of the runs at `paths` (in that order), cached: it costs about a second on a
    store of a hundred runs, and every page labels its runs on every rerun."""
    return method_labels(_df.drop(columns=list(drop))).tolist()


def default_groups(
    df: pd.DataFrame, labels: pd.Series, cap: int = 8, spread: str | None = None
) -> list[str]:
    """The groups a chart shows before anyone picks: those of the study (task and training length)
    with the most runs, the groups with the most runs (seeds) first, then by label; at most `cap`.
    spread: a column a page puts on an axis (n_layer on Depth x length): the study with the most
    groups that span several of its values comes first, and those groups first within it."""
    if df.empty:
        return []
    t = pd.DataFrame({"group": labels.values}, index=df.index)
    t["spread"] = df[spread].astype(str) if spread in df.columns else ""
    study = [c for c in ("config.train.task", "config.train.length") if c in df.columns]
    t["study"] = df[study].astype(str).agg(" ".join, axis=1) if study else ""
    per_group = t.groupby("group").agg(
        study=("study", "first"), runs=("study", "size"), spread=("spread", "nunique")
    )
    per_study = per_group.groupby("study").agg(
        spread=("spread", lambda v: int((v > 1).sum())), runs=("runs", "sum")
    )
    best = min(
        per_study.index, key=lambda s: (-per_study.at[s, "spread"], -per_study.at[s, "runs"], s)
    )
    chosen = per_group[per_group["study"] == best]
    order = sorted(chosen.index, key=lambda g: (-chosen.at[g, "spread"], -chosen.at[g, "runs"], g))
    return order[:cap]


def metric_bounds(metric: str) -> tuple[float | None, float | None]:
    """The range a metric cannot leave (None: unbounded), to clip bands to: a loss or BPB is >= 0,
    an accuracy is in [0, 1], pos@90 at length N is in [0, N]."""
    name = metric.rsplit(".", 1)[-1]
    if name.startswith(("acc_", "accuracy")):
        return 0.0, 1.0
    m = re.fullmatch(r"pos90_\w+@(\d+)", name)
    if m:
        return 0.0, float(m.group(1))
    if name in ("loss", "bpb", "final_loss") or name.startswith(("bpb", "loss")):
        return 0.0, None
    return metric_info(name).bounds


def default_metric(runs: pd.DataFrame, options: list[str], study=None, loader=None) -> str:
    """The metric a page of curves opens on: the store's primary metric (the study's, else the
    task's own figure: lrt_lab.store.metrics.primary_metric) where the runs recorded it over
    training (their metrics.jsonl evaluations), else the first evaluation figure they recorded,
    and the training forward's loss only where they recorded none."""
    loader = loader or metrics_of
    recorded = set()
    for path in runs["path"] if "path" in runs.columns else []:
        recorded |= set(loader(path, "eval").columns)
    primary = primary_metric(runs, study)
    if primary in options and primary in recorded:
        return primary
    evals = [o for o in options if o != "loss" and "@" in o and o in recorded]
    return evals[0] if evals else ("loss" if "loss" in options else options[0])


def metric_caption(metric: str) -> str:
    """`ce_exact@16: cross-entropy (nats), exact decoding at length 16; lower is better`, from the
    metric table every page and report shares."""
    info = metric_info(metric)
    return f"{metric}: {info.label}; {info.direction}"


# The study a store answers -----------------------------------------------------------------------
@st.cache_data(show_spinner=False, max_entries=16)
def cached_store_study(root: str, signature: tuple, _runs: pd.DataFrame) -> dict | None:
    """The first sweep spec beside the store whose [study] the store's runs answer
    (lrt_results.study.store_studies, study_selection): {"path", "study", "arms" ({arm: its
    run names}), "table" (study_table over those runs), "verdicts"}; None when there is none."""
    for path, study, prefix in store_studies(root):
        arms = study_selection(_runs, study, prefix)
        if arms is None:
            continue
        runs = pd.concat(list(arms.values())).drop_duplicates("run")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            table = study_table(runs, study)
        return {
            "path": str(path),
            "study": study,
            "arms": {arm: list(rows["run"]) for arm, rows in arms.items()},
            "table": table,
            "verdicts": [verdict(row, study) for _, row in table.iterrows()],
        }
    return None


def store_study(root: str, runs: pd.DataFrame) -> dict | None:
    """cached_store_study of the store at `root` (its runs: `runs`, every readable one)."""
    if runs.empty:
        return None
    return cached_store_study(str(root), store_signature(root), runs)


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """Debiased exponential moving average (TensorBoard / W&B
    smoothing); weight 0 leaves it as is."""
    values = np.asarray(values, dtype=float)
    if weight <= 0 or len(values) == 0:
        return values
    out, acc, norm = np.empty_like(values), 0.0, 0.0
    for i, v in enumerate(values):
        acc = weight * acc + (1 - weight) * v
        norm = weight * norm + (1 - weight)
        out[i] = acc / norm
    return out


def metric_options(df: pd.DataFrame) -> list[str]:
    """`loss` plus the evaluation figures recorded over training (pos90_exact@L, acc_parallel@L,
    ...) and the contraction monitor's (lyap, sweep_change_k: lrt_lab.run.contraction_monitor),
    which the evaluation lines carry too."""
    evals = sorted(
        (c[len("summary.eval.") :] for c in df.columns if c.startswith("summary.eval.")),
        key=_eval_key,
    )
    monitor = sorted(
        c[len("summary.contraction.") :] for c in df.columns if c.startswith("summary.contraction.")
    )
    return ["loss"] + evals + monitor


def curves(
    df: pd.DataFrame,
    metric: str,
    x_axis: str,
    smoothing: float = 0.0,
    loader=None,
    labels: pd.Series | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """Long table (group, run, x, y) of `metric` over training, and notes about runs left out.
    labels: each run's group name (default group_labels: what tells the groups of `df` apart)."""
    loader = loader or metrics_of
    field, _ = X_AXES[x_axis]
    kind = "train" if metric == "loss" else "eval"
    groups = group_labels(df) if labels is None else labels
    parts, notes = [], []
    for (_, row), group in zip(df.iterrows(), groups):
        m = loader(row["path"], kind)
        if m.empty or metric not in m.columns:
            notes.append(f"{row['run']}: no {metric} records")
            continue
        if field not in m.columns:
            # records older than compute_tokens
            if field == "compute_tokens" and "tokens" in m.columns:
                cost = row.get("config.schedule_cost", 1.0)
                m = m.assign(compute_tokens=m["tokens"] * (1.0 if pd.isna(cost) else float(cost)))
            else:
                notes.append(f"{row['run']}: its records have no {field!r}")
                continue
        m = m[[field, metric]].dropna().drop_duplicates(field, keep="last").sort_values(field)
        if m.empty:
            continue
        y = m[metric].to_numpy(dtype=float)
        # the task's name: one loss family per panel
        task = row.get("config.train.task", row.get("task", "?"))
        seed = row.get("config.train.seed", row.get("seed"))
        parts.append(
            pd.DataFrame(
                {
                    "group": group,
                    "task": str(task),
                    "run": row["run"],
                    "seed": math.nan if pd.isna(seed) else int(seed),
                    "x": m[field].to_numpy(dtype=float),
                    "y": ema(y, smoothing) if kind == "train" else y,
                }
            )
        )
    if not parts:
        return pd.DataFrame(columns=["group", "task", "run", "seed", "x", "y"]), notes
    return pd.concat(parts, ignore_index=True), notes


def x_axis_options(df: pd.DataFrame, loader=None) -> list[str]:
    """X_AXES the runs of `df` can all be drawn against: FLOPs only where every run's training
    records carry them (runs trained before FLOPs were counted have none)."""
    loader = loader or metrics_of
    options = [x for x in X_AXES if x != "FLOPs"]
    counted = not df.empty and all(
        "flops" in (m := loader(path, "train")).columns and m["flops"].notna().any()
        for path in df["path"]
    )
    return options[:3] + ["FLOPs"] + options[3:] if counted else options


def _on_grid(runs: list[pd.DataFrame], n_points: int) -> tuple[np.ndarray, np.ndarray]:
    """(grid, values): the runs' curves (x, y) interpolated onto the x values they share (the
    union of their x values over the range every run covers; n_points evenly spaced where there
    are more), one row per run. An empty grid where their ranges do not overlap."""
    lo_x, hi_x = max(r["x"].min() for r in runs), min(r["x"].max() for r in runs)
    grid = np.unique(np.concatenate([r["x"].to_numpy(dtype=float) for r in runs]))
    grid = grid[(grid >= lo_x) & (grid <= hi_x)]
    if len(grid) > n_points:
        grid = np.linspace(lo_x, hi_x, n_points)
    if len(grid) == 0:
        return grid, np.empty((len(runs), 0))
    ys = np.vstack(
        [np.interp(grid, r["x"].to_numpy(dtype=float), r["y"].to_numpy(dtype=float)) for r in runs]
    )
    return grid, ys


def interval(values: np.ndarray, band: str = "95% t-interval") -> tuple:
    """(mean, lo, hi, kind) over the rows of `values` (one row per seed), per column.

    kind says what the band is: the 95% t-interval of the mean (lrt_results.stats.mean_ci, per
    column) from MIN_SEEDS_T seeds on; with fewer seeds asked for a t-interval, the seeds' min to
    max; one seed, or band "none": no band (lo = hi = mean)."""
    if band not in BANDS:
        raise ValueError(f"band={band!r} is invalid; allowed: {', '.join(BANDS)}")
    if BANDS[band] is None:
        mean = values.mean(0)
        return mean, mean, mean, "none"
    return seeds_interval(values, t_interval=band == "95% t-interval")


def clip_band(df: pd.DataFrame, bounds: tuple, columns=("mean", "lo", "hi")) -> pd.DataFrame:
    """The band's columns clipped to the metric's range (metric_bounds)."""
    lower, upper = bounds
    if lower is None and upper is None:
        return df
    return df.assign(**{c: df[c].clip(lower=lower, upper=upper) for c in columns if c in df})


def seed_band(
    long: pd.DataFrame,
    n_points: int = 200,
    band: str = "95% t-interval",
    bounds: tuple = (None, None),
) -> pd.DataFrame:
    """Per group: the mean over its runs and a band on a common x grid (interpolated where the
    runs' x values differ, over the range every run covers), clipped to `bounds` (metric_bounds).
    The band is what `interval` makes of the group's seeds: a 95% t-interval from MIN_SEEDS_T
    seeds on, min to max below that (or when asked for), none for one run (lo = hi = its curve);
    the column `band` names which, `n` counts the seeds."""
    if band not in BANDS:
        raise ValueError(f"band={band!r} is invalid; allowed: {', '.join(BANDS)}")
    columns = ["group", "task", "x", "mean", "lo", "hi", "n", "band"]
    out = []
    for group, g in long.groupby("group", sort=True):
        runs = [r.sort_values("x") for _, r in g.groupby("run")]
        task = g["task"].iloc[0] if "task" in g.columns else "?"
        grid, ys = _on_grid(runs, n_points) if len(runs) > 1 else (None, None)
        if len(runs) == 1:
            grid, ys = runs[0]["x"].to_numpy(dtype=float), runs[0]["y"].to_numpy(dtype=float)[None]
        if len(grid) == 0:
            continue
        mean, lo, hi, kind = interval(ys, band)
        out.append(
            pd.DataFrame(
                {
                    "group": group,
                    "task": task,
                    "x": grid,
                    "mean": mean,
                    "lo": lo,
                    "hi": hi,
                    "n": len(runs),
                    "band": kind,
                }
            )
        )
    if not out:
        return pd.DataFrame(columns=columns)
    return clip_band(pd.concat(out, ignore_index=True), bounds)[columns]


def _seed_curves(g: pd.DataFrame, n_points: int) -> dict:
    """seed -> (x, y) of one group's runs: a seed run more than once is the mean of its runs; a
    run with no seed stands for itself (keyed by its name), paired with nothing."""
    out = {}
    keys = [
        f"run {run}" if pd.isna(seed) else int(seed)
        for seed, run in zip(g["seed"] if "seed" in g else [math.nan] * len(g), g["run"])
    ]
    for seed, s in g.groupby(pd.Series(keys, index=g.index, dtype=object), sort=False):
        runs = [r.sort_values("x") for _, r in s.groupby("run")]
        if len(runs) == 1:
            out[seed] = runs[0][["x", "y"]]
            continue
        grid, ys = _on_grid(runs, n_points)
        out[seed] = pd.DataFrame({"x": grid, "y": ys.mean(0)})
    return out


DELTA_COLUMNS = ["group", "task", "x", "mean", "lo", "hi", "n", "band", "paired", "seeds"]


def delta_curves(
    long: pd.DataFrame, baseline: str, n_points: int = 200, band: str = "95% t-interval"
) -> tuple[pd.DataFrame, list[str]]:
    """Each group's metric minus the baseline group's at matched x (a `curves` table: x is steps,
    compute or FLOPs), and notes.

    Paired by seed: for the seeds both groups ran, delta_s(x) = group_s(x) - baseline_s(x), both
    interpolated onto the x values they share over the range all of them cover; then the mean
    over seeds with `interval`'s band (a 95% t-interval from MIN_SEEDS_T pairs, min to max of
    the pairs below that). A group that shares no seed with the baseline is compared unpaired:
    the difference of the two means over seeds, no band. Groups of another task than the
    baseline's (another loss family) are left out, with a note.
    Columns: DELTA_COLUMNS (n: pairs of seeds, 0 when unpaired; seeds: the seeds paired)."""
    notes = []
    base = long[long["group"] == baseline]
    if base.empty:
        return pd.DataFrame(columns=DELTA_COLUMNS), [f"{baseline}: no records to compare with"]
    task = base["task"].iloc[0]
    base_seeds = _seed_curves(base, n_points)
    out = []
    for group, g in long.groupby("group", sort=True):
        if group == baseline:
            continue
        if g["task"].iloc[0] != task:
            notes.append(f"{group}: another task ({g['task'].iloc[0]}) than the baseline's")
            continue
        seeds = _seed_curves(g, n_points)
        common = sorted(
            (s for s in seeds if s in base_seeds),
            key=lambda s: (isinstance(s, str), s if isinstance(s, int) else 0, str(s)),
        )
        if common:
            curves = [seeds[s] for s in common] + [base_seeds[s] for s in common]
            grid, ys = _on_grid(curves, n_points)
            k = len(common)
            mean, lo, hi, kind = interval(ys[:k] - ys[k:], band)
            paired, n, named = True, k, ", ".join(str(s) for s in common)
        else:
            curves = list(seeds.values()) + list(base_seeds.values())
            grid, ys = _on_grid(curves, n_points)
            k = len(seeds)
            mean = ys[:k].mean(0) - ys[k:].mean(0)
            lo, hi, kind = mean, mean, "none"
            paired, n, named = False, 0, f"unpaired ({k} vs {len(base_seeds)} seeds)"
            notes.append(f"{group}: no seed in common with the baseline; unpaired, no band")
        if len(grid) == 0:
            notes.append(f"{group}: its x range does not overlap the baseline's")
            continue
        out.append(
            pd.DataFrame(
                {
                    "group": group,
                    "task": task,
                    "x": grid,
                    "mean": mean,
                    "lo": lo,
                    "hi": hi,
                    "n": n,
                    "band": kind,
                    "paired": paired,
                    "seeds": named,
                }
            )
        )
    if not out:
        return pd.DataFrame(columns=DELTA_COLUMNS), notes
    return pd.concat(out, ignore_index=True)[DELTA_COLUMNS], notes


def delta_summary(deltas: pd.DataFrame) -> pd.DataFrame:
    """One row per group: the delta at the end of the range it shares with the baseline (the
    largest matched x): group, x, delta, lo, hi, band, pairs, seeds."""
    columns = ["group", "x", "delta", "lo", "hi", "band", "pairs", "seeds"]
    if deltas.empty:
        return pd.DataFrame(columns=columns)
    last = deltas.sort_values("x").groupby("group", sort=True).tail(1).sort_values("group")
    return pd.DataFrame(
        {
            "group": last["group"],
            "x": last["x"],
            "delta": last["mean"],
            "lo": last["lo"].where(last["band"] != "none"),
            "hi": last["hi"].where(last["band"] != "none"),
            "band": last["band"],
            "pairs": last["n"],
            "seeds": last["seeds"],
        }
    ).reset_index(drop=True)


def curriculum_switches(df: pd.DataFrame, x_axis: str, loader=None) -> pd.DataFrame:
    """Where the training length changes (the curriculum's steps, which explain jumps in the loss):
    (group, task, x, length) at the first record of each new length, from the group's first run."""
    loader = loader or metrics_of
    field, _ = X_AXES[x_axis]
    rows = []
    for (_, row), group in zip(df.iterrows(), group_labels(df)):
        if any(r["group"] == group for r in rows):
            continue
        m = loader(row["path"], "train")
        if m.empty or "length" not in m.columns or field not in m.columns:
            continue
        m = m[[field, "length"]].dropna().sort_values(field)
        changed = m["length"].ne(m["length"].shift()) & m["length"].shift().notna()
        rows += [
            {
                "group": group,
                "task": str(row.get("config.train.task", row.get("task", "?"))),
                "x": float(r[field]),
                "length": int(r["length"]),
            }
            for _, r in m[changed].iterrows()
        ]
    return pd.DataFrame(rows, columns=["group", "task", "x", "length"])


def chance_levels(df: pd.DataFrame) -> pd.DataFrame:
    """(group, chance): 1 / the task's vocabulary, the
    accuracy of guessing on a group-product task."""
    if "config.task_vocab_size" not in df.columns:
        return pd.DataFrame(columns=["group", "chance"])
    vocab = pd.to_numeric(df["config.task_vocab_size"], errors="coerce")
    out = pd.DataFrame({"group": group_labels(df), "chance": 1.0 / vocab}).dropna()
    return out.drop_duplicates("group").reset_index(drop=True)


# Length generalisation
# -----------------------------------------------------------------------------
def per_position(df: pd.DataFrame, loader=None) -> tuple[pd.DataFrame, list[str]]:
    """tables/per_position.csv of every run, long (group, run, length, mode, position, accuracy)."""
    loader = loader or table_of
    groups = group_labels(df)
    parts, missing = [], []
    need = {"length", "mode", "position", "accuracy"}
    for (_, row), group in zip(df.iterrows(), groups):
        t = loader(row["path"], "per_position")
        if t is None or not need <= set(t.columns):
            missing.append(row["run"])
            continue
        parts.append(t[list(need)].assign(group=group, run=row["run"]))
    if not parts:
        return pd.DataFrame(columns=["group", "run", *sorted(need)]), missing
    return pd.concat(parts, ignore_index=True), missing


def length_figures(df: pd.DataFrame, loader=None) -> pd.DataFrame:
    """pos@90 and accuracy at each evaluation length, parallel and exact, one row per run and
    length; a byte-level text task's runs: bits per byte (ce / ln 2) and accuracy instead (their
    pos@90 is 0 for every run)."""
    loader = loader or figures_of
    groups = group_labels(df)
    parts = []
    for (_, row), group in zip(df.iterrows(), groups):
        f = loader(row["path"])
        if f is None or f.empty:
            continue
        f = f.copy()
        if row.get("config.train.task") in TEXT_TASKS:
            for mode in ("parallel", "exact"):
                if f"ce_{mode}" in f:
                    f[f"bpb_{mode}"] = f[f"ce_{mode}"] / LN2
            f = f.drop(columns=[c for c in ("pos90_parallel", "pos90_exact") if c in f])
        f = f.drop(columns=[c for c in ("ce_parallel", "ce_exact") if c in f])
        parts.append(f.reset_index().assign(group=group, run=row["run"]))
    if not parts:
        return pd.DataFrame(columns=["group", "run", "length"])
    return pd.concat(parts, ignore_index=True)


FIGURE_COLUMNS = {
    "pos90_parallel": "pos@90 parallel",
    "pos90_exact": "pos@90 exact",
    "bpb_parallel": "BPB parallel",
    "bpb_exact": "BPB exact",
    "acc_parallel": "accuracy parallel",
    "acc_exact": "accuracy exact",
}


def length_summary(figs: pd.DataFrame) -> pd.DataFrame:
    """Per group and length: mean [95% t-interval] (n seeds), parallel and exact side by side; the
    interval clipped to the figure's range (metric_bounds)."""
    cols = [c for c in FIGURE_COLUMNS if c in figs.columns]
    if figs.empty or not cols:
        return pd.DataFrame()
    rows = []
    for (group, length), g in figs.groupby(["group", "length"], sort=True):
        row = {"group": group, "length": int(length), "seeds": len(g)}
        for c in cols:
            st_ = mean_ci(g[c].astype(float))
            # within what the figure can be: pos@90 at N in [0, N], an accuracy in [0, 1]
            lower, upper = metric_bounds(f"{c}@{int(length)}")
            lo, hi = (
                st_[k] if lower is None and upper is None else float(np.clip(st_[k], lower, upper))
                for k in ("ci_low", "ci_high")
            )
            row[FIGURE_COLUMNS[c]] = format_mean_ci(st_["mean"], lo, hi, st_["n"])
        rows.append(row)
    return pd.DataFrame(rows)


# Depth x length
# ------------------------------------------------------------------------------------
def solved_grid(df: pd.DataFrame, mode: str = "exact", measure: str = "solved") -> pd.DataFrame:
    """Long (task, group, row, depth, length, value, n) from the runs' summaries: `solved` is the
    fraction of runs whose pos@90 reaches the full evaluation length; `fraction` is mean pos@90 /
    length. `row` is the group (labelled without depth) and its depth, so a depth sweep reads down
    a panel; one panel per task, whose evaluation lengths differ."""
    columns = ["task", "group", "row", "depth", "length", "value", "n"]
    cols = [c for c in df.columns if c.startswith(f"summary.eval.pos90_{mode}@")]
    if df.empty or not cols or "n_layer" not in df.columns:
        return pd.DataFrame(columns=columns)
    labels = group_labels(df, exclude=("n_layer",))
    rows = []
    for (_, row), group in zip(df.iterrows(), labels):
        if pd.isna(row["n_layer"]):
            continue
        for c in cols:
            length = int(c.rsplit("@", 1)[1])
            pos = row[c]
            if pd.isna(pos):
                continue
            value = float(pos >= length) if measure == "solved" else float(pos) / length
            rows.append(
                {
                    "task": row.get("task", "?"),
                    "group": group,
                    "row": f"{group} | layers={int(row['n_layer'])}",
                    "depth": int(row["n_layer"]),
                    "length": length,
                    "value": value,
                }
            )
    if not rows:
        return pd.DataFrame(columns=columns)
    long = pd.DataFrame(rows)
    return long.groupby(["task", "group", "row", "depth", "length"], as_index=False).agg(
        value=("value", "mean"), n=("value", "size")
    )[columns]


# Analysis tables (written by lrt_lab.analysis)
# -----------------------------------------------------
# Per-run tables live in <run>/tables/ (probe_<decoding>.csv); store-level ones in
# <store>/.analysis/tables/ (gap_recovery, gap_recovery_per_seed, mismatch, refinement, depth_sweep,
# depth_worth; lrt_lab.analysis.loading.ANALYSIS_DIR, not imported: that module imports torch), and,
# tolerated, <store>/tables/. Tables are recognised by name prefix; every reader checks its columns.
STORE_TABLE_DIRS = (".analysis", ".")
TABLE_KINDS = ("probe", "gap_recovery", "mismatch", "refinement", "depth_sweep", "depth_worth")


def table_kind(name: str) -> str | None:
    for kind in TABLE_KINDS:
        if name.startswith(kind):
            return kind
    return None


@st.cache_data(show_spinner=False, max_entries=16)
def cached_analysis_index(root: str, run_paths: tuple, signature: tuple) -> list[dict]:
    """Every analysis table of the store and of the given runs: kind, name, owner, path, file."""
    found = []
    owners = [("store", str(Path(root) / d)) for d in STORE_TABLE_DIRS] + [
        (Path(p).name, p) for p in run_paths
    ]
    for owner, path in owners:
        for name, file in Run(path).tables().items():
            kind = table_kind(name)
            if kind:
                found.append(
                    {
                        "kind": kind,
                        "name": name,
                        "owner": owner,
                        "path": str(path),
                        "file": str(file),
                    }
                )
    return found


def analysis_tables(root: str, df: pd.DataFrame, *kinds: str) -> list[dict]:
    paths = tuple(df["path"]) if "path" in df.columns else ()
    return [
        t for t in cached_analysis_index(root, paths, store_signature(root)) if t["kind"] in kinds
    ]


@st.cache_data(show_spinner=False, max_entries=16)
def cached_stored_gap(run_paths: tuple, signature: tuple) -> tuple[dict, list[str]]:
    """lrt_results.gap's tables (gap_recovery with its per-seed table, mismatch, refinement)
    computed from the runs' tables/bpb.csv, and notes. Computed, not read from .analysis/: a
    committed store keeps the small bpb tables but not the checkpoints `analyze gap` evaluates."""
    runs = load_runs_subset(run_paths)
    notes = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = read_bpb(runs)
        if "bpb.exact" not in df.columns or df["bpb.exact"].notna().sum() == 0:
            return {}, ["No run shown has tables/bpb.csv (written by `lrt-lab analyze gap STORE`)."]
        df = df[df["bpb.exact"].notna()]
        tables = {}
        try:
            gap = gap_recovery(df)
            tables["gap_recovery"], tables["gap_recovery_per_seed"] = gap, gap.attrs["per_seed"]
        except ValueError as e:
            notes.append(f"gap recovery: {e}")
        tables["mismatch"] = mismatch_table(df)
        try:
            tables["refinement"] = refinement_table(df)
        except ValueError as e:
            notes.append(f"refinement: {e}")
    notes += [str(w.message) for w in caught]
    return {k: v for k, v in tables.items() if v is not None and not v.empty}, notes


def load_runs_subset(run_paths: tuple) -> pd.DataFrame:
    """load_runs rows of the given run folders (they may live in different stores)."""
    parts = []
    for root in sorted({str(Path(p).parent) for p in run_paths}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            df = load_runs(root)
        parts.append(df[df["path"].isin(run_paths)] if not df.empty else df)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def stored_gap(df: pd.DataFrame) -> tuple[dict, list[str]]:
    paths = tuple(sorted(df["path"])) if "path" in df.columns else ()
    sig = tuple(file_signature(Path(p) / "tables" / "bpb.csv") for p in paths)
    return cached_stored_gap(paths, sig)


def read_mismatch(t: pd.DataFrame) -> pd.DataFrame | None:
    """Long (label, decoding, value, ci_low, ci_high, n) from a mismatch table
    (lrt_results.gap)."""
    if not {"method", "parallel", "exact"} <= set(t.columns):
        return None
    keys = [c for c in t.columns if str(c).startswith("config.")]
    group = _group_label(t, keys)
    label = t["method"].astype(str).where(group == "", t["method"].astype(str) + " | " + group)
    parts = []
    for mode in ("parallel", "exact"):
        parts.append(
            pd.DataFrame(
                {
                    "label": label,
                    "decoding": mode,
                    "value": pd.to_numeric(t[mode], errors="coerce"),
                    "ci_low": pd.to_numeric(t.get(f"{mode}_ci_low"), errors="coerce"),
                    "ci_high": pd.to_numeric(t.get(f"{mode}_ci_high"), errors="coerce"),
                    "n": t.get("n"),
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


def read_refinement(t: pd.DataFrame) -> pd.DataFrame | None:
    """(label, stage, stage_index, mean, ci_low, ci_high, n) from a refinement table."""
    if not {"method", "stage", "stage_index", "mean"} <= set(t.columns):
        return None
    keys = [c for c in t.columns if str(c).startswith("config.")]
    group = _group_label(t, keys)
    label = t["method"].astype(str).where(group == "", t["method"].astype(str) + " | " + group)
    return pd.DataFrame(
        {
            "label": label,
            "stage": t["stage"].astype(str),
            "stage_index": pd.to_numeric(t["stage_index"], errors="coerce"),
            "mean": pd.to_numeric(t["mean"], errors="coerce"),
            "ci_low": pd.to_numeric(t.get("ci_low"), errors="coerce"),
            "ci_high": pd.to_numeric(t.get("ci_high"), errors="coerce"),
            "n": t.get("n"),
        }
    )


def _pick(columns, *names):
    lower = {str(c).lower(): c for c in columns}
    for n in names:
        if n in lower:
            return lower[n]
    return None


def _found(t: pd.DataFrame) -> str:
    return ", ".join(map(str, t.columns)) or "no columns"


def read_probe(
    t: pd.DataFrame, owner: str, name: str = ""
) -> tuple[pd.DataFrame | None, str | None]:
    """Long (label, row, row_order, position, control, accuracy) from a probe table, or a message.

    Accepts lrt_lab.analysis.probes tables (run, kind, site, target, position, control, accuracy,
    decoding, layer_index) and simpler ones (model or run, layer or site, position, accuracy)."""
    site = _pick(t.columns, "site", "layer", "hook")
    pos, acc = _pick(t.columns, "position", "pos"), _pick(t.columns, "accuracy", "acc")
    if not (site and pos and acc):
        return None, f"expected columns site (or layer), position, accuracy; found {_found(t)}"
    who = _pick(t.columns, "run", "model", "method")
    decoding = _pick(t.columns, "decoding")
    label = t[who].astype(str) if who else pd.Series(owner, index=t.index)
    if decoding:
        label = label + " (" + t[decoding].astype(str) + ")"
    elif name.startswith("probe_"):
        label = label + f" ({name[len('probe_') :]})"
    row = t[site].astype(str)
    target = _pick(t.columns, "target")
    if target:  # the memory probed against the state one step back, as in lrt_lab.analysis.probes
        row = row.where(t[target].astype(str) != "state_prev", row + " (t-1)")
    order = _pick(t.columns, "layer_index")
    if order:
        row_order = pd.to_numeric(t[order], errors="coerce")
    elif pd.api.types.is_numeric_dtype(t[site]):
        row_order = t[site].astype(float)
    else:
        row_order = pd.Series(pd.factorize(t[site])[0], index=t.index, dtype=float)
    if target:
        row_order = row_order + (t[target].astype(str) == "state_prev") * 0.5
    control = _pick(t.columns, "control")
    out = pd.DataFrame(
        {
            "label": label,
            "row": row,
            "row_order": row_order,
            "position": pd.to_numeric(t[pos], errors="coerce"),
            "control": t[control].astype(str) if control else "probe",
            "accuracy": pd.to_numeric(t[acc], errors="coerce"),
        }
    )
    return out.dropna(subset=["position", "accuracy"]), None


def _group_label(t: pd.DataFrame, keys: list) -> pd.Series:
    """'task=..., L=...' from the group columns that vary (empty when one group)."""
    short = {
        "config.train.task": "task",
        "config.train.length": "L",
        "config.model.n_layer": "layers",
        "config.model.n_embd": "d",
        "config.train.steps": "steps",
    }
    varying = [k for k in keys if t[k].nunique(dropna=False) > 1]
    if not varying:
        return pd.Series("", index=t.index)
    return (
        t[varying]
        .astype(str)
        .apply(
            lambda r: ", ".join(f"{short.get(k, k.rsplit('.', 1)[-1])}={v}" for k, v in r.items()),
            axis=1,
        )
    )


def read_gap(t: pd.DataFrame, per_seed: pd.DataFrame | None = None):
    """(bars, points, message) from a gap-recovery table (lrt_results.gap: group columns,
    method, n_seeds, ..., recovered, recovered_std, ci_low, ci_high, metric, baseline, exact_method;
    or method, recovered_mean, ci_low, ci_high[, seed0, seed1, ...]).
    bars: label, method, mean, ci_low, ci_high; points: label, value (per seed) or None."""
    method = _pick(t.columns, "method", "model")
    mean = _pick(t.columns, "recovered_mean", "recovered", "mean")
    if not (method and mean):
        return (
            None,
            None,
            "expected columns method, recovered (or recovered_mean), ci_low, ci_high; found "
            f"{_found(t)}",
        )
    keys = [c for c in t.columns if str(c).startswith("config.")]
    group = _group_label(t, keys)
    label = t[method].astype(str).where(group == "", t[method].astype(str) + " | " + group)
    lo, hi = _pick(t.columns, "ci_low", "lo", "low"), _pick(t.columns, "ci_high", "hi", "high")
    bars = pd.DataFrame(
        {
            "label": label,
            "method": t[method].astype(str),
            "mean": pd.to_numeric(t[mean], errors="coerce"),
            "ci_low": pd.to_numeric(t[lo], errors="coerce") if lo else float("nan"),
            "ci_high": pd.to_numeric(t[hi], errors="coerce") if hi else float("nan"),
        }
    )
    points = None
    seed_cols = [c for c in t.columns if re.fullmatch(r"(recovered_)?(seed|s)_?\d+", str(c))]
    if per_seed is not None:
        m2, v2 = (
            _pick(per_seed.columns, "method", "model"),
            _pick(per_seed.columns, "recovered", "value"),
        )
        if m2 and v2:
            k2 = [k for k in keys if k in per_seed.columns]
            merged = (
                per_seed.merge(
                    t[k2 + [method]].assign(_label=label),
                    left_on=k2 + [m2],
                    right_on=k2 + [method],
                    how="inner",
                )
                if k2
                else per_seed.assign(_label=per_seed[m2].astype(str))
            )
            points = pd.DataFrame(
                {
                    "label": merged["_label"].astype(str),
                    "value": pd.to_numeric(merged[v2], errors="coerce"),
                }
            )
    elif seed_cols:
        points = t.assign(label=label).melt(
            id_vars=["label"], value_vars=seed_cols, value_name="value"
        )
        points = points[["label", "value"]].assign(
            value=lambda d: pd.to_numeric(d["value"], errors="coerce")
        )
    elif _pick(t.columns, "seed"):  # long format: one row per seed; the bars are per label
        v = _pick(t.columns, "recovered", "value")
        points = (
            pd.DataFrame({"label": label, "value": pd.to_numeric(t[v], errors="coerce")})
            if v
            else None
        )
        bars = bars.groupby("label", as_index=False, sort=False).agg(
            method=("method", "first"),
            mean=("mean", "mean"),
            ci_low=("ci_low", "first"),
            ci_high=("ci_high", "first"),
        )
    if points is not None:
        points = points.dropna(subset=["value"])
    return bars, points, None


def gap_caption(t: pd.DataFrame) -> str:
    parts = []
    for col, text in (
        ("metric", "metric {}"),
        ("baseline", "baseline {}"),
        ("exact_method", "exact {}"),
    ):
        c = _pick(t.columns, col)
        if c and t[c].nunique() == 1:
            parts.append(text.format(t[c].iloc[0]))
    return ", ".join(parts)


def read_depth_sweep(t: pd.DataFrame) -> tuple[pd.DataFrame | None, str, str | None]:
    """(table, shape, message). shape "curve": lrt_results.depth's depth_sweep (task, method,
    n_layer, n, mean, std, sem, ci_low, ci_high, metric) as group, depth, mean, ci_low, ci_high;
    shape "grid": a depth x length table (depth or n_layer, length, solved or value) as group,
    depth, length, value."""
    depth = _pick(t.columns, "n_layer", "depth", "layers")
    if not depth:
        return (
            None,
            "",
            f"expected columns n_layer (or depth) and mean (or length, solved); found {_found(t)}",
        )
    method = _pick(t.columns, "method", "model", "group")
    task = _pick(t.columns, "task")
    group = t[method].astype(str) if method else pd.Series("all", index=t.index)
    if task and t[task].nunique() > 1:
        group = t[task].astype(str) + ": " + group
    length = _pick(t.columns, "length", "eval_length")
    value = _pick(t.columns, "solved", "solved_frac", "frac_solved", "value")
    if length and value:
        out = pd.DataFrame(
            {
                "group": group,
                "depth": pd.to_numeric(t[depth], errors="coerce"),
                "length": t[length],
                "value": pd.to_numeric(t[value], errors="coerce"),
            }
        )
        return (
            out.groupby(["group", "depth", "length"], as_index=False)["value"].mean(),
            "grid",
            None,
        )
    mean = _pick(t.columns, "mean")
    if not mean:
        return (
            None,
            "",
            f"expected columns n_layer (or depth) and mean (or length, solved); found {_found(t)}",
        )
    lo, hi = _pick(t.columns, "ci_low"), _pick(t.columns, "ci_high")
    out = pd.DataFrame(
        {
            "group": group,
            "depth": pd.to_numeric(t[depth], errors="coerce"),
            "mean": pd.to_numeric(t[mean], errors="coerce"),
            "ci_low": pd.to_numeric(t[lo], errors="coerce") if lo else float("nan"),
            "ci_high": pd.to_numeric(t[hi], errors="coerce") if hi else float("nan"),
        }
    )
    out = out.dropna(subset=["depth", "mean"])
    out["swept"] = out.groupby("group")["depth"].transform("nunique") > 1
    return out, "curve", None
