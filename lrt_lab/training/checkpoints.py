"""A run's checkpoints and the rules for continuing a run folder: save (atomic, the last two kept),
restore (the newest that loads, older ones the fallback), and what `--resume` accepts.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from lrt_lab.core.config import LEGACY_FIELDS
from lrt_lab.store.results import Run, with_current_defaults
from lrt_lab.training.train_config import stored_train_config


def save_checkpoint(
    run: Run, step: int, model, opts, generator, elapsed: float, counters: dict, keep: int = 2
):
    """Write step's model, optimizer and RNG state atomically (a temporary file renamed into place);
    keep the newest `keep`. A full disk becomes one OSError saying so."""
    d = run.checkpoint_dir()
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizers": [o.state_dict() for o in opts],
        "generator": generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "elapsed": elapsed,
        "counters": counters,
    }
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".ckpt.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, d / f"step_{step:07d}.pt")
    except BaseException as e:
        # a full checkpoint's worth of disk, otherwise never reclaimed
        Path(tmp).unlink(missing_ok=True)
        if disk_full(e, d):
            raise OSError(
                errno.ENOSPC,
                f"disk full while writing the checkpoint of step {step} in {d}: free "
                "space there, then run the same command again (train: with --resume)",
            ) from None
        raise
    for old in sorted(d.glob("step_*.pt"))[:-keep]:
        old.unlink()


def disk_full(error: BaseException, folder: Path) -> bool:
    """Whether a failed write was a full disk: ENOSPC, or torch's serializer failing ("unexpected
    pos", "file write failed") on a filesystem with (almost) no space left."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    if isinstance(error, RuntimeError):
        try:
            return shutil.disk_usage(folder).free < 64 * 2**20
        except OSError:
            return False
    return False


def restore_checkpoint(run: Run, model, opts, generator, device) -> dict | None:
    """Load the newest checkpoint that loads into model/opts/generator; older ones kept beside it
    (save_checkpoint keeps two) are the fallback for a truncated or damaged newest one.

    Returns the checkpoint's state (step, elapsed, counters, path) or None when the run has no
    checkpoint. ValueError when checkpoints exist but none loads: nothing is deleted, so the user
    decides (remove checkpoints/ to restart from step 0).
    """
    ckpts = run.checkpoints()
    failures = []
    for path in reversed(ckpts):
        try:
            state = torch.load(path, map_location=device, weights_only=False)
            model.load_state_dict(state["model"])
            if len(state["optimizers"]) != len(opts):
                raise ValueError(
                    f"{len(state['optimizers'])} optimizer states for {len(opts)} optimizers"
                )
            for opt, s in zip(opts, state["optimizers"]):
                opt.load_state_dict(s)
            generator.set_state(state["generator"])
            torch.set_rng_state(state["torch_rng"])
            state = {
                "step": int(state["step"]),
                "elapsed": float(state["elapsed"]),
                "counters": dict(state["counters"]),
                "path": path,
            }
        except Exception as e:  # noqa: BLE001  (a damaged file can fail in any of torch's loaders)
            failures.append(f"{path.name}: {type(e).__name__}: {str(e)[:120]}")
            warnings.warn(
                f"checkpoint {path} is unreadable ({type(e).__name__}); trying the one before it",
                stacklevel=2,
            )
            continue
        return state
    if failures:
        raise ValueError(
            f"--resume: no readable checkpoint in {run.path / 'checkpoints'} "
            f"({'; '.join(failures)}); "
            "remove that folder to restart the run from step 0"
        )
    return None


def resume_folder(root, cfg) -> Path:
    """The folder `--resume` continues for `cfg`: root/<cfg.run_name>, or, for a run trained before
    derived names carried the options digest (TrainConfig.options_digest), root/<cfg.base_name>
    when the digested folder does not exist and that one holds a run of the same train config."""
    root = Path(root)
    folder = root / cfg.run_name
    if cfg.name or not cfg.options_digest or folder.exists():
        return folder
    before = root / cfg.base_name
    try:
        saved = stored_train_config(json.loads((before / "config.json").read_text())["train"])
    except (OSError, ValueError, KeyError, TypeError):
        return folder
    same = saved == json.loads(json.dumps(cfg.to_dict()))
    return before if same else folder


def open_for_resume(root: Path, cfg, config: dict | None = None) -> Run:
    """The run folder `--resume` continues (resume_folder); ValueError saying what is missing or
    which arguments differ. With `config` (what train would write now), the whole config.json must
    match it, so a hand-edited model or schedule is refused too."""
    run = Run(resume_folder(root, cfg))
    if not (run.path / "config.json").is_file():
        origin = (
            "derived from the arguments; pass --name NAME"
            if cfg.name is None
            else "given by --name"
        )
        runs = (
            sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
            if root.is_dir()
            else []
        )
        listing = (
            f"; run folders in {root}: {', '.join(runs[:8])}{' ...' if len(runs) > 8 else ''}"
            if runs
            else ""
        )
        raise ValueError(
            f"--resume: no run folder {run.path} (its name {cfg.run_name!r} is {origin}){listing}"
        )
    stored = run.config
    saved = stored_train_config(stored.get("train"))
    now = json.loads(json.dumps(cfg.to_dict()))
    if saved != now:
        saved = saved if isinstance(saved, dict) else {}
        diffs = [
            f"{k}: {saved.get(k)!r} in config.json, {now.get(k)!r} now"
            for k in sorted(set(saved) | set(now))
            if saved.get(k) != now.get(k)
        ]
        raise ValueError(
            f"--resume: the arguments differ from {run.path / 'config.json'} ({'; '.join(diffs)}); "
            "resume with the same ones"
        )
    if config is not None:
        # fields the stored config predates read as what the run ran under (LEGACY_FIELDS)
        diffs = config_differences(with_current_defaults({**stored, "train": saved}), config)
        legacy = legacy_convention_overrides(diffs)
        if legacy:
            raise ValueError(
                f"--resume: {run.path.name} was trained under an earlier model convention "
                f"({'; '.join(diffs[:6])}), which today's defaults do not build; start a new "
                f"run, with {legacy} to train under that convention"
            )
        if diffs:
            raise ValueError(
                f"--resume: {run.path / 'config.json'} differs from the config these arguments "
                "build "
                f"({'; '.join(diffs[:6])}); was it edited? Restore it or start a new run"
            )
    return run


def legacy_convention_overrides(diffs: list[str]) -> str:
    """The `--set` options that rebuild a run trained under an earlier convention, when every
    difference between its stored config and today's is such a field (`LEGACY_FIELDS`); else ""."""
    legacy = {f"model.{k}": (k, v) for k, v in LEGACY_FIELDS["model"].items()}
    legacy |= {f"model.memory.{k}": (f"memory.{k}", v) for k, v in LEGACY_FIELDS["memory"].items()}
    fields = [d.split(":", 1)[0] for d in diffs]
    if not fields or any(f not in legacy for f in fields):
        return ""
    sets = (legacy[f] for f in fields)
    return " ".join(f"--set {k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sets)


def config_differences(saved: dict, now: dict, prefix: str = "") -> list[str]:
    """'field: saved value in config.json, value now' for
    every leaf that differs (JSON-normalised)."""
    saved, now = json.loads(json.dumps(saved)), json.loads(json.dumps(now, default=str))
    out = []
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, f"{prefix}{key}.")
        elif a != b and not (
            isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-12)
        ):
            out.append(f"{prefix}{key}: {a!r} in config.json, {b!r} now")
    return out


def remove_empty_folder(folder: Path) -> None:
    """A folder named like the run but empty (left by a tool, or made by hand) is not a run:
    remove it so the run can be created; a non-empty one that is not a run is refused."""
    if folder.is_dir() and not (folder / "config.json").exists():
        try:
            folder.rmdir()
        except OSError:
            raise ValueError(
                f"{folder} exists and is not a run folder (no config.json) but is not empty; "
                "move it away or choose another --name / --out"
            ) from None
