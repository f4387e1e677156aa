/*
infer_m2rnn.cu: text generation on one GPU (./infer_m2rnn): the GPU executor (lm.cuh) under the generation program of
infer.h, the same program ./infer_m2rnn_cpu runs on the CPU (infer_m2rnn.c). Prompts are prefilled through the
training forward's kernels from the decode states (in chunks), then each step runs every layer's single-token kernel
(the M²RNN step kernel, the split-context attention decode kernel, ...). M2RNN_DEVICE picks the GPU.
main() sits inside #ifndef TESTING.
*/
#include "utils.h"  // defines: check macros, fail_with_hint, CLI number parsing
#include "lm.cuh"   // defines: the GPU executor (Model and executor.h's API) and every layer kind's GPU ops
#include "infer.h"  // defines: InferOptions, the CLI, prompts, sampling, saved states, infer_run

#ifndef TESTING
int main(int argc, char **argv) {
    program_name = "./infer_m2rnn";
    InferOptions o = infer_options_default();
    infer_parse_args(&o, argc, argv);
    infer_run(&o);
    return 0;
}
#endif
