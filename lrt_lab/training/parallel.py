"""Sweeps over many processes, GPUs and nodes: each grid point is one call of `train_grid_point`,
run as a Ray task (`lrt-lab sweep SPEC --workers N [--address auto]`) or a Slurm array job through
submitit (`lrt-lab sweep SPEC --slurm partition=...`).

The run store is the only shared state (it must sit on a filesystem every node sees). A grid point
claims its run folder before it writes (`lrt_lab.store.claims`), so a retried task, a requeued job
or a
second sweep on the same store never trains a run twice: a task whose worker died is retried from
the run's checkpoint (its dead owner's claim is taken over), one that fails records its error in
the run folder (`last_error.json`) and the grid goes on. Ray and submitit are optional extras
(`pip install 'lrt-lab[cluster]'`, `'lrt-lab[slurm]'`) imported only on these paths.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from pathlib import Path

from lrt_lab.store.claims import RunClaimedError
from lrt_lab.store.results import Run, write_json
from lrt_lab.training.loop import TrainConfig, train
from lrt_lab.training.stopping import StopRequest

RETRIES = 2  # times a grid point whose worker died (killed, node lost, out of memory) is retried
WAIT_S = 15.0  # before submitting again a run another process was training


def train_grid_point(
    cfg: TrainConfig, out: str, threads: int | None = None, deadline_s: float | None = None, log=()
) -> dict:
    """Train (or resume) one run of a grid; returns {"run", "status", "host", "pid"[, "error"]}.

    status: "complete" / "diverged" (summary written), "incomplete" (stopped by a signal or the
    deadline: checkpointed), "claimed" (another live process trains it), "failed" (an error,
    recorded in the run folder's last_error.json). log: the run's mirrors (train's `log`)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    folder = Path(out) / cfg.run_name
    where = {"run": cfg.run_name, "host": socket.gethostname(), "pid": os.getpid()}
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    try:
        run = train(
            cfg,
            out=out,
            resume=(folder / "config.json").exists(),
            progress=False,
            deadline=deadline,
            log=log,
        )
    except (RunClaimedError, FileExistsError):
        return {**where, "status": "claimed"}
    except Exception as e:  # noqa: BLE001 - recorded, and the grid goes on
        error = f"{type(e).__name__}: {e}"
        if folder.is_dir():
            write_json(
                folder / "last_error.json",
                {**where, "error": error, "traceback": traceback.format_exc()},
            )
        return {**where, "status": "failed", "error": error}
    return {**where, "status": run.status}


def run_on_ray(
    configs: list[TrainConfig],
    out: str,
    workers: int,
    threads_per_run: int | None = None,
    gpus_per_run: float = 0.0,
    address: str | None = None,
    progress: bool = True,
    retries: int = RETRIES,
    wait_s: float = WAIT_S,
    log=(),
) -> list[dict]:
    """Train `configs` as Ray tasks, at most `workers` at a time, each with its CPU threads and
    GPUs; returns one result per run (train_grid_point). Ctrl-C or SIGTERM cancels the tasks
    (checkpointed runs continue on the next invocation)."""
    import ray
    from tqdm.auto import tqdm

    threads = threads_per_run or max(1, (os.cpu_count() or 1) // workers)
    # Ray already running in this process (a notebook's, a test fixture's) is used and left
    # running: starting a local instance costs seconds, and shutting down the caller's would
    # break what it does next. Workers set their thread count themselves (train_grid_point).
    started_here = not ray.is_initialized()
    if started_here:
        _start_ray(ray, address, workers * threads, threads, gpus_per_run)
    task = ray.remote(num_cpus=threads, num_gpus=gpus_per_run, max_retries=retries)(
        train_grid_point
    )
    todo, running, results = list(configs), {}, {}
    bar = tqdm(
        total=len(configs), desc="sweep", unit="run", dynamic_ncols=True, disable=not progress
    )
    stop = StopRequest()
    try:
        with stop.installed():
            while (todo or running) and not stop.requested:
                while todo and len(running) < workers:
                    cfg = todo.pop(0)
                    running[task.remote(cfg, out, threads, log=log)] = cfg
                done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
                for ref in done:
                    cfg = running.pop(ref)
                    try:
                        result = ray.get(ref)
                    except Exception as e:  # noqa: BLE001 - retries exhausted (a worker died each time)
                        result = {
                            "run": cfg.run_name,
                            "status": "failed",
                            "error": f"{type(e).__name__}: {e}",
                        }
                    # trained by another process: look again later
                    if result["status"] == "claimed":
                        time.sleep(min(wait_s, 1.0) if running else wait_s)
                        todo.append(cfg)
                        continue
                    results[cfg.run_name] = result
                    bar.update(1)
                    line = f"{result['status']:9s} {cfg.run_name}" + (
                        f" (on {result['host']}, pid {result['pid']})" if "host" in result else ""
                    )
                    tqdm.write(
                        line + (f": {result['error']}" if "error" in result else ""),
                        file=sys.stderr,
                    )
    except KeyboardInterrupt:
        stop.requested = "SIGINT"
    finally:
        if stop.requested:
            for ref in running:
                ray.cancel(ref, force=True)
        bar.close()
        if started_here:
            ray.shutdown()
    return [results.get(c.run_name, {"run": c.run_name, "status": "incomplete"}) for c in configs]


def _start_ray(ray, address: str | None, cpus: int, threads: int, gpus_per_run: float) -> None:
    if address is None:  # a local instance sized to the grid: `workers` tasks fit at once
        ray.init(
            num_cpus=cpus,
            num_gpus=None if gpus_per_run else 0,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}},
        )
    else:
        ray.init(address=address, log_to_driver=False)


def parse_slurm(text: str) -> dict:
    """`partition=gpu,gpus_per_node=1,timeout_min=240` -> submitit parameters (numbers parsed)."""
    params = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ValueError(
                f"--slurm {text!r} is invalid; allowed: KEY=VALUE[,KEY=VALUE...], e.g. "
                "partition=gpu,gpus_per_node=1,timeout_min=240"
            )
        try:
            params[key] = int(value)
        except ValueError:
            try:
                params[key] = float(value)
            except ValueError:
                params[key] = value
    return params


class SlurmGridPoint:
    """A grid point as a submitit job: checkpoint() is what submitit calls when Slurm warns of
    preemption or the time limit (SIGUSR1 / SIGTERM): the run has checkpointed (train's stop
    request) and the job is requeued with the same arguments, to resume from that checkpoint."""

    def __call__(self, cfg: TrainConfig, out: str, threads: int | None = None, log=()) -> dict:
        return train_grid_point(cfg, out, threads, log=log)

    def checkpoint(self, cfg: TrainConfig, out: str, threads: int | None = None, log=()):
        import submitit

        return submitit.helpers.DelayedSubmission(self, cfg, out, threads, log)


def run_on_slurm(
    configs: list[TrainConfig],
    out: str,
    slurm: dict,
    folder: str | None = None,
    executor=None,
    log=(),
) -> list:
    """Submit the grid as one job array (`slurm_array_parallelism` bounds it); returns the jobs.
    `executor`: a submitit executor to use instead of Slurm's (tests use submitit's local one)."""
    import submitit

    if executor is None:
        executor = submitit.AutoExecutor(folder=folder or str(Path(out) / ".slurm" / "%j"))
    params = dict(slurm)
    parallel = params.pop("slurm_array_parallelism", None)
    executor.update_parameters(**params)
    if parallel is not None and hasattr(executor, "update_parameters"):
        try:
            executor.update_parameters(slurm_array_parallelism=parallel)
        except (TypeError, ValueError):
            pass  # a local executor has no array parallelism
    threads = params.get("cpus_per_task")
    with executor.batch():
        jobs = [executor.submit(SlurmGridPoint(), cfg, out, threads, log) for cfg in configs]
    return jobs


def pending_runs(configs: list[TrainConfig], out: str) -> list[TrainConfig]:
    """The grid points not yet finished (no summary.json)."""
    return [c for c in configs if not Run(Path(out) / c.run_name).is_complete]
