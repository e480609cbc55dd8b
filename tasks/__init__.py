"""Toy tasks for what latent recurrence buys: group prefix products (A5, Z60, S5, A4xZ5, D30),
synthetic copying and flip-flop, a length curriculum and fixed evaluation sets.

    from lrt_tasks import make_task
    task = make_task("a5_prefix", 64)
    batch = task.sample(32, torch.Generator().manual_seed(0))   # Batch(inputs, targets, loss_mask,
    state)

Targets are aligned with inputs: logits at position t are scored against targets[:, t] (see
tasks/base.py). Independent of the model code: lrt_lab never imports tasks.
"""

from lrt_tasks.base import Batch, Task
from lrt_tasks.copying import CopyTask
from lrt_tasks.curriculum import CurriculumSampler, LengthCurriculum
from lrt_tasks.eval_sets import eval_seed, make_eval_sets
from lrt_tasks.flipflop import FlipFlopTask
from lrt_tasks.prefix import PrefixProductTask
from lrt_tasks.registry import TASK_NAMES, make_task

__all__ = [
    "Batch",
    "Task",
    "TASK_NAMES",
    "make_task",
    "make_eval_sets",
    "eval_seed",
    "LengthCurriculum",
    "CurriculumSampler",
    "PrefixProductTask",
    "CopyTask",
    "FlipFlopTask",
]
