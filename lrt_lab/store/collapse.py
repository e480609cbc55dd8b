"""The collapse event of a run: a metric that had reached a low level and went back above a high
one (the A5 studies read exact cross-entropy at 16 back above 3 nats after it was below 1).

Torch-free: it reads a run's evaluation records (`Run.metrics_records()`, or any dicts with
"kind", "step", "flops" and the metric).
"""

from __future__ import annotations

import math


def first_collapse(
    records, metric: str = "ce_exact@16", high: float = 3.0, low: float = 1.0
) -> dict | None:
    """{"step", "flops"} of the first evaluation whose `metric` is above `high` after an earlier
    evaluation's was below `low`; None when the run never collapsed (or never got below `low`).
    Evaluations without the metric, or with a non-finite value, are passed over."""
    reached_low = False
    for r in records:
        if r.get("kind") != "eval":
            continue
        value = r.get(metric)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        if reached_low and value > high:
            return {"step": r.get("step"), "flops": r.get("flops")}
        reached_low = reached_low or value < low
    return None
