/*
export.h: the weights-only export of a model, in the formats other tools load: DIR/model.safetensors (the tensors by
their parameter-table names, e.g. "layer3.m2rnn.W", F32 or BF16) and DIR/config.json (the model config by the
checkpoint's field names, the two layer patterns, and the tensor order). The embedding and the LM head are written
with their real vocabulary rows only (the padding rows are zero and never used). Used by the trainer at the end of a
run with -o, and by ./export_m2rnn on any checkpoint. Both files are written to temporaries and renamed.

safetensors: an 8-byte little-endian header length, a JSON header {"__metadata__": {...}, name: {"dtype", "shape",
"data_offsets": [begin, end]}} padded with spaces to a multiple of 8 bytes, then the tensors back to back.
*/
#ifndef M2RNN_EXPORT_H
#define M2RNN_EXPORT_H

#include <stdio.h>
#include <string.h>

#include "model.h"
#include "utils.h"

// rows of a tensor that are exported (the vocabulary padding is left out)
static inline size_t export_rows(const ParamSpec *s) { return s->zero_rows_from < s->shape[0] ? s->zero_rows_from : s->shape[0]; }

static inline uint16_t export_bf16(float x) { // round to nearest even, as the GPU's cast does
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { return (uint16_t)((u >> 16) | 0x40); } // NaN stays NaN
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// x rounded to the nearest bf16 (even on ties), as a float: what the GPU's cast leaves of it (tests' references)
static inline float bf16_round(float x) {
    const uint32_t u = (uint32_t)export_bf16(x) << 16;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

static void export_rename(const char *tmp, const char *path) {
    if (rename(tmp, path) != 0) {
        fail_with_hint("check the output directory is writable", "cannot rename '%s' to '%s': %s", tmp, path,
                       strerror(errno));
    }
}

// Writes DIR/model.safetensors and DIR/config.json from fp32 parameters (num_parameters, parameter-table order).
// bf16: store BF16 instead of F32. Returns the bytes of the safetensors file.
static size_t export_model(const char *dir, const ModelConfig *c, const ParamTable *t, const float *params, int bf16) {
    const size_t elem = bf16 ? 2 : 4;
    // the JSON header
    size_t cap = 4096 + (size_t)t->num_specs * 160;
    char *json = (char *)mallocCheck(cap);
    size_t n = (size_t)snprintf(json, cap, "{\"__metadata__\":{\"format\":\"pt\",\"model\":\"m2rnn\",\"pattern\":\"%s\"}",
                                c->pattern);
    size_t offset = 0;
    for (int i = 0; i < t->num_specs; i++) {
        const ParamSpec *s = &t->specs[i];
        const size_t rows = export_rows(s), count = s->shape[0] > 0 ? rows * (s->numel / s->shape[0]) : 0;
        n += (size_t)snprintf(json + n, cap - n, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%zu", s->name, bf16 ? "BF16" : "F32",
                              rows);
        for (int d = 1; d < s->ndim; d++) { n += (size_t)snprintf(json + n, cap - n, ",%zu", s->shape[d]); }
        n += (size_t)snprintf(json + n, cap - n, "],\"data_offsets\":[%zu,%zu]}", offset, offset + count * elem);
        offset += count * elem;
    }
    n += (size_t)snprintf(json + n, cap - n, "}");
    while (n % 8 != 0) { json[n++] = ' '; }
    char path[4200], tmp[4300];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    snprintf(tmp, sizeof(tmp), "%s/.model.safetensors.tmp", dir);
    FILE *fp = fopenCheck(tmp, "wb");
    const uint64_t header_len = n;
    fwriteCheck(&header_len, 8, 1, fp);
    fwriteCheck(json, 1, n, fp);
    uint16_t *buf = bf16 ? (uint16_t *)mallocCheck(1 << 20) : NULL;
    for (int i = 0; i < t->num_specs; i++) {
        const ParamSpec *s = &t->specs[i];
        const size_t count = s->shape[0] > 0 ? export_rows(s) * (s->numel / s->shape[0]) : 0;
        const float *p = params + s->offset;
        if (!bf16) { fwriteCheck(p, sizeof(float), count, fp); continue; }
        for (size_t j = 0; j < count; j += (1 << 19)) {
            const size_t m = count - j < (1 << 19) ? count - j : (1 << 19);
            for (size_t k = 0; k < m; k++) { buf[k] = export_bf16(p[j + k]); }
            fwriteCheck(buf, 2, m, fp);
        }
    }
    free(buf);
    fcloseCheck(fp);
    export_rename(tmp, path);
    free(json);
    // config.json: every config field by name, and the tensors in order
    snprintf(path, sizeof(path), "%s/config.json", dir);
    snprintf(tmp, sizeof(tmp), "%s/.config.json.tmp", dir);
    fp = fopenCheck(tmp, "w");
    fprintf(fp, "{\n  \"model_type\": \"m2rnn\",\n  \"pattern\": \"%s\",\n  \"ffn_pattern\": \"", c->pattern);
    for (int l = 0; l < c->n_layer; l++) { fputc(model_ffn_letter(c, l), fp); }
    fprintf(fp, "\",\n  \"n_layer\": %d,\n  \"padded_vocab_size\": %d,\n", c->n_layer, c->padded_vocab_size);
    FieldEntry fields[MAX_CONFIG_FIELDS];
    const int nf = config_fields(fields);
    for (int i = 0; i < nf; i++) {
        const ConfigField *f = fields[i].field;
        const void *v = (const char *)c + f->offset;
        if (f->type == FIELD_FLOAT) { fprintf(fp, "  \"%s\": %.9g,\n", f->name, *(const float *)v); }
        else { fprintf(fp, "  \"%s\": %d,\n", f->name, *(const int *)v); }
    }
    fprintf(fp, "  \"tensors\": [");
    for (int i = 0; i < t->num_specs; i++) { fprintf(fp, "%s\"%s\"", i ? ", " : "", t->specs[i].name); }
    fprintf(fp, "]\n}\n");
    fcloseCheck(fp);
    export_rename(tmp, path);
    return 8 + (size_t)header_len + offset;
}

#endif // M2RNN_EXPORT_H
