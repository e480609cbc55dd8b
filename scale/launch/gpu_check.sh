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
exec python -m lrt_scale.gpu_check "$@"
