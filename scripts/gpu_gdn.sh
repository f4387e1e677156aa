#!/usr/bin/env bash
# gpu_gdn.sh: Gated DeltaNet on the GPU in one call: the chunked kernels against the float64 recurrence
# (test_gdn_gpu, bf16 and fp32), the whole-model trainer tests (test_gpu_trainer: GAGM beside MMAM and RUAR), and,
# with `bench`, the layer benchmark beside fla (dev/bench/bench_gdn.cu, dev/bench/gdn_fla.py; carry .peers/fla).
# usage: bash scripts/gpu_gdn.sh [test] [trainer] [bench]   (results under $OUT or /tmp/gpu_gdn)
set -uo pipefail
cd "$(dirname "$0")/.."
OUTD=${OUT:-/tmp/gpu_gdn}
mkdir -p "$OUTD"
nvidia-smi -L
want() { [[ " $* " == *" all "* ]] || [[ " $ARGS " == *" $1 "* ]]; }
ARGS="${*:-test trainer}"
targets="build/test_gdn_gpu build/test_gdn_gpu_fp32"
want trainer && targets="$targets build/test_gpu_trainer build/test_gpu_trainer_fp32"
want bench && targets="$targets build/bench_gdn"
make -j16 $targets > "$OUTD/build.log" 2>&1 || { tail -30 "$OUTD/build.log"; exit 1; }
if want test; then
    ./build/test_gdn_gpu | tee "$OUTD/test_gdn_gpu.txt"
    ./build/test_gdn_gpu_fp32 | tee "$OUTD/test_gdn_gpu_fp32.txt"
fi
if want trainer; then
    ./build/test_gpu_trainer 2>&1 | tee "$OUTD/test_gpu_trainer.txt" | grep -v "^PASS"
    ./build/test_gpu_trainer_fp32 2>&1 | tee "$OUTD/test_gpu_trainer_fp32.txt" | grep -v "^PASS"
fi
if want bench; then
    ./build/bench_gdn | tee "$OUTD/bench_gdn.txt"
    [ -d .peers/fla ] && PYTHONPATH=.peers/fla python3 dev/bench/gdn_fla.py 2>&1 | tee "$OUTD/gdn_fla.txt"
fi
exit 0
