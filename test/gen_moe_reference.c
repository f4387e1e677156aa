/*
gen_moe_reference.c: writes the cases test/test_moe_gpu.cu holds the GPU MoE layer (moe.cuh) to, computed by the
fp32 CPU reference (ref/moe.h): inputs, weights and output gradients rounded to bf16 (so the bf16 GPU build reads the
very numbers the reference used), the layer's output, its input gradient, every parameter gradient and the
load-balancing loss. The cases:
  general   M = 77 tokens (a multiple of nothing), E = 8, top-2, a shared expert
  ties      experts 2 and 5 have the same router row, as do 0 and 6: their logits tie exactly, the lower one wins
  one       top-1 and every token routed to expert 3 (a dominant router row along a feature all tokens share): seven
            experts receive nothing, aux = coef · E · P̄_3 (its closed form, checked here too)
  wide      E = 160 experts (five logits a lane), top-8, no shared expert, M = 33: most experts empty or single
usage: build/gen_moe_reference OUT_DIR   → OUT_DIR/moe_<case>.bin
*/
#define TESTING
#include "train_m2rnn.c"

#define MOE_REF_MAGIC 20261124

typedef struct { const char *name; int M, C, E, K, F, S; uint64_t seed; } MoECase;

static void fill(float *x, size_t n, float scale, Rng *rng) {
    for (size_t i = 0; i < n; i++) { x[i] = bf16_round(scale * (2.0f * (float)rng_uniform(rng) - 1.0f)); }
}

int main(int argc, char **argv) {
    if (argc != 2) { fail_with_hint("pass an output directory", "usage: gen_moe_reference OUT_DIR"); }
    create_dir_if_not_exists(argv[1]);
    const MoECase cases[] = {{"general", 77, 64, 8, 2, 32, 48, 11}, {"ties", 64, 64, 8, 2, 32, 16, 12},
                             {"one", 50, 64, 8, 1, 32, 16, 13}, {"wide", 33, 96, 160, 8, 16, 0, 14}};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const MoECase *k = &cases[ci];
        ModelConfig c;
        memset(&c, 0, sizeof(c));
        c.d_model = k->C;
        c.moe.experts = k->E; c.moe.top_k = k->K; c.moe.hidden = k->F; c.moe.shared = k->S; c.moe.aux_coef = 0.01f;
        const size_t M = (size_t)k->M, C = (size_t)k->C, E = (size_t)k->E, F = (size_t)k->F, S = (size_t)k->S;
        const size_t sizes[5] = {E * C, E * 2 * F * C, E * C * F, 2 * S * C, C * S};
        Rng rng = {k->seed};
        float *x = (float *)mallocCheck(M * C * sizeof(float)), *dout = (float *)mallocCheck(M * C * sizeof(float));
        fill(x, M * C, 1.0f, &rng);
        fill(dout, M * C, 1.0f, &rng);
        float *w[5], *g[5];
        for (int p = 0; p < 5; p++) {
            w[p] = (float *)mallocCheck((sizes[p] + 1) * sizeof(float));
            g[p] = (float *)callocCheck(sizes[p] + 1, sizeof(float));
            fill(w[p], sizes[p], p == 0 ? 0.5f : 0.2f, &rng);
        }
        if (strcmp(k->name, "ties") == 0) { // router rows 5 = 2 and 6 = 0: exact ties
            memcpy(w[0] + 5 * C, w[0] + 2 * C, C * sizeof(float));
            memcpy(w[0] + 6 * C, w[0] + 0 * C, C * sizeof(float));
        }
        if (strcmp(k->name, "one") == 0) { // every token has x[0] ≥ 1 and expert 3's row is 16 along it
            for (size_t m = 0; m < M; m++) { x[m * C] = bf16_round(1.0f + 0.5f * (float)rng_uniform(&rng)); }
            for (size_t i = 0; i < C; i++) { w[0][3 * C + i] = bf16_round(i == 0 ? 16.0f : 0.01f * w[0][3 * C + i]); }
        }
        MoEActs a;
        MoEGrads gr;
        const size_t na = moe_acts_layout(&a, NULL, &c, 1, k->M), ns = moe_scratch_layout(&gr, NULL, &c, 1, k->M);
        float *acts = (float *)callocCheck(na, sizeof(float)), *scratch = (float *)callocCheck(ns, sizeof(float));
        float *out = (float *)callocCheck(M * C, sizeof(float)), *dx = (float *)callocCheck(M * C, sizeof(float));
        double aux = 0.0;
        const float aux_grad = 0.7f;
        KindTensors t = {w, g, &aux, aux_grad};
        MOE_OPS.forward(out, acts, x, &t, &c, 1, k->M);
        MOE_OPS.backward(dx, scratch, dout, x, acts, &t, &c, 1, k->M);
        moe_acts_layout(&a, acts, &c, 1, k->M);
        if (strcmp(k->name, "one") == 0) { // every token to expert 3; the aux loss in closed form
            double pbar = 0.0;
            for (size_t m = 0; m < M; m++) { pbar += a.probs[m * E + 3]; }
            const double closed = 0.01 * (double)E * (pbar / (double)M);
            if ((int)a.offsets[4] - (int)a.offsets[3] != k->M || fabs(closed - aux) > 1e-6 * closed) {
                fail_with_hint("the reference's routing is wrong", "case 'one': %d of %d tokens at expert 3, aux %.8g "
                               "against %.8g", (int)(a.offsets[4] - a.offsets[3]), k->M, aux, closed);
            }
        }
        int empty = 0;
        for (size_t e = 0; e < E; e++) { empty += a.offsets[e + 1] == a.offsets[e]; }
        char path[4200];
        snprintf(path, sizeof(path), "%s/moe_%s.bin", argv[1], k->name);
        FILE *fp = fopenCheck(path, "wb");
        const int32_t header[8] = {MOE_REF_MAGIC, k->M, k->C, k->E, k->K, k->F, k->S, empty};
        const float scalars[3] = {0.01f, aux_grad, (float)aux};
        fwriteCheck(header, sizeof(int32_t), 8, fp);
        fwriteCheck(scalars, sizeof(float), 3, fp);
        fwriteCheck(x, sizeof(float), M * C, fp);
        fwriteCheck(dout, sizeof(float), M * C, fp);
        for (int p = 0; p < 5; p++) { fwriteCheck(w[p], sizeof(float), sizes[p], fp); }
        fwriteCheck(out, sizeof(float), M * C, fp);
        fwriteCheck(dx, sizeof(float), M * C, fp);
        for (int p = 0; p < 5; p++) { fwriteCheck(g[p], sizeof(float), sizes[p], fp); }
        fcloseCheck(fp);
        printf("%s: M=%d E=%d top-%d, %d empty experts, aux %.6g\n", path, k->M, k->E, k->K, empty, aux);
        for (int p = 0; p < 5; p++) { free(w[p]); free(g[p]); }
        free(x); free(dout); free(acts); free(scratch); free(out); free(dx);
    }
    return 0;
}
