#!/usr/bin/env bash
# The step time of two builds of the CUDA trainer in one GPU call: this tree and another checkout BASE (e.g. made by
# `git worktree add BASE <commit>` or `git archive <commit> | tar -x -C BASE`), each model timed base, new, base, new
# so that clock and thermal drift hit both alike. Prints the rows of dev/bench/bench_train_step.cu's table, each
# tagged with the build, then the ratio of the medians new / base per model.
# usage: bash scripts/gpu_step_compare.sh BASE_DIR   (models: the d768 hybrid at T=1024 and the 410M Hybrid M²RNN, or
#        STEP_MODELS="DESC B T steps warmup vocab;..." for others)
set -uo pipefail
BASE=${1:?usage: scripts/gpu_step_compare.sh BASE_DIR}
( cd "$BASE" && make -j8 build/bench_train_step > /tmp/base_build.log 2>&1 ) &
make -j8 build/bench_train_step > /tmp/new_build.log 2>&1 || { tail -20 /tmp/new_build.log; exit 1; }
wait || true
[ -x "$BASE/build/bench_train_step" ] || { tail -20 /tmp/base_build.log; exit 1; }
MODELS=("d768:MMMAMMMAMMMA 16 1024 10 3 50257" "d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84 8 4096 10 3 100352")
if [ -n "${STEP_MODELS:-}" ]; then IFS=';' read -r -a MODELS <<< "$STEP_MODELS"; fi
echo "| build | GPU | model | parameters | B | T | step ms | fwd ms | bwd ms | update ms | tokens/s | MFU | GiB |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for m in "${MODELS[@]}"; do
    for round in 1 2; do
        for build in base new; do
            bin=./build/bench_train_step; [ $build = base ] && bin="$BASE/build/bench_train_step"
            row=$($bin $m 2>&1 | tail -1)
            echo "| $build $row" | tee -a /tmp/compare_rows.txt
        done
    done
done
# ratio of the two runs' mean step time per model (column 8 of a row is the step ms)
awk -F'|' '{gsub(/ /,"",$2); gsub(/ /,"",$4); ms[$4" "$2]+=$8; n[$4" "$2]++} END {for (k in ms) {split(k,a," ");
    if (a[2]=="new") printf("%s: new / base step time = %.4f\n", a[1], (ms[k]/n[k]) / (ms[a[1]" base"]/n[a[1]" base"]))}}' \
    /tmp/compare_rows.txt
