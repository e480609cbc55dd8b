"""Schedules: orders of stages over a shared buffer, for training and for prefill.

| schedule            | stages (position sets)                     | loss                         |
|---------------------|--------------------------------------------|------------------------------|
| OnePass()           | all positions, zero memory                 | mean CE                      |
| Interleaved(S)      | init: all; then {t : t % S == s}, s < S    | (L_init + sum_s L_s) / (S+1) |
|                     |                                            | (sec. 3.1)                   |
| FullSequence(K, w)  | init: all; then K synchronous refinements  | uniform mean, or             |
|                     |                                            | sum w_k L_k / sum w_k (C.1)  |
| Chunked(C)          | contiguous chunks of C in order, no init   | mean CE (sec. 3.2)           |
| Exact()             | Chunked(1): one position per stage         | mean CE                      |
| FixedPoint(tol,N,G) | init; full refinements until the memory    | uniform mean over the last G |
|                     | changes by <= tol, at most N (dynamic)     | (differentiated) stages      |
| Rollout(G)          | exact memory rollout without autograd (one | uniform mean over the G      |
|                     | position per stage, source blocks), then G | stages; == FixedPoint(0,     |
|                     | differentiated full sweeps                 | T+G, G)                      |
| GaussSeidel(S,N,G)  | init; then N sweeps over Interleaved's S   | uniform mean over the        |
|                     | groups, all but the last G without grad    | differentiated stages        |

Any schedule can start from memory rows the caller supplies (`run_schedule(..., memory_rows=rows)`;
cached rollout states, paper sec. "SFT and Reinforcement Learning"). Each position's final logits
come from the last stage that computed it. In the limit,
Interleaved(S=T) == GaussSeidel(S=T, N) == FullSequence(K=T) == Chunked(1) == Exact ==
token-by-token decoding; the test suite holds those equalities in float64.

Every schedule satisfies `lrt_lab.core.interface.Schedule`: it describes itself (`spec`, `cost`,
`exact`, `causal`, `family`, `stages(T)`, `stage_weights(T)`, `sweep(T)`, `solver_sweeps(T)`,
`forwards(model, T)`) and runs (`run(model, idx, buffer)`), so the analyses ask a schedule what it
is instead of testing its class. Those whose stages are known up front derive from
`StagedSchedule`, whose `run` runs `stages(T)` in order; FixedPoint and Rollout decide their
stages as they go and return what they measured as a typed `Measured`. Each class joins the
registry (`lrt_lab.run.registry`) with its spelling.

This module is the schedules' spec (fields, spelling, validation, stages, costs) and imports no
torch, so a spelling parses, and a bad one is refused, without loading it (a contract in
pyproject.toml, and tests/test_plugins.py at run time). How they run on a model is
`lrt_lab.run.execution`, which `run` imports the first time a schedule runs.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lrt_lab.core.interface import Forwards
from lrt_lab.core.validation import check_int, check_number, is_number
from lrt_lab.run.registry import register_schedule

if TYPE_CHECKING:
    import torch

    from lrt_lab.core.interface import ScheduleRun

NO_SWEEPS = (math.nan, math.nan)  # solver_sweeps of a schedule that does not iterate (Chunked)


def _execution():
    """`lrt_lab.run.execution` (torch), imported when a schedule first runs, not with this module:
    an import statement here would tie the spec to torch (for the import contract as at run
    time), so it is imported by name, as the registry imports this module."""
    return importlib.import_module("lrt_lab.run.execution")


class StagedSchedule:
    """A schedule whose stages are known before it runs: a subclass (a frozen dataclass) gives
    `stages(T)` and `cost`; this base runs the stages in order, weighs their losses uniformly
    and spells the schedule from its registered name and fields (`interleaved:2`). It answers
    for a schedule that does not iterate one sweep: `solver_sweeps` NaN, `family` its spec,
    `sweep` refused (a subclass that iterates one says so)."""

    name = ""  # set by register_schedule
    exact = False
    # A position's logits read only the tokens up to it: the stages of a prefix of the sequence
    # are those of the whole sequence restricted to it, so right padding changes nothing before it.
    causal = True

    def stages(self, T: int) -> list[range]:
        raise NotImplementedError

    @property
    def cost(self) -> float:
        raise NotImplementedError

    def stage_weights(self, T: int) -> list[float] | None:
        return [1.0] * len(self.stages(T))

    @property
    def spec(self) -> str:
        values = [getattr(self, f.name) for f in dataclasses.fields(self) if f.init]
        return ":".join(
            [self.name, *(f"{v:g}" if isinstance(v, float) else str(v) for v in values)]
        )

    @property
    def family(self) -> str:
        return self.spec

    def sweep(self, T: int) -> list[range]:
        raise ValueError(
            f"schedule={self.spec!r} is invalid here: it does not iterate a sweep over the "
            "positions; allowed: a schedule with one (fullseq, interleaved, gaussseidel, chunked, "
            "exact, fixedpoint, rollout)"
        )

    def solver_sweeps(self, T: int, measured=None) -> tuple[float, float]:
        return NO_SWEEPS

    def forwards(self, model, T: int) -> Forwards:
        """Every stage differentiated: the positions it computes per token."""
        return Forwards(sum(len(P) for P in self.stages(T)) / T)

    def run(self, model, idx: torch.Tensor, buffer) -> ScheduleRun:
        return _execution().run_staged(self, model, idx, buffer)


@register_schedule("onepass")
@dataclass(frozen=True)
class OnePass(StagedSchedule):
    """The plain transformer's forward; for an LRT, one-pass prefill with zero memory."""

    def stages(self, T: int) -> list[range]:
        return [range(0, T)]

    @property
    def cost(self) -> float:
        return 1.0


@register_schedule("interleaved:S")
@dataclass(frozen=True)
class Interleaved(StagedSchedule):
    """Paper sec. 3.1: an init pass over all positions, then S strided subsets with write-back."""

    S: int = 2

    def __post_init__(self):
        check_int("Interleaved.S", self.S, 1)

    def stages(self, T: int) -> list[range]:
        return [range(0, T)] + strided_groups("Interleaved", self.S, T)

    @property
    def cost(self) -> float:
        return 2.0  # one init pass + the S subsets that recompute the sequence once

    @property
    def family(self) -> str:
        return f"interleaved S={self.S}"

    def sweep(self, T: int) -> list[range]:
        return strided_groups("Interleaved", self.S, T)

    def solver_sweeps(self, T: int, measured=None) -> tuple[float, float]:
        return 1.0, 1.0  # the groups recompute every position once, differentiated


def strided_groups(owner: str, S: int, T: int) -> list[range]:
    """Sec. 3.1's strided partition: group g = {t : t % S == g}, for g = 0..S-1 in that order."""
    if S > T:
        raise ValueError(f"{owner}.S={S} is invalid for T={T}; allowed: 1 <= S <= T")
    return [range(g, T, S) for g in range(S)]


@register_schedule("gaussseidel:S:N[:G]")
@dataclass(frozen=True)
class GaussSeidel(StagedSchedule):
    """Interleaved(S) swept N times: an init pass over all positions, then N sweeps, each over
    the S strided groups of sec. 3.1 in order, every group's stage reading the memory (and K/V)
    the groups before it in this sweep and the rest of the previous sweep wrote. Block
    Gauss-Seidel on m_t = F(x_<=t, m_<t), where FullSequence(K) is Jacobi.

    After sweep n the positions < n*S are exact, whatever the weights and memory options: a
    position reads only rows before itself, and those of its own block of S (groups before its
    own) were recomputed earlier in the same sweep. So N >= ceil(T/S) sweeps give Exact's
    logits, S = T after one sweep (tested; Jacobi, FullSequence, gains one position per sweep).

    Gradient: as FixedPoint's. Init and the sweeps before the last G run without autograd; the
    last G sweeps are differentiated from the detached buffer, and the loss is the uniform mean
    of their G*S stages' CE. With G = N nothing is truncated: init and every group stage carry a
    loss and a gradient, so GaussSeidel(S, 1) is Interleaved(S) (loss and gradients; tested).
    The no-grad passes run the whole stack, not only the blocks that feed m_t (FixedPoint's
    saving): a group stage attends to the K/V of every layer that the earlier passes left at
    the other groups' positions, so those are part of the iterate.

    Cost: the init pass and each sweep recompute the sequence once, so 1 + N forwards per token,
    G of them differentiated when G < N (`forwards`)."""

    S: int = 2
    sweeps: int = 2
    grad_sweeps: int = 1

    def __post_init__(self):
        check_int("GaussSeidel.S", self.S, 1)
        check_int("GaussSeidel.sweeps", self.sweeps, 1)
        check_int("GaussSeidel.grad_sweeps", self.grad_sweeps, 1, self.sweeps)

    @property
    def truncated(self) -> bool:
        return self.grad_sweeps < self.sweeps

    def stages(self, T: int) -> list[range]:
        """The stages that carry a loss: init and every sweep's groups, or the last G sweeps'."""
        groups = strided_groups("GaussSeidel", self.S, T)
        if self.truncated:
            return groups * self.grad_sweeps
        return [range(0, T)] + groups * self.sweeps

    def stages_without_grad(self, T: int) -> list[range]:
        """What runs before `stages(T)` without autograd: init and the first N - G sweeps."""
        if not self.truncated:
            return []
        groups = strided_groups("GaussSeidel", self.S, T)
        return [range(0, T)] + groups * (self.sweeps - self.grad_sweeps)

    @property
    def cost(self) -> float:
        return float(1 + self.sweeps)

    @property
    def spec(self) -> str:
        g = f":{self.grad_sweeps}" if self.grad_sweeps != 1 else ""
        return f"gaussseidel:{self.S}:{self.sweeps}{g}"

    @property
    def family(self) -> str:
        return f"gaussseidel S={self.S} G={self.grad_sweeps}"

    def sweep(self, T: int) -> list[range]:
        return strided_groups("GaussSeidel", self.S, T)

    def solver_sweeps(self, T: int, measured=None) -> tuple[float, float]:
        return float(self.sweeps), float(self.grad_sweeps)

    def forwards(self, model, T: int) -> Forwards:
        inference = sum(len(P) for P in self.stages_without_grad(T)) / T
        return Forwards(super().forwards(model, T).differentiated, inference)

    def run(self, model, idx: torch.Tensor, buffer) -> ScheduleRun:
        warm = self.stages_without_grad(idx.size(1))
        return _execution().run_staged(self, model, idx, buffer, warm)


def _parse_fullseq(args: list[str]) -> FullSequence:
    """`fullseq:K[:w0,w1,...]`: the weights one argument, comma-separated."""
    if len(args) not in (1, 2):
        raise ValueError(f"fullseq takes 1 or 2 arguments, {len(args)} given")
    weights = tuple(float(x) for x in args[1].split(",")) if len(args) == 2 else None
    return FullSequence(int(args[0]), weights)


@dataclass(frozen=True)
class FullSequence(StagedSchedule):
    """Paper sec. 3.1 "Full-sequence refinement for S=1": K synchronous refinements after init."""

    K: int = 1
    weights: tuple[float, ...] | None = None

    def __post_init__(self):
        check_int("FullSequence.K", self.K, 0)
        if self.weights is not None:
            if not isinstance(self.weights, (tuple, list)):
                raise ValueError(
                    f"FullSequence.weights={self.weights!r} is invalid; allowed: "
                    f"None or a tuple of K+1 = {self.K + 1} non-negative numbers"
                )
            w = tuple(self.weights)
            object.__setattr__(self, "weights", w)
            if len(w) != self.K + 1:
                raise ValueError(
                    f"FullSequence.weights has {len(w)} entries; allowed: exactly "
                    f"K+1 = {self.K + 1} (init + each refinement)"
                )
            if not all(is_number(x, low=0) for x in w) or not 0 < sum(w) < float("inf"):
                raise ValueError(
                    f"FullSequence.weights={w} is invalid; allowed: finite "
                    "non-negative numbers with a positive (finite) sum"
                )

    def stages(self, T: int) -> list[range]:
        return [range(0, T)] * (self.K + 1)

    def stage_weights(self, T: int) -> list[float]:
        return list(self.weights) if self.weights is not None else [1.0] * (self.K + 1)

    @property
    def cost(self) -> float:
        return float(self.K + 1)

    @property
    def spec(self) -> str:
        w = "" if self.weights is None else ":" + ",".join(f"{x:g}" for x in self.weights)
        return f"fullseq:{self.K}{w}"

    @property
    def family(self) -> str:
        return "fullseq"

    def sweep(self, T: int) -> list[range]:
        return [range(0, T)]  # Jacobi: every position at once

    def solver_sweeps(self, T: int, measured=None) -> tuple[float, float]:
        return float(self.K), float(self.K)


register_schedule("fullseq:K[:w0,w1,...]", parse=_parse_fullseq)(FullSequence)


@register_schedule("chunked:C")
@dataclass(frozen=True)
class Chunked(StagedSchedule):
    """Paper sec. 3.2: contiguous chunks in order; memory crosses only chunk boundaries.

    Where the model allows it (`LRT.exact_split`: C <= the memory's exact chunk), the blocks above
    the source layer run once for all positions after the chunks (`execution.run_chunked`).
    One pass, no init: it does not iterate a sweep (`solver_sweeps` NaN), but its chunks, iterated
    from an init pass, are a block Gauss-Seidel sweep (`sweep`)."""

    C: int = 64

    def __post_init__(self):
        check_int("Chunked.C", self.C, 1)

    def stages(self, T: int) -> list[range]:
        return [range(a, min(a + self.C, T)) for a in range(0, T, self.C)]

    def stage_weights(self, T: int) -> None:
        return None  # one mean over all positions

    @property
    def cost(self) -> float:
        return 1.0

    @property
    def exact(self) -> bool:
        """One position per stage: its parallel forward is exact recurrent decoding."""
        return self.C == 1

    @property
    def family(self) -> str:
        return f"chunked C={self.C}"

    def sweep(self, T: int) -> list[range]:
        return self.stages(T)

    def run(self, model, idx: torch.Tensor, buffer) -> ScheduleRun:
        return _execution().run_chunked(self, model, idx, buffer)


@register_schedule("exact")
@dataclass(frozen=True)
class Exact(Chunked):
    """Exact recurrent training: one position per stage (BPTT through the memory chain)."""

    C: int = field(default=1, init=False)

    @property
    def family(self) -> str:
        return "exact"


@register_schedule("fixedpoint:TOL:MAX[:G]")
@dataclass(frozen=True)
class FixedPoint:
    """Refine until the memory stops changing: an init stage, then full-sequence sweeps (as
    FullSequence) until the memory's largest change between two sweeps is <= tol, or max_sweeps.

    FullSequence(K) is Jacobi iteration on m_t = F(x_<=t, m_<t) (sec. 3.1: after K refinements
    every position has seen exact memory for K steps; at K = T it equals Exact). This schedule
    pays the sweeps the data needs instead of a fixed K. The change after sweep k is

        r_k = max_{b,t} ||m^k_{b,t} - m^{k-1}_{b,t}|| / sqrt(mean_{b,t} ||m^k_{b,t}||^2)

    (relative to the batch's RMS memory norm, so one tol fits raw and normed memory taps).

    Gradient: truncated, like deep-equilibrium "phantom" gradients. Init and the sweeps before the
    last `grad_sweeps` run under no_grad, through the blocks up to the source layer only (all the
    memory needs; `LRT.exact_split`); the last grad_sweeps sweeps run the full stack with
    autograd from the detached memory, so training memory is O(grad_sweeps) stages, not O(sweeps).
    With grad_sweeps >= max_sweeps nothing is truncated: init and every sweep are differentiated
    and the run equals FullSequence(k) for the k sweeps it used (loss and gradients; tested).
    Otherwise the no_grad sweeps stop at convergence or at max_sweeps - grad_sweeps, and exactly
    grad_sweeps differentiated sweeps follow (at a fixed point they re-apply F there).

    Loss: the uniform mean of the differentiated stages' CE (FullSequence's default, so the
    untruncated case is FullSequence(k) exactly; with grad_sweeps=1 it is the final stage's CE).
    The no_grad stages produce no logits and no loss.

    Cost (training-loop accounting, in full-stack forwards over the sequence, as `cost` of the
    static schedules): each differentiated stage 1, each no_grad pass split/n_layer. It depends
    on the data, so it is measured per step (`ScheduleOutput.measured.cost`); `cost` here is
    the upper bound max_sweeps + 1.
    """

    name = "fixedpoint"
    exact = False
    # The stopping rule reads the whole batch's memory: padding the sequence can change how many
    # sweeps run, and so the logits before the padding.
    causal = False
    tol: float = 1e-3
    max_sweeps: int = 8
    grad_sweeps: int = 1

    def __post_init__(self):
        check_number("FixedPoint.tol", self.tol, 0)
        object.__setattr__(self, "tol", float(self.tol))
        check_int("FixedPoint.max_sweeps", self.max_sweeps, 1)
        check_int("FixedPoint.grad_sweeps", self.grad_sweeps, 1)

    def stages(self, T: int) -> list[range]:
        """The most it may run (init + max_sweeps full stages): for validation and FLOP bounds.
        What it does run is in `ScheduleOutput.stages`."""
        return [range(0, T)] * (self.max_sweeps + 1)

    def stage_weights(self, T: int) -> None:
        """None: how many stages carry a loss depends on the data (run() weighs them uniformly)."""
        return None

    @property
    def cost(self) -> float:
        return float(self.max_sweeps + 1)  # upper bound; the measured cost is per step

    @property
    def spec(self) -> str:
        g = f":{self.grad_sweeps}" if self.grad_sweeps != 1 else ""
        return f"fixedpoint:{self.tol:g}:{self.max_sweeps}{g}"

    @property
    def family(self) -> str:
        return f"fixedpoint G={self.grad_sweeps}"

    def sweep(self, T: int) -> list[range]:
        return [range(0, T)]  # FullSequence's Jacobi sweep

    def solver_sweeps(self, T: int, measured=None) -> tuple[float, float]:
        """The sweeps the run took (`measured`, its FixedPointMeasured; it may stop before
        max_sweeps), else max_sweeps; G no more than those."""
        took = getattr(measured, "sweeps", None)
        F = self.max_sweeps if took is None else took
        return float(F), float(min(self.grad_sweeps, F))

    def forwards(self, model, T: int) -> Forwards:
        """The upper bound: init and every sweep differentiated."""
        return Forwards(float(self.max_sweeps + 1))

    def run(self, model, idx: torch.Tensor, buffer) -> ScheduleRun:
        """Drive the stages on idx from `buffer` (empty); see the class docstring."""
        return _execution().run_fixedpoint(self, model, idx, buffer)


@register_schedule("rollout[:G]")
@dataclass(frozen=True)
class Rollout:
    """The exact memory, then G differentiated full-sequence sweeps from it.

    1. Roll the memory out exactly: one position per stage, under inference mode, through the
       blocks that feed m_t only (`LRT.exact_split`), into an in-place cache (the decoder's
       `DecodeCache` keeping every row), so each of the T dependent stages costs what a decoding
       step through those blocks costs.
    2. G full-sequence stages with autograd, the first reading the rolled-out rows (detached), each
       later one the previous stage's memory. The loss is the uniform mean of their CE
       (FixedPoint's convention).

    The final logits are Exact's, and loss and gradients are FixedPoint(0, T+G, G)'s (tested in
    float64): an exact forward whose gradient crosses G-1 memory hops (none with G = 1). It is the
    paper's SFT/RL recipe (sec. "SFT and Reinforcement Learning": rollout states, cached without
    gradients, initialise the recurrent-state buffer for the parallel recomputation) with the
    rollout computed in the step.

    Cost (training-loop accounting, full-stack forwards over the sequence): split/n_layer for the
    rollout (forward only) plus G; measured per step with the rollout's seconds in
    `ScheduleOutput.measured`. `cost` is the upper bound 1 + G.
    """

    name = "rollout"
    exact = False  # exact logits, but through full sweeps over the rolled-out memory
    causal = True  # the rollout and the sweeps compute each position from the ones before it
    grad_sweeps: int = 1

    def __post_init__(self):
        check_int("Rollout.grad_sweeps", self.grad_sweeps, 1)

    def stages(self, T: int) -> list[range]:
        """The differentiated stages (the rollout's one-position stages carry no gradient)."""
        return [range(0, T)] * self.grad_sweeps

    def stage_weights(self, T: int) -> list[float]:
        return [1.0] * self.grad_sweeps

    @property
    def cost(self) -> float:
        return float(self.grad_sweeps + 1)  # upper bound: a rollout through every block

    @property
    def spec(self) -> str:
        return f"rollout:{self.grad_sweeps}"

    @property
    def family(self) -> str:
        return "rollout"

    def sweep(self, T: int) -> list[range]:
        return [range(0, T)]  # the sweeps after the rollout are full-sequence ones

    def solver_sweeps(self, T: int, measured=None) -> tuple[float, float]:
        """Its twin FixedPoint(0, T+G, G): the exact rollout stands for T sweeps, then G."""
        return float(T + self.grad_sweeps), float(self.grad_sweeps)

    def forwards(self, model, T: int) -> Forwards:
        """G differentiated full sweeps, and the rollout without autograd: its share of the
        stack (`exact_split`) over the positions it rolls out (none without a memory)."""
        if model.pathway is None:
            return Forwards(float(self.grad_sweeps))
        split = model.exact_split(1)
        share = (split if split is not None else model.config.n_layer) / model.config.n_layer
        return Forwards(float(self.grad_sweeps), share * rolled_out_positions(model.config, T) / T)

    def run(self, model, idx: torch.Tensor, buffer) -> ScheduleRun:
        """Drive the rollout and the G stages on idx from `buffer` (its memory rows are replaced
        by the rollout's: every row a position reads is computed exactly)."""
        return _execution().run_rollout(self, model, idx, buffer)


def rolled_out_positions(config, T: int) -> int:
    """How many positions Rollout rolls out: every one whose memory a later position of the
    sequence reads, i.e. T - exact_chunk (memory.read_offsets' nearest offset), at least one."""
    return max(1, T - config.memory.exact_chunk)
