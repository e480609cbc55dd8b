"""The batch contract every toy task follows, and the small base class the tasks share.

Contract (the training loop relies on it): logits at position t are scored against
`targets[:, t]`, and the model has seen exactly `inputs[:, :t+1]` when it produces them. Targets
are therefore already aligned with the inputs; the training loop must NOT shift them again. For
the prefix products target t is the product through x_t; for copy and flip-flop, which are
language-modelling tasks, targets are the next input token (already shifted here).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from lrt_lab.core.config import check_int, fail  # noqa: F401  (the project's field-naming errors)
from lrt_tasks.curriculum import LengthCurriculum


class Batch(NamedTuple):
    """One batch of a toy task.

    inputs:    LongTensor [B, T], token ids in [0, vocab_size).
    targets:   LongTensor [B, T], valid token ids everywhere (also where loss_mask is False), so
               cross-entropy can run on the whole tensor and be masked afterwards.
    loss_mask: BoolTensor [B, T], True where the position counts for loss and accuracy.
    state:     LongTensor [B, T] or None: the task's latent state after reading inputs[:, :t+1],
               the label a linear probe should recover (running product id, token being copied,
               stored flip-flop bit).
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    state: torch.Tensor | None = None

    def to(self, device) -> Batch:
        return Batch(*(None if x is None else x.to(device) for x in self))


class Task:
    """Base class: `name`, `length` (default training length), `vocab_size`, `sample`.

    Sampling is on the CPU and consumes only `generator`, so a batch is a pure function of the
    generator state (use `Batch.to(device)` afterwards). `curriculum` is an optional
    `LengthCurriculum` set by `make_task(..., curriculum_start=..., curriculum_steps=...)`;
    `length_at(step)` is what a training loop should pass as `length=`.

    Optional, for tasks that read a finite corpus (`TextBytesTask`): `describe() -> dict`, a
    JSON-able account of the data a run read, and `train_tokens -> int`, the training split's size
    in tokens; a training loop records them (and epochs = tokens seen / train_tokens) when present.
    """

    name: str = "task"
    min_length: int = 1
    # True when the first L positions of a sample at length L' > L are distributed as a sample at
    # length L (targets at t depend on inputs up to t only): evaluation sets then share prefixes
    # across lengths (tasks/eval_sets.py)
    prefix_closed: bool = False

    def __init__(self, length: int, curriculum: LengthCurriculum | None = None):
        check_int("length", length, self.min_length)
        self.length = length
        if curriculum is not None and curriculum.end_length != length:
            fail("curriculum.end_length", curriculum.end_length, f"the task length {length}")
        if curriculum is not None and curriculum.start_length < self.min_length:
            fail(
                "curriculum_start",
                curriculum.start_length,
                f"an integer >= {self.min_length} for {self.name}",
            )
        self.curriculum = curriculum

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def eval_key(self) -> str:
        """Identifies the task's distribution (not its length) when deriving evaluation seeds."""
        return self.name

    def length_at(self, step: int) -> int:
        """Training length at `step`: the curriculum's if there is one, else `length`."""
        return self.length if self.curriculum is None else self.curriculum.length_at(step)

    def _resolve_length(self, length: int | None) -> int:
        if length is None:
            return self.length
        check_int("length", length, self.min_length)
        return length

    @staticmethod
    def _check_batch_size(batch_size: int) -> None:
        check_int("batch_size", batch_size, 1)

    def sample(
        self, batch_size: int, generator: torch.Generator | None, length: int | None = None
    ) -> Batch:
        raise NotImplementedError

    def _repr_extra(self) -> str:
        return ""

    def __repr__(self) -> str:
        extra = self._repr_extra()
        cur = "" if self.curriculum is None else f", curriculum={self.curriculum!r}"
        return (
            f"{type(self).__name__}(name={self.name!r}{extra}, length={self.length}, "
            f"vocab_size={self.vocab_size}{cur})"
        )
