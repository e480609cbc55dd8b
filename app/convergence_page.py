"""Dashboard page for FixedPoint runs: sweeps used per training step, and the convergence
diagnostics (`lrt-lab analyze convergence RUN`) of trained runs.

Self-contained (it reads the store through lrt_app.store_data only) so app/views.py only lists the
page.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from lrt_app import store_data

HINT = (
    "No per-sweep diagnostics yet: run `lrt-lab analyze convergence RUN_FOLDER [...]` (it writes "
    "`tables/convergence.csv`: sweep, position, residual, error), then press Reload."
)


def sweeps_table(runs: pd.DataFrame, loader=None) -> pd.DataFrame:
    """(run, step, sweeps, residual) for every run whose training records carry `sweeps` (a
    dynamic schedule such as FixedPoint)."""
    loader = loader or store_data.metrics_of
    parts = []
    for _, row in runs.iterrows():
        m = loader(row["path"], "train")
        if m.empty or "sweeps" not in m.columns:
            continue
        cols = [c for c in ("step", "sweeps", "residual") if c in m.columns]
        parts.append(m[cols].dropna(subset=["sweeps"]).assign(run=row["run"]))
    if not parts:
        return pd.DataFrame(columns=["run", "step", "sweeps", "residual"])
    return pd.concat(parts, ignore_index=True)[["run"] + cols]


def trace_table(runs: pd.DataFrame, loader=None) -> pd.DataFrame:
    """(run, sweep, measure, value): the largest residual / error over positions after each sweep,
    from each run's tables/convergence.csv."""
    loader = loader or store_data.table_of
    parts = []
    for _, row in runs.iterrows():
        t = loader(row["path"], "convergence")
        if t is None or t.empty or not {"sweep", "residual", "error"} <= set(t.columns):
            continue
        per = t.groupby("sweep")[["residual", "error"]].max().reset_index()
        parts.append(
            per.melt(id_vars="sweep", var_name="measure", value_name="value").assign(run=row["run"])
        )
    if not parts:
        return pd.DataFrame(columns=["run", "sweep", "measure", "value"])
    return pd.concat(parts, ignore_index=True)


def convergence_page(ctx) -> None:
    if ctx.shown.empty:
        st.info("No runs match the filters in the sidebar.")
        return
    sweeps = sweeps_table(ctx.shown)
    st.subheader("Sweeps used per training step")
    if sweeps.empty:
        st.info(
            "No run shown trained with a dynamic schedule (`--schedule fixedpoint:TOL:MAX[:G]`)."
        )
    else:
        st.vega_lite_chart(
            sweeps,
            {
                "height": 300,
                "mark": {"type": "line", "interpolate": "step-after"},
                "encoding": {
                    "x": {"field": "step", "type": "quantitative"},
                    "y": {"field": "sweeps", "type": "quantitative", "title": "sweeps used"},
                    "color": {"field": "run", "type": "nominal"},
                    "tooltip": [{"field": c} for c in sweeps.columns],
                },
            },
            width="stretch",
        )
        st.caption(
            "Refinement sweeps after the init pass (no-grad sweeps until the memory changed by <= "
            "TOL, "
            "then the differentiated ones)."
        )
    st.subheader("Residual after each sweep (trained model, held-out batch)")
    trace = trace_table(ctx.shown)
    if trace.empty:
        st.info(HINT)
        return
    st.vega_lite_chart(
        trace.assign(value=trace["value"].clip(lower=1e-16)),
        {
            "height": 300,
            "mark": {"type": "line", "point": True},
            "encoding": {
                "x": {"field": "sweep", "type": "quantitative", "title": "sweep (0 = init pass)"},
                "y": {
                    "field": "value",
                    "type": "quantitative",
                    "scale": {"type": "log"},
                    "title": "max over positions, relative",
                },
                "color": {"field": "run", "type": "nominal"},
                "strokeDash": {"field": "measure", "type": "nominal"},
            },
        },
        width="stretch",
    )
    st.caption(
        "residual: change of the memory from the previous sweep; error: distance to the exact "
        "memory."
    )
