#!/usr/bin/env bash
# test_gpu_nccl.sh: the CUDA trainer's data parallelism over NCCL (lm.cuh: ZeRO-1, the gradient reduce-scatter
# overlapped with the backward). On one GPU: the NCCL path with one rank (M2RNN_NCCL=1) must be the plain trainer bit
# for bit (the same losses in main.log, the same weights and AdamW moments in the checkpoint), with and without the
# overlap, and across a resume (the moments scattered to and gathered from the pieces). With two GPUs and mpirun:
# two ranks of B rows against one GPU of 2B rows track each other within the CPU tests' tolerance (1e-5) in the fp32
# build, where the only difference is the order of fp32 sums; the bf16 build is reported with its measured gap (a
# last-bit change of an fp32 master weight can move its bf16 copy by one bf16 step, 2^-8 relative); a DP=2
# checkpoint resumes on one GPU and gives the DP=2 run's step 20 within the same tolerance. The one-GPU comparisons
# run with M2RNN_DETERMINISTIC=1 (the M²RNN backward's dq/dk in a fixed order instead of fp32 atomics).
# Skips without a GPU, or with a ./train_m2rnn built without NCCL.
set -u
cd "$(dirname "$0")/.."
. test/lib_runs.sh
if ! nvidia-smi -L > /dev/null 2>&1; then
    echo "SKIP the NCCL path of the CUDA trainer: no GPU"; echo "test_gpu_nccl: 0 passed, 0 failed, 1 skipped"; exit 0
fi
if ! ldd ./train_m2rnn 2>/dev/null | grep -q libnccl; then
    echo "SKIP the NCCL path: ./train_m2rnn built without MPI and NCCL"; echo "test_gpu_nccl: 0 passed, 0 failed, 1 skipped"; exit 0
fi
export NCCL_NVLS_ENABLE=0 # (NVLink multicast stays off on shared machines)
dir=build/test_gpu_nccl
rm -rf "$dir"; mkdir -p "$dir"
./build/test_train --fixtures "$dir/fx" > /dev/null 2>&1 || { bad fixtures "build/test_train --fixtures failed"; echo "test_gpu_nccl: 0 passed, 1 failed, 0 skipped"; exit 1; }
# every GPU kind of the one-GPU tests (gpu_infer.sh) in one small model
A=(-e d128:MARU:rope -vs 61 -i "$dir/fx/train_*.bin" -j "$dir/fx/val_*.bin" -t 64 -x 20 -v 10 -m 2 -u 2 -ex 0)
run() { timeout 300 "$@" > "$dir/last.log" 2>&1; }
same_log() { [ "$(losses "$1" | wc -l)" -ge 20 ] && diff <(losses "$1") <(losses "$2") > /dev/null; }
same_ckpt() { ./build/test_train --compare "$1" "$2" 1e-300; } # every weight and moment equal (relative difference 0)

export M2RNN_DETERMINISTIC=1 # (the M²RNN backward's dq/dk in a fixed order: bitwise comparisons)
run ./train_m2rnn "${A[@]}" -b 4 -n 10 -o "$dir/plain" || bad "plain run" "$(tail -3 "$dir/last.log")"
M2RNN_NCCL=1 run ./train_m2rnn "${A[@]}" -b 4 -n 10 -o "$dir/nccl1" || bad "NCCL run" "$(tail -3 "$dir/last.log")"
grep -q "gradient reduce-scatter" "$dir/last.log" || bad "NCCL path taken" "no reduce-scatter line in $(tail -2 "$dir/last.log")"
c=$(same_ckpt "$dir/nccl1/ckpt_00000020.bin" "$dir/plain/ckpt_00000020.bin")
same_log "$dir/nccl1" "$dir/plain" && same_ckpt "$dir/nccl1/ckpt_00000020.bin" "$dir/plain/ckpt_00000020.bin" > /dev/null \
    && ok "NCCL with 1 rank = plain trainer" "20 steps: losses identical, checkpoint $c" \
    || bad "NCCL with 1 rank = plain trainer" "$c"
M2RNN_NCCL=1 M2RNN_NO_OVERLAP=1 run ./train_m2rnn "${A[@]}" -b 4 -o "$dir/nccl1_seq" || bad "NCCL run, no overlap" "$(tail -3 "$dir/last.log")"
same_log "$dir/nccl1_seq" "$dir/plain" && same_ckpt "$dir/nccl1_seq/ckpt_00000020.bin" "$dir/plain/ckpt_00000020.bin" > /dev/null \
    && ok "NCCL with 1 rank, reduce after the backward = plain" "identical" || bad "NCCL without overlap = plain" "differs"
mkdir -p "$dir/resume" && cp "$dir/plain/ckpt_00000010.bin" "$dir/resume/"
M2RNN_NCCL=1 run ./train_m2rnn "${A[@]}" -b 4 -o "$dir/resume" -y 1 \
    && c=$(same_ckpt "$dir/resume/ckpt_00000020.bin" "$dir/plain/ckpt_00000020.bin") \
    && ok "a plain checkpoint resumes on the NCCL path" "step 20 equal: $c" \
    || bad "a plain checkpoint resumes on the NCCL path" "$(tail -2 "$dir/last.log")"

unset M2RNN_DETERMINISTIC
gpus=$(nvidia-smi -L | wc -l)
if [ "$gpus" -lt 2 ] || ! command -v mpirun > /dev/null 2>&1; then
    skip "two ranks: $gpus GPU(s) here, or no mpirun (scripts/gpu_two.sh runs them on a 2-GPU machine)"
else
    mpi_launcher -np 2 -x NCCL_NVLS_ENABLE=0
    for b in fp32 bf16; do
        bin=./train_m2rnn; [ $b = fp32 ] && bin=./build/train_m2rnn_fp32
        run $bin "${A[@]}" -b 4 -n 10 -o "$dir/one_$b" || bad "one GPU $b" "$(tail -3 "$dir/last.log")"
        run "${MPI[@]}" $bin "${A[@]}" -b 2 -n 10 -o "$dir/two_$b" || bad "two GPUs $b" "$(tail -3 "$dir/last.log")"
        w=$(track "$dir/one_$b" "$dir/two_$b")
        c=$(./build/test_train --compare "$dir/two_$b/ckpt_00000020.bin" "$dir/one_$b/ckpt_00000020.bin" 1)
        if [ $b = fp32 ]; then
            under "$w" 1e-5 && ok "DP=2 tracks one GPU (fp32)" "20 steps and 3 validations: largest relative loss difference $w; state $c" \
                            || bad "DP=2 tracks one GPU (fp32)" "largest difference $w"
        else
            under "$w" 2e-2 && ok "DP=2 tracks one GPU (bf16)" "largest relative loss difference $w (measured, not bit-exact: see the header); state $c" \
                            || bad "DP=2 tracks one GPU (bf16)" "largest difference $w"
        fi
    done
    mkdir -p "$dir/two_to_one" && cp "$dir/two_fp32/ckpt_00000010.bin" "$dir/two_to_one/"
    run ./build/train_m2rnn_fp32 "${A[@]}" -b 4 -o "$dir/two_to_one" -y 1 \
        && c=$(./build/test_train --compare "$dir/two_to_one/ckpt_00000020.bin" "$dir/two_fp32/ckpt_00000020.bin" 1e-5) \
        && ok "a DP=2 checkpoint resumes on one GPU" "$c" || bad "a DP=2 checkpoint resumes on one GPU" "$(tail -2 "$dir/last.log") ${c:-}"
    mkdir -p "$dir/one_to_two" && cp "$dir/one_fp32/ckpt_00000010.bin" "$dir/one_to_two/"
    run "${MPI[@]}" ./build/train_m2rnn_fp32 "${A[@]}" -b 2 -o "$dir/one_to_two" -y 1 \
        && c=$(./build/test_train --compare "$dir/one_to_two/ckpt_00000020.bin" "$dir/one_fp32/ckpt_00000020.bin" 1e-5) \
        && ok "a one-GPU checkpoint resumes on two" "$c" || bad "a one-GPU checkpoint resumes on two" "$(tail -2 "$dir/last.log") ${c:-}"
fi
echo "test_gpu_nccl: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
