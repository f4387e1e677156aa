/*
test_moe_gpu.cu: the GPU mixture-of-experts layer (moe.cuh) against the fp32 CPU reference (ref/moe.h) on the cases
test/gen_moe_reference.c writes (a token count that is a multiple of nothing, exact ties in the router, every token
to one expert with the others empty, 160 experts top-8 with no shared expert): the output, the input gradient, every
parameter gradient and the load-balancing loss, as normwise relative errors; and the backward run twice, bit for
bit (the layer has no atomics). The fp32 build (test_moe_gpu_fp32) is held at 1e-4, the bf16 build at 2e-2 (its up,
h and y rows are rounded to bf16 between the GEMMs; the dense SwiGLU's bound in test_gpu_trainer).
usage: build/test_moe_gpu REF_DIR   (make builds REF_DIR = build/moe_ref with build/gen_moe_reference)
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "utils.h"
#include "model.h"
#include "layers.h"
#include "common.cuh"
#include "moe.cuh"
#include "test/test_common.h"

#if FLOATX_IS_FP32
#define MOE_TOL 1e-4
#else
#define MOE_TOL 2e-2
#endif

static double rel_err(const float *got, const float *want, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return sqrt(num / (den > 0 ? den : 1.0));
}

static floatX *upload_x(const float *h, size_t n) {
    floatX *tmp = (floatX *)mallocCheck((n + 1) * sizeof(floatX)), *d;
    for (size_t i = 0; i < n; i++) { tmp[i] = (floatX)h[i]; }
    cudaCheck(cudaMalloc(&d, (n + 1) * sizeof(floatX)));
    cudaCheck(cudaMemcpy(d, tmp, n * sizeof(floatX), cudaMemcpyHostToDevice));
    free(tmp);
    return d;
}
static void download_x(float *h, const floatX *d, size_t n) {
    floatX *tmp = (floatX *)mallocCheck((n + 1) * sizeof(floatX));
    cudaCheck(cudaMemcpy(tmp, d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) { h[i] = (float)tmp[i]; }
    free(tmp);
}

static void run_case(const char *dir, const char *name, const Runtime *rt) {
    char path[4200];
    snprintf(path, sizeof(path), "%s/moe_%s.bin", dir, name);
    FILE *fp = fopenCheck(path, "rb");
    int32_t hd[8];
    float sc[3];
    freadCheck(hd, sizeof(int32_t), 8, fp);
    freadCheck(sc, sizeof(float), 3, fp);
    if (hd[0] != 20261124) { fail_with_hint("rebuild build/moe_ref with build/gen_moe_reference", "%s is not an MoE case", path); }
    const int M = hd[1], C = hd[2], E = hd[3], K = hd[4], F = hd[5], S = hd[6], empty = hd[7];
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.d_model = C;
    c.moe.experts = E; c.moe.top_k = K; c.moe.hidden = F; c.moe.shared = S; c.moe.aux_coef = sc[0];
    const size_t MC = (size_t)M * C;
    const size_t sizes[5] = {(size_t)E * C, (size_t)E * 2 * F * C, (size_t)E * C * F, 2 * (size_t)S * C, (size_t)C * S};
    float *x = (float *)mallocCheck(MC * sizeof(float)), *dout = (float *)mallocCheck(MC * sizeof(float));
    float *out_ref = (float *)mallocCheck(MC * sizeof(float)), *dx_ref = (float *)mallocCheck(MC * sizeof(float));
    float *w[5], *g_ref[5];
    freadCheck(x, sizeof(float), MC, fp);
    freadCheck(dout, sizeof(float), MC, fp);
    for (int p = 0; p < 5; p++) {
        w[p] = (float *)mallocCheck((sizes[p] + 1) * sizeof(float));
        freadCheck(w[p], sizeof(float), sizes[p], fp);
    }
    freadCheck(out_ref, sizeof(float), MC, fp);
    freadCheck(dx_ref, sizeof(float), MC, fp);
    for (int p = 0; p < 5; p++) {
        g_ref[p] = (float *)mallocCheck((sizes[p] + 1) * sizeof(float));
        freadCheck(g_ref[p], sizeof(float), sizes[p], fp);
    }
    fcloseCheck(fp);

    floatX *dw[5];
    float *dg[5];
    for (int p = 0; p < 5; p++) {
        dw[p] = upload_x(w[p], sizes[p]);
        cudaCheck(cudaMalloc(&dg[p], (sizes[p] + 1) * sizeof(float)));
        cudaCheck(cudaMemset(dg[p], 0, (sizes[p] + 1) * sizeof(float)));
    }
    floatX *d_x = upload_x(x, MC), *d_dout = upload_x(dout, MC), *d_out, *d_dx;
    cudaCheck(cudaMalloc(&d_out, MC * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_dx, MC * sizeof(floatX)));
    void *acts, *scratch;
    cudaCheck(cudaMalloc(&acts, MOE_OPS.acts_bytes(&c, 1, M, rt)));
    cudaCheck(cudaMalloc(&scratch, MOE_OPS.scratch_bytes(&c, 1, M, rt)));
    double aux = 0.0;
    KindTensors t = {dw, NULL, dg, &aux, sc[1]};
    MOE_OPS.forward(d_out, acts, scratch, d_x, &t, &c, 1, M, rt);
    MOE_OPS.backward(d_dx, scratch, d_dout, d_x, acts, &t, &c, 1, M, rt);
    cudaCheck(cudaStreamSynchronize(rt->stream));

    float *got = (float *)mallocCheck(MC * sizeof(float));
    char label[160];
    download_x(got, d_out, MC);
    double worst_out = rel_err(got, out_ref, MC);
    download_x(got, d_dx, MC);
    double worst_dx = rel_err(got, dx_ref, MC);
    snprintf(label, sizeof(label), "%s: output, input gradient", name);
    test_result(worst_out < MOE_TOL && worst_dx < MOE_TOL, label, "out %.2e, dx %.2e (tol %.0e; M=%d E=%d top-%d, %d "
                "experts empty)", worst_out, worst_dx, MOE_TOL, M, E, K, empty);
    const char *names[5] = {"router_w", "up_w", "down_w", "shared_up_w", "shared_down_w"};
    float *g1[5];
    double worst_g = 0.0;
    int worst_p = 0;
    for (int p = 0; p < 5; p++) {
        g1[p] = (float *)mallocCheck((sizes[p] + 1) * sizeof(float));
        cudaCheck(cudaMemcpy(g1[p], dg[p], sizes[p] * sizeof(float), cudaMemcpyDeviceToHost));
        if (sizes[p] == 0) { continue; }
        const double e = rel_err(g1[p], g_ref[p], sizes[p]);
        if (e > worst_g) { worst_g = e; worst_p = p; }
    }
    snprintf(label, sizeof(label), "%s: every parameter gradient", name);
    test_result(worst_g < MOE_TOL, label, "worst %.2e (%s; tol %.0e)", worst_g, names[worst_p], MOE_TOL);
    const double aux_err = fabs(aux - sc[2]) / sc[2];
    snprintf(label, sizeof(label), "%s: load-balancing loss", name);
    test_result(aux_err < 1e-5, label, "%.8f against %.8f (rel %.1e, tol 1e-5)", aux, (double)sc[2], aux_err);
    // the backward again from zeroed gradients: the same bits
    for (int p = 0; p < 5; p++) { cudaCheck(cudaMemset(dg[p], 0, (sizes[p] + 1) * sizeof(float))); }
    MOE_OPS.backward(d_dx, scratch, d_dout, d_x, acts, &t, &c, 1, M, rt);
    cudaCheck(cudaStreamSynchronize(rt->stream));
    int same = 1;
    float *g2 = (float *)mallocCheck(sizeof(float));
    for (int p = 0; p < 5; p++) {
        g2 = (float *)realloc(g2, (sizes[p] + 1) * sizeof(float));
        cudaCheck(cudaMemcpy(g2, dg[p], sizes[p] * sizeof(float), cudaMemcpyDeviceToHost));
        same &= memcmp(g1[p], g2, sizes[p] * sizeof(float)) == 0;
    }
    snprintf(label, sizeof(label), "%s: backward repeats bit for bit", name);
    test_result(same, label, "%s", same ? "every gradient identical" : "gradients differ between two backwards");
    free(g2);
    for (int p = 0; p < 5; p++) { free(w[p]); free(g_ref[p]); free(g1[p]); cudaFree(dw[p]); cudaFree(dg[p]); }
    free(x); free(dout); free(out_ref); free(dx_ref); free(got);
    cudaFree(d_x); cudaFree(d_dout); cudaFree(d_out); cudaFree(d_dx); cudaFree(acts); cudaFree(scratch);
}

int main(int argc, char **argv) {
    const char *suite = FLOATX_IS_FP32 ? "test_moe_gpu_fp32" : "test_moe_gpu";
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        test_skip("MoE layer on the GPU", "no GPU (the CUDA runtime found no device)");
        return test_summary(suite);
    }
    const char *dir = argc > 1 ? argv[1] : "build/moe_ref";
    Runtime rt;
    runtime_init(&rt, 0);
    const char *cases[] = {"general", "ties", "one", "wide"};
    for (int i = 0; i < 4; i++) { run_case(dir, cases[i], &rt); }
    runtime_free(&rt);
    return test_summary(suite);
}
