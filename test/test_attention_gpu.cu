/*
test_attention_gpu.cu: the flash-attention kernels (attention_kernels.cuh) against a float64 reference computed on
the same bf16-rounded inputs: the forward's output and log-sum-exp, the backward's dq, dk, dv (a second backward
must repeat them bit for bit: no atomics), and the split decode kernel. The cases cover head dims 64 and 128, MHA,
GQA and MQA, head dim 32, lengths that are not multiples of the tiles (1, 3, 5, 37, 70, 130, 150, 200), packed
variable-length sequences, a chunked prefill (the queries are the last 37 of 150 keys), prefill chunks against KV
caches filled to different lengths (len_k), a non-causal pass, and q, k, v as column blocks of one projection row
(the model's layout); the causal self-attention cases also through cuDNN's fused graphs (attention_cudnn.cuh, both backward
forms: dQ by fp32 atomics and the deterministic one, whose repeatability is checked; skipped where cuDNN is absent). Decode: head dims 32/64/128, MHA/GQA/MQA, lengths from 1 to 70000 (many slices). Errors are normwise relative per tensor, bound 2e-2 (bf16 in and
out; the kernels round P to bf16 for the P·V product, as FlashAttention does). Skips without a GPU.
*/
#include <math.h>
#include <algorithm>
#include <vector>

#include "attention_kernels.cuh"
#include "attention_cudnn.cuh"
#include "test/test_common.h"
#include "test/test_gpu_common.cuh"

typedef __nv_bfloat16 bf16;
static uint64_t xs_state = 88172645463325252ull;
static double urand(void) { // uniform in [-1, 1), xorshift64
    xs_state ^= xs_state << 13; xs_state ^= xs_state >> 7; xs_state ^= xs_state << 17;
    return (double)(xs_state >> 11) / 4503599627370496.0 - 1.0;
}

static double rel_err(const std::vector<double> &ref, const std::vector<float> &got) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) { num += (got[i] - ref[i]) * (got[i] - ref[i]); den += ref[i] * ref[i]; }
    return sqrt(num / (den > 0 ? den : 1));
}

struct Case {
    const char *name;
    int HS, NH, NKV, causal;
    std::vector<int> lq, lk; // per sequence
    int packed;              // 1: cu_seqlens, 0: fixed layout (all lengths equal)
    int cache_cap;           // > 0: fixed layout over a KV cache of this capacity holding lk[b] keys (len_k)
};

// q, k, v live in rows of W = (NH + 2 NKV)·HS (q | k | v); o in rows of NH·HS; lse, D (tokens, NH)
static void run_case(const Case &c) {
    const int B = (int)c.lq.size(), HS = c.HS, NH = c.NH, NKV = c.NKV, W = (NH + 2 * NKV) * HS, OW = NH * HS;
    std::vector<int> cq(B + 1, 0), ck(B + 1, 0);
    for (int b = 0; b < B; b++) {
        cq[b + 1] = cq[b] + c.lq[b];
        ck[b + 1] = c.cache_cap ? (b + 1) * c.cache_cap : ck[b] + c.lk[b];
    }
    const int Tq = cq[B], Tk = ck[B];
    // q rows for the Tq query tokens, k/v rows for the Tk key tokens; in the fixed self-attention layout they share
    // one buffer (Lq = Lk); otherwise q comes from its own buffer of the same row width
    std::vector<bf16> qkv_k((size_t)Tk * W), qkv_q((size_t)Tq * W), dout((size_t)Tq * OW);
    for (auto &x : qkv_k) { x = __float2bfloat16((float)urand()); }
    for (auto &x : qkv_q) { x = __float2bfloat16((float)urand()); }
    for (auto &x : dout) { x = __float2bfloat16((float)urand()); }
    const bool self = !c.packed && !c.cache_cap && c.lq == c.lk;
    if (self) { qkv_q = qkv_k; }
    auto Q = [&](int tok, int h, int i) { return (double)__bfloat162float(qkv_q[(size_t)tok * W + h * HS + i]); };
    auto K = [&](int tok, int h, int i) { return (double)__bfloat162float(qkv_k[(size_t)tok * W + NH * HS + h * HS + i]); };
    auto Vv = [&](int tok, int h, int i) { return (double)__bfloat162float(qkv_k[(size_t)tok * W + (NH + NKV) * HS + h * HS + i]); };
    const double scale = 1.0 / sqrt((double)HS);
    // float64 reference: O, LSE, and the gradients of Σ O ⊙ dO
    std::vector<double> O((size_t)Tq * OW, 0), L((size_t)Tq * NH, 0), dQ((size_t)Tq * NH * HS, 0);
    std::vector<double> dK((size_t)Tk * NKV * HS, 0), dV((size_t)Tk * NKV * HS, 0);
    for (int b = 0; b < B; b++) {
        const int shift = c.lk[b] - c.lq[b];
        for (int h = 0; h < NH; h++) {
            const int kvh = h / (NH / NKV);
            for (int i = 0; i < c.lq[b]; i++) {
                const int qi = cq[b] + i, last = c.causal ? std::min(c.lk[b] - 1, i + shift) : c.lk[b] - 1;
                std::vector<double> p(last + 1), dp(last + 1);
                double mx = -1e300;
                for (int j = 0; j <= last; j++) {
                    double s = 0;
                    for (int e = 0; e < HS; e++) { s += Q(qi, h, e) * K(ck[b] + j, kvh, e); }
                    p[j] = s * scale;
                    mx = std::max(mx, p[j]);
                }
                double sum = 0;
                for (int j = 0; j <= last; j++) { p[j] = exp(p[j] - mx); sum += p[j]; }
                L[(size_t)qi * NH + h] = mx + log(sum);
                for (int j = 0; j <= last; j++) { p[j] /= sum; }
                double Dd = 0;
                for (int e = 0; e < HS; e++) {
                    double o = 0;
                    for (int j = 0; j <= last; j++) { o += p[j] * Vv(ck[b] + j, kvh, e); }
                    O[(size_t)qi * OW + h * HS + e] = o;
                }
                // dO rounded to bf16 as the kernel sees it; D from the reference O (the kernel uses its bf16 O)
                for (int e = 0; e < HS; e++) { Dd += (double)__bfloat162float(dout[(size_t)qi * OW + h * HS + e]) * O[(size_t)qi * OW + h * HS + e]; }
                for (int j = 0; j <= last; j++) {
                    double s = 0;
                    for (int e = 0; e < HS; e++) {
                        const double g = __bfloat162float(dout[(size_t)qi * OW + h * HS + e]);
                        s += g * Vv(ck[b] + j, kvh, e);
                        dV[((size_t)(ck[b] + j) * NKV + kvh) * HS + e] += p[j] * g;
                    }
                    dp[j] = p[j] * (s - Dd) * scale;
                    for (int e = 0; e < HS; e++) {
                        dQ[((size_t)qi * NH + h) * HS + e] += dp[j] * K(ck[b] + j, kvh, e);
                        dK[((size_t)(ck[b] + j) * NKV + kvh) * HS + e] += dp[j] * Q(qi, h, e);
                    }
                }
            }
        }
    }
    // the kernels
    bf16 *dqk = to_device(qkv_k), *dqq = self ? dqk : to_device(qkv_q), *ddo = to_device(dout);
    bf16 *dO_ = nullptr, *dgk = nullptr, *dgq = nullptr;
    float *dL = nullptr, *dD = nullptr;
    cudaCheck(cudaMalloc(&dO_, (size_t)Tq * OW * sizeof(bf16)));
    cudaCheck(cudaMalloc(&dgk, (size_t)Tk * W * sizeof(bf16)));
    cudaCheck(cudaMalloc(&dgq, (size_t)Tq * W * sizeof(bf16)));
    cudaCheck(cudaMalloc(&dL, (size_t)Tq * NH * sizeof(float)));
    cudaCheck(cudaMalloc(&dD, (size_t)Tq * NH * sizeof(float)));
    int *dcq = c.packed ? to_device(cq) : nullptr, *dck = c.packed ? to_device(ck) : nullptr;
    int *dlk = c.cache_cap ? to_device(c.lk) : nullptr;
    AttnDims d;
    memset(&d, 0, sizeof(d));
    d.B = B; d.Lq = c.packed ? *std::max_element(c.lq.begin(), c.lq.end()) : c.lq[0];
    d.Lk = c.packed ? *std::max_element(c.lk.begin(), c.lk.end()) : c.cache_cap ? c.cache_cap : c.lk[0];
    d.len_k = dlk;
    d.NH = NH; d.NKV = NKV; d.HS = HS; d.causal = c.causal; d.scale = (float)scale;
    d.q_row = d.k_row = d.v_row = W; d.o_row = OW;
    d.q_seq = (long)d.Lq * W; d.k_seq = d.v_seq = (long)d.Lk * W; d.o_seq = (long)d.Lq * OW;
    d.cu_q = dcq; d.cu_k = dck;
    flash_attention_forward(dO_, dL, dqq, dqk + NH * HS, dqk + (NH + NKV) * HS, &d, 0);
    cudaCheck(cudaMemset(dgk, 0, (size_t)Tk * W * sizeof(bf16)));
    bf16 *dq_out = self ? dgk : dgq;
    flash_attention_backward(dq_out, dgk + NH * HS, dgk + (NH + NKV) * HS, dD, ddo, dqq, dqk + NH * HS,
                             dqk + (NH + NKV) * HS, dO_, dL, Tq, &d, 0);
    cudaCheck(cudaDeviceSynchronize());
    std::vector<bf16> o = to_host(dO_, (size_t)Tq * OW), gk = to_host(dgk, (size_t)Tk * W);
    std::vector<bf16> gq = self ? gk : to_host(dgq, (size_t)Tq * W);
    std::vector<float> lse = to_host(dL, (size_t)Tq * NH);
    // a second backward: bitwise the same
    flash_attention_backward(dq_out, dgk + NH * HS, dgk + (NH + NKV) * HS, dD, ddo, dqq, dqk + NH * HS,
                             dqk + (NH + NKV) * HS, dO_, dL, Tq, &d, 0);
    cudaCheck(cudaDeviceSynchronize());
    std::vector<bf16> gk2 = to_host(dgk, (size_t)Tk * W), gq2 = self ? gk2 : to_host(dgq, (size_t)Tq * W);
    std::vector<float> go((size_t)Tq * OW), gdq((size_t)Tq * NH * HS), gdk((size_t)Tk * NKV * HS), gdv((size_t)Tk * NKV * HS);
    for (size_t i = 0; i < go.size(); i++) { go[i] = __bfloat162float(o[i]); }
    for (int t = 0; t < Tq; t++) {
        for (int e = 0; e < NH * HS; e++) { gdq[(size_t)t * NH * HS + e] = __bfloat162float(gq[(size_t)t * W + e]); }
    }
    for (int t = 0; t < Tk; t++) {
        for (int e = 0; e < NKV * HS; e++) {
            gdk[(size_t)t * NKV * HS + e] = __bfloat162float(gk[(size_t)t * W + NH * HS + e]);
            gdv[(size_t)t * NKV * HS + e] = __bfloat162float(gk[(size_t)t * W + (NH + NKV) * HS + e]);
        }
    }
    std::vector<double> Ld(L.begin(), L.end());
    const double eo = rel_err(O, go), el = rel_err(Ld, lse), eq = rel_err(dQ, gdq), ek = rel_err(dK, gdk),
                 ev = rel_err(dV, gdv);
    char name[160];
    snprintf(name, sizeof(name), "%s forward", c.name);
    test_result(eo < 2e-2 && el < 1e-4, name, "rel err o %.2e lse %.2e (tol 2e-2, 1e-4)", eo, el);
    snprintf(name, sizeof(name), "%s backward", c.name);
    test_result(eq < 2e-2 && ek < 2e-2 && ev < 2e-2, name, "rel err dq %.2e dk %.2e dv %.2e (tol 2e-2)", eq, ek, ev);
    snprintf(name, sizeof(name), "%s backward repeatable", c.name);
    test_result(memcmp(gk.data(), gk2.data(), gk.size() * sizeof(bf16)) == 0 &&
                    memcmp(gq.data(), gq2.data(), gq.size() * sizeof(bf16)) == 0,
                name, "%s", "dq, dk, dv bitwise equal");
    // the training path's cuDNN graphs (attention_cudnn.cuh), on the causal self-attention cases it takes: the same
    // reference, lse in cuDNN's (B, NH, T) layout
    // both backward forms: dQ by cuDNN's fp32 atomics (the default) and the deterministic graph (M2RNN_DETERMINISTIC=1)
    for (int det = 0; det <= 1 && self && c.causal; det++) {
        cudnn_deterministic = det;
        const char *form = det ? "cuDNN deterministic" : "cuDNN";
        snprintf(name, sizeof(name), "%s %s", c.name, form);
        const char *why = cudnn_attention_why(&d);
        if (why[0] != '\0') {
            test_skip(name, why);
            continue;
        }
        const int L = c.lq[0];
        cudnn_attention_forward(dO_, dL, dqq, dqk + NH * HS, dqk + (NH + NKV) * HS, &d, 0);
        cudaCheck(cudaMemset(dgk, 0, (size_t)Tk * W * sizeof(bf16)));
        cudnn_attention_backward(dgk, dgk + NH * HS, dgk + (NH + NKV) * HS, dD, ddo, dqq, dqk + NH * HS,
                                 dqk + (NH + NKV) * HS, dO_, dL, &d, 0);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<bf16> co = to_host(dO_, (size_t)Tq * OW), ck1 = to_host(dgk, (size_t)Tk * W);
        std::vector<float> clse_bht = to_host(dL, (size_t)Tq * NH), clse((size_t)Tq * NH);
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int t = 0; t < L; t++) { clse[((size_t)b * L + t) * NH + h] = clse_bht[((size_t)b * NH + h) * L + t]; }
            }
        }
        cudnn_attention_backward(dgk, dgk + NH * HS, dgk + (NH + NKV) * HS, dD, ddo, dqq, dqk + NH * HS,
                                 dqk + (NH + NKV) * HS, dO_, dL, &d, 0);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<bf16> ck2 = to_host(dgk, (size_t)Tk * W);
        for (size_t i = 0; i < go.size(); i++) { go[i] = __bfloat162float(co[i]); }
        for (int t = 0; t < Tk; t++) {
            for (int e = 0; e < NH * HS; e++) { gdq[(size_t)t * NH * HS + e] = __bfloat162float(ck1[(size_t)t * W + e]); }
            for (int e = 0; e < NKV * HS; e++) {
                gdk[(size_t)t * NKV * HS + e] = __bfloat162float(ck1[(size_t)t * W + NH * HS + e]);
                gdv[(size_t)t * NKV * HS + e] = __bfloat162float(ck1[(size_t)t * W + (NH + NKV) * HS + e]);
            }
        }
        const double co_e = rel_err(O, go), cl_e = rel_err(Ld, clse), cq_e = rel_err(dQ, gdq), ck_e = rel_err(dK, gdk),
                     cv_e = rel_err(dV, gdv);
        snprintf(name, sizeof(name), "%s %s forward", c.name, form);
        test_result(co_e < 2e-2 && cl_e < 1e-4, name, "rel err o %.2e lse %.2e (tol 2e-2, 1e-4)", co_e, cl_e);
        snprintf(name, sizeof(name), "%s %s backward", c.name, form);
        test_result(cq_e < 2e-2 && ck_e < 2e-2 && cv_e < 2e-2, name, "rel err dq %.2e dk %.2e dv %.2e (tol 2e-2)", cq_e,
                    ck_e, cv_e);
        const int same = memcmp(ck1.data(), ck2.data(), ck1.size() * sizeof(bf16)) == 0;
        snprintf(name, sizeof(name), "%s %s backward repeatable", c.name, form);
        if (cudnn_attention_deterministic(&d)) {
            test_result(same, name, "%s", "dq, dk, dv bitwise equal");
        } else { // the named exception: cuDNN's default backward sums dQ with fp32 atomics
            test_skip(name, same ? "dQ by fp32 atomics: not promised (equal this time); M2RNN_DETERMINISTIC=1 is"
                                 : "dQ by fp32 atomics: not promised (and differed); M2RNN_DETERMINISTIC=1 is");
        }
    }
    cudnn_deterministic = -1;
    cudaFree(dqk); if (!self) { cudaFree(dqq); } cudaFree(ddo); cudaFree(dO_); cudaFree(dgk); cudaFree(dgq);
    cudaFree(dL); cudaFree(dD); if (dcq) { cudaFree(dcq); cudaFree(dck); }
    if (dlk) { cudaFree(dlk); }
}

// B single queries against caches of lens[b] positions (capacity `context`)
static void run_decode(int HS, int NH, int NKV, const std::vector<int> &lens, int context) {
    const int B = (int)lens.size(), KW = NKV * HS;
    std::vector<bf16> q((size_t)B * NH * HS), kc((size_t)B * context * KW), vc((size_t)B * context * KW);
    for (auto &x : q) { x = __float2bfloat16((float)urand()); }
    for (auto &x : kc) { x = __float2bfloat16((float)urand()); }
    for (auto &x : vc) { x = __float2bfloat16((float)urand()); }
    const double scale = 1.0 / sqrt((double)HS);
    std::vector<double> y((size_t)B * NH * HS);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const int kvh = h / (NH / NKV);
            std::vector<double> p(lens[b]);
            double mx = -1e300, sum = 0;
            for (int j = 0; j < lens[b]; j++) {
                double s = 0;
                for (int e = 0; e < HS; e++) {
                    s += (double)__bfloat162float(q[((size_t)b * NH + h) * HS + e]) *
                         __bfloat162float(kc[((size_t)b * context + j) * KW + kvh * HS + e]);
                }
                p[j] = s * scale;
                mx = std::max(mx, p[j]);
            }
            for (int j = 0; j < lens[b]; j++) { p[j] = exp(p[j] - mx); sum += p[j]; }
            for (int e = 0; e < HS; e++) {
                double o = 0;
                for (int j = 0; j < lens[b]; j++) { o += p[j] * __bfloat162float(vc[((size_t)b * context + j) * KW + kvh * HS + e]); }
                y[((size_t)b * NH + h) * HS + e] = o / sum;
            }
        }
    }
    bf16 *dq = to_device(q), *dk = to_device(kc), *dv = to_device(vc), *dy = nullptr;
    int *dl = to_device(lens);
    float *ws = nullptr;
    cudaCheck(cudaMalloc(&dy, (size_t)B * NH * HS * sizeof(bf16)));
    cudaCheck(cudaMalloc(&ws, flash_decode_workspace_floats(B, NH, HS, context) * sizeof(float)));
    cudaCheck(cudaMemset(ws, 0, flash_decode_workspace_floats(B, NH, HS, context) * sizeof(float))); // (the merge's counters)
    flash_attention_decode(dy, (long)NH * HS, ws, (long)flash_decode_workspace_floats(1, NH, HS, context), dq, (long)NH * HS, dk, dv, (long)context * KW, dl, 0, B, NH, NKV, HS,
                           context, (float)scale, 0);
    std::vector<bf16> got = to_host(dy, (size_t)B * NH * HS);
    std::vector<float> g(got.size());
    for (size_t i = 0; i < g.size(); i++) { g[i] = __bfloat162float(got[i]); }
    const double e = rel_err(y, g);
    char name[160];
    snprintf(name, sizeof(name), "decode HS=%d NH=%d NKV=%d B=%d lens %d..%d of %d", HS, NH, NKV, B, lens[0],
             lens.back(), context);
    test_result(e < 1e-2, name, "rel err %.2e (tol 1e-2)", e);
    // batch-invariant: each sequence decoded alone gives the same bits as in the batch
    int differ = 0;
    for (int b = 0; b < B; b++) {
        flash_attention_decode(dy, (long)NH * HS, ws, (long)flash_decode_workspace_floats(1, NH, HS, context),
                               dq + (size_t)b * NH * HS, (long)NH * HS, dk + (size_t)b * context * KW,
                               dv + (size_t)b * context * KW, (long)context * KW, dl + b, 0, 1, NH, NKV, HS, context,
                               (float)scale, 0);
        std::vector<bf16> one = to_host(dy, (size_t)NH * HS);
        differ += memcmp(one.data(), got.data() + (size_t)b * NH * HS, one.size() * sizeof(bf16)) != 0;
    }
    snprintf(name, sizeof(name), "decode HS=%d NH=%d NKV=%d B=%d: each sequence alone = in the batch", HS, NH, NKV, B);
    test_result(differ == 0, name, "%d of %d sequences differ", differ, B);
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dy); cudaFree(dl); cudaFree(ws);
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        test_skip("flash attention kernels", "no GPU (the CUDA runtime found no device)");
        return test_summary("test_attention_gpu");
    }
    {
        AttnDims d;
        memset(&d, 0, sizeof(d));
        d.B = 1; d.Lq = d.Lk = 8; d.NH = 4; d.NKV = 4; d.HS = 96; d.q_row = d.k_row = d.v_row = d.o_row = 512;
        int ok = attn_check_dims(&d) != NULL;
        d.HS = 64; d.NKV = 3;
        ok = ok && attn_check_dims(&d) != NULL;
        d.NKV = 2; d.q_row = 500;
        ok = ok && attn_check_dims(&d) != NULL;
        d.q_row = 512;
        ok = ok && attn_check_dims(&d) == NULL;
        test_result(ok, "shape checks", "%s", "refuses HS=96, NKV not dividing NH, unaligned rows");
    }
    const Case cases[] = {
        {"MHA HS=64 2x200 causal", 64, 4, 4, 1, {200, 200}, {200, 200}, 0},
        {"GQA HS=128 NH=4 NKV=2 2x130", 128, 4, 2, 1, {130, 130}, {130, 130}, 0},
        {"MQA HS=64 NH=4 NKV=1 3x64", 64, 4, 1, 1, {64, 64, 64}, {64, 64, 64}, 0},
        {"varlen HS=128 lens 5,64,130,1", 128, 2, 1, 1, {5, 64, 130, 1}, {5, 64, 130, 1}, 1},
        {"varlen HS=64 GQA lens 37,1,200", 64, 4, 2, 1, {37, 1, 200}, {37, 1, 200}, 1},
        {"chunked prefill 37 of 150 HS=64", 64, 2, 2, 1, {37, 37}, {150, 150}, 0},
        {"chunked prefill varlen HS=128", 128, 2, 1, 1, {20, 64}, {90, 64}, 1},
        {"non-causal 50 x 77 HS=64", 64, 2, 2, 0, {50, 50}, {77, 77}, 0},
        {"MHA HS=32 2x150 causal", 32, 2, 2, 1, {150, 150}, {150, 150}, 0},
        {"GQA HS=32 varlen lens 70,3", 32, 4, 2, 1, {70, 3}, {70, 3}, 1},
        {"KV cache prefill 40 queries, keys 45/300 of 320", 64, 4, 2, 1, {40, 40}, {45, 300}, 0, 320},
        {"KV cache prefill HS=128, keys 100/129 of 192", 128, 2, 2, 1, {33, 33}, {100, 129}, 0, 192},
        {"MHA HS=128 2x1000 causal", 128, 2, 2, 1, {1000, 1000}, {1000, 1000}, 0},
        {"GQA HS=64 NH=8 NKV=2 1x777", 64, 8, 2, 1, {777}, {777}, 0},
    };
    for (const Case &c : cases) { run_case(c); }
    run_decode(64, 4, 2, {1, 300, 1000}, 1024);
    run_decode(128, 4, 4, {257, 5, 64}, 700);
    run_decode(64, 8, 1, {4096}, 4096);
    run_decode(32, 2, 2, {3, 2000, 70000}, 70000);
    run_decode(128, 8, 2, {1, 9000}, 9000);
    { // many sequences of the 410M models' 16 heads of 64, and a GQA batch over a 3,000-position cache
        std::vector<int> lens(40);
        for (int b = 0; b < 40; b++) { lens[b] = 1 + (int)((urand() + 1.0) * 0.5 * 1023); } // 1..1023
        lens[3] = 1024;
        run_decode(64, 16, 16, lens, 1024);
        std::vector<int> lens2(12);
        for (int b = 0; b < 12; b++) { lens2[b] = 1 + (int)((urand() + 1.0) * 0.5 * 2999); }
        run_decode(128, 16, 4, lens2, 3000); // GQA, 4 query heads a CTA
    }
    return test_summary("test_attention_gpu");
}
