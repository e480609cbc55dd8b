"""Running a model: schedules of stages (`runner.run_schedule`), decoding and evaluation.

Importing the package registers the built-in schedules (`schedules`), so a spelling parses
wherever the registry is used.
"""

from lrt_lab.run import schedules  # noqa: F401  (the built-in schedules join the registry)
