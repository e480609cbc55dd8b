"""One grouping of runs into seeds of a config, through every entry point that groups them, on
both committed stores: `lrt-lab report`'s table, the Compare page's table, seed_stats, the trainer
frontier, the dashboard's labels and the notebooks' helper agree with a partition read straight
from the run folders' config.json files (every training option but the seed, the name and the
bookkeeping ones; a seed run twice counted once), and name each group alike."""

from __future__ import annotations

import json
import warnings
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

from lrt_lab.store.results import load_runs

ROOT = Path(__file__).resolve().parents[1] / "experiments"
STORES = ("results", "scaling_runs")
# written by hand, not imported: what a run's training options are that do not make another
# config (checkpoints, evaluation cadence, lengths and sample, device, where it was written)
NOT_A_CONFIG = {
    "seed",
    "name",
    "model",
    "schedule",
    "checkpoint_every",
    "eval_every",
    "eval_lengths",
    "eval_size",
    "eval_exact",
    "eval_contraction",
    "device",
    "compile",
    "threads",
    "out",
    "param_convention",
}


def reference(store: Path) -> dict:
    """{(task, length): {config key: sorted seeds}} from the run folders, one run per seed."""
    out = defaultdict(lambda: defaultdict(set))
    for folder in sorted(store.iterdir()):
        if not (folder / "summary.json").is_file():
            continue
        summary = json.loads((folder / "summary.json").read_text())
        if summary.get("status", "complete") != "complete":
            continue
        config = json.loads((folder / "config.json").read_text())
        train = config["train"]
        options = {k: v for k, v in train.items() if k not in NOT_A_CONFIG}
        preset = options.get("memory_preset") if config["kind"] == "lrt" else None
        options["memory_preset"] = "paper" if config["kind"] == "lrt" and not preset else preset
        key = json.dumps(
            [config["kind"], config.get("schedule", "onepass"), options], sort_keys=True
        )
        out[(train["task"], train["length"])][key].add(train["seed"])
    return {study: {k: sorted(v) for k, v in groups.items()} for study, groups in out.items()}


@pytest.fixture(scope="module", params=STORES)
def store(request):
    path = ROOT / request.param
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = load_runs(path)
    return path, df[df["status"] == "complete"]


def partition(labels, seeds) -> dict:
    """{label: sorted seeds} of (label, seed) pairs; a label with the same seed twice fails."""
    out = defaultdict(list)
    for label, seed in zip(labels, seeds):
        out[label].append(int(seed))
    for label, s in out.items():
        assert len(s) == len(set(s)), f"{label}: seeds {s} counted twice"
    return {k: sorted(v) for k, v in out.items()}


def test_every_entry_point_groups_and_names_alike(store):
    from lrt_app import store_data
    from lrt_lab.store.run_groups import one_run_per_seed, seed_groups
    from lrt_results.report import compare_table, frontier_points, report_table
    from lrt_results.stats import seed_stats

    path, df = store
    want = reference(path)
    table = report_table(df)
    groups = seed_groups(df)
    checked = 0
    for (task, length), expected in want.items():
        runs = df[(df["config.train.task"] == task) & (df["config.train.length"] == length)]
        deduped = one_run_per_seed(runs)
        # the partition itself: the same seed sets as the files give, group for group
        names = groups.loc[deduped.index, "group"]
        got = partition(names, deduped["config.train.seed"])
        assert sorted(got.values()) == sorted(expected.values()), (task, length)
        assert len(got) == len(expected)
        # `lrt-lab report`
        rows = table[(table["task"] == task) & (table["length"] == length)]
        report = {r.group: sorted(int(s) for s in r.seeds.split()) for r in rows.itertuples()}
        for label, seeds in got.items():  # a group without the metric lists no seeds
            assert label in report, (task, length, label)
            assert set(report[label]) <= set(seeds), (label, report[label], seeds)
        assert set(report) == set(got)
        # the Compare page
        compare = compare_table(df, task, length)
        assert {r.method: sorted(r.seeds) for r in compare.itertuples()} == got
        # seed_stats (lrt_lab.analysis), on a figure every run has
        stats = seed_stats(runs, "summary.final_loss")
        assert {
            r.group: sorted(int(s) for s in r.seeds.split(", ")) for r in stats.itertuples()
        } == got
        # the dashboard's labels of the same runs (every page labels through them)
        labels = store_data.group_labels(deduped)
        assert (labels == names).all()
        # the frontier: its trainers are groups of the study, named alike, each seed once
        points = frontier_points(df, task, length)
        if not points.empty:
            front = partition(points["trainer"], points["seed"])
            for trainer, seeds in front.items():
                assert trainer in got and seeds == got[trainer], (trainer, seeds)
        checked += 1
    assert checked >= (5 if path.name == "results" else 1)


def test_bookkeeping_never_splits_and_duplicates_count_once():
    """Two runs of one config and seed that differ only in checkpointing and evaluation cadence
    are one run of one group; another learning rate is another group, never a seed of it."""
    from lrt_lab.store.run_groups import duplicate_runs, one_run_per_seed, seed_groups

    base = {
        "config.kind": "transformer",
        "config.schedule": "onepass",
        "config.train.task": "a5_prefix",
        "config.train.length": 16,
        "config.train.matrix_lr": 0.02,
        "config.train.checkpoint_every": 100,
        "config.train.eval_every": 100,
        "config.train.seed": 0,
        "summary.trained_by.finished": 1.0,
    }
    df = pd.DataFrame(
        [
            base | {"run": "pilot-s0"},
            base
            | {
                "run": "grid-s0",
                "config.train.checkpoint_every": 250,
                "config.train.eval_every": 500,
                "summary.trained_by.finished": 2.0,
            },
            base | {"run": "grid-s1", "config.train.seed": 1},
            base | {"run": "lr-s0", "config.train.matrix_lr": 0.04},
        ]
    )
    groups = seed_groups(df)
    assert groups["key"].nunique() == 2
    assert groups.loc[0, "group"] == groups.loc[1, "group"] == groups.loc[2, "group"]
    assert groups.loc[3, "group"] != groups.loc[0, "group"]
    dup = duplicate_runs(df)  # the later one is kept
    assert dup[0] == "grid-s0" and dup[1:].isna().all()
    assert list(one_run_per_seed(df)["run"]) == ["grid-s0", "grid-s1", "lr-s0"]
