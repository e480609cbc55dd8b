#!/usr/bin/env bash
# Check one GPU for the scaling runs in eight minutes (scale/gpu_check.py says what each section
# measures). Every section runs as its own process under `timeout` (its budget, start-up included)
# with TORCH_LOGS=recompiles,graph_breaks, writing <out>/sections/<name>.json as it measures and
# its log to <out>/logs/<name>.log; a section killed at its budget keeps what it wrote, and the next
# starts fresh. Then the report: <out>/gpu_check.json and gpu_check.md (default docs/gpu_check/);
# d20_8gpu.sh reads the device batch sizes it finds there ("recommended_device_batch").
#
#   bash scale/launch/gpu_check.sh                                  # one H100 / H200
#   bash scale/launch/gpu_check.sh --dry-run --out /tmp/check       # CPU, toy sizes, every section
#   bash scale/launch/gpu_check.sh --sections d12_compiled,decode   # some sections again
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=docs/gpu_check
MODE=()
ONLY=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run|--dry) MODE=(--dry-run); shift ;;
    --out) OUT=$2; shift 2 ;;
    --sections) ONLY=(--sections "$2"); shift 2 ;;
    *) echo "error: $1 is invalid; allowed: --dry-run, --out DIR, --sections A,B" >&2; exit 2 ;;
  esac
done
# The CUDA tests run in a subprocess that finds lrt_tasks (and the tasks' entry point) only when the
# project is installed: install it (offline, no dependencies) where it is not
PY=${PYTHON:-python3}  # the one that holds torch (a GPU image's plain python3)
"$PY" -c "import importlib.metadata as m, sys; sys.exit(not list(m.entry_points(group='lrt_lab.tasks')))" \
  || "$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null
export TORCH_LOGS=${TORCH_LOGS-recompiles,graph_breaks}
mkdir -p "$OUT/sections" "$OUT/logs"
PLAN=$("$PY" -m lrt_scale.gpu_check plan "${MODE[@]}" "${ONLY[@]}") || exit 2
START=$(date +%s)
while read -r NAME BUDGET; do
  echo "[gpu_check] $NAME (budget ${BUDGET} s, $(( $(date +%s) - START )) s so far)"
  T0=$(date +%s)
  timeout -k 10 "$BUDGET" "$PY" -m lrt_scale.gpu_check section "$NAME" --out "$OUT" "${MODE[@]}" \
    > "$OUT/logs/$NAME.log" 2>&1
  RC=$?
  WALL=$(( $(date +%s) - T0 ))
  echo "{\"returncode\": $RC, \"wall_s\": $WALL, \"budget_s\": $BUDGET}" > "$OUT/sections/$NAME.rc.json"
  case $RC in
    0) echo "[gpu_check] $NAME ok (${WALL} s)" ;;
    124|137) echo "[gpu_check] $NAME ran out of its ${BUDGET} s: kept what it measured" ;;
    *) echo "[gpu_check] $NAME not ok (exit $RC; $OUT/logs/$NAME.log)" ;;
  esac
done <<< "$PLAN"
"$PY" -m lrt_scale.gpu_check report --out "$OUT" "${MODE[@]}"
echo "[gpu_check] $(( $(date +%s) - START )) s in all"
