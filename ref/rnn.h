/*
ref/rnn.h: the CPU reference of the vector RNN baseline (the R row of layers.h, whose comment gives the variant):
the M²RNN layer with the outer product removed.

  proj = x W_inᵀ                      rows u (N·V) | f_raw (N) | g (N·V), no biases
  u = SiLU(causal_conv4(proj[u]))
  f = exp(−exp(A_log) · softplus(f_raw + dt_bias))   per head
  per (b, n), h ∈ R^V, h_{−1} = h0 (0 in training):
     z_t = tanh(h_{t−1} W_n + u_t)        W multiplies from the RIGHT: (hW)[j] = Σ_i h[i] W[i,j]
     h_t = f_t h_{t−1} + (1 − f_t) z_t
  y = h + u ⊙ D;  y ← y ⊙ SiLU(g);  RMSNorm over all N·V channels;  out = y W_outᵀ

Backward (G = dL/dh_t carried from the right, plain BPTT, no clamp):
  Dt = dy_t + G,  dp = Dt (1 − f)(1 − z²),  du_t += dp,  df_t = Σ_j Dt_j (h_{t−1,j} − z_j),  dW += h_{t−1}ᵀ dp,
  G ← f Dt + dp Wᵀ,  dh0 = G after t = 0.
GPU twin: rnn.cuh (same names).
*/
#ifndef M2RNN_REF_RNN_H
#define M2RNN_REF_RNN_H

#include "ref/common.h"
#include "ref/conv.h"
#include "ref/gate.h"

typedef struct { RNN_PARAMS(VIEW_FIELD) } RNNParams; // the layer's tensors, in the layers.h row's order

// ----------------------------------------------------------------------------------------------------------------
// the recurrence

// h_all (B,T,N,V) every h_t; z_all (B,T,N,V) every z_t (or NULL); h_final (B,N,V) or NULL; u (B,T,N,V) a view with
// token stride `stride`; f (B,T,N); W (N,V,V); h0 (B,N,V) or NULL for zeros
static void rnn_recurrence_forward(real *h_all, real *z_all, real *h_final, const real *u, int stride, const real *f,
                                   const real *W, const real *h0, int B, int T, int N, int V) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int n = 0; n < N; n++) {
            real *h = (real *)mallocCheck(2 * (size_t)V * sizeof(real)), *z = h + V;
            for (int j = 0; j < V; j++) { h[j] = h0 != NULL ? h0[((size_t)b * N + n) * V + j] : 0; }
            const real *Wn = W + (size_t)n * V * V;
            for (int t = 0; t < T; t++) {
                const size_t bt = (size_t)b * T + t;
                const real *ut = u + bt * stride + (size_t)n * V;
                const real ft = f[bt * N + n];
                for (int j = 0; j < V; j++) { z[j] = ut[j]; }
                for (int i = 0; i < V; i++) {
                    for (int j = 0; j < V; j++) { z[j] += h[i] * Wn[(size_t)i * V + j]; }
                }
                real *ho = h_all + (bt * N + n) * V;
                for (int j = 0; j < V; j++) {
                    z[j] = tanhr(z[j]);
                    h[j] = ft * h[j] + (1 - ft) * z[j];
                    ho[j] = h[j];
                }
                if (z_all != NULL) { memcpy(z_all + (bt * N + n) * V, z, (size_t)V * sizeof(real)); }
            }
            if (h_final != NULL) { memcpy(h_final + ((size_t)b * N + n) * V, h, (size_t)V * sizeof(real)); }
            free(h);
        }
    }
}

// du (view, token stride `stride`) +=, df (B,T,N) +=, dW (N,V,V) +=, dh0 (B,N,V) = (may be NULL) from dh (B,T,N,V),
// the gradient of every h_t from above, and dh_final (B,N,V) or NULL. Needs the forward's h_all and z_all.
// Parallel over heads, batch and time in order inside: deterministic.
static void rnn_recurrence_backward(real *du, real *df, real *dW, real *dh0, const real *dh, const real *dh_final,
                                    int stride, const real *f, const real *W, const real *h0, const real *h_all,
                                    const real *z_all, int B, int T, int N, int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        real *G = (real *)mallocCheck(3 * (size_t)V * sizeof(real)), *Dt = G + V, *dp = G + 2 * V;
        const real *Wn = W + (size_t)n * V * V;
        real *dWn = dW + (size_t)n * V * V;
        for (int b = 0; b < B; b++) {
            for (int j = 0; j < V; j++) { G[j] = dh_final != NULL ? dh_final[((size_t)b * N + n) * V + j] : 0; }
            for (int t = T - 1; t >= 0; t--) {
                const size_t bt = (size_t)b * T + t;
                const real *hp = t > 0 ? h_all + ((bt - 1) * N + n) * V : (h0 != NULL ? h0 + ((size_t)b * N + n) * V : NULL);
                const real *zt = z_all + (bt * N + n) * V, *dht = dh + (bt * N + n) * V;
                const real ft = f[bt * N + n];
                real dft = 0;
                for (int j = 0; j < V; j++) {
                    Dt[j] = dht[j] + G[j];
                    dp[j] = Dt[j] * (1 - ft) * (1 - zt[j] * zt[j]);
                    dft += Dt[j] * ((hp != NULL ? hp[j] : 0) - zt[j]);
                    du[bt * stride + (size_t)n * V + j] += dp[j];
                }
                df[bt * N + n] += dft;
                for (int i = 0; i < V; i++) {
                    real acc = ft * Dt[i];
                    for (int j = 0; j < V; j++) { acc += dp[j] * Wn[(size_t)i * V + j]; }
                    if (hp != NULL) {
                        for (int j = 0; j < V; j++) { dWn[(size_t)i * V + j] += hp[i] * dp[j]; }
                    }
                    G[i] = acc;
                }
            }
            if (dh0 != NULL) { memcpy(dh0 + ((size_t)b * N + n) * V, G, (size_t)V * sizeof(real)); }
        }
        free(G);
    }
}

// ----------------------------------------------------------------------------------------------------------------
// the mixer

typedef struct {
    real *proj;     // (B,T,R) rows u | f_raw | g
    real *conv_pre; // (B,T,NV) conv output before SiLU
    real *u;        // (B,T,NV) after SiLU
    real *f;        // (B,T,N)
    real *h;        // (B,T,N,V) every state
    real *z;        // (B,T,N,V) every tanh output
    real *y;        // (B,T,NV) h + u ⊙ D
    real *gated;    // (B,T,NV)
    real *normed;   // (B,T,NV)
    real *rstd;     // (B,T)
} RNNActs;

static inline int rnn_proj_rows(const ModelConfig *c) { return 2 * c->vrnn.heads * c->vrnn.head_dim + c->vrnn.heads; }

static size_t rnn_acts_layout(RNNActs *a, real *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, N = (size_t)c->vrnn.heads, NV = N * c->vrnn.head_dim;
    Arena ar = {base, 0};
    a->proj = arena_take(&ar, BT * rnn_proj_rows(c));
    a->conv_pre = arena_take(&ar, BT * NV);
    a->u = arena_take(&ar, BT * NV);
    a->f = arena_take(&ar, BT * N);
    a->h = arena_take(&ar, BT * NV);
    a->z = arena_take(&ar, BT * NV);
    a->y = arena_take(&ar, BT * NV);
    a->gated = arena_take(&ar, BT * NV);
    a->normed = arena_take(&ar, BT * NV);
    a->rstd = arena_take(&ar, BT);
    return ar.used;
}

typedef struct { real *proj, *u, *f, *y, *gated, *normed; } RNNGrads; // gradient scratch, same shapes

static size_t rnn_scratch_layout(RNNGrads *g, real *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, N = (size_t)c->vrnn.heads, NV = N * c->vrnn.head_dim;
    Arena ar = {base, 0};
    g->proj = arena_take(&ar, BT * rnn_proj_rows(c));
    g->u = arena_take(&ar, BT * NV);
    g->f = arena_take(&ar, BT * N);
    g->y = arena_take(&ar, BT * NV);
    g->gated = arena_take(&ar, BT * NV);
    g->normed = arena_take(&ar, BT * NV);
    return ar.used;
}

static size_t rnn_mixer_acts_size(const ModelConfig *c, int B, int T) { RNNActs a; return rnn_acts_layout(&a, NULL, c, B, T); }
static size_t rnn_mixer_scratch_size(const ModelConfig *c, int B, int T) { RNNGrads g; return rnn_scratch_layout(&g, NULL, c, B, T); }

// out (B,T,C); with state (decoding: B sequences' states, stride S numbers) the conv and h continue from it and are
// left updated, without (training) both start from zeros
static void rnn_mixer_run(real *out, real *acts, const real *inp, const KindTensors *t, const ModelConfig *c, int B,
                          int T, real *state, size_t S) {
    const RNNParams *w = (const RNNParams *)t->w;
    RNNActs a;
    rnn_acts_layout(&a, acts, c, B, T);
    const int BT = B * T, C = c->d_model, R = rnn_proj_rows(c), N = c->vrnn.heads, V = c->vrnn.head_dim, NV = N * V;
    const int Wc = c->vrnn.conv;
    matmul_forward(a.proj, inp, w->in_w, BT, C, R);
    if (state != NULL) {
        conv1d_silu_advance(a.conv_pre, a.u, state, S, a.proj, w->conv_w, NULL, B, T, NV, Wc, R);
    } else {
        conv1d_silu_forward(a.conv_pre, a.u, a.proj, w->conv_w, NULL, B, T, NV, Wc, R);
    }
    decay_gate_forward(a.f, a.proj + NV, w->A_log, w->dt_bias, BT, N, R);
    real *h = NULL;
    if (state != NULL) {
        h = (real *)mallocCheck((size_t)B * NV * sizeof(real));
        decode_state_move(h, state, S, (size_t)(Wc - 1) * NV, NV, B, 0);
    }
    rnn_recurrence_forward(a.h, a.z, h, a.u, NV, a.f, w->W, h, B, T, N, V);
    if (state != NULL) {
        decode_state_move(h, state, S, (size_t)(Wc - 1) * NV, NV, B, 1);
        free(h);
    }
    memcpy(a.y, a.h, (size_t)BT * NV * sizeof(real));
    output_gate_forward(a.y, a.gated, a.u, a.proj + NV + N, w->D, BT, NV, NV, R);
    mixer_norm_forward(a.normed, a.rstd, a.gated, w->norm_w, BT, NV, 1, c->vrnn.tp_norm, t->tp);
    matmul_forward(out, a.normed, w->out_w, BT, NV, C);
}

static void rnn_mixer_forward(real *out, real *acts, const real *inp, const KindTensors *t, const ModelConfig *c, int B,
                              int T) {
    rnn_mixer_run(out, acts, inp, t, c, B, T, NULL, 0);
}

static void rnn_mixer_backward(real *dinp, real *scratch, const real *dout, const real *inp, const real *acts,
                               const KindTensors *t, const ModelConfig *c, int B, int T) {
    const RNNParams *w = (const RNNParams *)t->w, *gw = (const RNNParams *)t->g;
    RNNActs a;
    rnn_acts_layout(&a, (real *)acts, c, B, T);
    RNNGrads g;
    rnn_scratch_layout(&g, scratch, c, B, T);
    const int BT = B * T, C = c->d_model, R = rnn_proj_rows(c), N = c->vrnn.heads, V = c->vrnn.head_dim, NV = N * V;
    matmul_backward(g.normed, gw->out_w, dout, a.normed, w->out_w, BT, NV, C);
    mixer_norm_backward(g.gated, gw->norm_w, g.normed, a.gated, w->norm_w, a.rstd, BT, NV, 1, c->vrnn.tp_norm, t->tp);
    output_gate_backward(g.y, g.proj + NV + N, g.gated, a.y, a.proj + NV + N, BT, NV, R);
    residual_backward(g.u, gw->D, g.y, a.u, w->D, BT, NV, NV);
    // y = h + ...: the recurrence gets dy as the gradient of every h_t
    rnn_recurrence_backward(g.u, g.f, gw->W, NULL, g.y, NULL, NV, a.f, w->W, NULL, a.h, a.z, B, T, N, V);
    decay_gate_backward(g.proj + NV, gw->A_log, gw->dt_bias, g.f, a.f, a.proj + NV, w->A_log, w->dt_bias, BT, N, R);
    conv1d_silu_backward(g.proj, gw->conv_w, NULL, g.u, a.conv_pre, a.proj, w->conv_w, B, T, NV, c->vrnn.conv, R);
    matmul_backward(dinp, gw->in_w, g.proj, inp, w->in_w, BT, C, R);
}

// Decoding: B sequences advance by T tokens. A sequence's state: the conv's last W−1 inputs (W−1, NV), then h (N, V).
static void rnn_mixer_advance(real *out, real *state, const real *inp, const KindTensors *t, const ModelConfig *c, int B,
                              int T, const int *pos, int context) {
    real *acts = (real *)mallocCheck(rnn_mixer_acts_size(c, B, T) * sizeof(real));
    rnn_mixer_run(out, acts, inp, t, c, B, T, state, rnn_decode_state(c, context));
    free(acts);
}

static const KindOps RNN_OPS = {'R', rnn_mixer_acts_size, rnn_mixer_scratch_size, rnn_mixer_forward, rnn_mixer_backward,
                                rnn_mixer_advance};

#endif // M2RNN_REF_RNN_H
