/*
test_train.c: the fp32 trainer end to end, on synthetic token shards it writes itself:
1. a tiny M²RNN hybrid overfits one batch (loss below 0.1);
2. exact resume: an uninterrupted run writes checkpoints; a second run resumes from the step-k checkpoint (copied
   into a fresh directory) and must reproduce every later loss bit for bit, with gradient accumulation on;
3. checkpoint round trip: the model, AdamW state and dataloader state read back identical to what was written.
`test_train --fixtures DIR` writes the shards and a small checkpoint into DIR and exits (test/test_cli.sh uses them
to test refusals of bad input through the real binary). `test_train --compare A.bin B.bin TOL` prints the largest
normwise relative difference of two checkpoints' weights and AdamW moments and exits 0 when it is below TOL (the MPI
test compares data-parallel runs with one-process runs).
*/
#define TESTING
#include "train_m2rnn.c"
#include "test/test_common.h"

#define TEST_VOCAB 61

// writes an llm.c shard (magic 20240520, version 1, uint16 tokens) of ntok tokens drawn from a few repeating
// "documents", so there is something to learn
static void write_shard(const char *path, size_t ntok, uint64_t seed) {
    FILE *fp = fopenCheck(path, "wb");
    int32_t header[256] = {0};
    header[0] = 20240520; header[1] = 1; header[2] = (int32_t)ntok;
    fwriteCheck(header, sizeof(int32_t), 256, fp);
    Rng rng = {seed};
    uint16_t *tokens = (uint16_t *)mallocCheck(ntok * sizeof(uint16_t));
    for (size_t i = 0; i < ntok; i++) {
        uint64_t r = rng_next_u64(&rng);
        tokens[i] = (uint16_t)((i % 7 == 0) ? 0 : ((i * 5 + (r % 3)) % (TEST_VOCAB - 1) + 1));
    }
    fwriteCheck(tokens, sizeof(uint16_t), ntok, fp);
    fcloseCheck(fp);
    free(tokens);
}

static void make_dir(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (system(cmd) != 0) { fail_with_hint("check build/ is writable", "cannot create %s", dir); }
}

static TrainOptions tiny_options(const char *data_dir, char *train_glob, char *val_glob) {
    snprintf(train_glob, 512, "%s/train_*.bin", data_dir);
    snprintf(val_glob, 512, "%s/val_*.bin", data_dir);
    TrainOptions o = train_options_default();
    o.train_pattern = train_glob;
    o.val_pattern = val_glob;
    o.init = "d32:MAM:n4:k16:v8:h2:f64";
    o.vocab_size = TEST_VOCAB;
    o.B = 2; o.T = 16;
    o.lr = 3e-3f; o.warmup = 3;
    o.val_every = 4; o.val_batches = 2;
    o.quiet = 1;
    return o;
}

static void write_fixture_data(const char *dir) {
    char path[600];
    snprintf(path, sizeof(path), "%s/train_000000.bin", dir);
    write_shard(path, 6000, 1);
    snprintf(path, sizeof(path), "%s/train_000001.bin", dir);
    write_shard(path, 4000, 2);
    snprintf(path, sizeof(path), "%s/val_000000.bin", dir);
    write_shard(path, 1000, 3);
}

static void test_overfit(const char *data_dir) {
    char tg[512], vg[512];
    TrainOptions o = tiny_options(data_dir, tg, vg);
    o.overfit = 1; o.max_steps = 150; o.lr = 1e-2f; o.warmup = 10; o.weight_decay = 0; o.val_every = 0;
    float losses[150];
    o.loss_trace = losses;
    train_run(&o);
    test_result(losses[149] < 0.1f, "overfit one batch (MAM, 150 steps)", "loss %.4f -> %.4f", losses[0], losses[149]);
}

static void test_resume(const char *data_dir, const char *work_dir) {
    char tg[512], vg[512], dir_a[600], dir_b[600], cmd[1400];
    snprintf(dir_a, sizeof(dir_a), "%s/run_a", work_dir);
    snprintf(dir_b, sizeof(dir_b), "%s/run_b", work_dir);
    make_dir(dir_a);
    make_dir(dir_b);
    enum { STEPS = 14, K = 6 };
    TrainOptions o = tiny_options(data_dir, tg, vg);
    o.max_steps = STEPS; o.total_batch = 2 * o.B * o.T; o.ckpt_every = K; o.out_dir = dir_a;
    float full[STEPS], resumed[STEPS];
    memset(resumed, 0, sizeof(resumed));
    o.loss_trace = full;
    train_run(&o);
    snprintf(cmd, sizeof(cmd), "cp '%s/ckpt_%08d.bin' '%s/'", dir_a, K, dir_b);
    if (system(cmd) != 0) { fail_with_hint("", "cannot copy the checkpoint"); }
    o.out_dir = dir_b; o.resume = 1; o.loss_trace = resumed;
    train_run(&o);
    int same = 1;
    for (int s = K; s < STEPS; s++) { same &= memcmp(&full[s], &resumed[s], sizeof(float)) == 0; }
    test_result(same, "resume at step 6 of 14 is bit-exact", "step 14 loss %.7f vs %.7f", full[STEPS - 1],
                resumed[STEPS - 1]);
    int learned = full[STEPS - 1] < full[0];
    test_result(learned, "the tiny run learns", "loss %.4f -> %.4f", full[0], full[STEPS - 1]);
    // the resumed run wrote its own checkpoints; the final one must equal the uninterrupted run's byte for byte
    snprintf(cmd, sizeof(cmd), "cmp -s '%s/ckpt_%08d.bin' '%s/ckpt_%08d.bin'", dir_a, STEPS, dir_b, STEPS);
    test_result(system(cmd) == 0, "final checkpoints identical byte for byte", "%s", "cmp");
}

static void test_checkpoint_roundtrip(const char *work_dir) {
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.vocab_size = TEST_VOCAB; c.m2rnn.grad_clamp = 0.5f;
    model_config_from_descriptor(&c, "d16:MARU:rh2:rv4:rope");
    Model *m = model_create(&c);
    model_init_weights(m, 7);
    const size_t n = m->table.num_parameters;
    real *mom = (real *)mallocCheck(n * sizeof(real)), *var = (real *)mallocCheck(n * sizeof(real));
    for (size_t i = 0; i < n; i++) { mom[i] = (real)(i % 17) * 0.25f; var[i] = (real)(i % 5); }
    uint8_t loader_state[40];
    for (int i = 0; i < 40; i++) { loader_state[i] = (uint8_t)(3 * i + 1); }
    CheckpointHeader h;
    memset(&h, 0, sizeof(h));
    h.config = m->config; h.elem_bytes = 4; h.has_optimizer = 1; h.num_parameters = n; h.step = 42; h.B = 3; h.T = 9;
    h.grad_accum = 2; h.rng_state = 0x1234567890ABCDEFULL; h.loader_state_bytes = 40;
    char path[600];
    snprintf(path, sizeof(path), "%s/roundtrip.bin", work_dir);
    checkpoint_write(path, &h, m->params_memory, mom, var, loader_state);
    CheckpointHeader r;
    checkpoint_read_header(path, &r);
    real *p2 = (real *)mallocCheck(n * sizeof(real)), *m2 = (real *)mallocCheck(n * sizeof(real));
    real *v2 = (real *)mallocCheck(n * sizeof(real));
    uint8_t ls2[40];
    checkpoint_read_payload(path, &r, p2, m2, v2, ls2);
    model_config_fill_defaults(&r.config);
    int ok = memcmp(p2, m->params_memory, n * sizeof(real)) == 0 && memcmp(m2, mom, n * sizeof(real)) == 0 &&
             memcmp(v2, var, n * sizeof(real)) == 0 && memcmp(ls2, loader_state, 40) == 0 && r.step == 42 &&
             r.B == 3 && r.T == 9 && r.grad_accum == 2 && r.rng_state == h.rng_state && r.version == 2 &&
             memcmp(&r.config, &m->config, sizeof(ModelConfig)) == 0;
    test_result(ok, "checkpoint round trip (config of every kind, params, m, v, loader)", "%zu parameters", n);
    // a flipped byte in the config text fails the checksum (the text is covered, not just the payload)
    char cmd[2000];
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s/flipped.bin' && printf 'X' | dd of='%s/flipped.bin' bs=1 seek=%d "
             "conv=notrunc 2>/dev/null", path, work_dir, work_dir, CKPT_CONFIG_OFFSET + 8);
    int flip_ok = system(cmd) == 0;
    snprintf(cmd, sizeof(cmd), "./train_m2rnn_cpu -e '%s/flipped.bin' -i nothing -j '' 2>&1 | grep -q 'checksum of its config'",
             work_dir);
    test_result(flip_ok && system(cmd) == 0, "a corrupted config text is refused", "%s", "through the binary");
    free(mom); free(var); free(p2); free(m2); free(v2);
    model_free(m);
}

// A version-1 checkpoint (the fixed-slot header of m2rnn before the layer-kind table) is still read: written here
// with that layout, it must load into the same config and parameters, and a run must start from it.
static void write_v1_checkpoint(const char *path, const ModelConfig *m, const float *params, size_t n) {
    int32_t h[256];
    memset(h, 0, sizeof(h));
    h[0] = CKPT_MAGIC; h[1] = 1; h[2] = 4; h[3] = 0;
    h[4] = m->vocab_size; h[5] = m->padded_vocab_size; h[6] = m->d_model; h[7] = m->n_layer;
    h[8] = m->m2rnn.heads; h[9] = m->m2rnn.qk_heads; h[10] = m->m2rnn.k; h[11] = m->m2rnn.v; h[12] = m->m2rnn.conv;
    memcpy(&h[13], &m->m2rnn.grad_clamp, 4);
    h[14] = m->attn.heads; h[15] = m->attn.head_dim; h[16] = m->attn.rope; memcpy(&h[17], &m->attn.rope_theta, 4);
    h[18] = m->swiglu.hidden;
    uint64_t num = n, sum = fnv1a_update(FNV1A_INIT, params, n * sizeof(float));
    memcpy(&h[20], &num, 8); h[22] = 5; h[25] = 0; memcpy(&h[26], &sum, 8);
    h[28] = 2; h[29] = 16; h[30] = 1;
    memcpy(&h[128], m->pattern, strlen(m->pattern) + 1);
    FILE *fp = fopenCheck(path, "wb");
    fwriteCheck(h, sizeof(int32_t), 256, fp);
    fwriteCheck(params, sizeof(float), n, fp);
    fcloseCheck(fp);
}

static void test_checkpoint_v1(const char *data_dir, const char *work_dir) {
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.vocab_size = TEST_VOCAB; c.m2rnn.grad_clamp = 1.0f;
    model_config_from_descriptor(&c, "d32:MAM:n4:k16:v8:h2:f64:rope");
    Model *m = model_create(&c);
    model_init_weights(m, 11);
    const size_t n = m->table.num_parameters;
    char path[600];
    snprintf(path, sizeof(path), "%s/v1.bin", work_dir);
    write_v1_checkpoint(path, &m->config, m->params_memory, n);
    CheckpointHeader r;
    checkpoint_read_header(path, &r);
    model_config_fill_defaults(&r.config);
    real *p = (real *)mallocCheck(n * sizeof(real));
    checkpoint_read_payload(path, &r, p, NULL, NULL, NULL);
    const int same = r.version == 1 && r.num_parameters == n && memcmp(&r.config, &m->config, sizeof(ModelConfig)) == 0 &&
                     memcmp(p, m->params_memory, n * sizeof(real)) == 0;
    test_result(same, "a version-1 checkpoint loads (config and parameters)", "%zu parameters, step %d", n, r.step);
    char tg[512], vg[512];
    TrainOptions o = tiny_options(data_dir, tg, vg);
    o.init = path; o.max_steps = 2; o.val_every = 0;
    const float loss = train_run(&o);
    test_result(isfinite(loss) && loss > 0, "a run starts from a version-1 checkpoint", "step-2 loss %.4f", loss);
    free(p);
    model_free(m);
}

// The weights-only export of a run (-o: model.safetensors + config.json) read back: every tensor's bytes, by its name
// in the safetensors header, equal the final checkpoint's parameters (the real vocabulary rows of the embeddings).
static void test_export_roundtrip(const char *data_dir, const char *work_dir) {
    char tg[512], vg[512], dir[600], path[700];
    snprintf(dir, sizeof(dir), "%s/export_run", work_dir);
    make_dir(dir);
    TrainOptions o = tiny_options(data_dir, tg, vg);
    o.init = "d32:MRUA:n4:k16:v8:h2:f64:rh2:rv4"; o.max_steps = 3; o.out_dir = dir; o.val_every = 0;
    train_run(&o);
    CheckpointHeader h;
    snprintf(path, sizeof(path), "%s/ckpt_%08d.bin", dir, 3);
    checkpoint_read_header(path, &h);
    ModelConfig c = h.config;
    model_config_fill_defaults(&c);
    ParamTable *t = (ParamTable *)mallocCheck(sizeof(ParamTable));
    param_table_build(t, &c);
    float *params = (float *)mallocCheck(h.num_parameters * sizeof(float));
    checkpoint_read_payload(path, &h, params, NULL, NULL, NULL);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    FILE *fp = fopenCheck(path, "rb");
    uint64_t hlen = 0;
    freadCheck(&hlen, 8, 1, fp);
    char *json = (char *)callocCheck(hlen + 1, 1);
    freadCheck(json, 1, hlen, fp);
    const int64_t data_start = 8 + (int64_t)hlen;
    int ok = hlen % 8 == 0 && json[0] == '{', found = 0;
    for (int i = 0; i < t->num_specs && ok; i++) {
        const ParamSpec *s = &t->specs[i];
        char key[80];
        snprintf(key, sizeof(key), "\"%s\":{\"dtype\":\"F32\"", s->name);
        const char *at = strstr(json, key);
        size_t b = 0, e = 0;
        const char *offs = at ? strstr(at, "\"data_offsets\":[") : NULL;
        ok = offs != NULL && sscanf(offs, "\"data_offsets\":[%zu,%zu]", &b, &e) == 2;
        const size_t rows = s->zero_rows_from < s->shape[0] ? s->zero_rows_from : s->shape[0];
        const size_t count = rows * (s->numel / s->shape[0]);
        ok = ok && e - b == count * sizeof(float);
        float *got = (float *)mallocCheck(count * sizeof(float) + 1);
        if (ok) {
            fseekCheck(fp, data_start + (int64_t)b, SEEK_SET);
            freadCheck(got, sizeof(float), count, fp);
            ok = memcmp(got, params + s->offset, count * sizeof(float)) == 0;
        }
        free(got);
        found += ok;
    }
    fcloseCheck(fp);
    test_result(ok && found == t->num_specs, "the run's weights-only export reads back (safetensors, every tensor)",
                "%d of %d tensors equal the final checkpoint", found, t->num_specs);
    free(json); free(params); free(t);
}

int main(int argc, char **argv) {
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
    if (argc == 5 && strcmp(argv[1], "--compare") == 0) {
        CheckpointHeader a, b;
        checkpoint_read_header(argv[2], &a);
        checkpoint_read_header(argv[3], &b);
        if (a.num_parameters != b.num_parameters || !a.has_optimizer || !b.has_optimizer) {
            fail_with_hint("compare checkpoints of one model, both with AdamW state", "'%s' and '%s' do not compare",
                           argv[2], argv[3]);
        }
        const size_t n = a.num_parameters;
        real *x[2][3];
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < 3; i++) { x[k][i] = (real *)mallocCheck(n * sizeof(real)); }
        }
        checkpoint_read_payload(argv[2], &a, x[0][0], x[0][1], x[0][2], NULL);
        checkpoint_read_payload(argv[3], &b, x[1][0], x[1][1], x[1][2], NULL);
        const char *names[3] = {"weights", "AdamW m", "AdamW v"};
        double worst = 0;
        for (int i = 0; i < 3; i++) {
            double num = 0, den = 0;
            for (size_t j = 0; j < n; j++) {
                const double d = (double)x[0][i][j] - x[1][i][j];
                num += d * d;
                den += (double)x[1][i][j] * x[1][i][j];
            }
            const double rel = sqrt(num / (den > 0 ? den : 1));
            printf("%s %.3e ", names[i], rel);
            worst = fmax(worst, rel);
        }
        printf("(step %d and %d)\n", a.step, b.step);
        return worst < atof(argv[4]) ? 0 : 1;
    }
    if (argc == 3 && strcmp(argv[1], "--fixtures") == 0) {
        // shards plus a 2-step run with a checkpoint, for test/test_cli.sh
        make_dir(argv[2]);
        write_fixture_data(argv[2]);
        char tg[512], vg[512], out[600];
        snprintf(out, sizeof(out), "%s/run", argv[2]);
        TrainOptions o = tiny_options(argv[2], tg, vg);
        o.max_steps = 2; o.ckpt_every = 2; o.out_dir = out;
        train_run(&o);
        return 0;
    }
    const char *work = "build/test_train_data";
    make_dir(work);
    write_fixture_data(work);
    test_checkpoint_roundtrip(work);
    test_checkpoint_v1(work, work);
    test_export_roundtrip(work, work);
    test_overfit(work);
    test_resume(work, work);
    return test_summary("test_train");
}
