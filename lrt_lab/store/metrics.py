"""What each metric of a run store is: its direction, the range it cannot leave, a label, and
which forward it scores. One table, read by `lrt-lab report`, the dashboard and the page
generators, so a metric reads the same way everywhere (a cross-entropy is never "higher is
better", a pos@90 at length 16 never leaves [0, 16]).

A metric is named as the runs record it, with or without its table prefix: `ce_exact@16`,
`summary.eval.pos90_parallel@32`, `loss` (a training line's), `summary.final_loss`, `bpb`,
`contraction.lyap`. `metric_info(name)` gives a MetricInfo; `primary_metric(runs, study)` the one
a view of those runs opens on: a study's primary metric where the runs are a study's, else the
task's own figure (bits per byte with exact decoding for a byte-level text task, exact-decoding
pos@90 for state tracking), never the training forward's loss unlabelled.

Light on purpose (pandas only): the dashboard imports it without paying for torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pandas as pd

# Byte-level text tasks: scored by bits per byte (lrt_tasks names them; lrt_lab imports no task
# code). Every other task is scored by pos@90, the state-tracking figure.
TEXT_TASKS = ("text_bytes",)
LN2 = math.log(2)

PREFIXES = ("summary.eval.", "summary.contraction.", "summary.", "eval.", "contraction.", "bpb.")

# what a metric's suffix says it scored
FORWARDS = {
    "exact": "exact decoding",
    "parallel": "the training schedule's parallel forward",
}


@dataclass(frozen=True)
class MetricInfo:
    """name: as given, without its table prefix; family: pos90, acc, ce, bpb, agree, loss,
    lyap, sweep_change, or other; lower_is_better: None where a metric has no better side (a
    monitor's reading); bounds: (low, high), None for unbounded; forward: what it scores (exact
    decoding, the parallel forward, the training forward); label: a short human name."""

    name: str
    family: str
    lower_is_better: bool | None
    bounds: tuple[float | None, float | None]
    forward: str
    label: str
    length: int | None = None

    @property
    def direction(self) -> str:
        if self.lower_is_better is None:
            return "no better side"
        return "lower is better" if self.lower_is_better else "higher is better"

    def clip(self, value: float) -> float:
        """`value` moved into the metric's range (NaN stays NaN)."""
        lo, hi = self.bounds
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return value
        if lo is not None and value < lo:
            return lo
        if hi is not None and value > hi:
            return hi
        return value

    def outside(self, lo: float, hi: float) -> bool:
        """Whether an interval [lo, hi] reaches outside the metric's range."""
        low, high = self.bounds
        return (low is not None and lo < low) or (high is not None and hi > high)


_AT = re.compile(
    r"^(?P<stem>[a-z0-9_]+?)(?:_(?P<fwd>exact|parallel))?@(?P<length>\d+|train_length)$"
)


def short_name(metric: str) -> str:
    """`summary.eval.ce_exact@16` -> `ce_exact@16`."""
    for prefix in PREFIXES:
        if metric.startswith(prefix):
            return metric[len(prefix) :]
    return metric


def metric_info(metric: str) -> MetricInfo:
    """The properties of `metric` (a run-store metric name, prefixed or not)."""
    name = short_name(metric)
    m = _AT.match(name)
    if m:
        stem, fwd, length = m["stem"], m["fwd"], m["length"]
        n = int(length) if length.isdigit() else None
        forward = FORWARDS.get(fwd or "exact", "exact decoding")
        at = f" at length {length}" if n is not None else " at the training length"
        if stem == "pos90":
            return MetricInfo(
                name, "pos90", False, (0.0, float(n) if n else None), forward,
                f"pos@90, {forward}{at}", n,
            )  # fmt: skip
        if stem == "acc":
            return MetricInfo(
                name, "acc", False, (0.0, 1.0), forward, f"accuracy, {forward}{at}", n
            )
        if stem == "agree":
            return MetricInfo(
                name, "agree", False, (0.0, 1.0), "exact decoding against the parallel forward",
                f"argmax agreement of the parallel forward with exact decoding{at}", n,
            )  # fmt: skip
        if stem == "ce":
            return MetricInfo(
                name, "ce", True, (0.0, None), forward, f"cross-entropy (nats), {forward}{at}", n
            )
        if stem == "bpb":
            return MetricInfo(
                name, "bpb", True, (0.0, None), forward, f"bits per byte, {forward}{at}", n
            )
    if name in ("loss", "final_loss") or name.startswith("loss"):
        return MetricInfo(
            name, "loss", True, (0.0, None), "the training forward",
            "training loss (the schedule's own parallel forward, on training batches)",
        )  # fmt: skip
    if name in ("bpb", "exact", "parallel") or name.startswith("bpb"):
        fwd = "parallel" if "parallel" in name else "exact"
        return MetricInfo(name, "bpb", True, (0.0, None), FORWARDS[fwd], f"bits per byte, {fwd}")
    if name == "lyap":
        return MetricInfo(
            name, "lyap", None, (None, None), "exact decoding",
            "Lyapunov exponent of the memory recurrence",
        )  # fmt: skip
    if name.startswith("sweep_change"):
        return MetricInfo(
            name, "sweep_change", True, (0.0, None), "the parallel forward",
            "memory change per refinement sweep",
        )  # fmt: skip
    return MetricInfo(name, "other", None, (None, None), "?", name)


def lower_is_better(metric: str, default: bool | None = None) -> bool | None:
    v = metric_info(metric).lower_is_better
    return default if v is None else v


def bounds(metric: str) -> tuple[float | None, float | None]:
    return metric_info(metric).bounds


def clip_interval(metric: str, lo: float, hi: float) -> tuple[float, float, bool]:
    """(lo, hi, clipped): a t-interval's bounds moved into the metric's range, and whether that
    moved either (a t-interval that leaves the range is a normal approximation a few seeds of a
    bounded metric do not support: the clipped interval says so with its mark)."""
    info = metric_info(metric)
    if lo is None or hi is None or any(isinstance(v, float) and math.isnan(v) for v in (lo, hi)):
        return lo, hi, False
    return info.clip(lo), info.clip(hi), info.outside(lo, hi)


# The metric a view opens on ----------------------------------------------------------------------
def task_metric(task: str, length: int) -> str:
    """A task's own figure at `length`: exact-decoding cross-entropy for a byte-level text task
    (read as bits per byte: ce / ln 2), exact-decoding pos@90 for every other task."""
    return f"ce_exact@{int(length)}" if task in TEXT_TASKS else f"pos90_exact@{int(length)}"


def primary_metric(runs: pd.DataFrame, study=None) -> str | None:
    """The metric a view of `runs` (a load_runs table) opens on, as a summary.eval key
    (`ce_exact@16`): the study's primary metric when `study` (a lrt_results.study.Study) is
    given, else the task's own figure at the training length of the runs (the length most of
    them trained at); None when the runs name no task."""
    if study is not None:
        return short_name(study.primary)
    if runs.empty or "config.train.task" not in runs:
        return None
    tasks = runs["config.train.task"].dropna().astype(str)
    if tasks.empty:
        return None
    task = tasks.value_counts().index[0]
    lengths = pd.to_numeric(
        runs.loc[tasks.index[tasks == task], "config.train.length"], errors="coerce"
    ).dropna()
    if lengths.empty:
        return None
    return task_metric(task, int(lengths.value_counts().index[0]))


def is_text(runs: pd.DataFrame) -> bool:
    """Whether every run of `runs` is of a byte-level text task."""
    if runs.empty or "config.train.task" not in runs:
        return False
    return bool(runs["config.train.task"].isin(TEXT_TASKS).all())


def direction_caption(metric: str) -> str:
    """`ce_exact@16: cross-entropy (nats), exact decoding at length 16; lower is better`."""
    info = metric_info(metric)
    return f"{info.name}: {info.label}; {info.direction}"
