"""Validation at the boundary: every bad value becomes one ValueError naming the field and what is
allowed.

Why one module: the same kinds of mistake (a bool where an int belongs, NaN or inf in a float, a
string where a tuple belongs, a token id outside the vocabulary) reach the library through many
doors (configs, schedules, `run_schedule`, the Decoder, `generate`, sweep specs, the CLI). Each
door calls these helpers, so the checks and their messages are the same everywhere and a run
folder is never written for a value that would fail later.

`check_fields(obj)` validates a dataclass from its declared field types, plus two optional keys
of each field's `metadata`: `choices` (the allowed values) and `range` ((low, high), either None
for unbounded). Supported types: int (not bool), float (finite; ints accepted), bool, str, tuple
(a tuple or list), dict, unions with None, and nested dataclasses (validated by their own
constructors).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from functools import cache
from pathlib import Path

# Training seeds stay below this: evaluation sets are drawn from generators seeded at or above it
# (lrt_tasks.eval_sets.EVAL_SEED_OFFSET imports it), so no training batch can come from an
# evaluation
# stream, and every seed fits torch's int64 generator seeds.
TRAIN_SEED_LIMIT = 2**62

# torch.Generator.manual_seed accepts [-2**63, 2**64); sampling seeds (generate) use the
# non-negative part.
TORCH_SEED_LIMIT = 2**64


def fail(field_name: str, value, allowed: str) -> None:
    """Raise the project's ValueError: the field, the bad value, what is allowed."""
    shown = repr(value)
    if len(shown) > 80:  # a huge value (a tensor, a long list) must not drown the message
        shown = shown[:77] + "..."
    raise ValueError(f"{field_name}={shown} is invalid; allowed: {allowed}")


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value, low: int, high: int | None = None) -> None:
    ok = is_int(value) and value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        fail(name, value, f"an integer in [{low}, {high if high is not None else 'inf'}]")


def is_number(
    value,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> bool:
    """Whether value is a finite real number (int or float, not bool) in [low, high] (or open at
    either end)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        try:
            ok = math.isfinite(float(value))  # float(10**400) overflows: not a usable number
        except OverflowError:
            ok = False
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    return ok


def check_number(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """A finite real number (int or float, not bool) in [low, high] (or open at either end)."""
    if not is_number(value, low, high, low_open, high_open):
        lo = "" if low is None else f"{'>' if low_open else '>='} {low}"
        hi = "" if high is None else f"{'<' if high_open else '<='} {high}"
        bounds = " and ".join(b for b in (lo, hi) if b)
        fail(name, value, "a finite number" + (f" {bounds}" if bounds else ""))


def check_choice(name: str, value, choices) -> None:
    # `True in (1, 0)` is True in Python, so compare types as well as values
    if not any(value == c and type(value) is type(c) for c in choices):
        fail(name, value, ", ".join(repr(c) for c in choices))


def check_seed(name: str, value, limit: int = TRAIN_SEED_LIMIT) -> None:
    check_int(name, value, 0, limit - 1)


# Dataclasses from their declared types ---------------------------------------------------------
def _type_name(tp) -> str:
    return {
        int: "an integer",
        float: "a finite number",
        bool: "True or False",
        str: "a string",
        tuple: "a tuple or list",
        dict: "a dict with string keys",
    }.get(tp, getattr(tp, "__name__", str(tp)))


def _split_optional(tp):
    """(inner types, None allowed) of an annotation like `int | None` or `Optional[str]`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        return [a for a in args if a is not type(None)], type(None) in args
    return [tp], False


def _matches(value, tp) -> bool:
    base = typing.get_origin(tp) or tp
    if base is bool:
        return isinstance(value, bool)
    if base is int:
        return is_int(value)
    if base is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        try:
            return math.isfinite(float(value))
        except OverflowError:
            return False
    if base is tuple:
        return isinstance(value, (tuple, list))
    if base is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    if isinstance(base, type):
        return isinstance(value, base)
    return True  # an annotation this helper does not know: left to the class's own checks


@cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def check_fields(obj, prefix: str = "") -> None:
    """Validate every field of dataclass `obj` against its declared type and metadata.

    Errors name the field as `prefix + name` (e.g. prefix "memory." for MemoryConfig).
    """
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        name, value = prefix + f.name, getattr(obj, f.name)
        inner, optional = _split_optional(hints.get(f.name, typing.Any))
        if value is None:
            if not optional and inner != [typing.Any]:
                fail(name, value, " or ".join(_type_name(t) for t in inner))
            continue
        if not any(_matches(value, t) for t in inner):
            allowed = " or ".join(_type_name(typing.get_origin(t) or t) for t in inner)
            if "range" in f.metadata:
                low, high = f.metadata["range"]
                allowed += (
                    f" in [{'-inf' if low is None else low}, {'inf' if high is None else high}]"
                )
            if "choices" in f.metadata:
                allowed += ": " + ", ".join(repr(c) for c in f.metadata["choices"])
            fail(name, value, allowed + (" or None" if optional else ""))
        if is_int(value) and not -(2**63) <= value < 2**63:  # torch overflows beyond int64
            fail(name, value, "an integer that fits in 64 bits (torch's int64)")
        if "choices" in f.metadata:
            check_choice(name, value, tuple(f.metadata["choices"]))
        if "range" in f.metadata:
            low, high = f.metadata["range"]
            if is_int(value) and not any(t is float for t in inner):
                check_int(name, value, low if low is not None else -(2**63), high)
            else:
                check_number(name, value, low, high)


def check_out_dir(name: str, path) -> Path:
    """A directory that exists or can be made: no path component is a regular file."""
    if not isinstance(path, (str, Path)) or not str(path):
        fail(name, path, "a directory path")
    p = Path(path)
    for part in (p, *p.parents):
        if part.exists() and not part.is_dir():
            reason = "is a file" if part == p else f"{str(part)!r} is a file"
            raise ValueError(
                f"{name}={str(path)!r} is invalid ({reason}); allowed: a directory, "
                "existing or not yet made"
            )
    return p


def field_defaults(cls, skip=()) -> dict:
    """{field: default} of a dataclass without constructing one (a factory's value made fresh):
    what a parser shows and what an older stored config is read with."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out
