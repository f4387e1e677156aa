/*
test_tp_shard.c: the tensor-parallel layout of every kind (layers.h: tp_local and the split rules of its tensors,
tp_shard_tensor), checked in one process on the CPU reference, ahead of the MPI and NCCL runs that will use it: for
TP = 2 and 4, each rank's tensors (its params() at the tp_local config) are exactly the shards tp_shard_tensor cuts,
and a layer run as its ranks' shards equals the whole layer: the output is the sum of the ranks' outputs (the
row-parallel output projection's all-reduce), the input gradient the sum of theirs (the column-parallel input
projection's), every split tensor's gradient the ranks' gradients put back in place, a replicated tensor's gradient
(GDN's per-head norm weight) the sum over the ranks (the all-reduce it needs). Kinds: attention with GQA and RoPE,
SwiGLU, GDN[−1,1], Mamba-2 with 2 and 4 groups, M²RNN topology-aware (Nq = TP, a norm per q/k group). The kinds
whose layer needs a collective inside (RMSNormTP: M²RNN topology-independent, RNN, GRU) cannot run their ranks one
after another in one process: test_tp_mpi runs every kind over MPI ranks. MoE and sizes that do not divide must
refuse with their reason. Bound: 1e-5 relative (fp32 sums in another order).
*/
#define TESTING
#include "train_m2rnn.c"
#include "test/test_common.h"
#include "test/test_tp_common.h"


// full layer vs its tp shards: forward, backward, every gradient
static void check_kind(const char *label, const char *desc, char letter, int tp) {
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.vocab_size = 64;
    model_config_from_descriptor(&c, desc);
    model_config_fill_defaults(&c); // (model_create does it; the layer runs here without a model)
    const LayerKind *row = mixer_kind(letter) != NULL ? mixer_kind(letter) : ffn_kind(letter);
    const KindOps *ops = kind_ops(letter);
    ModelConfig cl = c;
    const char *why = row->tp_local(&cl, tp);
    char name[200];
    snprintf(name, sizeof(name), "%s, TP=%d", label, tp);
    if (why != NULL) {
        test_result(0, name, "refused: %s", why);
        return;
    }
    ParamDef full[MAXP], loc[MAXP];
    const int n = row->params(&c, full), nl = row->params(&cl, loc);
    const int B = 2, T = 37, C = c.d_model;
    const size_t BTC = (size_t)B * T * C;
    real *w[MAXP], *g[MAXP], *wl[4][MAXP], *gl[4][MAXP];
    int shapes_ok = nl == n;
    for (int i = 0; i < n; i++) {
        const size_t nf = numel_of(&full[i]);
        w[i] = tp_random_tensor(&full[i]);
        g[i] = (real *)callocCheck(nf + 1, sizeof(real));
        size_t r0[MAX_SEGMENTS], r1[MAX_SEGMENTS];
        const size_t want = full[i].split == SPLIT_REPLICATED ? nf : nf / tp;
        shapes_ok &= tp_partial_rows(&full[i], &loc[i], tp, r0, r1) == (full[i].split == SPLIT_REPLICATED);
        shapes_ok &= i < nl && numel_of(&loc[i]) == want && strcmp(loc[i].name, full[i].name) == 0;
        for (int r = 0; r < tp; r++) {
            wl[r][i] = (real *)callocCheck(want + 1, sizeof(real));
            gl[r][i] = (real *)callocCheck(want + 1, sizeof(real));
            tp_shard_tensor(w[i], wl[r][i], sizeof(real), &full[i], &loc[i], r, tp, 0);
        }
    }
    snprintf(name, sizeof(name), "%s, TP=%d: shard shapes = the local config's", label, tp);
    test_result(shapes_ok, name, "%d tensors", n);
    if (!shapes_ok) { return; }
    real *inp = tp_random(BTC, 1.0, 0.0), *dout = tp_random(BTC, 1.0, 0.0);
    real *out, *dinp;
    tp_run_whole(&out, &dinp, ops, &c, w, g, inp, dout, B, T);
    // the ranks: outputs and input gradients summed, gradients gathered (replicated ones summed)
    real *out_sum = (real *)callocCheck(BTC, sizeof(real)), *dinp_sum = (real *)callocCheck(BTC, sizeof(real));
    real *out_r = (real *)callocCheck(BTC, sizeof(real)), *dinp_r = (real *)callocCheck(BTC, sizeof(real));
    real *acts_l = (real *)callocCheck(ops->acts_size(&cl, B, T) + 1, sizeof(real));
    real *scratch_l = (real *)callocCheck(ops->scratch_size(&cl, B, T) + 1, sizeof(real));
    real *g_back[MAXP];
    for (int i = 0; i < n; i++) { g_back[i] = (real *)callocCheck(numel_of(&full[i]) + 1, sizeof(real)); }
    for (int r = 0; r < tp; r++) {
        KindTensors tl = {wl[r], gl[r], NULL, 1.0f, NULL};
        memset(dinp_r, 0, BTC * sizeof(real));
        memset(scratch_l, 0, (ops->scratch_size(&cl, B, T) + 1) * sizeof(real));
        ops->forward(out_r, acts_l, inp, &tl, &cl, B, T);
        ops->backward(dinp_r, scratch_l, dout, inp, acts_l, &tl, &cl, B, T);
        for (size_t j = 0; j < BTC; j++) {
            out_sum[j] += out_r[j];
            dinp_sum[j] += dinp_r[j];
        }
        for (int i = 0; i < n; i++) {
            if (full[i].split == SPLIT_REPLICATED) {
                for (size_t j = 0; j < numel_of(&full[i]); j++) { g_back[i][j] += gl[r][i][j]; }
            } else {
                tp_shard_tensor(g_back[i], gl[r][i], sizeof(real), &full[i], &loc[i], r, tp, 1);
            }
        }
    }
    const double e_out = rel(out_sum, out, BTC), e_dinp = rel(dinp_sum, dinp, BTC);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < n; i++) {
        const double e = rel(g_back[i], g[i], numel_of(&full[i]));
        if (e > worst) { worst = e; worst_name = full[i].name; }
    }
    double norm_out = 0, norm_dinp = 0; // a layer whose output or input gradient vanished would pass trivially
    for (size_t j = 0; j < BTC; j++) {
        norm_out += (double)out[j] * out[j];
        norm_dinp += (double)dinp[j] * dinp[j];
    }
    int grads_nonzero = 1;
    for (int i = 0; i < n; i++) {
        double s2 = 0;
        for (size_t j = 0; j < numel_of(&full[i]); j++) { s2 += (double)g[i][j] * g[i][j]; }
        grads_nonzero &= s2 > 0;
    }
    snprintf(name, sizeof(name), "%s, TP=%d: shards = the whole layer", label, tp);
    test_result(e_out < 1e-5 && e_dinp < 1e-5 && worst < 1e-5 && norm_out > 0 && norm_dinp > 0 && grads_nonzero, name,
                "out %.1e, dinp %.1e, worst gradient %.1e (%s); |out| %.1f, |dinp| %.1f, every gradient nonzero: %s",
                e_out, e_dinp, worst, worst_name, sqrt(norm_out), sqrt(norm_dinp), grads_nonzero ? "yes" : "NO");
    for (int i = 0; i < n; i++) {
        free(w[i]); free(g[i]); free(g_back[i]);
        for (int r = 0; r < tp; r++) { free(wl[r][i]); free(gl[r][i]); }
    }
    free(inp); free(dout); free(out); free(dinp); free(out_sum); free(dinp_sum);
    free(out_r); free(dinp_r); free(acts_l); free(scratch_l);
}

static void check_refused(const char *label, const char *desc, char letter, int tp) {
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.vocab_size = 64;
    model_config_from_descriptor(&c, desc);
    model_config_fill_defaults(&c);
    const LayerKind *row = mixer_kind(letter) != NULL ? mixer_kind(letter) : ffn_kind(letter);
    ModelConfig cl = c;
    const char *why = row->tp_local(&cl, tp);
    char name[200];
    snprintf(name, sizeof(name), "%s refuses TP=%d with a reason", label, tp);
    test_result(why != NULL && row->tp_local(&c, 1) == NULL, name, "%s", why != NULL ? why : "(accepted)");
}

int main(void) {
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
    for (int tp = 2; tp <= 4; tp += 2) {
        check_kind("attention, RoPE, GQA (8 heads over 4 kv heads)", "d32:A:h8:hk4:rope", 'A', tp);
        check_kind("SwiGLU (hidden 96)", "d32:A:h4:f96", 's', tp);
        check_kind("GDN[-1,1] (4 heads, K 8, V 12)", "d32:G:gh4:gk8:gv12:gneg", 'G', tp);
        check_kind("Mamba-2 (8 heads of 8, state 6, 4 groups)", "d32:S:si64:sp8:sn6:sg4", 'S', tp);
    }
    check_kind("Mamba-2 (8 heads of 8, state 6, 2 groups)", "d32:S:si64:sp8:sn6:sg2", 'S', 2);
    check_kind("M2RNN topology-aware (8 heads, Nq 2, norm per group)", "d32:M:n8:q2:k16:v8:gn", 'M', 2);
    check_kind("M2RNN topology-aware (8 heads, Nq 4, norm per group)", "d32:M:n8:q4:k16:v8:gn", 'M', 4);
    check_refused("M2RNN with 3 value heads", "d32:M:n3:k16:v8", 'M', 2);
    check_refused("M2RNN with Nq = 6", "d32:M:n12:q6:k16:v8:gn", 'M', 4);
    check_refused("RNN with 3 heads", "d32:R:rh3", 'R', 2);
    check_refused("MoE", "d32:A:ffn=e:xe4:xk2:xf16", 'e', 2);
    return test_summary("test_tp_shard");
}
