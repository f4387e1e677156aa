#!/usr/bin/env bash
# The GPU machine's run for the CUDA trainer: build it, its tests and its benchmark there (the GPU machine has nvcc
# and gcc but no npm, so only these targets), run the tests against the CPU reference (both reference models, fp32
# and bf16 builds, decoding included) and the M²RNN kernel tests, the step benchmark of the ≈164M-parameter hybrid
# at T=1024 and T=4096, exact GPU resume, and short training runs on the default corpus (carried over as shards):
# the default MMAM hybrid and an RNN/GRU/attention hybrid.
# Logs go to $OUT. usage: OUT=dir bash scripts/gpu_trainer.sh [quick|profile]
set -uo pipefail
OUT=${OUT:-build/gpu_out}
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"
make -j16 train_m2rnn build/test_gpu_trainer build/test_gpu_trainer_fp32 build/bench_train_step build/test_m2rnn_gpu \
    > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
./build/test_gpu_trainer 2>&1 | tee "$OUT/test_gpu_trainer.log"
./build/test_gpu_trainer_fp32 2>&1 | tee "$OUT/test_gpu_trainer_fp32.log"
./build/test_m2rnn_gpu 2>&1 | tail -4 | tee "$OUT/test_m2rnn_gpu.log"
[ "${1:-}" = quick ] && exit 0
{
    echo "| GPU | model | parameters | B | T | step ms | fwd ms | bwd ms | update ms | tokens/s | MFU | GiB |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
    ./build/bench_train_step d768:MMMAMMMAMMMA 16 1024 10
    ./build/bench_train_step d768:MMMAMMMAMMMA 4 4096 10
} 2>&1 | tee "$OUT/bench_train_step.md"
# where the time goes: every kernel of one step (after one warm-up step) under Nsight Compute
if [ "${1:-}" = profile ]; then
    ncu --metrics gpu__time_duration.sum --launch-skip 0 --print-summary per-kernel --csv \
        ./build/bench_train_step d768:MMMAMMMAMMMA 16 1024 1 1 > "$OUT/ncu_step.csv" 2>&1 || tail -5 "$OUT/ncu_step.csv"
fi
bash scripts/gpu_resume.sh ./train_m2rnn "$OUT" # exact resume on the GPU (deterministic mode)
timeout 150 ./train_m2rnn -e d256:l4:MMAM -b 16 -t 256 -x 200 -l 2e-3 -u 30 -v 50 -m 10 -sg 100 -g 48 -o "$OUT/run" \
    2>&1 | tee "$OUT/train.log" | grep -v "^step .*/" ; tail -3 "$OUT/train.log"
timeout 150 ./train_m2rnn -e d256:RUAR -b 16 -t 256 -x 200 -l 2e-3 -u 30 -v 50 -m 10 -sg 200 -g 48 -o "$OUT/run_ru" \
    2>&1 | tee "$OUT/train_ru.log" | grep -v "^step .*/" ; tail -3 "$OUT/train_ru.log"
