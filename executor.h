/*
executor.h: the API every executor of the model implements (the CPU reference in ref/lm.h, the GPU in lm.cuh) and the
programs call: the training run (train_loop.h), the tests, the benchmarks. A program includes one executor and this
file's users; nothing here knows which executor it gets. Model is the executor's own struct.

Numbers in checkpoints (the master weights and the AdamW moments) have executor_master_bytes() bytes each.
*/
#ifndef M2RNN_EXECUTOR_H
#define M2RNN_EXECUTOR_H

#include <stdint.h>

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
// logits, read by model_decode_logits (Vp floats). step advances all B sequences by one token. A prefill in chunks
// equals one whole prefill (on the CPU bit for bit). The state of one sequence moves to and from host memory
// (model_decode_state_size bytes; the same context) to save a prompt's state and resume from it later.
static void model_decode_begin(Model *model, int B, int context);
static void model_decode_advance(Model *model, int b0, int nb, const int *tokens, int T, const int *pos);
static void model_decode_step(Model *model, const int *tokens, const int *pos);
static void model_decode_logits(Model *model, int b, float *out);
static size_t model_decode_state_size(const Model *model);
static void model_decode_state_io(Model *model, int b, void *buf, int save); // save = 1: state → buf; 0: buf → state

// the executor
static const char *executor_name(void);      // for banners and usage
static int executor_master_bytes(void);
static double executor_peak_flops(Model *model); // dense peak in the build's precision for MFU; 0 = unknown
static void executor_sync(Model *model);      // before reading a timer

#endif // M2RNN_EXECUTOR_H
