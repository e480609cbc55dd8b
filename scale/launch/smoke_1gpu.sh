#!/usr/bin/env bash
# Single-GPU smoke run: d12 LRT (Interleaved(2)) and the d12 baseline for a few hundred steps each,
# torch.compile on, bf16 autocast; then throughput, MFU and the LRT / baseline step-time ratio.
#
#   bash scale/launch/smoke_1gpu.sh                     # synthetic data (no download needed)
#   DATA_DIR=~/.cache/lrt_lab/fineweb TOKENIZER_DIR=~/.cache/lrt_lab/tokenizer bash scale/launch/smoke_1gpu.sh
#
# Prints: the accounting (params, steps, FLOPs per token with every stage counted, the one-pass
# undercount, baseline-equivalent tokens), one line every 20 steps (loss, lr multiplier, step time,
# tokens/s, MFU against H100 dense bf16), the final validation BPB, and at the end a table of
# tokens/s, MFU and step time per run plus the interleaved / baseline step-time ratio.
# Runs land in $OUT (default runs/smoke): runs/smoke/d12-lrt-interleaved_2-steps$STEPS-s0 and
# runs/smoke/d12-transformer-steps$STEPS-s0 (config.json, metrics.jsonl, summary.json, checkpoints/),
# readable by the dashboard (lrt-lab app, or lrt_lab.store.results.load_runs) and by
# `python -m lrt_scale.evaluate --run-dir <folder> ...`.
set -euo pipefail
cd "$(dirname "$0")/../.."

STEPS=${STEPS:-300}
OUT=${OUT:-runs/smoke}
# d12 at 2048 tokens: 16 rows per micro step, 2^19 tokens per optimizer step (16 accumulation steps).
DEVICE_BATCH=${DEVICE_BATCH:-16}
PEAK=${PEAK_FLOPS:-989e12}   # H100 SXM dense bf16; set 1979e12/2 etc. for other parts

if [[ -n "${DATA_DIR:-}" ]]; then
  DATA=(--data-dir "$DATA_DIR" --tokenizer-dir "${TOKENIZER_DIR:?set TOKENIZER_DIR with DATA_DIR}")
else
  DATA=(--synthetic)
fi
COMMON=(--preset d12 --steps "$STEPS" --device-batch-size "$DEVICE_BATCH" --compile --out "$OUT"
        --eval-every 100 --eval-tokens 1048576 --checkpoint-every 0 --log-every 20 --peak-flops "$PEAK")
EXTRA=("$@")   # anything else is passed to both runs, e.g. --resume

python -m lrt_scale.train "${COMMON[@]}" "${DATA[@]}" --model lrt --schedule interleaved:2 "${EXTRA[@]}"
python -m lrt_scale.train "${COMMON[@]}" "${DATA[@]}" --model transformer "${EXTRA[@]}"

python - "$OUT" "$STEPS" <<'PY'
import json, sys
from pathlib import Path
out, steps = Path(sys.argv[1]), sys.argv[2]
runs = {"lrt interleaved:2": out / f"d12-lrt-interleaved_2-steps{steps}-s0",
        "transformer": out / f"d12-transformer-steps{steps}-s0"}
s = {k: json.loads((p / "summary.json").read_text()) for k, p in runs.items()}
print(f"{'run':<20} {'tokens/s':>12} {'MFU':>7} {'step ms':>9} {'val_bpb':>8}")
for k, v in s.items():
    print(f"{k:<20} {v['tokens_per_s']:>12,.0f} {100 * v['mfu']:>6.2f}% {1000 * v['step_time_s']:>9.1f} "
          f"{v['eval'].get('val_bpb', float('nan')):>8.4f}")
ratio = s["lrt interleaved:2"]["step_time_s"] / s["transformer"]["step_time_s"]
print(f"interleaved/baseline step-time ratio: {ratio:.3f} (ideal token-compute ratio ~2; paper, 8xH100 20L: 2.96)")
PY
