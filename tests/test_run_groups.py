"""One grouping rule everywhere: a group is the whole config up to the seed (and name).

Unit checks of lrt_lab.store.run_groups on hand-written runs tables, then a real store of two
configs x two
seeds (the default LRT and the same LRT reading its memory from another block, which the old
fixed-field labels pooled into one group of four) read by `lrt-lab report`, seed_stats and the
dashboard: each must show two groups of two.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import tiny_train_config
from scipy import stats as sps

from lrt_lab.store.run_groups import group_keys, group_labels


def table(*rows: dict) -> pd.DataFrame:
    base = {
        "run": None,
        "config.kind": "lrt",
        "config.schedule": "exact",
        "config.train.task": "a5_prefix",
        "config.train.length": 8,
        "config.model.n_layer": 4,
        "config.model.memory.source_layer": np.nan,
        "config.train.seed": 0,
        "config.train.name": None,
        "config.params.total": 100,
    }
    out = pd.DataFrame([{**base, **r} for r in rows])
    out["run"] = [f"r{i}" for i in range(len(out))]
    return out


def test_seeds_share_a_group_and_any_other_difference_splits_it():
    df = table(
        {"config.train.seed": 0, "config.train.name": "a"},
        {"config.train.seed": 1, "config.train.name": "b"},
        {"config.model.memory.source_layer": 4.0},
        {"config.model.memory.source_layer": 4, "config.train.seed": 1},
        {"config.train.matrix_lr": 0.01},
    )
    labels = group_labels(df)
    assert labels[0] == labels[1] == "lrt exact"  # the default reads as the method alone
    assert labels[2] == labels[3] == "lrt exact | memory.source_layer=4"  # 4.0 and 4 are one value
    assert labels[4] == "lrt exact | matrix_lr=0.01"
    assert group_keys(df).nunique() == 3 and labels.nunique() == 3


def test_labels_name_only_what_differs_and_the_task_always():
    df = table(
        {},
        {"config.kind": "transformer", "config.schedule": "onepass"},
        {
            "config.model.n_layer": 8,
            "config.kind": "transformer",
            "config.schedule": "onepass",
            "config.params.total": 200,
        },
        {
            "config.train.task": "z60_prefix",
            "config.kind": "transformer",
            "config.schedule": "onepass",
        },
    )
    labels = group_labels(df)
    # params differ with depth but follow from it: never named; the task is named whenever it varies
    assert list(labels) == [
        "lrt exact | a5_prefix | layers=4",
        "transformer | a5_prefix | layers=4",
        "transformer | a5_prefix | layers=8",
        "transformer | z60_prefix | layers=4",
    ]
    assert list(group_labels(df.iloc[:2])) == ["lrt exact", "transformer"]
    # a view that puts depth on an axis of its own leaves it out of the labels
    assert group_labels(df.iloc[1:3], exclude=["config.model.n_layer"]).nunique() == 1


def test_an_unset_field_never_merges_two_groups():
    # the only difference is a field one group lacks: the label has to spell it out
    df = table(
        {
            "config.model.memory.source_layer": np.nan,
            "config.kind": "transformer",
            "config.schedule": "onepass",
        },
        {
            "config.model.memory.source_layer": 2,
            "config.kind": "transformer",
            "config.schedule": "onepass",
        },
    )
    labels = group_labels(df)
    assert labels.nunique() == 2, list(labels)


# A real store: two configs x two seeds ------------------------------------------------------------
@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory) -> Path:
    import torch

    from lrt_lab.training.loop import train

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("two_by_two")
    for overrides in ({}, {"memory.source_layer": 2}):
        for seed in (0, 1):
            cfg = tiny_train_config(
                eval_every=2,
                seed=seed,
                overrides=overrides,
                name=f"lrt-{'src2' if overrides else 'default'}-s{seed}",
            )
            train(cfg, out=root, progress=False)
    return root


def test_report_and_seed_stats_show_two_groups_of_two(two_by_two, capsys):
    from lrt_lab.store.results import load_runs
    from lrt_results.report import print_report
    from lrt_results.stats import seed_stats

    df = load_runs(two_by_two)
    metric = "summary.eval.acc_exact@6"
    stats = seed_stats(df, metric).set_index("group")
    assert sorted(stats.index) == ["lrt exact", "lrt exact | memory.source_layer=2"]
    assert stats["n"].tolist() == [2, 2] and set(stats["seeds"]) == {"0, 1"}
    # against an independent computation: mean and t-interval of each config's two runs
    for group, source in (("lrt exact", None), ("lrt exact | memory.source_layer=2", 2)):
        sub = df[df["config.model.memory.source_layer"].fillna(-1) == (source if source else -1)][
            metric
        ]
        half = sps.t.ppf(0.975, 1) * np.std(sub, ddof=1) / math.sqrt(2)
        assert stats.loc[group, "mean"] == pytest.approx(sub.mean())
        assert stats.loc[group, "ci_high"] == pytest.approx(sub.mean() + half)
    table_ = print_report(two_by_two, metric=metric)
    out = capsys.readouterr().out
    assert (
        table_["n"].tolist() == [2, 2]
        and "95% t-interval" in out
        and "memory.source_layer=2" in out
    )


def test_the_dashboard_shows_two_groups_of_two(two_by_two, monkeypatch):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from lrt_app import store_data

    runs, _ = store_data.cached_runs(str(two_by_two), False, store_data.store_signature(two_by_two))
    overview = store_data.group_overview(runs).set_index("group")
    assert overview["runs"].tolist() == [2, 2]
    band = store_data.seed_band(store_data.curves(runs, "loss", "steps")[0])
    assert set(band.groupby("group")["n"].max()) == {2}
    figs = store_data.length_summary(store_data.length_figures(runs))
    assert figs["seeds"].tolist() == [2, 2] and figs["group"].nunique() == 2

    monkeypatch.setenv("LRT_RUNS", str(two_by_two))
    monkeypatch.setattr(sys, "argv", ["streamlit_app.py"])
    app = str(Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py")
    at = AppTest.from_file(app, default_timeout=60).run()
    assert not at.exception and not at.error
    (runs_tab,) = [t for t in at.tabs if t.label == "Runs"]
    shown = runs_tab.dataframe[0].value
    assert sorted(shown["group"]) == ["lrt exact", "lrt exact | memory.source_layer=2"]
    assert shown["runs"].tolist() == [2, 2]


def test_a_run_trained_longer_is_labelled_apart_from_the_seeds_of_its_group():
    from lrt_results.report import steps_suffix

    df = pd.DataFrame(
        {"label": ["a", "a", "a", "b", "b"], "config.train.steps": [1500, 1500, 3000, 1500, 1500]}
    )
    assert steps_suffix(df, "label").tolist() == [
        " (1500 steps)",
        " (1500 steps)",
        " (3000 steps)",
        "",
        "",
    ]
    # grouping by a Series (a label built on the fly) gives the same answer
    assert steps_suffix(df, df["label"]).tolist() == steps_suffix(df, "label").tolist()


def test_runs_written_before_a_field_existed_group_with_the_runs_that_have_it(
    two_by_two, tmp_path, capsys
):
    """A stored config that predates a field (memory.update, memory.mechanism) is read with
    today's default filled in: the report, seed_stats and the dashboard show the same two groups
    of two when one seed of each config is in the old schema, and the committed store's
    FixedPoint(0.01, 16) seeds (seed 0 written before memory.update) are one group."""
    import json
    import shutil

    from lrt_app import store_data
    from lrt_lab.store.results import load_runs
    from lrt_results.report import print_report
    from lrt_results.stats import seed_stats

    store = tmp_path / "mixed"
    shutil.copytree(two_by_two, store)
    for run in ("lrt-default-s0", "lrt-src2-s1"):  # one seed of each config, in the old schema
        path = store / run / "config.json"
        config = json.loads(path.read_text())
        for field in ("update", "mechanism"):
            del config["model"]["memory"][field]
        path.write_text(json.dumps(config))
    df = load_runs(store)
    metric = "summary.eval.acc_exact@6"
    assert seed_stats(df, metric)["n"].tolist() == [2, 2]
    assert print_report(store, metric=metric)["n"].tolist() == [2, 2]
    capsys.readouterr()
    runs, _ = store_data.cached_runs(str(store), False, store_data.store_signature(store))
    assert store_data.group_overview(runs)["runs"].tolist() == [2, 2]

    committed = load_runs(Path(__file__).resolve().parent.parent / "experiments" / "results")
    seeds = committed[committed["run"].str.contains("lrt-fixedpoint_0.01_16-s")]
    assert len(seeds) == 3 and group_keys(seeds).nunique() == 1


def test_runs_of_an_earlier_model_convention_never_group_with_todays(two_by_two, tmp_path):
    """A stored config without `window_convention` / `memory.gate_value_embeds` ran under the
    earlier convention (a window of N covers N keys; the value embedding under the local gate):
    it reads as that, never as today's default, so it is not pooled with today's seeds, and its
    label says which convention tells it apart."""
    import json
    import shutil

    from lrt_lab.core.config import ModelConfig
    from lrt_lab.store.results import load_runs

    store = tmp_path / "conventions"
    shutil.copytree(two_by_two, store)
    path = store / "lrt-default-s0" / "config.json"
    config = json.loads(path.read_text())
    del config["model"]["window_convention"], config["model"]["memory"]["gate_value_embeds"]
    path.write_text(json.dumps(config))
    df = load_runs(store)
    old = df[df["run"] == "lrt-default-s0"].iloc[0]
    assert old["config.model.window_convention"] == "keys"
    assert bool(old["config.model.memory.gate_value_embeds"]) is True
    assert sorted(group_keys(df).value_counts().tolist()) == [1, 1, 2]
    labels = group_labels(df[df["run"].str.startswith("lrt-default")])
    conventions = ("window_convention=keys", "memory.gate_value_embeds=True")
    assert labels.nunique() == 2 and any(c in x for x in labels for c in conventions)
    # the model a stored config rebuilds is the one it ran
    rebuilt = ModelConfig.from_dict(config["model"])
    assert (rebuilt.window_convention, rebuilt.memory.gate_value_embeds) == ("keys", True)
    today = ModelConfig.from_dict(
        json.loads((store / "lrt-src2-s0" / "config.json").read_text())["model"]
    )
    assert (today.window_convention, today.memory.gate_value_embeds) == ("nanochat", False)


def test_the_contraction_monitor_measures_without_changing_training_and_splits_no_group(tmp_path):
    """MEASUREMENT_ONLY: a run with the monitor trains bit for bit as one without it, so a run
    written before the switch existed (no such field) is a seed of the same method."""
    import json

    import torch

    from lrt_lab.store.results import load_metrics, load_runs
    from lrt_lab.store.run_groups import method_labels
    from lrt_lab.training.loop import train

    torch.set_num_threads(1)
    runs = {}
    for on in (True, False):
        cfg = tiny_train_config(
            schedule="interleaved:2", steps=6, eval_every=2, eval_contraction=on, name=f"c{on}"
        )
        runs[on] = train(cfg, out=tmp_path, progress=False)
    train_rows = {on: load_metrics(r, kind="train") for on, r in runs.items()}
    assert train_rows[True]["loss"].tolist() == train_rows[False]["loss"].tolist()
    evals = {on: load_metrics(r, kind="eval") for on, r in runs.items()}
    assert "lyap" in evals[True] and "lyap" not in evals[False]  # it did measure
    shared = [c for c in evals[False].columns if c in evals[True].columns and c != "time"]
    assert evals[True][shared].equals(evals[False][shared])
    # the older run: its config has no eval_contraction at all
    config = runs[False].path / "config.json"
    stored = json.loads(config.read_text())
    del stored["train"]["eval_contraction"]
    config.write_text(json.dumps(stored))
    df = load_runs(tmp_path)
    assert group_keys(df).nunique() == 1 and method_labels(df).nunique() == 1
