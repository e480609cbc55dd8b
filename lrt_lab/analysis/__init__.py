"""Analysis tools: what the memory carries (probes), how much of exact recurrence a parallel
schedule recovers (gap), how sequential the learned recurrence is (convergence), how many passes
each schedule's sweep needs to reach exact decoding (exactness), whether the memory map
contracts (contraction), how close each schedule's gradient is to exact BPTT's (gradient), how
much depth the memory is worth (depth), and seed statistics (stats).

Each tool writes tables into the run store: per-run tables with `Run.write_table` (probe_<decoding>,
bpb), store-level tables under `<store>/.analysis/tables/` (gap_recovery, mismatch, refinement,
depth_sweep, depth_worth), a hidden folder that `load_runs` skips. Each has a seaborn plot function
returning a matplotlib Figure.

The names below load on first use (PEP 562), so `lrt_lab.store.stats` (pandas and scipy) can be
imported by the dashboard without importing torch.
"""

import importlib

_LAZY = {
    **dict.fromkeys(
        (
            "convergence_run",
            "convergence_trace",
            "plot_convergence",
            "residual_per_sweep",
            "sweeps_to_converge",
        ),
        "lrt_lab.analysis.convergence",
    ),
    **dict.fromkeys(
        (
            "default_schedules",
            "gradient_fidelity",
            "gradient_run",
            "plot_gradient_fidelity",
            "smallest_passing",
        ),
        "lrt_lab.analysis.gradient",
    ),
    **dict.fromkeys(
        (
            "default_sweep_schedules",
            "exactness_run",
            "exactness_trace",
            "passes_to_exactness",
            "plot_exactness",
            "sweep_spec",
            "sweep_stages",
        ),
        "lrt_lab.analysis.exactness",
    ),
    **dict.fromkeys(
        ("contraction_run", "contraction_tables", "plot_contraction", "predicted_sweeps"),
        "lrt_lab.analysis.contraction",
    ),
    **dict.fromkeys(
        ("analyze_depth_sweep", "depth_table", "depth_worth", "min_depth", "plot_depth_curve"),
        "lrt_lab.analysis.depth",
    ),
    **dict.fromkeys(
        ("analyze_gap", "bpb_of", "collect_bpb", "evaluate_bpb"), "lrt_lab.analysis.bpb"
    ),
    **dict.fromkeys(
        (
            "read_bpb",
            "gap_recovery",
            "mismatch_table",
            "plot_gap_recovery",
            "plot_mismatch",
            "plot_refinement",
            "recovered_fraction",
            "refinement_table",
        ),
        "lrt_lab.analysis.gap",
    ),
    **dict.fromkeys(
        (
            "collect_activations",
            "default_sites",
            "fit_probes",
            "plot_probe_comparison",
            "plot_probe_heatmap",
            "probe_activations",
            "probe_model",
            "probe_run",
        ),
        "lrt_lab.analysis.probes",
    ),
    **dict.fromkeys(
        ("bootstrap_ci", "mean_ci", "plot_seed_stats", "seed_stats"), "lrt_lab.store.stats"
    ),
    **dict.fromkeys(
        ("ANALYSIS_DIR", "load_model", "load_task", "read_store_table", "write_store_table"),
        "lrt_lab.analysis.loading",
    ),
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lrt_lab.analysis' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
