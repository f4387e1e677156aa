#!/usr/bin/env bash
# test_tp.sh: tensor parallelism of the CPU trainer over MPI (comm.h, ref/lm.h), on this machine's CPU ranks.
#   1. every layer kind as TP shards over 2 and 4 ranks = the whole layer, with its collectives counted (test_tp_mpi);
#   2. whole runs: 20 steps of TP = 2 (a hybrid of every mixer that splits, M²RNN topology-independent; and an M²RNN
#      topology-aware model, Nq = 2 with a norm per group) and of TP = 2 x DP = 2 track one process: same losses and
#      checkpoint. The only differences are fp32 sums in another order (the row-parallel projections' partial sums,
#      the vocabulary shards' softmax sums, RMSNormTP's sums of squares), ~1e-7 a step: measured within 3e-7 on the
#      weights after 20 steps; held at 1e-5 as the data-parallel test is;
#   3. checkpoints hold the whole model: a TP = 2 checkpoint resumes in one process and a one-process checkpoint on
#      TP = 2 ranks, both finishing the run as the uninterrupted one did (1e-5);
#   4. refusals end the job with one line: a TP size that does not divide the processes, heads that do not divide,
#      MoE layers.
# Skips without mpirun or an MPI build of ./train_m2rnn_cpu.
set -u
cd "$(dirname "$0")/.."
. test/lib_runs.sh
if ! command -v mpirun > /dev/null 2>&1 || ! ldd ./train_m2rnn_cpu 2>/dev/null | grep -q libmpi; then
    echo "SKIP tensor parallelism over MPI: no mpirun, or ./train_m2rnn_cpu built without MPI (install openmpi-bin libopenmpi-dev)"
    echo "test_tp: 0 passed, 0 failed, 1 skipped"; exit 0
fi
mpi_launcher
dir=build/test_tp_data
rm -rf "$dir"; mkdir -p "$dir"

# 1. the layers
for np in 2 4; do
    out=$(timeout 300 "${MPI[@]}" -np $np ./build/test_tp_mpi 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^test_tp_mpi: ')
    np_pass=$(printf '%s\n' "$out" | grep -c '^PASS'); np_fail=$(printf '%s\n' "$out" | grep -c '^FAIL')
    printf '%s\n' "$out" | grep -E '^(PASS|FAIL)' | sed "s/^/  [np $np] /"
    [ $rc -eq 0 ] && [ "$np_fail" -eq 0 ] && [ "$np_pass" -gt 0 ] && ok "layers over $np ranks" "$line" \
        || bad "layers over $np ranks" "exit $rc: $(printf '%s' "$out" | tail -3)"
done

# 2. whole runs
./build/test_train --fixtures "$dir/fx" > /dev/null 2>&1 || { bad fixtures "build/test_train --fixtures failed"; echo "test_tp: $passed passed, 1 failed, 0 skipped"; exit 1; }
HYB=d32:MAGSRU:n4:k16:v8:gh4:gk8:gv8:rh4:h4:si64:sp8:sg2
AWARE=d32:MMAM:n4:q2:gn:k16:v8:h4
common=(-vs 61 -i "$dir/fx/train_*.bin" -j "$dir/fx/val_*.bin" -t 16 -x 20 -v 10 -m 2 -u 2 -ex 0 -nt 1)
run1() { timeout 300 ./train_m2rnn_cpu "$@" > "$dir/last.log" 2>&1; }
runn() { local np=$1; shift; timeout 300 "${MPI[@]}" -np "$np" ./train_m2rnn_cpu "$@" > "$dir/last.log" 2>&1; }
same_run() { # label, dir a, dir b
    local w c
    w=$(track "$2" "$3")
    c=$(./build/test_train --compare "$2/ckpt_00000020.bin" "$3/ckpt_00000020.bin" 1e-5)
    local rc=$?
    under "$w" 1e-5 && [ $rc -eq 0 ] && ok "$1" "20 steps, 3 validations: largest relative loss difference $w; checkpoint $c" \
        || bad "$1" "loss difference $w; checkpoint $c"
}
run1 -e "$HYB" "${common[@]}" -b 4 -n 10 -o "$dir/hyb1" || bad "hybrid, one process" "$(tail -2 "$dir/last.log")"
runn 2 -e "$HYB" "${common[@]}" -b 4 -n 10 -tp 2 -o "$dir/hyb_tp2" || bad "hybrid, TP=2" "$(tail -2 "$dir/last.log")"
grep -q "processes             | 2: 1 data-parallel replicas (B rows each) x 2 tensor-parallel" "$dir/last.log" \
    && ok "banner" "1 replica x 2 tensor-parallel ranks" || bad "banner" "$(grep processes "$dir/last.log")"
same_run "hybrid MAGSRU (M2RNN topology-independent), TP=2 tracks one process" "$dir/hyb_tp2" "$dir/hyb1"
run1 -e "$AWARE" "${common[@]}" -b 4 -n 10 -o "$dir/aware1" || bad "topology-aware, one process" "$(tail -2 "$dir/last.log")"
runn 2 -e "$AWARE" "${common[@]}" -b 4 -n 10 -tp 2 -o "$dir/aware_tp2" || bad "topology-aware, TP=2" "$(tail -2 "$dir/last.log")"
same_run "M2RNN topology-aware (Nq=2, norm per group), TP=2 tracks one process" "$dir/aware_tp2" "$dir/aware1"
runn 4 -e "$HYB" "${common[@]}" -b 2 -n 10 -tp 2 -o "$dir/hyb_tp2dp2" || bad "hybrid, TP=2 x DP=2" "$(tail -2 "$dir/last.log")"
same_run "hybrid, TP=2 x DP=2 (4 ranks, ZeRO-1 inside each TP position) tracks one process" "$dir/hyb_tp2dp2" "$dir/hyb1"

# 3. resumes across TP sizes
mkdir -p "$dir/tp2_to_1" && cp "$dir/hyb_tp2/ckpt_00000010.bin" "$dir/tp2_to_1/"
run1 -e "$HYB" "${common[@]}" -b 4 -o "$dir/tp2_to_1" -y 1 \
    && c=$(./build/test_train --compare "$dir/tp2_to_1/ckpt_00000020.bin" "$dir/hyb_tp2/ckpt_00000020.bin" 1e-5) \
    && ok "a TP=2 checkpoint resumes in one process" "$c" || bad "a TP=2 checkpoint resumes in one process" "$(tail -2 "$dir/last.log") ${c:-}"
mkdir -p "$dir/one_to_tp2" && cp "$dir/hyb1/ckpt_00000010.bin" "$dir/one_to_tp2/"
runn 2 -e "$HYB" "${common[@]}" -b 4 -tp 2 -o "$dir/one_to_tp2" -y 1 \
    && c=$(./build/test_train --compare "$dir/one_to_tp2/ckpt_00000020.bin" "$dir/hyb1/ckpt_00000020.bin" 1e-5) \
    && ok "a one-process checkpoint resumes on TP=2 ranks" "$c" || bad "a one-process checkpoint resumes on TP=2 ranks" "$(tail -2 "$dir/last.log") ${c:-}"

# 4. refusals: every rank exits, one error line, no hang
refuse() { # label, pattern, np, args...
    local label=$1 pat=$2 np=$3; shift 3
    local err rc
    err=$(timeout 60 "${MPI[@]}" -np "$np" ./train_m2rnn_cpu "${common[@]}" -b 2 "$@" 2>&1); rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && printf '%s' "$err" | grep -q "$pat" && ok "$label" "$(printf "%s" "$err" | grep -m1 "^error:")" \
        || bad "$label" "exit $rc: $(printf '%s' "$err" | tail -3)"
}
refuse "-tp 3 on 2 processes refused" "does not divide the 2 processes" 2 -e "$HYB" -tp 3
refuse "heads not divisible by TP refused" "must divide by the TP size" 2 -e d32:MA:n3:k16:v8 -tp 2
refuse "MoE under TP refused" "MoE layers under tensor parallelism" 2 -e d32:A:h4:ffn=e:xe4:xk2:xf16 -tp 2
echo "test_tp: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
