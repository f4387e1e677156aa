/*
test_decode_gpu.cu: the decode step's weight-streaming product (common.cuh: matmul_gemv, for at most GEMV_MAX_M rows)
against a float64 product of the same bf16 (or fp32) inputs, as normwise relative errors, on shapes that cover every
row count, output counts that are not a multiple of a block's rows, and strided outputs. Each case
also runs through matmul_forward_strided with rt.decode_step set (the dispatch the decode step takes), launched
programmatically (launch_pdl, cuda_common.h) as a chain of products that feed each other, against the same chain
launched the ordinary way: bit for bit, and twice the same bits (no atomics).
Without a GPU it prints a SKIP line and exits 0.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "utils.h"
#include "model.h"
#include "common.cuh"
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

// out (M, OC) with row stride S from a direct kernel call, against float64; then a chain of three products through
// the decode dispatch (x → y = x Wᵀ (OC) → z = y W2ᵀ (IC) → y again), programmatic and not, bit for bit
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
    const bool ok_launch = matmul_gemv(dy, S, dx, dw, M, IC, OC, rt->stream);
    const char *kind = "gemv";
    snprintf(name, sizeof(name), "%s M=%d IC=%d OC=%d stride %d", kind, M, IC, OC, S);
    if (!ok_launch) {
        test_result(0, name, "the kernel refused the shape");
    } else {
        cudaCheck(cudaDeviceSynchronize());
        download(hy, dy, ny);
        double num = 0.0, den = 0.0;
        bool finite = true;
        for (int m = 0; m < M; m++) {
            for (int o = 0; o < OC; o++) {
                double want = 0.0;
                for (int k = 0; k < IC; k++) { want += (double)(float)hx[(size_t)m * IC + k] * (double)(float)hw[(size_t)o * IC + k]; }
                const double got = (double)(float)hy[(size_t)m * S + o];
                finite = finite && isfinite(got);
                num += (got - want) * (got - want);
                den += want * want;
            }
        }
        const double err = sqrt(num / (den > 0 ? den : 1.0));
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
        {1, 1024, 3076, 3080}, {1, 1024, 100352, 100352}, {2, 64, 77, 77}, {3, 96, 33, 40}, {5, 1344, 1024, 1024},
        {7, 160, 129, 136},    {8, 2816, 1000, 1000},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        run_case(&rt, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
    }
    runtime_free(&rt);
    return test_summary(SUITE);
}
