"""Statistics of a pre-stated comparison between two arms of runs (a study's contrasts).

- `contrast(a, b, paired)`: the effect **B minus A** (mean of b minus mean of a; paired: the mean
  of the per-seed differences b_i - a_i), an interval of it (percentile bootstrap, or Student's t
  of the mean paired difference with `interval="t"`), a two-sided
  permutation-test p-value (exact whenever every relabelling fits in n_resamples, which scipy
  then enumerates by itself), Cohen's d (paired: d_z, the mean difference over the SD of the
  differences) and the power a two-sided t-test at alpha 0.05 has for that observed d at these n.
- `n_for_power(d, power, paired)`: the seeds per arm a t-test needs to detect d with that power.
- `holm(pvalues)`: Holm-Bonferroni adjusted p-values for a family of contrasts.
- `kaplan_meier(times, reached, budget)` and `logrank(groups)`: time-to-event summaries for runs
  that may never reach the event within their budget (right-censored), from scipy.stats.ecdf,
  CensoredData and logrank (scipy >= 1.11).

Fewer than two values in an arm gives NaN interval, p and power, never an exception nor a
zero-width interval that would read as certainty. Torch-free: the dashboard and `lrt-lab report`
import it.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
from scipy import stats as sps

from lrt_results.stats import _check_confidence, bootstrap_ci, mean_ci, rng_argument

ALPHA = 0.05  # the level power and n_for_power are computed at (two-sided)
INTERVALS = ("bootstrap", "t")


def _finite(values) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    return x[np.isfinite(x)]


def _mean_difference(x, y, axis=-1):
    return np.mean(y, axis=axis) - np.mean(x, axis=axis)


def _paired_difference(x, y, axis=-1):
    return np.mean(y - x, axis=axis)


def contrast(
    a,
    b,
    paired: bool,
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
    interval: str = "bootstrap",
) -> dict:
    """Compare arm `b` with arm `a`; the effect is **B minus A** (positive: b is larger).

    paired: a and b are aligned (a[i] and b[i] are the same seed; the caller pairs them) and the
    statistics are those of the differences b[i] - a[i]; a pair with a NaN on either side is
    dropped. Unpaired: NaNs are dropped in each arm on its own.

    Returns {"n_a", "n_b", "mean_a", "mean_b", "effect", "ci_low", "ci_high", "p", "p_min", "d",
    "power", "n_for_power"}:
    - ci_low/ci_high: the percentile bootstrap interval of the effect (paired: of the mean
      difference, resampling pairs; unpaired: each arm resampled on its own); interval="t"
      (paired only): Student's t interval of the mean paired difference instead. With a handful
      of pairs the bootstrap is far too narrow (three negative differences give an interval below
      0 whatever their spread); t is the interval of the paired t-test and widens as it should;
    - p: two-sided permutation test of "no difference" (paired: the sign of each difference
      flipped, 2^n relabellings; unpaired: the runs shuffled between the arms); exact when the
      relabellings number at most n_resamples, else Monte Carlo with that many;
    - p_min: the smallest p that test can give at these n (smallest_p): with few seeds it may
      exceed any alpha, whatever the effect;
    - d: Cohen's d, (mean_b - mean_a) / pooled SD; paired: d_z = mean difference / SD of the
      differences (+-inf where the SD is 0 and the effect is not);
    - power: of a two-sided t-test at alpha 0.05 for the observed d at these n (paired:
      one-sample t on the differences; unpaired: two-sample t with pooled SD);
    - n_for_power: seeds per arm for power 0.8 at the observed d (n_for_power()).
    Fewer than 2 values (pairs) per arm: NaN interval, p, d and power.
    """
    confidence = _check_confidence(confidence)
    a, b = _contrast_arms(a, b, paired, interval)
    n_a, n_b = int(a.size), int(b.size)
    out = dict.fromkeys(CONTRAST_FIELDS, math.nan) | {
        "n_a": n_a,
        "n_b": n_b,
        "mean_a": float(a.mean()) if n_a else math.nan,
        "mean_b": float(b.mean()) if n_b else math.nan,
    }
    if n_a == 0 or n_b == 0:
        return out
    diff = b - a if paired else None
    out["effect"] = float(diff.mean()) if paired else out["mean_b"] - out["mean_a"]
    if min(n_a, n_b) < 2:
        return out
    if interval == "t":
        t = mean_ci(diff, confidence, method="t")
        out["ci_low"], out["ci_high"] = t["ci_low"], t["ci_high"]
    elif paired:
        out["ci_low"], out["ci_high"] = bootstrap_ci(
            diff, np.mean, confidence, n_resamples=n_resamples, seed=seed
        )
    else:
        out["ci_low"], out["ci_high"] = _two_sample_ci(a, b, confidence, n_resamples, seed)
    out["p"] = _permutation_p(a, b, paired, n_resamples, seed)
    out["p_min"] = smallest_p(n_a, n_b, paired)
    out["d"] = cohens_d(a, b, paired)
    out["power"] = t_power(out["d"], n_a, n_b, paired)
    out["n_for_power"] = n_for_power(out["d"], 0.8, paired)
    return out


# What contrast() returns, in order; a field it cannot compute stays NaN.
CONTRAST_FIELDS = (
    "n_a",
    "n_b",
    "mean_a",
    "mean_b",
    "effect",
    "ci_low",
    "ci_high",
    "p",
    "p_min",
    "d",
    "power",
    "n_for_power",
)


def _contrast_arms(a, b, paired: bool, interval: str) -> tuple[np.ndarray, np.ndarray]:
    """The two arms as float arrays with their NaNs dropped (paired: a pair with a NaN on either
    side), after checking the interval and the pairing."""
    if interval not in INTERVALS or (interval == "t" and not paired):
        raise ValueError(
            f"interval={interval!r} with paired={paired} is invalid; allowed: "
            "'bootstrap', or 't' for a paired contrast"
        )
    a = np.asarray(a, dtype=float).ravel()
    b = np.asarray(b, dtype=float).ravel()
    if not paired:
        return _finite(a), _finite(b)
    if a.shape != b.shape:
        raise ValueError(
            f"paired: a has {a.size} values and b {b.size}; allowed: arrays aligned by seed "
            "(one value of each arm per seed)"
        )
    keep = np.isfinite(a) & np.isfinite(b)
    return a[keep], b[keep]


def _two_sample_ci(a, b, confidence, n_resamples, seed) -> tuple[float, float]:
    effect = float(b.mean() - a.mean())
    if np.all(a == a[0]) and np.all(b == b[0]):  # no spread to resample (scipy would give NaN)
        return (effect, effect)
    with warnings.catch_warnings():  # a degenerate resample distribution: NaN, said below
        warnings.simplefilter("ignore", RuntimeWarning)
        res = sps.bootstrap(
            (a, b),
            _mean_difference,
            paired=False,  # each arm resampled on its own
            vectorized=True,
            confidence_level=confidence,
            n_resamples=n_resamples,
            method="percentile",
            **rng_argument(seed),
        )
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))


def _permutation_p(a, b, paired, n_resamples, seed) -> float:
    res = sps.permutation_test(
        (a, b),
        _paired_difference if paired else _mean_difference,
        permutation_type="samples" if paired else "independent",
        vectorized=True,
        n_resamples=n_resamples,
        alternative="two-sided",
        **rng_argument(seed),
    )
    return float(min(1.0, res.pvalue))


def smallest_p(n_a: int, n_b: int | None = None, paired: bool = False) -> float:
    """The smallest two-sided p-value an exact permutation test can give at these n: 2 over the
    number of relabellings (paired: 2^n sign flips; unpaired: C(n_a + n_b, n_a) splits), capped
    at 1. Three pairs give 0.25: no effect, however large, is significant at 0.05."""
    n_b = n_a if n_b is None else n_b
    if min(n_a, n_b) < 1:
        return math.nan
    count = 2.0**n_a if paired else float(math.comb(n_a + n_b, n_a))
    return min(1.0, 2.0 / count)


def cohens_d(a, b, paired: bool) -> float:
    """(mean b - mean a) / pooled sample SD; paired: d_z = mean(b - a) / SD(b - a). NaN below two
    values per arm; +-inf where the SD is 0 and the effect is not (NaN where both are 0)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if paired:
        diff = b - a
        if diff.size < 2:
            return math.nan
        effect, sd = float(diff.mean()), float(diff.std(ddof=1))
    else:
        n_a, n_b = a.size, b.size
        if n_a < 2 or n_b < 2:
            return math.nan
        effect = float(b.mean() - a.mean())
        pooled = ((n_a - 1) * a.var(ddof=1) + (n_b - 1) * b.var(ddof=1)) / (n_a + n_b - 2)
        sd = math.sqrt(float(pooled))
    if sd == 0:
        return math.nan if effect == 0 else math.copysign(math.inf, effect)
    return effect / sd


def t_power(
    d: float, n_a: int, n_b: int | None = None, paired: bool = False, alpha: float = ALPHA
) -> float:
    """Power of a two-sided t-test at `alpha` when the true standardized effect is `d`.

    paired: a one-sample t-test on n_a differences (df n - 1, noncentrality d * sqrt(n));
    unpaired: a two-sample t-test with pooled SD (df n_a + n_b - 2, noncentrality
    d * sqrt(n_a n_b / (n_a + n_b))). Computed from the noncentral t (scipy.stats.nct). NaN for a
    NaN d or fewer than 2 per arm."""
    n_b = n_a if n_b is None else n_b
    if d is None or math.isnan(d) or min(n_a, n_b) < 2:
        return math.nan
    if math.isinf(d):
        return 1.0
    if paired:
        df, nc = n_a - 1, d * math.sqrt(n_a)
    else:
        df, nc = n_a + n_b - 2, d * math.sqrt(n_a * n_b / (n_a + n_b))
    crit = float(sps.t.ppf(1 - alpha / 2, df))
    # P(T < -crit | nc) written as P(T > crit | -nc): scipy's nct.cdf returns NaN far in its lower
    # tail (nc around 9 and above at df 5), where the upper-tail form gives its ~0
    return float(sps.nct.sf(crit, df, nc) + sps.nct.sf(crit, df, -nc))


def n_for_power(
    d: float, power: float = 0.8, paired: bool = False, alpha: float = ALPHA
) -> int | float:
    """The fewest seeds per arm (paired: pairs) at which a two-sided t-test at `alpha` has at least
    `power` against the standardized effect `d` (Cohen's d; paired: d_z), at least 2. NaN when d
    is NaN or 0 (no number suffices) or the answer exceeds 10^9."""
    if not (isinstance(power, (int, float)) and 0 < power < 1):
        raise ValueError(f"power={power!r} is invalid; allowed: a number in (0, 1)")
    if d is None or math.isnan(d) or d == 0:
        return math.nan

    def reaches(n: int) -> bool:
        return t_power(d, n, n, paired, alpha) >= power

    lo, hi = 2, 2
    while not reaches(hi):  # doubling, then bisection: power grows with n
        lo, hi = hi + 1, hi * 2
        if hi > 10**9:
            return math.nan
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid + 1, hi)
    return int(hi)


def holm(pvalues) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the order given.

    The i-th smallest of m p-values is multiplied by m - i + 1 (i from 1), the results made
    non-decreasing in that order (step-down) and capped at 1. NaN stays NaN and does not count
    toward m. Reject at level alpha where the adjusted p-value is <= alpha."""
    p = np.asarray(list(pvalues), dtype=float)
    out = np.full(p.shape, math.nan)
    finite = np.flatnonzero(~np.isnan(p))
    m = finite.size
    if m == 0:
        return out.tolist()
    if np.any((p[finite] < 0) | (p[finite] > 1)):
        raise ValueError(f"pvalues={list(pvalues)!r} is invalid; allowed: numbers in [0, 1] or NaN")
    order = finite[np.argsort(p[finite], kind="stable")]
    adjusted = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out[order] = np.minimum(adjusted, 1.0)
    return out.tolist()


# Time to an event ---------------------------------------------------------------------------------
def _censored(times, reached, budget) -> sps.CensoredData:
    """Runs that reached the event by their budget are events at their time; the others are
    right-censored at their budget (budget None: at the time given for them)."""
    t = np.asarray(times, dtype=float).ravel()
    hit = np.asarray(reached, dtype=bool).ravel()
    if t.shape != hit.shape:
        raise ValueError(
            f"times has {t.size} values and reached {hit.size}; allowed: one of each per run"
        )
    limit = t if budget is None else np.broadcast_to(np.asarray(budget, dtype=float), t.shape)
    if np.any(~np.isfinite(limit)) or np.any(limit < 0):
        raise ValueError(
            f"budget={budget!r} is invalid; allowed: a number >= 0 (or one per run), or None "
            "with a censoring time given in `times` for every run that did not reach the event"
        )
    if np.any(hit & ~(np.isfinite(t) & (t >= 0))):
        raise ValueError("times: a run that reached the event needs a finite time >= 0")
    event = hit & (t <= limit)  # an event after the budget was not reached within it
    return sps.CensoredData(uncensored=t[event], right=limit[~event])


def kaplan_meier(times, reached, budget, confidence: float = 0.95):
    """The Kaplan-Meier curve of "not yet reached" over runs, some of which never reach the event.

    times: per run, when it reached the event (the step, the FLOPs, ...); reached: per run, whether
    it did; budget: a number (every run's budget) or one per run (a run stopped early is censored
    at its own last step): a run that did not reach the event by its budget is right-censored
    there; None: `times` gives the censoring time of the runs that did not reach it.

    Returns (curve, median): curve is a DataFrame with one row per distinct observation time
    (time, survival, ci_low, ci_high: the pointwise Greenwood interval scipy.stats.ecdf gives,
    clipped to [0, 1]; NaN where it is undefined, e.g. once every run has reached it); median is
    the first time the survival falls to 0.5 or below (NaN when fewer than half reach it)."""
    confidence = _check_confidence(confidence)
    data = _censored(times, reached, budget)
    if len(data) == 0:
        raise ValueError("times: no runs; allowed: at least one run")
    res = sps.ecdf(data)
    with warnings.catch_warnings():  # "undefined at some observations": NaN there, said above
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = res.sf.confidence_interval(confidence)
    curve = pd.DataFrame(
        {
            "time": res.sf.quantiles,
            "survival": res.sf.probabilities,
            "ci_low": ci.low.probabilities,
            "ci_high": ci.high.probabilities,
        }
    )
    below = curve.loc[curve["survival"] <= 0.5, "time"]
    median = float(below.iloc[0]) if len(below) else math.nan
    curve.attrs["median"] = median
    return curve, median


def logrank(groups: dict, budget=None) -> dict:
    """Log-rank test that two groups of runs reach the event at the same rate.

    groups: {name: (times, reached)} for exactly two groups (as kaplan_meier takes them; budget
    likewise). Returns {"statistic", "p"}: scipy.stats.logrank's z, (observed - expected events of
    the first group) / sqrt(variance), negative when the first group reaches the event later than
    the null expects, and its two-sided p-value."""
    if not isinstance(groups, dict) or len(groups) != 2:
        raise ValueError(
            f"groups with {len(groups) if isinstance(groups, dict) else '?'} entries is invalid; "
            "allowed: a dict of exactly two {name: (times, reached)}"
        )
    (t1, r1), (t2, r2) = groups.values()
    res = sps.logrank(_censored(t1, r1, budget), _censored(t2, r2, budget))
    return {"statistic": float(res.statistic), "p": float(res.pvalue)}


# Power of the decision actually taken ------------------------------------------------------------
# A study decides each contrast by a two-sided permutation test (paired: sign flips of the per-seed
# differences), Holm-adjusted over the study's contrasts, at alpha 0.05. That test has no closed
# form for its power, and its floor (smallest_p) can bind where a t-test's power says "likely":
# so power is simulated, the whole family at once, drawing each contrast's data from a normal
# model at its observed standardized effect (d_z, or d) and deciding each draw exactly as
# study_table does.
EXACT_FLIPS = 13  # up to 2^13 = 8192 sign patterns the test enumerates (scipy: <= n_resamples)
SIM_DRAWS = 2000  # simulated studies per power (power's Monte Carlo SD at most 0.011)
SIM_PERMUTATIONS = 999  # relabellings per simulated test beyond exact enumeration
MAX_PAIRS = 64  # the most pairs "pairs needed" searches


def _sign_patterns(n: int, rng) -> np.ndarray:
    """(P, n) matrix of +-1: every pattern for n <= EXACT_FLIPS, else SIM_PERMUTATIONS random ones
    with the identity first (the Monte Carlo p counts the observed relabelling)."""
    if n <= EXACT_FLIPS:
        bits = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
        return 1.0 - 2.0 * bits
    flips = rng.choice([-1.0, 1.0], size=(SIM_PERMUTATIONS, n))
    return np.vstack([np.ones((1, n)), flips])


def _two_sided(stat: np.ndarray, null: np.ndarray) -> np.ndarray:
    """scipy.stats.permutation_test's two-sided p: twice the smaller tail, each counting the
    observed statistic, capped at 1; stat (S,), null (S, P)."""
    eps = 1e-14 * np.maximum(1.0, np.abs(stat))[:, None]
    greater = (null >= stat[:, None] - eps).mean(1)
    less = (null <= stat[:, None] + eps).mean(1)
    return np.minimum(1.0, 2.0 * np.minimum(greater, less))


def _paired_pvalues(x: np.ndarray, rng) -> np.ndarray:
    """Sign-flip permutation p-values of the mean of each row of x (S, n)."""
    signs = _sign_patterns(x.shape[1], rng)
    out = np.empty(x.shape[0])
    step = max(1, 4_000_000 // signs.shape[0])
    for i in range(0, x.shape[0], step):
        chunk = x[i : i + step]
        out[i : i + step] = _two_sided(chunk.mean(1), chunk @ signs.T / x.shape[1])
    return out


def _unpaired_pvalues(a: np.ndarray, b: np.ndarray, rng) -> np.ndarray:
    """Permutation p-values of mean(b) - mean(a) for each row pair of a (S, n_a), b (S, n_b): the
    runs shuffled between the arms (every split enumerated when there are at most
    SIM_PERMUTATIONS + 1 of them, as scipy does, else that many random ones)."""
    n_a, n_b = a.shape[1], b.shape[1]
    pooled = np.concatenate([a, b], axis=1)
    n = n_a + n_b
    if math.comb(n, n_a) <= SIM_PERMUTATIONS + 1:
        from itertools import combinations

        masks = np.zeros((math.comb(n, n_a), n), dtype=bool)
        for i, idx in enumerate(combinations(range(n), n_a)):
            masks[i, list(idx)] = True
    else:
        order = np.argsort(rng.random((SIM_PERMUTATIONS, n)), axis=1)
        masks = np.zeros((SIM_PERMUTATIONS + 1, n), dtype=bool)
        masks[0, :n_a] = True
        np.put_along_axis(masks[1:], order[:, :n_a], True, axis=1)
    weights = np.where(masks, -1.0 / n_a, 1.0 / n_b)  # (P, n): mean(b) - mean(a) of a split
    stat = b.mean(1) - a.mean(1)
    return _two_sided(stat, pooled @ weights.T)


def _holm_rows(p: np.ndarray) -> np.ndarray:
    """holm() applied to every row of p (S, m)."""
    m = p.shape[1]
    order = np.argsort(p, axis=1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=1) * (m - np.arange(m))[None, :]
    adjusted = np.minimum(np.maximum.accumulate(sorted_p, axis=1), 1.0)
    out = np.empty_like(p)
    np.put_along_axis(out, order, adjusted, axis=1)
    return out


def _finite_d(d: float) -> float:
    return math.copysign(1e6, d) if math.isinf(d) else d


def decision_power(
    family: list[dict], alpha: float = ALPHA, draws: int = SIM_DRAWS, seed: int = 0
) -> list[float]:
    """The power of each contrast of a family under the decision a study takes: a two-sided
    permutation test (paired: sign flips; scipy's exact enumeration up to 2^13 patterns), Holm
    over the family, rejected at `alpha`; by simulation.

    family: one dict per contrast with d (Cohen's d; paired: d_z), paired, and n (pairs) or n_a,
    n_b (runs per arm). Each draw gives each contrast normal data at its d (unit SD: the test is
    scale-free) independently of the others, tests each, adjusts the draw's p-values by Holm and
    counts a rejection. A contrast with d NaN takes part with p = 1 (it never rejects, and Holm
    counts it: study_table's p is NaN there and Holm leaves it out, so such a member is dropped
    here too). Seeded: the same family gives the same powers."""
    rng = np.random.default_rng(seed)
    live = [i for i, c in enumerate(family) if not _nan(c.get("d"))]
    out = [math.nan] * len(family)
    if not live:
        return out
    pvalues = np.empty((draws, len(live)))
    for j, i in enumerate(live):
        c = family[i]
        d = _finite_d(float(c["d"]))
        if c["paired"]:
            n = int(c["n"])
            if n < 2:
                pvalues[:, j] = 1.0
                continue
            x = rng.standard_normal((draws, n)) + d
            pvalues[:, j] = _paired_pvalues(x, rng)
        else:
            n_a, n_b = int(c["n_a"]), int(c["n_b"])
            if min(n_a, n_b) < 2:
                pvalues[:, j] = 1.0
                continue
            a = rng.standard_normal((draws, n_a))
            b = rng.standard_normal((draws, n_b)) + d
            pvalues[:, j] = _unpaired_pvalues(a, b, rng)
    rejected = (_holm_rows(pvalues) <= alpha).mean(0)
    for j, i in enumerate(live):
        out[i] = float(rejected[j])
    return out


def _nan(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def decision_n_for_power(
    family: list[dict],
    index: int,
    power: float = 0.8,
    alpha: float = ALPHA,
    draws: int = SIM_DRAWS,
    seed: int = 0,
    max_n: int = MAX_PAIRS,
) -> int | float:
    """The fewest pairs (paired) or seeds per arm (unpaired) at which contrast `index` of the family
    reaches `power` under the study's decision (decision_power), every contrast of the family run
    at that n; NaN when its d is NaN or 0, or when max_n does not suffice. The same seed at every
    n, so the search reads one simulated sequence of studies (power then grows with n but for
    Monte Carlo noise of about 0.01)."""
    d = family[index].get("d")
    if _nan(d) or d == 0:
        return math.nan

    def at(n: int) -> list[dict]:
        return [{**c, "n": n, "n_a": n, "n_b": n} for c in family]

    def reaches(n: int) -> bool:
        return decision_power(at(n), alpha, draws, seed)[index] >= power

    lo, hi = 2, 2
    while not reaches(hi):
        if hi >= max_n:
            return math.nan
        lo, hi = hi + 1, min(hi * 2, max_n)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid + 1, hi)
    return int(hi)
