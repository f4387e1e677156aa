#!/usr/bin/env bash
# test_gpu_tp.sh: tensor parallelism of the CUDA trainer over NCCL (lm.cuh, as ref/lm.h does it and test/test_tp.sh
# checks on CPU ranks), on two GPUs of one machine, one process each:
#   1. whole runs of 20 steps at TP = 2 track one GPU: a hybrid of every mixer that splits (M²RNN topology-independent:
#      q/k replicated, RMSNormTP; attention with GQA and RoPE, GDN[−1,1], Mamba-2 with 2 groups, RNN, GRU; SwiGLU) and
#      an M²RNN topology-aware model (Nq = 2, a norm per q/k group). In the fp32 build the only differences are fp32
#      sums in another order (the row-parallel projections' partial sums, the vocabulary shards' softmax sums,
#      RMSNormTP's sums of squares) and the M²RNN backward's fp32 atomics: held at the CPU tests' 1e-5 on the losses
#      and the checkpoint. The bf16 build is held at the data-parallel test's 2e-2 (the all-reduced branch outputs are
#      rounded to bf16 once more than on one GPU) and its gap is printed;
#   2. checkpoints hold the whole model: a TP = 2 checkpoint resumes on one GPU and a one-GPU checkpoint on TP = 2,
#      both finishing as the uninterrupted run did (fp32, 1e-5);
#   3. refusals end both ranks with one line: heads that do not divide, MoE layers;
#   with four GPUs also TP=2 x DP=2 (two communicators a rank, the norm over ZeRO-1 pieces less the replicated ranges).
# Skips without two GPUs, mpirun, or a ./train_m2rnn built with NCCL.
set -u
cd "$(dirname "$0")/.."
. test/lib_runs.sh
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 2 ] || ! command -v mpirun > /dev/null 2>&1 || ! ldd ./train_m2rnn 2>/dev/null | grep -q libnccl; then
    echo "SKIP tensor parallelism on GPUs: $gpus GPU(s), or no mpirun, or ./train_m2rnn built without NCCL (scripts/gpu_two.sh runs it on a 2-GPU machine)"
    echo "test_gpu_tp: 0 passed, 0 failed, 1 skipped"; exit 0
fi
export NCCL_NVLS_ENABLE=0 # (NVLink multicast stays off on shared machines)
mpi_launcher -np 2 -x NCCL_NVLS_ENABLE=0
dir=build/test_gpu_tp
rm -rf "$dir"; mkdir -p "$dir"
./build/test_train --fixtures "$dir/fx" > /dev/null 2>&1 || { bad fixtures "build/test_train --fixtures failed"; echo "test_gpu_tp: 0 passed, 1 failed, 0 skipped"; exit 1; }
# the GPU kinds at the shapes of the one-GPU trainer test (test_gpu_trainer: MMAM, RUAR, GAGM, SAMS), each dividing by 2
HYB=d128:MAGSRU:rope:n4:k16:v16:h4:hk2:rh4:gh2:gk32:gv48:gneg:si128:sp32:sn24:sg2
AWARE=d128:MMAM:n4:q2:gn:k16:v16:h4:hk2
common=(-vs 61 -i "$dir/fx/train_*.bin" -j "$dir/fx/val_*.bin" -t 64 -x 20 -v 10 -m 2 -u 2 -ex 0 -b 4)
run() { timeout 300 "$@" > "$dir/last.log" 2>&1; }
same_run() { # label, dir a, dir b, loss tolerance, checkpoint tolerance
    local w c rc
    w=$(track "$2" "$3")
    c=$(./build/test_train --compare "$2/ckpt_00000020.bin" "$3/ckpt_00000020.bin" "$5"); rc=$?
    under "$w" "$4" && [ $rc -eq 0 ] && ok "$1" "20 steps, 3 validations: largest relative loss difference $w; checkpoint $c" \
        || bad "$1" "loss difference $w (tolerance $4); checkpoint $c"
}

# 1. whole runs
FP32=./build/train_m2rnn_fp32
for m in "hybrid MAGSRU (M2RNN topology-independent)|$HYB|hyb" "M2RNN topology-aware (Nq=2, norm per group)|$AWARE|aware"; do
    IFS='|' read -r label desc tag <<< "$m"
    run $FP32 -e "$desc" "${common[@]}" -n 10 -o "$dir/${tag}1" || bad "$label, one GPU (fp32)" "$(tail -2 "$dir/last.log")"
    run "${MPI[@]}" $FP32 -e "$desc" "${common[@]}" -n 10 -tp 2 -o "$dir/${tag}_tp2" \
        || bad "$label, TP=2 (fp32)" "$(tail -2 "$dir/last.log")"
    same_run "$label, TP=2 tracks one GPU (fp32)" "$dir/${tag}_tp2" "$dir/${tag}1" 1e-5 1e-5
done
grep -q "processes             | 2: 1 data-parallel replicas (B rows each) x 2 tensor-parallel" "$dir/last.log" \
    && ok "banner" "1 replica x 2 tensor-parallel ranks" || bad "banner" "$(grep processes "$dir/last.log")"
run ./train_m2rnn -e "$HYB" "${common[@]}" -o "$dir/hyb1_bf16" || bad "hybrid, one GPU (bf16)" "$(tail -2 "$dir/last.log")"
run "${MPI[@]}" ./train_m2rnn -e "$HYB" "${common[@]}" -tp 2 -o "$dir/hyb_tp2_bf16" || bad "hybrid, TP=2 (bf16)" "$(tail -2 "$dir/last.log")"
same_run "hybrid, TP=2 tracks one GPU (bf16; measured, not bit-exact)" "$dir/hyb_tp2_bf16" "$dir/hyb1_bf16" 2e-2 1

# (four GPUs) TP=2 x DP=2: each TP group reads its own rows, ZeRO-1 within each TP position, two communicators a rank
if [ "$gpus" -ge 4 ]; then
    mpi_launcher -np 4 -x NCCL_NVLS_ENABLE=0
    run "${MPI[@]}" $FP32 -e "$HYB" "${common[@]}" -b 2 -n 10 -tp 2 -o "$dir/hyb_tp2dp2" \
        || bad "hybrid, TP=2 x DP=2 (fp32)" "$(tail -2 "$dir/last.log")"
    same_run "hybrid, TP=2 x DP=2 (4 GPUs) tracks one GPU (fp32)" "$dir/hyb_tp2dp2" "$dir/hyb1" 1e-5 1e-5
    mpi_launcher -np 2 -x NCCL_NVLS_ENABLE=0
fi

# 2. resumes across TP sizes
mkdir -p "$dir/tp2_to_1" && cp "$dir/hyb_tp2/ckpt_00000010.bin" "$dir/tp2_to_1/"
run $FP32 -e "$HYB" "${common[@]}" -o "$dir/tp2_to_1" -y 1 \
    && c=$(./build/test_train --compare "$dir/tp2_to_1/ckpt_00000020.bin" "$dir/hyb_tp2/ckpt_00000020.bin" 1e-5) \
    && ok "a TP=2 checkpoint resumes on one GPU" "$c" || bad "a TP=2 checkpoint resumes on one GPU" "$(tail -2 "$dir/last.log") ${c:-}"
mkdir -p "$dir/one_to_tp2" && cp "$dir/hyb1/ckpt_00000010.bin" "$dir/one_to_tp2/"
run "${MPI[@]}" $FP32 -e "$HYB" "${common[@]}" -tp 2 -o "$dir/one_to_tp2" -y 1 \
    && c=$(./build/test_train --compare "$dir/one_to_tp2/ckpt_00000020.bin" "$dir/hyb1/ckpt_00000020.bin" 1e-5) \
    && ok "a one-GPU checkpoint resumes on TP=2" "$c" || bad "a one-GPU checkpoint resumes on TP=2" "$(tail -2 "$dir/last.log") ${c:-}"

# 3. refusals: both ranks exit, one error line, no hang
refuse() { # label, pattern, args...
    local label=$1 pat=$2 err rc; shift 2
    err=$(timeout 120 "${MPI[@]}" ./train_m2rnn "${common[@]}" "$@" 2>&1); rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && printf '%s' "$err" | grep -q "$pat" && ok "$label" "$(printf "%s" "$err" | grep -m1 "^error:")" \
        || bad "$label" "exit $rc: $(printf '%s' "$err" | tail -3)"
}
refuse "heads not divisible by TP refused" "must divide by the TP size" -e d128:MA:n3:k16:v16 -tp 2
refuse "MoE under TP refused" "MoE layers under tensor parallelism" -e d128:A:h4:ffn=e:xe4:xk2:xf64 -tp 2
echo "test_gpu_tp: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
