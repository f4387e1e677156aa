/*
ref/attention.h: the CPU reference of causal multi-head softmax attention, forward and hand-written backward.
qkv = x W_qkvᵀ (rows q|k|v, heads contiguous inside each), optional RoPE on q and k, softmax(q kᵀ / sqrt(HS)) over
the causal past, output projection; no biases. NoPE is the default (the paper's hybrids); RoPE (θ = 10000) rotates
the pairs (i, i + HS/2), the "rotate half" convention of GPT-NeoX and Llama.
The probabilities (B,NH,T,T) are kept for the backward: this is a reference, not the flash kernel.
*/
#ifndef M2RNN_REF_ATTENTION_H
#define M2RNN_REF_ATTENTION_H

#include "ref/common.h"

typedef struct {
    real *qkv; // (B,T,3*NH*HS) q and k after RoPE
    real *att; // (B,NH,T,T) softmax probabilities (upper triangle unused)
    real *y;   // (B,T,NH*HS) attention output before the output projection
} AttnActs;

typedef struct { real *qkv, *att, *y; } AttnGrads; // gradient scratch, same shapes

// rotates (or, with inverse = 1, un-rotates) the q and k parts of qkv (B,T,3*NH*HS) in place
static void rope_apply(real *qkv, int B, int T, int NH, int HS, float theta, int inverse) {
    const int inner = NH * HS, half = HS / 2;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            real *row = qkv + ((size_t)b * T + t) * 3 * inner;
            for (int i = 0; i < half; i++) {
                const double angle = t * pow((double)theta, -2.0 * i / HS);
                const real cs = (real)cos(angle), sn = (real)(inverse ? -sin(angle) : sin(angle));
                for (int part = 0; part < 2; part++) { // q, then k
                    for (int h = 0; h < NH; h++) {
                        real *x = row + (size_t)part * inner + (size_t)h * HS;
                        const real x1 = x[i], x2 = x[i + half];
                        x[i] = x1 * cs - x2 * sn;
                        x[i + half] = x1 * sn + x2 * cs;
                    }
                }
            }
        }
    }
}

// out (B,T,C) = Attention(inp (B,T,C))
static void attention_forward(real *out, AttnActs *a, const real *inp, const LayerWeights *w, const ModelConfig *c,
                              int B, int T) {
    const int C = c->d_model, NH = c->attn_heads, HS = c->attn_head_dim, inner = NH * HS;
    matmul_forward(a->qkv, inp, w->a_qkv_w, B * T, C, 3 * inner);
    if (c->use_rope) { rope_apply(a->qkv, B, T, NH, HS, c->rope_theta, 0); }
    const real scale = (real)(1.0 / sqrt((double)HS));
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const real *qt = a->qkv + ((size_t)b * T + t) * 3 * inner + (size_t)h * HS;
                real *p = a->att + (((size_t)b * NH + h) * T + t) * T;
                real maxv = -INFINITY;
                for (int u = 0; u <= t; u++) {
                    const real *ku = a->qkv + ((size_t)b * T + u) * 3 * inner + inner + (size_t)h * HS;
                    real s = 0;
                    for (int i = 0; i < HS; i++) { s += qt[i] * ku[i]; }
                    p[u] = s * scale;
                    maxv = p[u] > maxv ? p[u] : maxv;
                }
                double sum = 0.0;
                for (int u = 0; u <= t; u++) { p[u] = (real)exp((double)(p[u] - maxv)); sum += p[u]; }
                for (int u = 0; u <= t; u++) { p[u] = (real)(p[u] / sum); }
                real *yt = a->y + ((size_t)b * T + t) * inner + (size_t)h * HS;
                for (int i = 0; i < HS; i++) { yt[i] = 0; }
                for (int u = 0; u <= t; u++) {
                    const real *vu = a->qkv + ((size_t)b * T + u) * 3 * inner + 2 * inner + (size_t)h * HS;
                    for (int i = 0; i < HS; i++) { yt[i] += p[u] * vu[i]; }
                }
            }
        }
    }
    matmul_forward(out, a->y, w->a_out_w, B * T, inner, C);
}

// dinp (B,T,C) +=, parameter grads in gw +=; g is zeroed scratch
static void attention_backward(real *dinp, LayerWeights *gw, AttnGrads *g, const real *dout, const real *inp,
                               const AttnActs *a, const LayerWeights *w, const ModelConfig *c, int B, int T) {
    const int C = c->d_model, NH = c->attn_heads, HS = c->attn_head_dim, inner = NH * HS;
    matmul_backward(g->y, gw->a_out_w, dout, a->y, w->a_out_w, B * T, inner, C);
    const real scale = (real)(1.0 / sqrt((double)HS));
    // one (b, h) owns its rows of dq, dk, dv: no two threads write the same element
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = T - 1; t >= 0; t--) {
                const size_t rowt = ((size_t)b * T + t) * 3 * inner + (size_t)h * HS;
                const real *p = a->att + (((size_t)b * NH + h) * T + t) * T;
                real *dp = g->att + (((size_t)b * NH + h) * T + t) * T;
                const real *dyt = g->y + ((size_t)b * T + t) * inner + (size_t)h * HS;
                real dot = 0;
                for (int u = 0; u <= t; u++) {
                    const size_t rowu = ((size_t)b * T + u) * 3 * inner + (size_t)h * HS;
                    real s = 0;
                    for (int i = 0; i < HS; i++) {
                        s += dyt[i] * a->qkv[rowu + 2 * inner + i];
                        g->qkv[rowu + 2 * inner + i] += p[u] * dyt[i];
                    }
                    dp[u] = s;
                    dot += p[u] * s;
                }
                for (int u = 0; u <= t; u++) {
                    const size_t rowu = ((size_t)b * T + u) * 3 * inner + (size_t)h * HS;
                    const real ds = p[u] * (dp[u] - dot) * scale;
                    for (int i = 0; i < HS; i++) {
                        g->qkv[rowt + i] += ds * a->qkv[rowu + inner + i];
                        g->qkv[rowu + inner + i] += ds * a->qkv[rowt + i];
                    }
                }
            }
        }
    }
    if (c->use_rope) { rope_apply(g->qkv, B, T, NH, HS, c->rope_theta, 1); } // RoPE is a rotation: its adjoint inverts it
    matmul_backward(dinp, gw->a_qkv_w, g->qkv, inp, w->a_qkv_w, B * T, C, 3 * inner);
}

#endif // M2RNN_REF_ATTENTION_H
