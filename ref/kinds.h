/*
ref/kinds.h: the CPU executor's table of layer kinds: every row of layers.h implemented by one file of ref/ behind the
KindOps interface (ref/common.h). The block (ref/lm.h) reaches a kind only through kind_ops(), which refuses a letter
without an implementation, so no letter can run another kind's code. A new kind adds its include and its line here.
*/
#ifndef M2RNN_REF_KINDS_H
#define M2RNN_REF_KINDS_H

#include "ref/common.h"
#include "ref/attention.h" // A: causal softmax attention (NoPE / RoPE / GQA)
#include "ref/gdn.h"       // G: Gated DeltaNet
#include "ref/gru.h"       // U: GRU baseline
#include "ref/m2rnn.h"     // M: M²RNN
#include "ref/mamba2.h"    // S: Mamba-2
#include "ref/moe.h"       // e: mixture of SwiGLU experts
#include "ref/rnn.h"       // R: RNN baseline
#include "ref/swiglu.h"    // s: SwiGLU feed-forward

static const KindOps *const REF_KINDS[] = {&M2RNN_OPS, &ATTENTION_OPS, &RNN_OPS, &GRU_OPS, &GDN_OPS, &MAMBA2_OPS,
                                           &SWIGLU_OPS, &MOE_OPS};

static const KindOps *kind_ops(char letter) {
    for (size_t i = 0; i < sizeof(REF_KINDS) / sizeof(REF_KINDS[0]); i++) {
        if (REF_KINDS[i]->letter == letter) { return REF_KINDS[i]; }
    }
    fail_with_hint("add the kind's file to ref/kinds.h", "layer kind '%c' has no CPU implementation", letter);
}

#endif // M2RNN_REF_KINDS_H
