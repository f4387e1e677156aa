/*
moe.cuh: the mixture-of-experts feed-forward (the e row of layers.h) on the GPU, op for op ref/moe.h (whose comment
gives the layer's equations and the order of every sum):

  logits = x W_rᵀ (M, E) in fp32 → softmax p, the K largest logits (ties to the lower expert), weights = softmax over
  the K → the M·K assignments grouped by expert (tokens in order within an expert) → each expert's SwiGLU over its
  rows → out[t] = shared(x)[t] + Σ_k w_tk y_(t,k) (k in order); aux = coef · E · Σ_e P̄_e f_e.

Dropless: every assignment is computed, no capacity, no padding per expert. The router's logits come out of the GEMM
in fp32 so the top-k sees what the reference sees (a bf16 logit would move near-ties by 2^-8). The grouping is a
deterministic counting sort on the device (moe_group); the experts' row counts then go to the host, which needs
them for the GEMMs' sizes (one small copy and sync a forward, one a backward). The expert GEMMs of one kind run as
one grouped cuBLAS call over the experts that have rows (cublasGemmGroupedBatchedEx; the same problems and numeric
contract, bf16 in and fp32 accumulation, as the dense SwiGLU's cuBLASLt GEMMs in swiglu.cuh, whose pointwise
kernels run once over all rows), except the weight gradients, which cuBLAS 13.0 does not group (moe_gemm). The
backward is the forward's ops in reverse with every scatter turned into a gather by the grouping: dy rows are
written by their one token, each token sums its K expert-input gradients in k order, and the weight gradients
accumulate expert by expert in a fixed order: deterministic, no floating-point atomics.
Precision: bf16 activations and GEMM inputs, fp32 logits, probabilities, weights, their gradients and every
accumulation; the router's logit gradients are rounded to bf16 for their GEMMs like every other activation gradient.
*/
#ifndef M2RNN_MOE_CUH
#define M2RNN_MOE_CUH

#include <cublas_v2.h>
#include "common.cuh"
#include "swiglu.cuh" // the SwiGLU pointwise kernels (forward and backward) over rows of gate | linear

typedef struct { MOE_PARAMS(VIEW_FIELD) } MoEParams;      // the layer's tensors, in the layers.h row's order
typedef struct { MOE_PARAMS(VIEW_FIELD_32) } MoEParams32; // their gradients

#define MOE_MAX_EXPERTS 1024 // 32 logits a lane in the router kernel
#define MOE_MAX_TOP_K 32

typedef struct {
    float *probs;      // (M, E) the router's softmax
    float *weights;    // (M, K) the renormalized top-k weights
    int *choice;       // (M, K) the chosen experts, largest logit first
    int *slot;         // (M, K) each assignment's row in expert order
    int *order;        // (M·K) the token of each expert-ordered row
    int *offsets;      // (E + 1) the first row of each expert
    floatX *up, *h, *y; // (M·K, 2F), (M·K, F), (M·K, C) per assignment, in expert order
    floatX *sup, *sh;  // (M, 2S), (M, S) the shared expert
} MoEActs;

static size_t moe_acts_layout(MoEActs *a, void *base, const ModelConfig *c, int B, int T) {
    const size_t M = (size_t)B * T, E = (size_t)c->moe.experts, K = (size_t)c->moe.top_k, F = (size_t)c->moe.hidden;
    const size_t C = (size_t)c->d_model, S = (size_t)c->moe.shared;
    DeviceArena ar = {(char *)base, 0};
    a->probs = TAKE_F(&ar, M * E);
    a->weights = TAKE_F(&ar, M * K);
    a->choice = TAKE_I(&ar, M * K);
    a->slot = TAKE_I(&ar, M * K);
    a->order = TAKE_I(&ar, M * K);
    a->offsets = TAKE_I(&ar, E + 1);
    a->up = TAKE_X(&ar, M * K * 2 * F);
    a->h = TAKE_X(&ar, M * K * F);
    a->y = TAKE_X(&ar, M * K * C);
    a->sup = TAKE_X(&ar, M * 2 * S);
    a->sh = TAKE_X(&ar, M * S);
    return ar.used;
}

// the scratch: the forward's logits and gathered inputs, the backward's gradients (xs is gathered again there)
typedef struct {
    float *logits;      // (M, E)
    float *pbar;        // (E) mean router probability of each expert
    int *counts;        // (E) rows of each expert
    floatX *xs;         // (M·K, C) the tokens' inputs in expert order
    float *dw;          // (M, K)
    float *dlogits;     // (M, E)
    floatX *dlogits_x;  // (M, E) for the router's GEMMs
    floatX *dy, *dh, *dup, *dxs; // (M·K, C), (M·K, F), (M·K, 2F), (M·K, C)
    floatX *dsh, *dsup; // (M, S), (M, 2S)
} MoEScratch;

static size_t moe_scratch_layout(MoEScratch *s, void *base, const ModelConfig *c, int B, int T) {
    const size_t M = (size_t)B * T, E = (size_t)c->moe.experts, K = (size_t)c->moe.top_k, F = (size_t)c->moe.hidden;
    const size_t C = (size_t)c->d_model, S = (size_t)c->moe.shared;
    DeviceArena ar = {(char *)base, 0};
    s->logits = TAKE_F(&ar, M * E);
    s->pbar = TAKE_F(&ar, E);
    s->counts = TAKE_I(&ar, E);
    s->xs = TAKE_X(&ar, M * K * C);
    s->dw = TAKE_F(&ar, M * K);
    s->dlogits = TAKE_F(&ar, M * E);
    s->dlogits_x = TAKE_X(&ar, M * E);
    s->dy = TAKE_X(&ar, M * K * C);
    s->dh = TAKE_X(&ar, M * K * F);
    s->dup = TAKE_X(&ar, M * K * 2 * F);
    s->dxs = TAKE_X(&ar, M * K * C);
    s->dsh = TAKE_X(&ar, M * S);
    s->dsup = TAKE_X(&ar, M * 2 * S);
    return ar.used;
}

static void moe_check_config(const ModelConfig *c);

static size_t moe_ffn_acts_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    moe_check_config(c); // (before any memory is laid out or kernel runs)
    MoEActs a;
    return moe_acts_layout(&a, NULL, c, B, T);
}
static size_t moe_ffn_scratch_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    MoEScratch s;
    return moe_scratch_layout(&s, NULL, c, B, T);
}

// ----------------------------------------------------------------------------------------------------------------
// kernels

// one warp per token: p = softmax(logits) (M, E); the K largest logits by repeated warp argmax (ties to the lower
// expert); weights = softmax over the chosen logits. EPL: logits a lane holds (E ≤ 32·EPL).
template <int EPL>
__global__ void moe_router_kernel(float *probs, float *weights, int *choice, const float *logits, int M, int E, int K) {
    const int m = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (m >= M) { return; }
    const float *l = logits + (size_t)m * E;
    float v[EPL];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < EPL; j++) {
        const int e = lane + j * WARP_SIZE;
        v[j] = e < E ? l[e] : -INFINITY;
        mx = fmaxf(mx, v[j]);
    }
    mx = warp_reduce_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < EPL; j++) { sum += lane + j * WARP_SIZE < E ? expf(v[j] - mx) : 0.0f; }
    sum = warp_reduce_sum(sum);
    float *p = probs + (size_t)m * E;
#pragma unroll
    for (int j = 0; j < EPL; j++) {
        const int e = lane + j * WARP_SIZE;
        if (e < E) { p[e] = expf(v[j] - mx) / sum; }
    }
    // top-k: each round every lane offers its best untaken (largest value, then lowest expert), the warp picks one.
    // A NaN logit (a diverged step: its loss is NaN and the trainer skips it) competes as −∞, so a pick always exists.
    unsigned taken[EPL];
#pragma unroll
    for (int j = 0; j < EPL; j++) {
        taken[j] = lane + j * WARP_SIZE >= E;
        if (isnan(v[j])) { v[j] = -INFINITY; }
    }
    float top0 = 0.0f, wsum = 0.0f, my_val = 0.0f;
    int my_expert = 0;
    for (int k = 0; k < K; k++) {
        float bv = -INFINITY;
        int be = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < EPL; j++) {
            const int e = lane + j * WARP_SIZE;
            if (!taken[j] && (v[j] > bv || (v[j] == bv && e < be))) { bv = v[j]; be = e; }
        }
        for (int off = WARP_SIZE / 2; off > 0; off /= 2) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
            const int oe = __shfl_xor_sync(0xffffffffu, be, off);
            if (ov > bv || (ov == bv && oe < be)) { bv = ov; be = oe; }
        }
        if (be % WARP_SIZE == lane) { taken[be / WARP_SIZE] = 1; } // (be < E: E ≥ K untaken experts remain)
        if (k == 0) { top0 = bv; }
        wsum += expf(bv - top0);
        if (lane == k) { my_val = bv; my_expert = be; } // lane k keeps the k-th choice (K ≤ 32)
    }
    if (lane < K) {
        choice[(size_t)m * K + lane] = my_expert;
        weights[(size_t)m * K + lane] = expf(my_val - top0) / wsum;
    }
}

// xs[r] = x[order[r]]: one block per expert-ordered row
__global__ void moe_gather_kernel(floatX *xs, const floatX *x, const int *order, int C) {
    const floatX *src = x + (size_t)order[blockIdx.x] * C;
    floatX *dst = xs + (size_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) { dst[i] = src[i]; }
}

// out[m] += Σ_k w_mk y[slot_mk] (k in order, fp32): one block per token
__global__ void moe_combine_kernel(floatX *out, const floatX *y, const int *slot, const float *weights, int K, int C) {
    const int m = blockIdx.x;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float acc = to_float(out[(size_t)m * C + i]);
        for (int k = 0; k < K; k++) {
            acc += weights[(size_t)m * K + k] * to_float(y[(size_t)slot[(size_t)m * K + k] * C + i]);
        }
        out[(size_t)m * C + i] = (floatX)acc;
    }
}

// pbar[e] = (1/M) Σ_m p[m, e]: one block per expert, a fixed order
__global__ void moe_pbar_kernel(float *pbar, const float *probs, int M, int E) {
    const int e = blockIdx.x;
    float acc = 0.0f;
    for (int m = threadIdx.x; m < M; m += blockDim.x) { acc += probs[(size_t)m * E + e]; }
    acc = block_reduce_sum(acc);
    if (threadIdx.x == 0) { pbar[e] = acc / M; }
}

// one block per token: dy[slot_mk] = w_mk g_m; dw_mk = <g_m, y[slot_mk]>
__global__ void moe_dy_kernel(floatX *dy, float *dw, const floatX *dout, const floatX *y, const int *slot,
                              const float *weights, int K, int C) {
    const int m = blockIdx.x;
    const floatX *g = dout + (size_t)m * C;
    for (int k = 0; k < K; k++) {
        const size_t row = (size_t)slot[(size_t)m * K + k];
        const float wk = weights[(size_t)m * K + k];
        float d = 0.0f;
        for (int i = threadIdx.x; i < C; i += blockDim.x) {
            const float gi = to_float(g[i]);
            dy[row * C + i] = (floatX)(wk * gi);
            d += gi * to_float(y[row * C + i]);
        }
        d = block_reduce_sum(d);
        if (threadIdx.x == 0) { dw[(size_t)m * K + k] = d; }
    }
}

// the sum of a double over the block in a fixed order; every thread gets it
__device__ double block_reduce_sum_double(double v) {
    __shared__ double partial[32];
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) { v += __shfl_xor_sync(0xffffffffu, v, o); }
    __syncthreads(); // partial[] may still be read by a previous call
    if (threadIdx.x % WARP_SIZE == 0) { partial[threadIdx.x / WARP_SIZE] = v; }
    __syncthreads();
    v = 0.0;
    for (int w = 0; w < (int)blockDim.x / WARP_SIZE; w++) { v += partial[w]; }
    return v;
}

// ref/moe.h's moe_aux_dlogit, for the device
__device__ __forceinline__ double moe_aux_dlogit(double p_e, double p_top, double c_e, double c_top, int is_top,
                                                 double others, double q, double inv) {
    return p_e * inv * (is_top ? c_top * others - q : c_e - p_top * c_top - q);
}

// One block per token: dx[m] += Σ_k dxs[slot_mk] (k in order); the router's logit gradients: the top-k softmax
// dl_j += w_j (dw_j − Σ_i w_i dw_i) for the K chosen, and the aux loss through the full softmax,
// dl_e += p_e (dp_e − Σ p dp) with dp_e = aux_scale · count_e / (M K) / M (in double, moe_aux_dlogit's form);
// written in floatX for the router's GEMMs.
__global__ void moe_token_backward_kernel(floatX *dx, floatX *dlogits_x, const floatX *dxs, const int *slot,
                                          const int *choice, const float *weights, const float *dw, const float *probs,
                                          const int *offsets, float aux_scale, int M, int E, int K, int C) {
    const int m = blockIdx.x;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float acc = to_float(dx[(size_t)m * C + i]);
        for (int k = 0; k < K; k++) { acc += to_float(dxs[(size_t)slot[(size_t)m * K + k] * C + i]); }
        dx[(size_t)m * C + i] = (floatX)acc;
    }
    float s = 0.0f; // Σ_i w_i dw_i, every thread in the same order
    for (int k = 0; k < K; k++) { s += weights[(size_t)m * K + k] * dw[(size_t)m * K + k]; }
    // the aux term in double and in ref/moe.h's form (moe_aux_dlogit: nothing cancels when p_top → 1)
    const float *p = probs + (size_t)m * E;
    const int top = choice[(size_t)m * K];
    const double inv = (double)aux_scale / ((double)M * K) / M;
    double others = 0.0, q = 0.0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        if (e != top) { others += p[e]; q += (double)p[e] * (offsets[e + 1] - offsets[e]); }
    }
    others = block_reduce_sum_double(others);
    q = block_reduce_sum_double(q);
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float dl = 0.0f;
        for (int k = 0; k < K; k++) {
            if (choice[(size_t)m * K + k] == e) {
                dl += weights[(size_t)m * K + k] * (dw[(size_t)m * K + k] - s);
            }
        }
        if (aux_scale != 0.0f) {
            dl += (float)moe_aux_dlogit(p[e], p[top], offsets[e + 1] - offsets[e], offsets[top + 1] - offsets[top],
                                        e == top, others, q, inv);
        }
        dlogits_x[(size_t)m * E + e] = (floatX)dl;
    }
}

// ----------------------------------------------------------------------------------------------------------------
// the grouping, on the device and deterministic: the experts' row counts (integer atomics: exact), their offsets,
// then each expert's assignments compacted in (token, k) order by one block per expert; only the offsets go to the
// host, where the expert GEMMs' sizes are needed.

__global__ void moe_count_kernel(int *counts, const int *choice, long MK) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < MK; i += (long)gridDim.x * blockDim.x) {
        atomicAdd(&counts[choice[i]], 1);
    }
}

// offsets (E + 1) = exclusive scan of counts (E ≤ 1024), one block
__global__ void moe_offsets_kernel(int *offsets, const int *counts, int E) {
    __shared__ int buf[MOE_MAX_EXPERTS + 1];
    for (int e = threadIdx.x; e < E; e += blockDim.x) { buf[e] = counts[e]; }
    __syncthreads();
    if (threadIdx.x == 0) {
        int acc = 0;
        for (int e = 0; e < E; e++) { const int c = buf[e]; buf[e] = acc; acc += c; }
        buf[E] = acc;
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) { offsets[e] = buf[e]; }
}

// block e: the assignments i with choice[i] == e, in order, get rows offsets[e], offsets[e] + 1, ...
__global__ void moe_compact_kernel(int *slot, int *order, const int *choice, const int *offsets, long MK, int K) {
    __shared__ int warp_count[32];
    __shared__ int base;
    const int e = blockIdx.x, lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    if (threadIdx.x == 0) { base = offsets[e]; }
    for (long c0 = 0; c0 < MK; c0 += blockDim.x) {
        const long i = c0 + threadIdx.x;
        const int mine = i < MK && choice[i] == e;
        const unsigned ballot = __ballot_sync(0xffffffffu, mine);
        __syncthreads(); // base is final, warp_count free
        if (lane == 0) { warp_count[warp] = __popc(ballot); }
        __syncthreads();
        int before = base;
        for (int w = 0; w < warp; w++) { before += warp_count[w]; }
        if (mine) {
            const int row = before + __popc(ballot & ((1u << lane) - 1u));
            slot[i] = row;
            order[row] = (int)(i / K);
        }
        __syncthreads();
        if (threadIdx.x == 0) { for (int w = 0; w < warps; w++) { base += warp_count[w]; } }
    }
}

// a pinned host copy of the offsets, for the process (one model; its ops run one at a time)
static int *moe_host_offsets_buf = NULL;
static int *moe_host_offsets(void) {
    if (moe_host_offsets_buf == NULL) {
        cudaCheck(cudaMallocHost(&moe_host_offsets_buf, (MOE_MAX_EXPERTS + 1) * sizeof(int)));
    }
    return moe_host_offsets_buf;
}

// choice (M·K) → slot, order (M·K), offsets (E + 1) on the device (counts: E ints of scratch); returns the offsets
// on the host
static const int *moe_group(MoEActs *a, int *counts, int M, int E, int K, cudaStream_t stream) {
    const long MK = (long)M * K;
    int *off = moe_host_offsets();
    cudaCheck(cudaMemsetAsync(counts, 0, (size_t)E * sizeof(int), stream));
    moe_count_kernel<<<(unsigned)CEIL_DIV(MK, 256L) < 1024 ? (unsigned)CEIL_DIV(MK, 256L) : 1024, 256, 0, stream>>>(
        counts, a->choice, MK);
    moe_offsets_kernel<<<1, 256, 0, stream>>>(a->offsets, counts, E);
    moe_compact_kernel<<<E, 1024, 0, stream>>>(a->slot, a->order, a->choice, a->offsets, MK, K);
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaMemcpyAsync(off, a->offsets, ((size_t)E + 1) * sizeof(int), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    return off;
}

// ----------------------------------------------------------------------------------------------------------------
// the experts' GEMMs: one grouped cuBLAS call (cublasGemmGroupedBatchedEx) over the experts that have rows, each
// expert's GEMM the same column-major problem as matmul_forward / matmul_backward (common.cuh) would run on its rows;
// M2RNN_MOE_LOOP=1 (or a cuBLAS without the grouped call for these types) runs them one cublasGemmEx call per expert.

// an operand of expert e with rows [r0, r0 + n): base + (r0 · per_row + e · per_expert) elements
typedef struct { const void *base; size_t elem, per_row, per_expert; } MoEOperand;
static inline void *moe_at(const MoEOperand *o, int e, int r0) {
    return (char *)o->base + ((size_t)r0 * o->per_row + (size_t)e * o->per_expert) * o->elem;
}

#define MOE_GEMM_SITES 6 // the forward's 2 GEMMs and the backward's 4 (its dW's two own the fp32 outputs)
static cublasHandle_t moe_cublas = NULL;
static void **moe_ptrs_host = NULL, **moe_ptrs_dev = NULL; // (sites, 3, MOE_MAX_EXPERTS) A, B, D pointers
static int moe_grouped_ok[2] = {-1, -1}; // by d_fp32: -1 not yet tried; 0 the loop (M2RNN_MOE_LOOP=1 or unsupported)

// D_e (m × n, column-major, ld ldd) = op(A_e) op(B_e) (+ D_e with accumulate) for every expert with rows, where the
// dimension `vary` (0: m, 1: n, 2: k) is the expert's row count n_e. d_fp32: D in fp32 (the weight gradients).
// cuBLAS 13.0 groups bf16 × bf16 → bf16 but not bf16 × bf16 → fp32: the weight gradients run as the loop, one
// cublasGemmEx call per expert (a grouped fp32 × fp32 → fp32 call on TF32 tensor cores over widened copies measured
// 1.7× slower: dev/bench/NOTES.md).
static void moe_gemm(int site, const int *off, int E, int trans_a, int trans_b, int m, int n, int k, int vary,
                     const MoEOperand *A, int lda, const MoEOperand *B, int ldb, const MoEOperand *D, int ldd,
                     int d_fp32, int accumulate, const Runtime *rt) {
    if (moe_cublas == NULL) {
        cublasCheck(cublasCreate(&moe_cublas));
        cudaCheck(cudaMallocHost(&moe_ptrs_host, (size_t)MOE_GEMM_SITES * 3 * MOE_MAX_EXPERTS * sizeof(void *)));
        cudaCheck(cudaMalloc(&moe_ptrs_dev, (size_t)MOE_GEMM_SITES * 3 * MOE_MAX_EXPERTS * sizeof(void *)));
    }
    cublasCheck(cublasSetStream(moe_cublas, rt->stream));
    if (moe_grouped_ok[d_fp32] < 0) { moe_grouped_ok[d_fp32] = !env_is_1("M2RNN_MOE_LOOP"); }
    int dims[3] = {m, n, k};
    if (moe_grouped_ok[d_fp32]) {
        static int gm[MOE_MAX_EXPERTS], gn[MOE_MAX_EXPERTS], gk[MOE_MAX_EXPERTS], glda[MOE_MAX_EXPERTS];
        static int gldb[MOE_MAX_EXPERTS], gldd[MOE_MAX_EXPERTS], gsize[MOE_MAX_EXPERTS];
        static float galpha[MOE_MAX_EXPERTS], gbeta[MOE_MAX_EXPERTS];
        static cublasOperation_t gta[MOE_MAX_EXPERTS], gtb[MOE_MAX_EXPERTS];
        void **hp = moe_ptrs_host + (size_t)site * 3 * MOE_MAX_EXPERTS, **dp = moe_ptrs_dev + (size_t)site * 3 * MOE_MAX_EXPERTS;
        int groups = 0;
        for (int e = 0; e < E; e++) {
            const int r0 = off[e], rows = off[e + 1] - off[e];
            if (rows == 0) { continue; }
            dims[vary] = rows;
            gm[groups] = dims[0]; gn[groups] = dims[1]; gk[groups] = dims[2];
            glda[groups] = lda; gldb[groups] = ldb; gldd[groups] = ldd; gsize[groups] = 1;
            galpha[groups] = 1.0f; gbeta[groups] = accumulate ? 1.0f : 0.0f;
            gta[groups] = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N; gtb[groups] = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
            hp[groups] = moe_at(A, e, r0);
            hp[MOE_MAX_EXPERTS + groups] = moe_at(B, e, r0);
            hp[2 * MOE_MAX_EXPERTS + groups] = moe_at(D, e, r0);
            groups++;
        }
        if (groups == 0) { return; }
        // (the pinned host array is rewritten only after the stream has synchronized again: moe_group / the backward)
        cudaCheck(cudaMemcpyAsync(dp, hp, 3 * MOE_MAX_EXPERTS * sizeof(void *), cudaMemcpyHostToDevice, rt->stream));
        const cublasStatus_t st = cublasGemmGroupedBatchedEx(
            moe_cublas, gta, gtb, gm, gn, gk, galpha, (const void *const *)dp, CUBLAS_LOWP, glda,
            (const void *const *)(dp + MOE_MAX_EXPERTS), CUBLAS_LOWP, gldb, gbeta, dp + 2 * MOE_MAX_EXPERTS,
            d_fp32 ? CUDA_R_32F : CUBLAS_LOWP, gldd, groups, gsize, CUBLAS_COMPUTE_32F);
        if (st == CUBLAS_STATUS_SUCCESS) { return; }
        if (st != CUBLAS_STATUS_NOT_SUPPORTED) { cublasCheck(st); }
        moe_grouped_ok[d_fp32] = 0; // this cuBLAS lacks the grouped call for these types: the loop from now on
        // (cuBLAS 13.0: the bf16 → fp32 weight gradients; the fp32 build groups all of them)
    }
    // the loop: cublasGemmEx (its host cost is about half a cuBLASLt call's with its heuristic query), the same
    // problem, types and fp32 compute
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    for (int e = 0; e < E; e++) {
        const int r0 = off[e], rows = off[e + 1] - off[e];
        if (rows == 0) { continue; }
        dims[vary] = rows;
        cublasCheck(cublasGemmEx(moe_cublas, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 dims[0], dims[1], dims[2], &alpha, moe_at(A, e, r0), CUBLAS_LOWP, lda, moe_at(B, e, r0),
                                 CUBLAS_LOWP, ldb, &beta, moe_at(D, e, r0), d_fp32 ? CUDA_R_32F : CUBLAS_LOWP, ldd,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}
// ----------------------------------------------------------------------------------------------------------------
// the feed-forward

static void moe_ffn_forward(floatX *out, void *acts, void *scratch, const floatX *inp, const KindTensors *t,
                            const ModelConfig *c, int B, int T, const Runtime *rt) {
    const MoEParams *w = (const MoEParams *)t->w;
    MoEActs a;
    moe_acts_layout(&a, acts, c, B, T);
    MoEScratch s;
    moe_scratch_layout(&s, scratch, c, B, T);
    cudaStream_t stream = rt->stream;
    const int M = B * T, C = c->d_model, E = c->moe.experts, K = c->moe.top_k, F = c->moe.hidden, S = c->moe.shared;
    // the router: fp32 logits (M, E) = x W_rᵀ, then softmax and top-k
    matmul_cublaslt_ld(s.logits, 1, w->router_w, inp, E, M, C, 1, 0, 1.0f, 0.0f, 1, 0, 0, 0, 0, 0, 0, rt);
    const unsigned router_blocks = (unsigned)CEIL_DIV(M, 4);
    if (E <= 128) { moe_router_kernel<4><<<router_blocks, 128, 0, stream>>>(a.probs, a.weights, a.choice, s.logits, M, E, K); }
    else if (E <= 256) { moe_router_kernel<8><<<router_blocks, 128, 0, stream>>>(a.probs, a.weights, a.choice, s.logits, M, E, K); }
    else { moe_router_kernel<32><<<router_blocks, 128, 0, stream>>>(a.probs, a.weights, a.choice, s.logits, M, E, K); }
    cudaCheck(cudaGetLastError());
    const int *off = moe_group(&a, s.counts, M, E, K, stream);
    const long MK = (long)M * K;
    moe_gather_kernel<<<(unsigned)MK, 128, 0, stream>>>(s.xs, inp, a.order, C);
    cudaCheck(cudaGetLastError());
    const size_t X = sizeof(floatX);
    // up (n_e, 2F) = xs_e W_up,eᵀ: column-major (2F × n_e) = W_up,e(C × 2F)ᵀ · xs_e (C × n_e)
    const MoEOperand w_up = {w->up_w, X, 0, (size_t)2 * F * C}, xs = {s.xs, X, (size_t)C, 0};
    const MoEOperand up = {a.up, X, (size_t)2 * F, 0}, h = {a.h, X, (size_t)F, 0};
    const MoEOperand w_down = {w->down_w, X, 0, (size_t)C * F}, y = {a.y, X, (size_t)C, 0};
    moe_gemm(0, off, E, 1, 0, 2 * F, 0, C, 1, &w_up, C, &xs, C, &up, 2 * F, 0, 0, rt);
    swiglu_pointwise_forward(a.h, a.up, (int)MK, F, stream);
    moe_gemm(1, off, E, 1, 0, C, 0, F, 1, &w_down, F, &h, F, &y, C, 0, 0, rt); // y (n_e, C) = h_e W_down,eᵀ
    if (S > 0) { // the shared expert, ungated
        matmul_forward(a.sup, inp, w->shared_up_w, M, C, 2 * S, rt);
        swiglu_pointwise_forward(a.sh, a.sup, M, S, stream);
        matmul_forward(out, a.sh, w->shared_down_w, M, S, C, rt);
    } else {
        cudaCheck(cudaMemsetAsync(out, 0, (size_t)M * C * sizeof(floatX), stream));
    }
    moe_combine_kernel<<<M, 256, 0, stream>>>(out, a.y, a.slot, a.weights, K, C);
    cudaCheck(cudaGetLastError());
    if (t->aux != NULL && moe_aux_coef(c) > 0) { // the load-balancing loss, summed on the host in expert order
        moe_pbar_kernel<<<E, 256, 0, stream>>>(s.pbar, a.probs, M, E);
        cudaCheck(cudaGetLastError());
        float pbar[MOE_MAX_EXPERTS];
        cudaCheck(cudaMemcpyAsync(pbar, s.pbar, (size_t)E * sizeof(float), cudaMemcpyDeviceToHost, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        double aux = 0.0;
        for (int e = 0; e < E; e++) { aux += (double)pbar[e] * ((off[e + 1] - off[e]) / ((double)M * K)); }
        *t->aux += moe_aux_coef(c) * E * aux;
    }
}

// dinp (B,T,C) written; parameter gradients +=
static void moe_ffn_backward(floatX *dinp, void *scratch, const floatX *dout, const floatX *inp, const void *acts,
                             const KindTensors *t, const ModelConfig *c, int B, int T, const Runtime *rt) {
    const MoEParams *w = (const MoEParams *)t->w;
    const MoEParams32 *g = (const MoEParams32 *)t->g;
    MoEActs a;
    moe_acts_layout(&a, (void *)acts, c, B, T);
    MoEScratch s;
    moe_scratch_layout(&s, scratch, c, B, T);
    cudaStream_t stream = rt->stream;
    const int M = B * T, C = c->d_model, E = c->moe.experts, K = c->moe.top_k, F = c->moe.hidden, S = c->moe.shared;
    const long MK = (long)M * K;
    int *off = moe_host_offsets();
    cudaCheck(cudaMemcpyAsync(off, a.offsets, ((size_t)E + 1) * sizeof(int), cudaMemcpyDeviceToHost, stream));
    moe_gather_kernel<<<(unsigned)MK, 128, 0, stream>>>(s.xs, inp, a.order, C);
    cudaCheck(cudaGetLastError());
    if (S > 0) {
        matmul_backward(s.dsh, g->shared_down_w, dout, a.sh, w->shared_down_w, M, S, C, 0, rt);
        swiglu_pointwise_backward(s.dsup, s.dsh, a.sup, M, S, stream);
        matmul_backward(dinp, g->shared_up_w, s.dsup, inp, w->shared_up_w, M, C, 2 * S, 0, rt);
    } else {
        cudaCheck(cudaMemsetAsync(dinp, 0, (size_t)M * C * sizeof(floatX), stream));
    }
    moe_dy_kernel<<<M, 256, 0, stream>>>(s.dy, s.dw, dout, a.y, a.slot, a.weights, K, C);
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaStreamSynchronize(stream)); // off[] on the host
    const size_t X = sizeof(floatX);
    const MoEOperand w_up = {w->up_w, X, 0, (size_t)2 * F * C}, xs = {s.xs, X, (size_t)C, 0};
    const MoEOperand w_down = {w->down_w, X, 0, (size_t)C * F}, h = {a.h, X, (size_t)F, 0};
    const MoEOperand dy = {s.dy, X, (size_t)C, 0}, dh = {s.dh, X, (size_t)F, 0};
    const MoEOperand dup = {s.dup, X, (size_t)2 * F, 0}, dxs = {s.dxs, X, (size_t)C, 0};
    const MoEOperand g_up = {g->up_w, sizeof(float), 0, (size_t)2 * F * C}, g_down = {g->down_w, sizeof(float), 0, (size_t)C * F};
    // dh (n_e, F) = dy_e W_down,e: column-major (F × n_e) = W_down,e (F × C) · dy_e (C × n_e)
    moe_gemm(2, off, E, 0, 0, F, 0, C, 1, &w_down, F, &dy, C, &dh, F, 0, 0, rt);
    // dW_down,e (C, F) += dy_eᵀ h_e: column-major (F × C) = h_e (F × n_e) · dy_e (C × n_e)ᵀ
    moe_gemm(3, off, E, 0, 1, F, C, 0, 2, &h, F, &dy, C, &g_down, F, 1, 1, rt);
    swiglu_pointwise_backward(s.dup, s.dh, a.up, (int)MK, F, stream);
    // dxs (n_e, C) = dup_e W_up,e: column-major (C × n_e) = W_up,e (C × 2F) · dup_e (2F × n_e)
    moe_gemm(4, off, E, 0, 0, C, 0, 2 * F, 1, &w_up, C, &dup, 2 * F, &dxs, C, 0, 0, rt);
    // dW_up,e (2F, C) += dup_eᵀ xs_e: column-major (C × 2F) = xs_e (C × n_e) · dup_e (2F × n_e)ᵀ
    moe_gemm(5, off, E, 0, 1, C, 2 * F, 0, 2, &xs, C, &dup, 2 * F, &g_up, C, 1, 1, rt);
    const float aux_scale = moe_aux_coef(c) > 0 ? t->aux_grad * moe_aux_coef(c) * E : 0.0f;
    moe_token_backward_kernel<<<M, 256, 0, stream>>>(dinp, s.dlogits_x, s.dxs, a.slot, a.choice, a.weights, s.dw,
                                                     a.probs, a.offsets, aux_scale, M, E, K, C);
    cudaCheck(cudaGetLastError());
    matmul_backward(dinp, g->router_w, s.dlogits_x, inp, w->router_w, M, C, E, 1, rt);
}

static size_t moe_ffn_state_bytes(const ModelConfig *c, int context) { return 0; }

static void moe_ffn_step(floatX *out, void *state, void *work, StepInput *in, const KindTensors *t,
                         const ModelConfig *c, int B, const int *pos, int context, const Runtime *rt) {
    MoEActs a;
    const size_t acts = moe_acts_layout(&a, NULL, c, B, 1);
    KindTensors no_aux = *t;
    no_aux.aux = NULL;
    moe_ffn_forward(out, work, (char *)work + acts, step_input_rows(in, B, c->d_model, rt->stream), &no_aux, c, B, 1,
                    rt);
}

// the limits of the kernels above, checked once when the model is built (model_config_validate covers the rest)
static void moe_check_config(const ModelConfig *c) {
    if (c->moe.experts > MOE_MAX_EXPERTS || c->moe.top_k > MOE_MAX_TOP_K) {
        fail_with_hint("use at most 1024 experts and top-k at most 32 on the GPU (./train_m2rnn_cpu has no limit)",
                       "MoE with %d experts, top-%d exceeds the GPU kernels' limits", c->moe.experts, c->moe.top_k);
    }
}

static const KindOps MOE_OPS = {'e', moe_ffn_acts_bytes, moe_ffn_scratch_bytes, moe_ffn_forward, moe_ffn_backward,
                                moe_ffn_state_bytes, moe_ffn_step, NULL}; // stateless: a prefill runs forward

#endif // M2RNN_MOE_CUH
