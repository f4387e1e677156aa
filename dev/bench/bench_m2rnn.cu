/*
bench_m2rnn.cu: times the M²RNN GPU kernels (m2rnn_kernels.cuh) at the paper's shapes and prints the floors they are
measured against. dev/bench/m2rnn_authors.py times the authors' Triton kernel in the same run (scripts/gpu_m2rnn.sh).

  build/bench_m2rnn                       the paper's shapes: B in {4,8}, T=4096, N in {84,132}, K=64, V=16, Nq=1
  build/bench_m2rnn -b 8 -t 4096 -n 84    one shape (also -k K, -v V, -q Nq, -r repeats)
  build/bench_m2rnn -u 1                  special-function-unit rates per SM per clock (tanh.approx.f32,
                                          tanh.approx.f16x2, ex2.approx.f32) beside FFMA's, for the floors
  build/bench_m2rnn -u 2                  which instruction kinds share MUFU's issue path (clocks per warp-iteration
                                          of mixes of tanh, ld.shared, movmatrix, shfl, mma, FFMA)
  build/bench_m2rnn -u 3                  the forward step's dependency chain piece by piece: clocks a step
                                          for 1..8 chains per SM sub-partition
  build/bench_m2rnn -s 1 [-n 84]          the decode step kernel (m2rnn_step) at B in {1,16,64}: µs a layer in a graph of
                                          21 layers (each its own state, as a decode step's), the state's GB/s
  build/bench_m2rnn -x 1 -b 8 -n 84      one training forward + backward only (the launcher's choices), for ncu
  build/bench_m2rnn -d DIR                writes a small problem's inputs and our outputs to DIR (raw little-endian
                                          arrays + meta.txt) for the float64 / authors' comparison in m2rnn_authors.py

Per shape, the second line also times each heads-per-CTA setting with the Z-stash backward's sub-chunk length forced
(8 tokens, and 16 at one head a CTA; the first line's "bwd" is the launcher's pick).
Timing: CUDA events around each call, 3 warm-up calls, median of -r repeats (default 20); each backward runs after its
own training forward, outside its timing (a deterministic backward spends the checkpoints; M2RNN_DETERMINISTIC=1 times
that mode). Inputs are random (q, k, v inside one (tok, conv_dim) buffer as the trainer lays them out), never zeros.
"Extra memory" of the backward is the workspace (checkpoints every 16 tokens, fp32 dq/dk accumulators or in
deterministic mode the window counts and, where they do not fit over the checkpoints, dk's partial slots, and dW
partials), the only device memory the op allocates beyond its inputs and outputs.
*/
#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "m2rnn_kernels.cuh"
#include "bench_common.cuh"

static uint64_t rng = 0x1234567ull;
static float urand() { // xorshift64* -> [0,1)
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)((rng * 2685821657736338717ull) >> 40) / 16777216.0f;
}
static float nrand() {
    float u1 = fmaxf(urand(), 1e-7f), u2 = urand();
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}
static floatX bf(float x) { return __float2bfloat16(x); }
static float bfr(float x) { return __bfloat162float(__float2bfloat16(x)); } // round to a bf16-representable value

struct Inputs {
    M2RNNDims d;
    int conv_dim;
    floatX *conv, *W, *dy, *dconv, *y;
    float *f, *h0, *hT, *dhT, *df, *dW, *dh0;
    void *ws;
};

static void make(Inputs &in, int B, int T, int N, int Nq, int K, int V, bool all_bf16_exact) {
    in.conv_dim = 2 * Nq * K + N * V;
    const long ntok = (long)B * T;
    std::vector<floatX> conv((size_t)ntok * in.conv_dim), W((size_t)N * V * V), dy((size_t)ntok * N * V);
    std::vector<float> f((size_t)ntok * N), st((size_t)B * N * K * V), dst(st.size());
    for (auto &x : conv) {
        float z = nrand();
        x = bf(z / (1.0f + expf(-z)));
    }
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < V; i++) {
            for (int j = 0; j < V; j++) { W[((size_t)n * V + i) * V + j] = bf((i == j ? 0.7f : 0.0f) + 0.05f * nrand()); }
        }
    }
    for (auto &x : dy) { x = bf(nrand()); }
    for (auto &x : f) { // the gate value, some heads slow (f near 1), some fast
        float s = 1.0f / (1.0f + expf(-(1.5f + 2.0f * nrand())));
        x = all_bf16_exact ? bfr(s) : s;
    }
    for (auto &x : st) { x = bfr(0.5f * nrand()); }
    for (auto &x : dst) { x = bfr(0.5f * nrand()); }
    M2RNNDims d = {B, T, N, Nq, K, V, in.conv_dim, in.conv_dim, in.conv_dim, NULL};
    in.d = d;
    cudaCheck(cudaMalloc(&in.conv, conv.size() * sizeof(floatX)));
    cudaCheck(cudaMalloc(&in.dconv, conv.size() * sizeof(floatX)));
    cudaCheck(cudaMalloc(&in.W, W.size() * sizeof(floatX)));
    cudaCheck(cudaMalloc(&in.dy, dy.size() * sizeof(floatX)));
    cudaCheck(cudaMalloc(&in.y, dy.size() * sizeof(floatX)));
    cudaCheck(cudaMalloc(&in.f, f.size() * sizeof(float)));
    cudaCheck(cudaMalloc(&in.df, f.size() * sizeof(float)));
    cudaCheck(cudaMalloc(&in.h0, st.size() * sizeof(float)));
    cudaCheck(cudaMalloc(&in.hT, st.size() * sizeof(float)));
    cudaCheck(cudaMalloc(&in.dhT, st.size() * sizeof(float)));
    cudaCheck(cudaMalloc(&in.dh0, st.size() * sizeof(float)));
    cudaCheck(cudaMalloc(&in.dW, W.size() * sizeof(float)));
    size_t ws = 0; // enough for every heads-per-CTA setting bench_shape forces (deterministic mode sizes by it)
    for (int h : {1, 2, 0}) {
        m2rnn_hpc_override = h;
        ws = std::max(ws, m2rnn_workspace_bytes(&in.d));
    }
    cudaCheck(cudaMalloc(&in.ws, ws));
    cudaCheck(cudaMemcpy(in.conv, conv.data(), conv.size() * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(in.W, W.data(), W.size() * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(in.dy, dy.data(), dy.size() * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(in.f, f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(in.h0, st.data(), st.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(in.dhT, dst.data(), dst.size() * sizeof(float), cudaMemcpyHostToDevice));
}

static void release(Inputs &in) {
    cudaCheck(cudaFree(in.conv));
    cudaCheck(cudaFree(in.dconv));
    cudaCheck(cudaFree(in.W));
    cudaCheck(cudaFree(in.dy));
    cudaCheck(cudaFree(in.y));
    cudaCheck(cudaFree(in.f));
    cudaCheck(cudaFree(in.df));
    cudaCheck(cudaFree(in.h0));
    cudaCheck(cudaFree(in.hT));
    cudaCheck(cudaFree(in.dhT));
    cudaCheck(cudaFree(in.dh0));
    cudaCheck(cudaFree(in.dW));
    cudaCheck(cudaFree(in.ws));
}

static void fwd(Inputs &in, bool train) {
    const M2RNNDims *d = &in.d;
    const floatX *q = in.conv, *k = in.conv + d->Nq * d->K, *v = in.conv + 2 * d->Nq * d->K;
    m2rnn_forward(in.y, in.hT, train ? in.ws : nullptr, q, k, v, in.f, in.W, nullptr, d, 0);
}
static void bwd(Inputs &in) {
    const M2RNNDims *d = &in.d;
    const floatX *q = in.conv, *k = in.conv + d->Nq * d->K, *v = in.conv + 2 * d->Nq * d->K;
    floatX *dq = in.dconv, *dk = in.dconv + d->Nq * d->K, *dv = in.dconv + 2 * d->Nq * d->K;
    m2rnn_backward(dq, dk, dv, in.df, in.dW, nullptr, in.ws, in.dy, nullptr, q, k, v, in.f, in.W, 1.0f, d, 0);
}

// a backward's median: each after its own training forward, untimed (a deterministic backward spends the checkpoints)
static double time_bwd(Inputs &in, int reps) {
    return median_ms([&] { bwd(in); }, reps, 0, [&] { fwd(in, true); });
}

// Throughput of one instruction kind: every thread runs 8 independent chains of x <- op(x) (the chains keep each
// warp's issue independent of the unit's latency); 8 CTAs of 256 threads per SM. OP 0: FFMA (the method's check:
// 128 per clock per SM expected), 1: tanh.approx.f32, 2: tanh.approx.f16x2 (two values counted per instruction),
// 3: ex2.approx.f32 of -x (stays in (0, 1]), 4: tanh.approx.bf16x2 (two values counted per instruction).
// NOTES.md, "Round 3" and "Round 4": all four special functions run at 16 per clock per SM on sm_90a.
template <int OP> __global__ void sfu_rate_kernel(float *out, int iters) {
    float x[8];
    uint32_t h[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        x[i] = 0.25f + 1e-4f * threadIdx.x + 0.07f * i;
        h[i] = m2rnn_detail::pack_f16x2(x[i], -x[i]);
    }
    for (int it = 0; it < iters; it++) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if constexpr (OP == 0) { x[i] = fmaf(x[i], 0.999f, 1e-3f); }
            if constexpr (OP == 1) { asm volatile("tanh.approx.f32 %0, %0;" : "+f"(x[i])); }
            if constexpr (OP == 2) { asm volatile("tanh.approx.f16x2 %0, %0;" : "+r"(h[i])); }
            if constexpr (OP == 3) { asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(x[i]) : "f"(-x[i])); }
            if constexpr (OP == 4) { asm volatile("tanh.approx.bf16x2 %0, %0;" : "+r"(h[i])); }
        }
    }
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) { sum += x[i] + __uint_as_float(h[i] & 0x3fffffffu); }
    if (sum == 1234.5f) { out[0] = sum; } // never true; keeps the chains alive
}

static void sfu_rates(const cudaDeviceProp &prop, double clock_ghz) {
    float *out;
    cudaCheck(cudaMalloc(&out, sizeof(float)));
    const int blocks = prop.multiProcessorCount * 8, threads = 256, iters = 4096;
    const char *names[5] = {"FFMA", "tanh.approx.f32", "tanh.approx.f16x2 (per value)", "ex2.approx.f32",
                            "tanh.approx.bf16x2 (per value)"};
    void (*const kernels[5])(float *, int) = {sfu_rate_kernel<0>, sfu_rate_kernel<1>, sfu_rate_kernel<2>,
                                              sfu_rate_kernel<3>, sfu_rate_kernel<4>};
    for (int op = 0; op < 5; op++) {
        auto run = [&] {
            kernels[op]<<<blocks, threads>>>(out, iters);
            cudaCheck(cudaGetLastError());
        };
        const double ms = median_ms(run, 5, 0);
        const double values = (double)blocks * threads * iters * 8 * (op == 2 || op == 4 ? 2 : 1);
        printf("rate %-30s %7.1f per clock per SM (at %.2f GHz; %.3f ms)\n", names[op],
               values / (ms * 1e-3 * clock_ghz * 1e9 * prop.multiProcessorCount), clock_ghz, ms);
    }
    cudaCheck(cudaFree(out));
}

// Which units share an issue path with MUFU.TANH (NOTES.md, round 4). Each warp runs ITERS iterations of a body with
// NM tanh.approx.f32, NL ld.shared.b32, NX movmatrix, NS shfl.sync, NH mma m16n8k16 and NF FFMA, every kind in
// independent chains (8 CTAs of 256 threads per SM, so latency is hidden); the time per warp-iteration per SM
// sub-partition, in clocks, shows whether two kinds overlap (max of the two alone) or add (their sum).
template <int NM, int NL, int NX, int NS, int NH, int NF> __global__ void pipe_mix_kernel(float *out, int iters) {
    __shared__ uint32_t buf[1024];
    for (int i = threadIdx.x; i < 1024; i += blockDim.x) { buf[i] = 0x3f800000u + i; }
    __syncthreads();
    float x[8], y[16];
    uint32_t l = 0, mv[4], sh[4], a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
    float acc[4][4] = {};
#pragma unroll
    for (int i = 0; i < 8; i++) { x[i] = 0.25f + 1e-4f * threadIdx.x + 0.07f * i; }
#pragma unroll
    for (int i = 0; i < 16; i++) { y[i] = 1e-3f * i; }
#pragma unroll
    for (int i = 0; i < 4; i++) { mv[i] = sh[i] = threadIdx.x * 7u + i; }
    uint32_t addr = m2rnn_detail::smem_addr(buf + (threadIdx.x & 31));
    for (int it = 0; it < iters; it++) {
#pragma unroll
        for (int i = 0; i < NM; i++) { asm volatile("tanh.approx.f32 %0, %0;" : "+f"(x[i % 8])); }
#pragma unroll
        for (int i = 0; i < NL; i++) {
            uint32_t r;
            asm volatile("ld.shared.b32 %0, [%1];" : "=r"(r) : "r"(addr + 128u * (uint32_t)i));
            l ^= r;
        }
#pragma unroll
        for (int i = 0; i < NX; i++) {
            asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %0;" : "+r"(mv[i % 4]));
        }
#pragma unroll
        for (int i = 0; i < NS; i++) {
            asm volatile("shfl.sync.bfly.b32 %0, %0, 4, 0x1f, 0xffffffff;" : "+r"(sh[i % 4]));
        }
#pragma unroll
        for (int i = 0; i < NH; i++) { m2rnn_detail::mma16816(acc[i % 4], a, a[0], a[1]); }
#pragma unroll
        for (int i = 0; i < NF; i++) { y[i % 16] = fmaf(y[i % 16], 0.999f, 1e-3f); }
    }
    float sum = (float)l;
#pragma unroll
    for (int i = 0; i < 8; i++) { sum += x[i]; }
#pragma unroll
    for (int i = 0; i < 16; i++) { sum += y[i]; }
#pragma unroll
    for (int i = 0; i < 4; i++) { sum += (float)(mv[i] ^ sh[i]) + acc[i][0] + acc[i][1] + acc[i][2] + acc[i][3]; }
    if (sum == 1234.5f) { out[0] = sum; } // never true; keeps every chain alive
}

static void pipe_mix(const cudaDeviceProp &prop, double clock_ghz) {
    float *out;
    cudaCheck(cudaMalloc(&out, sizeof(float)));
    const int blocks = prop.multiProcessorCount * 8, threads = 256, iters = 2048;
    auto report = [&](const char *name, auto kernel) {
        auto run = [&] {
            kernel<<<blocks, threads>>>(out, iters);
            cudaCheck(cudaGetLastError());
        };
        const double ms = median_ms(run, 5, 0);
        const double warp_iters_per_smsp = (double)blocks * threads / 32 * iters / (prop.multiProcessorCount * 4);
        printf("mix %-40s %7.1f clocks per warp-iteration per SM sub-partition\n", name,
               ms * 1e-3 * clock_ghz * 1e9 / warp_iters_per_smsp);
    };
    report("8 tanh", pipe_mix_kernel<8, 0, 0, 0, 0, 0>);
    report("8 lds.32", pipe_mix_kernel<0, 8, 0, 0, 0, 0>);
    report("8 tanh + 8 lds.32", pipe_mix_kernel<8, 8, 0, 0, 0, 0>);
    report("4 movmatrix", pipe_mix_kernel<0, 0, 4, 0, 0, 0>);
    report("8 tanh + 4 movmatrix", pipe_mix_kernel<8, 0, 4, 0, 0, 0>);
    report("4 shfl", pipe_mix_kernel<0, 0, 0, 4, 0, 0>);
    report("8 tanh + 4 shfl", pipe_mix_kernel<8, 0, 0, 4, 0, 0>);
    report("4 mma m16n8k16", pipe_mix_kernel<0, 0, 0, 0, 4, 0>);
    report("8 tanh + 4 mma", pipe_mix_kernel<8, 0, 0, 0, 4, 0>);
    report("32 ffma", pipe_mix_kernel<0, 0, 0, 0, 0, 32>);
    report("8 tanh + 32 ffma", pipe_mix_kernel<8, 0, 0, 0, 0, 32>);
    report("8 tanh + 7 lds + 4 movm + 4 mma + 32 ffma", pipe_mix_kernel<8, 7, 4, 0, 4, 32>);
    cudaCheck(cudaFree(out));
}

// Latency of the forward step's dependency chain, piece by piece (NOTES.md, round 5). Each warp runs one chain of
// ITERS steps; WPS warps per SM sub-partition (one CTA of 4*WPS warps per SM), so WPS=1 is a lone chain's latency and
// larger WPS shows what chains sharing a sub-partition cost each other. MODE: 0 accumulator chain of one m16n8k16
// MMA; 1 two MMAs (the step's H W) whose result is repacked to bf16 as the next A operand; 2 = 1 + 8 tanh before the
// pack; 3 = 2 + the gate (S = (1-f) Z + f S); 4 = 3 + the k v^T MMA (m16n8k8, independent of the chain) as the
// accumulator's start; 5 = 4 + y (4 movmatrix + one MMA into a separate tile); 6 eight dependent tanh; 7 eight
// dependent FFMA.
template <int MODE> __global__ void chain_kernel(float *out, int iters) {
    using namespace m2rnn_detail;
    const int lane = threadIdx.x & 31;
    float S[2][4], Y[4] = {0.0f, 0.0f, 0.0f, 0.0f}, x = 0.1f + 1e-3f * lane;
    uint32_t aS[1][4], bW[1][2][2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
#pragma unroll
        for (int e = 0; e < 4; e++) { S[h][e] = 0.01f * (lane + 4 * h + e); }
        // distinct per tile, so the compiler cannot merge the two tiles' MMAs and tanh
        bW[0][h][0] = pack_raw(__float2bfloat16(0.05f + 0.001f * lane - 0.01f * h), __float2bfloat16(-0.04f));
        bW[0][h][1] = pack_raw(__float2bfloat16(0.03f + 0.02f * h), __float2bfloat16(0.02f - 0.001f * lane));
    }
    pack_frag<16>(aS, S);
    const uint32_t kv = aS[0][1] ^ 0x00010001u, vb = aS[0][2];
    const float fval = 0.9f, gate = 0.1f;
    for (int it = 0; it < iters; it++) {
        if constexpr (MODE == 0) {
            mma16816(S[0], aS[0], bW[0][0][0], bW[0][0][1]);
        } else if constexpr (MODE == 6) {
#pragma unroll
            for (int i = 0; i < 8; i++) { asm volatile("tanh.approx.f32 %0, %0;" : "+f"(x)); }
        } else if constexpr (MODE == 7) {
#pragma unroll
            for (int i = 0; i < 8; i++) { x = fmaf(x, 0.999f, 1e-3f); }
        } else {
            float Z[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                Z[h][0] = Z[h][1] = Z[h][2] = Z[h][3] = 0.0f;
                if constexpr (MODE >= 4) { mma16808(Z[h], kv, vb, (uint32_t)it & 0x00ff00ffu); }
                mma16816(Z[h], aS[0], bW[0][h][0], bW[0][h][1]);
                if constexpr (MODE >= 2) {
#pragma unroll
                    for (int e = 0; e < 4; e++) { Z[h][e] = tanh_fast(Z[h][e]); }
                }
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
#pragma unroll
                for (int e = 0; e < 4; e++) { S[h][e] = MODE >= 3 ? fmaf(gate, Z[h][e], fval * S[h][e]) : Z[h][e]; }
            }
            pack_frag<16>(aS, S);
            if constexpr (MODE >= 5) {
                const uint32_t aT[4] = {trans8x8(aS[0][0]), trans8x8(aS[0][2]), trans8x8(aS[0][1]),
                                        trans8x8(aS[0][3])};
                mma16816(Y, aT, lane == (it & 7) ? vb : 0u, kv);
            }
        }
    }
    const float sum = x + S[0][0] + S[1][3] + Y[0] + __uint_as_float(aS[0][0] & 0x3fffffffu);
    if (sum == 1234.5f) { out[0] = sum; } // never true; keeps every chain alive
}

static void chain_latency(const cudaDeviceProp &prop, double clock_ghz) {
    float *out;
    cudaCheck(cudaMalloc(&out, sizeof(float)));
    const int iters = 16384;
    const char *names[8] = {"mma accumulator chain", "2 mma + repack", "+ 8 tanh", "+ gate", "+ k v^T mma",
                            "+ y (4 movmatrix + mma)", "8 dependent tanh", "8 dependent ffma"};
    void (*const kernels[8])(float *, int) = {chain_kernel<0>, chain_kernel<1>, chain_kernel<2>, chain_kernel<3>,
                                              chain_kernel<4>, chain_kernel<5>, chain_kernel<6>, chain_kernel<7>};
    for (int mode = 0; mode < 8; mode++) {
        printf("chain %-26s", names[mode]);
        for (int wps : {1, 2, 3, 4, 6, 8}) {
            auto run = [&] {
                kernels[mode]<<<prop.multiProcessorCount, 128 * wps>>>(out, iters);
                cudaCheck(cudaGetLastError());
            };
            const double clocks = median_ms(run, 5, 0) * 1e-3 * clock_ghz * 1e9 / iters;
            printf(" | %d/SMSP %6.1f (%5.1f a chain)", wps, clocks, clocks / wps);
        }
        printf("  clocks a step\n");
    }
    cudaCheck(cudaFree(out));
}

static void bench_shape(int B, int T, int N, int Nq, int K, int V, int reps, const cudaDeviceProp &prop,
                        double clock_ghz) {
    Inputs in;
    make(in, B, T, N, Nq, K, V, false);
    // heads per CTA (CTA granularity vs dq/dk adders) x the Z-stash backward's sub-chunk (V=16: 8 tokens, and 16 at one
    // head a CTA), each forced; then the launcher's own pick
    double hpc_f[3] = {0, 0, 0}, hz_b[3][2] = {{0, 0}, {0, 0}, {0, 0}};
    m2rnn_hpc_override = 2; // (the launcher keeps 1 where 2 heads a CTA are not legal)
    const bool two_ok = m2rnn_heads_per_cta(&in.d) == 2;
    for (int h = 1; h <= (two_ok ? 2 : 1); h++) {
        m2rnn_hpc_override = h;
        hpc_f[h] = median_ms([&] { fwd(in, false); }, reps, 0);
        for (int z = 0; z < 2; z++) {
            m2rnn_sub_override = z ? 16 : 8;
            if (m2rnn_backward_sub(&in.d, h) != m2rnn_sub_override) { continue; } // (not legal here)
            hz_b[h][z] = time_bwd(in, reps);
        }
        m2rnn_sub_override = 0;
    }
    m2rnn_hpc_override = 0;
    const double f_inf = median_ms([&] { fwd(in, false); }, reps, 0);
    const double f_tr = median_ms([&] { fwd(in, true); }, reps, 0);
    const double b_ms = time_bwd(in, reps);
    const double fb = median_ms([&] { fwd(in, true); bwd(in); }, reps, 0);
    // occupancy of the two recurrence kernels at this shape (the backward: the launcher's build)
    const int hpc = m2rnn_heads_per_cta(&in.d, m2rnn_deterministic_on()), threads = hpc * (K / 16) * 32;
    const int sub = m2rnn_backward_sub(&in.d, hpc);
    int occ_f = 0, occ_b = 0;
    if (V == 16 && threads <= 256) {
        if (hpc == 2) {
            occ_f = m2rnn_ctas_per_sm(m2rnn_forward_kernel<16, 2, false>, threads, m2rnn_forward_smem(&in.d, 2));
            occ_b = m2rnn_ctas_per_sm(m2rnn_backward_kernel<16, 2, false, true>, threads,
                                      m2rnn_backward_smem(&in.d, 2, 8));
        } else {
            occ_f = m2rnn_ctas_per_sm(m2rnn_forward_kernel<16, 1, false>, threads, m2rnn_forward_smem(&in.d, 1));
            occ_b = sub == 16 ? m2rnn_ctas_per_sm(m2rnn_backward_kernel<16, 1, false, true, false, 16>, threads,
                                                  m2rnn_backward_smem(&in.d, 1, 16))
                              : m2rnn_ctas_per_sm(m2rnn_backward_kernel<16, 1, false, true>, threads,
                                                  m2rnn_backward_smem(&in.d, 1, 8));
        }
    }
    const long ctas = (long)B * N / hpc;
    const double tanh_count = (double)B * T * N * K * V;
    const double sfu_ms = tanh_count / (16.0 * prop.multiProcessorCount * clock_ghz * 1e9) * 1e3;
    const double ws_gib = m2rnn_workspace_bytes(&in.d) / 1073741824.0;
    printf("ours  B=%d T=%d N=%d K=%d V=%d Nq=%d | fwd(infer) %.3f ms | fwd(train) %.3f ms | bwd %.3f ms | fwd+bwd "
           "%.3f ms | %.2f Mtok/s fwd+bwd | bwd extra mem %.3f GiB | CTAs %ld, CTAs/SM fwd %d bwd %d (%d warps each, "
           "%d-token sub-chunks) | SFU floor (1x tanh) %.3f ms\n",
           B, T, N, K, V, Nq, f_inf, f_tr, b_ms, fb, (double)B * T / (fb * 1e-3) / 1e6, ws_gib, ctas, occ_f, occ_b,
           threads / 32, m2rnn_uses_zstash(&in.d) ? sub : 8, sfu_ms);
    printf("      heads/CTA=1: fwd %.3f ms, bwd 8-token sub-chunks %.3f / 16 %.3f ms | heads/CTA=2: fwd %.3f ms, bwd "
           "8-token %.3f ms (0: not built)\n",
           hpc_f[1], hz_b[1][0], hz_b[1][1], hpc_f[2], hz_b[2][0]);
    fflush(stdout);
    release(in);
}

template <class T> static void dump(const char *dir, const char *name, const T *dptr, size_t n) {
    std::vector<T> h(n);
    cudaCheck(cudaMemcpy(h.data(), dptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *fp = fopenCheck(path, "wb");
    fwriteCheck(h.data(), sizeof(T), n, fp);
    fcloseCheck(fp);
}
// columns [col, col+width) of a (ntok, ld) device buffer, written packed
static void dump_cols(const char *dir, const char *name, const floatX *dbase, int col, long ntok, int width, int ld) {
    std::vector<floatX> all((size_t)ntok * ld), out((size_t)ntok * width);
    cudaCheck(cudaMemcpy(all.data(), dbase, all.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (long t = 0; t < ntok; t++) { memcpy(&out[t * width], &all[t * ld + col], width * sizeof(floatX)); }
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *fp = fopenCheck(path, "wb");
    fwriteCheck(out.data(), sizeof(floatX), out.size(), fp);
    fcloseCheck(fp);
}

static void dump_problem(const char *dir, int B, int T, int N, int Nq, int K, int V) {
    create_dir_if_not_exists(dir);
    Inputs in;
    make(in, B, T, N, Nq, K, V, true);
    const M2RNNDims *d = &in.d;
    const long ntok = (long)B * T;
    const int c = in.conv_dim, QK = Nq * K;
    const floatX *q = in.conv, *k = in.conv + QK, *v = in.conv + 2 * QK;
    m2rnn_forward(in.y, in.hT, in.ws, q, k, v, in.f, in.W, in.h0, d, 0);
    m2rnn_backward(in.dconv, in.dconv + QK, in.dconv + 2 * QK, in.df, in.dW, in.dh0, in.ws, in.dy, in.dhT, q, k, v,
                   in.f, in.W, 0.0f, d, 0);
    cudaCheck(cudaDeviceSynchronize());
    const size_t S = (size_t)B * N * K * V;
    dump_cols(dir, "q.bin", in.conv, 0, ntok, QK, c);
    dump_cols(dir, "k.bin", in.conv, QK, ntok, QK, c);
    dump_cols(dir, "v.bin", in.conv, 2 * QK, ntok, N * V, c);
    dump(dir, "f.bin", in.f, (size_t)ntok * N);
    dump(dir, "W.bin", in.W, (size_t)N * V * V);
    dump(dir, "h0.bin", in.h0, S);
    dump(dir, "dy.bin", in.dy, (size_t)ntok * N * V);
    dump(dir, "dhT.bin", in.dhT, S);
    dump(dir, "y.bin", in.y, (size_t)ntok * N * V);
    dump(dir, "hT.bin", in.hT, S);
    dump_cols(dir, "dq.bin", in.dconv, 0, ntok, QK, c);
    dump_cols(dir, "dk.bin", in.dconv, QK, ntok, QK, c);
    dump_cols(dir, "dv.bin", in.dconv, 2 * QK, ntok, N * V, c);
    dump(dir, "df.bin", in.df, (size_t)ntok * N);
    dump(dir, "dW.bin", in.dW, (size_t)N * V * V);
    dump(dir, "dh0.bin", in.dh0, S);
    char path[512];
    snprintf(path, sizeof(path), "%s/meta.txt", dir);
    FILE *fp = fopenCheck(path, "w");
    fprintf(fp, "%d %d %d %d %d %d\n", B, T, N, Nq, K, V);
    fcloseCheck(fp);
    printf("wrote inputs and our outputs for B=%d T=%d N=%d Nq=%d K=%d V=%d to %s\n", B, T, N, Nq, K, V, dir);
    release(in);
}

// The decode step kernel as a decode step runs it: L layers, each its own (B,N,K,V) fp32 state and inputs (so the
// states do not stay in L2 from one layer to the next, as in a 24-layer model), captured in one graph of L launches.
// Floor: the states are read and written once a step, 2·B·N·K·V·4 bytes a layer.
static void bench_step(int N, int Nq, int K, int V, int reps) {
    const int L = 21, CD = 2 * Nq * K + N * V;
    const int batches[3] = {1, 16, 64};
    for (int bi = 0; bi < 3; bi++) {
        const int B = batches[bi];
        const size_t sn = (size_t)B * N * K * V;
        std::vector<float *> st(L), f(L);
        std::vector<floatX *> conv(L), y(L), W(L);
        for (int l = 0; l < L; l++) {
            cudaCheck(cudaMalloc(&st[l], sn * sizeof(float)));
            cudaCheck(cudaMalloc(&f[l], (size_t)B * N * sizeof(float)));
            cudaCheck(cudaMalloc(&conv[l], (size_t)B * CD * sizeof(floatX)));
            cudaCheck(cudaMalloc(&y[l], (size_t)B * N * V * sizeof(floatX)));
            cudaCheck(cudaMalloc(&W[l], (size_t)N * V * V * sizeof(floatX)));
            bench_fill(st[l], sn, 11 + l, 0.5f);
            bench_fill(f[l], (size_t)B * N, 23 + l, 0.2f, 0.75f);
            bench_fill(conv[l], (size_t)B * CD, 37 + l, 1.0f);
            bench_fill(W[l], (size_t)N * V * V, 41 + l, 0.25f);
        }
        M2RNNDims d = {B, 1, N, Nq, K, V, CD, CD, CD, NULL};
        cudaStream_t s;
        cudaCheck(cudaStreamCreate(&s));
        const float ms = graph_median_ms([&]() {
            for (int l = 0; l < L; l++) {
                const floatX *qv = conv[l], *kv = conv[l] + Nq * K, *vv = conv[l] + 2 * Nq * K;
                m2rnn_step(y[l], st[l], (long)N * K * V, qv, kv, vv, f[l], W[l], &d, s);
            }
        }, 1, reps, s);
        const double us = 1000.0 * ms / L, bytes = 2.0 * sn * sizeof(float);
        printf("step B=%-3d N=%d K=%d V=%d: %7.2f us a layer, state %6.0f GB/s\n", B, N, K, V, us, bytes / us / 1e3);
        for (int l = 0; l < L; l++) {
            cudaCheck(cudaFree(st[l]));
            cudaCheck(cudaFree(f[l]));
            cudaCheck(cudaFree(conv[l]));
            cudaCheck(cudaFree(y[l]));
            cudaCheck(cudaFree(W[l]));
        }
        cudaCheck(cudaStreamDestroy(s));
    }
}

int main(int argc, char **argv) {
    int B = 0, T = 4096, N = 84, Nq = 1, K = 64, V = 16, reps = 20;
    const char *dump_dir = NULL;
    int rates = 0, once = 0, step = 0;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) { fail_with_hint("flags come in pairs: -b 8 -t 4096 ...", "missing value for %s", argv[i]); }
        if (!strcmp(argv[i], "-b")) { B = (int)parse_int_arg("-b", argv[i + 1], 1, 1024); }
        else if (!strcmp(argv[i], "-t")) { T = (int)parse_int_arg("-t", argv[i + 1], 1, 1 << 20); }
        else if (!strcmp(argv[i], "-n")) { N = (int)parse_int_arg("-n", argv[i + 1], 1, 4096); }
        else if (!strcmp(argv[i], "-q")) { Nq = (int)parse_int_arg("-q", argv[i + 1], 1, 4096); }
        else if (!strcmp(argv[i], "-k")) { K = (int)parse_int_arg("-k", argv[i + 1], 16, 256); }
        else if (!strcmp(argv[i], "-v")) { V = (int)parse_int_arg("-v", argv[i + 1], 16, 32); }
        else if (!strcmp(argv[i], "-r")) { reps = (int)parse_int_arg("-r", argv[i + 1], 1, 1000); }
        else if (!strcmp(argv[i], "-d")) { dump_dir = argv[i + 1]; }
        else if (!strcmp(argv[i], "-x")) { once = (int)parse_int_arg("-x", argv[i + 1], 0, 1); }
        else if (!strcmp(argv[i], "-u")) { rates = (int)parse_int_arg("-u", argv[i + 1], 0, 3); }
        else if (!strcmp(argv[i], "-s")) { step = (int)parse_int_arg("-s", argv[i + 1], 0, 1); }
        else {
            fail_with_hint("flags: -b -t -n -q -k -v -r -d -u -s -x (see the comment at the top of the file)",
                           "unknown flag %s", argv[i]);
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fail_with_hint("run this on a machine with an NVIDIA GPU", "no CUDA device");
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    int clock_khz = 0;
    cudaCheck(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    const double ghz = clock_khz / 1e6;
    printf("device: %s, %d SMs, max SM clock %.2f GHz, %.1f GiB\n", prop.name, prop.multiProcessorCount, ghz,
           prop.totalGlobalMem / 1073741824.0);
    if (rates) {
        if (rates == 1) { sfu_rates(prop, ghz); }
        else if (rates == 2) { pipe_mix(prop, ghz); }
        else { chain_latency(prop, ghz); }
        return 0;
    }
    if (step) {
        bench_step(N, Nq, K, V, reps);
        return 0;
    }
    if (once) { // one training forward and one backward with the launcher's own choices, for a profiler
        Inputs in;
        make(in, B ? B : 8, T, N, Nq, K, V, false);
        fwd(in, true);
        bwd(in);
        cudaCheck(cudaDeviceSynchronize());
        release(in);
        return 0;
    }
    if (dump_dir) {
        dump_problem(dump_dir, B ? B : 2, T, N, Nq, K, V);
        return 0;
    }
    if (B) {
        bench_shape(B, T, N, Nq, K, V, reps, prop, ghz);
    } else {
        const int shapes[4][2] = {{4, 84}, {8, 84}, {4, 132}, {8, 132}};
        for (int i = 0; i < 4; i++) { bench_shape(shapes[i][0], T, shapes[i][1], 1, 64, 16, reps, prop, ghz); }
    }
    return 0;
}
