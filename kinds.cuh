/*
kinds.cuh: the GPU executor's table of layer kinds: every row of layers.h implemented by one .cuh file behind the
KindOps interface (common.cuh), the twin of ref/kinds.h. The block (lm.cuh) reaches a kind only through kind_ops(),
which refuses a letter without an implementation. A new kind adds its include and its line here.
*/
#ifndef M2RNN_KINDS_CUH
#define M2RNN_KINDS_CUH

#include "common.cuh"
#include "attention.cuh" // A: causal softmax attention (NoPE / RoPE)
#include "gru.cuh"       // U: GRU baseline
#include "m2rnn.cuh"     // M: M²RNN
#include "rnn.cuh"       // R: RNN baseline
#include "swiglu.cuh"    // s: SwiGLU feed-forward

static const KindOps *const GPU_KINDS[] = {&M2RNN_OPS, &ATTENTION_OPS, &RNN_OPS, &GRU_OPS, &SWIGLU_OPS};

static const KindOps *kind_ops(char letter) {
    for (size_t i = 0; i < sizeof(GPU_KINDS) / sizeof(GPU_KINDS[0]); i++) {
        if (GPU_KINDS[i]->letter == letter) { return GPU_KINDS[i]; }
    }
    fail_with_hint("add the kind's file to kinds.cuh", "layer kind '%c' has no GPU implementation", letter);
}

#endif // M2RNN_KINDS_CUH
