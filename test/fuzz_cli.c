/*
fuzz_cli.c: libFuzzer harness for the trainer's command line (train_loop.h's parse_args) and the model descriptor
parser with the config validation behind it (model.h; make fuzz). The input is split at newlines into argv; then
-e's descriptor (unless it names a checkpoint file) is parsed, filled and validated, and its parameter table built,
exactly as train_run would before allocating anything. A refusal is an answer (the fuzz build turns fail_with_hint
and -h's exit into a return), a crash, a hang or a sanitizer report is a bug.
*/
#define TESTING
#define M2RNN_FUZZ
#include "train_m2rnn.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) { return 0; }
    char *buf = (char *)malloc(size + 1);
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)"./train_m2rnn_cpu";
    for (char *p = buf; argc < 63;) {
        argv[argc++] = p;
        char *nl = strchr(p, '\n');
        if (nl == NULL) { break; }
        *nl = '\0';
        p = nl + 1;
    }
    jmp_buf escape;
    fuzz_escape = &escape;
    FILE *saved_stdout = stdout;
    if (setjmp(escape) == 0) {
        stdout = fopen("/dev/null", "w"); // -h prints the usage
        TrainOptions o = train_options_default();
        parse_args(&o, argc, argv);
        if (!ends_with(o.init, ".bin")) {
            ModelConfig c;
            memset(&c, 0, sizeof(c));
            c.vocab_size = o.vocab_size;
            c.attn.rope = o.use_rope;
            c.m2rnn.grad_clamp = o.rnn_clamp;
            model_config_from_descriptor(&c, o.init);
            model_config_fill_defaults(&c);
            model_config_validate(&c);
            ParamTable *t = (ParamTable *)malloc(sizeof(ParamTable));
            param_table_build(t, &c);
            free(t);
        }
    }
    if (stdout != saved_stdout) { fclose(stdout); stdout = saved_stdout; }
    fuzz_escape = NULL;
    free(buf);
    return 0;
}
