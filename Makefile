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
NVCCFLAGS += -std=c++17 $(NVCC_ARCH) -I. -Xcompiler -Wall,-Wno-unused-function
NVCC_LDLIBS = -lcublas -lcublasLt

.PHONY: all cpu cuda test train clean

# ---------------------------------------------------------------------------------------------------------------
# CPU reference trainer and its tests

CPU_PROGRAMS = train_m2rnn
CPU_TESTS = build/test_gradcheck build/test_m2rnn_ref build/test_train test/test_cli.sh

REF_HEADERS = utils.h model.h checkpoint.h dataloader.h ref/common.h ref/m2rnn.h ref/attention.h ref/mlp.h

train_m2rnn: train_m2rnn.c $(REF_HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# the tests #include train_m2rnn.c (its main() sits inside #ifndef TESTING)
build/test_%: test/test_%.c train_m2rnn.c $(REF_HEADERS) test/test_common.h
	@mkdir -p build
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# the bad-input CLI test drives the real binary
test/test_cli.sh: train_m2rnn

# ---------------------------------------------------------------------------------------------------------------
# tokenizer and data pipeline (tokenizer.h, dataloader.h, dev/data/)

DATA_PROGRAMS =
DATA_TESTS = build/test_dataloader

build/test_dataloader: test/test_dataloader.c dataloader.h utils.h test/test_common.h
	@mkdir -p build
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# ---------------------------------------------------------------------------------------------------------------
# CUDA programs, tests and benchmarks (built only where nvcc exists)

CUDA_PROGRAMS =
CUDA_TESTS =

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
