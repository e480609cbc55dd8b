"""Sweeps spread over processes (Ray, `--workers N`) and Slurm job arrays (submitit, tested with its
local executor): the same results as one process, each run trained once, dead tasks retried."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lrt_lab.store.claims import CLAIM
from lrt_lab.store.results import Run, load_metrics
from lrt_lab.training import exitcodes
from lrt_lab.training.sweep import expand, run_sweep

ROOT = Path(__file__).resolve().parents[1]


def spec(steps=60, seeds=(0, 1)):
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
            "checkpoint_every": 10,
            "device": "cpu",
        },
    }


def steps_and_losses(folder):
    m = load_metrics(folder, kind="train")
    return m["step"].tolist(), m["loss"].tolist()


@pytest.mark.slow
def test_workers_one_never_imports_ray(tmp_path):
    code = (
        "import sys; from lrt_lab.training.sweep import run_sweep; from test_parallel import spec; "
        f"run_sweep(spec(steps=3, seeds=(0,)), out={str(tmp_path)!r}, progress=False); "
        "print('ray' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT / "tests",
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_two_workers_train_in_two_processes_at_once_with_one_process_results(
    tmp_path, ray_instance
):
    body = spec()
    run_sweep(body, out=str(tmp_path / "one"), progress=False)
    runs = run_sweep(body, out=str(tmp_path / "two"), progress=False, workers=2, threads_per_run=1)
    assert all(r.is_complete for r in runs) and len(runs) == 4
    pids = {r.summary["trained_by"]["pid"] for r in runs}
    assert len(pids) == 2 and os.getpid() not in pids  # two worker processes, not this one
    # at once: each worker's runs overlap the other's in time (start = finish - wall time)
    spans = sorted(
        (
            r.summary["trained_by"]["finished"] - r.summary["wall_time_s"],
            r.summary["trained_by"]["finished"],
        )
        for r in runs
    )
    assert any(a_end > b_start for (a_start, a_end), (b_start, b_end) in zip(spans, spans[1:]))
    for r in runs:
        assert steps_and_losses(r.path)[0] == list(range(1, 61))
        assert steps_and_losses(r.path)[1] == pytest.approx(
            steps_and_losses(tmp_path / "one" / r.name)[1], rel=1e-6
        )


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_a_task_whose_worker_is_killed_is_retried_from_its_checkpoint(tmp_path, ray_instance):
    body = spec(steps=200, seeds=(0,))
    body["sweep"]["models"] = ["lrt"]
    (cfg,) = expand(body)
    folder = tmp_path / cfg.run_name
    killed = {}

    def kill_once():  # the worker holding the run's claim, once it has trained a while
        deadline = time.time() + 240
        while time.time() < deadline:
            claim, metrics = folder / CLAIM, folder / "metrics.jsonl"
            if claim.exists() and metrics.exists() and len(metrics.read_text().splitlines()) >= 25:
                pid = json.loads(claim.read_text())["pid"]
                os.kill(pid, signal.SIGKILL)
                killed["pid"] = pid
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_once)
    killer.start()
    (run,) = run_sweep(body, out=str(tmp_path), progress=False, workers=2, threads_per_run=1)
    killer.join()
    assert "pid" in killed
    assert run.is_complete and run.summary["trained_by"]["pid"] != killed["pid"]
    assert steps_and_losses(folder)[0] == list(range(1, 201))  # every step once, after the retry


@pytest.mark.slow
def test_slurm_job_array_through_submitit_local_executor(tmp_path):
    submitit = pytest.importorskip("submitit")
    from lrt_lab.training.parallel import SlurmGridPoint, parse_slurm, run_on_slurm

    assert parse_slurm("partition=gpu,gpus_per_node=1,timeout_min=240") == {
        "partition": "gpu",
        "gpus_per_node": 1,
        "timeout_min": 240,
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_slurm("partition")
    configs = expand(spec(steps=20, seeds=(0,)))
    executor = submitit.LocalExecutor(folder=str(tmp_path / "jobs"))
    jobs = run_on_slurm(configs, str(tmp_path / "store"), {"timeout_min": 10}, executor=executor)
    results = [j.result() for j in jobs]
    assert sorted(r["status"] for r in results) == ["complete", "complete"]
    assert all(Run(tmp_path / "store" / c.run_name).is_complete for c in configs)
    # a preemption warning: the job hands back the same grid point, to resume from its checkpoint
    again = SlurmGridPoint().checkpoint(configs[0], str(tmp_path / "store"), None)
    assert isinstance(again, submitit.helpers.DelayedSubmission) and again.args[0] == configs[0]


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_sigterm_on_a_ray_sweep_checkpoints_each_run_in_flight_and_a_resume_completes_them(
    tmp_path, ray_instance
):
    """SIGTERM on a Ray sweep's driver (`lrt-lab sweep --workers 2`) with both runs in flight:
    each task checkpoints at the end of its current step before the driver exits (no periodic
    checkpoint exists to fall back on: checkpoint_every = 0), and the next invocation continues
    both to the losses of an uninterrupted run, every step once. The driver joins the test run's
    Ray instance by its address (`--address HOST:PORT`, as on a cluster), so the test pays for
    no second instance. Not `auto`: that joins whichever instance on this machine started last,
    a sweep the user has running included, whose cores may all be busy."""
    body = spec(steps=250, seeds=(0,))  # stopped at step ~20: far from the end at any speed
    body["train"]["checkpoint_every"] = 0  # a checkpoint only at the end, or at the stop
    lines = [
        "[sweep]",
        'tasks = ["a5_prefix"]',
        'models = ["transformer", "lrt"]',
        "seeds = [0]",
        "[train]",
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in body["train"].items()]
    (tmp_path / "grid.toml").write_text("\n".join(lines) + "\n")
    args = [
        sys.executable,
        "-m",
        "lrt_lab",
        "sweep",
        str(tmp_path / "grid.toml"),
        "--out",
        str(tmp_path / "s"),
        "--workers",
        "2",
        "--threads-per-run",
        "1",
        "--address",
        ray_instance.get_runtime_context().gcs_address,
        "--quiet",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    driver = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def logged():  # lines per run folder (both runs train at once, one per worker)
        return [len(p.read_text().splitlines()) for p in (tmp_path / "s").glob("*/metrics.jsonl")]

    deadline = time.time() + 300
    while time.time() < deadline and not (len(logged()) == 2 and min(logged()) >= 20):
        time.sleep(0.2)
    driver.send_signal(signal.SIGTERM)
    out, err = driver.communicate(timeout=200)
    assert driver.returncode == exitcodes.INCOMPLETE, err[-2000:]  # a grid with runs left
    assert "run the same command again" in out
    runs = [Run(p.parent) for p in (tmp_path / "s").glob("*/config.json")]  # not the plan's
    assert len(runs) == 2 and not any(r.is_complete for r in runs)
    for run in runs:  # each checkpointed at its last step: nothing trained is lost
        last = max(steps_and_losses(run.path)[0])
        assert 20 <= last < 250, (run.name, last)
        assert run.latest_checkpoint().name == f"step_{last:07d}.pt", run.name
    # the next invocation (one process) continues each run from its checkpoint: every step once,
    # each loss as an uninterrupted run's
    whole = {r.name: r for r in run_sweep(body, out=str(tmp_path / "whole"), progress=False)}
    finished = run_sweep(body, out=str(tmp_path / "s"), progress=False)
    assert sorted(r.name for r in finished) == sorted(whole)
    for run in finished:
        steps, losses = steps_and_losses(run.path)
        assert run.is_complete and steps == list(range(1, 251))
        assert losses == pytest.approx(steps_and_losses(whole[run.name].path)[1], rel=1e-6)


def test_a_grid_point_checkpoints_and_returns_when_its_sweep_stops(tmp_path, monkeypatch):
    """What a stopping Ray driver asks of each task (the stop file), without Ray: the run in
    flight checkpoints at the end of its step and returns "incomplete", where a forced cancel
    used to lose up to its checkpoint interval. The driver's side needs a Ray that starts."""
    from lrt_lab.training import parallel
    from lrt_lab.training.train_config import TrainConfig

    monkeypatch.setattr(parallel, "STOP_POLL_S", 0.02)
    cfg = TrainConfig(
        **{**spec()["train"], "steps": 100_000, "checkpoint_every": 0},  # at the end or the stop
        task="a5_prefix",
        model="transformer",
        schedule="onepass",
    )
    stop_file = tmp_path / ".sweep-stop"
    metrics = tmp_path / cfg.run_name / "metrics.jsonl"

    def stop_after_a_few_steps():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
                break
            time.sleep(0.01)
        stop_file.touch()

    threading.Thread(target=stop_after_a_few_steps, daemon=True).start()
    result = parallel.train_grid_point(cfg, str(tmp_path), threads=1, stop_file=str(stop_file))
    assert result["status"] == "incomplete", result
    run = Run(tmp_path / cfg.run_name)
    last = load_metrics(run, kind="train")["step"].max()
    assert 5 <= last < 100_000 and run.latest_checkpoint().name == f"step_{last:07d}.pt"


def test_a_local_ray_that_times_out_starting_is_tried_again_with_the_waits_set(monkeypatch):
    """Ray's node start-up timeout (its raylet gives up on a slow dashboard agent under load) is
    tried again, with RAY_START_ENV's waits in the environment the Ray processes inherit; any
    other error, and the last try's, is raised as it is."""
    from lrt_lab.training import parallel

    for name in parallel.RAY_START_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_health_check_timeout_ms", "12345")  # the user's own wins

    class FakeRay:
        def __init__(self, errors):
            self.errors, self.calls = list(errors), []

        def init(self, **options):
            self.calls.append(("init", options))
            if self.errors:
                raise self.errors.pop(0)

        def shutdown(self):
            self.calls.append(("shutdown", None))

    timed_out = Exception("The current node timed out during startup. This could happen ...")
    ray = FakeRay([timed_out])
    parallel.init_local_ray(ray, num_cpus=2)
    assert ray.calls == [("init", {"num_cpus": 2}), ("shutdown", None), ("init", {"num_cpus": 2})]
    assert os.environ["RAY_worker_register_timeout_seconds"] == "300"
    assert os.environ["RAY_health_check_timeout_ms"] == "12345"
    with pytest.raises(Exception, match="timed out during startup"):
        parallel.init_local_ray(FakeRay([timed_out] * 3), attempts=3)
    other = FakeRay([ValueError("bad option")])
    with pytest.raises(ValueError, match="bad option"):
        parallel.init_local_ray(other)
    assert [c for c, _ in other.calls] == ["init"]
