/*
attention_kernels.cuh: causal softmax attention on the GPU in the FlashAttention manner (tiles in shared memory, an
online softmax, no T×T matrix in memory, the log-sum-exp kept for the backward), and the decode kernel of inference.

  O = softmax(scale · Q Kᵀ + mask) V,  LSE_i = log Σ_j exp(scale · q_i·k_j)  over the keys j query i may see
  causal mask: query i of a sequence with Lq queries and Lk keys sees keys j ≤ i + (Lk − Lq) (training: Lq = Lk;
  a prefill chunk appended to a cache: the queries are the last Lq of the Lk tokens)

Backward (D_i = Σ_d dO_i,d O_i,d):  P = exp(scale·S − LSE),  dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − D),
  dQ = scale · dS K,  dK = scale · dSᵀ Q.

Design (FlashAttention-2's decomposition on mma.sync m16n8k16 bf16 → fp32, the fragment vocabulary of tiles.cuh):
- forward: a CTA = 4 warps = 64·MT queries of one (sequence, head), each warp 16·MT query rows (MT m-tiles, so every
  K and V fragment read from shared memory feeds MT MMAs); K and V tiles of KN keys (64; 32 at HS = 128, where
  larger S accumulators would spill) stream through shared memory
  double-buffered by cp.async; O, the row max and sum stay in registers; S = Q Kᵀ and O += P V are MMAs, P is
  re-packed from S's accumulators into the next MMA's A operand in registers. Only the tiles on the causal diagonal
  or the sequence's end pay for the mask.
- backward, deterministic (no atomics): one kernel per 64·MT-key tile computes dK and dV (looping over the query
  tiles, and over the query heads of the tile's kv head, so GQA's sums run in a fixed order); with QS = 2 its 8
  warps split each 64-query tile in halves and add their partial dK, dV through shared memory at the end, in a fixed
  order. A second kernel per query tile computes dQ (looping over the key tiles). That recomputes S and dP twice (7
  tile MMAs per tile pair instead of 5 with an atomic dQ): the price of bitwise-repeatable gradients, measured in
  dev/bench/attention_results.md.
- shared-memory rows are swizzled in 16-byte chunks (chunk c of row r at c ^ (r & 7)) so the ldmatrix reads are
  free of bank conflicts (HS = 32: c ^ (r & 3), 2-way).
- decode: a batch of single-token queries against a KV cache, split along the context (flash-decoding): each CTA
  reduces a slice of positions to (max, sum, partial output) for the query heads of one kv head (up to 4: GQA reads
  a kv head's rows once); HS/8 lanes read a row, 16 bytes each, so a warp reads 32/(HS/8) positions at once and keeps
  4 KB of loads in flight; the last CTA of each (sequence, kv head, group) merges the slices in order (a counter in
  the workspace). The slice length depends on the cache capacity only, so a sequence's output does not depend on the
  batch it decodes in (test_attention_gpu checks). The model's step (flash_attention_decode_step) also rotates the
  token's q and k (RoPE) and appends its k and v to the cache in the same launch.

Layouts: tokens are rows with strides (elements between tokens; heads contiguous inside a row), so q, k, v can be
the column blocks of one (B,T,(NH+2·NKV)·HS) projection output and o a (B,T,NH·HS) buffer: no permute. A sequence
starts at b·*_seq elements (fixed layout; len_k, when given, holds each sequence's key count, e.g. the filled part
of a KV cache), or at cu_seqlens[b] tokens (packed variable-length sequences). LSE and D are (query tokens, NH)
fp32. Heads: query head h reads kv head h / (NH / NKV) (GQA; NKV = NH is MHA).
Limits: HS ∈ {32, 64, 128}; NH % NKV == 0; rows 16-byte aligned (strides and column offsets multiples of 8).
*/
#ifndef M2RNN_ATTENTION_KERNELS_CUH
#define M2RNN_ATTENTION_KERNELS_CUH

#include <stdint.h>
#include "cuda_common.h"
#include "tiles.cuh"
#include "utils.h"

#define FA_TILE 64      // keys a tile; queries a tile in the backward's dK/dV loop; queries per warp-row-block × 4
#define FA_THREADS 128  // 4 warps

typedef struct {
    int B;                       // sequences
    int Lq, Lk;                  // queries / keys per sequence (fixed layout); with cu_seqlens: the longest one
    int NH, NKV, HS;             // query heads, key/value heads, head dim
    long q_row, k_row, v_row, o_row; // elements between consecutive tokens
    long q_seq, k_seq, v_seq, o_seq; // elements between sequences (fixed layout)
    const int *cu_q, *cu_k;      // (B+1) token offsets of packed sequences (device), or NULL
    const int *len_k;            // fixed layout: (B) keys of each sequence (device, each <= Lk), or NULL (all Lk)
    int causal;
    float scale;                 // usually 1/sqrt(HS)
} AttnDims;

// NULL when the dims are usable, else why not
static const char *attn_check_dims(const AttnDims *d) {
    if (d->B < 1 || d->Lq < 0 || d->Lk < 0) { return "B must be >= 1 and the lengths >= 0"; }
    if (d->HS != 32 && d->HS != 64 && d->HS != 128) { return "the head dim must be 32, 64 or 128"; }
    if (d->NH < 1 || d->NKV < 1 || d->NH % d->NKV != 0) { return "the kv heads must divide the query heads"; }
    if (d->q_row % 8 || d->k_row % 8 || d->v_row % 8 || d->o_row % 8 || d->q_seq % 8 || d->k_seq % 8 ||
        d->v_seq % 8 || d->o_seq % 8) {
        return "token and sequence strides must be multiples of 8 elements (16-byte rows)";
    }
    if (d->cu_q != NULL && d->len_k != NULL) { return "len_k is for the fixed layout; packed sequences use cu_k"; }
    if (d->causal && d->cu_q == NULL && d->len_k == NULL && d->Lk < d->Lq) {
        return "a causal pass needs at least as many keys as queries";
    }
    return NULL;
}

namespace attn_detail {

using namespace tiles;
typedef __nv_bfloat16 bf16;

// a sequence's first token index and length, for queries (keys = 0) or keys (keys = 1)
__device__ __forceinline__ void seq_span(const AttnDims &d, int b, int keys, long &tok0, int &len) {
    const int *cu = keys ? d.cu_k : d.cu_q;
    if (cu != NULL) {
        tok0 = cu[b];
        len = cu[b + 1] - cu[b];
    } else {
        tok0 = (long)b * (keys ? d.Lk : d.Lq);
        len = keys ? (d.len_k != NULL ? d.len_k[b] : d.Lk) : d.Lq;
    }
}
// the element offset of token t of sequence b in a tensor with these strides
__device__ __forceinline__ long tok_offset(const AttnDims &d, int b, long tok0, int t, long row, long seq, int keys) {
    const int *cu = keys ? d.cu_k : d.cu_q;
    return cu != NULL ? (tok0 + t) * row : (long)b * seq + (long)t * row;
}

// swizzled shared-memory tile, HS bf16 a row: the byte offset of 16-byte chunk `chunk` of row r
template <int HS> __device__ __forceinline__ uint32_t swz(int r, int chunk) {
    constexpr int CH = HS / 8;
    const int c = CH >= 8 ? (chunk ^ (r & 7)) : ((chunk ^ r) & (CH - 1));
    return (uint32_t)(r * HS + (c << 3)) * 2u;
}

// cp.async of ROWS rows of a strided tensor into the tile at shared address s; rows at or past `valid` are zeroed
template <int HS, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile(uint32_t s, const bf16 *g, long row_stride, int valid) {
    constexpr int CH = HS / 8; // 16-byte chunks a row
    for (int i = threadIdx.x; i < ROWS * CH; i += THREADS) {
        const int r = i / CH, c = i % CH;
        const uint32_t dst = s + swz<HS>(r, c);
        if (r < valid) {
            cp_async16(dst, g + (long)r * row_stride + c * 8);
        } else {
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0));
        }
    }
}

// A fragment (16 rows from row0, k-slice k0..k0+15) of a row-major tile: rows are m, columns are k
template <int HS> __device__ __forceinline__ void frag_a(uint32_t (&a)[4], uint32_t s, int row0, int k0, int lane) {
    const int r = row0 + (lane & 7) + ((lane >> 3) & 1) * 8, c = (k0 >> 3) + (lane >> 4);
    ldsm_x4(a, s + swz<HS>(r, c));
}
// B fragments of two n-tiles (n0, n0+8) for k-slice k0..k0+15 of a tile whose rows are n and columns k:
// b[0], b[1] for tile n0, b[2], b[3] for tile n0+8
template <int HS> __device__ __forceinline__ void frag_b(uint32_t (&b)[4], uint32_t s, int n0, int k0, int lane) {
    const int r = n0 + (lane & 7) + (lane >> 4) * 8, c = (k0 >> 3) + ((lane >> 3) & 1);
    ldsm_x4(b, s + swz<HS>(r, c));
}
// B fragments of two n-tiles (n0, n0+8) for k-slice k0..k0+15 of a tile whose rows are k and columns n (transposed)
template <int HS> __device__ __forceinline__ void frag_bt(uint32_t (&b)[4], uint32_t s, int k0, int n0, int lane) {
    const int r = k0 + (lane & 7) + ((lane >> 3) & 1) * 8, c = (n0 >> 3) + (lane >> 4);
    ldsm_x4_trans(b, s + swz<HS>(r, c));
}

// acc (MT·16 × NN) += A rows (arow0 .. +MT·16 of tile sa) · B rows (brow0 .. +NN of tile sb)ᵀ, contracting the HS
// columns: the S = Q Kᵀ form
template <int HS, int MT, int NN>
__device__ __forceinline__ void mma_abt(float (&acc)[MT][NN / 8][4], uint32_t sa, int arow0, uint32_t sb, int brow0,
                                        int lane) {
#pragma unroll
    for (int k0 = 0; k0 < HS; k0 += 16) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) { frag_a<HS>(a[mt], sa, arow0 + mt * 16, k0, lane); }
#pragma unroll
        for (int n = 0; n < NN / 8; n += 2) {
            uint32_t b[4];
            frag_b<HS>(b, sb, brow0 + n * 8, k0, lane);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma16816(acc[mt][n], a[mt], b[0], b[1]);
                mma16816(acc[mt][n + 1], a[mt], b[2], b[3]);
            }
        }
    }
}
// acc (MT·16 × HS) += P (MT·16 × NK, as packed A fragments) · rows vrow0 .. +NK of tile sv (× HS): the O += P V form
template <int HS, int MT, int NK>
__device__ __forceinline__ void mma_pv(float (&acc)[MT][HS / 8][4], const uint32_t (&p)[MT][NK / 16][4], uint32_t sv,
                                       int vrow0, int lane) {
#pragma unroll
    for (int kk = 0; kk < NK / 16; kk++) {
#pragma unroll
        for (int n = 0; n < HS / 8; n += 2) {
            uint32_t b[4];
            frag_bt<HS>(b, sv, vrow0 + kk * 16, n * 8, lane);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma16816(acc[mt][n], p[mt][kk], b[0], b[1]);
                mma16816(acc[mt][n + 1], p[mt][kk], b[2], b[3]);
            }
        }
    }
}
// 16 × NN accumulators as the A operand of the next MMA (k = the NN columns in slices of 16)
template <int NN>
__device__ __forceinline__ void pack_a(uint32_t (&p)[NN / 16][4], const float (&s)[NN / 8][4]) {
#pragma unroll
    for (int kk = 0; kk < NN / 16; kk++) {
        p[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
        p[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
        p[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        p[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
}
template <int HS>
__device__ __forceinline__ void zero_acc(float (&acc)[HS][4]) {
#pragma unroll
    for (int n = 0; n < HS; n++) { acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f; }
}
// writes a warp's 16 × HS accumulator (times mul[row half]) as bf16 rows row0.. of a strided tensor; rows >= valid
// are skipped
template <int HS>
__device__ __forceinline__ void store_rows(bf16 *g, long row_stride, const float (&acc)[HS / 8][4], float mul0,
                                           float mul1, int row0, int valid, int lane) {
    const int g8 = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = row0 + g8 + 8 * half;
        if (r >= valid) { continue; }
        const float mul = half ? mul1 : mul0;
        bf16 *row = g + (long)r * row_stride;
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            *(uint32_t *)(row + n * 8 + 2 * t4) = pack_bf16x2(acc[n][2 * half] * mul, acc[n][2 * half + 1] * mul);
        }
    }
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

#define FA_LOG2E 1.4426950408889634f

// the key tiles (of `tile` keys) the queries [q_first, q_first + rows) need: up to the last key the last of them may see
__device__ __forceinline__ int key_tiles(const AttnDims &d, int q_first, int rows, int lq, int lk, int tile) {
    int end = lk;
    if (d.causal) { end = min(lk, q_first + rows - 1 + (lk - lq) + 1); }
    return end > 0 ? (end + tile - 1) / tile : 0;
}
// LSE in base 2 for the backward: padding rows and rows that saw no key (LSE = −inf) get +inf, so their P is 0
__device__ __forceinline__ float lse2(const float *lse, long idx, bool valid) {
    const float x = valid ? lse[idx] : -INFINITY;
    return x == -INFINITY ? INFINITY : x * FA_LOG2E;
}

// the key/value loop of the forward and dQ kernels: K and V tiles of KN rows, double-buffered (stage j & 1). Waits
// until tile j is in shared memory for every thread, first starting the copy of tile j + 1 into the other stage.
template <int HS, int KN>
__device__ __forceinline__ void kv_tile_wait(int j, int nt, uint32_t sK, uint32_t sV, const bf16 *kb, const bf16 *vb,
                                             long k_row, long v_row, int lk) {
    if (j + 1 < nt) {
        const int st = (j + 1) & 1;
        load_tile<HS, KN, FA_THREADS>(sK + st * KN * HS * 2, kb + (long)(j + 1) * KN * k_row, k_row, lk - (j + 1) * KN);
        load_tile<HS, KN, FA_THREADS>(sV + st * KN * HS * 2, vb + (long)(j + 1) * KN * v_row, v_row, lk - (j + 1) * KN);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}

} // namespace attn_detail

// ----------------------------------------------------------------------------------------------------------------
// forward. grid (ceil(Lq / (64·MT)), NH, B), 128 threads, key tiles of KN; o and lse written for every query of the sequence

template <int HS, int MT, int KN>
__global__ void __launch_bounds__(FA_THREADS) flash_fwd_kernel(AttnDims d, const __nv_bfloat16 *q,
                                                                const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                                                __nv_bfloat16 *o, float *lse) {
    using namespace attn_detail;
    constexpr int QT = 64 * MT; // queries a CTA; KN keys a tile
    extern __shared__ __align__(128) unsigned char fa_smem[];
    const uint32_t sQ = smem_addr(fa_smem), sK = sQ + QT * HS * 2, sV = sK + 2 * KN * HS * 2;
    const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / (d.NH / d.NKV);
    long q0, k0;
    int lq, lk;
    seq_span(d, b, 0, q0, lq);
    seq_span(d, b, 1, k0, lk);
    if (qt * QT >= lq) { return; }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
    const bf16 *qb = q + tok_offset(d, b, q0, qt * QT, d.q_row, d.q_seq, 0) + (long)h * HS;
    const bf16 *kb = k + tok_offset(d, b, k0, 0, d.k_row, d.k_seq, 1) + (long)kvh * HS;
    const bf16 *vb = v + tok_offset(d, b, k0, 0, d.v_row, d.v_seq, 1) + (long)kvh * HS;
    const int nt = key_tiles(d, qt * QT, QT, lq, lk, KN);
    load_tile<HS, QT, FA_THREADS>(sQ, qb, d.q_row, lq - qt * QT);
    if (nt > 0) {
        load_tile<HS, KN, FA_THREADS>(sK, kb, d.k_row, lk);
        load_tile<HS, KN, FA_THREADS>(sV, vb, d.v_row, lk);
    }
    cp_async_commit();
    const float c2 = d.scale * FA_LOG2E;       // scores in base 2
    const int wrow0 = warp * 16 * MT;           // the warp's first row in the tile
    const int qrow0 = qt * QT + wrow0 + g8;     // this lane's rows: qrow0 + mt·16 + 8·r
    const int shift = lk - lq;                  // query i sees keys j <= i + shift
    float m[MT][2], l[MT][2], acc[MT][HS / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
        zero_acc<HS / 8>(acc[mt]);
    }
    for (int j = 0; j < nt; j++) {
        kv_tile_wait<HS, KN>(j, nt, sK, sV, kb, vb, d.k_row, d.v_row, lk);
        const uint32_t sKt = sK + (j & 1) * KN * HS * 2, sVt = sV + (j & 1) * KN * HS * 2;
        float s[MT][KN / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) { zero_acc<KN / 8>(s[mt]); }
        mma_abt<HS, MT, KN>(s, sQ, wrow0, sKt, 0, lane);
        // scale; mask only on a tile that holds a key past the sequence or past some query's causal limit
        const bool edge = (j + 1) * KN > lk || (d.causal && (j + 1) * KN - 1 > qt * QT + shift);
        float mx[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            mx[mt][0] = mx[mt][1] = -INFINITY;
#pragma unroll
            for (int n = 0; n < KN / 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = s[mt][n][e] * c2;
                    if (edge) {
                        const int key = j * KN + n * 8 + 2 * t4 + (e & 1), row = qrow0 + mt * 16 + 8 * (e >> 1);
                        if (key >= lk || (d.causal && key > row + shift)) { x = -INFINITY; }
                    }
                    s[mt][n][e] = x;
                    mx[mt][e >> 1] = fmaxf(mx[mt][e >> 1], x);
                }
            }
        }
        uint32_t p[MT][KN / 16][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            float corr[2], base[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const float mnew = fmaxf(m[mt][r], quad_max(mx[mt][r]));
                base[r] = mnew == -INFINITY ? 0.0f : mnew; // a row with nothing visible yet stays at zero weight
                corr[r] = exp2f(m[mt][r] - base[r]);
                m[mt][r] = mnew;
                l[mt][r] *= corr[r];
            }
#pragma unroll
            for (int n = 0; n < KN / 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[mt][n][e] = exp2f(s[mt][n][e] - base[e >> 1]);
                    l[mt][e >> 1] += s[mt][n][e];
                }
            }
#pragma unroll
            for (int n = 0; n < HS / 8; n++) {
                acc[mt][n][0] *= corr[0]; acc[mt][n][1] *= corr[0];
                acc[mt][n][2] *= corr[1]; acc[mt][n][3] *= corr[1];
            }
            pack_a<KN>(p[mt], s[mt]);
        }
        mma_pv<HS, MT, KN>(acc, p, sVt, 0, lane);
        __syncthreads(); // the stage is refilled by the next iteration's prefetch
    }
    if (nt == 0) { cp_async_wait<0>(); }
    bf16 *ob = o + tok_offset(d, b, q0, qt * QT, d.o_row, d.o_seq, 0) + (long)h * HS;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        l[mt][0] = quad_sum(l[mt][0]);
        l[mt][1] = quad_sum(l[mt][1]);
        const float inv0 = l[mt][0] > 0.0f ? 1.0f / l[mt][0] : 0.0f, inv1 = l[mt][1] > 0.0f ? 1.0f / l[mt][1] : 0.0f;
        store_rows<HS>(ob, d.o_row, acc[mt], inv0, inv1, wrow0 + mt * 16, lq - qt * QT, lane);
        if (t4 == 0) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = qrow0 + mt * 16 + 8 * r;
                if (row < lq) {
                    lse[(q0 + row) * d.NH + h] = l[mt][r] > 0.0f ? (m[mt][r] + log2f(l[mt][r])) / FA_LOG2E : -INFINITY;
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------------------------------------------
// backward

// D (tokens, NH) = Σ_d dO · O, one warp per (token, head)
template <int HS>
__global__ void flash_bwd_dot_kernel(float *D, AttnDims d, const __nv_bfloat16 *dout, const __nv_bfloat16 *out,
                                     long tokens) {
    const long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= tokens * d.NH) { return; }
    const long tok = w / d.NH;
    const int h = (int)(w % d.NH);
    const __nv_bfloat16 *a = dout + tok * d.o_row + (long)h * HS, *c = out + tok * d.o_row + (long)h * HS;
    float s = 0.0f;
    for (int i = lane * 2; i < HS; i += 64) {
        const float2 x = __bfloat1622float2(*(const __nv_bfloat162 *)(a + i));
        const float2 y = __bfloat1622float2(*(const __nv_bfloat162 *)(c + i));
        s += x.x * y.x + x.y * y.y;
    }
    s = warp_reduce_sum(s);
    if (lane == 0) { D[w] = s; }
}

// dK, dV of one tile of 64·MT keys of kv head kvh: grid (ceil(Lk / (64·MT)), NKV, B), 128·QS threads. Loops over the
// query heads of the kv head and, for each, over the 64-query tiles that see the key tile: the sums over heads and
// tiles run in a fixed order. Warp w owns keys (w % 4)·16·MT .. +16·MT of the tile and queries (w / 4)·64/QS .. of
// each query tile; with QS = 2 the two halves' partial dK, dV are added through shared memory at the end.
template <int HS, int MT, int QS>
__global__ void __launch_bounds__(FA_THREADS *QS) flash_bwd_dkdv_kernel(AttnDims d, __nv_bfloat16 *dk,
                                                                         __nv_bfloat16 *dv, const __nv_bfloat16 *q,
                                                                         const __nv_bfloat16 *k,
                                                                         const __nv_bfloat16 *v,
                                                                         const __nv_bfloat16 *dout, const float *lse,
                                                                         const float *D) {
    using namespace attn_detail;
    constexpr int KT = 64 * MT, NQ = 64 / QS, NTH = FA_THREADS * QS;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    const uint32_t sK = smem_addr(fa_smem), sV = sK + KT * HS * 2, sQ = sV + KT * HS * 2, sO = sQ + 2 * FA_TILE * HS * 2;
    float *sL = (float *)(fa_smem + (2 * KT + 4 * FA_TILE) * HS * 2), *sD = sL + 2 * FA_TILE; // (2, 64) each
    const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, G = d.NH / d.NKV;
    long q0, k0;
    int lq, lk;
    seq_span(d, b, 0, q0, lq);
    seq_span(d, b, 1, k0, lk);
    if (kt * KT >= lk) { return; }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
    const int kw0 = (warp & 3) * 16 * MT, qw0 = (warp >> 2) * NQ; // the warp's keys (in the tile), queries (in a q tile)
    const int shift = lk - lq;
    const long koff = tok_offset(d, b, k0, kt * KT, d.k_row, d.k_seq, 1) + (long)kvh * HS;
    const long voff = tok_offset(d, b, k0, kt * KT, d.v_row, d.v_seq, 1) + (long)kvh * HS;
    load_tile<HS, KT, NTH>(sK, k + koff, d.k_row, lk - kt * KT);
    load_tile<HS, KT, NTH>(sV, v + voff, d.v_row, lk - kt * KT);
    cp_async_commit();
    // the query tiles that see this key tile: from the one holding query kt·KT − shift (causal) to the last
    const int first = d.causal ? max(0, (kt * KT - shift) / FA_TILE) : 0;
    const int last = (lq + FA_TILE - 1) / FA_TILE; // exclusive
    const int per_head = max(0, last - first), total = per_head * G;
    const float c2 = d.scale * FA_LOG2E;
    float dK[MT][HS / 8][4], dV[MT][HS / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        zero_acc<HS / 8>(dK[mt]);
        zero_acc<HS / 8>(dV[mt]);
    }
    // stage `st` of the (head, query tile) sequence's element `it`: Q, dO, LSE·log2e and D of those 64 queries
    auto load_q = [&](int it, int st) {
        const int h = kvh * G + it / per_head, qt = first + it % per_head;
        const long qoff = tok_offset(d, b, q0, qt * FA_TILE, d.q_row, d.q_seq, 0) + (long)h * HS;
        const long ooff = tok_offset(d, b, q0, qt * FA_TILE, d.o_row, d.o_seq, 0) + (long)h * HS;
        load_tile<HS, FA_TILE, NTH>(sQ + st * FA_TILE * HS * 2, q + qoff, d.q_row, lq - qt * FA_TILE);
        load_tile<HS, FA_TILE, NTH>(sO + st * FA_TILE * HS * 2, dout + ooff, d.o_row, lq - qt * FA_TILE);
        for (int i = threadIdx.x; i < FA_TILE; i += NTH) {
            const int row = qt * FA_TILE + i;
            const bool ok = row < lq;
            sL[st * FA_TILE + i] = lse2(lse, (q0 + row) * d.NH + h, ok); // padding: P = 0
            sD[st * FA_TILE + i] = ok ? D[(q0 + row) * d.NH + h] : 0.0f;
        }
    };
    if (total > 0) { load_q(0, 0); }
    cp_async_commit();
    const int krow0 = kt * KT + kw0 + g8; // this lane's keys: krow0 + mt·16 + 8·r
    for (int it = 0; it < total; it++) {
        const int st = it & 1, qt = first + it % per_head;
        if (it + 1 < total) {
            load_q(it + 1, st ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint32_t sQt = sQ + st * FA_TILE * HS * 2, sOt = sO + st * FA_TILE * HS * 2;
        const float *sLt = sL + st * FA_TILE, *sDt = sD + st * FA_TILE;
        // Sᵀ (keys × queries) = K Qᵀ, then Pᵀ = exp2(c2·Sᵀ − LSE₂[query]), masked
        float s[MT][NQ / 8][4], dp[MT][NQ / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            zero_acc<NQ / 8>(s[mt]);
            zero_acc<NQ / 8>(dp[mt]);
        }
        mma_abt<HS, MT, NQ>(s, sK, kw0, sQt, qw0, lane);
        const bool edge = (kt + 1) * KT > lk || (d.causal && (kt + 1) * KT - 1 > qt * FA_TILE + qw0 + shift);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int n = 0; n < NQ / 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = qw0 + n * 8 + 2 * t4 + (e & 1);
                    float pv = exp2f(s[mt][n][e] * c2 - sLt[qi]);
                    if (edge) {
                        const int key = krow0 + mt * 16 + 8 * (e >> 1);
                        if (key >= lk || (d.causal && key > qt * FA_TILE + qi + shift)) { pv = 0.0f; }
                    }
                    s[mt][n][e] = pv;
                }
            }
        }
        uint32_t p[MT][NQ / 16][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) { pack_a<NQ>(p[mt], s[mt]); }
        mma_pv<HS, MT, NQ>(dV, p, sOt, qw0, lane); // dV += Pᵀ dO
        mma_abt<HS, MT, NQ>(dp, sV, kw0, sOt, qw0, lane); // dPᵀ = V dOᵀ
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int n = 0; n < NQ / 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) { dp[mt][n][e] = s[mt][n][e] * (dp[mt][n][e] - sDt[qw0 + n * 8 + 2 * t4 + (e & 1)]); }
            }
            pack_a<NQ>(p[mt], dp[mt]);
        }
        mma_pv<HS, MT, NQ>(dK, p, sQt, qw0, lane); // dK += dSᵀ Q
        __syncthreads();
    }
    if (total == 0) { cp_async_wait<0>(); }
    if (QS == 2) { // the second half's partials through shared memory (conflict-free: element i of lane at [i][lane])
        constexpr int NACC = MT * (HS / 8) * 4;
        float *red = (float *)fa_smem + (warp & 3) * 2 * NACC * 32;
        __syncthreads(); // every warp is done with the tiles the buffer overlays
        if (warp >= 4) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
#pragma unroll
                for (int n = 0; n < HS / 8; n++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int i = (mt * (HS / 8) + n) * 4 + e;
                        red[i * 32 + lane] = dK[mt][n][e];
                        red[(NACC + i) * 32 + lane] = dV[mt][n][e];
                    }
                }
            }
        }
        __syncthreads();
        if (warp >= 4) { return; }
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int n = 0; n < HS / 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = (mt * (HS / 8) + n) * 4 + e;
                    dK[mt][n][e] += red[i * 32 + lane];
                    dV[mt][n][e] += red[(NACC + i) * 32 + lane];
                }
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        store_rows<HS>(dk + koff, d.k_row, dK[mt], d.scale, d.scale, kw0 + mt * 16, lk - kt * KT, lane);
        store_rows<HS>(dv + voff, d.v_row, dV[mt], 1.0f, 1.0f, kw0 + mt * 16, lk - kt * KT, lane);
    }
}

// dQ of one tile of 64·MT queries: grid (ceil(Lq / (64·MT)), NH, B); loops over the key tiles it sees. Each warp owns
// 16·MT queries.
template <int HS, int MT>
__global__ void __launch_bounds__(FA_THREADS) flash_bwd_dq_kernel(AttnDims d, __nv_bfloat16 *dq,
                                                                   const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                                                   const __nv_bfloat16 *v, const __nv_bfloat16 *dout,
                                                                   const float *lse, const float *D) {
    using namespace attn_detail;
    constexpr int QT = 64 * MT;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    const uint32_t sQ = smem_addr(fa_smem), sO = sQ + QT * HS * 2, sK = sO + QT * HS * 2, sV = sK + 2 * FA_TILE * HS * 2;
    const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / (d.NH / d.NKV);
    long q0, k0;
    int lq, lk;
    seq_span(d, b, 0, q0, lq);
    seq_span(d, b, 1, k0, lk);
    if (qt * QT >= lq) { return; }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, t4 = lane & 3;
    const int shift = lk - lq, nt = key_tiles(d, qt * QT, QT, lq, lk, FA_TILE);
    const long qoff = tok_offset(d, b, q0, qt * QT, d.q_row, d.q_seq, 0) + (long)h * HS;
    const long ooff = tok_offset(d, b, q0, qt * QT, d.o_row, d.o_seq, 0) + (long)h * HS;
    const bf16 *kb = k + tok_offset(d, b, k0, 0, d.k_row, d.k_seq, 1) + (long)kvh * HS;
    const bf16 *vb = v + tok_offset(d, b, k0, 0, d.v_row, d.v_seq, 1) + (long)kvh * HS;
    load_tile<HS, QT, FA_THREADS>(sQ, q + qoff, d.q_row, lq - qt * QT);
    load_tile<HS, QT, FA_THREADS>(sO, dout + ooff, d.o_row, lq - qt * QT);
    if (nt > 0) {
        load_tile<HS, FA_TILE, FA_THREADS>(sK, kb, d.k_row, lk);
        load_tile<HS, FA_TILE, FA_THREADS>(sV, vb, d.v_row, lk);
    }
    cp_async_commit();
    const int wrow0 = warp * 16 * MT, qrow0 = qt * QT + wrow0 + g8;
    float L2[MT][2], Dr[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = qrow0 + mt * 16 + 8 * r;
            L2[mt][r] = lse2(lse, (q0 + row) * d.NH + h, row < lq);
            Dr[mt][r] = row < lq ? D[(q0 + row) * d.NH + h] : 0.0f;
        }
    }
    const float c2 = d.scale * FA_LOG2E;
    float dQ[MT][HS / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) { zero_acc<HS / 8>(dQ[mt]); }
    for (int j = 0; j < nt; j++) {
        kv_tile_wait<HS, FA_TILE>(j, nt, sK, sV, kb, vb, d.k_row, d.v_row, lk);
        const uint32_t sKt = sK + (j & 1) * FA_TILE * HS * 2, sVt = sV + (j & 1) * FA_TILE * HS * 2;
        float s[MT][8][4], dp[MT][8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            zero_acc<8>(s[mt]);
            zero_acc<8>(dp[mt]);
        }
        mma_abt<HS, MT, 64>(s, sQ, wrow0, sKt, 0, lane);  // S = Q Kᵀ
        mma_abt<HS, MT, 64>(dp, sO, wrow0, sVt, 0, lane); // dP = dO Vᵀ
        const bool edge = (j + 1) * FA_TILE > lk || (d.causal && (j + 1) * FA_TILE - 1 > qt * QT + shift);
        uint32_t p[MT][4][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int n = 0; n < 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float pv = exp2f(s[mt][n][e] * c2 - L2[mt][e >> 1]);
                    if (edge) {
                        const int key = j * FA_TILE + n * 8 + 2 * t4 + (e & 1), row = qrow0 + mt * 16 + 8 * (e >> 1);
                        if (key >= lk || (d.causal && key > row + shift)) { pv = 0.0f; }
                    }
                    dp[mt][n][e] = pv * (dp[mt][n][e] - Dr[mt][e >> 1]); // dS
                }
            }
            pack_a<64>(p[mt], dp[mt]);
        }
        mma_pv<HS, MT, 64>(dQ, p, sKt, 0, lane); // dQ += dS K
        __syncthreads();
    }
    if (nt == 0) { cp_async_wait<0>(); }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        store_rows<HS>(dq + qoff, d.q_row, dQ[mt], d.scale, d.scale, wrow0 + mt * 16, lq - qt * QT, lane);
    }
}

// ----------------------------------------------------------------------------------------------------------------
// decode: B single-token queries against KV caches, split along the context

// One CTA = (kv head, a group of up to GH of the query heads that read it, sequence b, slice s): positions
// [s·slice, (s+1)·slice) ∩ [0, len_b) of the sequence's cache. Each key and value row is read once and serves the
// CTA's query heads (GQA: a kv head's rows are not re-read per query head). A row is read by LPP = HS/8 lanes, 8
// elements (one 16-byte load) each, so a warp reads SG = 32/LPP positions side by side, and each lane keeps
// dec_rpl() such loads of K and of V in flight (4 KB a warp; 2 KB with four query heads a CTA). Each sub-group of LPP
// lanes runs its own online softmax over the positions it reads (a score is a sum over its LPP lanes: log2(LPP)
// shuffles, not five); at the end of the slice the sub-groups are combined within the warp, then the four warps
// through shared memory, always in the same order. (Lanes across the whole row, 2 elements a lane at HS = 64, cost a
// five-step warp reduction a position and ran issue-bound: the 410M models' heads of 64 read their caches at 2.0 TB/s
// at batch 64, against 3.5 TB/s for heads of 128: NOTES.md, issue 14 round 11.)
// The (max, sum, partial output) of each query head goes to part (sequence b's at b·part_seq floats: (NH, slices,
// HS+2), then a counter a CTA group); the last CTA of a (sequence, kv head, group) to store its partials (a counter
// after them: __threadfence, atomicAdd) merges the group's slices into y in slice order, the same arithmetic whichever
// CTA is last, and resets the counter (zero before the first launch: flash_decode_workspace_floats' note). q (B, NH·HS)
// at q_row elements per sequence; kcache/vcache: sequence b's (context, NKV·HS) rows at b·cache_seq elements; len_b =
// lens[b] + len_add. 16-byte aligned rows (flash_attention_decode checks).
// STEP (the model's decode step, flash_attention_decode_step): q is the projection's row of each sequence (the NH q
// heads, the NKV k heads, the NKV v heads, not rotated) and the token at t = len_b − 1 is the new one: its key and
// value come from that row, not the cache; RoPE (theta > 0) rotates q and k here as attention_rope_kernel does (pairs
// (j, j + HS/2) are lanes li, li ^ LPP/2; rounded to bf16 as it stores them: the same bits), and the group-0 CTA whose
// slice holds t appends the key and value to the caches. The rows before t and the positions do not depend on the
// kernel before this one (the in-projection), so the angles, the first round of row loads and, with small caches (pf),
// the L2 prefetch of the slice's later rows go before its wait. The angles (HS/2, one a thread) and the new key and
// value (warp 0 makes them) pass through shared memory, each behind a barrier only where it is used (RoPE; the CTA
// whose slice holds t): held in registers across the position loop they took 94 registers where the plain kernel
// takes 72 (5 CTAs an SM, not 7: the hybrid at batch 64 +0.01 ms; Transformer++ at batch 1 0.698 -> 0.595 ms a step
// without them: NOTES.md, inference round 16). STAGE (a step with a small cache: flash_decode_stages) copies the
// slice's rows into shared memory (dynamic, (slice, HS) keys then values) before the wait instead of the first round's
// loads and the L2 prefetch, and its rounds read them from there after it.
template <int GH> __host__ __device__ constexpr int dec_rpl() { return GH == 4 ? 2 : 4; }
__device__ __forceinline__ void unpack8_bf16(float (&x)[8], uint4 u) {
    x[0] = tiles::bf_lo(u.x); x[1] = tiles::bf_hi(u.x); x[2] = tiles::bf_lo(u.y); x[3] = tiles::bf_hi(u.y);
    x[4] = tiles::bf_lo(u.z); x[5] = tiles::bf_hi(u.z); x[6] = tiles::bf_lo(u.w); x[7] = tiles::bf_hi(u.w);
}
// a lane's 8 elements of a head rotated (RoPE): lanes li < LPP/2 hold elements j of the first half, their partners
// li + LPP/2 elements j + HS/2; cs (HS/2) the angles of every j
template <int LPP> __device__ __forceinline__ uint4 rope_lane8(uint4 u, const float2 *cs, int li) {
    uint4 o;
    o.x = __shfl_xor_sync(0xffffffffu, u.x, LPP / 2);
    o.y = __shfl_xor_sync(0xffffffffu, u.y, LPP / 2);
    o.z = __shfl_xor_sync(0xffffffffu, u.z, LPP / 2);
    o.w = __shfl_xor_sync(0xffffffffu, u.w, LPP / 2);
    float x[8], px[8];
    unpack8_bf16(x, u);
    unpack8_bf16(px, o);
    const bool first = li < LPP / 2;
    __nv_bfloat16 r[8];
#pragma unroll
    for (int e = 0; e < 8; e++) {
        float o1, o2;
        const float2 c = cs[(li % (LPP / 2)) * 8 + e];
        rope_rotate(&o1, &o2, first ? x[e] : px[e], first ? px[e] : x[e], c.x, c.y);
        r[e] = __float2bfloat16(first ? o1 : o2);
    }
    return *(const uint4 *)r;
}
template <int HS, int GH, bool STEP, bool STAGE = false>
__global__ void __launch_bounds__(128) flash_decode_kernel(__nv_bfloat16 *y, long y_row, float *part, long part_seq,
                                                            const __nv_bfloat16 *q, long q_row, __nv_bfloat16 *kcache,
                                                            __nv_bfloat16 *vcache, long cache_seq, const int *lens,
                                                            int len_add, int NH, int NKV, int slice, int slices,
                                                            float scale, float theta, int pf) {
    if constexpr (!STEP) { pdl_wait(); } // (a decode step launches it programmatically: cuda_common.h)
    constexpr int LPP = HS / 8, SG = 32 / LPP, RPL = dec_rpl<GH>(), WPOS = SG * RPL; // WPOS: a warp's positions a round
    __shared__ float pm[4][GH], pl[4][GH], pacc[4][GH][HS];
    __shared__ float2 cs[HS / 2];          // STEP with RoPE: the angles of the token's pairs
    __shared__ uint4 knew[HS / 8], vnew[HS / 8]; // STEP: the new token's key (rotated) and value, if t is in the slice
    __shared__ int last;
    extern __shared__ __align__(16) uint4 dec_rows[]; // STAGE: the slice's (slice, HS/8) key pieces, then its values
    const int G = NH / NKV, groups = (G + GH - 1) / GH;
    const int kvh = blockIdx.x / groups, g0 = (blockIdx.x % groups) * GH, ng = min(GH, G - g0);
    const int b = blockIdx.y, s = blockIdx.z, h0 = kvh * G + g0; // query heads h0 .. h0+ng−1 read kv head kvh
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, inner = NKV * HS;
    const int sub = lane / LPP, li = lane % LPP; // this lane's position slot in a round, its elements 8·li .. 8·li+7
    const int len = lens[b] + len_add, p0 = s * slice, p1 = min(len, p0 + slice), t = len - 1;
    // the caches' rows of this sequence and kv head (position p at + p · inner), and this lane's 8 elements of them
    __nv_bfloat16 *const kb = kcache + (long)b * cache_seq + (long)kvh * HS;
    __nv_bfloat16 *const vb = vcache + (long)b * cache_seq + (long)kvh * HS;
    __nv_bfloat16 *const kc = kb + li * 8, *const vc = vb + li * 8;
    uint4 kr[RPL], vr[RPL]; // a round's rows: load j of this lane is position pw + j·SG + sub
    const uint4 *ks = dec_rows, *vs = dec_rows + (size_t)slice * (HS / 8);
    auto load_round = [&](int pw) {
#pragma unroll
        for (int j = 0; j < RPL; j++) {
            const int p = pw + j * SG + sub;
            kr[j] = vr[j] = make_uint4(0u, 0u, 0u, 0u);
            if (p < p1 && (!STEP || p != t)) {
                if constexpr (STAGE) {
                    kr[j] = ks[(p - p0) * (HS / 8) + li];
                    vr[j] = vs[(p - p0) * (HS / 8) + li];
                } else {
                    kr[j] = *(const uint4 *)(kc + (long)p * inner);
                    vr[j] = *(const uint4 *)(vc + (long)p * inner);
                }
            }
        }
    };
    int pw = p0 + warp * WPOS;
    if constexpr (STAGE) { // the slice's rows into shared memory, all before the wait (they do not depend on it)
        for (int i = threadIdx.x; i < (p1 - p0) * (HS / 8); i += blockDim.x) {
            const int p = p0 + i / (HS / 8), c = i % (HS / 8);
            if (p != t) {
                tiles::cp_async16(tiles::smem_addr(dec_rows + i), kb + (long)p * inner + c * 8);
                tiles::cp_async16(tiles::smem_addr(dec_rows + (size_t)slice * (HS / 8) + i), vb + (long)p * inner + c * 8);
            }
        }
        tiles::cp_async_commit();
    } else {
        load_round(pw);
    }
    if constexpr (STEP) {
        if (pf && !STAGE) { // (a small cache: the slice's later rounds into L2 too, so that after the wait they are L2 trips)
            constexpr int LINES = HS >= 64 ? HS / 64 : 1; // 128-byte lines a row
            for (int i = threadIdx.x; i < 2 * LINES * (p1 - p0); i += blockDim.x) {
                const int p = p0 + i / (2 * LINES), r = i % (2 * LINES);
                if (p != t) { prefetch_l2((r & 1 ? vb : kb) + (long)p * inner + (r >> 1) * 64); }
            }
        }
        if (theta > 0.0f && threadIdx.x < HS / 2) { cs[threadIdx.x] = rope_cos_sin(t, threadIdx.x, HS, theta); }
        pdl_wait();
        if constexpr (STAGE) {
            tiles::cp_async_wait<0>();
            __syncthreads(); // (the rows; cs)
            load_round(pw);
        } else if (theta > 0.0f) {
            __syncthreads(); // (cs; uniform)
        }
    }
    pdl_trigger();
    float qv[GH][8], m[GH], l[GH], acc[GH][8];
#pragma unroll
    for (int g = 0; g < GH; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
        uint4 u = make_uint4(0u, 0u, 0u, 0u);
        if (g < ng) { u = *(const uint4 *)(q + (long)b * q_row + (long)(h0 + g) * HS + li * 8); }
        if constexpr (STEP) {
            if (theta > 0.0f) { u = rope_lane8<LPP>(u, cs, li); }
        }
        unpack8_bf16(qv[g], u);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            qv[g][e] *= scale;
            acc[g][e] = 0.0f;
        }
    }
    if constexpr (STEP) {
        if (t >= p0 && t < p0 + slice) { // (the CTA's slice: uniform)
            if (warp == 0) {
                const __nv_bfloat16 *row = q + (long)b * q_row + (long)NH * HS + (long)kvh * HS + li * 8;
                uint4 k = *(const uint4 *)row;
                const uint4 v = *(const uint4 *)(row + inner);
                if (theta > 0.0f) { k = rope_lane8<LPP>(k, cs, li); }
                if (sub == 0) {
                    knew[li] = k;
                    vnew[li] = v;
                    if (g0 == 0) { // the append, once a kv head
                        *(uint4 *)(kc + (long)t * inner) = k;
                        *(uint4 *)(vc + (long)t * inner) = v;
                    }
                }
            }
            __syncthreads(); // (knew, vnew)
        }
    }
    for (; pw < p1; pw += 4 * WPOS) {
        if constexpr (STEP) {
#pragma unroll
            for (int j = 0; j < RPL; j++) {
                if (pw + j * SG + sub == t) { kr[j] = knew[li]; vr[j] = vnew[li]; }
            }
        }
        if constexpr (GH == 4) { // 2 loads a lane in flight only: the next round's rows into L2 meanwhile, a lane a line
            if (li % 8 == 0) {   // (GQA batch 64, 16K: 1.83 -> 1.58 ms; no gain, or a loss, with 4 loads: NOTES.md)
#pragma unroll
                for (int j = 0; j < RPL; j++) {
                    const int p = pw + 4 * WPOS + j * SG + sub;
                    if (p < p1) {
                        prefetch_l2(kc + (long)p * inner);
                        prefetch_l2(vc + (long)p * inner);
                    }
                }
            }
        }
        float sc[GH][RPL];
#pragma unroll
        for (int j = 0; j < RPL; j++) {
            float kx[8];
            unpack8_bf16(kx, kr[j]);
#pragma unroll
            for (int g = 0; g < GH; g++) {
                float d = qv[g][0] * kx[0];
#pragma unroll
                for (int e = 1; e < 8; e++) { d = fmaf(qv[g][e], kx[e], d); }
#pragma unroll
                for (int off = LPP / 2; off > 0; off >>= 1) { d += __shfl_xor_sync(0xffffffffu, d, off); }
                sc[g][j] = pw + j * SG + sub < p1 ? d : -INFINITY;
            }
        }
#pragma unroll
        for (int g = 0; g < GH; g++) {
            float mn = m[g];
#pragma unroll
            for (int j = 0; j < RPL; j++) { mn = fmaxf(mn, sc[g][j]); }
            if (mn == -INFINITY) { continue; } // (no position of this sub-group yet)
            const float corr = __expf(m[g] - mn);
            l[g] *= corr;
#pragma unroll
            for (int e = 0; e < 8; e++) { acc[g][e] *= corr; }
#pragma unroll
            for (int j = 0; j < RPL; j++) {
                if (pw + j * SG + sub < p1) {
                    const float w = __expf(sc[g][j] - mn);
                    float vx[8];
                    unpack8_bf16(vx, vr[j]);
                    l[g] += w;
#pragma unroll
                    for (int e = 0; e < 8; e++) { acc[g][e] = fmaf(w, vx[e], acc[g][e]); }
                }
            }
            m[g] = mn;
        }
        if (pw + 4 * WPOS < p1) { load_round(pw + 4 * WPOS); }
    }
    // the warp's state: the sub-groups' states at their common max, summed over the sub-groups (xor butterflies: every
    // lane of an element slot ends with the same bits)
#pragma unroll
    for (int g = 0; g < GH; g++) {
        float M = m[g];
#pragma unroll
        for (int off = LPP; off < 32; off <<= 1) { M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off)); }
        const float c = m[g] == -INFINITY ? 0.0f : __expf(m[g] - M);
        float lw = l[g] * c;
#pragma unroll
        for (int e = 0; e < 8; e++) { acc[g][e] *= c; }
#pragma unroll
        for (int off = LPP; off < 32; off <<= 1) {
            lw += __shfl_xor_sync(0xffffffffu, lw, off);
#pragma unroll
            for (int e = 0; e < 8; e++) { acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], off); }
        }
        if (lane == 0) { pm[warp][g] = M; pl[warp][g] = lw; }
        if (sub == 0) {
#pragma unroll
            for (int e = 0; e < 8; e++) { pacc[warp][g][li * 8 + e] = acc[g][e]; }
        }
    }
    __syncthreads();
    // each query head's partial result: [0, HS) the unnormalized output, [HS] the sum of weights, [HS+1] the max
    float *pseq = part + (long)b * part_seq;
    for (int g = 0; g < ng; g++) {
        float *out = pseq + ((long)(h0 + g) * slices + s) * (HS + 2);
        float M = -INFINITY;
        for (int w = 0; w < 4; w++) { M = fmaxf(M, pm[w][g]); }
        for (int i = threadIdx.x; i < HS + 2; i += blockDim.x) {
            if (i == HS + 1) { out[i] = M; continue; }
            float sum = 0.0f;
            for (int w = 0; w < 4; w++) {
                if (pm[w][g] != -INFINITY) { sum += (i < HS ? pacc[w][g][i] : pl[w][g]) * __expf(pm[w][g] - M); }
            }
            out[i] = sum;
        }
    }
    // the last CTA of the group merges: y from the slices' partial results, in slice order (deterministic)
    __threadfence();
    __syncthreads();
    int *count = (int *)(pseq + (long)NH * slices * (HS + 2)) + blockIdx.x;
    if (threadIdx.x == 0) { last = atomicAdd(count, 1) == slices - 1; }
    __syncthreads();
    if (!last) { return; }
    __threadfence();
    for (int g = 0; g < ng; g++) {
        const int h = h0 + g;
        const float *pb = pseq + (long)h * slices * (HS + 2);
        float M = -INFINITY;
        for (int r = 0; r < slices; r++) { M = fmaxf(M, __ldcg(pb + r * (HS + 2) + HS + 1)); }
        for (int i = threadIdx.x; i < HS; i += blockDim.x) {
            float num = 0.0f, den = 0.0f;
            for (int r = 0; r < slices; r++) {
                const float ms = __ldcg(pb + r * (HS + 2) + HS + 1);
                if (ms == -INFINITY) { continue; }
                const float f = __expf(ms - M);
                num += __ldcg(pb + r * (HS + 2) + i) * f;
                den += __ldcg(pb + r * (HS + 2) + HS) * f;
            }
            y[(long)b * y_row + (long)h * HS + i] = __float2bfloat16(den > 0.0f ? num / den : 0.0f);
        }
    }
    if (threadIdx.x == 0) { *count = 0; } // (for the next launch)
}

// ----------------------------------------------------------------------------------------------------------------
// launchers

static void attn_validate(const AttnDims *d) {
    const char *why = attn_check_dims(d);
    if (why != NULL) {
        fail_with_hint("see the limits in attention_kernels.cuh", "attention: unsupported shape (HS=%d NH=%d NKV=%d): %s",
                       d->HS, d->NH, d->NKV, why);
    }
}

// the launch configurations (one numeric contract: MT and QS change which warp computes what, not the sums' order
// within a warp's row, and the test holds every head dim to the same bound)
static inline int fa_fwd_mt(int HS) { return 2; }
static inline int fa_dq_mt(int HS) { return HS <= 64 ? 2 : 1; }
static inline int fa_dkdv_mt(int HS) { return HS <= 64 ? 2 : 1; } // QS = MT: 8 warps when the tile holds 128 keys
// bytes of shared memory of each kernel
static inline int fa_fwd_kn(int HS) { return HS == 128 ? 32 : 64; } // keys a tile: S stays in registers at HS 128
static inline size_t fa_fwd_smem(int HS, int MT) { return (size_t)(64 * MT + 4 * fa_fwd_kn(HS)) * HS * 2; }
static inline size_t fa_dkdv_smem(int HS, int MT, int QS) {
    const size_t tiles = (size_t)(2 * 64 * MT + 4 * FA_TILE) * HS * 2 + 4 * FA_TILE * sizeof(float);
    const size_t red = QS == 2 ? (size_t)4 * MT * HS * 128 : 0; // 4 warps' (dK, dV) partials: 2·MT·HS/2·32 floats each
    return tiles > red ? tiles : red;
}
static inline size_t fa_dq_smem(int HS, int MT) { return (size_t)(2 * 64 * MT + 4 * FA_TILE) * HS * 2; }

template <int HS> static void flash_forward_hs(__nv_bfloat16 *o, float *lse, const __nv_bfloat16 *q,
                                               const __nv_bfloat16 *k, const __nv_bfloat16 *v, const AttnDims *d,
                                               cudaStream_t stream) {
    constexpr int MT = 2, KN = HS == 128 ? 32 : 64; // fa_fwd_mt, fa_fwd_kn
    dim3 grid(CEIL_DIV(d->Lq, 64 * MT), d->NH, d->B);
    kernel_smem_limit(flash_fwd_kernel<HS, MT, KN>, fa_fwd_smem(HS, MT));
    flash_fwd_kernel<HS, MT, KN><<<grid, FA_THREADS, fa_fwd_smem(HS, MT), stream>>>(*d, q, k, v, o, lse);
}

// o (queries, NH·HS rows per d's strides) and lse (query tokens, NH) fp32 from q, k, v
static void flash_attention_forward(__nv_bfloat16 *o, float *lse, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                    const __nv_bfloat16 *v, const AttnDims *d, cudaStream_t stream) {
    attn_validate(d);
    if (d->Lq == 0) { return; }
    if (d->HS == 32) { flash_forward_hs<32>(o, lse, q, k, v, d, stream); }
    else if (d->HS == 64) { flash_forward_hs<64>(o, lse, q, k, v, d, stream); }
    else { flash_forward_hs<128>(o, lse, q, k, v, d, stream); }
    cudaCheck(cudaGetLastError());
}

template <int HS> static void flash_backward_hs(__nv_bfloat16 *dq, __nv_bfloat16 *dk, __nv_bfloat16 *dv, float *D,
                                                const __nv_bfloat16 *dout, const __nv_bfloat16 *q,
                                                const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                                const __nv_bfloat16 *o, const float *lse, long q_tokens,
                                                const AttnDims *d, cudaStream_t stream) {
    constexpr int MT = HS <= 64 ? 2 : 1; // fa_dq_mt and fa_dkdv_mt
    const long warps = q_tokens * d->NH;
    flash_bwd_dot_kernel<HS><<<(unsigned)CEIL_DIV(warps * 32, 256L), 256, 0, stream>>>(D, *d, dout, o, q_tokens);
    cudaCheck(cudaGetLastError());
    dim3 gk(CEIL_DIV(d->Lk, 64 * MT), d->NKV, d->B), gq(CEIL_DIV(d->Lq, 64 * MT), d->NH, d->B);
    kernel_smem_limit(flash_bwd_dkdv_kernel<HS, MT, MT>, fa_dkdv_smem(HS, MT, MT));
    kernel_smem_limit(flash_bwd_dq_kernel<HS, MT>, fa_dq_smem(HS, MT));
    flash_bwd_dkdv_kernel<HS, MT, MT><<<gk, FA_THREADS * MT, fa_dkdv_smem(HS, MT, MT), stream>>>(*d, dk, dv, q, k, v, dout,
                                                                                             lse, D);
    cudaCheck(cudaGetLastError());
    flash_bwd_dq_kernel<HS, MT><<<gq, FA_THREADS, fa_dq_smem(HS, MT), stream>>>(*d, dq, q, k, v, dout, lse, D);
    cudaCheck(cudaGetLastError());
}

// dq, dk, dv (written, strided like q, k, v) from dout (strided like o), the forward's o and lse; D: (query tokens,
// NH) fp32 scratch. q_tokens: the number of query tokens (B·Lq, or cu_q[B]).
static void flash_attention_backward(__nv_bfloat16 *dq, __nv_bfloat16 *dk, __nv_bfloat16 *dv, float *D,
                                     const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                     const __nv_bfloat16 *v, const __nv_bfloat16 *o, const float *lse, long q_tokens,
                                     const AttnDims *d, cudaStream_t stream) {
    attn_validate(d);
    if (d->cu_q == NULL && (d->o_seq != (long)d->Lq * d->o_row)) {
        fail_with_hint("pass o as contiguous sequences", "attention backward: o's sequence stride must be Lq rows");
    }
    if (d->Lq == 0 || d->Lk == 0) { return; }
    if (d->HS == 32) { flash_backward_hs<32>(dq, dk, dv, D, dout, q, k, v, o, lse, q_tokens, d, stream); }
    else if (d->HS == 64) { flash_backward_hs<64>(dq, dk, dv, D, dout, q, k, v, o, lse, q_tokens, d, stream); }
    else { flash_backward_hs<128>(dq, dk, dv, D, dout, q, k, v, o, lse, q_tokens, d, stream); }
}

// the decode split: the slice length depends on the cache capacity only (batch-invariant results): 256 positions
// up to an 8K context, then growing so that a sequence has at most 32 slices. (64 up to 2K made 16 CTAs of one round
// of loads a warp per (sequence, kv head) at a 1K context: the 410M hybrid's batch-64 step 1.660 ms, against 1.630
// with 256; batch 1 unchanged: NOTES.md, issue 14 round 11.)
static inline int flash_decode_slice(int context) {
    int slice = 256;
    while (slice < 4096 && (long)slice * 32 < context) { slice *= 2; }
    return slice;
}
static inline int flash_decode_slices(int context) { return CEIL_DIV(context, flash_decode_slice(context)); }
// a sequence's partial results, (NH, slices, HS + 2) floats, then the merge's counters (a CTA group's: at most NH),
// rounded up to 8 floats (the caches a decode state puts before it stay 16-byte aligned); the counters must be zero
// before the first launch (each launch leaves them zero)
static inline size_t flash_decode_workspace_floats(int B, int NH, int HS, int context) {
    return (size_t)B * (((size_t)NH * flash_decode_slices(context) * (HS + 2) + NH + 7) / 8 * 8);
}

// pf: where the caches are small (a batch of one or two at a short context: 8 MB or less of keys and values, a sixth
// of the L2) the step brings its slices' later rounds into L2 before the wait too; larger caches stream
// (M2RNN_ATTN_PF=0 off, 1 on, else by the cache's size)
static int flash_decode_pf_env = -1;
static inline bool flash_decode_pf(int B, int NKV, int HS, int context) {
    const int e = env_int(&flash_decode_pf_env, "M2RNN_ATTN_PF", 2);
    return e == 2 ? (double)B * context * NKV * HS * 4 <= 8e6 : e == 1;
}
// and there, where a slice's keys and values fit in 100 KB, the step stages them in shared memory before the wait
// (STAGE): after the wait its rounds read them from there instead of making a trip to L2 each, the same values in the
// same sums, so the same bits (the 410M hybrid at batch 1 0.508 -> 0.503 ms on an H200: NOTES.md, inference round
// 16). M2RNN_ATTN_STAGE=0 reads them from L2 (A/B runs; the tests take both paths).
static int flash_decode_stage = -1;
static long flash_decode_staged_launches = 0; // (the tests check the path they meant to take)
static inline size_t flash_decode_stage_bytes(int HS, int context) {
    return (size_t)flash_decode_slice(context) * HS * 2 * sizeof(__nv_bfloat16);
}
static inline bool flash_decode_stages(int B, int NKV, int HS, int context) {
    return flash_decode_pf(B, NKV, HS, context) && env_on_unless_0(&flash_decode_stage, "M2RNN_ATTN_STAGE") &&
           flash_decode_stage_bytes(HS, context) <= 100 * 1024;
}

static void flash_decode_launch(__nv_bfloat16 *y, long y_row, float *workspace, long ws_seq, const __nv_bfloat16 *q,
                                long q_row, __nv_bfloat16 *kcache, __nv_bfloat16 *vcache, long cache_seq,
                                const int *lens, int len_add, int B, int NH, int NKV, int HS, int context, float scale,
                                bool step, float theta, cudaStream_t stream) {
    if ((HS != 32 && HS != 64 && HS != 128) || NKV < 1 || NH % NKV != 0 || B < 1 || context < 1) {
        fail_with_hint("use head dim 32, 64 or 128 and kv heads dividing the heads",
                       "attention decode: HS=%d NH=%d NKV=%d B=%d context=%d", HS, NH, NKV, B, context);
    }
    if (((uintptr_t)q | (uintptr_t)kcache | (uintptr_t)vcache) % 16 != 0 || q_row % 8 != 0 || cache_seq % 8 != 0) {
        fail_with_hint("keep q and the caches 16-byte aligned, their row strides multiples of 8 elements",
                       "attention decode: q %p, caches %p %p, strides %ld %ld", (const void *)q, (const void *)kcache,
                       (const void *)vcache, q_row, cache_seq);
    }
    const int slice = flash_decode_slice(context), slices = flash_decode_slices(context);
    if (ws_seq < (long)flash_decode_workspace_floats(1, NH, HS, context)) {
        fail_with_hint("size the workspace with flash_decode_workspace_floats", "attention decode: workspace stride %ld "
                       "floats is below %zu", ws_seq, flash_decode_workspace_floats(1, NH, HS, context));
    }
    // a CTA serves up to GH query heads of one kv head: all of them for G = NH/NKV ≤ 2, else groups of 4
    const int G = NH / NKV, GH = G <= 2 ? G : 4;
    dim3 grid(NKV * CEIL_DIV(G, GH), B, slices);
    const int pf = step && flash_decode_pf(B, NKV, HS, context);
    const bool stage = step && flash_decode_stages(B, NKV, HS, context);
    const size_t stage_bytes = flash_decode_stage_bytes(HS, context);
    flash_decode_staged_launches += stage;
    auto go = [&](auto kernel, size_t smem) {
        kernel_smem_limit(kernel, smem);
        launch_k(kernel, grid, 128, smem, stream, y, y_row, workspace, ws_seq, q, q_row, kcache, vcache, cache_seq, lens,
                 len_add, NH, NKV, slice, slices, scale, theta, pf);
    };
#define FA_DECODE(HSV, GHV)                                                                                          \
    if (stage) { go(flash_decode_kernel<HSV, GHV, true, true>, stage_bytes); }                                      \
    else if (step) { go(flash_decode_kernel<HSV, GHV, true>, 0); } else { go(flash_decode_kernel<HSV, GHV, false>, 0); }
#define FA_DECODE_HS(HSV)                                                                                            \
    if (GH == 1) { FA_DECODE(HSV, 1); } else if (GH == 2) { FA_DECODE(HSV, 2); } else { FA_DECODE(HSV, 4); }
    if (HS == 32) { FA_DECODE_HS(32); } else if (HS == 64) { FA_DECODE_HS(64); } else { FA_DECODE_HS(128); }
#undef FA_DECODE_HS
#undef FA_DECODE
}

// y (B rows of y_row elements, NH·HS used) = attention of one query per sequence (q: B rows of q_row elements) over
// the first lens[b] + len_add positions of its cache (keys, values: (context, NKV·HS) rows at cache_seq elements a
// sequence). workspace: sequence b's at b·ws_seq floats, flash_decode_workspace_floats(1, NH, HS, context) each, its
// counters zero before the first call.
static void flash_attention_decode(__nv_bfloat16 *y, long y_row, float *workspace, long ws_seq,
                                   const __nv_bfloat16 *q, long q_row,
                                   const __nv_bfloat16 *kcache, const __nv_bfloat16 *vcache, long cache_seq,
                                   const int *lens, int len_add, int B, int NH, int NKV, int HS, int context,
                                   float scale, cudaStream_t stream) {
    flash_decode_launch(y, y_row, workspace, ws_seq, q, q_row, (__nv_bfloat16 *)kcache, (__nv_bfloat16 *)vcache,
                        cache_seq, lens, len_add, B, NH, NKV, HS, context, scale, false, 0.0f, stream);
}

// the model's decode step in one launch: qkv (B rows of q_row elements: the NH q heads, the NKV k heads, the NKV v
// heads of each sequence's new token, not rotated) at positions pos[b]; RoPE when theta > 0 (q and k, as
// attention_rope_kernel), the key and value appended to the caches at pos[b], and y the attention of q over positions
// 0 .. pos[b] = attention_rope_append, then flash_attention_decode over lens = pos + 1, bit for bit (test_decode_gpu)
static void flash_attention_decode_step(__nv_bfloat16 *y, long y_row, float *workspace, long ws_seq,
                                        const __nv_bfloat16 *qkv, long q_row, __nv_bfloat16 *kcache,
                                        __nv_bfloat16 *vcache, long cache_seq, const int *pos, int B, int NH, int NKV,
                                        int HS, int context, float scale, float theta, cudaStream_t stream) {
    flash_decode_launch(y, y_row, workspace, ws_seq, qkv, q_row, kcache, vcache, cache_seq, pos, 1, B, NH, NKV, HS,
                        context, scale, true, theta, stream);
}

#endif // M2RNN_ATTENTION_KERNELS_CUH
