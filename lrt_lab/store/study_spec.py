"""A study's spec: the `[study]` table of a sweep spec, parsed and checked before any run trains.

A sweep spec may carry one as its `[study]` table (docs/tour.md):

    [study]
    question = "Which trainer learns A5 at length 16, at matched compute?"
    primary = "pos90_exact@16"        # a key of summary.json["eval"], or a summary field
    lower_is_better = true
    budget = "matched forward+backward FLOPs"   # the budget rule, printed with the results
    decision = "..."                  # what result means what, written before the runs
    [[study.contrasts]]
    a = "transformer"                 # an arm: a method label (run_groups.method_label) ...
    b = "lrt interleaved:2 | steps=3000"   # ... narrowed by [train] fields where it must be
    metric = "pos90_exact@16"         # optional, default: primary
    paired = true                     # optional, default true: runs paired by seed

Optional: `time_to_event` and `time_axis` (the Kaplan-Meier rows), and `equal_step`, a step every
arm evaluates (its eval_every divides it, or it is the arm's last step): the contrasts are read a
second time from each run's evaluation at that step, at matched steps whatever the budget rule.

`parse_study` checks the table when the spec loads (lrt_lab.training.sweep.validate_spec), and
`check_arms` that every arm is the runs of exactly one config (up to the seed) of the grid the
spec expands to. Only the spec lives here: the sweep refuses a bad study before training, so the
lab needs it; the statistics that answer it (lrt_results.study) are built on the lab and never
imported by it. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from lrt_lab.store.events import TIME_AXES
from lrt_lab.store.results import flatten_dict
from lrt_lab.store.run_groups import (
    DERIVED_PREFIXES,
    canonical,
    config_columns,
    group_keys,
    method_label,
)

STUDY_KEYS = ("question", "primary", "lower_is_better", "budget", "decision", "contrasts")
CONTRAST_KEYS = ("a", "b", "metric", "paired")
TEXT_KEYS = ("question", "budget", "decision")
OPTIONAL_KEYS = ("time_to_event", "time_axis", "equal_step")
EVENT_MODES = ("exact", "parallel")
UNSET = "unset"  # an arm's `FIELD=unset`: runs that leave the field unset
TRAIN = "config.train."


@dataclass(frozen=True)
class Contrast:
    """Arm b against arm a on `metric`; the effect is B minus A."""

    a: str
    b: str
    metric: str
    paired: bool = True


@dataclass(frozen=True)
class Study:
    question: str
    primary: str
    lower_is_better: bool
    budget: str
    decision: str
    contrasts: tuple[Contrast, ...]
    # secondary: when pos@90 (of this decoding) first reached the training length, per arm
    # (Kaplan-Meier, censored at the budget) and per contrast (log-rank); None: not reported
    time_to_event: str | None = None
    time_axis: str = "step"  # step, compute_tokens or flops
    # secondary: the contrasts read again from every run's evaluation at this step (matched
    # steps); None: not reported
    equal_step: int | None = None


# Parsing -----------------------------------------------------------------------------------------
def parse_study(table) -> Study:
    """The `[study]` table of a sweep spec as a Study; ValueError naming the first bad field.
    The arms are checked against a grid by check_arms."""
    if not isinstance(table, dict):
        raise ValueError(f"study={table!r} is invalid; allowed: a TOML table ([study])")
    unknown = sorted(set(table) - set(STUDY_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise ValueError(
            f"[study] {unknown}: unknown key; allowed: {', '.join(STUDY_KEYS)} "
            "([[study.contrasts]] for the contrasts)"
        )
    for key in STUDY_KEYS:
        if key not in table:
            raise ValueError(f"[study] {key}: required; {_ALLOWED[key]}")
    for key in TEXT_KEYS:
        _text_field(f"study.{key}", table[key])
    primary = _metric_field("study.primary", table["primary"])
    if not isinstance(table["lower_is_better"], bool):
        raise ValueError(
            f"study.lower_is_better={table['lower_is_better']!r} is invalid; "
            f"{_ALLOWED['lower_is_better']}"
        )
    items = table["contrasts"]
    if not isinstance(items, list) or not items:
        raise ValueError(f"study.contrasts={items!r} is invalid; {_ALLOWED['contrasts']}")
    contrasts = tuple(_parse_contrast(i, item, primary) for i, item in enumerate(items))
    seen = {}
    for i, c in enumerate(contrasts):
        key = (c.a, c.b, c.metric)
        if key in seen:
            raise ValueError(
                f"study.contrasts[{i}] repeats study.contrasts[{seen[key]}] ({c.b} vs {c.a} on "
                f"{c.metric}); allowed: each contrast once"
            )
        seen[key] = i
    event = table.get("time_to_event")
    if event is not None and event not in EVENT_MODES:
        raise ValueError(
            f"study.time_to_event={event!r} is invalid; allowed: "
            f"{', '.join(map(repr, EVENT_MODES))} (pos@90 of that decoding reaching the length)"
        )
    axis = table.get("time_axis", "step")
    if axis not in TIME_AXES:
        raise ValueError(
            f"study.time_axis={axis!r} is invalid; allowed: {', '.join(map(repr, TIME_AXES))}"
        )
    step = table.get("equal_step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 1):
        raise ValueError(
            f"study.equal_step={step!r} is invalid; allowed: a positive integer, a step at which "
            "every arm evaluates"
        )
    return Study(
        time_to_event=event,
        time_axis=axis,
        equal_step=step,
        question=table["question"].strip(),
        primary=primary,
        lower_is_better=table["lower_is_better"],
        budget=table["budget"].strip(),
        decision=table["decision"].strip(),
        contrasts=contrasts,
    )


_ALLOWED = {
    "question": "allowed: a non-empty string, the question the study answers",
    "primary": "allowed: a metric key of the runs' summary.json eval record (e.g. pos90_exact@16) "
    "or a summary field (e.g. final_loss)",
    "lower_is_better": "allowed: true or false (the direction of the primary metric)",
    "budget": "allowed: a non-empty string, the budget rule the arms were matched by",
    "decision": "allowed: a non-empty string, written before the runs: what result means what",
    "contrasts": "allowed: a non-empty list of [[study.contrasts]] tables with a, b (arms), "
    "optional metric and paired",
}


def _text_field(where: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        key = where.rsplit(".", 1)[-1]
        raise ValueError(f"{where}={value!r} is invalid; {_ALLOWED[key]}")
    return value


def _metric_field(where: str, value) -> str:
    if not isinstance(value, str) or not value.strip() or any(ch.isspace() for ch in value):
        raise ValueError(f"{where}={value!r} is invalid; {_ALLOWED['primary']}")
    return value


def _parse_contrast(i: int, item, primary: str) -> Contrast:
    where = f"study.contrasts[{i}]"
    if not isinstance(item, dict):
        raise ValueError(f"{where}={item!r} is invalid; allowed: a table with a, b, metric, paired")
    unknown = sorted(set(item) - set(CONTRAST_KEYS))
    if unknown:
        raise ValueError(
            f"{where} {unknown}: unknown key; allowed: {', '.join(CONTRAST_KEYS)} "
            "(metric and paired optional)"
        )
    for arm in ("a", "b"):
        if arm not in item:
            raise ValueError(f"{where}.{arm}: required; allowed: {ARM_HELP}")
        parse_arm(item[arm], f"{where}.{arm}")
    if _normal_arm(item["a"]) == _normal_arm(item["b"]):
        raise ValueError(
            f"{where}: a and b are the same arm ({item['a']!r}); allowed: two different arms"
        )
    metric = _metric_field(f"{where}.metric", item.get("metric", primary))
    paired = item.get("paired", True)
    if not isinstance(paired, bool):
        raise ValueError(
            f"{where}.paired={paired!r} is invalid; allowed: true (runs paired by seed) or false"
        )
    return Contrast(a=item["a"].strip(), b=item["b"].strip(), metric=metric, paired=paired)


# Arms --------------------------------------------------------------------------------------------
ARM_HELP = (
    "a method label as the report names it (transformer, lrt interleaved:2, loop:3, ...), "
    "optionally narrowed by ' | FIELD=VALUE' on [train] fields (e.g. 'lrt exact | steps=3000', "
    "'transformer | task=a5_prefix | overrides.n_layer=4'; VALUE unset: a field left unset)"
)


def parse_arm(arm, where: str = "arm") -> tuple[str, dict[str, str]]:
    """'lrt exact | steps=3000' -> ("lrt exact", {"steps": "3000"})."""
    if not isinstance(arm, str) or not arm.strip():
        raise ValueError(f"{where}={arm!r} is invalid; allowed: {ARM_HELP}")
    method, *parts = [p.strip() for p in arm.split("|")]
    fields = {}
    for part in parts:
        field, sep, value = part.partition("=")
        field, value = field.strip(), value.strip()
        if not method or not sep or not field or not value or field in fields:
            raise ValueError(f"{where}={arm!r} is invalid; allowed: {ARM_HELP}")
        fields[field.removeprefix("train.")] = value
    return " ".join(method.split()), fields


def _normal_arm(arm: str) -> tuple:
    method, fields = parse_arm(arm)
    return method, tuple(sorted(fields.items()))


def _same_value(cell, text: str) -> bool:
    v = canonical(cell)
    if text == UNSET:
        return v is None
    if v is None:
        return False
    if str(v) == text or (isinstance(v, bool) and str(v).lower() == text.lower()):
        return True
    try:
        return not isinstance(v, (bool, str)) and float(v) == float(text)
    except (TypeError, ValueError):
        return False


def arm_mask(df: pd.DataFrame, arm: str) -> pd.Series:
    """Which runs of a load_runs table (or grid_frame) belong to `arm`."""
    method, fields = parse_arm(arm)
    if df.empty:
        return pd.Series(False, index=df.index, dtype=bool)
    mask = df.apply(method_label, axis=1) == method
    for field, text in fields.items():
        col = TRAIN + field
        cells = df[col] if col in df.columns else pd.Series(None, index=df.index, dtype=object)
        mask &= cells.map(lambda v, text=text: _same_value(v, text)).astype(bool)
    return mask


def grid_frame(grid) -> pd.DataFrame:
    """The configs of a grid (config.json-shaped dicts) as a load_runs-style table of config.*
    columns; a DataFrame is returned as it is."""
    if isinstance(grid, pd.DataFrame):
        return grid
    return pd.DataFrame(
        [flatten_dict(json.loads(json.dumps(c, default=str)), "config.") for c in grid]
    )


def _differing_fields(rows: pd.DataFrame) -> list[str]:
    """'task (a5_prefix, z60_prefix)' for each config field whose value differs between `rows`,
    the fields an arm can be narrowed by ([train]) first."""
    out = []
    cols = [c for c in config_columns(rows) if not c.startswith(DERIVED_PREFIXES)]
    cols = sorted(cols, key=lambda c: (not c.startswith(TRAIN), c))
    for c in cols:
        values = sorted({str(canonical(v)) for v in rows[c].astype(object)})
        if len(values) > 1:
            name = c.removeprefix(TRAIN)
            shown = ", ".join(UNSET if v == "None" else v for v in values[:4])
            out.append(f"{name} ({shown}{', ...' if len(values) > 4 else ''})")
    return out


def check_one_config(rows: pd.DataFrame, where: str, arm: str, what: str) -> None:
    """An arm is the runs (seeds) of one config: ValueError naming what differs when not."""
    if rows.empty or group_keys(rows).nunique() <= 1:
        return
    differ = _differing_fields(rows)
    train = [d.split(" (")[0] for d in differ if f"{TRAIN}{d.split(' (')[0]}" in rows.columns]
    if train:
        values = rows[TRAIN + train[0]].map(canonical).dropna()
        example = str(values.iloc[0]) if len(values) else UNSET
        hint = f"narrow the arm, e.g. '{arm} | {train[0]}={example}'"
    else:  # the same [train] fields, built into different models (runs of older code)
        hint = "keep the runs of one build of the config in the store"
    raise ValueError(
        f"{where}={arm!r} matches runs of {group_keys(rows).nunique()} configs of {what} (they "
        f"differ in {'; '.join(differ[:3]) or 'derived fields only'}); allowed: one config up "
        f"to the seed: {hint}"
    )


def check_arms(study: Study, grid) -> None:
    """Every arm of the study matches the runs of exactly one config of the grid (up to the seed),
    else ValueError naming the arm. grid: the configs a spec expands to, config.json-shaped
    ({"train": {...}, "kind", "schedule"}), or a load_runs-style DataFrame."""
    grid = grid_frame(grid)
    labels = sorted(set(grid.apply(method_label, axis=1))) if not grid.empty else []
    for i, c in enumerate(study.contrasts):
        for side in ("a", "b"):
            arm = getattr(c, side)
            where = f"study.contrasts[{i}].{side}"
            rows = grid[arm_mask(grid, arm)]
            if rows.empty:
                raise ValueError(
                    f"{where}={arm!r} matches no run of the grid; allowed: an arm of the grid "
                    f"({', '.join(labels) or 'none'}), optionally narrowed by ' | FIELD=VALUE'"
                )
            check_one_config(rows, where, arm, "the grid")
            if study.equal_step is not None:
                _check_evaluates_at(rows, study.equal_step, f"{where}={arm!r}")


def _check_evaluates_at(rows: pd.DataFrame, step: int, where: str) -> None:
    """The arm's config evaluates at `step`: it trains that long and its eval_every divides it,
    or `step` is its last step (a run always evaluates at its end)."""
    row = rows.iloc[0]
    steps, every = int(row[TRAIN + "steps"]), row.get(TRAIN + "eval_every")
    every = int(every) if every is not None and not pd.isna(every) else None
    if step == steps or (step < steps and every and step % every == 0):
        return
    raise ValueError(
        f"study.equal_step={step} is invalid: {where} does not evaluate at step {step} (steps "
        f"{steps}, eval_every {every}); allowed: a step every arm evaluates (a multiple of its "
        "eval_every up to its steps, or its last step)"
    )
