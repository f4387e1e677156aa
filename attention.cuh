/*
attention.cuh: causal multi-head softmax attention on the GPU, forward and backward, mirroring ref/attention.h:
qkv (B,T,3·NH·HS) from the projection → permute to q, k, v (B,NH,T,HS) (RoPE applied to q and k on the way when
on, the "rotate half" pairs (i, i+HS/2), θ = 10000) → scores q kᵀ (cuBLASLt, batched over B·NH) → causal softmax
with scale 1/sqrt(HS) → y = att v → un-permute to (B,T,NH·HS). The backward runs the same chain in reverse.
This version materializes the (B,NH,T,T) probabilities: it is the cuBLAS baseline; the flash kernel is its own issue.
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
static void attention_forward(floatX *out, AttnSaved *s, floatX *preatt, floatX *qkv, int B, int T, int NH, int HS,
                              int rope, float theta, cudaStream_t stream) {
    const long pairs = (long)B * NH * T * (HS / 2);
    attention_permute_kernel<<<(unsigned)CEIL_DIV(pairs, 256L), 256, 0, stream>>>(s->q, s->k, s->v, qkv, B, T, NH, HS,
                                                                                   rope, theta, 0);
    cudaCheck(cudaGetLastError());
    const int batch = B * NH;
    // preatt (T_q, T_k) row-major = q kᵀ: column-major preattᵀ (T_k × T_q) = kᵀ... i.e. D(m=T,n=T) = Kᵀ·Q with K, Q
    // viewed column-major as (HS × T)
    matmul_cublaslt(preatt, 0, s->k, s->q, T, T, HS, 1, 0, 1.0f, 0.0f, batch, (long long)T * HS, (long long)T * HS,
                    (long long)T * T, stream);
    const int rows = batch * T;
    causal_softmax_kernel<<<CEIL_DIV(rows, 8), 256, 0, stream>>>(s->att, preatt, rows, T, 1.0f / sqrtf((float)HS));
    cudaCheck(cudaGetLastError());
    // y (T, HS) row-major = att (T,T) · v (T,HS): column-major yᵀ (HS × T) = vᵀ(HS × T_k) · attᵀ(T_k × T_q)
    matmul_cublaslt(s->y, 0, s->v, s->att, HS, T, T, 0, 0, 1.0f, 0.0f, batch, (long long)T * HS, (long long)T * T,
                    (long long)T * HS, stream);
    attention_unpermute_kernel<<<(unsigned)CEIL_DIV((long)B * NH * T * HS, 256L), 256, 0, stream>>>(out, s->y, B, T, NH,
                                                                                                     HS, 0);
    cudaCheck(cudaGetLastError());
}

// dqkv (B,T,3·NH·HS) from dout (B,T,NH·HS). Scratch: dy, dq, dk, dv (B,NH,T,HS) each, datt (B,NH,T,T).
static void attention_backward(floatX *dqkv, floatX *dout, const AttnSaved *s, floatX *dy, floatX *dq, floatX *dk,
                               floatX *dv, floatX *datt, int B, int T, int NH, int HS, int rope, float theta,
                               cudaStream_t stream) {
    const int batch = B * NH;
    const long long sTH = (long long)T * HS, sTT = (long long)T * T;
    attention_unpermute_kernel<<<(unsigned)CEIL_DIV((long)B * NH * T * HS, 256L), 256, 0, stream>>>(dout, dy, B, T, NH,
                                                                                                     HS, 1);
    cudaCheck(cudaGetLastError());
    // datt (T_q, T_k) = dy (T_q, HS) · vᵀ: column-major dattᵀ (T_k × T_q) = vᵀ-view... D(m=T_k, n=T_q) = Vᵀᵀ... :
    // with V and dY column-major (HS × T): D = op(V)=Vᵀ (T_k × HS) · dY (HS × T_q)
    matmul_cublaslt(datt, 0, s->v, dy, T, T, HS, 1, 0, 1.0f, 0.0f, batch, sTH, sTH, sTT, stream);
    // dv (T_k, HS) = attᵀ · dy: column-major dvᵀ (HS × T_k) = dYᵀ-view: D(m=HS, n=T_k) = dY (HS × T_q) · op(attᵀ)
    // att row-major (T_q, T_k) = column-major (T_k × T_q); op T gives (T_q × T_k)
    matmul_cublaslt(dv, 0, dy, s->att, HS, T, T, 0, 1, 1.0f, 0.0f, batch, sTH, sTT, sTH, stream);
    const int rows = batch * T;
    causal_softmax_backward_kernel<<<CEIL_DIV(rows, 8), 256, 0, stream>>>(datt, s->att, rows, T, 1.0f / sqrtf((float)HS));
    cudaCheck(cudaGetLastError());
    // dq (T_q, HS) = dpre (T_q, T_k) · k: column-major dqᵀ (HS × T_q) = K (HS × T_k) · dpreᵀ-view (T_k × T_q)
    matmul_cublaslt(dq, 0, s->k, datt, HS, T, T, 0, 0, 1.0f, 0.0f, batch, sTH, sTT, sTH, stream);
    // dk (T_k, HS) = dpreᵀ · q: column-major dkᵀ (HS × T_k) = Q (HS × T_q) · op(dpre col-major (T_k × T_q))ᵀ
    matmul_cublaslt(dk, 0, s->q, datt, HS, T, T, 0, 1, 1.0f, 0.0f, batch, sTH, sTT, sTH, stream);
    const long pairs = (long)B * NH * T * (HS / 2);
    attention_permute_kernel<<<(unsigned)CEIL_DIV(pairs, 256L), 256, 0, stream>>>(dq, dk, dv, dqkv, B, T, NH, HS, rope,
                                                                                   theta, 1);
    cudaCheck(cudaGetLastError());
}

#endif // M2RNN_ATTENTION_CUH
