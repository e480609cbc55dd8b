"""Sweeps over many processes, GPUs and nodes: each grid point is one call of `train_grid_point`,
run as a Ray task (`lrt-lab sweep SPEC --workers N [--address auto]`) or a Slurm array job through
submitit (`lrt-lab sweep SPEC --slurm partition=...`).

The run store is the only shared state (it must sit on a filesystem every node sees). A grid point
claims its run folder before it writes (`lrt_lab.store.claims`), so a retried task, a requeued job
or a second sweep on the same store never trains a run twice: a task whose worker died is retried
from the run's checkpoint (its dead owner's claim is taken over), one that fails records its error
in the run folder (`last_error.json`) and the grid goes on. Ray and submitit are optional extras
(`pip install 'lrt-lab[cluster]'`, `'lrt-lab[slurm]'`) imported only on these paths.

Stopping a Ray sweep (Ctrl-C or SIGTERM on the driver) lets each run in flight checkpoint first:
the driver writes a stop file into the store, which every task it started watches; their training
loops checkpoint at the end of the current step and return (up to STOP_GRACE_S), and only the
tasks still running then are cancelled by force.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

from lrt_lab.store.claims import RunClaimedError
from lrt_lab.store.results import Run, write_json
from lrt_lab.training.loop import TrainConfig, train
from lrt_lab.training.stopping import StopRequest

RETRIES = 2  # times a grid point whose worker died (killed, node lost, out of memory) is retried
WAIT_S = 15.0  # before submitting again a run another process was training
STOP_GRACE_S = 120.0  # how long a stopping Ray driver waits for its runs to checkpoint
STOP_POLL_S = 1.0  # how often a task looks for its driver's stop file


def train_grid_point(
    cfg: TrainConfig,
    out: str,
    threads: int | None = None,
    deadline_s: float | None = None,
    log=(),
    stop_file: str | None = None,
) -> dict:
    """Train (or resume) one run of a grid; returns {"run", "status", "host", "pid"[, "error"]}.

    status: "complete" / "diverged" (summary written), "incomplete" (stopped by a signal, the
    deadline or `stop_file` appearing: checkpointed), "claimed" (another live process trains it),
    "failed" (an error, recorded in the run folder's last_error.json). log: the run's mirrors
    (train's `log`)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    folder = Path(out) / cfg.run_name
    where = {"run": cfg.run_name, "host": socket.gethostname(), "pid": os.getpid()}
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    stop = StopRequest()
    try:
        with stop.installed(), _watching(stop_file, stop):
            run = train(
                cfg,
                out=out,
                resume=(folder / "config.json").exists(),
                progress=False,
                deadline=deadline,
                stop=stop,
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


@contextlib.contextmanager
def _watching(stop_file: str | None, stop: StopRequest, every: float | None = None):
    """While inside, a daemon thread sets `stop` once `stop_file` exists (a stopping driver's)."""
    if stop_file is None:
        yield
        return
    done = threading.Event()

    def watch():
        while not done.wait(STOP_POLL_S if every is None else every):
            if Path(stop_file).exists():
                stop.requested = stop.requested or "the sweep's stop"
                return

    watcher = threading.Thread(target=watch, daemon=True, name="sweep-stop-watcher")
    watcher.start()
    try:
        yield
    finally:
        done.set()


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
    GPUs; returns one result per run (train_grid_point). Ctrl-C or SIGTERM stops the tasks: each
    checkpoints at the end of its step (the stop file, up to STOP_GRACE_S), then what still runs
    is cancelled; the next invocation continues from the checkpoints."""
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
    stop_file = Path(out) / f".sweep-stop.{socket.gethostname()}.{os.getpid()}.{time.time_ns()}"
    try:
        with stop.installed():
            while (todo or running) and not stop.requested:
                while todo and len(running) < workers:
                    cfg = todo.pop(0)
                    running[task.remote(cfg, out, threads, log=log, stop_file=str(stop_file))] = cfg
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
            _stop_gracefully(ray, running, stop_file, results)
        bar.close()
        if started_here:
            ray.shutdown()
    return [results.get(c.run_name, {"run": c.run_name, "status": "incomplete"}) for c in configs]


def _stop_gracefully(ray, running: dict, stop_file: Path, results: dict) -> None:
    """Ask the running tasks to checkpoint and return (the stop file they watch), wait up to
    STOP_GRACE_S for them, then cancel by force whatever still runs."""
    try:
        if running:
            stop_file.touch()
            print(
                f"sweep: stopping; {len(running)} run(s) in flight checkpoint first (up to "
                f"{STOP_GRACE_S:.0f} s; again to cancel them now)",
                file=sys.stderr,
            )
            done, _ = ray.wait(list(running), num_returns=len(running), timeout=STOP_GRACE_S)
            for ref in done:
                with contextlib.suppress(Exception):
                    result = ray.get(ref)
                    results[result["run"]] = result
                running.pop(ref)
    except (KeyboardInterrupt, OSError):
        pass  # a second Ctrl-C, or a store that cannot take the file: cancel now
    finally:
        for ref in running:
            ray.cancel(ref, force=True)
        stop_file.unlink(missing_ok=True)


# Ray's start-up and liveness waits, as RAY_<name> variables its processes (GCS, raylet, workers)
# read when they start. Ray's defaults suit an idle machine; on a loaded one with few cores (a
# laptop running a sweep, CI's 2 cores under a test suite) a worker importing torch can take more
# than the 60 s Ray allows it to register, and a raylet busy with training can miss five health
# checks in a row and be taken for dead, killing every run in flight. A value set in the
# environment already wins.
RAY_START_ENV = {
    "RAY_worker_register_timeout_seconds": "300",  # default 60
    "RAY_agent_register_timeout_ms": "300000",  # default 100 000: the dashboard agent's
    "RAY_health_check_timeout_ms": "30000",  # default 10 000
    "RAY_health_check_failure_threshold": "20",  # default 5 misses, every 3 s
    "RAY_gcs_rpc_server_reconnect_timeout_s": "300",  # default 60
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage report thread (or its network wait) at start
}


def ray_start_env() -> None:
    """Set RAY_START_ENV's waits in this process's environment (where unset), for the Ray
    processes a local `ray.init` is about to start; a sweep's driver and the test suite's shared
    instance call it."""
    for name, value in RAY_START_ENV.items():
        os.environ.setdefault(name, value)


RAY_START_ATTEMPTS = 3


def init_local_ray(ray, attempts: int = RAY_START_ATTEMPTS, **options) -> None:
    """`ray.init(**options)` for a local instance, with RAY_START_ENV's waits, tried again where
    the node timed out during start-up. Two of Ray's start-up waits are fixed in its code, not
    settings: the raylet's 15 s for its dashboard agent to write its port file (it then exits)
    and the driver's 30 s for the raylet; on a loaded 2-core machine the agent (a Python process)
    can miss the first, and a second try usually starts."""
    ray_start_env()
    for attempt in range(1, attempts + 1):
        try:
            ray.init(**options)
            return
        except Exception as e:
            if "timed out during startup" not in str(e) or attempt == attempts:
                raise
            ray.shutdown()  # what the failed try started
            print(
                f"sweep: Ray's node timed out during start-up (a loaded machine); trying again "
                f"({attempt + 1}/{attempts})",
                file=sys.stderr,
            )


def _start_ray(ray, address: str | None, cpus: int, threads: int, gpus_per_run: float) -> None:
    if address is None:  # a local instance sized to the grid: `workers` tasks fit at once
        init_local_ray(
            ray,
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
