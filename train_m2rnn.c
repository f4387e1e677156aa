/*
train_m2rnn.c: the fp32 CPU reference trainer of the M²RNN hybrid (OpenMP), in the spirit of llm.c's train_gpt2.c.
Everything the CUDA trainer does is defined here first, in plain loops, and the CUDA code is checked against it:

  tokens (B,T) → embedding → L × [ x += Mixer(RMSNorm(x));  x += SwiGLU(RMSNorm(x)) ] → RMSNorm → LM head →
  cross-entropy over the real vocabulary of the padded one

with the mixer chosen per layer by the pattern (M = M²RNN, A = softmax attention). The backward walks the forward in
reverse with a hand-written gradient for every op (the ref/ headers); AdamW with decoupled weight decay on the parameter
table's decay set, linear warmup then cosine to a fraction of the peak learning rate, global grad-norm clipping.
Checkpoints hold the model, AdamW state, the dataloader state and the RNG: a resumed run continues bit for bit.

Build with -DM2RNN_REAL_DOUBLE to get the same code in float64 (the gradient checks do).
*/
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "utils.h"      // defines: check macros, fail_with_hint, CLI number parsing
#include "model.h"      // defines: ModelConfig, descriptor parsing, ParamTable, model_init_parameters, FLOP counts
#include "ref/common.h" // defines: real, LayerWeights, matmul, RMSNorm, embedding, classifier, conv, AdamW
#include "ref/m2rnn.h"  // defines: the M²RNN recurrence, gate and mixer
#include "ref/attention.h" // defines: causal attention (NoPE / RoPE)
#include "ref/mlp.h"    // defines: SwiGLU MLP

// ----------------------------------------------------------------------------------------------------------------
// the model

typedef struct {
    real *wte;     // (Vp, C)
    real *lnf_w;   // (C)
    real *lm_head; // (Vp, C)
    LayerWeights layers[MAX_LAYERS];
} ModelWeights; // laid out as model_view_slot() expects
_Static_assert(sizeof(ModelWeights) == sizeof(real *) * (3 + MAX_LAYERS * NUM_LAYER_PARAM_KINDS), "ModelWeights layout");

static void point_views(ModelWeights *w, real *memory, const ParamTable *t) {
    memset(w, 0, sizeof(*w));
    for (int i = 0; i < t->num_specs; i++) {
        *(real **)model_view_slot(w, t->specs[i].layer, t->specs[i].kind) = memory + t->specs[i].offset;
    }
}

typedef struct {
    real *resid_in;  // (B,T,C) residual stream entering the layer
    real *ln1_out;   // (B,T,C)
    real *ln1_rstd;  // (B,T)
    real *resid_mid; // (B,T,C) resid_in + the mixer's output
    real *ln2_out;   // (B,T,C)
    real *ln2_rstd;  // (B,T)
    M2RNNActs m;     // when the layer is 'M'
    AttnActs a;      // when the layer is 'A'
    MLPActs mlp;
} LayerActs;

typedef struct {
    ModelConfig config;
    ParamTable table;
    real *params_memory, *grads_memory; // (num_parameters) each
    real *m_memory, *v_memory;          // AdamW moments, allocated at the first update
    ModelWeights params, grads;
    // activations, sized for (B, T) at the first forward
    int B, T;
    real *acts_memory;
    LayerActs layer_acts[MAX_LAYERS];
    real *resid_out; // (B,T,C) after the last layer
    real *branch_out; // (B,T,C) a mixer's or MLP's output, scratch shared by the layers
    real *lnf_out;   // (B,T,C)
    real *lnf_rstd;  // (B,T)
    real *logits;    // (B,T,Vp); the backward overwrites them with dlogits
    real *losses;    // (B,T)
    int *inputs, *targets; // (B,T) copies of the last forward's batch
    // gradient scratch, reused by every layer in turn
    real *grad_scratch_memory;
    size_t grad_scratch_size; // elements
    real *d_resid;   // (B,T,C) gradient of the residual stream
    real *d_norm;    // (B,T,C) gradient of a norm's output (= of the mixer's or MLP's input)
    M2RNNGrads gm;
    AttnGrads ga;
    MLPGrads gmlp;
    real mean_loss; // of the last forward with targets, -1 otherwise
} Model;

void model_build(Model *model, const ModelConfig *config) {
    memset(model, 0, sizeof(*model));
    model->config = *config;
    model_config_fill_defaults(&model->config);
    model_config_validate(&model->config);
    param_table_build(&model->table, &model->config);
    const size_t n = model->table.num_parameters;
    model->params_memory = (real *)callocCheck(n, sizeof(real));
    model->grads_memory = (real *)callocCheck(n, sizeof(real));
    point_views(&model->params, model->params_memory, &model->table);
    point_views(&model->grads, model->grads_memory, &model->table);
    model->mean_loss = -1;
}

void model_init_weights(Model *model, uint64_t seed) {
    const size_t n = model->table.num_parameters;
    float *init = (float *)mallocCheck(n * sizeof(float));
    model_init_parameters(init, &model->table, seed);
    for (size_t i = 0; i < n; i++) { model->params_memory[i] = (real)init[i]; }
    free(init);
}

// Hands out consecutive slices of one buffer. Called once with base == NULL to measure, then for real.
typedef struct { real *base; size_t used; } Arena;
static real *arena_take(Arena *a, size_t n) {
    real *p = a->base != NULL ? a->base + a->used : NULL;
    a->used += n;
    return p;
}

static void model_layout_activations(Model *model, Arena *acts, Arena *grads) {
    const ModelConfig *c = &model->config;
    const size_t BT = (size_t)model->B * model->T, C = (size_t)c->d_model;
    const size_t R = (size_t)m2rnn_proj_rows(c), CD = (size_t)m2rnn_conv_dim(c);
    const size_t N = (size_t)c->rnn_heads, NV = N * c->rnn_v, state = (size_t)c->rnn_k * c->rnn_v;
    const size_t inner = (size_t)c->attn_heads * c->attn_head_dim, F = (size_t)c->mlp_hidden;
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs *la = &model->layer_acts[l];
        memset(la, 0, sizeof(*la));
        la->resid_in = arena_take(acts, BT * C);
        la->ln1_out = arena_take(acts, BT * C);
        la->ln1_rstd = arena_take(acts, BT);
        la->resid_mid = arena_take(acts, BT * C);
        la->ln2_out = arena_take(acts, BT * C);
        la->ln2_rstd = arena_take(acts, BT);
        if (c->pattern[l] == 'M') {
            la->m.proj = arena_take(acts, BT * R);
            la->m.conv_pre = arena_take(acts, BT * CD);
            la->m.conv_act = arena_take(acts, BT * CD);
            la->m.f = arena_take(acts, BT * N);
            la->m.h = arena_take(acts, BT * N * state);
            la->m.z = arena_take(acts, BT * N * state);
            la->m.y = arena_take(acts, BT * NV);
            la->m.gated = arena_take(acts, BT * NV);
            la->m.normed = arena_take(acts, BT * NV);
            la->m.rstd = arena_take(acts, BT);
        } else {
            la->a.qkv = arena_take(acts, BT * 3 * inner);
            la->a.att = arena_take(acts, (size_t)model->B * c->attn_heads * model->T * model->T);
            la->a.y = arena_take(acts, BT * inner);
        }
        la->mlp.up = arena_take(acts, BT * 2 * F);
        la->mlp.h = arena_take(acts, BT * F);
    }
    model->resid_out = arena_take(acts, BT * C);
    model->branch_out = arena_take(acts, BT * C);
    model->lnf_out = arena_take(acts, BT * C);
    model->lnf_rstd = arena_take(acts, BT);
    model->logits = arena_take(acts, BT * c->padded_vocab_size);
    model->losses = arena_take(acts, BT);
    // gradient scratch: one set, sized for the largest layer of each kind
    model->d_resid = arena_take(grads, BT * C);
    model->d_norm = arena_take(grads, BT * C);
    if (strchr(c->pattern, 'M') != NULL) {
        model->gm.proj = arena_take(grads, BT * R);
        model->gm.conv_act = arena_take(grads, BT * CD);
        model->gm.f = arena_take(grads, BT * N);
        model->gm.y = arena_take(grads, BT * NV);
        model->gm.gated = arena_take(grads, BT * NV);
        model->gm.normed = arena_take(grads, BT * NV);
    }
    if (strchr(c->pattern, 'A') != NULL) {
        model->ga.qkv = arena_take(grads, BT * 3 * inner);
        model->ga.att = arena_take(grads, (size_t)model->B * c->attn_heads * model->T * model->T);
        model->ga.y = arena_take(grads, BT * inner);
    }
    model->gmlp.up = arena_take(grads, BT * 2 * F);
    model->gmlp.h = arena_take(grads, BT * F);
}

static void model_ensure_activations(Model *model, int B, int T) {
    if (model->acts_memory != NULL && model->B == B && model->T == T) { return; }
    free(model->acts_memory);
    free(model->grad_scratch_memory);
    free(model->inputs);
    free(model->targets);
    model->B = B;
    model->T = T;
    Arena acts = {NULL, 0}, grads = {NULL, 0};
    model_layout_activations(model, &acts, &grads);
    model->acts_memory = (real *)callocCheck(acts.used, sizeof(real));
    model->grad_scratch_memory = (real *)callocCheck(grads.used, sizeof(real));
    model->grad_scratch_size = grads.used;
    Arena a2 = {model->acts_memory, 0}, g2 = {model->grad_scratch_memory, 0};
    model_layout_activations(model, &a2, &g2);
    model->inputs = (int *)mallocCheck((size_t)B * T * sizeof(int));
    model->targets = (int *)mallocCheck((size_t)B * T * sizeof(int));
}

// Forward pass over inputs (B,T); with targets (B,T) also the mean loss. Returns the mean loss or -1.
real model_forward(Model *model, const int *inputs, const int *targets, int B, int T) {
    const ModelConfig *c = &model->config;
    const int BT = B * T, C = c->d_model, V = c->vocab_size, Vp = c->padded_vocab_size;
    model_ensure_activations(model, B, T);
    model_check_tokens(inputs, (size_t)BT, V, "input");
    memcpy(model->inputs, inputs, (size_t)BT * sizeof(int));
    real *x = model->layer_acts[0].resid_in;
    embedding_forward(x, inputs, model->params.wte, BT, C);
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs *la = &model->layer_acts[l];
        const LayerWeights *w = &model->params.layers[l];
        rmsnorm_forward(la->ln1_out, la->ln1_rstd, la->resid_in, w->ln1_w, BT, C);
        real *branch = model->branch_out; // the mixer's, then the MLP's output, added to the stream right away
        if (c->pattern[l] == 'M') { m2rnn_mixer_forward(branch, &la->m, la->ln1_out, w, c, B, T); }
        else { attention_forward(branch, &la->a, la->ln1_out, w, c, B, T); }
        for (size_t i = 0; i < (size_t)BT * C; i++) { la->resid_mid[i] = la->resid_in[i] + branch[i]; }
        rmsnorm_forward(la->ln2_out, la->ln2_rstd, la->resid_mid, w->ln2_w, BT, C);
        swiglu_mlp_forward(branch, &la->mlp, la->ln2_out, w, c, BT);
        real *next = l + 1 < c->n_layer ? model->layer_acts[l + 1].resid_in : model->resid_out;
        for (size_t i = 0; i < (size_t)BT * C; i++) { next[i] = la->resid_mid[i] + branch[i]; }
    }
    rmsnorm_forward(model->lnf_out, model->lnf_rstd, model->resid_out, model->params.lnf_w, BT, C);
    matmul_forward(model->logits, model->lnf_out, model->params.lm_head, BT, C, Vp);
    if (targets == NULL) {
        model->mean_loss = -1;
        return -1;
    }
    model_check_tokens(targets, (size_t)BT, V, "target");
    memcpy(model->targets, targets, (size_t)BT * sizeof(int));
    crossentropy_forward(model->losses, model->logits, targets, BT, V, Vp);
    double sum = 0.0;
    for (int i = 0; i < BT; i++) { sum += model->losses[i]; }
    model->mean_loss = (real)(sum / BT);
    return model->mean_loss;
}

void model_zero_grad(Model *model) { memset(model->grads_memory, 0, model->table.num_parameters * sizeof(real)); }

// Backward of the last forward (which must have had targets); parameter grads accumulate (+=) scaled so that the
// loss being differentiated is loss_scale · mean loss (loss_scale = 1/accumulation steps).
void model_backward(Model *model, float loss_scale) {
    const ModelConfig *c = &model->config;
    if (model->mean_loss < 0) {
        fail_with_hint("call model_forward with targets first", "model_backward without a forward pass with targets");
    }
    const int B = model->B, T = model->T, BT = B * T, C = c->d_model, Vp = c->padded_vocab_size;
    memset(model->grad_scratch_memory, 0, model->grad_scratch_size * sizeof(real));
    // loss = mean over tokens, so each token's dloss is loss_scale / BT
    crossentropy_softmax_backward_inplace(model->logits, model->targets, (real)loss_scale / BT, BT, c->vocab_size, Vp);
    real *dlogits = model->logits;
    matmul_backward(model->d_norm, model->grads.lm_head, dlogits, model->lnf_out, model->params.lm_head, BT, C, Vp);
    rmsnorm_backward(model->d_resid, model->grads.lnf_w, model->d_norm, model->resid_out, model->params.lnf_w,
                     model->lnf_rstd, BT, C);
    model->mean_loss = -1; // the logits are gone: a second backward needs a new forward
    for (int l = c->n_layer - 1; l >= 0; l--) {
        LayerActs *la = &model->layer_acts[l];
        const LayerWeights *w = &model->params.layers[l];
        LayerWeights *gw = &model->grads.layers[l];
        // every scratch gradient but d_resid (laid out first) starts at zero for this layer
        memset(model->d_norm, 0, (model->grad_scratch_size - (size_t)BT * C) * sizeof(real));
        // x_out = resid_mid + MLP(RMSNorm(resid_mid)): d_resid flows through, and into the MLP branch
        swiglu_mlp_backward(model->d_norm, gw, &model->gmlp, model->d_resid, la->ln2_out, &la->mlp, w, c, BT);
        rmsnorm_backward(model->d_resid, gw->ln2_w, model->d_norm, la->resid_mid, w->ln2_w, la->ln2_rstd, BT, C);
        // resid_mid = resid_in + Mixer(RMSNorm(resid_in))
        memset(model->d_norm, 0, (size_t)BT * C * sizeof(real));
        if (c->pattern[l] == 'M') {
            m2rnn_mixer_backward(model->d_norm, gw, &model->gm, model->d_resid, la->ln1_out, &la->m, w, c, B, T);
        } else {
            attention_backward(model->d_norm, gw, &model->ga, model->d_resid, la->ln1_out, &la->a, w, c, B, T);
        }
        rmsnorm_backward(model->d_resid, gw->ln1_w, model->d_norm, la->resid_in, w->ln1_w, la->ln1_rstd, BT, C);
    }
    embedding_backward(model->grads.wte, model->d_resid, model->inputs, BT, C);
}

// global L2 norm of the gradients, summed in fixed chunks: the same bits whatever the thread count
double model_grad_norm(const Model *model) {
    const size_t n = model->table.num_parameters;
    enum { CHUNKS = 64 };
    double partial[CHUNKS];
#pragma omp parallel for schedule(static)
    for (int ch = 0; ch < CHUNKS; ch++) {
        size_t i0 = n * ch / CHUNKS, i1 = n * (ch + 1) / CHUNKS;
        double s = 0.0;
        for (size_t i = i0; i < i1; i++) { s += (double)model->grads_memory[i] * model->grads_memory[i]; }
        partial[ch] = s;
    }
    double total = 0.0;
    for (int ch = 0; ch < CHUNKS; ch++) { total += partial[ch]; }
    return sqrt(total);
}


// One AdamW step (step counts from 1). Gradients are scaled by min(1, grad_clip / norm). Returns the grad norm.
double model_update(Model *model, const OptimizerConfig *opt, int step) {
    const size_t n = model->table.num_parameters;
    if (model->m_memory == NULL) {
        model->m_memory = (real *)callocCheck(n, sizeof(real));
        model->v_memory = (real *)callocCheck(n, sizeof(real));
    }
    const double norm = model_grad_norm(model);
    const float scale = (opt->grad_clip > 0 && norm > opt->grad_clip) ? (float)(opt->grad_clip / norm) : 1.0f;
    for (int i = 0; i < model->table.num_specs; i++) {
        const ParamSpec *s = &model->table.specs[i];
        adamw_update(model->params_memory + s->offset, model->m_memory + s->offset, model->v_memory + s->offset,
                     model->grads_memory + s->offset, s->numel, opt->lr, opt->beta1, opt->beta2, opt->eps,
                     s->weight_decay ? opt->weight_decay : 0.0f, step, scale);
    }
    return norm;
}

void model_free(Model *model) {
    free(model->params_memory);
    free(model->grads_memory);
    free(model->m_memory);
    free(model->v_memory);
    free(model->acts_memory);
    free(model->grad_scratch_memory);
    free(model->inputs);
    free(model->targets);
    memset(model, 0, sizeof(*model));
}


// ----------------------------------------------------------------------------------------------------------------
// what the shared training loop needs from an executor (train_loop.h)

typedef real master_t;
#define EXECUTOR_NAME "./train_m2rnn_cpu (CPU reference, OpenMP)"
static double executor_peak_flops(void) { return 0; }
static void executor_sync(void) {}

static int model_has_optimizer(const Model *model) { return model->m_memory != NULL; }

static void model_read_state(const Model *model, master_t *params, master_t *m, master_t *v) {
    const size_t bytes = model->table.num_parameters * sizeof(real);
    memcpy(params, model->params_memory, bytes);
    if (m != NULL && model->m_memory != NULL) { memcpy(m, model->m_memory, bytes); memcpy(v, model->v_memory, bytes); }
}

// m, v NULL: a fresh optimizer
static void model_write_state(Model *model, const master_t *params, const master_t *m, const master_t *v) {
    const size_t n = model->table.num_parameters, bytes = n * sizeof(real);
    memcpy(model->params_memory, params, bytes);
    free(model->m_memory);
    free(model->v_memory);
    model->m_memory = model->v_memory = NULL;
    if (m != NULL) {
        model->m_memory = (real *)mallocCheck(bytes);
        model->v_memory = (real *)mallocCheck(bytes);
        memcpy(model->m_memory, m, bytes);
        memcpy(model->v_memory, v, bytes);
    }
}

static void model_logits_row(Model *model, int b, int t, float *out) {
    const int Vp = model->config.padded_vocab_size;
    const real *row = model->logits + ((size_t)b * model->T + t) * Vp;
    for (int i = 0; i < Vp; i++) { out[i] = (float)row[i]; }
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
