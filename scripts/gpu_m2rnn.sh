#!/usr/bin/env bash
# The one script sent to the GPU machine for the M²RNN kernels: build, GPU numerics test, our benchmark, the
# same-inputs comparison with the authors' Triton kernel against float64, and the authors' benchmark in the same run.
#   bash scripts/gpu_m2rnn.sh [stages...]     stages: build test bench sass profile compare authors (default: all but sass, profile)
# Logs go to $OUT (set by the device tool) or ./out_gpu_m2rnn. The authors' package is read from .peers/ (a trimmed,
# git-ignored copy of open-lm-engine/accelerated-model-architectures' xma package); without it their stages are skipped.
set -u -o pipefail
OUT=${OUT:-out_gpu_m2rnn}
mkdir -p "$OUT"
stages=${*:-build test bench compare authors}
has() { [[ " $stages " == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/.peers${PYTHONPATH:+:$PYTHONPATH}"

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
if has build; then
    nvcc --version | tail -n 1
    make -j8 build/test_m2rnn_gpu build/bench_m2rnn 2>&1 | tee "$OUT/build.log" || { echo "BUILD FAILED"; exit 1; }
fi
if has test; then
    timeout 240 ./build/test_m2rnn_gpu 2>&1 | tee "$OUT/test.log"
fi
if has bench; then
    timeout 120 ./build/bench_m2rnn 2>&1 | tee "$OUT/bench_ours.log"
    timeout 30 ./build/bench_m2rnn -u 1 2>&1 | tee -a "$OUT/bench_ours.log" # tanh rate per SM clock (the floors' unit)
fi
if has sass; then # machine code of the K=64, V=16, 2-heads-per-CTA recurrence kernels
    cuobjdump -sass build/bench_m2rnn | awk '/Function : .*m2rnn_(forward|backward)_kernelILi16ELi2/{p=1} /Function : /&&!/ILi16ELi2/{p=0} p' \
        > "$OUT/m2rnn_k64v16.sass" 2>&1
    grep -cE "^\s+/\*[0-9a-f]{4}\*/" "$OUT/m2rnn_k64v16.sass"
    # opcode histogram (both kernels, all loops): where a step's instructions go
    grep -E "^\s+/\*[0-9a-f]{4}\*/" "$OUT/m2rnn_k64v16.sass" | sed -E 's/^\s+\/\*[0-9a-f]{4}\*\/\s+//; s/^@!?U?P[0-9T] //' \
        | awk '{split($1, a, "."); n[a[1]]++} END {for (o in n) printf "%s %d\n", o, n[o]}' | sort -k2 -nr | head -25
fi
if has profile; then # stall reasons of the two recurrence kernels at the paper's B=8, N=84 shape
    for kern in forward backward; do
        timeout 120 ncu --clock-control none --kernel-name "regex:m2rnn_${kern}_kernel" --launch-count 1 \
            --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
            --section ComputeWorkloadAnalysis --section InstructionStats \
            ./build/bench_m2rnn -b 8 -n 84 -r 1 > "$OUT/ncu_${kern}.txt" 2>&1
        grep -E "Warp Cycles Per Issued|Issue Slots Busy|Issued Ipc|No Eligible|Achieved Occupancy|Stall|Registers Per|Block Limit" \
            "$OUT/ncu_${kern}.txt" | head -20
    done
fi
if [ -d .peers/xma ]; then
    if has compare; then
        timeout 60 ./build/bench_m2rnn -d /tmp/m2rnn_cmp -b 2 -t 4096 -n 8 2>&1 | tee "$OUT/compare.log"
        timeout 180 python3 dev/bench/m2rnn_authors.py compare /tmp/m2rnn_cmp 2>&1 | tee -a "$OUT/compare.log"
    fi
    if has authors; then
        timeout 300 python3 dev/bench/m2rnn_authors.py bench 2>&1 | tee "$OUT/bench_authors.log"
    fi
else
    echo "SKIP authors' kernel: .peers/xma not present (copy the xma package there, see dev/bench/m2rnn_authors.py)"
fi
echo "=== summary"
grep -hE "^(PASS|FAIL|SKIP)|test_m2rnn_gpu:|^ours|^rate|^authors|VERDICT" "$OUT"/test.log "$OUT"/bench_ours.log \
    "$OUT"/compare.log "$OUT"/bench_authors.log 2>/dev/null
