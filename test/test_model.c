/*
test_model.c: the one model definition (layers.h, model.h) against the authors' layer and against itself:
- the parameter table of the paper's 410M Hybrid M²RNN (d=1024, 24 layers MMMMAMMMMMMMAMMMMMMMAMMM, N=84, Nq=1, K=64,
  V=16, SwiGLU 2752, vocab 100352) counted tensor by tensor (spec m2rnn_authors_code.md §1: 2900 projection rows, a
  4.38M mixer, a 4.19M attention layer), and the RNN/GRU baselines at the paper's state size (85 heads of 16);
- the defaults, the descriptor parser (fields in any order, ffn=, refusal of a field no layer uses), the config's
  text form for checkpoints (a round trip for every kind);
- the init rules (identity W, ones, A ~ U(0,16], dt in [1e-3, 1e-1], depth-scaled output projections) and the
  no-decay set, the 8-element alignment of every tensor;
- the layer-kind table itself: every row has a CPU implementation under its letter, its tensors are named uniquely
  with tensor-parallel segments that add up, its descriptor keys are unique, its FLOPs and decode state positive.
*/
#define TESTING
#include "train_m2rnn.c"
#include "test/test_common.h"

static ModelConfig config_of(const char *descriptor, int vocab) {
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.vocab_size = vocab;
    c.m2rnn.grad_clamp = 1.0f;
    model_config_from_descriptor(&c, descriptor);
    model_config_fill_defaults(&c);
    model_config_validate(&c);
    return c;
}

static size_t layer_kind_params(const ParamTable *t, int layer, char kind) {
    size_t n = 0;
    for (int i = 0; i < t->num_specs; i++) {
        if (t->specs[i].layer == layer && t->specs[i].kind == kind) { n += t->specs[i].numel; }
    }
    return n;
}

static void test_paper_parameter_counts(void) {
    ModelConfig c = config_of("d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84", 100352);
    ParamTable t;
    param_table_build(&t, &c);
    test_result(m2rnn_proj_rows(&c) == 2900, "410M: projection rows q|k|v|f|g", "%d (spec: 64+64+1344+84+1344 = 2900)",
                m2rnn_proj_rows(&c));
    const size_t mixer = layer_kind_params(&t, 0, 'M'), attention = layer_kind_params(&t, 4, 'A');
    // 2900·1024 + 1472·4 + 84 + 84 + 84·16 + 84·16·16 + 1344 + 1024·1344
    test_result(mixer == 4376104, "410M: one M2RNN mixer", "%zu parameters (spec: 4.38M)", mixer);
    test_result(attention == 4194304, "410M: one attention mixer", "%zu parameters (spec: 4.19M)", attention);
    const size_t total = param_table_count(&t), emb = 2 * (size_t)100352 * 1024;
    test_result(total == 512951624 && total - emb / 2 == 410191176, "410M: total and non-embedding + one embedding",
                "%zu total, %zu without one embedding (\"410M\")", total, total - emb / 2);
    test_result(c.swiglu.hidden == 2752 && c.attn.heads == 16 && c.attn.head_dim == 64 && c.padded_vocab_size == 100352,
                "410M: SwiGLU 2752, 16 heads of 64, vocab 100352", "F=%d NH=%d HS=%d Vp=%d", c.swiglu.hidden,
                c.attn.heads, c.attn.head_dim, c.padded_vocab_size);
    int aligned = 1;
    for (int i = 0; i < t.num_specs; i++) { aligned &= t.specs[i].offset % 8 == 0; }
    test_result(aligned, "every tensor starts on 8 elements", "%d tensors", t.num_specs);
    // the order of version-1 checkpoints: ln1, the mixer's tensors, ln2, the MLP's, per layer
    const char *order[] = {"wte", "layer0.ln1_w", "layer0.m2rnn.in_w", "layer0.m2rnn.conv_w", "layer0.m2rnn.A_log",
                           "layer0.m2rnn.dt_bias", "layer0.m2rnn.D", "layer0.m2rnn.W", "layer0.m2rnn.norm_w",
                           "layer0.m2rnn.out_w", "layer0.ln2_w", "layer0.swiglu.up_w", "layer0.swiglu.down_w"};
    int in_order = 1;
    for (int i = 0; i < 13; i++) { in_order &= strcmp(t.specs[i].name, order[i]) == 0; }
    test_result(in_order && strcmp(t.specs[t.num_specs - 1].name, "lm_head") == 0,
                "tensor order of checkpoint version 1", "%s ... %s", t.specs[2].name, t.specs[t.num_specs - 1].name);

    // the vector baselines at the paper's state size 1,360 = 85 × 16 (RNN-406M, GRU-474M)
    ModelConfig r = config_of("d1024:RRRRRRRRRRRRRRRRRRRRRRRR:rh85", 100352);
    ModelConfig u = config_of("d1024:UUUUUUUUUUUUUUUUUUUUUUUU:rh85", 100352);
    ParamTable tr, tu;
    param_table_build(&tr, &r);
    param_table_build(&tu, &u);
    const size_t rl = layer_kind_params(&tr, 0, 'R'), ul = layer_kind_params(&tu, 0, 'U');
    const size_t rtot = param_table_count(&tr) - emb / 2, utot = param_table_count(&tu) - emb / 2;
    // RNN: 2805·1024 + 1360·4 + 85 + 85 + 85·16 + 85·256 + 1360 + 1024·1360;  GRU: 5440·1024 + 3·85·256 + 1360 + 1024·1360
    test_result(rl == 4295050 && ul == 7029840, "RNN and GRU layers at 85 heads of 16",
                "RNN %zu, GRU %zu (state %d)", rl, ul, r.vrnn.heads * r.vrnn.head_dim);
    // (the paper's 406M is 2.8M below ours: its RNN layer is unspecified beyond "M2RNN without the outer product")
    test_result(fabs(rtot / 1e6 - 406) < 3 && fabs(utot / 1e6 - 474) < 1 && fabs((double)utot / rtot - 1.16) < 0.01,
                "RNN-406M and GRU-474M, +16% (the paper's table)", "RNN %.1fM, GRU %.1fM (+%.1f%%)", rtot / 1e6, utot / 1e6,
                100.0 * ((double)utot / rtot - 1));
}

static void test_defaults_and_descriptor(void) {
    ModelConfig c = config_of("d768:MMMAMMMAMMMA", 50257);
    test_result(c.m2rnn.heads == 64 && c.m2rnn.k == 64 && c.m2rnn.v == 16 && c.m2rnn.qk_heads == 1 && c.n_layer == 12 &&
                    c.vocab_size == 50257 && c.padded_vocab_size == 50304 && c.swiglu.hidden == 2048,
                "defaults at d=768", "N=%d K=%d V=%d Nq=%d L=%d Vp=%d F=%d", c.m2rnn.heads, c.m2rnn.k, c.m2rnn.v,
                c.m2rnn.qk_heads, c.n_layer, c.padded_vocab_size, c.swiglu.hidden);
    c = config_of("rope:l3:d64:MMA:n4:q4:k32:v32:h2:f96", 50257);
    test_result(c.attn.rope == 1 && strcmp(c.pattern, "MMA") == 0 && c.m2rnn.heads == 4 && c.m2rnn.qk_heads == 4 &&
                    c.m2rnn.k == 32 && c.m2rnn.v == 32 && c.attn.heads == 2 && c.swiglu.hidden == 96,
                "descriptor fields in any order", "pattern %s N=%d Nq=%d K=%d V=%d", c.pattern, c.m2rnn.heads,
                c.m2rnn.qk_heads, c.m2rnn.k, c.m2rnn.v);
    c = config_of("d64:l5", 50257);
    test_result(strcmp(c.pattern, "MMMMM") == 0, "lNN alone: all M2RNN", "%s", c.pattern);
    c = config_of("d128:RUAM:rh24:rv8:ffn=s", 50257);
    test_result(c.vrnn.heads == 24 && c.vrnn.head_dim == 8 && strcmp(c.ffn_pattern, "ssss") == 0 &&
                    model_ffn_letter(&c, 3) == 's',
                "two-letter keys, ffn= for every layer", "rh=%d rv=%d ffn=%s", c.vrnn.heads, c.vrnn.head_dim,
                c.ffn_pattern);
    c = config_of("d128:RU", 50257);
    test_result(c.vrnn.heads == 8 && c.vrnn.head_dim == 16 && c.ffn_pattern[0] == '\0' && model_ffn_letter(&c, 1) == 's',
                "RNN/GRU defaults: head size 16, 4C/49 heads to 8s", "rh=%d rv=%d", c.vrnn.heads, c.vrnn.head_dim);
}

// A checkpoint stores the config as text: every kind's fields by name. Round trip a config with every kind.
static void test_config_text(void) {
    ModelConfig c = config_of("d96:MARUMAGS:n8:q8:k32:v16:h3:hk1:rope:rh4:rv8:gh2:gk16:gv24:gneg:sp16:sn8:sg2:f160", 1000);
    c.m2rnn.grad_clamp = 0.37f;
    c.attn.rope_theta = 12345.678f;
    char text[4000];
    const int n = model_config_to_text(&c, text, sizeof(text));
    ModelConfig back;
    char why[300] = "";
    const char *err = model_config_from_text(&back, text, why, sizeof(why));
    if (err == NULL) { model_config_fill_defaults(&back); }
    test_result(n > 0 && err == NULL && memcmp(&back, &c, sizeof(c)) == 0, "config text round trip (every kind)",
                "%d bytes%s%s", n, err ? ": " : "", err ? err : "");
    char bad[4100];
    snprintf(bad, sizeof(bad), "%sxlstm.heads=4\n", text);
    err = model_config_from_text(&back, bad, why, sizeof(why));
    test_result(err != NULL && strstr(err, "xlstm.heads") != NULL, "config text: an unknown field is refused", "%s",
                err ? err : "accepted");
}

// the GDN and Mamba-2 layers at the paper's 410M shapes, and its hybrid patterns through the descriptor
static void test_gdn_mamba2_counts(void) {
    ModelConfig g = config_of("d1024:GGGGAGGGGGGGAGGGGGGGAGGG", 100352);
    ParamTable tg;
    param_table_build(&tg, &g);
    // (512 + 512 + 1024 + 1024 + 2 + 2)·1024 + 2048·4 + 2 + 2 + 512 + 1024·1024: fla's GatedDeltaNet at hidden 1024,
    // 2 heads, head_k 256, expand_v 2, without its conv biases
    const size_t gl = layer_kind_params(&tg, 0, 'G');
    test_result(g.gdn.heads == 2 && g.gdn.k == 256 && g.gdn.v == 512 && gl == 4207108,
                "GDN 410M layer: 2 heads, K 256, V 512 (the paper's)", "H=%d K=%d V=%d, %zu parameters, state %zu",
                g.gdn.heads, g.gdn.k, g.gdn.v, gl, (size_t)g.gdn.heads * g.gdn.k * g.gdn.v);
    ModelConfig s = config_of("d1024:SSSSSSSSSSSSSSSSSSSSSSSS:si1216:sp19:sn216", 100352);
    ParamTable ts;
    param_table_build(&ts, &s);
    // the paper's Mamba-2 baseline: inner 1216 = 64 heads of 19, state 216: proj (1216 + 1648 + 64)·1024, conv
    // 1648·4 + 1648 bias, A_log, dt_bias, D 64 each, norm 1216, out 1024·1216
    const size_t sl = layer_kind_params(&ts, 0, 'S');
    test_result(mamba2_heads(&s) == 64 && sl == 4253104, "Mamba-2 410M layer: 64 heads of 19, state 216",
                "H=%d, %zu parameters", mamba2_heads(&s), sl);
    // their inits: A ~ U(1, 16) as Mamba-2 (M2RNN's reaches down to 0), conv bias zero, D and norms one; no decay on them
    ModelConfig small = config_of("d64:GS", 300);
    ParamTable tsm;
    param_table_build(&tsm, &small);
    float *p = (float *)mallocCheck(tsm.num_parameters * sizeof(float));
    model_init_parameters(p, &tsm, 3);
    int ok = 1;
    for (int i = 0; i < tsm.num_specs; i++) {
        const ParamSpec *sp = &tsm.specs[i];
        for (size_t j = 0; j < sp->numel; j++) {
            const float v = p[sp->offset + j];
            if (ends_with(sp->name, ".A_log")) { ok &= exp(v) >= 1.0 - 1e-5 && exp(v) <= 16.0 + 1e-4; }
            if (ends_with(sp->name, ".conv_b")) { ok &= v == 0.0f; }
            if (ends_with(sp->name, ".D") || ends_with(sp->name, ".norm_w")) { ok &= v == 1.0f; }
        }
        const int nd = ends_with(sp->name, ".A_log") || ends_with(sp->name, ".dt_bias") || ends_with(sp->name, ".D") ||
                       ends_with(sp->name, ".norm_w") || ends_with(sp->name, ".conv_b") || (ends_with(sp->name, "_w") &&
                       strstr(sp->name, "ln") != NULL);
        ok &= sp->weight_decay == !nd;
    }
    test_result(ok, "GDN, Mamba-2 init: A in [1,16], conv bias 0, D and norms 1, their no-decay set", "%d tensors",
                tsm.num_specs);
    free(p);
    ModelConfig h1 = config_of("d1024:MGGGAGGGGGGGAGGGGGGGAGGG:n84", 100352);
    ModelConfig h3 = config_of("d1024:GGGMAGGGGGGMAGGGGGGMAGGG:n84", 100352);
    ModelConfig hs = config_of("d1024:MSSSASSSSSSSASSSSSSSASSS:n84", 100352);
    test_result(h1.n_layer == 24 && h3.n_layer == 24 && hs.n_layer == 24 && h1.pattern[0] == 'M' && h3.pattern[3] == 'M',
                "the paper's hybrids parse: GDN + M2RNN-1, GDN + M2RNN-3, Mamba-2 + M2RNN-1", "%s %s %s", h1.pattern,
                h3.pattern, hs.pattern);
}

// the paper's 7B MoE shape: d=1536, 40 layers (attention at 4, 12, ..., 36), M2RNN N=132, 128 SwiGLU experts of 256,
// top-8, a shared expert of 1024; the authors' count: ≈6.95B total, ≈1.1B active (non-embedding active + one
// embedding, the 410M's convention)
static void test_moe_7b_counts(void) {
    ModelConfig c = config_of("d1536:MMMMAMMMMMMMAMMMMMMMAMMMMMMMAMMMMMMMAMMM:n132:ffn=e:xe128:xk8:xf256:xs1024", 100352);
    ParamTable t;
    param_table_build(&t, &c);
    const size_t total = param_table_count(&t), emb = (size_t)100352 * 1536;
    const size_t moe = layer_kind_params(&t, 0, 'e'), expert = 3 * (size_t)256 * 1536;
    const size_t active = total - 2 * emb - (size_t)c.n_layer * (128 - 8) * expert + emb;
    test_result(moe == 128 * 1536 + 128 * expert + 3 * (size_t)1024 * 1536 && fabs(total / 1e9 - 6.95) < 0.02 &&
                fabs(active / 1e9 - 1.1) < 0.05 && c.moe.aux_coef == 0.001f,
                "7B MoE: 128 experts of 256, top-8, shared 1024 (the paper's shape)",
                "%.3fB total, %.3fB active, %.1fM per MoE layer, aux %.3g", total / 1e9, active / 1e9, moe / 1e6,
                c.moe.aux_coef);
}

static void test_init_rules(void) {
    ModelConfig c = config_of("d64:MA:n8:k16", 300);
    ParamTable t;
    param_table_build(&t, &c);
    float *p = (float *)mallocCheck(t.num_parameters * sizeof(float));
    model_init_parameters(p, &t, 1);
    const ParamSpec *W = param_table_find(&t, "layer0.m2rnn.W"), *A = param_table_find(&t, "layer0.m2rnn.A_log");
    const ParamSpec *dt = param_table_find(&t, "layer0.m2rnn.dt_bias"), *D = param_table_find(&t, "layer0.m2rnn.D");
    const ParamSpec *out = param_table_find(&t, "layer0.m2rnn.out_w"), *in = param_table_find(&t, "layer0.m2rnn.in_w");
    const ParamSpec *wte = param_table_find(&t, "wte");
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
    const char *no_decay[] = {".A_log", ".dt_bias", ".D", ".norm_w", "ln1_w", "ln2_w", "lnf_w"};
    for (int i = 0; i < t.num_specs; i++) {
        const ParamSpec *s = &t.specs[i];
        int nd = 0;
        for (int k = 0; k < 7; k++) { nd |= ends_with(s->name, no_decay[k]); }
        decay_ok &= s->weight_decay == !nd;
    }
    test_result(decay_ok, "no weight decay on norms, A_log, dt_bias, D; decay on W, conv, projections", "%d tensors",
                t.num_specs);
    free(p);
}

// every row of the layer-kind tables, checked on a model that has each kind
static void test_kind_table(void) {
    ModelConfig c = config_of("d64:MARU:n8:k16:rh4", 300);
    ParamTable t;
    param_table_build(&t, &c);
    int rows_ok = 1, impl_ok = 1;
    char detail[200] = "";
    for (int k = 0; k < NUM_MIXER_KINDS + NUM_FFN_KINDS; k++) {
        const LayerKind *kind = k < NUM_MIXER_KINDS ? &MIXER_KINDS[k] : &FFN_KINDS[k - NUM_MIXER_KINDS];
        impl_ok &= kind_ops(kind->letter)->letter == kind->letter; // refuses a letter without a CPU file
        ParamDef defs[MAX_KIND_PARAMS];
        memset(defs, 0, sizeof(defs));
        const int n = kind->params(&c, defs);
        for (int i = 0; i < n; i++) {
            size_t rows = 0;
            for (int s = 0; s < defs[i].nseg; s++) { rows += defs[i].seg[s]; }
            const int seg_ok = defs[i].split != SPLIT_HEAD_GROUPS || (defs[i].nseg > 0 && rows == defs[i].shape[0]);
            int unique = 1;
            for (int j = 0; j < i; j++) { unique &= strcmp(defs[i].name, defs[j].name) != 0; }
            if (!seg_ok || !unique || defs[i].name == NULL) {
                rows_ok = 0;
                snprintf(detail, sizeof(detail), "%s.%s", kind->name, defs[i].name ? defs[i].name : "?");
            }
        }
        rows_ok &= n > 0 && n <= MAX_KIND_PARAMS && kind->flops(&c, 128) > 0;
        rows_ok &= (kind->letter >= 'a') == (kind->decode_state(&c, 128) == 0); // mixers carry state, FFNs none
    }
    test_result(rows_ok && impl_ok, "every kind: CPU ops, unique tensor names, TP segments add up", "%d+%d kinds %s",
                NUM_MIXER_KINDS, NUM_FFN_KINDS, detail);
    FieldEntry fields[MAX_CONFIG_FIELDS];
    const int nf = config_fields(fields);
    int keys_ok = 1;
    for (int i = 0; i < nf; i++) {
        for (int j = 0; j < i; j++) {
            keys_ok &= strcmp(fields[i].field->name, fields[j].field->name) != 0;
            if (fields[i].field->key && fields[j].field->key) { keys_ok &= strcmp(fields[i].field->key, fields[j].field->key) != 0; }
        }
    }
    test_result(keys_ok, "config fields: unique names and descriptor keys", "%d fields", nf);
    // the views: every spec's slot is distinct and the kind's tensors sit in its group in _PARAMS order
    int slots_ok = 1;
    for (int i = 0; i < t.num_specs; i++) {
        for (int j = 0; j < i; j++) { slots_ok &= t.specs[i].slot != t.specs[j].slot; }
        slots_ok &= t.specs[i].slot < VIEW_SLOTS;
    }
    ModelParams views;
    real *buf = (real *)callocCheck(t.num_parameters, sizeof(real));
    model_point_views(&views, buf, sizeof(real), &t);
    const ParamSpec *W = param_table_find(&t, "layer0.m2rnn.W"), *Un = param_table_find(&t, "layer3.gru.U_n");
    const M2RNNParams *mp = (const M2RNNParams *)views.layers[0].mixer;
    const GRUParams *gp = (const GRUParams *)views.layers[3].mixer;
    slots_ok &= mp->W == buf + W->offset && gp->U_n == buf + Un->offset &&
                views.layers[1].mixer[1] == buf + param_table_find(&t, "layer1.attention.out_w")->offset;
    test_result(slots_ok, "typed views: each kind's struct points at its tensors", "%d tensors", t.num_specs);
    free(buf);
    // FLOPs: the M2RNN/attention formula of round 1 still holds (MFU figures stay comparable)
    ModelConfig d = config_of("d768:MMMAMMMAMMMA", 50257);
    const double C = 768, F = 2048, N = 64, K = 64, V = 16, T = 1024, inner = 768;
    const double m = 2 * C * 2 * F + 2 * F * C + 2 * C * (2 * K + 33 * N) + 2 * N * V * C + 2 * 4 * (2 * K + N * V) +
                     N * (2 * K * V * V + 8 * K * V);
    const double a = 2 * C * 2 * F + 2 * F * C + 8 * C * inner + 2 * inner * T;
    const double want = 3 * (2 * C * 50304 + 9 * m + 3 * a);
    test_result(fabs(model_flops_per_token(&d, 1024) / want - 1) < 1e-12, "FLOPs per token from the rows",
                "%.4g (want %.4g)", model_flops_per_token(&d, 1024), want);
}

int main(void) {
    test_paper_parameter_counts();
    test_gdn_mamba2_counts();
    test_moe_7b_counts();
    test_defaults_and_descriptor();
    test_config_text();
    test_init_rules();
    test_kind_table();
    return test_summary("test_model");
}
