"""Analysis tools: what the memory carries (probes), how much of exact recurrence a parallel
schedule recovers (gap), how sequential the learned recurrence is (convergence), how many passes
each schedule's sweep needs to reach exact decoding (exactness), whether the memory map contracts
(contraction), and how close each schedule's gradient is to exact BPTT's (gradient): the analyses
that rebuild a model. What the runs of a store say together (the gap tables, the depth sweep, seed
statistics, scaling fits) is lrt_results (docs/design.md, "The instrument and the lab").

Each tool writes tables into the run store: per-run tables with `Run.write_table` (probe_<decoding>,
bpb), store-level tables under `<store>/.analysis/tables/` (gap_recovery, mismatch, refinement,
depth_sweep, depth_worth), a hidden folder that `load_runs` skips. Each has a seaborn plot function
returning a matplotlib Figure.

The names below load on first use (PEP 562), so importing the package loads no torch.
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
        ("analyze_gap", "bpb_of", "collect_bpb", "evaluate_bpb"), "lrt_lab.analysis.bpb"
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
