/*
train_loop.h: the training run every executor shares: options and their CLI, the learning-rate schedule,
validation, text samples, checkpoint save and exact resume, logging, and the step loop. It calls the model only
through executor.h's API, which the CPU reference (ref/lm.h, in train_m2rnn.c) and the GPU executor (lm.cuh, in
train_m2rnn.cu) implement, so the two programs cannot drift apart in anything but how an op runs.
*/
#ifndef M2RNN_TRAIN_LOOP_H
#define M2RNN_TRAIN_LOOP_H

#include <math.h>
#include <time.h>

#include "checkpoint.h"
#include "dataloader.h"
#include "executor.h"
#include "model.h"
#include "tokenizer.h"
#include "utils.h"

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
    int use_rope;          // RoPE in the attention layers of a model built from a descriptor (0 = NoPE)
    int B, T;              // micro-batch
    int total_batch;       // tokens per optimizer step; a multiple of B·T (gradient accumulation)
    int max_steps;
    float lr, final_lr_frac, weight_decay, grad_clip, rnn_clamp;
    int warmup;
    int val_every, val_batches;
    int ckpt_every, ckpt_keep, ckpt_major, resume;
    int overfit;           // 1: train on the first batch only
    int threads;
    int sample_every, sample_tokens; // generated text every N steps (0 = never), tokens per sample
    const char *tokenizer_path;
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
    o.sample_every = 0; o.sample_tokens = 64; o.tokenizer_path = "dev/data/gpt2_tokenizer.bin";
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
    const size_t n = model_table(model)->num_parameters, bytes = n * (size_t)executor_master_bytes();
    const int has_optimizer = model_has_optimizer(model);
    void *params = mallocCheck(bytes);
    void *m = has_optimizer ? mallocCheck(bytes) : NULL;
    void *v = has_optimizer ? mallocCheck(bytes) : NULL;
    model_read_state(model, params, m, v);
    CheckpointHeader h;
    memset(&h, 0, sizeof(h));
    h.config = *model_config(model);
    h.elem_bytes = executor_master_bytes();
    h.has_optimizer = has_optimizer;
    h.num_parameters = n;
    h.step = step; h.B = o->B; h.T = o->T; h.grad_accum = grad_accum;
    h.rng_state = rng_state;
    DataLoaderState state;
    memset(&state, 0, sizeof(state));
    if (loader != NULL) { dataloader_get_state(loader, &state); }
    h.loader_state_bytes = loader != NULL ? (uint32_t)sizeof(state) : 0;
    char path[4096];
    checkpoint_path(path, sizeof(path), o->out_dir, step);
    checkpoint_write(path, &h, params, m, v, &state);
    checkpoint_prune(o->out_dir, o->ckpt_keep, o->ckpt_major);
    free(params); free(m); free(v);
}

static float validation_loss(Model *model, DataLoader *val, int max_batches) {
    dataloader_reset(val);
    int batches = (int)dataloader_num_batches(val);
    if (max_batches > 0 && batches > max_batches) { batches = max_batches; }
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(val);
        sum += model_forward(model, val->inputs, val->targets, (int)val->B, (int)val->T);
    }
    return (float)(sum / (batches > 0 ? batches : 1));
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

// Runs training as the options say. Returns the last step's train loss.
float train_run(const TrainOptions *o) {
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
    Model *model = model_create(&config);
    const ParamTable *table = model_table(model);
    if (ckpt_path[0] != '\0' && table->num_parameters != ckpt.num_parameters) {
        fail_with_hint("the checkpoint is damaged or from another m2rnn version",
                       "checkpoint '%s' holds %llu parameters, its config implies %zu", ckpt_path,
                       (unsigned long long)ckpt.num_parameters, table->num_parameters);
    }
    const int resuming = o->resume && ckpt_path[0] != '\0';
    if (resuming && (ckpt.B != o->B || ckpt.T != o->T || ckpt.grad_accum != grad_accum)) {
        fail_with_hint("resume with the -b, -t and -d the run was started with",
                       "checkpoint '%s' was trained with B=%d T=%d accumulation %d, this run asks B=%d T=%d "
                       "accumulation %d", ckpt_path, ckpt.B, ckpt.T, ckpt.grad_accum, o->B, o->T, grad_accum);
    }

    DataLoader train_loader, val_loader;
    dataloader_init(&train_loader, o->train_pattern, (size_t)o->B, (size_t)o->T, 0, 1, 1, o->seed,
                    model_config(model)->vocab_size);
    const int have_val = o->val_pattern != NULL && o->val_pattern[0] != '\0' && o->val_every > 0;
    if (have_val) {
        dataloader_init(&val_loader, o->val_pattern, (size_t)o->B, (size_t)o->T, 0, 1, 0, o->seed,
                        model_config(model)->vocab_size);
    }

    int start_step = 0;
    uint64_t rng_state = o->seed;
    if (ckpt_path[0] != '\0') {
        DataLoaderState loader_state;
        const int restore_optimizer = resuming && ckpt.has_optimizer;
        if (resuming && ckpt.loader_state_bytes != sizeof(DataLoaderState)) {
            fail_with_hint("resume from a checkpoint written by this version of train_m2rnn",
                           "checkpoint '%s' has a %u-byte dataloader state, this build's is %zu", ckpt_path,
                           ckpt.loader_state_bytes, sizeof(DataLoaderState));
        }
        const size_t bytes = table->num_parameters * (size_t)executor_master_bytes();
        void *params = mallocCheck(bytes);
        void *m = restore_optimizer ? mallocCheck(bytes) : NULL;
        void *v = restore_optimizer ? mallocCheck(bytes) : NULL;
        checkpoint_read_payload(ckpt_path, &ckpt, params, m, v, resuming ? &loader_state : NULL);
        model_write_state(model, params, m, v);
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
    if (!o->quiet) {
        printf("+-----------------------+----------------------------------------------------+\n");
        printf("| model                 | d%d:l%d:%s%s%s\n", c->d_model, c->n_layer, c->pattern,
               c->ffn_pattern[0] ? ":ffn=" : "", c->ffn_pattern);
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

    Tokenizer tokenizer;
    memset(&tokenizer, 0, sizeof(tokenizer));
    const int have_tokenizer = o->sample_every > 0 && tokenizer_try_init(&tokenizer, o->tokenizer_path);
    if (o->sample_every > 0 && !have_tokenizer && !o->quiet) {
        printf("no tokenizer at %s: no text samples (run make data)\n", o->tokenizer_path);
    }
    OptimizerConfig opt = {o->lr, 0.9f, 0.95f, 1e-10f, o->weight_decay, o->grad_clip};
    const double peak_flops = executor_peak_flops(model);
    const double flops_per_step = model_flops_per_token(c, o->T) * total_batch;
    double time_sum = 0.0;
    int timed_steps = 0;
    float last_loss = -1;
    if (o->overfit) { dataloader_next_batch(&train_loader); }
    for (int step = start_step; step < o->max_steps; step++) {
        const int last_step = step == o->max_steps - 1;
        if (have_val && (step % o->val_every == 0 || last_step)) {
            float val_loss = validation_loss(model, &val_loader, o->val_batches);
            if (!o->quiet) { printf("step %5d | val loss %.6f\n", step, val_loss); }
            log_line(o->out_dir, "s:%d tel:%.6f\n", step, val_loss);
        }
        if (have_tokenizer && step > start_step && step % o->sample_every == 0) {
            print_sample(model, &tokenizer, o->sample_tokens, &rng_state);
        }
        executor_sync(model);
        const double t0 = wall_seconds();
        model_zero_grad(model);
        double loss_sum = 0.0;
        for (int micro = 0; micro < grad_accum; micro++) {
            if (!o->overfit) { dataloader_next_batch(&train_loader); }
            loss_sum += model_forward(model, train_loader.inputs, train_loader.targets, o->B, o->T);
            model_backward(model, 1.0f / grad_accum);
        }
        opt.lr = lr_at_step(step, o->max_steps, o->lr, o->warmup, o->final_lr_frac);
        const double norm = model_update(model, &opt, step + 1);
        executor_sync(model);
        const double dt = wall_seconds() - t0;
        last_loss = (float)(loss_sum / grad_accum);
        if (o->loss_trace != NULL) { o->loss_trace[step] = (float)last_loss; }
        if (step > start_step) { time_sum += dt; timed_steps++; } // the first step warms caches: not timed
        const double avg = timed_steps > 0 ? time_sum / timed_steps : dt;
        if (!o->quiet) {
            char speed[64];
            if (peak_flops > 0) { snprintf(speed, sizeof(speed), "%.1f%% MFU", 100.0 * flops_per_step / dt / peak_flops); }
            else { snprintf(speed, sizeof(speed), "%.1f GFLOP/s", flops_per_step / dt * 1e-9); }
            printf("step %5d/%d | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s | %s | ETA %.1f min\n",
                   step + 1, o->max_steps, last_loss, norm, opt.lr, 1000.0 * dt, total_batch / dt, speed,
                   avg * (o->max_steps - step - 1) / 60.0);
            fflush(stdout);
        }
        log_line(o->out_dir, "s:%d trl:%.6f lr:%.6e norm:%.4f\n", step + 1, last_loss, opt.lr, norm);
        if (o->out_dir != NULL && ((o->ckpt_every > 0 && (step + 1) % o->ckpt_every == 0) ||
                                   (o->ckpt_every > 0 && last_step))) {
            save_checkpoint(o, model, step + 1, grad_accum, rng_state, &train_loader);
        }
    }
    if (!o->quiet && timed_steps > 0) { printf("average step time %.1f ms\n", 1000.0 * time_sum / timed_steps); }
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
    fprintf(stderr, "usage: %s [-flag value]...\n", executor_name());
    fprintf(stderr, "  -i  train shards glob            (%s)\n", d.train_pattern);
    fprintf(stderr, "  -j  val shards glob, \"\" = none   (%s)\n", d.val_pattern);
    fprintf(stderr, "  -e  model descriptor or ckpt.bin (%s)\n", d.init);
    fprintf(stderr, "      descriptor fields: dNNN width, lNN layers, a pattern of mixer letters (%s),\n",
            mixer_letters_help());
    fprintf(stderr, "      ffn=X or one letter per layer (%s), and the kinds' sizes:\n", ffn_letters_help());
    {
        FieldEntry fields[MAX_CONFIG_FIELDS];
        const int nf = config_fields(fields);
        for (int i = 0; i < nf; i++) {
            const ConfigField *f = fields[i].field;
            if (f->key == NULL || fields[i].num_owners == 0) { continue; }
            fprintf(stderr, "        %s%s %s\n", f->key, f->type == FIELD_FLAG ? "" : "NN", f->help);
        }
    }
    fprintf(stderr, "  -vs vocabulary size of a model built from a descriptor (%d = GPT-2)\n", d.vocab_size);
    fprintf(stderr, "  -ro RoPE in attention, 1 = on (or `rope` in the descriptor); 0 = NoPE (%d)\n", d.use_rope);
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
    fprintf(stderr, "  -sg print generated text every N steps, 0 = never (%d)\n", d.sample_every);
    fprintf(stderr, "  -g  tokens per generated sample  (%d)\n", d.sample_tokens);
    fprintf(stderr, "  -tk tokenizer file for samples   (%s)\n", d.tokenizer_path);
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
        else if (strcmp(f, "ro") == 0) { o->use_rope = (int)parse_int_arg(flag, v, 0, 1); }
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
        else if (strcmp(f, "sg") == 0) { o->sample_every = (int)parse_int_arg(flag, v, 0, INT_MAX); }
        else if (strcmp(f, "g") == 0) { o->sample_tokens = (int)parse_int_arg(flag, v, 1, 1 << 20); }
        else if (strcmp(f, "tk") == 0) { o->tokenizer_path = v; }
        else if (strcmp(f, "s") == 0) { o->seed = (uint64_t)parse_int_arg(flag, v, 0, LLONG_MAX); }
        else if (strcmp(f, "nt") == 0) { o->threads = (int)parse_int_arg(flag, v, 0, 1024); }
        else { fail_with_hint(hint, "unknown flag %s", flag); }
    }
    if (o->ckpt_every > 0 && o->out_dir == NULL) {
        fail_with_hint("pass -o DIR to say where checkpoints go", "checkpoints every %d steps (-n) need -o DIR",
                       o->ckpt_every);
    }
}

#endif // M2RNN_TRAIN_LOOP_H
