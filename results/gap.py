"""How much of exact recurrence a parallel trainer recovers (paper app. "Comparison with Exact
Sequential Training"), the train/inference mismatch, and per-refinement BPB curves.

    evaluate_bpb(run)              -> {"parallel", "exact", "stages", ...}; writes tables/bpb.csv
    df = collect_bpb(load_runs(store), compute=True)   # adds bpb.parallel / bpb.exact / bpb.stage.k
                                      (both in lrt_lab.analysis.bpb, with torch; read_bpb here reads
                                      the stored tables without it)
    gap_recovery(df)               -> recovered fraction per method: per seed, mean, bootstrap CI
    mismatch_table(df)             -> each schedule's parallel-forward metric vs its exact decoding
    refinement_table(df)           -> BPB after each stage of FullSequence(K) (the paper's
    per-refinement table)
    gap_tables(df)                 -> all of the above (lrt_lab.analysis.bpb.analyze_gap
                                      writes them to <store>/.analysis/tables/)

Recovered fraction = (metric_base - metric_method) / (metric_base - metric_exact): the share of
the baseline-to-exact improvement a method keeps. It has the same value for lower-is-better (BPB)
and higher-is-better (accuracy) metrics, since numerator and denominator flip sign together. The
paper: interleaved S=2 recovers 75.0% / 76.5% (8L / 12L; (1.082-1.070)/(1.082-1.066) = 0.750),
full-sequence K=3 about 88%.

Each method's metric is taken under the decoding the model really uses (default "bpb.exact":
exact recurrent decoding); the baseline is a plain transformer, whose exact decoding is its forward.
Seeds are paired: seed s of a method is compared with seed s of the baseline and of exact training.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from lrt_lab.store.bpb_table import read_bpb  # noqa: F401 (re-exported: the gap page reads it)

# torch-free: the dashboard computes these tables from the stored BPB tables; evaluating a model
# (torch) is lrt_lab.analysis.bpb's
from lrt_results.contrasts import contrast
from lrt_results.stats import bootstrap_ci, mean_ci, method_column, seed_stats

DEFAULT_GROUP = (
    "config.train.task",
    "config.train.length",
    "config.model.n_layer",
    "config.model.n_embd",
    "config.train.steps",
)


# BPB
# ------------------------------------------------------------------------------------------------
# Gap recovery
# ---------------------------------------------------------------------------------------
def recovered_fraction(base, method, exact):
    """(base - method) / (base - exact), elementwise; NaN
    where base == exact (no gap to recover)."""
    base, method, exact = (np.asarray(v, dtype=float) for v in (base, method, exact))
    gap = base - exact
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(gap != 0, (base - method) / np.where(gap != 0, gap, 1.0), np.nan)
    return float(out) if out.ndim == 0 else out


def ratio_of_means_ci(base, method, exact, confidence=0.95, n_resamples=9999, seed=0):
    """Percentile bootstrap interval of recovered_fraction of the means, resampling the seeds'
    (base, method, exact) triples together (scipy.stats.bootstrap, paired); NaN below 2 seeds."""
    base, method, exact = (np.asarray(v, dtype=float) for v in (base, method, exact))
    if base.size < 2:
        return (math.nan, math.nan)
    index = np.arange(base.size, dtype=float)

    def ratio(idx):
        i = idx.astype(int)
        return recovered_fraction(base[i].mean(), method[i].mean(), exact[i].mean())

    return bootstrap_ci(index, ratio, confidence, n_resamples=n_resamples, seed=seed)


def _group_keys(df, group_by):
    return [k for k in group_by if k in df.columns]


def gap_recovery(
    df: pd.DataFrame,
    metric: str = "bpb.exact",
    baseline: str = "transformer",
    exact: str = "lrt exact",
    group_by=DEFAULT_GROUP,
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed_column: str = "config.train.seed",
) -> pd.DataFrame:
    """Recovered fraction of each method relative to `baseline` and `exact` (method labels as in
    lrt_results.report.method_label), per group of runs that share task/length/shape/steps.

    Returns one row per (group, method): n_seeds, the mean metric of baseline / method / exact over
    the paired seeds; recovered, the ratio of means (mean base - mean method) / (mean base - mean
    exact): a mean of per-seed ratios would weigh a seed whose gap is small as much as one whose
    gap is large, and blow up as a gap nears 0; ci_low/ci_high, its percentile bootstrap over
    seeds (the seeds' (base, method, exact) triples resampled together; NaN below 2 seeds);
    gap_p, the paired permutation p-value of the gap base - exact itself (a recovered fraction
    of a gap that is not there means nothing); and, for reference, recovered_seed_mean and
    recovered_std, the mean and SD of the per-seed fractions. The per-seed table is in
    .attrs["per_seed"].
    """
    _check_gap_columns(df, metric, seed_column)
    df = df.copy()
    df["method"] = method_column(df)
    keys = _group_keys(df, group_by)
    per_seed, summary = [], []
    groups = df.groupby(keys, dropna=False, sort=True) if keys else [((), df)]
    for key, sub in groups:
        key = key if isinstance(key, tuple) else (key,)
        gkey = dict(zip(keys, key))
        by = _metric_by_method(sub, gkey, metric, seed_column)
        if baseline not in by or exact not in by:
            missing = [m for m in (baseline, exact) if m not in by]
            warnings.warn(
                f"group {gkey}: no {' or '.join(missing)} runs; no gap recovery computed",
                stacklevel=2,
            )
            continue
        for m, vals in by.items():
            if m in (baseline, exact):
                continue
            seeds = sorted(set(vals.index) & set(by[baseline].index) & set(by[exact].index))
            if not seeds:
                warnings.warn(
                    f"group {gkey}, method {m!r}: no seed shared with {baseline!r} and {exact!r}",
                    stacklevel=2,
                )
                continue
            b, x, e = by[baseline][seeds].values, vals[seeds].values, by[exact][seeds].values
            per_seed += _per_seed_rows(gkey, m, seeds, b, x, e)
            row = _recovery_row(b, x, e, confidence, n_resamples)
            summary.append(
                {**gkey, "method": m, "n_seeds": len(seeds), **row, "metric": metric}
                | {"baseline": baseline, "exact_method": exact}
            )
    out = pd.DataFrame(summary, columns=keys + GAP_COLUMNS)
    out.attrs["per_seed"] = pd.DataFrame(
        per_seed, columns=keys + ["method", "seed", "base", "value", "exact", "recovered"]
    )
    out.attrs["metric"] = metric
    return out


GAP_COLUMNS = [
    "method",
    "n_seeds",
    "base",
    "value",
    "exact",
    "recovered",
    "ci_low",
    "ci_high",
    "gap_p",
    "recovered_seed_mean",
    "recovered_std",
    "metric",
    "baseline",
    "exact_method",
]


def _check_gap_columns(df: pd.DataFrame, metric: str, seed_column: str) -> None:
    if metric not in df.columns:
        raise ValueError(
            f"metric={metric!r} is invalid; allowed: a column of the runs table (bpb.* columns "
            "come from collect_bpb; summary.eval.acc_exact@L ...)"
        )
    if seed_column not in df.columns:
        raise ValueError(
            f"seed_column={seed_column!r} is invalid; allowed: a column of the runs table"
        )


def _metric_by_method(sub: pd.DataFrame, gkey: dict, metric: str, seed_column: str) -> dict:
    """{method: its metric indexed by seed} of one group; ValueError when two runs share both."""
    dup = sub.duplicated(["method", seed_column], keep=False)
    if dup.any():
        raise ValueError(
            f"runs {sub.loc[dup, 'run'].tolist()} share method and seed in group {gkey}; "
            "allowed: one run per (method, seed); add the distinguishing column to group_by"
        )
    return {m: s.set_index(seed_column)[metric].astype(float) for m, s in sub.groupby("method")}


def _per_seed_rows(gkey: dict, method: str, seeds, b, x, e) -> list[dict]:
    frac = np.atleast_1d(recovered_fraction(b, x, e))
    return [
        {**gkey, "method": method, "seed": s, "base": bi, "value": xi, "exact": ei, "recovered": fi}
        for s, bi, xi, ei, fi in zip(seeds, b, x, e, frac)
    ]


def _recovery_row(b, x, e, confidence: float, n_resamples: int) -> dict:
    """One method's recovered fraction over its paired seeds (base b, method x, exact e): the
    ratio of means, its bootstrap interval, the gap's permutation p and the per-seed mean, SD."""
    st = mean_ci(np.atleast_1d(recovered_fraction(b, x, e)), confidence)
    lo, hi = ratio_of_means_ci(b, x, e, confidence, n_resamples)
    return {
        "base": b.mean(),
        "value": x.mean(),
        "exact": e.mean(),
        "recovered": recovered_fraction(b.mean(), x.mean(), e.mean()),
        "ci_low": lo,
        "ci_high": hi,
        "gap_p": contrast(e, b, paired=True, n_resamples=n_resamples)["p"],
        "recovered_seed_mean": st["mean"],
        "recovered_std": st["std"],
    }


def mismatch_table(
    df: pd.DataFrame,
    parallel: str = "bpb.parallel",
    exact: str = "bpb.exact",
    group_by=DEFAULT_GROUP,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """Each method's parallel-forward metric next to its exact-decoding metric (mean and CI over
    seeds), and the mismatch exact - parallel per seed, averaged. For accuracy columns use e.g.
    parallel="summary.eval.acc_parallel@64", exact="summary.eval.acc_exact@64"."""
    for c in (parallel, exact):
        if c not in df.columns:
            raise ValueError(
                f"column {c!r} is invalid; allowed: a column of the runs table (collect_bpb adds "
                "bpb.*)"
            )
    df = df.copy()
    df["method"] = method_column(df)
    df["_mismatch"] = df[exact].astype(float) - df[parallel].astype(float)
    keys = _group_keys(df, group_by) + ["method"]
    parts = []
    for col, name in ((parallel, "parallel"), (exact, "exact"), ("_mismatch", "mismatch")):
        st = seed_stats(df, col, keys, confidence).rename(
            columns={"mean": name, "ci_low": f"{name}_ci_low", "ci_high": f"{name}_ci_high"}
        )
        keep = keys + (
            [name, f"{name}_ci_low", f"{name}_ci_high"]
            if name != "parallel"
            else ["n", name, f"{name}_ci_low", f"{name}_ci_high"]
        )
        parts.append(st[keep])
    out = parts[0].merge(parts[1], on=keys).merge(parts[2], on=keys)
    out.attrs["metric"] = f"{parallel} vs {exact}"
    return out


def refinement_table(
    df: pd.DataFrame, group_by=DEFAULT_GROUP, confidence: float = 0.95
) -> pd.DataFrame:
    """BPB after each stage (init, refine 1, ..., from bpb.stage.<k>) and under decoding, per
     method,
     mean and CI over seeds: the paper's per-refinement table (app. "Full-Sequence Refinement").

     A stage's BPB uses the logits assembled so far (later stages win), so for Interleaved(S)
     "refine s" is the sequence after subset s was refined; Chunked/Exact runs have no stage
    columns."""
    stage_cols = sorted(
        (c for c in df.columns if c.startswith("bpb.stage.")),
        key=lambda c: int(c.rsplit(".", 1)[1]),
    )
    if not stage_cols or "bpb.exact" not in df.columns:
        raise ValueError(
            "df has no bpb.stage.* / bpb.exact columns; allowed: a runs table passed through "
            "collect_bpb"
        )
    df = df.copy()
    df["method"] = method_column(df)
    keys = _group_keys(df, group_by) + ["method"]
    rows = []
    for col in stage_cols + ["bpb.exact"]:
        k = col.rsplit(".", 1)[1]
        label = "decoding" if col == "bpb.exact" else ("init" if k == "0" else f"refine {k}")
        sub = df[df[col].notna()] if col in df else df.iloc[0:0]
        if sub.empty:
            continue
        st = seed_stats(sub, col, keys, confidence)
        st.insert(len(keys), "stage", label)
        st.insert(len(keys) + 1, "stage_index", int(k) if label != "decoding" else len(stage_cols))
        rows.append(st)
    out = (
        pd.concat(rows, ignore_index=True)
        .sort_values(keys + ["stage_index"])
        .reset_index(drop=True)
    )
    return out


# Plots
# -------------------------------------------------------------------------------------------------
def gap_tables(df: pd.DataFrame, metric: str = "bpb.exact") -> dict:
    """The gap analysis of a collect_bpb table: {gap_recovery, gap_recovery_per_seed, mismatch,
    refinement} (lrt_lab.analysis.bpb.analyze_gap writes them to the store)."""
    tables = {"gap_recovery": gap_recovery(df, metric)}
    tables["gap_recovery_per_seed"] = tables["gap_recovery"].attrs["per_seed"]
    tables["mismatch"] = mismatch_table(df)
    tables["refinement"] = refinement_table(df)
    return tables


def plot_gap_recovery(table: pd.DataFrame, ax=None, title: str | None = None):
    """Bars of the recovered fraction per method (bootstrap
    CI), with the per-seed points; Figure."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = (
        (ax.figure, ax) if ax is not None else plt.subplots(figsize=(max(4, 1.5 * len(table)), 3.5))
    )
    if table.empty:
        raise ValueError("table is empty; allowed: the output of gap_recovery")
    sns.barplot(data=table, x="method", y="recovered", ax=ax, color="tab:green")
    lo = (table["recovered"] - table["ci_low"]).fillna(0).clip(lower=0)
    hi = (table["ci_high"] - table["recovered"]).fillna(0).clip(lower=0)
    ax.errorbar(
        range(len(table)), table["recovered"], yerr=[lo, hi], fmt="none", ecolor="black", capsize=4
    )
    per_seed = table.attrs.get("per_seed")
    if per_seed is not None and not per_seed.empty:
        pos = {m: i for i, m in enumerate(table["method"])}
        ax.scatter(
            [pos[m] for m in per_seed["method"] if m in pos],
            per_seed.loc[per_seed["method"].isin(pos), "recovered"],
            color="black",
            s=12,
            zorder=3,
        )
    ax.axhline(1.0, ls="--", color="gray", lw=1)
    ax.axhline(0.0, color="gray", lw=1)
    ax.set_ylabel("recovered fraction of exact's gain")
    ax.set_title(title or f"gap recovery ({table.attrs.get('metric', '')})")
    fig.tight_layout()
    return fig


def plot_refinement(
    table: pd.DataFrame, ax=None, title: str | None = None, band: str | None = "std"
):
    """BPB after each stage per method (mean over seeds), decoding as the last point; band: "std"
    (+-1 std over seeds), "ci" (the table's CI; very wide for 2-3 seeds) or None. Figure."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    if band not in ("std", "ci", None):
        raise ValueError(f"band={band!r} is invalid; allowed: 'std', 'ci', None")
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(5, 3.5))
    sns.lineplot(data=table, x="stage_index", y="mean", hue="method", marker="o", ax=ax)
    colors = {line.get_label(): line.get_color() for line in ax.get_lines()}
    for m, sub in table.groupby("method"):
        lo, hi = (
            (sub["mean"] - sub["std"], sub["mean"] + sub["std"])
            if band == "std"
            else (sub["ci_low"], sub["ci_high"])
            if band == "ci"
            else (None, None)
        )
        if lo is not None and lo.notna().any():
            ax.fill_between(sub["stage_index"], lo, hi, alpha=0.15, color=colors.get(m))
    ticks = table.drop_duplicates("stage_index").sort_values("stage_index")
    ax.set_xticks(ticks["stage_index"], ticks["stage"])
    ax.set_xlabel("stage")
    ax.set_ylabel("BPB")
    ax.set_title(title or "BPB after each stage" + (f" (band: {band} over seeds)" if band else ""))
    fig.tight_layout()
    return fig


def plot_mismatch(table: pd.DataFrame, ax=None, title: str | None = None):
    """Parallel-forward vs exact-decoding metric per method (paired bars); Figure."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    long = table.melt(
        id_vars=["method"],
        value_vars=["parallel", "exact"],
        var_name="decoding",
        value_name="value",
    )
    fig, ax = (
        (ax.figure, ax) if ax is not None else plt.subplots(figsize=(max(4, 1.5 * len(table)), 3.5))
    )
    sns.barplot(data=long, x="method", y="value", hue="decoding", ax=ax)
    lo, hi = long["value"].min(), long["value"].max()
    pad = max((hi - lo) * 0.5, 1e-3)
    ax.set_ylim(lo - pad, hi + pad)
    metric = table.attrs.get("metric")
    ax.set_title(title or "train/inference mismatch" + (f" ({metric})" if metric else ""))
    ax.set_ylabel("metric (parallel forward vs exact decoding)")
    ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    return fig
