"""`run_schedule`: the one way to run a schedule on a model (docs/design.md).

It checks the inputs, makes the model's empty buffer (or one holding memory rows the caller
supplies), lets the schedule run its stages (`Schedule.run`), takes each position's final logits
from the last stage that computed it, and forms the loss with the weights the run returned.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn as nn

from lrt_lab.core.hook_points import hook_points
from lrt_lab.core.interface import Measured, Schedule, ScheduleRun
from lrt_lab.core.loss import check_inputs, cross_entropy
from lrt_lab.core.positions import assemble
from lrt_lab.core.token_ids import vocab_size_of
from lrt_lab.run.hooks import capture
from lrt_lab.run.registry import as_schedule


@dataclass
class ScheduleOutput:
    logits: torch.Tensor  # (B, T, V): final logits per position
    loss: torch.Tensor | None  # the schedule's training loss
    stage_losses: list[torch.Tensor]  # one per stage (one mean when weights are None)
    stages: list[range]  # the position set of each stage
    stage_logits: list[torch.Tensor]  # logits of each stage at its positions
    buffer: object  # the final SequenceBuffer (prefill hands it on)
    measured: Measured  # what the run measured (its cost at least)


def run_schedule(
    model,
    idx: torch.Tensor,
    targets: torch.Tensor | None = None,
    schedule: Schedule | str | None = None,
    cache: dict | None = None,
    memory_rows: torch.Tensor | None = None,
) -> ScheduleOutput:
    """Run `schedule` (default OnePass; a string like "exact" is parsed) on idx (B, T); optionally
    compute its training loss. Token ids and targets are checked against the model's vocabulary.

    cache: a dict that receives every hook point's activation (`hook_embed`, `hook_mem_in`,
    `blocks.{l}.hook_resid_post`, ...; lrt_lab.run.hooks) as a (B, T, ...) tensor taken, like the
    logits, from the last stage that computed each position. To intervene rather than capture, run
    inside `lrt_lab.run.hooks.hooks(model, {...})`.

    memory_rows: memory rows m_t (B, <=T, d) the buffer starts from instead of zeros, e.g. the rows
    a `Decoder(..., keep_memory=True)` produced (`memory_rows()`): the paper's SFT/RL recipe (sec.
    "SFT and Reinforcement Learning"), and a way to score decoded sequences in one parallel pass
    (`FullSequence(0)` from them gives the decoder's logits). Stages read them wherever nothing was
    written yet; schedules that compute every row they read (Exact, Chunked(C <= exact_chunk),
    Rollout) give the same result with or without them.
    """
    check_inputs(idx, targets, vocab_size_of(model))
    schedule = as_schedule(schedule)
    memory_rows = _check_memory_rows(model, idx, memory_rows)
    if cache is not None and not isinstance(cache, dict):
        raise ValueError(
            f"cache={type(cache).__name__} is invalid; allowed: a dict (filled with "
            "the hooks) or None"
        )
    T = idx.size(1)
    buffer = (
        model.empty_buffer(idx) if memory_rows is None else model.empty_buffer(idx, memory_rows)
    )
    with capture(model) if cache is not None else contextlib.nullcontext() as recorded:
        ran = schedule.run(model, idx, buffer)
    if cache is not None:
        cache.update(recorded.assembled(T))
    logits = ran.logits
    if logits is None:
        logits = assemble(list(zip(ran.stages, ran.stage_logits)), T)
    loss, stage_losses = None, []
    if targets is not None:
        loss, stage_losses = _loss(logits, targets, ran)
    return ScheduleOutput(
        logits, loss, stage_losses, ran.stages, ran.stage_logits, ran.buffer, ran.measured
    )


def _loss(logits: torch.Tensor, targets: torch.Tensor, ran: ScheduleRun):
    """(the schedule's loss, per-stage losses): one mean CE over the final logits when the run
    gave no weights, else the weighted mean of each stage's CE at its positions."""
    if ran.weights is None:
        loss = cross_entropy(logits, targets)
        return loss, [loss]
    stage_losses = [
        cross_entropy(lp, targets[:, P.start : P.stop : P.step])
        for P, lp in zip(ran.stages, ran.stage_logits)
    ]
    loss = sum(w * l for w, l in zip(ran.weights, stage_losses)) / sum(ran.weights)
    return loss, stage_losses


def _check_memory_rows(model, idx: torch.Tensor, memory_rows):
    """The memory rows a run starts from, checked; a normal tensor (an inference tensor from a
    decoder is cloned: autograd cannot save one)."""
    if memory_rows is None:
        return None
    if model.pathway is None:
        raise ValueError(
            "memory_rows is invalid for a model without a memory pathway "
            "(config.memory=None); allowed: None"
        )
    B, T, d = idx.size(0), idx.size(1), model.config.n_embd
    if (
        not isinstance(memory_rows, torch.Tensor)
        or memory_rows.dim() != 3
        or not memory_rows.is_floating_point()
        or memory_rows.size(0) != B
        or not 1 <= memory_rows.size(1) <= T
        or memory_rows.size(2) != d
    ):
        shape = (
            tuple(memory_rows.shape)
            if isinstance(memory_rows, torch.Tensor)
            else type(memory_rows).__name__
        )
        raise ValueError(
            f"memory_rows is invalid: {shape}; allowed: a floating tensor "
            f"(B={B}, 1..T={T}, d={d}) of memory rows"
        )
    if memory_rows.device != idx.device:
        raise ValueError(
            f"memory_rows is invalid: on {memory_rows.device}; allowed: the device of idx "
            f"({idx.device})"
        )
    if not bool(torch.isfinite(memory_rows).all()):
        raise ValueError("memory_rows is invalid: it holds NaN or inf; allowed: finite memory rows")
    if memory_rows.is_inference() and not torch.is_inference_mode_enabled():
        memory_rows = memory_rows.clone()
    return memory_rows


def run_with_cache(
    model, idx: torch.Tensor, schedule=None, targets=None, names=None, per_stage: bool = False
):
    """TransformerLens's `run_with_cache`: (logits, cache) for a schedule (default OnePass),
    cache[name] a (B, T, ...) activation per hook point (attention scores and patterns
    (B, heads, T, T)), each position as the schedule's last stage to compute it left it. names:
    the hook points to record (default: all). Attention is written out only in the layers whose
    scores or pattern are recorded; the rest keep the fast kernels.

    per_stage=True also keeps what every stage computed: cache["stage.<k>.<name>"] is (B, T, ...)
    with NaN at the positions stage k did not compute, so what Interleaved(2)'s refinement read
    (its stage 1's hook_mem_in) or FullSequence's k-th sweep wrote can be set against exact
    decoding's (attention maps excluded)."""
    names = list(hook_points(model)) if names is None else list(names)
    with capture(model, names) as recorded:
        out = run_schedule(model, idx, targets, schedule)
    cache = recorded.assembled(idx.size(1))
    if per_stage:
        cache.update(recorded.per_stage(idx.size(1)))
    return out.logits, cache


class Scheduled(nn.Module):
    """A model and a schedule as one module whose forward is `run_schedule`: for a wrapper that
    must call a module's forward to do its work, such as DistributedDataParallel (its gradient
    hooks are armed in forward) or a compiled training step. Its parameters are the model's."""

    def __init__(self, model: nn.Module, schedule=None):
        super().__init__()
        self.model, self.schedule = model, as_schedule(schedule)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> ScheduleOutput:
        return run_schedule(self.model, idx, targets, self.schedule)
