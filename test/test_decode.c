/*
test_decode.c: recurrent decoding on the CPU against the training forward, for every mixer kind. A tiny model with
random non-trivial weights runs the full forward over B sequences of T tokens; then the same tokens are fed one at a
time through model_decode_step (each kind's single-token step with its decode state: the conv window and recurrent
state of M, R, U, G, S, the KV cache of A); the logits at every position must match the forward's. The two paths run the same
arithmetic in the same order (observed: bitwise equal), but nothing promises the compiler contracts both alike, so
the bound is 1e-5 relative (normwise per position) in fp32, where a wrong state or a missed update is O(1).
The prefill path (model_decode_advance with several tokens) is held to the same bound: whole prompts, prompts in
uneven chunks, two sequences at once, and a state saved after a prompt and restored into another sequence's slot.
*/
#define TESTING
#include "train_m2rnn.c"
#include "test/test_common.h"

static Rng rng = {2024};
// the relative error ‖got − ref‖ / ‖ref‖ of a row of n logits, in double
static double max_rel(const float *got, const float *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) { num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]); den += (double)ref[i] * ref[i]; }
    return sqrt(num / den);
}

static void decode_case(const char *pattern, int rope, int kv_heads) {
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.vocab_size = 53; c.d_model = 24; c.m2rnn.heads = 4; c.m2rnn.qk_heads = 1; c.m2rnn.k = 8; c.m2rnn.v = 4;
    c.attn.heads = 4; c.attn.head_dim = 8; c.attn.kv_heads = kv_heads; c.attn.rope = rope; c.swiglu.hidden = 32; c.vrnn.heads = 3;
    c.vrnn.head_dim = 4; c.m2rnn.grad_clamp = 1;
    c.gdn.heads = 2; c.gdn.k = 4; c.gdn.v = 6; c.gdn.neg = rope; // (rope doubles as GDN[-1,1] here: one flag less)
    c.mamba2.head_dim = 8; c.mamba2.state = 6; c.mamba2.groups = 2;
    c.moe.experts = 4; c.moe.top_k = 2; c.moe.hidden = 8; c.moe.shared = 6;
    snprintf(c.pattern, sizeof(c.pattern), "%s", pattern);
    if (strcmp(pattern, "MRAUMA") == 0) { snprintf(c.ffn_pattern, sizeof(c.ffn_pattern), "seesse"); } // MoE layers too
    Model *m = model_create(&c);
    for (size_t i = 0; i < m->table.num_parameters; i++) { m->params_memory[i] = (real)(0.3 * (2 * rng_uniform(&rng) - 1)); }
    for (int i = 0; i < m->table.num_specs; i++) { // padding rows stay zero; slow-forgetting heads as trained models have
        const ParamSpec *s = &m->table.specs[i];
        if (s->zero_rows_from < s->shape[0]) {
            memset(m->params_memory + s->offset + s->zero_rows_from * s->shape[1], 0,
                   (s->shape[0] - s->zero_rows_from) * s->shape[1] * sizeof(real));
        }
    }
    enum { B = 2, T = 9 };
    int tokens[B * T];
    for (int i = 0; i < B * T; i++) { tokens[i] = (int)(rng_next_u64(&rng) % 53); }
    model_forward(m, tokens, NULL, B, T);
    const int Vp = m->config.padded_vocab_size;
    float *ref = (float *)mallocCheck((size_t)B * T * Vp * sizeof(float)), *got = (float *)mallocCheck((size_t)Vp * sizeof(float));
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) { model_logits_row(m, b, t, ref + ((size_t)b * T + t) * Vp); }
    }
    model_decode_begin(m, B, T);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        int tok[B], pos[B];
        for (int b = 0; b < B; b++) { tok[b] = tokens[b * T + t]; pos[b] = t; }
        model_decode_step(m, tok, pos);
        for (int b = 0; b < B; b++) {
            model_decode_logits(m, b, got);
            worst = fmax(worst, max_rel(got, ref + ((size_t)b * T + t) * Vp, Vp));
        }
    }
    char name[256];
    snprintf(name, sizeof(name), "decode = forward at every position: %s%s%s%s%s%s", pattern,
             rope && strchr(pattern, 'A') ? " (RoPE)" : "", rope && strchr(pattern, 'G') ? " (GDN[-1,1])" : "",
             kv_heads == 2 ? " (GQA 4/2)" : kv_heads == 1 ? " (MQA)" : "", c.ffn_pattern[0] ? " ffn=" : "", c.ffn_pattern);
    test_result(worst < 1e-5, name, "worst rel err %.2e over %d positions x %d sequences, state %zu numbers/seq",
                worst, T, B, model_decode_state_numbers(&m->config, T));
    free(ref); free(got);
    model_free(m);
}

// the prefill path of model_decode_advance on the same model: prefills of whole prompts, prompts in uneven chunks,
// both sequences at once, a state saved after a prompt and restored into another sequence slot; each must give the
// forward's logits at the positions it ends on (same bound)
static void prefill_case(const char *pattern, int rope, int kv_heads) {
    ModelConfig c;
    memset(&c, 0, sizeof(c));
    c.vocab_size = 53; c.d_model = 24; c.m2rnn.heads = 4; c.m2rnn.qk_heads = 1; c.m2rnn.k = 8; c.m2rnn.v = 4;
    c.attn.heads = 4; c.attn.head_dim = 8; c.attn.kv_heads = kv_heads; c.attn.rope = rope; c.swiglu.hidden = 32;
    c.vrnn.heads = 3; c.vrnn.head_dim = 4; c.m2rnn.grad_clamp = 1; c.gdn.heads = 2; c.gdn.k = 4; c.gdn.v = 6;
    c.mamba2.head_dim = 8; c.mamba2.state = 6; c.mamba2.groups = 2;
    snprintf(c.pattern, sizeof(c.pattern), "%s", pattern);
    Model *m = model_create(&c);
    for (size_t i = 0; i < m->table.num_parameters; i++) { m->params_memory[i] = (real)(0.3 * (2 * rng_uniform(&rng) - 1)); }
    enum { B = 2, T = 11 };
    int tokens[B * T];
    for (int i = 0; i < B * T; i++) { tokens[i] = (int)(rng_next_u64(&rng) % 53); }
    model_forward(m, tokens, NULL, B, T);
    const int Vp = m->config.padded_vocab_size;
    float *ref = (float *)mallocCheck((size_t)B * T * Vp * sizeof(float)), *got = (float *)mallocCheck((size_t)Vp * sizeof(float));
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) { model_logits_row(m, b, t, ref + ((size_t)b * T + t) * Vp); }
    }
    double whole = 0, chunked = 0, both = 0, restored = 0;
#define REF(b, t) (ref + ((size_t)(b) * T + (t)) * Vp)
    // sequence 0: a prompt of 6 tokens at once, then one token at a time
    model_decode_begin(m, B, T);
    int zero = 0;
    model_decode_advance(m, 0, 1, tokens, 6, &zero);
    model_decode_logits(m, 0, got);
    whole = fmax(whole, max_rel(got, REF(0, 5), Vp));
    void *saved = mallocCheck(model_decode_state_size(m));
    model_decode_state_io(m, 0, saved, 1);
    for (int t = 6; t < T; t++) {
        model_decode_advance(m, 0, 1, tokens + t, 1, &t);
        model_decode_logits(m, 0, got);
        whole = fmax(whole, max_rel(got, REF(0, t), Vp));
    }
    // sequence 1: chunks of 2, 5 and 4 tokens
    const int cuts[4] = {0, 2, 7, T};
    for (int i = 0; i < 3; i++) {
        int p0 = cuts[i];
        model_decode_advance(m, 1, 1, tokens + T + p0, cuts[i + 1] - p0, &p0);
        model_decode_logits(m, 1, got);
        chunked = fmax(chunked, max_rel(got, REF(1, cuts[i + 1] - 1), Vp));
    }
    // both sequences at once, 8 tokens, from a fresh state; then sequence 0's saved state restored into slot 1
    model_decode_begin(m, B, T);
    int pos2[2] = {0, 0}, two[2 * 8];
    for (int b = 0; b < 2; b++) { memcpy(two + b * 8, tokens + b * T, 8 * sizeof(int)); }
    model_decode_advance(m, 0, 2, two, 8, pos2);
    for (int b = 0; b < 2; b++) {
        model_decode_logits(m, b, got);
        both = fmax(both, max_rel(got, REF(b, 7), Vp));
    }
    model_decode_state_io(m, 1, saved, 0);
    int p6 = 6;
    model_decode_advance(m, 1, 1, tokens + 6, 5, &p6);
    model_decode_logits(m, 1, got);
    restored = max_rel(got, REF(0, T - 1), Vp);
#undef REF
    char name[128];
    snprintf(name, sizeof(name), "prefill = forward: %s%s%s", pattern, rope && strchr(pattern, 'A') ? " (RoPE)" : "",
             kv_heads == 2 ? " (GQA 4/2)" : "");
    test_result(fmax(fmax(whole, chunked), fmax(both, restored)) < 1e-5, name,
                "whole %.1e, chunks 2+5+4 %.1e, 2 sequences %.1e, saved/restored %.1e", whole, chunked, both, restored);
    free(ref); free(got); free(saved);
    model_free(m);
}

int main(void) {
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
    decode_case("M", 0, 0);
    decode_case("A", 0, 0);
    decode_case("A", 1, 0);
    decode_case("A", 1, 2);
    decode_case("A", 0, 1);
    decode_case("R", 0, 0);
    decode_case("U", 0, 0);
    decode_case("G", 0, 0);
    decode_case("G", 1, 0);
    decode_case("S", 0, 0);
    decode_case("MRAUMA", 1, 2);
    decode_case("MGSAGS", 1, 2);
    const char *kinds[] = {"M", "A", "R", "U", "G", "S"};
    for (int i = 0; i < 6; i++) { prefill_case(kinds[i], 1, 0); }
    prefill_case("MRAUGSA", 1, 2);
    return test_summary("test_decode");
}
