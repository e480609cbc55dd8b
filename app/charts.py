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
    "titleOrient": "top",
}


def color_encoding(groups: list, title: str, field_name: str = "group") -> dict:
    """A nominal colour encoding of `field_name`: the groups in the order given take PALETTE's
    colours in turn (the same group, the same colour), with the legend under the chart."""
    return {
        "field": field_name,
        "type": "nominal",
        "title": title,
        "legend": LEGEND,
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
            f"{n_groups} groups share {len(PALETTE)} colours: narrow them with the sidebar's "
            "*group* filter "
            "to tell every line apart."
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
    return {**spec, "datasets": used, "usermeta": {"data_digest": digest.hexdigest()}}


def legend_entries(spec) -> int:
    """The most entries any legend under the chart (LEGEND)
    lists: the size of its scale's domain."""
    most = 0
    if isinstance(spec, dict):
        if spec.get("legend") is LEGEND and isinstance(spec.get("scale", {}).get("domain"), list):
            most = len(spec["scale"]["domain"])
        for k, v in spec.items():
            if k != "datasets":
                most = max(most, legend_entries(v))
    elif isinstance(spec, list):
        most = max([legend_entries(v) for v in spec] or [0])
    return most


def draw_chart(spec: dict, **datasets: pd.DataFrame) -> None:
    """Draw a spec whose layers name their data ({"data": {"name": key}}) from `datasets`.

    A chart stretched to the column is fitted, legend included, into its height: the legend under
    it gets rows of its own added to that height, so the plot keeps its size and no entry is cut."""
    facet = "facet" in spec or "columns" in spec
    if not facet and "height" in spec:
        rows = -(-legend_entries(spec) // LEGEND["columns"])
        spec = {**spec, "height": spec["height"] + (40 + 20 * rows if rows else 0)}
    st.vega_lite_chart(chart_spec(spec, **datasets), width="content" if facet else "stretch")
