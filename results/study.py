"""A study's answer: every contrast of a `[study]` (lrt_lab.store.study_spec) from a run store.

`study_table` computes every contrast (lrt_results.contrasts: effect B minus A, bootstrap
interval, permutation p, Holm over the study's contrasts, power) from a run store, and
`print_study` is `lrt-lab report STORE --study SPEC.toml`. The spec's names (Study, parse_study,
check_arms, ...) are importable from here too. Torch-free.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from lrt_lab.store.events import reach_times
from lrt_lab.store.markdown import markdown_lines
from lrt_lab.store.metrics import metric_info
from lrt_lab.store.results import evaluations, first_names, load_runs
from lrt_lab.store.run_groups import canonical
from lrt_lab.store.study_spec import (
    EVENT_MODES,
    Contrast,
    Study,
    arm_mask,
    check_arms,
    check_one_config,
    grid_frame,
    parse_arm,
    parse_study,
)
from lrt_results.contrasts import (
    ALPHA,
    MAX_PAIRS,
    contrast,
    decision_n_for_power,
    decision_power,
    holm,
    kaplan_meier,
    logrank,
)

COLUMNS = [
    "a",
    "b",
    "metric",
    "paired",
    "n_a",
    "n_b",
    "pairs",
    "mean_a",
    "mean_b",
    "effect",
    "ci_low",
    "ci_high",
    "d",
    "p",
    "p_holm",
    "p_min",
    "power",
    "n_for_power",
    "decided",
    "power_t",
]


# The table ---------------------------------------------------------------------------------------
def metric_column(df: pd.DataFrame, metric: str) -> str | None:
    """The runs-table column of a study metric: summary.eval.KEY, else summary.KEY (a full
    summary.* column name is taken as it is); None when no run has it."""
    candidates = (
        [metric]
        if metric.startswith("summary.")
        else [f"summary.eval.{metric}", f"summary.{metric}"]
    )
    return next((c for c in candidates if c in df.columns), None)


def at_step(df: pd.DataFrame, metric: str, step: int) -> pd.Series:
    """Each run's `metric` from its evaluation at `step` (metrics.jsonl), NaN where it has none;
    aligned with df's index."""
    evals = evaluations(df, metric)
    hit = evals[evals["step"] == step].groupby("row")["value"].last()
    return hit.reindex(df.index).astype(float)


def _complete_runs(runs) -> pd.DataFrame:
    df = load_runs(runs) if isinstance(runs, (str, Path)) else runs
    if not isinstance(df, pd.DataFrame):
        raise ValueError(
            f"runs={runs!r} is invalid; allowed: a run store directory or a load_runs DataFrame"
        )
    if "status" in df.columns:
        df = df[df["status"] == "complete"]
    return df


def _by_seed(rows: pd.DataFrame, column: str, where: str, arm: str) -> pd.Series:
    """The arm's metric per seed (NaN where a run has none); one run per seed."""
    if rows.empty:
        return pd.Series([], dtype=float)
    seeds = rows["config.train.seed"].map(canonical)
    twice = seeds[seeds.duplicated(keep=False)]
    if len(twice):
        names = rows.loc[twice.index, "run"] if "run" in rows else twice.index.map(str)
        raise ValueError(
            f"{where}={arm!r} has more than one run of seed {twice.iloc[0]} "
            f"({first_names(list(names))}); allowed: one run per seed in an arm"
        )
    values = pd.to_numeric(rows[column], errors="coerce")
    return pd.Series(values.to_numpy(dtype=float), index=list(seeds), dtype=float)


def study_table(
    runs,
    study: Study,
    run_names=None,
    n_resamples: int = 9999,
    seed: int = 0,
    step: int | None = None,
) -> pd.DataFrame:
    """One row per contrast of the study, from a run store (a path) or a load_runs DataFrame.

    Only complete runs count; run_names (e.g. the names of the spec's grid) restricts them further.
    Columns: a, b, metric, paired; n_a, n_b (runs with a value; paired: both are the pairs); pairs
    (seeds with a value in both arms, paired contrasts only); mean_a, mean_b (over those runs);
    effect (B minus A: mean_b - mean_a, the mean of the per-seed differences when paired) with its
    95% percentile bootstrap interval ci_low, ci_high; d (Cohen's d; paired: d_z); p (two-sided
    permutation test); p_holm (Holm-adjusted over the study's contrasts); p_min (the smallest p the
    test can give at these n); power (of the decision itself: the permutation test with Holm
    over the study's contrasts at alpha 0.05, simulated at every contrast's observed d,
    contrasts.decision_power); n_for_power (pairs, or seeds per arm, at which that power reaches
    0.8, every contrast at that n; NaN beyond contrasts.MAX_PAIRS); decided (p_holm <= 0.05);
    power_t (a two-sided unadjusted t-test's power at these n, for comparison only).
    step: read every metric from the runs' evaluations at that step (at_step) instead of their
    final summaries: the contrasts at matched steps (Study.equal_step).
    attrs["notes"]: one line per thing left out (seeds in one arm only, runs without the metric).
    """
    df = _complete_runs(runs)
    if run_names is not None:
        df = df[df["run"].isin(set(run_names))] if "run" in df.columns else df.iloc[:0]
    rows, notes = [], []
    stepped: dict[str, pd.Series] = {}  # metric: its value at `step` in the arms' runs read so far
    for i, c in enumerate(study.contrasts):
        where = f"study.contrasts[{i}]"
        column = _contrast_column(df, c, where)
        arms = {
            side: _arm_values(df, c, side, column, where, step, stepped, notes)
            for side in ("a", "b")
        }
        a, b, pairs = _paired_arms(c, arms["a"].dropna(), arms["b"].dropna(), notes)
        stats = contrast(a.values, b.values, c.paired, n_resamples=n_resamples, seed=seed)
        rows.append(
            {"a": c.a, "b": c.b, "metric": c.metric, "paired": c.paired, "pairs": pairs, **stats}
        )
    table = _with_decision(pd.DataFrame(rows), seed)
    missing = [] if run_names is None else sorted(set(run_names) - set(df.get("run", [])))
    table.attrs.update(notes=list(dict.fromkeys(notes)), runs=len(df), missing=missing)
    return table


def _contrast_column(df: pd.DataFrame, c: Contrast, where: str) -> str | None:
    """The runs-table column of the contrast's metric; ValueError when no run has it."""
    column = metric_column(df, c.metric)
    if column is None and not df.empty:
        keys = sorted(k.removeprefix("summary.eval.") for k in df if k.startswith("summary.eval."))
        raise ValueError(
            f"{where}.metric={c.metric!r} is invalid: no run of the store has it; allowed: an "
            f"evaluation key ({', '.join(keys[:6]) or 'none'}) or a summary field (final_loss, "
            "...)"
        )
    return column


def _arm_values(df, c: Contrast, side: str, column, where: str, step, stepped, notes) -> pd.Series:
    """One arm's metric per seed (at `step` when given: `stepped` caches each run's value across
    contrasts), with a note for an arm without runs or runs without the metric."""
    arm = getattr(c, side)
    sel = df[arm_mask(df, arm)] if not df.empty else df
    check_one_config(sel, f"{where}.{side}", arm, "the store")
    if step is not None and not sel.empty:
        # each run's metrics.jsonl is read once per metric, however many contrasts share its arm
        known = stepped.get(c.metric, pd.Series(dtype=float))
        new = sel.index.difference(known.index)
        if len(new):
            known = stepped[c.metric] = pd.concat([known, at_step(sel.loc[new], c.metric, step)])
        sel = sel.assign(**{column: known.loc[sel.index]})
    values = _by_seed(sel, column, f"{where}.{side}", arm)
    if sel.empty:
        notes.append(f"{arm}: no complete runs")
    elif values.isna().any():
        at = "" if step is None else f" at step {step}"
        notes.append(
            f"{arm}: {int(values.isna().sum())} run(s) without {c.metric}{at}, not counted"
        )
    return values


def _paired_arms(c: Contrast, a: pd.Series, b: pd.Series, notes: list) -> tuple:
    """(a, b, pairs): a paired contrast keeps the seeds both arms have (a note names the rest)."""
    if not c.paired:
        return a, b, None
    common = sorted(set(a.index) & set(b.index))
    for side, s in (("a", a), ("b", b)):
        alone = sorted(set(s.index) - set(common))
        if alone:
            notes.append(
                f"{getattr(c, side)} vs {getattr(c, 'b' if side == 'a' else 'a')}: "
                f"seed(s) {', '.join(str(x) for x in alone)} only in "
                f"{getattr(c, side)}, left out of the pairs"
            )
    return a[common], b[common], len(common)


def _with_decision(table: pd.DataFrame, seed: int) -> pd.DataFrame:
    """The contrasts' table with Holm, the decision, and its power and pairs needed."""
    table["pairs"] = table["pairs"].astype("Int64")  # <NA> for an unpaired contrast
    table["p_holm"] = holm(table["p"])
    table["decided"] = table["p_holm"] <= ALPHA
    # power and the pairs needed of the decision itself (permutation test, Holm over the study's
    # contrasts), simulated at each contrast's observed d; contrast()'s t-test power is kept as
    # power_t for comparison
    family = [
        {
            "d": r["d"],
            "paired": bool(r["paired"]),
            "n": r["pairs"] if r["paired"] else None,
            "n_a": r["n_a"],
            "n_b": r["n_b"],
        }
        for _, r in table.iterrows()
    ]
    table["power_t"] = table["power"]
    table["power"] = decision_power(family, ALPHA, seed=seed)
    table["n_for_power"] = [
        decision_n_for_power(family, i, alpha=ALPHA, seed=seed) for i in range(len(family))
    ]
    return table[COLUMNS]


# Printing ----------------------------------------------------------------------------------------
def _num(v, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.{digits}g}"


def verdict(row, study: Study) -> str:
    """One line in words: how B compares with A, and whether that is decided at alpha 0.05 after
    Holm (else the power the contrast had, and the seeds per arm it would need)."""
    a, b = row["a"], row["b"]
    n = (
        f"{row['pairs']} pairs"
        if row["paired"]
        else f"unpaired, {row['n_a']} and {row['n_b']} runs"
    )
    head = f"{b} vs {a} ({row['metric']}, {n})"
    if math.isnan(row["effect"]):
        return f"{head}: no comparison ({row['n_a']} run(s) of A, {row['n_b']} of B with a value)"
    e, lo, hi = row["effect"], row["ci_low"], row["ci_high"]
    if e == 0:
        words = f"B equal to A [{_num(lo)}, {_num(hi)}]"
    else:
        # the interval of the size of the difference, in the direction named (B - A flipped)
        lo, hi = (lo, hi) if e > 0 else (-hi, -lo)
        words = (
            f"B {'higher' if e > 0 else 'lower'} than A by {_num(abs(e))} [{_num(lo)}, {_num(hi)}]"
        )
        if row["decided"] and row["metric"] == study.primary:
            better = (e < 0) == study.lower_is_better
            words += f" (B {'better' if better else 'worse'}: {_direction(study)})"
    words += f", p_holm={_num(row['p_holm'], 3)}"
    floor = floor_note(row, len(study.contrasts))
    if floor:
        words += f" ({floor})"
    if row["decided"]:
        return f"{head}: {words}, decided at alpha {ALPHA} after Holm"
    n = row["pairs"] if row["paired"] else f"{row['n_a']}+{row['n_b']}"
    unit = "pairs" if row["paired"] else "seeds per arm"
    why = [
        f"power {_num(row['power'], 2)} of this decision (permutation test, Holm over "
        f"{len(study.contrasts)}) for the observed effect at n={n}"
    ]
    needed = row["n_for_power"]
    if isinstance(needed, (int, float)) and not math.isnan(needed):
        why.append(f"about {int(needed)} {unit} needed for power 0.8")
    elif not math.isnan(row["d"]) and row["d"] != 0:
        why.append(f"more than {MAX_PAIRS} {unit} needed for power 0.8")
    elif not math.isnan(row["d"]) and row["d"] == 0:
        why.append("no observed effect to size a study by")
    m = len(study.contrasts)
    if not math.isnan(row["p_min"]) and row["p_min"] * m > ALPHA:
        why.append(
            f"at n={n} no permutation test can reach p_holm <= {ALPHA} (smallest p "
            f"{_num(row['p_min'], 3)}{f' x {m} contrasts' if m > 1 else ''})"
        )
    return f"{head}: {words}, not decided ({'; '.join(why)})"


def floor_note(row, m: int) -> str:
    """Where the exact test's floor binds: "p = 0.0078 is the smallest p at 8 pairs; 0.031 after
    Holm over 4", when the contrast's p is that floor (its Holm-adjusted p can then be no smaller
    than the floor times the contrasts left); "" elsewhere."""
    p, floor = row["p"], row["p_min"]
    if any(_unset_number(v) for v in (p, floor)) or p > floor * (1 + 1e-9):
        return ""
    n = f"{row['pairs']} pairs" if row["paired"] else f"{row['n_a']}+{row['n_b']} runs"
    after = f"; {_num(min(1.0, floor * m), 2)} after Holm over {m}" if m > 1 else ""
    return f"p = {_num(floor, 2)} is the smallest p at {n}{after}"


def _unset_number(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA


def _direction(study: Study) -> str:
    return "lower is better" if study.lower_is_better else "higher is better"


def format_study_table(table: pd.DataFrame, fmt: str = "table") -> str:
    """The table for a terminal (fmt "table") or a page ("md"): short labels, 4 significant
    digits."""
    if table.empty:
        return "(no contrasts)"
    shown = pd.DataFrame(
        {
            "A": table["a"],
            "B": table["b"],
            "metric": table["metric"],
            "pairing": [
                f"{p} pairs" if paired else "unpaired"
                for p, paired in zip(table["pairs"], table["paired"])
            ],
            "n_a": table["n_a"],
            "n_b": table["n_b"],
            "mean_a": table["mean_a"].map(_num),
            "mean_b": table["mean_b"].map(_num),
            "B-A": table["effect"].map(_num),
            "95% CI": [
                f"[{_num(lo)}, {_num(hi)}]" for lo, hi in zip(table["ci_low"], table["ci_high"])
            ],
            "d": table["d"].map(lambda v: _num(v, 3)),
            "p": table["p"].map(lambda v: _num(v, 3)),
            "p_holm": table["p_holm"].map(lambda v: _num(v, 3)),
            "power": table["power"].map(lambda v: _num(v, 2)),
        }
    )
    return _rendered(shown, fmt)


def format_event_table(events: pd.DataFrame, fmt: str = "table") -> str:
    """event_table for a terminal (fmt "table") or a page ("md"): per contrast, how many runs of
    each arm reached the length, their Kaplan-Meier medians (NaN: fewer than half did) and the
    log-rank p."""
    if events.empty:
        return "(no contrasts)"
    shown = pd.DataFrame(
        {
            "A": events["a"],
            "B": events["b"],
            "decoding": events["decoding"],
            "reached A": events["reached_a"],
            "reached B": events["reached_b"],
            "median A": events["median_a"].map(_num),
            "median B": events["median_b"].map(_num),
            "p log-rank": events["p_logrank"].map(lambda v: _num(v, 3)),
        }
    )
    return _rendered(shown, fmt)


def _rendered(shown: pd.DataFrame, fmt: str) -> str:
    if fmt == "md":
        rows = shown.astype(str).to_numpy().tolist()
        return "\n".join(markdown_lines(list(shown.columns), rows))
    if fmt != "table":
        raise ValueError(f"fmt={fmt!r} is invalid; allowed: table, md")
    shown = shown.copy()
    for col in shown.columns:  # every column reads left-aligned under its name
        text = shown[col].astype(str)
        shown[col] = text.str.ljust(max(text.str.len().max(), len(col)))
    return shown.to_string(index=False, justify="left")


def study_lines(
    runs,
    study: Study,
    table: pd.DataFrame,
    run_names=None,
    fmt: str = "table",
    events=None,
    flat=None,
):
    """What `lrt-lab report --study` prints after the study's header, as lines of a terminal
    (fmt "table") or of a page ("md"): study_table's `table`, what its columns mean, a verdict
    per contrast, its notes, last_interval_table and, with a time_to_event, the event table
    (`flat` and `events`: those two tables when the caller has computed them already)."""
    lines = [
        format_study_table(table, fmt),
        "",
        "B-A: B minus A (paired: mean of the per-seed differences); 95% CI: percentile "
        "bootstrap; d: Cohen's d (paired: d_z); p: two-sided permutation test; p_holm: "
        f"Holm-adjusted over the {len(table)} contrast(s); power: of this decision (the "
        f"permutation test, Holm over the {len(table)} contrast(s), at alpha {ALPHA}), "
        "simulated at every contrast's observed d at these n",
        *(f"- {verdict(row, study)}" for _, row in table.iterrows()),
        *(f"  note: {note}" for note in table.attrs["notes"]),
    ]
    if flat is None:
        flat = last_interval_table(runs, study, run_names=run_names)
    if not flat.empty:
        lines += [
            "",
            "Whether the budget let each arm flatten: its metric at the end and the change over "
            "each run's last evaluation interval, means over its runs; a run still improving at "
            "its end is censored by its budget (its final value bounds what more steps would "
            "give); a run regressed when its best came at least half way from its first "
            "evaluation to the metric's best possible value (0 for a cross-entropy, the length "
            "for pos@90) and it ended having lost more than half of what it gained (best: the "
            "mean of the runs' best values):",
            *([""] if fmt == "md" else []),
            format_last_interval_table(flat, fmt),
        ]
    if study.equal_step is not None:
        steps = study_table(runs, study, run_names=run_names, step=study.equal_step)
        lines += [
            "",
            f"The same contrasts at matched steps: every run's evaluation at step "
            f"{study.equal_step} (each arm's learning-rate schedule is at its own point there):",
            *([""] if fmt == "md" else []),
            format_study_table(steps, fmt),
            *(f"- {verdict(row, study)}" for _, row in steps.iterrows()),
            *(f"  note: {note}" for note in steps.attrs["notes"]),
        ]
    if study.time_to_event is not None:
        if events is None:
            events = event_table(runs, study, run_names=run_names)
        lines += [
            "",
            f"Time until pos@90 first reached the training length, in {study.time_axis}, in the "
            "decoding each contrast's metric scores (Kaplan-Meier median; runs that never did are "
            "censored at their last evaluation), and a log-rank test per contrast:",
            *([""] if fmt == "md" else []),  # a page's table needs a blank line above it
            format_event_table(events, fmt),
        ]
    return lines


def print_study(runs, study: Study, run_names=None, store_name: str | None = None) -> pd.DataFrame:
    """Print the study (question, budget rule, decision rule), its table and a verdict per contrast
    (`lrt-lab report STORE --study SPEC.toml`); returns study_table's table."""
    table = study_table(runs, study, run_names=run_names)
    print(f"Study: {study.question}")
    print(f"Budget rule: {study.budget}")
    print(f"Decision rule (stated before the runs): {study.decision}")
    print(f"Primary metric: {study.primary} ({_direction(study)})")
    if run_names is not None:
        names = list(dict.fromkeys(run_names))
        where = f" in {store_name}" if store_name else ""
        missing = table.attrs["missing"]
        print(
            f"Runs: {table.attrs['runs']} of the spec's {len(names)} complete{where}"
            + (f" (not complete: {first_names(missing)})" if missing else "")
        )
    print()
    print("\n".join(study_lines(runs, study, table, run_names)))
    return table


def _require_time_to_event(study: Study) -> None:
    if study.time_to_event is None:
        raise ValueError("the study has no time_to_event; allowed: a [study] that names one")


def arm_reach_times(runs, study: Study, run_names=None) -> dict[str, pd.DataFrame]:
    """{arm: reach_times of its complete runs} for every arm the study's contrasts name (in the
    order they first appear): when pos@90 of the study's time_to_event decoding first reached the
    training length, on its time axis."""
    _require_time_to_event(study)
    return {
        arm: reach_times(rows, study.time_to_event, study.time_axis)
        for arm, rows in arm_runs(runs, study, run_names).items()
    }


def event_decoding(contrast: Contrast, study: Study) -> str:
    """The decoding whose pos@90 a contrast's time-to-event row times: the one its metric scores
    (ce_parallel@16 -> parallel), else the study's time_to_event. A row that scores the parallel
    forward would otherwise be timed on exact decoding and repeat the exact row."""
    name = contrast.metric.split("@")[0]
    return next((m for m in EVENT_MODES if name.endswith(f"_{m}")), study.time_to_event)


def arm_runs(runs, study: Study, run_names=None) -> dict[str, pd.DataFrame]:
    """{arm: its complete runs (of run_names, when given)} for every arm the study's contrasts
    name, in the order they first appear."""
    df = _complete_runs(runs)
    if run_names is not None:
        df = df[df["run"].isin(set(run_names))] if "run" in df.columns else df.iloc[:0]
    arms = dict.fromkeys(arm for c in study.contrasts for arm in (c.a, c.b))
    return {arm: df[arm_mask(df, arm)] if not df.empty else df for arm in arms}


def last_interval_table(runs, study: Study, run_names=None) -> pd.DataFrame:
    """Whether the budget let each arm flatten: per (arm, metric) the study's contrasts read, over
    the arm's complete runs that evaluated it, the mean final value and the mean change over each
    run's last evaluation interval (from its last evaluation at least train.eval_every steps before
    its end to its end: a final evaluation off the grid would make a short interval look flat),
    and how many runs still improved there (by the study's direction). A run still improving at
    its end is censored by its budget: its final value bounds what more steps would give. Also the
    mean best value over each run's evaluations and how many runs regressed: reached a real level
    (reached_level: their best at least half way from their first evaluation to the metric's best
    possible value) and ended having lost more than half of what they gained from their first
    evaluation to their best, a collapse that the final value alone reads as never having learned;
    a run that never reached such a level cannot have regressed. A metric whose row equals the
    arm's primary-metric row (same runs, final, change, interval) is left out."""
    wanted = dict.fromkeys((arm, c.metric) for c in study.contrasts for arm in (c.a, c.b))
    by_arm = arm_runs(runs, study, run_names)
    rows = []
    for arm, metric in wanted:
        runs_of_arm = by_arm[arm]
        finals, changes, bests, regressed, intervals = [], [], [], [], set()
        for label, evals in evaluations(runs_of_arm, metric).groupby("row"):
            evals = evals.sort_values("step")
            every = runs_of_arm.loc[label].get("config.train.eval_every")
            if every is None or pd.isna(every):
                continue
            end = evals.iloc[-1]
            before = evals[evals["step"] <= end["step"] - int(every)]
            if before.empty:
                continue
            finals.append(end["value"])
            # in "lower is better" units: the run gained first - best and lost final - best
            sign = 1 if study.lower_is_better else -1
            best = (sign * evals["value"]).min()
            gained = sign * evals.iloc[0]["value"] - best
            lost = sign * end["value"] - best
            bests.append(sign * best)
            # gained >= 0: best is at most first; only a run that reached something can lose it
            reached = reached_level(metric, evals["value"], study.lower_is_better)
            regressed.append(reached and lost > gained / 2)
            changes.append(end["value"] - before.iloc[-1]["value"])
            intervals.add(int(end["step"] - before.iloc[-1]["step"]))
        if not finals:
            continue
        better = [(d < 0) == study.lower_is_better and d != 0 for d in changes]
        rows.append(
            {
                "arm": arm,
                "metric": metric,
                "runs": len(finals),
                "final": sum(finals) / len(finals),
                "change": sum(changes) / len(changes),
                "steps": "/".join(str(i) for i in sorted(intervals)),
                "improving": f"{sum(better)}/{len(finals)}",
                "best": sum(bests) / len(bests),
                "regressed": f"{sum(regressed)}/{len(finals)}",
            }
        )
    # a metric equal to the primary one of the same arm (a transformer's parallel forward is its
    # exact decoding) is left out, as in the learning curves
    primary = {r["arm"]: r for r in rows if r["metric"] == study.primary}
    same = ("runs", "final", "change", "steps")
    rows = [
        r
        for r in rows
        if r["metric"] == study.primary
        or r["arm"] not in primary
        or any(r[k] != primary[r["arm"]][k] for k in same)
    ]
    columns = [
        "arm",
        "metric",
        "runs",
        "final",
        "change",
        "steps",
        "improving",
        "best",
        "regressed",
    ]
    return pd.DataFrame(rows, columns=columns)


# A run "reached something" when its best evaluation came at least this share of the way from
# its first evaluation to the best value the metric can take (0 for a cross-entropy, the length
# for pos@90, 1 for an accuracy): a cross-entropy that fell from 3.62 to 2.82 (pos@90 3 of 16)
# learned the easy first positions, not the task, and cannot have "learned, then lost it".
REACHED_SHARE = 0.5


def reached_level(metric: str, values, lower_is_better: bool | None = None) -> bool:
    """Whether a run's evaluations of `metric` (in step order) reached a real level: its best at
    least REACHED_SHARE of the way from its first to the metric's best possible value (its bound
    on the better side, lrt_lab.store.metrics); a metric without such a bound: whether it ever
    beat its first evaluation. lower_is_better: the direction a study reads it in (None: the
    metric table's)."""
    info = metric_info(metric)
    lower = info.lower_is_better if lower_is_better is None else lower_is_better
    v = pd.to_numeric(pd.Series(list(values)), errors="coerce").dropna()
    if v.empty or lower is None:
        return False
    first = float(v.iloc[0])
    ideal = info.bounds[0] if lower else info.bounds[1]
    best = float(v.min() if lower else v.max())
    if ideal is None:
        return best != first
    return abs(best - first) >= REACHED_SHARE * abs(ideal - first) and best != first


def format_last_interval_table(table: pd.DataFrame, fmt: str = "table") -> str:
    """last_interval_table for a terminal (fmt "table") or a page ("md")."""
    shown = pd.DataFrame(
        {
            "arm": table["arm"],
            "metric": table["metric"],
            "runs": table["runs"],
            "final (mean)": table["final"].map(_num),
            "change, last interval (mean)": table["change"].map(lambda v: f"{v:+.4g}"),
            "interval (steps)": table["steps"],
            "runs still improving": table["improving"],
            "best (mean)": table["best"].map(_num),
            "runs that regressed": table["regressed"],
        }
    )
    return _rendered(shown, fmt)


def event_table(runs, study: Study, run_names=None) -> pd.DataFrame:
    """Per contrast: each arm's runs that reached pos@90 = the training length (in the decoding
    event_decoding names for it), the Kaplan-Meier median time to it (NaN: fewer than half did) and
    the log-rank p of the two arms."""
    _require_time_to_event(study)
    groups = arm_runs(runs, study, run_names)  # the store is read once, whatever the decodings
    times = {}  # decoding -> {arm: reach times}
    rows = []
    for c in study.contrasts:
        mode = event_decoding(c, study)
        if mode not in times:
            times[mode] = {
                arm: reach_times(rows_, mode, study.time_axis) for arm, rows_ in groups.items()
            }
        arms = {"a": times[mode][c.a], "b": times[mode][c.b]}
        row = {"a": c.a, "b": c.b, "decoding": mode}
        for side, t in arms.items():
            median = kaplan_meier(t["time"], t["reached"], None)[1] if len(t) else math.nan
            row[f"reached_{side}"] = f"{int(t['reached'].sum())}/{len(t)}"
            row[f"median_{side}"] = median
        both = all(len(t) for t in arms.values())
        any_event = both and any(t["reached"].any() for t in arms.values())
        row["p_logrank"] = (
            logrank({k: (t["time"], t["reached"]) for k, t in arms.items()})["p"]
            if any_event
            else math.nan
        )
        rows.append(row)
    return pd.DataFrame(rows)


__all__ = [
    "Contrast",
    "Study",
    "arm_mask",
    "arm_reach_times",
    "arm_runs",
    "check_arms",
    "event_decoding",
    "event_table",
    "format_study_table",
    "grid_frame",
    "last_interval_table",
    "metric_column",
    "parse_arm",
    "parse_study",
    "print_study",
    "store_studies",
    "study_selection",
    "study_lines",
    "study_table",
    "verdict",
]


# The studies of a store ---------------------------------------------------------------------------
def store_studies(root) -> list[tuple[Path, Study, str | None]]:
    """(spec path, Study, the spec's sweep name_prefix) of every sweep spec with a valid [study]
    table in the store's folder or the folder above it (experiments/*.toml beside
    experiments/results), by file name. Read with tomllib only (no sweep expansion, no torch), so
    a dashboard can find the study its runs answer: a spec that does not parse is skipped."""
    import tomllib

    root = Path(root)
    found = []
    for folder in dict.fromkeys((root, root.parent)):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.toml")):
            try:
                table = tomllib.loads(path.read_text())
                study = parse_study(table["study"]) if "study" in table else None
            except (OSError, ValueError, tomllib.TOMLDecodeError, UnicodeDecodeError):
                continue
            if study is not None:
                prefix = table.get("sweep", {}).get("name_prefix")
                found.append((path, study, prefix if isinstance(prefix, str) else None))
    return found


def study_selection(df: pd.DataFrame, study: Study, prefix: str | None = None):
    """The complete runs of `df` that are the study's arms ({arm: its runs}), or None when they
    are not in `df` as a study reads them: a run name must start with the spec's name_prefix
    (where it has one), and every arm must be the runs of one config (check_one_config)."""
    df = _complete_runs(df)
    if df.empty or "run" not in df.columns:
        return None
    if prefix:
        df = df[df["run"].astype(str).str.startswith(prefix)]
    arms = {}
    for c in study.contrasts:
        for arm in (c.a, c.b):
            if arm in arms:
                continue
            rows = df[arm_mask(df, arm)] if not df.empty else df
            if rows.empty:
                return None
            try:
                check_one_config(rows, "arm", arm, "the store")
            except ValueError:
                return None
            arms[arm] = rows
    return arms
