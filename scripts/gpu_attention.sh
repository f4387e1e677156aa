#!/usr/bin/env bash
# Flash attention on the GPU machine in one call: builds, then the parts asked for (default: all but profile):
#   test    test_attention_gpu (the kernels against float64), test_gpu_trainer in bf16 and fp32 (the model)
#   train   bench_attention at the training shapes      decode  bench_attention -d 1 (decode against the cache)
#   torch   PyTorch SDPA flash and cuDNN, same shapes    step    bench_train_step: Transformer++ and the hybrids
#   before  the step of BEFORE_DIR's build beside ours (scripts/gpu_step_compare.sh)
#   profile the per-kernel split of one Transformer++ step (ncu) → $OUT/ncu_*.csv and a table
# usage: bash scripts/gpu_attention.sh [parts...]    (BEFORE_DIR=.peers/before by default)
set -uo pipefail
parts=${*:-test train decode torch step before}
OUT=${OUT:-/tmp}
mkdir -p build
source scripts/cudnn_env.sh
targets="build/test_attention_gpu build/bench_attention"
case " $parts " in *" test "*) targets="$targets build/test_gpu_trainer build/test_gpu_trainer_fp32" ;; esac
case " $parts " in *" step "*|*" profile "*) targets="$targets build/bench_train_step" ;; esac
case " $parts " in *" before "*) ( cd "${BEFORE_DIR:-.peers/before}" && mkdir -p build && make -j8 build/bench_train_step \
    > /tmp/base_build.log 2>&1 ) & ;; esac
make -j16 $targets > /tmp/attn_build.log 2>&1 || { tail -30 /tmp/attn_build.log; exit 1; }
TPP="d1024:AAAAAAAAAAAAAAAAAAAAAAAA:rope"
for p in $parts; do
    echo "=== $p"
    case $p in
        test) ./build/test_attention_gpu; ./build/test_gpu_trainer; ./build/test_gpu_trainer_fp32 ;;
        train) ./build/bench_attention ;;
        decode) ./build/bench_attention -d 1 ;;
        torch) python3 dev/bench/attention_torch.py ;;
        step)
            for m in "$TPP 8 4096 10 3 100352" "d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84 8 4096 10 3 100352" \
                     "d1024:MAAAAAAAAAAAAAAAAAAAAAAA:n84 8 4096 10 3 100352" "d768:MMMAMMMAMMMA 16 1024 10 3 50257"; do
                ./build/bench_train_step $m 2>&1 | grep -E "^attention:|^\|" | tail -2
            done
            echo "--- the Transformer++ with M2RNN_DETERMINISTIC=1 (cuDNN's deterministic backward)"
            M2RNN_DETERMINISTIC=1 ./build/bench_train_step $TPP 8 4096 10 3 100352 2>&1 | grep -E "^attention:|^\|" | tail -2
            echo "--- the Transformer++ on our own attention kernels (M2RNN_ATTENTION=ours)"
            M2RNN_ATTENTION=ours ./build/bench_train_step $TPP 8 4096 10 3 100352 2>&1 | tail -1 ;;
        before) bash scripts/gpu_step_compare.sh "${BEFORE_DIR:-.peers/before}" ;;
        profile)
            ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
                ./build/bench_train_step $TPP 8 4096 1 0 100352 > $OUT/ncu_tpp.csv 2> /tmp/ncu.err || tail -5 /tmp/ncu.err
            python3 dev/bench/ncu_split.py $OUT/ncu_tpp.csv 30 ;;
    esac
done
