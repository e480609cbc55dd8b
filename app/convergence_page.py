"""Dashboard page for FixedPoint runs: sweeps used per training step, and the convergence
diagnostics (`lrt-lab analyze convergence RUN`) of trained runs.

Self-contained (it reads the store through lrt_app.store_data only) so app/views.py only lists the
page.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from lrt_app import store_data
from lrt_app.charts import color_encoding, draw_chart
from lrt_app.picker import pick_groups

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


def run_labels(runs: pd.DataFrame) -> dict:
    """run -> its group's label (named by what tells the groups drawn apart) and its seed."""
    if runs.empty:
        return {}
    seeds = runs["seed"].astype(str) if "seed" in runs else pd.Series("?", index=runs.index)
    labels = store_data.group_labels(runs) + " | seed=" + seeds
    # two runs of one seed in a group (a rerun): their names tell them apart
    labels = labels.where(~labels.duplicated(keep=False), labels + " | " + runs["run"])
    return dict(zip(runs["run"], labels))


def convergence_page(ctx) -> None:
    if ctx.shown.empty:
        st.info("No runs match the filters in the sidebar.")
        return
    sweeps, trace = sweeps_table(ctx.shown), trace_table(ctx.shown)
    drawn = ctx.shown[ctx.shown["run"].isin(set(sweeps["run"]) | set(trace["run"]))]
    if drawn.empty:
        st.info(
            "No run shown trained with a dynamic schedule (`--schedule fixedpoint:TOL:MAX[:G]`) "
            "or has convergence diagnostics. " + HINT
        )
        return
    drawn = pick_groups(drawn, "convergence")
    sweeps = sweeps[sweeps["run"].isin(set(drawn["run"]))]
    trace = trace[trace["run"].isin(set(drawn["run"]))]
    names = run_labels(drawn)
    st.subheader("Sweeps used per training step")
    if sweeps.empty:
        st.info(
            "No run shown trained with a dynamic schedule (`--schedule fixedpoint:TOL:MAX[:G]`)."
        )
    else:
        sweeps = sweeps.assign(label=sweeps["run"].map(names))
        draw_chart(
            {
                "height": 300,
                "data": {"name": "sweeps"},
                "mark": {"type": "line", "interpolate": "step-after"},
                "encoding": {
                    "x": {"field": "step", "type": "quantitative"},
                    "y": {"field": "sweeps", "type": "quantitative", "title": "sweeps used"},
                    "color": color_encoding(sorted(set(sweeps["label"])), "run", "label"),
                    "tooltip": [{"field": c} for c in sweeps.columns],
                },
            },
            sweeps=sweeps,
        )
        st.caption(
            "Refinement sweeps after the init pass (no-grad sweeps until the memory changed by <= "
            "TOL, "
            "then the differentiated ones)."
        )
    st.subheader("Residual after each sweep (trained model, held-out batch)")
    if trace.empty:
        st.info(HINT)
        return
    trace = trace.assign(value=trace["value"].clip(lower=1e-16), label=trace["run"].map(names))
    draw_chart(
        {
            "height": 300,
            "data": {"name": "trace"},
            "mark": {"type": "line", "point": True},
            "encoding": {
                "x": {"field": "sweep", "type": "quantitative", "title": "sweep (0 = init pass)"},
                "y": {
                    "field": "value",
                    "type": "quantitative",
                    "scale": {"type": "log"},
                    "title": "max over positions, relative",
                },
                "color": color_encoding(sorted(set(trace["label"])), "run", "label"),
                "strokeDash": {
                    "field": "measure",
                    "type": "nominal",
                    "legend": {
                        "orient": "top",
                        "direction": "horizontal",
                        "symbolType": "stroke",
                        "symbolStrokeColor": "gray",
                    },
                },
                "tooltip": [{"field": c} for c in ("run", "label", "sweep", "measure", "value")],
            },
        },
        trace=trace,
    )
    st.caption(
        "residual: change of the memory from the previous sweep; error: distance to the exact "
        "memory."
    )
