/*
ref/common.h: the CPU reference ops every layer uses, forward and backward side by side: matmul, RMSNorm, embedding,
the classifier (softmax cross-entropy over the real vocabulary of a padded one), SiLU and softplus, AdamW; and the
small interface every layer kind implements (KindOps, below), which ref/kinds.h gathers into the CPU's kind table.

Conventions (llm.c's train_gpt2.c): outputs first, then inputs, then sizes. Backward functions ACCUMULATE (+=) into
every gradient they produce, activations and parameters alike; the caller zeroes. `real` is float for training and
double for the float64 gradient checks (define M2RNN_REAL_DOUBLE before including).

Determinism: every output element is written by one thread in a fixed order, and every reduction over tokens uses a
fixed chunking that does not depend on the number of OpenMP threads. Training is therefore bit-for-bit reproducible on
a given build, which is what makes checkpoint resume exact.
*/
#ifndef M2RNN_REF_COMMON_H
#define M2RNN_REF_COMMON_H

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "model.h"
#include "utils.h"

#ifdef M2RNN_REAL_DOUBLE
typedef double real;
#else
typedef float real;
#endif

// The tensor-parallel group a layer runs in (comm.h's TP group; NULL or size 1: one process): sum all-reduces n
// numbers of elem bytes (real, or double for per-token scalars) in place over the group, and counts each call in
// calls (the tests count the collectives per layer). The block's own collectives (Megatron's pair, the vocabulary
// ones) go through the same link.
typedef struct TPLink {
    int size, rank;
    void (*sum)(struct TPLink *link, void *x, size_t n, size_t elem);
    void (*max)(struct TPLink *link, real *x, size_t n); // elementwise maximum over the group (the classifier)
    void *ctx;
    long calls;
} TPLink;
static inline void tp_sum(TPLink *link, void *x, size_t n, size_t elem) {
    if (link != NULL && link->size > 1) { link->calls++; link->sum(link, x, n, elem); }
}

// typed views of the parameter buffer (and of the gradients): model.h's layout, in this executor's precision
DEFINE_MODEL_VIEWS(real, ModelParams)
#define VIEW_FIELD(name) real *name; // a kind's struct of named tensors: typedef struct { M2RNN_PARAMS(VIEW_FIELD) } ...

// Hands out consecutive slices of one buffer; with base == NULL it only measures (used = the size needed). Kinds lay
// out their activations and scratch with it, once to size them and once to point into them.
typedef struct { real *base; size_t used; } Arena;
static inline real *arena_take(Arena *a, size_t n) {
    real *p = a->base != NULL ? a->base + a->used : NULL;
    a->used += n;
    return p;
}

#define RMSNORM_EPS 1e-5

// the libm call of the build's precision: the float ones cost a fraction of the double ones in the fp32 trainer
#ifdef M2RNN_REAL_DOUBLE
static inline real tanhr(real x) { return tanh(x); }
static inline real expr(real x) { return exp(x); }
#else
static inline real tanhr(real x) { return tanhf(x); }
static inline real expr(real x) { return expf(x); }
#endif

// ----------------------------------------------------------------------------------------------------------------
// matmul. One core: out (M,N) (+)= A (M,K) @ B (K,N) with B row-major and A read through strides, so both A and Aᵀ
// work without a copy. Register tiles of MM_ROWS × MM_COLS outputs are vectorized along N; work items are (column
// panel, block of rows), and k runs in blocks so the B block stays in L1 and the A block in L2. The summation order
// over k is fixed, whatever the thread count.
// The forms a layer needs: x Wᵀ (W transposed once into a reused scratch buffer), dout W, and doutᵀ x (strided A).

#define MM_ROWS 8   // rows of out per register tile
#define MM_COLS 32  // columns of out per register tile (two AVX-512 vectors of float)

#define MM_KC 256           // k per cache block: a B block (MM_KC × MM_COLS) fits in L1
#define MM_ROW_BLOCK 64     // rows per parallel work item: an A block (MM_ROW_BLOCK × MM_KC) fits in L2

// a(m, k) = a[m * a_row_stride + k * a_col_stride]
static void matmul_kernel(real *out, const real *a, size_t a_row_stride, size_t a_col_stride, const real *b, int M,
                          int K, int N, int accumulate) {
    const int col_tiles = (N + MM_COLS - 1) / MM_COLS;
    const int row_blocks = (M + MM_ROW_BLOCK - 1) / MM_ROW_BLOCK;
#pragma omp parallel for collapse(2) schedule(static)
    for (int ct = 0; ct < col_tiles; ct++) {
        for (int rb = 0; rb < row_blocks; rb++) {
            const int n0 = ct * MM_COLS, cols = N - n0 < MM_COLS ? N - n0 : MM_COLS;
            const int m_end = (rb + 1) * MM_ROW_BLOCK < M ? (rb + 1) * MM_ROW_BLOCK : M;
            for (int k0 = 0; k0 < K || k0 == 0; k0 += MM_KC) {
                const int k1 = k0 + MM_KC < K ? k0 + MM_KC : K;
                const int load = accumulate || k0 > 0; // later k blocks add to what the earlier ones wrote
                for (int m0 = rb * MM_ROW_BLOCK; m0 < m_end; m0 += MM_ROWS) {
                    const int rows = m_end - m0 < MM_ROWS ? m_end - m0 : MM_ROWS;
                    real acc[MM_ROWS][MM_COLS];
                    for (int r = 0; r < MM_ROWS; r++) {
                        for (int j = 0; j < MM_COLS; j++) {
                            acc[r][j] = (load && r < rows && j < cols) ? out[(size_t)(m0 + r) * N + n0 + j] : 0;
                        }
                    }
                    const real *a0 = a + (size_t)m0 * a_row_stride;
                    if (rows == MM_ROWS && cols == MM_COLS) {
                        for (int k = k0; k < k1; k++) {
                            const real *brow = b + (size_t)k * N + n0;
                            const real *ak = a0 + (size_t)k * a_col_stride;
                            for (int r = 0; r < MM_ROWS; r++) {
                                const real ark = ak[(size_t)r * a_row_stride];
#pragma omp simd
                                for (int j = 0; j < MM_COLS; j++) { acc[r][j] += ark * brow[j]; }
                            }
                        }
                    } else {
                        for (int k = k0; k < k1; k++) {
                            const real *brow = b + (size_t)k * N + n0;
                            const real *ak = a0 + (size_t)k * a_col_stride;
                            for (int r = 0; r < rows; r++) {
                                const real ark = ak[(size_t)r * a_row_stride];
                                for (int j = 0; j < cols; j++) { acc[r][j] += ark * brow[j]; }
                            }
                        }
                    }
                    for (int r = 0; r < rows; r++) {
                        for (int j = 0; j < cols; j++) { out[(size_t)(m0 + r) * N + n0 + j] = acc[r][j]; }
                    }
                }
            }
        }
    }
}

// a scratch buffer reused across calls (the ops run one at a time on the calling thread), so the large transposes
// do not page-fault a fresh allocation every step
static real *matmul_scratch(size_t n) {
    static real *buf = NULL;
    static size_t cap = 0;
    if (n > cap) {
        free(buf);
        buf = (real *)mallocCheck(n * sizeof(real));
        cap = n;
    }
    return buf;
}

// out (cols, rows) = inp (rows, cols) transposed, in cache-sized blocks
static void transpose(real *out, const real *inp, int rows, int cols) {
    const int blk = 32;
#pragma omp parallel for collapse(2) schedule(static)
    for (int r0 = 0; r0 < rows; r0 += blk) {
        for (int c0 = 0; c0 < cols; c0 += blk) {
            for (int c = c0; c < c0 + blk && c < cols; c++) {
                for (int r = r0; r < r0 + blk && r < rows; r++) { out[(size_t)c * rows + r] = inp[(size_t)r * cols + c]; }
            }
        }
    }
}

// out (M, OC) = inp (M, IC) @ weightᵀ, weight (OC, IC)
static void matmul_forward(real *out, const real *inp, const real *weight, int M, int IC, int OC) {
    real *weight_t = matmul_scratch((size_t)IC * OC); // (IC, OC)
    transpose(weight_t, weight, OC, IC);
    matmul_kernel(out, inp, (size_t)IC, 1, weight_t, M, IC, OC, 0);
}

// dinp (M, IC) += dout (M, OC) @ weight;  dweight (OC, IC) += doutᵀ @ inp. Either output may be NULL.
static void matmul_backward(real *dinp, real *dweight, const real *dout, const real *inp, const real *weight, int M,
                            int IC, int OC) {
    if (dinp != NULL) { matmul_kernel(dinp, dout, (size_t)OC, 1, weight, M, OC, IC, 1); }
    if (dweight != NULL) { matmul_kernel(dweight, dout, 1, (size_t)OC, inp, OC, M, IC, 1); }
}

// ----------------------------------------------------------------------------------------------------------------
// deterministic reductions over rows: rows are cut into REDUCE_CHUNKS fixed chunks whatever the thread count,
// each chunk sums in order, then the chunks are added in order.

#define REDUCE_CHUNKS 16

// out (C) += Σ_m rows(m) where the caller's row_fn fills a (C) partial for rows [m0, m1)
typedef void (*row_partial_fn)(real *partial, int m0, int m1, const void *ctx);

static void reduce_rows_deterministic(real *out, int M, int C, row_partial_fn fn, const void *ctx) {
    real *partials = (real *)callocCheck((size_t)REDUCE_CHUNKS * C, sizeof(real));
#pragma omp parallel for schedule(static)
    for (int chunk = 0; chunk < REDUCE_CHUNKS; chunk++) {
        int m0 = (int)((long long)M * chunk / REDUCE_CHUNKS), m1 = (int)((long long)M * (chunk + 1) / REDUCE_CHUNKS);
        fn(partials + (size_t)chunk * C, m0, m1, ctx);
    }
    for (int chunk = 0; chunk < REDUCE_CHUNKS; chunk++) {
        for (int i = 0; i < C; i++) { out[i] += partials[(size_t)chunk * C + i]; }
    }
    free(partials);
}

// ----------------------------------------------------------------------------------------------------------------
// RMSNorm: out = inp · rstd · weight, rstd = 1/sqrt(mean(inp²) + eps), over the last dim C

static void rmsnorm_forward(real *out, real *rstd, const real *inp, const real *weight, int M, int C) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        const real *x = inp + (size_t)m * C;
        double ss = 0.0;
        for (int i = 0; i < C; i++) { ss += (double)x[i] * x[i]; }
        real s = (real)(1.0 / sqrt(ss / C + RMSNORM_EPS));
        rstd[m] = s;
        real *o = out + (size_t)m * C;
        for (int i = 0; i < C; i++) { o[i] = x[i] * s * weight[i]; }
    }
}

typedef struct { const real *dout, *inp, *rstd; int C; } RmsnormWeightGradCtx;

static void rmsnorm_weight_grad_rows(real *partial, int m0, int m1, const void *ctx_) {
    const RmsnormWeightGradCtx *ctx = (const RmsnormWeightGradCtx *)ctx_;
    for (int m = m0; m < m1; m++) {
        const real *x = ctx->inp + (size_t)m * ctx->C, *dy = ctx->dout + (size_t)m * ctx->C;
        for (int i = 0; i < ctx->C; i++) { partial[i] += dy[i] * x[i] * ctx->rstd[m]; }
    }
}

// dinp (M,C) += ..., dweight (C) += ...
static void rmsnorm_backward(real *dinp, real *dweight, const real *dout, const real *inp, const real *weight,
                             const real *rstd, int M, int C) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        const real *x = inp + (size_t)m * C, *dy = dout + (size_t)m * C;
        const real s = rstd[m];
        // y_i = x_i s w_i, s = (mean x² + eps)^-1/2  =>  dx_i = s w_i dy_i − s³ x_i Σ_j(dy_j w_j x_j) / C
        double dot = 0.0;
        for (int i = 0; i < C; i++) { dot += (double)dy[i] * weight[i] * x[i]; }
        const real coef = (real)(dot * s * s * s / C);
        real *dx = dinp + (size_t)m * C;
        for (int i = 0; i < C; i++) { dx[i] += s * weight[i] * dy[i] - coef * x[i]; }
    }
    RmsnormWeightGradCtx ctx = {dout, inp, rstd, C};
    reduce_rows_deterministic(dweight, M, C, rmsnorm_weight_grad_rows, &ctx);
}

// RMSNorm per group of C/G channels (Mamba-2's gated norm, M²RNN's topology-aware one): rstd (M, G), weight (C)
static void group_rmsnorm_forward(real *out, real *rstd, const real *inp, const real *weight, int M, int C, int G) {
    const int cg = C / G;
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        for (int g = 0; g < G; g++) {
            const real *x = inp + (size_t)m * C + (size_t)g * cg;
            double ss = 0.0;
            for (int i = 0; i < cg; i++) { ss += (double)x[i] * x[i]; }
            const real s = (real)(1.0 / sqrt(ss / cg + RMSNORM_EPS));
            rstd[(size_t)m * G + g] = s;
            real *o = out + (size_t)m * C + (size_t)g * cg;
            for (int i = 0; i < cg; i++) { o[i] = x[i] * s * weight[(size_t)g * cg + i]; }
        }
    }
}

static void group_rmsnorm_backward(real *dinp, real *dweight, const real *dout, const real *inp, const real *weight,
                                   const real *rstd, int M, int C, int G) {
    const int cg = C / G;
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        for (int g = 0; g < G; g++) {
            const size_t o = (size_t)m * C + (size_t)g * cg;
            const real s = rstd[(size_t)m * G + g];
            double dot = 0.0;
            for (int i = 0; i < cg; i++) { dot += (double)dout[o + i] * weight[(size_t)g * cg + i] * inp[o + i]; }
            const real coef = (real)(dot * s * s * s / cg);
            for (int i = 0; i < cg; i++) { dinp[o + i] += s * weight[(size_t)g * cg + i] * dout[o + i] - coef * inp[o + i]; }
        }
    }
    // the weight gradient over tokens in order, parallel over channels: deterministic
#pragma omp parallel for schedule(static)
    for (int i = 0; i < C; i++) {
        real acc = 0;
        for (int m = 0; m < M; m++) { acc += dout[(size_t)m * C + i] * inp[(size_t)m * C + i] * rstd[(size_t)m * G + i / cg]; }
        dweight[i] += acc;
    }
}

// RMSNormTP (the paper's appendix): the norm of a row whose C channels here are 1/tp of it, the rest on the other
// ranks of link: the rows' sums of squares are all-reduced (M numbers) before rstd = 1/sqrt(Σ/(tp·C) + eps), and in
// the backward the rows' Σ dy·w·x likewise. The weight (C) is this rank's shard; its gradient needs no collective.
static void rmsnorm_tp_forward(real *out, real *rstd, const real *inp, const real *weight, int M, int C, TPLink *tp) {
    double *ss = (double *)mallocCheck((size_t)M * sizeof(double));
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        const real *x = inp + (size_t)m * C;
        double acc = 0.0;
        for (int i = 0; i < C; i++) { acc += (double)x[i] * x[i]; }
        ss[m] = acc;
    }
    tp_sum(tp, ss, (size_t)M, sizeof(double));
    const double Cg = (double)C * tp->size;
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        const real s = (real)(1.0 / sqrt(ss[m] / Cg + RMSNORM_EPS));
        rstd[m] = s;
        const real *x = inp + (size_t)m * C;
        real *o = out + (size_t)m * C;
        for (int i = 0; i < C; i++) { o[i] = x[i] * s * weight[i]; }
    }
    free(ss);
}

static void rmsnorm_tp_backward(real *dinp, real *dweight, const real *dout, const real *inp, const real *weight,
                                const real *rstd, int M, int C, TPLink *tp) {
    double *dot = (double *)mallocCheck((size_t)M * sizeof(double));
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        const real *x = inp + (size_t)m * C, *dy = dout + (size_t)m * C;
        double acc = 0.0;
        for (int i = 0; i < C; i++) { acc += (double)dy[i] * weight[i] * x[i]; }
        dot[m] = acc;
    }
    tp_sum(tp, dot, (size_t)M, sizeof(double));
    const double Cg = (double)C * tp->size;
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        const real *x = inp + (size_t)m * C, *dy = dout + (size_t)m * C;
        const real s = rstd[m], coef = (real)(dot[m] * s * s * s / Cg);
        real *dx = dinp + (size_t)m * C;
        for (int i = 0; i < C; i++) { dx[i] += s * weight[i] * dy[i] - coef * x[i]; }
    }
    free(dot);
    RmsnormWeightGradCtx ctx = {dout, inp, rstd, C};
    reduce_rows_deterministic(dweight, M, C, rmsnorm_weight_grad_rows, &ctx);
}

// The recurrent mixers' output norm over their C = N·V channels: one RMSNorm over all of them, per group of C/G
// (groups > 1), or RMSNormTP across the tensor-parallel group (tp_norm > 1, a rank's local config); rstd (M, groups)
static void mixer_norm_forward(real *out, real *rstd, const real *inp, const real *weight, int M, int C, int groups,
                               int tp_norm, TPLink *tp) {
    if (tp_norm > 1) { rmsnorm_tp_forward(out, rstd, inp, weight, M, C, tp); }
    else if (groups > 1) { group_rmsnorm_forward(out, rstd, inp, weight, M, C, groups); }
    else { rmsnorm_forward(out, rstd, inp, weight, M, C); }
}
static void mixer_norm_backward(real *dinp, real *dweight, const real *dout, const real *inp, const real *weight,
                                const real *rstd, int M, int C, int groups, int tp_norm, TPLink *tp) {
    if (tp_norm > 1) { rmsnorm_tp_backward(dinp, dweight, dout, inp, weight, rstd, M, C, tp); }
    else if (groups > 1) { group_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, M, C, groups); }
    else { rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, M, C); }
}

// ----------------------------------------------------------------------------------------------------------------
// token embedding

// out (M, C) = wte[tokens − v0] for the tokens in rows v0 .. v0+Vl−1 of the vocabulary (wte holds those rows), 0 for
// the others. One process: v0 = 0, Vl = the padded vocabulary. Vocabulary-parallel (a tensor-parallel rank's shard
// of the rows): the block all-reduces the ranks' outputs.
static void embedding_forward(real *out, const int *tokens, const real *wte, int M, int C, int v0, int Vl) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        const int r = tokens[m] - v0;
        if (r >= 0 && r < Vl) { memcpy(out + (size_t)m * C, wte + (size_t)r * C, (size_t)C * sizeof(real)); }
        else { memset(out + (size_t)m * C, 0, (size_t)C * sizeof(real)); }
    }
}

// dwte (Vl, C) += scatter of the rows of dout (M, C) whose tokens are in rows v0 .. v0+Vl−1, the others skipped.
// Parallel over channel blocks, tokens in order: deterministic.
static void embedding_backward(real *dwte, const real *dout, const int *tokens, int M, int C, int v0, int Vl) {
    const int block = 64, blocks = (C + block - 1) / block;
#pragma omp parallel for schedule(static)
    for (int cb = 0; cb < blocks; cb++) {
        const int c0 = cb * block, c1 = c0 + block < C ? c0 + block : C;
        for (int m = 0; m < M; m++) {
            const int r = tokens[m] - v0;
            if (r < 0 || r >= Vl) { continue; }
            real *dst = dwte + (size_t)r * C;
            const real *src = dout + (size_t)m * C;
            for (int c = c0; c < c1; c++) { dst[c] += src[c]; }
        }
    }
}

// ----------------------------------------------------------------------------------------------------------------
// classifier: softmax over the first V of Vp logits (the padding never enters), cross-entropy against targets

// losses (M) = −log softmax(logits)[target]; logits (M, Vp)
static void crossentropy_forward(real *losses, const real *logits, const int *targets, int M, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        const real *row = logits + (size_t)m * Vp;
        real maxv = row[0];
        for (int i = 1; i < V; i++) { maxv = row[i] > maxv ? row[i] : maxv; }
        double sum = 0.0;
        for (int i = 0; i < V; i++) { sum += expr(row[i] - maxv); }
        losses[m] = (real)(log(sum) - (double)(row[targets[m]] - maxv));
    }
}

// dlogits (M, Vp) = (softmax − onehot) · dloss; written IN PLACE over logits (they are not needed afterwards).
// Padded columns get 0.
static void crossentropy_softmax_backward_inplace(real *logits_to_dlogits, const int *targets, real dloss, int M, int V,
                                                  int Vp) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        real *row = logits_to_dlogits + (size_t)m * Vp;
        real maxv = row[0];
        for (int i = 1; i < V; i++) { maxv = row[i] > maxv ? row[i] : maxv; }
        double sum = 0.0;
        for (int i = 0; i < V; i++) { sum += expr(row[i] - maxv); }
        const double inv = 1.0 / sum;
        for (int i = 0; i < V; i++) { row[i] = (real)(expr(row[i] - maxv) * inv) * dloss; }
        row[targets[m]] -= dloss;
        for (int i = V; i < Vp; i++) { row[i] = 0; }
    }
}

// Vocabulary-parallel cross-entropy (Megatron's): each rank holds the logits (M, Vp) of its vocabulary rows v0 ..,
// the first V of them real. Three collectives over the group: the rows' maxima, then their sums of exp and their
// targets' logits (one all-reduce of 2M). losses (M); stats (M, 2) keeps each row's max and sum for the backward.
static void crossentropy_forward_vp(real *losses, double *stats, const real *logits, const int *targets, int M, int V,
                                    int Vp, int v0, TPLink *tp) {
    real *maxv = (real *)mallocCheck((size_t)M * sizeof(real));
    double *st = (double *)mallocCheck((size_t)M * 2 * sizeof(double));
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        const real *row = logits + (size_t)m * Vp;
        real mx = -INFINITY;
        for (int i = 0; i < V; i++) { mx = row[i] > mx ? row[i] : mx; }
        maxv[m] = mx;
    }
    if (tp != NULL && tp->size > 1) { tp->calls++; tp->max(tp, maxv, (size_t)M); }
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        const real *row = logits + (size_t)m * Vp;
        double sum = 0.0;
        for (int i = 0; i < V; i++) { sum += expr(row[i] - maxv[m]); }
        const int r = targets[m] - v0;
        st[2 * m] = sum;
        st[2 * m + 1] = r >= 0 && r < V ? (double)(row[r] - maxv[m]) : 0.0;
    }
    tp_sum(tp, st, (size_t)M * 2, sizeof(double));
    for (int m = 0; m < M; m++) {
        losses[m] = (real)(log(st[2 * m]) - st[2 * m + 1]);
        stats[2 * m] = (double)maxv[m];
        stats[2 * m + 1] = st[2 * m];
    }
    free(maxv);
    free(st);
}

// dlogits (M, Vp) = (softmax − onehot) · dloss over this rank's rows, in place, from the forward's stats
static void crossentropy_backward_vp(real *logits_to_dlogits, const double *stats, const int *targets, real dloss,
                                     int M, int V, int Vp, int v0) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++) {
        real *row = logits_to_dlogits + (size_t)m * Vp;
        const real maxv = (real)stats[2 * m];
        const double inv = 1.0 / stats[2 * m + 1];
        for (int i = 0; i < V; i++) { row[i] = (real)(expr(row[i] - maxv) * inv) * dloss; }
        const int r = targets[m] - v0;
        if (r >= 0 && r < V) { row[r] -= dloss; }
        for (int i = V; i < Vp; i++) { row[i] = 0; }
    }
}

// ----------------------------------------------------------------------------------------------------------------
// pointwise

static inline real sigmoidr(real x) { return 1 / (1 + expr(-x)); }
static inline real siluf(real x) { return x * sigmoidr(x); }
static inline real silu_grad(real x) { real s = sigmoidr(x); return s * (1 + x * (1 - s)); }
static inline real softplusr(real x) { return x > 20 ? x : (real)log1p(exp((double)x)); }

// ----------------------------------------------------------------------------------------------------------------
// AdamW (decoupled weight decay, bias-corrected), one call over a slice of the parameter buffer

static void adamw_update(real *params, real *m, real *v, const real *grads, size_t n, float lr, float beta1,
                         float beta2, float eps, float weight_decay, int step, float grad_scale) {
    const double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        const real g = grads[i] * grad_scale;
        m[i] = beta1 * m[i] + (1 - beta1) * g;
        v[i] = beta2 * v[i] + (1 - beta2) * g * g;
        const real mhat = (real)(m[i] / bc1), vhat = (real)(v[i] / bc2);
        params[i] -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * params[i]);
    }
}


// the recurrent kinds' advance: their states live per sequence (conv window, then the recurrent state); the
// recurrences take (B, n) contiguous states, so the n numbers at `offset` of each sequence's state are gathered
// (dir = 0) into dense (B, n) or scattered back (dir = 1)
static void decode_state_move(real *dense, real *state, size_t stride, size_t offset, size_t n, int B, int dir) {
    for (int b = 0; b < B; b++) {
        real *s = state + b * stride + offset, *d = dense + (size_t)b * n;
        if (dir == 0) { memcpy(d, s, n * sizeof(real)); } else { memcpy(s, d, n * sizeof(real)); }
    }
}

// ----------------------------------------------------------------------------------------------------------------
// the interface of a layer kind (a mixer or a feed-forward), the same on every executor (kinds.cuh is the GPU's):
// the block calls these through the table of ref/kinds.h and knows nothing else about a kind.

// one layer's tensors of a kind, in the kind's _PARAMS order: w the weights, g their gradients; and the channel of
// an auxiliary loss (MoE's load balancing): the forward adds its value to *aux (when not NULL), the backward takes
// aux_grad = dL/d(aux) (the loss scale)
typedef struct {
    real *const *w;
    real *const *g;
    double *aux;
    real aux_grad;
    TPLink *tp;     // the tensor-parallel group (NULL: one process): RMSNormTP's collectives
} KindTensors;

typedef struct {
    char letter;
    // numbers of activations one layer saves from forward to backward, and of the backward's scratch (shared by all
    // layers; zeroed by the caller before each layer's backward)
    size_t (*acts_size)(const ModelConfig *c, int B, int T);
    size_t (*scratch_size)(const ModelConfig *c, int B, int T);
    // out (B,T,C) = Kind(inp (B,T,C)); acts receives what the backward needs
    void (*forward)(real *out, real *acts, const real *inp, const KindTensors *t, const ModelConfig *c, int B, int T);
    // dinp (B,T,C) += d(inp); the kind's parameter gradients t->g += ...
    void (*backward)(real *dinp, real *scratch, const real *dout, const real *inp, const real *acts,
                     const KindTensors *t, const ModelConfig *c, int B, int T);
    // Decoding: B sequences advance by T tokens each (a prompt's prefill in chunks; T = 1 is the step of generation):
    // out (B,T,C) from inp (B,T,C). state (B, decode_state(c, context) of the layers.h row) carries each sequence's
    // history and is updated in place; all zeros is the empty history. pos (B): the position of each sequence's first
    // new token (pos + T ≤ context). The result equals the forward over the whole sequence (the same arithmetic).
    // NULL for stateless kinds (the feed-forwards), which the block runs through forward.
    void (*advance)(real *out, real *state, const real *inp, const KindTensors *t, const ModelConfig *c, int B, int T,
                    const int *pos, int context);
} KindOps;

#endif // M2RNN_REF_COMMON_H
