/*
test_gradcheck.c: finite-difference checks, in float64, of every hand-written backward of the CPU reference:
each op (matmul, RMSNorm, embedding, cross-entropy, causal conv + SiLU, the decay gate, the output gate, the M²RNN,
RNN and GRU recurrences with h0 and a final-state gradient), every layer kind through the kind table (M²RNN with
Nq = 1 and Nq = N, attention with NoPE and RoPE, RNN, GRU, SwiGLU), and whole models with every kind. The trainer is
compiled in float64 here (M2RNN_REAL_DOUBLE) and included whole.

For a function out = F(in) and a fixed random cotangent R, L = Σ out ⊙ R; the backward gives dL/din, and central
differences (h = 1e-5) give it numerically at sampled coordinates, with the fourth-order stencil
(−L(x+2h) + 8L(x+h) − 8L(x−h) + L(x−2h)) / 12h at h = 3e-3: its truncation error (h⁴) and its rounding error
(ε·|L|/h ≈ 3e-13) both stay far below the tolerance even for the small gradients of the whole model's A_log and W.
Reported: ‖analytic − numeric‖ / ‖numeric‖ over the sampled coordinates of each tensor; it must be below 1e-6.
*/
#define TESTING
#define M2RNN_REAL_DOUBLE
#include "train_m2rnn.c"
#include "test/test_common.h"

// the stencil's truncation error grows as h⁴: at 3e-3 it reached 5e-6 on GDN's conv weights (the L2 norm of a short
// q/k head is strongly curved); at 1e-3 6e-8, with round-off near 1e-13
#define FD_STEP 1e-3
#define FD_TOL 1e-6
// the MoE's top-k is smooth only between ties of router logits: its whole-model check steps by 3e-4, so a difference
// crosses no tie (at 1e-3 one token's top-k flipped and took the router's check to 0.7; at 1e-5 it is 5e-8, while
// M2RNN's W needs a step above 1e-4 against round-off)
static double fd_step = FD_STEP;
#define FD_SAMPLES 24 // coordinates checked per tensor

static Rng test_rng = {12345};

static void fill_random(real *x, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) { x[i] = (real)(scale * (2.0 * rng_uniform(&test_rng) - 1.0)); }
}
static real *random_tensor(size_t n, double scale) {
    real *x = (real *)mallocCheck(n * sizeof(real));
    fill_random(x, n, scale);
    return x;
}
static real *zero_tensor(size_t n) { return (real *)callocCheck(n, sizeof(real)); }

static double dot(const real *a, const real *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) { s += (double)a[i] * b[i]; }
    return s;
}

// A test case: loss() evaluates Σ out ⊙ R at the current inputs; the checker perturbs `x` in place.
typedef double (*loss_fn)(void *ctx);

// Compares grad (analytic dL/dx, n elements) with central differences of loss() w.r.t. x at sampled coordinates.
// Returns the normwise relative error.
static double fd_check(const char *what, real *x, const real *grad, size_t n, loss_fn loss, void *ctx) {
    double num2 = 0.0, diff2 = 0.0;
    const int samples = n < FD_SAMPLES ? (int)n : FD_SAMPLES;
    for (int s = 0; s < samples; s++) {
        size_t i = n <= FD_SAMPLES ? (size_t)s : (size_t)(rng_next_u64(&test_rng) % n);
        const real saved = x[i];
        double l[4];
        const double offsets[4] = {2, 1, -1, -2};
        for (int j = 0; j < 4; j++) {
            x[i] = saved + (real)(offsets[j] * fd_step);
            l[j] = loss(ctx);
        }
        x[i] = saved;
        const double fd = (-l[0] + 8 * l[1] - 8 * l[2] + l[3]) / (12 * fd_step);
        num2 += fd * fd;
        diff2 += (fd - grad[i]) * (fd - grad[i]);
    }
    double rel = num2 > 0 ? sqrt(diff2 / num2) : sqrt(diff2);
    if (num2 == 0 && diff2 == 0) { rel = 0; }
    (void)what;
    return rel;
}

static void report(const char *name, double rel) { test_result(rel < FD_TOL, name, "rel err %.2e", rel); }

// ----------------------------------------------------------------------------------------------------------------
// ops

typedef struct { real *out, *inp, *w, *R; int M, IC, OC; } MatmulCase;
static double matmul_loss(void *p) {
    MatmulCase *c = (MatmulCase *)p;
    matmul_forward(c->out, c->inp, c->w, c->M, c->IC, c->OC);
    return dot(c->out, c->R, (size_t)c->M * c->OC);
}
static void test_matmul(void) {
    MatmulCase c = {NULL, NULL, NULL, NULL, 7, 13, 70};
    c.out = zero_tensor((size_t)c.M * c.OC); c.inp = random_tensor((size_t)c.M * c.IC, 1);
    c.w = random_tensor((size_t)c.OC * c.IC, 1); c.R = random_tensor((size_t)c.M * c.OC, 1);
    real *dinp = zero_tensor((size_t)c.M * c.IC), *dw = zero_tensor((size_t)c.OC * c.IC);
    matmul_backward(dinp, dw, c.R, c.inp, c.w, c.M, c.IC, c.OC);
    double e = fd_check("inp", c.inp, dinp, (size_t)c.M * c.IC, matmul_loss, &c);
    double e2 = fd_check("w", c.w, dw, (size_t)c.OC * c.IC, matmul_loss, &c);
    report("matmul (x Wᵀ): dx, dW", e > e2 ? e : e2);
    free(c.out); free(c.inp); free(c.w); free(c.R); free(dinp); free(dw);
}

// the blocked kernel against a plain triple loop, at sizes that cross its row, column and k blocks
static void test_matmul_vs_naive(int M, int IC, int OC) {
    real *inp = random_tensor((size_t)M * IC, 1), *w = random_tensor((size_t)OC * IC, 1);
    real *dout = random_tensor((size_t)M * OC, 1), *out = zero_tensor((size_t)M * OC);
    real *dinp = random_tensor((size_t)M * IC, 1), *dw = random_tensor((size_t)OC * IC, 1); // accumulate onto these
    real *dinp_ref = (real *)mallocCheck((size_t)M * IC * sizeof(real)), *dw_ref = (real *)mallocCheck((size_t)OC * IC * sizeof(real));
    memcpy(dinp_ref, dinp, (size_t)M * IC * sizeof(real));
    memcpy(dw_ref, dw, (size_t)OC * IC * sizeof(real));
    matmul_forward(out, inp, w, M, IC, OC);
    matmul_backward(dinp, dw, dout, inp, w, M, IC, OC);
    double err = 0, ref2 = 0;
    for (int m = 0; m < M; m++) {
        for (int o = 0; o < OC; o++) {
            double acc = 0;
            for (int i = 0; i < IC; i++) { acc += (double)inp[(size_t)m * IC + i] * w[(size_t)o * IC + i]; }
            err = fmax(err, fabs(acc - out[(size_t)m * OC + o]));
            ref2 = fmax(ref2, fabs(acc));
            for (int i = 0; i < IC; i++) {
                dinp_ref[(size_t)m * IC + i] += dout[(size_t)m * OC + o] * w[(size_t)o * IC + i];
                dw_ref[(size_t)o * IC + i] += dout[(size_t)m * OC + o] * inp[(size_t)m * IC + i];
            }
        }
    }
    for (size_t i = 0; i < (size_t)M * IC; i++) { err = fmax(err, fabs(dinp[i] - dinp_ref[i])); }
    for (size_t i = 0; i < (size_t)OC * IC; i++) { err = fmax(err, fabs(dw[i] - dw_ref[i])); }
    char name[96];
    snprintf(name, sizeof(name), "matmul fwd/bwd vs naive loop M%d IC%d OC%d", M, IC, OC);
    test_result(err / ref2 < 1e-12, name, "max err %.2e (relative to max |out| %.1f)", err, ref2);
    free(inp); free(w); free(dout); free(out); free(dinp); free(dw); free(dinp_ref); free(dw_ref);
}

typedef struct { real *out, *rstd, *inp, *w, *R; int M, C; } NormCase;
static double norm_loss(void *p) {
    NormCase *c = (NormCase *)p;
    rmsnorm_forward(c->out, c->rstd, c->inp, c->w, c->M, c->C);
    return dot(c->out, c->R, (size_t)c->M * c->C);
}
static void test_rmsnorm(void) {
    NormCase c = {NULL, NULL, NULL, NULL, NULL, 5, 19};
    c.out = zero_tensor(95); c.rstd = zero_tensor(5); c.inp = random_tensor(95, 1); c.w = random_tensor(19, 1);
    c.R = random_tensor(95, 1);
    real *dinp = zero_tensor(95), *dw = zero_tensor(19);
    norm_loss(&c);
    rmsnorm_backward(dinp, dw, c.R, c.inp, c.w, c.rstd, c.M, c.C);
    double e = fd_check("inp", c.inp, dinp, 95, norm_loss, &c), e2 = fd_check("w", c.w, dw, 19, norm_loss, &c);
    report("rmsnorm: dx, dw", e > e2 ? e : e2);
    free(c.out); free(c.rstd); free(c.inp); free(c.w); free(c.R); free(dinp); free(dw);
}

typedef struct { real *out, *wte, *R; int *tokens; int M, C; } EmbCase;
static double emb_loss(void *p) {
    EmbCase *c = (EmbCase *)p;
    embedding_forward(c->out, c->tokens, c->wte, c->M, c->C, 0, 7);
    return dot(c->out, c->R, (size_t)c->M * c->C);
}
static void test_embedding(void) {
    int tokens[9] = {3, 1, 3, 0, 6, 6, 6, 2, 1};
    EmbCase c = {zero_tensor(9 * 70), random_tensor(7 * 70, 1), random_tensor(9 * 70, 1), tokens, 9, 70};
    real *dwte = zero_tensor(7 * 70);
    embedding_backward(dwte, c.R, tokens, 9, 70, 0, 7);
    report("embedding: dwte (repeated tokens)", fd_check("wte", c.wte, dwte, 7 * 70, emb_loss, &c));
    free(c.out); free(c.wte); free(c.R); free(dwte);
}

typedef struct { real *logits, *losses; int *targets; int M, V, Vp; } CECase;
static double ce_loss(void *p) {
    CECase *c = (CECase *)p;
    crossentropy_forward(c->losses, c->logits, c->targets, c->M, c->V, c->Vp);
    double s = 0;
    for (int i = 0; i < c->M; i++) { s += c->losses[i]; }
    return s / c->M;
}
static void test_crossentropy(void) {
    int targets[4] = {0, 10, 5, 10};
    CECase c = {random_tensor(4 * 16, 3), zero_tensor(4), targets, 4, 11, 16};
    real *d = (real *)mallocCheck(64 * sizeof(real));
    memcpy(d, c.logits, 64 * sizeof(real));
    crossentropy_softmax_backward_inplace(d, targets, (real)1.0 / 4, 4, 11, 16);
    int padding_zero = 1;
    for (int m = 0; m < 4; m++) { for (int i = 11; i < 16; i++) { padding_zero &= d[m * 16 + i] == 0; } }
    report("cross-entropy over padded vocab: dlogits", fd_check("logits", c.logits, d, 64, ce_loss, &c));
    test_result(padding_zero, "cross-entropy: padded logits get no gradient", "%s", padding_zero ? "ok" : "nonzero");
    free(c.logits); free(c.losses); free(d);
}

typedef struct { real *pre, *act, *inp, *w, *bias, *R; int B, T, CD, W, stride; } ConvCase;
static double conv_loss(void *p) {
    ConvCase *c = (ConvCase *)p;
    conv1d_silu_forward(c->pre, c->act, c->inp, c->w, c->bias, c->B, c->T, c->CD, c->W, c->stride);
    return dot(c->act, c->R, (size_t)c->B * c->T * c->CD);
}
static void test_conv(void) {
    ConvCase c = {NULL, NULL, NULL, NULL, NULL, NULL, 2, 9, 5, 4, 8}; // a view of 5 channels inside rows of 8
    c.pre = zero_tensor(2 * 9 * 5); c.act = zero_tensor(2 * 9 * 5); c.inp = random_tensor(2 * 9 * 8, 1);
    c.w = random_tensor(5 * 4, 1); c.R = random_tensor(2 * 9 * 5, 1);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        c.bias = with_bias ? random_tensor(5, 1) : NULL;
        real *dinp = zero_tensor(2 * 9 * 8), *dw = zero_tensor(20), *dbias = with_bias ? zero_tensor(5) : NULL;
        conv_loss(&c);
        conv1d_silu_backward(dinp, dw, dbias, c.R, c.pre, c.inp, c.w, c.B, c.T, c.CD, c.W, c.stride);
        double e = fd_check("inp", c.inp, dinp, 2 * 9 * 8, conv_loss, &c), e2 = fd_check("w", c.w, dw, 20, conv_loss, &c);
        if (with_bias) { e2 = fmax(e2, fd_check("bias", c.bias, dbias, 5, conv_loss, &c)); }
        report(with_bias ? "causal conv1d + bias + SiLU (strided view): dx, dw, dbias"
                         : "causal conv1d + SiLU (strided view): dx, dw", e > e2 ? e : e2);
        free(dinp); free(dw); free(dbias); free(c.bias);
    }
    free(c.pre); free(c.act); free(c.inp); free(c.w); free(c.R);
}

typedef struct { real *f, *f_raw, *A_log, *dt_bias, *R; int BT, N, stride; } GateCase;
static double gate_loss(void *p) {
    GateCase *c = (GateCase *)p;
    decay_gate_forward(c->f, c->f_raw, c->A_log, c->dt_bias, c->BT, c->N, c->stride);
    return dot(c->f, c->R, (size_t)c->BT * c->N);
}
static void test_gate(void) {
    GateCase c = {zero_tensor(6 * 3), random_tensor(6 * 5, 3), random_tensor(3, 1.5), random_tensor(3, 2),
                  random_tensor(6 * 3, 1), 6, 3, 5};
    real *dfr = zero_tensor(30), *dA = zero_tensor(3), *db = zero_tensor(3);
    gate_loss(&c);
    decay_gate_backward(dfr, dA, db, c.R, c.f, c.f_raw, c.A_log, c.dt_bias, c.BT, c.N, c.stride);
    double e = fd_check("f_raw", c.f_raw, dfr, 30, gate_loss, &c);
    double e2 = fd_check("A_log", c.A_log, dA, 3, gate_loss, &c);
    double e3 = fd_check("dt_bias", c.dt_bias, db, 3, gate_loss, &c);
    report("decay gate: df_raw, dA_log, ddt_bias", fmax(e, fmax(e2, e3)));
    free(c.f); free(c.f_raw); free(c.A_log); free(c.dt_bias); free(c.R); free(dfr); free(dA); free(db);
}

// the output gate: y0 + v ⊙ D, then ⊙ SiLU(g) (y is an input the forward updates in place: a copy per evaluation)
typedef struct { real *y0, *y, *gated, *v, *g, *D, *R; int BT, NV, vs, gs; } OutGateCase;
static double outgate_loss(void *p) {
    OutGateCase *c = (OutGateCase *)p;
    memcpy(c->y, c->y0, (size_t)c->BT * c->NV * sizeof(real));
    output_gate_forward(c->y, c->gated, c->v, c->g, c->D, c->BT, c->NV, c->vs, c->gs);
    return dot(c->gated, c->R, (size_t)c->BT * c->NV);
}
static void test_output_gate(void) {
    OutGateCase c = {random_tensor(5 * 6, 1), zero_tensor(5 * 6), zero_tensor(5 * 6), random_tensor(5 * 9, 1),
                     random_tensor(5 * 7, 2), random_tensor(6, 1), random_tensor(5 * 6, 1), 5, 6, 9, 7};
    real *dy = zero_tensor(30), *dv = zero_tensor(45), *dg = zero_tensor(35), *dD = zero_tensor(6);
    outgate_loss(&c);
    output_gate_backward(dy, dg, c.R, c.y, c.g, c.BT, c.NV, c.gs);
    residual_backward(dv, dD, dy, c.v, c.D, c.BT, c.NV, c.vs);
    double e = fd_check("y", c.y0, dy, 30, outgate_loss, &c);
    e = fmax(e, fd_check("v", c.v, dv, 45, outgate_loss, &c));
    e = fmax(e, fd_check("g", c.g, dg, 35, outgate_loss, &c));
    e = fmax(e, fd_check("D", c.D, dD, 6, outgate_loss, &c));
    report("output gate (y + v ⊙ D) ⊙ SiLU(g): dy dv dg dD", e);
    free(c.y0); free(c.y); free(c.gated); free(c.v); free(c.g); free(c.D); free(c.R); free(dy); free(dv); free(dg);
    free(dD);
}

// the recurrence alone, with h0, a final-state cotangent and no clamp (the clamp is not differentiable)
typedef struct {
    real *y, *h_all, *h_final, *qkv, *f, *W, *h0, *Ry, *Rh;
    int B, T, N, Nq, K, Vh, stride;
} RecCase;
static double rec_loss(void *p) {
    RecCase *c = (RecCase *)p;
    const real *q = c->qkv, *k = c->qkv + c->Nq * c->K, *v = c->qkv + 2 * c->Nq * c->K;
    m2rnn_recurrence_forward(c->y, c->h_all, NULL, c->h_final, q, k, v, c->stride, c->f, c->W, c->h0, c->B, c->T, c->N,
                             c->Nq, c->K, c->Vh);
    return dot(c->y, c->Ry, (size_t)c->B * c->T * c->N * c->Vh) +
           dot(c->h_final, c->Rh, (size_t)c->B * c->N * c->K * c->Vh);
}
static void test_recurrence(int Nq) {
    RecCase c;
    memset(&c, 0, sizeof(c));
    c.B = 2; c.T = 7; c.N = 3; c.Nq = Nq; c.K = 5; c.Vh = 4;
    c.stride = 2 * c.Nq * c.K + c.N * c.Vh + 3; // a view inside wider rows, as in the layer
    const size_t BT = (size_t)c.B * c.T, state = (size_t)c.K * c.Vh;
    c.y = zero_tensor(BT * c.N * c.Vh); c.h_all = zero_tensor(BT * c.N * state);
    c.h_final = zero_tensor((size_t)c.B * c.N * state);
    c.qkv = random_tensor(BT * c.stride, 1);
    c.f = random_tensor(BT * c.N, 1);
    for (size_t i = 0; i < BT * c.N; i++) { c.f[i] = (real)(0.5 + 0.45 * c.f[i]); } // gates in (0.05, 0.95)
    c.W = random_tensor((size_t)c.N * c.Vh * c.Vh, 0.6);
    c.h0 = random_tensor((size_t)c.B * c.N * state, 0.8);
    c.Ry = random_tensor(BT * c.N * c.Vh, 1); c.Rh = random_tensor((size_t)c.B * c.N * state, 1);
    real *dqkv = zero_tensor(BT * c.stride), *df = zero_tensor(BT * c.N), *dW = zero_tensor((size_t)c.N * c.Vh * c.Vh);
    real *dh0 = zero_tensor((size_t)c.B * c.N * state);
    rec_loss(&c);
    real *q = c.qkv, *k = c.qkv + c.Nq * c.K, *v = c.qkv + 2 * c.Nq * c.K;
    m2rnn_recurrence_backward(dqkv, dqkv + c.Nq * c.K, dqkv + 2 * c.Nq * c.K, df, dW, dh0, c.Ry, c.Rh, q, k, v,
                              c.stride, c.f, c.W, c.h0, c.h_all, NULL, 0, c.B, c.T, c.N, c.Nq, c.K, c.Vh);
    double e = fd_check("qkv", c.qkv, dqkv, BT * c.stride, rec_loss, &c);
    e = fmax(e, fd_check("f", c.f, df, BT * c.N, rec_loss, &c));
    e = fmax(e, fd_check("W", c.W, dW, (size_t)c.N * c.Vh * c.Vh, rec_loss, &c));
    e = fmax(e, fd_check("h0", c.h0, dh0, (size_t)c.B * c.N * state, rec_loss, &c));
    char name[96];
    snprintf(name, sizeof(name), "M2RNN recurrence Nq=%d: dq dk dv df dW dh0", Nq);
    report(name, e);
    free(c.y); free(c.h_all); free(c.h_final); free(c.qkv); free(c.f); free(c.W); free(c.h0); free(c.Ry); free(c.Rh);
    free(dqkv); free(df); free(dW); free(dh0);
}

// the RNN recurrence alone, with h0 and a final-state cotangent
typedef struct { real *h_all, *z_all, *h_final, *u, *f, *W, *h0, *Rh, *Rf; int B, T, N, V, stride; } RnnRecCase;
static double rnn_rec_loss(void *p) {
    RnnRecCase *c = (RnnRecCase *)p;
    rnn_recurrence_forward(c->h_all, c->z_all, c->h_final, c->u, c->stride, c->f, c->W, c->h0, c->B, c->T, c->N, c->V);
    return dot(c->h_all, c->Rh, (size_t)c->B * c->T * c->N * c->V) + dot(c->h_final, c->Rf, (size_t)c->B * c->N * c->V);
}
static void test_rnn_recurrence(void) {
    RnnRecCase c;
    c.B = 2; c.T = 7; c.N = 3; c.V = 5; c.stride = c.N * c.V + 4;
    const size_t BT = (size_t)c.B * c.T, NV = (size_t)c.N * c.V;
    c.h_all = zero_tensor(BT * NV); c.z_all = zero_tensor(BT * NV); c.h_final = zero_tensor((size_t)c.B * NV);
    c.u = random_tensor(BT * c.stride, 1); c.f = random_tensor(BT * c.N, 1);
    for (size_t i = 0; i < BT * c.N; i++) { c.f[i] = (real)(0.5 + 0.45 * c.f[i]); }
    c.W = random_tensor((size_t)c.N * c.V * c.V, 0.6); c.h0 = random_tensor((size_t)c.B * NV, 0.8);
    c.Rh = random_tensor(BT * NV, 1); c.Rf = random_tensor((size_t)c.B * NV, 1);
    real *du = zero_tensor(BT * c.stride), *df = zero_tensor(BT * c.N), *dW = zero_tensor((size_t)c.N * c.V * c.V);
    real *dh0 = zero_tensor((size_t)c.B * NV);
    rnn_rec_loss(&c);
    rnn_recurrence_backward(du, df, dW, dh0, c.Rh, c.Rf, c.stride, c.f, c.W, c.h0, c.h_all, c.z_all, c.B, c.T, c.N, c.V);
    double e = fd_check("u", c.u, du, BT * c.stride, rnn_rec_loss, &c);
    e = fmax(e, fd_check("f", c.f, df, BT * c.N, rnn_rec_loss, &c));
    e = fmax(e, fd_check("W", c.W, dW, (size_t)c.N * c.V * c.V, rnn_rec_loss, &c));
    e = fmax(e, fd_check("h0", c.h0, dh0, (size_t)c.B * NV, rnn_rec_loss, &c));
    report("RNN recurrence: du df dW dh0", e);
    free(c.h_all); free(c.z_all); free(c.h_final); free(c.u); free(c.f); free(c.W); free(c.h0); free(c.Rh); free(c.Rf);
    free(du); free(df); free(dW); free(dh0);
}

// the Gated DeltaNet recurrence alone (T = 150 crosses the backward's checkpoint chunks of 64), with S0 and a
// final-state cotangent; and its forward against a naive loop of the matrix form S_t = α(I − β k kᵀ)S + β k vᵀ
typedef struct { real *o, *S_final, *q, *k, *v, *alpha, *beta, *S0, *Ro, *Rs; int B, T, H, K, V, vs; } GdnRecCase;
static double gdn_rec_loss(void *p) {
    GdnRecCase *c = (GdnRecCase *)p;
    gdn_recurrence_forward(c->o, c->S_final, c->q, c->k, c->v, c->vs, c->alpha, c->beta, c->S0, c->B, c->T, c->H, c->K,
                           c->V);
    return dot(c->o, c->Ro, (size_t)c->B * c->T * c->H * c->V) +
           dot(c->S_final, c->Rs, (size_t)c->B * c->H * c->K * c->V);
}
static void test_gdn_recurrence(void) {
    GdnRecCase c;
    c.B = 2; c.T = 150; c.H = 2; c.K = 3; c.V = 4; c.vs = c.H * c.V + 3;
    const size_t BT = (size_t)c.B * c.T, KV = (size_t)c.K * c.V, BH = (size_t)c.B * c.H;
    c.o = zero_tensor(BT * c.H * c.V); c.S_final = zero_tensor(BH * KV);
    c.q = random_tensor(BT * c.H * c.K, 0.6); c.k = random_tensor(BT * c.H * c.K, 0.6); c.v = random_tensor(BT * c.vs, 1);
    c.alpha = random_tensor(BT * c.H, 1); c.beta = random_tensor(BT * c.H, 1);
    for (size_t i = 0; i < BT * c.H; i++) { c.alpha[i] = (real)(0.8 + 0.18 * c.alpha[i]); c.beta[i] = (real)(1 + 0.9 * c.beta[i]); }
    c.S0 = random_tensor(BH * KV, 0.7); c.Ro = random_tensor(BT * c.H * c.V, 1); c.Rs = random_tensor(BH * KV, 1);
    gdn_rec_loss(&c);
    // the naive matrix form, in double
    double worst = 0, ref2 = 0;
    for (int b = 0; b < c.B; b++) {
        for (int h = 0; h < c.H; h++) {
            double S[3][4], Sn[3][4];
            for (int i = 0; i < c.K; i++) { for (int j = 0; j < c.V; j++) { S[i][j] = c.S0[((size_t)b * c.H + h) * KV + i * c.V + j]; } }
            for (int t = 0; t < c.T; t++) {
                const size_t r = ((size_t)b * c.T + t) * c.H + h;
                const real *q = c.q + r * c.K, *k = c.k + r * c.K, *v = c.v + ((size_t)b * c.T + t) * c.vs + h * c.V;
                const double a = c.alpha[r], be = c.beta[r];
                for (int i = 0; i < c.K; i++) {
                    for (int j = 0; j < c.V; j++) {
                        double m = 0; // ((I − β k kᵀ) S)[i][j]
                        for (int l = 0; l < c.K; l++) { m += ((i == l ? 1.0 : 0.0) - be * k[i] * k[l]) * S[l][j]; }
                        Sn[i][j] = a * m + be * k[i] * v[j];
                    }
                }
                memcpy(S, Sn, sizeof(S));
                for (int j = 0; j < c.V; j++) {
                    double o = 0;
                    for (int i = 0; i < c.K; i++) { o += S[i][j] * q[i]; }
                    o /= sqrt((double)c.K);
                    worst = fmax(worst, fabs(o - c.o[r * c.V + j]));
                    ref2 += o * o;
                }
            }
        }
    }
    const double rel = worst / sqrt(ref2 / ((double)BT * c.H * c.V));
    test_result(rel < 1e-10, "GDN recurrence vs the naive matrix form (T=150)", "max err %.2e of rms", rel);
    real *dq = zero_tensor(BT * c.H * c.K), *dk = zero_tensor(BT * c.H * c.K), *dv = zero_tensor(BT * c.vs);
    real *da = zero_tensor(BT * c.H), *db = zero_tensor(BT * c.H), *dS0 = zero_tensor(BH * KV);
    gdn_recurrence_backward(dq, dk, dv, da, db, dS0, c.Ro, c.Rs, c.q, c.k, c.v, c.vs, c.alpha, c.beta, c.S0, c.B, c.T,
                            c.H, c.K, c.V);
    double e = fd_check("q", c.q, dq, BT * c.H * c.K, gdn_rec_loss, &c);
    e = fmax(e, fd_check("k", c.k, dk, BT * c.H * c.K, gdn_rec_loss, &c));
    e = fmax(e, fd_check("v", c.v, dv, BT * c.vs, gdn_rec_loss, &c));
    e = fmax(e, fd_check("alpha", c.alpha, da, BT * c.H, gdn_rec_loss, &c));
    e = fmax(e, fd_check("beta", c.beta, db, BT * c.H, gdn_rec_loss, &c));
    e = fmax(e, fd_check("S0", c.S0, dS0, BH * KV, gdn_rec_loss, &c));
    report("GDN recurrence (T=150, S0, dS_final): dq dk dv dalpha dbeta dS0", e);
    free(c.o); free(c.S_final); free(c.q); free(c.k); free(c.v); free(c.alpha); free(c.beta); free(c.S0); free(c.Ro);
    free(c.Rs); free(dq); free(dk); free(dv); free(da); free(db); free(dS0);
}

// the Mamba-2 recurrence alone (T = 150, 4 heads in 2 groups), with h0 and a final-state cotangent; and its forward
// against a naive loop
typedef struct { real *y, *h_final, *xbc, *dt, *A_log, *D, *h0, *Ry, *Rh; int B, T, H, P, N, G, stride; } SsdRecCase;
static double ssd_rec_loss(void *p) {
    SsdRecCase *c = (SsdRecCase *)p;
    const int HP = c->H * c->P, GN = c->G * c->N;
    mamba2_recurrence_forward(c->y, c->h_final, c->xbc, c->xbc + HP, c->xbc + HP + GN, c->stride, c->dt, c->A_log, c->D,
                              c->h0, c->B, c->T, c->H, c->P, c->N, c->G);
    return dot(c->y, c->Ry, (size_t)c->B * c->T * HP) + dot(c->h_final, c->Rh, (size_t)c->B * c->H * c->P * c->N);
}
static void test_mamba2_recurrence(void) {
    SsdRecCase c;
    c.B = 2; c.T = 150; c.H = 4; c.P = 3; c.N = 2; c.G = 2;
    const int HP = c.H * c.P, GN = c.G * c.N;
    c.stride = HP + 2 * GN + 1;
    const size_t BT = (size_t)c.B * c.T, PN = (size_t)c.P * c.N, BH = (size_t)c.B * c.H;
    c.y = zero_tensor(BT * HP); c.h_final = zero_tensor(BH * PN); c.xbc = random_tensor(BT * c.stride, 1);
    c.dt = random_tensor(BT * c.H, 1);
    for (size_t i = 0; i < BT * c.H; i++) { c.dt[i] = (real)(0.06 + 0.05 * c.dt[i]); }
    c.A_log = random_tensor(c.H, 1); c.D = random_tensor(c.H, 1); c.h0 = random_tensor(BH * PN, 0.7);
    c.Ry = random_tensor(BT * HP, 1); c.Rh = random_tensor(BH * PN, 1);
    ssd_rec_loss(&c);
    double worst = 0, ref2 = 0;
    for (int b = 0; b < c.B; b++) {
        for (int h = 0; h < c.H; h++) {
            const int gr = h / (c.H / c.G);
            double hs[3][2];
            for (int p = 0; p < c.P; p++) { for (int n = 0; n < c.N; n++) { hs[p][n] = c.h0[((size_t)b * c.H + h) * PN + p * c.N + n]; } }
            for (int t = 0; t < c.T; t++) {
                const real *row = c.xbc + ((size_t)b * c.T + t) * c.stride;
                const double dt = c.dt[((size_t)b * c.T + t) * c.H + h], a = exp(-exp((double)c.A_log[h]) * dt);
                for (int p = 0; p < c.P; p++) {
                    double y = c.D[h] * row[h * c.P + p];
                    for (int n = 0; n < c.N; n++) {
                        hs[p][n] = a * hs[p][n] + dt * row[h * c.P + p] * row[HP + gr * c.N + n];
                        y += hs[p][n] * row[HP + GN + gr * c.N + n];
                    }
                    worst = fmax(worst, fabs(y - c.y[((size_t)b * c.T + t) * HP + h * c.P + p]));
                    ref2 += y * y;
                }
            }
        }
    }
    const double rel = worst / sqrt(ref2 / ((double)BT * HP));
    test_result(rel < 1e-10, "Mamba-2 recurrence vs a naive loop (T=150, 2 groups)", "max err %.2e of rms", rel);
    real *dxbc = zero_tensor(BT * c.stride), *ddt = zero_tensor(BT * c.H), *dA = zero_tensor(c.H), *dD = zero_tensor(c.H);
    real *dh0 = zero_tensor(BH * PN);
    mamba2_recurrence_backward(dxbc, dxbc + HP, dxbc + HP + GN, ddt, dA, dD, dh0, c.Ry, c.Rh, c.xbc, c.xbc + HP,
                               c.xbc + HP + GN, c.stride, c.dt, c.A_log, c.D, c.h0, c.B, c.T, c.H, c.P, c.N, c.G);
    double e = fd_check("xBC", c.xbc, dxbc, BT * c.stride, ssd_rec_loss, &c);
    e = fmax(e, fd_check("dt", c.dt, ddt, BT * c.H, ssd_rec_loss, &c));
    e = fmax(e, fd_check("A_log", c.A_log, dA, c.H, ssd_rec_loss, &c));
    e = fmax(e, fd_check("D", c.D, dD, c.H, ssd_rec_loss, &c));
    e = fmax(e, fd_check("h0", c.h0, dh0, BH * PN, ssd_rec_loss, &c));
    report("Mamba-2 recurrence (T=150, h0, dh_final): dx dB dC ddt dA_log dD dh0", e);
    free(c.y); free(c.h_final); free(c.xbc); free(c.dt); free(c.A_log); free(c.D); free(c.h0); free(c.Ry); free(c.Rh);
    free(dxbc); free(ddt); free(dA); free(dD); free(dh0);
}

// the GRU recurrence alone, with h0 and a final-state cotangent
typedef struct { GRUSaved s; real *h_final, *x, *Ur, *Uz, *Un, *h0, *Rh, *Rf; int B, T, N, V, stride; } GruRecCase;
static double gru_rec_loss(void *p) {
    GruRecCase *c = (GruRecCase *)p;
    gru_recurrence_forward(&c->s, c->h_final, c->x, c->stride, c->Ur, c->Uz, c->Un, c->h0, c->B, c->T, c->N, c->V);
    return dot(c->s.h, c->Rh, (size_t)c->B * c->T * c->N * c->V) + dot(c->h_final, c->Rf, (size_t)c->B * c->N * c->V);
}
static void test_gru_recurrence(void) {
    GruRecCase c;
    c.B = 2; c.T = 6; c.N = 2; c.V = 4; c.stride = 3 * c.N * c.V + 3;
    const size_t BT = (size_t)c.B * c.T, NV = (size_t)c.N * c.V, VV = (size_t)c.N * c.V * c.V;
    c.s.h = zero_tensor(BT * NV); c.s.r = zero_tensor(BT * NV); c.s.z = zero_tensor(BT * NV);
    c.s.n = zero_tensor(BT * NV); c.s.c = zero_tensor(BT * NV);
    c.h_final = zero_tensor((size_t)c.B * NV); c.x = random_tensor(BT * c.stride, 1.5);
    c.Ur = random_tensor(VV, 0.7); c.Uz = random_tensor(VV, 0.7); c.Un = random_tensor(VV, 0.7);
    c.h0 = random_tensor((size_t)c.B * NV, 0.8); c.Rh = random_tensor(BT * NV, 1); c.Rf = random_tensor((size_t)c.B * NV, 1);
    real *dx = zero_tensor(BT * c.stride), *dUr = zero_tensor(VV), *dUz = zero_tensor(VV), *dUn = zero_tensor(VV);
    real *dh0 = zero_tensor((size_t)c.B * NV);
    gru_rec_loss(&c);
    gru_recurrence_backward(dx, dUr, dUz, dUn, dh0, c.Rh, c.Rf, c.stride, c.Ur, c.Uz, c.Un, c.h0, &c.s, c.B, c.T, c.N, c.V);
    double e = fd_check("x", c.x, dx, BT * c.stride, gru_rec_loss, &c);
    e = fmax(e, fd_check("U_r", c.Ur, dUr, VV, gru_rec_loss, &c));
    e = fmax(e, fd_check("U_z", c.Uz, dUz, VV, gru_rec_loss, &c));
    e = fmax(e, fd_check("U_n", c.Un, dUn, VV, gru_rec_loss, &c));
    e = fmax(e, fd_check("h0", c.h0, dh0, (size_t)c.B * NV, gru_rec_loss, &c));
    report("GRU recurrence: dx_r dx_z dx_n dU_r dU_z dU_n dh0", e);
    free(c.s.h); free(c.s.r); free(c.s.z); free(c.s.n); free(c.s.c); free(c.h_final); free(c.x); free(c.Ur); free(c.Uz);
    free(c.Un); free(c.h0); free(c.Rh); free(c.Rf); free(dx); free(dUr); free(dUz); free(dUn); free(dh0);
}

// ----------------------------------------------------------------------------------------------------------------
// mixers, the MLP and the whole model, through a tiny Model (its parameter buffer is perturbed in place)

static ModelConfig tiny_config(const char *pattern, int qk_heads, int rope) {
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.vocab_size = 37; c.d_model = 12; c.m2rnn.heads = 3; c.m2rnn.qk_heads = qk_heads; c.m2rnn.k = 8; c.m2rnn.v = 4;
    c.attn.heads = 2; c.attn.head_dim = 6; c.attn.rope = rope; c.swiglu.hidden = 20; c.m2rnn.grad_clamp = 0;
    c.vrnn.heads = 3; c.vrnn.head_dim = 5;
    c.gdn.heads = 2; c.gdn.k = 4; c.gdn.v = 6;
    c.mamba2.expand = 2; c.mamba2.head_dim = 6; c.mamba2.state = 5; c.mamba2.groups = 1; // d_inner 24: 4 heads
    c.moe.experts = 5; c.moe.top_k = 2; c.moe.hidden = 6; c.moe.shared = 4; c.moe.aux_coef = 0.05f;
    snprintf(c.pattern, sizeof(c.pattern), "%s", pattern);
    return c;
}

// non-trivial weights: the init's identity W, unit norms and D would hide transposition bugs
static void randomize_model(Model *m) {
    fill_random(m->params_memory, m->table.num_parameters, 0.4);
    for (int i = 0; i < m->table.num_specs; i++) {
        const ParamSpec *s = &m->table.specs[i];
        if (s->zero_rows_from < s->shape[0]) { // keep the vocab padding rows at zero, as the init does
            memset(m->params_memory + s->offset + s->zero_rows_from * (s->numel / s->shape[0]), 0,
                   (s->shape[0] - s->zero_rows_from) * (s->numel / s->shape[0]) * sizeof(real));
        }
        if (ends_with(s->name, ".A_log")) { for (size_t j = 0; j < s->numel; j++) { m->params_memory[s->offset + j] -= 1; } }
    }
}

typedef struct { Model *m; real *out, *inp, *R; int layer, B, T, which; } BlockCase; // which: 0 mixer, 1 feed-forward
static KindTensors block_tensors(Model *m, int layer, int which) {
    ModelParamsLayer *w = &m->params.layers[layer], *g = &m->grads.layers[layer];
    return which ? kind_tensors(w->ffn, g->ffn) : kind_tensors(w->mixer, g->mixer);
}
static double block_loss(void *p) {
    BlockCase *c = (BlockCase *)p;
    Model *m = c->m;
    LayerActs *la = &m->layer_acts[c->layer];
    const KindTensors t = block_tensors(m, c->layer, c->which);
    if (c->which) { m->ffn_ops[c->layer]->forward(c->out, la->ffn, c->inp, &t, &m->config, c->B, c->T); }
    else { m->mixer_ops[c->layer]->forward(c->out, la->mixer, c->inp, &t, &m->config, c->B, c->T); }
    return dot(c->out, c->R, (size_t)c->B * c->T * m->config.d_model);
}

// checks one block (mixer or feed-forward) of layer 0 through the kind table: d(input) and d(every tensor of it)
static void test_block(const char *name, ModelConfig config, int which) {
    Model *m = model_create(&config);
    randomize_model(m);
    const int B = 2, T = 6, C = m->config.d_model;
    int tokens[12] = {0};
    model_forward(m, tokens, NULL, B, T); // allocates the activations
    BlockCase c = {m, zero_tensor((size_t)B * T * C), random_tensor((size_t)B * T * C, 1),
                   random_tensor((size_t)B * T * C, 1), 0, B, T, which};
    real *dinp = zero_tensor((size_t)B * T * C);
    block_loss(&c);
    model_zero_grad(m);
    memset(m->grad_scratch_memory, 0, m->grad_scratch_size * sizeof(real));
    LayerActs *la = &m->layer_acts[0];
    const KindTensors t = block_tensors(m, 0, which);
    if (which) { m->ffn_ops[0]->backward(dinp, m->kind_scratch, c.R, c.inp, la->ffn, &t, &m->config, B, T); }
    else { m->mixer_ops[0]->backward(dinp, m->kind_scratch, c.R, c.inp, la->mixer, &t, &m->config, B, T); }
    double e = fd_check("inp", c.inp, dinp, (size_t)B * T * C, block_loss, &c);
    int checked = 0;
    for (int i = 0; i < m->table.num_specs; i++) {
        const ParamSpec *s = &m->table.specs[i];
        if (s->layer != 0 || s->kind == 0) { continue; }
        const int is_ffn = s->kind >= 'a' && s->kind <= 'z';
        if (is_ffn != (which == 1)) { continue; }
        double ei = fd_check(s->name, m->params_memory + s->offset, m->grads_memory + s->offset, s->numel, block_loss, &c);
        if (ei >= FD_TOL) { printf("     %s: rel err %.2e\n", s->name, ei); }
        e = fmax(e, ei);
        checked++;
    }
    char full[160];
    snprintf(full, sizeof(full), "%s (%d tensors)", name, checked);
    report(full, e);
    free(c.out); free(c.inp); free(c.R); free(dinp);
    model_free(m);
}

// the MoE feed-forward with its load-balancing loss: loss = Σ out ⊙ R + aux (aux_grad 1); d(input) and every tensor,
// the router included. The inputs stay away from router ties (a tie moves the top-k under a finite difference).
typedef struct { Model *m; real *out, *inp, *R; int B, T; double aux; } MoECase;
static double moe_loss(void *p) {
    MoECase *c = (MoECase *)p;
    Model *m = c->m;
    KindTensors t = kind_tensors(m->params.layers[0].ffn, m->grads.layers[0].ffn);
    double aux = 0.0;
    t.aux = &aux;
    m->ffn_ops[0]->forward(c->out, m->layer_acts[0].ffn, c->inp, &t, &m->config, c->B, c->T);
    c->aux = aux;
    return dot(c->out, c->R, (size_t)c->B * c->T * m->config.d_model) + aux;
}
static void test_moe_block(const char *name, ModelConfig config) {
    Model *m = model_create(&config);
    randomize_model(m);
    const int B = 2, T = 7, C = m->config.d_model; // 14 tokens: a multiple of nothing in particular
    int tokens[14] = {0};
    model_forward(m, tokens, NULL, B, T);
    MoECase c = {m, zero_tensor((size_t)B * T * C), random_tensor((size_t)B * T * C, 1), random_tensor((size_t)B * T * C, 1),
                 B, T, 0};
    real *dinp = zero_tensor((size_t)B * T * C);
    moe_loss(&c);
    model_zero_grad(m);
    memset(m->grad_scratch_memory, 0, m->grad_scratch_size * sizeof(real));
    KindTensors t = kind_tensors(m->params.layers[0].ffn, m->grads.layers[0].ffn);
    t.aux_grad = 1;
    m->ffn_ops[0]->backward(dinp, m->kind_scratch, c.R, c.inp, m->layer_acts[0].ffn, &t, &m->config, B, T);
    double e = fd_check("inp", c.inp, dinp, (size_t)B * T * C, moe_loss, &c);
    int checked = 0;
    for (int i = 0; i < m->table.num_specs; i++) {
        const ParamSpec *s = &m->table.specs[i];
        if (s->layer != 0 || s->kind != 'e' || s->numel == 0) { continue; }
        double ei = fd_check(s->name, m->params_memory + s->offset, m->grads_memory + s->offset, s->numel, moe_loss, &c);
        if (ei >= FD_TOL) { printf("     %s: rel err %.2e\n", s->name, ei); }
        e = fmax(e, ei);
        checked++;
    }
    char full[160];
    snprintf(full, sizeof(full), "%s (%d tensors, aux %.3g)", name, checked, c.aux);
    report(full, e);
    free(c.out); free(c.inp); free(c.R); free(dinp);
    model_free(m);
}

// the load-balancing loss against its formula where the formula is known: a zero router ties every expert, so the top
// K are experts 0..K−1 (ties to the lower), P̄ = 1/E, f_e = 1/K for them and 0 for the others: aux = coef exactly;
// and a router that sends every token to expert 3 (K = 1): aux = coef · E · P̄_3
static void test_moe_aux(void) {
    ModelConfig c = tiny_config("M", 1, 0);
    snprintf(c.ffn_pattern, sizeof(c.ffn_pattern), "e");
    c.moe.experts = 6; c.moe.top_k = 2; c.moe.hidden = 5; c.moe.shared = 3; c.moe.aux_coef = 0.01f;
    Model *m = model_create(&c);
    randomize_model(m);
    const int B = 1, T = 5, C = m->config.d_model;
    int tokens[5] = {0};
    model_forward(m, tokens, NULL, B, T);
    const ParamSpec *rw = param_table_find(&m->table, "layer0.moe.router_w");
    memset(m->params_memory + rw->offset, 0, rw->numel * sizeof(real));
    real *x = random_tensor((size_t)B * T * C, 1), *out = zero_tensor((size_t)B * T * C);
    for (size_t i = 0; i < (size_t)B * T * C; i++) { x[i] = (real)(0.75 + 0.25 * x[i]); } // positive inputs
    KindTensors t = kind_tensors(m->params.layers[0].ffn, m->grads.layers[0].ffn);
    double aux = 0.0;
    t.aux = &aux;
    m->ffn_ops[0]->forward(out, m->layer_acts[0].ffn, x, &t, &m->config, B, T);
    const double tie = aux;
    MoEActs a;
    moe_acts_layout(&a, m->layer_acts[0].ffn, &m->config, B, T);
    int lowest = 1, empty = a.offsets[6] - a.offsets[2] == 0;
    for (int i = 0; i < B * T; i++) { lowest &= a.choice[i * 2] == 0 && a.choice[i * 2 + 1] == 1; }
    m->config.moe.top_k = 1;
    moe_acts_layout(&a, m->layer_acts[0].ffn, &m->config, B, T); // the layout at K = 1
    for (int e = 0; e < 6; e++) { // expert 3's row +1, the others −1: logit 3 > 0 > the others for positive inputs
        for (int i = 0; i < C; i++) { m->params_memory[rw->offset + (size_t)e * C + i] = (real)(e == 3 ? 0.3 : -0.3); }
    }
    aux = 0.0;
    m->ffn_ops[0]->forward(out, m->layer_acts[0].ffn, x, &t, &m->config, B, T);
    double pbar3 = 0.0;
    for (int i = 0; i < B * T; i++) { pbar3 += a.probs[i * 6 + 3] / (B * T); }
    const int all3 = a.offsets[4] - a.offsets[3] == B * T;
    const double coef = m->config.moe.aux_coef; // 0.01 as a float
    test_result(fabs(tie - coef) < 1e-12 && lowest && empty && all3 && fabs(aux - coef * 6 * pbar3) < 1e-12,
                "MoE aux loss against its formula: ties, empty experts, all tokens to one expert",
                "tied router: aux %.6g (coef 0.01), experts 0,1 chosen: %s, 2..5 empty: %s; one expert: %d of %d tokens, "
                "aux %.6g = coef E P3 %.6g", tie, lowest ? "yes" : "no", empty ? "yes" : "no", (int)(a.offsets[4] - a.offsets[3]),
                B * T, aux, coef * 6 * pbar3);
    free(x); free(out);
    model_free(m);
}

typedef struct { Model *m; int *inputs, *targets; int B, T; } ModelCase;
static double model_loss(void *p) { // the training objective: the mean loss and the auxiliary losses (MoE)
    ModelCase *c = (ModelCase *)p;
    const double l = model_forward(c->m, c->inputs, c->targets, c->B, c->T);
    return l + model_aux_loss(c->m);
}
static void test_whole_model(const char *name, ModelConfig config) {
    Model *m = model_create(&config);
    randomize_model(m);
    enum { B = 2, T = 7 };
    int inputs[B * T], targets[B * T];
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int)(rng_next_u64(&test_rng) % 37);
        targets[i] = (int)(rng_next_u64(&test_rng) % 37);
    }
    ModelCase c = {m, inputs, targets, B, T};
    model_zero_grad(m);
    model_forward(m, inputs, targets, B, T);
    model_backward(m, 1);
    real *grads = (real *)mallocCheck(m->table.num_parameters * sizeof(real));
    memcpy(grads, m->grads_memory, m->table.num_parameters * sizeof(real));
    double e = 0;
    const char *worst = "";
    for (int i = 0; i < m->table.num_specs; i++) {
        const ParamSpec *s = &m->table.specs[i];
        size_t n = s->numel;
        if (s->zero_rows_from < s->shape[0]) { n = s->zero_rows_from * (s->numel / s->shape[0]); } // real vocab rows
        double ei = fd_check(s->name, m->params_memory + s->offset, grads + s->offset, n, model_loss, &c);
        if (getenv("GC_VERBOSE")) { printf("     %s %.2e\n", s->name, ei); }
        if (ei > e) { e = ei; worst = s->name; }
    }
    test_result(e < FD_TOL, name, "rel err %.2e (worst: %s, %d tensors)", e, worst, m->table.num_specs);
    free(grads);
    model_free(m);
}

int main(void) {
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
    test_matmul();
    test_matmul_vs_naive(70, 600, 45);
    test_matmul_vs_naive(300, 37, 45);
    test_rmsnorm();
    test_embedding();
    test_crossentropy();
    test_conv();
    test_gate();
    test_output_gate();
    test_recurrence(1);
    test_recurrence(3);
    test_rnn_recurrence();
    test_gru_recurrence();
    test_gdn_recurrence();
    test_mamba2_recurrence();
    test_block("M2RNN mixer Nq=1: dx and every tensor", tiny_config("M", 1, 0), 0);
    test_block("M2RNN mixer Nq=N: dx and every tensor", tiny_config("M", 3, 0), 0);
    test_block("attention NoPE: dx and every tensor", tiny_config("A", 1, 0), 0);
    test_block("attention RoPE: dx and every tensor", tiny_config("A", 1, 1), 0);
    {
        ModelConfig gqa = tiny_config("A", 1, 1);
        gqa.attn.heads = 4; gqa.attn.kv_heads = 2;
        test_block("attention GQA (4 q heads, 2 kv heads), RoPE: dx and every tensor", gqa, 0);
        gqa.attn.kv_heads = 1;
        test_block("attention MQA (4 q heads, 1 kv head): dx and every tensor", gqa, 0);
    }
    test_block("RNN mixer: dx and every tensor", tiny_config("R", 1, 0), 0);
    test_block("GRU mixer: dx and every tensor", tiny_config("U", 1, 0), 0);
    test_block("GDN mixer: dx and every tensor", tiny_config("G", 1, 0), 0);
    {
        ModelConfig neg = tiny_config("G", 1, 0);
        neg.gdn.neg = 1;
        test_block("GDN[-1,1] mixer (beta = 2 sigmoid): dx and every tensor", neg, 0);
        ModelConfig ssd = tiny_config("S", 1, 0);
        test_block("Mamba-2 mixer (1 group): dx and every tensor", ssd, 0);
        ssd.mamba2.groups = 2;
        test_block("Mamba-2 mixer (2 groups): dx and every tensor", ssd, 0);
    }
    test_block("SwiGLU feed-forward: dx and every tensor", tiny_config("M", 1, 0), 1);
    test_whole_model("whole model MAM (Nq=1): every parameter", tiny_config("MAM", 1, 0));
    test_whole_model("whole model AMM (Nq=N, RoPE): every parameter", tiny_config("AMM", 3, 1));
    test_whole_model("whole model RUA (RNN, GRU, RoPE): every parameter", tiny_config("RUA", 1, 1));
    test_whole_model("whole model MGSA (M2RNN, GDN, Mamba-2): every parameter", tiny_config("MGSA", 1, 0));
    {
        ModelConfig moe = tiny_config("M", 1, 0);
        snprintf(moe.ffn_pattern, sizeof(moe.ffn_pattern), "e");
        test_moe_block("MoE (5 experts, top-2, shared expert, aux loss): dx and every tensor", moe);
        moe.moe.shared = 0; moe.moe.top_k = 3;
        test_moe_block("MoE (top-3, no shared expert): dx and every tensor", moe);
        test_moe_aux();
        ModelConfig mm = tiny_config("MAM", 1, 1);
        snprintf(mm.ffn_pattern, sizeof(mm.ffn_pattern), "ese");
        fd_step = 3e-4;
        test_whole_model("whole model MAM with MoE, SwiGLU, MoE (loss + aux): every parameter", mm);
        fd_step = FD_STEP;
    }
    // (last: the random draws of the cases above stay as they were)
    {
        ModelConfig gn = tiny_config("M", 1, 0);
        gn.m2rnn.heads = 4; gn.m2rnn.qk_heads = 2; gn.m2rnn.group_norm = 1;
        test_block("M2RNN mixer Nq=2, a norm per q/k group (topology-aware TP): dx and every tensor", gn, 0);
    }
    return test_summary("test_gradcheck");
}
