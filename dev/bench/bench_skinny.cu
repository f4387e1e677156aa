/*
bench_skinny.cu: the decode step's skinny tensor-core product (common.cuh: skinny_product, for 5..64 token rows)
against cuBLASLt's dispatch (matmul_forward_strided outside a decode step: its first pick, plus the thin product
where OC is not a multiple of 8) on the 410M model's product shapes, each timed as a graph of 20 launches (medians),
the skinny product also launched programmatically (its weight loads before its dependency wait, under the launch
before, as in a decode step); both checked against a float64 product of the same inputs (normwise relative error),
the skinny product also for the same bits under both launches. The decode step takes the skinny product only where
it wins on every row count here: the shapes cuBLASLt splits (OC not a multiple of 8). Results: NOTES.md, inference
round 7.

usage: build/bench_skinny [M ...]   (default 16 32 64; e.g. 5 8 16 64); built with -DSK_PHASES also each CTA's phases (clock64)
*/
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include "common.cuh"
#include "dev/bench/bench_common.cuh"

typedef struct { const char *name; int OC, IC; } Shape;
static const Shape shapes[] = {
    {"M2RNN in", 2900, 1024}, {"M2RNN out", 1024, 1344}, {"SwiGLU up", 5504, 1024}, {"SwiGLU down", 1024, 2752},
    {"attn qkv", 3072, 1024}, {"GDN in", 3076, 1024},    {"LM head", 100352, 1024},
};

static double normwise(const std::vector<floatX> &a, const std::vector<double> &ref, int M, int OC, int stride) {
    double num = 0, den = 0;
    for (int m = 0; m < M; m++) {
        for (int o = 0; o < OC; o++) {
            const double d = (double)(float)a[(size_t)m * stride + o] - ref[(size_t)m * OC + o];
            num += d * d;
            den += ref[(size_t)m * OC + o] * ref[(size_t)m * OC + o];
        }
    }
    return sqrt(num / (den > 0 ? den : 1));
}

int main(int argc, char **argv) {
    const std::vector<int> Ms = bench_int_args(argc, argv, {16, 32, 64});
    Runtime rt;
    runtime_init(&rt, 0);
    printf("%s\n", rt.prop.name);
    const size_t wmax = (size_t)100352 * 1024, xmax = (size_t)64 * 2752, ymax = (size_t)64 * 100352;
    floatX *W, *X, *Y0, *Y1;
    cudaCheck(cudaMalloc(&W, wmax * sizeof(floatX)));
    cudaCheck(cudaMalloc(&X, xmax * sizeof(floatX)));
    cudaCheck(cudaMalloc(&Y0, ymax * sizeof(floatX)));
    cudaCheck(cudaMalloc(&Y1, ymax * sizeof(floatX)));
    bench_fill(W, wmax, 1, 0.03f);
    bench_fill(X, xmax, 2, 1.0f);
    for (int M : Ms)
    for (const Shape &s : shapes) {
        const int OC = s.OC, IC = s.IC, S = skinny_splits(IC, OC, rt.prop.multiProcessorCount);
        if (S == 0) { continue; }
        // float64 reference of the first 8 rows (all rows for the small shapes)
        const int Mr = OC > 16384 ? (M < 8 ? M : 8) : M;
        std::vector<floatX> hx((size_t)M * IC), hw((size_t)OC * IC), h0((size_t)M * OC), h1((size_t)M * OC);
        cudaCheck(cudaMemcpy(hx.data(), X, hx.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(hw.data(), W, hw.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
        std::vector<double> ref((size_t)Mr * OC);
        for (int m = 0; m < Mr; m++) {
            for (int o = 0; o < OC; o++) {
                double a = 0;
                for (int k = 0; k < IC; k++) { a += (double)(float)hx[(size_t)m * IC + k] * (float)hw[(size_t)o * IC + k]; }
                ref[(size_t)m * OC + o] = a;
            }
        }
        auto cublas = [&]() { matmul_forward_strided(Y0, OC, X, W, M, IC, OC, &rt); };
        auto skinny = [&]() { skinny_product(Y1, OC, X, W, M, IC, OC, S, rt.stream); };
        cublas();
        skinny();
        cudaCheck(cudaStreamSynchronize(rt.stream));
        cudaCheck(cudaMemcpy(h0.data(), Y0, h0.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(h1.data(), Y1, h1.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
        const double e0 = normwise(h0, ref, Mr, OC, OC), e1 = normwise(h1, ref, Mr, OC, OC);
        const double us0 = graph_median_ms(cublas, 20, 15, rt.stream) * 1e3;
        const double us1 = graph_median_ms(skinny, 20, 15, rt.stream) * 1e3;
        launch_pdl = 1; // each launch's weight loads under the one before's tail, as in a decode step
        const double us2 = graph_median_ms(skinny, 20, 15, rt.stream) * 1e3;
        skinny();
        cudaCheck(cudaStreamSynchronize(rt.stream));
        launch_pdl = 0;
        std::vector<floatX> h2((size_t)M * OC);
        cudaCheck(cudaMemcpy(h2.data(), Y1, h2.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
        const bool same = memcmp(h1.data(), h2.data(), h1.size() * sizeof(floatX)) == 0;
        const double mb = (double)OC * IC * sizeof(floatX) / 1e6;
        printf("M=%2d %-12s OC %6d IC %5d (%6.1f MB)  cuBLASLt %7.2f us (err %.1e)  skinny S=%2d %7.2f us, "
               "programmatic %7.2f us (err %.1e, %s)  %.2fx\n", M, s.name, OC, IC, mb, us0, e0, S, us1, us2, e1,
               same ? "repeatable" : "NOT REPEATABLE", us0 / us2);
#ifdef SK_PHASES
        // one launch after three (L2 as warm as in the graphs above): each CTA's phases, medians and maxima over CTAs
        for (int r = 0; r < 4; r++) { skinny(); }
        cudaCheck(cudaStreamSynchronize(rt.stream));
        const int nc = CEIL_DIV(OC, SK_ROWS) * S;
        std::vector<unsigned long long> ph((size_t)nc * 8);
        cudaCheck(cudaMemcpyFromSymbol(ph.data(), sk_phase, ph.size() * sizeof(unsigned long long)));
        int khz = 0;
        cudaCheck(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
        const char *names[5] = {"wait", "token rows", "MMAs (weights)", "cluster barrier", "sums + stores"};
        printf("     phases (us, median / max over %d CTAs):", nc);
        for (int i = 1; i <= 5; i++) {
            std::vector<double> d(nc);
            for (int c = 0; c < nc; c++) { d[c] = (double)(ph[(size_t)c * 8 + i] - ph[(size_t)c * 8 + i - 1]) / khz * 1e3; }
            std::sort(d.begin(), d.end());
            printf("  %s %.2f / %.2f", names[i - 1], d[nc / 2], d[nc - 1]);
        }
        unsigned long long s0 = ~0ull, s1 = 0, end = 0;
        for (int c = 0; c < nc; c++) {
            s0 = std::min(s0, ph[(size_t)c * 8 + 6]);
            s1 = std::max(s1, ph[(size_t)c * 8 + 6]);
            end = std::max(end, ph[(size_t)c * 8 + 7]);
        }
        printf("  | CTA starts spread %.2f us, first start to last end %.2f us\n", (s1 - s0) * 1e-3, (end - s0) * 1e-3);
#endif
    }
    runtime_free(&rt);
    return 0;
}
