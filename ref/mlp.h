/*
ref/mlp.h: the CPU reference of the SwiGLU MLP, forward and hand-written backward:
up = x W_upᵀ (rows [0,F) gate, [F,2F) linear), h = SiLU(gate) ⊙ linear, out = h W_downᵀ; no biases.
*/
#ifndef M2RNN_REF_MLP_H
#define M2RNN_REF_MLP_H

#include "ref/common.h"

typedef struct {
    real *up; // (B,T,2F) gate | linear
    real *h;  // (B,T,F) SiLU(gate) ⊙ linear
} MLPActs;

typedef struct { real *up, *h; } MLPGrads; // gradient scratch, same shapes

static void swiglu_mlp_forward(real *out, MLPActs *a, const real *inp, const LayerWeights *w, const ModelConfig *c,
                               int BT) {
    const int C = c->d_model, F = c->mlp_hidden;
    matmul_forward(a->up, inp, w->mlp_up_w, BT, C, 2 * F);
#pragma omp parallel for schedule(static)
    for (int m = 0; m < BT; m++) {
        const real *up = a->up + (size_t)m * 2 * F;
        real *h = a->h + (size_t)m * F;
        for (int i = 0; i < F; i++) { h[i] = siluf(up[i]) * up[F + i]; }
    }
    matmul_forward(out, a->h, w->mlp_down_w, BT, F, C);
}

static void swiglu_mlp_backward(real *dinp, LayerWeights *gw, MLPGrads *g, const real *dout, const real *inp,
                                const MLPActs *a, const LayerWeights *w, const ModelConfig *c, int BT) {
    const int C = c->d_model, F = c->mlp_hidden;
    matmul_backward(g->h, gw->mlp_down_w, dout, a->h, w->mlp_down_w, BT, F, C);
#pragma omp parallel for schedule(static)
    for (int m = 0; m < BT; m++) {
        const real *up = a->up + (size_t)m * 2 * F, *dh = g->h + (size_t)m * F;
        real *dup = g->up + (size_t)m * 2 * F;
        for (int i = 0; i < F; i++) {
            dup[i] += dh[i] * up[F + i] * silu_grad(up[i]);
            dup[F + i] += dh[i] * siluf(up[i]);
        }
    }
    matmul_backward(dinp, gw->mlp_up_w, g->up, inp, w->mlp_up_w, BT, C, 2 * F);
}

#endif // M2RNN_REF_MLP_H
