"""`lrt-lab analyze probe|gap|depth|convergence|gradient|scaling ...`: run an analysis on a run
store, print its tables, write them (and a PNG of the plot) into the store.

    lrt-lab analyze probe runs/probe/RUN_A runs/probe/RUN_B --decoding exact
    lrt-lab analyze gap runs/gap
    lrt-lab analyze depth runs/depth --targets 4,8
    lrt-lab analyze convergence runs/gap/RUN_A --tols 0.1,0.01
    lrt-lab analyze gradient runs/gap/RUN_A --schedules fixedpoint:0:4:1,gaussseidel:2:4
    lrt-lab analyze scaling experiments/scaling_runs --x flops
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="lrt-lab analyze", description=__doc__.split("\n\n")[0].replace("\n", " ")
    )
    sub = p.add_subparsers(
        dest="cmd", required=True, metavar="{probe,gap,depth,convergence,gradient,scaling}"
    )
    pr = sub.add_parser(
        "probe", help="probe runs (tables/probe_<decoding>.csv), heatmaps side by side"
    )
    pr.add_argument("runs", nargs="+", help="run folders (each with a checkpoint)")
    pr.add_argument(
        "--decoding", default="exact", help="exact, train (the run's schedule), or a schedule spec"
    )
    pr.add_argument("--n-sequences", type=int, default=512, help="held-out sequences probed")
    pr.add_argument("--max-positions", type=int, default=16, help="positions probed per sequence")
    g = sub.add_parser(
        "gap", help="BPB per run, gap recovery, mismatch, refinement (.analysis/tables/)"
    )
    g.add_argument("store", help="a run store (folder of run folders)")
    g.add_argument("--n-sequences", type=int, default=512, help="held-out sequences per run")
    g.add_argument("--metric", default="bpb.exact", help="the metric gap recovery compares")
    d = sub.add_parser(
        "depth", help="depth sweep tables (.analysis/tables/depth_sweep.csv, depth_worth.csv)"
    )
    d.add_argument("store", help="a run store of a depth sweep")
    d.add_argument("--metric", default=None, help="default: the store's pos@90 at the train length")
    d.add_argument("--targets", default="", help="comma-separated pos@90 targets, e.g. 4,8")
    c = sub.add_parser(
        "convergence", help="fixed-point sweeps on trained runs (tables/convergence.csv + PNG)"
    )
    c.add_argument("runs", nargs="+", help="run folders (each with a checkpoint)")
    c.add_argument("--n-sequences", type=int, default=128, help="held-out sequences per run")
    c.add_argument("--max-sweeps", type=int, default=None, help="default: the sequence length")
    c.add_argument("--tols", default="0.1,0.01,0.001", help="comma-separated tolerances")
    gr = sub.add_parser(
        "gradient",
        help="each trainer's gradient against exact BPTT's, per parameter group "
        "(tables/gradient_fidelity.csv + PNG)",
    )
    gr.add_argument("run", help="a run folder (with a checkpoint)")
    gr.add_argument(
        "--schedules",
        default=None,
        metavar="SPEC[,SPEC...]",
        help="schedule spellings to compare (default: fixedpoint, fullseq, gaussseidel, "
        "interleaved and rollout at F = 1, 2, 4, ... up to the run's length)",
    )
    gr.add_argument("--n-sequences", type=int, default=16, help="held-out sequences")
    s = sub.add_parser(
        "scaling",
        help="BPB against compute: points, paired deltas, power-law fits, decision (+ PNG)",
    )
    s.add_argument("store", help="a run store of runs trained with --tokens-per-param")
    s.add_argument(
        "--x", default="C", help="x-axis: C (the paper's compute per parameter), flops or wall_s"
    )
    s.add_argument("--metric", default="bpb_exact", help="bpb_exact (default) or bpb_parallel")
    s.add_argument("--prefix", default="", help="only runs whose names start with this")
    a = p.parse_args(argv)
    if a.cmd == "scaling":  # torch-free: answers without importing it
        try:
            return _scaling(a)
        except ValueError as e:
            print(f"lrt-lab analyze: error: {e}", file=sys.stderr)
            return 2

    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd
    import torch

    torch.set_num_threads(1)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 40)
    from lrt_lab.analysis import (
        analyze_depth_sweep,
        analyze_gap,
        plot_depth_curve,
        plot_gap_recovery,
        plot_probe_comparison,
        probe_run,
    )
    from lrt_lab.analysis.loading import analysis_dir, as_run

    try:
        if a.cmd == "probe":
            tables = {}
            for r in a.runs:
                run = as_run(r)
                t = probe_run(
                    run, a.decoding, n_sequences=a.n_sequences, max_positions=a.max_positions
                )
                tables[run.name] = t
                print(run.name)
                print(
                    t.pivot_table(
                        index=["site", "target", "control"], columns="position", values="accuracy"
                    )
                    .round(2)
                    .to_string()
                )
            out = Path(a.runs[0]).parent / "probe_heatmap.png"
            plot_probe_comparison(tables).savefig(out, dpi=110)
            print(f"heatmap: {out}")
        elif a.cmd == "gap":
            tables = analyze_gap(a.store, metric=a.metric, n_sequences=a.n_sequences)
            for name, t in tables.items():
                print(f"\n{name}\n{t.to_string(index=False)}")
            if not tables["gap_recovery"].empty:
                out = analysis_dir(a.store) / "gap_recovery.png"
                plot_gap_recovery(tables["gap_recovery"]).savefig(out, dpi=110)
                print(f"plot: {out}")
        elif a.cmd == "convergence":
            from lrt_lab.analysis.convergence import (
                convergence_run,
                plot_convergence,
                residual_per_sweep,
                sweeps_to_converge,
            )

            tols = tuple(float(x) for x in a.tols.split(",") if x.strip())
            for r in a.runs:
                run = as_run(r)
                trace = convergence_run(run, n_sequences=a.n_sequences, max_sweeps=a.max_sweeps)
                need = sweeps_to_converge(trace, tols)
                print(run.name)
                print(residual_per_sweep(trace).to_string(index=False))
                print(need[need["position"] == "all"].to_string(index=False))
                out = run.path / "convergence.png"
                plot_convergence(trace, tols, title=run.name).savefig(out, dpi=110)
                print(f"plot: {out}")
        elif a.cmd == "gradient":
            from lrt_lab.analysis.gradient import (
                gradient_run,
                plot_gradient_fidelity,
                smallest_passing,
            )
            from lrt_lab.run.registry import split_spellings

            run = as_run(a.run)
            specs = split_spellings([a.schedules]) if a.schedules else None
            table = gradient_run(run, specs, n_sequences=a.n_sequences)
            print(run.name)
            print(
                table.pivot_table(
                    index=["family", "F", "G", "schedule"], columns="group", values="cosine"
                )
                .round(3)
                .to_string()
            )
            print("\nsmallest F whose cosine passes 0.9 in every group:")
            print(smallest_passing(table).to_string(index=False))
            out = run.path / "gradient_fidelity.png"
            plot_gradient_fidelity(table, title=run.name).savefig(out, dpi=110)
            print(f"table: {run.path / 'tables' / 'gradient_fidelity.csv'}\nplot: {out}")
        else:
            targets = tuple(float(x) for x in a.targets.split(",") if x.strip())
            tables = analyze_depth_sweep(a.store, a.metric, targets)
            for name, t in tables.items():
                print(f"\n{name}\n{t.to_string(index=False)}")
            out = analysis_dir(a.store) / "depth_curve.png"
            plot_depth_curve(tables["depth_sweep"]).savefig(out, dpi=110)
            print(f"plot: {out}")
    except ValueError as e:
        print(f"lrt-lab analyze: error: {e}", file=sys.stderr)
        return 2
    return 0


def _scaling(a) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from lrt_lab.analysis.loading import analysis_dir, write_store_table
    from lrt_lab.analysis.scaling import (
        check_same_heldout,
        decide,
        fit_power_laws,
        paired_deltas,
        scaling_figure,
        scaling_points,
    )
    from lrt_lab.store.results import load_runs

    pd.set_option("display.width", 200)
    runs = load_runs(a.store)
    if not runs.empty and a.prefix:
        runs = runs[runs["run"].str.startswith(a.prefix)]
    points = scaling_points(runs)
    if points.empty:
        raise ValueError(
            f"store={a.store!r}: no complete run trained with a tokens-per-parameter budget"
        )
    check_same_heldout(points)
    deltas = paired_deltas(points, metric=a.metric)
    fits = fit_power_laws(points, metric=a.metric, x=a.x)
    summary = points.groupby(["method", "R"]).agg(
        n=("seed", "size"),
        C=("C", "mean"),
        bpb_exact=("bpb_exact", "mean"),
        bpb_parallel=("bpb_parallel", "mean"),
        epochs=("epochs", "max"),
    )
    for name, table in (
        ("scaling_points", summary.reset_index()),
        ("scaling_deltas", deltas),
        ("scaling_fits", fits),
    ):
        print(f"\n{name}\n{table.round(4).to_string(index=False)}")
        write_store_table(a.store, name, table)
    print(f"\ndecision ({a.metric}): {decide(deltas)}")
    out = analysis_dir(a.store) / f"scaling_{a.metric}_{a.x}.png"
    scaling_figure(points, out, x=a.x, metric=a.metric)
    print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
