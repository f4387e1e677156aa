#!/usr/bin/env bash
# gpu_gdn.sh: Gated DeltaNet and Mamba-2 on the GPU in one call.
#   test     the chunked kernels against float64 recurrences (test_gdn_gpu, test_mamba2_gpu; bf16 and fp32 builds)
#   trainer  the whole-model trainer tests (test_gpu_trainer: GAGM and SAMS beside MMAM and RUAR; bf16 and fp32)
#   bench    the layer benchmarks (bench_gdn, bench_mamba2) and, where carried, the peers: fla's
#            chunk_gated_delta_rule (.peers/fla) and mamba_ssm's mamba_chunk_scan_combined (.peers/mamba_ssm)
#   step     whole 24-layer models, B=8 T=4096, vocabulary 100352 (bench_train_step): Hybrid GDN, Hybrid GDN +
#            M²RNN-1, Hybrid Mamba-2, and the 410M Hybrid M²RNN for reference
# usage: bash scripts/gpu_gdn.sh [test] [trainer] [bench] [step]   (results under $OUT or /tmp/gpu_gdn)
set -uo pipefail
cd "$(dirname "$0")/.."
OUTD=${OUT:-/tmp/gpu_gdn}
mkdir -p "$OUTD"
nvidia-smi -L
ARGS="${*:-test trainer}"
want() { [[ " $ARGS " == *" $1 "* ]]; }
targets=""
want test && targets="$targets build/test_gdn_gpu build/test_gdn_gpu_fp32 build/test_mamba2_gpu build/test_mamba2_gpu_fp32"
want trainer && targets="$targets build/test_gpu_trainer build/test_gpu_trainer_fp32"
want bench && targets="$targets build/bench_gdn build/bench_mamba2"
want step && targets="$targets build/bench_train_step"
make -j16 $targets > "$OUTD/build.log" 2>&1 || { tail -30 "$OUTD/build.log"; exit 1; }
summary() { grep -v "^PASS" "$1" | tail -8; }
if want test; then
    for t in test_gdn_gpu test_gdn_gpu_fp32 test_mamba2_gpu test_mamba2_gpu_fp32; do
        ./build/$t > "$OUTD/$t.txt" 2>&1; summary "$OUTD/$t.txt"
    done
fi
if want trainer; then
    for t in test_gpu_trainer test_gpu_trainer_fp32; do ./build/$t > "$OUTD/$t.txt" 2>&1; summary "$OUTD/$t.txt"; done
fi
if want bench; then
    ./build/bench_gdn | tee "$OUTD/bench_gdn.txt"
    ./build/bench_mamba2 | tee "$OUTD/bench_mamba2.txt" | tail -9
    if [ -d .peers/fla ]; then
        # one process a shape: fla autotunes each shape afresh (minutes on a new machine), so one slow shape
        # cannot hide the other's row
        for shape in "2 256 512" "16 128 128"; do
            PYTHONPATH=.peers/fla timeout 300 python3 -u dev/bench/gdn_fla.py $shape 2>&1 | tee -a "$OUTD/gdn_fla.txt" | tail -1
        done
    fi
    if [ -d .peers/mamba_ssm ]; then
        timeout 200 python3 dev/bench/mamba2_torch.py 2>&1 | tee "$OUTD/mamba2_torch.txt" | tail -6
    fi
fi
if want step; then
    for m in d1024:GGGGAGGGGGGGAGGGGGGGAGGG d1024:MGGGAGGGGGGGAGGGGGGGAGGG:n84 d1024:SSSSASSSSSSSASSSSSSSASSS \
             d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84; do
        echo "== $m"
        ./build/bench_train_step $m 8 4096 5 2 100352 2>&1 | tee -a "$OUTD/step.txt" | tail -4
    done
fi
exit 0
