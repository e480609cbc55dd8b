"""What the library asks of a model, a schedule and a task, written down once as typing Protocols.

Schedules (`lrt_lab.run.schedules`), the Decoder, the training loop, evaluation, the bench and
scale/ read these members with plain attribute access, so a model that lacks one fails where it is
read instead of being silently treated as something else. `LRT` and the baselines
(`LoopTransformer`, `PonderLM`) define every member; a new model kind implements `SequenceModel` (in
practice by subclassing `LanguageModel`, an `nn.Module`, as the baselines do).
tests/test_baselines.py checks that each built-in model satisfies it.

Tasks live outside lrt_lab (the `lrt_tasks` package, loaded through an entry point; lrt_lab never
imports it), so `Task` only states what the training loop reads from one; `lrt_tasks.Task`, the
base class of every built-in task, provides all of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: importing this module stays free of torch
    import torch
    from torch import nn

    from lrt_lab.core.config import ModelConfig
    from lrt_lab.core.memory import MemoryPathway


@runtime_checkable
class DeclaresParamRoles(Protocol):
    """A module that names the optimizer role of its own parameters (`lrt_lab.training.optim`)."""

    def param_roles(self) -> dict[str, str]:
        """{parameter name pattern relative to the module: role}."""
        ...


@runtime_checkable
class SequenceModel(Protocol):
    """A model the schedules, the Decoder and the training loop can drive.

    Everything is computed by `stage`: recompute positions P against a buffer (docs/design.md).
    Models with a memory pathway (`pathway` not None) also take `stage(..., layers=, resid=)` and
    `empty_buffer(tokens, memory_rows)` / `new_decode_cache(..., keep_memory=True)`; the library
    passes those only when `pathway` is set or `exact_split` returned a block index.
    """

    config: ModelConfig
    # The memory pathway (its `source_blocks` feed m_t), or None for a model without memory.
    pathway: MemoryPathway | None
    # Cost of one training forward in plain-transformer forwards over the sequence: the training
    # loop multiplies a schedule's cost by it (loop:N costs N, ponder more).
    forward_cost: float
    # Forwards of the block stack per generated token at decoding time (loop:N: N, ponder:N: N+1).
    forwards_per_token: int
    # True when the parallel forward only approximates token-by-token decoding (ponder's Jacobi
    # iterations): evaluation then runs the Decoder as well, as it does for the LRT.
    has_sequential_decoding: bool
    # nn.Module's flag and switches: evaluation puts the model in eval mode and restores it
    training: bool

    def stage(self, tokens: torch.Tensor, P: range, buffer) -> tuple[torch.Tensor, Any]:
        """(logits at P, the buffer with P written)."""
        ...

    def empty_buffer(self, tokens: torch.Tensor) -> Any:
        """The buffer a schedule starts from."""
        ...

    def new_decode_cache(self, batch_size: int, max_len: int, device=None, dtype=None) -> Any:
        """The in-place state the Decoder appends to."""
        ...

    def exact_split(self, chunk: int = 1) -> int | None:
        """The 0-based index of the first block Chunked(chunk) / Exact may run for all positions
        at once after the blocks below it ran chunk by chunk, or None (no such split)."""
        ...

    def param_roles(self) -> dict[str, str]:
        """Optimizer roles of the model's own parameters (`lrt_lab.training.optim`)."""
        ...

    def param_report(self) -> dict:
        """Parameter counts for the run's config (total, baseline, added by the memory)."""
        ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...


@dataclass
class Measured:
    """What one run of a schedule measured. Every schedule measures its cost; one whose work
    depends on the data (FixedPoint, Rollout) returns a subclass with what else it saw."""

    cost: float  # full-stack forwards over the sequence this run computed (the loop's accounting)

    def record(self, step_s: float) -> dict:
        """Fields for the training step's metrics line beyond the cost (none here)."""
        return {}


@dataclass
class ScheduleRun:
    """What `Schedule.run` returns: the stages that produced logits, their logits at their
    positions, the loss weight of each (None: one mean over the final logits), the final buffer
    and what the run measured; `logits` when the run formed the final (B, T, V) logits in one
    piece itself (else each position's come from the last stage that computed it)."""

    stages: list[range]
    stage_logits: list[torch.Tensor]
    weights: list[float] | None
    buffer: object
    measured: Measured
    logits: torch.Tensor | None = None


class Forwards(NamedTuple):
    """Full-stack forwards per token of one training step."""

    differentiated: float  # with autograd (a backward follows)
    inference: float = 0.0  # without (Rollout's rollout)


@runtime_checkable
class Schedule(Protocol):
    """A way to run the stages: an order of stages over one buffer, to train with or to prefill
    with (`lrt_lab.run.schedules`).

    `run_schedule` resolves a spelling through the registry (`lrt_lab.run.registry`), makes the
    model's empty buffer, calls `run`, assembles each position's final logits from the last stage
    that computed it and forms the loss with the weights `run` returned. The analyses and the
    evaluation ask a schedule what it is through these members (`sweep`, `solver_sweeps`,
    `family`, `causal`), never by its class. Any object with these members runs; deriving from
    `lrt_lab.run.schedules.StagedSchedule` gives all of them but `stages` and `cost`
    (docs/extending.md, "Add a schedule").
    """

    @property
    def spec(self) -> str:
        """Its spelling: `parse_schedule(spec)` gives an equal schedule."""
        ...

    @property
    def cost(self) -> float:
        """Full-stack forwards over the sequence one step runs (the training loop's compute
        axis); an upper bound where the data decides, the run measuring what it ran."""
        ...

    @property
    def exact(self) -> bool:
        """Whether it computes one position per stage, so its forward is exact recurrent
        decoding (an analysis then need not decode again)."""
        ...

    @property
    def causal(self) -> bool:
        """Whether a position's logits depend on the tokens up to it only, so a right-padded
        sequence gives the same logits before the padding (evaluation pads to bucketed shapes
        only then)."""
        ...

    @property
    def family(self) -> str:
        """Its name with the number of sweeps left out (`gaussseidel S=2 G=1`, `fullseq`): the
        schedules that differ only in how often they iterate, one curve of an analysis."""
        ...

    def sweep(self, T: int) -> list[range]:
        """The stages of one sweep of its iteration over T positions: every position once, in
        the order it recomputes them after the init pass (Jacobi `[range(0, T)]`, Interleaved's
        strided groups, Chunked's chunks); ValueError for a schedule that iterates none."""
        ...

    def solver_sweeps(self, T: int, measured: Measured | None = None) -> tuple[float, float]:
        """(F, G) as a solver of m_t = F(x_<=t, m_<t) on T positions: the forward sweeps after
        the init pass, and how many of them carry a gradient; NaN for one that does not iterate
        (OnePass, Chunked, Exact). `measured`: what its run measured, where the data decides."""
        ...

    def stages(self, T: int) -> list[range]:
        """Its stages' position sets for T positions (where the data decides: the most it may
        run); ValueError for a T it cannot run."""
        ...

    def stage_weights(self, T: int) -> list[float] | None:
        """The loss weight of each stage of stages(T); None: one mean over the final logits, or
        stages the data decides."""
        ...

    def run(self, model: SequenceModel, idx: torch.Tensor, buffer) -> ScheduleRun:
        """Run the stages on idx from `buffer` (the model's empty buffer)."""
        ...

    def forwards(self, model: SequenceModel, T: int) -> Forwards:
        """Full-stack forwards per token of one step, with autograd and without: the input of
        FLOP accounting (lrt_scale.flops)."""
        ...


@runtime_checkable
class Task(Protocol):
    """What the training loop reads from a task (`lrt_tasks.Task` provides all of it).

    `length_at(step)` is the training length at a step: a curriculum's, or `length` for a task
    without one; every built-in task has it through the base class, so the loop calls it directly.
    """

    name: str
    length: int  # the training length (a curriculum's end)
    min_length: int  # the shortest sequence the task can make
    vocab_size: int

    def length_at(self, step: int) -> int: ...

    def sample(self, batch_size: int, generator, length: int | None = None) -> Any:
        """A Batch (inputs, targets, loss_mask, state) of `length` positions."""
        ...
