"""`lrt-lab analyze probe|gap|depth|convergence|gradient|exactness|contraction|scaling ...`: run
an analysis on a run store, print its tables, write them (and a PNG of the plot) into the store
(scaling: into outputs/<store name>/, or --out).

    lrt-lab analyze probe runs/probe/RUN_A runs/probe/RUN_B --decoding exact
    lrt-lab analyze gap runs/gap
    lrt-lab analyze depth runs/depth --targets 4,8
    lrt-lab analyze convergence runs/gap/RUN_A --tols 0.1,0.01
    lrt-lab analyze gradient runs/gap/RUN_A --schedules fixedpoint:0:4:1,gaussseidel:2:4
    lrt-lab analyze exactness runs/gap/RUN_A --schedules fullseq:1,interleaved:4 --sweeps 30
    lrt-lab analyze contraction runs/gap/RUN_A
    lrt-lab analyze scaling experiments/scaling_runs --x flops
    lrt-lab analyze contraction runs/RUN --plugin my_ext.py   # a run of one's own mechanism

A run trained with `--plugin` records its plugins (config.json's train.plugins), and every
subcommand imports them before it rebuilds the model; `--plugin FILE_OR_MODULE` (repeatable)
imports more first, e.g. a file the run names by a path that is not there.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

PROG = "lrt-lab analyze"
USAGE_ERROR, FAILURE = 2, 1  # lrt_lab.training.exitcodes' USAGE and ERROR (that module loads none)


class Parser(argparse.ArgumentParser):
    """One `lrt-lab analyze: error: ...` line for a bad argument, as every other error path says
    it (argparse's own prefix would be the subcommand's, after a usage dump)."""

    def error(self, message):
        command = self.prog.removeprefix(PROG).strip()
        hint = f"{PROG} {command} -h" if command else f"{PROG} -h"
        self.exit(USAGE_ERROR, f"{PROG}: error: {message} (see {hint})\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: an integer >= 1")
    return value


def number_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is invalid; allowed: comma-separated numbers, e.g. 0.1,0.01"
        ) from None


def add_plugin_argument(p: argparse.ArgumentParser, dest: str = "plugin") -> None:
    p.add_argument(
        "--plugin",
        dest=dest,
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="import a Python file or module first (the schedules and memory mechanisms it "
        "registers; a run's recorded plugins are imported anyway); repeatable",
    )


def add_probe_command(sub) -> None:
    p = sub.add_parser(
        "probe",
        help="linear probes per layer x position (tables/probe_<decoding>.csv in each run), "
        "heatmaps side by side",
        description="Linear probes of the group state per layer and position, with controls, on "
        "each run's latest checkpoint. Writes tables/probe_<decoding>.csv into each run and the "
        "heatmaps as <run>/probe_heatmap_<decoding>.png (several runs side by side: "
        "<store>/.analysis/probe_<decoding>_<digest of the run names>.png).",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders (each with a checkpoint)")
    p.add_argument(
        "--decoding",
        default="exact",
        help="exact (recurrent decoding, what inference does), train (the run's training "
        "schedule, parallel forward), or a schedule spec such as interleaved:2 "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--n-sequences",
        type=positive_int,
        default=512,
        metavar="N",
        help="held-out sequences probed per run (default: %(default)s)",
    )
    p.add_argument(
        "--max-positions",
        type=positive_int,
        default=16,
        metavar="N",
        help="positions probed per sequence, from the first (default: %(default)s)",
    )


def add_gap_command(sub) -> None:
    p = sub.add_parser(
        "gap",
        help="BPB per run, gap recovery, mismatch, refinement (.analysis/tables/)",
        description="BPB of every run (tables/bpb.csv, computed where missing), then gap "
        "recovery, train/inference mismatch and refinement tables in <store>/.analysis/tables/ "
        "and the plot <store>/.analysis/gap_recovery.png.",
    )
    p.add_argument("store", help="a run store (folder of run folders)")
    p.add_argument(
        "--n-sequences",
        type=positive_int,
        default=512,
        metavar="N",
        help="held-out sequences per run (default: %(default)s)",
    )
    p.add_argument(
        "--metric",
        default="bpb.exact",
        help="the metric gap recovery compares: bpb.exact or bpb.parallel (default: %(default)s)",
    )


def add_depth_command(sub) -> None:
    p = sub.add_parser(
        "depth",
        help="depth sweep tables (.analysis/tables/depth_sweep.csv, depth_worth.csv)",
        description="pos@90 against depth per method, and what depth each method needs to reach "
        "each target; tables in <store>/.analysis/tables/, the plot "
        "<store>/.analysis/depth_curve.png.",
    )
    p.add_argument("store", help="a run store of a depth sweep")
    p.add_argument(
        "--metric",
        default=None,
        help="a summary column (default: each run's pos@90 at its training length)",
    )
    p.add_argument(
        "--targets",
        type=number_list,
        default=(),
        metavar="T1,T2",
        help="comma-separated pos@90 targets, e.g. 4,8 (default: none)",
    )


def add_convergence_command(sub) -> None:
    p = sub.add_parser(
        "convergence",
        help="fixed-point sweeps on trained runs (tables/convergence.csv + <run>/convergence.png)",
        description="Jacobi sweeps of each run's memory to its fixed point: the residual per "
        "sweep and the sweeps each tolerance needs; tables/convergence.csv and the plot "
        "<run>/convergence.png in each run.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders (each with a checkpoint)")
    p.add_argument(
        "--n-sequences",
        type=positive_int,
        default=128,
        metavar="N",
        help="held-out sequences per run (default: %(default)s)",
    )
    p.add_argument(
        "--max-sweeps",
        type=positive_int,
        default=None,
        metavar="N",
        help="the most sweeps run (default: the sequence length, where exact recurrence is "
        "reached)",
    )
    p.add_argument(
        "--tols",
        type=number_list,
        default=(0.1, 0.01, 0.001),
        metavar="TOL1,TOL2",
        help="comma-separated tolerances on the residual (default: 0.1,0.01,0.001)",
    )


def add_gradient_command(sub) -> None:
    p = sub.add_parser(
        "gradient",
        help="each trainer's gradient against exact BPTT's, per parameter group "
        "(tables/gradient_fidelity.csv + <run>/gradient_fidelity.png)",
        description="On a run's latest checkpoint and held-out batches: the cosine similarity "
        "and norm ratio of each schedule's gradient to exact BPTT's, per parameter group, against "
        "the forward sweeps F and differentiated sweeps G; the smallest F whose cosine passes 0.9.",
    )
    p.add_argument("run", metavar="RUN", help="a run folder (with a checkpoint)")
    p.add_argument(
        "--schedules",
        default=None,
        metavar="SPEC[,SPEC...]",
        help="schedule spellings to compare (default: fixedpoint, fullseq, gaussseidel, "
        "interleaved and rollout at F = 1, 2, 4, ... up to the run's length)",
    )
    p.add_argument(
        "--n-sequences",
        type=positive_int,
        default=16,
        metavar="N",
        help="held-out sequences (default: %(default)s)",
    )


def add_exactness_command(sub) -> None:
    p = sub.add_parser(
        "exactness",
        help="sweeps and wall clock each schedule's sweep needs to reach exact decoding "
        "(tables/exactness.csv + <run>/exactness.png)",
        description="On a run's latest checkpoint and a held-out batch: Jacobi sweeps, "
        "Gauss-Seidel over S strided groups and contiguous chunks, each iterated from the init "
        "pass; the error to exact decoding's log-probabilities and loss after every sweep, the "
        "sweeps and wall clock each needs, and whether it converges, plateaus or diverges when "
        "iterated far past its training depth.",
    )
    p.add_argument("run", metavar="RUN", help="a run folder (with a checkpoint)")
    p.add_argument(
        "--schedules",
        "--orderings",  # the earlier name, kept working
        dest="schedules",
        default=None,
        metavar="SPEC[,SPEC...]",
        help="schedules whose sweep to iterate, comma-separated: fullseq:1 (Jacobi), "
        "interleaved:S, chunked:C, ... (default: fullseq:1, interleaved:2,4,8,16 and chunked "
        "of T/8 and T/2; the earlier jacobi, gs:S, chunks:C still read)",
    )
    p.add_argument(
        "--sweeps",
        type=positive_int,
        default=30,
        metavar="N",
        help="sweeps after the init pass (default: %(default)s; 1000 to look far past training)",
    )
    p.add_argument(
        "--n-sequences",
        type=positive_int,
        default=16,
        metavar="N",
        help="held-out sequences (default: %(default)s)",
    )
    p.add_argument(
        "--length",
        type=positive_int,
        default=None,
        metavar="T",
        help="sequence length (default: the run's training length)",
    )


def add_contraction_command(sub) -> None:
    p = sub.add_parser(
        "contraction",
        help="the memory map's Lyapunov exponent and the fixed-point sweeps it predicts "
        "(tables/contraction.csv + <run>/contraction.png)",
        description="On a run's latest checkpoint and a held-out batch: the largest Lyapunov "
        "exponent of m_(t-1) -> m_t along the data, its log growth per position, and the Jacobi "
        "sweeps it predicts for each tolerance beside those measured; with the values the "
        "monitor logged during training.",
    )
    p.add_argument("run", metavar="RUN", help="a run folder (with a checkpoint)")
    p.add_argument(
        "--n-sequences",
        type=positive_int,
        default=16,
        metavar="N",
        help="held-out sequences (default: %(default)s)",
    )
    p.add_argument(
        "--length",
        type=positive_int,
        default=None,
        metavar="T",
        help="sequence length (default: the run's training length)",
    )
    p.add_argument(
        "--tols",
        type=number_list,
        default=(0.1, 0.01),
        metavar="TOL1,TOL2",
        help="comma-separated relative tolerances (default: 0.1,0.01)",
    )


def add_scaling_command(sub) -> None:
    p = sub.add_parser(
        "scaling",
        help="BPB against compute: points, paired deltas, power-law fits, decision (+ PNG)",
        description="BPB against compute from the runs trained with a tokens-per-parameter "
        "budget: points, paired LRT-minus-transformer deltas, power-law fits and the decision; "
        "tables in outputs/<store name>/tables/, the plot outputs/<store name>/"
        "scaling_<metric>_<x>.png (or under --out), nothing into the store.",
    )
    p.add_argument("store", help="a run store of runs trained with --tokens-per-param")
    p.add_argument(
        "--x",
        default="C",
        choices=("C", "flops", "wall_s"),
        help="x-axis: C (the paper's compute per parameter), flops or wall_s (default: "
        "%(default)s)",
    )
    p.add_argument(
        "--metric",
        default="bpb_exact",
        choices=("bpb_exact", "bpb_parallel"),
        help="bpb_exact or bpb_parallel (default: %(default)s)",
    )
    p.add_argument(
        "--prefix", default="", help="only runs whose names start with this (default: every run)"
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="where the tables and the plot go (default: outputs/<store folder name>/ under the "
        "current directory; nothing is written into the store)",
    )


# The subcommands in the order --help lists them: a new one is a function above and a line here.
COMMANDS = (
    ("probe", add_probe_command),
    ("gap", add_gap_command),
    ("depth", add_depth_command),
    ("convergence", add_convergence_command),
    ("gradient", add_gradient_command),
    ("exactness", add_exactness_command),
    ("contraction", add_contraction_command),
    ("scaling", add_scaling_command),
)


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG,
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog="Figures go into the run they describe (several runs: <store>/.analysis/), store "
        "tables into <store>/.analysis/tables/ (scaling: outputs/<store name>/ or --out, outside "
        "the store); each path is printed.",
    )
    add_plugin_argument(parser, "plugins_first")
    sub = parser.add_subparsers(
        dest="cmd",
        required=True,
        metavar="{" + ",".join(name for name, _ in COMMANDS) + "}",
        parser_class=Parser,
    )
    for _, add_command in COMMANDS:
        add_command(sub)
    for command in sub.choices.values():
        add_plugin_argument(command)
    return parser


def main(argv=None, debug: bool | None = None) -> int:
    """Exit status 0 done, 2 refused (a bad argument, run or store), 1 an unexpected failure;
    every error is one `lrt-lab analyze: error: ...` line (debug, or LRT_LAB_DEBUG=1: the
    traceback instead)."""
    a = build_parser().parse_args(argv)
    if debug is None:
        debug = os.environ.get("LRT_LAB_DEBUG", "") not in ("", "0")
    try:
        check_paths(a)  # before anything loads torch
        if a.plugins_first or a.plugin:
            from lrt_lab.core.plugins import load_plugins

            load_plugins([*a.plugins_first, *a.plugin])
        return _scaling(a) if a.cmd == "scaling" else _analyze(a)  # scaling loads no torch
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every failure is one line naming its cause
        if debug:
            raise
        if isinstance(e, (ValueError, OSError)):  # bad input, a missing run: the message says it
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return USAGE_ERROR
        first = str(e).splitlines()[0][:300] if str(e) else "no message"
        print(
            f"{PROG}: error: {type(e).__name__}: {first} (run with LRT_LAB_DEBUG=1 for the "
            "traceback)",
            file=sys.stderr,
        )
        return FAILURE


def check_paths(a) -> None:
    """The run folders and stores the subcommand names, refused as the analyses refuse them
    but before torch loads: a run folder holds config.json, a store is a directory."""
    given = vars(a)  # each subcommand names its own arguments
    runs = given.get("runs") or ([given["run"]] if "run" in given else [])
    for run in runs:
        if not (Path(run) / "config.json").is_file():
            raise ValueError(f"run={run!r} is invalid; allowed: a run folder with config.json")
    store = given.get("store")
    if store is not None and not Path(store).is_dir():
        reason = "no such directory" if not Path(store).exists() else "not a directory"
        raise ValueError(f"store={store!r} is invalid: {reason}; allowed: a run store directory")


def probe_figure_path(runs, decoding: str) -> Path:
    """Where the probe heatmaps of `runs` (Runs, in the order shown) go: one run's folder, as
    probe_heatmap_<decoding>.png; for several, the store's .analysis folder (the first run's
    store), named by the decoding and a digest of the run names, so that another selection never
    overwrites it."""
    from lrt_lab.analysis.loading import analysis_dir

    if len(runs) == 1:
        return runs[0].path / f"probe_heatmap_{decoding}.png"
    digest = hashlib.sha256("\n".join(r.name for r in runs).encode()).hexdigest()[:8]
    return analysis_dir(runs[0].path.parent) / f"probe_{decoding}_{digest}.png"


def figure_decoding(tables: dict) -> str:
    """The decoding the probe tables name (`exact`, `interleaved_2`), for a figure's file name: a
    model without memory is probed with its one forward ("onepass") whatever was asked, so that
    label counts only when no table names another; several read joined by "+"."""
    decodings = {str(t["decoding"].iloc[0]) for t in tables.values()}
    if len(decodings) > 1:
        decodings.discard("onepass")
    return "+".join(sorted(decodings))


def _analyze(a) -> int:
    """The subcommands that load a run's model (all but scaling), each printing its tables and
    writing its figure."""
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd
    import torch

    torch.set_num_threads(1)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 40)
    ANALYSES[a.cmd](a)
    return 0


def _probe(a) -> None:
    from lrt_lab.analysis import plot_probe_comparison, probe_run
    from lrt_lab.analysis.loading import as_run

    tables, runs = {}, []
    for r in a.runs:
        run = as_run(r)
        t = probe_run(run, a.decoding, n_sequences=a.n_sequences, max_positions=a.max_positions)
        tables[run.name] = t
        runs.append(run)
        print(run.name)
        print(
            t.pivot_table(
                index=["site", "target", "control"], columns="position", values="accuracy"
            )
            .round(2)
            .to_string()
        )
    out = probe_figure_path(runs, figure_decoding(tables))
    plot_probe_comparison(tables).savefig(out, dpi=110)
    print(f"heatmap: {out}")


def _gap(a) -> None:
    from lrt_lab.analysis import analyze_gap
    from lrt_lab.analysis.loading import analysis_dir
    from lrt_lab.core.plugins import provided

    tables = analyze_gap(a.store, metric=a.metric, n_sequences=a.n_sequences)
    for name, t in tables.items():
        print(f"\n{name}\n{t.to_string(index=False)}")
    if not tables["gap_recovery"].empty:
        out = analysis_dir(a.store) / "gap_recovery.png"
        provided("plot_gap_recovery")(tables["gap_recovery"]).savefig(out, dpi=110)
        print(f"plot: {out}")


def _convergence(a) -> None:
    from lrt_lab.analysis.convergence import (
        convergence_run,
        plot_convergence,
        residual_per_sweep,
        sweeps_to_converge,
    )
    from lrt_lab.analysis.loading import as_run

    for r in a.runs:
        run = as_run(r)
        trace = convergence_run(run, n_sequences=a.n_sequences, max_sweeps=a.max_sweeps)
        need = sweeps_to_converge(trace, a.tols)
        print(run.name)
        print(residual_per_sweep(trace).to_string(index=False))
        print(need[need["position"] == "all"].to_string(index=False))
        out = run.path / "convergence.png"
        plot_convergence(trace, a.tols, title=run.name).savefig(out, dpi=110)
        print(f"plot: {out}")


def _gradient(a) -> None:
    from lrt_lab.analysis.gradient import (
        gradient_run,
        plot_gradient_fidelity,
        smallest_passing,
    )
    from lrt_lab.analysis.loading import as_run
    from lrt_lab.run.registry import split_spellings

    run = as_run(a.run)
    specs = split_spellings([a.schedules]) if a.schedules else None
    table = gradient_run(run, specs, n_sequences=a.n_sequences)
    print(run.name)
    print(
        table.pivot_table(index=["family", "F", "G", "schedule"], columns="group", values="cosine")
        .round(3)
        .to_string()
    )
    print("\nsmallest F whose cosine passes 0.9 in every group:")
    print(smallest_passing(table).to_string(index=False))
    out = run.path / "gradient_fidelity.png"
    plot_gradient_fidelity(table, title=run.name).savefig(out, dpi=110)
    print(f"table: {run.path / 'tables' / 'gradient_fidelity.csv'}\nplot: {out}")


def _exactness(a) -> None:
    from lrt_lab.analysis.exactness import (
        exactness_run,
        passes_to_exactness,
        plot_exactness,
        table_name,
    )
    from lrt_lab.analysis.loading import as_run
    from lrt_lab.run.registry import split_spellings

    run = as_run(a.run)
    specs = [s.strip() for s in split_spellings([a.schedules])] if a.schedules else None
    trace = exactness_run(
        run, specs, max_sweeps=a.sweeps, n_sequences=a.n_sequences, length=a.length
    )
    print(run.name)
    at = tuple(k for k in (1, 2, 4, 8, 30, 1000) if k <= a.sweeps)
    print(passes_to_exactness(trace, at=at).to_string(index=False))
    name = table_name("exactness", run, a.length or run.config["train"]["length"])
    out = run.path / f"{name}.png"
    plot_exactness(trace, title=run.name).savefig(out, dpi=110)
    print(f"table: {run.path / 'tables' / f'{name}.csv'}\nplot: {out}")


def _contraction(a) -> None:
    from lrt_lab.analysis.contraction import contraction_run, plot_contraction
    from lrt_lab.analysis.exactness import table_name
    from lrt_lab.analysis.loading import as_run

    run = as_run(a.run)
    tables = contraction_run(run, n_sequences=a.n_sequences, length=a.length, tols=a.tols)
    print(run.name)
    print(tables["summary"].drop(columns="run").to_string(index=False))
    name = table_name("contraction", run, a.length or run.config["train"]["length"])
    out = run.path / f"{name}.png"
    plot_contraction(tables, tables["history"], title=run.name).savefig(out, dpi=110)
    print(f"table: {run.path / 'tables' / f'{name}.csv'}\nplot: {out}")


def _depth(a) -> None:
    from lrt_lab.analysis.loading import analysis_dir
    from lrt_lab.core.plugins import provided

    tables = provided("analyze_depth_sweep")(a.store, a.metric, a.targets)
    for name, t in tables.items():
        print(f"\n{name}\n{t.to_string(index=False)}")
    out = analysis_dir(a.store) / "depth_curve.png"
    provided("plot_depth_curve")(tables["depth_sweep"]).savefig(out, dpi=110)
    print(f"plot: {out}")


ANALYSES = {
    "probe": _probe,
    "gap": _gap,
    "convergence": _convergence,
    "gradient": _gradient,
    "exactness": _exactness,
    "contraction": _contraction,
    "depth": _depth,
}


def _scaling(a) -> int:
    from lrt_lab.core.plugins import provided

    return provided("analyze_scaling")(a)  # the fits and contrasts: lrt_results.cli


if __name__ == "__main__":
    sys.exit(main())
