/*
bench_persistent.cu: a prototype of the persistent decode step (dev/bench/NOTES.md, "the next design"), to measure
its central claim before any refactor. The chain: the 410M Hybrid M²RNN's batch-1 layer products, 4 a layer (in
1024 → 2900, out 1344 → 1024, up 1024 → 5504, down 2752 → 1024), each reading the one before's output (the first
1344 or 2752 elements where the widths differ; the pointwise ops between them left out), every layer its own weights
(no L2 reuse across steps, as in the model), run two ways:
(a) today's decode step: one matmul_gemv kernel a product, captured in a CUDA graph with programmatic launches;
(b) one cooperative kernel, a CTA an SM, each CTA owning a contiguous share of every product's rows: at the top of
    product k it starts copying its rows of product k+1's weight into the other half of a two-slot shared-memory ring
    (cp.async), then waits for product k's input (a completion counter a product: each CTA adds 1 after its stores,
    release; the readers poll with acquire until every CTA of the step has added, a step epoch so nothing is reset),
    so the weight stream runs under the waits instead of after them.
Both sum a row as matmul_gemv does (a lane's 16-byte pieces in k order in fp32, then the warp's butterfly), so the
final vectors must be equal bit for bit; the bench checks it, then reports µs a step (CUDA events, 3 warm-up steps,
the median of 20) and GB/s of weight.
Then the same kernel with the weight copies left out (the dependency chain alone) and with the waits left out (the
weight stream alone). Measured (H200, NOTES.md "the next design"): graph 328.5 µs, persistent 384.2, chain alone
259.9, stream alone 340.7: a one-product-deep ring cannot pull the bandwidth and the counter chain costs 2.7 µs a
product, so this design is not taken into the decode step.
usage: build/bench_persistent [layers]   (24 unless given)
*/
#include <stdio.h>
#include <string.h>
#include <vector>
#include "common.cuh"
#include "tiles.cuh"
#include "dev/bench/bench_common.cuh"

typedef struct {
    const floatX *w; // (OC, IC) row-major
    const floatX *in; // (IC)
    floatX *out;     // (OC)
    int IC, OC;
} PersistOp;

// the CTA's rows of op: [r0, r1)
__device__ __forceinline__ void persist_rows(const PersistOp &op, int *r0, int *r1) {
    const int per = (op.OC + gridDim.x - 1) / gridDim.x;
    *r0 = min(op.OC, (int)blockIdx.x * per);
    *r1 = min(op.OC, *r0 + per);
}
// start copying the CTA's weight rows of op into slot (cp.async, one commit group)
__device__ __forceinline__ void persist_prefetch(const PersistOp &op, unsigned char *slot) {
    int r0, r1;
    persist_rows(op, &r0, &r1);
    const size_t bytes = (size_t)(r1 - r0) * op.IC * sizeof(floatX);
    const unsigned char *src = (const unsigned char *)(op.w + (size_t)r0 * op.IC);
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(slot);
    for (size_t i = threadIdx.x * 16; i < bytes; i += blockDim.x * 16) { tiles::cp_async16(s + (uint32_t)i, src + i); }
    tiles::cp_async_commit();
}

// MODE 0: as described; 1: the weight copies left out (the products read stale slots: the dependency chain alone);
// 2: the waits left out (the products read whatever input is there: the weight stream alone). 1 and 2 compute
// garbage and are timed only, to split the step's time between the chain and the stream.
template <int MODE>
__global__ void __launch_bounds__(256) persistent_chain_kernel(const PersistOp *ops, int nops, int *done, int epoch,
                                                               size_t slot_bytes) {
    extern __shared__ __align__(16) unsigned char persist_smem[]; // two weight slots, then the input vector
    unsigned char *slots[2] = {persist_smem, persist_smem + slot_bytes};
    floatX *xin = (floatX *)(persist_smem + 2 * slot_bytes);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    const int target = epoch * (int)gridDim.x; // every CTA of this step has added
    if (MODE != 1) { persist_prefetch(ops[0], slots[0]); }
    for (int k = 0; k < nops; k++) {
        const PersistOp op = ops[k];
        const bool next = k + 1 < nops;
        if (next && MODE != 1) { persist_prefetch(ops[k + 1], slots[(k + 1) & 1]); } // its slot was op k−1's
        if (MODE != 2 && k > 0 && threadIdx.x == 0) {
            while (ld_acquire_gpu(done + k - 1) < target) {}
        }
        __syncthreads();
        for (int i = threadIdx.x * PACK; i < op.IC; i += blockDim.x * PACK) { // the input, from L2 (this step's)
            *(uint4 *)(xin + i) = __ldcg((const uint4 *)(op.in + i));
        }
        if (next) { tiles::cp_async_wait<1>(); } else { tiles::cp_async_wait<0>(); } // op k's weight rows
        __syncthreads();
        int r0, r1;
        persist_rows(op, &r0, &r1);
        const floatX *wsm = (const floatX *)slots[k & 1];
        for (int r = warp; r < r1 - r0; r += warps) { // matmul_gemv's arithmetic for row r0 + r
            float acc = 0.0f;
#pragma unroll 2
            for (int kk = lane * PACK; kk < op.IC; kk += WARP_SIZE * PACK) {
                const Pack wp = *(const Pack *)(wsm + (size_t)r * op.IC + kk), xp = *(const Pack *)(xin + kk);
#pragma unroll
                for (int e = 0; e < PACK; e++) { acc = fmaf(to_float(wp.v[e]), to_float(xp.v[e]), acc); }
            }
            const floatX y = (floatX)warp_reduce_sum(acc);
            if (lane == 0) { op.out[r0 + r] = y; }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence(); // the CTA's stores (ordered before by the barrier) visible before the count
            atomicAdd(done + k, 1);
        }
    }
}

int main(int argc, char **argv) {
    const int layers = argc > 1 ? atoi(argv[1]) : 24;
    Runtime rt;
    runtime_init(&rt, 0);
    const int sms = rt.prop.multiProcessorCount;
    const int shapes[4][2] = {{1024, 2900}, {1344, 1024}, {1024, 5504}, {2752, 1024}}; // (IC, OC)
    // activations: x (1024) → a (2900) → b (1024) → c (5504) → x (1024), reused layer to layer
    floatX *x, *a, *b, *cbuf;
    cudaCheck(cudaMalloc(&x, 1024 * sizeof(floatX)));
    cudaCheck(cudaMalloc(&a, 2904 * sizeof(floatX)));
    cudaCheck(cudaMalloc(&b, 1024 * sizeof(floatX)));
    cudaCheck(cudaMalloc(&cbuf, 5504 * sizeof(floatX)));
    floatX *ins[4] = {x, a, b, cbuf}, *outs[4] = {a, b, cbuf, x};
    std::vector<PersistOp> ops;
    std::vector<floatX *> weights;
    double bytes = 0.0;
    size_t slot = 0;
    int max_ic = 0;
    for (int l = 0; l < layers; l++) {
        for (int j = 0; j < 4; j++) {
            const int IC = shapes[j][0], OC = shapes[j][1];
            floatX *w;
            cudaCheck(cudaMalloc(&w, (size_t)OC * IC * sizeof(floatX)));
            // uniform in ±sqrt(3/IC): each product keeps the vector's scale (var(y) = IC·var(w)·var(x) = var(x)), so
            // after 96 of them the values are still O(1), not underflowed, and the bitwise check means something
            bench_fill(w, (size_t)OC * IC, 100 + 4 * l + j, sqrtf(3.0f / (float)IC));
            weights.push_back(w);
            ops.push_back({w, ins[j], outs[j], IC, OC});
            bytes += (double)OC * IC * sizeof(floatX);
            const size_t rows = (size_t)CEIL_DIV(OC, sms);
            slot = std::max(slot, rows * IC * sizeof(floatX));
            max_ic = std::max(max_ic, IC);
        }
    }
    slot = (slot + 127) / 128 * 128;
    const size_t smem = 2 * slot + (size_t)max_ic * sizeof(floatX);
    printf("%s, %d SMs | %d layers, %zu products, %.1f MB of weight a step | ring 2 x %.1f KB a CTA\n", rt.prop.name,
           sms, layers, ops.size(), bytes / 1e6, slot / 1024.0);
    PersistOp *d_ops;
    int *done;
    cudaCheck(cudaMalloc(&d_ops, ops.size() * sizeof(PersistOp)));
    cudaCheck(cudaMemcpy(d_ops, ops.data(), ops.size() * sizeof(PersistOp), cudaMemcpyHostToDevice));
    cudaCheck(cudaMalloc(&done, ops.size() * sizeof(int)));
    cudaCheck(cudaMemset(done, 0, ops.size() * sizeof(int)));
    for (const void *kf : {(const void *)persistent_chain_kernel<0>, (const void *)persistent_chain_kernel<1>,
                           (const void *)persistent_chain_kernel<2>}) {
        kernel_smem_limit(kf, smem);
    }
    int per_sm = 0;
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_chain_kernel<0>, 256, smem));
    if (per_sm < 1) { fail_with_hint("fewer layers or a GPU with more shared memory", "the ring (%zu bytes) does not fit", smem); }

    // (a) the graph of GEMV kernels with programmatic launches
    auto gemv_chain = [&]() {
        launch_pdl = 1;
        for (const PersistOp &op : ops) {
            if (!matmul_gemv(op.out, op.OC, op.in, op.w, 1, op.IC, op.OC, rt.stream)) {
                fail_with_hint("report it", "matmul_gemv refused IC=%d OC=%d", op.IC, op.OC);
            }
        }
        launch_pdl = 0;
    };
    std::vector<floatX> start(1024), res_a(1024), res_b(1024);
    for (int i = 0; i < 1024; i++) { start[i] = (floatX)(0.5f * sinf(0.1f * i)); }
    cudaCheck(cudaMemcpy(x, start.data(), 1024 * sizeof(floatX), cudaMemcpyHostToDevice));
    gemv_chain();
    cudaCheck(cudaStreamSynchronize(rt.stream));
    cudaCheck(cudaMemcpy(res_a.data(), x, 1024 * sizeof(floatX), cudaMemcpyDeviceToHost));
    const float ms_graph = graph_median_ms(gemv_chain, 1, 20, rt.stream); // the chain in one graph, median of 20

    // (b) the persistent kernel
    int epoch = 0, nops = (int)ops.size();
    int mode = 0;
    auto persistent = [&]() {
        epoch++;
        void *args[] = {(void *)&d_ops, (void *)&nops, (void *)&done, (void *)&epoch, (void *)&slot};
        const void *kf = mode == 0   ? (const void *)persistent_chain_kernel<0>
                         : mode == 1 ? (const void *)persistent_chain_kernel<1>
                                     : (const void *)persistent_chain_kernel<2>;
        cudaCheck(cudaLaunchCooperativeKernel(kf, dim3(sms), dim3(256), args, smem, rt.stream));
    };
    cudaCheck(cudaMemcpy(x, start.data(), 1024 * sizeof(floatX), cudaMemcpyHostToDevice));
    persistent();
    cudaCheck(cudaStreamSynchronize(rt.stream));
    cudaCheck(cudaMemcpy(res_b.data(), x, 1024 * sizeof(floatX), cudaMemcpyDeviceToHost));
    const bool same = memcmp(res_a.data(), res_b.data(), 1024 * sizeof(floatX)) == 0;
    const float ms_pers = median_ms(persistent, 20, rt.stream);
    mode = 1;
    const float ms_chain = median_ms(persistent, 20, rt.stream);
    mode = 2;
    const float ms_stream = median_ms(persistent, 20, rt.stream);
    mode = 0;
    printf("graph of %d GEMV kernels (programmatic launches)  %8.1f us a step  %6.0f GB/s of weight\n", nops,
           ms_graph * 1e3, bytes / (ms_graph * 1e-3) / 1e9);
    printf("persistent kernel (%d CTAs, weight ring)           %8.1f us a step  %6.0f GB/s of weight\n", sms,
           ms_pers * 1e3, bytes / (ms_pers * 1e-3) / 1e9);
    printf("  of which: the chain alone (no weight copies) %.1f us, the weight stream alone (no waits) %.1f us\n",
           ms_chain * 1e3, ms_stream * 1e3);
    double norm = 0.0;
    for (int i = 0; i < 1024; i++) { norm += (double)(float)res_a[i] * (float)res_a[i]; }
    printf("final vectors %s (rms %.3g); %.2fx\n", same ? "bit for bit equal" : "DIFFER", sqrt(norm / 1024), ms_graph / ms_pers);
    for (floatX *w : weights) { cudaCheck(cudaFree(w)); }
    return same ? 0 : 1;
}
