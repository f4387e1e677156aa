/*
ref/mamba2.h: the CPU reference of Mamba-2 (the S row of layers.h, whose comment gives the layer), forward,
hand-written backward and the advance of decoding (prefill and step).

  proj = x W_inᵀ                       rows z (DI) | x (DI) | B (G·N) | C (G·N) | dt (H)
  x, B, C = SiLU(causal_conv4(proj[x|B|C]) + conv_b)
  dt = softplus(dt_raw + dt_bias),  a = exp(dt · A),  A = −exp(A_log)
  per (b, head h) with group gr = h / (H/G), state h ∈ R^{P×N}, h_{−1} = h0 (0 in training):
     h_t = a_t h_{t−1} + dt_t x_t B_tᵀ;   y_t = h_t C_t + D x_t
  y ← RMSNorm(y ⊙ SiLU(z)) per group of DI/G channels (mamba_ssm's RMSNormGated, gate before the norm);
  out = y W_outᵀ

Backward of the recurrence (dh = dL/dh_t carried from the right):
  dh += dy Cᵀ;  dC += hᵀ dy;  dD += dy·x;  dx = D dy + dt dh B;  dB += dt dhᵀ x;  ddt = xᵀ dh B;
  da = <dh, h_{t−1}>;  dh_{t−1} = a dh;  ddt += da a A;  dA += da a dt.
B and C are shared by the heads of a group: one thread per (b, group) walks its heads in order, so their sums are
deterministic; dA_log and dD go through per-(b, h) partials reduced in batch order. The states are recomputed from
checkpoints every MAMBA2_CHUNK tokens, as in ref/gdn.h.
GPU twin: mamba2.cuh (same names).
*/
#ifndef M2RNN_REF_MAMBA2_H
#define M2RNN_REF_MAMBA2_H

#include "ref/common.h"
#include "ref/conv.h"

typedef struct { MAMBA2_PARAMS(VIEW_FIELD) } Mamba2Params; // the layer's tensors, in the layers.h row's order

#define MAMBA2_CHUNK 64 // tokens between the backward's state checkpoints

// ----------------------------------------------------------------------------------------------------------------
// the recurrence

// One token of one head: hs (P×N) ← a hs + dt x Bᵀ; y (P) = hs C + D x when y != NULL
static inline void mamba2_token(real *hs, real *y, const real *x, const real *Bv, const real *Cv, real a, real dt,
                                real D, int P, int N) {
    for (int p = 0; p < P; p++) {
        real *hp = hs + (size_t)p * N;
        const real dx = dt * x[p];
        for (int n = 0; n < N; n++) { hp[n] = a * hp[n] + dx * Bv[n]; }
        if (y != NULL) {
            real acc = 0;
            for (int n = 0; n < N; n++) { acc += hp[n] * Cv[n]; }
            y[p] = acc + D * x[p];
        }
    }
}

static inline real mamba2_decay(real dt, real A_log) { return (real)exp(-exp((double)A_log) * dt); }

// y (B,T,H·P); x, Bm, Cm views into rows of stride `stride` ((B,T,H·P), (B,T,G·N), (B,T,G·N)); dt (B,T,H) after
// the softplus; h0 (B,H,P,N) or NULL for zeros; h_final (B,H,P,N) or NULL (may equal h0)
static void mamba2_recurrence_forward(real *y, real *h_final, const real *x, const real *Bm, const real *Cm, int stride,
                                      const real *dt, const real *A_log, const real *D, const real *h0, int B, int T,
                                      int H, int P, int N, int G) {
    const int hpg = H / G;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const size_t PN = (size_t)P * N;
            const int gr = h / hpg;
            real *hs = (real *)mallocCheck(PN * sizeof(real));
            if (h0 != NULL) { memcpy(hs, h0 + ((size_t)b * H + h) * PN, PN * sizeof(real)); } else { memset(hs, 0, PN * sizeof(real)); }
            for (int t = 0; t < T; t++) {
                const size_t bt = (size_t)b * T + t;
                const real d = dt[bt * H + h];
                mamba2_token(hs, y + (bt * H + h) * P, x + bt * stride + (size_t)h * P, Bm + bt * stride + (size_t)gr * N,
                             Cm + bt * stride + (size_t)gr * N, mamba2_decay(d, A_log[h]), d, D[h], P, N);
            }
            if (h_final != NULL) { memcpy(h_final + ((size_t)b * H + h) * PN, hs, PN * sizeof(real)); }
            free(hs);
        }
    }
}

// dx, dB, dC (views, row stride `stride`) +=, ddt (B,T,H) +=, dA_log (H) +=, dD (H) +=, dh0 (B,H,P,N) = (or NULL)
// from dy (B,T,H·P) and dh_final (B,H,P,N) or NULL
static void mamba2_recurrence_backward(real *dx, real *dB, real *dC, real *ddt, real *dA_log, real *dD, real *dh0,
                                       const real *dy, const real *dh_final, const real *x, const real *Bm,
                                       const real *Cm, int stride, const real *dt, const real *A_log, const real *D,
                                       const real *h0, int B, int T, int H, int P, int N, int G) {
    const int hpg = H / G, nchunks = (T + MAMBA2_CHUNK - 1) / MAMBA2_CHUNK;
    real *partial = (real *)callocCheck(2 * (size_t)B * H, sizeof(real)); // (B, H) of dA_log, then of dD
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int gr = 0; gr < G; gr++) {
            const size_t PN = (size_t)P * N;
            real *ckpt = (real *)mallocCheck(((size_t)nchunks * PN + (MAMBA2_CHUNK + 1) * PN + PN) * sizeof(real));
            real *states = ckpt + (size_t)nchunks * PN, *dh = states + (MAMBA2_CHUNK + 1) * PN;
            for (int h = gr * hpg; h < (gr + 1) * hpg; h++) {
                const real A = (real)-exp((double)A_log[h]);
                real *hs = states;
                if (h0 != NULL) { memcpy(hs, h0 + ((size_t)b * H + h) * PN, PN * sizeof(real)); } else { memset(hs, 0, PN * sizeof(real)); }
                for (int t = 0; t < T; t++) {
                    if (t % MAMBA2_CHUNK == 0) { memcpy(ckpt + (size_t)(t / MAMBA2_CHUNK) * PN, hs, PN * sizeof(real)); }
                    const size_t bt = (size_t)b * T + t;
                    const real d = dt[bt * H + h];
                    mamba2_token(hs, NULL, x + bt * stride + (size_t)h * P, Bm + bt * stride + (size_t)gr * N, NULL,
                                 mamba2_decay(d, A_log[h]), d, 0, P, N);
                }
                if (dh_final != NULL) { memcpy(dh, dh_final + ((size_t)b * H + h) * PN, PN * sizeof(real)); } else { memset(dh, 0, PN * sizeof(real)); }
                real dA = 0, dDh = 0;
                for (int c = nchunks - 1; c >= 0; c--) {
                    const int t0 = c * MAMBA2_CHUNK, t1 = t0 + MAMBA2_CHUNK < T ? t0 + MAMBA2_CHUNK : T;
                    memcpy(states, ckpt + (size_t)c * PN, PN * sizeof(real));
                    for (int t = t0; t < t1; t++) {
                        const size_t bt = (size_t)b * T + t;
                        real *hn = states + (size_t)(t - t0 + 1) * PN;
                        memcpy(hn, states + (size_t)(t - t0) * PN, PN * sizeof(real));
                        const real d = dt[bt * H + h];
                        mamba2_token(hn, NULL, x + bt * stride + (size_t)h * P, Bm + bt * stride + (size_t)gr * N, NULL,
                                     mamba2_decay(d, A_log[h]), d, 0, P, N);
                    }
                    for (int t = t1 - 1; t >= t0; t--) {
                        const size_t bt = (size_t)b * T + t;
                        const real *hp = states + (size_t)(t - t0) * PN, *ht = hp + PN;
                        const real *xt = x + bt * stride + (size_t)h * P, *Bt = Bm + bt * stride + (size_t)gr * N;
                        const real *Ct = Cm + bt * stride + (size_t)gr * N, *dyt = dy + (bt * H + h) * P;
                        real *dxt = dx + bt * stride + (size_t)h * P, *dBt = dB + bt * stride + (size_t)gr * N;
                        real *dCt = dC + bt * stride + (size_t)gr * N;
                        const real d = dt[bt * H + h], a = mamba2_decay(d, A_log[h]);
                        real dd = 0, da = 0;
                        for (int p = 0; p < P; p++) {
                            real *dhp = dh + (size_t)p * N;
                            const real *htp = ht + (size_t)p * N, *hpp = hp + (size_t)p * N;
                            // y = h C + D x
                            dDh += dyt[p] * xt[p];
                            real dxp = D[h] * dyt[p], hb = 0;
                            for (int n = 0; n < N; n++) {
                                dhp[n] += dyt[p] * Ct[n];
                                dCt[n] += htp[n] * dyt[p];
                                // h_t = a h_{t−1} + dt x Bᵀ
                                dxp += d * dhp[n] * Bt[n];
                                dBt[n] += d * dhp[n] * xt[p];
                                hb += dhp[n] * Bt[n];
                                da += dhp[n] * hpp[n];
                                dhp[n] *= a;
                            }
                            dd += xt[p] * hb;
                            dxt[p] += dxp;
                        }
                        // a = exp(dt A)
                        dd += da * a * A;
                        dA += da * a * d;
                        ddt[bt * H + h] += dd;
                    }
                }
                partial[(size_t)b * H + h] = dA * A; // dA_log = dA · dA/dA_log, A = −exp(A_log)
                partial[(size_t)B * H + (size_t)b * H + h] = dDh;
                if (dh0 != NULL) { memcpy(dh0 + ((size_t)b * H + h) * PN, dh, PN * sizeof(real)); }
            }
            free(ckpt);
        }
    }
    for (int h = 0; h < H; h++) {
        for (int b = 0; b < B; b++) {
            dA_log[h] += partial[(size_t)b * H + h];
            dD[h] += partial[(size_t)B * H + (size_t)b * H + h];
        }
    }
    free(partial);
}

// ----------------------------------------------------------------------------------------------------------------
// the mixer

typedef struct {
    real *proj;     // (B,T,R) rows z | x | B | C | dt
    real *conv_pre; // (B,T,CD) conv output (with bias) before SiLU
    real *conv_act; // (B,T,CD) x | B | C after SiLU
    real *dt;       // (B,T,H) softplus(dt_raw + dt_bias)
    real *y;        // (B,T,DI) the recurrence's outputs (with D x)
    real *gated;    // (B,T,DI) y ⊙ SiLU(z)
    real *normed;   // (B,T,DI)
    real *rstd;     // (B,T,G)
} Mamba2Acts;

static size_t mamba2_acts_layout(Mamba2Acts *a, real *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, DI = (size_t)mamba2_inner(c), H = (size_t)mamba2_heads(c);
    Arena ar = {base, 0};
    a->proj = arena_take(&ar, BT * mamba2_proj_rows(c));
    a->conv_pre = arena_take(&ar, BT * mamba2_conv_dim(c));
    a->conv_act = arena_take(&ar, BT * mamba2_conv_dim(c));
    a->dt = arena_take(&ar, BT * H);
    a->y = arena_take(&ar, BT * DI);
    a->gated = arena_take(&ar, BT * DI);
    a->normed = arena_take(&ar, BT * DI);
    a->rstd = arena_take(&ar, BT * c->mamba2.groups);
    return ar.used;
}

typedef struct { real *proj, *conv_act, *dt, *y, *gated, *normed; } Mamba2Grads; // same shapes

static size_t mamba2_scratch_layout(Mamba2Grads *g, real *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, DI = (size_t)mamba2_inner(c), H = (size_t)mamba2_heads(c);
    Arena ar = {base, 0};
    g->proj = arena_take(&ar, BT * mamba2_proj_rows(c));
    g->conv_act = arena_take(&ar, BT * mamba2_conv_dim(c));
    g->dt = arena_take(&ar, BT * H);
    g->y = arena_take(&ar, BT * DI);
    g->gated = arena_take(&ar, BT * DI);
    g->normed = arena_take(&ar, BT * DI);
    return ar.used;
}

static size_t mamba2_mixer_acts_size(const ModelConfig *c, int B, int T) { Mamba2Acts a; return mamba2_acts_layout(&a, NULL, c, B, T); }
static size_t mamba2_mixer_scratch_size(const ModelConfig *c, int B, int T) { Mamba2Grads g; return mamba2_scratch_layout(&g, NULL, c, B, T); }

// dt (BT, H) = softplus(dt_raw + dt_bias) (dt_raw: rows of stride `stride`)
static void mamba2_dt_forward(real *dt, const real *dt_raw, const real *dt_bias, int BT, int H, int stride) {
    for (int m = 0; m < BT; m++) {
        for (int h = 0; h < H; h++) { dt[(size_t)m * H + h] = softplusr(dt_raw[(size_t)m * stride + h] + dt_bias[h]); }
    }
}
// ddt_raw (view) +=, ddt_bias (H) += (tokens in order) from ddt
static void mamba2_dt_backward(real *ddt_raw, real *ddt_bias, const real *ddt, const real *dt_raw, const real *dt_bias,
                               int BT, int H, int stride) {
    for (int h = 0; h < H; h++) {
        real acc = 0;
        for (int m = 0; m < BT; m++) {
            const real g = ddt[(size_t)m * H + h] * sigmoidr(dt_raw[(size_t)m * stride + h] + dt_bias[h]);
            ddt_raw[(size_t)m * stride + h] += g;
            acc += g;
        }
        ddt_bias[h] += acc;
    }
}

// after the recurrence: the gate, the grouped norm, the output projection
static void mamba2_outputs_forward(real *out, Mamba2Acts *a, const Mamba2Params *w, const ModelConfig *c, int BT) {
    const int C = c->d_model, R = mamba2_proj_rows(c), DI = mamba2_inner(c);
    output_gate_forward(a->y, a->gated, NULL, a->proj, NULL, BT, DI, 0, R);
    group_rmsnorm_forward(a->normed, a->rstd, a->gated, w->norm_w, BT, DI, c->mamba2.groups);
    matmul_forward(out, a->normed, w->out_w, BT, DI, C);
}

// out (B,T,C); with state (decoding: B sequences' states, stride S numbers) the conv and h continue from it and are
// left updated, without (training) both start from zeros
static void mamba2_mixer_run(real *out, real *acts, const real *inp, const KindTensors *t, const ModelConfig *c, int B,
                             int T, real *state, size_t S) {
    const Mamba2Params *w = (const Mamba2Params *)t->w;
    Mamba2Acts a;
    mamba2_acts_layout(&a, acts, c, B, T);
    const int BT = B * T, C = c->d_model, R = mamba2_proj_rows(c), CD = mamba2_conv_dim(c), DI = mamba2_inner(c);
    const int H = mamba2_heads(c), N = c->mamba2.state, G = c->mamba2.groups, Wc = c->mamba2.conv;
    const size_t hn = (size_t)DI * N, conv_size = (size_t)(Wc - 1) * CD;
    matmul_forward(a.proj, inp, w->in_w, BT, C, R);
    if (state != NULL) {
        conv1d_silu_advance(a.conv_pre, a.conv_act, state, S, a.proj + DI, w->conv_w, w->conv_b, B, T, CD, Wc, R);
    } else {
        conv1d_silu_forward(a.conv_pre, a.conv_act, a.proj + DI, w->conv_w, w->conv_b, B, T, CD, Wc, R);
    }
    mamba2_dt_forward(a.dt, a.proj + DI + CD, w->dt_bias, BT, H, R);
    real *h0 = NULL;
    if (state != NULL) {
        h0 = (real *)mallocCheck((size_t)B * hn * sizeof(real));
        decode_state_move(h0, state, S, conv_size, hn, B, 0);
    }
    mamba2_recurrence_forward(a.y, h0, a.conv_act, a.conv_act + DI, a.conv_act + DI + G * N, CD, a.dt, w->A_log, w->D,
                              h0, B, T, H, c->mamba2.head_dim, N, G);
    if (state != NULL) {
        decode_state_move(h0, state, S, conv_size, hn, B, 1);
        free(h0);
    }
    mamba2_outputs_forward(out, &a, w, c, BT);
}

static void mamba2_mixer_forward(real *out, real *acts, const real *inp, const KindTensors *t, const ModelConfig *c,
                                 int B, int T) {
    mamba2_mixer_run(out, acts, inp, t, c, B, T, NULL, 0);
}

// dinp (B,T,C) +=, parameter grads +=; scratch zeroed by the caller
static void mamba2_mixer_backward(real *dinp, real *scratch, const real *dout, const real *inp, const real *acts,
                                  const KindTensors *t, const ModelConfig *c, int B, int T) {
    const Mamba2Params *w = (const Mamba2Params *)t->w, *gw = (const Mamba2Params *)t->g;
    Mamba2Acts a;
    mamba2_acts_layout(&a, (real *)acts, c, B, T);
    Mamba2Grads g;
    mamba2_scratch_layout(&g, scratch, c, B, T);
    const int BT = B * T, C = c->d_model, R = mamba2_proj_rows(c), CD = mamba2_conv_dim(c), DI = mamba2_inner(c);
    const int H = mamba2_heads(c), N = c->mamba2.state, G = c->mamba2.groups, GN = G * N;
    matmul_backward(g.normed, gw->out_w, dout, a.normed, w->out_w, BT, DI, C);
    group_rmsnorm_backward(g.gated, gw->norm_w, g.normed, a.gated, w->norm_w, a.rstd, BT, DI, G);
    output_gate_backward(g.y, g.proj, g.gated, a.y, a.proj, BT, DI, R);
    mamba2_recurrence_backward(g.conv_act, g.conv_act + DI, g.conv_act + DI + GN, g.dt, gw->A_log, gw->D, NULL, g.y,
                               NULL, a.conv_act, a.conv_act + DI, a.conv_act + DI + GN, CD, a.dt, w->A_log, w->D, NULL,
                               B, T, H, c->mamba2.head_dim, N, G);
    mamba2_dt_backward(g.proj + DI + CD, gw->dt_bias, g.dt, a.proj + DI + CD, w->dt_bias, BT, H, R);
    conv1d_silu_backward(g.proj + DI, gw->conv_w, gw->conv_b, g.conv_act, a.conv_pre, a.proj + DI, w->conv_w, B, T, CD,
                         c->mamba2.conv, R);
    matmul_backward(dinp, gw->in_w, g.proj, inp, w->in_w, BT, C, R);
}

// Decoding: B sequences advance by T tokens. A sequence's state: the conv's last W−1 inputs (W−1, CD), then h
// (H, P, N).
static void mamba2_mixer_advance(real *out, real *state, const real *inp, const KindTensors *t, const ModelConfig *c,
                                 int B, int T, const int *pos, int context) {
    real *acts = (real *)mallocCheck(mamba2_mixer_acts_size(c, B, T) * sizeof(real));
    mamba2_mixer_run(out, acts, inp, t, c, B, T, state, mamba2_decode_state(c, context));
    free(acts);
}

static const KindOps MAMBA2_OPS = {'S', mamba2_mixer_acts_size, mamba2_mixer_scratch_size, mamba2_mixer_forward,
                                   mamba2_mixer_backward, mamba2_mixer_advance};

#endif // M2RNN_REF_MAMBA2_H
