/*
bench_attention.cu: times the flash-attention kernels (attention_kernels.cuh) and the cuDNN path of the trainer
(attention_cudnn.cuh: cuDNN's fused engines through its graph API, at the model's own layouts) at the issue's shapes; the peer,
PyTorch's scaled_dot_product_attention with its flash and cuDNN backends, runs in the same call
(dev/bench/attention_torch.py, scripts/gpu_attention.sh).

  build/bench_attention                 training shapes: B=8, H=16, HS in {64,128}, T in {1024,4096,16384}, causal,
                                        forward and forward+backward (and the backward's kernels one by one)
  build/bench_attention -d 1            decode: one query per sequence against caches of 1K..64K tokens, B in {1,64},
                                        NH = NKV = 16, HS = 128, beside the floor of reading the cache once
  build/bench_attention -v 1            the kernels' launch configurations side by side (B=8, H=16, T=4096, HS=64)
  -r N                                  repeats (median; default 20)

FLOPs (the FlashAttention convention): a causal forward is 2 matmuls of B·H·T²/2·HS multiply-adds = 2·B·H·T²·HS;
forward+backward counts 3.5× that (the backward's 5 matmuls are 2.5× the forward's 2).
Layout: q, k, v, o as (B, T, H·HS) rows (the model's), lse (B·T, H) fp32. Inputs are random normal, never zeros.
Timing: CUDA events around each call, 3 warm-up calls, median of the repeats.
*/
#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "attention_kernels.cuh"
#include "attention_cudnn.cuh"

typedef __nv_bfloat16 bf16;

__global__ void fill_random_kernel(bf16 *x, long n, uint32_t seed, float scale) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
        uint32_t g = h * 0x9e3779b9u + 0x7f4a7c15u;
        g ^= g >> 16; g *= 0x7feb352du; g ^= g >> 15;
        // a sum of two uniforms: roughly normal-shaped, mean 0
        const float u = ((h >> 8) * (1.0f / 16777216.0f)) + ((g >> 8) * (1.0f / 16777216.0f)) - 1.0f;
        x[i] = __float2bfloat16(u * scale);
    }
}
static void fill(bf16 *x, long n, uint32_t seed, float scale = 1.7f) {
    fill_random_kernel<<<1024, 256>>>(x, n, seed, scale);
    cudaCheck(cudaGetLastError());
}

template <class F> static float time_median(F f, int repeats) {
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a));
    cudaCheck(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) { f(); }
    std::vector<float> ms;
    for (int i = 0; i < repeats; i++) {
        cudaCheck(cudaEventRecord(a));
        f();
        cudaCheck(cudaEventRecord(b));
        cudaCheck(cudaEventSynchronize(b));
        float t = 0;
        cudaCheck(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    cudaCheck(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms[ms.size() / 2];
}

// random q, k, v, dO of (B, T, H·HS) rows and the outputs' buffers, the dims of a causal self-attention over them
struct TrainSet {
    bf16 *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse, *D;
    AttnDims d;
    TrainSet(int B, int H, int HS, int T) {
        const long n = (long)B * T * H * HS;
        for (bf16 **p : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) { cudaCheck(cudaMalloc(p, n * sizeof(bf16))); }
        cudaCheck(cudaMalloc(&lse, (long)B * T * H * sizeof(float)));
        cudaCheck(cudaMalloc(&D, (long)B * T * H * sizeof(float)));
        fill(q, n, 1); fill(k, n, 2); fill(v, n, 3, 1.0f); fill(dout, n, 4, 1.0f);
        memset(&d, 0, sizeof(d));
        d.B = B; d.Lq = d.Lk = T; d.NH = d.NKV = H; d.HS = HS; d.causal = 1; d.scale = 1.0f / sqrtf((float)HS);
        d.q_row = d.k_row = d.v_row = d.o_row = (long)H * HS;
        d.q_seq = d.k_seq = d.v_seq = d.o_seq = (long)T * H * HS;
    }
    ~TrainSet() {
        for (bf16 *p : {q, k, v, o, dout, dq, dk, dv}) { cudaFree(p); }
        cudaFree(lse);
        cudaFree(D);
    }
};

static void bench_train(int B, int H, int HS, int T, int repeats) {
    TrainSet ts(B, H, HS, T);
    bf16 *q = ts.q, *k = ts.k, *v = ts.v, *o = ts.o, *dout = ts.dout, *dq = ts.dq, *dk = ts.dk, *dv = ts.dv;
    float *lse = ts.lse, *D = ts.D;
    const AttnDims d = ts.d;
    const double flops = 2.0 * B * H * (double)T * T * HS;
    const float fwd = time_median([&] { flash_attention_forward(o, lse, q, k, v, &d, 0); }, repeats);
    const float bwd = time_median([&] { flash_attention_backward(dq, dk, dv, D, dout, q, k, v, o, lse, (long)B * T, &d, 0); }, repeats);
    // the backward's kernels one by one (same launches as the launcher's)
    float t_dkdv, t_dq;
    if (HS == 64) {
        dim3 g(CEIL_DIV(T, 128), H, B);
        t_dkdv = time_median([&] { flash_bwd_dkdv_kernel<64, 2, 2><<<g, 2 * FA_THREADS, fa_dkdv_smem(64, 2, 2)>>>(d, dk, dv, q, k, v, dout, lse, D); }, repeats);
        t_dq = time_median([&] { flash_bwd_dq_kernel<64, 2><<<g, FA_THREADS, fa_dq_smem(64, 2)>>>(d, dq, q, k, v, dout, lse, D); }, repeats);
    } else {
        dim3 g(CEIL_DIV(T, 64), H, B);
        t_dkdv = time_median([&] { flash_bwd_dkdv_kernel<128, 1, 1><<<g, FA_THREADS, fa_dkdv_smem(128, 1, 1)>>>(d, dk, dv, q, k, v, dout, lse, D); }, repeats);
        t_dq = time_median([&] { flash_bwd_dq_kernel<128, 1><<<g, FA_THREADS, fa_dq_smem(128, 1)>>>(d, dq, q, k, v, dout, lse, D); }, repeats);
    }
    if (HS == 128) { // the forward at 64 queries a CTA and 64-key tiles (no spills) beside the launcher's 128 / 32
        dim3 g(CEIL_DIV(T, 64), H, B);
        const size_t sm = (size_t)(64 + 4 * 64) * HS * 2;
        kernel_smem_limit(flash_fwd_kernel<128, 1, 64>, sm);
        const float f1 = time_median([&] { flash_fwd_kernel<128, 1, 64><<<g, FA_THREADS, sm>>>(d, q, k, v, o, lse); }, repeats);
        printf("       (forward at MT=1, 64-key tiles: %.3f ms)\n", f1);
    }
    printf("ours   B=%d H=%d HS=%3d T=%5d  fwd %8.3f ms %6.1f TFLOP/s   fwd+bwd %8.3f ms %6.1f TFLOP/s   (bwd: dkdv %.3f dq %.3f)\n",
           B, H, HS, T, fwd, flops / fwd / 1e9, fwd + bwd, 3.5 * flops / (fwd + bwd) / 1e9, t_dkdv, t_dq);
    // cuDNN's fused graphs through attention_cudnn.cuh, on these buffers and on q, k, v as the column blocks of one
    // (B, T, 3·H·HS) projection row (the trainer's layout)
    // both backward forms: dQ by fp32 atomics (the default) and the deterministic one (M2RNN_DETERMINISTIC=1)
    for (int det = 1; det >= 0; det--) {
        cudnn_deterministic = det;
        if (!cudnn_attention_takes(&d)) {
            printf("cudnn  B=%d H=%d HS=%3d T=%5d  not run: %s\n", B, H, HS, T, cudnn_attention_why(&d));
            continue;
        }
        const float cf = time_median([&] { cudnn_attention_forward(o, lse, q, k, v, &d, 0); }, repeats);
        const float cb = time_median([&] { cudnn_attention_backward(dq, dk, dv, D, dout, q, k, v, o, lse, &d, 0); }, repeats);
        printf("cudnn  B=%d H=%d HS=%3d T=%5d  fwd %8.3f ms %6.1f TFLOP/s   fwd+bwd %8.3f ms %6.1f TFLOP/s   %s\n", B,
               H, HS, T, cf, flops / cf / 1e9, cf + cb, 3.5 * flops / (cf + cb) / 1e9,
               cudnn_attention_deterministic(&d) ? "(deterministic)" : "(dQ by atomics)");
    }
    if (!cudnn_attention_takes(&d)) { return; }
    bf16 *qkv, *dqkv;
    const long W = 3L * H * HS, n = (long)B * T * W;
    cudaCheck(cudaMalloc(&qkv, n * sizeof(bf16)));
    cudaCheck(cudaMalloc(&dqkv, n * sizeof(bf16)));
    fill(qkv, n, 11);
    AttnDims pd = d;
    pd.q_row = pd.k_row = pd.v_row = W;
    pd.q_seq = pd.k_seq = pd.v_seq = (long)T * W;
    const long c1 = (long)H * HS, c2 = 2L * H * HS;
    if (cudnn_attention_takes(&pd)) {
        const float pf = time_median([&] { cudnn_attention_forward(o, lse, qkv, qkv + c1, qkv + c2, &pd, 0); }, repeats);
        const float pb = time_median([&] {
            cudnn_attention_backward(dqkv, dqkv + c1, dqkv + c2, D, dout, qkv, qkv + c1, qkv + c2, o, lse, &pd, 0);
        }, repeats);
        printf("cudnn  B=%d H=%d HS=%3d T=%5d  fwd %8.3f ms %6.1f TFLOP/s   fwd+bwd %8.3f ms %6.1f TFLOP/s   (qkv rows)\n",
               B, H, HS, T, pf, flops / pf / 1e9, pf + pb, 3.5 * flops / (pf + pb) / 1e9);
    } else {
        printf("cudnn  (qkv rows) not run: %s\n", cudnn_attention_why(&pd));
    }
    cudaFree(qkv);
    cudaFree(dqkv);
}

static void bench_decode(int B, int NH, int NKV, int HS, int context, int repeats) {
    const long cache = (long)B * context * NKV * HS;
    bf16 *q, *kc, *vc, *y;
    float *ws;
    int *lens;
    cudaCheck(cudaMalloc(&q, (long)B * NH * HS * sizeof(bf16)));
    cudaCheck(cudaMalloc(&y, (long)B * NH * HS * sizeof(bf16)));
    cudaCheck(cudaMalloc(&kc, cache * sizeof(bf16)));
    cudaCheck(cudaMalloc(&vc, cache * sizeof(bf16)));
    cudaCheck(cudaMalloc(&ws, flash_decode_workspace_floats(B, NH, HS, context) * sizeof(float)));
    cudaCheck(cudaMemset(ws, 0, flash_decode_workspace_floats(B, NH, HS, context) * sizeof(float))); // (the merge's counters)
    cudaCheck(cudaMalloc(&lens, B * sizeof(int)));
    std::vector<int> hl(B, context);
    cudaCheck(cudaMemcpy(lens, hl.data(), B * sizeof(int), cudaMemcpyHostToDevice));
    fill(q, (long)B * NH * HS, 5); fill(kc, cache, 6); fill(vc, cache, 7, 1.0f);
    const float ms = time_median([&] {
        flash_attention_decode(y, (long)NH * HS, ws, (long)flash_decode_workspace_floats(1, NH, HS, context), q, (long)NH * HS, kc, vc, (long)context * NKV * HS, lens, 0, B, NH, NKV, HS, context,
                               1.0f / sqrtf((float)HS), 0);
    }, repeats);
    const double bytes = 2.0 * cache * sizeof(bf16);
    printf("decode B=%2d NH=%d NKV=%d HS=%d context=%6d  %8.4f ms  %7.1f GB/s of the cache (%.0f MB)\n", B, NH, NKV, HS,
           context, ms, bytes / ms / 1e6, bytes / 1e6);
    cudaFree(q); cudaFree(y); cudaFree(kc); cudaFree(vc); cudaFree(ws); cudaFree(lens);
}

// the launch configurations side by side at one shape (HS = 64): which MT / QS the launcher should pick
static void bench_variants(int B, int H, int T, int repeats) {
    const int HS = 64;
    TrainSet ts(B, H, HS, T);
    bf16 *q = ts.q, *k = ts.k, *v = ts.v, *o = ts.o, *dout = ts.dout, *dq = ts.dq, *dk = ts.dk, *dv = ts.dv;
    float *lse = ts.lse, *D = ts.D;
    const AttnDims d = ts.d;
    flash_attention_forward(o, lse, q, k, v, &d, 0);
    flash_attention_backward(dq, dk, dv, D, dout, q, k, v, o, lse, (long)B * T, &d, 0);
#define VAR(label, kernel, rows, threads, smem, ...)                                                                   \
    {                                                                                                                \
        kernel_smem_limit(kernel, smem);                                                                             \
        dim3 g(CEIL_DIV(T, rows), H, B);                                                                             \
        printf("variant %-28s %8.3f ms\n", label, time_median([&] { kernel<<<g, threads, smem>>>(__VA_ARGS__); }, repeats)); \
    }
    VAR("fwd MT=1", (flash_fwd_kernel<64, 1, 64>), 64, FA_THREADS, (size_t)(64 + 256) * HS * 2, d, q, k, v, o, lse);
    VAR("fwd MT=2", (flash_fwd_kernel<64, 2, 64>), 128, FA_THREADS, fa_fwd_smem(64, 2), d, q, k, v, o, lse);
    VAR("dq MT=1", (flash_bwd_dq_kernel<64, 1>), 64, FA_THREADS, fa_dq_smem(64, 1), d, dq, q, k, v, dout, lse, D);
    VAR("dq MT=2", (flash_bwd_dq_kernel<64, 2>), 128, FA_THREADS, fa_dq_smem(64, 2), d, dq, q, k, v, dout, lse, D);
    VAR("dkdv MT=1 QS=1", (flash_bwd_dkdv_kernel<64, 1, 1>), 64, FA_THREADS, fa_dkdv_smem(64, 1, 1), d, dk, dv, q, k, v, dout, lse, D);
    VAR("dkdv MT=1 QS=2", (flash_bwd_dkdv_kernel<64, 1, 2>), 64, 2 * FA_THREADS, fa_dkdv_smem(64, 1, 2), d, dk, dv, q, k, v, dout, lse, D);
    VAR("dkdv MT=2 QS=2", (flash_bwd_dkdv_kernel<64, 2, 2>), 128, 2 * FA_THREADS, fa_dkdv_smem(64, 2, 2), d, dk, dv, q, k, v, dout, lse, D);
#undef VAR
}

// a large device-to-device copy: the bandwidth the decode floor is measured against
static void bench_copy(int repeats) {
    const long n = 1L << 30; // 2 GiB of bf16
    bf16 *a, *b;
    cudaCheck(cudaMalloc(&a, n * sizeof(bf16)));
    cudaCheck(cudaMalloc(&b, n * sizeof(bf16)));
    fill(a, n, 9);
    const float ms = time_median([&] { cudaCheck(cudaMemcpyAsync(b, a, n * sizeof(bf16), cudaMemcpyDeviceToDevice)); }, repeats);
    printf("copy   %.0f GB/s (read + write of 2 GiB)\n", 2.0 * n * sizeof(bf16) / ms / 1e6);
    cudaFree(a);
    cudaFree(b);
}

#ifndef TESTING
int main(int argc, char **argv) {
    int decode = 0, repeats = 20, variants = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-d")) { decode = atoi(argv[i + 1]); }
        else if (!strcmp(argv[i], "-r")) { repeats = atoi(argv[i + 1]); }
        else if (!strcmp(argv[i], "-v")) { variants = atoi(argv[i + 1]); }
        else { fail_with_hint("build/bench_attention [-d 0|1] [-r repeats]", "unknown flag %s", argv[i]); }
    }
    cudaDeviceProp p;
    cudaCheck(cudaGetDeviceProperties(&p, 0));
    printf("device: %s\n", p.name);
    if (variants) {
        bench_variants(8, 16, 4096, repeats);
    } else if (!decode) {
        for (int HS : {64, 128}) {
            for (int T : {1024, 4096, 16384}) { bench_train(8, 16, HS, T, repeats); }
        }
    } else {
        bench_copy(repeats);
        for (int B : {1, 16, 64}) { // the 410M models' attention layers: 16 heads of 64
            for (int ctx : {1024, 4096}) { bench_decode(B, 16, 16, 64, ctx, repeats); }
        }
        for (int B : {1, 64}) {
            for (int ctx : {1024, 4096, 16384, 65536}) { bench_decode(B, 16, 16, 128, ctx, repeats); }
        }
        bench_decode(1, 32, 8, 128, 16384, repeats);  // GQA: 4 query heads a kv head
        bench_decode(64, 32, 8, 128, 16384, repeats);
    }
    return 0;
}
#endif
