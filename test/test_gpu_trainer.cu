/*
test_gpu_trainer.cu: the CUDA trainer held to the fp32 CPU reference on a tiny hybrid (MMAM with RoPE attention, six
M²RNN heads sharing one q/k head, written by build/gen_gpu_reference): the logits and loss of one batch, every
parameter gradient (normwise relative error per tensor), the losses of 20 AdamW steps, and bitwise-repeatable
gradients. The fp32 build (make PRECISION=FP32) is held at 1e-4 to the reference with the exact weights. The bf16
build, where the tensor-core recurrence and the plain fp32 recurrence are both checked, is held at 2e-2 to the
reference evaluated at the same bf16-rounded weights it computes with (its 20-step losses to the exact reference),
with one exception: the W gradient on the tensor-core path is held at 3e-2. That kernel feeds the MMA the state
rounded to bf16 every step and uses tanh.approx; dW = Σ_t H_{t−1}ᵀ dX sums those terms with heavy cancellation
(measured 2.3e-2 on an H200, against 1.85e-2 for the plain fp32 recurrence on the same weights).
Skips cleanly without a GPU.
usage: build/test_gpu_trainer [REF_DIR]   (default build/gpu_ref)
*/
#define TESTING
#include "train_m2rnn.cu"
#include "test/test_common.h"

#if FLOATX_IS_FP32
#define TOL 1e-4
#define SUITE "test_gpu_trainer_fp32"
#else
#define TOL 2e-2
#define SUITE "test_gpu_trainer"
#endif

typedef struct {
    int B, T, steps, n, Vp;
    int *tokens;          // (steps+1, B·T+1)
    float loss0;
    float *logits, *grads, *losses;
    float loss0_bf16w;                 // the same batch with bf16-rounded weights
    float *logits_bf16w, *grads_bf16w;
} Reference;

static void read_reference(Reference *r, const char *dir) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/gpu_ref_data.bin", dir);
    FILE *fp = fopenCheck(path, "rb");
    int32_t h[8];
    freadCheck(h, sizeof(int32_t), 8, fp);
    if (h[0] != 20261123) { fail_with_hint("run make build/gpu_ref/.done", "'%s' is not a GPU reference file", path); }
    r->B = h[1]; r->T = h[2]; r->steps = h[3]; r->n = h[4]; r->Vp = h[5];
    const size_t BT = (size_t)r->B * r->T;
    r->tokens = (int *)mallocCheck((size_t)(r->steps + 1) * (BT + 1) * sizeof(int));
    freadCheck(r->tokens, sizeof(int), (size_t)(r->steps + 1) * (BT + 1), fp);
    freadCheck(&r->loss0, sizeof(float), 1, fp);
    r->logits = (float *)mallocCheck(BT * r->Vp * sizeof(float));
    freadCheck(r->logits, sizeof(float), BT * r->Vp, fp);
    r->grads = (float *)mallocCheck((size_t)r->n * sizeof(float));
    freadCheck(r->grads, sizeof(float), (size_t)r->n, fp);
    r->losses = (float *)mallocCheck((size_t)r->steps * sizeof(float));
    freadCheck(r->losses, sizeof(float), (size_t)r->steps, fp);
    freadCheck(&r->loss0_bf16w, sizeof(float), 1, fp);
    r->logits_bf16w = (float *)mallocCheck(BT * r->Vp * sizeof(float));
    freadCheck(r->logits_bf16w, sizeof(float), BT * r->Vp, fp);
    r->grads_bf16w = (float *)mallocCheck((size_t)r->n * sizeof(float));
    freadCheck(r->grads_bf16w, sizeof(float), (size_t)r->n, fp);
    fcloseCheck(fp);
#if !FLOATX_IS_FP32
    // the bf16 build computes with bf16 weights: hold it to the reference at those weights
    r->loss0 = r->loss0_bf16w;
    r->logits = r->logits_bf16w;
    r->grads = r->grads_bf16w;
#endif
}

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) { num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]); den += (double)b[i] * b[i]; }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void load_model(Model *model, const char *dir) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/gpu_ref_ckpt.bin", dir);
    CheckpointHeader h;
    checkpoint_read_header(path, &h);
    model_build(model, &h.config);
    float *params = (float *)mallocCheck(h.num_parameters * sizeof(float));
    checkpoint_read_payload(path, &h, params, NULL, NULL, NULL);
    model_write_state(model, params, NULL, NULL);
    free(params);
}

static void run_case(const char *label, const char *dir, const Reference *r, int bitwise) {
    Model model;
    load_model(&model, dir);
    const int B = r->B, T = r->T, BT = B * T, Vp = r->Vp;
    char name[160];
    // one batch: logits, loss, every gradient
    model_zero_grad(&model);
    const float loss = model_forward(&model, r->tokens, r->tokens + 1, B, T);
    floatX *lx = (floatX *)mallocCheck((size_t)BT * Vp * sizeof(floatX));
    float *logits = (float *)mallocCheck((size_t)BT * Vp * sizeof(float));
    cudaCheck(cudaMemcpy(lx, model.logits, (size_t)BT * Vp * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < (size_t)BT * Vp; i++) { logits[i] = (float)lx[i]; }
    const double e_logits = rel_err(logits, r->logits, (size_t)BT * Vp);
    snprintf(name, sizeof(name), "%s: logits", label);
    test_result(e_logits < TOL, name, "rel err %.2e (tol %.0e)", e_logits, TOL);
    const double e_loss = fabs(loss - r->loss0) / r->loss0;
    snprintf(name, sizeof(name), "%s: loss", label);
    test_result(e_loss < TOL, name, "%.6f vs CPU %.6f, rel err %.2e", loss, r->loss0, e_loss);
    model_backward(&model, 1.0f);
    float *grads = (float *)mallocCheck((size_t)r->n * sizeof(float));
    cudaCheck(cudaMemcpy(grads, model.grads_memory, (size_t)r->n * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0;
    const char *worst_name = "";
    int over = 0;
    for (int i = 0; i < model.table.num_specs; i++) {
        const ParamSpec *s = &model.table.specs[i];
        const double e = rel_err(grads + s->offset, r->grads + s->offset, s->numel);
        const double tol = (!bitwise && s->kind == PK_m_W) ? 1.5 * TOL : TOL; // see the comment at the top
        if (e > worst) { worst = e; worst_name = s->name; }
        if (e >= tol) { printf("     %s: rel err %.2e (tol %.0e)\n", s->name, e, tol); over++; }
    }
    snprintf(name, sizeof(name), "%s: every parameter gradient", label);
    test_result(over == 0, name, "worst rel err %.2e (%s, %d tensors)", worst, worst_name, model.table.num_specs);
    // the same batch again: bitwise the same gradients
    model_zero_grad(&model);
    model_forward(&model, r->tokens, r->tokens + 1, B, T);
    model_backward(&model, 1.0f);
    float *grads2 = (float *)mallocCheck((size_t)r->n * sizeof(float));
    cudaCheck(cudaMemcpy(grads2, model.grads_memory, (size_t)r->n * sizeof(float), cudaMemcpyDeviceToHost));
    if (bitwise) {
        snprintf(name, sizeof(name), "%s: gradients bitwise repeatable", label);
        test_result(memcmp(grads, grads2, (size_t)r->n * sizeof(float)) == 0, name, "%d floats", r->n);
    } else { // fp32 atomics over head groups in the tensor-core backward: repeatable up to rounding
        const double e = rel_err(grads2, grads, (size_t)r->n);
        snprintf(name, sizeof(name), "%s: gradients repeatable", label);
        test_result(e < 1e-5, name, "rel diff between two runs %.2e (%s)", e,
                    memcmp(grads, grads2, (size_t)r->n * sizeof(float)) == 0 ? "bitwise equal" : "atomics reordered");
    }
    // 20 AdamW steps from the same start, same batches as the CPU
    model_free(&model);
    load_model(&model, dir);
    OptimizerConfig opt = {1e-3f, 0.9f, 0.95f, 1e-10f, 0.1f, 1.0f};
    double worst_step = 0;
    for (int s = 0; s < r->steps; s++) {
        const int *batch = r->tokens + (size_t)(s + 1) * (BT + 1);
        model_zero_grad(&model);
        const float l = model_forward(&model, batch, batch + 1, B, T);
        model_backward(&model, 1.0f);
        model_update(&model, &opt, s + 1);
        worst_step = fmax(worst_step, fabs(l - r->losses[s]) / r->losses[s]);
    }
    snprintf(name, sizeof(name), "%s: 20 training steps track the CPU", label);
    test_result(worst_step < TOL, name, "max rel diff of the losses %.2e (step 20: CPU %.5f)", worst_step,
                r->losses[r->steps - 1]);
    free(lx); free(logits); free(grads); free(grads2);
    model_free(&model);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "build/gpu_ref";
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        test_skip("CUDA trainer vs CPU reference", err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
        return test_summary(SUITE);
    }
    Reference r;
    read_reference(&r, dir);
#if FLOATX_IS_FP32
    run_case("fp32", dir, &r, 1);
#else
    run_case("bf16, tensor-core recurrence", dir, &r, 0);
    m2rnn_force_plain = 1;
    run_case("bf16, plain recurrence", dir, &r, 1);
#endif
    return test_summary(SUITE);
}
