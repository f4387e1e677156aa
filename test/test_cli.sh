#!/usr/bin/env bash
# test_cli.sh: bad input to ./train_m2rnn_cpu must end in exactly one "error:" line plus a "---> HINT:" line on stderr and
# a non-zero exit status; never a crash (signal), a hang (each run has a time limit) or a silent start.
# Fixtures (token shards and a real checkpoint) come from `build/test_train --fixtures`.
set -u
cd "$(dirname "$0")/.."
passed=0; failed=0
dir=build/test_cli_data
if ! ./build/test_train --fixtures "$dir" > /dev/null 2>&1; then
    echo "FAIL could not create fixtures with build/test_train --fixtures"; echo "test_cli: 0 passed, 1 failed, 0 skipped"; exit 1
fi
good="$dir/run/ckpt_00000002.bin"
data=(-i "$dir/train_*.bin" -j "$dir/val_*.bin" -vs 61 -b 2 -t 16 -x 3)

# expect_refusal NAME WORD ARGS...: the run must fail cleanly and its error line must mention WORD
expect_refusal() {
    local name="$1" word="$2"; shift 2
    local err rc
    err=$(timeout 60 ./train_m2rnn_cpu "$@" 2>&1 >/dev/null); rc=$?
    local errors hints
    errors=$(printf '%s\n' "$err" | grep -c '^error: ')
    hints=$(printf '%s\n' "$err" | grep -c '^---> HINT: ')
    if [ "$rc" -ne 0 ] && [ "$rc" -lt 124 ] && [ "$errors" -eq 1 ] && [ "$hints" -eq 1 ] && printf '%s' "$err" | grep -qi -- "$word"; then
        echo "PASS $name: $(printf '%s\n' "$err" | grep '^error: ')"; passed=$((passed + 1))
    else
        echo "FAIL $name (exit $rc): $err"; failed=$((failed + 1))
    fi
}

expect_refusal "unknown layer letter" "unknown layer letter" -e d32:MXA "${data[@]}"
expect_refusal "lower-case junk in descriptor" "unknown field" -e d32:MAM:zz "${data[@]}"
expect_refusal "malformed number in descriptor" "cannot read field" -e d32:MAM:n4x "${data[@]}"
expect_refusal "a field no layer uses" "belongs to A layers" -e d32:MMM:h4 "${data[@]}"
expect_refusal "RNN/GRU field without R or U" "belongs to R or U layers" -e d32:MA:rh8 "${data[@]}"
expect_refusal "feed-forward pattern of the wrong length" "feed-forward pattern" -e d32:MAM:ffn=ss "${data[@]}"
expect_refusal "unknown feed-forward letter" "unknown letter" -e d32:MAM:ffn=x "${data[@]}"
expect_refusal "RNN head size out of range" "RNN/GRU sizes" -e d32:RU:rv64 "${data[@]}"
expect_refusal "empty pattern" "no pattern" -e d32 "${data[@]}"
expect_refusal "layer count mismatch" "does not match" -e d32:l3:MA "${data[@]}"
expect_refusal "q/k heads do not divide" "q/k heads" -e d32:M:n5:q2 "${data[@]}"
expect_refusal "total batch not a multiple" "not a multiple" -e d32:MA -d 100 "${data[@]}"
expect_refusal "unknown flag" "unknown flag" -e d32:MA -zz 1 "${data[@]}"
expect_refusal "flag without value" "needs a value" "${data[@]}" -b
expect_refusal "malformed number" "expects an integer" "${data[@]}" -b 4x
expect_refusal "out-of-range number" "must be in" "${data[@]}" -q 2
expect_refusal "no shards match" "no data shards" -e d32:MA -i "$dir/nothing_*.bin" -vs 61
expect_refusal "vocab smaller than the data" "vocab" -e d32:MA -i "$dir/train_*.bin" -j "" -vs 20 -b 2 -t 16 -x 1
expect_refusal "checkpoints without -o" "need -o" "${data[@]}" -n 5

cp "$good" "$dir/truncated.bin" && truncate -s 3000 "$dir/truncated.bin"
expect_refusal "truncated checkpoint" "bytes" -e "$dir/truncated.bin" "${data[@]}"
head -c 500 "$good" > "$dir/tiny.bin"
expect_refusal "checkpoint shorter than its header" "shorter than" -e "$dir/tiny.bin" "${data[@]}"
expect_refusal "foreign file (a data shard) as checkpoint" "not an m2rnn checkpoint" -e "$dir/val_000000.bin" "${data[@]}"
cp "$good" "$dir/version.bin" && printf '\x63\x00\x00\x00' | dd of="$dir/version.bin" bs=1 seek=4 conv=notrunc 2>/dev/null
expect_refusal "wrong checkpoint version" "version" -e "$dir/version.bin" "${data[@]}"
cp "$good" "$dir/magic.bin" && printf '\x01\x02\x03\x04' | dd of="$dir/magic.bin" bs=1 seek=0 conv=notrunc 2>/dev/null
expect_refusal "wrong checkpoint magic" "magic" -e "$dir/magic.bin" "${data[@]}"
cp "$good" "$dir/flipped.bin" && printf '\x55' | dd of="$dir/flipped.bin" bs=1 seek=5000 conv=notrunc 2>/dev/null
expect_refusal "corrupted checkpoint payload" "checksum" -e "$dir/flipped.bin" "${data[@]}"
cp "$good" "$dir/appended.bin" && printf 'junk' >> "$dir/appended.bin"
expect_refusal "checkpoint with trailing bytes" "promises" -e "$dir/appended.bin" "${data[@]}"
expect_refusal "resume with another batch size" "resume with" -o "$dir/run" -y 1 -i "$dir/train_*.bin" -j "" -b 4 -t 16 -x 3

# and the happy path still works: resume the fixture run for one more step
if timeout 120 ./train_m2rnn_cpu -o "$dir/run" -y 1 "${data[@]}" > "$dir/resume.log" 2>&1 && grep -q "resumed from" "$dir/resume.log"; then
    echo "PASS resume through the CLI"; passed=$((passed + 1))
else
    echo "FAIL resume through the CLI: $(cat "$dir/resume.log")"; failed=$((failed + 1))
fi
echo "test_cli: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
