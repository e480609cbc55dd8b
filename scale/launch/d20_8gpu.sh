#!/usr/bin/env bash
# The paper's 20L comparison on one 8xH100 node: LRT-shared (Interleaved(2)) at R = 10 and the
# baseline at R = 20, i.e. the same baseline-equivalent compute (paper sec. 4.2, app. B).
#
#   DATA_DIR=~/.cache/lrt_lab/fineweb TOKENIZER_DIR=~/.cache/lrt_lab/tokenizer bash scale/launch/d20_8gpu.sh
#   RATIO=20 bash scale/launch/d20_8gpu.sh          # LRT at R=20, baseline at R=40
#   WHICH=baseline bash scale/launch/d20_8gpu.sh    # only one of the two (lrt | baseline | both)
#   bash scale/launch/d20_8gpu.sh --resume          # continue both from their newest checkpoints
#
# Needs the shards and a tokenizer trained on them (lrt_scale.tokenizer). The baseline at R=20 on 1.3B
# parameters trains on 26.3B tokens; best-fit packing crops ~35% of what it reads at T=2048, so it
# reads ~40.5B tokens, about 780 shards at ~52M tokens each (nanochat's estimate: 250M characters per
# shard, 4.8 characters per token): python -m lrt_scale.data download --shards 780 --dir $DATA_DIR (the
# dry run prints this figure). With fewer shards the loader starts another epoch (logged as data_epoch).
# Device batch sizes: from the GPU check's report (bash scale/launch/gpu_check.sh on one of the GPUs
# first), else 8 (LRT) and 16 (baseline), an estimate from measured activations (2.85 GiB per row of
# 2048 for the baseline, 6.90 GiB for the LRT, eager bf16) next to ~25 GB of weights, gradients and
# optimizer state per GPU; DEVICE_BATCH_LRT / DEVICE_BATCH_BASE override both.
# Each run prints the accounting first (steps = ceil(R x 1,315,969,320 / 2^19): 25,101 steps for LRT at
# R=10 and 50,201 for the baseline at R=20; FLOPs per token with every stage counted), then one line
# every 10 steps (loss, lr multiplier, step ms, tokens/s over the node, MFU against 8 x 989 TFLOP/s),
# validation BPB (merged and per stage) every 250 steps, and CORE at the end if CORE_BUNDLE is set.
# Runs land in $OUT (default runs/d20): runs/d20/d20-lrt-interleaved_2-R10-s0 and
# runs/d20/d20-transformer-R20-s0, with a checkpoint every 1000 steps (resume with --resume).
set -euo pipefail
cd "$(dirname "$0")/../.."

: "${DATA_DIR:?set DATA_DIR to the parquet shards}"
: "${TOKENIZER_DIR:?set TOKENIZER_DIR to the saved tokenizer}"
RATIO=${RATIO:-10}
NPROC=${NPROC:-8}
OUT=${OUT:-runs/d20}
WHICH=${WHICH:-both}
BASE_RATIO=$(python -c "print(f'{2 * float(\"$RATIO\"):g}')")

COMMON=(--preset d20 --total-batch-size 524288 --compile --out "$OUT" --data-dir "$DATA_DIR"
        --tokenizer-dir "$TOKENIZER_DIR" --eval-every 250 --checkpoint-every 1000
        --seq-eval-rows 64 --seq-prompt 1024 --seq-prefill interleaved:2)
[[ -n "${CORE_BUNDLE:-}" ]] && COMMON+=(--core-bundle "$CORE_BUNDLE" --core-max-per-task -1)
EXTRA=("$@")

# 2^19 tokens per step = 32 rows of 2048 per GPU on 8 GPUs: a device batch of B rows takes 32 / B
# accumulation steps (B must divide 32). After an out-of-memory error, resume with a smaller one:
# DEVICE_BATCH_LRT=4 bash scale/launch/d20_8gpu.sh --resume (the global batch does not change).
GPU_CHECK_JSON=${GPU_CHECK_JSON:-docs/gpu_check/gpu_check.json}
checked_batch() {  # the largest device batch the GPU check found for $1 (lrt | transformer), or $2
  python - "$GPU_CHECK_JSON" "$1" "$2" <<'PY'
import json, sys
path, kind, default = sys.argv[1:]
try:
    b = (json.load(open(path)).get("recommended_device_batch") or {}).get(kind)
except FileNotFoundError:
    b = None
print(b if b and not json.load(open(path))["dry"] else default)
PY
}
DEVICE_BATCH_LRT=${DEVICE_BATCH_LRT:-$(checked_batch lrt 8)}
DEVICE_BATCH_BASE=${DEVICE_BATCH_BASE:-$(checked_batch transformer 16)}
echo "device batch: LRT $DEVICE_BATCH_LRT, baseline $DEVICE_BATCH_BASE (from ${GPU_CHECK_JSON} if it exists)"
if [[ "$WHICH" == lrt || "$WHICH" == both ]]; then
  torchrun --standalone --nproc_per_node="$NPROC" -m lrt_scale.train "${COMMON[@]}" \
      --model lrt --schedule interleaved:2 --ratio "$RATIO" --device-batch-size "$DEVICE_BATCH_LRT" "${EXTRA[@]}"
fi
if [[ "$WHICH" == baseline || "$WHICH" == both ]]; then
  torchrun --standalone --nproc_per_node="$NPROC" -m lrt_scale.train "${COMMON[@]}" \
      --model transformer --ratio "$BASE_RATIO" --device-batch-size "$DEVICE_BATCH_BASE" "${EXTRA[@]}"
fi
