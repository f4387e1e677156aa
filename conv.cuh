/*
conv.cuh: the depthwise causal conv1d with SiLU on the GPU, mirroring ref/conv.h (same names): M²RNN and the RNN
baseline run it over their projected inputs, GDN and Mamba-2 too. pre[t, c] = Σ_{j<W} w[c, j] · x[t − (W−1) + j, c]
(+ bias[c]: Mamba-2's conv_b; every function takes `bias`, NULL = none), zeros before t = 0; act = SiLU(pre). x is a
view with row stride x_stride; pre, act are dense. The backward gathers (no atomics) and reduces the weight (and bias)
gradient through fixed-order per-chunk partials: deterministic. Rows of whole 16-byte pieces and W ≤ 4 take the
register form (a thread walks a run of tokens for one 16-byte piece of channels; same sums as the element kernels, bit
for bit but for dx's last bits: test_mamba2_gpu); the rest the element kernels. The decode step
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

// ----------------------------------------------------------------------------------------------------------------
// the 16-byte form (every row a whole number of 16-byte pieces, W ≤ CONV_MAX_W): a thread takes one piece (PACK
// channels) of a run of consecutive tokens of the flattened B·T, the taps' weights and the last W−1 inputs in
// registers, one 16-byte load and two 16-byte stores a token; the forward's sums and the weight gradient's partials
// are the element kernels' bit for bit (same terms, same order). The element kernels above, one block a token and
// 2-byte accesses, ran at 4-5× their bytes' floor (ncu, H200, GDN's conv at B·T = 32768, CD = 2048: forward 0.36 ms,
// dx 0.54, weight gradient 0.43).
#define CONV_MAX_W 4     // widths of the register form (the element kernels take wider ones)
#define CONV_FWD_TOK 32  // tokens a thread walks in the forward (the backward walks TOKEN_CHUNK: one partial row)

// wr[k] = w[c, W−1−k]: the weight of the input k tokens back (k < W; 0 past W)
__device__ __forceinline__ void conv_load_taps(float (*wr)[PACK], const floatX *w, int c0, int W) {
#pragma unroll
    for (int k = 0; k < CONV_MAX_W; k++) {
#pragma unroll
        for (int e = 0; e < PACK; e++) { wr[k][e] = k < W ? to_float(w[(c0 + e) * W + W - 1 - k]) : 0.0f; }
    }
}
__device__ __forceinline__ void conv_unpack(float *dst, const floatX *src) {
    const Pack p = *(const Pack *)src;
#pragma unroll
    for (int e = 0; e < PACK; e++) { dst[e] = to_float(p.v[e]); }
}

// grid (CEIL_DIV(B·T, CONV_FWD_TOK), CEIL_DIV(CD / PACK, 128)), 128 threads; as conv1d_silu_forward_kernel
__global__ void __launch_bounds__(128) conv1d_silu_forward_vec_kernel(floatX *pre, floatX *act, const floatX *x,
                                                                      const floatX *w, const floatX *bias, long BT,
                                                                      int T, int CD, int W, int x_stride) {
    const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) * PACK;
    if (c0 >= CD) { return; }
    const long bt0 = (long)blockIdx.x * CONV_FWD_TOK, bt1 = min(bt0 + CONV_FWD_TOK, BT);
    float wr[CONV_MAX_W][PACK], b0[PACK], xs[CONV_MAX_W][PACK]; // xs[k]: the input k tokens back (xs[0] this one)
#pragma unroll
    for (int e = 0; e < PACK; e++) { b0[e] = bias != NULL ? to_float(bias[c0 + e]) : 0.0f; }
    conv_load_taps(wr, w, c0, W);
    int t = (int)(bt0 % T);
#pragma unroll
    for (int k = 1; k < CONV_MAX_W; k++) {
        if (k < W && t - k >= 0) {
            conv_unpack(xs[k], x + (bt0 - k) * x_stride + c0);
        } else {
#pragma unroll
            for (int e = 0; e < PACK; e++) { xs[k][e] = 0.0f; }
        }
    }
    for (long bt = bt0; bt < bt1; bt++) {
        conv_unpack(xs[0], x + bt * x_stride + c0);
        Pack p, a;
#pragma unroll
        for (int e = 0; e < PACK; e++) {
            float acc = b0[e];
#pragma unroll
            for (int k = CONV_MAX_W - 1; k >= 0; k--) { // j = W−1−k ascending: the element kernel's order
                if (k < W && t - k >= 0) { acc += wr[k][e] * xs[k][e]; }
            }
            p.v[e] = (floatX)acc;
            a.v[e] = (floatX)silu_f(to_float(p.v[e]));
        }
        *(Pack *)(pre + bt * CD + c0) = p;
        *(Pack *)(act + bt * CD + c0) = a;
#pragma unroll
        for (int k = CONV_MAX_W - 1; k > 0; k--) {
#pragma unroll
            for (int e = 0; e < PACK; e++) { xs[k][e] = xs[k - 1][e]; }
        }
        t = t + 1 == T ? 0 : t + 1;
    }
}

// grid (token_chunks(B·T), CEIL_DIV(CD / PACK, 128)), 128 threads: chunk blockIdx.x's dx rows and its partial rows of
// the weight (and bias) gradient, as conv1d_silu_backward_dx_kernel and conv1d_weight_grad_kernel. dx sums the taps
// in the element kernel's order but of dpre = dact ⊙ SiLU'(pre) formed once a token (the element kernel multiplies
// w · dact · SiLU'(pre) term by term): the last bits differ from it, the partials do not.
__global__ void __launch_bounds__(128) conv1d_silu_backward_vec_kernel(floatX *dx, float *partial, float *bias_partial,
                                                                       const floatX *dact, const floatX *pre,
                                                                       const floatX *x, const floatX *w, long BT, int T,
                                                                       int CD, int W, int x_stride) {
    const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) * PACK, chunk = blockIdx.x;
    if (c0 >= CD) { return; }
    const long bt0 = (long)chunk * TOKEN_CHUNK, bt1 = min(bt0 + TOKEN_CHUNK, BT);
    float wr[CONV_MAX_W][PACK], xs[CONV_MAX_W][PACK], gf[CONV_MAX_W][PACK], dw[CONV_MAX_W][PACK], db[PACK];
    conv_load_taps(wr, w, c0, W);
    auto dpre = [&](float *g, long bt) { // dpre at token bt
        const Pack d = *(const Pack *)(dact + bt * CD + c0), p = *(const Pack *)(pre + bt * CD + c0);
#pragma unroll
        for (int e = 0; e < PACK; e++) { g[e] = to_float(d.v[e]) * silu_grad_f(to_float(p.v[e])); }
    };
    int t = (int)(bt0 % T);
#pragma unroll
    for (int k = 0; k < CONV_MAX_W; k++) {
#pragma unroll
        for (int e = 0; e < PACK; e++) { dw[k][e] = 0.0f; xs[k][e] = 0.0f; gf[k][e] = 0.0f; }
        if (k > 0 && k < W && t - k >= 0) { conv_unpack(xs[k], x + (bt0 - k) * x_stride + c0); }
        if (k < CONV_MAX_W - 1 && bt0 + k < BT) { dpre(gf[k], bt0 + k); } // gf[k]: dpre k tokens ahead (any sequence:
                                                                            // the sums take t + k < T alone)
    }
#pragma unroll
    for (int e = 0; e < PACK; e++) { db[e] = 0.0f; }
    for (long bt = bt0; bt < bt1; bt++) {
        if (bt + CONV_MAX_W - 1 < BT) {
            dpre(gf[CONV_MAX_W - 1], bt + CONV_MAX_W - 1);
        } else {
#pragma unroll
            for (int e = 0; e < PACK; e++) { gf[CONV_MAX_W - 1][e] = 0.0f; }
        }
        conv_unpack(xs[0], x + bt * x_stride + c0);
        Pack o;
#pragma unroll
        for (int e = 0; e < PACK; e++) {
            float acc = 0.0f;
#pragma unroll
            for (int k = CONV_MAX_W - 1; k >= 0; k--) { // j = W−1−k ascending: to = t + k descending
                if (k < W && t + k < T) { acc += wr[k][e] * gf[k][e]; }
            }
            o.v[e] = (floatX)acc;
            const float g = gf[0][e];
            db[e] += g;
#pragma unroll
            for (int k = CONV_MAX_W - 1; k >= 0; k--) { // j = W−1−k ascending, as the element kernel
                if (k < W && t - k >= 0) { dw[k][e] += g * xs[k][e]; }
            }
        }
        *(Pack *)(dx + bt * x_stride + c0) = o;
#pragma unroll
        for (int k = CONV_MAX_W - 1; k > 0; k--) { // the inputs one token further back
#pragma unroll
            for (int e = 0; e < PACK; e++) { xs[k][e] = xs[k - 1][e]; }
        }
#pragma unroll
        for (int k = 0; k + 1 < CONV_MAX_W; k++) { // dpre one token nearer
#pragma unroll
            for (int e = 0; e < PACK; e++) { gf[k][e] = gf[k + 1][e]; }
        }
        t = t + 1 == T ? 0 : t + 1;
    }
#pragma unroll
    for (int e = 0; e < PACK; e++) {
#pragma unroll
        for (int k = 0; k < CONV_MAX_W; k++) {
            if (k < W) { partial[((long)chunk * CD + c0 + e) * W + W - 1 - k] = dw[k][e]; }
        }
        if (bias_partial != NULL) { bias_partial[(long)chunk * CD + c0 + e] = db[e]; }
    }
}

// the 16-byte form applies: whole 16-byte pieces in every row of every operand, and a width it holds in registers
static inline bool conv_vec(int CD, int W, int x_stride, const void *a, const void *b, const void *c, const void *d) {
    const uintptr_t any = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d;
    return W <= CONV_MAX_W && CD % PACK == 0 && x_stride % PACK == 0 && (any & 15) == 0;
}

// pre, act (B,T,CD); x view (B,T,CD) with row stride x_stride; w (CD, W); bias (CD) or NULL
static void conv1d_silu_forward(floatX *pre, floatX *act, const floatX *x, const floatX *w, const floatX *bias, int B,
                                int T, int CD, int W, int x_stride, cudaStream_t stream) {
    const long BT = (long)B * T;
    if (conv_vec(CD, W, x_stride, pre, act, x, x)) {
        const dim3 grid((unsigned)CEIL_DIV(BT, (long)CONV_FWD_TOK), CEIL_DIV(CD / PACK, 128));
        conv1d_silu_forward_vec_kernel<<<grid, 128, 0, stream>>>(pre, act, x, w, bias, BT, T, CD, W, x_stride);
    } else {
        conv1d_silu_forward_kernel<<<B * T, 256, 0, stream>>>(pre, act, x, w, bias, T, CD, W, x_stride);
    }
    cudaCheck(cudaGetLastError());
}

// dx (view, stride x_stride) = ...; dw (CD, W) += ...; dbias (CD) += ... when not NULL; scratch:
// token_chunks(B·T)·CD·(W + 1) floats with a bias, token_chunks(B·T)·CD·W without
static void conv1d_silu_backward(floatX *dx, float *dw, float *dbias, float *scratch, const floatX *dact,
                                 const floatX *pre, const floatX *x, const floatX *w, int B, int T, int CD, int W,
                                 int x_stride, cudaStream_t stream) {
    const int chunks = token_chunks((long)B * T);
    float *bias_partial = dbias != NULL ? scratch + (size_t)chunks * CD * W : NULL;
    if (conv_vec(CD, W, x_stride, dx, dact, pre, x)) {
        conv1d_silu_backward_vec_kernel<<<dim3(chunks, CEIL_DIV(CD / PACK, 128)), 128, 0, stream>>>(
            dx, scratch, bias_partial, dact, pre, x, w, (long)B * T, T, CD, W, x_stride);
    } else {
        conv1d_silu_backward_dx_kernel<<<B * T, 256, 0, stream>>>(dx, dact, pre, w, T, CD, W, x_stride);
        cudaCheck(cudaGetLastError());
        conv1d_weight_grad_kernel<<<dim3(CEIL_DIV(CD, 128), chunks), 128, 0, stream>>>(scratch, bias_partial, dact, pre,
                                                                                       x, B, T, CD, W, x_stride);
    }
    cudaCheck(cudaGetLastError());
    reduce_partials(dw, scratch, chunks, CD * W, stream);
    if (dbias != NULL) { reduce_partials(dbias, bias_partial, chunks, CD, stream); }
}

// One token of B sequences: act (B, CD) = SiLU(conv) over the new input x (B rows, stride x_stride) and the last W−1
// inputs of each sequence in state (fp32 (W−1, CD), state_stride floats apart), which then shifts by one token. The
// sum runs in the forward's order and pre is rounded to floatX as the forward stores it, so act matches the forward.
// The output of one channel: SiLU of bias + Σ_{j<W−1} tap(j)·win(j) + tap_last·xc in that order, win(j) the
// window's value j (oldest first), tap(j) tap j as float; MAXW > 0: at most MAXW taps, the loop unrolled (win and tap
// may read registers: the M²RNN in-projection's epilogue), 0: any W. Then channel c of sequence b (s: that sequence's
// window): the kernel below, and fused into a mixer's step kernels.
template <int MAXW, class WinAt, class TapAt>
__device__ __forceinline__ floatX conv1d_silu_step_out(WinAt win, TapAt tap, float tap_last, float bias, float xc,
                                                       int W) {
    float acc = bias;
    if constexpr (MAXW > 0) {
#pragma unroll
        for (int j = 0; j < MAXW - 1; j++) {
            if (j < W - 1) { acc += tap(j) * win(j); }
        }
    } else {
        for (int j = 0; j < W - 1; j++) { acc += tap(j) * win(j); }
    }
    acc += tap_last * xc;
    return (floatX)silu_f(to_float((floatX)acc));
}
__device__ __forceinline__ void conv1d_silu_step_channel(floatX *act, float *s, const floatX *x, const floatX *w,
                                                         const floatX *bias, int b, int c, int CD, int W,
                                                         int x_stride) {
    const float xc = to_float(x[(long)b * x_stride + c]);
    const floatX *wc = w + (long)c * W;
    act[(long)b * CD + c] = conv1d_silu_step_out<0>([&](int j) { return s[j * CD + c]; },
                                                    [&](int j) { return to_float(wc[j]); }, to_float(wc[W - 1]),
                                                    bias != NULL ? to_float(bias[c]) : 0.0f, xc, W);
    for (int j = 0; j + 1 < W - 1; j++) { s[j * CD + c] = s[(j + 1) * CD + c]; }
    if (W > 1) { s[(W - 2) * CD + c] = xc; }
}
__global__ void conv1d_silu_step_kernel(floatX *act, float *state, long state_stride, const floatX *x, const floatX *w,
                                        const floatX *bias, int CD, int W, int x_stride) {
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    const int b = blockIdx.x;
    float *s = state + (long)b * state_stride;
    for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < CD; c += gridDim.y * blockDim.x) {
        conv1d_silu_step_channel(act, s, x, w, bias, b, c, CD, W, x_stride);
    }
}

// bias (CD) or NULL
static void conv1d_silu_step(floatX *act, float *state, long state_stride, const floatX *x, const floatX *w,
                             const floatX *bias, int B, int CD, int W, int x_stride, cudaStream_t stream) {
    // a block per (sequence, 128 channels): a decode step has few sequences, and a block looping over a whole row
    // pays a dependent round of loads per 256 channels (11 µs a layer at B=1 on an H200, NOTES.md)
    launch_k(conv1d_silu_step_kernel, dim3(B, CEIL_DIV(CD, 128)), 128, 0, stream, act, state, state_stride, x, w, bias,
             CD, W, x_stride);
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
