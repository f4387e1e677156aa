/*
gdn.cuh: Gated DeltaNet (the G row of layers.h; ref/gdn.h gives the layer and its math) on the GPU, in chunked form.

  proj = x W_inᵀ (q | k | v | g | b | a);  q, k, v = SiLU(conv4(.));  q, k ← L2-normalized per head (in prep);
  β = sigmoid(b) (GDN[−1,1]: 2·sigmoid(b));  log α = −exp(A_log) · softplus(a + dt_bias)
  S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,  o_t = S_tᵀ q_t / sqrt(K);  RMSNorm per head ⊙ SiLU(g); W_out

The recurrence runs in chunks of L = 64 tokens (the WY / UT form, as fla's chunk_gated_delta_rule and the spec's
oracle): with G_r the cumulative log-decay inside a chunk and Γ_rs = e^{G_r − G_s},
  A = strict_tril(β_r (k_r·k_s) Γ_rs),  T = (I + A)⁻¹,  W = T (β e^G ∘ k),  U = T (β ∘ v)        (prep, parallel)
  per chunk in order: h_c = the state at its start;  Vn = U − W h_c;
                      h_{c+1} = e^{G_L} h_c + kᵀ (e^{G_L − G} ∘ Vn)                                 (state, serial)
  o = scale (e^G ∘ (q h_c) + P Vn),  P = tril(q kᵀ ∘ Γ)                                              (output, parallel)
The backward is the oracle's hand-written chunked backward (shared/tools/gdn_mamba2_oracle.py): the dstate kernel
walks the chunks in reverse for dh and dVn, the dqk kernel sums the products over V for dq, dk, dW and the decay
terms, the wy kernel takes the UT transform's backward (dT, dA, dβ, dk, dv) and the reverse cumsum for the decay.

Kernels (one CTA each, the first index fastest; a chunk slot is a chunk of some sequence, chunk_common.cuh):
  gdn_chunk_prep_kernel    (head, chunk slot)               Gc, W, U, P, T, qn, kn  8 warps (the q/k norm fused;
                                                            the recompute mode: W, U, P from the kept T and Gc)
  gdn_chunk_state_kernel   (V tile, head, sequence)         h_c, Vn, final state    8 warps, serial over chunks
                                                            (_wg: two warpgroups, wgmma + TMA)
  gdn_chunk_output_kernel  (V tile, head, chunk slot)       o                       4 warps (_wg: one warpgroup)
  gdn_chunk_dstate_kernel  (V tile, head, sequence)         dh_c (end), dVn, dS0    8 warps, reverse over chunks
                                                            (_wg: two warpgroups, wgmma + TMA)
  gdn_chunk_dqk_kernel     (K tile, head, chunk slot)       dq, dk (part), dW, dγ    8 warps, loop over V tiles
                                                            (_wg: two warpgroups, wgmma + TMA)
  gdn_chunk_wy_kernel      (head, chunk slot)               dk, dv, dβ, d(log α)    8 warps (T from prep)
  gdn_step_kernel          (V tile, head, sequence)         one decode token from the fp32 state, 8 warps
Products are tiles::warp_gemm on tiles staged in shared memory (chunk_common.cuh: cp.async for plain copies; the
serial state and dstate kernels by sm_90 bulk copies, a row an instruction, counted on mbarriers, and their chunk-start
states out the same way, where every row is whole 16-byte pieces); the state kernel loads the next chunk's W, k, U
while it computes this one's; prep writes T (fp32) for the wy kernel and for the backward's recompute
(gdn_chunk_recompute: the inversion is not redone, as fla keeps its A).
On sm_90a (an H100 / H200, bf16, K = 128 or 256, V a multiple of 8) the state, output, dstate and dqk kernels run in
a second form (the _wg kernels): their products by wgmma, their tiles moved by the tensor copy engine in swizzled
boxes, their outputs (h_c, Vn, o, dh_c, dVn, dq, dW) sent out by tensor stores; the same sums and roundings, 1.2–2.2×
faster (dev/bench/NOTES.md, GDN log 19). M2RNN_GDN_WGMMA=0 keeps the mma.sync forms everywhere.

Numeric contract (bf16 build): every product takes bf16 operands and accumulates in fp32. Rounded to bf16 (stored or
staged): the inputs q, k, v and do; the normalized q and k; T where the wy kernel multiplies by it, and the factors
T·diag(β e^G) and T·diag(β) that make W and U; W, U, P, the chunk-start states h_c, Vn and e^{G_L − G}∘Vn; in the
backward dh_c, dVn, dW, do ∘ scale e^G, dSc, dTm, Tᵀ dTm, dA ∘ Γ and β ∘ (dA ∘ Γ) (fla rounds the same kinds of
operands). fp32: the cumulative decays, T's inversion (its diagonal 16×16 blocks by fp32 substitution, the block
merges in 3xTF32 on the tensor cores, ≈ fp32, in both builds) and the kept T, the carried state and its gradient
inside the serial kernels, every row sum, dk's parts, dβ, d(log α) and the final state. The fp32 build (make
PRECISION=FP32) stages fp32 and multiplies on the FMA pipe (tiles.cuh's fp32 warp_gemm). Deterministic: no atomics,
every sum in a fixed order. The training path starts from zero state; the decode advance starts from and writes back
each sequence's fp32 state.
Sizes: K ≤ 256 (padded to a multiple of 64 in shared memory), any V (tiles of 64), any T (the last chunk masked).
Sequences: B of T tokens each, or packed variable-length sequences (cu_seqlens, T tokens in all), each restarting
from its own initial state (or zero) and ending in its own final state; a packed sequence's outputs and gradients are
bit for bit those of the same sequence run alone (test_gdn_gpu). Not yet on wgmma: prep and wy (mma.sync). Speed
against fla: dev/bench/gdn_mamba2_results.md.
*/
#ifndef M2RNN_GDN_CUH
#define M2RNN_GDN_CUH

#include "common.cuh"
#include "conv.cuh"
#include "gate.cuh"
#include "chunk_common.cuh"
#include "tiles.cuh"

typedef struct { GDN_PARAMS(VIEW_FIELD) } GDNParams;      // the layer's tensors, in the layers.h row's order
typedef struct { GDN_PARAMS(VIEW_FIELD_32) } GDNParams32; // their gradients or fp32 master weights

#define GDN_L 64     // tokens per chunk
#define GDN_T 64     // columns of a V or K tile
#define GDN_LD 72    // leading dimension of a 64-wide staged tile (+8: conflict-free ldmatrix rows)
#define GDN_MAX_K 256

__host__ __device__ inline int gdn_kp(int K) { return (K + GDN_T - 1) / GDN_T * GDN_T; } // K padded in shared memory
__host__ __device__ inline int gdn_chunks(int T) { return (T + GDN_L - 1) / GDN_L; }

// ----------------------------------------------------------------------------------------------------------------
// staging and small helpers (device)

// sG[r] = the cumulative decay G_r of the chunk's rows (r ≥ nv: the last valid row's, so padded rows decay nothing),
// from the per-token cumsum Gc written by the prep kernel (token-head rows r·H apart)
__device__ __forceinline__ void gdn_load_G(float *sG, const float *Gc, long row0, int H, int nv) {
    if (threadIdx.x < GDN_L) { sG[threadIdx.x] = Gc[row0 + (long)min((int)threadIdx.x, nv - 1) * H]; }
}
// the same for row r alone by a 4-byte cp.async (waited for with the thread's cp.async copies), where a plain load's
// round trip would hold the thread inside a serial kernel's chunk step
__device__ __forceinline__ void gdn_copy_G(float *sG, const float *Gc, long row0, int H, int nv, int r) {
    tiles::cp_async4(tiles::smem_addr(sG + r), Gc + row0 + (long)min(r, nv - 1) * H);
}

#define GDN_LDP 68 // leading dimension of a staged fp32 64-wide tile (16-byte rows, 2-way bank conflicts at most)

// 3xTF32 tensor-core products for the inversion below (fp32 in, fp32 out, error ≈ fp32 rounding): x = hi + lo with
// hi = tf32(x), lo = tf32(x − hi); a·b ≈ lo_a·hi_b + hi_a·lo_b + hi_a·hi_b (lo·lo, ≈ 2⁻²² relative, dropped)
__device__ __forceinline__ uint32_t gdn_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ void gdn_mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// a warp's d (16×8, the m16n8 accumulator layout: rows g, g + 8, columns 2t, 2t + 1) += A (16×K) B (K×8), both fp32
// row-major in shared memory (leading dimensions lda, ldb), K a multiple of 8
__device__ __forceinline__ void gdn_warp_mma_f32(float (&d)[4], const float *A, int lda, const float *B, int ldb,
                                                 int K) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int k0 = 0; k0 < K; k0 += 8) {
        const float a[4] = {A[g * lda + k0 + t], A[(g + 8) * lda + k0 + t], A[g * lda + k0 + t + 4],
                            A[(g + 8) * lda + k0 + t + 4]};
        const float b[2] = {B[(k0 + t) * ldb + g], B[(k0 + t + 4) * ldb + g]};
        uint32_t ah[4], al[4], bh[2], bl[2];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            ah[i] = gdn_tf32(a[i]);
            al[i] = gdn_tf32(a[i] - __uint_as_float(ah[i]));
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            bh[i] = gdn_tf32(b[i]);
            bl[i] = gdn_tf32(b[i] - __uint_as_float(bh[i]));
        }
        gdn_mma_tf32(d, al, bh[0], bh[1]);
        gdn_mma_tf32(d, ah, bl[0], bl[1]);
        gdn_mma_tf32(d, ah, bh[0], bh[1]);
    }
}
// dst (16×8 at row stride ld) = s·d, d in the m16n8 accumulator layout
__device__ __forceinline__ void gdn_put_acc(float *dst, int ld, const float (&d)[4], float s) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    dst[g * ld + 2 * t] = s * d[0];
    dst[g * ld + 2 * t + 1] = s * d[1];
    dst[(g + 8) * ld + 2 * t] = s * d[2];
    dst[(g + 8) * ld + 2 * t + 1] = s * d[3];
}

// sT (64×65 fp32) = (I + A)⁻¹ for A (64×65 fp32) strictly lower triangular, by 16×16 blocks (8 warps): the
// diagonal blocks by forward substitution, a lane a column held in registers (T[i][c] = δ_ic − Σ_{j < i} A[i][j]
// T[j][c], the A row read as a broadcast); then, as fla's solve_tril merges blocks, the two 32×32 diagonal blocks
// (T_10 = −T_11 A_10 T_00 for the block pairs (0, 1) and (2, 3)) and the 32×32 block below them
// (T_hi,lo = −T_hi (A_hi,lo T_lo)), each product on the tensor cores in 3xTF32 (≈ fp32: fla uses plain TF32 here).
// The first version (the block rows by scalar loops, 7 barriers) cost 0.23 of the 0.74 ms prep kernel at H=16.
// scratch: 32×33 fp32. Ends synchronized.
__device__ __forceinline__ void gdn_unit_lower_inverse(float *sT, const float *sA, float *scratch) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (w < 2) { // warp w, half lane >> 4: diagonal block 2w + (lane >> 4), column lane & 15, the column in registers
        const int base = 16 * (2 * w + (lane >> 4)), c = lane & 15;
        float t[16];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            float x = i == c ? 1.0f : 0.0f;
#pragma unroll
            for (int j = 0; j < i; j++) { x -= sA[(base + i) * 65 + base + j] * t[j]; } // t[j < c] = 0
            t[i] = i < c ? 0.0f : x;
        }
#pragma unroll
        for (int i = 0; i < 16; i++) { sT[(base + i) * 65 + base + c] = t[i]; }
    }
    for (int e = threadIdx.x; e < GDN_L * GDN_L; e += blockDim.x) { // the blocks above the diagonal
        const int r = e >> 6, c = e & 63;
        if ((c >> 4) > (r >> 4)) { sT[r * 65 + c] = 0.0f; }
    }
    __syncthreads();
    constexpr int LX = 33;
    if (w < 4) { // the pairs p = 0, 1 (blocks 2p, 2p + 1): Y = A_{2p+1,2p} T_{2p,2p}, warp w its n8 tile w & 1
        const int p = w >> 1, o = 32 * p, n = 8 * (w & 1);
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        gdn_warp_mma_f32(d, sA + (o + 16) * 65 + o, 65, sT + o * 65 + o + n, 65, 16);
        gdn_put_acc(scratch + 16 * p * LX + n, LX, d, 1.0f);
    }
    __syncthreads();
    if (w < 4) { // T_{2p+1,2p} = −T_{2p+1,2p+1} Y
        const int p = w >> 1, o = 32 * p, n = 8 * (w & 1);
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        gdn_warp_mma_f32(d, sT + (o + 16) * 65 + o + 16, 65, scratch + 16 * p * LX + n, LX, 16);
        gdn_put_acc(sT + (o + 16) * 65 + o + n, 65, d, -1.0f);
    }
    __syncthreads();
    { // X = A[32:64, 0:32] T[0:32, 0:32]: warp w the rows 16·(w >> 2), the n8 tile w & 3
        const int m = 16 * (w >> 2), n = 8 * (w & 3);
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        gdn_warp_mma_f32(d, sA + (32 + m) * 65, 65, sT + n, 65, 32);
        gdn_put_acc(scratch + m * LX + n, LX, d, 1.0f);
    }
    __syncthreads();
    { // T[32:64, 0:32] = −T[32:64, 32:64] X
        const int m = 16 * (w >> 2), n = 8 * (w & 3);
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        gdn_warp_mma_f32(d, sT + (32 + m) * 65 + 32, 65, scratch + n, LX, 32);
        gdn_put_acc(sT + (32 + m) * 65 + n, 65, d, -1.0f);
    }
    __syncthreads();
}

// the raw k·kᵀ ∘ Γ of a chunk (strictly lower, fp32) into sKKG and, when sA != NULL, A = β_r (k·kᵀ ∘ Γ) into sA, from
// the staged k (64 × Kp), β and G. 4 or 8 warps: warp w the rows 16·(w & 3), the column halves from w >> 2 on.
__device__ __forceinline__ void gdn_chunk_kkg(float *sA, float *sKKG, const floatX *sk, int ldk, int Kp,
                                              const float *sb, const float *sG) {
    const int w = threadIdx.x >> 5, mt = w & 3;
    for (int half = w >> 2; half < 2; half += blockDim.x / 128) {
        float acc[4][4] = {};
        tiles::warp_gemm<4, false, true>(acc, sk + 16 * mt * ldk, ldk, sk + 32 * half * ldk, ldk, Kp);
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = 16 * mt + tiles::acc_row(i), s = 32 * half + tiles::acc_col(j, i);
                const float kkg = s < r ? acc[j][i] * expf(sG[r] - sG[s]) : 0.0f;
                if (sA != NULL) { sA[r * 65 + s] = sb[r] * kkg; }
                if (sKKG != NULL) { sKKG[r * 65 + s] = kkg; }
            }
        }
    }
}

// the per-head L2 norm's one arithmetic (l2norm_forward_kernel and the prep kernel's fused norm): a row's 16-byte
// pieces, piece p on lane p mod 32, each piece's squares summed in order, then the warp's butterfly sum
#define GDN_L2_PIECE (16 / (int)sizeof(floatX)) // elements of a 16-byte piece
__device__ __forceinline__ float l2norm_piece_ss(uint4 raw) {
    const floatX *v = (const floatX *)&raw;
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < GDN_L2_PIECE; e++) { ss += (float)v[e] * (float)v[e]; }
    return ss;
}
__device__ __forceinline__ float l2norm_rinv(float ss) { return rsqrtf(ss + 1e-6f); } // 1/sqrt(Σx² + 1e-6)
__device__ __forceinline__ uint4 l2norm_piece_scale(uint4 raw, float r) {
    const floatX *v = (const floatX *)&raw;
    __align__(16) floatX o[GDN_L2_PIECE];
#pragma unroll
    for (int e = 0; e < GDN_L2_PIECE; e++) { o[e] = (floatX)((float)v[e] * r); }
    return *(const uint4 *)o;
}

// ----------------------------------------------------------------------------------------------------------------
// forward

// the q/k L2 norm fused into the prep kernel: q and k arrive raw (views of token stride `stride`, the conv's output)
// and the prep kernel writes their normalized copies qn, kn (tok,H,K), which the later kernels and the backward read,
// and the 1/norms rq, rk (tok,H): one pass over q and k instead of a norm pass and a second read
typedef struct {
    int stride;
    floatX *qn, *kn;
    float *rq, *rk;
} GDNQKNorm;

// the prep kernel's fused norm: the staged rows of q (sq) and k (sk), 64 each (Kp wide, leading dimension ldk,
// zero-padded), normalized in place and the chunk's valid rows (r < nv) written out. A row takes a group of lpr lanes
// (its pieces rounded up to a power of two, ≥ 8), 32 / lpr rows a warp at once; the group's butterfly over lpr lanes
// adds what l2norm_forward_kernel's 32-lane one does (the lanes past the row's pieces hold zeros): the same bits.
__device__ __forceinline__ void gdn_prep_norm(floatX *sq, floatX *sk, int ldk, int Kp, const GDNQKNorm &nm, long row0,
                                              int H, int K, int nv) {
    constexpr int E = GDN_L2_PIECE, PL = (GDN_MAX_K / E + WARP_SIZE - 1) / WARP_SIZE; // pieces a lane at most
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, pieces = Kp / E;
    const int lpr = pieces > 16 ? 32 : pieces > 8 ? 16 : 8, rpw = WARP_SIZE / lpr, sl = lane % lpr;
    const bool vec = K % E == 0 && ((uintptr_t)nm.qn & 15) == 0 && ((uintptr_t)nm.kn & 15) == 0;
    for (int i = w * rpw + lane / lpr; i < 2 * GDN_L; i += (blockDim.x >> 5) * rpw) { // (2·64 a multiple of rows a pass)
        const int r = i % GDN_L;
        floatX *row = (i < GDN_L ? sq : sk) + r * ldk;
        uint4 raw[PL];
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < PL; j++) {
            const int p = sl + lpr * j;
            raw[j] = p < pieces ? *(const uint4 *)(row + p * E) : make_uint4(0u, 0u, 0u, 0u);
            ss += l2norm_piece_ss(raw[j]);
        }
        for (int off = lpr >> 1; off > 0; off >>= 1) { ss += __shfl_xor_sync(0xffffffffu, ss, off); }
        const float rinv = l2norm_rinv(ss);
        floatX *out = (i < GDN_L ? nm.qn : nm.kn) + (row0 + (long)r * H) * K;
        if (sl == 0 && r < nv) { (i < GDN_L ? nm.rq : nm.rk)[row0 + (long)r * H] = rinv; }
#pragma unroll
        for (int j = 0; j < PL; j++) {
            const int p = sl + lpr * j;
            if (p >= pieces) { continue; }
            const uint4 y = l2norm_piece_scale(raw[j], rinv);
            *(uint4 *)(row + p * E) = y;
            if (r >= nv || p * E >= K) { continue; }
            if (vec) {
                *(uint4 *)(out + p * E) = y;
            } else {
                const floatX *ye = (const floatX *)&y;
#pragma unroll
                for (int e = 0; e < E; e++) {
                    if (p * E + e < K) { out[p * E + e] = ye[e]; }
                }
            }
        }
    }
}

// the prep kernel's area for A (64×65 fp32) and then T's scaled copy (64 × GDN_LD floatX), bytes
__host__ __device__ constexpr size_t gdn_prep_area_a() {
    return GDN_L * 65 * sizeof(float) > GDN_L * GDN_LD * sizeof(floatX) ? GDN_L * 65 * sizeof(float)
                                                                         : GDN_L * GDN_LD * sizeof(floatX);
}

// grid (slots·H), 256 threads (x = slot·H + h). Gc (tok,H) fp32 the in-chunk cumsum of g; W (tok,H,K), U (tok,H,V);
// Pm (slots,H,64,64) P = tril(q kᵀ ∘ Γ); Tm (slots,H,64,64) fp32 T = (I + A)⁻¹, which the wy kernel reads back and the
// backward's recompute starts from (fp32, so that the recompute is bit for bit this forward and W's and U's factors
// carry one rounding, not two: bf16 T measured past the trainer test's bound on an M²RNN layer above a GDN layer). q, k
// (tok,H,K) normalized, or raw views (token stride nm.stride) when nm.qn != NULL: normalized here (gdn_prep_norm). v a
// view (token stride v_stride); beta, g (tok,H) fp32 (g = log α). from_t: the backward's recompute, Tm and Gc inputs
// (the forward's), no inversion: W, U and P again. Warp w: rows 16·(w & 3), column half w >> 2.
__global__ void __launch_bounds__(256) gdn_chunk_prep_kernel(floatX *W, floatX *U, floatX *Pm, float *Tm, float *Gc,
                                                             GDNQKNorm nm, const floatX *q, const floatX *k,
                                                             const floatX *v, int v_stride, const float *beta,
                                                             const float *g, bool from_t, const int *cu_seqlens, int B,
                                                             int T, int H, int K, int V) {
    extern __shared__ __align__(16) char gdn_smem[];
    int b, c;
    ChunkSeq seq;
    const int h = blockIdx.x % H;
    if (!chunk_at_slot<GDN_L>(cu_seqlens, B, T, blockIdx.x / H, &b, &c, &seq)) { return; }
    const int t0 = c * GDN_L, nv = min(GDN_L, seq.len - t0);
    const int Kp = gdn_kp(K), ldk = Kp + 8, w = threadIdx.x >> 5, mt = w & 3, half = w >> 2;
    const long row0 = (seq.tok0 + t0) * H + h; // the (b, t0, h) token-head row
    const long crow = ((seq.cslot + c) * H + h) * GDN_L * GDN_L; // this chunk's 64×64 in Pm, Tm
    // shared memory (gdn_prep_smem): k, later v's odd tiles | q, later the inverse's scratch and v's even tiles | A,
    // later T diag(β e^G) | T (fp32; the recompute: T diag(β)) | β, G, row scales. (q is read by P alone, A by the
    // inversion alone and k by P, A and W, each before its area is reused: three CTAs an SM at K = 128.)
    floatX *sk = (floatX *)gdn_smem, *sq = sk + GDN_L * ldk, *sv = sq;
    float *sA = (float *)(sq + GDN_L * ldk);
    floatX *sTx = (floatX *)sA;
    float *sT = (float *)((char *)sA + gdn_prep_area_a()), *sb = (float *)((char *)sT + gdn_prep_area_a());
    float *sG = sb + GDN_L;
    floatX *sTu = from_t ? (floatX *)sT : sTx; // U's factor T diag(β): its own area in the recompute, over W's after W
    float *srs = sG + GDN_L;
    const bool norm = nm.qn != NULL;
    const long qk_row = norm ? (seq.tok0 + t0) * nm.stride + (long)h * K : row0 * K;
    const long qk_stride = norm ? nm.stride : (long)H * K;
    chunk_stage<false>(sk, ldk, k + qk_row, qk_stride, nv, K, GDN_L, Kp, (const float *)NULL);
    chunk_stage<false>(sq, ldk, q + qk_row, qk_stride, nv, K, GDN_L, Kp, (const float *)NULL);
    if (threadIdx.x < GDN_L) {
        const int r = threadIdx.x;
        sb[r] = r < nv ? beta[row0 + (long)r * H] : 0.0f;
        srs[r] = !from_t && r < nv ? g[row0 + (long)r * H] : 0.0f;
    }
    float4 tr[GDN_L * GDN_L / 4 / 256]; // the recompute: this thread's pieces of the kept T (4 floats at 4·(x + 256u))
    if (from_t) {
        gdn_load_G(sG, Gc, row0, H, nv);
#pragma unroll
        for (int u = 0; u < GDN_L * GDN_L / 4 / 256; u++) {
            const int e = 4 * ((int)threadIdx.x + 256 * u);
            tr[u] = e < GDN_L * GDN_L ? __ldg((const float4 *)(Tm + crow + e)) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    chunk_sync();
    if (from_t) { // W's and U's factors straight from the kept T, with the forward's arithmetic (srs = β e^G below)
#pragma unroll
        for (int u = 0; u < GDN_L * GDN_L / 4 / 256; u++) {
            const int e = 4 * ((int)threadIdx.x + 256 * u), r = e >> 6, c = e & 63;
            const float t[4] = {tr[u].x, tr[u].y, tr[u].z, tr[u].w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                sTx[r * GDN_LD + c + j] = (floatX)(t[j] * (sb[c + j] * expf(sG[c + j])));
                sTu[r * GDN_LD + c + j] = (floatX)(t[j] * sb[c + j]);
            }
        }
    }
    if (!from_t && threadIdx.x < GDN_L) { // the in-chunk cumsum: a scan in each of two warps, the second offset next
        const int r = threadIdx.x, lane = r & 31;
        float G = srs[r];
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, G, d);
            if (lane >= d) { G += y; }
        }
        sG[r] = G;
    }
    if (norm) { gdn_prep_norm(sq, sk, ldk, Kp, nm, row0, H, K, nv); }
    chunk_sync();
    if (!from_t) {
        if (threadIdx.x >= 32 && threadIdx.x < GDN_L) { sG[threadIdx.x] += sG[31]; }
        chunk_sync();
        if (threadIdx.x < nv) { Gc[row0 + (long)threadIdx.x * H] = sG[threadIdx.x]; }
    }
    { // P = tril(q kᵀ ∘ Γ)
        float acc[4][4] = {};
        tiles::warp_gemm<4, false, true>(acc, sq + 16 * mt * ldk, ldk, sk + 32 * half * ldk, ldk, Kp);
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int i = 0; i < 4; i += 2) {
                const int r = 16 * mt + tiles::acc_row(i), s = 32 * half + tiles::acc_col(j, i);
                chunk_put2(Pm + crow + r * GDN_L + s, s <= r ? acc[j][i] * expf(sG[r] - sG[s]) : 0.0f,
                         s + 1 <= r ? acc[j][i + 1] * expf(sG[r] - sG[s + 1]) : 0.0f, true, true);
            }
        }
    }
    if (!from_t) {
        gdn_chunk_kkg(sA, NULL, sk, ldk, Kp, sb, sG);
        chunk_sync();
        gdn_unit_lower_inverse(sT, sA, (float *)sv); // sv (over q: P is done): free until U
        if (threadIdx.x < GDN_L) { srs[threadIdx.x] = sb[threadIdx.x] * expf(sG[threadIdx.x]); }
        chunk_sync();
        for (int i = threadIdx.x; i < GDN_L * GDN_L; i += blockDim.x) { // T out; T diag(β e^G): W's factor
            const float t = sT[(i >> 6) * 65 + (i & 63)];
            Tm[crow + i] = t;
            sTx[(i >> 6) * GDN_LD + (i & 63)] = (floatX)(t * srs[i & 63]);
        }
    }
    // v's 64-wide tiles through two areas, q's (free once P and the inversion are done) and k's (once W is): tile i
    // in area i & 1, tile i + 2 issued when U's product of tile i is done, so the copies land under the products
    auto va = [&](int i) { return (i & 1) ? sk : sv; };
    const int VT = CEIL_DIV(V, GDN_T);
    auto stage_v = [&](int i) {
        chunk_stage<false>(va(i), GDN_LD, v + (seq.tok0 + t0) * v_stride + (long)h * V + i * GDN_T, v_stride, nv,
                           V - i * GDN_T, GDN_L, GDN_T, (const float *)NULL);
        tiles::cp_async_commit();
    };
    __syncthreads(); // P's and the inversion's readers of q's area are done; W's factor is whole
    stage_v(0);
    for (int kb = 0; kb < Kp; kb += GDN_T) { // W = T (β e^G ∘ k) = (T diag(β e^G)) k
        float acc[4][4] = {};
        tiles::warp_gemm<4, false, false>(acc, sTx + 16 * mt * GDN_LD, GDN_LD, sk + kb + 32 * half, ldk, GDN_L);
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int i = 0; i < 4; i += 2) {
                const int r = 16 * mt + tiles::acc_row(i), col = kb + 32 * half + tiles::acc_col(j, i);
                chunk_put2(W + (row0 + (long)r * H) * K + col, acc[j][i], acc[j][i + 1], r < nv && col < K,
                         r < nv && col + 1 < K);
            }
        }
    }
    __syncthreads(); // W's readers of k and of its factor are done
    if (!from_t) {
        for (int i = threadIdx.x; i < GDN_L * GDN_L; i += blockDim.x) { // T diag(β): U's factor, over W's
            sTu[(i >> 6) * GDN_LD + (i & 63)] = (floatX)(sT[(i >> 6) * 65 + (i & 63)] * sb[i & 63]);
        }
    }
    if (VT > 1) { stage_v(1); }
    for (int i = 0; i < VT; i++) { // U = T (β ∘ v) = (T diag(β)) v
        const int vb = i * GDN_T;
        if (i + 1 < VT) { tiles::cp_async_wait<1>(); } else { tiles::cp_async_wait<0>(); }
        __syncthreads(); // tile i landed (and U's factor is whole)
        float acc[4][4] = {};
        tiles::warp_gemm<4, false, false>(acc, sTu + 16 * mt * GDN_LD, GDN_LD, va(i) + 32 * half, GDN_LD, GDN_L);
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int i = 0; i < 4; i += 2) {
                const int r = 16 * mt + tiles::acc_row(i), col = vb + 32 * half + tiles::acc_col(j, i);
                chunk_put2(U + (row0 + (long)r * H) * V + col, acc[j][i], acc[j][i + 1], r < nv && col < V,
                         r < nv && col + 1 < V);
            }
        }
        if (i + 2 < VT) {
            __syncthreads(); // tile i's readers are done: its area takes tile i + 2
            stage_v(i + 2);
        }
    }
}
static size_t gdn_prep_smem(int K) { // (the q area, GDN_L × ldk, also holds v's 64-wide tile: ldk ≥ GDN_LD)
    const int ldk = gdn_kp(K) + 8;
    return 2 * (size_t)GDN_L * ldk * sizeof(floatX) + 2 * gdn_prep_area_a() + 3 * GDN_L * sizeof(float);
}

// the state tile sS (Kp × 64, staged) into dst rows (K × V, row stride V) at column vb: 16-byte stores where whole
__device__ __forceinline__ void gdn_store_state(floatX *dst, const floatX *sS, int K, int V, int vb) {
    constexpr int VEC = 16 / sizeof(floatX);
    const bool vec = (V % VEC) == 0 && ((uintptr_t)dst & 15) == 0;
    for (int i = threadIdx.x; i < K * (GDN_T / VEC); i += blockDim.x) {
        const int r = i / (GDN_T / VEC), c = (i % (GDN_T / VEC)) * VEC;
        if (vec && vb + c + VEC <= V) {
            *(uint4 *)(dst + (long)r * V + vb + c) = *(const uint4 *)(sS + r * GDN_LD + c);
        } else {
            for (int e = 0; e < VEC && vb + c + e < V; e++) { dst[(long)r * V + vb + c + e] = sS[r * GDN_LD + c + e]; }
        }
    }
}

// the serial kernels' bulk row copies (tiles.cuh), where every row they copy is whole 16-byte pieces (else cp.async):
// a row of n elements into shared memory counted on the mbarrier mb, or zeros for a row past the sequence's end (a
// last chunk); one arrival on mb either way
__device__ __forceinline__ void gdn_bulk_row(floatX *dst, const floatX *src, int n, bool valid, uint32_t mb) {
    if (valid) {
        tiles::mbar_arrive_tx(mb, n * (uint32_t)sizeof(floatX));
        tiles::bulk_g2s(tiles::smem_addr(dst), src, n * (uint32_t)sizeof(floatX), mb);
    } else {
        for (int e = 0; e < n; e++) { dst[e] = (floatX)0.0f; }
        tiles::fence_proxy_async(); // (a later chunk's bulk copy lands in this row)
        tiles::mbar_arrive(mb);
    }
}
// (the launchers' choice of the kernels' BULK instantiation; V whole pieces makes every V tile's columns whole too)
static inline bool gdn_rows_bulk(int K, int V, uintptr_t ptrs) {
    constexpr int SZ = (int)sizeof(floatX);
    return (K * SZ) % 16 == 0 && (V * SZ) % 16 == 0 && (ptrs & 15) == 0;
}
// columns c0..c1 − 1 of 64 rows (leading dimension ld), which no bulk row copy writes: zero once
__device__ __forceinline__ void gdn_zero_cols(floatX *t, int ld, int c0, int c1) {
    for (int i = threadIdx.x; i < GDN_L; i += blockDim.x) {
        for (int e = c0; e < c1; e++) { t[i * ld + e] = (floatX)0.0f; }
    }
}
// the state tile sS (Kp × 64, staged) into dst rows (K × V, row stride V) at column vb, cu columns: a bulk copy a row
// (threads < K), after the fence_proxy_async and the barrier that follow sS's stores; bulk_wait_read before sS is
// written again
__device__ __forceinline__ void gdn_bulk_store_state(floatX *dst, const floatX *sS, int K, int V, int vb, int cu) {
    if (threadIdx.x < K) {
        tiles::bulk_s2g(dst + (long)threadIdx.x * V + vb, tiles::smem_addr(sS + threadIdx.x * GDN_LD),
                        cu * (uint32_t)sizeof(floatX));
        tiles::bulk_commit();
    }
}

// the serial kernels' buffers: two sets in the bf16 build (the next chunk's tiles load while this one computes), one
// in the fp32 build (its tiles are twice the size)
#define GDN_NBUF (FLOATX_IS_FP32 ? 1 : 2)

// grid (VT, H, B), 256 threads: the state's V tile vb..vb+63 walks sequence b's chunks. hst (slots,H,K,V) the state
// at each chunk's start; vn (tok,H,V) = U − W h_c. S0 / S_final: sequence b's (H,K,V) fp32 state at b·stride floats,
// or NULL
template <int MR, bool BULK>
__global__ void __launch_bounds__(256) gdn_chunk_state_kernel(floatX *hst, floatX *vn, float *S_final, long sf_stride,
                                                              const float *S0, long s0_stride, const floatX *W,
                                                              const floatX *U, const floatX *k, const float *Gc,
                                                              const int *cu_seqlens, int T, int H, int K, int V) {
    extern __shared__ __align__(16) char gdn_smem[];
    const int vb = blockIdx.x * GDN_T, h = blockIdx.y, b = blockIdx.z;
    const ChunkSeq seq = chunk_seq<GDN_L>(cu_seqlens, b, T);
    const int NC = seq.nc;
    const int Kp = gdn_kp(K), ldk = Kp + 8, w = threadIdx.x >> 5, MT = Kp / 16;
    const int BUF = 2 * GDN_L * ldk + GDN_L * GDN_LD; // one buffer: W, k, U
    floatX *sS = (floatX *)gdn_smem, *sbuf = sS + Kp * GDN_LD;
    float *sGb = (float *)(sbuf + GDN_NBUF * BUF); // (GDN_NBUF, 64)
    // the tiles' rows by bulk copies, one instruction a row (the copies of a buffer counted on its mbarrier), and the
    // chunk-start state out the same way, where every row is whole 16-byte pieces; otherwise chunk_stage's cp.async
    const int cu = min(GDN_T, V - vb); // the V tile's columns
    constexpr bool bulk = BULK;
    const uint32_t mbar = tiles::smem_addr(sGb + GDN_NBUF * GDN_L); // GDN_NBUF mbarriers of 8 bytes
    if (bulk) {
        if (threadIdx.x == 0) {
            for (int i = 0; i < GDN_NBUF; i++) { tiles::mbar_init(mbar + 8 * i, blockDim.x); }
            tiles::mbar_init_fence();
        }
        for (int i = 0; i < GDN_NBUF; i++) {
            gdn_zero_cols(sbuf + i * BUF, ldk, K, Kp); // W
            gdn_zero_cols(sbuf + i * BUF + GDN_L * ldk, ldk, K, Kp); // k
            gdn_zero_cols(sbuf + i * BUF + 2 * GDN_L * ldk, GDN_LD, cu, GDN_T); // U
        }
        __syncthreads();
    }
    float S[MR][8][4]; // rows 16·(w + 8m) of the state's K, the tile's 64 columns (MR = 1 covers K ≤ 128)
#pragma unroll
    for (int m = 0; m < MR; m++) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = 16 * (w + 8 * m) + tiles::acc_row(i), col = vb + tiles::acc_col(j, i);
                S[m][j][i] = (S0 != NULL && r < K && col < V)
                                 ? S0[(long)b * s0_stride + ((long)h * K + r) * V + col] : 0.0f;
            }
        }
    }
    auto stage_chunk = [&](int c, int buf) { // issue the chunk's copies (bulk or cp.async) and its decays
        const int t0 = c * GDN_L, nv = min(GDN_L, seq.len - t0);
        const long row0 = (seq.tok0 + t0) * H + h;
        floatX *sW = sbuf + buf * BUF, *sk = sW + GDN_L * ldk, *sU = sk + GDN_L * ldk;
        if (bulk) { // thread t: row t & 63 of W, k, U (t < 192), or that row's decay (t ≥ 192)
            const int r = threadIdx.x & (GDN_L - 1), which = threadIdx.x >> 6;
            const uint32_t mb = mbar + 8 * buf;
            const long tok = row0 + (long)r * H;
            if (which == 0) {
                gdn_bulk_row(sW + r * ldk, W + tok * K, K, r < nv, mb);
            } else if (which == 1) {
                gdn_bulk_row(sk + r * ldk, k + tok * K, K, r < nv, mb);
            } else if (which == 2) {
                gdn_bulk_row(sU + r * GDN_LD, U + tok * V + vb, cu, r < nv, mb);
            } else {
                gdn_copy_G(sGb + buf * GDN_L, Gc, row0, H, nv, r);
                tiles::mbar_arrive(mb);
            }
            return;
        }
        if (threadIdx.x < GDN_L) { gdn_copy_G(sGb + buf * GDN_L, Gc, row0, H, nv, threadIdx.x); }
        chunk_stage(sW, ldk, W + row0 * K, (long)H * K, nv, K, GDN_L, Kp, (const float *)NULL);
        chunk_stage(sk, ldk, k + row0 * K, (long)H * K, nv, K, GDN_L, Kp, (const float *)NULL);
        chunk_stage(sU, GDN_LD, U + row0 * V + vb, (long)H * V, nv, V - vb, GDN_L, GDN_T, (const float *)NULL);
    };
    if (GDN_NBUF == 2 && NC > 0) { stage_chunk(0, 0); }
    for (int c = 0; c < NC; c++) {
        const int buf = c % GDN_NBUF, t0 = c * GDN_L, nv = min(GDN_L, seq.len - t0);
        const long row0 = (seq.tok0 + t0) * H + h;
        floatX *sW = sbuf + buf * BUF, *sk = sW + GDN_L * ldk, *sU = sk + GDN_L * ldk;
        floatX *sVn = sU; // e^{G_L − G} ∘ Vn over U, in place: each thread writes the elements it alone read
        const float *sG = sGb + buf * GDN_L;
        if (GDN_NBUF == 1) { stage_chunk(c, 0); }
#pragma unroll
        for (int m = 0; m < MR; m++) {
            if (w + 8 * m >= MT) { continue; }
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int i = 0; i < 4; i += 2) {
                    chunk_sput2(sS + (16 * (w + 8 * m) + tiles::acc_row(i)) * GDN_LD + tiles::acc_col(j, i),
                                S[m][j][i], S[m][j][i + 1]);
                }
            }
        }
        if (bulk) { tiles::fence_proxy_async(); } // sS's stores before the bulk copy that reads it
        chunk_sync(); // chunk c's copies (issued last iteration) have landed, sS is whole
        if (bulk) { tiles::mbar_wait(mbar + 8 * buf, (c / GDN_NBUF) & 1); }
        if (GDN_NBUF == 2 && c + 1 < NC) { stage_chunk(c + 1, buf ^ 1); } // lands during this chunk's products
        floatX *hc = hst + ((seq.cslot + c) * H + h) * K * V;
        if (bulk) {
            gdn_bulk_store_state(hc, sS, K, V, vb, cu);
        } else {
            gdn_store_state(hc, sS, K, V, vb);
        }
        { // Vn = U − W h_c: warp w rows 16·(w & 3), columns 32·(w >> 2)
            const int mt = w & 3, half = w >> 2;
            float acc[4][4] = {};
            tiles::warp_gemm<4, false, false>(acc, sW + 16 * mt * ldk, ldk, sS + 32 * half, GDN_LD, Kp);
            const float GL = sG[GDN_L - 1];
#pragma unroll
            for (int i = 0; i < 4; i += 2) { // a thread's two rows: their decays and output rows once
                const int r = 16 * mt + tiles::acc_row(i);
                const float dec = expf(GL - sG[r]);
                floatX *vrow = vn + (row0 + (long)r * H) * V + vb;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int col = 32 * half + tiles::acc_col(j, i);
                    const floatX x0 = (floatX)((float)sU[r * GDN_LD + col] - acc[j][i]);
                    const floatX x1 = (floatX)((float)sU[r * GDN_LD + col + 1] - acc[j][i + 1]);
                    chunk_put2(vrow + col, (float)x0, (float)x1, r < nv && vb + col < V, r < nv && vb + col + 1 < V);
                    chunk_sput2(sVn + r * GDN_LD + col, (float)x0 * dec, (float)x1 * dec);
                }
            }
        }
        __syncthreads(); // (not chunk_sync: the prefetch stays in flight)
        const float decay = expf(sG[GDN_L - 1]); // h_{c+1} = e^{G_L} h_c + kᵀ (e^{G_L − G} ∘ Vn)
#pragma unroll
        for (int m = 0; m < MR; m++) {
            if (w + 8 * m >= MT) { continue; }
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int i = 0; i < 4; i++) { S[m][j][i] *= decay; }
            }
            tiles::warp_gemm<8, true, false>(S[m], sk + 16 * (w + 8 * m), ldk, sVn, GDN_LD, GDN_L);
        }
        if (bulk) { // sVn's stores before the bulk copy that overwrites them; sS read before it is rewritten
            tiles::fence_proxy_async();
            if (threadIdx.x < K) { tiles::bulk_wait_read(); }
        }
        __syncthreads();
    }
    if (bulk && threadIdx.x < K) { tiles::bulk_wait(); }
    if (S_final != NULL) {
#pragma unroll
        for (int m = 0; m < MR; m++) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int r = 16 * (w + 8 * m) + tiles::acc_row(i), col = vb + tiles::acc_col(j, i);
                    if (r < K && col < V) { S_final[(long)b * sf_stride + ((long)h * K + r) * V + col] = S[m][j][i]; }
                }
            }
        }
    }
}
static size_t gdn_state_smem(int K) { // (K = 128 in bf16: 104.5 KB, two CTAs an SM)
    const int Kp = gdn_kp(K), ldk = Kp + 8;
    return ((size_t)Kp * GDN_LD + GDN_NBUF * (2 * (size_t)GDN_L * ldk + (size_t)GDN_L * GDN_LD)) * sizeof(floatX) +
           GDN_NBUF * (GDN_L * sizeof(float) + sizeof(uint64_t)); // (the decays, the bulk copies' mbarriers)
}

#if !FLOATX_IS_FP32
#define GDN_WG_TILE 8192 // bytes of a 64 × 64 bf16 tile

// the sm_90a serial kernels' state (or its gradient) in two warpgroups' m64n64 accumulators: S[m][4j + i] is row
// 64(g + 2m) + 16·(warp in the warpgroup) + acc_row(i), column vb + acc_col(j, i) of the K × V tile (g: the warpgroup)
__device__ __forceinline__ int gdn_wg_row(int m, int e) {
    return 64 * ((int)(threadIdx.x >> 7) + 2 * m) + 16 * (int)((threadIdx.x >> 5) & 3) + tiles::acc_row(e & 3);
}
// S from (H,K,V) fp32 at src (a sequence's state, or NULL: zero)
template <int MI>
__device__ __forceinline__ void gdn_wg_state_in(float (&S)[MI][32], const float *src, int h, int K, int V, int vb) {
#pragma unroll
    for (int m = 0; m < MI; m++) {
#pragma unroll
        for (int e = 0; e < 32; e++) {
            const int r = gdn_wg_row(m, e), col = vb + tiles::acc_col(e >> 2, e & 3);
            S[m][e] = (src != NULL && col < V) ? src[((long)h * K + r) * V + col] : 0.0f;
        }
    }
}
template <int MI>
__device__ __forceinline__ void gdn_wg_state_out(float *dst, const float (&S)[MI][32], int h, int K, int V, int vb) {
#pragma unroll
    for (int m = 0; m < MI; m++) {
#pragma unroll
        for (int e = 0; e < 32; e++) {
            const int r = gdn_wg_row(m, e), col = vb + tiles::acc_col(e >> 2, e & 3);
            if (col < V) { dst[((long)h * K + r) * V + col] = S[m][e]; }
        }
    }
}
// S ← decay · S, then the wgmma fence (the accumulators pinned before it): the update's products accumulate onto S
template <int MI> __device__ __forceinline__ void gdn_wg_decay(float (&S)[MI][32], float decay) {
#pragma unroll
    for (int m = 0; m < MI; m++) {
#pragma unroll
        for (int e = 0; e < 32; e++) { S[m][e] *= decay; }
        tiles::wgmma_pin(S[m]);
    }
    tiles::wgmma_fence();
}
// bf16(S) into its two 64B-swizzled halves of 32 columns (K rows × 64 bytes each) at sS
template <int MI> __device__ __forceinline__ void gdn_wg_state_put(char *sS, const float (&S)[MI][32], int K) {
#pragma unroll
    for (int m = 0; m < MI; m++) {
#pragma unroll
        for (int e = 0; e < 32; e += 2) {
            const int r = gdn_wg_row(m, e), n = tiles::acc_col(e >> 2, e & 3);
            *(uint32_t *)(sS + (n >> 5) * (K * 64) + tiles::swz64(r, 2 * (n & 31))) =
                tiles::pack_bf16x2(S[m][e], S[m][e + 1]);
        }
    }
}
// The state kernel on sm_90a (bf16 build, K = 128·MI, V a multiple of 8, 16-byte aligned tensors): the same recurrence
// and outputs as gdn_chunk_state_kernel, its two products by wgmma (tiles.cuh) and its tiles moved by the tensor copy
// engine: W, k (64 tokens × 64 columns a box) and U (64 × the V tile) in 128B-swizzled tiles, one instruction a box
// where the row copies above take one a row; the chunk-start state out of two 64B-swizzled halves of 32 columns, one
// instruction a half, and a whole chunk's Vn out of the U tile it replaces, one instruction (a last, partial chunk
// stores its rows from registers: the box's other rows belong to the next sequence). Warpgroup g (threads
// 128g..128g+127): Vn's columns 32g..32g+31 (m64n32, K/16 steps, A = W K-major, B = h_c N-major) and the state's rows
// 64(g + 2m), m < MI (m64n64, 4 steps, A = kᵀ M-major from k's tiles, B = e^{G_L − G} ∘ Vn N-major). Rows of a last
// chunk past its sequence's end hold the next sequence's tokens (or TMA's zeros): their Vn is not stored and their
// e^{G_L − G} ∘ Vn and k rows are zeroed before the update, so a packed sequence's results are bit for bit those of the
// sequence alone. Numerics: every product bf16 × bf16 into fp32, the same roundings as the kernel above (the sums'
// order inside a tensor-core instruction may differ from mma.sync's).
template <int MI>
__global__ void __launch_bounds__(256, MI == 1 ? 2 : 1)
    gdn_chunk_state_wg_kernel(floatX *vn, float *S_final, long sf_stride, const float *S0, long s0_stride,
                              const __grid_constant__ CUtensorMap tmW, const __grid_constant__ CUtensorMap tmK,
                              const __grid_constant__ CUtensorMap tmU, const __grid_constant__ CUtensorMap tmH,
                              const __grid_constant__ CUtensorMap tmV, const float *Gc, const int *cu_seqlens, int T,
                              int H, int V) {
    constexpr int K = 128 * MI, NKB = K / 64;
    constexpr uint32_t TILE = GDN_WG_TILE, BUFB = (2 * NKB + 1) * TILE, SSB = K * 128;
    extern __shared__ __align__(16) char gdn_smem[];
    // layout from a 1024-byte boundary: two buffers [W: NKB tiles | k: NKB tiles | U: one tile, then Vn], sS (the
    // state's bf16 halves, K rows × 64 bytes each), sVs (e^{G_L − G} ∘ Vn, one tile), the decays (2 × 64 fp32), the
    // two buffers' mbarriers
    const uint32_t raw = tiles::smem_addr(gdn_smem), pad = (1024u - (raw & 1023u)) & 1023u, base = raw + pad;
    char *sm = gdn_smem + pad, *sVs = sm + 2 * BUFB + SSB;
    float *sGb = (float *)(sVs + TILE);
    const uint32_t aS = base + 2 * BUFB, aVs = aS + SSB, mbar = aVs + TILE + 2 * GDN_L * sizeof(float);
    const int vb = blockIdx.x * GDN_T, h = blockIdx.y, b = blockIdx.z;
    const int g = threadIdx.x >> 7, wq = (threadIdx.x >> 5) & 3;
    const ChunkSeq seq = chunk_seq<GDN_L>(cu_seqlens, b, T);
    const int NC = seq.nc;
    if (threadIdx.x == 0) {
        tiles::mbar_init(mbar, 1);
        tiles::mbar_init(mbar + 8, 1);
        tiles::mbar_init_fence();
    }
    float S[MI][32]; // (gdn_wg_row)
    gdn_wg_state_in(S, S0 != NULL ? S0 + (long)b * s0_stride : NULL, h, K, V, vb);
    __syncthreads(); // (the mbarriers initialized)
    auto stage_chunk = [&](int c, int buf) { // thread 0: the chunk's boxes; threads 192..255: its decays
        const int t0 = c * GDN_L, nv = min(GDN_L, seq.len - t0), tok = (int)(seq.tok0 + t0);
        if (threadIdx.x == 0) {
            const uint32_t mb = mbar + 8 * buf, bW = base + buf * BUFB;
            tiles::mbar_arrive_tx(mb, BUFB);
#pragma unroll
            for (int kb = 0; kb < NKB; kb++) {
                tiles::tma_load_3d(bW + kb * TILE, &tmW, 64 * kb, h, tok, mb);
                tiles::tma_load_3d(bW + (NKB + kb) * TILE, &tmK, 64 * kb, h, tok, mb);
            }
            tiles::tma_load_3d(bW + 2 * NKB * TILE, &tmU, vb, h, tok, mb);
        }
        if (threadIdx.x >= 192) { gdn_copy_G(sGb + buf * GDN_L, Gc, (seq.tok0 + t0) * H + h, H, nv, threadIdx.x - 192); }
    };
    if (NC > 0) { stage_chunk(0, 0); }
    for (int c = 0; c < NC; c++) {
        const int buf = c & 1, t0 = c * GDN_L, nv = min(GDN_L, seq.len - t0);
        const long row0 = (seq.tok0 + t0) * H + h;
        const uint32_t aW = base + buf * BUFB, ak = aW + NKB * TILE, aU = ak + NKB * TILE;
        char *sk = sm + buf * BUFB + NKB * TILE, *sU = sk + NKB * TILE; // (sU then holds Vn)
        const float *sG = sGb + buf * GDN_L;
        gdn_wg_state_put(sm + 2 * BUFB, S, K); // h_c into sS
        tiles::fence_proxy_async(); // sS's stores before the copy engine and the tensor cores read it
        chunk_sync();               // the decays landed, sS whole
        tiles::mbar_wait(mbar + 8 * buf, (c >> 1) & 1);
        if (c + 1 < NC) { stage_chunk(c + 1, buf ^ 1); } // lands during this chunk's products
        if (threadIdx.x == 0) {
            const int hrow = (int)(((seq.cslot + c) * H + h) * K);
            tiles::tma_store_2d(&tmH, aS, vb, hrow);
            if (vb + 32 < V) { tiles::tma_store_2d(&tmH, aS + K * 64, vb + 32, hrow); }
            tiles::bulk_commit();
        }
        { // Vn = U − W h_c, columns 32g..32g+31
            float acc[16];
            tiles::wgmma_zero(acc);
            tiles::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < K / 16; kk++) {
                const uint64_t da = tiles::wgmma_desc(aW + (kk >> 2) * TILE + (kk & 3) * 32, 16, 1024, 1);
                const uint64_t db = tiles::wgmma_desc(aS + g * (K * 64) + kk * 1024, K * 64, 512, 2);
                tiles::wgmma_64x32<0, 1>(acc, da, db);
            }
            tiles::wgmma_commit();
            tiles::wgmma_wait<0>();
            const float GL = sG[GDN_L - 1];
#pragma unroll
            for (int i = 0; i < 4; i += 2) { // a thread's two rows: their decays and output rows once
                const int r = 16 * wq + tiles::acc_row(i);
                const float dec = expf(GL - sG[r]);
                floatX *vrow = vn + (row0 + (long)r * H) * V + vb;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int n = 32 * g + tiles::acc_col(j, i);
                    const uint32_t off = tiles::swz128(r, 2 * n);
                    const uint32_t u = *(const uint32_t *)(sU + off);
                    const float x0 = (float)(floatX)(tiles::bf_lo(u) - acc[4 * j + i]);
                    const float x1 = (float)(floatX)(tiles::bf_hi(u) - acc[4 * j + i + 1]);
                    if (nv < GDN_L) { // a last chunk: its rows only (a full chunk leaves as one box, below)
                        chunk_put2(vrow + n, x0, x1, r < nv && vb + n < V, r < nv && vb + n + 1 < V);
                    } else {
                        *(uint32_t *)(sU + off) = tiles::pack_bf16x2(x0, x1);
                    }
                    *(uint32_t *)(sVs + off) = r < nv ? tiles::pack_bf16x2(x0 * dec, x1 * dec) : 0u;
                }
            }
            if (nv < GDN_L) { // a last chunk: k's rows past the end to zero (the next sequence's, or TMA's zeros)
                for (int i = threadIdx.x; i < (GDN_L - nv) * NKB * 8; i += blockDim.x) {
                    const int r = nv + i / (NKB * 8), kb = (i >> 3) % NKB, p = i & 7;
                    *(uint4 *)(sk + kb * TILE + r * 128 + p * 16) = make_uint4(0, 0, 0, 0);
                }
            }
        }
        tiles::fence_proxy_async(); // Vn, e^{G_L − G} ∘ Vn and k's zeroed rows before the copy engine and the
        __syncthreads();            // tensor cores read them (not chunk_sync: the prefetch stays in flight)
        if (threadIdx.x == 0 && nv == GDN_L) { // Vn out: one box (columns past V are not written)
            tiles::tma_store_3d(&tmV, aU, vb, h, (int)(seq.tok0 + t0));
            tiles::bulk_commit();
        }
        const float decay = expf(sG[GDN_L - 1]); // h_{c+1} = e^{G_L} h_c + kᵀ (e^{G_L − G} ∘ Vn)
        gdn_wg_decay(S, decay);
#pragma unroll
        for (int m = 0; m < MI; m++) {
#pragma unroll
            for (int kk = 0; kk < GDN_L / 16; kk++) {
                const uint64_t da = tiles::wgmma_desc(ak + (g + 2 * m) * TILE + kk * 2048, TILE, 1024, 1);
                const uint64_t db = tiles::wgmma_desc(aVs + kk * 2048, TILE, 1024, 1);
                tiles::wgmma_64x64<1, 1>(S[m], da, db);
            }
        }
        tiles::wgmma_commit();
        tiles::wgmma_wait<0>();
        if (threadIdx.x == 0) { tiles::bulk_wait_read(); } // sS and Vn read out before they are rewritten
        __syncthreads();
    }
    if (threadIdx.x == 0) { tiles::bulk_wait(); }
    if (S_final != NULL) { gdn_wg_state_out(S_final + (long)b * sf_stride, S, h, K, V, vb); }
}
static size_t gdn_state_wg_smem(int K) {
    return (2 * (size_t)(2 * (K / 64) + 1) + 1) * GDN_WG_TILE + (size_t)K * 128 + 2 * GDN_L * sizeof(float) +
           2 * sizeof(uint64_t) + 1024; // (+ the alignment to 1024 bytes)
}
#endif

// grid (slots·H·VT), 128 threads (x = (slot·H + h)·VT + V tile). o (tok,H,V) = scale (e^G ∘ (q h_c) + P Vn)
__global__ void gdn_chunk_output_kernel(floatX *o, const floatX *q, const floatX *hst, const floatX *Pm,
                                        const floatX *vn, const float *Gc, float scale, const int *cu_seqlens, int B,
                                        int T, int H, int K, int V) {
    extern __shared__ __align__(16) char gdn_smem[];
    int b, c;
    ChunkSeq seq;
    const int VT = CEIL_DIV(V, GDN_T), vb = (blockIdx.x % VT) * GDN_T, h = blockIdx.x / VT % H;
    if (!chunk_at_slot<GDN_L>(cu_seqlens, B, T, blockIdx.x / VT / H, &b, &c, &seq)) { return; }
    const int t0 = c * GDN_L, nv = min(GDN_L, seq.len - t0), Kp = gdn_kp(K), ldk = Kp + 8, w = threadIdx.x >> 5;
    const long row0 = (seq.tok0 + t0) * H + h, cs = (seq.cslot + c) * H + h;
    floatX *sq = (floatX *)gdn_smem, *sS = sq + GDN_L * ldk, *sP = sS + Kp * GDN_LD, *svn = sP + GDN_L * GDN_LD;
    float *sG = (float *)(svn + GDN_L * GDN_LD);
    chunk_stage(sq, ldk, q + row0 * K, (long)H * K, nv, K, GDN_L, Kp, (const float *)NULL);
    chunk_stage(sS, GDN_LD, hst + cs * K * V + vb, (long)V, K, V - vb, Kp, GDN_T, (const float *)NULL);
    chunk_stage(sP, GDN_LD, Pm + cs * GDN_L * GDN_L, (long)GDN_L, GDN_L, GDN_L, GDN_L, GDN_L, (const float *)NULL);
    chunk_stage(svn, GDN_LD, vn + row0 * V + vb, (long)H * V, nv, V - vb, GDN_L, GDN_T, (const float *)NULL);
    gdn_load_G(sG, Gc, row0, H, nv);
    chunk_sync();
    float acc[8][4] = {}, acc2[8][4] = {};
    tiles::warp_gemm<8, false, false>(acc, sq + 16 * w * ldk, ldk, sS, GDN_LD, Kp);
    tiles::warp_gemm<8, false, false>(acc2, sP + 16 * w * GDN_LD, GDN_LD, svn, GDN_LD, GDN_L);
#pragma unroll
    for (int i = 0; i < 4; i += 2) { // a thread's two rows: their decays and output rows once
        const int r = 16 * w + tiles::acc_row(i);
        const float eG = scale * expf(sG[r]);
        floatX *orow = o + (row0 + (long)r * H) * V;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int col = vb + tiles::acc_col(j, i);
            chunk_put2(orow + col, eG * acc[j][i] + scale * acc2[j][i], eG * acc[j][i + 1] + scale * acc2[j][i + 1],
                       r < nv && col < V, r < nv && col + 1 < V);
        }
    }
}
static size_t gdn_output_smem(int K) {
    const int Kp = gdn_kp(K);
    return ((size_t)GDN_L * (Kp + 8) + (size_t)Kp * GDN_LD + 2 * (size_t)GDN_L * GDN_LD) * sizeof(floatX) +
           GDN_L * sizeof(float);
}
#if !FLOATX_IS_FP32
// The output kernel on sm_90a (where the state kernel's sm_90a form runs): one warpgroup a (V tile, head, chunk slot),
// q (NKB tiles), h_c (K rows × the V tile), P and Vn by the tensor copy engine onto one mbarrier, e^G-free q h_c and
// P Vn by wgmma (A = q, P K-major; B = h_c, Vn N-major), o out of Vn's tile by one tensor store (a last, partial
// chunk: its rows from registers). The same sums and roundings as gdn_chunk_output_kernel.
template <int MI>
__global__ void __launch_bounds__(128)
    gdn_chunk_output_wg_kernel(floatX *o, const __grid_constant__ CUtensorMap tmQ,
                               const __grid_constant__ CUtensorMap tmH, const __grid_constant__ CUtensorMap tmP,
                               const __grid_constant__ CUtensorMap tmVn, const __grid_constant__ CUtensorMap tmO,
                               const float *Gc, float scale, const int *cu_seqlens, int B, int T, int H, int V) {
    constexpr int K = 128 * MI, NKB = K / 64;
    constexpr uint32_t TILE = GDN_WG_TILE;
    extern __shared__ __align__(16) char gdn_smem[];
    int b, c;
    ChunkSeq seq;
    const int VT = CEIL_DIV(V, GDN_T), vb = (blockIdx.x % VT) * GDN_T, h = blockIdx.x / VT % H;
    if (!chunk_at_slot<GDN_L>(cu_seqlens, B, T, blockIdx.x / VT / H, &b, &c, &seq)) { return; }
    const int t0 = c * GDN_L, nv = min(GDN_L, seq.len - t0), tok = (int)(seq.tok0 + t0), w = threadIdx.x >> 5;
    const long row0 = (seq.tok0 + t0) * H + h, cs = (seq.cslot + c) * H + h;
    // from a 1024-byte boundary: q (NKB tiles), h_c (K rows of 128 bytes), P, Vn (then o), the decays, the mbarrier
    const uint32_t raw = tiles::smem_addr(gdn_smem), pad = (1024u - (raw & 1023u)) & 1023u, base = raw + pad;
    const uint32_t aq = base, ah = aq + NKB * TILE, aP = ah + K * 128, avn = aP + TILE, mbar = avn + TILE + 256;
    char *svn = gdn_smem + pad + (avn - base);
    float *sG = (float *)(svn + TILE);
    if (threadIdx.x == 0) {
        tiles::mbar_init(mbar, 1);
        tiles::mbar_init_fence();
        tiles::mbar_arrive_tx(mbar, (2 * NKB + 2) * TILE);
#pragma unroll
        for (int kb = 0; kb < NKB; kb++) { tiles::tma_load_3d(aq + kb * TILE, &tmQ, 64 * kb, h, tok, mbar); }
        tiles::tma_load_2d(ah, &tmH, vb, (int)(cs * K), mbar);
        tiles::tma_load_2d(aP, &tmP, 0, (int)(cs * GDN_L), mbar);
        tiles::tma_load_3d(avn, &tmVn, vb, h, tok, mbar);
    }
    gdn_load_G(sG, Gc, row0, H, nv);
    __syncthreads(); // (the mbarrier initialized, the decays in)
    tiles::mbar_wait(mbar, 0);
    float acc[32], acc2[32];
    tiles::wgmma_zero(acc);
    tiles::wgmma_zero(acc2);
    tiles::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        tiles::wgmma_64x64<0, 1>(acc, tiles::wgmma_desc(aq + (kk >> 2) * TILE + (kk & 3) * 32, 16, 1024, 1),
                                 tiles::wgmma_desc(ah + kk * 2048, TILE, 1024, 1));
    }
#pragma unroll
    for (int kk = 0; kk < GDN_L / 16; kk++) {
        tiles::wgmma_64x64<0, 1>(acc2, tiles::wgmma_desc(aP + kk * 32, 16, 1024, 1),
                                 tiles::wgmma_desc(avn + kk * 2048, TILE, 1024, 1));
    }
    tiles::wgmma_commit();
    tiles::wgmma_wait<0>();
    __syncthreads(); // every warp's products have read Vn's tile: o goes over it
#pragma unroll
    for (int i = 0; i < 4; i += 2) { // a thread's two rows: their decays and output rows once
        const int r = 16 * w + tiles::acc_row(i);
        const float eG = scale * expf(sG[r]);
        floatX *orow = o + (row0 + (long)r * H) * V + vb;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int n = tiles::acc_col(j, i);
            const float y0 = eG * acc[4 * j + i] + scale * acc2[4 * j + i];
            const float y1 = eG * acc[4 * j + i + 1] + scale * acc2[4 * j + i + 1];
            if (nv < GDN_L) {
                chunk_put2(orow + n, y0, y1, r < nv && vb + n < V, r < nv && vb + n + 1 < V);
            } else {
                *(uint32_t *)(svn + tiles::swz128(r, 2 * n)) = tiles::pack_bf16x2(y0, y1);
            }
        }
    }
    if (nv == GDN_L) { // o out: one box (columns past V are not written)
        tiles::fence_proxy_async();
        __syncthreads();
        if (threadIdx.x == 0) {
            tiles::tma_store_3d(&tmO, avn, vb, h, tok);
            tiles::bulk_commit();
            tiles::bulk_wait_read(); // (the tile is read out before the CTA's shared memory goes)
        }
    }
}
static size_t gdn_output_wg_smem(int K) {
    return (size_t)(K / 64 + 2) * GDN_WG_TILE + (size_t)K * 128 + 256 + 16 + 1024; // (+ the alignment to 1024 bytes)
}
#endif

// ----------------------------------------------------------------------------------------------------------------
// backward

// grid (VT, H, B), 256 threads, sequence b's chunks in reverse. dhst (slots,H,K,V) dL/d(state at each chunk's end);
// dvn (tok,H,V) = dL/dVn; dS0 (sequence stride d0_stride) or NULL; dS_final or NULL (zero). dout (tok,H,V) = dL/do
template <int MR, bool BULK>
__global__ void __launch_bounds__(256) gdn_chunk_dstate_kernel(floatX *dhst, floatX *dvn, float *dS0, long d0_stride,
                                                               const float *dS_final, long df_stride, const floatX *q,
                                                               const floatX *k, const floatX *W, const floatX *Pm,
                                                               const floatX *dout, const float *Gc, float scale,
                                                               const int *cu_seqlens, int T, int H, int K, int V) {
    extern __shared__ __align__(16) char gdn_smem[];
    const int vb = blockIdx.x * GDN_T, h = blockIdx.y, b = blockIdx.z;
    const ChunkSeq seq = chunk_seq<GDN_L>(cu_seqlens, b, T);
    const int NC = seq.nc;
    const int Kp = gdn_kp(K), ldk = Kp + 8, w = threadIdx.x >> 5, MT = Kp / 16;
    floatX *sdS = (floatX *)gdn_smem, *sk = sdS + Kp * GDN_LD, *sq = sk + GDN_L * ldk, *sW = sq + GDN_L * ldk;
    floatX *sP = sW + GDN_L * ldk, *sdo = sP + GDN_L * GDN_LD, *sdvn = sdo + GDN_L * GDN_LD;
    floatX *sdos = sdvn + GDN_L * GDN_LD; // do ∘ scale e^G (rows)
    float *sGb = (float *)(sdos + GDN_L * GDN_LD), *skdec = sGb + 2 * GDN_L; // sGb: (2, 64), chunk c's G in slot c & 1
    // bulk row copies (as the state kernel) where every row is whole 16-byte pieces: group A's on the mbarrier mbA,
    // B's on mbB (their phases count the chunks in reverse), dh out a row a copy
    const int cu = min(GDN_T, V - vb);
    constexpr bool bulk = BULK;
    const uint32_t mbA = tiles::smem_addr(skdec + GDN_L), mbB = mbA + 8;
    if (bulk) {
        if (threadIdx.x == 0) {
            tiles::mbar_init(mbA, blockDim.x);
            tiles::mbar_init(mbB, blockDim.x);
            tiles::mbar_init_fence();
        }
        gdn_zero_cols(sk, ldk, K, Kp);
        gdn_zero_cols(sq, ldk, K, Kp);
        gdn_zero_cols(sW, ldk, K, Kp);
        gdn_zero_cols(sdo, GDN_LD, cu, GDN_T);
        __syncthreads();
    }
    float dS[MR][8][4]; // rows 16·(w + 8m) of dh's K, the tile's 64 columns (MR = 1 covers K ≤ 128)
#pragma unroll
    for (int m = 0; m < MR; m++) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = 16 * (w + 8 * m) + tiles::acc_row(i), col = vb + tiles::acc_col(j, i);
                dS[m][j][i] = (dS_final != NULL && r < K && col < V)
                                  ? dS_final[(long)b * df_stride + ((long)h * K + r) * V + col] : 0.0f;
            }
        }
    }
    // each chunk's tiles come in two cp.async groups, each issued as soon as the previous chunk's readers of its
    // buffers are done, so that it lands under the other phase's products (no second set of buffers: two CTAs an
    // SM): A = k, P, do (the dVn product's operands) and G, issued after the dVn product; B = q, W (the dh update's),
    // issued after the update. At chunk c the groups in flight are, oldest first, A(c), B(c).
    auto issue_a = [&](int c) {
        const int nv = min(GDN_L, seq.len - c * GDN_L);
        const long row0 = (seq.tok0 + c * GDN_L) * H + h, cs = (seq.cslot + c) * H + h;
        if (bulk) { // thread t: row t & 63 of k, P, do (t < 192), or that row's decay (t ≥ 192)
            const int r = threadIdx.x & (GDN_L - 1), which = threadIdx.x >> 6;
            const long tok = row0 + (long)r * H;
            if (which == 0) {
                gdn_bulk_row(sk + r * ldk, k + tok * K, K, r < nv, mbA);
            } else if (which == 1) {
                gdn_bulk_row(sP + r * GDN_LD, Pm + cs * GDN_L * GDN_L + r * GDN_L, GDN_L, true, mbA);
            } else if (which == 2) {
                gdn_bulk_row(sdo + r * GDN_LD, dout + tok * V + vb, cu, r < nv, mbA);
            } else {
                gdn_copy_G(sGb + (c & 1) * GDN_L, Gc, row0, H, nv, r);
                tiles::mbar_arrive(mbA);
            }
            tiles::cp_async_commit();
            return;
        }
        chunk_stage(sk, ldk, k + row0 * K, (long)H * K, nv, K, GDN_L, Kp, (const float *)NULL);
        chunk_stage(sP, GDN_LD, Pm + cs * GDN_L * GDN_L, (long)GDN_L, GDN_L, GDN_L, GDN_L, GDN_L, (const float *)NULL);
        chunk_stage(sdo, GDN_LD, dout + row0 * V + vb, (long)H * V, nv, V - vb, GDN_L, GDN_T, (const float *)NULL);
        if (threadIdx.x < GDN_L) { // G into the chunk's slot of sGb (the other slot is the current chunk's)
            gdn_copy_G(sGb + (c & 1) * GDN_L, Gc, row0, H, nv, threadIdx.x);
        }
        tiles::cp_async_commit();
    };
    auto issue_b = [&](int c) {
        const int nv = min(GDN_L, seq.len - c * GDN_L);
        const long row0 = (seq.tok0 + c * GDN_L) * H + h;
        if (bulk) { // thread t: row t & 63 of q, W (t < 128)
            const int r = threadIdx.x & (GDN_L - 1), which = threadIdx.x >> 6;
            const long tok = row0 + (long)r * H;
            if (which == 0) {
                gdn_bulk_row(sq + r * ldk, q + tok * K, K, r < nv, mbB);
            } else if (which == 1) {
                gdn_bulk_row(sW + r * ldk, W + tok * K, K, r < nv, mbB);
            } else {
                tiles::mbar_arrive(mbB);
            }
            return;
        }
        chunk_stage(sq, ldk, q + row0 * K, (long)H * K, nv, K, GDN_L, Kp, (const float *)NULL);
        chunk_stage(sW, ldk, W + row0 * K, (long)H * K, nv, K, GDN_L, Kp, (const float *)NULL);
        tiles::cp_async_commit();
    };
    if (NC > 0) {
        issue_a(NC - 1);
        issue_b(NC - 1);
    }
    for (int c = NC - 1; c >= 0; c--) {
        const int t0 = c * GDN_L, nv = min(GDN_L, seq.len - t0);
        const long row0 = (seq.tok0 + t0) * H + h, cs = (seq.cslot + c) * H + h;
        floatX *dhc = dhst + cs * K * V;
        const float *sG = sGb + (c & 1) * GDN_L;
#pragma unroll
        for (int m = 0; m < MR; m++) {
            if (w + 8 * m >= MT) { continue; }
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int i = 0; i < 4; i += 2) {
                    chunk_sput2(sdS + (16 * (w + 8 * m) + tiles::acc_row(i)) * GDN_LD + tiles::acc_col(j, i),
                                dS[m][j][i], dS[m][j][i + 1]);
                }
            }
        }
        const uint32_t par = (NC - 1 - c) & 1; // the mbarriers' phase for chunk c
        if (bulk) {
            tiles::fence_proxy_async(); // sdS's stores before the bulk copy that reads it
            tiles::cp_async_wait<0>();  // A(c)'s decays (its rows: mbA)
            tiles::mbar_wait(mbA, par);
        } else {
            tiles::cp_async_wait<1>(); // A(c) landed (B(c) may still be in flight)
        }
        __syncthreads();
        if (bulk) {
            gdn_bulk_store_state(dhc, sdS, K, V, vb, cu);
        } else {
            gdn_store_state(dhc, sdS, K, V, vb);
        }
        if (threadIdx.x < GDN_L) { skdec[threadIdx.x] = expf(sG[GDN_L - 1] - sG[threadIdx.x]); }
        { // do ∘ scale e^G: a row a group of 4 threads (256), 16 columns each by 16-byte pieces
            constexpr int E = 16 / sizeof(floatX);
            const int r = threadIdx.x >> 2, c0 = (threadIdx.x & 3) * (GDN_T / 4);
            const float eg = expf(sG[r]);
#pragma unroll
            for (int p = 0; p < GDN_T / 4; p += E) {
                uint4 raw = *(const uint4 *)(sdo + r * GDN_LD + c0 + p);
                floatX *x = (floatX *)&raw;
#pragma unroll
                for (int e = 0; e < E; e++) { x[e] = (floatX)((float)x[e] * scale * eg); }
                *(uint4 *)(sdos + r * GDN_LD + c0 + p) = raw;
            }
        }
        __syncthreads();
        { // dVn = scale Pᵀ do + (e^{G_L − G} ∘ k) dh
            const int mt = w & 3, half = w >> 2;
            float a1[4][4] = {}, a2[4][4] = {};
            tiles::warp_gemm<4, true, false>(a1, sP + 16 * mt, GDN_LD, sdo + 32 * half, GDN_LD, GDN_L);
            tiles::warp_gemm<4, false, false>(a2, sk + 16 * mt * ldk, ldk, sdS + 32 * half, GDN_LD, Kp);
#pragma unroll
            for (int i = 0; i < 4; i += 2) { // a thread's two rows: their decays and output rows once
                const int r = 16 * mt + tiles::acc_row(i);
                const float kd = skdec[r];
                floatX *drow = dvn + (row0 + (long)r * H) * V + vb;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int col = 32 * half + tiles::acc_col(j, i);
                    const floatX x0 = (floatX)(scale * a1[j][i] + kd * a2[j][i]);
                    const floatX x1 = (floatX)(scale * a1[j][i + 1] + kd * a2[j][i + 1]);
                    chunk_put2(drow + col, (float)x0, (float)x1, r < nv && vb + col < V, r < nv && vb + col + 1 < V);
                    chunk_sput2(sdvn + r * GDN_LD + col, -(float)x0, -(float)x1);
                }
            }
        }
        __syncthreads(); // sk, sP, sdo are read: the next chunk's A group may land in them
        if (c > 0) { issue_a(c - 1); }
        if (bulk) {
            tiles::mbar_wait(mbB, par);
        } else if (c > 0) {
            tiles::cp_async_wait<1>(); // B(c) landed (A(c − 1) in flight)
        } else {
            tiles::cp_async_wait<0>();
        }
        __syncthreads();
        const float decay = expf(sG[GDN_L - 1]); // dh ← e^{G_L} dh + (scale e^G ∘ q)ᵀ do − Wᵀ dVn
#pragma unroll
        for (int m = 0; m < MR; m++) {
            if (w + 8 * m >= MT) { continue; }
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int i = 0; i < 4; i++) { dS[m][j][i] *= decay; }
            }
            tiles::warp_gemm<8, true, false>(dS[m], sq + 16 * (w + 8 * m), ldk, sdos, GDN_LD, GDN_L);
            tiles::warp_gemm<8, true, false>(dS[m], sW + 16 * (w + 8 * m), ldk, sdvn, GDN_LD, GDN_L);
        }
        if (bulk && threadIdx.x < K) { tiles::bulk_wait_read(); } // dh's rows are out of sdS before it is rewritten
        __syncthreads(); // sq, sW, sdos, sdvn are read
        if (c > 0) { issue_b(c - 1); }
    }
    if (bulk && threadIdx.x < K) { tiles::bulk_wait(); }
    if (dS0 != NULL) {
#pragma unroll
        for (int m = 0; m < MR; m++) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int r = 16 * (w + 8 * m) + tiles::acc_row(i), col = vb + tiles::acc_col(j, i);
                    if (r < K && col < V) { dS0[(long)b * d0_stride + ((long)h * K + r) * V + col] = dS[m][j][i]; }
                }
            }
        }
    }
}
static size_t gdn_dstate_smem(int K) {
    const int Kp = gdn_kp(K), ldk = Kp + 8;
    return ((size_t)Kp * GDN_LD + 3 * (size_t)GDN_L * ldk + 4 * (size_t)GDN_L * GDN_LD) * sizeof(floatX) +
           3 * GDN_L * sizeof(float) + 2 * sizeof(uint64_t); // (+ the bulk copies' two mbarriers)
}

#if !FLOATX_IS_FP32
// The dstate kernel on sm_90a (where the state kernel's sm_90a form runs): the same reverse pass and outputs as
// gdn_chunk_dstate_kernel, its four products by wgmma on tiles the tensor copy engine moves, in the same two groups a
// chunk (A = k, P, do and the decays after the dVn product; B = q, W after the dh update; one set of buffers, two CTAs
// an SM at K = 128). Warpgroup g: dVn's columns 32g..32g+31 (scale Pᵀ do: A = P M-major, B = do's half g, a 64B-swizzled
// box of 32 columns; e^{G_L − G} ∘ (k dh): A = k K-major, B = dh's half g) and dh's rows 64(g + 2m) (m64n64: A = qᵀ
// and Wᵀ M-major, B = do ∘ scale e^G over both halves, and dVn, negated by the tensor cores). dh_c leaves from its
// two 64B-swizzled halves, a whole chunk's dVn from its tile, one tensor store each; a last chunk's rows past its
// sequence's end (the next sequence's tokens or TMA's zeros) are zeroed in do, q and W, and dVn there is zero, so a
// packed sequence's results are bit for bit its results alone.
template <int MI>
__global__ void __launch_bounds__(256, MI == 1 ? 2 : 1)
    gdn_chunk_dstate_wg_kernel(floatX *dvn, float *dS0, long d0_stride, const float *dS_final, long df_stride,
                               const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                               const __grid_constant__ CUtensorMap tmW, const __grid_constant__ CUtensorMap tmP,
                               const __grid_constant__ CUtensorMap tmDo, const __grid_constant__ CUtensorMap tmDh,
                               const __grid_constant__ CUtensorMap tmDv, const float *Gc, float scale,
                               const int *cu_seqlens, int T, int H, int V) {
    constexpr int K = 128 * MI, NKB = K / 64;
    constexpr uint32_t TILE = GDN_WG_TILE, SSB = K * 128;
    extern __shared__ __align__(16) char gdn_smem[];
    // from a 1024-byte boundary: k (NKB tiles), P, do (two 64B-swizzled halves), q (NKB), W (NKB), do ∘ scale e^G
    // (two halves), dVn (one tile), dh (two halves of K rows), then e^{G_L − G} (64 fp32), the decays (2 × 64 fp32),
    // the mbarriers of groups A and B
    const uint32_t raw = tiles::smem_addr(gdn_smem), pad = (1024u - (raw & 1023u)) & 1023u, base = raw + pad;
    char *sm = gdn_smem + pad;
    const uint32_t ak = base, aP = ak + NKB * TILE, ado = aP + TILE, aq = ado + TILE, aW = aq + NKB * TILE;
    const uint32_t ados = aW + NKB * TILE, advn = ados + TILE, adS = advn + TILE;
    char *sdo = sm + (ado - base), *sq = sm + (aq - base), *sW = sm + (aW - base), *sdos = sm + (ados - base);
    char *sdvn = sm + (advn - base), *sdS = sm + (adS - base);
    float *skdec = (float *)(sdS + SSB), *sGb = skdec + GDN_L;
    const uint32_t mbA = adS + SSB + 3 * GDN_L * sizeof(float), mbB = mbA + 8;
    const int vb = blockIdx.x * GDN_T, h = blockIdx.y, b = blockIdx.z;
    const int g = threadIdx.x >> 7, wq = (threadIdx.x >> 5) & 3;
    const ChunkSeq seq = chunk_seq<GDN_L>(cu_seqlens, b, T);
    const int NC = seq.nc;
    if (threadIdx.x == 0) {
        tiles::mbar_init(mbA, 1);
        tiles::mbar_init(mbB, 1);
        tiles::mbar_init_fence();
    }
    float dS[MI][32]; // (gdn_wg_row)
    gdn_wg_state_in(dS, dS_final != NULL ? dS_final + (long)b * df_stride : NULL, h, K, V, vb);
    __syncthreads(); // (the mbarriers initialized)
    auto issue_a = [&](int c) { // thread 0: k, P, do; threads 192..255: the decays (into slot c & 1)
        const int nv = min(GDN_L, seq.len - c * GDN_L), tok = (int)(seq.tok0 + c * GDN_L);
        if (threadIdx.x == 0) {
            tiles::mbar_arrive_tx(mbA, (NKB + 2) * TILE);
#pragma unroll
            for (int kb = 0; kb < NKB; kb++) { tiles::tma_load_3d(ak + kb * TILE, &tmK, 64 * kb, h, tok, mbA); }
            tiles::tma_load_2d(aP, &tmP, 0, (int)(((seq.cslot + c) * H + h) * GDN_L), mbA);
            tiles::tma_load_3d(ado, &tmDo, vb, h, tok, mbA);
            tiles::tma_load_3d(ado + TILE / 2, &tmDo, vb + 32, h, tok, mbA);
        }
        if (threadIdx.x >= 192) { gdn_copy_G(sGb + (c & 1) * GDN_L, Gc, (long)tok * H + h, H, nv, threadIdx.x - 192); }
    };
    auto issue_b = [&](int c) { // thread 0: q, W
        if (threadIdx.x == 0) {
            const int tok = (int)(seq.tok0 + c * GDN_L);
            tiles::mbar_arrive_tx(mbB, 2 * NKB * TILE);
#pragma unroll
            for (int kb = 0; kb < NKB; kb++) {
                tiles::tma_load_3d(aq + kb * TILE, &tmQ, 64 * kb, h, tok, mbB);
                tiles::tma_load_3d(aW + kb * TILE, &tmW, 64 * kb, h, tok, mbB);
            }
        }
    };
    if (NC > 0) {
        issue_a(NC - 1);
        issue_b(NC - 1);
    }
    for (int c = NC - 1; c >= 0; c--) {
        const int t0 = c * GDN_L, nv = min(GDN_L, seq.len - t0);
        const long row0 = (seq.tok0 + t0) * H + h, cs = (seq.cslot + c) * H + h;
        const float *sG = sGb + (c & 1) * GDN_L;
        const uint32_t par = (NC - 1 - c) & 1; // the mbarriers' phase for chunk c
        gdn_wg_state_put(sdS, dS, K); // dh (the state gradient at the chunk's end)
        tiles::fence_proxy_async(); // dh's stores before the copy engine and the tensor cores read them
        tiles::cp_async_commit();
        tiles::cp_async_wait<0>(); // A(c)'s decays
        tiles::mbar_wait(mbA, par);
        if (nv < GDN_L) { // a last chunk: do's rows past the end to zero (both halves: 64-byte rows)
            for (int i = threadIdx.x; i < (GDN_L - nv) * 8; i += blockDim.x) {
                const int r = nv + (i >> 3), hh = (i >> 2) & 1, p = i & 3;
                *(uint4 *)(sdo + hh * (TILE / 2) + r * 64 + p * 16) = make_uint4(0, 0, 0, 0);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) { // dh_c out: one box a half (columns past V are not written)
            const int hrow = (int)(cs * K);
            tiles::tma_store_2d(&tmDh, adS, vb, hrow);
            if (vb + 32 < V) { tiles::tma_store_2d(&tmDh, adS + K * 64, vb + 32, hrow); }
            tiles::bulk_commit();
        }
        if (threadIdx.x < GDN_L) { skdec[threadIdx.x] = expf(sG[GDN_L - 1] - sG[threadIdx.x]); }
#pragma unroll
        for (int i = threadIdx.x; i < GDN_L * 8; i += 256) { // do ∘ scale e^G: 16-byte pieces, row (i & 255) / 4
            const int r = (i & 255) >> 2;
            const float eg = expf(sG[r]);
            uint4 raw4 = *(const uint4 *)(sdo + i * 16);
            __nv_bfloat16 *x = (__nv_bfloat16 *)&raw4;
#pragma unroll
            for (int e = 0; e < 8; e++) { x[e] = (floatX)((float)x[e] * scale * eg); }
            *(uint4 *)(sdos + i * 16) = raw4;
        }
        tiles::fence_proxy_async(); // do's zeroed rows and do ∘ scale e^G before the tensor cores read them
        __syncthreads();
        { // dVn = scale Pᵀ do + (e^{G_L − G} ∘ k) dh, columns 32g..32g+31
            float a1[16], a2[16];
            tiles::wgmma_zero(a1);
            tiles::wgmma_zero(a2);
            tiles::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < GDN_L / 16; kk++) {
                tiles::wgmma_64x32<1, 1>(a1, tiles::wgmma_desc(aP + kk * 2048, TILE, 1024, 1),
                                         tiles::wgmma_desc(ado + g * (TILE / 2) + kk * 1024, TILE / 2, 512, 2));
            }
#pragma unroll
            for (int kk = 0; kk < K / 16; kk++) {
                tiles::wgmma_64x32<0, 1>(a2, tiles::wgmma_desc(ak + (kk >> 2) * TILE + (kk & 3) * 32, 16, 1024, 1),
                                         tiles::wgmma_desc(adS + g * (K * 64) + kk * 1024, K * 64, 512, 2));
            }
            tiles::wgmma_commit();
            tiles::wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < 4; i += 2) { // a thread's two rows: their decays and output rows once
                const int r = 16 * wq + tiles::acc_row(i);
                const float kd = skdec[r];
                floatX *drow = dvn + (row0 + (long)r * H) * V + vb;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int n = 32 * g + tiles::acc_col(j, i);
                    const float x0 = (float)(floatX)(scale * a1[4 * j + i] + kd * a2[4 * j + i]);
                    const float x1 = (float)(floatX)(scale * a1[4 * j + i + 1] + kd * a2[4 * j + i + 1]);
                    if (nv < GDN_L) { chunk_put2(drow + n, x0, x1, r < nv && vb + n < V, r < nv && vb + n + 1 < V); }
                    *(uint32_t *)(sdvn + tiles::swz128(r, 2 * n)) = r < nv ? tiles::pack_bf16x2(x0, x1) : 0u;
                }
            }
        }
        tiles::fence_proxy_async(); // dVn before the copy engine and the tensor cores read it
        __syncthreads();            // k, P, do are read: the next chunk's group A may land in them
        if (threadIdx.x == 0 && nv == GDN_L) { // dVn out: one box
            tiles::tma_store_3d(&tmDv, advn, vb, h, (int)(seq.tok0 + t0));
            tiles::bulk_commit();
        }
        if (c > 0) { issue_a(c - 1); }
        tiles::mbar_wait(mbB, par);
        if (nv < GDN_L) { // q's and W's rows past the end to zero
            for (int i = threadIdx.x; i < (GDN_L - nv) * 2 * NKB * 8; i += blockDim.x) {
                const int r = nv + i / (2 * NKB * 8), t = (i >> 3) % (2 * NKB), p = i & 7;
                *(uint4 *)((t < NKB ? sq + t * TILE : sW + (t - NKB) * TILE) + r * 128 + p * 16) = make_uint4(0, 0, 0, 0);
            }
            tiles::fence_proxy_async();
        }
        __syncthreads();
        const float decay = expf(sG[GDN_L - 1]); // dh ← e^{G_L} dh + (scale e^G ∘ q)ᵀ do − Wᵀ dVn
        gdn_wg_decay(dS, decay);
#pragma unroll
        for (int m = 0; m < MI; m++) {
#pragma unroll
            for (int kk = 0; kk < GDN_L / 16; kk++) {
                tiles::wgmma_64x64<1, 1>(dS[m], tiles::wgmma_desc(aq + (g + 2 * m) * TILE + kk * 2048, TILE, 1024, 1),
                                         tiles::wgmma_desc(ados + kk * 1024, TILE / 2, 512, 2));
            }
#pragma unroll
            for (int kk = 0; kk < GDN_L / 16; kk++) {
                tiles::wgmma_64x64<1, 1, -1>(dS[m],
                                             tiles::wgmma_desc(aW + (g + 2 * m) * TILE + kk * 2048, TILE, 1024, 1),
                                             tiles::wgmma_desc(advn + kk * 2048, TILE, 1024, 1));
            }
        }
        tiles::wgmma_commit();
        tiles::wgmma_wait<0>();
        if (threadIdx.x == 0) { tiles::bulk_wait_read(); } // dh and dVn read out before they are rewritten
        __syncthreads(); // q, W, do ∘ scale e^G, dVn are read
        if (c > 0) { issue_b(c - 1); }
    }
    if (threadIdx.x == 0) { tiles::bulk_wait(); }
    if (dS0 != NULL) { gdn_wg_state_out(dS0 + (long)b * d0_stride, dS, h, K, V, vb); }
}
static size_t gdn_dstate_wg_smem(int K) {
    return (size_t)(3 * (K / 64) + 4) * GDN_WG_TILE + (size_t)K * 128 + 3 * GDN_L * sizeof(float) +
           2 * sizeof(uint64_t) + 1024; // (+ the alignment to 1024 bytes)
}
#endif

// the dqk kernels' row sums: gam (rows acc_row(0), acc_row(2) of the 16-row block rb) over the quad's lanes into
// sred[part·64 + row], ext and sdot over the warp into sred[128 + warp], sred[136 + warp] (fixed orders)
__device__ __forceinline__ void gdn_dqk_rowsums(float *sred, float (&gam)[2], float ext, float sdot, int part, int rb) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int x = 0; x < 2; x++) {
        gam[x] += __shfl_xor_sync(0xffffffffu, gam[x], 1);
        gam[x] += __shfl_xor_sync(0xffffffffu, gam[x], 2);
    }
    ext = warp_reduce_sum(ext);
    sdot = warp_reduce_sum(sdot);
    if ((lane & 3) == 0) {
        sred[part * GDN_L + 16 * rb + (lane >> 2)] = gam[0];
        sred[part * GDN_L + 16 * rb + (lane >> 2) + 8] = gam[1];
    }
    if (lane == 0) {
        sred[2 * GDN_L + w] = ext;
        sred[2 * GDN_L + 8 + w] = sdot;
    }
}
// after the barrier that follows: d(log α)'s part of this K tile, row r = threadIdx.x < nv (the last row takes the
// chunk-end terms e^{G_L} ⟨h_c, dh⟩ + Σ ext)
__device__ __forceinline__ void gdn_dqk_dgam(float *dgam_part, const float *sred, int nv, float GL, long row0, int H,
                                             int KT, int kt) {
    if (threadIdx.x < nv) {
        const int r = threadIdx.x;
        float x = sred[r] + sred[GDN_L + r];
        if (r == nv - 1) {
            float e = 0.0f, d = 0.0f;
            for (int i = 0; i < 8; i++) {
                e += sred[2 * GDN_L + i];
                d += sred[2 * GDN_L + 8 + i];
            }
            x += expf(GL) * d + e;
        }
        dgam_part[(row0 + (long)r * H) * KT + kt] = x;
    }
}

// grid (slots·H·KT), 256 threads (x = (slot·H + h)·KT + K tile; a chunk's K tiles side by side, sharing do, Vn,
// dVn in L2): the K columns kb..kb+63 of a chunk. dq (tok,H,K); dk_part (tok,H,K) fp32, dW: dk before the WY terms,
// dL/dW; dgam_part (tok,H,KT) fp32: this K tile's share of dL/dG_r (the decay terms of q, k and the state; the
// chunk's last row also takes e^{G_L}⟨h_c, dh⟩ and Σ (dk_state ∘ k))
#ifndef GDN_DQK_MINB
#define GDN_DQK_MINB 2 // CTAs an SM the registers allow
#endif
__global__ void __launch_bounds__(256, GDN_DQK_MINB)
    gdn_chunk_dqk_kernel(floatX *dq, float *dk_part, floatX *dW, float *dgam_part, const floatX *q, const floatX *k,
                         const floatX *vn, const floatX *dvn, const floatX *dout, const floatX *hst, const floatX *dhst,
                         const float *Gc, float scale, const int *cu_seqlens, int B, int T, int H, int K, int V) {
    extern __shared__ __align__(16) char gdn_smem[];
    int b, c;
    ChunkSeq seq;
    const int KT = gdn_kp(K) / GDN_T, kt = blockIdx.x % KT, kb = kt * GDN_T, h = blockIdx.x / KT % H;
    if (!chunk_at_slot<GDN_L>(cu_seqlens, B, T, blockIdx.x / KT / H, &b, &c, &seq)) { return; }
    const int t0 = c * GDN_L, nv = min(GDN_L, seq.len - t0);
    const int w = threadIdx.x >> 5, mt = w & 3, half = w >> 2;
    const long row0 = (seq.tok0 + t0) * H + h;
    const long hoff = ((seq.cslot + c) * H + h) * K * V + (long)kb * V;
    const int TILE = GDN_L * GDN_LD;
    floatX *sdo = (floatX *)gdn_smem, *svn = sdo + TILE, *sdvn = svn + TILE, *sS = sdvn + TILE, *sdSp = sS + TILE;
    floatX *sdSc = sdSp + TILE, *sq = sdSc + TILE, *sk = sq + TILE;
    float *sG = (float *)(sk + TILE), *sred = sG + GDN_L; // sred: (2, 64) row sums, then 8 + 8 warp partials
    gdn_load_G(sG, Gc, row0, H, nv);
    // q's and k's tiles (read after the V loop) come with the first V tile's copies: no round trip of their own
    chunk_stage<false>(sq, GDN_LD, q + row0 * K + kb, (long)H * K, nv, K - kb, GDN_L, GDN_T, (const float *)NULL);
    chunk_stage<false>(sk, GDN_LD, k + row0 * K + kb, (long)H * K, nv, K - kb, GDN_L, GDN_T, (const float *)NULL);
    float a_dq[4][4] = {}, a_dks[4][4] = {}, a_dW[4][4] = {}, a_sc[4][4] = {};
    float sdot = 0.0f; // ⟨h_c, dh⟩ over this K tile: this thread's share
    for (int vb = 0; vb < V; vb += GDN_T) {
        chunk_stage<false>(sdo, GDN_LD, dout + row0 * V + vb, (long)H * V, nv, V - vb, GDN_L, GDN_T,
                           (const float *)NULL);
        chunk_stage<false>(svn, GDN_LD, vn + row0 * V + vb, (long)H * V, nv, V - vb, GDN_L, GDN_T, (const float *)NULL);
        chunk_stage<false>(sdvn, GDN_LD, dvn + row0 * V + vb, (long)H * V, nv, V - vb, GDN_L, GDN_T,
                           (const float *)NULL);
        chunk_stage<false>(sS, GDN_LD, hst + hoff + vb, (long)V, K - kb, V - vb, GDN_T, GDN_T, (const float *)NULL);
        chunk_stage<false>(sdSp, GDN_LD, dhst + hoff + vb, (long)V, K - kb, V - vb, GDN_T, GDN_T, (const float *)NULL);
        chunk_sync();
        tiles::warp_gemm<4, false, true>(a_dq, sdo + 16 * mt * GDN_LD, GDN_LD, sS + 32 * half * GDN_LD, GDN_LD, GDN_T);
        tiles::warp_gemm<4, false, true>(a_dks, svn + 16 * mt * GDN_LD, GDN_LD, sdSp + 32 * half * GDN_LD, GDN_LD,
                                         GDN_T);
        tiles::warp_gemm<4, false, true>(a_dW, sdvn + 16 * mt * GDN_LD, GDN_LD, sS + 32 * half * GDN_LD, GDN_LD,
                                         GDN_T);
        tiles::warp_gemm<4, false, true>(a_sc, sdo + 16 * mt * GDN_LD, GDN_LD, svn + 32 * half * GDN_LD, GDN_LD,
                                         GDN_T);
        { // 16-byte pieces (a scalar walk here was the kernel's largest shared-memory instruction count)
            constexpr int VEC = 16 / sizeof(floatX);
            for (int i = threadIdx.x; i < GDN_T * GDN_T / VEC; i += blockDim.x) {
                const int r = i / (GDN_T / VEC), cc = (i % (GDN_T / VEC)) * VEC;
                const uint4 a = *(const uint4 *)(sS + r * GDN_LD + cc), d = *(const uint4 *)(sdSp + r * GDN_LD + cc);
                const floatX *av = (const floatX *)&a, *dv = (const floatX *)&d;
#pragma unroll
                for (int e = 0; e < VEC; e++) { sdot += (float)av[e] * (float)dv[e]; }
            }
        }
        chunk_sync();
    }
    // dSc = scale (do Vnᵀ) ∘ tril(Γ)
#pragma unroll
    for (int j = 0; j < 4; j++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = 16 * mt + tiles::acc_row(i), s = 32 * half + tiles::acc_col(j, i);
            sdSc[r * GDN_LD + s] = (floatX)(s <= r ? scale * a_sc[j][i] * expf(sG[r] - sG[s]) : 0.0f);
        }
    }
    chunk_sync();
    float a_dq2[4][4] = {}, a_dk2[4][4] = {};
    tiles::warp_gemm<4, false, false>(a_dq2, sdSc + 16 * mt * GDN_LD, GDN_LD, sk + 32 * half, GDN_LD, GDN_L);
    tiles::warp_gemm<4, true, false>(a_dk2, sdSc + 16 * mt, GDN_LD, sq + 32 * half, GDN_LD, GDN_L);
    const float GL = sG[GDN_L - 1];
    float gam[2] = {0.0f, 0.0f}, ext = 0.0f; // rows acc_row(0), acc_row(2)
#pragma unroll
    for (int j = 0; j < 4; j++) {
#pragma unroll
        for (int i = 0; i < 4; i += 2) { // the two adjacent columns of a fragment row, stored as pairs
            const int r = 16 * mt + tiles::acc_row(i), cl = 32 * half + tiles::acc_col(j, i), col = kb + cl;
            float dqv[2], dkc[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                dqv[e] = scale * expf(sG[r]) * a_dq[j][i + e] + a_dq2[j][i + e];
                const float dks = expf(GL - sG[r]) * a_dks[j][i + e];
                dkc[e] = dks + a_dk2[j][i + e];
                const float qv = (float)sq[r * GDN_LD + cl + e], kv = (float)sk[r * GDN_LD + cl + e];
                gam[i >> 1] += dqv[e] * qv - dkc[e] * kv;
                ext += dks * kv;
            }
            const long o = (row0 + (long)r * H) * K + col;
            const bool ok0 = r < nv && col < K, ok1 = r < nv && col + 1 < K;
            chunk_put2(dq + o, dqv[0], dqv[1], ok0, ok1);
            chunk_put2(dW + o, -a_dW[j][i], -a_dW[j][i + 1], ok0, ok1);
            if (ok1 && (o & 1) == 0) {
                *(float2 *)(dk_part + o) = make_float2(dkc[0], dkc[1]);
            } else {
                if (ok0) { dk_part[o] = dkc[0]; }
                if (ok1) { dk_part[o + 1] = dkc[1]; }
            }
        }
    }
    // row sums: the quad's four lanes, then the two column halves; ext and sdot over the CTA, in fixed orders
    gdn_dqk_rowsums(sred, gam, ext, sdot, half, mt);
    chunk_sync();
    gdn_dqk_dgam(dgam_part, sred, nv, GL, row0, H, KT, kt);
}
static size_t gdn_dqk_smem() { return 8 * (size_t)GDN_L * GDN_LD * sizeof(floatX) + (3 * GDN_L + 16) * sizeof(float); }

#if !FLOATX_IS_FP32
// The dqk kernel on sm_90a (where the state kernel's sm_90a form runs): the same outputs as gdn_chunk_dqk_kernel. A
// CTA (K tile, head, chunk slot) walks the V tiles with two sets of five 128B-swizzled boxes in flight (do, Vn, dVn
// and the K tile's rows of h_c and dh), warpgroup 0 accumulating do hᵀ and dVn hᵀ, warpgroup 1 Vn dhᵀ and do Vnᵀ (m64n64
// wgmma, every operand K-major), ⟨h_c, dh⟩ summed by all threads while the products run. Then dSc = scale (do Vnᵀ) ∘
// tril(Γ) (rows and columns past the chunk's end zero, as are q's and k's rows there: they hold the next sequence's
// tokens) and its transpose into two tiles, and dq += dSc k (warpgroup 0), dk += dScᵀ q (warpgroup 1) onto the
// decay-scaled accumulators.
// dq and dW of a whole chunk leave as tensor stores, dk's fp32 parts as 8-byte stores (whole 32-byte sectors).
__global__ void __launch_bounds__(256, 2)
    gdn_chunk_dqk_wg_kernel(float *dk_part, float *dgam_part, const __grid_constant__ CUtensorMap tmDo,
                            const __grid_constant__ CUtensorMap tmVn, const __grid_constant__ CUtensorMap tmDvn,
                            const __grid_constant__ CUtensorMap tmH, const __grid_constant__ CUtensorMap tmDh,
                            const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                            const __grid_constant__ CUtensorMap tmDq, const __grid_constant__ CUtensorMap tmDW,
                            floatX *dq, floatX *dW, const float *Gc, float scale, const int *cu_seqlens, int B, int T,
                            int H, int K, int V) {
    constexpr uint32_t TILE = GDN_WG_TILE, BUF = 5 * TILE; // do, Vn, dVn, h, dh
    extern __shared__ __align__(16) char gdn_smem[];
    int b, c;
    ChunkSeq seq;
    const int KT = K / GDN_T, kt = blockIdx.x % KT, kb = kt * GDN_T, h = blockIdx.x / KT % H;
    if (!chunk_at_slot<GDN_L>(cu_seqlens, B, T, blockIdx.x / KT / H, &b, &c, &seq)) { return; }
    const int t0 = c * GDN_L, nv = min(GDN_L, seq.len - t0), tok = (int)(seq.tok0 + t0);
    const int g = threadIdx.x >> 7, wq = (threadIdx.x >> 5) & 3;
    const long row0 = (seq.tok0 + t0) * H + h;
    const int hrow = (int)(((seq.cslot + c) * H + h) * K + kb), NVT = CEIL_DIV(V, GDN_T);
    // from a 1024-byte boundary: two buffers of five tiles, q, k (the K tile), then G, the row sums, mbarriers. After
    // the V loop buffer 1's first two tiles hold dSc and dScᵀ, buffer 0's dq and dW of a whole chunk
    const uint32_t raw = tiles::smem_addr(gdn_smem), pad = (1024u - (raw & 1023u)) & 1023u, base = raw + pad;
    char *sm = gdn_smem + pad;
    const uint32_t aq = base + 2 * BUF, ak = aq + TILE, adSc = base + BUF, adScT = adSc + TILE;
    char *sq = sm + 2 * BUF, *sk = sq + TILE, *sdSc = sm + BUF, *sdScT = sdSc + TILE;
    float *sG = (float *)(sk + TILE), *sred = sG + GDN_L; // sred: (2, 64) row sums, then 8 + 8 warp partials
    const uint32_t mbar = base + 2 * BUF + 2 * TILE + (4 * GDN_L + 16) * sizeof(float); // three: buffers, q/k
    if (threadIdx.x == 0) {
        for (int i = 0; i < 3; i++) { tiles::mbar_init(mbar + 8 * i, 1); }
        tiles::mbar_init_fence();
    }
    gdn_load_G(sG, Gc, row0, H, nv);
    __syncthreads(); // (the mbarriers initialized, the decays in)
    auto stage = [&](int vt, int buf) {
        if (threadIdx.x == 0) {
            const uint32_t bb = base + buf * BUF, mb = mbar + 8 * buf, vb = vt * GDN_T;
            tiles::mbar_arrive_tx(mb, BUF);
            tiles::tma_load_3d(bb, &tmDo, vb, h, tok, mb);
            tiles::tma_load_3d(bb + TILE, &tmVn, vb, h, tok, mb);
            tiles::tma_load_3d(bb + 2 * TILE, &tmDvn, vb, h, tok, mb);
            tiles::tma_load_2d(bb + 3 * TILE, &tmH, vb, hrow, mb);
            tiles::tma_load_2d(bb + 4 * TILE, &tmDh, vb, hrow, mb);
        }
    };
    stage(0, 0);
    if (NVT > 1) { stage(1, 1); }
    if (threadIdx.x == 0) {
        tiles::mbar_arrive_tx(mbar + 16, 2 * TILE);
        tiles::tma_load_3d(aq, &tmQ, kb, h, tok, mbar + 16);
        tiles::tma_load_3d(ak, &tmK, kb, h, tok, mbar + 16);
    }
    float a0[32], a1[32]; // warpgroup 0: do hᵀ (→ dq), dVn hᵀ (→ −dW); warpgroup 1: Vn dhᵀ (→ dk), do Vnᵀ (→ dSc)
    tiles::wgmma_zero(a0);
    tiles::wgmma_zero(a1);
    float sdot = 0.0f; // ⟨h_c, dh⟩ over this K tile: this thread's share
    for (int vt = 0; vt < NVT; vt++) {
        const int buf = vt & 1;
        const uint32_t bb = base + buf * BUF;
        tiles::mbar_wait(mbar + 8 * buf, (vt >> 1) & 1);
        tiles::wgmma_fence();
        const uint32_t x0 = bb + (g == 0 ? 0 : TILE), y0 = bb + (g == 0 ? 3 : 4) * TILE; // do hᵀ | Vn dhᵀ
        const uint32_t x1 = bb + (g == 0 ? 2 : 0) * TILE, y1 = bb + (g == 0 ? 3 : 1) * TILE; // dVn hᵀ | do Vnᵀ
#pragma unroll
        for (int kk = 0; kk < GDN_T / 16; kk++) {
            tiles::wgmma_64x64<0, 0>(a0, tiles::wgmma_desc(x0 + kk * 32, 16, 1024, 1),
                                     tiles::wgmma_desc(y0 + kk * 32, 16, 1024, 1));
        }
#pragma unroll
        for (int kk = 0; kk < GDN_T / 16; kk++) {
            tiles::wgmma_64x64<0, 0>(a1, tiles::wgmma_desc(x1 + kk * 32, 16, 1024, 1),
                                     tiles::wgmma_desc(y1 + kk * 32, 16, 1024, 1));
        }
        tiles::wgmma_commit();
        { // ⟨h_c, dh⟩: the two tiles share a layout, so the same offsets pair the same elements
            const char *th = sm + buf * BUF + 3 * TILE, *tdh = th + TILE;
#pragma unroll
            for (int i = threadIdx.x; i < (int)(TILE / 16); i += 256) {
                const uint4 x = *(const uint4 *)(th + i * 16), d = *(const uint4 *)(tdh + i * 16);
                const uint32_t *xv = (const uint32_t *)&x, *dv = (const uint32_t *)&d;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    sdot += tiles::bf_lo(xv[e]) * tiles::bf_lo(dv[e]);
                    sdot += tiles::bf_hi(xv[e]) * tiles::bf_hi(dv[e]);
                }
            }
        }
        tiles::wgmma_wait<0>();
        __syncthreads(); // this buffer is read: the V tile after next may land in it
        if (vt + 2 < NVT) { stage(vt + 2, buf); }
    }
    tiles::mbar_wait(mbar + 16, 0);
    if (nv < GDN_L) { // a last chunk: q's and k's rows past the end to zero
        for (int i = threadIdx.x; i < (GDN_L - nv) * 16; i += 256) {
            const int r = nv + (i >> 4), t = (i >> 3) & 1, p = i & 7;
            *(uint4 *)((t ? sk : sq) + r * 128 + p * 16) = make_uint4(0, 0, 0, 0);
        }
    }
    const float GL = sG[GDN_L - 1];
    float ext = 0.0f; // Σ (e^{G_L − G} ∘ Vn dhᵀ) ∘ k over the chunk's rows (warpgroup 1)
#pragma unroll
    for (int e = 0; e < 32; e++) { // (branch-free in g: a divergent path here makes ptxas serialize the wgmmas below)
        const int r = 16 * wq + tiles::acc_row(e & 3), n = tiles::acc_col(e >> 2, e & 3);
        a0[e] *= g == 0 ? scale * expf(sG[r]) : expf(GL - sG[r]);
        const uint16_t kraw = *(const uint16_t *)(sk + tiles::swz128(r, 2 * n));
        ext += g == 1 && r < nv ? a0[e] * __uint_as_float((uint32_t)kraw << 16) : 0.0f;
    }
    if (g == 1) { // dSc = scale (do Vnᵀ) ∘ tril(Γ), zero past the chunk's end, and its transpose
#pragma unroll
        for (int e = 0; e < 32; e += 2) {
            const int r = 16 * wq + tiles::acc_row(e & 3), s0 = tiles::acc_col(e >> 2, e & 3);
            const float y0 = s0 <= r && r < nv ? scale * a1[e] * expf(sG[r] - sG[s0]) : 0.0f;
            const float y1 = s0 + 1 <= r && r < nv ? scale * a1[e + 1] * expf(sG[r] - sG[s0 + 1]) : 0.0f;
            const uint32_t p = tiles::pack_bf16x2(y0, y1);
            *(uint32_t *)(sdSc + tiles::swz128(r, 2 * s0)) = p;
            *(uint16_t *)(sdScT + tiles::swz128(s0, 2 * r)) = (uint16_t)p;
            *(uint16_t *)(sdScT + tiles::swz128(s0 + 1, 2 * r)) = (uint16_t)(p >> 16);
        }
    }
    tiles::fence_proxy_async(); // dSc, dScᵀ and q's, k's zeroed rows before the tensor cores read them
    __syncthreads();
    tiles::wgmma_pin(a0);
    tiles::wgmma_fence();
    { // warpgroup 0: dq += dSc k; warpgroup 1: dk += dScᵀ q (both A K-major, B N-major)
        const uint32_t xa = g == 0 ? adSc : adScT, yb = g == 0 ? ak : aq;
#pragma unroll
        for (int kk = 0; kk < GDN_L / 16; kk++) {
            tiles::wgmma_64x64<0, 1>(a0, tiles::wgmma_desc(xa + kk * 32, 16, 1024, 1),
                                     tiles::wgmma_desc(yb + kk * 2048, TILE, 1024, 1));
        }
    }
    tiles::wgmma_commit();
    tiles::wgmma_wait<0>();
    // outputs: warpgroup 0 dq, dW (a whole chunk's through buffer 0's first two tiles, free now) and Σ dq ∘ q a row;
    // warpgroup 1 dk's fp32 part and −Σ dk ∘ k a row
    char *sdq = sm, *sdW = sm + TILE;
    const char *sqk = g == 0 ? sq : sk;
    float gam[2] = {0.0f, 0.0f}; // rows 16wq + acc_row(0), + 8
#pragma unroll
    for (int e = 0; e < 32; e += 2) {
        const int i = e & 3, r = 16 * wq + tiles::acc_row(i), n = tiles::acc_col(e >> 2, i), col = kb + n;
        const uint32_t off = tiles::swz128(r, 2 * n), qk = *(const uint32_t *)(sqk + off);
        const long o = (row0 + (long)r * H) * K + col;
        if (g == 0) {
            gam[i >> 1] += a0[e] * tiles::bf_lo(qk) + a0[e + 1] * tiles::bf_hi(qk);
            if (nv == GDN_L) {
                *(uint32_t *)(sdq + off) = tiles::pack_bf16x2(a0[e], a0[e + 1]);
                *(uint32_t *)(sdW + off) = tiles::pack_bf16x2(-a1[e], -a1[e + 1]);
            } else {
                chunk_put2(dq + o, a0[e], a0[e + 1], r < nv, r < nv);
                chunk_put2(dW + o, -a1[e], -a1[e + 1], r < nv, r < nv);
            }
        } else {
            gam[i >> 1] -= a0[e] * tiles::bf_lo(qk) + a0[e + 1] * tiles::bf_hi(qk);
            if (r < nv) { *(float2 *)(dk_part + o) = make_float2(a0[e], a0[e + 1]); }
        }
    }
    // row sums: the quad's four lanes, then the two warpgroups; ext and sdot over the CTA, in fixed orders
    gdn_dqk_rowsums(sred, gam, ext, sdot, g, wq);
    tiles::fence_proxy_async(); // dq's and dW's tiles before the copy engine reads them
    __syncthreads();
    if (threadIdx.x == 0 && nv == GDN_L) {
        tiles::tma_store_3d(&tmDq, base, kb, h, tok);
        tiles::tma_store_3d(&tmDW, base + TILE, kb, h, tok);
        tiles::bulk_commit();
    }
    gdn_dqk_dgam(dgam_part, sred, nv, GL, row0, H, KT, kt);
    if (threadIdx.x == 0 && nv == GDN_L) { tiles::bulk_wait_read(); } // (before the CTA's shared memory goes)
}
static size_t gdn_dqk_wg_smem() {
    return (2 * 5 + 2) * (size_t)GDN_WG_TILE + (4 * GDN_L + 16) * sizeof(float) + 3 * sizeof(uint64_t) + 1024;
}
#endif

// grid (slots·H), GDN_WY_THREADS threads (x = slot·H + h): the UT transform's backward. dk (tok,H,K) = dk_part +
// β (Dm k) + Dmᵀ (β k) + β e^G dKt; dv (view, token stride dv_stride) = β Tᵀ dVn; dbeta (tok,H); dg (tok,H) =
// dL/d(log α) (reverse cumsum of dL/dG). Warp w: rows 16·(w & 3) of every 64-wide output, the columns 32·(w >> 2) ..
// + 31 (8 warps: each 64×64 product split over twice the warps of the first version, whose 4 warps a CTA left the SM
// with 12 warps to hide the staging's round trips; the elements' sums are unchanged, only dβ's and dG's per-row
// partials now add the two column halves). The first V tile of dVn and v is staged with k and T.
#define GDN_WY_THREADS 256
#ifndef GDN_WY_MINB
#define GDN_WY_MINB 3 // CTAs an SM: 80 registers, 24 warps an SM (2: 128 registers, 0.83 ms at H=16 on an H100; 3: 0.71)
#endif
__global__ void __launch_bounds__(GDN_WY_THREADS, GDN_WY_MINB)
    gdn_chunk_wy_kernel(floatX *dk, floatX *dv, int dv_stride, float *dbeta, float *dg, const floatX *k, const floatX *v,
                        int v_stride, const float *beta, const float *Gc, const floatX *dW, const floatX *dvn,
                        const float *dk_part, const float *dgam_part, const float *Tm, const int *cu_seqlens, int B,
                        int T, int H, int K, int V) {
    extern __shared__ __align__(16) char gdn_smem[];
    int b, c;
    ChunkSeq seq;
    const int h = blockIdx.x % H;
    if (!chunk_at_slot<GDN_L>(cu_seqlens, B, T, blockIdx.x / H, &b, &c, &seq)) { return; }
    const int t0 = c * GDN_L, nv = min(GDN_L, seq.len - t0);
    const int Kp = gdn_kp(K), ldk = Kp + 8, KT = Kp / GDN_T, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int mt = w & 3, ch = w >> 2, c0 = 32 * ch; // the warp's 16 rows 16·mt and its 32 columns c0 .. c0 + 31
    const long tok = seq.tok0 + t0, row0 = tok * H + h;
    const long vrow0 = tok * v_stride + (long)h * V, dvrow0 = tok * dv_stride + (long)h * V;
    const int TILE = GDN_L * GDN_LD;
    floatX *sk = (floatX *)gdn_smem, *sTx = sk + GDN_L * ldk, *t1 = sTx + TILE, *t2 = t1 + TILE, *sDm = t2 + TILE;
    float *sKKG = (float *)(sDm + TILE), *sb = sKKG + GDN_L * GDN_LDP; // sKKG: (64, 65), later dk_part (64, 68)
    float *sG = sb + GDN_L, *srs = sG + GDN_L, *swy = srs + GDN_L, *seG = swy + GDN_L; // seG: e^{G_r}
    float *sdb = seG + GDN_L, *sdgm = sdb + 2 * GDN_L; // (2, 64) each: a column half's per-row partials
    chunk_stage<false>(sk, ldk, k + row0 * K, (long)H * K, nv, K, GDN_L, Kp, (const float *)NULL);
    gdn_load_G(sG, Gc, row0, H, nv);
    if (threadIdx.x < GDN_L) { sb[threadIdx.x] = threadIdx.x < nv ? beta[row0 + (long)threadIdx.x * H] : 0.0f; }
    chunk_stage(sTx, GDN_LD, Tm + ((seq.cslot + c) * H + h) * GDN_L * GDN_L, (long)GDN_L, GDN_L, GDN_L, GDN_L, GDN_L,
                (const float *)NULL); // T = (I + A)⁻¹ as the prep kernel left it
    auto stage_v = [&](int vb) { // dVn's and v's 64-wide tile at column vb into t1, t2
        chunk_stage<false>(t1, GDN_LD, dvn + row0 * V + vb, (long)H * V, nv, V - vb, GDN_L, GDN_T, (const float *)NULL);
        chunk_stage<false>(t2, GDN_LD, v + vrow0 + vb, (long)v_stride, nv, V - vb, GDN_L, GDN_T, (const float *)NULL);
    };
    // dW's K tiles for dTm's second product, tile i in slot i mod 3 (sDm, free until dA; t1 and t2, free after the V
    // loop): tile 0 comes with the first copies, tiles 1 and 2 are issued after the V loop, tile i + 3 when tile i is
    // read, so that each lands under the products before it
    auto dw_slot = [&](int i) { return i % 3 == 0 ? sDm : i % 3 == 1 ? t1 : t2; };
    auto stage_dw = [&](int i) {
        chunk_stage<false>(dw_slot(i), GDN_LD, dW + row0 * K + i * GDN_T, (long)H * K, nv, K - i * GDN_T, GDN_L,
                           GDN_T, (const float *)NULL);
        tiles::cp_async_commit();
    };
    stage_v(0);
    stage_dw(0);
    chunk_sync();
    if (threadIdx.x < GDN_L) { seG[threadIdx.x] = expf(sG[threadIdx.x]); }
    gdn_chunk_kkg(NULL, sKKG, sk, ldk, Kp, sb, sG);
    float db[2] = {0.0f, 0.0f}, dgm[2] = {0.0f, 0.0f}; // this lane's rows 16·mt + g and 16·mt + g + 8
    // dTm = dW Ktᵀ + dVn Vtᵀ = (dW kᵀ diag(e^G) + dVn vᵀ) diag(β): the two products apart, the column scales after
    float aTv[4][4] = {}, aTk[4][4] = {};
    for (int vb = 0; vb < V; vb += GDN_T) {
        if (vb > 0) {
            stage_v(vb);
            chunk_sync();
        }
        tiles::warp_gemm<4, false, true>(aTv, t1 + 16 * mt * GDN_LD, GDN_LD, t2 + c0 * GDN_LD, GDN_LD, GDN_T);
        float aV[4][4] = {}; // dVt = Tᵀ dVn
        tiles::warp_gemm<4, true, false>(aV, sTx + 16 * mt, GDN_LD, t1 + c0, GDN_LD, GDN_L);
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int i = 0; i < 4; i += 2) {
                const int r = 16 * mt + tiles::acc_row(i), cc = c0 + tiles::acc_col(j, i), col = vb + cc;
                chunk_put2(dv + dvrow0 + (long)r * dv_stride + col, sb[r] * aV[j][i], sb[r] * aV[j][i + 1],
                           r < nv && col < V, r < nv && col + 1 < V);
                db[i >> 1] += aV[j][i] * (float)t2[r * GDN_LD + cc] + aV[j][i + 1] * (float)t2[r * GDN_LD + cc + 1];
            }
        }
        chunk_sync();
    }
    for (int i = 1; i < KT && i < 3; i++) { stage_dw(i); } // (the V loop ended on a barrier: t1, t2 are free)
    for (int i = 0; i < KT; i++) {
        const int ahead = min(2, KT - 1 - i); // tiles issued after tile i
        if (ahead == 2) { tiles::cp_async_wait<2>(); } else if (ahead == 1) { tiles::cp_async_wait<1>(); }
        else { tiles::cp_async_wait<0>(); }
        __syncthreads(); // tile i landed
        tiles::warp_gemm<4, false, true>(aTk, dw_slot(i) + 16 * mt * GDN_LD, GDN_LD, sk + c0 * ldk + i * GDN_T, ldk,
                                         GDN_T);
        if (i + 3 < KT) {
            __syncthreads(); // tile i is read: its slot takes tile i + 3
            stage_dw(i + 3);
        }
    }
    __syncthreads(); // every dW tile is read: sDm, t1, t2 are free for dA
    // dA = −(Tᵀ dTm Tᵀ) on the strict lower triangle
#pragma unroll
    for (int j = 0; j < 4; j++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int s = c0 + tiles::acc_col(j, i);
            t1[(16 * mt + tiles::acc_row(i)) * GDN_LD + s] = (floatX)(sb[s] * (aTv[j][i] + seG[s] * aTk[j][i]));
        }
    }
    chunk_sync();
    {
        float aX[4][4] = {};
        tiles::warp_gemm<4, true, false>(aX, sTx + 16 * mt, GDN_LD, t1 + c0, GDN_LD, GDN_L);
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                t2[(16 * mt + tiles::acc_row(i)) * GDN_LD + c0 + tiles::acc_col(j, i)] = (floatX)aX[j][i];
            }
        }
    }
    chunk_sync();
    {
        float aA[4][4] = {};
        tiles::warp_gemm<4, false, true>(aA, t2 + 16 * mt * GDN_LD, GDN_LD, sTx + c0 * GDN_LD, GDN_LD, GDN_L);
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = 16 * mt + tiles::acc_row(i), s = c0 + tiles::acc_col(j, i);
                const float dA = s < r ? -aA[j][i] : 0.0f;
                const float kkg = sKKG[r * 65 + s];
                sDm[r * GDN_LD + s] = (floatX)(s < r ? dA * expf(sG[r] - sG[s]) : 0.0f);
                db[i >> 1] += dA * kkg;
                sKKG[r * 65 + s] = dA * sb[r] * kkg; // dA ∘ A: its row sums minus its column sums go to dG
            }
        }
    }
    chunk_sync();
    if (threadIdx.x < 2 * GDN_L) { // thread r < 64: row r's sum; thread 64 + r: column r's (into srs, free until dL/dG)
        const int r = threadIdx.x & (GDN_L - 1), col = threadIdx.x >> 6;
        float x = 0.0f;
        for (int s = 0; s < GDN_L; s++) { x += sKKG[col ? s * 65 + r : r * 65 + s]; }
        (col ? srs : swy)[r] = x;
    }
    for (int i = threadIdx.x; i < GDN_L * GDN_L; i += blockDim.x) { // t2 = diag(β) Dm: Dmᵀ (β k) = (diag(β) Dm)ᵀ k
        const int r = i >> 6, cc = i & 63;
        t2[r * GDN_LD + cc] = (floatX)((float)sDm[r * GDN_LD + cc] * sb[r]);
    }
    __syncthreads(); // every reader of sKKG is done: it takes dk_part's tiles next
    for (int kb = 0; kb < Kp; kb += GDN_T) {
        chunk_stage<false>(t1, GDN_LD, dW + row0 * K + kb, (long)H * K, nv, K - kb, GDN_L, GDN_T, (const float *)NULL);
        chunk_stage<false>(sKKG, GDN_LDP, dk_part + row0 * K + kb, (long)H * K, nv, K - kb, GDN_L, GDN_T,
                           (const float *)NULL); // fp32
        chunk_sync();
        float a1[4][4] = {}, a2[4][4] = {}, a3[4][4] = {};
        tiles::warp_gemm<4, false, false>(a1, sDm + 16 * mt * GDN_LD, GDN_LD, sk + kb + c0, ldk, GDN_L); // Dm k
        tiles::warp_gemm<4, true, false>(a2, t2 + 16 * mt, GDN_LD, sk + kb + c0, ldk, GDN_L);            // Dmᵀ (β k)
        tiles::warp_gemm<4, true, false>(a3, sTx + 16 * mt, GDN_LD, t1 + c0, GDN_LD, GDN_L);             // dKt = Tᵀ dW
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int i = 0; i < 4; i += 2) {
                const int r = 16 * mt + tiles::acc_row(i), cc = c0 + tiles::acc_col(j, i), col = kb + cc;
                const float eG = seG[r], sbr = sb[r];
                float y[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float kv = (float)sk[r * ldk + col + e], x3 = a3[j][i + e];
                    y[e] = sKKG[r * GDN_LDP + cc + e] + sbr * a1[j][i + e] + a2[j][i + e] + sbr * eG * x3;
                    db[i >> 1] += eG * kv * x3;
                    dgm[i >> 1] += sbr * eG * kv * x3;
                }
                chunk_put2(dk + (row0 + (long)r * H) * K + col, y[0], y[1], r < nv && col < K, r < nv && col + 1 < K);
            }
        }
        chunk_sync();
    }
#pragma unroll
    for (int x = 0; x < 2; x++) {
        db[x] += __shfl_xor_sync(0xffffffffu, db[x], 1);
        db[x] += __shfl_xor_sync(0xffffffffu, db[x], 2);
        dgm[x] += __shfl_xor_sync(0xffffffffu, dgm[x], 1);
        dgm[x] += __shfl_xor_sync(0xffffffffu, dgm[x], 2);
    }
    if ((lane & 3) == 0) {
        const int r = 16 * mt + (lane >> 2);
        sdb[ch * GDN_L + r] = db[0];
        sdb[ch * GDN_L + r + 8] = db[1];
        sdgm[ch * GDN_L + r] = dgm[0];
        sdgm[ch * GDN_L + r + 8] = dgm[1];
    }
    chunk_sync();
    float dG = 0.0f; // thread r < 64: dL/dG_r in full (0 past the sequence)
    if (threadIdx.x < nv) {
        const int r = threadIdx.x;
        dG = (sdgm[r] + sdgm[GDN_L + r]) + (swy[r] - srs[r]);
        for (int i = 0; i < KT; i++) { dG += dgam_part[(row0 + (long)r * H) * KT + i]; }
        dbeta[row0 + (long)r * H] = sdb[r] + sdb[GDN_L + r];
    }
    // G_r = Σ_{s ≤ r} g_s: dg_s = Σ_{r ≥ s} dG_r, a suffix scan in each of two warps, the first adding the second's
    if (threadIdx.x < GDN_L) {
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const float y = __shfl_down_sync(0xffffffffu, dG, d);
            if (lane + d < 32) { dG += y; }
        }
        if (threadIdx.x == 32) { sKKG[0] = dG; } // warp 1's total (sKKG is free after the K loop's last barrier)
    }
    __syncthreads();
    if (threadIdx.x < nv) { dg[row0 + (long)threadIdx.x * H] = dG + (threadIdx.x < 32 ? sKKG[0] : 0.0f); }
}
static size_t gdn_wy_smem(int K) {
    const int ldk = gdn_kp(K) + 8;
    return ((size_t)GDN_L * ldk + 4 * (size_t)GDN_L * GDN_LD) * sizeof(floatX) +
           (GDN_L * GDN_LDP + 9 * GDN_L) * sizeof(float);
}

// ----------------------------------------------------------------------------------------------------------------
// the launchers of the chunked recurrence

// tok: B·T tokens in the fixed layout, T in the packed one; slots: chunk_slots (chunk_common.cuh)
typedef struct {
    floatX *W, *U, *Pm, *hst, *vn; // (tok,H,K), (tok,H,V), (slots,H,64,64), (slots,H,K,V), (tok,H,V)
    float *Tm, *Gc;                // (slots,H,64,64), (tok,H)
} GDNChunkBufs;

typedef struct {
    floatX *dhst, *dq;                      // (slots,H,K,V), (tok,H,K)
    floatX *dvn, *dW;                       // (tok,H,V), (tok,H,K)
    float *dk_part, *dgam_part;             // (tok,H,K), (tok,H,KT)
} GDNChunkGrads;

// T and Gc of B sequences of T tokens, or (packed) of sequences of T tokens in all: what the backward's recompute
// starts from, so the layer keeps them with its activations
static void gdn_chunk_tg_take(float **Tm, float **Gc, DeviceArena *ar, int B, int T, int H, bool packed) {
    *Tm = TAKE_F(ar, (size_t)chunk_slots<GDN_L>(packed, B, T) * H * GDN_L * GDN_L);
    *Gc = TAKE_F(ar, (size_t)(packed ? 1 : B) * T * H);
}
// the buffers for B sequences of T tokens, or (packed) for sequences of T tokens in all. own_t: Tm and Gc here too;
// false leaves them NULL for the caller to point at the ones it keeps (gdn_chunk_tg_take)
static void gdn_chunk_bufs_take(GDNChunkBufs *f, DeviceArena *ar, int B, int T, int H, int K, int V, bool packed,
                                bool own_t) {
    const size_t BTH = (size_t)(packed ? 1 : B) * T * H, NS = chunk_slots<GDN_L>(packed, B, T);
    f->W = TAKE_X(ar, BTH * K);
    f->U = TAKE_X(ar, BTH * V);
    f->Pm = TAKE_X(ar, NS * H * GDN_L * GDN_L);
    f->hst = TAKE_X(ar, NS * H * K * V);
    f->vn = TAKE_X(ar, BTH * V);
    f->Tm = NULL;
    f->Gc = NULL;
    if (own_t) { gdn_chunk_tg_take(&f->Tm, &f->Gc, ar, B, T, H, packed); }
}
static void gdn_chunk_grads_take(GDNChunkGrads *g, DeviceArena *ar, int B, int T, int H, int K, int V, bool packed) {
    const size_t BTH = (size_t)(packed ? 1 : B) * T * H, NS = chunk_slots<GDN_L>(packed, B, T);
    g->dhst = TAKE_X(ar, NS * H * K * V);
    g->dq = TAKE_X(ar, BTH * K);
    g->dvn = TAKE_X(ar, BTH * V);
    g->dk_part = TAKE_F(ar, BTH * K);
    g->dW = TAKE_X(ar, BTH * K);
    g->dgam_part = TAKE_F(ar, BTH * (gdn_kp(K) / GDN_T));
}

static void gdn_check_dims(int K, int V) {
    if (K < 1 || K > GDN_MAX_K || V < 1) {
        fail_with_hint("use a GDN key dim K of at most 256 (gkNN)", "the GPU GDN kernels take K ≤ %d (got K=%d V=%d)",
                       GDN_MAX_K, K, V);
    }
    size_t worst = gdn_state_smem(K);
    const size_t others[4] = {gdn_prep_smem(K), gdn_dstate_smem(K), gdn_wy_smem(K), gdn_output_smem(K)};
    for (int i = 0; i < 4; i++) { worst = others[i] > worst ? others[i] : worst; }
    if (worst > 227 * 1024) {
        fail_with_hint("use the bf16 build (make train_m2rnn) for this K, or a smaller gkNN", "the GDN chunk kernels "
                       "need %zu bytes of shared memory at K=%d in this build (227 KB available)", worst, K);
    }
}

// the state kernel's 16-row blocks a warp: one covers K ≤ 128 (half the accumulators of two: two CTAs an SM instead
// of one); the dstate kernel takes the same choice
static inline int gdn_state_mr(int K) { return gdn_kp(K) <= 128 ? 1 : 2; }

// gdn_state_wgmma: −1 (default) the sm_90a forms (state, output, dstate, dqk) wherever they apply (unless
// M2RNN_GDN_WGMMA=0), 0 never (tests and benchmarks compare the two forms)
static int gdn_state_wgmma = -1;

#if !FLOATX_IS_FP32
// the tensor maps of the sm_90a kernels: a (tok,H,D) tensor in boxes of 64 tokens × `cols` of one head (gdn_map_tok),
// a per-chunk (slots,H,R,D) one as rows of D in boxes of rows × cols (gdn_map_rows); ok turns false where the driver
// refuses a map (the launcher then takes the mma.sync form)
typedef struct {
    uint64_t ntok, ns; // tokens in the (tok,H,·) layout, chunk slots
    int H;
    bool ok;
} GDNMaps;
static GDNMaps gdn_maps(const int *cu_seqlens, int B, int T, int H) {
    const bool packed = cu_seqlens != NULL;
    return (GDNMaps){(uint64_t)(packed ? 1 : B) * T, (uint64_t)chunk_slots<GDN_L>(packed, B, T), H, true};
}
static void gdn_map_tok(GDNMaps *m, CUtensorMap *t, const floatX *p, int D, uint32_t cols, CUtensorMapSwizzle sw) {
    m->ok = m->ok && m->ntok < (1ull << 31); // (the kernels' box coordinates are 32-bit)
    const uint64_t dims[3] = {(uint64_t)D, (uint64_t)m->H, m->ntok};
    const uint64_t strides[2] = {D * sizeof(floatX), m->H * D * sizeof(floatX)};
    const uint32_t box[3] = {cols, 1, GDN_L};
    m->ok = m->ok && tma_map_bf16(t, p, 3, dims, strides, box, sw);
}
static void gdn_map_rows(GDNMaps *m, CUtensorMap *t, const floatX *p, int D, int R, uint32_t cols, uint32_t rows,
                         CUtensorMapSwizzle sw) {
    const uint64_t dims[2] = {(uint64_t)D, m->ns * m->H * R}, strides[1] = {D * sizeof(floatX)};
    const uint32_t box[2] = {cols, rows};
    m->ok = m->ok && dims[1] < (1ull << 31);
    m->ok = m->ok && tma_map_bf16(t, p, 2, dims, strides, box, sw);
}
#define GDN_SW128 CU_TENSOR_MAP_SWIZZLE_128B
#define GDN_SW64 CU_TENSOR_MAP_SWIZZLE_64B

// the sm_90a serial kernels apply to K = 128 or 256, V a multiple of 8 and 16-byte aligned tensors (ptrs: their
// addresses or'ed), on a compute capability 9.0 device, unless switched off
static bool gdn_wg_applies(int K, int V, uintptr_t ptrs) {
    return env_on_unless_0(&gdn_state_wgmma, "M2RNN_GDN_WGMMA") && (K == 128 || K == 256) && V % 8 == 0 &&
           (ptrs & 15) == 0 && gpu_is_sm90();
}
// the sm_90a state kernel where it applies (bf16, K = 128 or 256, V a multiple of 8, tensors 16-byte aligned, a
// compute capability 9.0 device, the driver's tensor maps): true if launched
static bool gdn_chunk_state_wg(GDNChunkBufs *f, float *S_final, long sf_stride, const float *S0, long s0_stride,
                               const floatX *k, const int *cu_seqlens, int B, int T, int H, int K, int V,
                               cudaStream_t stream) {
    const uintptr_t ptrs = (uintptr_t)f->W | (uintptr_t)k | (uintptr_t)f->U | (uintptr_t)f->hst | (uintptr_t)f->vn;
    if (!gdn_wg_applies(K, V, ptrs)) { return false; }
    GDNMaps m = gdn_maps(cu_seqlens, B, T, H);
    CUtensorMap tmW, tmK, tmU, tmH, tmV;
    gdn_map_tok(&m, &tmW, f->W, K, 64, GDN_SW128);
    gdn_map_tok(&m, &tmK, k, K, 64, GDN_SW128);
    gdn_map_tok(&m, &tmU, f->U, V, 64, GDN_SW128);
    gdn_map_tok(&m, &tmV, f->vn, V, 64, GDN_SW128);
    gdn_map_rows(&m, &tmH, f->hst, V, K, 32, K, GDN_SW64); // the state's two halves of 32 columns
    if (!m.ok) { return false; }
    auto state = K == 128 ? gdn_chunk_state_wg_kernel<1> : gdn_chunk_state_wg_kernel<2>;
    const size_t smem = gdn_state_wg_smem(K);
    kernel_smem_limit((const void *)state, smem);
    state<<<dim3(CEIL_DIV(V, GDN_T), H, B), 256, smem, stream>>>(f->vn, S_final, sf_stride, S0, s0_stride, tmW, tmK,
                                                                  tmU, tmH, tmV, f->Gc, cu_seqlens, T, H, V);
    cudaCheck(cudaGetLastError());
    return true;
}
#endif

// the serial pass: f->hst, f->vn (and S_final) from f->W, f->U, f->Gc and the normalized k
static void gdn_chunk_state(GDNChunkBufs *f, float *S_final, long sf_stride, const float *S0, long s0_stride,
                            const floatX *k, const int *cu_seqlens, int B, int T, int H, int K, int V,
                            cudaStream_t stream) {
#if !FLOATX_IS_FP32
    if (gdn_chunk_state_wg(f, S_final, sf_stride, S0, s0_stride, k, cu_seqlens, B, T, H, K, V, stream)) { return; }
#endif
    const bool bulk = gdn_rows_bulk(K, V, (uintptr_t)f->W | (uintptr_t)k | (uintptr_t)f->U | (uintptr_t)f->hst);
    auto state = gdn_state_mr(K) == 1 ? (bulk ? gdn_chunk_state_kernel<1, true> : gdn_chunk_state_kernel<1, false>)
                                      : (bulk ? gdn_chunk_state_kernel<2, true> : gdn_chunk_state_kernel<2, false>);
    const size_t smem = gdn_state_smem(K);
    kernel_smem_limit((const void *)state, smem);
    state<<<dim3(CEIL_DIV(V, GDN_T), H, B), 256, smem, stream>>>(f->hst, f->vn, S_final, sf_stride, S0, s0_stride,
                                                                  f->W, f->U, k, f->Gc, cu_seqlens, T, H, K, V);
    cudaCheck(cudaGetLastError());
}

#if !FLOATX_IS_FP32
// the sm_90a output kernel where it applies (as gdn_chunk_state_wg): true if launched
static bool gdn_chunk_output_wg(floatX *o, const GDNChunkBufs *f, const floatX *q, const int *cu_seqlens, int B, int T,
                                int H, int K, int V, cudaStream_t stream) {
    const uintptr_t ptrs = (uintptr_t)o | (uintptr_t)q | (uintptr_t)f->hst | (uintptr_t)f->Pm | (uintptr_t)f->vn;
    if (!gdn_wg_applies(K, V, ptrs)) { return false; }
    GDNMaps m = gdn_maps(cu_seqlens, B, T, H);
    CUtensorMap tmQ, tmH, tmP, tmVn, tmO;
    gdn_map_tok(&m, &tmQ, q, K, 64, GDN_SW128);
    gdn_map_tok(&m, &tmVn, f->vn, V, 64, GDN_SW128);
    gdn_map_tok(&m, &tmO, o, V, 64, GDN_SW128);
    gdn_map_rows(&m, &tmH, f->hst, V, K, 64, K, GDN_SW128);
    gdn_map_rows(&m, &tmP, f->Pm, GDN_L, GDN_L, 64, 64, GDN_SW128);
    if (!m.ok) { return false; }
    auto out = K == 128 ? gdn_chunk_output_wg_kernel<1> : gdn_chunk_output_wg_kernel<2>;
    const size_t smem = gdn_output_wg_smem(K);
    kernel_smem_limit((const void *)out, smem);
    out<<<(unsigned)(m.ns * H * CEIL_DIV(V, GDN_T)), 128, smem, stream>>>(o, tmQ, tmH, tmP, tmVn, tmO, f->Gc,
                                                                        1.0f / sqrtf((float)K), cu_seqlens, B, T, H, V);
    cudaCheck(cudaGetLastError());
    return true;
}
#endif

// the parallel pass: o (tok,H,V) from the normalized q, f->hst, f->Pm, f->vn, f->Gc
static void gdn_chunk_output(floatX *o, const GDNChunkBufs *f, const floatX *q, const int *cu_seqlens, int B, int T,
                             int H, int K, int V, cudaStream_t stream) {
#if !FLOATX_IS_FP32
    if (gdn_chunk_output_wg(o, f, q, cu_seqlens, B, T, H, K, V, stream)) { return; }
#endif
    const long NS = chunk_slots<GDN_L>(cu_seqlens != NULL, B, T);
    const size_t smem = gdn_output_smem(K);
    kernel_smem_limit((const void *)gdn_chunk_output_kernel, smem);
    gdn_chunk_output_kernel<<<(unsigned)(NS * H * CEIL_DIV(V, GDN_T)), 128, smem, stream>>>(
        o, q, f->hst, f->Pm, f->vn, f->Gc, 1.0f / sqrtf((float)K), cu_seqlens, B, T, H, K, V);
    cudaCheck(cudaGetLastError());
}

// o (tok,H,V) from q, k (tok,H,K) normalized, v (view, token stride v_stride), beta and g (tok,H); f: the chunk
// buffers (filled: the backward reads them; Tm and Gc are what gdn_chunk_recompute starts from). nm: NULL, or q and k
// are raw views and the prep kernel normalizes them into nm's buffers (GDNQKNorm). S0 / S_final: per-sequence fp32
// states (stride in floats) or NULL; they may be the same memory (the decode advance). cu_seqlens NULL: B sequences of
// T tokens; else (device, B+1) packed sequences of T tokens in all (chunk_common.cuh), each restarting from its own S0
// (or zero)
static void gdn_chunk_forward(floatX *o, GDNChunkBufs *f, float *S_final, long sf_stride, const float *S0,
                              long s0_stride, const floatX *q, const floatX *k, const GDNQKNorm *nm, const floatX *v,
                              int v_stride, const float *beta, const float *g, const int *cu_seqlens, int B, int T,
                              int H, int K, int V, cudaStream_t stream) {
    gdn_check_dims(K, V);
    const long NS = chunk_slots<GDN_L>(cu_seqlens != NULL, B, T);
    const size_t s1 = gdn_prep_smem(K);
    kernel_smem_limit((const void *)gdn_chunk_prep_kernel, s1);
    const GDNQKNorm none = {0, NULL, NULL, NULL, NULL};
    gdn_chunk_prep_kernel<<<(unsigned)(NS * H), 256, s1, stream>>>(f->W, f->U, f->Pm, f->Tm, f->Gc, nm ? *nm : none,
                                                                   q, k, v, v_stride, beta, g, false, cu_seqlens, B, T,
                                                                   H, K, V);
    cudaCheck(cudaGetLastError());
    const floatX *qn = nm ? nm->qn : q, *kn = nm ? nm->kn : k;
    gdn_chunk_state(f, S_final, sf_stride, S0, s0_stride, kn, cu_seqlens, B, T, H, K, V, stream);
    gdn_chunk_output(o, f, qn, cu_seqlens, B, T, H, K, V, stream);
}

// the backward's recompute of the forward's W, U, P, chunk-start states and Vn into f, from the T and Gc the forward
// left in f (the caller keeps them; everything else in f may have been overwritten since) and the normalized q, k:
// no inversion, bit for bit the forward's buffers
static void gdn_chunk_recompute(GDNChunkBufs *f, const float *S0, long s0_stride, const floatX *q, const floatX *k,
                                const floatX *v, int v_stride, const float *beta, const int *cu_seqlens, int B, int T,
                                int H, int K, int V, cudaStream_t stream) {
    gdn_check_dims(K, V);
    const long NS = chunk_slots<GDN_L>(cu_seqlens != NULL, B, T);
    const size_t s1 = gdn_prep_smem(K);
    kernel_smem_limit((const void *)gdn_chunk_prep_kernel, s1);
    const GDNQKNorm none = {0, NULL, NULL, NULL, NULL};
    gdn_chunk_prep_kernel<<<(unsigned)(NS * H), 256, s1, stream>>>(f->W, f->U, f->Pm, f->Tm, f->Gc, none, q, k, v,
                                                                   v_stride, beta, NULL, true, cu_seqlens, B, T, H, K,
                                                                   V);
    cudaCheck(cudaGetLastError());
    gdn_chunk_state(f, NULL, 0, S0, s0_stride, k, cu_seqlens, B, T, H, K, V, stream);
}

#if !FLOATX_IS_FP32
// the sm_90a dstate kernel where it applies (as gdn_chunk_state_wg): true if launched
static bool gdn_chunk_dstate_wg(GDNChunkGrads *gr, float *dS0, long d0_stride, const float *dS_final, long df_stride,
                                const floatX *dout, const GDNChunkBufs *f, const floatX *q, const floatX *k,
                                const int *cu_seqlens, int B, int T, int H, int K, int V, cudaStream_t stream) {
    const uintptr_t ptrs = (uintptr_t)q | (uintptr_t)k | (uintptr_t)f->W | (uintptr_t)f->Pm | (uintptr_t)dout |
                           (uintptr_t)gr->dhst | (uintptr_t)gr->dvn;
    if (!gdn_wg_applies(K, V, ptrs)) { return false; }
    GDNMaps m = gdn_maps(cu_seqlens, B, T, H);
    CUtensorMap tmQ, tmK, tmW, tmP, tmDo, tmDh, tmDv;
    gdn_map_tok(&m, &tmQ, q, K, 64, GDN_SW128);
    gdn_map_tok(&m, &tmK, k, K, 64, GDN_SW128);
    gdn_map_tok(&m, &tmW, f->W, K, 64, GDN_SW128);
    gdn_map_tok(&m, &tmDo, dout, V, 32, GDN_SW64); // do's two halves of 32 columns
    gdn_map_tok(&m, &tmDv, gr->dvn, V, 64, GDN_SW128);
    gdn_map_rows(&m, &tmP, f->Pm, GDN_L, GDN_L, 64, 64, GDN_SW128);
    gdn_map_rows(&m, &tmDh, gr->dhst, V, K, 32, K, GDN_SW64);
    if (!m.ok) { return false; }
    auto dstate = K == 128 ? gdn_chunk_dstate_wg_kernel<1> : gdn_chunk_dstate_wg_kernel<2>;
    const size_t smem = gdn_dstate_wg_smem(K);
    kernel_smem_limit((const void *)dstate, smem);
    dstate<<<dim3(CEIL_DIV(V, GDN_T), H, B), 256, smem, stream>>>(gr->dvn, dS0, d0_stride, dS_final, df_stride, tmQ,
                                                                   tmK, tmW, tmP, tmDo, tmDh, tmDv, f->Gc,
                                                                   1.0f / sqrtf((float)K), cu_seqlens, T, H, V);
    cudaCheck(cudaGetLastError());
    return true;
}
#endif

// the reverse serial pass: gr->dhst, gr->dvn (and dS0) from dout, dS_final and the forward's (or recomputed) f
static void gdn_chunk_dstate(GDNChunkGrads *gr, float *dS0, long d0_stride, const float *dS_final, long df_stride,
                             const floatX *dout, const GDNChunkBufs *f, const floatX *q, const floatX *k,
                             const int *cu_seqlens, int B, int T, int H, int K, int V, cudaStream_t stream) {
#if !FLOATX_IS_FP32
    if (gdn_chunk_dstate_wg(gr, dS0, d0_stride, dS_final, df_stride, dout, f, q, k, cu_seqlens, B, T, H, K, V,
                            stream)) {
        return;
    }
#endif
    const size_t smem = gdn_dstate_smem(K);
    const bool bulk = gdn_rows_bulk(K, V, (uintptr_t)k | (uintptr_t)q | (uintptr_t)f->W | (uintptr_t)f->Pm |
                                              (uintptr_t)dout | (uintptr_t)gr->dhst);
    auto dstate = gdn_state_mr(K) == 1 ? (bulk ? gdn_chunk_dstate_kernel<1, true> : gdn_chunk_dstate_kernel<1, false>)
                                       : (bulk ? gdn_chunk_dstate_kernel<2, true> : gdn_chunk_dstate_kernel<2, false>);
    kernel_smem_limit((const void *)dstate, smem);
    dstate<<<dim3(CEIL_DIV(V, GDN_T), H, B), 256, smem, stream>>>(gr->dhst, gr->dvn, dS0, d0_stride, dS_final,
                                                                   df_stride, q, k, f->W, f->Pm, dout, f->Gc,
                                                                   1.0f / sqrtf((float)K), cu_seqlens, T, H, K, V);
    cudaCheck(cudaGetLastError());
}

#if !FLOATX_IS_FP32
// the sm_90a dqk kernel where it applies (as gdn_chunk_state_wg): true if launched
static bool gdn_chunk_dqk_wg(GDNChunkGrads *gr, const floatX *dout, const GDNChunkBufs *f, const floatX *q,
                             const floatX *k, const int *cu_seqlens, int B, int T, int H, int K, int V,
                             cudaStream_t stream) {
    const uintptr_t ptrs = (uintptr_t)q | (uintptr_t)k | (uintptr_t)f->vn | (uintptr_t)gr->dvn | (uintptr_t)dout |
                           (uintptr_t)f->hst | (uintptr_t)gr->dhst | (uintptr_t)gr->dq | (uintptr_t)gr->dW;
    if (!gdn_wg_applies(K, V, ptrs)) { return false; }
    GDNMaps m = gdn_maps(cu_seqlens, B, T, H);
    CUtensorMap tmDo, tmVn, tmDvn, tmH, tmDh, tmQ, tmK, tmDq, tmDW;
    gdn_map_tok(&m, &tmDo, dout, V, 64, GDN_SW128);
    gdn_map_tok(&m, &tmVn, f->vn, V, 64, GDN_SW128);
    gdn_map_tok(&m, &tmDvn, gr->dvn, V, 64, GDN_SW128);
    gdn_map_tok(&m, &tmQ, q, K, 64, GDN_SW128);
    gdn_map_tok(&m, &tmK, k, K, 64, GDN_SW128);
    gdn_map_tok(&m, &tmDq, gr->dq, K, 64, GDN_SW128);
    gdn_map_tok(&m, &tmDW, gr->dW, K, 64, GDN_SW128);
    gdn_map_rows(&m, &tmH, f->hst, V, K, 64, 64, GDN_SW128); // a K tile's 64 rows
    gdn_map_rows(&m, &tmDh, gr->dhst, V, K, 64, 64, GDN_SW128);
    if (!m.ok) { return false; }
    const size_t smem = gdn_dqk_wg_smem();
    kernel_smem_limit((const void *)gdn_chunk_dqk_wg_kernel, smem);
    gdn_chunk_dqk_wg_kernel<<<(unsigned)(m.ns * H * (K / GDN_T)), 256, smem, stream>>>(
        gr->dk_part, gr->dgam_part, tmDo, tmVn, tmDvn, tmH, tmDh, tmQ, tmK, tmDq, tmDW, gr->dq, gr->dW, f->Gc,
        1.0f / sqrtf((float)K), cu_seqlens, B, T, H, K, V);
    cudaCheck(cudaGetLastError());
    return true;
}
#endif

// the chunk-parallel gradient pass: gr->dq, gr->dk_part, gr->dW, gr->dgam_part from dout, the forward's (or
// recomputed) f and the reverse pass's gr->dhst, gr->dvn
static void gdn_chunk_dqk(GDNChunkGrads *gr, const floatX *dout, const GDNChunkBufs *f, const floatX *q, const floatX *k,
                          const int *cu_seqlens, int B, int T, int H, int K, int V, cudaStream_t stream) {
#if !FLOATX_IS_FP32
    if (gdn_chunk_dqk_wg(gr, dout, f, q, k, cu_seqlens, B, T, H, K, V, stream)) { return; }
#endif
    const long NS = chunk_slots<GDN_L>(cu_seqlens != NULL, B, T);
    const size_t smem = gdn_dqk_smem();
    kernel_smem_limit((const void *)gdn_chunk_dqk_kernel, smem);
    gdn_chunk_dqk_kernel<<<(unsigned)(NS * H * (gdn_kp(K) / GDN_T)), 256, smem, stream>>>(
        gr->dq, gr->dk_part, gr->dW, gr->dgam_part, q, k, f->vn, gr->dvn, dout, f->hst, gr->dhst, f->Gc,
        1.0f / sqrtf((float)K), cu_seqlens, B, T, H, K, V);
    cudaCheck(cudaGetLastError());
}

// dq, dk (tok,H,K) (written, in gr), dv (view, token stride dv_stride, written), dbeta, dg (tok,H) written; dS0 or
// NULL; from dout (tok,H,V) and dS_final or NULL; f as the forward left it (or recomputed); cu_seqlens as the forward
static void gdn_chunk_backward(floatX *dk, floatX *dv, int dv_stride, float *dbeta, float *dg, GDNChunkGrads *gr,
                               float *dS0, long d0_stride, const float *dS_final, long df_stride, const floatX *dout,
                               const GDNChunkBufs *f, const floatX *q, const floatX *k, const floatX *v, int v_stride,
                               const float *beta, const int *cu_seqlens, int B, int T, int H, int K, int V,
                               cudaStream_t stream) {
    const long NS = chunk_slots<GDN_L>(cu_seqlens != NULL, B, T);
    const size_t s3 = gdn_wy_smem(K);
    kernel_smem_limit((const void *)gdn_chunk_wy_kernel, s3);
    gdn_chunk_dstate(gr, dS0, d0_stride, dS_final, df_stride, dout, f, q, k, cu_seqlens, B, T, H, K, V, stream);
    gdn_chunk_dqk(gr, dout, f, q, k, cu_seqlens, B, T, H, K, V, stream);
    gdn_chunk_wy_kernel<<<(unsigned)(NS * H), GDN_WY_THREADS, s3, stream>>>(
        dk, dv, dv_stride, dbeta, dg, k, v, v_stride, beta, f->Gc, gr->dW, gr->dvn, gr->dk_part, gr->dgam_part, f->Tm,
        cu_seqlens, B, T, H, K, V);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------------------
// one decode token from the fp32 state S (sequence b at b·stride floats, (H,K,V)):
//   p = Sᵀk;  u = β (v − α p);  S ← α S + k uᵀ;  o = scale Sᵀq (the new S)
// grid (CEIL_DIV(V, 64), H, B), 8 warps: a lane owns two columns of a 64-column tile, warp w rows w, w+8, w+16, ...
// of it, held in registers between the two passes, so the state is read once and written once (the bandwidth floor:
// 2·4·K·V bytes a head). Each thread's rows are summed in order, then the eight warps' partials in warp order: a
// fixed order, no atomics. (The kernel it replaces, a thread per column walking the K rows twice, ran at 136 µs a
// layer for 64 sequences of the 410M hybrid's 2 × 256 × 512 states on an H200; NOTES.md.)

#define GDN_STEP_WARPS 8
#define GDN_STEP_ROWS ((GDN_MAX_K + GDN_STEP_WARPS - 1) / GDN_STEP_WARPS) // rows a thread holds at most

// VEC: V even and every row 8-byte aligned (stride even, S aligned), so a lane's column pair moves as one float2.
// The loads are unconditional (row and column clamped into the state, the values past K or V then zeroed by selects)
// so that a thread's RM loads issue back to back: behind per-row branches they ran one round trip at a time (the
// first version of this kernel: 130 µs a layer at B=64, no faster than the one it replaced).
template <bool VEC>
__global__ void __launch_bounds__(GDN_STEP_WARPS * WARP_SIZE)
    gdn_step_kernel(floatX *o, float *S, long stride, const floatX *q, const floatX *k, const floatX *v, int v_stride,
                    const float *beta, const float *g, int H, int K, int V) {
    constexpr int NW = GDN_STEP_WARPS, RM = GDN_STEP_ROWS;
    __shared__ float sq[NW * RM], sk[NW * RM]; // zero past K, so the rows past K add exact zeros
    __shared__ float2 red[2][NW][WARP_SIZE];   // per-warp partial sums: Sᵀk, then the new Sᵀq
    const int h = blockIdx.y, b = blockIdx.z, warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const long r = (long)b * H + h;
    // the state rows before the wait, so their reads overlap the kernel before (the conv and norms): that kernel lets
    // this one start only after its own wait (everything before it has completed), and nothing in between writes the
    // state (this layer's step of the token before is one of those completed). q, k, v, β and α are its outputs.
    const int j = blockIdx.x * 2 * WARP_SIZE + 2 * lane;
    const bool c0 = j < V, c1 = j + 1 < V;
    const int j0 = c0 ? j : V - 1, j1 = c1 ? j + 1 : V - 1; // in-bounds columns for the loads
    float *Sh = S + (long)b * stride + (long)h * K * V;
    float s0[RM], s1[RM];
#pragma unroll
    for (int t = 0; t < RM; t++) {
        const int i = warp + NW * t, ic = i < K ? i : K - 1;
        const float *row = Sh + (long)ic * V;
        float x0, x1;
        if constexpr (VEC) {
            const float2 x = *(const float2 *)(row + (c1 ? j : 0));
            x0 = x.x;
            x1 = x.y;
        } else {
            x0 = row[j0];
            x1 = row[j1];
        }
        s0[t] = i < K && c0 ? x0 : 0.0f;
        s1[t] = i < K && c1 ? x1 : 0.0f;
    }
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    for (int i = threadIdx.x; i < NW * RM; i += blockDim.x) {
        sq[i] = i < K ? (float)q[r * K + i] : 0.0f;
        sk[i] = i < K ? (float)k[r * K + i] : 0.0f;
    }
    __syncthreads();
    float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
    for (int t = 0; t < RM; t++) {
        p0 = fmaf(s0[t], sk[warp + NW * t], p0);
        p1 = fmaf(s1[t], sk[warp + NW * t], p1);
    }
    red[0][warp][lane] = make_float2(p0, p1);
    __syncthreads();
    p0 = p1 = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; w++) {
        p0 += red[0][w][lane].x;
        p1 += red[0][w][lane].y;
    }
    const float alpha = expf(g[r]), be = beta[r];
    const floatX *vr = v + (long)b * v_stride + (long)h * V;
    const float u0 = c0 ? be * ((float)vr[j0] - alpha * p0) : 0.0f, u1 = c1 ? be * ((float)vr[j1] - alpha * p1) : 0.0f;
    float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
    for (int t = 0; t < RM; t++) {
        const int i = warp + NW * t;
        s0[t] = fmaf(sk[i], u0, alpha * s0[t]);
        s1[t] = fmaf(sk[i], u1, alpha * s1[t]);
        a0 = fmaf(s0[t], sq[i], a0);
        a1 = fmaf(s1[t], sq[i], a1);
        if (i < K) {
            float *row = Sh + (long)i * V;
            if (VEC && c1) {
                *(float2 *)(row + j) = make_float2(s0[t], s1[t]);
            } else if (!VEC) {
                if (c0) { row[j] = s0[t]; }
                if (c1) { row[j + 1] = s1[t]; }
            }
        }
    }
    red[1][warp][lane] = make_float2(a0, a1);
    __syncthreads();
    if (warp == 0) {
        a0 = a1 = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            a0 += red[1][w][lane].x;
            a1 += red[1][w][lane].y;
        }
        const float scale = 1.0f / sqrtf((float)K);
        if (c0) { o[r * V + j] = (floatX)(a0 * scale); }
        if (c1) { o[r * V + j + 1] = (floatX)(a1 * scale); }
    }
}

// o (B,H,V); S as above, updated in place; q, k (B,H,K) dense (the normalized rows); v row b at b·v_stride; β, log α
// (B,H) fp32
static void gdn_step(floatX *o, float *S, long stride, const floatX *q, const floatX *k, const floatX *v, int v_stride,
                     const float *beta, const float *g, int B, int H, int K, int V, cudaStream_t stream) {
    const bool vec = V % 2 == 0 && stride % 2 == 0 && (uintptr_t)S % 8 == 0;
    const dim3 grid(CEIL_DIV(V, 2 * WARP_SIZE), H, B);
    launch_k(vec ? gdn_step_kernel<true> : gdn_step_kernel<false>, grid, GDN_STEP_WARPS * WARP_SIZE, 0, stream, o, S,
             stride, q, k, v, v_stride, beta, g, H, K, V);
}

// ----------------------------------------------------------------------------------------------------------------
// the per-head L2 norm of q and k, and the gates β and log α

// grid (M·H / 4), 128 threads: a warp per (token, head). out (M, H·D) dense = x r, rinv (M,H) = 1/sqrt(Σx² + 1e-6).
// VEC (D a multiple of 16/sizeof(floatX), at most 32 such pieces, 16-byte aligned rows): lane i holds the row's piece i
// in one 16-byte load, the arithmetic of the prep kernel's fused norm (bit for bit: test_gdn_gpu); the element-by-
// element form issued four times the memory instructions and ran instruction-bound at 2.2 TB/s (ncu, H100: 0.82
// issued a cycle). The chunked forward fuses this norm into its prep kernel (GDNQKNorm); the decode step uses this.
__device__ __forceinline__ long l2norm_token(long row, int H) { // row / H, in 32 bits where the rows fit
    return row < 0x7fffffffL ? (long)((unsigned)row / (unsigned)H) : row / H;
}
template <bool VEC>
__global__ void l2norm_forward_kernel(floatX *out, float *rinv, const floatX *x, int M, int H, int D, int x_stride) {
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    const long row = (long)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= (long)M * H) { return; }
    const long m = l2norm_token(row, H), h = row - m * H;
    const floatX *xi = x + m * x_stride + h * D;
    float ss = 0.0f;
    if constexpr (VEC) {
        constexpr int E = 16 / sizeof(floatX);
        const bool on = lane * E < D;
        uint4 raw = make_uint4(0u, 0u, 0u, 0u);
        if (on) { raw = *(const uint4 *)(xi + lane * E); }
        const float r = l2norm_rinv(warp_reduce_sum(l2norm_piece_ss(raw)));
        if (lane == 0) { rinv[row] = r; }
        if (on) { *(uint4 *)(out + row * D + lane * E) = l2norm_piece_scale(raw, r); }
    } else {
        for (int i = lane; i < D; i += WARP_SIZE) { ss += (float)xi[i] * (float)xi[i]; }
        ss = warp_reduce_sum(ss);
        const float r = l2norm_rinv(ss);
        if (lane == 0) { rinv[row] = r; }
        for (int i = lane; i < D; i += WARP_SIZE) { out[row * D + i] = (floatX)((float)xi[i] * r); }
    }
}
// the VEC backward's lanes a row: the row's 16-byte pieces rounded up to a power of two (32 / that rows a warp)
__host__ __device__ inline int l2norm_lanes(int D) {
    const int pieces = D / (16 / (int)sizeof(floatX));
    return pieces > 16 ? 32 : pieces > 8 ? 16 : pieces > 4 ? 8 : pieces > 2 ? 4 : pieces > 1 ? 2 : 1;
}
// dx (view) = r (dout − y (y·dout)), y = x r recomputed in fp32; VEC as the forward, a row on l2norm_lanes(D) lanes
// (two rows a warp at D = 128 in bf16: a row a warp left half the lanes idle, 0.12 ms a launch at H=16); the group's
// butterfly adds what a 32-lane one would with the other lanes' zeros: the same bits
template <bool VEC>
__global__ void l2norm_backward_kernel(floatX *dx, const floatX *dout, const floatX *x, const float *rinv, int M, int H,
                                       int D, int x_stride) {
    const int lane = threadIdx.x % WARP_SIZE;
    float dot = 0.0f;
    if constexpr (VEC) {
        constexpr int E = 16 / sizeof(floatX);
        const int lpr = l2norm_lanes(D), sl = lane % lpr;
        const long row = ((long)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE) * (WARP_SIZE / lpr) +
                         lane / lpr;
        const bool live = row < (long)M * H, on = live && sl * E < D;
        const long m = live ? l2norm_token(row, H) : 0, h = live ? row - m * H : 0;
        const float r = live ? rinv[row] : 0.0f;
        uint4 rx = make_uint4(0u, 0u, 0u, 0u), rd = make_uint4(0u, 0u, 0u, 0u);
        if (on) {
            rx = *(const uint4 *)(x + m * x_stride + h * D + sl * E);
            rd = *(const uint4 *)(dout + row * D + sl * E);
        }
        const floatX *vx = (const floatX *)&rx, *vd = (const floatX *)&rd;
#pragma unroll
        for (int e = 0; e < E; e++) { dot += (float)vx[e] * r * (float)vd[e]; }
        for (int off = lpr >> 1; off > 0; off >>= 1) { dot += __shfl_xor_sync(0xffffffffu, dot, off); }
        if (on) {
            __align__(16) floatX o[E];
#pragma unroll
            for (int e = 0; e < E; e++) { o[e] = (floatX)(r * ((float)vd[e] - (float)vx[e] * r * dot)); }
            *(uint4 *)(dx + m * x_stride + h * D + sl * E) = *(const uint4 *)o;
        }
    } else {
        const long row = (long)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
        if (row >= (long)M * H) { return; }
        const long m = l2norm_token(row, H), h = row - m * H;
        const floatX *xi = x + m * x_stride + h * D;
        const float r = rinv[row];
        for (int i = lane; i < D; i += WARP_SIZE) { dot += (float)xi[i] * r * (float)dout[row * D + i]; }
        dot = warp_reduce_sum(dot);
        for (int i = lane; i < D; i += WARP_SIZE) {
            dx[m * x_stride + h * D + i] = (floatX)(r * ((float)dout[row * D + i] - (float)xi[i] * r * dot));
        }
    }
}
// the 16-byte form where every row of the view (and the dense rows) is whole 16-byte pieces, at most one a lane
static inline bool l2norm_vec(const void *x, const void *y, int D, int x_stride) {
    const int E = 16 / sizeof(floatX);
    return D % E == 0 && D <= WARP_SIZE * E && x_stride % E == 0 && ((uintptr_t)x & 15) == 0 &&
           ((uintptr_t)y & 15) == 0;
}
static void l2norm_forward(floatX *out, float *rinv, const floatX *x, int M, int H, int D, int x_stride,
                           cudaStream_t stream) {
    const unsigned grid = (unsigned)CEIL_DIV((long)M * H, 4);
    if (l2norm_vec(x, out, D, x_stride)) {
        launch_k(l2norm_forward_kernel<true>, grid, 128, 0, stream, out, rinv, x, M, H, D, x_stride);
    } else {
        launch_k(l2norm_forward_kernel<false>, grid, 128, 0, stream, out, rinv, x, M, H, D, x_stride);
    }
}
static void l2norm_backward(floatX *dx, const floatX *dout, const floatX *x, const float *rinv, int M, int H, int D,
                            int x_stride, cudaStream_t stream) {
    const unsigned grid = (unsigned)CEIL_DIV((long)M * H, 4);
    if (l2norm_vec(x, dx, D, x_stride) && ((uintptr_t)dout & 15) == 0) {
        const unsigned vgrid = (unsigned)CEIL_DIV((long)M * H, 4 * (WARP_SIZE / l2norm_lanes(D))); // 4 warps a block
        l2norm_backward_kernel<true><<<vgrid, 128, 0, stream>>>(dx, dout, x, rinv, M, H, D, x_stride);
    } else {
        l2norm_backward_kernel<false><<<grid, 128, 0, stream>>>(dx, dout, x, rinv, M, H, D, x_stride);
    }
    cudaCheck(cudaGetLastError());
}

// β = sigmoid(b) (2·sigmoid with neg: GDN[−1,1]) and g = −exp(A_log)·softplus(a + dt_bias) of one (token, head): the
// gate kernel's arithmetic and the step's fused prep kernel's
__device__ __forceinline__ void gdn_gate_values(float *beta, float *g, floatX b_raw, floatX a_raw, float A_log,
                                                float dt_bias, int neg) {
    *beta = (neg ? 2.0f : 1.0f) / (1.0f + expf(-(float)b_raw));
    *g = -expf(A_log) * softplus_f((float)a_raw + dt_bias);
}
// beta, g (M,H) fp32 from the b and a rows of proj (token stride `stride`): β = (neg ? 2 : 1) sigmoid(b),
// g = log α = −exp(A_log) softplus(a + dt_bias)
__global__ void gdn_gates_forward_kernel(float *beta, float *g, const floatX *b_raw, const floatX *a_raw, int stride,
                                         const float *A_log, const float *dt_bias, long M, int H, int neg) {
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * H) { return; }
    const long m = i / H;
    const int h = (int)(i % H);
    gdn_gate_values(beta + i, g + i, b_raw[m * stride + h], a_raw[m * stride + h], A_log[h], dt_bias[h], neg);
}
// db_raw, da_raw (views) written; partial (2, chunks, H): dA_log and ddt_bias per token chunk
__global__ void gdn_gates_backward_kernel(floatX *db_raw, floatX *da_raw, float *partial, const float *dbeta,
                                          const float *dg, const floatX *b_raw, const floatX *a_raw, int stride,
                                          const float *A_log, const float *dt_bias, long M, int H, int neg) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (h >= H) { return; }
    const float A = expf(A_log[h]);
    float sum_dA = 0.0f, sum_db = 0.0f;
    const long begin = (long)chunk * TOKEN_CHUNK, end = min(begin + TOKEN_CHUNK, M);
    for (long m = begin; m < end; m++) {
        const float s = 1.0f / (1.0f + expf(-(float)b_raw[m * stride + h]));
        db_raw[m * stride + h] = (floatX)(dbeta[m * H + h] * (neg ? 2.0f : 1.0f) * s * (1.0f - s));
        const float x = (float)a_raw[m * stride + h] + dt_bias[h], d = dg[m * H + h];
        const float da = -d * A / (1.0f + expf(-x));
        da_raw[m * stride + h] = (floatX)da;
        sum_db += da;
        sum_dA += -d * A * softplus_f(x);
    }
    partial[(long)chunk * H + h] = sum_dA;
    partial[((long)gridDim.y + chunk) * H + h] = sum_db;
}

// ----------------------------------------------------------------------------------------------------------------
// the mixer

static inline int gdn_proj_stride(const ModelConfig *c) { return round_up(gdn_proj_rows(c), 8); }

typedef struct {
    floatX *proj;          // (B,T,Rs) q | k | v | g | b | a
    floatX *conv_pre;      // (B,T,CD)
    floatX *conv_act;      // (B,T,CD) q | k | v after SiLU
    floatX *qn, *kn;       // (B,T,H·K) L2-normalized
    float *rq, *rk;        // (B,T,H) their 1/norms
    float *beta, *g;       // (B,T,H) β and log α
    float *Tm;             // (B·chunks,H,64,64) the chunks' T = (I + A)⁻¹, kept for the backward's recompute
    float *Gc;             // (B,T,H) the in-chunk cumulative decays, kept likewise
    floatX *o;             // (B,T,H·V) the recurrence's outputs
    floatX *normed, *gated; // (B,T,H·V)
    float *rstd;           // (B·T·H)
} GDNActs;

static size_t gdn_acts_layout(GDNActs *a, void *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, H = c->gdn.heads, HK = H * c->gdn.k, HV = H * c->gdn.v;
    DeviceArena ar = {(char *)base, 0};
    a->proj = TAKE_X(&ar, BT * gdn_proj_stride(c));
    a->conv_pre = TAKE_X(&ar, BT * gdn_conv_dim(c));
    a->conv_act = TAKE_X(&ar, BT * gdn_conv_dim(c));
    a->qn = TAKE_X(&ar, BT * HK);
    a->kn = TAKE_X(&ar, BT * HK);
    a->rq = TAKE_F(&ar, BT * H);
    a->rk = TAKE_F(&ar, BT * H);
    a->beta = TAKE_F(&ar, BT * H);
    a->g = TAKE_F(&ar, BT * H);
    gdn_chunk_tg_take(&a->Tm, &a->Gc, &ar, B, T, (int)H, false);
    a->o = TAKE_X(&ar, BT * HV);
    a->normed = TAKE_X(&ar, BT * HV);
    a->gated = TAKE_X(&ar, BT * HV);
    a->rstd = TAKE_F(&ar, BT * H);
    return ar.used;
}

typedef struct {
    GDNChunkBufs f;  // the chunk kernels' forward buffers (the backward recomputes them from the acts' Tm, Gc)
    GDNChunkGrads gr;
    floatX *d_proj, *d_conv_act, *d_o, *d_normed, *d_gated, *dk; // (B,T,Rs), (B,T,CD), (B,T,HV) ×3, (B,T,HK)
    float *dbeta, *dg; // (B,T,H)
    float *reduce;     // partial sums of the parameter-gradient reductions
} GDNScratch;

// the forward part first: the decode advance lays only that out (fwd_only)
static size_t gdn_scratch_layout(GDNScratch *s, void *base, const ModelConfig *c, int B, int T, int fwd_only) {
    const size_t BT = (size_t)B * T, H = c->gdn.heads, K = c->gdn.k, V = c->gdn.v, HK = H * K, HV = H * V;
    DeviceArena ar = {(char *)base, 0};
    gdn_chunk_bufs_take(&s->f, &ar, B, T, (int)H, (int)K, (int)V, false, false);
    if (fwd_only) { return ar.used; }
    gdn_chunk_grads_take(&s->gr, &ar, B, T, (int)H, (int)K, (int)V, false);
    s->d_proj = TAKE_X(&ar, BT * gdn_proj_stride(c));
    s->d_conv_act = TAKE_X(&ar, BT * gdn_conv_dim(c));
    s->d_o = TAKE_X(&ar, BT * HV);
    s->d_normed = TAKE_X(&ar, BT * HV);
    s->d_gated = TAKE_X(&ar, BT * HV);
    s->dk = TAKE_X(&ar, BT * HK);
    s->dbeta = TAKE_F(&ar, BT * H);
    s->dg = TAKE_F(&ar, BT * H);
    const size_t chunks = token_chunks((long)BT);
    size_t reduce = rmsnorm_backward_scratch((int)(BT * H), (int)V);
    const size_t others[2] = {chunks * gdn_conv_dim(c) * c->gdn.conv, chunks * 2 * H};
    for (int i = 0; i < 2; i++) { reduce = others[i] > reduce ? others[i] : reduce; }
    s->reduce = TAKE_F(&ar, reduce);
    return ar.used;
}

static size_t gdn_mixer_acts_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    GDNActs a;
    return gdn_acts_layout(&a, NULL, c, B, T);
}
static size_t gdn_mixer_scratch_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    GDNScratch s;
    return gdn_scratch_layout(&s, NULL, c, B, T, 0);
}

// the projection, conv and gates (from the decode windows when window != NULL); the q/k norm is the chunked forward's
// (gdn_chunk_run)
static void gdn_inputs(GDNActs *a, float *window, long stride, const floatX *inp, const GDNParams *w,
                       const GDNParams32 *w32, const ModelConfig *c, int B, int T, const Runtime *rt) {
    const int BT = B * T, C = c->d_model, R = gdn_proj_rows(c), Rs = gdn_proj_stride(c), CD = gdn_conv_dim(c);
    const int H = c->gdn.heads, K = c->gdn.k, V = c->gdn.v, HK = H * K, boff = 2 * HK + 2 * H * V;
    cudaStream_t stream = rt->stream;
    matmul_forward_strided(a->proj, Rs, inp, w->in_w, BT, C, R, rt);
    if (window != NULL) {
        conv1d_silu_advance(a->conv_pre, a->conv_act, window, stride, a->proj, w->conv_w, NULL, B, T, CD, c->gdn.conv,
                            Rs, stream);
    } else {
        conv1d_silu_forward(a->conv_pre, a->conv_act, a->proj, w->conv_w, NULL, B, T, CD, c->gdn.conv, Rs, stream);
    }
    gdn_gates_forward_kernel<<<CEIL_DIV((long)BT * H, 256), 256, 0, stream>>>(
        a->beta, a->g, a->proj + boff, a->proj + boff + H, Rs, w32->A_log, w32->dt_bias, BT, H, c->gdn.neg);
    cudaCheck(cudaGetLastError());
}

// per-head RMSNorm, the SiLU(g) gate, the output projection
// (in: a decode step's input, whose branch product may leave partial sums: step_branch_product)
static void gdn_outputs(floatX *out, GDNActs *a, const GDNParams *w, const ModelConfig *c, int BT, const Runtime *rt,
                        StepInput *in = NULL) {
    const int C = c->d_model, Rs = gdn_proj_stride(c), H = c->gdn.heads, K = c->gdn.k, V = c->gdn.v, HV = H * V;
    rmsnorm_forward(a->normed, a->rstd, NULL, a->o, NULL, w->norm_w, BT * H, V, rt->stream);
    output_gate_forward(a->normed, a->gated, NULL, a->proj + 2 * H * K + HV, NULL, BT, HV, 0, Rs, rt->stream);
    step_branch_product(out, in, a->gated, w->out_w, BT, HV, C, rt);
}

// the chunked forward of the layer (o, and the kept qn, kn, rq, rk, Tm, Gc in a) from the conv's q, k, v and the gates,
// from and back into the per-sequence states S (stride in floats) when S != NULL (the decode advance)
static void gdn_chunk_run(GDNActs *a, GDNChunkBufs *f, float *S, long stride, const ModelConfig *c, int B, int T,
                          cudaStream_t stream) {
    const int H = c->gdn.heads, K = c->gdn.k, V = c->gdn.v, HK = H * K, CD = gdn_conv_dim(c);
    const GDNQKNorm nm = {CD, a->qn, a->kn, a->rq, a->rk};
    f->Tm = a->Tm;
    f->Gc = a->Gc;
    gdn_chunk_forward(a->o, f, S, stride, S, stride, a->conv_act, a->conv_act + HK, &nm, a->conv_act + 2 * HK, CD,
                      a->beta, a->g, NULL, B, T, H, K, V, stream);
}

static void gdn_mixer_forward(floatX *out, void *acts, void *scratch, const floatX *inp, const KindTensors *t,
                              const ModelConfig *c, int B, int T, const Runtime *rt) {
    const GDNParams *w = (const GDNParams *)t->w;
    const GDNParams32 *w32 = (const GDNParams32 *)t->w32;
    GDNActs a;
    gdn_acts_layout(&a, acts, c, B, T);
    GDNScratch s;
    gdn_scratch_layout(&s, scratch, c, B, T, 1);
    gdn_inputs(&a, NULL, 0, inp, w, w32, c, B, T, rt);
    gdn_chunk_run(&a, &s.f, NULL, 0, c, B, T, rt->stream);
    gdn_outputs(out, &a, w, c, B * T, rt);
}

static void gdn_mixer_backward(floatX *dinp, void *scratch, const floatX *dout, const floatX *inp, const void *acts,
                               const KindTensors *t, const ModelConfig *c, int B, int T, const Runtime *rt) {
    const GDNParams *w = (const GDNParams *)t->w;
    const GDNParams32 *w32 = (const GDNParams32 *)t->w32, *g = (const GDNParams32 *)t->g;
    GDNActs a;
    gdn_acts_layout(&a, (void *)acts, c, B, T);
    GDNScratch s;
    gdn_scratch_layout(&s, scratch, c, B, T, 0);
    const int BT = B * T, C = c->d_model, R = gdn_proj_rows(c), Rs = gdn_proj_stride(c), CD = gdn_conv_dim(c);
    const int H = c->gdn.heads, K = c->gdn.k, V = c->gdn.v, HK = H * K, HV = H * V;
    const int goff = 2 * HK + HV, boff = 2 * HK + 2 * HV;
    cudaStream_t stream = rt->stream;
    matmul_backward(s.d_gated, g->out_w, dout, a.gated, w->out_w, BT, HV, C, 0, rt);
    output_gate_backward(s.d_normed, s.d_proj + goff, s.d_gated, a.normed, a.proj + goff, BT, HV, Rs, stream);
    rmsnorm_backward(s.d_o, g->norm_w, s.reduce, s.d_normed, a.o, w->norm_w, a.rstd, BT * H, V, 0, stream);
    // the chunk buffers again (the forward's scratch is shared by the layers) from the kept T and Gc, then the
    // chunked backward
    s.f.Tm = a.Tm;
    s.f.Gc = a.Gc;
    gdn_chunk_recompute(&s.f, NULL, 0, a.qn, a.kn, a.conv_act + 2 * HK, CD, a.beta, NULL, B, T, H, K, V, stream);
    gdn_chunk_backward(s.dk, s.d_conv_act + 2 * HK, CD, s.dbeta, s.dg, &s.gr, NULL, 0, NULL, 0, s.d_o, &s.f, a.qn, a.kn,
                       a.conv_act + 2 * HK, CD, a.beta, NULL, B, T, H, K, V, stream);
    const int chunks = token_chunks(BT);
    gdn_gates_backward_kernel<<<dim3(CEIL_DIV(H, 64), chunks), 64, 0, stream>>>(
        s.d_proj + boff, s.d_proj + boff + H, s.reduce, s.dbeta, s.dg, a.proj + boff, a.proj + boff + H, Rs,
        w32->A_log, w32->dt_bias, BT, H, c->gdn.neg);
    cudaCheck(cudaGetLastError());
    reduce_partials(g->A_log, s.reduce, chunks, H, stream);
    reduce_partials(g->dt_bias, s.reduce + (size_t)chunks * H, chunks, H, stream);
    l2norm_backward(s.d_conv_act, s.gr.dq, a.conv_act, a.rq, BT, H, K, CD, stream);
    l2norm_backward(s.d_conv_act + HK, s.dk, a.conv_act + HK, a.rk, BT, H, K, CD, stream);
    conv1d_silu_backward(s.d_proj, g->conv_w, NULL, s.reduce, s.d_conv_act, a.conv_pre, a.proj, w->conv_w, B, T, CD,
                         c->gdn.conv, Rs, stream);
    matmul_backward_strided(dinp, g->in_w, s.d_proj, Rs, inp, w->in_w, BT, C, R, 0, rt);
}

// a sequence's decode state: the conv window (W−1, CD) then S (H,K,V), fp32 (the CPU's order)
static size_t gdn_mixer_state_bytes(const ModelConfig *c, int context) { return gdn_decode_state(c, context) * sizeof(float); }

// The step's conv (CD channels, the window updated), the q/k L2 norms and the gates in one launch: a block of
// GDN_PREP_THREADS a unit, grid (B, units), a thread a channel (one round of loads, as conv1d_silu_step); units: the
// 2H q and k head rows (their K channels, then warp 0 runs l2norm_forward_kernel's VEC arithmetic on the rounded
// outputs: the same bits), the v channels GDN_PREP_THREADS a unit, then one unit for the H gates (gdn_gate_values).
// The same bits as conv1d_silu_step, l2norm_forward twice and gdn_gates_forward_kernel. Needs K and H ≤
// GDN_PREP_THREADS (the gate unit is one block), K a multiple of E = 16/sizeof(floatX) and ≤ 32·E (l2norm_vec).
#define GDN_PREP_THREADS 256
__global__ void __launch_bounds__(GDN_PREP_THREADS)
    gdn_step_prep_kernel(floatX *act, float *window, long state_stride, floatX *qn, floatX *kn, float *rq, float *rk,
                         float *beta, float *g, const floatX *proj, const floatX *conv_w, const float *A_log,
                         const float *dt_bias, int CD, int W, int Rs, int H, int K, int boff, int neg) {
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    constexpr int E = GDN_L2_PIECE;
    const int b = blockIdx.x, unit = blockIdx.y, t = threadIdx.x, HK = H * K;
    const int vunits = CEIL_DIV(CD - 2 * HK, GDN_PREP_THREADS);
    float *s = window + (long)b * state_stride;
    if (unit < 2 * H) { // a q (unit < H) or k head row: channels unit·K onwards
        if (t < K) { conv1d_silu_step_channel(act, s, proj, conv_w, NULL, b, unit * K + t, CD, W, Rs); }
        __syncthreads(); // (the row's outputs, written by the block, read back by warp 0)
        if (t < WARP_SIZE) {
            const bool on = t * E < K;
            uint4 raw = make_uint4(0u, 0u, 0u, 0u);
            if (on) { raw = *(const uint4 *)(act + (long)b * CD + unit * K + t * E); }
            const float r = l2norm_rinv(warp_reduce_sum(l2norm_piece_ss(raw)));
            const long row = (long)b * H + unit % H;
            if (t == 0) { (unit < H ? rq : rk)[row] = r; }
            if (on) { *(uint4 *)((unit < H ? qn : kn) + row * K + t * E) = l2norm_piece_scale(raw, r); }
        }
    } else if (unit < 2 * H + vunits) {
        const int c = 2 * HK + (unit - 2 * H) * GDN_PREP_THREADS + t;
        if (c < CD) { conv1d_silu_step_channel(act, s, proj, conv_w, NULL, b, c, CD, W, Rs); }
    } else if (t < H) {
        const long i = (long)b * H + t;
        gdn_gate_values(beta + i, g + i, proj[(long)b * Rs + boff + t], proj[(long)b * Rs + boff + H + t], A_log[t],
                        dt_bias[t], neg);
    }
}

// act (B, CD) the conv's outputs and the windows (stride floats apart) advanced; qn, kn (B·H, K) and rq, rk (B·H) the
// q/k L2 norms; beta, g (B, H) the gates; from proj (B, Rs): the conv's CD inputs, and at boff the H b and H a inputs.
// One kernel (gdn_step_prep_kernel); false (nothing launched) where the shape does not fit it
static bool gdn_step_prep(floatX *act, float *window, long stride, floatX *qn, floatX *kn, float *rq, float *rk,
                          float *beta, float *g, const floatX *proj, const floatX *conv_w, const float *A_log,
                          const float *dt_bias, int B, int CD, int W, int Rs, int H, int K, int boff, int neg,
                          cudaStream_t stream) {
    const int HK = H * K;
    if (K > GDN_PREP_THREADS || H > GDN_PREP_THREADS || !l2norm_vec(act, qn, K, CD) || !l2norm_vec(act + HK, kn, K, CD)) {
        return false;
    }
    const int units = 2 * H + CEIL_DIV(CD - 2 * HK, GDN_PREP_THREADS) + 1;
    launch_k(gdn_step_prep_kernel, dim3(B, units), GDN_PREP_THREADS, 0, stream, act, window, stride, qn, kn, rq, rk,
             beta, g, proj, conv_w, A_log, dt_bias, CD, W, Rs, H, K, boff, neg);
    return true;
}
// the same by the four kernels: conv step, L2 norms of q and k, gates
static void gdn_step_prep_unfused(floatX *act, float *window, long stride, floatX *qn, floatX *kn, float *rq, float *rk,
                                  float *beta, float *g, const floatX *proj, const floatX *conv_w, const float *A_log,
                                  const float *dt_bias, int B, int CD, int W, int Rs, int H, int K, int boff, int neg,
                                  cudaStream_t stream) {
    const int HK = H * K;
    conv1d_silu_step(act, window, stride, proj, conv_w, NULL, B, CD, W, Rs, stream);
    l2norm_forward(qn, rq, act, B, H, K, CD, stream);
    l2norm_forward(kn, rk, act + HK, B, H, K, CD, stream);
    launch_k(gdn_gates_forward_kernel, CEIL_DIV((long)B * H, 256), 256, 0, stream, beta, g, proj + boff,
             proj + boff + H, Rs, A_log, dt_bias, (long)B, H, neg);
}

static void gdn_mixer_step(floatX *out, void *state, void *work, StepInput *in, const KindTensors *t,
                           const ModelConfig *c, int B, const int *pos, int context, const Runtime *rt) {
    const GDNParams *w = (const GDNParams *)t->w;
    const GDNParams32 *w32 = (const GDNParams32 *)t->w32;
    GDNActs a;
    gdn_acts_layout(&a, work, c, B, 1);
    const int C = c->d_model, R = gdn_proj_rows(c), Rs = gdn_proj_stride(c), CD = gdn_conv_dim(c);
    const int H = c->gdn.heads, K = c->gdn.k, V = c->gdn.v, HK = H * K, boff = 2 * HK + 2 * H * V;
    const long stride = (long)(gdn_mixer_state_bytes(c, context) / sizeof(float));
    float *window = (float *)state, *S = window + (size_t)(c->gdn.conv - 1) * CD;
    cudaStream_t stream = rt->stream;
    gdn_check_dims(K, V);
    step_product(a.proj, Rs, in, w->in_w, B, C, R, rt);
    if (!gdn_step_prep(a.conv_act, window, stride, a.qn, a.kn, a.rq, a.rk, a.beta, a.g, a.proj, w->conv_w,
                       (const float *)w32->A_log, (const float *)w32->dt_bias, B, CD, c->gdn.conv, Rs, H, K, boff,
                       c->gdn.neg, stream)) {
        gdn_step_prep_unfused(a.conv_act, window, stride, a.qn, a.kn, a.rq, a.rk, a.beta, a.g, a.proj, w->conv_w,
                              (const float *)w32->A_log, (const float *)w32->dt_bias, B, CD, c->gdn.conv, Rs, H, K,
                              boff, c->gdn.neg, stream);
    }
    gdn_step(a.o, S, stride, a.qn, a.kn, a.conv_act + 2 * HK, CD, a.beta, a.g, B, H, K, V, stream);
    gdn_outputs(out, &a, w, c, B, rt, in);
}

// B sequences advance by T tokens (a prefill chunk): the chunked forward from and back into each S
static void gdn_mixer_advance(floatX *out, void *state, void *work, const floatX *inp, const KindTensors *t,
                              const ModelConfig *c, int B, int T, const int *pos, int context, const Runtime *rt) {
    const GDNParams *w = (const GDNParams *)t->w;
    const GDNParams32 *w32 = (const GDNParams32 *)t->w32;
    GDNActs a;
    const size_t acts = gdn_acts_layout(&a, work, c, B, T);
    GDNScratch s;
    gdn_scratch_layout(&s, (char *)work + acts, c, B, T, 1);
    const int CD = gdn_conv_dim(c);
    const long stride = (long)(gdn_mixer_state_bytes(c, context) / sizeof(float));
    float *window = (float *)state, *S = window + (size_t)(c->gdn.conv - 1) * CD;
    gdn_inputs(&a, window, stride, inp, w, w32, c, B, T, rt);
    gdn_chunk_run(&a, &s.f, S, stride, c, B, T, rt->stream);
    gdn_outputs(out, &a, w, c, B * T, rt);
}

static const KindOps GDN_OPS = {'G', gdn_mixer_acts_bytes, gdn_mixer_scratch_bytes, gdn_mixer_forward,
                                gdn_mixer_backward, gdn_mixer_state_bytes, gdn_mixer_step, gdn_mixer_advance};

#endif // M2RNN_GDN_CUH
