"""The run store, without torch: each run's folder (config.json, metrics, tables, checkpoints)
read and written (`results`), and the statistics, contrasts, run groups and reports built on the
loaded runs (`lrt-lab report`), which the dashboard reads too."""
