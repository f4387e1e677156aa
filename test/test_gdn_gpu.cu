/*
test_gdn_gpu.cu: the chunked Gated DeltaNet kernels of gdn.cuh against a float64 host recurrence (written here, token
by token, from ref/gdn.h's math, independent of the chunked form) on random non-trivial inputs: the outputs o, the
final state, and the gradients of q, k, v, β, log α and the initial state, as normwise relative errors per tensor.
Shapes: T not a multiple of the 64-token chunk, K padded (48, 160) and the paper's 256, V tiles cut short (40, 96), an
initial state and a final-state gradient or none, β in (0, 2) (GDN[−1,1]), mild and strong decays. Also: the backward
twice, bit for bit; the single-token step kernel over T tokens against the chunked forward (outputs and final state);
the chunked forward from a state in two pieces against one piece (the decode advance); packed variable-length
sequences (cu_seqlens, one of them empty) bit for bit against each sequence run alone; the backward's recompute from
the kept T (gdn_chunk_recompute) and the q/k norm fused into the prep kernel (GDNQKNorm), each bit for bit against
the forward and the norm kernel.
The inputs are rounded to floatX first and the reference takes the rounded values, so what remains is the kernels'
own error: the bf16 build stages its MMA operands in bf16 (fla's contract) and is held at 3e-2 (outputs 2e-2); the
fp32 build (test_gdn_gpu_fp32) at 2e-4. Skips cleanly without a GPU.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "utils.h"
#include "model.h"
#include "layers.h"
#include "common.cuh"
#include "gdn.cuh"
#include "test/test_common.h"

#if FLOATX_IS_FP32
#define TOL_O 2e-4
#define TOL_G 2e-4
#define SUITE "test_gdn_gpu_fp32"
#else
#define TOL_O 2e-2
#define TOL_G 3e-2
#define SUITE "test_gdn_gpu"
#endif

static uint64_t rng_state = 12345;
static double urand(void) { // uniform [0, 1)
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
static double nrand(void) { return sqrt(-2.0 * log(urand() + 1e-300)) * cos(6.283185307179586 * urand()); }
static float round_x(double x) { return (float)(floatX)(float)x; }

static double rel_err(const double *got, const double *want, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return sqrt(num / (den > 0 ? den : 1.0));
}

// ---------------------------------------------------------------------------------------------------------------
// the float64 reference: q, k (B,T,H,K), v (B,T,H,V), beta, g (B,T,H), S0 (B,H,K,V) or NULL

typedef struct { int B, T, H, K, V; } Shape;

static void ref_forward(double *o, double *Sf, const double *q, const double *k, const double *v, const double *beta,
                        const double *g, const double *S0, Shape s) {
    const int K = s.K, V = s.V;
    const double scale = 1.0 / sqrt((double)K);
    double *S = (double *)mallocCheck((size_t)K * V * sizeof(double)), *p = (double *)mallocCheck(V * sizeof(double));
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.H; h++) {
            for (int i = 0; i < K * V; i++) { S[i] = S0 != NULL ? S0[((size_t)b * s.H + h) * K * V + i] : 0.0; }
            for (int t = 0; t < s.T; t++) {
                const size_t r = ((size_t)b * s.T + t) * s.H + h;
                const double a = exp(g[r]), be = beta[r];
                const double *qt = q + r * K, *kt = k + r * K, *vt = v + r * V;
                for (int j = 0; j < V; j++) { p[j] = 0; }
                for (int i = 0; i < K; i++) {
                    for (int j = 0; j < V; j++) {
                        S[i * V + j] *= a;
                        p[j] += S[i * V + j] * kt[i];
                    }
                }
                for (int i = 0; i < K; i++) {
                    for (int j = 0; j < V; j++) { S[i * V + j] += kt[i] * be * (vt[j] - p[j]); }
                }
                for (int j = 0; j < V; j++) {
                    double acc = 0;
                    for (int i = 0; i < K; i++) { acc += S[i * V + j] * qt[i]; }
                    o[r * V + j] = scale * acc;
                }
            }
            if (Sf != NULL) { memcpy(Sf + ((size_t)b * s.H + h) * K * V, S, (size_t)K * V * sizeof(double)); }
        }
    }
    free(S);
    free(p);
}

// gradients (written) of q, k, v, beta, g and S0 from dout (B,T,H,V) and dSf (B,H,K,V) or NULL: ref/gdn.h's
// per-token backward, every state kept
static void ref_backward(double *dq, double *dk, double *dv, double *dbeta, double *dg, double *dS0, const double *dout,
                         const double *dSf, const double *q, const double *k, const double *v, const double *beta,
                         const double *g, const double *S0, Shape s) {
    const int K = s.K, V = s.V, T = s.T;
    const size_t KV = (size_t)K * V;
    const double scale = 1.0 / sqrt((double)K);
    double *St = (double *)mallocCheck((size_t)(T + 1) * KV * sizeof(double)), *dS = (double *)mallocCheck(KV * sizeof(double));
    double *p = (double *)mallocCheck(4 * V * sizeof(double)), *u = p + V, *du = u + V, *dp = du + V;
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.H; h++) {
            for (size_t i = 0; i < KV; i++) { St[i] = S0 != NULL ? S0[((size_t)b * s.H + h) * KV + i] : 0.0; }
            for (int t = 0; t < T; t++) { // St[t + 1] = S after token t
                const size_t r = ((size_t)b * T + t) * s.H + h;
                const double a = exp(g[r]), be = beta[r], *kt = k + r * K, *vt = v + r * V;
                const double *Sp = St + (size_t)t * KV;
                double *Sn = St + (size_t)(t + 1) * KV;
                for (int j = 0; j < V; j++) { p[j] = 0; }
                for (int i = 0; i < K; i++) {
                    for (int j = 0; j < V; j++) { p[j] += a * Sp[i * V + j] * kt[i]; }
                }
                for (int i = 0; i < K; i++) {
                    for (int j = 0; j < V; j++) { Sn[i * V + j] = a * Sp[i * V + j] + kt[i] * be * (vt[j] - p[j]); }
                }
            }
            for (size_t i = 0; i < KV; i++) { dS[i] = dSf != NULL ? dSf[((size_t)b * s.H + h) * KV + i] : 0.0; }
            for (int t = T - 1; t >= 0; t--) {
                const size_t r = ((size_t)b * T + t) * s.H + h;
                const double a = exp(g[r]), be = beta[r];
                const double *qt = q + r * K, *kt = k + r * K, *vt = v + r * V, *dot = dout + r * V;
                const double *Sp = St + (size_t)t * KV, *Sn = Sp + KV;
                double *dqt = dq + r * K, *dkt = dk + r * K, *dvt = dv + r * V;
                for (int j = 0; j < V; j++) { p[j] = 0; }
                for (int i = 0; i < K; i++) {
                    for (int j = 0; j < V; j++) { p[j] += a * Sp[i * V + j] * kt[i]; }
                }
                for (int j = 0; j < V; j++) { u[j] = be * (vt[j] - p[j]); }
                for (int i = 0; i < K; i++) {
                    double acc = 0;
                    for (int j = 0; j < V; j++) {
                        acc += Sn[i * V + j] * dot[j];
                        dS[i * V + j] += scale * qt[i] * dot[j];
                    }
                    dqt[i] = scale * acc;
                }
                for (int j = 0; j < V; j++) { du[j] = 0; }
                for (int i = 0; i < K; i++) {
                    double acc = 0;
                    for (int j = 0; j < V; j++) {
                        du[j] += dS[i * V + j] * kt[i];
                        acc += dS[i * V + j] * u[j];
                    }
                    dkt[i] = acc;
                }
                double dbe = 0;
                for (int j = 0; j < V; j++) {
                    dbe += du[j] * (vt[j] - p[j]);
                    dvt[j] = be * du[j];
                    dp[j] = -be * du[j];
                }
                dbeta[r] = dbe;
                double da = 0;
                for (int i = 0; i < K; i++) {
                    double acc = 0;
                    for (int j = 0; j < V; j++) {
                        const double sp = Sp[i * V + j];
                        acc += a * sp * dp[j];
                        const double dSp = dS[i * V + j] + kt[i] * dp[j];
                        da += dSp * sp;
                        dS[i * V + j] = a * dSp;
                    }
                    dkt[i] += acc;
                }
                dg[r] = da * a; // dL/d(log α) = dL/dα · α
            }
            if (dS0 != NULL) { memcpy(dS0 + ((size_t)b * s.H + h) * KV, dS, KV * sizeof(double)); }
        }
    }
    free(St);
    free(dS);
    free(p);
}

// ---------------------------------------------------------------------------------------------------------------
// device helpers

static floatX *up_x(const double *h, size_t n) {
    floatX *tmp = (floatX *)mallocCheck((n + 1) * sizeof(floatX)), *d;
    for (size_t i = 0; i < n; i++) { tmp[i] = (floatX)(float)h[i]; }
    cudaCheck(cudaMalloc(&d, (n + 1) * sizeof(floatX)));
    cudaCheck(cudaMemcpy(d, tmp, n * sizeof(floatX), cudaMemcpyHostToDevice));
    free(tmp);
    return d;
}
static float *up_f(const double *h, size_t n) {
    float *tmp = (float *)mallocCheck((n + 1) * sizeof(float)), *d;
    for (size_t i = 0; i < n; i++) { tmp[i] = (float)h[i]; }
    cudaCheck(cudaMalloc(&d, (n + 1) * sizeof(float)));
    cudaCheck(cudaMemcpy(d, tmp, n * sizeof(float), cudaMemcpyHostToDevice));
    free(tmp);
    return d;
}
static void down_x(double *h, const floatX *d, size_t n, long stride, long width) { // rows of width, stride apart
    const size_t rows = n / width;
    floatX *tmp = (floatX *)mallocCheck((rows * stride + 1) * sizeof(floatX));
    cudaCheck(cudaMemcpy(tmp, d, ((rows - 1) * stride + width) * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (size_t r = 0; r < rows; r++) {
        for (long i = 0; i < width; i++) { h[r * width + i] = (float)tmp[r * stride + i]; }
    }
    free(tmp);
}
static void down_f(double *h, const float *d, size_t n) {
    float *tmp = (float *)mallocCheck((n + 1) * sizeof(float));
    cudaCheck(cudaMemcpy(tmp, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) { h[i] = tmp[i]; }
    free(tmp);
}
static double *dalloc(size_t n) { return (double *)callocCheck(n + 1, sizeof(double)); }
static int same(const void *a, const void *b, size_t bytes) { // two device buffers, bit for bit
    char *x = (char *)mallocCheck(bytes + 1), *y = (char *)mallocCheck(bytes + 1);
    cudaCheck(cudaMemcpy(x, a, bytes, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(y, b, bytes, cudaMemcpyDeviceToHost));
    const int eq = memcmp(x, y, bytes) == 0;
    free(x);
    free(y);
    return eq;
}

// ---------------------------------------------------------------------------------------------------------------

static void run_case(const char *name, Shape s, int with_state, double gmax, int check_extras) {
    const int B = s.B, T = s.T, H = s.H, K = s.K, V = s.V;
    const size_t BTH = (size_t)B * T * H, nq = BTH * K, nv = BTH * V, nS = (size_t)B * H * K * V;
    const int v_stride = H * V + 8; // v as a view into wider rows, as the conv output holds it
    double *q = dalloc(nq), *k = dalloc(nq), *v = dalloc(nv), *beta = dalloc(BTH), *g = dalloc(BTH);
    double *S0 = dalloc(nS), *dout = dalloc(nv), *dSf = dalloc(nS);
    for (size_t r = 0; r < BTH; r++) {
        double nq2 = 0, nk2 = 0;
        for (int i = 0; i < K; i++) {
            q[r * K + i] = nrand();
            k[r * K + i] = nrand();
            nq2 += q[r * K + i] * q[r * K + i];
            nk2 += k[r * K + i] * k[r * K + i];
        }
        for (int i = 0; i < K; i++) {
            q[r * K + i] = round_x(q[r * K + i] / sqrt(nq2));
            k[r * K + i] = round_x(k[r * K + i] / sqrt(nk2));
        }
        for (int j = 0; j < V; j++) { v[r * V + j] = round_x(nrand()); }
        beta[r] = (float)(2.0 * urand() * 0.98 + 0.01);
        g[r] = (float)(-gmax * urand());
    }
    for (size_t i = 0; i < nS; i++) {
        S0[i] = (float)(0.5 * nrand());
        dSf[i] = (float)nrand();
    }
    for (size_t i = 0; i < nv; i++) { dout[i] = round_x(nrand()); }
    const double *S0r = with_state ? S0 : NULL, *dSfr = with_state ? dSf : NULL;
    double *o_ref = dalloc(nv), *Sf_ref = dalloc(nS), *dq_ref = dalloc(nq), *dk_ref = dalloc(nq), *dv_ref = dalloc(nv);
    double *db_ref = dalloc(BTH), *dg_ref = dalloc(BTH), *dS0_ref = dalloc(nS);
    ref_forward(o_ref, Sf_ref, q, k, v, beta, g, S0r, s);
    ref_backward(dq_ref, dk_ref, dv_ref, db_ref, dg_ref, dS0_ref, dout, dSfr, q, k, v, beta, g, S0r, s);

    // device inputs: v widened to its view
    double *vw = dalloc(BTH / H * v_stride);
    for (size_t m = 0; m < BTH / H; m++) {
        for (int j = 0; j < H * V; j++) { vw[m * v_stride + j] = v[m * H * V + j]; }
    }
    floatX *d_q = up_x(q, nq), *d_k = up_x(k, nq), *d_v = up_x(vw, BTH / H * v_stride), *d_dout = up_x(dout, nv);
    float *d_beta = up_f(beta, BTH), *d_g = up_f(g, BTH), *d_S0 = up_f(S0, nS), *d_dSf = up_f(dSf, nS);
    floatX *d_o, *d_dq = NULL, *d_dk, *d_dv;
    float *d_Sf, *d_db, *d_dg, *d_dS0;
    cudaCheck(cudaMalloc(&d_o, nv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_dk, nq * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_dv, BTH / H * v_stride * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_Sf, nS * sizeof(float)));
    cudaCheck(cudaMalloc(&d_db, BTH * sizeof(float)));
    cudaCheck(cudaMalloc(&d_dg, BTH * sizeof(float)));
    cudaCheck(cudaMalloc(&d_dS0, nS * sizeof(float)));
    GDNChunkBufs f;
    GDNChunkGrads gr;
    DeviceArena ar = {NULL, 0};
    gdn_chunk_bufs_take(&f, &ar, B, T, H, K, V, false, true);
    gdn_chunk_grads_take(&gr, &ar, B, T, H, K, V, false);
    void *mem;
    cudaCheck(cudaMalloc(&mem, ar.used));
    cudaCheck(cudaMemset(mem, 0xff, ar.used)); // NaN-filled: a kernel reading what nobody wrote shows
    ar = (DeviceArena){(char *)mem, 0};
    gdn_chunk_bufs_take(&f, &ar, B, T, H, K, V, false, true);
    gdn_chunk_grads_take(&gr, &ar, B, T, H, K, V, false);
    const long sS = (long)H * K * V;
    gdn_chunk_forward(d_o, &f, d_Sf, sS, with_state ? d_S0 : NULL, sS, d_q, d_k, NULL, d_v, v_stride, d_beta, d_g, NULL,
                      B, T, H, K, V, 0);
    gdn_chunk_backward(d_dk, d_dv, v_stride, d_db, d_dg, &gr, d_dS0, sS, with_state ? d_dSf : NULL, sS, d_dout, &f,
                       d_q, d_k, d_v, v_stride, d_beta, NULL, B, T, H, K, V, 0);
    d_dq = gr.dq;
    cudaCheck(cudaDeviceSynchronize());
    double *o = dalloc(nv), *Sf = dalloc(nS), *dq = dalloc(nq), *dk = dalloc(nq), *dv = dalloc(nv), *db = dalloc(BTH);
    double *dg = dalloc(BTH), *dS0 = dalloc(nS);
    down_x(o, d_o, nv, V, V);
    down_f(Sf, d_Sf, nS);
    down_x(dq, d_dq, nq, K, K);
    down_x(dk, d_dk, nq, K, K);
    down_x(dv, d_dv, nv, v_stride, H * V);
    down_f(db, d_db, BTH);
    down_f(dg, d_dg, BTH);
    down_f(dS0, d_dS0, nS);
    const double e[8] = {rel_err(o, o_ref, nv), rel_err(Sf, Sf_ref, nS), rel_err(dq, dq_ref, nq), rel_err(dk, dk_ref, nq),
                         rel_err(dv, dv_ref, nv), rel_err(db, db_ref, BTH), rel_err(dg, dg_ref, BTH),
                         rel_err(dS0, dS0_ref, nS)};
    char label[160];
    snprintf(label, sizeof(label), "%s forward (o, final state)", name);
    test_result(e[0] < TOL_O && e[1] < TOL_O, label, "o %.2e  S_T %.2e  (tolerance %.0e; B=%d T=%d H=%d K=%d V=%d)",
                e[0], e[1], TOL_O, B, T, H, K, V);
    snprintf(label, sizeof(label), "%s backward", name);
    int ok = 1;
    for (int i = 2; i < 8; i++) { ok &= e[i] < TOL_G; }
    test_result(ok, label, "dq %.2e dk %.2e dv %.2e dbeta %.2e dlog_alpha %.2e dS0 %.2e (tolerance %.0e)", e[2], e[3],
                e[4], e[5], e[6], with_state ? e[7] : 0.0, TOL_G);

    if (check_extras) {
        // the backward again: bit for bit
        floatX *h1 = (floatX *)mallocCheck(nq * sizeof(floatX)), *h2 = (floatX *)mallocCheck(nq * sizeof(floatX));
        float *g1 = (float *)mallocCheck(BTH * sizeof(float)), *g2 = (float *)mallocCheck(BTH * sizeof(float));
        cudaCheck(cudaMemcpy(h1, d_dk, nq * sizeof(floatX), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(g1, d_dg, BTH * sizeof(float), cudaMemcpyDeviceToHost));
        gdn_chunk_backward(d_dk, d_dv, v_stride, d_db, d_dg, &gr, d_dS0, sS, with_state ? d_dSf : NULL, sS, d_dout, &f,
                           d_q, d_k, d_v, v_stride, d_beta, NULL, B, T, H, K, V, 0);
        cudaCheck(cudaMemcpy(h2, d_dk, nq * sizeof(floatX), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(g2, d_dg, BTH * sizeof(float), cudaMemcpyDeviceToHost));
        snprintf(label, sizeof(label), "%s backward repeatable", name);
        test_result(memcmp(h1, h2, nq * sizeof(floatX)) == 0 && memcmp(g1, g2, BTH * sizeof(float)) == 0, label,
                    "dk and dlog_alpha of two runs compared bit for bit");
        free(h1); free(h2); free(g1); free(g2);

        // the backward's recompute (gdn_chunk_recompute: W, U, P, the chunk-start states, Vn from the kept T and Gc,
        // no inversion) = the forward's buffers, bit for bit, over NaN-filled copies
        const size_t NS = (size_t)B * gdn_chunks(T), szs[5] = {nq, nv, NS * H * GDN_L * GDN_L, NS * nS / B, nv};
        floatX *bufs[5] = {f.W, f.U, f.Pm, f.hst, f.vn}, *keep[5];
        for (int i = 0; i < 5; i++) {
            cudaCheck(cudaMalloc(&keep[i], szs[i] * sizeof(floatX)));
            cudaCheck(cudaMemcpy(keep[i], bufs[i], szs[i] * sizeof(floatX), cudaMemcpyDeviceToDevice));
            cudaCheck(cudaMemset(bufs[i], 0xff, szs[i] * sizeof(floatX)));
        }
        gdn_chunk_recompute(&f, with_state ? d_S0 : NULL, sS, d_q, d_k, d_v, v_stride, d_beta, NULL, B, T, H, K, V, 0);
        int eq_r = 1;
        for (int i = 0; i < 5; i++) {
            eq_r &= same(keep[i], bufs[i], szs[i] * sizeof(floatX));
            cudaCheck(cudaFree(keep[i]));
        }
        snprintf(label, sizeof(label), "%s recompute = forward", name);
        test_result(eq_r, label, "W, U, P, chunk-start states, Vn from the kept T and Gc: %s",
                    eq_r ? "bit for bit" : "DIFFER");

        // the q/k L2 norm fused into the prep kernel (GDNQKNorm: raw q, k in a strided view, as the conv leaves them)
        // = the norm kernel then the forward: qn, kn, 1/norms, o and the final state bit for bit (K a multiple of
        // 16 bytes, where the norm kernel takes the same 16-byte form)
        const int HK = H * K, CDr = 2 * HK + 8;
        double *raw = dalloc(BTH / H * CDr);
        for (size_t r = 0; r < BTH; r++) { // the normalized rows scaled by 0.5-2.5, rounded
            const size_t m = r / H, hh = r % H;
            const double sq = 0.5 + 2.0 * urand(), sk = 0.5 + 2.0 * urand();
            for (int i = 0; i < K; i++) {
                raw[m * CDr + hh * K + i] = round_x(q[r * K + i] * sq);
                raw[m * CDr + HK + hh * K + i] = round_x(k[r * K + i] * sk);
            }
        }
        floatX *d_raw = up_x(raw, BTH / H * CDr), *nx[4], *o_n[2];
        float *rn[4], *Sf_n[2];
        for (int i = 0; i < 4; i++) {
            cudaCheck(cudaMalloc(&nx[i], nq * sizeof(floatX)));
            cudaCheck(cudaMalloc(&rn[i], BTH * sizeof(float)));
        }
        for (int i = 0; i < 2; i++) {
            cudaCheck(cudaMalloc(&o_n[i], nv * sizeof(floatX)));
            cudaCheck(cudaMalloc(&Sf_n[i], nS * sizeof(float)));
        }
        l2norm_forward(nx[0], rn[0], d_raw, B * T, H, K, CDr, 0);
        l2norm_forward(nx[1], rn[1], d_raw + HK, B * T, H, K, CDr, 0);
        gdn_chunk_forward(o_n[0], &f, Sf_n[0], sS, with_state ? d_S0 : NULL, sS, nx[0], nx[1], NULL, d_v, v_stride,
                          d_beta, d_g, NULL, B, T, H, K, V, 0);
        const GDNQKNorm nm = {CDr, nx[2], nx[3], rn[2], rn[3]};
        gdn_chunk_forward(o_n[1], &f, Sf_n[1], sS, with_state ? d_S0 : NULL, sS, d_raw, d_raw + HK, &nm, d_v, v_stride,
                          d_beta, d_g, NULL, B, T, H, K, V, 0);
        cudaCheck(cudaDeviceSynchronize());
        const int eq_n = same(nx[0], nx[2], nq * sizeof(floatX)) && same(nx[1], nx[3], nq * sizeof(floatX)) &&
                         same(rn[0], rn[2], BTH * 4) && same(rn[1], rn[3], BTH * 4);
        const int eq_o = same(o_n[0], o_n[1], nv * sizeof(floatX)) && same(Sf_n[0], Sf_n[1], nS * sizeof(float));
        snprintf(label, sizeof(label), "%s q/k norm fused = norm kernel", name);
        test_result(eq_n && eq_o, label, "qn kn rq rk %s, o and final state %s", eq_n ? "bit for bit" : "DIFFER",
                    eq_o ? "bit for bit" : "DIFFER");
        // the norm's backward (the 16-byte form where K allows it, a row on l2norm_lanes(K) lanes; else the element
        // form) against float64 on the q view: dx = r (dout − y (y·dout)), y = x r, r = 1/sqrt(Σx² + 1e-6); dout the
        // normalized k (any values will do)
        floatX *d_dxn;
        cudaCheck(cudaMalloc(&d_dxn, BTH / H * CDr * sizeof(floatX)));
        cudaCheck(cudaMemset(d_dxn, 0, BTH / H * CDr * sizeof(floatX)));
        l2norm_backward(d_dxn, d_k, d_raw, rn[0], B * T, H, K, CDr, 0);
        cudaCheck(cudaDeviceSynchronize());
        double *dx_got = dalloc(nq), *dx_want = dalloc(nq), *dout_h = dalloc(nq);
        down_x(dx_got, d_dxn, nq, CDr, HK);
        down_x(dout_h, d_k, nq, HK, HK);
        for (size_t r = 0; r < BTH; r++) {
            const double *xr = raw + (r / H) * CDr + (r % H) * K, *dr = dout_h + r * K;
            double ss = 0.0, dot = 0.0;
            for (int i = 0; i < K; i++) { ss += xr[i] * xr[i]; }
            const double rr = 1.0 / sqrt(ss + 1e-6);
            for (int i = 0; i < K; i++) { dot += xr[i] * rr * dr[i]; }
            for (int i = 0; i < K; i++) { dx_want[r * K + i] = rr * (dr[i] - xr[i] * rr * dot); }
        }
        const double e_b = rel_err(dx_got, dx_want, nq), tol_b = FLOATX_IS_FP32 ? 1e-5 : 1e-2;
        snprintf(label, sizeof(label), "%s q/k norm backward", name);
        test_result(e_b <= tol_b, label, "%s form: %.2e against float64 (tolerance %.0e)",
                    l2norm_vec(d_raw, d_dxn, K, CDr) ? "16-byte" : "element", e_b, tol_b);
        cudaCheck(cudaFree(d_dxn));
        free(dx_got);
        free(dx_want);
        free(dout_h);
        for (int i = 0; i < 4; i++) { cudaCheck(cudaFree(nx[i])); cudaCheck(cudaFree(rn[i])); }
        for (int i = 0; i < 2; i++) { cudaCheck(cudaFree(o_n[i])); cudaCheck(cudaFree(Sf_n[i])); }
        cudaCheck(cudaFree(d_raw));
        free(raw);

        // the step kernel, token by token from S0, against the chunked forward (every token's o, the final state):
        // the step keeps the state in fp32 and multiplies unrounded, so it sits within the forward's own tolerance
        float *d_St;
        floatX *d_ot;
        cudaCheck(cudaMalloc(&d_St, nS * sizeof(float)));
        cudaCheck(cudaMalloc(&d_ot, (size_t)B * H * V * sizeof(floatX)));
        cudaCheck(cudaMemcpy(d_St, with_state ? d_S0 : d_dSf, nS * sizeof(float), cudaMemcpyDeviceToDevice));
        if (!with_state) { cudaCheck(cudaMemset(d_St, 0, nS * sizeof(float))); }
        // beside it, the kernel's element-by-element path (odd V or an unaligned state) on a copy: the same sums
        float *d_Se;
        floatX *d_oe;
        cudaCheck(cudaMalloc(&d_Se, nS * sizeof(float)));
        cudaCheck(cudaMalloc(&d_oe, (size_t)B * H * V * sizeof(floatX)));
        cudaCheck(cudaMemcpy(d_Se, d_St, nS * sizeof(float), cudaMemcpyDeviceToDevice));
        bool elem_same = true;
        // per-token inputs gathered into (B, H, ·) rows
        floatX *d_qt, *d_kt, *d_vt;
        float *d_bt, *d_gt;
        cudaCheck(cudaMalloc(&d_qt, (size_t)B * H * K * sizeof(floatX)));
        cudaCheck(cudaMalloc(&d_kt, (size_t)B * H * K * sizeof(floatX)));
        cudaCheck(cudaMalloc(&d_vt, (size_t)B * H * V * sizeof(floatX)));
        cudaCheck(cudaMalloc(&d_bt, (size_t)B * H * sizeof(float)));
        cudaCheck(cudaMalloc(&d_gt, (size_t)B * H * sizeof(float)));
        double *ostep = dalloc(nv), *orow = dalloc((size_t)B * H * V);
        for (int t = 0; t < T; t++) {
            for (int b = 0; b < B; b++) {
                const size_t src = ((size_t)b * T + t) * H;
                cudaCheck(cudaMemcpy(d_qt + (size_t)b * H * K, d_q + src * K, (size_t)H * K * sizeof(floatX), cudaMemcpyDeviceToDevice));
                cudaCheck(cudaMemcpy(d_kt + (size_t)b * H * K, d_k + src * K, (size_t)H * K * sizeof(floatX), cudaMemcpyDeviceToDevice));
                cudaCheck(cudaMemcpy(d_vt + (size_t)b * H * V, d_v + ((size_t)b * T + t) * v_stride, (size_t)H * V * sizeof(floatX), cudaMemcpyDeviceToDevice));
                cudaCheck(cudaMemcpy(d_bt + (size_t)b * H, d_beta + src, H * sizeof(float), cudaMemcpyDeviceToDevice));
                cudaCheck(cudaMemcpy(d_gt + (size_t)b * H, d_g + src, H * sizeof(float), cudaMemcpyDeviceToDevice));
            }
            gdn_step(d_ot, d_St, sS, d_qt, d_kt, d_vt, H * V, d_bt, d_gt, B, H, K, V, 0);
            gdn_step_kernel<false><<<dim3(CEIL_DIV(V, 2 * WARP_SIZE), H, B), GDN_STEP_WARPS * WARP_SIZE>>>(
                d_oe, d_Se, sS, d_qt, d_kt, d_vt, H * V, d_bt, d_gt, H, K, V);
            cudaCheck(cudaGetLastError());
            elem_same = elem_same && same(d_ot, d_oe, (size_t)B * H * V * sizeof(floatX));
            down_x(orow, d_ot, (size_t)B * H * V, V, V);
            for (int b = 0; b < B; b++) {
                memcpy(ostep + ((size_t)b * T + t) * H * V, orow + (size_t)b * H * V, (size_t)H * V * sizeof(double));
            }
        }
        double *Sst = dalloc(nS);
        down_f(Sst, d_St, nS);
        snprintf(label, sizeof(label), "%s step kernel = reference", name);
        const double es = rel_err(ostep, o_ref, nv), ess = rel_err(Sst, Sf_ref, nS);
        test_result(es < TOL_O && ess < TOL_O, label, "o %.2e  S_T %.2e over %d single-token steps", es, ess, T);
        elem_same = elem_same && same(d_St, d_Se, nS * sizeof(float));
        snprintf(label, sizeof(label), "%s step kernel, element path = pair path", name);
        test_result(elem_same, label, "every o and the final state %s", elem_same ? "bit for bit" : "DIFFER");
        cudaCheck(cudaFree(d_Se));
        cudaCheck(cudaFree(d_oe));

        // the forward from S0 in two pieces (T1 then T − T1 tokens, the state carried in place) = one piece
        const int T1 = T / 3 + 5, T2 = T - T1;
        cudaCheck(cudaMemcpy(d_St, with_state ? d_S0 : d_dSf, nS * sizeof(float), cudaMemcpyDeviceToDevice));
        if (!with_state) { cudaCheck(cudaMemset(d_St, 0, nS * sizeof(float))); }
        floatX *d_o2;
        cudaCheck(cudaMalloc(&d_o2, nv * sizeof(floatX)));
        for (int piece = 0; piece < 2; piece++) {
            const int Tp = piece == 0 ? T1 : T2, off = piece == 0 ? 0 : T1;
            for (int b = 0; b < B; b++) { // one sequence at a time: the pieces are not contiguous across sequences
                const size_t r0 = ((size_t)b * T + off) * H;
                gdn_chunk_forward(d_o2 + r0 * V, &f, d_St + b * sS, sS, d_St + b * sS, sS, d_q + r0 * K, d_k + r0 * K,
                                  NULL, d_v + ((size_t)b * T + off) * v_stride, v_stride, d_beta + r0, d_g + r0, NULL, 1,
                                  Tp, H, K, V, 0);
            }
        }
        double *o2 = dalloc(nv), *S2 = dalloc(nS);
        down_x(o2, d_o2, nv, V, V);
        down_f(S2, d_St, nS);
        snprintf(label, sizeof(label), "%s forward in two pieces = reference", name);
        const double e2 = rel_err(o2, o_ref, nv), e2s = rel_err(S2, Sf_ref, nS);
        test_result(e2 < TOL_O && e2s < TOL_O, label, "o %.2e  S_T %.2e (pieces of %d and %d tokens)", e2, e2s, T1, T2);
        cudaCheck(cudaFree(d_St)); cudaCheck(cudaFree(d_ot)); cudaCheck(cudaFree(d_o2));
        cudaCheck(cudaFree(d_qt)); cudaCheck(cudaFree(d_kt)); cudaCheck(cudaFree(d_vt));
        cudaCheck(cudaFree(d_bt)); cudaCheck(cudaFree(d_gt));
        free(ostep); free(orow); free(Sst); free(o2); free(S2);
    }
    cudaCheck(cudaFree(mem));
    void *dev[] = {d_q, d_k, d_v, d_dout, d_beta, d_g, d_S0, d_dSf, d_o, d_dk, d_dv, d_Sf, d_db, d_dg, d_dS0};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) { cudaCheck(cudaFree(dev[i])); }
    double *host[] = {q, k, v, beta, g, S0, dout, dSf, o_ref, Sf_ref, dq_ref, dk_ref, dv_ref, db_ref, dg_ref, dS0_ref,
                      vw, o, Sf, dq, dk, dv, db, dg, dS0};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++) { free(host[i]); }
}

// packed variable-length sequences (cu_seqlens, one of them empty) against each sequence run alone through the fixed
// layout (B=1): outputs, final states and every gradient bit for bit (a chunk's work does not depend on where its
// sequence lies), an empty sequence's final state = its initial state and its dS0 = its dS_final
static void run_packed(const char *name, int H, int K, int V, std::vector<int> lens) {
    const int B = (int)lens.size(), v_stride = H * V + 8;
    std::vector<int> cu(B + 1, 0);
    for (int b = 0; b < B; b++) { cu[b + 1] = cu[b] + lens[b]; }
    const int T = cu[B];
    const size_t TH = (size_t)T * H, nq = TH * K, nv = TH * V, nS = (size_t)B * H * K * V, sS = (size_t)H * K * V;
    double *q = dalloc(nq), *k = dalloc(nq), *vw = dalloc((size_t)T * v_stride), *beta = dalloc(TH), *g = dalloc(TH);
    double *S0 = dalloc(nS), *dout = dalloc(nv), *dSf = dalloc(nS);
    for (size_t r = 0; r < TH; r++) {
        for (int i = 0; i < K; i++) { q[r * K + i] = round_x(nrand() / sqrt((double)K)); }
        for (int i = 0; i < K; i++) { k[r * K + i] = round_x(nrand() / sqrt((double)K)); }
        beta[r] = (float)(urand() * 0.98 + 0.01);
        g[r] = (float)(-0.3 * urand());
    }
    for (size_t i = 0; i < (size_t)T * v_stride; i++) { vw[i] = round_x(nrand()); }
    for (size_t i = 0; i < nS; i++) { S0[i] = (float)(0.5 * nrand()); dSf[i] = (float)nrand(); }
    for (size_t i = 0; i < nv; i++) { dout[i] = round_x(nrand()); }
    floatX *d_q = up_x(q, nq), *d_k = up_x(k, nq), *d_v = up_x(vw, (size_t)T * v_stride), *d_dout = up_x(dout, nv);
    float *d_beta = up_f(beta, TH), *d_g = up_f(g, TH), *d_S0 = up_f(S0, nS), *d_dSf = up_f(dSf, nS);
    int *d_cu;
    cudaCheck(cudaMalloc(&d_cu, (B + 1) * sizeof(int)));
    cudaCheck(cudaMemcpy(d_cu, cu.data(), (B + 1) * sizeof(int), cudaMemcpyHostToDevice));
    // outputs of the two runs: [0] packed, [1] one sequence at a time
    floatX *o[2], *dk[2], *dv[2], *dq[2];
    float *Sf[2], *db[2], *dg[2], *dS0[2];
    for (int r = 0; r < 2; r++) {
        cudaCheck(cudaMalloc(&o[r], nv * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dq[r], nq * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dk[r], nq * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dv[r], (size_t)T * v_stride * sizeof(floatX)));
        cudaCheck(cudaMalloc(&Sf[r], nS * sizeof(float)));
        cudaCheck(cudaMalloc(&db[r], TH * sizeof(float)));
        cudaCheck(cudaMalloc(&dg[r], TH * sizeof(float)));
        cudaCheck(cudaMalloc(&dS0[r], nS * sizeof(float)));
        cudaCheck(cudaMemset(dv[r], 0, (size_t)T * v_stride * sizeof(floatX))); // (the view's padding columns)
        cudaCheck(cudaMemset(Sf[r], 0xff, nS * sizeof(float)));
        cudaCheck(cudaMemset(dS0[r], 0xff, nS * sizeof(float)));
    }
    int maxlen = 1;
    for (int L : lens) { maxlen = L > maxlen ? L : maxlen; }
    GDNChunkBufs f[2];
    GDNChunkGrads gr[2];
    DeviceArena ar = {NULL, 0};
    gdn_chunk_bufs_take(&f[0], &ar, B, T, H, K, V, true, true);
    gdn_chunk_grads_take(&gr[0], &ar, B, T, H, K, V, true);
    gdn_chunk_bufs_take(&f[1], &ar, 1, maxlen, H, K, V, false, true);
    gdn_chunk_grads_take(&gr[1], &ar, 1, maxlen, H, K, V, false);
    void *mem;
    cudaCheck(cudaMalloc(&mem, ar.used));
    cudaCheck(cudaMemset(mem, 0xff, ar.used)); // NaN-filled: a kernel reading what nobody wrote shows
    ar = (DeviceArena){(char *)mem, 0};
    gdn_chunk_bufs_take(&f[0], &ar, B, T, H, K, V, true, true);
    gdn_chunk_grads_take(&gr[0], &ar, B, T, H, K, V, true);
    gdn_chunk_bufs_take(&f[1], &ar, 1, maxlen, H, K, V, false, true);
    gdn_chunk_grads_take(&gr[1], &ar, 1, maxlen, H, K, V, false);
    gdn_chunk_forward(o[0], &f[0], Sf[0], sS, d_S0, sS, d_q, d_k, NULL, d_v, v_stride, d_beta, d_g, d_cu, B, T, H, K, V,
                      0);
    gdn_chunk_backward(dk[0], dv[0], v_stride, db[0], dg[0], &gr[0], dS0[0], sS, d_dSf, sS, d_dout, &f[0], d_q, d_k,
                       d_v, v_stride, d_beta, d_cu, B, T, H, K, V, 0);
    cudaCheck(cudaMemcpy(dq[0], gr[0].dq, nq * sizeof(floatX), cudaMemcpyDeviceToDevice));
    for (int b = 0; b < B; b++) {
        const size_t t0 = cu[b], r0 = t0 * H;
        if (lens[b] == 0) { // nothing to run: what the packed run must give
            cudaCheck(cudaMemcpy(Sf[1] + b * sS, d_S0 + b * sS, sS * sizeof(float), cudaMemcpyDeviceToDevice));
            cudaCheck(cudaMemcpy(dS0[1] + b * sS, d_dSf + b * sS, sS * sizeof(float), cudaMemcpyDeviceToDevice));
            continue;
        }
        gdn_chunk_forward(o[1] + r0 * V, &f[1], Sf[1] + b * sS, sS, d_S0 + b * sS, sS, d_q + r0 * K, d_k + r0 * K,
                          NULL, d_v + t0 * v_stride, v_stride, d_beta + r0, d_g + r0, NULL, 1, lens[b], H, K, V, 0);
        gdn_chunk_backward(dk[1] + r0 * K, dv[1] + t0 * v_stride, v_stride, db[1] + r0, dg[1] + r0, &gr[1],
                           dS0[1] + b * sS, sS, d_dSf + b * sS, sS, d_dout + r0 * V, &f[1], d_q + r0 * K, d_k + r0 * K,
                           d_v + t0 * v_stride, v_stride, d_beta + r0, NULL, 1, lens[b], H, K, V, 0);
        cudaCheck(cudaMemcpy(dq[1] + r0 * K, gr[1].dq, (size_t)lens[b] * H * K * sizeof(floatX),
                             cudaMemcpyDeviceToDevice));
    }
    cudaCheck(cudaDeviceSynchronize());
    const int eq_f = same(o[0], o[1], nv * sizeof(floatX)) && same(Sf[0], Sf[1], nS * sizeof(float));
    const int eq_b = same(dq[0], dq[1], nq * sizeof(floatX)) && same(dk[0], dk[1], nq * sizeof(floatX)) &&
                     same(dv[0], dv[1], (size_t)T * v_stride * sizeof(floatX)) && same(db[0], db[1], TH * 4) &&
                     same(dg[0], dg[1], TH * 4) && same(dS0[0], dS0[1], nS * sizeof(float));
    double *oh = dalloc(nv); // and not trivially: the outputs are finite and not all zero
    down_x(oh, o[0], nv, V, V);
    double norm = 0.0;
    for (size_t i = 0; i < nv; i++) { norm += oh[i] * oh[i]; }
    char label[200], lens_s[120] = "";
    for (int b = 0; b < B; b++) {
        snprintf(lens_s + strlen(lens_s), sizeof(lens_s) - strlen(lens_s), "%s%d", b ? "," : "", lens[b]);
    }
    snprintf(label, sizeof(label), "%s packed (lengths %s) = each sequence alone", name, lens_s);
    test_result(eq_f && eq_b && isfinite(norm) && norm > 0, label,
                "forward (o, final states) %s, backward (dq dk dv dbeta dlog_alpha dS0) %s; H=%d K=%d V=%d",
                eq_f ? "bit for bit" : "DIFFER", eq_b ? "bit for bit" : "DIFFER", H, K, V);
    cudaCheck(cudaFree(mem));
    for (int r = 0; r < 2; r++) {
        void *dev[] = {o[r], dq[r], dk[r], dv[r], Sf[r], db[r], dg[r], dS0[r]};
        for (void *x : dev) { cudaCheck(cudaFree(x)); }
    }
    void *dev[] = {d_q, d_k, d_v, d_dout, d_beta, d_g, d_S0, d_dSf, d_cu};
    for (void *x : dev) { cudaCheck(cudaFree(x)); }
    double *host[] = {q, k, vw, beta, g, S0, dout, dSf, oh};
    for (double *x : host) { free(x); }
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        test_skip("GDN chunked kernels on the GPU", "no GPU (the CUDA runtime found no device)");
        return test_summary(SUITE);
    }
    run_case("GDN T=200 K=64 V=96 state", (Shape){2, 200, 2, 64, 96}, 1, 0.3, 1);
    run_case("GDN T=37 K=48 V=40", (Shape){2, 37, 3, 48, 40}, 0, 0.3, 1);
#if FLOATX_IS_FP32
    test_skip("GDN T=197 K=256 V=128 state", "K=256 needs more shared memory than fp32 tiles allow (bf16 build only)");
#else
    run_case("GDN T=197 K=256 V=128 state", (Shape){1, 197, 1, 256, 128}, 1, 0.1, 0);
#endif
    run_case("GDN T=130 K=128 V=64 strong decay", (Shape){2, 130, 2, 128, 64}, 1, 4.0, 0);
#if FLOATX_IS_FP32
    test_skip("GDN T=100 K=160 V=64", "K=160 needs more shared memory than fp32 tiles allow (bf16 build only)");
#else
    run_case("GDN T=100 K=160 V=64", (Shape){1, 100, 2, 160, 64}, 1, 0.3, 0); // three K tiles, the last one padded
#endif
    // four V tiles, the last one partial: the prep kernel's v tiles go through both of its staging areas twice
    run_case("GDN T=150 K=64 V=232 state", (Shape){1, 150, 2, 64, 232}, 1, 0.3, 0);
#if FLOATX_IS_FP32
    test_skip("GDN T=130 K=256 V=512", "K=256 needs more shared memory than fp32 tiles allow (bf16 build only)");
#else
    run_case("GDN T=130 K=256 V=512", (Shape){1, 130, 2, 256, 512}, 0, 0.3, 0); // the paper's 410M layer's shape
#endif
    // K padded to 128 (zero columns the bulk row copies never write), V over three tiles, the last one partial
    run_case("GDN T=130 K=112 V=160 state", (Shape){2, 130, 2, 112, 160}, 1, 0.3, 0);
    // rows that are not whole 16-byte pieces (K=34 in either build, V=20 in bf16): the state kernel's cp.async path
    // instead of its bulk row copies
    run_case("GDN T=77 K=34 V=20 state", (Shape){2, 77, 2, 34, 20}, 1, 0.3, 0);
#if !FLOATX_IS_FP32
    // K = 128 and 256 run the sm_90a state kernel (wgmma, tensor copies) on an H100 / H200: its packed sequences (a
    // last chunk's rows past the end hold the next sequence's tokens) and a V tile of 8 columns, then the mma.sync
    // state kernel on the same shapes
    printf("state and dstate kernels at K = 128, 256: %s\n", gpu_is_sm90() ? "sm_90a (wgmma, tensor copies)" : "mma.sync");
    run_packed("GDN K=128 V=72", 2, 128, 72, {100, 64, 0, 1, 129, 37});
    gdn_state_wgmma = 0;
    run_case("GDN T=130 K=128 V=64 strong decay, mma.sync serial kernels", (Shape){2, 130, 2, 128, 64}, 1, 4.0, 0);
    run_case("GDN T=197 K=256 V=128 state, mma.sync serial kernels", (Shape){1, 197, 1, 256, 128}, 1, 0.1, 0);
    gdn_state_wgmma = -1;
#endif
    run_packed("GDN K=64 V=96", 2, 64, 96, {100, 64, 0, 1, 129, 37});
    run_packed("GDN K=48 V=40", 3, 48, 40, {5, 200, 63, 65});
    return test_summary(SUITE);
}
