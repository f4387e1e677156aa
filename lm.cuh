/*
lm.cuh: the GPU executor of the language model (executor.h's API) on one GPU, op for op the dataflow of the CPU
reference ref/lm.h:

  tokens → embedding → L × [ x += Mixer(RMSNorm(x));  x += FeedForward(RMSNorm(x)) ] → RMSNorm → LM head → cross-entropy

The block is written once: each layer's mixer and feed-forward run through the kind table (kinds.cuh) by their
letters, with their activations in blocks they lay out themselves and one scratch the kinds share. Everything runs
on the Runtime the model owns (its device, stream, cuBLASLt handle), not on a global device or stream.

Precision: floatX (bf16; fp32 with make PRECISION=FP32) weights and activations, fp32 master weights, fp32 parameter
gradients and AdamW state, fp32 accumulation everywhere. The residual add is fused into the following RMSNorm; the
classifier never stores probabilities; the embedding backward is deterministic. Decoding runs each kind's step with
its per-sequence state on the device.
*/
#ifndef M2RNN_LM_CUH
#define M2RNN_LM_CUH

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"    // defines: the executor API this file implements
#include "model.h"       // defines: ModelConfig, the parameter table, init, FLOP counts
#include "common.cuh"    // defines: Runtime, cuBLASLt matmul, embedding, RMSNorm, classifier, AdamW, KindOps
#include "kinds.cuh"     // defines: every layer kind's GPU ops (M, A, R, U, s) and kind_ops()

typedef struct {
    floatX *resid_in;  // (B,T,C) residual stream entering the layer
    floatX *ln1_out;   // (B,T,C)
    float *ln1_rstd;   // (B,T)
    floatX *resid_mid; // (B,T,C) resid_in + mixer output
    floatX *ln2_out;   // (B,T,C)
    float *ln2_rstd;   // (B,T)
    void *mixer;       // the mixer's saved activations (its kind's layout)
    void *ffn;         // the feed-forward's
} LayerActs;

struct Model {
    ModelConfig config;
    ParamTable table;
    Runtime rt;
    size_t num_parameters;
    floatX *params_memory;  // (num_parameters) the working copy the kernels read
    float *master_memory;   // (num_parameters) fp32 master weights
    float *grads_memory;    // (num_parameters) fp32
    float *m_memory, *v_memory; // AdamW, allocated at the first update (or by a resume)
    ModelParams params;
    ModelParams32 grads, master; // fp32 views of the gradients and the master weights
    const KindOps *mixer_ops[MAX_LAYERS], *ffn_ops[MAX_LAYERS]; // each layer's kinds, resolved once
    // activations, laid out for (B, T) and the recurrence choice at the first forward
    int B, T, acts_plain;
    void *acts_memory;
    LayerActs layer_acts[MAX_LAYERS];
    floatX *resid_out;     // (B,T,C)
    floatX *lnf_out;       // (B,T,C)
    float *lnf_rstd;       // (B,T)
    floatX *logits;        // (B,T,Vp); the backward overwrites them with dlogits
    float *losses, *lse;   // (B,T)
    float *losses_host;    // (B,T)
    int *tokens_dev;       // (2,B,T) inputs then targets
    int *inputs_host;      // (B,T)
    floatX *branch_out;    // (B,T,C) a mixer's or feed-forward's output, added into the residual stream right away
    floatX *d_resid, *d_norm; // (B,T,C) gradient of the residual stream, and of a norm's output
    float *norm_reduce;    // partial sums of the block norms' weight gradients
    void *kind_scratch;    // the largest scratch of the model's kinds
    float *norm_scratch;   // NORM_BLOCKS + 1
    EmbeddingBuckets buckets;
    float mean_loss;       // of the last forward with targets, -1 otherwise
    int have_targets;
    // decoding
    int dec_B, dec_context;
    void *dec_memory;
    void *dec_state[MAX_LAYERS];   // (B, state_bytes) of each layer's mixer
    floatX *dec_x, *dec_norm, *dec_branch; // (B,C)
    float *dec_rstd;               // (B)
    floatX *dec_logits;            // (B,Vp)
    int *dec_tokens, *dec_pos;     // (B) each
    void *dec_work;                // the kinds' step temporaries
};

static const ModelConfig *model_config(const Model *model) { return &model->config; }
static const ParamTable *model_table(const Model *model) { return &model->table; }

static KindTensors kind_tensors(floatX *const *w, float *const *w32, float *const *g) {
    KindTensors t = {w, w32, g};
    return t;
}

// the device of a model built by model_create (M2RNN_DEVICE, default 0: one process per GPU picks its own)
static int executor_device(void) {
    const char *env = getenv("M2RNN_DEVICE");
    return env != NULL ? atoi(env) : 0;
}

static Model *model_create(const ModelConfig *config) {
    Model *model = (Model *)callocCheck(1, sizeof(Model));
    model->config = *config;
    model_config_fill_defaults(&model->config);
    model_config_validate(&model->config);
    runtime_init(&model->rt, executor_device());
    param_table_build(&model->table, &model->config);
    for (int l = 0; l < model->config.n_layer; l++) {
        model->mixer_ops[l] = kind_ops(model->config.pattern[l]);
        model->ffn_ops[l] = kind_ops(model_ffn_letter(&model->config, l));
    }
    const size_t n = model->table.num_parameters;
    model->num_parameters = n;
    cudaCheck(cudaMalloc(&model->params_memory, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&model->master_memory, n * sizeof(float)));
    cudaCheck(cudaMalloc(&model->grads_memory, n * sizeof(float)));
    cudaCheck(cudaMemset(model->grads_memory, 0, n * sizeof(float)));
    model_point_views(&model->params, model->params_memory, sizeof(floatX), &model->table);
    model_point_views(&model->grads, model->grads_memory, sizeof(float), &model->table);
    model_point_views(&model->master, model->master_memory, sizeof(float), &model->table);
    model->mean_loss = -1;
    return model;
}

// fp32 host values → master weights and the floatX working copy
static void model_upload_params(Model *model, const float *host) {
    const size_t n = model->num_parameters;
    cudaCheck(cudaMemcpy(model->master_memory, host, n * sizeof(float), cudaMemcpyHostToDevice));
    cast_f32_to_floatx(model->params_memory, model->master_memory, (long)n, model->rt.stream);
    cudaCheck(cudaStreamSynchronize(model->rt.stream));
}

static void model_init_weights(Model *model, uint64_t seed) {
    float *init = (float *)mallocCheck(model->num_parameters * sizeof(float));
    model_init_parameters(init, &model->table, seed);
    model_upload_params(model, init);
    free(init);
}

static void model_layout_activations(Model *model, DeviceArena *a) {
    const ModelConfig *c = &model->config;
    const Runtime *rt = &model->rt;
    const int B = model->B, T = model->T;
    const size_t BT = (size_t)B * T, C = c->d_model;
    size_t scratch = 0;
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs *la = &model->layer_acts[l];
        const KindOps *mx = model->mixer_ops[l], *ff = model->ffn_ops[l];
        la->resid_in = TAKE_X(a, BT * C);
        la->ln1_out = TAKE_X(a, BT * C);
        la->ln1_rstd = TAKE_F(a, BT);
        la->resid_mid = TAKE_X(a, BT * C);
        la->ln2_out = TAKE_X(a, BT * C);
        la->ln2_rstd = TAKE_F(a, BT);
        la->mixer = take(a, mx->acts_bytes(c, B, T, rt));
        la->ffn = take(a, ff->acts_bytes(c, B, T, rt));
        const size_t s1 = mx->scratch_bytes(c, B, T, rt), s2 = ff->scratch_bytes(c, B, T, rt);
        scratch = s1 > scratch ? s1 : scratch;
        scratch = s2 > scratch ? s2 : scratch;
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
    model->norm_reduce = TAKE_F(a, rmsnorm_backward_scratch((int)BT, (int)C));
    model->kind_scratch = take(a, scratch);
    model->norm_scratch = TAKE_F(a, NORM_BLOCKS + 1);
}

static void model_ensure_activations(Model *model, int B, int T) {
    if (model->acts_memory != NULL && model->B == B && model->T == T && model->acts_plain == model->rt.plain_recurrence) {
        return;
    }
    if (model->acts_memory != NULL) { cudaCheck(cudaFree(model->acts_memory)); }
    free(model->inputs_host);
    free(model->losses_host);
    model->B = B;
    model->T = T;
    model->acts_plain = model->rt.plain_recurrence;
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
    model->losses_host = (float *)mallocCheck((size_t)B * T * sizeof(float));
}

static double model_forward(Model *model, const int *inputs, const int *targets, int B, int T) {
    const ModelConfig *c = &model->config;
    const Runtime *rt = &model->rt;
    cudaStream_t stream = rt->stream;
    const int BT = B * T, C = c->d_model, V = c->vocab_size, Vp = c->padded_vocab_size;
    model_ensure_activations(model, B, T);
    model_check_tokens(inputs, (size_t)BT, V, "input");
    memcpy(model->inputs_host, inputs, (size_t)BT * sizeof(int));
    cudaCheck(cudaMemcpyAsync(model->tokens_dev, inputs, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice, stream));
    if (targets != NULL) {
        model_check_tokens(targets, (size_t)BT, V, "target");
        cudaCheck(cudaMemcpyAsync(model->tokens_dev + BT, targets, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice,
                                  stream));
    }
    embedding_forward(model->layer_acts[0].resid_in, model->tokens_dev, model->params.wte, BT, C, stream);
    rmsnorm_forward(model->layer_acts[0].ln1_out, model->layer_acts[0].ln1_rstd, NULL, model->layer_acts[0].resid_in,
                    NULL, model->params.layers[0].ln1_w, BT, C, stream);
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs *la = &model->layer_acts[l];
        const ModelParamsLayer *w = &model->params.layers[l];
        const ModelParams32Layer *w32 = &model->master.layers[l], *g = &model->grads.layers[l];
        const KindTensors tm = kind_tensors(w->mixer, w32->mixer, g->mixer), tf = kind_tensors(w->ffn, w32->ffn, g->ffn);
        model->mixer_ops[l]->forward(model->branch_out, la->mixer, model->kind_scratch, la->ln1_out, &tm, c, B, T, rt);
        // resid_mid = resid_in + mixer; ln2 = RMSNorm(resid_mid)
        rmsnorm_forward(la->ln2_out, la->ln2_rstd, la->resid_mid, la->resid_in, model->branch_out, w->ln2_w, BT, C,
                        stream);
        model->ffn_ops[l]->forward(model->branch_out, la->ffn, model->kind_scratch, la->ln2_out, &tf, c, B, T, rt);
        // the next layer's input = resid_mid + feed-forward, normalized by its ln1 (or the final norm)
        if (l + 1 < c->n_layer) {
            LayerActs *next = &model->layer_acts[l + 1];
            rmsnorm_forward(next->ln1_out, next->ln1_rstd, next->resid_in, la->resid_mid, model->branch_out,
                            model->params.layers[l + 1].ln1_w, BT, C, stream);
        } else {
            rmsnorm_forward(model->lnf_out, model->lnf_rstd, model->resid_out, la->resid_mid, model->branch_out,
                            model->params.lnf_w, BT, C, stream);
        }
    }
    matmul_forward(model->logits, model->lnf_out, model->params.lm_head, BT, C, Vp, rt);
    model->have_targets = targets != NULL;
    if (targets == NULL) {
        model->mean_loss = -1;
        return -1;
    }
    crossentropy_forward(model->losses, model->lse, model->logits, model->tokens_dev + BT, BT, V, Vp, stream);
    cudaCheck(cudaMemcpyAsync(model->losses_host, model->losses, (size_t)BT * sizeof(float), cudaMemcpyDeviceToHost,
                              stream));
    cudaCheck(cudaStreamSynchronize(stream));
    double sum = 0.0;
    for (int i = 0; i < BT; i++) { sum += model->losses_host[i]; }
    model->mean_loss = (float)(sum / BT);
    return model->mean_loss;
}

static void model_zero_grad(Model *model) {
    cudaCheck(cudaMemsetAsync(model->grads_memory, 0, model->num_parameters * sizeof(float), model->rt.stream));
}

static void model_backward(Model *model, float loss_scale) {
    const ModelConfig *c = &model->config;
    const Runtime *rt = &model->rt;
    cudaStream_t stream = rt->stream;
    if (!model->have_targets || model->mean_loss < 0) {
        fail_with_hint("call model_forward with targets first", "model_backward without a forward pass with targets");
    }
    const int B = model->B, T = model->T, BT = B * T, C = c->d_model, Vp = c->padded_vocab_size;
    float *scratch = model->norm_reduce;
    crossentropy_backward_inplace(model->logits, model->lse, model->tokens_dev + BT, loss_scale / BT, BT, c->vocab_size,
                                  Vp, stream);
    matmul_backward(model->d_norm, model->grads.lm_head, model->logits, model->lnf_out, model->params.lm_head, BT, C, Vp,
                    0, rt);
    rmsnorm_backward(model->d_resid, model->grads.lnf_w, scratch, model->d_norm, model->resid_out, model->params.lnf_w,
                     model->lnf_rstd, BT, C, 0, stream);
    model->have_targets = 0; // the logits are gone: a second backward needs a new forward
    for (int l = c->n_layer - 1; l >= 0; l--) {
        LayerActs *la = &model->layer_acts[l];
        const ModelParamsLayer *w = &model->params.layers[l];
        ModelParams32Layer *g = &model->grads.layers[l];
        const ModelParams32Layer *w32 = &model->master.layers[l];
        const KindTensors tm = kind_tensors(w->mixer, w32->mixer, g->mixer), tf = kind_tensors(w->ffn, w32->ffn, g->ffn);
        // x_out = resid_mid + FFN(RMSNorm(resid_mid))
        model->ffn_ops[l]->backward(model->d_norm, model->kind_scratch, model->d_resid, la->ln2_out, la->ffn, &tf, c, B,
                                    T, rt);
        rmsnorm_backward(model->d_resid, g->ln2_w, scratch, model->d_norm, la->resid_mid, w->ln2_w, la->ln2_rstd, BT, C,
                         1, stream);
        // resid_mid = resid_in + Mixer(RMSNorm(resid_in))
        model->mixer_ops[l]->backward(model->d_norm, model->kind_scratch, model->d_resid, la->ln1_out, la->mixer, &tm,
                                      c, B, T, rt);
        rmsnorm_backward(model->d_resid, g->ln1_w, scratch, model->d_norm, la->resid_in, w->ln1_w, la->ln1_rstd, BT, C,
                         1, stream);
    }
    embedding_backward(model->grads.wte, model->d_resid, model->inputs_host, BT, C, &model->buckets, stream);
}

static double model_grad_norm(Model *model) {
    float norm2;
    cudaStream_t stream = model->rt.stream;
    global_sum_squares(model->norm_scratch + NORM_BLOCKS, model->norm_scratch, model->grads_memory,
                       model->num_parameters, stream);
    cudaCheck(cudaMemcpyAsync(&norm2, model->norm_scratch + NORM_BLOCKS, sizeof(float), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    return sqrt((double)norm2);
}

static void model_update(Model *model, const OptimizerConfig *opt, int step, double norm) {
    const size_t n = model->num_parameters;
    if (model->m_memory == NULL) {
        cudaCheck(cudaMalloc(&model->m_memory, n * sizeof(float)));
        cudaCheck(cudaMalloc(&model->v_memory, n * sizeof(float)));
        cudaCheck(cudaMemset(model->m_memory, 0, n * sizeof(float)));
        cudaCheck(cudaMemset(model->v_memory, 0, n * sizeof(float)));
    }
    const float scale = (opt->grad_clip > 0 && norm > opt->grad_clip) ? (float)(opt->grad_clip / norm) : 1.0f;
    for (int i = 0; i < model->table.num_specs; i++) {
        const ParamSpec *s = &model->table.specs[i];
        adamw_update(model->params_memory + s->offset, model->master_memory + s->offset, model->m_memory + s->offset,
                     model->v_memory + s->offset, model->grads_memory + s->offset, s->numel, opt->lr, opt->beta1,
                     opt->beta2, opt->eps, s->weight_decay ? opt->weight_decay : 0.0f, step, scale, model->rt.stream);
    }
}

static void model_free(Model *model) {
    if (model == NULL) { return; }
    cudaCheck(cudaSetDevice(model->rt.device));
    cudaCheck(cudaFree(model->params_memory));
    cudaCheck(cudaFree(model->master_memory));
    cudaCheck(cudaFree(model->grads_memory));
    if (model->m_memory != NULL) { cudaCheck(cudaFree(model->m_memory)); cudaCheck(cudaFree(model->v_memory)); }
    if (model->acts_memory != NULL) { cudaCheck(cudaFree(model->acts_memory)); }
    if (model->dec_memory != NULL) { cudaCheck(cudaFree(model->dec_memory)); }
    if (model->buckets.device != NULL) { cudaCheck(cudaFree(model->buckets.device)); }
    free(model->buckets.host);
    free(model->inputs_host);
    free(model->losses_host);
    runtime_free(&model->rt);
    free(model);
}

static int model_has_optimizer(const Model *model) { return model->m_memory != NULL; }

static void model_read_state(const Model *model, void *params, void *m, void *v) {
    const size_t bytes = model->num_parameters * sizeof(float);
    cudaCheck(cudaMemcpy(params, model->master_memory, bytes, cudaMemcpyDeviceToHost));
    if (m != NULL && model->m_memory != NULL) {
        cudaCheck(cudaMemcpy(m, model->m_memory, bytes, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(v, model->v_memory, bytes, cudaMemcpyDeviceToHost));
    }
}

static void model_write_state(Model *model, const void *params, const void *m, const void *v) {
    const size_t n = model->num_parameters, bytes = n * sizeof(float);
    model_upload_params(model, (const float *)params);
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

// Vp floatX values of device memory → host floats
static void copy_logits_row(float *out, const floatX *row, int Vp) {
    floatX *tmp = (floatX *)mallocCheck((size_t)Vp * sizeof(floatX));
    cudaCheck(cudaMemcpy(tmp, row, (size_t)Vp * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (int i = 0; i < Vp; i++) { out[i] = (float)tmp[i]; }
    free(tmp);
}

static void model_logits_row(Model *model, int b, int t, float *out) {
    const int Vp = model->config.padded_vocab_size;
    copy_logits_row(out, model->logits + ((size_t)b * model->T + t) * Vp, Vp);
}

// ----------------------------------------------------------------------------------------------------------------
// decoding

static void model_decode_begin(Model *model, int B, int context) {
    const ModelConfig *c = &model->config;
    const Runtime *rt = &model->rt;
    const size_t C = (size_t)c->d_model;
    if (B < 1 || context < 1) { fail_with_hint("decode at least one sequence of one token", "model_decode_begin(B=%d, context=%d)", B, context); }
    if (model->dec_memory != NULL) { cudaCheck(cudaFree(model->dec_memory)); }
    size_t work = 0;
    for (int l = 0; l < c->n_layer; l++) {
        const KindOps *k[2] = {model->mixer_ops[l], model->ffn_ops[l]};
        for (int i = 0; i < 2; i++) {
            const size_t w = k[i]->acts_bytes(c, B, 1, rt) + k[i]->scratch_bytes(c, B, 1, rt);
            work = w > work ? w : work;
        }
    }
    for (int pass = 0; pass < 2; pass++) { // measure, then point into one allocation
        DeviceArena a = {(char *)model->dec_memory, 0};
        for (int l = 0; l < c->n_layer; l++) {
            model->dec_state[l] = take(&a, (size_t)B * model->mixer_ops[l]->state_bytes(c, context));
        }
        const size_t state_bytes = a.used;
        model->dec_x = TAKE_X(&a, B * C);
        model->dec_norm = TAKE_X(&a, B * C);
        model->dec_branch = TAKE_X(&a, B * C);
        model->dec_rstd = TAKE_F(&a, B);
        model->dec_logits = TAKE_X(&a, (size_t)B * c->padded_vocab_size);
        model->dec_tokens = (int *)take(&a, (size_t)B * sizeof(int));
        model->dec_pos = (int *)take(&a, (size_t)B * sizeof(int));
        model->dec_work = take(&a, work);
        if (pass == 0) {
            cudaError_t err = cudaMalloc(&model->dec_memory, a.used);
            if (err != cudaSuccess) {
                fail_with_hint("decode fewer sequences or a shorter context", "cannot allocate %.2f GiB of decode "
                               "state for %d sequences of %d tokens: %s", a.used / 1073741824.0, B, context,
                               cudaGetErrorString(err));
            }
        } else {
            cudaCheck(cudaMemsetAsync(model->dec_memory, 0, state_bytes, rt->stream)); // the empty history
        }
    }
    model->dec_B = B;
    model->dec_context = context;
}

static void model_decode_step(Model *model, const int *tokens, const int *pos) {
    const ModelConfig *c = &model->config;
    const Runtime *rt = &model->rt;
    cudaStream_t stream = rt->stream;
    const int B = model->dec_B, C = c->d_model;
    if (B == 0) { fail_with_hint("call model_decode_begin first", "model_decode_step without a decode state"); }
    model_check_tokens(tokens, (size_t)B, c->vocab_size, "decode");
    for (int b = 0; b < B; b++) {
        if (pos[b] < 0 || pos[b] >= model->dec_context) {
            fail_with_hint("begin decoding with a longer context", "decode position %d of sequence %d is outside the "
                           "context of %d tokens", pos[b], b, model->dec_context);
        }
    }
    cudaCheck(cudaMemcpyAsync(model->dec_tokens, tokens, (size_t)B * sizeof(int), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaMemcpyAsync(model->dec_pos, pos, (size_t)B * sizeof(int), cudaMemcpyHostToDevice, stream));
    embedding_forward(model->dec_x, model->dec_tokens, model->params.wte, B, C, stream);
    rmsnorm_forward(model->dec_norm, model->dec_rstd, NULL, model->dec_x, NULL, model->params.layers[0].ln1_w, B, C,
                    stream);
    for (int l = 0; l < c->n_layer; l++) {
        const ModelParamsLayer *w = &model->params.layers[l];
        const ModelParams32Layer *w32 = &model->master.layers[l];
        const KindTensors tm = kind_tensors(w->mixer, w32->mixer, NULL), tf = kind_tensors(w->ffn, w32->ffn, NULL);
        model->mixer_ops[l]->step(model->dec_branch, model->dec_state[l], model->dec_work, model->dec_norm, &tm, c, B,
                                  model->dec_pos, model->dec_context, rt);
        rmsnorm_forward(model->dec_norm, model->dec_rstd, model->dec_x, model->dec_x, model->dec_branch, w->ln2_w, B, C,
                        stream);
        model->ffn_ops[l]->step(model->dec_branch, NULL, model->dec_work, model->dec_norm, &tf, c, B, model->dec_pos,
                                model->dec_context, rt);
        const floatX *next_w = l + 1 < c->n_layer ? model->params.layers[l + 1].ln1_w : model->params.lnf_w;
        rmsnorm_forward(model->dec_norm, model->dec_rstd, model->dec_x, model->dec_x, model->dec_branch, next_w, B, C,
                        stream);
    }
    matmul_forward(model->dec_logits, model->dec_norm, model->params.lm_head, B, C, c->padded_vocab_size, rt);
}

static void model_decode_logits(Model *model, int b, float *out) {
    const int Vp = model->config.padded_vocab_size;
    copy_logits_row(out, model->dec_logits + (size_t)b * Vp, Vp);
}

// ----------------------------------------------------------------------------------------------------------------
// the executor

static const char *executor_name(void) {
    return FLOATX_IS_FP32 ? "./train_m2rnn (CUDA, fp32)" : "./train_m2rnn (CUDA, bf16 mixed precision)";
}
static int executor_master_bytes(void) { return (int)sizeof(float); }

// dense tensor-core peak of the GPU in the build's precision, for MFU; 0 when unknown (then GFLOP/s is printed)
static double executor_peak_flops(Model *model) {
    const cudaDeviceProp *prop = &model->rt.prop;
    const int hopper = strstr(prop->name, "H100") != NULL || strstr(prop->name, "H200") != NULL ||
                       strstr(prop->name, "H800") != NULL || strstr(prop->name, "GH200") != NULL;
    const int pcie = strstr(prop->name, "PCIe") != NULL;
    if (FLOATX_IS_FP32) { return hopper ? (pcie ? 51e12 : 67e12) : 0.0; } // fp32 FMA pipes, no TF32
    if (hopper) { return pcie ? 756e12 : 989e12; }
    if (strstr(prop->name, "A100") != NULL) { return 312e12; }
    return 0.0;
}
static void executor_sync(Model *model) { cudaCheck(cudaStreamSynchronize(model->rt.stream)); }

#endif // M2RNN_LM_CUH
