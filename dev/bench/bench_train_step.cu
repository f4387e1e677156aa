/*
bench_train_step.cu: one training step of the CUDA trainer (forward, backward, AdamW) on random tokens, timed with
CUDA events after warm-up; prints the median step time, tokens/s, MFU (FLOPs from model_flops_per_token, which counts
the recurrence, conv and causal attention) and peak device memory, plus a split of the step by part.
usage: build/bench_train_step DESCRIPTOR B T [steps] [warmup] [vocab]   (vocab: 50257 unless given, e.g. 100352)
*/
#define TESTING
#include "train_m2rnn.cu"

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 4) { fail_with_hint("e.g. build/bench_train_step d768:MMMAMMMAMMMA 16 1024", "usage: bench_train_step DESCRIPTOR B T [steps]"); }
    const int B = atoi(argv[2]), T = atoi(argv[3]), steps = argc > 4 ? atoi(argv[4]) : 10;
    const int warmup = argc > 5 ? atoi(argv[5]) : 3;
    ModelConfig config;
    memset(&config, 0, sizeof(config));
    config.vocab_size = argc > 6 ? atoi(argv[6]) : 50257;
    config.m2rnn.grad_clamp = 1.0f;
    model_config_from_descriptor(&config, argv[1]);
    Model *model = model_create(&config);
    model_init_weights(model, 1);
    cudaStream_t stream = model->rt.stream;
    int *tokens = (int *)mallocCheck((size_t)(B * T + 1) * sizeof(int));
    Rng rng = {3};
    for (int i = 0; i <= B * T; i++) { tokens[i] = (int)(rng_next_u64(&rng) % config.vocab_size); }
    OptimizerConfig opt = {3e-4f, 0.9f, 0.95f, 1e-10f, 0.1f, 1.0f};
    cudaEvent_t ev[4];
    for (int i = 0; i < 4; i++) { cudaCheck(cudaEventCreate(&ev[i])); }
    float *fwd = (float *)mallocCheck(steps * sizeof(float)), *bwd = (float *)mallocCheck(steps * sizeof(float));
    float *upd = (float *)mallocCheck(steps * sizeof(float)), *tot = (float *)mallocCheck(steps * sizeof(float));
    for (int s = -warmup; s < steps; s++) {
        cudaCheck(cudaEventRecord(ev[0], stream));
        model_zero_grad(model);
        model_forward(model, tokens, tokens + 1, B, T);
        cudaCheck(cudaEventRecord(ev[1], stream));
        model_backward(model, 1.0f);
        cudaCheck(cudaEventRecord(ev[2], stream));
        model_update(model, &opt, s + warmup + 1, model_grad_norm(model));
        cudaCheck(cudaEventRecord(ev[3], stream));
        cudaCheck(cudaEventSynchronize(ev[3]));
        if (s >= 0) {
            cudaCheck(cudaEventElapsedTime(&fwd[s], ev[0], ev[1]));
            cudaCheck(cudaEventElapsedTime(&bwd[s], ev[1], ev[2]));
            cudaCheck(cudaEventElapsedTime(&upd[s], ev[2], ev[3]));
            cudaCheck(cudaEventElapsedTime(&tot[s], ev[0], ev[3]));
        }
    }
    qsort(fwd, steps, sizeof(float), cmp_float); qsort(bwd, steps, sizeof(float), cmp_float);
    qsort(upd, steps, sizeof(float), cmp_float); qsort(tot, steps, sizeof(float), cmp_float);
    const double ms = tot[steps / 2], flops = model_flops_per_token(&model->config, T) * B * T;
    size_t free_b, total_b;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    const double peak = executor_peak_flops(model);
    printf("| %s | %s | %zu | %d | %d | %.1f | %.1f | %.1f | %.1f | %.0f | %.1f%% | %.1f |\n", model->rt.prop.name,
           argv[1], param_table_count(&model->table), B, T, ms, fwd[steps / 2], bwd[steps / 2], upd[steps / 2],
           B * T / ms * 1e3, peak > 0 ? 100.0 * flops / (ms * 1e-3) / peak : 0.0, (total_b - free_b) / 1073741824.0);
    model_free(model);
    return 0;
}
