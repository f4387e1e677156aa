/*
chunk_common.cuh: what the chunked recurrences (gdn.cuh, mamba2.cuh) share around tiles.cuh's warp_gemm:
- chunk_stage: a tile of token rows from global into shared memory as floatX (or fp32), zero-padded past the valid
  rows and columns, optionally scaled per row: cp.async for plain aligned copies (waited for by chunk_sync),
  otherwise 16-byte vector loads, several in flight per thread before any store, element by element at ragged edges;
- chunk_sync: the CTA barrier of these kernels, which first waits for the thread's cp.async copies;
- chunk_put2: the paired store of two adjacent accumulator outputs (chunk_sput2 into shared memory);
- ChunkSeq / chunk_seq / chunk_at_slot / chunk_slots: where a sequence's tokens and chunks lie, in the fixed layout
  (B sequences of T tokens) or packed (cu_seqlens, as m2rnn_kernels.cuh and the attention kernels take it).
*/
#ifndef M2RNN_CHUNK_COMMON_CUH
#define M2RNN_CHUNK_COMMON_CUH

#include <type_traits>
#include "cuda_common.h"
#include "tiles.cuh"

// dst (rows × cols, leading dimension ld) = src rows r (token stride tok_stride) × row_scale[r] where r < rv and
// c < cv, else 0; Dst floatX (the MMA operands) or float (fp32 tiles: Src float too); cols a multiple of a 16-byte
// piece of Dst, ld·sizeof(Dst) a multiple of 16. A plain copy (Src = Dst, no row scale, aligned) goes by cp.async,
// waited for by chunk_sync; otherwise 16-byte pieces: one vector load (two for fp32 into bf16) where the piece is
// whole and aligned, element by element at the edges; a thread issues the loads of CHUNK_STAGE_BATCH pieces before it
// converts and stores any (the staging is latency-bound otherwise).
// ONE_DIV (the default): where the CTA's threads divide into whole rows of pieces, a thread keeps its column for the
// whole tile (one division a tile instead of one a piece). chunk_stage<false>(...) keeps a division a piece: for the
// kernels at their register caps (the GDN prep, dqk and wy kernels), where the compiler hoists the per-thread column
// out of their loops and spills, or runs them slower (measured: dev/bench/NOTES.md, GDN log 15).
#define CHUNK_STAGE_BATCH 4
template <bool ONE_DIV = true, typename Src, typename Dst>
__device__ __forceinline__ void chunk_stage(Dst *dst, int ld, const Src *__restrict__ src, long tok_stride, int rv,
                                            int cv, int rows, int cols, const float *row_scale) {
    constexpr int VEC = 16 / sizeof(Dst), WORDS = VEC * sizeof(Src) / 16;
    static_assert(WORDS >= 1, "chunk_stage: Src narrower than Dst");
    const int cpr = cols / VEC, n = rows * cpr;
    const bool aligned = ((uintptr_t)src & 15) == 0 && ((tok_stride * (long)sizeof(Src)) & 15) == 0;
    if constexpr (std::is_same<Src, Dst>::value) {
        if (row_scale == NULL && aligned) { // a plain copy: cp.async, waited for by chunk_sync()
            if (ONE_DIV && blockDim.x % cpr == 0) { // a thread's column is the same in every row it copies
                const int c = ((int)threadIdx.x % cpr) * VEC, rs = blockDim.x / cpr;
                const bool whole = c + VEC <= cv;
                for (int r = threadIdx.x / cpr; r < rows; r += rs) {
                    Dst *d = dst + r * ld + c;
                    const Src *s = src + (long)r * tok_stride + c;
                    if (r < rv && whole) {
                        tiles::cp_async16(tiles::smem_addr(d), s);
                    } else {
#pragma unroll
                        for (int e = 0; e < VEC; e++) { d[e] = (r < rv && c + e < cv) ? s[e] : (Dst)0.0f; }
                    }
                }
                return;
            }
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int r = i / cpr, c = (i - r * cpr) * VEC;
                Dst *d = dst + r * ld + c;
                if (r < rv && c + VEC <= cv) {
                    tiles::cp_async16(tiles::smem_addr(d), src + (long)r * tok_stride + c);
                } else {
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        d[e] = (r < rv && c + e < cv) ? src[(long)r * tok_stride + c + e] : (Dst)0.0f;
                    }
                }
            }
            return;
        }
    }
    for (int i0 = threadIdx.x; i0 < n; i0 += CHUNK_STAGE_BATCH * blockDim.x) {
        uint4 raw[CHUNK_STAGE_BATCH][WORDS];
#pragma unroll
        for (int u = 0; u < CHUNK_STAGE_BATCH; u++) {
            const int i = i0 + u * blockDim.x, r = i / cpr, c = (i - r * cpr) * VEC;
            if (i < n && r < rv && c + VEC <= cv && aligned) {
                const uint4 *p = (const uint4 *)(src + (long)r * tok_stride + c);
#pragma unroll
                for (int w = 0; w < WORDS; w++) { raw[u][w] = __ldg(p + w); }
            }
        }
#pragma unroll
        for (int u = 0; u < CHUNK_STAGE_BATCH; u++) {
            const int i = i0 + u * blockDim.x, r = i / cpr, c = (i - r * cpr) * VEC;
            if (i >= n) { break; }
            float x[VEC];
            if (r < rv && c + VEC <= cv && aligned) {
                const Src *v = (const Src *)raw[u];
#pragma unroll
                for (int e = 0; e < VEC; e++) { x[e] = (float)v[e]; }
            } else {
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    x[e] = (r < rv && c + e < cv) ? (float)src[(long)r * tok_stride + c + e] : 0.0f;
                }
            }
            const float sc = (row_scale != NULL && r < rv) ? row_scale[r] : 1.0f;
            __align__(16) Dst out[VEC];
#pragma unroll
            for (int e = 0; e < VEC; e++) { out[e] = (Dst)(x[e] * sc); }
            *(uint4 *)(dst + r * ld + c) = *(const uint4 *)out;
        }
    }
}

// two adjacent outputs of an accumulator fragment (columns 2t4, 2t4 + 1): one 4-byte store where both land and align
__device__ __forceinline__ void chunk_put2(floatX *dst, float x0, float x1, bool ok0, bool ok1) {
#if !FLOATX_IS_FP32
    if (ok0 && ok1 && ((uintptr_t)dst & 3) == 0) {
        *(__nv_bfloat162 *)dst = __floats2bfloat162_rn(x0, x1);
        return;
    }
#endif
    if (ok0) { dst[0] = (floatX)x0; }
    if (ok1) { dst[1] = (floatX)x1; }
}

// two adjacent accumulator outputs (columns c, c + 1, c even) into a staged tile: one 4-byte store (8 in fp32)
__device__ __forceinline__ void chunk_sput2(floatX *dst, float x0, float x1) {
#if FLOATX_IS_FP32
    *(float2 *)dst = make_float2(x0, x1);
#else
    *(__nv_bfloat162 *)dst = __floats2bfloat162_rn(x0, x1);
#endif
}

// the CTA barrier of the chunk kernels: first this thread's cp.async copies from chunk_stage land
__device__ __forceinline__ void chunk_sync() {
    tiles::cp_async_commit();
    tiles::cp_async_wait<0>();
    __syncthreads();
}

// ----------------------------------------------------------------------------------------------------------------
// sequences and chunk slots. Fixed layout (cu_seqlens NULL): B sequences of T tokens, sequence b's token t at b·T + t.
// Packed (cu_seqlens, device (B+1,) ints, cu_seqlens[0] = 0, non-decreasing, cu_seqlens[B] = T the total): sequence b
// holds tokens cu_seqlens[b] .. cu_seqlens[b+1] − 1 and its state restarts there (length 0 allowed). The per-chunk
// buffers (chunk-start states, per-chunk matrices) give sequence b the slots cslot(b) .. cslot(b) + chunks(len) − 1:
// fixed, cslot = b·chunks(T) (B·chunks(T) slots); packed, cslot = cu_seqlens[b] / L + b, T / L + B slots in all
// (cslot(b+1) − cslot(b) = ⌊cu[b+1]/L⌋ − ⌊cu[b]/L⌋ + 1 ≥ ⌈len_b/L⌉, so the ranges never overlap; slots between them
// stay unused). The chunk-parallel kernels run one CTA a slot and find their sequence by a binary search over cslot.
struct ChunkSeq {
    long tok0;  // the sequence's first token in the (tokens, ...) layout
    int len;    // its tokens
    int nc;     // its chunks, ⌈len / L⌉
    long cslot; // the slot of its first chunk
};

template <int L> __host__ __device__ __forceinline__ long chunk_slots(bool packed, int B, long T) {
    return packed ? T / L + B : (long)B * ((T + L - 1) / L);
}

template <int L> __device__ __forceinline__ ChunkSeq chunk_seq(const int *__restrict__ cu_seqlens, int b, int T) {
    ChunkSeq s;
    if (cu_seqlens == NULL) {
        s.nc = (T + L - 1) / L;
        s.tok0 = (long)b * T;
        s.len = T;
        s.cslot = (long)b * s.nc;
    } else {
        const int c0 = cu_seqlens[b], c1 = cu_seqlens[b + 1];
        s.tok0 = c0;
        s.len = c1 - c0;
        s.nc = (s.len + L - 1) / L;
        s.cslot = c0 / L + b;
    }
    return s;
}

// slot → (sequence, chunk): false for an unused slot of the packed layout (the CTA has nothing to compute)
template <int L>
__device__ __forceinline__ bool chunk_at_slot(const int *__restrict__ cu_seqlens, int B, int T, long slot, int *b,
                                              int *c, ChunkSeq *s) {
    if (cu_seqlens == NULL) {
        const int nc = (T + L - 1) / L;
        *b = (int)(slot / nc);
        *c = (int)(slot - (long)*b * nc);
    } else { // the last b with cslot(b) = cu_seqlens[b] / L + b ≤ slot (cslot strictly increases with b)
        int lo = 0, hi = B - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (cu_seqlens[mid] / L + mid <= slot) { lo = mid; } else { hi = mid - 1; }
        }
        *b = lo;
    }
    *s = chunk_seq<L>(cu_seqlens, *b, T);
    if (cu_seqlens != NULL) { *c = (int)(slot - s->cslot); }
    return *c < s->nc;
}

#endif // M2RNN_CHUNK_COMMON_CUH
