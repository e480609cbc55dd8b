"""Bits per byte against training compute: the paper's headline comparison in miniature (sec.
"Scaling Results", app. "Compute Budget and Full Scaling Results").

Each run of a scaling grid trains at a budget of R tokens per parameter (`--tokens-per-param`).
Its compute C is in the paper's units: tokens x forward passes per token / parameters, so the
transformer at R sits at C = R and the LRT trained with Interleaved(2) (two forwards per token)
at C = 2R. Every point also carries its counted forward+backward FLOPs and wall-clock, and the
x-axis can be any of the three.

    points = scaling_points(load_runs(store))  # one row per run, BPB with both forwards
    deltas = paired_deltas(points)              # LRT minus transformer, token- and compute-matched
    fits = fit_power_laws(points)               # L(C) = E + A C^-alpha, seed bootstrap
    decide(deltas, planned_seeds(points, load_plans(store)))  # the rule stated before the grid ran

BPB is the held-out cross-entropy in bits per byte (byte-level tokens: nats / ln 2) under exact
recurrent decoding (`bpb_exact`, what the model does at inference: the primary number) and under
the training schedule's merged parallel forward (`bpb_parallel`, what the paper's released code
logs as val/bpb). A comparison needs every run scored on the same held-out bytes;
`check_same_heldout` checks it from what each run recorded instead of assuming it.

Torch-free (pandas, scipy, matplotlib): the dashboard and the docs generator call it.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
from scipy import optimize

from lrt_lab.core.validation import field_defaults
from lrt_lab.store.run_groups import method_label
from lrt_lab.training.train_config import TrainConfig
from lrt_results.contrasts import contrast
from lrt_results.figures import save_figure
from lrt_results.stats import seeds_interval

METRICS = {
    "bpb_exact": "held-out BPB, exact recurrent decoding",
    "bpb_parallel": "held-out BPB, the training schedule's parallel forward",
}
X_AXES = {
    "C": "compute C: tokens x forwards per token / parameters",
    "flops": "training FLOPs (forward + backward, counted)",
    "wall_s": "training wall-clock (s)",
}
POINT_COLUMNS = [
    "method", "matrix_lr", "seed", "R", "params", "C", "flops", "wall_s", "epochs",
    "bpb_exact", "bpb_parallel", "length", "heldout", "run",
]  # fmt: skip
BASE = "transformer"
LRT = "lrt interleaved:2"
DEFAULT_MATRIX_LR = field_defaults(TrainConfig)["matrix_lr"]
MATCH_TOLERANCE = 0.1  # relative: two runs are at the same C within 10% (a budget rounds up)


def _get(row, key, default=math.nan):
    value = row.get(key, default)
    return default if value is None else value


def scaling_points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per complete run trained to a tokens-per-parameter budget: method (with its Muon
    rate when that is not the default: runs at another rate are another arm), seed, R, params, C,
    flops, wall_s, epochs, bpb_exact, bpb_parallel and heldout (what identifies the evaluation
    bytes).

    One point per method, budget and seed: a run trained again under another name (a pilot's
    run that the grid repeats) is the same training, and counting it twice would shrink every
    interval; the last by name is kept, the others are listed in .attrs["duplicates"]."""
    rows = []
    for _, row in df.sort_values("run").iterrows() if not df.empty else ():
        r = _get(row, "config.train.tokens_per_param")
        if not isinstance(r, (int, float)) or math.isnan(r) or row.get("status") != "complete":
            continue
        length = int(row["config.train.length"])
        params = _get(row, "config.budget.params")
        if isinstance(params, float) and math.isnan(params):  # runs from before it was recorded
            params = row["config.params.total"]
        ce = {m: _get(row, f"summary.eval.ce_{m}@{length}") for m in ("exact", "parallel")}
        heldout = "|".join(
            str(_get(row, key, "?"))
            for key in ("config.task_info.sha256", "config.train.eval_size")
        )
        lr = _get(row, "config.train.matrix_lr")
        method = method_label(row)
        if lr == lr and not math.isclose(lr, DEFAULT_MATRIX_LR):
            method = f"{method} (Muon {lr:g})"
        rows.append(
            {
                "method": method,
                "matrix_lr": lr,
                "seed": int(row["config.train.seed"]),
                "R": float(r),
                "params": int(params),
                "C": row["summary.compute_tokens"] / params,
                "flops": _get(row, "summary.flops"),
                "wall_s": _get(row, "summary.wall_time_s"),
                "epochs": _get(row, "summary.epochs"),
                "bpb_exact": ce["exact"] / math.log(2),
                "bpb_parallel": ce["parallel"] / math.log(2),
                "length": length,
                "heldout": f"{heldout}|{length}",
                "run": row["run"],
            }
        )
    points = pd.DataFrame(rows, columns=POINT_COLUMNS)
    twice = points.duplicated(["method", "R", "seed"], keep="last")
    duplicates = list(points.loc[twice, "run"])
    points = points[~twice].reset_index(drop=True)
    points.attrs["duplicates"] = duplicates
    return points


def planned_seeds(points: pd.DataFrame, plans: list[dict], arms=(BASE, LRT)) -> int | None:
    """How many seeds the grid that trained these arms plans: the most seeds of any plan recorded
    in the store (lrt_lab.store.results.load_plans) that names one of the arms' runs; None when
    no plan names them (runs trained one by one, or before sweeps recorded their plans). decide
    waits for that many."""
    runs = set(points.loc[points["method"].isin(arms), "run"])
    seeds = [len(p["seeds"]) for p in plans if runs & set(p["runs"])]
    return max(seeds) if seeds else None


def check_same_heldout(points: pd.DataFrame) -> None:
    """ValueError unless every run was scored on the same held-out bytes (corpus hash,
    evaluation size, length): BPB on different text does not compare."""
    kinds = points.groupby("heldout")["run"].apply(list)
    if len(kinds) > 1:
        parts = "; ".join(
            f"{k}: {', '.join(v[:2])}{' ...' if len(v) > 2 else ''}" for k, v in kinds.items()
        )
        raise ValueError(
            f"runs were scored on different held-out bytes (corpus sha256|eval_size|length): "
            f"{parts}; compare runs of one corpus and evaluation only"
        )


def paired_by_seed(points: pd.DataFrame, metric: str, a: tuple, b: tuple) -> tuple[list, list]:
    """(a values, b values) aligned by seed; a and b are (method, R)."""

    def arm(method, r):
        sub = points[(points["method"] == method) & np.isclose(points["R"], r)]
        return sub.groupby("seed")[metric].mean()

    x, y = arm(*a), arm(*b)
    seeds = sorted(set(x.index) & set(y.index))
    return [x[s] for s in seeds], [y[s] for s in seeds]


def budget_near(budgets, target: float) -> float | None:
    """The first of `budgets` within MATCH_TOLERANCE of `target` (the same budget, rounded up),
    None when none is."""
    return next((x for x in budgets if abs(x - target) <= MATCH_TOLERANCE * target), None)


def _cost(points: pd.DataFrame, method: str) -> float:
    """Forward passes per token of a method: its median C / R."""
    sub = points[points["method"] == method]
    return float((sub["C"] / sub["R"]).median())


def paired_deltas(
    points: pd.DataFrame, base: str = BASE, method: str = LRT, metric: str = "bpb_exact"
) -> pd.DataFrame:
    """`method` minus `base` on `metric`, paired by seed, at each of the method's budgets:
    token-matched (the base at the same R) and compute-matched (the base at the same C, i.e. at
    R x the method's forwards per token). Columns: match, R, C, R_base, n, base, method, delta,
    ci_low, ci_high (95% Student's t interval of the mean paired difference), p (paired
    permutation test; with 3 pairs it cannot go below 0.25)."""
    if points.empty:
        return pd.DataFrame()
    cost_method, cost_base = _cost(points, method), _cost(points, base)
    base_rs = sorted(points.loc[points["method"] == base, "R"].unique())
    rows = []
    for r in sorted(points.loc[points["method"] == method, "R"].unique()):
        targets = {"tokens": r, "compute": r * cost_method / cost_base}
        for match, r_base in targets.items():
            near = budget_near(base_rs, r_base)
            if near is None:
                continue
            a, b = paired_by_seed(points, metric, (base, near), (method, r))
            res = contrast(a, b, paired=True, interval="t")
            rows.append(
                {
                    "match": match,
                    "R": r,
                    "C": r * cost_method,
                    "R_base": near,
                    "n": len(a),
                    "base": float(np.mean(a)) if a else math.nan,
                    "method": float(np.mean(b)) if b else math.nan,
                    "delta": res["effect"],
                    "ci_low": res["ci_low"],
                    "ci_high": res["ci_high"],
                    "p": res["p"],
                }
            )
    return pd.DataFrame(rows)


def power_law(c, e, a, alpha):
    return e + a * np.power(c, -alpha)


def _fit(c: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    keep = np.isfinite(c) & np.isfinite(y)  # budgets no drawn seed has reached yet
    c, y = c[keep], y[keep]
    if len(np.unique(c)) < 3:  # three parameters need three budgets
        return (math.nan, math.nan, math.nan)
    p0 = (float(y.min()) * 0.9, float(y.max() - y.min() * 0.9) * float(c.min()) ** 0.5, 0.5)
    try:
        with warnings.catch_warnings():  # an exact fit has no covariance: the bootstrap gives it
            warnings.simplefilter("ignore", optimize.OptimizeWarning)
            (e, a, alpha), _ = optimize.curve_fit(
                power_law, c, y, p0=p0, bounds=([0, 0, 0], [np.inf, np.inf, 5]), maxfev=20000
            )
    except (RuntimeError, ValueError):
        return (math.nan, math.nan, math.nan)
    return (float(e), float(a), float(alpha))


def fit_power_laws(
    points: pd.DataFrame,
    metric: str = "bpb_exact",
    x: str = "C",
    n_resamples: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """L(x) = E + A x^-alpha per method, fitted to the seed means, with a bootstrap over seeds
    (each resample draws whole seeds, with replacement, and refits): one row per method with E,
    A, alpha and their 2.5/97.5 percentiles. With 3 seeds a resample has only 10 distinct
    draws: the intervals are rough and say so by being wide."""
    rng = np.random.default_rng(seed)
    rows = []
    if points.empty:
        return pd.DataFrame(columns=["method", "n_seeds", "budgets", "E", "A", "alpha"])
    for method, sub in points.groupby("method"):
        table = sub.pivot_table(index="seed", columns="R", values=metric, aggfunc="mean")
        xs = sub.groupby("R")[x].mean().reindex(table.columns).to_numpy(float)
        values = table.to_numpy(float)
        est = _fit(xs, np.nanmean(values, axis=0))
        # the fit depends only on which seeds a resample drew, not their order: each multiset is
        # fitted once (5 seeds have 126 of them, against 1000 resamples)
        boots, fitted = [], {}
        for _ in range(n_resamples if len(table) > 1 else 0):
            drawn = tuple(sorted(rng.integers(0, len(table), len(table)).tolist()))
            if drawn not in fitted:
                with warnings.catch_warnings():  # a budget none of the drawn seeds has: NaN
                    warnings.simplefilter("ignore", RuntimeWarning)
                    fitted[drawn] = _fit(xs, np.nanmean(values[list(drawn)], axis=0))
            boots.append(fitted[drawn])
        boots = np.array(boots) if boots else np.full((1, 3), np.nan)
        row = {"method": method, "n_seeds": len(table), "budgets": len(xs)}
        for i, name in enumerate(("E", "A", "alpha")):
            row[name] = est[i]
            finite = boots[:, i][np.isfinite(boots[:, i])]
            row[f"{name}_low"] = float(np.percentile(finite, 2.5)) if finite.size else math.nan
            row[f"{name}_high"] = float(np.percentile(finite, 97.5)) if finite.size else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def _below_zero(rows: pd.DataFrame) -> bool:
    return bool((rows["ci_high"] < 0).any())


def decide(deltas: pd.DataFrame, compute_points=(40, 80), planned_seeds: int | None = None) -> str:
    """The decision rule the grid's spec states before it runs:

    - the token-matched delta (LRT minus transformer, exact decoding) is not below 0 (its 95%
      interval entirely below 0) at any R: "the memory does not help at this size";
    - it is, but the compute-matched delta is not below 0 at both C = 40 and C = 80: the claim is
      not upheld. What that reads as follows the intervals: "the compute-efficiency claim fails in
      miniature" where a compute-matched interval at C = 40 or 80 lies entirely above 0 (the LRT
      shown behind); "... is not shown at this power" where they contain 0, with the smallest
      effect the seeds could have shown (the intervals' half-width): an unresolved result is not
      read as a failure;
    - both: "the compute-efficiency claim holds in miniature".
    Budgets the grid has not reached yet make the answer "not decided", and so does a budget with
    one paired seed where its interval would settle it (an interval needs two). planned_seeds: the
    seeds the grid's spec plans; seeds not trained yet are like budgets not trained yet, so until
    every pair has them the answer is "not decided" (few seeds give wide intervals, which the
    rule would read as "not below 0").
    """
    if deltas.empty:
        return "not decided: no paired runs yet"
    if planned_seeds is not None and int(deltas["n"].min()) < planned_seeds:
        return (
            f"not decided: {int(deltas['n'].min())} of the {planned_seeds} planned seeds paired "
            "at some budgets so far"
        )
    tokens = deltas[deltas["match"] == "tokens"]
    compute = deltas[deltas["match"] == "compute"]
    if not _below_zero(tokens):
        thin = _without_interval(tokens)
        if thin:  # an interval needs two paired seeds: those budgets could still be below 0
            return f"not decided: fewer than 2 paired seeds at token-matched R = {thin}"
        return "the memory does not help at this size (no token-matched delta below 0)"
    at = {c: compute[np.isclose(compute["C"], c, rtol=MATCH_TOLERANCE)] for c in compute_points}
    missing = [c for c, rows in at.items() if rows.empty]
    if missing:
        return f"not decided: no compute-matched pairs at C = {', '.join(map(str, missing))} yet"
    if all(_below_zero(rows) for rows in at.values()):
        return "the compute-efficiency claim holds in miniature"
    both = pd.concat(at.values())
    thin = _without_interval(both)
    if thin:
        return f"not decided: fewer than 2 paired seeds at compute-matched R = {thin}"
    behind = [c for c, rows in at.items() if bool((rows["ci_low"] > 0).any())]
    if behind:
        where = ", ".join(map(str, behind))
        return (
            "the compute-efficiency claim fails in miniature (token-matched ahead; "
            f"compute-matched behind at C = {where})"
        )
    half = float(((both["ci_high"] - both["ci_low"]) / 2).mean())
    share = half / float(both["base"].mean()) if "base" in both else math.nan
    return (
        "the compute-efficiency claim is not shown at this power (token-matched ahead; "
        f"compute-matched intervals at C = {', '.join(map(str, compute_points))} contain 0; "
        f"an effect smaller than their half-width, about {half:.3f} BPB ({share:.1%} of BPB), "
        "could not have been shown with these seeds)"
    )


def _without_interval(rows: pd.DataFrame) -> str:
    """The budgets (LRT R) of `rows` whose interval is undefined (one pair), comma-separated."""
    return ", ".join(f"{r:g}" for r in rows.loc[~np.isfinite(rows["ci_high"]), "R"])


def curves(points: pd.DataFrame, x: str = "C", metric: str = "bpb_exact") -> pd.DataFrame:
    """One row per method and budget: x (its seeds' mean), the metric's seed mean, low and high
    (lrt_results.stats.seeds_interval: a 95% t-interval of the mean from 3 seeds, the seeds'
    min to max with 2), band (which of the two), seeds. What the figure and the dashboard draw."""
    if x not in X_AXES or metric not in METRICS:
        raise ValueError(f"x={x!r}, metric={metric!r}; allowed: {list(X_AXES)}, {list(METRICS)}")
    rows = []
    for (method, r), sub in points.groupby(["method", "R"]):
        mean, lo, hi, band = seeds_interval(sub[metric].to_numpy(dtype=float))
        rows.append(
            {
                "method": method,
                "R": r,
                "x": float(sub[x].mean()),
                "mean": float(mean),
                "low": float(lo),
                "high": float(hi),
                "band": band,
                "seeds": len(sub),
            }
        )
    return pd.DataFrame(rows, columns=["method", "R", "x", "mean", "low", "high", "band", "seeds"])


def scaling_figure(points: pd.DataFrame, path, x: str = "C", metric: str = "bpb_exact") -> None:
    """BPB against compute in the paper's form: log x, one curve per method (seed mean, with its
    `curves` band; a method at one budget, a point with its interval as an error bar); the LRT's
    parallel-forward BPB dashed beside its exact decoding; the legend beside the plot."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    table = curves(points, x, metric)
    parallel = curves(points, x, "bpb_parallel") if metric == "bpb_exact" else None
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, (method, c) in enumerate(table.groupby("method", sort=True)):
        color = f"C{i % 10}"
        if len(c) == 1:  # one budget (a rival at one C): a band of zero width would not show
            yerr = [c["mean"] - c["low"], c["high"] - c["mean"]]
            ax.errorbar(c["x"], c["mean"], yerr=yerr, fmt="o", color=color, capsize=3, label=method)
        else:
            ax.plot(c["x"], c["mean"], "-", marker="o", color=color, label=method)
            ax.fill_between(c["x"], c["low"], c["high"], color=color, alpha=0.15, lw=0)
        if parallel is not None and method.startswith("lrt"):  # the train/inference mismatch
            par = parallel[parallel["method"] == method]
            ax.plot(
                par["x"], par["mean"], "--", marker=".", color=color,
                label=f"{method} (parallel forward)",
            )  # fmt: skip
    bands = set(table["band"]) - {"none"}
    ax.set_title(
        "band: " + " or ".join(sorted(bands)) + " over seeds" if bands else "one seed each",
        fontsize=8,
    )
    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 20, not 2 x 10^1
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.set_xlabel(X_AXES[x])
    ax.set_ylabel(METRICS[metric])
    ax.grid(True, which="both", alpha=0.3)
    # beside the plot, not on it: with the rivals it would cover points
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=labels.__getitem__)  # a method beside its dashed twin
    ax.legend(
        [handles[i] for i in order], [labels[i] for i in order],
        fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0,
    )  # fmt: skip
    save_figure(fig, path)
