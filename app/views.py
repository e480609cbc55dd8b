"""The dashboard's pages. Each takes the Context (store, runs shown) and draws with Streamlit;
the numbers come from app.data.

Charts are plain Vega-Lite specs drawn in the browser (st.vega_lite_chart, data shipped as Arrow):
cheap on the server, with tooltips and zoom, and one colour per group of seeds on every page.
(Altair would build the same specs, but its import and per-chart schema validation cost seconds of
CPU per page view on a small machine.)
"""

from __future__ import annotations

import traceback
import zlib
from dataclasses import dataclass, field

import pandas as pd
import streamlit as st

from app import data

# Where the analysis tables come from: shown when a store has none yet.
HINT_PROBES = ("No probe tables yet: run `python -m lrt_lab.analysis probe RUN_FOLDER [RUN_FOLDER ...]` (it writes "
               "`tables/probe_<decoding>.csv` into each run: site, position, control, accuracy), then press Reload.")
HINT_GAP = ("No gap-recovery tables yet: train the gap sweep (`lrt-lab sweep experiments/gap_recovery.toml`), then run "
            "`python -m lrt_lab.analysis gap STORE` (it writes `STORE/.analysis/tables/gap_recovery.csv`: method, "
            "recovered, ci_low, ci_high), then press Reload.")
HINT_DEPTH = ("Only one depth in the runs shown ({depths}): train the same task at several depths "
              "(`lrt-lab sweep experiments/depth_sweep.toml`), then `python -m lrt_lab.analysis depth STORE` "
              "for the depth-sweep table.")
MAX_DIFF_RUNS = 12
TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


@dataclass
class Context:
    root: str
    runs: pd.DataFrame            # every readable run in the store
    shown: pd.DataFrame           # after the sidebar's filters and selection
    skipped: list = field(default_factory=list)

    def color(self, title: str = "method") -> dict:
        """Colour encoding by group of seeds, the same colour for a group on every chart."""
        groups = sorted(set(data.group_labels(self.shown))) if not self.shown.empty else []
        return {"field": "group", "type": "nominal", "title": title, "legend": {"labelLimit": 400},
                "scale": {"domain": groups, "range": [TAB10[i % len(TAB10)] for i in range(len(groups))]}}


def guarded(title: str, view, ctx: Context) -> None:
    """Draw a view; a failure becomes one clear message in that view, never a traceback page."""
    try:
        view(ctx)
    except Exception as e:  # noqa: BLE001 (st.stop / st.rerun are BaseExceptions and pass through)
        st.error(f"{title} could not be drawn from this store: {type(e).__name__}: {e}")
        with st.expander("details"):
            st.code("".join(traceback.format_exception(e))[-4000:])


def data_key(name: str, options) -> str:
    """A widget key that changes with its options, so a stale choice never outlives its store."""
    return f"{name}-{zlib.crc32(repr(list(map(str, options))).encode()):08x}"


def _needs_runs(ctx: Context) -> bool:
    if ctx.shown.empty:
        st.info("No runs match the filters in the sidebar.")
        return False
    return True


# Vega-Lite building blocks -------------------------------------------------------------------------
def _chart(spec: dict, **datasets: pd.DataFrame) -> None:
    """Draw a spec whose layers name their data ({"data": {"name": key}}) from `datasets`."""
    st.vega_lite_chart({**spec, "datasets": {k: v.reset_index(drop=True) for k, v in datasets.items()}},
                       width="stretch")


def _q(name: str, title: str | None = None, **kw) -> dict:
    return {"field": name, "type": "quantitative", **({"title": title} if title is not None else {}), **kw}


def _n(name: str, title: str | None = None, **kw) -> dict:
    return {"field": name, "type": "nominal", **({"title": title} if title is not None else {}), **kw}


def _o(name: str, title: str | None = None, **kw) -> dict:
    return {"field": name, "type": "ordinal", **({"title": title} if title is not None else {}), **kw}


def _tip(name: str, type_: str = "quantitative", fmt: str | None = None) -> dict:
    return {"field": name, "type": type_, **({"format": fmt} if fmt else {})}


DASH = {"field": "mode", "type": "nominal", "title": "decoding",
        "scale": {"domain": ["parallel", "exact"], "range": [[1, 0], [5, 3]]},
        "legend": {"symbolType": "stroke", "symbolStrokeColor": "gray", "symbolStrokeWidth": 2}}
ZOOM = [{"name": "zoom", "select": "interval", "bind": "scales"}]


def _heatmap(df: pd.DataFrame, x: str, y: str, facet: str, scheme: str, x_title: str, y_title: str,
             value_title: str, y_order: list | None = None, columns: int = 3) -> None:
    """value in [0, 1] as coloured cells with the number written in, one panel per `facet`;
    rows top to bottom in `y_order` (default: descending)."""
    n_x = max(int(df[x].nunique()), 1)
    spec = {
        "data": {"name": "cells"},
        "facet": _n(facet, None) | {"title": None},
        "columns": columns,
        "spec": {
            "width": min(520, max(200, 30 * n_x)),
            "height": max(120, 24 * len(y_order)) if y_order is not None else 180,
            "encoding": {"x": _o(x, x_title, axis={"labelAngle": 0}),
                         "y": _o(y, y_title, sort=y_order if y_order is not None else "descending")},
            "layer": [
                {"mark": "rect", "encoding": {
                    "color": _q("value", value_title, scale={"domain": [0, 1], "scheme": scheme}),
                    "tooltip": [_tip(facet, "nominal"), _tip(x, "ordinal"), _tip(y, "ordinal"),
                                _tip("value", fmt=".2f")]}},
                {"mark": {"type": "text", "fontSize": 10}, "encoding": {
                    "text": _q("value", format=".2f"),
                    "color": {"condition": {"test": "datum.value > 0.5", "value": "black"}, "value": "white"}}},
            ],
        },
    }
    _chart(spec, cells=df)


# Runs --------------------------------------------------------------------------------------------
def runs_page(ctx: Context) -> None:
    st.caption(f"{len(ctx.shown)} of {len(ctx.runs)} runs shown, from `{ctx.root}`")
    unknown = ctx.runs[~ctx.runs["known_kind"].astype(bool)] if "known_kind" in ctx.runs.columns else ctx.runs.iloc[:0]
    if not unknown.empty:
        kinds = ", ".join(sorted(set(unknown["kind"])))
        st.warning(f"{len(unknown)} run(s) of a model kind this dashboard does not know ({kinds}): "
                   f"{', '.join(unknown['run'])}. They are listed and plotted under their raw kind; "
                   "check their config before comparing them.")
    if not _needs_runs(ctx):
        return
    st.dataframe(data.runs_overview(ctx.shown), hide_index=True)
    names = list(ctx.shown["run"])
    st.markdown("**Runs shown:** " + ", ".join(f"`{n}`" for n in names))

    st.subheader("Config diff")
    if len(names) == 1:
        st.caption("One run shown: its full config (select two or more runs to see what differs).")
        st.json(data.config_of(ctx.shown.iloc[0]), expanded=1)
        return
    diff_runs = ctx.shown.head(MAX_DIFF_RUNS)
    if len(ctx.shown) > MAX_DIFF_RUNS:
        st.caption(f"The first {MAX_DIFF_RUNS} of {len(ctx.shown)} runs (narrow the selection in the sidebar).")
    diff = data.config_diff(diff_runs)
    if diff.empty:
        st.info("The runs shown have identical configs.")
    else:
        st.caption("Config keys whose values differ between the runs shown.")
        st.table(diff)


# Training curves ---------------------------------------------------------------------------------
def curves_page(ctx: Context) -> None:
    if not _needs_runs(ctx):
        return
    c1, c2, c3 = st.columns([2, 2, 1])
    metric = c1.selectbox("metric", data.metric_options(ctx.shown), key="curve_metric")
    x_axis = c2.radio("x axis", list(data.X_AXES), horizontal=True, key="curve_x",
                      help="compute: baseline-equivalent tokens, i.e. tokens x schedule cost "
                           "(an Interleaved(2) run is plotted at 2x its tokens, as in the paper)")
    smoothing = c3.slider("smoothing", 0.0, 0.99, 0.0, 0.01, key="curve_smoothing",
                          disabled=metric != "loss", help="exponential moving average of the training loss")
    show_runs = st.checkbox("show each seed", value=False, key="curve_seeds")
    long, notes = data.curves(ctx.shown, metric, x_axis, smoothing)
    for note in notes:
        st.caption(note)
    if long.empty:
        st.info(f"No {metric} records in the runs shown.")
        return
    band = data.seed_band(long)
    x = _q("x", data.X_AXES[x_axis][1])
    color = ctx.color()
    layers = [
        {"data": {"name": "band"}, "transform": [{"filter": "datum.n > 1"}],
         "mark": {"type": "area", "opacity": 0.2},
         "encoding": {"x": x, "y": _q("lo"), "y2": {"field": "hi"}, "color": color}},
        {"data": {"name": "band"}, "mark": {"type": "line", "strokeWidth": 2}, "params": ZOOM,
         "encoding": {"x": x, "y": _q("mean", metric, scale={"zero": False}), "color": color,
                      "tooltip": [_tip("group", "nominal"), {"field": "x", "type": "quantitative", "title": x_axis},
                                  _tip("mean", fmt=".4g"), _tip("lo", fmt=".4g"), _tip("hi", fmt=".4g"),
                                  {"field": "n", "type": "quantitative", "title": "seeds"}]}},
    ]
    if show_runs:
        layers.append({"data": {"name": "runs"}, "mark": {"type": "line", "strokeWidth": 0.7, "opacity": 0.6},
                       "encoding": {"x": x, "y": _q("y"), "color": color, "detail": _n("run"),
                                    "tooltip": [_tip("run", "nominal"), _tip("x"), _tip("y", fmt=".4g")]}})
    _chart({"height": 360, "layer": layers}, band=band, runs=long)
    st.caption("Lines: mean over seeds; shaded band: min to max over seeds (runs with the same label differ "
               "only by seed). Drag to pan, scroll to zoom.")


# Length generalisation ---------------------------------------------------------------------------
def length_page(ctx: Context) -> None:
    if not _needs_runs(ctx):
        return
    color = ctx.color()
    figs = data.length_figures(ctx.shown)
    cols = [c for c in ("pos90_parallel", "pos90_exact") if c in figs.columns]
    st.subheader("pos@90 at each evaluation length")
    if figs.empty:
        st.info("No evaluation figures in the runs' summaries.")
    else:
        st.table(data.length_summary(figs))
    if not figs.empty and cols:
        pos = (figs.groupby(["group", "length"], as_index=False)[cols].mean()
               .melt(id_vars=["group", "length"], value_vars=cols, var_name="mode", value_name="pos90"))
        pos["mode"] = pos["mode"].str.replace("pos90_", "", regex=False)
        lengths = [int(n) for n in sorted(figs["length"].unique())]
        x = _q("length", "evaluation length", axis={"values": lengths, "format": "d"})
        spec = {"height": 300, "layer": [
            {"data": {"name": "solved"}, "mark": {"type": "line", "color": "gray", "strokeDash": [2, 2]},
             "encoding": {"x": x, "y": _q("pos90")}},
            {"data": {"name": "pos"}, "mark": "line",
             "encoding": {"x": x, "y": _q("pos90", "pos@90 (mean over seeds)"), "color": color, "strokeDash": DASH}},
            {"data": {"name": "pos"}, "mark": {"type": "point", "filled": True},
             "encoding": {"x": x, "y": _q("pos90"), "color": color,
                          "tooltip": [_tip("group", "nominal"), _tip("mode", "nominal"), _tip("length"),
                                      _tip("pos90", fmt=".3g")]}},
        ]}
        _chart(spec, pos=pos, solved=pd.DataFrame({"length": lengths, "pos90": lengths}))
        st.caption("Solid: the training schedule's parallel forward; dashed: exact recurrent decoding; "
                   "grey dotted: solved (pos@90 = length).")

    st.subheader("Per-position accuracy")
    pp, missing = data.per_position(ctx.shown)
    if missing:
        st.caption(f"No tables/per_position.csv in: {', '.join(missing)}")
    if pp.empty:
        st.info("No per-position tables in the runs shown.")
        return
    mean = pp.groupby(["group", "length", "mode", "position"], as_index=False)["accuracy"].mean()
    spec = {
        "data": {"name": "pp"},
        "facet": _o("length", "evaluation length"),
        "columns": 3,
        "resolve": {"scale": {"x": "independent"}},
        "spec": {"width": 300, "height": 220, "mark": "line", "encoding": {
            "x": _q("position", "position", axis={"format": "d", "tickMinStep": 1}),
            "y": _q("accuracy", "accuracy (mean over seeds)", scale={"domain": [0, 1]}),
            "color": color, "strokeDash": DASH,
            "tooltip": [_tip("group", "nominal"), _tip("mode", "nominal"), _tip("length"), _tip("position"),
                        _tip("accuracy", fmt=".3f")]}},
    }
    _chart(spec, pp=mean)
    st.caption("Solid: parallel forward; dashed: exact decoding. pos@90 is the last position before accuracy "
               "first drops below 0.9.")


# Depth x length ----------------------------------------------------------------------------------
def depth_page(ctx: Context) -> None:
    if not _needs_runs(ctx):
        return
    c1, c2 = st.columns(2)
    mode = c1.radio("decoding", ["exact", "parallel"], horizontal=True, key="depth_mode")
    measure = c2.radio("cell value", ["solved", "fraction"], horizontal=True, key="depth_measure",
                       help="solved: share of runs whose pos@90 reaches the full length; "
                            "fraction: mean pos@90 / length")
    grid = data.solved_grid(ctx.shown, mode, measure)
    depths = sorted(ctx.shown["n_layer"].dropna().unique().tolist())
    if grid.empty:
        st.info(f"No pos90_{mode}@L figures in the runs' summaries.")
    else:
        if len(depths) < 2:
            st.info(HINT_DEPTH.format(depths=", ".join(f"n_layer={d}" for d in depths) or "none"))
        _heatmap(grid, "length", "depth", "group", "viridis", "evaluation length", "depth (layers)", measure)
        st.caption(f"From the runs' summaries, {mode} decoding: "
                   + ("share of runs (seeds) whose pos@90 reaches the full length." if measure == "solved"
                      else "mean pos@90 / length."))

    for t in data.analysis_tables(ctx.root, ctx.shown, "depth_sweep", "depth_worth"):
        st.subheader(f"{t['name']} ({t['owner']})")
        raw = data.table_of(t["path"], t["name"])
        if raw is None:
            st.warning(f"{t['file']}: unreadable table")
            continue
        if t["kind"] == "depth_worth":
            st.caption("For each LRT: the smallest transformer depth that matches it, and the depth it saves.")
            st.dataframe(raw, hide_index=True)
            continue
        sweep, shape, msg = data.read_depth_sweep(raw)
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
    color = {"field": "group", "type": "nominal", "title": "method", "legend": {"labelLimit": 400},
             "scale": {"domain": groups, "range": [TAB10[i % len(TAB10)] for i in range(len(groups))]}}
    depths = sorted(int(d) for d in sweep["depth"].unique())
    x = _q("depth", "depth (layers)", axis={"values": depths, "format": "d"})
    y_title = metric
    layers = [
        {"data": {"name": "swept"}, "mark": {"type": "line", "point": {"filled": True}},
         "encoding": {"x": x, "y": _q("mean", y_title), "color": color}},
        {"data": {"name": "all"}, "mark": {"type": "rule"},
         "encoding": {"x": x, "y": _q("ci_low", y_title), "y2": {"field": "ci_high"}, "color": color}},
        {"data": {"name": "single"}, "mark": {"type": "point", "shape": "diamond", "size": 120, "filled": True},
         "encoding": {"x": x, "y": _q("mean", y_title), "color": color}},
        {"data": {"name": "single"}, "mark": {"type": "rule", "strokeDash": [4, 3]},
         "encoding": {"y": _q("mean", y_title), "color": color}},
        {"data": {"name": "all"}, "mark": {"type": "point", "opacity": 0},
         "encoding": {"x": x, "y": _q("mean", y_title),
                      "tooltip": [_tip("group", "nominal"), _tip("depth"), _tip("mean", fmt=".3g"),
                                  _tip("ci_low", fmt=".3g"), _tip("ci_high", fmt=".3g")]}},
    ]
    _chart({"height": 300, "layer": layers}, all=sweep, swept=sweep[sweep["swept"]], single=sweep[~sweep["swept"]])
    st.caption("Mean over seeds with confidence intervals; a method trained at one depth (the LRT) is a diamond "
               "with a dashed line at its level.")


# Gap recovery ------------------------------------------------------------------------------------
def gap_page(ctx: Context) -> None:
    tables = data.analysis_tables(ctx.root, ctx.shown, "gap_recovery", "mismatch", "refinement")
    main = [t for t in tables if t["kind"] == "gap_recovery" and not t["name"].endswith("_per_seed")]
    if not main:
        st.info(HINT_GAP)
    for t in main:
        st.subheader(f"{t['name']} ({t['owner']})")
        raw = data.table_of(t["path"], t["name"])
        if raw is None:
            st.warning(f"{t['file']}: unreadable table")
            continue
        seeds = next((data.table_of(u["path"], u["name"]) for u in tables
                      if u["name"] == f"{t['name']}_per_seed" and u["path"] == t["path"]), None)
        bars, points, msg = data.read_gap(raw, seeds)
        if msg:
            st.warning(f"{t['file']}: {msg}")
            continue
        _gap_bars(bars, points)
        about = data.gap_caption(raw)
        st.caption("Recovered fraction of the gap between the baseline and exact sequential training "
                   "(1 = all of it). Bars: mean over seeds; whiskers: confidence interval"
                   + ("; dots: individual seeds" if points is not None else "") + (f". {about}." if about else "."))
        with st.expander("table"):
            st.dataframe(raw, hide_index=True)
    for t in tables:
        if t["kind"] in ("mismatch", "refinement"):
            raw = data.table_of(t["path"], t["name"])
            st.subheader(f"{t['name']} ({t['owner']})")
            st.caption({"mismatch": "Each method's parallel-forward metric next to its exact decoding.",
                        "refinement": "The metric after each stage of the parallel schedule, and under decoding."}
                       [t["kind"]])
            if raw is None:
                st.warning(f"{t['file']}: unreadable table")
            else:
                st.dataframe(raw, hide_index=True)


def _gap_bars(bars: pd.DataFrame, points: pd.DataFrame | None) -> None:
    order = list(dict.fromkeys(bars["label"]))
    x = _n("label", "method", sort=order, scale={"paddingInner": 0.4}, axis={"labelAngle": -20, "labelLimit": 300})
    y_title = "gap recovered"
    layers = [{"data": {"name": "bars"}, "mark": {"type": "bar", "opacity": 0.8}, "encoding": {
        "x": x, "y": _q("mean", y_title),
        "color": _n("label", None, sort=order, legend=None, scale={"range": TAB10}),
        "tooltip": [_tip("label", "nominal"), _tip("mean", fmt=".3f"), _tip("ci_low", fmt=".3f"),
                    _tip("ci_high", fmt=".3f")]}}]
    ci = bars.dropna(subset=["ci_low", "ci_high"])
    if not ci.empty:
        layers.append({"data": {"name": "ci"}, "mark": {"type": "rule", "color": "black"},
                       "encoding": {"x": x, "y": _q("ci_low", y_title), "y2": {"field": "ci_high"}}})
        for end in ("ci_low", "ci_high"):
            layers.append({"data": {"name": "ci"}, "mark": {"type": "tick", "color": "black", "size": 14,
                                                            "thickness": 1.5},
                           "encoding": {"x": x, "y": _q(end, y_title)}})
    datasets = {"bars": bars, "ci": ci}
    if points is not None and not points.empty:
        datasets["points"] = points
        layers.append({"data": {"name": "points"}, "mark": {"type": "circle", "color": "black", "size": 30,
                                                            "opacity": 0.7},
                       "encoding": {"x": x, "y": _q("value", y_title),
                                    "tooltip": [_tip("label", "nominal"), _tip("value", fmt=".3f")]}})
    layers.append({"data": {"values": [{"y": 0}, {"y": 1}]}, "mark": {"type": "rule", "color": "gray",
                                                                      "strokeDash": [3, 3], "opacity": 0.6},
                   "encoding": {"y": _q("y", y_title)}})
    _chart({"height": 300, "layer": layers}, **datasets)


# Probes ------------------------------------------------------------------------------------------
def probes_page(ctx: Context) -> None:
    tables = data.analysis_tables(ctx.root, ctx.shown, "probe")
    if not tables:
        st.info(HINT_PROBES)
        return
    parts, names = [], {}
    for t in tables:
        raw = data.table_of(t["path"], t["name"])
        probe, msg = data.read_probe(raw, t["owner"], t["name"]) if raw is not None else (None, "unreadable table")
        if msg:
            st.warning(f"{t['file']}: {msg}")
            continue
        parts.append(probe)
        names[f"{t['owner']} / {t['name']}"] = set(probe["label"])
    if not parts:
        return
    probes = pd.concat(parts, ignore_index=True)
    c1, c2 = st.columns([3, 1])
    options = list(names)
    picked = c1.multiselect("probe tables", options, default=options[:6], key=data_key("probe_tables", options),
                            help="one heatmap per run and decoding; the first six are shown by default")
    controls = sorted(probes["control"].unique(), key=lambda c: (c != "probe", c))
    control = c2.selectbox("control", controls, key=data_key("probe_control", controls),
                           help="probe: the trained probe; majority / shuffled_labels / random_init: the baselines "
                                "it has to beat")
    labels = set().union(*(names[p] for p in picked)) if picked else set()
    cells = probes[probes["label"].isin(labels) & (probes["control"] == control)]
    if cells.empty:
        st.info("Pick a probe table above.")
        return
    cells = cells.groupby(["label", "row", "position"], as_index=False, sort=False).agg(
        value=("accuracy", "mean"), row_order=("row_order", "mean"))
    y_order = list(cells.sort_values(["row_order", "row"], ascending=[False, True])["row"].drop_duplicates())
    _heatmap(cells, "position", "row", "label", "magma", "position", "site", f"accuracy ({control})",
             y_order=y_order, columns=2)
    st.caption("Linear-probe test accuracy per site (layer, or the memory in / out; '(t-1)': the memory against "
               "the previous step's state) and position.")


from app.convergence import convergence_page  # noqa: E402 (FixedPoint runs; issue 18)

PAGES = {
    "Runs": runs_page,
    "Training curves": curves_page,
    "Length generalisation": length_page,
    "Depth x length": depth_page,
    "Gap recovery": gap_page,
    "Probes": probes_page,
    "Convergence": convergence_page,
}


def store_messages(ctx: Context) -> None:
    """Skipped folders (half-written, corrupt, still running): one clear message per kind."""
    bad = [(n, r) for n, r in ctx.skipped if not r.startswith("incomplete")]
    running = [n for n, r in ctx.skipped if r.startswith("incomplete")]
    if bad:
        st.warning(f"{len(bad)} folder(s) in the store are not readable runs and are left out: "
                   + "; ".join(f"`{n}`: {r}" for n, r in bad))
    if running:
        st.info(f"{len(running)} run(s) have no summary yet (still training, or killed; `--resume` them) "
                f"and are left out: {', '.join(running)}. Tick *include incomplete runs* to see their curves.")
