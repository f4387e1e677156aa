/*
mamba2.cuh: Mamba-2 (the S row of layers.h) on the GPU, mirroring ref/mamba2.h (whose comment gives the layer): the
projection z | x | B | C | dt, the causal conv with bias + SiLU on x|B|C (conv.cuh), dt = softplus(dt_raw + dt_bias),
the SSD recurrence in chunked form on the tensor cores, the gate y ⊙ SiLU(z) (gate.cuh), the RMSNorm per group of
DI/G channels, the output projection; the backward in reverse; the single-token step and the T-token advance of
decoding.

The recurrence, per sequence b and head h (group g = h / (H/G) supplies B and C), state S ∈ R^{P×N}, A = −exp(A_log):
    S_t = exp(dt_t A) S_{t−1} + dt_t x_t B_tᵀ,   y_t = S_t C_t + D x_t          (S_{−1} = h0 or 0)
Chunked (SSD) form over chunks of L = 64 tokens (the float64 oracle shared/tools/gdn_mamba2_oracle.py,
ssd_chunk_fwd / ssd_chunk_bwd, is the spec): Acs = the chunk's inclusive cumsum of dt·A,
    state pass:  S_start[c+1] = e^{Acs_last} S_start[c] + Σ_s e^{Acs_last − Acs_s} dt_s x_s B_sᵀ
    chunk scan:  y_l = Σ_{s≤l} (C_l·B_s) e^{Acs_l − Acs_s} dt_s x_s + e^{Acs_l} S_start C_l + D x_l
The backward runs the same state pass in reverse for the state gradients dS_end[c] (dS ← e^{Acs_last} dS +
Σ_l e^{Acs_l} dy_l C_lᵀ, from dh_final; what is left after chunk 0 is dh0), then one kernel per (b, chunk, group)
computes dx, ddt, dB, dC and the dA_log, dD partials from S_start[c] and dS_end[c] (formulas at the kernel).

Numeric contract: the tensor-core products take bf16 operands (x, B, C, dy as stored in bf16) and accumulate in fp32;
the fp32 build (PRECISION=FP32) stages fp32 tiles and multiplies them on the FMA pipe (tiles.cuh's fp32 warp_gemm),
unrounded. Rounded to bf16 (floatX) besides the inputs: S_start and dS_end (stored between kernels), the decay-weighted operands
of the state passes (x·e^{Acs_last−Acs}·dt forward, dy·e^{Acs} reverse; the chunk backward applies its row weights to
fp32 products instead), the masked chunk matrices (C Bᵀ ∘ Λ ∘ dt in the forward, its transpose-use in dx), and the
head-summed d(C Bᵀ) before its two last products.
The carried state of a pass, the cumsums, every decay, dt, ddt, the final state, dh0 and all reductions are fp32.
Gradients are deterministic: no float atomics; B and C, shared by the heads of a group, get their gradients summed
over the heads inside one CTA in head order; dA_log, dD go through per-(b, chunk, head) partials reduced in a fixed
order (reduce_partials).

Kernels (launcher in parentheses; a chunk slot is a chunk of some sequence, chunk_common.cuh):
    mamba2_state_pass_kernel   (mamba2_forward, mamba2_backward)  per (P-slice of 32, h, b), chunks in sequence,
                                                                   the state in registers; on sm_90a at P = 64,
                                                                   N = 64 or 128 its second form (_wg: per (h, b),
                                                                   wgmma + TMA; M2RNN_MAMBA2_WGMMA=0 keeps the first)
    mamba2_chunk_scan_kernel   (mamba2_forward)                    per (4 heads of a group, chunk slot); on sm_90a
                                                                   where the pass's second form runs, its own (_wg)
    mamba2_chunk_bwd_kernel    (mamba2_backward)                   per (group, chunk slot), heads of the group in turn
    mamba2_step_kernel         (mamba2_step)                       one token from the fp32 decode state
    mamba2_dt_forward_kernel / mamba2_dt_backward_kernel, (the layer's pointwise parts; the group RMSNorm is common.cuh's)
Layouts (tok = b·T + t, or cu_seqlens[b] + t for packed variable-length sequences, chunk_common.cuh: each restarts
from its own h0 (or zero) and ends in its own h_final; a packed sequence's results are bit for bit those of the same
sequence run alone, test_mamba2_gpu):
    x (tok, H·P), B, C (tok, G·N): floatX views with token stride `stride` (columns of the (B,T,conv_dim) buffer);
    dx, dB, dC the same views of the gradient buffer (written); y, dy (tok, H·P) floatX dense;
    dt, ddt (tok, H) fp32 (dt after the softplus; ddt written); A_log, D (H) fp32; dA_log, dD (H) fp32 (+=);
    h0, h_final, dh0, dh_final: (H, P, N) fp32 per sequence at b·state_stride floats, each optional (NULL).
Limits: any T ≥ 1, G dividing H, P ≤ 128, N ≤ 256 and the backward's shared memory (it grows with P and N: P=64,
N=128 take 179 KB; P=19, N=216 take 174 KB) within the device's opt-in limit; mamba2_check_dims says which (with
backward = 0 only the forward's limits: the fp32 test build runs the forward and the inference at P=64, N=128, whose
backward's fp32 tiles would not fit).
*/
#ifndef M2RNN_MAMBA2_CUH
#define M2RNN_MAMBA2_CUH

#include "common.cuh"
#include "conv.cuh"
#include "gate.cuh"
#include "chunk_common.cuh"
#include "tiles.cuh"

typedef struct { MAMBA2_PARAMS(VIEW_FIELD) } Mamba2Params;      // the layer's tensors, in the layers.h row's order
typedef struct { MAMBA2_PARAMS(VIEW_FIELD_32) } Mamba2Params32; // their gradients or fp32 master weights

#define MAMBA2_L 64         // chunk length (tokens)
#define MAMBA2_PS 32        // rows of P per state-pass CTA (16 was slower: NOTES.md)
#define MAMBA2_LDL 72       // pitch (elements) of the bf16 L×L tiles
#define MAMBA2_LDF 65       // pitch (floats) of the fp32 L×L tiles
#ifndef MAMBA2_BWD_WARPS
#define MAMBA2_BWD_WARPS 16 // warps of a chunk-backward CTA (one CTA an SM: its shared memory)
#endif
#define MAMBA2_SCAN_HB 4    // heads (of one group) a chunk-scan CTA takes in turn, C Bᵀ computed once for them
// The state pass keeps its (32 × N) state in the MMA accumulators (registers) and double-buffers the chunks' rows in
// shared memory (the next chunk's cp.async copies land during this chunk's product): 46 KB a CTA at N = 128, 4 CTAs
// an SM, so the benchmark shape's 512 CTAs take one wave. (The state in fp32 shared memory with two buffers took 61 KB:
// 3 CTAs an SM, two waves, slower than one buffer: dev/bench/NOTES.md.)

typedef struct {
    int B, T, H, P, N, G;  // sequences, tokens per sequence (packed: in all), heads, head dim, state size, B/C groups
    int stride;            // token stride (elements) of the x, B, C views and of their gradients
    const int *cu_seqlens; // (B+1,) device: packed variable-length sequences (chunk_common.cuh); NULL: B × T tokens
} Mamba2Dims;

__host__ __device__ static inline int mamba2_pad(int x) { return (x + 31) / 32 * 32; } // P and N padded to 32 while staged
// the chunk slots of the per-chunk buffers (chunk_common.cuh)
static inline long mamba2_slots(const Mamba2Dims *d) {
    return chunk_slots<MAMBA2_L>(d->cu_seqlens != NULL, d->B, d->T);
}

// shared memory of the three chunk kernels (bytes), the same carving as in the kernels
static inline size_t mamba2_pass_smem(int P, int N) {
    const int Np = mamba2_pad(N);
    return 2 * ((size_t)MAMBA2_L * (MAMBA2_PS + 8) + (size_t)MAMBA2_L * (Np + 8)) * sizeof(floatX) + 6 * MAMBA2_L * 4;
}
// (the chunk scan: B's rows, then C Bᵀ in fp32, share one area)
__host__ __device__ static inline size_t mamba2_scan_bcb(int N) {
    const size_t rows = (size_t)MAMBA2_L * (mamba2_pad(N) + 8) * sizeof(floatX), cb = (size_t)MAMBA2_L * MAMBA2_LDF * 4;
    return (rows > cb ? rows : cb + 15) / 16 * 16;
}
static inline size_t mamba2_scan_smem(int P, int N) {
    const int Np = mamba2_pad(N), Pp = mamba2_pad(P);
    return (size_t)MAMBA2_L * (Np + 8) * sizeof(floatX) + mamba2_scan_bcb(N) + (size_t)MAMBA2_L * (Pp + 8) * sizeof(floatX) +
           (size_t)Pp * (Np + 8) * sizeof(floatX) + (size_t)MAMBA2_L * MAMBA2_LDL * sizeof(floatX) + 2 * MAMBA2_L * 4;
}
static inline size_t mamba2_bwd_smem(int P, int N) {
    const int Np = mamba2_pad(N), Pp = mamba2_pad(P);
    return (size_t)2 * MAMBA2_L * (Np + 8) * sizeof(floatX)         // sB, sC
           + (size_t)2 * MAMBA2_L * MAMBA2_LDF * 4     // sCB, sdCB
           + (size_t)2 * MAMBA2_L * (Pp + 8) * sizeof(floatX)       // sX, sdY
           + (size_t)2 * Pp * (Np + 8) * sizeof(floatX)             // sS, sdS
           + (size_t)MAMBA2_L * MAMBA2_LDL * sizeof(floatX)         // sW1
           + (size_t)MAMBA2_L * MAMBA2_LDF * 4         // sQ
           + (size_t)2 * MAMBA2_L * (Pp + 1) * 4       // sSB, sYS
           + (size_t)12 * MAMBA2_L * 4;                // per-token vectors (a head's four, twice; four sums)
}

static const char *mamba2_check_dims(const Mamba2Dims *d, int backward = 1) {
    if (d->B < 1 || d->T < 1 || d->H < 1 || d->P < 1 || d->N < 1 || d->G < 1) { return "B, T, H, P, N, G must be >= 1"; }
    if (d->H % d->G != 0) { return "G must divide H"; }
    if (d->P > 128) { return "P must be <= 128"; }
    if (d->N > 256) { return "N must be <= 256"; }
    if (d->stride < d->H * d->P + 2 * d->G * d->N) { return "the token stride is smaller than x | B | C"; }
    if (mamba2_scan_smem(d->P, d->N) > 227 * 1024 || mamba2_pass_smem(d->P, d->N) > 227 * 1024) {
        return "P and N too large for the forward's shared memory";
    }
    if (backward && mamba2_bwd_smem(d->P, d->N) > 227 * 1024) { return "P and N too large for the backward's shared memory"; }
    return NULL;
}

static void mamba2_validate_dims(const Mamba2Dims *d, int backward = 1) {
    const char *why = mamba2_check_dims(d, backward);
    if (why != NULL) {
        fail_with_hint("see the limits in mamba2.cuh", "mamba2: unsupported shape B=%d T=%d H=%d P=%d N=%d G=%d: %s",
                       d->B, d->T, d->H, d->P, d->N, d->G, why);
    }
}

// workspace of mamba2_forward / mamba2_backward: S_start (and dS_end) bf16 (slots,H,P,N), partials (2, slots, H)
static inline size_t mamba2_work_bytes(const Mamba2Dims *d) {
    const size_t states = (size_t)mamba2_slots(d) * d->H * d->P * d->N;
    DeviceArena a = {NULL, 0};
    take(&a, states * sizeof(floatX));
    take(&a, states * sizeof(floatX));
    take(&a, (size_t)2 * mamba2_slots(d) * d->H * sizeof(float));
    return a.used;
}

// ----------------------------------------------------------------------------------------------------------------
// device helpers

using namespace tiles;

__device__ __forceinline__ floatX m2_bf(float x) { return (floatX)x; }
__device__ __forceinline__ float m2_f(floatX x) { return (float)x; }
#if !FLOATX_IS_FP32
__device__ __forceinline__ float m2_f(float x) { return x; }
#endif

// warp 0: Acs (64) = inclusive cumsum of dt·A over the chunk, sdt (64) = dt (0 past the sequence's end)
__device__ __forceinline__ void m2_chunk_cumsum(float *sAcs, float *sdt, const float *dt, int valid, int H, float A) {
    if (threadIdx.x >= 32) { return; }
    const int lane = threadIdx.x, s0 = 2 * lane;
    const float d0 = s0 < valid ? dt[(long)s0 * H] : 0.0f, d1 = s0 + 1 < valid ? dt[(long)(s0 + 1) * H] : 0.0f;
    const float a0 = d0 * A, a1 = d1 * A;
    const float incl = warp_scan_incl(a0 + a1);
    const float excl = incl - (a0 + a1);
    sAcs[s0] = excl + a0;
    sAcs[s0 + 1] = excl + a0 + a1;
    sdt[s0] = d0;
    sdt[s0 + 1] = d1;
}

// a state pass's chunk (warp 0): its cumsum and dt (m2_chunk_cumsum) and its row weights w_s = e^{Acs_last − Acs_s}
// dt_s (forward) or e^{Acs_s} (reverse)
__device__ __forceinline__ void m2_pass_weights(float *sAcs, float *sdt, float *w, const float *dt, int valid, int H,
                                                float A, int reverse) {
    m2_chunk_cumsum(sAcs, sdt, dt, valid, H, A);
    if (threadIdx.x < 32) { // (the lanes that wrote the cumsum: their warp's writes are visible after a syncwarp)
        __syncwarp();
        for (int s = threadIdx.x; s < MAMBA2_L; s += 32) {
            w[s] = reverse ? expf(sAcs[s]) : expf(sAcs[MAMBA2_L - 1] - sAcs[s]) * sdt[s];
        }
    }
}

// the M × NC product A (M × K) · B (K × NC) in 16×32 tiles spread over the warps; f(row, col, value) per element
template <bool A_T, bool B_T, typename F>
__device__ __forceinline__ void m2_tiles(int M, int NC, int K, const floatX *A, int lda, const floatX *B,
                                         int ldb, int warp, int nwarps, F f) {
    const int nct = NC / 32, ntiles = (M / 16) * nct;
    for (int tile = warp; tile < ntiles; tile += nwarps) {
        const int tr = tile / nct, tc = tile - tr * nct;
        float acc[4][4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int i = 0; i < 4; i++) { acc[j][i] = 0.0f; }
        }
        warp_gemm<4, A_T, B_T>(acc, A_T ? A + tr * 16 : A + (size_t)tr * 16 * lda, lda,
                               B_T ? B + (size_t)tc * 32 * ldb : B + tc * 32, ldb, K);
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int i = 0; i < 4; i++) { f(tr * 16 + acc_row(i), tc * 32 + acc_col(j, i), acc[j][i]); }
        }
    }
}

// ----------------------------------------------------------------------------------------------------------------
// the state pass: one CTA per (32 rows of P, head, sequence), chunks in order (reverse: last to first)
//   forward: Sst[c] = S before chunk c;  S ← e^{Acs_last} S + (U ∘ e^{Acs_last − Acs} dt)ᵀ V   (U = x, V = B)
//   reverse: Sst[c] = dS after chunk c;  dS ← e^{Acs_last} dS + (U ∘ e^{Acs})ᵀ V              (U = dy, V = C)
// Sst (slots,H,P,N) bf16; init / fin (H,P,N) fp32 at b·state_stride or NULL (may be the same memory);
// U (tok, H·P) view with token stride su; V (tok, G·N) view with token stride sv; dt (tok, H) fp32.
// The carried state lives in the accumulators: TPW 16×32 tiles of the 32 × Np state per warp (tile = warp + 4·t),
// fp32 from the first chunk to the last; each chunk scales them by its decay and adds its product in place.
template <int TPW>
__global__ void __launch_bounds__(128) mamba2_state_pass_kernel(floatX *Sst, float *fin, const float *init,
                                                                long state_stride, const floatX *U, long su,
                                                                const floatX *V, long sv, const float *dt,
                                                                const float *A_log, const int *cu_seqlens, int T,
                                                                int H, int P, int N, int G, int reverse) {
    extern __shared__ __align__(16) unsigned char m2_smem[];
    const int p0 = blockIdx.x * MAMBA2_PS, h = blockIdx.y, b = blockIdx.z, g = h / (H / G);
    const ChunkSeq seq = chunk_seq<MAMBA2_L>(cu_seqlens, b, T);
    const int Np = mamba2_pad(N), ldu = MAMBA2_PS + 8, ldv = Np + 8, nc = seq.nc;
    const int warp = threadIdx.x / 32, prows = min(MAMBA2_PS, P - p0), nct = Np / 32, ntiles = 2 * nct;
    const int BUF = MAMBA2_L * ldu + MAMBA2_L * ldv; // one buffer: U rows (L, ldu), V rows (L, ldv)
    floatX *sbuf = (floatX *)m2_smem;                // two buffers
    float *sAcsb = (float *)(sbuf + 2 * BUF), *sdtb = sAcsb + 2 * MAMBA2_L, *swb = sdtb + 2 * MAMBA2_L; // (2, L) each
    const float A = -expf(A_log[h]);
    float acc[TPW][4][4]; // element (i of n8-tile j) of tile t: state row tr·16 + acc_row(i), column tc·32 + acc_col(j, i)
#pragma unroll
    for (int t = 0; t < TPW; t++) {
        const int tile = warp + 4 * t, tr = tile / nct, tc = tile - tr * nct;
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = tr * 16 + acc_row(i), n = tc * 32 + acc_col(j, i);
                acc[t][j][i] = (init != NULL && tile < ntiles && r < prows && n < N)
                                   ? init[b * state_stride + ((long)h * P + p0 + r) * N + n] : 0.0f;
            }
        }
    }
    // the state before chunk c (the carried accumulators), out as floatX pairs
    auto put_state = [&](int c) {
        floatX *out = Sst + (((seq.cslot + c) * H + h) * P + p0) * N;
#pragma unroll
        for (int t = 0; t < TPW; t++) {
            const int tile = warp + 4 * t, tr = tile / nct, tc = tile - tr * nct;
            if (tile >= ntiles) { continue; }
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int i = 0; i < 4; i += 2) {
                    const int r = tr * 16 + acc_row(i), n = tc * 32 + acc_col(j, i);
                    if (r < prows && n < N) {
                        chunk_put2(out + (long)r * N + n, acc[t][j][i], acc[t][j][i + 1], true, n + 1 < N);
                    }
                }
            }
        }
    };
    // chunk it's raw U and V rows (cp.async) into buffer buf, and (warp 0) its cumsum, its decay and its row weights
    // w_s = e^{Acs_last − Acs_s} dt_s (forward) or e^{Acs_s} (reverse)
    auto issue = [&](int it, int buf) {
        const int c = reverse ? nc - 1 - it : it, t0 = c * MAMBA2_L, valid = min(MAMBA2_L, seq.len - t0);
        const long tok0 = seq.tok0 + t0;
        floatX *sU = sbuf + buf * BUF, *sV = sU + MAMBA2_L * ldu;
        chunk_stage(sU, ldu, U + tok0 * su + (long)h * P + p0, su, valid, prows, MAMBA2_L, MAMBA2_PS, (const float *)NULL);
        chunk_stage(sV, ldv, V + tok0 * sv + (long)g * N, sv, valid, N, MAMBA2_L, Np, (const float *)NULL);
        m2_pass_weights(sAcsb + buf * MAMBA2_L, sdtb + buf * MAMBA2_L, swb + buf * MAMBA2_L, dt + tok0 * H + h, valid, H,
                        A, reverse);
    };
    if (nc > 0) { // (a packed sequence of no tokens: fin = init)
        issue(0, 0);
        put_state(reverse ? nc - 1 : 0);
    }
    for (int it = 0; it < nc; it++) {
        const int buf = it & 1;
        floatX *sU = sbuf + buf * BUF, *sV = sU + MAMBA2_L * ldu;
        const float *sAcs = sAcsb + buf * MAMBA2_L, *w = swb + buf * MAMBA2_L;
        chunk_sync(); // chunk it's rows, cumsum and weights are in; every warp is done with the other buffer
        if (it + 1 < nc) { issue(it + 1, buf ^ 1); } // lands during this chunk's product
        for (int i = threadIdx.x; i < MAMBA2_L * MAMBA2_PS; i += blockDim.x) { // U rows · weight, in place
            const int r = i / MAMBA2_PS, col = i - r * MAMBA2_PS;
            sU[r * ldu + col] = m2_bf(m2_f(sU[r * ldu + col]) * w[r]);
        }
        __syncthreads();
        const float decay = expf(sAcs[MAMBA2_L - 1]);
#pragma unroll
        for (int t = 0; t < TPW; t++) {
            const int tile = warp + 4 * t, tr = tile / nct, tc = tile - tr * nct;
            if (tile >= ntiles) { continue; }
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int i = 0; i < 4; i++) { acc[t][j][i] *= decay; }
            }
            warp_gemm<4, true, false>(acc[t], sU + tr * 16, ldu, sV + tc * 32, ldv, MAMBA2_L);
        }
        if (it + 1 < nc) { put_state(reverse ? nc - 2 - it : it + 1); } // (stores in flight over the next wait)
    }
    if (fin != NULL) { // (after every read of init: they may be the same memory, each element this thread's own)
#pragma unroll
        for (int t = 0; t < TPW; t++) {
            const int tile = warp + 4 * t, tr = tile / nct, tc = tile - tr * nct;
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int r = tr * 16 + acc_row(i), n = tc * 32 + acc_col(j, i);
                    if (tile < ntiles && r < prows && n < N) { fin[b * state_stride + ((long)h * P + p0 + r) * N + n] = acc[t][j][i]; }
                }
            }
        }
    }
}

#if !FLOATX_IS_FP32
// The state pass on sm_90a (bf16, P = 64, N = 64 or 128, 16-byte aligned views, compute capability 9.0): one
// warpgroup a (head, sequence) carrying the whole P × N state in its m64nN accumulators (element 4j + i: row
// 16·warp + acc_row(i), column acc_col(j, i)); a chunk's U rows (64 tokens × P) and V rows (64 × N, boxes of 64
// columns) by the tensor copy engine into 128B-swizzled tiles, two buffers; U weighted in place; (U ∘ w)ᵀ V by wgmma
// (A = U M-major, B = V N-major); the state before each chunk out of bf16 tiles by tensor stores. The same sums and
// roundings as mamba2_state_pass_kernel; rows of a last chunk past the sequence's end (the next sequence's tokens or
// TMA's zeros) are zeroed in U and V, so packed sequences stay bit for bit.
template <int NB>
__global__ void __launch_bounds__(128)
    mamba2_state_pass_wg_kernel(float *fin, const float *init, long state_stride, const __grid_constant__ CUtensorMap tmU,
                                const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmS,
                                const float *dt, const float *A_log, const int *cu_seqlens, int T, int H, int G,
                                int reverse) {
    constexpr int P = 64, N = 64 * NB;
    constexpr uint32_t TILE = 8192, BUF = (1 + NB) * TILE; // a buffer: U's tile, V's NB tiles
    extern __shared__ __align__(16) unsigned char m2_smem[];
    // from a 1024-byte boundary: two buffers, the state's NB tiles, then the cumsums, dt and weights (2 × 64 fp32
    // each), the two buffers' mbarriers
    const uint32_t raw = tiles::smem_addr(m2_smem), pad = (1024u - (raw & 1023u)) & 1023u, base = raw + pad;
    unsigned char *sm = m2_smem + pad, *sS = sm + 2 * BUF;
    const uint32_t aS = base + 2 * BUF;
    float *sAcsb = (float *)(sS + NB * TILE), *sdtb = sAcsb + 2 * MAMBA2_L, *swb = sdtb + 2 * MAMBA2_L;
    const uint32_t mbar = aS + NB * TILE + 6 * MAMBA2_L * sizeof(float);
    const int h = blockIdx.x, b = blockIdx.y, g = h / (H / G), warp = threadIdx.x >> 5;
    const ChunkSeq seq = chunk_seq<MAMBA2_L>(cu_seqlens, b, T);
    const int nc = seq.nc;
    const float A = -expf(A_log[h]);
    if (threadIdx.x == 0) {
        tiles::mbar_init(mbar, 1);
        tiles::mbar_init(mbar + 8, 1);
        tiles::mbar_init_fence();
    }
    float acc[N / 2];
#pragma unroll
    for (int e = 0; e < N / 2; e++) {
        const int r = 16 * warp + acc_row(e & 3), n = acc_col(e >> 2, e & 3);
        acc[e] = init != NULL ? init[b * state_stride + ((long)h * P + r) * N + n] : 0.0f;
    }
    __syncthreads(); // (the mbarriers initialized)
    // chunk it's U and V boxes (thread 0) into buffer buf, and (warp 0) its cumsum, dt and row weights w_s =
    // e^{Acs_last − Acs_s} dt_s (forward) or e^{Acs_s} (reverse) into slot buf
    auto issue = [&](int it, int buf) {
        const int c = reverse ? nc - 1 - it : it, t0 = c * MAMBA2_L, valid = min(MAMBA2_L, seq.len - t0);
        const long tok0 = seq.tok0 + t0;
        if (threadIdx.x == 0) {
            const uint32_t mb = mbar + 8 * buf, bb = base + buf * BUF;
            tiles::mbar_arrive_tx(mb, BUF);
            tiles::tma_load_2d(bb, &tmU, h * P, (int)tok0, mb);
#pragma unroll
            for (int nb = 0; nb < NB; nb++) { tiles::tma_load_2d(bb + (1 + nb) * TILE, &tmV, g * N + 64 * nb, (int)tok0, mb); }
        }
        m2_pass_weights(sAcsb + buf * MAMBA2_L, sdtb + buf * MAMBA2_L, swb + buf * MAMBA2_L, dt + tok0 * H + h, valid, H,
                        A, reverse);
    };
    if (nc > 0) { issue(0, 0); }
    for (int it = 0; it < nc; it++) {
        const int buf = it & 1, c = reverse ? nc - 1 - it : it, valid = min(MAMBA2_L, seq.len - c * MAMBA2_L);
        unsigned char *sU = sm + buf * BUF, *sV = sU + TILE;
        const uint32_t aU = base + buf * BUF, aV = aU + TILE;
        const float *sAcs = sAcsb + buf * MAMBA2_L, *w = swb + buf * MAMBA2_L;
        // the state before this chunk (in the pass's order) into its bf16 tiles
#pragma unroll
        for (int e = 0; e < N / 2; e += 2) {
            const int r = 16 * warp + acc_row(e & 3), n = acc_col(e >> 2, e & 3);
            *(uint32_t *)(sS + (n >> 6) * TILE + tiles::swz128(r, 2 * (n & 63))) = pack_bf16x2(acc[e], acc[e + 1]);
        }
        chunk_sync(); // chunk it's cumsum and weights are in
        tiles::mbar_wait(mbar + 8 * buf, (it >> 1) & 1);
        if (it + 1 < nc) { issue(it + 1, buf ^ 1); } // lands during this chunk's product
        for (int i = threadIdx.x; i < MAMBA2_L * 8; i += blockDim.x) { // U rows · weight, in place; zero past the end
            const int r = i >> 3;
            uint4 x = *(const uint4 *)(sU + i * 16);
            __nv_bfloat16 *xv = (__nv_bfloat16 *)&x;
#pragma unroll
            for (int e = 0; e < 8; e++) { xv[e] = r < valid ? m2_bf(m2_f(xv[e]) * w[r]) : m2_bf(0.0f); }
            *(uint4 *)(sU + i * 16) = x;
        }
        if (valid < MAMBA2_L) { // a last chunk: V's rows past the end to zero
            for (int i = threadIdx.x; i < (MAMBA2_L - valid) * 8 * NB; i += blockDim.x) {
                const int r = valid + i / (8 * NB), nb = (i >> 3) % NB, p = i & 7;
                *(uint4 *)(sV + nb * TILE + r * 128 + p * 16) = make_uint4(0, 0, 0, 0);
            }
        }
        tiles::fence_proxy_async(); // the state's tiles, weighted U and V's zeroed rows before the copy engine and
        __syncthreads();            // the tensor cores read them
        if (threadIdx.x == 0) {
            const int srow = (int)(((seq.cslot + c) * H + h) * P);
#pragma unroll
            for (int nb = 0; nb < NB; nb++) { tiles::tma_store_2d(&tmS, aS + nb * TILE, 64 * nb, srow); }
            tiles::bulk_commit();
        }
        const float decay = expf(sAcs[MAMBA2_L - 1]);
#pragma unroll
        for (int e = 0; e < N / 2; e++) { acc[e] *= decay; }
        tiles::wgmma_pin(acc);
        tiles::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < MAMBA2_L / 16; kk++) {
            const uint64_t da = tiles::wgmma_desc(aU + kk * 2048, TILE, 1024, 1);
            const uint64_t db = tiles::wgmma_desc(aV + kk * 2048, TILE, 1024, 1);
            if constexpr (NB == 2) {
                tiles::wgmma_64x128<1, 1>(acc, da, db);
            } else {
                tiles::wgmma_64x64<1, 1>(acc, da, db);
            }
        }
        tiles::wgmma_commit();
        tiles::wgmma_wait<0>();
        if (threadIdx.x == 0) { tiles::bulk_wait_read(); } // the state's tiles read out before they are rewritten
        __syncthreads();
    }
    if (threadIdx.x == 0) { tiles::bulk_wait(); }
    if (fin != NULL) { // (after every read of init: they may be the same memory, each element this thread's own)
#pragma unroll
        for (int e = 0; e < N / 2; e++) {
            const int r = 16 * warp + acc_row(e & 3), n = acc_col(e >> 2, e & 3);
            fin[b * state_stride + ((long)h * P + r) * N + n] = acc[e];
        }
    }
}
static size_t mamba2_pass_wg_smem(int N) {
    return (2 * (1 + (size_t)N / 64) + N / 64) * 8192 + 6 * MAMBA2_L * sizeof(float) + 2 * sizeof(uint64_t) + 1024;
}
#endif

// ----------------------------------------------------------------------------------------------------------------
// a chunk scan's CTA (either form): blockIdx.x = (chunk slot, group g, block of MAMBA2_SCAN_HB of its heads) →
// the sequence b, its chunk c, g and the heads [h0, h1); false for a slot past the sequences' chunks
__device__ __forceinline__ bool mamba2_scan_cta(const int *cu_seqlens, int B, int T, int H, int G, int *b, int *c,
                                                ChunkSeq *seq, int *g, int *h0, int *h1) {
    const int hpg = H / G, blocks = CEIL_DIV(hpg, MAMBA2_SCAN_HB), hb = blockIdx.x % (G * blocks);
    *g = hb / blocks;
    if (!chunk_at_slot<MAMBA2_L>(cu_seqlens, B, T, blockIdx.x / (G * blocks), b, c, seq)) { return false; }
    *h0 = *g * hpg + (hb - *g * blocks) * MAMBA2_SCAN_HB;
    *h1 = min(*h0 + MAMBA2_SCAN_HB, (*g + 1) * hpg);
    return true;
}

// the chunk scan: one CTA per (block of MAMBA2_SCAN_HB heads of one group, chunk slot), the head blocks of a chunk
// side by side (they share its B and C rows in L2), 4 warps; C Bᵀ once per
// CTA (fp32, in the space of B once B is read), then per head
//   M = (C Bᵀ) ∘ Λ ∘ dt (Λ_ls = e^{Acs_l − Acs_s} for s ≤ l, else 0), bf16;  y = M x + e^{Acs} (C S_startᵀ) + D x
// y (tok, H·P); Sst (slots,H,P,N) bf16 from the state pass; the rest as mamba2_forward
__global__ void __launch_bounds__(128) mamba2_chunk_scan_kernel(floatX *y, const floatX *Sst, const floatX *x,
                                                                const floatX *Bm, const floatX *Cm, int stride,
                                                                const float *dt, const float *A_log, const float *D,
                                                                const int *cu_seqlens, int B, int T, int H, int P,
                                                                int N, int G) {
    extern __shared__ __align__(16) unsigned char m2_smem[];
    int b, c, g, h0, h1;
    ChunkSeq seq;
    if (!mamba2_scan_cta(cu_seqlens, B, T, H, G, &b, &c, &seq, &g, &h0, &h1)) { return; }
    const int Np = mamba2_pad(N), Pp = mamba2_pad(P), ldN = Np + 8, ldP = Pp + 8, warp = threadIdx.x / 32;
    const int t0 = c * MAMBA2_L, valid = min(MAMBA2_L, seq.len - t0);
    const long tok0 = seq.tok0 + t0, HP = (long)H * P, cs = seq.cslot + c;
    floatX *sC = (floatX *)m2_smem, *sB = sC + MAMBA2_L * ldN;
    float *sCB = (float *)sB; // (L, LDF) fp32 C Bᵀ, over B once every warp has read it (mamba2_scan_bcb: room for both)
    floatX *sX = (floatX *)((unsigned char *)sB + mamba2_scan_bcb(N)), *sS = sX + MAMBA2_L * ldP, *sM = sS + Pp * ldN;
    float *sAcs = (float *)(sM + MAMBA2_L * MAMBA2_LDL), *sdt = sAcs + MAMBA2_L;
    chunk_stage(sC, ldN, Cm + tok0 * stride + (long)g * N, stride, valid, N, MAMBA2_L, Np, (const float *)NULL);
    chunk_stage(sB, ldN, Bm + tok0 * stride + (long)g * N, stride, valid, N, MAMBA2_L, Np, (const float *)NULL);
    chunk_sync();
    { // C Bᵀ: 8 tiles of 16×32, two a warp, held in registers until every warp is done with B
        float cb[2][4][4];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int tile = warp + 4 * k, tr = tile / 2, tc = tile - tr * 2;
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int i = 0; i < 4; i++) { cb[k][j][i] = 0.0f; }
            }
            warp_gemm<4, false, true>(cb[k], sC + tr * 16 * ldN, ldN, sB + tc * 32 * ldN, ldN, Np);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int tile = warp + 4 * k, tr = tile / 2, tc = tile - tr * 2;
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int i = 0; i < 4; i++) { sCB[(tr * 16 + acc_row(i)) * MAMBA2_LDF + tc * 32 + acc_col(j, i)] = cb[k][j][i]; }
            }
        }
    }
    const int nct = Pp / 32;
    for (int h = h0; h < h1; h++) {
        chunk_sync(); // (h > h0) the previous head's readers are done
        m2_chunk_cumsum(sAcs, sdt, dt + tok0 * H + h, valid, H, -expf(A_log[h]));
        chunk_stage(sX, ldP, x + tok0 * stride + (long)h * P, stride, valid, P, MAMBA2_L, Pp, (const float *)NULL);
        chunk_stage(sS, ldN, Sst + (cs * H + h) * P * N, N, P, N, Pp, Np, (const float *)NULL);
        chunk_sync(); // (also: C Bᵀ is in)
        for (int i = threadIdx.x; i < MAMBA2_L * MAMBA2_L; i += blockDim.x) {
            const int l = i / MAMBA2_L, s_ = i - l * MAMBA2_L;
            sM[l * MAMBA2_LDL + s_] =
                m2_bf(s_ <= l ? sCB[l * MAMBA2_LDF + s_] * expf(sAcs[l] - sAcs[s_]) * sdt[s_] : 0.0f);
        }
        __syncthreads();
        const float Dh = D[h];
        for (int tile = warp; tile < 4 * nct; tile += 4) {
            const int tr = tile / nct, tc = tile - tr * nct;
            float acc[4][4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int i = 0; i < 4; i++) { acc[j][i] = 0.0f; }
            }
            warp_gemm<4, false, true>(acc, sC + tr * 16 * ldN, ldN, sS + tc * 32 * ldN, ldN, Np); // C S_startᵀ
            const float e0 = expf(sAcs[tr * 16 + acc_row(0)]), e1 = expf(sAcs[tr * 16 + acc_row(2)]);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                acc[j][0] *= e0;
                acc[j][1] *= e0;
                acc[j][2] *= e1;
                acc[j][3] *= e1;
            }
            warp_gemm<4, false, false>(acc, sM + tr * 16 * MAMBA2_LDL, MAMBA2_LDL, sX + tc * 32, ldP, MAMBA2_L);
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int i = 0; i < 4; i += 2) {
                    const int l = tr * 16 + acc_row(i), p = tc * 32 + acc_col(j, i);
                    if (l < valid && p < P) {
                        const float x0 = m2_f(sX[l * ldP + p]), x1 = m2_f(sX[l * ldP + p + 1]);
                        chunk_put2(y + (tok0 + l) * HP + (long)h * P + p, acc[j][i] + Dh * x0, acc[j][i + 1] + Dh * x1,
                                   true, p + 1 < P);
                    }
                }
            }
        }
    }
}

#if !FLOATX_IS_FP32
// The chunk scan on sm_90a (where the state pass's sm_90a form runs: P = 64, N = 64 or 128): one warpgroup a (block of
// MAMBA2_SCAN_HB heads of a group, chunk slot), as mamba2_chunk_scan_kernel. C and B (NB boxes of 64 columns each) by
// the tensor copy engine, C Bᵀ by wgmma into registers (it stays there for the CTA's heads); per head, x and S_start
// (two buffers: the next head's land under this head's products) and its cumsum, M = (C Bᵀ) ∘ Λ ∘ dt from the
// registers into a tile, y = e^{Acs} ∘ (C S_startᵀ) + M x (wgmma: C, M K-major; S_start K-major, x N-major) + D x, out
// of a tile by one tensor store (a last, partial chunk: its rows from registers). The same sums and roundings as the
// mma.sync kernel; rows past the chunk's end: M's columns there and x's rows are zero.
template <int NB>
__global__ void __launch_bounds__(128)
    mamba2_chunk_scan_wg_kernel(floatX *y, const __grid_constant__ CUtensorMap tmX, const __grid_constant__ CUtensorMap tmB,
                                const __grid_constant__ CUtensorMap tmC, const __grid_constant__ CUtensorMap tmS,
                                const __grid_constant__ CUtensorMap tmY, const float *dt, const float *A_log,
                                const float *D, const int *cu_seqlens, int B, int T, int H, int G) {
    constexpr int P = 64, N = 64 * NB;
    constexpr uint32_t TILE = 8192, HBUF = (1 + NB) * TILE; // a head's buffer: x, S_start's NB tiles
    extern __shared__ __align__(16) unsigned char m2_smem[];
    int b, c, g, h0, h1;
    ChunkSeq seq;
    if (!mamba2_scan_cta(cu_seqlens, B, T, H, G, &b, &c, &seq, &g, &h0, &h1)) { return; }
    const int t0 = c * MAMBA2_L, valid = min(MAMBA2_L, seq.len - t0), tok0 = (int)(seq.tok0 + t0), warp = threadIdx.x >> 5;
    const long HP = (long)H * P, cs = seq.cslot + c;
    // from a 1024-byte boundary: C (NB tiles), B (NB), two head buffers, M, y; the cumsums and dt (2 × 64 fp32 each);
    // mbarriers: C and B, the two head buffers
    const uint32_t raw = tiles::smem_addr(m2_smem), pad = (1024u - (raw & 1023u)) & 1023u, base = raw + pad;
    unsigned char *sm = m2_smem + pad;
    const uint32_t aC = base, aB = aC + NB * TILE, aH = aB + NB * TILE, aM = aH + 2 * HBUF, aY = aM + TILE;
    unsigned char *sM = sm + (aM - base), *sY = sm + (aY - base);
    float *sAcsb = (float *)(sm + (aY - base) + TILE), *sdtb = sAcsb + 2 * MAMBA2_L;
    const uint32_t mbCB = aY + TILE + 4 * MAMBA2_L * sizeof(float), mbH = mbCB + 8;
    if (threadIdx.x == 0) {
        for (int i = 0; i < 3; i++) { tiles::mbar_init(mbCB + 8 * i, 1); }
        tiles::mbar_init_fence();
    }
    __syncthreads(); // (the mbarriers initialized)
    if (threadIdx.x == 0) {
        tiles::mbar_arrive_tx(mbCB, 2 * NB * TILE);
#pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            tiles::tma_load_2d(aC + nb * TILE, &tmC, g * N + 64 * nb, tok0, mbCB);
            tiles::tma_load_2d(aB + nb * TILE, &tmB, g * N + 64 * nb, tok0, mbCB);
        }
    }
    auto issue_head = [&](int hi, int buf) { // thread 0: x and S_start of head h0 + hi; warp 0: its cumsum and dt
        const int h = h0 + hi;
        if (threadIdx.x == 0) {
            const uint32_t mb = mbH + 8 * buf, hb0 = aH + buf * HBUF;
            tiles::mbar_arrive_tx(mb, HBUF);
            tiles::tma_load_2d(hb0, &tmX, h * P, tok0, mb);
#pragma unroll
            for (int nb = 0; nb < NB; nb++) {
                tiles::tma_load_2d(hb0 + (1 + nb) * TILE, &tmS, 64 * nb, (int)((cs * H + h) * P), mb);
            }
        }
        m2_chunk_cumsum(sAcsb + buf * MAMBA2_L, sdtb + buf * MAMBA2_L, dt + (long)tok0 * H + h, valid, H,
                        -expf(A_log[h]));
    };
    issue_head(0, 0);
    if (h1 - h0 > 1) { issue_head(1, 1); }
    float cb[32]; // C Bᵀ: row 16·warp + acc_row(i), column acc_col(j, i), element 4j + i
    tiles::wgmma_zero(cb);
    tiles::mbar_wait(mbCB, 0);
    tiles::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++) {
        tiles::wgmma_64x64<0, 0>(cb, tiles::wgmma_desc(aC + (kk >> 2) * TILE + (kk & 3) * 32, 16, 1024, 1),
                                 tiles::wgmma_desc(aB + (kk >> 2) * TILE + (kk & 3) * 32, 16, 1024, 1));
    }
    tiles::wgmma_commit();
    tiles::wgmma_wait<0>();
    for (int hi = 0; hi < h1 - h0; hi++) {
        const int h = h0 + hi, buf = hi & 1;
        const uint32_t ax = aH + buf * HBUF, aS = ax + TILE;
        unsigned char *sx = sm + (ax - base);
        const float *sAcs = sAcsb + buf * MAMBA2_L, *sdt = sdtb + buf * MAMBA2_L;
        tiles::mbar_wait(mbH + 8 * buf, (hi >> 1) & 1);
        __syncthreads(); // the cumsum in (warp 0's), the previous head's readers of M and y done
        if (valid < MAMBA2_L) { // a last chunk: x's rows past the end to zero
            for (int i = threadIdx.x; i < (MAMBA2_L - valid) * 8; i += blockDim.x) {
                *(uint4 *)(sx + (valid + (i >> 3)) * 128 + (i & 7) * 16) = make_uint4(0, 0, 0, 0);
            }
        }
        // M = (C Bᵀ) ∘ Λ ∘ dt, zero above the diagonal and past the chunk's end, from the registers
#pragma unroll
        for (int e = 0; e < 32; e += 2) {
            const int l = 16 * warp + acc_row(e & 3), s0 = acc_col(e >> 2, e & 3);
            const float m0 = s0 <= l && s0 < valid ? cb[e] * expf(sAcs[l] - sAcs[s0]) * sdt[s0] : 0.0f;
            const float m1 = s0 + 1 <= l && s0 + 1 < valid ? cb[e + 1] * expf(sAcs[l] - sAcs[s0 + 1]) * sdt[s0 + 1] : 0.0f;
            *(uint32_t *)(sM + tiles::swz128(l, 2 * s0)) = pack_raw(m2_bf(m0), m2_bf(m1));
        }
        tiles::fence_proxy_async(); // M and x's zeroed rows before the tensor cores read them
        __syncthreads();
        float acc[32];
        tiles::wgmma_zero(acc);
        tiles::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < N / 16; kk++) { // C S_startᵀ
            tiles::wgmma_64x64<0, 0>(acc, tiles::wgmma_desc(aC + (kk >> 2) * TILE + (kk & 3) * 32, 16, 1024, 1),
                                     tiles::wgmma_desc(aS + (kk >> 2) * TILE + (kk & 3) * 32, 16, 1024, 1));
        }
        tiles::wgmma_commit();
        tiles::wgmma_wait<0>();
        const float e0 = expf(sAcs[16 * warp + acc_row(0)]), e1 = expf(sAcs[16 * warp + acc_row(2)]);
#pragma unroll
        for (int e = 0; e < 32; e++) { acc[e] *= (e & 2) ? e1 : e0; }
        tiles::wgmma_pin(acc);
        tiles::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < MAMBA2_L / 16; kk++) { // + M x
            tiles::wgmma_64x64<0, 1>(acc, tiles::wgmma_desc(aM + kk * 32, 16, 1024, 1),
                                     tiles::wgmma_desc(ax + kk * 2048, TILE, 1024, 1));
        }
        tiles::wgmma_commit();
        tiles::wgmma_wait<0>();
        const float Dh = D[h];
#pragma unroll
        for (int e = 0; e < 32; e += 2) { // y = that + D x
            const int l = 16 * warp + acc_row(e & 3), p = acc_col(e >> 2, e & 3);
            const uint32_t off = tiles::swz128(l, 2 * p), xr = *(const uint32_t *)(sx + off);
            const float y0 = acc[e] + Dh * tiles::bf_lo(xr), y1 = acc[e + 1] + Dh * tiles::bf_hi(xr);
            if (valid == MAMBA2_L) {
                *(uint32_t *)(sY + off) = pack_bf16x2(y0, y1);
            } else if (l < valid) {
                chunk_put2(y + ((long)tok0 + l) * HP + (long)h * P + p, y0, y1, true, true);
            }
        }
        tiles::fence_proxy_async(); // y's tile before the copy engine reads it
        __syncthreads();            // (this head's buffer is read: the head after next may land in it)
        if (threadIdx.x == 0 && valid == MAMBA2_L) {
            tiles::tma_store_2d(&tmY, aY, h * P, tok0);
            tiles::bulk_commit();
        }
        if (hi + 2 < h1 - h0) { issue_head(hi + 2, buf); }
        if (threadIdx.x == 0) { tiles::bulk_wait_read(); } // y's tile read out before the next head writes it
    }
}
static size_t mamba2_scan_wg_smem(int N) {
    return ((size_t)4 * (N / 64) + 4) * 8192 + 4 * MAMBA2_L * sizeof(float) + 3 * sizeof(uint64_t) + 1024;
}
#endif

// ----------------------------------------------------------------------------------------------------------------
// the backward of a chunk: one CTA per (group, chunk slot), MAMBA2_BWD_WARPS warps, the group's heads in turn. Per
// head, with S = S_start[c], dS = dS_end[c], Λ as in the scan, dec_s = e^{Acs_last − Acs_s}, CB = C Bᵀ (shared by
// the heads):
//   Q = CB ∘ Λ ∘ (dy xᵀ)                 dCB = Λ ∘ dt_s ∘ (dy xᵀ) (summed over the heads)
//   dx_s  = Σ_l (CB∘Λ)_ls dt_s dy_l + dec_s dt_s (dS B_s) + D dy_s
//   ddt_s = Σ_l Q_ls + dec_s x_s·(dS B_s) + da_s A
//   dB    = dCBᵀ C + Σ_h diag(dec dt) X dS;     dC = dCB B + Σ_h diag(e^{Acs}) dY S
//   dAcs_l = Σ_s Q_ls dt_s − dt_l Σ_s' Q_s'l + e^{Acs_l} dy_l·(S C_l) − E_l,  E_l = dec_l dt_l x_l·(dS B_l);
//   dAcs_last += Σ E + e^{Acs_last} <S, dS>;  da = reverse cumsum of dAcs;  dA += Σ da dt;  dD += Σ dy·x
// dx, dB, dC views (token stride `stride`) written; ddt (tok, H) written; part (2, slots, H): dA_log and dD
// partials per (chunk slot, head), zero for an unused slot; Sst, dSst (slots,H,P,N) bf16 from the two state passes
template <int TPW> // 16×32 tiles of dB (and of dC) per warp: 4·Np/32 tiles over MAMBA2_BWD_WARPS warps
__global__ void __launch_bounds__(MAMBA2_BWD_WARPS * 32)
    mamba2_chunk_bwd_kernel(floatX *dx, floatX *dB, floatX *dC, float *ddt, float *part, const floatX *dy,
                            const floatX *Sst, const floatX *dSst, const floatX *x, const floatX *Bm, const floatX *Cm,
                            int stride, const float *dt, const float *A_log, const float *D, const int *cu_seqlens,
                            int B, int T, int H, int P, int N, int G) {
    extern __shared__ __align__(16) unsigned char m2_smem[];
    const int g = blockIdx.x % G, hpg = H / G;
    const long slot = blockIdx.x / G, NS = gridDim.x / G;
    int b, c;
    ChunkSeq seq;
    if (!chunk_at_slot<MAMBA2_L>(cu_seqlens, B, T, slot, &b, &c, &seq)) { // the reduction reads every slot's partials
        for (int h = g * hpg + threadIdx.x; h < (g + 1) * hpg; h += blockDim.x) {
            part[slot * H + h] = 0.0f;
            part[(NS + slot) * H + h] = 0.0f;
        }
        return;
    }
    const int Np = mamba2_pad(N), Pp = mamba2_pad(P), ldN = Np + 8, ldP = Pp + 8, ldPf = Pp + 1;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int t0 = c * MAMBA2_L, valid = min(MAMBA2_L, seq.len - t0);
    const long HP = (long)H * P;
    // the chunk's first token and its slot, read back from shared memory where they are needed: kept in registers
    // they cost a spill (the kernel runs at its 128-register limit)
    __shared__ long s_tok0, s_cs;
    if (threadIdx.x == 0) {
        s_tok0 = seq.tok0 + t0;
        s_cs = seq.cslot + c;
    }
    __syncthreads();
    long tok0 = s_tok0; // (re-read at each head: the compiler then need not keep it across the head's products)
    floatX *sB = (floatX *)m2_smem, *sC = sB + MAMBA2_L * ldN;
    float *sCB = (float *)(sC + MAMBA2_L * ldN), *sdCB = sCB + MAMBA2_L * MAMBA2_LDF;
    floatX *sX = (floatX *)(sdCB + MAMBA2_L * MAMBA2_LDF), *sdY = sX + MAMBA2_L * ldP;
    floatX *sS = sdY + MAMBA2_L * ldP, *sdS = sS + Pp * ldN, *sW1 = sdS + Pp * ldN;
    float *sQ = (float *)(sW1 + MAMBA2_L * MAMBA2_LDL), *sSB = sQ + MAMBA2_L * MAMBA2_LDF, *sYS = sSB + MAMBA2_L * ldPf;
    float *shead = sYS + MAMBA2_L * ldPf; // (2, 4, L): a head's cumsum, dt, w, e; the next head's filled meanwhile
    float *sdAcs = shead + 8 * MAMBA2_L, *sddt = sdAcs + MAMBA2_L, *sE = sddt + MAMBA2_L, *sDD = sE + MAMBA2_L;
    // (warp 0) head hh's cumsum Acs, dt, w_s = e^{Acs_last − Acs_s} dt_s and e_s = e^{Acs_s} into buffer buf
    auto head_vectors = [&](int hh, int buf) {
        if (threadIdx.x >= 32) { return; }
        float *acs = shead + buf * 4 * MAMBA2_L, *dts = acs + MAMBA2_L, *w = dts + MAMBA2_L, *e = w + MAMBA2_L;
        m2_chunk_cumsum(acs, dts, dt + tok0 * H + hh, valid, H, -expf(A_log[hh]));
        __syncwarp();
        for (int s = threadIdx.x; s < MAMBA2_L; s += 32) {
            w[s] = expf(acs[MAMBA2_L - 1] - acs[s]) * dts[s];
            e[s] = expf(acs[s]);
        }
    };

    chunk_stage(sB, ldN, Bm + tok0 * stride + (long)g * N, stride, valid, N, MAMBA2_L, Np, (const float *)NULL);
    chunk_stage(sC, ldN, Cm + tok0 * stride + (long)g * N, stride, valid, N, MAMBA2_L, Np, (const float *)NULL);
    for (int i = threadIdx.x; i < MAMBA2_L * MAMBA2_LDF; i += blockDim.x) { sdCB[i] = 0.0f; }
    chunk_sync();
    m2_tiles<false, true>(MAMBA2_L, MAMBA2_L, Np, sC, ldN, sB, ldN, warp, MAMBA2_BWD_WARPS,
                          [&](int l, int s, float v) { sCB[l * MAMBA2_LDF + s] = v; });
    const int nctN = Np / 32, ntBC = 4 * nctN;
    float accB[TPW][4][4], accC[TPW][4][4];
#pragma unroll
    for (int k = 0; k < TPW; k++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int i = 0; i < 4; i++) { accB[k][j][i] = 0.0f; accC[k][j][i] = 0.0f; }
        }
    }
    head_vectors(g * hpg, 0);
    for (int h = g * hpg; h < (g + 1) * hpg; h++) {
        const int cur = (h - g * hpg) & 1;
        const float A = -expf(A_log[h]), Dh = D[h];
        const float *sAcs = shead + cur * 4 * MAMBA2_L, *sdt = sAcs + MAMBA2_L, *sw = sdt + MAMBA2_L, *se = sw + MAMBA2_L;
        chunk_sync(); // the previous head's readers are done; this head's vectors are in
        const long sidx = (s_cs * H + h) * P * N; // (s_cs: written before the barriers above)
        tok0 = s_tok0; // (the same value: see above)
        chunk_stage(sX, ldP, x + tok0 * stride + (long)h * P, stride, valid, P, MAMBA2_L, Pp, (const float *)NULL);
        chunk_stage(sdY, ldP, dy + tok0 * HP + (long)h * P, HP, valid, P, MAMBA2_L, Pp, (const float *)NULL);
        chunk_stage(sS, ldN, Sst + sidx, N, P, N, Pp, Np, (const float *)NULL);
        chunk_stage(sdS, ldN, dSst + sidx, N, P, N, Pp, Np, (const float *)NULL);
        if (h + 1 < (g + 1) * hpg) { head_vectors(h + 1, cur ^ 1); } // (its dt loads overlap the copies)
        chunk_sync();
        // dy xᵀ → Q, dCB, W1 = CB ∘ Λ ∘ dt (bf16)
        m2_tiles<false, true>(MAMBA2_L, MAMBA2_L, Pp, sdY, ldP, sX, ldP, warp, MAMBA2_BWD_WARPS,
                              [&](int l, int s, float v) {
                                  float q = 0.0f, w1 = 0.0f, dcb = 0.0f;
                                  if (s <= l) {
                                      const float lam = expf(sAcs[l] - sAcs[s]), cl = sCB[l * MAMBA2_LDF + s] * lam;
                                      q = cl * v;
                                      w1 = cl * sdt[s];
                                      dcb = lam * sdt[s] * v;
                                  }
                                  sQ[l * MAMBA2_LDF + s] = q;
                                  sdCB[l * MAMBA2_LDF + s] += dcb;
                                  sW1[l * MAMBA2_LDL + s] = m2_bf(w1);
                              });
        // SB = B dSᵀ, YS = C Sᵀ (L × P)
        m2_tiles<false, true>(MAMBA2_L, Pp, Np, sB, ldN, sdS, ldN, warp, MAMBA2_BWD_WARPS,
                              [&](int l, int p, float v) { sSB[l * ldPf + p] = v; });
        m2_tiles<false, true>(MAMBA2_L, Pp, Np, sC, ldN, sS, ldN, warp, MAMBA2_BWD_WARPS,
                              [&](int l, int p, float v) { sYS[l * ldPf + p] = v; });
        // the state terms of dB and dC, summed over the heads in registers: dB_s += w_s (X dS)_s, dC_s += e_s (dY S)_s
        // (each head's product in fp32, its row weights applied in fp32 before the sum)
#pragma unroll
        for (int k = 0; k < TPW; k++) {
            const int tile = warp + MAMBA2_BWD_WARPS * k;
            if (tile < ntBC) {
                const int tr = tile / nctN, tc = tile - tr * nctN;
                float t1[4][4], t2[4][4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
#pragma unroll
                    for (int i = 0; i < 4; i++) { t1[j][i] = 0.0f; t2[j][i] = 0.0f; }
                }
                warp_gemm<4, false, false>(t1, sX + tr * 16 * ldP, ldP, sdS + tc * 32, ldN, Pp);
                warp_gemm<4, false, false>(t2, sdY + tr * 16 * ldP, ldP, sS + tc * 32, ldN, Pp);
#pragma unroll
                for (int j = 0; j < 4; j++) {
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int r = tr * 16 + acc_row(i);
                        accB[k][j][i] += sw[r] * t1[j][i];
                        accC[k][j][i] += se[r] * t2[j][i];
                    }
                }
            }
        }
        chunk_sync();
        // dx = W1ᵀ dy + dec dt SB + D dy
        m2_tiles<true, false>(MAMBA2_L, Pp, MAMBA2_L, sW1, MAMBA2_LDL, sdY, ldP, warp, MAMBA2_BWD_WARPS,
                              [&](int s, int p, float v) {
                                  if (s < valid && p < P) {
                                      const float dyv = m2_f(sdY[s * ldP + p]);
                                      dx[(tok0 + s) * stride + (long)h * P + p] =
                                          (floatX)(v + sw[s] * sSB[s * ldPf + p] + Dh * dyv);
                                  }
                              });
        // per-token sums, one warp per token row
        for (int r = warp; r < MAMBA2_L; r += MAMBA2_BWD_WARPS) {
            float rowM = 0.0f, colQ = 0.0f, xsb = 0.0f, dys = 0.0f, dyx = 0.0f;
            for (int s = lane; s < MAMBA2_L; s += 32) {
                rowM += sQ[r * MAMBA2_LDF + s] * sdt[s];
                colQ += sQ[s * MAMBA2_LDF + r];
            }
            for (int p = lane; p < Pp; p += 32) {
                const float xv = m2_f(sX[r * ldP + p]), dv = m2_f(sdY[r * ldP + p]);
                xsb += xv * sSB[r * ldPf + p];
                dys += dv * sYS[r * ldPf + p];
                dyx += dv * xv;
            }
            rowM = warp_reduce_sum(rowM);
            colQ = warp_reduce_sum(colQ);
            xsb = warp_reduce_sum(xsb);
            dys = warp_reduce_sum(dys);
            dyx = warp_reduce_sum(dyx);
            if (lane == 0) {
                const float dec = expf(sAcs[MAMBA2_L - 1] - sAcs[r]), E = sw[r] * xsb;
                sE[r] = E;
                sdAcs[r] = rowM - sdt[r] * colQ + se[r] * dys - E;
                sddt[r] = colQ + dec * xsb;
                sDD[r] = dyx;
            }
        }
        // <S, dS> (the bf16 values both products used)
        float sds = 0.0f;
        for (int i = threadIdx.x; i < Pp * Np; i += blockDim.x) {
            const int r = i / Np, n = i - r * Np;
            sds += m2_f(sS[r * ldN + n]) * m2_f(sdS[r * ldN + n]);
        }
        sds = block_reduce_sum(sds); // synchronizes the block: the per-token sums are visible after it
        chunk_sync();
        if (warp == 0) {
            const int s0 = 2 * lane;
            float Esum = sE[s0] + sE[s0 + 1];
            Esum = warp_reduce_sum(Esum);
            float d0 = sdAcs[s0], d1 = sdAcs[s0 + 1];
            if (s0 + 1 == MAMBA2_L - 1) { d1 += Esum + expf(sAcs[MAMBA2_L - 1]) * sds; }
            // reverse inclusive cumsum over the 64 tokens
            float suf = d0 + d1;
            for (int off = 1; off < 32; off <<= 1) {
                const float v = __shfl_down_sync(0xffffffffu, suf, off);
                if (lane + off < 32) { suf += v; }
            }
            const float da1 = suf - d0, da0 = suf; // da_s = Σ_{s' ≥ s} dAcs_s'
            if (s0 < valid) { ddt[(tok0 + s0) * H + h] = sddt[s0] + da0 * A; }
            if (s0 + 1 < valid) { ddt[(tok0 + s0 + 1) * H + h] = sddt[s0 + 1] + da1 * A; }
            float dA = da0 * sdt[s0] + da1 * sdt[s0 + 1], dDs = sDD[s0] + sDD[s0 + 1];
            dA = warp_reduce_sum(dA);
            dDs = warp_reduce_sum(dDs);
            if (lane == 0) { // (the slot from blockIdx again: kept live it would take registers the loop needs)
                const long sl = blockIdx.x / G, ns = gridDim.x / G;
                part[sl * H + h] = dA * A; // dA_log = dA · A
                part[(ns + sl) * H + h] = dDs;
            }
        }
    }
    chunk_sync();
    // dB = dCBᵀ C + accB, dC = dCB B + accC (dCB rounded to bf16 into sW1)
    for (int i = threadIdx.x; i < MAMBA2_L * MAMBA2_L; i += blockDim.x) {
        const int l = i / MAMBA2_L, s = i - l * MAMBA2_L;
        sW1[l * MAMBA2_LDL + s] = m2_bf(sdCB[l * MAMBA2_LDF + s]);
    }
    chunk_sync();
#pragma unroll
    for (int k = 0; k < TPW; k++) {
        const int tile = warp + MAMBA2_BWD_WARPS * k;
        if (tile < ntBC) {
            const int tr = tile / nctN, tc = tile - tr * nctN;
            warp_gemm<4, true, false>(accB[k], sW1 + tr * 16, MAMBA2_LDL, sC + tc * 32, ldN, MAMBA2_L);
            warp_gemm<4, false, false>(accC[k], sW1 + tr * 16 * MAMBA2_LDL, MAMBA2_LDL, sB + tc * 32, ldN, MAMBA2_L);
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int s = tr * 16 + acc_row(i), n = tc * 32 + acc_col(j, i);
                    if (s < valid && n < N) {
                        dB[(tok0 + s) * stride + (long)g * N + n] = (floatX)accB[k][j][i];
                        dC[(tok0 + s) * stride + (long)g * N + n] = (floatX)accC[k][j][i];
                    }
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------------------------------------------
// launchers

#if !FLOATX_IS_FP32
// where the sm_90a forms apply (the state pass and the chunk scan): P = 64, N = 64 or 128, the views' pointers (their
// OR, ptrs) and row strides (row_elems, their OR, in elements) 16-byte aligned, a compute capability 9.0 device,
// M2RNN_MAMBA2_WGMMA not 0, and the tensor maps' 32-bit box coordinates; ntok and NS (the tokens and the state slots,
// the maps' extents) out
static int mamba2_wgmma = -1;
static bool mamba2_wg_applies(const Mamba2Dims *d, uintptr_t ptrs, long row_elems, uint64_t *ntok, uint64_t *NS) {
    if (!env_on_unless_0(&mamba2_wgmma, "M2RNN_MAMBA2_WGMMA") || d->P != 64 || (d->N != 64 && d->N != 128) ||
        (ptrs & 15) != 0 || (row_elems * (long)sizeof(floatX)) % 16 != 0 || !gpu_is_sm90()) {
        return false;
    }
    *ntok = (uint64_t)(d->cu_seqlens != NULL ? 1 : d->B) * d->T;
    *NS = (uint64_t)mamba2_slots(d);
    return *ntok < (1ull << 31) && *NS * d->H * d->P < (1ull << 31);
}

// the sm_90a state pass where it applies (mamba2_wg_applies, and the driver's tensor maps): true if launched
static bool mamba2_state_pass_wg(floatX *Sst, float *fin, const float *init, long state_stride, const floatX *U,
                                 long su, const floatX *V, long sv, const float *dt, const float *A_log,
                                 const Mamba2Dims *d, int reverse, cudaStream_t stream) {
    uint64_t ntok = 0, NS = 0;
    if (!mamba2_wg_applies(d, (uintptr_t)Sst | (uintptr_t)U | (uintptr_t)V, su | sv, &ntok, &NS)) { return false; }
    const uint64_t du[2] = {(uint64_t)d->H * d->P, ntok}, dv[2] = {(uint64_t)d->G * d->N, ntok};
    const uint64_t ds[2] = {(uint64_t)d->N, NS * d->H * d->P};
    const uint64_t su_b[1] = {(uint64_t)su * sizeof(floatX)}, sv_b[1] = {(uint64_t)sv * sizeof(floatX)};
    const uint64_t ss_b[1] = {(uint64_t)d->N * sizeof(floatX)};
    const uint32_t box[2] = {64, 64};
    CUtensorMap tmU, tmV, tmS;
    if (!tma_map_bf16(&tmU, U, 2, du, su_b, box, CU_TENSOR_MAP_SWIZZLE_128B) ||
        !tma_map_bf16(&tmV, V, 2, dv, sv_b, box, CU_TENSOR_MAP_SWIZZLE_128B) ||
        !tma_map_bf16(&tmS, Sst, 2, ds, ss_b, box, CU_TENSOR_MAP_SWIZZLE_128B)) {
        return false;
    }
    auto pass = d->N == 128 ? mamba2_state_pass_wg_kernel<2> : mamba2_state_pass_wg_kernel<1>;
    const size_t smem = mamba2_pass_wg_smem(d->N);
    kernel_smem_limit((const void *)pass, smem);
    pass<<<dim3(d->H, d->B), 128, smem, stream>>>(fin, init, state_stride, tmU, tmV, tmS, dt, A_log, d->cu_seqlens,
                                                   d->T, d->H, d->G, reverse);
    cudaCheck(cudaGetLastError());
    return true;
}
#endif

// the state pass (see the kernel)
static void mamba2_state_pass(floatX *Sst, float *fin, const float *init, long state_stride, const floatX *U,
                              long su, const floatX *V, long sv, const float *dt, const float *A_log,
                              const Mamba2Dims *d, int reverse, cudaStream_t stream) {
#if !FLOATX_IS_FP32
    if (mamba2_state_pass_wg(Sst, fin, init, state_stride, U, su, V, sv, dt, A_log, d, reverse, stream)) { return; }
#endif
    const size_t smem = mamba2_pass_smem(d->P, d->N);
    const dim3 grid(CEIL_DIV(d->P, MAMBA2_PS), d->H, d->B);
    const int tpw = CEIL_DIV(2 * mamba2_pad(d->N) / 32, 4); // the state's 16×32 tiles per warp
#define MAMBA2_PASS_LAUNCH(K)                                                                                          \
    kernel_smem_limit((const void *)mamba2_state_pass_kernel<K>, smem);                                                \
    mamba2_state_pass_kernel<K><<<grid, 128, smem, stream>>>(Sst, fin, init, state_stride, U, su, V, sv, dt, A_log,    \
                                                             d->cu_seqlens, d->T, d->H, d->P, d->N, d->G, reverse)
    if (tpw <= 1) { MAMBA2_PASS_LAUNCH(1); } else if (tpw == 2) { MAMBA2_PASS_LAUNCH(2); }
    else if (tpw == 3) { MAMBA2_PASS_LAUNCH(3); } else { MAMBA2_PASS_LAUNCH(4); }
#undef MAMBA2_PASS_LAUNCH
    cudaCheck(cudaGetLastError());
}

#if !FLOATX_IS_FP32
// the sm_90a chunk scan where it applies (as mamba2_state_pass_wg): true if launched
static bool mamba2_chunk_scan_wg(floatX *y, const floatX *Sst, const floatX *x, const floatX *Bm, const floatX *Cm,
                                 const float *dt, const float *A_log, const float *D, const Mamba2Dims *d,
                                 cudaStream_t stream) {
    uint64_t ntok = 0, NS = 0;
    const uintptr_t ptrs = (uintptr_t)y | (uintptr_t)Sst | (uintptr_t)x | (uintptr_t)Bm | (uintptr_t)Cm;
    if (!mamba2_wg_applies(d, ptrs, d->stride, &ntok, &NS)) { return false; }
    const uint64_t dx[2] = {(uint64_t)d->H * d->P, ntok}, dbc[2] = {(uint64_t)d->G * d->N, ntok};
    const uint64_t ds[2] = {(uint64_t)d->N, NS * d->H * d->P};
    const uint64_t sx[1] = {(uint64_t)d->stride * sizeof(floatX)}, sy[1] = {(uint64_t)d->H * d->P * sizeof(floatX)};
    const uint64_t ss[1] = {(uint64_t)d->N * sizeof(floatX)};
    const uint32_t box[2] = {64, 64};
    const CUtensorMapSwizzle S128 = CU_TENSOR_MAP_SWIZZLE_128B;
    CUtensorMap tmX, tmB, tmC, tmS, tmY;
    if (!tma_map_bf16(&tmX, x, 2, dx, sx, box, S128) || !tma_map_bf16(&tmB, Bm, 2, dbc, sx, box, S128) ||
        !tma_map_bf16(&tmC, Cm, 2, dbc, sx, box, S128) || !tma_map_bf16(&tmS, Sst, 2, ds, ss, box, S128) ||
        !tma_map_bf16(&tmY, y, 2, dx, sy, box, S128)) {
        return false;
    }
    auto scan = d->N == 128 ? mamba2_chunk_scan_wg_kernel<2> : mamba2_chunk_scan_wg_kernel<1>;
    const size_t smem = mamba2_scan_wg_smem(d->N);
    kernel_smem_limit((const void *)scan, smem);
    scan<<<(unsigned)(NS * d->G * CEIL_DIV(d->H / d->G, MAMBA2_SCAN_HB)), 128, smem, stream>>>(
        y, tmX, tmB, tmC, tmS, tmY, dt, A_log, D, d->cu_seqlens, d->B, d->T, d->H, d->G);
    cudaCheck(cudaGetLastError());
    return true;
}
#endif

// y (tok, H·P) = the recurrence from h0 (or zeros); h_final (or NULL) = the state after the last token (may be h0:
// the decode advance updates the states in place); work: mamba2_work_bytes(d)
static void mamba2_forward(floatX *y, float *h_final, const floatX *x, const floatX *Bm, const floatX *Cm,
                           const float *dt, const float *A_log, const float *D, const float *h0, long state_stride,
                           const Mamba2Dims *d, void *work, cudaStream_t stream) {
    mamba2_validate_dims(d, 0);
    floatX *Sst = (floatX *)work;
    mamba2_state_pass(Sst, h_final, h0, state_stride, x, d->stride, Bm, d->stride, dt, A_log, d, 0, stream);
#if !FLOATX_IS_FP32
    if (mamba2_chunk_scan_wg(y, Sst, x, Bm, Cm, dt, A_log, D, d, stream)) { return; }
#endif
    const size_t smem = mamba2_scan_smem(d->P, d->N);
    kernel_smem_limit((const void *)mamba2_chunk_scan_kernel, smem);
    mamba2_chunk_scan_kernel<<<(unsigned)(mamba2_slots(d) * d->G * CEIL_DIV(d->H / d->G, MAMBA2_SCAN_HB)), 128, smem,
                               stream>>>(
        y, Sst, x, Bm, Cm, d->stride, dt, A_log, D, d->cu_seqlens, d->B, d->T, d->H, d->P, d->N, d->G);
    cudaCheck(cudaGetLastError());
}

// dx, dB, dC (views) and ddt (tok, H) written; dA_log, dD (H) +=; dh0 (or NULL) written; from dy (tok, H·P) and
// dh_final (or NULL); states at b·state_stride floats; work: mamba2_work_bytes(d)
static void mamba2_backward(floatX *dx, floatX *dB, floatX *dC, float *ddt, float *dA_log, float *dD, float *dh0,
                            const floatX *dy, const float *dh_final, const floatX *x, const floatX *Bm,
                            const floatX *Cm, const float *dt, const float *A_log, const float *D, const float *h0,
                            long state_stride, const Mamba2Dims *d, void *work, cudaStream_t stream) {
    mamba2_validate_dims(d, 1);
    const long NS = mamba2_slots(d);
    const size_t states = (size_t)NS * d->H * d->P * d->N;
    DeviceArena a = {(char *)work, 0};
    floatX *Sst = (floatX *)take(&a, states * sizeof(floatX)), *dSst = (floatX *)take(&a, states * sizeof(floatX));
    float *part = TAKE_F(&a, (size_t)2 * NS * d->H);
    mamba2_state_pass(Sst, NULL, h0, state_stride, x, d->stride, Bm, d->stride, dt, A_log, d, 0, stream);
    mamba2_state_pass(dSst, dh0, dh_final, state_stride, dy, (long)d->H * d->P, Cm, d->stride, dt, A_log, d, 1, stream);
    const size_t smem = mamba2_bwd_smem(d->P, d->N);
    const unsigned grid = (unsigned)(NS * d->G); // x = slot·G + group
    const int tpw = CEIL_DIV(4 * mamba2_pad(d->N) / 32, MAMBA2_BWD_WARPS);
#define MAMBA2_BWD_LAUNCH(K)                                                                                           \
    kernel_smem_limit((const void *)mamba2_chunk_bwd_kernel<K>, smem);                                                 \
    mamba2_chunk_bwd_kernel<K><<<grid, MAMBA2_BWD_WARPS * 32, smem, stream>>>(                                         \
        dx, dB, dC, ddt, part, dy, Sst, dSst, x, Bm, Cm, d->stride, dt, A_log, D, d->cu_seqlens, d->B, d->T, d->H,     \
        d->P, d->N, d->G)
    if (tpw <= 1) { MAMBA2_BWD_LAUNCH(1); } else if (tpw == 2) { MAMBA2_BWD_LAUNCH(2); }
    else if (tpw == 3) { MAMBA2_BWD_LAUNCH(3); } else { MAMBA2_BWD_LAUNCH(4); }
#undef MAMBA2_BWD_LAUNCH
    cudaCheck(cudaGetLastError());
    reduce_partials(dA_log, part, (int)NS, d->H, stream);
    reduce_partials(dD, part + (size_t)NS * d->H, (int)NS, d->H, stream);
}

// ----------------------------------------------------------------------------------------------------------------
// the single-token step: grid (H, B), 4 warps, one warp per row p of the state (lanes over n, fp32)
//   S ← e^{dt A} S + dt x Bᵀ;  y = S C + D x
// y (B, H·P); state: sequence b's (H,P,N) fp32 at b·state_stride; x, Bm, Cm rows `stride` apart; dt (B, H)
__global__ void mamba2_step_kernel(floatX *y, float *state, long state_stride, const floatX *x, const floatX *Bm,
                                   const floatX *Cm, int stride, const float *dt, const float *A_log, const float *D,
                                   int H, int P, int N, int G) {
    const int h = blockIdx.x, b = blockIdx.y, g = h / (H / G), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float d = dt[(long)b * H + h], a = expf(-expf(A_log[h]) * d);
    const floatX *xb = x + (long)b * stride + (long)h * P, *Bb = Bm + (long)b * stride + (long)g * N;
    const floatX *Cb = Cm + (long)b * stride + (long)g * N;
    float *S = state + (long)b * state_stride + (long)h * P * N;
    for (int p = warp; p < P; p += blockDim.x / 32) {
        const float xv = to_float(xb[p]), dx = d * xv;
        float acc = 0.0f;
        for (int n = lane; n < N; n += 32) {
            const float s = a * S[(long)p * N + n] + dx * to_float(Bb[n]);
            S[(long)p * N + n] = s;
            acc += s * to_float(Cb[n]);
        }
        acc = warp_reduce_sum(acc);
        if (lane == 0) { y[(long)b * H * P + (long)h * P + p] = (floatX)(acc + D[h] * xv); }
    }
}

static void mamba2_step(floatX *y, float *state, long state_stride, const floatX *x, const floatX *Bm,
                        const floatX *Cm, const float *dt, const float *A_log, const float *D, const Mamba2Dims *d,
                        cudaStream_t stream) {
    mamba2_step_kernel<<<dim3(d->H, d->B), 128, 0, stream>>>(y, state, state_stride, x, Bm, Cm, d->stride, dt, A_log,
                                                             D, d->H, d->P, d->N, d->G);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------------------
// dt = softplus(dt_raw + dt_bias) (fp32; dt_bias from the fp32 master weights, as gate.cuh's decay gate)

// one block per token; dt (BT, H); dt_raw a view with token stride `stride`
__global__ void mamba2_dt_forward_kernel(float *dt, const floatX *dt_raw, const float *dt_bias, int H, int stride) {
    const long m = blockIdx.x;
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
        dt[m * H + h] = softplus_f(to_float(dt_raw[m * stride + h]) + dt_bias[h]);
    }
}

// ddt_raw (view) = ddt · sigmoid(dt_raw + dt_bias); partial (chunks, H) of ddt_bias
__global__ void mamba2_dt_backward_kernel(floatX *ddt_raw, float *partial, const float *ddt, const floatX *dt_raw,
                                          const float *dt_bias, long BT, int H, int stride) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (h >= H) { return; }
    float acc = 0.0f;
    const long begin = (long)chunk * TOKEN_CHUNK, end = min(begin + TOKEN_CHUNK, BT);
    for (long m = begin; m < end; m++) {
        const float u = to_float(dt_raw[m * stride + h]) + dt_bias[h];
        const float gv = ddt[m * H + h] / (1.0f + expf(-u));
        ddt_raw[m * stride + h] = (floatX)gv;
        acc += gv;
    }
    partial[(long)chunk * H + h] = acc;
}

static void mamba2_dt_forward(float *dt, const floatX *dt_raw, const float *dt_bias, long BT, int H, int stride,
                              cudaStream_t stream) {
    mamba2_dt_forward_kernel<<<(unsigned)BT, 64, 0, stream>>>(dt, dt_raw, dt_bias, H, stride);
    cudaCheck(cudaGetLastError());
}

// ddt_bias (H) +=; scratch: token_chunks(BT)·H floats
static void mamba2_dt_backward(floatX *ddt_raw, float *ddt_bias, float *scratch, const float *ddt, const floatX *dt_raw,
                               const float *dt_bias, long BT, int H, int stride, cudaStream_t stream) {
    const int chunks = token_chunks(BT);
    mamba2_dt_backward_kernel<<<dim3(CEIL_DIV(H, 64), chunks), 64, 0, stream>>>(ddt_raw, scratch, ddt, dt_raw, dt_bias,
                                                                                BT, H, stride);
    cudaCheck(cudaGetLastError());
    reduce_partials(ddt_bias, scratch, chunks, H, stream);
}

// ----------------------------------------------------------------------------------------------------------------
// the mixer

static inline int mamba2_proj_stride(const ModelConfig *c) { return round_up(mamba2_proj_rows(c), 8); }

static inline Mamba2Dims mamba2_dims(const ModelConfig *c, int B, int T) {
    Mamba2Dims d = {B, T, mamba2_heads(c), c->mamba2.head_dim, c->mamba2.state, c->mamba2.groups, mamba2_conv_dim(c)};
    return d;
}

typedef struct {
    floatX *proj;     // (B,T,Rs) z | x | B | C | dt_raw
    floatX *conv_pre; // (B,T,CD) conv output (with bias) before SiLU
    floatX *conv_act; // (B,T,CD) x | B | C after SiLU
    float *dt;        // (B,T,H) softplus(dt_raw + dt_bias)
    floatX *y;        // (B,T,DI) the recurrence's outputs (with D x)
    floatX *gated;    // (B,T,DI) y ⊙ SiLU(z)
    floatX *normed;   // (B,T,DI)
    float *rstd;      // (B,T,G)
} Mamba2Acts;

static size_t mamba2_acts_layout(Mamba2Acts *a, void *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, DI = mamba2_inner(c), H = mamba2_heads(c), CD = mamba2_conv_dim(c);
    DeviceArena ar = {(char *)base, 0};
    a->proj = TAKE_X(&ar, BT * mamba2_proj_stride(c));
    a->conv_pre = TAKE_X(&ar, BT * CD);
    a->conv_act = TAKE_X(&ar, BT * CD);
    a->dt = TAKE_F(&ar, BT * H);
    a->y = TAKE_X(&ar, BT * DI);
    a->gated = TAKE_X(&ar, BT * DI);
    a->normed = TAKE_X(&ar, BT * DI);
    a->rstd = TAKE_F(&ar, BT * c->mamba2.groups);
    return ar.used;
}

typedef struct {
    floatX *d_proj, *d_conv_act, *d_y, *d_gated, *d_normed; // shapes of the activations
    float *d_dt;    // (B,T,H)
    void *work;     // the recurrence's workspace (mamba2_work_bytes)
    float *reduce;  // partial sums of the parameter-gradient reductions
} Mamba2Scratch;

static size_t mamba2_scratch_layout(Mamba2Scratch *s, void *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, DI = mamba2_inner(c), H = mamba2_heads(c), CD = mamba2_conv_dim(c);
    const Mamba2Dims d = mamba2_dims(c, B, T);
    DeviceArena ar = {(char *)base, 0};
    s->d_proj = TAKE_X(&ar, BT * mamba2_proj_stride(c));
    s->d_conv_act = TAKE_X(&ar, BT * CD);
    s->d_y = TAKE_X(&ar, BT * DI);
    s->d_gated = TAKE_X(&ar, BT * DI);
    s->d_normed = TAKE_X(&ar, BT * DI);
    s->d_dt = TAKE_F(&ar, BT * H);
    s->work = take(&ar, mamba2_work_bytes(&d));
    const size_t chunks = token_chunks((long)BT);
    const size_t need[3] = {chunks * CD * (c->mamba2.conv + 1), chunks * DI, chunks * H};
    size_t reduce = 0;
    for (int i = 0; i < 3; i++) { reduce = need[i] > reduce ? need[i] : reduce; }
    s->reduce = TAKE_F(&ar, reduce);
    return ar.used;
}

static size_t mamba2_mixer_acts_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    Mamba2Acts a;
    return mamba2_acts_layout(&a, NULL, c, B, T);
}
static size_t mamba2_mixer_scratch_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    Mamba2Scratch s;
    return mamba2_scratch_layout(&s, NULL, c, B, T);
}

// the forward from the projection on; with state (decoding: B sequences' states, `stride` floats apart) the conv and
// h continue from it and are left updated, without (training) both start from zeros
static void mamba2_mixer_run(floatX *out, Mamba2Acts *a, void *work, const floatX *inp, const KindTensors *t,
                             const ModelConfig *c, int B, int T, float *state, long stride, const Runtime *rt) {
    const Mamba2Params *w = (const Mamba2Params *)t->w;
    const Mamba2Params32 *w32 = (const Mamba2Params32 *)t->w32;
    const int BT = B * T, C = c->d_model, R = mamba2_proj_rows(c), Rs = mamba2_proj_stride(c);
    const int DI = mamba2_inner(c), CD = mamba2_conv_dim(c), H = mamba2_heads(c), G = c->mamba2.groups;
    const int GN = G * c->mamba2.state, Wc = c->mamba2.conv;
    const Mamba2Dims d = mamba2_dims(c, B, T);
    cudaStream_t stream = rt->stream;
    matmul_forward_strided(a->proj, Rs, inp, w->in_w, BT, C, R, rt);
    float *h = state != NULL ? state + (size_t)(Wc - 1) * CD : NULL;
    if (state != NULL) {
        conv1d_silu_advance(a->conv_pre, a->conv_act, state, stride, a->proj + DI, w->conv_w, w->conv_b, B, T, CD, Wc,
                            Rs, stream);
    } else {
        conv1d_silu_forward(a->conv_pre, a->conv_act, a->proj + DI, w->conv_w, w->conv_b, B, T, CD, Wc, Rs, stream);
    }
    mamba2_dt_forward(a->dt, a->proj + DI + CD, w32->dt_bias, BT, H, Rs, stream);
    mamba2_forward(a->y, h, a->conv_act, a->conv_act + DI, a->conv_act + DI + GN, a->dt, w32->A_log, w32->D, h, stride,
                   &d, work, stream);
    output_gate_forward(a->y, a->gated, NULL, a->proj, NULL, BT, DI, 0, Rs, stream);
    group_rmsnorm_forward(a->normed, a->rstd, a->gated, w->norm_w, BT, DI, G, stream);
    matmul_forward(out, a->normed, w->out_w, BT, DI, C, rt);
}

static void mamba2_mixer_forward(floatX *out, void *acts, void *scratch, const floatX *inp, const KindTensors *t,
                                 const ModelConfig *c, int B, int T, const Runtime *rt) {
    Mamba2Acts a;
    mamba2_acts_layout(&a, acts, c, B, T);
    Mamba2Scratch s;
    mamba2_scratch_layout(&s, scratch, c, B, T);
    mamba2_mixer_run(out, &a, s.work, inp, t, c, B, T, NULL, 0, rt);
}

static void mamba2_mixer_backward(floatX *dinp, void *scratch, const floatX *dout, const floatX *inp, const void *acts,
                                  const KindTensors *t, const ModelConfig *c, int B, int T, const Runtime *rt) {
    const Mamba2Params *w = (const Mamba2Params *)t->w;
    const Mamba2Params32 *w32 = (const Mamba2Params32 *)t->w32, *g = (const Mamba2Params32 *)t->g;
    Mamba2Acts a;
    mamba2_acts_layout(&a, (void *)acts, c, B, T);
    Mamba2Scratch s;
    mamba2_scratch_layout(&s, scratch, c, B, T);
    const int BT = B * T, C = c->d_model, R = mamba2_proj_rows(c), Rs = mamba2_proj_stride(c);
    const int DI = mamba2_inner(c), CD = mamba2_conv_dim(c), H = mamba2_heads(c), G = c->mamba2.groups;
    const int GN = G * c->mamba2.state;
    const Mamba2Dims d = mamba2_dims(c, B, T);
    cudaStream_t stream = rt->stream;
    matmul_backward(s.d_normed, g->out_w, dout, a.normed, w->out_w, BT, DI, C, 0, rt);
    group_rmsnorm_backward(s.d_gated, g->norm_w, s.reduce, s.d_normed, a.gated, w->norm_w, a.rstd, BT, DI, G, stream);
    output_gate_backward(s.d_y, s.d_proj, s.d_gated, a.y, a.proj, BT, DI, Rs, stream);
    mamba2_backward(s.d_conv_act, s.d_conv_act + DI, s.d_conv_act + DI + GN, s.d_dt, g->A_log, g->D, NULL, s.d_y, NULL,
                    a.conv_act, a.conv_act + DI, a.conv_act + DI + GN, a.dt, w32->A_log, w32->D, NULL, 0, &d, s.work,
                    stream);
    mamba2_dt_backward(s.d_proj + DI + CD, g->dt_bias, s.reduce, s.d_dt, a.proj + DI + CD, w32->dt_bias, BT, H, Rs,
                       stream);
    conv1d_silu_backward(s.d_proj + DI, g->conv_w, g->conv_b, s.reduce, s.d_conv_act, a.conv_pre, a.proj + DI,
                         w->conv_w, B, T, CD, c->mamba2.conv, Rs, stream);
    matmul_backward_strided(dinp, g->in_w, s.d_proj, Rs, inp, w->in_w, BT, C, R, 0, rt);
}

// a sequence's decode state: the conv window (W−1, CD) then h (H, P, N), fp32 (the CPU's order)
static size_t mamba2_mixer_state_bytes(const ModelConfig *c, int context) {
    return mamba2_decode_state(c, context) * sizeof(float);
}

static void mamba2_mixer_step(floatX *out, void *state, void *work, StepInput *in, const KindTensors *t,
                              const ModelConfig *c, int B, const int *pos, int context, const Runtime *rt) {
    const Mamba2Params *w = (const Mamba2Params *)t->w;
    const Mamba2Params32 *w32 = (const Mamba2Params32 *)t->w32;
    Mamba2Acts a;
    mamba2_acts_layout(&a, work, c, B, 1);
    const int C = c->d_model, R = mamba2_proj_rows(c), Rs = mamba2_proj_stride(c);
    const int DI = mamba2_inner(c), CD = mamba2_conv_dim(c), H = mamba2_heads(c), G = c->mamba2.groups;
    const int GN = G * c->mamba2.state, Wc = c->mamba2.conv;
    const long stride = (long)(mamba2_mixer_state_bytes(c, context) / sizeof(float));
    float *window = (float *)state, *h = window + (size_t)(Wc - 1) * CD;
    const Mamba2Dims d = mamba2_dims(c, B, 1);
    cudaStream_t stream = rt->stream;
    step_product(a.proj, Rs, in, w->in_w, B, C, R, rt);
    conv1d_silu_step(a.conv_act, window, stride, a.proj + DI, w->conv_w, w->conv_b, B, CD, Wc, Rs, stream);
    mamba2_dt_forward(a.dt, a.proj + DI + CD, w32->dt_bias, B, H, Rs, stream);
    mamba2_step(a.y, h, stride, a.conv_act, a.conv_act + DI, a.conv_act + DI + GN, a.dt, w32->A_log, w32->D, &d, stream);
    output_gate_forward(a.y, a.gated, NULL, a.proj, NULL, B, DI, 0, Rs, stream);
    group_rmsnorm_forward(a.normed, a.rstd, a.gated, w->norm_w, B, DI, G, stream);
    step_branch_product(out, in, a.normed, w->out_w, B, DI, C, rt);
}

// B sequences advance by T tokens (a prefill chunk): the forward's kernels from and back into the windows and h
static void mamba2_mixer_advance(floatX *out, void *state, void *work, const floatX *inp, const KindTensors *t,
                                 const ModelConfig *c, int B, int T, const int *pos, int context, const Runtime *rt) {
    Mamba2Acts a;
    const size_t acts = mamba2_acts_layout(&a, work, c, B, T);
    Mamba2Scratch s;
    mamba2_scratch_layout(&s, (char *)work + acts, c, B, T);
    const long stride = (long)(mamba2_mixer_state_bytes(c, context) / sizeof(float));
    mamba2_mixer_run(out, &a, s.work, inp, t, c, B, T, (float *)state, stride, rt);
}

static const KindOps MAMBA2_OPS = {'S', mamba2_mixer_acts_bytes, mamba2_mixer_scratch_bytes, mamba2_mixer_forward,
                                   mamba2_mixer_backward, mamba2_mixer_state_bytes, mamba2_mixer_step,
                                   mamba2_mixer_advance};

#endif // M2RNN_MAMBA2_CUH
