"""`lrt-lab sweep SPEC.toml`: a grid of runs (tasks x models x schedules x seeds) with one progress
bar.

    [sweep]
    out = "runs/a5"                      # run store (the CLI's --out wins)
    tasks = ["a5_prefix", "z60_prefix"]
    models = ["transformer", "lrt"]      # a transformer or baseline (loop:N, ponder:N) runs once
    (onepass)
    schedules = ["interleaved:2", "fullseq:3", "exact"]
    seeds = [0, 1, 2]

    [train]                              # any TrainConfig field, shared by every run
    length = 16
    preset = "small"
    steps = 2000
    task_options = { curriculum_start = 4, curriculum_steps = 800 }
    overrides = { n_layer = 2 }

    [models.deep]                        # optional named variants: a model kind plus its own fields
    model = "transformer"
    overrides = { n_layer = 4 }

A run already complete in the store is skipped; an incomplete one is resumed from its checkpoint.
A run's identity is its whole config: a complete run whose config.json differs from what the spec
builds now (say `steps` or `batch_size` changed) stops the sweep before anything trains, naming
the differing fields (rename the run with `name_prefix`, or use another store). Several sweeps may
share a store: each run folder is claimed by the process that trains it (`lrt_lab.store.claims`), a
sweep skips the runs another live process is training and comes back to them at the end, waiting
until they are complete (or their owner is gone, when it takes them over). A run that diverges
(NaN loss) is recorded as such and the grid goes on. `time_limit_s` (`--time-limit`), SIGTERM and
SIGUSR1 end an invocation the same way: the run in progress is checkpointed, and the next
invocation continues it (experiments/run_paper_a5.sh). `lrt-lab sweep` exits 0 only when every run
of the grid is complete: 3 while any is unfinished (stopped, or submitted to Slurm), 4 when all are
finished and some diverged (`lrt_lab.training.exitcodes`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import sys
import time
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from typing import TYPE_CHECKING

from lrt_lab.core.validation import check_int, check_out_dir
from lrt_lab.store.claims import RunClaimedError, claimed_by_other
from lrt_lab.training.stopping import StopRequest
from lrt_lab.training.train_config import TrainConfig, stored_train_config

# The run store (pandas), the study's statistics (scipy) and the training loop (torch) load when
# a grid is checked or trained, not with this module: a spec's bad key or schedule is refused at
# once (the command line's help and argument errors load none of them: tests/test_plugins.py).
if TYPE_CHECKING:
    from lrt_lab.store.results import Run

WAIT_S = 15.0  # how often a sweep looks again at a run another process trains

SWEEP_KEYS = {"out", "tasks", "models", "schedules", "seeds", "budgets", "order", "name_prefix"}
ORDERS = ("grid", "seeds")
TRAIN_KEYS = {f.name for f in dataclasses.fields(TrainConfig)} - {
    "task",
    "model",
    "schedule",
    "seed",
    "name",
}


def load_spec(path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ValueError(
            f"spec={str(path)!r} is invalid: no such file; allowed: a path to a .toml sweep spec"
        )
    if not path.is_file():
        raise ValueError(
            f"spec={str(path)!r} is invalid: not a file; allowed: a path to a .toml sweep spec"
        )
    try:
        spec = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"spec {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"spec {path}: not valid TOML: {e}") from None
    return validate_spec(spec)


def _list_of(where: str, value, kind: type, what: str, required: bool = True) -> None:
    """A non-empty list of `kind` (a TOML string where a list belongs would be iterated letter by
    letter)."""
    ok = (
        isinstance(value, list)
        and (value or not required)
        and all(isinstance(v, kind) and not (kind is int and isinstance(v, bool)) for v in value)
    )
    if not ok:
        raise ValueError(
            f"{where}={value!r} is invalid; allowed: a{' non-empty' if required else ''} list of "
            f"{what}"
        )


def _table(where: str, value) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{where}={value!r} is invalid; allowed: a TOML table ([{where}])")
    return value


def _budgets(where: str, value) -> None:
    ok = (
        isinstance(value, list)
        and value
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value)
    )
    if not ok:
        raise ValueError(
            f"{where}={value!r} is invalid; allowed: a non-empty list of tokens-per-parameter "
            "budgets > 0"
        )


def validate_spec(spec: dict) -> dict:
    """Check the spec's shape and field types; the runs themselves are checked by
    `expand`/`check_grid`."""
    _table("spec", spec)
    unknown = set(spec) - {"sweep", "train", "models", "study"}
    if unknown:
        raise ValueError(
            f"spec: unknown section(s) {sorted(unknown)}; allowed: [sweep], [train], "
            "[models.NAME], [study]"
        )
    sweep = _table("sweep", spec.get("sweep", {}))
    bad = set(sweep) - SWEEP_KEYS
    if bad:
        raise ValueError(
            f"[sweep] {sorted(bad)}: unknown key; allowed: {', '.join(sorted(SWEEP_KEYS))}"
        )
    bad = set(_table("train", spec.get("train", {}))) - TRAIN_KEYS
    if bad:
        raise ValueError(
            f"[train] {sorted(bad)}: unknown key; allowed: {', '.join(sorted(TRAIN_KEYS))}"
        )
    for name, variant in _table("models", spec.get("models", {})).items():
        bad = set(_table(f"models.{name}", variant)) - (
            TRAIN_KEYS | {"model", "schedules", "budgets"}
        )
        if bad:
            raise ValueError(
                f"[models.{name}] {sorted(bad)}: unknown key; allowed: model, schedules, budgets, "
                + ", ".join(sorted(TRAIN_KEYS))
            )
        if "model" in variant and not isinstance(variant["model"], str):
            raise ValueError(
                f"models.{name}.model={variant['model']!r} is invalid; allowed: a model kind "
                "string "
                "(transformer, lrt, loop:N, ponder:N)"
            )
        if "schedules" in variant:
            _list_of(f"models.{name}.schedules", variant["schedules"], str, "schedule strings")
        if "budgets" in variant:
            _budgets(f"models.{name}.budgets", variant["budgets"])
    if "tasks" not in sweep:
        raise ValueError("[sweep] tasks: required, a non-empty list of task names")
    _list_of("sweep.tasks", sweep["tasks"], str, "task names")
    if "models" not in sweep:
        raise ValueError(
            "[sweep] models: required, a non-empty list (transformer, lrt, or [models.NAME] "
            "variants)"
        )
    _list_of("sweep.models", sweep["models"], str, "model kinds or [models.NAME] variant names")
    if "schedules" in sweep:
        _list_of("sweep.schedules", sweep["schedules"], str, "schedule strings")
    if "seeds" in sweep:
        _list_of("sweep.seeds", sweep["seeds"], int, "integer seeds")
    if "budgets" in sweep:
        _budgets("sweep.budgets", sweep["budgets"])
    if sweep.get("order", "grid") not in ORDERS:
        raise ValueError(
            f"sweep.order={sweep['order']!r} is invalid; allowed: {', '.join(map(repr, ORDERS))}"
        )
    for key in ("out", "name_prefix"):
        if key in sweep and not isinstance(sweep[key], str):
            raise ValueError(f"sweep.{key}={sweep[key]!r} is invalid; allowed: a string")
    if "study" in spec:  # lrt_lab.store.study_spec: its fields, then its arms against the grid
        from lrt_lab.store.study_spec import check_arms, parse_study

        study = parse_study(spec["study"])
        check_arms(
            study,
            [{"train": c.to_dict(), "kind": c.model, "schedule": c.schedule} for c in expand(spec)],
        )
    return spec


def expand(spec: dict) -> list[TrainConfig]:
    """Every TrainConfig of the grid (validated), in a stable order, with unique names."""
    sweep, shared, variants = spec["sweep"], spec.get("train", {}), spec.get("models", {})
    schedules = sweep.get("schedules", ["interleaved:2"])
    prefix = sweep.get("name_prefix", "")
    configs, names = [], set()
    for task in sweep["tasks"]:
        for label in sweep["models"]:
            variant = dict(variants.get(label, {}))
            kind = variant.pop("model", label)
            model_schedules = variant.pop("schedules", schedules)
            # tokens-per-parameter budgets: one run per budget point (None: the [train] value)
            budgets = variant.pop("budgets", sweep.get("budgets", [None]))
            if kind != "lrt":  # transformer and baselines: their training forward is onepass
                model_schedules = ["onepass"]
            for sched, seed, budget in itertools.product(
                model_schedules, sweep.get("seeds", [0]), budgets
            ):
                fields = {
                    **shared,
                    **variant,
                    "task": task,
                    "model": kind,
                    "schedule": sched,
                    "seed": seed,
                }
                if budget is not None:
                    fields["tokens_per_param"] = budget
                if "overrides" in shared and "overrides" in variant:
                    fields["overrides"] = {**shared["overrides"], **variant["overrides"]}
                tag = "" if label == kind else f"-{label}"
                # no options digest (TrainConfig.run_name): a variant's label tells it apart, and
                # the runs a sweep trained before the digest existed keep their names
                base = TrainConfig(**{**fields, "name": None}).base_name
                # built again with its name, so the name (prefix, variant label) is validated
                # too
                cfg = TrainConfig(**{**fields, "name": f"{prefix}{base}{tag}".replace(":", "_")})
                if cfg.name in names:
                    continue
                names.add(cfg.name)
                configs.append(cfg)
    if sweep.get("order") == "seeds":  # every seed's whole grid before the next seed's
        configs.sort(key=lambda c: sweep.get("seeds", [0]).index(c.seed))
    return configs


def run_sweep(
    spec: dict,
    out: str | None = None,
    dry_run: bool = False,
    time_limit_s: float | None = None,
    progress: bool = True,
    wait_s: float = WAIT_S,
    workers: int = 1,
    threads_per_run: int | None = None,
    gpus_per_run: float = 0.0,
    address: str | None = None,
    slurm: dict | None = None,
    log=(),
) -> list[Run]:
    """Train every run of the grid not yet complete. With time_limit_s (or on SIGTERM / SIGUSR1),
    stop (checkpointed) once that many seconds have passed; the Runs returned then include
    incomplete ones. Runs other processes are training are done last: waited for, or taken over
    when their owner is gone.

    workers > 1 or an address: the runs are Ray tasks, `workers` at a time, each with
    threads_per_run CPU threads and gpus_per_run GPUs (`lrt_lab.training.parallel`); slurm: submitit
    parameters, the grid goes to Slurm as a job array (the jobs are returned, not waited for).
    log: mirrors for every run (train's `log`; not part of the grid's configs): the seeds of one
    config share a W&B group."""
    if time_limit_s is not None and not (
        isinstance(time_limit_s, (int, float)) and time_limit_s > 0
    ):
        raise ValueError(
            f"time_limit_s={time_limit_s!r} is invalid; allowed: a number of seconds > 0"
        )
    from lrt_lab.store.results import Run, write_plan
    from lrt_lab.training.mirrors import mirror_settings

    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
    out = out or spec["sweep"].get("out", "runs")
    configs = checked_grid(spec, out)
    mirroring = mirror_settings(log)  # a missing package fails before the first run
    if dry_run:
        for cfg in configs:
            print(f"{run_state(Path(out) / cfg.run_name):9s} {cfg.run_name}")
        return []
    write_plan(out, [c.run_name for c in configs], sorted({c.seed for c in configs}))
    check_int("workers", workers, 1)
    if threads_per_run is not None:
        check_int("threads_per_run", threads_per_run, 1)
    if slurm is not None or workers > 1 or address is not None:
        return _run_elsewhere(
            configs,
            out,
            workers,
            threads_per_run,
            gpus_per_run,
            address,
            slurm,
            progress,
            mirroring,
        )
    stop = StopRequest()
    with stop.installed(), _threads_here(threads_per_run):
        runs = _run_here(configs, out, deadline, stop, progress, wait_s, mirroring)
    _say_done(configs, out, f" (stopped on {stop.requested})" if stop.requested else "")
    return [runs.get(c.run_name) or Run(Path(out) / c.run_name) for c in configs]


@contextlib.contextmanager
def _threads_here(threads_per_run: int | None):
    """torch's threads for a grid trained in this process: threads_per_run, else what `train`
    takes (the free cores, claimed: lrt_lab.training.threads); restored afterwards."""
    import torch

    from lrt_lab.training.threads import apply_threads, choose_threads

    saved = torch.get_num_threads()
    apply_threads(choose_threads(threads_per_run))
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def checked_grid(spec: dict, out: str) -> list[TrainConfig]:
    """The grid's configs, every run checked before the first one writes anything, and none of
    the complete ones changed by the spec (`check_unchanged`)."""
    check_out_dir("out", out)
    grid = expand(spec)  # a bad field of the spec is refused here, before torch loads
    from lrt_lab.training.loop import budgeted, prepare  # the model is built (on meta): torch

    configs = []
    for cfg in grid:
        try:
            cfg = budgeted(cfg)  # a tokens-per-parameter budget sets the steps
            prepare(cfg)
        except ValueError as e:
            raise ValueError(f"run {cfg.run_name}: {e}") from None
        configs.append(cfg)
    check_unchanged(configs, Path(out))
    return configs


def _run_elsewhere(
    configs, out, workers, threads_per_run, gpus_per_run, address, slurm, progress, mirroring
) -> list[Run]:
    """The runs not yet complete as Ray tasks (waited for) or a Slurm job array (submitted)."""
    from lrt_lab.store.results import Run
    from lrt_lab.training import parallel

    todo = parallel.pending_runs(configs, out)
    if slurm is not None:
        if threads_per_run is not None:  # each job asks for its threads' cores, and uses them
            slurm = {"cpus_per_task": threads_per_run, **slurm}
        jobs = parallel.run_on_slurm(todo, out, slurm, log=mirroring)
        print(
            f"sweep: submitted {len(jobs)} run(s) to Slurm as a job array "
            f"({len(configs) - len(todo)} "
            f"already complete); run the same command again once they finish to check the grid"
        )
    else:
        parallel.run_on_ray(
            todo, out, workers, threads_per_run, gpus_per_run, address, progress, log=mirroring
        )
        _say_done(configs, out)
    return [Run(Path(out) / c.run_name) for c in configs]


def _run_here(
    configs, out, deadline, stop: StopRequest, progress: bool, wait_s: float, mirroring
) -> dict[str, Run]:
    """Train the grid in this process, one run at a time; runs other processes hold are passed
    over, and come back when everything else is done (waited for, or taken over)."""
    from tqdm.auto import tqdm

    bar = tqdm(
        total=len(configs), desc="sweep", unit="run", dynamic_ncols=True, disable=not progress
    )
    runs: dict[str, Run] = {}
    trained: list[str] = []  # the runs this segment has trained (resumed or started)
    pending = list(configs)
    while pending and not stopped(stop, deadline, trained):
        waiting = [
            cfg
            for cfg in pending
            if not _train_or_skip(cfg, out, deadline, stop, bar, runs, trained, mirroring)
        ]
        if waiting and len(waiting) == len(pending) and not stopped(stop, deadline, trained):
            owners = "; ".join(
                f"{c.run_name} ({claimed_by_other(Path(out) / c.run_name) or 'free now'})"
                for c in waiting[:3]
            )
            tqdm.write(
                f"sweep: waiting for {len(waiting)} run(s) other processes train: {owners}",
                file=sys.stderr,
            )
            time.sleep(wait_s)
        pending = waiting
    bar.close()
    return runs


def _train_or_skip(
    cfg: TrainConfig, out, deadline, stop: StopRequest, bar, runs: dict, trained: list, mirroring
) -> bool:
    """Train one run of the grid (resuming its folder) unless it is complete; False when it must
    wait: out of time, or another process holds its claim. Appends the run's name to `trained`
    when it trained it."""
    from tqdm.auto import tqdm

    from lrt_lab.store.results import Run

    if stopped(stop, deadline, trained):
        return False
    folder = Path(out) / cfg.run_name
    bar.set_postfix_str(cfg.run_name)
    if (folder / "summary.json").exists():
        runs[cfg.run_name] = Run(folder)
        bar.update(1)
        return True
    if claimed_by_other(folder):
        return False
    try:
        run = train(
            cfg,
            out=out,
            resume=(folder / "config.json").exists(),
            progress=False,
            deadline=deadline,
            stop=stop,
            log=mirroring,
        )
    except (RunClaimedError, FileExistsError):  # another process took it just now
        return False
    runs[cfg.run_name] = run
    trained.append(cfg.run_name)
    if run.is_complete:
        bar.update(1)
        tqdm.write(f"{run.status:9s} {run.name}", file=sys.stderr)
    return True


def train(*args, **kwargs) -> Run:
    """`lrt_lab.training.loop.train` (torch), imported when a run of the grid trains."""
    from lrt_lab.training.loop import train as train_run

    return train_run(*args, **kwargs)


def _say_done(configs, out, why: str = "") -> None:
    from lrt_lab.store.results import Run, first_names

    statuses = {c.run_name: Run(Path(out) / c.run_name).status for c in configs}
    done = sum(s == "complete" for s in statuses.values())
    diverged = [name for name, s in statuses.items() if s == "diverged"]
    print(
        f"sweep: {done} of {len(configs)} runs complete in {out}{why}"
        + (f"; {len(diverged)} diverged: {first_names(diverged)}" if diverged else "")
        + (
            ""
            if done + len(diverged) == len(configs)
            else "; run the same command again to continue"
        )
    )


def stopped(stop: StopRequest, deadline: float | None, trained: list | None = None) -> bool:
    """A signal arrived, or the time limit passed. With `trained` (the runs this segment has
    trained), the time limit stops nothing before the first: every segment then trains at least
    one step (train checks the deadline after each step), so a limit shorter than the start-up
    still makes progress instead of looping forever."""
    out_of_time = deadline is not None and time.monotonic() >= deadline
    return stop.requested is not None or (out_of_time and (trained is None or bool(trained)))


def run_state(folder: Path) -> str:
    """complete / diverged / claimed / partial / todo, for --dry-run."""
    from lrt_lab.store.results import Run

    if (folder / "summary.json").exists():
        return Run(folder).status
    if claimed_by_other(folder):
        return "claimed"
    return "partial" if (folder / "config.json").exists() else "todo"


def check_unchanged(configs: list[TrainConfig], out: Path) -> None:
    """Refuse a grid whose complete runs were trained with another config than the spec builds now
    (their names leave out steps, batch size, rates and overrides)."""
    from lrt_lab.store.results import Run
    from lrt_lab.training.checkpoints import config_differences

    changed = []
    for cfg in configs:
        folder = out / cfg.run_name
        if not (folder / "summary.json").exists():
            continue
        saved = stored_train_config(Run(folder).config.get("train", {}))
        diffs = config_differences(saved, cfg.to_dict())
        if diffs:
            changed.append(f"{cfg.run_name} ({'; '.join(diffs[:4])})")
    if changed:
        raise ValueError(
            f"{len(changed)} complete run(s) in {out} were trained with another config than the "
            "spec "
            f"gives now: {' | '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}; keep the "
            "spec, "
            "or give the changed runs new names (sweep.name_prefix) or another --out"
        )
