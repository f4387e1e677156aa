/*
train_m2rnn.cu: the CUDA trainer (./train_m2rnn) on one GPU, or one process per GPU over MPI + NCCL (comm.h; the
data-parallel path is in lm.cuh). The model is lm.cuh (the GPU executor: the block written once over the layer-kind
table, each kind's kernels in its own .cuh), the training run is train_loop.h (CLI, schedule, validation, samples,
checkpoints, exact resume), shared with the CPU reference train_m2rnn.c, which only swaps the executor.
M2RNN_DEVICE picks the GPU (default: the process's rank on its node). main() sits inside #ifndef TESTING so tests
and benchmarks include the program.
*/
#include "utils.h"      // defines: check macros, fail_with_hint, CLI number parsing
#include "lm.cuh"       // defines: the GPU executor (Model and executor.h's API) and every layer kind's GPU ops
#include "train_loop.h" // defines: TrainOptions, the CLI, lr schedule, validation, samples, checkpoints, train_run

#ifndef TESTING
int main(int argc, char **argv) {
    Comm comm;
    comm_init(&comm, &argc, &argv); // MPI when built with it (mpirun -np N): comm.h
    TrainOptions o = train_options_default();
    parse_args(&o, argc, argv);
    comm_set_layout(&comm, o.tp);
    o.comm = &comm;
    train_run(&o);
    comm_finalize(&comm);
    return 0;
}
#endif
