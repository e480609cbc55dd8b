"""Dashboard page: the trainer frontier. Which trainer is the cheapest that learns the task?

One point per run that differs from the others only in its trainer
(`lrt_results.report.frontier_points`:
the plain transformer, or an LRT of the paper preset and init with nothing overridden),
exact-decoding pos@90 at an evaluation length against the compute the trainer ran or the run's wall
clock. The same selection draws docs/a5_trainer_frontier.png (experiments/results_tables.py
--figures docs).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from lrt_app.charts import color_encoding, draw_chart
from lrt_lab.store.metrics import TEXT_TASKS, metric_info
from lrt_results.report import format_mean_ci, frontier_points
from lrt_results.stats import mean_ci

AXES = {
    "compute": ("compute", "training compute (M token-forwards)"),
    "wall clock": ("wall_min", "wall clock of the run (min)"),
}


def frontier_choices(shown: pd.DataFrame) -> list[tuple[str, int]]:
    """(task, training length) pairs of the shown runs that
    have frontier points, most runs first."""
    if shown.empty or "config.train.task" not in shown:
        return []
    pairs = (
        shown.groupby(["config.train.task", "config.train.length"])
        .size()
        .sort_values(ascending=False)
    )
    return [
        (t, int(n)) for (t, n), _ in pairs.items() if not frontier_points(shown, t, int(n)).empty
    ]


def frontier_page(ctx) -> None:
    choices = frontier_choices(ctx.shown)
    if not choices:
        st.info(
            "No runs shown differ only in their trainer (the transformer, or an LRT of the paper "
            "preset "
            "and init with no override, trained at one length), e.g. "
            "`experiments/a5_trainer_frontier.toml`."
        )
        return
    default = choices.index(("a5_prefix", 16)) if ("a5_prefix", 16) in choices else 0
    task, length = st.selectbox(
        "task and training length",
        choices,
        index=default,
        key="frontier_task",
        format_func=lambda c: f"{c[0]} at length {c[1]}",
    )
    points = frontier_points(ctx.shown, task, length)
    # a byte-level text task is read by bits per byte (its pos@90 is 0 for every run)
    figure = "bpb_exact" if task in TEXT_TASKS else "pos90_exact"
    lengths = sorted(int(c.split("@")[1]) for c in points if c.startswith(f"{figure}@"))
    if not lengths:
        st.info(f"The {task} runs shown have no {figure} evaluations to draw the frontier from.")
        return
    left, right = st.columns(2)
    n = left.selectbox(
        "evaluated at",
        lengths,
        key="frontier_length",
        format_func=lambda v: f"{v} ({v / length:g}x the training length)",
    )
    axis = right.radio("x axis", list(AXES), horizontal=True, key="frontier_x")
    field, title = AXES[axis]
    y = f"{figure}@{n}"
    info = metric_info(y)
    y_title = f"exact pos@90 at {n}" if figure == "pos90_exact" else f"exact BPB at {n}"
    scale = {"domain": [0, n]} if figure == "pos90_exact" else {"zero": False}
    draw_chart(
        {
            "height": 360,
            "data": {"name": "points"},
            "mark": {"type": "point", "filled": True, "size": 90, "opacity": 0.85},
            "encoding": {
                "x": {"field": field, "type": "quantitative", "title": title},
                "y": {"field": y, "type": "quantitative", "title": y_title, "scale": scale},
                "color": color_encoding(sorted(points["trainer"].unique()), "trainer", "trainer"),
                "shape": {
                    "field": "seed",
                    "type": "nominal",
                    "title": "seed",
                    "legend": {"orient": "top", "direction": "horizontal"},
                },
                "tooltip": [{"field": c} for c in ("trainer", "seed", "compute", "wall_min", y)],
            },
        },
        points=points,
    )
    st.dataframe(frontier_summary(points, y, n).reset_index(), hide_index=True)
    if figure == "pos90_exact":
        st.caption(
            f"One point per run and seed (a seed run twice is one point). The cheapest trainer "
            f"whose points sit at {n} is the answer. Wall clock is each run's own (runs of a study "
            "may have shared the machine differently)."
        )
    else:
        st.caption(
            f"One point per run and seed (a seed run twice is one point): {info.label} "
            f"({info.direction}); the table: mean [95% t-interval over seeds]. Wall clock is each "
            "run's own."
        )


def frontier_summary(points: pd.DataFrame, y: str, n: int) -> pd.DataFrame:
    """Per trainer: its seeds, and how many learned (pos@90 at n) or its mean [interval] (any
    other figure), with its mean compute and wall clock."""
    rows = {}
    for trainer, g in points.groupby("trainer", sort=False):
        row = {"seeds": int(g[y].notna().sum())}
        if y.startswith("pos90_"):
            row["learned"] = int((g[y] == n).sum())
        else:
            s = mean_ci(g[y])
            row[y] = format_mean_ci(s["mean"], s["ci_low"], s["ci_high"])
        row["compute"] = g["compute"].mean()
        row["wall_min"] = g["wall_min"].mean()
        rows[trainer] = row
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "trainer"
    return out
