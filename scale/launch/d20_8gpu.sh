#!/usr/bin/env bash
# The paper's 20L comparison on one 8xH100 node: LRT-shared (Interleaved(2)) at R = 10 and the
# baseline at R = 20, i.e. the same baseline-equivalent compute (paper sec. 4.2, app. B).
#
#   DATA_DIR=~/.cache/lrt_lab/fineweb TOKENIZER_DIR=~/.cache/lrt_lab/tokenizer bash scale/launch/d20_8gpu.sh
#   RATIO=20 bash scale/launch/d20_8gpu.sh          # LRT at R=20, baseline at R=40
#   WHICH=baseline bash scale/launch/d20_8gpu.sh    # only one of the two (lrt | baseline | both)
#   bash scale/launch/d20_8gpu.sh --resume          # continue both from their newest checkpoints
#
# Needs the shards and a tokenizer trained on them (scale.tokenizer). The baseline at R=20 on 1.3B
# parameters reads 26.3B tokens, about 510 shards at ~52M tokens each (nanochat's estimate: 250M
# characters per shard, 4.8 characters per token), so: python -m scale.data download --shards 520
# --dir $DATA_DIR. With fewer shards the loader cycles and the runs repeat data.
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

# Interleaved(2) keeps the activations of two token-forwards: 16 rows of 2048 per GPU (4 accumulation
# steps on 8 GPUs) instead of the baseline's 32 (2 steps). Lower DEVICE_BATCH_* if a GPU runs out of memory.
if [[ "$WHICH" == lrt || "$WHICH" == both ]]; then
  torchrun --standalone --nproc_per_node="$NPROC" -m scale.train "${COMMON[@]}" \
      --model lrt --schedule interleaved:2 --ratio "$RATIO" --device-batch-size "${DEVICE_BATCH_LRT:-16}" "${EXTRA[@]}"
fi
if [[ "$WHICH" == baseline || "$WHICH" == both ]]; then
  torchrun --standalone --nproc_per_node="$NPROC" -m scale.train "${COMMON[@]}" \
      --model transformer --ratio "$BASE_RATIO" --device-batch-size "${DEVICE_BATCH_BASE:-32}" "${EXTRA[@]}"
fi
