"""`lrt-lab demo`: what latent recurrence buys, in a few CPU minutes.

All three models are the same 2-layer, d=128 nanochat-style transformer; the two LRTs add the
memory pathway (+8.5% parameters at this width; +0.3% at d20) and train with Interleaved(2), the
paper's default (~2x token compute), and with FullSequence(3) (~4x), whose three refinements let
exact memory reach further along the sequence during training. The task is
prefix products over S3, the smallest non-commutative group: target_t = x_1 x_2 ... x_t. Its
multiplication table is tiny, so what limits a model is state tracking, not memorisation: a
fixed-depth transformer must re-derive the running product from the whole prefix at every
position, while the LRT can carry it from token t-1 in its memory (the paper's A5 experiment,
app. "Non-Commutative State Tracking", at CPU size). Evaluation at 2x and 4x the training length
uses exact recurrent decoding: the way the model would really be used.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
import torch

from lrt_lab.store.results import Run, diverged_line, load_table
from lrt_lab.store.run_summary import run_figures
from lrt_lab.training.loop import TrainConfig, train
from lrt_lab.training.threads import ThreadChoice, apply_threads, choose_threads

TRAIN_LENGTH = 12
EVAL_LENGTHS = (12, 24, 48)


class DemoStopped(Exception):
    """A demo run ended without completing: `status` is "incomplete" (stopped by SIGTERM or
    SIGUSR1, checkpointed) or "diverged"; the demo ends there (`lrt-lab demo` exits with the
    status's code, lrt_lab.training.exitcodes), its one line already said."""

    def __init__(self, run_name: str, status: str):
        super().__init__(f"{run_name} {status}")
        self.status = status


def demo_configs(quick: bool = False) -> list[TrainConfig]:
    steps = 40 if quick else 400
    common = dict(
        task="group_prefix",
        task_options={"group": "S3", "curriculum_start": 4, "curriculum_steps": steps * 3 // 8},
        length=TRAIN_LENGTH,
        preset="small",
        steps=steps,
        batch_size=64,
        eval_every=0,
        eval_lengths=EVAL_LENGTHS,
        eval_size=64 if quick else 256,
        checkpoint_every=0,
    )
    suffix = "-quick" if quick else ""
    return [
        TrainConfig(
            **common,
            model="transformer",
            schedule="onepass",
            overrides={"n_layer": 2},
            name=f"demo-transformer{suffix}",
        ),
        TrainConfig(
            **common,
            model="lrt",
            schedule="interleaved:2",
            overrides={"n_layer": 2, "memory.gamma_init": 0.0, "memory.rec_init": "zero"},
            name=f"demo-lrt-interleaved2{suffix}",
        ),
        # Longer refinement (paper app. C.1): each refinement extends the chain of exact memory by
        # one position, at (K+1)x the token compute.
        TrainConfig(
            **common,
            model="lrt",
            schedule="fullseq:3",
            overrides={"n_layer": 2, "memory.gamma_init": 0.0, "memory.rec_init": "zero"},
            name=f"demo-lrt-fullseq3{suffix}",
        ),
    ]


def accuracy_at(run: Run, positions=(2, 4, 6, 8, 12, 24, 48)) -> pd.Series:
    """Exact-decoding accuracy at a few positions, read from the longest evaluation.

    Labelled "accuracy at position p": the run store's `acc@L` columns are accuracy over a whole
    sequence of length L, a different quantity.
    """
    table = load_table(run.path, "per_position")
    length = table["length"].max()
    longest = table[(table["mode"] == "exact") & (table["length"] == length)]
    acc = longest.set_index("position")["accuracy"]
    return pd.Series(
        {
            f"accuracy at position {p} (exact, L={length})": acc[p]
            for p in positions
            if p in acc.index
        }
    )


def chance(run: Run) -> float:
    """Accuracy of a uniform guess: 1/|group| (the prefix tasks' vocabulary is the group)."""
    return 1.0 / run.config["task_vocab_size"]


def side_by_side(runs: list[Run]) -> pd.DataFrame:
    rows = {}
    for run in runs:
        figs = run_figures(run)
        row = {}
        for length in figs.index:
            row[f"pos@90 parallel (L={length})"] = int(figs.loc[length, "pos90_parallel"])
            row[f"pos@90 exact (L={length})"] = int(figs.loc[length, "pos90_exact"])
        row.update(accuracy_at(run).round(3).to_dict())
        row[f"chance (1/|group| = 1/{run.config['task_vocab_size']})"] = round(chance(run), 3)
        row["train time (s)"] = round(run.summary["wall_time_s"])
        row["parameters"] = _params(run)
        row["memory preset, init"] = _memory(run)  # the demo overrides the paper's init (say so)
        rows[run.name] = row
    return pd.DataFrame(rows)


def _memory(run: Run) -> str:
    from lrt_lab.store.run_summary import memory_label

    c = run.config
    mem = c["model"].get("memory") or {}
    return memory_label(
        {
            "config.kind": c.get("kind"),
            "config.train.memory_preset": c["train"].get("memory_preset"),
            **{f"config.model.memory.{k}": v for k, v in mem.items()},
        }
    ).split(" (")[0]


def _params(run: Run) -> str:
    """The model's own parameter count; an LRT's says what its memory pathway adds."""
    p = run.config["params"]
    return f"{p['total']:,}" + (
        f" (+{p['added_pct_of_baseline']:.1f}% memory)" if p["added"] else ""
    )


def run_demo(
    out: str = "runs", quick: bool = False, quiet: bool = False, threads: int | None = None
) -> pd.DataFrame:
    """Train (or reuse) the three demo runs in `out` and print their side-by-side table.

    quiet: no progress bars (the header, the table and the summary are still printed).
    threads: CPU threads (default: the cores free at the start, at most 4;
    lrt_lab.training.threads).
    """
    choice, saved = choose_threads(threads), torch.get_num_threads()
    apply_threads(choice)
    try:
        return _run_demo(out, quick, quiet, choice)
    finally:
        torch.set_num_threads(saved)  # a process-wide setting: give it back to the caller


def _threads_label(choice: ThreadChoice) -> str:
    n = torch.get_num_threads()
    return (
        f"{n} CPU thread{'' if n == 1 else 's'}: {choice.why}; --threads or OMP_NUM_THREADS sets it"
    )


def _run_demo(out: str, quick: bool, quiet: bool, choice: ThreadChoice) -> pd.DataFrame:
    t0 = time.perf_counter()
    print(
        "lrt-lab demo: S3 prefix products (non-commutative state tracking), trained at length "
        f"{TRAIN_LENGTH} "
        f"with a 4 -> {TRAIN_LENGTH} curriculum,\n"
        f"evaluated at lengths {EVAL_LENGTHS} with the training "
        "schedule's parallel forward and with exact recurrent decoding "
        f"({_threads_label(choice)}).\n"
    )
    runs = []
    for cfg in demo_configs(quick):
        folder = Path(out) / cfg.run_name
        if (folder / "summary.json").exists():
            run = Run(folder)
            if run.status == "diverged":
                print(diverged_line(run.name, run.summary), file=sys.stderr)
                raise DemoStopped(run.name, run.status)
            print(f"{cfg.run_name}: already trained in {folder} (delete it to retrain)")
            runs.append(run)
            continue
        if quiet:
            print(f"training {cfg.run_name} ...", flush=True)
        runs.append(train(cfg, out=out, resume=folder.exists(), progress=not quiet))
        if runs[-1].status != "complete":  # stopped (SIGTERM, SIGUSR1) or diverged: train said so
            raise DemoStopped(cfg.run_name, runs[-1].status)
    table = side_by_side(runs)
    with pd.option_context("display.max_colwidth", 40, "display.width", 120):
        print("\n" + table.to_string())
    tf, inter, full = (table[r.name] for r in runs)
    key = f"pos@90 exact (L={max(EVAL_LENGTHS)})"
    print(
        f"\npos@90 with exact decoding at length {max(EVAL_LENGTHS)} (4x training): transformer "
        f"{tf[key]}, LRT trained with Interleaved(2) {inter[key]}, with FullSequence(3) "
        f"{full[key]}."
    )
    print(
        "pos@90 = the last position p such that accuracy >= 90% at every position 1..p (paper's "
        "metric); "
        f"chance = {chance(runs[0]):.3f} at every position (a uniform guess)."
    )
    print(f"\nDone in {time.perf_counter() - t0:.0f} s. Runs are in {Path(out).resolve()}.")
    print(f"Compare them in the dashboard:  lrt-lab app --runs {out}")
    print(f"Or as a table:                  lrt-lab report {out}")
    return table
