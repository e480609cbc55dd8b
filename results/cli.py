"""What `lrt-lab report` and the statistics of `lrt-lab analyze` run, found by the lab through the
entry point group lrt_lab.commands (pyproject.toml): lrt_lab checks a command's arguments (and
expands a study's grid), then hands over here, so it never imports this package by name."""

from __future__ import annotations


def report(a) -> int:
    """`lrt-lab report STORE` (and `--scoreboard`) once the lab has checked the arguments."""
    if a.scoreboard:
        from lrt_results.report import print_scoreboard

        print_scoreboard(a.runs, fmt=a.format, task=a.task, where=a.where, prefix=a.prefix)
        return 0
    from lrt_results.report import print_report

    print_report(
        a.runs,
        metric=a.metric,
        group_by=a.group_by,
        fmt=a.format,
        task=a.task,
        where=a.where,
        prefix=a.prefix,
    )
    return 0


def report_study(a, study, names: list[str]) -> int:
    """`lrt-lab report STORE --study SPEC.toml` once the lab has checked the spec and expanded its
    grid to `names`: the study's tables, then its figures."""
    from lrt_results.study import print_study

    print_study(a.runs, study, run_names=names, store_name=a.runs)
    from pathlib import Path

    from lrt_lab.store.folders import output_dir
    from lrt_results.study_curves import plot_learning_curves

    folder, stem = output_dir(a.runs, a.out), Path(a.study).stem
    if plot_learning_curves(a.runs, study, folder / f"curves_{stem}.png", names) is not None:
        print(f"\nfigure (learning curves, each arm's seed mean): {folder / f'curves_{stem}.png'}")
    if study.time_to_event is not None:
        from lrt_results.time_to_event import plot_time_to_event

        out = folder / f"time_to_event_{stem}.png"
        if plot_time_to_event(a.runs, study, out, run_names=names) is not None:
            print(f"\nfigure (Kaplan-Meier, share of seeds that reached the length): {out}")
    return 0


def analyze_scaling(a) -> int:
    """`lrt-lab analyze scaling STORE`: the scaling points, paired deltas, power-law fits and the
    decision, printed and written under the output folder, with the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from lrt_lab.store.folders import output_dir
    from lrt_lab.store.results import first_names, load_plans, load_runs, write_table
    from lrt_results.scaling import (
        check_same_heldout,
        decide,
        fit_power_laws,
        paired_deltas,
        planned_seeds,
        scaling_figure,
        scaling_points,
    )

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
    folder = output_dir(a.store, a.out)
    if points.attrs["duplicates"]:
        twice = points.attrs["duplicates"]
        print(
            f"note: {len(twice)} run(s) repeat another's method, budget and seed and are counted "
            f"once: {first_names(twice, 3)}"
        )
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
        write_table(folder, name, table)
    planned = planned_seeds(points, load_plans(a.store))
    seeds = "no plan recorded" if planned is None else f"{planned} seeds planned"
    print(f"\ndecision ({a.metric}; {seeds}): {decide(deltas, planned_seeds=planned)}")
    out = folder / f"scaling_{a.metric}_{a.x}.png"
    scaling_figure(points, out, x=a.x, metric=a.metric)
    print(f"tables: {folder / 'tables'}\nplot: {out}")
    return 0
