"""The group picker every chart page opens with: which groups of seeds its charts draw.

A store of a hundred runs holds some fifty groups; drawn at once they share twenty colours and
their legend outgrows the plot. Each page picks a few (store_data.default_groups: at most
MAX_DEFAULT_GROUPS, the most seeds of the study with the most runs), says how many it hides, and
labels what it draws by what tells those groups apart (store_data.group_labels).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from lrt_app import store_data
from lrt_app.charts import data_key
from lrt_lab.store.run_groups import one_run_per_seed

# Groups a chart shows before anyone picks others: as many as stay apart in colour and legend.
MAX_DEFAULT_GROUPS = 8


def pick_groups(
    runs: pd.DataFrame, key: str, exclude=(), help: str | None = None, spread: str | None = None
) -> pd.DataFrame:
    """A multiselect of the groups of seeds among `runs`, for one page's charts; returns the runs
    of the groups picked. It opens on at most MAX_DEFAULT_GROUPS of them (the most seeds of the
    study with the most runs, store_data.default_groups) and says how many are hidden.
    exclude: fields the page puts on an axis of its own (store_data.group_labels); spread: the
    column of that axis, whose groups that span several values come first by default."""
    labels = store_data.group_labels(runs, exclude)
    options = sorted(set(labels))
    default = store_data.default_groups(runs, labels, MAX_DEFAULT_GROUPS, spread)
    widget = data_key(f"{key}_groups", options)
    # the picks as they stand (a widget's new value is in st.session_state before the rerun),
    # for the expander's title, written before the widget inside it
    before = [g for g in st.session_state.get(widget, default) if g in options]
    with st.expander(f"Groups: {len(before)} of {len(options)} shown", expanded=False):
        picked = st.multiselect(
            "groups",
            options,
            default=default,
            key=widget,
            placeholder="pick groups of seeds",
            help=help
            or "groups of seeds drawn here (every run whose config differs only by seed); by "
            f"default at most {MAX_DEFAULT_GROUPS}: the groups with the most seeds of the task "
            "and training length with the most runs. Named here against every group of the "
            "runs shown; the charts name them by what tells the groups they draw apart.",
        )
    hidden = len(options) - len(picked)
    st.caption(
        f"{len(picked)} of {len(options)} groups shown"
        + (f"; {hidden} hidden (open *Groups* to add them)." if hidden else ".")
    )
    # a seed run twice is one run of its group (run_groups.one_run_per_seed)
    return one_run_per_seed(runs[labels.isin(picked).to_numpy()])
