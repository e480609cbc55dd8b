"""lrt_lab dashboard: compare (the most recent study), runs, training curves, length generalisation,
depth x length, gap recovery, probes, convergence, trainer frontier.

    lrt-lab app --runs DIR
    streamlit run app/streamlit_app.py -- --runs DIR

The store is `--runs DIR`, else $LRT_RUNS, else ./runs (./results when there is no ./runs), and can
be changed in the sidebar to another folder inside the store it started on or inside an allowed
root (`-- --allow-root DIR`, repeatable, or $LRT_APP_ROOTS), never elsewhere on the machine. The
app reads only the run store, through lrt_lab.store.results.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `streamlit run app/streamlit_app.py` puts app/ itself on sys.path; the package needs its parent.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from lrt_app import store_data, views  # noqa: E402


def sidebar() -> tuple[str, bool]:
    st.sidebar.title("lrt_lab")
    if "runs_dir" not in st.session_state:
        st.session_state["runs_dir"] = store_data.default_runs_dir(sys.argv[1:])
    root = st.sidebar.text_input(
        "run store", key="runs_dir", help="folder of run folders (lrt-lab train --out)"
    )
    incomplete = st.sidebar.checkbox(
        "include incomplete runs",
        value=False,
        key="include_incomplete",
        help="runs still training (or killed): curves only, no final figures",
    )
    if st.sidebar.button(
        "Reload", help="re-read the store (new runs also appear on their own at the next rerun)"
    ):
        st.cache_data.clear()
    return root.strip(), incomplete


def select_runs(runs):
    """Sidebar filters (empty = all) and a run selection; returns the runs shown."""
    st.sidebar.subheader("Filters")
    selections = {}
    for label, column in store_data.FILTERS.items():
        options = store_data.filter_options(runs, column)
        selections[column] = st.sidebar.multiselect(
            label, options, key=views.data_key(f"filter_{label}", options), placeholder="all"
        )
    filtered = store_data.filter_runs(runs, selections)
    names = list(filtered["run"])
    picked = st.sidebar.multiselect(
        "runs",
        names,
        key=views.data_key("runs", names),
        placeholder="all matching runs",
        help="narrow to these runs (empty: every run that matches the filters)",
    )
    return filtered[filtered["run"].isin(picked)] if picked else filtered


def main() -> None:
    st.set_page_config(page_title="lrt_lab runs", layout="wide")
    root, incomplete = sidebar()
    st.title("lrt_lab runs")
    if not root:
        st.info("Enter the folder of a run store in the sidebar.")
        return
    roots = store_data.allowed_roots(sys.argv[1:])
    if not store_data.store_allowed(root, roots):
        st.warning(
            f"`{root}` is outside the folders this dashboard may read: the store it was started "
            f"on ({roots[0]}) and the allowed roots. Start it with `lrt-lab app --allow-root "
            "DIR` (or $LRT_APP_ROOTS) to open others."
        )
        return
    if not Path(root).is_dir():
        st.info(
            f"No run store at `{root}` (the folder does not exist). Train into it with "
            f"`lrt-lab train --out {root} ...` or `lrt-lab demo --out {root}`, or enter another "
            "folder "
            "in the sidebar."
        )
        return
    runs, skipped = store_data.cached_runs(root, incomplete, store_data.store_signature(root))
    ctx = views.Context(root=root, runs=runs, shown=runs, skipped=skipped)
    views.store_messages(ctx)
    if runs.empty:
        st.info(
            f"The store `{root}` has no {'readable' if incomplete else 'complete'} runs yet. Train "
            "some with "
            f"`lrt-lab train --out {root} ...` or `lrt-lab demo --out {root}`."
        )
        return
    ctx.shown = select_runs(runs)
    for tab, (title, view) in zip(st.tabs(list(views.PAGES)), views.PAGES.items()):
        with tab:
            views.guarded(title, view, ctx)


try:
    main()
except Exception as e:  # noqa: BLE001 (a store no view expected: one message, not a traceback page)
    st.error(f"The dashboard could not read this store: {type(e).__name__}: {e}")
