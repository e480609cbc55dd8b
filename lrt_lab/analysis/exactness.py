"""Passes to exactness: how many sweeps (and how much wall clock) each schedule's sweep needs to
reach exact recurrent decoding on a trained model, and what happens when it is iterated far past
its training depth.

Every schedule solves one recurrence m_t = F(x_<=t, m_<t) (paper sec. 3): a sweep recomputes
every position once, in some order, against the shared buffer, starting from the init pass (sweep
0, zero memory). A schedule is named by its registry spelling (`lrt_lab.run.registry`), and its
sweep is the one it states (`Schedule.sweep(T)`), iterated here from the init pass:

    fullseq:1       one stage over all positions per sweep (Jacobi: FullSequence's refinements,
                    sec. 3.1; fixedpoint and rollout sweep the same way)
    interleaved:S   Gauss-Seidel over the S strided groups {t : t % S == g} in order
                    (Interleaved(S) is one such sweep, sec. 3.1; GaussSeidel(S, N) is N)
    chunked:C       contiguous chunks of C positions in order (Chunked's stages, sec. 3.2,
                    iterated from the init pass: block Gauss-Seidel with Jacobi inside each block)

The earlier spellings `jacobi`, `gs:S` and `chunks:C` still read, with a DeprecationWarning that
names the spec they stand for (`LEGACY`); so do tables stored with an `ordering` column.

With lag 1, every sweep makes at least one more position exact (Jacobi: position t after t
sweeps; interleaved:S: the positions below n*S after n sweeps), so every sweep is exact after T
sweeps at the latest; the question is how much sooner the error is negligible, and whether it
falls steadily on the way (a contracting map) or first grows (an expanding one:
lrt_lab.run.contraction_monitor).

`exactness_trace` records, after each sweep: the largest |log p - log p_exact| over the batch
(logit_error, nats), the memory's relative error (as in the convergence analysis), the loss and
its gap to exact decoding's, and the sweep's wall clock. A sweep that leaves the buffer exactly as
it found it has reached a fixed point of a deterministic map; the sweeps after it would repeat it,
so they are not run: the table's last row (`repeated`) stands for all of them, at max_sweeps.
"""

from __future__ import annotations

import math
import time
import warnings

import pandas as pd
import torch

from lrt_lab.analysis.loading import as_run, eval_batch, load_model, load_task
from lrt_lab.core.loss import IGNORE_INDEX, cross_entropy
from lrt_lab.run.execution import run_stages
from lrt_lab.run.registry import as_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Exact

LOGIT_TOL = 1e-3  # nats: log-probabilities this close to exact decoding's count as exact
LOSS_EPS = 1e-3  # nats per token: a loss this close to exact decoding's counts as reached
# The spellings this analysis had before it read schedule specs: name -> the spec they stand for.
LEGACY = {"jacobi": "fullseq:1", "gs": "interleaved:{}", "chunks": "chunked:{}"}


def sweep_spec(spec: str) -> str:
    """The canonical schedule spec of `spec`, an earlier spelling (`jacobi`, `gs:S`, `chunks:C`)
    translated with a DeprecationWarning that names the spec to write instead."""
    if not isinstance(spec, str):
        raise ValueError(f"schedule={spec!r} is invalid; allowed: a schedule spec (fullseq:1)")
    name, _, arg = spec.strip().partition(":")
    if name in LEGACY and (name == "jacobi") == (not arg):
        new = LEGACY[name].format(arg)
        warnings.warn(
            f"schedule {spec!r} is an earlier spelling; write {new!r}",
            DeprecationWarning,
            stacklevel=3,
        )
        spec = new
    return as_schedule(spec).spec


def sweep_stages(spec: str, T: int) -> list[range]:
    """The stages of one sweep of schedule `spec` (a registry spelling) over T positions."""
    schedule = as_schedule(sweep_spec(spec))
    try:
        return schedule.sweep(T)
    except ValueError as e:
        raise ValueError(f"schedule={spec!r} is invalid for T={T}: {e}") from None


def default_sweep_schedules(T: int) -> list[str]:
    """Jacobi (fullseq:1), Gauss-Seidel over S = 2, 4, 8, 16 strided groups (interleaved:S) and
    chunks of T/8 and T/2 (chunked:C)."""
    gs = [f"interleaved:{S}" for S in (2, 4, 8, 16) if S < T]
    chunks = sorted({f"chunked:{C}" for C in (max(T // 8, 2), max(T // 2, 2)) if C < T})
    return ["fullseq:1", *gs, *chunks]


def _by_schedule(trace: pd.DataFrame) -> pd.DataFrame:
    """A trace with its `schedule` column: tables stored before it named it `ordering`."""
    if "schedule" not in trace.columns and "ordering" in trace.columns:
        return trace.rename(columns={"ordering": "schedule"})
    return trace


def _same_state(a, b) -> bool:
    tensors = [(a.mem, b.mem), *zip(a.k, b.k), *zip(a.v, b.v)]
    return all(
        x is y or (x is not None and y is not None and torch.equal(x, y)) for x, y in tensors
    )


@torch.no_grad()
def exactness_trace(
    model,
    inputs: torch.Tensor,
    targets: torch.Tensor | None,
    schedule: str,
    max_sweeps: int,
) -> pd.DataFrame:
    """Tidy table (schedule, sweep, stages, logit_error, memory_error, loss, loss_gap, wall_s,
    repeated) of `max_sweeps` sweeps of `schedule`'s sweep (a spec) on `inputs` (B, T) after the
    init pass (sweep 0). wall_s: the cumulative wall clock of the stages run so far (the init pass
    included; the error measurements excluded)."""
    if model.config.memory is None:
        raise ValueError(
            "model is invalid; allowed: an LRT with a memory pathway (config.memory set)"
        )
    if not isinstance(max_sweeps, int) or max_sweeps < 1:
        raise ValueError(f"max_sweeps={max_sweeps!r} is invalid; allowed: an integer >= 1")
    was_training = model.training
    model.eval()
    try:
        return _trace(model, inputs, targets, schedule, max_sweeps)
    finally:
        model.train(was_training)


def _trace(model, x, y, schedule, max_sweeps) -> pd.DataFrame:
    T = x.size(1)
    spec = sweep_spec(schedule)
    stages = sweep_stages(spec, T)
    exact = run_schedule(model, x, None, Exact())
    ref_logp, m_star = exact.logits.double().log_softmax(-1), exact.buffer.mem.double()
    scale = m_star.norm(dim=-1).square().mean().sqrt().clamp(min=1e-30)
    exact_loss = float(cross_entropy(exact.logits, y)) if y is not None else math.nan

    def measure(logits, buffer, sweep, wall, repeated=False):
        diff = (logits.double().log_softmax(-1) - ref_logp).abs()
        loss = float(cross_entropy(logits, y)) if y is not None else math.nan
        return {
            "schedule": spec,
            "sweep": sweep,
            "stages": len(stages),
            "logit_error": float(diff.max()),
            "memory_error": float((buffer.mem.double() - m_star).norm(dim=-1).max() / scale),
            "loss": loss,
            "loss_gap": loss - exact_loss,
            "wall_s": wall,
            "repeated": repeated,
        }

    start = time.perf_counter()
    logits, buffer = model.stage(x, range(0, T), model.empty_buffer(x))
    wall = time.perf_counter() - start
    rows = [measure(logits, buffer, 0, wall)]
    for sweep in range(1, max_sweeps + 1):
        start = time.perf_counter()
        before = buffer
        outs, buffer = run_stages(model, x, stages, buffer)  # the schedules' own stage loop
        wall += time.perf_counter() - start
        logits = logits.clone()
        for P, out in zip(stages, outs):
            logits[:, P.start : P.stop : P.step] = out
        rows.append(measure(logits, buffer, sweep, wall))
        if _same_state(before, buffer):  # a fixed point: every later sweep repeats this one
            if sweep < max_sweeps:  # one row for every later sweep: they equal this one
                rows.append(dict(rows[-1], sweep=max_sweeps, repeated=True))
            break
    return pd.DataFrame(rows)


def _first(sub: pd.DataFrame, ok: pd.Series) -> tuple[float, float]:
    hit = sub[ok]
    if hit.empty:
        return math.nan, math.nan
    return float(hit["sweep"].iloc[0]), float(hit["wall_s"].iloc[0])


def behaviour(sub: pd.DataFrame, at: int, tol: float = LOGIT_TOL) -> str:
    """What iterating to sweep `at` did: "exact" (within tol of exact decoding), "diverged" (not
    finite, or the error at `at` is over 10x the smallest error before it: it grew again),
    "plateau" otherwise (not within tol, not growing). "" when the trace stops before `at`."""
    fixed, sub = sub[sub["repeated"]], sub[~sub["repeated"]].sort_values("sweep")
    found = int(sub["sweep"].max()) if len(sub) else -1  # the fixed point's sweep, if `fixed`
    if not (len(fixed) and found <= at <= int(fixed["sweep"].iloc[0])):
        sub = sub[sub["sweep"] <= at]  # else sweep `at` is the fixed point's row, the last one
        if sub.empty or int(sub["sweep"].max()) < at:
            return ""
    err = float(sub["logit_error"].iloc[-1])
    if not math.isfinite(err):
        return "diverged"
    if err <= tol:
        return "exact"
    best = float(sub["logit_error"].iloc[:-1].min()) if len(sub) > 1 else err
    return "diverged" if err > 10 * best else "plateau"


def passes_to_exactness(
    trace: pd.DataFrame,
    logit_tol: float = LOGIT_TOL,
    loss_eps: float = LOSS_EPS,
    at: tuple[int, ...] = (30, 1000),
) -> pd.DataFrame:
    """Per schedule: the first sweep (and its cumulative wall clock) at which (a) the logits are
    within logit_tol nats of exact decoding's everywhere and (b) the loss within loss_eps of
    exact decoding's (NaN: not within the trace), and the behaviour at each sweep count in `at`."""
    rows = []
    for schedule, sub in _by_schedule(trace).groupby("schedule", sort=False):
        sub = sub.sort_values("sweep")
        sweeps_logits, wall_logits = _first(sub, sub["logit_error"] <= logit_tol)
        sweeps_loss, wall_loss = _first(sub, sub["loss_gap"].abs() <= loss_eps)
        row = {
            "schedule": schedule,
            "stages_per_sweep": int(sub["stages"].iloc[0]),
            "sweeps_to_logits": sweeps_logits,
            "wall_s_to_logits": wall_logits,
            "sweeps_to_loss": sweeps_loss,
            "wall_s_to_loss": wall_loss,
        }
        row.update({f"at_{k}": behaviour(sub, k, logit_tol) for k in at})
        rows.append(row)
    return pd.DataFrame(rows)


def plot_exactness(trace: pd.DataFrame, title: str | None = None, logit_tol: float = LOGIT_TOL):
    """Left: logit error against sweeps, one line per schedule (log-log; sweep 0 drawn at 0.5).
    Right: the same against cumulative wall clock."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    floor = 1e-12
    for schedule, sub in _by_schedule(trace).groupby("schedule", sort=False):
        sub = sub[~sub["repeated"]].sort_values("sweep")
        err = sub["logit_error"].clip(lower=floor)
        a.loglog(sub["sweep"].clip(lower=0.5), err, "o-", ms=2.5, label=schedule)
        b.loglog(sub["wall_s"], err, "o-", ms=2.5, label=schedule)
    for ax in (a, b):
        ax.axhline(logit_tol, color="grey", lw=0.7, ls=":")
        ax.set_ylabel("max |log p - log p_exact| (nats)")
    a.set(xlabel="sweeps (0 = init pass)", title="error against passes")
    b.set(xlabel="wall clock (s, cumulative)", title="error against time")
    a.legend(fontsize=7, ncol=2)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def exactness_run(
    run,
    schedules: list[str] | None = None,
    max_sweeps: int = 30,
    n_sequences: int = 16,
    length: int | None = None,
    write: bool = True,
    eval_seed: int = 1,
) -> pd.DataFrame:
    """exactness_trace of each schedule's sweep (specs) on a trained run (latest checkpoint) and a
    held-out batch of its task; writes tables/exactness.csv into the run when write=True (at
    another length than the training length: tables/exactness_L<T>.csv)."""
    run = as_run(run)
    model = load_model(run)
    T = length or run.config["train"]["length"]
    batch = eval_batch(load_task(run), T, n_sequences, seed=eval_seed)
    targets = batch.targets
    if getattr(batch, "loss_mask", None) is not None:  # as the training loop masks them
        targets = targets.masked_fill(~batch.loss_mask.bool(), IGNORE_INDEX)
    schedules = [sweep_spec(s) for s in schedules or default_sweep_schedules(T)]
    for s in schedules:  # every spelling checked before any sweep runs
        sweep_stages(s, T)
    table = pd.concat(
        [exactness_trace(model, batch.inputs, targets, s, max_sweeps) for s in schedules],
        ignore_index=True,
    )
    table.insert(0, "run", run.name)
    if write:
        run.write_table(table_name("exactness", run, T), table)
    return table


def table_name(stem: str, run, T: int) -> str:
    """`stem` at the run's training length, `stem_L<T>` at another (tables and figures)."""
    return stem if T == run.config["train"]["length"] else f"{stem}_L{T}"
