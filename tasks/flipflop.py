"""Flip-flop language modelling (Liu et al. 2023, "Exposing Attention Glitches with Flip-Flop
Language Modeling"): a one-bit memory that must survive long runs of distractors.

The sequence is instruction/bit pairs: `w b` writes bit b, `r b` reads (b must equal the last
written bit), `i b` ignores b. The first instruction is always `w`; afterwards instructions are
drawn with p(i) = p_ignore and p(w) = p(r) = (1 - p_ignore) / 2, Liu et al.'s FFL(p_ignore)
(their main setting is 0.8). Framed as next-token prediction: targets are the next token, and only
the bits after `r` count (loss_mask is True at the `r` positions), the only deterministic tokens.

Token ids: 0 and 1 are the bits, W = 2, R = 3, I = 4; vocab_size = 5. Any length T >= 1 works (an
odd T ends on an instruction whose bit is the last target).
state[t]: the stored bit after reading inputs[:, :t+1]; memory starts at 0 and changes when the
bit of a `w` is read, so state[:, 0] (before the first bit) is always 0; probes should skip it.
"""

from __future__ import annotations

import torch

from lrt_tasks.base import Batch, Task, fail
from lrt_tasks.curriculum import LengthCurriculum

W, R, I = 2, 3, 4


class FlipFlopTask(Task):
    name = "flipflop"
    prefix_closed = True  # i.i.d. instruction pairs; target t is token t+1 of the same stream

    def __init__(
        self, length: int, p_ignore: float = 0.8, curriculum: LengthCurriculum | None = None
    ):
        if (
            isinstance(p_ignore, bool)
            or not isinstance(p_ignore, (int, float))
            or not 0.0 <= p_ignore < 1.0
        ):
            fail("p_ignore", p_ignore, "a number in [0, 1)")
        self.p_ignore = float(p_ignore)
        super().__init__(length, curriculum)

    @property
    def vocab_size(self) -> int:
        return 5

    @property
    def eval_key(self) -> str:
        return f"flipflop:p_ignore={self.p_ignore}"

    def sample(
        self, batch_size: int, generator: torch.Generator | None, length: int | None = None
    ) -> Batch:
        self._check_batch_size(batch_size)
        length = self._resolve_length(length)
        pairs = length // 2 + 1  # 2 * pairs >= length + 1 tokens: inputs and shifted targets
        u = torch.rand(batch_size, pairs, generator=generator)
        bits = torch.randint(2, (batch_size, pairs), generator=generator)
        p_w = (1.0 - self.p_ignore) / 2
        instr = torch.where(u < p_w, W, torch.where(u < 2 * p_w, R, I))
        instr[:, 0] = W
        # Index of the latest write at or before each pair; reads copy that write's bit.
        idx = torch.arange(pairs).expand(batch_size, pairs)
        last_w = torch.cummax(torch.where(instr == W, idx, 0), dim=1).values
        stored = bits.gather(1, last_w)  # memory after each pair
        bits = torch.where(instr == R, stored, bits)
        full = torch.stack([instr, bits], dim=2).reshape(batch_size, 2 * pairs)
        inputs, targets = full[:, :length], full[:, 1 : length + 1]
        # Memory after each token: before a pair's bit it is the previous pair's memory.
        before = torch.cat([torch.zeros(batch_size, 1, dtype=torch.long), stored[:, :-1]], dim=1)
        state = torch.stack([before, stored], dim=2).reshape(batch_size, 2 * pairs)[:, :length]
        mask = inputs == R
        return Batch(inputs.contiguous(), targets.contiguous(), mask, state.contiguous())

    def _repr_extra(self) -> str:
        return f", p_ignore={self.p_ignore}"
