"""Time to an event, from a run's evaluations: when pos@90 first reached the training length.

"Which trainer learns" is a question about *when*, and a run that stops before the event is
censored at its budget, not a failure at step 0. `first_reach` reads the evaluation lines of
metrics.jsonl; `reach_times` turns a store's runs into (time, reached) pairs that
`lrt_results.contrasts.kaplan_meier` and `logrank` summarise per arm. Time can be steps,
token-forwards (compute_tokens) or counted FLOPs. Torch-free.
"""

from __future__ import annotations

import math

import pandas as pd

from lrt_lab.store.results import Run

TIME_AXES = ("step", "compute_tokens", "flops")


def first_reach(records: list[dict], key: str, target: float) -> dict | None:
    """{"step", "compute_tokens", "flops"} of the first evaluation whose `key` is >= target, or
    None when no evaluation reached it (censored)."""
    for rec in records:
        if rec.get("kind") == "eval" and isinstance(rec.get(key), (int, float)):
            if rec[key] >= target:
                return {axis: rec.get(axis, math.nan) for axis in TIME_AXES}
    return None


def reach_times(runs: pd.DataFrame, mode: str = "exact", time: str = "step") -> pd.DataFrame:
    """Per run: when pos90_<mode>@<training length> first reached the training length.

    Columns run, time, reached (False: censored at the run's last evaluation, whose time is
    `time`). Runs without an evaluation are left out."""
    if time not in TIME_AXES:
        raise ValueError(f"time={time!r} is invalid; allowed: {', '.join(TIME_AXES)}")
    rows = []
    for _, row in runs.iterrows():
        length = int(row["config.train.length"])
        evals = Run(row["path"]).metrics_records(kind="eval")
        if not evals:
            continue
        hit = first_reach(evals, f"pos90_{mode}@{length}", length)
        at = hit if hit is not None else evals[-1]
        rows.append({"run": row["run"], "time": at.get(time, math.nan), "reached": hit is not None})
    return pd.DataFrame(rows, columns=["run", "time", "reached"])
