"""The dashboard's pages. Each takes the Context (store, runs shown) and draws with Streamlit;
the numbers come from lrt_app.store_data, the charts and colours from lrt_app.charts.

Layouts are sized for a 1400 px window with the sidebar open: facets wrap, legends sit under the
chart in columns, one metric family per y axis.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import pandas as pd
import streamlit as st

from lrt_app import store_data
from lrt_app.charts import (
    LEGEND,
    MAIN_WIDTH,
    PALETTE,
    color_encoding,
    data_key,
    draw_chart,
    only_groups,
    palette_note,
)
from lrt_app.compare import compare_page
from lrt_app.convergence_page import convergence_page  # FixedPoint runs
from lrt_app.delta import delta_page
from lrt_app.frontier import frontier_page
from lrt_app.picker import MAX_DEFAULT_GROUPS, pick_groups
from lrt_app.scaling_page import scaling_page  # runs trained to a tokens-per-parameter budget
from lrt_results.stats import MIN_SEEDS_T

# Where the analysis tables come from: shown when a store has none yet.
HINT_PROBES = (
    "No probe tables yet: run `lrt-lab analyze probe RUN_FOLDER [RUN_FOLDER ...]` (it writes "
    "`tables/probe_<decoding>.csv` into each run: site, position, control, accuracy), then press "
    "Reload."
)
HINT_GAP = (
    "No run shown has BPB tables: train the gap sweep (`lrt-lab sweep "
    "experiments/gap_recovery.toml`), then "
    "run `lrt-lab analyze gap STORE`, which evaluates each run's final checkpoint into its "
    "`tables/bpb.csv`; this page computes gap recovery, mismatch and refinement from those tables."
)
HINT_DEPTH = (
    "Only one depth in the runs shown ({depths}): train the same task at several depths "
    "(`lrt-lab sweep experiments/depth_sweep.toml`), then `lrt-lab analyze depth STORE` "
    "for the depth-sweep table."
)
MAX_DIFF_RUNS = 12


@dataclass
class Context:
    root: str
    runs: pd.DataFrame  # every readable run in the store
    shown: pd.DataFrame  # after the sidebar's filters and selection
    skipped: list = field(default_factory=list)

    def pick_groups(self, key: str, exclude=(), help: str | None = None, spread=None):
        """pick_groups over the runs shown."""
        return pick_groups(self.shown, key, exclude, help, spread)


def group_color(groups, title: str = "group of seeds") -> dict:
    """Colour encoding of the groups a page draws, in label order (the same picks, the same
    colours on every page)."""
    return color_encoding(sorted(set(groups)), title)


def guarded(title: str, view, ctx: Context) -> None:
    """Draw a view; a failure becomes one clear message in that view, never a traceback page."""
    try:
        view(ctx)
    except Exception as e:  # noqa: BLE001 (st.stop / st.rerun are BaseExceptions and pass through)
        st.error(f"{title} could not be drawn from this store: {type(e).__name__}: {e}")
        with st.expander("details"):
            st.code("".join(traceback.format_exception(e))[-4000:])


def _needs_runs(ctx: Context) -> bool:
    if ctx.shown.empty:
        st.info("No runs match the filters in the sidebar.")
        return False
    return True


# Vega-Lite building blocks
# -------------------------------------------------------------------------
def _q(name: str, title: str | None = None, **kw) -> dict:
    return {
        "field": name,
        "type": "quantitative",
        **({"title": title} if title is not None else {}),
        **kw,
    }


def _n(name: str, title: str | None = None, **kw) -> dict:
    return {
        "field": name,
        "type": "nominal",
        **({"title": title} if title is not None else {}),
        **kw,
    }


def _o(name: str, title: str | None = None, **kw) -> dict:
    return {
        "field": name,
        "type": "ordinal",
        **({"title": title} if title is not None else {}),
        **kw,
    }


def _tip(name: str, type_: str = "quantitative", fmt: str | None = None) -> dict:
    return {"field": name, "type": type_, **({"format": fmt} if fmt else {})}


DASH = {
    "field": "mode",
    "type": "nominal",
    "title": "decoding",
    "scale": {"domain": ["parallel", "exact"], "range": [[1, 0], [5, 3]]},
    # above the plot, across: the groups' legend has the space under it
    "legend": {
        "orient": "top",
        "direction": "horizontal",
        "symbolType": "stroke",
        "symbolStrokeColor": "gray",
        "symbolStrokeWidth": 2,
    },
}
ZOOM = [{"name": "zoom", "select": "interval", "bind": "scales"}]


def facet_columns(panel_width: int, extra: int = 90) -> int:
    """How many facet panels of `panel_width` px (plus axis and padding) fit in the main column."""
    return max(1, MAIN_WIDTH // (panel_width + extra))


def _heatmap(
    df: pd.DataFrame,
    x: str,
    y: str,
    facet: str,
    scheme: str,
    x_title: str,
    y_title: str,
    value_title: str,
    y_order: list | None = None,
    label_width: int = 0,
) -> None:
    """value in [0, 1] as coloured cells with the number written in, one panel per `facet`
    (wrapped to fit the main column); rows top to bottom in `y_order` (default: descending).
    label_width: room the y labels take (long group names), counted when wrapping."""
    n_x = max(int(df.groupby(facet)[x].nunique().max()), 1) if not df.empty else 1
    n_y = max(int(df.groupby(facet)[y].nunique().max()), 1) if not df.empty else 1
    width = min(420, max(120, 44 * n_x))
    # a step height ({"step": 22}) breaks Streamlit's sizing of facets; the colour bar fits in it
    height = max(100, 22 * n_y)
    spec = {
        "data": {"name": "cells"},
        "facet": _n(facet, None)
        | {"title": None, "header": {"labelLimit": width + label_width, "labelFontSize": 12}},
        "columns": facet_columns(width, 90 + label_width),
        "resolve": {"scale": {"x": "independent", "y": "independent"}},
        "spec": {
            "width": width,
            "height": height,
            "encoding": {
                "x": _o(x, x_title, axis={"labelAngle": 0}),
                "y": _o(
                    y,
                    sort=y_order if y_order is not None else "descending",
                    axis={"labelLimit": max(label_width, 120)},
                )
                # long row labels say what the rows are: no axis title (null, not the field name)
                | {"title": None if label_width else y_title},
            },
            "layer": [
                {
                    "mark": "rect",
                    "encoding": {
                        "color": _q(
                            "value",
                            value_title,
                            scale={"domain": [0, 1], "scheme": scheme},
                            legend={"gradientLength": min(200, height - 45)},
                        ),
                        "tooltip": [
                            _tip(facet, "nominal"),
                            _tip(x, "ordinal"),
                            _tip(y, "ordinal"),
                            _tip("value", fmt=".2f"),
                        ],
                    },
                },
                {
                    "mark": {"type": "text", "fontSize": 10},
                    "encoding": {
                        "text": _q("value", format=".2f"),
                        "color": {
                            "condition": {"test": "datum.value > 0.5", "value": "black"},
                            "value": "white",
                        },
                    },
                },
            ],
        },
    }
    draw_chart(spec, cells=df)


# Runs --------------------------------------------------------------------------------------------
def runs_page(ctx: Context) -> None:
    st.caption(f"{len(ctx.shown)} of {len(ctx.runs)} runs shown, from `{ctx.root}`")
    unknown = (
        ctx.runs[~ctx.runs["known_kind"].astype(bool)]
        if "known_kind" in ctx.runs.columns
        else ctx.runs.iloc[:0]
    )
    if not unknown.empty:
        kinds = ", ".join(sorted(set(unknown["kind"])))
        st.warning(
            f"{len(unknown)} run(s) of a model kind this dashboard does not know ({kinds}): "
            f"{', '.join(unknown['run'])}. They are listed and plotted under their raw kind; "
            "check their config before comparing them."
        )
    if not _needs_runs(ctx):
        return
    st.subheader("Groups of seeds")
    st.caption(
        "A group is every run whose config differs only by seed (and name); each group is named by "
        "the "
        "config fields that tell the groups shown apart. Every page pools seeds by this rule."
    )
    st.dataframe(store_data.group_overview(ctx.shown), hide_index=True)
    st.subheader("Runs")
    st.dataframe(store_data.runs_overview(ctx.shown), hide_index=True)
    names = list(ctx.shown["run"])
    st.markdown("**Runs shown:** " + ", ".join(f"`{n}`" for n in names))

    st.subheader("Config diff")
    if len(names) == 1:
        st.caption("One run shown: its full config (select two or more runs to see what differs).")
        st.json(store_data.config_of(ctx.shown.iloc[0]), expanded=1)
        return
    diff_runs = ctx.shown.head(MAX_DIFF_RUNS)
    if len(ctx.shown) > MAX_DIFF_RUNS:
        st.caption(
            f"The first {MAX_DIFF_RUNS} of {len(ctx.shown)} runs (narrow the selection in the "
            "sidebar)."
        )
    diff = store_data.config_diff(diff_runs)
    if diff.empty:
        st.info("The runs shown have identical configs.")
    else:
        st.caption("Config keys whose values differ between the runs shown.")
        st.table(diff)


# Training curves ---------------------------------------------------------------------------------
X_HELP = (
    "compute: baseline-equivalent tokens, i.e. tokens x schedule cost (an Interleaved(2) run is "
    "plotted at 2x its tokens, as in the paper); FLOPs (where every run recorded them): "
    "forward + backward FLOPs the trainer counted; wall-clock: seconds since the run started"
)


def curves_page(ctx: Context) -> None:
    if not _needs_runs(ctx):
        return
    runs = ctx.pick_groups("curves")
    if runs.empty:
        st.info("No group picked: open *Groups* above and pick some.")
        return
    metric, x_axis, smoothing, band_kind, log_y, show_runs, markers = _curve_controls(runs)
    long, notes = store_data.curves(runs, metric, x_axis, smoothing)
    for note in notes:
        st.caption(note)
    if long.empty:
        st.info(f"No {metric} records in the runs shown.")
        return
    band = store_data.seed_band(long, band=band_kind, bounds=store_data.metric_bounds(metric))
    switches = (
        store_data.curriculum_switches(runs, x_axis) if markers and metric == "loss" else None
    )
    color = group_color(band["group"])
    palette_note(len(color["scale"]["domain"]))
    tasks = sorted(band["task"].unique())
    for task in tasks:  # one metric family per y axis: losses of different tasks are not comparable
        if len(tasks) > 1:
            st.markdown(f"**{task}**")
        _curve_chart(
            band[band["task"] == task],
            long[long["task"] == task],
            None if switches is None else switches[switches["task"] == task],
            metric,
            x_axis,
            only_groups(color, set(band.loc[band["task"] == task, "group"])),
            band_kind,
            log_y,
            show_runs,
        )
    st.caption(
        "Lines: mean over seeds; "
        + band_caption(band, band_kind, metric)
        + " Dotted verticals: curriculum switches (the new training length on top). Drag to pan, "
        "scroll to zoom."
    )


def _curve_controls(runs) -> tuple:
    """The widgets above the learning curves: metric, x axis, smoothing, band, log y, seeds
    shown and curriculum markers, in that order."""
    c1, c2, c3 = st.columns([2, 3, 2])
    options = store_data.metric_options(runs)
    metric = c1.selectbox(
        "metric",
        options,
        index=options.index(store_data.default_metric(runs, options)),
        key="curve_metric",
        format_func=lambda m: f"{m} (training forward)" if m == "loss" else m,
        help="opens on the store's primary metric (exact-decoding cross-entropy for text, exact "
        "pos@90 for state tracking); loss is the training schedule's own parallel forward on "
        "training batches",
    )
    x_axis = c2.radio(
        "x axis",
        store_data.x_axis_options(runs),
        horizontal=True,
        key="curve_x",
        help=X_HELP,
    )
    smoothing = c3.slider(
        "smoothing",
        0.0,
        0.99,
        0.0,
        0.01,
        key="curve_smoothing",
        disabled=metric != "loss",
        help="exponential moving average of the training loss (debiased, as in TensorBoard)",
    )
    c4, c5, c6, c7 = st.columns([2, 1, 1, 2])
    band_kind = c4.radio(
        "band",
        list(store_data.BANDS),
        horizontal=True,
        key="curve_band",
        help="shaded band around the mean over seeds; a t-interval needs "
        f"{MIN_SEEDS_T} seeds: groups with fewer get their seeds' min to max",
    )
    log_y = c5.checkbox("log y", value=False, key="curve_log")
    show_runs = c6.checkbox("show each seed", value=False, key="curve_seeds")
    markers = c7.checkbox(
        "curriculum switches",
        value=True,
        key="curve_curriculum",
        help="dotted vertical lines where the training length steps up (the loss jumps there)",
    )
    return metric, x_axis, smoothing, band_kind, log_y, show_runs, markers


def band_caption(band: pd.DataFrame, band_kind: str, metric: str) -> str:
    """What the shaded bands are, group by group: which got a t-interval, which their seeds' min
    to max (too few seeds for a t-interval), which none, and the range they are clipped to."""
    if store_data.BANDS[band_kind] is None:
        return "no band."
    kinds = band.drop_duplicates("group").groupby("band")["n"].agg(["size", "min", "max"])
    parts = []
    for kind, text in (
        ("95% t-interval", "95% t-interval over seeds"),
        ("min-max", "min to max of the seeds"),
        ("none", "no band (one seed)"),
    ):
        if kind not in kinds.index:
            continue
        k = kinds.loc[kind]
        seeds = f"{k['min']}" if k["min"] == k["max"] else f"{k['min']}-{k['max']}"
        parts.append(f"{text} for {k['size']} group(s) of {seeds} seed(s)")
    text = "shaded band: " + "; ".join(parts) + "."
    if band_kind == "95% t-interval" and "min-max" in kinds.index:
        text += (
            f" A t-interval needs {MIN_SEEDS_T} seeds: over 2 it is the mean +- 12.7 "
            "standard errors."
        )
    lower, upper = store_data.metric_bounds(metric)
    if lower is not None or upper is not None:
        rng = f">= {lower:g}" if upper is None else f"in [{lower:g}, {upper:g}]"
        text += f" Bands are clipped to the metric's range ({metric} {rng})."
    return text


def _curve_chart(band, long, switches, metric, x_axis, color, band_kind, log_y, show_runs) -> None:
    x = _q("x", store_data.X_AXES[x_axis][1])
    y_scale = {"type": "log"} if log_y else {"zero": False}
    y = _q("mean", metric + (" (log scale)" if log_y else ""), scale=y_scale)
    layers = []
    datasets = {"band": band}
    if store_data.BANDS[band_kind]:
        keep = "datum.band !== 'none'" + (" && datum.lo > 0" if log_y else "")
        layers.append(
            {
                "data": {"name": "band"},
                "transform": [{"filter": keep}],
                "mark": {"type": "area", "opacity": 0.18},
                "encoding": {
                    "x": x,
                    "y": _q("lo", scale=y_scale),
                    "y2": {"field": "hi"},
                    "color": color,
                },
            }
        )
    layers.append(
        {
            "data": {"name": "band"},
            "mark": {"type": "line", "strokeWidth": 2},
            "params": ZOOM,
            "encoding": {
                "x": x,
                "y": y,
                "color": color,
                "tooltip": [
                    _tip("group", "nominal"),
                    {"field": "x", "type": "quantitative", "title": x_axis},
                    _tip("mean", fmt=".4g"),
                    _tip("lo", fmt=".4g"),
                    _tip("hi", fmt=".4g"),
                    _tip("band", "nominal"),
                    {"field": "n", "type": "quantitative", "title": "seeds"},
                ],
            },
        }
    )
    if show_runs:
        datasets["runs"] = long
        layers.append(
            {
                "data": {"name": "runs"},
                "mark": {"type": "line", "strokeWidth": 0.7, "opacity": 0.6},
                "encoding": {
                    "x": x,
                    "y": _q("y", scale=y_scale),
                    "color": color,
                    "detail": _n("run"),
                    "tooltip": [_tip("run", "nominal"), _tip("x"), _tip("y", fmt=".4g")],
                },
            }
        )
    if switches is not None and not switches.empty:
        datasets["switches"] = _switch_marks(switches)
        layers += _switch_layers(x)
    draw_chart({"height": 340, "layer": layers}, **datasets)


def _switch_marks(switches: pd.DataFrame) -> pd.DataFrame:
    """One curriculum switch per (x, new length), naming the groups that switch there."""
    marks = switches.groupby(["x", "length"], as_index=False).agg(
        groups=("group", lambda g: "; ".join(sorted(g)))
    )
    return marks


def _switch_layers(x: dict) -> list[dict]:
    """The curriculum switches: a dotted rule each, the new training length on top."""
    layers = []
    layers.append(
        {
            "data": {"name": "switches"},
            "mark": {"type": "rule", "strokeDash": [2, 3], "color": "#888"},
            "encoding": {
                "x": x,
                "tooltip": [_tip("length"), _tip("x"), _tip("groups", "nominal")],
            },
        }
    )
    layers.append(
        {
            "data": {"name": "switches"},
            "mark": {
                "type": "text",
                "baseline": "top",
                "dy": 2,
                "fontSize": 9,
                "color": "#666",
            },
            "encoding": {
                "x": x,
                "y": {"value": 0},
                "text": {"field": "length", "type": "nominal"},
            },
        }
    )
    return layers


# Length generalisation ---------------------------------------------------------------------------
def length_page(ctx: Context) -> None:
    if not _needs_runs(ctx):
        return
    runs = ctx.pick_groups("length")
    if runs.empty:
        st.info("No group picked: open *Groups* above and pick some.")
        return
    color = group_color(store_data.group_labels(runs))
    palette_note(len(color["scale"]["domain"]))
    figs = store_data.length_figures(runs)
    # a byte-level text task is read by bits per byte (its pos@90 is 0 for every run)
    bpb = [c for c in ("bpb_parallel", "bpb_exact") if c in figs.columns]
    figure, name = ("bpb", "BPB") if bpb else ("pos90", "pos@90")
    cols = [c for c in (f"{figure}_parallel", f"{figure}_exact") if c in figs.columns]
    st.subheader(f"{name} at each evaluation length")
    if figs.empty:
        st.info("No evaluation figures in the runs' summaries.")
    else:
        st.dataframe(store_data.length_summary(figs), hide_index=True)
        st.caption(
            "Cells: mean [95% t-interval over seeds, clipped to the figure's range: pos@90 at N "
            "in [0, N], accuracy in [0, 1], BPB >= 0] (n seeds); one seed: its value alone."
            + (" Bits per byte: lower is better." if bpb else "")
        )
    if not figs.empty and cols:
        _length_chart(figs, figure, name, cols, color)
    _per_position_section(runs, color)


def _length_chart(figs, figure: str, name: str, cols: list[str], color: dict) -> None:
    """The figure (pos@90 or BPB) against the evaluation length, parallel and exact."""
    pos = (
        figs.groupby(["group", "length"], as_index=False)[cols]
        .mean()
        .melt(id_vars=["group", "length"], value_vars=cols, var_name="mode", value_name="pos90")
    )
    pos["mode"] = pos["mode"].str.replace(f"{figure}_", "", regex=False)
    lengths = [int(n) for n in sorted(figs["length"].unique())]
    x = _q(
        "length",
        "evaluation length",
        scale={"type": "log", "base": 2},
        axis={"values": lengths, "format": "d"},
    )
    solved = [
        {
            "data": {"name": "solved"},
            "mark": {"type": "line", "color": "gray", "strokeDash": [2, 2]},
            "encoding": {"x": x, "y": _q("pos90")},
        }
    ]
    spec = {
        "height": 300,
        "layer": [
            *(solved if figure == "pos90" else []),
            {
                "data": {"name": "pos"},
                "mark": "line",
                "encoding": {
                    "x": x,
                    "y": _q(
                        "pos90",
                        f"{name} (mean over seeds)",
                        scale={"zero": figure == "pos90"},
                    ),
                    "color": color,
                    "strokeDash": DASH,
                },
            },
            {
                "data": {"name": "pos"},
                "mark": {"type": "point", "filled": True},
                "encoding": {
                    "x": x,
                    "y": _q("pos90"),
                    "color": color,
                    "tooltip": [
                        _tip("group", "nominal"),
                        _tip("mode", "nominal"),
                        _tip("length"),
                        _tip("pos90", fmt=".3g"),
                    ],
                },
            },
        ],
    }
    draw_chart(spec, pos=pos, solved=pd.DataFrame({"length": lengths, "pos90": lengths}))
    st.caption(
        "Solid: the training schedule's parallel forward; dashed: exact recurrent decoding; "
        + (
            "grey dotted: solved (pos@90 = length). "
            if figure == "pos90"
            else "bits per byte, lower is better. "
        )
        + "Lengths on a log scale."
    )


def _per_position_section(runs, color: dict) -> None:
    """Accuracy at each position, a panel per evaluation length, with the 0.9 and chance
    lines."""
    st.subheader("Per-position accuracy")
    pp, missing = store_data.per_position(runs)
    if missing:
        st.caption(f"No tables/per_position.csv in: {', '.join(missing)}")
    if pp.empty:
        st.info("No per-position tables in the runs shown.")
        return
    mean = pp.groupby(["group", "length", "mode", "position"], as_index=False)["accuracy"].mean()
    refs = _reference_lines(runs)
    # A facet reads one dataset: the reference lines are rows of it too, repeated for every panel.
    lengths = sorted(mean["length"].unique())
    cells = pd.concat(
        [mean.assign(kind="curve"), *(refs.assign(kind="ref", length=n) for n in lengths)],
        ignore_index=True,
    )
    width = 280
    spec = {
        "data": {"name": "pp"},
        "facet": _o("length", "evaluation length"),
        "columns": facet_columns(width, 70),
        "resolve": {"scale": {"x": "independent"}},
        "spec": {
            "width": width,
            "height": 200,
            "layer": [
                {
                    "transform": [{"filter": "datum.kind === 'ref'"}],
                    "mark": {"type": "rule", "strokeDash": [1, 3], "color": "#555"},
                    "encoding": {
                        "y": _q("y"),
                        "tooltip": [_tip("what", "nominal"), _tip("y", fmt=".3f")],
                    },
                },
                {
                    "transform": [{"filter": "datum.kind === 'curve'"}],
                    "mark": "line",
                    "encoding": {
                        "x": _q("position", "position", axis={"format": "d", "tickMinStep": 1}),
                        "y": _q("accuracy", "accuracy (mean over seeds)", scale={"domain": [0, 1]}),
                        "color": color,
                        "strokeDash": DASH,
                        "tooltip": [
                            _tip("group", "nominal"),
                            _tip("mode", "nominal"),
                            _tip("length"),
                            _tip("position"),
                            _tip("accuracy", fmt=".3f"),
                        ],
                    },
                },
            ],
        },
    }
    draw_chart(spec, pp=cells)
    st.caption(
        "Solid: parallel forward; dashed: exact decoding. Dotted: 0.9 (pos@90 is the last position "
        "before "
        "accuracy first drops below it) and chance (1 / the task's vocabulary). Panels wrap; each "
        "has its "
        "own position axis."
    )


def _reference_lines(runs) -> pd.DataFrame:
    """The per-position chart's dotted lines: 0.9 (the pos@90 threshold) and each chance level."""
    chance = store_data.chance_levels(runs)
    refs = pd.DataFrame({"y": [0.9], "what": ["0.9 (pos@90 threshold)"]})
    if not chance.empty:
        levels = chance.groupby("chance")["group"].apply(list)
        refs = pd.concat(
            [
                refs,
                pd.DataFrame(
                    {
                        "y": levels.index,
                        "what": [
                            f"chance 1/{round(1 / c)}"
                            + ("" if len(levels) == 1 else f" ({len(g)} group(s))")
                            for c, g in levels.items()
                        ],
                    }
                ),
            ],
            ignore_index=True,
        )
    return refs


# Depth x length ----------------------------------------------------------------------------------
def depth_page(ctx: Context) -> None:
    if not _needs_runs(ctx):
        return
    c1, c2 = st.columns(2)
    mode = c1.radio("decoding", ["exact", "parallel"], horizontal=True, key="depth_mode")
    measure = c2.radio(
        "cell value",
        ["solved", "fraction"],
        horizontal=True,
        key="depth_measure",
        help="solved: share of runs whose pos@90 reaches the full length; "
        "fraction: mean pos@90 / length",
    )
    runs = ctx.pick_groups(
        "depth",
        exclude=("n_layer",),
        spread="n_layer",
        help="groups of seeds, every depth of each (a row per depth); by default at most "
        f"{MAX_DEFAULT_GROUPS}: those trained at several depths first, of the task and training "
        "length with the most of them",
    )
    grid = store_data.solved_grid(runs, mode, measure)
    depths = sorted(runs["n_layer"].dropna().unique().tolist())
    if grid.empty:
        st.info(f"No pos90_{mode}@L figures in the runs' summaries.")
    else:
        if len(depths) < 2:
            st.info(HINT_DEPTH.format(depths=", ".join(f"n_layer={d}" for d in depths) or "none"))
        order = list(grid.sort_values(["group", "depth"])["row"].drop_duplicates())
        label_width = min(420, 7 * max(len(r) for r in order))
        _heatmap(
            grid,
            "length",
            "row",
            "task",
            "viridis",
            "evaluation length",
            "group and depth",
            measure,
            y_order=order,
            label_width=label_width,
        )
        st.caption(
            "One panel per task; a row per group of seeds and depth (so a depth sweep reads down "
            "a panel), "
            f"a column per evaluation length; {mode} decoding: "
            + (
                "share of runs (seeds) whose pos@90 reaches the full length."
                if measure == "solved"
                else "mean pos@90 / length."
            )
        )

    for t in store_data.analysis_tables(ctx.root, ctx.shown, "depth_sweep", "depth_worth"):
        st.subheader(f"{t['name']} ({t['owner']})")
        raw = store_data.table_of(t["path"], t["name"])
        if raw is None:
            st.warning(f"{t['file']}: unreadable table")
            continue
        if t["kind"] == "depth_worth":
            st.caption(
                "For each LRT: the smallest transformer depth that matches it, and the depth it "
                "saves."
            )
            st.dataframe(raw, hide_index=True)
            continue
        sweep, shape, msg = store_data.read_depth_sweep(raw)
        if msg:
            st.warning(f"{t['file']}: {msg}")
        elif shape == "grid":
            _heatmap(sweep, "length", "depth", "group", "viridis", "length", "depth", "solved")
        else:
            metric = raw["metric"].dropna().unique() if "metric" in raw.columns else []
            _depth_curve(sweep, str(metric[0]) if len(metric) == 1 else "metric (mean over seeds)")


def _depth_curve(sweep: pd.DataFrame, metric: str) -> None:
    """Mean metric vs depth (CI bars) per method; a method at one depth only (the LRT) is a point
    with a dashed line at its level, so the depth where the transformers reach it reads off."""
    groups = sorted(sweep["group"].unique())
    color = color_encoding(groups, "method")
    depths = sorted(int(d) for d in sweep["depth"].unique())
    x = _q("depth", "depth (layers)", axis={"values": depths, "format": "d"})
    y_title = metric
    layers = [
        {
            "data": {"name": "swept"},
            "mark": {"type": "line", "point": {"filled": True}},
            "encoding": {"x": x, "y": _q("mean", y_title), "color": color},
        },
        {
            "data": {"name": "all"},
            "mark": {"type": "rule"},
            "encoding": {
                "x": x,
                "y": _q("ci_low", y_title),
                "y2": {"field": "ci_high"},
                "color": color,
            },
        },
        {
            "data": {"name": "single"},
            "mark": {"type": "point", "shape": "diamond", "size": 120, "filled": True},
            "encoding": {"x": x, "y": _q("mean", y_title), "color": color},
        },
        {
            "data": {"name": "single"},
            "mark": {"type": "rule", "strokeDash": [4, 3]},
            "encoding": {"y": _q("mean", y_title), "color": color},
        },
        {
            "data": {"name": "all"},
            "mark": {"type": "point", "opacity": 0},
            "encoding": {
                "x": x,
                "y": _q("mean", y_title),
                "tooltip": [
                    _tip("group", "nominal"),
                    _tip("depth"),
                    _tip("mean", fmt=".3g"),
                    _tip("ci_low", fmt=".3g"),
                    _tip("ci_high", fmt=".3g"),
                ],
            },
        },
    ]
    draw_chart(
        {"height": 300, "layer": layers},
        all=sweep,
        swept=sweep[sweep["swept"]],
        single=sweep[~sweep["swept"]],
    )
    st.caption(
        "Mean over seeds with confidence intervals; a method trained at one depth (the LRT) is a "
        "diamond "
        "with a dashed line at its level."
    )


# Gap recovery ------------------------------------------------------------------------------------
def gap_page(ctx: Context) -> None:
    computed, notes = store_data.stored_gap(ctx.shown) if not ctx.shown.empty else ({}, [])
    if computed:
        st.caption(
            "Computed from the runs' `tables/bpb.csv` (validation BPB with the parallel forward, "
            "with exact "
            "decoding and after each stage, written once per run by `lrt-lab analyze gap`), so it "
            "follows the filters and needs no checkpoints."
        )
        for note in notes:
            st.caption(note)
        _gap_views(computed, "runs shown")
        return
    tables = store_data.analysis_tables(
        ctx.root, ctx.shown, "gap_recovery", "mismatch", "refinement"
    )
    if not tables:
        st.info(HINT_GAP)
        return
    st.caption(
        "From the store's analysis tables (`.analysis/tables/`, written by `lrt-lab analyze gap`); "
        "the runs shown have no `tables/bpb.csv` to compute them from."
    )
    for t in tables:
        raw = store_data.table_of(t["path"], t["name"])
        if raw is None:
            st.warning(f"{t['file']}: unreadable table")
            continue
        if t["kind"] == "gap_recovery" and t["name"].endswith("_per_seed"):
            continue
        seeds = None
        if t["kind"] == "gap_recovery":
            seeds = next(
                (
                    store_data.table_of(u["path"], u["name"])
                    for u in tables
                    if u["name"] == f"{t['name']}_per_seed" and u["path"] == t["path"]
                ),
                None,
            )
        _gap_views(
            {t["kind"]: raw, **({"gap_recovery_per_seed": seeds} if seeds is not None else {})},
            f"{t['name']} ({t['owner']})",
            file=t["file"],
        )


def _gap_views(tables: dict, source: str, file: str = "") -> None:
    """Gap recovery bars, the train/inference mismatch and BPB per refinement, as plots."""
    raw = tables.get("gap_recovery")
    if raw is not None:
        st.subheader("Gap recovery" + (f": {source}" if file else ""))
        bars, points, msg = store_data.read_gap(raw, tables.get("gap_recovery_per_seed"))
        if msg:
            st.warning(f"{file or source}: {msg}")
        else:
            _gap_bars(bars, points)
            about = store_data.gap_caption(raw)
            st.caption(
                "Recovered fraction of the gap between the baseline and exact sequential training "
                "(1 = all of it, 0 = none): (baseline - method) / (baseline - exact) per seed, "
                "seeds paired. "
                "Bars: mean over seeds; whiskers: 95% bootstrap interval over seeds"
                + ("; dots: individual seeds" if points is not None else "")
                + (f". {about}." if about else ".")
            )
        with st.expander("table"):
            st.dataframe(raw, hide_index=True)
    _table_section(
        tables.get("mismatch"),
        "Train/inference mismatch",
        source,
        file,
        store_data.read_mismatch,
        "method, parallel, exact",
        _mismatch_chart,
        "Each method's metric with its training schedule's parallel forward and with exact "
        "recurrent "
        "decoding (what generation uses); a gap between the two is the mismatch. Mean over seeds, "
        "whiskers: 95% t-interval over seeds.",
    )
    _table_section(
        tables.get("refinement"),
        "BPB after each refinement",
        source,
        file,
        store_data.read_refinement,
        "method, stage, stage_index, mean",
        _refinement_chart,
        "BPB of the logits after each stage of the parallel schedule (init = the one-pass "
        "forward), "
        "then under exact decoding. Mean over seeds; whiskers: 95% t-interval over seeds.",
    )


def _table_section(
    raw, title: str, source: str, file: str, read, expected: str, chart, caption: str
) -> None:
    """One analysis table as a plot (`read` turns it into the plot's data, None if its columns are
    wrong), with its caption and the raw table behind an expander."""
    if raw is None:
        return
    st.subheader(title + (f": {source}" if file else ""))
    shaped = read(raw)
    if shaped is None:
        st.warning(f"{file or source}: expected columns {expected}")
    else:
        chart(shaped)
        st.caption(caption)
    with st.expander("table"):
        st.dataframe(raw, hide_index=True)


def _mismatch_chart(long: pd.DataFrame) -> None:
    order = list(dict.fromkeys(long["label"]))
    x = _n("label", "method", sort=order, axis={"labelAngle": 0, "labelLimit": 220})
    y = _q("value", "metric (mean over seeds)", scale={"zero": False})
    color = {
        "field": "decoding",
        "type": "nominal",
        "title": "decoding",
        "legend": LEGEND,
        "scale": {"domain": ["parallel", "exact"], "range": ["#1f77b4", "#d62728"]},
    }
    layers = [
        {
            "data": {"name": "mm"},
            "mark": {"type": "rule", "strokeWidth": 1.5},
            "encoding": {
                "x": x,
                "xOffset": _n("decoding", sort=["parallel", "exact"]),
                "y": _q("ci_low", scale={"zero": False}),
                "y2": {"field": "ci_high"},
                "color": color,
            },
        },
        {
            "data": {"name": "mm"},
            "mark": {"type": "point", "filled": True, "size": 70},
            "encoding": {
                "x": x,
                "xOffset": _n("decoding", sort=["parallel", "exact"]),
                "y": y,
                "color": color,
                "tooltip": [
                    _tip("label", "nominal"),
                    _tip("decoding", "nominal"),
                    _tip("value", fmt=".4f"),
                    _tip("ci_low", fmt=".4f"),
                    _tip("ci_high", fmt=".4f"),
                ],
            },
        },
    ]
    draw_chart({"height": 280, "layer": layers}, mm=long)


def _refinement_chart(ref: pd.DataFrame) -> None:
    stages = list(ref.sort_values("stage_index")["stage"].drop_duplicates())
    labels = sorted(ref["label"].unique())
    color = color_encoding(labels, "method", "label")
    x = _o("stage", "stage", sort=stages, axis={"labelAngle": 0})
    y = _q("mean", "BPB (mean over seeds)", scale={"zero": False})
    layers = [
        {
            "data": {"name": "ref"},
            "mark": {"type": "line", "point": {"filled": True}},
            "encoding": {
                "x": x,
                "y": y,
                "color": color,
                "tooltip": [
                    _tip("label", "nominal"),
                    _tip("stage", "nominal"),
                    _tip("mean", fmt=".4f"),
                    _tip("ci_low", fmt=".4f"),
                    _tip("ci_high", fmt=".4f"),
                    _tip("n"),
                ],
            },
        },
        {
            "data": {"name": "ref"},
            "mark": {"type": "rule", "opacity": 0.5},
            "encoding": {
                "x": x,
                "y": _q("ci_low", scale={"zero": False}),
                "y2": {"field": "ci_high"},
                "color": color,
            },
        },
    ]
    draw_chart({"height": 300, "layer": layers}, ref=ref)


def _gap_bars(bars: pd.DataFrame, points: pd.DataFrame | None) -> None:
    order = list(dict.fromkeys(bars["label"]))
    x = _n(
        "label",
        "method",
        sort=order,
        scale={"paddingInner": 0.4},
        axis={"labelAngle": 0, "labelLimit": 300},
    )
    y_title = "gap recovered"
    layers = [
        {
            "data": {"name": "bars"},
            "mark": {"type": "bar", "opacity": 0.8},
            "encoding": {
                "x": x,
                "y": _q("mean", y_title),
                "color": _n("label", None, sort=order, legend=None, scale={"range": PALETTE}),
                "tooltip": [
                    _tip("label", "nominal"),
                    _tip("mean", fmt=".3f"),
                    _tip("ci_low", fmt=".3f"),
                    _tip("ci_high", fmt=".3f"),
                ],
            },
        }
    ]
    ci = bars.dropna(subset=["ci_low", "ci_high"])
    if not ci.empty:
        layers.append(
            {
                "data": {"name": "ci"},
                "mark": {"type": "rule", "color": "black"},
                "encoding": {"x": x, "y": _q("ci_low", y_title), "y2": {"field": "ci_high"}},
            }
        )
        for end in ("ci_low", "ci_high"):
            layers.append(
                {
                    "data": {"name": "ci"},
                    "mark": {"type": "tick", "color": "black", "size": 14, "thickness": 1.5},
                    "encoding": {"x": x, "y": _q(end, y_title)},
                }
            )
    datasets = {"bars": bars, "ci": ci}
    if points is not None and not points.empty:
        datasets["points"] = points
        layers.append(
            {
                "data": {"name": "points"},
                "mark": {"type": "circle", "color": "black", "size": 30, "opacity": 0.7},
                "encoding": {
                    "x": x,
                    "y": _q("value", y_title),
                    "tooltip": [_tip("label", "nominal"), _tip("value", fmt=".3f")],
                },
            }
        )
    layers.append(
        {
            "data": {"values": [{"y": 0}, {"y": 1}]},
            "mark": {"type": "rule", "color": "gray", "strokeDash": [3, 3], "opacity": 0.6},
            "encoding": {"y": _q("y", y_title)},
        }
    )
    draw_chart({"height": 300, "layer": layers}, **datasets)


# Probes ------------------------------------------------------------------------------------------
def probes_page(ctx: Context) -> None:
    tables = store_data.analysis_tables(ctx.root, ctx.shown, "probe")
    if not tables:
        st.info(HINT_PROBES)
        return
    parts, names = [], {}
    for t in tables:
        raw = store_data.table_of(t["path"], t["name"])
        probe, msg = (
            store_data.read_probe(raw, t["owner"], t["name"])
            if raw is not None
            else (None, "unreadable table")
        )
        if msg:
            st.warning(f"{t['file']}: {msg}")
            continue
        parts.append(probe)
        names[f"{t['owner']} / {t['name']}"] = set(probe["label"])
    if not parts:
        return
    probes = pd.concat(parts, ignore_index=True)
    options = list(names)
    # full width, not in a column: in a column Streamlit keeps the chips on one row that scrolls
    # sideways, hiding the tables picked past the first two
    picked = st.multiselect(
        "probe tables",
        options,
        default=options[:6],
        key=data_key("probe_tables", options),
        help="one heatmap per run and decoding; the first six are shown by default",
    )
    controls = sorted(probes["control"].unique(), key=lambda c: (c != "probe", c))
    control = st.selectbox(
        "control",
        controls,
        key=data_key("probe_control", controls),
        help="probe: the trained probe; majority / shuffled_labels / random_init: the baselines "
        "it has to beat",
    )
    labels = set().union(*(names[p] for p in picked)) if picked else set()
    cells = probes[probes["label"].isin(labels) & (probes["control"] == control)]
    if cells.empty:
        st.info("Pick a probe table above.")
        return
    cells = cells.groupby(["label", "row", "position"], as_index=False, sort=False).agg(
        value=("accuracy", "mean"), row_order=("row_order", "mean")
    )
    y_order = list(
        cells.sort_values(["row_order", "row"], ascending=[False, True])["row"].drop_duplicates()
    )
    _heatmap(
        cells,
        "position",
        "row",
        "label",
        "magma",
        "position",
        "site",
        f"accuracy ({control})",
        y_order=y_order,
        label_width=140,
    )
    st.caption(
        "Linear-probe test accuracy per site (layer, or the memory in / out; '(t-1)': the memory "
        "against "
        "the previous step's state) and position."
    )


# Compare comes first: the dashboard opens on the store's most recent study.
PAGES = {
    "Compare": compare_page,
    "Runs": runs_page,
    "Training curves": curves_page,
    "Delta": delta_page,
    "Length generalisation": length_page,
    "Depth x length": depth_page,
    "Gap recovery": gap_page,
    "Probes": probes_page,
    "Convergence": convergence_page,
    "Trainer frontier": frontier_page,
    "Scaling": scaling_page,
}


def store_messages(ctx: Context) -> None:
    """Skipped folders (half-written, corrupt, still running): one clear message per kind."""
    bad = [(n, r) for n, r in ctx.skipped if not r.startswith("incomplete")]
    running = [n for n, r in ctx.skipped if r.startswith("incomplete")]
    if bad:
        st.warning(
            f"{len(bad)} folder(s) in the store are not readable runs and are left out: "
            + "; ".join(f"`{n}`: {r}" for n, r in bad)
        )
    if running:
        st.info(
            f"{len(running)} run(s) have no summary yet (still training, or killed; `--resume` "
            "them) "
            f"and are left out: {', '.join(running)}. Tick *include incomplete runs* to see their "
            "curves."
        )
