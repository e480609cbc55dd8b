"""The torch half of the built-in schedules: how the stages they describe run on a model.

`lrt_lab.run.schedules` holds each schedule's spec (its fields, spelling, validation, stages and
cost) and imports no torch, so a spelling parses and a bad one is refused without loading it; a
schedule's `run` imports this module when it first runs. Nothing here reads a schedule's class:
each function takes what it needs (the stages, the fields) from the schedule that calls it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from lrt_lab.core.buffer import compute_dtype
from lrt_lab.core.interface import Measured, ScheduleRun
from lrt_lab.run.schedules import rolled_out_positions


def run_stages(model, idx: torch.Tensor, stages: list[range], buffer):
    """([logits at each stage's positions], the final buffer): the stages in order, each reading
    the buffer the ones before it wrote."""
    stage_logits = []
    for P in stages:
        logits_P, buffer = model.stage(idx[:, P.start : P.stop : P.step], P, buffer)
        stage_logits.append(logits_P)
    return stage_logits, buffer


def run_staged(schedule, model, idx: torch.Tensor, buffer, warm: list[range] = ()) -> ScheduleRun:
    """A schedule whose stages are known up front: `warm` (stages run without autograd, no loss),
    then `stages(T)` in order, weighed by `stage_weights(T)`."""
    if warm:
        with torch.no_grad():
            _, buffer = run_stages(model, idx, warm, buffer)
    T = idx.size(1)
    stages = schedule.stages(T)
    stage_logits, buffer = run_stages(model, idx, stages, buffer)
    measured = Measured(schedule.cost)
    return ScheduleRun(stages, stage_logits, schedule.stage_weights(T), buffer, measured)


def run_chunked(schedule, model, idx: torch.Tensor, buffer) -> ScheduleRun:
    """Chunked(C): the chunks in order, or, where the model allows it (`LRT.exact_split`: C <= the
    memory's exact chunk), the blocks above the source layer once for all positions after them."""
    split = model.exact_split(schedule.C)
    if split is None:
        return run_staged(schedule, model, idx, buffer)
    stages = schedule.stages(idx.size(1))
    logits, buffer = _run_split(model, idx, stages, split, buffer)
    stage_logits = [logits[:, P.start : P.stop] for P in stages]
    return ScheduleRun(stages, stage_logits, None, buffer, Measured(schedule.cost), logits)


def _run_split(model, idx: torch.Tensor, stages: list[range], split: int, buffer):
    """Exact with the blocks above the source layer deferred: blocks [0, split) stage by stage
    (the recurrence), then blocks [split, L) for all positions in one causal stage that
    reads the finished memory m_{t-1}. Same logits as running every block per position (tested);
    the sequential part shrinks to split/L of the blocks."""
    lower, upper = range(0, split), range(split, model.config.n_layer)
    resid = []
    for P in stages:
        x_P, buffer = model.stage(idx[:, P.start : P.stop], P, buffer, layers=lower)
        resid.append(x_P)
    full = range(0, idx.size(1))
    return model.stage(idx, full, buffer, layers=upper, resid=torch.cat(resid, dim=1))


@dataclass
class FixedPointMeasured(Measured):
    """What a FixedPoint step saw, besides its cost."""

    sweeps: int = 0  # sweeps run after init
    residuals: list[float] = field(default_factory=list)  # the memory's change after each sweep
    converged: bool = False  # whether the last change was <= tol
    residual_per_position: torch.Tensor | None = None  # (sweeps, T): each sweep's per position

    def record(self, step_s: float) -> dict:
        return {"sweeps": self.sweeps, "residual": self.residuals[-1], "converged": self.converged}


def run_fixedpoint(schedule, model, idx: torch.Tensor, buffer) -> ScheduleRun:
    """FixedPoint(tol, max_sweeps, grad_sweeps) on idx from `buffer` (empty); see its docstring."""
    T, L = idx.size(1), model.config.n_layer
    full = range(0, T)
    split = model.exact_split(1)
    stages, stage_logits, cost = [], [], [0.0]
    residuals, per_position = [], []

    def differentiated(buf):
        logits, buf = model.stage(idx, full, buf)
        stages.append(full)
        stage_logits.append(logits)
        cost[0] += 1.0
        return buf

    def memory_only(buf):  # a no_grad pass: only the blocks that feed m_t
        if split is None:
            _, buf = model.stage(idx, full, buf)
        else:
            _, buf = model.stage(idx, full, buf, layers=range(0, split))
        cost[0] += (split or L) / L
        return buf

    def sweep(step, buf):  # -> (buffer, converged)
        prev = buf.mem
        buf = step(buf)
        r, rp = memory_change(prev, buf.mem)
        residuals.append(r)
        per_position.append(rp)
        return buf, r <= schedule.tol

    converged = False
    if schedule.grad_sweeps >= schedule.max_sweeps:  # untruncated: FullSequence(k), a stopping rule
        buffer = differentiated(buffer)
        for _ in range(schedule.max_sweeps):
            buffer, converged = sweep(differentiated, buffer)
            if converged:
                break
    else:
        with torch.no_grad():
            buffer = memory_only(buffer)
            while len(residuals) < schedule.max_sweeps - schedule.grad_sweeps:
                buffer, converged = sweep(memory_only, buffer)
                if converged:
                    break
        for _ in range(schedule.grad_sweeps):
            buffer, converged = sweep(differentiated, buffer)
    measured = FixedPointMeasured(
        cost[0], len(residuals), residuals, bool(converged), torch.stack(per_position)
    )
    return ScheduleRun(stages, stage_logits, [1.0] * len(stages), buffer, measured)


@dataclass
class RolloutMeasured(Measured):
    """What a Rollout step saw, besides its cost."""

    rollout_cost: float = 0.0  # the rollout's share of the cost (forward only)
    rollout_s: float = 0.0  # seconds the rollout took
    grad_sweeps: int = 1

    def record(self, step_s: float) -> dict:
        return {"rollout_share": self.rollout_s / max(step_s, 1e-9)}


def run_rollout(schedule, model, idx: torch.Tensor, buffer) -> ScheduleRun:
    """Rollout(G): the rollout and the G stages on idx from `buffer` (its memory rows are replaced
    by the rollout's: every row a position reads is computed exactly)."""
    T, L, G = idx.size(1), model.config.n_layer, schedule.grad_sweeps
    start = time.perf_counter()
    rows, layers = rollout_memory(model, idx)
    if rows is not None and rows.is_cuda:
        torch.cuda.synchronize(rows.device)  # the rollout's share of the step is measured
    rollout_s = time.perf_counter() - start
    if rows is not None:
        buffer = buffer.with_memory_rows(rows.clone() if rows.is_inference() else rows)
    rollout_cost = len(layers) / L * rows.size(1) / T if rows is not None else 0.0
    full, stage_logits = range(0, T), []
    for _ in range(G):
        logits, buffer = model.stage(idx, full, buffer)
        stage_logits.append(logits)
    measured = RolloutMeasured(rollout_cost + G, rollout_cost, rollout_s, G)
    return ScheduleRun([full] * G, stage_logits, [1.0] * G, buffer, measured)


@torch.inference_mode()
def rollout_memory(model, idx: torch.Tensor) -> tuple[torch.Tensor | None, range]:
    """(m_t for the positions some position reads (B, T - exact_chunk, d), exactly, as an
    inference tensor; the blocks it ran). The last exact_chunk positions' memory is read only
    beyond the sequence, so they are not rolled out (the sweeps that follow compute them).

    One position per stage, no autograd, through the blocks that feed m_t (all blocks when the
    source is the top one), into a `DecodeCache` that keeps every memory row: in-place writes, so
    a stage costs the same at position 1 and at position T. (None, range(0)) for a model without a
    memory pathway (nothing to roll out)."""
    if model.pathway is None:
        return None, range(0)
    B, T = idx.shape
    split = model.exact_split(1)
    layers = range(0, split if split is not None else model.config.n_layer)
    ref = next(model.parameters())
    dtype = compute_dtype(idx.device, ref.dtype)
    cache = model.new_decode_cache(B, T, device=idx.device, dtype=dtype, keep_memory=True)
    with launch_bound_threads(idx.device):
        for t in range(rolled_out_positions(model.config, T)):
            tokens = idx[:, t : t + 1]
            cache.append_tokens(tokens)
            model.stage(tokens, range(t, t + 1), cache, layers=layers)
    return cache.memory_rows(), layers


@contextlib.contextmanager
def launch_bound_threads(device: torch.device):
    """Run a stretch of one-position stages on one intra-op thread (CPU only).

    Their ops are tiny: a second OpenMP thread adds almost no speed and spins between them, which
    doubles the CPU time they take (measured on 2 cores: a T=256, B=8 rollout in 258 ms wall /
    516 ms CPU on two threads, 290 ms / 290 ms on one) and takes a core from whatever else runs.
    The caller's thread count is restored on exit."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@torch.no_grad()
def memory_change(
    prev: torch.Tensor | None, new: torch.Tensor | None
) -> tuple[float, torch.Tensor]:
    """(r, r_t): the largest change of the memory between two sweeps relative to the batch's RMS
    memory norm (FixedPoint), and per position (T,) the largest over the batch. None is zero
    memory."""
    if new is None:  # no memory pathway: nothing can change
        return 0.0, torch.zeros(0)
    dtype = torch.promote_types(new.dtype, torch.float32)  # bf16 memory measured in fp32, fp64 kept
    new = new.detach().to(dtype)
    prev = torch.zeros_like(new) if prev is None else prev.detach().to(dtype)[:, : new.size(1)]
    change = (new - prev).norm(dim=-1)  # (B, T)
    scale = new.norm(dim=-1).square().mean().sqrt()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    per_position = (change / scale).amax(dim=0).cpu()
    return float(per_position.max()), per_position
