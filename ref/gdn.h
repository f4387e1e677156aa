/*
ref/gdn.h: the CPU reference of Gated DeltaNet (the G row of layers.h, whose comment gives the layer), forward,
hand-written backward and the advance of decoding (prefill and step).

  proj = x W_inᵀ                       rows q (H·K) | k (H·K) | v (H·V) | g (H·V) | b (H) | a (H)
  q, k, v = SiLU(causal_conv4(proj[q|k|v]));  q, k ← q / sqrt(Σq² + 1e-6) per head (L2 norm)
  β = sigmoid(b) (GDN[−1,1]: 2·sigmoid(b));  α = exp(−exp(A_log) · softplus(a + dt_bias))
  per (b, h), S ∈ R^{K×V}, S_{−1} = S0 (0 in training), scale = 1/sqrt(K):
     S' = α_t S_{t−1};  p = S'ᵀ k_t;  u = β_t (v_t − p);  S_t = S' + k_t uᵀ;  o_t = scale · S_tᵀ q_t
  (S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, in the order of the spec's oracle)
  o ← RMSNorm over each head's V channels (weight V, shared by the heads) ⊙ SiLU(g);  out = o W_outᵀ

Backward of the recurrence (dS = dL/dS_t carried from the right):
  dS += scale · q doᵀ;  dq = scale · S_t do;  du = dSᵀ k;  dk = dS u;  dβ = du·(v − p);  dv = β du;  dp = −β du;
  dS' = dS + k dpᵀ;  dk += S' dp;  dα = <dS', S_{t−1}>;  dS_{t−1} = α dS'.
The states are not kept between the passes: the backward runs the recurrence again storing S every GDN_CHUNK tokens,
then recomputes each chunk's states from its checkpoint and walks the chunk in reverse (memory: the checkpoints and
one chunk of states per (b, h), not T states).
GPU twin: gdn.cuh (same names).
*/
#ifndef M2RNN_REF_GDN_H
#define M2RNN_REF_GDN_H

#include "ref/common.h"
#include "ref/conv.h"
#include "ref/gate.h"

typedef struct { GDN_PARAMS(VIEW_FIELD) } GDNParams; // the layer's tensors, in the layers.h row's order

#define GDN_CHUNK 64   // tokens between the backward's state checkpoints
#define L2NORM_EPS 1e-6

// ----------------------------------------------------------------------------------------------------------------
// per-head L2 normalization

// out (M, H·D) dense, rinv (M, H) = 1/sqrt(Σx² + eps) of each head's D channels of x (rows of stride x_stride)
static void l2norm_forward(real *out, real *rinv, const real *x, int M, int H, int D, int x_stride) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        for (int h = 0; h < H; h++) {
            const real *xi = x + (size_t)m * x_stride + (size_t)h * D;
            double ss = 0.0;
            for (int i = 0; i < D; i++) { ss += (double)xi[i] * xi[i]; }
            const real r = (real)(1.0 / sqrt(ss + L2NORM_EPS));
            rinv[(size_t)m * H + h] = r;
            real *o = out + ((size_t)m * H + h) * D;
            for (int i = 0; i < D; i++) { o[i] = xi[i] * r; }
        }
    }
}

// dx (view) += r (dout − out (out·dout)), the gradient through out = x r
static void l2norm_backward(real *dx, const real *dout, const real *out, const real *rinv, int M, int H, int D,
                            int x_stride) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        for (int h = 0; h < H; h++) {
            const real *o = out + ((size_t)m * H + h) * D, *g = dout + ((size_t)m * H + h) * D;
            double dot = 0.0;
            for (int i = 0; i < D; i++) { dot += (double)o[i] * g[i]; }
            const real r = rinv[(size_t)m * H + h];
            real *d = dx + (size_t)m * x_stride + (size_t)h * D;
            for (int i = 0; i < D; i++) { d[i] += r * (g[i] - o[i] * (real)dot); }
        }
    }
}

// ----------------------------------------------------------------------------------------------------------------
// the recurrence

// One token of one head: S (K×V, row-major) ← S_t; o_t (V) written when o != NULL. p (V) receives Sᵀk after the
// decay (the backward needs it), u (V) the update.
static inline void gdn_token(real *S, real *o, real *p, real *u, const real *q, const real *k, const real *v,
                             real alpha, real beta, real scale, int K, int V) {
    for (int j = 0; j < V; j++) { p[j] = 0; }
    for (int i = 0; i < K; i++) {
        real *Si = S + (size_t)i * V;
        for (int j = 0; j < V; j++) {
            Si[j] *= alpha;
            p[j] += Si[j] * k[i];
        }
    }
    for (int j = 0; j < V; j++) { u[j] = beta * (v[j] - p[j]); }
    for (int i = 0; i < K; i++) {
        real *Si = S + (size_t)i * V;
        for (int j = 0; j < V; j++) { Si[j] += k[i] * u[j]; }
    }
    if (o != NULL) {
        for (int j = 0; j < V; j++) { o[j] = 0; }
        for (int i = 0; i < K; i++) {
            const real *Si = S + (size_t)i * V;
            for (int j = 0; j < V; j++) { o[j] += Si[j] * q[i]; }
        }
        for (int j = 0; j < V; j++) { o[j] *= scale; }
    }
}

// o (B,T,H·V) = the recurrence's outputs; q, k (B,T,H·K) dense, normalized; v (B,T,H·V) a view with row stride
// v_stride; alpha, beta (B,T,H); S0 (B,H,K,V) or NULL for zeros; S_final (B,H,K,V) or NULL (may equal S0)
static void gdn_recurrence_forward(real *o, real *S_final, const real *q, const real *k, const real *v, int v_stride,
                                   const real *alpha, const real *beta, const real *S0, int B, int T, int H, int K,
                                   int V) {
    const real scale = (real)(1.0 / sqrt((double)K));
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const size_t KV = (size_t)K * V;
            real *S = (real *)mallocCheck((KV + 2 * (size_t)V) * sizeof(real)), *p = S + KV, *u = p + V;
            if (S0 != NULL) { memcpy(S, S0 + ((size_t)b * H + h) * KV, KV * sizeof(real)); } else { memset(S, 0, KV * sizeof(real)); }
            for (int t = 0; t < T; t++) {
                const size_t bt = (size_t)b * T + t;
                gdn_token(S, o + (bt * H + h) * V, p, u, q + (bt * H + h) * K, k + (bt * H + h) * K,
                          v + bt * v_stride + (size_t)h * V, alpha[bt * H + h], beta[bt * H + h], scale, K, V);
            }
            if (S_final != NULL) { memcpy(S_final + ((size_t)b * H + h) * KV, S, KV * sizeof(real)); }
            free(S);
        }
    }
}

// dq, dk (B,T,H·K) +=, dv (view, row stride v_stride) +=, dalpha, dbeta (B,T,H) +=, dS0 (B,H,K,V) = (or NULL) from
// dout (B,T,H·V) and dS_final (B,H,K,V) or NULL. Parallel over (b, h): each writes only its own rows.
static void gdn_recurrence_backward(real *dq, real *dk, real *dv, real *dalpha, real *dbeta, real *dS0,
                                    const real *dout, const real *dS_final, const real *q, const real *k,
                                    const real *v, int v_stride, const real *alpha, const real *beta, const real *S0,
                                    int B, int T, int H, int K, int V) {
    const real scale = (real)(1.0 / sqrt((double)K));
    const int nchunks = (T + GDN_CHUNK - 1) / GDN_CHUNK;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const size_t KV = (size_t)K * V;
            // checkpoints (nchunks states: the state before each chunk), one chunk of states, dS, work vectors
            real *ckpt = (real *)mallocCheck(((size_t)nchunks * KV + (GDN_CHUNK + 1) * KV + KV + 4 * (size_t)V) *
                                             sizeof(real));
            real *states = ckpt + (size_t)nchunks * KV, *dS = states + (GDN_CHUNK + 1) * KV, *p = dS + KV;
            real *u = p + V, *du = u + V, *dp = du + V;
            real *S = states; // scratch for the checkpoint pass
            if (S0 != NULL) { memcpy(S, S0 + ((size_t)b * H + h) * KV, KV * sizeof(real)); } else { memset(S, 0, KV * sizeof(real)); }
            for (int t = 0; t < T; t++) {
                if (t % GDN_CHUNK == 0) { memcpy(ckpt + (size_t)(t / GDN_CHUNK) * KV, S, KV * sizeof(real)); }
                const size_t bt = (size_t)b * T + t;
                gdn_token(S, NULL, p, u, NULL, k + (bt * H + h) * K, v + bt * v_stride + (size_t)h * V,
                          alpha[bt * H + h], beta[bt * H + h], scale, K, V);
            }
            if (dS_final != NULL) { memcpy(dS, dS_final + ((size_t)b * H + h) * KV, KV * sizeof(real)); } else { memset(dS, 0, KV * sizeof(real)); }
            for (int c = nchunks - 1; c >= 0; c--) {
                const int t0 = c * GDN_CHUNK, t1 = t0 + GDN_CHUNK < T ? t0 + GDN_CHUNK : T;
                memcpy(states, ckpt + (size_t)c * KV, KV * sizeof(real)); // states[i] = S before token t0 + i
                for (int t = t0; t < t1; t++) {
                    const size_t bt = (size_t)b * T + t;
                    real *Sn = states + (size_t)(t - t0 + 1) * KV;
                    memcpy(Sn, states + (size_t)(t - t0) * KV, KV * sizeof(real));
                    gdn_token(Sn, NULL, p, u, NULL, k + (bt * H + h) * K, v + bt * v_stride + (size_t)h * V,
                              alpha[bt * H + h], beta[bt * H + h], scale, K, V);
                }
                for (int t = t1 - 1; t >= t0; t--) {
                    const size_t bt = (size_t)b * T + t, r = bt * H + h;
                    const real *Sp = states + (size_t)(t - t0) * KV, *St = Sp + KV;
                    const real *qt = q + r * K, *kt = k + r * K, *vt = v + bt * v_stride + (size_t)h * V;
                    const real *dot = dout + r * V;
                    const real a = alpha[r], be = beta[r];
                    real *dqt = dq + r * K, *dkt = dk + r * K, *dvt = dv + bt * v_stride + (size_t)h * V;
                    // p = (αS_{t−1})ᵀ k, u = β (v − p): recomputed from S_{t−1}
                    for (int j = 0; j < V; j++) { p[j] = 0; }
                    for (int i = 0; i < K; i++) {
                        for (int j = 0; j < V; j++) { p[j] += a * Sp[(size_t)i * V + j] * kt[i]; }
                    }
                    for (int j = 0; j < V; j++) { u[j] = be * (vt[j] - p[j]); }
                    // o = scale S_tᵀ q: dq = scale S_t do, dS += scale q doᵀ
                    for (int i = 0; i < K; i++) {
                        real acc = 0;
                        for (int j = 0; j < V; j++) {
                            acc += St[(size_t)i * V + j] * dot[j];
                            dS[(size_t)i * V + j] += scale * qt[i] * dot[j];
                        }
                        dqt[i] += scale * acc;
                    }
                    // S_t = S' + k uᵀ: du = dSᵀ k, dk += dS u
                    for (int j = 0; j < V; j++) { du[j] = 0; }
                    for (int i = 0; i < K; i++) {
                        real acc = 0;
                        for (int j = 0; j < V; j++) {
                            du[j] += dS[(size_t)i * V + j] * kt[i];
                            acc += dS[(size_t)i * V + j] * u[j];
                        }
                        dkt[i] += acc;
                    }
                    // u = β (v − p)
                    real dbe = 0;
                    for (int j = 0; j < V; j++) {
                        dbe += du[j] * (vt[j] - p[j]);
                        dvt[j] += be * du[j];
                        dp[j] = -be * du[j];
                    }
                    dbeta[r] += dbe;
                    // p = S'ᵀ k: dS' = dS + k dpᵀ, dk += S' dp; S' = α S_{t−1}: dα = <dS', S_{t−1}>, dS_{t−1} = α dS'
                    real da = 0;
                    for (int i = 0; i < K; i++) {
                        real acc = 0;
                        for (int j = 0; j < V; j++) {
                            const real sp = Sp[(size_t)i * V + j];
                            acc += a * sp * dp[j];
                            const real dSp = dS[(size_t)i * V + j] + kt[i] * dp[j];
                            da += dSp * sp;
                            dS[(size_t)i * V + j] = a * dSp;
                        }
                        dkt[i] += acc;
                    }
                    dalpha[r] += da;
                }
            }
            if (dS0 != NULL) { memcpy(dS0 + ((size_t)b * H + h) * KV, dS, KV * sizeof(real)); }
            free(ckpt);
        }
    }
}

// ----------------------------------------------------------------------------------------------------------------
// the mixer

typedef struct {
    real *proj;     // (B,T,R) rows q | k | v | g | b | a
    real *conv_pre; // (B,T,CD) conv output before SiLU
    real *conv_act; // (B,T,CD) q | k | v after SiLU
    real *qn, *kn;  // (B,T,H·K) L2-normalized q, k
    real *rq, *rk;  // (B,T,H) their 1/norms
    real *alpha;    // (B,T,H) decay
    real *beta;     // (B,T,H)
    real *o;        // (B,T,H·V) the recurrence's outputs
    real *normed;   // (B,T,H·V) per-head RMSNorm of o
    real *rstd;     // (B·T·H)
    real *gated;    // (B,T,H·V) normed ⊙ SiLU(g)
} GDNActs;

static size_t gdn_acts_layout(GDNActs *a, real *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, H = (size_t)c->gdn.heads, HK = H * c->gdn.k, HV = H * c->gdn.v;
    Arena ar = {base, 0};
    a->proj = arena_take(&ar, BT * gdn_proj_rows(c));
    a->conv_pre = arena_take(&ar, BT * gdn_conv_dim(c));
    a->conv_act = arena_take(&ar, BT * gdn_conv_dim(c));
    a->qn = arena_take(&ar, BT * HK);
    a->kn = arena_take(&ar, BT * HK);
    a->rq = arena_take(&ar, BT * H);
    a->rk = arena_take(&ar, BT * H);
    a->alpha = arena_take(&ar, BT * H);
    a->beta = arena_take(&ar, BT * H);
    a->o = arena_take(&ar, BT * HV);
    a->normed = arena_take(&ar, BT * HV);
    a->rstd = arena_take(&ar, BT * H);
    a->gated = arena_take(&ar, BT * HV);
    return ar.used;
}

typedef struct { real *proj, *conv_act, *qn, *kn, *alpha, *beta, *o, *normed, *gated; } GDNGrads; // same shapes

static size_t gdn_scratch_layout(GDNGrads *g, real *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, H = (size_t)c->gdn.heads, HK = H * c->gdn.k, HV = H * c->gdn.v;
    Arena ar = {base, 0};
    g->proj = arena_take(&ar, BT * gdn_proj_rows(c));
    g->conv_act = arena_take(&ar, BT * gdn_conv_dim(c));
    g->qn = arena_take(&ar, BT * HK);
    g->kn = arena_take(&ar, BT * HK);
    g->alpha = arena_take(&ar, BT * H);
    g->beta = arena_take(&ar, BT * H);
    g->o = arena_take(&ar, BT * HV);
    g->normed = arena_take(&ar, BT * HV);
    g->gated = arena_take(&ar, BT * HV);
    return ar.used;
}

static size_t gdn_mixer_acts_size(const ModelConfig *c, int B, int T) { GDNActs a; return gdn_acts_layout(&a, NULL, c, B, T); }
static size_t gdn_mixer_scratch_size(const ModelConfig *c, int B, int T) { GDNGrads g; return gdn_scratch_layout(&g, NULL, c, B, T); }

// β from the b rows: sigmoid, or 2·sigmoid for GDN[−1,1]
static void gdn_beta_forward(real *beta, const real *b_raw, int BT, int H, int stride, int neg) {
    for (int m = 0; m < BT; m++) {
        for (int h = 0; h < H; h++) { beta[(size_t)m * H + h] = (neg ? 2 : 1) * sigmoidr(b_raw[(size_t)m * stride + h]); }
    }
}
static void gdn_beta_backward(real *db_raw, const real *dbeta, const real *b_raw, int BT, int H, int stride, int neg) {
    for (int m = 0; m < BT; m++) {
        for (int h = 0; h < H; h++) {
            const real s = sigmoidr(b_raw[(size_t)m * stride + h]);
            db_raw[(size_t)m * stride + h] += dbeta[(size_t)m * H + h] * (neg ? 2 : 1) * s * (1 - s);
        }
    }
}

// everything after the projection and before the recurrence, for BT tokens of proj whose conv outputs are given
static void gdn_inputs_forward(GDNActs *a, const GDNParams *w, const ModelConfig *c, int BT) {
    const int R = gdn_proj_rows(c), CD = gdn_conv_dim(c), H = c->gdn.heads, K = c->gdn.k, V = c->gdn.v;
    const int HK = H * K, HV = H * V;
    l2norm_forward(a->qn, a->rq, a->conv_act, BT, H, K, CD);
    l2norm_forward(a->kn, a->rk, a->conv_act + HK, BT, H, K, CD);
    gdn_beta_forward(a->beta, a->proj + 2 * HK + 2 * HV, BT, H, R, c->gdn.neg);
    decay_gate_forward(a->alpha, a->proj + 2 * HK + 2 * HV + H, w->A_log, w->dt_bias, BT, H, R);
}

// after the recurrence: per-head RMSNorm, the SiLU(g) gate, the output projection
static void gdn_outputs_forward(real *out, GDNActs *a, const GDNParams *w, const ModelConfig *c, int BT) {
    const int C = c->d_model, R = gdn_proj_rows(c), H = c->gdn.heads, K = c->gdn.k, V = c->gdn.v, HV = H * V;
    rmsnorm_forward(a->normed, a->rstd, a->o, w->norm_w, BT * H, V);
    output_gate_forward(a->normed, a->gated, NULL, a->proj + 2 * H * K + HV, NULL, BT, HV, 0, R);
    matmul_forward(out, a->gated, w->out_w, BT, HV, C);
}

// out (B,T,C); with state (decoding: B sequences' states, stride S numbers) the conv and S continue from it and are
// left updated, without (training) both start from zeros
static void gdn_mixer_run(real *out, real *acts, const real *inp, const KindTensors *t, const ModelConfig *c, int B,
                          int T, real *state, size_t S) {
    const GDNParams *w = (const GDNParams *)t->w;
    GDNActs a;
    gdn_acts_layout(&a, acts, c, B, T);
    const int BT = B * T, C = c->d_model, R = gdn_proj_rows(c), CD = gdn_conv_dim(c), H = c->gdn.heads;
    const int K = c->gdn.k, V = c->gdn.v, Wc = c->gdn.conv;
    const size_t Sn = (size_t)H * K * V, conv_size = (size_t)(Wc - 1) * CD;
    matmul_forward(a.proj, inp, w->in_w, BT, C, R);
    if (state != NULL) {
        conv1d_silu_advance(a.conv_pre, a.conv_act, state, S, a.proj, w->conv_w, NULL, B, T, CD, Wc, R);
    } else {
        conv1d_silu_forward(a.conv_pre, a.conv_act, a.proj, w->conv_w, NULL, B, T, CD, Wc, R);
    }
    gdn_inputs_forward(&a, w, c, BT);
    real *S0 = NULL;
    if (state != NULL) {
        S0 = (real *)mallocCheck((size_t)B * Sn * sizeof(real));
        decode_state_move(S0, state, S, conv_size, Sn, B, 0);
    }
    gdn_recurrence_forward(a.o, S0, a.qn, a.kn, a.conv_act + 2 * H * K, CD, a.alpha, a.beta, S0, B, T, H, K, V);
    if (state != NULL) {
        decode_state_move(S0, state, S, conv_size, Sn, B, 1);
        free(S0);
    }
    gdn_outputs_forward(out, &a, w, c, BT);
}

static void gdn_mixer_forward(real *out, real *acts, const real *inp, const KindTensors *t, const ModelConfig *c, int B,
                              int T) {
    gdn_mixer_run(out, acts, inp, t, c, B, T, NULL, 0);
}

// dinp (B,T,C) +=, parameter grads +=; scratch zeroed by the caller
static void gdn_mixer_backward(real *dinp, real *scratch, const real *dout, const real *inp, const real *acts,
                               const KindTensors *t, const ModelConfig *c, int B, int T) {
    const GDNParams *w = (const GDNParams *)t->w, *gw = (const GDNParams *)t->g;
    GDNActs a;
    gdn_acts_layout(&a, (real *)acts, c, B, T);
    GDNGrads g;
    gdn_scratch_layout(&g, scratch, c, B, T);
    const int BT = B * T, C = c->d_model, R = gdn_proj_rows(c), CD = gdn_conv_dim(c), H = c->gdn.heads;
    const int K = c->gdn.k, V = c->gdn.v, HK = H * K, HV = H * V;
    const int goff = 2 * HK + HV, boff = 2 * HK + 2 * HV, aoff = boff + H;
    matmul_backward(g.gated, gw->out_w, dout, a.gated, w->out_w, BT, HV, C);
    output_gate_backward(g.normed, g.proj + goff, g.gated, a.normed, a.proj + goff, BT, HV, R);
    rmsnorm_backward(g.o, gw->norm_w, g.normed, a.o, w->norm_w, a.rstd, BT * H, V);
    gdn_recurrence_backward(g.qn, g.kn, g.conv_act + 2 * HK, g.alpha, g.beta, NULL, g.o, NULL, a.qn, a.kn,
                            a.conv_act + 2 * HK, CD, a.alpha, a.beta, NULL, B, T, H, K, V);
    gdn_beta_backward(g.proj + boff, g.beta, a.proj + boff, BT, H, R, c->gdn.neg);
    decay_gate_backward(g.proj + aoff, gw->A_log, gw->dt_bias, g.alpha, a.alpha, a.proj + aoff, w->A_log, w->dt_bias,
                        BT, H, R);
    l2norm_backward(g.conv_act, g.qn, a.qn, a.rq, BT, H, K, CD);
    l2norm_backward(g.conv_act + HK, g.kn, a.kn, a.rk, BT, H, K, CD);
    conv1d_silu_backward(g.proj, gw->conv_w, NULL, g.conv_act, a.conv_pre, a.proj, w->conv_w, B, T, CD, c->gdn.conv, R);
    matmul_backward(dinp, gw->in_w, g.proj, inp, w->in_w, BT, C, R);
}

// Decoding: B sequences advance by T tokens. A sequence's state: the conv's last W−1 inputs (W−1, CD), then S
// (H, K, V).
static void gdn_mixer_advance(real *out, real *state, const real *inp, const KindTensors *t, const ModelConfig *c, int B,
                              int T, const int *pos, int context) {
    real *acts = (real *)mallocCheck(gdn_mixer_acts_size(c, B, T) * sizeof(real));
    gdn_mixer_run(out, acts, inp, t, c, B, T, state, gdn_decode_state(c, context));
    free(acts);
}

static const KindOps GDN_OPS = {'G', gdn_mixer_acts_size, gdn_mixer_scratch_size, gdn_mixer_forward, gdn_mixer_backward,
                                gdn_mixer_advance};

#endif // M2RNN_REF_GDN_H
