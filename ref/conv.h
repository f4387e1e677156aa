/*
ref/conv.h: the CPU reference of the depthwise causal conv1d with SiLU that M²RNN, the RNN baseline, GDN and Mamba-2
run over their projected inputs: forward, hand-written backward, and the single-token step of decoding.
Spec m2rnn_authors_code.md §1 item 3: pre[t, c] = Σ_{j<W} w[c, j] · x[t − (W−1) + j, c] (+ bias[c], Mamba-2's only),
zeros before t = 0; act = SiLU(pre). x is a view with row stride x_stride (it lives inside the projection output);
pre, act are dense; bias may be NULL.
GPU twin: conv.cuh (same names).
*/
#ifndef M2RNN_REF_CONV_H
#define M2RNN_REF_CONV_H

#include "ref/common.h"

// pre, act (B,T,CD); x view (B,T,CD) with row stride x_stride; w (CD, W); bias (CD) or NULL
static void conv1d_silu_forward(real *pre, real *act, const real *x, const real *w, const real *bias, int B, int T,
                                int CD, int W, int x_stride) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            real *o = pre + ((size_t)b * T + t) * CD, *a = act + ((size_t)b * T + t) * CD;
            for (int c = 0; c < CD; c++) {
                real acc = bias != NULL ? bias[c] : 0;
                for (int j = 0; j < W; j++) {
                    const int ts = t - (W - 1) + j;
                    if (ts >= 0) { acc += w[(size_t)c * W + j] * x[((size_t)b * T + ts) * x_stride + c]; }
                }
                o[c] = acc;
                a[c] = siluf(acc);
            }
        }
    }
}

// dx (view, stride x_stride) +=, dw (CD, W) +=, dbias (CD) += (when not NULL) from dact (B,T,CD), the gradient of
// act. Parallel over channels: deterministic.
static void conv1d_silu_backward(real *dx, real *dw, real *dbias, const real *dact, const real *pre, const real *x,
                                 const real *w, int B, int T, int CD, int W, int x_stride) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < CD; c++) {
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const size_t o = ((size_t)b * T + t) * CD + c;
                const real g = dact[o] * silu_grad(pre[o]);
                if (dbias != NULL) { dbias[c] += g; }
                for (int j = 0; j < W; j++) {
                    const int ts = t - (W - 1) + j;
                    if (ts < 0) { continue; }
                    dw[(size_t)c * W + j] += g * x[((size_t)b * T + ts) * x_stride + c];
                    dx[((size_t)b * T + ts) * x_stride + c] += g * w[(size_t)c * W + j];
                }
            }
        }
    }
}

// One token of B sequences: act (B, CD) = SiLU(conv) over the new input x (B rows, stride x_stride) and the last W−1
// inputs in state (B, W−1, CD) (zeros: the sequence's start), which then shifts by one token.
static void conv1d_silu_step(real *act, real *state, const real *x, const real *w, const real *bias, int B, int CD, int W,
                             int x_stride) {
    for (int b = 0; b < B; b++) {
        real *s = state + (size_t)b * (W - 1) * CD;
        const real *xb = x + (size_t)b * x_stride;
        for (int c = 0; c < CD; c++) {
            real acc = bias != NULL ? bias[c] : 0;
            for (int j = 0; j < W - 1; j++) { acc += w[(size_t)c * W + j] * s[(size_t)j * CD + c]; }
            acc += w[(size_t)c * W + W - 1] * xb[c];
            act[(size_t)b * CD + c] = siluf(acc);
            for (int j = 0; j + 1 < W - 1; j++) { s[(size_t)j * CD + c] = s[(size_t)(j + 1) * CD + c]; }
            if (W > 1) { s[(size_t)(W - 2) * CD + c] = xb[c]; }
        }
    }
}

#endif // M2RNN_REF_CONV_H
