/*
bench_gdn.cu: times the Gated DeltaNet recurrence of gdn.cuh at the issue's shapes (B=8, T=4096; H=2, K=256, V=512:
the paper's 410M layer; H=16, K=V=128): the part fla's chunk_gated_delta_rule does with use_qk_l2norm_in_kernel
(the per-head L2 norm of q and k, fused into our prep kernel; the chunked recurrence; β and log α given), forward and
forward+backward (the backward recomputes W, U and the chunk-start states from the T = (I + A)⁻¹ the forward kept, as
fla's recomputes w, u and h from its kept A). The peer runs in the same call: dev/bench/gdn_fla.py.
Per-kernel medians follow, then the floor: FLOPs as executed by the chunked algorithm (the products of the staged
tiles) and the bytes the kernels must move (q, k, v in, o out, the chunk-start states h written and read back).
Timing: CUDA events, 3 warm-up calls, the median of the repeats (dev/bench/bench_common.cuh).
usage: build/bench_gdn [-r repeats] [-s shape]   (shape 0: H=2, 1: H=16; both unless given)
*/
#include "utils.h"
#include "model.h"
#include "common.cuh"
#include "gdn.cuh"
#include "dev/bench/bench_common.cuh"

int main(int argc, char **argv) {
    int repeats = 20, only = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-r") == 0) { repeats = atoi(argv[i + 1]); }
        if (strcmp(argv[i], "-s") == 0) { only = atoi(argv[i + 1]); }
    }
    Runtime rt;
    runtime_init(&rt, 0);
    cudaStream_t st = rt.stream;
    printf("device: %s\n", rt.prop.name);
    printf("| B | T | H | K | V | fwd ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s | extra memory |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    const int shapes[2][3] = {{2, 256, 512}, {16, 128, 128}};
    char kernels[2][768];
    for (int si = 0; si < 2; si++) {
        kernels[si][0] = '\0';
        if (only >= 0 && si != only) { continue; }
        const int B = 8, T = 4096, H = shapes[si][0], K = shapes[si][1], V = shapes[si][2];
        const int HK = H * K, HV = H * V, CD = 2 * HK + HV, BT = B * T, L = GDN_L, NC = gdn_chunks(T);
        floatX *x, *dx, *qn, *kn, *o, *dout, *dk;
        float *rq, *rk, *beta, *g, *dbeta, *dg;
        cudaCheck(cudaMalloc(&x, (size_t)BT * CD * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dx, (size_t)BT * CD * sizeof(floatX)));
        cudaCheck(cudaMalloc(&qn, (size_t)BT * HK * sizeof(floatX)));
        cudaCheck(cudaMalloc(&kn, (size_t)BT * HK * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dk, (size_t)BT * HK * sizeof(floatX)));
        cudaCheck(cudaMalloc(&o, (size_t)BT * HV * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dout, (size_t)BT * HV * sizeof(floatX)));
        cudaCheck(cudaMalloc(&rq, (size_t)BT * H * sizeof(float)));
        cudaCheck(cudaMalloc(&rk, (size_t)BT * H * sizeof(float)));
        cudaCheck(cudaMalloc(&beta, (size_t)BT * H * sizeof(float)));
        cudaCheck(cudaMalloc(&g, (size_t)BT * H * sizeof(float)));
        cudaCheck(cudaMalloc(&dbeta, (size_t)BT * H * sizeof(float)));
        cudaCheck(cudaMalloc(&dg, (size_t)BT * H * sizeof(float)));
        bench_fill(x, (size_t)BT * CD, 1u, 1.0f);
        bench_fill(dout, (size_t)BT * HV, 2u, 1.0f);
        bench_fill(beta, (size_t)BT * H, 3u, 0.45f, 0.5f);
        bench_fill(g, (size_t)BT * H, 4u, 0.04f, -0.04f); // log α in [−0.08, 0): fla's logsigmoid(randn)/16 range
        GDNChunkBufs f;
        GDNChunkGrads gr;
        DeviceArena ar = {NULL, 0};
        gdn_chunk_bufs_take(&f, &ar, B, T, H, K, V, false, true);
        const size_t fwd_bytes = ar.used;
        gdn_chunk_grads_take(&gr, &ar, B, T, H, K, V, false);
        void *mem;
        cudaCheck(cudaMalloc(&mem, ar.used));
        const size_t extra = ar.used;
        ar = (DeviceArena){(char *)mem, 0};
        gdn_chunk_bufs_take(&f, &ar, B, T, H, K, V, false, true);
        gdn_chunk_grads_take(&gr, &ar, B, T, H, K, V, false);
        const floatX *v = x + 2 * HK;
        const GDNQKNorm nm = {CD, qn, kn, rq, rk};
        auto fwd = [&]() {
            gdn_chunk_forward(o, &f, NULL, 0, NULL, 0, x, x + HK, &nm, v, CD, beta, g, NULL, B, T, H, K, V, st);
        };
        auto bwd = [&]() {
            gdn_chunk_recompute(&f, NULL, 0, qn, kn, v, CD, beta, NULL, B, T, H, K, V, st);
            gdn_chunk_backward(dk, dx + 2 * HK, CD, dbeta, dg, &gr, NULL, 0, NULL, 0, dout, &f, qn, kn, v, CD, beta, NULL, B,
                               T, H, K, V, st);
            l2norm_backward(dx, gr.dq, x, rq, BT, H, K, CD, st);
            l2norm_backward(dx + HK, dk, x + HK, rk, BT, H, K, CD, st);
        };
        const float ms_f = median_ms(fwd, repeats, st);
        const float ms_fb = median_ms([&]() { fwd(); bwd(); }, repeats, st);
        // executed FLOPs per chunk and head (products of staged tiles; the inversion's L³/3 left out)
        const double LL = (double)L * L, LK = (double)L * K, LV = (double)L * V, KV = (double)K * V;
        const double KT = gdn_kp(K) / GDN_T;
        const double f_prep = 2 * (2 * LL * K) + 2 * LL * K + 2 * LL * V, f_state = 2 * (2 * L * KV);
        const double f_out = 2 * L * KV + 2 * LL * V;
        const double f_dstate = 2 * LL * V + 3 * (2 * L * KV), f_dqk = 3 * (2 * L * KV) + KT * 2 * LL * V + 2 * (2 * LL * K);
        const double f_wy = 2 * LL * K + 2 * (2 * LL * V) + 2 * LL * K + 2 * (2.0 * L * LL) + 3 * (2 * LL * K);
        const double units = (double)NC * B * H;
        const double F_f = units * (f_prep + f_state + f_out);
        const double F_fb = F_f + units * (f_prep + f_state + f_dstate + f_dqk + f_wy);
        printf("| %d | %d | %d | %d | %d | %.3f | %.3f | %.0f | %.0f | %.0f MB (%.0f MB forward) |\n", B, T, H, K, V,
               ms_f, ms_fb, F_f / ms_f * 1e-9, F_fb / ms_fb * 1e-9, extra / 1e6, fwd_bytes / 1e6);
        // per kernel (each alone, inputs as the step leaves them)
        const GDNQKNorm none = {0, NULL, NULL, NULL, NULL};
        float kms[8];
        kms[0] = median_ms([&]() { gdn_chunk_prep_kernel<<<NC * B * H, 256, gdn_prep_smem(K), st>>>(f.W, f.U, f.Pm, f.Tm, f.Gc, nm, x, x + HK, v, CD, beta, g, false, NULL, B, T, H, K, V); }, repeats, st);
        kms[6] = median_ms([&]() { gdn_chunk_prep_kernel<<<NC * B * H, 256, gdn_prep_smem(K), st>>>(f.W, f.U, f.Pm, f.Tm, f.Gc, none, qn, kn, v, CD, beta, g, true, NULL, B, T, H, K, V); }, repeats, st);
        kms[7] = median_ms([&]() { l2norm_forward(qn, rq, x, BT, H, K, CD, st); }, repeats, st);
        kms[1] = median_ms([&]() { gdn_chunk_state(&f, NULL, 0, NULL, 0, kn, NULL, B, T, H, K, V, st); }, repeats, st);
        kms[2] = median_ms([&]() { gdn_chunk_output(o, &f, qn, NULL, B, T, H, K, V, st); }, repeats, st);
        kms[3] = median_ms([&]() { gdn_chunk_dstate(&gr, NULL, 0, NULL, 0, dout, &f, qn, kn, NULL, B, T, H, K, V, st); }, repeats, st);
        kms[4] = median_ms([&]() { gdn_chunk_dqk(&gr, dout, &f, qn, kn, NULL, B, T, H, K, V, st); }, repeats, st);
        kms[5] = median_ms([&]() { gdn_chunk_wy_kernel<<<NC * B * H, GDN_WY_THREADS, gdn_wy_smem(K), st>>>(dk, dx + 2 * HK, CD, dbeta, dg, kn, v, CD, beta, f.Gc, gr.dW, gr.dvn, gr.dk_part, gr.dgam_part, f.Tm, NULL, B, T, H, K, V); }, repeats, st);
        cudaCheck(cudaGetLastError());
        // the floor: bytes (q, k, v read, o written; h written and read back by the output kernel) at the device's
        // bandwidth, FLOPs at the dense bf16 mma.sync rate (≈ 660 TFLOP/s measured for FlashAttention-2-class kernels)
        const double bytes_f = (double)BT * (2 * HK + HV) * 2 + (double)BT * HV * 2 + 2.0 * B * H * NC * KV * 2;
        snprintf(kernels[si], sizeof(kernels[si]),
                 "H=%d K=%d V=%d: prep (q/k norm fused) %.3f, state %.3f, output %.3f | prep recompute %.3f, dstate "
                 "%.3f, dqk %.3f, wy %.3f ms | q norm alone %.3f; forward moves >= %.0f MB (%.3f ms at 3.35 TB/s) and "
                 "executes %.1f GFLOP (%.3f ms at 660 TFLOP/s)",
                 H, K, V, kms[0], kms[1], kms[2], kms[6], kms[3], kms[4], kms[5], kms[7], bytes_f / 1e6,
                 bytes_f / 3.35e12 * 1e3, F_f / 1e9, F_f / 660e12 * 1e3);
        cudaCheck(cudaFree(mem));
        void *bufs[] = {x, dx, qn, kn, dk, o, dout, rq, rk, beta, g, dbeta, dg};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) { cudaCheck(cudaFree(bufs[i])); }
    }
    printf("\nper kernel (median ms):\n%s\n%s\n", kernels[0], kernels[1]);
    runtime_free(&rt);
    return 0;
}
