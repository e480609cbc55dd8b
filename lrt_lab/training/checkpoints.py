"""A run's checkpoints and the rules for continuing a run folder: save (atomic, the last two kept,
with the run's permissions), restore (the newest that loads, older ones the fallback), and what
`--resume` accepts.

A checkpoint holds only tensors and plain values (numbers, strings, lists, dicts) and is read with
`torch.load(weights_only=True)`, which unpickles nothing else: a file that needs more (a crafted
one could run code when unpickled) is refused, not loaded (`read_checkpoint`). Each records the
run it belongs to (its folder's name and the digest of its config.json), so a checkpoint copied in
from another run is refused too (`check_belongs`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import pickle
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from lrt_lab.core.config import LEGACY_FIELDS
from lrt_lab.store.results import Run, respect_umask, with_current_defaults
from lrt_lab.training.train_config import stored_train_config


class UnsafeCheckpointError(ValueError):
    """A checkpoint holding objects other than tensors and plain values: not unpickled."""


class ForeignCheckpointError(ValueError):
    """A checkpoint written by another run (or for another config.json)."""


def config_digest(config: dict) -> str:
    """sha256 of a run's config.json content (canonical JSON: sorted keys, no spaces)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def checkpoint_owner(run: Run) -> dict:
    """What a checkpoint records of the run it belongs to."""
    return {"run": run.name, "config_sha256": config_digest(run.config)}


def plain(value, where: str = "state"):
    """`value` as what `torch.load(weights_only=True)` reads back: tensors, None, bool, int, float,
    str, and lists, tuples and dicts of them (numpy numbers become Python numbers); TypeError
    naming the place of anything else."""
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return value
    if isinstance(value, dict):
        return {k: plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v, f"{where}[{i}]") for i, v in enumerate(value))
    item = getattr(value, "item", None)  # a numpy scalar
    if callable(item) and getattr(value, "shape", None) == ():
        return plain(item(), where)
    raise TypeError(f"checkpoint {where} is a {type(value).__name__}, not a tensor or plain value")


def read_checkpoint(path, map_location=None) -> dict:
    """A checkpoint's state, unpickling only tensors and plain values (weights_only=True);
    UnsafeCheckpointError (one line) for a file that needs anything else, and ValueError for one
    that is not a dict. Damaged files raise what torch's loaders raise."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # an import of a class or function the allowlist lacks: what a crafted file needs to run
        # code (an unsupported opcode is damaged bytes: torch's loaders raise that too)
        found = re.search(r"GLOBAL (\S+)", str(e))
        if not found:
            raise
        raise UnsafeCheckpointError(
            f"checkpoint {path} holds objects other than tensors and plain values "
            f"({found.group(1)[:80]}): refused, since unpickling it could run code; only load "
            "checkpoints you trust"
        ) from None
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {path} holds a {type(state).__name__}, not a state dict")
    return state


def check_belongs(state: dict, run: Run, path) -> None:
    """ForeignCheckpointError when the checkpoint at `path` was written for another config.json
    than `run`'s (its recorded digest; the recorded run name says whose), or is of a step past the
    run's last. A checkpoint from before owners were recorded is checked by its step only."""
    owner = state.get("owner")
    config = run.config
    # the config decides (it holds a --name); a folder renamed with its config keeps its own
    if isinstance(owner, dict) and owner.get("config_sha256") != config_digest(config):
        raise ForeignCheckpointError(
            f"checkpoint {path} belongs to run {owner.get('run')!r}, not {run.name!r} (it was "
            f"written for another config.json); remove it: a run resumes only from its own"
        )
    steps = config.get("train", {}).get("steps") if isinstance(config.get("train"), dict) else None
    step = state.get("step")
    if isinstance(steps, int) and isinstance(step, int) and step > steps:
        raise ForeignCheckpointError(
            f"checkpoint {path} is of step {step}, past this run's last ({steps}): it belongs "
            "to another run; remove it"
        )


def save_checkpoint(
    run: Run,
    step: int,
    model,
    opts,
    generator,
    elapsed: float,
    counters: dict,
    keep: int = 2,
    guard=None,
):
    """Write step's model, optimizer and RNG state atomically (a temporary file renamed into place);
    keep the newest `keep`. A full disk becomes one OSError saying so. guard: the run's
    SpikeGuard (lrt_lab.training.guard), whose state is saved too (a run without one saves
    none)."""
    d = run.checkpoint_dir()
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizers": [plain(o.state_dict(), "optimizer state") for o in opts],
        "generator": generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "elapsed": float(elapsed),
        "counters": plain(counters, "counters"),
        "owner": checkpoint_owner(run),
    }
    if guard is not None:
        state["guard"] = plain(guard.state_dict(), "guard state")
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".ckpt.", suffix=".tmp")
    os.close(fd)
    respect_umask(tmp)  # mkstemp's 0600 would hide it from the group sharing the store
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

    Returns the checkpoint's state (step, elapsed, counters, guard, path) or None when the run has
    no checkpoint. ValueError when checkpoints exist but none loads: nothing is deleted, so the user
    decides (remove checkpoints/ to restart from step 0).
    """
    ckpts = run.checkpoints()
    failures = []
    for path in reversed(ckpts):
        try:
            state = read_checkpoint(path, map_location=device)
        except UnsafeCheckpointError as e:  # never loaded, and not passed over silently
            raise UnsafeCheckpointError(f"--resume: {e}") from None
        except Exception as e:  # noqa: BLE001  (a damaged file can fail in any of torch's loaders)
            _unreadable(failures, path, e)
            continue
        try:
            check_belongs(state, run, path)  # a foreign checkpoint is refused, not passed over
        except ForeignCheckpointError as e:
            raise ForeignCheckpointError(f"--resume: {e}") from None
        try:
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
                "guard": state.get("guard"),  # the spike guard's state, when the run has one
                "path": path,
            }
        except Exception as e:  # noqa: BLE001  (a damaged state fails in the loaders too)
            _unreadable(failures, path, e)
            continue
        return state
    if failures:
        raise ValueError(
            f"--resume: no readable checkpoint in {run.path / 'checkpoints'} "
            f"({'; '.join(failures)}); "
            "remove that folder to restart the run from step 0"
        )
    return None


def _unreadable(failures: list, path: Path, e: Exception) -> None:
    failures.append(f"{path.name}: {type(e).__name__}: {str(e)[:120]}")
    warnings.warn(
        f"checkpoint {path} is unreadable ({type(e).__name__}); trying the one before it",
        stacklevel=3,
    )


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
