"""A loss-spike guard for the training loop (`TrainConfig.spike_guard`, `--spike-guard NATS`).

Why a loss guard and not one on the contraction monitor: in the A5 trainer study, every collapse
of Rollout(1) began as a training-loss jump within 1-3 steps (e.g. 0.27 -> 0.90 -> 4.05) while the
memory map's Lyapunov exponent at the evaluation before was still negative (-0.25 to -0.07): a
guard on contraction would not have fired, and the loss is read at every step for free.

The rule: a step whose loss is more than `threshold` nats above the running mean (EMA) of the
accepted losses at the current sequence length, or is not finite, is refused: no backward, and
the parameters and optimizer state go back to before the previous update (the update that led to
the spike), and every learning rate is multiplied by `backoff` from then on. The guard arms after
ARM_STEPS accepted steps at a length (a curriculum's longer sequences have a higher loss, not a
spike), and gives way after MAX_REFUSALS refusals in a row (a higher loss that persists is where
the run is, and refusing it forever would stop training).

Its state (the EMA, its counts, the rate factor, and the copy from before the last update) is
saved in checkpoints, so a resumed run refuses what the uninterrupted one did.
"""

from __future__ import annotations

import copy
import math

import torch

ARM_STEPS = 50  # accepted steps at a length before the guard can refuse one
MAX_REFUSALS = 3  # refusals in a row, after which the next step is accepted whatever its loss
EMA_DECAY = 0.9  # the running mean's weight on its past: about the last 10 accepted steps


class SpikeGuard:
    """Refuses a training step whose loss spikes (module docstring); `None` in the loop when off."""

    def __init__(self, threshold: float, backoff: float = 0.5):
        self.threshold = threshold
        self.backoff = backoff
        self.ema: float | None = None  # of accepted losses at `length`
        self.length: int | None = None
        self.accepted = 0  # accepted steps at `length`
        self.in_row = 0  # refusals since the last accepted step
        self.refused_steps: list[int] = []  # 1-based, as the metrics lines number steps
        self.lr_factor = 1.0
        self._params: list[torch.Tensor] | None = None  # before the last accepted update
        self._opts: list[dict] | None = None

    def refuses(self, loss: float, length: int) -> bool:
        """Whether a step at `length` with this forward loss is refused (before its backward)."""
        if self._params is None or self.in_row >= MAX_REFUSALS:
            return False
        if not math.isfinite(loss):
            return True
        armed = length == self.length and self.accepted >= ARM_STEPS
        return armed and loss > self.ema + self.threshold

    def scale_rates(self, opts) -> None:
        """Multiply every group's rate (just set by the schedule) by the backoff so far."""
        if self.lr_factor != 1.0:
            for opt in opts:
                for g in opt.param_groups:
                    g["lr"] *= self.lr_factor

    def keep(self, model, opts) -> None:
        """Copy the parameters and optimizer state: call before an accepted step's update."""
        self._params = [p.detach().clone() for p in model.parameters()]
        self._opts = [copy.deepcopy(o.state_dict()) for o in opts]

    def accept(self, loss: float, length: int) -> None:
        """Count an accepted step (after its update) into the running mean."""
        if length != self.length:  # a new curriculum length: the mean and the arming restart
            self.length, self.ema, self.accepted = length, None, 0
        self.ema = loss if self.ema is None else EMA_DECAY * self.ema + (1 - EMA_DECAY) * loss
        self.accepted += 1
        self.in_row = 0

    def refuse(self, step: int, model, opts) -> None:
        """Refuse step `step`: restore the copy from before the previous update, back off."""
        with torch.no_grad():
            for p, saved in zip(model.parameters(), self._params, strict=True):
                p.copy_(saved)
        for opt, saved in zip(opts, self._opts, strict=True):
            # a copy: load_state_dict keeps the tensors it is given, and the next update would
            # change them in place
            opt.load_state_dict(copy.deepcopy(saved))
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        self.lr_factor *= self.backoff
        self.in_row += 1
        self.refused_steps.append(step)

    def record(self, refused: bool, steps: int) -> dict:
        """The train line's guard fields: this step refused (0/1), refusals so far, their rate."""
        fired = len(self.refused_steps)
        return {
            "guard_refused": int(refused),
            "guard_fired": fired,
            "guard_rate": fired / max(steps, 1),
            "guard_lr_factor": self.lr_factor,
        }

    def summary(self) -> dict:
        return {"refused_steps": list(self.refused_steps), "lr_factor": self.lr_factor}

    def state_dict(self) -> dict:
        return {
            "ema": self.ema,
            "length": self.length,
            "accepted": self.accepted,
            "in_row": self.in_row,
            "refused_steps": list(self.refused_steps),
            "lr_factor": self.lr_factor,
            "params": self._params,
            "opts": self._opts,
        }

    def load_state_dict(self, state: dict) -> None:
        self.ema, self.length = state["ema"], state["length"]
        self.accepted, self.in_row = int(state["accepted"]), int(state["in_row"])
        self.refused_steps = [int(s) for s in state["refused_steps"]]
        self.lr_factor = float(state["lr_factor"])
        self._params, self._opts = state["params"], state["opts"]


def make_guard(cfg) -> SpikeGuard | None:
    """The run's guard, None when `cfg.spike_guard` is None (the default: off)."""
    if cfg.spike_guard is None:
        return None
    return SpikeGuard(cfg.spike_guard, cfg.spike_backoff)
