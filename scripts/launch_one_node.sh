#!/usr/bin/env bash
# launch_one_node.sh: data- and tensor-parallel training on the GPUs of one machine, one process per GPU (mpirun +
# NCCL). Each process takes the GPU of its node-local rank (M2RNN_DEVICE overrides); -tp T makes groups of T
# consecutive GPUs split each layer (keep a group on one machine: its all-reduces run every layer), the GPUs / T
# groups are data-parallel replicas; -b is per replica, so the global batch is -b × GPUs / T × -t tokens a micro-step
# (-d a multiple of it for gradient accumulation). Rank 0 prints and writes -o.
# usage: bash scripts/launch_one_node.sh [GPUS] [train_m2rnn flags...]
#   e.g. bash scripts/launch_one_node.sh 8 -e d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84 -vs 100352 -b 8 -t 4096 -o log_410m
#        bash scripts/launch_one_node.sh 8 -tp 2 -e d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84:q2:gn ...   (TP=2 x DP=4,
#        M²RNN topology-aware; n84 alone is topology-independent)
set -euo pipefail
cd "$(dirname "$0")/.."
GPUS=${1:-$(nvidia-smi -L | wc -l)}
shift || true
ROOT=(); [ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
# NVLink multicast (NVLS) stays off on shared machines; --bind-to none lets each process use the cores it needs
exec mpirun "${ROOT[@]}" -np "$GPUS" --bind-to none -x NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} \
    ./train_m2rnn "$@"
