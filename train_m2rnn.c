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
#include "checkpoint.h" // defines: the checkpoint format, atomic write, validated read
#include "dataloader.h" // defines: DataLoader over llm.c token shards

// ----------------------------------------------------------------------------------------------------------------
// the model

typedef struct {
    real *wte;     // (Vp, C)
    real *lnf_w;   // (C)
    real *lm_head; // (Vp, C)
    LayerWeights layers[MAX_LAYERS];
} ModelWeights;

// the slot in `w` that spec (layer, kind) points to
static real **param_view_slot(ModelWeights *w, int layer, int kind) {
    if (layer < 0) { return kind == PK_wte ? &w->wte : (kind == PK_lnf_w ? &w->lnf_w : &w->lm_head); }
    return &((real **)&w->layers[layer])[kind];
}

static void point_views(ModelWeights *w, real *memory, const ParamTable *t) {
    memset(w, 0, sizeof(*w));
    for (int i = 0; i < t->num_specs; i++) {
        *param_view_slot(w, t->specs[i].layer, t->specs[i].kind) = memory + t->specs[i].offset;
    }
}

typedef struct {
    real *resid_in;  // (B,T,C) residual stream entering the layer
    real *ln1_out;   // (B,T,C)
    real *ln1_rstd;  // (B,T)
    real *mixer_out; // (B,T,C)
    real *resid_mid; // (B,T,C) resid_in + mixer_out
    real *ln2_out;   // (B,T,C)
    real *ln2_rstd;  // (B,T)
    real *mlp_out;   // (B,T,C)
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
        la->mixer_out = arena_take(acts, BT * C);
        la->resid_mid = arena_take(acts, BT * C);
        la->ln2_out = arena_take(acts, BT * C);
        la->ln2_rstd = arena_take(acts, BT);
        la->mlp_out = arena_take(acts, BT * C);
        if (c->pattern[l] == 'M') {
            la->m.proj = arena_take(acts, BT * R);
            la->m.conv_pre = arena_take(acts, BT * CD);
            la->m.conv_act = arena_take(acts, BT * CD);
            la->m.f = arena_take(acts, BT * N);
            la->m.h = arena_take(acts, BT * N * state);
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

static void check_tokens(const int *tokens, size_t n, int vocab_size, const char *what) {
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= vocab_size) {
            fail_with_hint("the data was tokenized with a larger vocabulary than the model's; check -e / the shards",
                           "%s token %d at position %zu is outside the model's vocabulary [0, %d)", what, tokens[i], i,
                           vocab_size);
        }
    }
}

// Forward pass over inputs (B,T); with targets (B,T) also the mean loss. Returns the mean loss or -1.
real model_forward(Model *model, const int *inputs, const int *targets, int B, int T) {
    const ModelConfig *c = &model->config;
    const int BT = B * T, C = c->d_model, V = c->vocab_size, Vp = c->padded_vocab_size;
    model_ensure_activations(model, B, T);
    check_tokens(inputs, (size_t)BT, V, "input");
    memcpy(model->inputs, inputs, (size_t)BT * sizeof(int));
    real *x = model->layer_acts[0].resid_in;
    embedding_forward(x, inputs, model->params.wte, BT, C);
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs *la = &model->layer_acts[l];
        const LayerWeights *w = &model->params.layers[l];
        rmsnorm_forward(la->ln1_out, la->ln1_rstd, la->resid_in, w->ln1_w, BT, C);
        if (c->pattern[l] == 'M') { m2rnn_mixer_forward(la->mixer_out, &la->m, la->ln1_out, w, c, B, T); }
        else { attention_forward(la->mixer_out, &la->a, la->ln1_out, w, c, B, T); }
        for (size_t i = 0; i < (size_t)BT * C; i++) { la->resid_mid[i] = la->resid_in[i] + la->mixer_out[i]; }
        rmsnorm_forward(la->ln2_out, la->ln2_rstd, la->resid_mid, w->ln2_w, BT, C);
        swiglu_mlp_forward(la->mlp_out, &la->mlp, la->ln2_out, w, c, BT);
        real *next = l + 1 < c->n_layer ? model->layer_acts[l + 1].resid_in : model->resid_out;
        for (size_t i = 0; i < (size_t)BT * C; i++) { next[i] = la->resid_mid[i] + la->mlp_out[i]; }
    }
    rmsnorm_forward(model->lnf_out, model->lnf_rstd, model->resid_out, model->params.lnf_w, BT, C);
    matmul_forward(model->logits, model->lnf_out, model->params.lm_head, BT, C, Vp);
    if (targets == NULL) {
        model->mean_loss = -1;
        return -1;
    }
    check_tokens(targets, (size_t)BT, V, "target");
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
void model_backward(Model *model, real loss_scale) {
    const ModelConfig *c = &model->config;
    if (model->mean_loss < 0) {
        fail_with_hint("call model_forward with targets first", "model_backward without a forward pass with targets");
    }
    const int B = model->B, T = model->T, BT = B * T, C = c->d_model, Vp = c->padded_vocab_size;
    memset(model->grad_scratch_memory, 0, model->grad_scratch_size * sizeof(real));
    // loss = mean over tokens, so each token's dloss is loss_scale / BT
    crossentropy_softmax_backward_inplace(model->logits, model->targets, loss_scale / BT, BT, c->vocab_size, Vp);
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

typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
} OptimizerConfig;

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
// learning-rate schedule: linear warmup to lr, then cosine down to final_frac · lr at the last step

static float lr_at_step(int step, int total_steps, float lr, int warmup, float final_frac) {
    if (step < warmup) { return lr * (float)(step + 1) / (float)warmup; }
    if (total_steps <= warmup) { return lr; }
    double progress = (double)(step - warmup) / (double)(total_steps - warmup);
    if (progress > 1.0) { progress = 1.0; }
    const double min_lr = lr * final_frac;
    return (float)(min_lr + 0.5 * (1.0 + cos(M_PI * progress)) * (lr - min_lr));
}

// ----------------------------------------------------------------------------------------------------------------
// the training run

typedef struct {
    const char *train_pattern, *val_pattern; // shard globs
    const char *init;      // model descriptor ("d256:l4:MMAM") or a checkpoint file (*.bin)
    const char *out_dir;   // logs and checkpoints; NULL = none
    int vocab_size;        // of a model built from a descriptor (a checkpoint carries its own)
    int B, T;              // micro-batch
    int total_batch;       // tokens per optimizer step; a multiple of B·T (gradient accumulation)
    int max_steps;
    float lr, final_lr_frac, weight_decay, grad_clip, rnn_clamp;
    int warmup;
    int val_every, val_batches;
    int ckpt_every, ckpt_keep, ckpt_major, resume;
    int overfit;           // 1: train on the first batch only
    int threads;
    uint64_t seed;
    int quiet;             // 1: no per-step lines (tests)
    float *loss_trace;     // if not NULL: (max_steps) the train loss of each step (tests)
} TrainOptions;

static TrainOptions train_options_default(void) {
    TrainOptions o;
    memset(&o, 0, sizeof(o));
    o.train_pattern = "dev/data/gutenberg/gutenberg_train_*.bin";
    o.val_pattern = "dev/data/gutenberg/gutenberg_val_*.bin";
    o.init = "d256:l4:MMAM";
    o.vocab_size = 50257;
    o.B = 4; o.T = 256; o.total_batch = 0; o.max_steps = 200;
    o.lr = 1e-3f; o.final_lr_frac = 0.1f; o.weight_decay = 0.1f; o.grad_clip = 1.0f; o.rnn_clamp = 1.0f;
    o.warmup = 20; o.val_every = 50; o.val_batches = 10;
    o.ckpt_every = 0; o.ckpt_keep = 0; o.ckpt_major = 0; o.resume = 0;
    o.seed = 1337;
    return o;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void log_line(const char *out_dir, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_line(const char *out_dir, const char *fmt, ...) {
    if (out_dir == NULL) { return; }
    char path[4096];
    snprintf(path, sizeof(path), "%s/main.log", out_dir);
    FILE *fp = fopenCheck(path, "a");
    va_list args;
    va_start(args, fmt);
    vfprintf(fp, fmt, args);
    va_end(args);
    fcloseCheck(fp);
}

static void save_checkpoint(const TrainOptions *o, const Model *model, int step, int grad_accum, uint64_t rng_state,
                            const DataLoader *loader) {
    CheckpointHeader h;
    memset(&h, 0, sizeof(h));
    h.config = model->config;
    h.elem_bytes = (int)sizeof(real);
    h.has_optimizer = model->m_memory != NULL;
    h.num_parameters = model->table.num_parameters;
    h.step = step; h.B = o->B; h.T = o->T; h.grad_accum = grad_accum;
    h.rng_state = rng_state;
    DataLoaderState state;
    memset(&state, 0, sizeof(state));
    if (loader != NULL) { dataloader_get_state(loader, &state); }
    h.loader_state_bytes = loader != NULL ? (uint32_t)sizeof(state) : 0;
    char path[4096];
    checkpoint_path(path, sizeof(path), o->out_dir, step);
    checkpoint_write(path, &h, model->params_memory, model->m_memory, model->v_memory, &state);
    checkpoint_prune(o->out_dir, o->ckpt_keep, o->ckpt_major);
}

static real validate(Model *model, DataLoader *val, int max_batches) {
    dataloader_reset(val);
    int batches = (int)dataloader_num_batches(val);
    if (max_batches > 0 && batches > max_batches) { batches = max_batches; }
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(val);
        sum += model_forward(model, val->inputs, val->targets, (int)val->B, (int)val->T);
    }
    return (real)(sum / (batches > 0 ? batches : 1));
}

// Runs training as the options say. Returns the last step's train loss.
real train_run(const TrainOptions *o) {
#ifdef _OPENMP
    if (o->threads > 0) { omp_set_num_threads(o->threads); }
#endif
    const int tokens_per_micro = o->B * o->T;
    const int total_batch = o->total_batch > 0 ? o->total_batch : tokens_per_micro;
    if (total_batch % tokens_per_micro != 0) {
        fail_with_hint("make -d a multiple of -b times -t",
                       "total batch %d tokens is not a multiple of B*T = %d*%d = %d", total_batch, o->B, o->T,
                       tokens_per_micro);
    }
    const int grad_accum = total_batch / tokens_per_micro;
    if (o->out_dir != NULL) { create_dir_if_not_exists(o->out_dir); }

    // where the model comes from: a checkpoint to resume, a checkpoint file, or a descriptor
    char ckpt_path[4096] = {0};
    if (o->resume) {
        if (o->out_dir == NULL) { fail_with_hint("pass -o DIR together with -y 1", "resume (-y 1) needs an output directory"); }
        int last = checkpoint_find_latest(o->out_dir);
        if (last >= 0) { checkpoint_path(ckpt_path, sizeof(ckpt_path), o->out_dir, last); }
        else if (!o->quiet) { printf("no checkpoint in %s: starting from scratch\n", o->out_dir); }
    } else if (ends_with(o->init, ".bin")) {
        snprintf(ckpt_path, sizeof(ckpt_path), "%s", o->init);
    }
    CheckpointHeader ckpt;
    memset(&ckpt, 0, sizeof(ckpt));
    ModelConfig config;
    memset(&config, 0, sizeof(config));
    if (ckpt_path[0] != '\0') {
        checkpoint_read_header(ckpt_path, &ckpt);
        if (ckpt.elem_bytes != (int)sizeof(real)) {
            fail_with_hint("use a checkpoint written by a build with the same precision",
                           "checkpoint '%s' holds %d-byte numbers, this build uses %d", ckpt_path, ckpt.elem_bytes,
                           (int)sizeof(real));
        }
        config = ckpt.config;
    } else {
        config.rnn_grad_clamp = o->rnn_clamp;
        config.vocab_size = o->vocab_size;
        model_config_from_descriptor(&config, o->init);
    }
    Model model;
    model_build(&model, &config);
    if (ckpt_path[0] != '\0' && model.table.num_parameters != ckpt.num_parameters) {
        fail_with_hint("the checkpoint is damaged or from another m2rnn version",
                       "checkpoint '%s' holds %llu parameters, its config implies %zu", ckpt_path,
                       (unsigned long long)ckpt.num_parameters, model.table.num_parameters);
    }
    const int resuming = o->resume && ckpt_path[0] != '\0';
    if (resuming && (ckpt.B != o->B || ckpt.T != o->T || ckpt.grad_accum != grad_accum)) {
        fail_with_hint("resume with the -b, -t and -d the run was started with",
                       "checkpoint '%s' was trained with B=%d T=%d accumulation %d, this run asks B=%d T=%d "
                       "accumulation %d", ckpt_path, ckpt.B, ckpt.T, ckpt.grad_accum, o->B, o->T, grad_accum);
    }

    DataLoader train_loader, val_loader;
    dataloader_init(&train_loader, o->train_pattern, (size_t)o->B, (size_t)o->T, 0, 1, 1, o->seed,
                    model.config.vocab_size);
    const int have_val = o->val_pattern != NULL && o->val_pattern[0] != '\0' && o->val_every > 0;
    if (have_val) {
        dataloader_init(&val_loader, o->val_pattern, (size_t)o->B, (size_t)o->T, 0, 1, 0, o->seed,
                        model.config.vocab_size);
    }

    int start_step = 0;
    uint64_t rng_state = o->seed;
    if (ckpt_path[0] != '\0') {
        DataLoaderState loader_state;
        int restore_optimizer = resuming && ckpt.has_optimizer;
        if (restore_optimizer) {
            model.m_memory = (real *)callocCheck(model.table.num_parameters, sizeof(real));
            model.v_memory = (real *)callocCheck(model.table.num_parameters, sizeof(real));
        }
        if (resuming && ckpt.loader_state_bytes != sizeof(DataLoaderState)) {
            fail_with_hint("resume from a checkpoint written by this version of train_m2rnn",
                           "checkpoint '%s' has a %u-byte dataloader state, this build's is %zu", ckpt_path,
                           ckpt.loader_state_bytes, sizeof(DataLoaderState));
        }
        checkpoint_read_payload(ckpt_path, &ckpt, model.params_memory, restore_optimizer ? model.m_memory : NULL,
                                restore_optimizer ? model.v_memory : NULL, resuming ? &loader_state : NULL);
        if (resuming) {
            dataloader_set_state(&train_loader, &loader_state);
            start_step = ckpt.step;
            rng_state = ckpt.rng_state;
        }
    } else {
        model_init_weights(&model, o->seed);
    }

    const ModelConfig *c = &model.config;
    if (!o->quiet) {
        printf("+-----------------------+----------------------------------------------------+\n");
        printf("| model                 | d%d:l%d:%s\n", c->d_model, c->n_layer, c->pattern);
        printf("| parameters            | %zu\n", model.table.num_parameters);
        printf("| M2RNN N, Nq, K, V     | %d, %d, %d, %d (conv %d, dH clamp %g)\n", c->rnn_heads, c->rnn_qk_heads,
               c->rnn_k, c->rnn_v, c->conv_width, c->rnn_grad_clamp);
        printf("| attention heads x dim | %d x %d (%s)\n", c->attn_heads, c->attn_head_dim, c->use_rope ? "RoPE" : "NoPE");
        printf("| MLP hidden, vocab     | %d, %d (padded %d)\n", c->mlp_hidden, c->vocab_size, c->padded_vocab_size);
        printf("| B, T, accumulation    | %d, %d, %d (%d tokens per step)\n", o->B, o->T, grad_accum, total_batch);
        printf("| train tokens          | %zu (%s)\n", train_loader.num_tokens, o->train_pattern);
        if (have_val) { printf("| val tokens            | %zu (%s)\n", val_loader.num_tokens, o->val_pattern); }
        printf("| steps, lr, warmup     | %d, %g, %d (cosine to %g x)\n", o->max_steps, o->lr, o->warmup,
               o->final_lr_frac);
#ifdef _OPENMP
        printf("| OpenMP threads        | %d\n", omp_get_max_threads());
#endif
        printf("+-----------------------+----------------------------------------------------+\n");
        if (resuming) { printf("resumed from %s at step %d\n", ckpt_path, start_step); }
    }

    OptimizerConfig opt = {o->lr, 0.9f, 0.95f, 1e-10f, o->weight_decay, o->grad_clip};
    const double flops_per_step = model_flops_per_token(c, o->T) * total_batch;
    double time_sum = 0.0;
    int timed_steps = 0;
    real last_loss = -1;
    if (o->overfit) { dataloader_next_batch(&train_loader); }
    for (int step = start_step; step < o->max_steps; step++) {
        const int last_step = step == o->max_steps - 1;
        if (have_val && (step % o->val_every == 0 || last_step)) {
            real val_loss = validate(&model, &val_loader, o->val_batches);
            if (!o->quiet) { printf("step %5d | val loss %.6f\n", step, val_loss); }
            log_line(o->out_dir, "s:%d tel:%.6f\n", step, val_loss);
        }
        const double t0 = wall_seconds();
        model_zero_grad(&model);
        double loss_sum = 0.0;
        for (int micro = 0; micro < grad_accum; micro++) {
            if (!o->overfit) { dataloader_next_batch(&train_loader); }
            loss_sum += model_forward(&model, train_loader.inputs, train_loader.targets, o->B, o->T);
            model_backward(&model, (real)1.0 / grad_accum);
        }
        opt.lr = lr_at_step(step, o->max_steps, o->lr, o->warmup, o->final_lr_frac);
        const double norm = model_update(&model, &opt, step + 1);
        const double dt = wall_seconds() - t0;
        last_loss = (real)(loss_sum / grad_accum);
        if (o->loss_trace != NULL) { o->loss_trace[step] = (float)last_loss; }
        if (step > start_step) { time_sum += dt; timed_steps++; } // the first step warms caches: not timed
        const double avg = timed_steps > 0 ? time_sum / timed_steps : dt;
        if (!o->quiet) {
            printf("step %5d/%d | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s | %.2f GFLOP/s | ETA %.1f min\n",
                   step + 1, o->max_steps, last_loss, norm, opt.lr, 1000.0 * dt, total_batch / dt,
                   flops_per_step / dt * 1e-9, avg * (o->max_steps - step - 1) / 60.0);
            fflush(stdout);
        }
        log_line(o->out_dir, "s:%d trl:%.6f lr:%.6e norm:%.4f\n", step + 1, last_loss, opt.lr, norm);
        if (o->out_dir != NULL && ((o->ckpt_every > 0 && (step + 1) % o->ckpt_every == 0) ||
                                   (o->ckpt_every > 0 && last_step))) {
            save_checkpoint(o, &model, step + 1, grad_accum, rng_state, &train_loader);
        }
    }
    if (!o->quiet && timed_steps > 0) { printf("average step time %.1f ms\n", 1000.0 * time_sum / timed_steps); }
    dataloader_free(&train_loader);
    if (have_val) { dataloader_free(&val_loader); }
    model_free(&model);
    return last_loss;
}

// ----------------------------------------------------------------------------------------------------------------
// CLI

static void print_usage(void) {
    TrainOptions d = train_options_default();
    fprintf(stderr, "usage: ./train_m2rnn [-flag value]...   (CPU fp32 reference trainer)\n");
    fprintf(stderr, "  -i  train shards glob            (%s)\n", d.train_pattern);
    fprintf(stderr, "  -j  val shards glob, \"\" = none   (%s)\n", d.val_pattern);
    fprintf(stderr, "  -e  model descriptor or ckpt.bin (%s)\n", d.init);
    fprintf(stderr, "      descriptor fields: dNNN width, lNN layers, pattern of M/A letters, nNN M2RNN heads,\n");
    fprintf(stderr, "      qNN M2RNN q/k heads (1 or N), kNN K, vNN V, hNN attention heads, fNNN MLP hidden, rope\n");
    fprintf(stderr, "  -vs vocabulary size of a model built from a descriptor (%d = GPT-2)\n", d.vocab_size);
    fprintf(stderr, "  -o  output dir for main.log and checkpoints (none)\n");
    fprintf(stderr, "  -b  micro-batch size B           (%d)\n", d.B);
    fprintf(stderr, "  -t  sequence length T            (%d)\n", d.T);
    fprintf(stderr, "  -d  total batch in tokens, a multiple of B*T; 0 = B*T (%d)\n", d.total_batch);
    fprintf(stderr, "  -x  optimizer steps              (%d)\n", d.max_steps);
    fprintf(stderr, "  -l  peak learning rate           (%g)\n", d.lr);
    fprintf(stderr, "  -u  warmup steps                 (%d)\n", d.warmup);
    fprintf(stderr, "  -q  final lr as a fraction of -l (%g)\n", d.final_lr_frac);
    fprintf(stderr, "  -c  weight decay                 (%g)\n", d.weight_decay);
    fprintf(stderr, "  -gc global grad-norm clip, 0 = off (%g)\n", d.grad_clip);
    fprintf(stderr, "  -rc M2RNN carried-dH clamp, 0 = off (%g)\n", d.rnn_clamp);
    fprintf(stderr, "  -v  validate every N steps, 0 = never (%d)\n", d.val_every);
    fprintf(stderr, "  -m  max validation batches, 0 = all (%d)\n", d.val_batches);
    fprintf(stderr, "  -n  checkpoint every N steps, 0 = never (%d)\n", d.ckpt_every);
    fprintf(stderr, "  -nk keep the newest N checkpoints, 0 = all (%d)\n", d.ckpt_keep);
    fprintf(stderr, "  -nm never delete checkpoints at multiples of N (%d)\n", d.ckpt_major);
    fprintf(stderr, "  -y  resume from the newest checkpoint in -o (%d)\n", d.resume);
    fprintf(stderr, "  -a  overfit the first batch      (%d)\n", d.overfit);
    fprintf(stderr, "  -s  seed                         (%llu)\n", (unsigned long long)d.seed);
    fprintf(stderr, "  -nt OpenMP threads, 0 = default  (%d)\n", d.threads);
    fprintf(stderr, "  -h  this help\n");
}

// Parses argv into o; refuses unknown flags, missing values and malformed numbers with one line and a hint.
static void parse_args(TrainOptions *o, int argc, char **argv) {
    const char *hint = "run ./train_m2rnn -h to list every flag and its default";
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "-h") == 0 || strcmp(flag, "--help") == 0) { print_usage(); exit(EXIT_SUCCESS); }
        if (flag[0] != '-' || strlen(flag) < 2 || strlen(flag) > 3) {
            fail_with_hint(hint, "expected a flag like -b, got '%s'", flag);
        }
        if (i + 1 >= argc) { fail_with_hint(hint, "flag %s needs a value", flag); }
        const char *v = argv[++i];
        const char *f = flag + 1;
        if (strcmp(f, "i") == 0) { o->train_pattern = v; }
        else if (strcmp(f, "j") == 0) { o->val_pattern = v; }
        else if (strcmp(f, "e") == 0) { o->init = v; }
        else if (strcmp(f, "o") == 0) { o->out_dir = v; }
        else if (strcmp(f, "vs") == 0) { o->vocab_size = (int)parse_int_arg(flag, v, 2, 1 << 24); }
        else if (strcmp(f, "b") == 0) { o->B = (int)parse_int_arg(flag, v, 1, 1 << 16); }
        else if (strcmp(f, "t") == 0) { o->T = (int)parse_int_arg(flag, v, 1, 1 << 20); }
        else if (strcmp(f, "d") == 0) { o->total_batch = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "x") == 0) { o->max_steps = (int)parse_int_arg(flag, v, 1, INT_MAX); }
        else if (strcmp(f, "l") == 0) { o->lr = (float)parse_float_arg(flag, v, 0.0, 10.0); }
        else if (strcmp(f, "u") == 0) { o->warmup = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "q") == 0) { o->final_lr_frac = (float)parse_float_arg(flag, v, 0.0, 1.0); }
        else if (strcmp(f, "c") == 0) { o->weight_decay = (float)parse_float_arg(flag, v, 0.0, 10.0); }
        else if (strcmp(f, "gc") == 0) { o->grad_clip = (float)parse_float_arg(flag, v, 0.0, 1e9); }
        else if (strcmp(f, "rc") == 0) { o->rnn_clamp = (float)parse_float_arg(flag, v, 0.0, 1e9); }
        else if (strcmp(f, "v") == 0) { o->val_every = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "m") == 0) { o->val_batches = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "n") == 0) { o->ckpt_every = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "nk") == 0) { o->ckpt_keep = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "nm") == 0) { o->ckpt_major = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "y") == 0) { o->resume = (int)parse_int_arg(flag, v, 0, 1); }
        else if (strcmp(f, "a") == 0) { o->overfit = (int)parse_int_arg(flag, v, 0, 1); }
        else if (strcmp(f, "s") == 0) { o->seed = (uint64_t)parse_int_arg(flag, v, 0, LLONG_MAX); }
        else if (strcmp(f, "nt") == 0) { o->threads = (int)parse_int_arg(flag, v, 0, 1024); }
        else { fail_with_hint(hint, "unknown flag %s", flag); }
    }
    if (o->ckpt_every > 0 && o->out_dir == NULL) {
        fail_with_hint("pass -o DIR to say where checkpoints go", "checkpoints every %d steps (-n) need -o DIR",
                       o->ckpt_every);
    }
}

#ifndef TESTING
int main(int argc, char **argv) {
    TrainOptions o = train_options_default();
    parse_args(&o, argc, argv);
    train_run(&o);
    return 0;
}
#endif
