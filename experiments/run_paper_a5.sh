#!/usr/bin/env bash
# The paper-size A5 run (experiments/a5_paper.toml) on one GPU, in segments of bounded wall time.
#
#   experiments/run_paper_a5.sh [SECONDS]   one segment: train until SECONDS (default 480) have
#                                           passed, checkpoint the run in progress, exit
#   experiments/run_paper_a5.sh --all       segments until every run is complete
#
# Finished runs are skipped and the run in progress resumes from its checkpoint, so the command is
# simply repeated (each call of the device tool may last at most 10 minutes: 480 s of training
# leaves room for start-up and the evaluation that ends a run). Environment: SPEC (default
# experiments/a5_paper.toml), STORE (default: the spec's out, runs/a5_paper), DEVICE (default
# cuda), PYTHON (default python3).
#
# A fresh machine has none of the last one's files. When $OUT is set (the device tool), each
# segment also packs the store into $OUT/store.tgz.00, .01, ... (15 MB parts; the checkpoints of
# finished runs dropped, only the newest of the run in progress kept). On the host:
#   cat <files_at>/store.tgz.* | tar -xz        # restores runs/a5_paper
# and the next call names runs/a5_paper in `carry`. Finished runs go to the committed store with
#   rsync -a --exclude checkpoints runs/a5_paper/ experiments/results/
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC=${SPEC:-experiments/a5_paper.toml}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
STORE=${STORE:-$("$PY" -c "import sys, tomllib; print(tomllib.load(open(sys.argv[1], 'rb'))['sweep']['out'])" "$SPEC")}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# lrt_lab finds the tasks through the package's entry point: install it (offline, no deps) if absent
"$PY" -c "import importlib.metadata as m, sys; sys.exit(not list(m.entry_points(group='lrt_lab.tasks')))" \
  || "$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null

segment() {  # one bounded segment of the sweep
  "$PY" -m lrt_lab.cli sweep "$SPEC" --out "$STORE" --device "$DEVICE" --time-limit "$1"
}

remaining() {  # how many runs of the spec are not complete
  "$PY" -m lrt_lab.cli sweep "$SPEC" --out "$STORE" --device "$DEVICE" --dry-run | grep -c '^todo' || true
}

pack() {  # prune checkpoints, then ship the store back through $OUT
  for run in "$STORE"/*/; do
    if [ -f "$run/summary.json" ]; then rm -rf "$run/checkpoints"
    elif [ -d "$run/checkpoints" ]; then ls -1 "$run"/checkpoints/step_*.pt 2>/dev/null | head -n -1 | xargs -r rm -f
    fi
  done
  if [ -n "${OUT:-}" ]; then tar -cz "$STORE" | split -b 15000000 -d - "$OUT/store.tgz."; fi
}

if [ "${1:-}" = "--all" ]; then
  while [ "$(remaining)" -gt 0 ]; do segment "${SEGMENT_S:-480}"; pack; done
else
  segment "${1:-480}"
  pack
fi
echo "runs not yet complete: $(remaining)"
