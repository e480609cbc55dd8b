"""Compacting a store: every complete run's metrics.jsonl replaced by its metrics.jsonl.xz
(`results.Run.compact_metrics`), for stores written before the training loop compacted its runs
itself, or whose runs a kill stopped between summary and compaction.

A run is compacted under its claim (`lrt_lab.store.claims`), so no training process resumes it
meanwhile; a run still in progress (no summary.json) or claimed by a live process is left as it
is and counted. Each run is compacted on its own and atomically, so compacting again after a
kill goes on where it stopped, and compacting a compacted store changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lrt_lab.store.claims import RunClaimedError, acquire, claimed_by_other
from lrt_lab.store.results import CONFIG, METRICS, METRICS_XZ, SUMMARY, Run


@dataclass
class Compaction:
    """What compacting a store did (or, in a dry run, would do): runs compacted, the bytes of
    their metrics.jsonl before and of the .xz after (before only, in a dry run), and the run
    names left alone, by why."""

    dry_run: bool = False
    compacted: list[str] = field(default_factory=list)
    before: int = 0
    after: int = 0
    already: list[str] = field(default_factory=list)  # compacted before, or no log at all
    in_progress: list[str] = field(default_factory=list)
    claimed: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """What happened, a line each: the runs done, then those left alone."""
        n = len(self.compacted)
        if self.dry_run:
            head = f"would compact {n} run(s): {_mb(self.before)} of {METRICS}"
        elif n:
            ratio = self.before / self.after if self.after else float("inf")
            head = (
                f"compacted {n} run(s): {METRICS} {_mb(self.before)} -> {METRICS_XZ} "
                f"{_mb(self.after)} ({ratio:.2f}x smaller)"
            )
        else:
            head = "compacted 0 runs: nothing to do"
        out = [head]
        for names, why in (
            (self.already, "compacted already"),
            (self.in_progress, "in progress (no summary.json), left as they are"),
            (self.claimed, "being written by a live process, left as they are"),
        ):
            if names:
                out.append(f"{len(names)} run(s) {why}")
        return out


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB ({n:,} bytes)"


def run_folders(root: Path) -> list[Path]:
    """The run folders of a store: its visible subfolders holding a config.json."""
    return sorted(
        p for p in root.iterdir() if not p.name.startswith(".") and (p / CONFIG).is_file()
    )


def compact_store(root, dry_run: bool = False) -> Compaction:
    """Compact every complete run of the store `root` (see the module docstring); ValueError
    for a path that is not a folder."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"no such store: {root} is not a folder")
    done = Compaction(dry_run=dry_run)
    for folder in run_folders(root):
        plain = folder / METRICS
        if not (folder / SUMMARY).is_file():
            done.in_progress.append(folder.name)
        elif not plain.is_file():
            done.already.append(folder.name)
        elif claimed_by_other(folder):
            done.claimed.append(folder.name)
        elif dry_run:
            done.compacted.append(folder.name)
            done.before += plain.stat().st_size
        else:
            _compact_claimed(folder, done)
    return done


def _compact_claimed(folder: Path, done: Compaction) -> None:
    try:
        claim = acquire(folder)
    except RunClaimedError:  # claimed between the look and the claim
        done.claimed.append(folder.name)
        return
    with claim:
        sizes = Run(folder).compact_metrics()
    if sizes is None:  # compacted by someone else meanwhile
        done.already.append(folder.name)
        return
    done.compacted.append(folder.name)
    done.before += sizes[0]
    done.after += sizes[1]
