"""Prefix products over a finite group (the word problem), the paper's state-tracking task.

Appendix "Non-Commutative State Tracking" of the LRT paper: "At each position, the model must
predict the cumulative group product of the observed prefix", over A5, with Z60 as the commutative
control of the same output size. Inputs x_1..x_T are element ids drawn uniformly; the target at
position t is the id of x_1 * x_2 * ... * x_t composed left to right with the group's
`mul_table` (for permutation groups: (p*q)[i] = p[q[i]], see tasks/groups.py). Every position
counts (loss_mask is all True), and the latent state is the running product itself.

`supervise_every=k` counts only the positions t (0-based) with (t + 1) % k == 0 in the loss and
the accuracy: the running product must still be carried through the k - 1 positions in between,
where it is no longer the supervised output. (It separates "the source layer learns the state
from the current token's loss" from "the state must be learned through the recurrence", which a
trainer whose gradient crosses no memory hop, Rollout(1), cannot do.)
"""

from __future__ import annotations

import torch

from lrt_tasks.base import Batch, Task, check_int
from lrt_tasks.curriculum import LengthCurriculum
from lrt_tasks.groups import Group


class PrefixProductTask(Task):
    """inputs: element ids, vocab_size = group order; targets = state = running products."""

    prefix_closed = True  # i.i.d. uniform inputs, and the product through t reads x_1..x_t only

    def __init__(
        self,
        group: Group,
        length: int,
        name: str | None = None,
        curriculum: LengthCurriculum | None = None,
        supervise_every: int = 1,
    ):
        self.group = group
        self.name = name or f"{group.name.lower()}_prefix"
        super().__init__(length, curriculum)
        shortest = curriculum.start_length if curriculum is not None else length
        # every batch counts some position
        check_int("supervise_every", supervise_every, 1, shortest)
        self.supervise_every = supervise_every

    @property
    def vocab_size(self) -> int:
        return self.group.order

    @property
    def eval_key(self) -> str:
        return f"prefix:{self.group.name}"

    def sample(
        self, batch_size: int, generator: torch.Generator | None, length: int | None = None
    ) -> Batch:
        self._check_batch_size(batch_size)
        length = self._resolve_length(length)
        inputs = torch.randint(self.group.order, (batch_size, length), generator=generator)
        targets = self.group.prefix_products(inputs)
        counted = (torch.arange(length) + 1) % self.supervise_every == 0
        mask = counted.expand(batch_size, length).clone()
        return Batch(inputs, targets, mask, targets.clone())

    def _repr_extra(self) -> str:
        every = f", supervise_every={self.supervise_every}" if self.supervise_every != 1 else ""
        return f", group={self.group.name}{every}"
