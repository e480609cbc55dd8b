"""The Compare view: methods named by what differs, one row per method, the most recent study first.

Unit checks of lrt_results.report's method_labels on generated runs tables, then a store written
file by
file into tmp_path (config.json and summary.json, no training) whose figures the test knows: the
row table's means, intervals and per-seed values are checked against values computed here, and the
dashboard must open on that store's most recent study with the table and the frontier scatter.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from lrt_lab.store.results import load_runs
from lrt_results.report import compare_table, method_keys, method_labels, studies_by_recency

SCHEDULES = ["exact", "interleaved:2", "rollout:1", "rollout:2", "fullseq:3", "fixedpoint:0.1:8"]
PRESETS = ["tiny", "small", "medium"]


def runs_table(*rows: dict) -> pd.DataFrame:
    """A load_runs-like table: an LRT of the tiny preset unless a row says otherwise."""
    base = {
        "config.kind": "lrt",
        "config.schedule": "exact",
        "config.train.task": "a5_prefix",
        "config.train.length": 8,
        "config.train.preset": "tiny",
        "config.train.memory_preset": "paper",
        "config.train.steps": 100,
        "config.train.seed": 0,
        "config.train.name": None,
        "config.model.n_layer": 2,
        "config.model.memory.gamma_init": 0.1,
        "config.params.total": 100,
    }
    out = pd.DataFrame([{**base, **r} for r in rows])
    out["run"] = [f"r{i}" for i in range(len(out))]
    return out


def lrt(schedule: str, seed: int = 0, **fields) -> dict:
    return {
        "config.schedule": schedule,
        "config.train.schedule": schedule,
        "config.train.seed": seed,
        **fields,
    }


# Labels
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_schedules, seeds", itertools.product([2, 3, 6], [(0,), (0, 1, 2)]))
def test_only_the_schedule_varies_labels_are_model_and_schedule(n_schedules, seeds):
    schedules = SCHEDULES[:n_schedules]
    df = runs_table(
        *[lrt(s, seed) for s in schedules for seed in seeds],
        *[
            {
                "config.kind": "transformer",
                "config.schedule": "onepass",
                "config.train.seed": seed,
                "config.model.memory.gamma_init": np.nan,
                "config.train.memory_preset": np.nan,
            }
            for seed in seeds
        ],
    )
    labels = method_labels(df)
    assert list(labels) == [f"lrt {s}" for s in schedules for _ in seeds] + ["transformer"] * len(
        seeds
    )


@pytest.mark.parametrize("draw", range(12))
def test_a_preset_that_varies_appears_where_a_method_departs_from_it(draw):
    rng = random.Random(draw)
    methods = rng.sample(list(itertools.product(SCHEDULES, PRESETS)), rng.randint(2, 8))
    df = runs_table(
        *[lrt(s, seed, **{"config.train.preset": p}) for s, p in methods for seed in (0, 1)]
    )
    labels = method_labels(df)
    by_method = {(s, p): labels[i] for i, (s, p) in enumerate(m for m in methods for _ in (0, 1))}
    assert len(set(by_method.values())) == len(methods)  # one label per method, the seeds share it
    # the preset is named where a method departs from the preset most methods share (on a tie, every
    # method names its own), also where the schedule alone would tell the methods apart
    counts = pd.Series([p for _, p in methods]).value_counts()
    reference = counts.index[0] if len(counts) == 1 or counts.iloc[0] > counts.iloc[1] else None
    for (s, p), label in by_method.items():
        assert label == f"lrt {s}" + (f" | preset={p}" if p != reference else ""), methods


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_runs_that_differ_only_by_seed_are_one_method(schedule):
    df = runs_table(
        *[lrt(schedule, seed, **{"config.train.name": f"run-{seed}"}) for seed in range(4)]
    )
    assert set(method_labels(df)) == {f"lrt {schedule}"}
    assert method_keys(df).nunique() == 1


def test_fields_a_run_predates_keep_it_a_seed_of_its_method():
    """A model field added later (memory.update) is missing from older runs: still one method. A
    memory preset missing from an LRT run from before presets reads as "paper"."""
    df = runs_table(
        lrt(
            "exact",
            0,
            **{"config.model.memory.update": np.nan, "config.train.memory_preset": np.nan},
        ),
        lrt("exact", 1, **{"config.model.memory.update": "overwrite"}),
        lrt("exact", 2, **{"config.model.memory.update": "overwrite"}),
    )
    assert set(method_labels(df)) == {"lrt exact"}


def test_options_name_only_the_methods_that_depart_from_the_default():
    df = runs_table(
        lrt("rollout:1", 0),
        lrt("rollout:1", 1),
        lrt("rollout:1", 0, **{"config.train.task_options.supervise_every": 2}),
        lrt("interleaved:2", 0),
        lrt("interleaved:2", 0, **{"config.train.steps": 300}),
        lrt(
            "interleaved:2",
            0,
            **{
                "config.train.overrides.memory.source_layer": 2,
                "config.model.memory.source_layer": 2,
            },
        ),
        {
            "config.kind": "transformer",
            "config.schedule": "onepass",
            "config.train.steps": 300,
            "config.train.memory_preset": np.nan,
            "config.model.memory.gamma_init": np.nan,
        },
    )
    assert list(method_labels(df)) == [
        "lrt rollout:1",
        "lrt rollout:1",
        "lrt rollout:1 | supervise_every=2",
        "lrt interleaved:2",
        "lrt interleaved:2 | steps=300",
        "lrt interleaved:2 | memory.source_layer=2",
        "transformer | steps=300",
    ]


def test_methods_only_the_model_config_tells_apart_are_spelled_out():
    df = runs_table(lrt("exact", 0), lrt("exact", 0, **{"config.model.memory.gamma_init": 0.5}))
    labels = method_labels(df)
    assert labels.nunique() == 2 and "gamma_init=0.5" in labels[1]


# A store written file by file
# -----------------------------------------------------------------------
L = 8
# (kind, schedule, preset, task options as pairs) -> {seed: (exact pos@90 at 1x, 2x, 4x; parallel at
# 1x, 2x, 4x; exact accuracy; compute tokens; wall seconds)}
EVERY_2 = (("supervise_every", 2),)
METHODS = {
    ("transformer", "onepass", "tiny", ()): {
        0: (3, 3, 3, 4, 4, 4, 0.4, 2e6, 60),
        1: (5, 5, 5, 5, 5, 5, 0.5, 2e6, 66),
        2: (4, 4, 4, 6, 6, 6, 0.45, 2e6, 63),
    },
    ("lrt", "rollout:1", "tiny", ()): {
        0: (8, 16, 32, 8, 16, 32, 0.99, 3e6, 90),
        1: (4, 4, 4, 2, 2, 2, 0.7, 3e6, 96),
        2: (8, 9, 9, 8, 9, 9, 0.9, 3e6, 93),
    },
    ("lrt", "rollout:1", "tiny", EVERY_2): {0: (3, 3, 3, 3, 3, 3, 0.2, 3e6, 80)},
    ("lrt", "exact", "small", ()): {
        1: (6, 7, 8, 1, 1, 1, 0.8, 5e6, 200),  # seeds written out of order
        0: (7, 7, 7, 1, 1, 1, 0.85, 5e6, 210),
    },
}
LABELS = {
    ("transformer", "onepass", "tiny", ()): "transformer",
    ("lrt", "rollout:1", "tiny", ()): "lrt rollout:1",
    ("lrt", "rollout:1", "tiny", EVERY_2): "lrt rollout:1 | supervise_every=2",
    ("lrt", "exact", "small", ()): "lrt exact | preset=small",
}
SCALE = {"compute": 1e6, "wall_min": 60}  # the table's units: M token-forwards, minutes


def write_run(
    root: Path,
    kind: str,
    schedule: str,
    preset: str,
    options: dict,
    seed: int,
    figures: tuple,
    length: int = L,
    task: str = "a5_prefix",
    finished: float | None = 1.0e9,
) -> Path:
    name = f"{task}-L{length}-{preset}-{kind}-{schedule.replace(':', '_')}-{len(options)}-s{seed}"
    folder = root / name
    folder.mkdir(parents=True)
    memory = (
        {"gamma_init": 0.1, "source_layer": None, "update": "overwrite"} if kind == "lrt" else None
    )
    config = {
        "kind": kind,
        "schedule": schedule,
        "schedule_cost": 1.0,
        "forwards_per_token": 1,
        "task_vocab_size": 60,
        "params": {"total": 1000},
        "model": {"n_layer": 2, "n_embd": 32, "sequence_len": length, "memory": memory},
        "train": {
            "task": task,
            "task_options": options,
            "length": length,
            "preset": preset,
            "model": kind,
            "schedule": schedule,
            "steps": 100,
            "seed": seed,
            "name": name,
            "overrides": {},
            **({"memory_preset": "paper"} if kind == "lrt" else {}),
            "eval_lengths": [length, 2 * length, 4 * length],
        },
    }
    lengths = (length, 2 * length, 4 * length)
    ev = {f"pos90_exact@{n}": v for n, v in zip(lengths, figures[:3])}
    ev |= {f"pos90_parallel@{n}": v for n, v in zip(lengths, figures[3:6])}
    ev |= {f"acc_exact@{length}": figures[6], f"acc_parallel@{length}": figures[6]}
    summary = {
        "status": "complete",
        "steps": 100,
        "final_loss": 1.0,
        "wall_time_s": figures[8],
        "tokens": 1000,
        "compute_tokens": figures[7],
        "schedule_cost": 1.0,
        "forwards_per_token": 1,
        "eval": ev,
    }
    if finished is not None:
        summary["trained_by"] = {"host": "h", "pid": 1, "finished": finished}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def write_store(root: Path) -> Path:
    """The METHODS study at length 8 (finished last), and an older study at length 16."""
    for (kind, schedule, preset, options), seeds in METHODS.items():
        for seed, figures in seeds.items():
            write_run(
                root, kind, schedule, preset, dict(options), seed, figures, finished=2.0e9 + seed
            )
    write_run(
        root, "lrt", "exact", "tiny", {}, 0, (9,) * 6 + (0.9, 1e6, 10), length=16, finished=1.5e9
    )
    return root


def t_interval(values: list[float]) -> tuple[float, float]:
    mean, sem = statistics.mean(values), statistics.stdev(values) / math.sqrt(len(values))
    half = sps.t.ppf(0.975, len(values) - 1) * sem
    return mean - half, mean + half


def test_compare_table_rows_from_the_files(tmp_path):
    table = compare_table(load_runs(write_store(tmp_path)), "a5_prefix", L)
    assert sorted(table["method"]) == sorted(LABELS.values())
    rows = table.set_index("method")
    figures = [f"pos90_{mode}@{n}" for mode in ("exact", "parallel") for n in (L, 2 * L, 4 * L)]
    figures += [f"acc_exact@{L}", "compute", "wall_min"]
    for (kind, schedule, preset, options), seeds in METHODS.items():
        row = rows.loc[LABELS[(kind, schedule, preset, options)]]
        ordered = [seeds[s] for s in sorted(seeds)]
        assert row["seeds"] == tuple(sorted(seeds)) and row["n"] == len(seeds)
        for i, figure in enumerate(figures):
            values = [f[i] / SCALE.get(figure, 1) for f in ordered]
            assert row[f"{figure}.per_seed"] == pytest.approx(tuple(values)), figure
            assert row[f"{figure}.mean"] == pytest.approx(statistics.mean(values)), figure
            if len(values) == 1:
                assert math.isnan(row[f"{figure}.ci_low"]) and math.isnan(row[f"{figure}.ci_high"])
            else:
                interval = (row[f"{figure}.ci_low"], row[f"{figure}.ci_high"])
                assert interval == pytest.approx(t_interval(values)), figure
    assert list(table["compute.mean"]) == sorted(table["compute.mean"])  # cheapest first


def test_the_most_recent_study_comes_first(tmp_path):
    df = load_runs(write_store(tmp_path))
    assert studies_by_recency(df) == [("a5_prefix", L), ("a5_prefix", 16)]
    # a recorded finish time outranks a file's modification time (a checkout gives every file a new
    # one)
    old = write_run(
        tmp_path,
        "transformer",
        "onepass",
        "tiny",
        {},
        0,
        (1,) * 6 + (0.1, 1e6, 1),
        length=32,
        finished=None,
    )
    assert studies_by_recency(load_runs(tmp_path))[-1] == ("a5_prefix", 32)
    # where no run records one, the modification times order the studies
    bare = tmp_path / "bare"
    for length, mtime in ((4, 2_000_000_000), (32, 1_000_000_000)):
        folder = write_run(
            bare,
            "transformer",
            "onepass",
            "tiny",
            {},
            0,
            (1,) * 6 + (0.1, 1e6, 1),
            length=length,
            finished=None,
        )
        os.utime(folder / "summary.json", (mtime, mtime))
    assert studies_by_recency(load_runs(bare)) == [("a5_prefix", 4), ("a5_prefix", 32)]
    assert old.exists()


def test_the_dashboard_opens_on_the_compare_view(tmp_path, monkeypatch):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    store = write_store(tmp_path / "store")
    monkeypatch.setenv("LRT_RUNS", str(store))
    monkeypatch.setattr(sys, "argv", ["streamlit_app.py"])
    app = Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py"
    at = AppTest.from_file(str(app), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    compare = at.tabs[0]
    assert compare.label == "Compare"
    assert not compare.error, [e.value for e in compare.error]
    assert compare.selectbox(key="compare_study").value == ("a5_prefix", L)
    shown = compare.dataframe[0].value.set_index("method")
    assert sorted(shown.index) == sorted(LABELS.values())
    # lrt rollout:1 at 4x: seeds 32, 4, 9 -> mean 15, listed in seed order after the interval
    lo, hi = t_interval([32, 4, 9])
    cell = shown.loc["lrt rollout:1", f"exact pos@90 at {4 * L} (4x)"]
    assert cell == f"15 [{lo:.3g}, {hi:.3g}] · 32, 4, 9"
    assert shown.loc["lrt rollout:1 | supervise_every=2", "seeds"] == "0"
    assert len([e for e in compare if getattr(e, "type", "") == "vega_lite_chart"]) == 1
    compare.selectbox(key="compare_study").set_value(("a5_prefix", 16))
    compare.radio(key="compare_x").set_value("wall clock")
    at.run()
    assert not at.exception and not at.tabs[0].error
    assert list(at.tabs[0].dataframe[0].value["method"]) == ["lrt exact"]


COMMITTED_STORE = Path(__file__).resolve().parent.parent / "experiments" / "results"


def test_the_committed_store_compares_its_latest_study_in_short_labels():
    """The A5 study at length 16 finished last; each of its methods reads in a few words, and the
    seeds of fixedpoint:0.01:16 (one trained before memory.update existed) are one method."""
    if not (COMMITTED_STORE / "README.md").exists():
        pytest.skip(f"no committed run store at {COMMITTED_STORE}")
    df = load_runs(COMMITTED_STORE)
    task, length = studies_by_recency(df)[0]
    assert (task, length) == ("a5_prefix", 16)
    table = compare_table(df, task, length)
    rows = table.set_index("method")
    assert {"lrt rollout:1", "lrt rollout:2", "lrt fixedpoint:0.01:16"} <= set(rows.index)
    assert rows.loc["lrt fixedpoint:0.01:16", "seeds"] == (0, 1, 2)
    # the trainer study's recipe (its own curriculum, warm-down, steps and rate) is named in full
    assert max(map(len, table["method"])) <= 100, list(table["method"])
    in_study = (df["config.train.task"] == task) & (df["config.train.length"] == length)
    assert rows["n"].sum() == in_study.sum()  # every run of the study is in one row
