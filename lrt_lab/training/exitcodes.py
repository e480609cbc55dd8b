"""The exit statuses of `lrt-lab`, one meaning each, so a script can tell a finished job from one
to run again: `lrt-lab sweep SPEC && lrt-lab report runs/` reports only a finished grid.

`lrt-lab train --help` and `lrt-lab sweep --help` list them (`epilog`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

COMPLETE = 0  # every run finished with status "complete" (also --dry-run, --help)
ERROR = 1  # an unexpected failure (out of memory, a bug): one `lrt-lab: error:` line
USAGE = 2  # refused: a bad argument, spec or path, a run another process trains, a full disk
INCOMPLETE = 3  # stopped before the end, checkpointed: run the same command again to continue
DIVERGED = 4  # a run's loss became NaN or inf (summary.json status "diverged")
INTERRUPTED = 130  # Ctrl-C (SIGINT), the shell's 128 + 2; resumable like INCOMPLETE

MEANINGS = {
    COMPLETE: "complete: every run finished, none diverged",
    ERROR: "error: an unexpected failure (out of memory, a bug), named in one line",
    USAGE: "refused: an invalid argument, spec or path, a run another process trains, or a full "
    "disk; named in one line",
    INCOMPLETE: "incomplete: stopped before the end (SIGTERM or SIGUSR1, --time-limit, runs left "
    "to train or still running on Slurm), checkpointed; run the same command again "
    "(train: with --resume) to continue",
    DIVERGED: "diverged: a loss became NaN or inf (summary.json status 'diverged'); for a sweep: "
    "every run finished, at least one diverged",
    INTERRUPTED: "interrupted by Ctrl-C; resumable like 3",
}


def for_statuses(statuses: Iterable[str]) -> int:
    """The exit status of a command that leaves runs with these `Run.status` values: INCOMPLETE
    while any run is unfinished (running again makes progress), else DIVERGED if any diverged,
    else COMPLETE."""
    statuses = list(statuses)
    if any(s not in ("complete", "diverged") for s in statuses):
        return INCOMPLETE
    return DIVERGED if "diverged" in statuses else COMPLETE


def epilog() -> str:
    """The exit statuses as a --help epilog (for argparse's RawDescriptionHelpFormatter)."""
    lines = ["exit status:"]
    for code, meaning in MEANINGS.items():
        lines.append(
            textwrap.fill(
                meaning, width=88, initial_indent=f"  {code:<5}", subsequent_indent=" " * 7
            )
        )
    return "\n".join(lines)
