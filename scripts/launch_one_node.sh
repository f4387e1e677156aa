#!/usr/bin/env bash
# launch_one_node.sh: data-parallel training on the GPUs of one machine, one process per GPU (mpirun + NCCL).
# Each process takes the GPU of its node-local rank (M2RNN_DEVICE overrides); -b is per GPU, so the global batch is
# -b × GPUs × -t tokens a micro-step (-d a multiple of it for gradient accumulation). Rank 0 prints and writes -o.
# usage: bash scripts/launch_one_node.sh [GPUS] [train_m2rnn flags...]
#   e.g. bash scripts/launch_one_node.sh 8 -e d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84 -vs 100352 -b 8 -t 4096 -o log_410m
set -euo pipefail
cd "$(dirname "$0")/.."
GPUS=${1:-$(nvidia-smi -L | wc -l)}
shift || true
ROOT=(); [ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
# NVLink multicast (NVLS) stays off on shared machines; --bind-to none lets each process use the cores it needs
exec mpirun "${ROOT[@]}" -np "$GPUS" --bind-to none -x NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} \
    ./train_m2rnn "$@"
