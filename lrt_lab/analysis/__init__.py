"""Analysis tools: what the memory carries (probes), how much of exact recurrence a parallel
trainer recovers (gap), how sequential the learned recurrence is (convergence), how much depth the memory is worth (depth), and seed statistics (stats).

Each tool writes tables into the run store: per-run tables with `Run.write_table` (probe_<decoding>,
bpb), store-level tables under `<store>/.analysis/tables/` (gap_recovery, mismatch, refinement,
depth_sweep, depth_worth), a hidden folder that `load_runs` skips. Each has a seaborn plot function
returning a matplotlib Figure.
"""

from .convergence import (convergence_run, convergence_trace, plot_convergence, residual_per_sweep,
                          sweeps_to_converge)
from .depth import analyze_depth_sweep, depth_table, depth_worth, min_depth, plot_depth_curve
from .gap import (analyze_gap, bpb_of, collect_bpb, evaluate_bpb, gap_recovery, mismatch_table, plot_gap_recovery,
                  plot_mismatch, plot_refinement, recovered_fraction, refinement_table)
from .probes import (collect_activations, default_sites, fit_probes, plot_probe_comparison, plot_probe_heatmap,
                     probe_activations, probe_model, probe_run)
from .stats import bootstrap_ci, mean_ci, plot_seed_stats, seed_stats
from .store import ANALYSIS_DIR, load_model, load_task, read_store_table, write_store_table

__all__ = [
    "ANALYSIS_DIR", "analyze_depth_sweep", "analyze_gap", "bootstrap_ci", "bpb_of", "collect_activations",
    "collect_bpb", "convergence_run", "convergence_trace", "default_sites", "depth_table", "depth_worth", "evaluate_bpb", "fit_probes", "gap_recovery",
    "load_model", "load_task", "mean_ci", "min_depth", "mismatch_table", "plot_depth_curve", "plot_gap_recovery",
    "plot_convergence", "plot_mismatch", "plot_probe_comparison", "plot_probe_heatmap", "plot_refinement", "plot_seed_stats",
    "probe_activations", "probe_model", "probe_run", "read_store_table", "recovered_fraction", "refinement_table",
    "residual_per_sweep", "seed_stats", "sweeps_to_converge", "write_store_table",
]
