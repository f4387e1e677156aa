/*
m2rnn_layer.cuh: the M²RNN layer's GPU ops around the recurrence, mirroring ref/m2rnn.h: the causal depthwise conv
with SiLU on q|k|v, the softplus decay gate, the residual v ⊙ D with the SiLU(g) output gate, their backward passes,
and a plain fp32 recurrence (one thread per state row, every H_t kept) that serves the fp32 build and any shape the
tensor-core kernels of m2rnn_kernels.cuh do not take. The tensor-core kernels are the fast path of the bf16 build.
All reductions over tokens go through fixed-order partials: deterministic.
*/
#ifndef M2RNN_LAYER_CUH
#define M2RNN_LAYER_CUH

#include "common.cuh"

#define TOKEN_CHUNK 64 // tokens per partial sum in the parameter-gradient reductions (small: enough threads in flight)

// ----------------------------------------------------------------------------------------------------------------
// causal depthwise conv + SiLU: pre[t, c] = Σ_j w[c, j] x[t − (W−1) + j, c]; act = SiLU(pre)

// one block per token (b, t): no 64-bit division per element
__global__ void conv1d_silu_forward_kernel(floatX *pre, floatX *act, const floatX *x, const floatX *w, int T, int CD,
                                           int W, int x_stride) {
    const long bt = blockIdx.x;
    const int t = (int)(bt % T);
    for (int c = threadIdx.x; c < CD; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < W; j++) {
            const int ts = t - (W - 1) + j;
            if (ts >= 0) { acc += to_float(w[c * W + j]) * to_float(x[(bt - t + ts) * x_stride + c]); }
        }
        const floatX p = (floatX)acc;
        pre[bt * CD + c] = p;
        act[bt * CD + c] = (floatX)silu_f(to_float(p));
    }
}

// dx[t, c] = Σ_j w[c, j] dpre[t + (W−1) − j, c] (gather: no atomics), dpre = dact ⊙ SiLU'(pre); one block per token
__global__ void conv1d_silu_backward_dx_kernel(floatX *dx, const floatX *dact, const floatX *pre, const floatX *w,
                                               int T, int CD, int W, int x_stride) {
    const long bt = blockIdx.x;
    const int t = (int)(bt % T);
    for (int c = threadIdx.x; c < CD; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < W; j++) {
            const int to = t + (W - 1) - j;
            if (to < T) {
                const long o = (bt - t + to) * CD + c;
                acc += to_float(w[c * W + j]) * to_float(dact[o]) * silu_grad_f(to_float(pre[o]));
            }
        }
        dx[bt * x_stride + c] = (floatX)acc;
    }
}

// partial (chunks, CD, W): per chunk of tokens, Σ dpre[t, c] x[t − (W−1) + j, c]
__global__ void conv1d_weight_grad_kernel(float *partial, const floatX *dact, const floatX *pre, const floatX *x, int B,
                                          int T, int CD, int W, int x_stride) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (c >= CD) { return; }
    float acc[16];
    for (int j = 0; j < W; j++) { acc[j] = 0.0f; }
    const long begin = (long)chunk * TOKEN_CHUNK, end = min(begin + TOKEN_CHUNK, (long)B * T);
    int t = (int)(begin % T); // advanced alongside bt: no division in the loop
    for (long bt = begin; bt < end; bt++, t = (t + 1 == T) ? 0 : t + 1) {
        const float g = to_float(dact[bt * CD + c]) * silu_grad_f(to_float(pre[bt * CD + c]));
        for (int j = 0; j < W; j++) {
            const int ts = t - (W - 1) + j;
            if (ts >= 0) { acc[j] += g * to_float(x[(bt - t + ts) * x_stride + c]); }
        }
    }
    for (int j = 0; j < W; j++) { partial[((long)chunk * CD + c) * W + j] = acc[j]; }
}

static inline int token_chunks(long BT) { return (int)CEIL_DIV(BT, (long)TOKEN_CHUNK); }

static void conv1d_silu_forward(floatX *pre, floatX *act, const floatX *x, const floatX *w, int B, int T, int CD, int W,
                                int x_stride, cudaStream_t stream) {
    conv1d_silu_forward_kernel<<<B * T, 256, 0, stream>>>(pre, act, x, w, T, CD, W, x_stride);
    cudaCheck(cudaGetLastError());
}

// dx (view, stride x_stride) = ...; dw (CD, W) += ...; scratch: token_chunks(B·T)·CD·W floats
static void conv1d_silu_backward(floatX *dx, float *dw, float *scratch, const floatX *dact, const floatX *pre,
                                 const floatX *x, const floatX *w, int B, int T, int CD, int W, int x_stride,
                                 cudaStream_t stream) {
    conv1d_silu_backward_dx_kernel<<<B * T, 256, 0, stream>>>(dx, dact, pre, w, T, CD, W, x_stride);
    cudaCheck(cudaGetLastError());
    const int chunks = token_chunks((long)B * T);
    conv1d_weight_grad_kernel<<<dim3(CEIL_DIV(CD, 128), chunks), 128, 0, stream>>>(scratch, dact, pre, x, B, T, CD, W,
                                                                                   x_stride);
    cudaCheck(cudaGetLastError());
    reduce_partials(dw, scratch, chunks, CD * W, stream);
}

// ----------------------------------------------------------------------------------------------------------------
// the forget gate f = exp(−exp(A_log) · softplus(f_raw + dt_bias)), in fp32 (spec §1 item 2; kept fp32 for the
// recurrence, see m2rnn_kernels.cuh)

// one block per token
__global__ void m2rnn_gate_forward_kernel(float *f, const floatX *f_raw, const float *A_log, const float *dt_bias,
                                          int N, int stride) {
    const long m = blockIdx.x;
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
        const float dt = softplus_f(to_float(f_raw[m * stride + n]) + dt_bias[n]);
        f[m * N + n] = expf(-expf(A_log[n]) * dt);
    }
}

// df_raw (view) = ...; partials per token chunk of dA_log and ddt_bias: partial (2, chunks, N)
__global__ void m2rnn_gate_backward_kernel(floatX *df_raw, float *partial, const float *df, const float *f,
                                           const floatX *f_raw, const float *A_log, const float *dt_bias, long BT,
                                           int N, int stride) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (n >= N) { return; }
    const float alpha = expf(A_log[n]), bias = dt_bias[n];
    float sum_dA = 0.0f, sum_db = 0.0f;
    const long begin = (long)chunk * TOKEN_CHUNK, end = min(begin + TOKEN_CHUNK, BT);
    for (long m = begin; m < end; m++) {
        const float x = to_float(f_raw[m * stride + n]) + bias;
        const float g = df[m * N + n] * f[m * N + n]; // dL/d(log f)
        const float dx = -g * alpha / (1.0f + expf(-x));
        df_raw[m * stride + n] = (floatX)dx;
        sum_db += dx;
        sum_dA += -g * alpha * softplus_f(x);
    }
    partial[(long)chunk * N + n] = sum_dA;
    partial[((long)gridDim.y + chunk) * N + n] = sum_db;
}

// A_log and dt_bias are read from the fp32 master weights: in bf16 a dt_bias near −4.6 is off by up to 0.016, which
// moves dt = softplus(x + dt_bias) ≈ e^(x + dt_bias) by 1.6% (the authors' bf16 parameters carry that error)
static void m2rnn_gate_forward(float *f, const floatX *f_raw, const float *A_log, const float *dt_bias, long BT,
                               int N, int stride, cudaStream_t stream) {
    m2rnn_gate_forward_kernel<<<(unsigned)BT, 128, 0, stream>>>(f, f_raw, A_log, dt_bias, N, stride);
    cudaCheck(cudaGetLastError());
}

// dA_log (N) and ddt_bias (N) += ...; scratch: token_chunks(BT)·2·N floats
static void m2rnn_gate_backward(floatX *df_raw, float *dA_log, float *ddt_bias, float *scratch, const float *df,
                                const float *f, const floatX *f_raw, const float *A_log, const float *dt_bias,
                                long BT, int N, int stride, cudaStream_t stream) {
    const int chunks = token_chunks(BT);
    m2rnn_gate_backward_kernel<<<dim3(CEIL_DIV(N, 64), chunks), 64, 0, stream>>>(df_raw, scratch, df, f, f_raw, A_log,
                                                                                 dt_bias, BT, N, stride);
    cudaCheck(cudaGetLastError());
    reduce_partials(dA_log, scratch, chunks, N, stream);
    reduce_partials(ddt_bias, scratch + (size_t)chunks * N, chunks, N, stream);
}

// ----------------------------------------------------------------------------------------------------------------
// output path: y += v ⊙ D;  gated = y ⊙ SiLU(g)

// one block per token
__global__ void m2rnn_output_gate_forward_kernel(floatX *y, floatX *gated, const floatX *v, const floatX *g,
                                                 const floatX *D, int NV, int v_stride, int g_stride) {
    const long m = blockIdx.x;
    for (int j = threadIdx.x; j < NV; j += blockDim.x) {
        const long i = m * NV + j;
        const floatX yv = (floatX)(to_float(y[i]) + to_float(v[m * v_stride + j]) * to_float(D[j]));
        y[i] = yv;
        gated[i] = (floatX)(to_float(yv) * silu_f(to_float(g[m * g_stride + j])));
    }
}

// dy = dgated ⊙ SiLU(g) (the recurrence's dy); dg (view) = dgated ⊙ y ⊙ SiLU'(g)
__global__ void m2rnn_output_gate_backward_kernel(floatX *dy, floatX *dg, const floatX *dgated, const floatX *y,
                                                  const floatX *g, int NV, int g_stride) {
    const long m = blockIdx.x;
    for (int j = threadIdx.x; j < NV; j += blockDim.x) {
        const long i = m * NV + j;
        const float gv = to_float(g[m * g_stride + j]), dgt = to_float(dgated[i]);
        dy[i] = (floatX)(dgt * silu_f(gv));
        dg[m * g_stride + j] = (floatX)(dgt * to_float(y[i]) * silu_grad_f(gv));
    }
}

// dv (view) += dy ⊙ D; partial (chunks, NV) of dD = Σ dy ⊙ v
__global__ void m2rnn_residual_backward_kernel(floatX *dv, float *partial, const floatX *dy, const floatX *v,
                                               const floatX *D, long BT, int NV, int v_stride) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (j >= NV) { return; }
    const float d = to_float(D[j]);
    float acc = 0.0f;
    const long begin = (long)chunk * TOKEN_CHUNK, end = min(begin + TOKEN_CHUNK, BT);
    for (long m = begin; m < end; m++) {
        const float g = to_float(dy[m * NV + j]);
        acc += g * to_float(v[m * v_stride + j]);
        dv[m * v_stride + j] = (floatX)(to_float(dv[m * v_stride + j]) + g * d);
    }
    partial[(long)chunk * NV + j] = acc;
}

static void m2rnn_output_gate_forward(floatX *y, floatX *gated, const floatX *v, const floatX *g, const floatX *D,
                                      long BT, int NV, int v_stride, int g_stride, cudaStream_t stream) {
    m2rnn_output_gate_forward_kernel<<<(unsigned)BT, 256, 0, stream>>>(y, gated, v, g, D, NV, v_stride, g_stride);
    cudaCheck(cudaGetLastError());
}

static void m2rnn_output_gate_backward(floatX *dy, floatX *dg, const floatX *dgated, const floatX *y, const floatX *g,
                                       long BT, int NV, int g_stride, cudaStream_t stream) {
    m2rnn_output_gate_backward_kernel<<<(unsigned)BT, 256, 0, stream>>>(dy, dg, dgated, y, g, NV, g_stride);
    cudaCheck(cudaGetLastError());
}

// dv (view) += dy ⊙ D after the recurrence wrote its dv; dD (NV) += Σ dy ⊙ v; scratch: token_chunks(BT)·NV floats
static void m2rnn_residual_backward(floatX *dv, float *dD, float *scratch, const floatX *dy, const floatX *v,
                                    const floatX *D, long BT, int NV, int v_stride, cudaStream_t stream) {
    const int chunks = token_chunks(BT);
    m2rnn_residual_backward_kernel<<<dim3(CEIL_DIV(NV, 128), chunks), 128, 0, stream>>>(dv, scratch, dy, v, D, BT, NV,
                                                                                        v_stride);
    cudaCheck(cudaGetLastError());
    reduce_partials(dD, scratch, chunks, NV, stream);
}

// ----------------------------------------------------------------------------------------------------------------
// the plain recurrence: one block per (b, n), one thread per state row (K ≤ 1024), V ≤ 32 values in registers.
// Keeps every H_t (fp32) for the backward. Exact fp32 arithmetic, no tensor cores, tanhf: the fp32 build's path.

#define PLAIN_MAX_V 32

// y (B,T,N,V); h_all (B,T,N,K,V) fp32; q, k (.., Nq, K) and v (.., N, V) views with token stride `stride`
__global__ void m2rnn_plain_forward_kernel(floatX *y, float *h_all, const floatX *q, const floatX *k, const floatX *v,
                                           int stride, const float *f, const floatX *W, int T, int N, int Nq, int K,
                                           int V) {
    extern __shared__ float sh[]; // W (V, V) | v_t (V) | y partial (warps, V)
    float *Ws = sh, *vs = sh + V * V, *ys = vs + V;
    const int b = blockIdx.y, n = blockIdx.x, r = threadIdx.x, warps = CEIL_DIV(K, WARP_SIZE);
    const int hq = n / (N / Nq), lane = r % WARP_SIZE, warp = r / WARP_SIZE;
    for (int i = r; i < V * V; i += blockDim.x) { Ws[i] = to_float(W[(long)n * V * V + i]); }
    float h[PLAIN_MAX_V];
    for (int j = 0; j < V; j++) { h[j] = 0.0f; }
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
            float *out = h_all + ((bt * N + n) * K + r) * V;
            for (int j = 0; j < V; j++) { h[j] = hn[j]; out[j] = hn[j]; }
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
                if (clamp > 0.0f) { g = fminf(fmaxf(g, -clamp), clamp); }
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

static void m2rnn_plain_forward(floatX *y, float *h_all, const floatX *q, const floatX *k, const floatX *v, int stride,
                                const float *f, const floatX *W, int B, int T, int N, int Nq, int K, int V,
                                cudaStream_t stream) {
    if (V > PLAIN_MAX_V || K > 1024) {
        fail_with_hint("use V <= 32 and K <= 1024", "m2rnn plain recurrence: unsupported K=%d V=%d", K, V);
    }
    const int block = CEIL_DIV(K, WARP_SIZE) * WARP_SIZE;
    const size_t smem = (size_t)(V * V + V + (block / WARP_SIZE) * V) * sizeof(float);
    m2rnn_plain_forward_kernel<<<dim3(N, B), block, smem, stream>>>(y, h_all, q, k, v, stride, f, W, T, N, Nq, K, V);
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

#endif // M2RNN_LAYER_CUH
