#!/usr/bin/env bash
# launch_multi_node.sh: data- and tensor-parallel training over several machines, one process per GPU (-tp T: T
# consecutive ranks split each layer; mpirun fills a machine's slots in rank order, so a group stays on one machine
# when T divides its slots). The hostfile lists each machine with its GPU count ("node1 slots=8"); every machine
# needs the same checkout (built with `make`), the data
# at the same path, passwordless ssh from this one, and a network NCCL can use. Put -o on a filesystem every machine
# sees: rank 0 writes the log and the checkpoints, and every rank reads the checkpoint it resumes from (-y).
# NCCL settings worth knowing (exported to every rank with -x):
#   NCCL_SOCKET_IFNAME   the interface for NCCL's bootstrap and socket transport (e.g. eth0, ib0)
#   NCCL_IB_HCA          the InfiniBand/RoCE adapters to use (e.g. mlx5_0,mlx5_1); NCCL_IB_DISABLE=1 forces sockets
#   NCCL_DEBUG=WARN      (or INFO) to see which transport each pair of ranks uses
#   NCCL_NVLS_ENABLE=0   NVLink multicast off (keep it off on shared machines)
# usage: bash scripts/launch_multi_node.sh HOSTFILE [train_m2rnn flags...]
#   e.g. bash scripts/launch_multi_node.sh hosts.txt -e d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84 -vs 100352 -b 8 -t 4096 \
#            -d 1048576 -o /shared/log_410m
set -euo pipefail
cd "$(dirname "$0")/.."
HOSTFILE=${1:?usage: scripts/launch_multi_node.sh HOSTFILE [flags...]}
shift
NP=$(awk '/slots=/ { sub(/.*slots=/, ""); n += $1 } END { print n }' "$HOSTFILE")
ROOT=(); [ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
ENVS=(-x NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} -x PATH)
for v in NCCL_SOCKET_IFNAME NCCL_IB_HCA NCCL_IB_DISABLE NCCL_DEBUG LD_LIBRARY_PATH; do
    [ -n "${!v:-}" ] && ENVS+=(-x "$v")
done
# ranks fill each machine's slots in order, so the node-local rank (the GPU a process takes) is 0 .. slots-1
exec mpirun "${ROOT[@]}" -np "$NP" --hostfile "$HOSTFILE" --map-by slot --bind-to none "${ENVS[@]}" ./train_m2rnn "$@"
