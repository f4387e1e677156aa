/*
ref/gate.h: the CPU reference of the gates the recurrent mixers share, forward and hand-written backward:
- the softplus decay gate of M²RNN and the RNN baseline (GDN and Mamba-2 use the same A_log / dt_bias
  parameterisation): f = exp(−exp(A_log) · softplus(f_raw + dt_bias)) per head, the paper's (1 + e^{x+β})^{−α},
  computed in double (spec m2rnn_authors_code.md §1 item 2); A_log and dt_bias init as Mamba-2 (model.h);
- the output gate: y += v ⊙ D (the residual around the recurrence; D may be absent), gated = y ⊙ SiLU(g).
GPU twin: gate.cuh (same names).
*/
#ifndef M2RNN_REF_GATE_H
#define M2RNN_REF_GATE_H

#include "ref/common.h"

// f (BT, N); f_raw: view (BT, N) with row stride `stride`
static void decay_gate_forward(real *f, const real *f_raw, const real *A_log, const real *dt_bias, int BT, int N,
                               int stride) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < BT; m++) {
        for (int n = 0; n < N; n++) {
            double dt = softplusr(f_raw[(size_t)m * stride + n] + dt_bias[n]);
            f[(size_t)m * N + n] = (real)exp(-exp((double)A_log[n]) * dt);
        }
    }
}

// df_raw (view) +=, dA_log (N) +=, ddt_bias (N) += from df (BT, N). Parallel over heads: deterministic.
static void decay_gate_backward(real *df_raw, real *dA_log, real *ddt_bias, const real *df, const real *f,
                                const real *f_raw, const real *A_log, const real *dt_bias, int BT, int N, int stride) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const double alpha = exp((double)A_log[n]);
        double sum_dA = 0.0, sum_dbias = 0.0;
        for (int m = 0; m < BT; m++) {
            const double x = f_raw[(size_t)m * stride + n] + dt_bias[n];
            const double g = (double)df[(size_t)m * N + n] * f[(size_t)m * N + n]; // dL/d(log f)
            const double dx = -g * alpha * sigmoidr((real)x);                       // log f = −α softplus(x)
            df_raw[(size_t)m * stride + n] += (real)dx;
            sum_dbias += dx;
            sum_dA += -g * alpha * softplusr((real)x);
        }
        dA_log[n] += (real)sum_dA;
        ddt_bias[n] += (real)sum_dbias;
    }
}

// y (BT, NV) += v ⊙ D (skipped when D is NULL);  gated = y ⊙ SiLU(g). v: rows of stride v_stride, g: rows of stride
// g_stride (views into the projection or conv outputs)
static void output_gate_forward(real *y, real *gated, const real *v, const real *g, const real *D, int BT, int NV,
                                int v_stride, int g_stride) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < BT; m++) {
        const real *gm = g + (size_t)m * g_stride;
        real *ym = y + (size_t)m * NV, *gt = gated + (size_t)m * NV;
        for (int i = 0; i < NV; i++) {
            if (D != NULL) { ym[i] += v[(size_t)m * v_stride + i] * D[i]; }
            gt[i] = ym[i] * siluf(gm[i]);
        }
    }
}

// dy (BT, NV) +=, dg (view) += from dgated; y is the forward's y (after the residual)
static void output_gate_backward(real *dy, real *dg, const real *dgated, const real *y, const real *g, int BT, int NV,
                                 int g_stride) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < BT; m++) {
        const real *gm = g + (size_t)m * g_stride, *ym = y + (size_t)m * NV, *dgt = dgated + (size_t)m * NV;
        real *dym = dy + (size_t)m * NV, *dgm = dg + (size_t)m * g_stride;
        for (int i = 0; i < NV; i++) {
            dym[i] += dgt[i] * siluf(gm[i]);
            dgm[i] += dgt[i] * ym[i] * silu_grad(gm[i]);
        }
    }
}

// the residual y += v ⊙ D: dv (view) += dy ⊙ D, dD (NV) += Σ_tokens dy ⊙ v (in token order: deterministic)
static void residual_backward(real *dv, real *dD, const real *dy, const real *v, const real *D, int BT, int NV,
                              int v_stride) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < NV; i++) {
        real acc = 0;
        for (int m = 0; m < BT; m++) {
            acc += dy[(size_t)m * NV + i] * v[(size_t)m * v_stride + i];
            dv[(size_t)m * v_stride + i] += dy[(size_t)m * NV + i] * D[i];
        }
        dD[i] += acc;
    }
}

#endif // M2RNN_REF_GATE_H
