#!/usr/bin/env bash
# One (task, variant, seed) run of the DASP table on SmolLM2-135M-Instruct as a decoder-only
# prefix model: `gencraft reproduce prefix-tasks` restricted to one variant, so a 2-core
# machine runs two variants at once (one thread each). Runs live in outputs/prefix-TASK/VARIANT
# (VARIANT-seedN), shared with the full-table command, which reuses them:
#   bash benchmarks/prefix_data2text.sh TASK VARIANT     (TASK: e2e dart xsum)
#   gencraft reproduce prefix-tasks --task e2e --output outputs/reproduce/prefix-e2e
#   VARIANT: finetune dense peft uniblock hierblock htruncsa hsoftsa hierblock-softsa
# Settings (env): STEPS (120), BATCH (8), LIMIT (80 test inputs; none: the whole split),
# SPREAD (1: the N test inputs evenly spaced over the split, not its first N), BEAMS (5), P (none: 5 E2E, 10 DART, 100 XSum), SEED (0), SOURCE (256 source tokens),
# DATA (../shared/data). Prefixes train at 5e-3, full fine-tuning at 5e-5.
set -euo pipefail
task=$1; variant=$2
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1} HF_HUB_OFFLINE=1
.venv/bin/gencraft reproduce prefix-tasks --scale cpu \
  --output "outputs/reproduce/prefix-$task-$variant-seed${SEED:-0}-${SPREAD:+spread}${LIMIT:-80}" \
  --task "$task" --variants "$variant" --seeds "${SEED:-0}" --steps "${STEPS:-120}" \
  --batch-size "${BATCH:-8}" --test-limit "${LIMIT:-80}" --num-beams "${BEAMS:-5}" \
  --num-virtual-tokens "${P:-none}" --max-source-tokens "${SOURCE:-256}" \
  --data-dir "${DATA:-../shared/data}" $([ -n "${SPREAD:-}" ] && echo --test-spread)
