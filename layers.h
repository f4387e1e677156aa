/*
layers.h: the layer kinds. A block is `x += Mixer(RMSNorm(x)); x += FeedForward(RMSNorm(x))`; the mixer and the
feed-forward of each layer are picked by a letter, and everything the model definition needs to know about a kind
lives in its row of the tables at the bottom of this file:

  letter | name | the descriptor fields it owns | defaults and validation of its sizes | its parameter tensors
  (shape, init, weight decay, tensor-parallel split) | forward FLOPs per token | decode state per sequence

Mixers (upper case, the layer pattern): M = M²RNN, A = softmax attention, R = RNN, U = GRU, G = Gated DeltaNet,
S = Mamba-2. Feed-forward kinds (lower case, `ffn=` in the descriptor): s = SwiGLU, e = mixture of experts.

Nothing here runs an op. The executors (ref/<kind>.h on the CPU, <kind>.cuh on the GPU) implement each kind behind
one small interface (ref/kinds.h, kinds.cuh); model.h builds the parameter table, the descriptor parser, the
checkpoint config and the FLOP count from these rows. A kind's parameters are listed once, in an X-macro
(<KIND>_PARAMS): the row's param function fills them in that order, and each executor declares its typed view of
them from the same list, so the two cannot disagree.

Adding a kind (README, "Adding a layer kind"): its config struct and member in ModelConfig, its _PARAMS list, its
functions and row below; ref/<kind>.h and <kind>.cuh with one line each in ref/kinds.h and kinds.cuh; its tests.
*/
#ifndef M2RNN_LAYERS_H
#define M2RNN_LAYERS_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "utils.h"

#define MAX_LAYERS 128
#define MAX_KIND_PARAMS 12 // tensors of one mixer or feed-forward
#define VOCAB_PAD_MULTIPLE 128

static inline int round_up(int x, int multiple) { return ((x + multiple - 1) / multiple) * multiple; }
// rounded to the nearest multiple of 8 (aligned projection rows for the GPU's matmuls), at least 1
static inline int round_heads8(double n) {
    const int n8 = 8 * (int)floor(n / 8.0 + 0.5);
    return n8 >= 8 ? n8 : (n >= 1 ? (int)n : 1);
}

// ----------------------------------------------------------------------------------------------------------------
// the model's sizes: global ones, then one struct per kind (each owned by its row below)

typedef struct {
    int heads;        // N: value heads, each with its own K×V state
    int qk_heads;     // Nq = Nk: 1 (shared by all N heads, as the paper) or N
    int k, v;         // K: rows of the state (key dim), V: columns (value dim)
    int conv;         // depthwise causal conv taps on q|k|v
    float grad_clamp; // elementwise clamp of the carried dH in the backward (0 = off)
    int group_norm;   // 1: the RMSNorm runs per q/k group (Nq groups of N/Nq heads: the paper's topology-aware TP
                      // model, with Nq = the TP size); 0: one RMSNorm over all N·V channels (the authors' layer)
    int tp_norm;      // (not a descriptor field) ranks the one RMSNorm spans: > 1 only in a tensor-parallel rank's
                      // local config, where it is RMSNormTP (the paper's topology-independent strategy)
} M2RNNConfig;

typedef struct {
    int heads, head_dim;
    int kv_heads;     // key/value heads: = heads (MHA, the default), or a divisor of it (GQA; 1 = MQA)
    int rope;         // 0 = NoPE (the paper's hybrids), 1 = RoPE
    float rope_theta;
} AttentionConfig;

typedef struct {      // the vector-valued baselines R (RNN) and U (GRU)
    int heads, head_dim;
    int conv;         // R: depthwise causal conv taps on u (U has no conv)
    int tp_norm;      // (not a descriptor field) ranks the RMSNorm over all heads spans (RMSNormTP when > 1)
} VecRNNConfig;

typedef struct {      // G: Gated DeltaNet
    int heads, k, v;  // H heads, each with a K×V state
    int conv;         // depthwise causal conv taps on q|k|v
    int neg;          // 1: GDN[−1,1], β = 2·sigmoid (eigenvalues of the transition in [−1, 1]); 0: β = sigmoid
} GDNConfig;

typedef struct {      // S: Mamba-2
    int expand;       // d_inner = expand · d, unless inner is given
    int inner;        // d_inner (derived from expand when 0; the paper's 410M baseline has 1216 = 64 heads of 19)
    int head_dim;     // P: d_inner / P heads
    int state;        // N: state size (columns of each head's P×N state)
    int groups;       // G: B and C groups (heads h uses group h / (H / G))
    int conv;         // depthwise causal conv taps on x|B|C (with a bias)
} Mamba2Config;

typedef struct {
    int hidden;       // F
} SwiGLUConfig;

typedef struct {      // e: mixture of SwiGLU experts
    int experts;      // E
    int top_k;        // K experts a token
    int hidden;       // F of each expert
    int shared;       // hidden size of the shared expert (0: none)
    float aux_coef;   // coefficient of the load-balancing loss (0 when unset: the default 0.001; negative: off)
} MoEConfig;

typedef struct {
    int vocab_size;          // V: real tokens (50257 for GPT-2)
    int padded_vocab_size;   // Vp: V rounded up to a multiple of 128 (derived); logits of the padding are never used
    int vocab_offset;        // (not a field) a tensor-parallel rank's local config (model_config_tp_local) holds the
                             // vocabulary rows vocab_offset .. + padded_vocab_size, of which vocab_size are real; 0
    int d_model;             // C
    int n_layer;             // L = strlen(pattern) (derived)
    char pattern[MAX_LAYERS + 1];     // mixer letter of each layer
    char ffn_pattern[MAX_LAYERS + 1]; // feed-forward letter of each layer ("" = all s)
    M2RNNConfig m2rnn;
    AttentionConfig attn;
    VecRNNConfig vrnn;
    GDNConfig gdn;
    Mamba2Config mamba2;
    SwiGLUConfig swiglu;
    MoEConfig moe;
} ModelConfig;

// ----------------------------------------------------------------------------------------------------------------
// what a row is made of

// A named size of the config: its checkpoint name, its descriptor key (NULL: not settable from a descriptor) and
// where it lives. The checkpoint stores every field by name, so a new field needs no header slot.
typedef enum { FIELD_INT, FIELD_FLOAT, FIELD_FLAG } FieldType;
typedef struct {
    const char *name;   // "m2rnn.heads"
    const char *key;    // "n" in "d256:MMAM:n16"
    FieldType type;
    size_t offset;      // in ModelConfig
    const char *help;
} ConfigField;
#define CFG_FIELD(name, key, type, member, help) {name, key, type, offsetof(ModelConfig, member), help}

// INIT_A_LOG: A ~ U(0, 16] (M²RNN, as the authors' code); INIT_A_LOG_1_16: A ~ U(1, 16) (Mamba-2's A_init_range,
// used by GDN and Mamba-2); A_log = log A. INIT_DT_BIAS: softplus⁻¹ of dt ~ logU[1e-3, 1e-1].
typedef enum { INIT_ZERO, INIT_NORMAL, INIT_ONES, INIT_IDENTITY, INIT_A_LOG, INIT_DT_BIAS, INIT_A_LOG_1_16 } InitRule;

// how a tensor is cut for tensor parallelism (Megatron's names; our weights are (out, in)):
//   REPLICATED   every rank holds all of it (norm weights of the residual stream)
//   COLUMN       dim 0 (output features, or heads for per-head tensors) split evenly
//   ROW          dim 1 (input features) split evenly: the output projections, whose partial sums are all-reduced
//   HEAD_GROUPS  dim 0 is a stack of segments (e.g. q|k|v|f|g), each split evenly, so every rank holds whole heads
typedef enum { SPLIT_REPLICATED, SPLIT_COLUMN, SPLIT_ROW, SPLIT_HEAD_GROUPS } SplitRule;
#define MAX_SEGMENTS 6

// One tensor of a kind, as its row's param function describes it (the table adds name prefix, layer and offset).
typedef struct {
    const char *name;   // "in_w": the field name of the executors' typed views
    int ndim;
    size_t shape[3];
    InitRule init;
    float std;          // INIT_NORMAL
    int decay;          // 1 if AdamW decays it
    SplitRule split;
    int nseg;           // HEAD_GROUPS: rows of each segment, summing to shape[0]
    size_t seg[MAX_SEGMENTS];
} ParamDef;

static inline ParamDef param_def(const char *name, int ndim, size_t d0, size_t d1, size_t d2, InitRule init,
                                 float std, int decay, SplitRule split) {
    ParamDef p;
    memset(&p, 0, sizeof(p));
    p.name = name;
    p.ndim = ndim;
    p.shape[0] = d0; p.shape[1] = ndim > 1 ? d1 : 1; p.shape[2] = ndim > 2 ? d2 : 1;
    p.init = init; p.std = std; p.decay = decay; p.split = split;
    return p;
}
// HEAD_GROUPS: the n segments' rows (size_t each)
static inline void param_segments(ParamDef *p, int n, ...) {
    va_list args;
    va_start(args, n);
    p->nseg = n;
    for (int i = 0; i < n; i++) { p->seg[i] = va_arg(args, size_t); }
    va_end(args);
}
// the kind's tensors are indexed by an enum made from its _PARAMS list, and named from it: PDEF(in_w, ...) fills
// slot P_in_w with name "in_w", so a tensor missing from the list does not compile
#define KIND_PARAM_ENUM(name) P_##name,
#define PDEF(name, ...) (p[P_##name] = param_def(#name, __VA_ARGS__))

typedef struct {
    char letter;
    const char *name;                 // "M2RNN"
    const char *summary;              // one line for usage texts
    const ConfigField *fields;        // the descriptor fields / config sizes it owns
    int num_fields;
    void (*fill_defaults)(ModelConfig *c);          // sizes left 0 (or < 0 for floats) get their defaults
    void (*validate)(const ModelConfig *c);         // refuses sizes it cannot run, with fail_with_hint
    int (*params)(const ModelConfig *c, ParamDef *p); // its tensors, in its _PARAMS order; returns the count
    double (*flops)(const ModelConfig *c, int T);   // forward FLOPs per token at sequence length T
    size_t (*decode_state)(const ModelConfig *c, int context); // numbers a sequence carries while decoding
    // tensor parallelism: c's sizes of this kind divided for one of tp ranks (its params() then give the rank's
    // shards, tp_shard_tensor cuts them); NULL, or why the kind cannot be split so (the caller fails with it)
    const char *(*tp_local)(ModelConfig *c, int tp);
} LayerKind;

// std of the output projections into the residual stream: 0.02/sqrt(2L) (spec m2rnn_authors_code.md §1)
static inline float std_out_of(const ModelConfig *c) { return 0.02f / sqrtf(2.0f * (float)c->n_layer); }
#define STD_IN 0.02f
#define DECAY 1
#define NO_DECAY 0

// ----------------------------------------------------------------------------------------------------------------
// M: M²RNN (spec m2rnn_authors_code.md §1; the executors' files hold the math)

#define M2RNN_PARAMS(X)                                                                                          \
    X(in_w)    /* (R, C) input projection, rows q (Nq·K) | k (Nq·K) | v (N·V) | f_raw (N) | g (N·V) */             \
    X(conv_w)  /* (CD, W) depthwise causal conv over the q|k|v channels, CD = 2·Nq·K + N·V */                     \
    X(A_log)   /* (N) forget gate: alpha = exp(A_log) */                                                         \
    X(dt_bias) /* (N) forget gate: softplus(f_raw + dt_bias) */                                                  \
    X(D)       /* (N, V) residual v ⊙ D */                                                                       \
    X(W)       /* (N, V, V) state transition, multiplies H from the right */                                     \
    X(norm_w)  /* (N·V) RMSNorm over all heads' outputs */                                                       \
    X(out_w)   /* (C, N·V) output projection */

static inline int m2rnn_proj_rows(const ModelConfig *c) {
    return 2 * c->m2rnn.qk_heads * c->m2rnn.k + 2 * c->m2rnn.heads * c->m2rnn.v + c->m2rnn.heads;
}
static inline int m2rnn_conv_dim(const ModelConfig *c) {
    return 2 * c->m2rnn.qk_heads * c->m2rnn.k + c->m2rnn.heads * c->m2rnn.v;
}

static const ConfigField M2RNN_FIELDS[] = {
    CFG_FIELD("m2rnn.heads", "n", FIELD_INT, m2rnn.heads, "M2RNN value heads N"),
    CFG_FIELD("m2rnn.qk_heads", "q", FIELD_INT, m2rnn.qk_heads, "M2RNN q/k heads (1 or N)"),
    CFG_FIELD("m2rnn.k", "k", FIELD_INT, m2rnn.k, "M2RNN K (state rows)"),
    CFG_FIELD("m2rnn.v", "v", FIELD_INT, m2rnn.v, "M2RNN V (state columns)"),
    CFG_FIELD("m2rnn.conv", NULL, FIELD_INT, m2rnn.conv, "M2RNN conv taps"),
    CFG_FIELD("m2rnn.grad_clamp", NULL, FIELD_FLOAT, m2rnn.grad_clamp, "M2RNN carried-dH clamp (-rc)"),
    CFG_FIELD("m2rnn.group_norm", "gn", FIELD_FLAG, m2rnn.group_norm,
              "M2RNN RMSNorm per q/k group (topology-aware TP: with qN, N = the TP size)"),
};

// K=64, V=16, Nq=1 as the paper; N so that the layer has about an attention layer's 4C² parameters, rounded to a
// multiple of 8 so the projection's 2·64 + 33·N rows are too: 80 at C=1024 (the paper used 84: pass n84)
static void m2rnn_fill_defaults(ModelConfig *c) {
    M2RNNConfig *m = &c->m2rnn;
    if (m->k <= 0) { m->k = 64; }
    if (m->v <= 0) { m->v = 16; }
    if (m->qk_heads <= 0) { m->qk_heads = 1; }
    if (m->conv <= 0) { m->conv = 4; }
    if (m->heads <= 0) { m->heads = round_heads8((4.0 * c->d_model - 2.0 * m->k) / (3.0 * m->v + 1.0)); }
    if (m->grad_clamp < 0) { m->grad_clamp = 1.0f; }
}

static void m2rnn_validate(const ModelConfig *c) {
    const M2RNNConfig *m = &c->m2rnn;
    if (m->k <= 0 || m->v <= 0 || m->heads <= 0 || m->conv <= 0 || m->conv > 16) {
        fail_with_hint("check the M2RNN sizes", "M2RNN sizes must be positive (K=%d V=%d N=%d conv=%d, conv <= 16)",
                       m->k, m->v, m->heads, m->conv);
    }
    if (2.0 * m->qk_heads * m->k + 3.0 * m->heads * m->v + m->heads > (1 << 26) || (double)m->k * m->v > (1 << 20)) {
        fail_with_hint("check the M2RNN sizes", "M2RNN sizes too large (N=%d Nq=%d K=%d V=%d)", m->heads, m->qk_heads,
                       m->k, m->v);
    }
    if (m->qk_heads < 1 || m->heads % m->qk_heads != 0) {
        fail_with_hint("set the q/k heads (q) to a divisor of the value heads (n): 1 (shared by all, the paper), the "
                       "TP size (topology-aware TP, with gn), or n",
                       "M2RNN q/k heads (%d) must divide the value heads (%d)", m->qk_heads, m->heads);
    }
}

// the RMSNorm's groups: Nq with group_norm (each q/k head's N/Nq value heads), else one over all heads
static inline int m2rnn_norm_groups(const ModelConfig *c) { return c->m2rnn.group_norm ? c->m2rnn.qk_heads : 1; }

// Inits and the no-decay set follow spec m2rnn_authors_code.md §1/§6: N(0, 0.02) projection and conv, depth-scaled
// output projection, identity W, D = 1, A_log and dt_bias as Mamba-2; no decay on A_log, dt_bias, D and the norm.
static int m2rnn_params(const ModelConfig *c, ParamDef *p) {
    enum { M2RNN_PARAMS(KIND_PARAM_ENUM) NUM };
    const size_t C = (size_t)c->d_model, N = (size_t)c->m2rnn.heads, V = (size_t)c->m2rnn.v;
    const size_t QK = (size_t)c->m2rnn.qk_heads * c->m2rnn.k, NV = N * V;
    PDEF(in_w, 2, (size_t)m2rnn_proj_rows(c), C, 0, INIT_NORMAL, STD_IN, DECAY, SPLIT_HEAD_GROUPS);
    param_segments(&p[P_in_w], 5, QK, QK, NV, N, NV);
    PDEF(conv_w, 2, (size_t)m2rnn_conv_dim(c), (size_t)c->m2rnn.conv, 0, INIT_NORMAL, STD_IN, DECAY, SPLIT_HEAD_GROUPS);
    param_segments(&p[P_conv_w], 3, QK, QK, NV);
    PDEF(A_log, 1, N, 0, 0, INIT_A_LOG, 0, NO_DECAY, SPLIT_COLUMN);
    PDEF(dt_bias, 1, N, 0, 0, INIT_DT_BIAS, 0, NO_DECAY, SPLIT_COLUMN);
    PDEF(D, 2, N, V, 0, INIT_ONES, 0, NO_DECAY, SPLIT_COLUMN);
    PDEF(W, 3, N, V, V, INIT_IDENTITY, 0, DECAY, SPLIT_COLUMN);
    PDEF(norm_w, 1, NV, 0, 0, INIT_ONES, 0, NO_DECAY, SPLIT_COLUMN); // over all heads: RMSNormTP under TP
    PDEF(out_w, 2, C, NV, 0, INIT_NORMAL, std_out_of(c), DECAY, SPLIT_ROW);
    return NUM;
}

// in / out projections, conv, and per head per token the recurrence: H W (2·K·V²), k vᵀ, tanh, gate (≈6·K·V),
// y = Hᵀq (2·K·V)
static double m2rnn_flops(const ModelConfig *c, int T) {
    const double C = c->d_model, N = c->m2rnn.heads, K = c->m2rnn.k, V = c->m2rnn.v;
    return 2.0 * C * m2rnn_proj_rows(c) + 2.0 * N * V * C + 2.0 * c->m2rnn.conv * m2rnn_conv_dim(c) +
           N * (2.0 * K * V * V + 6.0 * K * V + 2.0 * K * V);
}

// the conv's last W−1 inputs and the K×V state of every head
static size_t m2rnn_decode_state(const ModelConfig *c, int context) {
    return (size_t)(c->m2rnn.conv - 1) * m2rnn_conv_dim(c) + (size_t)c->m2rnn.heads * c->m2rnn.k * c->m2rnn.v;
}

// ----------------------------------------------------------------------------------------------------------------
// A: causal softmax attention (NoPE, or RoPE with `rope`); GQA when kv_heads (NKV) < heads (NH): query head h
// reads kv head h / (NH / NKV)

#define ATTENTION_PARAMS(X)                                                                                      \
    X(qkv_w) /* ((NH + 2·NKV)·HS, C) rows q (NH·HS) | k (NKV·HS) | v (NKV·HS), heads contiguous inside each */  \
    X(out_w) /* (C, NH·HS) */

static const ConfigField ATTENTION_FIELDS[] = {
    CFG_FIELD("attn.heads", "h", FIELD_INT, attn.heads, "attention heads"),
    CFG_FIELD("attn.head_dim", NULL, FIELD_INT, attn.head_dim, "attention head dim"),
    CFG_FIELD("attn.kv_heads", "hk", FIELD_INT, attn.kv_heads, "attention key/value heads (GQA; default: the heads)"),
    CFG_FIELD("attn.rope", "rope", FIELD_FLAG, attn.rope, "RoPE in attention"),
    CFG_FIELD("attn.rope_theta", NULL, FIELD_FLOAT, attn.rope_theta, "RoPE base"),
};

static void attention_fill_defaults(ModelConfig *c) {
    AttentionConfig *a = &c->attn;
    if (a->head_dim <= 0) { a->head_dim = c->d_model >= 64 ? 64 : (c->d_model > 0 ? c->d_model : 1); }
    if (a->heads <= 0) { a->heads = c->d_model / a->head_dim > 0 ? c->d_model / a->head_dim : 1; }
    if (a->kv_heads <= 0) { a->kv_heads = a->heads; }
    if (a->rope_theta <= 0) { a->rope_theta = 10000.0f; }
}

static void attention_validate(const ModelConfig *c) {
    if (c->attn.heads <= 0 || c->attn.head_dim <= 0 || (double)c->attn.heads * c->attn.head_dim > (1 << 24)) {
        fail_with_hint("check the attention sizes", "attention needs heads > 0 and head dim > 0, and not %d x %d",
                       c->attn.heads, c->attn.head_dim);
    }
    if (c->attn.kv_heads <= 0 || c->attn.heads % c->attn.kv_heads != 0) {
        fail_with_hint("use kv heads (hk) that divide the heads (h): e.g. h16 with hk 1, 2, 4, 8 or 16",
                       "attention: %d kv heads do not divide %d heads", c->attn.kv_heads, c->attn.heads);
    }
    if (c->attn.head_dim % 2 != 0) { // RoPE rotates pairs (i, i + HS/2); the GPU kernels move heads in such pairs
        fail_with_hint("use an even attention head dim", "attention head dim must be even, got %d", c->attn.head_dim);
    }
}

static int attention_params(const ModelConfig *c, ParamDef *p) {
    enum { ATTENTION_PARAMS(KIND_PARAM_ENUM) NUM };
    const size_t C = (size_t)c->d_model, inner = (size_t)c->attn.heads * c->attn.head_dim;
    const size_t kv = (size_t)c->attn.kv_heads * c->attn.head_dim;
    PDEF(qkv_w, 2, inner + 2 * kv, C, 0, INIT_NORMAL, STD_IN, DECAY, SPLIT_HEAD_GROUPS);
    param_segments(&p[P_qkv_w], 3, inner, kv, kv);
    PDEF(out_w, 2, C, inner, 0, INIT_NORMAL, std_out_of(c), DECAY, SPLIT_ROW);
    return NUM;
}

// projections, and q kᵀ and att·v over the causal past: 4·T·inner / 2 per token on average
static double attention_flops(const ModelConfig *c, int T) {
    const double C = c->d_model, inner = (double)c->attn.heads * c->attn.head_dim;
    const double kv = (double)c->attn.kv_heads * c->attn.head_dim;
    return 2.0 * C * (inner + 2.0 * kv) + 2.0 * inner * C + 2.0 * inner * (double)T;
}

// the K and V cache, (context, NKV·HS) each: grows with the context
static size_t attention_decode_state(const ModelConfig *c, int context) {
    return 2 * (size_t)context * c->attn.kv_heads * c->attn.head_dim;
}

// ----------------------------------------------------------------------------------------------------------------
// R and U: the vector-valued baselines of the paper's state-size ablation (spec other_mixers.md). The paper gives
// no more than "RNN: h_t = tanh(h_{t−1} W + u_t) with the M²RNN forget gate, projections, SiLU(g) gate and RMSNorm
// as in the M²RNN layer" and "GRU: one extra gate projection, ≈16% more parameters"; the variants chosen here:
//   R: the M²RNN layer with the outer product removed (K = 1, k = q = 1): rows u (N·V) | f_raw (N) | g (N·V);
//      u = SiLU(conv4(u_raw)); f = exp(−exp(A_log)·softplus(f_raw + dt_bias)); h_t = f h_{t−1} + (1 − f)
//      tanh(h_{t−1} W + u_t); y = h_t + u_t ⊙ D; RMSNorm(y ⊙ SiLU(g)) over N·V; out projection. W identity init.
//   U: a standard GRU per head (no biases, no conv; z is its forget gate, so no f row): rows r | z | n | g (N·V
//      each); r = σ(x_r + h U_r), z = σ(x_z + h U_z), n = tanh(x_n + r ⊙ (h U_n)), h_t = (1 − z) ⊙ n + z ⊙ h_{t−1};
//      RMSNorm(h_t ⊙ SiLU(g)) over N·V; out projection. U_n identity (as the RNN's W), U_r, U_z ~ N(0, 1/V).
// At the 410M shape (85 heads of 16, state 1,360) that is 4.30M parameters per RNN layer (M²RNN: 4.38M) and +2.79M
// per layer for the GRU: 410M − 2M and +16%, the paper's 406M and 474M.

#define RNN_PARAMS(X)                                                                                            \
    X(in_w)    /* (2·N·V + N, C) rows u | f_raw | g */                                                           \
    X(conv_w)  /* (N·V, W) depthwise causal conv over u */                                                       \
    X(A_log)   /* (N) */                                                                                         \
    X(dt_bias) /* (N) */                                                                                         \
    X(D)       /* (N, V) residual u ⊙ D */                                                                       \
    X(W)       /* (N, V, V) recurrent matrix, multiplies h from the right */                                     \
    X(norm_w)  /* (N·V) */                                                                                       \
    X(out_w)   /* (C, N·V) */

#define GRU_PARAMS(X)                                                                                            \
    X(in_w)   /* (4·N·V, C) rows x_r | x_z | x_n | g */                                                          \
    X(U_r)    /* (N, V, V) reset gate, multiplies h from the right */                                            \
    X(U_z)    /* (N, V, V) update gate */                                                                        \
    X(U_n)    /* (N, V, V) candidate */                                                                          \
    X(norm_w) /* (N·V) */                                                                                        \
    X(out_w)  /* (C, N·V) */

#define VRNN_MAX_HEAD_DIM 32 // the GPU kernels hold a head's channels in one warp (the paper uses 16)

static const ConfigField VECRNN_FIELDS[] = {
    CFG_FIELD("vrnn.heads", "rh", FIELD_INT, vrnn.heads, "RNN/GRU heads"),
    CFG_FIELD("vrnn.head_dim", "rv", FIELD_INT, vrnn.head_dim, "RNN/GRU head size"),
    CFG_FIELD("vrnn.conv", NULL, FIELD_INT, vrnn.conv, "RNN conv taps"),
};

// head size 16 as the paper; heads so that an RNN layer has about 4C² parameters, rounded to a multiple of 8
// (80 at C=1024; the paper's RNN-406M had 85: pass rh85)
static void vecrnn_fill_defaults(ModelConfig *c) {
    VecRNNConfig *r = &c->vrnn;
    if (r->head_dim <= 0) { r->head_dim = 16; }
    if (r->conv <= 0) { r->conv = 4; }
    if (r->heads <= 0) { r->heads = round_heads8(4.0 * c->d_model / (3.0 * r->head_dim + 1.0)); }
}

static void vecrnn_validate(const ModelConfig *c) {
    const VecRNNConfig *r = &c->vrnn;
    if (r->heads <= 0 || r->heads > (1 << 20) || r->head_dim <= 0 || r->head_dim > VRNN_MAX_HEAD_DIM || r->conv <= 0 ||
        r->conv > 16) {
        fail_with_hint("check the RNN/GRU sizes (rhNN heads, rvNN head size <= 32)",
                       "RNN/GRU sizes out of range (heads=%d head size=%d conv=%d)", r->heads, r->head_dim, r->conv);
    }
}

static int rnn_params(const ModelConfig *c, ParamDef *p) {
    enum { RNN_PARAMS(KIND_PARAM_ENUM) NUM };
    const size_t C = (size_t)c->d_model, N = (size_t)c->vrnn.heads, V = (size_t)c->vrnn.head_dim, NV = N * V;
    PDEF(in_w, 2, 2 * NV + N, C, 0, INIT_NORMAL, STD_IN, DECAY, SPLIT_HEAD_GROUPS);
    param_segments(&p[P_in_w], 3, NV, N, NV);
    PDEF(conv_w, 2, NV, (size_t)c->vrnn.conv, 0, INIT_NORMAL, STD_IN, DECAY, SPLIT_COLUMN);
    PDEF(A_log, 1, N, 0, 0, INIT_A_LOG, 0, NO_DECAY, SPLIT_COLUMN);
    PDEF(dt_bias, 1, N, 0, 0, INIT_DT_BIAS, 0, NO_DECAY, SPLIT_COLUMN);
    PDEF(D, 2, N, V, 0, INIT_ONES, 0, NO_DECAY, SPLIT_COLUMN);
    PDEF(W, 3, N, V, V, INIT_IDENTITY, 0, DECAY, SPLIT_COLUMN);
    PDEF(norm_w, 1, NV, 0, 0, INIT_ONES, 0, NO_DECAY, SPLIT_COLUMN);
    PDEF(out_w, 2, C, NV, 0, INIT_NORMAL, std_out_of(c), DECAY, SPLIT_ROW);
    return NUM;
}

static double rnn_flops(const ModelConfig *c, int T) {
    const double C = c->d_model, N = c->vrnn.heads, V = c->vrnn.head_dim;
    return 2.0 * C * (2.0 * N * V + N) + 2.0 * N * V * C + 2.0 * c->vrnn.conv * N * V + N * (2.0 * V * V + 8.0 * V);
}

static size_t rnn_decode_state(const ModelConfig *c, int context) {
    return (size_t)(c->vrnn.conv - 1) * c->vrnn.heads * c->vrnn.head_dim + (size_t)c->vrnn.heads * c->vrnn.head_dim;
}

static int gru_params(const ModelConfig *c, ParamDef *p) {
    enum { GRU_PARAMS(KIND_PARAM_ENUM) NUM };
    const size_t C = (size_t)c->d_model, N = (size_t)c->vrnn.heads, V = (size_t)c->vrnn.head_dim, NV = N * V;
    PDEF(in_w, 2, 4 * NV, C, 0, INIT_NORMAL, STD_IN, DECAY, SPLIT_HEAD_GROUPS);
    param_segments(&p[P_in_w], 4, NV, NV, NV, NV);
    PDEF(U_r, 3, N, V, V, INIT_NORMAL, 1.0f / sqrtf((float)V), DECAY, SPLIT_COLUMN);
    PDEF(U_z, 3, N, V, V, INIT_NORMAL, 1.0f / sqrtf((float)V), DECAY, SPLIT_COLUMN);
    PDEF(U_n, 3, N, V, V, INIT_IDENTITY, 0, DECAY, SPLIT_COLUMN);
    PDEF(norm_w, 1, NV, 0, 0, INIT_ONES, 0, NO_DECAY, SPLIT_COLUMN);
    PDEF(out_w, 2, C, NV, 0, INIT_NORMAL, std_out_of(c), DECAY, SPLIT_ROW);
    return NUM;
}

static double gru_flops(const ModelConfig *c, int T) {
    const double C = c->d_model, N = c->vrnn.heads, V = c->vrnn.head_dim;
    return 2.0 * C * 4.0 * N * V + 2.0 * N * V * C + N * (3.0 * 2.0 * V * V + 12.0 * V);
}

static size_t gru_decode_state(const ModelConfig *c, int context) { return (size_t)c->vrnn.heads * c->vrnn.head_dim; }

// ----------------------------------------------------------------------------------------------------------------
// G: Gated DeltaNet (spec other_mixers.md; fla's GatedDeltaNet layer without its short-conv biases)
//   proj = x W_inᵀ, rows q (H·K) | k (H·K) | v (H·V) | g (H·V) | b (H) | a (H); q, k, v = SiLU(conv4(·));
//   q, k L2-normalised per head (eps 1e-6); β = sigmoid(b) (GDN[−1,1]: 2·sigmoid(b));
//   α = exp(−exp(A_log)·softplus(a + dt_bias)); per head S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,
//   o_t = S_tᵀ q_t / sqrt(K); o ← RMSNorm over each head's V channels (one weight of V shared by the heads, as fla's
//   FusedRMSNormGated) ⊙ SiLU(g); out = o W_outᵀ. A_log, dt_bias as Mamba-2 (A ~ U(1, 16)).

#define GDN_PARAMS(X)                                                                                            \
    X(in_w)    /* (2·H·K + 2·H·V + 2·H, C) rows q | k | v | g | b | a */                                         \
    X(conv_w)  /* (2·H·K + H·V, W) depthwise causal conv over q|k|v */                                           \
    X(A_log)   /* (H) */                                                                                         \
    X(dt_bias) /* (H) */                                                                                         \
    X(norm_w)  /* (V) per-head RMSNorm weight, shared by the heads */                                            \
    X(out_w)   /* (C, H·V) */

static const ConfigField GDN_FIELDS[] = {
    CFG_FIELD("gdn.heads", "gh", FIELD_INT, gdn.heads, "GDN heads"),
    CFG_FIELD("gdn.k", "gk", FIELD_INT, gdn.k, "GDN key dim K"),
    CFG_FIELD("gdn.v", "gv", FIELD_INT, gdn.v, "GDN value dim V"),
    CFG_FIELD("gdn.conv", NULL, FIELD_INT, gdn.conv, "GDN conv taps"),
    CFG_FIELD("gdn.neg", "gneg", FIELD_FLAG, gdn.neg, "GDN[-1,1]: beta = 2 sigmoid"),
};

static inline int gdn_proj_rows(const ModelConfig *c) {
    return 2 * c->gdn.heads * c->gdn.k + 2 * c->gdn.heads * c->gdn.v + 2 * c->gdn.heads;
}
static inline int gdn_conv_dim(const ModelConfig *c) { return 2 * c->gdn.heads * c->gdn.k + c->gdn.heads * c->gdn.v; }

// the paper's 410M layer at d = 1024: 2 heads, K = d/4 = 256, V = 2K = 512
static void gdn_fill_defaults(ModelConfig *c) {
    GDNConfig *g = &c->gdn;
    if (g->heads <= 0) { g->heads = 2; }
    if (g->k <= 0) { g->k = c->d_model >= 32 ? round_up(c->d_model / 4, 8) : 8; }
    if (g->v <= 0) { g->v = 2 * g->k; }
    if (g->conv <= 0) { g->conv = 4; }
}

static void gdn_validate(const ModelConfig *c) {
    const GDNConfig *g = &c->gdn;
    if (g->heads <= 0 || g->k <= 0 || g->v <= 0 || (double)g->heads * g->k * g->v > (1 << 26) || g->conv <= 0 ||
        g->conv > 16) {
        fail_with_hint("check the GDN sizes (ghNN heads, gkNN, gvNN)", "GDN sizes out of range (heads=%d K=%d V=%d "
                       "conv=%d)", g->heads, g->k, g->v, g->conv);
    }
}

static int gdn_params(const ModelConfig *c, ParamDef *p) {
    enum { GDN_PARAMS(KIND_PARAM_ENUM) NUM };
    const size_t C = (size_t)c->d_model, H = (size_t)c->gdn.heads, HK = H * c->gdn.k, HV = H * c->gdn.v;
    PDEF(in_w, 2, (size_t)gdn_proj_rows(c), C, 0, INIT_NORMAL, STD_IN, DECAY, SPLIT_HEAD_GROUPS);
    param_segments(&p[P_in_w], 6, HK, HK, HV, HV, H, H);
    PDEF(conv_w, 2, (size_t)gdn_conv_dim(c), (size_t)c->gdn.conv, 0, INIT_NORMAL, STD_IN, DECAY, SPLIT_HEAD_GROUPS);
    param_segments(&p[P_conv_w], 3, HK, HK, HV);
    PDEF(A_log, 1, H, 0, 0, INIT_A_LOG_1_16, 0, NO_DECAY, SPLIT_COLUMN);
    PDEF(dt_bias, 1, H, 0, 0, INIT_DT_BIAS, 0, NO_DECAY, SPLIT_COLUMN);
    PDEF(norm_w, 1, (size_t)c->gdn.v, 0, 0, INIT_ONES, 0, NO_DECAY, SPLIT_REPLICATED);
    PDEF(out_w, 2, C, HV, 0, INIT_NORMAL, std_out_of(c), DECAY, SPLIT_ROW);
    return NUM;
}

// projections, conv, and the delta rule per token and head: decay, Sᵀk, the rank-1 update, Sᵀq (≈ 8·K·V)
static double gdn_flops(const ModelConfig *c, int T) {
    const double C = c->d_model, H = c->gdn.heads, K = c->gdn.k, V = c->gdn.v;
    return 2.0 * C * gdn_proj_rows(c) + 2.0 * H * V * C + 2.0 * c->gdn.conv * gdn_conv_dim(c) + H * 8.0 * K * V;
}

// the conv's last W−1 inputs and each head's K×V state
static size_t gdn_decode_state(const ModelConfig *c, int context) {
    return (size_t)(c->gdn.conv - 1) * gdn_conv_dim(c) + (size_t)c->gdn.heads * c->gdn.k * c->gdn.v;
}

// ----------------------------------------------------------------------------------------------------------------
// S: Mamba-2 (spec other_mixers.md; mamba_ssm's Mamba2 layer, one RMSNormGated group per B/C group)
//   DI = expand·d (or `inner`), H = DI / P; proj rows z (DI) | x (DI) | B (G·N) | C (G·N) | dt (H); x|B|C = SiLU(conv4(·) + bias);
//   dt = softplus(dt_raw + dt_bias), A = −exp(A_log); per head h ∈ R^{P×N}: h_t = exp(dt_t A) h_{t−1} + dt_t x_t B_tᵀ,
//   y_t = h_t C_t + D x_t (head h reads group h / (H/G) of B and C); y ← RMSNorm(y ⊙ SiLU(z)) over DI (gate before
//   the norm); out = y W_outᵀ. A ~ U(1, 16), dt_bias as Mamba-2, D = 1; the conv bias starts at zero (our choice:
//   mamba_ssm keeps PyTorch's default uniform init there).

#define MAMBA2_PARAMS(X)                                                                                         \
    X(in_w)    /* (2·DI + 2·G·N + H, C) rows z | x | B | C | dt */                                               \
    X(conv_w)  /* (DI + 2·G·N, W) depthwise causal conv over x|B|C */                                            \
    X(conv_b)  /* (DI + 2·G·N) its bias */                                                                        \
    X(A_log)   /* (H) */                                                                                         \
    X(dt_bias) /* (H) */                                                                                         \
    X(D)       /* (H) skip y += D x */                                                                           \
    X(norm_w)  /* (DI) */                                                                                        \
    X(out_w)   /* (C, DI) */

static const ConfigField MAMBA2_FIELDS[] = {
    CFG_FIELD("mamba2.expand", "se", FIELD_INT, mamba2.expand, "Mamba-2 expand (d_inner = expand d)"),
    CFG_FIELD("mamba2.inner", "si", FIELD_INT, mamba2.inner, "Mamba-2 d_inner (overrides expand)"),
    CFG_FIELD("mamba2.head_dim", "sp", FIELD_INT, mamba2.head_dim, "Mamba-2 head dim P"),
    CFG_FIELD("mamba2.state", "sn", FIELD_INT, mamba2.state, "Mamba-2 state size N"),
    CFG_FIELD("mamba2.groups", "sg", FIELD_INT, mamba2.groups, "Mamba-2 B/C groups G"),
    CFG_FIELD("mamba2.conv", NULL, FIELD_INT, mamba2.conv, "Mamba-2 conv taps"),
};

static inline int mamba2_inner(const ModelConfig *c) { return c->mamba2.inner; }
static inline int mamba2_heads(const ModelConfig *c) { return mamba2_inner(c) / c->mamba2.head_dim; }
static inline int mamba2_conv_dim(const ModelConfig *c) {
    return mamba2_inner(c) + 2 * c->mamba2.groups * c->mamba2.state;
}
static inline int mamba2_proj_rows(const ModelConfig *c) {
    return mamba2_inner(c) + mamba2_conv_dim(c) + mamba2_heads(c);
}

// mamba_ssm's defaults: expand 2, head dim 64, state 128, one group
static void mamba2_fill_defaults(ModelConfig *c) {
    Mamba2Config *m = &c->mamba2;
    if (m->expand <= 0) { m->expand = 2; }
    if (m->inner <= 0) { m->inner = m->expand * c->d_model; }
    if (m->head_dim <= 0) { m->head_dim = m->inner % 64 == 0 ? 64 : m->inner; }
    if (m->state <= 0) { m->state = c->d_model >= 128 ? 128 : 8; }
    if (m->groups <= 0) { m->groups = 1; }
    if (m->conv <= 0) { m->conv = 4; }
}

static void mamba2_validate(const ModelConfig *c) {
    const Mamba2Config *m = &c->mamba2;
    if (m->expand <= 0 || m->expand > 16 || m->inner <= 0 || m->inner > (1 << 20) || m->head_dim <= 0 ||
        m->state <= 0 || m->state > 4096 || m->groups <= 0 || m->conv <= 0 || m->conv > 16) {
        fail_with_hint("check the Mamba-2 sizes (seNN expand or siNN inner, spNN head dim, snNN state, sgNN groups)",
                       "Mamba-2 sizes out of range (inner=%d P=%d N=%d G=%d conv=%d)", m->inner, m->head_dim,
                       m->state, m->groups, m->conv);
    }
    const int di = mamba2_inner(c);
    if (di % m->head_dim != 0 || (di / m->head_dim) % m->groups != 0) {
        fail_with_hint("pick a head dim (sp) dividing d_inner and groups (sg) dividing the heads",
                       "Mamba-2: d_inner %d, head dim %d, groups %d do not divide", di, m->head_dim, m->groups);
    }
}

static int mamba2_params(const ModelConfig *c, ParamDef *p) {
    enum { MAMBA2_PARAMS(KIND_PARAM_ENUM) NUM };
    const size_t C = (size_t)c->d_model, DI = (size_t)mamba2_inner(c), H = (size_t)mamba2_heads(c);
    const size_t GN = (size_t)c->mamba2.groups * c->mamba2.state;
    PDEF(in_w, 2, (size_t)mamba2_proj_rows(c), C, 0, INIT_NORMAL, STD_IN, DECAY, SPLIT_HEAD_GROUPS);
    param_segments(&p[P_in_w], 5, DI, DI, GN, GN, H);
    PDEF(conv_w, 2, (size_t)mamba2_conv_dim(c), (size_t)c->mamba2.conv, 0, INIT_NORMAL, STD_IN, DECAY,
         SPLIT_HEAD_GROUPS);
    param_segments(&p[P_conv_w], 3, DI, GN, GN);
    PDEF(conv_b, 1, (size_t)mamba2_conv_dim(c), 0, 0, INIT_ZERO, 0, NO_DECAY, SPLIT_HEAD_GROUPS);
    param_segments(&p[P_conv_b], 3, DI, GN, GN);
    PDEF(A_log, 1, H, 0, 0, INIT_A_LOG_1_16, 0, NO_DECAY, SPLIT_COLUMN);
    PDEF(dt_bias, 1, H, 0, 0, INIT_DT_BIAS, 0, NO_DECAY, SPLIT_COLUMN);
    PDEF(D, 1, H, 0, 0, INIT_ONES, 0, NO_DECAY, SPLIT_COLUMN);
    PDEF(norm_w, 1, DI, 0, 0, INIT_ONES, 0, NO_DECAY, SPLIT_COLUMN);
    PDEF(out_w, 2, C, DI, 0, INIT_NORMAL, std_out_of(c), DECAY, SPLIT_ROW);
    return NUM;
}

// projections, conv, and per token and head the decay, dt·x Bᵀ and h C over the P×N state (≈ 6·P·N)
static double mamba2_flops(const ModelConfig *c, int T) {
    const double C = c->d_model, DI = mamba2_inner(c), N = c->mamba2.state;
    return 2.0 * C * mamba2_proj_rows(c) + 2.0 * DI * C + 2.0 * c->mamba2.conv * mamba2_conv_dim(c) + 6.0 * DI * N;
}

// the conv's last W−1 inputs and each head's P×N state
static size_t mamba2_decode_state(const ModelConfig *c, int context) {
    return (size_t)(c->mamba2.conv - 1) * mamba2_conv_dim(c) + (size_t)mamba2_inner(c) * c->mamba2.state;
}

// ----------------------------------------------------------------------------------------------------------------
// s: SwiGLU feed-forward: up = x W_upᵀ (rows gate | up), h = SiLU(gate) ⊙ up, out = h W_downᵀ

#define SWIGLU_PARAMS(X)                                                                                         \
    X(up_w)   /* (2F, C) rows [0,F) gate, [F,2F) up */                                                           \
    X(down_w) /* (C, F) */

static const ConfigField SWIGLU_FIELDS[] = {
    CFG_FIELD("swiglu.hidden", "f", FIELD_INT, swiglu.hidden, "SwiGLU hidden size F"),
};

// 8C/3 rounded up to 64 (2752 at C=1024, as the paper)
static void swiglu_fill_defaults(ModelConfig *c) {
    if (c->swiglu.hidden <= 0) { c->swiglu.hidden = round_up((8 * c->d_model + 2) / 3, 64); }
}
static void swiglu_validate(const ModelConfig *c) {
    if (c->swiglu.hidden <= 0 || c->swiglu.hidden > (1 << 24)) {
        fail_with_hint("check the MLP size", "MLP hidden size must be in [1, 2^24], got %d", c->swiglu.hidden);
    }
}
static int swiglu_params(const ModelConfig *c, ParamDef *p) {
    enum { SWIGLU_PARAMS(KIND_PARAM_ENUM) NUM };
    const size_t C = (size_t)c->d_model, F = (size_t)c->swiglu.hidden;
    PDEF(up_w, 2, 2 * F, C, 0, INIT_NORMAL, STD_IN, DECAY, SPLIT_HEAD_GROUPS);
    param_segments(&p[P_up_w], 2, F, F);
    PDEF(down_w, 2, C, F, 0, INIT_NORMAL, std_out_of(c), DECAY, SPLIT_ROW);
    return NUM;
}
static double swiglu_flops(const ModelConfig *c, int T) {
    const double C = c->d_model, F = c->swiglu.hidden;
    return 2.0 * C * 2.0 * F + 2.0 * F * C;
}
static size_t no_decode_state(const ModelConfig *c, int context) { return 0; }

// ----------------------------------------------------------------------------------------------------------------
// e: mixture of SwiGLU experts (the paper's 7B shape: 128 experts of 256, top-8, a shared expert of 1024; spec
// m2rnn_authors_code.md §3): router logits r = x W_rᵀ (no bias); the K largest logits (ties to the lower expert)
// weighted by the softmax over those K ("normalized top-k": the softmax probabilities of the K renormalized); each
// expert a SwiGLU; out = Σ_k w_k expert_k(x) + shared(x) (the shared expert ungated). Load balancing (switch style,
// as the authors' framework): aux = coef · E · Σ_e P̄_e f_e with P̄_e the mean over the batch's tokens of the full
// softmax probability of e and f_e the fraction of the batch's T·K assignments that went to e (no gradient through
// f); each MoE layer's aux adds to the training loss (xa < 0 switches it off). Active parameters (MFU, tokens/s): the router, K experts and
// the shared expert; moe_flops counts those.

#define MOE_PARAMS(X)                                                                                            \
    X(router_w)    /* (E, C) */                                                                                  \
    X(up_w)        /* (E, 2F, C) per expert rows gate | linear */                                                \
    X(down_w)      /* (E, C, F) */                                                                               \
    X(shared_up_w) /* (2S, C) the shared expert (S = 0: empty) */                                                \
    X(shared_down_w) /* (C, S) */

static const ConfigField MOE_FIELDS[] = {
    CFG_FIELD("moe.experts", "xe", FIELD_INT, moe.experts, "MoE experts E"),
    CFG_FIELD("moe.top_k", "xk", FIELD_INT, moe.top_k, "MoE experts a token (top-k)"),
    CFG_FIELD("moe.hidden", "xf", FIELD_INT, moe.hidden, "MoE expert hidden size"),
    CFG_FIELD("moe.shared", "xs", FIELD_INT, moe.shared, "MoE shared expert hidden size (0 = none)"),
    CFG_FIELD("moe.aux_coef", "xa", FIELD_FLOAT, moe.aux_coef, "MoE load-balancing loss coefficient (negative: off)"),
};

// 8 experts, top-2, each expert as large as the dense SwiGLU divided by K (the active FLOPs of the dense model), no
// shared expert; the paper's 7B: xe128:xk8:xf256:xs1024
static void moe_fill_defaults(ModelConfig *c) {
    MoEConfig *m = &c->moe;
    if (m->experts <= 0) { m->experts = 8; }
    if (m->top_k <= 0) { m->top_k = m->experts >= 2 ? 2 : 1; }
    if (m->hidden <= 0) { m->hidden = round_up((8 * c->d_model + 2) / 3 / m->top_k, 64); }
    if (m->shared < 0) { m->shared = 0; }
    if (m->aux_coef == 0) { m->aux_coef = 0.001f; }
}

static void moe_validate(const ModelConfig *c) {
    const MoEConfig *m = &c->moe;
    if (m->experts < 1 || m->experts > 4096 || m->top_k < 1 || m->top_k > m->experts || m->top_k > 64 ||
        m->hidden < 1 || m->hidden > (1 << 20) || m->shared < 0 || m->shared > (1 << 20) || m->aux_coef > 1e3) {
        fail_with_hint("check the MoE sizes: xeNN experts, xkNN top-k (1..min(E, 64)), xfNN expert size, xsNN shared "
                       "size, xa coefficient (negative: no load-balancing loss)",
                       "MoE sizes out of range (E=%d K=%d F=%d S=%d aux=%g)", m->experts, m->top_k, m->hidden,
                       m->shared, m->aux_coef);
    }
}

static int moe_params(const ModelConfig *c, ParamDef *p) {
    enum { MOE_PARAMS(KIND_PARAM_ENUM) NUM };
    const size_t C = (size_t)c->d_model, E = (size_t)c->moe.experts, F = (size_t)c->moe.hidden;
    const size_t S = (size_t)c->moe.shared;
    PDEF(router_w, 2, E, C, 0, INIT_NORMAL, STD_IN, DECAY, SPLIT_REPLICATED);
    PDEF(up_w, 3, E, 2 * F, C, INIT_NORMAL, STD_IN, DECAY, SPLIT_COLUMN);
    PDEF(down_w, 3, E, C, F, INIT_NORMAL, std_out_of(c), DECAY, SPLIT_COLUMN);
    PDEF(shared_up_w, 2, 2 * S, C, 0, INIT_NORMAL, STD_IN, DECAY, SPLIT_HEAD_GROUPS);
    param_segments(&p[P_shared_up_w], 2, S, S);
    PDEF(shared_down_w, 2, C, S, 0, INIT_NORMAL, std_out_of(c), DECAY, SPLIT_ROW);
    return NUM;
}

// the coefficient in effect (negative: off)
static inline float moe_aux_coef(const ModelConfig *c) { return c->moe.aux_coef > 0 ? c->moe.aux_coef : 0.0f; }

// active FLOPs a token: the router, K experts, the shared expert
static double moe_flops(const ModelConfig *c, int T) {
    const double C = c->d_model, E = c->moe.experts, K = c->moe.top_k, F = c->moe.hidden, S = c->moe.shared;
    return 2.0 * C * E + K * 3.0 * 2.0 * C * F + 3.0 * 2.0 * C * S;
}

// ----------------------------------------------------------------------------------------------------------------
// tensor parallelism: each kind's sizes on one of tp ranks (Megatron's layout: the input projections column-parallel
// by whole heads, the output projection row-parallel, its partial sums all-reduced by the block)

// M²RNN, the paper's two strategies (§Tensor Parallelism): value heads are split by whole q/k groups.
//   topology-aware (gn, Nq a multiple of TP): each rank holds Nq/TP q/k heads with their value heads and norm groups:
//     no communication beyond Megatron's pair;
//   topology-independent (Nq = 1, one norm over all heads): the q/k projection and conv are replicated, each rank
//     holds N/TP value heads, the norm is RMSNormTP (one scalar a token all-reduced forward and backward) and the
//     replicated q/k weights' gradients, partial on each rank, are summed over the group once a step.
//   Nq = N with one norm (per-head q/k): q/k split with their heads, RMSNormTP.
static const char *m2rnn_tp_local(ModelConfig *c, int tp) {
    M2RNNConfig *m = &c->m2rnn;
    if (tp == 1) { return NULL; }
    if (m->heads % tp != 0) { return "M2RNN value heads (n) must divide by the TP size"; }
    if (m->qk_heads % tp == 0) {
        if (!m->group_norm) { m->tp_norm = tp; } // one norm over all heads: RMSNormTP
        m->qk_heads /= tp;
    } else if (m->qk_heads == 1) {
        m->tp_norm = tp; // topology-independent: q/k replicated
    } else {
        return "M2RNN q/k heads (q) must be 1 (topology-independent TP) or a multiple of the TP size (topology-aware)";
    }
    m->heads /= tp;
    return NULL;
}
static const char *attention_tp_local(ModelConfig *c, int tp) {
    if (c->attn.heads % tp != 0 || c->attn.kv_heads % tp != 0) {
        return "attention heads (h) and kv heads (hk) must divide by the TP size";
    }
    c->attn.heads /= tp;
    c->attn.kv_heads /= tp;
    return NULL;
}
// R, U: heads split, the norm over all heads becomes RMSNormTP
static const char *vecrnn_tp_local(ModelConfig *c, int tp) {
    if (tp == 1) { return NULL; }
    if (c->vrnn.heads % tp != 0) { return "RNN/GRU heads (rh) must divide by the TP size"; }
    c->vrnn.heads /= tp;
    c->vrnn.tp_norm = tp;
    return NULL;
}
static const char *gdn_tp_local(ModelConfig *c, int tp) {
    if (c->gdn.heads % tp != 0) { return "GDN heads (gh) must divide by the TP size"; }
    c->gdn.heads /= tp;
    return NULL;
}
static const char *mamba2_tp_local(ModelConfig *c, int tp) {
    if (mamba2_heads(c) % tp != 0 || c->mamba2.groups % tp != 0) {
        return "Mamba-2 heads (si / sp) and groups (sg) must divide by the TP size (each rank normalizes whole groups)";
    }
    c->mamba2.inner /= tp;
    c->mamba2.groups /= tp;
    return NULL;
}
static const char *swiglu_tp_local(ModelConfig *c, int tp) {
    if (c->swiglu.hidden % tp != 0) { return "the MLP hidden size must divide by the TP size"; }
    c->swiglu.hidden /= tp;
    return NULL;
}
static const char *moe_tp_local(ModelConfig *c, int tp) {
    return tp == 1 ? NULL : "MoE layers under tensor parallelism are not written (expert parallelism is a later issue)";
}

// Rank `rank` of tp's shard of one tensor between the full tensor and the rank's local one (elements of `elem`
// bytes; d: its ParamDef at the full config, dl: at the rank's tp_local config): gather == 0 copies the rank's part of
// full into local, gather == 1 writes local back into its place in full. REPLICATED: the whole tensor; COLUMN: rows
// (dim 0) rank·d0/tp ..; ROW: columns (dim 1) rank·d1/tp .. of every row; HEAD_GROUPS: that part of each segment of
// rows, except a segment the local config keeps whole (dl's segment = d's: M²RNN's shared q/k, replicated).
static void tp_shard_tensor(void *full, void *local, size_t elem, const ParamDef *d, const ParamDef *dl, int rank,
                            int tp, int gather) {
    char *F = (char *)full, *L = (char *)local;
    const size_t d0 = d->shape[0], d1 = d->shape[1], d2 = d->shape[2], inner = d1 * d2;
#define TP_COPY(f_off, l_off, n) (gather ? memcpy(F + (f_off) * elem, L + (l_off) * elem, (n) * elem) \
                                         : memcpy(L + (l_off) * elem, F + (f_off) * elem, (n) * elem))
    switch (d->split) {
    case SPLIT_REPLICATED: TP_COPY(0, 0, d0 * inner); break;
    case SPLIT_COLUMN: TP_COPY((size_t)rank * (d0 / tp) * inner, 0, (d0 / tp) * inner); break;
    case SPLIT_ROW:
        for (size_t i = 0; i < d0; i++) {
            TP_COPY(i * inner + (size_t)rank * (d1 / tp) * d2, i * (d1 / tp) * d2, (d1 / tp) * d2);
        }
        break;
    case SPLIT_HEAD_GROUPS: {
        size_t f_row = 0, l_row = 0;
        for (int sgm = 0; sgm < d->nseg; sgm++) {
            const int whole = dl->seg[sgm] == d->seg[sgm];
            const size_t rows = whole ? d->seg[sgm] : d->seg[sgm] / tp;
            TP_COPY((f_row + (whole ? 0 : (size_t)rank * rows)) * inner, l_row * inner, rows * inner);
            f_row += d->seg[sgm];
            l_row += rows;
        }
        break;
    }
    }
#undef TP_COPY
}

// The rows of a kind's tensor (d at the full config, dl at the local one) that every rank of the group holds whole
// but whose gradient each rank only has a part of (from its own heads): REPLICATED tensors inside a kind (GDN's norm
// weight shared by all heads) and whole HEAD_GROUPS segments (M²RNN's shared q/k). Writes up to MAX_SEGMENTS
// [row0, row1) ranges of the local tensor; returns their count. The block sums these gradients over the group.
static int tp_partial_rows(const ParamDef *d, const ParamDef *dl, int tp, size_t *row0, size_t *row1) {
    if (tp == 1) { return 0; }
    if (d->split == SPLIT_REPLICATED) { row0[0] = 0; row1[0] = dl->shape[0]; return 1; }
    int n = 0;
    if (d->split == SPLIT_HEAD_GROUPS) {
        size_t l_row = 0;
        for (int sgm = 0; sgm < d->nseg; sgm++) {
            if (dl->seg[sgm] == d->seg[sgm] && d->seg[sgm] > 0) { row0[n] = l_row; row1[n++] = l_row + dl->seg[sgm]; }
            l_row += dl->seg[sgm];
        }
    }
    return n;
}

// ----------------------------------------------------------------------------------------------------------------
// the tables

#define NFIELDS(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const LayerKind MIXER_KINDS[] = {
    {'M', "M2RNN", "M2RNN: non-linear RNN with a K×V matrix state per head", M2RNN_FIELDS, NFIELDS(M2RNN_FIELDS),
     m2rnn_fill_defaults, m2rnn_validate, m2rnn_params, m2rnn_flops, m2rnn_decode_state, m2rnn_tp_local},
    {'A', "attention", "causal softmax attention (NoPE, or RoPE with `rope`)", ATTENTION_FIELDS,
     NFIELDS(ATTENTION_FIELDS), attention_fill_defaults, attention_validate, attention_params, attention_flops,
     attention_decode_state, attention_tp_local},
    {'R', "RNN", "vector RNN with the M2RNN forget gate (baseline)", VECRNN_FIELDS, NFIELDS(VECRNN_FIELDS),
     vecrnn_fill_defaults, vecrnn_validate, rnn_params, rnn_flops, rnn_decode_state, vecrnn_tp_local},
    {'U', "GRU", "GRU per head (baseline)", VECRNN_FIELDS, NFIELDS(VECRNN_FIELDS), vecrnn_fill_defaults,
     vecrnn_validate, gru_params, gru_flops, gru_decode_state, vecrnn_tp_local},
    {'G', "GDN", "Gated DeltaNet: the delta rule with a decay gate, K×V state per head", GDN_FIELDS,
     NFIELDS(GDN_FIELDS), gdn_fill_defaults, gdn_validate, gdn_params, gdn_flops, gdn_decode_state, gdn_tp_local},
    {'S', "Mamba2", "Mamba-2 (SSD): P×N state per head", MAMBA2_FIELDS, NFIELDS(MAMBA2_FIELDS), mamba2_fill_defaults,
     mamba2_validate, mamba2_params, mamba2_flops, mamba2_decode_state, mamba2_tp_local},
};

static const LayerKind FFN_KINDS[] = {
    {'s', "SwiGLU", "SwiGLU MLP", SWIGLU_FIELDS, NFIELDS(SWIGLU_FIELDS), swiglu_fill_defaults, swiglu_validate,
     swiglu_params, swiglu_flops, no_decode_state, swiglu_tp_local},
    {'e', "MoE", "mixture of SwiGLU experts, top-k, optional shared expert", MOE_FIELDS, NFIELDS(MOE_FIELDS),
     moe_fill_defaults, moe_validate, moe_params, moe_flops, no_decode_state, moe_tp_local},
};

#define NUM_MIXER_KINDS NFIELDS(MIXER_KINDS)
#define NUM_FFN_KINDS NFIELDS(FFN_KINDS)

// the row of a letter, or NULL: no letter outside the tables can reach any kind's code
static inline const LayerKind *mixer_kind(char letter) {
    for (int i = 0; i < NUM_MIXER_KINDS; i++) { if (MIXER_KINDS[i].letter == letter) { return &MIXER_KINDS[i]; } }
    return NULL;
}
static inline const LayerKind *ffn_kind(char letter) {
    for (int i = 0; i < NUM_FFN_KINDS; i++) { if (FFN_KINDS[i].letter == letter) { return &FFN_KINDS[i]; } }
    return NULL;
}

#endif // M2RNN_LAYERS_H
