/*
test_m2rnn_gpu.cu: checks the M²RNN GPU kernels (m2rnn_kernels.cuh) against a float64 CPU loop written straight from
the equations: training forward (y, final state), backward (dq, dk, dv, df, dW, dh0, with a given d(final state) and
the per-step clamp of the carried dH), the inference forward, and the single-token step kernel (against the
reference, and against the training forward bit for bit: it is the forward's step).
Cases cover h0, the clamp firing, packed variable-length sequences, Nq=1 and Nq=N, K and V other than 64/16, and a
T=4096 run whose relative error is reported per window of 512 tokens to show drift. The V=16 cases with K <= 64 run
twice: with the launcher's pick (the Z stash with 16-token sub-chunks at one head a CTA) and with 8-token sub-chunks
forced; in deterministic mode every sub-chunk length and heads-per-CTA choice must give the same bits. K=192, V=16 runs
the plain build. Last, the paper's shape (B=8 and 4, N=84, T=4096) without a float64 reference: deterministic mode at
full occupancy.
Without a GPU it prints SKIP lines with the reason and exits 0.
Inputs are random and non-trivial: q, k, v live inside one (tok, conv_dim) buffer with padding, so the kernels are
driven through strided views exactly as the trainer will; outputs are poisoned (NaN) before each launch.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

#include "m2rnn_kernels.cuh"
#include "test/test_common.h"
#include "test/test_gpu_common.cuh"

// ----------------------------------------------------------------------------------------------------------------
// bf16 on the host

static floatX to_bf(double x) { return __float2bfloat16((float)x); }
static double from_bf(floatX x) { return (double)__bfloat162float(x); }

// ----------------------------------------------------------------------------------------------------------------
// one problem: inputs, float64 reference, GPU results

struct Case {
    const char *name;
    int B, T, N, Nq, K, V; // T: tokens per sequence (ignored when lens is given)
    std::vector<int> lens; // packed variable-length sequences (cu_seqlens) when non-empty
    bool use_h0, use_dhT;
    float clip;
    double dy_scale;
    int window; // > 0: report per-window errors over t
    int hpc;    // heads per CTA forced (m2rnn_hpc_override): 0 = automatic, 2 = two heads per CTA where legal
};

struct Problem {
    Case c;
    int B, N, Nq, K, V, conv_dim;
    long ntok;
    std::vector<int> cu;                  // (B+1,)
    std::vector<floatX> conv, W, dy;      // (ntok, conv_dim), (N,V,V), (ntok,N,V)
    std::vector<float> f, h0, dhT;        // (ntok,N), (B,N,K,V), (B,N,K,V)
    std::vector<double> y, hT, dq, dk, dv, df, dW, dh0; // reference outputs
    double clamp_fraction;
};

static void make_inputs(Problem &p, const Case &c, uint64_t seed) {
    rng_state = seed;
    p.c = c;
    p.N = c.N;
    p.Nq = c.Nq;
    p.K = c.K;
    p.V = c.V;
    if (c.lens.empty()) {
        p.B = c.B;
        p.cu.resize(c.B + 1);
        for (int b = 0; b <= c.B; b++) { p.cu[b] = b * c.T; }
    } else {
        p.B = (int)c.lens.size();
        p.cu.assign(1, 0);
        for (int L : c.lens) { p.cu.push_back(p.cu.back() + L); }
    }
    p.ntok = p.cu[p.B];
    // channel order q | k | v, then 8 padding channels so the token stride is not the packed width
    p.conv_dim = 2 * c.Nq * c.K + c.N * c.V + 8;
    p.conv.resize((size_t)p.ntok * p.conv_dim);
    for (size_t i = 0; i < p.conv.size(); i++) { // SiLU-like magnitudes, signed
        double x = rand_normal();
        p.conv[i] = to_bf(x / (1.0 + exp(-x)) + 0.1 * rand_normal());
    }
    p.f.resize((size_t)p.ntok * c.N);
    for (auto &x : p.f) { x = (float)(1.0 / (1.0 + exp(-(1.5 + 2.0 * rand_normal())))); } // some near 1, some small
    // W near the paper's identity init, ||W||_2 about 1. With a larger random part (||W|| ~ 1.6, tried first) the
    // backward itself is ill-conditioned at T=4096: a float64 emulation of bf16 rounding alone drifts by 10-50%.
    p.W.resize((size_t)c.N * c.V * c.V);
    for (int n = 0; n < c.N; n++) {
        for (int i = 0; i < c.V; i++) {
            for (int j = 0; j < c.V; j++) {
                p.W[((size_t)n * c.V + i) * c.V + j] = to_bf((i == j ? 0.7 : 0.0) + 0.2 / sqrt(c.V) * rand_normal());
            }
        }
    }
    size_t state = (size_t)p.B * c.N * c.K * c.V;
    p.h0.assign(state, 0.0f);
    p.dhT.assign(state, 0.0f);
    if (c.use_h0) { for (auto &x : p.h0) { x = (float)(0.5 * rand_normal()); } }
    if (c.use_dhT) { for (auto &x : p.dhT) { x = (float)(0.5 * c.dy_scale * rand_normal()); } }
    p.dy.resize((size_t)p.ntok * c.N * c.V);
    for (auto &x : p.dy) { x = to_bf(c.dy_scale * rand_normal()); }
}

// the float64 reference, straight from the equations in m2rnn_kernels.cuh's header
static void reference(Problem &p) {
    const int N = p.N, K = p.K, V = p.V, Gq = p.N / p.Nq;
    const long ntok = p.ntok;
    p.y.assign((size_t)ntok * N * V, 0.0);
    p.hT.assign((size_t)p.B * N * K * V, 0.0);
    p.dh0.assign(p.hT.size(), 0.0);
    p.dq.assign((size_t)ntok * p.Nq * K, 0.0);
    p.dk.assign(p.dq.size(), 0.0);
    p.dv.assign((size_t)ntok * N * V, 0.0);
    p.df.assign((size_t)ntok * N, 0.0);
    p.dW.assign((size_t)N * V * V, 0.0);
    long clamped = 0, total = 0;
    const double clip = p.c.clip;
    for (int b = 0; b < p.B; b++) {
        const int L = p.cu[b + 1] - p.cu[b];
        for (int n = 0; n < N; n++) {
            const int qh = n / Gq;
            std::vector<double> Hs((size_t)(L + 1) * K * V), Zs((size_t)L * K * V), Wd(V * V);
            for (int i = 0; i < V * V; i++) { Wd[i] = from_bf(p.W[(size_t)n * V * V + i]); }
            const size_t sidx = ((size_t)b * N + n) * K * V;
            for (int i = 0; i < K * V; i++) { Hs[i] = p.h0[sidx + i]; }
            for (int t = 0; t < L; t++) {
                const long tok = p.cu[b] + t;
                const floatX *row = &p.conv[(size_t)tok * p.conv_dim];
                const double fv = p.f[(size_t)tok * N + n];
                const double *H = &Hs[(size_t)t * K * V];
                double *Hn = &Hs[(size_t)(t + 1) * K * V], *Z = &Zs[(size_t)t * K * V];
                for (int r = 0; r < K; r++) {
                    const double kr = from_bf(row[p.Nq * K + qh * K + r]);
                    for (int j = 0; j < V; j++) {
                        double acc = kr * from_bf(row[2 * p.Nq * K + n * V + j]);
                        for (int i = 0; i < V; i++) { acc += H[r * V + i] * Wd[i * V + j]; }
                        Z[r * V + j] = tanh(acc);
                        Hn[r * V + j] = fv * H[r * V + j] + (1.0 - fv) * Z[r * V + j];
                    }
                }
                for (int j = 0; j < V; j++) {
                    double acc = 0.0;
                    for (int r = 0; r < K; r++) { acc += Hn[r * V + j] * from_bf(row[qh * K + r]); }
                    p.y[((size_t)tok * N + n) * V + j] = acc;
                }
            }
            for (int i = 0; i < K * V; i++) { p.hT[sidx + i] = Hs[(size_t)L * K * V + i]; }
            // backward
            std::vector<double> G(K * V), D(K * V), dX(K * V);
            for (int i = 0; i < K * V; i++) { G[i] = p.dhT[sidx + i]; }
            for (int t = L - 1; t >= 0; t--) {
                const long tok = p.cu[b] + t;
                const floatX *row = &p.conv[(size_t)tok * p.conv_dim];
                const double fv = p.f[(size_t)tok * N + n];
                const double *H = &Hs[(size_t)t * K * V], *Hn = &Hs[(size_t)(t + 1) * K * V];
                const double *Z = &Zs[(size_t)t * K * V];
                double dfacc = 0.0;
                for (int r = 0; r < K; r++) {
                    const double qr = from_bf(row[qh * K + r]);
                    for (int j = 0; j < V; j++) {
                        double g = G[r * V + j];
                        if (clip > 0.0) {
                            total++;
                            if (fabs(g) > clip) { clamped++; g = g > 0 ? clip : -clip; }
                        }
                        D[r * V + j] = g + qr * from_bf(p.dy[((size_t)tok * N + n) * V + j]);
                        dX[r * V + j] = D[r * V + j] * (1.0 - fv) * (1.0 - Z[r * V + j] * Z[r * V + j]);
                        dfacc += D[r * V + j] * (H[r * V + j] - Z[r * V + j]);
                    }
                }
                p.df[(size_t)tok * N + n] = dfacc;
                for (int r = 0; r < K; r++) {
                    double dqr = 0.0, dkr = 0.0;
                    for (int j = 0; j < V; j++) {
                        dqr += Hn[r * V + j] * from_bf(p.dy[((size_t)tok * N + n) * V + j]);
                        dkr += dX[r * V + j] * from_bf(row[2 * p.Nq * K + n * V + j]);
                    }
                    p.dq[((size_t)tok * p.Nq + qh) * K + r] += dqr;
                    p.dk[((size_t)tok * p.Nq + qh) * K + r] += dkr;
                }
                for (int j = 0; j < V; j++) {
                    double acc = 0.0;
                    for (int r = 0; r < K; r++) { acc += dX[r * V + j] * from_bf(row[p.Nq * K + qh * K + r]); }
                    p.dv[((size_t)tok * N + n) * V + j] = acc;
                }
                for (int i = 0; i < V; i++) {
                    for (int j = 0; j < V; j++) {
                        double acc = 0.0;
                        for (int r = 0; r < K; r++) { acc += H[r * V + i] * dX[r * V + j]; }
                        p.dW[((size_t)n * V + i) * V + j] += acc;
                    }
                }
                for (int r = 0; r < K; r++) {
                    for (int i = 0; i < V; i++) {
                        double acc = fv * D[r * V + i];
                        for (int j = 0; j < V; j++) { acc += dX[r * V + j] * Wd[i * V + j]; }
                        G[r * V + i] = acc;
                    }
                }
            }
            for (int i = 0; i < K * V; i++) { p.dh0[sidx + i] = G[i]; }
        }
    }
    p.clamp_fraction = total ? (double)clamped / total : 0.0;
}

// ----------------------------------------------------------------------------------------------------------------
// comparisons

// ||a - r|| / ||r|| over elements [lo, hi) of a strided row layout (rows of `width` at `stride`, starting at `off`)
template <class T>
static double rel_err_rows(const std::vector<T> &a, const std::vector<double> &r, long row_lo, long row_hi, int width,
                           long a_stride, long a_off, long r_stride, bool *finite) {
    double num = 0.0, den = 0.0;
    for (long i = row_lo; i < row_hi; i++) {
        for (int j = 0; j < width; j++) {
            double x;
            if constexpr (sizeof(T) == 2) {
                x = from_bf(a[i * a_stride + a_off + j]);
            } else {
                x = a[i * a_stride + a_off + j];
            }
            if (!isfinite(x)) { *finite = false; }
            const double d = x - r[i * r_stride + j];
            num += d * d;
            den += r[i * r_stride + j] * r[i * r_stride + j];
        }
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}
template <class T> static double rel_err(const std::vector<T> &a, const std::vector<double> &r, bool *finite) {
    return rel_err_rows(a, r, 0, 1, (int)r.size(), 0, 0, 0, finite);
}

// tolerances (relative L2 error against float64); measured values are printed beside each check
static const double TOL_Y = 8e-3, TOL_HT = 8e-3, TOL_GRAD = 2e-2;

// two runs' gradients compared: a whole buffer bit for bit; per token, columns [from, conv_dim) of two (ntok,
// conv_dim) buffers bit for bit (from = 2·Nq·K: dv alone); dq|dk, the first QK columns of each token, normwise
// (cancellation makes single elements jumpy), with ‖a‖² in *norm where asked
template <class T> static bool same_bits(const std::vector<T> &a, const std::vector<T> &b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
static bool same_cols(const std::vector<floatX> &a, const std::vector<floatX> &b, long ntok, int conv_dim, int from) {
    for (long t = 0; t < ntok; t++) {
        const size_t row = (size_t)t * conv_dim + from;
        if (memcmp(&a[row], &b[row], (size_t)(conv_dim - from) * sizeof(floatX)) != 0) { return false; }
    }
    return true;
}
static double qk_rel_diff(const std::vector<floatX> &a, const std::vector<floatX> &b, long ntok, int conv_dim, int QK,
                          double *norm_out = nullptr) {
    double diff = 0.0, norm = 0.0;
    for (long t = 0; t < ntok; t++) {
        for (int j = 0; j < QK; j++) {
            const double x = from_bf(a[(size_t)t * conv_dim + j]), y = from_bf(b[(size_t)t * conv_dim + j]);
            diff += (x - y) * (x - y);
            norm += x * x;
        }
    }
    if (norm_out) { *norm_out = norm; }
    return sqrt(diff / fmax(norm, 1e-300));
}

static void run_case(const Case &c, uint64_t seed) {
    Problem p;
    make_inputs(p, c, seed);
    reference(p);
    const int N = p.N, K = p.K, V = p.V, Nq = p.Nq;
    const long ntok = p.ntok;
    const size_t state = (size_t)p.B * N * K * V;

    floatX *d_conv = to_device(p.conv), *d_W = to_device(p.W), *d_dy = to_device(p.dy);
    float *d_f = to_device(p.f), *d_h0 = to_device(p.h0), *d_dhT = to_device(p.dhT);
    int *d_cu = c.lens.empty() ? nullptr : to_device(p.cu);
    M2RNNDims d;
    d.B = p.B;
    d.T = c.lens.empty() ? c.T : (int)ntok;
    d.N = N;
    d.Nq = Nq;
    d.K = K;
    d.V = V;
    d.sq = d.sk = d.sv = p.conv_dim;
    d.cu_seqlens = d_cu;
    const floatX *q = d_conv, *k = d_conv + Nq * K, *v = d_conv + 2 * Nq * K;
    m2rnn_hpc_override = c.hpc;
    printf("     [%s: %d heads per CTA]\n", c.name, m2rnn_heads_per_cta(&d));

    void *ws = nullptr;
    cudaCheck(cudaMalloc(&ws, m2rnn_workspace_bytes_any(&d))); // (the cases below switch m2rnn_deterministic)
    floatX *d_y = device_poisoned<floatX>((size_t)ntok * N * V), *d_y2 = device_poisoned<floatX>((size_t)ntok * N * V);
    float *d_hT = device_poisoned<float>(state);
    floatX *d_dconv = device_poisoned<floatX>((size_t)ntok * p.conv_dim);
    float *d_df = device_poisoned<float>((size_t)ntok * N), *d_dW = device_poisoned<float>((size_t)N * V * V);
    float *d_dh0 = device_poisoned<float>(state);

    m2rnn_forward(d_y, d_hT, ws, q, k, v, d_f, d_W, c.use_h0 ? d_h0 : nullptr, &d, 0);
    m2rnn_forward(d_y2, nullptr, nullptr, q, k, v, d_f, d_W, c.use_h0 ? d_h0 : nullptr, &d, 0); // inference path
    m2rnn_backward(d_dconv, d_dconv + Nq * K, d_dconv + 2 * Nq * K, d_df, d_dW, d_dh0, ws, d_dy,
                   c.use_dhT ? d_dhT : nullptr, q, k, v, d_f, d_W, c.clip, &d, 0);
    cudaCheck(cudaDeviceSynchronize());

    auto y = to_host(d_y, (size_t)ntok * N * V), y2 = to_host(d_y2, (size_t)ntok * N * V);
    auto hT = to_host(d_hT, state), dh0 = to_host(d_dh0, state);
    auto dconv = to_host(d_dconv, (size_t)ntok * p.conv_dim);
    auto df = to_host(d_df, (size_t)ntok * N), dW = to_host(d_dW, (size_t)N * V * V);

    bool fin = true;
    char name[96];
    const double e_y = rel_err(y, p.y, &fin), e_hT = rel_err(hT, p.hT, &fin);
    const double e_dq = rel_err_rows(dconv, p.dq, 0, ntok, Nq * K, p.conv_dim, 0, (long)Nq * K, &fin);
    const double e_dk = rel_err_rows(dconv, p.dk, 0, ntok, Nq * K, p.conv_dim, Nq * K, (long)Nq * K, &fin);
    const double e_dv = rel_err_rows(dconv, p.dv, 0, ntok, N * V, p.conv_dim, 2 * Nq * K, (long)N * V, &fin);
    const double e_df = rel_err(df, p.df, &fin), e_dW = rel_err(dW, p.dW, &fin), e_dh0 = rel_err(dh0, p.dh0, &fin);
    snprintf(name, sizeof(name), "%s forward", c.name);
    test_result(fin && e_y < TOL_Y && e_hT < TOL_HT, name, "rel err y %.2e  hT %.2e  (tol %.0e)", e_y, e_hT, TOL_Y);
    snprintf(name, sizeof(name), "%s backward", c.name);
    const double worst = fmax(fmax(fmax(e_dq, e_dk), fmax(e_dv, e_df)), fmax(e_dW, e_dh0));
    test_result(fin && worst < TOL_GRAD, name,
                "rel err dq %.2e dk %.2e dv %.2e df %.2e dW %.2e dh0 %.2e (tol %.0e)%s", e_dq, e_dk, e_dv, e_df, e_dW,
                e_dh0, TOL_GRAD, fin ? "" : " NON-FINITE");
    if (c.clip > 0) { printf("     clamp fired on %.1f%% of carried dH elements\n", 100.0 * p.clamp_fraction); }
    bool same = memcmp(y.data(), y2.data(), y.size() * sizeof(floatX)) == 0;
    snprintf(name, sizeof(name), "%s inference forward == training", c.name);
    test_result(same, name, "%s", same ? "bitwise equal y" : "y differs");
    // one more training forward and backward of the same inputs (a deterministic backward spends the checkpoints),
    // the gradients into fresh poisoned buffers, brought to the host: dq|dk|dv (the conv layout), df, dW, dh0
    auto backward_again = [&](std::vector<floatX> &conv, std::vector<float> &df_h, std::vector<float> &dW_h,
                              std::vector<float> &dh0_h) {
        m2rnn_forward(d_y2, nullptr, ws, q, k, v, d_f, d_W, c.use_h0 ? d_h0 : nullptr, &d, 0);
        floatX *d_dconv2 = device_poisoned<floatX>((size_t)ntok * p.conv_dim);
        float *d_df2 = device_poisoned<float>((size_t)ntok * N), *d_dW2 = device_poisoned<float>((size_t)N * V * V);
        float *d_dh02 = device_poisoned<float>(state);
        m2rnn_backward(d_dconv2, d_dconv2 + Nq * K, d_dconv2 + 2 * Nq * K, d_df2, d_dW2, d_dh02, ws, d_dy,
                       c.use_dhT ? d_dhT : nullptr, q, k, v, d_f, d_W, c.clip, &d, 0);
        cudaCheck(cudaDeviceSynchronize());
        conv = to_host(d_dconv2, (size_t)ntok * p.conv_dim);
        df_h = to_host(d_df2, (size_t)ntok * N);
        dW_h = to_host(d_dW2, (size_t)N * V * V);
        dh0_h = to_host(d_dh02, state);
        for (void *ptr : {(void *)d_dconv2, (void *)d_df2, (void *)d_dW2, (void *)d_dh02}) { cudaCheck(cudaFree(ptr)); }
    };
    { // repeatability. Default (fp32 atomics for dq/dk over head groups): a second backward repeats dv, df, dW, dh0 bit
      // for bit and dq/dk up to the order of their fp32 adds (a bf16 result may round to a neighbouring value): held
      // normwise to 1e-4 (2.1e-5 the most measured). Deterministic mode (m2rnn_deterministic: partial slots summed in
      // rank order):
      // two more backwards repeat every gradient bit for bit, and agree with the atomic one to the same 1e-4.
        std::vector<floatX> runs[3];
        std::vector<float> df_r[3], dW_r[3], dh0_r[3];
        for (int run = 0; run < 3; run++) {
            m2rnn_deterministic = run > 0;
            backward_again(runs[run], df_r[run], dW_r[run], dh0_r[run]);
        }
        m2rnn_deterministic = 0;
        auto same_fixed = [&](int a, const std::vector<floatX> &ca, const std::vector<float> &fa,
                              const std::vector<float> &wa, const std::vector<float> &ha, bool qk) {
            return same_bits(fa, df_r[a]) && same_bits(wa, dW_r[a]) && same_bits(ha, dh0_r[a]) && // dv always; dq, dk
                   same_cols(ca, runs[a], ntok, p.conv_dim, qk ? 0 : 2 * Nq * K);                   // when asked
        };
        auto qk_rel = [&](const std::vector<floatX> &x1, const std::vector<floatX> &x2) {
            return qk_rel_diff(x1, x2, ntok, p.conv_dim, 2 * Nq * K);
        };
        const bool fixed = same_fixed(0, dconv, df, dW, dh0, false);
        const double rel = qk_rel(dconv, runs[0]);
        snprintf(name, sizeof(name), "%s backward repeatable", c.name);
        test_result(fixed && rel < 1e-4, name, "dv, df, dW, dh0 %s; dq/dk normwise rel diff %.1e (tol 1e-4)",
                    fixed ? "bitwise equal" : "DIFFER", rel);
        const bool det = same_fixed(2, runs[1], df_r[1], dW_r[1], dh0_r[1], true);
        const double rel_det = qk_rel(dconv, runs[1]);
        snprintf(name, sizeof(name), "%s deterministic backward", c.name);
        test_result(det && rel_det < 1e-4, name, "two runs %s; dq/dk against the atomic run %.1e (tol 1e-4)",
                    det ? "bitwise equal" : "DIFFER", rel_det);
    }
    if (m2rnn_uses_zstash(&d) && m2rnn_sub_override == 0) {
        // one numeric contract whatever the launcher picks for the batch and the GPU: deterministic mode gives the
        // same bits at every sub-chunk length (16 tokens at one head a CTA, 8) and heads per CTA (where N/Nq is even)
        struct { int hpc, sub; } picks[3] = {{1, 16}, {1, 8}, {2, 8}};
        std::vector<floatX> cv[3];
        std::vector<float> fv[3], wv[3], hv[3];
        int ran[3], nran = 0;
        m2rnn_deterministic = 1;
        for (int r = 0; r < 3; r++) {
            m2rnn_hpc_override = picks[r].hpc;
            m2rnn_sub_override = picks[r].sub;
            if (m2rnn_heads_per_cta(&d) != picks[r].hpc || m2rnn_backward_sub(&d, picks[r].hpc) != picks[r].sub) {
                continue; // (not legal for this shape)
            }
            backward_again(cv[r], fv[r], wv[r], hv[r]);
            ran[nran++] = r;
        }
        m2rnn_sub_override = 0;
        m2rnn_hpc_override = c.hpc;
        m2rnn_deterministic = 0;
        if (nran > 1) {
            bool same = true;
            std::string what;
            for (int x = 0; x < nran; x++) {
                const int r = ran[x], r0 = ran[0];
                if (x > 0) {
                    same = same && same_bits(cv[r0], cv[r]) && same_bits(fv[r0], fv[r]) && same_bits(wv[r0], wv[r]) &&
                           same_bits(hv[r0], hv[r]);
                }
                what += (x ? ", " : "") + std::to_string(picks[r].hpc) + " head" + (picks[r].hpc > 1 ? "s" : "") +
                        "/" + std::to_string(picks[r].sub) + " tokens";
            }
            snprintf(name, sizeof(name), "%s one contract across builds", c.name);
            test_result(same, name, "dq, dk, dv, df, dW, dh0 %s (deterministic mode; %s)",
                        same ? "bit for bit" : "DIFFER", what.c_str());
        }
    }
    if (c.clip > 0 && c.use_dhT) { // a NaN in the carried gradient passes the clamp (and reaches the trainer's guard)
        std::vector<float> dhT_nan = p.dhT;
        dhT_nan[0] = NAN; // sequence 0, head 0, row 0, column 0
        float *d_dhT_nan = to_device(dhT_nan), *d_dh0n = device_poisoned<float>(state);
        m2rnn_forward(d_y2, nullptr, ws, q, k, v, d_f, d_W, c.use_h0 ? d_h0 : nullptr, &d, 0); // fresh checkpoints
        m2rnn_backward(d_dconv, d_dconv + Nq * K, d_dconv + 2 * Nq * K, d_df, d_dW, d_dh0n, ws, d_dy, d_dhT_nan, q, k,
                       v, d_f, d_W, c.clip, &d, 0);
        cudaCheck(cudaDeviceSynchronize());
        const auto dh0n = to_host(d_dh0n, state);
        const bool nan_out = isnan(dh0n[0]);
        snprintf(name, sizeof(name), "%s NaN passes the dH clamp", c.name);
        test_result(nan_out, name, "dh0 of the poisoned element %s", nan_out ? "is NaN" : "is finite (clamped away)");
        cudaCheck(cudaFree(d_dhT_nan));
        cudaCheck(cudaFree(d_dh0n));
    }

    if (c.window > 0 && c.lens.empty()) { // drift: error per window of t, over all sequences
        printf("     per-window relative error (window %d tokens):\n     %6s %9s %9s %9s %9s %9s\n", c.window, "t0",
               "y", "dq", "dk", "dv", "df");
        double worst_w = 0.0;
        for (int t0 = 0; t0 < c.T; t0 += c.window) {
            double num[5] = {0};
            for (int b = 0; b < p.B; b++) {
                const long r0 = (long)b * c.T + t0, r1 = r0 + c.window;
                bool f2 = true;
                double e[5] = {rel_err_rows(y, p.y, r0, r1, N * V, (long)N * V, 0, (long)N * V, &f2),
                               rel_err_rows(dconv, p.dq, r0, r1, Nq * K, p.conv_dim, 0, (long)Nq * K, &f2),
                               rel_err_rows(dconv, p.dk, r0, r1, Nq * K, p.conv_dim, Nq * K, (long)Nq * K, &f2),
                               rel_err_rows(dconv, p.dv, r0, r1, N * V, p.conv_dim, 2 * Nq * K, (long)N * V, &f2),
                               rel_err_rows(df, p.df, r0, r1, N, N, 0, N, &f2)};
                for (int i = 0; i < 5; i++) { num[i] = fmax(num[i], e[i]); } // worst sequence in the window
            }
            printf("     %6d %9.2e %9.2e %9.2e %9.2e %9.2e\n", t0, num[0], num[1], num[2], num[3], num[4]);
            worst_w = fmax(worst_w, fmax(num[0] / TOL_Y, fmax(fmax(num[1], num[2]), fmax(num[3], num[4])) / TOL_GRAD));
        }
        snprintf(name, sizeof(name), "%s every window within tolerance", c.name);
        test_result(worst_w < 1.0, name, "worst window at %.2f of its tolerance", worst_w);
    }

    // single-token step kernel: walk the sequences token by token from h0 (fixed-length cases only)
    if (c.lens.empty() && c.T <= 64) {
        float *d_state = to_device(p.h0), *d_fstep = nullptr;
        floatX *d_ystep = nullptr;
        cudaCheck(cudaMalloc(&d_fstep, (size_t)p.B * N * sizeof(float)));
        cudaCheck(cudaMalloc(&d_ystep, (size_t)p.B * N * V * sizeof(floatX)));
        M2RNNDims ds = d;
        ds.sq = ds.sk = ds.sv = (long)c.T * p.conv_dim; // sequence b's token t sits at row b*T + t
        ds.cu_seqlens = nullptr;
        std::vector<floatX> ystep((size_t)ntok * N * V);
        std::vector<float> fstep((size_t)p.B * N);
        for (int t = 0; t < c.T; t++) {
            for (int b = 0; b < p.B; b++) {
                for (int n = 0; n < N; n++) { fstep[b * N + n] = p.f[((size_t)b * c.T + t) * N + n]; }
            }
            cudaCheck(cudaMemcpy(d_fstep, fstep.data(), fstep.size() * sizeof(float), cudaMemcpyHostToDevice));
            const size_t off = (size_t)t * p.conv_dim;
            m2rnn_step(d_ystep, d_state, (long)N * K * V, q + off, k + off, v + off, d_fstep, d_W, &ds, 0);
            auto yt = to_host(d_ystep, (size_t)p.B * N * V);
            for (int b = 0; b < p.B; b++) {
                memcpy(&ystep[((size_t)b * c.T + t) * N * V], &yt[(size_t)b * N * V], (size_t)N * V * sizeof(floatX));
            }
        }
        auto sT = to_host(d_state, state);
        bool f3 = true;
        const double e_ys = rel_err(ystep, p.y, &f3), e_s = rel_err(sT, p.hT, &f3);
        snprintf(name, sizeof(name), "%s step kernel", c.name);
        test_result(f3 && e_ys < TOL_Y && e_s < TOL_HT, name, "rel err y %.2e  state %.2e", e_ys, e_s);
        // the step is the training forward's step warp for warp: every y and the final state bit for bit
        const bool same_y = memcmp(ystep.data(), y.data(), y.size() * sizeof(floatX)) == 0;
        const bool same_s = memcmp(sT.data(), hT.data(), hT.size() * sizeof(float)) == 0;
        snprintf(name, sizeof(name), "%s step kernel = forward", c.name);
        test_result(same_y && same_s, name, "y %s, state %s", same_y ? "bit for bit" : "DIFFERS",
                    same_s ? "bit for bit" : "DIFFERS");
        cudaCheck(cudaFree(d_state));
        cudaCheck(cudaFree(d_fstep));
        cudaCheck(cudaFree(d_ystep));
    }

    cudaCheck(cudaFree(d_conv));
    cudaCheck(cudaFree(d_W));
    cudaCheck(cudaFree(d_dy));
    cudaCheck(cudaFree(d_f));
    cudaCheck(cudaFree(d_h0));
    cudaCheck(cudaFree(d_dhT));
    if (d_cu) { cudaCheck(cudaFree(d_cu)); }
    cudaCheck(cudaFree(ws));
    cudaCheck(cudaFree(d_y));
    cudaCheck(cudaFree(d_y2));
    cudaCheck(cudaFree(d_hT));
    cudaCheck(cudaFree(d_dconv));
    cudaCheck(cudaFree(d_df));
    cudaCheck(cudaFree(d_dW));
    cudaCheck(cudaFree(d_dh0));
    m2rnn_hpc_override = 0;
}

// The paper's shape at full occupancy (B=8, N=84, T=4096: 672 CTAs of one head, 3 an SM, or 336 of two, 2 an SM),
// GPU only (a float64 reference of this size would take minutes): here deterministic mode's sum kernel runs beside the
// backward on the room it leaves, so its waits on the window counts are exercised as in training. Two deterministic
// backwards (each after its own training forward) with the launcher's pick and two at the other heads per CTA (one
// head: the pairs of CTAs, m2rnn_det_pairs, with the cost model's sub-chunk length) must agree bit for bit, and with
// the atomic backward dv, df, dW, dh0 bit for bit and dq/dk to 1e-4.
static void run_full_shape(int B, int T, int N, uint64_t seed) {
    const Case c = {"full shape", B, T, N, 1, 64, 16, {}, true, true, 0.0f, 1.0, 0, 0};
    Problem p;
    make_inputs(p, c, seed);
    const int Nq = 1, K = 64, V = 16;
    const long ntok = p.ntok;
    const size_t state = (size_t)B * N * K * V;
    floatX *d_conv = to_device(p.conv), *d_W = to_device(p.W), *d_dy = to_device(p.dy);
    float *d_f = to_device(p.f), *d_h0 = to_device(p.h0), *d_dhT = to_device(p.dhT);
    M2RNNDims d = {B, T, N, Nq, K, V, p.conv_dim, p.conv_dim, p.conv_dim, nullptr};
    const floatX *q = d_conv, *k = d_conv + Nq * K, *v = d_conv + 2 * Nq * K;
    void *ws = nullptr;
    cudaCheck(cudaMalloc(&ws, m2rnn_workspace_bytes_any(&d)));
    floatX *d_y = device_poisoned<floatX>((size_t)ntok * N * V);
    floatX *d_dconv = device_poisoned<floatX>((size_t)ntok * p.conv_dim);
    float *d_df = device_poisoned<float>((size_t)ntok * N), *d_dW = device_poisoned<float>((size_t)N * V * V);
    float *d_dh0 = device_poisoned<float>(state);
    std::vector<floatX> conv[5];
    std::vector<float> df[5], dW[5], dh0[5];
    const int pick = m2rnn_heads_per_cta(&d, true), other = pick == 1 ? 2 : 1; // deterministic; N/Nq even: both legal
    for (int run = 0; run < 5; run++) { // atomic, deterministic twice, deterministic at the other heads a CTA twice
        m2rnn_deterministic = run > 0;
        m2rnn_hpc_override = run > 2 ? other : 0;
        m2rnn_forward(d_y, nullptr, ws, q, k, v, d_f, d_W, d_h0, &d, 0);
        m2rnn_backward(d_dconv, d_dconv + Nq * K, d_dconv + 2 * Nq * K, d_df, d_dW, d_dh0, ws, d_dy, d_dhT, q, k, v,
                       d_f, d_W, 0.0f, &d, 0);
        cudaCheck(cudaDeviceSynchronize());
        conv[run] = to_host(d_dconv, (size_t)ntok * p.conv_dim);
        df[run] = to_host(d_df, (size_t)ntok * N);
        dW[run] = to_host(d_dW, (size_t)N * V * V);
        dh0[run] = to_host(d_dh0, state);
    }
    m2rnn_deterministic = 0;
    m2rnn_hpc_override = 0;
    bool det_same = true;
    for (int run = 2; run < 5; run++) {
        det_same = det_same && same_bits(conv[1], conv[run]) && same_bits(df[1], df[run]) &&
                   same_bits(dW[1], dW[run]) && same_bits(dh0[1], dh0[run]);
    }
    const bool rest_same = same_bits(df[0], df[1]) && same_bits(dW[0], dW[1]) && same_bits(dh0[0], dh0[1]) &&
                           same_cols(conv[0], conv[1], ntok, p.conv_dim, 2 * Nq * K);
    double norm = 0.0;
    const double rel = qk_rel_diff(conv[0], conv[1], ntok, p.conv_dim, 2 * Nq * K, &norm);
    char name[96];
    snprintf(name, sizeof(name), "B=%d T=%d N=%d deterministic backward, full occupancy", B, T, N);
    test_result(det_same && rest_same && rel < 1e-4 && norm > 0.0, name,
                "four runs (%d heads/CTA twice, %d twice) %s; against the atomic run dv, df, dW, dh0 %s, dq/dk "
                "normwise %.1e (tol 1e-4)", pick, other, det_same ? "bitwise equal" : "DIFFER",
                rest_same ? "bitwise equal" : "DIFFER", rel);
    for (void *ptr : {(void *)d_conv, (void *)d_W, (void *)d_dy, (void *)d_f, (void *)d_h0, (void *)d_dhT, ws,
                      (void *)d_y, (void *)d_dconv, (void *)d_df, (void *)d_dW, (void *)d_dh0}) {
        cudaCheck(cudaFree(ptr));
    }
}

int main(void) {
    // shape checks run everywhere (no GPU needed)
    {
        M2RNNDims d = {2, 64, 4, 1, 64, 16, 208, 208, 208, NULL};
        int ok = m2rnn_check_dims(&d) == NULL;
        d.K = 40;
        ok = ok && m2rnn_check_dims(&d) != NULL;
        d.K = 64;
        d.V = 24;
        ok = ok && m2rnn_check_dims(&d) != NULL;
        d.V = 16;
        d.Nq = 3;
        ok = ok && m2rnn_check_dims(&d) != NULL;
        d.Nq = 1;
        d.sv = 20;
        ok = ok && m2rnn_check_dims(&d) != NULL;
        test_result(ok, "shape checks", "accepts K=64 V=16, refuses K=40, V=24, N %% Nq != 0, short stride");
    }
    { // the launcher's cost model at K=64, V=16 on 132 SMs (H100 SXM, H200): the sub-chunk lengths dev/bench/NOTES.md's
      // eighteenth session predicts from that session's matrix, one head a CTA (N=83: two heads are not legal anyway)
        struct { int B, N, sub; } want[] = {{8, 84, 16}, {4, 84, 16}, {8, 132, 16}, {4, 132, 8}, {1, 84, 16},
                                            {11, 84, 8}, {16, 84, 16}, {4, 83, 16}};
        bool ok = true;
        char got[256] = "";
        for (auto &w : want) {
            const M2RNNDims d = {w.B, 4096, w.N, 1, 64, 16, 208, 208, 208, NULL};
            const int sub = m2rnn_sub_k64v16(&d, 132);
            ok = ok && sub == w.sub && m2rnn_heads_per_cta(&d) == 1;
            snprintf(got + strlen(got), sizeof(got) - strlen(got), " B%dN%d:%d", w.B, w.N, sub);
        }
        test_result(ok, "cost model picks (132 SMs)", "one head a CTA; sub-chunk tokens:%s", got);
    }
    int ndev = 0;
    cudaError_t err = cudaGetDeviceCount(&ndev);
    if (err != cudaSuccess || ndev == 0) {
        test_skip("m2rnn GPU kernels", "no GPU (the CUDA runtime found no device)");
        return test_summary("test_m2rnn_gpu");
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);

    struct { Case c; int seed; } cases[] = {
        //  name                     B   T    N  Nq   K   V   lens            h0     dhT    clip   dy  window hpc
        {{"basic K64V16 Nq1", 2, 77, 4, 1, 64, 16, {}, true, true, 0.0f, 1.0, 0, 2}, 1},
        {{"basic K64V16 Nq1 1 head/CTA", 2, 77, 4, 1, 64, 16, {}, true, true, 0.0f, 1.0, 0, 0}, 1},
        {{"clamp Nq=N K32V32", 2, 50, 3, 3, 32, 32, {}, true, true, 0.05f, 20.0, 0, 0}, 2},
        {{"varlen K16V16", 0, 0, 2, 1, 16, 16, {5, 35, 1, 0, 70, 33}, true, true, 0.0f, 1.0, 0, 2}, 3},
        // last chunks of more than 16 tokens: deterministic mode's partial slots use the slot after a sequence's last
        {{"varlen last chunks > 16", 0, 0, 4, 1, 64, 16, {20, 50, 17, 0, 30}, true, true, 0.0f, 1.0, 0, 2}, 10},
        {{"K128 V16 Nq=N", 1, 45, 2, 2, 128, 16, {}, false, false, 0.0f, 1.0, 0, 0}, 4},
        {{"K192 V16 Nq1 (plain build)", 2, 41, 2, 1, 192, 16, {}, true, true, 0.3f, 5.0, 0, 0}, 13},
        {{"K48 N6 Nq2 (3 heads/qk)", 2, 40, 6, 2, 48, 16, {}, true, false, 0.5f, 5.0, 0, 0}, 5},
        {{"K256 V32 Nq1", 1, 33, 2, 1, 256, 32, {}, true, true, 0.0f, 1.0, 0, 2}, 6},
        {{"T4096 K64V16 Nq1", 1, 4096, 4, 1, 64, 16, {}, false, false, 0.0f, 1.0, 512, 2}, 7},
        // many value heads per q/k head (the paper's N=84, Nq=1): 84 or 42 adders per dq/dk element
        {{"N20 Nq1", 2, 100, 20, 1, 64, 16, {}, true, true, 0.0f, 1.0, 0, 0}, 8},
        {{"N84 Nq1 varlen", 0, 0, 84, 1, 64, 16, {70, 0, 45}, true, true, 0.0f, 1.0, 0, 0}, 9},
        {{"N84 Nq1 varlen 2 heads/CTA", 0, 0, 84, 1, 64, 16, {70, 0, 45}, true, true, 0.0f, 1.0, 0, 2}, 9},
    };
    // the launcher's pick (the Z stash wherever V=16 and K <= 128; 16-token sub-chunks at one head a CTA, K <= 64)
    for (auto &e : cases) { run_case(e.c, e.seed); }
    // the Z stash with 8-token sub-chunks forced where the launcher took 16, same inputs
    m2rnn_sub_override = 8;
    for (auto &e : cases) {
        if (e.c.V != 16 || e.c.K > 64) { continue; }
        Case c = e.c;
        const std::string name = std::string(c.name) + " [8-token sub-chunks]";
        c.name = name.c_str();
        run_case(c, e.seed);
    }
    m2rnn_sub_override = 0;
    run_full_shape(8, 4096, 84, 11);
    run_full_shape(4, 4096, 84, 12);
    return test_summary("test_m2rnn_gpu");
}
