/*
test_tp_mpi.c: tensor parallelism of every layer kind over real MPI ranks (mpirun -np 2 or 4; TP = the world size),
with the collectives counted. Each rank builds the whole layer from the same seeded tensors and runs it alone (the
reference), then runs its shard (the kind's tp_local config, tp_shard_tensor's cut of the tensors) with the group's
link (ref/common.h TPLink over comm.h's MPI TP group), followed by the block's two collectives: reduce_from_tp of the
output and copy_to_tp's all-reduce of the input gradient. The gradients the rank holds whole but computes from its own
heads (tp_partial_rows: M²RNN's shared q/k, GDN's norm weight) are summed as model_grad_norm does once a step, and the
shards are all-gathered into the whole layer's tensors. Checked: output, input gradient and every parameter gradient
against the whole layer (1e-5 relative: fp32 sums in another order), a layer whose output or gradients vanish fails,
and the collectives a layer makes (forward, backward, per step) are the expected ones, printed beside the paper's
(§Tensor Parallelism): topology-aware M²RNN none beyond Megatron's pair; topology-independent one extra forward
(RMSNormTP) and, where the paper all-reduces the q and k activation gradients in every layer's backward (three
extra), one extra backward (RMSNormTP) and the q/k weight gradients summed once a step instead, which gives the same
gradients with fewer and smaller collectives (2·Nq·K·(C + W) numbers a step instead of 2·B·T·Nq·K a layer).
*/
#define TESTING
#include "train_m2rnn.c"
#include "test/test_common.h"
#include "test/test_tp_common.h"

static Comm cm;
static void mpi_sum(TPLink *l, void *x, size_t n, size_t elem) { (void)l; comm_tp_allreduce_sum(&cm, x, n, elem); }
static void mpi_max(TPLink *l, real *x, size_t n) { (void)l; comm_tp_allreduce_max(&cm, x, n, sizeof(real)); }

// want_fwd / want_bwd: the collectives of the layer with the block's pair; paper_*: the paper's count for it
static void check_kind(const char *label, const char *desc, char letter, int want_fwd, int want_bwd, int want_step,
                       int paper_fwd, int paper_bwd) {
    const int tp = cm.tp, rank = cm.tp_rank;
    tp_rng.state = 2024; // every rank draws the same tensors
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.vocab_size = 64;
    model_config_from_descriptor(&c, desc);
    model_config_fill_defaults(&c);
    model_config_validate(&c);
    const LayerKind *row = mixer_kind(letter) != NULL ? mixer_kind(letter) : ffn_kind(letter);
    const KindOps *ops = kind_ops(letter);
    ModelConfig cl = c;
    char name[200];
    snprintf(name, sizeof(name), "%s, TP=%d", label, tp);
    const char *why = row->tp_local(&cl, tp);
    if (why != NULL) {
        test_result(0, name, "refused: %s", why);
        return;
    }
    ParamDef full[MAXP], loc[MAXP];
    const int n = row->params(&c, full);
    row->params(&cl, loc);
    const int B = 2, T = 37, C = c.d_model;
    const size_t BTC = (size_t)B * T * C;
    real *w[MAXP], *g[MAXP], *wl[MAXP], *gl[MAXP];
    for (int i = 0; i < n; i++) {
        const size_t nf = numel_of(&full[i]);
        w[i] = tp_random_tensor(&full[i]);
        g[i] = (real *)callocCheck(nf + 1, sizeof(real));
        wl[i] = (real *)callocCheck(numel_of(&loc[i]) + 1, sizeof(real));
        gl[i] = (real *)callocCheck(numel_of(&loc[i]) + 1, sizeof(real));
        tp_shard_tensor(w[i], wl[i], sizeof(real), &full[i], &loc[i], rank, tp, 0);
    }
    real *inp = tp_random(BTC, 1.0, 0.0), *dout = tp_random(BTC, 1.0, 0.0);
    // the whole layer, on every rank alone
    real *out, *dinp;
    tp_run_whole(&out, &dinp, ops, &c, w, g, inp, dout, B, T);
    // this rank's shard, with the group
    TPLink link = {tp, rank, mpi_sum, mpi_max, NULL, 0};
    real *out_r = (real *)callocCheck(BTC, sizeof(real)), *dinp_r = (real *)callocCheck(BTC, sizeof(real));
    real *acts_l = (real *)callocCheck(ops->acts_size(&cl, B, T) + 1, sizeof(real));
    real *scratch_l = (real *)callocCheck(ops->scratch_size(&cl, B, T) + 1, sizeof(real));
    KindTensors tl = {wl, gl, NULL, 1.0f, &link};
    ops->forward(out_r, acts_l, inp, &tl, &cl, B, T);
    tp_sum(&link, out_r, BTC, sizeof(real)); // reduce_from_tp
    const long fwd = link.calls;
    ops->backward(dinp_r, scratch_l, dout, inp, acts_l, &tl, &cl, B, T);
    tp_sum(&link, dinp_r, BTC, sizeof(real)); // copy_to_tp's backward
    const long bwd = link.calls - fwd;
    // once a step: the partial gradients summed (the trainer packs every tensor's into one collective)
    int step = 0;
    for (int i = 0; i < n; i++) {
        size_t r0[MAX_SEGMENTS], r1[MAX_SEGMENTS];
        const int np = tp_partial_rows(&full[i], &loc[i], tp, r0, r1);
        const size_t row_len = loc[i].shape[1] * loc[i].shape[2];
        for (int j = 0; j < np; j++) { tp_sum(&link, gl[i] + r0[j] * row_len, (r1[j] - r0[j]) * row_len, sizeof(real)); }
        step |= np > 0;
    }
    // the shards gathered into the whole layer's gradients
    real *g_back[MAXP];
    for (int i = 0; i < n; i++) {
        const size_t nl = numel_of(&loc[i]);
        g_back[i] = (real *)callocCheck(numel_of(&full[i]) + 1, sizeof(real));
        real *all = (real *)mallocCheck((size_t)tp * nl * sizeof(real) + sizeof(real));
        comm_tp_allgather(&cm, all, gl[i], nl, sizeof(real));
        for (int r = 0; r < tp; r++) { tp_shard_tensor(g_back[i], all + (size_t)r * nl, sizeof(real), &full[i], &loc[i], r, tp, 1); }
        free(all);
    }
    const double e_out = rel(out_r, out, BTC), e_dinp = rel(dinp_r, dinp, BTC);
    double worst = 0, norm_out = 0, norm_dinp = 0;
    const char *worst_name = "";
    int grads_nonzero = 1;
    for (int i = 0; i < n; i++) {
        const double e = rel(g_back[i], g[i], numel_of(&full[i]));
        if (e > worst) { worst = e; worst_name = full[i].name; }
        double s2 = 0;
        for (size_t j = 0; j < numel_of(&full[i]); j++) { s2 += (double)g[i][j] * g[i][j]; }
        grads_nonzero &= s2 > 0;
    }
    for (size_t j = 0; j < BTC; j++) {
        norm_out += (double)out[j] * out[j];
        norm_dinp += (double)dinp[j] * dinp[j];
    }
    // every rank must agree that it passed
    int ok = e_out < 1e-5 && e_dinp < 1e-5 && worst < 1e-5 && norm_out > 0 && norm_dinp > 0 && grads_nonzero;
    ok = comm_world_sum(&cm, ok) == cm.world;
    snprintf(name, sizeof(name), "%s, TP=%d: shards = the whole layer", label, tp);
    test_result(ok, name, "out %.1e, dinp %.1e, worst gradient %.1e (%s); |out| %.1f, |dinp| %.1f, gradients nonzero: %s",
                e_out, e_dinp, worst, worst_name, sqrt(norm_out), sqrt(norm_dinp), grads_nonzero ? "yes" : "NO");
    snprintf(name, sizeof(name), "%s, TP=%d: collectives", label, tp);
    test_result(fwd == want_fwd && bwd == want_bwd && step == want_step, name,
                "forward %ld, backward %ld, a step %d (expected %d, %d, %d); the paper's: forward %d, backward %d",
                fwd, bwd, step, want_fwd, want_bwd, want_step, paper_fwd, paper_bwd);
    for (int i = 0; i < n; i++) { free(w[i]); free(g[i]); free(wl[i]); free(gl[i]); free(g_back[i]); }
    free(inp); free(dout); free(out); free(dinp);
    free(out_r); free(dinp_r); free(acts_l); free(scratch_l);
}

int main(int argc, char **argv) {
    comm_init(&cm, &argc, &argv);
    comm_set_layout(&cm, cm.world); // every rank in one tensor-parallel group
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    if (cm.rank != 0) { freopen("/dev/null", "w", stdout); }
    if (cm.world < 2) {
        test_skip("tensor parallelism over MPI", "run under mpirun -np 2 (or 4): one process has no TP group");
        return test_summary("test_tp_mpi");
    }
    // Megatron's pair only: 1 forward, 1 backward
    check_kind("attention, RoPE, GQA", "d32:A:h8:hk4:rope", 'A', 1, 1, 0, 1, 1);
    check_kind("SwiGLU", "d32:A:h4:f96", 's', 1, 1, 0, 1, 1);
    check_kind("GDN[-1,1] (norm weight shared by the heads)", "d32:G:gh4:gk8:gv12:gneg", 'G', 1, 1, 1, 1, 1);
    check_kind("Mamba-2 (groups split)", "d32:S:si64:sp8:sn6:sg4", 'S', 1, 1, 0, 1, 1);
    // M²RNN, the paper's two strategies
    char desc[64];
    snprintf(desc, sizeof(desc), "d32:M:n8:q%d:k16:v8:gn", cm.tp);
    check_kind("M2RNN topology-aware (Nq = TP, norm per group)", desc, 'M', 1, 1, 0, 1, 1);
    check_kind("M2RNN topology-independent (Nq = 1, RMSNormTP)", "d32:M:n8:k16:v8", 'M', 2, 2, 1, 2, 4);
    check_kind("M2RNN per-head q/k (Nq = N), one norm", "d32:M:n8:q8:k16:v8", 'M', 2, 2, 0, 2, 2);
    // the vector baselines: heads split, RMSNormTP
    check_kind("RNN (RMSNormTP)", "d32:R:rh8:rv8", 'R', 2, 2, 0, 2, 2);
    check_kind("GRU (RMSNormTP)", "d32:U:rh8:rv8", 'U', 2, 2, 0, 2, 2);
    const int rc = test_summary("test_tp_mpi");
    comm_finalize(&cm);
    return rc;
}
