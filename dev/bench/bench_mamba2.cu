/*
bench_mamba2.cu: times the Mamba-2 recurrence kernels of mamba2.cuh (the chunked SSD forward, and forward + backward)
at the issue's shape B=8, T=4096, H=32, P=64, N=128, G=1 (override: B T H P N G as arguments). CUDA events around
each region, 3 warm-up runs, the median of 30 (dev/bench/bench_common.cuh); random inputs (never zeros); per-kernel times of one backward too.
FLOPs counted per (b, head, chunk of L=64) as the kernels do them (the floor is the larger of FLOPs / 790 TFLOP/s and
the bytes moved / 4.8 TB/s, printed with the times):
  forward:  state pass 2·L·P·N + C Bᵀ 2·L·L·N + M x 2·L·L·P + C S 2·L·N·P
  backward: 2 state passes 4·L·P·N + dy xᵀ, W1ᵀ dy 4·L·L·P + SB, YS, dB/dC state terms 8·L·P·N, per group C Bᵀ and
            the two dCB products 6·L·L·N
*/
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include "mamba2.cuh"
#include "dev/bench/bench_common.cuh"

static uint64_t rng = 12345;
static float urand() {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 16777216.0f;
}

int main(int argc, char **argv) {
    int B = 8, T = 4096, H = 32, P = 64, N = 128, G = 1;
    if (argc == 7) { B = atoi(argv[1]); T = atoi(argv[2]); H = atoi(argv[3]); P = atoi(argv[4]); N = atoi(argv[5]); G = atoi(argv[6]); }
    const int stride = H * P + 2 * G * N;
    const long BT = (long)B * T;
    Mamba2Dims d = {B, T, H, P, N, G, stride};
    mamba2_validate_dims(&d);
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    std::vector<floatX> hx(BT * stride), hdy(BT * H * P);
    std::vector<float> hdt(BT * H), hA(H), hD(H);
    for (auto &v : hx) { v = (floatX)(2.0f * urand() - 1.0f); }
    for (auto &v : hdy) { v = (floatX)(2.0f * urand() - 1.0f); }
    for (auto &v : hdt) { v = 0.001f + 0.1f * urand(); }
    for (int h = 0; h < H; h++) { hA[h] = logf(1.0f + 15.0f * urand()); hD[h] = 1.0f; }
    floatX *xbc, *dy, *y, *dxbc;
    float *dt, *A_log, *D, *ddt, *dA, *dD;
    void *work;
    cudaCheck(cudaMalloc(&xbc, hx.size() * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dy, hdy.size() * sizeof(floatX)));
    cudaCheck(cudaMalloc(&y, hdy.size() * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dxbc, hx.size() * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dt, hdt.size() * sizeof(float)));
    cudaCheck(cudaMalloc(&ddt, hdt.size() * sizeof(float)));
    cudaCheck(cudaMalloc(&A_log, H * sizeof(float)));
    cudaCheck(cudaMalloc(&D, H * sizeof(float)));
    cudaCheck(cudaMalloc(&dA, H * sizeof(float)));
    cudaCheck(cudaMalloc(&dD, H * sizeof(float)));
    const size_t work_bytes = mamba2_work_bytes(&d);
    cudaCheck(cudaMalloc(&work, work_bytes));
    cudaCheck(cudaMemcpy(xbc, hx.data(), hx.size() * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dy, hdy.data(), hdy.size() * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dt, hdt.data(), hdt.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(A_log, hA.data(), H * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(D, hD.data(), H * sizeof(float), cudaMemcpyHostToDevice));
    const floatX *x = xbc, *Bm = xbc + H * P, *Cm = xbc + H * P + G * N;
    auto fwd = [&]() { mamba2_forward(y, NULL, x, Bm, Cm, dt, A_log, D, NULL, 0, &d, work, 0); };
    auto bwd = [&]() {
        mamba2_backward(dxbc, dxbc + H * P, dxbc + H * P + G * N, ddt, dA, dD, NULL, dy, NULL, x, Bm, Cm, dt, A_log, D,
                        NULL, 0, &d, work, 0);
    };
    const float t_fwd = median_ms(fwd, 30, 0);
    const float t_fb = median_ms([&]() { fwd(); bwd(); }, 30, 0);
    // per kernel (one of each, from the backward's pieces)
    const int nc = CEIL_DIV(T, MAMBA2_L);
    floatX *Sst = (floatX *)work;
    const float t_pass = median_ms([&]() {
        mamba2_state_pass(Sst, NULL, NULL, 0, x, stride, Bm, stride, dt, A_log, &d, 0, 0);
    }, 20, 0);
    const float t_bwd = median_ms(bwd, 20, 0);
    const double L = MAMBA2_L, chunks_heads = (double)B * H * nc;
    const double f_fwd = chunks_heads * 2 * L * ((double)P * N + L * N + L * P + (double)N * P);
    const double f_bwd = chunks_heads * (4 * L * P * N + 4 * L * L * P + 8 * L * P * N) + (double)B * G * nc * 6 * L * L * N;
    const double rec_flops = 6.0 * H * P * N * BT; // layers.h's count of the recurrence itself (forward)
    const double bytes_fwd = (double)BT * (stride * 2 + H * 4 + H * P * 2) + 2.0 * B * H * nc * P * N * 2;
    printf("device: %s (%d SMs)  shape B=%d T=%d H=%d P=%d N=%d G=%d, chunk %d\n", prop.name, prop.multiProcessorCount,
           B, T, H, P, N, G, MAMBA2_L);
    printf("FLOPs (as computed): forward %.1f G, backward %.1f G (the recurrence's 6·P·N per head-token: %.1f G)\n",
           f_fwd / 1e9, f_bwd / 1e9, rec_flops / 1e9);
    printf("floor forward: max(%.3f ms compute @790 TFLOP/s, %.3f ms bytes @4.8 TB/s)\n", f_fwd / 790e9,
           bytes_fwd / 4.8e9);
    printf("extra memory (workspace: S_start, dS_end bf16 + partials): %.1f MiB\n", work_bytes / 1048576.0);
    printf("%-28s %9s %9s\n", "region", "ms", "TFLOP/s");
    printf("%-28s %9.3f %9.1f\n", "forward", t_fwd, f_fwd / t_fwd / 1e9);
    printf("%-28s %9.3f %9.1f\n", "forward+backward", t_fb, (f_fwd + f_bwd) / t_fb / 1e9);
    printf("%-28s %9.3f %9.1f\n", "  backward alone", t_bwd, f_bwd / t_bwd / 1e9);
    printf("%-28s %9.3f\n", "  one state pass", t_pass);
    printf("%-28s %9.3f\n", "  chunk scan (fwd - pass)", t_fwd - t_pass);
    printf("%-28s %9.3f\n", "  chunk bwd (bwd - 2 passes)", t_bwd - 2 * t_pass);
    printf("RESULT mamba2 fwd_ms %.3f fwdbwd_ms %.3f\n", t_fwd, t_fb);
    return 0;
}
