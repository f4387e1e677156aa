/*
ref/gru.h: the CPU reference of the GRU baseline (the U row of layers.h, whose comment gives the variant): a standard
GRU per head of V channels, no biases, no conv, with the M²RNN layer's output path.

  proj = x W_inᵀ                      rows x_r | x_z | x_n | g (N·V each)
  per (b, n), h ∈ R^V, h_{−1} = h0 (0 in training); U_* multiply from the RIGHT ((hU)[j] = Σ_i h[i] U[i,j]):
     r = σ(x_r + h U_r),  z = σ(x_z + h U_z),  c = h U_n,  n = tanh(x_n + r ⊙ c)
     h_t = (1 − z) ⊙ n + z ⊙ h_{t−1}
  y = h_t ⊙ SiLU(g);  RMSNorm over all N·V channels;  out = y W_outᵀ

Backward (G = dL/dh_t carried from the right; Dt = dh_t + G):
  dn = Dt (1 − z),  da_n = dn (1 − n²),  da_z = Dt (h_{t−1} − n) z (1 − z),  dc = da_n ⊙ r,
  da_r = da_n ⊙ c ⊙ r (1 − r);  dx_r = da_r, dx_z = da_z, dx_n = da_n;
  dU_r += h_{t−1}ᵀ da_r,  dU_z += h_{t−1}ᵀ da_z,  dU_n += h_{t−1}ᵀ dc;
  G ← Dt ⊙ z + da_r U_rᵀ + da_z U_zᵀ + dc U_nᵀ,  dh0 = G after t = 0.
GPU twin: gru.cuh (same names).
*/
#ifndef M2RNN_REF_GRU_H
#define M2RNN_REF_GRU_H

#include "ref/common.h"
#include "ref/gate.h"

typedef struct { GRU_PARAMS(VIEW_FIELD) } GRUParams; // the layer's tensors, in the layers.h row's order

// ----------------------------------------------------------------------------------------------------------------
// the recurrence

// What the forward keeps per (token, head) for the backward: every h_t and the gates r, z, n and c = h_{t−1} U_n,
// each (B,T,N,V). Any may be NULL (decoding keeps none).
typedef struct { real *h, *r, *z, *n, *c; } GRUSaved;

// x (B,T,·) a view with token stride `stride`: x_r at column 0, x_z at N·V, x_n at 2·N·V; U_r, U_z, U_n (N,V,V);
// h0 (B,N,V) or NULL for zeros; h_final (B,N,V) or NULL
static void gru_recurrence_forward(GRUSaved *s, real *h_final, const real *x, int stride, const real *U_r,
                                   const real *U_z, const real *U_n, const real *h0, int B, int T, int N, int V) {
    const size_t NV = (size_t)N * V;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int n = 0; n < N; n++) {
            real *h = (real *)mallocCheck(4 * (size_t)V * sizeof(real)), *ar = h + V, *az = h + 2 * V, *ac = h + 3 * V;
            for (int j = 0; j < V; j++) { h[j] = h0 != NULL ? h0[((size_t)b * N + n) * V + j] : 0; }
            const size_t wo = (size_t)n * V * V;
            for (int t = 0; t < T; t++) {
                const size_t bt = (size_t)b * T + t, o = (bt * N + n) * V;
                const real *xt = x + bt * stride + (size_t)n * V;
                for (int j = 0; j < V; j++) { ar[j] = xt[j]; az[j] = xt[NV + j]; ac[j] = 0; }
                for (int i = 0; i < V; i++) {
                    for (int j = 0; j < V; j++) {
                        ar[j] += h[i] * U_r[wo + (size_t)i * V + j];
                        az[j] += h[i] * U_z[wo + (size_t)i * V + j];
                        ac[j] += h[i] * U_n[wo + (size_t)i * V + j];
                    }
                }
                for (int j = 0; j < V; j++) {
                    const real r = sigmoidr(ar[j]), z = sigmoidr(az[j]), nn = tanhr(xt[2 * NV + j] + r * ac[j]);
                    h[j] = (1 - z) * nn + z * h[j];
                    if (s->h != NULL) { s->h[o + j] = h[j]; }
                    if (s->r != NULL) { s->r[o + j] = r; s->z[o + j] = z; s->n[o + j] = nn; s->c[o + j] = ac[j]; }
                }
            }
            if (h_final != NULL) { memcpy(h_final + ((size_t)b * N + n) * V, h, (size_t)V * sizeof(real)); }
            free(h);
        }
    }
}

// dx (view, token stride `stride`: dx_r | dx_z | dx_n) +=, dU_r, dU_z, dU_n (N,V,V) +=, dh0 (B,N,V) = (may be NULL)
// from dh (B,T,N,V), the gradient of every h_t from above, and dh_final (B,N,V) or NULL. Parallel over heads, batch
// and time in order inside: deterministic.
static void gru_recurrence_backward(real *dx, real *dU_r, real *dU_z, real *dU_n, real *dh0, const real *dh,
                                    const real *dh_final, int stride, const real *U_r, const real *U_z,
                                    const real *U_n, const real *h0, const GRUSaved *s, int B, int T, int N, int V) {
    const size_t NV = (size_t)N * V;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        real *G = (real *)mallocCheck(4 * (size_t)V * sizeof(real)), *dar = G + V, *daz = G + 2 * V, *dc = G + 3 * V;
        const size_t wo = (size_t)n * V * V;
        for (int b = 0; b < B; b++) {
            for (int j = 0; j < V; j++) { G[j] = dh_final != NULL ? dh_final[((size_t)b * N + n) * V + j] : 0; }
            for (int t = T - 1; t >= 0; t--) {
                const size_t bt = (size_t)b * T + t, o = (bt * N + n) * V;
                const real *hp = t > 0 ? s->h + ((bt - 1) * N + n) * V : (h0 != NULL ? h0 + ((size_t)b * N + n) * V : NULL);
                real *dxt = dx + bt * stride + (size_t)n * V;
                for (int j = 0; j < V; j++) {
                    const real Dt = dh[o + j] + G[j], r = s->r[o + j], z = s->z[o + j], nn = s->n[o + j];
                    const real hpj = hp != NULL ? hp[j] : 0;
                    const real dan = Dt * (1 - z) * (1 - nn * nn);
                    daz[j] = Dt * (hpj - nn) * z * (1 - z);
                    dc[j] = dan * r;
                    dar[j] = dan * s->c[o + j] * r * (1 - r);
                    dxt[j] += dar[j];
                    dxt[NV + j] += daz[j];
                    dxt[2 * NV + j] += dan;
                    G[j] = Dt * z; // the direct path; the three products below add to it
                }
                for (int i = 0; i < V; i++) {
                    real acc = G[i];
                    for (int j = 0; j < V; j++) {
                        const size_t e = wo + (size_t)i * V + j;
                        acc += dar[j] * U_r[e] + daz[j] * U_z[e] + dc[j] * U_n[e];
                    }
                    if (hp != NULL) {
                        for (int j = 0; j < V; j++) {
                            const size_t e = wo + (size_t)i * V + j;
                            dU_r[e] += hp[i] * dar[j];
                            dU_z[e] += hp[i] * daz[j];
                            dU_n[e] += hp[i] * dc[j];
                        }
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
    real *proj;   // (B,T,4NV) rows x_r | x_z | x_n | g
    GRUSaved s;   // h, r, z, n, c (B,T,N,V) each
    real *gated;  // (B,T,NV) h ⊙ SiLU(g)
    real *normed; // (B,T,NV)
    real *rstd;   // (B,T)
} GRUActs;

static size_t gru_acts_layout(GRUActs *a, real *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, NV = (size_t)c->vrnn.heads * c->vrnn.head_dim;
    Arena ar = {base, 0};
    a->proj = arena_take(&ar, BT * 4 * NV);
    a->s.h = arena_take(&ar, BT * NV);
    a->s.r = arena_take(&ar, BT * NV);
    a->s.z = arena_take(&ar, BT * NV);
    a->s.n = arena_take(&ar, BT * NV);
    a->s.c = arena_take(&ar, BT * NV);
    a->gated = arena_take(&ar, BT * NV);
    a->normed = arena_take(&ar, BT * NV);
    a->rstd = arena_take(&ar, BT);
    return ar.used;
}

typedef struct { real *proj, *h, *gated, *normed; } GRUGrads; // gradient scratch

static size_t gru_scratch_layout(GRUGrads *g, real *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, NV = (size_t)c->vrnn.heads * c->vrnn.head_dim;
    Arena ar = {base, 0};
    g->proj = arena_take(&ar, BT * 4 * NV);
    g->h = arena_take(&ar, BT * NV);
    g->gated = arena_take(&ar, BT * NV);
    g->normed = arena_take(&ar, BT * NV);
    return ar.used;
}

static size_t gru_mixer_acts_size(const ModelConfig *c, int B, int T) { GRUActs a; return gru_acts_layout(&a, NULL, c, B, T); }
static size_t gru_mixer_scratch_size(const ModelConfig *c, int B, int T) { GRUGrads g; return gru_scratch_layout(&g, NULL, c, B, T); }

// out (B,T,C); with state (decoding: B sequences' h (N, V), stride S numbers) the recurrence continues from it and
// leaves it updated, without (training) it starts from zeros
static void gru_mixer_run(real *out, real *acts, const real *inp, const KindTensors *t, const ModelConfig *c, int B,
                          int T, real *state, size_t S) {
    const GRUParams *w = (const GRUParams *)t->w;
    GRUActs a;
    gru_acts_layout(&a, acts, c, B, T);
    const int BT = B * T, C = c->d_model, N = c->vrnn.heads, V = c->vrnn.head_dim, NV = N * V;
    matmul_forward(a.proj, inp, w->in_w, BT, C, 4 * NV);
    real *h = NULL;
    if (state != NULL) {
        h = (real *)mallocCheck((size_t)B * NV * sizeof(real));
        decode_state_move(h, state, S, 0, NV, B, 0);
    }
    gru_recurrence_forward(&a.s, h, a.proj, 4 * NV, w->U_r, w->U_z, w->U_n, h, B, T, N, V);
    if (state != NULL) {
        decode_state_move(h, state, S, 0, NV, B, 1);
        free(h);
    }
    output_gate_forward(a.s.h, a.gated, NULL, a.proj + 3 * NV, NULL, BT, NV, 0, 4 * NV);
    mixer_norm_forward(a.normed, a.rstd, a.gated, w->norm_w, BT, NV, 1, c->vrnn.tp_norm, t->tp);
    matmul_forward(out, a.normed, w->out_w, BT, NV, C);
}

static void gru_mixer_forward(real *out, real *acts, const real *inp, const KindTensors *t, const ModelConfig *c, int B,
                              int T) {
    gru_mixer_run(out, acts, inp, t, c, B, T, NULL, 0);
}

static void gru_mixer_backward(real *dinp, real *scratch, const real *dout, const real *inp, const real *acts,
                               const KindTensors *t, const ModelConfig *c, int B, int T) {
    const GRUParams *w = (const GRUParams *)t->w, *gw = (const GRUParams *)t->g;
    GRUActs a;
    gru_acts_layout(&a, (real *)acts, c, B, T);
    GRUGrads g;
    gru_scratch_layout(&g, scratch, c, B, T);
    const int BT = B * T, C = c->d_model, N = c->vrnn.heads, V = c->vrnn.head_dim, NV = N * V;
    matmul_backward(g.normed, gw->out_w, dout, a.normed, w->out_w, BT, NV, C);
    mixer_norm_backward(g.gated, gw->norm_w, g.normed, a.gated, w->norm_w, a.rstd, BT, NV, 1, c->vrnn.tp_norm, t->tp);
    output_gate_backward(g.h, g.proj + 3 * NV, g.gated, a.s.h, a.proj + 3 * NV, BT, NV, 4 * NV);
    gru_recurrence_backward(g.proj, gw->U_r, gw->U_z, gw->U_n, NULL, g.h, NULL, 4 * NV, w->U_r, w->U_z, w->U_n, NULL,
                            &a.s, B, T, N, V);
    matmul_backward(dinp, gw->in_w, g.proj, inp, w->in_w, BT, C, 4 * NV);
}

// Decoding: B sequences advance by T tokens. A sequence's state is h (N, V).
static void gru_mixer_advance(real *out, real *state, const real *inp, const KindTensors *t, const ModelConfig *c, int B,
                              int T, const int *pos, int context) {
    real *acts = (real *)mallocCheck(gru_mixer_acts_size(c, B, T) * sizeof(real));
    gru_mixer_run(out, acts, inp, t, c, B, T, state, gru_decode_state(c, context));
    free(acts);
}

static const KindOps GRU_OPS = {'U', gru_mixer_acts_size, gru_mixer_scratch_size, gru_mixer_forward, gru_mixer_backward,
                                gru_mixer_advance};

#endif // M2RNN_REF_GRU_H
