/*
m2rnn.cuh: the M²RNN mixer (the M row of layers.h) on the GPU, mirroring ref/m2rnn.h op for op: the input projection
(cuBLASLt into rows q|k|v|f_raw|g), the causal conv + SiLU (conv.cuh), the decay gate (gate.cuh), the recurrence,
the output gate y += v ⊙ D, y ⊙ SiLU(g), one RMSNorm over N·V, the output projection; the backward in reverse; the
single-token decode step. Behind the KindOps interface of common.cuh.

The recurrence has two implementations with one contract (Z = tanh(H W + k vᵀ), H = f H + (1 − f) Z, y = Hᵀq, the
authors' clamp of the carried dH in the backward):
- the tensor-core kernels of m2rnn_kernels.cuh (bf16 build, K a multiple of 16 up to 256, V ∈ {16, 32}): the
  training forward keeps state checkpoints every 32 tokens and the backward recomputes from them;
- the plain fp32 kernels below (one thread per state row, every H_t kept): the fp32 build, any other shape, and
  Runtime.plain_recurrence (M2RNN_PLAIN_RECURRENCE=1), with which a step is bitwise repeatable.
*/
#ifndef M2RNN_M2RNN_CUH
#define M2RNN_M2RNN_CUH

#include "common.cuh"
#include "conv.cuh"
#include "gate.cuh"
#if !FLOATX_IS_FP32
#include "m2rnn_kernels.cuh" // the tensor-core recurrence (forward, backward, step)
#endif

typedef struct { M2RNN_PARAMS(VIEW_FIELD) } M2RNNParams;      // the layer's tensors, in the layers.h row's order
typedef struct { M2RNN_PARAMS(VIEW_FIELD_32) } M2RNNParams32; // their gradients or fp32 master weights

// ----------------------------------------------------------------------------------------------------------------
// the plain recurrence: one block per (b, n), one thread per state row (K ≤ 1024), V ≤ 32 values in registers.
// Keeps every H_t (fp32) for the backward. Exact fp32 arithmetic, no tensor cores, tanhf: the fp32 build's path.

#define PLAIN_MAX_V 32

// y (B,T,N,V); h_all (B,T,N,K,V) fp32 or NULL; q, k (.., Nq, K) and v (.., N, V) views with token stride `stride`;
// h0 / hT: sequence b's (N,K,V) initial / final state at b·h_stride floats, or NULL (zeros / not kept)
__global__ void m2rnn_plain_forward_kernel(floatX *y, float *h_all, const float *h0, float *hT, long h_stride,
                                           const floatX *q, const floatX *k, const floatX *v, int stride,
                                           const float *f, const floatX *W, int T, int N, int Nq, int K, int V) {
    extern __shared__ float sh[]; // W (V, V) | v_t (V) | y partial (warps, V)
    float *Ws = sh, *vs = sh + V * V, *ys = vs + V;
    const int b = blockIdx.y, n = blockIdx.x, r = threadIdx.x, warps = CEIL_DIV(K, WARP_SIZE);
    const int hq = n / (N / Nq), lane = r % WARP_SIZE, warp = r / WARP_SIZE;
    for (int i = r; i < V * V; i += blockDim.x) { Ws[i] = to_float(W[(long)n * V * V + i]); }
    float h[PLAIN_MAX_V];
    const long hoff = (long)b * h_stride + ((long)n * K + r) * V;
    for (int j = 0; j < V; j++) { h[j] = (h0 != NULL && r < K) ? h0[hoff + j] : 0.0f; }
    for (int t = 0; t < T; t++) {
        const long bt = (long)b * T + t;
        __syncthreads();
        for (int j = r; j < V; j += blockDim.x) { vs[j] = to_float(v[bt * stride + (long)n * V + j]); }
        __syncthreads();
        const float ft = f[bt * N + n];
        float qr = 0.0f;
        if (r < K) {
            const float kr = to_float(k[bt * stride + (long)hq * K + r]);
            qr = to_float(q[bt * stride + (long)hq * K + r]);
            float hn[PLAIN_MAX_V];
            for (int j = 0; j < V; j++) {
                float p = kr * vs[j];
                for (int i = 0; i < V; i++) { p += h[i] * Ws[i * V + j]; }
                hn[j] = ft * h[j] + (1.0f - ft) * tanhf(p);
            }
            for (int j = 0; j < V; j++) { h[j] = hn[j]; }
            if (h_all != NULL) {
                float *out = h_all + ((bt * N + n) * K + r) * V;
                for (int j = 0; j < V; j++) { out[j] = hn[j]; }
            }
        }
        for (int j = 0; j < V; j++) {
            const float s = warp_reduce_sum(r < K ? h[j] * qr : 0.0f);
            if (lane == 0) { ys[warp * V + j] = s; }
        }
        __syncthreads();
        for (int j = r; j < V; j += blockDim.x) {
            float acc = 0.0f;
            for (int w = 0; w < warps; w++) { acc += ys[w * V + j]; }
            y[(bt * N + n) * V + j] = (floatX)acc;
        }
    }
    if (hT != NULL && r < K) {
        for (int j = 0; j < V; j++) { hT[hoff + j] = h[j]; }
    }
}

// Backward with the kernel clamp semantics. Writes dP (B,T,N,K,V) fp32 (the pre-activation gradient), per-head
// partials dq_part, dk_part (B,T,N,K) fp32, df (B,T,N) fp32; dW, dv and the head sums follow in separate kernels.
__global__ void m2rnn_plain_backward_kernel(float *dP_all, float *dq_part, float *dk_part, float *df,
                                            const floatX *dy, const float *h_all, const floatX *q, const floatX *k,
                                            const floatX *v, int stride, const float *f, const floatX *W, float clamp,
                                            int T, int N, int Nq, int K, int V) {
    extern __shared__ float sh[]; // W (V, V) | v_t (V) | dy_t (V) | df partial (warps)
    float *Ws = sh, *vs = sh + V * V, *dys = vs + V, *dfs = dys + V;
    const int b = blockIdx.y, n = blockIdx.x, r = threadIdx.x, hq = n / (N / Nq);
    const int lane = r % WARP_SIZE, warp = r / WARP_SIZE, warps = CEIL_DIV(K, WARP_SIZE);
    for (int i = r; i < V * V; i += blockDim.x) { Ws[i] = to_float(W[(long)n * V * V + i]); }
    float G[PLAIN_MAX_V];
    for (int j = 0; j < V; j++) { G[j] = 0.0f; }
    for (int t = T - 1; t >= 0; t--) {
        const long bt = (long)b * T + t;
        __syncthreads();
        for (int j = r; j < V; j += blockDim.x) {
            vs[j] = to_float(v[bt * stride + (long)n * V + j]);
            dys[j] = to_float(dy[(bt * N + n) * V + j]);
        }
        __syncthreads();
        const float ft = f[bt * N + n];
        float dft = 0.0f;
        if (r < K) {
            const float kr = to_float(k[bt * stride + (long)hq * K + r]), qr = to_float(q[bt * stride + (long)hq * K + r]);
            const float *Ht = h_all + ((bt * N + n) * K + r) * V;
            float hp[PLAIN_MAX_V], Dm[PLAIN_MAX_V], dP[PLAIN_MAX_V];
            for (int j = 0; j < V; j++) { hp[j] = t > 0 ? h_all[(((bt - 1) * N + n) * K + r) * V + j] : 0.0f; }
            float dq = 0.0f, dk = 0.0f;
            for (int j = 0; j < V; j++) {
                float p = kr * vs[j];
                for (int i = 0; i < V; i++) { p += hp[i] * Ws[i * V + j]; }
                const float z = tanhf(p);
                float g = G[j];
                if (clamp > 0.0f) { g = g > clamp ? clamp : (g < -clamp ? -clamp : g); } // (a NaN passes through)
                Dm[j] = qr * dys[j] + g;
                dq += Ht[j] * dys[j];
                dft += Dm[j] * (hp[j] - z);
                dP[j] = Dm[j] * (1.0f - ft) * (1.0f - z * z);
                dk += dP[j] * vs[j];
            }
            float *dPo = dP_all + ((bt * N + n) * K + r) * V;
            for (int j = 0; j < V; j++) { dPo[j] = dP[j]; }
            dq_part[(bt * N + n) * K + r] = dq;
            dk_part[(bt * N + n) * K + r] = dk;
            for (int i = 0; i < V; i++) {
                float acc = ft * Dm[i];
                for (int j = 0; j < V; j++) { acc += dP[j] * Ws[i * V + j]; }
                G[i] = acc;
            }
        }
        dft = warp_reduce_sum(dft);
        if (lane == 0) { dfs[warp] = dft; }
        __syncthreads();
        if (r == 0) {
            float acc = 0.0f;
            for (int w = 0; w < warps; w++) { acc += dfs[w]; }
            df[bt * N + n] = acc;
        }
    }
}

// dv (view) = Σ_r dP[r, j] k_r;  one thread per (token, head, j)
__global__ void m2rnn_plain_dv_kernel(floatX *dv, const float *dP_all, const floatX *k, int stride, long BT, int N,
                                      int Nq, int K, int V) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BT * N * V) { return; }
    const int j = (int)(i % V), n = (int)((i / V) % N);
    const long bt = i / ((long)V * N);
    const int hq = n / (N / Nq);
    float acc = 0.0f;
    for (int r = 0; r < K; r++) { acc += dP_all[((bt * N + n) * K + r) * V + j] * to_float(k[bt * stride + (long)hq * K + r]); }
    dv[bt * stride + (long)n * V + j] = (floatX)acc;
}

// partial (chunks, N, V, V) of dW = Σ_t H_{t−1}ᵀ dP_t; one thread per (n, i, j), tokens of one chunk in order
__global__ void m2rnn_plain_dw_kernel(float *partial, const float *dP_all, const float *h_all, int T, long BT, int N,
                                      int K, int V) {
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const int chunk = blockIdx.y;
    if (idx >= (long)N * V * V) { return; }
    const int j = (int)(idx % V), i = (int)((idx / V) % V), n = (int)(idx / ((long)V * V));
    float acc = 0.0f;
    const long begin = (long)chunk * TOKEN_CHUNK, end = min(begin + TOKEN_CHUNK, BT);
    for (long bt = begin; bt < end; bt++) {
        if (bt % T == 0) { continue; } // H_{−1} = 0
        for (int r = 0; r < K; r++) {
            acc += h_all[(((bt - 1) * N + n) * K + r) * V + i] * dP_all[((bt * N + n) * K + r) * V + j];
        }
    }
    partial[(long)chunk * N * V * V + idx] = acc;
}

// dq, dk (views) = Σ over the heads sharing each q/k head, heads in order
__global__ void m2rnn_plain_qk_sum_kernel(floatX *dq, floatX *dk, const float *dq_part, const float *dk_part, int stride,
                                          long BT, int N, int Nq, int K) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BT * Nq * K) { return; }
    const int r = (int)(i % K), hq = (int)((i / K) % Nq);
    const long bt = i / ((long)K * Nq);
    const int per = N / Nq;
    float aq = 0.0f, ak = 0.0f;
    for (int n = hq * per; n < (hq + 1) * per; n++) {
        aq += dq_part[(bt * N + n) * K + r];
        ak += dk_part[(bt * N + n) * K + r];
    }
    dq[bt * stride + (long)hq * K + r] = (floatX)aq;
    dk[bt * stride + (long)hq * K + r] = (floatX)ak;
}

// floats of the states the forward saves for the backward (per layer): every H_t, (B,T,N,K,V)
static inline size_t m2rnn_plain_saved_floats(long BT, int N, int K, int V) { return (size_t)BT * N * K * V; }
// floats of backward-only scratch (shared by the layers): dP (B,T,N,K,V), dq/dk partials (B,T,N,K), dW partials
static inline size_t m2rnn_plain_scratch_floats(long BT, int N, int K, int V) {
    return (size_t)BT * N * K * V + 2 * (size_t)BT * N * K + (size_t)token_chunks(BT) * N * V * V;
}

// y (B,T,N,V); h_all (B,T,N,K,V) or NULL; h0, hT: (N,K,V) states of each sequence, h_stride floats apart, or NULL
static void m2rnn_plain_forward(floatX *y, float *h_all, const float *h0, float *hT, long h_stride, const floatX *q,
                                const floatX *k, const floatX *v, int stride, const float *f, const floatX *W, int B,
                                int T, int N, int Nq, int K, int V, cudaStream_t stream) {
    if (V > PLAIN_MAX_V || K > 1024) {
        fail_with_hint("use V <= 32 and K <= 1024", "m2rnn plain recurrence: unsupported K=%d V=%d", K, V);
    }
    const int block = CEIL_DIV(K, WARP_SIZE) * WARP_SIZE;
    const size_t smem = (size_t)(V * V + V + (block / WARP_SIZE) * V) * sizeof(float);
    m2rnn_plain_forward_kernel<<<dim3(N, B), block, smem, stream>>>(y, h_all, h0, hT, h_stride, q, k, v, stride, f, W,
                                                                    T, N, Nq, K, V);
    cudaCheck(cudaGetLastError());
}

// dq, dk, dv written (views); df (B,T,N) written; dW (N,V,V) +=; h_all from the forward
static void m2rnn_plain_backward(floatX *dq, floatX *dk, floatX *dv, float *df, float *dW, float *scratch,
                                 const float *h_all, const floatX *dy, const floatX *q, const floatX *k, const floatX *v, int stride,
                                 const float *f, const floatX *W, float clamp, int B, int T, int N, int Nq, int K,
                                 int V, cudaStream_t stream) {
    const long BT = (long)B * T;
    float *dP_all = scratch;
    float *dq_part = dP_all + (size_t)BT * N * K * V, *dk_part = dq_part + (size_t)BT * N * K;
    float *dw_part = dk_part + (size_t)BT * N * K;
    const int block = CEIL_DIV(K, WARP_SIZE) * WARP_SIZE;
    const size_t smem = (size_t)(V * V + 2 * V + block / WARP_SIZE) * sizeof(float);
    m2rnn_plain_backward_kernel<<<dim3(N, B), block, smem, stream>>>(dP_all, dq_part, dk_part, df, dy, h_all, q, k, v,
                                                                     stride, f, W, clamp, T, N, Nq, K, V);
    cudaCheck(cudaGetLastError());
    m2rnn_plain_dv_kernel<<<(unsigned)CEIL_DIV(BT * N * V, 256L), 256, 0, stream>>>(dv, dP_all, k, stride, BT, N, Nq, K, V);
    cudaCheck(cudaGetLastError());
    const int chunks = token_chunks(BT);
    m2rnn_plain_dw_kernel<<<dim3(CEIL_DIV(N * V * V, 128), chunks), 128, 0, stream>>>(dw_part, dP_all, h_all, T, BT, N, K, V);
    cudaCheck(cudaGetLastError());
    reduce_partials(dW, dw_part, chunks, N * V * V, stream);
    m2rnn_plain_qk_sum_kernel<<<(unsigned)CEIL_DIV(BT * Nq * K, 256L), 256, 0, stream>>>(dq, dk, dq_part, dk_part, stride,
                                                                                         BT, N, Nq, K);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------------------
// the recurrence, whichever implementation runs it

// row stride of the projection output q|k|v|f_raw|g: R rounded up to 8 elements, so every row is 16-byte aligned
static inline int m2rnn_proj_stride(const ModelConfig *c) { return round_up(m2rnn_proj_rows(c), 8); }

#if !FLOATX_IS_FP32
// the tensor-core kernels' view of a layer: q, k, v are columns of the (B,T,CD) conv output
static M2RNNDims m2rnn_dims_of(const ModelConfig *c, int B, int T) {
    const int CD = m2rnn_conv_dim(c);
    M2RNNDims d = {B, T, c->m2rnn.heads, c->m2rnn.qk_heads, c->m2rnn.k, c->m2rnn.v, CD, CD, CD, NULL};
    return d;
}
#endif

// whether this layer shape runs on the tensor-core kernels
static int m2rnn_use_fast(const ModelConfig *c, const Runtime *rt) {
#if FLOATX_IS_FP32
    return 0;
#else
    if (rt->plain_recurrence) { return 0; }
    const M2RNNDims d = m2rnn_dims_of(c, 1, 1);
    return m2rnn_check_dims(&d) == NULL;
#endif
}

// bytes the forward keeps for the backward: the kernels' workspace (fast) or every H_t (plain)
static size_t m2rnn_saved_bytes(const ModelConfig *c, int B, int T, int fast) {
#if !FLOATX_IS_FP32
    if (fast) {
        const M2RNNDims d = m2rnn_dims_of(c, B, T);
        return m2rnn_workspace_bytes(&d);
    }
#endif
    return m2rnn_plain_saved_floats((long)B * T, c->m2rnn.heads, c->m2rnn.k, c->m2rnn.v) * sizeof(float);
}

// y (B,T,N·V) from q, k, v (columns of conv_act) and f; saved: what m2rnn_saved_bytes sized
static void m2rnn_recurrence_forward(floatX *y, void *saved, const floatX *conv_act, const float *f, const floatX *W,
                                     const ModelConfig *c, int B, int T, int fast, const Runtime *rt) {
    const int Nq = c->m2rnn.qk_heads, K = c->m2rnn.k, CD = m2rnn_conv_dim(c);
    const floatX *q = conv_act, *k = conv_act + Nq * K, *v = conv_act + 2 * Nq * K;
#if !FLOATX_IS_FP32
    if (fast) {
        const M2RNNDims d = m2rnn_dims_of(c, B, T);
        m2rnn_forward(y, NULL, saved, q, k, v, f, W, NULL, &d, rt->stream);
        return;
    }
#endif
    m2rnn_plain_forward(y, (float *)saved, NULL, NULL, 0, q, k, v, CD, f, W, B, T, c->m2rnn.heads, Nq, K, c->m2rnn.v,
                        rt->stream);
}

// dq, dk, dv into d_conv_act (written), df (written), dW += (the gradient); d_W32: (N,V,V) fp32 scratch for the fast
// path, rec_scratch: m2rnn_plain_scratch_floats for the plain one
static void m2rnn_recurrence_backward(floatX *d_conv_act, float *df, float *dW, float *d_W32, float *rec_scratch,
                                      const floatX *dy, const void *saved, const floatX *conv_act, const float *f,
                                      const floatX *W, const ModelConfig *c, int B, int T, int fast, const Runtime *rt) {
    const int Nq = c->m2rnn.qk_heads, K = c->m2rnn.k, CD = m2rnn_conv_dim(c);
    const floatX *q = conv_act, *k = conv_act + Nq * K, *v = conv_act + 2 * Nq * K;
    floatX *dq = d_conv_act, *dk = d_conv_act + Nq * K, *dv = d_conv_act + 2 * Nq * K;
#if !FLOATX_IS_FP32
    if (fast) {
        const M2RNNDims d = m2rnn_dims_of(c, B, T);
        m2rnn_backward(dq, dk, dv, df, d_W32, NULL, (void *)saved, dy, NULL, q, k, v, f, W, c->m2rnn.grad_clamp, &d,
                       rt->stream);
        accumulate_f32(dW, d_W32, (long)c->m2rnn.heads * c->m2rnn.v * c->m2rnn.v, rt->stream);
        return;
    }
#endif
    m2rnn_plain_backward(dq, dk, dv, df, dW, rec_scratch, (const float *)saved, dy, q, k, v, CD, f, W,
                         c->m2rnn.grad_clamp, B, T, c->m2rnn.heads, Nq, K, c->m2rnn.v, rt->stream);
}

// ----------------------------------------------------------------------------------------------------------------
// the mixer

typedef struct {
    floatX *proj;     // (B,T,Rs) q|k|v|f_raw|g, rows Rs = m2rnn_proj_stride apart
    floatX *conv_pre; // (B,T,CD)
    floatX *conv_act; // (B,T,CD) q|k|v after SiLU
    float *f;         // (B,T,N)
    floatX *y;        // (B,T,N·V) Hᵀq + v ⊙ D
    floatX *gated;    // (B,T,N·V)
    floatX *normed;   // (B,T,N·V)
    float *rstd;      // (B,T,G) G = m2rnn_norm_groups (1 unless group_norm)
    void *rec_saved;  // the recurrence's saved state (m2rnn_saved_bytes)
} M2RNNActs;

static size_t m2rnn_acts_layout(M2RNNActs *a, void *base, const ModelConfig *c, int B, int T, const Runtime *rt) {
    const size_t BT = (size_t)B * T, CD = m2rnn_conv_dim(c), N = c->m2rnn.heads, NV = N * c->m2rnn.v;
    DeviceArena ar = {(char *)base, 0};
    a->proj = TAKE_X(&ar, BT * m2rnn_proj_stride(c));
    a->conv_pre = TAKE_X(&ar, BT * CD);
    a->conv_act = TAKE_X(&ar, BT * CD);
    a->f = TAKE_F(&ar, BT * N);
    a->y = TAKE_X(&ar, BT * NV);
    a->gated = TAKE_X(&ar, BT * NV);
    a->normed = TAKE_X(&ar, BT * NV);
    a->rstd = TAKE_F(&ar, BT * m2rnn_norm_groups(c));
    a->rec_saved = take(&ar, m2rnn_saved_bytes(c, B, T, m2rnn_use_fast(c, rt)));
    return ar.used;
}

typedef struct {
    floatX *d_proj, *d_conv_act;         // (B,T,Rs), (B,T,CD)
    floatX *d_y, *d_gated, *d_normed;    // (B,T,N·V)
    float *d_f;                          // (B,T,N)
    float *d_W;                          // (N,V,V) the fast backward's dW before it is added to the gradient
    float *rec_scratch;                  // the plain backward's scratch
    float *reduce;                       // partial sums of the parameter-gradient reductions
} M2RNNScratch;

static size_t m2rnn_scratch_layout(M2RNNScratch *s, void *base, const ModelConfig *c, int B, int T, const Runtime *rt) {
    const size_t BT = (size_t)B * T, CD = m2rnn_conv_dim(c), N = c->m2rnn.heads, V = c->m2rnn.v, NV = N * V;
    DeviceArena ar = {(char *)base, 0};
    s->d_proj = TAKE_X(&ar, BT * m2rnn_proj_stride(c));
    s->d_conv_act = TAKE_X(&ar, BT * CD);
    s->d_y = TAKE_X(&ar, BT * NV);
    s->d_gated = TAKE_X(&ar, BT * NV);
    s->d_normed = TAKE_X(&ar, BT * NV);
    s->d_f = TAKE_F(&ar, BT * N);
    s->d_W = TAKE_F(&ar, N * V * V);
    s->rec_scratch = m2rnn_use_fast(c, rt) ? NULL : TAKE_F(&ar, m2rnn_plain_scratch_floats((long)BT, (int)N, c->m2rnn.k, (int)V));
    const size_t chunks = token_chunks((long)BT);
    size_t reduce = mixer_norm_scratch((long)BT, (int)NV);
    const size_t others[3] = {chunks * CD * c->m2rnn.conv, chunks * 2 * N, chunks * NV};
    for (int i = 0; i < 3; i++) { reduce = others[i] > reduce ? others[i] : reduce; }
    s->reduce = TAKE_F(&ar, reduce);
    return ar.used;
}

static size_t m2rnn_mixer_acts_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    M2RNNActs a;
    return m2rnn_acts_layout(&a, NULL, c, B, T, rt);
}
static size_t m2rnn_mixer_scratch_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    M2RNNScratch s;
    return m2rnn_scratch_layout(&s, NULL, c, B, T, rt);
}

// normed (M, N·V) = the layer's RMSNorm of gated: over all heads, per q/k group with group_norm (the topology-aware
// TP model), or RMSNormTP over the group's heads (tp_norm: a tensor-parallel rank's config); rstd (M, groups)
static void m2rnn_norm_forward(floatX *normed, float *rstd, const floatX *gated, const floatX *norm_w, const ModelConfig *c,
                               long M, TPGroup *tp, cudaStream_t stream) {
    mixer_norm_forward(normed, rstd, gated, norm_w, M, c->m2rnn.heads * c->m2rnn.v, m2rnn_norm_groups(c),
                       c->m2rnn.tp_norm, tp, stream);
}

// out (B,T,C) = M2RNN(inp); the gate reads A_log and dt_bias from the fp32 master weights
static void m2rnn_mixer_forward(floatX *out, void *acts, void *scratch, const floatX *inp, const KindTensors *t,
                                const ModelConfig *c, int B, int T, const Runtime *rt) {
    const M2RNNParams *w = (const M2RNNParams *)t->w;
    const M2RNNParams32 *w32 = (const M2RNNParams32 *)t->w32;
    M2RNNActs a;
    m2rnn_acts_layout(&a, acts, c, B, T, rt);
    const int BT = B * T, C = c->d_model, R = m2rnn_proj_rows(c), Rs = m2rnn_proj_stride(c), CD = m2rnn_conv_dim(c);
    const int N = c->m2rnn.heads, NV = N * c->m2rnn.v, off_v = 2 * c->m2rnn.qk_heads * c->m2rnn.k;
    cudaStream_t stream = rt->stream;
    matmul_forward_strided(a.proj, Rs, inp, w->in_w, BT, C, R, rt);
    conv1d_silu_forward(a.conv_pre, a.conv_act, a.proj, w->conv_w, NULL, B, T, CD, c->m2rnn.conv, Rs, stream);
    decay_gate_forward(a.f, a.proj + CD, w32->A_log, w32->dt_bias, BT, N, Rs, stream);
    m2rnn_recurrence_forward(a.y, a.rec_saved, a.conv_act, a.f, w->W, c, B, T, m2rnn_use_fast(c, rt), rt);
    output_gate_forward(a.y, a.gated, a.conv_act + off_v, a.proj + CD + N, w->D, BT, NV, CD, Rs, stream);
    m2rnn_norm_forward(a.normed, a.rstd, a.gated, w->norm_w, c, BT, t->tp, stream);
    matmul_forward(out, a.normed, w->out_w, BT, NV, C, rt);
}

// dinp (B,T,C) written; dout (B,T,C)
static void m2rnn_mixer_backward(floatX *dinp, void *scratch, const floatX *dout, const floatX *inp, const void *acts,
                                 const KindTensors *t, const ModelConfig *c, int B, int T, const Runtime *rt) {
    const M2RNNParams *w = (const M2RNNParams *)t->w;
    const M2RNNParams32 *w32 = (const M2RNNParams32 *)t->w32, *g = (const M2RNNParams32 *)t->g;
    M2RNNActs a;
    m2rnn_acts_layout(&a, (void *)acts, c, B, T, rt);
    M2RNNScratch s;
    m2rnn_scratch_layout(&s, scratch, c, B, T, rt);
    const int BT = B * T, C = c->d_model, R = m2rnn_proj_rows(c), Rs = m2rnn_proj_stride(c), CD = m2rnn_conv_dim(c);
    const int N = c->m2rnn.heads, NV = N * c->m2rnn.v, off_v = 2 * c->m2rnn.qk_heads * c->m2rnn.k;
    cudaStream_t stream = rt->stream;
    matmul_backward(s.d_normed, g->out_w, dout, a.normed, w->out_w, BT, NV, C, 0, rt);
    mixer_norm_backward(s.d_gated, g->norm_w, s.reduce, s.d_normed, a.gated, w->norm_w, a.rstd, BT, NV,
                        m2rnn_norm_groups(c), c->m2rnn.tp_norm, t->tp, stream);
    output_gate_backward(s.d_y, s.d_proj + CD + N, s.d_gated, a.y, a.proj + CD + N, BT, NV, Rs, stream);
    m2rnn_recurrence_backward(s.d_conv_act, s.d_f, g->W, s.d_W, s.rec_scratch, s.d_y, a.rec_saved, a.conv_act, a.f,
                              w->W, c, B, T, m2rnn_use_fast(c, rt), rt);
    residual_backward(s.d_conv_act + off_v, g->D, s.reduce, s.d_y, a.conv_act + off_v, w->D, BT, NV, CD, stream);
    decay_gate_backward(s.d_proj + CD, g->A_log, g->dt_bias, s.reduce, s.d_f, a.f, a.proj + CD, w32->A_log,
                        w32->dt_bias, BT, N, Rs, stream);
    conv1d_silu_backward(s.d_proj, g->conv_w, NULL, s.reduce, s.d_conv_act, a.conv_pre, a.proj, w->conv_w, B, T, CD,
                         c->m2rnn.conv, Rs, stream);
    matmul_backward_strided(dinp, g->in_w, s.d_proj, Rs, inp, w->in_w, BT, C, R, 0, rt);
}

// a sequence's decode state: the conv window (W−1, CD) then H (N,K,V), fp32 (the CPU's order)
static size_t m2rnn_mixer_state_bytes(const ModelConfig *c, int context) {
    return m2rnn_decode_state(c, context) * sizeof(float);
}

// The step's conv (CD channels, its window updated) and decay gate (N heads) in one launch, a thread a channel or a
// head: conv1d_silu_step_channel and decay_gate_value, so the same bits as conv1d_silu_step + decay_gate_forward.
// grid (B, CEIL_DIV(CD + N, 128)), 128 threads; proj (B, Rs) rows: the conv's CD inputs, then the N gate inputs.
__global__ void m2rnn_step_prep_kernel(floatX *act, float *window, long state_stride, float *f, const floatX *proj,
                                       const floatX *conv_w, const float *A_log, const float *dt_bias, int CD, int W,
                                       int N, int Rs) {
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    const int b = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i < CD) {
        conv1d_silu_step_channel(act, window + (long)b * state_stride, proj, conv_w, NULL, b, i, CD, W, Rs);
    } else if (i < CD + N) {
        const int n = i - CD;
        f[(long)b * N + n] = decay_gate_value(to_float(proj[(long)b * Rs + CD + n]), A_log[n], dt_bias[n]);
    }
}
static void m2rnn_step_prep(floatX *act, float *window, long state_stride, float *f, const floatX *proj,
                            const floatX *conv_w, const float *A_log, const float *dt_bias, int B, int CD, int W,
                            int N, int Rs, cudaStream_t stream) {
    launch_k(m2rnn_step_prep_kernel, dim3(B, CEIL_DIV(CD + N, 128)), 128, 0, stream, act, window, state_stride, f,
             proj, conv_w, A_log, dt_bias, CD, W, N, Rs);
}

// The same work as m2rnn_step_prep in the in-projection's epilogue (up to GEMV_MAX_M sequences: the GEMV with the norm
// in its prologue, common.cuh), one launch fewer a layer: output row o < CD is channel o's conv input, CD ≤ o < CD + N
// head o − CD's decay gate input, and the lane that holds row o of sequence m makes its conv output and shifts its
// window (conv1d_silu_step_out) or makes its gate (decay_gate_value) from the rounded product, so the same bits as the
// product followed by m2rnn_step_prep (test_decode_gpu). The window values, taps and gate parameters are read before
// the GEMV's dependency wait (nothing before it in the step writes them). Conv widths up to CONV_MAX_W (the lane's
// window and taps are registers).
struct M2RNNStepEpilogue {
    static constexpr bool ACTIVE = true;
    floatX *act;              // (M, CD) the conv's SiLU outputs
    float *window;            // sequence m's (W−1, CD) window at window + m·stride, fp32, shifted by one token
    long stride;
    const floatX *conv_w;     // (CD, W)
    float *f;                 // (M, N) the decay gates
    const float *A_log, *dt_bias; // (N)
    int CD, W, N;
    float win[CONV_MAX_W - 1], tap[CONV_MAX_W - 1], tap_last, a_log, dtb; // the lane's operands
    __device__ __forceinline__ void load(int lane, int o0, int R, int M) {
        const int m = lane / R, o = o0 + lane % R;
        if (m >= M) { return; }
        if (o < CD) {
            const float *s = window + (long)m * stride;
            const floatX *wc = conv_w + (long)o * W;
#pragma unroll
            for (int j = 0; j < CONV_MAX_W - 1; j++) {
                if (j < W - 1) {
                    win[j] = s[(long)j * CD + o];
                    tap[j] = to_float(wc[j]);
                }
            }
            tap_last = to_float(wc[W - 1]);
        } else if (o < CD + N) {
            a_log = A_log[o - CD];
            dtb = dt_bias[o - CD];
        }
    }
    __device__ __forceinline__ void apply(int m, int o, floatX y) {
        const float xc = to_float(y);
        if (o < CD) {
            act[(long)m * CD + o] = conv1d_silu_step_out<CONV_MAX_W>([&](int j) { return win[j]; },
                                                                     [&](int j) { return tap[j]; }, tap_last, 0.0f,
                                                                     xc, W);
            float *s = window + (long)m * stride;
#pragma unroll
            for (int j = 0; j + 1 < CONV_MAX_W - 1; j++) {
                if (j + 1 < W - 1) { s[(long)j * CD + o] = win[j + 1]; }
            }
            if (W > 1) { s[(long)(W - 2) * CD + o] = xc; }
        } else if (o < CD + N) {
            f[(long)m * N + (o - CD)] = decay_gate_value(xc, a_log, dtb);
        }
    }
};

#if !FLOATX_IS_FP32
// The output gate in the step kernel's epilogue (m2rnn_step_kernel's Epi), at every batch size: the thread that sums
// y of (sequence b, head n, column j) makes gated = (y + v·D) ⊙ SiLU(g) by output_gate_value, the gate kernel's
// arithmetic on the same rounded y (the same bits). Above GEMV_MAX_M sequences that is one launch fewer a layer; at up
// to GEMV_MAX_M the out-projection's prologue then only normalizes the gated row, instead of every one of its blocks
// gating y first (batch 1: 0.471 → 0.465 ms a step, batch 4: 0.876 → 0.791 on an H200; NOTES.md, inference round 20).
// The CTA's v, g and D (HPB·V elements each) are staged by cp.async at the kernel's start, under the state's loads.
struct M2RNNGateEpilogue {
    static constexpr int E = 64; // elements staged a tensor (HPB·V ≤ 64)
    static constexpr int SMEM = 3 * E * (int)sizeof(floatX);
    floatX *gated;       // (B, NV)
    const floatX *v, *g; // sequence b's rows at b·sv, b·sg elements; head n's V at n·V
    long sv, sg;
    const floatX *D;     // (NV), or NULL (no residual)
    int NV, V, per_cta;  // N·V, the head dim, HPB·V
    __device__ __forceinline__ void stage(unsigned char *smem, int b, int n0) const {
        const int pairs = per_cta / 2, copies = (D != NULL ? 3 : 2) * pairs; // 4-byte pieces (element pairs)
        for (int t = threadIdx.x; t < copies; t += blockDim.x) {
            const int which = t / pairs, e = 2 * (t % pairs), j = n0 * V + e;
            if (j >= NV) { continue; } // (a CTA's spare head)
            const floatX *src = which == 0 ? v + (long)b * sv + j : which == 1 ? g + (long)b * sg + j : D + j;
            tiles::cp_async4(tiles::smem_addr(smem + (size_t)(which * E + e) * sizeof(floatX)), src);
        }
        tiles::cp_async_commit();
    }
    __device__ __forceinline__ void apply(const unsigned char *smem, int e, size_t i, floatX *y, floatX yb) const {
        const floatX *st = (const floatX *)smem, zero = (floatX)0.0f;
        const bool has_d = D != NULL;
        floatX yv;
        gated[i] = output_gate_value(&yv, yb, has_d ? st[e] : zero, st[E + e], has_d ? st[2 * E + e] : zero, has_d);
        y[i] = yv; // (yb itself without D)
    }
};
// the epilogue takes the step's gate where its copies are 4-byte pieces (not with N odd: g's rows then start at an odd
// element, CD + N; M2RNN_STEP_GATE=0: never, for A/B runs)
static bool m2rnn_gate_epilogue_ok(const M2RNNGateEpilogue *e) {
    static int env = -1;
    return env_on_unless_0(&env, "M2RNN_STEP_GATE") && e->per_cta <= M2RNNGateEpilogue::E && e->per_cta % 2 == 0 &&
           e->sv % 2 == 0 && e->sg % 2 == 0 &&
           ((uintptr_t)e->v | (uintptr_t)e->g | (uintptr_t)e->D) % 4 == 0;
}
#endif

// One token of B sequences: the forward's ops at T = 1 from the state; the recurrence by the step kernel of
// m2rnn_kernels.cuh (the training kernels' numerics) or the plain kernel from and back into the state.
static void m2rnn_mixer_step(floatX *out, void *state, void *work, StepInput *in, const KindTensors *t,
                             const ModelConfig *c, int B, const int *pos, int context, const Runtime *rt) {
    const M2RNNParams *w = (const M2RNNParams *)t->w;
    const M2RNNParams32 *w32 = (const M2RNNParams32 *)t->w32;
    M2RNNActs a;
    m2rnn_acts_layout(&a, work, c, B, 1, rt);
    const int C = c->d_model, R = m2rnn_proj_rows(c), Rs = m2rnn_proj_stride(c), CD = m2rnn_conv_dim(c);
    const int N = c->m2rnn.heads, K = c->m2rnn.k, V = c->m2rnn.v, NV = N * V, Nq = c->m2rnn.qk_heads;
    const long stride = (long)(m2rnn_mixer_state_bytes(c, context) / sizeof(float));
    float *window = (float *)state, *H = window + (size_t)(c->m2rnn.conv - 1) * CD;
    cudaStream_t stream = rt->stream;
    // the conv and the decay gate in the in-projection's epilogue where the GEMV takes the product, else their kernel
    const M2RNNStepEpilogue epi = {a.conv_act, window, stride, w->conv_w, a.f, w32->A_log, w32->dt_bias, CD,
                                   c->m2rnn.conv, N};
    if (!step_product(a.proj, Rs, in, w->in_w, B, C, R, rt, c->m2rnn.conv <= CONV_MAX_W ? &epi : NULL)) {
        m2rnn_step_prep(a.conv_act, window, stride, a.f, a.proj, w->conv_w, w32->A_log, w32->dt_bias, B, CD,
                        c->m2rnn.conv, N, Rs, stream);
    }
    const floatX *q = a.conv_act, *k = a.conv_act + Nq * K, *v = a.conv_act + 2 * Nq * K, *g = a.proj + CD + N;
    bool gated = false; // a.gated made by the step kernel's epilogue
#if !FLOATX_IS_FP32
    if (m2rnn_use_fast(c, rt)) {
        M2RNNDims d = m2rnn_dims_of(c, B, 1);
        const M2RNNGateEpilogue ge = {a.gated, v, g, CD, Rs, w->D, NV, V, m2rnn_step_heads_per_cta(K) * V};
        gated = rt->decode_step && m2rnn_gate_epilogue_ok(&ge);
        if (gated) {
            m2rnn_step(a.y, H, stride, q, k, v, a.f, w->W, &d, stream, ge);
        } else {
            m2rnn_step(a.y, H, stride, q, k, v, a.f, w->W, &d, stream);
        }
    } else
#endif
    {
        m2rnn_plain_forward(a.y, NULL, H, H, stride, q, k, v, CD, a.f, w->W, B, 1, N, Nq, K, V, stream);
    }
    if (rt->decode_step && m2rnn_norm_groups(c) == 1 && c->m2rnn.tp_norm <= 1) {
        // the norm (and the output gate where the step kernel did not make it) in the out-projection's prologue (up to
        // GEMV_MAX_M sequences): the same bits as the kernels below, one or two launches fewer (y is not updated)
        const GemvNorm n = gated ? GemvNorm{a.gated, NULL, w->norm_w, NULL, a.rstd}
                                 : GemvNorm{a.y, NULL, w->norm_w, NULL, a.rstd, v, g, w->D, CD, Rs};
        if (matmul_gemv_launch<false>(out, C, NULL, w->out_w, B, NV, C, &n, stream)) { return; }
    }
    if (!gated) { output_gate_forward(a.y, a.gated, v, g, w->D, B, NV, CD, Rs, stream); }
    m2rnn_norm_forward(a.normed, a.rstd, a.gated, w->norm_w, c, B, NULL, stream);
    step_branch_product(out, in, a.normed, w->out_w, B, NV, C, rt);
}

// B sequences advance by T tokens (a prefill chunk): the forward's kernels from the states (the conv from each window,
// the recurrence from each H: the tensor-core forward, one sequence at a time since its h0/hT are (B,N,K,V) dense, or
// the plain one with the state stride), both left updated
static void m2rnn_mixer_advance(floatX *out, void *state, void *work, const floatX *inp, const KindTensors *t,
                                const ModelConfig *c, int B, int T, const int *pos, int context, const Runtime *rt) {
    const M2RNNParams *w = (const M2RNNParams *)t->w;
    const M2RNNParams32 *w32 = (const M2RNNParams32 *)t->w32;
    M2RNNActs a;
    m2rnn_acts_layout(&a, work, c, B, T, rt);
    const int BT = B * T, C = c->d_model, R = m2rnn_proj_rows(c), Rs = m2rnn_proj_stride(c), CD = m2rnn_conv_dim(c);
    const int N = c->m2rnn.heads, K = c->m2rnn.k, V = c->m2rnn.v, NV = N * V, Nq = c->m2rnn.qk_heads;
    const long stride = (long)(m2rnn_mixer_state_bytes(c, context) / sizeof(float));
    float *window = (float *)state, *H = window + (size_t)(c->m2rnn.conv - 1) * CD;
    cudaStream_t stream = rt->stream;
    matmul_forward_strided(a.proj, Rs, inp, w->in_w, BT, C, R, rt);
    conv1d_silu_advance(a.conv_pre, a.conv_act, window, stride, a.proj, w->conv_w, NULL, B, T, CD, c->m2rnn.conv, Rs, stream);
    decay_gate_forward(a.f, a.proj + CD, w32->A_log, w32->dt_bias, BT, N, Rs, stream);
    const floatX *q = a.conv_act, *k = a.conv_act + Nq * K, *v = a.conv_act + 2 * Nq * K;
#if !FLOATX_IS_FP32
    if (m2rnn_use_fast(c, rt)) {
        const M2RNNDims d = m2rnn_dims_of(c, 1, T);
        for (int b = 0; b < B; b++) {
            const long r0 = (long)b * T;
            float *Hb = H + (long)b * stride;
            m2rnn_forward(a.y + r0 * NV, Hb, NULL, q + r0 * CD, k + r0 * CD, v + r0 * CD, a.f + r0 * N, w->W, Hb, &d,
                          stream);
        }
    } else
#endif
    {
        m2rnn_plain_forward(a.y, NULL, H, H, stride, q, k, v, CD, a.f, w->W, B, T, N, Nq, K, V, stream);
    }
    output_gate_forward(a.y, a.gated, v, a.proj + CD + N, w->D, BT, NV, CD, Rs, stream);
    m2rnn_norm_forward(a.normed, a.rstd, a.gated, w->norm_w, c, BT, NULL, stream);
    matmul_forward(out, a.normed, w->out_w, BT, NV, C, rt);
}

static const KindOps M2RNN_OPS = {'M', m2rnn_mixer_acts_bytes, m2rnn_mixer_scratch_bytes, m2rnn_mixer_forward,
                                  m2rnn_mixer_backward, m2rnn_mixer_state_bytes, m2rnn_mixer_step,
                                  m2rnn_mixer_advance};

#endif // M2RNN_M2RNN_CUH
