/*
kinds.cuh: the GPU executor's table of layer kinds: every row of layers.h implemented by one .cuh file behind the
KindOps interface (common.cuh), the twin of ref/kinds.h. The block (lm.cuh) reaches a kind only through kind_ops(),
which refuses a letter without an implementation. A new kind adds its include and its line here.
*/
#ifndef M2RNN_KINDS_CUH
#define M2RNN_KINDS_CUH

#include "common.cuh"
#include "attention.cuh" // A: causal softmax attention (NoPE / RoPE)
#include "gdn.cuh"       // G: Gated DeltaNet
#include "gru.cuh"       // U: GRU baseline
#include "m2rnn.cuh"     // M: M²RNN
#include "mamba2.cuh"    // S: Mamba-2
#include "moe.cuh"       // e: mixture of experts
#include "rnn.cuh"       // R: RNN baseline
#include "swiglu.cuh"    // s: SwiGLU feed-forward

static const KindOps *const GPU_KINDS[] = {&M2RNN_OPS, &ATTENTION_OPS, &RNN_OPS, &GRU_OPS, &SWIGLU_OPS, &MOE_OPS, &GDN_OPS, &MAMBA2_OPS};

static const KindOps *kind_ops(char letter) {
    for (size_t i = 0; i < sizeof(GPU_KINDS) / sizeof(GPU_KINDS[0]); i++) {
        if (GPU_KINDS[i]->letter == letter) { return GPU_KINDS[i]; }
    }
    const LayerKind *row = mixer_kind(letter) != NULL ? mixer_kind(letter) : ffn_kind(letter);
    fail_with_hint("train this model with ./train_m2rnn_cpu (the CPU reference has every kind), or use the kinds the GPU "
                   "has: M, A, R, U, G, S, s, e",
                   "layer kind '%c' (%s) has no GPU implementation yet", letter, row != NULL ? row->name : "unknown");
}

#endif // M2RNN_KINDS_CUH
