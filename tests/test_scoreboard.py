"""The approximate-vs-exact scoreboard (lrt_results.scoreboard and `lrt-lab report
--scoreboard`): gaps and agreements from hand-written summaries, computed here by hand."""

from __future__ import annotations

import io
import json
import math
import statistics

import pandas as pd
import pytest

from lrt_lab.commands.cli import main
from lrt_lab.store.results import load_runs
from lrt_results.scoreboard import scoreboard, scoreboard_wide
from lrt_results.stats import t_quantile

LENGTHS = (8, 16, 32)
# (kind, schedule, seed) -> per evaluation length: (ce_parallel, ce_exact, agreement); None: a run
# trained before both forwards' cross-entropy was recorded
RUNS = {
    ("lrt", "interleaved:2", 0): {8: (1.0, 0.9, 0.95), 16: (1.5, 1.0, 0.8), 32: (2.5, 1.2, 0.6)},
    ("lrt", "interleaved:2", 1): {8: (1.1, 0.9, 0.93), 16: (1.4, 1.1, 0.82), 32: (2.0, 1.3, 0.7)},
    ("lrt", "interleaved:2", 2): {8: (0.9, 0.8, 0.97), 16: (1.6, 1.0, 0.79), 32: (2.2, 1.1, 0.65)},
    ("lrt", "exact", 0): {8: (0.7, 0.7, 1.0), 16: (0.8, 0.8, 1.0), 32: (1.0, 1.0, 1.0)},
    ("lrt", "exact", 1): {8: (0.6, 0.6, 1.0), 16: (0.9, 0.9, 1.0), 32: (1.1, 1.1, 1.0)},
    ("lrt", "fullseq:3", 0): None,
    ("transformer", "onepass", 0): {8: (1.2, 1.2, math.nan)},
}


def write_store(root):
    for (kind, schedule, seed), scores in RUNS.items():
        folder = root / f"a5_prefix-L8-tiny-{kind}-{schedule.replace(':', '_')}-s{seed}"
        folder.mkdir(parents=True)
        config = {
            "kind": kind,
            "schedule": schedule,
            "model": {"n_layer": 2, **({"memory": {}} if kind == "lrt" else {})},
            "train": {
                "task": "a5_prefix",
                "length": 8,
                "model": kind,
                "schedule": schedule,
                "seed": seed,
                "steps": 10,
                "preset": "tiny",
                "overrides": {},
                "task_options": {},
            },
        }
        ev = {f"pos90_exact@{L}": 1 for L in LENGTHS}
        for L, (par, ex, agree) in (scores or {}).items():
            ev.update({f"ce_parallel@{L}": par, f"ce_exact@{L}": ex})
            if kind == "lrt":
                ev[f"agree@{L}"] = agree
        summary = {"status": "complete", "final_loss": 1.0, "eval": ev}
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "summary.json").write_text(json.dumps(summary))
    return root


def by_hand(schedule, L):
    rows = [s[L] for (k, sch, _), s in RUNS.items() if sch == schedule and s]
    gaps = [par - ex for par, ex, _ in rows]
    mean = statistics.mean(gaps)
    half = t_quantile(0.975, len(gaps) - 1) * statistics.stdev(gaps) / math.sqrt(len(gaps))
    return mean, mean - half, mean + half, statistics.mean(a for *_, a in rows)


def test_the_gap_and_agreement_are_the_seeds_by_hand(tmp_path):
    table = scoreboard(load_runs(write_store(tmp_path / "store")))
    assert table.attrs["left_out"] == ["a5_prefix-L8-tiny-lrt-fullseq_3-s0"]
    assert set(table["group"]) == {"lrt interleaved:2", "lrt exact"}  # no transformer
    inter = table[table["group"] == "lrt interleaved:2"].set_index("eval_length")
    assert sorted(inter.index) == list(LENGTHS)
    for L in LENGTHS:
        mean, lo, hi, agree = by_hand("interleaved:2", L)
        assert inter.loc[L, "ce_gap"] == pytest.approx(mean)
        assert (inter.loc[L, "ce_gap_low"], inter.loc[L, "ce_gap_high"]) == pytest.approx((lo, hi))
        assert inter.loc[L, "agreement"] == pytest.approx(agree)
    exact = table[table["group"] == "lrt exact"]
    assert (exact["ce_gap"] == 0).all() and (exact["agreement"] == 1).all()
    wide = scoreboard_wide(table)
    assert list(wide.columns[4:]) == [f"{k}@{L}" for L in LENGTHS for k in ("gap", "agree")]


def test_the_report_flag_prints_it_in_every_format(tmp_path, capsys):
    store = write_store(tmp_path / "store")
    assert main(["report", str(store), "--scoreboard", "--format", "csv"]) == 0
    csv = pd.read_csv(io.StringIO(capsys.readouterr().out))
    mean, *_ = by_hand("interleaved:2", 32)
    assert csv[(csv["n"] == 3) & (csv["eval_length"] == 32)]["ce_gap"].item() == pytest.approx(mean)
    assert main(["report", str(store), "--scoreboard"]) == 0
    out = capsys.readouterr().out
    assert "gap@8" in out and "agree@32" in out and "fullseq_3-s0" in out  # the note names it
    assert main(["report", str(store), "--scoreboard", "--format", "md"]) == 0
    assert "| group | n | gap@8 |" in capsys.readouterr().out
    assert main(["report", str(store), "--scoreboard", "--metric", "pos90"]) == 2
    assert "--metric is invalid with --scoreboard" in capsys.readouterr().err


def test_a_page_can_embed_it_without_the_legend_or_headings(tmp_path):
    from lrt_results.report import SCOREBOARD_LEGEND, render_scoreboard

    table = scoreboard(load_runs(write_store(tmp_path / "store")))
    full = render_scoreboard(table, "md")
    bare = render_scoreboard(table, "md", legend=False, headings=False)
    assert SCOREBOARD_LEGEND[0] in full and "### a5_prefix" in full
    assert SCOREBOARD_LEGEND[0] not in bare and "###" not in bare
    assert bare.startswith("| group | n | gap@8 |")
    # the rows are the same, only the frame differs
    assert [r for r in full.splitlines() if r.startswith("| lrt")] == [
        r for r in bare.splitlines() if r.startswith("| lrt")
    ]


def test_the_compare_tab_shows_it(tmp_path, monkeypatch):
    pytest.importorskip("streamlit")
    import sys
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    store = write_store(tmp_path / "store")
    monkeypatch.setenv("LRT_RUNS", str(store))
    monkeypatch.setattr(sys, "argv", ["streamlit_app.py"])
    app = Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py"
    at = AppTest.from_file(str(app), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    compare = at.tabs[0]
    board = compare.dataframe[1].value.set_index("method")
    assert sorted(board.index) == ["lrt exact", "lrt interleaved:2"]
    mean, lo, hi, agree = by_hand("interleaved:2", 16)
    assert board.loc["lrt interleaved:2", "CE gap at 16"].startswith(f"{mean:.3g} [")
    assert board.loc["lrt interleaved:2", "agreement at 16"] == f"{agree:.3f}"
    assert any("1 LRT run(s) recorded neither" in c.value for c in compare.caption)
