"""Stage outputs put back in sequence order: every schedule, capture and cache use this one rule."""

from __future__ import annotations

import torch


def assemble(parts: list[tuple[range, torch.Tensor]], T: int) -> torch.Tensor:
    """(B, T, ...) from per-stage tensors at their positions; later stages win."""
    last_P, last = parts[-1]
    if last_P == range(0, T):
        return last
    starts = [P.start for P, _ in parts]
    stops = [P.stop for P, _ in parts]
    if all(P.step == 1 for P, _ in parts) and starts == [0] + stops[:-1] and stops[-1] == T:
        return torch.cat([t for _, t in parts], dim=1)  # contiguous tiling (Chunked, Exact)
    ref = parts[0][1]
    out = ref.new_zeros((ref.size(0), T) + tuple(ref.shape[2:]))
    for P, t in parts:
        out[:, P.start : P.stop : P.step] = t
    return out
