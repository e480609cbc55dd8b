"""How faithful is each trainer's gradient? Against exact BPTT, per parameter group.

A trainer is an iterative solver of m_t = F(x_<=t, m_<t) (paper sec. 3): F forward sweeps bring
the memory towards Exact's, and only the last G of them carry a gradient. For a trained model and
a held-out batch, `gradient_fidelity` compares each schedule's training gradient (the gradient of
its own loss: what the optimizer receives) with Exact's (BPTT through the whole memory chain, on
the same targets), per parameter group:

    cosine      <g, g*> / (|g| |g*|)     direction (1: the same update direction)
    norm_ratio  |g| / |g*|               scale

Groups, by module name (`group_of`): memory (the pathway: `pathway.*`), attention
(`blocks.*.attn.*`), mlp (`blocks.*.mlp.*`), embed_head (`wte`, `value_embeds.*`, `lm_head`);
anything else (the per-layer residual scalars alpha_l, beta_l) is "other", reported but left out
of the pass criterion (`smallest_passing`).

Each schedule is placed in a family with its F (forward sweeps after the init pass) and G
(differentiated sweeps; `sweeps_of`): fixedpoint:0:F:G (G >= F: nothing truncated, the init
differentiated too), fullseq:K (F = G = K, all differentiated), interleaved:S (one sweep, F = G =
1), gaussseidel:S:N:G (F = N), rollout:G (an exact forward: its twin FixedPoint(0, T+G, G), so F =
T + G). The model runs in float64, so the differences are the trainers', not rounding.

Read a checkpoint trained with one of the compared schedules with care: training drove that
schedule's own expected gradient towards zero, so what is left of it is small and mostly not
BPTT's direction. On an A5 model trained 600 steps with interleaved:2, interleaved:2's attention
cosine was 0.14 and interleaved:4's 0.99; at a fresh initialisation of the same model both were
0.88-0.90. Compare at checkpoints of other trainers (or several steps) before ranking trainers.
"""

from __future__ import annotations

import copy
import math
import re

import pandas as pd
import torch

from lrt_lab.analysis.loading import as_run, eval_batch, load_model, load_task
from lrt_lab.core.loss import IGNORE_INDEX
from lrt_lab.run.registry import as_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Exact

GROUPS = ("memory", "attention", "mlp", "embed_head")  # the pass criterion's groups
_PATTERNS = (
    ("memory", r"pathway\."),
    ("attention", r"blocks\.\d+\.attn\."),
    ("mlp", r"blocks\.\d+\.mlp\."),
    ("embed_head", r"(wte|value_embeds\.\d+|lm_head)\."),
)
PASS_COSINE = 0.9


def group_of(name: str) -> str:
    """The group of a parameter by its module path (memory, attention, mlp, embed_head, other)."""
    for group, pattern in _PATTERNS:
        if re.match(pattern, name):
            return group
    return "other"


def sweeps_of(schedule, T: int, measured=None) -> tuple[str, float, float]:
    """(family, F, G) of a schedule on T positions: F forward sweeps after the init pass, G of
    them differentiated (module docstring); NaN where the schedule has no sweeps (Exact,
    Chunked). `measured`: the run's Measured (FixedPoint may stop before max_sweeps). The
    schedule says all three itself (`Schedule.family`, `Schedule.solver_sweeps`)."""
    F, G = schedule.solver_sweeps(T, measured)
    return schedule.family, float(F), float(G)


def default_schedules(T: int) -> list[str]:
    """The families at F = 1, 2, 4, ... below T, and T: fixedpoint with G = 1 and 2, fullseq,
    gaussseidel S=2 (G = 1), interleaved S = 2 and 4, rollout G = 1, 2, 4."""
    if not isinstance(T, int) or T < 2:
        raise ValueError(f"T={T!r} is invalid; allowed: an integer >= 2")
    Fs = sorted({2**i for i in range(T.bit_length()) if 2**i < T} | {T})
    specs = [f"interleaved:{S}" for S in (2, 4) if S <= T]
    for F in Fs:
        specs += [f"fixedpoint:0:{F}", f"fullseq:{F}", f"gaussseidel:2:{F}"]
        specs += [f"fixedpoint:0:{F}:2"] if F >= 2 else []
    return specs + ["rollout:1", "rollout:2", "rollout:4"]


def _group_gradients(model, inputs, targets, schedule, chunk: int):
    """({group: flat gradient of the schedule's loss}, what its last run measured). The loss is
    a mean over chunks weighted by their sequences (one chunk: the schedule's own loss)."""
    names, params = zip(*[(n, p) for n, p in model.named_parameters() if p.requires_grad])
    total = [torch.zeros_like(p) for p in params]
    measured, n = None, inputs.size(0)
    for i in range(0, n, chunk):
        x, y = inputs[i : i + chunk], targets[i : i + chunk]
        out = run_schedule(model, x, y, schedule)
        grads = torch.autograd.grad(out.loss * (x.size(0) / n), params, allow_unused=True)
        for acc, g in zip(total, grads):
            if g is not None:
                acc += g
        measured = out.measured
    flat: dict[str, list[torch.Tensor]] = {}
    for name, g in zip(names, total):
        flat.setdefault(group_of(name), []).append(g.flatten())
    return {group: torch.cat(parts) for group, parts in flat.items()}, measured


def compare(g: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(cosine, norm ratio) of g against ref; NaN where a norm is zero."""
    g_norm, ref_norm = float(g.norm()), float(ref.norm())
    cosine = float(g @ ref) / (g_norm * ref_norm) if g_norm > 0 and ref_norm > 0 else math.nan
    return cosine, g_norm / ref_norm if ref_norm > 0 else math.nan


def gradient_fidelity(
    model,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    schedules,
    chunk: int = 64,
    dtype: torch.dtype | None = torch.float64,
) -> pd.DataFrame:
    """Tidy table (schedule, family, F, G, cost, group, cosine, norm_ratio, norm, exact_norm):
    each schedule's training gradient on (inputs, targets) against Exact's, per parameter group
    (module docstring). `exact` itself may be among the schedules (cosine 1). dtype: the
    precision the comparison runs in (a copy of the model; None: as it is)."""
    schedules = [as_schedule(s) for s in schedules]
    if not schedules:
        raise ValueError("schedules=[] is invalid; allowed: one or more schedules")
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk={chunk!r} is invalid; allowed: an integer >= 1")
    device = next(model.parameters()).device
    model = copy.deepcopy(model).eval()
    if dtype is not None:
        model = model.to(dtype)
    inputs, targets = inputs.to(device), targets.to(device)
    T = inputs.size(1)
    exact, _ = _group_gradients(model, inputs, targets, Exact(), chunk)
    rows = []
    for schedule in schedules:
        grads, measured = _group_gradients(model, inputs, targets, schedule, chunk)
        family, F, G = sweeps_of(schedule, T, measured)
        for group, ref in exact.items():
            cosine, ratio = compare(grads[group], ref)
            rows.append(
                {
                    "schedule": schedule.spec,
                    "family": family,
                    "F": F,
                    "G": G,
                    "cost": measured.cost,
                    "group": group,
                    "cosine": cosine,
                    "norm_ratio": ratio,
                    "norm": float(grads[group].norm()),
                    "exact_norm": float(ref.norm()),
                }
            )
    return pd.DataFrame(rows)


def smallest_passing(
    table: pd.DataFrame, threshold: float = PASS_COSINE, groups=GROUPS
) -> pd.DataFrame:
    """Per family with sweeps (not Exact, Chunked): the smallest F whose cosine is >= threshold
    in every group of `groups` the table has (NaN: none), with its schedule and the worst group's
    cosine there (where none passes, the best F's)."""
    rows = []
    sub = table[table["group"].isin(groups)].dropna(subset=["F"])
    for family, fam in sub.groupby("family", sort=False):
        worst = fam.groupby(["schedule", "F"], sort=False)["cosine"].min().reset_index()
        worst = worst.sort_values("F")
        ok = worst[worst["cosine"] >= threshold]
        first = ok.iloc[0] if len(ok) else None
        rows.append(
            {
                "family": family,
                "F": first["F"] if first is not None else math.nan,
                "schedule": first["schedule"] if first is not None else "",
                "min_cosine": first["cosine"] if first is not None else worst["cosine"].max(),
            }
        )
    return pd.DataFrame(rows)


def plot_gradient_fidelity(table: pd.DataFrame, title: str | None = None, threshold=PASS_COSINE):
    """Cosine against F, one line per family, one panel per parameter group; the pass threshold
    dashed."""
    import matplotlib.pyplot as plt

    groups = [g for g in (*GROUPS, "other") if g in set(table["group"])]
    fig, axes = plt.subplots(1, len(groups), figsize=(3.4 * len(groups), 3.4), squeeze=False)
    swept = table.dropna(subset=["F"])
    markers = "os^vDP*Xh<>"  # families can coincide (interleaved:S is gaussseidel:S:1)
    for ax, group in zip(axes[0], groups):
        for i, (family, fam) in enumerate(
            swept[swept["group"] == group].groupby("family", sort=False)
        ):
            fam = fam.sort_values("F")
            ax.plot(fam["F"], fam["cosine"], marker=markers[i % len(markers)], ms=4, label=family)
        ax.axhline(threshold, color="grey", lw=0.7, ls="--")
        ax.set_xscale("log", base=2)
        ax.set(title=group, xlabel="forward sweeps F", ylim=(min(0.0, ax.get_ylim()[0]), 1.05))
    axes[0][0].set_ylabel("cosine to exact BPTT")
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def gradient_run(
    run,
    schedules=None,
    n_sequences: int = 16,
    length: int | None = None,
    write: bool = True,
    eval_seed: int = 1,
) -> pd.DataFrame:
    """gradient_fidelity on a trained run (latest checkpoint) with `n_sequences` held-out sequences
    of its task (masked as the training loop masks them); schedules default to
    `default_schedules(T)`. Writes tables/gradient_fidelity.csv into the run when write=True."""
    run = as_run(run)
    if not isinstance(n_sequences, int) or n_sequences < 1:
        raise ValueError(f"n_sequences={n_sequences!r} is invalid; allowed: an integer >= 1")
    T = length or run.config["train"]["length"]
    model = load_model(run)
    batch = eval_batch(load_task(run), T, n_sequences, seed=eval_seed)
    targets = batch.targets.masked_fill(~batch.loss_mask.bool(), IGNORE_INDEX)
    table = gradient_fidelity(
        model, batch.inputs, targets, default_schedules(T) if schedules is None else schedules
    )
    table.insert(0, "run", run.name)
    if write:
        run.write_table("gradient_fidelity", table)
    return table
