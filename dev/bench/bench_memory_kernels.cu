/*
bench_memory_kernels.cu: the trainer's memory-bound kernels (everything in a step but the matmuls and the mixers'
cores) timed one by one at the Transformer++ step's shapes (B·T = 32768 rows, d = 1024, 16 heads of 64, SwiGLU
hidden 2752, vocabulary 100352, 509M parameters), each against the floor of moving its bytes once at the copy rate
the same run measures. Profilers serialize kernels with idle gaps between them, in which the GPU lowers its clocks,
so a short memory-bound kernel looks up to 2× slower there than inside a step; here each kernel runs back to back
with CUDA events around it (3 warm-up calls, median of the repeats).

  build/bench_memory_kernels [-r repeats] [-m rows]

Bytes counted (bf16 activations, fp32 statistics and optimizer state):
  RoPE (forward or backward)  q and k columns of the (M, 3·d) projection read and written: M·2d·2·2
  RMSNorm forward + residual  a, b read; the sum and the normalized row written: M·d·2·4
  RMSNorm backward            x, dy read, dx written (and read when accumulating), the per-block partials twice
  SwiGLU forward / backward   (M, 2F) read, (M, F) written / (M, F) + (M, 2F) read, (M, 2F) written
  cross-entropy forward       the (M, V) logits read; backward: read and written in place
  AdamW                       grads, master, m, v read (4 B each), master, m, v written, bf16 params written: 30 B
*/
#define TESTING
#include "train_m2rnn.cu"

#include "dev/bench/bench_common.cuh"

static floatX *bench_alloc_x(long n, uint32_t seed, float scale = 1.0f) {
    floatX *p = NULL;
    cudaCheck(cudaMalloc(&p, n * sizeof(floatX)));
    bench_fill(p, (size_t)n, seed, scale);
    return p;
}
template <class F> static float bench_median(F f, int repeats) { return median_ms(f, repeats, 0); }

static double copy_gbs; // the device-to-device copy rate, GB/s of bytes moved (read + write)
static void report(const char *name, float ms, double bytes, int calls_per_step) {
    const double floor_ms = bytes / copy_gbs / 1e6;
    printf("| %s | %.4f | %.0f | %.0f | %.4f | %.2f× | %d | %.2f |\n", name, ms, bytes / 1e6, bytes / ms / 1e6, floor_ms,
           ms / floor_ms, calls_per_step, ms * calls_per_step);
}

int main(int argc, char **argv) {
    int repeats = 20, M = 32768;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-r")) { repeats = atoi(argv[i + 1]); }
        else if (!strcmp(argv[i], "-m")) { M = atoi(argv[i + 1]); }
        else { fail_with_hint("build/bench_memory_kernels [-r repeats] [-m rows]", "unknown flag %s", argv[i]); }
    }
    const int C = 1024, NH = 16, HS = 64, F = 2752, V = 100352, T = 4096;
    const size_t nparams = 509133824;
    cudaDeviceProp p;
    cudaCheck(cudaGetDeviceProperties(&p, 0));
    cudaStream_t s = 0;
    {
        const long n = 1L << 30;
        floatX *a = bench_alloc_x(n, 1), *b = bench_alloc_x(n, 2);
        const float ms = bench_median([&] { cudaCheck(cudaMemcpyAsync(b, a, n * sizeof(floatX), cudaMemcpyDeviceToDevice)); }, repeats);
        copy_gbs = 2.0 * n * sizeof(floatX) / ms / 1e6;
        cudaFree(a);
        cudaFree(b);
    }
    printf("device: %s; copy rate %.0f GB/s (read + write of 2 GiB); rows M = %d\n\n", p.name, copy_gbs, M);
    printf("| kernel | ms | MB moved | GB/s | floor ms | ÷ floor | calls a step | ms a step |\n|---|---|---|---|---|---|---|---|\n");
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.d_model = C; c.attn.heads = NH; c.attn.kv_heads = NH; c.attn.head_dim = HS; c.attn.rope = 1;
    c.attn.rope_theta = 10000.0f;
    { // RoPE on the (M, 3·d) projection rows
        floatX *qkv = bench_alloc_x((long)M * 3 * C, 3);
        float2 *tab = NULL;
        cudaCheck(cudaMalloc(&tab, (size_t)T * HS / 2 * sizeof(float2)));
        const float ms = bench_median([&] { attention_rope(qkv, M, T, tab, &c, 0, s); }, repeats);
        report("RoPE (table + rotation)", ms, (double)M * 2 * C * 2 * 2, 48);
        cudaFree(qkv);
        cudaFree(tab);
    }
    { // RMSNorm forward with the residual add, backward with and without accumulation
        floatX *a = bench_alloc_x((long)M * C, 4), *b = bench_alloc_x((long)M * C, 5), *res = bench_alloc_x((long)M * C, 6);
        floatX *out = bench_alloc_x((long)M * C, 7), *w = bench_alloc_x(C, 8), *dy = bench_alloc_x((long)M * C, 9);
        floatX *dx = bench_alloc_x((long)M * C, 10);
        float *rstd = NULL, *dw = NULL, *scratch = NULL;
        cudaCheck(cudaMalloc(&rstd, (size_t)M * sizeof(float)));
        cudaCheck(cudaMalloc(&dw, (size_t)C * sizeof(float)));
        cudaCheck(cudaMalloc(&scratch, rmsnorm_backward_scratch(M, C) * sizeof(float)));
        float ms = bench_median([&] { rmsnorm_forward(out, rstd, res, a, b, w, M, C, s); }, repeats);
        report("RMSNorm forward + residual", ms, (double)M * C * 2 * 4, 49);
        const double partials = 2.0 * rmsnorm_backward_scratch(M, C) * sizeof(float);
        ms = bench_median([&] { rmsnorm_backward(dx, dw, scratch, dy, res, w, rstd, M, C, 1, s); }, repeats);
        report("RMSNorm backward, accumulating", ms, (double)M * C * 2 * 4 + partials, 48);
        ms = bench_median([&] { rmsnorm_backward(dx, dw, scratch, dy, res, w, rstd, M, C, 0, s); }, repeats);
        report("RMSNorm backward", ms, (double)M * C * 2 * 3 + partials, 1);
        for (floatX *q : {a, b, res, out, w, dy, dx}) { cudaFree(q); }
        cudaFree(rstd); cudaFree(dw); cudaFree(scratch);
    }
    { // SwiGLU's pointwise halves
        floatX *up = bench_alloc_x((long)M * 2 * F, 11), *h = bench_alloc_x((long)M * F, 12);
        floatX *dup = bench_alloc_x((long)M * 2 * F, 13);
        float ms = bench_median([&] { swiglu_pointwise_forward(h, up, M, F, s); }, repeats);
        report("SwiGLU forward (pointwise)", ms, (double)M * 3 * F * 2, 24);
        ms = bench_median([&] { swiglu_pointwise_backward(dup, h, up, M, F, s); }, repeats);
        report("SwiGLU backward (pointwise)", ms, (double)M * 5 * F * 2, 24);
        cudaFree(up); cudaFree(h); cudaFree(dup);
    }
    { // the classifier's cross-entropy over (M, V) logits
        floatX *logits = bench_alloc_x((long)M * V, 14, 4.0f);
        float *losses = NULL, *lse = NULL;
        int *targets = NULL;
        cudaCheck(cudaMalloc(&losses, (size_t)M * sizeof(float)));
        cudaCheck(cudaMalloc(&lse, (size_t)M * sizeof(float)));
        cudaCheck(cudaMalloc(&targets, (size_t)M * sizeof(int)));
        cudaCheck(cudaMemset(targets, 0, (size_t)M * sizeof(int)));
        float ms = bench_median([&] { crossentropy_forward(losses, lse, logits, targets, M, V, V, s); }, repeats);
        report("cross-entropy forward", ms, (double)M * V * 2, 1);
        ms = bench_median([&] { crossentropy_backward_inplace(logits, lse, targets, 1.0f / M, M, V, V, 0, s); }, repeats);
        report("cross-entropy backward (in place)", ms, (double)M * V * 2 * 2, 1);
        cudaFree(logits); cudaFree(losses); cudaFree(lse); cudaFree(targets);
    }
    { // AdamW over every parameter
        floatX *params = bench_alloc_x((long)nparams, 15);
        float *master = NULL, *m = NULL, *v = NULL, *g = NULL;
        for (float **q : {&master, &m, &v, &g}) {
            cudaCheck(cudaMalloc(q, nparams * sizeof(float)));
            cudaCheck(cudaMemset(*q, 0, nparams * sizeof(float)));
        }
        const float ms = bench_median([&] {
            adamw_update(params, master, m, v, g, nparams, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f, s);
        }, repeats);
        report("AdamW", ms, (double)nparams * 30, 1);
        cudaFree(params); cudaFree(master); cudaFree(m); cudaFree(v); cudaFree(g);
    }
    return 0;
}
