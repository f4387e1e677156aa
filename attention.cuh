/*
attention.cuh: causal multi-head softmax attention (the A row of layers.h) on the GPU, mirroring ref/attention.h
(same names): the mixer is the qkv projection → attention_core → the output projection, behind the KindOps
interface of common.cuh, plus the single-token decode step against a KV cache.
The core: qkv (B,T,3·NH·HS) → permute to q, k, v (B,NH,T,HS) (RoPE applied to q and k on the way when on, the
"rotate half" pairs (i, i+HS/2), θ = 10000) → scores q kᵀ (cuBLASLt, batched over B·NH) → causal softmax with scale
1/sqrt(HS) → y = att v → un-permute to (B,T,NH·HS). The backward runs the same chain in reverse.
This version materializes the (B,NH,T,T) probabilities: it is the cuBLAS baseline; the flash kernel is its own issue.
The decode step is a plain correct kernel (one block per sequence and head, an online softmax per warp).
*/
#ifndef M2RNN_ATTENTION_CUH
#define M2RNN_ATTENTION_CUH

#include "common.cuh"

// qkv (B,T,3,NH,HS) → q, k, v (B,NH,T,HS), rotating q and k when rope != 0. The backward direction (inverse = 1)
// takes dq, dk, dv (B,NH,T,HS) back to dqkv (B,T,3,NH,HS), un-rotating dq and dk (a rotation's adjoint).
__global__ void attention_permute_kernel(floatX *q, floatX *k, floatX *v, floatX *qkv, int B, int T, int NH, int HS,
                                         int rope, float theta, int inverse) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x; // over (B, NH, T, HS/2) pairs, plus v
    const int half = HS / 2;
    const long pairs = (long)B * NH * T * half;
    if (i >= pairs) { return; }
    const int j = (int)(i % half);
    const int t = (int)((i / half) % T);
    const int h = (int)((i / ((long)half * T)) % NH);
    const int b = (int)(i / ((long)half * T * NH));
    const long inner = (long)NH * HS;
    const long src = ((long)b * T + t) * 3 * inner + (long)h * HS; // q part of (b, t, h)
    const long dst = (((long)b * NH + h) * T + t) * HS;
    float cs = 1.0f, sn = 0.0f;
    if (rope) {
        const float angle = (float)t * powf(theta, -2.0f * j / HS);
        sincosf(angle, &sn, &cs);
        if (inverse) { sn = -sn; }
    }
    floatX *heads[3] = {q, k, v};
    for (int part = 0; part < 3; part++) {
        const float c = part < 2 ? cs : 1.0f, s = part < 2 ? sn : 0.0f;
        floatX *hp = heads[part] + dst;
        floatX *rp = qkv + src + (long)part * inner;
        if (!inverse) {
            const float x1 = to_float(rp[j]), x2 = to_float(rp[j + half]);
            hp[j] = (floatX)(x1 * c - x2 * s);
            hp[j + half] = (floatX)(x1 * s + x2 * c);
        } else {
            const float x1 = to_float(hp[j]), x2 = to_float(hp[j + half]);
            rp[j] = (floatX)(x1 * c - x2 * s);
            rp[j + half] = (floatX)(x1 * s + x2 * c);
        }
    }
}

// y (B,NH,T,HS) → out (B,T,NH·HS), or back with inverse = 1
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
    floatX *q, *k, *v; // (B,NH,T,HS) after RoPE
    floatX *att;       // (B,NH,T,T) probabilities
    floatX *y;         // (B,NH,T,HS)
} AttnSaved;

// out (B,T,NH·HS) = attention of qkv (B,T,3·NH·HS); s holds what the backward needs; preatt: (B,NH,T,T) scratch
static void attention_core_forward(floatX *out, AttnSaved *s, floatX *preatt, floatX *qkv, int B, int T, int NH,
                                   int HS, int rope, float theta, const Runtime *rt) {
    cudaStream_t stream = rt->stream;
    const long pairs = (long)B * NH * T * (HS / 2);
    attention_permute_kernel<<<(unsigned)CEIL_DIV(pairs, 256L), 256, 0, stream>>>(s->q, s->k, s->v, qkv, B, T, NH, HS,
                                                                                   rope, theta, 0);
    cudaCheck(cudaGetLastError());
    const int batch = B * NH;
    // preatt (T_q, T_k) row-major = q kᵀ: column-major preattᵀ (T_k × T_q) = kᵀ... i.e. D(m=T,n=T) = Kᵀ·Q with K, Q
    // viewed column-major as (HS × T)
    matmul_cublaslt(preatt, 0, s->k, s->q, T, T, HS, 1, 0, 1.0f, 0.0f, batch, (long long)T * HS, (long long)T * HS,
                    (long long)T * T, rt);
    const int rows = batch * T;
    causal_softmax_kernel<<<CEIL_DIV(rows, 8), 256, 0, stream>>>(s->att, preatt, rows, T, 1.0f / sqrtf((float)HS));
    cudaCheck(cudaGetLastError());
    // y (T, HS) row-major = att (T,T) · v (T,HS): column-major yᵀ (HS × T) = vᵀ(HS × T_k) · attᵀ(T_k × T_q)
    matmul_cublaslt(s->y, 0, s->v, s->att, HS, T, T, 0, 0, 1.0f, 0.0f, batch, (long long)T * HS, (long long)T * T,
                    (long long)T * HS, rt);
    attention_unpermute_kernel<<<(unsigned)CEIL_DIV((long)B * NH * T * HS, 256L), 256, 0, stream>>>(out, s->y, B, T, NH,
                                                                                                     HS, 0);
    cudaCheck(cudaGetLastError());
}

// dqkv (B,T,3·NH·HS) from dout (B,T,NH·HS). Scratch: dy, dq, dk, dv (B,NH,T,HS) each, datt (B,NH,T,T).
static void attention_core_backward(floatX *dqkv, floatX *dout, const AttnSaved *s, floatX *dy, floatX *dq,
                                    floatX *dk, floatX *dv, floatX *datt, int B, int T, int NH, int HS, int rope,
                                    float theta, const Runtime *rt) {
    cudaStream_t stream = rt->stream;
    const int batch = B * NH;
    const long long sTH = (long long)T * HS, sTT = (long long)T * T;
    attention_unpermute_kernel<<<(unsigned)CEIL_DIV((long)B * NH * T * HS, 256L), 256, 0, stream>>>(dout, dy, B, T, NH,
                                                                                                     HS, 1);
    cudaCheck(cudaGetLastError());
    // datt (T_q, T_k) = dy (T_q, HS) · vᵀ: column-major dattᵀ (T_k × T_q) = vᵀ-view... D(m=T_k, n=T_q) = Vᵀᵀ... :
    // with V and dY column-major (HS × T): D = op(V)=Vᵀ (T_k × HS) · dY (HS × T_q)
    matmul_cublaslt(datt, 0, s->v, dy, T, T, HS, 1, 0, 1.0f, 0.0f, batch, sTH, sTH, sTT, rt);
    // dv (T_k, HS) = attᵀ · dy: column-major dvᵀ (HS × T_k) = dYᵀ-view: D(m=HS, n=T_k) = dY (HS × T_q) · op(attᵀ)
    // att row-major (T_q, T_k) = column-major (T_k × T_q); op T gives (T_q × T_k)
    matmul_cublaslt(dv, 0, dy, s->att, HS, T, T, 0, 1, 1.0f, 0.0f, batch, sTH, sTT, sTH, rt);
    const int rows = batch * T;
    causal_softmax_backward_kernel<<<CEIL_DIV(rows, 8), 256, 0, stream>>>(datt, s->att, rows, T, 1.0f / sqrtf((float)HS));
    cudaCheck(cudaGetLastError());
    // dq (T_q, HS) = dpre (T_q, T_k) · k: column-major dqᵀ (HS × T_q) = K (HS × T_k) · dpreᵀ-view (T_k × T_q)
    matmul_cublaslt(dq, 0, s->k, datt, HS, T, T, 0, 0, 1.0f, 0.0f, batch, sTH, sTT, sTH, rt);
    // dk (T_k, HS) = dpreᵀ · q: column-major dkᵀ (HS × T_k) = Q (HS × T_q) · op(dpre col-major (T_k × T_q))ᵀ
    matmul_cublaslt(dk, 0, s->q, datt, HS, T, T, 0, 1, 1.0f, 0.0f, batch, sTH, sTT, sTH, rt);
    const long pairs = (long)B * NH * T * (HS / 2);
    attention_permute_kernel<<<(unsigned)CEIL_DIV(pairs, 256L), 256, 0, stream>>>(dq, dk, dv, dqkv, B, T, NH, HS, rope,
                                                                                   theta, 1);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------------------
// the decode step's kernel

// One query token of sequence b, head h (grid (NH, B), 4 warps): the token's q, k, v are read from qkv (B,3·NH·HS)
// and rotated at pos[b] as the forward's permute does (rounded to floatX as it stores them); k and v go into the
// sequence's cache at pos[b]; then the query attends over positions 0..pos[b], each warp an online softmax over
// every 4th position, the four partial results combined at the end. cache: sequence b's keys (context, NH·HS) then
// values (context, NH·HS) at b·seq_stride elements. y (B, NH·HS).
#define DECODE_MAX_HS 256
__global__ void attention_decode_kernel(floatX *y, floatX *cache, long seq_stride, const floatX *qkv, const int *pos,
                                        int NH, int HS, int context, int rope, float theta, float scale) {
    __shared__ float sq[DECODE_MAX_HS];
    __shared__ float part_m[4], part_l[4], part_acc[4][DECODE_MAX_HS];
    const int h = blockIdx.x, b = blockIdx.y, lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int inner = NH * HS, half = HS / 2, p = pos[b];
    const floatX *row = qkv + (long)b * 3 * inner + (long)h * HS;
    floatX *kc = cache + (long)b * seq_stride, *vc = kc + (long)context * inner;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        float cs = 1.0f, sn = 0.0f;
        if (rope) { sincosf((float)p * powf(theta, -2.0f * j / HS), &sn, &cs); }
        const float q1 = to_float(row[j]), q2 = to_float(row[j + half]);
        const float k1 = to_float(row[inner + j]), k2 = to_float(row[inner + j + half]);
        sq[j] = to_float((floatX)(q1 * cs - q2 * sn));
        sq[j + half] = to_float((floatX)(q1 * sn + q2 * cs));
        kc[(long)p * inner + h * HS + j] = (floatX)(k1 * cs - k2 * sn);
        kc[(long)p * inner + h * HS + j + half] = (floatX)(k1 * sn + k2 * cs);
        vc[(long)p * inner + h * HS + j] = row[2 * inner + j];
        vc[(long)p * inner + h * HS + j + half] = row[2 * inner + j + half];
    }
    __syncthreads();
    float m = -INFINITY, l = 0.0f, acc[DECODE_MAX_HS / WARP_SIZE];
    for (int e = 0; e < DECODE_MAX_HS / WARP_SIZE; e++) { acc[e] = 0.0f; }
    for (int u = warp; u <= p; u += 4) {
        const floatX *ku = kc + (long)u * inner + h * HS, *vu = vc + (long)u * inner + h * HS;
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
            y[(long)b * inner + h * HS + i] = (floatX)(sum / L);
        }
    }
}

// ----------------------------------------------------------------------------------------------------------------
// the mixer

typedef struct { ATTENTION_PARAMS(VIEW_FIELD) } AttentionParams;      // the layer's tensors, in the layers.h row's order
typedef struct { ATTENTION_PARAMS(VIEW_FIELD_32) } AttentionParams32; // their gradients

typedef struct {
    floatX *attn_y; // (B,T,NH·HS) before the output projection
    AttnSaved s;    // q, k, v, y (B,NH,T,HS) and the probabilities (B,NH,T,T)
} AttnActs;

static size_t attention_acts_layout(AttnActs *a, void *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, NH = c->attn.heads, inner = NH * c->attn.head_dim;
    DeviceArena ar = {(char *)base, 0};
    a->attn_y = TAKE_X(&ar, BT * inner);
    a->s.q = TAKE_X(&ar, BT * inner);
    a->s.k = TAKE_X(&ar, BT * inner);
    a->s.v = TAKE_X(&ar, BT * inner);
    a->s.y = TAKE_X(&ar, BT * inner);
    a->s.att = TAKE_X(&ar, (size_t)B * NH * T * T);
    return ar.used;
}

typedef struct {
    floatX *qkv;                    // (B,T,3·NH·HS) the projection (forward)
    floatX *att;                    // (B,NH,T,T) the scores in the forward, their gradient in the backward
    floatX *d_qkv, *d_attn_y;       // (B,T,3·NH·HS), (B,T,NH·HS)
    floatX *d_q, *d_k, *d_v, *d_ay; // (B,NH,T,HS)
} AttnScratch;

static size_t attention_scratch_layout(AttnScratch *s, void *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, NH = c->attn.heads, inner = NH * c->attn.head_dim;
    DeviceArena ar = {(char *)base, 0};
    s->qkv = TAKE_X(&ar, BT * 3 * inner);
    s->att = TAKE_X(&ar, (size_t)B * NH * T * T);
    s->d_qkv = TAKE_X(&ar, BT * 3 * inner);
    s->d_attn_y = TAKE_X(&ar, BT * inner);
    s->d_q = TAKE_X(&ar, BT * inner);
    s->d_k = TAKE_X(&ar, BT * inner);
    s->d_v = TAKE_X(&ar, BT * inner);
    s->d_ay = TAKE_X(&ar, BT * inner);
    return ar.used;
}

static size_t attention_mixer_acts_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
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
    matmul_forward(s.qkv, inp, w->qkv_w, BT, C, 3 * inner, rt);
    attention_core_forward(a.attn_y, &a.s, s.att, s.qkv, B, T, NH, HS, c->attn.rope, c->attn.rope_theta, rt);
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
    matmul_backward(s.d_attn_y, g->out_w, dout, a.attn_y, w->out_w, BT, inner, C, 0, rt);
    attention_core_backward(s.d_qkv, s.d_attn_y, &a.s, s.d_ay, s.d_q, s.d_k, s.d_v, s.att, B, T, NH, HS, c->attn.rope,
                            c->attn.rope_theta, rt);
    matmul_backward(dinp, g->qkv_w, s.d_qkv, inp, w->qkv_w, BT, C, 3 * inner, 0, rt);
}

// a sequence's decode state: its KV cache, keys then values, (context, NH·HS) floatX each
static size_t attention_mixer_state_bytes(const ModelConfig *c, int context) {
    return attention_decode_state(c, context) * sizeof(floatX);
}

static void attention_mixer_step(floatX *out, void *state, void *work, const floatX *inp, const KindTensors *t,
                                 const ModelConfig *c, int B, const int *pos, int context, const Runtime *rt) {
    const AttentionParams *w = (const AttentionParams *)t->w;
    AttnActs a;
    const size_t acts_bytes = attention_acts_layout(&a, work, c, B, 1);
    AttnScratch s;
    attention_scratch_layout(&s, (char *)work + acts_bytes, c, B, 1);
    const int C = c->d_model, NH = c->attn.heads, HS = c->attn.head_dim, inner = NH * HS;
    if (HS > DECODE_MAX_HS) {
        fail_with_hint("use a head dim of at most 256", "attention decode: head dim %d > %d", HS, DECODE_MAX_HS);
    }
    matmul_forward(s.qkv, inp, w->qkv_w, B, C, 3 * inner, rt);
    attention_decode_kernel<<<dim3(NH, B), 128, 0, rt->stream>>>(a.attn_y, (floatX *)state,
                                                                 (long)attention_decode_state(c, context), s.qkv, pos,
                                                                 NH, HS, context, c->attn.rope, c->attn.rope_theta,
                                                                 1.0f / sqrtf((float)HS));
    cudaCheck(cudaGetLastError());
    matmul_forward(out, a.attn_y, w->out_w, B, inner, C, rt);
}

static const KindOps ATTENTION_OPS = {'A', attention_mixer_acts_bytes, attention_mixer_scratch_bytes,
                                      attention_mixer_forward, attention_mixer_backward, attention_mixer_state_bytes,
                                      attention_mixer_step};

#endif // M2RNN_ATTENTION_CUH
