/*
swiglu.cuh: the SwiGLU feed-forward (the s row of layers.h) on the GPU, mirroring ref/swiglu.h: up = x W_upᵀ (rows
gate | up, cuBLASLt), h = SiLU(gate) ⊙ up (one pointwise kernel with 16-byte loads), out = h W_downᵀ; the backward in
reverse; the decode step is the forward on one token per sequence (for a few sequences with the SwiGLU in the
up-projection's epilogue).
*/
#ifndef M2RNN_SWIGLU_CUH
#define M2RNN_SWIGLU_CUH

#include "common.cuh"

typedef struct { SWIGLU_PARAMS(VIEW_FIELD) } SwiGLUParams;      // the layer's tensors, in the layers.h row's order
typedef struct { SWIGLU_PARAMS(VIEW_FIELD_32) } SwiGLUParams32; // their gradients

// ----------------------------------------------------------------------------------------------------------------
// the pointwise part: h = SiLU(up[:, :F]) ⊙ up[:, F:]

// one block per token row; VEC: F % PACK == 0, so every row of up, h and dup is 16-byte aligned
template <bool VEC>
__global__ void swiglu_forward_kernel(floatX *h, const floatX *up, int F) {
    pdl_wait(); // (a decode step launches it programmatically: cuda_common.h)
    pdl_trigger();
    const floatX *u = up + (long)blockIdx.x * 2 * F;
    floatX *o = h + (long)blockIdx.x * F;
    if (VEC) {
        for (int j = threadIdx.x * PACK; j < F; j += blockDim.x * PACK) {
            const Pack g = *(const Pack *)(u + j), l = *(const Pack *)(u + F + j);
            Pack out;
            for (int k = 0; k < PACK; k++) { out.v[k] = (floatX)(silu_f(to_float(g.v[k])) * to_float(l.v[k])); }
            *(Pack *)(o + j) = out;
        }
    } else {
        for (int j = threadIdx.x; j < F; j += blockDim.x) { o[j] = (floatX)(silu_f(to_float(u[j])) * to_float(u[F + j])); }
    }
}

template <bool VEC>
__global__ void swiglu_backward_kernel(floatX *dup, const floatX *dh, const floatX *up, int F) {
    const floatX *u = up + (long)blockIdx.x * 2 * F, *g = dh + (long)blockIdx.x * F;
    floatX *d = dup + (long)blockIdx.x * 2 * F;
    if (VEC) {
        for (int j = threadIdx.x * PACK; j < F; j += blockDim.x * PACK) {
            const Pack gate = *(const Pack *)(u + j), lin = *(const Pack *)(u + F + j), gj = *(const Pack *)(g + j);
            Pack dgate, dlin;
            for (int k = 0; k < PACK; k++) {
                const float a = to_float(gate.v[k]), b = to_float(lin.v[k]), c = to_float(gj.v[k]);
                dgate.v[k] = (floatX)(c * b * silu_grad_f(a));
                dlin.v[k] = (floatX)(c * silu_f(a));
            }
            *(Pack *)(d + j) = dgate;
            *(Pack *)(d + F + j) = dlin;
        }
    } else {
        for (int j = threadIdx.x; j < F; j += blockDim.x) {
            const float gate = to_float(u[j]), lin = to_float(u[F + j]), gj = to_float(g[j]);
            d[j] = (floatX)(gj * lin * silu_grad_f(gate));
            d[F + j] = (floatX)(gj * silu_f(gate));
        }
    }
}

static void swiglu_pointwise_forward(floatX *h, const floatX *up, int M, int F, cudaStream_t stream) {
    if (F % PACK == 0) { launch_k(swiglu_forward_kernel<true>, M, 256, 0, stream, h, up, F); }
    else { launch_k(swiglu_forward_kernel<false>, M, 256, 0, stream, h, up, F); }
}
static void swiglu_pointwise_backward(floatX *dup, const floatX *dh, const floatX *up, int M, int F, cudaStream_t stream) {
    if (F % PACK == 0) { swiglu_backward_kernel<true><<<M, 256, 0, stream>>>(dup, dh, up, F); }
    else { swiglu_backward_kernel<false><<<M, 256, 0, stream>>>(dup, dh, up, F); }
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------------------
// the feed-forward

typedef struct {
    floatX *up; // (B,T,2F) gate | up
    floatX *h;  // (B,T,F)
} SwiGLUActs;

static size_t swiglu_acts_layout(SwiGLUActs *a, void *base, const ModelConfig *c, int B, int T) {
    const size_t BT = (size_t)B * T, F = (size_t)c->swiglu.hidden;
    DeviceArena ar = {(char *)base, 0};
    a->up = TAKE_X(&ar, BT * 2 * F);
    a->h = TAKE_X(&ar, BT * F);
    return ar.used;
}
static size_t swiglu_ffn_acts_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    SwiGLUActs a;
    return swiglu_acts_layout(&a, NULL, c, B, T);
}
// the backward's d_up and d_h: the same shapes
static size_t swiglu_ffn_scratch_bytes(const ModelConfig *c, int B, int T, const Runtime *rt) {
    return swiglu_ffn_acts_bytes(c, B, T, rt);
}

static void swiglu_ffn_forward(floatX *out, void *acts, void *scratch, const floatX *inp, const KindTensors *t,
                               const ModelConfig *c, int B, int T, const Runtime *rt) {
    const SwiGLUParams *w = (const SwiGLUParams *)t->w;
    SwiGLUActs a;
    swiglu_acts_layout(&a, acts, c, B, T);
    const int BT = B * T, C = c->d_model, F = c->swiglu.hidden;
    matmul_forward(a.up, inp, w->up_w, BT, C, 2 * F, rt);
    swiglu_pointwise_forward(a.h, a.up, BT, F, rt->stream);
    matmul_forward(out, a.h, w->down_w, BT, F, C, rt);
}

static void swiglu_ffn_backward(floatX *dinp, void *scratch, const floatX *dout, const floatX *inp, const void *acts,
                                const KindTensors *t, const ModelConfig *c, int B, int T, const Runtime *rt) {
    const SwiGLUParams *w = (const SwiGLUParams *)t->w;
    const SwiGLUParams32 *g = (const SwiGLUParams32 *)t->g;
    SwiGLUActs a, d;
    swiglu_acts_layout(&a, (void *)acts, c, B, T);
    swiglu_acts_layout(&d, scratch, c, B, T);
    const int BT = B * T, C = c->d_model, F = c->swiglu.hidden;
    matmul_backward(d.h, g->down_w, dout, a.h, w->down_w, BT, F, C, 0, rt);
    swiglu_pointwise_backward(d.up, d.h, a.up, BT, F, rt->stream);
    matmul_backward(dinp, g->up_w, d.up, inp, w->up_w, BT, C, 2 * F, 0, rt);
}

static size_t swiglu_ffn_state_bytes(const ModelConfig *c, int context) { return 0; }

// the forward on one token a sequence; a decode step of up to GEMV_MAX_M sequences takes the SwiGLU in the
// up-projection's epilogue and the input's norm in its prologue (step_product_glu: the same bits as the norm, the
// product and the pointwise kernel, one launch)
static void swiglu_ffn_step(floatX *out, void *state, void *work, StepInput *in, const KindTensors *t,
                            const ModelConfig *c, int B, const int *pos, int context, const Runtime *rt) {
    const SwiGLUParams *w = (const SwiGLUParams *)t->w;
    SwiGLUActs a;
    swiglu_acts_layout(&a, work, c, B, 1);
    const int C = c->d_model, F = c->swiglu.hidden;
    if (!step_product_glu(a.h, in, w->up_w, B, C, F, rt)) { // else the norm, the up-projection, the SwiGLU
        matmul_forward(a.up, step_input_rows(in, B, C, rt->stream), w->up_w, B, C, 2 * F, rt);
        swiglu_pointwise_forward(a.h, a.up, B, F, rt->stream);
    }
    step_branch_product(out, in, a.h, w->down_w, B, F, C, rt);
}

static const KindOps SWIGLU_OPS = {'s', swiglu_ffn_acts_bytes, swiglu_ffn_scratch_bytes, swiglu_ffn_forward,
                                   swiglu_ffn_backward, swiglu_ffn_state_bytes, swiglu_ffn_step,
                                   NULL}; // stateless: a prefill runs forward

#endif // M2RNN_SWIGLU_CUH
