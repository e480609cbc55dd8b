"""BPB of a run or a model under its training schedule and under exact decoding, per stage: what
the gap analysis (`lrt_results.gap`, torch-free tables the dashboard reads) is computed from.

`evaluate_bpb` writes a run's tables/bpb.csv; `collect_bpb` gathers them (computing what is
missing where a checkpoint allows); `analyze_gap` computes and writes a store's gap tables.
"""

from __future__ import annotations

import math
import warnings

import pandas as pd
import torch
import torch.nn.functional as F

from lrt_lab.analysis.loading import as_run, load_model, load_task, write_store_table
from lrt_lab.analysis.loading import eval_batch as make_eval_batch
from lrt_lab.core.loss import IGNORE_INDEX
from lrt_lab.core.model import LanguageModel
from lrt_lab.core.plugins import provided
from lrt_lab.run.registry import as_schedule
from lrt_lab.run.runner import run_schedule
from lrt_lab.run.schedules import Exact
from lrt_lab.store.bpb_table import read_bpb
from lrt_lab.store.results import Run, load_runs, load_table

LN2 = math.log(2)


def _ce_sum(logits, targets) -> tuple[float, int]:
    flat = targets.reshape(-1)
    total = F.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)),
        flat,
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return float(total), int((flat != IGNORE_INDEX).sum())


def bpb_of(model, inputs, targets, schedule, chunk: int = 64, bytes_per_token: float = 1.0) -> dict:
    """Validation BPB of `model` on (inputs, targets) under `schedule`: the final logits, and the
    logits assembled after each stage (later stages win; positions no stage has reached yet are
    left out, so `stage_coverage` says which fraction of positions a stage's figure covers).

    targets use IGNORE_INDEX (-1) for positions that do not count. BPB = nats / ln 2 / bytes per
    token (1 for byte-level tokens, where this is bits per token)."""
    with torch.no_grad():
        return _bpb_of(model, inputs, targets, schedule, chunk, bytes_per_token)


def _bpb_of(model, inputs, targets, schedule, chunk: int, bytes_per_token: float) -> dict:
    schedule = as_schedule(schedule)
    T = inputs.size(1)
    stages = schedule.stages(T)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    final = [0.0, 0]
    per_stage = [[0.0, 0] for _ in stages]
    coverage = []
    covered = torch.zeros(T, dtype=torch.bool)
    for P in stages:
        covered[P.start : P.stop : P.step] = True
        coverage.append(float(covered.float().mean()))
    for i in range(0, inputs.size(0), chunk):
        x, y = inputs[i : i + chunk].to(device), targets[i : i + chunk].to(device)
        out = run_schedule(model, x, None, schedule)
        s, n = _ce_sum(out.logits, y)
        final[0] += s
        final[1] += n
        cur = torch.zeros_like(out.logits)
        seen = torch.zeros(T, dtype=torch.bool, device=device)
        for k, (P, lp) in enumerate(zip(out.stages, out.stage_logits)):
            cur[:, P.start : P.stop : P.step] = lp
            seen[P.start : P.stop : P.step] = True
            s, n = _ce_sum(cur, y.masked_fill(~seen[None, :], IGNORE_INDEX))
            per_stage[k][0] += s
            per_stage[k][1] += n
    model.train(was_training)
    to_bpb = lambda s, n: s / n / LN2 / bytes_per_token if n else math.nan
    return {
        "bpb": to_bpb(*final),
        "n_tokens": final[1],
        "stages": [to_bpb(*p) for p in per_stage],
        "stage_coverage": coverage,
    }


def evaluate_bpb(
    run_or_model,
    schedule=None,
    eval_batch=None,
    n_sequences: int = 256,
    length: int | None = None,
    chunk: int = 64,
    write: bool = True,
    bytes_per_token: float = 1.0,
) -> dict:
    """Validation BPB with the training schedule's parallel forward, with exact decoding, and after
    each stage of the schedule.

    run_or_model: a Run / run folder / load_runs row (model from its latest checkpoint, schedule
    from its config, eval batch = `n_sequences` held-out sequences of its task at its length), or
    an LRT (then pass `schedule` and `eval_batch`).
    eval_batch: an object with .inputs, .targets (and optional .loss_mask), or (inputs, targets).
    Returns {"parallel", "exact", "stages", "stage_coverage", "n_tokens", "schedule"}; for a run
    with write=True also tables/bpb.csv (columns mode, stage, coverage, bpb, n_tokens, schedule).
    Exact decoding is the Exact schedule, which the core tests hold equal to the Decoder.
    """

    run = None
    if isinstance(run_or_model, LanguageModel):  # a model of any kind, not a run
        model = run_or_model
        if eval_batch is None:
            raise ValueError("eval_batch: required when a model (not a run) is given")
    else:
        run = as_run(run_or_model)
        model = load_model(run)
        if schedule is None:
            schedule = run.config["schedule"]
        if eval_batch is None:
            eval_batch = make_eval_batch(
                load_task(run), length or run.config["train"]["length"], n_sequences
            )
    schedule = as_schedule(schedule)
    inputs, targets = _inputs_targets(eval_batch)
    par = bpb_of(model, inputs, targets, schedule, chunk, bytes_per_token)
    if not model.config.is_lrt or schedule.exact:
        exact = par["bpb"]  # no memory, or the schedule already is exact recurrence
    else:
        exact = bpb_of(model, inputs, targets, Exact(), chunk, bytes_per_token)["bpb"]
    result = {
        "parallel": par["bpb"],
        "exact": exact,
        "stages": par["stages"],
        "stage_coverage": par["stage_coverage"],
        "n_tokens": par["n_tokens"],
        "schedule": schedule.spec,
    }
    if run is not None and write:
        run.write_table("bpb", bpb_table(result))
    return result


def _inputs_targets(batch):
    if isinstance(batch, (tuple, list)) and len(batch) >= 2 and not hasattr(batch, "inputs"):
        inputs, targets = batch[0], batch[1]
        mask = batch[2] if len(batch) > 2 else None
    elif hasattr(batch, "inputs") and hasattr(batch, "targets"):
        inputs, targets, mask = batch.inputs, batch.targets, getattr(batch, "loss_mask", None)
    else:
        raise ValueError(
            "eval_batch is invalid; allowed: an object with .inputs and .targets (a task Batch) "
            "or a tuple (inputs, targets[, loss_mask])"
        )
    if mask is not None:
        targets = targets.masked_fill(~mask.bool(), IGNORE_INDEX)
    return inputs, targets


def bpb_table(result: dict) -> pd.DataFrame:
    rows = [
        {"mode": "parallel", "stage": None, "coverage": 1.0, "bpb": result["parallel"]},
        {"mode": "exact", "stage": None, "coverage": 1.0, "bpb": result["exact"]},
    ]
    for k, (b, c) in enumerate(zip(result["stages"], result["stage_coverage"])):
        rows.append({"mode": "stage", "stage": k, "coverage": c, "bpb": b})
    df = pd.DataFrame(rows)
    df["n_tokens"] = result["n_tokens"]
    df["schedule"] = result["schedule"]
    return df


def collect_bpb(df: pd.DataFrame, compute: bool = False, **kw) -> pd.DataFrame:
    """df (load_runs) with columns bpb.parallel, bpb.exact and bpb.stage.<k> from each run's
    tables/bpb.csv (`read_bpb`); with compute=True, runs without that table are evaluated
    (evaluate_bpb, with kw) first, where a checkpoint allows."""
    no_checkpoint = []
    for _, row in df.iterrows():
        if not compute or load_table(row, "bpb") is not None:
            continue
        if Run(row["path"]).latest_checkpoint() is None:
            no_checkpoint.append(row["run"])  # e.g. a committed store, checkpoints left out
        else:
            evaluate_bpb(row, **kw)
    if no_checkpoint:
        warnings.warn(
            f"{len(no_checkpoint)} run(s) have neither tables/bpb.csv nor a checkpoint "
            f"to compute it from and are left without BPB: {', '.join(no_checkpoint)}",
            stacklevel=2,
        )
    df = read_bpb(df)
    df.attrs["no_bpb"] = no_checkpoint
    return df


def analyze_gap(
    store, compute: bool = True, write: bool = True, metric: str = "bpb.exact", **kw
) -> dict:
    """load_runs(store) -> BPB per run (computed and written where missing), then gap recovery,
    mismatch and refinement tables, written to <store>/.analysis/tables/{gap_recovery,
    gap_recovery_per_seed, mismatch, refinement}.csv. Returns {name: DataFrame}."""
    df = collect_bpb(load_runs(store), compute=compute, **kw)
    if metric not in df.columns:
        raise ValueError(
            f"metric={metric!r}: no run in {str(store)!r} has it (BPB needs tables/bpb.csv or a "
            "checkpoint to compute it from)"
        )
    df = df[df[metric].notna()]  # runs of other tasks in the same store (no BPB) are not part of it
    tables = provided("gap_tables")(df, metric)  # the statistics: lrt_results.gap
    if write:
        for name, t in tables.items():
            write_store_table(store, name, t)
    return tables
