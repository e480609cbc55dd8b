"""The dashboard's Scaling tab on a fabricated store of budgeted runs (tests/test_scaling.py)."""

import pytest

pytest.importorskip("streamlit")

from app_helpers import assert_clean, run_app  # noqa: E402
from scaling_store import build, write_run  # noqa: E402


def test_scaling_tab_plots_and_decides(tmp_path, monkeypatch):
    build(tmp_path, lambda r, s: -0.02 + 0.002 * s)
    at = run_app(monkeypatch, tmp_path)
    assert_clean(at)
    texts = " ".join(m.value for m in at.markdown)
    assert "the compute-efficiency claim fails in miniature" in texts
    frames = [d.value for d in at.dataframe if "match" in d.value.columns]
    assert frames and set(frames[0]["match"]) == {"tokens", "compute"}


def test_scaling_tab_says_how_to_get_runs(tmp_path, monkeypatch):
    write_run(tmp_path, "transformer", "onepass", 5, 0, 2.0)
    (tmp_path / "x").mkdir()  # an unbudgeted folder is simply not a point
    at = run_app(monkeypatch, tmp_path)
    assert_clean(at)
