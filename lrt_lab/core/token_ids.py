"""Token ids and targets, checked before a model reads them: one clear line for an id outside the
vocabulary, a wrong dtype or shape (instead of an IndexError on the CPU or a device-side assert on
CUDA). Apart from lrt_lab.core.validation so that validating configs imports no torch.
"""

from __future__ import annotations

import torch


def _is_long_tensor(x, ndim: int | tuple) -> bool:
    ndims = ndim if isinstance(ndim, tuple) else (ndim,)
    return isinstance(x, torch.Tensor) and x.dtype == torch.long and x.dim() in ndims


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"


def vocab_size_of(model) -> int:
    """The model's vocabulary size (`lrt_lab.core.interface.SequenceModel.config`)."""
    return model.config.vocab_size


def check_token_ids(
    name: str, ids, vocab_size: int | None, ndim: int | tuple = 2, values: bool = True
) -> None:
    """ids: a LongTensor of `ndim` dims whose entries are token ids in [0, vocab_size).

    An out-of-range id would raise IndexError on the CPU and a device-side assert on CUDA (which
    poisons the whole CUDA context), so it is caught here, with one reduction and one sync.
    values=False checks only type and shape (no sync), for ids valid by construction.
    vocab_size=None (a model that does not declare one): only ids < 0 are rejected.
    """
    shape = {1: "(B,)", 2: "(B, T)"}
    ids_range = f"[0, {vocab_size - 1}]" if vocab_size is not None else "[0, vocab_size)"
    if not _is_long_tensor(ids, ndim):
        want = " or ".join(shape[n] for n in (ndim if isinstance(ndim, tuple) else (ndim,)))
        raise ValueError(
            f"{name} is invalid: got {_describe(ids)}; allowed: a torch.long tensor of shape "
            f"{want} with token ids in {ids_range}"
        )
    high = vocab_size if vocab_size is not None else 2**63 - 1
    if values and ids.numel() and bool(((ids < 0) | (ids >= high)).any()):
        lo, hi = int(ids.min()), int(ids.max())
        raise ValueError(
            f"{name} is invalid: token ids range over [{lo}, {hi}]; allowed: token ids in "
            f"{ids_range} (the model's vocab_size is {vocab_size})"
        )


def check_targets(
    name: str, targets, shape: tuple, vocab_size: int | None, ignore_index: int
) -> None:
    """targets: a LongTensor of `shape` with class ids in [0, vocab_size) or ignore_index."""
    ids_range = f"[0, {vocab_size - 1}]" if vocab_size is not None else "[0, vocab_size)"
    allowed = (
        f"a torch.long tensor of shape {tuple(shape)} with targets in {ids_range} "
        f"or {ignore_index} (ignored)"
    )
    if (
        not isinstance(targets, torch.Tensor)
        or targets.dtype != torch.long
        or tuple(targets.shape) != tuple(shape)
    ):
        raise ValueError(f"{name} is invalid: got {_describe(targets)}; allowed: {allowed}")
    high = vocab_size if vocab_size is not None else 2**63 - 1
    bad = ((targets < 0) | (targets >= high)) & (targets != ignore_index)
    if targets.numel() and bool(bad.any()):
        raise ValueError(
            f"{name} is invalid: e.g. {int(targets[bad][0])} is out of range; allowed: {allowed}"
        )


# Paths -----------------------------------------------------------------------------------------
