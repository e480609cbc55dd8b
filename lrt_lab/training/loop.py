"""One training loop for every model and schedule, writing into the run store.

    from lrt_lab.training.loop import TrainConfig, train
    run = train(TrainConfig(task="a5_prefix", length=16, preset="small", schedule="interleaved:2"))

Optimisation follows the paper's appendix A ("Optimization"): Muon for the 2-D hidden matrices
(attention, MLP, the LRT projections W_k,rec / W_v,rec and the gate matrices: the released code's
choice, which keeps the gates unsaturated), AdamW with betas (0.8, 0.95) for embeddings, head and
scalars (lrt_lab.training.optim); no warm-up; linear warm-down to zero over the final half; Muon
momentum 0.85 -> 0.95 over the first 300 steps. Toy-size learning rates: the paper's reference
rates are for d=768 and 2^19-token batches. We keep its (d/768)^-1/2 scaling of the embedding and
head rates but not its sqrt(batch / 2^19) factor: toy batches are ~100x smaller and that factor
would shrink every rate ~10x, too slow to learn anything in CPU minutes. Instead the AdamW rates
are capped (embedding 0.1, scalars 0.05) and all rates share one multiplier, `lr_scale`.

Evaluation uses the decoding the model will really use: per-position accuracy and pos@90 at each
evaluation length with the training schedule's parallel forward *and* with exact recurrent decoding
(the Decoder, one position at a time), so the train/inference mismatch is visible.

Tasks come from a provider registered under the `lrt_lab.tasks` entry point (the built-in
`lrt_tasks`, the tasks/ folder
package registers itself), so lrt_lab never imports the task code; a Task object can also be passed
directly to `train(..., task=...)` (what it must provide: `lrt_lab.core.interface.Task`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

import torch

from lrt_lab.core.baselines import BASELINE_KINDS, build_baseline, is_baseline_kind
from lrt_lab.core.config import PRESETS, MemoryConfig, ModelConfig, preset
from lrt_lab.core.config import memory_preset as make_memory
from lrt_lab.core.interface import Task
from lrt_lab.core.loss import IGNORE_INDEX
from lrt_lab.core.model import LRT, LanguageModel
from lrt_lab.core.plugins import load_plugins
from lrt_lab.core.validation import (
    check_int,
    check_out_dir,
    fail,
)
from lrt_lab.run.contraction_monitor import contraction_record
from lrt_lab.run.evaluation import eval_record, evaluate, per_position_table
from lrt_lab.run.registry import parse_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.store.claims import acquire
from lrt_lab.store.events import first_reach
from lrt_lab.store.results import Run, diverged_line
from lrt_lab.training.budget import StepFlops, counted_params, resolve_budget
from lrt_lab.training.checkpoints import (
    open_for_resume,
    remove_empty_folder,
    restore_checkpoint,
    save_checkpoint,
)
from lrt_lab.training.guard import SpikeGuard, make_guard
from lrt_lab.training.mirrors import mirror_settings, mirrored
from lrt_lab.training.optim import build_optimizers, optimizer_step, set_lr_schedule
from lrt_lab.training.resources import check_memory_fits, resolve_device
from lrt_lab.training.stopping import StopRequest
from lrt_lab.training.train_config import MODEL_KINDS, TrainConfig


# Tasks ------------------------------------------------------------------------------------------
def task_provider():
    """The module registered under the `lrt_lab.tasks` entry point (the built-in `lrt_tasks`, the
    tasks/ folder)."""
    eps = list(importlib.metadata.entry_points(group="lrt_lab.tasks"))
    if not eps:
        raise ValueError(
            "task: no task provider is installed; `pip install -e .` registers the built-in tasks"
        )
    return eps[0].load()


def make_task(cfg: TrainConfig):
    return task_provider().make_task(cfg.task, cfg.length, **cfg.task_options)


def make_eval_sets(task, lengths, n, seed=0):
    return task_provider().make_eval_sets(task, lengths=lengths, n=n, seed=seed)


# Model ------------------------------------------------------------------------------------------
def model_config(cfg: TrainConfig, vocab_size: int) -> ModelConfig:
    """The ModelConfig for a run: preset + memory (the run's memory_preset, for LRT) + dotted
    overrides (memory.<field> on top of the memory preset)."""
    if cfg.model not in MODEL_KINDS and not is_baseline_kind(cfg.model):
        raise ValueError(
            f"model={cfg.model!r} is invalid; allowed: {', '.join(MODEL_KINDS)}, "
            f"{', '.join(BASELINE_KINDS)}"
        )
    top, mem = {}, {}
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)} - {"memory"}
    mem_fields = {f.name for f in dataclasses.fields(MemoryConfig)}
    for key, value in cfg.overrides.items():
        if key.startswith("memory."):
            sub = key[len("memory.") :]
            if sub not in mem_fields:
                raise ValueError(
                    f"--set {key}: unknown field; allowed memory fields: "
                    f"{', '.join(sorted(mem_fields))}"
                )
            mem[sub] = value
        elif key in model_fields:
            top[key] = value
        else:
            raise ValueError(
                f"--set {key}: unknown field; allowed: {', '.join(sorted(model_fields))}, "
                "memory.<field>"
            )
    if cfg.model != "lrt" and mem:
        raise ValueError(
            f"--set {next(iter(mem))}: model={cfg.model!r} has no memory; use --model lrt"
        )
    n_layer = top.get("n_layer", PRESETS[cfg.preset]["n_layer"])
    memory = make_memory(cfg.memory_preset, n_layer, **mem) if cfg.model == "lrt" else None
    fields = {"vocab_size": vocab_size, "sequence_len": cfg.length, **top}
    return preset(cfg.preset, memory=memory, **fields)


def build_model(cfg: TrainConfig, vocab_size: int) -> LanguageModel:
    config = model_config(cfg, vocab_size)
    if is_baseline_kind(cfg.model):
        return build_baseline(cfg.model, config)  # loop:N, ponder:N (LanguageModels without memory)
    return LRT(config)


# Optimisation -----------------------------------------------------------------------------------
def make_optimizers(model, cfg: TrainConfig) -> list[torch.optim.Optimizer]:
    """Muon for the hidden matrices (gate matrices included), AdamW for the rest, by declared role
    (lrt_lab.training.optim); the embedding and head rates scale as (d/768)^-1/2 (app. A)."""
    width = (model.config.n_embd / 768) ** -0.5
    s = cfg.lr_scale
    lrs = {
        "matrix": cfg.matrix_lr * s,
        "embedding": cfg.embedding_lr * width * s,
        "head": cfg.head_lr * width * s,
        "scalar": cfg.scalar_lr * s,
        "resid_scalar": cfg.scalar_lr * s,
        "x0_scalar": cfg.scalar_lr * s,
    }
    return build_optimizers(model, lrs, weight_decay=cfg.weight_decay)


# One step ---------------------------------------------------------------------------------------


def _masked_targets(batch) -> torch.Tensor:
    return batch.targets.masked_fill(~batch.loss_mask, IGNORE_INDEX)


# The loop ---------------------------------------------------------------------------------------


def trained_by() -> dict:
    """Which host and process trained a run (a sweep spreads runs over processes and nodes)."""
    import socket

    return {"host": socket.gethostname(), "pid": os.getpid(), "finished": time.time()}


def diverged(
    run: Run, cfg: TrainConfig, step: int, loss: float, elapsed: float, counters: dict, bar
) -> Run:
    """End a run whose loss became NaN or inf: summary.json says so (status "diverged", the step and
    the loss), so a sweep goes on to its next run and a re-run does not train it again."""
    if bar is not None:
        bar.close()
    summary = {
        "status": "diverged",
        "steps": cfg.steps,
        "diverged_at_step": step,
        "trained_by": trained_by(),
        "diverged_loss": str(loss),
        "wall_time_s": elapsed,
        "tokens": counters["tokens"],
        "compute_tokens": counters["compute_tokens"],
    }
    run.write_summary(summary)
    print(diverged_line(run.name, summary), file=sys.stderr)
    return run


def budgeted(cfg: TrainConfig, task=None) -> TrainConfig:
    """cfg with its steps set from its tokens-per-parameter budget, if it has one
    (`lrt_lab.training.budget`); what train() runs and records, and what a sweep compares."""
    if cfg.tokens_per_param is None:
        return cfg
    load_plugins(cfg.plugins)
    task = task if task is not None else make_task(cfg)
    with torch.device("meta"):
        model = build_model(cfg, task.vocab_size)
    return resolve_budget(cfg, model, task)


def prepare(cfg: TrainConfig, task=None):
    """Validate everything a run needs before anything is written: (task, model, schedule).

    The model is built on the meta device (shapes and parameter counts, no memory, no time), so a
    sweep can check every run of its grid first; train() builds the real one under the run's seed.
    """
    load_plugins(cfg.plugins)  # a config unpickled in a worker process skipped __post_init__
    task = task if task is not None else make_task(cfg)
    # a task passed in by hand fails here, not at the step that reads it
    if not isinstance(task, Task):
        fail(
            "task",
            task,
            "a task with name, length, min_length, vocab_size, length_at(step) and "
            "sample(...) (lrt_lab.core.interface.Task; lrt_tasks.Task provides them)",
        )
    if cfg.model != "lrt" and cfg.schedule != "onepass":
        raise ValueError(
            f"schedule={cfg.schedule!r} is invalid for model={cfg.model!r} (it has no memory; "
            "a baseline's own training forward is its stage); allowed: onepass"
        )
    with torch.device("meta"):
        model = build_model(cfg, task.vocab_size)
    if model.config.vocab_size < task.vocab_size:
        fail(
            "vocab_size",
            model.config.vocab_size,
            f"an integer >= {task.vocab_size}, the vocabulary of task {cfg.task!r}",
        )
    schedule = parse_schedule(cfg.schedule)
    check_memory_fits(cfg, model.config, schedule)
    start_length = task.length_at(0)
    reached = task.length_at(cfg.steps - 1)
    if reached < cfg.length:  # the run's name and evaluation say cfg.length
        warnings.warn(
            f"the curriculum reaches length {reached} by the last step ({cfg.steps}), not the "
            f"training length {cfg.length}: train more steps or shorten the curriculum "
            "(--curriculum START:STEPS)",
            stacklevel=2,
        )
    for length in sorted({start_length, cfg.length, *cfg.eval_lengths}):
        schedule.stages(length)  # e.g. Interleaved(S) needs S <= every length it will see
    # One sequence at every length the run will sample (training and evaluation), so a length the
    # task cannot make (below its minimum, beyond a corpus split) fails here and not at step N.
    min_length = task.min_length
    for n in cfg.eval_lengths:
        if n < min_length:
            fail(
                "eval_lengths",
                cfg.eval_lengths,
                f"integers >= {min_length}, the shortest sequence of task {cfg.task!r}",
            )
    for length in sorted({start_length, cfg.length}):
        task.sample(1, torch.Generator().manual_seed(cfg.seed), length=length)
    make_eval_sets(task, cfg.eval_lengths, 1, seed=0)
    return task, model, schedule


def _progress_bar(total: int, initial: int, desc: str):
    """A tqdm bar that redraws at most every 30 s when stderr is not a terminal or notebook.

    tqdm redraws ~10x a second; in a log file (CI, nohup, a pipe) every redraw is a line, and a
    run of a few hundred fast steps wrote one per step.
    """
    from tqdm.asyncio import tqdm as console_tqdm
    from tqdm.auto import tqdm

    in_notebook = tqdm is not console_tqdm  # tqdm.auto picked the Jupyter widget
    interactive = in_notebook or sys.stderr.isatty()
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        dynamic_ncols=True,
        leave=True,
        mininterval=0.1 if interactive else 30.0,
    )


def train(
    cfg: TrainConfig,
    out: str | os.PathLike = "runs",
    task=None,
    resume: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
    deadline: float | None = None,
    stop: StopRequest | None = None,
    log=(),
) -> Run:
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
    run's config. A resumed run continues its mirrors (lrt_lab.training.mirrors).

    One writer per run (`lrt_lab.store.claims`): the folder is claimed before anything is written;
    RunClaimedError (a ValueError) when another live process trains it. A loss that becomes NaN
    or inf ends the run with summary status "diverged" (its step and loss recorded).
    """
    if stop_after is not None:
        check_int("stop_after", stop_after, 0)
    cfg = budgeted(cfg, task)
    task, model, schedule = prepare(cfg, task)
    mirroring = mirror_settings(log)  # a missing package fails here, before anything is written
    device = resolve_device(cfg.device)
    config = run_config(cfg, task, model, schedule)
    run, claim = _open_claimed(check_out_dir("out", out), cfg, config, resume)
    if claim is None:  # complete: nothing to do, and nothing is touched
        return run
    own_stop = stop is None
    stop = StopRequest() if own_stop else stop
    try:
        with (
            stop.installed() if own_stop else contextlib.nullcontext(),
            mirrored(run, mirroring, config) as logged_run,
        ):  # the store, then the mirrors
            inputs = (task, schedule, device)
            _train_claimed(cfg, logged_run, *inputs, resume, progress, stop_after, deadline, stop)
            return run
    finally:
        claim.release()


def run_config(cfg: TrainConfig, task, model, schedule) -> dict:
    """A run's config.json: its TrainConfig and what it resolved to (model, schedule, budget)."""
    config = {
        "train": cfg.to_dict(),
        "model": model.config.to_dict(),
        "params": model.param_report(),
        "kind": cfg.model,
        "schedule": schedule.spec,
        "schedule_cost": schedule.cost,
        "forwards_per_token": model.forwards_per_token,
        "task_vocab_size": task.vocab_size,
    }
    if callable(getattr(task, "describe", None)):  # e.g. a corpus's size and hash
        config["task_info"] = task.describe()
    if cfg.tokens_per_param is not None:  # what R multiplied, so the store can plot R and C
        n = counted_params(model, cfg.param_convention)
        config["budget"] = {
            "tokens_per_param": cfg.tokens_per_param,
            "param_convention": cfg.param_convention,
            "params": n,
            "tokens": cfg.tokens_per_param * n,
        }
    return config


def _open_claimed(root, cfg: TrainConfig, config: dict, resume: bool):
    """(run, claim) of the run folder, new or resumed; claim None (released) when the resumed run
    is complete."""
    if not resume:
        remove_empty_folder(root / cfg.run_name)
        return Run.create_claimed(root, cfg.run_name, config)
    run = open_for_resume(root, cfg, config)
    claim = acquire(run.path)
    if run.is_complete:
        claim.release()
        return run, None
    return run, claim


@dataclass
class LoopState:
    """What the training loop carries from one step to the next."""

    step: int  # steps done
    stop: int  # the step this process stops after (cfg.steps, or earlier on request)
    counters: dict  # tokens, compute_tokens and flops so far
    t0: float  # perf_counter() at step 0 (a resumed run's earlier time included)
    last_eval: dict = field(default_factory=dict)
    results: dict | None = None  # the latest evaluation (evaluate's output)
    flops: StepFlops = field(default_factory=StepFlops)
    guard: SpikeGuard | None = None  # the loss-spike guard, when the run has one

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def _train_claimed(
    cfg: TrainConfig,
    run: Run,
    task,
    schedule,
    device,
    resume: bool,
    progress: bool,
    stop_after: int | None,
    deadline: float | None,
    stop_request: StopRequest,
) -> Run:
    """The training loop of a claimed run folder (see `train`)."""
    model, opts, generator, state = _start(cfg, run, task, device, resume)
    if state is None:  # complete: nothing to do
        return run
    guard = make_guard(cfg)
    if guard is not None and state.get("guard") is not None:
        guard.load_state_dict(state["guard"])
    eval_sets = make_eval_sets(task, cfg.eval_lengths, cfg.eval_size, seed=0)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else None
    if cfg.compile:
        model.compile_blocks()  # regional, every layer sharing its graphs (docs/scale.md)
    stop = cfg.steps if stop_after is None else min(cfg.steps, state["step"] + stop_after)
    loop = LoopState(state["step"], stop, state["counters"], time.perf_counter() - state["elapsed"])
    loop.flops.enabled = not cfg.compile
    loop.guard = guard
    if resume:
        _redo_lost_evaluation(run, model, schedule, eval_sets, cfg, autocast, loop)
    bar = _progress_bar(cfg.steps, loop.step, run.name) if progress else None
    model.train()
    while loop.step < loop.stop:
        record = _train_step(cfg, model, opts, task, schedule, generator, device, autocast, loop)
        if not math.isfinite(record["loss"]) and not record.get("guard_refused"):
            run.log(record)
            return diverged(run, cfg, loop.step, record["loss"], loop.elapsed(), loop.counters, bar)
        if loop.step < loop.stop and (
            (deadline is not None and time.monotonic() >= deadline) or stop_request.requested
        ):
            loop.stop = loop.step  # out of time, SIGTERM or SIGUSR1: checkpoint here, resume later
        run.log(record)
        # The checkpoint comes before the evaluation, so a failing or killed evaluation (it can
        # take longer than many steps) loses no training; the evaluation it lost is redone from
        # that checkpoint on resume (_redo_lost_evaluation).
        if (
            cfg.checkpoint_every and loop.step % cfg.checkpoint_every == 0
        ) or loop.step == loop.stop:
            save_checkpoint(
                run, loop.step, model, opts, generator, loop.elapsed(), loop.counters, guard=guard
            )
        if evaluation_due(cfg, loop.step):
            _evaluate_and_log(run, model, schedule, eval_sets, cfg, autocast, loop)
        _show_progress(bar, record, loop.last_eval, cfg)
    if bar is not None:
        bar.close()
    if loop.step < cfg.steps:
        if stop_request.requested:
            print(
                f"{run.name}: stopped at step {loop.step} on {stop_request.requested}, "
                "checkpointed; run the "
                "same command again (train: with --resume) to continue",
                file=sys.stderr,
            )
        return run  # stopped early on request: resumable, no summary
    return _finish(run, cfg, model, schedule, eval_sets, autocast, loop, task)


def _start(cfg: TrainConfig, run: Run, task, device, resume: bool):
    """(model, optimizers, data generator, state) under the run's seed, restored from the newest
    readable checkpoint when resuming; state is {step, elapsed, counters}, None for a complete
    run."""
    if resume:
        run.remove_temp_files()  # left by a killed process (a full checkpoint each)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, task.vocab_size).to(device)  # re-init under the run's seed
    opts = make_optimizers(model, cfg)
    generator = torch.Generator().manual_seed(cfg.seed)
    state = restore_checkpoint(run, model, opts, generator, device) if resume else None
    if state is not None:
        run.truncate_metrics(state["step"])  # steps 1..step are in the checkpoint
    elif resume:
        run.truncate_metrics(-1)
    if resume and not run.is_complete:  # always said: which step a resumed run continues from
        where = (
            f"step {state['step']} ({state['path'].name})"
            if state is not None
            else "step 0 (no checkpoint yet)"
        )
        print(f"resuming {run.name} from {where}", file=sys.stderr)
    if run.is_complete:
        return model, opts, generator, None
    return (
        model,
        opts,
        generator,
        state or {"step": 0, "elapsed": 0.0, "counters": new_counters()},
    )


def new_counters() -> dict:
    """What a run counts from step 0: tokens, forwards x tokens, FLOPs (forward + backward), and
    the process CPU seconds of its training steps (evaluations not included)."""
    return {"tokens": 0, "compute_tokens": 0.0, "flops": 0.0, "cpu_s": 0.0}


def _train_step(
    cfg: TrainConfig, model, opts, task, schedule, generator, device, autocast, loop: LoopState
) -> dict:
    """Sample a batch, run the schedule forward and backward, step the optimizers (or, when the
    spike guard refuses the step, undo the update before it instead); advances `loop` (step,
    counters) and returns the step's metrics line."""
    length = task.length_at(loop.step)
    batch = task.sample(cfg.batch_size, generator, length=length)
    inputs, targets = batch.inputs.to(device), _masked_targets(batch).to(device)
    mult = set_lr_schedule(opts, loop.step, cfg.steps, cfg.warmdown_frac)
    if loop.guard is not None:
        loop.guard.scale_rates(opts)
    cpu, t_step = time.process_time(), time.perf_counter()
    with autocast or contextlib.nullcontext(), loop.flops.counting(length) as forward:
        result = run_schedule(model, inputs, targets, schedule)
    loss = result.loss.item()
    refused = loop.guard is not None and loop.guard.refuses(loss, length)
    if refused:  # no backward; its forward FLOPs are counted
        loop.guard.refuse(loop.step + 1, model, opts)
        step_flops = loop.flops.forward(length, forward, result.measured.cost)
    else:
        step_flops = _update(cfg, model, opts, result, length, loss, loop, forward)
    dt = time.perf_counter() - t_step
    step_cost = result.measured.cost * model.forward_cost  # the baselines' forwards cost more
    n_tokens = inputs.numel()
    counters = loop.counters
    counters["tokens"] += n_tokens
    counters["compute_tokens"] += n_tokens * step_cost
    # a checkpoint from before FLOPs (CPU time) were counted has none: its total stays NaN
    counters["flops"] = counters.get("flops", math.nan) + step_flops
    counters["cpu_s"] = counters.get("cpu_s", math.nan) + (time.process_time() - cpu)
    loop.step += 1
    return {
        "kind": "train",
        "step": loop.step,
        "loss": loss,
        "stage_losses": [l.item() for l in result.stage_losses],
        "lr_mult": mult,
        "length": length,
        "tokens": counters["tokens"],
        "compute_tokens": counters["compute_tokens"],
        "flops": counters["flops"],
        "step_flops": step_flops,
        "time": loop.elapsed(),
        "cpu_s": counters["cpu_s"],
        "tokens_per_s": n_tokens / max(dt, 1e-9),
        # forwards per token this step ran, and what else the schedule measured
        # (FixedPoint: sweeps, last residual, converged; Rollout: the rollout's time share)
        "step_cost": step_cost,
        **result.measured.record(dt),
        **(loop.guard.record(refused, loop.step) if loop.guard is not None else {}),
    }


def _update(cfg: TrainConfig, model, opts, result, length: int, loss: float, loop, forward):
    """The backward and optimizer step of an accepted step; returns the step's FLOPs."""
    if loop.guard is not None:
        loop.guard.keep(model, opts)  # what a refusal of the next step restores
    with loop.flops.counting(length) as backward:
        result.loss.backward()
    optimizer_step(opts, model.parameters(), cfg.grad_clip)
    if loop.guard is not None:
        loop.guard.accept(loss, length)
    return loop.flops.step(length, forward, backward, result.measured.cost)


def evaluation_due(cfg: TrainConfig, step: int) -> bool:
    """Whether the loop evaluates (and logs an "eval" line) after `step`."""
    return bool(cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps


def _redo_lost_evaluation(
    run: Run, model, schedule, eval_sets: dict, cfg: TrainConfig, autocast, loop: LoopState
) -> None:
    """On resume from the checkpoint of step s: evaluate and log step s if its evaluation is due
    and missing from metrics.jsonl (the process died during it, after the checkpoint was written).

    The evaluation is a function of the model alone (fixed evaluation sets, no random draws), so
    it is redone exactly from the checkpoint, and writing the checkpoint first stays the design
    that loses nothing. An evaluation missing at an earlier step (a damaged metrics line) cannot
    be redone: the model at that step is not kept, so a warning names the steps.
    """
    evaluated = {r.get("step") for r in run.metrics_records(kind="eval")}
    lost = [s for s in range(1, loop.step + 1) if evaluation_due(cfg, s) and s not in evaluated]
    if loop.step in lost:
        _evaluate_and_log(run, model, schedule, eval_sets, cfg, autocast, loop)
    earlier = [s for s in lost if s != loop.step]
    if earlier:
        warnings.warn(
            f"{run.name}: metrics.jsonl has no evaluation at step(s) "
            f"{', '.join(map(str, earlier[:8]))}{' ...' if len(earlier) > 8 else ''}; "
            "they cannot be redone (the model at those steps is not kept)",
            stacklevel=3,
        )


def _evaluate_and_log(
    run: Run, model, schedule, eval_sets: dict, cfg: TrainConfig, autocast, loop: LoopState
) -> None:
    loop.results = evaluate(model, schedule, eval_sets, cfg.eval_exact, autocast=autocast)
    loop.last_eval = eval_record(loop.results)
    if cfg.eval_contraction:  # on the first evaluation length's set (the training length's)
        with autocast or contextlib.nullcontext():
            loop.last_eval.update(contraction_record(model, next(iter(eval_sets.values())).inputs))
    run.log(
        {
            "kind": "eval",
            "step": loop.step,
            "tokens": loop.counters["tokens"],
            "compute_tokens": loop.counters["compute_tokens"],
            "flops": loop.counters.get("flops", math.nan),
            "time": loop.elapsed(),
            **loop.last_eval,
        }
    )


def _show_progress(bar, record: dict, last_eval: dict, cfg: TrainConfig) -> None:
    if bar is None:
        return
    post = {"loss": f"{record['loss']:.3f}", "tok/s": f"{record['tokens_per_s']:.0f}"}
    key = f"pos90_exact@{cfg.eval_lengths[0]}"
    if key in last_eval:
        post["pos@90"] = last_eval[key]
    bar.set_postfix(post, refresh=False)  # shown at the bar's own rate, not once per step
    bar.update(1)


def _epochs(task, tokens: int) -> dict:
    """{"epochs": passes over the training data} for a task of finite data (a corpus): a model
    that sees the same text again is favoured over one that sees it less often."""
    size = getattr(task, "train_tokens", None)
    return {"epochs": tokens / size} if size else {}


def _logged_evaluation(run: Run, step: int) -> dict:
    """The figures of step's "eval" line in metrics.jsonl (the last one, if logged twice), without
    its bookkeeping (kind, step, counters, time); {} when there is none."""
    lines = [r for r in run.metrics_records(kind="eval") if r.get("step") == step]
    bookkeeping = {"kind", "step", "tokens", "compute_tokens", "flops", "time"}
    return {k: v for k, v in lines[-1].items() if k not in bookkeeping} if lines else {}


def _contraction(last_eval: dict) -> dict:
    rec = {k: v for k, v in last_eval.items() if k == "lyap" or k.startswith("sweep_change_")}
    return {"contraction": rec} if rec else {}


def _finish(
    run: Run, cfg: TrainConfig, model, schedule, eval_sets: dict, autocast, loop: LoopState, task
) -> Run:
    """The final evaluation's per-position table and summary.json: the run is complete."""
    if loop.results is None:  # resumed at the end after its evaluation was logged: not in memory
        loop.results = evaluate(model, schedule, eval_sets, cfg.eval_exact, autocast=autocast)
        # what that evaluation logged (the contraction monitor too), as the summary keeps it
        loop.last_eval = loop.last_eval or _logged_evaluation(run, loop.step)
    run.write_table("per_position", per_position_table(loop.results))
    train_losses = [r["loss"] for r in run.metrics_records(kind="train")]
    tail = train_losses[-max(1, len(train_losses) // 20) :]
    counters = loop.counters
    # the mean of what the steps ran (a schedule that adapts to the data: not its upper bound)
    cost = counters["compute_tokens"] / max(counters["tokens"], 1)
    run.write_summary(
        {
            "status": "complete",
            "steps": cfg.steps,
            "trained_by": trained_by(),
            "final_loss": sum(tail) / len(tail),
            "wall_time_s": loop.elapsed(),
            "tokens": counters["tokens"],
            "compute_tokens": counters["compute_tokens"],
            # forward + backward, counted (lrt_lab.training.budget.StepFlops)
            "flops": counters.get("flops", math.nan),
            "cpu_s": counters.get("cpu_s", math.nan),  # of the training steps (process time)
            "schedule_cost": cost,
            **_epochs(task, counters["tokens"]),
            "forwards_per_token": model.forwards_per_token,
            "eval": eval_record(loop.results),
            # the contraction monitor at the last evaluation (lrt_lab.run.contraction_monitor)
            **_contraction(loop.last_eval),
            # the steps the loss-spike guard refused, and the rate factor it left
            **({"guard": loop.guard.summary()} if loop.guard is not None else {}),
            # when pos@90 first reached the training length (None: not within the budget)
            "reached": {
                key: first_reach(evals, key, cfg.length)
                for evals in [run.metrics_records(kind="eval")]  # the log read once
                for key in (f"pos90_exact@{cfg.length}", f"pos90_parallel@{cfg.length}")
            },
        }
    )
    return run
