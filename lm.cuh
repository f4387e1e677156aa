/*
lm.cuh: the GPU executor of the language model (executor.h's API) on one GPU, op for op the dataflow of the CPU
reference ref/lm.h:

  tokens → embedding → L × [ x += Mixer(RMSNorm(x));  x += FeedForward(RMSNorm(x)) ] → RMSNorm → LM head → cross-entropy

The block is written once: each layer's mixer and feed-forward run through the kind table (kinds.cuh) by their
letters, with their activations in blocks they lay out themselves and one scratch the kinds share. Everything runs
on the Runtime the model owns (its device, stream, cuBLASLt handle), not on a global device or stream.

Tensor parallelism (-tp, over NCCL; model_set_parallel), as ref/lm.h does it: each rank builds its layers from its
local config (model.h's model_config_tp_local) and holds its shards in one local buffer (ParamTable lt; the whole
model's table stays the checkpoints' layout). Megatron's pair around every mixer and feed-forward: their output is
all-reduced in the forward, their input gradient in the backward (floatX, on the main stream); the embedding and the
classifier are vocabulary-parallel; M²RNN topology-independent, RNN and GRU run RMSNormTP inside (KindTensors.tp);
the gradients a rank has only part of are summed over the group once a step, in model_grad_norm.

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

// a bucket of the gradient buffer, [begin, end), reduce-scattered as soon as the backward of layer `ready` is done
// (n_layer: the head, -1: the embedding); each rank owns the piece [begin + r·len/dp, begin + (r+1)·len/dp) and
// holds its AdamW moments at shard_off in m_memory, v_memory
typedef struct {
    size_t begin, end, shard_off;
    int ready;
} GradBucket;

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

// one lane's buffers for a decode step or a prefill chunk (decode_run); a prefill's chunks alternate between two lanes
// the generation loop's sampling (model_decode_gen_begin)
typedef struct {
    float temp;  // 0: greedy
    int top_k;   // 0: none
    float top_p; // 1: none (top-k only)
    float rp;    // the repetition penalty, 1: none
} GenSampling;

typedef struct {
    floatX *x, *norm, *branch; // (rows, C) the residual stream
    floatX *x2;                // (B, C) a step's residual stream alternates between x and x2 (StepInput.x_out)
    float *rstd;               // (rows)
    int *tokens, *pos;         // (rows), (B) on the device
    void *work;                // the kinds' step and advance temporaries
} DecodeLane;

struct Model {
    ModelConfig config;    // the whole model (checkpoints, FLOPs)
    ParamTable table;      // the whole model's parameters: the layout of checkpoints and of model_read/write_state
    ModelConfig lc;        // this rank's layers (= config without tensor parallelism)
    ParamTable lt;         // this rank's parameter buffer (= table without tensor parallelism)
    Runtime rt;
    size_t num_parameters; // of lt
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
    float *ce_stats;       // (B,T,3) tensor-parallel: this rank's rows' max, sum of exp, target logit
    float *ce_all;         // (tp,B,T,3) the group's, gathered
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
    double aux_loss;       // the auxiliary losses (MoE load balancing) of the last forward, summed over layers
    int have_targets;
    // decoding
    int dec_B, dec_context;
    void *dec_memory;
    void *dec_state[MAX_LAYERS];   // (B, state_bytes) of each layer's mixer
    int dec_rows;                  // rows of each lane's buffers: max(B, DECODE_ROWS)
    int dec_chunk_rows;            // tokens (sequences × chunk) a prefill chunk runs at once: DECODE_ROWS, or less
                                   // (M2RNN_PREFILL_ROWS, benchmarks)
    DecodeLane dec_lane[2];        // lane 0 on rt's stream (every step; one-chunk prefills), lane 1 on dec_rt2's
    floatX *dec_logits;            // (B,Vp)
    double *dec_sample_u;          // (B) the generation loop's draws (model_decode_gen_launch)
    void *dec_sample_scratch;      // decode_sample's (sample_scratch_bytes(B, V))
    void *dec_topk_cand;           // decode_sample_topk's (sample_topk_scratch_bytes(B, V))
    uint32_t *dec_seen;            // (B, ceil(V / 32)) the ids each sequence has seen (the repetition penalty)
    float *dec_parts;              // (STEP_MAX_PARTS, B, C) a step's branch as partial sums (step_branch_product)
    // A prefill of several chunks alternates them between the lanes, so chunk c+1's layer l (on the other stream)
    // runs once chunk c's layer l has left the layer's state (dec_ev[l][lane], recorded after the mixer's advance):
    // one chunk's latency-bound recurrences overlap the other's products. Off with MoE layers (their grouping keeps
    // host buffers), with M2RNN_ONE_LANE=1, and where the context fits one chunk.
    Runtime dec_rt2;               // lane 1's stream, cuBLASLt handle and workspace (made at the first decode_begin)
    cudaEvent_t dec_ev[MAX_LAYERS][2], dec_fork, dec_join;
    int dec_two_lanes;
    cudaGraphExec_t dec_graph;     // the step of all B sequences, captured (NULL: not yet, or not possible)
    cudaGraphExec_t dec_gen_graph[2]; // the generation loop's, one a slot: the draw (dec_gen_sampling's), the tokens'
                                   // copy into the slot forked beside the step, then the step
    GenSampling dec_gen_sampling;
    // a step of all B sequences (model_decode_step) is not waited for: its positions and tokens go through a pinned
    // slot, (pos (B4), tokens (B)) in lane 0's layout, in one copy; a slot is rewritten once its last copy has run
    int *step_host;                // pinned: 2 slots of B4 + B ints (B4 = B rounded up to 4)
    int step_host_B;               // (its B)
    cudaEvent_t step_ev[2];        // after each slot's last copy
    long step_n;                   // steps staged
    // the generation loop (model_decode_gen_*): up to two iterations queued, each with its pinned slot for the draws
    // (B doubles) and the tokens (B ints), and an event after its iteration
    void *gen_host;                // pinned: u[2][B], then tok[2][B]
    int gen_host_B;                // (its B)
    cudaEvent_t gen_ev[2];
    cudaStream_t gen_side;         // the tokens' copy, beside the step (captured into the graph)
    cudaEvent_t gen_fork, gen_join;
    long gen_queued, gen_waited;   // iterations launched, and waited for
    GenSampling gen;               // the loop's sampling
    int dec_steps;                 // eager steps since begin (the second is captured: the first sets kernel attributes)
    int dec_graph_off;             // 1: run eagerly (M2RNN_NO_GRAPH=1, or a capture failed)
    int dec_pdl_off;               // 1: the step's kernels launched the ordinary way (M2RNN_NO_PDL=1; cuda_common.h)
    // the process layout over NCCL (model_set_parallel: its data-parallel and tensor-parallel groups); NULL = one GPU,
    // the plain path. Data parallelism (ZeRO-1):
    const Comm *comm;
    int dp, dp_rank;
    size_t n_pad;                  // the gradient and master buffers' length: num_parameters rounded to the buckets
    int num_grad_buckets;
    GradBucket grad_buckets[MAX_LAYERS + 2];
    size_t shard_numel;            // Σ of this rank's pieces: the length of m_memory and v_memory
    cudaStream_t comm_stream;      // the reduce-scatters run here, beside the backward
    cudaEvent_t ev_ready, ev_comm_done, ev_bwd_end;
    int sync_next;                 // the next backward is the last of the step: reduce its buckets as they finish
    int reduced;                   // this step's gradients have been reduce-scattered
    int overlap;                   // 0: M2RNN_NO_OVERLAP=1 (reduce after the backward, for comparison)
    float *dp_norms;               // (num_grad_buckets + 1) the pieces' sums of squares, then their sum
    double exposed_ms;             // Σ over steps of the reduce-scatter time left after the backward ended
    int exposed_steps, exposed_calls;
    size_t *norm_pieces;           // (host) the (begin, end) pairs of the buffer this rank counts in the norm
    int max_norm_pieces;
    // tensor parallelism over NCCL (model_set_parallel): tp = 1 without it
    int tp, tp_rank;
    TPGroup tp_group;              // the kinds' and the block's collectives over the group
    TPRanges tp_ranges;            // the gradients summed over the group once a step; those counted once in the norm
};

static const ModelConfig *model_config(const Model *model) { return &model->config; }
static const ParamTable *model_table(const Model *model) { return &model->table; }

static KindTensors kind_tensors(floatX *const *w, float *const *w32, float *const *g) {
    KindTensors t = {w, w32, g, NULL, 0.0f, NULL};
    return t;
}
static inline TPGroup *model_tp_group(Model *model) { return model->tp > 1 ? &model->tp_group : NULL; }

// the device of a model built by model_create: M2RNN_DEVICE, else the process's rank on its node (comm.h; 0 for one
// process), modulo the GPUs it sees: one process per GPU
static int executor_device(void) {
    const char *env = getenv("M2RNN_DEVICE");
    if (env != NULL) { return atoi(env); }
    int count = 1;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) { count = 1; }
    return comm_node_rank % count;
}

static Model *model_create(const ModelConfig *config) {
    Model *model = (Model *)callocCheck(1, sizeof(Model));
    model->config = *config;
    model_config_fill_defaults(&model->config);
    model_config_validate(&model->config);
    runtime_init(&model->rt, executor_device());
    param_table_build(&model->table, &model->config);
    model->lc = model->config;
    model->lt = model->table;
    model->tp = 1;
    for (int l = 0; l < model->config.n_layer; l++) {
        model->mixer_ops[l] = kind_ops(model->config.pattern[l]);
        model->ffn_ops[l] = kind_ops(model_ffn_letter(&model->config, l));
    }
    const size_t n = model->table.num_parameters;
    model->num_parameters = n;
    model->n_pad = n;
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

// the whole model's init (every executor and TP size starts from the same numbers), then this rank's shards
static void model_init_weights(Model *model, uint64_t seed) {
    float *init = (float *)mallocCheck(model->table.num_parameters * sizeof(float)), *local = init;
    model_init_parameters(init, &model->table, seed);
    if (model->tp > 1) {
        local = (float *)callocCheck(model->num_parameters, sizeof(float));
        model_tp_shard(init, &model->table, local, &model->lt, sizeof(float), model->tp_rank, model->tp, 0);
    }
    model_upload_params(model, local);
    if (local != init) { free(local); }
    free(init);
}

static void model_layout_activations(Model *model, DeviceArena *a) {
    const ModelConfig *c = &model->lc;
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
    model->ce_stats = model->tp > 1 ? TAKE_F(a, BT * 3) : NULL;
    model->ce_all = model->tp > 1 ? TAKE_F(a, (size_t)model->tp * BT * 3) : NULL;
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

#ifdef USE_NCCL
// all (tp · n) = every TP rank's mine (n floats), in rank order, on the main stream
static void tp_allgather_f32(Model *model, float *all, const float *mine, size_t n) {
    model->tp_group.calls++;
    ncclCheck(ncclAllGather(mine, all, n, ncclFloat, model->comm->nccl_tp, model->rt.stream));
}
#endif

static double model_forward(Model *model, const int *inputs, const int *targets, int B, int T) {
    const ModelConfig *c = &model->lc; // (this rank's sizes; the vocabulary check is the whole model's)
    const Runtime *rt = &model->rt;
    cudaStream_t stream = rt->stream;
    TPGroup *tp = model_tp_group(model);
    const int BT = B * T, C = c->d_model, V = model->config.vocab_size, Vp = c->padded_vocab_size;
    model_ensure_activations(model, B, T);
    model_check_tokens(inputs, (size_t)BT, V, "input");
    memcpy(model->inputs_host, inputs, (size_t)BT * sizeof(int));
    cudaCheck(cudaMemcpyAsync(model->tokens_dev, inputs, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice, stream));
    if (targets != NULL) {
        model_check_tokens(targets, (size_t)BT, V, "target");
        cudaCheck(cudaMemcpyAsync(model->tokens_dev + BT, targets, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice,
                                  stream));
    }
    embedding_forward(model->layer_acts[0].resid_in, model->tokens_dev, model->params.wte, BT, C, c->vocab_offset, Vp,
                      stream);
    tp_sum(tp, model->layer_acts[0].resid_in, (size_t)BT * C, 0, stream); // vocabulary-parallel: one rank's row each
    rmsnorm_forward(model->layer_acts[0].ln1_out, model->layer_acts[0].ln1_rstd, NULL, model->layer_acts[0].resid_in,
                    NULL, model->params.layers[0].ln1_w, BT, C, stream);
    model->aux_loss = 0.0;
    for (int l = 0; l < c->n_layer; l++) {
        LayerActs *la = &model->layer_acts[l];
        const ModelParamsLayer *w = &model->params.layers[l];
        const ModelParams32Layer *w32 = &model->master.layers[l], *g = &model->grads.layers[l];
        KindTensors tm = kind_tensors(w->mixer, w32->mixer, g->mixer);
        KindTensors tf = kind_tensors(w->ffn, w32->ffn, g->ffn);
        tf.aux = &model->aux_loss;
        tm.tp = tf.tp = tp;
        model->mixer_ops[l]->forward(model->branch_out, la->mixer, model->kind_scratch, la->ln1_out, &tm, c, B, T, rt);
        tp_sum(tp, model->branch_out, (size_t)BT * C, 0, stream); // reduce_from_tp: the row-parallel partial sums
        // resid_mid = resid_in + mixer; ln2 = RMSNorm(resid_mid)
        rmsnorm_forward(la->ln2_out, la->ln2_rstd, la->resid_mid, la->resid_in, model->branch_out, w->ln2_w, BT, C,
                        stream);
        model->ffn_ops[l]->forward(model->branch_out, la->ffn, model->kind_scratch, la->ln2_out, &tf, c, B, T, rt);
        tp_sum(tp, model->branch_out, (size_t)BT * C, 0, stream); // reduce_from_tp
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
    if (tp != NULL) { // vocabulary-parallel: each rank's (max, sum of exp, target logit), gathered and combined
#ifdef USE_NCCL
        crossentropy_partial_kernel<<<BT, 1024, 0, stream>>>(model->ce_stats, model->logits, model->tokens_dev + BT,
                                                            c->vocab_size, Vp, c->vocab_offset);
        cudaCheck(cudaGetLastError());
        tp_allgather_f32(model, model->ce_all, model->ce_stats, (size_t)BT * 3);
        crossentropy_combine_kernel<<<CEIL_DIV(BT, 256), 256, 0, stream>>>(model->losses, model->lse, model->ce_all, BT,
                                                                           model->tp);
        cudaCheck(cudaGetLastError());
#endif
    } else {
        crossentropy_forward(model->losses, model->lse, model->logits, model->tokens_dev + BT, BT, V, Vp, stream);
    }
    cudaCheck(cudaMemcpyAsync(model->losses_host, model->losses, (size_t)BT * sizeof(float), cudaMemcpyDeviceToHost,
                              stream));
    cudaCheck(cudaStreamSynchronize(stream));
    double sum = 0.0;
    for (int i = 0; i < BT; i++) { sum += model->losses_host[i]; }
    model->mean_loss = (float)(sum / BT);
    return model->mean_loss;
}

static void model_zero_grad(Model *model) {
    cudaCheck(cudaMemsetAsync(model->grads_memory, 0, model->n_pad * sizeof(float), model->rt.stream));
}

// ----------------------------------------------------------------------------------------------------------------
// data parallelism over NCCL: ZeRO stage 1, the gradient reduce-scatter overlapped with the backward
//
// The gradient buffer is cut into buckets at layer boundaries (each at least DP_BUCKET_MIN numbers, its ends rounded
// to dp·64 so each rank's piece is a whole number of 256-byte lines). The backward finishes the head first, then the
// layers from the last down, then the embedding; as a bucket's last layer finishes, the main stream records an event,
// the comm stream waits for it and reduce-scatters the bucket in place (ncclAvg: each rank's piece becomes the
// replicas' average) while the backward goes on. model_grad_norm waits for the comm stream. Each rank then updates
// its pieces with its pieces of the AdamW moments (m_memory, v_memory: shard_numel numbers, bucket by bucket) and the
// pieces of the fp32 master weights are all-gathered, then cast to the working copy. The master weights stay whole
// on every rank because the decay gates read A_log and dt_bias from them in the forward: ZeRO-1 here shards the
// moments (8 of the 12 bytes a parameter), not the master copy.
// With one rank (M2RNN_NCCL=1) the buckets tile the buffer in order, the pieces are the buckets, and every number is
// computed as on the plain path: the run is the same bit for bit (test/test_gpu_nccl.sh).

#define DP_BUCKET_MIN ((size_t)8 << 20) // gradients a bucket (32 MiB of fp32) before it closes at a layer boundary

static inline size_t dp_piece_len(const Model *model, const GradBucket *b) { return (b->end - b->begin) / model->dp; }
static inline size_t dp_piece_begin(const Model *model, const GradBucket *b) {
    return b->begin + (size_t)model->dp_rank * dp_piece_len(model, b);
}

#ifdef USE_NCCL
// in place: this rank's piece of the replicas' average lands where its own gradients were
static void dp_reduce_bucket(Model *model, const GradBucket *b) {
    float *base = model->grads_memory + b->begin;
    ncclCheck(ncclReduceScatter(base, model->grads_memory + dp_piece_begin(model, b), dp_piece_len(model, b),
                                ncclFloat, ncclAvg, model->comm->nccl_dp, model->comm_stream));
}
#endif

// the backward has finished `layer` (n_layer: the head, -1: the embedding): start the buckets it completes
static void dp_buckets_ready(Model *model, int layer) {
#ifdef USE_NCCL
    if (model->comm == NULL || !model->sync_next || !model->overlap) { return; }
    int any = 0;
    for (int k = 0; k < model->num_grad_buckets; k++) { any |= model->grad_buckets[k].ready == layer; }
    if (!any) { return; }
    cudaCheck(cudaEventRecord(model->ev_ready, model->rt.stream));
    cudaCheck(cudaStreamWaitEvent(model->comm_stream, model->ev_ready, 0));
    for (int k = 0; k < model->num_grad_buckets; k++) {
        if (model->grad_buckets[k].ready == layer) { dp_reduce_bucket(model, &model->grad_buckets[k]); }
    }
    if (layer == -1) { // the end of the backward, for the exposed-time measure
        cudaCheck(cudaEventRecord(model->ev_bwd_end, model->rt.stream));
        model->reduced = 1;
    }
#else
    (void)model; (void)layer;
#endif
}

// every bucket reduced (those the backward did not start are started now) and the main stream waiting for them
static void dp_finish_reduce(Model *model) {
#ifdef USE_NCCL
    if (!model->reduced) {
        cudaCheck(cudaEventRecord(model->ev_bwd_end, model->rt.stream));
        cudaCheck(cudaStreamWaitEvent(model->comm_stream, model->ev_bwd_end, 0));
        ncclCheck(ncclGroupStart());
        for (int k = 0; k < model->num_grad_buckets; k++) { dp_reduce_bucket(model, &model->grad_buckets[k]); }
        ncclCheck(ncclGroupEnd());
    }
    cudaCheck(cudaEventRecord(model->ev_comm_done, model->comm_stream));
    cudaCheck(cudaStreamWaitEvent(model->rt.stream, model->ev_comm_done, 0));
    model->reduced = 0;
#else
    (void)model;
#endif
}

// the next backward is the last before model_grad_norm: reduce its buckets as its layers finish
static void model_sync_next_backward(Model *model) { model->sync_next = 1; }

// average milliseconds a step that the gradient reduce-scatter ran on after the backward ended; -1: not data-parallel
static double model_comm_exposed_ms(const Model *model) {
    return model->comm != NULL && model->exposed_steps > 0 ? model->exposed_ms / model->exposed_steps : -1.0;
}

static void model_backward(Model *model, float loss_scale) {
    const ModelConfig *c = &model->lc;
    const Runtime *rt = &model->rt;
    cudaStream_t stream = rt->stream;
    TPGroup *tp = model_tp_group(model);
    if (!model->have_targets || model->mean_loss < 0) {
        fail_with_hint("call model_forward with targets first", "model_backward without a forward pass with targets");
    }
    const int B = model->B, T = model->T, BT = B * T, C = c->d_model, Vp = c->padded_vocab_size;
    float *scratch = model->norm_reduce;
    crossentropy_backward_inplace(model->logits, model->lse, model->tokens_dev + BT, loss_scale / BT, BT, c->vocab_size,
                                  Vp, c->vocab_offset, stream);
    matmul_backward(model->d_norm, model->grads.lm_head, model->logits, model->lnf_out, model->params.lm_head, BT, C, Vp,
                    0, rt);
    tp_sum(tp, model->d_norm, (size_t)BT * C, 0, stream); // the vocabulary shards' parts of d(lnf_out)
    rmsnorm_backward(model->d_resid, model->grads.lnf_w, scratch, model->d_norm, model->resid_out, model->params.lnf_w,
                     model->lnf_rstd, BT, C, 0, stream);
    dp_buckets_ready(model, c->n_layer);
    model->have_targets = 0; // the logits are gone: a second backward needs a new forward
    for (int l = c->n_layer - 1; l >= 0; l--) {
        LayerActs *la = &model->layer_acts[l];
        const ModelParamsLayer *w = &model->params.layers[l];
        ModelParams32Layer *g = &model->grads.layers[l];
        const ModelParams32Layer *w32 = &model->master.layers[l];
        KindTensors tm = kind_tensors(w->mixer, w32->mixer, g->mixer);
        KindTensors tf = kind_tensors(w->ffn, w32->ffn, g->ffn);
        tf.aux_grad = loss_scale; // the auxiliary losses count in the objective as the mean loss does
        tm.tp = tf.tp = tp;
        // x_out = resid_mid + FFN(RMSNorm(resid_mid))
        model->ffn_ops[l]->backward(model->d_norm, model->kind_scratch, model->d_resid, la->ln2_out, la->ffn, &tf, c, B,
                                    T, rt);
        tp_sum(tp, model->d_norm, (size_t)BT * C, 0, stream); // copy_to_tp's backward: the input gradient's parts
        rmsnorm_backward(model->d_resid, g->ln2_w, scratch, model->d_norm, la->resid_mid, w->ln2_w, la->ln2_rstd, BT, C,
                         1, stream);
        // resid_mid = resid_in + Mixer(RMSNorm(resid_in))
        model->mixer_ops[l]->backward(model->d_norm, model->kind_scratch, model->d_resid, la->ln1_out, la->mixer, &tm,
                                      c, B, T, rt);
        tp_sum(tp, model->d_norm, (size_t)BT * C, 0, stream); // copy_to_tp's backward
        rmsnorm_backward(model->d_resid, g->ln1_w, scratch, model->d_norm, la->resid_in, w->ln1_w, la->ln1_rstd, BT, C,
                         1, stream);
        dp_buckets_ready(model, l);
    }
    embedding_backward(model->grads.wte, model->d_resid, model->inputs_host, BT, C, c->vocab_offset, Vp, &model->buckets,
                       stream);
    dp_buckets_ready(model, -1);
    model->sync_next = 0;
}

#ifdef USE_NCCL
// tensor-parallel: the gradients each rank computes only in part (TPRanges.sum) summed over the group, within this
// rank's data-parallel pieces (the TP group's ranks share their dp_rank, so their pieces coincide); one group call
static void tp_sum_partial_grads(Model *model) {
    const TPRanges *r = &model->tp_ranges;
    if (r->num_sum == 0) { return; }
    model->tp_group.calls++;
    ncclCheck(ncclGroupStart());
    for (int k = 0; k < model->num_grad_buckets; k++) {
        const size_t p0 = dp_piece_begin(model, &model->grad_buckets[k]), p1 = p0 + dp_piece_len(model, &model->grad_buckets[k]);
        for (int i = 0; i < r->num_sum; i++) {
            const size_t a = r->sum[2 * i] > p0 ? r->sum[2 * i] : p0;
            const size_t e = r->sum[2 * i] + r->sum[2 * i + 1] < p1 ? r->sum[2 * i] + r->sum[2 * i + 1] : p1;
            if (a >= e) { continue; }
            ncclCheck(ncclAllReduce(model->grads_memory + a, model->grads_memory + a, e - a, ncclFloat, ncclSum,
                                    model->comm->nccl_tp, model->rt.stream));
        }
    }
    ncclCheck(ncclGroupEnd());
}
#endif

// Data-parallel: the reduce-scatter is finished first; tensor-parallel: the partial gradients summed over the group.
// The norm is then the sum over all ranks of their pieces' squares, each number counted once (TP ranks > 0 leave out
// what every TP rank holds whole).
static double model_grad_norm(Model *model) {
    float norm2;
    cudaStream_t stream = model->rt.stream;
    if (model->comm != NULL) { dp_finish_reduce(model); }
#ifdef USE_NCCL
    if (model->tp > 1) { tp_sum_partial_grads(model); }
#endif
    const int spread = model->comm != NULL && (model->dp > 1 || model->tp > 1);
    if (!spread) {
        global_sum_squares(model->norm_scratch + NORM_BLOCKS, model->norm_scratch, model->grads_memory,
                           model->num_parameters, stream);
        cudaCheck(cudaMemcpyAsync(&norm2, model->norm_scratch + NORM_BLOCKS, sizeof(float), cudaMemcpyDeviceToHost,
                                  stream));
    } else {
        int np = 0;
        for (int k = 0; k < model->num_grad_buckets; k++) {
            const GradBucket *b = &model->grad_buckets[k];
            const size_t p0 = dp_piece_begin(model, b);
            np += tp_counted_pieces(model->norm_pieces + 2 * np, &model->tp_ranges, model->tp_rank, p0,
                                    p0 + dp_piece_len(model, b));
        }
        for (int i = 0; i < np; i++) {
            const size_t a = model->norm_pieces[2 * i], e = model->norm_pieces[2 * i + 1];
            global_sum_squares(model->dp_norms + i, model->norm_scratch, model->grads_memory + a, e - a, stream);
        }
        sum_partials_kernel<<<1, 256, 0, stream>>>(model->dp_norms + np, model->dp_norms, np);
        cudaCheck(cudaGetLastError());
        cudaCheck(cudaMemcpyAsync(&norm2, model->dp_norms + np, sizeof(float), cudaMemcpyDeviceToHost, stream));
    }
    cudaCheck(cudaStreamSynchronize(stream));
    if (model->comm != NULL) {
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, model->ev_bwd_end, model->ev_comm_done));
        if (model->exposed_calls++ > 0) { // (the first step's collectives also set up NCCL's connections)
            model->exposed_ms += ms > 0.0f ? ms : 0.0f;
            model->exposed_steps++;
        }
        if (spread) { return sqrt(comm_world_sum(model->comm, (double)norm2)); }
    }
    return sqrt((double)norm2);
}

// the AdamW moments' length: this rank's pieces (data-parallel) or every parameter
static size_t model_moments_numel(const Model *model) {
    return model->comm != NULL ? model->shard_numel : model->num_parameters;
}

static void model_alloc_moments(Model *model) {
    const size_t bytes = model_moments_numel(model) * sizeof(float);
    cudaCheck(cudaMalloc(&model->m_memory, bytes));
    cudaCheck(cudaMalloc(&model->v_memory, bytes));
    cudaCheck(cudaMemset(model->m_memory, 0, bytes));
    cudaCheck(cudaMemset(model->v_memory, 0, bytes));
}

// AdamW tensor by tensor (for their decay); data-parallel over this rank's pieces [p0, p1) only, the moments at
// moments + (x - p0), then the master pieces all-gathered and cast to the working copy
static void model_update(Model *model, const OptimizerConfig *opt, int step, double norm) {
    if (model->m_memory == NULL) { model_alloc_moments(model); }
    const float scale = (opt->grad_clip > 0 && norm > opt->grad_clip) ? (float)(opt->grad_clip / norm) : 1.0f;
    const int pieces = model->comm != NULL ? model->num_grad_buckets : 1;
    for (int k = 0; k < pieces; k++) {
        size_t p0 = 0, p1 = model->num_parameters, moments = 0;
        if (model->comm != NULL) {
            const GradBucket *b = &model->grad_buckets[k];
            p0 = dp_piece_begin(model, b);
            p1 = p0 + dp_piece_len(model, b);
            moments = b->shard_off;
        }
        for (int i = 0; i < model->lt.num_specs; i++) {
            const ParamSpec *s = &model->lt.specs[i];
            const size_t a = s->offset > p0 ? s->offset : p0;
            const size_t e = s->offset + s->numel < p1 ? s->offset + s->numel : p1;
            if (a >= e) { continue; }
            adamw_update(model->params_memory + a, model->master_memory + a, model->m_memory + moments + (a - p0),
                         model->v_memory + moments + (a - p0), model->grads_memory + a, e - a, opt->lr, opt->beta1,
                         opt->beta2, opt->eps, s->weight_decay ? opt->weight_decay : 0.0f, step, scale,
                         model->rt.stream);
        }
    }
#ifdef USE_NCCL
    if (model->comm != NULL && model->dp > 1) {
        ncclCheck(ncclGroupStart());
        for (int k = 0; k < model->num_grad_buckets; k++) {
            const GradBucket *b = &model->grad_buckets[k];
            ncclCheck(ncclAllGather(model->master_memory + dp_piece_begin(model, b), model->master_memory + b->begin,
                                    dp_piece_len(model, b), ncclFloat, model->comm->nccl_dp, model->rt.stream));
        }
        ncclCheck(ncclGroupEnd());
        cast_f32_to_floatx(model->params_memory, model->master_memory, (long)model->num_parameters, model->rt.stream);
    }
#endif
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
    for (int i = 0; i < 2; i++) {
        if (model->dec_gen_graph[i] != NULL) { cudaCheck(cudaGraphExecDestroy(model->dec_gen_graph[i])); }
    }
    if (model->gen_host != NULL) {
        cudaCheck(cudaFreeHost(model->gen_host));
        cudaCheck(cudaEventDestroy(model->gen_ev[0]));
        cudaCheck(cudaEventDestroy(model->gen_ev[1]));
        cudaCheck(cudaEventDestroy(model->gen_fork));
        cudaCheck(cudaEventDestroy(model->gen_join));
        cudaCheck(cudaStreamDestroy(model->gen_side));
    }
    if (model->step_host != NULL) {
        cudaCheck(cudaFreeHost(model->step_host));
        cudaCheck(cudaEventDestroy(model->step_ev[0]));
        cudaCheck(cudaEventDestroy(model->step_ev[1]));
    }
    if (model->dec_rt2.stream != NULL) {
        for (int l = 0; l < model->config.n_layer; l++) {
            cudaCheck(cudaEventDestroy(model->dec_ev[l][0]));
            cudaCheck(cudaEventDestroy(model->dec_ev[l][1]));
        }
        cudaCheck(cudaEventDestroy(model->dec_fork));
        cudaCheck(cudaEventDestroy(model->dec_join));
        runtime_free(&model->dec_rt2);
    }
    if (model->buckets.device != NULL) { cudaCheck(cudaFree(model->buckets.device)); }
    if (model->comm != NULL) {
        cudaCheck(cudaFree(model->dp_norms));
        cudaCheck(cudaStreamDestroy(model->comm_stream));
        cudaCheck(cudaEventDestroy(model->ev_ready));
        cudaCheck(cudaEventDestroy(model->ev_comm_done));
        cudaCheck(cudaEventDestroy(model->ev_bwd_end));
    }
    free(model->buckets.host);
    free(model->norm_pieces);
    tp_ranges_free(&model->tp_ranges);
    free(model->inputs_host);
    free(model->losses_host);
    runtime_free(&model->rt);
    free(model);
}

static int model_has_optimizer(const Model *model) { return model->m_memory != NULL; }

// the full moments (num_parameters) to host memory from this rank's pieces: all-gathered through a temporary
// full-length buffer (collective over the replicas); with one rank the pieces are the buffer in order
static void dp_gather_moments(const Model *model, float *host, const float *pieces) {
    const size_t n = model->num_parameters;
    if (model->dp == 1) {
        cudaCheck(cudaMemcpy(host, pieces, n * sizeof(float), cudaMemcpyDeviceToHost));
        return;
    }
#ifdef USE_NCCL
    float *full;
    cudaCheck(cudaMalloc(&full, model->n_pad * sizeof(float)));
    ncclCheck(ncclGroupStart());
    for (int k = 0; k < model->num_grad_buckets; k++) {
        const GradBucket *b = &model->grad_buckets[k];
        ncclCheck(ncclAllGather(pieces + b->shard_off, full + b->begin, dp_piece_len(model, b), ncclFloat,
                                model->comm->nccl_dp, model->rt.stream));
    }
    ncclCheck(ncclGroupEnd());
    cudaCheck(cudaStreamSynchronize(model->rt.stream));
    cudaCheck(cudaMemcpy(host, full, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(full));
#endif
}

// the full state, in the whole model's layout (every rank calls it: the moments are gathered from the replicas'
// pieces, and tensor-parallel ranks all-gather their local buffers)
static void model_read_state(const Model *model, void *params, void *m, void *v) {
    const size_t nl = model->num_parameters, bytes = nl * sizeof(float);
    const int tp = model->tp, moments = m != NULL && model->m_memory != NULL;
    float *lp = tp > 1 ? (float *)mallocCheck(bytes) : (float *)params;
    float *lm = moments && tp > 1 ? (float *)mallocCheck(bytes) : (float *)m;
    float *lv = moments && tp > 1 ? (float *)mallocCheck(bytes) : (float *)v;
    cudaCheck(cudaMemcpy(lp, model->master_memory, bytes, cudaMemcpyDeviceToHost));
    if (moments) {
        if (model->comm != NULL) {
            dp_gather_moments(model, lm, model->m_memory);
            dp_gather_moments(model, lv, model->v_memory);
        } else {
            cudaCheck(cudaMemcpy(lm, model->m_memory, bytes, cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(lv, model->v_memory, bytes, cudaMemcpyDeviceToHost));
        }
    }
    if (tp > 1) {
        tp_gather_full(model->comm, params, &model->table, lp, &model->lt, sizeof(float));
        free(lp);
        if (moments) {
            tp_gather_full(model->comm, m, &model->table, lm, &model->lt, sizeof(float));
            tp_gather_full(model->comm, v, &model->table, lv, &model->lt, sizeof(float));
            free(lm);
            free(lv);
        }
    }
}

// this rank's pieces of full host moments (written at any data-parallel size); the padding past the parameters is 0
static void dp_scatter_moments(Model *model, float *pieces, const float *host) {
    const size_t n = model->num_parameters;
    for (int k = 0; k < model->num_grad_buckets; k++) {
        const GradBucket *b = &model->grad_buckets[k];
        const size_t p0 = dp_piece_begin(model, b), len = dp_piece_len(model, b);
        const size_t have = p0 >= n ? 0 : (p0 + len <= n ? len : n - p0);
        if (have > 0) {
            cudaCheck(cudaMemcpy(pieces + b->shard_off, host + p0, have * sizeof(float), cudaMemcpyHostToDevice));
        }
    }
}

// from a full state (a checkpoint written at any data-parallel or tensor-parallel size, in the whole model's layout):
// each rank keeps its tensor-parallel shards, and of the moments its data-parallel pieces of those
static void model_write_state(Model *model, const void *params, const void *m, const void *v) {
    const size_t n = model->num_parameters, bytes = n * sizeof(float);
    float *local[3] = {NULL, NULL, NULL};
    if (model->tp > 1) { // this rank's shards of the whole model's numbers
        const void *full[3] = {params, m, v};
        for (int i = 0; i < 3; i++) {
            if (full[i] == NULL) { continue; }
            local[i] = (float *)callocCheck(n, sizeof(float));
            model_tp_shard((void *)full[i], &model->table, local[i], &model->lt, sizeof(float), model->tp_rank,
                           model->tp, 0);
        }
        params = local[0];
        m = local[1];
        v = local[2];
    }
    model_upload_params(model, (const float *)params);
    if (model->m_memory != NULL) {
        cudaCheck(cudaFree(model->m_memory));
        cudaCheck(cudaFree(model->v_memory));
        model->m_memory = model->v_memory = NULL;
    }
    if (m != NULL && model->comm != NULL) { // this rank's pieces of the moments
        model_alloc_moments(model);
        dp_scatter_moments(model, model->m_memory, (const float *)m);
        dp_scatter_moments(model, model->v_memory, (const float *)v);
    } else if (m != NULL) {
        cudaCheck(cudaMalloc(&model->m_memory, bytes));
        cudaCheck(cudaMalloc(&model->v_memory, bytes));
        cudaCheck(cudaMemcpy(model->m_memory, m, bytes, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(model->v_memory, v, bytes, cudaMemcpyHostToDevice));
    }
    for (int i = 0; i < 3; i++) { free(local[i]); }
}

// Vp floatX values of device memory → host floats
static void copy_logits_row(float *out, const floatX *row, int Vp) {
    floatX *tmp = (floatX *)mallocCheck((size_t)Vp * sizeof(floatX));
    cudaCheck(cudaMemcpy(tmp, row, (size_t)Vp * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (int i = 0; i < Vp; i++) { out[i] = (float)tmp[i]; }
    free(tmp);
}

// (tensor-parallel: the group's vocabulary shards of the row, all-gathered; every rank of the group calls it)
static void model_logits_row(Model *model, int b, int t, float *out) {
    const int Vl = model->lc.padded_vocab_size;
    if (model->tp == 1) {
        copy_logits_row(out, model->logits + ((size_t)b * model->T + t) * Vl, Vl);
        return;
    }
    float *mine = (float *)mallocCheck((size_t)Vl * sizeof(float));
    copy_logits_row(mine, model->logits + ((size_t)b * model->T + t) * Vl, Vl);
    comm_tp_allgather(model->comm, out, mine, (size_t)Vl, sizeof(float));
    free(mine);
}

// ----------------------------------------------------------------------------------------------------------------
// decoding

// The next token of B sequences drawn on the GPU from their logits rows, so a generation loop's tokens stay on the
// device (model_decode_gen_*: B ints reach the host a step, not B rows of the vocabulary). A row is cut into chunks
// of SAMPLE_CHUNK ids, a CTA of SAMPLE_CTA threads a (chunk, row); warp w of a CTA owns the chunk's w-th run of
// SAMPLE_RUN ids and reads it 32 16-byte pieces at a time (a piece a lane: coalesced), so the ids a warp visits go up
// in order. The chunk is a constant, so every sum's order, and with it the token, is the same whatever B or the GPU.
// - sample_max_kernel: each chunk's largest value (greedy: of x, NaN skipped, the first among equals; else of
//   v = x / temperature) into its SamplePart. Greedy: the row's last CTA to finish (a counter a row) takes the largest
//   of the chunks' (a total order: the larger, then the lower id), sample_token's scan (a NaN is never the largest,
//   unless it is id 0's, which the scan then never leaves).
// - sample_sum_kernel (temperature > 0, after it): maxv as sample_token has it (it starts at id 0's v and skips NaNs
//   after it) from the chunks' maxima, then each chunk's Σ exp((double)(v − maxv)) (sample_token's terms: the warps'
//   lane-scanned pieces in order, then the warps in order). The row's last CTA sums the chunks in order, takes the
//   first chunk whose running sum reaches r = u·Σ, in it the first warp, in that warp the first id: sample_token's draw
//   with its sums in another order, so a draw within rounding of a boundary (≈ 1e-16 relative) may take the
//   neighbouring id; deterministic. None (a NaN anywhere, a row of −inf, r past every sum): the last id, as the host.
// The logits are read as sample_token sees them: with a repetition penalty (SampleOut.seen not NULL) the ids a
// sequence has seen (a bitmap a row) are divided by rp where positive, else multiplied by it, as fp32 on the host.
// The token goes to tok[b] (and is marked seen); with pos, pos[b] advances by one (at most to last_pos): the next
// step's inputs. The kernels wait on the kernel before them (pdl_wait), so a decode step's graph may launch them
// programmatically.
#define SAMPLE_CHUNK 4096
#define SAMPLE_CTA 256
#define SAMPLE_WARPS (SAMPLE_CTA / WARP_SIZE)
#define SAMPLE_RUN (SAMPLE_CHUNK / SAMPLE_WARPS)      // ids a warp
#define SAMPLE_ITERS (SAMPLE_RUN / (PACK * WARP_SIZE)) // its iterations of 32 pieces
static_assert(SAMPLE_RUN % (PACK * WARP_SIZE) == 0, "a warp's run is whole iterations of 32 pieces");
typedef struct {
    float best; // the chunk's largest value (NaN skipped; best_i −1: none)
    int best_i;
    double sum; // its Σ exp(v − maxv) (sample_sum_kernel)
} SamplePart;
// where the sampler's tokens go, and the repetition penalty
typedef struct {
    int *tok;       // (B) the tokens
    int *pos;       // (B) NULL, or each advanced by one (at most to last_pos)
    int last_pos;
    uint32_t *seen; // (B, ceil(V / 32)) NULL (no penalty), or the ids each sequence has seen, the new token marked
    float rp;       // the penalty (> 0)
} SampleOut;
// the logit sample_token sees at id: the penalty where the sequence has seen it (word: the seen bits of id's 32). The
// kernels come with (PEN) and without the penalty, so sampling without one pays nothing for it.
template <bool PEN> __device__ __forceinline__ float sample_pen(float v, uint32_t word, int id, float rp) {
    if constexpr (!PEN) { return v; }
    return ((word >> (id & 31)) & 1u) ? (v > 0.0f ? v / rp : v * rp) : v;
}
// the seen bits of row b's ids id0 & ~31 .. + 31
template <bool PEN> __device__ __forceinline__ uint32_t sample_seen(const SampleOut &o, int b, int V, int id0) {
    if constexpr (!PEN) { return 0u; }
    return o.seen[(size_t)b * CEIL_DIV(V, 32) + id0 / 32];
}
// the sampler's scratch for B rows of V ids: (B, chunks) SampleParts, then (B) counters that start at 0 (the kernels
// leave them at 0)
static inline int sample_chunks(int V) { return CEIL_DIV(V, SAMPLE_CHUNK); }
static inline size_t sample_scratch_bytes(int B, int V) {
    return (size_t)B * sample_chunks(V) * sizeof(SamplePart) + (size_t)B * sizeof(int);
}
// the first id of lane's piece in iteration it of warp w of chunk c
__device__ __forceinline__ int sample_id0(int c, int w, int it, int lane) {
    return c * SAMPLE_CHUNK + w * SAMPLE_RUN + (it * WARP_SIZE + lane) * PACK;
}
// lane's piece of row b: its PACK ids' w = exp(v − maxv) (0 past V), each in w, and their sum in id order
template <bool PEN>
__device__ __forceinline__ double sample_piece(double (&w)[PACK], const floatX *x, int id0, int V, float temperature,
                                               float maxv, const SampleOut &out, int b) {
    const Pack pk = id0 < V ? *(const Pack *)(x + id0) : Pack{};
    const uint32_t word = id0 < V ? sample_seen<PEN>(out, b, V, id0) : 0u;
    double s = 0.0;
#pragma unroll
    for (int e = 0; e < PACK; e++) {
        const float v = sample_pen<PEN>((float)pk.v[e], word, id0 + e, out.rp) / temperature;
        w[e] = id0 + e < V ? exp((double)(v - maxv)) : 0.0;
        s += w[e];
    }
    return s;
}
// whether candidate (ov, oi) beats (best, best_i): larger, or equal and a lower id (no candidate: id −1, loses)
__device__ __forceinline__ bool sample_beats(float ov, int oi, float best, int best_i) {
    return oi >= 0 && (best_i < 0 || ov > best || (ov == best && oi < best_i));
}
// (best, best_i) over the warp's lanes (sample_beats is a total order: any order of the comparisons gives it)
__device__ __forceinline__ void sample_warp_best(float &best, int &best_i) {
    for (int off = WARP_SIZE / 2; off > 0; off /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, off);
        const int oi = __shfl_xor_sync(0xffffffffu, best_i, off);
        if (sample_beats(ov, oi, best, best_i)) { best = ov; best_i = oi; }
    }
}
// the row's largest over its C chunks' SampleParts (read from L2: other CTAs wrote them), in every lane of the warp
__device__ __forceinline__ void sample_row_best(float &best, int &best_i, const SamplePart *pr, int C) {
    best = -INFINITY;
    best_i = -1;
    for (int c = threadIdx.x % WARP_SIZE; c < C; c += WARP_SIZE) {
        const float ov = __ldcg(&pr[c].best);
        const int oi = __ldcg(&pr[c].best_i);
        if (sample_beats(ov, oi, best, best_i)) { best = ov; best_i = oi; }
    }
    sample_warp_best(best, best_i);
}
// whether this CTA is the last of the row's C to arrive (its partials written before): all threads get the answer;
// the last resets the row's counter for the next launch
__device__ __forceinline__ bool sample_last_cta(int *count, int C) {
    __shared__ int s_last;
    __threadfence(); // (each thread's stores of the row's partials, before the count)
    __syncthreads();
    if (threadIdx.x == 0) {
        s_last = atomicAdd(count, 1) == C - 1;
        if (s_last) { *count = 0; __threadfence(); }
    }
    __syncthreads();
    return s_last;
}
__device__ __forceinline__ void sample_emit(const SampleOut &o, int b, int V, int token) {
    o.tok[b] = token;
    if (o.pos != NULL) { o.pos[b] = min(o.pos[b] + 1, o.last_pos); }
    if (o.seen != NULL) { atomicOr(&o.seen[(size_t)b * CEIL_DIV(V, 32) + token / 32], 1u << (token & 31)); }
}
template <bool PEN>
__global__ void __launch_bounds__(SAMPLE_CTA)
    sample_max_kernel(SampleOut out, SamplePart *part, int *count, const floatX *logits, int ld, int V,
                      float temperature) {
    __shared__ float s_f[SAMPLE_WARPS];
    __shared__ int s_i[SAMPLE_WARPS];
    const int c = blockIdx.x, b = blockIdx.y, C = gridDim.x;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const floatX *x = logits + (size_t)b * ld; // (V) this sequence's row (ld a multiple of PACK)
    const bool greedy = temperature == 0.0f;
    pdl_wait(); // (the logits: the step before)
    pdl_trigger();
    float best = -INFINITY;
    int best_i = -1;
#pragma unroll
    for (int it = 0; it < SAMPLE_ITERS; it++) {
        const int id0 = sample_id0(c, warp, it, lane);
        if (id0 >= V) { break; }
        const Pack pk = *(const Pack *)(x + id0);
        const uint32_t word = sample_seen<PEN>(out, b, V, id0);
#pragma unroll
        for (int e = 0; e < PACK; e++) {
            const float p = sample_pen<PEN>((float)pk.v[e], word, id0 + e, out.rp);
            const float v = greedy ? p : p / temperature;
            if (id0 + e < V && !isnan(v) && (best_i < 0 || v > best)) { best = v; best_i = id0 + e; }
        }
    }
    sample_warp_best(best, best_i);
    if (lane == 0) { s_f[warp] = best; s_i[warp] = best_i; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SAMPLE_WARPS; w++) {
            if (sample_beats(s_f[w], s_i[w], best, best_i)) { best = s_f[w]; best_i = s_i[w]; }
        }
        part[(size_t)b * C + c].best = best;
        part[(size_t)b * C + c].best_i = best_i;
    }
    if (!greedy || !sample_last_cta(count + b, C)) { return; }
    if (warp == 0) {
        sample_row_best(best, best_i, part + (size_t)b * C, C);
        if (lane == 0) { sample_emit(out, b, V, isnan((float)x[0]) || best_i < 0 ? 0 : best_i); }
    }
}
template <bool PEN>
__global__ void __launch_bounds__(SAMPLE_CTA)
    sample_sum_kernel(SampleOut out, SamplePart *part, int *count, const floatX *logits, int ld, int V,
                      const double *u, float temperature) {
    __shared__ double s_d[SAMPLE_WARPS];
    __shared__ int s_chunk, s_pick;
    __shared__ double s_rloc;
    const int c = blockIdx.x, b = blockIdx.y, C = gridDim.x;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const floatX *x = logits + (size_t)b * ld;
    SamplePart *pr = part + (size_t)b * C;
    pdl_wait(); // (the chunks' maxima: sample_max_kernel)
    pdl_trigger();
    float best, maxv;
    int best_i;
    sample_row_best(best, best_i, pr, C); // (every warp)
    const float v0 = sample_pen<PEN>((float)x[0], sample_seen<PEN>(out, b, V, 0), 0, out.rp) / temperature;
    maxv = isnan(v0) || best_i < 0 ? v0 : best;
    // this chunk's sum: each warp's iterations' lane-scanned sums in order, then the warps in order
    double w[PACK];
    double carry = 0.0;
#pragma unroll
    for (int it = 0; it < SAMPLE_ITERS; it++) {
        const int id0 = sample_id0(c, warp, it, lane);
        const double incl = warp_scan_incl(sample_piece<PEN>(w, x, id0, V, temperature, maxv, out, b));
        carry += __shfl_sync(0xffffffffu, incl, WARP_SIZE - 1);
    }
    if (lane == 0) { s_d[warp] = carry; }
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int w = 0; w < SAMPLE_WARPS; w++) { s += s_d[w]; }
        pr[c].sum = s;
    }
    if (!sample_last_cta(count + b, C)) { return; }
    // the last CTA: the chunks' running sums in order (a lane a chunk, 32 at a time), the first to reach r
    if (warp == 0) {
        double run = 0.0; // the chunks before this round of 32
        double sums_before = 0.0;
        int first = -1;
        double total = 0.0;
        for (int c0 = 0; c0 < C; c0 += WARP_SIZE) {
            const double incl = warp_scan_incl(c0 + lane < C ? __ldcg(&pr[c0 + lane].sum) : 0.0);
            total = run + __shfl_sync(0xffffffffu, incl, WARP_SIZE - 1);
            run = total;
        }
        const double r = u[b] * total;
        run = 0.0;
        for (int c0 = 0; c0 < C && first < 0; c0 += WARP_SIZE) {
            const double incl = warp_scan_incl(c0 + lane < C ? __ldcg(&pr[c0 + lane].sum) : 0.0);
            const unsigned hits = __ballot_sync(0xffffffffu, c0 + lane < C && run + incl >= r);
            const double excl = __shfl_up_sync(0xffffffffu, incl, 1); // (lane 0: none before it in the round)
            if (hits != 0u) {
                const int l = __ffs(hits) - 1;
                first = c0 + l;
                sums_before = run + __shfl_sync(0xffffffffu, lane > 0 ? excl : 0.0, l); // the chunks before the first
            }
            run += __shfl_sync(0xffffffffu, incl, WARP_SIZE - 1);
        }
        if (lane == 0) {
            s_chunk = first;
            s_rloc = r - sums_before;
            s_pick = SAMPLE_WARPS;
        }
    }
    __syncthreads();
    const int cs = s_chunk;
    if (cs < 0) { // r past every sum (rounding, or NaN)
        if (threadIdx.x == 0) { sample_emit(out, b, V, V - 1); }
        return;
    }
    // chunk cs again, the same sums: the first warp whose running sum reaches r − (the chunks before), then its id
    const double rl = s_rloc;
    carry = 0.0;
#pragma unroll
    for (int it = 0; it < SAMPLE_ITERS; it++) {
        const int id0 = sample_id0(cs, warp, it, lane);
        const double incl = warp_scan_incl(sample_piece<PEN>(w, x, id0, V, temperature, maxv, out, b));
        carry += __shfl_sync(0xffffffffu, incl, WARP_SIZE - 1);
    }
    if (lane == 0) { s_d[warp] = carry; } // (thread 0's read of s_d came before sample_last_cta's barriers)
    __syncthreads();
    double before = 0.0;
    for (int w = 0; w < warp; w++) { before += s_d[w]; }
    if (lane == 0 && before + carry >= rl) { atomicMin(&s_pick, warp); }
    __syncthreads();
    if (warp == s_pick) { // its iterations again until a lane's running sum reaches rl
        double run = 0.0;
        int pick = -1;
        for (int it = 0; it < SAMPLE_ITERS && pick < 0; it++) {
            const int id0 = sample_id0(cs, warp, it, lane);
            const double incl = warp_scan_incl(sample_piece<PEN>(w, x, id0, V, temperature, maxv, out, b));
            const double lower = __shfl_up_sync(0xffffffffu, incl, 1); // the lanes' before this one
            double acc = (before + run) + (lane > 0 ? lower : 0.0);
            int hit = -1;
            for (int e = 0; e < PACK; e++) {
                if (id0 + e < V) {
                    acc += w[e]; // (the terms sample_piece summed)
                    if (hit < 0 && acc >= rl) { hit = id0 + e; }
                }
            }
            const unsigned hits = __ballot_sync(0xffffffffu, hit >= 0);
            if (hits != 0u) { pick = __shfl_sync(0xffffffffu, hit, __ffs(hits) - 1); }
            run += __shfl_sync(0xffffffffu, incl, WARP_SIZE - 1);
        }
        if (lane == 0) { // (none: the replay fell short of the warp's sum by rounding: the warp's last id)
            sample_emit(out, b, V, pick >= 0 ? pick : min(V, sample_id0(cs, warp + 1, 0, 0)) - 1);
        }
    }
    if (threadIdx.x == 0 && s_pick == SAMPLE_WARPS) { // (the chunk's warps fell short by rounding: its last id)
        sample_emit(out, b, V, min(V, (cs + 1) * SAMPLE_CHUNK) - 1);
    }
}
// out.tok (B) on the device: each of B rows (ld apart, V real ids) sampled, greedy (temperature 0) or with u (B) the
// draws in (0, 1]; scratch sample_scratch_bytes(B, V) on the device, its counters at 0 (as the kernels leave them).
// Programmatic launches while launch_pdl is set.
static void decode_sample(SampleOut out, void *scratch, const floatX *logits, int ld, int V, int B, const double *u,
                          float temperature, cudaStream_t stream) {
    const int C = sample_chunks(V);
    SamplePart *part = (SamplePart *)scratch; // (B, C)
    int *count = (int *)(part + (size_t)B * C); // (B)
    const dim3 grid(C, B);
    const bool pen = out.seen != NULL;
    launch_k(pen ? sample_max_kernel<true> : sample_max_kernel<false>, grid, SAMPLE_CTA, 0, stream, out, part, count,
             logits, ld, V, temperature);
    if (temperature != 0.0f) {
        launch_k(pen ? sample_sum_kernel<true> : sample_sum_kernel<false>, grid, SAMPLE_CTA, 0, stream, out, part, count,
                 logits, ld, V, u, temperature);
    }
}
// Top-k sampling on the GPU (temperature > 0, 0 < k ≤ SAMPLE_TOPK_MAX, k < V; with or without top-p): sample_token's
// draw with top-k (the same candidates in the same order, their double sums in the same order; only exp's last bit
// may differ from the C library's, so a draw within ≈ 1e-16 of a boundary may take the neighbour). One
// kernel, a CTA of SAMPLE_CTA threads a (chunk, row) as the sampler above: each chunk's min(k, its ids) largest
// order-preserving keys of v = x / temperature (sample_key: larger v first, −0 = +0, NaN lowest), equal keys taken by
// the lower id (a radix select over the chunk's keys in shared memory, then a gather in id order), to cand. The row's
// last CTA selects the row's k largest among the chunks' candidates the same way (equal keys sit in id order in the
// chunks' lists: a chunk's keys equal to the row's k-th are all above its own k-th, or all at it), sorts them (bitonic:
// the larger key, then the lower id: cand_desc's order), and draws as sample_candidates does: maxv, each
// w_i = exp((double)(v_i − maxv)) and (top-p) w_i / Σ in parallel, then the running sums in order by one thread.
#define SAMPLE_TOPK_MAX 1024
// the sampler's order-preserving key of v: larger v, larger key; −0 as +0 (equal in sample_token's order); NaN lowest
__device__ __forceinline__ uint32_t sample_key(float v) {
    if (isnan(v)) { return 0u; }
    const uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
// the k-th largest T of n keys (key(i), i < n; 1 ≤ k ≤ n), a byte at a time from the top; take_eq: how many of the
// keys equal to T are among the k largest (k less those above T). Every thread of the CTA calls it; hist (256) shared.
template <typename KeyAt> __device__ uint32_t sample_radix_select(KeyAt key, int n, int k, int &take_eq, int *hist) {
    __shared__ uint32_t s_prefix;
    __shared__ int s_remaining;
    __syncthreads(); // (an earlier call's readers are done with them)
    if (threadIdx.x == 0) { s_prefix = 0u; s_remaining = k; }
    uint32_t mask = 0u;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) { hist[i] = 0; }
        __syncthreads();
        const uint32_t prefix = s_prefix;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const uint32_t kk = key(i);
            if ((kk & mask) == prefix) { atomicAdd(&hist[(kk >> shift) & 255u], 1); }
        }
        __syncthreads();
        if (threadIdx.x < WARP_SIZE) { // the digit: bins from 255 down, 8 a lane, the lanes' counts scanned
            const int lane = threadIdx.x, rem = s_remaining;
            int cnt[8], s = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) { cnt[j] = hist[255 - 8 * lane - j]; s += cnt[j]; }
            const int incl = warp_scan_incl(s);
            const unsigned hit = __ballot_sync(0xffffffffu, incl - s < rem && rem <= incl);
            if (lane == __ffs(hit) - 1) {
                int above = incl - s, d = 255 - 8 * lane - 7;
                for (int j = 0; j < 8; j++) {
                    if (above + cnt[j] >= rem) { d = 255 - 8 * lane - j; break; }
                    above += cnt[j];
                }
                s_remaining = rem - above;
                s_prefix = prefix | ((uint32_t)d << shift);
            }
        }
        mask |= 255u << shift;
        __syncthreads();
    }
    take_eq = s_remaining;
    return s_prefix;
}
// the k largest of n keys in id order, the keys above T first (positions 0 ..), then the first take_eq equal to T
// (positions k − take_eq ..): emit(position, i, key). Each thread a contiguous run of i, the runs' counts scanned.
template <typename KeyAt, typename Emit>
__device__ void sample_gather(KeyAt key, int n, int k, uint32_t T, int take_eq, Emit emit) {
    __shared__ int s_w[2][SAMPLE_WARPS];
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int per = CEIL_DIV(n, SAMPLE_CTA), i0 = min(n, (int)threadIdx.x * per), i1 = min(n, i0 + per);
    int gt = 0, eq = 0;
    for (int i = i0; i < i1; i++) {
        const uint32_t kk = key(i);
        gt += kk > T;
        eq += kk == T;
    }
    int igt = warp_scan_incl(gt), ieq = warp_scan_incl(eq);
    if (lane == WARP_SIZE - 1) { s_w[0][warp] = igt; s_w[1][warp] = ieq; }
    __syncthreads();
    for (int w = 0; w < warp; w++) { igt += s_w[0][w]; ieq += s_w[1][w]; }
    int pg = igt - gt, pe = ieq - eq; // exclusive
    for (int i = i0; i < i1; i++) {
        const uint32_t kk = key(i);
        if (kk > T) { emit(pg++, i, kk); }
        else if (kk == T && pe < take_eq) { emit(k - take_eq + pe, i, kk); pe++; }
    }
    __syncthreads();
}
// cand (B, C, k) the chunks' candidates (key, id); count (B) at 0; top_v, top_id (B, k) NULL, or the sorted candidates
template <bool PEN>
__global__ void __launch_bounds__(SAMPLE_CTA)
    sample_topk_kernel(SampleOut out, uint2 *cand, int *count, float *top_v, int *top_id, const floatX *logits, int ld,
                       int V, int k, const double *u, float temperature, float top_p) {
    __shared__ int hist[256];
    __shared__ __align__(16) unsigned char s_buf[SAMPLE_TOPK_MAX * 24]; // the chunk's keys; then the row's candidates
    __shared__ float s_max[SAMPLE_WARPS];
    const int c = blockIdx.x, b = blockIdx.y, C = gridDim.x, tid = threadIdx.x;
    const floatX *x = logits + (size_t)b * ld;
    static_assert(SAMPLE_CHUNK * sizeof(uint32_t) <= sizeof(s_buf), "the chunk's keys fit");
    uint32_t *keys = (uint32_t *)s_buf; // (SAMPLE_CHUNK)
    pdl_wait();
    pdl_trigger();
    const int c0 = c * SAMPLE_CHUNK, n = min(SAMPLE_CHUNK, V - c0), kc = min(k, n);
    for (int p = tid; p < SAMPLE_CHUNK / PACK; p += SAMPLE_CTA) {
        const int id0 = c0 + p * PACK;
        if (id0 >= V) { break; }
        const Pack pk = *(const Pack *)(x + id0);
        const uint32_t word = sample_seen<PEN>(out, b, V, id0);
#pragma unroll
        for (int e = 0; e < PACK; e++) {
            keys[p * PACK + e] = sample_key(sample_pen<PEN>((float)pk.v[e], word, id0 + e, out.rp) / temperature);
        }
    }
    __syncthreads();
    int take_eq;
    auto chunk_key = [&](int i) { return keys[i]; };
    uint32_t T = sample_radix_select(chunk_key, n, kc, take_eq, hist);
    uint2 *cr = cand + (size_t)b * C * k; // this row's: chunk c's kc at c·k
    sample_gather(chunk_key, n, kc, T, take_eq,
                  [&](int at, int i, uint32_t kk) { cr[(size_t)c * k + at] = make_uint2(kk, (uint32_t)(c0 + i)); });
    if (!sample_last_cta(count + b, C)) { return; }
    // the row's last CTA: the k largest of the M candidates (every chunk's k but the last's)
    const int M = (C - 1) * k + min(k, V - (C - 1) * SAMPLE_CHUNK);
    auto cand_key = [&](int i) { return __ldcg(&cr[i].x); };
    T = sample_radix_select(cand_key, M, k, take_eq, hist);
    uint32_t *c_key = (uint32_t *)s_buf;                            // (K2) the candidates' keys, then their v
    int *c_id = (int *)(s_buf + SAMPLE_TOPK_MAX * 4);               // (K2)
    double *w = (double *)(s_buf + SAMPLE_TOPK_MAX * 8);            // (k) exp(v − maxv)
    double *pw = (double *)(s_buf + SAMPLE_TOPK_MAX * 16);          // (k) top-p: w / Σ
    sample_gather(cand_key, M, k, T, take_eq,
                  [&](int at, int i, uint32_t kk) { c_key[at] = kk; c_id[at] = (int)__ldcg(&cr[i].y); });
    int K2 = 1;
    while (K2 < k) { K2 *= 2; }
    for (int i = k + tid; i < K2; i += SAMPLE_CTA) { c_key[i] = 0u; c_id[i] = 0x7fffffff; } // last in the order
    __syncthreads();
    for (int size = 2; size <= K2; size *= 2) { // bitonic: "before" = the larger key, or the equal key with the lower id
        for (int stride = size / 2; stride > 0; stride /= 2) {
            for (int i = tid; i < K2; i += SAMPLE_CTA) {
                const int j = i ^ stride;
                if (j > i) {
                    const bool before = c_key[j] > c_key[i] || (c_key[j] == c_key[i] && c_id[j] < c_id[i]); // j first
                    if (before == ((i & size) == 0)) {
                        const uint32_t tk = c_key[i]; c_key[i] = c_key[j]; c_key[j] = tk;
                        const int ti = c_id[i]; c_id[i] = c_id[j]; c_id[j] = ti;
                    }
                }
            }
            __syncthreads();
        }
    }
    // sample_candidates on work = the k sorted candidates (v = x / temperature): maxv = work[0].v, then each larger v
    float *cv = (float *)c_key;
    float m = -INFINITY;
    for (int i = tid; i < k; i += SAMPLE_CTA) {
        const int id = c_id[i];
        const float v = sample_pen<PEN>((float)x[id], sample_seen<PEN>(out, b, V, id), id, out.rp) / temperature;
        cv[i] = v;
        if (v > m) { m = v; }
        if (top_v != NULL) { top_v[(size_t)b * k + i] = v; top_id[(size_t)b * k + i] = c_id[i]; }
    }
    m = warp_reduce_max(m);
    if (tid % WARP_SIZE == 0) { s_max[tid / WARP_SIZE] = m; }
    __syncthreads();
    float maxv = cv[0];
    for (int i = 0; i < SAMPLE_WARPS; i++) { maxv = isnan(cv[0]) || !(s_max[i] > maxv) ? maxv : s_max[i]; }
    for (int i = tid; i < k; i += SAMPLE_CTA) { w[i] = exp((double)(cv[i] - maxv)); }
    __syncthreads();
    __shared__ double s_sum;
    if (tid == 0) {
        double sum = 0.0;
        for (int i = 0; i < k; i++) { sum += w[i]; }
        s_sum = sum;
    }
    __syncthreads();
    const double sum0 = s_sum;
    if (top_p < 1.0f) {
        for (int i = tid; i < k; i += SAMPLE_CTA) { pw[i] = w[i] / sum0; }
        __syncthreads();
    }
    if (tid == 0) {
        int n_keep = k;
        double sum = sum0;
        if (top_p < 1.0f) { // the smallest prefix with mass >= top_p
            double acc = 0.0;
            for (int i = 0; i < k; i++) {
                acc += pw[i];
                if (acc >= top_p) { n_keep = i + 1; break; }
            }
            sum = 0.0;
            for (int i = 0; i < n_keep; i++) { sum += w[i]; }
        }
        const double r = u[b] * sum;
        double acc = 0.0;
        int pick = c_id[n_keep - 1];
        for (int i = 0; i < n_keep; i++) {
            acc += w[i];
            if (acc >= r) { pick = c_id[i]; break; }
        }
        sample_emit(out, b, V, pick);
    }
}
// the top-k sampler's candidates: (B, chunks, SAMPLE_TOPK_MAX) pairs at most
static inline size_t sample_topk_scratch_bytes(int B, int V) {
    return (size_t)B * sample_chunks(V) * SAMPLE_TOPK_MAX * sizeof(uint2);
}
// out.tok (B) on the device: each of B rows sampled with top-k (and top-p < 1, or 1: none) at temperature > 0, u (B)
// the draws; cand sample_topk_scratch_bytes(B, V) on the device; scratch decode_sample's (its counters); top_v, top_id
// (B, k) NULL or the sorted candidates (tests)
static void decode_sample_topk(SampleOut out, void *cand, void *scratch, float *top_v, int *top_id,
                               const floatX *logits, int ld, int V, int B, int k, const double *u, float temperature,
                               float top_p, cudaStream_t stream) {
    const int C = sample_chunks(V);
    int *count = (int *)((SamplePart *)scratch + (size_t)B * C); // (B)
    launch_k(out.seen != NULL ? sample_topk_kernel<true> : sample_topk_kernel<false>, dim3(C, B), SAMPLE_CTA, 0, stream,
             out, (uint2 *)cand, count, top_v, top_id, logits, ld, V, k, u, temperature, top_p);
}

#define DECODE_ROWS 2048 // tokens (sequences × chunk) a prefill chunk runs through the forward's kernels at once

// B rounded up to 4: lane tokens start this many ints after its positions (16-byte aligned)
static inline size_t decode_b4(int B) { return ((size_t)B + 3) & ~(size_t)3; }

static void decode_gen_graphs_free(Model *model) {
    for (int i = 0; i < 2; i++) {
        if (model->dec_gen_graph[i] != NULL) { cudaCheck(cudaGraphExecDestroy(model->dec_gen_graph[i])); }
        model->dec_gen_graph[i] = NULL;
    }
}

static void model_decode_begin(Model *model, int B, int context) {
    const ModelConfig *c = &model->config;
    const Runtime *rt = &model->rt;
    const size_t C = (size_t)c->d_model;
    if (model->tp > 1) {
        fail_with_hint("generate from the checkpoint with one process (./infer_m2rnn); checkpoints hold the whole model",
                       "decoding under tensor parallelism (-tp %d) is not supported", model->tp);
    }
    if (B < 1 || context < 1) { fail_with_hint("decode at least one sequence of one token", "model_decode_begin(B=%d, context=%d)", B, context); }
    if (model->dec_memory != NULL) { cudaCheck(cudaFree(model->dec_memory)); }
    if (model->dec_graph != NULL) { cudaCheck(cudaGraphExecDestroy(model->dec_graph)); model->dec_graph = NULL; }
    decode_gen_graphs_free(model);
    model->dec_steps = 0;
    model->step_n = 0;
    model->gen_queued = model->gen_waited = 0;
    model->dec_graph_off = env_is_1("M2RNN_NO_GRAPH");
    model->dec_pdl_off = env_is_1("M2RNN_NO_PDL"); // (benchmarks: the step without programmatic launches)
    const char *chunk_rows = getenv("M2RNN_PREFILL_ROWS");
    model->dec_chunk_rows = chunk_rows != NULL ? atoi(chunk_rows) : DECODE_ROWS;
    if (model->dec_chunk_rows < 1 || model->dec_chunk_rows > DECODE_ROWS) { model->dec_chunk_rows = DECODE_ROWS; }
    // the second lane (its buffers, stream and cuBLASLt workspace) only where a prefill can need more than one chunk
    // (chunks are at least dec_chunk_rows / B tokens a sequence): not for the trainer's samples, one sequence stepping
    // through a context shorter than a chunk
    const int min_chunk = model->dec_chunk_rows / B > 0 ? model->dec_chunk_rows / B : 1;
    model->dec_two_lanes = !env_is_1("M2RNN_ONE_LANE") && context > min_chunk;
    for (int l = 0; l < c->n_layer; l++) { // MoE groups its tokens on the host (moe.cuh): a step it runs cannot be captured
        if (model->ffn_ops[l]->letter == 'e') { model->dec_graph_off = 1; model->dec_two_lanes = 0; }
    }
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
        for (int lane = 0; lane < 2; lane++) { // (lane 1 only when a prefill alternates)
            DecodeLane *L = &model->dec_lane[lane];
            const int on = lane == 0 || model->dec_two_lanes;
            L->x = TAKE_X(&a, on ? rows * C : 0);
            L->norm = TAKE_X(&a, on ? rows * C : 0);
            L->branch = TAKE_X(&a, on ? rows * C : 0);
            L->x2 = TAKE_X(&a, lane == 0 ? (size_t)B * C : 0);
            L->rstd = TAKE_F(&a, on ? rows : 0);
            // (pos, then tokens decode_b4(B) ints after it: a step's staging is one copy, decode_step_stage)
            L->pos = (int *)take(&a, on ? (decode_b4(B) + (size_t)rows) * sizeof(int) : 0);
            L->tokens = L->pos == NULL ? NULL : L->pos + decode_b4(B);
            L->work = take(&a, on ? work : 0);
        }
        model->dec_parts = TAKE_F(&a, (size_t)STEP_MAX_PARTS * B * C);
        model->dec_logits = TAKE_X(&a, (size_t)B * c->padded_vocab_size);
        model->dec_sample_u = (double *)take(&a, (size_t)B * sizeof(double));
        model->dec_sample_scratch = take(&a, sample_scratch_bytes(B, c->vocab_size));
        model->dec_topk_cand = take(&a, sample_topk_scratch_bytes(B, c->vocab_size));
        model->dec_seen = (uint32_t *)take(&a, (size_t)B * CEIL_DIV(c->vocab_size, 32) * sizeof(uint32_t));
        if (pass == 0) {
            cudaError_t err = cudaMalloc(&model->dec_memory, a.used);
            if (err != cudaSuccess) {
                fail_with_hint("decode fewer sequences or a shorter context", "cannot allocate %.2f GiB of decode "
                               "state for %d sequences of %d tokens: %s", a.used / 1073741824.0, B, context,
                               cudaGetErrorString(err));
            }
        } else {
            cudaCheck(cudaMemsetAsync(model->dec_memory, 0, state_bytes, rt->stream)); // the empty history
            cudaCheck(cudaMemsetAsync(model->dec_sample_scratch, 0, sample_scratch_bytes(B, c->vocab_size),
                                      rt->stream)); // (its counters start at 0)
        }
    }
    if (model->dec_two_lanes && model->dec_rt2.stream == NULL) { // lane 1's runtime and the chunk events, once
        runtime_init(&model->dec_rt2, rt->device);
        for (int l = 0; l < c->n_layer; l++) {
            cudaCheck(cudaEventCreateWithFlags(&model->dec_ev[l][0], cudaEventDisableTiming));
            cudaCheck(cudaEventCreateWithFlags(&model->dec_ev[l][1], cudaEventDisableTiming));
        }
        cudaCheck(cudaEventCreateWithFlags(&model->dec_fork, cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&model->dec_join, cudaEventDisableTiming));
    }
    if (model->step_host == NULL || model->step_host_B != B) { // a step's pinned staging (its copies have run: the
        if (model->step_host == NULL) {                        // cudaFree above waited for the device)
            cudaCheck(cudaEventCreateWithFlags(&model->step_ev[0], cudaEventDisableTiming));
            cudaCheck(cudaEventCreateWithFlags(&model->step_ev[1], cudaEventDisableTiming));
        } else {
            cudaCheck(cudaFreeHost(model->step_host));
        }
        const size_t n = 2 * (decode_b4(B) + (size_t)B);
        cudaCheck(cudaMallocHost(&model->step_host, n * sizeof(int)));
        memset(model->step_host, 0, n * sizeof(int));
        model->step_host_B = B;
    }
    model->dec_B = B;
    model->dec_rows = rows;
    model->dec_context = context;
}

// layer l as a decode step or advance sees it: its weights, the kinds' tensors and ops, and the state of sequence b0
typedef struct {
    const ModelParamsLayer *w;
    KindTensors tm, tf; // the mixer's and the feed-forward's
    const KindOps *mx, *ff;
    void *state; // the mixer's decode state of sequence b0
} DecodeLayer;
static DecodeLayer decode_layer(const Model *model, int l, int b0) {
    DecodeLayer d;
    d.w = &model->params.layers[l];
    const ModelParams32Layer *w32 = &model->master.layers[l];
    d.tm = kind_tensors(d.w->mixer, w32->mixer, NULL);
    d.tf = kind_tensors(d.w->ffn, w32->ffn, NULL);
    d.mx = model->mixer_ops[l];
    d.ff = model->ffn_ops[l];
    d.state = (char *)model->dec_state[l] + (size_t)b0 * d.mx->state_bytes(&model->config, model->dec_context);
    return d;
}

// sequences b0 .. b0+nb−1 run T tokens each through the layers on one lane (T = 1: the kinds' step kernels, lane 0;
// T > 1: their advance, the forward's kernels from the states); the lane's tokens (nb·T) and pos (nb) are on the
// device. The residual stream is added and normed as the training forward does (rmsnorm with the residual fused), then
// with `logits` each sequence's last row makes its next-token logits (a prefill's last chunk; every step). A chunk's
// mixer of layer l waits for the other lane's last chunk to have left that layer's state (dec_ev) and marks its own.
static void decode_run(Model *model, int lane, int b0, int nb, int T, int logits) {
    const ModelConfig *c = &model->config;
    Runtime *rt = lane == 0 ? &model->rt : &model->dec_rt2;
    const DecodeLane *L = &model->dec_lane[lane];
    cudaStream_t stream = rt->stream;
    const int C = c->d_model, n = nb * T, Vp = c->padded_vocab_size;
    const int chain = T > 1 && model->dec_two_lanes; // the chunk events
    rt->plain_recurrence = model->rt.plain_recurrence;
    rt->decode_step = T == 1;
    launch_pdl = T == 1 && !model->dec_pdl_off; // the step's own kernels start while the one before finishes
    if (T == 1) { // a step: each RMSNorm made by the next kind's first product where it can (StepInput)
        floatX *xs[2] = {L->x, L->x2};
        int cur = 0; // the residual stream is xs[cur]
        // (a kind's branch may come as partial sums in dec_parts, which the next norm adds: step_branch_product; the
        // first norm embeds the tokens into xs[0] itself)
        StepInput in = {L->norm, model->params.wte, NULL, model->params.layers[0].ln1_w, xs[0], L->rstd, 0,
                        model->dec_parts, 0, 0, L->tokens};
        for (int l = 0; l < c->n_layer; l++) {
            const DecodeLayer d = decode_layer(model, l, b0);
            d.mx->step(L->branch, d.state, L->work, &in, &d.tm, c, nb, L->pos, model->dec_context, rt);
            in = (StepInput){L->norm, xs[cur], L->branch, d.w->ln2_w, xs[1 - cur], L->rstd, 0, model->dec_parts,
                             in.out_nparts, 0};
            cur = 1 - cur;
            d.ff->step(L->branch, NULL, L->work, &in, &d.tf, c, nb, L->pos, model->dec_context, rt);
            const floatX *next_w = l + 1 < c->n_layer ? model->params.layers[l + 1].ln1_w : model->params.lnf_w;
            in = (StepInput){L->norm, xs[cur], L->branch, next_w, xs[1 - cur], L->rstd, 0, model->dec_parts,
                             in.out_nparts, 0};
            cur = 1 - cur;
        }
        step_product(model->dec_logits + (size_t)b0 * Vp, Vp, &in, model->params.lm_head, nb, C, Vp, rt);
        rt->decode_step = 0;
        launch_pdl = 0;
        return;
    }
    embedding_forward(L->x, L->tokens, model->params.wte, n, C, 0, c->padded_vocab_size, stream);
    rmsnorm_forward(L->norm, L->rstd, NULL, L->x, NULL, model->params.layers[0].ln1_w, n, C, stream);
    for (int l = 0; l < c->n_layer; l++) {
        const DecodeLayer d = decode_layer(model, l, b0);
        if (chain) { cudaCheck(cudaStreamWaitEvent(stream, model->dec_ev[l][1 - lane], 0)); }
        d.mx->advance(L->branch, d.state, L->work, L->norm, &d.tm, c, nb, T, L->pos, model->dec_context, rt);
        if (chain) { cudaCheck(cudaEventRecord(model->dec_ev[l][lane], stream)); }
        rmsnorm_forward(L->norm, L->rstd, L->x, L->x, L->branch, d.w->ln2_w, n, C, stream);
        const size_t acts = d.ff->acts_bytes(c, nb, T, rt);
        d.ff->forward(L->branch, L->work, (char *)L->work + acts, L->norm, &d.tf, c, nb, T, rt);
        const floatX *next_w = l + 1 < c->n_layer ? model->params.layers[l + 1].ln1_w : model->params.lnf_w;
        rmsnorm_forward(L->norm, L->rstd, L->x, L->x, L->branch, next_w, n, C, stream);
    }
    if (logits) { // each sequence's last row
        cudaCheck(cudaMemcpy2DAsync(L->branch, C * sizeof(floatX), L->norm + (size_t)(T - 1) * C,
                                    (size_t)T * C * sizeof(floatX), C * sizeof(floatX), nb, cudaMemcpyDeviceToDevice,
                                    stream));
        matmul_forward(model->dec_logits + (size_t)b0 * Vp, L->branch, model->params.lm_head, nb, C, Vp, rt);
    }
    rt->decode_step = 0;
    launch_pdl = 0;
}

// the generation loop's draw (model_decode_gen_launch): the next tokens of all B sequences from their logits into lane
// 0's tokens, their positions advanced, programmatically after the kernel before
static void decode_gen_sample(Model *model) {
    const ModelConfig *c = &model->config;
    const DecodeLane *L = &model->dec_lane[0];
    const GenSampling *g = &model->gen;
    const SampleOut out = {L->tokens, L->pos, model->dec_context - 1, g->rp != 1.0f ? model->dec_seen : NULL, g->rp};
    launch_pdl = !model->dec_pdl_off;
    if (g->top_k > 0) {
        decode_sample_topk(out, model->dec_topk_cand, model->dec_sample_scratch, NULL, NULL, model->dec_logits,
                           c->padded_vocab_size, c->vocab_size, model->dec_B, g->top_k, model->dec_sample_u, g->temp,
                           g->top_p, model->rt.stream);
    } else {
        decode_sample(out, model->dec_sample_scratch, model->dec_logits, c->padded_vocab_size, c->vocab_size,
                      model->dec_B, model->dec_sample_u, g->temp, model->rt.stream);
    }
    launch_pdl = 0;
}

// the generation loop's tokens of this iteration (lane 0's, drawn) into its pinned slot: forked onto gen_side beside
// the step and joined at its end (fork) or after what stream has queued
static void decode_gen_copy(Model *model, int slot, int fork) {
    cudaStream_t stream = model->rt.stream, s = fork ? model->gen_side : stream;
    int *htok = (int *)((double *)model->gen_host + 2 * (size_t)model->dec_B) + (size_t)slot * model->dec_B;
    if (fork) {
        cudaCheck(cudaEventRecord(model->gen_fork, stream));
        cudaCheck(cudaStreamWaitEvent(s, model->gen_fork, 0));
    }
    cudaCheck(cudaMemcpyAsync(htok, model->dec_lane[0].tokens, (size_t)model->dec_B * sizeof(int),
                              cudaMemcpyDeviceToHost, s));
    if (fork) { cudaCheck(cudaEventRecord(model->gen_join, s)); }
}

// the step of all B sequences (tokens and positions already in lane 0's buffers; gen: the generation loop's draw of
// them first, and their copy into the loop's slot) as one CUDA graph: captured on the second step (the first runs
// eagerly and sets the kernels' attributes), replayed after that, so a step costs one launch instead of a few
// hundred; the loop has a graph a slot (the copy's address is the graph's). The copy goes beside the step: between
// two graphs it held the next one back by a copy's latency. Eager when M2RNN_NO_GRAPH=1, or (with a warning) when the
// capture fails.
static void decode_step_graph(Model *model, int gen, int slot) {
    cudaStream_t stream = model->rt.stream;
    cudaGraphExec_t *exec = gen ? &model->dec_gen_graph[slot] : &model->dec_graph;
    if (gen && memcmp(&model->dec_gen_sampling, &model->gen, sizeof(GenSampling)) != 0) {
        decode_gen_graphs_free(model); // (other settings: another sampler)
        model->dec_gen_sampling = model->gen;
    }
    if (*exec == NULL && !model->dec_graph_off && model->dec_steps >= 1) {
        cudaGraph_t graph = NULL;
        cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
        if (err == cudaSuccess) {
            if (gen) {
                decode_gen_sample(model);
                decode_gen_copy(model, slot, 1);
            }
            decode_run(model, 0, 0, model->dec_B, 1, 1);
            if (gen) { cudaCheck(cudaStreamWaitEvent(stream, model->gen_join, 0)); }
            err = cudaStreamEndCapture(stream, &graph);
        }
        if (err == cudaSuccess) { err = cudaGraphInstantiate(exec, graph, 0); }
        if (graph != NULL) { cudaGraphDestroy(graph); }
        if (err != cudaSuccess) {
            fprintf(stderr, "warning: the decode step could not be captured as a CUDA graph (%s); stepping eagerly\n",
                    cudaGetErrorString(err));
            (void)cudaGetLastError();
            *exec = NULL;
            model->dec_graph_off = 1;
        }
    }
    if (*exec != NULL) {
        cudaCheck(cudaGraphLaunch(*exec, stream));
    } else {
        if (gen) { decode_gen_sample(model); }
        decode_run(model, 0, 0, model->dec_B, 1, 1);
        if (gen) { decode_gen_copy(model, slot, 0); }
        model->dec_steps++;
    }
}

// a step of all B sequences (model_decode_step): their positions and tokens into a pinned slot once its last copy
// has run, one copy to the device, the step queued; nothing waited for, so the host queues the next step while this
// one runs (a wait for each step left the GPU idle for the host's turn: the wake-up, the staging, the launches)
static void decode_step_stage(Model *model, const int *tokens, const int *pos) {
    const int B = model->dec_B;
    const size_t B4 = decode_b4(B);
    const int slot = (int)(model->step_n % 2);
    int *h = model->step_host + (size_t)slot * (B4 + B);
    if (model->step_n >= 2) { cudaCheck(cudaEventSynchronize(model->step_ev[slot])); }
    memcpy(h, pos, (size_t)B * sizeof(int));
    memcpy(h + B4, tokens, (size_t)B * sizeof(int));
    cudaStream_t stream = model->rt.stream;
    cudaCheck(cudaMemcpyAsync(model->dec_lane[0].pos, h, (B4 + B) * sizeof(int), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaEventRecord(model->step_ev[slot], stream));
    model->step_n++;
    decode_step_graph(model, 0, 0);
}

static void model_decode_advance(Model *model, int b0, int nb, const int *tokens, int T, const int *pos) {
    const ModelConfig *c = &model->config;
    decode_check_advance(model->dec_B, model->dec_context, b0, nb, T, pos);
    model_check_tokens(tokens, (size_t)nb * T, c->vocab_size, "decode");
    if (T == 1 && b0 == 0 && nb == model->dec_B) { // a step of every sequence: queued, not waited for
        decode_step_stage(model, tokens, pos);
        return;
    }
    const int rows = model->dec_chunk_rows;
    const int CH = T == 1 ? 1 : (rows / nb > 0 ? rows / nb : 1); // tokens a chunk, every sequence
    const int two = T > CH && model->dec_two_lanes;              // chunks alternate between the lanes
    const size_t tok_n = (size_t)nb * (CH < T ? CH : T);
    int *tok[2], *cpos[2]; // a lane's host staging, reused two chunks later (after that lane's stream has drained)
    for (int i = 0; i < 2; i++) {
        tok[i] = (int *)mallocCheck(tok_n * sizeof(int));
        cpos[i] = (int *)mallocCheck((size_t)nb * sizeof(int));
    }
    if (two) { // lane 1 starts after what lane 0 has queued (the states' reset, earlier steps)
        cudaCheck(cudaEventRecord(model->dec_fork, model->rt.stream));
        cudaCheck(cudaStreamWaitEvent(model->dec_rt2.stream, model->dec_fork, 0));
    }
    for (int s0 = 0, chunk = 0; s0 < T; s0 += CH, chunk++) {
        // a one-token chunk (a last chunk after full ones) runs the step's kernels, which wait on no chunk event and
        // whose graph reads lane 0's buffers: it goes to lane 0 once lane 1 has drained into it
        const int Tc = T - s0 < CH ? T - s0 : CH, lane = two && Tc > 1 ? chunk & 1 : 0;
        cudaStream_t stream = lane == 0 ? model->rt.stream : model->dec_rt2.stream;
        if (two && Tc == 1) {
            cudaCheck(cudaEventRecord(model->dec_join, model->dec_rt2.stream));
            cudaCheck(cudaStreamWaitEvent(model->rt.stream, model->dec_join, 0));
        }
        if (chunk >= 2 || (chunk == 1 && lane == 0)) { cudaCheck(cudaStreamSynchronize(stream)); } // staging reused
        for (int i = 0; i < nb; i++) {
            memcpy(tok[lane] + (size_t)i * Tc, tokens + (size_t)i * T + s0, (size_t)Tc * sizeof(int));
            cpos[lane][i] = pos[i] + s0;
        }
        const DecodeLane *L = &model->dec_lane[lane];
        cudaCheck(cudaMemcpyAsync(L->tokens, tok[lane], (size_t)nb * Tc * sizeof(int), cudaMemcpyHostToDevice, stream));
        cudaCheck(cudaMemcpyAsync(L->pos, cpos[lane], (size_t)nb * sizeof(int), cudaMemcpyHostToDevice, stream));
        if (Tc == 1 && b0 == 0 && nb == model->dec_B) {
            decode_step_graph(model, 0, 0);
        } else {
            decode_run(model, lane, b0, nb, Tc, s0 + Tc == T);
        }
    }
    if (two) { // lane 0 (every later call) continues after lane 1's chunks
        cudaCheck(cudaEventRecord(model->dec_join, model->dec_rt2.stream));
        cudaCheck(cudaStreamWaitEvent(model->rt.stream, model->dec_join, 0));
    }
    cudaCheck(cudaStreamSynchronize(model->rt.stream)); // the host staging is freed
    for (int i = 0; i < 2; i++) { free(tok[i]); free(cpos[i]); }
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

static double model_aux_loss(const Model *model) { return model->aux_loss; }

#ifdef USE_NCCL
// the TP group's all-reduce (TPGroup.sum): in place, on the caller's stream (the main one)
static void tp_nccl_sum(TPGroup *g, void *x, size_t n, int fp32, cudaStream_t stream) {
    const ncclDataType_t type = fp32 || FLOATX_IS_FP32 ? ncclFloat : ncclBfloat16;
    ncclCheck(ncclAllReduce(x, x, n, type, ncclSum, ((const Comm *)g->ctx)->nccl_tp, stream));
}

// tensor parallelism: this rank's local config and table replace the whole model's (before the weights are set:
// model_init_weights and model_write_state shard the whole model's); the buffers are made again at the local size
static void model_set_tensor_parallel(Model *model, const Comm *comm) {
    tp_local_layout(&model->lc, &model->lt, &model->config, comm);
    model->tp = comm->tp;
    model->tp_rank = comm->tp_rank;
    const size_t n = model->lt.num_parameters;
    model->num_parameters = model->n_pad = n;
    cudaCheck(cudaFree(model->params_memory));
    cudaCheck(cudaFree(model->master_memory));
    cudaCheck(cudaFree(model->grads_memory));
    cudaCheck(cudaMalloc(&model->params_memory, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&model->master_memory, n * sizeof(float)));
    cudaCheck(cudaMalloc(&model->grads_memory, n * sizeof(float)));
    cudaCheck(cudaMemset(model->master_memory, 0, n * sizeof(float)));
    cudaCheck(cudaMemset(model->grads_memory, 0, n * sizeof(float)));
    model_point_views(&model->params, model->params_memory, sizeof(floatX), &model->lt);
    tp_ranges_build(&model->tp_ranges, &model->table, &model->lt, comm->tp);
    TPGroup g = {comm->tp, comm->tp_rank, tp_nccl_sum, (void *)comm, 0};
    model->tp_group = g;
    if (model->acts_memory != NULL) { // (laid out for the whole model's layers, if a forward ran)
        cudaCheck(cudaFree(model->acts_memory));
        model->acts_memory = NULL;
    }
}
#endif

// Data parallelism on the GPUs (NCCL, ZeRO-1; see "data parallelism over NCCL" above): more than one process, or
// one with M2RNN_NCCL=1 (the NCCL path with a single rank, which must equal the plain path bit for bit). Lays out the
// buckets and this rank's pieces, widens the gradient and master buffers to the padded length, makes the comm stream.
// With -tp > 1 the tensor-parallel layout comes first, and the buckets cut this rank's local buffer.
static void model_set_parallel(Model *model, const Comm *comm) {
    const char *env = getenv("M2RNN_NCCL");
    const int want = comm->world > 1 || (env != NULL && strcmp(env, "1") == 0);
    if (!want) { return; }
#ifndef USE_NCCL
    fail_with_hint("build train_m2rnn with MPI and NCCL (make finds mpicc and nccl.h: apt-get install libopenmpi-dev, "
                   "NCCL from CUDA's repository), or run one process",
                   "this ./train_m2rnn was built without NCCL and cannot run %d processes", comm->world);
#else
    if (comm->tp > 1) { model_set_tensor_parallel(model, comm); }
    const ModelConfig *c = &model->lc;
    const ParamTable *t = &model->lt;
    const size_t n = model->num_parameters, align = (size_t)comm->dp * 64;
    model->comm = comm;
    model->dp = comm->dp;
    model->dp_rank = comm->dp_rank;
    model->overlap = !env_is_1("M2RNN_NO_OVERLAP");
    model->n_pad = CEIL_DIV(n, align) * align;
    // where each layer's tensors begin, and the head's (the final norm, then the LM head)
    size_t layer_begin[MAX_LAYERS + 1];
    for (int l = 0; l <= c->n_layer; l++) { layer_begin[l] = n; }
    for (int i = 0; i < t->num_specs; i++) {
        const ParamSpec *s = &t->specs[i];
        const int l = s->layer >= 0 ? s->layer : (s->offset == 0 ? -1 : c->n_layer); // wte first, lnf/lm_head last
        if (l >= 0 && s->offset < layer_begin[l]) { layer_begin[l] = s->offset; }
    }
    // buckets from the top of the buffer down, in the order the backward finishes them, then put in memory order
    GradBucket *bk = model->grad_buckets;
    int nb = 0;
    size_t end = model->n_pad;
    for (int l = c->n_layer; l >= 0; l--) {
        const size_t begin = CEIL_DIV(layer_begin[l], align) * align;
        if (begin < end && (end - begin >= DP_BUCKET_MIN || l == c->n_layer)) {
            bk[nb].begin = begin; bk[nb].end = end; bk[nb].ready = l;
            nb++;
            end = begin;
        }
    }
    bk[nb].begin = 0; bk[nb].end = end; bk[nb].ready = -1; // the embedding and whatever layers are left
    nb++;
    for (int i = 0; i < nb / 2; i++) { GradBucket tmp = bk[i]; bk[i] = bk[nb - 1 - i]; bk[nb - 1 - i] = tmp; }
    model->num_grad_buckets = nb;
    model->shard_numel = 0;
    for (int k = 0; k < nb; k++) {
        bk[k].shard_off = model->shard_numel;
        model->shard_numel += dp_piece_len(model, &bk[k]);
    }
    // the gradients and master weights over the padded length (the padding stays 0)
    float *grads, *master;
    cudaCheck(cudaMalloc(&grads, model->n_pad * sizeof(float)));
    cudaCheck(cudaMalloc(&master, model->n_pad * sizeof(float)));
    cudaCheck(cudaMemset(grads, 0, model->n_pad * sizeof(float)));
    cudaCheck(cudaMemset(master, 0, model->n_pad * sizeof(float)));
    cudaCheck(cudaMemcpy(master, model->master_memory, n * sizeof(float), cudaMemcpyDeviceToDevice));
    cudaCheck(cudaFree(model->grads_memory));
    cudaCheck(cudaFree(model->master_memory));
    model->grads_memory = grads;
    model->master_memory = master;
    model_point_views(&model->grads, model->grads_memory, sizeof(float), t);
    model_point_views(&model->master, model->master_memory, sizeof(float), t);
    // the norm's pieces: each bucket's piece, less (TP ranks > 0) the ranges every TP rank holds whole
    model->max_norm_pieces = nb * (model->tp_ranges.num_once + 1);
    model->norm_pieces = (size_t *)mallocCheck((size_t)model->max_norm_pieces * 2 * sizeof(size_t));
    cudaCheck(cudaMalloc(&model->dp_norms, (size_t)(model->max_norm_pieces + 1) * sizeof(float)));
    cudaCheck(cudaStreamCreate(&model->comm_stream));
    cudaCheck(cudaEventCreate(&model->ev_ready));
    cudaCheck(cudaEventCreate(&model->ev_comm_done));
    cudaCheck(cudaEventCreate(&model->ev_bwd_end));
    comm_nccl_init((Comm *)comm); // (created once, in the program's Comm, which outlives the model)
#endif
}

static int model_decode_gen_begin(Model *model, const int *pos, float temperature, int top_k, float top_p,
                                  float rep_penalty, const int *const *seen, const int *n_seen) {
    const int B = model->dec_B, V = model->config.vocab_size, W = CEIL_DIV(V, 32);
    if (B == 0) { fail_with_hint("call model_decode_begin first", "model_decode_gen_begin without a decode state"); }
    if (!(temperature >= 0.0f) || isinf(temperature) || !(top_p > 0.0f) || !(rep_penalty > 0.0f)) { return 0; }
    const int topk = temperature != 0.0f && top_k > 0 && top_k < V; // (else greedy, or the whole vocabulary)
    if ((topk && top_k > SAMPLE_TOPK_MAX) || (temperature != 0.0f && !topk && top_p < 1.0f)) { return 0; }
    cudaStream_t stream = model->rt.stream;
    // (the iterations of an earlier loop have finished with the pinned slots, which may be freed here, and the graphs)
    cudaCheck(cudaStreamSynchronize(stream));
    if (model->gen_host != NULL && model->gen_host_B < B) {
        cudaCheck(cudaFreeHost(model->gen_host));
        model->gen_host = NULL;
        decode_gen_graphs_free(model); // (their copies' addresses)
    }
    if (model->gen_host == NULL) {
        if (model->gen_ev[0] == NULL) {
            cudaCheck(cudaEventCreateWithFlags(&model->gen_ev[0], cudaEventDisableTiming));
            cudaCheck(cudaEventCreateWithFlags(&model->gen_ev[1], cudaEventDisableTiming));
            cudaCheck(cudaEventCreateWithFlags(&model->gen_fork, cudaEventDisableTiming));
            cudaCheck(cudaEventCreateWithFlags(&model->gen_join, cudaEventDisableTiming));
            cudaCheck(cudaStreamCreateWithFlags(&model->gen_side, cudaStreamNonBlocking));
        }
        cudaCheck(cudaMallocHost(&model->gen_host, (size_t)2 * B * (sizeof(double) + sizeof(int))));
        model->gen_host_B = B;
    }
    cudaCheck(cudaMemcpy(model->dec_lane[0].pos, pos, (size_t)B * sizeof(int), cudaMemcpyHostToDevice));
    if (rep_penalty != 1.0f) { // the ids each sequence has seen (sample_token's: every valid token of it once)
        uint32_t *bits = (uint32_t *)callocCheck((size_t)B * W, sizeof(uint32_t));
        for (int b = 0; b < B; b++) {
            for (int i = 0; i < n_seen[b]; i++) {
                const int t = seen[b][i];
                if (t >= 0 && t < V) { bits[(size_t)b * W + t / 32] |= 1u << (t % 32); }
            }
        }
        cudaCheck(cudaMemcpy(model->dec_seen, bits, (size_t)B * W * sizeof(uint32_t), cudaMemcpyHostToDevice));
        free(bits);
    }
    model->gen = (GenSampling){temperature, topk ? top_k : 0, topk ? (top_p < 1.0f ? top_p : 1.0f) : 1.0f, rep_penalty};
    model->gen_queued = model->gen_waited = 0;
    return 1;
}

static void model_decode_gen_launch(Model *model, const double *u, int step) {
    const int B = model->dec_B;
    if (B == 0 || model->gen_host == NULL) {
        fail_with_hint("call model_decode_gen_begin first", "model_decode_gen_launch without a generation loop");
    }
    if (model->gen_queued - model->gen_waited >= 2) {
        fail_with_hint("wait for the oldest (model_decode_gen_wait) first", "a third generation iteration queued");
    }
    cudaStream_t stream = model->rt.stream;
    const int slot = (int)(model->gen_queued % 2);
    double *hu = (double *)model->gen_host + (size_t)slot * B;
    if (model->gen.temp != 0.0f) { // (the slot's last copy ran before its iteration's event, waited for)
        memcpy(hu, u, (size_t)B * sizeof(double));
        cudaCheck(cudaMemcpyAsync(model->dec_sample_u, hu, (size_t)B * sizeof(double), cudaMemcpyHostToDevice, stream));
    }
    if (step) { // (the tokens' copy inside)
        decode_step_graph(model, 1, slot);
    } else {
        decode_gen_sample(model);
        decode_gen_copy(model, slot, 0);
    }
    cudaCheck(cudaEventRecord(model->gen_ev[slot], stream));
    model->gen_queued++;
}

static void model_decode_gen_wait(Model *model, int *tokens) {
    const int B = model->dec_B;
    if (model->gen_waited >= model->gen_queued) {
        fail_with_hint("launch an iteration (model_decode_gen_launch) first", "model_decode_gen_wait with none queued");
    }
    const int slot = (int)(model->gen_waited % 2);
    cudaCheck(cudaEventSynchronize(model->gen_ev[slot]));
    memcpy(tokens, (int *)((double *)model->gen_host + 2 * (size_t)B) + (size_t)slot * B, (size_t)B * sizeof(int));
    model->gen_waited++;
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
