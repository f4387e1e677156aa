/*
train_loop.h: the training run every executor shares: options and their CLI, the learning-rate schedule,
validation, text samples, checkpoint save and exact resume, logging, and the step loop. It calls the model only
through executor.h's API, which the CPU reference (ref/lm.h, in train_m2rnn.c) and the GPU executor (lm.cuh, in
train_m2rnn.cu) implement, so the two programs cannot drift apart in anything but how an op runs.

What a run promises (a user can trust it):
- an output directory is never mixed up: a new run refuses a directory holding another run's checkpoints unless told
  to resume it (-y 1) or to overwrite it (-ow 1); -y 1 refuses a directory without checkpoints (-y 2 starts fresh
  there) and a model flag that contradicts the checkpoint; it resumes from the newest checkpoint that validates and
  names any it skipped; pruning never deletes the checkpoint just written;
- with -o the run ends with a checkpoint, the final model's validation loss, a weights-only export
  (model.safetensors + config.json) and a summary; every save is announced;
- SIGINT / SIGTERM finish the step, save and exit 0 (a second signal aborts at once); the temporary file of a killed
  checkpoint write is removed at the next start;
- a NaN/Inf loss or gradient norm (and, with -zl / -zg, an outlier by z-score over the last 128 steps) skips the
  update and says so; after -zk consecutive skips the run stops with a checkpoint of the last good state;
- main.log starts each run and resume with a header line (command, commit, model, step, tokens per step), which
  dev/plot_logs.py reads.
Test hooks (environment): M2RNN_TEST_NAN_STEPS=a-b makes the backward of steps a..b produce NaN gradients;
M2RNN_TEST_SLOW_SAVE=ms sleeps in the middle of each checkpoint write (for the kill-during-save test).
*/
#ifndef M2RNN_TRAIN_LOOP_H
#define M2RNN_TRAIN_LOOP_H

#include <math.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "dataloader.h"
#include "executor.h"
#include "export.h"
#include "model.h"
#include "tokenizer.h"
#include "utils.h"

#ifndef M2RNN_COMMIT
#define M2RNN_COMMIT "unknown" // the Makefile passes the git commit the binary was built from
#endif

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
// the options

typedef struct {
    const char *train_pattern, *val_pattern; // shard globs
    const char *init;      // model descriptor ("d256:l4:MMAM") or a checkpoint file (*.bin)
    const char *out_dir;   // logs and checkpoints; NULL = none
    int vocab_size;        // of a model built from a descriptor (a checkpoint carries its own)
    int use_rope;          // RoPE in the attention layers of a model built from a descriptor (0 = NoPE)
    int B, T;              // micro-batch
    int total_batch;       // tokens per optimizer step; a multiple of B·T (gradient accumulation)
    int max_steps;
    float lr, final_lr_frac, weight_decay, grad_clip, rnn_clamp;
    int warmup;
    int val_every, val_batches;
    int ckpt_every, ckpt_keep, ckpt_major;
    int resume;            // 0: a new run; 1: resume the run in out_dir; 2: resume it if it has checkpoints, else new
    int overwrite;         // 1: a new run may delete the checkpoints and log of another run in out_dir
    int export_final;      // 1: write model.safetensors + config.json into out_dir at the end
    float z_loss, z_norm;  // skip the update when the loss / grad norm z-score exceeds this (0 = only NaN/Inf)
    int max_skips;         // consecutive skipped updates that stop the run
    int overfit;           // 1: train on the first batch only
    int threads;
    int sample_every, sample_tokens; // generated text every N steps (0 = never), tokens per sample
    const char *tokenizer_path;
    uint64_t seed;
    int quiet;             // 1: no per-step lines (tests)
    float *loss_trace;     // if not NULL: (max_steps) the train loss of each step (tests)
    char cmdline[1024];    // for main.log's header
    int given_model;       // bits: which model flags the command line gave (-e, -vs, -ro, -rc): checked on resume
    int tp;                // -tp: tensor-parallel group size (comm.h)
    const Comm *comm;      // the process layout (main sets it; NULL: one process)
} TrainOptions;

enum { GIVEN_INIT = 1, GIVEN_VOCAB = 2, GIVEN_ROPE = 4, GIVEN_CLAMP = 8 };

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
    o.ckpt_every = 0; o.ckpt_keep = 0; o.ckpt_major = 0; o.resume = 0; o.overwrite = 0; o.export_final = 1;
    o.z_loss = 0; o.z_norm = 0; o.max_skips = 5;
    o.sample_every = 0; o.sample_tokens = 64; o.tokenizer_path = "dev/data/gpt2_tokenizer.bin";
    o.seed = 1337;
    o.tp = 1;
    return o;
}

// ----------------------------------------------------------------------------------------------------------------
// small helpers

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int train_rank = 0; // this process's rank: only rank 0 writes files and prints
static inline int train_dp(const TrainOptions *o) { return o->comm != NULL ? o->comm->dp : 1; }
static void log_line(const char *out_dir, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_line(const char *out_dir, const char *fmt, ...) {
    if (train_rank != 0) { return; } // one log for the job
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

// the test hook M2RNN_TEST_NAN_STEPS=a-b (or =a): whether step (1-based) is in it
static int test_nan_step(int step) {
    const char *env = getenv("M2RNN_TEST_NAN_STEPS");
    int a = 0, b = 0;
    if (env == NULL) { return 0; }
    const int n = sscanf(env, "%d-%d", &a, &b);
    return n >= 1 && step >= a && step <= (n == 2 ? b : a);
}

// ----------------------------------------------------------------------------------------------------------------
// SIGINT / SIGTERM: the first asks the loop to finish its step and save; the second ends the process at once

static volatile sig_atomic_t train_stop_requested = 0;

static void train_on_signal(int sig) {
    if (train_stop_requested) { _exit(128 + sig); }
    train_stop_requested = sig;
    static const char msg[] = "\nstopping: the step finishes, then a checkpoint is saved (signal again to abort)\n";
    ssize_t unused = write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)unused;
}

// ----------------------------------------------------------------------------------------------------------------
// the guard against bad steps: a rolling window of the last values, z-score of a new one against them

#define GUARD_WINDOW 128
typedef struct {
    double values[GUARD_WINDOW];
    int count, next;
} OutlierWindow;

// (x − mean) / std over the window; 0 until it holds 16 values
static double outlier_zscore(const OutlierWindow *w, double x) {
    if (w->count < 16) { return 0.0; }
    double mean = 0.0, var = 0.0;
    for (int i = 0; i < w->count; i++) { mean += w->values[i]; }
    mean /= w->count;
    for (int i = 0; i < w->count; i++) { var += (w->values[i] - mean) * (w->values[i] - mean); }
    const double sd = sqrt(var / w->count);
    return sd > 0 ? (x - mean) / sd : 0.0;
}
static void outlier_push(OutlierWindow *w, double x) {
    w->values[w->next] = x;
    w->next = (w->next + 1) % GUARD_WINDOW;
    if (w->count < GUARD_WINDOW) { w->count++; }
}

// ----------------------------------------------------------------------------------------------------------------
// checkpoints, validation, samples

static void save_checkpoint(const TrainOptions *o, const Model *model, int step, int grad_accum, uint64_t rng_state,
                            const DataLoader *loader) {
    const size_t n = model_table(model)->num_parameters, bytes = n * (size_t)executor_master_bytes();
    const int has_optimizer = model_has_optimizer(model);
    void *params = mallocCheck(bytes);
    void *m = has_optimizer ? mallocCheck(bytes) : NULL;
    void *v = has_optimizer ? mallocCheck(bytes) : NULL;
    model_read_state(model, params, m, v); // (data-parallel: every rank takes part, all-gathering the AdamW shards)
    if (train_rank != 0) { // rank 0 writes; the others wait until the file is complete
        free(params); free(m); free(v);
        comm_barrier(o->comm);
        return;
    }
    CheckpointHeader h;
    memset(&h, 0, sizeof(h));
    h.config = *model_config(model);
    h.elem_bytes = executor_master_bytes();
    h.has_optimizer = has_optimizer;
    h.num_parameters = n;
    h.step = step; h.B = o->B * train_dp(o); h.T = o->T; h.grad_accum = grad_accum; // B: rows a step, every replica's
    h.rng_state = rng_state;
    DataLoaderState state;
    memset(&state, 0, sizeof(state));
    if (loader != NULL) { dataloader_get_state(loader, &state); }
    h.loader_state_bytes = loader != NULL ? (uint32_t)sizeof(state) : 0;
    char path[4096];
    checkpoint_path(path, sizeof(path), o->out_dir, step);
    checkpoint_write(path, &h, params, m, v, &state);
    checkpoint_prune(o->out_dir, o->ckpt_keep, o->ckpt_major, step);
    if (!o->quiet) {
        printf("saved %s (step %d, %.1f MB%s)\n", path, step, (double)(CKPT_HEADER_BYTES + checkpoint_payload_bytes(&h)) / 1e6,
               has_optimizer ? ", weights and AdamW state" : "");
    }
    log_line(o->out_dir, "# saved ckpt_%08d.bin\n", step);
    free(params); free(m); free(v);
    comm_barrier(o->comm);
}

// the weights of the model, fp32, into out_dir/model.safetensors and config.json (rank 0)
static void export_final(const TrainOptions *o, const Model *model) {
    if (train_rank != 0) { return; }
    const size_t n = model_table(model)->num_parameters;
    void *params = mallocCheck(n * (size_t)executor_master_bytes());
    model_read_state(model, params, NULL, NULL);
    float *f32 = (float *)params;
    if (executor_master_bytes() == 8) { // the float64 test build
        f32 = (float *)mallocCheck(n * sizeof(float));
        for (size_t i = 0; i < n; i++) { f32[i] = (float)((const double *)params)[i]; }
    }
    const size_t bytes = export_model(o->out_dir, model_config(model), model_table(model), f32, 0);
    if (!o->quiet) { printf("saved %s/model.safetensors (%.1f MB, weights only) and config.json\n", o->out_dir, bytes / 1e6); }
    if (f32 != params) { free(f32); }
    free(params);
}

// the mean over the replicas of their own rows' validation loss
static float validation_loss(Model *model, DataLoader *val, int max_batches, const Comm *comm) {
    dataloader_reset(val);
    int batches = (int)dataloader_num_batches(val);
    if (max_batches > 0 && batches > max_batches) { batches = max_batches; }
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(val);
        sum += model_forward(model, val->inputs, val->targets, (int)val->B, (int)val->T);
    }
    return (float)(comm_dp_sum(comm, sum / (batches > 0 ? batches : 1)) / comm->dp);
}

// Generates n tokens from an EOT by recurrent decoding (each layer's single-token step with its state: constant work
// a token for the recurrent layers, a growing KV cache for attention) and prints them through the tokenizer.
static void print_sample(Model *model, const Tokenizer *tok, int n, uint64_t *rng_state) {
    const ModelConfig *c = model_config(model);
    const int V = c->vocab_size, Vp = c->padded_vocab_size;
    float *logits = (float *)mallocCheck((size_t)Vp * sizeof(float));
    int token = tokenizer_eot(tok) < V ? tokenizer_eot(tok) : 0;
    Rng rng = {*rng_state};
    model_decode_begin(model, 1, n);
    printf("---\n");
    for (int t = 0; t < n; t++) {
        model_decode_step(model, &token, &t);
        model_decode_logits(model, 0, logits);
        float maxv = logits[0];
        for (int i = 1; i < V; i++) { maxv = logits[i] > maxv ? logits[i] : maxv; }
        double sum = 0.0;
        for (int i = 0; i < V; i++) { sum += exp((double)(logits[i] - maxv)); }
        double r = rng_uniform(&rng) * sum, acc = 0.0;
        int next = V - 1;
        for (int i = 0; i < V; i++) {
            acc += exp((double)(logits[i] - maxv));
            if (acc >= r) { next = i; break; }
        }
        token = next;
        size_t len = 0;
        const uint8_t *bytes = tokenizer_decode(tok, next, &len);
        if (bytes != NULL) { fwrite(bytes, 1, len, stdout); }
    }
    printf("\n---\n");
    fflush(stdout);
    *rng_state = rng.state;
    free(logits);
}

// the sizes of one kind of the model, "n=16 q=1 k=64 v=16 ..." from its row's fields
static void describe_kind(char *out, size_t n, const ModelConfig *c, const LayerKind *k) {
    out[0] = '\0';
    for (int i = 0; i < k->num_fields; i++) {
        const ConfigField *f = &k->fields[i];
        const char *name = strchr(f->name, '.') ? strchr(f->name, '.') + 1 : f->name;
        const void *p = (const char *)c + f->offset;
        if (f->type == FIELD_FLOAT) { snprintf(out + strlen(out), n - strlen(out), "%s%s=%g", i ? " " : "", name, *(const float *)p); }
        else { snprintf(out + strlen(out), n - strlen(out), "%s%s=%d", i ? " " : "", name, *(const int *)p); }
    }
}

// "d256:l4:MMAM" and, when not all SwiGLU, ":ffn=..."
static void describe_model(char *out, size_t n, const ModelConfig *c) {
    snprintf(out, n, "d%d:l%d:%s%s%s", c->d_model, c->n_layer, c->pattern, c->ffn_pattern[0] ? ":ffn=" : "",
             c->ffn_pattern);
}

// ----------------------------------------------------------------------------------------------------------------
// where a run starts: the output directory's state, the checkpoint to resume

// A resume must not silently change the model: every model flag the command line gave is compared with the
// checkpoint's config, and the first difference is refused by name.
static void check_resume_flags(const TrainOptions *o, const ModelConfig *ckpt_config, const char *ckpt_path) {
    if (o->given_model == 0) { return; }
    if ((o->given_model & GIVEN_INIT) && ends_with(o->init, ".bin")) {
        fail_with_hint("pass either -e CKPT (start a new run from its weights) or -y 1 (resume the run in -o)",
                       "-e %s and -y 1 both say where the model comes from", o->init);
    }
    ModelConfig have = *ckpt_config, want = have; // the flags not given keep the checkpoint's values
    if (o->given_model & GIVEN_INIT) {
        memset(&want, 0, sizeof(want));
        want.vocab_size = have.vocab_size; want.attn.rope = have.attn.rope; want.m2rnn.grad_clamp = have.m2rnn.grad_clamp;
        model_config_from_descriptor(&want, o->init);
    }
    if (o->given_model & GIVEN_VOCAB) { want.vocab_size = o->vocab_size; }
    if (o->given_model & GIVEN_ROPE) { want.attn.rope = o->use_rope; }
    if (o->given_model & GIVEN_CLAMP) { want.m2rnn.grad_clamp = o->rnn_clamp; }
    model_config_fill_defaults(&want);
    model_config_fill_defaults(&have);
    const char *hint = "resume without model flags (the checkpoint has the model), or start a new run in another -o";
    if (strcmp(want.pattern, have.pattern) != 0 || strcmp(want.ffn_pattern, have.ffn_pattern) != 0) {
        fail_with_hint(hint, "the checkpoint %s has the layer pattern %s, the command line asks %s", ckpt_path,
                       have.pattern, want.pattern);
    }
    FieldEntry fields[MAX_CONFIG_FIELDS];
    const int nf = config_fields(fields);
    for (int i = 0; i < nf; i++) {
        const ConfigField *f = fields[i].field;
        const void *a = (const char *)&want + f->offset, *b = (const char *)&have + f->offset;
        if (memcmp(a, b, f->type == FIELD_FLOAT ? sizeof(float) : sizeof(int)) != 0) {
            char wa[32], ha[32];
            if (f->type == FIELD_FLOAT) {
                snprintf(wa, 32, "%g", *(const float *)a);
                snprintf(ha, 32, "%g", *(const float *)b);
            } else {
                snprintf(wa, 32, "%d", *(const int *)a);
                snprintf(ha, 32, "%d", *(const int *)b);
            }
            fail_with_hint(hint, "the checkpoint %s has %s=%s, the command line asks %s", ckpt_path, f->name, ha, wa);
        }
    }
}

// Prepares the output directory for a new run or a resume (refusing a mix-up) and removes the temporary files of a
// killed checkpoint write. Returns the steps of its checkpoints, newest first, in steps (their count).
static int prepare_out_dir(const TrainOptions *o, int *steps, int max) {
    if (o->out_dir == NULL) {
        if (o->resume) { fail_with_hint("pass -o DIR together with -y", "resume (-y %d) needs an output directory", o->resume); }
        return 0;
    }
    struct stat st;
    const int exists = stat(o->out_dir, &st) == 0;
    if (!exists && o->resume == 1) {
        fail_with_hint("check -o, or pass -y 2 to resume if the run exists and start it otherwise",
                       "-y 1: there is no directory '%s' to resume from", o->out_dir);
    }
    create_dir_if_not_exists(o->out_dir);
    checkpoint_remove_stale(o->out_dir, o->quiet);
    int count = checkpoint_list(o->out_dir, steps, max);
    if (o->resume == 1 && count == 0) {
        fail_with_hint("check -o, or pass -y 2 to resume if the run has a checkpoint and start it otherwise",
                       "-y 1: '%s' holds no checkpoint to resume from", o->out_dir);
    }
    if (o->resume == 0 && count > 0) {
        if (!o->overwrite) {
            fail_with_hint("resume that run with -y 1, overwrite it with -ow 1 (its checkpoints are deleted), or pass "
                           "another -o", "'%s' holds checkpoints of another run (ckpt_%08d.bin and %d more)",
                           o->out_dir, steps[0], count - 1);
        }
        char path[4096];
        for (int i = 0; i < count; i++) {
            checkpoint_path(path, sizeof(path), o->out_dir, steps[i]);
            remove(path);
        }
        snprintf(path, sizeof(path), "%s/main.log", o->out_dir);
        remove(path);
        if (!o->quiet) { printf("-ow 1: deleted the %d checkpoints and the log of the earlier run in %s\n", count, o->out_dir); }
        count = 0;
    }
    return o->resume ? count : 0;
}

// ----------------------------------------------------------------------------------------------------------------
// the run

// Runs training as the options say. Returns the last step's train loss.
float train_run(const TrainOptions *opts) {
    // the process layout: one process unless main set up a parallel one (comm.h); only rank 0 prints and writes
    static Comm single;
    TrainOptions local = *opts;
    if (local.comm == NULL) {
        memset(&single, 0, sizeof(single));
        single.world = single.tp = single.dp = 1;
        local.comm = &single;
    }
    const TrainOptions *o = &local;
    const Comm *cm = o->comm;
    train_rank = cm->rank;
    if (cm->rank != 0) { local.quiet = 1; }
#ifdef _OPENMP
    if (o->threads > 0) { omp_set_num_threads(o->threads); }
#endif
    setvbuf(stdout, NULL, _IOLBF, 0); // progress lines appear as they are written, through a pipe too
    const int tokens_per_micro = o->B * o->T * cm->dp; // every replica's micro-batch
    const int total_batch = o->total_batch > 0 ? o->total_batch : tokens_per_micro;
    if (total_batch % tokens_per_micro != 0) {
        fail_with_hint("make -d a multiple of -b times -t times the data-parallel processes",
                       "total batch %d tokens is not a multiple of B*T*replicas = %d*%d*%d = %d", total_batch, o->B,
                       o->T, cm->dp, tokens_per_micro);
    }
    const int grad_accum = total_batch / tokens_per_micro;
    int steps_in_dir[4096];
    int candidates = 0;
    if (cm->rank == 0) { // rank 0 prepares the directory (and may delete an old run with -ow 1); the others then look
        candidates = prepare_out_dir(o, steps_in_dir, 4096);
        comm_barrier(cm);
    } else {
        comm_barrier(cm);
        candidates = prepare_out_dir(o, steps_in_dir, 4096);
    }

    // where the model comes from: the newest valid checkpoint of the run to resume, a checkpoint file, or a descriptor
    char ckpt_path[4096] = {0};
    CheckpointHeader ckpt;
    memset(&ckpt, 0, sizeof(ckpt));
    ModelConfig config;
    memset(&config, 0, sizeof(config));
    int first_candidate = 0, skipped = 0;
    CkptError err;
    if (o->resume && candidates > 0) {
        for (; first_candidate < candidates; first_candidate++) { // the newest whose header reads
            checkpoint_path(ckpt_path, sizeof(ckpt_path), o->out_dir, steps_in_dir[first_candidate]);
            if (checkpoint_try_read_header(ckpt_path, &ckpt, &err)) { break; }
            printf("warning: skipping %s: %s\n", ckpt_path, err.why);
            skipped++;
        }
        if (first_candidate == candidates) {
            fail_with_hint("the run's checkpoints are all damaged; start a new run (-ow 1) or restore a backup",
                           "no checkpoint in '%s' validates (%d skipped)", o->out_dir, skipped);
        }
        check_resume_flags(o, &ckpt.config, ckpt_path);
    } else if (o->resume == 2 && !o->quiet) {
        printf("-y 2: no checkpoint in %s, starting a new run\n", o->out_dir);
    }
    const int resuming = o->resume && candidates > 0;
    if (!resuming && ends_with(o->init, ".bin")) {
        snprintf(ckpt_path, sizeof(ckpt_path), "%s", o->init);
        checkpoint_read_header(ckpt_path, &ckpt);
    }
    if (ckpt_path[0] != '\0') {
        if (ckpt.elem_bytes != executor_master_bytes()) {
            fail_with_hint("use a checkpoint written by a build with the same precision",
                           "checkpoint '%s' holds %d-byte numbers, this build uses %d", ckpt_path, ckpt.elem_bytes,
                           executor_master_bytes());
        }
        config = ckpt.config;
    } else {
        config.m2rnn.grad_clamp = o->rnn_clamp;
        config.vocab_size = o->vocab_size;
        config.attn.rope = o->use_rope;
        model_config_from_descriptor(&config, o->init);
    }
    if (resuming && (ckpt.B != o->B * cm->dp || ckpt.T != o->T || ckpt.grad_accum != grad_accum)) {
        fail_with_hint("resume with the rows a step (-b times the data-parallel processes), -t and -d the run was "
                       "started with",
                       "checkpoint '%s' was trained with %d rows a micro-step, T=%d, accumulation %d; this run asks "
                       "%d x %d rows, T=%d, accumulation %d", ckpt_path, ckpt.B, ckpt.T, ckpt.grad_accum, cm->dp,
                       o->B, o->T, grad_accum);
    }
    if (!o->quiet) { printf("building the model on %s\n", executor_name()); }
    Model *model = model_create(&config);
    model_set_parallel(model, cm);
    const ParamTable *table = model_table(model);
    if (ckpt_path[0] != '\0' && table->num_parameters != ckpt.num_parameters) {
        fail_with_hint("the checkpoint is damaged or from another m2rnn version",
                       "checkpoint '%s' holds %llu parameters, its config implies %zu", ckpt_path,
                       (unsigned long long)ckpt.num_parameters, table->num_parameters);
    }

    DataLoader train_loader, val_loader;
    dataloader_init(&train_loader, o->train_pattern, (size_t)o->B, (size_t)o->T, cm->dp_rank, cm->dp, 1, o->seed,
                    model_config(model)->vocab_size);
    const int have_val = o->val_pattern != NULL && o->val_pattern[0] != '\0' && o->val_every > 0;
    if (have_val) {
        dataloader_init(&val_loader, o->val_pattern, (size_t)o->B, (size_t)o->T, cm->dp_rank, cm->dp, 0, o->seed,
                        model_config(model)->vocab_size);
    }

    int start_step = 0;
    uint64_t rng_state = o->seed;
    if (ckpt_path[0] != '\0') {
        DataLoaderState loader_state;
        if (resuming && ckpt.loader_state_bytes != sizeof(DataLoaderState)) {
            fail_with_hint("resume from a checkpoint written by this version of train_m2rnn",
                           "checkpoint '%s' has a %u-byte dataloader state, this build's is %zu", ckpt_path,
                           ckpt.loader_state_bytes, sizeof(DataLoaderState));
        }
        const size_t bytes = table->num_parameters * (size_t)executor_master_bytes();
        void *params = mallocCheck(bytes);
        void *m = resuming ? mallocCheck(bytes) : NULL;
        void *v = resuming ? mallocCheck(bytes) : NULL;
        if (resuming) { // the newest checkpoint whose payload also checks out
            for (int i = first_candidate; i < candidates; i++) {
                if (i > first_candidate) {
                    checkpoint_path(ckpt_path, sizeof(ckpt_path), o->out_dir, steps_in_dir[i]);
                    CheckpointHeader h;
                    if (!checkpoint_try_read_header(ckpt_path, &h, &err)) {
                        printf("warning: skipping %s: %s\n", ckpt_path, err.why);
                        skipped++;
                        continue;
                    }
                    if (h.num_parameters != ckpt.num_parameters || h.elem_bytes != ckpt.elem_bytes ||
                        h.B != ckpt.B || h.T != ckpt.T || h.grad_accum != ckpt.grad_accum ||
                        memcmp(&h.config, &ckpt.config, sizeof(ModelConfig)) != 0) {
                        printf("warning: skipping %s: another model or training shape than the newest\n", ckpt_path);
                        skipped++;
                        continue;
                    }
                    ckpt = h;
                }
                if (checkpoint_try_read_payload(ckpt_path, &ckpt, params, ckpt.has_optimizer ? m : NULL,
                                                ckpt.has_optimizer ? v : NULL, &loader_state, &err)) {
                    break;
                }
                printf("warning: skipping %s: %s\n", ckpt_path, err.why);
                skipped++;
                ckpt_path[0] = '\0';
            }
            if (ckpt_path[0] == '\0') {
                fail_with_hint("the run's checkpoints are all damaged; start a new run (-ow 1) or restore a backup",
                               "no checkpoint in '%s' validates (%d skipped)", o->out_dir, skipped);
            }
        } else {
            checkpoint_read_payload(ckpt_path, &ckpt, params, NULL, NULL, NULL);
        }
        model_write_state(model, params, resuming && ckpt.has_optimizer ? m : NULL, resuming && ckpt.has_optimizer ? v : NULL);
        free(params); free(m); free(v);
        if (resuming) {
            dataloader_set_state(&train_loader, &loader_state);
            start_step = ckpt.step;
            rng_state = ckpt.rng_state;
        }
    } else {
        model_init_weights(model, o->seed);
    }

    const ModelConfig *c = model_config(model);
    char model_desc[300];
    describe_model(model_desc, sizeof(model_desc), c);
    if (!o->quiet) {
        printf("+-----------------------+----------------------------------------------------+\n");
        printf("| model                 | %s\n", model_desc);
        printf("| parameters            | %zu\n", param_table_count(table));
        for (int k = 0; k < NUM_MIXER_KINDS + NUM_FFN_KINDS; k++) { // the sizes of every kind the model has
            const LayerKind *kind = k < NUM_MIXER_KINDS ? &MIXER_KINDS[k] : &FFN_KINDS[k - NUM_MIXER_KINDS];
            int count = 0;
            for (int l = 0; l < c->n_layer; l++) {
                count += k < NUM_MIXER_KINDS ? c->pattern[l] == kind->letter : model_ffn_letter(c, l) == kind->letter;
            }
            if (count == 0) { continue; }
            char sizes[256];
            describe_kind(sizes, sizeof(sizes), c, kind);
            printf("| %-10s x%-3d       | %s\n", kind->name, count, sizes);
        }
        printf("| vocab                 | %d (padded %d)\n", c->vocab_size, c->padded_vocab_size);
        printf("| B, T, accumulation    | %d, %d, %d (%d tokens per step)\n", o->B, o->T, grad_accum, total_batch);
        if (cm->world > 1) {
            printf("| processes             | %d: %d data-parallel replicas (B rows each) x %d tensor-parallel\n",
                   cm->world, cm->dp, cm->tp);
        }
        printf("| train tokens          | %zu (%s)\n", train_loader.num_tokens, o->train_pattern);
        if (have_val) { printf("| val tokens            | %zu (%s)\n", val_loader.num_tokens, o->val_pattern); }
        printf("| steps, lr, warmup     | %d, %g, %d (cosine to %g x)\n", o->max_steps, o->lr, o->warmup,
               o->final_lr_frac);
#ifdef _OPENMP
        printf("| OpenMP threads        | %d\n", omp_get_max_threads());
#endif
        printf("| output                | %s\n", o->out_dir != NULL ? o->out_dir : "none (no -o: nothing is saved)");
        printf("+-----------------------+----------------------------------------------------+\n");
        if (resuming) { printf("resumed from %s at step %d%s\n", ckpt_path, start_step, skipped ? " (newer ones skipped)" : ""); }
    }
    {
        time_t now = time(NULL);
        char when[64];
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        log_line(o->out_dir, "# %s %s | %s | commit %s | model %s | %zu parameters | step %d | tokens/step %d | %s\n",
                 resuming ? "resume" : "run", when, o->cmdline[0] ? o->cmdline : executor_name(), M2RNN_COMMIT,
                 model_desc, param_table_count(table), start_step, total_batch,
                 resuming ? ckpt_path : (ckpt_path[0] ? ckpt_path : "new weights"));
    }

    Tokenizer tokenizer;
    memset(&tokenizer, 0, sizeof(tokenizer));
    // (samples decode on rank 0 alone: not under tensor parallelism, whose layers need every rank of the group)
    const int have_tokenizer = cm->rank == 0 && cm->tp == 1 && o->sample_every > 0 &&
                               tokenizer_try_init(&tokenizer, o->tokenizer_path);
    if (o->sample_every > 0 && cm->tp > 1 && !o->quiet) {
        printf("no text samples under tensor parallelism (-tp %d): generate from the checkpoint with ./infer_m2rnn\n",
               cm->tp);
    } else if (o->sample_every > 0 && !have_tokenizer && !o->quiet) {
        printf("no text samples: no tokenizer at %s (run make data)\n", o->tokenizer_path);
    }
    OptimizerConfig opt = {o->lr, 0.9f, 0.95f, 1e-10f, o->weight_decay, o->grad_clip};
    const double peak_flops = executor_peak_flops(model) * cm->world; // every process's device
    const double flops_per_step = model_flops_per_token(c, o->T) * total_batch;
    double time_sum = 0.0, run_start = wall_seconds();
    int timed_steps = 0, skips_in_a_row = 0, skipped_total = 0, last_saved = resuming ? start_step : -1;
    float last_loss = -1, last_val = -1;
    OutlierWindow loss_window, norm_window;
    memset(&loss_window, 0, sizeof(loss_window));
    memset(&norm_window, 0, sizeof(norm_window));
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = train_on_signal;
    sigemptyset(&sa.sa_mask);
    train_stop_requested = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    if (o->overfit) { dataloader_next_batch(&train_loader); }
    int step = start_step;
    for (; step < o->max_steps && !comm_dp_max_int(cm, (int)train_stop_requested); step++) {
        if (have_val && step % o->val_every == 0) {
            if (step == start_step && !o->quiet) { printf("validating (%d batches) ...\n", o->val_batches); }
            last_val = validation_loss(model, &val_loader, o->val_batches, o->comm);
            if (!o->quiet) { printf("step %5d | val loss %.6f\n", step, last_val); }
            log_line(o->out_dir, "s:%d tel:%.6f\n", step, last_val);
        }
        if (have_tokenizer && step > start_step && step % o->sample_every == 0) {
            print_sample(model, &tokenizer, o->sample_tokens, &rng_state);
        }
        executor_sync(model);
        const double t0 = wall_seconds();
        model_zero_grad(model);
        double loss_sum = 0.0;
        double aux_sum = 0.0;
        for (int micro = 0; micro < grad_accum; micro++) {
            if (!o->overfit) { dataloader_next_batch(&train_loader); }
            loss_sum += model_forward(model, train_loader.inputs, train_loader.targets, o->B, o->T);
            aux_sum += model_aux_loss(model);
            if (micro == grad_accum - 1) { model_sync_next_backward(model); }
            model_backward(model, test_nan_step(step + 1) ? NAN : 1.0f / grad_accum);
        }
        const double norm = model_grad_norm(model); // (collective with replicas: it averages their gradients)
        last_loss = (float)(comm_dp_sum(cm, loss_sum / grad_accum) / cm->dp); // every rank decides on the same loss
        aux_sum = comm_dp_sum(cm, aux_sum) / cm->dp;
        // the guard: a non-finite loss or norm, or an outlier by z-score, skips the update
        const double zl = outlier_zscore(&loss_window, last_loss), zn = outlier_zscore(&norm_window, norm);
        const char *why = !isfinite(last_loss) ? "the loss is not finite" : !isfinite(norm) ? "the gradient norm is not finite"
                        : (o->z_loss > 0 && zl > o->z_loss) ? "the loss is an outlier"
                        : (o->z_norm > 0 && zn > o->z_norm) ? "the gradient norm is an outlier" : NULL;
        opt.lr = lr_at_step(step, o->max_steps, o->lr, o->warmup, o->final_lr_frac);
        if (why == NULL) {
            model_update(model, &opt, step + 1, norm);
            outlier_push(&loss_window, last_loss);
            outlier_push(&norm_window, norm);
            skips_in_a_row = 0;
        } else {
            skips_in_a_row++;
            skipped_total++;
            printf("step %5d/%d | update skipped: %s (loss %g, z %.1f; norm %g, z %.1f)\n", step + 1, o->max_steps, why,
                   last_loss, zl, norm, zn);
            log_line(o->out_dir, "s:%d skip:1 loss:%g norm:%g\n", step + 1, last_loss, norm);
        }
        executor_sync(model);
        const double dt = wall_seconds() - t0;
        if (o->loss_trace != NULL) { o->loss_trace[step] = last_loss; }
        if (step > start_step) { time_sum += dt; timed_steps++; } // the first step warms caches: not timed
        const double avg = timed_steps > 0 ? time_sum / timed_steps : dt;
        if (!o->quiet && why == NULL) {
            char speed[64];
            if (peak_flops > 0) { snprintf(speed, sizeof(speed), "%.1f%% MFU", 100.0 * flops_per_step / dt / peak_flops); }
            else { snprintf(speed, sizeof(speed), "%.1f GFLOP/s", flops_per_step / dt * 1e-9); }
            char aux[48] = "";
            if (aux_sum != 0.0) { snprintf(aux, sizeof(aux), " | aux %.5f", aux_sum / grad_accum); } // MoE balancing
            printf("step %5d/%d | loss %.6f%s | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s | %s | ETA %.1f min\n",
                   step + 1, o->max_steps, last_loss, aux, norm, opt.lr, 1000.0 * dt, total_batch / dt, speed,
                   avg * (o->max_steps - step - 1) / 60.0);
        }
        if (why == NULL && aux_sum != 0.0) {
            log_line(o->out_dir, "s:%d trl:%.6f aux:%.6f lr:%.6e norm:%.4f\n", step + 1, last_loss, aux_sum / grad_accum,
                     opt.lr, norm);
        } else if (why == NULL) {
            log_line(o->out_dir, "s:%d trl:%.6f lr:%.6e norm:%.4f\n", step + 1, last_loss, opt.lr, norm);
        }
        if (skips_in_a_row >= o->max_skips) {
            if (o->out_dir != NULL) { save_checkpoint(o, model, step + 1, grad_accum, rng_state, &train_loader); }
            fail_with_hint("lower the learning rate (-l), raise -zl/-zg, or check the data; the checkpoint holds the "
                           "last good weights", "%d updates in a row were skipped (the last at step %d: %s)",
                           skips_in_a_row, step + 1, why);
        }
        if (o->out_dir != NULL && o->ckpt_every > 0 && (step + 1) % o->ckpt_every == 0) {
            save_checkpoint(o, model, step + 1, grad_accum, rng_state, &train_loader);
            last_saved = step + 1;
        }
    }
    train_stop_requested = comm_dp_max_int(cm, (int)train_stop_requested); // a signal to one rank stops all
    if (train_stop_requested && !o->quiet) { printf("stopped by signal %d after step %d\n", (int)train_stop_requested, step); }
    // the end: the final model's validation loss, its checkpoint and its weights, and a summary
    if (have_val && step > start_step) {
        last_val = validation_loss(model, &val_loader, o->val_batches, o->comm);
        if (!o->quiet) { printf("step %5d | val loss %.6f (the final model)\n", step, last_val); }
        log_line(o->out_dir, "s:%d tel:%.6f\n", step, last_val);
    }
    if (o->out_dir != NULL && last_saved != step) { save_checkpoint(o, model, step, grad_accum, rng_state, &train_loader); }
    if (o->out_dir != NULL && o->export_final) { export_final(o, model); }
    if (!o->quiet) {
        const double elapsed = wall_seconds() - run_start;
        printf("done: steps %d to %d (%d updates skipped), %.0f tokens in %.1f s", start_step, step, skipped_total,
               (double)(step - start_step) * total_batch, elapsed);
        if (timed_steps > 0) { printf(", %.1f ms a step", 1000.0 * time_sum / timed_steps); }
        if (model_comm_exposed_ms(model) >= 0) {
            printf(" (%.2f ms of it the gradient reduce-scatter after the backward)", model_comm_exposed_ms(model));
        }
        printf("\nfinal train loss %.6f%s", last_loss, have_val && last_val >= 0 ? ", val loss " : "");
        if (have_val && last_val >= 0) { printf("%.6f", last_val); }
        printf("\n");
        if (o->out_dir != NULL) {
            printf("files: %s/main.log, %s/ckpt_%08d.bin%s\n", o->out_dir, o->out_dir, step,
                   o->export_final ? ", model.safetensors, config.json" : "");
        }
    }
    sigaction(SIGINT, &old_int, NULL); // (kept until the end: a second signal during the final save aborts at once)
    sigaction(SIGTERM, &old_term, NULL);
    if (have_tokenizer) { tokenizer_free(&tokenizer); }
    dataloader_free(&train_loader);
    if (have_val) { dataloader_free(&val_loader); }
    model_free(model);
    return last_loss;
}

// ----------------------------------------------------------------------------------------------------------------
// CLI

static void print_usage(void) {
    TrainOptions d = train_options_default();
    FILE *out = stdout;
    fprintf(out, "usage: %s [-flag value]...   (%s)\n", program_name, executor_name());
    fprintf(out, "  -i  train shards glob            (%s)\n", d.train_pattern);
    fprintf(out, "  -j  val shards glob, \"\" = none   (%s)\n", d.val_pattern);
    fprintf(out, "  -e  model descriptor or ckpt.bin (%s)\n", d.init);
    fprintf(out, "      descriptor fields: dNNN width, lNN layers, a pattern of mixer letters (%s),\n",
            mixer_letters_help());
    fprintf(out, "      ffn=X or one letter per layer (%s), and the kinds' sizes:\n", ffn_letters_help());
    {
        FieldEntry fields[MAX_CONFIG_FIELDS];
        const int nf = config_fields(fields);
        for (int i = 0; i < nf; i++) {
            const ConfigField *f = fields[i].field;
            if (f->key == NULL || fields[i].num_owners == 0) { continue; }
            fprintf(out, "        %s%s %s\n", f->key, f->type == FIELD_FLAG ? "" : "NN", f->help);
        }
    }
    fprintf(out, "  -vs vocabulary size of a model built from a descriptor (%d = GPT-2)\n", d.vocab_size);
    fprintf(out, "  -ro RoPE in attention, 1 = on (or `rope` in the descriptor); 0 = NoPE (%d)\n", d.use_rope);
    fprintf(out, "  -o  output dir for main.log, checkpoints and the final weights (none)\n");
    fprintf(out, "  -b  micro-batch size B           (%d)\n", d.B);
    fprintf(out, "  -t  sequence length T            (%d)\n", d.T);
    fprintf(out, "  -d  total batch in tokens, a multiple of B*T; 0 = B*T (%d)\n", d.total_batch);
    fprintf(out, "  -x  optimizer steps              (%d)\n", d.max_steps);
    fprintf(out, "  -l  peak learning rate           (%g)\n", d.lr);
    fprintf(out, "  -u  warmup steps                 (%d)\n", d.warmup);
    fprintf(out, "  -q  final lr as a fraction of -l (%g)\n", d.final_lr_frac);
    fprintf(out, "  -c  weight decay                 (%g)\n", d.weight_decay);
    fprintf(out, "  -gc global grad-norm clip, 0 = off (%g)\n", d.grad_clip);
    fprintf(out, "  -rc M2RNN carried-dH clamp, 0 = off (%g)\n", d.rnn_clamp);
    fprintf(out, "  -v  validate every N steps, 0 = never (%d); the final model is always validated\n", d.val_every);
    fprintf(out, "  -m  max validation batches, 0 = all (%d)\n", d.val_batches);
    fprintf(out, "  -n  checkpoint every N steps, 0 = only at the end (%d); with -o the run always ends saved\n",
            d.ckpt_every);
    fprintf(out, "  -nk keep the newest N checkpoints, 0 = all (%d)\n", d.ckpt_keep);
    fprintf(out, "  -nm never delete checkpoints at multiples of N (%d)\n", d.ckpt_major);
    fprintf(out, "  -y  1 = resume the run in -o (it must have a checkpoint), 2 = resume it if it has one (%d)\n",
            d.resume);
    fprintf(out, "  -ow 1 = a new run may overwrite the run in -o (deletes its checkpoints and log) (%d)\n", d.overwrite);
    fprintf(out, "  -ex 1 = write model.safetensors + config.json into -o at the end (%d)\n", d.export_final);
    fprintf(out, "  -zl skip the update when the loss z-score exceeds this, 0 = only NaN/Inf (%g)\n", d.z_loss);
    fprintf(out, "  -zg skip the update when the grad-norm z-score exceeds this, 0 = only NaN/Inf (%g)\n", d.z_norm);
    fprintf(out, "  -zk stop after N skipped updates in a row, with a checkpoint of the last good state (%d)\n",
            d.max_skips);
    fprintf(out, "  -a  overfit the first batch      (%d)\n", d.overfit);
    fprintf(out, "  -sg print generated text every N steps, 0 = never (%d)\n", d.sample_every);
    fprintf(out, "  -g  tokens per generated sample  (%d)\n", d.sample_tokens);
    fprintf(out, "  -tk tokenizer file for samples   (%s)\n", d.tokenizer_path);
    fprintf(out, "  -s  seed                         (%llu)\n", (unsigned long long)d.seed);
    fprintf(out, "  -nt OpenMP threads, 0 = default  (%d)\n", d.threads);
    fprintf(out, "  -tp tensor-parallel group size (%d); the processes of `mpirun -np N` not in one group are\n"
                 "      data-parallel replicas, each reading its own B rows of every step\n", d.tp);
    fprintf(out, "  -h  this help\n");
    fprintf(out, "SIGINT/SIGTERM finish the step and save (with -o); a second one aborts.\n");
}

// Parses argv into o; refuses unknown flags, missing values and malformed numbers with one line and a hint.
static void parse_args(TrainOptions *o, int argc, char **argv) {
    if (argc > 0 && argv[0] != NULL) { program_name = argv[0]; }
    static char hint[512];
    snprintf(hint, sizeof(hint), "run %s -h to list every flag and its default", program_name);
    o->cmdline[0] = '\0';
    for (int i = 0; i < argc; i++) {
        const size_t used = strlen(o->cmdline);
        snprintf(o->cmdline + used, sizeof(o->cmdline) - used, "%s%s", i ? " " : "", argv[i]);
    }
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "-h") == 0 || strcmp(flag, "--help") == 0) { print_usage(); fflush(stdout); m2rnn_exit(EXIT_SUCCESS); }
        if (flag[0] != '-' || strlen(flag) < 2 || strlen(flag) > 3) {
            fail_with_hint(hint, "expected a flag like -b, got '%s'", flag);
        }
        if (i + 1 >= argc) { fail_with_hint(hint, "flag %s needs a value", flag); }
        const char *v = argv[++i];
        const char *f = flag + 1;
        if (strcmp(f, "i") == 0) { o->train_pattern = v; }
        else if (strcmp(f, "j") == 0) { o->val_pattern = v; }
        else if (strcmp(f, "e") == 0) { o->init = v; o->given_model |= GIVEN_INIT; }
        else if (strcmp(f, "o") == 0) { o->out_dir = v; }
        else if (strcmp(f, "ro") == 0) { o->use_rope = (int)parse_int_arg(flag, v, 0, 1); o->given_model |= GIVEN_ROPE; }
        else if (strcmp(f, "vs") == 0) { o->vocab_size = (int)parse_int_arg(flag, v, 2, 1 << 24); o->given_model |= GIVEN_VOCAB; }
        else if (strcmp(f, "b") == 0) { o->B = (int)parse_int_arg(flag, v, 1, 1 << 16); }
        else if (strcmp(f, "t") == 0) { o->T = (int)parse_int_arg(flag, v, 1, 1 << 20); }
        else if (strcmp(f, "d") == 0) { o->total_batch = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "x") == 0) { o->max_steps = (int)parse_int_arg(flag, v, 1, INT_MAX); }
        else if (strcmp(f, "l") == 0) { o->lr = (float)parse_float_arg(flag, v, 0.0, 10.0); }
        else if (strcmp(f, "u") == 0) { o->warmup = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "q") == 0) { o->final_lr_frac = (float)parse_float_arg(flag, v, 0.0, 1.0); }
        else if (strcmp(f, "c") == 0) { o->weight_decay = (float)parse_float_arg(flag, v, 0.0, 10.0); }
        else if (strcmp(f, "gc") == 0) { o->grad_clip = (float)parse_float_arg(flag, v, 0.0, 1e9); }
        else if (strcmp(f, "rc") == 0) { o->rnn_clamp = (float)parse_float_arg(flag, v, 0.0, 1e9); o->given_model |= GIVEN_CLAMP; }
        else if (strcmp(f, "v") == 0) { o->val_every = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "m") == 0) { o->val_batches = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "n") == 0) { o->ckpt_every = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "nk") == 0) { o->ckpt_keep = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "nm") == 0) { o->ckpt_major = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "y") == 0) { o->resume = (int)parse_int_arg(flag, v, 0, 2); }
        else if (strcmp(f, "ow") == 0) { o->overwrite = (int)parse_int_arg(flag, v, 0, 1); }
        else if (strcmp(f, "ex") == 0) { o->export_final = (int)parse_int_arg(flag, v, 0, 1); }
        else if (strcmp(f, "zl") == 0) { o->z_loss = (float)parse_float_arg(flag, v, 0.0, 1e9); }
        else if (strcmp(f, "zg") == 0) { o->z_norm = (float)parse_float_arg(flag, v, 0.0, 1e9); }
        else if (strcmp(f, "zk") == 0) { o->max_skips = (int)parse_int_arg(flag, v, 1, INT_MAX); }
        else if (strcmp(f, "a") == 0) { o->overfit = (int)parse_int_arg(flag, v, 0, 1); }
        else if (strcmp(f, "sg") == 0) { o->sample_every = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "g") == 0) { o->sample_tokens = (int)parse_int_arg(flag, v, 1, 1 << 20); }
        else if (strcmp(f, "tk") == 0) { o->tokenizer_path = v; }
        else if (strcmp(f, "s") == 0) { o->seed = (uint64_t)parse_int_arg(flag, v, 0, LLONG_MAX); }
        else if (strcmp(f, "nt") == 0) { o->threads = (int)parse_int_arg(flag, v, 0, 1024); }
        else if (strcmp(f, "tp") == 0) { o->tp = (int)parse_int_arg(flag, v, 1, 1024); }
        else { fail_with_hint(hint, "unknown flag %s", flag); }
    }
    if (o->ckpt_every > 0 && o->out_dir == NULL) {
        fail_with_hint("pass -o DIR to say where checkpoints go", "checkpoints every %d steps (-n) need -o DIR",
                       o->ckpt_every);
    }
    if (o->overwrite && o->resume) {
        fail_with_hint("pass -y to resume the run in -o, or -ow 1 to replace it, not both", "-ow 1 and -y %d contradict",
                       o->resume);
    }
}

#endif // M2RNN_TRAIN_LOOP_H
