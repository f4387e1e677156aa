/*
gru.cuh: the GRU baseline (the U row of layers.h) on the GPU, mirroring ref/gru.h (whose comment gives the math and
the variant): projection x_r | x_z | x_n | g, the per-head GRU r = σ(x_r + h U_r), z = σ(x_z + h U_z),
n = tanh(x_n + r ⊙ (h U_n)), h_t = (1 − z) ⊙ n + z ⊙ h_{t−1}, then h ⊙ SiLU(g) (gate.cuh), RMSNorm over N·V and the
output projection; the backward in reverse; the single-token decode step.
The recurrence is a plain fp32 kernel, one CTA per (head, sequence) and one lane per channel (V ≤ 32), the three U in
shared memory, every h_t kept (the backward recomputes the gates from h_{t−1}); the U gradients are summed per
sequence in registers and the sequences' partials in a fixed order: deterministic. Correct and simple, not tuned.
*/
#ifndef M2RNN_GRU_CUH
#define M2RNN_GRU_CUH

#include "common.cuh"
#include "gate.cuh"

typedef struct { GRU_PARAMS(VIEW_FIELD) } GRUParams;      // the layer's tensors, in the layers.h row's order
typedef struct { GRU_PARAMS(VIEW_FIELD_32) } GRUParams32; // their gradients

// ----------------------------------------------------------------------------------------------------------------
// the recurrence

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// grid (N, B), one warp. y (B,T,N·V) floatX = every h_t; h_all (B,T,N,V) fp32 or NULL; x a view with token stride
// x_stride: x_r at column 0, x_z at N·V, x_n at 2·N·V; U_r, U_z, U_n (N,V,V); h0 / hT at b·h_stride floats, or NULL
__global__ void gru_forward_kernel(floatX *y, float *h_all, const float *h0, float *hT, long h_stride, const floatX *x,
                                   int x_stride, const floatX *U_r, const floatX *U_z, const floatX *U_n, int T, int N,
                                   int V) {
    constexpr int VV = VRNN_MAX_HEAD_DIM * VRNN_MAX_HEAD_DIM;
    __shared__ float sUr[VV], sUz[VV], sUn[VV], sh[VRNN_MAX_HEAD_DIM];
    const int n = blockIdx.x, b = blockIdx.y, j = threadIdx.x, NV = N * V;
    const bool active = j < V;
    for (int i = j; i < V * V; i += blockDim.x) {
        sUr[i] = to_float(U_r[(long)n * V * V + i]);
        sUz[i] = to_float(U_z[(long)n * V * V + i]);
        sUn[i] = to_float(U_n[(long)n * V * V + i]);
    }
    float h = (active && h0 != NULL) ? h0[(long)b * h_stride + (long)n * V + j] : 0.0f;
    for (int t = 0; t < T; t++) {
        const long bt = (long)b * T + t;
        if (active) { sh[j] = h; }
        __syncthreads();
        if (active) {
            const floatX *xt = x + bt * x_stride + (long)n * V + j;
            float ar = to_float(xt[0]), az = to_float(xt[NV]), ac = 0.0f;
            for (int i = 0; i < V; i++) {
                ar += sh[i] * sUr[i * V + j];
                az += sh[i] * sUz[i * V + j];
                ac += sh[i] * sUn[i * V + j];
            }
            const float r = sigmoid_f(ar), z = sigmoid_f(az), nn = tanhf(to_float(xt[2 * NV]) + r * ac);
            h = (1.0f - z) * nn + z * h;
            if (h_all != NULL) { h_all[(bt * N + n) * V + j] = h; }
            y[(bt * N + n) * V + j] = (floatX)h;
        }
        __syncthreads();
    }
    if (active && hT != NULL) { hT[(long)b * h_stride + (long)n * V + j] = h; }
}

// grid (N, B), one warp. dx (view, stride x_stride: dx_r | dx_z | dx_n) written; dU_part (3,B,N,V,V) this sequence's
// dU_r, dU_z, dU_n; dy (B,T,N·V) the gradient of every h_t; h_all from the forward (h_{−1} = 0)
__global__ void gru_backward_kernel(floatX *dx, float *dU_part, const floatX *dy, const float *h_all, const floatX *x,
                                    int x_stride, const floatX *U_r, const floatX *U_z, const floatX *U_n, int T, int B,
                                    int N, int V) {
    constexpr int VV = VRNN_MAX_HEAD_DIM * VRNN_MAX_HEAD_DIM;
    __shared__ float sUr[VV], sUz[VV], sUn[VV];
    __shared__ float shp[VRNN_MAX_HEAD_DIM], sdar[VRNN_MAX_HEAD_DIM], sdaz[VRNN_MAX_HEAD_DIM], sdc[VRNN_MAX_HEAD_DIM];
    const int n = blockIdx.x, b = blockIdx.y, j = threadIdx.x, NV = N * V;
    const bool active = j < V;
    for (int i = j; i < V * V; i += blockDim.x) {
        sUr[i] = to_float(U_r[(long)n * V * V + i]);
        sUz[i] = to_float(U_z[(long)n * V * V + i]);
        sUn[i] = to_float(U_n[(long)n * V * V + i]);
    }
    float G = 0.0f, aUr[VRNN_MAX_HEAD_DIM], aUz[VRNN_MAX_HEAD_DIM], aUn[VRNN_MAX_HEAD_DIM];
    for (int i = 0; i < VRNN_MAX_HEAD_DIM; i++) { aUr[i] = aUz[i] = aUn[i] = 0.0f; }
    for (int t = T - 1; t >= 0; t--) {
        const long bt = (long)b * T + t;
        const float hp = (active && t > 0) ? h_all[((bt - 1) * N + n) * V + j] : 0.0f;
        if (active) { shp[j] = hp; }
        __syncthreads();
        float Dt = 0.0f, z = 0.0f, dar = 0.0f, daz = 0.0f, dc = 0.0f;
        if (active) { // the gates again, from h_{t−1}
            const floatX *xt = x + bt * x_stride + (long)n * V + j;
            float ar = to_float(xt[0]), az = to_float(xt[NV]), ac = 0.0f;
            for (int i = 0; i < V; i++) {
                ar += shp[i] * sUr[i * V + j];
                az += shp[i] * sUz[i * V + j];
                ac += shp[i] * sUn[i * V + j];
            }
            const float r = sigmoid_f(ar), nn = tanhf(to_float(xt[2 * NV]) + r * ac);
            z = sigmoid_f(az);
            Dt = to_float(dy[(bt * N + n) * V + j]) + G;
            const float dan = Dt * (1.0f - z) * (1.0f - nn * nn);
            daz = Dt * (hp - nn) * z * (1.0f - z);
            dc = dan * r;
            dar = dan * ac * r * (1.0f - r);
            floatX *dxt = dx + bt * x_stride + (long)n * V + j;
            dxt[0] = (floatX)dar;
            dxt[NV] = (floatX)daz;
            dxt[2 * NV] = (floatX)dan;
            sdar[j] = dar; sdaz[j] = daz; sdc[j] = dc;
        }
        __syncthreads();
        if (active) {
            float g = Dt * z;
            for (int k = 0; k < V; k++) { g += sdar[k] * sUr[j * V + k] + sdaz[k] * sUz[j * V + k] + sdc[k] * sUn[j * V + k]; }
            G = g;
            for (int i = 0; i < V; i++) {
                aUr[i] += shp[i] * dar;
                aUz[i] += shp[i] * daz;
                aUn[i] += shp[i] * dc;
            }
        }
        __syncthreads();
    }
    if (active) {
        const long part = (long)B * N * V * V, o = ((long)b * N + n) * V * V;
        for (int i = 0; i < V; i++) {
            dU_part[o + i * V + j] = aUr[i];
            dU_part[part + o + i * V + j] = aUz[i];
            dU_part[2 * part + o + i * V + j] = aUn[i];
        }
    }
}

// ----------------------------------------------------------------------------------------------------------------
// the mixer

static inline int gru_proj_stride(const ModelConfig *c) { return round_up(4 * c->vrnn.heads * c->vrnn.head_dim, 8); }

typedef struct {
    floatX *proj;   // (B,T,Rs) x_r | x_z | x_n | g
    float *h_all;   // (B,T,N,V) every state
    floatX *y;      // (B,T,NV) every h_t
    floatX *gated, *normed; // (B,T,NV)
    float *rstd;    // (B,T)
} GRUActs;

static size_t gru_acts_layout(GRUActs *a, void *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, NV = (size_t)c->vrnn.heads * c->vrnn.head_dim;
    DeviceArena ar = {(char *)base, 0};
    a->proj = TAKE_X(&ar, BT * gru_proj_stride(c));
    a->h_all = TAKE_F(&ar, BT * NV);
    a->y = TAKE_X(&ar, BT * NV);
    a->gated = TAKE_X(&ar, BT * NV);
    a->normed = TAKE_X(&ar, BT * NV);
    a->rstd = TAKE_F(&ar, BT);
    return ar.used;
}

typedef struct {
    floatX *d_proj, *d_y, *d_gated, *d_normed;
    float *dU_part; // (3,B,N,V,V)
    float *reduce;  // the RMSNorm weight's partial sums
} GRUScratch;

static size_t gru_scratch_layout(GRUScratch *s, void *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, N = c->vrnn.heads, V = c->vrnn.head_dim, NV = N * V;
    DeviceArena ar = {(char *)base, 0};
    s->d_proj = TAKE_X(&ar, BT * gru_proj_stride(c));
    s->d_y = TAKE_X(&ar, BT * NV);
    s->d_gated = TAKE_X(&ar, BT * NV);
    s->d_normed = TAKE_X(&ar, BT * NV);
    s->dU_part = TAKE_F(&ar, 3 * (size_t)B * N * V * V);
    s->reduce = TAKE_F(&ar, mixer_norm_scratch((long)BT, (int)NV));
    return ar.used;
}

static size_t gru_mixer_acts_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    GRUActs a;
    return gru_acts_layout(&a, NULL, c, B, T);
}
static size_t gru_mixer_scratch_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    GRUScratch s;
    return gru_scratch_layout(&s, NULL, c, B, T);
}

static void gru_mixer_forward(floatX *out, void *acts, void *scratch, const floatX *inp, const KindTensors *t,
                              const ModelConfig *c, int B, int T, const Runtime *rt) {
    const GRUParams *w = (const GRUParams *)t->w;
    GRUActs a;
    gru_acts_layout(&a, acts, c, B, T);
    const int BT = B * T, C = c->d_model, N = c->vrnn.heads, V = c->vrnn.head_dim, NV = N * V, Rs = gru_proj_stride(c);
    cudaStream_t stream = rt->stream;
    matmul_forward_strided(a.proj, Rs, inp, w->in_w, BT, C, 4 * NV, rt);
    gru_forward_kernel<<<dim3(N, B), WARP_SIZE, 0, stream>>>(a.y, a.h_all, NULL, NULL, 0, a.proj, Rs, w->U_r, w->U_z,
                                                              w->U_n, T, N, V);
    cudaCheck(cudaGetLastError());
    output_gate_forward(a.y, a.gated, NULL, a.proj + 3 * NV, NULL, BT, NV, 0, Rs, stream);
    mixer_norm_forward(a.normed, a.rstd, a.gated, w->norm_w, BT, NV, 1, c->vrnn.tp_norm, t->tp, stream);
    matmul_forward(out, a.normed, w->out_w, BT, NV, C, rt);
}

static void gru_mixer_backward(floatX *dinp, void *scratch, const floatX *dout, const floatX *inp, const void *acts,
                               const KindTensors *t, const ModelConfig *c, int B, int T, const Runtime *rt) {
    const GRUParams *w = (const GRUParams *)t->w;
    const GRUParams32 *g = (const GRUParams32 *)t->g;
    GRUActs a;
    gru_acts_layout(&a, (void *)acts, c, B, T);
    GRUScratch s;
    gru_scratch_layout(&s, scratch, c, B, T);
    const int BT = B * T, C = c->d_model, N = c->vrnn.heads, V = c->vrnn.head_dim, NV = N * V, Rs = gru_proj_stride(c);
    cudaStream_t stream = rt->stream;
    matmul_backward(s.d_normed, g->out_w, dout, a.normed, w->out_w, BT, NV, C, 0, rt);
    mixer_norm_backward(s.d_gated, g->norm_w, s.reduce, s.d_normed, a.gated, w->norm_w, a.rstd, BT, NV, 1,
                        c->vrnn.tp_norm, t->tp, stream);
    output_gate_backward(s.d_y, s.d_proj + 3 * NV, s.d_gated, a.y, a.proj + 3 * NV, BT, NV, Rs, stream);
    gru_backward_kernel<<<dim3(N, B), WARP_SIZE, 0, stream>>>(s.d_proj, s.dU_part, s.d_y, a.h_all, a.proj, Rs, w->U_r,
                                                               w->U_z, w->U_n, T, B, N, V);
    cudaCheck(cudaGetLastError());
    const size_t part = (size_t)B * N * V * V;
    reduce_partials(g->U_r, s.dU_part, B, N * V * V, stream);
    reduce_partials(g->U_z, s.dU_part + part, B, N * V * V, stream);
    reduce_partials(g->U_n, s.dU_part + 2 * part, B, N * V * V, stream);
    matmul_backward_strided(dinp, g->in_w, s.d_proj, Rs, inp, w->in_w, BT, C, 4 * NV, 0, rt);
}

// a sequence's decode state: h (N,V), fp32
static size_t gru_mixer_state_bytes(const ModelConfig *c, int context) { return gru_decode_state(c, context) * sizeof(float); }

static void gru_mixer_step(floatX *out, void *state, void *work, StepInput *in, const KindTensors *t,
                           const ModelConfig *c, int B, const int *pos, int context, const Runtime *rt) {
    const GRUParams *w = (const GRUParams *)t->w;
    GRUActs a;
    gru_acts_layout(&a, work, c, B, 1);
    const int C = c->d_model, N = c->vrnn.heads, V = c->vrnn.head_dim, NV = N * V, Rs = gru_proj_stride(c);
    cudaStream_t stream = rt->stream;
    float *h = (float *)state;
    step_product(a.proj, Rs, in, w->in_w, B, C, 4 * NV, rt);
    gru_forward_kernel<<<dim3(N, B), WARP_SIZE, 0, stream>>>(a.y, NULL, h, h, (long)NV, a.proj, Rs, w->U_r, w->U_z,
                                                              w->U_n, 1, N, V);
    cudaCheck(cudaGetLastError());
    output_gate_forward(a.y, a.gated, NULL, a.proj + 3 * NV, NULL, B, NV, 0, Rs, stream);
    rmsnorm_forward(a.normed, a.rstd, NULL, a.gated, NULL, w->norm_w, B, NV, stream);
    step_branch_product(out, in, a.normed, w->out_w, B, NV, C, rt);
}

// B sequences advance by T tokens (a prefill chunk): the forward's kernel from and back into each h
static void gru_mixer_advance(floatX *out, void *state, void *work, const floatX *inp, const KindTensors *t,
                              const ModelConfig *c, int B, int T, const int *pos, int context, const Runtime *rt) {
    const GRUParams *w = (const GRUParams *)t->w;
    GRUActs a;
    gru_acts_layout(&a, work, c, B, T);
    const int BT = B * T, C = c->d_model, N = c->vrnn.heads, V = c->vrnn.head_dim, NV = N * V, Rs = gru_proj_stride(c);
    cudaStream_t stream = rt->stream;
    float *h = (float *)state;
    matmul_forward_strided(a.proj, Rs, inp, w->in_w, BT, C, 4 * NV, rt);
    gru_forward_kernel<<<dim3(N, B), WARP_SIZE, 0, stream>>>(a.y, NULL, h, h, (long)NV, a.proj, Rs, w->U_r, w->U_z,
                                                              w->U_n, T, N, V);
    cudaCheck(cudaGetLastError());
    output_gate_forward(a.y, a.gated, NULL, a.proj + 3 * NV, NULL, BT, NV, 0, Rs, stream);
    rmsnorm_forward(a.normed, a.rstd, NULL, a.gated, NULL, w->norm_w, BT, NV, stream);
    matmul_forward(out, a.normed, w->out_w, BT, NV, C, rt);
}

static const KindOps GRU_OPS = {'U', gru_mixer_acts_bytes, gru_mixer_scratch_bytes, gru_mixer_forward,
                                gru_mixer_backward, gru_mixer_state_bytes, gru_mixer_step, gru_mixer_advance};

#endif // M2RNN_GRU_CUH
