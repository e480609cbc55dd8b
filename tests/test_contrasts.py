"""The statistics of a study's contrasts (lrt_results.contrasts), each against numbers worked out
here independently: exact permutation p-values enumerated with itertools, Holm by hand,
Kaplan-Meier and the log-rank statistic by their textbook formulas, power against published
tables and a Monte Carlo of the t-test itself."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from lrt_results.contrasts import (
    cohens_d,
    contrast,
    holm,
    kaplan_meier,
    logrank,
    n_for_power,
    smallest_p,
    t_power,
)

NAN = math.nan


# Holm --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pvalues", "expected"),
    [
        # sorted: 0.005 x4 = 0.02, 0.01 x3 = 0.03, 0.03 x2 = 0.06, 0.04 x1 -> kept at 0.06
        ([0.01, 0.04, 0.03, 0.005], [0.03, 0.06, 0.06, 0.02]),
        # NaN is not counted in m (m = 2 here) and stays NaN
        ([NAN, 0.02, 0.04], [NAN, 0.04, 0.04]),
        # capped at 1
        ([0.6, 0.7], [1.0, 1.0]),
        # step-down: the larger p may not get a smaller adjusted value (0.011 -> 0.02)
        ([0.01, 0.011], [0.02, 0.02]),
        ([0.2], [0.2]),
        ([], []),
        ([NAN], [NAN]),
    ],
)
def test_holm_by_hand(pvalues, expected):
    got = holm(pvalues)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert (math.isnan(g) and math.isnan(e)) or g == pytest.approx(e)


def test_holm_matches_statsmodels():
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    rng = np.random.default_rng(3)
    for m in (1, 2, 5, 12):
        p = rng.uniform(0, 0.2, size=m)
        expected = multitest.multipletests(p, method="holm")[1]
        assert holm(p) == pytest.approx(list(expected))


def test_holm_refuses_what_is_not_a_p_value():
    with pytest.raises(ValueError, match="pvalues"):
        holm([0.5, 1.5])


# Permutation p-values, enumerated ----------------------------------------------------------------
def test_paired_p_is_the_exact_sign_flip_test():
    a = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    b = a + np.array([0.3, 1.1, 0.4, 0.9, -0.2])
    diff = b - a
    observed = abs(diff.mean())
    flips = list(itertools.product((1, -1), repeat=len(diff)))
    extreme = sum(abs(np.mean(np.array(s) * diff)) >= observed - 1e-12 for s in flips)
    expected = extreme / len(flips)  # 2^5 = 32 relabellings; the null is symmetric
    res = contrast(a, b, paired=True)
    assert res["p"] == pytest.approx(expected)
    assert res["effect"] == pytest.approx(diff.mean())
    assert res["n_a"] == res["n_b"] == 5


def test_unpaired_p_is_the_exact_relabelling_test():
    a = np.array([1.0, 1.4, 0.7])
    b = np.array([1.9, 2.5, 1.2, 2.2])
    pooled = np.concatenate([a, b])
    observed = b.mean() - a.mean()
    null = []
    for idx in itertools.combinations(range(len(pooled)), len(a)):
        mask = np.zeros(len(pooled), bool)
        mask[list(idx)] = True
        null.append(pooled[~mask].mean() - pooled[mask].mean())
    null = np.array(null)  # C(7, 3) = 35 splits
    tol = 1e-12
    # two-sided: twice the smaller one-sided p (the null of unequal arms is not symmetric)
    expected = min(1.0, 2 * min(np.mean(null >= observed - tol), np.mean(null <= observed + tol)))
    res = contrast(a, b, paired=False)
    assert res["p"] == pytest.approx(expected)
    assert res["effect"] == pytest.approx(observed)
    assert (res["n_a"], res["n_b"]) == (3, 4)


def test_smallest_p_bounds_what_few_seeds_can_show():
    assert smallest_p(3, paired=True) == pytest.approx(0.25)  # 2 / 2^3
    assert smallest_p(3, 3, paired=False) == pytest.approx(0.1)  # 2 / C(6, 3)
    # three pairs all in one direction: the strongest evidence three pairs can give
    res = contrast([1.0, 2.0, 3.0], [5.0, 7.0, 9.5], paired=True)
    assert res["p"] == pytest.approx(0.25) and res["p_min"] == pytest.approx(0.25)


# Intervals ---------------------------------------------------------------------------------------
def test_bootstrap_intervals_cover_the_effect_and_pairing_narrows_them():
    rng = np.random.default_rng(0)
    seed_effect = rng.normal(0, 1.0, size=8)  # shared by both arms of a seed
    a = 10 + seed_effect + rng.normal(0, 0.05, size=8)
    b = 10.3 + seed_effect + rng.normal(0, 0.05, size=8)
    paired, unpaired = contrast(a, b, paired=True), contrast(a, b, paired=False)
    for res in (paired, unpaired):
        assert res["ci_low"] < res["effect"] < res["ci_high"]
    diff = b - a
    assert diff.min() <= paired["ci_low"] and paired["ci_high"] <= diff.max()
    assert paired["ci_low"] > 0  # the seed noise cancels in the differences ...
    assert unpaired["ci_low"] < 0  # ... and swamps the difference of the means
    assert paired["p"] < 0.05 < unpaired["p"]


def test_t_interval_is_the_paired_t_tests_and_wider_than_the_bootstrap_on_three_pairs():
    """interval="t" against scipy's paired t-test's own confidence interval; with three pairs
    all below 0 the percentile bootstrap excludes 0 while t does not."""
    a = np.array([1.40, 1.52, 1.47])
    b = np.array([1.37, 1.50, 1.31])
    ref = sps.ttest_rel(b, a).confidence_interval(0.95)
    t = contrast(a, b, paired=True, interval="t")
    assert (t["ci_low"], t["ci_high"]) == pytest.approx((ref.low, ref.high), rel=1e-12)
    boot = contrast(a, b, paired=True)
    assert boot["ci_high"] < 0 < t["ci_high"]
    assert t["p"] == boot["p"] and t["effect"] == boot["effect"]  # only the interval changes
    assert math.isnan(contrast(a[:1], b[:1], paired=True, interval="t")["ci_low"])


@pytest.mark.parametrize("interval,paired", [("t", False), ("normal", True)])
def test_an_interval_the_contrast_cannot_give_is_refused(interval, paired):
    with pytest.raises(ValueError, match="interval="):
        contrast([1.0, 2.0], [2.0, 3.0], paired=paired, interval=interval)


def test_unpaired_interval_resamples_each_arm_on_its_own():
    """Against a bootstrap written here: each arm resampled with replacement at its own size."""
    a = np.array([3.1, 2.4, 2.9, 3.6, 2.2, 3.0])
    b = np.array([3.9, 4.4, 3.2, 4.8, 4.1, 3.5, 4.0, 4.6])
    rng = np.random.default_rng(1)
    draws = 40000
    boot = rng.choice(b, (draws, b.size)).mean(1) - rng.choice(a, (draws, a.size)).mean(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    res = contrast(a, b, paired=False)
    assert res["ci_low"] == pytest.approx(lo, abs=0.03)
    assert res["ci_high"] == pytest.approx(hi, abs=0.03)


# Effect sizes and power --------------------------------------------------------------------------
def test_cohens_d_by_hand():
    # equal SDs of 1, means 2 apart
    assert cohens_d([1.0, 2.0, 3.0], [3.0, 4.0, 5.0], paired=False) == pytest.approx(2.0)
    # unequal n: the pooled variance weighs each arm by its degrees of freedom
    a, b = [1.0, 2.0, 3.0], [0.0, 2.0, 4.0, 6.0]  # var 1 (df 2) and var 20/3 (df 3)
    pooled = math.sqrt((2 * 1.0 + 3 * 20 / 3) / 5)
    assert cohens_d(a, b, paired=False) == pytest.approx((3.0 - 2.0) / pooled)
    # d_z: differences [1, 2, 2], mean 5/3, SD sqrt(1/3)
    assert cohens_d([1.0, 2.0, 3.0], [2.0, 4.0, 5.0], paired=True) == pytest.approx(
        (5 / 3) / math.sqrt(1 / 3)
    )
    assert math.isnan(cohens_d([1.0], [2.0, 3.0], paired=False))
    assert cohens_d([1.0, 1.0], [2.0, 2.0], paired=False) == math.inf
    assert math.isnan(cohens_d([1.0, 1.0], [1.0, 1.0], paired=True))


def test_power_against_published_values():
    # Cohen (1988), two-sample t, two-sided alpha .05: n = 8 per group, d = 1.0 -> .46
    assert t_power(1.0, 8, 8, paired=False) == pytest.approx(0.46, abs=0.005)
    # one-sample (paired) t, n = 10, d_z = 1.0 -> .80 (G*Power: 0.803)
    assert t_power(1.0, 10, paired=True) == pytest.approx(0.803, abs=0.002)
    assert t_power(0.0, 10, 10) == pytest.approx(0.05)  # no effect: the test's own alpha
    assert math.isnan(t_power(1.0, 1, 8)) and math.isnan(t_power(NAN, 8, 8))


def test_power_is_what_the_t_test_does_in_simulation():
    rng = np.random.default_rng(7)
    sims = 20000
    x = rng.normal(0.0, 1.0, (sims, 8))
    y = rng.normal(1.0, 1.0, (sims, 8))  # d = 1
    unpaired = np.mean(sps.ttest_ind(y, x, axis=1).pvalue < 0.05)
    assert t_power(1.0, 8, 8, paired=False) == pytest.approx(unpaired, abs=0.015)
    diffs = rng.normal(0.6, 1.0, (sims, 12))  # d_z = 0.6
    paired = np.mean(sps.ttest_1samp(diffs, 0.0, axis=1).pvalue < 0.05)
    assert t_power(0.6, 12, paired=True) == pytest.approx(paired, abs=0.015)


def test_power_of_a_large_effect_at_few_seeds_is_a_number_near_1():
    """A large standardized effect at few pairs (d_z 3.7 at 6 pairs, as a study's clearly
    separated arms give) puts the noncentral t far from the lower rejection region, where
    scipy's nct.cdf returns NaN; the power is still a number, the simulated t-test's rejection
    rate, in either direction of the effect."""
    rng = np.random.default_rng(3)
    for d_z in (3.7, -3.7, 9.0):
        diffs = rng.normal(d_z, 1.0, (20000, 6))
        simulated = np.mean(sps.ttest_1samp(diffs, 0.0, axis=1).pvalue < 0.05)
        assert t_power(d_z, 6, paired=True) == pytest.approx(simulated, abs=0.002)
    assert t_power(4.0, 8, 8, paired=False) == pytest.approx(1.0, abs=1e-6)


def test_n_for_power_against_published_values():
    # Cohen's table for power .80, two-sided alpha .05: d = .5 -> 64 per group, d = .8 -> 26
    assert n_for_power(0.5, 0.8, paired=False) == 64
    assert n_for_power(0.8, 0.8, paired=False) == 26
    assert n_for_power(-0.5, 0.8, paired=False) == 64  # the sign does not matter
    # one-sample t, d = .5: 34 (G*Power)
    assert n_for_power(0.5, 0.8, paired=True) == 34
    assert math.isnan(n_for_power(0.0)) and math.isnan(n_for_power(NAN))
    with pytest.raises(ValueError, match="power"):
        n_for_power(0.5, power=1.2)


def test_contrast_reports_power_at_its_own_n():
    a = [1.0, 2.0, 3.0, 4.0]
    b = [2.0, 2.5, 4.5, 4.0]
    res = contrast(a, b, paired=False)
    # pooled SD: both variances by hand (5/3 and 1.3958...)
    va, vb = np.var(a, ddof=1), np.var(b, ddof=1)
    d = (np.mean(b) - np.mean(a)) / math.sqrt((va + vb) / 2)
    assert res["d"] == pytest.approx(d)
    df, nc = 6, d * math.sqrt(2)
    crit = sps.t.ppf(0.975, df)
    assert res["power"] == pytest.approx(sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc))


# NaN safety --------------------------------------------------------------------------------------
def test_too_few_values_give_nan_never_an_exception_or_a_zero_width_interval():
    one = contrast([1.0], [2.0, 3.0], paired=False)
    assert one["effect"] == pytest.approx(1.5)
    for key in ("ci_low", "ci_high", "p", "power", "d"):
        assert math.isnan(one[key]), key
    none = contrast([], [], paired=False)
    assert none["n_a"] == 0 and math.isnan(none["effect"])
    single_pair = contrast([1.0], [1.0], paired=True)
    assert math.isnan(single_pair["ci_low"]) and math.isnan(single_pair["p"])
    # a pair with a NaN on either side is dropped; NaNs are dropped per arm when unpaired
    res = contrast([1.0, NAN, 3.0, 4.0], [2.0, 5.0, NAN, 6.0], paired=True)
    assert res["n_a"] == 2 and res["effect"] == pytest.approx(1.5)
    res = contrast([1.0, NAN, 3.0], [2.0, 5.0, NAN], paired=False)
    assert (res["n_a"], res["n_b"]) == (2, 2)


def test_paired_arms_must_be_aligned():
    with pytest.raises(ValueError, match="paired"):
        contrast([1.0, 2.0], [1.0, 2.0, 3.0], paired=True)


# Kaplan-Meier and log-rank -----------------------------------------------------------------------
def test_kaplan_meier_by_hand_with_censoring():
    # five runs: events at 2, 4, 5; one stopped (censored) at 3, one censored at its budget 6
    times = [2, 99, 4, 5, 99]
    reached = [True, False, True, True, False]
    budget = [10, 3, 10, 10, 6]
    curve, median = kaplan_meier(times, reached, budget)
    # S(2) = 4/5; 3 censored leaves 3 at risk at 4: S(4) = 0.8 * 2/3; S(5) = S(4) * 1/2
    s2, s4 = 0.8, 0.8 * 2 / 3
    s5 = s4 / 2
    assert curve["time"].tolist() == [2, 3, 4, 5, 6]
    assert curve["survival"].tolist() == pytest.approx([s2, s2, s4, s5, s5])
    assert median == 5  # the first time S <= 0.5
    # Greenwood: var S(t) = S(t)^2 * sum d / (n (n - d)); linear interval clipped to [0, 1]
    z = sps.norm.ppf(0.975)
    se2 = math.sqrt(s2**2 * (1 / (5 * 4)))
    se5 = math.sqrt(s5**2 * (1 / (5 * 4) + 1 / (3 * 2) + 1 / (2 * 1)))
    assert curve["ci_low"][0] == pytest.approx(s2 - z * se2)
    assert curve["ci_high"][0] == pytest.approx(1.0)
    assert curve["ci_high"][3] == pytest.approx(s5 + z * se5)
    assert curve["ci_low"][3] == pytest.approx(0.0)


def test_kaplan_meier_censors_at_one_budget():
    # the run reaching the event at 7 did so after the budget of 5: censored at 5
    curve, median = kaplan_meier([1, 2, 7, 3], [True, True, True, False], 5)
    assert curve["time"].tolist() == [1, 2, 5]
    assert curve["survival"].tolist() == pytest.approx([0.75, 0.5, 0.5])
    assert median == 2
    _, median = kaplan_meier([1, 0, 0], [True, False, False], 5)
    assert math.isnan(median)  # a third reached it: no median
    curve, median = kaplan_meier([0, 0], [False, False], 5)
    assert curve["survival"].tolist() == [1.0] and math.isnan(median)


def test_kaplan_meier_refuses_bad_input():
    with pytest.raises(ValueError, match="budget"):
        kaplan_meier([1, 2], [True, False], -1)
    with pytest.raises(ValueError, match="times"):
        kaplan_meier([1, 2, 3], [True, False], 5)
    with pytest.raises(ValueError, match="times"):
        kaplan_meier([NAN, 2], [True, False], 5)


def _logrank_by_hand(x, y):
    """(O - E) / sqrt(V) of the first group, over the distinct event times."""
    (tx, ex), (ty, ey) = x, y
    times = np.concatenate([tx, ty])
    events = np.concatenate([ex, ey]).astype(bool)
    first = np.r_[np.ones(len(tx), bool), np.zeros(len(ty), bool)]
    o_minus_e = var = 0.0
    for t in sorted(set(times[events])):
        at_risk = times >= t
        n, n1 = at_risk.sum(), (at_risk & first).sum()
        d = (events & (times == t)).sum()
        d1 = (events & (times == t) & first).sum()
        o_minus_e += d1 - d * n1 / n
        var += d * (n1 / n) * (1 - n1 / n) * (n - d) / (n - 1) if n > 1 else 0.0
    return o_minus_e / math.sqrt(var)


def test_logrank_by_hand():
    slow = (np.array([2, 4, 5, 3, 6]), np.array([1, 1, 1, 0, 0]))
    fast = (np.array([1, 2, 3, 6]), np.array([1, 1, 1, 0]))
    z = _logrank_by_hand(slow, fast)
    res = logrank({"slow": slow, "fast": fast})
    assert res["statistic"] == pytest.approx(z)
    assert res["statistic"] < 0  # the first group reaches it later than the null expects
    assert res["p"] == pytest.approx(2 * sps.norm.sf(abs(z)))
    with pytest.raises(ValueError, match="exactly two"):
        logrank({"a": slow})


# The power of the decision a study takes (permutation test, Holm) ------------------------------
def _reference_power(d, n, draws, seed, m_null=0):
    """Power by the slow road: scipy's own permutation test on each simulated contrast, Holm by
    hand over it and m_null contrasts drawn with no effect."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(draws):
        ps = []
        for effect in [d] + [0.0] * m_null:
            x = rng.standard_normal(n) + effect
            res = sps.permutation_test(
                (np.zeros(n), x),
                lambda a, b, axis=-1: np.mean(b - a, axis=axis),
                permutation_type="samples",
                vectorized=True,
                n_resamples=9999,
                alternative="two-sided",
            )
            ps.append(res.pvalue)
        hits += holm(ps)[0] <= 0.05
    return hits / draws


def test_decision_power_is_what_the_permutation_test_with_holm_does():
    from lrt_results.contrasts import decision_power

    for d, n, m_null in ((1.2, 8, 0), (1.5, 7, 1)):
        family = [{"d": d, "paired": True, "n": n}] + [{"d": 0.0, "paired": True, "n": n}] * m_null
        got = decision_power(family, draws=4000, seed=1)[0]
        want = _reference_power(d, n, draws=300, seed=2, m_null=m_null)
        # the reference's Monte Carlo SD is at most 0.029: four of them
        assert abs(got - want) < 0.12, (d, n, m_null, got, want)
    # the simulated power is below the t-test's, which knows no floor and no Holm
    assert decision_power([{"d": 1.2, "paired": True, "n": 8}] * 4)[0] < t_power(
        1.2, 8, paired=True
    )


def test_decision_power_knows_the_floor_of_an_exact_test():
    from lrt_results.contrasts import decision_n_for_power, decision_power

    huge = {"d": 50.0, "paired": True}
    # 5 pairs: the smallest p is 2/32 = 0.0625 > 0.05, whatever the effect
    assert decision_power([{**huge, "n": 5}]) == [0.0]
    assert t_power(50.0, 5, paired=True) > 0.99
    # 6 pairs: 0.03125 alone decides, but not after Holm over two (0.0625)
    assert decision_power([{**huge, "n": 6}]) == [1.0]
    assert decision_power([{**huge, "n": 6}, {**huge, "n": 6}]) == [0.0, 0.0]
    # 7 pairs: 0.0156 x 2 = 0.031 decides both
    assert decision_power([{**huge, "n": 7}, {**huge, "n": 7}]) == [1.0, 1.0]
    # pairs needed: the first n at which the floor lets Holm over four decide (2/2^n * 4 <= 0.05)
    assert decision_n_for_power([huge] * 4, 0) == 8
    assert math.isnan(decision_n_for_power([{"d": 0.0, "paired": True, "n": 8}], 0))


def test_decision_power_unpaired_matches_the_floor_and_is_seeded():
    from lrt_results.contrasts import decision_power

    # 3 and 3 runs: 20 splits, smallest p 0.1: never decided
    assert decision_power([{"d": 50.0, "paired": False, "n_a": 3, "n_b": 3}]) == [0.0]
    assert decision_power([{"d": 50.0, "paired": False, "n_a": 4, "n_b": 4}]) == [1.0]
    family = [{"d": 0.8, "paired": False, "n_a": 6, "n_b": 6}]
    assert decision_power(family, seed=3) == decision_power(family, seed=3)
    assert 0.0 < decision_power(family)[0] < t_power(0.8, 6, 6) + 0.05
