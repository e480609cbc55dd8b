"""One training loop for every model and schedule, writing into the run store.

    from lrt_lab.train import TrainConfig, train
    run = train(TrainConfig(task="a5_prefix", length=16, preset="small", schedule="interleaved:2"))

Optimisation follows the paper's appendix A ("Optimization"): Muon for the 2-D hidden matrices
(attention, MLP, the LRT projections W_k,rec / W_v,rec and the gate matrices: the released code's
choice, which keeps the gates unsaturated), AdamW with betas (0.8, 0.95) for embeddings, head and
scalars (lrt_lab.optim); no warm-up; linear warm-down to zero over the final half; Muon
momentum 0.85 -> 0.95 over the first 300 steps. Toy-size learning rates: the paper's reference
rates are for d=768 and 2^19-token batches. We keep its (d/768)^-1/2 scaling of the embedding and
head rates but not its sqrt(batch / 2^19) factor: toy batches are ~100x smaller and that factor
would shrink every rate ~10x, too slow to learn anything in CPU minutes. Instead the AdamW rates
are capped (embedding 0.1, scalars 0.05) and all rates share one multiplier, `lr_scale`.

Evaluation uses the decoding the model will really use: per-position accuracy and pos@90 at each
evaluation length with the training schedule's parallel forward *and* with exact recurrent decoding
(the Decoder, one position at a time), so the train/inference mismatch is visible.

Tasks come from a provider registered under the `lrt_lab.tasks` entry point (the built-in `lrt_tasks`, the tasks/ folder
package registers itself), so lrt_lab never imports the task code; a Task object can also be passed
directly to `train(..., task=...)`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib.metadata
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from .baselines import BASELINE_KINDS, build_baseline, is_baseline_kind
from .config import MEMORY_PRESETS, PRESETS, MemoryConfig, ModelConfig, preset
from .config import memory_preset as make_memory
from .decode import Decoder
from .metrics import per_position_accuracy, pos_at
from .mirrors import mirror_settings, mirrored
from .model import LRT
from .optim import build_optimizers
from .claims import acquire
from .results import Run
from .schedules import IGNORE_INDEX, OnePass, parse_schedule, run_schedule
from .validation import (TRAIN_SEED_LIMIT, check_fields, check_int, check_out_dir, check_token_ids, fail, is_int,
                         vocab_size_of)

MODEL_KINDS = ("transformer", "lrt")  # plus the baselines' spellings, lrt_lab.baselines.BASELINE_KINDS


def _ranged(default, low=None, high=None, **kw):
    """A field with a declared range, checked by validation.check_fields."""
    return field(default=default, metadata={"range": (low, high)}, **kw)


@dataclass
class TrainConfig:
    """Everything a run needs; saved as config.json["train"] so the run can be redone exactly.

    Every field is validated at construction (types from the annotations, ranges and choices from
    the field metadata), so a bad value fails before any run folder is written.
    """

    task: str = "a5_prefix"
    length: int = _ranged(64, 1)           # training sequence length (the curriculum's end)
    task_options: dict = field(default_factory=dict)   # e.g. curriculum_start, curriculum_steps
    preset: str = field(default="small", metadata={"choices": tuple(PRESETS)})
    model: str = "lrt"                     # transformer | lrt (baselines: loop:N, ponder:N)
    overrides: dict = field(default_factory=dict)      # ModelConfig fields, "memory.<field>" too
    memory_preset: str = "paper"           # LRT memory: "paper" (its text) or "released" (its code)
    schedule: str = "interleaved:2"
    steps: int = _ranged(1000, 1)
    batch_size: int = _ranged(64, 1)
    seed: int = _ranged(0, 0, TRAIN_SEED_LIMIT - 1)   # below the evaluation seeds (lrt_tasks.evaluation)
    lr_scale: float = _ranged(1.0, 0)
    matrix_lr: float = _ranged(0.02, 0)    # Muon (paper: 0.02)
    embedding_lr: float = _ranged(0.1, 0)  # AdamW, before (d/768)^-1/2 (paper 0.3; capped for toys)
    head_lr: float = _ranged(0.004, 0)     # AdamW, before (d/768)^-1/2 (paper 0.004)
    scalar_lr: float = _ranged(0.05, 0)    # AdamW: gamma, residual scalars (paper 0.5)
    weight_decay: float = _ranged(0.0, 0)
    warmdown_frac: float = _ranged(0.5, 0, 1)   # linear warm-down to 0 over this final fraction
    grad_clip: float = _ranged(1.0, 0)
    eval_every: int = _ranged(200, 0)
    eval_lengths: tuple = (64, 128, 256)
    eval_size: int = _ranged(256, 1)
    eval_exact: bool = True                # also evaluate with exact recurrent decoding
    checkpoint_every: int = _ranged(500, 0)  # 0: only at the end
    device: str = field(default="auto", metadata={"choices": ("auto", "cpu", "cuda")})
    compile: bool = False
    name: str | None = None

    def __post_init__(self):
        check_fields(self)
        self.eval_lengths = tuple(self.eval_lengths)
        if not self.eval_lengths or not all(is_int(n) and n >= 1 for n in self.eval_lengths):
            fail("eval_lengths", self.eval_lengths, "a non-empty tuple of integers >= 1")
        if self.memory_preset not in MEMORY_PRESETS:
            fail("memory_preset", self.memory_preset, ", ".join(MEMORY_PRESETS))
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' is invalid; allowed: auto, cpu (CUDA is not available)")
        self.schedule = parse_schedule(self.schedule).spec  # validates, canonical spelling
        if self.name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:+=,-]*", self.name):
            raise ValueError(f"name={self.name!r} is invalid; allowed: letters, digits and _.:+=,-")

    @property
    def run_name(self) -> str:
        if self.name:
            return self.name
        sched = "" if self.model != "lrt" else f"-{self.schedule}"
        if self.model == "lrt" and self.memory_preset != "paper":  # the default keeps older names
            sched += f"-{self.memory_preset}"
        return f"{self.task}-L{self.length}-{self.preset}-{self.model}{sched}-s{self.seed}".replace(":", "_")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Tasks ------------------------------------------------------------------------------------------
def task_provider():
    """The module registered under the `lrt_lab.tasks` entry point (the built-in `lrt_tasks`, the tasks/ folder)."""
    eps = list(importlib.metadata.entry_points(group="lrt_lab.tasks"))
    if not eps:
        raise ValueError("task: no task provider is installed; `pip install -e .` registers the built-in tasks")
    return eps[0].load()


def make_task(cfg: TrainConfig):
    return task_provider().make_task(cfg.task, cfg.length, **cfg.task_options)


def make_eval_sets(task, lengths, n, seed=0):
    return task_provider().make_eval_sets(task, lengths=lengths, n=n, seed=seed)


# Model ------------------------------------------------------------------------------------------
def parse_value(text: str):
    """A --set value: JSON (numbers, true/false, null, lists) or else a plain string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def model_config(cfg: TrainConfig, vocab_size: int) -> ModelConfig:
    """The ModelConfig for a run: preset + memory (the run's memory_preset, for LRT) + dotted
    overrides (memory.<field> on top of the memory preset)."""
    if cfg.model not in MODEL_KINDS and not is_baseline_kind(cfg.model):
        raise ValueError(f"model={cfg.model!r} is invalid; allowed: {', '.join(MODEL_KINDS)}, "
                         f"{', '.join(BASELINE_KINDS)}")
    top, mem = {}, {}
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)} - {"memory"}
    mem_fields = {f.name for f in dataclasses.fields(MemoryConfig)}
    for key, value in cfg.overrides.items():
        if key.startswith("memory."):
            sub = key[len("memory."):]
            if sub not in mem_fields:
                raise ValueError(f"--set {key}: unknown field; allowed memory fields: {', '.join(sorted(mem_fields))}")
            mem[sub] = value
        elif key in model_fields:
            top[key] = value
        else:
            raise ValueError(f"--set {key}: unknown field; allowed: {', '.join(sorted(model_fields))}, memory.<field>")
    if cfg.model != "lrt" and mem:
        raise ValueError(f"--set {next(iter(mem))}: model={cfg.model!r} has no memory; use --model lrt")
    n_layer = top.get("n_layer", PRESETS[cfg.preset]["n_layer"])
    memory = make_memory(cfg.memory_preset, n_layer, **mem) if cfg.model == "lrt" else None
    fields = {"vocab_size": vocab_size, "sequence_len": cfg.length, **top}
    return preset(cfg.preset, memory=memory, **fields)


def build_model(cfg: TrainConfig, vocab_size: int) -> LRT:
    config = model_config(cfg, vocab_size)
    if is_baseline_kind(cfg.model):
        return build_baseline(cfg.model, config)  # loop:N, ponder:N (LRT subclasses, memory=None)
    return LRT(config)


# Optimisation -----------------------------------------------------------------------------------
def make_optimizers(model, cfg: TrainConfig) -> list[torch.optim.Optimizer]:
    """Muon for the hidden matrices (gate matrices included), AdamW for the rest, by declared role
    (lrt_lab.optim); the embedding and head rates scale as (d/768)^-1/2 (app. A)."""
    width = (model.config.n_embd / 768) ** -0.5
    s = cfg.lr_scale
    lrs = {"matrix": cfg.matrix_lr * s, "embedding": cfg.embedding_lr * width * s,
           "head": cfg.head_lr * width * s, "scalar": cfg.scalar_lr * s,
           "resid_scalar": cfg.scalar_lr * s, "x0_scalar": cfg.scalar_lr * s}
    return build_optimizers(model, lrs, weight_decay=cfg.weight_decay)


def lr_multiplier(step: int, total: int, warmdown_frac: float) -> float:
    """No warm-up; linear warm-down to zero over the final `warmdown_frac` of training."""
    start = total * (1 - warmdown_frac)
    if step < start or warmdown_frac == 0:
        return 1.0
    return max(0.0, (total - step) / (total * warmdown_frac))


def set_schedules(opts, step: int, cfg: TrainConfig) -> float:
    mult = lr_multiplier(step, cfg.steps, cfg.warmdown_frac)
    for opt in opts:
        for g in opt.param_groups:
            g["lr"] = g["initial_lr"] * mult
        if isinstance(opt, torch.optim.Muon):
            frac = min(step / 300, 1.0)  # Muon momentum 0.85 -> 0.95 over 300 steps (app. A)
            for g in opt.param_groups:
                g["momentum"] = 0.85 + 0.10 * frac
    return mult


# Evaluation -------------------------------------------------------------------------------------
def optimizer_step(opts, params, grad_clip: float = 0.0) -> None:
    """Clip the gradient norm of `params` (when grad_clip > 0), step every optimizer, clear grads."""
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    for opt in opts:
        opt.step()
    for opt in opts:
        opt.zero_grad(set_to_none=True)


def _masked_targets(batch) -> torch.Tensor:
    return batch.targets.masked_fill(~batch.loss_mask, IGNORE_INDEX)


@torch.no_grad()
def exact_logits(model, inputs: torch.Tensor) -> torch.Tensor:
    """Logits under exact recurrent decoding: one Decoder step per position."""
    check_token_ids("inputs", inputs, vocab_size_of(model))  # once, not once per position (a sync each on CUDA)
    dec = Decoder(model, inputs.size(0), inputs.size(1))
    return torch.stack([dec.step(inputs[:, t], check_values=False) for t in range(inputs.size(1))], dim=1)


@torch.no_grad()
def measured_record(measured: dict, step_cost: float, step_s: float) -> dict:
    """What a dynamic schedule measured, for a metrics line: FixedPoint's sweeps, last residual and
    convergence; Rollout's share of the step's time spent rolling the memory out."""
    record = {"step_cost": step_cost}
    if "sweeps" in measured:
        record.update(sweeps=measured["sweeps"], residual=measured["residuals"][-1],
                      converged=measured["converged"])
    if "rollout_s" in measured:
        record["rollout_share"] = measured["rollout_s"] / max(step_s, 1e-9)
    return record


def evaluate(model, schedule, eval_sets: dict, exact: bool = True, chunk: int = 128, autocast=None) -> dict:
    """{length: {"parallel": acc[T], "exact": acc[T]}} per-position accuracy (CPU float tensors).

    For a model without memory, exact decoding equals the parallel forward (tested in
    tests/test_core.py and tests/test_baselines.py), so it is not recomputed, unless the model
    says its parallel forward only approximates its decoding (`has_sequential_decoding`, ponder).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = {}
    for length, batch in eval_sets.items():
        accs = {"parallel": [], "exact": []}
        for i in range(0, batch.inputs.size(0), chunk):
            inputs = batch.inputs[i:i + chunk].to(device)
            targets = batch.targets[i:i + chunk].to(device)
            mask = batch.loss_mask[i:i + chunk].to(device)
            with autocast or _nullcontext():
                par = run_schedule(model, inputs, None, schedule).logits
                accs["parallel"].append((per_position_accuracy(par, targets, mask), mask.sum(0)))
                if exact and (getattr(model.config, "is_lrt", False)
                              or getattr(model, "has_sequential_decoding", False)):
                    ex = exact_logits(model, inputs)
                    accs["exact"].append((per_position_accuracy(ex, targets, mask), mask.sum(0)))
        res = {}
        for mode, parts in accs.items():
            if not parts:
                continue
            num = sum(torch.nan_to_num(a.float().cpu()) * n.cpu() for a, n in parts)
            den = sum(n.cpu() for _, n in parts)
            res[mode] = torch.where(den > 0, num / den.clamp(min=1), torch.full_like(num, float("nan")))
        if "exact" not in res:
            res["exact"] = res["parallel"]
        out[length] = res
    model.train(was_training)
    return out


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def eval_record(results: dict) -> dict:
    rec = {}
    for length, res in results.items():
        for mode, acc in res.items():
            rec[f"pos90_{mode}@{length}"] = pos_at(acc, 0.9, skip_nan=True)
            rec[f"acc_{mode}@{length}"] = float(torch.nanmean(acc))
    return rec


def per_position_table(results: dict) -> pd.DataFrame:
    rows = []
    for length, res in results.items():
        for mode, acc in res.items():
            for p, a in enumerate(acc.tolist()):
                rows.append({"length": length, "mode": mode, "position": p + 1, "accuracy": a})
    return pd.DataFrame(rows)


# Checkpoints ------------------------------------------------------------------------------------
def save_checkpoint(run: Run, step: int, model, opts, generator, elapsed: float, counters: dict, keep: int = 2):
    d = run.checkpoint_dir()
    state = {"step": step, "model": model.state_dict(), "optimizers": [o.state_dict() for o in opts],
             "generator": generator.get_state(), "torch_rng": torch.get_rng_state(),
             "elapsed": elapsed, "counters": counters}
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".ckpt.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, d / f"step_{step:07d}.pt")
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)  # a full checkpoint's worth of disk, otherwise never reclaimed
        if disk_full(e, d):
            raise OSError(errno.ENOSPC, f"disk full while writing the checkpoint of step {step} in {d}: free "
                                        "space there, then run the same command again (train: with --resume)") from None
        raise
    for old in sorted(d.glob("step_*.pt"))[:-keep]:
        old.unlink()


# The loop ---------------------------------------------------------------------------------------
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


def trained_by() -> dict:
    """Which host and process trained a run (a sweep spreads runs over processes and nodes)."""
    import socket
    return {"host": socket.gethostname(), "pid": os.getpid(), "finished": time.time()}


def diverged(run: Run, cfg: TrainConfig, step: int, loss: float, elapsed: float, counters: dict, bar) -> Run:
    """End a run whose loss became NaN or inf: summary.json says so (status "diverged", the step and
    the loss), so a sweep goes on to its next run and a re-run does not train it again."""
    if bar is not None:
        bar.close()
    run.write_summary({"status": "diverged", "steps": cfg.steps, "diverged_at_step": step, "trained_by": trained_by(),
                       "diverged_loss": str(loss), "wall_time_s": elapsed, "tokens": counters["tokens"],
                       "compute_tokens": counters["compute_tokens"]})
    print(f"{run.name}: diverged at step {step} (loss {loss}); summary.json status 'diverged'. Lower --lr-scale "
          "(or the learning rates) and train it under a new name", file=sys.stderr)
    return run


class StopRequest:
    """Set by SIGTERM or SIGUSR1 (a scheduler's warning before preemption or the time limit): the
    training loop then checkpoints at the end of its step and returns, like --time-limit."""

    SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGUSR1") if hasattr(signal, n))

    def __init__(self):
        self.requested: str | None = None

    def request(self, signum, frame=None) -> None:
        self.requested = signal.Signals(signum).name

    @contextlib.contextmanager
    def installed(self):
        """Handle SIGTERM / SIGUSR1 while inside (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self.request) for s in self.SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def prepare(cfg: TrainConfig, task=None):
    """Validate everything a run needs before anything is written: (task, model, schedule).

    The model is built on the meta device (shapes and parameter counts, no memory, no time), so a
    sweep can check every run of its grid first; train() builds the real one under the run's seed.
    """
    task = task if task is not None else make_task(cfg)
    if cfg.model != "lrt" and cfg.schedule != "onepass":
        raise ValueError(f"schedule={cfg.schedule!r} is invalid for model={cfg.model!r} (it has no memory; "
                         "a baseline's own training forward is its stage); allowed: onepass")
    with torch.device("meta"):
        model = build_model(cfg, task.vocab_size)
    if model.config.vocab_size < task.vocab_size:
        fail("vocab_size", model.config.vocab_size,
             f"an integer >= {task.vocab_size}, the vocabulary of task {cfg.task!r}")
    schedule = parse_schedule(cfg.schedule)
    check_memory_fits(cfg, model.config, schedule)
    start_length = task.length_at(0) if hasattr(task, "length_at") else cfg.length
    for length in sorted({start_length, cfg.length, *cfg.eval_lengths}):
        schedule.stages(length)  # e.g. Interleaved(S) needs S <= every length it will see
    # One sequence at every length the run will sample (training and evaluation), so a length the
    # task cannot make (below its minimum, beyond a corpus split) fails here and not at step N.
    min_length = getattr(task, "min_length", 1)
    for n in cfg.eval_lengths:
        if n < min_length:
            fail("eval_lengths", cfg.eval_lengths, f"integers >= {min_length}, the shortest sequence of task {cfg.task!r}")
    for length in sorted({start_length, cfg.length}):
        task.sample(1, torch.Generator().manual_seed(cfg.seed), length=length)
    make_eval_sets(task, cfg.eval_lengths, 1, seed=0)
    return task, model, schedule


EVAL_CHUNK = 128   # evaluation sequences per forward (evaluate's chunk)


def memory_estimate(cfg: TrainConfig, config: ModelConfig, schedule) -> dict[str, float]:
    """Bytes of the largest things a run allocates (a rough upper bound, float32): training keeps
    ~20 d floats per token and layer for the backward (residuals, q/k/v, attention and MLP
    activations) for every stage, the logits and their gradient, and one layer's attention
    scores B x heads x T x T at a time where a kernel materialises them; evaluation runs
    EVAL_CHUNK sequences at the longest evaluation length (and a decoding cache for them)."""
    d, L, V, H = config.n_embd, config.n_layer, config.vocab_size, config.n_head
    stages = max(1.0, float(schedule.cost))
    B, T = cfg.batch_size, cfg.length
    train = 4 * B * T * (20 * d * L + 3 * V) * stages + 4 * B * H * T * T + T * T
    n, T_eval = min(cfg.eval_size, EVAL_CHUNK), max(cfg.eval_lengths)
    evaluation = 4 * n * T_eval * (4 * d * L + 2 * V) + 4 * n * H * T_eval * T_eval + T_eval * T_eval
    return {"train": train, "eval": evaluation}


def available_memory(device: str) -> float:
    """Bytes of memory the run can use: the GPU's on CUDA, else the machine's physical memory."""
    if resolve_device(device).type == "cuda":
        return float(torch.cuda.get_device_properties(0).total_memory)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return float("inf")  # unknown: do not refuse


def check_memory_fits(cfg: TrainConfig, config: ModelConfig, schedule, fraction: float = 0.8) -> None:
    """Refuse, before anything is written, a run whose estimated memory exceeds `fraction` of
    what the device has (memory_estimate): a 100,000-token length or a batch of a million would
    otherwise fail minutes in, or in the final evaluation."""
    have = available_memory(cfg.device)
    need = memory_estimate(cfg, config, schedule)
    gib = lambda b: f"{b / 2**30:.1f} GiB"
    if need["train"] > fraction * have:
        fail("length" if cfg.length ** 2 > cfg.batch_size * cfg.length else "batch_size",
             cfg.length if cfg.length ** 2 > cfg.batch_size * cfg.length else cfg.batch_size,
             f"a size that fits in memory: length={cfg.length} with batch_size={cfg.batch_size} needs about "
             f"{gib(need['train'])} for training (estimate), this device has {gib(have)}; lower length or batch_size")
    if need["eval"] > fraction * have:
        fail("eval_lengths", cfg.eval_lengths,
             f"lengths that fit in memory: evaluating at {max(cfg.eval_lengths)} needs about {gib(need['eval'])} "
             f"(estimate), this device has {gib(have)}; lower eval_lengths")


def open_for_resume(root: Path, cfg: TrainConfig, config: dict | None = None) -> Run:
    """The run folder `--resume` continues; ValueError saying what is missing or which arguments
    differ. With `config` (what train would write now), the whole config.json must match it, so
    a hand-edited model or schedule is refused too."""
    run = Run(root / cfg.run_name)
    if not (run.path / "config.json").is_file():
        origin = "derived from the arguments; pass --name NAME" if cfg.name is None else "given by --name"
        runs = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if root.is_dir() else []
        listing = f"; run folders in {root}: {', '.join(runs[:8])}{' ...' if len(runs) > 8 else ''}" if runs else ""
        raise ValueError(f"--resume: no run folder {run.path} (its name {cfg.run_name!r} is {origin}){listing}")
    saved = run.config.get("train")
    now = json.loads(json.dumps(cfg.to_dict()))
    if saved != now:
        saved = saved if isinstance(saved, dict) else {}
        diffs = [f"{k}: {saved.get(k)!r} in config.json, {now.get(k)!r} now"
                 for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
        raise ValueError(f"--resume: the arguments differ from {run.path / 'config.json'} ({'; '.join(diffs)}); "
                         "resume with the same ones")
    if config is not None:
        diffs = config_differences(run.config, config)
        if diffs:
            raise ValueError(f"--resume: {run.path / 'config.json'} differs from the config these arguments build "
                             f"({'; '.join(diffs[:6])}); was it edited? Restore it or start a new run")
    return run


def config_differences(saved: dict, now: dict, prefix: str = "") -> list[str]:
    """'field: saved value in config.json, value now' for every leaf that differs (JSON-normalised)."""
    saved, now = json.loads(json.dumps(saved)), json.loads(json.dumps(now, default=str))
    out = []
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, f"{prefix}{key}.")
        elif a != b and not (isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-12)):
            out.append(f"{prefix}{key}: {a!r} in config.json, {b!r} now")
    return out


def remove_empty_folder(folder: Path) -> None:
    """A folder named like the run but empty (left by a tool, or made by hand) is not a run:
    remove it so the run can be created; a non-empty one that is not a run is refused."""
    if folder.is_dir() and not (folder / "config.json").exists():
        try:
            folder.rmdir()
        except OSError:
            raise ValueError(f"{folder} exists and is not a run folder (no config.json) but is not empty; "
                             "move it away or choose another --name / --out") from None


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
                raise ValueError(f"{len(state['optimizers'])} optimizer states for {len(opts)} optimizers")
            for opt, s in zip(opts, state["optimizers"]):
                opt.load_state_dict(s)
            generator.set_state(state["generator"])
            torch.set_rng_state(state["torch_rng"])
            state = {"step": int(state["step"]), "elapsed": float(state["elapsed"]),
                     "counters": dict(state["counters"]), "path": path}
        except Exception as e:  # noqa: BLE001  (a damaged file can fail in any of torch's loaders)
            failures.append(f"{path.name}: {type(e).__name__}: {str(e)[:120]}")
            warnings.warn(f"checkpoint {path} is unreadable ({type(e).__name__}); trying the one before it",
                          stacklevel=2)
            continue
        return state
    if failures:
        raise ValueError(f"--resume: no readable checkpoint in {run.path / 'checkpoints'} ({'; '.join(failures)}); "
                         "remove that folder to restart the run from step 0")
    return None


def _progress_bar(total: int, initial: int, desc: str):
    """A tqdm bar that redraws at most every 30 s when stderr is not a terminal or notebook.

    tqdm redraws ~10x a second; in a log file (CI, nohup, a pipe) every redraw is a line, and a
    run of a few hundred fast steps wrote one per step.
    """
    from tqdm.asyncio import tqdm as console_tqdm
    from tqdm.auto import tqdm
    in_notebook = tqdm is not console_tqdm  # tqdm.auto picked the Jupyter widget
    interactive = in_notebook or sys.stderr.isatty()
    return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, leave=True,
                mininterval=0.1 if interactive else 30.0)


def train(cfg: TrainConfig, out: str | os.PathLike = "runs", task=None, resume: bool = False,
          progress: bool = True, stop_after: int | None = None, deadline: float | None = None,
          stop: "StopRequest | None" = None, log=()) -> Run:
    """Train one run into out/<cfg.run_name>; returns the Run (complete unless stopped early).

    resume: continue the run folder from its latest readable checkpoint (metrics after it are
    dropped so every step is logged exactly once; temporary files of a killed process are
    removed); a complete run is returned untouched. stop_after: stop (without a summary) after
    that many steps, as a killed run would. deadline: a time.monotonic() value; the first step
    that ends after it is the last, checkpointed, so a run can be trained in segments of bounded
    wall time (lrt-lab sweep --time-limit) and continued with resume=True. stop: a StopRequest
    whose signals (SIGTERM, SIGUSR1, what schedulers send before preemption or the time limit)
    end the run the same way at the end of the current step; by default train installs one for
    its own duration when it runs in the main thread. log: mirrors the metrics lines, config and
    summary also go to ("wandb", "tensorboard", or a mirrors.MirrorSettings); not part of the
    run's config. A resumed run continues its mirrors (lrt_lab.mirrors).

    One writer per run (`lrt_lab.claims`): the folder is claimed before anything is written;
    RunClaimedError (a ValueError) when another live process trains it. A loss that becomes NaN
    or inf ends the run with summary status "diverged" (its step and loss recorded).
    """
    if stop_after is not None:
        check_int("stop_after", stop_after, 0)
    task, model, schedule = prepare(cfg, task)
    mirroring = mirror_settings(log)  # a missing package fails here, before anything is written
    device = resolve_device(cfg.device)
    root = check_out_dir("out", out)
    config = {"train": cfg.to_dict(), "model": model.config.to_dict(), "params": model.param_report(),
              "kind": cfg.model, "schedule": schedule.spec, "schedule_cost": schedule.cost,
              "forwards_per_token": getattr(model, "forwards_per_token", 1), "task_vocab_size": task.vocab_size}
    if resume:
        run = open_for_resume(root, cfg, config)
        claim = acquire(run.path)
        if run.is_complete:  # nothing to do, and nothing is touched
            claim.release()
            return run
    else:
        remove_empty_folder(root / cfg.run_name)
        run, claim = Run.create_claimed(root, cfg.run_name, config)
    own_stop = stop is None
    stop = StopRequest() if own_stop else stop
    try:
        with stop.installed() if own_stop else contextlib.nullcontext(), \
                mirrored(run, mirroring, config) as logged_run:  # the store, then the mirrors
            _train_claimed(cfg, logged_run, task, schedule, device, resume, progress, stop_after, deadline,
                           stop)
            return run
    finally:
        claim.release()


def _train_claimed(cfg: TrainConfig, run: Run, task, schedule, device, resume: bool, progress: bool,
                   stop_after: int | None, deadline: float | None, stop_request: "StopRequest") -> Run:
    """The training loop of a claimed run folder (see `train`)."""
    if resume:
        run.remove_temp_files()  # left by a killed process (a full checkpoint each)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, task.vocab_size).to(device)  # re-init under the run's seed
    opts = make_optimizers(model, cfg)
    generator = torch.Generator().manual_seed(cfg.seed)
    counters = {"tokens": 0, "compute_tokens": 0.0}
    start, elapsed = 0, 0.0
    state = restore_checkpoint(run, model, opts, generator, device) if resume else None
    if state is not None:
        start, elapsed, counters = state["step"], state["elapsed"], state["counters"]
        run.truncate_metrics(start)  # steps 1..start are in the checkpoint
    elif resume:
        run.truncate_metrics(-1)
    if resume and not run.is_complete:  # always said: which step a resumed run continues from
        where = f"step {start} ({state['path'].name})" if state is not None else "step 0 (no checkpoint yet)"
        print(f"resuming {run.name} from {where}", file=sys.stderr)
    if run.is_complete:
        return run

    eval_sets = make_eval_sets(task, cfg.eval_lengths, cfg.eval_size, seed=0)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else None)
    if cfg.compile:
        model.stage = torch.compile(model.stage)  # compiles the one primitive every stage uses
    cost = schedule.cost * getattr(model, "forward_cost", 1.0)
    bar = _progress_bar(cfg.steps, start, run.name) if progress else None
    last_eval, results = {}, None
    model.train()
    step = start
    stop = cfg.steps if stop_after is None else min(cfg.steps, start + stop_after)
    t0 = time.perf_counter() - elapsed
    while step < stop:
        length = task.length_at(step) if hasattr(task, "length_at") else cfg.length
        batch = task.sample(cfg.batch_size, generator, length=length)
        inputs, targets = batch.inputs.to(device), _masked_targets(batch).to(device)
        mult = set_schedules(opts, step, cfg)
        t_step = time.perf_counter()
        with autocast or _nullcontext():
            result = run_schedule(model, inputs, targets, schedule)
        result.loss.backward()
        optimizer_step(opts, model.parameters(), cfg.grad_clip)
        n_tokens = inputs.numel()
        # a dynamic schedule (FixedPoint, Rollout) measures the stages it ran: account for those
        step_cost = cost if result.measured is None else result.measured["cost"] * getattr(model, "forward_cost", 1.0)
        counters["tokens"] += n_tokens
        counters["compute_tokens"] += n_tokens * step_cost
        step += 1
        dt = time.perf_counter() - t_step
        record = {"kind": "train", "step": step, "loss": result.loss.item(),
                  "stage_losses": [l.item() for l in result.stage_losses], "lr_mult": mult, "length": length,
                  "tokens": counters["tokens"], "compute_tokens": counters["compute_tokens"],
                  "time": time.perf_counter() - t0, "tokens_per_s": n_tokens / max(dt, 1e-9)}
        if result.measured is not None:
            record.update(measured_record(result.measured, step_cost, dt))
        if not math.isfinite(record["loss"]):
            run.log(record)
            return diverged(run, cfg, step, record["loss"], time.perf_counter() - t0, counters, bar)
        if deadline is not None and time.monotonic() >= deadline and step < stop:
            stop = step  # out of time: checkpoint here, resume later
        if stop_request.requested and step < stop:
            stop = step  # SIGTERM / SIGUSR1: the same as running out of time
        run.log(record)
        # the checkpoint comes before the evaluation, so a failing or killed evaluation loses no training
        if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == stop:
            save_checkpoint(run, step, model, opts, generator, time.perf_counter() - t0, counters)
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
            results = evaluate(model, schedule, eval_sets, cfg.eval_exact, autocast=autocast)
            last_eval = eval_record(results)
            run.log({"kind": "eval", "step": step, "tokens": counters["tokens"],
                     "compute_tokens": counters["compute_tokens"], "time": time.perf_counter() - t0, **last_eval})
        if bar is not None:
            post = {"loss": f"{record['loss']:.3f}", "tok/s": f"{record['tokens_per_s']:.0f}"}
            key = f"pos90_exact@{cfg.eval_lengths[0]}"
            if key in last_eval:
                post["pos@90"] = last_eval[key]
            bar.set_postfix(post, refresh=False)  # shown at the bar's own rate, not once per step
            bar.update(1)
    if bar is not None:
        bar.close()
    if step < cfg.steps:
        if stop_request.requested:
            print(f"{run.name}: stopped at step {step} on {stop_request.requested}, checkpointed; run the same "
                  "command again (train: with --resume) to continue", file=sys.stderr)
        return run  # stopped early on request: resumable, no summary
    if results is None:  # resumed at the very end: nothing evaluated in this process yet
        results = evaluate(model, schedule, eval_sets, cfg.eval_exact, autocast=autocast)
    run.write_table("per_position", per_position_table(results))
    train_losses = [r["loss"] for r in run.metrics_records() if r.get("kind") == "train"]
    tail = train_losses[-max(1, len(train_losses) // 20):]
    if hasattr(schedule, "run"):  # dynamic: the mean cost of the steps it ran, not the upper bound
        cost = counters["compute_tokens"] / max(counters["tokens"], 1)
    run.write_summary({"status": "complete", "steps": cfg.steps, "trained_by": trained_by(), "final_loss": sum(tail) / len(tail),
                       "wall_time_s": time.perf_counter() - t0, "tokens": counters["tokens"],
                       "compute_tokens": counters["compute_tokens"], "schedule_cost": cost,
                       "forwards_per_token": getattr(model, "forwards_per_token", 1), "eval": eval_record(results)})
    return run
