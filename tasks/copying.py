"""Synthetic copying: a random string, a separator, then the same string again.

A memory-capacity control for the state-tracking tasks: attention solves it by look-up, so a
recurrent pathway should not be needed here, and a model that gets worse at copying pays for its
recurrence somewhere. Framed as next-token prediction (Jelassi et al. 2024, "Repeat After Me"):

    full    = [BOS]? s_1 .. s_n SEP s_1 .. s_n
    inputs  = full[:T]              e.g. T = 2n:  s_1 .. s_n SEP s_1 .. s_{n-1}
    targets = full[1:T+1]           e.g. T = 2n:  s_2 .. s_n SEP s_1 .. s_n

Only positions from SEP onward count (loss_mask), where the targets are s_1 .. s_n: the model
reproduces the string after seeing the separator. For an even length T the string has n = T/2
tokens; for an odd T one BOS token is put first and n = (T-1)/2, so every T >= 2 is valid and a
linear length curriculum never hits a bad length.

Token ids: alphabet 0..A-1, SEP = A, BOS = A+1; vocab_size = A + 2 at every length.
state[t]: before SEP, the token just read (the one being stored; BOS at the BOS position);
from SEP onward, the token to be written at t (= targets[t]).
"""

from __future__ import annotations

import torch

from lrt_tasks.base import Batch, Task, check_int
from lrt_tasks.curriculum import LengthCurriculum


class CopyTask(Task):
    name = "copy"
    min_length = 2

    def __init__(
        self, length: int, alphabet_size: int = 16, curriculum: LengthCurriculum | None = None
    ):
        check_int("alphabet_size", alphabet_size, 2, 2**20)
        self.alphabet_size = alphabet_size
        super().__init__(length, curriculum)

    @property
    def sep_id(self) -> int:
        return self.alphabet_size

    @property
    def bos_id(self) -> int:
        return self.alphabet_size + 1

    @property
    def vocab_size(self) -> int:
        return self.alphabet_size + 2

    @property
    def eval_key(self) -> str:
        return f"copy:A={self.alphabet_size}"

    def sample(
        self, batch_size: int, generator: torch.Generator | None, length: int | None = None
    ) -> Batch:
        self._check_batch_size(batch_size)
        length = self._resolve_length(length)
        n, odd = divmod(length, 2)
        s = torch.randint(self.alphabet_size, (batch_size, n), generator=generator)
        parts = [s, torch.full((batch_size, 1), self.sep_id), s]
        if odd:
            parts.insert(0, torch.full((batch_size, 1), self.bos_id))
        full = torch.cat(parts, dim=1)  # [B, length + 1]
        inputs, targets = full[:, :-1], full[:, 1:]
        sep_pos = n + odd
        mask = torch.zeros(batch_size, length, dtype=torch.bool)
        mask[:, sep_pos:] = True
        state = torch.where(mask, targets, inputs)
        return Batch(inputs.contiguous(), targets.contiguous(), mask, state)

    def _repr_extra(self) -> str:
        return f", alphabet_size={self.alphabet_size}"
