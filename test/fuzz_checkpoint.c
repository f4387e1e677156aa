/*
fuzz_checkpoint.c: libFuzzer harness for the checkpoint reader (checkpoint.h), the config text parser and the model
build a checkpoint's header leads to (make fuzz). Each input is written as a checkpoint file and read the way the
trainer reads one: the header (version 1 and 2 layouts, the config text, sizes against the file's length), the
config's defaults and validation, the parameter table, and the payload with its checksum. A refusal is an answer
(the fuzz build turns fail_with_hint into a return); a crash, a hang or a sanitizer report is a bug.
The first bytes of an input choose between a raw file and a mutated valid checkpoint, so the fuzzer gets past the
magic and checksums into the config text and the size checks.
*/
#define TESTING
#define M2RNN_FUZZ
#include "train_m2rnn.c"

static char fuzz_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    snprintf(fuzz_path, sizeof(fuzz_path), "/tmp/fuzz_ckpt_%d.bin", (int)getpid());
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 20)) { return 0; }
    FILE *fp = fopen(fuzz_path, "wb");
    if (fp == NULL) { abort(); }
    if (size > 0 && data[0] == 'V' && size > 1) {
        // a valid version-2 header around the fuzzer's config text and payload: the checksums pass, the text is fuzzed
        uint8_t header[CKPT_HEADER_BYTES];
        memset(header, 0, sizeof(header));
        int32_t *h = (int32_t *)header;
        size_t text = size - 1 < CKPT_HEADER_BYTES - CKPT_CONFIG_OFFSET - 1 ? size - 1 : CKPT_HEADER_BYTES - CKPT_CONFIG_OFFSET - 1;
        while (text > 0 && memchr(data + 1, 0, text) != NULL) { text = (size_t)((const uint8_t *)memchr(data + 1, 0, text) - (data + 1)); }
        memcpy(header + CKPT_CONFIG_OFFSET, data + 1, text);
        ModelConfig c;
        char why[256];
        uint64_t n = 64;
        if (model_config_from_text(&c, (const char *)(header + CKPT_CONFIG_OFFSET), why, sizeof(why)) == NULL) {
            jmp_buf escape;
            fuzz_escape = &escape;
            if (setjmp(escape) == 0) {
                model_config_fill_defaults(&c);
                model_config_validate(&c);
                ParamTable *t = (ParamTable *)malloc(sizeof(ParamTable));
                param_table_build(t, &c);
                n = t->num_parameters;
                free(t);
            }
            fuzz_escape = NULL;
        }
        if (n > (1 << 18)) { fclose(fp); return 0; } // a real model: too large to write for every input
        h[0] = CKPT_MAGIC; h[1] = CKPT_VERSION; h[2] = 4; h[3] = 0; put_u64(h, 4, n); h[6] = 1; h[7] = 1; h[8] = 1;
        h[9] = 1; h[12] = 0; h[15] = (int32_t)text; h[16] = CKPT_HEADER_BYTES;
        put_u64(h, 18, fnv1a_update(FNV1A_INIT, header + CKPT_CONFIG_OFFSET, text));
        float *params = (float *)calloc(n, sizeof(float));
        uint64_t hash = fnv1a_update(fnv1a_update(FNV1A_INIT, header + CKPT_CONFIG_OFFSET, text), params, n * 4);
        put_u64(h, 13, hash);
        fwrite(header, 1, sizeof(header), fp);
        fwrite(params, sizeof(float), n, fp);
        free(params);
    } else {
        fwrite(data, 1, size, fp);
    }
    fclose(fp);
    jmp_buf escape;
    fuzz_escape = &escape;
    if (setjmp(escape) == 0) {
        CheckpointHeader h;
        CkptError e;
        if (checkpoint_try_read_header(fuzz_path, &h, &e)) {
            ModelConfig c = h.config;
            model_config_fill_defaults(&c);
            model_config_validate(&c);
            ParamTable *t = (ParamTable *)malloc(sizeof(ParamTable));
            param_table_build(t, &c);
            if (t->num_parameters == h.num_parameters && h.num_parameters <= (1 << 20)) {
                void *p = malloc(h.num_parameters * (size_t)h.elem_bytes);
                uint8_t loader[256];
                checkpoint_try_read_payload(fuzz_path, &h, p, NULL, NULL, h.loader_state_bytes <= 256 ? loader : NULL, &e);
                free(p);
            }
            free(t);
        }
    }
    fuzz_escape = NULL;
    return 0;
}
