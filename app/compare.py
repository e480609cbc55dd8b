"""Dashboard page: compare the methods of one study (a task trained at one length).

It opens on the store's most recent study (`lrt_results.report.studies_by_recency`): one row per
method (`lrt_results.report.compare_table`: the runs that differ only by seed), with exact and
parallel pos@90 at 1x / 2x / 4x the training length as mean [95% t-interval] and the value of each
seed, accuracy, compute and wall clock; then the trainer-frontier scatter of those runs. Methods are
named by `lrt_lab.store.run_groups.method_labels`: only what differs between the methods of the
study shown (the frontier scatter: between the methods it draws, picked as on every chart page).
"""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from lrt_app.charts import color_encoding, draw_chart, palette_note
from lrt_app.frontier import AXES
from lrt_app.picker import MAX_DEFAULT_GROUPS, pick_groups
from lrt_app.store_data import group_labels
from lrt_lab.store.run_groups import one_run_per_seed
from lrt_results.report import (
    compare_lengths,
    compare_metrics,
    compare_table,
    figure_column,
    format_mean_ci,
    studies_by_recency,
    study_runs,
)
from lrt_results.scoreboard import scoreboard

DECODINGS = {"exact": "pos90_exact", "parallel": "pos90_parallel"}
FIGURE_NAMES = {"pos90": "pos@90", "bpb": "BPB"}


def decodings(task: str) -> dict[str, str]:
    """decoding -> the figure the study shows for it (BPB for a byte-level text task)."""
    exact, parallel = compare_metrics(task)
    return {"exact": exact, "parallel": parallel}


SPENT = ("compute", "wall_min")
ROW_PX = 35  # a row of st.dataframe
MAX_METHOD_PX = 420


def study_name(study: tuple[str, int]) -> str:
    return f"{study[0]} at length {study[1]}"


def seed_cell(row, figure: str, per_seed: bool = True, digits: int = 3) -> str:
    """`mean [lo, hi] · v1, v2, v3` (seeds in the row's order); a single seed reads as its value."""
    mean = row[f"{figure}.mean"]
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    cell = format_mean_ci(mean, row[f"{figure}.ci_low"], row[f"{figure}.ci_high"])
    values = [v for v in row[f"{figure}.per_seed"] if not math.isnan(v)]
    if len(values) < 2 or not per_seed:
        return cell
    return f"{cell} · " + ", ".join(f"{v:.{digits}g}" for v in values)


def figure_columns(length: int, lengths: list[int], task: str | None = None) -> dict[str, str]:
    """compare_table figure -> the column title the page shows, in the page's order: the short cost
    columns first, so that they stay in view next to the method while pos@90 (BPB for a
    byte-level text task) scrolls."""
    columns = {"compute": "compute (M token-forwards)", "wall_min": "wall clock (min)"}
    for metric in compare_metrics(task):
        family, decoding = metric.split("_", 1)
        name = FIGURE_NAMES[family]
        columns |= {f"{metric}@{n}": f"{decoding} {name} at {n} ({n // length}x)" for n in lengths}
    columns |= {
        f"acc_exact@{length}": f"exact accuracy at {length}",
        f"acc_parallel@{length}": f"parallel accuracy at {length}",
    }
    return columns


def display_table(
    table: pd.DataFrame, length: int, lengths: list[int], task: str | None = None
) -> pd.DataFrame:
    """compare_table as text cells: the method, its seeds, then one cell per figure."""
    out = pd.DataFrame(
        {
            "method": table["method"],
            "seeds": [", ".join(map(str, seeds)) for seeds in table["seeds"]],
        }
    )
    for figure, title in figure_columns(length, lengths, task).items():
        if f"{figure}.mean" not in table:
            continue
        # what a method costs varies little between seeds: its mean is the figure
        if figure in SPENT:
            out[title] = [f"{v:.3g}" if not math.isnan(v) else "-" for v in table[f"{figure}.mean"]]
        else:
            # the seeds of a pos@90 often disagree wildly: list them
            per_seed = figure.startswith("pos90_")
            out[title] = [seed_cell(row, figure, per_seed) for _, row in table.iterrows()]
    return out


def scatter_points(runs: pd.DataFrame, lengths: list[int], task: str | None = None) -> pd.DataFrame:
    """One point per run (one per seed of a method): its method, seed, compute, wall clock and
    the study's figure (pos@90; BPB for a byte-level text task) per decoding and length."""
    runs = one_run_per_seed(runs)
    points = pd.DataFrame(
        {
            "method": group_labels(runs),
            "seed": runs["config.train.seed"].astype(int),
            "compute": runs["summary.compute_tokens"] / 1e6,
            "wall_min": runs["summary.wall_time_s"] / 60,
        }
    )
    for metric in compare_metrics(task):
        for n in lengths:
            points[f"{metric}@{n}"] = figure_column(runs, f"{metric}@{n}").to_numpy()
    return points.reset_index(drop=True)


def compare_page(ctx) -> None:
    studies = studies_by_recency(ctx.shown)
    if not studies:
        st.info("No runs match the filters in the sidebar.")
        return
    study = st.selectbox(
        "study: task and training length",
        studies,
        key="compare_study",
        format_func=lambda s: study_name(s) + (" (most recent)" if s == studies[0] else ""),
        help="the runs of one task trained at one length; the first is the study whose "
        "last run finished last",
    )
    task, length = study
    runs = study_runs(ctx.shown, task, length)
    lengths = compare_lengths(runs, length, compare_metrics(task))
    table = compare_table(ctx.shown, task, length)
    st.subheader(f"Methods: {study_name(study)}")
    shown = display_table(table, length, lengths, task)
    # every row in view (no inner scrolling), the method pinned while the figures scroll sideways
    method_width = min(MAX_METHOD_PX, 24 + 7 * int(shown["method"].str.len().max()))
    st.dataframe(
        shown,
        hide_index=True,
        height=ROW_PX * (len(shown) + 1) + 3,
        column_config={"method": st.column_config.TextColumn(pinned=True, width=method_width)},
    )
    st.caption(
        f"One row per method (runs that differ only by seed), cheapest first; {len(runs)} runs. "
        "Cells: mean [95% t-interval over seeds] · the value of each seed, in the order of "
        "*seeds*; "
        "a single seed shows its value. A method is named by what tells it apart from the others "
        "here (unnamed fields are at their default, or the value most methods share)."
    )
    scoreboard_table(runs)
    frontier_chart(runs, lengths, length, task)


def scoreboard_rows(runs: pd.DataFrame) -> pd.DataFrame:
    """The study's LRT groups as the scoreboard shows them: gap@L as mean [interval], agree@L."""
    table = scoreboard(runs)
    rows = []
    for g, sub in table.groupby("group", sort=False):
        row = {"method": g, "seeds": int(sub["n"].max())}
        for r in sub.sort_values("eval_length").itertuples(index=False):
            row[f"CE gap at {r.eval_length}"] = format_mean_ci(
                r.ce_gap, r.ce_gap_low, r.ce_gap_high
            )
            row[f"agreement at {r.eval_length}"] = (
                "-" if math.isnan(r.agreement) else f"{r.agreement:.3f}"
            )
        rows.append(row)
    out = pd.DataFrame(rows)
    out.attrs["left_out"] = table.attrs.get("left_out", [])
    return out


def scoreboard_table(runs: pd.DataFrame) -> None:
    st.subheader("Training forward against exact decoding")
    shown = scoreboard_rows(runs)
    left_out = len(shown.attrs["left_out"])
    if shown.empty:
        st.caption(
            "No LRT run of this study recorded the cross-entropy of both forwards (runs trained "
            "before it was recorded)."
        )
        return
    st.dataframe(shown, hide_index=True, height=ROW_PX * (len(shown) + 1) + 3)
    st.caption(
        "Per LRT method: the cross-entropy of the training schedule's parallel forward minus exact "
        "decoding's, in nats per token (mean [95% t-interval over seeds]; above 0: the training "
        "forward reads worse than what the model does at inference, below 0: it flatters it), and "
        "the share of positions where both pick the same token, at each evaluation length."
        + (f" {left_out} LRT run(s) recorded neither and are not shown." if left_out else "")
    )


def frontier_chart(
    runs: pd.DataFrame, lengths: list[int], length: int, task: str | None = None
) -> None:
    st.subheader("Trainer frontier")
    figures = decodings(task)
    name = FIGURE_NAMES[figures["exact"].split("_", 1)[0]]
    if not lengths:
        st.info(f"No run of this study measured {name} at {length}, {2 * length} or {4 * length}.")
        return
    left, middle, right = st.columns(3)
    n = left.selectbox(
        "evaluated at",
        lengths,
        key="compare_length",
        format_func=lambda v: f"{v} ({v // length}x the training length)",
    )
    decoding = middle.radio("decoding", list(figures), horizontal=True, key="compare_decoding")
    axis = right.radio("x axis", list(AXES), horizontal=True, key="compare_x")
    field, x_title = AXES[axis]
    picked = pick_groups(
        runs,
        "compare_frontier",
        help="methods drawn (the table above lists them all); by default at most "
        f"{MAX_DEFAULT_GROUPS}, those with the most seeds",
    )
    if picked.empty:
        st.info("No method picked: open *Groups* above and pick some.")
        return
    points = scatter_points(picked, lengths, task)
    y = f"{figures[decoding]}@{n}"
    pos90 = name == "pos@90"
    methods = sorted(points["method"].unique())
    palette_note(len(methods))
    spec = {
        "height": 340,
        "data": {"name": "runs"},
        "mark": {"type": "point", "filled": True, "size": 90, "opacity": 0.8},
        "encoding": {
            "x": {"field": field, "type": "quantitative", "title": x_title},
            "y": {
                "field": y,
                "type": "quantitative",
                "title": f"{decoding} {name} at {n}",
                "scale": {"domain": [0, n]} if pos90 else {"zero": False},
            },
            "color": color_encoding(methods, "method", "method"),
            "tooltip": [{"field": c} for c in ("method", "seed", "compute", "wall_min", y)],
        },
    }
    draw_chart(spec, runs=points)
    better = (
        f"Up and to the left is better: the cheapest method whose points sit at {n} learned the "
        "task."
        if pos90
        else "Down and to the left is better (bits per byte: lower is better)."
    )
    st.caption(
        f"One point per run (a seed run twice is one point). {better} Wall clock is each run's own "
        "(runs may have shared the machine differently)."
    )
