"""When each arm of a study learns: Kaplan-Meier curves of the share of seeds whose pos@90 has
reached the training length, against steps, token-forwards or counted FLOPs.

A run that never reaches it is censored at its last evaluation, not counted as failing at step
0: "which trainer learns" is a question about when, and the honest answer for a seed still
descending at its budget is "not by then" (lrt_lab.store.events, lrt_results.contrasts).

    plot_time_to_event(store, study, "km.png", run_names=names)  # `lrt-lab report --study` does
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lrt_results.contrasts import kaplan_meier
from lrt_results.figures import save_figure
from lrt_results.study import Study, arm_reach_times

AXIS_TITLES = {
    "step": "training step",
    "compute_tokens": "training compute (token-forwards)",
    "flops": "training FLOPs (forward + backward, counted)",
}


def reach_curves(runs, study: Study, run_names=None) -> pd.DataFrame:
    """One step curve per arm: columns arm, time, reached (the Kaplan-Meier share of its seeds that
    have reached the training length by then, 1 - survival), low, high (its 95% Greenwood
    band), runs (the arm's run count); each curve starts at (0, 0). Arms without runs are left
    out."""
    rows = []
    for arm, times in arm_reach_times(runs, study, run_names).items():
        if times.empty:
            continue
        curve, _ = kaplan_meier(times["time"], times["reached"], None)
        start = pd.DataFrame({"time": [0.0], "survival": [1.0], "ci_low": [1.0], "ci_high": [1.0]})
        curve = pd.concat([start, curve], ignore_index=True)
        rows.append(
            pd.DataFrame(
                {
                    "arm": arm,
                    "time": curve["time"],
                    "reached": 1 - curve["survival"],
                    "low": 1 - curve["ci_high"],
                    "high": 1 - curve["ci_low"],
                    "runs": len(times),
                }
            )
        )
    columns = ["arm", "time", "reached", "low", "high", "runs"]
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=columns)


def plot_time_to_event(runs, study: Study, path, run_names=None) -> Path | None:
    """reach_curves drawn as steps with their bands, one colour per arm; None (nothing written)
    when no arm has runs yet."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = reach_curves(runs, study, run_names)
    if curves.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (arm, c) in enumerate(curves.groupby("arm", sort=False)):
        color = f"C{i % 10}"
        n = int(c["runs"].iloc[0])
        label = f"{arm} ({n} run{'s' if n != 1 else ''})"
        ax.step(c["time"], c["reached"], where="post", color=color, label=label)
        ax.fill_between(c["time"], c["low"], c["high"], step="post", color=color, alpha=0.12)
    ax.set_xlabel(AXIS_TITLES[study.time_axis])
    ax.set_ylabel(f"share of seeds at pos@90 = length ({study.time_to_event})")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return save_figure(fig, path)
