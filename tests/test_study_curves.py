"""A study's learning curves (lrt_results.study_curves): per arm and metric its contrasts
read, the seed mean and band at every evaluation, checked against sums worked out here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from lrt_results.study import parse_study
from tests.test_study import STUDY, run_name, write_run

# ce_exact@8 at steps 10, 20, 30 per seed (None: that evaluation is missing)
EXACT = {
    ("transformer", "onepass"): [[3.0, 2.0, 1.0], [3.2, 2.4, 1.2], [2.8, 2.2, None]],
    ("lrt", "interleaved:2"): [[2.0, 1.0, 0.5], [2.4, 1.4, 0.7]],
}
FLOPS_PER_STEP = {("transformer", "onepass"): 1.0, ("lrt", "interleaved:2"): 2.0}


def curves_store(root: Path) -> Path:
    for (kind, schedule), seeds in EXACT.items():
        for seed, values in enumerate(seeds):
            write_run(root, kind, schedule, seed, 1.0)
            lines = []
            for step, value in zip((10, 20, 30), values):
                if value is None:
                    continue
                # the LRT's parallel forward reads 0.1 above its exact decoding; the
                # transformer's is its exact decoding
                gap = 0.1 if kind == "lrt" else 0.0
                flops = step * FLOPS_PER_STEP[kind, schedule] * (1 + 0.1 * seed)
                record = {"kind": "eval", "step": step, "flops": flops, "ce_exact@8": value}
                lines.append(json.dumps({**record, "ce_parallel@8": value + gap}))
            (root / run_name(kind, schedule, seed) / "metrics.jsonl").write_text(
                "\n".join(lines) + "\n"
            )
    return root


def curves_study():
    contrasts = [
        {"a": "transformer", "b": "lrt interleaved:2"},
        {"a": "transformer", "b": "lrt interleaved:2", "metric": "ce_parallel@8"},
    ]
    return parse_study({**STUDY, "time_axis": "flops", "contrasts": contrasts})


def test_learning_curves_are_seed_means_and_bands_by_hand(tmp_path):
    from lrt_results.study_curves import learning_curves

    curves = learning_curves(curves_store(tmp_path / "s"), curves_study())
    got = {(r.arm, r.metric, r.step): r for r in curves.itertuples()}
    # the transformer's parallel curve is its exact one: drawn once
    assert {(a, m) for a, m, _ in got} == {
        ("transformer", "ce_exact@8"),
        ("lrt interleaved:2", "ce_exact@8"),
        ("lrt interleaved:2", "ce_parallel@8"),
    }
    # step 30 is missing from one transformer seed: left out, not averaged over two
    assert sorted(s for a, m, s in got if a == "transformer") == [10, 20]
    tf = got["transformer", "ce_exact@8", 20]
    values = np.array([2.0, 2.4, 2.2])
    half = stats.t.ppf(0.975, 2) * values.std(ddof=1) / np.sqrt(3)
    assert (tf.mean, tf.low, tf.high) == pytest.approx((2.2, 2.2 - half, 2.2 + half))
    assert tf.band == "95% t-interval" and tf.seeds == 3
    assert tf.x == pytest.approx(20 * (1.0 + 1.1 + 1.2) / 3)  # mean FLOPs of the seeds
    lrt = got["lrt interleaved:2", "ce_parallel@8", 30]  # 2 seeds: their range
    assert (lrt.mean, lrt.low, lrt.high, lrt.band) == pytest.approx((0.7, 0.6, 0.8, "min-max"))


def test_learning_curves_are_drawn_and_the_report_names_the_figure(tmp_path, capsys):
    from lrt_lab.commands.cli import main
    from lrt_results.study_curves import plot_learning_curves
    from tests.test_study import SPEC

    root = curves_store(tmp_path / "s")
    png = plot_learning_curves(root, curves_study(), tmp_path / "curves.png")
    assert png.stat().st_size > 5_000
    assert plot_learning_curves(tmp_path / "empty", curves_study(), tmp_path / "no.png") is None
    assert not (tmp_path / "no.png").exists()

    spec = tmp_path / "curved.toml"
    spec.write_text(SPEC)
    assert main(["report", str(root), "--study", str(spec), "--out", str(tmp_path / "out")]) == 0
    figure = tmp_path / "out" / "curves_curved.png"
    assert f"figure (learning curves, each arm's seed mean): {figure}" in capsys.readouterr().out
    assert figure.stat().st_size > 5_000


def set_eval_every(root: Path, every: dict) -> None:
    """Each run's train.eval_every: every[(kind, schedule)] lists them by seed."""
    for (kind, schedule), per_seed in every.items():
        for seed, n in enumerate(per_seed):
            path = root / run_name(kind, schedule, seed) / "config.json"
            config = json.loads(path.read_text())
            config["train"]["eval_every"] = n
            path.write_text(json.dumps(config))


def test_the_last_interval_table_says_which_arms_were_still_improving(tmp_path):
    """Per arm and metric: the mean final value, the mean change over each run's last evaluation
    interval (measured back from its end by its eval_every, so a final evaluation off the grid
    does not make a short interval) and the runs still improving, worked out here."""
    from lrt_results.study import last_interval_table

    root = curves_store(tmp_path / "s")
    set_eval_every(
        root, {("transformer", "onepass"): [10, 10, 10], ("lrt", "interleaved:2"): [10, 15]}
    )
    # the transformer's seed 0 got worse over its last interval: 2.0 -> 2.5
    lines = [
        json.dumps({"kind": "eval", "step": s, "flops": s, "ce_exact@8": v, "ce_parallel@8": v})
        for s, v in ((10, 3.0), (20, 2.0), (30, 2.5))
    ]
    (root / run_name("transformer", "onepass", 0) / "metrics.jsonl").write_text(
        "\n".join(lines) + "\n"
    )
    table = last_interval_table(root, curves_study())
    got = {(r.arm, r.metric): r for r in table.itertuples()}
    tf = got["transformer", "ce_exact@8"]
    # finals 2.5, 1.2, 2.2 (seed 2 ends at step 20); changes +0.5, -1.2, -0.6
    assert (tf.runs, tf.final, tf.change) == (3, pytest.approx(5.9 / 3), pytest.approx(-1.3 / 3))
    assert (tf.steps, tf.improving) == ("10", "2/3")
    # its parallel forward is its exact decoding here: that row is left out
    assert ("transformer", "ce_parallel@8") not in got
    lrt = got["lrt interleaved:2", "ce_parallel@8"]
    # seed 1 evaluates every 15: its interval runs from step 10 (<= 30 - 15) to 30, 2.5 -> 0.8
    assert (lrt.final, lrt.change) == (pytest.approx(0.7), pytest.approx((-0.5 - 1.7) / 2))
    assert (lrt.steps, lrt.improving) == ("10/20", "2/2")
    # best values: transformer 2.0, 1.2, 2.2; seed 0 gained 1.0 (3.0 -> 2.0) and lost 0.5 of it,
    # not more than half: no run regressed
    assert (tf.best, tf.regressed) == (pytest.approx(5.4 / 3), "0/3")
    assert (lrt.best, lrt.regressed) == (pytest.approx(0.7), "0/2")


def test_the_last_interval_table_counts_runs_that_regressed(tmp_path):
    """A run that reached a real level (its best at least half way from its first evaluation to
    the metric's best possible value) and lost more than half of what it gained regressed (a
    collapse); one that never beat its first evaluation and ended worse did not (it never learned),
    nor one whose best was not half way there. Higher-is-better metrics count the other way
    round."""
    from lrt_results.study import last_interval_table

    root = curves_store(tmp_path / "s")
    set_eval_every(root, {("transformer", "onepass"): [10, 10, 10]})
    # the transformer's seeds: collapsed (3.0 -> 1.0, past half way to 0; lost 1.5), never
    # improved (lost 0.4), gained 1.0 of the 3.0 to 0 (not half way) and lost half of it
    for seed, values in enumerate([(3.0, 1.0, 2.5), (2.0, 2.4, 2.4), (3.0, 2.0, 2.5)]):
        lines = [
            json.dumps({"kind": "eval", "step": st, "flops": st, "ce_exact@8": v})
            for st, v in zip((10, 20, 30), values)
        ]
        (root / run_name("transformer", "onepass", seed) / "metrics.jsonl").write_text(
            "\n".join(lines) + "\n"
        )
    table = last_interval_table(root, curves_study()).set_index(["arm", "metric"])
    tf = table.loc[("transformer", "ce_exact@8")]
    assert (tf["best"], tf["regressed"]) == (pytest.approx((1.0 + 2.0 + 2.0) / 3), "1/3")
    # higher is better: the same values read as a score; the first and third runs never beat 3.0
    contrasts = [{"a": "transformer", "b": "lrt interleaved:2"}]
    scores = parse_study({**STUDY, "lower_is_better": False, "contrasts": contrasts})
    table = last_interval_table(root, scores).set_index(["arm", "metric"])
    tf = table.loc[("transformer", "ce_exact@8")]
    # bests 3.0, 2.4, 3.0: the first and third never beat their first evaluation (never learned),
    # the second gained 0.4 and lost none: none regressed
    assert (tf["best"], tf["regressed"]) == (pytest.approx(8.4 / 3), "0/3")
