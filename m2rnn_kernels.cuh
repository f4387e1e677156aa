/*
m2rnn_kernels.cuh: the M²RNN recurrence on the GPU: training forward (saves state checkpoints), backward (recomputes
from the checkpoints chunk by chunk), an inference forward, and a batched single-token step for generation (its y store
an epilogue type the caller may replace: m2rnn.cuh's applies the layer's output gate there).

The recurrence, per sequence b and value head n (H is K x V, W right-multiplies, q/k head = n / (N/Nq)):
    Z_t = tanh(H_t W_n + k_t v_t^T),   H_{t+1} = f_t H_t + (1 - f_t) Z_t,   y_t = H_{t+1}^T q_t      (H_0 = h0 or 0)
Backward (G = dL/dH_{t+1} carried from the right, c = clamp, 0 = off):
    D = clamp(G, -c, c) + q_t dy_t^T,  dX = D (1-f)(1-Z^2),  G <- f D + dX W^T,  dh0 = G after t = 0 (unclamped)
    dq_t = H_{t+1} dy_t,  dk_t = dX v_t,  dv_t = dX^T k_t,  df_t = sum D (H_t - Z_t),  dW += H_t^T dX

Design (numbers behind it in dev/bench/NOTES.md):
- W acts from the right, so the K rows of H are K independent V-dim recurrences. One warp owns 16 rows of one head:
  per step H W is (V/8)*(V/16) m16n8k16 bf16 tensor-core MMAs whose fp32 accumulator fragment is repacked in registers
  into the next step's A operand. The state H is carried in fp32 (the MMA reads it rounded to bf16); k v^T is exact in
  fp32; tanh is tanh.approx.f32. A CTA holds HPC heads (sharing one q/k head) x K/16 warps.
- Inputs are staged into shared memory a chunk of 32 tokens at a time with cp.async (16 in the Z-stash backward; the
  forward and that backward prefetch the next chunk while working on this one), so no global load sits on the
  recurrence's critical path. For V=16 the token
  inputs then reach registers as MMA fragments by ldmatrix, a block of tokens at a time (16 in the forward, 8 in the
  backward's recompute): k v^T becomes a tensor-core MMA with v masked to the step's token (exact), and the forward
  accumulates 16 tokens of y in one MMA tile (q masked to the step's row), so a forward step reads no shared memory.
- y_t, dq_t, dk_t, dv_t are computed with extra MMAs (row sums become MMAs against a broadcast vector; the transposes
  they need are movmatrix), off the recurrence's dependency chain. For V=16 the backward's reverse step takes q, dy,
  k and v as MMA fragments of an 8-token block (ldmatrix) instead of per-token loads: D = clamp(G) + q dy^T is a
  masked m16n8k8 with the clamped G as its accumulator (one exact product an element), and dk, dv accumulate over the
  block in two MMA tiles, token i in column i (B operands masked to the lanes that hold token i), so a step stores
  only df's lane-quad sums; dq_t = H_{t+1} dy_t, which needs nothing from the reverse direction, accumulates in a
  third tile during the recompute. Cross-warp/cross-head sums go through shared memory and are flushed once per
  sub-chunk. dq/dk are summed over the CTA's heads in shared memory first, so the global fp32
  atomics see N/HPC adders per address, not N. With m2rnn_deterministic
  (M2RNN_DETERMINISTIC=1) each CTA stores its sums plainly instead, into partial slots laid over its own checkpoints
  that it has finished reading (no extra memory where a slot holds HPC*V >= 32 columns: K=64, V=16 at 2 heads a CTA,
  or at one head a CTA in clusters of two CTAs that store one slot), and counts
  each 256-token window done; a second kernel, launched programmatically so that it runs beside the backward on the
  room the backward leaves, adds a window's slots of a q/k head's CTAs in rank order once they are all counted: no
  atomic sums, no CTA waits for another, and the backward repeats bit for bit like every other gradient.
- Backward without the authors' full recompute and without a B*T*N*K*V buffer: the training forward writes H every
  16 tokens (fp32; before tokens 0 and 16 of each 32-token chunk) into the workspace. The backward walks the sequence
  right to left in sub-chunks: each starts from a checkpoint (or, 8-token sub-chunks, 8 recomputed steps after one),
  recomputes its steps keeping what the reverse steps need in shared memory, then runs its reverse steps. Extra
  memory: T/16 fp32 states (0.66 GiB at B=8, T=4096, N=84, K=64, V=16; checkpoints every 32 tokens took half that
  and 1.75 recomputed steps a token, NOTES.md).
- The build follows the layer's shape alone (m2rnn_backward_kernel has the details). V=16 with K <= 128: the Z stash,
  whose recompute keeps Z_t and E_t = H_t - Z_t in fp16 from the fp32 state (the state update is written
  H - (1 - f)(H - Z), so E_t is its own difference), so the reverse step re-runs no MMA or tanh, takes df from E_t and
  rebuilds bf16(H_t) for dW as bf16(Z_t + E_t); its sub-chunks are 16 tokens at one head a CTA with K <= 64 (each token
  recomputed once) and 8 otherwise (1.5 recomputed steps a token, half the stash). V=32 or K > 128: the plain build,
  whose reverse step recomputes Z_t from the bf16 H fragments the recompute kept (the forward's Z bit for bit, rounded
  to fp16) and takes df from bf16(H_t). Within a build the sub-chunk length and the heads per CTA, which the launcher
  picks by how full their waves come out (m2rnn_heads_per_cta, m2rnn_backward_sub), change no bit of any gradient in
  deterministic mode, so the numerics never depend on the batch size or the GPU (test_m2rnn_gpu).
- f is fp32: bf16 spacing just below 1 is 2^-9, which would quantize (1 - f) for slow-forgetting heads; fp32 costs
  B*T*N*4 bytes, nothing next to the rest of the layer.

Layouts (token index tok = b*T + t, or cu_seqlens[b] + t for packed variable-length sequences):
    q, k   (tok, Nq, K) bf16 views with per-token stride sq / sk (elements), e.g. columns of a (B,T,conv_dim) buffer
    v      (tok, N, V)  bf16 view with per-token stride sv;  dq, dk, dv use the same strides as q, k, v
    f      (tok, N)     fp32 gate value in (0,1), contiguous;  df likewise (fp32)
    W      (N, V, V)    bf16, (HW)[k,j] = sum_v H[k,v] W[v,j];  dW (N, V, V) fp32 (overwritten)
    y, dy  (tok, N, V)  bf16 contiguous
    h0, hT, dh0, dhT (B, N, K, V) fp32, each optional (NULL)
Limits: K a multiple of 16 up to 256, V in {16, 32}, N % Nq == 0; q/k/v 16-byte aligned with strides multiples of 8.
The Z-stash backward keeps H_t - Z_t in fp16, so states beyond fp16's range (|H| > 65504: only an h0 that large gets
there, since tanh bounds every later update) would overflow it.
*/
#ifndef M2RNN_KERNELS_CUH
#define M2RNN_KERNELS_CUH

#include <cuda_fp16.h>
#include <stdint.h>
#include "cuda_common.h"
#include "tiles.cuh"
#include "utils.h"

#define M2RNN_CHUNK 32 // shared-memory staging chunk (tokens); checkpoints at its start and after its 16th token
#define M2RNN_SUB 8    // backward sub-chunk: tokens whose states are held in shared memory at once

typedef struct {
    int B;                 // number of sequences
    int T;                 // tokens per sequence; with cu_seqlens: total packed tokens (cu_seqlens[B] must equal T)
    int N;                 // value heads
    int Nq;                // q/k heads (Nq == Nk), N % Nq == 0
    int K, V;              // key / value head dims
    long sq, sk, sv;       // per-token strides (elements) of q, k, v
    const int *cu_seqlens; // (B+1,) device pointer, or NULL for B sequences of T tokens
} M2RNNDims;

// ----------------------------------------------------------------------------------------------------------------
// host-side shape checks and workspace sizing

// returns NULL when the dims are usable, else what is wrong (the launchers turn it into "error:" + HINT)
static const char *m2rnn_check_dims(const M2RNNDims *d) {
    if (d->B < 1 || d->T < 0 || d->N < 1 || d->Nq < 1) { return "B, N, Nq must be >= 1 and T >= 0"; }
    if (d->K < 16 || d->K % 16 != 0 || d->K > 256) { return "K must be a multiple of 16 in [16, 256]"; }
    if (d->V != 16 && d->V != 32) { return "V must be 16 or 32"; }
    if (d->N % d->Nq != 0) { return "N must be a multiple of Nq (each q/k head is shared by N/Nq value heads)"; }
    if (d->sq % 8 != 0 || d->sk % 8 != 0 || d->sv % 8 != 0) { return "token strides sq, sk, sv must be multiples of 8"; }
    if (d->sq < (long)d->Nq * d->K || d->sk < (long)d->Nq * d->K || d->sv < (long)d->N * d->V) {
        return "a token stride is smaller than its row (sq, sk >= Nq*K, sv >= N*V)";
    }
    return NULL;
}

static void m2rnn_validate(const M2RNNDims *d, const void *q, const void *k, const void *v) {
    const char *why = m2rnn_check_dims(d);
    if (why != NULL) {
        fail_with_hint("the fast path is K=64, V=16; see the limits in m2rnn_kernels.cuh",
                       "m2rnn: unsupported shape B=%d T=%d N=%d Nq=%d K=%d V=%d: %s", d->B, d->T, d->N, d->Nq, d->K,
                       d->V, why);
    }
    if (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) % 16 != 0) {
        fail_with_hint("allocate the (B,T,conv_dim) buffer with cudaMalloc and keep channel offsets multiples of 8",
                       "m2rnn: q, k, v must be 16-byte aligned");
    }
}

static inline long m2rnn_total_tokens(const M2RNNDims *d) { return d->cu_seqlens ? (long)d->T : (long)d->B * d->T; }
// the backward's build (m2rnn_backward_kernel): the Z stash for V=16 with K <= 128, else the plain one
static inline bool m2rnn_uses_zstash(const M2RNNDims *d) { return d->V == 16 && d->K <= 128; }

// heads per CTA (HPC): 1 or 2 (2 only where each q/k head serves an even number of value heads and the CTA stays
// within 8 warps); m2rnn_heads_per_cta below picks.
static int m2rnn_hpc_override = 0; // tests/benchmarks: 1 or 2 forces HPC where legal, 0 = automatic
// tests/benchmarks: 8 / 16 forces the Z-stash backward's sub-chunk length (16 only where legal: one head a CTA,
// K <= 64), 0 = automatic (m2rnn_backward_sub)
static int m2rnn_sub_override = 0;
// 1: dq/dk summed in a fixed order (bitwise repeatable backward: each CTA stores its sums into partial slots over
// its spent checkpoints, a kernel beside the backward adds them in rank order; dev/bench/NOTES.md has its cost);
// 0: fp32 atomics (the default). -1: from M2RNN_DETERMINISTIC (default 0) at first use. The workspace's layout depends
// on it: a test that switches it sizes the workspace for both (m2rnn_workspace_bytes_any).
static int m2rnn_deterministic = -1;
static inline bool m2rnn_deterministic_on(void) {
    return env_off_unless_1(&m2rnn_deterministic, "M2RNN_DETERMINISTIC");
}
// The backward's time follows the warps on the busiest SM sub-partition, round by round of the CTAs its busiest SM
// runs (dev/bench/NOTES.md, sixteenth and eighteenth sessions). With K=64, V=16 the Z stash runs one head a CTA (one
// warp a sub-partition) with 16-token sub-chunks, 3 CTAs an SM, or with 8-token sub-chunks (half again the
// recompute), 4 an SM. ms for a round of w CTAs (w warps on each sub-partition) at T=4096, measured on an H100 (w = 1
// and 3 with 16-token sub-chunks, 3 and 4 with 8; the sixteenth session's H200 rounds at 3 and 4 warps within 2% of
// these), the rest from the H200's rounds (8-token, w = 1, 2) or interpolated (16-token, w = 2):
static const float m2rnn_round_ms16[4] = {0.0f, 1.51f, 2.05f, 2.56f};
static const float m2rnn_round_ms8[5] = {0.0f, 1.70f, 2.25f, 2.91f, 3.70f};
// Two heads a CTA (two warps a sub-partition, 8-token sub-chunks, 2 CTAs an SM) put the same warps on a sub-partition
// a round as one head with 8-token sub-chunks at 4 an SM, in coarser CTAs, so they never cost less here; measured
// against it, 3–27% slower at three of the paper's shapes and a tie at B=4, N=132 (NOTES.md, eighteenth and
// nineteenth sessions). At K=64, V=16 the default backward runs one head a CTA.
// The predicted backward time (ms at T=4096) at K=64, V=16, one head a CTA, sub-token sub-chunks, on sms SMs: the
// busiest SM's ceil(CTAs / sms) CTAs in rounds of as many as fit.
static inline float m2rnn_backward_cost(const M2RNNDims *d, int sub, int sms) {
    const long n = CEIL_DIV((long)d->B * d->N, (long)sms);
    const int fit = sub == 16 ? 3 : 4;
    const float *ms = sub == 16 ? m2rnn_round_ms16 : m2rnn_round_ms8;
    return (float)(n / fit) * ms[fit] + (n % fit ? ms[n % fit] : 0.0f);
}
// the sub-chunk length the cost above prefers (16 where equal); test_m2rnn_gpu checks its picks on 132 SMs
static inline int m2rnn_sub_k64v16(const M2RNNDims *d, int sms) {
    return m2rnn_backward_cost(d, 8, sms) < m2rnn_backward_cost(d, 16, sms) ? 8 : 16;
}
static inline bool m2rnn_two_heads_legal(const M2RNNDims *d) {
    return (d->N / d->Nq) % 2 == 0 && 2 * (d->K / 16) <= 8;
}
// Heads per CTA: one at K=64, V=16 (above); other K and V keep the older rule (2 heads from 2 CTAs an SM on). The
// forward takes the backward's heads per CTA (one choice keeps them simple; the forward is a fifth of the time and
// within 1% either way where they differ, but B=4, N=84 runs 20% faster at one head).
// The deterministic backward (det) keeps the older rule too, for now: its one-head CTAs run in pairs (m2rnn_det_pairs)
// whose first full-occupancy run on a GPU raced (a CTA's next recompute wrote its Z stash, under its partial slots,
// while its partner still read them; fixed, dev/bench/NOTES.md, eighteenth session) and whose fix has passed only
// the small cases of test_m2rnn_gpu so far, not B=8, N=84; two heads a CTA keep the slots within each CTA. (Its bits
// are the same at every heads per CTA and sub-chunk length, so the rule changes its speed only.)
static inline int m2rnn_heads_per_cta(const M2RNNDims *d, bool det = false) {
    const bool two_ok = m2rnn_two_heads_legal(d);
    if (m2rnn_hpc_override == 1 || (m2rnn_hpc_override == 2 && two_ok)) { return m2rnn_hpc_override; }
    if (!two_ok || (!det && d->K == 64 && d->V == 16)) { return 1; }
    return (long)d->B * (d->N / 2) >= 2L * device_num_sms() ? 2 : 1;
}
// chunk slots: slot(b, c) = 2b + tok0(b)/CHUNK + c. A slot holds two checkpoints, H before the chunk's token 0 and
// before its token 16. Sequence b's chunks and the slot after its last (deterministic mode's partial slots use it:
// m2rnn_partial_off) never reach sequence b+1's first slot, since tok0/CHUNK + ceil(L/CHUNK) <= tok1/CHUNK + 1.
__host__ __device__ inline long m2rnn_ckpt_slot(int b, long tok0, int c) { return 2 * b + tok0 / M2RNN_CHUNK + c; }
static inline long m2rnn_num_slots(const M2RNNDims *d) {
    return 2L * d->B + CEIL_DIV(m2rnn_total_tokens(d), (long)M2RNN_CHUNK) + 1;
}
// Deterministic mode's partial slots (floats from the checkpoints' start): the backward's CTA with heads n0.. stores
// its sums of dq and dk for token 16u + i16 of a sequence (u = 2c + half) plainly over its own checkpoint half u + 1,
// which it has finished reading by then (it walks right to left: half u + 1 is (c, 1) or (c + 1, 0)); PK = 2 where
// the half's HPC*K*V floats hold both rows (HPC*V >= 32: [i16][dq K | dk K]), else 1 (dq there, dk at the same
// offset in a region of the checkpoints' size). m2rnn_qk_partials_sum_kernel adds the CTAs' slots in rank order.
__host__ __device__ constexpr int m2rnn_partial_rows(int hpc, int V) { return hpc * V >= 32 ? 2 : 1; } // PK
// Deterministic mode, one head a CTA: the Z stash with an even N/Nq stores its slots in pairs of CTAs (clusters of two,
// m2rnn_backward_kernel's PAIR), each slot two heads' as at two heads a CTA
static inline bool m2rnn_det_pairs(const M2RNNDims *d, int hpc) {
    return hpc == 1 && m2rnn_uses_zstash(d) && (d->N / d->Nq) % 2 == 0;
}
// the heads one deterministic partial slot holds
static inline int m2rnn_slot_heads(const M2RNNDims *d, int hpc) { return m2rnn_det_pairs(d, hpc) ? 2 : hpc; }
__host__ __device__ inline size_t m2rnn_partial_off(long slot, int half, int i16, int n0, int N, int K, int V, int PK) {
    return (size_t)(2 * slot + half + 1) * N * K * V + (size_t)n0 * K * V + (size_t)i16 * PK * K;
}

// workspace layout: [checkpoints fp32 (slots,2,N,K,V)] then by default [dq acc fp32 (tok,Nq,K)] [dk acc], in
// deterministic mode [dk partial slots fp32 (slots,2,N,K,V)] where they do not fit beside dq's (HPC*V < 32) and
// [window counts int (B,Nq,windows)], then [dW partials (B*K/16,N,V,V)]
typedef struct {
    size_t ckpt, dq, dk, qkx, cnt, dw, total; // byte offsets and total size
} M2RNNWorkspace;

// deterministic mode: the backward's CTAs count each window of M2RNN_WINDOW tokens of a sequence done (all its
// partial slots stored), per (sequence, q/k head); the sum kernel, running beside the backward, waits for a window's
// count to reach the q/k head's CTAs before it adds its slots
#define M2RNN_WINDOW 256
static inline long m2rnn_num_windows(const M2RNNDims *d) { return CEIL_DIV((long)d->T, (long)M2RNN_WINDOW); }
// the count of the window holding token t of sequence b, q/k head qh (the layout: (B, Nq, windows))
__host__ __device__ inline long m2rnn_window_idx(int b, int qh, long t, int Nq, int T) {
    return ((long)b * Nq + qh) * CEIL_DIV(T, M2RNN_WINDOW) + t / M2RNN_WINDOW;
}

// pk: deterministic mode's m2rnn_partial_rows at its heads per CTA (1: dk's slots take a region of their own)
static inline M2RNNWorkspace m2rnn_workspace_layout(const M2RNNDims *d, bool det, int pk) {
    M2RNNWorkspace w;
    const size_t state = (size_t)d->N * d->K * d->V * sizeof(float);
    const size_t acc = det ? 0 : (size_t)m2rnn_total_tokens(d) * d->Nq * d->K * sizeof(float);
    const size_t ckb = (size_t)m2rnn_num_slots(d) * 2 * state;
    w.ckpt = 0;
    w.dq = w.ckpt + ckb;
    w.dk = w.dq + acc;
    w.qkx = w.dk + acc;
    w.cnt = w.qkx + (det && pk == 1 ? ckb : 0);
    w.dw = w.cnt + (det ? ((size_t)d->B * d->Nq * m2rnn_num_windows(d) * sizeof(int) + 15) / 16 * 16 : 0);
    w.total = w.dw + (size_t)d->B * (d->K / 16) * d->N * d->V * d->V * sizeof(float);
    return w;
}
static inline M2RNNWorkspace m2rnn_workspace_layout(const M2RNNDims *d, bool det) {
    return m2rnn_workspace_layout(d, det, m2rnn_partial_rows(m2rnn_slot_heads(d, m2rnn_heads_per_cta(d, det)), d->V));
}
static inline M2RNNWorkspace m2rnn_workspace_layout(const M2RNNDims *d) {
    return m2rnn_workspace_layout(d, m2rnn_deterministic_on());
}

// bytes of device scratch the training forward + backward need (kept by the caller from forward to backward), in the
// mode M2RNN_DETERMINISTIC sets; m2rnn_workspace_bytes_any: enough for either mode at any heads per CTA (tests that
// switch them)
static inline size_t m2rnn_workspace_bytes(const M2RNNDims *d) { return m2rnn_workspace_layout(d).total; }
static inline size_t m2rnn_workspace_bytes_any(const M2RNNDims *d) {
    const size_t a = m2rnn_workspace_layout(d, false).total, b = m2rnn_workspace_layout(d, true, 1).total;
    return a > b ? a : b;
}

// ----------------------------------------------------------------------------------------------------------------
// device helpers: the warp's fragment geometry, the step, the staging (the generic tile vocabulary is tiles.cuh's)

namespace m2rnn_detail {

using namespace tiles; // the tensor-core vocabulary of tiles.cuh

// Fragment geometry of a warp that owns 16 rows x V columns of one head's state. lane = 4*g + t4; in accumulator
// layout the lane holds S[h][e] = element (row g + 8*(e>>1), column 8h + 2*t4 + (e&1)) for each n8 tile h < V/8.
// The bf16 A-operand layout a[s][0..3] of k16 slice s is the accumulator of tiles 2s, 2s+1 packed in pairs.
template <int V> __device__ __forceinline__ void pack_frag(uint32_t (&a)[V / 16][4], const float (&S)[V / 8][4]) {
#pragma unroll
    for (int s = 0; s < V / 16; s++) {
        a[s][0] = pack_bf16x2(S[2 * s][0], S[2 * s][1]);
        a[s][1] = pack_bf16x2(S[2 * s][2], S[2 * s][3]);
        a[s][2] = pack_bf16x2(S[2 * s + 1][0], S[2 * s + 1][1]);
        a[s][3] = pack_bf16x2(S[2 * s + 1][2], S[2 * s + 1][3]);
    }
}
// element (h, e) of a packed fragment, back in fp32
template <int V> __device__ __forceinline__ float frag_elem(const uint32_t (&a)[V / 16][4], int h, int e) {
    uint32_t u = a[h >> 1][2 * (h & 1) + (e >> 1)];
    return (e & 1) ? bf_hi(u) : bf_lo(u);
}

// offset in a head's (K, V) state of accumulator element (h, e) of the warp whose lane holds row row0 = 16 rb + g
template <int V> __device__ __forceinline__ int frag_offset(int row0, int t4, int h, int e) {
    return (row0 + 8 * (e >> 1)) * V + 8 * h + 2 * t4 + (e & 1);
}
// the warp's 16 rows of a head's fp32 state (src: that head's (K, V) block) into accumulator layout; src NULL: zeros
template <int V>
__device__ __forceinline__ void load_state(float (&S)[V / 8][4], const float *src, int row0, int t4) {
#pragma unroll
    for (int h = 0; h < V / 8; h++) {
#pragma unroll
        for (int e = 0; e < 4; e++) { S[h][e] = src ? src[frag_offset<V>(row0, t4, h, e)] : 0.0f; }
    }
}
template <int V>
__device__ __forceinline__ void store_state(float *dst, const float (&S)[V / 8][4], int row0, int t4) {
#pragma unroll
    for (int h = 0; h < V / 8; h++) {
#pragma unroll
        for (int e = 0; e < 4; e++) { dst[frag_offset<V>(row0, t4, h, e)] = S[h][e]; }
    }
}

// load_state / store_state a pair of columns at a time (float2), for a block known to be 8-byte aligned (the
// checkpoints; the decode step's states, whose stride m2rnn_step checks)
template <int V>
__device__ __forceinline__ void load_state_pairs(float (&S)[V / 8][4], const float *src, int row0, int t4) {
#pragma unroll
    for (int h = 0; h < V / 8; h++) {
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
            const float2 x = *(const float2 *)(src + frag_offset<V>(row0, t4, h, e));
            S[h][e] = x.x;
            S[h][e + 1] = x.y;
        }
    }
}
template <int V>
__device__ __forceinline__ void store_state_pairs(float *dst, const float (&S)[V / 8][4], int row0, int t4) {
#pragma unroll
    for (int h = 0; h < V / 8; h++) {
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
            *(float2 *)(dst + frag_offset<V>(row0, t4, h, e)) = make_float2(S[h][e], S[h][e + 1]);
        }
    }
}

// The state update H <- f H + (1 - f) Z, in the form H - (1 - f)(H - Z) (gate = 1 - f): E = H - Z is what the
// backward's df needs (df_t = sum D (H_t - Z_t)), so the Z-stash recompute takes it from the update itself and keeps it
// in fp16 from the fp32 state. Every GPU path (the forward, the backward's recompute, the decode step) uses this one
// form, so H and Z stay bit-identical between them. (f H + (1 - f) Z, with f H formed before Z exists, puts one FFMA
// after the tanh instead of an FADD and an FFMA; NOTES.md measured it at -2% of the forward in round 4, and gave it
// back for df from the fp32 state in issue 17.)
__device__ __forceinline__ float state_update(float s, float z, float gate) { return fmaf(-gate, s - z, s); }

// Z rounded to fp16 and back (round to nearest): the Z stash's precision, which the plain build's reverse step
// applies to its recomputed Z too
template <int V> __device__ __forceinline__ void round_f16(float (&Z)[V / 8][4]) {
#pragma unroll
    for (int h = 0; h < V / 8; h++) {
        const float2 lo = unpack_f16x2(pack_f16x2(Z[h][0], Z[h][1]));
        const float2 hi = unpack_f16x2(pack_f16x2(Z[h][2], Z[h][3]));
        Z[h][0] = lo.x; Z[h][1] = lo.y; Z[h][2] = hi.x; Z[h][3] = hi.y;
    }
}

// Z = tanh(S W + k v^T) for the warp's 16 rows (aS: bf16 A fragments of S; bW: W as B fragments)
template <int V>
__device__ __forceinline__ void compute_z(float (&Z)[V / 8][4], const uint32_t (&aS)[V / 16][4],
                                          const uint32_t (&bW)[V / 16][V / 8][2], float k0, float k1,
                                          const float (&vv)[V / 8][2]) {
#pragma unroll
    for (int h = 0; h < V / 8; h++) {
        Z[h][0] = k0 * vv[h][0]; // products of two bf16 values are exact in fp32
        Z[h][1] = k0 * vv[h][1];
        Z[h][2] = k1 * vv[h][0];
        Z[h][3] = k1 * vv[h][1];
#pragma unroll
        for (int s = 0; s < V / 16; s++) { mma16816(Z[h], aS[s], bW[s][h][0], bW[s][h][1]); }
#pragma unroll
        for (int e = 0; e < 4; e++) { Z[h][e] = tanh_fast(Z[h][e]); }
    }
}

// Shared-memory staging of one chunk of tokens: k, q rows of the CTA's q/k head, v (and dy) of its HPC heads, f.
// Each k/q token row is padded by 16 bytes (row stride K+8) so an ldmatrix read of 8 token rows hits 8 different
// bank groups. The forward stores f head-major (HPC, CHUNK), so one 128-bit load brings 4 tokens' gates; the
// backward, which reads one token at a time, keeps it token-major.
__host__ __device__ inline int m2rnn_stage_kstride(int K) { return K + 8; }
// bytes of a stage of ch tokens (the forward and the plain backward stage M2RNN_CHUNK tokens, the Z-stash backward 16)
__host__ __device__ inline size_t m2rnn_stage_bytes(int K, int V, int hpc, bool bwd, int ch = M2RNN_CHUNK) {
    return (size_t)ch * (2 * m2rnn_stage_kstride(K) * 2 + (bwd ? 2 : 1) * hpc * V * 2 + hpc * 4);
}
template <int V, int HPC, bool BWD, int CH = M2RNN_CHUNK> struct Stage {
    static __host__ __device__ size_t bytes(int K) { return m2rnn_stage_bytes(K, V, HPC, BWD, CH); }
    floatX *k, *q, *v, *dy;
    float *f;
    int ks; // token stride of k and q (elements)
    __device__ Stage(unsigned char *base, int K) {
        ks = m2rnn_stage_kstride(K);
        k = (floatX *)base;
        q = k + CH * ks;
        v = q + CH * ks;
        dy = v + CH * HPC * V;
        f = (float *)(dy + (BWD ? CH * HPC * V : 0));
    }
    // f of token i, head h
    __device__ __forceinline__ float *fptr(int i, int h) const { return BWD ? f + i * HPC + h : f + h * CH + i; }
    // issues the copies of tokens [tok, tok+len) (rows past len are zeroed) and commits them as one cp.async group.
    // One warp per token row, one lane per 16-byte piece; a lane's piece (which tensor, which columns) is the same for
    // every token, so it is worked out once, with selects: no branches, no integer division per piece. Shared
    // addresses are converted once per piece, a full chunk takes no per-row test, and the forward advances its
    // addresses by a fixed step per row: this runs once per 32 steps of a latency-bound loop, so its own latency is
    // what it costs (NOTES.md, round 5).
    __device__ void load(long tok, int len, const floatX *gq, const floatX *gk, const floatX *gv, const floatX *gdy,
                         const float *gf, int qh, int n0, int N, int K, long sq, long sk, long sv) {
        const int qk16 = K / 8, v16 = HPC * V / 8;
        const int per_tok = 2 * qk16 + (BWD ? 2 : 1) * v16;
        const int warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
        for (int r = threadIdx.x & 31; r < per_tok; r += 32) { // K > 64 has more than 32 pieces a token
            const bool is_k = r < qk16, is_q = !is_k && r < 2 * qk16, is_v = !is_k && !is_q && r < 2 * qk16 + v16;
            const int piece = is_k ? r : is_q ? r - qk16 : is_v ? r - 2 * qk16 : r - 2 * qk16 - v16;
            const floatX *src = is_k ? gk + (long)qh * K : is_q ? gq + (long)qh * K : is_v ? gv + (long)n0 * V
                                                                                            : gdy + (long)n0 * V;
            const long sstride = is_k ? sk : is_q ? sq : is_v ? sv : (long)N * V;
            const floatX *dst = is_k ? k : is_q ? q : is_v ? v : dy;
            const int dstride = (is_k || is_q) ? ks : HPC * V;
            src += tok * sstride + piece * 8;
            const uint32_t saddr = smem_addr(dst + piece * 8), dstep = (uint32_t)(dstride * (int)sizeof(floatX));
            if (len == CH) {
                if constexpr (BWD) { // the plain backward is at its register cap: two more live values cost it spills
                    for (int i = warp; i < CH; i += nwarps) { cp_async16(saddr + i * dstep, src + i * sstride); }
                } else { // addresses advanced by a fixed step: no 64-bit multiply per row (forward -3% at B=4, N=84)
                    const floatX *sp = src + warp * sstride;
                    for (uint32_t i = warp, sa = saddr + warp * dstep; i < CH;
                         i += nwarps, sp += nwarps * sstride, sa += nwarps * dstep) {
                        cp_async16(sa, sp);
                    }
                }
            } else {
                for (int i = warp; i < CH; i += nwarps) {
                    if (i < len) {
                        cp_async16(saddr + i * dstep, src + i * sstride);
                    } else {
                        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(saddr + i * dstep), "r"(0u));
                    }
                }
            }
        }
        for (int idx = threadIdx.x; idx < CH * HPC; idx += blockDim.x) {
            const int i = idx / HPC, h = idx % HPC;
            if (i < len) {
                cp_async4(smem_addr(fptr(i, h)), gf + (tok + i) * N + n0 + h);
            } else {
                *fptr(i, h) = 0.0f;
            }
        }
        cp_async_commit();
    }
};

// per-lane inputs of one token, read from the staged chunk
template <int V, int HPC> struct TokenIn {
    float k0, k1, gate, fval;
    float vv[V / 8][2];
};
// one forward step of the warp's 16 rows: S <- f S + (1-f) tanh(S W + k v^T) (state_update); aS repacked from the new S
template <int V, int HPC>
__device__ __forceinline__ void forward_step(float (&S)[V / 8][4], uint32_t (&aS)[V / 16][4],
                                             const uint32_t (&bW)[V / 16][V / 8][2], const TokenIn<V, HPC> &in) {
    float Z[V / 8][4];
    compute_z<V>(Z, aS, bW, in.k0, in.k1, in.vv);
#pragma unroll
    for (int h = 0; h < V / 8; h++) {
#pragma unroll
        for (int e = 0; e < 4; e++) { S[h][e] = state_update(S[h][e], Z[h][e], in.gate); }
    }
    pack_frag<V>(aS, S);
}

// The backward's k and v for an 8-token block (V=16), loaded by one ldmatrix: a0/a1 = k as the A fragment of a
// m16n8k8 MMA (m = this warp's 16 rows, k = token), b[h] = v as the B fragment of n8 tile h (k = token, n = column).
struct KV8 {
    uint32_t a0, a1, b[2];
};
template <int HPC, int CH>
__device__ __forceinline__ KV8 load_kv8(const Stage<16, HPC, true, CH> &st, int t0, int hh, int rb, int lane) {
    const int mi = lane >> 3, mr = lane & 7;
    const floatX *row = mi < 2 ? st.k + (t0 + mr) * st.ks + rb * 16 + mi * 8
                               : st.v + (t0 + mr) * HPC * 16 + hh * 16 + (mi - 2) * 8;
    uint32_t r[4];
    ldsm_x4_trans(r, smem_addr(row));
    return KV8{r[0], r[1], {r[2], r[3]}};
}
// B-fragment mask selecting token i (0..7) of an 8-token block: lanes with t4 == i/2 hold it, in half i%2
__device__ __forceinline__ uint32_t token_mask8(int i, int t4) {
    return (t4 == (i >> 1) ? 0xffffffffu : 0u) & ((i & 1) ? 0xffff0000u : 0x0000ffffu);
}
// compute_z for V=16 with k v^T by the tensor core from an 8-token block: the one nonzero product is exact, so the
// accumulator starts from the same fp32 k v^T as compute_z's and Z is bit-identical to it (and to the forward's)
__device__ __forceinline__ void compute_z8(float (&Z)[2][4], const uint32_t (&aS)[1][4], const uint32_t (&bW)[1][2][2],
                                           const KV8 &kv, uint32_t mask) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        Z[h][0] = Z[h][1] = Z[h][2] = Z[h][3] = 0.0f;
        mma16808(Z[h], kv.a0, kv.a1, kv.b[h] & mask);
        mma16816(Z[h], aS[0], bW[0][h][0], bW[0][h][1]);
#pragma unroll
        for (int e = 0; e < 4; e++) { Z[h][e] = tanh_fast(Z[h][e]); }
    }
}
__device__ __forceinline__ void forward_step8(float (&S)[2][4], uint32_t (&aS)[1][4], const uint32_t (&bW)[1][2][2],
                                              const KV8 &kv, uint32_t mask, float fval) {
    const float gate = 1.0f - fval;
    float Z[2][4];
    compute_z8(Z, aS, bW, kv, mask);
#pragma unroll
    for (int h = 0; h < 2; h++) {
#pragma unroll
        for (int e = 0; e < 4; e++) { S[h][e] = state_update(S[h][e], Z[h][e], gate); }
    }
    pack_frag<16>(aS, S);
}

// The forward's fast path (V=16, a full 32-token chunk), one of its two blocks of 16 tokens (blk; the caller writes the
// checkpoint between them), with the token inputs moved into registers by three ldmatrix and four 128-bit loads, so
// a step reads no shared memory:
// - k v^T by the tensor core: an m16n8k8 MMA per column tile with A = this warp's 16 rows of k for the 8 tokens of
//   the half-block holding the step's token (m = row, k = token) and B = v of those tokens (k = token, n = column)
//   masked to the step's token; the products are exact and every other term is 0, so the accumulator holds exactly
//   the fp32 k v^T the scalar path computes, and H W then accumulates onto it (Z is bit-identical to forward_step's,
//   hence to the backward's recompute).
// - y by accumulation: A = H^T (movmatrix), B = q of 8 tokens masked to the step's token, so the steps write the
//   columns of one accumulator tile per 8 tokens: y^T of the block, flushed once to the per-warp partial-sum buffer.
// About 50 SASS instructions a step (73 for the one-token path); NOTES.md, round 4, has the counts and timings.
template <int V, int HPC>
__device__ __forceinline__ void forward_chunk16(float (&S)[V / 8][4], uint32_t (&aS)[V / 16][4],
                                                const uint32_t (&bW)[V / 16][V / 8][2], const Stage<V, HPC, false> &st,
                                                float *ybuf, int blk, int warp, int hh, int rb, int lane) {
    static_assert(V == 16, "the 16-token block path is built for V=16");
    constexpr int HV = HPC * V;
    const int g = lane >> 2, t4 = lane & 3, mi = lane >> 3, mr = lane & 7;
    const int NW = blockDim.x >> 5;
    // this lane's row address for each ldmatrix (matrix mi, row mr of it)
    const uint32_t k_addr = smem_addr(st.k + ((mi >> 1) * 8 + mr) * st.ks + rb * 16 + (mi & 1) * 8);
    const uint32_t q_addr = smem_addr(st.q + ((mi >> 1) * 8 + mr) * st.ks + rb * 16 + (mi & 1) * 8);
    const uint32_t v_addr = smem_addr(st.v + ((mi & 1) * 8 + mr) * HV + hh * V + (mi >> 1) * 8);
    const float4 *f4 = (const float4 *)st.fptr(0, hh);
    // which lane holds token s of a block in the B (k = token) layout: t4 == (s & 7) >> 1, half s & 1
    uint32_t tmask[4];
#pragma unroll
    for (int p = 0; p < 4; p++) { tmask[p] = (t4 == p) ? 0xffffffffu : 0u; }
    {
        uint32_t aK[4], bV[4], bQ[4]; // bV: tile 0 (b0, b1), tile 1 (b0, b1); bQ: tokens 0-7 (b0, b1), 8-15 (b0, b1)
        ldsm_x4_trans(aK, k_addr + (uint32_t)(blk * 16 * st.ks * 2));
        ldsm_x4_trans(bV, v_addr + (uint32_t)(blk * 16 * HV * 2));
        ldsm_x4(bQ, q_addr + (uint32_t)(blk * 16 * st.ks * 2));
        float4 f4s;
        float Y[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}}; // y^T of tokens 0-7, 8-15
#pragma unroll
        for (int s = 0; s < 16; s++) {
            const uint32_t half = (s & 1) ? 0xffff0000u : 0x0000ffffu;
            const uint32_t tm = tmask[(s & 7) >> 1] & half;
            float Z[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                // k_s v_s^T, exact: an m16n8k8 MMA over the block half holding token s (aK regs 0,1: tokens 0-7;
                // 2,3: tokens 8-15), so no operand register has to be zeroed
                Z[h][0] = Z[h][1] = Z[h][2] = Z[h][3] = 0.0f;
                if (s < 8) {
                    mma16808(Z[h], aK[0], aK[1], bV[2 * h] & tm);
                } else {
                    mma16808(Z[h], aK[2], aK[3], bV[2 * h + 1] & tm);
                }
                mma16816(Z[h], aS[0], bW[0][h][0], bW[0][h][1]); // + H W
#pragma unroll
                for (int e = 0; e < 4; e++) { Z[h][e] = tanh_fast(Z[h][e]); }
            }
            if (s % 4 == 0) { f4s = f4[blk * 4 + s / 4]; }
            const float fval = s % 4 == 0 ? f4s.x : s % 4 == 1 ? f4s.y : s % 4 == 2 ? f4s.z : f4s.w;
            const float gate = 1.0f - fval;
#pragma unroll
            for (int h = 0; h < 2; h++) {
#pragma unroll
                for (int e = 0; e < 4; e++) { S[h][e] = state_update(S[h][e], Z[h][e], gate); }
            }
            pack_frag<V>(aS, S);
            // y_s^T: A = H^T (m = column j, k = row r; movmatrix), B = q of the half's 8 tokens (k = r, n = token)
            // masked to column n = s & 7 (held by lanes g == s & 7): one MMA a step writes y_s into its column
            const bool mine = g == (s & 7);
            const uint32_t aT[4] = {trans8x8(aS[0][0]), trans8x8(aS[0][2]), trans8x8(aS[0][1]), trans8x8(aS[0][3])};
            const int hq = s >> 3;
            mma16816(Y[hq], aT, mine ? bQ[2 * hq] : 0u, mine ? bQ[2 * hq + 1] : 0u);
        }
        // Y[hq]: element (column j = g (+8), token 8 hq + 2 t4 (+1)) of the block's y^T
#pragma unroll
        for (int hq = 0; hq < 2; hq++) {
            float *yrow = ybuf + (blk * 16 + 8 * hq + 2 * t4) * NW * V + warp * V + g;
            yrow[0] = Y[hq][0];
            yrow[NW * V] = Y[hq][1];
            yrow[8] = Y[hq][2];
            yrow[NW * V + 8] = Y[hq][3];
        }
    }
}

// loads this warp's B fragments of W (forward, k = v index) or W^T (backward, k = j index)
template <int V>
__device__ __forceinline__ void load_w_frags(uint32_t (&bW)[V / 16][V / 8][2], const floatX *Wn, bool transpose,
                                             int g, int t4) {
#pragma unroll
    for (int s = 0; s < V / 16; s++) {
#pragma unroll
        for (int h = 0; h < V / 8; h++) {
            const int n = 8 * h + g, r0 = 16 * s + 2 * t4;
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int r = r0 + 8 * half;
                bW[s][h][half] = transpose ? pack_raw(Wn[n * V + r], Wn[n * V + r + 1])
                                           : pack_raw(Wn[r * V + n], Wn[(r + 1) * V + n]);
            }
        }
    }
}

// CTA -> (sequence, heads) mapping shared by the forward and backward kernels
struct CtaMap {
    int b, qh, n0, L;
    long tok0;
};
__device__ __forceinline__ CtaMap cta_map(const int *cu_seqlens, int T, int N, int Nq, int HPC) {
    CtaMap m;
    m.b = blockIdx.y;
    const int Gq = N / Nq, cpq = Gq / HPC;
    m.qh = blockIdx.x / cpq;
    m.n0 = m.qh * Gq + (blockIdx.x % cpq) * HPC;
    m.tok0 = cu_seqlens ? (long)cu_seqlens[m.b] : (long)m.b * T;
    m.L = cu_seqlens ? cu_seqlens[m.b + 1] - cu_seqlens[m.b] : T;
    return m;
}
__device__ __forceinline__ long ckpt_slot(const CtaMap &m, int c) { return m2rnn_ckpt_slot(m.b, m.tok0, c); }
// checkpoint half (0: before token 0 of chunk c, 1: before its token 16) of the head at head_off, in (slots,2,N,K,V)
__device__ __forceinline__ size_t ckpt_off(const CtaMap &m, int c, int half, int N, int K, int V, size_t head_off) {
    return (size_t)(2 * ckpt_slot(m, c) + half) * N * K * V + head_off;
}

// clamp to [-c, c] keeping a NaN (fminf/fmaxf would turn it into -c; NaN must reach the trainer's guard, as in the
// CPU reference): the NaN-propagating min/max of sm_80+, the same two instructions
__device__ __forceinline__ float clamp_nan(float x, float c) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(x), "f"(-c));
    asm("min.NaN.f32 %0, %0, %1;\n" : "+f"(r) : "f"(c));
    return r;
}

} // namespace m2rnn_detail

// ----------------------------------------------------------------------------------------------------------------
// CUDA kernels

// Forward. grid (N/HPC, B), block HPC*(K/16) warps. ckpt (slots,2,N,K,V) fp32 or NULL: H before tokens 0 and 16 of
// each chunk (the second where the chunk has more than 16 tokens).
template <int V, int HPC, bool BIG>
__global__ void __launch_bounds__(BIG ? 512 : 256, BIG ? 1 : 3)
    m2rnn_forward_kernel(floatX *__restrict__ y, float *__restrict__ hT, float *__restrict__ ckpt,
                         const floatX *__restrict__ q, const floatX *__restrict__ k, const floatX *__restrict__ v,
                         const float *__restrict__ f, const floatX *__restrict__ W, const float *__restrict__ h0,
                         const int *__restrict__ cu_seqlens, int T, int N, int Nq, int K, long sq, long sk, long sv) {
    using namespace m2rnn_detail;
    constexpr int NT = V / 8, NS = V / 16, HV = HPC * V;
    const int RB = K / 16, NW = HPC * RB;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int hh = warp / RB, rb = warp % RB, row0 = rb * 16 + g;
    const CtaMap m = cta_map(cu_seqlens, T, N, Nq, HPC);
    const int n = m.n0 + hh;

    extern __shared__ __align__(16) unsigned char smem[];
    const size_t stage_bytes = Stage<V, HPC, false>::bytes(K);
    float *ybuf = (float *)(smem + 2 * stage_bytes); // (CHUNK, NW, V) per-warp partial y

    uint32_t bW[NS][NT][2];
    load_w_frags<V>(bW, W + (size_t)n * V * V, false, g, t4);

    const size_t head_off = (size_t)n * K * V;
    const size_t state_off = (size_t)m.b * N * K * V + head_off; // this (sequence, head) in h0, hT
    float S[NT][4];
    load_state<V>(S, h0 ? h0 + state_off : nullptr, row0, t4);
    uint32_t aS[NS][4];
    pack_frag<V>(aS, S);

    const int nchunks = CEIL_DIV(m.L, M2RNN_CHUNK);
    auto load_chunk = [&](int c) { // chunk c into stage buffer c & 1, as one cp.async group
        Stage<V, HPC, false>(smem + (c & 1) * stage_bytes, K)
            .load(m.tok0 + (long)c * M2RNN_CHUNK, min(M2RNN_CHUNK, m.L - c * M2RNN_CHUNK), q, k, v, nullptr, f, m.qh,
                  m.n0, N, K, sq, sk, sv);
    };
    if (nchunks > 0) { load_chunk(0); }
    for (int c = 0; c < nchunks; c++) {
        const int len = min(M2RNN_CHUNK, m.L - c * M2RNN_CHUNK);
        if (c + 1 < nchunks) { // prefetch the next chunk into the other buffer (freed by the barrier below)
            load_chunk(c + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        // H before tokens 0 and 16, for the backward's recompute
        if (ckpt) { store_state_pairs<V>(ckpt + ckpt_off(m, c, 0, N, K, V, head_off), S, row0, t4); }
        const Stage<V, HPC, false> st(smem + (c & 1) * stage_bytes, K);
        const int ks = st.ks;
        bool done = false;
        if constexpr (V == 16) {
            if (len == M2RNN_CHUNK) {
                forward_chunk16<V, HPC>(S, aS, bW, st, ybuf, 0, warp, hh, rb, lane);
                if (ckpt) { store_state_pairs<V>(ckpt + ckpt_off(m, c, 1, N, K, V, head_off), S, row0, t4); }
                forward_chunk16<V, HPC>(S, aS, bW, st, ybuf, 1, warp, hh, rb, lane);
                done = true;
            }
        }
        if (!done) { // the sequence's last partial chunk, and V=32: one token at a time
            const floatX *kp = st.k + row0, *qp = st.q + rb * 16 + 2 * t4, *vp = st.v + hh * V + 2 * t4;
            const float *fp = st.fptr(0, hh);
            const uint32_t yaddr = smem_addr(ybuf + warp * V + 2 * t4);
            auto token = [&](int i) {
                TokenIn<V, HPC> in;
                in.k0 = bf2f(kp[i * ks]);
                in.k1 = bf2f(kp[i * ks + 8]);
                in.fval = fp[i];
                in.gate = 1.0f - in.fval;
#pragma unroll
                for (int h = 0; h < NT; h++) {
                    const uint32_t u = *(const uint32_t *)(vp + i * HV + 8 * h);
                    in.vv[h][0] = bf_lo(u);
                    in.vv[h][1] = bf_hi(u);
                }
                // q broadcast over output rows 0..7: A[m][r] = q[r] for this warp's 16 rows r (rows 8..15 unused: 0)
                uint32_t aq[4];
                aq[0] = *(const uint32_t *)(qp + i * ks);
                aq[2] = *(const uint32_t *)(qp + i * ks + 8);
                aq[1] = aq[3] = 0u;
                forward_step<V, HPC>(S, aS, bW, in);
                // y partial over this warp's rows: out[m][j] = sum_r q[r] H[r][j] (B = H as k16 x n8 tiles)
#pragma unroll
                for (int h = 0; h < NT; h++) {
                    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma16816(acc, aq, trans8x8(aS[h >> 1][2 * (h & 1)]), trans8x8(aS[h >> 1][2 * (h & 1) + 1]));
                    st_shared_v2_if(g == 0, yaddr + (uint32_t)((i * NW * V + 8 * h) * 4), acc[0], acc[1]);
                }
            };
            for (int i = 0; i < len; i++) {
                if (i == 16 && ckpt) { store_state_pairs<V>(ckpt + ckpt_off(m, c, 1, N, K, V, head_off), S, row0, t4); }
                token(i);
            }
        }
        __syncthreads();
        // y = sum over the head's row-block warps; one thread per (token, column pair). The chunk's base pointer is
        // formed once and K = 64 (4 row blocks) is unrolled: like the stage load, this runs once per 32 steps and
        // costs its latency (NOTES.md, round 5)
        floatX *ychunk = y + (m.tok0 + (long)c * M2RNN_CHUNK) * N * V + (long)m.n0 * V;
        for (int idx = threadIdx.x; idx < len * (HV / 2); idx += blockDim.x) {
            const int i = idx / (HV / 2), hv = 2 * (idx % (HV / 2)), h2 = hv / V, col = hv % V;
            const float *src = ybuf + (i * NW + h2 * RB) * V + col;
            float2 sum = *(const float2 *)src;
            if (RB == 4) {
                const float2 x1 = *(const float2 *)(src + V), x2 = *(const float2 *)(src + 2 * V);
                const float2 x3 = *(const float2 *)(src + 3 * V);
                sum.x = ((sum.x + x1.x) + x2.x) + x3.x; // the generic loop's order, so y is bit-identical either way
                sum.y = ((sum.y + x1.y) + x2.y) + x3.y;
            } else {
                for (int r = 1; r < RB; r++) {
                    const float2 x = *(const float2 *)(src + r * V);
                    sum.x += x.x;
                    sum.y += x.y;
                }
            }
            floatX *dst = ychunk + i * N * V + hv;
            if constexpr (sizeof(floatX) == 2) {
                *(__nv_bfloat162 *)dst = __floats2bfloat162_rn(sum.x, sum.y);
            } else {
                dst[0] = (floatX)sum.x;
                dst[1] = (floatX)sum.y;
            }
        }
    }
    if (hT) { store_state<V>(hT + state_off, S, row0, t4); }
}

// Backward. Same grid/block as the forward. Needs the checkpoints the training forward wrote. Writes dv, df, dh0
// directly; dq/dk into fp32 accumulators (zeroed by the launcher), or with DET into partial slots over the checkpoints
// it has read (m2rnn_partial_off; dk's into qkx where PK = 1), so a deterministic backward spends the checkpoints: one
// backward a forward; dW into per-(b, row block) partials.
// Two builds; the launcher takes one by the layer's shape alone (V and K), so the numerics never depend on the batch
// size or the GPU (the sub-chunk length and the heads per CTA it also picks change no bit: test_m2rnn_gpu):
// - ZS, the Z stash (V=16, up to 8 warps a CTA): the sub-chunk's recompute keeps, per step, Z_t and E_t = H_t - Z_t
//   (state_update's difference, from the fp32 state) as fp16 in shared memory; the reverse step reads them instead of
//   re-running the MMA and tanh, takes df from E_t and rebuilds H_t's bf16 fragment for dW as bf16(Z_t + E_t).
//   Sub-chunks of ZSUB tokens: 16 (one a checkpoint, so each token is recomputed once; 64 KB of stash a 4-warp CTA:
//   one head a CTA, 3 CTAs an SM at up to 168 registers) or 8 (the second sub-chunk of a checkpoint first re-runs the 8
//   steps before it: 1.5 recomputed steps a token, half the stash; two heads a CTA at 2 CTAs an SM, or one at 4).
//   Inputs are staged 16 tokens at a time, the next stage copied under the flush of the stage's last sub-chunk.
// - plain (V=32, or V=16 with K > 128): the reverse step recomputes Z_t from the bf16 H fragments that the sub-chunk's
//   recompute kept (the forward's Z bit for bit, rounded to fp16 as the stash keeps it) and takes df from bf16(H_t);
//   sub-chunks of 8 tokens, inputs staged 32 tokens at a time.
// PAIR (DET, the Z stash, one head a CTA, N/Nq even): the grid runs in clusters of two CTAs, heads 2x and 2x + 1 of a
// q/k head, and the pair stores one partial slot of dq and dk as a CTA of two heads would (rank 0 adds dq, rank 1 dk,
// each from both CTAs' shared memory): one head a CTA without a second region of slots, and the same bits.
template <int V, int HPC, bool BIG, bool ZS, bool DET = false, int ZSUB = 8, bool PAIR = false>
__global__ void __launch_bounds__(BIG ? 512 : (ZS && ZSUB == 16 ? 128 : 256),
                                  BIG ? 1 : (ZS ? (ZSUB == 16 ? 3 : 2) : 3))
    m2rnn_backward_kernel(float *__restrict__ dq_acc, float *__restrict__ dk_acc, float *qkx, int *wdone,
                          floatX *__restrict__ dv,
                          float *__restrict__ df, float *__restrict__ dW_part, float *__restrict__ dh0,
                          const floatX *__restrict__ dy, const float *__restrict__ dhT,
                          float *ckpt, const floatX *__restrict__ q, const floatX *__restrict__ k,
                          const floatX *__restrict__ v, const float *__restrict__ f, const floatX *__restrict__ W,
                          const int *__restrict__ cu_seqlens, int T, int N, int Nq, int K, long sq, long sk, long sv,
                          float clip) {
    using namespace m2rnn_detail;
    constexpr int NT = V / 8, NS = V / 16, HV = HPC * V;
    constexpr int SUB = ZS ? ZSUB : M2RNN_SUB; // tokens a sub-chunk
    constexpr int CH = ZS ? 16 : M2RNN_CHUNK;  // tokens a stage
    constexpr int NB = SUB / 8;                // blocks of 8 tokens a sub-chunk (the width of the V=16 tiles)
    constexpr bool CKB = ZS && SUB == 8;       // the next checkpoint copied into shared memory a sub-chunk early
    static_assert(!ZS || (V == 16 && !BIG), "the Z stash is built for V=16, up to 8 warps per CTA");
    static_assert(SUB == 8 || (ZS && SUB == 16 && HPC == 1), "16-token sub-chunks: the Z stash, one head a CTA");
    static_assert(!PAIR || (DET && ZS && HPC == 1), "pairs of CTAs: deterministic mode, the Z stash, one head a CTA");
    const int RB = K / 16, NW = HPC * RB;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int hh = warp / RB, rb = warp % RB, row0 = rb * 16 + g;
    const CtaMap m = cta_map(cu_seqlens, T, N, Nq, HPC);
    const int n = m.n0 + hh;
    // the clamp's bound: clip, or +inf where clipping is off (clamp_nan(g, inf) = g for every g, NaN and inf included:
    // the same bits as no clamp, without a branch in the middle of each reverse step, which splits the step loop into
    // blocks the compiler cannot schedule across)
    const float cl = clip > 0.0f ? clip : INFINITY;
    // DET: the sum kernel may start once every CTA of this grid has (so its CTAs, which wait on the window counts,
    // only take room that no CTA of this grid still needs)
    if constexpr (DET) { pdl_trigger(); }
    const uint32_t prank = PAIR ? cluster_ctarank() : 0u; // PAIR: this CTA's rank in its pair (its head is n0 + prank)

    extern __shared__ __align__(16) unsigned char smem[];
    // CKB: (NW, 32, NT * 4) each lane's accumulator elements of H before the next sub-chunk, copied from its checkpoint
    // a sub-chunk early (cp.async: the load's latency hides under the flush, and no register holds it meanwhile);
    // first, so that a lane's slot is a function of the thread index alone. (16-token sub-chunks load it into
    // registers under the flush, which their register budget allows; the plain build loads it when it starts the
    // sub-chunk: at its 80-register cap the copy's addresses cost it more spills than the latency it hides.)
    float *my_ckb = (float *)smem + threadIdx.x * NT * 4;
    unsigned char *const smem_rest = smem + (CKB ? blockDim.x * NT * 4 * sizeof(float) : 0);
    Stage<V, HPC, true, CH> st(smem_rest, K);
    unsigned char *const smem_work = smem_rest + Stage<V, HPC, true, CH>::bytes(K);
    // plain: bf16 A fragments of H for the sub-chunk, (SUB+1, NW, NS, 32) uint4: lane-private, so no barriers are
    // needed; a lane's fragment slice is 16 contiguous bytes, so one 128-bit access moves it (conflict-free)
    uint4 *const hist = (uint4 *)smem_work;
    // ZS: Z_t and E_t of each recomputed step as fp16, (NW, SUB, 32) uint4 each, lane-private in the same way
    uint4 *const zst = (uint4 *)smem_work, *const est = zst + NW * SUB * 32;
    // Partial sums of the sub-chunk, summed when flushed: dq and dk rows, dv columns, (token, warp) slots of 16 floats.
    // plain: rdq, rdk, rdv (SUB, NW, 16 or V) after the history; ZS: each warp's (SUB, 16) q, k and v slots lie over
    // its own Z entries, written once its reverse steps have read them. rdf: (SUB, NW, 8), a lane quad's sum over rows g
    // and g + 8 (V=16), or (SUB, NW) over the warp's rows (V=32).
    float *const rdq = (float *)(hist + (SUB + 1) * NW * NS * 32);
    float *const rdk = rdq + SUB * NW * 16, *const rdv = rdk + SUB * NW * 16;
    float *const rdf = ZS ? (float *)(est + NW * SUB * 32) : rdv + SUB * NW * V;
    auto slot_q = [&](int w, int i) -> float * {
        return ZS ? (float *)(zst + w * SUB * 32) + i * 16 : rdq + (i * NW + w) * 16;
    };
    auto slot_k = [&](int w, int i) -> float * {
        return ZS ? (float *)(zst + w * SUB * 32) + (SUB + i) * 16 : rdk + (i * NW + w) * 16;
    };
    auto slot_v = [&](int w, int i) -> float * {
        return ZS ? (float *)(zst + w * SUB * 32) + (2 * SUB + i) * 16 : rdv + (i * NW + w) * V;
    };

    const floatX *Wn = W + (size_t)n * V * V;
    uint32_t bW[NS][NT][2], bWT[NS][NT][2];
    load_w_frags<V>(bW, Wn, false, g, t4);
    load_w_frags<V>(bWT, Wn, true, g, t4);

    const size_t head_off = (size_t)n * K * V;
    const size_t state_off = (size_t)m.b * N * K * V + head_off; // this (sequence, head) in dhT, dh0
    float G[NT][4]; // dL/dH_{t+1}, carried right to left
    load_state<V>(G, dhT ? dhT + state_off : nullptr, row0, t4);
    float dWa[NS][NT][4];
#pragma unroll
    for (int s = 0; s < NS; s++) {
#pragma unroll
        for (int h = 0; h < NT; h++) {
#pragma unroll
            for (int e = 0; e < 4; e++) { dWa[s][h][e] = 0.0f; }
        }
    }
    uint4 *my_hist = hist + warp * NS * 32 + lane; // entry j, slice s at [j * hist_step + s * 32]
    const int hist_step = NW * NS * 32;
    uint4 *my_zst = zst + warp * SUB * 32 + lane, *my_est = est + warp * SUB * 32 + lane; // step i at [i * 32] (ZS)
    // shared addresses of this lane's partial-sum slots for token 0 of a sub-chunk (the V=32 reverse step's; V=16
    // stores only df's a step)
    const uint32_t rdf_a = smem_addr(rdf + (V == 16 ? warp * 8 + g : warp)), rdk_a = smem_addr(rdk + warp * 16 + g);
    const uint32_t rdq_a = smem_addr(rdq + warp * 16 + g), rdv_a = smem_addr(rdv + warp * V + 2 * t4);

    // the checkpoint a sub-chunk starting at token t of the sequence starts from: H before token 16 * (t / 16)
    auto ck_src = [&](int t) { return ckpt + ckpt_off(m, t >> 5, (t >> 4) & 1, N, K, V, head_off); };
    auto load_ck = [&](int t) { // CKB: into my_ckb, as one cp.async group
        const float *src = ck_src(t);
#pragma unroll
        for (int h = 0; h < NT; h++) {
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                cp_async8(smem_addr(my_ckb + 4 * h + e), src + frag_offset<V>(row0, t4, h, e));
            }
        }
        cp_async_commit();
    };
    const int nst = CEIL_DIV(m.L, CH); // stages
    float ckr[NT][4];                  // ZS, 16-token sub-chunks: the next sub-chunk's checkpoint, loaded under the flush
    if constexpr (ZS) { // the last stage and the checkpoint of its last sub-chunk
        if (nst > 0) {
            const int c = nst - 1, clen = m.L - c * CH, tl = c * CH + (CEIL_DIV(clen, SUB) - 1) * SUB;
            st.load(m.tok0 + (long)c * CH, clen, q, k, v, dy, f, m.qh, m.n0, N, K, sq, sk, sv);
            if constexpr (CKB) {
                load_ck(tl);
            } else {
                load_state_pairs<V>(ckr, ck_src(tl), row0, t4);
            }
            cp_async_wait<0>();
            __syncthreads();
        }
    }
    for (int c = nst - 1; c >= 0; c--) {
        const int clen = min(CH, m.L - c * CH);
        const long ctok = m.tok0 + (long)c * CH;
        if constexpr (!ZS) {
            __syncthreads(); // everyone is done with the previous chunk's staged inputs
            st.load(ctok, clen, q, k, v, dy, f, m.qh, m.n0, N, K, sq, sk, sv);
            cp_async_wait<0>();
            __syncthreads();
        }

        float S[NT][4];
        uint32_t aS[NS][4];
        // per-lane base pointers into the staged chunk: a token's inputs are base + token * stride
        const floatX *kp = st.k + row0, *qp = st.q + row0, *kbp = st.k + rb * 16 + 2 * t4;
        const floatX *vp = st.v + hh * V + 2 * t4, *dyp = st.dy + hh * V + 2 * t4;
        const float *fp = st.f + hh;
        const int KS = st.ks;
        auto token_in = [&](int lt) {
            TokenIn<V, HPC> in;
            in.k0 = bf2f(kp[lt * KS]);
            in.k1 = bf2f(kp[lt * KS + 8]);
            in.fval = fp[lt * HPC];
            in.gate = 1.0f - in.fval;
#pragma unroll
            for (int h = 0; h < NT; h++) {
                const uint32_t u = *(const uint32_t *)(vp + lt * HV + 8 * h);
                in.vv[h][0] = bf_lo(u);
                in.vv[h][1] = bf_hi(u);
            }
            return in;
        };
        const int nsub = CEIL_DIV(clen, SUB);
        for (int j = nsub - 1; j >= 0; j--) {
            const int s0 = j * SUB, slen = min(SUB, clen - s0);
            const int t0 = c * CH + s0; // the sub-chunk's first token in the sequence
            // PAIR: the partner has read this CTA's slots of the sub-chunk before (its second arrival in the flush
            // below): they lie over the Z stash, which this sub-chunk's recompute writes first
            if constexpr (PAIR) {
                if (t0 + slen < m.L) { cluster_wait(); }
            }
            // H before the sub-chunk: its checkpoint (t0 % 16 == 0), or the 8 steps after it (t0 % 16 == 8)
            if constexpr (CKB) {
                cp_async_wait<0>(); // (this lane's own copies: no barrier)
#pragma unroll
                for (int h = 0; h < NT; h++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) { S[h][e] = my_ckb[4 * h + e]; }
                }
            } else if constexpr (ZS) {
#pragma unroll
                for (int h = 0; h < NT; h++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) { S[h][e] = ckr[h][e]; }
                }
            } else {
                load_state<V>(S, ck_src(t0), row0, t4);
            }
            pack_frag<V>(aS, S);
            if constexpr (SUB == 8) {
                if (t0 & 8) {
                    if constexpr (V == 16) {
                        const KV8 kv = load_kv8<HPC, CH>(st, s0 - 8, hh, rb, lane);
#pragma unroll
                        for (int ii = 0; ii < 8; ii++) {
                            forward_step8(S, aS, bW, kv, token_mask8(ii, t4), fp[(s0 - 8 + ii) * HPC]);
                        }
                    } else {
#pragma unroll
                        for (int ii = 0; ii < 8; ii++) { forward_step<V, HPC>(S, aS, bW, token_in(s0 - 8 + ii)); }
                    }
                }
            }
            if constexpr (!ZS) {
#pragma unroll
                for (int s = 0; s < NS; s++) { my_hist[s * 32] = make_uint4(aS[s][0], aS[s][1], aS[s][2], aS[s][3]); }
            }
            // V=16: the dq, dk and dv of each 8-token block accumulate in three MMA tiles, token ii in column ii (the
            // B operands masked to lanes g == ii): tk = dk (row g / g+8, token 2t4 / 2t4+1), tv = dv (column g / g+8,
            // token 2t4 / 2t4+1), tq = dq likewise, made by the recompute (dq_t = H_{t+1} dy_t needs nothing from the
            // reverse direction) with fd, the block's dy, as the B operand; the three written out once a sub-chunk
            float tq[NB][4], tk[NB][4], tv[NB][4];
#pragma unroll
            for (int b = 0; b < NB; b++) {
#pragma unroll
                for (int e = 0; e < 4; e++) { tq[b][e] = tk[b][e] = tv[b][e] = 0.0f; }
            }
            KV8 kvs;                    // V=16: the block's k and v as MMA fragments, for the recompute and plain's Z
            uint32_t fd[2] = {0u, 0u};  // V=16: the block's dy as the B operand of dq's MMA
            const int mi = lane >> 3, mr = lane & 7;
            // recompute token i = 8 blk + ii of the sub-chunk. ZS: stash Z_t and E_t; plain: hist entry i+1 = bf16
            // fragments of H after the token
            auto recompute = [&](int blk, int ii) {
                const int i = 8 * blk + ii;
                if constexpr (ZS) {
                    const float fval = fp[(s0 + i) * HPC], gate = 1.0f - fval;
                    float Z[2][4], E[2][4];
                    compute_z8(Z, aS, bW, kvs, token_mask8(ii, t4));
#pragma unroll
                    for (int h = 0; h < 2; h++) {
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            E[h][e] = S[h][e] - Z[h][e]; // (state_update's own difference: one FADD for both)
                            S[h][e] = state_update(S[h][e], Z[h][e], gate);
                        }
                    }
                    my_zst[i * 32] = make_uint4(pack_f16x2(Z[0][0], Z[0][1]), pack_f16x2(Z[0][2], Z[0][3]),
                                                pack_f16x2(Z[1][0], Z[1][1]), pack_f16x2(Z[1][2], Z[1][3]));
                    my_est[i * 32] = make_uint4(pack_f16x2(E[0][0], E[0][1]), pack_f16x2(E[0][2], E[0][3]),
                                                pack_f16x2(E[1][0], E[1][1]), pack_f16x2(E[1][2], E[1][3]));
                    pack_frag<V>(aS, S);
                } else if constexpr (V == 16) {
                    forward_step8(S, aS, bW, kvs, token_mask8(ii, t4), fp[(s0 + i) * HPC]);
                } else {
                    forward_step<V, HPC>(S, aS, bW, token_in(s0 + i));
                }
                if constexpr (V == 16) { // dq_t = H_{t+1} dy_t
                    const uint32_t gm = g == ii ? 0xffffffffu : 0u;
                    mma16816(tq[blk], aS[0], fd[0] & gm, fd[1] & gm);
                }
                if constexpr (!ZS) {
                    if (V != 16 || i + 1 < SUB) { // (V=16: entry SUB is no reverse step's, dq having left the reverse)
#pragma unroll
                        for (int s = 0; s < NS; s++) {
                            my_hist[(i + 1) * hist_step + s * 32] = make_uint4(aS[s][0], aS[s][1], aS[s][2], aS[s][3]);
                        }
                    }
                }
            };
            // hist entries i and i + 1 (H before and after token s0 + i) as A fragments
            auto hist_frags = [&](int i, uint32_t (&aP)[NS][4], uint32_t (&aN)[NS][4]) {
#pragma unroll
                for (int s = 0; s < NS; s++) {
                    const uint4 p = my_hist[i * hist_step + s * 32], nx = my_hist[(i + 1) * hist_step + s * 32];
                    aP[s][0] = p.x; aP[s][1] = p.y; aP[s][2] = p.z; aP[s][3] = p.w;
                    aN[s][0] = nx.x; aN[s][1] = nx.y; aN[s][2] = nx.z; aN[s][3] = nx.w;
                }
            };
            // the reverse step for V=32: one token's q, dy, k, v loaded a step, its dq, dk, dv, df partial sums
            // stored a step (V=16 takes reverse16 below)
            auto reverse = [&](int i) {
                const int lt = s0 + i;
                const TokenIn<V, HPC> in = token_in(lt);
                uint32_t aP[NS][4], aN[NS][4]; // H_t (before the token) and H_{t+1}, as bf16 fragments
                hist_frags(i, aP, aN);
                float Z[NT][4];
                compute_z<V>(Z, aP, bW, in.k0, in.k1, in.vv); // bit-identical to the forward's Z_t
                round_f16<V>(Z);                               // (Z as the stash would keep it)
                const float q0 = bf2f(qp[lt * KS]), q1 = bf2f(qp[lt * KS + 8]);
                // dy of this lane's two columns per n8 tile: also the B fragment of dq's MMA below (k = column)
                uint32_t dyw[NT];
                float dyv[NT][2];
#pragma unroll
                for (int h = 0; h < NT; h++) {
                    dyw[h] = *(const uint32_t *)(dyp + lt * HV + 8 * h);
                    dyv[h][0] = bf_lo(dyw[h]);
                    dyv[h][1] = bf_hi(dyw[h]);
                }
                float D[NT][4], dX[NT][4], dfp = 0.0f;
#pragma unroll
                for (int h = 0; h < NT; h++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float gc = clamp_nan(G[h][e], cl);
                        D[h][e] = fmaf((e >> 1) ? q1 : q0, dyv[h][e & 1], gc);
                        const float z = Z[h][e];
                        dX[h][e] = D[h][e] * in.gate * fmaf(-z, z, 1.0f);
                        dfp = fmaf(D[h][e], frag_elem<V>(aP, h, e) - z, dfp);
                    }
                }
                uint32_t adX[NS][4];
                pack_frag<V>(adX, dX);
                // the recurrence: G <- f D + dX W^T
#pragma unroll
                for (int h = 0; h < NT; h++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) { G[h][e] = in.fval * D[h][e]; }
#pragma unroll
                    for (int s = 0; s < NS; s++) { mma16816(G[h], adX[s], bWT[s][h][0], bWT[s][h][1]); }
                }
                // off the chain: df, dk = dX v, dq = H_{t+1} dy, dv = dX^T k, dW += H_t^T dX
                dfp = warp_reduce_sum(dfp);
                st_shared_if(lane == 0, rdf_a + (uint32_t)(i * NW * 4), dfp);
                float ak[4] = {0.0f, 0.0f, 0.0f, 0.0f}, aq[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int s = 0; s < NS; s++) {
                    const uint32_t *pv = (const uint32_t *)(vp + lt * HV + 16 * s);
                    mma16816(ak, adX[s], pv[0], pv[4]);
                    mma16816(aq, aN[s], dyw[2 * s], dyw[2 * s + 1]);
                }
                st_shared_if(t4 == 0, rdk_a + (uint32_t)(i * NW * 64), ak[0]);
                st_shared_if(t4 == 0, rdk_a + (uint32_t)(i * NW * 64 + 32), ak[2]);
                st_shared_if(t4 == 0, rdq_a + (uint32_t)(i * NW * 64), aq[0]);
                st_shared_if(t4 == 0, rdq_a + (uint32_t)(i * NW * 64 + 32), aq[2]);
                uint32_t bdX[NT][2];
#pragma unroll
                for (int h = 0; h < NT; h++) {
                    bdX[h][0] = trans8x8(adX[h >> 1][2 * (h & 1)]);
                    bdX[h][1] = trans8x8(adX[h >> 1][2 * (h & 1) + 1]);
                }
#pragma unroll
                for (int s = 0; s < NS; s++) {
                    uint32_t aT[4] = {trans8x8(aP[s][0]), trans8x8(aP[s][2]), trans8x8(aP[s][1]), trans8x8(aP[s][3])};
#pragma unroll
                    for (int h = 0; h < NT; h++) { mma16816(dWa[s][h], aT, bdX[h][0], bdX[h][1]); }
                }
                // k broadcast over output rows 0..7 (rows 8..15 unused: 0)
                uint32_t akb[4];
                akb[0] = *(const uint32_t *)(kbp + lt * KS);
                akb[2] = *(const uint32_t *)(kbp + lt * KS + 8);
                akb[1] = akb[3] = 0u;
#pragma unroll
                for (int h = 0; h < NT; h++) {
                    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma16816(acc, akb, bdX[h][0], bdX[h][1]);
                    st_shared_v2_if(g == 0, rdv_a + (uint32_t)((i * NW * V + 8 * h) * 4), acc[0], acc[1]);
                }
            };
            // The V=16 reverse step of token i = 8 blk + ii: the same arithmetic as reverse's, with q dy^T, dk and dv
            // as masked MMAs from the block's fragments (fq, fvk: reloaded each step by ldmatrix from this lane's row
            // addresses aqd, avk: q as the A operand of m16n8k8 (m = row, k = token) and dy as its B (k = token, n =
            // column), transposed like load_kv8's k and v; v (k = column) then k (k = this warp's 16 rows) as m16n8k16
            // B operands with n = token); no per-token loads of q, dy, k, v, no per-token partial-sum stores but df's,
            // and df summed over a lane quad (two shuffles) instead of the warp (five)
            uint32_t aqd = 0, avk = 0;
            auto reverse16 = [&](int blk, int ii) {
                if constexpr (V == 16) { // (the body is compiled for V=16 only)
                    const int i = 8 * blk + ii;
                    const float fval = fp[(s0 + i) * HPC], gate = 1.0f - fval;
                    uint32_t aP[1][4]; // H_t (before the token) as bf16 fragments
                    float Z[2][4], Ev[2][4];
                    if constexpr (ZS) { // Z_t and E_t = H_t - Z_t as the recompute left them (fp16-rounded)
                        const uint4 u = my_zst[i * 32], w = my_est[i * 32];
                        const uint32_t zu[4] = {u.x, u.y, u.z, u.w}, eu[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                        for (int p = 0; p < 4; p++) { // pair p: elements (h, e) = (p >> 1, 2 (p & 1)) and the next
                            const float2 zz = unpack_f16x2(zu[p]), ee = unpack_f16x2(eu[p]);
                            Z[p >> 1][2 * (p & 1)] = zz.x;
                            Z[p >> 1][2 * (p & 1) + 1] = zz.y;
                            Ev[p >> 1][2 * (p & 1)] = ee.x;
                            Ev[p >> 1][2 * (p & 1) + 1] = ee.y;
                            aP[0][p] = pack_bf16x2(zz.x + ee.x, zz.y + ee.y); // H_t = Z_t + E_t, for dW
                        }
                    } else { // the forward's Z_t bit for bit, rounded to fp16 as the stash keeps it
                        const uint4 hp = my_hist[i * hist_step];
                        aP[0][0] = hp.x; aP[0][1] = hp.y; aP[0][2] = hp.z; aP[0][3] = hp.w;
                        compute_z8(Z, aP, bW, kvs, token_mask8(ii, t4));
                        round_f16<16>(Z);
                    }
                    uint32_t fq[4], fvk[4];
                    ldsm_x4_trans(fq, aqd);
                    ldsm_x4(fvk, avk);
                    const uint32_t tm = token_mask8(ii, t4), gm = g == ii ? 0xffffffffu : 0u;
                    float D[2][4], dX[2][4], dfp = 0.0f;
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        // D = clamp(G) + q_t dy_t^T by the tensor core: the clamped G is the accumulator and each
                        // element gets one nonzero (exact) product
#pragma unroll
                        for (int e = 0; e < 4; e++) { D[h][e] = clamp_nan(G[h][e], cl); }
                        mma16808(D[h], fq[0], fq[1], fq[2 + h] & tm);
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float z = Z[h][e];
                            dX[h][e] = D[h][e] * gate * fmaf(-z, z, 1.0f);
                            if constexpr (ZS) {
                                dfp = fmaf(D[h][e], Ev[h][e], dfp);
                            } else {
                                dfp = fmaf(D[h][e], frag_elem<16>(aP, h, e) - z, dfp);
                            }
                        }
                    }
                    uint32_t adX[1][4];
                    pack_frag<16>(adX, dX);
                    // the recurrence: G <- f D + dX W^T
#pragma unroll
                    for (int h = 0; h < 2; h++) {
#pragma unroll
                        for (int e = 0; e < 4; e++) { G[h][e] = fval * D[h][e]; }
                        mma16816(G[h], adX[0], bWT[0][h][0], bWT[0][h][1]);
                    }
                    // off the chain: df over the lane quad (rows g, g + 8), dk = dX v, dv = dX^T k, dW += H_t^T dX
                    dfp += __shfl_xor_sync(0xffffffffu, dfp, 1);
                    dfp += __shfl_xor_sync(0xffffffffu, dfp, 2);
                    st_shared_if(t4 == 0, rdf_a + (uint32_t)(i * NW * 32), dfp);
                    mma16816(tk[blk], adX[0], fvk[0] & gm, fvk[1] & gm);
                    // dX^T as an A operand (m = column, k = row) and dX as a B operand (k = row, n = column): movmatrix
                    const uint32_t x00 = trans8x8(adX[0][0]), x01 = trans8x8(adX[0][1]);
                    const uint32_t x10 = trans8x8(adX[0][2]), x11 = trans8x8(adX[0][3]);
                    const uint32_t aXT[4] = {x00, x10, x01, x11};
                    mma16816(tv[blk], aXT, fvk[2] & gm, fvk[3] & gm);
                    const uint32_t aT[4] = {trans8x8(aP[0][0]), trans8x8(aP[0][2]), trans8x8(aP[0][1]),
                                            trans8x8(aP[0][3])};
                    mma16816(dWa[0][0], aT, x00, x01);
                    mma16816(dWa[0][1], aT, x10, x11);
                }
            };
            // the sub-chunk: recompute its blocks left to right, then reverse them right to left. A whole block is
            // unrolled (the ZS and the 1-head plain builds by 2 in the reverse: unrolled whole, the Z-stash build lost
            // 5% at B=4, N=84 and the 1-head plain build 5% too; the 2-head plain build whole: -1% at B=8, N=84;
            // NOTES.md, round 5); a sequence's last, shorter block runs rolled.
#pragma unroll
            for (int blk = 0; blk < NB; blk++) {
                const int nb = min(8, slen - 8 * blk); // tokens of this block (<= 0: past the sequence's end)
                if (nb > 0) {
                    if constexpr (V == 16) {
                        kvs = load_kv8<HPC, CH>(st, s0 + 8 * blk, hh, rb, lane);
                        ldsm_x2(fd, smem_addr(st.dy + (s0 + 8 * blk + mr) * HV + hh * 16 + (mi & 1) * 8));
                    }
                    if (nb == 8) {
#pragma unroll
                        for (int ii = 0; ii < 8; ii++) { recompute(blk, ii); }
                    } else {
                        for (int ii = 0; ii < nb; ii++) { recompute(blk, ii); }
                    }
                }
            }
#pragma unroll
            for (int blk = NB - 1; blk >= 0; blk--) {
                const int nb = min(8, slen - 8 * blk);
                if (nb > 0) {
                    if constexpr (V == 16) {
                        const int tb = s0 + 8 * blk + mr; // this lane's token row for the block's ldmatrix reads
                        aqd = smem_addr(mi < 2 ? st.q + tb * KS + rb * 16 + mi * 8
                                               : st.dy + tb * HV + hh * 16 + (mi - 2) * 8);
                        avk = smem_addr(mi < 2 ? st.v + tb * HV + hh * 16 + mi * 8
                                               : st.k + tb * KS + rb * 16 + (mi - 2) * 8);
                        if constexpr (!ZS) {
                            if (NB > 1) { kvs = load_kv8<HPC, CH>(st, s0 + 8 * blk, hh, rb, lane); }
                        }
                    }
                    if (nb == 8) {
#pragma unroll((!ZS && HPC == 2) ? 8 : 2)
                        for (int ii = 7; ii >= 0; ii--) {
                            if constexpr (V == 16) { reverse16(blk, ii); } else { reverse(8 * blk + ii); }
                        }
                    } else {
                        for (int ii = nb - 1; ii >= 0; ii--) {
                            if constexpr (V == 16) { reverse16(blk, ii); } else { reverse(8 * blk + ii); }
                        }
                    }
                }
            }
            if constexpr (V == 16) { // the tiles into the partial-sum slots: element e is token 2t4 + (e & 1)
                if constexpr (ZS) { __syncwarp(); } // (this warp's Z entries, which the slots lie over, are all read)
#pragma unroll
                for (int b = 0; b < NB; b++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int i = 8 * b + 2 * t4 + (e & 1), r = g + 8 * (e >> 1);
                        slot_q(warp, i)[r] = tq[b][e];
                        slot_k(warp, i)[r] = tk[b][e];
                        slot_v(warp, i)[r] = tv[b][e];
                    }
                }
            }
            if constexpr (CKB) { // the next sub-chunk's checkpoint
                if (t0 > 0) { load_ck(t0 - SUB); }
            }
            __syncthreads();
            if constexpr (ZS) { // the next stage, and (16-token sub-chunks) the next checkpoint, under the flush
                if (j == 0 && c > 0) {
                    st.load(ctok - CH, CH, q, k, v, dy, f, m.qh, m.n0, N, K, sq, sk, sv);
                }
                if constexpr (!CKB) {
                    if (t0 > 0) { load_state_pairs<V>(ckr, ck_src(t0 - SUB), row0, t4); }
                }
            }
            // flush the sub-chunk's sums: dq/dk into the fp32 accumulators (fp32 reductions: the Gq/HPC CTAs of one
            // q/k head add to the same rows, in an order that varies from run to run), or with DET into this CTA's
            // partial slots (plain stores over its checkpoint half after the sub-chunk's, read by now: the early
            // copies are of the sub-chunk's own half or the one before; PAIR: the pair's, which the partner has read
            // too once it has passed its arrival below); dv, df.
            const long stok = ctok + s0;
            const int kq4 = K / 4;
            constexpr int PK = m2rnn_partial_rows(PAIR ? 2 : HPC, V);
            float *const pq = DET ? ckpt + m2rnn_partial_off(ckpt_slot(m, t0 >> 5), (t0 >> 4) & 1, t0 & 15,
                                                             m.n0 - (int)prank, N, K, V, PK)
                                  : nullptr;
            float *const pk = DET ? (PK == 2 ? pq + K : qkx + (pq - ckpt)) : nullptr;
            auto flush_qk = [&]() {
                for (int idx = threadIdx.x; idx < slen * kq4; idx += blockDim.x) {
                    const int i = idx / kq4, r = (idx % kq4) * 4; // rows r..r+3 live in row block r/16 of every head
                    float4 sq4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), sk4 = sq4;
                    if constexpr (PAIR) { // rank 0 dq, rank 1 dk: rank 0's head first, then rank 1's
                        const float *mine = (prank == 0 ? slot_q(r / 16, i) : slot_k(r / 16, i)) + r % 16;
                        const float4 a = *(const float4 *)mine, b = ld_dsmem_f4(smem_addr(mine), prank ^ 1u);
                        const float4 x0 = prank == 0 ? a : b, x1 = prank == 0 ? b : a;
                        sq4.x += x0.x; sq4.y += x0.y; sq4.z += x0.z; sq4.w += x0.w;
                        sq4.x += x1.x; sq4.y += x1.y; sq4.z += x1.z; sq4.w += x1.w;
                        *(float4 *)((prank == 0 ? pq : pk) + i * PK * K + r) = sq4;
                    } else {
                        for (int h2 = 0; h2 < HPC; h2++) {
                            const int w = h2 * RB + r / 16;
                            const float4 a = *(const float4 *)(slot_q(w, i) + r % 16);
                            const float4 b = *(const float4 *)(slot_k(w, i) + r % 16);
                            sq4.x += a.x; sq4.y += a.y; sq4.z += a.z; sq4.w += a.w;
                            sk4.x += b.x; sk4.y += b.y; sk4.z += b.z; sk4.w += b.w;
                        }
                        if constexpr (DET) {
                            *(float4 *)(pq + i * PK * K + r) = sq4;
                            *(float4 *)(pk + i * PK * K + r) = sk4;
                        } else {
                            const size_t off = (size_t)(stok + i) * Nq * K + (size_t)m.qh * K + r;
                            red_add_v4(dq_acc + off, sq4);
                            red_add_v4(dk_acc + off, sk4);
                        }
                    }
                }
            };
            if constexpr (PAIR) {
                cluster_arrive(); // this CTA's slots are written (the barrier above)
            } else {
                flush_qk();
            }
            for (int idx = threadIdx.x; idx < slen * HV; idx += blockDim.x) {
                const int i = idx / HV, hv = idx % HV, h2 = hv / V, col = hv % V;
                float sum = 0.0f;
                for (int r = 0; r < RB; r++) { sum += slot_v(h2 * RB + r, i)[col]; }
                dv[(stok + i) * sv + (long)m.n0 * V + hv] = __float2bfloat16(sum);
            }
            for (int idx = threadIdx.x; idx < slen * HPC; idx += blockDim.x) {
                const int i = idx / HPC, h2 = idx % HPC;
                float sum = 0.0f;
                if constexpr (V == 16) { // the head's warps, each its 8 lane quads
                    for (int r = 0; r < RB; r++) {
                        const float4 *p = (const float4 *)(rdf + ((i * NW + h2 * RB + r) * 8));
                        const float4 a = p[0], b = p[1];
                        sum += ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
                    }
                } else {
                    for (int r = 0; r < RB; r++) { sum += rdf[i * NW + h2 * RB + r]; }
                }
                df[(stok + i) * N + m.n0 + h2] = sum;
            }
            if constexpr (PAIR) {
                cluster_wait(); // the partner's slots are written
                flush_qk();
                cluster_arrive(); // done reading them (waited for before the next sub-chunk's recompute, or the exit)
            }
            if constexpr (ZS) { cp_async_wait<0>(); } // (the next stage and checkpoint copies)
            __syncthreads();
        }
        if constexpr (DET) { // a window's slots all stored: count it (each thread's stores made visible first)
            if ((c * CH) % M2RNN_WINDOW == 0) {
                __threadfence();
                __syncthreads();
                if (threadIdx.x == 0) { atomicAdd(wdone + m2rnn_window_idx(m.b, m.qh, c * CH, Nq, T), 1); }
            }
        }
    }
    if constexpr (PAIR) { // the partner has read this CTA's last slots: its shared memory may go
        if (m.L > 0) { cluster_wait(); }
    }
    if (dh0) { store_state<V>(dh0 + state_off, G, row0, t4); }
    // dW partial of this (sequence, row block): element (16s + g + 8*(e>>1), 8h + 2*t4 + (e&1))
    float *dst = dW_part + ((size_t)(m.b * RB + rb) * N + n) * V * V;
#pragma unroll
    for (int s = 0; s < NS; s++) {
#pragma unroll
        for (int h = 0; h < NT; h++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                dst[frag_offset<V>(16 * s + g, t4, h, e)] = dWa[s][h][e];
            }
        }
    }
}

// dq, dk (bf16, strided like q, k) from the fp32 accumulators; one thread per 2 channels
__global__ void m2rnn_qk_grad_cast_kernel(floatX *__restrict__ dq, floatX *__restrict__ dk,
                                          const float *__restrict__ dq_acc, const float *__restrict__ dk_acc,
                                          long ntok, int QK, long sq, long sk) {
    const long idx = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 2;
    if (idx >= ntok * QK) { return; }
    const long t = idx / QK;
    const int c = (int)(idx % QK);
    const float2 a = *(const float2 *)(dq_acc + idx), b = *(const float2 *)(dk_acc + idx);
    *(__nv_bfloat162 *)(dq + t * sq + c) = __floats2bfloat162_rn(a.x, a.y);
    *(__nv_bfloat162 *)(dk + t * sk + c) = __floats2bfloat162_rn(b.x, b.y);
}

// deterministic mode: dq, dk (bf16, strided like q, k) = the sums of the backward's partial slots over the Gq value
// heads that share each q/k head, SH heads a slot (the CTA's HPC, or 2 for pairs of one-head CTAs), added from +0 in
// rank order (one fixed order: the same bits every run). Launched
// programmatically after the backward, so it runs beside it on the room the backward leaves: each thread waits for
// its token's window to be counted done by all those CTAs, then sums. One thread per 4 channels of a token and q/k
// head; tokens are taken from the sequences' ends first (the backward finishes them first): without cu_seqlens, block
// order runs over (16-token group from the end, sequence), with cu_seqlens over the packed tokens from the last.
// The grid's last CTA then waits for the backward to complete, so that work after this kernel in the stream comes
// after the backward too (its dh0 and dW partials).
template <int PK>
__global__ void m2rnn_qk_partials_sum_kernel(floatX *__restrict__ dq, floatX *__restrict__ dk, const float *ckpt,
                                             const float *qkx, const int *wdone, const int *__restrict__ cu_seqlens,
                                             int B, int T, int N, int Nq, int K, int V, int HPC, int SH, long sq,
                                             long sk, long slots) {
    const int k4 = K / 4;
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < slots * Nq * k4) {
        const long o = idx / (Nq * k4); // token slot in block order
        const int rem = (int)(idx % (Nq * k4)), qh = rem / k4, r = (rem % k4) * 4;
        int b;
        long tok0, t;
        bool live = true;
        if (cu_seqlens) { // packed tokens from the last; the sequence holding tok: the last b with cu_seqlens[b] <= tok
            const long tok = slots - 1 - o;
            int lo = 0, hi = B - 1;
            while (lo < hi) {
                const int mid = (lo + hi + 1) >> 1;
                if (cu_seqlens[mid] <= tok) { lo = mid; } else { hi = mid - 1; }
            }
            b = lo;
            tok0 = cu_seqlens[b];
            t = tok - tok0;
        } else { // (16-token group from the end, sequence, token in the group)
            const long grp = o / 16, ngrp = CEIL_DIV(T, 16);
            b = (int)(grp % B);
            t = (ngrp - 1 - grp / B) * 16 + o % 16;
            tok0 = (long)b * T;
            live = t < T;
        }
        if (live) {
            const int Gq = N / Nq, ranks = Gq / SH; // the slots to add
            const int *cnt = wdone + m2rnn_window_idx(b, qh, t, Nq, T);
            while (ld_acquire_gpu(cnt) < Gq / HPC) { __nanosleep(500); } // every CTA of the q/k head counted it
            const size_t off = m2rnn_partial_off(m2rnn_ckpt_slot(b, tok0, (int)(t / M2RNN_CHUNK)),
                                                 (int)(t % M2RNN_CHUNK) >> 4, (int)(t & 15), qh * Gq, N, K, V, PK) + r;
            const float *pq = ckpt + off, *pk = (PK == 2 ? ckpt + K : qkx) + off;
            const size_t stride = (size_t)SH * K * V; // from one rank's slots to the next's
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), c = a;
            // (L2 loads: this SM's L1 may hold the checkpoints these slots replaced.) One head a slot with an even count
            // adds the heads in pairs first, as a slot of two heads holds them: the same bits at any heads per CTA
            const int step = SH == 1 && ranks % 2 == 0 ? 2 : 1;
#pragma unroll 4
            for (int i = 0; i < ranks; i += step) {
                float4 x = __ldcg((const float4 *)(pq + i * stride)), y = __ldcg((const float4 *)(pk + i * stride));
                if (step == 2) {
                    const float4 x1 = __ldcg((const float4 *)(pq + (i + 1) * stride));
                    const float4 y1 = __ldcg((const float4 *)(pk + (i + 1) * stride));
                    x.x += x1.x; x.y += x1.y; x.z += x1.z; x.w += x1.w;
                    y.x += y1.x; y.y += y1.y; y.z += y1.z; y.w += y1.w;
                }
                a.x += x.x; a.y += x.y; a.z += x.z; a.w += x.w;
                c.x += y.x; c.y += y.y; c.z += y.z; c.w += y.w;
            }
            const long tok = tok0 + t;
            __nv_bfloat162 oq[2] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w)};
            __nv_bfloat162 ok[2] = {__floats2bfloat162_rn(c.x, c.y), __floats2bfloat162_rn(c.z, c.w)};
            *(uint2 *)(dq + tok * sq + qh * K + r) = *(const uint2 *)oq;
            *(uint2 *)(dk + tok * sk + qh * K + r) = *(const uint2 *)ok;
        }
    }
    if (blockIdx.x == gridDim.x - 1) { pdl_wait(); }
}

// dW (N,V,V) fp32 = sum of the (B*K/16) partials, in a fixed order (deterministic)
__global__ void m2rnn_dw_reduce_kernel(float *__restrict__ dW, const float *__restrict__ dW_part, int nparts,
                                       int NVV) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= NVV) { return; }
    float sum = 0.0f;
    for (int p = 0; p < nparts; p++) { sum += dW_part[(size_t)p * NVV + idx]; }
    dW[idx] = sum;
}

// Single-token step for inference, batched over (b, n): the training forward's step, warp for warp. A CTA holds HPB
// heads of one sequence, K/16 warps a head, each warp 16 rows of its head's state in the accumulator layout: Z by
// compute_z (k v^T exact in fp32, then H W on the tensor core from bf16(H)), tanh.approx, the fp32 update
// f·H + (1−f)·Z, and y from the new state by the one-token forward path's MMA (q broadcast, H^T as B), summed over
// the head's row-block warps in the forward's order. So the step is the forward's one-token path (the last partial
// chunk's) bit for bit, not just in kind. (The scalar kernel it replaces, a thread per row with its 256 products from
// shared memory, ran at 56 µs a layer for 64 sequences of 84 heads on an H200: NOTES.md.)
// grid (ceil(N / HPB), B), block HPB·K/16 warps; the state row pairs move as float2.
// Epi: what becomes of y. epi.stage(smem, b, n0) runs on every thread once the dependencies are met (cp.async copies
// into the CTA's Epi::SMEM bytes, waited for before the y sum); epi.apply(smem, e, i, y, yb) then takes element e of
// the CTA's HPB·V (head n0 + e / V, column e % V), i its index in y, and stores it (M2RNNStepNoEpilogue: y = yb).
struct M2RNNStepNoEpilogue {
    static constexpr int SMEM = 16;
    __device__ __forceinline__ void stage(unsigned char *, int, int) const {}
    __device__ __forceinline__ void apply(const unsigned char *, int, size_t i, floatX *y, floatX yb) const { y[i] = yb; }
};
template <int V, int HPB, class Epi = M2RNNStepNoEpilogue>
__global__ void __launch_bounds__(512)
    m2rnn_step_kernel(floatX *__restrict__ y, float *__restrict__ state, const floatX *__restrict__ q,
                      const floatX *__restrict__ k, const floatX *__restrict__ v, const float *__restrict__ f,
                      const floatX *__restrict__ W, int N, int Nq, int K, long sq, long sk, long sv,
                      long state_stride, Epi epi) {
    using namespace m2rnn_detail;
    constexpr int NT = V / 8, NS = V / 16;
    __shared__ float ybuf[16][V]; // (warp, V) partial y over the warp's 16 rows (HPB·K/16 ≤ 16 warps)
    __shared__ __align__(16) unsigned char epi_smem[Epi::SMEM];
    const int RB = K / 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int hh = warp / RB, rb = warp % RB, row0 = rb * 16 + g, b = blockIdx.y;
    const int n = blockIdx.x * HPB + hh, qh = n / (N / Nq);
    const bool live = n < N; // the last CTA's spare head (N odd) only meets the barrier
    uint32_t bW[NS][NT][2];
    float S[NT][4];
    float *Hn = state + (size_t)b * state_stride + (size_t)(live ? n : 0) * K * V;
    // the weight and the state before the wait: no kernel of the step before this one writes them (the state is the
    // previous token's, written by this layer's step kernel then, or by a prefill's kernels, many launches back)
    if (live) {
        load_w_frags<V>(bW, W + (size_t)n * V * V, false, g, t4);
        load_state_pairs<V>(S, Hn, row0, t4);
    }
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    epi.stage(epi_smem, b, blockIdx.x * HPB);
    if (live) {
        uint32_t aS[NS][4];
        pack_frag<V>(aS, S);
        const floatX *kb = k + b * sk + (long)qh * K, *qb = q + b * sq + (long)qh * K, *vb = v + b * sv + (long)n * V;
        TokenIn<V, 1> in;
        in.k0 = bf2f(kb[row0]);
        in.k1 = bf2f(kb[row0 + 8]);
        in.fval = f[(size_t)b * N + n];
        in.gate = 1.0f - in.fval;
#pragma unroll
        for (int h = 0; h < NT; h++) {
            const uint32_t u = *(const uint32_t *)(vb + 8 * h + 2 * t4);
            in.vv[h][0] = bf_lo(u);
            in.vv[h][1] = bf_hi(u);
        }
        forward_step<V, 1>(S, aS, bW, in);
        store_state_pairs<V>(Hn, S, row0, t4);
        // y partial over this warp's rows, as the forward's one-token path: A = q broadcast over output rows 0..7
        uint32_t aq[4];
        aq[0] = *(const uint32_t *)(qb + rb * 16 + 2 * t4);
        aq[2] = *(const uint32_t *)(qb + rb * 16 + 2 * t4 + 8);
        aq[1] = aq[3] = 0u;
#pragma unroll
        for (int h = 0; h < NT; h++) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma16816(acc, aq, trans8x8(aS[h >> 1][2 * (h & 1)]), trans8x8(aS[h >> 1][2 * (h & 1) + 1]));
            if (g == 0) { *(float2 *)&ybuf[warp][8 * h + 2 * t4] = make_float2(acc[0], acc[1]); }
        }
    }
    tiles::cp_async_wait<0>(); // (the epilogue's staged copies, if any)
    __syncthreads();
    // y = sum over the head's row-block warps in order (the forward's order); a thread per (head, column)
    if (threadIdx.x < HPB * V) {
        const int h2 = threadIdx.x / V, col = threadIdx.x % V, nn = blockIdx.x * HPB + h2;
        if (nn < N) {
            float sum = ybuf[h2 * RB][col];
            for (int r = 1; r < RB; r++) { sum += ybuf[h2 * RB + r][col]; }
            epi.apply(epi_smem, threadIdx.x, ((size_t)b * N + nn) * V + col, y, __float2bfloat16(sum));
        }
    }
    trace_end();
}

// ----------------------------------------------------------------------------------------------------------------
// kernel launchers

static inline size_t m2rnn_forward_smem(const M2RNNDims *d, int hpc) {
    const size_t stage = m2rnn_detail::m2rnn_stage_bytes(d->K, d->V, hpc, false);
    return 2 * stage + (size_t)M2RNN_CHUNK * hpc * (d->K / 16) * d->V * sizeof(float);
}
// V=16 with K <= 128 runs the Z stash ([the next checkpoint: 8-token sub-chunks] [a 16-token stage] [Z, E: (NW, sub,
// 32) uint4 each] [df slots (sub, NW, 8)]), the rest the plain build ([a 32-token stage] [history (9, NW, V/16, 32)
// uint4] [dq, dk, dv, df slots])
static inline size_t m2rnn_backward_smem(const M2RNNDims *d, int hpc, int sub) {
    const int NW = hpc * (d->K / 16), NS = d->V / 16;
    if (m2rnn_uses_zstash(d)) {
        const size_t ckb = sub == 8 ? (size_t)NW * 32 * (d->V / 2) * sizeof(float) : 0;
        return ckb + m2rnn_detail::m2rnn_stage_bytes(d->K, d->V, hpc, true, 16) + 2 * (size_t)sub * NW * 32 * 16 +
               (size_t)sub * NW * 8 * sizeof(float);
    }
    const size_t hist = (size_t)(M2RNN_SUB + 1) * NW * NS * 32 * 16;
    const size_t red = (size_t)M2RNN_SUB * NW * (16 + 16 + d->V + (d->V == 16 ? 8 : 1)) * sizeof(float);
    return m2rnn_detail::m2rnn_stage_bytes(d->K, d->V, hpc, true) + hist + red;
}
// The Z stash's sub-chunk length: 16 tokens (one a checkpoint: every token recomputed once) at one head a CTA with
// K <= 64 (its 64 KB stash leaves 3 CTAs an SM) unless at K=64 the cost model prefers 8 (4 CTAs an SM: B=4, N=132 on
// 132 SMs fills one round of 4 where 16 needs a second round of 1), else 8
static inline int m2rnn_backward_sub(const M2RNNDims *d, int hpc) {
    const bool sixteen_ok = hpc == 1 && m2rnn_uses_zstash(d) && d->K <= 64;
    if (m2rnn_sub_override == 8 || m2rnn_sub_override == 16) { return sixteen_ok ? m2rnn_sub_override : 8; }
    if (!sixteen_ok) { return 8; }
    return d->K != 64 ? 16 : m2rnn_sub_k64v16(d, device_num_sms());
}

template <int V, int HPC, bool BIG>
static void m2rnn_forward_launch(floatX *y, float *hT, float *ckpt, const floatX *q, const floatX *k, const floatX *v,
                                 const float *f, const floatX *W, const float *h0, const M2RNNDims *d,
                                 cudaStream_t stream) {
    const size_t smem = m2rnn_forward_smem(d, HPC);
    auto kernel = m2rnn_forward_kernel<V, HPC, BIG>;
    kernel_smem_limit(kernel, smem);
    dim3 grid(d->N / HPC, d->B);
    kernel<<<grid, HPC * (d->K / 16) * 32, smem, stream>>>(y, hT, ckpt, q, k, v, f, W, h0, d->cu_seqlens, d->T,
                                                           d->N, d->Nq, d->K, d->sq, d->sk, d->sv);
    cudaCheck(cudaGetLastError());
}

// CTAs of this kernel one SM holds at this block size and shared memory (sets the kernel's shared-memory limit first,
// as its launch needs)
template <typename Kernel> static inline int m2rnn_ctas_per_sm(Kernel kernel, int threads, size_t smem) {
    kernel_smem_limit(kernel, smem);
    int n = 0;
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
    return n;
}

// The backward's build is the layer shape's (m2rnn_backward_kernel): the Z stash for V=16 with K <= 128 (16-token
// sub-chunks at one head a CTA and K <= 64, else 8), plain otherwise.
template <int V, int HPC, bool BIG>
static void m2rnn_backward_launch(float *dq_acc, float *dk_acc, float *qkx, int *wdone, bool det, floatX *dv,
                                  float *df, float *dW_part, float *dh0, const floatX *dy, const float *dhT,
                                  float *ckpt, const floatX *q, const floatX *k, const floatX *v, const float *f,
                                  const floatX *W, float clip, const M2RNNDims *d, cudaStream_t stream) {
    const int threads = HPC * (d->K / 16) * 32;
    const dim3 grid(d->N / HPC, d->B);
    auto launch = [&](auto kernel, size_t smem, bool pairs) { // pairs: clusters of two CTAs (the kernel's PAIR)
        kernel_smem_limit(kernel, smem);
        launch_k_cluster(kernel, grid, threads, smem, stream, dim3(pairs ? 2 : 1, 1, 1), dq_acc, dk_acc, qkx, wdone, dv,
                         df, dW_part, dh0, dy, dhT, ckpt, q, k, v, f, W, d->cu_seqlens, d->T, d->N, d->Nq, d->K, d->sq,
                         d->sk, d->sv, clip);
    };
    if constexpr (V == 16 && !BIG) {
        if constexpr (HPC == 1) {
            const bool sixteen = m2rnn_backward_sub(d, 1) == 16, pairs = det && m2rnn_det_pairs(d, 1);
            const size_t smem = m2rnn_backward_smem(d, 1, sixteen ? 16 : 8);
            if (sixteen) {
                launch(!det ? m2rnn_backward_kernel<V, 1, false, true, false, 16>
                       : pairs ? m2rnn_backward_kernel<V, 1, false, true, true, 16, true>
                               : m2rnn_backward_kernel<V, 1, false, true, true, 16>,
                       smem, pairs);
            } else {
                launch(!det ? m2rnn_backward_kernel<V, 1, false, true, false, 8>
                       : pairs ? m2rnn_backward_kernel<V, 1, false, true, true, 8, true>
                               : m2rnn_backward_kernel<V, 1, false, true, true, 8>,
                       smem, pairs);
            }
        } else {
            launch(det ? m2rnn_backward_kernel<V, HPC, false, true, true, 8> : m2rnn_backward_kernel<V, HPC, false, true>,
                   m2rnn_backward_smem(d, HPC, 8), false);
        }
    } else {
        launch(det ? m2rnn_backward_kernel<V, HPC, BIG, false, true> : m2rnn_backward_kernel<V, HPC, BIG, false>,
               m2rnn_backward_smem(d, HPC, 8), false);
    }
}

// dispatch on (V, heads per CTA hpc, block size); LAUNCH is a launcher template taking <V, HPC, BIG>
#define M2RNN_DISPATCH(d, hpc, LAUNCH, ...)                                                                            \
    do {                                                                                                               \
        const int hpc_ = (hpc);                                                                                        \
        const bool big_ = hpc_ * ((d)->K / 16) > 8;                                                                    \
        if ((d)->V == 16) {                                                                                            \
            if (hpc_ == 2) { LAUNCH<16, 2, false>(__VA_ARGS__); }                                                      \
            else if (!big_) { LAUNCH<16, 1, false>(__VA_ARGS__); }                                                     \
            else { LAUNCH<16, 1, true>(__VA_ARGS__); }                                                                 \
        } else {                                                                                                       \
            if (hpc_ == 2) { LAUNCH<32, 2, false>(__VA_ARGS__); }                                                      \
            else if (!big_) { LAUNCH<32, 1, false>(__VA_ARGS__); }                                                     \
            else { LAUNCH<32, 1, true>(__VA_ARGS__); }                                                                 \
        }                                                                                                              \
    } while (0)

// Forward. y (tok,N,V) bf16; hT (B,N,K,V) fp32 or NULL; workspace: NULL for inference, else m2rnn_workspace_bytes()
// of device memory that the training forward fills with checkpoints and the backward then reads.
// A deterministic backward spends its workspace's checkpoints (its partial slots overwrite them): the workspaces so
// spent and not written again by a training forward since, so that a second backward fails with a hint instead of
// recomputing from its own partial sums.
static const void *m2rnn_spent[256];
static int m2rnn_nspent = 0;
static int m2rnn_spent_find(const void *ws) {
    for (int i = 0; i < m2rnn_nspent; i++) {
        if (m2rnn_spent[i] == ws) { return i; }
    }
    return -1;
}
static void m2rnn_forward(floatX *y, float *hT, void *workspace, const floatX *q, const floatX *k, const floatX *v,
                          const float *f, const floatX *W, const float *h0, const M2RNNDims *d, cudaStream_t stream) {
    m2rnn_validate(d, q, k, v);
    const int spent = workspace ? m2rnn_spent_find(workspace) : -1;
    if (spent >= 0) { m2rnn_spent[spent] = m2rnn_spent[--m2rnn_nspent]; } // (fresh checkpoints)
    float *ckpt = workspace ? (float *)((char *)workspace + m2rnn_workspace_layout(d).ckpt) : NULL;
    M2RNN_DISPATCH(d, m2rnn_heads_per_cta(d), m2rnn_forward_launch, y, hT, ckpt, q, k, v, f, W, h0, d, stream);
}

// Backward. Gradients out: dq, dk, dv (bf16, strided like q, k, v), df (tok,N) fp32, dW (N,V,V) fp32 (overwritten),
// dh0 (B,N,K,V) fp32 or NULL. In: dy (tok,N,V) bf16, dhT (B,N,K,V) fp32 or NULL, the forward's inputs and the
// workspace the training forward filled. clip > 0 clamps the carried dH to [-clip, clip] every step (0 = off).
// In deterministic mode (M2RNN_DETERMINISTIC=1) the backward spends the checkpoints (its dq/dk partial slots overwrite
// them): one backward per training forward.
static void m2rnn_backward(floatX *dq, floatX *dk, floatX *dv, float *df, float *dW, float *dh0, void *workspace,
                           const floatX *dy, const float *dhT, const floatX *q, const floatX *k, const floatX *v,
                           const float *f, const floatX *W, float clip, const M2RNNDims *d, cudaStream_t stream) {
    m2rnn_validate(d, q, k, v);
    if (((uintptr_t)dq | (uintptr_t)dk | (uintptr_t)dv) % 16 != 0) {
        fail_with_hint("allocate the gradient buffer with cudaMalloc and keep channel offsets multiples of 8",
                       "m2rnn: dq, dk, dv must be 16-byte aligned");
    }
    const bool det = m2rnn_deterministic_on();
    if (det) {
        if (m2rnn_spent_find(workspace) >= 0) {
            fail_with_hint("run the training forward (m2rnn_forward with this workspace) before each deterministic "
                           "backward", "m2rnn_backward: a deterministic backward already spent this workspace's "
                           "checkpoints");
        }
        if (m2rnn_nspent < (int)(sizeof(m2rnn_spent) / sizeof(m2rnn_spent[0]))) { // (beyond 256 layers: unchecked)
            m2rnn_spent[m2rnn_nspent++] = workspace;
        }
    }
    const M2RNNWorkspace w = m2rnn_workspace_layout(d, det);
    char *ws = (char *)workspace;
    float *dq_acc = (float *)(ws + w.dq), *dk_acc = (float *)(ws + w.dk), *dW_part = (float *)(ws + w.dw);
    float *ckpt = (float *)(ws + w.ckpt), *qkx = (float *)(ws + w.qkx);
    int *wdone = (int *)(ws + w.cnt);
    const long ntok = m2rnn_total_tokens(d);
    if (det) {
        cudaCheck(cudaMemsetAsync(wdone, 0, w.dw - w.cnt, stream));
    } else {
        cudaCheck(cudaMemsetAsync(dq_acc, 0, w.qkx - w.dq, stream)); // the dq, dk accumulators: adjacent
    }
    const int hpc = m2rnn_heads_per_cta(d, det);
    M2RNN_DISPATCH(d, hpc, m2rnn_backward_launch, dq_acc, dk_acc, qkx, wdone, det, dv, df, dW_part, dh0, dy, dhT, ckpt,
                   q, k, v, f, W, clip, d, stream);
    const int QK = d->Nq * d->K, block = 256;
    const long pairs = ntok * QK / 2;
    if (pairs > 0 && det) { // beside the backward (programmatic launch; see the kernel)
        const long slots = d->cu_seqlens ? ntok : (long)d->B * CEIL_DIV(d->T, 16) * 16; // token slots, block order
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)CEIL_DIV(slots * d->Nq * (d->K / 4), (long)block));
        cfg.blockDim = dim3(block);
        cfg.stream = stream;
        cudaLaunchAttribute attr[2];
        cfg.attrs = attr;
        cfg.numAttrs = launch_attrs(attr, 1, dim3(1, 1, 1));
        const int sh = m2rnn_slot_heads(d, hpc);
        auto sum = m2rnn_partial_rows(sh, d->V) == 2 ? m2rnn_qk_partials_sum_kernel<2> : m2rnn_qk_partials_sum_kernel<1>;
        cudaCheck(cudaLaunchKernelEx(&cfg, sum, dq, dk, (const float *)ckpt, (const float *)qkx, (const int *)wdone,
                                     d->cu_seqlens, d->B, d->T, d->N, d->Nq, d->K, d->V, hpc, sh, d->sq, d->sk, slots));
    } else if (pairs > 0) {
        m2rnn_qk_grad_cast_kernel<<<(unsigned)CEIL_DIV(pairs, (long)block), block, 0, stream>>>(
            dq, dk, dq_acc, dk_acc, ntok, QK, d->sq, d->sk);
        cudaCheck(cudaGetLastError());
    }
    const int NVV = d->N * d->V * d->V;
    m2rnn_dw_reduce_kernel<<<CEIL_DIV(NVV, block), block, 0, stream>>>(dW, dW_part, d->B * (d->K / 16), NVV);
    cudaCheck(cudaGetLastError());
}

// One token for B sequences: state (B,N,K,V) fp32 updated in place, sequence b's (N,K,V) block state_stride floats
// (even) after sequence b−1's (N·K·V when they are packed); y (B,N,V) bf16; q, k (B,Nq,K) and v (B,N,V) with per-sequence
// strides sq, sk, sv (d->T and d->cu_seqlens are ignored); f (B,N) fp32.
// heads a step CTA holds: two where a CTA of K/16 warps a head stays within 8 warps (K ≤ 64), else one
static inline int m2rnn_step_heads_per_cta(int K) { return 2 * (K / 16) <= 8 ? 2 : 1; }
// With epi: its stage and apply instead of the plain store of y (m2rnn_step_kernel).
template <class Epi = M2RNNStepNoEpilogue>
static void m2rnn_step(floatX *y, float *state, long state_stride, const floatX *q, const floatX *k, const floatX *v,
                       const float *f, const floatX *W, const M2RNNDims *d, cudaStream_t stream,
                       const Epi &epi = Epi()) {
    const char *why = m2rnn_check_dims(d);
    if (why != NULL) {
        fail_with_hint("the fast path is K=64, V=16; see the limits in m2rnn_kernels.cuh",
                       "m2rnn_step: unsupported shape N=%d Nq=%d K=%d V=%d: %s", d->N, d->Nq, d->K, d->V, why);
    }
    if (state_stride % 2 != 0 || (uintptr_t)state % 8 != 0) {
        fail_with_hint("keep each sequence's state 8-byte aligned (an even state_stride)",
                       "m2rnn_step: state %p with stride %ld floats", (void *)state, state_stride);
    }
    const int RB = d->K / 16, hpb = m2rnn_step_heads_per_cta(d->K);
    const dim3 grid(CEIL_DIV(d->N, hpb), d->B);
    const int block = hpb * RB * WARP_SIZE;
#define M2RNN_STEP_LAUNCH(VV, HH)                                                                                      \
    launch_k(m2rnn_step_kernel<VV, HH, Epi>, grid, block, 0, stream, y, state, q, k, v, f, W, d->N, d->Nq, d->K,     \
             d->sq, d->sk, d->sv, state_stride, epi)
    if (d->V == 16) {
        if (hpb == 2) { M2RNN_STEP_LAUNCH(16, 2); } else { M2RNN_STEP_LAUNCH(16, 1); }
    } else {
        if (hpb == 2) { M2RNN_STEP_LAUNCH(32, 2); } else { M2RNN_STEP_LAUNCH(32, 1); }
    }
#undef M2RNN_STEP_LAUNCH
}

#endif // M2RNN_KERNELS_CUH
