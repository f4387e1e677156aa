/*
test_tp_common.h: what the two tensor-parallel layer tests share (test_tp_shard: the ranks one after another in one
process; test_tp_mpi: the ranks as MPI processes): seeded random tensors around each tensor's init, and the relative
error, the whole layer's run. Included after train_m2rnn.c (the CPU reference's real, Rng, ParamDef, KindOps).
*/
#ifndef M2RNN_TEST_TP_COMMON_H
#define M2RNN_TEST_TP_COMMON_H

#define MAXP 16 // tensors of one kind

static Rng tp_rng = {2024};

static real *tp_random(size_t n, double scale, double offset) {
    real *x = (real *)mallocCheck((n + 1) * sizeof(real));
    for (size_t i = 0; i < n; i++) { x[i] = (real)(offset + scale * rng_normal(&tp_rng)); }
    return x;
}

static size_t numel_of(const ParamDef *d) { return d->shape[0] * d->shape[1] * d->shape[2]; }

// a tensor's values around its init, off it so that a transposed or skipped piece shows
static real *tp_random_tensor(const ParamDef *d) {
    double scale = 0.2, offset = 0.0;
    if (d->init == INIT_ONES) { offset = 1.0; }
    if (d->init == INIT_A_LOG || d->init == INIT_A_LOG_1_16) { scale = 0.3; offset = 0.5; }
    if (d->init == INIT_DT_BIAS) { scale = 0.3; offset = -2.0; }
    return tp_random(numel_of(d), scale, offset);
}

static double rel(const real *a, const real *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

// the whole layer (config c, weights w; its gradients accumulate into g) in one process: out and dinp (B,T,C)
// returned fresh (the caller frees them), from inp and dout
static void tp_run_whole(real **out, real **dinp, const KindOps *ops, const ModelConfig *c, real **w, real **g,
                         const real *inp, const real *dout, int B, int T) {
    const size_t BTC = (size_t)B * T * c->d_model;
    *out = (real *)callocCheck(BTC, sizeof(real));
    *dinp = (real *)callocCheck(BTC, sizeof(real));
    real *acts = (real *)callocCheck(ops->acts_size(c, B, T) + 1, sizeof(real));
    real *scratch = (real *)callocCheck(ops->scratch_size(c, B, T) + 1, sizeof(real));
    KindTensors t = {w, g, NULL, 1.0f, NULL};
    ops->forward(*out, acts, inp, &t, c, B, T);
    ops->backward(*dinp, scratch, dout, inp, acts, &t, c, B, T);
    free(acts);
    free(scratch);
}

#endif // M2RNN_TEST_TP_COMMON_H
