/*
attention.cuh: causal softmax attention (the A row of layers.h) on the GPU, mirroring ref/attention.h (same names):
the mixer is the qkv projection → RoPE → attention_core → the output projection, behind the KindOps interface of
common.cuh, plus the single-token decode step against a KV cache. GQA: query head h reads kv head h / (NH / NKV).

bf16 build (the trainer): the core is cuDNN's fused flash attention where attention_cudnn.cuh takes the shape (cuDNN
loaded at run time; M2RNN_ATTENTION=ours opts out), else the flash kernels of attention_kernels.cuh; both read q, k, v
in place as the column blocks of the projection's (B,T,(NH+2·NKV)·HS) rows and write the (B,T,NH·HS) output the
projection reads: no permute, no T×T matrix; the backward keeps the projection (after RoPE), the output and the
log-sum-exp. RoPE
rotates q and k in place (and un-rotates dq, dk in place: a rotation's adjoint is its inverse). The decode step is
one launch after its projection (flash_attention_decode_step): RoPE of the token's q and k, its k and v appended to
the cache, the split-context attention and the slices' merge. Head dims 32, 64 or 128.

fp32 build (make PRECISION=FP32, the verification build held to the CPU reference at 1e-4): the same function by
cuBLASLt and a materialized (B,NH,T,T) softmax, any head dim; k and v are expanded to the query heads for GQA and
their gradients summed back over each group in a fixed order.

RoPE: the "rotate half" pairs (i, i+HS/2), angle t·θ^(−2i/HS) and its cos, sin in double as ref/attention.h (a
(T, HS/2) table per call; the pairs then move in 16-byte packs: a pass at memory speed).
*/
#ifndef M2RNN_ATTENTION_CUH
#define M2RNN_ATTENTION_CUH

#include "common.cuh"
#if !FLOATX_IS_FP32
#include "attention_kernels.cuh"
#include "attention_cudnn.cuh"
#endif

// ----------------------------------------------------------------------------------------------------------------
// RoPE and the cache append (both builds)

// the (cos, sin) table of positions 0..T−1, (T, HS/2) float2, in double precision as ref/attention.h computes it
__global__ void rope_table_kernel(float2 *tab, int T, int HS, float theta) {
    const int half = HS / 2;
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)T * half) { return; }
    tab[i] = rope_cos_sin((int)(i / half), (int)(i % half), HS, theta);
}

// Rotates (inverse = 1: un-rotates) the q and k heads of `rows` token rows of W = (NH+2·NKV)·HS elements in place:
// the NH q heads then the NKV k heads, contiguous at the row's start. Row r is at position r % T, its angles read
// from tab; or, decoding (tab NULL, angles computed), at pos[r / T] + r % T: sequence r / T's T new tokens. A block
// row (threadIdx.y) takes one token row, its threads the row's (head, chunk) pairs; a thread takes PACK pairs
// (16-byte loads) where HS/2 is a multiple of PACK, else one. TABLE: the angles from tab (training); else computed in
// double (decoding), and with a cache (not NULL) the rotated k and the v of each row also stored there as
// attention_append_kernel does (one launch instead of two, the same bits).
template <bool TABLE>
__global__ void attention_rope_kernel(floatX *qkv, int rows, int T, const float2 *tab, const int *pos, int NH, int NKV,
                                      int HS, float theta, int inverse, floatX *cache = NULL, long seq_stride = 0,
                                      int context = 0) {
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    const int half = HS / 2, heads = NH + NKV, per = half % PACK == 0 ? PACK : 1, chunks = half / per;
    const int r = blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= rows) { return; }
    const int t = pos != NULL ? pos[r / T] + r % T : r % T;
    floatX *row = qkv + (long)r * (NH + 2 * NKV) * HS;
    const int kv = NKV * HS;
    floatX *kc = cache != NULL ? cache + (long)(r / T) * seq_stride + (long)t * kv : NULL; // this row's cache slot
    // (16-byte pieces where the slot and the row allow them: the append is one round trip, not one a 2-byte element)
    const bool kc16 = kc != NULL && per == PACK && ((uintptr_t)kc | (uintptr_t)(kc + (long)context * kv)) % 16 == 0;
    if (kc != NULL) { // the values as they are
        const floatX *vr = row + NH * HS + kv;
        floatX *vc = kc + (long)context * kv;
        if (kc16 && kv % PACK == 0 && (uintptr_t)vr % 16 == 0) {
            for (int e = threadIdx.x * PACK; e < kv; e += blockDim.x * PACK) {
                *(Pack *)(vc + e) = *(const Pack *)(vr + e);
            }
        } else {
            for (int e = threadIdx.x; e < kv; e += blockDim.x) { vc[e] = vr[e]; }
        }
    }
    const float2 *angles = TABLE ? tab + (long)t * half : NULL;
    for (int e = threadIdx.x; e < heads * chunks; e += blockDim.x) {
        const int h = e / chunks, c = e - h * chunks;
        floatX *x = row + h * HS + c * per;
        Pack lo, hi;
        if (per == PACK) {
            lo = *(const Pack *)x;
            hi = *(const Pack *)(x + half);
        } else {
            lo.v[0] = x[0];
            hi.v[0] = x[half];
        }
        for (int k = 0; k < per; k++) {
            const int j = c * per + k;
            float2 cs;
            if constexpr (TABLE) {
                cs = angles[j];
            } else {
                cs = rope_cos_sin(t, j, HS, theta);
            }
            float o1, o2;
            rope_rotate(&o1, &o2, to_float(lo.v[k]), to_float(hi.v[k]), cs.x, inverse ? -cs.y : cs.y);
            lo.v[k] = (floatX)o1;
            hi.v[k] = (floatX)o2;
        }
        if (per == PACK) {
            *(Pack *)x = lo;
            *(Pack *)(x + half) = hi;
        } else {
            x[0] = lo.v[0];
            x[half] = hi.v[0];
        }
        if (kc != NULL && h >= NH) { // a rotated key: into the cache too
            floatX *y = kc + (h - NH) * HS + c * per;
            if (kc16) {
                *(Pack *)y = lo;
                *(Pack *)(y + half) = hi;
            } else {
                for (int k = 0; k < per; k++) {
                    y[k] = lo.v[k];
                    y[half + k] = hi.v[k];
                }
            }
        }
    }
}

// the rotation kernel's shape for `rows` token rows: a row's (head, chunk) pairs across threadIdx.x (a multiple of 32,
// at most 256), 256 threads a block
static void attention_rope_shape(dim3 *grid, dim3 *block, long rows, const ModelConfig *c) {
    const int half = c->attn.head_dim / 2, per = half % PACK == 0 ? PACK : 1;
    const int pairs = (c->attn.heads + c->attn.kv_heads) * (half / per);
    const int bx = pairs >= 256 ? 256 : CEIL_DIV(pairs, WARP_SIZE) * WARP_SIZE, by = 256 / bx;
    *grid = dim3((unsigned)CEIL_DIV(rows, (long)by));
    *block = dim3(bx, by);
}

// rows of qkv rotated at positions r % T (tab: a (T, HS/2) float2 scratch the table is written to)
static void attention_rope(floatX *qkv, long rows, int T, float2 *tab, const ModelConfig *c, int inverse,
                           cudaStream_t stream) {
    const int HS = c->attn.head_dim;
    rope_table_kernel<<<(unsigned)CEIL_DIV((long)T * (HS / 2), 256L), 256, 0, stream>>>(tab, T, HS, c->attn.rope_theta);
    cudaCheck(cudaGetLastError());
    dim3 grid, block;
    attention_rope_shape(&grid, &block, rows, c);
    attention_rope_kernel<true><<<grid, block, 0, stream>>>(qkv, (int)rows, T, tab, NULL, c->attn.heads,
                                                            c->attn.kv_heads, HS, c->attn.rope_theta, inverse);
    cudaCheck(cudaGetLastError());
}

// decoding: the new tokens (qkv (B·T, W) rows, already rotated; T a sequence) appended to each sequence's cache at
// positions pos[b] .. pos[b] + T − 1: keys (context, NKV·HS) then values at b·seq_stride elements
__global__ void attention_append_kernel(floatX *cache, long seq_stride, const floatX *qkv, const int *pos, int B, int T,
                                        int NH, int NKV, int HS, int context) {
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    const int kv = NKV * HS;
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)B * T * kv) { return; }
    const long r = i / kv;
    const int e = (int)(i % kv), b = (int)(r / T), t = (int)(r % T);
    const floatX *row = qkv + r * (NH * HS + 2 * kv) + NH * HS;
    floatX *kc = cache + (long)b * seq_stride + (long)(pos[b] + t) * kv;
    kc[e] = row[e];
    kc[(long)context * kv + e] = row[kv + e];
}

static void attention_append(floatX *cache, long seq_stride, const floatX *qkv, const int *pos, int B, int T,
                             const ModelConfig *c, int context, cudaStream_t stream) {
    const long n = (long)B * T * c->attn.kv_heads * c->attn.head_dim;
    launch_k(attention_append_kernel, (unsigned)CEIL_DIV(n, 256L), 256, 0, stream, cache, seq_stride, qkv, pos, B, T,
             c->attn.heads, c->attn.kv_heads, c->attn.head_dim, context);
}

// decoding: B sequences' T new token rows of qkv rotated at their positions (with RoPE) and appended to the caches,
// in one launch (the rotation's kernel stores the keys and values too) or, without RoPE, the append alone
static void attention_rope_append(floatX *qkv, floatX *cache, long seq_stride, const int *pos, int B, int T,
                                  const ModelConfig *c, int context, cudaStream_t stream) {
    if (!c->attn.rope) {
        attention_append(cache, seq_stride, qkv, pos, B, T, c, context, stream);
        return;
    }
    const long rows = (long)B * T;
    dim3 grid, block;
    attention_rope_shape(&grid, &block, rows, c);
    launch_k(attention_rope_kernel<false>, grid, block, 0, stream, qkv, (int)rows, T, (const float2 *)NULL, pos,
             c->attn.heads, c->attn.kv_heads, c->attn.head_dim, c->attn.rope_theta, 0, cache, seq_stride, context);
}

#if !FLOATX_IS_FP32
// ----------------------------------------------------------------------------------------------------------------
// the core, bf16: flash attention over the projection's rows

static AttnDims attention_dims(const ModelConfig *c, int B, int T) {
    AttnDims d;
    memset(&d, 0, sizeof(d));
    const int NH = c->attn.heads, NKV = c->attn.kv_heads, HS = c->attn.head_dim;
    const long W = (long)(NH + 2 * NKV) * HS, inner = (long)NH * HS;
    d.B = B; d.Lq = d.Lk = T; d.NH = NH; d.NKV = NKV; d.HS = HS; d.causal = 1;
    d.scale = 1.0f / sqrtf((float)HS);
    d.q_row = d.k_row = d.v_row = W; d.o_row = inner;
    d.q_seq = d.k_seq = d.v_seq = (long)T * W; d.o_seq = (long)T * inner;
    return d;
}

// refuses, at model setup, what the flash kernels cannot run
static void attention_gpu_check(const ModelConfig *c) {
    const int HS = c->attn.head_dim;
    if (HS != 32 && HS != 64 && HS != 128) {
        fail_with_hint("use an attention head dim of 32, 64 or 128 (heads h = d_model / head dim), or the fp32 build "
                       "(make PRECISION=FP32) or the CPU trainer for other sizes",
                       "attention head dim %d: the GPU's flash kernels take 32, 64 or 128", HS);
    }
}

typedef struct {
    floatX *qkv;    // (B,T,(NH+2·NKV)·HS) the projection, q and k after RoPE
    floatX *attn_y; // (B,T,NH·HS) the attention output, before the output projection
    float *lse;     // B·T·NH log-sum-exp of each query's scores: (B·T, NH) from our kernels, (B, NH, T) from cuDNN's
} AttnActs;

static size_t attention_acts_layout(AttnActs *a, void *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, NH = c->attn.heads, HS = c->attn.head_dim, W = (NH + 2 * c->attn.kv_heads) * HS;
    DeviceArena ar = {(char *)base, 0};
    a->qkv = TAKE_X(&ar, BT * W);
    a->attn_y = TAKE_X(&ar, BT * NH * HS);
    a->lse = TAKE_F(&ar, BT * NH);
    return ar.used;
}

typedef struct {
    floatX *d_attn_y; // (B,T,NH·HS)
    floatX *d_qkv;    // (B,T,(NH+2·NKV)·HS)
    float *D;         // B·T·NH Σ dO·O (layout as the lse's)
    float2 *rope_tab; // (T, HS/2) RoPE's (cos, sin)
} AttnScratch;

static size_t attention_scratch_layout(AttnScratch *s, void *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, NH = c->attn.heads, HS = c->attn.head_dim, W = (NH + 2 * c->attn.kv_heads) * HS;
    DeviceArena ar = {(char *)base, 0};
    s->d_attn_y = TAKE_X(&ar, BT * NH * HS);
    s->d_qkv = TAKE_X(&ar, BT * W);
    s->D = TAKE_F(&ar, BT * NH);
    s->rope_tab = (float2 *)TAKE_F(&ar, (size_t)T * HS);
    return ar.used;
}

// attn_y (B,T,NH·HS) = attention of the rotated qkv; lse saved. cuDNN's fused kernels where attention_cudnn.cuh
// takes the shape (the forward and the backward together), else ours.
static void attention_core_forward(AttnActs *a, const ModelConfig *c, int B, int T, const Runtime *rt) {
    const AttnDims d = attention_dims(c, B, T);
    const long inner = (long)c->attn.heads * c->attn.head_dim, kv = (long)c->attn.kv_heads * c->attn.head_dim;
    if (cudnn_attention_takes(&d)) {
        cudnn_attention_forward(a->attn_y, a->lse, a->qkv, a->qkv + inner, a->qkv + inner + kv, &d, rt->stream);
    } else {
        flash_attention_forward(a->attn_y, a->lse, a->qkv, a->qkv + inner, a->qkv + inner + kv, &d, rt->stream);
    }
}

// s->d_qkv (all of it written) from s->d_attn_y
static void attention_core_backward(AttnScratch *s, const AttnActs *a, const ModelConfig *c, int B, int T,
                                    const Runtime *rt) {
    const AttnDims d = attention_dims(c, B, T);
    const long inner = (long)c->attn.heads * c->attn.head_dim, kv = (long)c->attn.kv_heads * c->attn.head_dim;
    if (cudnn_attention_takes(&d)) {
        cudnn_attention_backward(s->d_qkv, s->d_qkv + inner, s->d_qkv + inner + kv, s->D, s->d_attn_y, a->qkv,
                                 a->qkv + inner, a->qkv + inner + kv, a->attn_y, a->lse, &d, rt->stream);
    } else {
        flash_attention_backward(s->d_qkv, s->d_qkv + inner, s->d_qkv + inner + kv, s->D, s->d_attn_y, a->qkv,
                                 a->qkv + inner, a->qkv + inner + kv, a->attn_y, a->lse, (long)B * T, &d,
                                 rt->stream);
    }
}

#else
// ----------------------------------------------------------------------------------------------------------------
// the core, fp32 build: cuBLASLt over (B,NH,T,HS) copies and a materialized softmax

static void attention_gpu_check(const ModelConfig *c) {}

// the rotated qkv (B,T,W) → q, k, v (B,NH,T,HS), k and v repeated over each kv head's G query heads
__global__ void attention_expand_kernel(floatX *q, floatX *k, floatX *v, const floatX *qkv, int B, int T, int NH,
                                        int NKV, int HS) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x; // over (B, NH, T, HS)
    if (i >= (long)B * NH * T * HS) { return; }
    const int e = (int)(i % HS), t = (int)((i / HS) % T), h = (int)((i / ((long)HS * T)) % NH);
    const int b = (int)(i / ((long)HS * T * NH)), kvh = h / (NH / NKV);
    const long inner = (long)NH * HS, kv = (long)NKV * HS;
    const floatX *row = qkv + ((long)b * T + t) * (inner + 2 * kv);
    q[i] = row[(long)h * HS + e];
    k[i] = row[inner + (long)kvh * HS + e];
    v[i] = row[inner + kv + (long)kvh * HS + e];
}

// dq, dk, dv (B,NH,T,HS) → dqkv (B,T,W): dq copied, dk and dv summed over each group's heads in order
__global__ void attention_gather_kernel(floatX *dqkv, const floatX *dq, const floatX *dk, const floatX *dv, int B,
                                        int T, int NH, int NKV, int HS) {
    const long inner = (long)NH * HS, kv = (long)NKV * HS, W = inner + 2 * kv;
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x; // over (B, T, W)
    if (i >= (long)B * T * W) { return; }
    const long bt = i / W, col = i % W;
    const int b = (int)(bt / T), t = (int)(bt % T), G = NH / NKV;
    float sum = 0.0f;
    if (col < inner) {
        const int h = (int)(col / HS), e = (int)(col % HS);
        sum = to_float(dq[(((long)b * NH + h) * T + t) * HS + e]);
    } else {
        const int part = col < inner + kv ? 0 : 1;
        const long cc = col - inner - part * kv;
        const int kvh = (int)(cc / HS), e = (int)(cc % HS);
        const floatX *src = part == 0 ? dk : dv;
        for (int g = 0; g < G; g++) { sum += to_float(src[(((long)b * NH + kvh * G + g) * T + t) * HS + e]); }
    }
    dqkv[i] = (floatX)sum;
}

// (B,NH,T,HS) → (B,T,NH·HS), or back with inverse = 1
__global__ void attention_unpermute_kernel(floatX *out, floatX *y, int B, int T, int NH, int HS, int inverse) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)B * NH * T * HS) { return; }
    const int d = (int)(i % HS), t = (int)((i / HS) % T), h = (int)((i / ((long)HS * T)) % NH);
    const int b = (int)(i / ((long)HS * T * NH));
    const long o = ((long)b * T + t) * NH * HS + (long)h * HS + d;
    if (!inverse) { out[o] = y[i]; } else { y[i] = out[o]; }
}

// att (rows of T) = softmax(scale · preatt) over the causal past; one warp per row
__global__ void causal_softmax_kernel(floatX *att, const floatX *preatt, int rows, int T, float scale) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (row >= rows) { return; }
    const int t = row % T;
    const floatX *x = preatt + (long)row * T;
    floatX *y = att + (long)row * T;
    float maxv = -INFINITY;
    for (int u = lane; u <= t; u += WARP_SIZE) { maxv = fmaxf(maxv, scale * to_float(x[u])); }
    maxv = warp_reduce_max(maxv);
    float sum = 0.0f;
    for (int u = lane; u <= t; u += WARP_SIZE) { sum += expf(scale * to_float(x[u]) - maxv); }
    sum = warp_reduce_sum(sum);
    const float inv = 1.0f / sum;
    for (int u = lane; u < T; u += WARP_SIZE) { y[u] = (floatX)(u <= t ? expf(scale * to_float(x[u]) - maxv) * inv : 0.0f); }
}

// dpreatt = scale · att ⊙ (datt − Σ att ⊙ datt), written over datt; one warp per row
__global__ void causal_softmax_backward_kernel(floatX *datt_to_dpreatt, const floatX *att, int rows, int T, float scale) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (row >= rows) { return; }
    const int t = row % T;
    floatX *d = datt_to_dpreatt + (long)row * T;
    const floatX *p = att + (long)row * T;
    float dot = 0.0f;
    for (int u = lane; u <= t; u += WARP_SIZE) { dot += to_float(p[u]) * to_float(d[u]); }
    dot = warp_reduce_sum(dot);
    for (int u = lane; u < T; u += WARP_SIZE) {
        d[u] = (floatX)(u <= t ? scale * to_float(p[u]) * (to_float(d[u]) - dot) : 0.0f);
    }
}

typedef struct {
    floatX *qkv;        // (B,T,(NH+2·NKV)·HS) the projection, q and k after RoPE
    floatX *attn_y;     // (B,T,NH·HS) before the output projection
    floatX *q, *k, *v;  // (B,NH,T,HS), k and v expanded over the groups
    floatX *att;        // (B,NH,T,T) probabilities
    floatX *y;          // (B,NH,T,HS)
} AttnActs;

static size_t attention_acts_layout(AttnActs *a, void *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, NH = c->attn.heads, HS = c->attn.head_dim, inner = NH * HS;
    DeviceArena ar = {(char *)base, 0};
    a->qkv = TAKE_X(&ar, BT * (NH + 2 * c->attn.kv_heads) * HS);
    a->attn_y = TAKE_X(&ar, BT * inner);
    a->q = TAKE_X(&ar, BT * inner);
    a->k = TAKE_X(&ar, BT * inner);
    a->v = TAKE_X(&ar, BT * inner);
    a->y = TAKE_X(&ar, BT * inner);
    a->att = TAKE_X(&ar, (size_t)B * NH * T * T);
    return ar.used;
}

typedef struct {
    floatX *d_attn_y, *d_qkv;          // (B,T,NH·HS), (B,T,(NH+2·NKV)·HS)
    floatX *att;                       // (B,NH,T,T) the scores in the forward, their gradient in the backward
    floatX *d_q, *d_k, *d_v, *d_ay;    // (B,NH,T,HS)
    float2 *rope_tab;                  // (T, HS/2) RoPE's (cos, sin)
} AttnScratch;

static size_t attention_scratch_layout(AttnScratch *s, void *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, NH = c->attn.heads, HS = c->attn.head_dim, inner = NH * HS;
    DeviceArena ar = {(char *)base, 0};
    s->d_attn_y = TAKE_X(&ar, BT * inner);
    s->d_qkv = TAKE_X(&ar, BT * (NH + 2 * c->attn.kv_heads) * HS);
    s->att = TAKE_X(&ar, (size_t)B * NH * T * T);
    s->d_q = TAKE_X(&ar, BT * inner);
    s->d_k = TAKE_X(&ar, BT * inner);
    s->d_v = TAKE_X(&ar, BT * inner);
    s->d_ay = TAKE_X(&ar, BT * inner);
    s->rope_tab = (float2 *)TAKE_F(&ar, (size_t)T * HS);
    return ar.used;
}

static void attention_core_forward(AttnActs *a, const ModelConfig *c, int B, int T, const Runtime *rt, floatX *preatt) {
    cudaStream_t stream = rt->stream;
    const int NH = c->attn.heads, HS = c->attn.head_dim, batch = B * NH;
    const long n = (long)B * NH * T * HS;
    attention_expand_kernel<<<(unsigned)CEIL_DIV(n, 256L), 256, 0, stream>>>(a->q, a->k, a->v, a->qkv, B, T, NH,
                                                                             c->attn.kv_heads, HS);
    cudaCheck(cudaGetLastError());
    // preatt (T_q, T_k) row-major = q kᵀ: column-major preattᵀ (T_k × T_q) = Kᵀ·Q with K, Q column-major (HS × T)
    matmul_cublaslt(preatt, 0, a->k, a->q, T, T, HS, 1, 0, 1.0f, 0.0f, batch, (long long)T * HS, (long long)T * HS,
                    (long long)T * T, rt);
    causal_softmax_kernel<<<CEIL_DIV(batch * T, 8), 256, 0, stream>>>(a->att, preatt, batch * T, T, 1.0f / sqrtf((float)HS));
    cudaCheck(cudaGetLastError());
    // y (T, HS) row-major = att (T,T) · v (T,HS): column-major yᵀ (HS × T) = vᵀ(HS × T_k) · attᵀ(T_k × T_q)
    matmul_cublaslt(a->y, 0, a->v, a->att, HS, T, T, 0, 0, 1.0f, 0.0f, batch, (long long)T * HS, (long long)T * T,
                    (long long)T * HS, rt);
    attention_unpermute_kernel<<<(unsigned)CEIL_DIV(n, 256L), 256, 0, stream>>>(a->attn_y, a->y, B, T, NH, HS, 0);
    cudaCheck(cudaGetLastError());
}

static void attention_core_backward(AttnScratch *s, const AttnActs *a, const ModelConfig *c, int B, int T,
                                    const Runtime *rt) {
    cudaStream_t stream = rt->stream;
    const int NH = c->attn.heads, HS = c->attn.head_dim, batch = B * NH;
    const long long sTH = (long long)T * HS, sTT = (long long)T * T;
    const long n = (long)B * NH * T * HS;
    attention_unpermute_kernel<<<(unsigned)CEIL_DIV(n, 256L), 256, 0, stream>>>(s->d_attn_y, s->d_ay, B, T, NH, HS, 1);
    cudaCheck(cudaGetLastError());
    // datt (T_q, T_k) = dy · vᵀ: column-major D (T_k × T_q) = Vᵀ (T_k × HS) · dY (HS × T_q)
    matmul_cublaslt(s->att, 0, a->v, s->d_ay, T, T, HS, 1, 0, 1.0f, 0.0f, batch, sTH, sTH, sTT, rt);
    // dv (T_k, HS) = attᵀ · dy: column-major D (HS × T_k) = dY (HS × T_q) · op(att col-major (T_k × T_q))ᵀ
    matmul_cublaslt(s->d_v, 0, s->d_ay, a->att, HS, T, T, 0, 1, 1.0f, 0.0f, batch, sTH, sTT, sTH, rt);
    causal_softmax_backward_kernel<<<CEIL_DIV(batch * T, 8), 256, 0, stream>>>(s->att, a->att, batch * T, T,
                                                                               1.0f / sqrtf((float)HS));
    cudaCheck(cudaGetLastError());
    // dq (T_q, HS) = dpre · k: column-major D (HS × T_q) = K (HS × T_k) · dpreᵀ-view (T_k × T_q)
    matmul_cublaslt(s->d_q, 0, a->k, s->att, HS, T, T, 0, 0, 1.0f, 0.0f, batch, sTH, sTT, sTH, rt);
    // dk (T_k, HS) = dpreᵀ · q: column-major D (HS × T_k) = Q (HS × T_q) · op(dpre col-major (T_k × T_q))ᵀ
    matmul_cublaslt(s->d_k, 0, a->q, s->att, HS, T, T, 0, 1, 1.0f, 0.0f, batch, sTH, sTT, sTH, rt);
    const long W = (long)(NH + 2 * c->attn.kv_heads) * HS;
    attention_gather_kernel<<<(unsigned)CEIL_DIV((long)B * T * W, 256L), 256, 0, stream>>>(
        s->d_qkv, s->d_q, s->d_k, s->d_v, B, T, NH, c->attn.kv_heads, HS);
    cudaCheck(cudaGetLastError());
}

// p1[b] = pos[b] + i: the positions of the i-th new token of each sequence
__global__ void attention_offset_pos_kernel(int *p1, const int *pos, int B, int i) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b < B) { p1[b] = pos[b] + i; }
}
static inline size_t round_up_size(size_t x, size_t m) { return (x + m - 1) / m * m; }

// the decode step's attention, fp32 build: one block per (head, sequence), 4 warps each an online softmax over every
// 4th position of 0..pos[b], combined at the end. q: the rotated qkv rows (B, W); cache as attention_append_kernel.
#define DECODE_MAX_HS 256
__global__ void attention_decode_kernel(floatX *y, const floatX *cache, long seq_stride, const floatX *qkv,
                                        const int *pos, int NH, int NKV, int HS, int context, float scale) {
    __shared__ float sq[DECODE_MAX_HS];
    __shared__ float part_m[4], part_l[4], part_acc[4][DECODE_MAX_HS];
    const int h = blockIdx.x, b = blockIdx.y, lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int kv = NKV * HS, p = pos[b], kvo = (h / (NH / NKV)) * HS;
    const floatX *kc = cache + (long)b * seq_stride + kvo, *vc = kc + (long)context * kv;
    for (int j = threadIdx.x; j < HS; j += blockDim.x) { sq[j] = to_float(qkv[(long)b * (NH * HS + 2 * kv) + h * HS + j]); }
    __syncthreads();
    float m = -INFINITY, l = 0.0f, acc[DECODE_MAX_HS / WARP_SIZE];
    for (int e = 0; e < DECODE_MAX_HS / WARP_SIZE; e++) { acc[e] = 0.0f; }
    for (int u = warp; u <= p; u += 4) {
        const floatX *ku = kc + (long)u * kv, *vu = vc + (long)u * kv;
        float s = 0.0f;
        for (int i = lane; i < HS; i += WARP_SIZE) { s += sq[i] * to_float(ku[i]); }
        s = warp_reduce_sum(s) * scale;
        const float m_new = fmaxf(m, s), corr = expf(m - m_new), w = expf(s - m_new);
        l = l * corr + w;
        for (int i = lane, e = 0; i < HS; i += WARP_SIZE, e++) { acc[e] = acc[e] * corr + w * to_float(vu[i]); }
        m = m_new;
    }
    if (lane == 0) { part_m[warp] = m; part_l[warp] = l; }
    for (int i = lane, e = 0; i < HS; i += WARP_SIZE, e++) { part_acc[warp][i] = acc[e]; }
    __syncthreads();
    if (warp == 0) {
        float M = -INFINITY;
        for (int w = 0; w < 4; w++) { M = fmaxf(M, part_m[w]); }
        float L = 0.0f;
        for (int w = 0; w < 4; w++) { L += part_m[w] == -INFINITY ? 0.0f : part_l[w] * expf(part_m[w] - M); }
        for (int i = lane; i < HS; i += WARP_SIZE) {
            float sum = 0.0f;
            for (int w = 0; w < 4; w++) { sum += part_m[w] == -INFINITY ? 0.0f : part_acc[w][i] * expf(part_m[w] - M); }
            y[(long)b * NH * HS + h * HS + i] = (floatX)(sum / L);
        }
    }
}
#endif

// ----------------------------------------------------------------------------------------------------------------
// the mixer

typedef struct { ATTENTION_PARAMS(VIEW_FIELD) } AttentionParams;      // the layer's tensors, in the layers.h row's order
typedef struct { ATTENTION_PARAMS(VIEW_FIELD_32) } AttentionParams32; // their gradients

static size_t attention_mixer_acts_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    attention_gpu_check(c);
    AttnActs a;
    return attention_acts_layout(&a, NULL, c, B, T);
}
static size_t attention_mixer_scratch_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    AttnScratch s;
    return attention_scratch_layout(&s, NULL, c, B, T);
}

static void attention_mixer_forward(floatX *out, void *acts, void *scratch, const floatX *inp, const KindTensors *t,
                                    const ModelConfig *c, int B, int T, const Runtime *rt) {
    const AttentionParams *w = (const AttentionParams *)t->w;
    AttnActs a;
    attention_acts_layout(&a, acts, c, B, T);
    AttnScratch s;
    attention_scratch_layout(&s, scratch, c, B, T);
    const int BT = B * T, C = c->d_model, NH = c->attn.heads, HS = c->attn.head_dim, inner = NH * HS;
    const int W = (NH + 2 * c->attn.kv_heads) * HS;
    matmul_forward(a.qkv, inp, w->qkv_w, BT, C, W, rt);
    if (c->attn.rope) { attention_rope(a.qkv, BT, T, s.rope_tab, c, 0, rt->stream); }
#if !FLOATX_IS_FP32
    attention_core_forward(&a, c, B, T, rt);
#else
    attention_core_forward(&a, c, B, T, rt, s.att);
#endif
    matmul_forward(out, a.attn_y, w->out_w, BT, inner, C, rt);
}

static void attention_mixer_backward(floatX *dinp, void *scratch, const floatX *dout, const floatX *inp,
                                     const void *acts, const KindTensors *t, const ModelConfig *c, int B, int T,
                                     const Runtime *rt) {
    const AttentionParams *w = (const AttentionParams *)t->w;
    const AttentionParams32 *g = (const AttentionParams32 *)t->g;
    AttnActs a;
    attention_acts_layout(&a, (void *)acts, c, B, T);
    AttnScratch s;
    attention_scratch_layout(&s, scratch, c, B, T);
    const int BT = B * T, C = c->d_model, NH = c->attn.heads, HS = c->attn.head_dim, inner = NH * HS;
    const int W = (NH + 2 * c->attn.kv_heads) * HS;
    matmul_backward(s.d_attn_y, g->out_w, dout, a.attn_y, w->out_w, BT, inner, C, 0, rt);
    attention_core_backward(&s, &a, c, B, T, rt);
    if (c->attn.rope) { attention_rope(s.d_qkv, BT, T, s.rope_tab, c, 1, rt->stream); } // a rotation's adjoint
    matmul_backward(dinp, g->qkv_w, s.d_qkv, inp, w->qkv_w, BT, C, W, 0, rt);
}

// a sequence's decode state: its KV cache, keys then values, (context, NKV·HS) floatX each; in the bf16 build then
// the decode kernel's per-sequence workspace (the split's partial results and the merge's counters, zero at rest)
static size_t attention_cache_elems(const ModelConfig *c, int context) { return attention_decode_state(c, context); }
static size_t attention_mixer_state_bytes(const ModelConfig *c, int context) {
    attention_gpu_check(c);
    size_t bytes = attention_cache_elems(c, context) * sizeof(floatX);
#if !FLOATX_IS_FP32
    bytes += flash_decode_workspace_floats(1, c->attn.heads, c->attn.head_dim, context) * sizeof(float);
#endif
    return bytes;
}

static void attention_mixer_step(floatX *out, void *state, void *work, StepInput *in, const KindTensors *t,
                                 const ModelConfig *c, int B, const int *pos, int context, const Runtime *rt) {
    const AttentionParams *w = (const AttentionParams *)t->w;
    AttnActs a;
    attention_acts_layout(&a, work, c, B, 1); // qkv and attn_y for the B tokens
    const int C = c->d_model, NH = c->attn.heads, NKV = c->attn.kv_heads, HS = c->attn.head_dim, inner = NH * HS;
    const int W = (NH + 2 * NKV) * HS;
    const long seq = (long)(attention_mixer_state_bytes(c, context) / sizeof(floatX)); // elements a sequence
    floatX *cache = (floatX *)state;
    step_product(a.qkv, W, in, w->qkv_w, B, C, W, rt);
    const float scale = 1.0f / sqrtf((float)HS);
#if !FLOATX_IS_FP32
    // RoPE, the append and the attention in one launch; sequence b's split workspace follows its cache (seq elements,
    // i.e. seq / 2 floats, apart)
    flash_attention_decode_step(a.attn_y, inner, (float *)(cache + attention_cache_elems(c, context)), seq / 2, a.qkv,
                                W, cache, cache + (size_t)context * NKV * HS, seq, pos, B, NH, NKV, HS, context, scale,
                                c->attn.rope ? c->attn.rope_theta : 0.0f, rt->stream);
#else
    attention_rope_append(a.qkv, cache, seq, pos, B, 1, c, context, rt->stream);
    if (HS > DECODE_MAX_HS) {
        fail_with_hint("use a head dim of at most 256", "attention decode: head dim %d > %d", HS, DECODE_MAX_HS);
    }
    attention_decode_kernel<<<dim3(NH, B), 128, 0, rt->stream>>>(a.attn_y, cache, seq, a.qkv, pos, NH, NKV, HS, context,
                                                                 scale);
    cudaCheck(cudaGetLastError());
#endif
    step_branch_product(out, in, a.attn_y, w->out_w, B, inner, C, rt);
}

#if !FLOATX_IS_FP32
// sequence b's key count after an advance: lens[b] = pos[b] + T
__global__ void attention_lens_kernel(int *lens, const int *pos, int B, int T) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b < B) { lens[b] = pos[b] + T; }
}
#endif

// B sequences advance by T tokens (a prefill chunk): the projection of the T tokens, RoPE at their positions, their k
// and v appended to the caches; in the bf16 build the flash forward of the T queries against each cache (causal with
// the shift pos[b]: the queries are the last T of pos[b] + T keys), in the fp32 build T steps
static void attention_mixer_advance(floatX *out, void *state, void *work, const floatX *inp, const KindTensors *t,
                                    const ModelConfig *c, int B, int T, const int *pos, int context,
                                    const Runtime *rt) {
#if !FLOATX_IS_FP32
    const int NH = c->attn.heads, NKV = c->attn.kv_heads, HS = c->attn.head_dim;
    const long seq = (long)(attention_mixer_state_bytes(c, context) / sizeof(floatX)), kv = (long)NKV * HS;
    floatX *cache = (floatX *)state;
    const AttentionParams *w = (const AttentionParams *)t->w;
    const int BT = B * T, C = c->d_model, inner = NH * HS, W = (NH + 2 * NKV) * HS;
    AttnActs a;
    const size_t acts_bytes = attention_acts_layout(&a, work, c, B, T);
    AttnScratch s;
    attention_scratch_layout(&s, (char *)work + acts_bytes, c, B, T);
    int *lens = (int *)s.D; // B ints in the D scratch (B·T·NH floats)
    matmul_forward(a.qkv, inp, w->qkv_w, BT, C, W, rt);
    attention_rope_append(a.qkv, cache, seq, pos, B, T, c, context, rt->stream);
    attention_lens_kernel<<<CEIL_DIV(B, 128), 128, 0, rt->stream>>>(lens, pos, B, T);
    cudaCheck(cudaGetLastError());
    AttnDims d;
    memset(&d, 0, sizeof(d));
    d.B = B; d.Lq = T; d.Lk = context; d.NH = NH; d.NKV = NKV; d.HS = HS; d.causal = 1;
    d.scale = 1.0f / sqrtf((float)HS);
    d.q_row = W; d.q_seq = (long)T * W; d.k_row = d.v_row = kv; d.k_seq = d.v_seq = seq;
    d.o_row = inner; d.o_seq = (long)T * inner; d.len_k = lens;
    flash_attention_forward(a.attn_y, a.lse, a.qkv, cache, cache + (long)context * kv, &d, rt->stream);
    matmul_forward(out, a.attn_y, w->out_w, BT, inner, C, rt);
#else
    // one token of every sequence at a time: its rows gathered to (B, C), the step, its outputs scattered back
    const int C = c->d_model;
    floatX *x1 = (floatX *)work, *y1 = x1 + (size_t)B * C;
    int *p1 = (int *)(y1 + (size_t)B * C);
    void *step_work = (char *)work + round_up_size((size_t)B * (2 * C * sizeof(floatX) + sizeof(int)), 256);
    for (int i = 0; i < T; i++) {
        cudaCheck(cudaMemcpy2DAsync(x1, C * sizeof(floatX), inp + (long)i * C, (size_t)T * C * sizeof(floatX),
                                    C * sizeof(floatX), B, cudaMemcpyDeviceToDevice, rt->stream));
        attention_offset_pos_kernel<<<CEIL_DIV(B, 128), 128, 0, rt->stream>>>(p1, pos, B, i);
        cudaCheck(cudaGetLastError());
        StepInput in1 = {x1, NULL, NULL, NULL, NULL, NULL, 1}; // the rows as they are
        attention_mixer_step(y1, state, step_work, &in1, t, c, B, p1, context, rt);
        cudaCheck(cudaMemcpy2DAsync(out + (long)i * C, (size_t)T * C * sizeof(floatX), y1, C * sizeof(floatX),
                                    C * sizeof(floatX), B, cudaMemcpyDeviceToDevice, rt->stream));
    }
#endif
}

static const KindOps ATTENTION_OPS = {'A', attention_mixer_acts_bytes, attention_mixer_scratch_bytes,
                                      attention_mixer_forward, attention_mixer_backward, attention_mixer_state_bytes,
                                      attention_mixer_step, attention_mixer_advance};

#endif // M2RNN_ATTENTION_CUH
