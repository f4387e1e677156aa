#!/usr/bin/env bash
# prepare_large.sh: the ~17M-token registry mix (make data-large). Fetches the Debian packages python3.11-doc and
# linux-doc-6.1 with `apt-get download` and unpacks them with dpkg-deb into dev/data/large/debian (no system
# install, no root needed beyond apt's cache), cleans everything with prepare_large.js, and writes GPT-2 shards:
#   dev/data/large/large_train_*.bin (5M tokens per shard), dev/data/large/large_val_*.bin
# Run from the repository root after `make tokenize dev/data/gpt2_tokenizer.bin` (the Makefile target does).
set -euo pipefail
OUT=dev/data/large
DEB=$OUT/debs
ROOT=$OUT/debian
mkdir -p "$DEB" "$ROOT"
for pkg in python3.11-doc linux-doc-6.1; do
    if ! ls "$DEB"/${pkg}_*.deb > /dev/null 2>&1; then
        if ! (cd "$DEB" && apt-get download "$pkg"); then
            echo "error: apt-get download $pkg failed" >&2
            echo "---> HINT: run 'apt-get update' once (as root) so apt knows the package, then make data-large again" >&2
            exit 1
        fi
    fi
    dpkg-deb -x "$DEB"/${pkg}_*.deb "$ROOT"
done
node dev/data/prepare_large.js "$OUT" "$ROOT"
./tokenize shard --input "$OUT/large_val.txt" --out "$OUT/large_val"
./tokenize shard --input "$OUT/large_train.txt" --out "$OUT/large_train" --shard-tokens 5000000
