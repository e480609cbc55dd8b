"""Restating a run's records with today's counters (lrt_lab.analysis.recount).

The reference for restated FLOPs is a second training of the same run with today's counter: a run
trained under the earlier counter (one that did not decompose the operators inference_mode hands it
whole) and then restated must record what that training records, field for field."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from helpers import tiny_train_config

from lrt_lab.analysis.recount import record_conventions, restate_flops, restate_nonfinite
from lrt_lab.store.results import Run
from lrt_lab.training import budget
from lrt_lab.training.loop import train

FIELDS = ("step_flops", "flops")


def _train(root, cfg, counter_then: bool, monkeypatch):
    with monkeypatch.context() as m:
        if counter_then:
            m.setattr(budget, "flop_counter_mode", lambda: budget.FlopCount(decompose=False))
        return train(cfg, out=root, progress=False)


def _flops(run: Run) -> list:
    return [(r["kind"], r["step"], r.get("step_flops"), r["flops"]) for r in run.metrics_records()]


def test_a_rollout_run_counted_by_the_earlier_counter_is_restated_to_todays_count(
    tmp_path, monkeypatch
):
    cfg = tiny_train_config(schedule="rollout:1", steps=4, eval_every=2)
    then = _train(tmp_path / "then", cfg, True, monkeypatch)
    now = _train(tmp_path / "now", cfg, False, monkeypatch)
    assert then.summary["flops"] < now.summary["flops"]  # the rollout was missing
    report = restate_flops(then)
    assert report["missed"] and report["restated"] == pytest.approx(now.summary["flops"])
    for a, b in zip(_flops(then), _flops(now), strict=True):
        assert a[:2] == b[:2] and a[2:] == pytest.approx(b[2:], rel=1e-12)
    assert then.summary["flops"] == pytest.approx(now.summary["flops"], rel=1e-12)
    assert then.summary["restated"]["flops"]["recorded"] < now.summary["flops"]
    # restating again changes nothing: its records are today's count
    before = then.metrics_bytes()  # metrics.jsonl, or its .xz decompressed
    assert restate_flops(then)["restated"] == then.summary["flops"]
    assert then.metrics_bytes() == before


def test_a_run_the_counter_change_does_not_touch_is_left_byte_for_byte(tmp_path, monkeypatch):
    cfg = tiny_train_config(schedule="interleaved:2", steps=3)
    run = _train(tmp_path, cfg, True, monkeypatch)
    before = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    assert restate_flops(run)["missed"] == {}
    assert {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == before


def test_a_final_cross_entropy_read_over_nan_positions_is_restated_as_nan(tmp_path, monkeypatch):
    """The earlier evaluation averaged a NaN position's cross-entropy as 0; the per_position
    table kept the NaN, so the final evaluation's value becomes NaN with a count of the positions
    (a NaN accuracy marks a position nothing was counted at, which is not one)."""
    cfg = tiny_train_config(steps=2, eval_every=2)
    run = _train(tmp_path, cfg, False, monkeypatch)
    path = run.tables()["per_position"]
    table = pd.read_csv(path)
    parallel = table["mode"] == "parallel"
    table.loc[parallel & (table["position"] == 2), "ce"] = math.nan  # counted: accuracy kept
    table.loc[parallel & (table["position"] == 3), ["ce", "accuracy"]] = math.nan  # uncounted
    table.to_csv(path, index=False)
    recorded = run.summary["eval"]["ce_parallel@6"]
    report = restate_nonfinite(run)
    assert report["nonfinite"] == {"ce_parallel@6": 1}
    summary = json.loads((run.path / "summary.json").read_text())
    assert summary["eval"]["ce_parallel@6"] is None and summary["eval"]["nonfinite_parallel@6"] == 1
    assert summary["eval"]["ce_exact@6"] == run.summary["eval"]["ce_exact@6"] is not None
    assert summary["restated"]["nonfinite"]["recorded"] == {"ce_parallel@6": recorded}
    last = [r for r in run.metrics_records() if r["kind"] == "eval"][-1]
    assert last["ce_parallel@6"] is None and last["nonfinite_parallel@6"] == 1


def test_a_config_that_predates_the_conventions_is_written_with_the_ones_it_ran_under(
    tmp_path, monkeypatch
):
    """The fields a config.json lacks are added with the earlier convention's values; what the
    store reads of the run (its group, its model) is the same before and after, and a config that
    has them is left byte for byte."""
    from lrt_lab.store.results import load_runs

    run = _train(tmp_path, tiny_train_config(steps=1), False, monkeypatch)
    path = run.path / "config.json"
    assert record_conventions(run) == []  # written today: it has them
    config = json.loads(path.read_text())
    del config["model"]["window_convention"], config["model"]["memory"]["gate_value_embeds"]
    path.write_text(json.dumps(config))
    before = load_runs(tmp_path).filter(like="config.").iloc[0].to_dict()
    added = record_conventions(run)
    assert added == ["model.window_convention", "model.memory.gate_value_embeds"]
    written = json.loads(path.read_text())["model"]
    assert written["window_convention"] == "keys" and written["memory"]["gate_value_embeds"] is True
    after = load_runs(tmp_path).filter(like="config.").iloc[0].to_dict()
    assert after == before
    text = path.read_bytes()
    assert record_conventions(run) == [] and path.read_bytes() == text
