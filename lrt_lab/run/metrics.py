"""Evaluation metrics shared by the toy tasks and language modelling; torch and math only.

- per_position_accuracy / pos_at: the paper's state-tracking metric. pos@90 is "the largest
  position p such that accuracy remains at least 90% at every position from 1 through p"
  (appendix "Non-Commutative State Tracking": Transformer 5, LRT 24 on A5 at lengths 64/128/256).
- bits_per_byte: the paper's language-modelling metric (BPB), tokenizer-independent because it
  divides summed nats by the number of UTF-8 bytes the tokens decode to.
- accuracy, sequence_accuracy: overall token accuracy and exact-match rate.

`logits` may be (B, T, V) scores (argmax taken) or (B, T) integer predictions; `mask` (B, T) bool
selects the positions that count (None: all).
"""

from __future__ import annotations

import math

import torch


def _predictions(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None):
    if targets.dim() != 2:
        raise ValueError(f"targets: expected shape (B, T), got {tuple(targets.shape)}")
    if logits.dim() == 3:
        preds = logits.argmax(dim=-1)
    elif logits.dim() == 2:
        preds = logits
    else:
        raise ValueError(
            f"logits: expected (B, T, V) scores or (B, T) predictions, got {tuple(logits.shape)}"
        )
    if preds.shape != targets.shape:
        raise ValueError(
            f"logits: shape {tuple(logits.shape)} does not match targets {tuple(targets.shape)}"
        )
    if mask is None:
        mask = torch.ones_like(targets, dtype=torch.bool)
    elif mask.shape != targets.shape:
        raise ValueError(
            f"mask: shape {tuple(mask.shape)} does not match targets {tuple(targets.shape)}"
        )
    mask = mask.to(device=targets.device, dtype=torch.bool)
    correct = (preds.to(targets.device) == targets) & mask
    return correct, mask


def per_position_accuracy(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Accuracy at each position over the batch: float32 tensor [T]; acc[0] is position 1.

    Masked-out examples are excluded from a position's denominator; a position with no counted
    example is NaN (not 0, which would read as "model wrong there").
    """
    correct, mask = _predictions(logits, targets, mask)
    counts = mask.sum(dim=0).float()
    hits = correct.sum(dim=0).float()
    return torch.where(counts > 0, hits / counts.clamp_min(1), torch.full_like(counts, math.nan))


_POS_AT_SLACK = 1e-6


def pos_at(acc, threshold: float = 0.9, skip_nan: bool = False) -> int:
    """pos@threshold: the largest p with acc[i] >= threshold at every position 1..p (acc[0] is
    position 1); 0 when position 1 is already below, len(acc) when no position is.

    Accuracies up to 1e-6 below the threshold pass (float32 rounding of e.g. 9/10).
    A NaN position (no counted example) stops the run by default: "remains at least 90% at every
    position" cannot be claimed where nothing was measured. skip_nan=True reads the counted
    positions only (a task that supervises every 4th position, the copy task's uncounted first
    half): the result is the last counted position before the first counted one that fails (0
    when the first counted position fails, the last counted position when none does), so an
    unsupervised position never counts as passing.
    """
    if not 0.0 <= float(threshold) <= 1.0:
        raise ValueError(f"threshold={threshold!r} is invalid; allowed: a number in [0, 1]")
    acc = torch.as_tensor(acc).double().flatten()
    # A float32 9/10 is 0.89999998 < 0.9: without slack a position exactly at 90% would fail.
    # 1e-6 covers float32 rounding (~6e-8) yet is below one example's weight, 1/(10n), for n < 1e5.
    ok = acc >= float(threshold) - _POS_AT_SLACK
    if skip_nan:
        counted = (~torch.isnan(acc)).nonzero().flatten()
        failing = counted[~ok[counted]]
        passed = counted[counted < failing[0]] if len(failing) else counted
        return int(passed[-1]) + 1 if len(passed) else 0
    bad = (~ok).nonzero()
    return int(bad[0, 0]) if len(bad) else int(acc.numel())


def bits_per_byte(total_nats: float, total_bytes: int) -> float:
    """Summed cross-entropy in nats over a text -> bits per UTF-8 byte of that text."""
    total_nats = float(total_nats)
    total_bytes = float(total_bytes)
    if not total_bytes > 0:
        raise ValueError(f"total_bytes={total_bytes!r} is invalid; allowed: a number > 0")
    return total_nats / (math.log(2) * total_bytes)


def accuracy(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None
) -> float:
    """Fraction of counted positions predicted right (NaN if none counted)."""
    correct, mask = _predictions(logits, targets, mask)
    n = int(mask.sum())
    return float(correct.sum()) / n if n else math.nan


def sequence_accuracy(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None
) -> float:
    """Fraction of sequences with every counted position right (exact match).

    Sequences with no counted position are left out of the denominator; NaN if none is left.
    """
    correct, mask = _predictions(logits, targets, mask)
    counted = mask.any(dim=1)
    all_right = (correct == mask).all(dim=1) & counted
    n = int(counted.sum())
    return float(all_right.sum()) / n if n else math.nan


__all__ = ["per_position_accuracy", "pos_at", "bits_per_byte", "accuracy", "sequence_accuracy"]
