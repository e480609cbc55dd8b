"""What every analysis tool needs from the run store: a run's model, its task, its evaluation
batch, and the store-level tables.

Store-level tables (gap recovery, depth sweep, train/inference mismatch) live in
`<store>/.analysis/tables/<name>.csv` (lrt_lab.store.folders, torch-free, so the statistics in
lrt_results write them too).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lrt_lab.core.config import ModelConfig
from lrt_lab.core.model import LRT
from lrt_lab.core.plugins import load_plugins, loaded_plugins
from lrt_lab.store.folders import (  # noqa: F401 (re-exported: the analyses' store tables)
    ANALYSIS_DIR,
    DEFAULT_OUTPUTS,
    analysis_dir,
    output_dir,
    read_store_table,
    write_store_table,
)
from lrt_lab.store.results import Run
from lrt_lab.training.checkpoints import check_belongs, read_checkpoint
from lrt_lab.training.loop import TrainConfig, make_eval_sets, make_task


def as_run(run) -> Run:
    """A Run from a Run, a run folder path, or a row of load_runs."""
    if isinstance(run, Run):
        return run
    if isinstance(run, pd.Series):
        return Run(run["path"])
    if isinstance(run, (str, Path)):
        return Run(run)
    raise ValueError(
        f"run={run!r} is invalid; allowed: a Run, a run folder path, or a row of load_runs"
    )


def load_model(run, step: int | None = None, map_location="cpu") -> LRT:
    """The model of a run, rebuilt from config.json, with the weights of its latest checkpoint
    (or of `step`), in eval mode."""
    run = as_run(run)
    if not (run.path / "config.json").exists():
        raise ValueError(
            f"run={str(run.path)!r} is invalid; allowed: a run folder with config.json"
        )
    if step is None:
        ckpt = run.latest_checkpoint()
    else:
        ckpt = run.path / "checkpoints" / f"step_{step:07d}.pt"
        ckpt = ckpt if ckpt.exists() else None
    if ckpt is None:
        have = (
            sorted(p.name for p in (run.path / "checkpoints").glob("step_*.pt"))
            if (run.path / "checkpoints").exists()
            else []
        )
        raise ValueError(
            f"run {run.name!r} has no checkpoint{'' if step is None else f' at step {step}'} "
            f"(found: {', '.join(have) or 'none'}); train() writes one at the last step, "
            "so the run is unfinished or its checkpoints were deleted"
        )
    load_run_plugins(run)  # the schedules and mechanisms it was trained with
    model = LRT(ModelConfig.from_dict(run.config["model"]))
    state = read_checkpoint(ckpt, map_location=map_location)  # tensors and plain values only
    check_belongs(state, run, ckpt)
    model.load_state_dict(state["model"])
    return model.eval()


def load_run_plugins(run) -> tuple[str, ...]:
    """Import the plugins a run was trained with (config.json's train.plugins, TrainConfig's
    field), so a mechanism or schedule of the user's own is known when its model is rebuilt.
    A recorded file no longer where it was stands for the file of that name loaded already
    (`--plugin FILE`, e.g. on another machine); else it is refused, naming that route. Returns
    the plugins loaded in its place."""
    run = as_run(run)
    recorded = run.config.get("train", {}).get("plugins") or ()
    effective = []
    for spec in recorded:
        if isinstance(spec, str) and spec.endswith(".py") and not Path(spec).is_file():
            same = [p for p in loaded_plugins() if Path(p).name == Path(spec).name]
            if not same:
                raise ValueError(
                    f"run {run.name!r} was trained with the plugin {spec!r}, which is not there: "
                    "load it with --plugin FILE"
                )
            effective.append(same[0])
        else:
            effective.append(spec)
    return load_plugins(effective)


def train_config(run):
    run = as_run(run)
    saved = run.config["train"]
    if saved.get("plugins"):
        saved = {**saved, "plugins": load_run_plugins(run)}
    return TrainConfig(**saved)


def load_task(run):
    """The run's task, rebuilt through the `lrt_lab.tasks` entry point (lrt_lab imports no task
    code)."""
    return make_task(train_config(as_run(run)))


def eval_batch(task, length: int, n: int, seed: int = 0):
    """A fixed held-out batch: the task provider's evaluation set (seeds >= 2**62, never trained
    on)."""
    return make_eval_sets(task, (length,), n, seed=seed)[length]
