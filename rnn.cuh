/*
rnn.cuh: the vector RNN baseline (the R row of layers.h) on the GPU, mirroring ref/rnn.h (whose comment gives the math
and the variant): projection u | f_raw | g, conv + SiLU on u (conv.cuh), the decay gate (gate.cuh), the recurrence
h_t = f h_{t−1} + (1 − f) tanh(h_{t−1} W + u_t), the output gate y = h + u ⊙ D, y ⊙ SiLU(g), RMSNorm over N·V, the
output projection; the backward in reverse; the single-token decode step.
The recurrence is a plain fp32 kernel, one CTA per (head, sequence) and one lane per channel (V ≤ 32), W in shared
memory, every h_t kept for the backward; dW is summed per sequence in registers and the sequences' partials in a
fixed order: deterministic. A baseline's kernel: correct and simple, not tuned.
*/
#ifndef M2RNN_RNN_CUH
#define M2RNN_RNN_CUH

#include "common.cuh"
#include "conv.cuh"
#include "gate.cuh"

typedef struct { RNN_PARAMS(VIEW_FIELD) } RNNParams;      // the layer's tensors, in the layers.h row's order
typedef struct { RNN_PARAMS(VIEW_FIELD_32) } RNNParams32; // their gradients or fp32 master weights

// ----------------------------------------------------------------------------------------------------------------
// the recurrence

// grid (N, B), one warp. y (B,T,N·V) floatX = every h_t; h_all (B,T,N,V) fp32 = every h_t or NULL; u a view with
// token stride u_stride; f (B,T,N); W (N,V,V); h0 / hT: sequence b's (N,V) state at b·h_stride floats, or NULL
__global__ void rnn_forward_kernel(floatX *y, float *h_all, const float *h0, float *hT, long h_stride, const floatX *u,
                                   int u_stride, const float *f, const floatX *W, int T, int N, int V) {
    __shared__ float sW[VRNN_MAX_HEAD_DIM * VRNN_MAX_HEAD_DIM], sh[VRNN_MAX_HEAD_DIM];
    const int n = blockIdx.x, b = blockIdx.y, j = threadIdx.x;
    const bool active = j < V;
    for (int i = j; i < V * V; i += blockDim.x) { sW[i] = to_float(W[(long)n * V * V + i]); }
    float h = (active && h0 != NULL) ? h0[(long)b * h_stride + (long)n * V + j] : 0.0f;
    for (int t = 0; t < T; t++) {
        const long bt = (long)b * T + t;
        if (active) { sh[j] = h; }
        __syncthreads();
        if (active) {
            float p = to_float(u[bt * u_stride + (long)n * V + j]);
            for (int i = 0; i < V; i++) { p += sh[i] * sW[i * V + j]; }
            const float ft = f[bt * N + n];
            h = ft * h + (1.0f - ft) * tanhf(p);
            if (h_all != NULL) { h_all[(bt * N + n) * V + j] = h; }
            y[(bt * N + n) * V + j] = (floatX)h;
        }
        __syncthreads();
    }
    if (active && hT != NULL) { hT[(long)b * h_stride + (long)n * V + j] = h; }
}

// grid (N, B), one warp. du (view, token stride u_stride) = dp (written); df (B,T,N) written; dW_part (B,N,V,V) this
// sequence's dW; dy (B,T,N·V) the gradient of every h_t; h_all from the forward (h_{−1} = 0)
__global__ void rnn_backward_kernel(floatX *du, float *df, float *dW_part, const floatX *dy, const float *h_all,
                                    const floatX *u, int u_stride, const float *f, const floatX *W, int T, int N,
                                    int V) {
    __shared__ float sW[VRNN_MAX_HEAD_DIM * VRNN_MAX_HEAD_DIM], shp[VRNN_MAX_HEAD_DIM], sdp[VRNN_MAX_HEAD_DIM];
    const int n = blockIdx.x, b = blockIdx.y, j = threadIdx.x;
    const bool active = j < V;
    for (int i = j; i < V * V; i += blockDim.x) { sW[i] = to_float(W[(long)n * V * V + i]); }
    float G = 0.0f, accW[VRNN_MAX_HEAD_DIM];
    for (int i = 0; i < VRNN_MAX_HEAD_DIM; i++) { accW[i] = 0.0f; }
    for (int t = T - 1; t >= 0; t--) {
        const long bt = (long)b * T + t;
        const float hp = (active && t > 0) ? h_all[((bt - 1) * N + n) * V + j] : 0.0f;
        if (active) { shp[j] = hp; }
        __syncthreads();
        const float ft = f[bt * N + n];
        float Dt = 0.0f, dp = 0.0f, dfj = 0.0f;
        if (active) {
            float p = to_float(u[bt * u_stride + (long)n * V + j]);
            for (int i = 0; i < V; i++) { p += shp[i] * sW[i * V + j]; }
            const float z = tanhf(p);
            Dt = to_float(dy[(bt * N + n) * V + j]) + G;
            dp = Dt * (1.0f - ft) * (1.0f - z * z);
            dfj = Dt * (hp - z);
            du[bt * u_stride + (long)n * V + j] = (floatX)dp;
            sdp[j] = dp;
        }
        const float dft = warp_reduce_sum(dfj);
        if (j == 0) { df[bt * N + n] = dft; }
        __syncthreads();
        if (active) {
            float g = ft * Dt;
            for (int k = 0; k < V; k++) { g += sdp[k] * sW[j * V + k]; }
            G = g;
            for (int i = 0; i < V; i++) { accW[i] += shp[i] * dp; }
        }
        __syncthreads();
    }
    if (active) {
        float *out = dW_part + ((long)b * N + n) * V * V;
        for (int i = 0; i < V; i++) { out[i * V + j] = accW[i]; }
    }
}

// ----------------------------------------------------------------------------------------------------------------
// the mixer

static inline int rnn_proj_rows(const ModelConfig *c) { return 2 * c->vrnn.heads * c->vrnn.head_dim + c->vrnn.heads; }
static inline int rnn_proj_stride(const ModelConfig *c) { return round_up(rnn_proj_rows(c), 8); }

typedef struct {
    floatX *proj;     // (B,T,Rs) u | f_raw | g
    floatX *conv_pre; // (B,T,NV)
    floatX *u;        // (B,T,NV) after SiLU
    float *f;         // (B,T,N)
    float *h_all;     // (B,T,N,V) every state
    floatX *y;        // (B,T,NV) h + u ⊙ D
    floatX *gated, *normed; // (B,T,NV)
    float *rstd;      // (B,T)
} RNNActs;

static size_t rnn_acts_layout(RNNActs *a, void *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, N = c->vrnn.heads, NV = N * c->vrnn.head_dim;
    DeviceArena ar = {(char *)base, 0};
    a->proj = TAKE_X(&ar, BT * rnn_proj_stride(c));
    a->conv_pre = TAKE_X(&ar, BT * NV);
    a->u = TAKE_X(&ar, BT * NV);
    a->f = TAKE_F(&ar, BT * N);
    a->h_all = TAKE_F(&ar, BT * NV);
    a->y = TAKE_X(&ar, BT * NV);
    a->gated = TAKE_X(&ar, BT * NV);
    a->normed = TAKE_X(&ar, BT * NV);
    a->rstd = TAKE_F(&ar, BT);
    return ar.used;
}

typedef struct {
    floatX *d_proj, *d_u, *d_y, *d_gated, *d_normed;
    float *d_f;    // (B,T,N)
    float *dW_part; // (B,N,V,V)
    float *reduce; // partial sums of the parameter-gradient reductions
} RNNScratch;

static size_t rnn_scratch_layout(RNNScratch *s, void *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, N = c->vrnn.heads, V = c->vrnn.head_dim, NV = N * V;
    DeviceArena ar = {(char *)base, 0};
    s->d_proj = TAKE_X(&ar, BT * rnn_proj_stride(c));
    s->d_u = TAKE_X(&ar, BT * NV);
    s->d_y = TAKE_X(&ar, BT * NV);
    s->d_gated = TAKE_X(&ar, BT * NV);
    s->d_normed = TAKE_X(&ar, BT * NV);
    s->d_f = TAKE_F(&ar, BT * N);
    s->dW_part = TAKE_F(&ar, (size_t)B * N * V * V);
    const size_t chunks = token_chunks((long)BT);
    size_t reduce = mixer_norm_scratch((long)BT, (int)NV);
    const size_t others[3] = {chunks * NV * c->vrnn.conv, chunks * 2 * N, chunks * NV};
    for (int i = 0; i < 3; i++) { reduce = others[i] > reduce ? others[i] : reduce; }
    s->reduce = TAKE_F(&ar, reduce);
    return ar.used;
}

static size_t rnn_mixer_acts_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    RNNActs a;
    return rnn_acts_layout(&a, NULL, c, B, T);
}
static size_t rnn_mixer_scratch_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    RNNScratch s;
    return rnn_scratch_layout(&s, NULL, c, B, T);
}

static void rnn_mixer_forward(floatX *out, void *acts, void *scratch, const floatX *inp, const KindTensors *t,
                              const ModelConfig *c, int B, int T, const Runtime *rt) {
    const RNNParams *w = (const RNNParams *)t->w;
    const RNNParams32 *w32 = (const RNNParams32 *)t->w32;
    RNNActs a;
    rnn_acts_layout(&a, acts, c, B, T);
    const int BT = B * T, C = c->d_model, R = rnn_proj_rows(c), Rs = rnn_proj_stride(c);
    const int N = c->vrnn.heads, V = c->vrnn.head_dim, NV = N * V;
    cudaStream_t stream = rt->stream;
    matmul_forward_strided(a.proj, Rs, inp, w->in_w, BT, C, R, rt);
    conv1d_silu_forward(a.conv_pre, a.u, a.proj, w->conv_w, NULL, B, T, NV, c->vrnn.conv, Rs, stream);
    decay_gate_forward(a.f, a.proj + NV, w32->A_log, w32->dt_bias, BT, N, Rs, stream);
    rnn_forward_kernel<<<dim3(N, B), WARP_SIZE, 0, stream>>>(a.y, a.h_all, NULL, NULL, 0, a.u, NV, a.f, w->W, T, N, V);
    cudaCheck(cudaGetLastError());
    output_gate_forward(a.y, a.gated, a.u, a.proj + NV + N, w->D, BT, NV, NV, Rs, stream);
    mixer_norm_forward(a.normed, a.rstd, a.gated, w->norm_w, BT, NV, 1, c->vrnn.tp_norm, t->tp, stream);
    matmul_forward(out, a.normed, w->out_w, BT, NV, C, rt);
}

static void rnn_mixer_backward(floatX *dinp, void *scratch, const floatX *dout, const floatX *inp, const void *acts,
                               const KindTensors *t, const ModelConfig *c, int B, int T, const Runtime *rt) {
    const RNNParams *w = (const RNNParams *)t->w;
    const RNNParams32 *w32 = (const RNNParams32 *)t->w32, *g = (const RNNParams32 *)t->g;
    RNNActs a;
    rnn_acts_layout(&a, (void *)acts, c, B, T);
    RNNScratch s;
    rnn_scratch_layout(&s, scratch, c, B, T);
    const int BT = B * T, C = c->d_model, R = rnn_proj_rows(c), Rs = rnn_proj_stride(c);
    const int N = c->vrnn.heads, V = c->vrnn.head_dim, NV = N * V;
    cudaStream_t stream = rt->stream;
    matmul_backward(s.d_normed, g->out_w, dout, a.normed, w->out_w, BT, NV, C, 0, rt);
    mixer_norm_backward(s.d_gated, g->norm_w, s.reduce, s.d_normed, a.gated, w->norm_w, a.rstd, BT, NV, 1,
                        c->vrnn.tp_norm, t->tp, stream);
    output_gate_backward(s.d_y, s.d_proj + NV + N, s.d_gated, a.y, a.proj + NV + N, BT, NV, Rs, stream);
    // y = h + u ⊙ D: d_y is the gradient of every h_t; the recurrence writes du, the residual adds d_y ⊙ D
    rnn_backward_kernel<<<dim3(N, B), WARP_SIZE, 0, stream>>>(s.d_u, s.d_f, s.dW_part, s.d_y, a.h_all, a.u, NV, a.f,
                                                               w->W, T, N, V);
    cudaCheck(cudaGetLastError());
    reduce_partials(g->W, s.dW_part, B, N * V * V, stream);
    residual_backward(s.d_u, g->D, s.reduce, s.d_y, a.u, w->D, BT, NV, NV, stream);
    decay_gate_backward(s.d_proj + NV, g->A_log, g->dt_bias, s.reduce, s.d_f, a.f, a.proj + NV, w32->A_log,
                        w32->dt_bias, BT, N, Rs, stream);
    conv1d_silu_backward(s.d_proj, g->conv_w, NULL, s.reduce, s.d_u, a.conv_pre, a.proj, w->conv_w, B, T, NV, c->vrnn.conv,
                         Rs, stream);
    matmul_backward_strided(dinp, g->in_w, s.d_proj, Rs, inp, w->in_w, BT, C, R, 0, rt);
}

// a sequence's decode state: the conv window (W−1, N·V) then h (N,V), fp32 (the CPU's order)
static size_t rnn_mixer_state_bytes(const ModelConfig *c, int context) { return rnn_decode_state(c, context) * sizeof(float); }

static void rnn_mixer_step(floatX *out, void *state, void *work, StepInput *in, const KindTensors *t,
                           const ModelConfig *c, int B, const int *pos, int context, const Runtime *rt) {
    const RNNParams *w = (const RNNParams *)t->w;
    const RNNParams32 *w32 = (const RNNParams32 *)t->w32;
    RNNActs a;
    rnn_acts_layout(&a, work, c, B, 1);
    const int C = c->d_model, R = rnn_proj_rows(c), Rs = rnn_proj_stride(c);
    const int N = c->vrnn.heads, V = c->vrnn.head_dim, NV = N * V;
    const long stride = (long)(rnn_mixer_state_bytes(c, context) / sizeof(float));
    float *window = (float *)state, *h = window + (size_t)(c->vrnn.conv - 1) * NV;
    cudaStream_t stream = rt->stream;
    step_product(a.proj, Rs, in, w->in_w, B, C, R, rt);
    conv1d_silu_step(a.u, window, stride, a.proj, w->conv_w, NULL, B, NV, c->vrnn.conv, Rs, stream);
    decay_gate_forward(a.f, a.proj + NV, w32->A_log, w32->dt_bias, B, N, Rs, stream);
    rnn_forward_kernel<<<dim3(N, B), WARP_SIZE, 0, stream>>>(a.y, NULL, h, h, stride, a.u, NV, a.f, w->W, 1, N, V);
    cudaCheck(cudaGetLastError());
    output_gate_forward(a.y, a.gated, a.u, a.proj + NV + N, w->D, B, NV, NV, Rs, stream);
    rmsnorm_forward(a.normed, a.rstd, NULL, a.gated, NULL, w->norm_w, B, NV, stream);
    step_branch_product(out, in, a.normed, w->out_w, B, NV, C, rt);
}

// B sequences advance by T tokens (a prefill chunk): the forward's kernels from and back into the windows and h
static void rnn_mixer_advance(floatX *out, void *state, void *work, const floatX *inp, const KindTensors *t,
                              const ModelConfig *c, int B, int T, const int *pos, int context, const Runtime *rt) {
    const RNNParams *w = (const RNNParams *)t->w;
    const RNNParams32 *w32 = (const RNNParams32 *)t->w32;
    RNNActs a;
    rnn_acts_layout(&a, work, c, B, T);
    const int BT = B * T, C = c->d_model, R = rnn_proj_rows(c), Rs = rnn_proj_stride(c);
    const int N = c->vrnn.heads, V = c->vrnn.head_dim, NV = N * V;
    const long stride = (long)(rnn_mixer_state_bytes(c, context) / sizeof(float));
    float *window = (float *)state, *h = window + (size_t)(c->vrnn.conv - 1) * NV;
    cudaStream_t stream = rt->stream;
    matmul_forward_strided(a.proj, Rs, inp, w->in_w, BT, C, R, rt);
    conv1d_silu_advance(a.conv_pre, a.u, window, stride, a.proj, w->conv_w, NULL, B, T, NV, c->vrnn.conv, Rs, stream);
    decay_gate_forward(a.f, a.proj + NV, w32->A_log, w32->dt_bias, BT, N, Rs, stream);
    rnn_forward_kernel<<<dim3(N, B), WARP_SIZE, 0, stream>>>(a.y, NULL, h, h, stride, a.u, NV, a.f, w->W, T, N, V);
    cudaCheck(cudaGetLastError());
    output_gate_forward(a.y, a.gated, a.u, a.proj + NV + N, w->D, BT, NV, NV, Rs, stream);
    rmsnorm_forward(a.normed, a.rstd, NULL, a.gated, NULL, w->norm_w, BT, NV, stream);
    matmul_forward(out, a.normed, w->out_w, BT, NV, C, rt);
}

static const KindOps RNN_OPS = {'R', rnn_mixer_acts_bytes, rnn_mixer_scratch_bytes, rnn_mixer_forward,
                                rnn_mixer_backward, rnn_mixer_state_bytes, rnn_mixer_step, rnn_mixer_advance};

#endif // M2RNN_RNN_CUH
