"""Which runs are seeds of one configuration, and how to name the groups so that they read apart.

The rule, used by `lrt-lab report`, `lrt_lab.analysis.seed_stats` and the dashboard alike:

- a run's **group** is its whole config (every `config.*` column of `load_runs`) except the seed
  and the run's name, so two runs are pooled as seeds only when nothing else about them differs;
- a group's **label** names what was trained (`method_label`: kind and schedule) and then the
  config fields whose values differ between the groups being compared, so the same store can
  read `lrt exact` alone, or `lrt exact | memory.source_layer=4` next to the default.

A **method** (`method_keys`) is narrower to write and wider to pool: what a run asked for (kind,
trainer, every training option); `method_labels` names each method by the options that tell it
apart from the others shown, each only where it departs from the default or from the value most
methods share (`lrt interleaved:2 | steps=3000` next to `lrt rollout:1`). `lrt-lab report` and the
dashboard's Compare page label their rows with it.

Labels are made for a set of groups, not for one run: filter the runs first, then label them.
Light on purpose (pandas only): the dashboard imports it without paying for torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

import pandas as pd

from lrt_lab.store.results import flatten_dict

# Config fields that name a run instead of configuring it: never part of a group.
IDENTITY_FIELDS = ("config.train.seed", "config.train.name")
# Fields that add a measurement at evaluation and leave the training bit for bit the same (the
# contraction monitor reads held-out data and draws from none of training's random streams;
# tests/test_run_groups.py trains with and without it): never part of a group, so a run written
# before the field existed stays a seed of its method.
MEASUREMENT_ONLY = ("config.train.eval_contraction",)
# Options that change neither the model trained nor what is measured, only when and where it is
# written down (checkpoints, evaluation cadence and lengths, the device, output paths): never part
# of a group, so a run of an older sweep that checkpointed less often, or evaluated at other
# lengths, stays a seed of its method. The figures they do change (an evaluation at a length one
# run has and another lacks) are missing for that run, never merged with another length's.
BOOKKEEPING = (
    "config.train.checkpoint_every",
    "config.train.eval_every",
    "config.train.eval_lengths",
    "config.train.eval_size",
    "config.train.eval_exact",
    "config.train.device",
    "config.train.compile",
    "config.train.threads",
    "config.train.out",
    "config.train.log",
    "config.train.log_every",
    "config.train.resume",
    "config.train.wandb_project",
    # how parameters are counted for a tokens-per-parameter budget: the steps it gives are their
    # own field, so a run trained for given steps is the same run under either convention
    "config.train.param_convention",
    # where the code of a schedule or mechanism of one's own was loaded from (--plugin): the
    # names it registered are in config.train.schedule and the model config
    "config.train.plugins",
)
NOT_GROUPING = IDENTITY_FIELDS + MEASUREMENT_ONLY + BOOKKEEPING

# Fields written from other fields (the schedule's cost, parameter counts, the overrides that were
# also applied to config.model, the model kind as given on the command line, the vocabulary): they
# stay in the group key (harmless, they follow the rest) but a label never needs them.
DERIVED_PREFIXES = (
    "config.params.",
    "config.train.overrides.",
    "config.schedule_cost",
    "config.forwards_per_token",
    "config.train.model",
    "config.train.schedule",
    "config.task_vocab_size",
    "config.model.vocab_size",
    "config.model.sequence_len",
)

# The order in which fields are considered for a label: a field is added only where it tells apart
# groups that the method and the fields before it do not (the task whenever it varies).
PRIMARY_FIELDS = (
    "config.train.task",
    "config.train.task_options.",
    "config.train.length",
    "config.train.preset",
    "config.model.n_layer",
    "config.model.n_embd",
    "config.train.steps",
)
SECONDARY_ORDER = ("config.model.memory.", "config.model.", "config.train.", "config.")

SHORT_NAMES = {
    "config.train.task": "",
    "config.train.length": "L",
    "config.train.preset": "",
    "config.model.n_layer": "layers",
    "config.model.n_embd": "d",
    "config.train.steps": "steps",
}

# The README's convention for "mean [interval]" cells: Student's t over seeds (lrt_results.stats).
INTERVAL_NOTE = "95% t-interval over seeds"


def method_label(row) -> str:
    """`transformer`, `lrt interleaved:2`, `loop:3`, ...: what was trained and how."""
    kind = row.get("config.kind", "?")
    sched = row.get("config.schedule", "onepass")
    kind = "?" if _missing(kind) else kind
    sched = "onepass" if _missing(sched) else sched
    return kind if sched == "onepass" and kind != "lrt" else f"{kind} {sched}"


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def canonical(v):
    """One spelling per value, so 4, 4.0 and "4" from different JSON files compare equal-ish:
    pandas turns an int column with a gap into floats."""
    if _missing(v):
        return None
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def config_columns(df: pd.DataFrame) -> list[str]:
    """The config columns that define a group (all `config.*` but the seed, the name, the
    measurement-only switches and the bookkeeping options)."""
    return sorted(c for c in df.columns if c.startswith("config.") and c not in NOT_GROUPING)


def group_keys(df: pd.DataFrame) -> pd.Series:
    """One string per run, equal for runs whose configs differ only by seed and name."""
    cols = config_columns(df)
    if df.empty:
        return pd.Series([], index=df.index, dtype=object)
    rows = df[cols].astype(object).to_numpy().tolist()  # plain Python values, read row by row
    return pd.Series(
        [
            json.dumps(dict(zip(cols, map(canonical, row))), sort_keys=True, default=str)
            for row in rows
        ],
        index=df.index,
        dtype=object,
    )


def group_name(config: dict, limit: int = 128) -> str:
    """A name for the group of a run with this config.json, computed from that run alone (each
    process of a sweep names its own run's group): what was trained, then a digest of the group
    key, so runs share the name exactly when `lrt-lab report` pools them as seeds. At most
    `limit` characters (W&B's bound on a group name)."""
    # as config.json reads back: tuples become lists
    config = json.loads(json.dumps(config, default=str))
    row = pd.DataFrame([flatten_dict(config, "config.")])
    digest = hashlib.sha1(group_keys(row).iloc[0].encode()).hexdigest()[:8]
    train = config.get("train", {})
    what = " ".join(
        str(v)
        for v in (
            train.get("task"),
            f"L{train.get('length')}",
            train.get("preset"),
            method_label(row.iloc[0]),
        )
        if v is not None
    )
    return f"{what[: limit - len(digest) - 1]} {digest}"


def _field_name(col: str) -> str:
    if col in SHORT_NAMES:
        return SHORT_NAMES[col]
    for prefix in ("config.train.task_options.", "config.model.", "config.train.", "config."):
        if col.startswith(prefix):
            return col[len(prefix) :]
    return col


def _text(v) -> str:
    v = canonical(v)
    return str(v)


def _ordered_candidates(cols: list[str]) -> tuple[list[str], list[str]]:
    """(primary, secondary) label fields, each in reading order; derived and identity fields left
    out."""
    usable = [
        c
        for c in cols
        if not c.startswith(DERIVED_PREFIXES) and c not in ("config.kind", "config.schedule")
    ]
    primary = [
        c
        for p in PRIMARY_FIELDS
        for c in usable
        if (c == p or (p.endswith(".") and c.startswith(p)))
    ]
    rest = [c for c in usable if c not in primary]
    secondary = [c for p in SECONDARY_ORDER for c in rest if c.startswith(p)]
    return primary, list(dict.fromkeys(secondary))


def group_labels(df: pd.DataFrame, exclude=()) -> pd.Series:
    """A label per run, the same for the runs of one group and different between groups.

    exclude: config columns a view shows on an axis of its own (e.g. config.model.n_layer on a
    depth heatmap); they are left out of the labels and runs that differ only there share a label.
    """
    if df.empty:
        return pd.Series([], index=df.index, dtype=object)
    cols = [c for c in config_columns(df) if c not in exclude]
    groups = df[cols].map(canonical).astype(object) if cols else pd.DataFrame(index=df.index)
    reps = groups.drop_duplicates()  # one row per group
    n_groups = len(reps)
    methods = df.apply(method_label, axis=1)
    parts = {i: [methods[i]] for i in df.index}
    primary, secondary = _ordered_candidates(cols)

    as_text = {}  # each column's values as text, built once: n_distinct runs per candidate field

    def n_distinct(fields):
        for c in fields:
            if c not in as_text:
                as_text[c] = groups[c].astype(str).tolist()
        return len(set(zip(methods.tolist(), *(as_text[c] for c in fields))))

    # The task always (a label without it reads as a claim about every task); every other field
    # only where it tells groups apart that the fields before it do not, so labels stay short.
    chosen = [
        c for c in primary[:1] if c == "config.train.task" and reps[c].astype(str).nunique() > 1
    ]
    for c in primary + secondary:
        if n_distinct(chosen) >= n_groups:
            break
        if c not in chosen and n_distinct(chosen + [c]) > n_distinct(chosen):
            chosen.append(c)
    chosen_values = {c: groups[c].tolist() for c in chosen}  # by position: no lookup per cell
    for pos, i in enumerate(df.index):
        for c in chosen:
            v = chosen_values[c][pos]
            if _missing(v):
                continue  # e.g. the memory settings of a plain transformer: nothing to say
            name = _field_name(c)
            parts[i].append(_text(v) if not name else f"{name}={_text(v)}")
    labels = pd.Series({i: " | ".join(p) for i, p in parts.items()}, dtype=object).reindex(df.index)
    # Dropping unset fields must not merge two groups: fall back to spelling them out.
    # derived ones follow the rest
    keys = group_keys(df[[c for c in cols if not c.startswith(DERIVED_PREFIXES)]])
    clash = labels.groupby(labels).transform(lambda s: keys[s.index].nunique() > 1)
    if clash.any():
        for i in df.index[clash.astype(bool)]:
            extra = [f"{_field_name(c) or c}=unset" for c in chosen if _missing(groups.at[i, c])]
            labels[i] = " | ".join([labels[i], *extra])
    return labels


# Method labels: what tells the methods of a selection apart --------------------------------------
# A study is the runs of one task trained at one length; a method is what a run asked for: the model
# kind, the trainer and every training option (preset, memory preset, overrides, task options,
# steps,
# ...), so the runs of a method differ only by seed and name. The model config follows from those
# options and the code that built it, and counts only where every run of a kind records a field: a
# run that lacks one was trained before the field existed (config.model.memory.update) and built
# what
# its default builds now, so it stays a seed of its method.

# Training options that only repeat config.kind / config.schedule, or name a run instead of
# configuring it.
ASKED_REPEATS = IDENTITY_FIELDS + ("config.train.model", "config.train.schedule")
# Reading order of the fields a label names after the method: what was learned (the task, the
# training length) first, where the labels shown span several.
LABEL_ORDER = (
    "config.train.task",
    "config.train.length",
    "config.train.preset",
    "config.train.memory_preset",
    "config.train.overrides.",
    "config.train.task_options.",
    "config.train.steps",
    "config.train.",
    "config.model.",
)
LABEL_PREFIXES = (
    "config.train.task_options.",
    "config.train.overrides.",
    "config.train.",
    "config.model.",
)


def method_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The config fields that define a method, one row per run, one spelling per value (None:
    unset)."""
    asked = [
        c
        for c in df.columns
        if c in ("config.kind", "config.schedule")
        or (c.startswith("config.train.") and c not in ASKED_REPEATS + NOT_GROUPING)
    ]
    columns = {c: _canonical_list(df[c]) for c in asked}
    if "config.train.memory_preset" in columns:
        # runs from before presets built the "paper" memory (memory_label); a model without memory
        # has none
        lrt = (df["config.kind"] == "lrt").tolist() if "config.kind" in df else [False] * len(df)
        columns["config.train.memory_preset"] = [
            ("paper" if v is None else v) if is_lrt else None
            for v, is_lrt in zip(columns["config.train.memory_preset"], lrt)
        ]
    model = [c for c in df.columns if c.startswith("config.model.")]
    if model:
        kinds = df["config.kind"].fillna("?") if "config.kind" in df else pd.Series("?", df.index)
        # a field counts where every run of its kind records it (one groupby for every field)
        recorded = df[model].notna().groupby(kinds).transform("all")
        for c in model:
            keep = recorded[c].tolist()
            if any(keep):
                columns[c] = [v if k else None for v, k in zip(_canonical_list(df[c]), keep)]
    return pd.DataFrame(columns, index=df.index, dtype=object)


def _canonical_list(column: pd.Series) -> list:
    """Python values, not a pandas dtype: 4 stays 4 (not 4.0) and an unset field stays None (not
    NaN)."""
    return [canonical(v) for v in column.astype(object).tolist()]


def method_keys(df: pd.DataFrame, frame: pd.DataFrame | None = None) -> pd.Series:
    """One string per run, equal for the runs of one method (method_frame's fields; `frame`: that
    frame, when the caller has it already)."""
    frame = method_frame(df) if frame is None else frame
    return pd.Series(
        [json.dumps(row, sort_keys=True, default=str) for row in frame.to_dict("records")],
        index=df.index,
        dtype=object,
    )


def method_labels(df: pd.DataFrame) -> pd.Series:
    """A short label per run, the same for the runs of one method: `lrt rollout:1`, then the
    training options whose values differ between the methods of `df` (the selection being
    compared), each named only where a method departs from the reference: unset (the default)
    where some method leaves the option unset, else the value most methods share (none on a tie).
    So `lrt interleaved:2 | steps=3000` next to `lrt rollout:1`, never the whole config. Options
    that change neither what is trained nor what is measured (BOOKKEEPING), then the model config,
    are named only where they alone tell methods apart."""
    if df.empty:
        return pd.Series([], index=df.index, dtype=object)
    frame = method_frame(df)
    keys = method_keys(df, frame)
    methods = frame.assign(_key=keys, _base=df.apply(method_label, axis=1).values).drop_duplicates(
        "_key"
    )
    varying = _ordered_label_fields(
        [
            c
            for c in frame.columns
            if c not in ("config.kind", "config.schedule")
            and len(set(map(str, methods[c].tolist()))) > 1
        ]
    )
    chosen = [c for c in varying if c not in BOOKKEEPING and not c.startswith("config.model.")]
    memo = {}  # what each field's column says, worked out once (_label asks per run and field)
    # in reading order: bookkeeping, then the model
    for c in (c for c in varying if c not in chosen):
        if _distinct_labels(methods, chosen, memo) == len(methods):
            break
        if _distinct_labels(methods, chosen + [c], memo) > _distinct_labels(methods, chosen, memo):
            chosen.append(c)
    labels = {r["_key"]: _label(r, chosen, methods, memo=memo) for _, r in methods.iterrows()}
    clashing = pd.Series(labels).duplicated(keep=False)
    for key in clashing[
        clashing
    ].index:  # e.g. a field unset in one and at its default in the other
        labels[key] = _label(
            methods[methods["_key"] == key].iloc[0], varying, methods, spell_out=True, memo=memo
        )
    return keys.map(labels)


def _distinct_labels(methods: pd.DataFrame, fields: list[str], memo: dict | None = None) -> int:
    return len({_label(r, fields, methods, memo=memo) for _, r in methods.iterrows()})


def _ordered_label_fields(cols: list[str]) -> list[str]:
    ordered = [
        c for p in LABEL_ORDER for c in cols if c == p or (p.endswith(".") and c.startswith(p))
    ]
    return list(dict.fromkeys(ordered))


def _unset(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _label(
    row, fields: list[str], methods: pd.DataFrame, spell_out: bool = False, memo: dict | None = None
) -> str:
    """memo: a dict kept across calls on the same `methods`, for the per-column facts."""
    memo = {} if memo is None else memo
    parts = [row["_base"]]
    kind = row["config.kind"] if "config.kind" in methods else None
    for c in fields:
        value = row[c]
        if ("unset", kind, c) not in memo:
            same_kind = methods["config.kind"] == kind if "config.kind" in methods else True
            memo[("unset", kind, c)] = bool(methods.loc[same_kind, c].isna().all())
        if memo[("unset", kind, c)]:
            # a field no method of this kind sets (the memory preset of a plain transformer)
            continue
        if not spell_out and _is_reference(value, methods[c], methods, memo):
            continue
        name = next((c[len(p) :] for p in LABEL_PREFIXES if c.startswith(p)), c)
        parts.append(f"{name}={'default' if _unset(value) else value}")
    return " | ".join(parts)


def _is_reference(
    value, column: pd.Series, methods: pd.DataFrame, memo: dict | None = None
) -> bool:
    """Whether `value` is the one a label leaves unsaid: unset (the default) where some method of
    the kinds the field applies to leaves it unset, else the value strictly most methods share."""
    memo = {} if memo is None else memo
    if ("reference", column.name) not in memo:
        if "config.kind" in methods:
            column = column[
                methods["config.kind"].isin(set(methods.loc[column.notna(), "config.kind"]))
            ]
        if column.isna().any():
            memo[("reference", column.name)] = ("unset", None)
        else:
            counts = column.map(str).value_counts()
            most_shared = len(counts) == 1 or counts.iloc[0] > counts.iloc[1]
            memo[("reference", column.name)] = (
                ("value", counts.index[0]) if most_shared else ("none", None)
            )
    reference, text = memo[("reference", column.name)]
    if reference == "unset":
        return _unset(value)
    return reference == "value" and not _unset(value) and str(value) == text


# Metric columns of a load_runs table --------------------------------------------------------------
def eval_columns(df: pd.DataFrame, prefix: str = "summary.eval.") -> list[str]:
    return sorted((c for c in df.columns if c.startswith(prefix)), key=_length_key)


def _length_key(col: str):
    m = re.search(r"(.*)@(\d+)$", col)
    return (m.group(1), int(m.group(2))) if m else (col, 0)


AT_TRAIN_LENGTH = "summary.eval.pos90_exact@train_length"


def with_train_length_metric(df: pd.DataFrame) -> pd.DataFrame:
    """Adds AT_TRAIN_LENGTH: each run's pos@90 (exact decoding) at its own training length, the
    one evaluation every run has when the store mixes tasks trained at different lengths."""
    df = df.copy()
    if "config.train.length" not in df.columns:
        return df
    values = []
    for _, row in df.iterrows():
        length = row["config.train.length"]
        col = f"summary.eval.pos90_exact@{int(length)}" if not pd.isna(length) else None
        values.append(row[col] if col in df.columns else math.nan)
    df[AT_TRAIN_LENGTH] = pd.to_numeric(pd.Series(values, index=df.index), errors="coerce")
    return df


def default_metric(df: pd.DataFrame) -> str:
    """The first pos@90 (exact decoding) column every run has; else pos@90 at each run's training
    length (AT_TRAIN_LENGTH, when every run has that); else the final training loss."""
    for col in [c for c in eval_columns(df) if "pos90_exact@" in c] + [
        AT_TRAIN_LENGTH,
        "summary.final_loss",
    ]:
        if col in df.columns and df[col].notna().all():
            return col
    raise ValueError(
        "metric: no summary column is set for every run; pass --metric with a summary column "
        f"(e.g. {', '.join(eval_columns(df)[:4]) or 'summary.final_loss'})"
    )


# One run per seed of a group -----------------------------------------------------------------
def duplicate_runs(df: pd.DataFrame) -> pd.Series:
    """For each run, the name of the run it repeats (None where it repeats none): runs of one
    method (method_keys: nothing but the seed, the name and the bookkeeping options tell them
    apart) with the same seed are one measurement made twice (a pilot's runs kept beside the grid
    that repeats them, say), and count once. The one kept: the one that finished last
    (summary.trained_by.finished; else the last by name)."""
    out = pd.Series(None, index=df.index, dtype=object)
    if df.empty or "config.train.seed" not in df.columns:
        return out
    keys = method_keys(df)
    seeds = df["config.train.seed"].map(canonical)
    finished = (
        pd.to_numeric(df["summary.trained_by.finished"], errors="coerce")
        if "summary.trained_by.finished" in df.columns
        else pd.Series(math.nan, index=df.index)
    )
    names = df["run"].astype(str) if "run" in df.columns else pd.Series(df.index.map(str), df.index)
    frame = pd.DataFrame({"key": keys, "seed": seeds.astype(str), "t": finished, "name": names})
    for _, g in frame[seeds.notna()].groupby(["key", "seed"], sort=False):
        if len(g) < 2:
            continue
        kept = g.sort_values(["t", "name"], na_position="first").index[-1]
        for i in g.index:
            if i != kept:
                out[i] = names[kept]
    return out


def one_run_per_seed(df: pd.DataFrame) -> pd.DataFrame:
    """`df` without the runs that repeat another (duplicate_runs); attrs["duplicates"]: (left out,
    kept) name pairs, for a note."""
    dup = duplicate_runs(df)
    out = df[dup.isna()]
    names = df["run"] if "run" in df.columns else pd.Series(df.index.map(str), df.index)
    out.attrs = {**df.attrs, "duplicates": [(names[i], dup[i]) for i in dup.index[dup.notna()]]}
    return out


def seed_groups(df: pd.DataFrame) -> pd.DataFrame:
    """The one grouping every table, page and figure uses, for the runs of `df` (a load_runs
    table): per run its group key (method_keys: what was asked for, up to the seed, the name and
    the bookkeeping options), its name (method_labels over the runs of its study, the task and
    training length it belongs to, so one group has one name whatever a view shows next to it),
    and the run it repeats (duplicate_runs). Columns key, group, duplicate_of."""
    out = pd.DataFrame(
        {"key": pd.Series(dtype=object), "group": pd.Series(dtype=object)}, index=df.index
    )
    if df.empty:
        return out.assign(duplicate_of=pd.Series(dtype=object))
    out["key"] = method_keys(df)
    study = [c for c in ("config.train.task", "config.train.length") if c in df.columns]
    parts = (
        [df]
        if not study
        else [g for _, g in df.groupby([df[c].astype(str) for c in study], sort=False)]
    )
    for part in parts:
        out.loc[part.index, "group"] = method_labels(part.dropna(axis=1, how="all")).values
    out["duplicate_of"] = duplicate_runs(df)
    return out
