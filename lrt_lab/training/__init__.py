"""Training: the one loop for every model and schedule (`loop.train`, `TrainConfig`), its
optimizers (Muon and AdamW by declared role), stopping rules, checkpoints, budgets, experiment
tracking mirrors, and sweeps of many runs (`sweep`), all writing into the run store."""
