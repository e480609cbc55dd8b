"""The training loss every forward and schedule shares: mean cross-entropy over counted positions.

Targets use IGNORE_INDEX (-1) for positions that do not count, as nanochat does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lrt_lab.core.token_ids import check_targets, check_token_ids

IGNORE_INDEX = -1


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean CE over positions whose target is not IGNORE_INDEX (0 when none counts)."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # CE in at least fp32 (bf16 autocast logits)
    total = F.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return total / (targets != IGNORE_INDEX).sum().clamp(min=1)


def check_inputs(idx: torch.Tensor, targets: torch.Tensor | None, vocab_size: int | None) -> None:
    """One clear line for token ids outside the vocabulary, an empty batch, or targets of another
    shape (IGNORE_INDEX allowed)."""
    check_token_ids("idx", idx, vocab_size)
    if idx.size(0) < 1 or idx.size(1) < 1:
        raise ValueError(
            f"idx is invalid: shape {tuple(idx.shape)}; allowed: at least one "
            "sequence and one position (B >= 1, T >= 1)"
        )
    if targets is not None:
        check_targets("targets", targets, tuple(idx.shape), vocab_size, IGNORE_INDEX)
