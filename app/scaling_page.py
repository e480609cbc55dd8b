"""Dashboard page for runs trained to a tokens-per-parameter budget: held-out BPB against compute
(the paper's scaling figure, in miniature), the LRT-minus-transformer deltas and the decision the
pre-stated rule gives (lrt_results.scaling).

Self-contained (it reads only the runs the sidebar shows) so app/views.py only lists the page.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from lrt_app.charts import color_encoding, draw_chart
from lrt_lab.store.results import load_plans
from lrt_results.scaling import (
    METRICS,
    X_AXES,
    check_same_heldout,
    decide,
    paired_deltas,
    planned_seeds,
    scaling_points,
)
from lrt_results.scaling import curves as scaling_curves

HINT = (
    "No run shown was trained to a budget in tokens per parameter: train with `lrt-lab train ... "
    "--tokens-per-param R`, or run the grid `lrt-lab sweep experiments/scaling_text.toml` and open "
    "its store, `lrt-lab app --runs experiments/scaling_runs`."
)


def scaling_page(ctx) -> None:
    points = scaling_points(ctx.shown) if not ctx.shown.empty else pd.DataFrame()
    if points.empty:
        st.info(HINT)
        return
    try:
        check_same_heldout(points)
    except ValueError as e:
        st.warning(str(e))
        return
    left, right = st.columns(2)
    x = left.selectbox("x-axis", list(X_AXES), format_func=X_AXES.get, key="scaling_x")
    metric = right.selectbox("metric", list(METRICS), format_func=METRICS.get, key="scaling_y")
    curves = scaling_curves(points, x, metric)
    base = {
        "x": {"field": "x", "type": "quantitative", "scale": {"type": "log"}, "title": X_AXES[x]},
        "color": color_encoding(sorted(curves["method"].unique()), "method", "method"),
    }
    draw_chart(
        {
            "height": 360,
            "data": {"name": "curves"},
            "layer": [
                {
                    "mark": {"type": "area", "opacity": 0.15},
                    "encoding": {
                        **base,
                        "y": {"field": "low", "type": "quantitative", "scale": {"zero": False}},
                        "y2": {"field": "high"},
                    },
                },
                {  # the same interval as a bar at each point: a method at one budget (a
                    # rival at C = 40) has no band to show it
                    "mark": {"type": "rule"},
                    "encoding": {
                        **base,
                        "y": {"field": "low", "type": "quantitative", "scale": {"zero": False}},
                        "y2": {"field": "high"},
                    },
                },
                {
                    "mark": {"type": "line", "point": True},
                    "encoding": {
                        **base,
                        "y": {
                            "field": "mean",
                            "type": "quantitative",
                            "title": METRICS[metric],
                            "scale": {"zero": False},
                        },
                        "tooltip": [{"field": c} for c in curves.columns],
                    },
                },
            ],
        },
        curves=curves,
    )
    st.caption(
        "Seed means; the band is a 95% t-interval of the mean where a budget has 3 seeds or "
        "more, the seeds' lowest to highest value where it has 2."
    )
    deltas = paired_deltas(points, metric=metric)
    planned = planned_seeds(points, load_plans(ctx.root))
    st.markdown(
        f"**Decision** (the rule stated before the grid ran"
        f"{'' if planned is None else f', waiting for the {planned} seeds the grid plans'}): "
        f"{decide(deltas, planned_seeds=planned)}"
    )
    if not deltas.empty:
        st.dataframe(deltas.round(4), hide_index=True, width="stretch")
        st.caption(
            "delta: LRT (Interleaved(2)) minus transformer, paired by seed; token-matched: the "
            "same R; compute-matched: the transformer at the LRT's C; 95% Student's t interval."
        )
