#!/usr/bin/env bash
# Exact resume on the GPU, for scripts/gpu_trainer.sh and scripts/gpu_issue17.sh: 30 steps with a checkpoint at 15,
# then a resume from that checkpoint in a fresh directory; the two step-30 checkpoints (weights, AdamW state, loader
# state) must be identical byte for byte. With M2RNN_DETERMINISTIC=1 the tensor-core M²RNN backward sums dq/dk in a
# fixed order too (by default it uses fp32 atomics). Prints one PASS or FAIL line a model (MMAM, RUAM).
#   bash scripts/gpu_resume.sh TRAINER OUT [DATA]   TRAINER: the train_m2rnn binary; OUT: a folder for the runs and
#                                                   logs; DATA: the default corpus's shards (dev/data/gutenberg)
set -u
TRAINER=$1 OUT=$2 DATA=${3:-dev/data/gutenberg}
export M2RNN_DETERMINISTIC=1
for pattern in MMAM RUAM; do
    RES=(-e d128:$pattern -b 8 -t 128 -x 30 -d 2048 -l 1e-3 -u 5 -v 10 -m 2 -n 15
         -i "$DATA/gutenberg_train_*.bin" -j "$DATA/gutenberg_val_*.bin")
    rm -rf "$OUT/resume_a" "$OUT/resume_b"; mkdir -p "$OUT/resume_b"
    "$TRAINER" "${RES[@]}" -o "$OUT/resume_a" > "$OUT/resume_a.log" 2>&1
    cp "$OUT/resume_a/ckpt_00000015.bin" "$OUT/resume_b/" 2>/dev/null
    "$TRAINER" "${RES[@]}" -o "$OUT/resume_b" -y 1 > "$OUT/resume_b.log" 2>&1
    if cmp -s "$OUT/resume_a/ckpt_00000030.bin" "$OUT/resume_b/ckpt_00000030.bin"; then
        echo "PASS GPU resume of $pattern at step 15 of 30 is bit-exact"
    else echo "FAIL GPU resume of $pattern differs"; tail -3 "$OUT/resume_a.log" "$OUT/resume_b.log"; fi
done
rm -rf "$OUT/resume_a" "$OUT/resume_b"
