/*
ref/m2rnn.h: the CPU reference of the M²RNN mixer, forward and hand-written backward, exactly as the authors' layer
(spec m2rnn_authors_code.md §1 and §6):

  proj = x W_inᵀ                      rows q (Nq·K) | k (Nq·K) | v (N·Vh) | f_raw (N) | g (N·Vh), no biases
  q,k,v = SiLU(causal_conv4(proj[q|k|v]))
  f = exp(−exp(A_log) · softplus(f_raw + dt_bias))       per head; the paper's (1+e^{x+β})^{−α}
  per (b, n), H ∈ R^{K×Vh}, H_{−1} = h0 (0 in training):
     Z_t = tanh(H_{t−1} W_n + k_t v_tᵀ)   W multiplies from the RIGHT: (HW)[k,j] = Σ_i H[k,i] W[i,j]
     H_t = f_t H_{t−1} + (1 − f_t) Z_t
     y_t = H_tᵀ q_t                       q/k head of value head n: n / (N / Nq)
  y += v ⊙ D;  y ← y ⊙ SiLU(g);  y ← RMSNorm over all N·Vh channels (one norm, not per head);  out = y W_outᵀ
  (with group_norm, one RMSNorm per q/k group of N/Nq heads: the paper's topology-aware TP layer; in a tensor-parallel
  rank's local config with tp_norm > 1, RMSNormTP over the group's ranks)

The mixer is the M row of layers.h behind the KindOps interface (ref/common.h): forward, backward, the advance of
decoding (prefill and step), and the sizes of its saved activations and backward scratch. GPU twin: m2rnn.cuh.

Where the paper and the code differ we follow the code: the paper writes RMSNorm per head (y_gt = RMSNorm(y_t ⊙ g_t)
∈ R^V); the authors' layer normalises the concatenation of all heads (spec §2 item 5).

The backward clamps the CARRIED state gradient with the authors' Triton-kernel semantics (spec §2 item 3, §6 item 6):
at reverse step t the gradient arriving from step t+1 (for the last step: the incoming d(final state)) is clamped to
[−c, c] elementwise, then the local term q_t dy_tᵀ is added; dh0 is not clamped. (Their PyTorch fallback clamps the
total dH instead; the two agree when nothing is clamped.)
*/
#ifndef M2RNN_REF_M2RNN_H
#define M2RNN_REF_M2RNN_H

#include "ref/common.h"
#include "ref/conv.h"
#include "ref/gate.h"

// ----------------------------------------------------------------------------------------------------------------
// the recurrence

// z (Vh) = tanh(hprev (Vh) W + k_r v (Vh)): one row of Z_t; hprev NULL means H_{t−1} = 0. The loop runs over the
// contiguous j inside, so it vectorizes; tanhr is tanhf in the fp32 build (double tanh there cost most of a step).
static inline void m2rnn_z_row(real *z, const real *hprev, const real *W, real kr, const real *v, int Vh) {
    for (int j = 0; j < Vh; j++) { z[j] = kr * v[j]; }
    if (hprev != NULL) {
        for (int i = 0; i < Vh; i++) {
            const real h = hprev[i];
            const real *wrow = W + (size_t)i * Vh;
#pragma omp simd
            for (int j = 0; j < Vh; j++) { z[j] += h * wrow[j]; }
        }
    }
    for (int j = 0; j < Vh; j++) { z[j] = tanhr(z[j]); }
}

// y (B,T,N,Vh) = H_tᵀ q_t; h_all (B,T,N,K,Vh) receives every H_t and z_all (same shape) every Z_t if not NULL;
// h_final (B,N,K,Vh) receives H_{T−1} if not NULL. q, k: (B,T,Nq,K) and v: (B,T,N,Vh) are views with token stride `stride` (elements); f (B,T,N) dense;
// W (N,Vh,Vh); h0 (B,N,K,Vh) or NULL for zeros.
static void m2rnn_recurrence_forward(real *y, real *h_all, real *z_all, real *h_final, const real *q, const real *k,
                                     const real *v,
                                     int stride, const real *f, const real *W, const real *h0, int B, int T, int N,
                                     int Nq, int K, int Vh) {
    const int heads_per_qk = N / Nq;
    const size_t state = (size_t)K * Vh;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int n = 0; n < N; n++) {
            real *H = (real *)mallocCheck(2 * state * sizeof(real)); // H_{t−1} and H_t
            real *Hprev = H, *Hcur = H + state;
            if (h0 != NULL) { memcpy(Hprev, h0 + ((size_t)b * N + n) * state, state * sizeof(real)); }
            else { memset(Hprev, 0, state * sizeof(real)); }
            const real *Wn = W + (size_t)n * Vh * Vh;
            const int hq = n / heads_per_qk;
            for (int t = 0; t < T; t++) {
                const size_t bt = (size_t)b * T + t;
                const real *qt = q + bt * stride + (size_t)hq * K, *kt = k + bt * stride + (size_t)hq * K;
                const real *vt = v + bt * stride + (size_t)n * Vh;
                const real ft = f[bt * N + n];
                real *yt = y + (bt * N + n) * Vh;
                for (int j = 0; j < Vh; j++) { yt[j] = 0; }
                for (int r = 0; r < K; r++) {
                    const real *hrow = Hprev + (size_t)r * Vh;
                    real *hnew = Hcur + (size_t)r * Vh;
                    m2rnn_z_row(hnew, hrow, Wn, kt[r], vt, Vh);
                    if (z_all != NULL) { memcpy(z_all + ((bt * N + n) * K + r) * Vh, hnew, Vh * sizeof(real)); }
#pragma omp simd
                    for (int j = 0; j < Vh; j++) {
                        hnew[j] = ft * hrow[j] + (1 - ft) * hnew[j];
                        yt[j] += hnew[j] * qt[r];
                    }
                }
                if (h_all != NULL) { memcpy(h_all + (bt * N + n) * state, Hcur, state * sizeof(real)); }
                real *tmp = Hprev; Hprev = Hcur; Hcur = tmp;
            }
            if (h_final != NULL) { memcpy(h_final + ((size_t)b * N + n) * state, Hprev, state * sizeof(real)); }
            free(H);
        }
    }
}

// Backward of the recurrence given every saved state h_all (B,T,N,K,Vh) and, if not NULL, every Z_t (z_all, same
// shape; NULL recomputes Z_t from H_{t−1}, which costs a tanh per state element again).
// dq, dk, dv: views with token stride `stride` (+=); df (B,T,N) +=; dW (N,Vh,Vh) +=; dh0 (B,N,K,Vh) = (may be NULL);
// dy (B,T,N,Vh); dh_final (B,N,K,Vh) or NULL; clamp: c > 0 clamps the carried dH to [−c, c], c = 0 disables.
// Parallel over heads, batch and time in order inside: dW and the per-head dq/dk partials are deterministic; the
// partials of the heads sharing one q/k head are summed afterwards in head order (no races, no atomics).
static void m2rnn_recurrence_backward(real *dq, real *dk, real *dv, real *df, real *dW, real *dh0, const real *dy,
                                      const real *dh_final, const real *q, const real *k, const real *v, int stride,
                                      const real *f, const real *W, const real *h0, const real *h_all,
                                      const real *z_all, real clamp,
                                      int B, int T, int N, int Nq, int K, int Vh) {
    const int heads_per_qk = N / Nq;
    const size_t state = (size_t)K * Vh;
    real *dq_heads = (real *)callocCheck((size_t)B * T * N * K, sizeof(real)); // (B,T,N,K) per-head partials
    real *dk_heads = (real *)callocCheck((size_t)B * T * N * K, sizeof(real));
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        real *G = (real *)mallocCheck(4 * state * sizeof(real)); // carried dL/dH, D, dP, Z
        real *Dm = G + state, *dP = G + 2 * state, *Z = G + 3 * state;
        const real *Wn = W + (size_t)n * Vh * Vh;
        real *dWn = dW + (size_t)n * Vh * Vh;
        const int hq = n / heads_per_qk;
        for (int b = 0; b < B; b++) {
            if (dh_final != NULL) { memcpy(G, dh_final + ((size_t)b * N + n) * state, state * sizeof(real)); }
            else { memset(G, 0, state * sizeof(real)); }
            for (int t = T - 1; t >= 0; t--) {
                const size_t bt = (size_t)b * T + t;
                const real *Ht = h_all + (bt * N + n) * state;
                const real *Hprev = t > 0 ? h_all + ((bt - 1) * N + n) * state
                                          : (h0 != NULL ? h0 + ((size_t)b * N + n) * state : NULL);
                const real *qt = q + bt * stride + (size_t)hq * K, *kt = k + bt * stride + (size_t)hq * K;
                const real *vt = v + bt * stride + (size_t)n * Vh;
                const real *dyt = dy + (bt * N + n) * Vh;
                const real ft = f[bt * N + n];
                real *dqt = dq_heads + (bt * N + n) * K, *dkt = dk_heads + (bt * N + n) * K;
                real *dvt = dv + bt * stride + (size_t)n * Vh;
                // recompute Z_t from H_{t−1}
                if (z_all != NULL) {
                    memcpy(Z, z_all + (bt * N + n) * state, state * sizeof(real));
                } else {
                    for (int r = 0; r < K; r++) {
                        m2rnn_z_row(Z + (size_t)r * Vh, Hprev != NULL ? Hprev + (size_t)r * Vh : NULL, Wn, kt[r], vt, Vh);
                    }
                }
                // D = q_t dy_tᵀ + clamp(G): the total gradient w.r.t. H_t
                real dft = 0;
                for (int r = 0; r < K; r++) {
                    real dq_r = 0;
                    for (int j = 0; j < Vh; j++) {
                        const size_t e = (size_t)r * Vh + j;
                        real g = G[e];
                        if (clamp > 0) { g = g > clamp ? clamp : (g < -clamp ? -clamp : g); }
                        Dm[e] = qt[r] * dyt[j] + g;
                        dq_r += Ht[e] * dyt[j];
                        const real hp = Hprev != NULL ? Hprev[e] : 0;
                        dft += Dm[e] * (hp - Z[e]);
                        dP[e] = Dm[e] * (1 - ft) * (1 - Z[e] * Z[e]);
                    }
                    dqt[r] += dq_r;
                }
                df[bt * N + n] += dft;
                // dk_t = dP v_t, dv_t = dPᵀ k_t, dW += H_{t−1}ᵀ dP
                for (int r = 0; r < K; r++) {
                    real acc = 0;
                    for (int j = 0; j < Vh; j++) { acc += dP[(size_t)r * Vh + j] * vt[j]; }
                    dkt[r] += acc;
                }
                for (int r = 0; r < K; r++) {
                    const real *dPr = dP + (size_t)r * Vh;
#pragma omp simd
                    for (int j = 0; j < Vh; j++) { dvt[j] += dPr[j] * kt[r]; }
                    if (Hprev != NULL) {
                        for (int i = 0; i < Vh; i++) {
                            const real h = Hprev[(size_t)r * Vh + i];
                            real *dWrow = dWn + (size_t)i * Vh;
#pragma omp simd
                            for (int j = 0; j < Vh; j++) { dWrow[j] += h * dPr[j]; }
                        }
                    }
                }
                // carried gradient into H_{t−1}: f D + dP Wᵀ
                for (int r = 0; r < K; r++) {
                    for (int i = 0; i < Vh; i++) {
                        real acc = ft * Dm[(size_t)r * Vh + i];
                        for (int j = 0; j < Vh; j++) { acc += dP[(size_t)r * Vh + j] * Wn[(size_t)i * Vh + j]; }
                        G[(size_t)r * Vh + i] = acc;
                    }
                }
            }
            if (dh0 != NULL) { memcpy(dh0 + ((size_t)b * N + n) * state, G, state * sizeof(real)); }
        }
        free(G);
    }
    // sum the per-head partials into the shared q/k heads, heads in order
#pragma omp parallel for schedule(static)
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {
        for (int n = 0; n < N; n++) {
            const int hq = n / heads_per_qk;
            real *dqt = dq + bt * stride + (size_t)hq * K, *dkt = dk + bt * stride + (size_t)hq * K;
            const real *pq = dq_heads + (bt * N + n) * K, *pk = dk_heads + (bt * N + n) * K;
            for (int r = 0; r < K; r++) { dqt[r] += pq[r]; dkt[r] += pk[r]; }
        }
    }
    free(dq_heads);
    free(dk_heads);
}

// ----------------------------------------------------------------------------------------------------------------
// the mixer

typedef struct { M2RNN_PARAMS(VIEW_FIELD) } M2RNNParams; // the layer's tensors, in the layers.h row's order

typedef struct {
    real *proj;     // (B,T,R) input projection, rows q|k|v|f_raw|g
    real *conv_pre; // (B,T,CD) conv output before SiLU
    real *conv_act; // (B,T,CD) q|k|v after SiLU
    real *f;        // (B,T,N) forget gate
    real *h;        // (B,T,N,K,Vh) every state H_t, read by the backward
    real *z;        // (B,T,N,K,Vh) every Z_t, so the backward need not recompute the tanh
    real *y;        // (B,T,N*Vh) Hᵀq + v ⊙ D
    real *gated;    // (B,T,N*Vh) y ⊙ SiLU(g)
    real *normed;   // (B,T,N*Vh) RMSNorm(gated)
    real *rstd;     // (B,T,G) G = the norm's groups (1 unless group_norm)
} M2RNNActs;

// the activations inside one layer's block (base NULL: sizes only); returns the numbers it takes
static size_t m2rnn_acts_layout(M2RNNActs *a, real *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, N = (size_t)c->m2rnn.heads, NV = N * c->m2rnn.v;
    const size_t state = (size_t)c->m2rnn.k * c->m2rnn.v, CD = (size_t)m2rnn_conv_dim(c);
    Arena ar = {base, 0};
    a->proj = arena_take(&ar, BT * m2rnn_proj_rows(c));
    a->conv_pre = arena_take(&ar, BT * CD);
    a->conv_act = arena_take(&ar, BT * CD);
    a->f = arena_take(&ar, BT * N);
    a->h = arena_take(&ar, BT * N * state);
    a->z = arena_take(&ar, BT * N * state);
    a->y = arena_take(&ar, BT * NV);
    a->gated = arena_take(&ar, BT * NV);
    a->normed = arena_take(&ar, BT * NV);
    a->rstd = arena_take(&ar, BT * m2rnn_norm_groups(c));
    return ar.used;
}

// gradient scratch of the mixer's activations (same shapes as the fields of M2RNNActs)
typedef struct { real *proj, *conv_act, *f, *y, *gated, *normed; } M2RNNGrads;

static size_t m2rnn_scratch_layout(M2RNNGrads *g, real *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, NV = (size_t)c->m2rnn.heads * c->m2rnn.v;
    Arena ar = {base, 0};
    g->proj = arena_take(&ar, BT * m2rnn_proj_rows(c));
    g->conv_act = arena_take(&ar, BT * m2rnn_conv_dim(c));
    g->f = arena_take(&ar, BT * c->m2rnn.heads);
    g->y = arena_take(&ar, BT * NV);
    g->gated = arena_take(&ar, BT * NV);
    g->normed = arena_take(&ar, BT * NV);
    return ar.used;
}

static size_t m2rnn_mixer_acts_size(const ModelConfig *c, int B, int T) { M2RNNActs a; return m2rnn_acts_layout(&a, NULL, c, B, T); }
static size_t m2rnn_mixer_scratch_size(const ModelConfig *c, int B, int T) { M2RNNGrads g; return m2rnn_scratch_layout(&g, NULL, c, B, T); }

// out (B,T,C) = M2RNN(inp (B,T,C)); saves what the backward needs in acts. With state (decoding: B sequences'
// decode states, stride S numbers), the conv continues from each sequence's window and the recurrence from its H,
// both left updated; without (training) both start from zeros.
static void m2rnn_mixer_run(real *out, real *acts, const real *inp, const KindTensors *t, const ModelConfig *c, int B,
                            int T, real *state, size_t S) {
    const M2RNNParams *w = (const M2RNNParams *)t->w;
    M2RNNActs a;
    m2rnn_acts_layout(&a, acts, c, B, T);
    const int BT = B * T, C = c->d_model, R = m2rnn_proj_rows(c), CD = m2rnn_conv_dim(c), W = c->m2rnn.conv;
    const int N = c->m2rnn.heads, Nq = c->m2rnn.qk_heads, K = c->m2rnn.k, Vh = c->m2rnn.v, NV = N * Vh;
    const int off_v = 2 * Nq * K, off_f = CD, off_g = CD + N;
    const size_t Hn = (size_t)N * K * Vh, conv_size = (size_t)(W - 1) * CD;
    matmul_forward(a.proj, inp, w->in_w, BT, C, R);
    if (state != NULL) {
        conv1d_silu_advance(a.conv_pre, a.conv_act, state, S, a.proj, w->conv_w, NULL, B, T, CD, W, R);
    } else {
        conv1d_silu_forward(a.conv_pre, a.conv_act, a.proj, w->conv_w, NULL, B, T, CD, W, R);
    }
    decay_gate_forward(a.f, a.proj + off_f, w->A_log, w->dt_bias, BT, N, R);
    const real *q = a.conv_act, *k = a.conv_act + Nq * K, *v = a.conv_act + off_v;
    real *H = NULL;
    if (state != NULL) {
        H = (real *)mallocCheck((size_t)B * Hn * sizeof(real));
        decode_state_move(H, state, S, conv_size, Hn, B, 0);
    }
    m2rnn_recurrence_forward(a.y, a.h, a.z, H, q, k, v, CD, a.f, w->W, H, B, T, N, Nq, K, Vh);
    if (state != NULL) {
        decode_state_move(H, state, S, conv_size, Hn, B, 1);
        free(H);
    }
    output_gate_forward(a.y, a.gated, v, a.proj + off_g, w->D, BT, NV, CD, R);
    mixer_norm_forward(a.normed, a.rstd, a.gated, w->norm_w, BT, NV, m2rnn_norm_groups(c), c->m2rnn.tp_norm, t->tp);
    matmul_forward(out, a.normed, w->out_w, BT, NV, C);
}

static void m2rnn_mixer_forward(real *out, real *acts, const real *inp, const KindTensors *t, const ModelConfig *c,
                                int B, int T) {
    m2rnn_mixer_run(out, acts, inp, t, c, B, T, NULL, 0);
}

// dinp (B,T,C) +=, parameter grads += ; scratch zeroed by the caller; dout (B,T,C)
static void m2rnn_mixer_backward(real *dinp, real *scratch, const real *dout, const real *inp, const real *acts,
                                 const KindTensors *t, const ModelConfig *c, int B, int T) {
    const M2RNNParams *w = (const M2RNNParams *)t->w, *gw = (const M2RNNParams *)t->g;
    M2RNNActs a;
    m2rnn_acts_layout(&a, (real *)acts, c, B, T);
    M2RNNGrads g;
    m2rnn_scratch_layout(&g, scratch, c, B, T);
    const int BT = B * T, C = c->d_model, R = m2rnn_proj_rows(c), CD = m2rnn_conv_dim(c);
    const int N = c->m2rnn.heads, Nq = c->m2rnn.qk_heads, K = c->m2rnn.k, Vh = c->m2rnn.v, NV = N * Vh;
    const int off_v = 2 * Nq * K, off_f = CD, off_g = CD + N;
    // out = normed W_outᵀ
    matmul_backward(g.normed, gw->out_w, dout, a.normed, w->out_w, BT, NV, C);
    // normed = RMSNorm(gated)
    mixer_norm_backward(g.gated, gw->norm_w, g.normed, a.gated, w->norm_w, a.rstd, BT, NV, m2rnn_norm_groups(c),
                        c->m2rnn.tp_norm, t->tp);
    // gated = y ⊙ SiLU(g_raw);  y = Hᵀq + v ⊙ D
    const real *v = a.conv_act + off_v;
    output_gate_backward(g.y, g.proj + off_g, g.gated, a.y, a.proj + off_g, BT, NV, R);
    residual_backward(g.conv_act + off_v, gw->D, g.y, v, w->D, BT, NV, CD);
    // the recurrence
    const real *q = a.conv_act, *k = a.conv_act + Nq * K;
    real *dq = g.conv_act, *dk = g.conv_act + Nq * K, *dv = g.conv_act + off_v;
    m2rnn_recurrence_backward(dq, dk, dv, g.f, gw->W, NULL, g.y, NULL, q, k, v, CD, a.f, w->W, NULL, a.h, a.z,
                              c->m2rnn.grad_clamp, B, T, N, Nq, K, Vh);
    // the gate, then SiLU and the conv
    decay_gate_backward(g.proj + off_f, gw->A_log, gw->dt_bias, g.f, a.f, a.proj + off_f, w->A_log, w->dt_bias, BT, N, R);
    conv1d_silu_backward(g.proj, gw->conv_w, NULL, g.conv_act, a.conv_pre, a.proj, w->conv_w, B, T, CD, c->m2rnn.conv, R);
    // proj = inp W_inᵀ
    matmul_backward(dinp, gw->in_w, g.proj, inp, w->in_w, BT, C, R);
}

// Decoding: B sequences advance by T tokens. A sequence's state: the conv's last W−1 inputs (W−1, CD), then H
// (N, K, V). The forward's arithmetic from the state: a chunk continues the whole sequence's forward bit for bit.
static void m2rnn_mixer_advance(real *out, real *state, const real *inp, const KindTensors *t, const ModelConfig *c,
                                int B, int T, const int *pos, int context) {
    real *acts = (real *)mallocCheck(m2rnn_mixer_acts_size(c, B, T) * sizeof(real));
    m2rnn_mixer_run(out, acts, inp, t, c, B, T, state, m2rnn_decode_state(c, context));
    free(acts);
}

static const KindOps M2RNN_OPS = {'M', m2rnn_mixer_acts_size, m2rnn_mixer_scratch_size, m2rnn_mixer_forward,
                                  m2rnn_mixer_backward, m2rnn_mixer_advance};

#endif // M2RNN_REF_M2RNN_H
