"""The training loop, the run store, resume after a kill, sweeps, and the CLI's errors."""

import hashlib
import json
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import tiny_train_config

from lrt_lab.commands.cli import main
from lrt_lab.store.results import Run, load_metrics, load_runs, load_table
from lrt_lab.training import exitcodes
from lrt_lab.training.loop import TrainConfig, train
from lrt_lab.training.optim import lr_multiplier
from lrt_lab.training.sweep import expand, run_sweep, validate_spec

REPO = Path(__file__).resolve().parent.parent


def tiny_cfg(**kw):
    """helpers.TINY_RUN trained by Interleaved(2) for 30 steps, evaluated and checkpointed."""
    return tiny_train_config(
        **{
            "schedule": "interleaved:2",
            "steps": 30,
            "batch_size": 16,
            "eval_every": 10,
            "eval_lengths": (6, 12),
            "eval_size": 32,
            "checkpoint_every": 10,
            **kw,
        }
    )


def train_losses(run):
    return load_metrics(run, kind="train")["loss"].tolist()


def test_loss_falls_on_a_learnable_task(tmp_path):
    # S3 prefix products at length 2: position 1 copies its input, position 2 is a 6x6 table
    # (learnt within 60 steps: the last 10 losses average 0.08x the first 10, accuracy 1.0)
    run = train(
        tiny_cfg(
            length=2,
            steps=60,
            batch_size=64,
            eval_lengths=(2,),
            checkpoint_every=0,
            task_options={"group": "S3"},
        ),
        out=tmp_path,
        progress=False,
    )
    losses = train_losses(run)
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10
    assert run.summary["eval"]["acc_exact@2"] > 0.6


@pytest.mark.parametrize(
    "model, schedule",
    [("transformer", "onepass"), ("lrt", "fullseq:1"), ("lrt", "chunked:3"), ("lrt", "exact")],
)
def test_every_model_and_schedule_trains_and_writes_a_complete_run(tmp_path, model, schedule):
    run = train(
        tiny_cfg(model=model, schedule=schedule, steps=6, eval_every=3),
        out=tmp_path,
        progress=False,
    )
    s = run.summary
    assert s["status"] == "complete" and s["steps"] == 6
    cost = {"onepass": 1, "fullseq:1": 2, "chunked:3": 1, "exact": 1}[schedule]
    assert s["compute_tokens"] == pytest.approx(cost * s["tokens"]) and s["tokens"] == 6 * 16 * 6
    table = load_table(run.path, "per_position")
    assert set(table["mode"]) == {"parallel", "exact"} and set(table["length"]) == {6, 12}
    evals = load_metrics(run, kind="eval")
    assert evals["step"].tolist() == [3, 6]
    # the contraction monitor: logged at every evaluation of an LRT, kept in the summary
    monitor = ["lyap", "sweep_change_1", "sweep_change_2", "sweep_change_4"]
    if model == "lrt":
        assert evals[monitor].notna().all().all()
        assert s["contraction"] == evals[monitor].iloc[-1].to_dict()
    else:
        assert not set(monitor) & set(evals) and "contraction" not in s


def test_exact_eval_is_the_decoder_and_parallel_eval_is_the_schedule(tmp_path):
    """For Interleaved(2) the two figures differ; for Exact they coincide."""
    inter = train(tiny_cfg(steps=20, name="i"), out=tmp_path, progress=False)
    table = load_table(inter.path, "per_position").pivot_table(
        index=["length", "position"], columns="mode", values="accuracy"
    )
    assert (table["parallel"] - table["exact"]).abs().max() > 0
    ex = train(tiny_cfg(steps=5, schedule="exact", name="e"), out=tmp_path, progress=False)
    table = load_table(ex.path, "per_position").pivot_table(
        index=["length", "position"], columns="mode", values="accuracy"
    )
    assert (table["parallel"] - table["exact"]).abs().max() == 0


def test_resume_continues_exactly(tmp_path):
    """A run stopped after a checkpoint and resumed logs every step once and ends where an
    uninterrupted run ends."""
    full = train(tiny_cfg(name="full"), out=tmp_path, progress=False)
    cfg = tiny_cfg(name="cut")
    train(cfg, out=tmp_path, progress=False, stop_after=17)  # checkpoint at 10, 17
    run = Run(tmp_path / "cut")
    # simulate a kill after step 17's checkpoint was taken but with steps logged past it
    (run.checkpoint_dir() / "step_0000017.pt").unlink()
    run.log({"kind": "train", "step": 18, "loss": 0.0})
    with open(run.path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 19, "lo')  # a line cut mid-write
    assert load_metrics(run).attrs["dropped_lines"] == 1
    train(cfg, out=tmp_path, resume=True, progress=False)
    steps = load_metrics(run, kind="train")["step"].tolist()
    assert steps == list(range(1, 31))
    assert train_losses(run) == pytest.approx(train_losses(full), rel=1e-6)


class Killed(BaseException):
    """What a SIGKILL does to the loop, in-process: nothing after it runs (no except clause)."""


def _evaluations(run_path):
    evals = load_metrics(run_path, kind="eval")
    return evals[["step"] + [c for c in evals.columns if c.startswith(("acc_", "pos90_"))]]


# the evaluation at step 10 (mid-run), at 30 (the final one)
@pytest.mark.parametrize("lost", [1, 3])
def test_an_evaluation_killed_after_its_checkpoint_is_redone_on_resume(tmp_path, monkeypatch, lost):
    """Killed during an evaluation, after that step's checkpoint: the resumed run's metrics hold
    every evaluation an uninterrupted run writes, with the same figures."""
    import lrt_lab.training.loop as train_module

    full = train(tiny_cfg(name="full"), out=tmp_path, progress=False)
    real, calls = train_module.evaluate, []

    def killed_on_call(*a, **k):
        calls.append(1)
        if len(calls) == lost:
            raise Killed
        return real(*a, **k)

    monkeypatch.setattr(train_module, "evaluate", killed_on_call)
    cfg = tiny_cfg(name="cut")
    with pytest.raises(Killed):
        train(cfg, out=tmp_path, progress=False)
    monkeypatch.undo()
    run = Run(tmp_path / "cut")
    step = 10 * lost
    assert run.latest_checkpoint().name == f"step_{step:07d}.pt" and not run.is_complete
    assert step not in load_metrics(run, kind="eval").get("step", pd.Series(dtype=int)).tolist()
    train(cfg, out=tmp_path, resume=True, progress=False)
    assert run.is_complete and load_metrics(run, kind="train")["step"].tolist() == list(
        range(1, 31)
    )
    pd.testing.assert_frame_equal(_evaluations(run.path), _evaluations(full.path))
    assert run.summary["eval"] == pytest.approx(full.summary["eval"])


@pytest.mark.parametrize("killed_in", ["write_table", "write_summary"])
def test_a_run_killed_after_its_final_evaluation_keeps_that_evaluations_summary(
    tmp_path, monkeypatch, killed_in
):
    """Killed between the final evaluation's metrics line and summary.json (writing the table or
    the summary): the resumed summary holds what that evaluation logged, the contraction monitor
    included, as an uninterrupted run's does."""
    cfg = tiny_cfg(steps=4, eval_every=2, checkpoint_every=2, name="cut")

    def killed(*a, **k):
        raise Killed

    monkeypatch.setattr(Run, killed_in, killed)
    with pytest.raises(Killed):
        train(cfg, out=tmp_path, progress=False)
    monkeypatch.undo()
    run = Run(tmp_path / "cut")
    assert not run.is_complete
    last = load_metrics(run, kind="eval").iloc[-1]
    assert last["step"] == 4
    train(cfg, out=tmp_path, resume=True, progress=False)
    monitor = ["lyap", "sweep_change_1", "sweep_change_2", "sweep_change_4"]
    assert run.is_complete and run.summary["contraction"] == last[monitor].to_dict()
    full = train(tiny_cfg(steps=4, eval_every=2, checkpoint_every=2, name="full"), out=tmp_path)
    assert set(run.summary) == set(full.summary)
    assert run.summary["eval"] == pytest.approx(full.summary["eval"])


def test_an_evaluation_lost_before_the_restored_step_is_named(tmp_path):
    """An evaluation missing before the checkpoint resumed from (a damaged line) cannot be redone:
    the resume says which, and redoes nothing else."""
    cfg = tiny_cfg(steps=10, eval_every=3, checkpoint_every=3, name="r")
    run = train(cfg, out=tmp_path, progress=False, stop_after=7)  # checkpoints at 3, 6, 7
    kept = [
        line
        for line in (run.path / "metrics.jsonl").read_text().splitlines()
        if not ('"eval"' in line and '"step": 3,' in line)
    ]
    (run.path / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    with pytest.warns(UserWarning, match=r"no evaluation at step\(s\) 3;"):
        train(cfg, out=tmp_path, resume=True, progress=False)
    assert load_metrics(run, kind="eval")["step"].tolist() == [6, 9, 10]


@pytest.mark.slow
def test_killed_training_subprocess_resumes_with_every_step_once(tmp_path):
    """SIGKILL once 25 steps are logged (checkpoints every 10: some steps logged past the last
    one), then --resume: every step of 100 is logged once. The killed run must not have finished
    first: 75 steps to go take the child far longer than the 0.05 s between looks."""
    args = [
        "--task",
        "group_prefix",
        "--task-opt",
        "group=S3",
        "--length",
        "6",
        "--preset",
        "tiny",
        "--steps",
        "100",
        "--batch-size",
        "16",
        "--eval-every",
        "0",
        "--eval-lengths",
        "6",
        "--eval-size",
        "16",
        "--checkpoint-every",
        "10",
        "--name",
        "killed",
        "--out",
        str(tmp_path),
        "--quiet",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "lrt_lab", "train", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 25:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "killed" / "summary.json").exists()
    assert main(["train", *args, "--resume"]) == 0
    steps = load_metrics(tmp_path / "killed", kind="train")["step"].tolist()
    assert steps == list(range(1, 101))


def test_load_runs_skips_half_written_folders(tmp_path):
    train(tiny_cfg(steps=3, eval_every=0, name="good"), out=tmp_path, progress=False)
    (tmp_path / "empty").mkdir()
    bad = tmp_path / "corrupt"
    bad.mkdir()
    (bad / "config.json").write_text('{"train": {"ta')
    train(
        tiny_cfg(steps=3, eval_every=0, name="unfinished"),
        out=tmp_path,
        progress=False,
        stop_after=2,
    )
    with pytest.warns(UserWarning, match="corrupt"):
        df = load_runs(tmp_path)
    assert df["run"].tolist() == ["good"]
    skipped = dict(df.attrs["skipped"])
    assert set(skipped) == {"empty", "corrupt", "unfinished"}
    assert (
        df.loc[0, "config.train.task"] == "group_prefix"
        and df.loc[0, "summary.status"] == "complete"
    )
    assert "unfinished" in load_runs(tmp_path, include_incomplete=True)["run"].tolist()


def test_run_folders_are_created_atomically(tmp_path):
    Run.create(tmp_path, "a", {"x": 1})
    with pytest.raises(FileExistsError):
        Run.create(tmp_path, "a", {"x": 2})
    assert json.loads((tmp_path / "a" / "config.json").read_text()) == {"x": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a"]  # no temporary folder left behind


def test_lr_schedule_is_flat_then_linear_to_zero():
    assert [lr_multiplier(s, 100, 0.5) for s in (0, 49, 50, 75, 100)] == [1.0, 1.0, 1.0, 0.5, 0.0]


def test_cli_train_then_report(tmp_path, capsys):
    out = str(tmp_path / "store")
    common = [
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
        "8",
        "--eval-lengths",
        "4",
        "--eval-size",
        "8",
        "--out",
        out,
        "--quiet",
    ]
    assert main(["train", *common, "--model", "transformer"]) == 0
    assert (
        main(
            [
                "train",
                *common,
                "--model",
                "lrt",
                "--schedule",
                "fullseq:2:0.1,0.3,0.6",
                "--set",
                "memory.source_layer=1",
                "--curriculum",
                "2:2",
            ]
        )
        == 0
    )
    df = load_runs(out)
    assert sorted(df["config.schedule"]) == ["fullseq:2:0.1,0.3,0.6", "onepass"]
    assert (df["config.model.memory.source_layer"].dropna() == 1).all()
    capsys.readouterr()
    assert main(["report", out]) == 0
    text = capsys.readouterr().out
    assert "transformer" in text and "lrt fullseq:2:0.1,0.3,0.6" in text


@pytest.mark.parametrize(
    "args, field",
    [
        (["--task", "a6_prefix"], "task"),
        (["--schedule", "interleaved:two"], "schedule"),
        (["--schedule", "zigzag"], "schedule"),
        (["--set", "memory.sourse_layer=2"], "memory.sourse_layer"),
        (["--set", "n_layers=2"], "n_layers"),
        (["--set", "memory.source_layer=9"], "memory.source_layer"),
        (["--steps", "0"], "steps"),
        (["--preset", "huge"], "preset"),
        (["--model", "rnn"], "model"),
        (["--model", "transformer", "--schedule", "interleaved:2"], "schedule"),
        (["--curriculum", "4"], "--curriculum"),
        (["--task-opt", "alphabet"], "--task-opt"),
        (["--eval-lengths", "a,b"], "eval-lengths"),
        (["--length", "4", "--schedule", "interleaved:8"], "Interleaved.S"),
    ],
)
def test_cli_errors_are_one_line_and_write_nothing(tmp_path, capsys, args, field):
    out = tmp_path / "store"
    base = ["train", "--preset", "tiny", "--steps", "2", "--out", str(out), "--quiet"]
    code = main(base + args) if "--eval-lengths" not in args else _argparse_exit(base + args)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("lrt-lab: error:") and field in err
    assert not out.exists() or not any(out.iterdir())


def _argparse_exit(argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code


def test_sweep_runs_a_grid_once_and_skips_complete_runs(tmp_path):
    spec = validate_spec(
        {
            "sweep": {
                "tasks": ["group_prefix"],
                "models": ["transformer", "lrt", "deep"],
                "schedules": ["interleaved:2", "exact"],
                "seeds": [0, 1],
            },
            "train": {
                "length": 4,
                "preset": "tiny",
                "steps": 2,
                "batch_size": 4,
                "eval_lengths": [4],
                "eval_size": 4,
                "task_options": {"group": "S3"},
                "eval_every": 0,
            },
            "models": {"deep": {"model": "transformer", "overrides": {"n_layer": 3}}},
        }
    )
    configs = expand(spec)
    # transformer: 2 seeds; lrt: 2 schedules x 2 seeds; deep transformer: 2 seeds
    assert len(configs) == 8 and len({c.run_name for c in configs}) == 8
    runs = run_sweep(spec, out=str(tmp_path))
    assert all(r.is_complete for r in runs)
    mtimes = {r.name: (r.path / "summary.json").stat().st_mtime_ns for r in runs}
    again = run_sweep(spec, out=str(tmp_path))
    assert {r.name: (r.path / "summary.json").stat().st_mtime_ns for r in again} == mtimes
    df = load_runs(tmp_path)
    assert sorted(df.loc[df["run"].str.endswith("-deep"), "config.model.n_layer"].unique()) == [3]


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"sweep": {"tasks": ["a5_prefix"], "models": ["lrt"], "colour": 1}}, "colour"),
        ({"sweep": {"tasks": ["a5_prefix"], "models": ["lrt"]}, "train": {"stepz": 3}}, "stepz"),
        ({"sweep": {"models": ["lrt"]}}, "tasks"),
        ({"sweep": {"tasks": ["a5_prefix"], "models": ["lrt"]}, "extra": {}}, "extra"),
    ],
)
def test_bad_sweep_specs_name_the_field(spec, field):
    with pytest.raises(ValueError, match=field):
        validate_spec(spec)


@pytest.mark.slow
def test_lrt_starting_as_the_plain_model_learns_at_least_as_fast_per_step(tmp_path):
    """A raw 0.1*h memory stalled a prototype; an LRT whose memory pathway starts at zero
    (gamma_init=0, rec_init=zero) is the plain model at step 0 and must not learn slower per step.
    Same seed, so same backbone weights and the same batches; S3 prefix products at length 6.
    60 steps show it as well as 120 did: the LRT's mean loss over the last 10 is 0.92x the plain
    model's (0.89x over the last 20 of 120)."""
    common = dict(
        steps=60,
        batch_size=64,
        eval_every=0,
        eval_lengths=(6,),
        checkpoint_every=0,
        task_options={"group": "S3"},
        preset="small",
        overrides={"n_layer": 2},
    )
    plain = train(
        tiny_cfg(model="transformer", schedule="onepass", name="plain", **common),
        out=tmp_path,
        progress=False,
    )
    overrides = {"n_layer": 2, "memory.gamma_init": 0.0, "memory.rec_init": "zero"}
    lrt = train(
        tiny_cfg(name="lrt", **{**common, "overrides": overrides}), out=tmp_path, progress=False
    )
    first_plain, first_lrt = train_losses(plain)[0], train_losses(lrt)[0]
    assert first_lrt == pytest.approx(first_plain, rel=1e-5)  # identical models at step 0
    tail = lambda r: sum(train_losses(r)[-10:]) / 10
    assert tail(lrt) <= tail(plain) * 1.02


@pytest.mark.slow
def test_demo_quick_trains_three_models_and_reuses_them(tmp_path, capsys, monkeypatch):
    """The quick demo's three runs, table and reuse. What is checked is the layout, not what the
    models learn: 8 steps each instead of the quick demo's 40 (training was most of the time)."""
    import dataclasses

    from lrt_lab.commands import demo
    from lrt_lab.commands.demo import run_demo

    configs = demo.demo_configs
    monkeypatch.setattr(
        demo,
        "demo_configs",
        lambda quick=False: [
            dataclasses.replace(c, steps=8, task_options={**c.task_options, "curriculum_steps": 3})
            for c in configs(quick)
        ],
    )
    table = run_demo(out=str(tmp_path), quick=True, quiet=True)
    printed = capsys.readouterr()
    assert list(table.columns) == [
        "demo-transformer-quick",
        "demo-lrt-interleaved2-quick",
        "demo-lrt-fullseq3-quick",
    ]
    assert "pos@90 exact (L=48)" in table.index and "train time (s)" in table.index
    # accuracy at a position of the longest evaluation, never the store's acc@L (over a whole
    # sequence)
    acc_rows = [r for r in table.index if r.startswith("accuracy at position ")]
    assert acc_rows[0] == "accuracy at position 2 (exact, L=48)" and len(acc_rows) == 7
    assert not any(r.startswith("acc@") for r in table.index)
    assert (table.loc["chance (1/|group| = 1/6)"] == round(1 / 6, 3)).all()  # S3 has 6 elements
    # each model's own count: the LRTs' is the transformer's plus the memory pathway
    reports = [Run(tmp_path / name).config["params"] for name in table.columns]
    assert (
        reports[0]["added"] == 0
        and reports[1]["total"] == reports[0]["total"] + reports[1]["added"] > reports[0]["total"]
    )
    assert table.loc["parameters"].tolist() == [
        f"{reports[0]['total']:,}",
        *(f"{r['total']:,} (+{r['added_pct_of_baseline']:.1f}% memory)" for r in reports[1:]),
    ]
    # quiet: no progress bars
    assert printed.out.count("training demo-") == 3 and "it/s" not in printed.err
    df = load_runs(tmp_path)
    assert sorted(df["config.schedule"]) == ["fullseq:3", "interleaved:2", "onepass"]
    run_demo(out=str(tmp_path), quick=True)  # a second demo reuses the complete runs
    assert capsys.readouterr().out.count("already trained") == 3


def test_demo_threads_follow_the_policy(monkeypatch, capsys, tmp_path):
    """The demo asks lrt_lab.training.threads, says what it
    chose, and gives torch its setting back."""
    from lrt_lab.commands import demo

    seen = []
    monkeypatch.setattr(
        demo,
        "_run_demo",
        lambda out, quick, quiet, choice: seen.append(
            (torch.get_num_threads(), demo._threads_label(choice))
        ),
    )
    saved = torch.get_num_threads()
    demo.run_demo(out=str(tmp_path), threads=1)
    assert seen == [(1, "1 CPU thread: set by --threads; --threads or OMP_NUM_THREADS sets it")]
    assert torch.get_num_threads() == saved


def test_a_stopped_demo_run_ends_the_demo(monkeypatch, tmp_path):
    """SIGTERM stops the run in progress (checkpointed); the demo must not go on to the next one."""
    from types import SimpleNamespace

    from lrt_lab.commands import demo

    trained = []
    stopped = SimpleNamespace(status="incomplete")
    monkeypatch.setattr(demo, "train", lambda cfg, **kw: trained.append(cfg) or stopped)
    with pytest.raises(demo.DemoStopped) as e:
        demo.run_demo(out=str(tmp_path), quick=True, quiet=True, threads=1)
    assert len(trained) == 1 and e.value.status == "incomplete"
    code = main(["demo", "--quick", "--quiet", "--threads", "1", "--out", str(tmp_path)])
    assert code == exitcodes.INCOMPLETE


def test_progress_bar_is_rate_limited_off_a_terminal(monkeypatch):
    import io

    from lrt_lab.training.loop import _progress_bar

    log = io.StringIO()  # not a TTY, as under CI or nohup
    monkeypatch.setattr("sys.stderr", log)
    bar = _progress_bar(400, 0, "run")
    for _ in range(400):
        bar.set_postfix({"loss": "1.0"}, refresh=False)
        bar.update(1)
    bar.close()
    assert bar.mininterval == 30.0
    assert log.getvalue().count("\r") <= 3  # the first draw, the last, and at most one more


def test_a_task_without_the_task_interface_fails_before_anything_is_written(tmp_path):
    from lrt_lab.training.loop import make_task, prepare

    class NoCurriculum:  # what an older hand-written task looked like: no length_at, no min_length
        def __init__(self, task):
            self.name, self.length, self.vocab_size = task.name, task.length, task.vocab_size
            self.sample = task.sample

    cfg = tiny_cfg()
    task = make_task(cfg)
    # every built-in task implements lrt_lab.core.interface.Task
    assert prepare(cfg, task)[0] is task
    with pytest.raises(ValueError, match="task=.*length_at"):
        train(cfg, out=tmp_path, task=NoCurriculum(task), progress=False)
    assert not (tmp_path / cfg.run_name).exists()


def test_a_name_taken_by_other_arguments_says_to_choose_another_name(tmp_path, capsys):
    """A run folder that exists under the same name: with the same arguments the error points to
    --resume; with other ones (an option a run name does not show) it names the arguments that
    differ and points to --name, since --resume would refuse them."""
    args = [
        "train",
        "--task",
        "group_prefix",
        "--task-opt",
        "group=S3",
        "--length",
        "6",
        "--preset",
        "tiny",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--eval-every",
        "0",
        "--eval-size",
        "8",
        "--eval-lengths",
        "6",
        "--out",
        str(tmp_path),
        "--quiet",
        "--threads",
        "1",
    ]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 2
    same = capsys.readouterr().err
    assert "already exists" in same and "--resume" in same and "--name" not in same
    assert main([*args, "--lr-scale", "0.5"]) == 2
    other = capsys.readouterr().err
    assert "other arguments" in other and "lr_scale" in other and "--name" in other
    assert main([*args, "--lr-scale", "0.5", "--name", "half-rate"]) == 0
    # an override is in the derived name's digest: a folder of its own, no collision
    assert main([*args, "--set", "n_layer=1"]) == 0


def test_a_derived_run_name_carries_a_digest_of_task_options_and_overrides():
    """No options: the name is what it always was. Options or overrides: `-o` and 5 hex digits
    of the sha256 of their canonical JSON, the same whatever their order, different for other
    values. --name wins."""
    plain = TrainConfig(task="a5_prefix", length=16, preset="small", model="lrt", seed=1)
    assert plain.run_name == plain.base_name == "a5_prefix-L16-small-lrt-interleaved_2-s1"
    assert plain.options_digest == ""

    def digest(task_options, overrides):
        text = json.dumps(
            {"overrides": overrides, "task_options": task_options},
            sort_keys=True,
            separators=(",", ":"),
        )
        return "o" + hashlib.sha256(text.encode()).hexdigest()[:5]

    options = {"group": "S3", "supervise_every": 2}
    cfg = tiny_cfg(task_options=options, overrides={"n_layer": 3, "memory.gamma_init": 0})
    assert cfg.base_name == "group_prefix-L6-tiny-lrt-interleaved_2-s0"
    assert cfg.run_name == f"{cfg.base_name}-{digest(options, cfg.overrides)}"
    assert re.fullmatch(r".*-s0-o[0-9a-f]{5}", cfg.run_name)
    reordered = tiny_cfg(
        task_options={"supervise_every": 2, "group": "S3"},
        overrides={"memory.gamma_init": 0, "n_layer": 3},
    )
    assert reordered.run_name == cfg.run_name
    names = {
        tiny_cfg(task_options={"group": "S3"}).run_name,
        tiny_cfg(task_options={"group": "S4"}).run_name,
        tiny_cfg(task_options={"group": "S3"}, overrides={"n_layer": 3}).run_name,
        tiny_cfg(task_options={"group": "S3"}, seed=1).run_name.replace("-s1-", "-s0-"),
    }
    assert len(names) == 3  # the seed is not in the digest: the seeds of an ablation line up
    assert tiny_cfg(name="mine").run_name == "mine"


@pytest.mark.parametrize("spec", ["a5_trainer_frontier", "baselines", "gap_recovery"])
def test_sweeps_keep_the_names_of_their_committed_runs(spec):
    """A sweep names its runs without the options digest (its variants carry labels), so the
    committed specs still find every run of their grid in experiments/results, complete and
    trained with the config the spec builds (fields added since read as their defaults)."""
    from lrt_lab.training.sweep import checked_grid, load_spec

    store = REPO / "experiments" / "results"
    configs = checked_grid(load_spec(REPO / "experiments" / f"{spec}.toml"), str(store))
    assert configs and all(Run(store / c.run_name).status == "complete" for c in configs)
    assert all(c.name == c.base_name or c.name.startswith(f"{c.base_name}-") for c in configs)


def test_resume_finds_a_run_trained_before_names_carried_the_digest(tmp_path, capsys):
    """A run folder named as before (no digest) with the same config is what --resume continues,
    from Python and from the command line; one with another config is not."""
    cfg = tiny_cfg(steps=20, eval_every=0)
    assert cfg.run_name != cfg.base_name
    train(cfg, out=tmp_path, progress=False, stop_after=10)  # checkpoint at 10
    old = tmp_path / cfg.base_name
    (tmp_path / cfg.run_name).rename(old)  # what `train` named it before
    run = train(cfg, out=tmp_path, resume=True, progress=False)
    assert run.path == old and run.status == "complete"
    assert load_metrics(run, kind="train")["step"].tolist() == list(range(1, 21))
    assert not (tmp_path / cfg.run_name).exists()

    args = [
        "train",
        *("--task", "group_prefix", "--task-opt", "group=S3", "--length", "6"),
        *("--preset", "tiny", "--steps", "2", "--batch-size", "4", "--eval-every", "0"),
        *("--eval-size", "8", "--eval-lengths", "6", "--out", str(tmp_path / "cli"), "--quiet"),
        *("--threads", "1"),
    ]
    assert main(args) == 0
    capsys.readouterr()
    (new,) = (tmp_path / "cli").iterdir()
    assert new.name.endswith(f"-s0-{tiny_cfg().options_digest}")
    before = new.with_name(new.name.rsplit("-", 1)[0])
    new.rename(before)
    assert main([*args, "--resume"]) == 0  # found complete under its older name, and said so
    assert before.name in capsys.readouterr().out
    assert not new.exists()
    # another config under the older name is not taken for this run
    assert main([*args, "--steps", "3", "--resume"]) == 2
    assert "no run folder" in capsys.readouterr().err


def test_a_run_of_the_earlier_model_convention_is_not_resumed_as_todays(tmp_path):
    """--resume of a run whose config.json predates `window_convention` and
    `memory.gate_value_embeds` (it ran under the earlier convention) is refused in one line that
    names the convention and the --set options that train under it, never continued with a model
    that computes something else."""
    cfg = tiny_cfg(steps=4, eval_every=0, checkpoint_every=2)
    run = train(cfg, out=tmp_path, progress=False, stop_after=2)
    path = run.path / "config.json"
    config = json.loads(path.read_text())
    del config["model"]["window_convention"], config["model"]["memory"]["gate_value_embeds"]
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="earlier model convention") as info:
        train(cfg, out=tmp_path, resume=True, progress=False)
    message = str(info.value)
    assert "--set window_convention=keys" in message
    assert "--set memory.gate_value_embeds=true" in message


def test_a_curriculum_that_cannot_reach_the_training_length_is_warned_about():
    """`--curriculum 4:1000 --steps 100` trains at length 4 throughout in a run named for its
    training length: the run says so before it starts; a curriculum that ends in time says
    nothing."""
    from lrt_lab.training.loop import TrainConfig, prepare

    def config(steps):
        return TrainConfig(
            task="group_prefix",
            length=8,
            preset="tiny",
            steps=steps,
            task_options={"group": "S3", "curriculum_start": 4, "curriculum_steps": 50},
            eval_lengths=(8,),
            eval_size=8,
            device="cpu",
        )

    with pytest.warns(UserWarning, match="reaches length 4 by the last step"):
        prepare(config(10))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare(config(60))


def test_evaluation_lengths_default_to_one_two_and_four_times_the_training_length():
    """`lrt-lab train --length 16` evaluates at 16, 32 and 64 (the 1x/2x/4x the docs report), not at
    a fixed 64/128/256 that never measures the training length; given lengths are kept."""
    from lrt_lab.commands.cli import build_parser, train_config_from_args

    assert TrainConfig(length=16, device="cpu").eval_lengths == (16, 32, 64)
    assert TrainConfig(length=8, eval_lengths=(8, 12), device="cpu").eval_lengths == (8, 12)
    parsed = build_parser().parse_args(["train", "--length", "12"])
    assert train_config_from_args(parsed).eval_lengths == (12, 24, 48)
    parsed = build_parser().parse_args(["train", "--length", "12", "--eval-lengths", "12,60"])
    assert train_config_from_args(parsed).eval_lengths == (12, 60)
