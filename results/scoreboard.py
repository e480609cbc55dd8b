"""The approximate-vs-exact scoreboard: for every trained LRT, how far its training forward (the
schedule's merged parallel pass, what the released code logs as its validation metric) is from
exact recurrent decoding (what the model does at inference; paper sec. 4), at 1x, 2x and 4x the
training length.

Per group of seeds (report's groups) and evaluation length: the cross-entropy gap, parallel minus
exact (nats per counted token; positive: the training forward looks worse than inference, negative:
it flatters the model), with a 95% t-interval over seeds, and the argmax agreement, the share of
counted positions where both forwards pick the same token. Read from each run's summary
(ce_parallel@L, ce_exact@L, agree@L: `lrt_lab.run.evaluation.eval_record`); a run trained before
those were recorded has none and is left out, which the table's notes say.
"""

from __future__ import annotations

import re

import pandas as pd

from lrt_lab.store.run_groups import canonical, group_keys, method_labels
from lrt_results.stats import mean_ci

COLUMNS = (
    "task",
    "length",
    "group",
    "eval_length",
    "ce_parallel",
    "ce_exact",
    "ce_gap",
    "ce_gap_low",
    "ce_gap_high",
    "agreement",
    "n",
    "seeds",
)
_CE = re.compile(r"^summary\.eval\.ce_exact@(\d+)$")


def scoreboard(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, training length, group of LRT runs, evaluation length) where the runs
    recorded both forwards' cross-entropy; attrs["left_out"]: the LRT runs without them."""
    rows, left_out = [], []
    if df.empty or "config.kind" not in df:
        return _table(rows, left_out)
    lrt = df[df["config.kind"].astype(str) == "lrt"]
    lengths = sorted({int(m.group(1)) for c in lrt for m in [_CE.match(c)] if m})
    if lrt.empty:
        return _table(rows, left_out)
    task = lrt["config.train.task"].fillna("?").astype(str)
    train_length = pd.to_numeric(lrt["config.train.length"], errors="coerce").fillna(0).astype(int)
    for (t, n), runs in lrt.groupby([task, train_length], sort=True):
        measured = _any_measured(runs, lengths)
        left_out += runs.loc[~measured, "run"].tolist()
        runs = runs[measured]
        if runs.empty:
            continue
        keys = group_keys(runs)
        labels = method_labels(runs)
        for key in sorted(set(keys), key=lambda k: labels[keys == k].iloc[0]):
            members = runs[keys == key]
            for L in lengths:
                row = _row(members, L)
                if row is not None:
                    rows.append({"task": t, "length": n, "group": labels[members.index[0]], **row})
    return _table(rows, left_out)


def _any_measured(runs: pd.DataFrame, lengths: list[int]) -> pd.Series:
    have = pd.Series(False, index=runs.index)
    for L in lengths:
        par, ex = f"summary.eval.ce_parallel@{L}", f"summary.eval.ce_exact@{L}"
        if par in runs and ex in runs:
            have |= runs[par].notna() & runs[ex].notna()
    return have


def _row(members: pd.DataFrame, L: int) -> dict | None:
    par, ex = f"summary.eval.ce_parallel@{L}", f"summary.eval.ce_exact@{L}"
    if par not in members or ex not in members:
        return None
    both = members[members[par].notna() & members[ex].notna()]
    if both.empty:
        return None
    gap = mean_ci((both[par] - both[ex]).astype(float))
    agree = f"summary.eval.agree@{L}"
    agreement = both[agree].astype(float).mean() if agree in both else float("nan")
    return {
        "eval_length": L,
        "ce_parallel": float(both[par].astype(float).mean()),
        "ce_exact": float(both[ex].astype(float).mean()),
        "ce_gap": gap["mean"],
        "ce_gap_low": gap["ci_low"],
        "ce_gap_high": gap["ci_high"],
        "agreement": float(agreement),
        "n": gap["n"],
        "seeds": " ".join(str(canonical(s)) for s in sorted(both["config.train.seed"])),
    }


def _table(rows: list, left_out: list) -> pd.DataFrame:
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table.attrs["left_out"] = sorted(left_out)
    return table


def scoreboard_wide(table: pd.DataFrame) -> pd.DataFrame:
    """One row per group: the gap and agreement at each evaluation length as columns
    ("gap@16", "agree@16", ...), lengths in increasing order: the form the report prints."""
    if table.empty:
        return pd.DataFrame(columns=["task", "length", "group", "n"])
    out = []
    for (t, n, g), sub in table.groupby(["task", "length", "group"], sort=False):
        row = {"task": t, "length": n, "group": g, "n": int(sub["n"].max())}
        for r in sub.sort_values("eval_length").itertuples(index=False):
            row[f"gap@{r.eval_length}"] = r.ce_gap
            row[f"agree@{r.eval_length}"] = r.agreement
        out.append(row)
    return pd.DataFrame(out)
