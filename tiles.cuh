/*
tiles.cuh: the small vocabulary of the tensor-core kernels (sm_80+ instructions, tuned on sm_90a), shared by every
kernel family that builds on mma.sync fragments: the M²RNN recurrence today (m2rnn_kernels.cuh), the GDN, Mamba-2 and
flash-attention kernels next.
- packing: fp32 pairs to bf16x2 / f16x2 registers and back (the A/B operand halves of an MMA);
- MMA: mma.sync m16n8k16 and m16n8k8, bf16 inputs, fp32 accumulation (the fragment layout: lane = 4·g + t4 holds
  rows g and g+8, columns 2·t4 and 2·t4+1 of each 16×8 accumulator tile);
- movement: movmatrix (an 8×8 transpose across the warp), ldmatrix x4 (plain and transposed), cp.async (16- and
  4-byte, commit/wait groups), sm_90 bulk copies of whole rows with their mbarrier, predicated shared stores, vector
  fp32 reductions into global memory;
- tanh.approx.f32 (the MUFU tanh the recurrences use);
- warp_gemm: a warp's 16×8·NJ product of bf16 tiles staged in shared memory, either operand plain or transposed
  (the chunked GDN and Mamba-2 kernels are built from it).
Everything is __forceinline__ device code in namespace tiles; kernel files say `using namespace tiles;`.
*/
#ifndef M2RNN_TILES_CUH
#define M2RNN_TILES_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace tiles {

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi); // .x (low 16 bits) = lo
    return *reinterpret_cast<uint32_t *>(&p);
}
__device__ __forceinline__ uint32_t pack_raw(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    return (uint32_t)__bfloat16_as_ushort(lo) | ((uint32_t)__bfloat16_as_ushort(hi) << 16);
}
__device__ __forceinline__ float bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float bf2f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    __half2 p = __floats2half2_rn(lo, hi); // .x (low 16 bits) = lo
    return *reinterpret_cast<uint32_t *>(&p);
}
__device__ __forceinline__ float2 unpack_f16x2(uint32_t u) { return __half22float2(*reinterpret_cast<__half2 *>(&u)); }

// d += a (16x16 bf16, row) * b (16x8 bf16, col), fp32 accumulate
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// transposes an 8x8 bf16 matrix held one row-pair per lane (the mma fragment layout) across the warp
__device__ __forceinline__ uint32_t trans8x8(uint32_t x) {
    uint32_t y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}
__device__ __forceinline__ float tanh_fast(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// cp.async to a shared-memory address the caller converted once: the generic-to-shared conversion reads the CTA's
// shared window (S2R SR_CgaCtaId), a long-latency instruction that a per-copy conversion puts in every iteration
__device__ __forceinline__ void cp_async16(uint32_t saddr, const void *gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(saddr), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(uint32_t saddr, const void *gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(saddr), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// sm_90 bulk copies (the copy engine moves a whole contiguous row, one instruction a row instead of a cp.async a 16
// bytes) and the mbarrier that counts their bytes: a phase completes when all `count` threads given to mbar_init have
// arrived and every byte announced by mbar_arrive_tx has landed. Shared memory written by ordinary stores and then by a
// bulk copy (or read by one) needs fence_proxy_async between, by the writing threads, before the CTA barrier.
__device__ __forceinline__ void mbar_init(uint32_t mb, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mb), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint32_t mb) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(mb) : "memory");
}
__device__ __forceinline__ void mbar_arrive_tx(uint32_t mb, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mb), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t mb, uint32_t parity) { // until the phase of this parity completes
    asm volatile("{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra WAIT_%=;\n}\n" ::"r"(mb), "r"(parity) : "memory");
}
// global → shared, `bytes` (a multiple of 16, both addresses 16-byte aligned) counted on the mbarrier mb
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t mb) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(mb) : "memory");
}
// shared → global in the thread's bulk group; bulk_wait_read: the group's shared-memory reads are done (the source may
// be overwritten); bulk_wait: its global writes are done too
__device__ __forceinline__ void bulk_s2g(void *dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// shared-memory stores done by a subset of lanes: predicated, so the warp never diverges around them
__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void st_shared_if(bool pred, uint32_t addr, float a) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %0, 0;\n @p st.shared.f32 [%1], %2;\n}\n" ::"r"((int)pred),
                 "r"(addr), "f"(a));
}
__device__ __forceinline__ void st_shared_v2_if(bool pred, uint32_t addr, float a, float b) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %0, 0;\n @p st.shared.v2.f32 [%1], {%2, %3};\n}\n" ::"r"(
                     (int)pred),
                 "r"(addr), "f"(a), "f"(b));
}
__device__ __forceinline__ void red_add_v4(float *gmem, float4 v) {
    asm volatile("red.global.add.v4.f32 [%0], {%1,%2,%3,%4};\n" ::"l"(gmem), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a (16x8 bf16, row) * b (8x8 bf16, col), fp32 accumulate
__device__ __forceinline__ void mma16808(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// ----------------------------------------------------------------------------------------------------------------
// warp GEMM from shared memory: the chunked recurrences' (GDN, Mamba-2) products of staged tiles
//   acc (16 × 8·NJ, the m16n8k16 accumulator layout) += A (16 × K) · B (K × 8·NJ), bf16 operands, fp32 accumulation
// A: A_T == false: element (r, k) at A[r·lda + k] (row-major); A_T == true: at A[k·lda + r] (stored K × 16).
// B: B_T == false: element (k, n) at B[k·ldb + n] (row-major K × N); B_T == true: at B[n·ldb + k] (stored N × K).
// K a multiple of 16, NJ even; lda, ldb multiples of 8 elements (16-byte rows for ldmatrix), best ≡ 8 (mod 64) so
// the eight rows of an 8×8 matrix fall in distinct bank groups. Element i (0..3) of n8-tile j held by a lane:
// row acc_row(i), column acc_col(j, i).
__device__ __forceinline__ int acc_row(int i) { return ((threadIdx.x & 31) >> 2) + ((i >> 1) << 3); }
__device__ __forceinline__ int acc_col(int j, int i) { return 8 * j + 2 * (threadIdx.x & 3) + (i & 1); }

template <int NJ, bool A_T, bool B_T>
__device__ __forceinline__ void warp_gemm(float (&acc)[NJ][4], const __nv_bfloat16 *A, int lda,
                                          const __nv_bfloat16 *B, int ldb, int K) {
    static_assert(NJ % 2 == 0, "warp_gemm: NJ must be even (ldmatrix x4 loads two n8 tiles)");
    const int lane = threadIdx.x & 31;
    // A's 16×16 block at k0: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
    const int ar = A_T ? ((lane >> 3) & 1) * 8 : (lane & 15);
    const int ak = A_T ? (lane & 7) + ((lane >> 4) << 3) : (lane >> 4) * 8;
    const uint32_t a_base = smem_addr(A_T ? A + (size_t)ak * lda + ar : A + (size_t)ar * lda + ak);
    // B's two n8 tiles × k16 at (k0, n0): (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
    const int bn = B_T ? (lane & 7) + ((lane >> 4) << 3) : (lane >> 4) * 8;
    const int bk = B_T ? ((lane >> 3) & 1) * 8 : (lane & 7) + (((lane >> 3) & 1) << 3);
    const uint32_t b_base = smem_addr(B_T ? B + (size_t)bn * ldb + bk : B + (size_t)bk * ldb + bn);
    for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t a[4];
        const uint32_t a_off = 2u * (uint32_t)(A_T ? k0 * lda : k0);
        if (A_T) { ldsm_x4_trans(a, a_base + a_off); } else { ldsm_x4(a, a_base + a_off); }
#pragma unroll
        for (int j = 0; j < NJ; j += 2) {
            uint32_t b[4];
            const uint32_t b_off = 2u * (uint32_t)(B_T ? (8 * j) * ldb + k0 : k0 * ldb + 8 * j);
            if (B_T) { ldsm_x4(b, b_base + b_off); } else { ldsm_x4_trans(b, b_base + b_off); }
            mma16816(acc[j], a, b[0], b[1]);
            mma16816(acc[j + 1], a, b[2], b[3]);
        }
    }
}

// The same product from fp32 tiles, on the FMA pipe, with the same fragment layout: the fp32 build (make
// PRECISION=FP32, floatX = float) stages its operands unrounded and runs the chunked kernels through this.
template <int NJ, bool A_T, bool B_T>
__device__ __forceinline__ void warp_gemm(float (&acc)[NJ][4], const float *A, int lda, const float *B, int ldb,
                                          int K) {
    const int g = (threadIdx.x & 31) >> 2, t2 = 2 * (threadIdx.x & 3);
    for (int k = 0; k < K; k++) {
        const float a0 = A_T ? A[(size_t)k * lda + g] : A[(size_t)g * lda + k];
        const float a1 = A_T ? A[(size_t)k * lda + g + 8] : A[(size_t)(g + 8) * lda + k];
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int n = 8 * j + t2;
            const float b0 = B_T ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n];
            const float b1 = B_T ? B[(size_t)(n + 1) * ldb + k] : B[(size_t)k * ldb + n + 1];
            acc[j][0] += a0 * b0;
            acc[j][1] += a0 * b1;
            acc[j][2] += a1 * b0;
            acc[j][3] += a1 * b1;
        }
    }
}

} // namespace tiles

#endif // M2RNN_TILES_CUH
