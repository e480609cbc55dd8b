"""Dashboard page: each group's metric minus a baseline group's, at matched steps, compute or
FLOPs (lrt_app.store_data.delta_curves: paired by seed, with an interval that suits the number of
pairs), as curves over training and as a table at the end of the range both groups covered.

Self-contained (it reads the store through lrt_app.store_data only) so app/views.py only lists it.
"""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from lrt_app import store_data
from lrt_app.charts import color_encoding, data_key, draw_chart, palette_note
from lrt_lab.store.metrics import metric_info
from lrt_lab.store.run_groups import one_run_per_seed
from lrt_results.stats import MIN_SEEDS_T

# x axes a delta is matched on: the work done, not the time the machine took
X_CHOICES = ("steps", "compute", "FLOPs")
PREFERRED_BASELINE = "transformer"


def default_baseline(groups: list[str]) -> int:
    """Index of the baseline the page opens on: the plain transformer's group if there is one."""
    for i, g in enumerate(groups):
        if g.split(" | ", 1)[0] == PREFERRED_BASELINE:
            return i
    return 0


STUDY_SCOPE = "the study"
PICKED_SCOPE = "groups picked"
# a study's budget axis -> the x a delta is matched at
STUDY_X = {"step": "steps", "compute_tokens": "compute", "flops": "FLOPs"}


def study_runs(ctx, found: dict) -> pd.DataFrame:
    """The runs shown that are the study's arms (one run per seed)."""
    names = {n for runs in found["arms"].values() for n in runs}
    return ctx.shown[ctx.shown["run"].isin(names)]


def study_labels(runs: pd.DataFrame, found: dict) -> pd.Series:
    """Each run of the study by the arm its spec names it in (`transformer`, `lrt
    interleaved:2`, ...)."""
    arm_of = {name: arm for arm, names in found["arms"].items() for name in names}
    return runs["run"].map(arm_of)


def _delta_scope(ctx) -> tuple:
    """What is compared: the store's study (its arms, when its runs are shown) or the groups
    picked; (the study found or None, one run per seed, the scope chosen)."""
    found = store_data.store_study(ctx.root, ctx.runs)
    scope = PICKED_SCOPE
    if found is not None and not study_runs(ctx, found).empty:
        study = found["study"]
        scope = st.radio(
            "compare",
            [STUDY_SCOPE, PICKED_SCOPE],
            horizontal=True,
            key="delta_scope",
            help=f"the study: the arms of {found['path']}'s [study] against its baseline, paired "
            "by seed as its contrasts are, on its primary metric; groups picked: any groups of "
            "the runs shown",
        )
    if scope == STUDY_SCOPE:
        runs = one_run_per_seed(study_runs(ctx, found))
        st.caption(
            f"Study ({found['path']}): {study.question} Primary metric: {study.primary} "
            f"({'lower' if study.lower_is_better else 'higher'} is better)."
        )
    else:
        found = None
        runs = one_run_per_seed(ctx.pick_groups("delta"))
    return found, runs, scope


def _delta_controls(runs, groups: list[str], found, scope: str) -> tuple:
    """The widgets above the deltas: baseline, metric, x axis matched at, smoothing."""
    base = found["study"].contrasts[0].a if found else None
    c1, c2, c3 = st.columns([3, 2, 2])
    baseline = c1.selectbox(
        "baseline",
        groups,
        index=groups.index(base) if base in groups else default_baseline(groups),
        key=data_key(f"delta_baseline_{scope}", groups),
        help="every other group is drawn as its metric minus this group's",
    )
    options = store_data.metric_options(runs)
    first = store_data.default_metric(runs, options, found["study"] if found else None)
    metric = c2.selectbox(
        "metric",
        options,
        index=options.index(first),
        key=data_key(f"delta_metric_{scope}", options),
        format_func=lambda m: f"{m} (training forward)" if m == "loss" else m,
        help="opens on the store's primary metric: the study's, else the task's own figure "
        "(exact-decoding cross-entropy for text, exact pos@90 for state tracking); loss is the "
        "training schedule's own parallel forward on training batches",
    )
    x_options = [x for x in store_data.x_axis_options(runs) if x in X_CHOICES]
    x_first = STUDY_X.get(found["study"].time_axis, "steps") if found else "steps"
    x_axis = c3.radio(
        "matched at",
        x_options,
        index=x_options.index(x_first) if x_first in x_options else 0,
        horizontal=True,
        key="delta_x",
        help="steps: the same training step; compute: the same baseline-equivalent tokens "
        "(tokens x schedule cost); FLOPs (where every run recorded them): the same forward + "
        "backward FLOPs",
    )
    smoothing = st.slider(
        "smoothing",
        0.0,
        0.99,
        0.9,
        0.01,
        key="delta_smoothing",
        disabled=metric != "loss",
        help="exponential moving average of each run's training loss before the difference",
    )
    return baseline, metric, x_axis, smoothing


def delta_page(ctx) -> None:
    if ctx.shown.empty:
        st.info("No runs match the filters in the sidebar.")
        return
    found, runs, scope = _delta_scope(ctx)
    # the study's groups are its arms, named as its spec names them (and report --study)
    labels = study_labels(runs, found) if found else store_data.group_labels(runs)
    groups = sorted(set(labels))
    if len(groups) < 2:
        st.info("Open *Groups* above and pick the baseline and at least one other group.")
        return
    baseline, metric, x_axis, smoothing = _delta_controls(runs, groups, found, scope)
    long, notes = store_data.curves(
        runs, metric, x_axis, smoothing if metric == "loss" else 0.0, labels=labels
    )
    deltas, more = store_data.delta_curves(long, baseline)
    for note in notes + more:
        st.caption(note)
    if deltas.empty:
        st.info(f"No group of the baseline's task to compare with {baseline} on {metric}.")
        return
    deltas = deltas.assign(**{c: deltas[c].astype(float) for c in ("mean", "lo", "hi")})
    others = sorted(deltas["group"].unique())
    palette_note(len(others))
    delta_chart(deltas, others, metric, x_axis, baseline)
    summary = store_data.delta_summary(deltas)
    st.dataframe(display_summary(summary, x_axis), hide_index=True)
    info = metric_info(metric)
    lower = info.direction
    smoothed = (
        f" (each run's loss smoothed first: moving average, weight {smoothing:g})"
        if metric == "loss" and smoothing > 0
        else ""
    )
    st.caption(
        f"{metric}{smoothed} of each group minus {baseline}'s ({lower} for {metric}), at matched "
        f"{x_axis} over the range both ran. Paired by seed: the difference of the runs of one "
        "seed, then the mean over seeds; band: 95% t-interval over the pairs from "
        f"{MIN_SEEDS_T} "
        "pairs, the pairs' min to max with 2, none with 1; a group that shares no seed with the "
        "baseline is the difference of the means, unpaired, with no band. The table: at the end "
        "of the matched range."
    )
    st.caption(store_data.metric_caption(metric))
    if found is not None:
        said = [
            v for v, c in zip(found["verdicts"], found["study"].contrasts) if c.metric == metric
        ]
        if said:
            st.markdown(
                "**The study's decision** (`lrt-lab report --study`: each run's final value, "
                "permutation test with Holm):\n" + "\n".join(f"- {v}" for v in said)
            )


def display_summary(summary: pd.DataFrame, x_axis: str) -> pd.DataFrame:
    def cell(v) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"

    return pd.DataFrame(
        {
            "group": summary["group"],
            f"at {x_axis}": [cell(v) for v in summary["x"]],
            "delta": [cell(v) for v in summary["delta"]],
            "interval": [
                "-" if kind == "none" else f"[{cell(lo)}, {cell(hi)}] ({kind})"
                for lo, hi, kind in zip(summary["lo"], summary["hi"], summary["band"])
            ],
            "pairs": summary["pairs"],
            "seeds": summary["seeds"],
        }
    )


def delta_chart(deltas: pd.DataFrame, others: list, metric: str, x_axis: str, baseline) -> None:
    color = color_encoding(others, "group minus the baseline")
    x = {"field": "x", "type": "quantitative", "title": store_data.X_AXES[x_axis][1]}
    y_title = f"{metric} minus the baseline's"
    layers = [
        {
            "data": {"name": "delta"},
            "transform": [{"filter": "datum.band !== 'none'"}],
            "mark": {"type": "area", "opacity": 0.18},
            "encoding": {
                "x": x,
                "y": {"field": "lo", "type": "quantitative", "title": y_title},
                "y2": {"field": "hi"},
                "color": color,
            },
        },
        {
            "data": {"name": "delta"},
            "mark": {"type": "line", "strokeWidth": 2},
            "params": [{"name": "zoom", "select": "interval", "bind": "scales"}],
            "encoding": {
                "x": x,
                "y": {"field": "mean", "type": "quantitative", "title": y_title},
                "color": color,
                "tooltip": [
                    {"field": "group", "type": "nominal"},
                    {"field": "x", "type": "quantitative", "title": x_axis},
                    {"field": "mean", "type": "quantitative", "title": "delta", "format": ".4g"},
                    {"field": "lo", "type": "quantitative", "format": ".4g"},
                    {"field": "hi", "type": "quantitative", "format": ".4g"},
                    {"field": "band", "type": "nominal"},
                    {"field": "seeds", "type": "nominal"},
                ],
            },
        },
        {
            "data": {"values": [{"y": 0}]},
            "mark": {"type": "rule", "color": "#555", "strokeDash": [4, 3]},
            "encoding": {"y": {"field": "y", "type": "quantitative", "title": y_title}},
        },
    ]
    draw_chart({"height": 320, "layer": layers}, delta=deltas)
    st.caption(f"Dashed: no difference from the baseline ({baseline}).")
