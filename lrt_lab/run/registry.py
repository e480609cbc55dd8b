"""Schedules by name: the one table behind `parse_schedule`, every message that lists the spellings,
and the CLI's help.

A schedule class joins it with one decorator naming its spelling, e.g.
`@register_schedule("interleaved:S")`: `interleaved:2` then parses to `Interleaved(2)`, the
arguments converted by the types of the dataclass's fields in order; `[...]` marks optional
arguments (`"fixedpoint:TOL:MAX[:G]"`). A class with other needs gives `parse(args)`. Schedules
defined outside the package register the same way (docs/extending.md), from a file the command
line loads with `--plugin FILE` (`lrt_lab.core.plugins`); an installed package can also name its
module under the entry point group `lrt_lab.schedules`, loaded the first time a spelling is not
found, so sweep workers in new processes know them too.

The built-in schedules (`lrt_lab.run.schedules`: their specs, which import no torch; how they run
is `lrt_lab.run.execution`) join the table when a schedule is first parsed, so parsing a
spelling, and refusing a bad one, loads no torch; their spellings are also stated here
(`BUILTIN_SPELLINGS`, held equal to the registrations by the tests), so the command line's help
and the refusal of an unknown name answer without importing even the specs. A schedule
registered outside the package may import torch.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import typing
from collections.abc import Callable

from lrt_lab.core.interface import Schedule
from lrt_lab.core.plugins import SCHEDULE_GROUP, load_entry_points, route

ENTRY_POINT_GROUP = SCHEDULE_GROUP
# The spellings lrt_lab.run.schedules registers, in its order: help and the refusal of an unknown
# name read them without importing that module (and torch); tests/test_plugins.py holds them equal.
BUILTIN_SPELLINGS = (
    "onepass",
    "interleaved:S",
    "gaussseidel:S:N[:G]",
    "fullseq:K[:w0,w1,...]",
    "chunked:C",
    "exact",
    "fixedpoint:TOL:MAX[:G]",
    "rollout[:G]",
)
# What `as_schedule` names when an object is not a schedule (lrt_lab.core.interface.Schedule).
PROTOCOL_MEMBERS = (
    "spec",
    "cost",
    "exact",
    "causal",
    "family",
    "stages",
    "stage_weights",
    "sweep",
    "solver_sweeps",
    "run",
    "forwards",
)
BUILTIN_NAMES = tuple(s.split(":")[0].split("[")[0] for s in BUILTIN_SPELLINGS)


@dataclasses.dataclass(frozen=True)
class Registered:
    spelling: str  # e.g. "fixedpoint:TOL:MAX[:G]"
    cls: type
    parse: Callable[[list[str]], Schedule]


SCHEDULES: dict[str, Registered] = {}  # name -> registration, in registration order
BUILTIN_MODULE = "lrt_lab.run.schedules"
_builtins_loaded = False


def registered() -> dict[str, Registered]:
    """Every registered schedule by name, the built-ins first."""
    _load_builtins()
    return SCHEDULES


def _load_builtins() -> None:
    """Import the built-in schedules' module once (each registers itself), before any other
    registration, so the built-ins come first in every list of spellings."""
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        importlib.import_module(BUILTIN_MODULE)


def register_schedule(spelling: str, parse: Callable[[list[str]], Schedule] | None = None):
    """Class decorator: `name[:ARG...]` in spellings parses to the class. `parse(args)` builds the
    schedule from the arguments after the name (default: the dataclass fields in order, each
    converted by its type; as many as the spelling names, the bracketed ones optional)."""
    name, required, optional = _read_spelling(spelling)
    _load_builtins()

    def register(cls):
        cls.name = name
        parser = parse or _positional_parser(cls, name, required, optional)
        SCHEDULES[name] = Registered(spelling, cls, parser)
        return cls

    return register


def _read_spelling(spelling: str) -> tuple[str, int, int]:
    """(name, required argument count, optional argument count) of `name:A:B[:C]`."""
    m = re.fullmatch(r"([a-z_][a-z0-9_]*)((?::[^:\[\]]+)*)((?:\[:[^\]]+\])?)", spelling)
    if m is None:
        raise ValueError(
            f"spelling={spelling!r} is invalid; allowed: name[:ARG...][[:ARG...]] in lower case"
        )
    required = m.group(2).count(":")
    optional = m.group(3).count(":")
    return m.group(1), required, optional


def _positional_parser(cls, name: str, required: int, optional: int):
    fields = [f for f in dataclasses.fields(cls) if f.init]
    hints = typing.get_type_hints(cls)
    if required + optional > len(fields):
        raise ValueError(
            f"{cls.__name__}: its spelling names {required + optional} arguments, "
            f"its dataclass has {len(fields)} fields"
        )

    def parse(args: list[str]):
        if not required <= len(args) <= required + optional:
            raise ValueError(
                f"{name} takes {_count(required, optional)} argument(s), {len(args)} given"
            )
        return cls(*(_convert(hints[f.name], a) for f, a in zip(fields, args)))

    return parse


def _count(required: int, optional: int) -> str:
    return str(required) if not optional else f"{required} to {required + optional}"


def _convert(kind, text: str):
    if kind is int:
        return int(text)
    if kind is float:
        return float(text)
    return text


def spellings() -> str:
    """Every registered spelling, for messages and help: "onepass, interleaved:S, ...". Without
    importing the built-ins' module: their spellings as stated, then those registered outside."""
    if _builtins_loaded:
        return ", ".join(r.spelling for r in SCHEDULES.values())
    added = [r.spelling for name, r in SCHEDULES.items() if name not in BUILTIN_NAMES]
    return ", ".join([*BUILTIN_SPELLINGS, *added])


def _refusal(spec) -> ValueError:
    return ValueError(
        f"schedule={spec!r} is invalid; allowed: {spellings()}; {route(ENTRY_POINT_GROUP)}"
    )


def parse_schedule(spec: str) -> Schedule:
    """A registered spelling (`onepass`, `interleaved:S`, `fullseq:K[:w0,w1,...]`, `chunked:C`,
    `exact`, `fixedpoint:TOL:MAX[:G]`, `rollout[:G]`, or one registered outside) -> a schedule."""
    if not isinstance(spec, str) or not spec.strip():
        raise _refusal(spec)
    name, *args = spec.strip().lower().split(":")
    if name not in SCHEDULES and name not in BUILTIN_NAMES:
        _load_entry_points()
        if name not in SCHEDULES:  # refused without importing the built-ins (and torch)
            raise _refusal(spec)
    if name not in registered():
        raise _refusal(spec)
    try:
        return SCHEDULES[name].parse(args)
    except ValueError as e:
        raise ValueError(f"schedule={spec!r} is invalid: {e}; allowed: {spellings()}") from None


def split_spellings(values) -> list[str]:
    """The spellings in comma-separated lists (a command line's `--schedules a,b`): split at the
    commas that start a new spelling (a name), not at those between fullseq's weights
    (`fullseq:2:1,1,2,interleaved:3`)."""
    return [spec for value in values or () for spec in re.split(r",(?=\s*[A-Za-z_])", value)]


def _load_entry_points() -> None:
    """Import the modules installed packages name under `lrt_lab.schedules` (once)."""
    load_entry_points(ENTRY_POINT_GROUP)


def as_schedule(schedule) -> Schedule:
    """A schedule object (anything with the `Schedule` protocol's members), a spelling parsed by
    parse_schedule, or None (OnePass): the one resolver every entry point uses."""
    if schedule is None:
        return parse_schedule("onepass")
    if isinstance(schedule, str):
        return parse_schedule(schedule)
    if not isinstance(schedule, Schedule):
        missing = [m for m in PROTOCOL_MEMBERS if not hasattr(schedule, m)]
        raise ValueError(
            f"schedule={schedule!r} is invalid (it lacks {', '.join(missing)}); "
            "allowed: a schedule (lrt_lab.core.interface.Schedule, e.g. Interleaved(2)) "
            f"or a string: {spellings()}"
        )
    return schedule
