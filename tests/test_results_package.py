"""The lab reaches lrt_results only through the entry point group lrt_lab.commands: what it finds
there, and the one line a missing piece gives."""

import importlib.metadata

import pytest

from lrt_lab.commands.cli import main
from lrt_lab.core.plugins import COMMAND_GROUP, provided


def test_every_piece_the_lab_asks_for_is_installed():
    import lrt_results.cli
    import lrt_results.stats

    assert provided("report") is lrt_results.cli.report
    assert provided("mean_ci") is lrt_results.stats.mean_ci
    names = {ep.name for ep in importlib.metadata.entry_points(group=COMMAND_GROUP)}
    assert {"report", "report_study", "analyze_scaling", "gap_tables", "mean_ci"} <= names


def test_a_missing_piece_is_one_error_line(monkeypatch, tmp_path, capsys):
    with pytest.raises(ValueError, match="'no_such' is not installed.*lrt_lab.commands"):
        provided("no_such")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: [])
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lrt-lab: error: 'report' is not installed") and err.count("\n") == 1
