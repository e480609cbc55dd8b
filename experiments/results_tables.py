"""The README's "Results" tables, from a run store (default: the committed `experiments/results/`).

    python experiments/results_tables.py [STORE] [--figures DIR]

Prints Markdown: A5 state tracking (experiments/a5_cpu.toml, the factor study a5_study*.toml and
the trainer frontier a5_trainer_frontier.toml), the truncated-gradient study (a5_truncation.toml:
which Rollout(G) learns with every k-th position supervised), the Z60 control
(experiments/z60_control.toml), gap recovery on byte-level text (experiments/gap_recovery.toml),
each next to the paper's figure. --figures DIR also writes the trainer-frontier figure
(DIR/a5_trainer_frontier.png; the README shows docs/a5_trainer_frontier.png). Cells are mean [95% t-interval over seeds] (n seeds); a single
seed shows its value alone. Everything comes from lrt_lab's public tools: the run store
(`load_runs`), `seed_stats` and the gap analysis (`collect_bpb`, `gap_recovery`).
"""

from __future__ import annotations

import math
import sys

import pandas as pd

from lrt_lab.analysis import seed_stats
from lrt_lab.analysis.gap import collect_bpb, gap_recovery
from lrt_lab.report import frontier_points, memory_label, method_label, model_label, steps_suffix, supervised_every
from lrt_lab.results import load_runs

# Paper, app. "Non-Commutative State Tracking" (depth 4, d 256, trained at length 64, pos@90 out of 64
# with exact decoding, the same at 128 and 256) and app. "Comparison with Exact Sequential Training".
PAPER_A5 = {"transformer (4 layers)": "5", "lrt interleaved:2 (4 layers)": "24"}
PAPER_GAP = {"lrt interleaved:2": "75%", "lrt fullseq:3": "88%"}


def cell(row, fmt="{:.1f}") -> str:
    if row is None or row["n"] == 0:
        return "-"
    if row["n"] < 2 or math.isnan(row["ci_low"]):
        return f"{fmt.format(row['mean'])} (n={row['n']})"
    return f"{fmt.format(row['mean'])} [{fmt.format(row['ci_low'])}, {fmt.format(row['ci_high'])}] (n={row['n']})"


def whole(v) -> str:
    """An integer figure, or "-" where the run did not measure it."""
    return "-" if pd.isna(v) else str(int(v))


def markdown(rows: list[list[str]], header: list[str]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def state_tracking_tables(df: pd.DataFrame, task: str, paper: dict | None) -> str | None:
    """One table per training length (the A5 CPU runs at 8, the factor study at 16, ...), of the
    runs with every position supervised (the others: `truncation_table`)."""
    sub = df[df["config.train.task"] == task]
    if sub.empty:
        return None
    return "\n\n".join(state_tracking_table(sub[sub["config.train.length"] == L], task, paper)
                        for L in sorted(sub["config.train.length"].unique()))


def state_tracking_table(df: pd.DataFrame, task: str, paper: dict | None) -> str | None:
    """The runs of `task` with every position supervised (the others: `truncation_table`)."""
    sub = df[df["config.train.task"] == task].copy()
    sub = sub[sub.apply(supervised_every, axis=1) == 1] if not sub.empty else sub
    if sub.empty:
        return None
    # the label groups seeds: the model (what the paper's figures are keyed by), the number of steps
    # where runs of one model differ in it (different configs, not seeds of one), and the memory
    # preset and init (shown in their own column)
    sub["memory"] = sub.apply(memory_label, axis=1)
    sub["model"] = sub.apply(model_label, axis=1)
    memory = sub["memory"].map(lambda m: "" if m == "-" else f" [{m}]")
    sub["label"] = sub["model"] + steps_suffix(sub, sub["model"] + memory) + memory
    L = int(sub["config.train.length"].iloc[0])
    lengths = sorted({int(c.split("@")[1]) for c in sub.columns
                      if c.startswith("summary.eval.pos90_exact@") and sub[c].notna().any()})
    stats = {}
    for metric in [f"summary.eval.pos90_exact@{n}" for n in lengths] + [f"summary.eval.acc_exact@{n}" for n in lengths]:
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
        # the parallel forward (the training schedule run on the whole sequence) per seed, at each length
        cols = [f"summary.eval.pos90_parallel@{n}" for n in lengths if f"summary.eval.pos90_parallel@{n}" in runs]
        r.append(", ".join("/".join(str(int(v)) for v in seed_row) for seed_row in runs[cols].to_numpy()))
        # training compute: token-forwards the trainer actually ran (a FixedPoint step counts its sweeps)
        r.append(f"{runs['summary.compute_tokens'].mean() / 1e6:.1f}")
        if paper is not None:
            # several rows may share the paper's model/trainer: its figure goes to the one with its init
            model = runs["model"].iloc[0]
            twins = sub[sub["model"] == model]
            own = twins[twins["memory"].str.contains("paper init")]
            r.append(paper.get(model, "-") if label in set((own if len(own) else twins)["label"]) else "-")
        rows.append(r)
    header = (["model / trainer", "memory preset, init"] + [f"pos@90 at {n}" for n in lengths] + [f"accuracy at {lengths[0]}"]
              + [f"pos@90 at {L} per seed", "parallel forward pos@90 per seed, at " + " / ".join(map(str, lengths)),
                 "compute (M token-forwards)"])
    if paper is not None:
        header.append("paper pos@90 (of 64, T=64)")
    steps = sorted({int(v) for v in sub["config.train.steps"]})
    if len(steps) > 1:  # e.g. the transformer trained longer, to its plateau: say so per row
        header.insert(2, "steps")
        for label, r in zip(order, rows):  # one number per row: a label holds one number of steps
            r.insert(2, str(int(sub.loc[sub["label"] == label, "config.train.steps"].iloc[0])))
    d = int(sub["config.model.n_embd"].iloc[0])
    title = (f"**{task}**: trained at length {L} for {' or '.join(map(str, steps))} steps of "
             f"{int(sub['config.train.batch_size'].iloc[0])} sequences, d={d}; exact recurrent decoding")
    return title + "\n\n" + markdown(rows, header)


def frontier_table(df: pd.DataFrame, task: str = "a5_prefix", length: int = 16) -> str | None:
    """The trainer frontier (`lrt_lab.report.frontier_points`): per trainer, the compute and wall
    clock of its runs and exact pos@90 at every evaluated length, per seed; cheapest first."""
    points = frontier_points(df, task, length)
    if points.empty:
        return None
    lengths = sorted(int(c.split("@")[1]) for c in points if c.startswith("pos90_exact@"))
    rows = []
    for trainer, runs in points.groupby("trainer", sort=False):
        runs = runs.sort_values("seed")
        per_seed = ", ".join("/".join(whole(v) for v in r) for r in runs[[f"pos90_exact@{n}" for n in lengths]]
                             .to_numpy())
        learned = sum(int(v) == length for v in runs[f"pos90_exact@{length}"])
        rows.append([trainer, f"{runs['compute'].mean():.1f}", f"{runs['wall_min'].mean():.0f}",
                     ", ".join(str(int(s)) for s in runs["seed"]), per_seed, f"{learned} of {len(runs)}"])
    header = ["trainer", "compute (M token-forwards)", "wall clock (min, mean)", "seeds",
              "exact pos@90 at " + " / ".join(map(str, lengths)) + " per seed", f"seeds at pos@90 = {length}"]
    return markdown(rows, header)


def truncation_table(df: pd.DataFrame, task: str = "a5_prefix", length: int = 16) -> str | None:
    """Which trainer learns when only every k-th position is supervised: exact pos@90 per seed
    at every evaluated length, one row per LRT trainer (paper preset and init), one column per k."""
    sub = df[(df["config.train.task"] == task) & (df["config.train.length"] == length)]
    sub = sub.assign(k=sub.apply(supervised_every, axis=1))
    if sub.empty or (sub["k"] == 1).all():
        return None
    points = frontier_points(df, task, length)  # k = 1: the frontier's runs (baseline LRT only)
    ks = sorted(sub["k"].unique())
    lengths = sorted(int(c.split("@")[1]) for c in points if c.startswith("pos90_exact@"))
    cols = [f"summary.eval.pos90_exact@{n}" for n in lengths]
    trained = sub[(sub["k"] > 1) & (sub["config.kind"] == "lrt")]
    trainers = sorted(set(trained.apply(method_label, axis=1)), key=lambda m: (m.startswith("lrt exact"), m))
    rows = []
    for trainer in trainers:
        row = [trainer]
        for k in ks:
            if k == 1:
                runs = points[points["trainer"] == trainer].sort_values("seed")
                vals = runs[[c.removeprefix("summary.eval.") for c in cols]].to_numpy()
            else:
                runs = trained[(trained["k"] == k) & (trained.apply(method_label, axis=1) == trainer)]
                vals = runs.sort_values("config.train.seed")[cols].to_numpy()
            row.append(", ".join("/".join(whole(v) for v in r) for r in vals) or "-")
        rows.append(row)
    header = ["trainer"] + [f"k = {k}" for k in ks]
    note = (f"Exact pos@90 at {' / '.join(map(str, lengths))} per seed (positions counted: every k-th; "
            f"pos@{90} = {length} means every counted position up to {length} is at >= 90%).")
    return note + "\n\n" + markdown(rows, header)


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
    fig, axes = plt.subplots(2, len(lengths), figsize=(4.2 * len(lengths), 7), sharey="col", squeeze=False)
    for row, (x, xlabel) in enumerate((("compute", "training compute (M token-forwards)"),
                                       ("wall_min", "wall clock of the run (min, 2-core CPU)"))):
        for col, n in enumerate(lengths):
            ax = axes[row][col]
            for trainer in trainers:
                p = points[points["trainer"] == trainer]
                jitter = (p["seed"] - 1) * 0.25  # seeds with equal pos@90 stay visible
                ax.scatter(p[x], p[f"pos90_exact@{n}"] + jitter, color=colors[trainer], label=trainer, s=36,
                           alpha=0.85, edgecolor="black", linewidth=0.4)
            ax.axhline(n, color="grey", linewidth=0.6, linestyle=":")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"exact pos@90 at {n}")
            ax.set_title(f"evaluated at {n} ({n // length}x the training length)")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=9, frameon=False)
    fig.suptitle(f"{task}: trainers at length {length} (one point per seed; dotted: the evaluated length)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def gap_table(df: pd.DataFrame) -> str | None:
    sub = df[df["config.train.task"] == "text_bytes"]
    if sub.empty:
        return None
    with_bpb = collect_bpb(sub, compute=False)
    if "bpb.exact" not in with_bpb.columns:
        return None
    table = gap_recovery(with_bpb)
    per_seed = table.attrs["per_seed"]
    rows = []
    base = exact = None
    for _, r in table.iterrows():
        base, exact = r["base"], r["exact"]
        ci = "" if math.isnan(r["ci_low"]) else f" [{100 * r['ci_low']:.0f}%, {100 * r['ci_high']:.0f}%]"
        seeds = ", ".join(f"{100 * v:.0f}%" for v in per_seed[per_seed["method"] == r["method"]]["recovered"])
        rows.append([r["method"], f"{r['value']:.4f}", f"{100 * r['recovered']:.0f}%{ci} (n={int(r['n_seeds'])})",
                     seeds, PAPER_GAP.get(r["method"], "-")])
    head = (f"Baseline (transformer) {base:.4f} BPB, exact-trained LRT {exact:.4f} BPB (means over the paired seeds); "
            "recovered = (baseline - method) / (baseline - exact), per seed, then averaged (95% bootstrap interval). "
            "LRT memory: " + "; ".join(sorted({m for m in sub.apply(memory_label, axis=1) if m != "-"})) + ".")
    return head + "\n\n" + markdown(rows, ["method", "BPB (exact decoding)", "gap recovered", "per seed",
                                           "paper"])


def main(store: str = "experiments/results", figures: str | None = None) -> None:
    df = load_runs(store)
    if df.empty:
        raise SystemExit(f"store={store!r}: no complete runs")
    for title, text in (("A5 state tracking", state_tracking_tables(df, "a5_prefix", PAPER_A5)),
                        ("A5 trainer frontier at length 16", frontier_table(df)),
                        ("A5 with every k-th position supervised", truncation_table(df)),
                        ("Z60 control (abelian, same order)", state_tracking_tables(df, "z60_prefix", None)),
                        ("Gap recovery on byte-level text", gap_table(df))):
        if text is not None:
            print(f"### {title}\n\n{text}\n")
    if figures is not None:
        frontier_figure(df, f"{figures}/a5_trainer_frontier.png")


if __name__ == "__main__":
    args = sys.argv[1:]
    figures = None
    if "--figures" in args:
        i = args.index("--figures")
        figures = args[i + 1] if i + 1 < len(args) else "docs"
        del args[i:i + 2]
    main(*args[:1], figures=figures)
