/*
bench_decode_matmul.cu: the products of a batched decode step (M = 16..64 token rows against a weight of OC × IC)
under every algorithm cuBLASLt's heuristic offers, to see what its first pick costs against the others and whether
the split-K ones (a tile kernel plus a reduction kernel) pay at these sizes. Each product is timed as the decode step
runs it: 20 launches back to back in a CUDA graph (each waits for the one before on the stream), medians of 15.
For each candidate: its time, the split-K count, the tile id and stages from its config, and whether its output equals
the first pick's bit for bit (the same row sums in the same order). First, the same timing for a plain read of the LM
head's weights (the floor of the largest product) and for our GEMV (matmul_gemv, the decode step's products at 1-8
rows).

usage: build/bench_decode_matmul [M ...]   (default 16 32 64; shapes: the 410M Hybrid M²RNN and GDN hybrid)
*/
#include <stdio.h>
#include <string.h>
#include <vector>
#include "common.cuh"
#include "dev/bench/bench_common.cuh"

typedef struct { const char *name; int OC, IC; } Shape;
static const Shape shapes[] = {
    {"M2RNN in (R=2900)", 2896, 1024}, {"M2RNN out", 1024, 1344}, {"SwiGLU up", 5504, 1024},
    {"SwiGLU down", 1024, 2752},       {"attn qkv", 3072, 1024},  {"attn out", 1024, 1024},
    {"GDN in (3076, main 3072)", 3072, 1024}, {"GDN out", 1024, 1024}, {"LM head", 100352, 1024},
};

static int algo_attr(const cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoConfigAttributes_t a) {
    int v = -1;
    size_t written = 0;
    uint32_t u = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(algo, a, &u, sizeof(u), &written) == CUBLAS_STATUS_SUCCESS) { v = (int)u; }
    return v;
}

// µs a launch of f: 20 launches in a graph, the median of 15 replays (bench_common.cuh's graph_median_ms)
template <class F> static double graph_us(F f, cudaStream_t stream) { return graph_median_ms(f, 20, 15, stream) * 1e3; }

// The read floor of a product's weights: every 16-byte piece of w read once (U loads in flight a thread, streaming
// loads), 2 blocks of 256 an SM as the streamed GEMV; an xor of all of it kept from being optimized away
template <int U>
__global__ void read_floor_kernel(unsigned *sink, const uint4 *w, size_t n16) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned x = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += stride * U) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) { v[u] = i + u * stride < n16 ? __ldcs(w + i + u * stride) : make_uint4(0, 0, 0, 0); }
#pragma unroll
        for (int u = 0; u < U; u++) { x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w; }
    }
    if (x == 0x9e3779b9u) { *sink = x; }
}

int main(int argc, char **argv) {
    const std::vector<int> Ms = bench_int_args(argc, argv, {16, 32, 64});
    Runtime rt;
    runtime_init(&rt, 0);
    printf("%s\n", rt.prop.name);
    const size_t wmax = (size_t)100352 * 1024, xmax = (size_t)64 * 5504;
    floatX *W, *X, *Y, *Y0;
    cudaCheck(cudaMalloc(&W, wmax * sizeof(floatX)));
    cudaCheck(cudaMalloc(&X, xmax * sizeof(floatX)));
    cudaCheck(cudaMalloc(&Y, (size_t)64 * 100352 * sizeof(floatX)));
    cudaCheck(cudaMalloc(&Y0, (size_t)64 * 100352 * sizeof(floatX)));
    bench_fill(W, wmax, 1, 0.03f);
    bench_fill(X, xmax, 2, 1.0f);
    std::vector<floatX> h0, h1;
    // the floor: the LM head's weights read once, the same graph timing
    {
        unsigned *sink;
        cudaCheck(cudaMalloc(&sink, sizeof(unsigned)));
        const size_t n16 = wmax * sizeof(floatX) / 16;
        const int grid = 2 * rt.prop.multiProcessorCount;
        const double bytes = (double)wmax * sizeof(floatX);
        auto floor_line = [&](int U, void (*kernel)(unsigned *, const uint4 *, size_t)) {
            const double us = graph_us([&]() { kernel<<<grid, 256, 0, rt.stream>>>(sink, (const uint4 *)W, n16); }, rt.stream);
            printf("read floor, the LM head's weights (%.0f MB), %2d loads in flight a thread  %7.2f us  %6.0f GB/s\n",
                   bytes / 1e6, U, us, bytes / us / 1e3);
        };
        floor_line(4, read_floor_kernel<4>);
        floor_line(8, read_floor_kernel<8>);
        floor_line(16, read_floor_kernel<16>);
        cudaCheck(cudaGetLastError());
        cudaCheck(cudaFree(sink));
    }
    // the GEMV (matmul_gemv: a decode step's products at up to GEMV_MAX_M rows), the same graph timing
    for (int M : {1, 2, 4, 8})
    for (const Shape &s : shapes) {
        const double us = graph_us([&]() { matmul_gemv(Y, s.OC, X, W, M, s.IC, s.OC, rt.stream); }, rt.stream);
        const double bytes = (double)s.OC * s.IC * sizeof(floatX);
        printf("gemv M=%d %-26s %7.2f us  %6.0f GB/s of weight\n", M, s.name, us, bytes / us / 1e3);
    }
    for (int M : Ms)
    for (const Shape &s : shapes) {
        const int OC = s.OC, IC = s.IC;
        // the layout matmul_forward_strided uses: D (OC, M) col-major = Wᵀ(op T on (IC, OC)) · X (IC, M)
        cublasLtMatmulDesc_t desc;
        cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
        cublasLtMatrixLayout_t la, lb, ld;
        cublasCheck(cublasLtMatrixLayoutCreate(&la, CUBLAS_LOWP, IC, OC, IC));
        cublasCheck(cublasLtMatrixLayoutCreate(&lb, CUBLAS_LOWP, IC, M, IC));
        cublasCheck(cublasLtMatrixLayoutCreate(&ld, CUBLAS_LOWP, OC, M, OC));
        cublasLtMatmulPreference_t pref;
        cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &rt.lt_workspace_bytes, sizeof(rt.lt_workspace_bytes)));
        cublasLtMatmulHeuristicResult_t res[32];
        int found = 0;
        cublasCheck(cublasLtMatmulAlgoGetHeuristic(rt.lt, desc, la, lb, ld, ld, pref, 32, res, &found));
        const float one = 1.0f, zero = 0.0f;
        const double floor_us = (double)OC * IC * 2 / 3.35e12 * 1e6;
        printf("== M=%d %s: OC %d IC %d (weight %.1f MB, %.2f us at 3.35 TB/s), %d candidates\n", M, s.name, OC, IC,
               OC * (double)IC * 2 / 1e6, floor_us, found);
        const size_t ny = (size_t)OC * M;
        for (int i = 0; i < found; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS) { continue; }
            auto one_launch = [&]() {
                cublasCheck(cublasLtMatmul(rt.lt, desc, &one, W, la, X, lb, &zero, Y, ld, Y, ld, &res[i].algo,
                                           rt.lt_workspace, rt.lt_workspace_bytes, rt.stream));
            };
            one_launch();
            cudaCheck(cudaStreamSynchronize(rt.stream));
            h1.resize(ny);
            cudaCheck(cudaMemcpy(h1.data(), Y, ny * sizeof(floatX), cudaMemcpyDeviceToHost));
            if (i == 0) { h0 = h1; }
            const bool same = memcmp(h0.data(), h1.data(), ny * sizeof(floatX)) == 0;
            printf("  #%-2d %7.2f us  splitK %2d  reduction %d  tile %3d  stages %3d  cta-swizzle %d  workspace %7zu  %s\n",
                   i, graph_us(one_launch, rt.stream), algo_attr(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                   algo_attr(&res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                   algo_attr(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                   algo_attr(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                   algo_attr(&res[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING), res[i].workspaceSize,
                   same ? "= #0" : "differs from #0");
        }
        cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
        cublasCheck(cublasLtMatrixLayoutDestroy(la));
        cublasCheck(cublasLtMatrixLayoutDestroy(lb));
        cublasCheck(cublasLtMatrixLayoutDestroy(ld));
        cublasCheck(cublasLtMatmulDescDestroy(desc));
    }
    return 0;
}
