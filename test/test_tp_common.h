/*
test_tp_common.h: what the two tensor-parallel layer tests share (test_tp_shard: the ranks one after another in one
process; test_tp_mpi: the ranks as MPI processes): seeded random tensors around each tensor's init, and the relative
error. Included after train_m2rnn.c (the CPU reference's real, Rng, ParamDef).
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

#endif // M2RNN_TEST_TP_COMMON_H
