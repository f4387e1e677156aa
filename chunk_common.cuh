/*
chunk_common.cuh: what the chunked recurrences (gdn.cuh, mamba2.cuh) share around tiles.cuh's warp_gemm:
- chunk_stage: a tile of token rows from global into shared memory as floatX, zero-padded past the valid rows and
  columns, optionally scaled per row: cp.async for plain aligned copies (waited for by chunk_sync), otherwise 16-byte
  vector loads, several in flight per thread before any store, element by element at ragged edges;
- chunk_sync: the CTA barrier of these kernels, which first waits for the thread's cp.async copies;
- chunk_put2: the paired store of two adjacent accumulator outputs.
*/
#ifndef M2RNN_CHUNK_COMMON_CUH
#define M2RNN_CHUNK_COMMON_CUH

#include <type_traits>
#include "cuda_common.h"
#include "tiles.cuh"

// dst (rows × cols, leading dimension ld) = src rows r (token stride tok_stride) × row_scale[r] where r < rv and
// c < cv, else 0; cols a multiple of 8, ld·sizeof(floatX) a multiple of 16. 16-byte pieces: one vector load (two for
// fp32 into bf16) where the piece is whole and aligned, element by element at the edges; a thread issues the loads
// of CHUNK_STAGE_BATCH pieces before it converts and stores any (the staging is latency-bound otherwise).
#define CHUNK_STAGE_BATCH 4
template <typename Src>
__device__ __forceinline__ void chunk_stage(floatX *dst, int ld, const Src *__restrict__ src, long tok_stride, int rv,
                                            int cv, int rows, int cols, const float *row_scale) {
    constexpr int VEC = 16 / sizeof(floatX), WORDS = VEC * sizeof(Src) / 16;
    const int cpr = cols / VEC, n = rows * cpr;
    const bool aligned = ((uintptr_t)src & 15) == 0 && ((tok_stride * (long)sizeof(Src)) & 15) == 0;
    if constexpr (std::is_same<Src, floatX>::value) {
        if (row_scale == NULL && aligned) { // a plain copy: cp.async, waited for by chunk_sync()
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int r = i / cpr, c = (i - r * cpr) * VEC;
                floatX *d = dst + r * ld + c;
                if (r < rv && c + VEC <= cv) {
                    tiles::cp_async16(tiles::smem_addr(d), src + (long)r * tok_stride + c);
                } else {
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        d[e] = (r < rv && c + e < cv) ? src[(long)r * tok_stride + c + e] : (floatX)0.0f;
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
            __align__(16) floatX out[VEC];
#pragma unroll
            for (int e = 0; e < VEC; e++) { out[e] = (floatX)(x[e] * sc); }
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

// the CTA barrier of the chunk kernels: first this thread's cp.async copies from chunk_stage land
__device__ __forceinline__ void chunk_sync() {
    tiles::cp_async_commit();
    tiles::cp_async_wait<0>();
    __syncthreads();
}

#endif // M2RNN_CHUNK_COMMON_CUH
