/*
model.h: the one definition of the model, shared by the CPU reference (ref/lm.h), the GPU executor (lm.cuh) and every
program built on them. Built from the layer-kind tables of layers.h, it holds:
- the config: defaults, validation, the model descriptor parser ("d256:l4:MMAM:n16"), and the config as named
  text fields for checkpoints (every kind's sizes by name: a new kind or field needs no header slot);
- the parameter table: for every tensor its name, shape, init rule, weight-decay flag, tensor-parallel split, offset
  in the one contiguous parameter buffer, and its slot in the executors' typed views. Allocation, init, checkpoint
  I/O and the optimizer's no-decay set all derive from it, so no executor lists parameters a second time;
- the parameter init (host side, seeded, identical for every executor);
- FLOPs per token for MFU, summed over the kinds' rows.
*/
#ifndef M2RNN_MODEL_H
#define M2RNN_MODEL_H

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "layers.h"
#include "utils.h"

// ----------------------------------------------------------------------------------------------------------------
// the config fields: the global ones, then every kind's (a field array shared by two kinds, as R and U share theirs,
// counts once)

static const ConfigField GLOBAL_FIELDS[] = {
    CFG_FIELD("vocab_size", NULL, FIELD_INT, vocab_size, "vocabulary (-vs)"),
    CFG_FIELD("d_model", "d", FIELD_INT, d_model, "width d"),
};

typedef struct {
    const ConfigField *field;
    const LayerKind *owners[NUM_MIXER_KINDS + NUM_FFN_KINDS]; // the kinds that own it (none: a global field)
    int num_owners;
} FieldEntry;

#define MAX_CONFIG_FIELDS 64

// every field once, with its owners; returns the count
static int config_fields(FieldEntry *out) {
    int n = 0;
    for (int i = 0; i < NFIELDS(GLOBAL_FIELDS); i++) { out[n].field = &GLOBAL_FIELDS[i]; out[n++].num_owners = 0; }
    for (int k = 0; k < NUM_MIXER_KINDS + NUM_FFN_KINDS; k++) {
        const LayerKind *kind = k < NUM_MIXER_KINDS ? &MIXER_KINDS[k] : &FFN_KINDS[k - NUM_MIXER_KINDS];
        for (int i = 0; i < kind->num_fields; i++) {
            int found = -1;
            for (int j = 0; j < n; j++) { if (out[j].field == &kind->fields[i]) { found = j; } }
            if (found < 0) { found = n++; out[found].field = &kind->fields[i]; out[found].num_owners = 0; }
            out[found].owners[out[found].num_owners++] = kind;
        }
    }
    return n;
}

static inline void *config_field_ptr(ModelConfig *c, const ConfigField *f) { return (char *)c + f->offset; }
static inline const void *config_field_cptr(const ModelConfig *c, const ConfigField *f) { return (const char *)c + f->offset; }

// ----------------------------------------------------------------------------------------------------------------
// defaults and validation

// the feed-forward letter of layer l ("" means SwiGLU everywhere)
static inline char model_ffn_letter(const ModelConfig *c, int l) { return c->ffn_pattern[0] ? c->ffn_pattern[l] : 's'; }

static inline int pattern_has(const char *pattern, char letter) { return strchr(pattern, letter) != NULL; }

// Fills every size a user did not set (0, or < 0 for floats, means "derive it"). Every kind's defaults are filled,
// present in the pattern or not, so a config is always complete.
static void model_config_fill_defaults(ModelConfig *c) {
    if (c->vocab_size <= 0) { c->vocab_size = 50257; }
    c->padded_vocab_size = round_up(c->vocab_size, VOCAB_PAD_MULTIPLE);
    c->n_layer = (int)strlen(c->pattern);
    if (strlen(c->ffn_pattern) == 1 && c->n_layer > 1) { // one letter: every layer
        memset(c->ffn_pattern + 1, c->ffn_pattern[0], (size_t)c->n_layer - 1);
        c->ffn_pattern[c->n_layer] = '\0';
    }
    for (int k = 0; k < NUM_MIXER_KINDS; k++) { MIXER_KINDS[k].fill_defaults(c); }
    for (int k = 0; k < NUM_FFN_KINDS; k++) { FFN_KINDS[k].fill_defaults(c); }
}

// "M = M2RNN, A = attention, ..." from a table, written once into buf
static const char *kind_letters_help(char *buf, size_t n, const LayerKind *kinds, int count) {
    if (buf[0] == '\0') {
        for (int k = 0; k < count; k++) {
            snprintf(buf + strlen(buf), n - strlen(buf), "%s%c = %s", k ? ", " : "", kinds[k].letter, kinds[k].name);
        }
    }
    return buf;
}
static const char *mixer_letters_help(void) {
    static char buf[256];
    return kind_letters_help(buf, sizeof(buf), MIXER_KINDS, NUM_MIXER_KINDS);
}
static const char *ffn_letters_help(void) {
    static char buf[256];
    return kind_letters_help(buf, sizeof(buf), FFN_KINDS, NUM_FFN_KINDS);
}

// Refuses a config that cannot be built, with one line naming the problem and the fix. Only the kinds present in
// the pattern are validated.
static void model_config_validate(const ModelConfig *c) {
    char hint[400];
    snprintf(hint, sizeof(hint), "the pattern has one letter per layer: %s (e.g. -e d256:MMAM)", mixer_letters_help());
    const size_t len = strlen(c->pattern);
    if (len == 0) { fail_with_hint(hint, "empty layer pattern"); }
    for (size_t i = 0; i < len; i++) {
        if (mixer_kind(c->pattern[i]) == NULL) {
            fail_with_hint(hint, "layer pattern '%s': unknown layer letter '%c' at position %zu", c->pattern,
                           c->pattern[i], i);
        }
    }
    if (c->ffn_pattern[0] != '\0') {
        char fhint[400];
        snprintf(fhint, sizeof(fhint), "ffn= takes one letter for every layer or one per layer: %s (e.g. ffn=s)",
                 ffn_letters_help());
        if (strlen(c->ffn_pattern) != len) {
            fail_with_hint(fhint, "feed-forward pattern '%s' has %zu letters, the model %zu layers", c->ffn_pattern,
                           strlen(c->ffn_pattern), len);
        }
        for (size_t i = 0; i < len; i++) {
            if (ffn_kind(c->ffn_pattern[i]) == NULL) {
                fail_with_hint(fhint, "feed-forward pattern '%s': unknown letter '%c' at position %zu", c->ffn_pattern,
                               c->ffn_pattern[i], i);
            }
        }
    }
    if (c->d_model <= 0 || c->d_model > 65536) { fail_with_hint("use e.g. -e d256:MMAM", "model width d=%d is out of range", c->d_model); }
    if (c->vocab_size <= 1 || c->vocab_size > (1 << 28)) {
        fail_with_hint("the vocabulary needs at least 2 tokens and at most 2^28", "vocab size %d", c->vocab_size);
    }
    for (int k = 0; k < NUM_MIXER_KINDS; k++) {
        if (pattern_has(c->pattern, MIXER_KINDS[k].letter)) { MIXER_KINDS[k].validate(c); }
    }
    for (int l = 0; l < c->n_layer; l++) {
        const LayerKind *f = ffn_kind(model_ffn_letter(c, l));
        if (l == 0 || model_ffn_letter(c, l) != model_ffn_letter(c, l - 1)) { f->validate(c); }
    }
}

// ----------------------------------------------------------------------------------------------------------------
// the model descriptor: colon-separated fields in any order
//   dNNN width                 lNN layers (must equal the pattern length; alone: all M)
//   a pattern of mixer letters ffn=X or ffn=XXXX (feed-forward letters, one for all layers or one per layer)
//   each kind's own fields (nNN qNN kNN vNN: M2RNN; hNN, rope: attention; rhNN rvNN: RNN/GRU; fNNN: SwiGLU)
// e.g. "d256:l4:MMAM", "d768:MMMAMMMAMMMA:n48", "d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84". A field for a kind the
// pattern does not contain is refused (it would do nothing).

static void descriptor_hint(char *buf, size_t n) {
    FieldEntry fields[MAX_CONFIG_FIELDS];
    const int nf = config_fields(fields);
    snprintf(buf, n, "a descriptor looks like d256:MMAM or d512:l8:MMMAMMMA (fields d l");
    for (int i = 0; i < nf; i++) {
        if (fields[i].field->key != NULL && strcmp(fields[i].field->key, "d") != 0) {
            snprintf(buf + strlen(buf), n - strlen(buf), " %s", fields[i].field->key);
        }
    }
    snprintf(buf + strlen(buf), n - strlen(buf), " ffn=, and a pattern of %s)", mixer_letters_help());
}

static void model_config_from_descriptor(ModelConfig *c, const char *descriptor) {
    char hint[600];
    descriptor_hint(hint, sizeof(hint));
    char buf[512];
    if (strlen(descriptor) >= sizeof(buf)) { fail_with_hint(hint, "model descriptor too long"); }
    strcpy(buf, descriptor);
    FieldEntry fields[MAX_CONFIG_FIELDS];
    const int nf = config_fields(fields);
    const FieldEntry *set[MAX_CONFIG_FIELDS];
    char set_text[MAX_CONFIG_FIELDS][64];
    int nset = 0, layers = 0;
    for (char *tok = strtok(buf, ":"); tok != NULL; tok = strtok(NULL, ":")) {
        if (strncmp(tok, "ffn=", 4) == 0) {
            if (strlen(tok + 4) == 0 || strlen(tok + 4) > MAX_LAYERS) { fail_with_hint(hint, "model descriptor '%s': empty or overlong ffn=", descriptor); }
            strcpy(c->ffn_pattern, tok + 4);
            continue;
        }
        if (tok[0] >= 'A' && tok[0] <= 'Z') { // the layer pattern; its letters are checked by validate
            if (strlen(tok) > MAX_LAYERS) { fail_with_hint(hint, "pattern longer than %d layers", MAX_LAYERS); }
            strcpy(c->pattern, tok);
            continue;
        }
        // a flag given by its key alone, or the longest key that leaves a number
        const FieldEntry *best = NULL;
        size_t best_len = 0;
        for (int i = 0; i < nf; i++) {
            const char *key = fields[i].field->key;
            if (key == NULL) { continue; }
            const size_t kl = strlen(key);
            if (fields[i].field->type == FIELD_FLAG ? strcmp(tok, key) == 0 : (strncmp(tok, key, kl) == 0 && kl > best_len)) {
                best = &fields[i];
                best_len = kl;
            }
        }
        if (best == NULL && tok[0] != 'l') { // lNN, the layer count, is the one field outside the config
            fail_with_hint(hint, "model descriptor '%s': unknown field '%s'", descriptor, tok);
        }
        const char *num = tok + (best ? best_len : 1);
        if (best != NULL && best->field->type == FIELD_FLAG) {
            *(int *)config_field_ptr(c, best->field) = 1;
        } else {
            char *end = NULL;
            const double v = strtod(num, &end);
            const int is_int = best == NULL || best->field->type == FIELD_INT;
            if (num[0] == '\0' || *end != '\0' || !(v > 0) || v > 1000000 || (is_int && v != floor(v))) {
                fail_with_hint(hint, "model descriptor '%s': cannot read field '%s'", descriptor, tok);
            }
            if (best == NULL) { layers = (int)v; continue; }
            if (best->field->type == FIELD_INT) { *(int *)config_field_ptr(c, best->field) = (int)v; }
            else { *(float *)config_field_ptr(c, best->field) = (float)v; }
        }
        if (nset < MAX_CONFIG_FIELDS) { set[nset] = best; snprintf(set_text[nset++], 64, "%s", tok); }
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
    // a kind's field with no layer of that kind would be silently ignored: refuse it
    for (int i = 0; i < nset; i++) {
        if (set[i]->num_owners == 0) { continue; }
        int used = 0;
        char owners[64] = "";
        for (int o = 0; o < set[i]->num_owners; o++) {
            const LayerKind *k = set[i]->owners[o];
            const int is_ffn = k->letter >= 'a' && k->letter <= 'z';
            used |= is_ffn ? (c->ffn_pattern[0] == '\0' ? k->letter == 's' : pattern_has(c->ffn_pattern, k->letter))
                           : pattern_has(c->pattern, k->letter);
            snprintf(owners + strlen(owners), sizeof(owners) - strlen(owners), "%s%c", o ? " or " : "", k->letter);
        }
        if (!used) {
            fail_with_hint("drop the field, or add a layer of that kind to the pattern",
                           "model descriptor '%s': field '%s' (%s) belongs to %s layers, and the model has none",
                           descriptor, set_text[i], set[i]->field->help, owners);
        }
    }
}

// ----------------------------------------------------------------------------------------------------------------
// the config as text, for checkpoints: one "name=value" line per field, the two patterns first. Floats print with
// 9 significant digits, which round-trips every float exactly.

// writes the text into out (NUL-terminated); returns its length, or -1 if it does not fit
static int model_config_to_text(const ModelConfig *c, char *out, size_t n) {
    FieldEntry fields[MAX_CONFIG_FIELDS];
    const int nf = config_fields(fields);
    size_t used = (size_t)snprintf(out, n, "pattern=%s\nffn_pattern=%s\n", c->pattern, c->ffn_pattern);
    for (int i = 0; i < nf && used < n; i++) {
        const ConfigField *f = fields[i].field;
        const void *p = config_field_cptr(c, f);
        if (f->type == FIELD_FLOAT) { used += (size_t)snprintf(out + used, n - used, "%s=%.9g\n", f->name, *(const float *)p); }
        else { used += (size_t)snprintf(out + used, n - used, "%s=%d\n", f->name, *(const int *)p); }
    }
    return used < n ? (int)used : -1;
}

// parses the text of model_config_to_text; returns NULL, or why it cannot (a name this build does not know, or a
// malformed line). The derived sizes are filled by model_config_fill_defaults afterwards.
static const char *model_config_from_text(ModelConfig *c, const char *text, char *why, size_t why_n) {
    memset(c, 0, sizeof(*c));
    c->m2rnn.grad_clamp = -1; // absent: the default
    FieldEntry fields[MAX_CONFIG_FIELDS];
    const int nf = config_fields(fields);
    const char *line = text;
    while (*line != '\0') {
        const char *eol = strchr(line, '\n');
        const size_t len = eol ? (size_t)(eol - line) : strlen(line);
        char buf[256];
        if (len >= sizeof(buf)) { snprintf(why, why_n, "a config line of %zu bytes", len); return why; }
        memcpy(buf, line, len);
        buf[len] = '\0';
        line = eol ? eol + 1 : line + len;
        if (len == 0) { continue; }
        char *eq = strchr(buf, '=');
        if (eq == NULL) { snprintf(why, why_n, "config line '%s' has no '='", buf); return why; }
        *eq = '\0';
        const char *name = buf, *value = eq + 1;
        if (strcmp(name, "pattern") == 0 || strcmp(name, "ffn_pattern") == 0) {
            if (strlen(value) > MAX_LAYERS) { snprintf(why, why_n, "%s longer than %d layers", name, MAX_LAYERS); return why; }
            strcpy(name[0] == 'p' ? c->pattern : c->ffn_pattern, value);
            continue;
        }
        const ConfigField *f = NULL;
        for (int i = 0; i < nf; i++) { if (strcmp(fields[i].field->name, name) == 0) { f = fields[i].field; } }
        if (f == NULL) { snprintf(why, why_n, "config field '%s' is unknown to this build (written by a newer m2rnn?)", name); return why; }
        char *end = NULL;
        const double v = strtod(value, &end);
        if (value[0] == '\0' || *end != '\0') { snprintf(why, why_n, "config field %s='%s' is not a number", name, value); return why; }
        if (!(v >= (f->type == FIELD_FLOAT ? -1e9 : 0) && v <= (f->type == FIELD_FLOAT ? 1e9 : 1e8))) {
            snprintf(why, why_n, "config field %s=%s is out of range", name, value);
            return why;
        }
        if (f->type == FIELD_FLOAT) { *(float *)config_field_ptr(c, f) = (float)v; }
        else { *(int *)config_field_ptr(c, f) = (int)v; }
    }
    return NULL;
}

// ----------------------------------------------------------------------------------------------------------------
// the parameter table

// An executor's typed views of the one buffer (or of the gradients, or the master weights): the embedding, final
// norm and LM head, then for each layer its two norms and the slots of its mixer and feed-forward kinds in their
// _PARAMS order (each kind's file casts its slots to a struct of its named tensors). The struct is an array of
// pointers; a ParamSpec's `slot` indexes it.
#define DEFINE_MODEL_VIEWS(T, Views)                                                                             \
    typedef struct {                                                                                             \
        T *ln1_w;                   /* (C) pre-mixer RMSNorm */                                                 \
        T *mixer[MAX_KIND_PARAMS];  /* the mixer kind's tensors */                                              \
        T *ln2_w;                   /* (C) pre-feed-forward RMSNorm */                                          \
        T *ffn[MAX_KIND_PARAMS];    /* the feed-forward kind's tensors */                                       \
    } Views##Layer;                                                                                              \
    typedef struct {                                                                                             \
        T *wte;                     /* (Vp, C) token embedding */                                               \
        T *lnf_w;                   /* (C) final RMSNorm */                                                     \
        T *lm_head;                 /* (Vp, C) untied LM head */                                                \
        Views##Layer layers[MAX_LAYERS];                                                                         \
    } Views;

#define VIEW_LAYER_SLOTS (2 + 2 * MAX_KIND_PARAMS)
#define VIEW_SLOTS (3 + MAX_LAYERS * VIEW_LAYER_SLOTS)

typedef struct {
    char name[48];      // "layer3.m2rnn.in_w"
    int layer;          // -1 for the embedding, final norm and LM head
    char kind;          // the kind's letter ('M', 's'), or 0 (norms, embedding, LM head)
    int index;          // within the kind's _PARAMS list
    int slot;           // in an executor's view struct
    int ndim;
    size_t shape[3];
    size_t numel;
    size_t offset;      // in elements, into the one parameter buffer
    InitRule init;
    float init_std;     // for INIT_NORMAL
    int weight_decay;   // 1 if AdamW decays it
    SplitRule split;
    int nseg;
    size_t seg[MAX_SEGMENTS];
    size_t zero_rows_from; // rows >= this stay zero (vocab padding); == shape[0] otherwise
} ParamSpec;

#define MAX_PARAM_SPECS (3 + MAX_LAYERS * VIEW_LAYER_SLOTS)

typedef struct {
    ParamSpec specs[MAX_PARAM_SPECS];
    int num_specs;
    size_t num_parameters; // elements of the one buffer, the alignment gaps between tensors included
} ParamTable;

static void param_table_add(ParamTable *t, const char *prefix, const ParamDef *d, int layer, char kind, int index,
                            int slot) {
    ParamSpec *s = &t->specs[t->num_specs++];
    memset(s, 0, sizeof(*s));
    if (layer >= 0) { snprintf(s->name, sizeof(s->name), "layer%d.%s%s", layer, prefix, d->name); }
    else { snprintf(s->name, sizeof(s->name), "%s", d->name); }
    s->layer = layer;
    s->kind = kind;
    s->index = index;
    s->slot = slot;
    s->ndim = d->ndim;
    for (int i = 0; i < 3; i++) { s->shape[i] = d->shape[i]; }
    s->numel = s->shape[0] * s->shape[1] * s->shape[2];
    // every tensor starts on a multiple of 8 elements (16 bytes of bf16): aligned operands for the GPU's matmuls;
    // the few gap elements stay zero
    t->num_parameters = (t->num_parameters + 7) / 8 * 8;
    s->offset = t->num_parameters;
    s->init = d->init;
    s->init_std = d->std;
    s->weight_decay = d->decay;
    s->split = d->split;
    s->nseg = d->nseg;
    for (int i = 0; i < d->nseg; i++) { s->seg[i] = d->seg[i]; }
    s->zero_rows_from = s->shape[0];
    t->num_parameters += s->numel;
}

// a kind's tensors of layer l, with the "m2rnn." style prefix and the slots of group (1: mixer, 2: feed-forward)
static void param_table_add_kind(ParamTable *t, const ModelConfig *c, const LayerKind *kind, int l, int slot0) {
    ParamDef defs[MAX_KIND_PARAMS];
    memset(defs, 0, sizeof(defs));
    const int n = kind->params(c, defs);
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "%s.", kind->name);
    for (char *p = prefix; *p; p++) { *p = (char)tolower((unsigned char)*p); }
    for (int i = 0; i < n; i++) {
        if (defs[i].name == NULL) { fail_with_hint("fix the kind's param function in layers.h", "%s: tensor %d not defined", kind->name, i); }
        param_table_add(t, prefix, &defs[i], l, kind->letter, i, slot0 + i);
    }
}

// Builds the table for a validated config: wte, then per layer ln1_w, the mixer's tensors, ln2_w, the feed-forward's,
// then lnf_w and lm_head. (For M and A layers with SwiGLU this is the order of checkpoint version 1.)
static void param_table_build(ParamTable *t, const ModelConfig *c) {
    memset(t, 0, sizeof(*t));
    const size_t C = (size_t)c->d_model, Vp = (size_t)c->padded_vocab_size;
    const ParamDef wte = param_def("wte", 2, Vp, C, 0, INIT_NORMAL, STD_IN, DECAY, SPLIT_COLUMN);
    const ParamDef lnf = param_def("lnf_w", 1, C, 0, 0, INIT_ONES, 0, NO_DECAY, SPLIT_REPLICATED);
    const ParamDef head = param_def("lm_head", 2, Vp, C, 0, INIT_NORMAL, STD_IN, DECAY, SPLIT_COLUMN);
    const ParamDef ln1 = param_def("ln1_w", 1, C, 0, 0, INIT_ONES, 0, NO_DECAY, SPLIT_REPLICATED);
    const ParamDef ln2 = param_def("ln2_w", 1, C, 0, 0, INIT_ONES, 0, NO_DECAY, SPLIT_REPLICATED);
    param_table_add(t, "", &wte, -1, 0, 0, 0);
    t->specs[t->num_specs - 1].zero_rows_from = (size_t)c->vocab_size;
    for (int l = 0; l < c->n_layer; l++) {
        const int base = 3 + l * VIEW_LAYER_SLOTS;
        param_table_add(t, "", &ln1, l, 0, 0, base);
        param_table_add_kind(t, c, mixer_kind(c->pattern[l]), l, base + 1);
        param_table_add(t, "", &ln2, l, 0, 0, base + 1 + MAX_KIND_PARAMS);
        param_table_add_kind(t, c, ffn_kind(model_ffn_letter(c, l)), l, base + 2 + MAX_KIND_PARAMS);
    }
    param_table_add(t, "", &lnf, -1, 0, 0, 1);
    param_table_add(t, "", &head, -1, 0, 0, 2);
    t->specs[t->num_specs - 1].zero_rows_from = (size_t)c->vocab_size;
}

// points an executor's views (a DEFINE_MODEL_VIEWS struct) into a buffer of elements of elem_bytes each
static void model_point_views(void *views, void *base, size_t elem_bytes, const ParamTable *t) {
    void **slots = (void **)views;
    memset(slots, 0, VIEW_SLOTS * sizeof(void *));
    for (int i = 0; i < t->num_specs; i++) {
        slots[t->specs[i].slot] = (char *)base + t->specs[i].offset * elem_bytes;
    }
}

// the number of weights (the buffer's alignment gaps not counted)
static inline size_t param_table_count(const ParamTable *t) {
    size_t n = 0;
    for (int i = 0; i < t->num_specs; i++) { n += t->specs[i].numel; }
    return n;
}

static inline const ParamSpec *param_table_find(const ParamTable *t, const char *name) {
    for (int i = 0; i < t->num_specs; i++) { if (strcmp(t->specs[i].name, name) == 0) { return &t->specs[i]; } }
    return NULL;
}

// ----------------------------------------------------------------------------------------------------------------
// tensor parallelism: a rank's local config and the map between its parameter table and the full one

// local = full's sizes for rank `rank` of a tensor-parallel group of tp (Megatron's layout): each kind in the
// pattern divides its heads / hidden sizes (its row's tp_local), the embedding and the LM head are split by
// vocabulary rows (vocab_offset). Returns NULL, or why this model cannot be split so (the caller fails with it).
static const char *model_config_tp_local(const ModelConfig *full, ModelConfig *local, int tp, int rank) {
    *local = *full;
    if (tp == 1) { return NULL; }
    const int Vp = full->padded_vocab_size;
    if (Vp % tp != 0 || (Vp / tp) % 8 != 0) {
        return "the padded vocabulary must split into TP shards of a multiple of 8 rows (use a TP size dividing Vp/8)";
    }
    // each kind's sizes are divided once (R and U share theirs, and their tp_local)
    const char *(*done[2 * MAX_LAYERS])(ModelConfig *, int);
    int ndone = 0;
    for (int l = 0; l < full->n_layer; l++) {
        const LayerKind *kinds[2] = {mixer_kind(full->pattern[l]), ffn_kind(model_ffn_letter(full, l))};
        for (int k = 0; k < 2; k++) {
            int seen = 0;
            for (int j = 0; j < ndone; j++) { seen |= done[j] == kinds[k]->tp_local; }
            if (seen) { continue; }
            done[ndone++] = kinds[k]->tp_local;
            const char *why = kinds[k]->tp_local(local, tp);
            if (why != NULL) { return why; }
        }
    }
    local->padded_vocab_size = Vp / tp;
    local->vocab_offset = rank * (Vp / tp);
    const int real_rows = full->vocab_size - local->vocab_offset;
    local->vocab_size = real_rows < 0 ? 0 : (real_rows > Vp / tp ? Vp / tp : real_rows);
    return NULL;
}

// the ParamDef of spec i of a table built from config c (the defs param_table_build used)
static ParamDef param_table_def(const ParamSpec *s) {
    ParamDef d = param_def(s->name, s->ndim, s->shape[0], s->shape[1], s->shape[2], s->init, s->init_std,
                           s->weight_decay, s->split);
    d.nseg = s->nseg;
    for (int i = 0; i < s->nseg; i++) { d.seg[i] = s->seg[i]; }
    return d;
}

// Moves the whole parameter buffer between the full layout (full table) and rank `rank`'s local one (local table,
// the same specs in the same order): gather == 0 cuts the rank's shards out of full, gather == 1 puts them back.
static void model_tp_shard(void *full, const ParamTable *ft, void *local, const ParamTable *lt, size_t elem, int rank,
                           int tp, int gather) {
    for (int i = 0; i < ft->num_specs; i++) {
        const ParamDef d = param_table_def(&ft->specs[i]), dl = param_table_def(&lt->specs[i]);
        tp_shard_tensor((char *)full + ft->specs[i].offset * elem, (char *)local + lt->specs[i].offset * elem, elem, &d,
                        &dl, rank, tp, gather);
    }
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
        const size_t row_len = s->shape[0] > 0 ? s->numel / s->shape[0] : 0; // (an empty tensor: no rows)
        for (size_t j = 0; j < s->numel; j++) {
            float v = 0.0f;
            switch (s->init) {
                case INIT_ZERO: v = 0.0f; break;
                case INIT_NORMAL: v = (float)(s->init_std * rng_normal(&rng)); break;
                case INIT_ONES: v = 1.0f; break;
                case INIT_IDENTITY: { // shape (N, V, V): identity per head
                    size_t within = j % (s->shape[1] * s->shape[2]);
                    v = (within / s->shape[2] == within % s->shape[2]) ? 1.0f : 0.0f;
                    break;
                }
                case INIT_A_LOG: v = (float)log(16.0 * rng_uniform(&rng)); break; // A ~ U(0, 16]
                case INIT_A_LOG_1_16: v = (float)log(1.0 + 15.0 * rng_uniform(&rng)); break; // A ~ U(1, 16)
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

// refuses an advance of decoding that does not fit the decode state: sequences b0 .. b0+nb−1 of B, T ≥ 1 new tokens
// at positions pos (host) with pos + T ≤ context
static void decode_check_advance(int B, int context, int b0, int nb, int T, const int *pos) {
    if (B == 0) { fail_with_hint("call model_decode_begin first", "decoding without a decode state"); }
    if (b0 < 0 || nb < 1 || b0 + nb > B || T < 1) {
        fail_with_hint("advance sequences that model_decode_begin allocated, by at least one token",
                       "decode advance of sequences %d..%d (of %d) by %d tokens", b0, b0 + nb - 1, B, T);
    }
    for (int i = 0; i < nb; i++) {
        if (pos[i] < 0 || (long)pos[i] + T > context) {
            fail_with_hint("begin decoding with a longer context", "decode positions %d..%d of sequence %d are outside "
                           "the context of %d tokens", pos[i], pos[i] + T - 1, b0 + i, context);
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
// 6N estimate misses (the recurrences, the convs, causal attention): the LM head plus each layer's kinds' rows.

static double model_flops_per_token(const ModelConfig *c, int T) {
    double fwd = 2.0 * c->d_model * c->padded_vocab_size; // LM head
    for (int l = 0; l < c->n_layer; l++) {
        fwd += mixer_kind(c->pattern[l])->flops(c, T) + ffn_kind(model_ffn_letter(c, l))->flops(c, T);
    }
    return 3.0 * fwd;
}

// numbers one sequence's decode state holds over all layers at a context length (recurrent layers: constant;
// attention: its KV cache grows with the context)
static size_t model_decode_state_numbers(const ModelConfig *c, int context) {
    size_t n = 0;
    for (int l = 0; l < c->n_layer; l++) { n += mixer_kind(c->pattern[l])->decode_state(c, context); }
    return n;
}

#endif // M2RNN_MODEL_H
