/*
infer_m2rnn.c: text generation on the CPU (./infer_m2rnn_cpu): the CPU reference executor (ref/lm.h) under the
generation program of infer.h, the same program ./infer_m2rnn runs on the GPU (infer_m2rnn.cu). Reads the checkpoints
of either trainer (both store fp32 master weights). main() sits inside #ifndef TESTING.
*/
#include "utils.h"   // defines: check macros, fail_with_hint, CLI number parsing
#include "ref/lm.h"  // defines: the CPU executor (Model and executor.h's API) and every layer kind's CPU ops
#include "infer.h"   // defines: InferOptions, the CLI, prompts, sampling, saved states, infer_run

#ifndef TESTING
int main(int argc, char **argv) {
    program_name = "./infer_m2rnn_cpu";
    InferOptions o = infer_options_default();
    infer_parse_args(&o, argc, argv);
    infer_run(&o);
    return 0;
}
#endif
