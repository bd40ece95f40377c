#!/usr/bin/env bash
# The main job: a small three-modality (vision + audio + text) pretrain on CPU with 2 gloo
# ranks, on the embedded default workload (omni-three-modality, token counts scaled by 1/32).
# Every OrchWeave feature that has landed is switched on here: batch post-balancing of every
# phase across the DP ranks, and (once PP > 1) the dynamic interleaved pipeline. Extra
# arguments are appended, and later flags override earlier ones, e.g.:
#   scripts/pretrain_mllm_cpu.sh --pipeline-model-parallel-size 2 --train-iters 10
#   scripts/pretrain_mllm_cpu.sh --post-balance none --pipeline-schedule megatron   # baseline
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
nproc="${NPROC:-2}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$python" -m torch.distributed.run --nproc-per-node "$nproc" --master-port "${MASTER_PORT:-29500}" \
  "$root/scripts/pretrain_mllm.py" \
  --distributed-backend gloo \
  --transformer-impl local \
  --tensor-model-parallel-size 1 \
  --pipeline-model-parallel-size 1 \
  --num-layers 4 \
  --hidden-size 64 \
  --num-attention-heads 4 \
  --seq-length 256 \
  --max-position-embeddings 256 \
  --vocab-size 512 \
  --vision-num-layers 2 \
  --vision-patch-size 4 \
  --audio-num-layers 2 \
  --audio-feature-dim 32 \
  --workload omni-three-modality \
  --workload-token-scale 0.03125 \
  --micro-batch-size 2 \
  --global-batch-size 16 \
  --train-iters 30 \
  --lr 4e-3 \
  --min-lr 4e-4 \
  --lr-warmup-iters 3 \
  --lr-decay-style cosine \
  --weight-decay 0.01 \
  --clip-grad 1.0 \
  --hidden-dropout 0 \
  --attention-dropout 0 \
  --seed 1234 \
  --log-interval 5 \
  --post-balance auto \
  --pipeline-schedule dynamic \
  "$@"
