/*
infer.h: text generation from a trained checkpoint in recurrent form, shared by ./infer_m2rnn (CUDA, infer_m2rnn.cu)
and ./infer_m2rnn_cpu (the CPU reference, infer_m2rnn.c), which differ only in the executor they include.

  load      any trainer checkpoint (the model comes from its header); the tokenizer must have the model's vocabulary
  prefill   each prompt (EOT first, as documents start in the training shards) through model_decode_advance: the
            training forward's ops from the decode states, in chunks of -pc tokens (a chunked prefill equals one
            whole prefill); a saved prompt state (-load) replaces the prefill of its prompt
  decode    one token a step for every unfinished sequence: each recurrent layer keeps a constant-size state (its
            conv window and recurrence state), each attention layer a KV cache of -c positions
  sample    repetition penalty (CTRL's: a seen token's logit divided by p when positive, multiplied when negative),
            then temperature (0: greedy, ties to the lowest id), top-k, top-p (the smallest prefix of the sorted
            distribution reaching p), drawn with the seeded splitmix64 of model.h (one draw a sequence and token): a
            seed repeats a run exactly. On the GPU the draws run in the executor's generation loop (model_decode_gen_*,
            every setting but top-p without top-k and top-k above 1024), an iteration ahead of this loop; the host
            samples the logits rows otherwise (and with M2RNN_HOST_SAMPLING=1)
  stop      at EOT, at the stop string (-stop; not printed), or after -n tokens
  output    one prompt: its completion streamed to stdout as the tokens come (held back only while it could still be
            the start of the stop string); a prompt file (-f: one prompt per line, or JSONL with a "prompt" string
            per line): generated -b at a time, each completion printed when its batch ends (-j 1: as JSONL lines
            {"prompt": ..., "completion": ...}). Timing goes to stderr.
  state     -save FILE writes the decode state after the prompt (the checkpoint's config, the context, the prompt's
            tokens and next-token logits, every layer's state), -load FILE resumes from it: a long shared prompt is
            prefilled once; generation from a loaded state equals generation after the prefill.
*/
#ifndef M2RNN_INFER_H
#define M2RNN_INFER_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpoint.h"
#include "executor.h"
#include "tokenizer.h"
#include "utils.h"

typedef struct {
    const char *ckpt;        // -e
    const char *tokenizer;   // -tk
    const char *prompt;      // -p
    const char *prompt_file; // -f
    int max_new;             // -n
    int context;             // -c (0: the longest prompt + -n)
    int batch;               // -b
    int prefill_chunk;       // -pc (0: whole prompts)
    float temperature;       // -temp
    int top_k;               // -topk (0: off)
    float top_p;             // -topp (1: off)
    float rep_penalty;       // -rp (1: off)
    uint64_t seed;           // -s
    const char *stop;        // -stop
    int bos;                 // -bos: start each prompt with EOT
    int jsonl;               // -j
    const char *save;        // -save
    const char *load;        // -load
    int quiet;               // -q
} InferOptions;

static InferOptions infer_options_default(void) {
    InferOptions o;
    memset(&o, 0, sizeof(o));
    o.tokenizer = "dev/data/gpt2_tokenizer.bin";
    o.max_new = 256; o.batch = 16; o.temperature = 1.0f; o.top_p = 1.0f; o.rep_penalty = 1.0f; o.seed = 1337;
    o.bos = 1;
    return o;
}

static void infer_usage(void) {
    const InferOptions d = infer_options_default();
    printf("usage: %s -e CKPT [-flag value]...\n", program_name);
    printf("  -e    checkpoint written by the trainer (ckpt_*.bin); the model comes from its header (required)\n");
    printf("  -p    prompt text (one prompt)\n");
    printf("  -f    prompt file: one prompt per line, or .jsonl lines {\"prompt\": \"...\"}\n");
    printf("  -tk   tokenizer file, the one the model was trained with (%s)\n", d.tokenizer);
    printf("  -n    new tokens at most per prompt (%d)\n", d.max_new);
    printf("  -c    context: positions a sequence may reach (the KV cache of attention layers); 0 = the longest\n"
           "        prompt + -n (0)\n");
    printf("  -b    prompts generated together (%d)\n", d.batch);
    printf("  -pc   prefill chunk in tokens, 0 = whole prompts (0)\n");
    printf("  -temp temperature, 0 = greedy (%g)\n", d.temperature);
    printf("  -topk sample from the k most likely tokens, 0 = all (0)\n");
    printf("  -topp sample from the smallest set of tokens whose probability reaches p, 1 = all (%g)\n", d.top_p);
    printf("  -rp   repetition penalty on tokens already in the sequence, 1 = off (%g)\n", d.rep_penalty);
    printf("  -s    seed (%llu)\n", (unsigned long long)d.seed);
    printf("  -stop stop string: generation ends before it (none)\n");
    printf("  -bos  start each prompt with the end-of-text token, as documents start in training, 0/1 (%d)\n", d.bos);
    printf("  -j    print completions as JSONL, 0/1 (0)\n");
    printf("  -save write the decode state after the prompt to FILE (one prompt; -n 0 stops there)\n");
    printf("  -load resume from a state written by -save (one prompt: -p, if given, continues the saved one)\n");
    printf("  -q    no timing lines on stderr, 0/1 (0)\n");
    printf("  -h    this text\n");
    printf("example: %s -e log_train/ckpt_00001000.bin -p \"The old house\" -n 100 -temp 0.8 -topk 50\n", program_name);
}

static void infer_parse_args(InferOptions *o, int argc, char **argv) {
    if (argc > 0 && argv[0] != NULL) { program_name = argv[0]; }
    static char hint[512];
    snprintf(hint, sizeof(hint), "run %s -h to list every flag and its default", program_name);
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "-h") == 0 || strcmp(flag, "--help") == 0) { infer_usage(); fflush(stdout); m2rnn_exit(EXIT_SUCCESS); }
        if (flag[0] != '-' || strlen(flag) < 2) { fail_with_hint(hint, "expected a flag like -p, got '%s'", flag); }
        if (i + 1 >= argc) { fail_with_hint(hint, "flag %s needs a value", flag); }
        const char *v = argv[++i], *f = flag + 1;
        if (strcmp(f, "e") == 0) { o->ckpt = v; }
        else if (strcmp(f, "tk") == 0) { o->tokenizer = v; }
        else if (strcmp(f, "p") == 0) { o->prompt = v; }
        else if (strcmp(f, "f") == 0) { o->prompt_file = v; }
        else if (strcmp(f, "n") == 0) { o->max_new = (int)parse_int_arg(flag, v, 0, 1 << 24); }
        else if (strcmp(f, "c") == 0) { o->context = (int)parse_int_arg(flag, v, 0, 1 << 24); }
        else if (strcmp(f, "b") == 0) { o->batch = (int)parse_int_arg(flag, v, 1, 4096); }
        else if (strcmp(f, "pc") == 0) { o->prefill_chunk = (int)parse_int_arg(flag, v, 0, 1 << 24); }
        else if (strcmp(f, "temp") == 0) { o->temperature = (float)parse_float_arg(flag, v, 0.0, 100.0); }
        else if (strcmp(f, "topk") == 0) { o->top_k = (int)parse_int_arg(flag, v, 0, 1 << 24); }
        else if (strcmp(f, "topp") == 0) { o->top_p = (float)parse_float_arg(flag, v, 1e-6, 1.0); }
        else if (strcmp(f, "rp") == 0) { o->rep_penalty = (float)parse_float_arg(flag, v, 1e-3, 100.0); }
        else if (strcmp(f, "s") == 0) { o->seed = (uint64_t)parse_int_arg(flag, v, 0, LLONG_MAX); }
        else if (strcmp(f, "stop") == 0) { o->stop = v; }
        else if (strcmp(f, "bos") == 0) { o->bos = (int)parse_int_arg(flag, v, 0, 1); }
        else if (strcmp(f, "j") == 0) { o->jsonl = (int)parse_int_arg(flag, v, 0, 1); }
        else if (strcmp(f, "save") == 0) { o->save = v; }
        else if (strcmp(f, "load") == 0) { o->load = v; }
        else if (strcmp(f, "q") == 0) { o->quiet = (int)parse_int_arg(flag, v, 0, 1); }
        else { fail_with_hint(hint, "unknown flag %s", flag); }
    }
    if (o->ckpt == NULL) { fail_with_hint("pass the checkpoint to generate from: -e DIR/ckpt_NNNNNNNN.bin", "no checkpoint given (-e)"); }
    if (o->prompt != NULL && o->prompt_file != NULL) {
        fail_with_hint("pass one prompt with -p or a file of prompts with -f, not both", "both -p and -f given");
    }
    if (o->prompt == NULL && o->prompt_file == NULL && o->load == NULL) {
        fail_with_hint("pass a prompt: -p \"text\" (or -p \"\" to start from an empty document) or -f FILE",
                       "no prompt given");
    }
    if ((o->save != NULL || o->load != NULL) && o->prompt_file != NULL) {
        fail_with_hint("-save and -load take one prompt (-p)", "-save/-load with a prompt file");
    }
    if (o->stop != NULL && o->stop[0] == '\0') { fail_with_hint("give a non-empty stop string", "empty -stop"); }
}

// ----------------------------------------------------------------------------------------------------------------
// prompts

typedef struct { char **text; int n; } PromptList;

static void prompts_push(PromptList *p, const char *s, size_t len) {
    p->text = (char **)realloc(p->text, (size_t)(p->n + 1) * sizeof(char *));
    if (p->text == NULL) { fail_with_hint("free some memory", "out of memory reading prompts"); }
    char *t = (char *)mallocCheck(len + 1);
    memcpy(t, s, len);
    t[len] = '\0';
    p->text[p->n++] = t;
}

// appends the UTF-8 encoding of code point cp
static size_t utf8_put(char *out, uint32_t cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// the "prompt" string of a JSONL line, unescaped into out (as long as the line); 0 if the line has none
static int jsonl_prompt(const char *line, char *out, size_t *out_len) {
    const char *k = strstr(line, "\"prompt\"");
    if (k == NULL) { return 0; }
    const char *p = k + 8;
    while (*p == ' ' || *p == '\t') { p++; }
    if (*p++ != ':') { return 0; }
    while (*p == ' ' || *p == '\t') { p++; }
    if (*p++ != '"') { return 0; }
    size_t n = 0;
    while (*p != '\0' && *p != '"') {
        if (*p != '\\') { out[n++] = *p++; continue; }
        p++;
        switch (*p) {
            case 'n': out[n++] = '\n'; break;
            case 't': out[n++] = '\t'; break;
            case 'r': out[n++] = '\r'; break;
            case 'b': out[n++] = '\b'; break;
            case 'f': out[n++] = '\f'; break;
            case 'u': {
                uint32_t cp = 0;
                for (int i = 1; i <= 4; i++) {
                    const char ch = p[i];
                    const int v = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
                    if (v < 0) { return 0; }
                    cp = cp * 16 + (uint32_t)v;
                }
                p += 4;
                if (cp >= 0xD800 && cp < 0xDC00 && p[1] == '\\' && p[2] == 'u') { // a surrogate pair
                    const char hex[5] = {p[3], p[4], p[5], p[6], 0};
                    const uint32_t lo = (uint32_t)strtoul(hex, NULL, 16);
                    if (lo >= 0xDC00 && lo < 0xE000) { cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00); p += 6; }
                }
                n += utf8_put(out + n, cp);
                break;
            }
            case '\0': return 0;
            default: out[n++] = *p; break; // \" \\ \/
        }
        p++;
    }
    if (*p != '"') { return 0; }
    *out_len = n;
    return 1;
}

static PromptList read_prompts(const InferOptions *o) {
    PromptList p = {NULL, 0};
    if (o->prompt != NULL) {
        prompts_push(&p, o->prompt, strlen(o->prompt));
        return p;
    }
    if (o->prompt_file == NULL) { // -load alone: the saved prompt continues with nothing added
        prompts_push(&p, "", 0);
        return p;
    }
    FILE *f = fopen(o->prompt_file, "rb");
    if (f == NULL) {
        fail_with_hint("check the path of the prompt file (-f)", "cannot open prompt file '%s': %s", o->prompt_file,
                       strerror(errno));
    }
    const int jsonl = ends_with(o->prompt_file, ".jsonl");
    size_t cap = 1 << 16, len = 0;
    char *line = (char *)mallocCheck(cap), *buf = (char *)mallocCheck(cap);
    int lineno = 0, ch;
    do {
        ch = fgetc(f);
        if (ch != '\n' && ch != EOF) {
            if (len + 1 >= cap) {
                cap *= 2;
                line = (char *)realloc(line, cap);
                buf = (char *)realloc(buf, cap);
                if (line == NULL || buf == NULL) { fail_with_hint("use shorter prompts", "out of memory reading '%s'", o->prompt_file); }
            }
            line[len++] = (char)ch;
            continue;
        }
        if (len == 0 && ch == EOF) { break; }
        lineno++;
        if (len > 0 && line[len - 1] == '\r') { len--; }
        line[len] = '\0';
        if (jsonl) {
            size_t n = 0;
            if (len == 0) { continue; } // blank lines between records
            if (!jsonl_prompt(line, buf, &n)) {
                fail_with_hint("each line of a .jsonl prompt file must be an object with a \"prompt\" string",
                               "%s line %d: no \"prompt\" string", o->prompt_file, lineno);
            }
            prompts_push(&p, buf, n);
        } else if (len > 0) {
            prompts_push(&p, line, len);
        }
        len = 0;
    } while (ch != EOF);
    fclose(f);
    free(line);
    free(buf);
    if (p.n == 0) {
        fail_with_hint("put one prompt per line (or JSONL records) in the file", "prompt file '%s' has no prompts",
                       o->prompt_file);
    }
    return p;
}

// ----------------------------------------------------------------------------------------------------------------
// sampling

typedef struct { float v; int id; } Cand;
static int cand_desc(const void *a, const void *b) {
    const Cand *x = (const Cand *)a, *y = (const Cand *)b;
    if (x->v != y->v) { return x->v < y->v ? 1 : -1; }
    return x->id - y->id; // ties: the lower id first
}

// the draw from the first n candidates of work (v = logit / temperature; sorted by cand_desc where top-k or top-p
// applies, else in id order) with u in (0, 1]: top-p's prefix of them, then the first whose running sum of
// exp(v − max) reaches u times their sum. (The GPU's generation loop draws the same: lm.cuh's sample_topk_kernel.)
static int sample_candidates(const Cand *work, int n, const InferOptions *o, double u) {
    float maxv = work[0].v;
    for (int i = 1; i < n; i++) { maxv = work[i].v > maxv ? work[i].v : maxv; }
    double sum = 0.0;
    for (int i = 0; i < n; i++) { sum += exp((double)(work[i].v - maxv)); }
    if (o->top_p < 1.0f) { // the smallest prefix of the sorted distribution with mass >= top_p
        double acc = 0.0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            acc += exp((double)(work[i].v - maxv)) / sum;
            if (acc >= o->top_p) { keep = i + 1; break; }
        }
        n = keep;
        sum = 0.0;
        for (int i = 0; i < n; i++) { sum += exp((double)(work[i].v - maxv)); }
    }
    const double r = u * sum;
    double acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += exp((double)(work[i].v - maxv));
        if (acc >= r) { return work[i].id; }
    }
    return work[n - 1].id;
}

// the next token from the logits of the V real ids (changed in place); seen: the sequence's tokens so far; u the draw
// in (0, 1] (rng_uniform; unused when greedy); work (V) and mark (V bytes) are scratch
static int sample_token(float *logits, int V, const int *seen, int n_seen, const InferOptions *o, double u, Cand *work,
                        unsigned char *mark) {
    if (o->rep_penalty != 1.0f) { // each distinct seen token once
        memset(mark, 0, (size_t)V);
        for (int i = 0; i < n_seen; i++) {
            const int t = seen[i];
            if (t < 0 || t >= V || mark[t]) { continue; }
            mark[t] = 1;
            logits[t] = logits[t] > 0 ? logits[t] / o->rep_penalty : logits[t] * o->rep_penalty;
        }
    }
    if (o->temperature == 0.0f) { // greedy: the largest logit, the lowest id among equals
        int best = 0;
        for (int t = 1; t < V; t++) { if (logits[t] > logits[best]) { best = t; } }
        return best;
    }
    int n = V;
    for (int t = 0; t < V; t++) { work[t].v = logits[t] / o->temperature; work[t].id = t; }
    if ((o->top_k > 0 && o->top_k < V) || o->top_p < 1.0f) {
        qsort(work, (size_t)V, sizeof(Cand), cand_desc);
        if (o->top_k > 0 && o->top_k < n) { n = o->top_k; }
    }
    return sample_candidates(work, n, o, u);
}

// ----------------------------------------------------------------------------------------------------------------
// the model and its saved prompt states

static Model *load_checkpoint_model(const char *path) {
    CheckpointHeader h;
    checkpoint_read_header(path, &h);
    if (h.elem_bytes != executor_master_bytes()) {
        fail_with_hint("use a checkpoint written by a build with the same precision",
                       "checkpoint '%s' holds %d-byte numbers, this build uses %d", path, h.elem_bytes,
                       executor_master_bytes());
    }
    Model *model = model_create(&h.config);
    if (model_table(model)->num_parameters != h.num_parameters) {
        fail_with_hint("the checkpoint is damaged or from another m2rnn version",
                       "checkpoint '%s' holds %llu parameters, its config implies %zu", path,
                       (unsigned long long)h.num_parameters, model_table(model)->num_parameters);
    }
    void *params = mallocCheck(h.num_parameters * (size_t)executor_master_bytes());
    checkpoint_read_payload(path, &h, params, NULL, NULL, NULL);
    model_write_state(model, params, NULL, NULL);
    free(params);
    return model;
}

#define STATE_MAGIC 0x4D32524E53544131ull // "M2RNSTA1"

// file: magic, config text length, context, executor number bytes, prompt tokens, state bytes, Vp; the config text;
// the tokens; the logits (Vp floats); the state
static void save_prompt_state(const char *path, Model *model, int context, const int *tokens, int n, const float *logits) {
    char cfg[8192];
    const int cl = model_config_to_text(model_config(model), cfg, sizeof(cfg));
    const uint64_t sb = model_decode_state_size(model);
    void *state = mallocCheck(sb);
    model_decode_state_io(model, 0, state, 1);
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL) { fail_with_hint("check that the directory exists and is writable", "cannot write '%s': %s", tmp, strerror(errno)); }
    const uint64_t head[7] = {STATE_MAGIC, (uint64_t)cl, (uint64_t)context, (uint64_t)executor_master_bytes(),
                              (uint64_t)n, sb, (uint64_t)model_config(model)->padded_vocab_size};
    fwriteCheck(head, sizeof(head), 1, f);
    fwriteCheck(cfg, 1, (size_t)cl, f);
    fwriteCheck(tokens, sizeof(int), (size_t)n, f);
    fwriteCheck(logits, sizeof(float), (size_t)model_config(model)->padded_vocab_size, f);
    fwriteCheck(state, 1, sb, f);
    fcloseCheck(f);
    if (rename(tmp, path) != 0) { fail_with_hint("check the directory is writable", "cannot rename '%s': %s", tmp, strerror(errno)); }
    free(state);
}

// reads a saved state's header (context, tokens) and checks it belongs to this model and build; then, after
// model_decode_begin with that context, load_prompt_state_body restores the state into sequence 0
typedef struct { int context, n; int *tokens; float *logits; void *state; uint64_t state_bytes; } SavedState;

static SavedState read_prompt_state(const char *path, Model *model) {
    SavedState s;
    memset(&s, 0, sizeof(s));
    FILE *f = fopen(path, "rb");
    if (f == NULL) { fail_with_hint("check the path given to -load", "cannot open saved state '%s': %s", path, strerror(errno)); }
    uint64_t head[7];
    if (fread(head, sizeof(head), 1, f) != 1 || head[0] != STATE_MAGIC || head[1] > 8191 || head[2] < 1 ||
        head[2] > (1u << 24) || head[4] > head[2]) {
        fail_with_hint("pass a file written by -save", "'%s' is not a saved decode state, or it is damaged", path);
    }
    char cfg[8192], mine[8192];
    const int ml = model_config_to_text(model_config(model), mine, sizeof(mine));
    if (fread(cfg, 1, (size_t)head[1], f) != head[1] || (int)head[1] != ml || memcmp(cfg, mine, (size_t)ml) != 0 ||
        head[3] != (uint64_t)executor_master_bytes() || head[6] != (uint64_t)model_config(model)->padded_vocab_size) {
        fail_with_hint("load a state saved from this checkpoint's model by a build of the same precision",
                       "saved state '%s' belongs to another model or build", path);
    }
    s.context = (int)head[2];
    s.n = (int)head[4];
    s.state_bytes = head[5];
    s.tokens = (int *)mallocCheck((size_t)(s.n > 0 ? s.n : 1) * sizeof(int));
    s.logits = (float *)mallocCheck(head[6] * sizeof(float));
    s.state = mallocCheck(s.state_bytes);
    if (fread(s.tokens, sizeof(int), (size_t)s.n, f) != (size_t)s.n || fread(s.logits, sizeof(float), head[6], f) != head[6] ||
        fread(s.state, 1, s.state_bytes, f) != s.state_bytes) {
        fail_with_hint("the file is truncated: save the state again", "saved state '%s' is truncated", path);
    }
    fclose(f);
    return s;
}

// ----------------------------------------------------------------------------------------------------------------
// generation

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// prints s (n bytes) as a JSON string
static void json_string(FILE *fp, const char *s, size_t n) {
    fputc('"', fp);
    for (size_t i = 0; i < n; i++) {
        const unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') { fputc('\\', fp); fputc(ch, fp); }
        else if (ch == '\n') { fputs("\\n", fp); }
        else if (ch == '\t') { fputs("\\t", fp); }
        else if (ch == '\r') { fputs("\\r", fp); }
        else if (ch < 0x20) { fprintf(fp, "\\u%04x", ch); }
        else { fputc(ch, fp); }
    }
    fputc('"', fp);
}

typedef struct {
    int *tokens, n;     // the sequence so far (prompt, then generated)
    int prompt_len;
    char *text;         // the generated text (bytes)
    size_t text_len, text_cap, printed;
    int done;
} Seq;

static void seq_append_text(Seq *s, const uint8_t *b, size_t n) {
    if (s->text_len + n + 1 > s->text_cap) {
        s->text_cap = (s->text_len + n + 1) * 2;
        s->text = (char *)realloc(s->text, s->text_cap);
        if (s->text == NULL) { fail_with_hint("generate fewer tokens (-n)", "out of memory"); }
    }
    memcpy(s->text + s->text_len, b, n);
    s->text_len += n;
    s->text[s->text_len] = '\0';
}

// bytes of the text that can be printed now: all of it unless its end could still begin the stop string
static size_t printable(const Seq *s, const char *stop) {
    if (stop == NULL) { return s->text_len; }
    const size_t sl = strlen(stop);
    for (size_t k = sl - 1; k > 0; k--) { // the longest suffix of the text that is a prefix of stop
        if (s->text_len >= k && memcmp(s->text + s->text_len - k, stop, k) == 0) { return s->text_len - k; }
    }
    return s->text_len;
}

static void infer_run(const InferOptions *o) {
    Model *model = load_checkpoint_model(o->ckpt);
    const ModelConfig *c = model_config(model);
    const int V = c->vocab_size, Vp = c->padded_vocab_size;
    Tokenizer tok;
    if (!tokenizer_try_init(&tok, o->tokenizer)) {
        fail_with_hint("run make data (it writes the tokenizers to dev/data), or pass one with -tk",
                       "cannot read the tokenizer '%s'", o->tokenizer);
    }
    if (tokenizer_vocab_size(&tok) != V) {
        fail_with_hint("pass the tokenizer the model was trained with (-tk dev/data/gpt2_tokenizer.bin for a 50257-token "
                       "model, dev/data/cl100k_tokenizer.bin for 100277)",
                       "the tokenizer '%s' has %d tokens, the model %d", o->tokenizer, tokenizer_vocab_size(&tok), V);
    }
    const int eot = tokenizer_eot(&tok);
    PromptList prompts = read_prompts(o);
    SavedState saved;
    memset(&saved, 0, sizeof(saved));
    if (o->load != NULL) { saved = read_prompt_state(o->load, model); }
    // the prompts' tokens: EOT first (unless -bos 0, or the prompt continues a saved state)
    int **ptok = (int **)mallocCheck((size_t)prompts.n * sizeof(int *)), *plen = (int *)mallocCheck((size_t)prompts.n * sizeof(int));
    int longest = 0;
    for (int i = 0; i < prompts.n; i++) {
        TokenBuffer tb = {NULL, 0, 0};
        if (o->bos && o->load == NULL) { tokbuf_push(&tb, eot); }
        tokenizer_encode(&tok, &tb, (const uint8_t *)prompts.text[i], strlen(prompts.text[i]));
        if (tb.len == 0 && o->load == NULL) { tokbuf_push(&tb, eot); } // -bos 0 and an empty prompt: start from EOT
        ptok[i] = tb.ids != NULL ? tb.ids : (int *)mallocCheck(sizeof(int));
        plen[i] = (int)tb.len + saved.n;
        longest = plen[i] > longest ? plen[i] : longest;
    }
    int context = o->load != NULL ? saved.context : (o->context > 0 ? o->context : longest + o->max_new);
    if (o->load != NULL && o->context > 0 && o->context != saved.context) {
        fail_with_hint("leave -c out with -load: the state was saved with its context", "-c %d differs from the saved "
                       "state's context %d", o->context, saved.context);
    }
    if (longest + o->max_new > context && o->load != NULL) {
        fail_with_hint("save the state with a larger context (-c with -save), or generate fewer tokens (-n)",
                       "the saved state's context holds %d positions, its %d tokens and -n %d need %d", context, longest,
                       o->max_new, longest + o->max_new);
    }
    if (longest + o->max_new > context) {
        fail_with_hint("raise -c, or generate fewer tokens (-n), or shorten the prompt",
                       "a prompt of %d tokens and -n %d need %d positions, the context is %d", longest, o->max_new,
                       longest + o->max_new, context);
    }
    if (o->save != NULL && prompts.n != 1) { fail_with_hint("-save takes one prompt", "-save with %d prompts", prompts.n); }
    float *logits = (float *)mallocCheck((size_t)prompts.n * Vp * sizeof(float));
    Cand *work = (Cand *)mallocCheck((size_t)Vp * sizeof(Cand));
    unsigned char *mark = (unsigned char *)mallocCheck((size_t)Vp);
    Rng rng = {o->seed};
    // the executor's generation loop (model_decode_gen_*, where it samples: all but top-p without top-k, and top-k
    // above 1024), else sample_token on the host (always with M2RNN_HOST_SAMPLING=1: for A/B runs)
    const char *host_sampling = getenv("M2RNN_HOST_SAMPLING");
    const int sample_on_executor = !(host_sampling != NULL && strcmp(host_sampling, "1") == 0);
    const int stream = prompts.n == 1 && !o->jsonl;
    double t_prefill = 0, t_decode = 0;
    long prefilled = 0, decoded = 0;
    for (int first = 0; first < prompts.n; first += o->batch) {
        const int B = prompts.n - first < o->batch ? prompts.n - first : o->batch;
        model_decode_begin(model, B, context);
        Seq *seq = (Seq *)calloc((size_t)B, sizeof(Seq));
        if (seq == NULL) { fail_with_hint("lower -b", "out of memory"); }
        double t0 = now_s();
        int loaded_only = 0; // a sequence whose logits are the saved state's (no prompt of its own)
        for (int b = 0; b < B; b++) {
            const int i = first + b, own = plen[i] - saved.n;
            loaded_only |= own == 0;
            seq[b].tokens = (int *)mallocCheck((size_t)(plen[i] + o->max_new + 1) * sizeof(int));
            memcpy(seq[b].tokens, saved.tokens, (size_t)saved.n * sizeof(int));
            memcpy(seq[b].tokens + saved.n, ptok[i], (size_t)own * sizeof(int));
            seq[b].n = seq[b].prompt_len = plen[i];
            float *lg = logits + (size_t)b * Vp;
            if (o->load != NULL) {
                model_decode_state_io(model, b, saved.state, 0);
                memcpy(lg, saved.logits, (size_t)Vp * sizeof(float));
            }
            int pos = saved.n;
            const int chunk = o->prefill_chunk > 0 ? o->prefill_chunk : (own > 0 ? own : 1);
            for (int s0 = 0; s0 < own; s0 += chunk) { // the prompt (after a loaded state: what it adds)
                const int n = own - s0 < chunk ? own - s0 : chunk;
                model_decode_advance(model, b, 1, ptok[i] + s0, n, &pos);
                pos += n;
            }
            if (own > 0) { model_decode_logits(model, b, lg); }
            prefilled += own;
        }
        executor_sync(model);
        t_prefill += now_s() - t0;
        if (o->save != NULL) { save_prompt_state(o->save, model, context, seq[0].tokens, seq[0].n, logits); }
        // generation
        t0 = now_s();
        int *step_tok = (int *)mallocCheck((size_t)B * sizeof(int)), *step_pos = (int *)mallocCheck((size_t)B * sizeof(int));
        int *next_tok = (int *)mallocCheck((size_t)B * sizeof(int));
        double *u = (double *)mallocCheck((size_t)B * sizeof(double));
        // the draws: one a sequence and iteration unless greedy (finished sequences too), in sequence order, so a seed
        // gives the same run on every path
#define DRAW_U() for (int b = 0; b < B; b++) { u[b] = o->temperature != 0.0f ? rng_uniform(&rng) : 0.0; }
        int gen = 0, gen_asked = 0; // the executor's loop draws the tokens (asked once a batch: it may decline)
        for (int k = 0; k < o->max_new; k++) {
            // the next tokens: drawn by the executor where the logits are (its generation loop feeds them to its next
            // step itself and runs an iteration ahead of this one), else from the rows on the host (and the first from
            // a saved state's logits, which only the host holds)
            const int on_executor = k > 0 || !loaded_only; // the logits the draw reads are the executor's
            if (!gen_asked && sample_on_executor && on_executor) {
                gen_asked = 1;
                const int **seen = (const int **)mallocCheck((size_t)B * sizeof(int *)); // (the repetition penalty's)
                int *n_seen = (int *)mallocCheck((size_t)B * sizeof(int));
                for (int b = 0; b < B; b++) {
                    step_pos[b] = seq[b].n - 1 < context - 1 ? seq[b].n - 1 : context - 1;
                    seen[b] = seq[b].tokens;
                    n_seen[b] = seq[b].n;
                }
                gen = model_decode_gen_begin(model, step_pos, o->temperature, o->top_k, o->top_p, o->rep_penalty, seen,
                                             n_seen);
                free(seen);
                free(n_seen);
                if (gen) { // this iteration (each queues the one after it)
                    DRAW_U();
                    model_decode_gen_launch(model, u, k + 1 < o->max_new);
                }
            }
            if (gen) {
                if (k + 1 < o->max_new) { // the next iteration, queued before this one's wait
                    DRAW_U();
                    model_decode_gen_launch(model, u, k + 2 < o->max_new);
                }
                model_decode_gen_wait(model, next_tok);
            } else {
                DRAW_U();
                for (int b = 0; b < B; b++) {
                    if (seq[b].done) { continue; }
                    float *lg = logits + (size_t)b * Vp;
                    if (k > 0) { model_decode_logits(model, b, lg); }
                    next_tok[b] = sample_token(lg, V, seq[b].tokens, seq[b].n, o, u[b], work, mark);
                }
            }
            int active = 0;
            for (int b = 0; b < B; b++) {
                Seq *s = &seq[b];
                step_tok[b] = eot;
                step_pos[b] = s->n < context ? s->n : context - 1;
                if (s->done) { continue; }
                const int next = next_tok[b];
                if (next == eot) { s->done = 1; continue; }
                s->tokens[s->n] = next;
                step_tok[b] = next;
                step_pos[b] = s->n;
                s->n++;
                size_t len = 0;
                const uint8_t *bytes = tokenizer_decode(&tok, next, &len);
                if (bytes != NULL) { seq_append_text(s, bytes, len); }
                if (o->stop != NULL) {
                    const char *hit = strstr(s->text, o->stop);
                    if (hit != NULL) { s->text_len = (size_t)(hit - s->text); s->text[s->text_len] = '\0'; s->done = 1; }
                }
                if (stream) {
                    const size_t upto = s->done ? s->text_len : printable(s, o->stop);
                    if (upto > s->printed) { fwrite(s->text + s->printed, 1, upto - s->printed, stdout); fflush(stdout); s->printed = upto; }
                }
                if (!s->done && k + 1 < o->max_new) { active++; }
            }
            decoded += active;
            if (active == 0) { break; }
            if (!gen) { model_decode_step(model, step_tok, step_pos); }
        }
#undef DRAW_U
        executor_sync(model);
        t_decode += now_s() - t0;
        for (int b = 0; b < B; b++) {
            Seq *s = &seq[b];
            if (stream) {
                if (s->text_len > s->printed) { fwrite(s->text + s->printed, 1, s->text_len - s->printed, stdout); }
                printf("\n");
            } else if (o->jsonl) {
                printf("{\"prompt\": ");
                json_string(stdout, prompts.text[first + b], strlen(prompts.text[first + b]));
                printf(", \"completion\": ");
                json_string(stdout, s->text != NULL ? s->text : "", s->text_len);
                printf("}\n");
            } else {
                printf("=== %d: %s\n%s\n", first + b + 1, prompts.text[first + b], s->text != NULL ? s->text : "");
            }
            free(s->tokens);
            free(s->text);
        }
        fflush(stdout);
        free(seq); free(step_tok); free(step_pos); free(next_tok); free(u);
    }
    if (!o->quiet) {
        fprintf(stderr, "%s: %d prompts, prefill %ld tokens in %.3f s (%.0f tokens/s), decode %ld tokens in %.3f s "
                "(%.0f tokens/s), context %d\n", program_name, prompts.n, prefilled, t_prefill,
                prefilled / (t_prefill > 0 ? t_prefill : 1e-9), decoded, t_decode,
                decoded / (t_decode > 0 ? t_decode : 1e-9), context);
    }
    for (int i = 0; i < prompts.n; i++) { free(prompts.text[i]); free(ptok[i]); }
    free(prompts.text); free(ptok); free(plen); free(logits); free(work); free(mark);
    free(saved.tokens); free(saved.logits); free(saved.state);
    tokenizer_free(&tok);
    model_free(model);
}

#endif // M2RNN_INFER_H
