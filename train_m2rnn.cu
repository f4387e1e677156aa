/*
train_m2rnn.cu: the CUDA trainer of the M²RNN hybrid on one GPU. The model is the one of model.h (config, pattern,
parameter table, init, checkpoint format), the training run is the one of train_loop.h (CLI, schedule, validation,
samples, checkpoints, exact resume): this file only says how each op runs on the GPU, op for op the same dataflow as
the CPU reference train_m2rnn.c:

  tokens → embedding → L × [ x += Mixer(RMSNorm(x));  x += SwiGLU(RMSNorm(x)) ] → RMSNorm → LM head → cross-entropy

Precision: floatX (bf16; fp32 with make PRECISION=FP32) weights and activations, fp32 master weights, fp32 parameter
gradients and AdamW state, fp32 accumulation everywhere, fp32 recurrent state and gate. The residual add is fused into
the following RMSNorm; the classifier never stores probabilities; the embedding backward is deterministic.
The M²RNN recurrence runs on the tensor-core kernels of m2rnn_kernels.cuh in the bf16 build (K a multiple of 16,
V ∈ {16, 32}) and on the plain fp32 kernels of m2rnn_layer.cuh otherwise.
*/
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "utils.h"          // defines: check macros, fail_with_hint, CLI number parsing
#include "model.h"          // defines: ModelConfig, descriptor parsing, ParamTable, init, FLOP counts, OptimizerConfig
#include "cuda_common.h"    // defines: cudaCheck, floatX, warp reductions
#include "common.cuh"       // defines: cuBLASLt matmul, embedding, RMSNorm, SwiGLU, classifier, AdamW, global norm
#include "attention.cuh"    // defines: causal attention (cuBLAS), RoPE
#include "m2rnn_layer.cuh"  // defines: conv + SiLU, decay gate, output gate, the plain fp32 recurrence
#if !FLOATX_IS_FP32
#include "m2rnn_kernels.cuh" // defines: the tensor-core M²RNN recurrence (forward, backward, step)
#endif

// ----------------------------------------------------------------------------------------------------------------
// parameter views: the same struct shape for the floatX weights and the fp32 gradients

#define PARAM_FIELD_X(name) floatX *name;
#define PARAM_FIELD_F(name) float *name;
typedef struct { PARAM_LAYER_FIELDS(PARAM_FIELD_X) } WeightsLayer;
typedef struct { floatX *wte, *lnf_w, *lm_head; WeightsLayer layers[MAX_LAYERS]; } Weights;
typedef struct { PARAM_LAYER_FIELDS(PARAM_FIELD_F) } GradsLayer;
typedef struct { float *wte, *lnf_w, *lm_head; GradsLayer layers[MAX_LAYERS]; } Grads;

// both are laid out as model_view_slot() expects
static_assert(sizeof(Weights) == sizeof(void *) * (3 + MAX_LAYERS * NUM_LAYER_PARAM_KINDS), "Weights layout");
static_assert(sizeof(Grads) == sizeof(Weights), "Grads layout");

// ----------------------------------------------------------------------------------------------------------------
// activations

typedef struct {
    floatX *resid_in;  // (B,T,C) residual stream entering the layer
    floatX *ln1_out;   // (B,T,C)
    float *ln1_rstd;   // (B,T)
    floatX *resid_mid; // (B,T,C) resid_in + mixer output
    floatX *ln2_out;   // (B,T,C)
    float *ln2_rstd;   // (B,T)
    floatX *mlp_up;    // (B,T,2F)
    floatX *mlp_h;     // (B,T,F)
    // M²RNN
    floatX *proj;      // (B,T,R) q|k|v|f_raw|g
    floatX *conv_pre;  // (B,T,CD)
    floatX *conv_act;  // (B,T,CD) q|k|v after SiLU
    float *f;          // (B,T,N)
    floatX *y;         // (B,T,N·Vh) Hᵀq + v ⊙ D
    floatX *gated;     // (B,T,N·Vh)
    floatX *normed;    // (B,T,N·Vh)
    float *rstd;       // (B,T)
    void *rec_saved;   // the recurrence's saved state: checkpoints (fast path) or every H_t (plain path)
    int rec_fast;      // which path this layer's recurrence took
    // attention
    floatX *attn_y;    // (B,T,NH·HS) before the output projection
    AttnSaved attn;    // q, k, v, att, y in (B,NH,T,HS) / (B,NH,T,T)
} LayerActs;

typedef struct {
    ModelConfig config;
    ParamTable table;
    size_t num_parameters;
    floatX *params_memory;  // (num_parameters) the working copy the kernels read
    float *master_memory;   // (num_parameters) fp32 master weights
    float *grads_memory;    // (num_parameters) fp32
    float *m_memory, *v_memory; // AdamW, allocated at the first update (or by a resume)
    Weights params;
    Grads grads;
    Grads master; // fp32 views of the master weights (the same layout as the gradients)
    // activations, sized for (B, T) at the first forward
    int B, T;
    void *acts_memory;
    LayerActs layer_acts[MAX_LAYERS];
    floatX *resid_out;     // (B,T,C)
    floatX *lnf_out;       // (B,T,C)
    float *lnf_rstd;       // (B,T)
    floatX *logits;        // (B,T,Vp); the backward overwrites them with dlogits
    float *losses, *lse;   // (B,T)
    int *tokens_dev;       // (2,B,T) inputs then targets
    int *inputs_host;      // (B,T)
    // forward scratch
    floatX *branch_out;    // (B,T,C) a mixer's or MLP's output, added into the residual stream right away
    floatX *qkv;           // (B,T,3·NH·HS)
    floatX *att_scratch;   // (B,NH,T,T) preatt in the forward, datt in the backward
    // gradient scratch, reused by every layer in turn
    floatX *d_resid, *d_norm;          // (B,T,C)
    floatX *d_up, *d_h;                // (B,T,2F), (B,T,F)
    floatX *d_proj, *d_conv_act;       // (B,T,R), (B,T,CD)
    floatX *d_y, *d_gated, *d_normed;  // (B,T,N·Vh)
    float *d_f;                        // (B,T,N)
    float *d_W;                        // (N,Vh,Vh)
    float *rec_scratch;                // plain recurrence backward scratch
    floatX *d_qkv, *d_attn_y;          // (B,T,3·NH·HS), (B,T,NH·HS)
    floatX *d_q, *d_k, *d_v, *d_ay;    // (B,NH,T,HS)
    float *reduce_scratch;             // partial sums of the parameter-gradient reductions
    float *norm_scratch;               // NORM_BLOCKS + 1
    EmbeddingBuckets buckets;
    float mean_loss;                   // of the last forward with targets, -1 otherwise
    int have_targets;
} Model;

static cudaStream_t main_stream = 0;
#if !FLOATX_IS_FP32
static int m2rnn_force_plain = 0; // tests: run the plain fp32 recurrence in the bf16 build too
#endif

// ----------------------------------------------------------------------------------------------------------------
// model setup

static int cuda_ready = 0;
static void cuda_setup(void) {
    if (cuda_ready) { return; }
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        fail_with_hint("run ./train_m2rnn_cpu (the CPU reference) on a machine without a GPU",
                       "no CUDA device (%s)", err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    }
    cudaCheck(cudaSetDevice(0));
    cublas_init();
    cuda_ready = 1;
}

void model_build(Model *model, const ModelConfig *config) {
    cuda_setup();
    memset(model, 0, sizeof(*model));
    model->config = *config;
    model_config_fill_defaults(&model->config);
    model_config_validate(&model->config);
    param_table_build(&model->table, &model->config);
    const size_t n = model->table.num_parameters;
    model->num_parameters = n;
    cudaCheck(cudaMalloc(&model->params_memory, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&model->master_memory, n * sizeof(float)));
    cudaCheck(cudaMalloc(&model->grads_memory, n * sizeof(float)));
    cudaCheck(cudaMemset(model->grads_memory, 0, n * sizeof(float)));
    for (int i = 0; i < model->table.num_specs; i++) {
        const ParamSpec *s = &model->table.specs[i];
        *(floatX **)model_view_slot(&model->params, s->layer, s->kind) = model->params_memory + s->offset;
        *(float **)model_view_slot(&model->grads, s->layer, s->kind) = model->grads_memory + s->offset;
        *(float **)model_view_slot(&model->master, s->layer, s->kind) = model->master_memory + s->offset;
    }
    model->mean_loss = -1;
}

// fp32 host values → master weights and the floatX working copy
static void model_upload_params(Model *model, const float *host) {
    const size_t n = model->num_parameters;
    cudaCheck(cudaMemcpy(model->master_memory, host, n * sizeof(float), cudaMemcpyHostToDevice));
    cast_f32_to_floatx(model->params_memory, model->master_memory, (long)n, main_stream);
    cudaCheck(cudaStreamSynchronize(main_stream));
}

void model_init_weights(Model *model, uint64_t seed) {
    float *init = (float *)mallocCheck(model->num_parameters * sizeof(float));
    model_init_parameters(init, &model->table, seed);
    model_upload_params(model, init);
    free(init);
}

// hands out 256-byte aligned slices of one allocation; measures when base == NULL
typedef struct { char *base; size_t used; } DeviceArena;
static void *take(DeviceArena *a, size_t bytes) {
    void *p = a->base != NULL ? a->base + a->used : NULL;
    a->used += (bytes + 255) & ~(size_t)255;
    return p;
}
#define TAKE_X(a, n) ((floatX *)take(a, (size_t)(n) * sizeof(floatX)))
#define TAKE_F(a, n) ((float *)take(a, (size_t)(n) * sizeof(float)))

// row stride of the projection output q|k|v|f_raw|g: R rounded up to 8 elements, so every row is 16-byte aligned
static inline int m2rnn_proj_stride(const ModelConfig *c) { return round_up(m2rnn_proj_rows(c), 8); }

// The tensor-core recurrence sums dq and dk over head groups with fp32 atomics, so its gradients may differ in the last
// bits from run to run; M2RNN_PLAIN_RECURRENCE=1 selects the plain kernels, with which a step is bitwise repeatable.
#if !FLOATX_IS_FP32
// the tensor-core kernels' view of a layer: q, k, v are columns of the (B,T,CD) conv output
static M2RNNDims m2rnn_dims_of(const ModelConfig *c, int B, int T) {
    const int CD = m2rnn_conv_dim(c);
    M2RNNDims d = {B, T, c->rnn_heads, c->rnn_qk_heads, c->rnn_k, c->rnn_v, CD, CD, CD, NULL};
    return d;
}
#endif

static int use_fast_recurrence(const ModelConfig *c) {
#if FLOATX_IS_FP32
    return 0;
#else
    if (m2rnn_force_plain) { return 0; }
    const char *env = getenv("M2RNN_PLAIN_RECURRENCE");
    if (env != NULL && strcmp(env, "1") == 0) { return 0; }
    const M2RNNDims d = m2rnn_dims_of(c, 1, 1);
    return m2rnn_check_dims(&d) == NULL;
#endif
}

static size_t m2rnn_saved_bytes(const ModelConfig *c, int B, int T, int fast) {
#if !FLOATX_IS_FP32
    if (fast) {
        const M2RNNDims d = m2rnn_dims_of(c, B, T);
        return m2rnn_workspace_bytes(&d);
    }
#endif
    return m2rnn_plain_saved_floats((long)B * T, c->rnn_heads, c->rnn_k, c->rnn_v) * sizeof(float);
}

static void model_layout_activations(Model *model, DeviceArena *a) {
    const ModelConfig *c = &model->config;
    const int B = model->B, T = model->T;
    const size_t BT = (size_t)B * T, C = c->d_model, F = c->mlp_hidden;
    const size_t R = m2rnn_proj_stride(c), CD = m2rnn_conv_dim(c), N = c->rnn_heads, NV = N * c->rnn_v;
    const size_t NH = c->attn_heads, HS = c->attn_head_dim, inner = NH * HS;
    const int has_m = strchr(c->pattern, 'M') != NULL, has_a = strchr(c->pattern, 'A') != NULL;
    const int fast = use_fast_recurrence(c);
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs *la = &model->layer_acts[l];
        memset(la, 0, sizeof(*la));
        la->resid_in = TAKE_X(a, BT * C);
        la->ln1_out = TAKE_X(a, BT * C);
        la->ln1_rstd = TAKE_F(a, BT);
        la->resid_mid = TAKE_X(a, BT * C);
        la->ln2_out = TAKE_X(a, BT * C);
        la->ln2_rstd = TAKE_F(a, BT);
        la->mlp_up = TAKE_X(a, BT * 2 * F);
        la->mlp_h = TAKE_X(a, BT * F);
        if (c->pattern[l] == 'M') {
            la->proj = TAKE_X(a, BT * R);
            la->conv_pre = TAKE_X(a, BT * CD);
            la->conv_act = TAKE_X(a, BT * CD);
            la->f = TAKE_F(a, BT * N);
            la->y = TAKE_X(a, BT * NV);
            la->gated = TAKE_X(a, BT * NV);
            la->normed = TAKE_X(a, BT * NV);
            la->rstd = TAKE_F(a, BT);
            la->rec_saved = take(a, m2rnn_saved_bytes(c, B, T, fast));
            la->rec_fast = fast;
        } else {
            la->attn_y = TAKE_X(a, BT * inner);
            la->attn.q = TAKE_X(a, BT * inner);
            la->attn.k = TAKE_X(a, BT * inner);
            la->attn.v = TAKE_X(a, BT * inner);
            la->attn.y = TAKE_X(a, BT * inner);
            la->attn.att = TAKE_X(a, (size_t)B * NH * T * T);
        }
    }
    model->resid_out = TAKE_X(a, BT * C);
    model->lnf_out = TAKE_X(a, BT * C);
    model->lnf_rstd = TAKE_F(a, BT);
    model->logits = TAKE_X(a, BT * c->padded_vocab_size);
    model->losses = TAKE_F(a, BT);
    model->lse = TAKE_F(a, BT);
    model->tokens_dev = (int *)take(a, 2 * BT * sizeof(int));
    model->branch_out = TAKE_X(a, BT * C);
    model->d_resid = TAKE_X(a, BT * C);
    model->d_norm = TAKE_X(a, BT * C);
    model->d_up = TAKE_X(a, BT * 2 * F);
    model->d_h = TAKE_X(a, BT * F);
    size_t reduce = rmsnorm_backward_scratch((int)BT, (int)C);
    if (has_m) {
        model->d_proj = TAKE_X(a, BT * R);
        model->d_conv_act = TAKE_X(a, BT * CD);
        model->d_y = TAKE_X(a, BT * NV);
        model->d_gated = TAKE_X(a, BT * NV);
        model->d_normed = TAKE_X(a, BT * NV);
        model->d_f = TAKE_F(a, BT * N);
        model->d_W = TAKE_F(a, N * c->rnn_v * c->rnn_v);
        if (!fast) { model->rec_scratch = TAKE_F(a, m2rnn_plain_scratch_floats((long)BT, (int)N, c->rnn_k, c->rnn_v)); }
        const size_t chunks = token_chunks((long)BT);
        const size_t m_reduce[4] = {rmsnorm_backward_scratch((int)BT, (int)NV), chunks * CD * c->conv_width,
                                    chunks * 2 * N, chunks * NV};
        for (int i = 0; i < 4; i++) { reduce = m_reduce[i] > reduce ? m_reduce[i] : reduce; }
    }
    if (has_a) {
        model->qkv = TAKE_X(a, BT * 3 * inner);
        model->att_scratch = TAKE_X(a, (size_t)B * NH * T * T);
        model->d_qkv = TAKE_X(a, BT * 3 * inner);
        model->d_attn_y = TAKE_X(a, BT * inner);
        model->d_q = TAKE_X(a, BT * inner);
        model->d_k = TAKE_X(a, BT * inner);
        model->d_v = TAKE_X(a, BT * inner);
        model->d_ay = TAKE_X(a, BT * inner);
    }
    model->reduce_scratch = TAKE_F(a, reduce);
    model->norm_scratch = TAKE_F(a, NORM_BLOCKS + 1);
}

static void model_ensure_activations(Model *model, int B, int T) {
    if (model->acts_memory != NULL && model->B == B && model->T == T) { return; }
    if (model->acts_memory != NULL) { cudaCheck(cudaFree(model->acts_memory)); }
    free(model->inputs_host);
    model->B = B;
    model->T = T;
    DeviceArena measure = {NULL, 0};
    model_layout_activations(model, &measure);
    cudaError_t err = cudaMalloc(&model->acts_memory, measure.used);
    if (err != cudaSuccess) {
        fail_with_hint("lower the micro-batch (-b) or the sequence length (-t); -d keeps the total batch",
                       "cannot allocate %.2f GiB of activations for B=%d T=%d: %s", measure.used / 1073741824.0, B, T,
                       cudaGetErrorString(err));
    }
    DeviceArena real_arena = {(char *)model->acts_memory, 0};
    model_layout_activations(model, &real_arena);
    model->inputs_host = (int *)mallocCheck((size_t)B * T * sizeof(int));
}

// ----------------------------------------------------------------------------------------------------------------
// the mixers

static void m2rnn_recurrence_forward(LayerActs *la, const WeightsLayer *w, const ModelConfig *c, int B, int T) {
    const int Nq = c->rnn_qk_heads, K = c->rnn_k, CD = m2rnn_conv_dim(c);
    const floatX *q = la->conv_act, *k = la->conv_act + Nq * K, *v = la->conv_act + 2 * Nq * K;
#if !FLOATX_IS_FP32
    if (la->rec_fast) {
        const M2RNNDims d = m2rnn_dims_of(c, B, T);
        m2rnn_forward(la->y, NULL, la->rec_saved, q, k, v, la->f, w->m_W, NULL, &d, main_stream);
        return;
    }
#endif
    m2rnn_plain_forward(la->y, (float *)la->rec_saved, q, k, v, CD, la->f, w->m_W, B, T, c->rnn_heads, Nq, K, c->rnn_v,
                        main_stream);
}

// dq, dk, dv into model->d_conv_act (written), df into model->d_f (written), dW added to the gradients
static void m2rnn_recurrence_backward(Model *model, LayerActs *la, const WeightsLayer *w, GradsLayer *g, int B, int T) {
    const ModelConfig *c = &model->config;
    const int Nq = c->rnn_qk_heads, K = c->rnn_k, CD = m2rnn_conv_dim(c);
    const floatX *q = la->conv_act, *k = la->conv_act + Nq * K, *v = la->conv_act + 2 * Nq * K;
    floatX *dq = model->d_conv_act, *dk = model->d_conv_act + Nq * K, *dv = model->d_conv_act + 2 * Nq * K;
#if !FLOATX_IS_FP32
    if (la->rec_fast) {
        const M2RNNDims d = m2rnn_dims_of(c, B, T);
        m2rnn_backward(dq, dk, dv, model->d_f, model->d_W, NULL, la->rec_saved, model->d_y, NULL, q, k, v, la->f,
                       w->m_W, c->rnn_grad_clamp, &d, main_stream);
        accumulate_f32(g->m_W, model->d_W, (long)c->rnn_heads * c->rnn_v * c->rnn_v, main_stream);
        return;
    }
#endif
    m2rnn_plain_backward(dq, dk, dv, model->d_f, g->m_W, model->rec_scratch, (const float *)la->rec_saved, model->d_y,
                         q, k, v, CD, la->f, w->m_W, c->rnn_grad_clamp, B, T, c->rnn_heads, Nq, K, c->rnn_v,
                         main_stream);
}

// out (B,T,C) = M2RNN(inp); mw: the layer's fp32 master weights (the gate reads A_log and dt_bias from them)
static void m2rnn_mixer_forward(floatX *out, LayerActs *la, const floatX *inp, const WeightsLayer *w,
                                const GradsLayer *mw, const ModelConfig *c, int B, int T) {
    const int BT = B * T, C = c->d_model, R = m2rnn_proj_rows(c), Rs = m2rnn_proj_stride(c), CD = m2rnn_conv_dim(c);
    const int N = c->rnn_heads, NV = N * c->rnn_v, off_v = 2 * c->rnn_qk_heads * c->rnn_k;
    matmul_forward_strided(la->proj, Rs, inp, w->m_in_w, BT, C, R, main_stream);
    conv1d_silu_forward(la->conv_pre, la->conv_act, la->proj, w->m_conv_w, B, T, CD, c->conv_width, Rs, main_stream);
    m2rnn_gate_forward(la->f, la->proj + CD, mw->m_A_log, mw->m_dt_bias, BT, N, Rs, main_stream);
    m2rnn_recurrence_forward(la, w, c, B, T);
    m2rnn_output_gate_forward(la->y, la->gated, la->conv_act + off_v, la->proj + CD + N, w->m_D, BT, NV, CD, Rs,
                              main_stream);
    rmsnorm_forward(la->normed, la->rstd, NULL, la->gated, NULL, w->m_norm_w, BT, NV, main_stream);
    matmul_forward(out, la->normed, w->m_out_w, BT, NV, C, main_stream);
}

// dinp (B,T,C) written; dout (B,T,C)
static void m2rnn_mixer_backward(Model *model, floatX *dinp, GradsLayer *g, const floatX *dout, const floatX *inp,
                                 LayerActs *la, const WeightsLayer *w, const GradsLayer *mw, int B, int T) {
    const ModelConfig *c = &model->config;
    const int BT = B * T, C = c->d_model, R = m2rnn_proj_rows(c), Rs = m2rnn_proj_stride(c), CD = m2rnn_conv_dim(c);
    const int N = c->rnn_heads, NV = N * c->rnn_v, off_v = 2 * c->rnn_qk_heads * c->rnn_k;
    float *scratch = model->reduce_scratch;
    matmul_backward(model->d_normed, g->m_out_w, dout, la->normed, w->m_out_w, BT, NV, C, 0, main_stream);
    rmsnorm_backward(model->d_gated, g->m_norm_w, scratch, model->d_normed, la->gated, w->m_norm_w, la->rstd, BT, NV, 0,
                     main_stream);
    m2rnn_output_gate_backward(model->d_y, model->d_proj + CD + N, model->d_gated, la->y, la->proj + CD + N, BT, NV, Rs,
                               main_stream);
    m2rnn_recurrence_backward(model, la, w, g, B, T);
    m2rnn_residual_backward(model->d_conv_act + off_v, g->m_D, scratch, model->d_y, la->conv_act + off_v, w->m_D, BT,
                            NV, CD, main_stream);
    m2rnn_gate_backward(model->d_proj + CD, g->m_A_log, g->m_dt_bias, scratch, model->d_f, la->f, la->proj + CD, mw->m_A_log,
                        mw->m_dt_bias, BT, N, Rs, main_stream);
    conv1d_silu_backward(model->d_proj, g->m_conv_w, scratch, model->d_conv_act, la->conv_pre, la->proj, w->m_conv_w,
                         B, T, CD, c->conv_width, Rs, main_stream);
    matmul_backward_strided(dinp, g->m_in_w, model->d_proj, Rs, inp, w->m_in_w, BT, C, R, 0, main_stream);
}

static void attention_mixer_forward(Model *model, floatX *out, LayerActs *la, const floatX *inp, const WeightsLayer *w,
                                    int B, int T) {
    const ModelConfig *c = &model->config;
    const int BT = B * T, C = c->d_model, NH = c->attn_heads, HS = c->attn_head_dim, inner = NH * HS;
    matmul_forward(model->qkv, inp, w->a_qkv_w, BT, C, 3 * inner, main_stream);
    attention_forward(la->attn_y, &la->attn, model->att_scratch, model->qkv, B, T, NH, HS, c->use_rope, c->rope_theta,
                      main_stream);
    matmul_forward(out, la->attn_y, w->a_out_w, BT, inner, C, main_stream);
}

static void attention_mixer_backward(Model *model, floatX *dinp, GradsLayer *g, const floatX *dout, const floatX *inp,
                                     LayerActs *la, const WeightsLayer *w, int B, int T) {
    const ModelConfig *c = &model->config;
    const int BT = B * T, C = c->d_model, NH = c->attn_heads, HS = c->attn_head_dim, inner = NH * HS;
    matmul_backward(model->d_attn_y, g->a_out_w, dout, la->attn_y, w->a_out_w, BT, inner, C, 0, main_stream);
    attention_backward(model->d_qkv, model->d_attn_y, &la->attn, model->d_ay, model->d_q, model->d_k, model->d_v,
                       model->att_scratch, B, T, NH, HS, c->use_rope, c->rope_theta, main_stream);
    matmul_backward(dinp, g->a_qkv_w, model->d_qkv, inp, w->a_qkv_w, BT, C, 3 * inner, 0, main_stream);
}

// ----------------------------------------------------------------------------------------------------------------
// forward, backward, update

// Forward pass over host token arrays inputs (B,T) and, if not NULL, targets (B,T). Returns the mean loss or -1.
float model_forward(Model *model, const int *inputs, const int *targets, int B, int T) {
    const ModelConfig *c = &model->config;
    const int BT = B * T, C = c->d_model, V = c->vocab_size, Vp = c->padded_vocab_size;
    model_ensure_activations(model, B, T);
    model_check_tokens(inputs, (size_t)BT, V, "input");
    memcpy(model->inputs_host, inputs, (size_t)BT * sizeof(int));
    cudaCheck(cudaMemcpyAsync(model->tokens_dev, inputs, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice, main_stream));
    if (targets != NULL) {
        model_check_tokens(targets, (size_t)BT, V, "target");
        cudaCheck(cudaMemcpyAsync(model->tokens_dev + BT, targets, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice,
                                  main_stream));
    }
    embedding_forward(model->layer_acts[0].resid_in, model->tokens_dev, model->params.wte, BT, C, main_stream);
    rmsnorm_forward(model->layer_acts[0].ln1_out, model->layer_acts[0].ln1_rstd, NULL, model->layer_acts[0].resid_in,
                    NULL, model->params.layers[0].ln1_w, BT, C, main_stream);
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs *la = &model->layer_acts[l];
        const WeightsLayer *w = &model->params.layers[l];
        if (c->pattern[l] == 'M') {
            m2rnn_mixer_forward(model->branch_out, la, la->ln1_out, w, &model->master.layers[l], c, B, T);
        }
        else { attention_mixer_forward(model, model->branch_out, la, la->ln1_out, w, B, T); }
        // resid_mid = resid_in + mixer; ln2 = RMSNorm(resid_mid)
        rmsnorm_forward(la->ln2_out, la->ln2_rstd, la->resid_mid, la->resid_in, model->branch_out, w->ln2_w, BT, C,
                        main_stream);
        matmul_forward(la->mlp_up, la->ln2_out, w->mlp_up_w, BT, C, 2 * c->mlp_hidden, main_stream);
        swiglu_forward(la->mlp_h, la->mlp_up, BT, c->mlp_hidden, main_stream);
        matmul_forward(model->branch_out, la->mlp_h, w->mlp_down_w, BT, c->mlp_hidden, C, main_stream);
        // the next layer's input = resid_mid + MLP, normalized by its ln1 (or the final norm)
        if (l + 1 < c->n_layer) {
            LayerActs *next = &model->layer_acts[l + 1];
            rmsnorm_forward(next->ln1_out, next->ln1_rstd, next->resid_in, la->resid_mid, model->branch_out,
                            model->params.layers[l + 1].ln1_w, BT, C, main_stream);
        } else {
            rmsnorm_forward(model->lnf_out, model->lnf_rstd, model->resid_out, la->resid_mid, model->branch_out,
                            model->params.lnf_w, BT, C, main_stream);
        }
    }
    matmul_forward(model->logits, model->lnf_out, model->params.lm_head, BT, C, Vp, main_stream);
    model->have_targets = targets != NULL;
    if (targets == NULL) {
        model->mean_loss = -1;
        return -1;
    }
    crossentropy_forward(model->losses, model->lse, model->logits, model->tokens_dev + BT, BT, V, Vp, main_stream);
    float *losses = (float *)mallocCheck((size_t)BT * sizeof(float));
    cudaCheck(cudaMemcpyAsync(losses, model->losses, (size_t)BT * sizeof(float), cudaMemcpyDeviceToHost, main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
    double sum = 0.0;
    for (int i = 0; i < BT; i++) { sum += losses[i]; }
    free(losses);
    model->mean_loss = (float)(sum / BT);
    return model->mean_loss;
}

void model_zero_grad(Model *model) {
    cudaCheck(cudaMemsetAsync(model->grads_memory, 0, model->num_parameters * sizeof(float), main_stream));
}

// Backward of the last forward (which must have had targets); gradients accumulate (+=), scaled so that the loss
// being differentiated is loss_scale · mean loss.
void model_backward(Model *model, float loss_scale) {
    const ModelConfig *c = &model->config;
    if (!model->have_targets || model->mean_loss < 0) {
        fail_with_hint("call model_forward with targets first", "model_backward without a forward pass with targets");
    }
    const int B = model->B, T = model->T, BT = B * T, C = c->d_model, Vp = c->padded_vocab_size;
    float *scratch = model->reduce_scratch;
    crossentropy_backward_inplace(model->logits, model->lse, model->tokens_dev + BT, loss_scale / BT, BT, c->vocab_size,
                                  Vp, main_stream);
    matmul_backward(model->d_norm, model->grads.lm_head, model->logits, model->lnf_out, model->params.lm_head, BT, C, Vp,
                    0, main_stream);
    rmsnorm_backward(model->d_resid, model->grads.lnf_w, scratch, model->d_norm, model->resid_out, model->params.lnf_w,
                     model->lnf_rstd, BT, C, 0, main_stream);
    model->have_targets = 0; // the logits are gone: a second backward needs a new forward
    for (int l = c->n_layer - 1; l >= 0; l--) {
        LayerActs *la = &model->layer_acts[l];
        const WeightsLayer *w = &model->params.layers[l];
        GradsLayer *g = &model->grads.layers[l];
        // x_out = resid_mid + MLP(RMSNorm(resid_mid))
        matmul_backward(model->d_h, g->mlp_down_w, model->d_resid, la->mlp_h, w->mlp_down_w, BT, c->mlp_hidden, C, 0,
                        main_stream);
        swiglu_backward(model->d_up, model->d_h, la->mlp_up, BT, c->mlp_hidden, main_stream);
        matmul_backward(model->d_norm, g->mlp_up_w, model->d_up, la->ln2_out, w->mlp_up_w, BT, C, 2 * c->mlp_hidden, 0,
                        main_stream);
        rmsnorm_backward(model->d_resid, g->ln2_w, scratch, model->d_norm, la->resid_mid, w->ln2_w, la->ln2_rstd, BT, C,
                         1, main_stream);
        // resid_mid = resid_in + Mixer(RMSNorm(resid_in))
        if (c->pattern[l] == 'M') {
            m2rnn_mixer_backward(model, model->d_norm, g, model->d_resid, la->ln1_out, la, w, &model->master.layers[l], B,
                                 T);
        } else {
            attention_mixer_backward(model, model->d_norm, g, model->d_resid, la->ln1_out, la, w, B, T);
        }
        rmsnorm_backward(model->d_resid, g->ln1_w, scratch, model->d_norm, la->resid_in, w->ln1_w, la->ln1_rstd, BT, C,
                         1, main_stream);
    }
    embedding_backward(model->grads.wte, model->d_resid, model->inputs_host, BT, C, &model->buckets, main_stream);
}

double model_grad_norm(Model *model) {
    float norm2;
    global_sum_squares(model->norm_scratch + NORM_BLOCKS, model->norm_scratch, model->grads_memory,
                       model->num_parameters, main_stream);
    cudaCheck(cudaMemcpyAsync(&norm2, model->norm_scratch + NORM_BLOCKS, sizeof(float), cudaMemcpyDeviceToHost,
                              main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
    return sqrt((double)norm2);
}

// One AdamW step (step counts from 1) with global grad-norm clipping. Returns the grad norm.
double model_update(Model *model, const OptimizerConfig *opt, int step) {
    const size_t n = model->num_parameters;
    if (model->m_memory == NULL) {
        cudaCheck(cudaMalloc(&model->m_memory, n * sizeof(float)));
        cudaCheck(cudaMalloc(&model->v_memory, n * sizeof(float)));
        cudaCheck(cudaMemset(model->m_memory, 0, n * sizeof(float)));
        cudaCheck(cudaMemset(model->v_memory, 0, n * sizeof(float)));
    }
    const double norm = model_grad_norm(model);
    if (!isfinite(norm)) {
        fail_with_hint("lower the learning rate (-l) or check the data; the last checkpoint is intact",
                       "the gradient norm is %g at step %d", norm, step);
    }
    const float scale = (opt->grad_clip > 0 && norm > opt->grad_clip) ? (float)(opt->grad_clip / norm) : 1.0f;
    for (int i = 0; i < model->table.num_specs; i++) {
        const ParamSpec *s = &model->table.specs[i];
        adamw_update(model->params_memory + s->offset, model->master_memory + s->offset, model->m_memory + s->offset,
                     model->v_memory + s->offset, model->grads_memory + s->offset, s->numel, opt->lr, opt->beta1,
                     opt->beta2, opt->eps, s->weight_decay ? opt->weight_decay : 0.0f, step, scale, main_stream);
    }
    return norm;
}

void model_free(Model *model) {
    cudaCheck(cudaFree(model->params_memory));
    cudaCheck(cudaFree(model->master_memory));
    cudaCheck(cudaFree(model->grads_memory));
    if (model->m_memory != NULL) { cudaCheck(cudaFree(model->m_memory)); cudaCheck(cudaFree(model->v_memory)); }
    if (model->acts_memory != NULL) { cudaCheck(cudaFree(model->acts_memory)); }
    if (model->buckets.device != NULL) { cudaCheck(cudaFree(model->buckets.device)); }
    free(model->buckets.host);
    free(model->inputs_host);
    memset(model, 0, sizeof(*model));
}

// ----------------------------------------------------------------------------------------------------------------
// what the shared training loop needs from an executor (train_loop.h)

typedef float master_t;
#if FLOATX_IS_FP32
#define EXECUTOR_NAME "./train_m2rnn (CUDA, fp32)"
#else
#define EXECUTOR_NAME "./train_m2rnn (CUDA, bf16 mixed precision)"
#endif

// dense tensor-core peak of the GPU in the build's precision, for MFU; 0 when unknown (then GFLOP/s is printed)
static double executor_peak_flops(void) {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    const int hopper = strstr(prop.name, "H100") != NULL || strstr(prop.name, "H200") != NULL ||
                       strstr(prop.name, "H800") != NULL || strstr(prop.name, "GH200") != NULL;
    const int pcie = strstr(prop.name, "PCIe") != NULL;
    if (FLOATX_IS_FP32) { return hopper ? (pcie ? 51e12 : 67e12) : 0.0; } // fp32 FMA pipes, no TF32
    if (hopper) { return pcie ? 756e12 : 989e12; }
    if (strstr(prop.name, "A100") != NULL) { return 312e12; }
    return 0.0;
}
static void executor_sync(void) { cudaCheck(cudaStreamSynchronize(main_stream)); }

static int model_has_optimizer(const Model *model) { return model->m_memory != NULL; }

static void model_read_state(const Model *model, master_t *params, master_t *m, master_t *v) {
    const size_t bytes = model->num_parameters * sizeof(float);
    cudaCheck(cudaMemcpy(params, model->master_memory, bytes, cudaMemcpyDeviceToHost));
    if (m != NULL && model->m_memory != NULL) {
        cudaCheck(cudaMemcpy(m, model->m_memory, bytes, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(v, model->v_memory, bytes, cudaMemcpyDeviceToHost));
    }
}

// m, v NULL: a fresh optimizer
static void model_write_state(Model *model, const master_t *params, const master_t *m, const master_t *v) {
    const size_t n = model->num_parameters, bytes = n * sizeof(float);
    model_upload_params(model, params);
    if (model->m_memory != NULL) {
        cudaCheck(cudaFree(model->m_memory));
        cudaCheck(cudaFree(model->v_memory));
        model->m_memory = model->v_memory = NULL;
    }
    if (m != NULL) {
        cudaCheck(cudaMalloc(&model->m_memory, bytes));
        cudaCheck(cudaMalloc(&model->v_memory, bytes));
        cudaCheck(cudaMemcpy(model->m_memory, m, bytes, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(model->v_memory, v, bytes, cudaMemcpyHostToDevice));
    }
}

static void model_logits_row(Model *model, int b, int t, float *out) {
    const int Vp = model->config.padded_vocab_size;
    floatX *row = (floatX *)mallocCheck((size_t)Vp * sizeof(floatX));
    cudaCheck(cudaMemcpy(row, model->logits + ((size_t)b * model->T + t) * Vp, (size_t)Vp * sizeof(floatX),
                         cudaMemcpyDeviceToHost));
    for (int i = 0; i < Vp; i++) { out[i] = (float)row[i]; }
    free(row);
}

#include "train_loop.h" // defines: TrainOptions, the CLI, lr schedule, validation, samples, checkpoints, train_run

#ifndef TESTING
int main(int argc, char **argv) {
    TrainOptions o = train_options_default();
    parse_args(&o, argc, argv);
    train_run(&o);
    return 0;
}
#endif
