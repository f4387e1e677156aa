/*
test_decode_gpu.cu: the decode step's weight-streaming product (common.cuh: matmul_gemv, for at most GEMV_MAX_M rows)
against a float64 product of the same bf16 (or fp32) inputs, as normwise relative errors, on shapes that cover every
row count, output counts that are not a multiple of a block's rows, and strided outputs; with more rows, the decode
dispatch the same way (5..64 rows and outputs not a multiple of 8: the skinny tensor-core product, split K summed
through a cluster's shared memory; else cuBLASLt, the outputs past a multiple of 8 as a second product). Each case
also runs through matmul_forward_strided with rt.decode_step set (the dispatch the decode step takes), launched
programmatically (launch_pdl, cuda_common.h) as a chain of products that feed each other, against the same chain
launched the ordinary way: bit for bit, and twice the same bits (no atomics). The SwiGLU form (matmul_gemv_glu) is
held to the plain product of the 2F rows followed by the pointwise kernel, bit for bit, and the M²RNN step's fused conv
+ decay gate (m2rnn_step_prep) to the conv step and the gate kernels: activations, gates and windows bit for bit, and
the same work in the in-projection's epilogue (M2RNNStepEpilogue) to the product followed by that kernel; and
a product with the residual RMSNorm in its prologue (step_product, step_product_glu) to rmsnorm_forward + the GEMV,
a kind's branch product split along K at 5..64 rows (step_branch_product) against float64 and the norm that adds its
partial sums to rmsnorm_forward of their rounded sum, the M²RNN step kernel with the output gate in its epilogue to
the step kernel and the gate kernel,
and the M²RNN step's output gate and mixer norm in the out-projection's prologue (GemvNorm's gate) to
output_gate_forward + rmsnorm_forward + the GEMV; the GDN step's conv, q/k L2 norms and gates in one kernel
(gdn_step_prep) to the four kernels; the GEMV with its weights staged in shared memory before the dependency wait to
the same GEMV streaming them (gemv_stage), in each of its forms.
Without a GPU it prints a SKIP line and exits 0.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "utils.h"
#include "model.h"
#include "layers.h"
#include "common.cuh"
#include "swiglu.cuh"
#include "m2rnn.cuh"
#include "gate.cuh"
#include "gdn.cuh"
#include "attention.cuh"
#include "test/test_common.h"

#if FLOATX_IS_FP32
#define SUITE "test_decode_gpu_fp32"
#define TOL 1e-5
#else
#define SUITE "test_decode_gpu"
#define TOL 4e-3 // the output rounded to bf16 (2^-9 relative at most; measured 1.6e-3 normwise)
#endif

static float frand(uint64_t *s) { // uniform in [-1, 1)
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) / 8388608.0 - 1.0);
}
static floatX *upload(const floatX *h, size_t n) {
    floatX *d;
    cudaCheck(cudaMalloc(&d, n * sizeof(floatX)));
    cudaCheck(cudaMemcpy(d, h, n * sizeof(floatX), cudaMemcpyHostToDevice));
    return d;
}
static void download(floatX *h, const floatX *d, size_t n) {
    cudaCheck(cudaMemcpy(h, d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
}
// the bytes of each pair of device buffers (a, b) equal, sizes[k] bytes each (0: skipped)
static bool same_device_bytes(const void *const (*pairs)[2], const size_t *sizes, int count) {
    bool same = true;
    for (int k = 0; k < count && same; k++) {
        if (sizes[k] == 0) { continue; }
        char *a = (char *)mallocCheck(sizes[k]), *b = (char *)mallocCheck(sizes[k]);
        cudaCheck(cudaMemcpy(a, pairs[k][0], sizes[k], cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(b, pairs[k][1], sizes[k], cudaMemcpyDeviceToHost));
        same = memcmp(a, b, sizes[k]) == 0;
        free(a); free(b);
    }
    return same;
}

// out (M, OC) with row stride S from a direct kernel call, against float64; then a chain of three products through
// the decode dispatch (x → y = x Wᵀ (OC) → z = y W2ᵀ (IC) → y again), programmatic and not, bit for bit
// the normwise relative error of y (M rows of OC, ystride apart) against the float64 product x (M, IC) @ w (OC, IC)ᵀ
// of the same inputs; *finite cleared where y holds a NaN or an infinity
static double product_err(const floatX *y, int ystride, const floatX *x, const floatX *w, int M, int IC, int OC,
                          bool *finite) {
    double num = 0.0, den = 0.0;
    for (int m = 0; m < M; m++) {
        for (int o = 0; o < OC; o++) {
            double want = 0.0;
            for (int k = 0; k < IC; k++) { want += (double)(float)x[(size_t)m * IC + k] * (double)(float)w[(size_t)o * IC + k]; }
            const double got = (double)(float)y[(size_t)m * ystride + o];
            *finite = *finite && isfinite(got);
            num += (got - want) * (got - want);
            den += want * want;
        }
    }
    return sqrt(num / (den > 0 ? den : 1.0));
}

static void run_case(Runtime *rt, int M, int IC, int OC, int S) {
    char name[96];
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ ((uint64_t)M << 32) ^ ((uint64_t)IC << 16) ^ (uint64_t)OC;
    const size_t nx = (size_t)M * IC, nw = (size_t)OC * IC, ny = (size_t)M * S;
    floatX *hx = (floatX *)mallocCheck(nx * sizeof(floatX)), *hw = (floatX *)mallocCheck(nw * sizeof(floatX));
    floatX *hw2 = (floatX *)mallocCheck(nw * sizeof(floatX)), *hy = (floatX *)mallocCheck(ny * sizeof(floatX));
    for (size_t i = 0; i < nx; i++) { hx[i] = (floatX)frand(&seed); }
    for (size_t i = 0; i < nw; i++) { hw[i] = (floatX)(frand(&seed) / sqrtf((float)IC)); }
    for (size_t i = 0; i < nw; i++) { hw2[i] = (floatX)(frand(&seed) / sqrtf((float)OC)); }
    floatX *dx = upload(hx, nx), *dw = upload(hw, nw), *dw2 = upload(hw2, nw), *dy;
    cudaCheck(cudaMalloc(&dy, ny * sizeof(floatX)));
    cudaCheck(cudaMemset(dy, 0xff, ny * sizeof(floatX))); // NaN: a missed element shows
    // up to GEMV_MAX_M rows the GEMV itself; more: the decode dispatch (cuBLASLt: the outputs up to a multiple of 8,
    // then the few left)
    bool ok_launch = true;
    const char *kind = M <= GEMV_MAX_M ? "gemv" : "decode product";
    if (M <= GEMV_MAX_M) {
        ok_launch = matmul_gemv(dy, S, dx, dw, M, IC, OC, rt->stream);
    } else {
        rt->decode_step = 1;
        matmul_forward_strided(dy, S, dx, dw, M, IC, OC, rt);
        rt->decode_step = 0;
    }
    snprintf(name, sizeof(name), "%s M=%d IC=%d OC=%d stride %d", kind, M, IC, OC, S);
    if (!ok_launch) {
        test_result(0, name, "the kernel refused the shape");
    } else {
        cudaCheck(cudaDeviceSynchronize());
        download(hy, dy, ny);
        bool finite = true;
        const double err = product_err(hy, S, hx, hw, M, IC, OC, &finite);
        test_result(finite && err < TOL, name, "rel err %.2e (tol %.0e)%s", err, TOL, finite ? "" : " NON-FINITE");
    }
    // the chain through the decode dispatch
    floatX *dz, *dy2, *out[2][2];
    cudaCheck(cudaMalloc(&dz, (size_t)M * IC * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dy2, (size_t)M * OC * sizeof(floatX)));
    floatX *hc = (floatX *)mallocCheck((size_t)M * OC * sizeof(floatX) * 4);
    for (int pdl = 0; pdl < 2; pdl++) {
        for (int rep = 0; rep < 2; rep++) {
            rt->decode_step = 1;
            launch_pdl = pdl;
            matmul_forward_strided(dy, OC, dx, dw, M, IC, OC, rt);
            matmul_forward_strided(dz, IC, dy, dw2, M, OC, IC, rt);
            matmul_forward_strided(dy2, OC, dz, dw, M, IC, OC, rt);
            launch_pdl = 0;
            rt->decode_step = 0;
            cudaCheck(cudaStreamSynchronize(rt->stream));
            out[pdl][rep] = hc + (size_t)(2 * pdl + rep) * M * OC;
            download(out[pdl][rep], dy2, (size_t)M * OC);
        }
    }
    const size_t bytes = (size_t)M * OC * sizeof(floatX);
    const bool same = memcmp(out[0][0], out[0][1], bytes) == 0 && memcmp(out[1][0], out[1][1], bytes) == 0 &&
                      memcmp(out[0][0], out[1][0], bytes) == 0;
    snprintf(name, sizeof(name), "chain of 3 M=%d IC=%d OC=%d", M, IC, OC);
    test_result(same, name, "programmatic = ordinary launches, twice: %s", same ? "bit for bit" : "DIFFER");
    free(hx); free(hw); free(hw2); free(hy); free(hc);
    cudaCheck(cudaFree(dx)); cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(dw2)); cudaCheck(cudaFree(dy));
    cudaCheck(cudaFree(dz)); cudaCheck(cudaFree(dy2));
}

// The one-row GEMV with its weight rows staged in shared memory before the dependency wait (gemv_stage) = the same
// GEMV streaming them from L2 after it, bit for bit. kind 0: the plain product (1 and 2 rows a warp), 1: the SwiGLU form,
// 2: the residual norm (+ branch) in the prologue, 3: the M²RNN output gate + norm in the prologue.
static void run_stage_case(Runtime *rt, int M, int IC, int OC, int kind) {
    char name[96];
    static const char *kinds[4] = {"plain", "SwiGLU", "norm + branch", "gate + norm"};
    snprintf(name, sizeof(name), "gemv weights staged = streamed, %s M=%d IC=%d OC=%d", kinds[kind], M, IC, OC);
    if (kind >= 2 && !rmsnorm_row_packs_ok(IC)) {
        test_skip(name, "rows too long for the one-warp norm at this precision");
        return;
    }
    uint64_t seed = 0x9e10ad ^ ((uint64_t)IC << 20) ^ ((uint64_t)OC << 4) ^ (uint64_t)(kind + 8 * M);
    const int NS = kind == 1 ? 2 : 1;
    const size_t nw = (size_t)NS * OC * IC, nx = (size_t)M * IC;
    floatX *hw = (floatX *)mallocCheck(nw * sizeof(floatX)), *hx = (floatX *)mallocCheck(4 * nx * sizeof(floatX));
    for (size_t i = 0; i < nw; i++) { hw[i] = (floatX)(frand(&seed) / sqrtf((float)IC)); }
    for (size_t i = 0; i < 4 * nx; i++) { hx[i] = (floatX)(1.0f + frand(&seed)); } // x, branch / v, g, D and w
    floatX *dw = upload(hw, nw), *dx = upload(hx, 4 * nx), *out[2], *xo[2];
    float *rs[2];
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaMalloc(&out[i], (size_t)M * OC * sizeof(floatX)));
        cudaCheck(cudaMalloc(&xo[i], nx * sizeof(floatX)));
        cudaCheck(cudaMalloc(&rs[i], (size_t)M * sizeof(float)));
    }
    bool ok = true;
    long staged[2] = {0, 0}; // launches that staged, with gemv_stage 0 (none may) and 1 (as gemv_stages says)
    bool want = false;
    for (int st = 0; st < 2; st++) {
        gemv_stage = st;
        if (st) { want = gemv_stages(M, IC, OC, kind == 1, kind >= 2); }
        const long before = gemv_staged_launches;
        const floatX *x = dx, *a = dx + nx, *b = dx + 2 * nx, *c = dx + 3 * nx;
        const GemvNorm nb = {x, a, c, xo[st], rs[st], NULL, NULL, NULL, 0, 0};
        const GemvNorm ng = {x, NULL, c, NULL, rs[st], a, b, c, IC, IC};
        if (kind == 1) {
            ok = ok && matmul_gemv_glu(out[st], x, dw, M, IC, OC, rt->stream);
        } else {
            ok = ok && matmul_gemv_launch<false>(out[st], OC, x, dw, M, IC, OC, kind == 2 ? &nb : kind == 3 ? &ng : NULL,
                                                 rt->stream);
        }
        staged[st] = gemv_staged_launches - before;
    }
    gemv_stage = -1; // (the environment's choice again)
    cudaCheck(cudaStreamSynchronize(rt->stream));
    const size_t sizes[3] = {(size_t)M * OC * sizeof(floatX), kind == 2 ? nx * sizeof(floatX) : 0,
                             kind >= 2 ? (size_t)M * sizeof(float) : 0};
    const void *const bufs[3][2] = {{out[0], out[1]}, {xo[0], xo[1]}, {rs[0], rs[1]}};
    const bool same = ok && same_device_bytes(bufs, sizes, 3);
    // the launches took the path gemv_stages names (on an H100 or H200 in bf16 every case here stages), and the
    // shapes of 77 outputs (5 blocks of a few KB) stage on any GPU at either precision: a case cannot pass by
    // streaming twice without the test saying so
    const bool path_ok = staged[0] == 0 && staged[1] == (long)want && (OC > 80 || want);
    test_result(same && path_ok, name, "%s (%s)", !ok ? "REFUSED" : same ? "bit for bit" : "DIFFER",
                !path_ok ? "WRONG PATH" : want ? "staged" : "not staged here: both streamed");
    free(hw); free(hx);
    cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(dx));
    for (int i = 0; i < 2; i++) { cudaCheck(cudaFree(out[i])); cudaCheck(cudaFree(xo[i])); cudaCheck(cudaFree(rs[i])); }
}

// The streamed GEMV of very many outputs (the LM head: matmul_gemv_stream) = the plain GEMV (gemv_stream 0), bit for
// bit, at a ragged output count (the last 16-row group partial), its rows out_stride apart; and it took the path
static void run_stream_case(Runtime *rt, int M, int IC, int OC) {
    char name[96];
    snprintf(name, sizeof(name), "gemv streamed = plain, M=%d IC=%d OC=%d", M, IC, OC);
    if (gemv_stream_bytes(M, IC) > 110 * 1024) {
        test_skip(name, "its stages do not fit in 110 KB at this precision");
        return;
    }
    uint64_t seed = 0x57ea ^ ((uint64_t)M << 40) ^ ((uint64_t)IC << 20) ^ (uint64_t)OC;
    const size_t nw = (size_t)OC * IC, nx = (size_t)M * IC, S = (size_t)OC + 8;
    floatX *hw = (floatX *)mallocCheck(nw * sizeof(floatX)), *hx = (floatX *)mallocCheck(nx * sizeof(floatX));
    for (size_t i = 0; i < nw; i++) { hw[i] = (floatX)(frand(&seed) / sqrtf((float)IC)); }
    for (size_t i = 0; i < nx; i++) { hx[i] = (floatX)frand(&seed); }
    floatX *dw = upload(hw, nw), *dx = upload(hx, nx), *out[2];
    long took[2] = {0, 0};
    bool ok = true;
    for (int st = 0; st < 2; st++) {
        cudaCheck(cudaMalloc(&out[st], (size_t)M * S * sizeof(floatX)));
        cudaCheck(cudaMemset(out[st], 0, (size_t)M * S * sizeof(floatX)));
        gemv_stream = st;
        const long before = gemv_stream_launches;
        ok = ok && matmul_gemv(out[st], (int)S, dx, dw, M, IC, OC, rt->stream);
        took[st] = gemv_stream_launches - before;
    }
    gemv_stream = -1; // (the environment's choice again)
    cudaCheck(cudaStreamSynchronize(rt->stream));
    const void *const bufs[1][2] = {{out[0], out[1]}};
    const size_t sizes[1] = {(size_t)M * S * sizeof(floatX)};
    const bool same = ok && same_device_bytes(bufs, sizes, 1), path = took[0] == 0 && took[1] == 1;
    floatX *hy = (floatX *)mallocCheck((size_t)M * S * sizeof(floatX));
    download(hy, out[1], (size_t)M * S);
    bool finite = true;
    const double err = product_err(hy, (int)S, hx, hw, M, IC, OC, &finite);
    test_result(same && path && finite && err < TOL, name, "%s, rel err %.2e against float64 (tol %.0e)%s",
                !ok ? "REFUSED" : same ? "bit for bit" : "DIFFER", err, TOL, path ? "" : " WRONG PATH");
    free(hw); free(hx); free(hy);
    cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(dx));
    for (int i = 0; i < 2; i++) { cudaCheck(cudaFree(out[i])); }
}

// h = SiLU(x W_gateᵀ) ⊙ (x W_upᵀ) in one kernel = the product of all 2F rows then swiglu_pointwise_forward
static void run_glu_case(Runtime *rt, int M, int IC, int F) {
    char name[96];
    uint64_t seed = 0x51f15eedull ^ ((uint64_t)M << 24) ^ ((uint64_t)IC << 8) ^ (uint64_t)F;
    const size_t nx = (size_t)M * IC, nw = (size_t)2 * F * IC;
    floatX *hx = (floatX *)mallocCheck(nx * sizeof(floatX)), *hw = (floatX *)mallocCheck(nw * sizeof(floatX));
    for (size_t i = 0; i < nx; i++) { hx[i] = (floatX)frand(&seed); }
    for (size_t i = 0; i < nw; i++) { hw[i] = (floatX)(2.0f * frand(&seed) / sqrtf((float)IC)); }
    floatX *dx = upload(hx, nx), *dw = upload(hw, nw), *dup, *dh[2];
    cudaCheck(cudaMalloc(&dup, (size_t)M * 2 * F * sizeof(floatX)));
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaMalloc(&dh[i], (size_t)M * F * sizeof(floatX)));
        cudaCheck(cudaMemset(dh[i], 0xff, (size_t)M * F * sizeof(floatX)));
    }
    const bool ok = matmul_gemv_glu(dh[0], dx, dw, M, IC, F, rt->stream) &&
                    matmul_gemv(dup, 2 * F, dx, dw, M, IC, 2 * F, rt->stream);
    swiglu_pointwise_forward(dh[1], dup, M, F, rt->stream);
    cudaCheck(cudaStreamSynchronize(rt->stream));
    floatX *h0 = (floatX *)mallocCheck((size_t)M * F * sizeof(floatX)), *h1 = (floatX *)mallocCheck((size_t)M * F * sizeof(floatX));
    download(h0, dh[0], (size_t)M * F);
    download(h1, dh[1], (size_t)M * F);
    const bool same = ok && memcmp(h0, h1, (size_t)M * F * sizeof(floatX)) == 0;
    snprintf(name, sizeof(name), "gemv SwiGLU M=%d IC=%d F=%d", M, IC, F);
    test_result(same, name, "= product + pointwise kernel: %s", !ok ? "REFUSED" : same ? "bit for bit" : "DIFFER");
    free(hx); free(hw); free(h0); free(h1);
    cudaCheck(cudaFree(dx)); cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(dup));
    cudaCheck(cudaFree(dh[0])); cudaCheck(cudaFree(dh[1]));
}

// the M²RNN step's conv + decay gate in one kernel = conv1d_silu_step then decay_gate_forward
static void run_prep_case(Runtime *rt, int B, int CD, int N, int W) {
    char name[96];
    uint64_t seed = 0xc0ffee ^ ((uint64_t)B << 32) ^ ((uint64_t)CD << 8) ^ (uint64_t)N;
    const int Rs = CD + N + 8;
    const long stride = (long)(W - 1) * CD + 16; // a sequence's window, then room (as a decode state has its H)
    floatX *hp = (floatX *)mallocCheck((size_t)B * Rs * sizeof(floatX)), *hw = (floatX *)mallocCheck((size_t)CD * W * sizeof(floatX));
    float *hs = (float *)mallocCheck((size_t)B * stride * sizeof(float)), *ha = (float *)mallocCheck(2 * (size_t)N * sizeof(float));
    for (size_t i = 0; i < (size_t)B * Rs; i++) { hp[i] = (floatX)(3.0f * frand(&seed)); }
    for (size_t i = 0; i < (size_t)CD * W; i++) { hw[i] = (floatX)frand(&seed); }
    for (size_t i = 0; i < (size_t)B * stride; i++) { hs[i] = (float)(floatX)frand(&seed); }
    for (int i = 0; i < 2 * N; i++) { ha[i] = frand(&seed); }
    floatX *dp = upload(hp, (size_t)B * Rs), *dw = upload(hw, (size_t)CD * W), *act[2];
    float *win[2], *f[2], *dA;
    cudaCheck(cudaMalloc(&dA, 2 * (size_t)N * sizeof(float)));
    cudaCheck(cudaMemcpy(dA, ha, 2 * (size_t)N * sizeof(float), cudaMemcpyHostToDevice));
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaMalloc(&act[i], (size_t)B * CD * sizeof(floatX)));
        cudaCheck(cudaMalloc(&f[i], (size_t)B * N * sizeof(float)));
        cudaCheck(cudaMalloc(&win[i], (size_t)B * stride * sizeof(float)));
        cudaCheck(cudaMemcpy(win[i], hs, (size_t)B * stride * sizeof(float), cudaMemcpyHostToDevice));
    }
    conv1d_silu_step(act[0], win[0], stride, dp, dw, NULL, B, CD, W, Rs, rt->stream);
    decay_gate_forward(f[0], dp + CD, dA, dA + N, B, N, Rs, rt->stream);
    m2rnn_step_prep(act[1], win[1], stride, f[1], dp, dw, dA, dA + N, B, CD, W, N, Rs, rt->stream);
    cudaCheck(cudaStreamSynchronize(rt->stream));
    const size_t sizes[3] = {(size_t)B * CD * sizeof(floatX), (size_t)B * N * sizeof(float), (size_t)B * stride * sizeof(float)};
    const void *const bufs[3][2] = {{act[0], act[1]}, {f[0], f[1]}, {win[0], win[1]}};
    const bool same = same_device_bytes(bufs, sizes, 3);
    snprintf(name, sizeof(name), "M2RNN step prep B=%d CD=%d N=%d W=%d", B, CD, N, W);
    test_result(same, name, "= conv step + decay gate kernels: %s", same ? "bit for bit" : "DIFFER");
    free(hp); free(hw); free(hs); free(ha);
    cudaCheck(cudaFree(dp)); cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(dA));
    for (int i = 0; i < 2; i++) { cudaCheck(cudaFree(act[i])); cudaCheck(cudaFree(f[i])); cudaCheck(cudaFree(win[i])); }
}

// the M²RNN step's conv + decay gate in the in-projection's epilogue (step_product with M2RNNStepEpilogue) = the
// product with the norm in its prologue, then m2rnn_step_prep: the projection, activations, gates, windows, x + branch
// and the 1/rms bit for bit (R = CD + N + G rows, G of them past the gates, as the output gate's inputs are)
static void run_conv_epi_case(Runtime *rt, int B, int C, int CD, int N, int G, int W) {
    char name[96];
    uint64_t seed = 0xe9105 ^ ((uint64_t)B << 32) ^ ((uint64_t)CD << 8) ^ (uint64_t)N;
    const int R = CD + N + G, Rs = (R + 7) / 8 * 8;
    const long stride = (long)(W - 1) * CD + 16; // a sequence's window, then room (as a decode state has its H)
    const size_t nx = (size_t)B * C, nw = (size_t)R * C;
    floatX *hx = (floatX *)mallocCheck(nx * sizeof(floatX)), *hb = (floatX *)mallocCheck(nx * sizeof(floatX));
    floatX *hw = (floatX *)mallocCheck(nw * sizeof(floatX)), *hn = (floatX *)mallocCheck((size_t)C * sizeof(floatX));
    floatX *hc = (floatX *)mallocCheck((size_t)CD * W * sizeof(floatX));
    float *hs = (float *)mallocCheck((size_t)B * stride * sizeof(float)), *ha = (float *)mallocCheck(2 * (size_t)N * sizeof(float));
    for (size_t i = 0; i < nx; i++) { hx[i] = (floatX)(2.0f * frand(&seed)); hb[i] = (floatX)frand(&seed); }
    for (size_t i = 0; i < nw; i++) { hw[i] = (floatX)(2.0f * frand(&seed) / sqrtf((float)C)); }
    for (int i = 0; i < C; i++) { hn[i] = (floatX)(1.0f + 0.5f * frand(&seed)); }
    for (size_t i = 0; i < (size_t)CD * W; i++) { hc[i] = (floatX)frand(&seed); }
    for (size_t i = 0; i < (size_t)B * stride; i++) { hs[i] = (float)(floatX)frand(&seed); }
    for (int i = 0; i < 2 * N; i++) { ha[i] = frand(&seed); }
    floatX *dx = upload(hx, nx), *db = upload(hb, nx), *dw = upload(hw, nw), *dn = upload(hn, (size_t)C);
    floatX *dc = upload(hc, (size_t)CD * W), *proj[2], *act[2], *xo[2], *rows;
    float *win[2], *f[2], *rs[2], *dA;
    cudaCheck(cudaMalloc(&dA, 2 * (size_t)N * sizeof(float)));
    cudaCheck(cudaMemcpy(dA, ha, 2 * (size_t)N * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMalloc(&rows, nx * sizeof(floatX)));
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaMalloc(&proj[i], (size_t)B * Rs * sizeof(floatX)));
        cudaCheck(cudaMemset(proj[i], 0, (size_t)B * Rs * sizeof(floatX)));
        cudaCheck(cudaMalloc(&act[i], (size_t)B * CD * sizeof(floatX)));
        cudaCheck(cudaMalloc(&f[i], (size_t)B * N * sizeof(float)));
        cudaCheck(cudaMalloc(&xo[i], nx * sizeof(floatX)));
        cudaCheck(cudaMalloc(&rs[i], (size_t)B * sizeof(float)));
        cudaCheck(cudaMalloc(&win[i], (size_t)B * stride * sizeof(float)));
        cudaCheck(cudaMemcpy(win[i], hs, (size_t)B * stride * sizeof(float), cudaMemcpyHostToDevice));
    }
    rt->decode_step = 1;
    bool fused = false;
    for (int i = 0; i < 2; i++) { // 0: the product, then m2rnn_step_prep; 1: the epilogue
        StepInput in = {rows, dx, db, dn, xo[i], rs[i], 0};
        const M2RNNStepEpilogue epi = {act[i], win[i], stride, dc, f[i], dA, dA + N, CD, W, N};
        if (i == 0) {
            step_product(proj[0], Rs, &in, dw, B, C, R, rt);
            m2rnn_step_prep(act[0], win[0], stride, f[0], proj[0], dc, dA, dA + N, B, CD, W, N, Rs, rt->stream);
        } else {
            fused = step_product(proj[1], Rs, &in, dw, B, C, R, rt, &epi);
        }
    }
    rt->decode_step = 0;
    cudaCheck(cudaStreamSynchronize(rt->stream));
    const size_t sizes[6] = {(size_t)B * Rs * sizeof(floatX), (size_t)B * CD * sizeof(floatX), (size_t)B * N * sizeof(float),
                             (size_t)B * stride * sizeof(float), nx * sizeof(floatX), (size_t)B * sizeof(float)};
    const void *const bufs[6][2] = {{proj[0], proj[1]}, {act[0], act[1]}, {f[0], f[1]},
                                    {win[0], win[1]}, {xo[0], xo[1]}, {rs[0], rs[1]}};
    const bool same = fused && same_device_bytes(bufs, sizes, 6);
    snprintf(name, sizeof(name), "M2RNN conv + gate in the product B=%d CD=%d N=%d W=%d", B, CD, N, W);
    test_result(same, name, "= product + step prep kernel (projection, conv, gates, windows, norm): %s",
                !fused ? "NOT FUSED" : same ? "bit for bit" : "DIFFER");
    free(hx); free(hb); free(hw); free(hn); free(hc); free(hs); free(ha);
    for (floatX *p : {dx, db, dw, dn, dc, rows, proj[0], proj[1], act[0], act[1], xo[0], xo[1]}) { cudaCheck(cudaFree(p)); }
    for (float *p : {win[0], win[1], f[0], f[1], rs[0], rs[1], dA}) { cudaCheck(cudaFree(p)); }
}

// a product of the rows RMSNorm(x + branch) . w with the norm in the GEMV's prologue (step_product, a decode step) =
// rmsnorm_forward then the GEMV: the output, x + branch and the 1/rms, bit for bit; and the SwiGLU form likewise.
// with_branch 2: no branch, x the embedding of M tokens (StepInput.tokens: the prologue reads the table's rows and
// stores them) = embedding_forward then rmsnorm_forward then the GEMV, the stored rows too
static void run_norm_case(Runtime *rt, int M, int C, int OC, int with_branch) {
    char name[96];
    uint64_t seed = 0x4e0e ^ ((uint64_t)M << 24) ^ ((uint64_t)C << 8) ^ (uint64_t)OC;
    const int emb = with_branch == 2, V = M + 5; // (emb: a table of V rows)
    const size_t nx = (size_t)M * C, nw = (size_t)2 * OC * C, nt = emb ? (size_t)V * C : nx;
    floatX *hx = (floatX *)mallocCheck(nt * sizeof(floatX)), *hb = (floatX *)mallocCheck(nt * sizeof(floatX));
    floatX *hw = (floatX *)mallocCheck(nw * sizeof(floatX)), *hn = (floatX *)mallocCheck((size_t)C * sizeof(floatX));
    for (size_t i = 0; i < nt; i++) { hx[i] = (floatX)(2.0f * frand(&seed)); hb[i] = (floatX)frand(&seed); }
    for (size_t i = 0; i < nw; i++) { hw[i] = (floatX)(frand(&seed) / sqrtf((float)C)); }
    for (int i = 0; i < C; i++) { hn[i] = (floatX)(1.0f + 0.5f * frand(&seed)); }
    floatX *dx = upload(hx, nt), *db = upload(hb, nt), *dw = upload(hw, nw), *dn = upload(hn, (size_t)C);
    const int htok[4] = {V - 1, 2, 0, V - 3};
    int *dtok = NULL;
    cudaCheck(cudaMalloc(&dtok, sizeof(htok)));
    cudaCheck(cudaMemcpy(dtok, htok, sizeof(htok), cudaMemcpyHostToDevice));
    floatX *out[2][2], *xo[2], *rows;
    float *rs[2];
    cudaCheck(cudaMalloc(&rows, nx * sizeof(floatX)));
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 2; k++) { cudaCheck(cudaMalloc(&out[i][k], (size_t)M * OC * sizeof(floatX))); }
        cudaCheck(cudaMalloc(&xo[i], nx * sizeof(floatX)));
        cudaCheck(cudaMalloc(&rs[i], (size_t)M * sizeof(float)));
        cudaCheck(cudaMemset(xo[i], 0, nx * sizeof(floatX)));
    }
    rt->decode_step = 1;
    for (int fused = 0; fused < 2; fused++) { // fused = 0: the rows made first (ready), then the plain kernels
        StepInput in = {rows, dx, with_branch == 1 ? db : NULL, dn, xo[fused], rs[fused], 0};
        in.tokens = emb ? dtok : NULL;
        if (!fused) { step_input_rows(&in, M, C, rt->stream); }
        step_product(out[fused][0], OC, &in, dw, M, C, OC, rt);
        StepInput in2 = in;
        if (!step_product_glu(out[fused][1], &in2, dw, M, C, OC, rt)) { printf("     (GLU refused)\n"); }
    }
    rt->decode_step = 0;
    cudaCheck(cudaStreamSynchronize(rt->stream));
    const size_t so = (size_t)M * OC * sizeof(floatX);
    const void *const pairs[4][2] = {{out[0][0], out[1][0]}, {out[0][1], out[1][1]}, {xo[0], xo[1]}, {rs[0], rs[1]}};
    const size_t sizes[4] = {so, so, with_branch ? nx * sizeof(floatX) : 0, (size_t)M * sizeof(float)};
    bool same = same_device_bytes(pairs, sizes, 4);
    if (emb) { // the stored rows are the table's
        floatX *got = (floatX *)mallocCheck(nx * sizeof(floatX));
        download(got, xo[1], nx);
        for (int m = 0; m < M; m++) { same &= memcmp(got + (size_t)m * C, hx + (size_t)htok[m] * C, C * sizeof(floatX)) == 0; }
        free(got);
    }
    snprintf(name, sizeof(name), "norm in the product M=%d C=%d OC=%d%s", M, C, OC,
             emb ? " embedding" : with_branch ? " +branch" : "");
    test_result(same, name, "= RMSNorm kernel + GEMV (and SwiGLU form), x + branch, 1/rms: %s",
                same ? "bit for bit" : "DIFFER");
    free(hx); free(hb); free(hw); free(hn);
    cudaCheck(cudaFree(dx)); cudaCheck(cudaFree(db)); cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(dn));
    cudaCheck(cudaFree(rows)); cudaCheck(cudaFree(dtok));
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 2; k++) { cudaCheck(cudaFree(out[i][k])); }
        cudaCheck(cudaFree(xo[i])); cudaCheck(cudaFree(rs[i]));
    }
}

// A kind's branch product (step_branch_product) at 5..64 rows: split along K into partial sums (one cuBLASLt launch),
// which the next norm adds (step_input_rows with the parts). Their sum, rounded, against a float64 product; the norm
// from the parts = rmsnorm_forward from that rounded sum, bit for bit (rows, x + branch, 1/rms). Elsewhere (≤ 4 rows,
// more than 64, the fp32 build) the product itself, against float64.
static void run_branch_parts_case(Runtime *rt, int M, int IC, int C) {
    char name[96];
    uint64_t seed = 0xb4a9c ^ ((uint64_t)M << 24) ^ ((uint64_t)IC << 8) ^ (uint64_t)C;
    const size_t nin = (size_t)M * IC, nw = (size_t)C * IC, nx = (size_t)M * C;
    floatX *hin = (floatX *)mallocCheck(nin * sizeof(floatX)), *hw = (floatX *)mallocCheck(nw * sizeof(floatX));
    floatX *hx = (floatX *)mallocCheck(nx * sizeof(floatX)), *hn = (floatX *)mallocCheck((size_t)C * sizeof(floatX));
    floatX *hb = (floatX *)mallocCheck(nx * sizeof(floatX));
    float *hp = (float *)mallocCheck((size_t)STEP_MAX_PARTS * nx * sizeof(float));
    for (size_t i = 0; i < nin; i++) { hin[i] = (floatX)frand(&seed); }
    for (size_t i = 0; i < nw; i++) { hw[i] = (floatX)(frand(&seed) / sqrtf((float)IC)); }
    for (size_t i = 0; i < nx; i++) { hx[i] = (floatX)(2.0f * frand(&seed)); }
    for (int i = 0; i < C; i++) { hn[i] = (floatX)(1.0f + 0.5f * frand(&seed)); }
    floatX *din = upload(hin, nin), *dw = upload(hw, nw), *dx = upload(hx, nx), *dn = upload(hn, (size_t)C);
    floatX *dout, *db, *rows[2], *xo[2];
    float *dparts, *rs[2];
    cudaCheck(cudaMalloc(&dout, nx * sizeof(floatX)));
    cudaCheck(cudaMemset(dout, 0xff, nx * sizeof(floatX))); // NaN: a missed element shows
    cudaCheck(cudaMalloc(&db, nx * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dparts, (size_t)STEP_MAX_PARTS * nx * sizeof(float)));
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaMalloc(&rows[i], nx * sizeof(floatX)));
        cudaCheck(cudaMalloc(&xo[i], nx * sizeof(floatX)));
        cudaCheck(cudaMalloc(&rs[i], (size_t)M * sizeof(float)));
    }
    StepInput in = {NULL, NULL, NULL, NULL, NULL, NULL, 1, dparts, 0, -1};
    rt->decode_step = 1;
    step_branch_product(dout, &in, din, dw, M, IC, C, rt);
    rt->decode_step = 0;
    const int S = in.out_nparts;
    cudaCheck(cudaDeviceSynchronize());
    if (S > 0) { // the rounded sum of the parts, in order, as the norm forms it
        cudaCheck(cudaMemcpy(hp, dparts, (size_t)S * nx * sizeof(float), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < nx; i++) {
            float v = hp[i];
            for (int sp = 1; sp < S; sp++) { v += hp[(size_t)sp * nx + i]; }
            hb[i] = (floatX)v;
        }
    } else {
        download(hb, dout, nx);
    }
    bool finite = true;
    const double err = product_err(hb, C, hin, hw, M, IC, C, &finite);
    snprintf(name, sizeof(name), "branch product M=%d IC=%d C=%d", M, IC, C);
    test_result(finite && err < TOL && S >= 0, name, "%s: rel err %.2e (tol %.0e)%s",
                S > 0 ? "partial sums" : "the product", err, TOL, finite ? "" : " NON-FINITE");
    if (S > 0) {
        cudaCheck(cudaMemcpy(db, hb, nx * sizeof(floatX), cudaMemcpyHostToDevice));
        StepInput a = {rows[0], dx, NULL, dn, xo[0], rs[0], 0, dparts, S, 0};
        step_input_rows(&a, M, C, rt->stream);
        rmsnorm_forward(rows[1], rs[1], xo[1], dx, db, dn, M, C, rt->stream);
        cudaCheck(cudaStreamSynchronize(rt->stream));
        const void *const pairs[3][2] = {{rows[0], rows[1]}, {xo[0], xo[1]}, {rs[0], rs[1]}};
        const size_t sizes[3] = {nx * sizeof(floatX), nx * sizeof(floatX), (size_t)M * sizeof(float)};
        const bool same = same_device_bytes(pairs, sizes, 3);
        snprintf(name, sizeof(name), "norm from %d partial sums M=%d C=%d", S, M, C);
        test_result(same, name, "= RMSNorm kernel of their rounded sum (rows, x + branch, 1/rms): %s",
                    same ? "bit for bit" : "DIFFER");
    }
    free(hin); free(hw); free(hx); free(hn); free(hb); free(hp);
    cudaCheck(cudaFree(din)); cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(dx)); cudaCheck(cudaFree(dn));
    cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(db)); cudaCheck(cudaFree(dparts));
    for (int i = 0; i < 2; i++) { cudaCheck(cudaFree(rows[i])); cudaCheck(cudaFree(xo[i])); cudaCheck(cudaFree(rs[i])); }
}

#if !FLOATX_IS_FP32
// The M²RNN step kernel with the output gate in its epilogue (M2RNNGateEpilogue, above GEMV_MAX_M sequences) = the
// step kernel followed by output_gate_forward: y, gated and the state bit for bit. q, k, v in one row of CD elements
// a sequence and g in one of Rs (a multiple of 8, as m2rnn_proj_stride makes it), as a decode step lays them out; N odd
// leaves a CTA's second head spare (g then starts one element later than CD + N, which a decode step's layout would put
// at an odd offset: there the gate kernel runs). With odd_rows Rs is odd, so g's rows are not 4-byte pieces: the
// epilogue must be refused (the step then runs the gate kernel).
static void run_step_gate_case(Runtime *rt, int B, int N, int Nq, int with_d, int odd_rows = 0) {
    const int K = 64, V = 16, NV = N * V, CD = 2 * Nq * K + NV, G0 = CD + N + (N & 1);
    const int Rs = (G0 + NV + 7) / 8 * 8 + (odd_rows ? 1 : 0);
    char name[112];
    uint64_t seed = 0x57e9 ^ ((uint64_t)B << 24) ^ ((uint64_t)N << 8) ^ (uint64_t)with_d;
    const size_t nrow = (size_t)B * CD, nproj = (size_t)B * Rs, nst = (size_t)B * N * K * V;
    floatX *hrow = (floatX *)mallocCheck(nrow * sizeof(floatX)), *hproj = (floatX *)mallocCheck(nproj * sizeof(floatX));
    floatX *hW = (floatX *)mallocCheck((size_t)N * V * V * sizeof(floatX)), *hD = (floatX *)mallocCheck(NV * sizeof(floatX));
    float *hst = (float *)mallocCheck(nst * sizeof(float)), *hf = (float *)mallocCheck((size_t)B * N * sizeof(float));
    for (size_t i = 0; i < nrow; i++) { hrow[i] = (floatX)frand(&seed); }
    for (size_t i = 0; i < nproj; i++) { hproj[i] = (floatX)(2.0f * frand(&seed)); }
    for (int i = 0; i < N * V * V; i++) { hW[i] = (floatX)(0.3f * frand(&seed)); }
    for (int i = 0; i < NV; i++) { hD[i] = (floatX)frand(&seed); }
    for (size_t i = 0; i < nst; i++) { hst[i] = frand(&seed); }
    for (int i = 0; i < B * N; i++) { hf[i] = 0.5f + 0.45f * frand(&seed); }
    floatX *drow = upload(hrow, nrow), *dproj = upload(hproj, nproj), *dW = upload(hW, (size_t)N * V * V);
    floatX *dD = upload(hD, NV), *y[2], *gated[2];
    float *st[2], *df;
    cudaCheck(cudaMalloc(&df, (size_t)B * N * sizeof(float)));
    cudaCheck(cudaMemcpy(df, hf, (size_t)B * N * sizeof(float), cudaMemcpyHostToDevice));
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaMalloc(&y[i], (size_t)B * NV * sizeof(floatX)));
        cudaCheck(cudaMalloc(&gated[i], (size_t)B * NV * sizeof(floatX)));
        cudaCheck(cudaMemset(gated[i], 0xff, (size_t)B * NV * sizeof(floatX)));
        cudaCheck(cudaMalloc(&st[i], nst * sizeof(float)));
        cudaCheck(cudaMemcpy(st[i], hst, nst * sizeof(float), cudaMemcpyHostToDevice));
    }
    M2RNNDims d = {B, 1, N, Nq, K, V, CD, CD, CD, NULL};
    const floatX *q = drow, *k = drow + Nq * K, *v = drow + 2 * Nq * K, *g = dproj + G0, *Dp = with_d ? dD : NULL;
    m2rnn_step(y[0], st[0], (long)N * K * V, q, k, v, df, dW, &d, rt->stream);
    output_gate_forward(y[0], gated[0], v, g, Dp, B, NV, CD, Rs, rt->stream);
    const M2RNNGateEpilogue ge = {gated[1], v, g, CD, Rs, Dp, NV, V, m2rnn_step_heads_per_cta(K) * V};
    const bool ok = m2rnn_gate_epilogue_ok(&ge);
    if (ok) { m2rnn_step(y[1], st[1], (long)N * K * V, q, k, v, df, dW, &d, rt->stream, ge); }
    cudaCheck(cudaStreamSynchronize(rt->stream));
    const void *const pairs[3][2] = {{y[0], y[1]}, {gated[0], gated[1]}, {st[0], st[1]}};
    const size_t sizes[3] = {(size_t)B * NV * sizeof(floatX), (size_t)B * NV * sizeof(floatX), nst * sizeof(float)};
    const bool same = ok && same_device_bytes(pairs, sizes, 3);
    snprintf(name, sizeof(name), "M2RNN step + gate epilogue B=%d N=%d Nq=%d%s%s", B, N, Nq, with_d ? " D" : "",
             odd_rows ? " odd g rows" : "");
    if (odd_rows) {
        test_result(!ok, name, "the epilogue %s", ok ? "TAKEN (its 4-byte copies would be misaligned)" : "refused");
    } else {
        test_result(same, name, "= step kernel + output gate kernel (y, gated, state): %s",
                    !ok ? "REFUSED" : same ? "bit for bit" : "DIFFER");
    }
    free(hrow); free(hproj); free(hW); free(hD); free(hst); free(hf);
    cudaCheck(cudaFree(drow)); cudaCheck(cudaFree(dproj)); cudaCheck(cudaFree(dW)); cudaCheck(cudaFree(dD));
    cudaCheck(cudaFree(df));
    for (int i = 0; i < 2; i++) { cudaCheck(cudaFree(y[i])); cudaCheck(cudaFree(gated[i])); cudaCheck(cudaFree(st[i])); }
}
#endif

// the M²RNN step's output gate and mixer norm in the out-projection's prologue (GemvNorm's gate) = output_gate_forward,
// rmsnorm_forward, then the GEMV: the output and the 1/rms bit for bit (v and g strided views, as in the step)
static void run_gate_norm_case(Runtime *rt, int M, int NV, int OC, int vs, int gs) {
    char name[96];
    snprintf(name, sizeof(name), "gate + norm in the product M=%d NV=%d OC=%d", M, NV, OC);
    if (!rmsnorm_row_packs_ok(NV)) { // (fp32 rows of 1344: more packs than a lane keeps; the step runs unfused)
        test_skip(name, "rows too long for the one-warp norm at this precision: the unfused kernels run");
        return;
    }
    uint64_t seed = 0x6a7e ^ ((uint64_t)M << 24) ^ ((uint64_t)NV << 8) ^ (uint64_t)OC;
    const size_t ny = (size_t)M * NV, nv = (size_t)M * vs, ng = (size_t)M * gs, nw = (size_t)OC * NV;
    floatX *hy = (floatX *)mallocCheck(ny * sizeof(floatX)), *hv = (floatX *)mallocCheck(nv * sizeof(floatX));
    floatX *hg = (floatX *)mallocCheck(ng * sizeof(floatX)), *hw = (floatX *)mallocCheck(nw * sizeof(floatX));
    floatX *hD = (floatX *)mallocCheck((size_t)NV * sizeof(floatX)), *hn = (floatX *)mallocCheck((size_t)NV * sizeof(floatX));
    for (size_t i = 0; i < ny; i++) { hy[i] = (floatX)(2.0f * frand(&seed)); }
    for (size_t i = 0; i < nv; i++) { hv[i] = (floatX)frand(&seed); }
    for (size_t i = 0; i < ng; i++) { hg[i] = (floatX)(3.0f * frand(&seed)); }
    for (size_t i = 0; i < nw; i++) { hw[i] = (floatX)(frand(&seed) / sqrtf((float)NV)); }
    for (int i = 0; i < NV; i++) { hD[i] = (floatX)(1.0f + 0.5f * frand(&seed)); hn[i] = (floatX)(1.0f + 0.5f * frand(&seed)); }
    floatX *dy = upload(hy, ny), *dy2 = upload(hy, ny), *dv = upload(hv, nv), *dg = upload(hg, ng), *dw = upload(hw, nw);
    floatX *dD = upload(hD, (size_t)NV), *dn = upload(hn, (size_t)NV), *gated, *normed, *out[2];
    float *rs[2];
    cudaCheck(cudaMalloc(&gated, ny * sizeof(floatX)));
    cudaCheck(cudaMalloc(&normed, ny * sizeof(floatX)));
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaMalloc(&out[i], (size_t)M * OC * sizeof(floatX)));
        cudaCheck(cudaMalloc(&rs[i], (size_t)M * sizeof(float)));
    }
    output_gate_forward(dy2, gated, dv, dg, dD, M, NV, vs, gs, rt->stream);
    rmsnorm_forward(normed, rs[0], NULL, gated, NULL, dn, M, NV, rt->stream);
    bool ok = matmul_gemv(out[0], OC, normed, dw, M, NV, OC, rt->stream);
    const GemvNorm n = {dy, NULL, dn, NULL, rs[1], dv, dg, dD, vs, gs};
    ok = ok && matmul_gemv_launch<false>(out[1], OC, NULL, dw, M, NV, OC, &n, rt->stream);
    cudaCheck(cudaStreamSynchronize(rt->stream));
    const size_t sizes[2] = {(size_t)M * OC * sizeof(floatX), (size_t)M * sizeof(float)};
    const void *const bufs[2][2] = {{out[0], out[1]}, {rs[0], rs[1]}};
    const bool same = ok && same_device_bytes(bufs, sizes, 2);
    test_result(same, name, "= output gate + RMSNorm kernels + GEMV, 1/rms: %s",
                !ok ? "REFUSED" : same ? "bit for bit" : "DIFFER");
    free(hy); free(hv); free(hg); free(hw); free(hD); free(hn);
    for (floatX *p : {dy, dy2, dv, dg, dw, dD, dn, gated, normed, out[0], out[1]}) { cudaCheck(cudaFree(p)); }
    cudaCheck(cudaFree(rs[0])); cudaCheck(cudaFree(rs[1]));
}

// an attention layer's config for the decode cases: NH heads of HS, NKV kv heads, RoPE (θ = 10000) or none
static ModelConfig attn_case_config(int NH, int NKV, int HS, int rope) {
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.attn.heads = NH;
    c.attn.kv_heads = NKV;
    c.attn.head_dim = HS;
    c.attn.rope = rope;
    c.attn.rope_theta = 10000.0f;
    return c;
}

// RoPE and the cache append in one kernel (attention_rope_append) = the rotation kernel then attention_append_kernel:
// the rotated qkv rows and both caches bit for bit (B sequences of T new tokens at distinct positions; HS = 64 takes
// the 16-byte pieces, HS = 12 the element path)
static void run_rope_append_case(Runtime *rt, int B, int T, int NH, int NKV, int HS, int context, int room) {
    char name[96];
    uint64_t seed = 0x40be ^ ((uint64_t)B << 32) ^ ((uint64_t)NH << 16) ^ ((uint64_t)HS << 4) ^ (uint64_t)T;
    ModelConfig c = attn_case_config(NH, NKV, HS, 1);
    const int W = (NH + 2 * NKV) * HS, kv = NKV * HS;
    const long seq = 2L * context * kv + room; // keys, values, room (as a decode state has; 4: slots not 16-byte aligned)
    const size_t nq = (size_t)B * T * W, nc = (size_t)B * seq;
    floatX *hq = (floatX *)mallocCheck(nq * sizeof(floatX)), *hc = (floatX *)mallocCheck(nc * sizeof(floatX));
    for (size_t i = 0; i < nq; i++) { hq[i] = (floatX)(2.0f * frand(&seed)); }
    for (size_t i = 0; i < nc; i++) { hc[i] = (floatX)frand(&seed); }
    int hp[8];
    for (int b = 0; b < B; b++) { hp[b] = (b * 37 + 5) % (context - T); }
    int *dp;
    cudaCheck(cudaMalloc(&dp, B * sizeof(int)));
    cudaCheck(cudaMemcpy(dp, hp, B * sizeof(int), cudaMemcpyHostToDevice));
    floatX *q[2] = {upload(hq, nq), upload(hq, nq)}, *cache[2] = {upload(hc, nc), upload(hc, nc)};
    dim3 grid, block;
    attention_rope_shape(&grid, &block, (long)B * T, &c);
    attention_rope_kernel<false><<<grid, block, 0, rt->stream>>>(q[0], B * T, T, (const float2 *)NULL, dp, NH, NKV, HS,
                                                                c.attn.rope_theta, 0);
    cudaCheck(cudaGetLastError());
    attention_append(cache[0], seq, q[0], dp, B, T, &c, context, rt->stream);
    attention_rope_append(q[1], cache[1], seq, dp, B, T, &c, context, rt->stream);
    cudaCheck(cudaStreamSynchronize(rt->stream));
    const void *const bufs[2][2] = {{q[0], q[1]}, {cache[0], cache[1]}};
    const size_t sizes[2] = {nq * sizeof(floatX), nc * sizeof(floatX)};
    const bool same = same_device_bytes(bufs, sizes, 2);
    snprintf(name, sizeof(name), "RoPE + cache append B=%d T=%d NH=%d NKV=%d HS=%d%s", B, T, NH, NKV, HS,
             room % 8 ? " unaligned" : "");
    test_result(same, name, "= rotation kernel + append kernel (rows, keys, values): %s", same ? "bit for bit" : "DIFFER");
    free(hq); free(hc);
    for (int i = 0; i < 2; i++) { cudaCheck(cudaFree(q[i])); cudaCheck(cudaFree(cache[i])); }
    cudaCheck(cudaFree(dp));
}

#if !FLOATX_IS_FP32
// the attention decode step in one launch (flash_attention_decode_step: RoPE, the append and the attention, the
// slices merged by the last CTA) = attention_rope_append then flash_attention_decode: y and the whole state (both
// caches, the partial results, the counters back at zero) bit for bit, over two steps (the counters' reset), at
// positions on and beside slice boundaries; stage 0: the step reads its rows after the wait, 1: as
// flash_decode_stages says (staged in shared memory before it where the cache is small)
static void run_attn_step_case(Runtime *rt, int B, int NH, int NKV, int HS, int context, int rope, int stage) {
    char name[160];
    uint64_t seed = 0xa77e ^ ((uint64_t)B << 32) ^ ((uint64_t)NH << 16) ^ ((uint64_t)HS << 4) ^ (uint64_t)rope;
    ModelConfig c = attn_case_config(NH, NKV, HS, rope);
    const int W = (NH + 2 * NKV) * HS, kv = NKV * HS, inner = NH * HS;
    const size_t wsf = flash_decode_workspace_floats(1, NH, HS, context);
    const long seq = 2L * context * kv + 2L * (long)wsf; // a decode state's: keys, values, the workspace
    const size_t nq = (size_t)B * W, nc = (size_t)B * seq, ny = (size_t)B * inner;
    floatX *hq = (floatX *)mallocCheck(nq * sizeof(floatX)), *hc = (floatX *)mallocCheck(nc * sizeof(floatX));
    for (size_t i = 0; i < nc; i++) { hc[i] = (floatX)frand(&seed); }
    for (int b = 0; b < B; b++) { // (the workspace zeroed, as a decode state begins)
        memset(hc + (size_t)b * seq + 2L * context * kv, 0, wsf * sizeof(float));
    }
    const int slice = flash_decode_slice(context);
    int hp[8];
    for (int b = 0; b < B; b++) { hp[b] = b == 0 ? slice - 1 : b == 1 ? 0 : b == 2 ? context - 2 : (b * 97 + 13) % (context - 1); }
    int *dp;
    cudaCheck(cudaMalloc(&dp, B * sizeof(int)));
    floatX *cache[2] = {upload(hc, nc), upload(hc, nc)}, *q[2] = {NULL, NULL}, *y[2];
    for (int i = 0; i < 2; i++) { cudaCheck(cudaMalloc(&y[i], ny * sizeof(floatX))); }
    const float scale = 1.0f / sqrtf((float)HS);
    flash_decode_stage = stage;
    const bool want = stage && flash_decode_stages(B, NKV, HS, context);
    const long staged0 = flash_decode_staged_launches;
    for (int step = 0; step < 2; step++) { // the second step one position on
        for (size_t i = 0; i < nq; i++) { hq[i] = (floatX)(2.0f * frand(&seed)); }
        for (int i = 0; i < 2; i++) {
            if (q[i] != NULL) { cudaCheck(cudaFree(q[i])); }
            q[i] = upload(hq, nq);
        }
        cudaCheck(cudaMemcpy(dp, hp, B * sizeof(int), cudaMemcpyHostToDevice));
        attention_rope_append(q[0], cache[0], seq, dp, B, 1, &c, context, rt->stream);
        flash_attention_decode(y[0], inner, (float *)(cache[0] + 2L * context * kv), seq / 2, q[0], W, cache[0],
                               cache[0] + (size_t)context * kv, seq, dp, 1, B, NH, NKV, HS, context, scale, rt->stream);
        flash_attention_decode_step(y[1], inner, (float *)(cache[1] + 2L * context * kv), seq / 2, q[1], W, cache[1],
                                    cache[1] + (size_t)context * kv, seq, dp, B, NH, NKV, HS, context, scale,
                                    rope ? c.attn.rope_theta : 0.0f, rt->stream);
        cudaCheck(cudaStreamSynchronize(rt->stream));
        for (int b = 0; b < B; b++) { hp[b]++; }
    }
    const void *const bufs[2][2] = {{y[0], y[1]}, {cache[0], cache[1]}};
    const size_t sizes[2] = {ny * sizeof(floatX), nc * sizeof(floatX)};
    const bool same = same_device_bytes(bufs, sizes, 2);
    const bool path = flash_decode_staged_launches - staged0 == (want ? 2 : 0);
    flash_decode_stage = -1; // (the environment's choice again)
    snprintf(name, sizeof(name), "attention decode step in one launch B=%d NH=%d NKV=%d HS=%d context %d%s, %s", B, NH,
             NKV, HS, context, rope ? " RoPE" : "", want ? "rows staged" : "rows from L2");
    test_result(same && path, name, "= RoPE + append, then the split decode (y, caches, partials, counters; 2 steps): %s%s",
                same ? "bit for bit" : "DIFFER", path ? "" : " WRONG PATH");
    free(hq); free(hc);
    for (int i = 0; i < 2; i++) { cudaCheck(cudaFree(q[i])); cudaCheck(cudaFree(cache[i])); cudaCheck(cudaFree(y[i])); }
    cudaCheck(cudaFree(dp));
}
#endif

// the GDN step's conv + q/k L2 norms + gates in one kernel (gdn_step_prep) = the four kernels (gdn_step_prep_unfused):
// the conv outputs, the windows, qn, kn, their 1/norms and both gates bit for bit
static void run_gdn_prep_case(Runtime *rt, int B, int H, int K, int V, int W, int neg) {
    char name[96];
    snprintf(name, sizeof(name), "GDN step prep B=%d H=%d K=%d V=%d W=%d%s", B, H, K, V, W, neg ? " neg" : "");
    uint64_t seed = 0x9d0 ^ ((uint64_t)B << 32) ^ ((uint64_t)H << 16) ^ ((uint64_t)K << 4) ^ (uint64_t)V;
    const int HK = H * K, CD = 2 * HK + H * V, boff = 2 * HK + 2 * H * V, Rs = boff + 2 * H + 6;
    const long stride = (long)(W - 1) * CD + 40;
    const size_t np = (size_t)B * Rs, nw = (size_t)CD * W, ns = (size_t)B * stride;
    floatX *hp = (floatX *)mallocCheck(np * sizeof(floatX)), *hw = (floatX *)mallocCheck(nw * sizeof(floatX));
    float *hs = (float *)mallocCheck(ns * sizeof(float)), *ha = (float *)mallocCheck(2 * (size_t)H * sizeof(float));
    for (size_t i = 0; i < np; i++) { hp[i] = (floatX)(3.0f * frand(&seed)); }
    for (size_t i = 0; i < nw; i++) { hw[i] = (floatX)frand(&seed); }
    for (size_t i = 0; i < ns; i++) { hs[i] = (float)(floatX)frand(&seed); }
    for (int i = 0; i < 2 * H; i++) { ha[i] = frand(&seed); }
    floatX *dp = upload(hp, np), *dw = upload(hw, nw), *act[2], *qn[2], *kn[2];
    float *win[2], *rq[2], *rk[2], *beta[2], *g[2], *dA;
    cudaCheck(cudaMalloc(&dA, 2 * (size_t)H * sizeof(float)));
    cudaCheck(cudaMemcpy(dA, ha, 2 * (size_t)H * sizeof(float), cudaMemcpyHostToDevice));
    const size_t BH = (size_t)B * H;
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaMalloc(&act[i], (size_t)B * CD * sizeof(floatX)));
        cudaCheck(cudaMalloc(&qn[i], BH * K * sizeof(floatX)));
        cudaCheck(cudaMalloc(&kn[i], BH * K * sizeof(floatX)));
        for (float **p : {&rq[i], &rk[i], &beta[i], &g[i]}) { cudaCheck(cudaMalloc(p, BH * sizeof(float))); }
        cudaCheck(cudaMalloc(&win[i], ns * sizeof(float)));
        cudaCheck(cudaMemcpy(win[i], hs, ns * sizeof(float), cudaMemcpyHostToDevice));
    }
    gdn_step_prep_unfused(act[0], win[0], stride, qn[0], kn[0], rq[0], rk[0], beta[0], g[0], dp, dw, dA, dA + H, B, CD,
                          W, Rs, H, K, boff, neg, rt->stream);
    const bool ok = gdn_step_prep(act[1], win[1], stride, qn[1], kn[1], rq[1], rk[1], beta[1], g[1], dp, dw, dA, dA + H,
                                  B, CD, W, Rs, H, K, boff, neg, rt->stream);
    cudaCheck(cudaStreamSynchronize(rt->stream));
    const size_t fb = BH * sizeof(float), qb = BH * K * sizeof(floatX);
    const size_t sizes[8] = {(size_t)B * CD * sizeof(floatX), ns * sizeof(float), qb, qb, fb, fb, fb, fb};
    const void *const bufs[8][2] = {{act[0], act[1]}, {win[0], win[1]}, {qn[0], qn[1]}, {kn[0], kn[1]},
                                    {rq[0], rq[1]},   {rk[0], rk[1]},   {beta[0], beta[1]}, {g[0], g[1]}};
    const bool same = ok && same_device_bytes(bufs, sizes, 8);
    test_result(same, name, "= conv step + 2 L2 norms + gates kernels: %s", !ok ? "REFUSED" : same ? "bit for bit" : "DIFFER");
    free(hp); free(hw); free(hs); free(ha);
    cudaCheck(cudaFree(dp)); cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(dA));
    for (int i = 0; i < 2; i++) {
        for (void *p : {(void *)act[i], (void *)qn[i], (void *)kn[i], (void *)rq[i], (void *)rk[i], (void *)beta[i],
                        (void *)g[i], (void *)win[i]}) {
            cudaCheck(cudaFree(p));
        }
    }
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        test_skip("decode step products on the GPU", "no GPU (the CUDA runtime found no device)");
        return test_summary(SUITE);
    }
    Runtime rt;
    runtime_init(&rt, 0);
    const int shapes[][4] = {
        // M, IC, OC, out stride
        {1, 1024, 3076, 3080}, {1, 1024, 100352, 100352}, {2, 64, 77, 77}, {3, 96, 33, 40}, {4, 1344, 1024, 1024},
        {4, 160, 129, 136},    {4, 2816, 1000, 1000},
        // more rows than the GEMV takes, OC not a multiple of 8 (the M²RNN and GDN in-projections at batch 5 to 64)
        // (the skinny tensor-core product: 16, 32 and 64 token tiles, K split 3..8 ways, the last split short)
        {64, 1024, 2900, 2904}, {64, 1024, 3076, 3080}, {13, 96, 33, 40}, {9, 2752, 1001, 1008}, {40, 1344, 70, 72},
        {27, 224, 130, 130}, {5, 1024, 2900, 2904}, {8, 1024, 3076, 3080}, {6, 2752, 1001, 1008},
        // cuBLASLt's main product + the thin one (K not whole 32-blocks; K too long for 8 splits of the registers),
        // and cuBLASLt alone (OC a multiple of 8) at a few rows
        {20, 1000, 77, 80}, {24, 4096, 1001, 1001}, {7, 160, 129, 136}, {5, 1344, 1024, 1024}, {8, 2816, 1000, 1000},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        run_case(&rt, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
    }
    // staged and streamed weights at one row: every form the decode step takes, at the 410M shapes and small ones
    const int stage[][4] = {{1, 1024, 1000, 0}, {1, 2816, 1000, 0}, {1, 1024, 3076, 0}, {1, 1344, 2900, 0},
                            {1, 1024, 2816, 1}, {1, 256, 1000, 1}, {1, 1024, 1000, 2}, {1, 1024, 2900, 2},
                            {1, 1344, 1024, 3}, {1, 256, 77, 3}, {1, 200, 77, 2}};
    for (size_t i = 0; i < sizeof(stage) / sizeof(stage[0]); i++) {
        run_stage_case(&rt, stage[i][0], stage[i][1], stage[i][2], stage[i][3]);
    }
    run_stream_case(&rt, 1, 1024, 100352); // the LM head at one and four sequences; ragged groups
    run_stream_case(&rt, 4, 1024, 40003);
    run_stream_case(&rt, 2, 256, 16400);
    const int glu[][3] = {{1, 1024, 2816}, {3, 64, 77}, {4, 256, 1000}};
    for (size_t i = 0; i < sizeof(glu) / sizeof(glu[0]); i++) { run_glu_case(&rt, glu[i][0], glu[i][1], glu[i][2]); }
#if !FLOATX_IS_FP32
    run_step_gate_case(&rt, 64, 84, 1, 1); // the 410M Hybrid M²RNN's layer at batch 64
    run_step_gate_case(&rt, 1, 84, 1, 1);  // ... and at batch 1 (the out-projection then only normalizes)
    run_step_gate_case(&rt, 5, 7, 1, 1);   // N odd: a CTA's spare head
    run_step_gate_case(&rt, 9, 6, 2, 0);   // two q/k heads, no D
    run_step_gate_case(&rt, 6, 7, 1, 1, 1); // g's rows an odd number of elements apart: refused
#endif
    run_branch_parts_case(&rt, 64, 1344, 1024); // the 410M Hybrid M²RNN's out-projection at batch 64
    run_branch_parts_case(&rt, 64, 2752, 1024); // its down-projection
    run_branch_parts_case(&rt, 13, 1024, 1024); // the attention out-projection
    run_branch_parts_case(&rt, 5, 96, 40);
    run_branch_parts_case(&rt, 7, 200, 64);     // K = 200 not a multiple of 8 · 2: the product itself
    run_branch_parts_case(&rt, 4, 1344, 1024);  // the GEMV's rows: the product itself
    run_branch_parts_case(&rt, 65, 1344, 1024); // more than 64 rows: the product itself
    run_norm_case(&rt, 1, 1024, 3076, 1);
    run_norm_case(&rt, 4, 1024, 1000, 1);
    run_norm_case(&rt, 3, 1344, 77, 0);
    run_norm_case(&rt, 1, 1344, 1024, 0); // the 410M Hybrid M²RNN's out-projection, its row gated by the step kernel
    run_norm_case(&rt, 1, 1024, 3076, 2); // the first layer's norm with the embedding in the prologue
    run_norm_case(&rt, 4, 1024, 1000, 2);
    run_prep_case(&rt, 1, 1472, 84, 4);
    run_prep_case(&rt, 5, 200, 7, 2);
    run_conv_epi_case(&rt, 1, 1024, 1472, 84, 1344, 4); // the 410M Hybrid M²RNN's in-projection
    run_conv_epi_case(&rt, 4, 1024, 1472, 84, 1344, 4);
    run_conv_epi_case(&rt, 3, 96, 40, 7, 13, 2);
    run_conv_epi_case(&rt, 2, 64, 24, 3, 5, 3);
    run_gate_norm_case(&rt, 1, 1344, 1024, 1472, 2904); // the 410M Hybrid M²RNN's out-projection
    run_gate_norm_case(&rt, 4, 1344, 1024, 1472, 2904);
    run_gate_norm_case(&rt, 3, 256, 77, 300, 517);
    if (!FLOATX_IS_FP32) { // (fp32: K=256 is more than one 16-byte piece a lane; the unfused kernels run)
        run_gdn_prep_case(&rt, 1, 2, 256, 512, 4, 0); // the 410M GDN layer
        run_gdn_prep_case(&rt, 5, 16, 128, 128, 4, 1);
    }
    run_gdn_prep_case(&rt, 3, 3, 64, 40, 3, 0);
    run_rope_append_case(&rt, 1, 1, 16, 16, 64, 1024, 8); // the 410M Transformer++'s layer, a decode step
    run_rope_append_case(&rt, 5, 1, 8, 2, 64, 300, 4);    // GQA, sequences' slots not 16-byte aligned
    run_rope_append_case(&rt, 2, 7, 4, 4, 64, 100, 8);    // a prefill chunk
    run_rope_append_case(&rt, 3, 2, 6, 3, 12, 50, 8);     // the element path
#if !FLOATX_IS_FP32
    for (int stage = 0; stage < 2; stage++) { // each shape with its rows from L2, then staged where it stages
        run_attn_step_case(&rt, 1, 16, 16, 64, 1100, 1, stage); // the 410M Transformer++'s layer (5 slices, the last partial)
        run_attn_step_case(&rt, 1, 16, 16, 64, 1100, 0, stage); // the hybrids' (NoPE) at batch 1
        run_attn_step_case(&rt, 4, 16, 16, 64, 600, 0, stage);  // the hybrids' at batch 4, positions at slice edges
        run_attn_step_case(&rt, 3, 16, 2, 64, 700, 1, stage);   // GQA of 8: two CTA groups a kv head (only group 0 appends)
        run_attn_step_case(&rt, 2, 8, 4, 32, 300, 1, stage);    // heads of 32
        run_attn_step_case(&rt, 2, 4, 4, 128, 1000, 1, stage);  // heads of 128 (128 KB of rows a slice: not staged)
        run_attn_step_case(&rt, 2, 4, 4, 128, 9000, 1, stage);  // a context of longer slices (256 KB: not staged)
    }
#endif
    runtime_free(&rt);
    return test_summary(SUITE);
}
