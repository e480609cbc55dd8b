"""Running a model: schedules of stages (`runner.run_schedule`), their registry, decoding,
evaluation and hooks."""
