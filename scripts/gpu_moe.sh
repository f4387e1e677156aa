#!/usr/bin/env bash
# gpu_moe.sh: the mixture-of-experts layer on the GPU in one call: its tests (test_moe_gpu bf16 and fp32 against the
# CPU reference), a model with MoE feed-forwards trained by the fp32 CUDA trainer beside the CPU reference (20 steps
# on the test fixtures: the losses must track), the layer benchmark beside PyTorch (bench_moe.cu, moe_torch.py),
# and the paper's 7B shape at reduced depth (8 layers, B·T = 16K) training on one GPU.
# usage: bash scripts/gpu_moe.sh [OUT_DIR]   (the default corpus dev/data/gutenberg must be there: carry it)
set -uo pipefail
cd "$(dirname "$0")/.."
OUTD=${1:-${OUT:-/tmp/gpu_moe}}
mkdir -p "$OUTD"
nvidia-smi -L
make -j16 build/test_moe_gpu build/test_moe_gpu_fp32 build/bench_moe train_m2rnn build/train_m2rnn_fp32 \
    train_m2rnn_cpu build/test_train build/test_gpu_trainer > "$OUTD/build.log" 2>&1 || { tail -30 "$OUTD/build.log"; exit 1; }
./build/test_moe_gpu | tee "$OUTD/test_moe_gpu.txt"
./build/test_moe_gpu_fp32 | tee "$OUTD/test_moe_gpu_fp32.txt"
# a whole model with MoE layers: the fp32 GPU trainer against the CPU reference, 20 steps on the fixtures
dir=build/gpu_moe_train; rm -rf "$dir"; mkdir -p "$dir"
./build/test_train --fixtures "$dir/fx" > /dev/null 2>&1
A=(-e d64:MAMA:ffn=e:xe8:xk2:xf32:xs32:rope -vs 61 -i "$dir/fx/train_*.bin" -j "$dir/fx/val_*.bin" -t 32 -b 4 -x 20 -v 10 -m 2 -u 2 -ex 0)
./build/train_m2rnn_fp32 "${A[@]}" -o "$dir/gpu" > "$OUTD/moe_gpu_fp32.txt" 2>&1 || tail -5 "$OUTD/moe_gpu_fp32.txt"
./train_m2rnn_cpu "${A[@]}" -o "$dir/cpu" > "$OUTD/moe_cpu.txt" 2>&1 || tail -5 "$OUTD/moe_cpu.txt"
losses() { grep -o 'trl:[0-9.]*\|tel:[0-9.]*\|aux:[0-9.]*' "$1/main.log" | cut -d: -f2; }
w=$(paste <(losses "$dir/gpu") <(losses "$dir/cpu") | awk 'BEGIN{w=0;n=0} {d=($1-$2)/$2; if(d<0)d=-d; if(d>w)w=d; n++} END{if(n<40) print "missing"; else printf("%.2e", w)}')
echo "MoE model, fp32 GPU trainer vs CPU reference, 20 steps (losses, aux losses, validations): largest relative difference $w"
./train_m2rnn "${A[@]}" -o "$dir/bf16" > "$OUTD/moe_gpu_bf16.txt" 2>&1 && tail -3 "$OUTD/moe_gpu_bf16.txt"
./build/test_gpu_trainer 2>&1 | tail -1
# the layer beside PyTorch
./build/bench_moe | tee "$OUTD/bench_moe.txt"
python3 dev/bench/moe_torch.py 2>&1 | tee "$OUTD/moe_torch.txt"
# the 7B shape at reduced depth: d=1536, the first 8 layers of the paper's pattern, B·T = 16K
./train_m2rnn -e d1536:MMMMAMMM:n132:ffn=e:xe128:xk8:xf256:xs1024 -vs 100352 -i 'dev/data/gutenberg/gutenberg_train_*.bin' \
    -j "" -b 4 -t 4096 -x 12 -u 2 -ex 0 > "$OUTD/moe7b_8l.txt" 2>&1; sed -n '1,14p;$p' "$OUTD/moe7b_8l.txt"; tail -4 "$OUTD/moe7b_8l.txt"
