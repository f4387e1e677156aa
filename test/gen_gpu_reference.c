/*
gen_gpu_reference.c: writes what the GPU trainer test (test/test_gpu_trainer.cu) holds the CUDA trainer to, computed
by the fp32 CPU reference: a checkpoint of a tiny hybrid with non-trivial weights (W, U_n, D and the norm weights
moved off their identity/ones init so a transposed or skipped op shows), and a data file with 21 batches, the logits
and loss of the first batch, every parameter gradient of that batch, and the losses of 20 AdamW steps; then the
logits, loss and gradients once more with the weights rounded to bf16 as the bf16 GPU build holds them (all but A_log
and dt_bias, which the GPU reads from its fp32 master). The bf16 build is compared with the latter: some gradients
(A_log, dt_bias and W of a layer) move by 3-5e-2 from that rounding alone, in exact fp32 arithmetic, which no kernel
can undo. Four models: MMAM (M²RNN, six value heads sharing one q/k head, RoPE attention of 4 query heads over 2 kv
heads: GQA), RUAR (the RNN and GRU baselines with RoPE attention, 2 heads) and GAGM (Gated DeltaNet[−1,1], 2 heads of
K=32, V=48, beside attention and M²RNN) and SAMS (Mamba-2: 4 heads of P=32, state N=24, 2 groups, beside attention
and M²RNN). (RUAR with 4 attention heads is a
chaotic trainer: on an H100 the fp32 GPU build tracks the CPU for 4 steps, then the gap grows about 2× a step to 1e-2
at step 20, with or without GQA, while its first-step gradients agree at 2e-6: rounding amplified, not a wrong op.)
usage: build/gen_gpu_reference OUT_DIR PATTERN [HEADS KV_HEADS | gn]  (PATTERN: MMAM, RUAR, GAGM or SAMS; gn: the M²RNN with 2 q/k heads and a norm per q/k group, the topology-aware TP model)   → OUT_DIR/gpu_ref_ckpt.bin, OUT_DIR/gpu_ref_data.bin
*/
#define TESTING
#include "train_m2rnn.c"

#define GPU_REF_MAGIC 20261123
#define GPU_REF_STEPS 20

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4 && argc != 5) {
        fail_with_hint("pass an output directory and MMAM or RUAR", "usage: gen_gpu_reference OUT_DIR PATTERN [HEADS KV_HEADS]");
    }
    create_dir_if_not_exists(argv[1]);
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
    ModelConfig config;
    memset(&config, 0, sizeof(config));
    config.vocab_size = 300; config.d_model = 256; config.m2rnn.heads = 6; config.m2rnn.qk_heads = 1;
    config.m2rnn.k = 16; config.m2rnn.v = 16; config.attn.heads = 2; config.attn.head_dim = 32;
    config.swiglu.hidden = 128; config.m2rnn.grad_clamp = 1.0f; config.attn.rope = 1;
    config.vrnn.heads = 8; config.vrnn.head_dim = 16;
    config.gdn.heads = 2; config.gdn.k = 32; config.gdn.v = 48; config.gdn.neg = 1; // K, V short of the 64-wide tiles
    config.mamba2.inner = 128; config.mamba2.head_dim = 32; config.mamba2.state = 24; config.mamba2.groups = 2;
    if (strcmp(argv[2], "MMAM") != 0 && strcmp(argv[2], "RUAR") != 0 && strcmp(argv[2], "GAGM") != 0 &&
        strcmp(argv[2], "SAMS") != 0) {
        fail_with_hint("the references are MMAM, RUAR, GAGM and SAMS", "unknown reference pattern '%s'", argv[2]);
    }
    if (strcmp(argv[2], "MMAM") == 0) { config.attn.heads = 4; config.attn.kv_heads = 2; } // GQA: 2 q heads a kv head
    if (argc == 5) { config.attn.heads = atoi(argv[3]); config.attn.kv_heads = atoi(argv[4]); } // other attention shapes
    if (argc == 4 && strcmp(argv[3], "gn") == 0) { // M²RNN topology-aware: 2 q/k heads, a norm per q/k group
        config.m2rnn.qk_heads = 2;
        config.m2rnn.group_norm = 1;
    }
    snprintf(config.pattern, sizeof(config.pattern), "%s", argv[2]);
    Model *mp = model_create(&config);
    model_init_weights(mp, 42);
    Rng rng = {99};
    for (int i = 0; i < mp->table.num_specs; i++) {
        const ParamSpec *s = &mp->table.specs[i];
        real *p = mp->params_memory + s->offset;
        if (ends_with(s->name, ".W") || ends_with(s->name, ".U_n")) {
            for (size_t j = 0; j < s->numel; j++) { p[j] += (real)(0.3 / 4.0 * rng_normal(&rng)); }
        }
        if (ends_with(s->name, ".D") || ends_with(s->name, "norm_w") || ends_with(s->name, "ln1_w") ||
            ends_with(s->name, "ln2_w") || ends_with(s->name, "lnf_w")) {
            for (size_t j = 0; j < s->numel; j++) { p[j] += (real)(0.2 * rng_normal(&rng)); }
        }
    }
    const int B = 2, T = 80, BT = B * T;
    // batches: a little structure so the loss can fall
    int *tokens = (int *)mallocCheck((size_t)(GPU_REF_STEPS + 1) * (BT + 1) * sizeof(int));
    for (int s = 0; s <= GPU_REF_STEPS; s++) {
        for (int i = 0; i <= BT; i++) {
            tokens[s * (BT + 1) + i] = (int)((i * 7 + (rng_next_u64(&rng) % 5) + s) % config.vocab_size);
        }
    }
    char path[1024];
    snprintf(path, sizeof(path), "%s/gpu_ref_ckpt.bin", argv[1]);
    CheckpointHeader h;
    memset(&h, 0, sizeof(h));
    h.config = mp->config; h.elem_bytes = 4; h.num_parameters = mp->table.num_parameters; h.B = B; h.T = T;
    h.grad_accum = 1;
    checkpoint_write(path, &h, mp->params_memory, NULL, NULL, NULL);

    const size_t n = mp->table.num_parameters, Vp = (size_t)mp->config.padded_vocab_size;
    model_zero_grad(mp);
    const float loss0 = (float)model_forward(mp, tokens, tokens + 1, B, T);
    float *logits = (float *)mallocCheck((size_t)BT * Vp * sizeof(float));
    memcpy(logits, mp->logits, (size_t)BT * Vp * sizeof(float));
    model_backward(mp, 1.0f);
    float *grads = (float *)mallocCheck(n * sizeof(float));
    memcpy(grads, mp->grads_memory, n * sizeof(float));
    // 20 steps on batches 1..20, the optimizer as the trainer runs it
    OptimizerConfig opt = {1e-3f, 0.9f, 0.95f, 1e-10f, 0.1f, 1.0f};
    // the same batch with bf16-rounded weights (rounded to nearest even, as the GPU's cast does)
    float *params0 = (float *)mallocCheck(n * sizeof(float));
    memcpy(params0, mp->params_memory, n * sizeof(float));
    for (int i = 0; i < mp->table.num_specs; i++) {
        const ParamSpec *s = &mp->table.specs[i];
        if (ends_with(s->name, ".A_log") || ends_with(s->name, ".dt_bias")) { continue; }
        for (size_t j = 0; j < s->numel; j++) {
            mp->params_memory[s->offset + j] = bf16_round(mp->params_memory[s->offset + j]);
        }
    }
    model_zero_grad(mp);
    const float loss0_bf16w = (float)model_forward(mp, tokens, tokens + 1, B, T);
    float *logits_bf16w = (float *)mallocCheck((size_t)BT * Vp * sizeof(float));
    memcpy(logits_bf16w, mp->logits, (size_t)BT * Vp * sizeof(float));
    model_backward(mp, 1.0f);
    float *grads_bf16w = (float *)mallocCheck(n * sizeof(float));
    memcpy(grads_bf16w, mp->grads_memory, n * sizeof(float));
    memcpy(mp->params_memory, params0, n * sizeof(float));
    float losses[GPU_REF_STEPS];
    for (int s = 0; s < GPU_REF_STEPS; s++) {
        const int *batch = tokens + (s + 1) * (BT + 1);
        model_zero_grad(mp);
        losses[s] = (float)model_forward(mp, batch, batch + 1, B, T);
        model_backward(mp, 1.0f);
        model_update(mp, &opt, s + 1, model_grad_norm(mp));
    }
    snprintf(path, sizeof(path), "%s/gpu_ref_data.bin", argv[1]);
    FILE *fp = fopenCheck(path, "wb");
    int32_t header[8] = {GPU_REF_MAGIC, B, T, GPU_REF_STEPS, (int32_t)n, (int32_t)Vp, 0, 0};
    fwriteCheck(header, sizeof(int32_t), 8, fp);
    fwriteCheck(tokens, sizeof(int), (size_t)(GPU_REF_STEPS + 1) * (BT + 1), fp);
    fwriteCheck(&loss0, sizeof(float), 1, fp);
    fwriteCheck(logits, sizeof(float), (size_t)BT * Vp, fp);
    fwriteCheck(grads, sizeof(float), n, fp);
    fwriteCheck(losses, sizeof(float), GPU_REF_STEPS, fp);
    fwriteCheck(&loss0_bf16w, sizeof(float), 1, fp);
    fwriteCheck(logits_bf16w, sizeof(float), (size_t)BT * Vp, fp);
    fwriteCheck(grads_bf16w, sizeof(float), n, fp);
    fcloseCheck(fp);
    printf("wrote %s: %zu parameters, loss %.6f, step-20 loss %.6f\n", path, n, loss0, losses[GPU_REF_STEPS - 1]);
    free(tokens); free(logits); free(grads); free(params0); free(logits_bf16w); free(grads_bf16w);
    model_free(mp);
    return 0;
}
