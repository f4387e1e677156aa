#!/usr/bin/env bash
# test_run_safety.sh: what a user must be able to trust around a run, through the real binary ./train_m2rnn_cpu on a
# tiny model (fixtures from `build/test_train --fixtures`): output directories are never mixed up or lost, every
# save is announced and the run ends saved, validated and exported, SIGINT stops cleanly and resumes bit-exactly,
# a SIGKILL during a checkpoint write loses only the steps since the last good checkpoint, the NaN guard skips and
# stops, main.log headers, the plot script, usage on stdout and hints naming the running binary.
set -u
cd "$(dirname "$0")/.."
passed=0; failed=0; skipped=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }
check() { if eval "$2"; then pass "$1"; else fail "$1"; fi; }
dir=build/test_safety_data
rm -rf "$dir"
if ! ./build/test_train --fixtures "$dir" > /dev/null 2>&1; then
    echo "FAIL could not create fixtures"; echo "test_run_safety: 0 passed, 1 failed, 0 skipped"; exit 1
fi
rm -rf "$dir/run"
BIN=./train_m2rnn_cpu
M=(-i "$dir/train_*.bin" -j "$dir/val_*.bin" -vs 61 -e d32:MAM:n4:k16:v8:h2:f64 -b 2 -t 16 -v 10 -m 2 -nt 1)
run() { timeout 120 $BIN "${M[@]}" "$@"; }

# 1. output directories
run -x 4 -o "$dir/a" > "$dir/a.log" 2>&1
check "a run with -o ends with a checkpoint, a final validation, an export and a summary" \
    "[ -f $dir/a/ckpt_00000004.bin ] && [ -f $dir/a/model.safetensors ] && [ -f $dir/a/config.json ] &&
     grep -q 'saved $dir/a/ckpt_00000004.bin' $dir/a.log && grep -q 'the final model' $dir/a.log &&
     grep -q '^s:4 tel:' $dir/a/main.log && grep -q '^done: steps 0 to 4' $dir/a.log"
run -x 6 -o "$dir/a" > "$dir/b.log" 2>&1; rc=$?
check "a new run refuses a directory holding another run's checkpoints" \
    "[ $rc -eq 1 ] && grep -q 'holds checkpoints of another run' $dir/b.log && grep -q 'HINT: resume that run with -y 1' $dir/b.log && [ -f $dir/a/ckpt_00000004.bin ]"
run -x 3 -o "$dir/a" -ow 1 > "$dir/c.log" 2>&1; rc=$?
check "-ow 1 replaces the other run (its checkpoints and log)" \
    "[ $rc -eq 0 ] && [ ! -f $dir/a/ckpt_00000004.bin ] && [ -f $dir/a/ckpt_00000003.bin ] && [ \$(grep -c '^# run' $dir/a/main.log) -eq 1 ]"
run -x 3 -o "$dir/nonexistent" -y 1 > "$dir/d.log" 2>&1; rc=$?
check "-y 1 refuses a directory that does not exist, and does not create it" \
    "[ $rc -eq 1 ] && grep -q 'no directory' $dir/d.log && [ ! -d $dir/nonexistent ]"
mkdir -p "$dir/empty"
run -x 3 -o "$dir/empty" -y 1 > "$dir/e.log" 2>&1; rc=$?
check "-y 1 refuses a directory without a checkpoint" "[ $rc -eq 1 ] && grep -q 'holds no checkpoint' $dir/e.log"
run -x 3 -o "$dir/empty" -y 2 > "$dir/f.log" 2>&1; rc=$?
check "-y 2 starts a new run where there is no checkpoint" "[ $rc -eq 0 ] && [ -f $dir/empty/ckpt_00000003.bin ]"
timeout 60 $BIN -i "$dir/train_*.bin" -j "" -vs 61 -e d32:MMM:n4:k16:v8:f64 -b 2 -t 16 -x 5 -o "$dir/a" -y 1 > "$dir/g.log" 2>&1; rc=$?
check "-y 1 refuses a model flag that contradicts the checkpoint" "[ $rc -eq 1 ] && grep -q 'has the layer pattern MAM' $dir/g.log"
timeout 60 $BIN -i "$dir/train_*.bin" -j "" -vs 80 -b 2 -t 16 -x 5 -o "$dir/a" -y 1 > "$dir/g2.log" 2>&1; rc=$?
check "-y 1 refuses another vocabulary" "[ $rc -eq 1 ] && grep -q 'has vocab_size=61' $dir/g2.log"
# a damaged newest checkpoint is skipped with a warning; pruning never deletes the checkpoint just written
run -x 8 -n 2 -o "$dir/p" > /dev/null 2>&1
printf 'X' | dd of="$dir/p/ckpt_00000008.bin" bs=1 seek=5000 conv=notrunc 2>/dev/null
run -x 8 -n 1 -nk 1 -o "$dir/p" -y 1 > "$dir/p.log" 2>&1; rc=$?
check "-y 1 resumes from the newest valid checkpoint and names the one it skipped" \
    "[ $rc -eq 0 ] && grep -q 'warning: skipping $dir/p/ckpt_00000008.bin.*checksum' $dir/p.log && grep -q 'resumed from $dir/p/ckpt_00000006.bin at step 6' $dir/p.log"
check "pruning (-nk 1) keeps the checkpoint just written" "[ -f $dir/p/ckpt_00000008.bin ] && [ ! -f $dir/p/ckpt_00000002.bin ]"

# 2. signals: SIGINT finishes the step, saves, exits 0; the resume ends where an uninterrupted run ends
LONG=(-x 3000 -v 1000 -n 1000)
run "${LONG[@]}" -o "$dir/full" -ex 0 > /dev/null 2>&1
$BIN "${M[@]}" "${LONG[@]}" -o "$dir/int" -ex 0 > "$dir/int.log" 2>&1 & pid=$! # (not through run(): the signal must reach the trainer)
sleep 0.7; kill -INT $pid; wait $pid; rc=$?
last=$(ls "$dir/int" | grep -c '^ckpt_')
check "SIGINT finishes the step, saves and exits 0" "[ $rc -eq 0 ] && grep -q 'stopped by signal 2' $dir/int.log && [ $last -ge 1 ]"
run "${LONG[@]}" -o "$dir/int" -ex 0 -y 1 > "$dir/int2.log" 2>&1
check "a run stopped by SIGINT resumes to the uninterrupted run's final checkpoint, byte for byte" \
    "cmp -s $dir/full/ckpt_00003000.bin $dir/int/ckpt_00003000.bin"
M2RNN_TEST_SLOW_SAVE='*:5000' $BIN "${M[@]}" "${LONG[@]}" -n 0 -o "$dir/int3" > /dev/null 2>&1 & pid=$!
sleep 0.5; kill -INT $pid; sleep 0.5; kill -INT $pid; wait $pid; rc=$? # the second comes during the final save
check "a second SIGINT aborts at once (here in the middle of the final save)" "[ $rc -eq 130 ] && [ -f $dir/int3/.ckpt_*.tmp ]"
# SIGKILL in the middle of a checkpoint write: the temporary file is removed at the next start, the good checkpoint
# before it is the resume point, and the run ends as the uninterrupted one
M2RNN_TEST_SLOW_SAVE=10:5000 $BIN "${M[@]}" -x 20 -n 5 -o "$dir/kill" -ex 0 > /dev/null 2>&1 & pid=$!
for _ in $(seq 100); do [ -f "$dir/kill/.ckpt_00000010.bin.tmp" ] && break; sleep 0.1; done
kill -9 $pid; wait $pid 2>/dev/null
check "SIGKILL during a checkpoint write leaves the old checkpoint and a temporary file" \
    "[ -f $dir/kill/ckpt_00000005.bin ] && [ -f $dir/kill/.ckpt_00000010.bin.tmp ] && [ ! -f $dir/kill/ckpt_00000010.bin ]"
run -x 20 -n 5 -o "$dir/kill" -ex 0 -y 1 > "$dir/kill.log" 2>&1
run -x 20 -n 5 -o "$dir/nokill" -ex 0 > /dev/null 2>&1
check "the resume removes the temporary file and ends byte for byte as the uninterrupted run" \
    "grep -q 'removed $dir/kill/.ckpt_00000010.bin.tmp' $dir/kill.log && grep -q 'at step 5' $dir/kill.log &&
     [ ! -f $dir/kill/.ckpt_00000010.bin.tmp ] && cmp -s $dir/kill/ckpt_00000020.bin $dir/nokill/ckpt_00000020.bin"

# 3. the guard: a NaN step is skipped; a run of them stops with the last good state saved
M2RNN_TEST_NAN_STEPS=3 run -x 6 -o "$dir/nan" > "$dir/nan.log" 2>&1; rc=$?
check "a NaN gradient skips the update, and the run goes on" \
    "[ $rc -eq 0 ] && grep -q 'step     3/6 | update skipped: the gradient norm is not finite' $dir/nan.log && grep -q '^s:3 skip:1' $dir/nan/main.log && grep -q '(1 updates skipped)' $dir/nan.log"
M2RNN_TEST_NAN_STEPS=3-100 run -x 20 -zk 4 -o "$dir/nan2" -ex 0 > "$dir/nan2.log" 2>&1; rc=$?
run -x 20 -n 2 -o "$dir/good2" -ex 0 > /dev/null 2>&1
size=$(stat -c %s "$dir/good2/ckpt_00000002.bin"); n3=$(( (size - 4096 - 128) ))
check "4 skips in a row stop the run with a checkpoint of the last good weights and AdamW state" \
    "[ $rc -eq 1 ] && grep -q '4 updates in a row were skipped' $dir/nan2.log && [ -f $dir/nan2/ckpt_00000006.bin ] &&
     cmp -s -i 4096 -n $n3 $dir/nan2/ckpt_00000006.bin $dir/good2/ckpt_00000002.bin"

# 4. logs, plots, CLI manners
grep -q "^# run .* | commit .* | model d32:l3:MAM | .* | step 0 | tokens/step 32 |" "$dir/p/main.log" && \
    grep -q "^# resume .* | step 6 | tokens/step 32 | $dir/p/ckpt_00000006.bin" "$dir/p/main.log"
check "main.log opens each run and each resume with a header line" "[ $? -eq 0 ]"
PY=""
for p in python3 /usr/bin/python3; do if command -v $p > /dev/null && $p -c 'import matplotlib' 2>/dev/null; then PY=$p; break; fi; done
if [ -n "$PY" ]; then
    check "dev/plot_logs.py draws the loss curves of two runs, one resumed" \
        "$PY dev/plot_logs.py $dir/curves.png $dir/p $dir/a > /dev/null && [ -s $dir/curves.png ]"
else
    echo "SKIP dev/plot_logs.py: no python3 with matplotlib (apt-get install python3-matplotlib)"; skipped=$((skipped + 1))
fi
./export_m2rnn "$dir/a/ckpt_00000003.bin" "$dir/exported" --dtype bf16 > "$dir/x.log" 2>&1; rc=$?
check "./export_m2rnn writes a BF16 safetensors file and a config.json that parse as JSON" \
    "[ $rc -eq 0 ] && python3 -c 'import json,struct,sys; f=open(sys.argv[1],\"rb\"); n=struct.unpack(\"<Q\",f.read(8))[0]; h=json.loads(f.read(n)); c=json.load(open(sys.argv[2])); assert h[\"layer0.m2rnn.W\"][\"dtype\"]==\"BF16\" and c[\"pattern\"]==\"MAM\" and len(c[\"tensors\"])==len(h)-1' $dir/exported/model.safetensors $dir/exported/config.json"
out=$($BIN -h 2>/dev/null); rc=$?
check "-h prints the usage on stdout and exits 0" "[ $rc -eq 0 ] && echo \"\$out\" | grep -q '^usage: $BIN'"
err=$($BIN -zz 1 2>&1 >/dev/null)
check "hints name the running binary" "echo \"\$err\" | grep -q 'HINT: run $BIN -h'"
run -x 2 > "$dir/q.log" 2>&1
check "a run without -o says that nothing is saved, and validates before the first step" \
    "grep -q 'none (no -o: nothing is saved)' $dir/q.log && grep -q '^validating' $dir/q.log"

echo "test_run_safety: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
