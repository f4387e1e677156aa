/*
common.cuh: the GPU foundation every layer uses, mirroring ref/common.h: the runtime context (device, stream,
cuBLASLt handle and workspace: no global device or stream), cuBLASLt matmuls (and a decode step's own GEMV and skinny
tensor-core products), the embedding (forward, deterministic
backward), RMSNorm with the residual add fused in, the classifier (cross-entropy over the real vocabulary of the
padded one, its gradient written in place of the logits, probabilities never stored), AdamW on fp32 master weights,
the global gradient norm, fixed-order partial reductions; and the small interface every layer kind implements
(KindOps, below), which kinds.cuh gathers into the GPU's kind table.

Storage: activations and the working copy of the weights in floatX (bf16; fp32 in the ENABLE_FP32 build); parameter
gradients, master weights and AdamW state in fp32; every reduction accumulates in fp32. Parameter gradients are
accumulated (+=) so micro-batches add up; activation gradients are written (=) unless a launcher says otherwise.
Every reduction over tokens runs in a fixed order (per-block partials, then one ordered pass), so a step is bitwise
reproducible on a given GPU.
*/
#ifndef M2RNN_COMMON_CUH
#define M2RNN_COMMON_CUH

#include <cublasLt.h>
#include <cublas_v2.h>

#include "cuda_common.h"
#include "tiles.cuh"
#include "model.h"
#include "utils.h"

// ----------------------------------------------------------------------------------------------------------------
// small device helpers

__device__ __forceinline__ float to_float(floatX x) { return (float)x; }
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_grad_f(float x) {
    const float s = 1.0f / (1.0f + expf(-x));
    return s * (1.0f + x * (1.0f - s));
}
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// 16 bytes of floatX, the unit of vectorized loads and stores: a warp-wide load then moves 512 bytes, enough bytes in
// flight to run at bandwidth (2-byte scalar loads leave a memory-bound kernel latency-bound, e.g. 380 us instead of
// 40 us for one RMSNorm backward at B·T = 16k, C = 768)
#define PACK (16 / (int)sizeof(floatX))
typedef struct { floatX v[PACK]; } __align__(16) Pack;

// max of val over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result
__device__ float block_reduce_max(float val) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    val = warp_reduce_max(val);
    __syncthreads();
    if (lane == 0) { partial[warp] = val; }
    __syncthreads();
    val = lane < warps ? partial[lane] : -INFINITY;
    return warp_reduce_max(val);
}

// sum of val over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result
__device__ float block_reduce_sum(float val) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    val = warp_reduce_sum(val);
    __syncthreads(); // partial[] may still be read by a previous call
    if (lane == 0) { partial[warp] = val; }
    __syncthreads();
    val = lane < warps ? partial[lane] : 0.0f;
    return warp_reduce_sum(val);
}

// ----------------------------------------------------------------------------------------------------------------
// cuBLAS(Lt)

static void cublas_check(cublasStatus_t status, const char *file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "[cuBLAS ERROR] %d at file %s:%d\n", (int)status, file, line);
        exit(EXIT_FAILURE);
    }
}
#define cublasCheck(status) (cublas_check((status), __FILE__, __LINE__))

#if FLOATX_IS_FP32
static const cudaDataType_t CUBLAS_LOWP = CUDA_R_32F;
#else
static const cudaDataType_t CUBLAS_LOWP = CUDA_R_16BF;
#endif

// ----------------------------------------------------------------------------------------------------------------
// the runtime context: what one process needs to run the model on one GPU. A program (or one rank of a multi-GPU
// job, or an inference engine beside a trainer) holds its own; every launcher takes it or its stream.

typedef struct {
    int device;
    cudaDeviceProp prop;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_workspace;
    size_t lt_workspace_bytes;
    int plain_recurrence; // M2RNN: the plain fp32 recurrence even where the tensor-core kernels apply (bitwise
                          // repeatable; env M2RNN_PLAIN_RECURRENCE=1, or tests)
    int decode_step;      // set while a decode step (one token a sequence) runs: its products with at most GEMV_MAX_M
                          // rows take the GEMV kernel; a prefill's keep cuBLASLt, so a prefill in chunks stays bit for
                          // bit one whole prefill
} Runtime;

// The tensor-parallel group a layer runs in on the GPUs (comm.h's TP group; lm.cuh fills it over NCCL; NULL or size
// 1: one GPU): sum all-reduces n numbers in place on the stream, fp32 (per-token scalars) or floatX (activations),
// and counts each call in calls (the tests count the collectives per layer). The CPU twin is ref/common.h's TPLink.
typedef struct TPGroup {
    int size, rank;
    void (*sum)(struct TPGroup *g, void *x, size_t n, int fp32, cudaStream_t stream);
    void *ctx;
    long calls;
} TPGroup;
static inline void tp_sum(TPGroup *g, void *x, size_t n, int fp32, cudaStream_t stream) {
    if (g != NULL && g->size > 1) { g->calls++; g->sum(g, x, n, fp32, stream); }
}

// sets up the runtime on `device`, refusing with a hint when there is none or it is older than the build's target
static void runtime_init(Runtime *rt, int device) {
    memset(rt, 0, sizeof(*rt));
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        fail_with_hint("run ./train_m2rnn_cpu (the CPU reference) on a machine without a GPU",
                       "no CUDA device (%s)", err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    }
    if (device < 0 || device >= count) {
        fail_with_hint("pick a device that exists", "CUDA device %d requested, %d present", device, count);
    }
    rt->device = device;
    cudaCheck(cudaSetDevice(device));
    cudaCheck(cudaGetDeviceProperties(&rt->prop, device));
    if (rt->prop.major < 9) { // the build holds sm_90a code and compute_90 PTX, which no older GPU can run
        fail_with_hint("this build targets Hopper (sm_90); on this GPU train with ./train_m2rnn_cpu",
                       "GPU %d (%s) has compute capability %d.%d, this build needs 9.0 or newer", device,
                       rt->prop.name, rt->prop.major, rt->prop.minor);
    }
    cudaCheck(cudaStreamCreate(&rt->stream));
    cublasCheck(cublasLtCreate(&rt->lt));
    rt->lt_workspace_bytes = 32 * 1024 * 1024;
    cudaCheck(cudaMalloc(&rt->lt_workspace, rt->lt_workspace_bytes));
    const char *env = getenv("M2RNN_PLAIN_RECURRENCE");
    rt->plain_recurrence = env != NULL && strcmp(env, "1") == 0;
}

static void runtime_free(Runtime *rt) {
    cudaCheck(cudaSetDevice(rt->device));
    cudaCheck(cudaFree(rt->lt_workspace));
    cublasCheck(cublasLtDestroy(rt->lt));
    cudaCheck(cudaStreamDestroy(rt->stream));
    memset(rt, 0, sizeof(*rt));
}

// Column-major D (m, n) = alpha · op(A) op(B) + beta · D, batched with strides; A and B in floatX, D in floatX or fp32
// (d_fp32). The fp32 build computes in plain fp32 (no TF32), so it can be held to the CPU reference at 1e-4.
// the largest power of two (≤ 256) dividing both the address and the leading dimension in bytes: cuBLASLt picks a
// kernel for the alignment it is told, and every row of a view must meet it, not only the first
static uint32_t operand_alignment(const void *ptr, long long ld, size_t elem) {
    const unsigned long long v = (unsigned long long)(uintptr_t)ptr | (unsigned long long)(ld * (long long)elem) | 256ull;
    return (uint32_t)(v & (~v + 1));
}

// lda, ldb, ldd = 0 mean dense (the rows of op-less storage)
// one_kernel: the first of cuBLASLt's candidates that is one kernel (no split-K with its reduction kernel after it)
static void matmul_cublaslt_ld(void *d, int d_fp32, const floatX *a, const floatX *b, int m, int n, int k, int trans_a,
                               int trans_b, float alpha, float beta, int batch, long long stride_a, long long stride_b,
                               long long stride_d, int lda, int ldb, int ldd, const Runtime *rt, int one_kernel = 0) {
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    cublasLtMatrixLayout_t la, lb, ld;
    if (lda == 0) { lda = trans_a ? k : m; }
    if (ldb == 0) { ldb = trans_b ? n : k; }
    if (ldd == 0) { ldd = m; }
    cublasCheck(cublasLtMatrixLayoutCreate(&la, CUBLAS_LOWP, trans_a ? k : m, trans_a ? m : k, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, CUBLAS_LOWP, trans_b ? n : k, trans_b ? k : n, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld, d_fp32 ? CUDA_R_32F : CUBLAS_LOWP, m, n, ldd));
    if (batch > 1) {
        cublasLtMatrixLayout_t layouts[3] = {la, lb, ld};
        long long strides[3] = {stride_a, stride_b, stride_d};
        for (int i = 0; i < 3; i++) {
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                         &strides[i], sizeof(strides[i])));
        }
    }
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &rt->lt_workspace_bytes, sizeof(rt->lt_workspace_bytes)));
    const size_t ex = sizeof(floatX), ed = d_fp32 ? sizeof(float) : sizeof(floatX);
    uint32_t align_a = operand_alignment(a, lda, ex), align_b = operand_alignment(b, ldb, ex);
    uint32_t align_d = operand_alignment(d, ldd, ed);
    if (batch > 1) {
        align_a = min(align_a, operand_alignment(NULL, stride_a, ex));
        align_b = min(align_b, operand_alignment(NULL, stride_b, ex));
        align_d = min(align_d, operand_alignment(NULL, stride_d, ed));
    }
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
    cublasLtMatmulHeuristicResult_t heuristic, cand[8];
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(rt->lt, desc, la, lb, ld, ld, pref, one_kernel ? 8 : 1, cand, &found));
    if (found == 0) {
        fail_with_hint("report the shape; it is a cuBLASLt limitation we have not met",
                       "no cuBLASLt algorithm for m=%d n=%d k=%d transA=%d transB=%d batch=%d", m, n, k, trans_a,
                       trans_b, batch);
    }
    heuristic = cand[0];
    for (int i = 0; one_kernel && i < found; i++) {
        uint32_t split = 1;
        size_t written = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&cand[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split),
                                             &written);
        if (split <= 1) { heuristic = cand[i]; break; }
    }
    cublasCheck(cublasLtMatmul(rt->lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &heuristic.algo,
                               rt->lt_workspace, rt->lt_workspace_bytes, rt->stream));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(ld));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}

static void matmul_cublaslt(void *d, int d_fp32, const floatX *a, const floatX *b, int m, int n, int k, int trans_a,
                            int trans_b, float alpha, float beta, int batch, long long stride_a, long long stride_b,
                            long long stride_d, const Runtime *rt) {
    matmul_cublaslt_ld(d, d_fp32, a, b, m, n, k, trans_a, trans_b, alpha, beta, batch, stride_a, stride_b, stride_d, 0,
                       0, 0, rt);
}

// OC not a multiple of 8 (GDN's projection: 2HK + 2HV + 2H rows) sends cuBLASLt to an Ampere kernel for 2-element
// alignment, 2-3× slower than the Hopper kernels (ncu, H200: 0.85 against ≈ 0.3 ms at B·T = 32768, 1024 → 3076); the
// matmuls below take the first OC8 = OC rounded down to 8 output rows apart from the few left (a thin product).
static inline int matmul_oc_main(int OC) { return OC > 8 && OC % 8 != 0 ? OC / 8 * 8 : OC; }

// ----------------------------------------------------------------------------------------------------------------
// RMSNorm of one row by one warp (rmsnorm_forward_kernel's fast path, and the prologue of a decode step's product)

#define RMSNORM_FWD_PACKS 8 // 16-byte packs a lane keeps in registers (rows up to 32·8·PACK: 2048 in bf16)
// rows in whole 16-byte packs (so every row starts 16-byte aligned) and at most RMSNORM_FWD_PACKS rounds of them (the
// last round possibly partial: C = 1344, M²RNN's N·V, is 5.25 rounds)
__host__ __device__ inline bool rmsnorm_row_packs_ok(int C) {
    return C % PACK == 0 && CEIL_DIV(C, WARP_SIZE * PACK) <= RMSNORM_FWD_PACKS;
}
// out = a' · rsqrt(mean(a'²) + 1e-5) · weight, a' = a + b (b not NULL; a' rounded to floatX) or a, and a' written to
// residual_out when not NULL; *rstd = the factor (rstd not NULL). The row in registers; out may be shared memory.
// The weight's packs are loaded with the row's, so a row costs one round trip to memory, not two (a decode step's
// norms are a few rows each: their time is that latency). (The decode products' prologue has its own two-part norm,
// norm_inputs_block and rmsnorm_row_smem, with the same arithmetic.)
// PARTS: b is given instead as np fp32 partial sums (parts, pstride floats apart), added in order and rounded to
// floatX (a decode step's branch product split along K: step_branch_product).
// The loads go in batches of RMSNORM_FWD_PACKS / 2 packs (a row of 1024 in bf16 is one batch), each batch's loads
// straight-line at addresses clamped into the row (a lane past its end loads the row's last pack and drops it), with
// no store between them: the scheduler issues them together, one round trip to memory a batch. (A loop that stopped
// at the row's end and stored x + branch as it went made one round trip a pack: 4 to 6 in a decode step's norms.)
template <bool PARTS = false>
__device__ __forceinline__ void rmsnorm_row_packs(floatX *out, float *rstd, floatX *residual_out, const floatX *a,
                                                  const floatX *b, const floatX *weight, int C, int lane,
                                                  const float *parts = NULL, int np = 0, long pstride = 0) {
    constexpr int BATCH = RMSNORM_FWD_PACKS / 2;
    Pack xs[RMSNORM_FWD_PACKS], ws[RMSNORM_FWD_PACKS];
    float ss = 0.0f;
    const bool has_b = PARTS || b != NULL;
#pragma unroll
    for (int p0 = 0; p0 < RMSNORM_FWD_PACKS; p0 += BATCH) {
        if (p0 * WARP_SIZE * PACK >= C) { break; }
        Pack bp[BATCH];
#pragma unroll
        for (int q = 0; q < BATCH; q++) {
            const int i = min(((p0 + q) * WARP_SIZE + lane) * PACK, C - PACK);
            ws[p0 + q] = *(const Pack *)(weight + i);
            xs[p0 + q] = *(const Pack *)(a + i);
            if constexpr (PARTS) {
                float bs[PACK];
                for (int k = 0; k < PACK; k += 4) {
                    const float4 v = *(const float4 *)(parts + i + k);
                    bs[k] = v.x; bs[k + 1] = v.y; bs[k + 2] = v.z; bs[k + 3] = v.w;
                }
                for (int sp = 1; sp < np; sp++) {
                    for (int k = 0; k < PACK; k += 4) {
                        const float4 v = *(const float4 *)(parts + sp * pstride + i + k);
                        bs[k] += v.x; bs[k + 1] += v.y; bs[k + 2] += v.z; bs[k + 3] += v.w;
                    }
                }
                for (int k = 0; k < PACK; k++) { bp[q].v[k] = (floatX)bs[k]; }
            } else if (has_b) {
                bp[q] = *(const Pack *)(b + i);
            }
        }
#pragma unroll
        for (int q = 0; q < BATCH; q++) {
            const int p = p0 + q;
            if ((p * WARP_SIZE + lane) * PACK < C) {
                if (has_b) {
                    for (int k = 0; k < PACK; k++) { xs[p].v[k] = (floatX)(to_float(xs[p].v[k]) + to_float(bp[q].v[k])); }
                }
                for (int k = 0; k < PACK; k++) { ss += to_float(xs[p].v[k]) * to_float(xs[p].v[k]); }
            }
        }
    }
    ss = warp_reduce_sum(ss);
    const float s = rsqrtf(ss / C + 1e-5f);
    if (lane == 0 && rstd != NULL) { *rstd = s; }
#pragma unroll
    for (int p0 = 0; p0 < RMSNORM_FWD_PACKS; p0 += BATCH) {
        if (p0 * WARP_SIZE * PACK >= C) { break; }
#pragma unroll
        for (int q = 0; q < BATCH; q++) {
            const int p = p0 + q, i = (p * WARP_SIZE + lane) * PACK;
            if (i < C) {
                if (residual_out != NULL) { *(Pack *)(residual_out + i) = xs[p]; } // what the norm read
                Pack o;
                for (int k = 0; k < PACK; k++) { o.v[k] = (floatX)(to_float(xs[p].v[k]) * s * to_float(ws[p].v[k])); }
                *(Pack *)(out + i) = o;
            }
        }
    }
}

// the output gate of one element: *y = x + v·d (rounded; x without D), returns y ⊙ SiLU(g) rounded (gate.cuh's
// output_gate_forward_kernel and a decode step's fused product both go through it: the same bits)
__device__ __forceinline__ floatX output_gate_value(floatX *y, floatX x, floatX v, floatX g, floatX d, bool has_d) {
    floatX yv = x;
    if (has_d) { yv = (floatX)(to_float(yv) + to_float(v) * to_float(d)); }
    *y = yv;
    return (floatX)(to_float(yv) * silu_f(to_float(g)));
}

// A decode step's products have a handful of rows (M = the sequences decoding) and are a read of the weight: cuBLASLt
// sends them to split-K tile kernels plus a reduction kernel (or a dot and a reduce kernel), two launches each. For
// M ≤ GEMV_MAX_M one kernel instead: a warp per R output rows, each lane 16-byte pieces of those weight rows
// and of the M input rows (L1-resident), fp32 products summed per lane in k order and then across the warp by
// shuffles (a fixed order). IC a multiple of PACK (rows 16-byte aligned).
// GLU: the SwiGLU in the epilogue. The weight is (2·OC, IC), gate rows then up rows; the warp sums gate row o and up
// row OC + o and writes SiLU(gate) ⊙ up, each first rounded to floatX as the product stores them: the same bits as the
// product of 2·OC rows followed by the pointwise kernel (swiglu.cuh), in one launch instead of two.
// NORM: the input rows are RMSNorm(x + branch) · w of the residual stream, made in the prologue into shared memory in
// every block (the rows by the whole block, norm_inputs_block; then row m normalized by warp m, rmsnorm_row_smem,
// rmsnorm_forward's arithmetic), block 0 also writing x + branch and the 1/rms: the same bits as rmsnorm_forward and
// then the product, one launch instead of two. (The first layer's x may be the embedding of the step's tokens,
// GemvNorm.tokens: then the embedding's launch goes too.)
// At most 4 rows: the GEMV's fp32 FMAs and input-row loads grow with M (a weight piece is used M times on the CUDA
// cores), and above 4 rows the step on the tensor-core products (the skinny product or cuBLASLt, the norms and
// pointwise ops as their own kernels) is faster; the 410M Hybrid M²RNN's step on an H200 at 5 / 6 / 8 sequences
// 1.20 / 1.34 / 1.69 ms with the GEMV, 1.15 / 1.16 / 1.09 without (NOTES.md, inference round 8).
#define GEMV_MAX_M 4
// the most rows a decode step's products give the GEMV: GEMV_MAX_M, or fewer by M2RNN_GEMV_MAX_M (0 .. GEMV_MAX_M;
// benchmarks: 0 puts every product on the tensor-core path)
static int gemv_rows_limit = -1;
static inline int gemv_max_rows(void) {
    const int m = env_int(&gemv_rows_limit, "M2RNN_GEMV_MAX_M", GEMV_MAX_M);
    if (m < 0 || m > GEMV_MAX_M) { gemv_rows_limit = GEMV_MAX_M; }
    return gemv_rows_limit;
}
// GATE (gate_g not NULL): the rows are RMSNorm(gated) · w, gated = (x + v ⊙ D) ⊙ SiLU(g) by output_gate_value
// (M²RNN's output gate and mixer norm: output_gate_forward and rmsnorm_forward's bits, y itself not updated), made
// into shared memory and normalized there; no branch then.
typedef struct {
    const floatX *x;      // (M, IC) the residual stream (GATE: the recurrence's y)
    const floatX *branch; // (M, IC) added first, or NULL
    const floatX *w;      // (IC) the norm's weight
    floatX *x_out;        // (M, IC) x + branch (with branch; not x: the other blocks still read it)
    float *rstd;          // (M)
    const floatX *gate_v, *gate_g, *gate_D; // GATE: v (M, IC) and g (M, IC) views, rows v_stride, g_stride apart; D (IC)
    int v_stride, g_stride;
    const int *tokens;    // (M) or NULL: x is the embedding table and row m its row tokens[m] (the first layer's norm,
                          // the embedding in the prologue; x_out then gets the rows)
} GemvNorm;
// rows (count, IC) in shared memory = the gated rows m0 .. m0 + count − 1 of n (output_gate_value), by the whole
// block, GATE_U loads of each operand in flight a thread
__device__ __forceinline__ void gate_rows_block(floatX *rows, const GemvNorm *n, int m0, int count, int IC) {
    constexpr int GATE_U = 6; // (M²RNN's 1344 elements a row: one round of loads at 256 threads)
    const int total = count * IC;
    const bool has_d = n->gate_D != NULL;
    for (int i0 = threadIdx.x; i0 < total; i0 += GATE_U * blockDim.x) {
        floatX xv[GATE_U], vv[GATE_U], gv[GATE_U], dv[GATE_U];
#pragma unroll
        for (int u = 0; u < GATE_U; u++) {
            const int i = min(i0 + u * (int)blockDim.x, total - 1), r = i / IC, j = i - r * IC;
            const size_t m = (size_t)(m0 + r);
            xv[u] = n->x[m * IC + j];
            gv[u] = n->gate_g[m * n->g_stride + j];
            vv[u] = has_d ? n->gate_v[m * n->v_stride + j] : (floatX)0.0f;
            dv[u] = has_d ? n->gate_D[j] : (floatX)0.0f;
        }
#pragma unroll
        for (int u = 0; u < GATE_U; u++) {
            const int i = i0 + u * (int)blockDim.x;
            floatX y;
            if (i < total) { rows[i] = output_gate_value(&y, xv[u], vv[u], gv[u], dv[u], has_d); }
        }
    }
}

// An epilogue past the GEMV's store (a mixer's elementwise step work on its in-projection's outputs, one launch
// instead of two): load(lane, o0, R, M) before the dependency wait, for lane i < M·R the operands of output row
// o0 + i % R of sequence i / R (read-only inputs and state no kernel before it in the step writes); apply(m, o, y) on
// that lane after the store, y the stored (rounded) output. This one does nothing.
struct GemvNoEpilogue {
    static constexpr bool ACTIVE = false;
    __device__ __forceinline__ void load(int lane, int o0, int R, int M) {}
    __device__ __forceinline__ void apply(int m, int o, floatX y) {}
};

// a GEMV block's shared memory before its staged weights: with a norm the M rows it makes, then the norm's weight;
// staged without a norm the M input rows; else none
__host__ __device__ inline size_t gemv_rows_bytes(int M, int IC, bool norm, bool st) {
    return (size_t)(norm ? M + 1 : st ? M : 0) * IC * sizeof(floatX);
}

// The decode products' residual norm in their prologue, in two parts with little code. rmsnorm_row_packs (one warp:
// loads, sum, normalize, all unrolled for rows up to 2048) took 1.8 to 2.4 µs of the prologue at one sequence, even on
// a row already in shared memory (NOTES.md, inference round 20).
// norm_inputs_block: rows (M, IC) in shared memory = x + branch rounded to floatX as rmsnorm_row_packs rounds it (or x,
// or the embedding rows of n->tokens), by the whole block, its loads straight-line (one trip to L2); block 0 also
// writes them to x_out where they are new (with a branch or the embedding). Rows contiguous, IC a multiple of PACK.
__device__ __forceinline__ void norm_inputs_block(floatX *rows, const GemvNorm *n, int M, int IC) {
    constexpr int U = 4;
    const bool has_b = n->branch != NULL, emb = n->tokens != NULL;
    floatX *xo = blockIdx.x == 0 && (has_b || emb) ? n->x_out : NULL;
    const int total = M * IC;
    for (int k0 = threadIdx.x * PACK; k0 < total; k0 += U * blockDim.x * PACK) {
        Pack xv[U], bv[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + u * blockDim.x * PACK;
            if (k < total) {
                const int m = k / IC;
                xv[u] = *(const Pack *)(emb ? n->x + (size_t)n->tokens[m] * IC + (k - m * IC) : n->x + k);
                if (has_b) { bv[u] = *(const Pack *)(n->branch + k); }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + u * blockDim.x * PACK;
            if (k < total) {
                if (has_b) {
                    for (int e = 0; e < PACK; e++) { xv[u].v[e] = (floatX)(to_float(xv[u].v[e]) + to_float(bv[u].v[e])); }
                }
                *(Pack *)(rows + k) = xv[u];
                if (xo != NULL) { *(Pack *)(xo + k) = xv[u]; }
            }
        }
    }
}
// rmsnorm_row_smem: a warp normalizes its row (C) in place in shared memory with the weight w (shared memory), *rstd =
// the factor (rstd not NULL): rmsnorm_row_packs's arithmetic in its order (a lane sums its packs (p·32 + lane)·PACK in
// p order, then the warp's butterfly), so the same bits, in rolled loops
__device__ __forceinline__ void rmsnorm_row_smem(floatX *row, float *rstd, const floatX *w, int C, int lane) {
    float ss = 0.0f;
#pragma unroll 1
    for (int i = lane * PACK; i < C; i += WARP_SIZE * PACK) {
        const Pack x = *(const Pack *)(row + i);
        for (int k = 0; k < PACK; k++) { ss += to_float(x.v[k]) * to_float(x.v[k]); }
    }
    ss = warp_reduce_sum(ss);
    const float s = rsqrtf(ss / C + 1e-5f);
    if (lane == 0 && rstd != NULL) { *rstd = s; }
#pragma unroll 1
    for (int i = lane * PACK; i < C; i += WARP_SIZE * PACK) {
        const Pack x = *(const Pack *)(row + i), wv = *(const Pack *)(w + i);
        Pack o;
        for (int k = 0; k < PACK; k++) { o.v[k] = (floatX)(to_float(x.v[k]) * s * to_float(wv.v[k])); }
        *(Pack *)(row + i) = o;
    }
}

// acc[s][r][m] = Σ_k w(s, r)[k] · x[m·IC + k] over this lane's k (8 elements a 16-byte pack, packs WARP_SIZE apart,
// unrolled by 2): a GEMV lane's sums, before the warp's reduction. One function for every GEMV (the plain and staged
// matmul_gemv_kernel, matmul_gemv_stream_kernel), so that their "same sums in the same order" is one piece of code.
template <int NS, int R, int M, class WRow>
__device__ __forceinline__ void gemv_lane_sums(float (&acc)[NS][R][M], WRow w_row, const floatX *x, int IC, int lane) {
#pragma unroll
    for (int s = 0; s < NS; s++) {
#pragma unroll
        for (int r = 0; r < R; r++) {
#pragma unroll
            for (int m = 0; m < M; m++) { acc[s][r][m] = 0.0f; }
        }
    }
#pragma unroll 2
    for (int k = lane * PACK; k < IC; k += WARP_SIZE * PACK) {
        Pack w[NS][R], xv[M];
#pragma unroll
        for (int s = 0; s < NS; s++) {
#pragma unroll
            for (int r = 0; r < R; r++) { w[s][r] = *(const Pack *)(w_row(s, r) + k); }
        }
#pragma unroll
        for (int m = 0; m < M; m++) { xv[m] = *(const Pack *)(x + (size_t)m * IC + k); }
#pragma unroll
        for (int e = 0; e < PACK; e++) {
#pragma unroll
            for (int s = 0; s < NS; s++) {
#pragma unroll
                for (int r = 0; r < R; r++) {
#pragma unroll
                    for (int m = 0; m < M; m++) {
                        acc[s][r][m] = fmaf(to_float(w[s][r].v[e]), to_float(xv[m].v[e]), acc[s][r][m]);
                    }
                }
            }
        }
    }
}

// rows[0, total) = inp[0, total) (shared memory), by the whole block, its loads straight-line (one trip to L2), then a
// block barrier; total a multiple of PACK, inp 16-byte aligned
__device__ __forceinline__ void gemv_rows_to_smem(floatX *rows, const floatX *inp, int total) {
    constexpr int U = 4;
    for (int k0 = threadIdx.x * PACK; k0 < total; k0 += U * blockDim.x * PACK) {
        Pack v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + u * blockDim.x * PACK;
            if (k < total) { v[u] = *(const Pack *)(inp + k); }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + u * blockDim.x * PACK;
            if (k < total) { *(Pack *)(rows + k) = v[u]; }
        }
    }
    __syncthreads();
}

// ST: each warp's weight rows are copied into shared memory (cp.async, after the NORM rows) before the dependency
// wait, so that after it the product reads them from there instead of making its round trips to L2 then; else they
// are prefetched into L2 before the wait and streamed from there in the k loop. The same sums either way.
// Two blocks an SM (≤ 128 registers), as gemv_stages' one-wave rule assumes: without the bound ptxas took the 4-row
// in-projection with its conv epilogue to 148 registers, one block an SM (NOTES.md, inference round 14).
template <int M, bool GLU, bool NORM, int R, bool ST = false, class Epi = GemvNoEpilogue>
__global__ void __launch_bounds__(256, 2)
    matmul_gemv_kernel(floatX *out, int out_stride, const floatX *inp, const floatX *weight, int IC, int OC,
                       GemvNorm nrm, Epi epi) {
    extern __shared__ __align__(16) unsigned char gemv_rows[]; // NORM: (M, IC) the normed input rows, then (IC)
                                                                // the norm's weight; ST without NORM: (M, IC) the
                                                                // input rows; ST: then (warps, NS, R, IC) the weight
                                                                // rows (gemv_rows_bytes)
    constexpr int NS = GLU ? 2 : 1; // weight row sets: (gate, up) or one
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    using namespace tiles;
    const int o0 = (blockIdx.x * (blockDim.x / WARP_SIZE) + warp) * R;
    const floatX *wrow[NS][R];
#pragma unroll
    for (int s = 0; s < NS; s++) {
#pragma unroll
        for (int r = 0; r < R; r++) { // (spare rows: unused)
            wrow[s][r] = weight + ((size_t)s * OC + min(o0 + r, OC - 1)) * IC;
        }
    }
    // the weight rows start while the kernel before this one finishes (they do not depend on it), and so does the
    // norm's weight (a parameter), copied into shared memory: after the norm's reduction it is one trip to L2 fewer
    floatX *nw = (floatX *)gemv_rows + (size_t)M * IC;
    floatX *wsm = (floatX *)(gemv_rows + gemv_rows_bytes(M, IC, NORM, ST)) + (size_t)warp * NS * R * IC;
    if constexpr (NORM) {
        for (int k = threadIdx.x * PACK; k < IC; k += blockDim.x * PACK) { cp_async16(smem_addr(nw + k), nrm.w + k); }
        cp_async_commit();
    }
    if constexpr (ST) { // into this warp's rows of shared memory
#pragma unroll
        for (int s = 0; s < NS; s++) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                for (int k = lane * PACK; k < IC; k += WARP_SIZE * PACK) {
                    cp_async16(smem_addr(wsm + (size_t)(s * R + r) * IC + k), wrow[s][r] + k);
                }
            }
        }
        cp_async_commit();
    } else { // into L2
        constexpr int LINE = 128 / (int)sizeof(floatX);
#pragma unroll
        for (int s = 0; s < NS; s++) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                for (int k = lane * LINE; k < IC; k += WARP_SIZE * LINE) { prefetch_l2(wrow[s][r] + k); }
            }
        }
    }
    Epi ep = epi; // (its per-lane operands in registers)
    if constexpr (Epi::ACTIVE) { ep.load(lane, o0, R, M); }
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    if constexpr (NORM) {
        floatX *rows = (floatX *)gemv_rows;
        const bool gate = nrm.gate_g != NULL;
        if (gate) { // the gated rows, or x (+ branch), by the whole block
            gate_rows_block(rows, &nrm, 0, M, IC);
        } else {
            norm_inputs_block(rows, &nrm, M, IC);
        }
        trace_mark(0);
        if constexpr (ST) { cp_async_wait<1>(); } else { cp_async_wait<0>(); } // (the norm's weight: its group)
        __syncthreads();
        trace_mark(1);
        if (warp < M) { rmsnorm_row_smem(rows + (size_t)warp * IC, blockIdx.x == 0 ? nrm.rstd + warp : NULL, nw, IC, lane); }
        trace_mark(2);
        __syncthreads();
        inp = rows;
    } else if constexpr (ST) {
        // the input rows into shared memory: read in the k loop they were ⌈IC / 512⌉ dependent trips (6 for a
        // down-projection's 2752), now the weights are not
        gemv_rows_to_smem((floatX *)gemv_rows, inp, M * IC);
        inp = (floatX *)gemv_rows;
    }
    trace_rows();
    if (o0 >= OC) { trace_end(NORM || ST); return; }
    float acc[NS][R][M];
    // ST: a lane reads back only the pieces it copied itself, so its own wait suffices
    if constexpr (ST) { cp_async_wait<0>(); }
    gemv_lane_sums(acc, [&](int s, int r) { return ST ? wsm + (size_t)(s * R + r) * IC : wrow[s][r]; }, inp, IC, lane);
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int m = 0; m < M; m++) {
            const floatX y = (floatX)warp_reduce_sum(acc[0][r][m]);
            floatX o = y;
            if constexpr (GLU) { o = (floatX)(silu_f(to_float(y)) * to_float((floatX)warp_reduce_sum(acc[NS - 1][r][m]))); }
            if (lane == 0 && o0 + r < OC) { out[(size_t)m * out_stride + o0 + r] = o; }
            if constexpr (Epi::ACTIVE) {
                if (lane == m * R + r && o0 + r < OC) { ep.apply(m, o0 + r, o); }
            }
        }
    }
    trace_end(NORM || ST);
}
// 1: one-row products whose grid is one wave take their weights into shared memory before the dependency wait (the
// default); 0: streamed from L2 after it (env M2RNN_GEMV_STAGE=0, for A/B runs; the same sums)
static int gemv_stage = -1;
static long gemv_staged_launches = 0; // launches that staged their weights (tests check the path they meant to take)
static inline bool gemv_stage_on(void) { return env_on_unless_0(&gemv_stage, "M2RNN_GEMV_STAGE"); }
// output rows a warp: 1 for a plain product of ≤ 2048 outputs (4× the blocks of R = 4: an H100's 1024-output GEMV
// 4.9 → 3.2 µs at IC = 2752), else 2 (a prologue is made by every block: more blocks cost more there); the sums are
// the same whatever R (each row's own lane order)
static inline int gemv_rows_a_warp(int OC, bool norm) { return !norm && OC <= 2048 ? 1 : 2; }
// a block's shared memory with its weights staged: its rows (gemv_rows_bytes), then 8 warps' NS · R weight rows
static inline size_t gemv_staged_bytes(int M, int IC, bool glu, bool norm, int R) {
    return gemv_rows_bytes(M, IC, norm, true) + (size_t)8 * (glu ? 2 : 1) * R * IC * sizeof(floatX);
}
// whether the GEMV stages its weights: one row, the grid one wave at two blocks an SM, ≤ 100 KB a block (the LM
// head's thousands of blocks keep streaming: a block there would stage, then compute, in turn). Measured at one row
// only: the 410M Hybrid M²RNN's step on an H200 0.75 → 0.66 ms; at 4 rows no gain (NOTES.md, inference round 13).
static inline bool gemv_stages(int M, int IC, int OC, bool glu, bool norm) {
    if (M != 1 || !gemv_stage_on()) { return false; }
    const int R = gemv_rows_a_warp(OC, norm);
    return CEIL_DIV(OC, 8 * R) <= 2 * device_num_sms() && gemv_staged_bytes(M, IC, glu, norm, R) <= 100 * 1024;
}
// one launch of the GEMV: with epi (and a norm), with a norm, or plain with R rows a warp; smem: the norm's rows and,
// with ST, the staged weight rows
template <int MM, bool GLU, bool ST, class Epi>
static void gemv_go(floatX *out, int out_stride, const floatX *inp, const floatX *weight, int IC, int OC,
                    const GemvNorm &n, bool norm, int R, unsigned grid, size_t smem, cudaStream_t stream,
                    const Epi *epi) {
    const GemvNoEpilogue no_epi;
    auto go = [&](auto kernel, auto e) {
        kernel_smem_limit(kernel, smem);
        launch_k(kernel, grid, 256, smem, stream, out, out_stride, inp, weight, IC, OC, n, e);
    };
    if (epi != NULL) {
        go(matmul_gemv_kernel<MM, GLU, true, 2, ST, Epi>, *epi);
    } else if (norm) {
        go(matmul_gemv_kernel<MM, GLU, true, 2, ST>, no_epi);
    } else if (R == 1) {
        go(matmul_gemv_kernel<MM, GLU, false, 1, ST>, no_epi);
    } else {
        go(matmul_gemv_kernel<MM, GLU, false, 2, ST>, no_epi);
    }
}
// The GEMV for very many outputs at up to GEMV_MAX_M rows (the LM head: 100,352 rows of 1,024): a grid of one wave (two
// blocks an SM), each block looping over 16-row groups gridDim.x apart, each warp copying its two rows of the next
// GEMV_STREAM_STAGES groups into its own shared-memory stages: one bulk copy a group (the two rows are contiguous),
// issued by lane 0 and counted on the stage's mbarrier, a stage refilled as soon as its group's products have read it,
// so the loop has no block barrier. The plain GEMV's 6,272 blocks each prefetched 32 KB into L2 and read it back after
// their wait: the LM head alone 54–56 µs, 3.7–3.8 TB/s of an H200's 4.8; this kernel with cp.async (a lane its
// 16-byte pieces) 50.2–50.9 µs; with bulk copies 49.8, against a plain read of the same bytes at 47.2–47.9
// (dev/bench/bench_decode_matmul.cu; NOTES.md, inference rounds 15 and 18).
// The same sums in the same order as matmul_gemv_kernel (each row one warp, lane-ordered k, the same reduction), so the
// same bits; the input rows are copied into shared memory once, after the wait.
#define GEMV_STREAM_STAGES 3
static int gemv_stream = -1; // 0: off (M2RNN_GEMV_STREAM=0, for A/B runs)
static long gemv_stream_launches = 0; // (tests check the path they meant to take)
static inline bool gemv_stream_on(void) { return env_on_unless_0(&gemv_stream, "M2RNN_GEMV_STREAM"); }
static inline size_t gemv_stream_bytes(int M, int IC) {
    return (size_t)M * IC * sizeof(floatX) + (size_t)8 * GEMV_STREAM_STAGES * (2 * IC * sizeof(floatX) + sizeof(uint64_t));
}
template <int M>
__global__ void __launch_bounds__(256, 2)
    matmul_gemv_stream_kernel(floatX *out, int out_stride, const floatX *inp, const floatX *weight, int IC, int OC) {
    extern __shared__ __align__(16) unsigned char gemv_rows[]; // (M, IC) the input rows, then (warps, stages, 2, IC)
                                                                // the weight rows, then (warps, stages) mbarriers
    using namespace tiles;
    constexpr int R = 2, S = GEMV_STREAM_STAGES;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, groups = CEIL_DIV(OC, 8 * R);
    floatX *rows = (floatX *)gemv_rows;
    floatX *wsm = rows + (size_t)M * IC + (size_t)warp * S * R * IC;
    const uint32_t mb = smem_addr((uint64_t *)(rows + (size_t)M * IC + (size_t)8 * S * R * IC) + warp * S); // stage 0's
    if (lane == 0) {
#pragma unroll
        for (int s = 0; s < S; s++) { mbar_init(mb + 8 * s, 1); }
        mbar_init_fence();
    }
    __syncwarp();
    // stage s ← this warp's rows of group g (those below OC), by lane 0; nothing past the last group or row
    auto issue = [&](int g, int s) {
        const int o0 = (g * 8 + warp) * R;
        if (g < groups && o0 < OC && lane == 0) {
            const uint32_t bytes = (uint32_t)(min(R, OC - o0) * IC * sizeof(floatX));
            mbar_arrive_tx(mb + 8 * s, bytes);
            bulk_g2s(smem_addr(wsm + (size_t)s * R * IC), weight + (size_t)o0 * IC, bytes, mb + 8 * s);
        }
    };
    int g = blockIdx.x;
#pragma unroll
    for (int s = 0; s < S; s++) { issue(g + s * (int)gridDim.x, s); } // (the weights do not depend on the wait)
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    gemv_rows_to_smem(rows, inp, M * IC);
    trace_rows();
    for (int it = 0; g < groups; it++, g += gridDim.x) {
        const int o0 = (g * 8 + warp) * R;
        if (o0 >= OC) { continue; } // (a warp past the last row: nothing copied, nothing to store; so are its later groups)
        mbar_wait(mb + 8 * (it % S), (uint32_t)(it / S) & 1); // (the stage's (it / S)-th fill)
        const floatX *ws = wsm + (size_t)(it % S) * R * IC; // (a row past OC holds stale data; its sum is not stored)
        float acc[1][R][M];
        gemv_lane_sums(acc, [&](int, int r) { return ws + (size_t)r * IC; }, rows, IC, lane);
        __syncwarp(); // (every lane has read the stage before lane 0 refills it, S groups ahead)
        issue(g + S * (int)gridDim.x, it % S);
#pragma unroll
        for (int r = 0; r < R; r++) {
#pragma unroll
            for (int m = 0; m < M; m++) {
                const floatX y = (floatX)warp_reduce_sum(acc[0][r][m]);
                if (lane == 0 && o0 + r < OC) { out[(size_t)m * out_stride + o0 + r] = y; }
            }
        }
    }
    trace_end();
}
template <int M>
static void gemv_stream_go(floatX *out, int out_stride, const floatX *inp, const floatX *weight, int IC, int OC,
                           cudaStream_t stream) {
    const size_t smem = gemv_stream_bytes(M, IC);
    const int groups = CEIL_DIV(OC, 16), grid = groups < 2 * device_num_sms() ? groups : 2 * device_num_sms();
    kernel_smem_limit(matmul_gemv_stream_kernel<M>, smem);
    launch_k(matmul_gemv_stream_kernel<M>, grid, 256, smem, stream, out, out_stride, inp, weight, IC, OC);
}
// the streamed GEMV where it takes the shape (more than 16,384 outputs, its stages in 110 KB); false otherwise
static bool matmul_gemv_stream(floatX *out, int out_stride, const floatX *inp, const floatX *weight, int M, int IC,
                               int OC, cudaStream_t stream) {
    if (!gemv_stream_on() || OC <= 16384 || M < 1 || M > GEMV_MAX_M || gemv_stream_bytes(M, IC) > 110 * 1024) {
        return false;
    }
    static_assert(GEMV_MAX_M == 4, "matmul_gemv_stream: one case a row count up to GEMV_MAX_M");
    switch (M) {
    case 1: gemv_stream_go<1>(out, out_stride, inp, weight, IC, OC, stream); break;
    case 2: gemv_stream_go<2>(out, out_stride, inp, weight, IC, OC, stream); break;
    case 3: gemv_stream_go<3>(out, out_stride, inp, weight, IC, OC, stream); break;
    case 4: gemv_stream_go<4>(out, out_stride, inp, weight, IC, OC, stream); break;
    }
    gemv_stream_launches++;
    return true;
}
// nrm NULL: the input rows are inp; else made from nrm (inp unused). epi (not NULL): an epilogue, with nrm only
template <bool GLU, class Epi = GemvNoEpilogue>
static bool matmul_gemv_launch(floatX *out, int out_stride, const floatX *inp, const floatX *weight, int M, int IC,
                               int OC, const GemvNorm *nrm, cudaStream_t stream, const Epi *epi = NULL) {
    if (M < 1 || M > gemv_max_rows() || IC % PACK != 0 || (uintptr_t)weight % 16 != 0) { return false; }
    if (epi != NULL && (nrm == NULL || GLU)) { return false; }
    if (nrm == NULL && (uintptr_t)inp % 16 != 0) { return false; }
    if (nrm == NULL && !GLU && epi == NULL && matmul_gemv_stream(out, out_stride, inp, weight, M, IC, OC, stream)) {
        return true;
    }
    if (nrm != NULL && (!rmsnorm_row_packs_ok(IC) || (size_t)M * IC * sizeof(floatX) > 48 * 1024 ||
                        ((uintptr_t)nrm->x | (uintptr_t)nrm->branch | (uintptr_t)nrm->x_out | (uintptr_t)nrm->w) % 16 != 0)) {
        return false;
    }
    const GemvNorm n = nrm != NULL ? *nrm : GemvNorm{};
    const int R = gemv_rows_a_warp(OC, nrm != NULL);
    const unsigned grid = (unsigned)CEIL_DIV(OC, 8 * R);
    const size_t rows = gemv_rows_bytes(M, IC, nrm != NULL, false);
    const bool st = gemv_stages(M, IC, OC, GLU, nrm != NULL);
    const size_t smem = st ? gemv_staged_bytes(M, IC, GLU, nrm != NULL, R) : rows;
    gemv_staged_launches += st;
    switch (M) {
    case 1:
        if (st) {
            gemv_go<1, GLU, true>(out, out_stride, inp, weight, IC, OC, n, nrm != NULL, R, grid, smem, stream, epi);
        } else {
            gemv_go<1, GLU, false>(out, out_stride, inp, weight, IC, OC, n, nrm != NULL, R, grid, smem, stream, epi);
        }
        break;
    case 2: gemv_go<2, GLU, false>(out, out_stride, inp, weight, IC, OC, n, nrm != NULL, R, grid, smem, stream, epi); break;
    case 3: gemv_go<3, GLU, false>(out, out_stride, inp, weight, IC, OC, n, nrm != NULL, R, grid, smem, stream, epi); break;
    case 4: gemv_go<4, GLU, false>(out, out_stride, inp, weight, IC, OC, n, nrm != NULL, R, grid, smem, stream, epi); break;
    }
    return true;
}
// out (M, OC), rows out_stride apart, = inp (M, IC) @ weightᵀ; false (nothing launched) where the shape does not fit
static bool matmul_gemv(floatX *out, int out_stride, const floatX *inp, const floatX *weight, int M, int IC, int OC,
                        cudaStream_t stream) {
    return matmul_gemv_launch<false>(out, out_stride, inp, weight, M, IC, OC, NULL, stream);
}
// h (M, F) dense = SiLU(inp @ up_wᵀ[:, :F]) ⊙ (inp @ up_wᵀ[:, F:]), up_w (2F, IC); false where the shape does not fit
static bool matmul_gemv_glu(floatX *h, const floatX *inp, const floatX *up_w, int M, int IC, int F,
                            cudaStream_t stream) {
    return matmul_gemv_launch<true>(h, F, inp, up_w, M, IC, F, NULL, stream);
}

// ----------------------------------------------------------------------------------------------------------------
// The skinny product: a decode step's product of 5..64 token rows on the tensor cores, taken by
// matmul_forward_strided in a decode step where cuBLASLt would need a thin second product (OC not a multiple of 8:
// the M²RNN and GDN in-projections; M2RNN_SKINNY=0 for cuBLASLt there too). Its speed against cuBLASLt:
// dev/bench/bench_skinny.cu, NOTES.md (inference round 7).
// A CTA of 4 warps takes 64 output rows and one K slice (≤ SK_NKB blocks of 32); a warp 16 rows with m16n8k16,
// A = its weight rows loaded from global memory straight into fragments (one 16-byte load a row a 32-wide k block
// gives a thread its k pairs for two k16 steps: within each block, MMA k slots (2t, 2t+1), (2t+8, 2t+9) of step s
// hold physical k 8t + 4s + {0,1}, {2,3}; a bijection, applied to both operands), B = the token rows of the slice
// staged once a CTA in shared memory by cp.async, 8·MT tokens in MT n-tiles. The weight loads are issued before the
// dependency wait (programmatic launch: under the kernel before's tail). K is split over the S CTAs of a thread block
// cluster: each writes its fp32 partial tile to its own shared memory, and after a cluster barrier CTA r sums the r-th
// share of the tile's outputs over the S partials in split order through distributed shared memory, so the result
// is the same whichever CTA sums it (deterministic, launch order and programmatic launch alike).
#if !FLOATX_IS_FP32
#define SK_ROWS 64 // output rows a CTA: 4 warps × 16
#define SK_KB 32   // a k block: one 16-byte piece of a row a thread of a quad
#define SK_NKB 12  // k blocks a CTA at most (its weight fragments in registers: 2·SK_NKB 16-byte loads a thread)
#define SK_MAX_S 8 // K splits: the CTAs of a cluster (the portable most)
#define SK_RED_LD (SK_ROWS + 4) // floats a token row of a CTA's partial tile (conflict-free stores of the fragments)

#ifdef SK_PHASES // (bench_skinny built with -DSK_PHASES: each CTA's clock at the kernel's phase boundaries; else nothing)
__device__ unsigned long long sk_phase[8192 * 8];
#define SK_STAMP(i)                                                                                                    \
    do {                                                                                                               \
        if (threadIdx.x == 0) { sk_phase[((size_t)blockIdx.x * gridDim.y + blockIdx.y) * 8 + (i)] = clock64(); }      \
    } while (0)
#define SK_STAMP_NS(i)                                                                                                 \
    do {                                                                                                               \
        if (threadIdx.x == 0) {                                                                                        \
            unsigned long long t_;                                                                                     \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                                                     \
            sk_phase[((size_t)blockIdx.x * gridDim.y + blockIdx.y) * 8 + (i)] = t_;                                    \
        }                                                                                                              \
    } while (0)
#else
#define SK_STAMP(i)
#define SK_STAMP_NS(i)
#endif
// y (M, OC) rows y_stride apart = x (M, IC) @ wᵀ. Grid (tiles, S) in clusters (1, S): the S CTAs of a cluster take
// one tile's K in S slices of nkb k blocks (the last possibly shorter) and sum their fp32 partials through each
// other's shared memory, CTA r the r-th share of the tile's outputs, each output in split order (so the result does
// not depend on which CTA sums it or when); xs_ld: a token row of the staged slice, in elements.
template <int MT>
__global__ void __launch_bounds__(128, 2)
    skinny_kernel(floatX *y, int y_stride, const floatX *x, const floatX *w, int M, int IC, int OC, int nkb_per,
                  int xs_ld) {
    using namespace tiles;
    extern __shared__ __align__(16) unsigned char sk_smem[];
    // (8·MT, xs_ld) the token rows' K slice; rows ≡ 64 mod 128 bytes apart, so the 8 lanes of each phase of a
    // 16-byte load (rows g, g + 1, four pieces each) fall in distinct banks. Reused after the MMAs as red.
    floatX *xs = (floatX *)sk_smem;
    // (8·MT, SK_RED_LD) this CTA's fp32 partial, token-major
    float *red = (float *)sk_smem;
    SK_STAMP_NS(6);
    SK_STAMP(0);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane / 4, t4 = lane % 4;
    const int tile = blockIdx.x, split = blockIdx.y, S = gridDim.y; // split = the CTA's rank in its cluster
    const int kb0 = split * nkb_per, nkb = min(nkb_per, IC / SK_KB - kb0), k0 = kb0 * SK_KB;
    const int o0 = tile * SK_ROWS + warp * 16;
    // the weight rows g and g + 8 of this warp, a 16-byte piece a k block, in flight first (rows past OC clamped)
    uint4 wa[SK_NKB], wb[SK_NKB];
    const floatX *ra = w + (size_t)min(o0 + g, OC - 1) * IC + k0 + 8 * t4;
    const floatX *rb = w + (size_t)min(o0 + g + 8, OC - 1) * IC + k0 + 8 * t4;
#pragma unroll
    for (int kb = 0; kb < SK_NKB; kb++) {
        if (kb < nkb) {
            wa[kb] = __ldg((const uint4 *)(ra + kb * SK_KB));
            wb[kb] = __ldg((const uint4 *)(rb + kb * SK_KB));
        }
    }
    // the weights do not depend on the kernel before (a decode step launches this one programmatically: the loads
    // above run under that kernel's tail); the token rows and the outputs do
    pdl_wait();
    pdl_trigger();
    SK_STAMP(1);
    // the token rows' slice (rows past M zero)
    const int pieces = nkb * SK_KB / 8;
    for (int i = threadIdx.x; i < 8 * MT * pieces; i += blockDim.x) {
        const int r = i / pieces, c = (i % pieces) * 8;
        floatX *dst = xs + r * xs_ld + c;
        if (r < M) { cp_async16(smem_addr(dst), x + (size_t)r * IC + k0 + c); }
        else { *(uint4 *)dst = make_uint4(0u, 0u, 0u, 0u); }
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    SK_STAMP(2);
    float acc[MT][4];
#pragma unroll
    for (int j = 0; j < MT; j++) { acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f; }
#pragma unroll
    for (int kb = 0; kb < SK_NKB; kb++) {
        if (kb >= nkb) { break; }
        const uint32_t a0[4] = {wa[kb].x, wb[kb].x, wa[kb].y, wb[kb].y}; // k step 0: physical 8t4 + 0..3
        const uint32_t a1[4] = {wa[kb].z, wb[kb].z, wa[kb].w, wb[kb].w}; // k step 1: 8t4 + 4..7
#pragma unroll
        for (int j = 0; j < MT; j++) {
            const uint4 bx = *(const uint4 *)(xs + (8 * j + g) * xs_ld + kb * SK_KB + 8 * t4);
            mma16816(acc[j], a0, bx.x, bx.y);
            mma16816(acc[j], a1, bx.z, bx.w);
        }
    }
    __syncthreads(); // every warp's reads of xs done: red overwrites it
    SK_STAMP(3);
    // acc[j]: rows warp·16 + g (0, 1) and + 8 (2, 3), tokens 8j + 2t4 (0, 2) and + 1 (1, 3)
#pragma unroll
    for (int j = 0; j < MT; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            red[(8 * j + 2 * t4 + (e & 1)) * SK_RED_LD + warp * 16 + g + (e >= 2 ? 8 : 0)] = acc[j][e];
        }
    }
    cluster_sync(); // every CTA's partial written
    SK_STAMP(4);
    // this CTA's share: groups of 4 outputs (one token, 4 rows) i ≡ split mod S, summed over the S partials in order
    const uint32_t red_s = smem_addr(red);
    const int groups = 8 * MT * SK_ROWS / 4;
    for (int i = split * blockDim.x + threadIdx.x; i < groups; i += S * blockDim.x) {
        const int m = i / (SK_ROWS / 4), c = (i % (SK_ROWS / 4)) * 4;
        const uint32_t off = red_s + (uint32_t)(m * SK_RED_LD + c) * 4u;
        float4 s = ld_dsmem_f4(off, 0);
        for (int r = 1; r < S; r++) {
            const float4 v = ld_dsmem_f4(off, (uint32_t)r);
            s.x += v.x;
            s.y += v.y;
            s.z += v.z;
            s.w += v.w;
        }
        const int o = tile * SK_ROWS + c;
        if (m < M) {
            floatX *yr = y + (size_t)m * y_stride + o;
            if (o < OC) { yr[0] = (floatX)s.x; }
            if (o + 1 < OC) { yr[1] = (floatX)s.y; }
            if (o + 2 < OC) { yr[2] = (floatX)s.z; }
            if (o + 3 < OC) { yr[3] = (floatX)s.w; }
        }
    }
    SK_STAMP(5);
    cluster_sync(); // no CTA leaves while the others read its partial
    SK_STAMP_NS(7);
}

// K splits for a shape: the fewest whose slices fit the registers, then more while the grid is under 1.5 CTAs an SM
// (at most SK_MAX_S); no empty split. 0 where IC needs more than SK_MAX_S slices.
static int skinny_splits(int IC, int OC, int sms) {
    const int tiles = CEIL_DIV(OC, SK_ROWS), nkb = IC / SK_KB;
    int S = CEIL_DIV(nkb, SK_NKB);
    if (S > SK_MAX_S) { return 0; }
    while (S < SK_MAX_S && S < nkb && 2L * tiles * S < 3L * sms) { S++; }
    return CEIL_DIV(nkb, CEIL_DIV(nkb, S));
}
// the kernel's instances by MT (its 8-token n-tiles): 2, 4, 8
typedef void (*SkinnyKernel)(floatX *, int, const floatX *, const floatX *, int, int, int, int, int);
static SkinnyKernel skinny_instance(int MT) {
    return MT == 2 ? skinny_kernel<2> : MT == 4 ? skinny_kernel<4> : skinny_kernel<8>;
}
// whether a cluster of S CTAs of the MT instance with smem bytes each can be resident on this GPU (a smaller GPU, or
// a MIG slice, may hold fewer CTAs a GPC than a cluster asks for: the launch would fail), asked once a configuration
static bool skinny_cluster_fits(int MT, int S, size_t smem) {
    static struct { int MT, S; size_t smem; bool fits; } seen[32];
    static int n_seen = 0;
    for (int i = 0; i < n_seen; i++) {
        if (seen[i].MT == MT && seen[i].S == S && seen[i].smem == smem) { return seen[i].fits; }
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, S);
    cfg.blockDim = dim3(128);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[2];
    cfg.attrs = attr;
    cfg.numAttrs = launch_attrs(attr, 0, dim3(1, S, 1));
    int clusters = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, skinny_instance(MT), &cfg);
    if (err != cudaSuccess) { (void)cudaGetLastError(); } // (clear it: the dispatch falls back to cuBLASLt)
    const bool fits = err == cudaSuccess && clusters > 0;
    if (n_seen < 32) { seen[n_seen++] = {MT, S, smem, fits}; }
    return fits;
}
// false (nothing launched) where the shape does not fit the kernel or its clusters this GPU
static bool skinny_product(floatX *y, int y_stride, const floatX *x, const floatX *w, int M, int IC, int OC,
                           int S, cudaStream_t stream) {
    if (M < 1 || M > 64 || IC % SK_KB != 0 || S < 1 || S > SK_MAX_S || ((uintptr_t)x | (uintptr_t)w) % 16 != 0) {
        return false;
    }
    const int nkb = IC / SK_KB, per = CEIL_DIV(nkb, S);
    if (per > SK_NKB || CEIL_DIV(nkb, per) != S) { return false; }
    const int MT = M <= 16 ? 2 : M <= 32 ? 4 : 8;
    const int xs_ld = per * SK_KB + (per % 2 == 0 ? 32 : 0); // 64·per (+ 64) bytes: ≡ 64 mod 128
    const size_t xs_bytes = (size_t)8 * MT * xs_ld * sizeof(floatX), red_bytes = (size_t)8 * MT * SK_RED_LD * 4;
    const size_t smem = xs_bytes > red_bytes ? xs_bytes : red_bytes;
    kernel_smem_limit(skinny_instance(MT), smem);
    const dim3 grid(CEIL_DIV(OC, SK_ROWS), S), cluster(1, S, 1);
    if (!skinny_cluster_fits(MT, S, smem)) { return false; }
    launch_k_cluster(skinny_instance(MT), grid, 128, smem, stream, cluster, y, y_stride, x, w, M, IC, OC, per, xs_ld);
    return true;
}

// the decode dispatch: false (nothing launched) where the kernel cannot take the shape
static int skinny_on = -1;
static bool matmul_skinny(floatX *out, int out_stride, const floatX *inp, const floatX *weight, int M, int IC, int OC,
                          const Runtime *rt) {
    // only where cuBLASLt needs a thin product beside its main one (OC not a multiple of 8: the in-projections of
    // M²RNN and GDN, 2900 and 3076 rows); elsewhere cuBLASLt's first pick is faster (NOTES.md, inference round 7).
    // Not the LM head either (more than 16384 rows: cuBLASLt streams it faster).
    if (!env_on_unless_0(&skinny_on, "M2RNN_SKINNY") || M <= gemv_max_rows() || M > 64 || OC % 8 == 0 ||
        OC > 16384) {
        return false;
    }
    const int S = skinny_splits(IC, OC, rt->prop.multiProcessorCount);
    return S > 0 && skinny_product(out, out_stride, inp, weight, M, IC, OC, S, rt->stream);
}
#endif

// out (M, OC) = inp (M, IC) @ weightᵀ, weight (OC, IC), all row-major; out's rows are out_stride ≥ OC apart. In a
// decode step: the GEMV up to GEMV_MAX_M rows, the skinny product where it takes the shape, else cuBLASLt.
static void matmul_forward_strided(floatX *out, int out_stride, const floatX *inp, const floatX *weight, int M, int IC,
                                   int OC, const Runtime *rt) {
    if (rt->decode_step && matmul_gemv(out, out_stride, inp, weight, M, IC, OC, rt->stream)) { return; }
#if !FLOATX_IS_FP32
    if (rt->decode_step && matmul_skinny(out, out_stride, inp, weight, M, IC, OC, rt)) { return; }
#endif
    const int OC8 = matmul_oc_main(OC);
    matmul_cublaslt_ld(out, 0, weight, inp, OC8, M, IC, 1, 0, 1.0f, 0.0f, 1, 0, 0, 0, 0, 0, out_stride, rt);
    if (OC8 < OC) {
        matmul_cublaslt_ld(out + OC8, 0, weight + (size_t)OC8 * IC, inp, OC - OC8, M, IC, 1, 0, 1.0f, 0.0f, 1, 0, 0, 0,
                           IC, IC, out_stride, rt);
    }
}
static void matmul_forward(floatX *out, const floatX *inp, const floatX *weight, int M, int IC, int OC,
                           const Runtime *rt) {
    matmul_forward_strided(out, OC, inp, weight, M, IC, OC, rt);
}
// parts (S, M, OC) fp32: part s = inp[:, sK, (s+1)K) @ weight[:, sK, (s+1)K)ᵀ, K = IC/S (IC a multiple of 8·S), as one
// cuBLASLt launch (a strided batch of S products, the first candidate without split-K): a product split along K whose
// sum the kernel after it adds (rmsnorm_forward_parts), with no reduction kernel between them
static void matmul_split_partials(float *parts, const floatX *inp, const floatX *weight, int M, int IC, int OC, int S,
                                  const Runtime *rt) {
    const int K = IC / S;
    matmul_cublaslt_ld(parts, 1, weight, inp, OC, M, K, 1, 0, 1.0f, 0.0f, S, K, K, (long long)M * OC, IC, IC, OC, rt, 1);
}

// dinp (M, IC) = dout (M, OC) @ weight (or += with accumulate_dinp); dweight (OC, IC) += doutᵀ @ inp in fp32.
// Either output may be NULL. dout's rows are dout_stride ≥ OC apart. With OC split (matmul_oc_main), dinp takes the
// few rows' product first and the main one adds to it, so the large sum is rounded to floatX once.
static void matmul_backward_strided(floatX *dinp, float *dweight, const floatX *dout, int dout_stride,
                                    const floatX *inp, const floatX *weight, int M, int IC, int OC, int accumulate_dinp,
                                    const Runtime *rt) {
    const int OC8 = matmul_oc_main(OC);
    if (dinp != NULL) {
        float beta = accumulate_dinp ? 1.0f : 0.0f;
        if (OC8 < OC) {
            matmul_cublaslt_ld(dinp, 0, weight + (size_t)OC8 * IC, dout + OC8, IC, M, OC - OC8, 0, 0, 1.0f, beta, 1, 0,
                               0, 0, IC, dout_stride, 0, rt);
            beta = 1.0f;
        }
        matmul_cublaslt_ld(dinp, 0, weight, dout, IC, M, OC8, 0, 0, 1.0f, beta, 1, 0, 0, 0, IC, dout_stride, 0, rt);
    }
    if (dweight != NULL) {
        matmul_cublaslt_ld(dweight, 1, inp, dout, IC, OC8, M, 0, 1, 1.0f, 1.0f, 1, 0, 0, 0, 0, dout_stride, 0, rt);
        if (OC8 < OC) {
            matmul_cublaslt_ld(dweight + (size_t)OC8 * IC, 1, inp, dout + OC8, IC, OC - OC8, M, 0, 1, 1.0f, 1.0f, 1, 0,
                               0, 0, IC, dout_stride, IC, rt);
        }
    }
}
static void matmul_backward(floatX *dinp, float *dweight, const floatX *dout, const floatX *inp, const floatX *weight,
                            int M, int IC, int OC, int accumulate_dinp, const Runtime *rt) {
    matmul_backward_strided(dinp, dweight, dout, OC, inp, weight, M, IC, OC, accumulate_dinp, rt);
}

// ----------------------------------------------------------------------------------------------------------------
// embedding

// one block per token row (no 64-bit division per element)
__global__ void embedding_forward_kernel(floatX *out, const int *tokens, const floatX *wte, int M, int C, int v0,
                                         int Vl) {
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    const long m = blockIdx.x;
    const int r = tokens[m] - v0;
    if (r < 0 || r >= Vl) { // (vocabulary-parallel: a token of another rank's rows)
        for (int c = threadIdx.x; c < C; c += blockDim.x) { out[m * C + c] = (floatX)0.0f; }
        return;
    }
    const floatX *src = wte + (long)r * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) { out[m * C + c] = src[c]; }
}

// out (M, C) = wte[tokens − v0] for the tokens in rows v0 .. v0+Vl−1 of the vocabulary (wte holds those rows), 0 for
// the others; tokens on the device. One process: v0 = 0, Vl = the padded vocabulary (every token is in it).
// Vocabulary-parallel (a tensor-parallel rank's shard of the rows): the block all-reduces the ranks' outputs.
static void embedding_forward(floatX *out, const int *tokens, const floatX *wte, int M, int C, int v0, int Vl,
                              cudaStream_t stream) {
    launch_k(embedding_forward_kernel, M, 256, 0, stream, out, tokens, wte, M, C, v0, Vl);
}

// one block per distinct token: sums its rows of dout in position order and adds them to its row of dwte
__global__ void embedding_backward_kernel(float *dwte, const floatX *dout, const int *bucket_token,
                                          const int *bucket_start, const int *positions, int C) {
    const int bucket = blockIdx.x, token = bucket_token[bucket];
    const int begin = bucket_start[bucket], end = bucket_start[bucket + 1];
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.0f;
        for (int i = begin; i < end; i++) { acc += to_float(dout[(long)positions[i] * C + c]); }
        dwte[(long)token * C + c] += acc;
    }
}

// Deterministic scatter-add: the host groups positions by token (the tokens are on the host anyway), so no two
// blocks touch one row and the order of additions is fixed. scratch: device ints, at least 3*M+1.
typedef struct { int *host, *device; int capacity; } EmbeddingBuckets;

static int compare_token_position(const void *a, const void *b) {
    const int *x = (const int *)a, *y = (const int *)b;
    return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

// dwte (Vl, C) += the rows of dout (M, C) of the tokens in rows v0 .. v0+Vl−1 (embedding_forward's), the others
// skipped
static void embedding_backward(float *dwte, const floatX *dout, const int *tokens_host, int M, int C, int v0, int Vl,
                               EmbeddingBuckets *buckets, cudaStream_t stream) {
    if (buckets->capacity < M) {
        free(buckets->host);
        if (buckets->device != NULL) { cudaCheck(cudaFree(buckets->device)); }
        buckets->host = (int *)mallocCheck((size_t)(5 * M + 2) * sizeof(int));
        cudaCheck(cudaMalloc(&buckets->device, (size_t)(3 * M + 1) * sizeof(int)));
        buckets->capacity = M;
    }
    int *pairs = buckets->host + 3 * M + 1; // (M, 2) row, position
    int n = 0;
    for (int i = 0; i < M; i++) {
        const int r = tokens_host[i] - v0;
        if (r >= 0 && r < Vl) { pairs[2 * n] = r; pairs[2 * n + 1] = i; n++; }
    }
    qsort(pairs, (size_t)n, 2 * sizeof(int), compare_token_position);
    int *bucket_token = buckets->host, *bucket_start = buckets->host + M, *positions = buckets->host + 2 * M + 1;
    int nb = 0;
    for (int i = 0; i < n; i++) {
        if (i == 0 || pairs[2 * i] != pairs[2 * i - 2]) { bucket_token[nb] = pairs[2 * i]; bucket_start[nb++] = i; }
        positions[i] = pairs[2 * i + 1];
    }
    bucket_start[nb] = n;
    if (nb > 0) { // device layout: bucket_token (M) | bucket_start (M+1) | positions (M), copied from the same host layout
        cudaCheck(cudaMemcpyAsync(buckets->device, buckets->host, (size_t)(3 * M + 1) * sizeof(int),
                                  cudaMemcpyHostToDevice, stream));
        embedding_backward_kernel<<<nb, 256, 0, stream>>>(dwte, dout, buckets->device, buckets->device + M,
                                                          buckets->device + 2 * M + 1, C);
        cudaCheck(cudaGetLastError());
    }
    cudaCheck(cudaStreamSynchronize(stream)); // the host buffer is reused by the next call
}

// ----------------------------------------------------------------------------------------------------------------
// RMSNorm (one warp per row), with the residual add fused in front

// if residual_out != NULL: residual_out = a + b and the norm runs over it; else over a (b unused)
__global__ void rmsnorm_forward_kernel(floatX *out, float *rstd, floatX *residual_out, const floatX *a,
                                       const floatX *b, const floatX *weight, int M, int C) {
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (row >= M) { return; }
    const floatX *xa = a + (long)row * C;
    if (rmsnorm_row_packs_ok(C)) {
        rmsnorm_row_packs(out + (long)row * C, rstd + row, residual_out ? residual_out + (long)row * C : NULL, xa,
                          residual_out ? b + (long)row * C : NULL, weight, C, lane);
        return;
    }
    float ss = 0.0f; // any C: element by element, the second pass re-reads the row
    for (int i = lane; i < C; i += WARP_SIZE) {
        float x = to_float(xa[i]);
        if (residual_out != NULL) {
            const floatX sum = (floatX)(x + to_float(b[(long)row * C + i]));
            residual_out[(long)row * C + i] = sum;
            x = to_float(sum);
        }
        ss += x * x;
    }
    ss = warp_reduce_sum(ss);
    const float s = rsqrtf(ss / C + 1e-5f);
    if (lane == 0) { rstd[row] = s; }
    const floatX *x = residual_out != NULL ? residual_out + (long)row * C : xa;
    for (int i = lane; i < C; i += WARP_SIZE) { out[(long)row * C + i] = (floatX)(to_float(x[i]) * s * to_float(weight[i])); }
}

static void rmsnorm_forward(floatX *out, float *rstd, floatX *residual_out, const floatX *a, const floatX *b,
                            const floatX *weight, int M, int C, cudaStream_t stream) {
    // a warp a row either way; few rows (a decode step's): 2 a block, so they spread over 4× the SMs (B=64: 32 blocks)
    const int block = M < 1024 ? 64 : 256, rows_per_block = block / WARP_SIZE;
    launch_k(rmsnorm_forward_kernel, CEIL_DIV(M, rows_per_block), block, 0, stream, out, rstd, residual_out, a, b,
             weight, M, C);
}

// rmsnorm_forward with the residual branch given as np fp32 partial sums (np, M, C), pstride floats apart (added in
// order, rounded to floatX, then as rmsnorm_forward): residual_out = a + branch, out its norm. Rows in whole packs.
__global__ void rmsnorm_parts_kernel(floatX *out, float *rstd, floatX *residual_out, const floatX *a,
                                     const float *parts, int np, long pstride, const floatX *weight, int M, int C) {
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (row >= M) { return; }
    rmsnorm_row_packs<true>(out + (long)row * C, rstd + row, residual_out + (long)row * C, a + (long)row * C, NULL,
                            weight, C, lane, parts + (long)row * C, np, pstride);
}
static void rmsnorm_forward_parts(floatX *out, float *rstd, floatX *residual_out, const floatX *a, const float *parts,
                                  int np, const floatX *weight, int M, int C, cudaStream_t stream) {
    if (!rmsnorm_row_packs_ok(C)) { // (whole packs: C a multiple of 4 too, for the partial sums' float4 loads)
        fail_with_hint("split the branch product only where the norm keeps its rows in whole packs",
                       "rmsnorm_forward_parts: C=%d", C);
    }
    const int block = 64, rows_per_block = block / WARP_SIZE;
    launch_k(rmsnorm_parts_kernel, CEIL_DIV(M, rows_per_block), block, 0, stream, out, rstd, residual_out, a, parts, np,
             (long)M * C, weight, M, C);
}

#define RMSNORM_BWD_ROWS 32 // rows per block: a block's dweight partial covers these rows, in order

// one warp per row. dinp = (accumulate ? dinp : 0) + ...; dweight_partial (blocks, C) per block, reduced in order
// afterwards. Vectorized when C % (32·PACK) == 0 (rows then start 16-byte aligned), scalar otherwise.
__global__ void rmsnorm_backward_kernel(floatX *dinp, float *dweight_partial, const floatX *dout, const floatX *inp,
                                        const floatX *weight, const float *rstd, int M, int C, int accumulate) {
    extern __shared__ float dw_shared[]; // (warps, C)
    const int warps = blockDim.x / WARP_SIZE, warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    float *my_dw = dw_shared + (long)warp * C;
    for (int i = lane; i < C; i += WARP_SIZE) { my_dw[i] = 0.0f; }
    __syncwarp(); // the vectorized loop below updates elements another lane zeroed (racecheck found this hazard)
    const int vec = C % (WARP_SIZE * PACK) == 0;
    const int row0 = blockIdx.x * RMSNORM_BWD_ROWS;
    for (int r = warp; r < RMSNORM_BWD_ROWS; r += warps) {
        const int row = row0 + r;
        if (row >= M) { break; }
        const floatX *x = inp + (long)row * C, *dy = dout + (long)row * C;
        floatX *dx = dinp + (long)row * C;
        const float s = rstd[row];
        float dot = 0.0f;
        if (vec) {
            for (int i = lane * PACK; i < C; i += WARP_SIZE * PACK) {
                const Pack xp = *(const Pack *)(x + i), gp = *(const Pack *)(dy + i), wp = *(const Pack *)(weight + i);
                for (int k = 0; k < PACK; k++) { dot += to_float(gp.v[k]) * to_float(wp.v[k]) * to_float(xp.v[k]); }
            }
        } else {
            for (int i = lane; i < C; i += WARP_SIZE) { dot += to_float(dy[i]) * to_float(weight[i]) * to_float(x[i]); }
        }
        dot = warp_reduce_sum(dot);
        const float coef = dot * s * s * s / C;
        if (vec) {
            for (int i = lane * PACK; i < C; i += WARP_SIZE * PACK) {
                const Pack xp = *(const Pack *)(x + i), gp = *(const Pack *)(dy + i), wp = *(const Pack *)(weight + i);
                Pack op;
                if (accumulate) { op = *(const Pack *)(dx + i); }
                for (int k = 0; k < PACK; k++) {
                    const float xv = to_float(xp.v[k]), gv = to_float(gp.v[k]);
                    float g = s * to_float(wp.v[k]) * gv - coef * xv;
                    if (accumulate) { g += to_float(op.v[k]); }
                    op.v[k] = (floatX)g;
                    my_dw[i + k] += gv * xv * s;
                }
                *(Pack *)(dx + i) = op;
            }
        } else {
            for (int i = lane; i < C; i += WARP_SIZE) {
                float g = s * to_float(weight[i]) * to_float(dy[i]) - coef * to_float(x[i]);
                if (accumulate) { g += to_float(dx[i]); }
                dx[i] = (floatX)g;
                my_dw[i] += to_float(dy[i]) * to_float(x[i]) * s;
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < warps; w++) { acc += dw_shared[(long)w * C + i]; }
        dweight_partial[(long)blockIdx.x * C + i] = acc;
    }
}

// out (C) += Σ_p partial (P, C). A block takes 32 columns; its 32 × 32 threads each sum a fixed stride of the P rows,
// then the 32 row-sums of a column are added in a fixed tree: the same order whatever the GPU, and P-way parallel
// (a thread per column walking all P rows is latency-bound: 0.4 ms for a 768-wide RMSNorm weight).
__global__ void reduce_partials_kernel(float *out, const float *partial, int P, int C) {
    __shared__ float sums[32][33];
    const int col = blockIdx.x * 32 + threadIdx.x, row = threadIdx.y;
    float acc = 0.0f;
    if (col < C) {
        for (int p = row; p < P; p += 32) { acc += partial[(long)p * C + col]; }
    }
    sums[row][threadIdx.x] = acc;
    __syncthreads();
    for (int stride = 16; stride > 0; stride >>= 1) {
        if (row < stride) { sums[row][threadIdx.x] += sums[row + stride][threadIdx.x]; }
        __syncthreads();
    }
    if (row == 0 && col < C) { out[col] += sums[0][threadIdx.x]; }
}

static void reduce_partials(float *out, const float *partial, int P, int C, cudaStream_t stream) {
    reduce_partials_kernel<<<CEIL_DIV(C, 32), dim3(32, 32), 0, stream>>>(out, partial, P, C);
    cudaCheck(cudaGetLastError());
}

// scratch floats needed by rmsnorm_backward
static inline size_t rmsnorm_backward_scratch(int M, int C) { return (size_t)CEIL_DIV(M, RMSNORM_BWD_ROWS) * C; }

// dinp (M,C) = or += ...; dweight (C) += ...; scratch: rmsnorm_backward_scratch(M, C) floats
static void rmsnorm_backward(floatX *dinp, float *dweight, float *scratch, const floatX *dout, const floatX *inp,
                             const floatX *weight, const float *rstd, int M, int C, int accumulate, cudaStream_t stream) {
    const int block = 256, blocks = CEIL_DIV(M, RMSNORM_BWD_ROWS);
    const size_t smem = (size_t)(block / WARP_SIZE) * C * sizeof(float);
    kernel_smem_limit(rmsnorm_backward_kernel, smem);
    rmsnorm_backward_kernel<<<blocks, block, smem, stream>>>(dinp, scratch, dout, inp, weight, rstd, M, C, accumulate);
    cudaCheck(cudaGetLastError());
    reduce_partials(dweight, scratch, blocks, C, stream);
}

// ----------------------------------------------------------------------------------------------------------------
// classifier: the forward keeps only each row's log-sum-exp; the backward turns the logits into dlogits in place

// One block per row; rows are Vp (a multiple of 8) apart, so 16-byte aligned. One pass over the row: each thread
// keeps a running max and the sum of exponentials relative to it (rescaled when the max grows), then the block merges
// the (max, sum) pairs. (Two passes, max then sum, read a 100K-vocabulary row twice from device memory: the rows in
// flight exceed L2.) A thread loads two packs before using either (one 16-byte load in flight a thread left the
// memory system idle: 1.7× the bandwidth floor), and exp(x − m) is 2^(x·log2 e − m·log2 e): one FMA and the MUFU's
// ex2. Every thread gets the row's max and its sum of exp(x − max) over the first V columns.
__device__ void row_max_sumexp(float *maxv_out, float *sum_out, const floatX *x, int V) {
    const float L2E = 1.4426950408889634f;
    const int stride = blockDim.x * PACK;
    float m = -INFINITY, sum = 0.0f;
    for (int i = threadIdx.x * PACK; i < V; i += 2 * stride) {
        const int i2 = i + stride;
        const bool full = i2 + PACK <= V; // both packs wholly inside the row's V columns
        const Pack p0 = *(const Pack *)(x + i);
        Pack p1 = p0;
        if (i2 < V) { p1 = *(const Pack *)(x + i2); }
        float v[2 * PACK], pm = -INFINITY;
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            v[k] = full || i + k < V ? to_float(p0.v[k]) : -INFINITY;
            v[PACK + k] = full || i2 + k < V ? to_float(p1.v[k]) : -INFINITY;
        }
#pragma unroll
        for (int k = 0; k < 2 * PACK; k++) { pm = fmaxf(pm, v[k]); }
        if (pm > m) { sum *= exp2f((m - pm) * L2E); m = pm; } // m finite from here: v[0] is a real column
        const float mL = m * L2E;
#pragma unroll
        for (int k = 0; k < 2 * PACK; k++) { sum += exp2f(fmaf(v[k], L2E, -mL)); }
    }
    const float maxv = block_reduce_max(m);
    *sum_out = block_reduce_sum(m == -INFINITY ? 0.0f : sum * exp2f((m - maxv) * L2E));
    *maxv_out = maxv;
}

__global__ void crossentropy_forward_kernel(float *losses, float *lse, const floatX *logits, const int *targets, int V,
                                            int Vp) {
    const long row = blockIdx.x;
    const floatX *x = logits + row * Vp;
    float maxv, sum;
    row_max_sumexp(&maxv, &sum, x, V);
    if (threadIdx.x == 0) {
        const float l = maxv + logf(sum);
        lse[row] = l;
        if (losses != NULL) { losses[row] = l - to_float(x[targets[row]]); }
    }
}

// (vocabulary-parallel) stats (M, 3) = each row's max and sum of exp over this rank's V real columns (max −inf, sum 0
// when it has none), and its target's logit if the target is one of this rank's rows v0 .. (else 0)
__global__ void crossentropy_partial_kernel(float *stats, const floatX *logits, const int *targets, int V, int Vp,
                                            int v0) {
    const long row = blockIdx.x;
    const floatX *x = logits + row * Vp;
    float maxv, sum;
    row_max_sumexp(&maxv, &sum, x, V);
    if (threadIdx.x == 0) {
        const int r = targets[row] - v0;
        stats[row * 3] = maxv;
        stats[row * 3 + 1] = sum;
        stats[row * 3 + 2] = r >= 0 && r < V ? to_float(x[r]) : 0.0f;
    }
}

// (vocabulary-parallel) all (tp, M, 3): every rank's stats, gathered; lse = M + log Σ_r sum_r·exp(max_r − M) with
// M = max_r max_r, the loss lse − the target logit (held by one rank). Every rank computes the same numbers in the
// same order.
__global__ void crossentropy_combine_kernel(float *losses, float *lse, const float *all, int M, int tp) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= M) { return; }
    float mx = -INFINITY, target = 0.0f;
    for (int r = 0; r < tp; r++) { mx = fmaxf(mx, all[((long)r * M + row) * 3]); }
    float sum = 0.0f;
    for (int r = 0; r < tp; r++) {
        const float *s = all + ((long)r * M + row) * 3;
        if (s[0] > -INFINITY) { sum += s[1] * expf(s[0] - mx); }
        target += s[2];
    }
    const float l = mx + logf(sum);
    lse[row] = l;
    losses[row] = l - target;
}

// targets are vocabulary ids; this rank's logits (M, Vp) are of rows v0 .. v0+Vp−1 (v0 = 0 with one process)
__global__ void crossentropy_backward_kernel(floatX *logits, const float *lse, const int *targets, float dloss, int V,
                                             int Vp, int v0) {
    const long row = blockIdx.x;
    floatX *x = logits + row * Vp;
    const float l = lse[row];
    const int target = targets[row] - v0;
    for (int i = threadIdx.x * PACK; i < Vp; i += blockDim.x * PACK) {
        Pack p = *(const Pack *)(x + i);
        for (int k = 0; k < PACK; k++) {
            const int idx = i + k;
            const float g = idx < V ? (expf(to_float(p.v[k]) - l) - (idx == target ? 1.0f : 0.0f)) * dloss : 0.0f;
            p.v[k] = (floatX)g;
        }
        *(Pack *)(x + i) = p;
    }
}

// losses (M) and lse (M) from logits (M, Vp) over the first V columns; losses may be NULL (lse only)
static void crossentropy_forward(float *losses, float *lse, const floatX *logits, const int *targets, int M, int V,
                                 int Vp, cudaStream_t stream) {
    if (Vp % PACK != 0) { fail_with_hint("pad the vocabulary to a multiple of 128", "classifier: Vp=%d", Vp); }
    crossentropy_forward_kernel<<<M, 1024, 0, stream>>>(losses, lse, logits, targets, V, Vp);
    cudaCheck(cudaGetLastError());
}
// logits (M, Vp) of vocabulary rows v0 .. become (softmax − onehot) · dloss in place; the padding columns become 0
static void crossentropy_backward_inplace(floatX *logits, const float *lse, const int *targets, float dloss, int M,
                                          int V, int Vp, int v0, cudaStream_t stream) {
    crossentropy_backward_kernel<<<M, 1024, 0, stream>>>(logits, lse, targets, dloss, V, Vp, v0);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------------------
// AdamW and the global gradient norm

__global__ void adamw_kernel(floatX *params, float *master, float *m, float *v, const float *grads, long n, float lr,
                             float beta1, float beta2, float bc1, float bc2, float eps, float weight_decay,
                             float grad_scale) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g, vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = master[i];
    const float updated = p - lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + weight_decay * p);
    master[i] = updated;
    params[i] = (floatX)updated;
}

static void adamw_update(floatX *params, float *master, float *m, float *v, const float *grads, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int step, float grad_scale,
                         cudaStream_t stream) {
    const float bc1 = 1.0f - powf(beta1, (float)step), bc2 = 1.0f - powf(beta2, (float)step);
    adamw_kernel<<<(unsigned)CEIL_DIV((long)n, 512L), 512, 0, stream>>>(params, master, m, v, grads, (long)n, lr, beta1,
                                                                         beta2, bc1, bc2, eps, weight_decay, grad_scale);
    cudaCheck(cudaGetLastError());
}

#define NORM_BLOCKS 1024

__global__ void sum_squares_kernel(float *partial, const float *x, long n) {
    float acc = 0.0f;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        acc += x[i] * x[i];
    }
    acc = block_reduce_sum(acc);
    if (threadIdx.x == 0) { partial[blockIdx.x] = acc; }
}

__global__ void sum_partials_kernel(float *out, const float *partial, int n) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) { acc += partial[i]; }
    acc = block_reduce_sum(acc);
    if (threadIdx.x == 0) { *out = acc; }
}

// *out = Σ x²; scratch: NORM_BLOCKS floats. Fixed grid and order: the same bits every run.
static void global_sum_squares(float *out, float *scratch, const float *x, size_t n, cudaStream_t stream) {
    sum_squares_kernel<<<NORM_BLOCKS, 512, 0, stream>>>(scratch, x, (long)n);
    cudaCheck(cudaGetLastError());
    sum_partials_kernel<<<1, 1024, 0, stream>>>(out, scratch, NORM_BLOCKS);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------------------
// elementwise

__global__ void accumulate_f32_kernel(float *out, const float *in, long n) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] += in[i]; }
}
// out += in (fp32)
static void accumulate_f32(float *out, const float *in, long n, cudaStream_t stream) {
    accumulate_f32_kernel<<<(unsigned)CEIL_DIV(n, 256L), 256, 0, stream>>>(out, in, n);
    cudaCheck(cudaGetLastError());
}

__global__ void cast_f32_to_floatx_kernel(floatX *out, const float *in, long n) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = (floatX)in[i]; }
}
static void cast_f32_to_floatx(floatX *out, const float *in, long n, cudaStream_t stream) {
    cast_f32_to_floatx_kernel<<<(unsigned)CEIL_DIV(n, 256L), 256, 0, stream>>>(out, in, n);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------------------
// fixed-order reductions over tokens and device memory slices

#define TOKEN_CHUNK 64 // tokens per partial sum in the parameter-gradient reductions (small: enough threads in flight)
static inline int token_chunks(long BT) { return (int)CEIL_DIV(BT, (long)TOKEN_CHUNK); }

// ----------------------------------------------------------------------------------------------------------------
// the group RMSNorm: out = inp · rstd · weight per group of DI/G channels (Mamba-2's: mamba_ssm's RMSNormGated, the
// gate applied before it; M²RNN's with group_norm: a norm per q/k group); inp, out (M, DI); rstd (M, G); weight (DI)

// one warp per (row, group)
__global__ void group_rmsnorm_forward_kernel(floatX *out, float *rstd, const floatX *inp, const floatX *weight, long M,
                                             int DI, int G) {
    const long item = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32, cg = DI / G;
    if (item >= M * G) { return; }
    const long m = item / G;
    const int g = (int)(item - m * G);
    const floatX *xr = inp + m * DI + (long)g * cg;
    float ss = 0.0f;
    for (int i = lane; i < cg; i += 32) { ss += to_float(xr[i]) * to_float(xr[i]); }
    ss = warp_reduce_sum(ss);
    const float s = rsqrtf(ss / cg + 1e-5f);
    if (lane == 0) { rstd[item] = s; }
    for (int i = lane; i < cg; i += 32) {
        out[m * DI + (long)g * cg + i] = (floatX)(to_float(xr[i]) * s * to_float(weight[g * cg + i]));
    }
}

// dinp = s w dout − (Σ dout w x) s³ / cg · x (written), one warp per (row, group)
__global__ void group_rmsnorm_backward_kernel(floatX *dinp, const floatX *dout, const floatX *inp, const floatX *weight,
                                              const float *rstd, long M, int DI, int G) {
    const long item = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32, cg = DI / G;
    if (item >= M * G) { return; }
    const long m = item / G;
    const int g = (int)(item - m * G);
    const long o = m * DI + (long)g * cg;
    const float s = rstd[item];
    float dot = 0.0f;
    for (int i = lane; i < cg; i += 32) { dot += to_float(dout[o + i]) * to_float(weight[g * cg + i]) * to_float(inp[o + i]); }
    dot = warp_reduce_sum(dot);
    const float coef = dot * s * s * s / cg;
    for (int i = lane; i < cg; i += 32) {
        dinp[o + i] = (floatX)(s * to_float(weight[g * cg + i]) * to_float(dout[o + i]) - coef * to_float(inp[o + i]));
    }
}

// partial (chunks, DI): per chunk of tokens Σ dout · inp · rstd
__global__ void group_rmsnorm_dweight_kernel(float *partial, const floatX *dout, const floatX *inp, const float *rstd,
                                             long M, int DI, int G) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y, g = i / (DI / G);
    if (i >= DI) { return; }
    float acc = 0.0f;
    const long begin = (long)chunk * TOKEN_CHUNK, end = min(begin + TOKEN_CHUNK, M);
    for (long m = begin; m < end; m++) { acc += to_float(dout[m * DI + i]) * to_float(inp[m * DI + i]) * rstd[m * G + g]; }
    partial[(long)chunk * DI + i] = acc;
}

static void group_rmsnorm_forward(floatX *out, float *rstd, const floatX *inp, const floatX *weight, long M, int DI,
                                  int G, cudaStream_t stream) {
    group_rmsnorm_forward_kernel<<<(unsigned)CEIL_DIV(M * G, 8L), 256, 0, stream>>>(out, rstd, inp, weight, M, DI, G);
    cudaCheck(cudaGetLastError());
}

// dinp written, dweight (DI) +=; scratch: token_chunks(M)·DI floats
static void group_rmsnorm_backward(floatX *dinp, float *dweight, float *scratch, const floatX *dout, const floatX *inp,
                                   const floatX *weight, const float *rstd, long M, int DI, int G, cudaStream_t stream) {
    group_rmsnorm_backward_kernel<<<(unsigned)CEIL_DIV(M * G, 8L), 256, 0, stream>>>(dinp, dout, inp, weight, rstd, M,
                                                                                   DI, G);
    cudaCheck(cudaGetLastError());
    const int chunks = token_chunks(M);
    group_rmsnorm_dweight_kernel<<<dim3(CEIL_DIV(DI, 128), chunks), 128, 0, stream>>>(scratch, dout, inp, rstd, M, DI, G);
    cudaCheck(cudaGetLastError());
    reduce_partials(dweight, scratch, chunks, DI, stream);
}


// ----------------------------------------------------------------------------------------------------------------
// RMSNormTP (the paper's appendix; ref/common.h's rmsnorm_tp_*): the norm of a row whose C channels here are 1/tp of
// it, the rest on the other ranks of the group: the rows' sums of squares are all-reduced (M floats) before
// rstd = 1/sqrt(Σ/(tp·C) + eps), and in the backward the rows' Σ dy·w·x likewise. The weight (C) is this rank's shard;
// its gradient needs no collective.

// out (M) = Σ_i a·b·w over each row (w NULL: 1), one warp per row
__global__ void row_dot_kernel(float *out, const floatX *a, const floatX *b, const floatX *w, long M, int C) {
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= M) { return; }
    float acc = 0.0f;
    for (int i = lane; i < C; i += 32) {
        const float p = to_float(a[row * C + i]) * to_float(b[row * C + i]);
        acc += w != NULL ? p * to_float(w[i]) : p;
    }
    acc = warp_reduce_sum(acc);
    if (lane == 0) { out[row] = acc; }
}

// rstd (M): in, the group's sums of squares; out, 1/sqrt(Σ/Cg + eps). out (M, C) = inp · rstd · w
__global__ void rmsnorm_tp_apply_kernel(floatX *out, float *rstd, const floatX *inp, const floatX *weight, long M, int C,
                                        float Cg) {
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= M) { return; }
    const float s = rsqrtf(rstd[row] / Cg + 1e-5f);
    __syncwarp();
    if (lane == 0) { rstd[row] = s; }
    for (int i = lane; i < C; i += 32) { out[row * C + i] = (floatX)(to_float(inp[row * C + i]) * s * to_float(weight[i])); }
}

// dinp = s·w·dy − (Σ_group dy·w·x)·s³/Cg · x (written); dot (M) the group's sums
__global__ void rmsnorm_tp_dinp_kernel(floatX *dinp, const floatX *dout, const floatX *inp, const floatX *weight,
                                       const float *rstd, const float *dot, long M, int C, float Cg) {
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= M) { return; }
    const float s = rstd[row], coef = dot[row] * s * s * s / Cg;
    for (int i = lane; i < C; i += 32) {
        const long o = row * C + i;
        dinp[o] = (floatX)(s * to_float(weight[i]) * to_float(dout[o]) - coef * to_float(inp[o]));
    }
}

// The recurrent mixers' output norm over their C = N·V channels (ref/common.h's mixer_norm_*): one RMSNorm over all
// of them, per group of C/G (groups > 1), or RMSNormTP across the tensor-parallel group (tp_norm > 1: a rank's local
// config); rstd (M, groups)
static void mixer_norm_forward(floatX *out, float *rstd, const floatX *inp, const floatX *weight, long M, int C,
                               int groups, int tp_norm, TPGroup *tp, cudaStream_t stream) {
    if (tp_norm > 1) {
        if (tp == NULL || tp->size != tp_norm) {
            fail_with_hint("run a tensor-parallel config in its TP group", "RMSNormTP over %d ranks without that group",
                           tp_norm);
        }
        const unsigned blocks = (unsigned)CEIL_DIV(M, 8L);
        row_dot_kernel<<<blocks, 256, 0, stream>>>(rstd, inp, inp, NULL, M, C);
        cudaCheck(cudaGetLastError());
        tp_sum(tp, rstd, (size_t)M, 1, stream);
        rmsnorm_tp_apply_kernel<<<blocks, 256, 0, stream>>>(out, rstd, inp, weight, M, C, (float)C * tp_norm);
        cudaCheck(cudaGetLastError());
    } else if (groups > 1) {
        group_rmsnorm_forward(out, rstd, inp, weight, M, C, groups, stream);
    } else {
        rmsnorm_forward(out, rstd, NULL, inp, NULL, weight, (int)M, C, stream);
    }
}

// floats of scratch mixer_norm_backward needs
static inline size_t mixer_norm_scratch(long M, int C) {
    const size_t plain = rmsnorm_backward_scratch((int)M, C), grouped = (size_t)token_chunks(M) * C + (size_t)M;
    return plain > grouped ? plain : grouped;
}

// dinp (M, C) written; dweight (C) +=; scratch: mixer_norm_scratch(M, C) floats
static void mixer_norm_backward(floatX *dinp, float *dweight, float *scratch, const floatX *dout, const floatX *inp,
                                const floatX *weight, const float *rstd, long M, int C, int groups, int tp_norm,
                                TPGroup *tp, cudaStream_t stream) {
    if (tp_norm > 1) {
        const unsigned blocks = (unsigned)CEIL_DIV(M, 8L);
        const int chunks = token_chunks(M);
        float *dot = scratch + (size_t)chunks * C;
        row_dot_kernel<<<blocks, 256, 0, stream>>>(dot, dout, inp, weight, M, C);
        cudaCheck(cudaGetLastError());
        tp_sum(tp, dot, (size_t)M, 1, stream);
        rmsnorm_tp_dinp_kernel<<<blocks, 256, 0, stream>>>(dinp, dout, inp, weight, rstd, dot, M, C, (float)C * tp_norm);
        cudaCheck(cudaGetLastError());
        group_rmsnorm_dweight_kernel<<<dim3(CEIL_DIV(C, 128), chunks), 128, 0, stream>>>(scratch, dout, inp, rstd, M, C, 1);
        cudaCheck(cudaGetLastError());
        reduce_partials(dweight, scratch, chunks, C, stream);
    } else if (groups > 1) {
        group_rmsnorm_backward(dinp, dweight, scratch, dout, inp, weight, rstd, M, C, groups, stream);
    } else {
        rmsnorm_backward(dinp, dweight, scratch, dout, inp, weight, rstd, (int)M, C, 0, stream);
    }
}

// hands out 256-byte aligned slices of one allocation; measures when base == NULL (used = bytes needed)
typedef struct { char *base; size_t used; } DeviceArena;
static inline void *take(DeviceArena *a, size_t bytes) {
    void *p = a->base != NULL ? a->base + a->used : NULL;
    a->used += (bytes + 255) & ~(size_t)255;
    return p;
}
#define TAKE_X(a, n) ((floatX *)take(a, (size_t)(n) * sizeof(floatX)))
#define TAKE_F(a, n) ((float *)take(a, (size_t)(n) * sizeof(float)))
#define TAKE_I(a, n) ((int *)take(a, (size_t)(n) * sizeof(int)))

// ----------------------------------------------------------------------------------------------------------------
// the interface of a layer kind on the GPU, the same as ref/common.h's in everything but precision and the runtime:
// the block calls these through the table of kinds.cuh and knows nothing else about a kind.

// typed views of the parameter buffer: the floatX working copy (ModelParams), and the fp32 gradients and master
// weights (ModelParams32); model.h's layout
DEFINE_MODEL_VIEWS(floatX, ModelParams)
DEFINE_MODEL_VIEWS(float, ModelParams32)
#define VIEW_FIELD(name) floatX *name;    // a kind's struct of named tensors: typedef struct { M2RNN_PARAMS(VIEW_FIELD) }
#define VIEW_FIELD_32(name) float *name;  // ... and of their gradients or master weights

// one layer's tensors of a kind, in the kind's _PARAMS order
typedef struct {
    floatX *const *w;  // the floatX working copy the kernels read
    float *const *w32; // the fp32 master weights (the decay gates read A_log and dt_bias from them)
    float *const *g;   // the fp32 gradients
    // an auxiliary loss (MoE's load balancing): the forward adds its value to *aux (when not NULL), the backward takes
    // aux_grad = dL/d(aux) (the loss scale)
    double *aux;
    float aux_grad;
    TPGroup *tp; // the tensor-parallel group (NULL: one GPU): RMSNormTP's collectives
} KindTensors;

// A decode step's input rows (B, C): RMSNorm(x + branch) · w of the residual stream (lm.cuh's decode_run), made by the
// kind's first product in its prologue where it can (step_product: the GEMV with the norm fused, one launch instead
// of two) or, first, into inp (step_input_rows: rmsnorm_forward) for everything else. Either way x_out receives
// x + branch (the residual stream after it) and rstd the 1/rms, with the same bits.
typedef struct {
    floatX *inp;          // (B, C) where the rows are made (step_input_rows); with ready, the rows themselves
    const floatX *x;      // (B, C) the residual stream (with tokens: the embedding table)
    const floatX *branch; // (B, C) added to it first, or NULL (the first layer's norm)
    const floatX *w;      // (C) the norm's weight
    floatX *x_out;        // (B, C) x + branch, or with tokens the embedded rows (a buffer other than x; else unused)
    float *rstd;          // (B)
    int ready;            // 1: inp holds the rows (no norm to make)
    // partial sums (up to STEP_MAX_PARTS × B × C floats; NULL: none): the branch as nparts fp32 partial sums there
    // (nparts > 0: branch unused), which the norm adds; then the kind's own branch product may leave its output there
    // too (step_branch_product: the norm has read them by then, in stream order), out_nparts of them (0: out holds it)
    float *parts;
    int nparts;
    int out_nparts;
    const int *tokens; // (B) or NULL: the first layer's rows are the embedding of these tokens, made by the first
                       // product's prologue (GemvNorm.tokens) or here, into x_out (the step's first kernel fewer)
} StepInput;

// the rows in in->inp, made now if they are not there yet
static const floatX *step_input_rows(StepInput *in, int B, int C, cudaStream_t stream) {
    if (!in->ready && in->tokens != NULL) { // (tokens checked on the host or drawn below V: rows of the table)
        embedding_forward(in->x_out, in->tokens, in->x, B, C, 0, INT_MAX, stream);
        rmsnorm_forward(in->inp, in->rstd, NULL, in->x_out, NULL, in->w, B, C, stream);
        in->ready = 1;
    }
    if (!in->ready && in->nparts > 0) {
        rmsnorm_forward_parts(in->inp, in->rstd, in->x_out, in->x, in->parts, in->nparts, in->w, B, C, stream);
        in->ready = 1;
    }
    if (!in->ready) {
        rmsnorm_forward(in->inp, in->rstd, in->branch != NULL ? in->x_out : NULL, in->x, in->branch, in->w, B, C,
                        stream);
        in->ready = 1;
    }
    return in->inp;
}
static inline GemvNorm step_gemv_norm(const StepInput *in) {
    GemvNorm n = {in->x, in->branch, in->w, in->x_out, in->rstd};
    n.tokens = in->tokens;
    return n;
}
// out (B, OC), rows out_stride apart, = rows @ weightᵀ: in a decode step of up to GEMV_MAX_M sequences with the norm
// in the product's prologue (the rows are then not stored), else the rows made first and matmul_forward_strided
// With epi (not NULL): true when the GEMV took the epilogue too (else the caller does its work).
template <class Epi = GemvNoEpilogue>
static bool step_product(floatX *out, int out_stride, StepInput *in, const floatX *weight, int B, int C, int OC,
                         const Runtime *rt, const Epi *epi = NULL) {
    // (not for the LM head: its thousands of blocks would each make the rows again, B·C·4 bytes of L2 reads a block)
    // (measured at one row: the 410M hybrid's step 0.516 -> 0.537 ms on an H200 with the LM head's norm in its blocks)
    if (!in->ready && in->nparts == 0 && rt->decode_step && OC <= 16384) {
        const GemvNorm n = step_gemv_norm(in);
        if (matmul_gemv_launch<false, Epi>(out, out_stride, NULL, weight, B, C, OC, &n, rt->stream, epi)) {
            return epi != NULL;
        }
    }
    matmul_forward_strided(out, out_stride, step_input_rows(in, B, C, rt->stream), weight, B, C, OC, rt);
    return false;
}
// h (B, F) = SwiGLU of the rows through up_w (2F, C), in one GEMV with the SwiGLU epilogue (and the norm in its
// prologue unless the rows are ready); false (nothing launched) where that kernel cannot take the shape
static bool step_product_glu(floatX *h, StepInput *in, const floatX *up_w, int B, int C, int F, const Runtime *rt) {
    if (!rt->decode_step || (!in->ready && in->nparts > 0)) { return false; }
    if (in->ready) { return matmul_gemv_glu(h, in->inp, up_w, B, C, F, rt->stream); }
    const GemvNorm n = step_gemv_norm(in);
    return matmul_gemv_launch<true>(h, F, NULL, up_w, B, C, F, &n, rt->stream);
}

// A kind's last product in a decode step, out (B, OC = d_model) = inp (B, IC) @ weightᵀ: the branch the next norm adds
// to the residual stream. From 5 to 64 sequences (cuBLASLt's products) it is made as S = 2 partial sums over halves of
// K in one cuBLASLt launch (into in->parts, their count in->out_nparts; decode_run hands them on), which the next norm adds before
// it rounds (rmsnorm_forward_parts): no split-K reduction kernel between the product and the norm, and twice the
// product's CTAs. H200, the 410M hybrid at batch 64: 1.63-1.64 -> 1.57 ms a step (S = 4: 1.59; NOTES.md, issue 14
// round 12). M2RNN_STEP_PARTS=0..4 sets S (0: off, for A/B runs). Below 5 or above 64 sequences, with K not a multiple
// of 8·S, and in the fp32 build, the product goes into out.
#define STEP_MAX_PARTS 4
static int step_split_parts(int B, int IC, int OC) {
    static int env = -1;
    env_int(&env, "M2RNN_STEP_PARTS", 2);
    int S = env < 0 ? 0 : (env > STEP_MAX_PARTS ? STEP_MAX_PARTS : env);
    while (S > 1 && IC % (8 * S) != 0) { S--; }
    return FLOATX_IS_FP32 || B <= gemv_max_rows() || B > 64 || !rmsnorm_row_packs_ok(OC) || S < 2 ? 0 : S;
}
// (in NULL, or outside a decode step: the product into out, as matmul_forward)
static void step_branch_product(floatX *out, StepInput *in, const floatX *inp, const floatX *weight, int B, int IC,
                                int OC, const Runtime *rt) {
    const int S = rt->decode_step && in != NULL && in->parts != NULL ? step_split_parts(B, IC, OC) : 0;
    if (in != NULL) { in->out_nparts = S; }
    if (S > 0) {
        matmul_split_partials(in->parts, inp, weight, B, IC, OC, S, rt);
    } else {
        matmul_forward(out, inp, weight, B, IC, OC, rt);
    }
}

typedef struct {
    char letter;
    // bytes one layer saves from forward to backward, and of the scratch its forward, backward and step use (shared
    // by all layers)
    size_t (*acts_bytes)(const ModelConfig *c, int B, int T, const Runtime *rt);
    size_t (*scratch_bytes)(const ModelConfig *c, int B, int T, const Runtime *rt);
    // out (B,T,C) = Kind(inp (B,T,C)); acts receives what the backward needs
    void (*forward)(floatX *out, void *acts, void *scratch, const floatX *inp, const KindTensors *t,
                    const ModelConfig *c, int B, int T, const Runtime *rt);
    // dinp (B,T,C) = d(inp) (written); the kind's parameter gradients t->g += ...
    void (*backward)(floatX *dinp, void *scratch, const floatX *dout, const floatX *inp, const void *acts,
                     const KindTensors *t, const ModelConfig *c, int B, int T, const Runtime *rt);
    // bytes of one sequence's decode state (the layers.h row's numbers at this executor's precision)
    size_t (*state_bytes)(const ModelConfig *c, int context);
    // One token of B sequences: out (B,C) from the input rows in (B,C; StepInput: the kind makes them with its first
    // product, step_product, or reads them through step_input_rows); state (B, state_bytes) updated in place (zeros:
    // the empty history); pos (B, on the device) the token's position in each sequence (< context); work:
    // acts_bytes(c, B, 1) + scratch_bytes(c, B, 1) bytes for temporaries
    void (*step)(floatX *out, void *state, void *work, StepInput *in, const KindTensors *t, const ModelConfig *c,
                 int B, const int *pos, int context, const Runtime *rt);
    // B sequences advance by T tokens each (a prompt's prefill, in chunks): out (B,T,C) from inp (B,T,C) through the
    // training forward's kernels from and back into the states; pos (B, device) each sequence's first new position;
    // work: decode_work_bytes(c, B, T). NULL for stateless kinds (the feed-forwards), which the block runs forward.
    void (*advance)(floatX *out, void *state, void *work, const floatX *inp, const KindTensors *t,
                    const ModelConfig *c, int B, int T, const int *pos, int context, const Runtime *rt);
} KindOps;

#endif // M2RNN_COMMON_CUH
