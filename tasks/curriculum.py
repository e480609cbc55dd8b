"""Length curriculum: train on short sequences first, grow to the full length.

Why: a fixed-depth model has to discover the per-step update of a state-tracking task from long
sequences where almost every target depends on a long product. On A5 at length 64 a d=128 model
trained for 5 CPU minutes without a curriculum learned nothing past position 1; starting from
short sequences lets it learn the one-step update first (the paper trains at length 64 and reports
pos@90, appendix "Non-Commutative State Tracking").

Schedules (`schedule=`):
  "doubling" (default): stages start, 2*start, 4*start, ... (the last stage is end_length itself),
      the steps [0, steps) split evenly over the stages below end_length. Few distinct lengths, so
      few distinct shapes for compiled kernels.
  "linear": length grows linearly, round(start + (end - start) * step / steps).
Both give start_length at step 0 and end_length from `steps` on.
"""

from __future__ import annotations

import torch

from lrt_lab.core.validation import fail, is_int

SCHEDULES = ("doubling", "linear")


class LengthCurriculum:
    """Maps a training step to a sequence length; see the module docstring for the schedules."""

    def __init__(self, start_length: int, end_length: int, steps: int, schedule: str = "doubling"):
        if not is_int(end_length) or end_length < 1:
            fail("end_length", end_length, "an integer >= 1")
        if not is_int(start_length) or not 1 <= start_length <= end_length:
            fail("start_length", start_length, f"an integer in [1, end_length={end_length}]")
        if not is_int(steps) or steps < 0:
            fail("steps", steps, "an integer >= 0")
        if schedule not in SCHEDULES:
            fail("schedule", schedule, ", ".join(repr(s) for s in SCHEDULES))
        self.start_length = start_length
        self.end_length = end_length
        self.steps = steps
        self.schedule = schedule
        # Doubling stages strictly below end_length; end_length itself is reached at `steps`.
        self.stages = []
        n = start_length
        while n < end_length:
            self.stages.append(n)
            n *= 2

    def length_at(self, step: int) -> int:
        if not is_int(step) or step < 0:
            fail("step", step, "an integer >= 0")
        if step >= self.steps or not self.stages:
            return self.end_length
        if self.schedule == "linear":
            frac = step / self.steps
            return min(
                self.end_length,
                round(self.start_length + (self.end_length - self.start_length) * frac),
            )
        return self.stages[step * len(self.stages) // self.steps]

    def __repr__(self) -> str:
        return (
            f"LengthCurriculum({self.start_length}->{self.end_length} over {self.steps} steps, "
            f"{self.schedule})"
        )


class CurriculumSampler:
    """Samples a task at the curriculum's length for a step; batches at short lengths are shorter
    sequences (B, length_at(step)), not padded ones, so no compute is spent on padding.

    `curriculum` defaults to the task's own (`make_task(..., curriculum_start=...,
    curriculum_steps=...)`).
    """

    def __init__(self, task, curriculum: LengthCurriculum | None = None):
        curriculum = curriculum if curriculum is not None else getattr(task, "curriculum", None)
        if curriculum is None:
            raise ValueError(
                "curriculum: none given and the task has none; pass a LengthCurriculum or build "
                "the "
                "task with make_task(..., curriculum_start=..., curriculum_steps=...)"
            )
        self.task = task
        self.curriculum = curriculum

    def length_at(self, step: int) -> int:
        return self.curriculum.length_at(step)

    def sample(self, batch_size: int, generator: torch.Generator | None, step: int):
        return self.task.sample(batch_size, generator, length=self.length_at(step))

    def __repr__(self) -> str:
        return f"CurriculumSampler({self.task!r}, {self.curriculum!r})"
