#!/usr/bin/env bash
# DASP variants on E2E, DART or XSum with SmolLM2-135M-Instruct as a decoder-only prefix model:
# the commands behind docs/results.md's DASP table. One thread per job; run two at a time on
# a 2-core machine. Each line trains (resumable) and then scores the test split.
#   bash benchmarks/prefix_data2text.sh TASK VARIANT [extra train flags]    (TASK: e2e dart xsum)
#   VARIANT: dense peft uniblock hierblock htruncsa hsoftsa hierblock-softsa finetune
# Settings (env): STEPS (120), BATCH (8), LIMIT (80 test inputs; "all" for the whole split),
# BEAMS (5), P (5 for e2e, 10 for dart, 100 for xsum), LR (5e-3 prefixes; use 5e-5 for
# finetune), SEED (0; runs with another seed go to VARIANT-seedN), DATA (../shared/data).
set -euo pipefail
task=$1; variant=$2; shift 2
case $task in dart) P=${P:-10} ;; xsum) P=${P:-100} ;; *) P=${P:-5} ;; esac
limit=${LIMIT:-80}
limit_flag=(--limit "$limit")
[ "$limit" = all ] && limit_flag=()
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1} HF_HUB_OFFLINE=1
case $variant in
  dense) flags=() ;;
  peft) flags=(--method peft) ;;
  uniblock) flags=(--encoder-segments 2 --blocked-layers all) ;;
  hierblock) flags=(--encoder-segments 2 --blocked-layers lower) ;;
  htruncsa) flags=(--normalizer truncsa --sparse-layers lower) ;;
  hsoftsa) flags=(--normalizer softsa --sparse-layers lower) ;;
  hierblock-softsa) flags=(--encoder-segments 2 --blocked-layers lower --normalizer softsa --sparse-layers lower) ;;
  finetune) flags=(--method finetune) ;;
  *) echo "unknown variant $variant" >&2; exit 2 ;;
esac
out=outputs/prefix-$task/$variant
[ "${SEED:-0}" = 0 ] || out=$out-seed$SEED
.venv/bin/gencraft prefix train --task "$task" --model smollm2-135m --num-virtual-tokens "$P" \
  --init tokens --lr "${LR:-5e-3}" --batch-size "${BATCH:-8}" --max-steps "${STEPS:-120}" --valid-examples 64 \
  --seed "${SEED:-0}" --output "$out" --quiet --data-dir "${DATA:-../shared/data}" "${flags[@]}" "$@"
.venv/bin/gencraft prefix eval "$out/best" --split test "${limit_flag[@]}" \
  --num-beams "${BEAMS:-5}" --output "$out/test-$limit.json" --quiet --json \
  --data-dir "${DATA:-../shared/data}"
