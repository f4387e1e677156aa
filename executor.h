/*
executor.h: the API every executor of the model implements (the CPU reference in ref/lm.h, the GPU in lm.cuh) and the
programs call: the training run (train_loop.h), the tests, the benchmarks. A program includes one executor and this
file's users; nothing here knows which executor it gets. Model is the executor's own struct.

Numbers in checkpoints (the master weights and the AdamW moments) have executor_master_bytes() bytes each.
*/
#ifndef M2RNN_EXECUTOR_H
#define M2RNN_EXECUTOR_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "model.h"

typedef struct Model Model;

// fills the config's defaults, validates it, builds the parameter table and allocates the parameters (not yet set)
static Model *model_create(const ModelConfig *config);
static void model_free(Model *model);
static const ModelConfig *model_config(const Model *model);
static const ParamTable *model_table(const Model *model);
static void model_init_weights(Model *model, uint64_t seed);

// training: forward over host token arrays inputs (B,T) and, if not NULL, targets (B,T); returns the mean loss or -1
static double model_forward(Model *model, const int *inputs, const int *targets, int B, int T);
// the auxiliary losses of the last forward (MoE load balancing, summed over layers; 0 without MoE layers): the
// training objective is the mean loss plus this, and the backward differentiates both
static double model_aux_loss(const Model *model);
static void model_zero_grad(Model *model);
// backward of the last forward (which must have had targets); parameter gradients accumulate (+=), scaled so that
// the loss being differentiated is loss_scale · mean loss
static void model_backward(Model *model, float loss_scale);
// the parallel layout (comm.h) the model runs in: data-parallel ranks average their gradients and update their shards
// (ZeRO-1); called once after model_create, before the first step (without it: one process)
static void model_set_parallel(Model *model, const Comm *comm);
// the next model_backward is the last before model_grad_norm: its gradients may be reduced across the replicas as its
// layers finish (the GPU overlaps the reduce-scatter with the backward; the CPU reduces in model_grad_norm)
static void model_sync_next_backward(Model *model);
// the average milliseconds a step the gradient reduction ran on after the backward ended; -1 when not measured
static double model_comm_exposed_ms(const Model *model);
// the global L2 norm of the gradients (fixed summation order: the same bits every run); data-parallel, it averages the
// replicas' gradients first (every rank must call it, once a step, before model_update)
static double model_grad_norm(Model *model);
// one AdamW step (step counts from 1), the gradients scaled by min(1, grad_clip / grad_norm)
static void model_update(Model *model, const OptimizerConfig *opt, int step, double grad_norm);

// the state in checkpoints: parameters and AdamW m, v (each num_parameters × executor_master_bytes()) to and from
// host memory; m, v NULL on write: a fresh optimizer
static int model_has_optimizer(const Model *model);
static void model_read_state(const Model *model, void *params, void *m, void *v);
static void model_write_state(Model *model, const void *params, const void *m, const void *v);
// the padded logits (Vp) of position (b, t) of the last forward, to host memory
static void model_logits_row(Model *model, int b, int t, float *out);

// decoding with each layer's decode state (layers.h): begin allocates the state of B sequences of up to `context`
// tokens and empties it. advance feeds sequences b0 .. b0+nb−1 T tokens each (tokens (nb, T), host), starting at
// positions pos (nb, host; each the sequence's current length, pos + T ≤ context): a prompt's prefill (in chunks,
// through the training forward's ops from the state) or, with T = 1, one step; it leaves each sequence's next-token
// logits, read by model_decode_logits (Vp floats). step advances all B sequences by one token; it may return before
// the executor has run the step (tokens and pos are copied first), and what reads its results (the logits, the
// state's io, the next advance) comes after it. A prefill in chunks equals one whole prefill (on the CPU bit for bit).
// The state of one sequence moves to and from host memory (model_decode_state_size bytes; the same context) to save a
// prompt's state and resume from it later.
static void model_decode_begin(Model *model, int B, int context);
static void model_decode_advance(Model *model, int b0, int nb, const int *tokens, int T, const int *pos);
static void model_decode_step(Model *model, const int *tokens, const int *pos);
static void model_decode_logits(Model *model, int b, float *out);
// the generation loop where the logits are (the GPU): the tokens stay on the executor, which draws each step's next
// tokens and feeds them to the next step itself; B ints reach the host an iteration. The draws are infer.h's
// sample_token's (the repetition penalty on the ids each sequence has seen: begin's seen[b] (n_seen[b] tokens, host),
// then each token drawn): greedy (temperature 0: the largest of the V real logits, the lowest id among equals); top-k
// (0 < top_k < V, up to 1024) with or without top-p (the same candidates, and their sums in the same order);
// softmax(logits / temperature) over the V ids (no top-k, top_p 1), its sums in another order. A draw within rounding
// of a boundary may take the neighbouring id (the sums' order; the last bit of exp). u[b] ∈ (0, 1] is sequence b's draw.
// begin: pos (B, host) each sequence's last position (its length − 1), from which the draws' tokens follow; returns 0
// where the executor does not (the CPU; top-p without top-k; top-k above 1024): the caller samples
// model_decode_logits' rows. launch queues one iteration: the next tokens drawn from the current logits (u (B, host;
// copied before it returns) unless greedy), each sequence's position advanced by one (at most to context − 1), and with
// step the step of all B on them. wait: the oldest queued iteration's tokens (B, host). At most two iterations are
// queued, so the host's work on one runs under the executor's on the next.
static int model_decode_gen_begin(Model *model, const int *pos, float temperature, int top_k, float top_p,
                                  float rep_penalty, const int *const *seen, const int *n_seen);
static void model_decode_gen_launch(Model *model, const double *u, int step);
static void model_decode_gen_wait(Model *model, int *tokens);
static size_t model_decode_state_size(const Model *model);
static void model_decode_state_io(Model *model, int b, void *buf, int save); // save = 1: state → buf; 0: buf → state

// ----------------------------------------------------------------------------------------------------------------
// tensor parallelism, what every executor does the same way around its own buffers (host side)

// a TP rank's layers: its local config lc (model.h's model_config_tp_local) and parameter table lt, or the job ends
// with why this model cannot be split over comm->tp ranks
static void tp_local_layout(ModelConfig *lc, ParamTable *lt, const ModelConfig *full, const Comm *comm) {
    const char *why = model_config_tp_local(full, lc, comm->tp, comm->tp_rank);
    if (why != NULL) {
        fail_with_hint("use a TP size (-tp) that divides the heads of every layer kind, or -tp 1",
                       "tensor parallelism -tp %d: %s", comm->tp, why);
    }
    param_table_build(lt, lc);
}

// The ranges (offset, count pairs, in buffer order) of a TP rank's local buffer (table lt; ft the whole model's):
// sum, the gradients each rank computes only in part (model.h's tp_partial_rows: tensors every rank holds whole but
// computes from its own heads: M²RNN's shared q/k, GDN's norm weight), summed over the group once a step; once, those
// plus the replicated tensors outside the kinds (the residual stream's norms), which every rank holds whole: only TP
// rank 0 counts them in the gradient norm.
typedef struct {
    size_t *sum, *once;
    int num_sum, num_once;
} TPRanges;

static void tp_ranges_build(TPRanges *r, const ParamTable *ft, const ParamTable *lt, int tp) {
    r->sum = (size_t *)mallocCheck((size_t)lt->num_specs * MAX_SEGMENTS * 2 * sizeof(size_t));
    r->once = (size_t *)mallocCheck((size_t)lt->num_specs * MAX_SEGMENTS * 2 * sizeof(size_t));
    int ns = 0, no = 0;
    for (int i = 0; i < lt->num_specs; i++) {
        const ParamSpec *s = &lt->specs[i];
        const size_t row_len = s->shape[0] > 0 ? s->numel / s->shape[0] : 0;
        if (s->kind == 0) {
            if (s->split == SPLIT_REPLICATED) { r->once[2 * no] = s->offset; r->once[2 * no++ + 1] = s->numel; }
            continue;
        }
        const ParamDef d = param_table_def(&ft->specs[i]), dl = param_table_def(s);
        size_t r0[MAX_SEGMENTS], r1[MAX_SEGMENTS];
        const int n = tp_partial_rows(&d, &dl, tp, r0, r1);
        for (int j = 0; j < n; j++) {
            r->sum[2 * ns] = r->once[2 * no] = s->offset + r0[j] * row_len;
            r->sum[2 * ns++ + 1] = r->once[2 * no++ + 1] = (r1[j] - r0[j]) * row_len;
        }
    }
    r->num_sum = ns;
    r->num_once = no;
}
static void tp_ranges_free(TPRanges *r) { free(r->sum); free(r->once); r->sum = r->once = NULL; }

// the pieces of [a, b) a rank counts in the gradient norm: all of it on TP rank 0; on the others [a, b) less the once
// ranges. Writes up to num_once + 1 (begin, end) pairs to out; returns how many.
static int tp_counted_pieces(size_t *out, const TPRanges *r, int tp_rank, size_t a, size_t b) {
    if (tp_rank == 0) { out[0] = a; out[1] = b; return a < b; }
    int n = 0;
    size_t at = a;
    for (int i = 0; i <= r->num_once && at < b; i++) { // (the ranges are in buffer order)
        const size_t r0 = i < r->num_once ? r->once[2 * i] : b, r1 = i < r->num_once ? r0 + r->once[2 * i + 1] : b;
        const size_t g1 = r0 < b ? r0 : b;
        if (g1 > at) { out[2 * n] = at; out[2 * n + 1] = g1; n++; }
        if (r1 > at) { at = r1; }
    }
    return n;
}

// a TP group's local buffers (each nl numbers of elem bytes, table lt) → the whole model's layout (table ft) on every
// rank: all-gathered over the group (collective), each put in its place
static void tp_gather_full(const Comm *comm, void *full, const ParamTable *ft, const void *local, const ParamTable *lt,
                           size_t elem) {
    const int tp = comm->tp;
    const size_t nl = lt->num_parameters;
    memset(full, 0, ft->num_parameters * elem); // (the alignment gaps between tensors)
    char *all = (char *)mallocCheck((size_t)tp * nl * elem);
    comm_tp_allgather(comm, all, local, nl, elem);
    for (int r = 0; r < tp; r++) { // (the ranks' local tables differ only in their vocabulary's padding rows)
        model_tp_shard(full, ft, all + (size_t)r * nl * elem, lt, elem, r, tp, 1);
    }
    free(all);
}

// the executor
static const char *executor_name(void);      // for banners and usage
static int executor_master_bytes(void);
static double executor_peak_flops(Model *model); // dense peak in the build's precision for MFU; 0 = unknown
static void executor_sync(Model *model);      // before reading a timer

#endif // M2RNN_EXECUTOR_H
