"""Running a model: schedules of stages (`runner.run_schedule`), their registry, decoding,
evaluation, hooks and patching, and the contraction monitor the training loop logs."""
