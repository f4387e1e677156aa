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
- thread block clusters: the cluster barrier and reads of another CTA's shared memory (the decode step's skinny
  product sums its split K through them, common.cuh);
- tanh.approx.f32 (the MUFU tanh the recurrences use);
- warp_gemm: a warp's 16×8·NJ product of bf16 tiles staged in shared memory, either operand plain or transposed
  (the chunked GDN and Mamba-2 kernels are built from it);
- sm_90a: wgmma (a warpgroup's m64n128k16, m64n64k16, m64n32k16 from 128B- or 64B-swizzled shared-memory tiles, their
  descriptors and swizzled addresses) and the tensor copy engine (TMA boxes in and out on mbarriers / bulk groups),
  with the host side of tensor maps (the second form of GDN's serial, output and dq/dk kernels and of Mamba-2's
  state pass).
Everything is __forceinline__ device code in namespace tiles (and two host helpers after it); kernel files say
`using namespace tiles;`.
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
__device__ __forceinline__ void cp_async8(uint32_t saddr, const void *gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(saddr), "l"(gmem));
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
// thread block clusters: the whole cluster's barrier (release / acquire: shared-memory writes before it are visible
// to every CTA of the cluster after it), and a float4 read of CTA rank's shared memory at the offset of this CTA's addr
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// the same barrier in its two halves (a thread alternates them: arrive, wait, arrive, ...), so that work that needs no
// other CTA can run between its arrival and its wait
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }
__device__ __forceinline__ uint32_t cluster_ctarank() {
    uint32_t r;
    asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ float4 ld_dsmem_f4(uint32_t addr, uint32_t rank) {
    uint32_t remote;
    float4 v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
    return v;
}
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
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], uint32_t addr) { // lanes 0-15 give the 16 row addresses
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
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

// ----------------------------------------------------------------------------------------------------------------
// sm_90a: warpgroup MMA (wgmma) on tiles the tensor copy engine (TMA) puts in shared memory, swizzled
//
// A tile whose rows are 64 (128B swizzle) or 32 (64B swizzle) bf16 elements, rows packed (128 or 64 bytes apart)
// from a base aligned to 1024 bytes: the 16-byte piece p of row r lies at piece p ^ (r & 7) (128B) or p ^ ((r >> 1) & 3)
// (64B) of its row. TMA writes and reads that layout (CU_TENSOR_MAP_SWIZZLE_128B / _64B, the box's inner dimension the
// row), and wgmma reads it through a descriptor:
//   K-major operand (the reduced index k contiguous in a row: A = W as rows of tokens), 128B: start + 32 bytes a
//     k16 step inside the row, sbo = 1024 (8 rows); a K past 64 is the next tile.
//   MN-major operand (m or n contiguous in a row, k the row index: trans = 1), 128B or 64B: start + 16 rows a k16
//     step, sbo = 8 rows' bytes (1024 or 512); lbo = the next 64- (32-) wide block of m / n, unused at that width.
// The accumulator of m64nN (N/2 fp32 a thread): warp w of the warpgroup holds rows 16w + acc_row(i), columns
// acc_col(j, i) of its n8 tile j, i.e. element 4j + i: the mma.sync layout above, per warp.
// Everything here exists only in the sm_90a pass (__CUDA_ARCH_FEAT_SM90_ALL); the compute_90 PTX gets a trap, and the
// launchers take these paths only on compute capability 9.0 (gpu_is_sm90).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TILES_SM90A 1
#else
#define TILES_SM90A 0
#endif

__device__ __forceinline__ uint32_t swz128(int r, int byte) { // byte offset of (row r, byte) in a 128B-swizzled tile
    return (uint32_t)(r * 128 + ((((byte >> 4) ^ r) & 7) << 4) + (byte & 15));
}
__device__ __forceinline__ uint32_t swz64(int r, int byte) { // the same in a 64B-swizzled tile of 64-byte rows
    return (uint32_t)(r * 64 + ((((byte >> 4) ^ (r >> 1)) & 3) << 4) + (byte & 15));
}
// the wgmma shared-memory descriptor: swizzle 1 = 128B, 2 = 64B; byte offsets (multiples of 16)
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo, uint32_t swizzle) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | ((uint64_t)swizzle << 62);
}
__device__ __forceinline__ void wgmma_fence() {
#if TILES_SM90A
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if TILES_SM90A
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// pins an accumulator's registers at this point of the program: its last ordinary writes stay before the wgmma_fence
// that follows (else the compiler may sink them past it, and ptxas then serializes the warpgroup's products)
template <int N> __device__ __forceinline__ void wgmma_pin(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) { asm volatile("" : "+f"(d[i])::"memory"); }
}
// a fresh accumulator: zeros, pinned (the products that follow accumulate onto them)
template <int N> __device__ __forceinline__ void wgmma_zero(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) { d[i] = 0.0f; }
    wgmma_pin(d);
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
#if TILES_SM90A
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// d (64 × 64, 32 fp32 a thread) += A (64 × 16) · SB·B (16 × 64), both from shared memory; TA / TB: MN-major
// operands; SB = ±1 (the tensor cores negate B)
template <int TA, int TB, int SB = 1>
__device__ __forceinline__ void wgmma_64x64(float (&d)[32], uint64_t da, uint64_t db) {
#if TILES_SM90A
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"
                 "%27,%28,%29,%30,%31}, %32, %33, 1, 1, %34, %35, %36;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "n"(SB), "n"(TA), "n"(TB));
#else
    __trap();
#endif
}
// d (64 × 32, 16 fp32 a thread) += A (64 × 16) · B (16 × 32)
template <int TA, int TB> __device__ __forceinline__ void wgmma_64x32(float (&d)[16], uint64_t da, uint64_t db) {
#if TILES_SM90A
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, 1, 1, 1, %18, %19;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15])
                 : "l"(da), "l"(db), "n"(TA), "n"(TB));
#else
    __trap();
#endif
}
// d (64 × 128, 64 fp32 a thread) += A (64 × 16) · B (16 × 128)
template <int TA, int TB> __device__ __forceinline__ void wgmma_64x128(float (&d)[64], uint64_t da, uint64_t db) {
#if TILES_SM90A
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,"
                 "%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,"
                 "%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, 1, 1, 1, %66, %67;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
                   "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),
                   "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
                   "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),
                   "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "n"(TA), "n"(TB));
#else
    __trap();
#endif
}
// TMA: a box of a tensor map (a __grid_constant__ kernel parameter) into shared memory, counted on the mbarrier mb;
// elements outside the tensor arrive as zeros. Coordinates innermost first, in elements.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void *tmap, int c0, int c1, int c2, uint32_t mb) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
                 "%4}], [%5];\n" ::"r"(dst), "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(mb)
                 : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void *tmap, int c0, int c1, uint32_t mb) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(dst), "l"(tmap), "r"(c0), "r"(c1), "r"(mb)
                 : "memory");
}
// a box from shared memory out to the tensor, in the thread's bulk group (bulk_commit, bulk_wait_read as above);
// elements outside the tensor are not written
__device__ __forceinline__ void tma_store_2d(const void *tmap, uint32_t src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(tmap),
                 "r"(c0), "r"(c1), "r"(src)
                 : "memory");
}
__device__ __forceinline__ void tma_store_3d(const void *tmap, uint32_t src, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(tmap),
                 "r"(c0), "r"(c1), "r"(c2), "r"(src)
                 : "memory");
}

} // namespace tiles

// ----------------------------------------------------------------------------------------------------------------
// host side of the sm_90a paths: whether the current device runs them, and TMA tensor maps (the driver's encoder,
// found through the runtime, so nothing links against libcuda)
#include <cudaTypedefs.h>

// compute capability 9.0 exactly: the sm_90a code in these binaries runs there (asked per device, not cached)
static inline bool gpu_is_sm90() {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) { return false; }
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major == 9 && minor == 0;
}
// a bf16 tensor map of `rank` dimensions (innermost first, in elements; strides in bytes for dimensions 1..rank−1),
// boxes of `box` elements, swizzled as the wgmma tiles above; false where the driver refuses it (the caller then
// takes its other path)
static inline bool tma_map_bf16(CUtensorMap *m, const void *ptr, int rank, const uint64_t *dims,
                                const uint64_t *strides, const uint32_t *box, CUtensorMapSwizzle swizzle) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    if (encode == NULL) {
        cudaDriverEntryPointQueryResult q;
        void *fn = NULL;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
                cudaSuccess || q != cudaDriverEntryPointSuccess || fn == NULL) {
            return false;
        }
        encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    }
    cuuint64_t d[5], st[4];
    cuuint32_t b[5], es[5];
    for (int i = 0; i < rank; i++) {
        d[i] = dims[i];
        b[i] = box[i];
        es[i] = 1;
        if (i > 0) { st[i - 1] = strides[i - 1]; }
    }
    return encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank, (void *)ptr, d, st, b, es,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

#endif // M2RNN_TILES_CUH
