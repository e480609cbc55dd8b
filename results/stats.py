"""Seed statistics: mean, std and a confidence interval over seeds for any metric column.

Every analysis table goes through `seed_stats` (or `mean_ci` for a plain list), so "mean +- CI
over n seeds" means the same thing everywhere:
- std is the sample standard deviation (ddof=1; NaN for one seed);
- the CI is Student's t interval of the mean by default (exact for normal seed noise, and defined
  from n = 2), or a percentile bootstrap (`scipy.stats.bootstrap`) with method="bootstrap",
  which needs no normality but is unreliable below ~5 seeds. One seed gives NaN bounds, never a
  zero-width interval that would read as certainty.
"""

from __future__ import annotations

import functools
import inspect
import math

import numpy as np
import pandas as pd

from lrt_lab.store.run_groups import (
    method_keys,
    method_label,
    method_labels,
    one_run_per_seed,
)

CI_METHODS = ("t", "bootstrap")
# scipy.stats is imported where a bootstrap needs it (it takes seconds to import, which
# `lrt-lab report` would pay for a t-interval that t_quantile gives in microseconds).


def _check_confidence(confidence) -> float:
    if not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} is invalid; allowed: a number in (0, 1)")
    return float(confidence)


@functools.cache
def _rng_keyword() -> str:
    # scipy 1.15 named the resampling generator `rng` (SPEC 7); before that it was `random_state`
    from scipy import stats as sps

    return "rng" if "rng" in inspect.signature(sps.bootstrap).parameters else "random_state"


def rng_argument(seed: int) -> dict:
    """The keyword argument that seeds scipy.stats' resampling tests (bootstrap,
    permutation_test) with numpy's default generator, under the name this scipy uses."""
    return {_rng_keyword(): np.random.default_rng(seed)}


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (modified
    Lentz), on the side of x where it converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _betainc(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(log_front + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 1000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-16:
            break
    return front * f


@functools.cache
def t_quantile(q: float, df: float) -> float:
    """Student's t quantile: the t with P(T <= t) = q for `df` degrees of freedom, what
    scipy.stats.t.ppf(q, df) gives (to about 1e-10 relative), without importing scipy.

    For t > 0, with y = t^2 / (df + t^2): P(0 < T < t) = I_y(1/2, df/2) / 2 and
    P(T > t) = I_(1-y)(df/2, 1/2) / 2. Bisection finds y (or 1 - y, for a q far from 1/2, where
    it is small) on whichever of the two monotone functions keeps its digits."""
    if not 0 < q < 1 or not df > 0:
        raise ValueError(f"q={q!r}, df={df!r} is invalid; allowed: 0 < q < 1 and df > 0")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    centre = 2.0 * q - 1.0  # I_y(1/2, df/2)
    if centre < 0.5:
        y = _bisect(lambda v: _betainc(0.5, df / 2.0, v), centre)
        return math.sqrt(df * y / (1.0 - y))
    x = _bisect(lambda v: _betainc(df / 2.0, 0.5, v), 2.0 * (1.0 - q))  # x = 1 - y
    return math.sqrt(df * (1.0 - x) / x)


def _bisect(increasing, target: float) -> float:
    """The v in (0, 1) with increasing(v) = target, to about 1e-15 relative."""
    lo, hi = 0.0, 1.0
    for _ in range(400):
        mid = 0.5 * (lo + hi)
        if increasing(mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    return 0.5 * (lo + hi)


def bootstrap_ci(
    values,
    statistic=np.mean,
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
    method: str = "percentile",
) -> tuple[float, float]:
    """Bootstrap CI of `statistic` over `values` (scipy.stats.bootstrap); NaN bounds for < 2 values.

    Identical values give a zero-width interval at that value (scipy would warn and return NaN)."""
    confidence = _check_confidence(confidence)
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 2:
        return (math.nan, math.nan)
    if np.all(x == x[0]):
        v = float(statistic(x))
        return (v, v)
    # numpy's reductions take axis=: scipy then resamples in one array operation instead of one
    # Python call per resample (the same draws, the same interval, some 50x less CPU)
    vectorized = statistic in (np.mean, np.median)
    from scipy import stats as sps

    res = sps.bootstrap(
        (x,),
        statistic,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method=method,
        **rng_argument(seed),
        vectorized=vectorized,
    )
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


def mean_ci(values, confidence: float = 0.95, method: str = "t", seed: int = 0) -> dict:
    """{"n", "mean", "std", "sem", "ci_low", "ci_high"} of the finite values (NaNs are dropped)."""
    confidence = _check_confidence(confidence)
    if method not in CI_METHODS:
        raise ValueError(f"method={method!r} is invalid; allowed: {', '.join(CI_METHODS)}")
    x = np.asarray(values, dtype=float).ravel()
    x = x[np.isfinite(x)]
    n = int(x.size)
    mean = float(x.mean()) if n else math.nan
    std = float(x.std(ddof=1)) if n > 1 else math.nan
    sem = std / math.sqrt(n) if n > 1 else math.nan
    if n < 2:
        lo = hi = math.nan
    elif method == "t":
        half = t_quantile(0.5 + confidence / 2, n - 1) * sem
        lo, hi = mean - half, mean + half
    else:
        lo, hi = bootstrap_ci(x, np.mean, confidence, seed=seed)
    return {"n": n, "mean": mean, "std": std, "sem": sem, "ci_low": lo, "ci_high": hi}


# Fewer seeds than this get the seeds' min to max instead of a t-interval: over 2 seeds the 95%
# t-interval is the mean +- 12.7 standard errors, wider than anything the seeds did.
MIN_SEEDS_T = 3


def seeds_interval(values: np.ndarray, t_interval: bool = True) -> tuple:
    """(mean, lo, hi, kind) over the rows of `values` (one row per seed), per column: the 95%
    t-interval of the mean from MIN_SEEDS_T seeds on (kind "95% t-interval"), the seeds' min to
    max with fewer or when t_interval is False ("min-max"), no band for one seed ("none":
    lo = hi = mean). The one rule the dashboard's bands and the scaling figure follow."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    mean = values.mean(0)
    if n < 2:
        return mean, mean, mean, "none"
    if t_interval and n >= MIN_SEEDS_T:
        half = t_quantile(0.975, n - 1) * values.std(0, ddof=1) / math.sqrt(n)
        return mean, mean - half, mean + half, "95% t-interval"
    return mean, values.min(0), values.max(0), "min-max"


def method_column(df: pd.DataFrame) -> pd.Series:
    """`transformer`, `lrt interleaved:2`, ... per row of load_runs
    (lrt_lab.store.run_groups.method_label)."""
    if df.empty:
        return pd.Series([], dtype=object, index=df.index)
    return df.apply(method_label, axis=1)


def seed_stats(
    df: pd.DataFrame, metric: str, group_by=None, confidence: float = 0.95, method: str = "t"
) -> pd.DataFrame:
    """Mean, std and CI over seeds of `metric` for each group of a load_runs DataFrame.

    group_by None (default): lrt_lab.store.run_groups' rule (seed_groups), one group per method up
    to the seed and the bookkeeping options, a seed run twice counted once, named by the options
    that differ between the groups of `df` (columns `group` and `method`); or column
    names ("method" is added from config.kind/config.schedule when missing).
    Returns one row per group: the group columns, n, mean, std, sem, ci_low, ci_high, seeds (the
    seeds that had a value), and the metric name in df.attrs["metric"].
    """
    if not isinstance(df, pd.DataFrame):
        raise ValueError(
            "df is invalid; allowed: a pandas DataFrame (e.g. lrt_lab.store.results.load_runs)"
        )
    if metric not in df.columns:
        cols = [c for c in df.columns if c.startswith(("summary.", "bpb."))]
        raise ValueError(
            f"metric={metric!r} is invalid; allowed: a column of the runs table, e.g. "
            f"{', '.join(cols[:8]) or 'summary.final_loss'}"
        )
    df = df.copy()
    if group_by is None:
        df = one_run_per_seed(df)
        df["group"] = method_labels(df)
        df["_key"] = method_keys(df)
        df["method"] = method_column(df)
        keys = ["group", "method"]
        # group_labels guarantees this; keep it honest
        if df.groupby("group")["_key"].nunique().gt(1).any():
            raise ValueError("group labels do not separate the configs; report this as a bug")
    else:
        keys = [group_by] if isinstance(group_by, str) else list(group_by)
        if "method" in keys and "method" not in df.columns:
            df["method"] = method_column(df)
    for k in keys:
        if k not in df.columns:
            raise ValueError(
                f"group_by={k!r} is invalid; allowed: None (one group per config up to the seed), "
                "'method' or a column of the runs table"
            )
    seed_col = "config.train.seed" if "config.train.seed" in df.columns else None
    rows = []
    for key, sub in df.groupby(keys, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        values = pd.to_numeric(sub[metric], errors="coerce")
        seeds = sub.loc[values.notna(), seed_col].tolist() if seed_col else []
        rows.append(
            {
                **dict(zip(keys, key)),
                **mean_ci(values, confidence, method),
                "seeds": ", ".join(str(_int_or(s)) for s in seeds),
            }
        )
    out = pd.DataFrame(
        rows, columns=keys + ["n", "mean", "std", "sem", "ci_low", "ci_high", "seeds"]
    )
    out.attrs["metric"] = metric
    out.attrs["interval"] = (
        f"{round(100 * confidence)}% {'t-interval' if method == 't' else 'bootstrap interval'} "
        "over seeds"
    )
    return out


def _int_or(v):
    return int(v) if isinstance(v, float) and v.is_integer() else v


def plot_seed_stats(table: pd.DataFrame, x: str | None = None, ax=None, title: str | None = None):
    """Bar chart of a seed_stats table with CI error bars (x: its `group` column, else `method`);
    returns the matplotlib Figure."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    x = x or ("group" if "group" in table.columns else "method")
    if x not in table.columns:
        raise ValueError(
            f"x={x!r} is invalid; allowed: a column of the table ({', '.join(table.columns)})"
        )
    fig, ax = (
        (ax.figure, ax) if ax is not None else plt.subplots(figsize=(max(4, 1.2 * len(table)), 3.5))
    )
    sns.barplot(data=table, x=x, y="mean", ax=ax, color="tab:blue")
    lo = (table["mean"] - table["ci_low"]).fillna(0).clip(lower=0)
    hi = (table["ci_high"] - table["mean"]).fillna(0).clip(lower=0)
    ax.errorbar(
        range(len(table)), table["mean"], yerr=[lo, hi], fmt="none", ecolor="black", capsize=4
    )
    ax.set_ylabel(table.attrs.get("metric", "mean"))
    ax.set_title(
        title
        or f"mean over seeds ({int(table['n'].min()) if len(table) else 0}+ seeds); bars: "
        + table.attrs.get("interval", "confidence interval")
    )
    ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    return fig
