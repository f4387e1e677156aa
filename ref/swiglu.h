/*
ref/swiglu.h: the CPU reference of the SwiGLU feed-forward (the s row of layers.h), forward and hand-written
backward: up = x W_upᵀ (rows [0,F) gate, [F,2F) linear), h = SiLU(gate) ⊙ linear, out = h W_downᵀ; no biases.
Its decode step is the forward on one token per sequence (it has no state). GPU twin: swiglu.cuh (same names).
*/
#ifndef M2RNN_REF_SWIGLU_H
#define M2RNN_REF_SWIGLU_H

#include "ref/common.h"

typedef struct { SWIGLU_PARAMS(VIEW_FIELD) } SwiGLUParams; // the layer's tensors, in the layers.h row's order

typedef struct {
    real *up; // (B,T,2F) gate | linear
    real *h;  // (B,T,F) SiLU(gate) ⊙ linear
} SwiGLUActs;

static size_t swiglu_acts_layout(SwiGLUActs *a, real *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, F = (size_t)c->swiglu.hidden;
    Arena ar = {base, 0};
    a->up = arena_take(&ar, BT * 2 * F);
    a->h = arena_take(&ar, BT * F);
    return ar.used;
}
static size_t swiglu_ffn_acts_size(const ModelConfig *c, int B, int T) { SwiGLUActs a; return swiglu_acts_layout(&a, NULL, c, B, T); }
static size_t swiglu_ffn_scratch_size(const ModelConfig *c, int B, int T) { return swiglu_ffn_acts_size(c, B, T); }

// out (BT, C) = SwiGLU(inp (BT, C)) through the activations a
static void swiglu_ffn_apply(real *out, const SwiGLUActs *a, const real *inp, const SwiGLUParams *w, int C, int F,
                             int BT) {
    matmul_forward(a->up, inp, w->up_w, BT, C, 2 * F);
#pragma omp parallel for schedule(static)
    for (int m = 0; m < BT; m++) {
        const real *up = a->up + (size_t)m * 2 * F;
        real *h = a->h + (size_t)m * F;
        for (int i = 0; i < F; i++) { h[i] = siluf(up[i]) * up[F + i]; }
    }
    matmul_forward(out, a->h, w->down_w, BT, F, C);
}

static void swiglu_ffn_forward(real *out, real *acts, const real *inp, const KindTensors *t, const ModelConfig *c,
                               int B, int T) {
    SwiGLUActs a;
    swiglu_acts_layout(&a, acts, c, B, T);
    swiglu_ffn_apply(out, &a, inp, (const SwiGLUParams *)t->w, c->d_model, c->swiglu.hidden, B * T);
}

static void swiglu_ffn_backward(real *dinp, real *scratch, const real *dout, const real *inp, const real *acts,
                                const KindTensors *t, const ModelConfig *c, int B, int T) {
    const SwiGLUParams *w = (const SwiGLUParams *)t->w, *gw = (const SwiGLUParams *)t->g;
    SwiGLUActs a, g;
    swiglu_acts_layout(&a, (real *)acts, c, B, T);
    swiglu_acts_layout(&g, scratch, c, B, T);
    const int C = c->d_model, F = c->swiglu.hidden, BT = B * T;
    matmul_backward(g.h, gw->down_w, dout, a.h, w->down_w, BT, F, C);
#pragma omp parallel for schedule(static)
    for (int m = 0; m < BT; m++) {
        const real *up = a.up + (size_t)m * 2 * F, *dh = g.h + (size_t)m * F;
        real *dup = g.up + (size_t)m * 2 * F;
        for (int i = 0; i < F; i++) {
            dup[i] += dh[i] * up[F + i] * silu_grad(up[i]);
            dup[F + i] += dh[i] * siluf(up[i]);
        }
    }
    matmul_backward(dinp, gw->up_w, g.up, inp, w->up_w, BT, C, 2 * F);
}

static const KindOps SWIGLU_OPS = {'s', swiglu_ffn_acts_size, swiglu_ffn_scratch_size, swiglu_ffn_forward,
                                   swiglu_ffn_backward, NULL}; // stateless: decoding runs forward

#endif // M2RNN_REF_SWIGLU_H
