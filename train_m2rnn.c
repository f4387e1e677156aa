/*
train_m2rnn.c: the fp32 CPU reference trainer (./train_m2rnn_cpu, OpenMP). The model is ref/lm.h (the CPU executor:
the block written once over the layer-kind table, every op a plain loop with a hand-written backward), the training
run is train_loop.h (CLI, schedule, validation, samples, checkpoints, exact resume), shared with the CUDA trainer
train_m2rnn.cu, which only swaps the executor. main() sits inside #ifndef TESTING so tests include the program.

Build with -DM2RNN_REAL_DOUBLE to get the same code in float64 (the gradient checks do).
*/
#include "utils.h"      // defines: check macros, fail_with_hint, CLI number parsing
#include "ref/lm.h"     // defines: the CPU executor (Model and executor.h's API) and every layer kind's CPU ops
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
