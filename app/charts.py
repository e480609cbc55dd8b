"""Vega-Lite charts and the colours the dashboard's pages share.

Charts are plain Vega-Lite specs drawn in the browser (st.vega_lite_chart, data shipped as Arrow):
cheap on the server, with tooltips and zoom, and one colour per group of seeds on every page.
(Altair would build the same specs, but its import and per-chart schema validation cost seconds of
CPU per page view on a small machine.)

Every chart is given exactly the datasets its layers name, and its spec carries a digest of that
data: Streamlit then redraws it from scratch whenever a control changes what it shows. (Updating a
drawn chart in place failed on a dataset the spec did not use, "Unrecognized data set", and left
the chart stale without a word.) Legends sit under the chart in columns.
"""

from __future__ import annotations

import hashlib
import zlib

import pandas as pd
import streamlit as st

# 20 colours that stay apart on a white background (tab10, then darker and brighter ones).
PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#000000",
    "#393b79",
    "#637939",
    "#e7ba52",
    "#843c39",
    "#a55194",
    "#6baed6",
    "#fd8d3c",
    "#74c476",
    "#fccde5",
]
TAB10 = PALETTE[:10]
LEGEND = {
    "orient": "bottom",
    "direction": "vertical",
    "columns": 2,
    "labelLimit": 480,
    "symbolLimit": 0,
    # a line's colour at full strength, even where a faint band shares its legend
    "symbolOpacity": 1,
    "titleOrient": "top",
}
# What fits beside Streamlit's sidebar in a 1400 px window: the main column (about 930 px drawn),
# and of it what a legend under a chart gets (the y axis takes the left of it). What a legend's
# entries take there, measured in Chromium with Streamlit's theme (14 px labels): a label's
# characters (5.9 px each), the symbol with its gaps, a row (20 px for lines, 30 px with points).
MAIN_WIDTH = 980
LEGEND_WIDTH = 820
LABEL_CHAR_PX = 6.2
SYMBOL_PX = 36
ROW_PX = 30
LEGEND_TITLE_PX = 30
MAX_LEGEND_COLUMNS = 4


def legend_for(labels) -> dict:
    """LEGEND with as many columns as the longest label lets fit under the chart (labels longer
    than a column are cut with an ellipsis, never pushed past the window)."""
    longest = max((len(str(v)) for v in labels), default=1)
    label_px = min(int(longest * LABEL_CHAR_PX) + 6, LEGEND_WIDTH - SYMBOL_PX)
    columns = max(1, min(MAX_LEGEND_COLUMNS, len(labels), LEGEND_WIDTH // (label_px + SYMBOL_PX)))
    return {**LEGEND, "columns": columns, "labelLimit": LEGEND_WIDTH // columns - SYMBOL_PX}


def data_key(name: str, options) -> str:
    """A widget key that changes with its options, so a stale choice never outlives its store."""
    return f"{name}-{zlib.crc32(repr(list(map(str, options))).encode()):08x}"


def color_encoding(groups: list, title: str, field_name: str = "group") -> dict:
    """A nominal colour encoding of `field_name`: the groups in the order given take PALETTE's
    colours in turn (the same group, the same colour), with the legend under the chart."""
    return {
        "field": field_name,
        "type": "nominal",
        "title": title,
        "legend": legend_for(groups),
        "scale": {
            "domain": groups,
            "range": [PALETTE[i % len(PALETTE)] for i in range(len(groups))],
        },
    }


def only_groups(color: dict, present: set) -> dict:
    """The colour encoding narrowed to the groups a panel draws, each keeping its colour, so the
    legend under that panel lists only what is in it."""
    pairs = [
        (g, c) for g, c in zip(color["scale"]["domain"], color["scale"]["range"]) if g in present
    ]
    return {**color, "scale": {"domain": [g for g, _ in pairs], "range": [c for _, c in pairs]}}


def palette_note(n_groups: int) -> None:
    """A caption under the controls when more groups than
    PALETTE's colours are drawn (they repeat)."""
    if n_groups > len(PALETTE):
        st.caption(
            f"{n_groups} groups share {len(PALETTE)} colours: pick fewer in *groups* above to "
            "tell every line apart."
        )


def dataset_names(spec) -> set[str]:
    """The names of the datasets a spec's layers (at any depth) read: {"data": {"name": ...}}."""
    found = set()
    if isinstance(spec, dict):
        d = spec.get("data")
        if isinstance(d, dict) and isinstance(d.get("name"), str):
            found.add(d["name"])
        for k, v in spec.items():
            if k != "datasets":
                found |= dataset_names(v)
    elif isinstance(spec, list):
        for v in spec:
            found |= dataset_names(v)
    return found


def chart_spec(spec: dict, **datasets: pd.DataFrame) -> dict:
    """The spec with exactly the datasets it names, and a digest of their contents in `usermeta`.

    A named dataset the spec does not use makes Vega throw on Streamlit's in-place update, and a
    spec that stays the same while its data changes is updated in place: so every chart gets only
    its own data, and a change of data changes the spec (Streamlit then draws the chart anew)."""
    names = dataset_names(spec)
    missing = names - set(datasets)
    if missing:
        raise ValueError(
            f"chart reads dataset(s) {sorted(missing)} it was not given; given: {sorted(datasets)}"
        )
    used = {k: v.reset_index(drop=True) for k, v in datasets.items() if k in names}
    digest = hashlib.sha1()
    for k in sorted(used):
        digest.update(k.encode())
        digest.update(pd.util.hash_pandas_object(used[k].astype(str), index=False).values.tobytes())
        digest.update(",".join(map(str, used[k].columns)).encode())
    # drawn as SVG: crisp at any zoom, and its legends and plot are elements a browser test can
    # measure
    usermeta = {"data_digest": digest.hexdigest(), "embedOptions": {"renderer": "svg"}}
    return {**spec, "datasets": used, "usermeta": usermeta}


def legend_rows(spec) -> int:
    """The rows of the tallest legend under the chart (a bottom legend of legend_for / LEGEND):
    its scale's domain over its columns."""
    most = 0
    if isinstance(spec, dict):
        legend, domain = spec.get("legend"), spec.get("scale", {}).get("domain")
        under = isinstance(legend, dict) and legend.get("orient") == "bottom"
        if under and isinstance(domain, list):
            most = -(-len(domain) // legend.get("columns", 1))
        for k, v in spec.items():
            if k != "datasets":
                most = max(most, legend_rows(v))
    elif isinstance(spec, list):
        most = max([legend_rows(v) for v in spec] or [0])
    return most


def fit_to_legend(spec: dict, **datasets: pd.DataFrame) -> dict:
    """The spec with its plot at least as tall as the tallest legend under it.

    A single plot grows to the legend; a wrapped facet grows each panel by the legend's height over
    its rows of panels (the panels' count is the facet field's values in the facet's dataset), so
    a few short panels under a legend of many groups make a tall grid, not a squeezed one."""
    legend_px = LEGEND_TITLE_PX + ROW_PX * legend_rows(spec)
    if "height" in spec:
        return {**spec, "height": max(spec["height"], legend_px)}
    inner, facet = spec.get("spec"), spec.get("facet")
    if not (isinstance(inner, dict) and "height" in inner and isinstance(facet, dict)):
        return spec
    data = datasets.get(spec.get("data", {}).get("name"))
    if data is None or facet.get("field") not in data:
        return spec
    rows = -(-max(1, data[facet["field"]].nunique()) // spec.get("columns", 1))
    return {**spec, "spec": {**inner, "height": max(inner["height"], -(-legend_px // rows))}}


def draw_chart(spec: dict, **datasets: pd.DataFrame) -> None:
    """Draw a spec whose layers name their data ({"data": {"name": key}}) from `datasets`.

    A chart stretched to the column fits its width to it (Vega's fit-x) and keeps its height for
    the plot: the legend under it adds its own rows below, so no entry is cut and the plot is never
    squeezed; and the plot is at least as tall as that legend (fit_to_legend), so a chart of many
    groups is a tall chart, not a flat line over a long list."""
    facet = "facet" in spec or "columns" in spec
    if not facet:
        spec = {"autosize": {"type": "fit-x", "contains": "padding"}, **spec}
    spec = fit_to_legend(spec, **datasets)
    st.vega_lite_chart(chart_spec(spec, **datasets), width="content" if facet else "stretch")
