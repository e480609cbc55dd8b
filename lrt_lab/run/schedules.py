"""Training schedules and prefill strategies: orders of stages over a shared buffer.

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

Any schedule can start from memory rows the caller supplies (`run_schedule(..., memory=rows)`;
cached rollout states, paper sec. "SFT and Reinforcement Learning"). Each position's final logits
come from the last stage that computed it. In the limit,
Interleaved(S=T) == FullSequence(K=T) == Chunked(1) == Exact == token-by-token decoding; the test
suite holds those equalities in float64.

Every schedule has `stages(T)`, `stage_weights(T)`, `cost`, `spec` and `dynamic`: False when its
stages are known up front (run_schedule runs them), True for FixedPoint and Rollout, whose
`run(model, idx, buffer)` decides them as it goes.

Targets use -1 for positions that do not count (as nanochat does).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from lrt_lab.core.buffer import compute_dtype
from lrt_lab.core.positions import assemble
from lrt_lab.core.hooks import capture
from lrt_lab.core.validation import check_int, check_number, check_targets, check_token_ids, vocab_size_of

IGNORE_INDEX = -1


def _finite_nonnegative(x) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return 0 <= float(x) < float("inf")  # NaN fails both comparisons; float(10**400) overflows
    except OverflowError:
        return False


@dataclass(frozen=True)
class OnePass:
    """The plain transformer's forward; for an LRT, one-pass prefill with zero memory."""

    dynamic: ClassVar[bool] = False

    def stages(self, T: int) -> list[range]:
        return [range(0, T)]

    def stage_weights(self, T: int) -> list[float] | None:
        return [1.0]

    @property
    def cost(self) -> float:
        return 1.0

    @property
    def spec(self) -> str:
        return "onepass"


@dataclass(frozen=True)
class Interleaved:
    """Paper sec. 3.1: an init pass over all positions, then S strided subsets with write-back."""

    dynamic: ClassVar[bool] = False

    S: int = 2

    def __post_init__(self):
        check_int("Interleaved.S", self.S, 1)

    def stages(self, T: int) -> list[range]:
        if self.S > T:
            raise ValueError(f"Interleaved.S={self.S} is invalid for T={T}; allowed: 1 <= S <= T")
        return [range(0, T)] + [range(s, T, self.S) for s in range(self.S)]

    def stage_weights(self, T: int) -> list[float]:
        return [1.0] * (self.S + 1)

    @property
    def cost(self) -> float:
        return 2.0  # one init pass + the S subsets that recompute the sequence once

    @property
    def spec(self) -> str:
        return f"interleaved:{self.S}"


@dataclass(frozen=True)
class FullSequence:
    """Paper sec. 3.1 "Full-sequence refinement for S=1": K synchronous refinements after init."""

    dynamic: ClassVar[bool] = False

    K: int = 1
    weights: tuple[float, ...] | None = None

    def __post_init__(self):
        check_int("FullSequence.K", self.K, 0)
        if self.weights is not None:
            if not isinstance(self.weights, (tuple, list)):
                raise ValueError(f"FullSequence.weights={self.weights!r} is invalid; allowed: "
                                 f"None or a tuple of K+1 = {self.K + 1} non-negative numbers")
            w = tuple(self.weights)
            object.__setattr__(self, "weights", w)
            if len(w) != self.K + 1:
                raise ValueError(f"FullSequence.weights has {len(w)} entries; allowed: exactly "
                                 f"K+1 = {self.K + 1} (init + each refinement)")
            if not all(_finite_nonnegative(x) for x in w) or not 0 < sum(w) < float("inf"):
                raise ValueError(f"FullSequence.weights={w} is invalid; allowed: finite "
                                 "non-negative numbers with a positive (finite) sum")

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


@dataclass(frozen=True)
class Chunked:
    """Paper sec. 3.2: contiguous chunks in order; memory crosses only chunk boundaries."""

    dynamic: ClassVar[bool] = False

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
    def spec(self) -> str:
        return f"chunked:{self.C}"


@dataclass(frozen=True)
class Exact(Chunked):
    """Exact recurrent training: one position per stage (BPTT through the memory chain)."""

    C: int = field(default=1, init=False)

    @property
    def spec(self) -> str:
        return "exact"


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
    on the data, so it is measured per step (`ScheduleOutput.measured["cost"]`); `cost` here is
    the upper bound max_sweeps + 1.
    """

    dynamic: ClassVar[bool] = True  # run() decides its stages as it goes
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

    def run(self, model, idx: torch.Tensor, buffer) -> "DynamicRun":
        """Drive the stages on idx from `buffer` (empty); see the class docstring."""
        T, L = idx.size(1), model.config.n_layer
        full = range(0, T)
        split = model.exact_split(1)
        run = DynamicRun([], [], buffer)
        residuals, per_position = [], []

        def differentiated(buf):
            logits, buf = model.stage(idx, full, buf)
            run.stages.append(full)
            run.stage_logits.append(logits)
            run.cost += 1.0
            return buf

        def memory_only(buf):  # a no_grad pass: only the blocks that feed m_t
            if split is None:
                _, buf = model.stage(idx, full, buf)
            else:
                _, buf = model.stage(idx, full, buf, layers=range(0, split))
            run.cost += (split or L) / L
            return buf

        def sweep(step, buf):  # -> (buffer, converged)
            prev = buf.mem
            buf = step(buf)
            r, rp = memory_change(prev, buf.mem)
            residuals.append(r)
            per_position.append(rp)
            return buf, r <= self.tol

        converged = False
        if self.grad_sweeps >= self.max_sweeps:  # untruncated: FullSequence(k) with a stopping rule
            buffer = differentiated(buffer)
            for _ in range(self.max_sweeps):
                buffer, converged = sweep(differentiated, buffer)
                if converged:
                    break
        else:
            with torch.no_grad():
                buffer = memory_only(buffer)
                while len(residuals) < self.max_sweeps - self.grad_sweeps:
                    buffer, converged = sweep(memory_only, buffer)
                    if converged:
                        break
            for _ in range(self.grad_sweeps):
                buffer, converged = sweep(differentiated, buffer)
        run.buffer = buffer
        run.measured = {"sweeps": len(residuals), "residuals": residuals,
                        "converged": bool(converged), "cost": run.cost,
                        "residual_per_position": torch.stack(per_position)}
        return run


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

    dynamic: ClassVar[bool] = True  # run() drives the rollout and the sweeps itself
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

    def run(self, model, idx: torch.Tensor, buffer) -> "DynamicRun":
        """Drive the rollout and the G stages on idx from `buffer` (its memory rows are replaced
        by the rollout's: every row a position reads is computed exactly)."""
        T, L = idx.size(1), model.config.n_layer
        start = time.perf_counter()
        rows, layers = rollout_memory(model, idx)
        if rows is not None and rows.is_cuda:
            torch.cuda.synchronize(rows.device)  # the rollout's share of the step is measured
        rollout_s = time.perf_counter() - start
        if rows is not None:
            buffer = buffer.with_memory(rows.clone() if rows.is_inference() else rows)
        rollout_cost = len(layers) / L * rows.size(1) / T if rows is not None else 0.0
        run = DynamicRun([], [], buffer, cost=rollout_cost)
        full = range(0, T)
        for _ in range(self.grad_sweeps):
            logits, buffer = model.stage(idx, full, buffer)
            run.stages.append(full)
            run.stage_logits.append(logits)
            run.cost += 1.0
        run.buffer = buffer
        run.measured = {"cost": run.cost, "rollout_cost": rollout_cost, "rollout_s": rollout_s,
                        "grad_sweeps": self.grad_sweeps}
        return run


@torch.inference_mode()
def rollout_memory(model, idx: torch.Tensor) -> tuple[torch.Tensor | None, range]:
    """(m_t for the positions some position reads (B, T - exact_chunk, d), exactly, as an
    inference tensor; the blocks it ran). The last exact_chunk positions' memory is read only
    beyond the sequence, so they are not rolled out (the sweeps that follow compute them).

    One position per stage, no autograd, through the blocks that feed m_t (all blocks when the
    source is the top one), into a `DecodeCache` that keeps every memory row: in-place writes, so
    a stage costs the same at position 1 and at position T. (None, range(0)) for a model without a
    memory pathway (nothing to roll out)."""
    if model.memory is None:
        return None, range(0)
    B, T = idx.shape
    split = model.exact_split(1)
    layers = range(0, split if split is not None else model.config.n_layer)
    ref = next(model.parameters())
    dtype = compute_dtype(idx.device, ref.dtype)
    cache = model.new_decode_cache(B, T, device=idx.device, dtype=dtype, keep_memory=True)
    with launch_bound_threads(idx.device):
        for t in range(rolled_out_positions(model.config, T)):
            tokens = idx[:, t:t + 1]
            cache.append_tokens(tokens)
            model.stage(tokens, range(t, t + 1), cache, layers=layers)
    return cache.memory_rows(), layers


def rolled_out_positions(config, T: int) -> int:
    """How many positions Rollout rolls out: every one whose memory a later position of the
    sequence reads, i.e. T - exact_chunk (memory.read_offsets' nearest offset), at least one."""
    return max(1, T - config.memory.exact_chunk)


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
def memory_change(prev: torch.Tensor | None,
                  new: torch.Tensor | None) -> tuple[float, torch.Tensor]:
    """(r, r_t): the largest change of the memory between two sweeps relative to the batch's RMS
    memory norm (FixedPoint), and per position (T,) the largest over the batch. None is zero
    memory."""
    if new is None:  # no memory pathway: nothing can change
        return 0.0, torch.zeros(0)
    dtype = torch.promote_types(new.dtype, torch.float32)  # bf16 memory measured in fp32, fp64 kept
    new = new.detach().to(dtype)
    prev = torch.zeros_like(new) if prev is None else prev.detach().to(dtype)[:, :new.size(1)]
    change = (new - prev).norm(dim=-1)                               # (B, T)
    scale = new.norm(dim=-1).square().mean().sqrt()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    per_position = (change / scale).amax(dim=0).cpu()
    return float(per_position.max()), per_position


Schedule = OnePass | Interleaved | FullSequence | Chunked | Exact | FixedPoint | Rollout


SCHEDULE_SPELLINGS = ("onepass, interleaved:S, fullseq:K[:w0,w1,...], chunked:C, exact, "
                      "fixedpoint:TOL:MAX[:G], rollout[:G]")


def parse_schedule(spec: str) -> Schedule:
    """`onepass`, `interleaved:S`, `fullseq:K[:w0,w1,...]`, `chunked:C`, `exact`,
    `fixedpoint:TOL:MAX[:G]`, `rollout[:G]` -> a schedule."""
    allowed = SCHEDULE_SPELLINGS
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"schedule={spec!r} is invalid; allowed: {allowed}")
    name, *args = spec.strip().lower().split(":")
    try:
        if name == "onepass" and not args:
            return OnePass()
        if name == "exact" and not args:
            return Exact()
        if name == "interleaved" and len(args) == 1:
            return Interleaved(int(args[0]))
        if name == "chunked" and len(args) == 1:
            return Chunked(int(args[0]))
        if name == "fullseq" and len(args) in (1, 2):
            weights = tuple(float(x) for x in args[1].split(",")) if len(args) == 2 else None
            return FullSequence(int(args[0]), weights)
        if name == "fixedpoint" and len(args) in (2, 3):
            return FixedPoint(float(args[0]), int(args[1]), int(args[2]) if len(args) == 3 else 1)
        if name == "rollout" and len(args) <= 1:
            return Rollout(int(args[0]) if args else 1)
    except ValueError as e:
        raise ValueError(f"schedule={spec!r} is invalid: {e}; allowed: {allowed}") from None
    raise ValueError(f"schedule={spec!r} is invalid; allowed: {allowed}")


@dataclass
class ScheduleOutput:
    logits: torch.Tensor                    # (B, T, V): final logits per position
    loss: torch.Tensor | None               # the schedule's training loss
    stage_losses: list[torch.Tensor]        # one per stage (Chunked/Exact: one, the mean)
    stages: list[range]                     # the position set of each stage
    stage_logits: list[torch.Tensor]        # logits of each stage at its positions
    buffer: object                          # the final SequenceBuffer (prefill hands it on)
    # dynamic schedules: what they measured (FixedPoint: sweeps, residuals, converged, cost;
    # Rollout: cost, rollout_cost, rollout_s, grad_sweeps); None for the static ones
    measured: dict | None = None


@dataclass
class DynamicRun:
    """What a schedule that drives its own stages (`run(model, idx, buffer)`) returns: the stages
    that produced logits (all differentiated, uniformly weighted in the loss), the final buffer,
    the cost it ran (in full-stack forwards) and what it measured."""

    stages: list[range]
    stage_logits: list[torch.Tensor]
    buffer: object
    cost: float = 0.0
    measured: dict = field(default_factory=dict)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean CE over positions whose target is not IGNORE_INDEX (0 when none counts)."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # CE in at least fp32 (bf16 autocast logits)
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                            reduction="sum")
    return total / (targets != IGNORE_INDEX).sum().clamp(min=1)


def _check_inputs(model, idx, targets):
    vocab_size = vocab_size_of(model)
    check_token_ids("idx", idx, vocab_size)
    if idx.size(0) < 1 or idx.size(1) < 1:
        raise ValueError(f"idx is invalid: shape {tuple(idx.shape)}; allowed: at least one "
                         "sequence and one position (B >= 1, T >= 1)")
    if targets is not None:
        check_targets("targets", targets, tuple(idx.shape), vocab_size, IGNORE_INDEX)


def as_schedule(schedule) -> Schedule:
    """A schedule object, or a CLI spelling ("exact", "interleaved:2", ...) parsed by
    parse_schedule: the one resolver every entry point uses."""
    if schedule is None:
        return OnePass()
    if isinstance(schedule, str):
        return parse_schedule(schedule)
    if not isinstance(schedule, (OnePass, Interleaved, FullSequence, Chunked, FixedPoint, Rollout)):
        raise ValueError(f"schedule={schedule!r} is invalid; allowed: OnePass(), Interleaved(S), "
                         "FullSequence(K), Chunked(C), Exact(), FixedPoint(tol, N, G), Rollout(G), "
                         f"or a string: {SCHEDULE_SPELLINGS}")
    return schedule


def _exact_split(model, schedule: Schedule) -> int | None:
    """The block index Exact / Chunked(C <= memory.exact_chunk) may split the stack at
    (`LRT.exact_split`), or None."""
    if not isinstance(schedule, Chunked):
        return None
    return model.exact_split(schedule.C)


def _run_split(model, idx: torch.Tensor, stages: list[range], split: int, buffer):
    """Exact with the blocks above the source layer deferred: blocks [0, split) stage by stage
    (the recurrence), then blocks [split, L) for all positions in one causal stage that
    reads the finished memory m_{t-1}. Same logits as running every block per position (tested);
    the sequential part shrinks to split/L of the blocks."""
    lower, upper = range(0, split), range(split, model.config.n_layer)
    resid = []
    for P in stages:
        x_P, buffer = model.stage(idx[:, P.start:P.stop], P, buffer, layers=lower)
        resid.append(x_P)
    full = range(0, idx.size(1))
    return model.stage(idx, full, buffer, layers=upper, resid=torch.cat(resid, dim=1))


def _run_stages(model, idx, schedule, stages, buffer):
    split = _exact_split(model, schedule)
    if split is not None:
        logits, buffer = _run_split(model, idx, stages, split, buffer)
        return logits, [logits[:, P.start:P.stop] for P in stages], buffer
    stage_logits = []
    for P in stages:
        logits_P, buffer = model.stage(idx[:, P.start:P.stop:P.step], P, buffer)
        stage_logits.append(logits_P)
    return assemble(list(zip(stages, stage_logits)), idx.size(1)), stage_logits, buffer


def run_schedule(model, idx: torch.Tensor, targets: torch.Tensor | None = None,
                 schedule: Schedule | str | None = None, cache: dict | None = None,
                 memory: torch.Tensor | None = None) -> ScheduleOutput:
    """Run `schedule` (default OnePass; a string like "exact" is parsed) on idx (B, T); optionally
    compute its training loss. Token ids and targets are checked against the model's vocabulary.

    cache: a dict that receives every hook point's activation (`hook_embed`, `hook_mem_in`,
    `blocks.{l}.hook_resid_post`, ...; lrt_lab.core.hooks) as a (B, T, ...) tensor taken, like the
    logits, from the last stage that computed each position. To intervene rather than capture, run
    inside `lrt_lab.core.hooks.hooks(model, {...})`.

    memory: memory rows (B, <=T, d) the buffer starts from instead of zeros, e.g. the rows a
    `Decoder(..., keep_memory=True)` produced (`memory_rows()`): the paper's SFT/RL recipe (sec.
    "SFT and Reinforcement Learning"), and a way to score decoded sequences in one parallel pass
    (`FullSequence(0)` from them gives the decoder's logits). Stages read them wherever nothing was
    written yet; schedules that compute every row they read (Exact, Chunked(C <= exact_chunk),
    Rollout) give the same result with or without them.
    """
    _check_inputs(model, idx, targets)
    schedule = as_schedule(schedule)
    memory = _check_memory(model, idx, memory)
    if cache is not None and not isinstance(cache, dict):
        raise ValueError(f"cache={type(cache).__name__} is invalid; allowed: a dict (filled with "
                         "the hooks) or None")
    T = idx.size(1)
    with capture(model) if cache is not None else contextlib.nullcontext() as recorded:
        ran = _execute(model, idx, schedule, memory)
    stages, stage_logits, logits, buffer, weights, measured = ran
    if cache is not None:
        cache.update(recorded.assembled(T))
    loss, stage_losses = None, []
    if targets is not None:
        if weights is None:
            loss = cross_entropy(logits, targets)
            stage_losses = [loss]
        else:
            stage_losses = [cross_entropy(lp, targets[:, P.start:P.stop:P.step])
                            for P, lp in zip(stages, stage_logits)]
            loss = sum(w * l for w, l in zip(weights, stage_losses)) / sum(weights)
    return ScheduleOutput(logits, loss, stage_losses, stages, stage_logits, buffer, measured)


def _check_memory(model, idx: torch.Tensor, memory):
    """The memory rows a run starts from, checked; a normal tensor (an inference tensor from a
    decoder is cloned: autograd cannot save one)."""
    if memory is None:
        return None
    if model.memory is None:
        raise ValueError("memory is invalid for a model without a memory pathway "
                         "(config.memory=None); allowed: None")
    B, T, d = idx.size(0), idx.size(1), model.config.n_embd
    if (not isinstance(memory, torch.Tensor) or memory.dim() != 3 or not memory.is_floating_point()
            or memory.size(0) != B or not 1 <= memory.size(1) <= T or memory.size(2) != d):
        shape = tuple(memory.shape) if isinstance(memory, torch.Tensor) else type(memory).__name__
        raise ValueError(f"memory is invalid: {shape}; allowed: a floating tensor "
                         f"(B={B}, 1..T={T}, d={d}) of memory rows")
    if memory.device != idx.device:
        raise ValueError(f"memory is invalid: on {memory.device}; allowed: the device of idx "
                         f"({idx.device})")
    if not bool(torch.isfinite(memory).all()):
        raise ValueError("memory is invalid: it holds NaN or inf; allowed: finite memory rows")
    if memory.is_inference() and not torch.is_inference_mode_enabled():
        memory = memory.clone()
    return memory


def _execute(model, idx, schedule, memory=None):
    """(stages, their logits, final logits, final buffer, loss weights, measurements). A dynamic
    schedule (FixedPoint, Rollout) decides its stages as it goes and runs them itself (`run`);
    its loss is the uniform mean over the stages that returned logits."""
    T = idx.size(1)
    buffer = model.empty_buffer(idx) if memory is None else model.empty_buffer(idx, memory)
    if schedule.dynamic:
        ran = schedule.run(model, idx, buffer)
        logits = assemble(list(zip(ran.stages, ran.stage_logits)), T)
        weights = [1.0] * len(ran.stages)
        return ran.stages, ran.stage_logits, logits, ran.buffer, weights, ran.measured
    stages = schedule.stages(T)
    logits, stage_logits, buffer = _run_stages(model, idx, schedule, stages, buffer)
    return stages, stage_logits, logits, buffer, schedule.stage_weights(T), None
