#!/usr/bin/env bash
# test_infer.sh: ./infer_m2rnn_cpu (infer.h over the CPU reference) end to end on a checkpoint with every mixer kind
# (M, A with RoPE, G, R, U, S; GPT-2 vocabulary, written by a 3-step run of the CPU trainer on the test fixtures):
# greedy and seeded sampling repeat exactly; a prompt prefilled in chunks of 3 generates what the whole prefill does;
# a state saved after the prompt and loaded later generates what the uninterrupted run does; a prompt generated in a
# batch of three equals the same prompt alone; prompt files (lines, JSONL) and JSONL output; the stop string; and bad
# input refused with one error line and a hint. (The logits behind all this are held to the forward in test_decode.)
set -u
cd "$(dirname "$0")/.."
passed=0; failed=0
ok() { echo "PASS $1: $2"; passed=$((passed + 1)); }
bad() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
dir=build/test_infer_data
rm -rf "$dir"; mkdir -p "$dir"
if ! ./build/test_train --fixtures "$dir/fx" > /dev/null 2>&1 ||
   ! ./train_m2rnn_cpu -e d32:MAGRUS:rope:h2:gh2:gk8:gv8:sp8:sn4 -vs 50257 -i "$dir/fx/train_*.bin" -j "" -b 2 -t 16 -x 3 \
        -o "$dir/run" -q 0 -ex 0 > "$dir/train.log" 2>&1; then
    bad "fixture" "could not train the test checkpoint: $(tail -2 "$dir/train.log")"
    echo "test_infer: $passed passed, $failed failed, 0 skipped"; exit 1
fi
ck="$dir/run/ckpt_00000003.bin"
run() { timeout 120 ./infer_m2rnn_cpu -e "$ck" -q 1 "$@"; }
prompt="It was a dark and stormy night; the rain fell in torrents, except at occasional intervals"

a=$(run -p "$prompt" -n 24 -temp 0); b=$(run -p "$prompt" -n 24 -temp 0)
[ -n "$a" ] && [ "$a" = "$b" ] && ok "greedy repeats" "$(printf '%s' "$a" | wc -c) bytes" || bad "greedy repeats" "differ or empty"
a=$(run -p "$prompt" -n 24 -temp 0.9 -topk 50 -topp 0.95 -rp 1.3 -s 7)
b=$(run -p "$prompt" -n 24 -temp 0.9 -topk 50 -topp 0.95 -rp 1.3 -s 7)
c=$(run -p "$prompt" -n 24 -temp 0.9 -topk 50 -topp 0.95 -rp 1.3 -s 8)
[ "$a" = "$b" ] && [ "$a" != "$c" ] && ok "seeded sampling repeats" "seed 7 twice equal, seed 8 differs" || bad "seeded sampling repeats" "seed 7: [$a] [$b], seed 8: [$c]"
whole=$(run -p "$prompt" -n 24 -temp 0); chunks=$(run -p "$prompt" -n 24 -temp 0 -pc 3)
[ "$whole" = "$chunks" ] && ok "chunked prefill = whole prefill" "chunks of 3 tokens" || bad "chunked prefill = whole prefill" "[$whole] vs [$chunks]"
ctx=$(( $(run -p "$prompt" -n 0 -q 0 2>&1 >/dev/null | sed 's/.*context \([0-9]*\).*/\1/') + 24 ))
run -p "$prompt" -n 0 -c "$ctx" -save "$dir/state.bin" > /dev/null; resumed=$(run -load "$dir/state.bin" -n 24 -temp 0)
[ -s "$dir/state.bin" ] && [ "$whole" = "$resumed" ] && ok "saved state = uninterrupted run" "$(stat -c %s "$dir/state.bin") bytes of state" || bad "saved state = uninterrupted run" "[$whole] vs [$resumed]"
printf 'The old house\n%s\nA third prompt\n' "$prompt" > "$dir/prompts.txt"
batch=$(run -f "$dir/prompts.txt" -n 24 -temp 0 -j 1)
second=$(printf '%s\n' "$batch" | sed -n 2p | sed 's/.*"completion": "\(.*\)"}$/\1/')
alone=$(run -p "$prompt" -n 24 -temp 0 -j 1 | sed 's/.*"completion": "\(.*\)"}$/\1/')
[ "$(printf '%s\n' "$batch" | grep -c '"completion"')" = 3 ] && [ -n "$alone" ] && [ "$second" = "$alone" ] && ok "a prompt in a batch = alone" "3 JSONL results, the second equal to its own run" || bad "a prompt in a batch = alone" "[$second] vs [$alone]"
printf '{"prompt": "caf\\u00e9 \\"quoted\\"\\nnext"}\n\n{"prompt": "%s"}\n' "$prompt" > "$dir/prompts.jsonl"
out=$(run -f "$dir/prompts.jsonl" -n 5 -temp 0)
[ "$(printf '%s\n' "$out" | grep -c '^=== ')" = 2 ] && printf '%s' "$out" | grep -q 'café "quoted"' && ok "JSONL prompts" "2 prompts, escapes decoded" || bad "JSONL prompts" "$out"
stopped=$(run -p "$prompt" -n 24 -temp 0 -stop "$(printf '%s' "$whole" | cut -c5-8)")
[ "$stopped" = "$(printf '%s' "$whole" | cut -c1-4)" ] && ok "stop string" "generation ends before it, not printed" || bad "stop string" "[$stopped]"

# expect_refusal NAME WORD ARGS...: a clean refusal (one error line, one hint, non-zero exit, no signal)
expect_refusal() {
    local name="$1" word="$2"; shift 2
    local err rc
    err=$(timeout 60 ./infer_m2rnn_cpu "$@" 2>&1 >/dev/null); rc=$?
    local errors hints
    errors=$(printf '%s\n' "$err" | grep -c '^error: ')
    hints=$(printf '%s\n' "$err" | grep -c '^---> HINT: ')
    if [ "$rc" -ne 0 ] && [ "$rc" -lt 124 ] && [ "$errors" -eq 1 ] && [ "$hints" -eq 1 ] && printf '%s' "$err" | grep -qi -- "$word"; then
        ok "$name" "$(printf '%s\n' "$err" | grep '^error: ')"
    else
        bad "$name" "(exit $rc) $err"
    fi
}
head -c 3000 "$ck" > "$dir/truncated.bin"
: > "$dir/empty.txt"
printf '{"text": "no prompt field"}\n' > "$dir/noprompt.jsonl"
expect_refusal "missing checkpoint" "cannot open" -e "$dir/nope.bin" -p hi
expect_refusal "truncated checkpoint" "checkpoint" -e "$dir/truncated.bin" -p hi
expect_refusal "no checkpoint" "no checkpoint" -p hi
expect_refusal "tokenizer of another vocabulary" "tokenizer" -e "$ck" -p hi -tk dev/data/cl100k_tokenizer.bin
expect_refusal "missing tokenizer" "tokenizer" -e "$ck" -p hi -tk "$dir/none.bin"
expect_refusal "prompt longer than the context" "context" -e "$ck" -p "$prompt" -c 10 -n 5
expect_refusal "negative temperature" "temp" -e "$ck" -p hi -temp -1
expect_refusal "top-p above 1" "topp" -e "$ck" -p hi -topp 1.5
expect_refusal "empty prompt file" "no prompts" -e "$ck" -f "$dir/empty.txt"
expect_refusal "JSONL line without a prompt" "prompt" -e "$ck" -f "$dir/noprompt.jsonl"
expect_refusal "missing prompt file" "cannot open" -e "$ck" -f "$dir/none.txt"
expect_refusal "no prompt at all" "no prompt" -e "$ck"
expect_refusal "unknown flag" "unknown flag" -e "$ck" -p hi -zz 1
./train_m2rnn_cpu -e d32:MA -vs 50257 -i "$dir/fx/train_*.bin" -j "" -b 2 -t 16 -x 1 -o "$dir/other" -ex 0 > /dev/null 2>&1
expect_refusal "saved state of another model" "another model" -e "$dir/other/ckpt_00000001.bin" -load "$dir/state.bin"
expect_refusal "saved state with too short a context" "context" -e "$ck" -load "$dir/state.bin" -n 500
expect_refusal "damaged saved state" "saved decode state" -e "$ck" -load "$dir/prompts.txt"
echo "test_infer: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
