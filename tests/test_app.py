"""The Streamlit dashboard (app/) under streamlit.testing.v1.AppTest, on a store of tiny real runs.

The store holds two seeds of an LRT (Interleaved(2)) and one plain transformer, trained for a few
steps, plus what a real store also meets: a run of a kind the app does not know, a half-written
folder, a run still training, and analysis tables (probe, gap recovery, depth sweep).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

pytest.importorskip("streamlit")
from app_helpers import (  # noqa: E402
    APP,
    COMPLETE_RUNS,
    LRT_RUNS,
    TRANSFORMER_RUN,
    UNKNOWN_RUN,
    assert_clean,
    build_store,
    loss_records,
    run_app,
    synthetic_store,
    template_run,
)
from streamlit.testing.v1 import AppTest  # noqa: E402

from lrt_lab.store.results import load_runs  # noqa: E402


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return build_store(tmp_path_factory.mktemp("store"))


# the tests on `store` go to one worker under `pytest -n 2 --dist loadgroup`: it is trained once
on_the_store = pytest.mark.xdist_group("app_store")


def sidebar_multiselect(at: AppTest, label: str):
    (widget,) = [m for m in at.sidebar.multiselect if m.label == label]
    return widget


def page(at: AppTest, label: str):
    """The tab titled `label` (Compare comes first, so tabs are found by title, not position)."""
    (found,) = [t for t in at.tabs if t.label == label]
    return found


def runs_table(at: AppTest) -> pd.DataFrame:
    return page(at, "Runs").dataframe[1].value  # [0] is the groups of seeds


def groups_table(at: AppTest) -> pd.DataFrame:
    return page(at, "Runs").dataframe[0].value


@on_the_store
def test_every_page_renders(store, monkeypatch):
    at = run_app(monkeypatch, store)
    assert_clean(at)
    assert [t.label for t in at.tabs] == [
        "Compare",
        "Runs",
        "Training curves",
        "Delta",
        "Length generalisation",
        "Depth x length",
        "Gap recovery",
        "Probes",
        "Convergence",
        "Trainer frontier",
        "Scaling",
    ]
    assert sorted(runs_table(at)["run"]) == sorted(COMPLETE_RUNS + [UNKNOWN_RUN])
    shown = " ".join(m.value for m in page(at, "Runs").markdown)
    assert all(name in shown for name in COMPLETE_RUNS)
    # The awkward folders: one clear message each, no traceback.
    warnings = " ".join(w.value for w in at.warning)
    assert "half-written" in warnings and "mystery:7" in warnings
    assert "still-running" in " ".join(i.value for i in at.info)
    # Every chart page drew its charts, analysis pages included.
    n_charts = {
        "Compare": 1,  # the frontier scatter of the store's one study
        "Training curves": 1,
        "Delta": 1,  # the LRT and the unknown kind against the transformer
        "Length generalisation": 2,
        "Depth x length": 2,
        "Gap recovery": 1,
        "Probes": 1,
        "Convergence": 0,  # no FixedPoint run in this store
        "Trainer frontier": 1,
        "Scaling": 0,  # no run trained to a tokens-per-parameter budget in this store
    }
    for tab in [t for t in at.tabs if t.label != "Runs"]:
        charts = [e for e in tab if getattr(e, "type", "") == "vega_lite_chart"]
        assert len(charts) == n_charts[tab.label], tab.label
    # one depth only: the hint says so
    assert "n_layer=2" in " ".join(i.value for i in page(at, "Depth x length").info)
    # Config diff of the runs shown: the keys that differ, one column per run.
    diff = page(at, "Runs").table[0].value
    assert {"kind", "train.seed", "schedule"} <= set(diff.index)
    assert set(COMPLETE_RUNS) <= set(diff.columns)

    # Every control at once, then one rerun (each rerun redraws all six pages).
    page(at, "Training curves").radio(key="curve_x").set_value("compute")
    page(at, "Training curves").selectbox(key="curve_metric").set_value("pos90_exact@12")
    page(at, "Training curves").checkbox(key="curve_seeds").check()
    page(at, "Depth x length").radio(key="depth_mode").set_value("parallel")
    page(at, "Depth x length").radio(key="depth_measure").set_value("fraction")
    at.sidebar.checkbox(key="include_incomplete").check()
    at.run()
    assert_clean(at)
    assert "still-running" in set(runs_table(at)["run"])
    assert (
        len([e for e in page(at, "Training curves") if getattr(e, "type", "") == "vega_lite_chart"])
        == 1
    )


@on_the_store
def test_filters_and_selection(store, monkeypatch):
    at = run_app(monkeypatch, store)
    sidebar_multiselect(at, "runs").set_value([LRT_RUNS[0], TRANSFORMER_RUN]).run()
    assert_clean(at)
    assert sorted(runs_table(at)["run"]) == sorted([LRT_RUNS[0], TRANSFORMER_RUN])
    diff = page(at, "Runs").table[0].value  # config diff
    assert sorted(diff.columns) == sorted([LRT_RUNS[0], TRANSFORMER_RUN])

    sidebar_multiselect(at, "model").set_value(["lrt"])  # a new filter resets the run selection
    sidebar_multiselect(at, "seed").set_value([1])
    at.run()
    assert_clean(at)
    assert list(runs_table(at)["run"]) == [LRT_RUNS[1]]

    sidebar_multiselect(at, "model").set_value(["transformer", "mystery:7"])
    sidebar_multiselect(at, "seed").set_value([])
    sidebar_multiselect(at, "schedule").set_value(["onepass"])
    at.run()
    assert_clean(at)
    assert list(runs_table(at)["run"]) == [TRANSFORMER_RUN]
    assert page(at, "Runs").json  # one run: its full config instead of a diff


@on_the_store
def test_compute_axis_is_baseline_equivalent(store):
    """x = compute puts an Interleaved(2) run at 2x its tokens; the transformer at 1x."""
    from lrt_app import store_data

    runs, _ = store_data.cached_runs(str(store), False, store_data.store_signature(store))
    runs = runs[runs["run"].isin(COMPLETE_RUNS)]
    tokens, _ = store_data.curves(runs, "loss", "tokens")
    compute, _ = store_data.curves(runs, "loss", "compute")
    last_t, last_c = tokens.groupby("run")["x"].max(), compute.groupby("run")["x"].max()
    assert last_c[LRT_RUNS[0]] == 2 * last_t[LRT_RUNS[0]]
    assert last_c[TRANSFORMER_RUN] == last_t[TRANSFORMER_RUN]
    band = store_data.seed_band(compute)
    lrt = band[band["group"] == "lrt interleaved:2"]
    assert (
        (lrt["n"] == 2).all()
        and (lrt["lo"] <= lrt["mean"]).all()
        and (lrt["mean"] <= lrt["hi"]).all()
    )


@on_the_store
def test_empty_missing_and_changed_store(store, tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("LRT_APP_ROOTS", os.pathsep.join([str(tmp_path), str(store)]))
    at = run_app(monkeypatch, empty)
    assert_clean(at)
    assert "no complete runs" in " ".join(i.value for i in at.info)
    at.sidebar.text_input(key="runs_dir").input(str(tmp_path / "nowhere")).run()
    assert_clean(at)
    assert "does not exist" in " ".join(i.value for i in at.info)
    at.sidebar.text_input(key="runs_dir").input(str(store)).run()
    assert_clean(at)
    assert TRANSFORMER_RUN in set(runs_table(at)["run"])
    # A config.json that is JSON but not an object: load_runs cannot read the store; one message.
    odd = tmp_path / "odd"
    (odd / "not-a-run").mkdir(parents=True)
    (odd / "not-a-run" / "config.json").write_text("[1, 2]")
    (odd / "not-a-run" / "summary.json").write_text("{}")
    at.sidebar.text_input(key="runs_dir").input(str(odd)).run()
    assert not at.exception
    assert all("could not read" in e.value or "could not be drawn" in e.value for e in at.error)


@on_the_store
def test_the_sidebar_opens_only_the_store_it_started_on_or_an_allowed_root(
    store, tmp_path, monkeypatch
):
    """A visitor who types `/` (or any folder of the machine) in the sidebar gets one warning and
    no listing; folders inside an allowed root open as before."""
    monkeypatch.delenv("LRT_APP_ROOTS", raising=False)
    (tmp_path / "secret-folder").mkdir()
    at = run_app(monkeypatch, store)
    assert TRANSFORMER_RUN in set(runs_table(at)["run"])
    for outside in ("/", str(tmp_path), str(store / ".." / tmp_path.name)):
        at.sidebar.text_input(key="runs_dir").input(outside).run()
        assert not at.exception
        shown = " ".join(m.value for m in [*at.info, *at.warning, *at.error, *at.markdown])
        assert "outside the folders this dashboard may read" in shown, shown
        assert "secret-folder" not in shown and not at.tabs
    link = store / "link-out"
    link.symlink_to(tmp_path, target_is_directory=True)  # inside the store, leading out of it
    try:
        at.sidebar.text_input(key="runs_dir").input(str(link)).run()
        assert "outside the folders" in " ".join(w.value for w in at.warning)
    finally:
        link.unlink()
    at.sidebar.text_input(key="runs_dir").input(str(store)).run()
    assert_clean(at)
    assert TRANSFORMER_RUN in set(runs_table(at)["run"])
    monkeypatch.setenv("LRT_APP_ROOTS", str(tmp_path))  # allowed: opens, says what is there
    at.sidebar.text_input(key="runs_dir").input(str(tmp_path)).run()
    assert not [w for w in at.warning if "outside" in w.value], [w.value for w in at.warning]
    assert "no complete runs" in " ".join(i.value for i in at.info)


def test_the_dashboard_listens_on_this_machine_only_unless_told(monkeypatch, capsys):
    from lrt_lab.commands import app_launcher
    from lrt_lab.commands.cli import main

    started = []

    class Child:
        def __init__(self, cmd, **kw):
            started.append(cmd)

        def wait(self, timeout=None):
            return 0

        def poll(self):
            return 0

    monkeypatch.setattr(app_launcher.subprocess, "Popen", Child)
    port = app_launcher.free_port(20000)
    assert main(["app", "--runs", "somewhere", "--port", str(port)]) == 0
    cmd = started[-1]
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert "every host" not in capsys.readouterr().err
    args = ["app", "--runs", "s", "--port", str(port), "--address", "0.0.0.0"]
    assert main([*args, "--allow-root", "/data/stores"]) == 0
    cmd = started[-1]
    assert cmd[cmd.index("--server.address") + 1] == "0.0.0.0"
    assert cmd[cmd.index("--") :] == ["--", "--allow-root", "/data/stores", "--runs", "s"]
    assert "listening on 0.0.0.0: every host that reaches it can read the store" in (
        capsys.readouterr().err
    )


@on_the_store
def test_analysis_pages_hint_when_no_tables(store, tmp_path, monkeypatch):
    bare = tmp_path / "bare"
    # a store with no analysis tables
    shutil.copytree(store / TRANSFORMER_RUN, bare / TRANSFORMER_RUN)
    at = run_app(monkeypatch, bare)
    assert_clean(at)
    assert "No run shown has BPB tables" in " ".join(i.value for i in page(at, "Gap recovery").info)
    assert "No probe tables yet" in " ".join(i.value for i in page(at, "Probes").info)
    assert "Config diff" in [h.value for h in page(at, "Runs").subheader]


def test_analysis_table_readers():
    """Tolerant readers: the lrt_lab.analysis layouts, simpler ones, and a message for anything
    else."""
    from lrt_app import store_data

    assert "site" in store_data.read_probe(pd.DataFrame({"foo": [1]}), "store")[1]
    assert store_data.read_gap(pd.DataFrame({"x": [1]}))[2].startswith("expected columns")
    assert store_data.read_depth_sweep(pd.DataFrame({"x": [1]}))[2].startswith("expected columns")

    probe = pd.DataFrame(
        {
            "run": "r",
            "site": ["hook_embed", "hook_mem_in", "hook_mem_in"],
            "target": ["state", "state", "state_prev"],
            "position": [2, 2, 2],
            "control": "probe",
            "accuracy": [0.2, 0.3, 0.9],
            "decoding": "exact",
            "layer_index": [0, 1, 1],
        }
    )
    cells, msg = store_data.read_probe(probe, "r", "probe_exact")
    assert msg is None and list(cells["row"]) == ["hook_embed", "hook_mem_in", "hook_mem_in (t-1)"]
    assert set(cells["label"]) == {"r (exact)"} and list(cells["row_order"]) == [0, 1, 1.5]

    keys = {"config.train.task": "t"}
    summary = pd.DataFrame(
        [
            {**keys, "method": "a", "recovered": 0.5, "ci_low": 0.4, "ci_high": 0.6},
            {**keys, "method": "b", "recovered": 0.8, "ci_low": 0.7, "ci_high": 0.9},
        ]
    )
    per_seed = pd.DataFrame(
        [
            {**keys, "method": m, "seed": s, "value": 9.0, "recovered": r}
            for m, r in (("a", 0.5), ("b", 0.8))
            for s in (0, 1)
        ]
    )
    bars, points, msg = store_data.read_gap(summary, per_seed)
    assert (
        msg is None
        and list(bars["label"]) == ["a", "b"]
        and list(points["value"]) == [0.5, 0.5, 0.8, 0.8]
    )
    wide = pd.DataFrame(
        {
            "method": ["a"],
            "recovered_mean": [0.5],
            "ci_low": [0.4],
            "ci_high": [0.6],
            "seed0": [0.45],
            "seed1": [0.55],
        }
    )
    assert list(store_data.read_gap(wide)[1]["value"]) == [0.45, 0.55]

    sweep = pd.DataFrame(
        {
            "task": "t",
            "method": ["transformer", "transformer", "lrt"],
            "n_layer": [1, 2, 2],
            "mean": [1.0, 3.0, 4.0],
            "ci_low": [0.5, 2.5, 3.5],
            "ci_high": [1.5, 3.5, 4.5],
        }
    )
    curve, shape, msg = store_data.read_depth_sweep(sweep)
    assert shape == "curve" and list(curve["swept"]) == [True, True, False]
    grid, shape, msg = store_data.read_depth_sweep(
        pd.DataFrame({"depth": [2, 4], "length": [8, 8], "solved": [0.0, 1.0]})
    )
    assert shape == "grid" and list(grid["value"]) == [0.0, 1.0]


def test_default_runs_dir(tmp_path):
    from lrt_app import store_data

    assert store_data.default_runs_dir(["--runs", "x"], {"LRT_RUNS": "y"}, tmp_path) == "x"
    assert (
        store_data.default_runs_dir(["-q", "tests/test_app.py"], {"LRT_RUNS": "y"}, tmp_path) == "y"
    )
    assert store_data.default_runs_dir([], {}, tmp_path) == "runs"
    assert store_data.default_runs_dir(["--runs"], {}, tmp_path) == "runs"
    (tmp_path / "experiments" / "results").mkdir(parents=True)
    assert store_data.default_runs_dir([], {}, tmp_path) == "experiments/results"
    (tmp_path / "runs").mkdir()
    assert store_data.default_runs_dir([], {}, tmp_path) == "runs"


def test_launcher_finds_the_app_without_importing_it(monkeypatch, capsys):
    from lrt_lab.commands import app_launcher

    for name in [m for m in sys.modules if m == "app" or m.startswith("app.")]:
        monkeypatch.delitem(sys.modules, name)
    path = app_launcher.app_path()
    assert path == Path(APP) and "app" not in sys.modules
    cmd = app_launcher.command("some/runs", 8765, address="127.0.0.1", headless=True)
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4] == APP
    assert cmd[-3:] == ["--", "--runs", "some/runs"] and "8765" in cmd
    with pytest.raises(ValueError, match="port"):
        app_launcher.command("runs", 0)
    real_find_spec = app_launcher.importlib.util.find_spec
    monkeypatch.setattr(
        app_launcher.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "streamlit" else real_find_spec(name, *a),
    )
    assert app_launcher.launch("runs", 8501) == 1
    assert "pip install -e '.[app]'" in capsys.readouterr().err


def test_launcher_on_a_busy_port_suggests_a_free_one(monkeypatch, capsys):
    import socket

    from lrt_lab.commands import app_launcher

    monkeypatch.setattr(
        app_launcher.subprocess, "Popen", lambda *a, **k: pytest.fail("started on a busy port")
    )
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert not app_launcher.port_is_free(port)
        assert app_launcher.launch("runs", port) == 2
    err = capsys.readouterr().err
    assert f"port {port} is already in use" in err
    suggested = int(err.rsplit("--port ", 1)[1].split()[0])
    assert suggested != port and app_launcher.port_is_free(suggested)


@pytest.mark.slow
def test_the_dashboard_ends_with_its_launcher(tmp_path):
    """`lrt-lab app` killed outright (SIGKILL: no cleanup runs) must not leave `streamlit run`
    serving."""
    import os
    import signal
    import socket
    import subprocess
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(APP).parent.parent),
        "OMP_NUM_THREADS": "1",
        "STREAMLIT_SERVER_HEADLESS": "true",
    }
    parent = subprocess.Popen(
        [sys.executable, "-m", "lrt_lab", "app", "--runs", str(tmp_path), "--port", str(port)],
        env=env,
        cwd=tmp_path,
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    children_file = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
    try:
        deadline = time.monotonic() + 60
        child = None
        while child is None and time.monotonic() < deadline:
            text = children_file.read_text().split() if children_file.exists() else []
            child = int(text[0]) if text else None
            time.sleep(0.2)
        assert child is not None, "lrt-lab app started no child"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 15
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            stat = (
                Path(f"/proc/{child}/stat").read_text()
                if Path(f"/proc/{child}/stat").exists()
                else ""
            )
            if stat.split(") ")[-1].startswith("Z"):
                break  # exited, not yet reaped by init
            time.sleep(0.2)
        alive = Path(f"/proc/{child}/stat").exists() and not Path(
            f"/proc/{child}/stat"
        ).read_text().split(") ")[-1].startswith("Z")
        if alive:
            os.kill(child, signal.SIGKILL)
        assert not alive, "streamlit run kept serving after lrt-lab app was killed"
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.slow
def test_trainer_frontier_on_the_committed_store(monkeypatch):
    """The committed A5 study: the page opens on a5_prefix at length 16, one point per frontier run,
    and follows the controls."""
    from lrt_results.report import frontier_points

    store = Path(__file__).resolve().parents[1] / "experiments" / "results"
    at = run_app(monkeypatch, store)
    assert_clean(at)
    (tab,) = [t for t in at.tabs if t.label == "Trainer frontier"]
    assert tab.selectbox(key="frontier_task").value == ("a5_prefix", 16)
    charts = [e for e in tab if getattr(e, "type", "") == "vega_lite_chart"]
    assert len(charts) == 1
    expect = frontier_points(load_runs(store), "a5_prefix", 16)
    summary = tab.dataframe[0].value
    assert sorted(summary["trainer"]) == sorted(expect["trainer"].unique())
    assert summary["seeds"].sum() == len(expect)
    assert summary.set_index("trainer")["learned"].to_dict() == (
        (expect["pos90_exact@16"] == 16).groupby(expect["trainer"]).sum().to_dict()
    )
    tab.selectbox(key="frontier_length").set_value(64)
    tab.radio(key="frontier_x").set_value("wall clock")
    at.run()
    assert_clean(at)
    _delta_reads_the_study(at, store)
    # a page of curves opens on the task's own figure, recorded at every evaluation
    assert page(at, "Training curves").selectbox(key="curve_metric").value == "pos90_exact@16"


def _delta_reads_the_study(at, store: Path) -> None:
    """The Delta tab of the committed store opens on the A5 trainer study (experiments/
    a5_trainers.toml): its arms against its baseline, paired by seed, on its primary metric, with
    the direction the metric has; each arm's delta has the sign of the study's own effect (read
    from the spec's grid, which the page does not use), and the caption says lower is better."""
    from lrt_lab.training.sweep import expand, load_spec
    from lrt_results.study import parse_study, study_table

    spec_path = store.parent / "a5_trainers.toml"
    spec = load_spec(spec_path)
    study = parse_study(spec["study"])
    names = [cfg.run_name for cfg in expand(spec)]
    effects = study_table(load_runs(store), study, run_names=names, n_resamples=999)
    effects = effects[effects["metric"] == study.primary].set_index("b")["effect"]
    tab = page(at, "Delta")
    assert tab.radio(key="delta_scope").value == "the study"
    (metric,) = [s for s in tab.selectbox if s.label == "metric"]
    assert metric.value == study.primary == "ce_exact@16"
    (baseline,) = [s for s in tab.selectbox if s.label == "baseline"]
    assert baseline.value.split(" | ")[0] == "transformer"
    table = tab.dataframe[0].value.set_index("group")
    assert len(table) == len(effects)
    for group, row in table.iterrows():
        effect = effects[group.split(" | ")[0]]
        assert (float(row["delta"]) > 0) == (effect > 0), (group, row["delta"], effect)
        assert row["pairs"] == 8
    captions = " ".join(c.value for c in tab.caption)
    assert "lower is better for ce_exact@16" in captions and "higher is better" not in captions


@pytest.mark.slow
def test_a_text_store_reads_bits_per_byte_on_every_tab(monkeypatch):
    """The committed scaling store (byte-level text, whose pos@90 is 0 for every run): Compare,
    Trainer frontier and Length generalisation show BPB (exact-decoding cross-entropy / ln 2 from
    each run's summary), never pos@90; the Delta tab opens on the exact cross-entropy."""
    import math

    store = Path(__file__).resolve().parents[1] / "experiments" / "scaling_runs"
    at = run_app(monkeypatch, store)
    assert_clean(at)
    runs = load_runs(store)
    bpb = runs["summary.eval.ce_exact@256"] / math.log(2)
    compare = page(at, "Compare").dataframe[0].value
    assert "exact BPB at 256 (1x)" in compare.columns
    assert not [c for c in compare.columns if "pos@90" in c]
    frontier = page(at, "Trainer frontier").dataframe[0].value
    assert "bpb_exact@256" in frontier.columns and "learned" not in frontier.columns
    cells = frontier["bpb_exact@256"].str.split(" ").str[0].astype(float)
    assert cells.between(bpb.min() - 0.01, bpb.max() + 0.01).all()
    length = page(at, "Length generalisation").dataframe[0].value
    assert "BPB exact" in length.columns and "pos@90 exact" not in length.columns
    (metric,) = [s for s in page(at, "Delta").selectbox if s.label == "metric"]
    assert metric.value == "ce_exact@256"


# Many groups: labels, the group picker, bands, the delta view -------------------------------------
# Runs written by hand (app_helpers.synthetic_store): four groups that differ only in lr_scale.
BASE = {s: [4.0, 3.0, 2.0, 1.0 + 0.1 * s] for s in (0, 1, 2)}
FAST = {s: [3.5 + o, 2.0 + o, 1.0 + o, 0.5 + o] for s, o in ((0, 0.0), (1, 0.2), (2, -0.05))}
PAIR = {s: [4.0 + 0.3 * s, 3.5 + 0.3 * s, 2.5 + 0.3 * s, 1.5 + 0.3 * s] for s in (0, 1)}
LONE = {7: [5.0, 4.0, 3.0, 2.0]}
LABELS = {1: "transformer | lr_scale=1", 2: "transformer | lr_scale=2"}
LABELS |= {3: "transformer | lr_scale=3", 4: "transformer | lr_scale=4"}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return template_run(tmp_path_factory.mktemp("template"))


@pytest.fixture(scope="module")
def four_groups(template, tmp_path_factory) -> Path:
    """BASE, FAST (trained at twice the compute per step, as an Interleaved(2) run is), PAIR (two
    seeds) and LONE (a seed the baseline does not have), four loss records each."""
    runs = []
    for scale, seeds, cost in ((1, BASE, 1.0), (2, FAST, 2.0), (3, PAIR, 1.0), (4, LONE, 1.0)):
        runs += [
            {
                "name": f"lr{scale}-s{seed}",
                "seed": seed,
                "train": {"lr_scale": float(scale)},
                "records": loss_records(losses, cost),
            }
            for seed, losses in seeds.items()
        ]
    return synthetic_store(tmp_path_factory.mktemp("four_groups"), template, runs)


def read_runs(store):
    from lrt_app import store_data

    return store_data.cached_runs(str(store), False, store_data.store_signature(store))[0]


def chart_specs(tab) -> list[dict]:
    return [json.loads(e.proto.spec) for e in tab if getattr(e, "type", "") == "vega_lite_chart"]


def color_domains(spec) -> list[list]:
    """The colour scales' domains anywhere in a chart spec: what its legends list."""
    found = []
    if isinstance(spec, dict):
        color = spec.get("color")
        if isinstance(color, dict) and isinstance(color.get("scale", {}).get("domain"), list):
            found.append(color["scale"]["domain"])
        for v in spec.values():
            found += color_domains(v)
    elif isinstance(spec, list):
        for v in spec:
            found += color_domains(v)
    return found


def t_interval(values) -> tuple[float, float, float]:
    values = np.asarray(values, dtype=float)
    mean, n = values.mean(), len(values)
    half = sps.t.ppf(0.975, n - 1) * values.std(ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half


def test_groups_that_differ_in_one_field_are_named_by_that_field_alone(four_groups):
    from lrt_app import store_data

    runs = read_runs(four_groups)
    labels = store_data.group_labels(runs)
    assert set(labels) == set(LABELS.values())
    by_run = dict(zip(runs["run"], labels))
    assert by_run["lr2-s1"] == LABELS[2] and by_run["lr4-s7"] == LABELS[4]
    # labelled against the runs a chart shows: two groups, the same single field
    two = runs[runs["run"].str.startswith(("lr1-", "lr3-"))]
    assert set(store_data.group_labels(two)) == {LABELS[1], LABELS[3]}


def test_a_band_over_two_seeds_is_their_range_and_no_band_leaves_the_metric_range():
    from lrt_app import store_data

    def long(curves):
        return pd.DataFrame(
            [
                {"group": "g", "task": "t", "run": f"r{i}", "x": float(x), "y": y}
                for i, ys in enumerate(curves)
                for x, y in enumerate(ys)
            ]
        )

    two = long([[0.05, 0.01, 0.30], [0.50, 0.02, 0.31]])
    band = store_data.seed_band(two, bounds=store_data.metric_bounds("loss"))
    assert set(band["band"]) == {"min-max"} and set(band["n"]) == {2}
    assert band["lo"].tolist() == [0.05, 0.01, 0.30] and band["hi"].tolist() == [0.50, 0.02, 0.31]
    # the t-interval the band used to be: mean +- 12.7 standard errors, far below 0
    mean, lo, _ = t_interval([0.05, 0.50])
    assert lo < 0 <= band["lo"].min()

    three = long([[0.01, 0.5], [0.02, 0.6], [0.90, 0.7]])
    band = store_data.seed_band(three, bounds=store_data.metric_bounds("loss"))
    mean, lo, hi = t_interval([0.01, 0.02, 0.90])
    assert set(band["band"]) == {"95% t-interval"} and lo < 0
    assert band["lo"].iloc[0] == 0.0 and band["hi"].iloc[0] == pytest.approx(hi)
    assert band["mean"].iloc[0] == pytest.approx(mean)
    assert band["lo"].iloc[1] == pytest.approx(t_interval([0.5, 0.6, 0.7])[1])
    # an accuracy stays in [0, 1]; one seed has no band; "min-max" is asked for by name too
    acc = store_data.seed_band(three, bounds=store_data.metric_bounds("acc_exact@16"))
    assert acc["hi"].max() <= 1.0 and acc["lo"].min() >= 0.0
    assert store_data.metric_bounds("pos90_exact@32") == (0.0, 32.0)
    one = store_data.seed_band(long([[0.2, 0.1]]))
    assert set(one["band"]) == {"none"} and (one["lo"] == one["hi"]).all()
    spread = store_data.seed_band(three, band="min-max")
    assert set(spread["band"]) == {"min-max"} and spread["lo"].iloc[0] == 0.01


def test_delta_against_a_baseline_is_the_hand_computed_difference(four_groups):
    """Paired by seed at matched steps (a t-interval over 3 pairs, min to max over 2), unpaired
    where no seed is shared, and at matched compute and FLOPs through interpolation."""
    from lrt_app import store_data

    runs = read_runs(four_groups)
    long, notes = store_data.curves(runs, "loss", "steps")
    assert not notes
    deltas, notes = store_data.delta_curves(long, LABELS[1])
    summary = store_data.delta_summary(deltas).set_index("group")
    assert list(summary.index) == [LABELS[2], LABELS[3], LABELS[4]]
    assert set(summary["x"]) == {4.0}

    fast = [FAST[s][3] - BASE[s][3] for s in (0, 1, 2)]
    mean, lo, hi = t_interval(fast)
    row = summary.loc[LABELS[2]]
    assert (row["delta"], row["lo"], row["hi"]) == pytest.approx((mean, lo, hi))
    assert row["band"] == "95% t-interval" and row["pairs"] == 3 and row["seeds"] == "0, 1, 2"
    every_step = deltas[deltas["group"] == LABELS[2]]
    assert every_step["x"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert every_step["mean"].tolist() == pytest.approx(
        [np.mean([FAST[s][i] - BASE[s][i] for s in (0, 1, 2)]) for i in range(4)]
    )

    pair = [PAIR[s][3] - BASE[s][3] for s in (0, 1)]
    row = summary.loc[LABELS[3]]
    assert row["delta"] == pytest.approx(np.mean(pair)) and row["band"] == "min-max"
    assert (row["lo"], row["hi"]) == pytest.approx((min(pair), max(pair)))

    row = summary.loc[LABELS[4]]
    unpaired = LONE[7][3] - np.mean([BASE[s][3] for s in (0, 1, 2)])
    assert row["delta"] == pytest.approx(unpaired) and row["band"] == "none"
    assert row["pairs"] == 0 and math.isnan(row["lo"]) and "unpaired" in row["seeds"]
    assert any("no seed in common" in n for n in notes)

    # matched compute: FAST ran 2 compute units a step (200, 400, ...), the baseline 1 (100, ...):
    # over the range both cover (200 to 400), FAST at step 1.5 is the mean of steps 1 and 2
    for axis, unit in (("compute", 1.0), ("FLOPs", 10.0)):
        long, _ = store_data.curves(runs, "loss", axis)
        d, _ = store_data.delta_curves(long, LABELS[1])
        fast_at = d[d["group"] == LABELS[2]].set_index("x")["mean"]
        assert fast_at.index.tolist() == [200 * unit, 300 * unit, 400 * unit]
        at_300 = [(FAST[s][0] + FAST[s][1]) / 2 - BASE[s][2] for s in (0, 1, 2)]
        at_400 = [FAST[s][1] - BASE[s][3] for s in (0, 1, 2)]
        assert fast_at.loc[300 * unit] == pytest.approx(np.mean(at_300))
        assert fast_at.loc[400 * unit] == pytest.approx(np.mean(at_400))


def test_the_delta_page_shows_the_hand_computed_numbers(four_groups, monkeypatch):
    at = run_app(monkeypatch, four_groups)
    assert_clean(at)
    tab = page(at, "Delta")
    (metric,) = [s for s in tab.selectbox if s.label == "metric"]
    # these runs recorded no evaluation over training: the training loss is all there is
    assert metric.value == "loss"
    (baseline,) = [s for s in tab.selectbox if s.label == "baseline"]
    baseline.set_value(LABELS[1])
    tab.slider(key="delta_smoothing").set_value(0.0)
    tab.radio(key="delta_x").set_value("steps")
    at.run()
    assert_clean(at)
    tab = page(at, "Delta")
    assert "FLOPs" in tab.radio(key="delta_x").options
    table = tab.dataframe[0].value.set_index("group")
    mean, lo, hi = t_interval([FAST[s][3] - BASE[s][3] for s in (0, 1, 2)])
    assert table.loc[LABELS[2], "delta"] == f"{mean:.4g}"
    assert table.loc[LABELS[2], "interval"] == f"[{lo:.4g}, {hi:.4g}] (95% t-interval)"
    assert table.loc[LABELS[3], "interval"] == "[0.5, 0.7] (min-max)"
    assert table.loc[LABELS[4], "delta"] == f"{2.0 - 1.1:.4g}"
    assert table.loc[LABELS[4], "pairs"] == 0
    (spec,) = chart_specs(tab)
    assert color_domains(spec) == [[LABELS[2], LABELS[3], LABELS[4]]] * 2

    curves = page(at, "Training curves")
    caption = " ".join(c.value for c in curves.caption)
    assert "95% t-interval over seeds for 2 group(s) of 3 seed(s)" in caption
    assert "min to max of the seeds for 1 group(s) of 2 seed(s)" in caption
    assert "clipped to the metric's range (loss >= 0)" in caption


def test_the_group_picker_opens_on_at_most_eight_groups(template, tmp_path, monkeypatch):
    """Ten groups that differ only in lr_scale: the picker shows eight, those with the most seeds
    first, says two are hidden, and each chart names its groups by lr_scale alone."""
    runs = [
        {
            "name": f"lr{k}-s{seed}",
            "seed": seed,
            "train": {"lr_scale": float(k)},
            "records": loss_records([3.0 - 0.1 * k, 2.0, 1.0]),
        }
        for k in range(1, 11)
        for seed in ((0, 1) if k >= 9 else (0,))
    ]
    store = synthetic_store(tmp_path / "ten", template, runs)
    at = run_app(monkeypatch, store)
    assert_clean(at)
    for title in ("Training curves", "Delta", "Length generalisation"):
        tab = page(at, title)
        (picker,) = [m for m in tab.multiselect if m.label == "groups"]
        assert len(picker.options) == 10 and len(picker.value) == 8, title
        assert {"transformer | lr_scale=9", "transformer | lr_scale=10"} <= set(picker.value)
        assert "8 of 10 groups shown; 2 hidden" in " ".join(c.value for c in tab.caption)
    (spec,) = chart_specs(page(at, "Training curves"))
    (domain,) = {tuple(d) for d in color_domains(spec)}
    assert len(domain) == 8 and all(g.startswith("transformer | lr_scale=") for g in domain)
    assert all(g.count("|") == 1 for g in domain)
    # every group, on demand
    (picker,) = [m for m in page(at, "Training curves").multiselect if m.label == "groups"]
    picker.set_value(picker.options).run()
    assert_clean(at)
    tab = page(at, "Training curves")
    assert "10 of 10 groups shown." in " ".join(c.value for c in tab.caption)
    (spec,) = chart_specs(tab)
    assert {len(d) for d in color_domains(spec)} == {10}


def test_legends_fit_the_window_and_never_outgrow_the_plot():
    from lrt_app import charts

    for labels in (["a"], [f"group {i}" for i in range(48)], ["x" * 300] * 3):
        legend = charts.legend_for(labels)
        width = legend["columns"] * (legend["labelLimit"] + charts.SYMBOL_PX)
        assert width <= charts.LEGEND_WIDTH, labels[:2]
    many = charts.color_encoding([f"group {i}" for i in range(48)], "group")
    spec = {"height": 300, "mark": "line", "encoding": {"color": many}}
    rows = charts.legend_rows(spec)
    assert rows == -(-48 // many["legend"]["columns"])
    assert charts.ROW_PX * rows > 300  # so draw_chart must grow the plot


def test_a_wrapped_facet_grows_its_panels_to_the_legend_under_it():
    from lrt_app import charts

    many = charts.color_encoding([f"group {i}" for i in range(100)], "group")
    legend_px = charts.LEGEND_TITLE_PX + charts.ROW_PX * -(-100 // many["legend"]["columns"])
    cells = pd.DataFrame({"length": [16, 32, 64, 16, 32], "y": range(5)})  # 3 panels
    spec = {
        "data": {"name": "cells"},
        "facet": {"field": "length", "type": "ordinal"},
        "columns": 2,  # 3 panels in 2 rows
        "spec": {"height": 200, "mark": "line", "encoding": {"color": many}},
    }
    grown = charts.fit_to_legend(spec, cells=cells)
    assert 2 * grown["spec"]["height"] >= legend_px > 2 * 200
    assert 2 * (grown["spec"]["height"] - 1) < legend_px  # no taller than it must be
    # a single plot grows to the legend itself; a short legend leaves either as it was
    single = {"height": 300, "mark": "line", "encoding": {"color": many}}
    assert charts.fit_to_legend(single)["height"] == legend_px
    few = charts.color_encoding(["a", "b"], "group")
    spec["spec"]["encoding"]["color"] = few
    assert charts.fit_to_legend(spec, cells=cells)["spec"]["height"] == 200
