/*
bench_cpu_step.c: times one training step of the fp32 CPU reference (forward, backward, AdamW update) on random
tokens, and reports the median over several steps with the split between the parts, tokens/s and achieved GFLOP/s
(FLOPs counted by model_flops_per_token, the same count MFU uses).
usage: build/bench_cpu_step [descriptor] [B] [T] [steps]     default: d256:l4:MMAM 4 256 5
*/
#define TESTING
#include "train_m2rnn.c"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *descriptor = argc > 1 ? argv[1] : "d256:l4:MMAM";
    const int B = argc > 2 ? atoi(argv[2]) : 4, T = argc > 3 ? atoi(argv[3]) : 256;
    const int steps = argc > 4 ? atoi(argv[4]) : 5;
    ModelConfig config;
    memset(&config, 0, sizeof(config));
    config.m2rnn.grad_clamp = 1.0f;
    config.vocab_size = 50257;
    model_config_from_descriptor(&config, descriptor);
    Model *model = model_create(&config);
    model_init_weights(model, 1);
    int *tokens = (int *)mallocCheck((size_t)(B * T + 1) * sizeof(int));
    Rng rng = {5};
    for (int i = 0; i <= B * T; i++) { tokens[i] = (int)(rng_next_u64(&rng) % 50257); }
    OptimizerConfig opt = {3e-4f, 0.9f, 0.95f, 1e-10f, 0.1f, 1.0f};
    double *fwd = (double *)mallocCheck(steps * sizeof(double)), *bwd = (double *)mallocCheck(steps * sizeof(double));
    double *upd = (double *)mallocCheck(steps * sizeof(double)), *tot = (double *)mallocCheck(steps * sizeof(double));
    for (int s = -1; s < steps; s++) { // step -1 is the warm-up (allocations, page faults)
        double t0 = wall_seconds();
        model_zero_grad(model);
        model_forward(model, tokens, tokens + 1, B, T);
        double t1 = wall_seconds();
        model_backward(model, 1);
        double t2 = wall_seconds();
        model_update(model, &opt, s + 2, model_grad_norm(model));
        double t3 = wall_seconds();
        if (s >= 0) { fwd[s] = t1 - t0; bwd[s] = t2 - t1; upd[s] = t3 - t2; tot[s] = t3 - t0; }
    }
    qsort(fwd, steps, sizeof(double), cmp_double); qsort(bwd, steps, sizeof(double), cmp_double);
    qsort(upd, steps, sizeof(double), cmp_double); qsort(tot, steps, sizeof(double), cmp_double);
    const double med = tot[steps / 2];
    const double flops = model_flops_per_token(&model->config, T) * B * T;
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif
    printf("model %s (%zu parameters), B=%d T=%d, %d threads, median of %d steps\n", descriptor,
           param_table_count(&model->table), B, T, threads, steps);
    printf("| step ms | forward ms | backward ms | update ms | tokens/s | GFLOP/s |\n");
    printf("|---|---|---|---|---|---|\n");
    printf("| %.1f | %.1f | %.1f | %.1f | %.0f | %.1f |\n", 1e3 * med, 1e3 * fwd[steps / 2], 1e3 * bwd[steps / 2],
           1e3 * upd[steps / 2], B * T / med, flops / med * 1e-9);
    model_free(model);
    free(tokens); free(fwd); free(bwd); free(upd); free(tot);
    return 0;
}
