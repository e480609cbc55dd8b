"""How sequential is a learned recurrence? Fixed-point (Jacobi) sweeps on a trained model.

FullSequence(K) / FixedPoint iterate m^k = F(x, m^{k-1}) from the init pass's memory m^0 (paper
sec. 3.1). With lag 1, position t is exact after t sweeps whatever the weights (Jacobi on a
triangular system), so "sweeps needed at position t" = t means a fully sequential recurrence;
a curve that flattens at s << t means the memory only carries about s steps of sequential
dependence, and FixedPoint with that tolerance pays ~s sweeps instead of T.

`convergence_trace` records, per sweep k and position t (the largest over the batch):
    residual  ||m^k_t - m^{k-1}_t|| / RMS ||m^k||      what FixedPoint's stopping rule sees
    error     ||m^k_t - m*_t|| / RMS ||m*||            distance to the exact memory m* (Exact)
    loss      mean CE of sweep k's logits (when targets are given), with the Exact loss for scale
Tidy tables, a plot, and `convergence_run` for a run in the store (tables/convergence.csv).
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from lrt_lab.analysis.loading import as_run, eval_batch, load_model, load_task
from lrt_lab.core.loss import IGNORE_INDEX, cross_entropy
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Exact


class _BatchMax:
    """Per sweep and position: the largest ||diff|| over the batch, and the batch's mean squared
    memory norm, accumulated over chunks so the relative figure does not depend on the chunking."""

    def __init__(self, K: int, T: int):
        self.top = torch.zeros(K + 1, T, dtype=torch.float64)
        self.sq = torch.zeros(K + 1, dtype=torch.float64)

    def add(self, k: int, diff: torch.Tensor, ref: torch.Tensor):
        self.top[k] = torch.maximum(self.top[k], diff.double().norm(dim=-1).amax(dim=0).cpu())
        self.sq[k] += ref.double().norm(dim=-1).square().sum().cpu()

    def relative(self, count: int) -> torch.Tensor:
        scale = (self.sq / count).sqrt()
        return self.top / torch.where(scale > 0, scale, torch.ones_like(scale))[:, None]


@torch.no_grad()
def convergence_trace(
    model,
    inputs: torch.Tensor,
    targets: torch.Tensor | None = None,
    max_sweeps: int | None = None,
    chunk: int = 256,
) -> pd.DataFrame:
    """Tidy table (sweep, position, residual, error[, loss, exact_loss]) of plain full-sequence
    sweeps on `inputs` (B, T); sweep 0 is the init pass (its residual is its change from zero
    memory). max_sweeps: default T (enough to reach the exact memory with lag 1). Per position,
    the largest value over the batch, relative to the whole batch's RMS memory norm (the scale
    FixedPoint uses), however the batch is chunked."""
    if model.config.memory is None:
        raise ValueError(
            "model is invalid; allowed: an LRT with a memory pathway (config.memory set)"
        )
    T = inputs.size(1)
    K = T if max_sweeps is None else max_sweeps
    if not isinstance(K, int) or K < 1:
        raise ValueError(f"max_sweeps={max_sweeps!r} is invalid; allowed: an integer >= 1")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    full = range(0, T)
    res, err = _BatchMax(K, T), _BatchMax(K, T)
    ce = [0.0] * (K + 1)
    exact_ce, n_rows = 0.0, 0
    for i in range(0, inputs.size(0), chunk):
        x = inputs[i : i + chunk].to(device)
        exact = run_schedule(model, x, None, Exact())
        m_star = exact.buffer.mem
        buffer, prev = model.empty_buffer(x), None
        w = x.size(0) / inputs.size(0)  # CE: a mean over chunks weighted by sequences
        if targets is not None:
            y = targets[i : i + chunk].to(device)
            exact_ce += w * float(cross_entropy(exact.logits, y))
        for k in range(K + 1):
            logits, buffer = model.stage(x, full, buffer)
            m = buffer.mem
            res.add(k, m - (prev if prev is not None else torch.zeros_like(m)), m)
            err.add(k, m - m_star, m_star)
            if targets is not None:
                ce[k] += w * float(cross_entropy(logits, y))
            prev = m
        n_rows += x.size(0) * T
    model.train(was_training)
    sweeps = torch.arange(K + 1).repeat_interleave(T)
    table = pd.DataFrame(
        {
            "sweep": sweeps.numpy(),
            "position": torch.arange(T).repeat(K + 1).numpy(),
            "residual": res.relative(n_rows).flatten().numpy(),
            "error": err.relative(n_rows).flatten().numpy(),
        }
    )
    if targets is not None:
        table["loss"] = [ce[k] for k in table["sweep"]]
        table["exact_loss"] = exact_ce
    return table


def _settled(values: pd.Series, tol: float) -> float:
    """First sweep from which `values` (ordered by sweep,
    starting at 0) stay <= tol; NaN if never."""
    above = (values.to_numpy() > tol).nonzero()[0]
    if len(above) == 0:
        return 0.0
    last = int(above[-1]) + 1
    return float(last) if last < len(values) else math.nan


def sweeps_to_converge(
    trace: pd.DataFrame, tols=(1e-1, 1e-2, 1e-3), measure: str = "residual"
) -> pd.DataFrame:
    """Per position and tolerance: the sweeps after which `measure` (residual or error) stays
    <= tol (NaN: not within the trace). Rows (tol, position, sweeps); position "all" is the whole
    sequence (the largest change anywhere: what FixedPoint(tol) would stop at, for residual)."""
    if measure not in ("residual", "error"):
        raise ValueError(f"measure={measure!r} is invalid; allowed: residual, error")
    rows = []
    overall = trace.groupby("sweep")[measure].max().sort_index()
    for tol in tols:
        for t, sub in trace.sort_values("sweep").groupby("position"):
            rows.append({"tol": tol, "position": int(t), "sweeps": _settled(sub[measure], tol)})
        rows.append({"tol": tol, "position": "all", "sweeps": _settled(overall, tol)})
    return pd.DataFrame(rows)


def residual_per_sweep(trace: pd.DataFrame) -> pd.DataFrame:
    """(sweep, residual, error[, loss]) over the whole sequence: the largest over positions."""
    cols = {"residual": "max", "error": "max"}
    if "loss" in trace:
        cols.update(loss="first", exact_loss="first")
    return trace.groupby("sweep").agg(cols).reset_index()


def plot_convergence(trace: pd.DataFrame, tols=(1e-1, 1e-2, 1e-3), title: str | None = None):
    """Left: residual and error to the exact memory after each sweep (log scale). Right: sweeps
    needed per position at each tolerance, against the sequential bound (sweeps = position)."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    per = residual_per_sweep(trace)
    floor = 1e-16
    a.semilogy(per["sweep"], per["residual"].clip(lower=floor), "o-", label="residual (change)")
    a.semilogy(per["sweep"], per["error"].clip(lower=floor), "s--", label="error vs exact")
    for tol in tols:
        a.axhline(tol, color="grey", lw=0.6, ls=":")
    a.set(
        xlabel="sweep (0 = init pass)",
        ylabel="max over positions, relative",
        title="memory after each sweep",
    )
    a.legend(fontsize=8)
    need = sweeps_to_converge(trace, tols)
    need = need[need["position"] != "all"]
    for tol, sub in need.groupby("tol"):
        b.plot(sub["position"].astype(int), sub["sweeps"], "o-", ms=3, label=f"tol {tol:g}")
    T = int(trace["position"].max()) + 1
    b.plot(range(T), range(T), color="grey", lw=0.8, ls="--", label="sequential (= position)")
    b.set(xlabel="position", ylabel="sweeps to converge", title="how sequential is the recurrence")
    b.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def convergence_run(
    run,
    n_sequences: int = 128,
    length: int | None = None,
    max_sweeps: int | None = None,
    write: bool = True,
    eval_seed: int = 1,
) -> pd.DataFrame:
    """convergence_trace on a trained run (latest checkpoint) with a held-out batch of its task;
    writes tables/convergence.csv into the run when write=True."""
    run = as_run(run)
    model = load_model(run)
    batch = eval_batch(
        load_task(run), length or run.config["train"]["length"], n_sequences, seed=eval_seed
    )
    targets = batch.targets
    if getattr(batch, "loss_mask", None) is not None:  # as the training loop masks them
        targets = targets.masked_fill(~batch.loss_mask.bool(), IGNORE_INDEX)
    table = convergence_trace(model, batch.inputs, targets, max_sweeps)
    table.insert(0, "run", run.name)
    if write:
        run.write_table("convergence", table)
    return table
