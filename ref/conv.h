/*
ref/conv.h: the CPU reference of the depthwise causal conv1d with SiLU that M²RNN, the RNN baseline, GDN and Mamba-2
run over their projected inputs: forward, hand-written backward, and the advance of decoding (B sequences continue
from their conv states by T tokens: the prefill of a prompt in chunks, and the single-token step).
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

// B sequences continuing from their conv states: pre, act (B,T,CD) from x (B,T rows of stride x_stride), each
// sequence's state (its last W−1 inputs, (W−1, CD); zeros at a sequence's start) at b·state_stride, then updated to
// the last W−1 inputs. The same sums as the forward over the whole sequence: a chunk continues it bit for bit.
static void conv1d_silu_advance(real *pre, real *act, real *state, size_t state_stride, const real *x, const real *w,
                                const real *bias, int B, int T, int CD, int W, int x_stride) {
    const int L = W - 1 + T;
    real *ext = (real *)mallocCheck((size_t)3 * B * L * CD * sizeof(real)), *epre = ext + (size_t)B * L * CD;
    real *eact = epre + (size_t)B * L * CD;
    for (int b = 0; b < B; b++) {
        real *e = ext + (size_t)b * L * CD;
        memcpy(e, state + b * state_stride, (size_t)(W - 1) * CD * sizeof(real));
        for (int t = 0; t < T; t++) {
            memcpy(e + (size_t)(W - 1 + t) * CD, x + ((size_t)b * T + t) * x_stride, (size_t)CD * sizeof(real));
        }
    }
    conv1d_silu_forward(epre, eact, ext, w, bias, B, L, CD, W, CD);
    for (int b = 0; b < B; b++) {
        const size_t from = ((size_t)b * L + W - 1) * CD, to = (size_t)b * T * CD;
        memcpy(pre + to, epre + from, (size_t)T * CD * sizeof(real));
        memcpy(act + to, eact + from, (size_t)T * CD * sizeof(real));
        memcpy(state + b * state_stride, ext + ((size_t)b * L + T) * CD, (size_t)(W - 1) * CD * sizeof(real));
    }
    free(ext);
}

#endif // M2RNN_REF_CONV_H
