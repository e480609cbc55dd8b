"""BPB against compute: points from a run store, paired deltas, power-law fits, the decision rule.

The store is fabricated (config.json + summary.json per run, no training) with BPB values chosen
so every expected number is computed by hand here: the paired deltas, which budgets pair, the
fitted exponent of an exact power law.
"""

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from scaling_store import bpb_law, build, write_run

from lrt_lab.store.results import load_plans, load_runs, write_plan
from lrt_results.scaling import (
    check_same_heldout,
    decide,
    fit_power_laws,
    paired_deltas,
    planned_seeds,
    scaling_figure,
    scaling_points,
)


def test_points_read_bpb_and_compute_in_the_papers_units(tmp_path):
    points = build(tmp_path, lambda r, s: -0.02)
    lrt = points[points["method"] == "lrt interleaved:2"].set_index(["R", "seed"])
    assert lrt.loc[(10, 1), "C"] == pytest.approx(20)  # plotted at twice its tokens
    assert lrt.loc[(10, 1), "bpb_exact"] == pytest.approx(bpb_law(10) + 0.01 - 0.02)
    assert lrt.loc[(10, 1), "bpb_parallel"] == pytest.approx(bpb_law(10) + 0.01 + 0.03)
    tf = points[points["method"] == "transformer"]
    assert (tf["C"] == tf["R"]).all() and len(points) == 30
    check_same_heldout(points)  # one corpus, one evaluation
    write_run(tmp_path, "transformer", "onepass", 7, 0, 2.0, sha="other")
    with pytest.raises(ValueError, match="different held-out bytes"):
        check_same_heldout(scaling_points(load_runs(tmp_path)))


def test_paired_deltas_token_and_compute_matched_by_hand(tmp_path):
    # the LRT is 0.02 better than the transformer at equal tokens, seed for seed (plus a little
    # seed-dependent noise so the interval has width)
    points = build(tmp_path, lambda r, s: -0.02 + 0.001 * s)
    deltas = paired_deltas(points).set_index(["match", "R"])
    tok = deltas.loc[("tokens", 10)]
    assert tok["R_base"] == 10 and tok["n"] == 3
    assert tok["delta"] == pytest.approx(-0.02 + 0.001)  # mean of -0.020, -0.019, -0.018
    # Student's t with 2 degrees of freedom: -0.019 -+ 4.303 x 0.001 / sqrt(3)
    assert tok["ci_low"] == pytest.approx(-0.019 - 4.3027 * 0.001 / math.sqrt(3), rel=1e-4)
    assert tok["ci_high"] == pytest.approx(-0.019 + 4.3027 * 0.001 / math.sqrt(3), rel=1e-4)
    assert tok["p"] == pytest.approx(0.25)  # 3 pairs, all negative: 2 of the 8 sign patterns
    comp = deltas.loc[("compute", 10)]  # the LRT at R = 10 costs C = 20: the transformer at 20
    assert comp["R_base"] == 20 and comp["C"] == pytest.approx(20)
    assert comp["delta"] == pytest.approx(bpb_law(10) - bpb_law(20) - 0.019)
    # the LRT's R = 40 (C = 80) pairs with the transformer's R = 80; its R = 2.5 has no
    # token-matched transformer
    assert ("compute", 40) in deltas.index and ("tokens", 2.5) not in deltas.index


def test_decision_rule_reads_the_intervals(tmp_path):
    # token-matched better everywhere, but by less than the doubled compute buys: the claim fails
    worse = build(tmp_path / "a", lambda r, s: -0.02 + 0.002 * s)
    assert decide(paired_deltas(worse)).startswith("the compute-efficiency claim fails")
    # compute-matched intervals that contain 0 are not a failure: not shown, with the effect the
    # seeds could have shown (the half-width of the intervals, by hand from their t intervals)
    level = build(tmp_path / "a2", lambda r, s: -(bpb_law(r) - bpb_law(2 * r)) + 0.01 * (s - 1))
    deltas = paired_deltas(level)
    at = deltas[(deltas["match"] == "compute") & deltas["C"].isin([40, 80])]
    assert ((at["ci_low"] < 0) & (at["ci_high"] > 0)).all()
    half = 4.3027 * 0.01 / math.sqrt(3)  # t(0.975, 2) x SD / sqrt(3): the seeds' +-0.01
    text = decide(deltas)
    assert text.startswith("the compute-efficiency claim is not shown at this power")
    assert f"about {half:.3f} BPB" in text
    # the memory is worth more than the compute it costs: better at C = 40 and 80 too
    better = build(tmp_path / "b", lambda r, s: -(bpb_law(r) - bpb_law(2 * r)) - 0.02 + 0.002 * s)
    assert decide(paired_deltas(better)) == "the compute-efficiency claim holds in miniature"
    # no token-matched advantage
    none = build(tmp_path / "c", lambda r, s: 0.01 * (s - 1))
    assert decide(paired_deltas(none)).startswith("the memory does not help")
    # budgets still missing: not decided
    partial = build(tmp_path / "d", lambda r, s: -0.05 + 0.002 * s, lrt_rs=(5, 10))
    assert decide(paired_deltas(partial)).startswith("not decided")
    assert decide(pd.DataFrame()).startswith("not decided")
    # one seed: no interval anywhere, so nothing can be ruled out yet
    single = build(tmp_path / "e", lambda r, s: 0.01, seeds=(0,))
    assert decide(paired_deltas(single)) == (
        "not decided: fewer than 2 paired seeds at token-matched R = 5, 10, 20, 40"
    )
    # the spec plans more seeds than the store has: not decided, whatever the intervals say
    assert decide(paired_deltas(better), planned_seeds=5) == (
        "not decided: 3 of the 5 planned seeds paired at some budgets so far"
    )
    assert decide(paired_deltas(better), planned_seeds=3).endswith("holds in miniature")
    # a token-matched advantage, but C = 80 has one seed so far
    thin = build(tmp_path / "f", lambda r, s: -0.05 + 0.002 * s, seeds=(0, 1))
    thin = thin[(thin["seed"] == 0) | (thin["R"] < 40)]
    assert decide(paired_deltas(thin)).startswith("not decided: fewer than 2 paired seeds at comp")


def test_power_law_fit_recovers_a_known_exponent(tmp_path):
    points = build(tmp_path, lambda r, s: 0.0)
    fits = fit_power_laws(points, n_resamples=50).set_index("method")
    tf = fits.loc["transformer"]
    # the seed means are the law plus 0.01 (the mean of the shifts 0, 0.01, 0.02)
    assert tf["alpha"] == pytest.approx(0.5, rel=1e-3)
    assert tf["E"] == pytest.approx(1.51, rel=1e-3) and tf["A"] == pytest.approx(2.0, rel=1e-3)
    assert tf["alpha_low"] <= 0.5 + 1e-3 and tf["alpha_high"] >= 0.5 - 1e-3
    lrt = fits.loc["lrt interleaved:2"]  # the same law in R, so in C = 2R: A' = A * 2^alpha
    assert lrt["A"] == pytest.approx(2.0 * math.sqrt(2), rel=1e-3)


def test_a_partly_run_grid_fits_without_warnings(tmp_path):
    # seed 2 has only the two smallest budgets (a grid run seed by seed, stopped midway): a
    # resample of seed 2 alone has no value at the larger budgets, which that refit drops
    points = build(tmp_path, lambda r, s: 0.0)
    points = points[(points["seed"] < 2) | (points["R"] <= 10)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fits = fit_power_laws(points, n_resamples=200).set_index("method")
    tf = fits.loc["transformer"]
    assert tf["n_seeds"] == 3 and tf["alpha"] == pytest.approx(0.5, rel=0.05)
    assert tf["alpha_low"] <= tf["alpha"] <= tf["alpha_high"]


def test_figure_is_written(tmp_path):
    points = build(tmp_path / "s", lambda r, s: -0.01)
    path = tmp_path / "bpb.png"
    scaling_figure(points, path, x="flops")
    assert path.stat().st_size > 10_000
    with pytest.raises(ValueError, match="x='tokens'"):
        scaling_figure(points, path, x="tokens")
    assert np.isfinite(points["flops"]).all()


@pytest.mark.slow
def test_analyze_scaling_command(tmp_path, capsys):
    from lrt_lab.commands.analyze import main

    build(tmp_path, lambda r, s: -0.02 + 0.002 * s)
    out_dir = tmp_path.parent / f"{tmp_path.name}-out"
    assert main(["scaling", str(tmp_path), "--x", "flops", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "decision (bpb_exact; no plan recorded): the compute-efficiency claim fails" in out
    assert (out_dir / "scaling_bpb_exact_flops.png").is_file()
    assert (out_dir / "tables" / "scaling_deltas.csv").is_file()
    assert not (tmp_path / ".analysis").exists()  # nothing written into the store
    (tmp_path / "empty").mkdir()
    assert main(["scaling", str(tmp_path / "empty")]) == 2
    assert "no complete run trained with a tokens-per-parameter budget" in capsys.readouterr().err
    assert main(["scaling", str(tmp_path / "nowhere")]) == 2
    assert "store=" in capsys.readouterr().err  # refused before anything is read


def test_a_run_repeated_under_another_name_counts_once_and_another_rate_is_another_arm(tmp_path):
    """A pilot's run that the grid repeats (same method, budget and seed) is one point, not two
    (two would shrink the intervals); a run at another Muon rate is its own arm, not a seed."""
    before = build(tmp_path, lambda r, s: -0.02, seeds=(0, 1))
    grid_run = before[(before["method"] == "lrt interleaved:2") & (before["R"] == 10)].iloc[0]
    # the pilot trained the same run (the same numbers) under its own name
    write_run(tmp_path, "lrt", "interleaved:2", 10, 0, grid_run["bpb_exact"], prefix="pilot-")
    write_run(tmp_path, "lrt", "interleaved:2", 10, 2, 1.0, prefix="pilot-", matrix_lr=0.04)
    points = scaling_points(load_runs(tmp_path))
    # the last by name is kept ("pilot-lrt..." after "lrt...")
    assert points.attrs["duplicates"] == ["lrt-interleaved_2-R10-s0"]
    lrt10 = points[(points["method"] == "lrt interleaved:2") & (points["R"] == 10)]
    assert sorted(lrt10["seed"]) == [0, 1]
    assert "pilot-lrt-interleaved_2-R10-s0" in set(lrt10["run"])
    other = points[points["method"] == "lrt interleaved:2 (Muon 0.04)"]
    assert list(other["seed"]) == [2]
    token10 = paired_deltas(points)
    assert token10[(token10["match"] == "tokens") & (token10["R"] == 10)]["n"].item() == 2


def test_the_decision_waits_for_the_seeds_the_grids_plan_records(tmp_path, capsys):
    """Two seeds of a grid that plans three: the rule would decide on the two (and read their
    wide intervals as "not below 0"); with the plan recorded the command, like the docs, waits."""
    from lrt_lab.commands.analyze import main

    points = build(tmp_path, lambda r, s: -0.02 + 0.002 * s, seeds=(0, 1))
    assert planned_seeds(points, load_plans(tmp_path)) is None
    planned = [f"{n}-s2" for n in points["run"].str.rsplit("-", n=1).str[0].unique()]
    write_plan(tmp_path, list(points["run"]) + planned, [0, 1, 2])
    write_plan(tmp_path, ["loop_2-R20-s0"], list(range(9)))  # another grid's: not these arms
    assert planned_seeds(points, load_plans(tmp_path)) == 3
    assert main(["scaling", str(tmp_path), "--out", str(tmp_path.parent / "out")]) == 0
    out = capsys.readouterr().out
    assert "decision (bpb_exact; 3 seeds planned): not decided: 2 of the 3 planned seeds" in out


def test_plans_are_named_by_their_runs_and_a_damaged_one_is_skipped_by_name(tmp_path):
    first = write_plan(tmp_path, ["b", "a"], [1, 0])
    assert write_plan(tmp_path, ["a", "b"], [0, 1]) == first  # the same grid again: same file
    write_plan(tmp_path, ["a", "b", "c"], [0, 1, 2])
    plans = sorted(load_plans(tmp_path), key=lambda p: len(p["runs"]))
    assert plans == [
        {"runs": ["a", "b"], "seeds": [0, 1]},
        {"runs": ["a", "b", "c"], "seeds": [0, 1, 2]},
    ]
    first.write_text('{"runs": ["a"')
    with pytest.warns(UserWarning, match=rf"\.plans/{first.name}: .*skipped"):
        assert load_plans(tmp_path) == [{"runs": ["a", "b", "c"], "seeds": [0, 1, 2]}]


def test_bands_are_a_t_interval_from_three_seeds_and_the_range_below(tmp_path):
    """lrt_results.stats.seeds_interval, the one band rule of the figure and the dashboard,
    against scipy's t quantile by hand; and the scaling curves take it per budget."""
    from scipy import stats as sps

    from lrt_results.scaling import curves
    from lrt_results.stats import seeds_interval

    three = np.array([1.0, 1.2, 1.7])
    mean, lo, hi, kind = seeds_interval(three)
    half = sps.t.ppf(0.975, 2) * three.std(ddof=1) / math.sqrt(3)
    assert kind == "95% t-interval" and (lo, hi) == pytest.approx((mean - half, mean + half))
    assert seeds_interval(three[:2])[1:] == (1.0, 1.2, "min-max")
    assert seeds_interval(three[:1])[1:] == (1.0, 1.0, "none")
    assert seeds_interval(three, t_interval=False)[1:] == (1.0, 1.7, "min-max")
    # a grid with 3 seeds at R = 5 and 2 at R = 10
    build(tmp_path, lambda r, s: 0.0, seeds=(0, 1), lrt_rs=())
    write_run(tmp_path, "transformer", "onepass", 5, 2, bpb_law(5) + 0.3)
    table = curves(scaling_points(load_runs(tmp_path)), "C", "bpb_exact").set_index("R")
    assert table.loc[5, "band"] == "95% t-interval" and table.loc[5, "seeds"] == 3
    assert table.loc[10, "band"] == "min-max"
    at10 = [bpb_law(10), bpb_law(10) + 0.01]
    assert (table.loc[10, "low"], table.loc[10, "high"]) == pytest.approx(tuple(at10))
