"""Restate a store's records with today's counters, without retraining (lrt_lab.analysis.recount):
FLOPs the earlier counter missed (work run under inference_mode: Rollout's rollout), final
cross-entropies that averaged NaN positions as 0, and the model conventions a config predates.

    python scripts/restate_store.py STORE [STORE ...] [--dry-run]

Prints one line per run it changes (or would change), then a count. Runs already restated, and
runs neither defect touches, are left byte for byte as they were.
"""

import argparse
import sys
from pathlib import Path

from lrt_lab.analysis.recount import record_conventions, restate_flops, restate_nonfinite
from lrt_lab.store.results import load_runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stores", nargs="+", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="report, write nothing")
    args = parser.parse_args(argv)
    changed = 0
    for store in args.stores:
        for path in load_runs(store)["path"]:
            flops = restate_flops(path, write=not args.dry_run)
            nan = restate_nonfinite(path, write=not args.dry_run)
            conventions = record_conventions(path, write=not args.dry_run)
            if flops["missed"]:
                ratio = flops["restated"] / flops["recorded"]
                print(
                    f"{Path(path).name}: FLOPs {flops['recorded']:.4g} -> "
                    f"{flops['restated']:.4g} (x{ratio:.4f})",
                    flush=True,
                )
            if nan["nonfinite"]:
                print(f"{Path(path).name}: NaN cross-entropy at {nan['nonfinite']}", flush=True)
            if conventions:
                print(f"{Path(path).name}: config records {', '.join(conventions)}", flush=True)
            changed += bool(flops["missed"] or nan["nonfinite"] or conventions)
    print(f"{changed} run(s) {'would be ' if args.dry_run else ''}restated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
