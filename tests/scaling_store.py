"""A fabricated store of runs trained to tokens-per-parameter budgets (config.json + summary.json
per run, no training), with BPB values on a known power law, for the scaling analysis and the
dashboard's Scaling tab."""

import json
import math
from pathlib import Path

from lrt_lab.store.results import load_runs
from lrt_results.scaling import scaling_points

L = 64
N = 1000  # parameters


def bpb_law(c, e=1.5, a=2.0, alpha=0.5):
    return e + a * c**-alpha


def write_run(
    root: Path,
    kind,
    schedule,
    r,
    seed,
    bpb_exact,
    bpb_parallel=None,
    sha="abc",
    prefix="",
    matrix_lr=0.02,
):
    cost = 2.0 if schedule == "interleaved:2" else 1.0
    name = f"{prefix}{kind}-{schedule}-R{r}-s{seed}".replace(":", "_")
    folder = root / name
    folder.mkdir(parents=True)
    tokens = r * N
    config = {
        "kind": kind,
        "schedule": schedule,
        "params": {"total": N},
        "budget": {"params": N, "tokens_per_param": r, "param_convention": "all"},
        "task_info": {"sha256": sha},
        "model": {"n_layer": 4, "n_embd": 64, "memory": {} if kind == "lrt" else None},
        "train": {
            "task": "text_bytes",
            "task_options": {"corpus": "pylib"},
            "preset": "small",
            "model": kind,
            "schedule": schedule,
            "overrides": {},
            "steps": int(r * N / (16 * L)) + 1,
            "batch_size": 16,
            "length": L,
            "seed": seed,
            "tokens_per_param": r,
            "matrix_lr": matrix_lr,
            "eval_size": 512,
            "name": name,
        },
    }
    ln2 = math.log(2)
    par = bpb_exact if bpb_parallel is None else bpb_parallel
    summary = {
        "status": "complete",
        "final_loss": bpb_exact * math.log(2),
        "tokens": tokens,
        "compute_tokens": tokens * cost,
        "flops": tokens * cost * 6 * N,
        "wall_time_s": tokens * cost / 1e3,
        "eval": {f"ce_exact@{L}": bpb_exact * ln2, f"ce_parallel@{L}": par * ln2},
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "summary.json").write_text(json.dumps(summary))


def build(root: Path, lrt_offset, seeds=(0, 1, 2), lrt_rs=(2.5, 5, 10, 20, 40)):
    """Transformer at R in 5..80 on an exact power law plus a per-seed shift; the LRT at R with
    lrt_offset(R, seed) added to the transformer's value *at the same R* (token-matched)."""
    for seed in seeds:
        shift = 0.01 * seed
        for r in (5, 10, 20, 40, 80):
            write_run(root, "transformer", "onepass", r, seed, bpb_law(r) + shift)
        for r in lrt_rs:
            exact = bpb_law(r) + shift + lrt_offset(r, seed)
            write_run(root, "lrt", "interleaved:2", r, seed, exact, exact + 0.05)
    return scaling_points(load_runs(root))
