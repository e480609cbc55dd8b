"""A damaged run store: readers skip and report the damaged file, every other run reads as before.
Also the command line's file errors, temp-file cleanup and checkpoint fallback on resume."""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import tiny_train_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lrt_lab.commands.cli import main
from lrt_lab.store.results import (
    DamagedFileError,
    Run,
    evaluations,
    load_metrics,
    load_runs,
    load_table,
    read_metrics,
)
from lrt_lab.training.loop import train
from lrt_results.report import comparison_table
from lrt_results.study import at_step


def make_run(root: Path, name: str, seed: int) -> Run:
    """A complete run folder written through the store's own writers (no training needed)."""
    config = {
        "train": {"task": "a5_prefix", "seed": seed, "length": 8},
        "model": {"n_layer": 2},
        "params": {"total": 10},
        "kind": "lrt",
        "schedule": "interleaved:2",
        "schedule_cost": 2.0,
        "forwards_per_token": 1,
        "task_vocab_size": 60,
    }
    run = Run.create(root, name, config)
    for step in (1, 2, 3):
        run.log(
            {
                "kind": "train",
                "step": step,
                "loss": 3.0 / step,
                "stage_losses": [1.0, 2.0],
                "tokens": 8 * step,
            }
        )
    run.log({"kind": "eval", "step": 3, "pos90_exact@8": seed + 1, "acc_exact@8": 0.5})
    run.write_table(
        "per_position",
        pd.DataFrame({"length": [8], "mode": ["exact"], "position": [1], "accuracy": [0.5]}),
    )
    run.write_summary(
        {
            "status": "complete",
            "steps": 3,
            "final_loss": 1.0,
            "wall_time_s": 1.5,
            "tokens": 24,
            "compute_tokens": 48.0,
            "schedule_cost": 2.0,
            "forwards_per_token": 1,
            "eval": {"pos90_exact@8": seed + 1, "acc_exact@8": 0.5},
        }
    )
    return run


def _rewrite_json(path: Path, change):
    obj = json.loads(path.read_text())
    change(obj)
    path.write_text(json.dumps(obj))


def _insert_bytes(path: Path, data: bytes, at: int):
    raw = path.read_bytes()
    path.write_bytes(raw[:at] + data + raw[at:])


def _plain_log(run_dir: Path) -> Path:
    """The run's metrics.jsonl, put back from its .xz (a complete run's log is compacted): the
    damage below is damage of the plain file; tests/test_store_compact.py damages the .xz."""
    Run(run_dir).expand_metrics()
    return run_dir / "metrics.jsonl"


def _dir_in_place(path: Path):
    path.unlink()
    path.mkdir()
    (path / "x").write_text("{}")


DEEP = b"[" * 100_000 + b"]" * 100_000  # deeper than Python's recursion limit
HUGE = b"7" * 5000  # an integer of more digits than json.loads converts

# damage name -> (function of the run folder, the file it damages)
DAMAGE = {
    "config.json non-UTF-8 byte": (
        lambda d: _insert_bytes(d / "config.json", b"\xff\xfe", 5),
        "config.json",
    ),
    "config.json truncated": (
        lambda d: (d / "config.json").write_bytes((d / "config.json").read_bytes()[:20]),
        "config.json",
    ),
    "config.json a directory": (lambda d: _dir_in_place(d / "config.json"), "config.json"),
    "config.json a list": (lambda d: (d / "config.json").write_text("[1, 2]"), "config.json"),
    "config.json deep nesting": (lambda d: (d / "config.json").write_bytes(DEEP), "config.json"),
    "config train a string": (
        lambda d: _rewrite_json(d / "config.json", lambda o: o.update(train="x")),
        "config.json",
    ),
    "summary.json non-UTF-8 byte": (
        lambda d: _insert_bytes(d / "summary.json", b"\x80", 3),
        "summary.json",
    ),
    "summary.json a directory": (lambda d: _dir_in_place(d / "summary.json"), "summary.json"),
    "summary.json deep nesting": (
        lambda d: (d / "summary.json").write_bytes(b'{"eval": ' + DEEP + b"}"),
        "summary.json",
    ),
    "summary eval a list": (
        lambda d: _rewrite_json(d / "summary.json", lambda o: o.update(eval=[1, 2])),
        "summary.json",
    ),
    "summary eval null": (
        lambda d: _rewrite_json(d / "summary.json", lambda o: o.update(eval=None)),
        "summary.json",
    ),
    "summary eval value a dict": (
        lambda d: _rewrite_json(
            d / "summary.json", lambda o: o["eval"].update({"pos90_exact@8": {"a": 1}})
        ),
        "summary.json",
    ),
    "summary final_loss a string": (
        lambda d: _rewrite_json(d / "summary.json", lambda o: o.update(final_loss="1.0")),
        "summary.json",
    ),
    "summary steps a bool": (
        lambda d: _rewrite_json(d / "summary.json", lambda o: o.update(steps=True)),
        "summary.json",
    ),
    # more digits than Python converts to an int (sys.get_int_max_str_digits(): 4300)
    "summary.json a 5000-digit integer": (
        lambda d: (d / "summary.json").write_bytes(
            b'{"status": "complete", "steps": ' + HUGE + b"}"
        ),
        "summary.json",
    ),
    # an integer no float holds (the report's statistics overflowed on it)
    "summary eval a 400-digit integer": (
        lambda d: (d / "summary.json").write_bytes(
            b'{"status": "complete", "eval": {"pos90_exact@8": ' + b"9" * 400 + b"}}"
        ),
        "summary.json",
    ),
    "config.json a 5000-digit integer": (
        lambda d: (d / "config.json").write_bytes(b'{"train": {"seed": ' + HUGE + b"}}"),
        "config.json",
    ),
}
# metrics.jsonl damage: the run stays listed; its unreadable lines are dropped and counted
METRICS_DAMAGE = {
    "garbage bytes line": lambda p: _insert_bytes(p, b"\xff\x00\xc3garbage\n", 0),
    "JSON that is not an object": lambda p: p.write_bytes(
        p.read_bytes() + b'[1, 2]\n3\nnull\n"s"\n'
    ),
    "deep nesting": lambda p: p.write_bytes(p.read_bytes() + b'{"a": ' + DEEP + b"}\n"),
    "string step": lambda p: p.write_bytes(
        p.read_bytes() + b'{"kind": "train", "step": "4", "loss": 1}\n'
    ),
    "string loss": lambda p: p.write_bytes(
        p.read_bytes() + b'{"kind": "train", "step": 4, "loss": "x"}\n'
    ),
    "cut last line": lambda p: p.write_bytes(p.read_bytes() + b'{"kind": "train", "st'),
    "a 5000-digit integer": lambda p: p.write_bytes(
        p.read_bytes() + b'{"kind": "train", "step": 4, "loss": ' + HUGE + b"}\n"
    ),
}


@pytest.fixture()
def store(tmp_path):
    root = tmp_path / "store"
    for i, name in enumerate(["good-a", "good-b", "victim"]):
        make_run(root, name, seed=i)
    return root


def _quiet_load_runs(root, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_runs(root, **kw)


def _good_rows(df):
    return df[df["run"].str.startswith("good")].reset_index(drop=True)


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_run_file_is_skipped_and_reported_and_the_others_read_as_before(
    store, damage, capsys
):
    before = _quiet_load_runs(store)
    metrics_before = {n: load_metrics(store / n) for n in ("good-a", "good-b")}
    apply, filename = DAMAGE[damage]
    apply(store / "victim")

    with pytest.warns(UserWarning, match="victim"):
        df = load_runs(store)
    assert sorted(df["run"]) == ["good-a", "good-b"]
    reason = dict(df.attrs["skipped"])["victim"]
    assert reason.startswith("damaged") and filename in reason
    pd.testing.assert_frame_equal(_good_rows(df), _good_rows(before), check_like=True)
    for name, m in metrics_before.items():
        pd.testing.assert_frame_equal(load_metrics(store / name), m)
    # the Run accessors say which file is damaged, as a ValueError
    with pytest.raises(DamagedFileError, match=filename.split(".")[0]):
        run = Run(store / "victim")
        _ = (run.config, run.summary)  # reading them is what raises
    # the report over the store still works and counts the two good runs
    table = comparison_table(df)
    assert table["n"].tolist() == [2]
    capsys.readouterr()
    assert main(["report", str(store)]) == 0
    assert "lrt interleaved:2" in capsys.readouterr().out


@pytest.mark.parametrize("damage", list(METRICS_DAMAGE))
def test_damaged_metrics_lines_are_dropped_and_counted(store, damage):
    good = load_metrics(store / "victim")
    METRICS_DAMAGE[damage](_plain_log(store / "victim"))
    with pytest.warns(UserWarning, match="victim"):
        df = load_metrics(store / "victim")
    assert df.attrs["dropped_lines"] >= 1
    pd.testing.assert_frame_equal(df, good)  # exactly the readable records, unchanged
    assert load_metrics(store / "victim", kind="train")["step"].tolist() == [1, 2, 3]
    assert sorted(_quiet_load_runs(store)["run"]) == [
        "good-a",
        "good-b",
        "victim",
    ]  # the run itself is fine


def test_reading_one_kind_gives_what_filtering_every_record_gives(tmp_path):
    """The kind filter passes over lines unparsed; the reference parses every line (json.loads)
    and filters by the field. Lines written other ways than the library's (no spaces, the kind
    nested, the kind in a string) and a cut line are among them, plain and compacted alike."""
    run = Run(tmp_path / "r")
    run.path.mkdir()
    lines = [
        '{"kind": "train", "loss": 1.0, "step": 1}',
        '{"kind": "eval", "loss": 2.0, "step": 1}',
        '{"kind":"eval","step":2}',  # another writer's separators
        '{"extra": {"kind": "train"}, "kind": "eval", "step": 3}',  # a nested kind
        '{"kind": "train", "note": "\\"kind\\": \\"eval\\"", "step": 4}',  # named in a string
        '{"kind": "other", "step": 5}',
        '{"step": 6}',  # no kind
        '{"kind": "eval", "st',  # cut by a kill
    ]
    (run.path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    for compacted in (False, True):
        if compacted:
            run.compact_metrics()
        every, dropped = read_metrics(run.path)
        assert dropped == 1 and len(every) == 7
        for kind in ("train", "eval", "other", "missing"):
            expected = [json.loads(x) for x in lines[:-1] if json.loads(x).get("kind") == kind]
            assert read_metrics(run.path, kind)[0] == expected, (kind, compacted)
            assert run.metrics_records(kind=kind) == expected
        assert read_metrics(run.path, "eval")[1] == 1  # the cut line says eval: still counted


def test_a_directory_in_place_of_metrics_gives_an_empty_table_and_a_report(store):
    _dir_in_place(_plain_log(store / "victim"))
    with pytest.warns(UserWarning, match="metrics.jsonl"):
        df = load_metrics(store / "victim")
    assert df.empty and "metrics.jsonl" in df.attrs["damaged"]
    assert len(load_metrics(store / "good-a", kind="train")) == 3


def test_evaluations_and_at_step_read_each_runs_eval_lines(tmp_path):
    """Every eval line that measured the metric, by run and row label; at_step picks a run's value
    at one step and gives NaN to a run that did not evaluate there or never measured it."""
    root = tmp_path / "store"
    made = {name: make_run(root, name, seed=i) for i, name in enumerate("abc")}
    # each logged pos90_exact@8 = seed + 1 at step 3
    made["a"].log({"kind": "eval", "step": 5, "pos90_exact@8": 7, "flops": 50.0})
    made["c"].log({"kind": "eval", "step": 5, "acc_exact@8": 0.9})  # no pos90
    made["c"].log({"kind": "train", "step": 5, "pos90_exact@8": 99})  # not an eval
    runs = load_runs(root).set_index(pd.Index([10, 20, 30]))  # labels that are not positions
    evals = evaluations(runs, "pos90_exact@8")
    got = sorted(zip(evals["row"], evals["run"], evals["step"], evals["value"]))
    assert got == [(10, "a", 3, 1), (10, "a", 5, 7), (20, "b", 3, 2), (30, "c", 3, 3)]
    assert (evals["x"] == evals["step"]).all()
    by_flops = evaluations(runs, "pos90_exact@8", x="flops")
    assert by_flops[["run", "step", "x"]].values.tolist() == [["a", 5, 50.0]]
    assert evaluations(runs, "no_such_metric").empty
    five = at_step(runs, "pos90_exact@8", 5)
    assert five.index.tolist() == [10, 20, 30]
    assert five[10] == 7 and np.isnan(five[20]) and np.isnan(five[30])
    assert at_step(runs, "pos90_exact@8", 3).tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"", b'a,b\n1,"2\n'])
def test_a_damaged_table_reads_as_missing(store, content):
    (store / "victim" / "tables" / "per_position.csv").write_bytes(content)
    with pytest.warns(UserWarning, match="per_position"):
        assert load_table(store / "victim", "per_position") is None
    assert load_table(store / "good-a", "per_position")["accuracy"].tolist() == [0.5]


# Random byte damage anywhere: whatever is hit, no reader raises and the other runs are unaffected.
@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    filename=st.sampled_from(["config.json", "summary.json", "metrics.jsonl", "metrics.jsonl.xz"]),
    where=st.floats(0, 1),
    junk=st.binary(min_size=0, max_size=6),
    cut=st.booleans(),
)
def test_random_byte_damage_never_breaks_the_readers(filename, where, junk, cut):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, name in enumerate(["good-a", "victim"]):
            make_run(root, name, seed=i)
        reference = _good_rows(_quiet_load_runs(root))
        path = (
            _plain_log(root / "victim")
            if filename == "metrics.jsonl"
            else root / "victim" / filename
        )
        raw = path.read_bytes()
        at = int(where * len(raw))
        path.write_bytes(raw[:at] + junk + (b"" if cut else raw[at:]))

        df = _quiet_load_runs(root, include_incomplete=True)
        good = _good_rows(df)  # columns the damage invented (a renamed key) are empty for it
        pd.testing.assert_frame_equal(good[reference.columns], reference)
        assert good.drop(columns=reference.columns).isna().all().all()
        assert "victim" in set(df["run"]) | set(dict(df.attrs["skipped"]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            metrics = load_metrics(root / "victim")
        if len(metrics):
            assert metrics["step"].map(type).eq(int).all()
        if "victim" in set(df["run"]) and "summary.eval.acc_exact@8" in df.columns:
            ok = df.loc[df["run"] == "victim", "summary.eval.acc_exact@8"]
            assert ok.map(lambda v: v is None or isinstance(v, (int, float, str))).all()


# Command-line file errors
# --------------------------------------------------------------------------
TRAIN = [
    "train",
    "--task",
    "group_prefix",
    "--task-opt",
    "group=S3",
    "--length",
    "4",
    "--preset",
    "tiny",
    "--steps",
    "4",
    "--batch-size",
    "4",
    "--eval-lengths",
    "4",
    "--eval-size",
    "4",
    "--device",
    "cpu",
    "--quiet",
    "--checkpoint-every",
    "1",
]


def _error(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("lrt-lab: error:"), err
    return err


def test_cli_file_errors_say_what_is_wrong(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("afile").write_text("x")
    assert "'afile' is a file" in _error(capsys, TRAIN + ["--out", "afile/store"])
    assert "out='afile' is invalid (is a file)" in _error(capsys, TRAIN + ["--out", "afile"])
    assert "no such directory" in _error(capsys, ["report", "nonexistent_dir"])
    assert "no such file" in _error(capsys, ["sweep", "nope.toml"])
    Path("bad.toml").write_bytes(b"\xff[sweep]")
    assert "not UTF-8" in _error(capsys, ["sweep", "bad.toml"])
    Path("letters.toml").write_text('[sweep]\ntasks = "copy"\nmodels = ["lrt"]\n')
    assert "sweep.tasks='copy' is invalid; allowed: a non-empty list of task names" in _error(
        capsys, ["sweep", "letters.toml"]
    )
    assert "pass --name NAME" in _error(capsys, TRAIN + ["--out", "store", "--resume"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "afile",
        "bad.toml",
        "letters.toml",
    ]  # nothing written


def test_resume_names_the_differing_arguments_and_the_step(tmp_path, capsys):
    out = str(tmp_path / "store")
    assert main(TRAIN + ["--out", out, "--name", "r"]) == 0
    err = _error(
        capsys, TRAIN + ["--out", out, "--name", "r", "--resume", "--steps", "6", "--seed", "3"]
    )
    assert "steps: 4 in config.json, 6 now" in err and "seed: 0 in config.json, 3 now" in err


# Resume: temp files and checkpoint fallback -----------------------------------------------------
def tiny(**kw):
    """helpers.TINY_RUN at length 4, trained by Interleaved(2), checkpointed every 2 steps."""
    return tiny_train_config(
        **{
            "length": 4,
            "schedule": "interleaved:2",
            "steps": 8,
            "eval_lengths": (4,),
            "eval_size": 8,
            "checkpoint_every": 2,
            "name": "r",
            **kw,
        }
    )


def test_resume_falls_back_to_the_older_checkpoint_and_removes_temp_files(tmp_path, capsys):
    reference = train(tiny(), out=tmp_path / "ref", progress=False)
    run = train(tiny(), out=tmp_path / "store", progress=False, stop_after=6)
    ckpts = run.checkpoints()
    assert [p.name for p in ckpts] == ["step_0000004.pt", "step_0000006.pt"]
    ckpts[-1].write_bytes(ckpts[-1].read_bytes()[:1000])  # a truncated newest checkpoint
    leftovers = [
        run.path / "checkpoints" / ".ckpt.abc123.tmp",
        run.path / ".summary.json.x.tmp",
        run.path / ".metrics.y.tmp",
    ]
    for p in leftovers:
        p.write_bytes(b"partial")
    capsys.readouterr()
    with pytest.warns(UserWarning, match="step_0000006.pt is unreadable"):
        resumed = train(tiny(), out=tmp_path / "store", resume=True, progress=True)
    assert "resuming r from step 4 (step_0000004.pt)" in capsys.readouterr().err
    assert not any(p.exists() for p in leftovers)
    steps = load_metrics(resumed, kind="train")["step"].tolist()
    assert steps == list(range(1, 9))  # every step exactly once
    # the steps after the fallback are the uninterrupted run's steps (same data, same state)
    ref = load_metrics(reference, kind="train")["loss"].tolist()
    assert load_metrics(resumed, kind="train")["loss"].tolist() == pytest.approx(ref, rel=1e-5)


def test_resume_drops_a_metrics_line_holding_an_oversized_number(tmp_path, capsys):
    """A metrics line with a 5000-digit integer is a damaged line, not a damaged run: --resume
    continues, and the run ends with every step logged once."""
    cfg = tiny_train_config(steps=6, checkpoint_every=3, name="r")
    run = train(cfg, out=tmp_path, progress=False, stop_after=4)  # checkpoints at 3, 4
    with open(run.path / "metrics.jsonl", "ab") as f:
        f.write(b'{"kind": "train", "step": 5, "loss": ' + HUGE + b"}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(cfg, out=tmp_path, resume=True, progress=False)
    assert run.is_complete
    assert load_metrics(run, kind="train")["step"].tolist() == list(range(1, 7))


def test_resume_with_no_readable_checkpoint_fails_and_deletes_nothing(tmp_path):
    run = train(tiny(), out=tmp_path, progress=False, stop_after=4)
    for p in run.checkpoints():
        p.write_bytes(b"not a checkpoint")
    metrics = (run.path / "metrics.jsonl").read_bytes()
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="no readable checkpoint"):
        train(tiny(), out=tmp_path, resume=True, progress=False)
    assert [p.name for p in run.checkpoints()] == ["step_0000002.pt", "step_0000004.pt"]
    assert (run.path / "metrics.jsonl").read_bytes() == metrics


def test_a_failed_checkpoint_write_leaves_no_temp_file(tmp_path, monkeypatch):
    import torch

    from lrt_lab.training.checkpoints import save_checkpoint

    run = Run.create(tmp_path, "r", {"train": {}})

    def full_disk(obj, f, *a, **k):
        Path(f).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(OSError):
        save_checkpoint(run, 1, model, [], torch.Generator(), 0.0, {})
    assert list((run.path / "checkpoints").iterdir()) == []


# Checkpoints: only tensors and plain values, only the run's own, with the run's permissions ------
class _RunsCode:
    """Unpickling this calls os.makedirs(marker): what a crafted checkpoint could do instead."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.makedirs, (self.marker,))


def _crafted_checkpoint(run: Run, marker: Path) -> Path:
    """The newest checkpoint, rewritten with a value that runs code when it is unpickled."""
    import torch

    newest = run.checkpoints()[-1]
    state = torch.load(newest, weights_only=True)
    state["payload"] = _RunsCode(marker)
    torch.save(state, newest)
    return newest


def test_resume_refuses_a_checkpoint_that_would_run_code_and_runs_none(tmp_path, capsys):
    args = TRAIN + ["--out", str(tmp_path / "store"), "--name", "r"]
    assert main(args) == 0
    run = Run(tmp_path / "store" / "r")
    (run.path / "summary.json").unlink()  # as if it had not finished: --resume loads a checkpoint
    crafted = _crafted_checkpoint(run, tmp_path / "ran")
    capsys.readouterr()
    code = main([*args, "--resume"])
    err = capsys.readouterr().err
    assert not (tmp_path / "ran").exists()  # nothing was unpickled but tensors and plain values
    assert code == 2 and err.count("\n") == 1 and err.startswith("lrt-lab: error: --resume:")
    assert crafted.name in err and "could run code" in err, err
    assert crafted.exists()  # refused, not deleted: the user decides


def test_analysis_refuses_a_checkpoint_that_would_run_code(tmp_path):
    from lrt_lab.analysis.loading import load_model

    run = train(tiny(steps=2), out=tmp_path, progress=False)
    assert load_model(run).training is False  # a genuine checkpoint loads
    _crafted_checkpoint(run, tmp_path / "ran")
    with pytest.raises(ValueError, match="could run code"):
        load_model(run)
    assert not (tmp_path / "ran").exists()


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    """A 12-step run's checkpoint copied into an 8-step run of the same shapes used to be
    restored: the run ended "complete" with an evaluation at step 12."""
    import shutil

    other = train(tiny(steps=12, name="other"), out=tmp_path, progress=False)
    run = train(tiny(), out=tmp_path, progress=False, stop_after=4)
    shutil.copy(other.checkpoints()[-1], run.checkpoint_dir() / "step_0000005.pt")
    with pytest.raises(ValueError, match="belongs to run 'other', not 'r'"):
        train(tiny(), out=tmp_path, resume=True, progress=False)
    assert not run.is_complete and load_metrics(run, kind="train")["step"].max() == 4


def test_a_checkpoint_from_before_owners_were_recorded_still_resumes_unless_past_the_end(tmp_path):
    import torch

    run = train(tiny(), out=tmp_path, progress=False, stop_after=4)
    newest = run.checkpoints()[-1]
    state = torch.load(newest, weights_only=True)
    del state["owner"]
    torch.save(state, newest)
    resumed = train(tiny(), out=tmp_path, resume=True, progress=False)
    assert resumed.is_complete
    state["step"] = 99  # past the run's 8 steps: not this run's
    torch.save(state, run.checkpoint_dir() / "step_0000099.pt")
    (run.path / "summary.json").unlink()
    with pytest.raises(ValueError, match="past this run's last"):
        train(tiny(), out=tmp_path, resume=True, progress=False)


def test_checkpoints_and_rewritten_metrics_follow_the_umask(tmp_path):
    import os

    old = os.umask(0o027)
    try:
        run = train(tiny(), out=tmp_path, progress=False, stop_after=4)
        train(tiny(), out=tmp_path, resume=True, progress=False)  # rewrites metrics.jsonl
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in run.checkpoints()}
    assert modes and set(modes.values()) == {0o640}, modes
    assert run.metrics_path.stat().st_mode & 0o777 == 0o640  # compacted: the .xz
