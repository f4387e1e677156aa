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
    int dec_rows;                  // rows of the buffers below: max(B, DECODE_ROWS)
    floatX *dec_x, *dec_norm, *dec_branch; // (rows, C) the residual stream of a step or a prefill chunk
    float *dec_rstd;               // (rows)
    floatX *dec_logits;            // (B,Vp)
    int *dec_tokens, *dec_pos;     // (rows), (B)
    void *dec_work;                // the kinds' step and advance temporaries
    cudaGraphExec_t dec_graph;     // the step of all B sequences, captured (NULL: not yet, or not possible)
    int dec_steps;                 // eager steps since begin (the second is captured: the first sets kernel attributes)
    int dec_graph_off;             // 1: run eagerly (M2RNN_NO_GRAPH=1, or a capture failed)
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
    if (model->dec_graph != NULL) { cudaCheck(cudaGraphExecDestroy(model->dec_graph)); }
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

#define DECODE_ROWS 2048 // tokens (sequences × chunk) a prefill chunk runs through the forward's kernels at once

static void model_decode_begin(Model *model, int B, int context) {
    const ModelConfig *c = &model->config;
    const Runtime *rt = &model->rt;
    const size_t C = (size_t)c->d_model;
    if (B < 1 || context < 1) { fail_with_hint("decode at least one sequence of one token", "model_decode_begin(B=%d, context=%d)", B, context); }
    if (model->dec_memory != NULL) { cudaCheck(cudaFree(model->dec_memory)); }
    if (model->dec_graph != NULL) { cudaCheck(cudaGraphExecDestroy(model->dec_graph)); model->dec_graph = NULL; }
    model->dec_steps = 0;
    const char *no_graph = getenv("M2RNN_NO_GRAPH");
    model->dec_graph_off = no_graph != NULL && strcmp(no_graph, "1") == 0;
    const int rows = B > DECODE_ROWS ? B : DECODE_ROWS;
    // the temporaries of a step (B, 1) and of the largest prefill chunks: one sequence of DECODE_ROWS tokens, or all B
    // sequences of DECODE_ROWS / B
    const int shapes[3][2] = {{B, 1}, {1, DECODE_ROWS}, {B, DECODE_ROWS / B > 0 ? DECODE_ROWS / B : 1}};
    size_t work = 0;
    for (int l = 0; l < c->n_layer; l++) {
        const KindOps *k[2] = {model->mixer_ops[l], model->ffn_ops[l]};
        for (int i = 0; i < 2; i++) {
            for (int sh = 0; sh < 3; sh++) {
                const size_t w = k[i]->acts_bytes(c, shapes[sh][0], shapes[sh][1], rt) +
                                 k[i]->scratch_bytes(c, shapes[sh][0], shapes[sh][1], rt);
                work = w > work ? w : work;
            }
        }
    }
    work += (size_t)B * (2 * C * sizeof(floatX) + sizeof(int)) + 512; // the fp32 attention advance's per-token rows
    for (int pass = 0; pass < 2; pass++) { // measure, then point into one allocation
        DeviceArena a = {(char *)model->dec_memory, 0};
        for (int l = 0; l < c->n_layer; l++) {
            model->dec_state[l] = take(&a, (size_t)B * model->mixer_ops[l]->state_bytes(c, context));
        }
        const size_t state_bytes = a.used;
        model->dec_x = TAKE_X(&a, rows * C);
        model->dec_norm = TAKE_X(&a, rows * C);
        model->dec_branch = TAKE_X(&a, rows * C);
        model->dec_rstd = TAKE_F(&a, rows);
        model->dec_logits = TAKE_X(&a, (size_t)B * c->padded_vocab_size);
        model->dec_tokens = (int *)take(&a, (size_t)rows * sizeof(int));
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
    model->dec_rows = rows;
    model->dec_context = context;
}

// sequences b0 .. b0+nb−1 run T tokens each through the layers (T = 1: the kinds' step kernels; T > 1: their advance,
// the forward's kernels from the states); dec_tokens (nb·T) and dec_pos (nb) are on the device. The residual stream
// is added and normed as the training forward does (rmsnorm with the residual fused), then each sequence's last row
// makes its next-token logits.
static void decode_run(Model *model, int b0, int nb, int T) {
    const ModelConfig *c = &model->config;
    const Runtime *rt = &model->rt;
    cudaStream_t stream = rt->stream;
    const int C = c->d_model, n = nb * T, Vp = c->padded_vocab_size;
    embedding_forward(model->dec_x, model->dec_tokens, model->params.wte, n, C, stream);
    rmsnorm_forward(model->dec_norm, model->dec_rstd, NULL, model->dec_x, NULL, model->params.layers[0].ln1_w, n, C,
                    stream);
    for (int l = 0; l < c->n_layer; l++) {
        const ModelParamsLayer *w = &model->params.layers[l];
        const ModelParams32Layer *w32 = &model->master.layers[l];
        const KindTensors tm = kind_tensors(w->mixer, w32->mixer, NULL), tf = kind_tensors(w->ffn, w32->ffn, NULL);
        const KindOps *mx = model->mixer_ops[l], *ff = model->ffn_ops[l];
        void *state = (char *)model->dec_state[l] + (size_t)b0 * mx->state_bytes(c, model->dec_context);
        if (T == 1) {
            mx->step(model->dec_branch, state, model->dec_work, model->dec_norm, &tm, c, nb, model->dec_pos,
                     model->dec_context, rt);
        } else {
            mx->advance(model->dec_branch, state, model->dec_work, model->dec_norm, &tm, c, nb, T, model->dec_pos,
                        model->dec_context, rt);
        }
        rmsnorm_forward(model->dec_norm, model->dec_rstd, model->dec_x, model->dec_x, model->dec_branch, w->ln2_w, n, C,
                        stream);
        if (T == 1) {
            ff->step(model->dec_branch, NULL, model->dec_work, model->dec_norm, &tf, c, nb, model->dec_pos,
                     model->dec_context, rt);
        } else {
            const size_t acts = ff->acts_bytes(c, nb, T, rt);
            ff->forward(model->dec_branch, model->dec_work, (char *)model->dec_work + acts, model->dec_norm, &tf, c, nb,
                        T, rt);
        }
        const floatX *next_w = l + 1 < c->n_layer ? model->params.layers[l + 1].ln1_w : model->params.lnf_w;
        rmsnorm_forward(model->dec_norm, model->dec_rstd, model->dec_x, model->dec_x, model->dec_branch, next_w, n, C,
                        stream);
    }
    const floatX *last = model->dec_norm;
    if (T > 1) { // each sequence's last row
        cudaCheck(cudaMemcpy2DAsync(model->dec_branch, C * sizeof(floatX), model->dec_norm + (size_t)(T - 1) * C,
                                    (size_t)T * C * sizeof(floatX), C * sizeof(floatX), nb, cudaMemcpyDeviceToDevice,
                                    stream));
        last = model->dec_branch;
    }
    matmul_forward(model->dec_logits + (size_t)b0 * Vp, last, model->params.lm_head, nb, C, Vp, rt);
}

// the step of all B sequences (tokens and positions already in dec_tokens, dec_pos) as one CUDA graph: captured on
// the second step (the first runs eagerly and sets the kernels' attributes), replayed after that, so a step costs one
// launch instead of a few hundred. Eager when M2RNN_NO_GRAPH=1, or (with a warning) when the capture fails.
static void decode_step_graph(Model *model) {
    cudaStream_t stream = model->rt.stream;
    if (model->dec_graph == NULL && !model->dec_graph_off && model->dec_steps >= 1) {
        cudaGraph_t graph = NULL;
        cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
        if (err == cudaSuccess) {
            decode_run(model, 0, model->dec_B, 1);
            err = cudaStreamEndCapture(stream, &graph);
        }
        if (err == cudaSuccess) { err = cudaGraphInstantiate(&model->dec_graph, graph, 0); }
        if (graph != NULL) { cudaGraphDestroy(graph); }
        if (err != cudaSuccess) {
            fprintf(stderr, "warning: the decode step could not be captured as a CUDA graph (%s); stepping eagerly\n",
                    cudaGetErrorString(err));
            (void)cudaGetLastError();
            model->dec_graph = NULL;
            model->dec_graph_off = 1;
        }
    }
    if (model->dec_graph != NULL) {
        cudaCheck(cudaGraphLaunch(model->dec_graph, stream));
    } else {
        decode_run(model, 0, model->dec_B, 1);
        model->dec_steps++;
    }
}

static void model_decode_advance(Model *model, int b0, int nb, const int *tokens, int T, const int *pos) {
    const ModelConfig *c = &model->config;
    cudaStream_t stream = model->rt.stream;
    decode_check_advance(model->dec_B, model->dec_context, b0, nb, T, pos);
    model_check_tokens(tokens, (size_t)nb * T, c->vocab_size, "decode");
    const int CH = T == 1 ? 1 : (DECODE_ROWS / nb > 0 ? DECODE_ROWS / nb : 1); // tokens a chunk, every sequence
    int *tok = (int *)mallocCheck((size_t)nb * (CH < T ? CH : T) * sizeof(int)), *cpos = (int *)mallocCheck((size_t)nb * sizeof(int));
    for (int s0 = 0; s0 < T; s0 += CH) {
        const int Tc = T - s0 < CH ? T - s0 : CH;
        for (int i = 0; i < nb; i++) {
            memcpy(tok + (size_t)i * Tc, tokens + (size_t)i * T + s0, (size_t)Tc * sizeof(int));
            cpos[i] = pos[i] + s0;
        }
        cudaCheck(cudaMemcpyAsync(model->dec_tokens, tok, (size_t)nb * Tc * sizeof(int), cudaMemcpyHostToDevice, stream));
        cudaCheck(cudaMemcpyAsync(model->dec_pos, cpos, (size_t)nb * sizeof(int), cudaMemcpyHostToDevice, stream));
        if (Tc == 1 && b0 == 0 && nb == model->dec_B) {
            decode_step_graph(model);
        } else {
            decode_run(model, b0, nb, Tc);
        }
        cudaCheck(cudaStreamSynchronize(stream)); // the host buffers are reused by the next chunk
    }
    free(tok);
    free(cpos);
}

static void model_decode_step(Model *model, const int *tokens, const int *pos) {
    if (model->dec_B == 0) { fail_with_hint("call model_decode_begin first", "model_decode_step without a decode state"); }
    model_decode_advance(model, 0, model->dec_B, tokens, 1, pos);
}

// the decode state of sequence b (every layer's, in layer order) to host memory / back
static size_t model_decode_state_size(const Model *model) {
    size_t n = 0;
    for (int l = 0; l < model->config.n_layer; l++) { n += model->mixer_ops[l]->state_bytes(&model->config, model->dec_context); }
    return n;
}
static void model_decode_state_io(Model *model, int b, void *buf, int save) {
    char *p = (char *)buf;
    for (int l = 0; l < model->config.n_layer; l++) {
        const size_t S = model->mixer_ops[l]->state_bytes(&model->config, model->dec_context);
        char *st = (char *)model->dec_state[l] + (size_t)b * S;
        cudaCheck(cudaMemcpy(save ? (void *)p : (void *)st, save ? (const void *)st : (const void *)p, S,
                             save ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice));
        p += S;
    }
}

static double model_aux_loss(const Model *model) { return 0.0; } // no GPU kind has an auxiliary loss yet

// the GPU trainer runs one process: its collectives (NCCL) are not written yet
static void model_set_parallel(Model *model, const Comm *comm) {
    if (comm->world > 1) {
        fail_with_hint("train on one GPU for now (data parallelism runs in the CPU trainer: mpirun -np N "
                       "./train_m2rnn_cpu)", "the CUDA trainer cannot run %d processes yet (NCCL not written)",
                       comm->world);
    }
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
