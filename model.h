/*
model.h: the one definition of the model, shared by the CPU reference (train_m2rnn.c), the CUDA trainer and the
inference engine. It holds:
- ModelConfig and its defaults, the layer pattern (one letter per layer: M = M²RNN, A = attention), and the model
  descriptor ("d256:l4:MMAM:n18") parser, with a clear refusal of anything malformed;
- the parameter table: for every tensor its name, shape, init rule, weight-decay flag and offset in the one
  contiguous parameter buffer. Allocation, init, checkpoint I/O and the optimizer's no-decay set are all derived from
  it, so no executor lists parameters a second time;
- the parameter init (host side, seeded, identical for every executor);
- FLOP counts per token for MFU.
Executors declare their typed views with the PARAM_LAYER_FIELDS X-macro (real* on the CPU, floatX* on the GPU).
*/
#ifndef M2RNN_MODEL_H
#define M2RNN_MODEL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "utils.h"

#define MAX_LAYERS 128
#define VOCAB_PAD_MULTIPLE 128

typedef struct {
    int vocab_size;          // V: real tokens (50257 for GPT-2)
    int padded_vocab_size;   // Vp: V rounded up to a multiple of 128; logits of the padding are never used
    int d_model;             // C
    int n_layer;             // L = strlen(pattern)
    char pattern[MAX_LAYERS + 1];
    // M²RNN mixer (spec m2rnn_authors_code.md §1)
    int rnn_heads;           // N: value heads (each has its own K×V state)
    int rnn_qk_heads;        // Nq = Nk: 1 (the paper's configs, shared by all N heads) or N
    int rnn_k;               // K: key dim = rows of the state (64)
    int rnn_v;               // Vh: value dim = columns of the state (16)
    int conv_width;          // depthwise causal conv taps (4)
    float rnn_grad_clamp;    // elementwise clamp of the carried dH in the backward (1.0; 0 = off)
    // attention mixer
    int attn_heads;          // NH
    int attn_head_dim;       // HS
    int use_rope;            // 0 = NoPE (hybrids in the paper), 1 = RoPE
    float rope_theta;
    // SwiGLU MLP
    int mlp_hidden;          // F
} ModelConfig;

// ----------------------------------------------------------------------------------------------------------------
// config defaults, derived sizes, validation

static inline int round_up(int x, int multiple) { return ((x + multiple - 1) / multiple) * multiple; }

// M²RNN projection rows: q | k | v | f_raw | g (spec §1 item 1), and the conv channels q | k | v
static inline int m2rnn_proj_rows(const ModelConfig *c) {
    return 2 * c->rnn_qk_heads * c->rnn_k + 2 * c->rnn_heads * c->rnn_v + c->rnn_heads;
}
static inline int m2rnn_conv_dim(const ModelConfig *c) { return 2 * c->rnn_qk_heads * c->rnn_k + c->rnn_heads * c->rnn_v; }

// Fills every size a user did not set (0 or -1 means "derive it"). Defaults: K=64, V=16 and Nq=1 as the paper;
// N chosen so an M²RNN layer has about the parameters of an attention layer (4C²), rounded to a multiple of 8 so the
// projection's 2·64 + 33·N rows are too (the GPU's matmuls then run aligned kernels): 80 at C=1024 (the paper used
// 84, pass n84 for it); attention heads of dim 64; SwiGLU hidden 8C/3 rounded up to 64 (2752 at C=1024, as the paper).
static void model_config_fill_defaults(ModelConfig *c) {
    if (c->vocab_size <= 0) { c->vocab_size = 50257; }
    c->padded_vocab_size = round_up(c->vocab_size, VOCAB_PAD_MULTIPLE);
    if (c->rnn_k <= 0) { c->rnn_k = 64; }
    if (c->rnn_v <= 0) { c->rnn_v = 16; }
    if (c->rnn_qk_heads <= 0) { c->rnn_qk_heads = 1; }
    if (c->conv_width <= 0) { c->conv_width = 4; }
    if (c->rnn_heads <= 0) {
        const double n = (4.0 * c->d_model - 2.0 * c->rnn_k) / (3.0 * c->rnn_v + 1.0);
        const int n8 = 8 * (int)floor(n / 8.0 + 0.5);
        c->rnn_heads = n8 >= 8 ? n8 : (n >= 1 ? (int)n : 1);
    }
    if (c->rnn_grad_clamp < 0) { c->rnn_grad_clamp = 1.0f; }
    if (c->attn_head_dim <= 0) { c->attn_head_dim = c->d_model >= 64 ? 64 : c->d_model; }
    if (c->attn_heads <= 0) { c->attn_heads = c->d_model / c->attn_head_dim > 0 ? c->d_model / c->attn_head_dim : 1; }
    if (c->rope_theta <= 0) { c->rope_theta = 10000.0f; }
    if (c->mlp_hidden <= 0) { c->mlp_hidden = round_up((8 * c->d_model + 2) / 3, 64); }
    c->n_layer = (int)strlen(c->pattern);
}

static inline int model_layer_is_valid_letter(char ch) { return ch == 'M' || ch == 'A'; }

// Refuses a config that cannot be built, with one line naming the problem and the fix.
static void model_config_validate(const ModelConfig *c) {
    const char *hint_pattern = "the pattern has one letter per layer: M = M2RNN, A = attention (e.g. -e d256:MMAM)";
    size_t len = strlen(c->pattern);
    if (len == 0) { fail_with_hint(hint_pattern, "empty layer pattern"); }
    for (size_t i = 0; i < len; i++) {
        if (!model_layer_is_valid_letter(c->pattern[i])) {
            fail_with_hint(hint_pattern, "layer pattern '%s': unknown layer letter '%c' at position %zu", c->pattern,
                           c->pattern[i], i);
        }
    }
    if (c->d_model <= 0 || c->d_model > 65536) { fail_with_hint("use e.g. -e d256:MMAM", "model width d=%d is out of range", c->d_model); }
    if (c->vocab_size <= 1) { fail_with_hint("the vocabulary needs at least 2 tokens", "vocab size %d", c->vocab_size); }
    if (c->rnn_qk_heads != 1 && c->rnn_qk_heads != c->rnn_heads) {
        fail_with_hint("set the q/k heads to 1 (shared by all value heads) or equal to the value heads",
                       "M2RNN q/k heads (%d) must be 1 or equal the value heads (%d)", c->rnn_qk_heads, c->rnn_heads);
    }
    if (c->rnn_k <= 0 || c->rnn_v <= 0 || c->rnn_heads <= 0 || c->conv_width <= 0 || c->conv_width > 16) {
        fail_with_hint("check the M2RNN sizes", "M2RNN sizes must be positive (K=%d V=%d N=%d conv=%d, conv <= 16)",
                       c->rnn_k, c->rnn_v, c->rnn_heads, c->conv_width);
    }
    if (strchr(c->pattern, 'A') != NULL) {
        if (c->attn_heads <= 0 || c->attn_head_dim <= 0) {
            fail_with_hint("check the attention sizes", "attention needs heads > 0 and head dim > 0");
        }
        if (c->use_rope && c->attn_head_dim % 2 != 0) {
            fail_with_hint("use an even head dim with RoPE", "RoPE needs an even attention head dim, got %d",
                           c->attn_head_dim);
        }
    }
    if (c->mlp_hidden <= 0) { fail_with_hint("check the MLP size", "MLP hidden size must be positive, got %d", c->mlp_hidden); }
}

// Parses a model descriptor: colon-separated fields, in any order:
//   dNNN  width            lNN  layers (must equal the pattern length when both are given; alone: all M)
//   nNN   M2RNN heads      qNN  M2RNN q/k heads     kNN  M2RNN K     vNN  M2RNN V
//   hNN   attention heads  fNNN MLP hidden          rope  RoPE on    a pattern of M/A letters
// e.g. "d256:l4:MMAM", "d768:MMMAMMMAMMMA:n48", "d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84".
static void model_config_from_descriptor(ModelConfig *c, const char *descriptor) {
    const char *hint = "a descriptor looks like d256:MMAM or d512:l8:MMMAMMMA (fields d l n q k v h f rope and a "
                       "pattern of M/A letters)";
    char buf[512];
    if (strlen(descriptor) >= sizeof(buf)) { fail_with_hint(hint, "model descriptor too long"); }
    strcpy(buf, descriptor);
    int layers = 0;
    for (char *field = strtok(buf, ":"); field != NULL; field = strtok(NULL, ":")) {
        if (strcmp(field, "rope") == 0) { c->use_rope = 1; continue; }
        if (field[0] >= 'A' && field[0] <= 'Z') { // the layer pattern; its letters are checked by validate
            if (strlen(field) > MAX_LAYERS) { fail_with_hint(hint, "pattern longer than %d layers", MAX_LAYERS); }
            strcpy(c->pattern, field);
            continue;
        }
        char *end = NULL;
        long v = strtol(field + 1, &end, 10);
        if (field[1] == '\0' || *end != '\0' || v <= 0 || v > 1000000) {
            fail_with_hint(hint, "model descriptor '%s': cannot read field '%s'", descriptor, field);
        }
        switch (field[0]) {
            case 'd': c->d_model = (int)v; break;
            case 'l': layers = (int)v; break;
            case 'n': c->rnn_heads = (int)v; break;
            case 'q': c->rnn_qk_heads = (int)v; break;
            case 'k': c->rnn_k = (int)v; break;
            case 'v': c->rnn_v = (int)v; break;
            case 'h': c->attn_heads = (int)v; break;
            case 'f': c->mlp_hidden = (int)v; break;
            default: fail_with_hint(hint, "model descriptor '%s': unknown field '%s'", descriptor, field);
        }
    }
    if (c->pattern[0] == '\0') {
        if (layers <= 0 || layers > MAX_LAYERS) { fail_with_hint(hint, "model descriptor '%s' gives no pattern and no layer count", descriptor); }
        memset(c->pattern, 'M', (size_t)layers);
        c->pattern[layers] = '\0';
    } else if (layers > 0 && layers != (int)strlen(c->pattern)) {
        fail_with_hint(hint, "model descriptor '%s': l%d does not match the %zu-letter pattern '%s'", descriptor, layers,
                       strlen(c->pattern), c->pattern);
    }
    if (c->d_model <= 0) { fail_with_hint(hint, "model descriptor '%s' gives no width (dNNN)", descriptor); }
}

// ----------------------------------------------------------------------------------------------------------------
// the parameter table

// Per-layer tensors, in buffer order. X(name, shape comment). Executors expand this into a struct of typed pointers
// whose field order equals the enum order, so the table can point the views by index.
#define PARAM_LAYER_FIELDS(X)                                                                                    \
    X(ln1_w)      /* (C) pre-mixer RMSNorm weight */                                                          \
    X(m_in_w)     /* (R, C) M2RNN input projection, rows q|k|v|f_raw|g */                                      \
    X(m_conv_w)   /* (CD, W) depthwise causal conv over the q|k|v channels */                                  \
    X(m_A_log)    /* (N) forget gate: alpha = exp(A_log) */                                                    \
    X(m_dt_bias)  /* (N) forget gate: beta */                                                                  \
    X(m_D)        /* (N, Vh) residual v ⊙ D */                                                                 \
    X(m_W)        /* (N, Vh, Vh) state transition, multiplies H from the right */                              \
    X(m_norm_w)   /* (N*Vh) RMSNorm over all heads' outputs */                                                 \
    X(m_out_w)    /* (C, N*Vh) output projection */                                                            \
    X(a_qkv_w)    /* (3*NH*HS, C) attention q|k|v projection */                                                \
    X(a_out_w)    /* (C, NH*HS) attention output projection */                                                 \
    X(ln2_w)      /* (C) pre-MLP RMSNorm weight */                                                             \
    X(mlp_up_w)   /* (2F, C) SwiGLU: rows [0,F) gate, [F,2F) up */                                             \
    X(mlp_down_w) /* (C, F) */

enum {
#define PARAM_ENUM(name) PK_##name,
    PARAM_LAYER_FIELDS(PARAM_ENUM)
#undef PARAM_ENUM
    NUM_LAYER_PARAM_KINDS,
    PK_wte = NUM_LAYER_PARAM_KINDS, // (Vp, C) token embedding
    PK_lnf_w,                       // (C) final RMSNorm weight
    PK_lm_head,                     // (Vp, C) untied LM head
};

// Executors keep typed views of the buffer in a struct laid out as an array of pointers: wte, lnf_w, lm_head, then
// for each of MAX_LAYERS layers its fields in PK_ order (a struct of the PARAM_LAYER_FIELDS pointers). This returns
// the slot of tensor (layer, kind) in such a struct, whatever the pointer type.
static inline void **model_view_slot(void *views, int layer, int kind) {
    void **p = (void **)views;
    if (layer < 0) { return &p[kind == PK_wte ? 0 : (kind == PK_lnf_w ? 1 : 2)]; }
    return &p[3 + (size_t)layer * NUM_LAYER_PARAM_KINDS + kind];
}

typedef enum { INIT_NORMAL, INIT_ONES, INIT_IDENTITY, INIT_A_LOG, INIT_DT_BIAS } InitRule;

typedef struct {
    char name[32];
    int layer;          // -1 for the embedding, final norm and LM head
    int kind;           // PK_*
    int ndim;
    size_t shape[3];
    size_t numel;
    size_t offset;      // in elements, into the one parameter buffer
    InitRule init;
    float init_std;     // for INIT_NORMAL
    int weight_decay;   // 1 if AdamW decays it
    size_t zero_rows_from; // rows >= this stay zero (vocab padding); == shape[0] otherwise
} ParamSpec;

#define MAX_PARAM_SPECS (3 + MAX_LAYERS * NUM_LAYER_PARAM_KINDS)

typedef struct {
    ParamSpec specs[MAX_PARAM_SPECS];
    int num_specs;
    size_t num_parameters; // elements of the one buffer, the alignment gaps between tensors included
} ParamTable;

static void param_table_add(ParamTable *t, const char *name, int layer, int kind, int ndim, size_t d0, size_t d1,
                            size_t d2, InitRule init, float std, int weight_decay) {
    ParamSpec *s = &t->specs[t->num_specs++];
    memset(s, 0, sizeof(*s));
    if (layer >= 0) { snprintf(s->name, sizeof(s->name), "layer%d.%s", layer, name); }
    else { snprintf(s->name, sizeof(s->name), "%s", name); }
    s->layer = layer;
    s->kind = kind;
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = ndim > 1 ? d1 : 1;
    s->shape[2] = ndim > 2 ? d2 : 1;
    s->numel = s->shape[0] * s->shape[1] * s->shape[2];
    // every tensor starts on a multiple of 8 elements (16 bytes of bf16): aligned operands for the GPU's matmuls;
    // the few gap elements stay zero
    t->num_parameters = (t->num_parameters + 7) / 8 * 8;
    s->offset = t->num_parameters;
    s->init = init;
    s->init_std = std;
    s->weight_decay = weight_decay;
    s->zero_rows_from = s->shape[0];
    t->num_parameters += s->numel;
}

// Builds the table for a validated config. Inits and the no-decay set follow spec m2rnn_authors_code.md §1/§6:
// N(0, 0.02) for projections, conv and embeddings; 0.02/sqrt(2L) for every output projection into the residual
// stream; ones for norms and D; identity W; A_log, dt_bias as Mamba-2. No weight decay on norms, A_log, dt_bias, D.
static void param_table_build(ParamTable *t, const ModelConfig *c) {
    memset(t, 0, sizeof(*t));
    const size_t C = (size_t)c->d_model, Vp = (size_t)c->padded_vocab_size;
    const float std = 0.02f, std_out = 0.02f / sqrtf(2.0f * (float)c->n_layer);
    param_table_add(t, "wte", -1, PK_wte, 2, Vp, C, 0, INIT_NORMAL, std, 1);
    t->specs[t->num_specs - 1].zero_rows_from = (size_t)c->vocab_size;
    for (int l = 0; l < c->n_layer; l++) {
        param_table_add(t, "ln1_w", l, PK_ln1_w, 1, C, 0, 0, INIT_ONES, 0, 0);
        if (c->pattern[l] == 'M') {
            const size_t N = (size_t)c->rnn_heads, Vh = (size_t)c->rnn_v;
            param_table_add(t, "m_in_w", l, PK_m_in_w, 2, (size_t)m2rnn_proj_rows(c), C, 0, INIT_NORMAL, std, 1);
            param_table_add(t, "m_conv_w", l, PK_m_conv_w, 2, (size_t)m2rnn_conv_dim(c), (size_t)c->conv_width, 0,
                            INIT_NORMAL, std, 1);
            param_table_add(t, "m_A_log", l, PK_m_A_log, 1, N, 0, 0, INIT_A_LOG, 0, 0);
            param_table_add(t, "m_dt_bias", l, PK_m_dt_bias, 1, N, 0, 0, INIT_DT_BIAS, 0, 0);
            param_table_add(t, "m_D", l, PK_m_D, 2, N, Vh, 0, INIT_ONES, 0, 0);
            param_table_add(t, "m_W", l, PK_m_W, 3, N, Vh, Vh, INIT_IDENTITY, 0, 1);
            param_table_add(t, "m_norm_w", l, PK_m_norm_w, 1, N * Vh, 0, 0, INIT_ONES, 0, 0);
            param_table_add(t, "m_out_w", l, PK_m_out_w, 2, C, N * Vh, 0, INIT_NORMAL, std_out, 1);
        } else { // 'A'
            const size_t inner = (size_t)c->attn_heads * (size_t)c->attn_head_dim;
            param_table_add(t, "a_qkv_w", l, PK_a_qkv_w, 2, 3 * inner, C, 0, INIT_NORMAL, std, 1);
            param_table_add(t, "a_out_w", l, PK_a_out_w, 2, C, inner, 0, INIT_NORMAL, std_out, 1);
        }
        param_table_add(t, "ln2_w", l, PK_ln2_w, 1, C, 0, 0, INIT_ONES, 0, 0);
        param_table_add(t, "mlp_up_w", l, PK_mlp_up_w, 2, 2 * (size_t)c->mlp_hidden, C, 0, INIT_NORMAL, std, 1);
        param_table_add(t, "mlp_down_w", l, PK_mlp_down_w, 2, C, (size_t)c->mlp_hidden, 0, INIT_NORMAL, std_out, 1);
    }
    param_table_add(t, "lnf_w", -1, PK_lnf_w, 1, C, 0, 0, INIT_ONES, 0, 0);
    param_table_add(t, "lm_head", -1, PK_lm_head, 2, Vp, C, 0, INIT_NORMAL, std, 1);
    t->specs[t->num_specs - 1].zero_rows_from = (size_t)c->vocab_size;
}

// the number of weights (the buffer's alignment gaps not counted)
static inline size_t param_table_count(const ParamTable *t) {
    size_t n = 0;
    for (int i = 0; i < t->num_specs; i++) { n += t->specs[i].numel; }
    return n;
}

// ----------------------------------------------------------------------------------------------------------------
// seeded init (host side, so every executor starts from the same numbers)

typedef struct { uint64_t state; } Rng;

static inline uint64_t rng_next_u64(Rng *r) { // splitmix64: tiny, fast, statistically sound for init and sampling
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
// uniform in (0, 1]: never 0, so log() of it is finite
static inline double rng_uniform(Rng *r) { return ((double)(rng_next_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0); }
static inline double rng_normal(Rng *r) { // Box-Muller, one draw per call
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// Writes the initial value of every parameter (fp32) into params (num_parameters; the alignment gaps get zero).
// Each tensor draws from its own stream (seed, tensor index), so adding a layer does not change the others' init.
static void model_init_parameters(float *params, const ParamTable *t, uint64_t seed) {
    memset(params, 0, t->num_parameters * sizeof(float));
    for (int i = 0; i < t->num_specs; i++) {
        const ParamSpec *s = &t->specs[i];
        float *p = params + s->offset;
        Rng rng = {seed * 0x100000001B3ULL + (uint64_t)i * 0x9E3779B97F4A7C15ULL};
        size_t row_len = s->numel / s->shape[0];
        for (size_t j = 0; j < s->numel; j++) {
            float v = 0.0f;
            switch (s->init) {
                case INIT_NORMAL: v = (float)(s->init_std * rng_normal(&rng)); break;
                case INIT_ONES: v = 1.0f; break;
                case INIT_IDENTITY: { // shape (N, Vh, Vh): identity per head
                    size_t within = j % (s->shape[1] * s->shape[2]);
                    v = (within / s->shape[2] == within % s->shape[2]) ? 1.0f : 0.0f;
                    break;
                }
                case INIT_A_LOG: v = (float)log(16.0 * rng_uniform(&rng)); break; // A ~ U(0, 16]
                case INIT_DT_BIAS: { // dt = exp(U(log 1e-3, log 1e-1)) clamped >= 1e-4; bias = softplus^-1(dt)
                    double dt = exp(log(1e-3) + rng_uniform(&rng) * (log(1e-1) - log(1e-3)));
                    if (dt < 1e-4) { dt = 1e-4; }
                    v = (float)(dt + log(-expm1(-dt)));
                    break;
                }
            }
            if (j / row_len >= s->zero_rows_from) { v = 0.0f; }
            p[j] = v;
        }
    }
}

// refuses token ids outside [0, vocab_size) with one line naming the position and the fix
static void model_check_tokens(const int *tokens, size_t n, int vocab_size, const char *what) {
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= vocab_size) {
            fail_with_hint("the data was tokenized with a larger vocabulary than the model's; check -e / the shards",
                           "%s token %d at position %zu is outside the model's vocabulary [0, %d)", what, tokens[i], i,
                           vocab_size);
        }
    }
}

// ----------------------------------------------------------------------------------------------------------------
// the optimizer's settings (the no-decay set comes from the parameter table)

typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
} OptimizerConfig;

// ----------------------------------------------------------------------------------------------------------------
// FLOPs for MFU: counted per token of a training step (forward + backward = 3x forward), including the parts a
// 6N estimate misses. Recurrence per step per head: H W (2·K·Vh²), k vᵀ add, tanh, gate (≈6·K·Vh), y = Hᵀq (2·K·Vh).
// Attention: QKᵀ and AV, causal so half of 4·T·HS per head per token. Conv: 2·W per channel.

static double model_flops_per_token(const ModelConfig *c, int T) {
    const double C = c->d_model, F = c->mlp_hidden;
    double fwd = 2.0 * C * c->padded_vocab_size; // LM head
    for (int l = 0; l < c->n_layer; l++) {
        fwd += 2.0 * C * 2.0 * F + 2.0 * F * C; // SwiGLU
        if (c->pattern[l] == 'M') {
            const double N = c->rnn_heads, K = c->rnn_k, Vh = c->rnn_v;
            fwd += 2.0 * C * m2rnn_proj_rows(c) + 2.0 * N * Vh * C;       // in / out projections
            fwd += 2.0 * c->conv_width * m2rnn_conv_dim(c);              // conv
            fwd += N * (2.0 * K * Vh * Vh + 6.0 * K * Vh + 2.0 * K * Vh); // recurrence
        } else {
            const double inner = (double)c->attn_heads * c->attn_head_dim;
            fwd += 2.0 * C * 3.0 * inner + 2.0 * inner * C;
            fwd += 2.0 * inner * (double)T; // QKᵀ + AV, causal: 4·T·inner/2
        }
    }
    return 3.0 * fwd;
}

#endif // M2RNN_MODEL_H
