#!/usr/bin/env bash
# gpu_two.sh: the two-GPU measurements of data and tensor parallelism in one call on a 2-GPU machine (one process
# per GPU over MPI + NCCL, NVLink multicast off). Needs the default corpus for the scaling runs (dev/data/gutenberg:
# carry it to the machine).
#   1. correctness: test/test_gpu_nccl.sh (NCCL with 1 rank = plain bit for bit; DP=2 tracks one GPU in fp32 within
#      the CPU tests' 1e-5 and in bf16; a DP=2 checkpoint resumes on one GPU and a one-GPU checkpoint on two) and
#      test/test_gpu_tp.sh (TP=2 of a hybrid of every splitting mixer, M²RNN topology-independent, and of M²RNN
#      topology-aware tracks one GPU; a TP=2 checkpoint resumes on one GPU and a one-GPU one on TP=2)
#   2. data-parallel scaling, B=8 T=4096 per GPU: one GPU, two GPUs with the reduce-scatter overlapped with the
#      backward, two GPUs with it after the backward (M2RNN_NO_OVERLAP=1); step ms, tokens/s, the ratio, and the
#      reduce-scatter time left after the backward (the overlap, seen in the step split)
#   3. what TP=2 costs each layer kind (build/bench_tp, B=8 T=4096, d=1024): attention, M²RNN topology-aware and
#      topology-independent, SwiGLU, GDN, Mamba-2; forward and backward ms at TP=1 and TP=2, the collectives counted,
#      the bytes one all-reduce moves
# usage: PARTS="correct scaling tp" bash scripts/gpu_two.sh [OUT_DIR]   (PARTS: which of the three, default all;
#        prints markdown rows; logs in OUT_DIR, default $OUT or /tmp/gpu_two)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
OUTD=${1:-${OUT:-/tmp/gpu_two}}
mkdir -p "$OUTD"
nvidia-smi -L; nvidia-smi topo -m 2>/dev/null | head -4
PARTS=${PARTS:-correct scaling tp}
has() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }
make -j16 train_m2rnn build/train_m2rnn_fp32 build/test_train build/bench_tp ${EXTRA_TARGETS:-} > "$OUTD/build.log" 2>&1 || { tail -30 "$OUTD/build.log"; exit 1; }
if has correct; then
    bash test/test_gpu_nccl.sh 2>&1 | tee "$OUTD/test_gpu_nccl.txt"
    bash test/test_gpu_tp.sh 2>&1 | tee "$OUTD/test_gpu_tp.txt"
    grep -q " 0 failed" "$OUTD/test_gpu_nccl.txt" && grep -q " 0 failed" "$OUTD/test_gpu_tp.txt" \
        || { echo "correctness failed: no measurements"; exit 1; }
fi

MPI=(mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0)
if has tp; then
    echo
    echo "| GPU | layer | part | TP | ms | collectives | MB a GPU per all-reduce |"
    echo "|---|---|---|---|---|---|---|"
    for desc in d1024:A:rope:h16 d1024:M:n84:q2:gn d1024:M:n84 d1024:G:gh16:gk128:gv128 d1024:S:si2048:sp64:sn128:sg2; do
        timeout 300 ./build/bench_tp "$desc" 8 4096 2>&1 | grep '^|' || echo "| bench_tp $desc TP=1 failed |"
        timeout 300 "${MPI[@]}" ./build/bench_tp "$desc" 8 4096 2>&1 | grep '^|' || echo "| bench_tp $desc TP=2 failed |"
    done
fi
has scaling || exit 0
ls dev/data/gutenberg/gutenberg_train_*.bin > /dev/null 2>&1 || { echo "no dev/data/gutenberg shards (carry them)"; exit 1; }
STEPS=${STEPS:-16}
# "done: ... , X ms a step (Y ms of it the gradient reduce-scatter after the backward)" → X Y
split() { sed -n 's/.*, \([0-9.]*\) ms a step\( (\([0-9.]*\) ms of it.*\)\{0,1\}$/\1 \3/p' "$1" | tail -1; }
echo
echo "| model | GPUs | overlap | step ms | tokens/s | scaling vs 1 GPU | reduce-scatter after the backward, ms/step |"
echo "|---|---|---|---|---|---|---|"
for m in "d768:MMMAMMMAMMMA 50257" "d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84 100352"; do
    set -- $m
    desc=$1; vs=$2
    COMMON=(-e "$desc" -vs "$vs" -i 'dev/data/gutenberg/gutenberg_train_*.bin' -j "" -b 8 -t 4096 -x "$STEPS" -u 2 -ex 0)
    tag=$(echo "$desc" | tr ':' '_')
    timeout 400 ./train_m2rnn "${COMMON[@]}" > "$OUTD/$tag.1.txt" 2>&1 || tail -3 "$OUTD/$tag.1.txt"
    timeout 400 "${MPI[@]}" ./train_m2rnn "${COMMON[@]}" > "$OUTD/$tag.2.txt" 2>&1 || tail -3 "$OUTD/$tag.2.txt"
    timeout 400 "${MPI[@]}" -x M2RNN_NO_OVERLAP=1 ./train_m2rnn "${COMMON[@]}" > "$OUTD/$tag.2seq.txt" 2>&1 \
        || tail -3 "$OUTD/$tag.2seq.txt"
    read ms1 _ <<< "$(split "$OUTD/$tag.1.txt")"
    for run in 1 2 2seq; do
        read ms exposed <<< "$(split "$OUTD/$tag.$run.txt")"
        gpus=${run%seq}; ov=yes; [ "$run" = 2seq ] && ov=no; [ "$gpus" = 1 ] && ov=-
        awk -v d="$desc" -v g="$gpus" -v o="$ov" -v ms="${ms:-0}" -v ms1="${ms1:-0}" -v ex="${exposed:--}" \
            'BEGIN { tok = 8 * 4096 * g; if (ms <= 0) { printf("| `%s` | %d | %s | failed | | | |\n", d, g, o); exit }
                     printf("| `%s` | %d | %s | %.1f | %.0f | %s | %s |\n", d, g, o, ms, tok / ms * 1000,
                            g == 1 ? "1" : sprintf("%.3f×", (tok / ms) / (8 * 4096 / ms1)), ex) }'
    done
done
