#!/usr/bin/env bash
# The inference engine on the GPU machine: builds, the trainer test (which holds the GPU prefill and steps to the
# forward), GPU against CPU greedy generation on small checkpoints of each GPU mixer kind and a hybrid (trained here
# for 150 steps on the default corpus), the GPU sampler against the host's (test_sample_gpu), and the speed benchmark
# (dev/bench/bench_infer.cu) on 410M-shaped models, the generation loop with its sampling included (-sample).
# With skinny: the decode step's products (test_decode_gpu), the skinny tensor-core product against cuBLASLt
# (bench_skinny), and the decode step at 16-64 sequences with it and without (M2RNN_SKINNY=0). With gemv: the decode
# step at 1-8 sequences with the GEMV's products (up to 4 rows) and with every product on the tensor cores
# (M2RNN_GEMV_MAX_M=0), for the three 410M models.
# usage: bash scripts/gpu_infer.sh [test] [greedy] [bench] [skinny] [gemv]   (default: test greedy bench; needs
# dev/data/gutenberg and the tokenizer)
set -uo pipefail
parts=${*:-test greedy bench}
mkdir -p build
make -j16 train_m2rnn infer_m2rnn infer_m2rnn_cpu build/test_gpu_trainer build/test_gpu_trainer_fp32 build/bench_infer \
    build/test_sample_gpu build/test_sample_gpu_fp32 \
    > /tmp/infer_build.log 2>&1 || { tail -30 /tmp/infer_build.log; exit 1; }
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I. -DENABLE_FP32 -o build/infer_m2rnn_fp32 infer_m2rnn.cu \
    -lcublas -lcublasLt || exit 1
for p in $parts; do
    echo "=== $p"
    case $p in
        test) ./build/test_gpu_trainer | grep -v '^PASS'; ./build/test_gpu_trainer | grep 'prefill\|decode ='
              ./build/test_gpu_trainer_fp32 | grep -v '^PASS'; ./build/test_gpu_trainer_fp32 | grep 'prefill\|decode ='
              ./build/test_sample_gpu; ./build/test_sample_gpu_fp32 | grep -v '^PASS' ;;
        greedy)
            prompt="Alice was beginning to get very tired of sitting by her sister on the bank"
            for pat in d128:MMMM d128:AAAA:rope d128:RRRR d128:UUUU d128:GGGG d128:SSSS d128:MARU:rope; do
                dir=/tmp/greedy_${pat//[:]/_}
                rm -rf "$dir"
                ./train_m2rnn -e "$pat" -i 'dev/data/gutenberg/gutenberg_train_*.bin' -j '' -b 8 -t 128 -x 150 -l 3e-3 \
                    -o "$dir" -ex 0 > "$dir.log" 2>&1 || { echo "$pat: training failed: $(tail -2 "$dir.log")"; continue; }
                ck=$(ls "$dir"/ckpt_*.bin | tail -1)
                cpu=$(./infer_m2rnn_cpu -e "$ck" -p "$prompt" -n 48 -temp 0 -q 1)
                f32=$(./build/infer_m2rnn_fp32 -e "$ck" -p "$prompt" -n 48 -temp 0 -q 1)
                b16=$(./infer_m2rnn -e "$ck" -p "$prompt" -n 48 -temp 0 -q 1)
                b16c=$(./infer_m2rnn -e "$ck" -p "$prompt" -n 48 -temp 0 -q 1 -pc 5)
                common() { local a="$1" b="$2" i=0; while [ $i -lt ${#a} ] && [ "${a:$i:1}" = "${b:$i:1}" ]; do i=$((i+1)); done; echo $i; }
                echo "$pat: loss $(grep -o 'final train loss [0-9.]*' "$dir.log" | awk '{print $4}') | CPU ${#cpu} bytes |" \
                     "GPU fp32 build = CPU: $([ "$cpu" = "$f32" ] && echo yes || echo "no, first $(common "$cpu" "$f32") bytes") |" \
                     "GPU bf16 = CPU: $([ "$cpu" = "$b16" ] && echo yes || echo "no, first $(common "$cpu" "$b16") bytes") |" \
                     "bf16 prefill in chunks of 5 = whole: $([ "$b16" = "$b16c" ] && echo yes || echo "no, first $(common "$b16" "$b16c") bytes")"
                printf '  CPU:  %s\n  bf16: %s\n' "$(printf '%s' "$cpu" | tr '\n' ' ' | cut -c1-150)" "$(printf '%s' "$b16" | tr '\n' ' ' | cut -c1-150)"
            done ;;
        bench)
            ./build/bench_infer d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84 100352
            ./build/bench_infer d1024:AAAAAAAAAAAAAAAAAAAAAAAA:rope 100352
            ./build/bench_infer d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84 100352 -sample 1 16 64 ;;
        skinny)
            make -j16 build/test_decode_gpu build/bench_skinny > /tmp/infer_build.log 2>&1 || { tail -30 /tmp/infer_build.log; exit 1; }
            ./build/test_decode_gpu | grep -v '^PASS'
            ./build/bench_skinny 16 32 64
            for D in d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84 d1024:MGGGAGGGGGGGAGGGGGGGAGGG:n84; do
                for s in 0 1 0 1; do
                    echo "M2RNN_SKINNY=$s $D"; M2RNN_SKINNY=$s ./build/bench_infer $D 100352 -decode 16 32 64 | grep decode
                done
            done ;;
        gemv)
            for D in d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84 d1024:MGGGAGGGGGGGAGGGGGGGAGGG:n84 d1024:AAAAAAAAAAAAAAAAAAAAAAAA:rope; do
                for g in 4 0 4 0; do
                    echo "M2RNN_GEMV_MAX_M=$g $D"
                    M2RNN_GEMV_MAX_M=$g ./build/bench_infer $D 100352 -decode 1 2 3 4 5 6 7 8 | grep decode
                done
            done ;;
    esac
done
