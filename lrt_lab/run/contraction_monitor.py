"""The contraction monitor: is the learned recurrence contracting? The largest Lyapunov exponent of
the memory map, and the change between parallel sweeps, logged with every evaluation
(`contraction_record`); `lrt_lab.analysis.contraction` sets them beside the sweeps a stored run's
model needs.

Under exact decoding with lag 1 (paper sec. 2), position t reads m_{t-1} and emits m_t; with the
tokens and the K/V of the positions before t held as exact decoding left them, that is a map
m_t = F_t(m_{t-1}) with Jacobian J_t = dF_t / dm_{t-1}. Its largest Lyapunov exponent

    lambda = lim (1/T) log || J_T ... J_1 v ||

says whether a perturbation of the memory dies out along the data (lambda < 0, contracting) or
grows (lambda > 0, expanding). It governs how fast the parallel solvers' iterations forget the
error of their starting memory (FullSequence's Jacobi sweeps, FixedPoint's stopping rule; sec.
3.1), which is why it is logged beside the per-sweep change.

Estimator: power iteration with renormalisation at every step (Benettin's method), written with
vector-Jacobian products u -> J_t^T u, swept from the last position back to the first: the
transposed product has the same singular values (||P^T|| = ||P||), and reverse mode is what every
operation of the model differentiates (forward-mode rules are missing for some attention kernels).
The per-step log growth is kept, so a curve shows where along the sequence the map contracts.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from lrt_lab.run.execution import memory_change
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Exact

# u -> J_t^T u for the map m_{t-1} -> m_t; u and the result are (N, d)
VJPStep = Callable[[int, torch.Tensor], torch.Tensor]


def lyapunov_exponent(
    vjp_step: VJPStep, T: int, start: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(exponent per start (N,), log growth per step (T - 1, N)) of the product J_{T-1} ... J_1
    for the maps m_{t-1} -> m_t, t = 1 .. T-1, from the starting vectors `start` (N, d), each
    renormalised at every step. Row t-1 of the log growth is step t's.

    A step that maps the vector to zero (a memory reset at a document boundary) has growth -inf
    and restarts the iteration from `start`; the exponent is the mean over the other steps (the
    contraction within documents), NaN if there are none."""
    if T < 2:
        raise ValueError(f"T={T} is invalid; allowed: T >= 2 (a map needs two positions)")
    first = start / start.norm(dim=-1, keepdim=True)
    u = first
    growth = torch.empty(T - 1, start.size(0), dtype=torch.float64)
    for t in range(T - 1, 0, -1):
        w = vjp_step(t, u)
        g = w.norm(dim=-1)
        growth[t - 1] = g.double().log().cpu()
        zero = (g == 0)[:, None]
        u = torch.where(zero, first, w / torch.where(zero, torch.ones_like(w), g[:, None]))
    finite = torch.isfinite(growth)
    exponent = torch.where(finite, growth, 0).sum(0) / finite.sum(0)
    return exponent, growth


def _lower_stack(model) -> range:
    """The blocks that feed m_t (the source blocks and those below): all the map needs."""
    return range(0, max(model.pathway.source_blocks) + 1)


def memory_map_vjp(model, inputs: torch.Tensor, exact_buffer) -> VJPStep:
    """u -> J_t^T u for the map m_{t-1} -> m_t of exact decoding on `inputs` (N, T): position t is
    recomputed alone against `exact_buffer` (what exact decoding wrote: the K/V of the positions
    before t), its memory rows ending in m_{t-1} as a leaf, so the read applies its own rules
    (a reset at a document boundary zeroes the map)."""
    lower = _lower_stack(model)
    mem = exact_buffer.mem.detach()

    def step(t: int, u: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():  # callers may hold no_grad (lyapunov does)
            m_prev = mem[:, t - 1].clone().requires_grad_(True)
            rows = torch.cat([mem[:, : t - 1], m_prev[:, None]], dim=1)
            _, buffer = model.stage(
                inputs[:, t : t + 1], range(t, t + 1), exact_buffer.with_memory_rows(rows), lower
            )
            m_t = buffer.mem[:, t]
            if not m_t.requires_grad:  # the read was zeroed: m_t does not depend on m_(t-1)
                return torch.zeros_like(u)
            (grad,) = torch.autograd.grad(m_t, m_prev, u.to(m_prev.dtype), allow_unused=True)
        return torch.zeros_like(u) if grad is None else grad

    return step


def check_lag_one(model) -> None:
    m = model.config.memory
    if m is None or tuple(m.read_offsets) != (1,):
        raise ValueError(
            "model is invalid for the memory map's Lyapunov exponent; allowed: an LRT whose "
            f"positions read m_(t-1) alone (memory.lag=1, lag_avg=1); got "
            f"{'no memory' if m is None else f'read offsets {tuple(m.read_offsets)}'}"
        )


@torch.no_grad()
def lyapunov(
    model, inputs: torch.Tensor, n_starts: int = 1, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(exponent per start, log growth per step) of the trained model's memory map along each
    sequence of `inputs` (B, T), from `n_starts` random unit vectors per sequence (seeded), in
    nats per position. The model is put in eval mode for the call."""
    check_lag_one(model)
    was_training = model.training
    model.eval()
    try:
        x = inputs.repeat_interleave(n_starts, dim=0).to(next(model.parameters()).device)
        buffer = run_schedule(model, x, None, Exact()).buffer
        gen = torch.Generator().manual_seed(seed)
        start = torch.randn(x.size(0), model.config.n_embd, generator=gen, dtype=torch.float64)
        start = start.to(device=x.device, dtype=buffer.mem.dtype)
        return lyapunov_exponent(memory_map_vjp(model, x, buffer), x.size(1), start)
    finally:
        model.train(was_training)


@torch.no_grad()
def sweep_changes(model, inputs: torch.Tensor, sweeps: int = 4) -> list[float]:
    """The change of the memory made by each of `sweeps` Jacobi sweeps after the init pass
    (FullSequence's refinements, sec. 3.1): per sweep k, max over sequences and positions of
    ||m^k_t - m^(k-1)_t||, relative to the RMS norm of m^k (the scale FixedPoint's stopping rule
    uses)."""
    buffer = model.empty_buffer(inputs)
    full = range(inputs.size(1))
    _, buffer = model.stage(inputs, full, buffer)
    changes = []
    for _ in range(sweeps):
        prev = buffer.mem
        _, buffer = model.stage(inputs, full, buffer)
        changes.append(memory_change(prev, buffer.mem)[0])  # FixedPoint's own measure
    return changes


MONITOR_SEQUENCES = 4  # sequences of the evaluation set the monitor reads
MONITOR_POSITIONS = 64  # positions per sequence (a prefix): its cost grows with T


def contraction_record(model, inputs: torch.Tensor) -> dict:
    """The monitor logged with every evaluation of an LRT whose positions read m_(t-1): "lyap"
    (the memory map's largest Lyapunov exponent, nats per position) and "sweep_change_k" for
    Jacobi sweeps k = 1, 2, 4, on a few sequences' prefix of the evaluation set (a few dozen
    single-position stages: cheap next to exact decoding's evaluation). {} for other models."""
    m = model.config.memory
    if m is None or tuple(m.read_offsets) != (1,) or inputs.size(1) < 2:
        return {}
    was_training = model.training
    model.eval()
    try:
        x = inputs[:MONITOR_SEQUENCES, :MONITOR_POSITIONS].to(next(model.parameters()).device)
        exponent, _ = lyapunov(model, x)
        changes = sweep_changes(model, x, 4)
    finally:
        model.train(was_training)
    finite = exponent[exponent.isfinite()]
    rec = {"lyap": float(finite.mean()) if len(finite) else math.nan}
    rec.update({f"sweep_change_{k}": changes[k - 1] for k in (1, 2, 4)})
    return rec
