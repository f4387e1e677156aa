/*
ref/attention.h: the CPU reference of causal multi-head softmax attention (the A row of layers.h), forward and
hand-written backward, and the advance of decoding (prefill and step) against a KV cache.
qkv = x W_qkvᵀ (rows q (NH·HS) | k (NKV·HS) | v (NKV·HS), heads contiguous inside each), optional RoPE on q and k,
softmax(q kᵀ / sqrt(HS)) over the causal past, output projection; no biases. GQA: query head h attends with kv head
h / (NH / NKV) (NKV = NH: multi-head attention; NKV = 1: multi-query). NoPE is the default (the paper's hybrids); RoPE (θ = 10000) rotates
the pairs (i, i + HS/2), the "rotate half" convention of GPT-NeoX and Llama.
The mixer is projection → attention_core → projection; the core keeps the probabilities (B,NH,T,T) for the
backward: this is a reference, not the flash kernel. GPU twin: attention.cuh (same names).
*/
#ifndef M2RNN_REF_ATTENTION_H
#define M2RNN_REF_ATTENTION_H

#include "ref/common.h"

typedef struct { ATTENTION_PARAMS(VIEW_FIELD) } AttentionParams; // the layer's tensors, in the layers.h row's order

// rotates (or, with inverse = 1, un-rotates) the q and k heads of one token row ((NH + 2·NKV)·HS: q | k | v) at
// position pos: the NH q heads then the NKV k heads, contiguous
static void rope_row(real *row, int NH, int NKV, int HS, int pos, float theta, int inverse) {
    const int half = HS / 2;
    for (int i = 0; i < half; i++) {
        const double angle = pos * pow((double)theta, -2.0 * i / HS);
        const real cs = (real)cos(angle), sn = (real)(inverse ? -sin(angle) : sin(angle));
        for (int h = 0; h < NH + NKV; h++) {
            real *x = row + (size_t)h * HS;
            const real x1 = x[i], x2 = x[i + half];
            x[i] = x1 * cs - x2 * sn;
            x[i + half] = x1 * sn + x2 * cs;
        }
    }
}

// qkv (B,T,(NH+2·NKV)·HS): every token row rotated at its position t
static void rope_apply(real *qkv, int B, int T, int NH, int NKV, int HS, float theta, int inverse) {
    const size_t W = (size_t)(NH + 2 * NKV) * HS;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) { rope_row(qkv + ((size_t)b * T + t) * W, NH, NKV, HS, t, theta, inverse); }
    }
}

// Softmax attention of one query q (HS) over the keys and values of positions 0..last: keys at k + u·kv_stride,
// values at v + u·kv_stride. p (last+1) receives the probabilities, y (HS) the output. Shared by the forward and the
// decode step, so the two compute the same numbers.
static void attention_row(real *y, real *p, const real *q, const real *k, const real *v, size_t kv_stride, int last,
                          int HS, real scale) {
    real maxv = -INFINITY;
    for (int u = 0; u <= last; u++) {
        const real *ku = k + (size_t)u * kv_stride;
        real s = 0;
        for (int i = 0; i < HS; i++) { s += q[i] * ku[i]; }
        p[u] = s * scale;
        maxv = p[u] > maxv ? p[u] : maxv;
    }
    double sum = 0.0;
    for (int u = 0; u <= last; u++) { p[u] = (real)exp((double)(p[u] - maxv)); sum += p[u]; }
    for (int u = 0; u <= last; u++) { p[u] = (real)(p[u] / sum); }
    for (int i = 0; i < HS; i++) { y[i] = 0; }
    for (int u = 0; u <= last; u++) {
        const real *vu = v + (size_t)u * kv_stride;
        for (int i = 0; i < HS; i++) { y[i] += p[u] * vu[i]; }
    }
}

// y (B,T,NH·HS) = causal attention of qkv (B,T,(NH+2·NKV)·HS) (after RoPE); att (B,NH,T,T) the probabilities
static void attention_core_forward(real *y, real *att, const real *qkv, int B, int T, int NH, int NKV, int HS) {
    const size_t inner = (size_t)NH * HS, kv = (size_t)NKV * HS, W = inner + 2 * kv;
    const real scale = (real)(1.0 / sqrt((double)HS));
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const real *seq = qkv + (size_t)b * T * W, *kh = seq + inner + (size_t)(h / (NH / NKV)) * HS;
                attention_row(y + ((size_t)b * T + t) * inner + (size_t)h * HS, att + (((size_t)b * NH + h) * T + t) * T,
                              seq + (size_t)t * W + (size_t)h * HS, kh, kh + kv, W, t, HS, scale);
            }
        }
    }
}

// dqkv (B,T,(NH+2·NKV)·HS) += from dy (B,T,NH·HS); datt (B,NH,T,T) zeroed scratch
static void attention_core_backward(real *dqkv, real *datt, const real *dy, const real *qkv, const real *att, int B,
                                    int T, int NH, int NKV, int HS) {
    const size_t inner = (size_t)NH * HS, kv = (size_t)NKV * HS, W = inner + 2 * kv;
    const int G = NH / NKV;
    const real scale = (real)(1.0 / sqrt((double)HS));
    // one (b, kv head) owns its rows of dk, dv and the dq rows of its G query heads: no two threads write the same
    // element, and the sums over a group's heads run in a fixed order
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int kvh = 0; kvh < NKV; kvh++) {
            const size_t ko = inner + (size_t)kvh * HS, vo = inner + kv + (size_t)kvh * HS; // k, v in a row
            for (int h = kvh * G; h < (kvh + 1) * G; h++) {
                for (int t = T - 1; t >= 0; t--) {
                    const size_t rowt = ((size_t)b * T + t) * W;
                    const real *p = att + (((size_t)b * NH + h) * T + t) * T;
                    real *dp = datt + (((size_t)b * NH + h) * T + t) * T;
                    const real *dyt = dy + ((size_t)b * T + t) * inner + (size_t)h * HS;
                    real dot = 0;
                    for (int u = 0; u <= t; u++) {
                        const size_t rowu = ((size_t)b * T + u) * W;
                        real s = 0;
                        for (int i = 0; i < HS; i++) {
                            s += dyt[i] * qkv[rowu + vo + i];
                            dqkv[rowu + vo + i] += p[u] * dyt[i];
                        }
                        dp[u] = s;
                        dot += p[u] * s;
                    }
                    for (int u = 0; u <= t; u++) {
                        const size_t rowu = ((size_t)b * T + u) * W;
                        const real ds = p[u] * (dp[u] - dot) * scale;
                        for (int i = 0; i < HS; i++) {
                            dqkv[rowt + (size_t)h * HS + i] += ds * qkv[rowu + ko + i];
                            dqkv[rowu + ko + i] += ds * qkv[rowt + (size_t)h * HS + i];
                        }
                    }
                }
            }
        }
    }
}

typedef struct {
    real *qkv; // (B,T,(NH+2·NKV)·HS) q and k after RoPE
    real *att; // (B,NH,T,T) softmax probabilities (upper triangle unused)
    real *y;   // (B,T,NH*HS) attention output before the output projection
} AttnActs;

static size_t attention_acts_layout(AttnActs *a, real *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, inner = (size_t)c->attn.heads * c->attn.head_dim;
    const size_t W = inner + 2 * (size_t)c->attn.kv_heads * c->attn.head_dim;
    Arena ar = {base, 0};
    a->qkv = arena_take(&ar, BT * W);
    a->att = arena_take(&ar, (size_t)B * c->attn.heads * T * T);
    a->y = arena_take(&ar, BT * inner);
    return ar.used;
}
static size_t attention_mixer_acts_size(const ModelConfig *c, int B, int T) { AttnActs a; return attention_acts_layout(&a, NULL, c, B, T); }
// the backward's gradients of qkv, att and y: the same shapes
static size_t attention_mixer_scratch_size(const ModelConfig *c, int B, int T) { return attention_mixer_acts_size(c, B, T); }

// out (B,T,C) = Attention(inp (B,T,C))
static void attention_mixer_forward(real *out, real *acts, const real *inp, const KindTensors *t, const ModelConfig *c,
                                    int B, int T) {
    const AttentionParams *w = (const AttentionParams *)t->w;
    AttnActs a;
    attention_acts_layout(&a, acts, c, B, T);
    const int C = c->d_model, NH = c->attn.heads, NKV = c->attn.kv_heads, HS = c->attn.head_dim, inner = NH * HS;
    matmul_forward(a.qkv, inp, w->qkv_w, B * T, C, (NH + 2 * NKV) * HS);
    if (c->attn.rope) { rope_apply(a.qkv, B, T, NH, NKV, HS, c->attn.rope_theta, 0); }
    attention_core_forward(a.y, a.att, a.qkv, B, T, NH, NKV, HS);
    matmul_forward(out, a.y, w->out_w, B * T, inner, C);
}

// dinp (B,T,C) +=, parameter grads +=; scratch zeroed by the caller
static void attention_mixer_backward(real *dinp, real *scratch, const real *dout, const real *inp, const real *acts,
                                     const KindTensors *t, const ModelConfig *c, int B, int T) {
    const AttentionParams *w = (const AttentionParams *)t->w, *gw = (const AttentionParams *)t->g;
    AttnActs a, g;
    attention_acts_layout(&a, (real *)acts, c, B, T);
    attention_acts_layout(&g, scratch, c, B, T);
    const int C = c->d_model, NH = c->attn.heads, NKV = c->attn.kv_heads, HS = c->attn.head_dim, inner = NH * HS;
    matmul_backward(g.y, gw->out_w, dout, a.y, w->out_w, B * T, inner, C);
    attention_core_backward(g.qkv, g.att, g.y, a.qkv, a.att, B, T, NH, NKV, HS);
    if (c->attn.rope) { rope_apply(g.qkv, B, T, NH, NKV, HS, c->attn.rope_theta, 1); } // a rotation's adjoint inverts it
    matmul_backward(dinp, gw->qkv_w, g.qkv, inp, w->qkv_w, B * T, C, (NH + 2 * NKV) * HS);
}

// Decoding: B sequences advance by T tokens. A sequence's state is its KV cache: keys then values, (context, NKV·HS)
// each; the new tokens (positions pos[b] .. pos[b] + T − 1) are rotated at their positions, appended, and attend to
// every position up to their own, each query through attention_row as the forward: the same numbers.
static void attention_mixer_advance(real *out, real *state, const real *inp, const KindTensors *t, const ModelConfig *c,
                                    int B, int T, const int *pos, int context) {
    const AttentionParams *w = (const AttentionParams *)t->w;
    const int C = c->d_model, NH = c->attn.heads, NKV = c->attn.kv_heads, HS = c->attn.head_dim, inner = NH * HS;
    const size_t S = attention_decode_state(c, context), kv = (size_t)NKV * HS, W = inner + 2 * kv;
    const int BT = B * T;
    const real scale = (real)(1.0 / sqrt((double)HS));
    real *qkv = (real *)mallocCheck((size_t)BT * W * sizeof(real));
    real *y = (real *)mallocCheck((size_t)BT * inner * sizeof(real));
    matmul_forward(qkv, inp, w->qkv_w, BT, C, (int)W);
    for (int b = 0; b < B; b++) {
        real *kc = state + b * S, *vc = kc + (size_t)context * kv;
        for (int t = 0; t < T; t++) {
            real *row = qkv + ((size_t)b * T + t) * W;
            const int p = pos[b] + t;
            if (c->attn.rope) { rope_row(row, NH, NKV, HS, p, c->attn.rope_theta, 0); }
            memcpy(kc + (size_t)p * kv, row + inner, kv * sizeof(real));
            memcpy(vc + (size_t)p * kv, row + inner + kv, kv * sizeof(real));
        }
    }
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            real *p = (real *)mallocCheck((size_t)(pos[b] + t + 1) * sizeof(real));
            const real *kc = state + b * S, *vc = kc + (size_t)context * kv, *row = qkv + ((size_t)b * T + t) * W;
            for (int h = 0; h < NH; h++) {
                const size_t kvo = (size_t)(h / (NH / NKV)) * HS;
                attention_row(y + ((size_t)b * T + t) * inner + (size_t)h * HS, p, row + (size_t)h * HS, kc + kvo,
                              vc + kvo, kv, pos[b] + t, HS, scale);
            }
            free(p);
        }
    }
    matmul_forward(out, y, w->out_w, BT, inner, C);
    free(qkv);
    free(y);
}

static const KindOps ATTENTION_OPS = {'A', attention_mixer_acts_size, attention_mixer_scratch_size,
                                      attention_mixer_forward, attention_mixer_backward, attention_mixer_advance};

#endif // M2RNN_REF_ATTENTION_H
