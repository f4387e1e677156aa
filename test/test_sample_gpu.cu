/*
test_sample_gpu.cu: the GPU's sampler (lm.cuh: decode_sample, under model_decode_gen_*) against infer.h's sample_token
on the same logits rows and draws: greedy (the lowest id among equal maxima, rows of −inf, NaN after id 0 and at id 0)
and temperature sampling (0.5, 1, 1.7) over a 100277-id vocabulary in rows 100352 apart (the decode logits' layout,
bf16 or fp32 with the build), rows of several spreads: the same token on every row, the same tokens twice (the row
counters left at 0), launched programmatically, and each row sampled alone (the chunks, not B, set the sums' order);
the positions advanced by one and held at the last; and
top-k sampling (decode_sample_topk, k = 1, 50, 1024, with top-p 0.9 and 0.5): its candidates equal to the first k of
the host's sort of the row, values and ids (rows of many ties, −0 beside +0), its tokens equal to sample_token's; and
each with a repetition penalty (1.3, 0.7) on 300 seen ids a row, the drawn token marked seen. The
device sums in another order than the host (NOTES.md: a draw within ≈ 1e-16 of a boundary may differ), which random
rows do not meet. Without a GPU it prints a SKIP line and exits 0.
*/
#define TESTING
#include "infer_m2rnn.cu"
#include "test/test_common.h"

#if FLOATX_IS_FP32
#define SUITE "test_sample_gpu_fp32"
#else
#define SUITE "test_sample_gpu"
#endif

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        test_skip("the GPU sampler", "no GPU (the CUDA runtime found no device)");
        return test_summary(SUITE);
    }
    const int B = 48, V = 100277, ld = 100352;
    Rng rng = {2026};
    floatX *hx = (floatX *)mallocCheck((size_t)B * ld * sizeof(floatX));
    for (int b = 0; b < B; b++) {
        const float spread = b % 3 == 0 ? 1.0f : b % 3 == 1 ? 3.0f : 8.0f; // flat to peaked distributions
        for (int t = 0; t < ld; t++) {
            const double u1 = rng_uniform(&rng), u2 = rng_uniform(&rng);
            hx[(size_t)b * ld + t] = (floatX)(spread * (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)));
        }
    }
    floatX *r0 = hx, *r1 = hx + ld, *r2 = hx + 2 * (size_t)ld, *r3 = hx + 3 * (size_t)ld;
    r0[5000] = r0[300] = r0[77777] = (floatX)40.0f; // equal maxima: the lowest id
    for (int t = 0; t < ld; t++) { r1[t] = (floatX)-INFINITY; }
    r1[4242] = r1[99999] = (floatX)-3.0f; // all −inf but two equal
    r2[17] = r2[60000] = (floatX)NAN; // NaN after id 0: never the largest
    r3[0] = (floatX)NAN;             // NaN at id 0: sample_token's scan stays there
    floatX *r4 = hx + 4 * (size_t)ld, *r5 = hx + 5 * (size_t)ld;
    for (int t = 0; t < ld; t++) { r4[t] = (floatX)(float)(int)(rng_next_u64(&rng) % 7); } // 7 values: ties everywhere
    for (int t = 0; t < ld; t++) { r5[t] = (floatX)(-1.0f - (float)(rng_uniform(&rng))); }
    for (int t = 100; t < 100000; t += 997) { r5[t] = (floatX)((t / 997) % 2 ? -0.0f : 0.0f); } // −0 and +0 on top
    floatX *dx;
    int *dout;
    double *du;
    cudaCheck(cudaMalloc(&dx, (size_t)B * ld * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dout, B * sizeof(int)));
    cudaCheck(cudaMalloc(&du, B * sizeof(double)));
    void *scratch, *scratch1; // decode_sample's for B rows and for one, their counters at 0
    cudaCheck(cudaMalloc(&scratch, sample_scratch_bytes(B, V)));
    cudaCheck(cudaMemset(scratch, 0, sample_scratch_bytes(B, V)));
    cudaCheck(cudaMalloc(&scratch1, sample_scratch_bytes(1, V)));
    cudaCheck(cudaMemset(scratch1, 0, sample_scratch_bytes(1, V)));
    int *dpos;
    cudaCheck(cudaMalloc(&dpos, B * sizeof(int)));
    cudaCheck(cudaMemcpy(dx, hx, (size_t)B * ld * sizeof(floatX), cudaMemcpyHostToDevice));
    InferOptions o = infer_options_default();
    o.top_k = 0;
    o.top_p = 1.0f;
    o.rep_penalty = 1.0f;
    float *row = (float *)mallocCheck((size_t)ld * sizeof(float));
    Cand *work = (Cand *)mallocCheck((size_t)ld * sizeof(Cand));
    unsigned char *mark = (unsigned char *)mallocCheck((size_t)ld);
    const float temps[4] = {0.0f, 0.5f, 1.0f, 1.7f};
    for (int ti = 0; ti < 4; ti++) {
        o.temperature = temps[ti];
        double u[B];
        for (int b = 0; b < B; b++) { u[b] = rng_uniform(&rng); }
        cudaCheck(cudaMemcpy(du, u, sizeof(u), cudaMemcpyHostToDevice));
        int got[4][B]; // once, again (programmatic launches), each row alone, and with positions
        for (int rep = 0; rep < 2; rep++) {
            launch_pdl = rep;
            decode_sample(SampleOut{dout, NULL, 0, NULL, 1.0f}, scratch, dx, ld, V, B, du, o.temperature, 0);
            launch_pdl = 0;
            cudaCheck(cudaMemcpy(got[rep], dout, sizeof(got[rep]), cudaMemcpyDeviceToHost));
        }
        for (int b = 0; b < B; b++) {
            decode_sample(SampleOut{dout + b, NULL, 0, NULL, 1.0f}, scratch1, dx + (size_t)b * ld, ld, V, 1, du + b,
                          o.temperature, 0);
        }
        cudaCheck(cudaMemcpy(got[2], dout, sizeof(got[2]), cudaMemcpyDeviceToHost));
        int hpos[B], wpos[B];
        for (int b = 0; b < B; b++) { hpos[b] = b % 5 == 0 ? 99 : b; } // (99: held there)
        cudaCheck(cudaMemcpy(dpos, hpos, sizeof(hpos), cudaMemcpyHostToDevice));
        decode_sample(SampleOut{dout, dpos, 99, NULL, 1.0f}, scratch, dx, ld, V, B, du, o.temperature, 0);
        cudaCheck(cudaMemcpy(got[3], dout, sizeof(got[3]), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(wpos, dpos, sizeof(wpos), cudaMemcpyDeviceToHost));
        int pos_ok = 1;
        for (int b = 0; b < B; b++) { pos_ok &= wpos[b] == (b % 5 == 0 ? 99 : b + 1); }
        int differ = 0, first = -1, want_first = -1, distinct = 0;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < ld; t++) { row[t] = (float)hx[(size_t)b * ld + t]; }
            const int want = sample_token(row, V, NULL, 0, &o, u[b], work, mark);
            if (want != got[0][b]) {
                differ++;
                if (first < 0) { first = b; want_first = want; }
            }
            if (b > 0 && got[0][b] != got[0][b - 1]) { distinct++; }
        }
        const int same = memcmp(got[0], got[1], sizeof(got[0])) == 0 && memcmp(got[0], got[2], sizeof(got[0])) == 0 &&
                         memcmp(got[0], got[3], sizeof(got[0])) == 0;
        const bool special = temps[ti] != 0.0f || (got[0][0] == 300 && got[0][1] == 4242 && got[0][3] == 0);
        char name[96];
        snprintf(name, sizeof(name), "sampler, temperature %g", temps[ti]);
        test_result(differ == 0 && same && special && distinct > B / 2 && pos_ok, name,
                    "%d rows: %d differ from sample_token%s%s (first: row %d, %d against %d); again, programmatic, "
                    "a row at a time, with positions: the same %s; positions advanced: %s",
                    B, differ, temps[ti] == 0.0f ? ", ties, -inf and NaN rows " : "", special ? "" : " SPECIAL ROWS WRONG",
                    first, first >= 0 ? got[0][first] : -1, want_first, same ? "yes" : "NO", pos_ok ? "yes" : "NO");
    }
    // top-k sampling (decode_sample_topk): its candidates = the first k of sample_token's sorted candidates (the full
    // row sorted on the host by cand_desc), values and ids, and its draws = sample_token's with top-k (and top-p)
    // (the same sums in the same order: random rows do not meet a boundary within exp's last bit); rows 2 and 3 (NaN)
    // left out: their order is not defined
    const int ks[5] = {1, 50, 1024, 50, 1024};
    const float tps[5] = {1.0f, 1.0f, 1.0f, 0.9f, 0.5f};
    float *tv = (float *)mallocCheck((size_t)B * 1024 * sizeof(float));
    int *tid = (int *)mallocCheck((size_t)B * 1024 * sizeof(int));
    float *dtv;
    int *dtid;
    void *cand;
    cudaCheck(cudaMalloc(&dtv, (size_t)B * 1024 * sizeof(float)));
    cudaCheck(cudaMalloc(&dtid, (size_t)B * 1024 * sizeof(int)));
    cudaCheck(cudaMalloc(&cand, sample_topk_scratch_bytes(B, V)));
    for (int ki = 0; ki < 5; ki++) {
        const int k = ks[ki];
        o.temperature = ki == 1 ? 0.8f : 1.0f;
        o.top_k = k;
        o.top_p = tps[ki];
        double u[B];
        for (int b = 0; b < B; b++) { u[b] = rng_uniform(&rng); }
        cudaCheck(cudaMemcpy(du, u, sizeof(u), cudaMemcpyHostToDevice));
        int got[3][B]; // once (with the candidates), again (programmatic launches), each row alone
        for (int rep = 0; rep < 2; rep++) {
            launch_pdl = rep;
            decode_sample_topk(SampleOut{dout, NULL, 0, NULL, 1.0f}, cand, scratch, rep == 0 ? dtv : NULL,
                               rep == 0 ? dtid : NULL, dx, ld, V, B, k, du, o.temperature, o.top_p, 0);
            launch_pdl = 0;
            cudaCheck(cudaMemcpy(got[rep], dout, sizeof(got[rep]), cudaMemcpyDeviceToHost));
        }
        for (int b = 0; b < B; b++) {
            decode_sample_topk(SampleOut{dout + b, NULL, 0, NULL, 1.0f}, cand, scratch1, NULL, NULL, dx + (size_t)b * ld,
                               ld, V, 1, k, du + b, o.temperature, o.top_p, 0);
        }
        cudaCheck(cudaMemcpy(got[2], dout, sizeof(got[2]), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(tv, dtv, (size_t)B * k * sizeof(float), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(tid, dtid, (size_t)B * k * sizeof(int), cudaMemcpyDeviceToHost));
        int differ = 0, first = -1, tok_differ = 0, distinct = 0;
        for (int b = 0; b < B; b++) {
            if (b == 2 || b == 3) { continue; }
            for (int t = 0; t < V; t++) { work[t].v = (float)hx[(size_t)b * ld + t] / o.temperature; work[t].id = t; }
            qsort(work, (size_t)V, sizeof(Cand), cand_desc);
            for (int i = 0; i < k; i++) {
                const float gv = tv[(size_t)b * k + i];
                if (tid[(size_t)b * k + i] != work[i].id || memcmp(&gv, &work[i].v, sizeof(float)) != 0) {
                    differ++;
                    if (first < 0) { first = b; }
                    break;
                }
            }
            for (int t = 0; t < ld; t++) { row[t] = (float)hx[(size_t)b * ld + t]; }
            tok_differ += sample_token(row, V, NULL, 0, &o, u[b], work, mark) != got[0][b];
            if (b > 4 && got[0][b] != got[0][b - 1]) { distinct++; }
        }
        const int same = memcmp(got[0], got[1], sizeof(got[0])) == 0 && memcmp(got[0], got[2], sizeof(got[0])) == 0;
        char name[96];
        snprintf(name, sizeof(name), "top-%d%s sampling, temperature %g", k, o.top_p < 1.0f ? " top-p" : "",
                 o.temperature);
        test_result(differ == 0 && tok_differ == 0 && same && (k == 1 || distinct > B / 3), name,
                    "%d rows (ties, -0 and +0 among them): candidates differ from the host's sort on %d (first row "
                    "%d), tokens differ from sample_token's on %d; again, programmatic, a row at a time: the same %s",
                    B - 2, differ, first, tok_differ, same ? "yes" : "NO");
    }
    // the repetition penalty (1.3 and 0.7) on each row's seen ids: greedy, temperature 1 and top-k 50 with top-p 0.9 =
    // sample_token with the same seen tokens, and the drawn token marked seen; row 0's three equal maxima are seen, so
    // the penalty moves its greedy token; rows 2 and 3 (NaN) left out of top-k
    const int W = CEIL_DIV(V, 32), NS = 300;
    int *hseen = (int *)mallocCheck((size_t)B * NS * sizeof(int));
    uint32_t *bits = (uint32_t *)mallocCheck((size_t)B * W * sizeof(uint32_t)), *dbits;
    uint32_t *wbits = (uint32_t *)mallocCheck((size_t)B * W * sizeof(uint32_t));
    cudaCheck(cudaMalloc(&dbits, (size_t)B * W * sizeof(uint32_t)));
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < NS; i++) { hseen[b * NS + i] = (int)(rng_next_u64(&rng) % (uint64_t)V); }
        hseen[b * NS] = 300; hseen[b * NS + 1] = 5000; hseen[b * NS + 2] = 300; // (a repeat counts once)
    }
    for (int ci = 0; ci < 6; ci++) {
        const float rp = ci % 2 == 0 ? 1.3f : 0.7f;
        o.rep_penalty = rp;
        o.temperature = ci / 2 == 0 ? 0.0f : 1.0f;
        o.top_k = ci / 2 == 2 ? 50 : 0;
        o.top_p = ci / 2 == 2 ? 0.9f : 1.0f;
        double u[B];
        for (int b = 0; b < B; b++) { u[b] = rng_uniform(&rng); }
        cudaCheck(cudaMemcpy(du, u, sizeof(u), cudaMemcpyHostToDevice));
        memset(bits, 0, (size_t)B * W * sizeof(uint32_t));
        for (int i = 0; i < B * NS; i++) { bits[(size_t)(i / NS) * W + hseen[i] / 32] |= 1u << (hseen[i] % 32); }
        cudaCheck(cudaMemcpy(dbits, bits, (size_t)B * W * sizeof(uint32_t), cudaMemcpyHostToDevice));
        const SampleOut out = {dout, NULL, 0, dbits, rp};
        if (o.top_k > 0) {
            decode_sample_topk(out, cand, scratch, NULL, NULL, dx, ld, V, B, o.top_k, du, o.temperature, o.top_p, 0);
        } else {
            decode_sample(out, scratch, dx, ld, V, B, du, o.temperature, 0);
        }
        int got[B];
        cudaCheck(cudaMemcpy(got, dout, sizeof(got), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(wbits, dbits, (size_t)B * W * sizeof(uint32_t), cudaMemcpyDeviceToHost));
        int differ = 0, first = -1, want_first = -1, marked = 1;
        for (int b = 0; b < B; b++) {
            if (o.top_k > 0 && (b == 2 || b == 3)) { continue; }
            for (int t = 0; t < ld; t++) { row[t] = (float)hx[(size_t)b * ld + t]; }
            const int want = sample_token(row, V, hseen + b * NS, NS, &o, u[b], work, mark);
            if (want != got[b]) {
                differ++;
                if (first < 0) { first = b; want_first = want; }
            }
            bits[(size_t)b * W + got[b] / 32] |= 1u << (got[b] % 32);
            marked &= memcmp(bits + (size_t)b * W, wbits + (size_t)b * W, W * sizeof(uint32_t)) == 0;
        }
        const bool moved = ci != 0 || got[0] != 300; // (row 0: its seen maxima penalized)
        char name[96];
        snprintf(name, sizeof(name), "repetition penalty %g, %s", rp,
                 o.top_k > 0 ? "top-k 50 top-p 0.9" : o.temperature == 0.0f ? "greedy" : "temperature 1");
        test_result(differ == 0 && marked && moved, name, "%d rows, %d seen ids each: %d differ from sample_token "
                    "(first: row %d, %d against %d); the drawn token marked seen: %s%s", B, NS, differ, first,
                    first >= 0 ? got[first] : -1, want_first, marked ? "yes" : "NO", moved ? "" : "; ROW 0 NOT MOVED");
    }
    free(hseen); free(bits); free(wbits);
    cudaCheck(cudaFree(dbits));
    cudaCheck(cudaFree(cand));
    free(tv); free(tid);
    cudaCheck(cudaFree(dtv)); cudaCheck(cudaFree(dtid));
    free(hx); free(row); free(work); free(mark);
    cudaCheck(cudaFree(dx)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(du)); cudaCheck(cudaFree(scratch)); cudaCheck(cudaFree(scratch1));
    cudaCheck(cudaFree(dpos));
    return test_summary(SUITE);
}
