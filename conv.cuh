/*
conv.cuh: the depthwise causal conv1d with SiLU on the GPU, mirroring ref/conv.h (same names): M²RNN and the RNN
baseline run it over their projected inputs, GDN and Mamba-2 too. pre[t, c] = Σ_{j<W} w[c, j] · x[t − (W−1) + j, c]
(+ bias[c]: Mamba-2's conv_b; every function takes `bias`, NULL = none), zeros before t = 0; act = SiLU(pre). x is a view with row stride x_stride; pre, act are dense. The backward gathers
(no atomics) and reduces the weight (and bias) gradient through fixed-order per-chunk partials: deterministic. The decode step
keeps each sequence's last W−1 inputs (fp32, exact copies of the bf16 inputs) and computes what the forward does; the
advance (a prefill chunk of T tokens) continues from the same window.
*/
#ifndef M2RNN_CONV_CUH
#define M2RNN_CONV_CUH

#include "common.cuh"

// ----------------------------------------------------------------------------------------------------------------
// causal depthwise conv + SiLU: pre[t, c] = Σ_j w[c, j] x[t − (W−1) + j, c]; act = SiLU(pre)

// one block per token (b, t): no 64-bit division per element
__global__ void conv1d_silu_forward_kernel(floatX *pre, floatX *act, const floatX *x, const floatX *w,
                                           const floatX *bias, int T, int CD, int W, int x_stride) {
    const long bt = blockIdx.x;
    const int t = (int)(bt % T);
    for (int c = threadIdx.x; c < CD; c += blockDim.x) {
        float acc = bias != NULL ? to_float(bias[c]) : 0.0f;
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

// partial (chunks, CD, W): per chunk of tokens, Σ dpre[t, c] x[t − (W−1) + j, c]; bias_partial (chunks, CD): Σ dpre[t, c]
// (NULL: no bias)
__global__ void conv1d_weight_grad_kernel(float *partial, float *bias_partial, const floatX *dact, const floatX *pre,
                                          const floatX *x, int B, int T, int CD, int W, int x_stride) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (c >= CD) { return; }
    float acc[16], accb = 0.0f;
    for (int j = 0; j < W; j++) { acc[j] = 0.0f; }
    const long begin = (long)chunk * TOKEN_CHUNK, end = min(begin + TOKEN_CHUNK, (long)B * T);
    int t = (int)(begin % T); // advanced alongside bt: no division in the loop
    for (long bt = begin; bt < end; bt++, t = (t + 1 == T) ? 0 : t + 1) {
        const float g = to_float(dact[bt * CD + c]) * silu_grad_f(to_float(pre[bt * CD + c]));
        accb += g;
        for (int j = 0; j < W; j++) {
            const int ts = t - (W - 1) + j;
            if (ts >= 0) { acc[j] += g * to_float(x[(bt - t + ts) * x_stride + c]); }
        }
    }
    for (int j = 0; j < W; j++) { partial[((long)chunk * CD + c) * W + j] = acc[j]; }
    if (bias_partial != NULL) { bias_partial[(long)chunk * CD + c] = accb; }
}

// pre, act (B,T,CD); x view (B,T,CD) with row stride x_stride; w (CD, W); bias (CD) or NULL
static void conv1d_silu_forward(floatX *pre, floatX *act, const floatX *x, const floatX *w, const floatX *bias, int B,
                                int T, int CD, int W, int x_stride, cudaStream_t stream) {
    conv1d_silu_forward_kernel<<<B * T, 256, 0, stream>>>(pre, act, x, w, bias, T, CD, W, x_stride);
    cudaCheck(cudaGetLastError());
}

// dx (view, stride x_stride) = ...; dw (CD, W) += ...; dbias (CD) += ... when not NULL; scratch:
// token_chunks(B·T)·CD·(W + 1) floats with a bias, token_chunks(B·T)·CD·W without
static void conv1d_silu_backward(floatX *dx, float *dw, float *dbias, float *scratch, const floatX *dact,
                                 const floatX *pre, const floatX *x, const floatX *w, int B, int T, int CD, int W,
                                 int x_stride, cudaStream_t stream) {
    conv1d_silu_backward_dx_kernel<<<B * T, 256, 0, stream>>>(dx, dact, pre, w, T, CD, W, x_stride);
    cudaCheck(cudaGetLastError());
    const int chunks = token_chunks((long)B * T);
    float *bias_partial = dbias != NULL ? scratch + (size_t)chunks * CD * W : NULL;
    conv1d_weight_grad_kernel<<<dim3(CEIL_DIV(CD, 128), chunks), 128, 0, stream>>>(scratch, bias_partial, dact, pre, x,
                                                                                   B, T, CD, W, x_stride);
    cudaCheck(cudaGetLastError());
    reduce_partials(dw, scratch, chunks, CD * W, stream);
    if (dbias != NULL) { reduce_partials(dbias, bias_partial, chunks, CD, stream); }
}

// One token of B sequences: act (B, CD) = SiLU(conv) over the new input x (B rows, stride x_stride) and the last W−1
// inputs of each sequence in state (fp32 (W−1, CD), state_stride floats apart), which then shifts by one token. The
// sum runs in the forward's order and pre is rounded to floatX as the forward stores it, so act matches the forward.
__global__ void conv1d_silu_step_kernel(floatX *act, float *state, long state_stride, const floatX *x, const floatX *w,
                                        const floatX *bias, int CD, int W, int x_stride) {
    const int b = blockIdx.x;
    float *s = state + (long)b * state_stride;
    for (int c = threadIdx.x; c < CD; c += blockDim.x) {
        const float xc = to_float(x[(long)b * x_stride + c]);
        float acc = bias != NULL ? to_float(bias[c]) : 0.0f;
        for (int j = 0; j < W - 1; j++) { acc += to_float(w[c * W + j]) * s[j * CD + c]; }
        acc += to_float(w[c * W + W - 1]) * xc;
        act[(long)b * CD + c] = (floatX)silu_f(to_float((floatX)acc));
        for (int j = 0; j + 1 < W - 1; j++) { s[j * CD + c] = s[(j + 1) * CD + c]; }
        if (W > 1) { s[(W - 2) * CD + c] = xc; }
    }
}

// bias (CD) or NULL
static void conv1d_silu_step(floatX *act, float *state, long state_stride, const floatX *x, const floatX *w,
                             const floatX *bias, int B, int CD, int W, int x_stride, cudaStream_t stream) {
    conv1d_silu_step_kernel<<<B, 256, 0, stream>>>(act, state, state_stride, x, w, bias, CD, W, x_stride);
    cudaCheck(cudaGetLastError());
}

// B sequences continuing from their windows: pre, act (B,T,CD) from x (B·T rows of stride x_stride), the taps
// before a sequence's first new token read its window (fp32 (W−1, CD) at b·state_stride: exact copies of the bf16
// inputs, so the sums are the forward's). One block per (b, t).
__global__ void conv1d_silu_advance_kernel(floatX *pre, floatX *act, const float *state, long state_stride,
                                           const floatX *x, const floatX *w, const floatX *bias, int T, int CD, int W,
                                           int x_stride) {
    const long bt = blockIdx.x;
    const int t = (int)(bt % T), b = (int)(bt / T);
    const float *s = state + (long)b * state_stride;
    for (int c = threadIdx.x; c < CD; c += blockDim.x) {
        float acc = bias != NULL ? to_float(bias[c]) : 0.0f;
        for (int j = 0; j < W; j++) {
            const int ts = t - (W - 1) + j;
            const float xv = ts >= 0 ? to_float(x[(bt - t + ts) * x_stride + c]) : s[(W - 1 + ts) * CD + c];
            acc += to_float(w[c * W + j]) * xv;
        }
        const floatX p = (floatX)acc;
        pre[bt * CD + c] = p;
        act[bt * CD + c] = (floatX)silu_f(to_float(p));
    }
}

// then each window becomes the last W−1 inputs of (window ++ the T new rows); thread per (b, c), rows in order
__global__ void conv1d_window_update_kernel(float *state, long state_stride, const floatX *x, int B, int T, int CD, int W,
                                            int x_stride) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)B * CD) { return; }
    const int b = (int)(i / CD), c = (int)(i % CD);
    float *s = state + (long)b * state_stride;
    for (int r = 0; r < W - 1; r++) {
        const int u = T + r; // row of (window ++ new rows) that becomes row r
        s[r * CD + c] = u < W - 1 ? s[u * CD + c] : to_float(x[((long)b * T + u - (W - 1)) * x_stride + c]);
    }
}

// the advance of decoding (ref/conv.h's twin): act, pre (B,T,CD) and the windows updated; bias (CD) or NULL
static void conv1d_silu_advance(floatX *pre, floatX *act, float *state, long state_stride, const floatX *x,
                                const floatX *w, const floatX *bias, int B, int T, int CD, int W, int x_stride,
                                cudaStream_t stream) {
    conv1d_silu_advance_kernel<<<B * T, 256, 0, stream>>>(pre, act, state, state_stride, x, w, bias, T, CD, W,
                                                          x_stride);
    cudaCheck(cudaGetLastError());
    conv1d_window_update_kernel<<<(unsigned)CEIL_DIV((long)B * CD, 256L), 256, 0, stream>>>(state, state_stride, x, B, T,
                                                                                            CD, W, x_stride);
    cudaCheck(cudaGetLastError());
}

#endif // M2RNN_CONV_CUH
