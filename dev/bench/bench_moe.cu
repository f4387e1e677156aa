/*
bench_moe.cu: times one mixture-of-experts layer (moe.cuh) of the paper's 7B shape, d = 1536, 128 experts of hidden
size 256, top-8, a shared expert of 1024 (layers.h's e row), at 16K and 32K tokens: forward (router, top-k, the
grouping, the experts, the combine, the load-balancing loss) and forward+backward. The peer, the same layer in
PyTorch with torch._grouped_mm for the experts (a loop over experts where it is missing), runs in the same call
(dev/bench/moe_torch.py, scripts/gpu_moe.sh).

FLOPs count the active parameters only (layers.h moe_flops: the router 2·C·E, K experts 6·C·F each, the shared
expert 6·C·S a token); forward+backward = 3 × forward.
Inputs: random, scaled like the trainer's (weights std 0.02); tokens spread over the experts by a random router.
Timing: CUDA events, 3 warm-up calls, the median of the repeats.
usage: build/bench_moe [-r repeats] [-m tokens]
*/
#include "utils.h"
#include "model.h"
#include "common.cuh"
#include "moe.cuh"
#include "dev/bench/bench_common.cuh"

int main(int argc, char **argv) {
    int repeats = 20, only_m = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-r") == 0) { repeats = atoi(argv[i + 1]); }
        else if (strcmp(argv[i], "-m") == 0) { only_m = atoi(argv[i + 1]); }
    }
    Runtime rt;
    runtime_init(&rt, 0);
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.d_model = 1536;
    c.moe.experts = 128; c.moe.top_k = 8; c.moe.hidden = 256; c.moe.shared = 1024; c.moe.aux_coef = 0.001f;
    const int C = c.d_model, E = c.moe.experts, F = c.moe.hidden, S = c.moe.shared;
    const size_t sizes[5] = {(size_t)E * C, (size_t)E * 2 * F * C, (size_t)E * C * F, 2 * (size_t)S * C, (size_t)C * S};
    floatX *w[5];
    float *g[5];
    for (int p = 0; p < 5; p++) {
        cudaCheck(cudaMalloc(&w[p], sizes[p] * sizeof(floatX)));
        cudaCheck(cudaMalloc(&g[p], sizes[p] * sizeof(float)));
        cudaCheck(cudaMemset(g[p], 0, sizes[p] * sizeof(float)));
        bench_fill(w[p], sizes[p], 17u + p, 0.02f * 1.7f);
    }
    printf("device: %s\n", rt.prop.name);
    printf("| layer | tokens | pass | ms | TFLOP/s (active) |\n|---|---|---|---|---|\n");
    const int tokens[2] = {16384, 32768};
    for (int ti = 0; ti < 2; ti++) {
        const int M = tokens[ti];
        if (only_m > 0 && M != only_m) { continue; }
        floatX *x, *dout, *out, *dx;
        cudaCheck(cudaMalloc(&x, (size_t)M * C * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dout, (size_t)M * C * sizeof(floatX)));
        cudaCheck(cudaMalloc(&out, (size_t)M * C * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dx, (size_t)M * C * sizeof(floatX)));
        bench_fill(x, (size_t)M * C, 5u, 1.7f);
        bench_fill(dout, (size_t)M * C, 6u, 1e-3f);
        void *acts, *scratch;
        cudaCheck(cudaMalloc(&acts, MOE_OPS.acts_bytes(&c, 1, M, &rt)));
        cudaCheck(cudaMalloc(&scratch, MOE_OPS.scratch_bytes(&c, 1, M, &rt)));
        double aux = 0.0;
        KindTensors t = {w, NULL, g, &aux, 1.0f};
        const double flops = moe_flops(&c, 1) * M;
        const float fwd = median_ms([&] { MOE_OPS.forward(out, acts, scratch, x, &t, &c, 1, M, &rt); }, repeats, rt.stream);
        const float both = median_ms([&] {
            MOE_OPS.forward(out, acts, scratch, x, &t, &c, 1, M, &rt);
            MOE_OPS.backward(dx, scratch, dout, x, acts, &t, &c, 1, M, &rt);
        }, repeats, rt.stream);
        printf("| m2rnn moe.cuh | %d | forward | %.3f | %.1f |\n", M, fwd, flops / fwd * 1e-9);
        printf("| m2rnn moe.cuh | %d | forward+backward | %.3f | %.1f |\n", M, both, 3 * flops / both * 1e-9);
        cudaFree(x); cudaFree(dout); cudaFree(out); cudaFree(dx); cudaFree(acts); cudaFree(scratch);
    }
    for (int p = 0; p < 5; p++) { cudaFree(w[p]); cudaFree(g[p]); }
    runtime_free(&rt);
    return 0;
}
