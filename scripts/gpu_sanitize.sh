#!/usr/bin/env bash
# compute-sanitizer on the GPU machine: memcheck (out-of-bounds and misaligned accesses, errors of the CUDA API) and
# racecheck (shared-memory hazards) over a short run of the CUDA trainer on a tiny hybrid with every layer kind
# (M²RNN on the tensor-core kernels, attention, RNN, GRU, SwiGLU): forward, backward, AdamW, a checkpoint, the end
# of run export, and decoding (the text samples). Also the same in the fp32 build (the plain recurrence).
# usage: OUT=dir bash scripts/gpu_sanitize.sh   (needs dev/data/gutenberg shards and dev/data/gpt2_tokenizer.bin)
set -uo pipefail
OUT=${OUT:-build/gpu_out}
mkdir -p "$OUT" build
make -j16 train_m2rnn > "$OUT/build_sanitize.log" 2>&1 || { tail -20 "$OUT/build_sanitize.log"; exit 1; }
cp train_m2rnn build/train_m2rnn_bf16
make -j16 PRECISION=FP32 -B train_m2rnn > "$OUT/build_sanitize_fp32.log" 2>&1 || { tail -20 "$OUT/build_sanitize_fp32.log"; exit 1; }
cp train_m2rnn build/train_m2rnn_fp32
RUN=(-e d128:MRUA:n8:k16:rh8 -b 2 -t 64 -x 3 -v 2 -m 1 -sg 2 -g 8 -n 2)
for bin in bf16 fp32; do
    for tool in memcheck racecheck; do
        rm -rf "$OUT/san_$bin"
        compute-sanitizer --tool $tool --error-exitcode 9 ./build/train_m2rnn_$bin "${RUN[@]}" -o "$OUT/san_$bin" \
            > "$OUT/sanitize_${bin}_$tool.log" 2>&1
        rc=$?
        echo "$tool $bin: exit $rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_${bin}_$tool.log" | tail -1)"
    done
done
rm -rf "$OUT/san_bf16" "$OUT/san_fp32"
