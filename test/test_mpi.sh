#!/usr/bin/env bash
# test_mpi.sh: data parallelism of the CPU trainer over MPI (comm.h), two processes on this machine. The same global
# batch split over 2 ranks (B = 2 each) or read by one (B = 4) must give the same run: the only difference is the
# order in which the two halves' gradients are added (fp32 rounding, ~1e-7 a step); measured within 1e-6 over 20
# steps, held at 1e-5 for the losses and for the final weights and AdamW moments (the ZeRO-1 shards gathered into the
# checkpoint). A 2-rank checkpoint resumes in 1 process and a 1-process checkpoint in 2 (the moments re-sharded),
# gradient accumulation composes with the replicas, and a refusal on any rank ends the whole job with one message.
# Skips without mpirun or without an MPI build of ./train_m2rnn_cpu.
set -u
cd "$(dirname "$0")/.."
. test/lib_runs.sh
if ! command -v mpirun > /dev/null 2>&1 || ! ldd ./train_m2rnn_cpu 2>/dev/null | grep -q libmpi; then
    echo "SKIP data parallelism over MPI: no mpirun, or ./train_m2rnn_cpu built without MPI (install openmpi-bin libopenmpi-dev)"
    echo "test_mpi: 0 passed, 0 failed, 1 skipped"; exit 0
fi
mpi_launcher -np 2
dir=build/test_mpi_data
rm -rf "$dir"; mkdir -p "$dir"
./build/test_train --fixtures "$dir/fx" > /dev/null 2>&1 || { bad fixtures "build/test_train --fixtures failed"; echo "test_mpi: 0 passed, 1 failed, 0 skipped"; exit 1; }
A=(-e d32:MAGR -vs 61 -i "$dir/fx/train_*.bin" -j "$dir/fx/val_*.bin" -t 16 -x 20 -v 10 -m 2 -u 2 -ex 0 -nt 1)
run1() { timeout 300 ./train_m2rnn_cpu "$@" > "$dir/last.log" 2>&1; }
run2() { timeout 300 "${MPI[@]}" ./train_m2rnn_cpu "$@" > "$dir/last.log" 2>&1; }
# the largest relative difference of two runs' logged losses (train and validation, every step)

run1 "${A[@]}" -b 4 -n 10 -o "$dir/one" || bad "one process" "$(tail -2 "$dir/last.log")"
run2 "${A[@]}" -b 2 -n 10 -o "$dir/two" || bad "two processes" "$(tail -2 "$dir/last.log")"
w=$(track "$dir/one" "$dir/two")
under "$w" 1e-5 && ok "DP=2 tracks one process" "20 steps and 3 validations, largest relative loss difference $w" \
                 || bad "DP=2 tracks one process" "largest difference $w"
grep -q "processes             | 2: 2 data-parallel" "$dir/last.log" && ok "banner" "2 data-parallel replicas, one log" \
    || bad "banner" "$(head -20 "$dir/last.log")"
c=$(./build/test_train --compare "$dir/two/ckpt_00000020.bin" "$dir/one/ckpt_00000020.bin" 1e-5) \
    && ok "ZeRO-1 shards reassemble" "$c" || bad "ZeRO-1 shards reassemble" "$c"
# resume across replica counts: the 2-rank run's step-10 checkpoint finished in 1 process, and the other way round
mkdir -p "$dir/two_to_one" && cp "$dir/two/ckpt_00000010.bin" "$dir/two_to_one/"
run1 "${A[@]}" -b 4 -o "$dir/two_to_one" -y 1 && c=$(./build/test_train --compare "$dir/two_to_one/ckpt_00000020.bin" "$dir/two/ckpt_00000020.bin" 1e-5) \
    && ok "a 2-rank checkpoint resumes in 1 process" "$c" || bad "a 2-rank checkpoint resumes in 1 process" "$(tail -2 "$dir/last.log") $c"
mkdir -p "$dir/one_to_two" && cp "$dir/one/ckpt_00000010.bin" "$dir/one_to_two/"
run2 "${A[@]}" -b 2 -o "$dir/one_to_two" -y 1 && c=$(./build/test_train --compare "$dir/one_to_two/ckpt_00000020.bin" "$dir/one/ckpt_00000020.bin" 1e-5) \
    && ok "a 1-process checkpoint resumes on 2 ranks" "$c" || bad "a 1-process checkpoint resumes on 2 ranks" "$(tail -2 "$dir/last.log") $c"
# gradient accumulation with replicas: 2 ranks x 1 row x 2 micro-steps against one process of 2 rows x 2 micro-steps
# (the same groups of 2 rows, so the same rows a step and the same shard ends)
run2 "${A[@]}" -b 1 -d 64 -o "$dir/two_acc" || bad "accumulation" "$(tail -2 "$dir/last.log")"
run1 "${A[@]}" -b 2 -d 64 -o "$dir/one_acc" || bad "accumulation" "$(tail -2 "$dir/last.log")"
w=$(track "$dir/two_acc" "$dir/one_acc")
under "$w" 1e-5 && ok "DP=2 with accumulation 2 tracks one process" "largest relative loss difference $w" \
                 || bad "DP=2 with accumulation 2 tracks one process" "largest difference $w"
# refusals end the job: every rank exits, one error line each, no hang (timeout 60)
err=$(timeout 60 "${MPI[@]}" ./train_m2rnn_cpu "${A[@]}" -e d32:MXA -b 2 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && printf '%s' "$err" | grep -q "unknown layer letter" && ok "a refusal stops the job" "exit $rc" \
    || bad "a refusal stops the job" "exit $rc: $err"
err=$(timeout 60 "${MPI[@]}" ./train_m2rnn_cpu "${A[@]}" -tp 4 -b 2 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && printf '%s' "$err" | grep -q "does not divide" && ok "-tp 4 on 2 processes refused" "said so" \
    || bad "-tp 4 on 2 processes refused" "exit $rc: $err"
echo "test_mpi: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
