"""`make_task(name, length, **options)`: the one place task names and options are resolved.

Names (TASK_NAMES):
  a5_prefix, z60_prefix, s5_prefix, a4xz5_prefix, d30_prefix
                 prefix products over A5 (the paper's task), Z60 (the paper's commutative
                 control), S5, A4 x Z5 and D30 (solvable non-abelian controls of order 60);
                 option supervise_every=k: only every k-th position counts (loss, accuracy, pos@90);
  group_prefix   prefix products over any group `get_group` can build: option group="S4"
                 (and supervise_every);
  copy           synthetic copying, option alphabet_size (default 16);
  flipflop       flip-flop language modelling, option p_ignore (default 0.8);
  text_bytes     next-byte prediction on an offline corpus (BPB), option corpus ("stdlib",
                 "pydoc", "pylib" or "shakespeare"; see tasks/text.py).
Every task also takes curriculum_start and curriculum_steps (together; plus optional
curriculum_schedule, "doubling" or "linear"): the task then carries a LengthCurriculum from
curriculum_start to `length`, and `task.length_at(step)` gives the training length at a step.
Unknown names or options raise ValueError naming the field and the allowed values.
"""

from __future__ import annotations

from lrt_tasks.base import Task, check_int
from lrt_tasks.copying import CopyTask
from lrt_tasks.curriculum import SCHEDULES, LengthCurriculum
from lrt_tasks.flipflop import FlipFlopTask
from lrt_tasks.groups import Group, get_group
from lrt_tasks.prefix import PrefixProductTask
from lrt_tasks.text import TextBytesTask

_PREFIX_GROUPS = {
    "a5_prefix": "A5",
    "z60_prefix": "Z60",
    "s5_prefix": "S5",
    "a4xz5_prefix": "A4xZ5",
    "d30_prefix": "D30",
}

TASK_NAMES = (*_PREFIX_GROUPS, "group_prefix", "copy", "flipflop", "text_bytes")

_OPTIONS = {name: ("supervise_every",) for name in _PREFIX_GROUPS}
_OPTIONS.update(
    {
        "group_prefix": ("group", "supervise_every"),
        "copy": ("alphabet_size",),
        "flipflop": ("p_ignore",),
        "text_bytes": ("corpus",),
    }
)
_CURRICULUM_OPTIONS = ("curriculum_start", "curriculum_steps", "curriculum_schedule")


def _curriculum(length: int, options: dict) -> LengthCurriculum | None:
    start = options.pop("curriculum_start", None)
    steps = options.pop("curriculum_steps", None)
    schedule = options.pop("curriculum_schedule", None)
    if start is None and steps is None:
        if schedule is not None:
            raise ValueError(
                f"curriculum_schedule={schedule!r} is invalid without curriculum_start and "
                "curriculum_steps; allowed: all three together"
            )
        return None
    if start is None or steps is None:
        missing = "curriculum_start" if start is None else "curriculum_steps"
        raise ValueError(
            f"{missing}=None is invalid; allowed: an integer (required when the other curriculum "
            "option is given)"
        )
    check_int("curriculum_start", start, 1, length)
    check_int("curriculum_steps", steps, 0)
    if schedule is None:
        schedule = SCHEDULES[0]
    if schedule not in SCHEDULES:
        raise ValueError(
            f"curriculum_schedule={schedule!r} is invalid; allowed: "
            f"{', '.join(map(repr, SCHEDULES))}"
        )
    return LengthCurriculum(start, length, steps, schedule)


def make_task(name: str, length: int, **options) -> Task:
    """Build a task by name; see the module docstring for names and options."""
    if name not in _OPTIONS:
        raise ValueError(f"task: unknown name {name!r}; allowed: {', '.join(TASK_NAMES)}")
    check_int("length", length, 1)
    allowed = _OPTIONS[name] + _CURRICULUM_OPTIONS
    for key in options:
        if key not in allowed:
            raise ValueError(
                f"{key}: unknown option for task {name!r}; allowed: {', '.join(allowed)}"
            )
    options = dict(options)
    curriculum = _curriculum(length, options)
    if name in _PREFIX_GROUPS:
        return PrefixProductTask(
            get_group(_PREFIX_GROUPS[name]), length, name=name, curriculum=curriculum, **options
        )
    if name == "group_prefix":
        group = options.get("group")
        if group is None:
            raise ValueError(
                "group=None is invalid; allowed: a group name like 'S4' or a Group (required for "
                "task 'group_prefix')"
            )
        group = group if isinstance(group, Group) else get_group(group)
        options.pop("group")
        return PrefixProductTask(
            group, length, name="group_prefix", curriculum=curriculum, **options
        )
    if name == "copy":
        return CopyTask(length, curriculum=curriculum, **options)
    if name == "text_bytes":
        return TextBytesTask(length, curriculum=curriculum, **options)
    return FlipFlopTask(length, curriculum=curriculum, **options)
