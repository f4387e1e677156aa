/*
ref/moe.h: the CPU reference of the mixture-of-experts feed-forward (the e row of layers.h, whose comment gives the
layer), forward and hand-written backward.

Forward for M tokens: logits = x W_rᵀ (M, E); p = softmax(logits); the K largest logits of each token (ties to the
lower expert) with weights w = softmax over those K; the assignments (token, k) grouped by expert, tokens in order
within an expert; each expert's SwiGLU over its tokens; out[t] = Σ_k w_tk y_(t,k) (k in order) + shared(x)[t].
aux = coef · E · Σ_e P̄_e f_e, P̄_e = (1/M) Σ_t p_te, f_e = count_e / (M K).

Backward (g = dout): dy_(t,k) = w_tk g_t; dw_tk = <g_t, y_(t,k)>; each expert's SwiGLU backward; dx_t = Σ_k dx_(t,k)
(k in order: no scatter races); the top-k softmax: dlogit_j = w_j (dw_j − Σ_i w_i dw_i) for the K chosen; the aux
loss: dp_te = aux_grad · coef · E · f_e / M, through the softmax dlogit_t += p_t ⊙ (dp_t − <p_t, dp_t>) (f is a count:
no gradient; evaluated without cancellation, moe_aux_dlogit); the router: dx += dlogits W_r, dW_r += dlogitsᵀ x. Every sum runs in a fixed order: deterministic.
GPU twin: moe.cuh (test/test_moe_gpu.cu holds it to this file).
*/
#ifndef M2RNN_REF_MOE_H
#define M2RNN_REF_MOE_H

#include "ref/common.h"

typedef struct { MOE_PARAMS(VIEW_FIELD) } MoEParams; // the layer's tensors, in the layers.h row's order

typedef struct {
    real *logits, *probs; // (M, E)
    real *weights;        // (M, K) the renormalized top-k weights
    real *choice;         // (M, K) the chosen experts (integers)
    real *slot;           // (M, K) each assignment's row in the expert-ordered arrays below
    real *order;          // (M·K) the token of each expert-ordered row
    real *offsets;        // (E + 1) first row of each expert
    real *xs;             // (M·K, C) the tokens' inputs in expert order
    real *up, *h, *y;     // (M·K, 2F), (M·K, F), (M·K, C) per assignment, expert order
    real *sup, *sh;       // (M, 2S), (M, S) the shared expert
} MoEActs;

static size_t moe_acts_layout(MoEActs *a, real *base, const ModelConfig *c, int B, int T) {
    const size_t M = (size_t)B * T, E = (size_t)c->moe.experts, K = (size_t)c->moe.top_k, F = (size_t)c->moe.hidden;
    const size_t C = (size_t)c->d_model, S = (size_t)c->moe.shared;
    Arena ar = {base, 0};
    a->logits = arena_take(&ar, M * E);
    a->probs = arena_take(&ar, M * E);
    a->weights = arena_take(&ar, M * K);
    a->choice = arena_take(&ar, M * K);
    a->slot = arena_take(&ar, M * K);
    a->order = arena_take(&ar, M * K);
    a->offsets = arena_take(&ar, E + 1);
    a->xs = arena_take(&ar, M * K * C);
    a->up = arena_take(&ar, M * K * 2 * F);
    a->h = arena_take(&ar, M * K * F);
    a->y = arena_take(&ar, M * K * C);
    a->sup = arena_take(&ar, M * 2 * S);
    a->sh = arena_take(&ar, M * S);
    return ar.used;
}

typedef struct { real *dlogits, *dw, *dy, *dh, *dup, *dxs, *dsh, *dsup; } MoEGrads;

static size_t moe_scratch_layout(MoEGrads *g, real *base, const ModelConfig *c, int B, int T) {
    const size_t M = (size_t)B * T, E = (size_t)c->moe.experts, K = (size_t)c->moe.top_k, F = (size_t)c->moe.hidden;
    const size_t C = (size_t)c->d_model, S = (size_t)c->moe.shared;
    Arena ar = {base, 0};
    g->dlogits = arena_take(&ar, M * E);
    g->dw = arena_take(&ar, M * K);
    g->dy = arena_take(&ar, M * K * C);
    g->dh = arena_take(&ar, M * K * F);
    g->dup = arena_take(&ar, M * K * 2 * F);
    g->dxs = arena_take(&ar, M * K * C);
    g->dsh = arena_take(&ar, M * S);
    g->dsup = arena_take(&ar, M * 2 * S);
    return ar.used;
}

static size_t moe_ffn_acts_size(const ModelConfig *c, int B, int T) { MoEActs a; return moe_acts_layout(&a, NULL, c, B, T); }
static size_t moe_ffn_scratch_size(const ModelConfig *c, int B, int T) { MoEGrads g; return moe_scratch_layout(&g, NULL, c, B, T); }

// the router: probabilities, the top-k with their renormalized weights, the assignments grouped by expert
static void moe_route(MoEActs *a, const real *inp, const MoEParams *w, const ModelConfig *c, int M) {
    const int E = c->moe.experts, K = c->moe.top_k;
    matmul_forward(a->logits, inp, w->router_w, M, c->d_model, E);
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        const real *l = a->logits + (size_t)m * E;
        real *p = a->probs + (size_t)m * E;
        real mx = l[0];
        for (int e = 1; e < E; e++) { mx = l[e] > mx ? l[e] : mx; }
        double sum = 0.0;
        for (int e = 0; e < E; e++) { sum += exp((double)(l[e] - mx)); }
        for (int e = 0; e < E; e++) { p[e] = (real)(exp((double)(l[e] - mx)) / sum); }
        // top-k by repeated selection: the largest logit not yet chosen, the lower expert on ties
        int chosen[64];
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) { taken |= chosen[j] == e; }
                if (!taken && (best < 0 || l[e] > l[best])) { best = e; }
            }
            chosen[k] = best;
        }
        double ws = 0.0; // softmax over the chosen logits (the first is the largest)
        for (int k = 0; k < K; k++) { ws += exp((double)(l[chosen[k]] - l[chosen[0]])); }
        for (int k = 0; k < K; k++) {
            a->choice[(size_t)m * K + k] = (real)chosen[k];
            a->weights[(size_t)m * K + k] = (real)(exp((double)(l[chosen[k]] - l[chosen[0]])) / ws);
        }
    }
    // group by expert: counts, offsets, then each assignment's row (tokens in order within an expert)
    int *count = (int *)callocCheck((size_t)E + 1, sizeof(int));
    for (size_t i = 0; i < (size_t)M * K; i++) { count[(int)a->choice[i]]++; }
    a->offsets[0] = 0;
    for (int e = 0; e < E; e++) { a->offsets[e + 1] = a->offsets[e] + count[e]; count[e] = (int)a->offsets[e]; }
    for (int m = 0; m < M; m++) {
        for (int k = 0; k < K; k++) {
            const int e = (int)a->choice[(size_t)m * K + k], row = count[e]++;
            a->slot[(size_t)m * K + k] = (real)row;
            a->order[row] = (real)m;
        }
    }
    free(count);
}

// The aux loss's logit gradient of one token, dl_e = p_e (dp_e − Σ_j p_j dp_j) with dp_j = inv · count_j, written so
// that nothing cancels when the router is sure (p_top → 1, where 1 − p_top is below fp32's resolution of p_top): with
// Σ p = 1, dp_e − Σ p dp = inv (c_e − p_top c_top − q) where q = Σ_{j≠top} p_j c_j, and for e = top
// inv (c_top · others − q) with others = Σ_{j≠top} p_j. The GPU (moe.cuh) computes the same expression.
static inline double moe_aux_dlogit(double p_e, double p_top, double c_e, double c_top, int is_top, double others,
                                    double q, double inv) {
    return p_e * inv * (is_top ? c_top * others - q : c_e - p_top * c_top - q);
}

// SwiGLU pointwise: h = SiLU(gate) ⊙ linear over rows of 2F → F
static void moe_swiglu(real *h, const real *up, size_t rows, int F) {
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        for (int i = 0; i < F; i++) { h[r * F + i] = siluf(up[r * 2 * F + i]) * up[r * 2 * F + F + i]; }
    }
}
static void moe_swiglu_backward(real *dup, const real *dh, const real *up, size_t rows, int F) {
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        for (int i = 0; i < F; i++) {
            const real g = up[r * 2 * F + i], lin = up[r * 2 * F + F + i], d = dh[r * F + i];
            dup[r * 2 * F + i] += d * lin * silu_grad(g);
            dup[r * 2 * F + F + i] += d * siluf(g);
        }
    }
}

static void moe_ffn_forward(real *out, real *acts, const real *inp, const KindTensors *t, const ModelConfig *c, int B,
                            int T) {
    const MoEParams *w = (const MoEParams *)t->w;
    MoEActs a;
    moe_acts_layout(&a, acts, c, B, T);
    const int M = B * T, C = c->d_model, E = c->moe.experts, K = c->moe.top_k, F = c->moe.hidden, S = c->moe.shared;
    moe_route(&a, inp, w, c, M);
    for (int r = 0; r < M * K; r++) { memcpy(a.xs + (size_t)r * C, inp + (size_t)a.order[r] * C, (size_t)C * sizeof(real)); }
    for (int e = 0; e < E; e++) { // each expert over its rows
        const int r0 = (int)a.offsets[e], n = (int)a.offsets[e + 1] - r0;
        if (n == 0) { continue; }
        matmul_forward(a.up + (size_t)r0 * 2 * F, a.xs + (size_t)r0 * C, w->up_w + (size_t)e * 2 * F * C, n, C, 2 * F);
        moe_swiglu(a.h + (size_t)r0 * F, a.up + (size_t)r0 * 2 * F, (size_t)n, F);
        matmul_forward(a.y + (size_t)r0 * C, a.h + (size_t)r0 * F, w->down_w + (size_t)e * C * F, n, F, C);
    }
    if (S > 0) {
        matmul_forward(a.sup, inp, w->shared_up_w, M, C, 2 * S);
        moe_swiglu(a.sh, a.sup, (size_t)M, S);
        matmul_forward(out, a.sh, w->shared_down_w, M, S, C);
    } else {
        memset(out, 0, (size_t)M * C * sizeof(real));
    }
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        real *o = out + (size_t)m * C;
        for (int k = 0; k < K; k++) {
            const real wk = a.weights[(size_t)m * K + k], *y = a.y + (size_t)a.slot[(size_t)m * K + k] * C;
            for (int i = 0; i < C; i++) { o[i] += wk * y[i]; }
        }
    }
    if (t->aux != NULL && moe_aux_coef(c) > 0) {
        double aux = 0.0;
        for (int e = 0; e < E; e++) {
            double pbar = 0.0;
            for (int m = 0; m < M; m++) { pbar += a.probs[(size_t)m * E + e]; }
            aux += (pbar / M) * ((a.offsets[e + 1] - a.offsets[e]) / ((double)M * K));
        }
        *t->aux += moe_aux_coef(c) * E * aux;
    }
}

// dinp (B,T,C) +=, parameter grads +=; scratch zeroed by the caller
static void moe_ffn_backward(real *dinp, real *scratch, const real *dout, const real *inp, const real *acts,
                             const KindTensors *t, const ModelConfig *c, int B, int T) {
    const MoEParams *w = (const MoEParams *)t->w, *gw = (const MoEParams *)t->g;
    MoEActs a;
    moe_acts_layout(&a, (real *)acts, c, B, T);
    MoEGrads g;
    moe_scratch_layout(&g, scratch, c, B, T);
    const int M = B * T, C = c->d_model, E = c->moe.experts, K = c->moe.top_k, F = c->moe.hidden, S = c->moe.shared;
    if (S > 0) {
        matmul_backward(g.dsh, gw->shared_down_w, dout, a.sh, w->shared_down_w, M, S, C);
        moe_swiglu_backward(g.dsup, g.dsh, a.sup, (size_t)M, S);
        matmul_backward(dinp, gw->shared_up_w, g.dsup, inp, w->shared_up_w, M, C, 2 * S);
    }
    // the weighted sum: dy of each assignment, dw of each weight
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        const real *gm = dout + (size_t)m * C;
        for (int k = 0; k < K; k++) {
            const size_t row = (size_t)a.slot[(size_t)m * K + k];
            const real wk = a.weights[(size_t)m * K + k], *y = a.y + row * C;
            real *dy = g.dy + row * C, d = 0;
            for (int i = 0; i < C; i++) { dy[i] = wk * gm[i]; d += gm[i] * y[i]; }
            g.dw[(size_t)m * K + k] = d;
        }
    }
    for (int e = 0; e < E; e++) { // each expert's SwiGLU backward
        const int r0 = (int)a.offsets[e], n = (int)a.offsets[e + 1] - r0;
        if (n == 0) { continue; }
        matmul_backward(g.dh + (size_t)r0 * F, gw->down_w + (size_t)e * C * F, g.dy + (size_t)r0 * C, a.h + (size_t)r0 * F,
                        w->down_w + (size_t)e * C * F, n, F, C);
        moe_swiglu_backward(g.dup + (size_t)r0 * 2 * F, g.dh + (size_t)r0 * F, a.up + (size_t)r0 * 2 * F, (size_t)n, F);
        matmul_backward(g.dxs + (size_t)r0 * C, gw->up_w + (size_t)e * 2 * F * C, g.dup + (size_t)r0 * 2 * F,
                        a.xs + (size_t)r0 * C, w->up_w + (size_t)e * 2 * F * C, n, C, 2 * F);
    }
    // back to tokens (k in order), the router's softmaxes
    const double aux_scale = moe_aux_coef(c) > 0 ? (double)t->aux_grad * moe_aux_coef(c) * E : 0.0;
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        real *dx = dinp + (size_t)m * C, *dl = g.dlogits + (size_t)m * E;
        const real *p = a.probs + (size_t)m * E;
        for (int k = 0; k < K; k++) {
            const real *d = g.dxs + (size_t)a.slot[(size_t)m * K + k] * C;
            for (int i = 0; i < C; i++) { dx[i] += d[i]; }
        }
        double s = 0.0; // the top-k softmax
        for (int k = 0; k < K; k++) { s += (double)a.weights[(size_t)m * K + k] * g.dw[(size_t)m * K + k]; }
        for (int k = 0; k < K; k++) {
            const real wk = a.weights[(size_t)m * K + k];
            dl[(int)a.choice[(size_t)m * K + k]] += (real)(wk * (g.dw[(size_t)m * K + k] - s));
        }
        if (aux_scale != 0.0) { // dp_e = aux_scale · f_e / M through the full softmax: see moe_aux_dlogit
            const int top = (int)a.choice[(size_t)m * K]; // the largest logit
            double others = 0.0, q = 0.0;
            for (int e = 0; e < E; e++) {
                if (e != top) { others += p[e]; q += p[e] * (a.offsets[e + 1] - a.offsets[e]); }
            }
            const double inv = aux_scale / ((double)M * K) / M;
            for (int e = 0; e < E; e++) {
                dl[e] += (real)moe_aux_dlogit(p[e], p[top], a.offsets[e + 1] - a.offsets[e],
                                              a.offsets[top + 1] - a.offsets[top], e == top, others, q, inv);
            }
        }
    }
    matmul_backward(dinp, gw->router_w, g.dlogits, inp, w->router_w, M, C, E);
}

static const KindOps MOE_OPS = {'e', moe_ffn_acts_size, moe_ffn_scratch_size, moe_ffn_forward, moe_ffn_backward,
                                NULL}; // stateless: decoding runs forward

#endif // M2RNN_REF_MOE_H
