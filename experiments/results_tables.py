"""docs/results.md, "What the sandbox found" (its compact summary, "In short", included), from a run
store (default: the committed `experiments/results/`) and the committed bench results
(`docs/bench/*.json`). It writes docs/ only: the README points to the page and states no figure.

    python experiments/results_tables.py [STORE] [--figures DIR]   print every table (and draw
    figures)
    python experiments/results_tables.py --write    regenerate docs/results.md and the figures
    python experiments/results_tables.py --check    exit 1 when docs/results.md differs

docs/results.md is `experiments/results_template.md` (each study's question, setup and what it
shows)
with every `<!-- table: NAME -->` line replaced by the table NAME built here and every inline
`<!-- value: NAME -->` by the figure NAME of `prose_values`, so the prose states no number from the
store by hand either; the compact tables and the summary under them (the page's "In short",
`<!-- table: in_short -->`) are built here too, and tests/test_results.py fails when the page is
stale, when the template's prose holds a typed decimal, or when a prose
figure disagrees with its table.

The studies: A5 state tracking (experiments/a5_cpu.toml, a5_beyond.toml, the factor study
a5_study*.toml and the trainer frontier a5_trainer_frontier.toml), the truncated-gradient study
(a5_truncation.toml: which Rollout(G) learns with every k-th position supervised), the Z60 control
(z60_control.toml), gap recovery on byte-level text (gap_recovery.toml, fixedpoint_text.toml), the
looped and pondering baselines (baselines.toml), linear probes of the memory (the probe tables of
the
length-8 runs) and speed (`lrt-lab bench` JSON). Cells are mean [95% t-interval over seeds] (n
seeds);
a single seed shows its value alone. Everything comes from lrt_lab's public tools: the run store
(`load_runs`), `seed_stats`, the gap analysis (`read_bpb`, `gap_recovery`) and the bench table
(`lrt_lab.commands.bench.markdown_table`).
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

REPO = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    # this checkout's lrt_lab, not another installed copy: the pages document it
    sys.path.insert(0, str(REPO))

from lrt_lab.commands.bench import load_results, markdown_table  # noqa: E402
from lrt_lab.run.metrics import pos_at  # noqa: E402
from lrt_lab.store.markdown import markdown_lines  # noqa: E402
from lrt_lab.store.results import (  # noqa: E402
    load_metrics,
    load_plans,
    load_runs,
    load_table,
    reading_once,
)
from lrt_lab.store.run_groups import one_run_per_seed, seed_groups  # noqa: E402
from lrt_results.contrasts import contrast, smallest_p  # noqa: E402
from lrt_results.gap import read_bpb  # noqa: E402
from lrt_results.report import (  # noqa: E402
    frontier_points,
    memory_label,
    method_label,
    model_label,
    steps_suffix,
    supervised_every,
)
from lrt_results.stats import seed_stats  # noqa: E402
from lrt_results.study import Study  # noqa: E402

# Paper, app. "Non-Commutative State Tracking" (depth 4, d 256, trained at length 64, pos@90 out of
# 64
# with exact decoding, the same at 128 and 256) and app. "Comparison with Exact Sequential
# Training".
PAPER_A5 = {"transformer (4 layers)": "5", "lrt interleaved:2 (4 layers)": "24"}
PAPER_GAP = {"lrt interleaved:2": "75%", "lrt fullseq:3": "88%"}
PAPER_Z60_ACCURACY = "99.6%"  # its Z60 control (same appendix)
PAPER_SCALE = "1.3B"  # the model size of its looped and pondering comparison


# the compute every table shows: token-forwards the trainer ran (a token through the whole model
# counts 1 whatever the depth, a no-grad sweep through the blocks that feed the memory its share of
# the depth), with no backward pass counted: not FLOPs, and not time
COMPUTE_HEADER = "compute (M token-forwards, not FLOPs)"


def cell(row, fmt="{:.1f}") -> str:
    if row is None or row["n"] == 0:
        return "-"
    if row["n"] < 2 or math.isnan(row["ci_low"]):
        return f"{fmt.format(row['mean'])} (n={row['n']})"
    low, high = fmt.format(row["ci_low"]), fmt.format(row["ci_high"])
    return f"{fmt.format(row['mean'])} [{low}, {high}] (n={row['n']})"


def whole(v) -> str:
    """An integer figure, or "-" where the run did not measure it."""
    return "-" if pd.isna(v) else str(int(v))


def markdown(rows: list[list[str]], header: list[str]) -> str:
    return "\n".join(markdown_lines(header, rows))


def state_tracking_tables(df: pd.DataFrame, task: str, paper: dict | None) -> str | None:
    """One table per training length (the A5 CPU runs at 8, the factor study at 16, ...), of the
    runs with every position supervised (the others: `truncation_table`)."""
    sub = df[df["config.train.task"] == task]
    if sub.empty:
        return None
    return "\n\n".join(
        state_tracking_table(sub[sub["config.train.length"] == L], task, paper)
        for L in sorted(sub["config.train.length"].unique())
    )


def labelled(df: pd.DataFrame, task: str) -> pd.DataFrame:
    """The runs of `task` with every position supervised, one run per seed of a group, with the
    columns memory, model and label. The label groups seeds by the one rule
    (run_groups.seed_groups: configs that differ in anything but the seed and bookkeeping are
    different groups, never seeds of one) and reads as the model (what the paper's figures are
    keyed by), the number of steps where runs of one model differ in it, and the memory preset
    and init (shown in their own column, so the label holds them in brackets); where that text
    would name two groups alike, the group's name (seed_groups) follows it."""
    sub = df[df["config.train.task"] == task].copy()
    sub = sub[sub.apply(supervised_every, axis=1) == 1] if not sub.empty else sub
    if sub.empty:
        return sub
    groups = seed_groups(sub)
    sub = one_run_per_seed(sub)
    groups = groups.loc[sub.index]
    sub["memory"] = sub.apply(memory_label, axis=1)
    sub["model"] = sub.apply(model_label, axis=1)
    memory = sub["memory"].map(lambda m: "" if m == "-" else f" [{m}]")
    text = sub["model"] + steps_suffix(sub, sub["model"] + memory)
    keys = groups["key"] + "|" + sub["config.train.length"].astype(str)
    shared = text.groupby(text).transform(lambda s: keys[s.index].nunique() > 1).astype(bool)
    extra = groups["group"].astype(str).map(lambda g: g.split(" | ", 1)[1] if " | " in g else "")
    text[shared] = text[shared] + " | " + extra[shared]
    sub["label"] = text + memory
    return sub


def evaluated_lengths(sub: pd.DataFrame) -> list[int]:
    return sorted(
        {
            int(c.split("@")[1])
            for c in sub.columns
            if c.startswith("summary.eval.pos90_exact@") and sub[c].notna().any()
        }
    )


def state_tracking_table(df: pd.DataFrame, task: str, paper: dict | None) -> str | None:
    """The runs of `task` with every position supervised (the others: `truncation_table`)."""
    sub = labelled(df, task)
    if sub.empty:
        return None
    L = int(sub["config.train.length"].iloc[0])
    lengths = evaluated_lengths(sub)
    stats = {}
    metrics = [f"summary.eval.{m}@{n}" for m in ("pos90_exact", "acc_exact") for n in lengths]
    for metric in metrics:
        t = seed_stats(sub, metric, group_by=("label",))
        stats[metric] = {r["label"]: r for _, r in t.iterrows()}
    order = sorted(sub["label"].unique(), key=lambda s: (not s.startswith("transformer"), s))
    rows = []
    for label in order:
        r = [label.split(" [")[0], sub.loc[sub["label"] == label, "memory"].iloc[0]]
        r += [cell(stats[f"summary.eval.pos90_exact@{n}"].get(label)) for n in lengths]
        r += [cell(stats[f"summary.eval.acc_exact@{lengths[0]}"].get(label), "{:.3f}")]
        runs = sub[sub["label"] == label].sort_values("config.train.seed")
        r.append(", ".join(str(int(v)) for v in runs[f"summary.eval.pos90_exact@{L}"]))
        # the parallel forward (the training schedule run on the whole sequence) per seed, at each
        # length
        cols = [c for c in (f"summary.eval.pos90_parallel@{n}" for n in lengths) if c in runs]
        r.append(
            ", ".join("/".join(str(int(v)) for v in seed_row) for seed_row in runs[cols].to_numpy())
        )
        # training compute: token-forwards the trainer actually ran (a FixedPoint step counts its
        # sweeps)
        r.append(f"{runs['summary.compute_tokens'].mean() / 1e6:.1f}")
        if paper is not None:
            # several rows may share the paper's model/trainer: its figure goes to the one with its
            # init
            model = runs["model"].iloc[0]
            twins = sub[sub["model"] == model]
            own = twins[twins["memory"].str.contains("paper init")]
            r.append(
                paper.get(model, "-")
                if label in set((own if len(own) else twins)["label"])
                else "-"
            )
        rows.append(r)
    header = (
        ["model / trainer", "memory preset, init"]
        + [f"pos@90 at {n}" for n in lengths]
        + [
            f"accuracy at {lengths[0]}",
            f"pos@90 at {L} per seed",
            "parallel forward pos@90 per seed, at " + " / ".join(map(str, lengths)),
            COMPUTE_HEADER,
        ]
    )
    if paper is not None:
        header.append("paper pos@90 (of 64, T=64)")
    steps = sorted({int(v) for v in sub["config.train.steps"]})
    if len(steps) > 1:  # e.g. the transformer trained longer, to its plateau: say so per row
        header.insert(2, "steps")
        for label, r in zip(order, rows):  # one number per row: a label holds one number of steps
            r.insert(2, str(int(sub.loc[sub["label"] == label, "config.train.steps"].iloc[0])))
    d = int(sub["config.model.n_embd"].iloc[0])
    title = (
        f"**{task}**: trained at length {L} for {' or '.join(map(str, steps))} steps of "
        f"{int(sub['config.train.batch_size'].iloc[0])} sequences, d={d}; exact recurrent decoding"
    )
    return title + "\n\n" + markdown(rows, header)


def frontier_table(df: pd.DataFrame, task: str = "a5_prefix", length: int = 16) -> str | None:
    """The trainer frontier (`lrt_results.report.frontier_points`): per trainer, the compute and
    wall
    clock of its runs and exact pos@90 at every evaluated length, per seed; cheapest first."""
    points = frontier_points(df, task, length)
    if points.empty:
        return None
    lengths = sorted(int(c.split("@")[1]) for c in points if c.startswith("pos90_exact@"))
    rows = []
    for trainer, runs in points.groupby("trainer", sort=False):
        runs = runs.sort_values("seed")
        exact = runs[[f"pos90_exact@{n}" for n in lengths]].to_numpy()
        per_seed = ", ".join("/".join(whole(v) for v in r) for r in exact)
        learned = sum(int(v) == length for v in runs[f"pos90_exact@{length}"])
        rows.append(
            [
                trainer,
                f"{runs['compute'].mean():.1f}",
                f"{runs['wall_min'].mean():.0f}",
                ", ".join(str(int(s)) for s in runs["seed"]),
                per_seed,
                f"{learned} of {len(runs)}",
            ]
        )
    header = [
        "trainer",
        COMPUTE_HEADER,
        "wall clock (min, mean)",
        "seeds",
        "exact pos@90 at " + " / ".join(map(str, lengths)) + " per seed",
        f"seeds at pos@90 = {length}",
    ]
    return markdown(rows, header)


def supervised_pos90(run, lengths, threshold: float = 0.9) -> list[int]:
    """pos@90 under exact decoding at each length over the supervised positions only, from the
    run's tables/per_position.csv (an unsupervised position has no accuracy: NaN) with
    `pos_at(skip_nan=True)`: the last supervised position before the first failing one, 0 when
    the first fails. (The summary's pos@90 of runs made before that rule counted unsupervised
    positions as passing.)"""
    t = load_table(run, "per_position")
    out = []
    for n in lengths:
        acc = t[(t["length"] == n) & (t["mode"] == "exact")].sort_values("position")["accuracy"]
        out.append(pos_at(acc.to_numpy(dtype=float).copy(), threshold, skip_nan=True))
    return out


def truncation_runs(df: pd.DataFrame, task: str = "a5_prefix", length: int = 16) -> pd.DataFrame:
    """The LRT runs at `length` with every k-th position supervised (k > 1) and, for k = 1, the
    frontier's runs of the same trainers: trainer, k, seed, final loss and pos@90 over supervised
    positions at each evaluated length (`supervised_pos90`)."""
    sub = df[(df["config.train.task"] == task) & (df["config.train.length"] == length)]
    sub = sub.assign(k=sub.apply(supervised_every, axis=1))
    if sub.empty or (sub["k"] == 1).all():
        return pd.DataFrame()
    trained = sub[(sub["k"] > 1) & (sub["config.kind"] == "lrt")]
    trained = trained.assign(trainer=trained.apply(method_label, axis=1))
    full = frontier_runs(df, task, length).assign(k=1)
    full = full[full["trainer"].isin(set(trained["trainer"]))]
    runs = pd.concat([trained, full], ignore_index=True)
    lengths = evaluated_lengths_of(runs)
    rows = []
    for _, r in runs.iterrows():
        pos = supervised_pos90(r, lengths)
        rows.append(
            {
                "trainer": r["trainer"],
                "k": int(r["k"]),
                "seed": int(r["config.train.seed"]),
                "final_loss": r["summary.final_loss"],
                "path": r["path"],
                "summary_pos90": r[f"summary.eval.pos90_exact@{length}"],
                **{f"pos90@{n}": p for n, p in zip(lengths, pos)},
            }
        )
    return pd.DataFrame(rows).sort_values(["trainer", "k", "seed"]).reset_index(drop=True)


def evaluated_lengths_of(runs: pd.DataFrame) -> list[int]:
    cols = [c for c in runs if c.startswith("summary.eval.pos90_exact@") and runs[c].notna().any()]
    return sorted(int(c.split("@")[1]) for c in cols)


def truncation_table(df: pd.DataFrame, task: str = "a5_prefix", length: int = 16) -> str | None:
    """Which trainer learns when only every k-th position is supervised: pos@90 over supervised
    positions per seed at every evaluated length, one row per LRT trainer (paper preset and init),
    one column per k."""
    runs = truncation_runs(df, task, length)
    if runs.empty:
        return None
    lengths = sorted(int(c.split("@")[1]) for c in runs if c.startswith("pos90@"))
    ks = sorted(runs["k"].unique())
    trainers = sorted(set(runs["trainer"]), key=lambda m: (m.startswith("lrt exact"), m))
    rows = []
    for trainer in trainers:
        row = [trainer]
        for k in ks:
            cell = runs[(runs["trainer"] == trainer) & (runs["k"] == k)]
            row.append(
                ", ".join(
                    f"{'/'.join(whole(r[f'pos90@{n}']) for n in lengths)} ({r['final_loss']:.2f})"
                    for _, r in cell.iterrows()
                )
                or "-"
            )
        rows.append(row)
    header = ["trainer"] + [f"k = {k}" for k in ks]
    vocab = int(df.loc[df["config.train.task"] == task, "config.task_vocab_size"].iloc[0])
    note = (
        f"Exact pos@90 at {' / '.join(map(str, lengths))} per seed over the supervised positions "
        "only, and in brackets the final training loss (k: every k-th position supervised and "
        "counted; pos@90 is the last supervised position before the first supervised one below "
        "90%, 0 when the first one is, computed from each run's tables/per_position.csv; chance "
        f"loss is ln {vocab} = {math.log(vocab):.2f})."
    )
    return note + "\n\n" + markdown(rows, header)


# the frontier's trainers by their group names (run_groups.seed_groups: the steps most of them
# trained, 1500, go unsaid)
PROTOCOL_ROWS = ("transformer | steps=3000", "lrt interleaved:2", "lrt interleaved:2 | steps=3000")


def protocol_points(df: pd.DataFrame, length: int = 16) -> pd.DataFrame:
    """The paper's trainer and the transformer scored both ways at every step some row was trained
    for: one row per (trainer, evaluation step, seed) with the compute run by that step and pos@90
    at the training length under exact decoding and under the training schedule's parallel
    forward (each run's metrics.jsonl evaluations)."""
    runs = frontier_runs(df, length=length)
    if runs.empty:
        return pd.DataFrame()
    runs = runs[runs["trainer"].isin(PROTOCOL_ROWS)]
    budgets = sorted({int(v) for v in runs["config.train.steps"]})
    rows = []
    for _, run in runs.iterrows():
        evals = load_metrics(run, kind="eval").set_index("step")
        for step in budgets:
            if step not in evals.index:
                continue
            e = evals.loc[step]
            rows.append(
                {
                    "trainer": run["trainer"],
                    "steps": int(run["config.train.steps"]),
                    "step": step,
                    "seed": int(run["config.train.seed"]),
                    "compute": e["compute_tokens"] / 1e6,
                    "exact": int(e[f"pos90_exact@{length}"]),
                    "parallel": int(e[f"pos90_parallel@{length}"]),
                }
            )
    return pd.DataFrame(rows)


def protocol_table(df: pd.DataFrame, length: int = 16) -> str | None:
    """Interleaved(2) and the transformer under both protocols, at matched steps and at matched
    compute: exact decoding (what this page's other tables score) and the training schedule's
    parallel forward (what the paper's released code logs)."""
    points = protocol_points(df, length)
    if points.empty:
        return None
    rows = []
    order = {t: i for i, t in enumerate(PROTOCOL_ROWS)}
    groups = points.groupby(["trainer", "step"], sort=False)
    for (trainer, step), g in sorted(groups, key=lambda kv: (kv[0][1], order[kv[0][0]])):
        g = g.sort_values("seed")
        rows.append(
            [
                trainer,
                str(int(g["steps"].iloc[0])),
                str(step),
                f"{g['compute'].mean():.1f}",
                f"{seeds_text(g['exact'])} ({g['exact'].mean():.1f})",
                f"{seeds_text(g['parallel'])} ({g['parallel'].mean():.1f})",
                str(len(g)),
            ]
        )
    header = [
        "model / trainer",
        "trained for (steps)",
        "scored at step",
        COMPUTE_HEADER.replace("compute", "compute by that step"),
        f"exact decoding: pos@90 at {length} per seed (mean)",
        f"parallel forward: pos@90 at {length} per seed (mean)",
        "seeds",
    ]
    return markdown(rows, header)


def frontier_figure(df: pd.DataFrame, path, task: str = "a5_prefix", length: int = 16) -> None:
    """Exact pos@90 at each evaluated length (columns) against compute and wall clock (rows), one
    point per trainer and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = frontier_points(df, task, length)
    lengths = sorted(int(c.split("@")[1]) for c in points if c.startswith("pos90_exact@"))
    trainers = list(dict.fromkeys(points.sort_values("compute")["trainer"]))
    colors = dict(zip(trainers, plt.get_cmap("tab10").colors))
    fig, axes = plt.subplots(
        2, len(lengths), figsize=(4.2 * len(lengths), 7), sharey="col", squeeze=False
    )
    for row, (x, xlabel) in enumerate(
        (
            ("compute", "training compute (M token-forwards)"),
            ("wall_min", "wall clock of the run (min, 2-core CPU)"),
        )
    ):
        for col, n in enumerate(lengths):
            ax = axes[row][col]
            for trainer in trainers:
                p = points[points["trainer"] == trainer]
                jitter = (p["seed"] - 1) * 0.25  # seeds with equal pos@90 stay visible
                ax.scatter(
                    p[x],
                    p[f"pos90_exact@{n}"] + jitter,
                    color=colors[trainer],
                    label=trainer,
                    s=36,
                    alpha=0.85,
                    edgecolor="black",
                    linewidth=0.4,
                )
            ax.axhline(n, color="grey", linewidth=0.6, linestyle=":")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"exact pos@90 at {n}")
            ax.set_title(f"evaluated at {n} ({n // length}x the training length)")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(
        handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=9, frameon=False
    )
    fig.suptitle(
        f"{task}: trainers at length {length} (one point per seed; dotted: the evaluated length)"
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def gap_runs(df: pd.DataFrame) -> pd.DataFrame:
    """The text runs with a tables/bpb.csv: bpb.exact, bpb.parallel, the held-out tokens they were
    scored on (`bpb.n_tokens`) and their method label."""
    sub = df[df["config.train.task"] == "text_bytes"]
    if sub.empty:
        return sub
    with_bpb = read_bpb(sub)
    if "bpb.exact" not in with_bpb.columns:
        return with_bpb.iloc[0:0]
    with_bpb = with_bpb[with_bpb["bpb.exact"].notna()].copy()
    with_bpb["bpb.n_tokens"] = [
        int(load_table(r, "bpb")["n_tokens"].iloc[0]) for _, r in with_bpb.iterrows()
    ]
    with_bpb["method"] = with_bpb.apply(method_label, axis=1)
    return with_bpb


def gap_contrasts(runs: pd.DataFrame) -> pd.DataFrame:
    """Per method (the exact-trained LRT included), paired by seed with the transformer: the
    effect Delta = method minus transformer in exact-decoding BPB (`contrast`'s permutation p,
    with a 95% Student's t interval of the mean paired difference), the per-seed Deltas, and the
    gap recovered as a ratio of means, mean Delta(method) / mean Delta(exact), over the seeds the
    method shares with both."""
    bpb = runs.pivot_table(index="config.train.seed", columns="method", values="bpb.exact")
    rows = []
    for method in sorted(set(bpb.columns) - {"transformer"}, key=lambda m: (m != "lrt exact", m)):
        pair = bpb[["transformer", method]].dropna()
        # Student's t interval: a percentile bootstrap of 3 pairs is far too narrow (it excluded
        # 0 where the paired t-test gave p = 0.07)
        res = contrast(pair["transformer"], pair[method], paired=True, interval="t")
        both = bpb[list(dict.fromkeys(["transformer", method, "lrt exact"]))].dropna()
        gain = (both["lrt exact"] - both["transformer"]).mean()
        rows.append(
            {
                "method": method,
                "bpb": pair[method].mean(),
                "seeds": list(pair.index),
                "deltas": list(pair[method] - pair["transformer"]),
                "recovered": (both[method] - both["transformer"]).mean() / gain,
                **res,
            }
        )
    return pd.DataFrame(rows)


def gap_table(df: pd.DataFrame) -> str | None:
    """Gap recovery as paired deltas: each method's exact-decoding BPB minus the transformer's, per
    seed, with its interval and permutation p, the recovered fraction as a ratio of means, and
    what each trainer costs; every run scored on the same held-out sequences (the head says so,
    or names the runs that differ)."""
    runs = gap_runs(df)
    if (
        runs.empty
        or "transformer" not in set(runs["method"])
        or "lrt exact" not in set(runs["method"])
    ):
        return None
    table = gap_contrasts(runs)
    rows = []
    for _, r in table.iterrows():
        method_runs = runs[runs["method"] == r["method"]]
        rows.append(
            [
                r["method"],
                f"{r['bpb']:.4f}",
                f"{r['effect']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] (n={r['n_a']})",
                p_text(r["p"]),
                ", ".join(f"{d:+.4f}" for d in r["deltas"]),
                "-" if r["method"] == "lrt exact" else f"{100 * r['recovered']:.0f}%",
                PAPER_GAP.get(r["method"], "-"),
                forwards_per_token(method_runs),
                sweeps_per_step(method_runs),
            ]
        )
    base = runs.loc[runs["method"] == "transformer", "bpb.exact"].mean()
    tokens = sorted(set(runs["bpb.n_tokens"]))
    length = int(runs["config.train.length"].iloc[0])
    if len(tokens) == 1:
        scored = (
            f"Every run is scored with exact decoding on the same {tokens[0] // length} held-out "
            f"sequences ({tokens[0]} tokens)"
        )
    else:
        scored = "Runs scored on different held-out sets: " + "; ".join(
            f"{n} tokens: {', '.join(runs.loc[runs['bpb.n_tokens'] == n, 'run'])}" for n in tokens
        )
    memories = sorted({m for m in runs.apply(memory_label, axis=1) if m != "-"})
    head = (
        f"{scored}; the transformer's BPB is {base:.4f} (mean). Delta = method minus transformer, "
        "paired by seed (negative: lower BPB than the transformer): mean [95% Student's t "
        "interval of the mean paired difference] (n pairs), and the exact two-sided paired "
        f"permutation p (sign flips; the smallest p possible with {int(table['n_a'].min())} "
        f"pairs is {p_text(smallest_p(int(table['n_a'].min()), paired=True))}). Gap recovered = "
        "mean Delta(method) / mean Delta(lrt exact), a ratio of means. LRT memory: "
        + "; ".join(memories)
        + "."
    )
    header = [
        "method",
        "BPB (exact decoding, mean)",
        "Delta BPB vs transformer [95% CI]",
        "p (paired)",
        "Delta per seed",
        "gap recovered (ratio of means)",
        "paper",
        "cost (forwards per token)",
        "sweeps per step (mean; last 50 steps)",
    ]
    return head + "\n\n" + markdown(rows, header)


def forwards_per_token(runs: pd.DataFrame) -> str:
    """Token-forwards the trainer ran per training token, averaged over training and seeds (a
    no-grad
    sweep through the blocks that feed the memory counts their share of the depth)."""
    return f"{(runs['summary.compute_tokens'] / runs['summary.tokens']).mean():.2f}"


def sweeps_per_step(runs: pd.DataFrame, last: int = 50) -> str:
    """FixedPoint's sweeps per step, over all of training and over its last `last` steps (mean over
    seeds); "-" for trainers whose number of passes is fixed."""
    if not runs["config.schedule"].str.startswith("fixedpoint").all():
        return "-"
    sweeps = [load_metrics(run, kind="train")["sweeps"] for _, run in runs.iterrows()]
    whole_run = statistics.mean(s.mean() for s in sweeps)
    at_end = statistics.mean(s.iloc[-last:].mean() for s in sweeps)
    return f"{whole_run:.1f}; {at_end:.1f}"


def baselines_table(df: pd.DataFrame, length: int = 16) -> str | None:
    """The looped, pondering and LRT models on S3 prefix products (experiments/baselines.toml): cost
    per token, and accuracy and pos@90 with each model's own decoding, mean +- standard deviation
    over seeds (the runs either learn or do not, so the spread says more than an interval)."""
    sub = df[(df["config.train.task"] == "group_prefix") & (df["config.train.length"] == length)]
    if sub.empty:
        return None
    sub = sub.assign(method=sub.apply(method_label, axis=1))
    rows = []

    # cheapest first, as a reader compares what each extra forward buys
    def cost(group):
        return group[1]["summary.schedule_cost"].mean(), group[0]

    for method, runs in sorted(sub.groupby("method"), key=cost):
        runs = runs.sort_values("config.train.seed")
        row = [
            method,
            whole(runs["summary.forwards_per_token"].iloc[0]),
            f"{runs['summary.schedule_cost'].mean():g}x",
        ]
        for metric, fmt in (
            (f"acc_exact@{length}", "{:.3f}"),
            (f"pos90_exact@{length}", "{:.1f}"),
            (f"acc_exact@{2 * length}", "{:.3f}"),
        ):
            values = runs[f"summary.eval.{metric}"].astype(float)
            spread = values.std() if len(values) > 1 else float("nan")
            if metric.startswith("pos90") and values.nunique() == 1:
                row.append(whole(values.iloc[0]))
            else:
                sd = "" if math.isnan(spread) else f" +- {fmt.format(spread)}"
                row.append(fmt.format(values.mean()) + sd)
        row.append(", ".join(f"{v:.3f}" for v in runs[f"summary.eval.acc_exact@{length}"]))
        tests = baseline_tests(sub, method, length)
        row.append("-" if tests is None else f"{p_text(tests[0])}; {p_text(tests[1])}")
        row.append(str(len(runs)))
        rows.append(row)
    return markdown(
        rows,
        [
            "method",
            "forwards / token",
            "training cost",
            f"accuracy (L={length})",
            f"pos@90 (L={length})",
            f"accuracy (L={2 * length})",
            f"accuracy (L={length}) per seed",
            f"accuracy (L={length}) vs transformer: Welch t p; permutation p",
            "seeds",
        ],
    )


def baseline_tests(sub: pd.DataFrame, method: str, length: int, against: str = "transformer"):
    """(Welch t-test p, exact permutation p) of `method`'s accuracy at `length` against
    `against`'s, two-sided, unpaired; None for `against` itself."""
    if method == against:
        return None
    col = f"summary.eval.acc_exact@{length}"
    a = sub.loc[sub["method"] == against, col].astype(float)
    b = sub.loc[sub["method"] == method, col].astype(float)
    welch = float(scipy_stats.ttest_ind(b, a, equal_var=False).pvalue)
    return welch, permutation(a, b)["p"]


# The probe tables' setting: `lrt-lab analyze probe` on this many exact-decoded sequences, split by
# sequence into train and test (`probe_activations`' train_frac); each run's table records n_test.
PROBE_SEQUENCES = 1024
PROBE_TRAIN_FRAC = 0.7


def probed_runs(df: pd.DataFrame, task: str = "a5_prefix", length: int = 8) -> list:
    """(run row, its memory probes: hook_mem_in for the state at t-1) of the runs at `length` that
    have a tables/probe_exact.csv, in the probe table's order."""
    sub = labelled(df[df["config.train.length"] == length], task)
    if sub.empty:
        return []
    lrt = sub[sub["config.kind"] == "lrt"].sort_values(
        ["config.schedule", "label", "config.train.seed"]
    )
    out = []
    for _, run in lrt.iterrows():
        path = Path(run["path"]) / "tables" / "probe_exact.csv"
        if path.is_file():
            out.append((run, pd.read_csv(path)))
    return out


def memory_probes(probes: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(probe accuracy per position, shuffled-label accuracy per position) of the memory read at t
    for the state at t-1."""
    mem = probes[(probes["site"] == "hook_mem_in") & (probes["target"] == "state_prev")]
    acc = mem[mem["control"] == "probe"].set_index("position")["accuracy"]
    shuffled = mem[mem["control"] == "shuffled_labels"].set_index("position")["accuracy"]
    return acc, shuffled


def probes_table(df: pd.DataFrame, task: str = "a5_prefix", length: int = 8) -> str | None:
    """Linear probes of the memory an LRT reads at position t (`hook_mem_in`) for the state at t-1:
    test accuracy per position, from each probed run's tables/probe_exact.csv (exact decoding)."""
    rows = []
    for run, probes in probed_runs(df, task, length):
        acc, shuffled = memory_probes(probes)
        # "4 layers[, memory from block 4]"
        where = run["model"].split("(", 1)[1].rstrip(")").split(", ", 1)
        name = f"LRT {run['config.schedule']}{', ' + where[1] if len(where) > 1 else ''}"
        pos90 = whole(run[f"summary.eval.pos90_exact@{length}"])
        rows.append(
            [f"{name}, seed {int(run['config.train.seed'])} (pos@90 {pos90})"]
            + [f"{acc.get(t, float('nan')):.2f}" for t in range(2, length + 1)]
            + [f"{shuffled.max():.2f}"]
        )
    if not rows:
        return None
    return markdown(
        rows,
        ["memory read at position"]
        + [str(t) for t in range(2, length + 1)]
        + ["shuffled labels (max)"],
    )


def probe_values(df: pd.DataFrame, task: str = "a5_prefix", length: int = 8) -> dict[str, str]:
    """The probes' size (examples per class) and what the table shows against its controls: per
    run, the last position up to which the memory probe beats the shuffled-label control; and the
    residual-stream probes of the top block against the memory's source block."""
    probed = probed_runs(df, task, length)
    if not probed:
        return {}
    n_test = {int(v) for _, p in probed for v in p["n_test"]}
    n_train = PROBE_SEQUENCES - round(PROBE_SEQUENCES * (1 - PROBE_TRAIN_FRAC))
    if n_test != {PROBE_SEQUENCES - n_train}:
        raise SystemExit(f"probe tables hold n_test {sorted(n_test)}, not the setting's")
    classes = int(probed[0][0]["config.task_vocab_size"])
    out = {
        "probe.sequences": str(PROBE_SEQUENCES),
        "probe.n_train": str(n_train),
        "probe.n_test": str(n_test.pop()),
        "probe.classes": str(classes),
        "probe.features": str(int(probed[0][0]["config.model.n_embd"])),
        "probe.train_per_class": f"{n_train / classes:.0f}",
        "probe.test_per_class": f"{(PROBE_SEQUENCES - n_train) / classes:.0f}",
        "probe.chance": f"{1 / classes:.3f}",
    }
    carried, shuffled_max, top, source = [], [], [], []
    n_layer = int(probed[0][0]["config.model.n_layer"])
    for run, probes in probed:
        acc, shuffled = memory_probes(probes)
        floor = shuffled.max()
        shuffled_max.append(floor)
        last = 1
        for t in range(2, length + 1):
            if acc.get(t, 0.0) <= floor:
                break
            last = t
        pos90 = whole(run[f"summary.eval.pos90_exact@{length}"])
        carried.append(f"{pos90} -> {last}")
        states = probes[(probes["control"] == "probe") & (probes["target"] == "state")]
        later = states[states["position"] >= 2].groupby("site")["accuracy"].mean()
        layer = run.get("config.model.memory.source_layer")
        if pd.isna(layer):  # the default source: the paper's block round(0.6 x depth)
            top.append(later[f"blocks.{n_layer - 1}.hook_resid_post"])
            source.append(later[f"blocks.{round(0.6 * n_layer) - 1}.hook_resid_post"])
    out["probe.carried"] = "; ".join(carried)
    out["probe.shuffled_range"] = f"{min(shuffled_max):.2f}-{max(shuffled_max):.2f}"
    out["probe.top_block"] = f"{statistics.mean(top):.2f}"
    out["probe.source_block"] = f"{statistics.mean(source):.2f}"
    out["probe.block_runs"] = str(len(top))
    out["probe.top_index"] = str(n_layer)
    out["probe.source_index"] = str(round(0.6 * n_layer))
    return out


def bench_table(bench_dir: Path = REPO / "docs" / "bench") -> str | None:
    """The committed `lrt-lab bench --json` results: the table docs/performance.md shows, with a
    column saying which way each row's ratio reads (`directed`)."""
    results = load_results(bench_dir) if Path(bench_dir).is_dir() else []
    return directed(markdown_table(results)) if results else None


def ratio_direction(label: str) -> str:
    """How a bench row's LRT / transformer figure reads: a time ratio (training step, prefill), a
    throughput ratio (decoding tokens per second), or no ratio (the rows naming the setting)."""
    if label.startswith(("train ", "prefill ")):
        return "LRT time / transformer time (> 1x: LRT slower)"
    if label.startswith("decode tok/s"):
        return "LRT tok/s / transformer tok/s (< 1x: LRT slower)"
    return "-"


def directed(table: str) -> str:
    """A bench table with a second column giving each row's ratio direction: its rows mix time
    ratios and throughput ratios under one header."""
    lines = table.splitlines()
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    head = ["LRT vs transformer", "ratio"] + cells[0][1:]
    rows = [[r[0], ratio_direction(r[0])] + r[1:] for r in cells[2:]]
    return markdown(rows, head)


def z60_table(df: pd.DataFrame) -> str | None:
    """The Z60 control at every training length, one table per length."""
    return state_tracking_tables(df, "z60_prefix", None)


# The compact tables of the page's summary (In short) ----------------------------------------------
# Per study a few rows of the full tables in docs/results.md, each linking to its section there.
# A row names a label of `labelled` (model, then the steps where they differ) and the init its
# memory
# cell must name ("-": no memory); rows missing from the store are left out.
RESULTS_PAGE = "docs/results.md"
A5_AT_8 = [
    ("transformer (4 layers)", "-"),
    ("lrt interleaved:2 (4 layers)", "start-as-transformer"),
    ("lrt interleaved:2 (4 layers, memory from block 4)", "start-as-transformer"),
    ("lrt fullseq:3 (4 layers)", "start-as-transformer"),
    ("lrt exact (4 layers)", "start-as-transformer"),
]
# the length-8 rows the prose names: {key: (label, init)}
A5_AT_8_KEYS = {
    "transformer": ("transformer (4 layers)", "-"),
    "transformer8": ("transformer (8 layers)", "-"),
    "il": ("lrt interleaved:2 (4 layers)", "start-as-transformer"),
    "il_top": ("lrt interleaved:2 (4 layers, memory from block 4)", "start-as-transformer"),
    "fullseq3": ("lrt fullseq:3 (4 layers)", "start-as-transformer"),
    "exact": ("lrt exact (4 layers)", "start-as-transformer"),
    "exact_top": ("lrt exact (4 layers, memory from block 4)", "start-as-transformer"),
}
A5_AT_16 = [
    ("transformer (4 layers)", "-"),
    ("lrt interleaved:2 (4 layers) (1500 steps)", "paper init"),
    ("lrt fixedpoint:0.1:8 (4 layers)", "paper init"),
    ("lrt fixedpoint:0.01:16 (4 layers)", "paper init"),
    ("lrt rollout:1 (4 layers)", "paper init"),
    ("lrt exact (4 layers)", "paper init"),
]


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case,
    punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def link(heading: str) -> str:
    return f"[{heading}]({RESULTS_PAGE}#{anchor(heading)})"


def short(label: str) -> str:
    """A label without its depth, which every row of a compact table shares."""
    return re.sub(r" \(\d+ layers\)", "", re.sub(r"\(\d+ layers, ", "(", label))


def compact_rows(sub: pd.DataFrame, label: str, init: str) -> pd.DataFrame:
    """The runs of `labelled` rows whose label is `label` and whose memory cell names `init` ("-":
    no memory), in seed order: one row of a compact table."""
    runs = sub[
        (sub["label"].str.split(" [", regex=False).str[0] == label)
        & (sub["memory"].str.contains(init, regex=False) if init != "-" else sub["memory"] == "-")
    ]
    return runs.sort_values("config.train.seed")


def compact_state_tracking(df: pd.DataFrame, task: str, length: int, wanted) -> str | None:
    """Exact pos@90 at 1x / 2x / 4x the training length (means), the seeds that reach the training
    length, and the compute, for the rows `wanted` of the full table."""
    sub = labelled(df[df["config.train.length"] == length], task)
    if sub.empty:
        return None
    lengths = evaluated_lengths(sub)
    rows = []
    for label, init in wanted:
        runs = compact_rows(sub, label, init)
        if runs.empty:
            continue
        means = " / ".join(f"{runs[f'summary.eval.pos90_exact@{n}'].mean():.1f}" for n in lengths)
        learned = int((runs[f"summary.eval.pos90_exact@{length}"] >= length).sum())
        rows.append(
            [
                short(label),
                means,
                f"{learned} of {len(runs)}",
                f"{runs['summary.compute_tokens'].mean() / 1e6:.1f}",
            ]
        )
    if not rows:
        return None
    return markdown(
        rows,
        [
            "model / trainer",
            "exact pos@90 at " + " / ".join(map(str, lengths)) + " (mean)",
            f"seeds at pos@90 = {length}",
            COMPUTE_HEADER,
        ],
    )


def compact_z60(df: pd.DataFrame) -> str | None:
    """Every Z60 row (one per model and training length): exact pos@90 at 1x / 2x / 4x, accuracy."""
    rows = []
    for length in sorted(
        df.loc[df["config.train.task"] == "z60_prefix", "config.train.length"].unique()
    ):
        sub = labelled(df[df["config.train.length"] == length], "z60_prefix")
        lengths = evaluated_lengths(sub)
        for label, runs in sub.groupby("label", sort=True):
            rows.append(
                [
                    short(label.split(" [")[0]),
                    str(int(length)),
                    " / ".join(
                        f"{runs[f'summary.eval.pos90_exact@{n}'].mean():.1f}" for n in lengths
                    ),
                    f"{runs[f'summary.eval.acc_exact@{length}'].mean():.3f}",
                    str(len(runs)),
                ]
            )
    if not rows:
        return None
    return markdown(
        rows,
        [
            "model / trainer",
            "trained at",
            "exact pos@90 at 1x / 2x / 4x (mean)",
            "accuracy at 1x",
            "seeds",
        ],
    )


def compact_gap(df: pd.DataFrame) -> str | None:
    """Per LRT trainer: its paired Delta BPB against the transformer, p, the gap recovered (ratio
    of means), cost and the paper's figure: columns of the gap table."""
    table = gap_table(df)
    if table is None:
        return None
    lines = table.split("\n\n", 1)[1].splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    keep = [0, 2, 3, 5, 7, 6]
    return markdown([[r[i] for i in keep] for r in cells[2:]], [cells[0][i] for i in keep])


def compact_baselines(df: pd.DataFrame) -> str | None:
    table = baselines_table(df)
    if table is None:
        return None
    lines = table.splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    keep = [0, 2, 3, 4]  # method, training cost, accuracy and pos@90 at the training length
    return markdown([[r[i] for i in keep] for r in cells[2:]], [cells[0][i] for i in keep])


def compact_bench(bench_dir: Path = REPO / "docs" / "bench") -> str | None:
    """The bench table's headline rows: the training step of
    the main trainers and batch-1 decoding."""
    table = bench_table(bench_dir)
    if table is None:
        return None
    lines = table.splitlines()
    keep = (
        "train interleaved:2",
        "train fixedpoint:0.01:8",
        "train rollout:1",
        "train exact",
        "decode tok/s, batch 1",
    )
    return "\n".join(lines[:2] + [line for line in lines[2:] if line.split("|")[1].strip() in keep])


COMPACT = [  # (study, section of docs/results.md, builder, what the numbers are)
    (
        "A5 state tracking at length 8",
        "A5 state tracking at length 8",
        lambda df: compact_state_tracking(df, "a5_prefix", 8, A5_AT_8),
        "depth 4, d=128, 800 steps, start-as-transformer init",
    ),
    (
        "A5 at length 16, which trainer learns",
        "A5 factor study at length 16",
        lambda df: compact_state_tracking(df, "a5_prefix", 16, A5_AT_16),
        "depth 4, d=128, 1500 steps, transformer 3000; paper preset, init; exact decoding; "
        "censored: losses still falling at the end",
    ),
    (
        "Z60 control (abelian, same order as A5)",
        "Z60 control",
        compact_z60,
        "the same models and budgets as on A5",
    ),
    (
        "Gap recovery on byte-level text",
        "Gap recovery",
        compact_gap,
        "2 layers, d=64, T=32, 300 steps, 3 seeds; exact-decoding BPB, paired by seed",
    ),
    (
        "Baselines: looped and pondering models",
        "Baselines",
        compact_baselines,
        "S3 prefix products at length 16, 2 layers, d=128, 300 steps",
    ),
    (
        "Speed: LRT against the transformer",
        "Speed",
        lambda df: compact_bench(),
        "one CPU thread; the whole training step, forward + backward alone in brackets; each row "
        "says which way its ratio reads",
    ),
]


# The summary under the compact tables (In short): every figure a value of `prose_values`.
IN_SHORT = (
    "**In short**, at these sizes and with the protocol of each comparison named: on A5 at "
    "length 16, whether the paper's Interleaved(2) beats the transformer depends on the forward"
    " scored ({protocol_link}). With the training schedule's parallel forward, what the paper's"
    " released code logs, at matched steps ({protocol.short}) it is ahead on every seed (pos@90"
    " {protocol.il.parallel} against {protocol.t_short.parallel}; 3 seeds, exact permutation p "
    "= {protocol.p.parallel_matched_steps}, the smallest possible at 3 against 3), and one "
    "{protocol.long}-step seed reaches {protocol.il_long.parallel}. With exact decoding, the "
    "model's real inference, it is not ({protocol.il.exact} against the transformer's "
    "{protocol.t_long.exact} at matched token-forwards, p = "
    "{protocol.p.exact_matched_compute}), and the {protocol.long}-step seed stays at "
    "{protocol.il_long.exact}: what the store supports is a train/inference mismatch that grows"
    " with training, not that the paper fails to reproduce. In the earlier trainer frontier, "
    "trainers that follow the recurrence further reached the training length under exact "
    "decoding on some seeds (FixedPoint(0.1, 8) on {a5_16.fp01_8.learned}, Rollout(1) on "
    "{frontier.rollout1.learned}, the selection seed), but with 3 seeds per arm and runs "
    "censored at {a5_16.steps} steps it could not rank them. {study.status} Whether "
    "Interleaved(2) beats the transformer is per task: on S3 prefix products at length 16 "
    "({base.steps} steps, "
    "matched steps, each model's own decoding, 3 seeds) Interleaved(2) is more accurate than the "
    "transformer ({base.il.acc} against {base.transformer.acc}; Welch t-test p = "
    "{base.il.welch_p}, exact permutation p = {base.il.perm_p}). On byte-level text (exact-"
    "decoding BPB, paired by seed, 3 seeds) exact training's gain over the transformer is not "
    "significant (Delta {gap.exact.delta}, paired t-test p = {gap.exact.t_p}, permutation p = "
    "{gap.exact.p}), and Interleaved(2) recovers none of it (Delta {gap.il.delta})."
)


def in_short(df: pd.DataFrame, study_status: str) -> str | None:
    named = prose_values(df)
    named["protocol_link"] = link("Which forward is scored")
    named["study.status"] = study_status
    fields = re.findall(r"\{([\w@.-]+)\}", IN_SHORT)
    if any(f not in named for f in fields):
        return None
    text = re.sub(r"\{([\w@.-]+)\}", lambda m: named[m.group(1)], IN_SHORT)
    return textwrap.fill(text, 100, break_long_words=False, break_on_hyphens=False)


def compact_block(df: pd.DataFrame, study: TrainerStudyResults) -> str:
    df = earlier_runs(df)
    parts = []
    for title, section, build, setup in COMPACT:
        table = build(df)
        if table is not None:
            parts.append(f"**{title}** ({setup}).\nFull tables: {link(section)}.\n\n{table}")
    # the study's own runs are left out of the tables above, not out of its sentence
    summary = in_short(df, trainer_study_status(study))
    if summary is not None:
        parts.append(summary)
    return "\n\n".join(parts)


# Numbers of the prose ---------------------------------------------------------------------------
# Every figure the template's prose states from the store is a `<!-- value: NAME -->` placeholder
# filled from `prose_values`, so no number of the page is typed and a changed run changes the text.


def seeds_text(values, fmt: str = "{:g}") -> str:
    """Per-seed figures in seed order: "16, 10, 16"."""
    return ", ".join("-" if pd.isna(v) else fmt.format(v) for v in values)


def learned_text(values, length: int) -> str:
    """How many of the runs reached pos@90 = length: "2 of 3"."""
    values = list(values)
    return f"{sum(int(v) >= length for v in values)} of {len(values)}"


def p_text(p: float) -> str:
    if p is None or math.isnan(p):
        return "-"
    return f"{p:.2f}" if p >= 0.01 else f"{p:.3f}" if p >= 0.001 else "< 0.001"


def p_is(p: float) -> str:
    """ "p = 0.004", or "p < 0.001" below what p_text writes out."""
    text = p_text(p)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


def frontier_runs(df: pd.DataFrame, task: str = "a5_prefix", length: int = 16) -> pd.DataFrame:
    """The load_runs rows of the trainer frontier (`frontier_points`), each with its `trainer`
    label, in seed order per trainer: the frontier's points carry no run folder, and the prose
    reads some runs' curves."""
    points = frontier_points(df, task, length)
    if points.empty:
        return pd.DataFrame()
    sub = df[(df["config.train.task"] == task) & (df["config.train.length"] == length)]
    rows = []
    for _, p in points.iterrows():
        match = sub[sub["run"] == p["run"]]
        if len(match) != 1:
            raise SystemExit(f"frontier point {p['trainer']} seed {p['seed']}: {len(match)} runs")
        rows.append(match.iloc[0].to_dict() | {"trainer": p["trainer"]})
    return pd.DataFrame(rows).sort_values(["trainer", "config.train.seed"]).reset_index(drop=True)


def trainer_runs(runs: pd.DataFrame, trainer: str) -> pd.DataFrame:
    return runs[runs["trainer"] == trainer].sort_values("config.train.seed")


def curve(run, column: str, kind: str = "train") -> pd.Series:
    """A run's metric per step (metrics.jsonl)."""
    m = load_metrics(run, kind=kind)
    return m.set_index("step")[column]


def frontier_values(df: pd.DataFrame, length: int = 16) -> dict[str, str]:
    """The trainer frontier's prose: which trainers reached the training length on which seeds,
    the seeds run after the choice, and why rollout:1 and fixedpoint:0.01:16 are one update."""
    runs = frontier_runs(df, length=length)
    if runs.empty:
        return {}
    out = {}
    lengths = sorted(
        int(c.split("@")[1]) for c in runs if c.startswith("summary.eval.pos90_exact@")
    )
    lengths = [n for n in lengths if runs[f"summary.eval.pos90_exact@{n}"].notna().any()]
    for trainer, key in (
        ("lrt rollout:1", "rollout1"),
        ("lrt rollout:2", "rollout2"),
        ("lrt fixedpoint:0.01:16", "fp001_16"),
        ("lrt fixedpoint:0.1:8", "fp01_8"),
        ("lrt exact", "exact"),
    ):
        t = trainer_runs(runs, trainer)
        if not t.empty:
            out |= _frontier_trainer_values(t, key, length, lengths)
    out |= _frontier_update_values(runs, length)
    return out


def _frontier_trainer_values(t: pd.DataFrame, key: str, length: int, lengths: list) -> dict:
    """One trainer's figures in the frontier's prose (its runs `t`, keyed `frontier.{key}.*`)."""
    out = {}
    at = t[f"summary.eval.pos90_exact@{length}"]
    out[f"frontier.{key}.learned"] = learned_text(at, length)
    out[f"frontier.{key}.pos90"] = seeds_text(at)
    out[f"frontier.{key}.pos90_all"] = ", ".join(
        "/".join(whole(r[f"summary.eval.pos90_exact@{n}"]) for n in lengths)
        for _, r in t.iterrows()
    )
    out[f"frontier.{key}.seeds"] = seeds_text(t["config.train.seed"])
    first = t["config.train.seed"].min()
    later = t[t["config.train.seed"] != first]
    out[f"frontier.{key}.later_pos90"] = seeds_text(later[f"summary.eval.pos90_exact@{length}"])
    out[f"frontier.{key}.later_learned"] = learned_text(
        later[f"summary.eval.pos90_exact@{length}"], length
    )
    out[f"frontier.{key}.compute"] = f"{(t['summary.compute_tokens'] / 1e6).mean():.1f}"
    out[f"frontier.{key}.wall_min"] = f"{(t['summary.wall_time_s'] / 60).mean():.0f}"
    out[f"frontier.{key}.acc"] = seeds_text(t[f"summary.eval.acc_exact@{length}"], "{:.2f}")
    out[f"frontier.{key}.final_loss"] = seeds_text(t["summary.final_loss"], "{:.2f}")
    seed0 = t.iloc[0]
    out[f"frontier.{key}.first_seed"] = whole(seed0["config.train.seed"])
    out[f"frontier.{key}.first_pos90_all"] = ", ".join(
        whole(seed0[f"summary.eval.pos90_exact@{n}"]) for n in lengths
    )
    out[f"frontier.{key}.first_acc"] = f"{seed0[f'summary.eval.acc_exact@{length}']:.4f}"
    out["frontier.lengths"] = ", ".join(map(str, lengths))
    return out


def _frontier_update_values(runs: pd.DataFrame, length: int) -> dict:
    """fixedpoint:0.01:16 against rollout:1 (one update, two roundings), and the rollout seeds
    that stalled."""
    out = {}
    # fixedpoint:0.01:16 against rollout:1 on their shared seed: the sweeps it ran at the training
    # length, and how many steps their losses agree (one update, two roundings)
    fp, r1 = trainer_runs(runs, "lrt fixedpoint:0.01:16"), trainer_runs(runs, "lrt rollout:1")
    if not fp.empty and not r1.empty:
        train = [load_metrics(row, kind="train") for _, row in fp.iterrows()]
        at_length = pd.concat([m[m["length"] == length] for m in train])
        out["frontier.fp001_16.sweeps_at_length"] = (
            f"{int(at_length['sweeps'].min())}"
            if at_length["sweeps"].nunique() == 1
            else f"{int(at_length['sweeps'].min())}-{int(at_length['sweeps'].max())}"
        )
        out["frontier.fp001_16.residual_max"] = f"{at_length['residual'].max():g}"
        seed = int(fp["config.train.seed"].min())
        a = curve(fp[fp["config.train.seed"] == seed].iloc[0], "loss")
        b = curve(r1[r1["config.train.seed"] == seed].iloc[0], "loss")
        apart = (a - b).abs() > 1e-3
        out["frontier.same_update.seed"] = str(seed)
        out["frontier.same_update.steps"] = str(
            int(apart[apart].index.min()) - 1 if apart.any() else int(a.index.max())
        )
        # the rollout:1 seeds that did not learn: their loss at the last step before the
        # curriculum reaches the training length and 400 steps later
        reach = int(train[0].loc[train[0]["length"] == length, "step"].min()) - 1
        later = reach + 400
        stalled = r1[r1[f"summary.eval.pos90_exact@{length}"] < length]
        out["frontier.rollout1.stalled_seeds"] = seeds_text(stalled["config.train.seed"])
        out["frontier.rollout1.stalled_acc"] = seeds_text(
            stalled[f"summary.eval.acc_exact@{length}"], "{:.2f}"
        )
        out["frontier.rollout1.stalled_losses"] = ", ".join(
            f"{curve(row, 'loss')[reach]:.2f} -> {curve(row, 'loss')[later]:.2f}"
            for _, row in stalled.iterrows()
        )
        out["frontier.curriculum_short_until"] = str(reach)
        for trainer, key in (("lrt rollout:1", "rollout1"), ("lrt rollout:2", "rollout2")):
            t = trainer_runs(runs, trainer)
            out[f"frontier.{key}.loss_short"] = seeds_text(
                [curve(r, "loss")[reach] for _, r in t.iterrows()], "{:.2f}"
            )
        r2 = trainer_runs(runs, "lrt rollout:2")
        res = permutation(
            r1[f"summary.eval.pos90_exact@{length}"], r2[f"summary.eval.pos90_exact@{length}"]
        )
        out["frontier.p.rollout2_vs_rollout1"] = p_text(res["p"])
        out["frontier.curriculum_later_step"] = str(later)
    return out


def a5_8_values(df: pd.DataFrame, length: int = 8) -> dict[str, str]:
    """The A5 runs at length 8: per-seed exact pos@90 and how many seeds reach the training
    length, from the same rows as the README's compact table (`compact_rows`)."""
    sub = labelled(df[df["config.train.length"] == length], "a5_prefix")
    if sub.empty:
        return {}
    out, got = {}, {}
    for key, (label, init) in A5_AT_8_KEYS.items():
        runs = compact_rows(sub, label, init)
        if runs.empty:
            continue
        pos = runs[f"summary.eval.pos90_exact@{length}"]
        out[f"a5_8.{key}.pos90"] = seeds_text(pos)
        out[f"a5_8.{key}.learned"] = learned_text(pos, length)
        out[f"a5_8.{key}.parallel"] = seeds_text(runs[f"summary.eval.pos90_parallel@{length}"])
        out[f"a5_8.{key}.acc"] = f"{runs[f'summary.eval.acc_exact@{length}'].mean():.2f}"
        out[f"a5_8.{key}.n"] = str(len(runs))
        out[f"a5_8.{key}.wall_s"] = f"{runs['summary.wall_time_s'].mean():.0f}"
        out[f"a5_8.{key}.seeds"] = seeds_text(runs["config.train.seed"])
        longer = [n for n in evaluated_lengths(sub) if n > length]
        reached = runs[pos >= length]
        out[f"a5_8.{key}.beyond"] = (
            "; ".join(
                "/".join(whole(r[f"summary.eval.pos90_exact@{n}"]) for n in longer)
                for _, r in reached.iterrows()
            )
            or "-"
        )
        out[f"a5_8.{key}.at_4x"] = span(reached[f"summary.eval.pos90_exact@{longer[-1]}"])
        got[key] = runs
    if "il" in got and "il_top" in got:
        col = f"summary.eval.pos90_exact@{length}"
        out["a5_8.p.il_top_vs_il"] = p_text(permutation(got["il"][col], got["il_top"][col])["p"])
        out["a5_8.p_min.il_top_vs_il"] = p_text(smallest_p(len(got["il"]), len(got["il_top"])))
    for key in ("il", "exact", "fullseq3", "exact_top", "il_top"):
        if key in got and "transformer" in got:
            col = f"summary.eval.pos90_exact@{length}"
            out[f"a5_8.p.{key}_vs_transformer"] = p_text(
                permutation(got["transformer"][col], got[key][col])["p"]
            )
    if "transformer" in got:
        base = got["transformer"]["summary.wall_time_s"].mean()
        for key in ("exact", "fullseq3", "il"):
            if key in got:
                out[f"a5_8.{key}.wall_ratio"] = (
                    f"{got[key]['summary.wall_time_s'].mean() / base:.1f}"
                )
    learned = pd.concat(
        [
            r[r[f"summary.eval.pos90_exact@{length}"] >= length]
            for k, r in got.items()
            if k.startswith(("exact", "fullseq"))
        ]
    )
    if not learned.empty:
        longest = max(evaluated_lengths(sub))
        out["a5_8.learned.at_4x"] = span(learned[f"summary.eval.pos90_exact@{longest}"])
        out["a5_8.longest"] = str(longest)
    return out


def permutation(a, b) -> dict:
    """B against A, unpaired: `contrast` (exact two-sided permutation p, bootstrap interval)."""
    return contrast(list(a), list(b), paired=False)


def censoring_values(df: pd.DataFrame, length: int = 16) -> dict[str, str]:
    """How much of the factor study's budget the runs spend at the training length at the full
    learning rate, and the losses still falling at its end (the runs are censored)."""
    runs = frontier_runs(df, length=length)
    base = trainer_runs(runs, "lrt interleaved:2") if not runs.empty else runs
    if base.empty:
        return {}
    out = {}
    train = load_metrics(base.iloc[0], kind="train")
    at_length = train[train["length"] == length]
    full_rate = at_length[at_length["lr_mult"] == 1.0]
    steps = int(base["config.train.steps"].iloc[0])
    out["a5_16.steps"] = str(steps)
    out["a5_16.reaches_length_step"] = str(int(at_length["step"].min()))
    out["a5_16.last_full_rate_step"] = str(int(full_rate["step"].max()))
    out["a5_16.full_rate_steps"] = str(len(full_rate))
    # the jump to the training length: the mean training loss of the 50 steps after it against the
    # 50 before, per run of the frontier
    jump = int(at_length["step"].min())
    raised = []
    for _, r in runs.iterrows():
        loss = curve(r, "loss")
        raised.append(loss.loc[jump : jump + 49].mean() > loss.loc[jump - 50 : jump - 1].mean())
    out["a5_16.jump_raised"] = f"{sum(raised)} of {len(raised)}"
    # the seed of the base whose loss falls most over the last 500 steps
    checkpoints = [steps - 500, steps - 250, steps]
    drops = {
        int(r["config.train.seed"]): curve(r, "loss")[checkpoints].to_numpy()
        for _, r in base.iterrows()
    }
    seed = max(drops, key=lambda k: drops[k][0] - drops[k][-1])
    out["a5_16.falling_seed"] = str(seed)
    out["a5_16.falling_steps"] = " / ".join(map(str, checkpoints))
    out["a5_16.falling_losses"] = " -> ".join(f"{v:.2f}" for v in drops[seed])
    # the transformer's exact pos@90 at every evaluation, per seed: has it plateaued?
    plain = trainer_runs(runs, "transformer | steps=3000")
    if not plain.empty:
        evals = [load_metrics(r, kind="eval") for _, r in plain.iterrows()]
        out["a5_16.transformer.eval_steps"] = " / ".join(str(int(v)) for v in evals[0]["step"])
        out["a5_16.transformer.trajectory"] = "; ".join(
            "/".join(whole(v) for v in e[f"pos90_exact@{length}"]) for e in evals
        )
    longer = trainer_runs(runs, f"lrt interleaved:2 | steps={2 * steps}")
    if not longer.empty:
        out["a5_16.il_long_steps"] = str(2 * steps)
        out["a5_16.il_long_parallel"] = whole(
            longer[f"summary.eval.pos90_parallel@{length}"].iloc[0]
        )
        out["a5_16.il_long_exact"] = whole(longer[f"summary.eval.pos90_exact@{length}"].iloc[0])
    return out


def ranking_values(df: pd.DataFrame, length: int = 16) -> dict[str, str]:
    """The factor study's trainers against each other: per-seed exact pos@90, how many seeds reach
    the training length, exact permutation tests, and the smallest p such a test can give."""
    runs = frontier_runs(df, length=length)
    if runs.empty:
        return {}
    out = {}
    col = f"summary.eval.pos90_exact@{length}"
    arms = {
        "transformer": "transformer | steps=3000",
        "il": "lrt interleaved:2",
        "fp01_8": "lrt fixedpoint:0.1:8",
        "fullseq3": "lrt fullseq:3",
    }
    got = {k: trainer_runs(runs, t) for k, t in arms.items()}
    for key, t in got.items():
        if t.empty:
            continue
        out[f"a5_16.{key}.pos90"] = seeds_text(t[col])
        out[f"a5_16.{key}.learned"] = learned_text(t[col], length)
        out[f"a5_16.{key}.n"] = str(len(t))
        out[f"a5_16.{key}.compute"] = f"{(t['summary.compute_tokens'] / 1e6).mean():.1f}"
        out[f"a5_16.{key}.steps"] = whole(t["config.train.steps"].iloc[0])
    for a, b in (("transformer", "fp01_8"), ("il", "fp01_8"), ("transformer", "il")):
        if got[a].empty or got[b].empty:
            continue
        res = permutation(got[a][col], got[b][col])
        out[f"a5_16.p.{b}_vs_{a}"] = p_text(res["p"])
        out["a5_16.p_min"] = p_text(smallest_p(len(got[a]), len(got[b])))
    return out


def compute_values(df: pd.DataFrame, length: int = 16, bench_dir: Path = REPO / "docs" / "bench"):
    """What the compute axis (token-forwards) says against the wall clock: FixedPoint(0.1, 8)
    against Interleaved(2) in token-forwards, in the runs' own wall clock, and in the bench's
    training-step time at the study's shape."""
    runs = frontier_runs(df, length=length)
    if runs.empty:
        return {}
    fp = trainer_runs(runs, "lrt fixedpoint:0.1:8")
    il = trainer_runs(runs, "lrt interleaved:2")
    if fp.empty or il.empty:
        return {}

    def ratio(column):
        return f"{fp[column].mean() / il[column].mean():.2f}"

    out = {
        "compute.fp_il_ratio": ratio("summary.compute_tokens"),
        "compute.fp_il_wall_ratio": ratio("summary.wall_time_s"),
        "compute.fp_wall_min": seeds_text(fp["summary.wall_time_s"] / 60, "{:.0f}"),
        "compute.il_wall_min": seeds_text(il["summary.wall_time_s"] / 60, "{:.0f}"),
    }
    shape = (length, int(fp["config.train.batch_size"].iloc[0]))
    for name, r in load_results(bench_dir) if Path(bench_dir).is_dir() else []:
        s = r["settings"]
        if (s["seq_len"], s["batch_size"]) != shape or "fixedpoint" not in r["train_ratio"]:
            continue
        out["compute.bench_file"] = name
        out["compute.bench_fp_spec"] = r["sweeps_used"]["fixedpoint"]["spec"]
        out["compute.bench_fp_sweeps"] = f"{r['sweeps_used']['fixedpoint']['median']:g}"
        out["compute.bench_fp_il_ratio"] = (
            f"{r['train_ratio']['fixedpoint'] / r['train_ratio']['interleaved_2']:.2f}"
        )
        out["compute.bench_threads"] = str(r["environment"]["threads"])
    # FixedPoint(0.1, 8)'s sweeps: from which step every step ran all of them
    train = [load_metrics(r, kind="train") for _, r in fp.iterrows()]
    cap = int(str(fp["config.schedule"].iloc[0]).split(":")[2])
    last_short = [int(m.loc[m["sweeps"] < cap, "step"].max()) for m in train]
    out["a5_16.fp01_8.cap"] = str(cap)
    out["a5_16.fp01_8.all_sweeps_after"] = seeds_text(last_short)
    return out


def convergence_by_sweep(run) -> pd.DataFrame | None:
    """A run's tables/convergence.csv (`lrt-lab analyze convergence`) per sweep: the largest
    relative change of the memory over positions (`residual`), the loss after that sweep and
    exact decoding's loss."""
    path = Path(run["path"]) / "tables" / "convergence.csv"
    if not path.is_file():
        return None
    t = pd.read_csv(path)
    return t.groupby("sweep").agg(
        residual=("residual", "max"), loss=("loss", "first"), exact=("exact_loss", "first")
    )


def first_sweep(by_sweep: pd.DataFrame, ok: pd.Series) -> int | None:
    """The first sweep (after the init pass, sweep 0) from which `ok` holds at every later sweep."""
    bad = by_sweep.index[~ok.to_numpy()]
    later = [int(k) for k in by_sweep.index if k > (bad.max() if len(bad) else -1) and k > 0]
    return later[0] if later else None


def span(values) -> str:
    """ "3" or "3-4": the range of a few integers."""
    values = [int(v) for v in values if v is not None]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def convergence_values(df: pd.DataFrame) -> dict[str, str]:
    """The convergence diagnostics the prose quotes: the A5 FixedPoint(0.1, 8) models and the
    Interleaved(2) ones at length 16, and the FixedPoint models on text."""
    out = {}
    runs = frontier_runs(df, length=16)
    if not runs.empty:
        fp = trainer_runs(runs, "lrt fixedpoint:0.1:8")
        tables = [(int(r["config.train.seed"]), convergence_by_sweep(r)) for _, r in fp.iterrows()]
        tables = [(seed, t) for seed, t in tables if t is not None]
        if tables:
            cap = int(str(fp["config.schedule"].iloc[0]).split(":")[2])
            out["convergence.a5.seeds"] = seeds_text([seed for seed, _ in tables])
            out["convergence.a5.residual_at_cap"] = seeds_text(
                [t.loc[cap, "residual"] for _, t in tables], "{:.2f}"
            )
            out["convergence.a5.sweeps"] = str(int(tables[0][1].index.max()))
            for tol, key in ((0.1, "to_0.1"), (0.001, "to_0.001")):
                out[f"convergence.a5.sweeps_{key}"] = seeds_text(
                    [first_sweep(t, t["residual"] < tol) for _, t in tables]
                )
            out["convergence.a5.loss_gap_at_cap"] = seeds_text(
                [t.loc[cap, "loss"] - t.loc[cap, "exact"] for _, t in tables], "{:+.3f}"
            )
        sub = labelled(df[df["config.train.length"] == 16], "a5_prefix")
        for key, (label, preset) in {
            "base": ("lrt interleaved:2 (4 layers) (1500 steps)", "paper preset, paper init"),
            "released": ("lrt interleaved:2 (4 layers, released preset)", "released preset"),
        }.items():
            rows = compact_rows(sub, label, preset)
            t = convergence_by_sweep(rows.iloc[0]) if not rows.empty else None
            if t is not None:
                out[f"convergence.a5.il_{key}.sweeps_to_0.1"] = str(
                    first_sweep(t, t["residual"] < 0.1)
                )
    text = df[
        (df["config.train.task"] == "text_bytes")
        & df["config.schedule"].astype(str).str.startswith("fixedpoint")
    ]
    tables = [convergence_by_sweep(r) for _, r in text.iterrows()]
    tables = [t for t in tables if t is not None]
    if tables:
        out["convergence.text.runs"] = str(len(tables))
        for tol in (0.1, 0.01, 0.001):
            out[f"convergence.text.sweeps_to_{tol:g}"] = span(
                first_sweep(t, t["residual"] < tol) for t in tables
            )
        out["convergence.text.sweeps_to_exact_loss"] = span(
            first_sweep(t, (t["loss"] - t["exact"]).abs() < 1e-3) for t in tables
        )
        # how fast the change shrinks: the geometric mean of the per-sweep ratio, from sweep 2 to
        # the sweep where it falls below 0.001
        factors = []
        for t in tables:
            end = first_sweep(t, t["residual"] < 1e-3)
            r = t.loc[2:end, "residual"].to_numpy()
            factors.append((r[0] / r[-1]) ** (1 / (len(r) - 1)))
        out["convergence.text.shrink"] = f"{statistics.mean(factors):.1f}"
    return out


def protocol_values(df: pd.DataFrame, length: int = 16) -> dict[str, str]:
    """The protocol comparison's figures: Interleaved(2) against the transformer, exact decoding
    and parallel forward, at matched steps and at matched compute, and the growing mismatch."""
    points = protocol_points(df, length)
    if points.empty:
        return {}
    out = {}
    il, il_long, plain = PROTOCOL_ROWS[1], PROTOCOL_ROWS[2], PROTOCOL_ROWS[0]
    short = int(points.loc[points["trainer"] == il, "steps"].iloc[0])
    long = int(points.loc[points["trainer"] == plain, "steps"].iloc[0])

    def at(trainer, step):
        g = points[(points["trainer"] == trainer) & (points["step"] == step)]
        return g.sort_values("seed")

    out["protocol.short"], out["protocol.long"] = str(short), str(long)
    for key, (trainer, step) in {
        "il": (il, short),
        "t_short": (plain, short),
        "t_long": (plain, long),
        "il_long": (il_long, long),
    }.items():
        g = at(trainer, step)
        if g.empty:
            continue
        out[f"protocol.{key}.exact"] = seeds_text(g["exact"])
        out[f"protocol.{key}.parallel"] = seeds_text(g["parallel"])
        out[f"protocol.{key}.compute"] = f"{g['compute'].mean():.1f}"
    for forward in ("exact", "parallel"):
        for key, step in (("steps", short), ("compute", long)):
            res = permutation(at(plain, step)[forward], at(il, short)[forward])
            out[f"protocol.p.{forward}_matched_{key}"] = p_text(res["p"])
    out["protocol.p_min"] = p_text(smallest_p(len(at(plain, short)), len(at(il, short))))
    # the mismatch of the longer run at every evaluation: parallel minus exact pos@90
    runs = frontier_runs(df, length=length)
    longer = trainer_runs(runs, il_long)
    if not longer.empty:
        evals = load_metrics(longer.iloc[0], kind="eval")
        gap = evals[f"pos90_parallel@{length}"] - evals[f"pos90_exact@{length}"]
        out["protocol.il_long.eval_steps"] = " / ".join(str(int(v)) for v in evals["step"])
        out["protocol.il_long.mismatch"] = " / ".join(str(int(v)) for v in gap)
        out["protocol.il_long.seed"] = whole(longer["config.train.seed"].iloc[0])
    return out


GAP_KEYS = {
    "exact": "lrt exact",
    "fullseq3": "lrt fullseq:3",
    "il": "lrt interleaved:2",
    "fp01": "lrt fixedpoint:0.1:8",
    "fp001": "lrt fixedpoint:0.01:8",
}


def gap_values(df: pd.DataFrame) -> dict[str, str]:
    """The gap-recovery prose: the held-out set, each method's paired Delta, whether Exact's own
    gain is significant, the reruns' check against the originals, and FixedPoint's sweeps."""
    runs = gap_runs(df)
    if runs.empty or "transformer" not in set(runs["method"]):
        return {}
    table = gap_contrasts(runs).set_index("method")
    out = {}
    length = int(runs["config.train.length"].iloc[0])
    tokens = sorted(set(runs["bpb.n_tokens"]))
    out["gap.n_tokens"] = " or ".join(str(n) for n in tokens)
    out["gap.n_sequences"] = " or ".join(str(n // length) for n in tokens)
    out["gap.base"] = f"{runs.loc[runs['method'] == 'transformer', 'bpb.exact'].mean():.4f}"
    out["gap.p_min"] = p_text(smallest_p(int(table["n_a"].min()), paired=True))
    bpb = runs.pivot_table(index="config.train.seed", columns="method", values="bpb.exact")
    for key, method in GAP_KEYS.items():
        if method not in table.index:
            continue
        r = table.loc[method]
        out[f"gap.{key}.delta"] = f"{r['effect']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]"
        out[f"gap.{key}.p"] = p_text(r["p"])
        out[f"gap.{key}.recovered"] = f"{100 * r['recovered']:.0f}%"
        out[f"gap.{key}.bpb"] = f"{r['bpb']:.4f}"
        pair = bpb[["transformer", method]].dropna()
        out[f"gap.{key}.t_p"] = p_text(
            float(scipy_stats.ttest_rel(pair[method], pair["transformer"]).pvalue)
        )
        method_runs = runs[runs["method"] == method]
        out[f"gap.{key}.cost"] = forwards_per_token(method_runs)
        # the training schedule's own (parallel) forward against the transformer
        par = runs.pivot_table(index="config.train.seed", columns="method", values="bpb.parallel")
        both = pd.concat([bpb["transformer"], par[method]], axis=1).dropna()
        out[f"gap.{key}.parallel_delta"] = f"{(both.iloc[:, 1] - both.iloc[:, 0]).mean():+.4f}"
        gap = (method_runs["bpb.parallel"] - method_runs["bpb.exact"]).abs().max()
        out[f"gap.{key}.parallel_exact_max"] = f"{gap:.4f}"
        if method.startswith("lrt fixedpoint"):
            sweeps = [load_metrics(r, kind="train")["sweeps"] for _, r in method_runs.iterrows()]
            out[f"gap.{key}.sweeps_first50"] = (
                f"{statistics.mean(x.iloc[:50].mean() for x in sweeps):.1f}"
            )
            out[f"gap.{key}.sweeps_last50"] = (
                f"{statistics.mean(x.iloc[-50:].mean() for x in sweeps):.1f}"
            )
    # runs retrained and rescored (their tables/retrain_check.csv): how close to the originals
    checks = {}
    for _, r in runs.iterrows():
        t = load_table(r, "retrain_check")
        if t is not None:
            checks[(r["method"], int(r["config.train.seed"]))] = t.set_index("quantity")
    if checks:
        out["gap.retrained.runs"] = ", ".join(sorted({m for m, _ in checks}))
        out["gap.retrained.seeds"] = seeds_text(sorted({s for _, s in checks}))
        loss = [
            abs(t.loc["final_loss", "retrained"] / t.loc["final_loss", "original"] - 1)
            for t in checks.values()
        ]
        out["gap.retrained.loss_rel_max"] = f"{100 * max(loss):.1f}%"
        diff = [
            t.loc["bpb_exact_first_256", "retrained"] - t.loc["bpb_exact_first_256", "original"]
            for t in checks.values()
        ]
        out["gap.retrained.bpb_diff"] = f"{min(diff):+.4f} to {max(diff):+.4f}"
    return out


def paper_values(df: pd.DataFrame) -> dict[str, str]:
    """The paper's figures the prose quotes (typed once, in PAPER_*)."""
    return {
        "paper.gap.il": PAPER_GAP["lrt interleaved:2"],
        "paper.gap.fullseq3": PAPER_GAP["lrt fullseq:3"],
        "paper.a5.transformer": PAPER_A5["transformer (4 layers)"],
        "paper.a5.il": PAPER_A5["lrt interleaved:2 (4 layers)"],
        "paper.z60.accuracy": PAPER_Z60_ACCURACY,
        "paper.scale": PAPER_SCALE,
    }


def truncation_values(df: pd.DataFrame, length: int = 16) -> dict[str, str]:
    """The truncation study's prose: pos@90 over supervised positions at each k > 1, what the
    summaries had counted, the accuracy of the counted positions against chance, and the losses."""
    runs = truncation_runs(df, length=length)
    if runs.empty:
        return {}
    out = {}
    vocab = int(df.loc[df["config.train.task"] == "a5_prefix", "config.task_vocab_size"].iloc[0])
    out["trunc.chance"] = f"{1 / vocab:.3f}"
    out["trunc.chance_loss"] = f"{math.log(vocab):.2f}"
    for k in sorted(runs["k"].unique()):
        if k == 1:
            continue
        cell = runs[runs["k"] == k]
        out[f"trunc.k{k}.pos90"] = span(cell[f"pos90@{length}"])
        out[f"trunc.k{k}.summary_pos90"] = span(cell["summary_pos90"])
        out[f"trunc.k{k}.runs"] = str(len(cell))
        out[f"trunc.k{k}.first"] = str(k)
        # accuracy of the supervised positions after the first k (exact decoding, at the
        # training length)
        accs = []
        for _, r in cell.iterrows():
            t = load_table(r, "per_position")
            t = t[(t["length"] == length) & (t["mode"] == "exact") & t["accuracy"].notna()]
            accs += list(t.loc[t["position"] > k, "accuracy"])
        out[f"trunc.k{k}.acc_range"] = f"{min(accs):.3f}-{max(accs):.3f}"
        losses = cell.groupby("trainer")["final_loss"].mean().sort_values()
        out[f"trunc.k{k}.losses"] = ", ".join(f"{t} {v:.2f}" for t, v in losses.items())
        out[f"trunc.k{k}.loss_range"] = f"{losses.min():.2f}-{losses.max():.2f}"
    return out


A5_AT_16_CELLS = {  # the factor study's rows the prose names: {key: (label, memory cell)}
    "base": ("lrt interleaved:2 (4 layers) (1500 steps)", "paper preset, paper init"),
    "released": ("lrt interleaved:2 (4 layers, released preset)", "released preset"),
    "normed": ("lrt interleaved:2 (4 layers, memory from block 4, normed)", "paper init"),
    "src_final": ("lrt interleaved:2 (4 layers, memory from block 4)", "paper init"),
    "layerwise": ("lrt interleaved:2 (4 layers, layerwise)", "paper init"),
    "init_transformer": ("lrt interleaved:2 (4 layers)", "start-as-transformer"),
    "exact": ("lrt exact (4 layers)", "paper init"),
    "fp001": ("lrt fixedpoint:0.01:16 (4 layers)", "paper init"),
}


def versus(a, b) -> str:
    """Seed by seed, how b compares with a: "higher on 1, equal on 1, lower on 1"."""
    pairs = list(zip(a, b))
    counts = [
        sum(y > x for x, y in pairs),
        sum(y == x for x, y in pairs),
        sum(y < x for x, y in pairs),
    ]
    return ", ".join(f"{w} on {n}" for w, n in zip(("higher", "equal", "lower"), counts) if n)


def cells_values(df: pd.DataFrame, length: int = 16) -> dict[str, str]:
    """The factor study's one-factor cells: exact and parallel pos@90 and accuracy per seed, and
    the released preset against the base seed by seed."""
    sub = labelled(df[df["config.train.length"] == length], "a5_prefix")
    if sub.empty:
        return {}
    out, got = {}, {}
    for key, (label, memory) in A5_AT_16_CELLS.items():
        runs = compact_rows(sub, label, memory)
        if runs.empty:
            continue
        got[key] = runs
        out[f"cell.{key}.exact"] = seeds_text(runs[f"summary.eval.pos90_exact@{length}"])
        out[f"cell.{key}.exact_all"] = ", ".join(
            "/".join(
                whole(r[c])
                for c in sorted(
                    (
                        c
                        for c in runs
                        if c.startswith("summary.eval.pos90_exact@") and runs[c].notna().any()
                    ),
                    key=lambda c: int(c.split("@")[1]),
                )
            )
            for _, r in runs.iterrows()
        )
        out[f"cell.{key}.parallel"] = seeds_text(runs[f"summary.eval.pos90_parallel@{length}"])
        out[f"cell.{key}.acc"] = seeds_text(runs[f"summary.eval.acc_exact@{length}"], "{:.3f}")
        out[f"cell.{key}.acc4"] = seeds_text(runs[f"summary.eval.acc_exact@{length}"], "{:.4f}")
        out[f"cell.{key}.final_loss"] = seeds_text(runs["summary.final_loss"], "{:.2f}")
        out[f"cell.{key}.n"] = str(len(runs))
        out[f"cell.{key}.compute"] = f"{(runs['summary.compute_tokens'] / 1e6).mean():.1f}"
    if "base" in got and "released" in got:
        base = got["base"].set_index("config.train.seed")
        released = got["released"].set_index("config.train.seed")
        seeds = sorted(set(base.index) & set(released.index))
        for metric, key in (("pos90_exact", "exact"), ("acc_exact", "acc")):
            col = f"summary.eval.{metric}@{length}"
            out[f"cell.released_vs_base.{key}"] = versus(
                base.loc[seeds, col], released.loc[seeds, col]
            )
        out["cell.released_vs_base.seeds"] = str(len(seeds))
    plain = frontier_runs(df, length=length)
    plain = trainer_runs(plain, "transformer | steps=3000") if not plain.empty else plain
    if "fp001" in got and not plain.empty:
        ratio = (
            got["fp001"]["summary.compute_tokens"].mean() / plain["summary.compute_tokens"].mean()
        )
        out["cell.fp001.compute_vs_transformer"] = f"{ratio:.1f}"
    return out


BASELINE_KEYS = {
    "transformer": "transformer",
    "il": "lrt interleaved:2",
    "fullseq3": "lrt fullseq:3",
    "loop2": "loop:2",
    "loop3": "loop:3",
    "ponder1": "ponder:1",
}


def baseline_values(df: pd.DataFrame, length: int = 16) -> dict[str, str]:
    """The S3 baselines' prose: accuracy per method, each against the transformer (Welch t-test and
    exact permutation test), FullSequence(3) against loop:3, costs, and the runs' total time."""
    sub = df[(df["config.train.task"] == "group_prefix") & (df["config.train.length"] == length)]
    if sub.empty:
        return {}
    sub = sub.assign(method=sub.apply(method_label, axis=1))
    col = f"summary.eval.acc_exact@{length}"
    out = {
        "base.runs": str(len(sub)),
        "base.wall_min": f"{sub['summary.wall_time_s'].sum() / 60:.0f}",
        "base.steps": span(sub["config.train.steps"]),
    }
    for key, method in BASELINE_KEYS.items():
        runs = sub[sub["method"] == method]
        if runs.empty:
            continue
        out[f"base.{key}.acc"] = f"{runs[col].mean():.3f}"
        out[f"base.{key}.cost"] = f"{runs['summary.schedule_cost'].mean():g}"
        out[f"base.{key}.forwards"] = whole(runs["summary.forwards_per_token"].iloc[0])
        out[f"base.{key}.n"] = str(len(runs))
        tests = baseline_tests(sub, method, length)
        if tests is not None:
            out[f"base.{key}.welch_p"], out[f"base.{key}.perm_p"] = map(p_text, tests)
    tests = baseline_tests(sub, "lrt fullseq:3", length, against="loop:3")
    out["base.fullseq3_vs_loop3.welch_p"], out["base.fullseq3_vs_loop3.perm_p"] = map(p_text, tests)
    n = sub.groupby("method").size()
    out["base.p_min"] = p_text(smallest_p(int(n.min()), int(n.min())))
    return out


# the config fields the Exact runs at length 8 and 16 are compared on: (column, what it is)
EXACT_FIELDS = (
    ("config.model.memory.gamma_init", "gamma_init"),
    ("config.model.memory.rec_init", "rec_init"),
    ("config.train.length", "training length"),
    ("config.train.steps", "steps"),
    ("config.train.task_options.curriculum_steps", "curriculum steps"),
    ("config.train.batch_size", "batch size"),
    ("config.train.matrix_lr", "matrix_lr"),
    ("config.train.embedding_lr", "embedding_lr"),
    ("config.train.head_lr", "head_lr"),
    ("config.train.scalar_lr", "scalar_lr"),
    ("config.train.lr_scale", "lr_scale"),
    ("config.train.warmdown_frac", "warmdown_frac"),
)


def plain(value) -> str:
    """A config value as written: 300, not 300.0."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def exact_values(df: pd.DataFrame) -> dict[str, str]:
    """Exact training at length 16 (one seed) against the length-8 runs: its outcome, and which
    config fields differ between them (what the comparison confounds) and which do not."""
    sub16 = labelled(df[df["config.train.length"] == 16], "a5_prefix")
    sub8 = labelled(df[df["config.train.length"] == 8], "a5_prefix")
    if sub16.empty or sub8.empty:
        return {}
    at16 = compact_rows(sub16, *A5_AT_16_CELLS["exact"])
    at8 = compact_rows(sub8, *A5_AT_8_KEYS["exact"])
    if at16.empty or at8.empty:
        return {}
    out = {"exact16.seeds": seeds_text(at16["config.train.seed"]), "exact16.n": str(len(at16))}
    differ, same = [], []
    for column, name in EXACT_FIELDS:
        if column not in df.columns:
            continue
        a, b = {plain(v) for v in at8[column]}, {plain(v) for v in at16[column]}
        if a == b and len(a) == 1:
            same.append(f"{name} {a.pop()}")
        else:
            differ.append(f"{name} {' or '.join(sorted(a))} -> {' or '.join(sorted(b))}")
    out["exact16.differs_in"] = "; ".join(differ)
    out["exact16.same"] = ", ".join(same)
    return out


def z60_values(df: pd.DataFrame) -> dict[str, str]:
    """The Z60 control per training length and model: exact pos@90 per seed, seeds at the training
    length, mean accuracy at it."""
    out = {}
    z = df[df["config.train.task"] == "z60_prefix"]
    for length in sorted(z["config.train.length"].unique()):
        sub = labelled(df[df["config.train.length"] == length], "z60_prefix")
        for label, runs in sub.groupby("label"):
            key = "transformer" if label.startswith("transformer") else "il"
            runs = runs.sort_values("config.train.seed")
            pos = runs[f"summary.eval.pos90_exact@{length}"]
            name = f"z60.L{int(length)}.{key}"
            out[f"{name}.pos90"] = seeds_text(pos)
            out[f"{name}.learned"] = learned_text(pos, int(length))
            out[f"{name}.acc"] = f"{runs[f'summary.eval.acc_exact@{length}'].mean():.3f}"
            out[f"{name}.n"] = str(len(runs))
    return out


def scaling_values(df: pd.DataFrame) -> dict[str, str]:
    """The text scaling grid's decision, seeds and where the LRT is ahead, as docs/scaling.md and
    the README state them (experiments/scaling_tables.py, over its own store)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "scaling_tables", Path(__file__).with_name("scaling_tables.py")
    )
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    points = tables.grid_points(load_runs(tables.STORE))
    deltas = tables.paired_deltas(points)
    decision, seeds = tables.headline(points, deltas, load_plans(tables.STORE))
    return {
        "scaling.decision": decision,
        "scaling.seeds": seeds or "none yet",
        "scaling.where_ahead": tables.where_ahead(deltas),
        "scaling.rivals": tables.rivals_sentence(points),
        "scaling.exact": tables.exact_reference(points),
    }


CONVENTION_PAIR = REPO / "experiments" / "convention_pair"
# the run of the committed store the pair retrains under today's conventions
CONVENTION_RUN = "a5_prefix-L16-small-lrt-interleaved_2-released-s0-released"


def convention_touches(config: dict) -> tuple[bool, bool]:
    """(whether the window convention changes what this stored run computes, whether the value
    embedding's placement does): some non-final layer's window is shorter than the longest
    sequence the run trained or was evaluated at; an LRT whose gates scale its values, with value
    embeddings."""
    from lrt_lab.core.config import ModelConfig

    cfg = ModelConfig.from_dict(config["model"])
    train = config.get("train", {})
    longest = max([train.get("length", 0), *train.get("eval_lengths", [])])
    window = any(w is not None and w < longest for w in cfg.window_sizes())
    m = cfg.memory
    values = bool(m and m.gate and m.kv in ("both", "values") and cfg.use_value_embeds)
    return window, values


def convention_values(df: pd.DataFrame) -> dict[str, str]:
    """Which committed runs the two model conventions touch, store by store, and the
    representative pair: the factor study's released cell (seed 0) as recorded and retrained
    under today's conventions (experiments/convention_pair/)."""
    import json

    counts = []
    for store in (
        REPO / "experiments" / "results",
        REPO / "experiments" / "scaling_runs",
        INSTRUMENT_STORE,
    ):
        runs = load_runs(store)
        touched = [
            convention_touches(json.loads(Path(p, "config.json").read_text())) for p in runs["path"]
        ]
        window = sum(w for w, _ in touched)
        values = sum(v for _, v in touched)
        counts.append(
            f"`{store.relative_to(REPO)}`: {len(touched)} runs, the window convention {window}, "
            f"the value embedding's placement {values}"
        )
    out = {"conventions.touched": "; ".join(counts)}
    old = df[df["run"] == CONVENTION_RUN]
    new = load_runs(CONVENTION_PAIR) if CONVENTION_PAIR.is_dir() else pd.DataFrame()
    if old.empty or new.empty:
        out["conventions.pair"] = "not yet: the retrained run is not complete"
        return out
    old, new = old.iloc[0], new.iloc[0]

    def cell(key, fmt):
        a, b = old.get(f"summary.eval.{key}"), new[f"summary.eval.{key}"]
        recorded = f"{a:{fmt}} recorded" if pd.notna(a) else "not recorded then"
        return f"{key} {recorded}, {b:{fmt}} today"

    keys = [("ce_exact@16", ".3g"), ("ce_parallel@16", ".3g")]
    keys += [(f"pos90_exact@{n}", "g") for n in (16, 32, 64)]
    out["conventions.pair"] = "; ".join(cell(k, f) for k, f in keys) + (
        f"; final training loss {old['summary.final_loss']:.3g} recorded, "
        f"{new['summary.final_loss']:.3g} today"
    )
    return out


def prose_values(df: pd.DataFrame) -> dict[str, str]:
    """{NAME: text} for every `<!-- value: NAME -->` of the template, computed from the store."""
    df = earlier_runs(df)
    out = {}
    for build in (
        paper_values,
        a5_8_values,
        frontier_values,
        censoring_values,
        ranking_values,
        compute_values,
        convergence_values,
        protocol_values,
        gap_values,
        truncation_values,
        cells_values,
        baseline_values,
        exact_values,
        probe_values,
        z60_values,
        scaling_values,
        convention_values,
    ):
        out.update(build(df))
    return out


# docs/results.md ------------------------------------------------------------------------------
TEMPLATE = REPO / "experiments" / "results_template.md"
PLACEHOLDER = re.compile(r"^<!-- table: ([\w@.-]+) -->$", re.MULTILINE)
# a number of the prose, inline: `<!-- value: NAME -->`, filled from `prose_values`
VALUE = re.compile(r"<!-- value: ([\w@.-]+) -->")
GENERATED = (
    "<!-- Generated by experiments/results_tables.py --write from "
    "experiments/results_template.md,\n"
    "     the run stores experiments/results/ and experiments/instrument_runs/ and "
    "docs/bench/*.json:\n     edit those, not this file. "
    "-->\n"
)
# drawn by --write; a figure whose draw returns None (a study without runs yet) is not drawn, and
# the page does not link it
FIGURES = {
    "docs/a5_trainer_frontier.png": lambda df, path: frontier_figure(earlier_runs(df), path),
    "docs/a5_trainer_study_curves.png": lambda df, path: trainer_study_figure(df, path, "curves"),
    "docs/a5_trainer_study_km.png": lambda df, path: trainer_study_figure(df, path, "km"),
}
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.png)\)")


def study_run_names() -> set[str]:
    """The runs of the A5 trainer study's grid and of its pilot: a recipe of their own (curriculum,
    warm-down, rates), which only their own tables read."""
    from lrt_lab.training.sweep import expand, load_spec

    return {
        cfg.run_name for spec in (TRAINER_STUDY, RECIPE_PILOT) for cfg in expand(load_spec(spec))
    }


def earlier_runs(df: pd.DataFrame) -> pd.DataFrame:
    """The store without study_run_names: what the earlier tables (state tracking, frontier,
    protocol, ...) compare, one recipe per task and length."""
    return df[~df["run"].isin(study_run_names())] if "run" in df.columns else df


def tables(df: pd.DataFrame, study: TrainerStudyResults) -> dict:
    """Every table a template may name: `<!-- table: NAME -->` (`study`: trainer_study_results of
    the same store)."""
    full, df = df, earlier_runs(df)

    def at(task, length, paper=None):
        return lambda: state_tracking_table(df[df["config.train.length"] == length], task, paper)

    return {
        "a5_prefix@8": at("a5_prefix", 8, PAPER_A5),
        "a5_prefix@16": at("a5_prefix", 16, PAPER_A5),
        "z60_prefix@8": at("z60_prefix", 8),
        "z60_prefix@16": at("z60_prefix", 16),
        "frontier": lambda: frontier_table(df),
        "protocol": lambda: protocol_table(df),
        "truncation": lambda: truncation_table(df),
        "probes": lambda: probes_table(df),
        "gap": lambda: gap_table(df),
        "baselines": lambda: baselines_table(df),
        "bench": bench_table,
        # every LRT that recorded both cross-entropies: the studies' and the pilot's too
        "scoreboard": lambda: scoreboard_table(full),
        "trainer_recipe": lambda: recipe_pilot_table(full),
        "trainer_study": lambda: trainer_study_table(full, study),
        # the summary atop the page: the compact tables and the sentences under them
        "in_short": lambda: from_root(compact_block(full, study)),
    }


INSTRUMENT_STORE = REPO / "experiments" / "instrument_runs"
TRAINER_STUDY = REPO / "experiments" / "a5_trainers.toml"


RECIPE_PILOT = REPO / "experiments" / "a5_recipe.toml"


def recipe_pilot_table(df: pd.DataFrame) -> str:
    """The learning-rate pilot of the A5 trainer study (experiments/a5_recipe.toml), one row per
    model and Muon rate: exact-decoding cross-entropy at length 16 at the end (the study's primary
    metric), its change over the last evaluation interval (near 0: flattened), exact pos@90, and
    the rate the spec's rule picks (the lowest cross-entropy per model)."""
    from lrt_lab.training.sweep import expand, load_spec

    names = [cfg.run_name for cfg in expand(load_spec(RECIPE_PILOT))]
    runs = df[df["run"].isin(names)] if "run" in df.columns else df.iloc[:0]
    if runs.empty:
        return f"None of the pilot's {len(names)} runs is complete yet."
    rows = []
    for _, run in runs.iterrows():
        evals = load_metrics(run, kind="eval").dropna(subset=["ce_exact@16"])
        ce = evals["ce_exact@16"].to_numpy()
        # the change over the last evaluation interval before the end (a final evaluation off
        # the grid, at the last step, would make a short interval look flat)
        every = int(run["config.train.eval_every"])
        before = evals[evals["step"] <= evals["step"].iloc[-1] - every]["ce_exact@16"]
        rows.append(
            {
                "method": method_label(run),
                "rate": float(run["config.train.matrix_lr"]),
                "steps": int(run["config.train.steps"]),
                "ce": ce[-1],
                "change": ce[-1] - before.iloc[-1] if len(before) else math.nan,
                "every": every,
                "pos90": run.get("summary.eval.pos90_exact@16", math.nan),
            }
        )
    table = pd.DataFrame(rows).sort_values(["method", "rate"])
    best = table.loc[table.groupby("method")["ce"].idxmin()]
    body = [
        [
            r.method,
            f"{r.rate:g}",
            str(r.steps),
            f"{r.ce:.4f}",
            "-" if math.isnan(r.change) else f"{r.change:+.4f}",
            whole(r.pos90),
            "picked" if r.Index in best.index else "",
        ]
        for r in table.itertuples()
    ]
    header = ["method", "Muon rate", "steps", "CE exact @16", "change, last interval", "pos@90"]
    intervals = sorted(set(table["every"]))
    header[4] = f"change, last {' or '.join(map(str, intervals))} steps"
    picked = ", ".join(f"{r.method} {r.rate:g}" for r in best.itertuples())
    return "\n".join(
        [
            f"Runs: {len(runs)} of the pilot's {len(names)} complete (seed 20, half the study's "
            f"budget). The rule's pick, the lowest CE per model: {picked}.",
            "",
            *markdown_lines([*header, "rule"], body),
        ]
    )


@dataclass(frozen=True, eq=False)
class TrainerStudyResults:
    """The A5 trainer study read from one store, once for both pages that state it (the results
    page's table and the README's sentence): each table re-reads the runs and repeats the
    bootstrap and permutation tests."""

    study: Study
    names: list[str]  # the run names of its grid
    length: int  # the training length its runs share (their time-to-event target)
    table: pd.DataFrame  # study_table at the budget
    events: pd.DataFrame  # event_table; empty when the study names no time_to_event
    flat: pd.DataFrame  # last_interval_table: whether each arm flattened, or regressed


def trainer_study_results(df: pd.DataFrame) -> TrainerStudyResults:
    from lrt_results.study import event_table, last_interval_table, study_table

    study, configs = trainer_study()
    names = [cfg.run_name for cfg in configs]
    (length,) = {cfg.length for cfg in configs}  # one training length: the study's target
    table = study_table(df, study, run_names=names)
    events = event_table(df, study, run_names=names) if study.time_to_event else pd.DataFrame()
    flat = last_interval_table(df, study, run_names=names)
    return TrainerStudyResults(study, names, length, table, events, flat)


def trainer_study() -> tuple:
    """(Study, the run configs of its grid) of experiments/a5_trainers.toml."""
    from lrt_lab.training.sweep import expand, load_spec
    from lrt_results.study import parse_study

    spec = load_spec(TRAINER_STUDY)
    return parse_study(spec["study"]), expand(spec)


def trainer_study_table(df: pd.DataFrame, results: TrainerStudyResults) -> str:
    """The A5 trainer study as `lrt-lab report --study experiments/a5_trainers.toml` gives it:
    its contrasts (effects, intervals, p-values, Holm, power), a verdict per contrast and the
    time to reach the training length, over the runs of its grid that are complete; then its
    learning curves and Kaplan-Meier figure (trainer_study_figure)."""
    from lrt_results.study import study_lines

    study, names, table = results.study, results.names, results.table
    if not table.attrs["runs"]:
        return f"None of the grid's {len(names)} runs is complete yet."
    events = results.events if study.time_to_event else None
    body = study_lines(
        df, study, table, run_names=names, fmt="md", events=events, flat=results.flat
    )
    figures = [
        "",
        "Each arm's evaluations against counted forward+backward FLOPs (seed mean and band; "
        "solid: exact decoding, dashed: the parallel forward), to read whether the budget ended "
        "on a plateau or mid-descent:",
        "",
        "![Learning curves of the A5 trainer study](a5_trainer_study_curves.png)",
        "",
        "The share of each arm's seeds whose exact pos@90 has reached 16, against counted FLOPs "
        "(Kaplan-Meier, 95% Greenwood band; a seed that never reaches it is censored at its "
        "budget):",
        "",
        "![Kaplan-Meier curves of the A5 trainer study](a5_trainer_study_km.png)",
    ]
    return "\n".join(
        [f"Runs: {table.attrs['runs']} of the grid's {len(names)} complete.", "", *body, *figures]
    )


TRAINER_STUDY_HEADING = "Which trainer learns A5 at length 16: the study written before its runs"


def study_status(
    table: pd.DataFrame,
    events: pd.DataFrame,
    n_runs: int,
    primary: str,
    heading: str,
    length: int,
    flat: pd.DataFrame | None = None,
) -> str:
    """The README's sentence on the trainer study: what it is (linking `heading`, its section of
    docs/results.md), then how many of its grid's n_runs are in while some are missing (its
    contrasts are read once all are: reading them as seeds land would be looking before the data
    are whole), else study_findings."""
    k = table.attrs.get("runs", 0)
    head = (
        f"A study written before its runs answers that ({link(heading)}: the four trainers, 8 "
        "seeds each, budgets matched in forward+backward FLOPs, exact-decoding cross-entropy at "
        f"length {length} its primary metric)"
    )
    if k < n_runs:
        return f"{head}; {k} of its {n_runs} runs are in, and its contrasts are read when all are."
    return f"{head}. {study_findings(table, events, primary, length, flat)}"


def study_findings(
    table: pd.DataFrame,
    events: pd.DataFrame,
    primary: str,
    length: int,
    flat: pd.DataFrame | None = None,
) -> str:
    """A complete study in sentences, from its study_table, event_table and last_interval_table
    (`flat`): each contrast in numbers with its Holm p and whether it is decided (those of the
    primary metric first, any other metric as its own clause); how many of each arm's seeds reached
    the training length `length`, at what median compute (the answer to "which trainer learns, at
    what compute"); which arms lost what they had learned, and whether the reference arm was
    censored by its budget."""

    def contrast(r) -> str:
        return (
            f"{r.b} against {r.a} {r.effect:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}] "
            f"(Holm p = {r.p_holm:.3g}, {'decided' if r.decided else 'not decided'})"
        )

    rows = table[table["metric"] == primary]
    others = table[table["metric"] != primary]
    text = (
        f"In {primary} (B minus A, nats; paired by seed, {int(rows['pairs'].min())} "
        f"pairs, 95% bootstrap interval, Holm over all {len(table)} contrasts): "
        + "; ".join(contrast(r) for r in rows.itertuples())
    )
    if len(others):
        text += "; as their own rows, " + "; ".join(
            f"in {r.metric}, {contrast(r)}" for r in others.itertuples()
        )
    text += "."
    if len(events):
        text += f" {reach_sentence(events, length)}"
    if flat is not None and len(events):
        text = f"{text} {flattening_sentence(flat, primary, events.iloc[0]['a'])}".strip()
    return text


def count_of(cell: str) -> tuple[int, int]:
    """(k, n) of a "k/n" count cell of event_table or last_interval_table."""
    k, n = cell.split("/")
    return int(k), int(n)


def reach_sentence(events: pd.DataFrame, length: int) -> str:
    """The study's time-to-event rows as one sentence: the arms whose pos@90 first reached the
    training length (in the decoding each row times) on at least half their seeds, fastest
    Kaplan-Meier median FLOPs first, then those that did on fewer, then those that never did; each
    with its log-rank p against its contrast's other arm. The shared reference arm is named once,
    in its first row's decoding."""
    first = events.iloc[0]
    sides = [(first["a"], first["decoding"], "a", first, math.nan)]
    sides += [(r["b"], r["decoding"], "b", r, r["p_logrank"]) for _, r in events.iterrows()]
    arms = []  # (name, k, n, median, p)
    for arm, decoding, side, r, p in sides:
        k, n = count_of(r[f"reached_{side}"])
        arms.append((f"{arm} ({decoding} decoding)", k, n, r[f"median_{side}"], p))

    def p_of(p) -> str:
        return "" if math.isnan(p) else f", log-rank {p_is(p)}"

    most = sorted((a for a in arms if a[1] and 2 * a[1] >= a[2]), key=lambda a: a[3])
    some = [a for a in arms if a[1] and 2 * a[1] < a[2]]
    none = [a for a in arms if not a[1]]
    parts = []
    if most:
        parts.append(
            "on at least half their seeds, fastest first, by "
            + "; ".join(
                f"{a[0]} on {a[1]} of {a[2]} (median {a[3]:.2g} FLOPs{p_of(a[4])})" for a in most
            )
        )
    if some:
        parts.append(
            "on fewer than half by "
            + "; ".join(
                f"{a[0]} on {a[1]} of {a[2]}"
                + ("" if math.isnan(a[4]) else f" (log-rank {p_is(a[4])})")
                for a in some
            )
        )
    if none:
        parts.append(f"on none by {', '.join(a[0] for a in none)}")
    return (
        f"The training length (pos@90 = {length}) was first reached, against counted "
        f"forward+backward FLOPs (Kaplan-Meier median; log-rank test against the contrast's other "
        f"arm), {'; '.join(parts)}."
    )


def flattening_sentence(flat: pd.DataFrame, primary: str, reference: str) -> str:
    """What the flattening table (last_interval_table) adds to the study's answer, or "": the arms
    whose primary metric reached a real level and ended having lost more than half of what it
    had gained (learned, then lost it: a final value alone reads that as never having learned),
    and whether the shared reference arm was still improving at its end (its budget censors it)."""
    rows = flat[flat["metric"] == primary] if len(flat) else flat
    text = []
    lost = [r for r in rows.itertuples() if count_of(r.regressed)[0]]
    if lost:
        text.append(
            f"Runs whose {primary} reached a real level (its best at least half way from the "
            "first evaluation to the metric's best possible value) and ended having lost more "
            "than half of what it had gained (a run that learned, then lost it, reads at its end "
            "as one that never learned): "
            + ", ".join(f"{r.arm} on {r.regressed.replace('/', ' of ')}" for r in lost)
            + "."
        )
    ref = rows[rows["arm"] == reference] if len(rows) else rows
    if len(ref):
        k, n = count_of(ref.iloc[0]["improving"])
        if 2 * k >= n:
            text.append(
                f"The {reference} was still improving at its end on {k} of {n} seeds: the budget "
                "censors it, and what it would reach with more compute is not decided here."
            )
    return " ".join(text)


def trainer_study_answer(results: TrainerStudyResults) -> str:
    """The results page's sentence under the study's table: study_findings once every run of the
    grid is in, and until then how many are."""
    k, n = results.table.attrs.get("runs", 0), len(results.names)
    if k < n:
        return f"not yet: {k} of its {n} runs are in, and its contrasts are read when all are."
    return study_findings(
        results.table, results.events, results.study.primary, results.length, results.flat
    )


def trainer_study_status(results: TrainerStudyResults) -> str:
    return study_status(
        results.table,
        results.events,
        len(results.names),
        results.study.primary,
        TRAINER_STUDY_HEADING,
        results.length,
        results.flat,
    )


def trainer_study_figure(df: pd.DataFrame, path, which: str):
    """The study's learning curves ("curves") or Kaplan-Meier curves ("km"); None, and nothing
    drawn, before any of its runs is complete."""
    from lrt_results.study_curves import plot_learning_curves
    from lrt_results.time_to_event import plot_time_to_event

    study, configs = trainer_study()
    draw = {"curves": plot_learning_curves, "km": plot_time_to_event}[which]
    return draw(df, study, path, run_names=[cfg.run_name for cfg in configs])


def scoreboard_table(df: pd.DataFrame) -> str | None:
    """`lrt-lab report --scoreboard` over this store's LRT runs and the retrained A5 model of
    experiments/instrument_runs/: one row per trainer, the gap and agreement at 1x/2x/4x."""
    from lrt_results.report import render_scoreboard
    from lrt_results.scoreboard import scoreboard

    runs = [df]
    if INSTRUMENT_STORE.is_dir():
        runs.append(load_runs(INSTRUMENT_STORE))
    table = scoreboard(pd.concat(runs, ignore_index=True))
    if table.empty:
        return None
    return render_scoreboard(table, "md", legend=False).strip()


def _range(values) -> str:
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:+.2f}" if lo == hi else f"{lo:+.2f} to {hi:+.2f}"


def collapse_lyapunov(df: pd.DataFrame, names: list[str], length: int = 16) -> str:
    """What the contraction monitor (lambda, nats per position; eval lines' `lyap`) read around
    each collapse of the study's rollout:1 runs: a collapse read here, after the runs, as exact
    cross-entropy at the training length back above 3 at an evaluation after one below 1. lambda at
    the evaluation before it and at it, how many read NaN later, and the last lambda of the
    rollout:1 runs that did not collapse and of fixedpoint:0.1:8's runs, for comparison."""
    from lrt_lab.store.results import load_metrics

    runs = df[df["run"].isin(names)]
    key = f"ce_exact@{length}"
    before, at, peak, nan_after, kept, fixedpoint = [], [], [], 0, [], []
    for _, run in runs.iterrows():
        evals = load_metrics(run, kind="eval")
        if key not in evals or "lyap" not in evals:
            continue
        ce, lyap = evals[key].to_numpy(float), evals["lyap"].to_numpy(float)
        schedule = run["config.train.schedule"]
        if schedule.startswith("fixedpoint"):
            fixedpoint.append(lyap[-1])
        if schedule != "rollout:1":
            continue
        learned = np.flatnonzero(ce < 1)
        later = np.flatnonzero(ce > 3)
        later = later[later > learned[0]] if learned.size else later[:0]
        if not later.size:
            kept.append(lyap[-1])
            continue
        i = later[0]
        before.append(lyap[i - 1])
        at.append(lyap[i])
        peak.append(float(np.nanmax(lyap[i:])) if np.isfinite(lyap[i:]).any() else math.nan)
        nan_after += bool(np.isnan(lyap[i:]).any())
    if not at:
        return "no rollout:1 run of the study collapsed by that reading"
    return (
        f"at each of the {len(at)} collapses of rollout:1 (read after the runs as exact "
        f"cross-entropy at {length} back above 3 after it was below 1) the contraction monitor's "
        f"lambda went from {_range(before)} nats per position at the evaluation before to "
        f"{_range(at)} at the collapse, its largest from then on {_range(peak)}, and NaN "
        f"later on {nan_after} of them; the {len(kept)} "
        f"rollout:1 runs that did not collapse ended at {_range(kept)}, fixedpoint:0.1:8's at "
        f"{_range(fixedpoint)} (a contracting memory map reads below 0)"
    )


def train_inference_gap(df: pd.DataFrame, names: list[str], length: int = 16) -> str:
    """Per LRT arm of the study whose training forward is not exact decoding: its final
    cross-entropy at the training length under its parallel forward and under exact decoding
    (seed means), the share of positions where the two pick the same token, and the uniform
    guess's cross-entropy, ln(vocabulary)."""
    runs = df[df["run"].isin(names) & (df["config.kind"] == "lrt")]
    cols = [f"summary.eval.{m}@{length}" for m in ("ce_parallel", "ce_exact", "agree")]
    if runs.empty or any(c not in runs for c in cols):
        return "no run of the study recorded both forwards"
    parts = []
    for schedule, sub in runs.groupby("config.train.schedule"):
        par, ex, agree = (sub[c].mean() for c in cols)
        if not (math.isfinite(agree) and agree < 1):
            continue  # its parallel forward is exact decoding (FixedPoint, Rollout)
        parts.append(
            f"{schedule} ends at cross-entropy {par:.3g} under its parallel forward and {ex:.3g} "
            f"under exact decoding, the two picking the same token at {agree:.0%} of positions "
            f"({len(sub)} seeds)"
        )
    guess = math.log(float(runs["config.model.vocab_size"].iloc[0]))
    if not parts:
        return "every LRT arm's training forward is exact decoding"
    return "; ".join(parts) + f"; the uniform guess is {guess:.2f}"


def budget_ratios(df: pd.DataFrame, names: list[str]) -> str:
    """Each arm's counted forward+backward FLOPs over the transformer's (seed means), as the
    store counts them now: the study matched budgets by the counter of its day, which did not
    count work run under inference_mode (Rollout's rollout)."""
    runs = df[df["run"].isin(names)]
    if runs.empty or "summary.flops" not in runs:
        return "no run of the study is in yet"
    arms = runs.groupby(["config.kind", "config.train.schedule"])["summary.flops"].mean()
    base = arms[arms.index.get_level_values(0) == "transformer"]
    if base.empty:
        return "the study's transformer is not in yet"
    cells = [
        f"{schedule} {flops / base.iloc[0]:.2f}x"
        for (kind, schedule), flops in arms.items()
        if kind != "transformer"
    ]
    return ", ".join(cells)


# values the page's prose names that come from the trainer study's tables, built once per page
# (page_values), rather than from prose_values
PAGE_VALUES = frozenset(
    {"study.answer", "study.collapse_lyap", "study.train_inference_gap", "study.budgets"}
)


def page_values(study: TrainerStudyResults, df: pd.DataFrame | None = None) -> dict[str, str]:
    out = {"study.answer": trainer_study_answer(study)}
    if df is not None:
        out["study.collapse_lyap"] = collapse_lyapunov(df, study.names, study.length)
        out["study.train_inference_gap"] = train_inference_gap(df, study.names, study.length)
        out["study.budgets"] = budget_ratios(df, study.names)
    return out


def render_results(template: str, df: pd.DataFrame, study: TrainerStudyResults) -> str:
    """The template with every table placeholder (a line of its own) and every value placeholder
    (inline) filled from the run store (`study`: trainer_study_results of the same store)."""
    builders = tables(df, study)
    named = {**prose_values(df), **page_values(study, df)}

    def fill(match):
        name = match.group(1)
        if name not in builders:
            raise SystemExit(
                f"{TEMPLATE.name}: unknown table {name!r}; known: {', '.join(builders)}"
            )
        table = builders[name]()
        return table if table is not None else f"(no runs for the table {name} in the store)"

    return GENERATED + render_prose(PLACEHOLDER.sub(fill, template), named)


def render_prose(text: str, named: dict[str, str]) -> str:
    """`text` with every `<!-- value: NAME -->` replaced by named[NAME] (`prose_values`)."""

    def value(match):
        name = match.group(1)
        if name not in named:
            raise SystemExit(
                f"{TEMPLATE.name}: unknown value {name!r}; known: {', '.join(sorted(named))}"
            )
        return named[name]

    return VALUE.sub(value, text)


def from_root(text: str) -> str:
    """`text`, whose links are written from the repository's root, as docs/results.md links."""
    return text.replace("](docs/results.md#", "](#").replace("](docs/", "](")


def generated(store, repo: Path = REPO) -> dict[Path, str]:
    """{file: the text it should have}: docs/results.md (its summary, "In short", included)."""
    with reading_once():  # each run's log parsed once for every table
        df = load_runs(store)
        if df.empty:
            raise SystemExit(f"store={str(store)!r}: no complete runs")
        study = trainer_study_results(df)
        return {repo / "docs" / "results.md": render_results(TEMPLATE.read_text(), df, study)}


def stale(store, repo: Path = REPO, write: bool = False) -> list[Path]:
    """The generated files whose text differs from what `store` gives (rewritten when `write`)."""
    out = []
    for path, text in generated(store, repo).items():
        if path.read_text() != text:
            out.append(path)
            if write:
                path.write_text(text)
    return out


def missing_figures(repo: Path = REPO) -> list[Path]:
    """The images that docs/results.md links and that do not exist."""
    out = []
    for page in (repo / "docs" / "results.md",):
        for link in IMAGE.findall(page.read_text()):
            if "://" not in link and not (page.parent / link).is_file():
                out.append(page.parent / link)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "store", nargs="?", default=str(REPO / "experiments" / "results"), help="run store"
    )
    parser.add_argument(
        "--figures",
        nargs="?",
        const=str(REPO / "docs"),
        default=None,
        metavar="DIR",
        help="also draw the figures into DIR (default docs)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--write",
        action="store_true",
        help="regenerate docs/results.md and the figures",
    )
    mode.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when docs/results.md differs from what the store gives",
    )
    args = parser.parse_args(argv)
    if args.write or args.check:
        differ = stale(args.store, write=args.write)
        # the figures are drawn, not compared: a PNG's bytes change with the matplotlib version;
        # --check asks only that every figure the pages link exists
        differ += [] if args.write else missing_figures()
        if args.check:
            for path in differ:
                print(
                    f"{path.relative_to(REPO)} differs from what the run store gives; "
                    "run python experiments/results_tables.py --write",
                    file=sys.stderr,
                )
            return 1 if differ else 0
        df = load_runs(args.store)
        for name, draw in FIGURES.items():
            draw(df, REPO / name)
        return 0
    df = load_runs(args.store)
    if df.empty:
        raise SystemExit(f"store={args.store!r}: no complete runs")
    study = trainer_study_results(df)
    for name, build in tables(df, study).items():
        text = build()
        if text is not None:
            print(f"### {name}\n\n{text}\n")
    if args.figures is not None:
        frontier_figure(df, f"{args.figures}/a5_trainer_frontier.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
