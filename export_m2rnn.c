/*
export_m2rnn.c: ./export_m2rnn, the weights of a trainer checkpoint as model.safetensors + config.json (export.h), the
files other tools load. The AdamW state and the dataloader position are left out; F32 by default (the master
weights exactly), BF16 on request (what the GPU computes with, half the size).
usage: ./export_m2rnn CKPT OUT_DIR [--dtype f32|bf16]
*/
#include "checkpoint.h" // defines: the checkpoint reader
#include "export.h"     // defines: export_model (safetensors + config.json)
#include "model.h"      // defines: the config and the parameter table the tensors are named by
#include "utils.h"      // defines: check macros, fail_with_hint

#ifndef TESTING
int main(int argc, char **argv) {
    program_name = argv[0];
    const char *hint = "usage: ./export_m2rnn CKPT OUT_DIR [--dtype f32|bf16]";
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("%s\nwrites OUT_DIR/model.safetensors and OUT_DIR/config.json from a ckpt_*.bin\n", hint);
        return 0;
    }
    if (argc != 3 && argc != 5) { fail_with_hint(hint, "expected a checkpoint and an output directory"); }
    int bf16 = 0;
    if (argc == 5) {
        if (strcmp(argv[3], "--dtype") != 0 || (strcmp(argv[4], "f32") != 0 && strcmp(argv[4], "bf16") != 0)) {
            fail_with_hint(hint, "unknown option '%s %s'", argv[3], argv[4]);
        }
        bf16 = strcmp(argv[4], "bf16") == 0;
    }
    CheckpointHeader h;
    checkpoint_read_header(argv[1], &h);
    ModelConfig c = h.config;
    model_config_fill_defaults(&c);
    model_config_validate(&c);
    ParamTable *t = (ParamTable *)mallocCheck(sizeof(ParamTable));
    param_table_build(t, &c);
    if (t->num_parameters != h.num_parameters) {
        fail_with_hint("the checkpoint is damaged or from another m2rnn version",
                       "checkpoint '%s' holds %llu parameters, its config implies %zu", argv[1],
                       (unsigned long long)h.num_parameters, t->num_parameters);
    }
    void *params = mallocCheck(h.num_parameters * (size_t)h.elem_bytes);
    checkpoint_read_payload(argv[1], &h, params, NULL, NULL, NULL);
    float *f32 = (float *)params;
    if (h.elem_bytes == 8) { // a float64 test build's checkpoint
        f32 = (float *)mallocCheck(h.num_parameters * sizeof(float));
        for (size_t i = 0; i < h.num_parameters; i++) { f32[i] = (float)((const double *)params)[i]; }
    }
    create_dir_if_not_exists(argv[2]);
    const size_t bytes = export_model(argv[2], &c, t, f32, bf16);
    printf("wrote %s/model.safetensors (%s, %d tensors, %.1f MB) and %s/config.json from %s (step %d)\n", argv[2],
           bf16 ? "BF16" : "F32", t->num_specs, bytes / 1e6, argv[2], argv[1], h.step);
    return 0;
}
#endif
