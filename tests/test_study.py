"""A study in a sweep spec (lrt_results.study): the [study] table is checked when the spec loads,
its arms against the grid the spec expands to, and `lrt-lab report STORE --study SPEC` computes
each pre-stated contrast over a store fabricated here with known values, checked against exact
permutation p-values and Holm adjustments worked out in the test."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from lrt_results.study import (
    Contrast,
    arm_mask,
    check_arms,
    parse_arm,
    parse_study,
    study_table,
)

QUESTION = "Which trainer learns A5 at length 8, at matched compute?"
STUDY = {
    "question": QUESTION,
    "primary": "ce_exact@8",
    "lower_is_better": True,
    "budget": "matched forward+backward FLOPs",
    "decision": "interleaved:2 replaces the transformer if it is lower, decided after Holm",
    "contrasts": [
        {"a": "transformer", "b": "lrt interleaved:2"},
        {"a": "transformer", "b": "lrt exact", "paired": False},
        {"a": "lrt exact", "b": "lrt interleaved:2", "metric": "ce_exact@8", "paired": True},
    ],
}
# ce_exact@8 per seed of each arm
VALUES = {
    ("transformer", "onepass"): [2.0, 2.2, 1.9, 2.4, 2.1, 2.3, 2.05],
    ("lrt", "interleaved:2"): [1.5, 1.8, 1.6, 1.7, 1.9, 1.75, 1.45, 1.0],  # seed 7: no partner
    ("lrt", "exact"): [2.1, 1.7, 2.6],
}
SPEC = f"""
[sweep]
tasks = ["a5_prefix"]
models = ["transformer", "lrt"]
schedules = ["interleaved:2", "exact"]
seeds = [0, 1, 2, 3, 4, 5, 6, 7]

[train]
length = 8
preset = "tiny"
steps = 100

[study]
question = "{QUESTION}"
primary = "ce_exact@8"
lower_is_better = true
budget = "matched forward+backward FLOPs"
decision = "interleaved:2 replaces the transformer if it is lower, decided after Holm"

[[study.contrasts]]
a = "transformer"
b = "lrt interleaved:2"

[[study.contrasts]]
a = "transformer"
b = "lrt exact"
paired = false

[[study.contrasts]]
a = "lrt exact"
b = "lrt interleaved:2"
metric = "ce_exact@8"
"""


def run_name(kind: str, schedule: str, seed: int, length: int = 8) -> str:
    """TrainConfig.run_name of a run of SPEC's grid."""
    sched = f"-{schedule}" if kind == "lrt" else ""
    return f"a5_prefix-L{length}-tiny-{kind}{sched}-s{seed}".replace(":", "_")


def write_run(root: Path, kind, schedule, seed, value, length=8, status="complete") -> None:
    folder = root / run_name(kind, schedule, seed, length)
    folder.mkdir(parents=True)
    memory = {"gamma_init": 0.1, "source_layer": None} if kind == "lrt" else None
    config = {
        "kind": kind,
        "schedule": schedule,
        "schedule_cost": 1.0,
        "model": {"n_layer": 2, "n_embd": 32, "memory": memory},
        "train": {
            "task": "a5_prefix",
            "length": length,
            "preset": "tiny",
            "model": kind,
            "schedule": schedule,
            "steps": 100,
            "seed": seed,
            "name": None,
            "overrides": {},
            **({"memory_preset": "paper"} if kind == "lrt" else {}),
        },
    }
    summary = {"status": status, "final_loss": value + 0.5, "eval": {"ce_exact@8": value}}
    if status != "complete":
        summary = {"status": status, "step": 10, "loss": math.nan}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def store(tmp_path) -> Path:
    root = tmp_path / "store"
    for (kind, schedule), values in VALUES.items():
        for seed, value in enumerate(values):
            write_run(root, kind, schedule, seed, value)
    write_run(root, "lrt", "exact", 3, 0.0, status="diverged")  # not counted
    write_run(root, "transformer", "onepass", 0, 9.0, length=16)  # not of the grid
    return root


def exact_paired_p(a, b) -> float:
    diff = np.asarray(b) - np.asarray(a)
    flips = itertools.product((1, -1), repeat=len(diff))
    null = [abs(np.mean(np.array(s) * diff)) for s in flips]
    return float(np.mean(np.array(null) >= abs(diff.mean()) - 1e-12))


def exact_unpaired_p(a, b) -> float:
    pooled = np.concatenate([a, b])
    observed = np.mean(b) - np.mean(a)
    null = []
    for idx in itertools.combinations(range(len(pooled)), len(a)):
        mask = np.zeros(len(pooled), bool)
        mask[list(idx)] = True
        null.append(pooled[~mask].mean() - pooled[mask].mean())
    null = np.array(null)
    return min(1.0, 2 * min(np.mean(null >= observed - 1e-12), np.mean(null <= observed + 1e-12)))


def holm_by_hand(p: list[float]) -> list[float]:
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, (len(p) - rank) * p[i])
        out[i] = min(1.0, running)
    return out


# Parsing -----------------------------------------------------------------------------------------
def test_a_study_table_parses_with_its_defaults():
    study = parse_study(STUDY)
    assert study.question == QUESTION and study.lower_is_better is True
    assert study.contrasts[0] == Contrast("transformer", "lrt interleaved:2", "ce_exact@8", True)
    assert study.contrasts[1].paired is False


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hypothesis": "x"}, r"\[study\] \['hypothesis'\]: unknown key; allowed: question"),
        ({"decision": None}, r"\[study\] decision: required"),
        ({"decision": "  "}, r"study.decision='  ' is invalid; allowed: a non-empty string"),
        ({"lower_is_better": "yes"}, r"study.lower_is_better='yes' is invalid; allowed: true"),
        ({"primary": "ce exact"}, r"study.primary='ce exact' is invalid; allowed: a metric key"),
        ({"contrasts": []}, r"study.contrasts=\[\] is invalid; allowed: a non-empty list"),
        ({"contrasts": [{"a": "transformer"}]}, r"study.contrasts\[0\].b: required"),
        (
            {"contrasts": [{"a": "transformer", "b": "lrt exact", "paired": "yes"}]},
            r"study.contrasts\[0\].paired='yes' is invalid; allowed: true",
        ),
        (
            {"contrasts": [{"a": "transformer", "b": "lrt exact", "alpha": 0.1}]},
            r"study.contrasts\[0\] \['alpha'\]: unknown key; allowed: a, b, metric, paired",
        ),
        (
            {"contrasts": [{"a": "lrt exact", "b": "lrt  exact"}]},
            r"study.contrasts\[0\]: a and b are the same arm",
        ),
        (
            {"contrasts": [{"a": "lrt exact | steps", "b": "transformer"}]},
            r"study.contrasts\[0\].a='lrt exact \| steps' is invalid; allowed: a method label",
        ),
        (
            {"contrasts": [{"a": "transformer", "b": "lrt exact"}] * 2},
            r"study.contrasts\[1\] repeats study.contrasts\[0\]",
        ),
    ],
)
def test_a_bad_field_is_one_line_naming_it(change, message):
    table = {k: v for k, v in {**STUDY, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message) as err:
        parse_study(table)
    assert "\n" not in str(err.value)


def test_arms_are_method_labels_narrowed_by_train_fields():
    assert parse_arm("lrt exact | steps=3000 | train.task=a5_prefix") == (
        "lrt exact",
        {"steps": "3000", "task": "a5_prefix"},
    )
    grid = [
        {"kind": "lrt", "schedule": "exact", "train": {"steps": 3000, "overrides": {}}},
        {"kind": "lrt", "schedule": "exact", "train": {"steps": 1500, "overrides": {"n_layer": 4}}},
        {"kind": "transformer", "schedule": "onepass", "train": {"steps": 3000}},
    ]
    from lrt_results.study import grid_frame

    frame = grid_frame(grid)
    assert arm_mask(frame, "lrt exact").tolist() == [True, True, False]
    assert arm_mask(frame, "lrt exact | steps=3000").tolist() == [True, False, False]
    assert arm_mask(frame, "lrt exact | steps=3000.0").tolist() == [True, False, False]
    assert arm_mask(frame, "lrt exact | overrides.n_layer=unset").tolist() == [True, False, False]
    assert arm_mask(frame, "lrt exact | overrides.n_layer=4").tolist() == [False, True, False]
    assert arm_mask(frame, "transformer").tolist() == [False, False, True]


# Against the grid a spec expands to --------------------------------------------------------------
def spec_dict(**study_changes) -> dict:
    from lrt_lab.training.sweep import tomllib  # tomli before Python 3.11

    spec = tomllib.loads(SPEC)
    spec["study"] |= study_changes
    return spec


def test_an_arm_must_match_a_run_of_the_grid():
    from lrt_lab.training.sweep import validate_spec

    assert validate_spec(spec_dict())["study"]["question"] == QUESTION
    bad = spec_dict(contrasts=[{"a": "transformer", "b": "lrt rollout:1"}])
    with pytest.raises(ValueError) as err:
        validate_spec(bad)
    assert str(err.value) == (
        "study.contrasts[0].b='lrt rollout:1' matches no run of the grid; allowed: an arm of the "
        "grid (lrt exact, lrt interleaved:2, transformer), optionally narrowed by ' | FIELD=VALUE'"
    )


def test_an_arm_that_pools_two_configs_of_the_grid_is_refused():
    from lrt_lab.training.sweep import validate_spec

    spec = spec_dict(contrasts=[{"a": "transformer", "b": "lrt interleaved:2"}])
    spec["sweep"]["models"] = ["transformer", "base", "released"]
    spec["models"] = {
        "base": {"model": "lrt", "schedules": ["interleaved:2"]},
        "released": {"model": "lrt", "schedules": ["interleaved:2"], "memory_preset": "released"},
    }
    with pytest.raises(
        ValueError,
        match=r"matches runs of 2 configs of the grid \(they differ in "
        r"memory_preset \(paper, released\)\).*'lrt interleaved:2 \| memory_preset=",
    ):
        validate_spec(spec)
    spec["study"]["contrasts"] = [
        {"a": "transformer", "b": "lrt interleaved:2 | memory_preset=released"}
    ]
    validate_spec(spec)


def test_a_spec_with_a_bad_study_fails_before_anything_runs(tmp_path):
    from lrt_lab.training.sweep import load_spec

    path = tmp_path / "spec.toml"
    path.write_text(SPEC.replace("lower_is_better = true", 'lower_is_better = "yes"'))
    with pytest.raises(ValueError, match="study.lower_is_better='yes' is invalid"):
        load_spec(path)


# The table ---------------------------------------------------------------------------------------
def test_study_table_against_exact_tests_and_holm_by_hand(store):
    study = parse_study(STUDY)
    names = [run_name(kind, sched, seed) for (kind, sched) in VALUES for seed in range(8)]
    table = study_table(store, study, run_names=names).set_index(["a", "b"])
    t = VALUES[("transformer", "onepass")]
    i2 = VALUES[("lrt", "interleaved:2")]
    ex = VALUES[("lrt", "exact")]

    row = table.loc[("transformer", "lrt interleaved:2")]
    assert row["pairs"] == 7  # seed 7 has no transformer run
    assert row["effect"] == pytest.approx(np.mean(np.subtract(i2[:7], t)))
    assert row["mean_a"] == pytest.approx(np.mean(t)) and row["mean_b"] == pytest.approx(
        np.mean(i2[:7])
    )
    p0 = exact_paired_p(t, i2[:7])
    assert p0 == pytest.approx(2 / 2**7)  # every difference negative
    assert row["p"] == pytest.approx(p0)
    assert row["ci_low"] < row["effect"] < row["ci_high"] < 0

    row = table.loc[("transformer", "lrt exact")]
    assert pd_is_na(row["pairs"]) and (row["n_a"], row["n_b"]) == (7, 3)  # diverged seed 3 out
    assert row["effect"] == pytest.approx(np.mean(ex) - np.mean(t))
    p1 = exact_unpaired_p(np.array(t), np.array(ex))
    assert row["p"] == pytest.approx(p1)

    row = table.loc[("lrt exact", "lrt interleaved:2")]
    assert row["pairs"] == 3
    p2 = exact_paired_p(ex, i2[:3])
    assert row["p"] == pytest.approx(p2)
    assert row["effect"] == pytest.approx(np.mean(np.subtract(i2[:3], ex)))

    expected = holm_by_hand([p0, p1, p2])
    assert table["p_holm"].tolist() == pytest.approx(expected)
    assert table["decided"].tolist() == [p <= 0.05 for p in expected]
    assert table["decided"].tolist()[0]  # 3 x 2/128 < 0.05
    notes = table.attrs["notes"]
    assert any("seed(s) 7 only in lrt interleaved:2" in n for n in notes)


def pd_is_na(v) -> bool:
    import pandas as pd

    return v is pd.NA or (isinstance(v, float) and math.isnan(v))


def test_an_arm_pooling_two_configs_of_the_store_is_refused(store):
    study = parse_study(STUDY)
    # without the grid's names, the length-16 transformer joins the arm: two configs
    with pytest.raises(
        ValueError,
        match=r"'transformer' matches runs of 2 configs of the store "
        r"\(they differ in length \(16, 8\)",
    ):
        study_table(store, study)
    narrowed = {**STUDY, "contrasts": [{"a": "transformer | length=8", "b": "lrt exact"}]}
    table = study_table(store, parse_study(narrowed))
    assert table["pairs"].tolist() == [3]


def test_a_metric_no_run_has_is_refused(store):
    study = parse_study({**STUDY, "primary": "ce_exact@99"})
    with pytest.raises(
        ValueError,
        match=r"metric='ce_exact@99' is invalid: no run of the store "
        r"has it; allowed: an evaluation key \(ce_exact@8\)",
    ):
        study_table(store, study)


def test_a_summary_field_is_a_metric_too(store):
    study = parse_study(
        {
            **STUDY,
            "contrasts": [{"a": "lrt exact", "b": "lrt interleaved:2", "metric": "final_loss"}],
        }
    )
    row = study_table(store, study).iloc[0]
    # final_loss = value + 0.5 for every run: the same differences
    assert row["effect"] == pytest.approx(
        np.mean(np.subtract(VALUES[("lrt", "interleaved:2")][:3], VALUES[("lrt", "exact")]))
    )


# The command -------------------------------------------------------------------------------------
def test_report_study_prints_the_study_and_its_verdicts(store, tmp_path, capsys):
    from lrt_lab.commands.cli import main

    spec = tmp_path / "study.toml"
    spec.write_text(SPEC)
    assert main(["report", str(store), "--study", str(spec), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert f"Study: {QUESTION}" in out
    assert "Budget rule: matched forward+backward FLOPs" in out
    assert "Decision rule (stated before the runs): interleaved:2 replaces" in out
    # 7 + 8 + 3 complete runs of the grid's 24; the diverged one and the one off the grid left out
    assert "Runs: 18 of the spec's 24 complete" in out
    t, i2 = VALUES[("transformer", "onepass")], VALUES[("lrt", "interleaved:2")]
    effect = np.mean(np.subtract(i2[:7], t))
    assert (
        f"lrt interleaved:2 vs transformer (ce_exact@8, 7 pairs): B lower than A by "
        f"{abs(effect):.4g} [" in out
    )
    lines = [line for line in out.splitlines() if line.startswith("- ")]
    assert len(lines) == 3
    assert lines[0].endswith("decided at alpha 0.05 after Holm") and "(B better" in lines[0]
    assert "not decided (power" in lines[2] and "pairs needed for power 0.8" in lines[2]
    assert "no permutation test can reach p_holm <= 0.05" in lines[2]  # 3 pairs: p >= 0.25
    assert "seed(s) 7 only in lrt interleaved:2" in out
    header = [line for line in out.splitlines() if "p_holm" in line and "B-A" in line]
    assert header, out


def test_report_study_refuses_what_it_cannot_use(store, tmp_path, capsys):
    from lrt_lab.commands.cli import main

    spec = tmp_path / "study.toml"
    spec.write_text(SPEC)
    assert main(["report", str(store), "--study", str(spec), "--metric", "final_loss"]) == 2
    assert capsys.readouterr().err.startswith("lrt-lab: error: --metric is invalid with --study")
    plain = tmp_path / "plain.toml"
    plain.write_text(SPEC.split("[study]")[0])
    assert main(["report", str(store), "--study", str(plain)]) == 2
    assert "the spec has no [study] table" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text(SPEC.replace('b = "lrt exact"', 'b = "lrt rollout:1"'))
    assert main(["report", str(store), "--study", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "study.contrasts[1].b='lrt rollout:1' matches no run of the grid" in err
    assert err.count("\n") == 1


def test_check_arms_takes_a_runs_table(store):
    from lrt_lab.store.results import load_runs

    runs = load_runs(store)
    check_arms(
        parse_study({**STUDY, "contrasts": [{"a": "lrt exact", "b": "lrt interleaved:2"}]}), runs
    )


def test_runs_of_one_training_config_built_differently_are_not_pooled(store):
    from lrt_lab.store.results import load_runs

    runs = load_runs(store)
    runs = runs[runs["status"] == "complete"].copy()
    older = runs["run"] == run_name("lrt", "exact", 0)
    runs.loc[older, "config.model.n_embd"] = 64  # same [train] fields, another model
    study = parse_study({**STUDY, "contrasts": [{"a": "lrt exact", "b": "lrt interleaved:2"}]})
    with pytest.raises(
        ValueError,
        match=r"differ in config.model.n_embd \(32, 64\)\); allowed: one "
        r"config up to the seed: keep the runs of one build",
    ):
        study_table(runs, study)


def _logrank_by_hand(g1, g2) -> float:
    """Two-sided p of the log-rank test from its textbook sums over the distinct event times."""
    from scipy.stats import norm

    data = [(t, e, 0) for t, e in g1] + [(t, e, 1) for t, e in g2]
    o_minus_e = var = 0.0
    for t in sorted({t for t, e, _ in data if e}):
        at_risk = [(tt, e, g) for tt, e, g in data if tt >= t]
        n, n1 = len(at_risk), sum(1 for *_, g in at_risk if g == 0)
        d = sum(1 for tt, e, _ in at_risk if tt == t and e)
        d1 = sum(1 for tt, e, g in at_risk if tt == t and e and g == 0)
        o_minus_e += d1 - d * n1 / n
        var += d * (n1 / n) * (1 - n1 / n) * (n - d) / max(n - 1, 1)
    return 2 * norm.sf(abs(o_minus_e) / math.sqrt(var))


# step at which pos90_exact@8 first reaches 8 (None: never, censored at the last eval, 50)
REACH = {
    ("transformer", "onepass"): [None, None, 40, None],
    ("lrt", "interleaved:2"): [10, 20, 20, None],
}


def events_store(root: Path) -> Path:
    """The runs of REACH, each with evaluations every 10 steps to 50."""
    for (kind, schedule), steps in REACH.items():
        for seed, step in enumerate(steps):
            write_run(root, kind, schedule, seed, 1.0)
            folder = root / run_name(kind, schedule, seed)
            lines = []
            for s in (10, 20, 30, 40, 50):
                pos = 8 if step is not None and s >= step else 3
                lines.append(json.dumps({"kind": "eval", "step": s, "pos90_exact@8": pos}))
            (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return root


def events_study():
    return parse_study(
        {
            **STUDY,
            "time_to_event": "exact",
            "contrasts": [{"a": "transformer", "b": "lrt interleaved:2"}],
        }
    )


def test_time_to_event_per_arm_and_log_rank_by_hand(tmp_path):
    from lrt_results.study import event_table

    table = dict(STUDY)
    root, study = events_store(tmp_path / "events"), events_study()
    row = event_table(root, study).iloc[0]
    assert row["reached_a"] == "1/4" and row["reached_b"] == "3/4"
    assert math.isnan(row["median_a"])  # only 1 of 4 reached it
    assert row["median_b"] == 20  # survival 3/4 after step 10, 1/4 after step 20
    by_hand = _logrank_by_hand(
        [(50, 0), (50, 0), (40, 1), (50, 0)], [(10, 1), (20, 1), (20, 1), (50, 0)]
    )
    assert row["p_logrank"] == pytest.approx(by_hand, rel=1e-6)
    with pytest.raises(ValueError, match="time_to_event='greedy'"):
        parse_study({**table, "time_to_event": "greedy"})


def test_a_contrast_on_the_parallel_forward_times_the_parallel_forward(tmp_path):
    """A contrast whose metric scores the parallel forward gets its event row from
    pos90_parallel, not from the study's exact decoding (which would repeat the exact row)."""
    from lrt_results.study import event_table

    root = events_store(tmp_path / "events")
    # the parallel forward reaches 8 at step 30 in every LRT run and never in a transformer run
    for seed in range(4):
        path = root / run_name("lrt", "interleaved:2", seed) / "metrics.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for r in records:
            r["pos90_parallel@8"] = 8 if r["step"] >= 30 else 2
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    for seed in range(4):
        path = root / run_name("transformer", "onepass", seed) / "metrics.jsonl"
        records = [
            {**json.loads(line), "pos90_parallel@8": 3} for line in path.read_text().splitlines()
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    study = parse_study(
        {
            **STUDY,
            "time_to_event": "exact",
            "contrasts": [
                {"a": "transformer", "b": "lrt interleaved:2"},
                {"a": "transformer", "b": "lrt interleaved:2", "metric": "ce_parallel@8"},
            ],
        }
    )
    exact, parallel = (row for _, row in event_table(root, study).iterrows())
    assert (exact["decoding"], exact["reached_b"], exact["median_b"]) == ("exact", "3/4", 20)
    assert (parallel["decoding"], parallel["reached_a"]) == ("parallel", "0/4")
    assert (parallel["reached_b"], parallel["median_b"]) == ("4/4", 30)
    by_hand = _logrank_by_hand([(50, 0)] * 4, [(30, 1)] * 4)
    assert parallel["p_logrank"] == pytest.approx(by_hand, rel=1e-6)


def test_kaplan_meier_curves_per_arm_by_hand_and_drawn(tmp_path):
    """The share of seeds that have learned, by step: the product-limit estimate by hand."""
    from lrt_results.time_to_event import plot_time_to_event, reach_curves

    root, study = events_store(tmp_path / "events"), events_study()
    curves = reach_curves(root, study)
    assert list(dict.fromkeys(curves["arm"])) == ["transformer", "lrt interleaved:2"]
    lrt = curves[curves["arm"] == "lrt interleaved:2"].set_index("time")["reached"]
    # 4 at risk: one learns at 10 (S = 3/4), two of the 3 left at 20 (S = 3/4 * 1/3), one censored
    assert lrt.to_dict() == pytest.approx({0: 0, 10: 0.25, 20: 0.75, 50: 0.75})
    tf = curves[curves["arm"] == "transformer"].set_index("time")["reached"]
    assert tf.to_dict() == pytest.approx({0: 0, 40: 0.25, 50: 0.25})
    assert (curves["low"] <= curves["reached"] + 1e-12).all()
    assert (curves["reached"] <= curves["high"] + 1e-12).all()
    assert set(curves["runs"]) == {4}
    png = plot_time_to_event(root, study, tmp_path / "km.png")
    assert png.stat().st_size > 5_000
    # a grid with no runs yet draws nothing
    assert plot_time_to_event(tmp_path / "empty", study, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_report_study_draws_the_kaplan_meier_figure_when_the_study_times_an_event(tmp_path, capsys):
    from lrt_lab.commands.cli import main

    root = events_store(tmp_path / "events")
    spec = tmp_path / "timed.toml"
    spec.write_text(SPEC.replace('decision = "', 'time_to_event = "exact"\ndecision = "', 1))
    assert main(["report", str(root), "--study", str(spec), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "Kaplan-Meier median" in out
    events = out[out.index("Time until pos@90") :].splitlines()
    (row,) = [line.split() for line in events if line.startswith("transformer lrt interleaved")]
    assert row[3:8] == ["exact", "1/4", "3/4", "-", "20"]  # decoding; reached A, B; median A, B
    figure = tmp_path / "out" / "time_to_event_timed.png"
    assert f"figure (Kaplan-Meier, share of seeds that reached the length): {figure}" in out
    assert figure.stat().st_size > 5_000
    # a study without a timed event draws none
    spec.write_text(SPEC)
    assert main(["report", str(root), "--study", str(spec), "--out", str(tmp_path / "out")]) == 0
    assert "figure" not in capsys.readouterr().out


def test_the_tables_render_as_markdown_for_a_page(store, tmp_path):
    """docs/results.md embeds the study as markdown: the same cells as the terminal's table."""
    from lrt_results.study import event_table, format_event_table, format_study_table

    names = [run_name(kind, sched, seed) for (kind, sched) in VALUES for seed in range(8)]
    table = study_table(store, parse_study(STUDY), run_names=names)
    md = format_study_table(table, "md").splitlines()
    text = format_study_table(table).splitlines()
    assert md[0].startswith("| A | B | metric | pairing |") and md[1].startswith("|---|")
    assert len(md) == 2 + len(STUDY["contrasts"]) == 1 + len(text)
    for md_row, text_row in zip(md[2:], text[1:]):  # the same cells, in the same order
        at = 0
        for cell in (c.strip() for c in md_row.strip().strip("|").split("|")):
            at = text_row.index(cell, at) + len(cell)
    events = event_table(events_store(tmp_path / "events"), events_study())
    assert (
        format_event_table(events, "md")
        .splitlines()[2]
        .startswith("| transformer | lrt interleaved:2 | exact | 1/4 | 3/4 | - | 20 |")
    )
    with pytest.raises(ValueError, match="fmt='html' is invalid"):
        format_study_table(table, "html")


# ce_exact@8 of each run at step 30 (its final summary says otherwise: VALUES)
AT_30 = {
    ("transformer", "onepass"): [3.0, 3.4, 2.9, 3.1],
    ("lrt", "interleaved:2"): [2.5, 2.6, 3.3, 2.2],
}


def test_equal_step_reads_every_contrast_again_at_that_evaluation(tmp_path):
    """study_table(step=N) takes each run's metric from its evaluation at step N, not from its
    final summary: the paired effect and its exact permutation p, by hand."""
    root = tmp_path / "steps"
    for (kind, schedule), values in AT_30.items():
        for seed, value in enumerate(values):
            write_run(root, kind, schedule, seed, VALUES[kind, schedule][seed])
            lines = [
                {"kind": "eval", "step": 10, "ce_exact@8": 9.0},
                {"kind": "train", "step": 30, "ce_exact@8": -1.0},  # not an evaluation
                {"kind": "eval", "step": 30, "ce_exact@8": value},
            ]
            text = "\n".join(json.dumps(r) for r in lines) + "\n"
            (root / run_name(kind, schedule, seed) / "metrics.jsonl").write_text(text)
    study = parse_study({**STUDY, "equal_step": 30, "contrasts": STUDY["contrasts"][:1]})
    assert study.equal_step == 30
    a, b = AT_30["transformer", "onepass"], AT_30["lrt", "interleaved:2"]
    row = study_table(root, study, step=30).iloc[0]
    assert row["effect"] == pytest.approx(np.mean(np.subtract(b, a)))
    assert row["p"] == pytest.approx(exact_paired_p(a, b))
    final = study_table(root, study).iloc[0]  # the summaries' values, for contrast
    fa, fb = VALUES["transformer", "onepass"][:4], VALUES["lrt", "interleaved:2"][:4]
    assert final["effect"] == pytest.approx(np.mean(np.subtract(fb, fa)))
    # a step some run never evaluated leaves that run out, with a note naming the step
    missing = study_table(root, study, step=20)
    assert missing.iloc[0]["n_a"] == 0
    assert any("at step 20" in n for n in missing.attrs["notes"])
    # the report prints the matched-step table after the final one
    from lrt_results.study import study_lines

    text = "\n".join(study_lines(root, study, study_table(root, study)))
    assert "at matched steps: every run's evaluation at step 30" in text
    assert f"{np.mean(np.subtract(b, a)):.4g}".lstrip("-") in text.split("matched steps")[1]


@pytest.mark.parametrize(
    "step, ok",
    [(50, True), (100, True), (30, False), (150, False)],  # eval_every 25, steps 100
)
def test_equal_step_must_be_a_step_every_arm_evaluates(step, ok):
    spec = spec_dict(equal_step=step)
    spec["train"]["eval_every"] = 25
    study = parse_study(spec["study"])
    from lrt_lab.training.sweep import expand

    grid = [{"train": c.to_dict(), "kind": c.model, "schedule": c.schedule} for c in expand(spec)]
    if ok:
        check_arms(study, grid)
    else:
        with pytest.raises(ValueError, match=f"study.equal_step={step} is invalid"):
            check_arms(study, grid)
    with pytest.raises(ValueError, match="study.equal_step=0 is invalid"):
        parse_study({**STUDY, "equal_step": 0})


def test_only_a_run_that_reached_a_level_can_have_regressed():
    from lrt_results.study import reached_level

    # exact cross-entropy 3.62 -> best 2.82 -> 6.3: never learned (not half way to 0)
    assert not reached_level("ce_exact@16", [3.62, 2.82, 4.1, 6.3])
    # 3.6 -> 0.01 -> 3.8: learned, then lost it
    assert reached_level("ce_exact@16", [3.6, 0.01, 3.8])
    # pos@90 at 16: 2 -> 4 is not half way to 16; 2 -> 16 is
    assert not reached_level("pos90_exact@16", [2, 4, 2])
    assert reached_level("summary.eval.pos90_exact@16", [2, 16, 1])
    assert not reached_level("lyap", [0.1, -0.2])  # no better side
