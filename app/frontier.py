"""Dashboard page: the trainer frontier. Which trainer is the cheapest that learns the task?

One point per run that differs from the others only in its trainer
(`lrt_lab.store.report.frontier_points`:
the plain transformer, or an LRT of the paper preset and init with nothing overridden),
exact-decoding
pos@90 at an evaluation length against the compute the trainer ran or the run's wall clock. The same
selection draws docs/a5_trainer_frontier.png (experiments/results_tables.py --figures docs).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from lrt_app.charts import color_encoding, draw_chart
from lrt_lab.store.report import frontier_points

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
    lengths = sorted(int(c.split("@")[1]) for c in points if c.startswith("pos90_exact@"))
    if not lengths:  # e.g. byte-level text, whose runs are read by BPB (the Scaling tab)
        st.info(f"The {task} runs shown have no pos@90 evaluations to draw the frontier from.")
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
    draw_chart(
        {
            "height": 360,
            "data": {"name": "points"},
            "mark": {"type": "point", "filled": True, "size": 90, "opacity": 0.85},
            "encoding": {
                "x": {"field": field, "type": "quantitative", "title": title},
                "y": {
                    "field": f"pos90_exact@{n}",
                    "type": "quantitative",
                    "title": f"exact pos@90 at {n}",
                    "scale": {"domain": [0, n]},
                },
                "color": color_encoding(sorted(points["trainer"].unique()), "trainer", "trainer"),
                "shape": {
                    "field": "seed",
                    "type": "nominal",
                    "title": "seed",
                    "legend": {"orient": "top", "direction": "horizontal"},
                },
                "tooltip": [
                    {"field": c}
                    for c in ("trainer", "seed", "compute", "wall_min", f"pos90_exact@{n}")
                ],
            },
        },
        points=points,
    )
    st.caption(
        f"One point per run and seed. The cheapest trainer whose points sit at {n} is the answer. "
        "Wall clock is each run's own (runs of a study may have shared the machine differently)."
    )
    learned = (
        points.assign(learned=points[f"pos90_exact@{n}"] == n)
        .groupby("trainer", sort=False)
        .agg(
            seeds=("seed", "count"),
            learned=("learned", "sum"),
            compute=("compute", "mean"),
            wall_min=("wall_min", "mean"),
        )
    )
    st.dataframe(learned.reset_index(), hide_index=True)
