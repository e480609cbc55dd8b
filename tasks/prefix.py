"""Prefix products over a finite group (the word problem), the paper's state-tracking task.

Appendix "Non-Commutative State Tracking" of the LRT paper: "At each position, the model must
predict the cumulative group product of the observed prefix", over A5, with Z60 as the commutative
control of the same output size. Inputs x_1..x_T are element ids drawn uniformly; the target at
position t is the id of x_1 * x_2 * ... * x_t composed left to right with the group's
`mul_table` (for permutation groups: (p*q)[i] = p[q[i]], see tasks/groups.py). Every position
counts (loss_mask is all True), and the latent state is the running product itself.
"""

from __future__ import annotations

import torch

from lrt_tasks.base import Batch, Task
from lrt_tasks.curriculum import LengthCurriculum
from lrt_tasks.groups import Group


class PrefixProductTask(Task):
    """inputs: element ids, vocab_size = group order; targets = state = running products."""

    prefix_closed = True  # i.i.d. uniform inputs, and the product through t reads x_1..x_t only

    def __init__(self, group: Group, length: int, name: str | None = None,
                 curriculum: LengthCurriculum | None = None):
        self.group = group
        self.name = name or f"{group.name.lower()}_prefix"
        super().__init__(length, curriculum)

    @property
    def vocab_size(self) -> int:
        return self.group.order

    @property
    def eval_key(self) -> str:
        return f"prefix:{self.group.name}"

    def sample(self, batch_size: int, generator: torch.Generator | None, length: int | None = None) -> Batch:
        self._check_batch_size(batch_size)
        length = self._resolve_length(length)
        inputs = torch.randint(self.group.order, (batch_size, length), generator=generator)
        targets = self.group.prefix_products(inputs)
        mask = torch.ones(batch_size, length, dtype=torch.bool)
        return Batch(inputs, targets, mask, targets.clone())

    def _repr_extra(self) -> str:
        return f", group={self.group.name}"
