"""The device a run trains on and whether it fits there, checked before anything is written."""

from __future__ import annotations

import os

import torch

from lrt_lab.core.config import ModelConfig
from lrt_lab.core.validation import fail
from lrt_lab.run.evaluation import EVAL_CHUNK


def resolve_device(name: str) -> torch.device:
    """ "auto": CUDA when available, else the CPU; otherwise the named device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def memory_estimate(cfg, config: ModelConfig, schedule) -> dict[str, float]:
    """Bytes of the largest things a run allocates (a rough upper bound, float32): training keeps
    ~20 d floats per token and layer for the backward (residuals, q/k/v, attention and MLP
    activations) for every stage, the logits and their gradient, and one layer's attention
    scores B x heads x T x T at a time where a kernel materialises them; evaluation runs
    EVAL_CHUNK sequences at the longest evaluation length (and a decoding cache for them). The
    evaluation sets are built whole before training and kept in host memory throughout (eval_sets:
    eval_size sequences of each evaluation length, plus the longest one they are cut from, four
    int64-sized fields per token and as much again while sampling)."""
    d, L, V, H = config.n_embd, config.n_layer, config.vocab_size, config.n_head
    stages = max(1.0, float(schedule.cost))
    B, T = cfg.batch_size, cfg.length
    train = 4 * B * T * (20 * d * L + 3 * V) * stages + 4 * B * H * T * T + T * T
    n, T_eval = min(cfg.eval_size, EVAL_CHUNK), max(cfg.eval_lengths)
    evaluation = (
        4 * n * T_eval * (4 * d * L + 2 * V) + 4 * n * H * T_eval * T_eval + T_eval * T_eval
    )
    sets = EVAL_SET_BYTES_PER_TOKEN * cfg.eval_size * (T_eval + sum(cfg.eval_lengths))
    return {"train": train, "eval": evaluation, "eval_sets": sets}


EVAL_SET_BYTES_PER_TOKEN = 64  # inputs, targets, loss mask, state (8 bytes each), twice over


def available_memory(device: str) -> float:
    """Bytes of memory the run can use: the GPU's on CUDA, else the machine's physical memory."""
    if resolve_device(device).type == "cuda":
        return float(torch.cuda.get_device_properties(0).total_memory)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return float("inf")  # unknown: do not refuse


def check_memory_fits(cfg, config: ModelConfig, schedule, fraction: float = 0.8) -> None:
    """Refuse, before anything is written, a run whose estimated memory exceeds `fraction` of
    what the device has (memory_estimate): a 100,000-token length, a batch of a million or a
    hundred million evaluation sequences would otherwise fail minutes in, or in the final
    evaluation."""
    have = available_memory(cfg.device)
    need = memory_estimate(cfg, config, schedule)
    gib = lambda b: f"{b / 2**30:.1f} GiB"
    host = available_memory("cpu")  # where the evaluation sets are built and kept
    if need["eval_sets"] > fraction * host:
        fail(
            "eval_size",
            cfg.eval_size,
            f"a size that fits in memory: eval_size={cfg.eval_size} at lengths "
            f"{', '.join(map(str, cfg.eval_lengths))} needs about {gib(need['eval_sets'])} for "
            f"the evaluation sets (estimate), this machine has {gib(host)}; lower eval_size",
        )
    # on the CPU the sets share the memory training and evaluation use
    shared = need["eval_sets"] if resolve_device(cfg.device).type != "cuda" else 0.0
    if need["train"] + shared > fraction * have:
        fail(
            "length" if cfg.length**2 > cfg.batch_size * cfg.length else "batch_size",
            cfg.length if cfg.length**2 > cfg.batch_size * cfg.length else cfg.batch_size,
            f"a size that fits in memory: length={cfg.length} with batch_size={cfg.batch_size} "
            "needs about "
            f"{gib(need['train'] + shared)} for training (estimate), this device has "
            f"{gib(have)}; lower length or batch_size",
        )
    if need["eval"] + shared > fraction * have:
        fail(
            "eval_lengths",
            cfg.eval_lengths,
            f"lengths that fit in memory: evaluating at {max(cfg.eval_lengths)} needs about "
            f"{gib(need['eval'] + shared)} "
            f"(estimate), this device has {gib(have)}; lower eval_lengths",
        )
