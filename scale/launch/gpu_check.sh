#!/usr/bin/env bash
# Check one GPU for the scaling runs in under ten minutes (scale/gpu_check.py says what each section
# measures). Writes docs/gpu_check/gpu_check.json and gpu_check.md; d20_8gpu.sh reads the device batch
# sizes it finds there ("recommended_device_batch").
#
#   bash scale/launch/gpu_check.sh                  # one H100
#   bash scale/launch/gpu_check.sh --dry --out /tmp/check   # CPU, tiny sizes (no CUDA kernels)
#   bash scale/launch/gpu_check.sh --sections memory        # one section again
set -euo pipefail
cd "$(dirname "$0")/../.."
# The CUDA tests run in a subprocess that finds lrt_tasks (and the tasks' entry point) only when the
# project is installed: install it (offline, no dependencies) where it is not
PY=${PYTHON:-python3}  # the one that holds torch (a GPU image's plain python3)
"$PY" -c "import importlib.metadata as m, sys; sys.exit(not list(m.entry_points(group='lrt_lab.tasks')))" \
  || "$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null
exec "$PY" -m lrt_scale.gpu_check "$@"
