/*
test_model.c: the one model definition (model.h) against the authors' layer: the parameter table of the paper's 410M
Hybrid M²RNN (d=1024, 24 layers MMMMAMMMMMMMAMMMMMMMAMMM, N=84, Nq=1, K=64, V=16, SwiGLU 2752, vocab 100352) counted
tensor by tensor (spec m2rnn_authors_code.md §1: 2900 projection rows, a 4.38M mixer, a 4.19M attention layer), the
defaults, the descriptor parser, the init rules (identity W, ones, A ~ U(0,16], dt in [1e-3, 1e-1], depth-scaled
output projections) and the no-decay set, and the 8-element alignment of every tensor in the buffer.
*/
#define TESTING
#include "train_m2rnn.c"
#include "test/test_common.h"

static const ParamSpec *find_spec(const ParamTable *t, int layer, int kind) {
    for (int i = 0; i < t->num_specs; i++) {
        if (t->specs[i].layer == layer && t->specs[i].kind == kind) { return &t->specs[i]; }
    }
    return NULL;
}

static ModelConfig paper_410m(void) {
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.vocab_size = 100352;
    c.rnn_grad_clamp = 1.0f;
    model_config_from_descriptor(&c, "d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84");
    model_config_fill_defaults(&c);
    model_config_validate(&c);
    return c;
}

static void test_paper_parameter_counts(void) {
    ModelConfig c = paper_410m();
    ParamTable t;
    param_table_build(&t, &c);
    test_result(m2rnn_proj_rows(&c) == 2900, "410M: projection rows q|k|v|f|g", "%d (spec: 64+64+1344+84+1344 = 2900)",
                m2rnn_proj_rows(&c));
    size_t mixer = 0, attention = 0;
    for (int i = 0; i < t.num_specs; i++) {
        const ParamSpec *s = &t.specs[i];
        if (s->layer == 0 && s->kind >= PK_m_in_w && s->kind <= PK_m_out_w) { mixer += s->numel; }
        if (s->layer == 4 && (s->kind == PK_a_qkv_w || s->kind == PK_a_out_w)) { attention += s->numel; }
    }
    // 2900·1024 + 1472·4 + 84 + 84 + 84·16 + 84·16·16 + 1344 + 1024·1344
    test_result(mixer == 4376104, "410M: one M2RNN mixer", "%zu parameters (spec: 4.38M)", mixer);
    test_result(attention == 4194304, "410M: one attention mixer", "%zu parameters (spec: 4.19M)", attention);
    const size_t total = param_table_count(&t), emb = 2 * (size_t)100352 * 1024;
    test_result(total == 512951624 && total - emb / 2 == 410191176, "410M: total and non-embedding + one embedding",
                "%zu total, %zu without one embedding (\"410M\")", total, total - emb / 2);
    test_result(c.mlp_hidden == 2752 && c.attn_heads == 16 && c.attn_head_dim == 64 && c.padded_vocab_size == 100352,
                "410M: SwiGLU 2752, 16 heads of 64, vocab 100352", "F=%d NH=%d HS=%d Vp=%d", c.mlp_hidden, c.attn_heads,
                c.attn_head_dim, c.padded_vocab_size);
    int aligned = 1;
    for (int i = 0; i < t.num_specs; i++) { aligned &= t.specs[i].offset % 8 == 0; }
    test_result(aligned, "every tensor starts on 8 elements", "%d tensors", t.num_specs);
}

static void test_defaults_and_descriptor(void) {
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    model_config_from_descriptor(&c, "d768:MMMAMMMAMMMA");
    model_config_fill_defaults(&c);
    test_result(c.rnn_heads == 64 && c.rnn_k == 64 && c.rnn_v == 16 && c.rnn_qk_heads == 1 && c.n_layer == 12 &&
                    c.vocab_size == 50257 && c.padded_vocab_size == 50304 && c.mlp_hidden == 2048,
                "defaults at d=768", "N=%d K=%d V=%d Nq=%d L=%d Vp=%d F=%d", c.rnn_heads, c.rnn_k, c.rnn_v,
                c.rnn_qk_heads, c.n_layer, c.padded_vocab_size, c.mlp_hidden);
    memset(&c, 0, sizeof(c));
    model_config_from_descriptor(&c, "rope:l3:d64:n4:q4:k32:v32:h2:f96");
    model_config_fill_defaults(&c);
    test_result(c.use_rope == 1 && strcmp(c.pattern, "MMM") == 0 && c.rnn_heads == 4 && c.rnn_qk_heads == 4 &&
                    c.rnn_k == 32 && c.rnn_v == 32 && c.attn_heads == 2 && c.mlp_hidden == 96,
                "descriptor fields in any order, lNN alone", "pattern %s N=%d Nq=%d K=%d V=%d", c.pattern, c.rnn_heads,
                c.rnn_qk_heads, c.rnn_k, c.rnn_v);
}

static void test_init_rules(void) {
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.vocab_size = 300;
    model_config_from_descriptor(&c, "d64:MA:n8:k16");
    model_config_fill_defaults(&c);
    ParamTable t;
    param_table_build(&t, &c);
    float *p = (float *)mallocCheck(t.num_parameters * sizeof(float));
    model_init_parameters(p, &t, 1);
    const ParamSpec *W = find_spec(&t, 0, PK_m_W), *A = find_spec(&t, 0, PK_m_A_log);
    const ParamSpec *dt = find_spec(&t, 0, PK_m_dt_bias), *D = find_spec(&t, 0, PK_m_D);
    const ParamSpec *out = find_spec(&t, 0, PK_m_out_w), *in = find_spec(&t, 0, PK_m_in_w);
    const ParamSpec *wte = find_spec(&t, -1, PK_wte);
    int identity = 1;
    for (size_t j = 0; j < W->numel; j++) {
        const size_t within = j % 256;
        identity &= p[W->offset + j] == ((within / 16 == within % 16) ? 1.0f : 0.0f);
    }
    test_result(identity, "init: W is the identity per head", "%zu elements", W->numel);
    int a_ok = 1, dt_ok = 1, d_ok = 1;
    for (size_t j = 0; j < A->numel; j++) {
        const double a = exp(p[A->offset + j]);
        a_ok &= a > 0 && a <= 16.0 + 1e-4;
        const double x = p[dt->offset + j], dtv = x > 20 ? x : log1p(exp(x)); // softplus(dt_bias) = dt
        dt_ok &= dtv >= 1e-3 * (1 - 1e-5) && dtv <= 1e-1 * (1 + 1e-5);
    }
    for (size_t j = 0; j < D->numel; j++) { d_ok &= p[D->offset + j] == 1.0f; }
    test_result(a_ok && dt_ok && d_ok, "init: A in (0,16], softplus(dt_bias) in [1e-3,1e-1], D = 1", "%s%s%s",
                a_ok ? "" : "A ", dt_ok ? "" : "dt ", d_ok ? "" : "D");
    double s_out = 0, s_in = 0;
    for (size_t j = 0; j < out->numel; j++) { s_out += (double)p[out->offset + j] * p[out->offset + j]; }
    for (size_t j = 0; j < in->numel; j++) { s_in += (double)p[in->offset + j] * p[in->offset + j]; }
    const double std_out = sqrt(s_out / out->numel), std_in = sqrt(s_in / in->numel);
    const double want_out = 0.02 / sqrt(2.0 * c.n_layer);
    test_result(fabs(std_in - 0.02) < 0.002 && fabs(std_out - want_out) < 0.1 * want_out,
                "init: std 0.02, output projections 0.02/sqrt(2L)", "in %.4f, out %.5f (want %.5f)", std_in, std_out,
                want_out);
    int padding_zero = 1;
    for (size_t j = (size_t)c.vocab_size * c.d_model; j < wte->numel; j++) { padding_zero &= p[wte->offset + j] == 0; }
    test_result(padding_zero, "init: vocabulary padding rows are zero", "%d rows", c.padded_vocab_size - c.vocab_size);
    int decay_ok = 1;
    for (int i = 0; i < t.num_specs; i++) {
        const ParamSpec *s = &t.specs[i];
        const int no_decay = s->kind == PK_m_A_log || s->kind == PK_m_dt_bias || s->kind == PK_m_D ||
                             s->kind == PK_m_norm_w || s->kind == PK_ln1_w || s->kind == PK_ln2_w || s->kind == PK_lnf_w;
        decay_ok &= s->weight_decay == !no_decay;
    }
    test_result(decay_ok, "no weight decay on norms, A_log, dt_bias, D; decay on W, conv, projections", "%d tensors",
                t.num_specs);
    free(p);
}

int main(void) {
    test_paper_parameter_counts();
    test_defaults_and_descriptor();
    test_init_rules();
    return test_summary("test_model");
}
