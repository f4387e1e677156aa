/*
gate.cuh: the gates the recurrent mixers share, on the GPU, mirroring ref/gate.h (same names):
- the softplus decay gate of M²RNN and the RNN baseline, f = exp(−exp(A_log) · softplus(f_raw + dt_bias)), fp32;
- the output gate: y += v ⊙ D (the residual around the recurrence; absent for the GRU), gated = y ⊙ SiLU(g);
with their backward passes, whose parameter-gradient reductions run through fixed-order partials: deterministic.
*/
#ifndef M2RNN_GATE_CUH
#define M2RNN_GATE_CUH

#include "common.cuh"

// ----------------------------------------------------------------------------------------------------------------
// the decay gate f = exp(−exp(A_log) · softplus(f_raw + dt_bias)), in fp32 (spec §1 item 2; kept fp32 for the
// recurrence, see m2rnn_kernels.cuh)

// f = exp(−exp(A_log) · softplus(f_raw + dt_bias)) of one (token, head); the kernel below, and fused into the M²RNN
// step's prep kernel
__device__ __forceinline__ float decay_gate_value(float f_raw, float A_log, float dt_bias) {
    const float dt = softplus_f(f_raw + dt_bias);
    return expf(-expf(A_log) * dt);
}
// one block per token
__global__ void decay_gate_forward_kernel(float *f, const floatX *f_raw, const float *A_log, const float *dt_bias,
                                          int N, int stride) {
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    const long m = blockIdx.x;
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
        f[m * N + n] = decay_gate_value(to_float(f_raw[m * stride + n]), A_log[n], dt_bias[n]);
    }
}

// df_raw (view) = ...; partials per token chunk of dA_log and ddt_bias: partial (2, chunks, N)
__global__ void decay_gate_backward_kernel(floatX *df_raw, float *partial, const float *df, const float *f,
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
static void decay_gate_forward(float *f, const floatX *f_raw, const float *A_log, const float *dt_bias, long BT,
                               int N, int stride, cudaStream_t stream) {
    launch_k(decay_gate_forward_kernel, (unsigned)BT, 128, 0, stream, f, f_raw, A_log, dt_bias, N, stride);
}

// dA_log (N) and ddt_bias (N) += ...; scratch: token_chunks(BT)·2·N floats
static void decay_gate_backward(floatX *df_raw, float *dA_log, float *ddt_bias, float *scratch, const float *df,
                                const float *f, const floatX *f_raw, const float *A_log, const float *dt_bias,
                                long BT, int N, int stride, cudaStream_t stream) {
    const int chunks = token_chunks(BT);
    decay_gate_backward_kernel<<<dim3(CEIL_DIV(N, 64), chunks), 64, 0, stream>>>(df_raw, scratch, df, f, f_raw, A_log,
                                                                                 dt_bias, BT, N, stride);
    cudaCheck(cudaGetLastError());
    reduce_partials(dA_log, scratch, chunks, N, stream);
    reduce_partials(ddt_bias, scratch + (size_t)chunks * N, chunks, N, stream);
}

// ----------------------------------------------------------------------------------------------------------------
// the output gate: y += v ⊙ D (the residual around the recurrence; skipped when D is NULL);  gated = y ⊙ SiLU(g)

// one block per token
__global__ void output_gate_forward_kernel(floatX *y, floatX *gated, const floatX *v, const floatX *g,
                                                 const floatX *D, int NV, int v_stride, int g_stride) {
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    const long m = blockIdx.x;
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < NV; j += gridDim.y * blockDim.x) {
        const long i = m * NV + j;
        floatX yv;
        gated[i] = output_gate_value(&yv, y[i], D != NULL ? v[m * v_stride + j] : (floatX)0.0f, g[m * g_stride + j],
                                     D != NULL ? D[j] : (floatX)0.0f, D != NULL);
        if (D != NULL) { y[i] = yv; }
    }
}

// dy = dgated ⊙ SiLU(g) (the recurrence's dy); dg (view) = dgated ⊙ y ⊙ SiLU'(g)
__global__ void output_gate_backward_kernel(floatX *dy, floatX *dg, const floatX *dgated, const floatX *y,
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
__global__ void residual_backward_kernel(floatX *dv, float *partial, const floatX *dy, const floatX *v,
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

static void output_gate_forward(floatX *y, floatX *gated, const floatX *v, const floatX *g, const floatX *D,
                                      long BT, int NV, int v_stride, int g_stride, cudaStream_t stream) {
    // few rows (a decode step): the row split over blocks too, a thread an element (the loop's stores to y would
    // otherwise serialize its loads: a dependent round per 256 elements)
    const unsigned split = BT < 256 ? (unsigned)CEIL_DIV(NV, 256) : 1u;
    launch_k(output_gate_forward_kernel, dim3((unsigned)BT, split), 256, 0, stream, y, gated, v, g, D, NV, v_stride,
             g_stride);
}

static void output_gate_backward(floatX *dy, floatX *dg, const floatX *dgated, const floatX *y, const floatX *g,
                                       long BT, int NV, int g_stride, cudaStream_t stream) {
    output_gate_backward_kernel<<<(unsigned)BT, 256, 0, stream>>>(dy, dg, dgated, y, g, NV, g_stride);
    cudaCheck(cudaGetLastError());
}

// dv (view) += dy ⊙ D after the recurrence wrote its dv; dD (NV) += Σ dy ⊙ v; scratch: token_chunks(BT)·NV floats
static void residual_backward(floatX *dv, float *dD, float *scratch, const floatX *dy, const floatX *v,
                                    const floatX *D, long BT, int NV, int v_stride, cudaStream_t stream) {
    const int chunks = token_chunks(BT);
    residual_backward_kernel<<<dim3(CEIL_DIV(NV, 128), chunks), 128, 0, stream>>>(dv, scratch, dy, v, D, BT, NV,
                                                                                        v_stride);
    cudaCheck(cudaGetLastError());
    reduce_partials(dD, scratch, chunks, NV, stream);
}

#endif // M2RNN_GATE_CUH
