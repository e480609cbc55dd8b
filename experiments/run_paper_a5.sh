#!/usr/bin/env bash
# The paper-size A5 run (experiments/a5_paper.toml) on one GPU, in resumable segments of bounded
# wall time: for a machine that limits how long one command may run.
#
#   experiments/run_paper_a5.sh [SECONDS] [--pack DIR]   one segment: train until SECONDS (default
#                                                        480) have passed, checkpoint, exit
#   experiments/run_paper_a5.sh --all [--pack DIR]       segments until every run is complete
#
# Each invocation skips the finished runs and resumes the run in progress from its checkpoint
# (`lrt-lab sweep --time-limit`, which exits 3 while runs are left: lrt_lab.training.exitcodes), so the
# same command is repeated until it prints "runs not yet complete: 0". Choose SECONDS as the machine's limit per command less about two minutes for
# start-up and the evaluation that ends a run: 480 for a 10-minute limit.
#
# Machines that do not keep their disk from one command to the next: --pack DIR (or PACK_DIR=DIR)
# names a folder the machine copies back. Each segment then packs the store into DIR/store.tgz.00,
# .01, ... (15 MB parts, for transfers that limit a file's size; the checkpoints of finished runs
# dropped, only the newest of the run in progress kept), and an invocation that finds no store
# but finds parts in DIR unpacks them first, so a folder copied back and forth needs nothing else.
# Otherwise restore the store before the next command, from the repository root:
#   cat DIR/store.tgz.* | tar -xz                 # restores runs/a5_paper
# and bring runs/a5_paper along with the working tree. Finished runs go to the committed store with
#   rsync -a --exclude checkpoints runs/a5_paper/ experiments/results/
#
# Environment: SPEC (default experiments/a5_paper.toml), STORE (default: the spec's out,
# runs/a5_paper; relative to the repository root), DEVICE (default cuda), PYTHON (default python3),
# PACK_DIR (default: none, the store stays where it is), SEGMENT_S (--all's segments, default 480).
set -euo pipefail

usage() { sed -n '5,7p' "$0" | sed 's/^#//' >&2; exit 2; }

MODE=one SECONDS_LIMIT=480 PACK_DIR=${PACK_DIR:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --all) MODE=all ;;
    --pack) [ $# -ge 2 ] || usage; PACK_DIR=$2; shift ;;
    --pack=*) PACK_DIR=${1#--pack=} ;;
    ''|*[!0-9]*) usage ;;  # anything but a whole number of seconds
    *) SECONDS_LIMIT=$1 ;;
  esac
  shift
done
# The pack folder is resolved before the cd below, so a relative DIR means the caller's folder
if [ -n "$PACK_DIR" ]; then mkdir -p "$PACK_DIR" && PACK_DIR=$(cd "$PACK_DIR" && pwd); fi

cd "$(dirname "$0")/.."
SPEC=${SPEC:-experiments/a5_paper.toml}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
SPEC_OUT="import sys, tomllib; print(tomllib.load(open(sys.argv[1], 'rb'))['sweep']['out'])"
STORE=${STORE:-$("$PY" -c "$SPEC_OUT" "$SPEC")}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# lrt_lab finds the tasks through the package's entry point: install it (offline, no deps) if absent
"$PY" -c "import importlib.metadata as m, sys; sys.exit(not list(m.entry_points(group='lrt_lab.tasks')))" \
  || "$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null

segment() {  # one bounded segment of the sweep; its exit status: 0 all complete, 3 runs left, 4 all
  # finished and some diverged (lrt_lab.training.exitcodes); the caller decides what 3 and 4 mean to it
  "$PY" -m lrt_lab sweep "$SPEC" --out "$STORE" --device "$DEVICE" --time-limit "$1"
}

remaining() {  # how many runs of the spec are not finished (todo, partial, claimed)
  "$PY" -m lrt_lab sweep "$SPEC" --out "$STORE" --device "$DEVICE" --dry-run \
    | grep -cvE '^(complete|diverged) ' || true
}

unpack() {  # a fresh machine: continue from the store the last segment packed, if it came along
  if [ -n "$PACK_DIR" ] && [ ! -d "$STORE" ] && compgen -G "$PACK_DIR/store.tgz.*" >/dev/null; then
    echo "restoring $STORE from $PACK_DIR/store.tgz.*"
    cat "$PACK_DIR"/store.tgz.* | tar -xz
  fi
}

pack() {  # prune checkpoints, then leave the store in the folder that is copied back
  for run in "$STORE"/*/; do
    if [ -f "$run/summary.json" ]; then rm -rf "$run/checkpoints"
    elif [ -d "$run/checkpoints" ]; then  # keep the newest checkpoint only
      ls -1 "$run"/checkpoints/step_*.pt 2>/dev/null | head -n -1 | xargs -r rm -f
    fi
  done
  [ -n "$PACK_DIR" ] || return 0
  # Written aside, then renamed: a command stopped while tar runs leaves the previous parts whole, and a
  # smaller archive leaves no stale part behind to corrupt the next `cat store.tgz.*`.
  local partial="$PACK_DIR/.partial"
  rm -rf "$partial" && mkdir "$partial"
  tar -cz "$STORE" | split -b 15000000 -d - "$partial/store.tgz."
  rm -f "$PACK_DIR"/store.tgz.*
  mv "$partial"/store.tgz.* "$PACK_DIR"/ && rmdir "$partial"
}

unpack
status=0
if [ "$MODE" = all ]; then
  while :; do
    status=0; segment "${SEGMENT_S:-480}" || status=$?
    pack
    [ "$status" -eq 3 ] || break  # 3: runs left, the next segment continues them
  done
else
  segment "$SECONDS_LIMIT" || status=$?
  pack
fi
case "$status" in 0|3|4) ;; *) exit "$status" ;; esac  # a segment that stopped early is expected
echo "runs not yet complete: $(remaining)"
