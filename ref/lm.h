/*
ref/lm.h: the CPU reference executor of the language model (executor.h's API), fp32 with OpenMP, in the spirit of
llm.c's train_gpt2.c. Everything the GPU executor (lm.cuh) does is defined here first, in plain loops:

  tokens (B,T) → embedding → L × [ x += Mixer(RMSNorm(x));  x += FeedForward(RMSNorm(x)) ] → RMSNorm → LM head →
  cross-entropy over the real vocabulary of the padded one

The block is written once: each layer's mixer and feed-forward run through the kind table (ref/kinds.h) by their
letters, with their activations in blocks they lay out themselves. The backward walks the forward in reverse with a
hand-written gradient for every op; AdamW with decoupled weight decay on the parameter table's decay set, global
grad-norm clipping. Decoding runs each kind's single-token step with its per-sequence state.

Tensor parallelism (comm.h's TP group, -tp): each rank builds its layers from its local config (model.h's
model_config_tp_local: heads and hidden sizes divided, the vocabulary split) and holds its shards of the parameters in
one local buffer (ParamTable lt; the full table stays the checkpoints' layout). Megatron's conjugate pair is placed
around every mixer and feed-forward: reduce_from_tp all-reduces their output (forward), copy_to_tp their input
gradient (backward); the embedding and the classifier are vocabulary-parallel; kinds whose norm spans all heads run
RMSNormTP inside (through KindTensors.tp); the gradients of tensors a rank holds whole but computes from its own heads
only (M²RNN's shared q/k, GDN's norm weight) are summed over the group once a step, in model_grad_norm.

Build with -DM2RNN_REAL_DOUBLE to get the same code in float64 (the gradient checks do).
*/
#ifndef M2RNN_REF_LM_H
#define M2RNN_REF_LM_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "executor.h"   // defines: the executor API this file implements
#include "model.h"      // defines: ModelConfig, the parameter table, init, FLOP counts
#include "ref/common.h" // defines: real, the views, matmul, RMSNorm, embedding, classifier, AdamW, KindOps
#include "ref/kinds.h"  // defines: every layer kind's CPU ops (M, A, R, U, s) and kind_ops()

typedef struct {
    real *resid_in;  // (B,T,C) residual stream entering the layer
    real *ln1_out;   // (B,T,C)
    real *ln1_rstd;  // (B,T)
    real *resid_mid; // (B,T,C) resid_in + the mixer's output
    real *ln2_out;   // (B,T,C)
    real *ln2_rstd;  // (B,T)
    real *mixer;     // the mixer's saved activations (its kind's layout)
    real *ffn;       // the feed-forward's
} LayerActs;

struct Model {
    ModelConfig config;  // the whole model (checkpoints, FLOPs)
    ParamTable table;    // the whole model's parameters: the layout of checkpoints and of model_read/write_state
    ModelConfig lc;      // this rank's layers (= config without tensor parallelism)
    ParamTable lt;       // this rank's parameter buffer (= table without tensor parallelism)
    real *params_memory, *grads_memory; // (lt.num_parameters) each
    real *m_memory, *v_memory;          // AdamW moments, allocated at the first update
    ModelParams params, grads;
    const KindOps *mixer_ops[MAX_LAYERS], *ffn_ops[MAX_LAYERS]; // each layer's kinds, resolved once
    // activations, sized for (B, T) at the first forward
    int B, T;
    real *acts_memory;
    LayerActs layer_acts[MAX_LAYERS];
    real *resid_out;  // (B,T,C) after the last layer
    real *branch_out; // (B,T,C) a mixer's or feed-forward's output, added to the stream right away
    real *lnf_out;    // (B,T,C)
    real *lnf_rstd;   // (B,T)
    real *logits;     // (B,T,Vp); the backward overwrites them with dlogits
    real *losses;     // (B,T)
    double *ce_stats; // (B,T,2) tensor-parallel: each row's logit max and sum of exp, for the backward
    int *inputs, *targets; // (B,T) copies of the last forward's batch
    // gradient scratch, reused by every layer in turn
    real *grad_scratch_memory;
    size_t grad_scratch_size; // elements
    real *d_resid;    // (B,T,C) gradient of the residual stream
    real *d_norm;     // (B,T,C) gradient of a norm's output (= of the mixer's or feed-forward's input)
    real *kind_scratch; // the largest backward scratch of the model's kinds
    real mean_loss;   // of the last forward with targets, -1 otherwise
    // data parallelism (comm.h): this rank's shard [shard0, shard1) of the parameters, its averaged gradient and its
    // AdamW moments (ZeRO stage 1: m_memory, v_memory hold the shard only)
    const Comm *comm;
    size_t shard0, shard1;
    real *shard_grads;
    // tensor parallelism: the group's link, the ranges of lt whose gradients are summed over the group each step, and
    // those a rank > 0 leaves out of the gradient norm (executor.h's TPRanges)
    TPLink tp_link;
    TPRanges tp_ranges;
    double aux_loss;  // the auxiliary losses (MoE load balancing) of the last forward, summed over layers
    // decoding
    int dec_B, dec_context;
    real *dec_memory;               // all of the below
    real *dec_state[MAX_LAYERS];    // (B, decode_state) of each layer's mixer
    real *dec_logits;               // (B,Vp) each sequence's next-token logits
};

static const ModelConfig *model_config(const Model *model) { return &model->config; }
static const ParamTable *model_table(const Model *model) { return &model->table; }

static KindTensors kind_tensors(real *const *w, real *const *g) { KindTensors t = {w, g, NULL, 0, NULL}; return t; }
static inline int model_tp(const Model *model) { return model->comm != NULL ? model->comm->tp : 1; }
static inline TPLink *model_tp_link(Model *model) { return model_tp(model) > 1 ? &model->tp_link : NULL; }

static Model *model_create(const ModelConfig *config) {
    Model *model = (Model *)callocCheck(1, sizeof(Model));
    model->config = *config;
    model_config_fill_defaults(&model->config);
    model_config_validate(&model->config);
    param_table_build(&model->table, &model->config);
    model->lc = model->config;
    model->lt = model->table;
    const size_t n = model->lt.num_parameters;
    model->params_memory = (real *)callocCheck(n, sizeof(real));
    model->grads_memory = (real *)callocCheck(n, sizeof(real));
    model_point_views(&model->params, model->params_memory, sizeof(real), &model->table);
    model_point_views(&model->grads, model->grads_memory, sizeof(real), &model->table);
    for (int l = 0; l < model->config.n_layer; l++) {
        model->mixer_ops[l] = kind_ops(model->config.pattern[l]);
        model->ffn_ops[l] = kind_ops(model_ffn_letter(&model->config, l));
    }
    model->mean_loss = -1;
    return model;
}

// the whole model's init (every executor and TP size starts from the same numbers), then this rank's shards
static void model_init_weights(Model *model, uint64_t seed) {
    const size_t n = model->table.num_parameters, nl = model->lt.num_parameters;
    float *init = (float *)mallocCheck(n * sizeof(float)), *local = init;
    model_init_parameters(init, &model->table, seed);
    if (model_tp(model) > 1) {
        local = (float *)callocCheck(nl, sizeof(float));
        model_tp_shard(init, &model->table, local, &model->lt, sizeof(float), model->comm->tp_rank, model_tp(model), 0);
    }
    for (size_t i = 0; i < nl; i++) { model->params_memory[i] = (real)local[i]; }
    if (local != init) { free(local); }
    free(init);
}

static void model_layout_activations(Model *model, Arena *acts, Arena *grads) {
    const ModelConfig *c = &model->lc;
    const int B = model->B, T = model->T;
    const size_t BT = (size_t)B * T, C = (size_t)c->d_model;
    size_t scratch = 0;
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs *la = &model->layer_acts[l];
        const KindOps *mx = model->mixer_ops[l], *ff = model->ffn_ops[l];
        la->resid_in = arena_take(acts, BT * C);
        la->ln1_out = arena_take(acts, BT * C);
        la->ln1_rstd = arena_take(acts, BT);
        la->resid_mid = arena_take(acts, BT * C);
        la->ln2_out = arena_take(acts, BT * C);
        la->ln2_rstd = arena_take(acts, BT);
        la->mixer = arena_take(acts, mx->acts_size(c, B, T));
        la->ffn = arena_take(acts, ff->acts_size(c, B, T));
        const size_t s1 = mx->scratch_size(c, B, T), s2 = ff->scratch_size(c, B, T);
        scratch = s1 > scratch ? s1 : scratch;
        scratch = s2 > scratch ? s2 : scratch;
    }
    model->resid_out = arena_take(acts, BT * C);
    model->branch_out = arena_take(acts, BT * C);
    model->lnf_out = arena_take(acts, BT * C);
    model->lnf_rstd = arena_take(acts, BT);
    model->logits = arena_take(acts, BT * c->padded_vocab_size);
    model->losses = arena_take(acts, BT);
    // gradient scratch: d_resid first (it carries across layers), then what each layer zeroes
    model->d_resid = arena_take(grads, BT * C);
    model->d_norm = arena_take(grads, BT * C);
    model->kind_scratch = arena_take(grads, scratch);
}

static void model_ensure_activations(Model *model, int B, int T) {
    if (model->acts_memory != NULL && model->B == B && model->T == T) { return; }
    free(model->acts_memory);
    free(model->grad_scratch_memory);
    free(model->inputs);
    free(model->targets);
    free(model->ce_stats);
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
    model->ce_stats = (double *)mallocCheck((size_t)B * T * 2 * sizeof(double));
}

static double model_forward(Model *model, const int *inputs, const int *targets, int B, int T) {
    const ModelConfig *c = &model->lc; // (this rank's sizes; the vocabulary check is the whole model's)
    const int BT = B * T, C = c->d_model, V = model->config.vocab_size, Vp = c->padded_vocab_size;
    TPLink *tp = model_tp_link(model);
    model_ensure_activations(model, B, T);
    model_check_tokens(inputs, (size_t)BT, V, "input");
    memcpy(model->inputs, inputs, (size_t)BT * sizeof(int));
    model->aux_loss = 0.0;
    real *x = model->layer_acts[0].resid_in;
    embedding_forward(x, inputs, model->params.wte, BT, C, c->vocab_offset, Vp);
    tp_sum(tp, x, (size_t)BT * C, sizeof(real)); // vocabulary-parallel: each rank's rows, summed
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs *la = &model->layer_acts[l];
        const ModelParamsLayer *w = &model->params.layers[l];
        const ModelParamsLayer *g = &model->grads.layers[l];
        rmsnorm_forward(la->ln1_out, la->ln1_rstd, la->resid_in, w->ln1_w, BT, C);
        real *branch = model->branch_out; // the mixer's, then the feed-forward's output, added to the stream right away
        KindTensors tm = kind_tensors(w->mixer, g->mixer);
        KindTensors tf = kind_tensors(w->ffn, g->ffn);
        tf.aux = &model->aux_loss;
        tm.tp = tf.tp = tp;
        model->mixer_ops[l]->forward(branch, la->mixer, la->ln1_out, &tm, c, B, T);
        tp_sum(tp, branch, (size_t)BT * C, sizeof(real)); // reduce_from_tp: the row-parallel output's partial sums
        for (size_t i = 0; i < (size_t)BT * C; i++) { la->resid_mid[i] = la->resid_in[i] + branch[i]; }
        rmsnorm_forward(la->ln2_out, la->ln2_rstd, la->resid_mid, w->ln2_w, BT, C);
        model->ffn_ops[l]->forward(branch, la->ffn, la->ln2_out, &tf, c, B, T);
        tp_sum(tp, branch, (size_t)BT * C, sizeof(real)); // reduce_from_tp
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
    if (tp != NULL) {
        crossentropy_forward_vp(model->losses, model->ce_stats, model->logits, targets, BT, c->vocab_size, Vp,
                                c->vocab_offset, tp);
    } else {
        crossentropy_forward(model->losses, model->logits, targets, BT, V, Vp);
    }
    double sum = 0.0;
    for (int i = 0; i < BT; i++) { sum += model->losses[i]; }
    model->mean_loss = (real)(sum / BT);
    return model->mean_loss;
}

static void model_zero_grad(Model *model) { memset(model->grads_memory, 0, model->lt.num_parameters * sizeof(real)); }

static void model_backward(Model *model, float loss_scale) {
    const ModelConfig *c = &model->lc;
    TPLink *tp = model_tp_link(model);
    if (model->mean_loss < 0) {
        fail_with_hint("call model_forward with targets first", "model_backward without a forward pass with targets");
    }
    const int B = model->B, T = model->T, BT = B * T, C = c->d_model, Vp = c->padded_vocab_size;
    memset(model->grad_scratch_memory, 0, model->grad_scratch_size * sizeof(real));
    // loss = mean over tokens, so each token's dloss is loss_scale / BT
    if (tp != NULL) {
        crossentropy_backward_vp(model->logits, model->ce_stats, model->targets, (real)loss_scale / BT, BT,
                                 c->vocab_size, Vp, c->vocab_offset);
    } else {
        crossentropy_softmax_backward_inplace(model->logits, model->targets, (real)loss_scale / BT, BT, c->vocab_size,
                                              Vp);
    }
    real *dlogits = model->logits;
    matmul_backward(model->d_norm, model->grads.lm_head, dlogits, model->lnf_out, model->params.lm_head, BT, C, Vp);
    tp_sum(tp, model->d_norm, (size_t)BT * C, sizeof(real)); // the vocabulary shards' parts of d(lnf_out)
    rmsnorm_backward(model->d_resid, model->grads.lnf_w, model->d_norm, model->resid_out, model->params.lnf_w,
                     model->lnf_rstd, BT, C);
    model->mean_loss = -1; // the logits are gone: a second backward needs a new forward
    const size_t zeroed = model->grad_scratch_size - (size_t)BT * C; // everything after d_resid
    for (int l = c->n_layer - 1; l >= 0; l--) {
        LayerActs *la = &model->layer_acts[l];
        const ModelParamsLayer *w = &model->params.layers[l];
        ModelParamsLayer *gw = &model->grads.layers[l];
        KindTensors tm = kind_tensors(w->mixer, gw->mixer);
        KindTensors tf = kind_tensors(w->ffn, gw->ffn);
        tf.aux_grad = (real)loss_scale; // the auxiliary losses count in the objective as the mean loss does
        tm.tp = tf.tp = tp;
        // x_out = resid_mid + FFN(RMSNorm(resid_mid)): d_resid flows through, and into the feed-forward
        memset(model->d_norm, 0, zeroed * sizeof(real));
        model->ffn_ops[l]->backward(model->d_norm, model->kind_scratch, model->d_resid, la->ln2_out, la->ffn, &tf, c, B,
                                    T);
        tp_sum(tp, model->d_norm, (size_t)BT * C, sizeof(real)); // copy_to_tp's backward: the input gradient's parts
        rmsnorm_backward(model->d_resid, gw->ln2_w, model->d_norm, la->resid_mid, w->ln2_w, la->ln2_rstd, BT, C);
        // resid_mid = resid_in + Mixer(RMSNorm(resid_in))
        memset(model->d_norm, 0, zeroed * sizeof(real));
        model->mixer_ops[l]->backward(model->d_norm, model->kind_scratch, model->d_resid, la->ln1_out, la->mixer, &tm,
                                      c, B, T);
        tp_sum(tp, model->d_norm, (size_t)BT * C, sizeof(real)); // copy_to_tp's backward
        rmsnorm_backward(model->d_resid, gw->ln1_w, model->d_norm, la->resid_in, w->ln1_w, la->ln1_rstd, BT, C);
    }
    embedding_backward(model->grads.wte, model->d_resid, model->inputs, BT, C, c->vocab_offset, Vp);
}

// global L2 norm of the gradients, summed in fixed chunks: the same bits whatever the thread count
// the sum of squares of x[0, n) in fixed chunks: the same bits whatever the thread count
static double sum_squares_fixed(const real *x, size_t n) {
    enum { CHUNKS = 64 };
    double partial[CHUNKS];
#pragma omp parallel for schedule(static)
    for (int ch = 0; ch < CHUNKS; ch++) {
        size_t i0 = n * ch / CHUNKS, i1 = n * (ch + 1) / CHUNKS;
        double s = 0.0;
        for (size_t i = i0; i < i1; i++) { s += (double)x[i] * x[i]; }
        partial[ch] = s;
    }
    double total = 0.0;
    for (int ch = 0; ch < CHUNKS; ch++) { total += partial[ch]; }
    return total;
}

static void cpu_tp_sum(TPLink *link, void *x, size_t n, size_t elem) {
    comm_tp_allreduce_sum((const Comm *)link->ctx, x, n, elem);
}
static void cpu_tp_max(TPLink *link, real *x, size_t n) { comm_tp_allreduce_max((const Comm *)link->ctx, x, n, sizeof(real)); }

// The parallel layout: with a TP group (comm->tp > 1) this rank's local config and parameter buffer replace the whole
// model's (before the weights are set: model_init_weights and model_write_state shard the whole model's); then the
// data-parallel shard of the (local) buffer.
static void model_set_parallel(Model *model, const Comm *comm) {
    model->comm = comm;
    if (comm->tp > 1) {
        tp_local_layout(&model->lc, &model->lt, &model->config, comm);
        free(model->params_memory);
        free(model->grads_memory);
        model->params_memory = (real *)callocCheck(model->lt.num_parameters, sizeof(real));
        model->grads_memory = (real *)callocCheck(model->lt.num_parameters, sizeof(real));
        model_point_views(&model->params, model->params_memory, sizeof(real), &model->lt);
        model_point_views(&model->grads, model->grads_memory, sizeof(real), &model->lt);
        TPLink link = {comm->tp, comm->tp_rank, cpu_tp_sum, cpu_tp_max, (void *)comm, 0};
        model->tp_link = link;
        tp_ranges_build(&model->tp_ranges, &model->table, &model->lt, comm->tp);
        free(model->acts_memory); // (sized for the whole model's layers, if a forward ran)
        model->acts_memory = NULL;
    }
    const size_t n = model->lt.num_parameters;
    model->shard0 = comm_shard_begin(comm, n, comm->dp_rank);
    model->shard1 = comm_shard_end(comm, n, comm->dp_rank);
    free(model->shard_grads);
    model->shard_grads = comm->dp > 1 ? (real *)mallocCheck((model->shard1 - model->shard0) * sizeof(real)) : NULL;
}
static void model_sync_next_backward(Model *model) { (void)model; } // (the reduction runs in model_grad_norm)
static double model_comm_exposed_ms(const Model *model) { (void)model; return -1.0; }
static inline int model_dp(const Model *model) { return model->comm != NULL ? model->comm->dp : 1; }

// the sum of squares of x[a, b) of the local buffer (x holds [base, ...)), leaving out the ranges a TP rank > 0 does
// not count (every rank holds them whole)
static double model_sum_squares_counted(const Model *model, const real *x, size_t base, size_t a, size_t b) {
    if (model_tp(model) == 1) { return sum_squares_fixed(x + (a - base), b - a); }
    size_t *pieces = (size_t *)mallocCheck(((size_t)model->tp_ranges.num_once + 1) * 2 * sizeof(size_t));
    const int n = tp_counted_pieces(pieces, &model->tp_ranges, model->comm->tp_rank, a, b);
    double total = 0.0;
    for (int i = 0; i < n; i++) { total += sum_squares_fixed(x + (pieces[2 * i] - base), pieces[2 * i + 1] - pieces[2 * i]); }
    free(pieces);
    return total;
}

// Tensor-parallel: the gradients each rank has only part of are summed over the group (one collective). Data-
// parallel: the gradients are then reduce-scattered (each rank the average over the replicas of its shard). The norm
// is the sum over all ranks of their shards' squares, each number counted once.
static double model_grad_norm(Model *model) {
    const size_t n = model->lt.num_parameters;
    const TPRanges *tr = &model->tp_ranges;
    if (model_tp(model) > 1 && tr->num_sum > 0) {
        size_t total = 0;
        for (int i = 0; i < tr->num_sum; i++) { total += tr->sum[2 * i + 1]; }
        real *buf = (real *)mallocCheck(total * sizeof(real)), *p = buf;
        for (int i = 0; i < tr->num_sum; i++) {
            memcpy(p, model->grads_memory + tr->sum[2 * i], tr->sum[2 * i + 1] * sizeof(real));
            p += tr->sum[2 * i + 1];
        }
        tp_sum(&model->tp_link, buf, total, sizeof(real));
        p = buf;
        for (int i = 0; i < tr->num_sum; i++) {
            memcpy(model->grads_memory + tr->sum[2 * i], p, tr->sum[2 * i + 1] * sizeof(real));
            p += tr->sum[2 * i + 1];
        }
        free(buf);
    }
    if (model_dp(model) == 1 && model_tp(model) == 1) { return sqrt(sum_squares_fixed(model->grads_memory, n)); }
    if (model_dp(model) == 1) {
        return sqrt(comm_world_sum(model->comm, model_sum_squares_counted(model, model->grads_memory, 0, 0, n)));
    }
    const size_t sn = model->shard1 - model->shard0;
    comm_dp_reduce_scatter(model->comm, model->shard_grads, model->grads_memory, n, sizeof(real));
    const real inv = (real)(1.0 / model_dp(model));
    for (size_t i = 0; i < sn; i++) { model->shard_grads[i] *= inv; }
    return sqrt(comm_world_sum(model->comm, model_sum_squares_counted(model, model->shard_grads, model->shard0,
                                                                      model->shard0, model->shard1)));
}

// AdamW over this rank's shard (all of it with one rank), tensor by tensor for their decay, then (data-parallel) the
// updated shards all-gathered
static void model_update(Model *model, const OptimizerConfig *opt, int step, double norm) {
    const size_t n = model->lt.num_parameters, s0 = model_dp(model) > 1 ? model->shard0 : 0;
    const size_t s1 = model_dp(model) > 1 ? model->shard1 : n;
    const real *grads = model_dp(model) > 1 ? model->shard_grads : model->grads_memory;
    if (model->m_memory == NULL) {
        model->m_memory = (real *)callocCheck(s1 - s0 + 1, sizeof(real));
        model->v_memory = (real *)callocCheck(s1 - s0 + 1, sizeof(real));
    }
    const float scale = (opt->grad_clip > 0 && norm > opt->grad_clip) ? (float)(opt->grad_clip / norm) : 1.0f;
    for (int i = 0; i < model->lt.num_specs; i++) {
        const ParamSpec *s = &model->lt.specs[i];
        const size_t a = s->offset > s0 ? s->offset : s0, b = s->offset + s->numel < s1 ? s->offset + s->numel : s1;
        if (a >= b) { continue; }
        adamw_update(model->params_memory + a, model->m_memory + (a - s0), model->v_memory + (a - s0), grads + (a - s0),
                     b - a, opt->lr, opt->beta1, opt->beta2, opt->eps, s->weight_decay ? opt->weight_decay : 0.0f, step,
                     scale);
    }
    if (model_dp(model) > 1) {
        comm_dp_allgather(model->comm, model->params_memory, model->params_memory + s0, n, sizeof(real));
    }
}

static void model_free(Model *model) {
    if (model == NULL) { return; }
    free(model->params_memory);
    free(model->grads_memory);
    free(model->m_memory);
    free(model->v_memory);
    free(model->acts_memory);
    free(model->grad_scratch_memory);
    free(model->inputs);
    free(model->targets);
    free(model->dec_memory);
    free(model->shard_grads);
    free(model->ce_stats);
    tp_ranges_free(&model->tp_ranges);
    free(model);
}

static int model_has_optimizer(const Model *model) { return model->m_memory != NULL; }

// the full state (every rank gets all of m and v: data-parallel ranks all-gather their shards, tensor-parallel ranks
// their local buffers), in the whole model's layout
static void model_read_state(const Model *model, void *params, void *m, void *v) {
    const size_t nl = model->lt.num_parameters, bytes = nl * sizeof(real);
    const int tp = model_tp(model);
    real *lm = NULL, *lv = NULL;
    if (m != NULL && model->m_memory != NULL) {
        lm = tp > 1 ? (real *)mallocCheck(bytes) : (real *)m;
        lv = tp > 1 ? (real *)mallocCheck(bytes) : (real *)v;
        if (model_dp(model) > 1) {
            comm_dp_allgather(model->comm, lm, model->m_memory, nl, sizeof(real));
            comm_dp_allgather(model->comm, lv, model->v_memory, nl, sizeof(real));
        } else {
            memcpy(lm, model->m_memory, bytes);
            memcpy(lv, model->v_memory, bytes);
        }
    }
    if (tp == 1) {
        memcpy(params, model->params_memory, bytes);
        return;
    }
    tp_gather_full(model->comm, params, &model->table, model->params_memory, &model->lt, sizeof(real));
    if (lm != NULL) {
        tp_gather_full(model->comm, m, &model->table, lm, &model->lt, sizeof(real));
        tp_gather_full(model->comm, v, &model->table, lv, &model->lt, sizeof(real));
        free(lm);
        free(lv);
    }
}

// from a full state (a checkpoint written at any data-parallel or tensor-parallel size, in the whole model's layout):
// each rank keeps its tensor-parallel shards, and of m and v its data-parallel shard of those
static void model_write_state(Model *model, const void *params, const void *m, const void *v) {
    const size_t nl = model->lt.num_parameters;
    const size_t s0 = model_dp(model) > 1 ? model->shard0 : 0, s1 = model_dp(model) > 1 ? model->shard1 : nl;
    const int tp = model_tp(model), rank = tp > 1 ? model->comm->tp_rank : 0;
    real *lm = NULL, *lv = NULL;
    if (tp > 1) {
        model_tp_shard((void *)params, &model->table, model->params_memory, &model->lt, sizeof(real), rank, tp, 0);
        if (m != NULL) {
            lm = (real *)callocCheck(nl, sizeof(real));
            lv = (real *)callocCheck(nl, sizeof(real));
            model_tp_shard((void *)m, &model->table, lm, &model->lt, sizeof(real), rank, tp, 0);
            model_tp_shard((void *)v, &model->table, lv, &model->lt, sizeof(real), rank, tp, 0);
        }
    } else {
        memcpy(model->params_memory, params, nl * sizeof(real));
    }
    free(model->m_memory);
    free(model->v_memory);
    model->m_memory = model->v_memory = NULL;
    if (m != NULL) {
        model->m_memory = (real *)mallocCheck((s1 - s0 + 1) * sizeof(real));
        model->v_memory = (real *)mallocCheck((s1 - s0 + 1) * sizeof(real));
        memcpy(model->m_memory, (lm != NULL ? lm : (const real *)m) + s0, (s1 - s0) * sizeof(real));
        memcpy(model->v_memory, (lv != NULL ? lv : (const real *)v) + s0, (s1 - s0) * sizeof(real));
    }
    free(lm);
    free(lv);
}

// (tensor-parallel: the group's vocabulary shards of the row, all-gathered)
static void model_logits_row(Model *model, int b, int t, float *out) {
    const int Vl = model->lc.padded_vocab_size, Vp = model->config.padded_vocab_size;
    const real *row = model->logits + ((size_t)b * model->T + t) * Vl;
    real *all = (real *)mallocCheck((size_t)Vp * sizeof(real));
    if (model_tp(model) > 1) { comm_tp_allgather(model->comm, all, row, (size_t)Vl, sizeof(real)); }
    else { memcpy(all, row, (size_t)Vp * sizeof(real)); }
    for (int i = 0; i < Vp; i++) { out[i] = (float)all[i]; }
    free(all);
}

// ----------------------------------------------------------------------------------------------------------------
// decoding

static void model_decode_begin(Model *model, int B, int context) {
    const ModelConfig *c = &model->config;
    if (model_tp(model) > 1) {
        fail_with_hint("generate from the checkpoint with one process (./infer_m2rnn); checkpoints hold the whole model",
                       "decoding under tensor parallelism (-tp %d) is not supported", model_tp(model));
    }
    if (B < 1 || context < 1) { fail_with_hint("decode at least one sequence of one token", "model_decode_begin(B=%d, context=%d)", B, context); }
    free(model->dec_memory);
    size_t total = (size_t)B * c->padded_vocab_size;
    for (int l = 0; l < c->n_layer; l++) { total += (size_t)B * mixer_kind(c->pattern[l])->decode_state(c, context); }
    model->dec_memory = (real *)callocCheck(total, sizeof(real));
    real *p = model->dec_memory;
    for (int l = 0; l < c->n_layer; l++) {
        model->dec_state[l] = p;
        p += (size_t)B * mixer_kind(c->pattern[l])->decode_state(c, context);
    }
    model->dec_logits = p;
    model->dec_B = B;
    model->dec_context = context;
}

#define DECODE_CHUNK 512 // tokens a prefill advances at once (bounds the temporaries)

static void model_decode_advance(Model *model, int b0, int nb, const int *tokens, int T, const int *pos) {
    const ModelConfig *c = &model->config;
    const int C = c->d_model, Vp = c->padded_vocab_size;
    decode_check_advance(model->dec_B, model->dec_context, b0, nb, T, pos);
    model_check_tokens(tokens, (size_t)nb * T, c->vocab_size, "decode");
    const int CH = T < DECODE_CHUNK ? T : DECODE_CHUNK;
    const size_t rows = (size_t)nb * CH;
    real *x = (real *)mallocCheck((3 * rows * C + rows) * sizeof(real)), *norm = x + rows * C, *branch = norm + rows * C;
    real *rstd = branch + rows * C;
    int *tok = (int *)mallocCheck(rows * sizeof(int)), *cpos = (int *)mallocCheck((size_t)nb * sizeof(int));
    for (int s0 = 0; s0 < T; s0 += CH) {
        const int Tc = T - s0 < CH ? T - s0 : CH, n = nb * Tc;
        for (int i = 0; i < nb; i++) {
            memcpy(tok + (size_t)i * Tc, tokens + (size_t)i * T + s0, (size_t)Tc * sizeof(int));
            cpos[i] = pos[i] + s0;
        }
        embedding_forward(x, tok, model->params.wte, n, C, 0, Vp);
        for (int l = 0; l < c->n_layer; l++) {
            const ModelParamsLayer *w = &model->params.layers[l];
            const KindTensors tm = kind_tensors(w->mixer, NULL), tf = kind_tensors(w->ffn, NULL);
            const size_t S = mixer_kind(c->pattern[l])->decode_state(c, model->dec_context);
            rmsnorm_forward(norm, rstd, x, w->ln1_w, n, C);
            model->mixer_ops[l]->advance(branch, model->dec_state[l] + (size_t)b0 * S, norm, &tm, c, nb, Tc, cpos,
                                         model->dec_context);
            for (size_t i = 0; i < (size_t)n * C; i++) { x[i] += branch[i]; }
            rmsnorm_forward(norm, rstd, x, w->ln2_w, n, C);
            real *acts = (real *)mallocCheck(model->ffn_ops[l]->acts_size(c, nb, Tc) * sizeof(real)); // stateless
            model->ffn_ops[l]->forward(branch, acts, norm, &tf, c, nb, Tc);
            free(acts);
            for (size_t i = 0; i < (size_t)n * C; i++) { x[i] += branch[i]; }
        }
        if (s0 + Tc == T) { // each sequence's last token: the next-token logits
            for (int i = 0; i < nb; i++) {
                memcpy(branch + (size_t)i * C, x + ((size_t)i * Tc + Tc - 1) * C, (size_t)C * sizeof(real));
            }
            rmsnorm_forward(norm, rstd, branch, model->params.lnf_w, nb, C);
            matmul_forward(model->dec_logits + (size_t)b0 * Vp, norm, model->params.lm_head, nb, C, Vp);
        }
    }
    free(x); free(tok); free(cpos);
}

static void model_decode_step(Model *model, const int *tokens, const int *pos) {
    if (model->dec_B == 0) { fail_with_hint("call model_decode_begin first", "model_decode_step without a decode state"); }
    model_decode_advance(model, 0, model->dec_B, tokens, 1, pos);
}

static double model_aux_loss(const Model *model) { return model->aux_loss; }

static int model_decode_gen_begin(Model *model, const int *pos, float temperature, int top_k, float top_p,
                                  float rep_penalty, const int *const *seen, const int *n_seen) {
    (void)model; (void)pos; (void)temperature; (void)top_k; (void)top_p; (void)rep_penalty; (void)seen; (void)n_seen;
    return 0; // (the caller samples model_decode_logits' rows: the reference's sample_token)
}
static void model_decode_gen_launch(Model *model, const double *u, int step) {
    (void)model; (void)u; (void)step;
    fail_with_hint("sample on the host (model_decode_gen_begin returned 0)", "the CPU reference has no generation loop");
}
static void model_decode_gen_wait(Model *model, int *tokens) {
    (void)model; (void)tokens;
    fail_with_hint("sample on the host (model_decode_gen_begin returned 0)", "the CPU reference has no generation loop");
}

static void model_decode_logits(Model *model, int b, float *out) {
    const int Vp = model->config.padded_vocab_size;
    for (int i = 0; i < Vp; i++) { out[i] = (float)model->dec_logits[(size_t)b * Vp + i]; }
}

// the decode state of sequence b (every layer's, in layer order) to host memory / back (state_numbers of them)
static size_t model_decode_state_size(const Model *model) {
    size_t n = 0;
    for (int l = 0; l < model->config.n_layer; l++) {
        n += mixer_kind(model->config.pattern[l])->decode_state(&model->config, model->dec_context);
    }
    return n * sizeof(real);
}
static void model_decode_state_io(Model *model, int b, void *buf, int save) {
    char *p = (char *)buf;
    for (int l = 0; l < model->config.n_layer; l++) {
        const size_t S = mixer_kind(model->config.pattern[l])->decode_state(&model->config, model->dec_context);
        real *st = model->dec_state[l] + (size_t)b * S;
        if (save) { memcpy(p, st, S * sizeof(real)); } else { memcpy(st, p, S * sizeof(real)); }
        p += S * sizeof(real);
    }
}

// ----------------------------------------------------------------------------------------------------------------
// the executor

static const char *executor_name(void) { return "./train_m2rnn_cpu (CPU reference, OpenMP)"; }
static int executor_master_bytes(void) { return (int)sizeof(real); }
static double executor_peak_flops(Model *model) { return 0; }
static void executor_sync(Model *model) {}

#endif // M2RNN_REF_LM_H
