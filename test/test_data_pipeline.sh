#!/usr/bin/env bash
# test_data_pipeline.sh: end-to-end checks of the data pipeline and the ./tokenize CLI (run by make test).
# - make data: the default corpus exists at the paths the trainer uses, headers are llm.c's, and decoding every
#   token of every shard gives back exactly "<|endoftext|>" + the cleaned documents joined by "<|endoftext|>"
#   (so EOT precedes every document and nothing is lost or altered); train and val hold different books.
# - the same for data-large and data-cl100k when they have been prepared (skipped otherwise: they take longer).
# - the CLI: encode/decode round trip of arbitrary bytes for both encodings, and refusals of bad input.
set -u
cd "$(dirname "$0")/.."
pass=0; fail=0; skip=0
ok()   { echo "PASS $1 ${2:-}"; pass=$((pass + 1)); }
bad()  { echo "FAIL $1 ${2:-}"; fail=$((fail + 1)); }
skp()  { echo "SKIP $1 $2"; skip=$((skip + 1)); }
check() { if eval "$2"; then ok "$1" "${3:-}"; else bad "$1" "${3:-}"; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ids of a shard (header checked), one per line
shard_ids() {
    local f=$1 magic width
    magic=$(od -An -t d4 -N4 "$f" | tr -d ' ')
    if [ "$magic" = "20240520" ]; then width=2; else width=4; fi
    od -An -v -t u$width -j1024 "$f" | tr -s ' ' '\n' | sed '/^$/d'
}

# shard_header FILE -> "magic version ntok"
shard_header() { od -An -t d4 -N12 "$1" | xargs; }

# decoded shards == EOT + documents joined by EOT
check_corpus() {
    local name=$1 glob=$2 text=$3 enc=$4 magic=$5
    local files; files=$(ls $glob 2>/dev/null)
    if [ -z "$files" ]; then bad "${name}_shards_exist" "no files match $glob"; return; fi
    local hdr_ok=1 total=0
    for f in $files; do
        read -r m v n <<< "$(shard_header "$f")"
        local width=2; [ "$m" = "20240801" ] && width=4
        local expect=$((1024 + n * width))
        if [ "$m" != "$magic" ] || [ "$(stat -c %s "$f")" != "$expect" ]; then hdr_ok=0; fi
        total=$((total + n))
    done
    check "${name}_headers" "[ $hdr_ok = 1 ]" "$(echo $files | wc -w) shard(s), magic $magic, sizes = 1024 + ntok*width, $total tokens"
    for f in $files; do shard_ids "$f"; done > "$tmp/ids"
    ./tokenize decode --encoding "$enc" < "$tmp/ids" > "$tmp/decoded"
    { printf '<|endoftext|>'; cat "$text"; } > "$tmp/expected"
    check "${name}_decodes_to_documents" "cmp -s '$tmp/decoded' '$tmp/expected'" "every token decoded = EOT + docs joined by EOT ($(stat -c %s "$text") bytes)"
}

if make -s data > "$tmp/make.log" 2>&1; then
    ok "make_data" "$(grep -c 'tokens' "$tmp/make.log") lines of output"
    check_corpus gutenberg_train "dev/data/gutenberg/gutenberg_train_*.bin" dev/data/gutenberg/gutenberg_train.txt gpt2 20240520
    check_corpus gutenberg_val "dev/data/gutenberg/gutenberg_val_*.bin" dev/data/gutenberg/gutenberg_val.txt gpt2 20240520
    check "gutenberg_val_held_out" "grep -q '^\[Alice' dev/data/gutenberg/gutenberg_val.txt && ! grep -q '^\[Alice' dev/data/gutenberg/gutenberg_train.txt" "carroll-alice only in val"
    check "gpt2_tokenizer_file" "[ -s dev/data/gpt2_tokenizer.bin ]" "dev/data/gpt2_tokenizer.bin"
else
    bad "make_data" "$(tail -3 "$tmp/make.log")"
fi
if [ -f dev/data/large/.done ]; then
    check_corpus large_val "dev/data/large/large_val_*.bin" dev/data/large/large_val.txt gpt2 20240520
    check_corpus large_train "dev/data/large/large_train_*.bin" dev/data/large/large_train.txt gpt2 20240520
else
    skp large_corpus "dev/data/large not prepared (make data-large)"
fi
if [ -f dev/data/gutenberg_cl100k/.done ]; then
    check_corpus cl100k_val "dev/data/gutenberg_cl100k/gutenberg_val_*.bin" dev/data/gutenberg_cl100k/gutenberg_val.txt cl100k 20240801
else
    skp cl100k_corpus "dev/data/gutenberg_cl100k not prepared (make data-cl100k)"
fi

# CLI round trip on arbitrary bytes (random, so invalid UTF-8 included), both encodings
head -c 200000 /dev/urandom > "$tmp/random.bin"
cat dev/data/gutenberg/gutenberg_val.txt "$tmp/random.bin" > "$tmp/mixed.bin" 2>/dev/null || cp "$tmp/random.bin" "$tmp/mixed.bin"
for enc in gpt2 cl100k; do
    ./tokenize encode --encoding "$enc" < "$tmp/mixed.bin" > "$tmp/ids.$enc"
    ./tokenize decode --encoding "$enc" < "$tmp/ids.$enc" > "$tmp/back.$enc"
    check "cli_roundtrip_$enc" "cmp -s '$tmp/mixed.bin' '$tmp/back.$enc'" "$(wc -l < "$tmp/ids.$enc") ids for $(stat -c %s "$tmp/mixed.bin") bytes"
done
check "cli_encode_hello" "[ \"\$(printf 'Hello world' | ./tokenize encode | xargs)\" = '15496 995' ]" "Hello world -> 15496 995"
check "cli_eot_flag" "[ \"\$(printf 'hello<|endoftext|>' | ./tokenize encode --eot | xargs)\" = '31373 50256' ]" "--eot maps the literal to 50256"
refuses() { "$@" > /dev/null 2> "$tmp/err" < "$tmp/in"; local rc=$?; [ $rc = 1 ] && grep -q '^error:' "$tmp/err" && grep -q -- '---> HINT:' "$tmp/err"; }
echo "12 abc" > "$tmp/in"
check "cli_refuses_bad_id" "refuses ./tokenize decode" "'12 abc' is refused with error + HINT"
echo "50257" > "$tmp/in"
check "cli_refuses_out_of_vocab_id" "refuses ./tokenize decode" "id 50257 is not gpt2"
check "cli_refuses_unknown_command" "refuses ./tokenize frobnicate" ""
check "cli_refuses_unknown_encoding" "refuses ./tokenize encode --encoding o200k" ""
check "cli_refuses_missing_tokenizer" "refuses ./tokenize encode --tokenizer $tmp/none.bin" ""

echo "test_data_pipeline: $pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
