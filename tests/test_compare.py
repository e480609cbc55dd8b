"""Comparing the methods of a study: methods named by what differs between them.

Unit checks of lrt_lab.report's method_labels on generated runs tables.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pandas as pd
import pytest

from lrt_lab.report import method_keys, method_labels

SCHEDULES = ["exact", "interleaved:2", "rollout:1", "rollout:2", "fullseq:3", "fixedpoint:0.1:8"]
PRESETS = ["tiny", "small", "medium"]


def runs_table(*rows: dict) -> pd.DataFrame:
    """A load_runs-like table: an LRT of the tiny preset unless a row says otherwise."""
    base = {"config.kind": "lrt", "config.schedule": "exact", "config.train.task": "a5_prefix",
            "config.train.length": 8, "config.train.preset": "tiny", "config.train.memory_preset": "paper",
            "config.train.steps": 100, "config.train.seed": 0, "config.train.name": None,
            "config.model.n_layer": 2, "config.model.memory.gamma_init": 0.1, "config.params.total": 100}
    out = pd.DataFrame([{**base, **r} for r in rows])
    out["run"] = [f"r{i}" for i in range(len(out))]
    return out


def lrt(schedule: str, seed: int = 0, **fields) -> dict:
    return {"config.schedule": schedule, "config.train.schedule": schedule, "config.train.seed": seed,
            **fields}


# Labels ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_schedules, seeds", itertools.product([2, 3, 6], [(0,), (0, 1, 2)]))
def test_only_the_schedule_varies_labels_are_model_and_schedule(n_schedules, seeds):
    schedules = SCHEDULES[:n_schedules]
    df = runs_table(*[lrt(s, seed) for s in schedules for seed in seeds],
                    *[{"config.kind": "transformer", "config.schedule": "onepass", "config.train.seed": seed,
                       "config.model.memory.gamma_init": np.nan, "config.train.memory_preset": np.nan}
                      for seed in seeds])
    labels = method_labels(df)
    assert list(labels) == [f"lrt {s}" for s in schedules for _ in seeds] + ["transformer"] * len(seeds)


@pytest.mark.parametrize("draw", range(12))
def test_a_preset_that_varies_appears_where_a_method_departs_from_it(draw):
    rng = random.Random(draw)
    methods = rng.sample(list(itertools.product(SCHEDULES, PRESETS)), rng.randint(2, 8))
    df = runs_table(*[lrt(s, seed, **{"config.train.preset": p}) for s, p in methods for seed in (0, 1)])
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
    df = runs_table(*[lrt(schedule, seed, **{"config.train.name": f"run-{seed}"}) for seed in range(4)])
    assert set(method_labels(df)) == {f"lrt {schedule}"}
    assert method_keys(df).nunique() == 1


def test_fields_a_run_predates_keep_it_a_seed_of_its_method():
    """A model field added later (memory.update) is missing from older runs: still one method. A
    memory preset missing from an LRT run from before presets reads as "paper"."""
    df = runs_table(lrt("exact", 0, **{"config.model.memory.update": np.nan,
                                       "config.train.memory_preset": np.nan}),
                    lrt("exact", 1, **{"config.model.memory.update": "overwrite"}),
                    lrt("exact", 2, **{"config.model.memory.update": "overwrite"}))
    assert set(method_labels(df)) == {"lrt exact"}


def test_options_name_only_the_methods_that_depart_from_the_default():
    df = runs_table(lrt("rollout:1", 0), lrt("rollout:1", 1),
                    lrt("rollout:1", 0, **{"config.train.task_options.supervise_every": 2}),
                    lrt("interleaved:2", 0), lrt("interleaved:2", 0, **{"config.train.steps": 300}),
                    lrt("interleaved:2", 0, **{"config.train.overrides.memory.source_layer": 2,
                                               "config.model.memory.source_layer": 2}),
                    {"config.kind": "transformer", "config.schedule": "onepass", "config.train.steps": 300,
                     "config.train.memory_preset": np.nan, "config.model.memory.gamma_init": np.nan})
    assert list(method_labels(df)) == [
        "lrt rollout:1", "lrt rollout:1", "lrt rollout:1 | supervise_every=2", "lrt interleaved:2",
        "lrt interleaved:2 | steps=300", "lrt interleaved:2 | memory.source_layer=2",
        "transformer | steps=300"]


def test_methods_only_the_model_config_tells_apart_are_spelled_out():
    df = runs_table(lrt("exact", 0), lrt("exact", 0, **{"config.model.memory.gamma_init": 0.5}))
    labels = method_labels(df)
    assert labels.nunique() == 2 and "gamma_init=0.5" in labels[1]
