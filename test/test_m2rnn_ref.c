/*
test_m2rnn_ref.c: the reference M²RNN recurrence (ref/m2rnn.h) held against an independent naive float64 loop
written straight from the paper's equations, one (b, n) at a time with the state as a K×V matrix:

    Z_t = tanh(H_{t−1} W + k_t v_tᵀ),  H_t = f_t H_{t−1} + (1 − f_t) Z_t,  y_t = H_tᵀ q_t

on random non-trivial inputs (h0 given, a final-state cotangent given, Nq = 1 and Nq = N, several K and V):
1. forward: y and the final state;
2. backward without the clamp: every gradient against central differences of the naive loop's loss;
3. the clamp of the carried dH (authors' kernel semantics: clamp the gradient arriving from step t+1, then add
   q_t dy_tᵀ; dh0 unclamped) in a case where it fires, against a naive float64 backward with the same semantics,
   and against the unclamped gradients to show that it does change them.
*/
#define TESTING
#define M2RNN_REAL_DOUBLE
#include "train_m2rnn.c"
#include "test/test_common.h"

typedef struct { int B, T, N, Nq, K, V; } Shape;

typedef struct {
    Shape s;
    double *q, *k, *v, *f, *W, *h0; // q,k (B,T,Nq,K), v (B,T,N,V), f (B,T,N), W (N,V,V), h0 (B,N,K,V)
    double *Ry, *Rh;                // cotangents of y (B,T,N,V) and of the final state (B,N,K,V)
} Problem;

static Rng rng = {777};
static double uni(void) { return 2.0 * rng_uniform(&rng) - 1.0; }
static double *rand_array(size_t n, double scale) {
    double *x = (double *)mallocCheck(n * sizeof(double));
    for (size_t i = 0; i < n; i++) { x[i] = scale * uni(); }
    return x;
}

static Problem make_problem(Shape s, double dy_scale) {
    Problem p;
    p.s = s;
    const size_t BT = (size_t)s.B * s.T;
    p.q = rand_array(BT * s.Nq * s.K, 1.0);
    p.k = rand_array(BT * s.Nq * s.K, 1.0);
    p.v = rand_array(BT * s.N * s.V, 1.0);
    p.f = rand_array(BT * s.N, 1.0);
    for (size_t i = 0; i < BT * s.N; i++) { p.f[i] = 0.5 + 0.49 * p.f[i]; } // (0.01, 0.99)
    p.W = rand_array((size_t)s.N * s.V * s.V, 1.5 / sqrt((double)s.V));
    p.h0 = rand_array((size_t)s.B * s.N * s.K * s.V, 1.0);
    p.Ry = rand_array(BT * s.N * s.V, dy_scale);
    p.Rh = rand_array((size_t)s.B * s.N * s.K * s.V, dy_scale);
    return p;
}

static void free_problem(Problem *p) {
    free(p->q); free(p->k); free(p->v); free(p->f); free(p->W); free(p->h0); free(p->Ry); free(p->Rh);
}

// ----------------------------------------------------------------------------------------------------------------
// the naive loop, straight from the equations

#define IDX4(a, b, c, d, B_, C_, D_) ((((size_t)(a) * (B_) + (b)) * (C_) + (c)) * (D_) + (d))

// y (B,T,N,V), hT (B,N,K,V), and if H_all != NULL every state (B,N,T+1,K,V) with H_all[.., 0] = h0
static void naive_forward(double *y, double *hT, double *H_all, const Problem *p) {
    const Shape s = p->s;
    const int K = s.K, V = s.V, g = s.N / s.Nq;
    double *H = (double *)mallocCheck((size_t)K * V * sizeof(double));
    double *Hn = (double *)mallocCheck((size_t)K * V * sizeof(double));
    for (int b = 0; b < s.B; b++) {
        for (int n = 0; n < s.N; n++) {
            const int h = n / g;
            for (int i = 0; i < K * V; i++) { H[i] = p->h0[IDX4(b, n, 0, i, s.N, 1, K * V)]; }
            if (H_all) { memcpy(&H_all[IDX4(b, n, 0, 0, s.N, s.T + 1, K * V)], H, (size_t)K * V * sizeof(double)); }
            for (int t = 0; t < s.T; t++) {
                const double *q = &p->q[IDX4(b, t, h, 0, s.T, s.Nq, K)], *k = &p->k[IDX4(b, t, h, 0, s.T, s.Nq, K)];
                const double *v = &p->v[IDX4(b, t, n, 0, s.T, s.N, V)];
                const double f = p->f[((size_t)b * s.T + t) * s.N + n];
                for (int r = 0; r < K; r++) {
                    for (int c = 0; c < V; c++) {
                        double hw = 0;
                        for (int m = 0; m < V; m++) { hw += H[r * V + m] * p->W[((size_t)n * V + m) * V + c]; }
                        const double z = tanh(hw + k[r] * v[c]);
                        Hn[r * V + c] = f * H[r * V + c] + (1 - f) * z;
                    }
                }
                memcpy(H, Hn, (size_t)K * V * sizeof(double));
                if (H_all) { memcpy(&H_all[IDX4(b, n, t + 1, 0, s.N, s.T + 1, K * V)], H, (size_t)K * V * sizeof(double)); }
                for (int c = 0; c < V; c++) {
                    double acc = 0;
                    for (int r = 0; r < K; r++) { acc += H[r * V + c] * q[r]; }
                    y[IDX4(b, t, n, c, s.T, s.N, V)] = acc;
                }
            }
            for (int i = 0; i < K * V; i++) { hT[IDX4(b, n, 0, i, s.N, 1, K * V)] = H[i]; }
        }
    }
    free(H);
    free(Hn);
}

static double naive_loss(const Problem *p) {
    const Shape s = p->s;
    const size_t ny = (size_t)s.B * s.T * s.N * s.V, nh = (size_t)s.B * s.N * s.K * s.V;
    double *y = (double *)mallocCheck(ny * sizeof(double)), *hT = (double *)mallocCheck(nh * sizeof(double));
    naive_forward(y, hT, NULL, p);
    double L = 0;
    for (size_t i = 0; i < ny; i++) { L += y[i] * p->Ry[i]; }
    for (size_t i = 0; i < nh; i++) { L += hT[i] * p->Rh[i]; }
    free(y);
    free(hT);
    return L;
}

typedef struct { double *dq, *dk, *dv, *df, *dW, *dh0; } Grads;

static Grads alloc_grads(Shape s) {
    const size_t BT = (size_t)s.B * s.T;
    Grads g = {(double *)callocCheck(BT * s.Nq * s.K, 8), (double *)callocCheck(BT * s.Nq * s.K, 8),
               (double *)callocCheck(BT * s.N * s.V, 8), (double *)callocCheck(BT * s.N, 8),
               (double *)callocCheck((size_t)s.N * s.V * s.V, 8), (double *)callocCheck((size_t)s.B * s.N * s.K * s.V, 8)};
    return g;
}
static void free_grads(Grads *g) { free(g->dq); free(g->dk); free(g->dv); free(g->df); free(g->dW); free(g->dh0); }

// naive backward with the kernel's clamp semantics; returns how many carried-gradient elements the clamp changed
static long naive_backward_clamped(Grads *g, const Problem *p, double c) {
    const Shape s = p->s;
    const int K = s.K, V = s.V, grp = s.N / s.Nq;
    double *H_all = (double *)mallocCheck((size_t)s.B * s.N * (s.T + 1) * K * V * sizeof(double));
    double *y = (double *)mallocCheck((size_t)s.B * s.T * s.N * V * sizeof(double));
    double *hT = (double *)mallocCheck((size_t)s.B * s.N * K * V * sizeof(double));
    naive_forward(y, hT, H_all, p);
    double *G = (double *)mallocCheck((size_t)K * V * 8), *D = (double *)mallocCheck((size_t)K * V * 8);
    double *A = (double *)mallocCheck((size_t)K * V * 8), *Z = (double *)mallocCheck((size_t)K * V * 8);
    long clamped = 0;
    for (int b = 0; b < s.B; b++) {
        for (int n = 0; n < s.N; n++) {
            const int h = n / grp;
            for (int i = 0; i < K * V; i++) { G[i] = p->Rh[IDX4(b, n, 0, i, s.N, 1, K * V)]; }
            for (int t = s.T - 1; t >= 0; t--) {
                const double *Hp = &H_all[IDX4(b, n, t, 0, s.N, s.T + 1, K * V)];
                const double *Hc = &H_all[IDX4(b, n, t + 1, 0, s.N, s.T + 1, K * V)];
                const double *q = &p->q[IDX4(b, t, h, 0, s.T, s.Nq, K)], *k = &p->k[IDX4(b, t, h, 0, s.T, s.Nq, K)];
                const double *v = &p->v[IDX4(b, t, n, 0, s.T, s.N, V)];
                const double *dy = &p->Ry[IDX4(b, t, n, 0, s.T, s.N, V)];
                const double f = p->f[((size_t)b * s.T + t) * s.N + n];
                for (int r = 0; r < K; r++) {
                    for (int col = 0; col < V; col++) {
                        double hw = 0;
                        for (int m = 0; m < V; m++) { hw += Hp[r * V + m] * p->W[((size_t)n * V + m) * V + col]; }
                        Z[r * V + col] = tanh(hw + k[r] * v[col]);
                        double gc = G[r * V + col];
                        if (c > 0 && fabs(gc) > c) { gc = gc > 0 ? c : -c; clamped++; }
                        D[r * V + col] = gc + q[r] * dy[col];
                    }
                }
                double df = 0;
                for (int i = 0; i < K * V; i++) {
                    df += D[i] * (Hp[i] - Z[i]);
                    A[i] = D[i] * (1 - f) * (1 - Z[i] * Z[i]); // gradient of the pre-activation
                }
                g->df[((size_t)b * s.T + t) * s.N + n] = df;
                for (int r = 0; r < K; r++) {
                    double dq = 0, dk = 0;
                    for (int col = 0; col < V; col++) { dq += Hc[r * V + col] * dy[col]; dk += A[r * V + col] * v[col]; }
                    g->dq[IDX4(b, t, h, r, s.T, s.Nq, K)] += dq;
                    g->dk[IDX4(b, t, h, r, s.T, s.Nq, K)] += dk;
                }
                for (int col = 0; col < V; col++) {
                    double dv = 0;
                    for (int r = 0; r < K; r++) { dv += A[r * V + col] * k[r]; }
                    g->dv[IDX4(b, t, n, col, s.T, s.N, V)] = dv;
                }
                for (int m = 0; m < V; m++) {
                    for (int col = 0; col < V; col++) {
                        double acc = 0;
                        for (int r = 0; r < K; r++) { acc += Hp[r * V + m] * A[r * V + col]; }
                        g->dW[((size_t)n * V + m) * V + col] += acc;
                    }
                }
                for (int r = 0; r < K; r++) {
                    for (int m = 0; m < V; m++) {
                        double acc = f * D[r * V + m];
                        for (int col = 0; col < V; col++) { acc += A[r * V + col] * p->W[((size_t)n * V + m) * V + col]; }
                        G[r * V + m] = acc;
                    }
                }
            }
            for (int i = 0; i < K * V; i++) { g->dh0[IDX4(b, n, 0, i, s.N, 1, K * V)] = G[i]; }
        }
    }
    free(H_all); free(y); free(hT); free(G); free(D); free(A); free(Z);
    return clamped;
}

// ----------------------------------------------------------------------------------------------------------------
// the reference under test, fed the same problem through the strided (B,T,q|k|v) layout the layer uses

typedef struct { double *qkv; int stride; } Packed;

static Packed pack_qkv(const Problem *p) {
    const Shape s = p->s;
    Packed pk;
    pk.stride = 2 * s.Nq * s.K + s.N * s.V;
    pk.qkv = (double *)mallocCheck((size_t)s.B * s.T * pk.stride * sizeof(double));
    for (size_t bt = 0; bt < (size_t)s.B * s.T; bt++) {
        memcpy(pk.qkv + bt * pk.stride, p->q + bt * s.Nq * s.K, (size_t)s.Nq * s.K * 8);
        memcpy(pk.qkv + bt * pk.stride + s.Nq * s.K, p->k + bt * s.Nq * s.K, (size_t)s.Nq * s.K * 8);
        memcpy(pk.qkv + bt * pk.stride + 2 * s.Nq * s.K, p->v + bt * s.N * s.V, (size_t)s.N * s.V * 8);
    }
    return pk;
}

// runs the reference forward and backward; fills y, hT and the gradients (unpacked to the naive layout)
static void reference_run(double *y, double *hT, Grads *g, const Problem *p, double clamp) {
    const Shape s = p->s;
    const size_t BT = (size_t)s.B * s.T;
    Packed pk = pack_qkv(p);
    double *h_all = (double *)mallocCheck(BT * s.N * s.K * s.V * sizeof(double));
    const int oq = 0, ok = s.Nq * s.K, ov = 2 * s.Nq * s.K;
    double *z_all = (double *)mallocCheck(BT * s.N * s.K * s.V * sizeof(double));
    m2rnn_recurrence_forward(y, h_all, z_all, hT, pk.qkv + oq, pk.qkv + ok, pk.qkv + ov, pk.stride, p->f, p->W, p->h0, s.B,
                             s.T, s.N, s.Nq, s.K, s.V);
    if (g != NULL) {
        double *dqkv = (double *)callocCheck(BT * pk.stride, sizeof(double));
        m2rnn_recurrence_backward(dqkv + oq, dqkv + ok, dqkv + ov, g->df, g->dW, g->dh0, p->Ry, p->Rh, pk.qkv + oq,
                                  pk.qkv + ok, pk.qkv + ov, pk.stride, p->f, p->W, p->h0, h_all, z_all, clamp, s.B, s.T, s.N,
                                  s.Nq, s.K, s.V);
        for (size_t bt = 0; bt < BT; bt++) {
            memcpy(g->dq + bt * s.Nq * s.K, dqkv + bt * pk.stride + oq, (size_t)s.Nq * s.K * 8);
            memcpy(g->dk + bt * s.Nq * s.K, dqkv + bt * pk.stride + ok, (size_t)s.Nq * s.K * 8);
            memcpy(g->dv + bt * s.N * s.V, dqkv + bt * pk.stride + ov, (size_t)s.N * s.V * 8);
        }
        free(dqkv);
    }
    free(h_all);
    free(z_all);
    free(pk.qkv);
}

static double rel_err(const double *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) { num += (a[i] - b[i]) * (a[i] - b[i]); den += b[i] * b[i]; }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double grads_rel_err(const Grads *a, const Grads *b, Shape s) {
    const size_t BT = (size_t)s.B * s.T;
    double e = rel_err(a->dq, b->dq, BT * s.Nq * s.K);
    e = fmax(e, rel_err(a->dk, b->dk, BT * s.Nq * s.K));
    e = fmax(e, rel_err(a->dv, b->dv, BT * s.N * s.V));
    e = fmax(e, rel_err(a->df, b->df, BT * s.N));
    e = fmax(e, rel_err(a->dW, b->dW, (size_t)s.N * s.V * s.V));
    e = fmax(e, rel_err(a->dh0, b->dh0, (size_t)s.B * s.N * s.K * s.V));
    return e;
}

static void test_forward(Shape s) {
    Problem p = make_problem(s, 1.0);
    const size_t ny = (size_t)s.B * s.T * s.N * s.V, nh = (size_t)s.B * s.N * s.K * s.V;
    double *y1 = (double *)mallocCheck(ny * 8), *y2 = (double *)mallocCheck(ny * 8);
    double *h1 = (double *)mallocCheck(nh * 8), *h2 = (double *)mallocCheck(nh * 8);
    naive_forward(y1, h1, NULL, &p);
    reference_run(y2, h2, NULL, &p, 0);
    const double e = fmax(rel_err(y2, y1, ny), rel_err(h2, h1, nh));
    char name[128];
    snprintf(name, sizeof(name), "forward y, hT  B%d T%d N%d Nq%d K%d V%d", s.B, s.T, s.N, s.Nq, s.K, s.V);
    test_result(e < 1e-13, name, "rel err %.2e", e);
    free(y1); free(y2); free(h1); free(h2);
    free_problem(&p);
}

// every gradient of the reference against central differences of the naive loop, at sampled coordinates
static void test_backward_fd(Shape s) {
    Problem p = make_problem(s, 1.0);
    const size_t BT = (size_t)s.B * s.T;
    const size_t ny = BT * s.N * s.V, nh = (size_t)s.B * s.N * s.K * s.V;
    double *y = (double *)mallocCheck(ny * 8), *hT = (double *)mallocCheck(nh * 8);
    Grads g = alloc_grads(s);
    reference_run(y, hT, &g, &p, 0);
    struct { double *x, *grad; size_t n; } tensors[6] = {
        {p.q, g.dq, BT * s.Nq * s.K}, {p.k, g.dk, BT * s.Nq * s.K}, {p.v, g.dv, BT * s.N * s.V},
        {p.f, g.df, BT * s.N}, {p.W, g.dW, (size_t)s.N * s.V * s.V}, {p.h0, g.dh0, nh}};
    double worst = 0;
    const double h = 1e-5;
    for (int t = 0; t < 6; t++) {
        double num = 0, den = 0;
        for (int sample = 0; sample < 20; sample++) {
            size_t i = rng_next_u64(&rng) % tensors[t].n;
            const double saved = tensors[t].x[i];
            tensors[t].x[i] = saved + h;
            const double lp = naive_loss(&p);
            tensors[t].x[i] = saved - h;
            const double lm = naive_loss(&p);
            tensors[t].x[i] = saved;
            const double fd = (lp - lm) / (2 * h);
            num += (fd - tensors[t].grad[i]) * (fd - tensors[t].grad[i]);
            den += fd * fd;
        }
        worst = fmax(worst, sqrt(num / den));
    }
    char name[128];
    snprintf(name, sizeof(name), "backward vs FD of naive  B%d T%d N%d Nq%d K%d V%d", s.B, s.T, s.N, s.Nq, s.K, s.V);
    test_result(worst < 1e-6, name, "rel err %.2e (dq dk dv df dW dh0)", worst);
    free(y); free(hT);
    free_grads(&g);
    free_problem(&p);
}

// with the clamp firing: reference == naive clamped backward; and != the unclamped gradients
static void test_clamp(Shape s, double clamp) {
    Problem p = make_problem(s, 3.0); // large cotangents so the carried dH exceeds the clamp
    const size_t ny = (size_t)s.B * s.T * s.N * s.V, nh = (size_t)s.B * s.N * s.K * s.V;
    double *y = (double *)mallocCheck(ny * 8), *hT = (double *)mallocCheck(nh * 8);
    Grads ref = alloc_grads(s), naive = alloc_grads(s), unclamped = alloc_grads(s);
    reference_run(y, hT, &ref, &p, clamp);
    reference_run(y, hT, &unclamped, &p, 0);
    const long fired = naive_backward_clamped(&naive, &p, clamp);
    const long total = (long)s.B * s.N * s.T * s.K * s.V;
    const double e = grads_rel_err(&ref, &naive, s);
    const double change = grads_rel_err(&unclamped, &naive, s);
    char name[128];
    snprintf(name, sizeof(name), "clamp %.2g vs naive clamped loop  Nq%d K%d V%d", clamp, s.Nq, s.K, s.V);
    test_result(e < 1e-12 && fired > 0, name, "rel err %.2e, clamp fired on %ld of %ld carried elements", e, fired,
                total);
    snprintf(name, sizeof(name), "clamp %.2g changes the gradients  Nq%d", clamp, s.Nq);
    test_result(change > 1e-3, name, "unclamped differ by %.2e", change);
    free(y); free(hT);
    free_grads(&ref); free_grads(&naive); free_grads(&unclamped);
    free_problem(&p);
}

int main(void) {
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
    const Shape shapes[4] = {{2, 40, 3, 1, 8, 4}, {1, 33, 2, 2, 16, 16}, {2, 25, 4, 1, 5, 3}, {1, 64, 2, 1, 64, 16}};
    for (int i = 0; i < 4; i++) { test_forward(shapes[i]); }
    for (int i = 0; i < 3; i++) { test_backward_fd(shapes[i]); }
    test_clamp(shapes[0], 0.05);
    test_clamp(shapes[1], 0.2);
    return test_summary("test_m2rnn_ref");
}
