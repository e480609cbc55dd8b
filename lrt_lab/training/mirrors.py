"""Experiment-tracking mirrors: a run's metrics lines, config and summary copied to Weights & Biases
and/or TensorBoard while it trains (`lrt-lab train/sweep --log wandb --log tensorboard`).

The run store stays the source of truth: every record is written there first, then mirrored. A
mirror that fails (a full disk under its folder, a network error online) is dropped with one warning
line; the run goes on. A mirror is not part of a run's identity, so it is never in TrainConfig:
train()
and run_sweep() take the names as an argument of their own.

- TensorBoard writes <run folder>/tensorboard (`tensorboard --logdir runs/` shows every run):
  a scalar per metric (`train/loss`, `eval/pos90_exact@64`, ...), the config as text at step 0,
  the summary as text and `summary/...` scalars. A resumed run purges the events after its
  checkpoint (SummaryWriter's purge_step), so each step is there once, with the store's values.
- W&B writes <run folder>/wandb, offline unless WANDB_API_KEY is set or WANDB_MODE says otherwise
  (`wandb sync <run folder>/wandb/offline-run-*` uploads it). The project is --wandb-project, else
  $WANDB_PROJECT, else "lrt_lab"; the group is the run's config group (`groups.group_name`), so
  the seeds of one config share it. The W&B run id is kept in the run folder, and a resumed run
  continues that W&B run; steps W&B already holds when it resumes (online) are not sent again.
  Offline, each process writes its own offline-run folder under that id: the steps a killed
  process logged after its last checkpoint are logged again by the next one, so they can be in
  two folders (with the same values when training is deterministic, as on CPU).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from lrt_lab.store.results import Run, write_json
from lrt_lab.training.mirror_settings import DEFAULT_WANDB_PROJECT, MIRROR_PACKAGES, MirrorSettings

TENSORBOARD_FOLDER = "tensorboard"
WANDB_FOLDER = "wandb"
WANDB_ID_FILE = "lrt_lab_run_id.json"


class Mirror(Protocol):
    """Somewhere a run's metrics are copied to. start once, log per metrics line, finish once
    (summary None: the run stopped early, to be resumed)."""

    def start(self, config: dict, run_name: str, group: str) -> None: ...

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def finish(self, summary: dict | None) -> None: ...


def mirror_settings(log: Sequence[str] | MirrorSettings | None) -> MirrorSettings:
    """Settings from what train() / run_sweep() were given (names, or settings), checked: every
    mirror's package must import, so a missing one fails before any run folder is written."""
    settings = log if isinstance(log, MirrorSettings) else MirrorSettings(tuple(log or ()))
    for name in settings.names:
        require_package(name)
    return settings


def require_package(name: str) -> None:
    """ValueError, one line naming the extra to install, when the mirror's package is missing."""
    module, extra = MIRROR_PACKAGES[name]
    try:
        importlib.import_module(module)
    except ImportError:
        raise ValueError(
            f"--log {name}: the {module} package is not installed; pip install 'lrt-lab[{extra}]'"
        ) from None


# Records -> scalars ------------------------------------------------------------------------------
def scalars(values: dict, prefix: str) -> dict[str, float]:
    """Every number in a (nested) record as {"prefix/key": float}; lists by index, text left out."""
    out = {}
    for key, value in values.items():
        name = f"{prefix}/{key}"
        if isinstance(value, dict):
            out.update(scalars(value, name))
        elif isinstance(value, (list, tuple)):
            out.update(scalars(dict(enumerate(value)), name))
        elif isinstance(value, (bool, int, float)):
            out[name] = float(value)
    return out


def record_scalars(record: dict) -> dict[str, float]:
    """A metrics line's numbers, named by its kind: train/loss, eval/acc_exact@64, ..."""
    fields = {k: v for k, v in record.items() if k not in ("step", "kind")}
    return scalars(fields, record.get("kind", "metrics"))


# The mirrors -------------------------------------------------------------------------------------
class TensorBoardMirror:
    """Writes <run folder>/tensorboard. The writer opens at the first step logged, purging the
    events an earlier process wrote from that step on (those steps are trained again)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.config_text: str | None = None
        self.resuming = False
        self.writer = None

    def start(self, config: dict, run_name: str, group: str) -> None:
        self.resuming = any(self.folder.glob("events.out.tfevents.*"))
        # the config once per run, at step 0: a resumed run's earlier events hold it already
        described = {"run": run_name, "group": group, **config}
        self.config_text = None if self.resuming else _markdown_json(described)

    def _open(self, first_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(self.folder), purge_step=first_step, flush_secs=30)
        if self.config_text is not None:
            self.writer.add_text("config", self.config_text, 0)
        return self.writer

    def log(self, step: int, metrics: dict[str, float]) -> None:
        writer = self.writer or self._open(step if self.resuming else None)
        for tag, value in metrics.items():
            writer.add_scalar(tag, value, step)

    def finish(self, summary: dict | None) -> None:
        writer = self.writer or self._open(None)
        if summary is not None:
            step = int(summary.get("steps") or 0)
            writer.add_text("summary", _markdown_json(summary), step)
            for tag, value in scalars(summary, "summary").items():
                writer.add_scalar(tag, value, step)
        writer.close()


class WandbMirror:
    """One W&B run per run folder, files under <run folder>/wandb, its id kept there too."""

    def __init__(self, folder: Path, project: str):
        self.folder = Path(folder)
        self.project = project
        self.run = None
        self.first_new_step = 0

    def start(self, config: dict, run_name: str, group: str) -> None:
        import wandb

        wandb_dir = self.folder / WANDB_FOLDER
        wandb_dir.mkdir(exist_ok=True)
        self.run = wandb.init(
            project=self.project,
            name=run_name,
            group=group,
            config=config,
            dir=str(self.folder),
            id=wandb_run_id(wandb_dir),
            resume="allow",
            mode=wandb_mode(os.environ),
            settings=wandb.Settings(console="off", quiet=True, disable_git=True),
        )
        # online, a resumed W&B run knows its last step: the steps up to it are there already
        self.first_new_step = self.run.step if self.run.resumed else 0

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if step >= self.first_new_step:
            self.run.log(metrics, step=step)

    def finish(self, summary: dict | None) -> None:
        if summary is not None:
            self.run.summary.update(summary)
        failed = summary is not None and summary.get("status", "complete") != "complete"
        self.run.finish(exit_code=1 if failed else 0)


def wandb_mode(env) -> str:
    """offline unless an API key is set; WANDB_MODE, when set, decides."""
    return env.get("WANDB_MODE") or ("online" if env.get("WANDB_API_KEY") else "offline")


def wandb_run_id(wandb_dir: Path) -> str:
    """The W&B run id of this run folder: made once, then read back, so a resume (in any process,
    on any node) continues the same W&B run, and a new run of the same name does not."""
    path = wandb_dir / WANDB_ID_FILE
    if path.is_file():
        try:
            return str(json.loads(path.read_text())["id"])
        except (ValueError, KeyError, TypeError):
            pass  # damaged: a new id, the mirror is not worth failing the run over
    run_id = uuid.uuid4().hex[:12]
    write_json(path, {"id": run_id})
    return run_id


def _markdown_json(obj: dict) -> str:
    """JSON in a code block: TensorBoard renders text as markdown."""
    return "```\n" + json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n```"


# Fan-out -----------------------------------------------------------------------------------------
def make_mirror(name: str, run: Run, settings: MirrorSettings) -> Mirror:
    if name == "tensorboard":
        return TensorBoardMirror(run.path / TENSORBOARD_FOLDER)
    project = settings.wandb_project or os.environ.get("WANDB_PROJECT") or DEFAULT_WANDB_PROJECT
    return WandbMirror(run.path, project)


class Mirrors:
    """The mirrors of one run. A mirror that raises is dropped with one warning line on stderr
    (naming it and the error), so a mirror never costs the run, or the run store, anything."""

    def __init__(self, mirrors: dict[str, Mirror], run_name: str = ""):
        self.active = dict(mirrors)
        self.run_name = run_name

    def _each(self, call) -> None:
        for name, mirror in list(self.active.items()):
            try:
                call(mirror)
            except Exception as e:  # noqa: BLE001 - whatever a tracker raises, training goes on
                del self.active[name]
                error = " ".join(str(e).split())[:200]  # one line, whatever the tracker's message
                print(
                    f"lrt-lab: warning: --log {name} stopped mirroring {self.run_name} after "
                    f"{type(e).__name__}: {error} (the run store has every metric)",
                    file=sys.stderr,
                )

    def start(self, config: dict, run_name: str, group: str) -> Mirrors:
        self._each(lambda m: m.start(config, run_name, group))
        return self

    def log(self, record: dict) -> None:
        if self.active and "step" in record:
            step, metrics = int(record["step"]), record_scalars(record)
            self._each(lambda m: m.log(step, metrics))

    def finish(self, summary: dict | None) -> None:
        """End every mirror (summary None: stopped early); later calls do nothing."""
        self._each(lambda m: m.finish(summary))
        self.active.clear()


def start_mirrors(settings: MirrorSettings, run: Run, config: dict) -> Mirrors:
    """The run's mirrors, started (those that fail to start are dropped with a warning)."""
    mirrors = Mirrors({name: make_mirror(name, run, settings) for name in settings.names}, run.name)
    if not mirrors.active:
        return mirrors
    from lrt_lab.store.run_groups import group_name  # pandas: only when a mirror is on

    return mirrors.start(config, run.name, group_name(config))


class MirroredRun(Run):
    """A Run whose metrics lines and summary also go to its mirrors, once the store has them."""

    def __init__(self, path, mirrors: Mirrors):
        super().__init__(path)
        self.mirrors = mirrors

    def log(self, record: dict) -> None:
        super().log(record)
        self.mirrors.log(record)

    def write_summary(self, summary: dict) -> None:
        super().write_summary(summary)
        self.mirrors.finish(summary)


@contextlib.contextmanager
def mirrored(run: Run, settings: MirrorSettings, config: dict):
    """The run, as a MirroredRun while inside; leaving ends the mirrors that no summary ended
    (a run stopped early to be resumed, or one that failed)."""
    mirrors = start_mirrors(settings, run, config)
    try:
        yield MirroredRun(run.path, mirrors)
    finally:
        mirrors.finish(None)
