"""A run store shared by many writers, and faults that end cleanly (the store's contract in the
README's "Bad input" section). Each test reproduces a way the store used to lose or corrupt data."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from lrt_lab.commands.cli import build_parser, main
from lrt_lab.store import claims
from lrt_lab.store.results import Run, load_metrics, load_runs
from lrt_lab.training import exitcodes
from lrt_lab.training.loop import TrainConfig, train
from lrt_lab.training.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--preset",
    "tiny",
    "--length",
    "8",
    "--batch-size",
    "4",
    "--eval-size",
    "4",
    "--eval-lengths",
    "8",
    "--quiet",
]


def tiny_cfg(**kw):
    base = dict(
        task="a5_prefix",
        length=8,
        preset="tiny",
        steps=40,
        batch_size=4,
        eval_every=0,
        eval_lengths=(8,),
        eval_size=4,
        checkpoint_every=10,
    )
    base.update(kw)
    return TrainConfig(**base)


def spec(steps=60, seeds=(0, 1), **train_fields):
    return {
        "sweep": {"tasks": ["a5_prefix"], "models": ["transformer", "lrt"], "seeds": list(seeds)},
        "train": {
            "length": 8,
            "preset": "tiny",
            "steps": steps,
            "batch_size": 4,
            "eval_size": 4,
            "eval_lengths": [8],
            "eval_every": 0,
            "checkpoint_every": 20,
            "device": "cpu",
            **train_fields,
        },
    }


def write_spec(path: Path, body: dict) -> Path:
    lines = [
        "[sweep]",
        f"tasks = {json.dumps(body['sweep']['tasks'])}",
        f"models = {json.dumps(body['sweep']['models'])}",
        f"seeds = {json.dumps(body['sweep']['seeds'])}",
        "[train]",
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in body["train"].items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def train_steps(folder) -> list[int]:
    return load_metrics(folder, kind="train")["step"].tolist()


def losses(folder) -> list[float]:
    return load_metrics(folder, kind="train")["loss"].tolist()


def cli(*args, env=None, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "lrt_lab", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


# One writer per run
# --------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_concurrent_sweeps_train_each_run_once_like_a_sequential_sweep(tmp_path):
    body = spec(steps=40)  # long enough that both processes reach runs the other is training
    path = write_spec(tmp_path / "grid.toml", body)
    shared = tmp_path / "shared"
    procs = [cli("sweep", str(path), "--out", str(shared), "--quiet") for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
    run_sweep(body, out=str(tmp_path / "alone"), progress=False)
    names = sorted(p.name for p in (tmp_path / "alone").iterdir() if not p.name.startswith("."))
    runs = sorted(p.name for p in shared.iterdir() if not p.name.startswith("."))  # not .plans
    assert runs == names and len(names) == 4
    for name in names:
        assert train_steps(shared / name) == list(range(1, 41)), name  # every step once, in order
        assert losses(shared / name) == pytest.approx(
            losses(tmp_path / "alone" / name), rel=1e-6
        ), name
        assert not (shared / name / claims.CLAIM).exists()  # released


@pytest.mark.slow
def test_a_second_writer_gets_one_line_naming_the_owner(tmp_path, capsys):
    first = train(tiny_cfg(steps=5, name="r"), out=tmp_path, progress=False, stop_after=2)
    with claims.acquire(first.path):  # this process trains it now
        fake = json.loads((first.path / claims.CLAIM).read_text())
        assert fake["pid"] == os.getpid() and "host" in fake
        # another process (a subprocess) cannot resume it
        p = cli(
            "train",
            "--task",
            "a5_prefix",
            *TINY,
            "--steps",
            "5",
            "--checkpoint-every",
            "10",
            "--eval-every",
            "0",
            "--name",
            "r",
            "--out",
            str(tmp_path),
            "--resume",
        )
        _, err = p.communicate(timeout=300)
        assert p.returncode == 2 and err.count("\n") == 1
        assert f"pid {os.getpid()}" in err and "being written by" in err
    assert not (first.path / claims.CLAIM).exists()


def test_a_claim_of_a_dead_process_or_without_heartbeat_is_taken_over(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (run / claims.CLAIM).write_text(
        json.dumps({"host": claims.socket.gethostname(), "pid": int(dead.stdout)})
    )
    with pytest.warns(UserWarning, match="taking over a stale claim"):
        claims.acquire(run).release()
    # another host's claim: alive while its heartbeat is fresh, stale after STALE_S
    (run / claims.CLAIM).write_text(json.dumps({"host": "elsewhere", "pid": 1}))
    with pytest.raises(claims.RunClaimedError, match="host elsewhere"):
        claims.acquire(run)
    old = time.time() - claims.STALE_S - 5
    os.utime(run / claims.CLAIM, (old, old))
    with pytest.warns(UserWarning, match="elsewhere"):
        claim = claims.acquire(run)
    assert json.loads((run / claims.CLAIM).read_text())["pid"] == os.getpid()
    claim.release()


def test_a_claim_its_owner_is_still_writing_is_not_taken_over(tmp_path):
    """An empty or unreadable claim that is fresh may be its owner's, mid-write: not stale until
    its heartbeat is STALE_S old."""
    run = tmp_path / "r"
    run.mkdir()
    (run / claims.CLAIM).write_text("")
    with pytest.raises(claims.RunClaimedError, match="unknown owner"):
        claims.acquire(run)
    assert (run / claims.CLAIM).read_text() == ""  # untouched
    old = time.time() - claims.STALE_S - 5
    os.utime(run / claims.CLAIM, (old, old))
    with pytest.warns(UserWarning, match="taking over a stale claim"):
        claims.acquire(run).release()


def test_two_claimants_of_one_folder_get_one_claim(tmp_path, monkeypatch):
    """The first claimant is slow to write its owner (held 0.3 s where it builds it); a second one
    that tries meanwhile must not get the folder too: exactly one of the two holds it."""
    import threading

    run = tmp_path / "r"
    run.mkdir()
    real_owner, calls = claims._owner, []

    def slow_first_owner():
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.3)
        return real_owner()

    monkeypatch.setattr(claims, "_owner", slow_first_owner)
    held, refused = [], []

    def claim():
        try:
            held.append(claims.acquire(run))
        except claims.RunClaimedError as e:
            refused.append(e)

    first = threading.Thread(target=claim)
    first.start()
    time.sleep(0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the old fault: a takeover warning, then two holders
        claim()
    first.join()
    assert len(held) == 1 and len(refused) == 1, (held, refused)
    held[0].release()
    assert not (run / claims.CLAIM).exists()
    assert [p.name for p in run.iterdir()] == []  # no temporary file left


def test_the_heartbeat_keeps_a_claim_fresh(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    claim = claims.acquire(run, heartbeat_s=0.05)
    old = time.time() - 1000
    os.utime(run / claims.CLAIM, (old, old))
    time.sleep(0.3)
    assert time.time() - (run / claims.CLAIM).stat().st_mtime < 5
    claim.release()


def test_resume_of_a_complete_run_changes_nothing(tmp_path):
    run = train(tiny_cfg(name="done"), out=tmp_path, progress=False)
    before = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    # pruned checkpoints, then a damaged newest one: still nothing moves
    for ckpt in run.checkpoints():
        ckpt.unlink()
    assert (
        main(
            [
                "train",
                "--task",
                "a5_prefix",
                *TINY,
                "--steps",
                "40",
                "--eval-every",
                "0",
                "--checkpoint-every",
                "10",
                "--name",
                "done",
                "--out",
                str(tmp_path),
                "--resume",
            ]
        )
        == 0
    )
    after = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    assert after == before and len(train_steps(run.path)) == 40


def test_a_sweep_whose_spec_changed_a_complete_run_refuses_naming_the_fields(tmp_path):
    run_sweep(spec(steps=10, seeds=(0,)), out=str(tmp_path), progress=False)
    with pytest.raises(
        ValueError, match=r"steps: 10 in config.json, 20 now.*batch_size|batch_size.*steps"
    ):
        run_sweep(spec(steps=20, seeds=(0,), batch_size=8), out=str(tmp_path), progress=False)
    runs = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]  # not .plans
    assert runs and all(len(train_steps(p)) == 10 for p in runs)  # nothing retrained


def test_an_empty_folder_named_like_a_run_is_not_in_the_way(tmp_path):
    body = spec(steps=5, seeds=(0,))
    (tmp_path / "a5_prefix-L8-tiny-transformer-s0").mkdir()
    runs = run_sweep(body, out=str(tmp_path), progress=False)
    assert all(r.is_complete for r in runs)


def test_an_edited_config_is_refused_on_resume(tmp_path):
    run = train(tiny_cfg(name="r"), out=tmp_path, progress=False, stop_after=10)
    config = json.loads((run.path / "config.json").read_text())
    config["model"]["n_embd"] = 999
    (run.path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="n_embd: 999 in config.json"):
        train(tiny_cfg(name="r"), out=tmp_path, progress=False, resume=True)


# Faults -------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_termination_signal_checkpoints_the_step_it_arrived_at(tmp_path, sig):
    args = [
        "train",
        "--task",
        "a5_prefix",
        *TINY,
        "--steps",
        "3000",
        "--eval-every",
        "0",
        "--checkpoint-every",
        "1000",
        "--name",
        "r",
        "--out",
        str(tmp_path),
    ]
    p = cli(*args)
    metrics = tmp_path / "r" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (
        not metrics.exists() or len(metrics.read_text().splitlines()) < 30
    ):
        time.sleep(0.1)
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == exitcodes.INCOMPLETE, err[-2000:]
    assert f"on {signal.Signals(sig).name}" in err and "--resume" in err
    run = Run(tmp_path / "r")
    last = train_steps(run.path)[-1]
    # not step 1000
    assert 30 <= last < 3000 and run.latest_checkpoint().name == f"step_{last:07d}.pt"
    assert not run.is_complete and not (run.path / claims.CLAIM).exists()


def test_the_final_checkpoint_is_written_before_the_final_evaluation(tmp_path, monkeypatch):
    import lrt_lab.training.loop as train_module

    def failing(*a, **k):
        raise RuntimeError("evaluation failed")

    monkeypatch.setattr(train_module, "evaluate", failing)
    with pytest.raises(RuntimeError, match="evaluation failed"):
        train(tiny_cfg(steps=15, checkpoint_every=0, name="r"), out=tmp_path, progress=False)
    assert Run(tmp_path / "r").latest_checkpoint().name == "step_0000015.pt"  # the training is kept
    monkeypatch.undo()
    run = train(
        tiny_cfg(steps=15, checkpoint_every=0, name="r"), out=tmp_path, progress=False, resume=True
    )
    assert run.is_complete and train_steps(run.path) == list(range(1, 16))


def test_a_diverging_run_is_recorded_and_its_grid_goes_on(tmp_path):
    body = spec(steps=20, seeds=(0,))
    body["sweep"]["models"] = ["lrt", "wild", "transformer"]
    body["models"] = {"wild": {"model": "lrt", "lr_scale": 1e30}}
    runs = run_sweep(body, out=str(tmp_path), progress=False)
    status = {r.name: r.status for r in runs}
    wild = [n for n in status if n.endswith("-wild")][0]
    assert (
        status[wild] == "diverged"
        and sorted(v for n, v in status.items() if n != wild) == ["complete"] * 2
    )
    summary = Run(tmp_path / wild).summary
    assert summary["diverged_at_step"] >= 1 and summary["diverged_loss"] in ("nan", "inf", "-inf")
    assert dict(zip(load_runs(tmp_path)["run"], load_runs(tmp_path)["status"]))[wild] == "diverged"
    run_sweep(body, out=str(tmp_path), progress=False)  # a re-run does not train it again
    assert Run(tmp_path / wild).summary == summary
    import contextlib
    import io

    from lrt_results.report import print_report

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        print_report(tmp_path)
    assert "1 run(s) diverged" in text.getvalue() and wild in text.getvalue()


def test_a_full_disk_during_a_checkpoint_is_one_line_that_says_so(tmp_path, monkeypatch, capsys):
    import lrt_lab.training.checkpoints as checkpoints_module

    def cut_short(*a, **k):
        raise RuntimeError(
            "[enforce fail at inline_container.cc:626] . unexpected pos 4096 vs 3992"
        )

    monkeypatch.setattr(checkpoints_module.torch, "save", cut_short)
    monkeypatch.setattr(
        checkpoints_module.shutil, "disk_usage", lambda p: type("Usage", (), {"free": 0})()
    )
    code = main(
        [
            "train",
            "--task",
            "a5_prefix",
            *TINY,
            "--steps",
            "12",
            "--checkpoint-every",
            "5",
            "--eval-every",
            "0",
            "--name",
            "r",
            "--out",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "disk full" in err and "step 5" in err
    assert not list((tmp_path / "r" / "checkpoints").glob(".*.tmp"))  # no partial file left behind
    assert train_steps(tmp_path / "r") == [1, 2, 3, 4, 5]  # what was written is kept


def test_unexpected_failures_are_one_line_with_the_traceback_behind_debug(
    tmp_path, monkeypatch, capsys
):
    import lrt_lab.training.loop as train_module

    def broken(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 10.00 GiB")

    monkeypatch.setattr(train_module, "run_schedule", broken)
    args = [
        "train",
        "--task",
        "a5_prefix",
        *TINY,
        "--steps",
        "3",
        "--name",
        "r",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "out of memory" in err and "--batch-size" in err
    with pytest.raises(torch.OutOfMemoryError):
        main(["--debug", *args[:-4], "--name", "r2", "--out", str(tmp_path)])


def test_floats_are_checked_in_the_dtype_they_are_used_in(tmp_path, capsys):
    code = main(
        [
            "train",
            "--task",
            "a5_prefix",
            *TINY,
            "--set",
            "memory.gamma_init=1e300",
            "--out",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "memory.gamma_init" in err and "float32" in err
    assert not list(tmp_path.iterdir())  # refused before any folder was made


def _float_fields():
    import dataclasses
    import typing

    hints = typing.get_type_hints(TrainConfig)
    return [
        f.name
        for f in dataclasses.fields(TrainConfig)
        if float in (typing.get_args(hints[f.name]) or (hints[f.name],))
    ]


@pytest.mark.parametrize("name", _float_fields())
def test_every_float_option_beyond_float32_is_refused_by_name(name):
    """Every float field of a run, read from TrainConfig's own annotations (so a new one is
    covered): 1e39 is finite as a Python float but not as the float32 training computes in."""
    bounded = {"warmdown_frac": 1, "spike_backoff": 1}  # fractions: their range refuses 1e39
    with pytest.raises(ValueError, match=rf"^{name}=1e\+39 is invalid; allowed: .*") as err:
        TrainConfig(device="cpu", **{name: 1e39})
    assert name in bounded or "float32" in str(err.value)


@pytest.mark.parametrize(
    "flag, value", [("--lr-scale", "1e39"), ("--lr-scale", "1e36"), ("--tokens-per-param", "1e39")]
)
def test_a_float_option_whose_rates_overflow_float32_is_refused_up_front(
    tmp_path, capsys, flag, value
):
    """--lr-scale 1e39 used to fail at step 1 (exit 1, a run folder left); 1e36 passes the field's
    own bound but makes the embedding rate ~1e35 x (d/768)^-1/2, x5 in AdamW's first step."""
    args = ["train", "--task", "a5_prefix", *TINY, "--steps", "2", flag, value]
    code = main([*args, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("lrt-lab: error: ") and err.count("\n") == 1, err
    assert flag.lstrip("-").replace("-", "_") in err and "float32" in err, err
    assert not list(tmp_path.iterdir())


def test_a_sweep_spec_rate_beyond_float32_is_refused_before_anything_is_written(tmp_path, capsys):
    args = sweep_args(tmp_path, spec(steps=4, seeds=(0,), matrix_lr=1e39))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "matrix_lr" in err and "float32" in err, err
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--length", "100000"),
        ("--batch-size", "1000000"),
        ("--eval-lengths", "100000"),
        ("--eval-size", "1000000000"),  # the evaluation sets, built whole before training
    ],
)
def test_requests_that_cannot_fit_in_memory_are_refused_up_front(tmp_path, capsys, flag, value):
    args = dict(zip(TINY[0:-1:2], TINY[1:-1:2]))
    args[flag] = value
    flat = [x for kv in args.items() for x in kv]
    code = main(["train", "--task", "a5_prefix", *flat, "--quiet", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "memory" in err and flag.lstrip("-").replace("-", "_") in err, err
    assert err.startswith("lrt-lab: error:") and err.count("\n") == 1, err
    assert not list(tmp_path.iterdir())


# Readers and permissions
# ----------------------------------------------------------------------------
def test_load_runs_skips_a_folder_it_cannot_read_and_says_so(tmp_path, monkeypatch):
    train(tiny_cfg(steps=3, name="ok"), out=tmp_path, progress=False)
    (tmp_path / "lost+found").mkdir()
    real = Path.exists

    def refuse(self):
        if self.parent.name == "lost+found":
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "exists", refuse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = load_runs(tmp_path)
    assert list(df["run"]) == ["ok"]
    assert ("lost+found", "unreadable: Permission denied") in df.attrs["skipped"]
    assert any("lost+found" in str(w.message) for w in caught)


def test_run_folders_and_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        run = train(tiny_cfg(steps=3, name="r"), out=tmp_path, progress=False)
    finally:
        os.umask(old)
    assert run.path.stat().st_mode & 0o777 == 0o755
    for name in ("config.json", "summary.json"):
        assert (run.path / name).stat().st_mode & 0o777 == 0o644, name


def test_every_help_exits_zero(capsys):
    parser = build_parser()
    commands = [a for a in parser._subparsers._group_actions[0].choices]
    assert {"train", "sweep", "report", "bench", "app", "demo", "analyze"} <= set(commands)
    for argv in [["--help"]] + [[c, "--help"] for c in commands]:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0, argv
    assert "95%" in capsys.readouterr().out


def test_sigint_says_how_to_continue_for_each_command(monkeypatch, capsys):
    import lrt_lab.commands.cli as cli_module

    def interrupted(a):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_module, "cmd_sweep", interrupted)
    monkeypatch.setattr(cli_module, "cmd_train", interrupted)
    assert (
        main(["sweep", "x.toml"]) == 130 and "run the same command again" in capsys.readouterr().err
    )
    assert main(["train"]) == 130 and "--resume" in capsys.readouterr().err


# Exit statuses: a script can tell a finished job from one to run again
# -----------------------------
@pytest.mark.parametrize("command", ["train", "sweep"])
def test_help_states_every_exit_status(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for code, meaning in exitcodes.MEANINGS.items():
        assert f" {code} {' '.join(meaning.split())}" in text, code


def test_a_diverged_train_ends_in_one_line_naming_the_cause(tmp_path, capsys):
    args = [
        "train",
        "--task",
        "a5_prefix",
        *TINY,
        "--steps",
        "20",
        "--lr-scale",
        "1e20",
        "--eval-every",
        "0",
        "--checkpoint-every",
        "5",
        "--name",
        "wild",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == exitcodes.DIVERGED
    out, err = capsys.readouterr()
    assert (
        out == ""
        and err.count("\n") == 1
        and "wild: diverged at step" in err
        and "--lr-scale" in err
    )
    folder = tmp_path / "wild"
    summary = Run(folder).summary
    assert summary["status"] == "diverged"
    # every step logged is kept
    assert train_steps(folder) == list(range(1, summary["diverged_at_step"] + 1))
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    # --resume finds it diverged: the same line and status, nothing changed
    assert main(args + ["--resume"]) == exitcodes.DIVERGED
    assert capsys.readouterr() == ("", err)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == files
    assert main(["report", str(tmp_path)]) == exitcodes.USAGE  # nothing to compare, and it says why
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1 diverged" in err and "wild" in err


def test_a_train_stopped_by_sigterm_exits_incomplete_until_resumed(tmp_path, monkeypatch, capsys):
    import lrt_lab.training.loop as train_module

    real = train_module._train_step

    def step_then_sigterm(*a, **k):  # the signal arrives during step 3
        record = real(*a, **k)
        if record["step"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return record

    monkeypatch.setattr(train_module, "_train_step", step_then_sigterm)
    args = [
        "train",
        "--task",
        "a5_prefix",
        *TINY,
        "--steps",
        "6",
        "--eval-every",
        "0",
        "--name",
        "r",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == exitcodes.INCOMPLETE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "on SIGTERM" in err and "--resume" in err
    assert train_steps(tmp_path / "r") == [1, 2, 3]
    monkeypatch.undo()
    assert main(args + ["--resume"]) == exitcodes.COMPLETE
    assert train_steps(tmp_path / "r") == list(range(1, 7))


def sweep_args(tmp_path, body, *extra, variants: str = "") -> list[str]:
    path = write_spec(tmp_path / "grid.toml", body)
    path.write_text(path.read_text() + variants)
    return ["sweep", str(path), "--out", str(tmp_path / "store"), "--quiet", *extra]


def test_a_sweep_stopped_by_sigterm_exits_incomplete_until_its_grid_is_complete(
    tmp_path, monkeypatch, capsys
):
    import lrt_lab.training.sweep as sweep_module

    real = sweep_module.train

    def train_then_sigterm(*a, **k):  # the signal arrives once a run is done
        run = real(*a, **k)
        os.kill(os.getpid(), signal.SIGTERM)
        return run

    monkeypatch.setattr(sweep_module, "train", train_then_sigterm)
    args = sweep_args(tmp_path, spec(steps=4, seeds=(0,)))
    assert main(args) == exitcodes.INCOMPLETE
    assert "1 of 2 runs complete" in capsys.readouterr().out
    monkeypatch.undo()
    assert main(args) == exitcodes.COMPLETE
    assert main(args) == exitcodes.COMPLETE  # a finished grid stays finished
    assert "2 of 2 runs complete" in capsys.readouterr().out


def test_a_parallel_sweep_stopped_with_runs_left_exits_incomplete(tmp_path, monkeypatch, capsys):
    """--workers N: the exit status is what the store holds after the driver returns; here it was
    stopped (SIGTERM) after one run, the other task cancelled."""
    from lrt_lab.training import parallel

    def stopped_driver(configs, out, *a, **k):
        return [parallel.train_grid_point(configs[0], out)] + [
            {"run": c.run_name, "status": "incomplete"} for c in configs[1:]
        ]

    monkeypatch.setattr(parallel, "run_on_ray", stopped_driver)
    assert (
        main(sweep_args(tmp_path, spec(steps=4, seeds=(0,)), "--workers", "2"))
        == exitcodes.INCOMPLETE
    )
    assert "1 of 2 runs complete" in capsys.readouterr().out


def test_a_sweep_with_a_diverged_run_exits_diverged_once_every_run_finished(tmp_path, capsys):
    body = spec(steps=4, seeds=(0,))
    body["sweep"]["models"] = ["transformer", "wild"]
    args = sweep_args(tmp_path, body, variants='[models.wild]\nmodel = "lrt"\nlr_scale = 1e30\n')
    assert main(args) == exitcodes.DIVERGED
    out = capsys.readouterr().out
    assert (
        "1 of 2 runs complete" in out
        and "1 diverged" in out
        and "run the same command again" not in out
    )
    assert main(args) == exitcodes.DIVERGED  # nothing left to train: the grid's state is the same
