/*
bench_infer.cu: the inference engine's speed on the GPU (the executor API infer_m2rnn runs on), with random weights:
prefill tokens/s of one prompt of P tokens (model_decode_advance: the forward's kernels from the states, in chunks
alternating between two streams, or on one),
decode tokens/s of B sequences stepping together at a context of ~1K (the step as a CUDA graph, the graph without the
programmatic launches (M2RNN_NO_PDL=1), and eagerly), and the
decode state a sequence carries against the context (recurrent layers: constant; attention: the KV cache, linear).
Timing: the host clock around synchronized work, after a warm-up: a prefill's best of 3, a decode step's mean over 64.
usage: build/bench_infer DESCRIPTOR [vocab] [-prof B [P] | -graph B [P] | -decode [B ...] | -sample [B ...]]   (vocab 50257
unless given, e.g. 100352)
-decode: only the graph decode lines (batch 1 and 64, or the batches given), for A/B runs of a step's kernels
-sample: a generation loop's step with its sampling (infer.h's loop: each step's tokens drawn from its logits): the
step alone (each waited for, as the host loop does), the executor's generation loop (model_decode_gen_*: greedy,
temperature 1, top-k 50, temperature 1 with a repetition penalty of 1.3; an iteration queued ahead), and the logits
rows copied to the host and sampled there (sample_token: greedy, temperature 1, top-k 50), batches 1, 16 and 64 or
those given
-prof B [P]: only B sequences, a P-token prefill (default 16; 1024 to see the attention layers as -decode has them)
and two eager steps, then one more eager step inside cudaProfilerStart/Stop, for `ncu --profile-from-start off` (each
kernel of one step, no graph)
-graph B [P]: only B sequences, a P-token prefill (default 16), then 32 graph steps (for a timeline: `nsys profile
--cuda-graph-trace=node`; with M2RNN_NO_PDL=1 the kernels do not overlap, so their durations are their own); built
as build/bench_infer_trace (-DM2RNN_TRACE, cuda_common.h), the last 6 steps' per-block records go to M2RNN_TRACE_FILE
(default trace.bin) for dev/bench/decode_trace.py
*/
#include <cuda_profiler_api.h>
#include <vector>
#define TESTING
#include "train_m2rnn.cu"
#include "infer.h" // (sample_token, for -sample)

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 2) { fail_with_hint("e.g. build/bench_infer d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84 100352", "usage: bench_infer DESCRIPTOR [vocab]"); }
    ModelConfig config;
    memset(&config, 0, sizeof(config));
    config.vocab_size = argc > 2 ? atoi(argv[2]) : 50257;
    config.m2rnn.grad_clamp = 1.0f;
    model_config_from_descriptor(&config, argv[1]);
    Model *model = model_create(&config);
    model_init_weights(model, 1);
    const int V = config.vocab_size;
    Rng rng = {5};
    int *tokens = (int *)mallocCheck((size_t)65536 * sizeof(int));
    for (int i = 0; i < 65536; i++) { tokens[i] = (int)(rng_next_u64(&rng) % V); }
    if (argc > 4 && (strcmp(argv[3], "-prof") == 0 || strcmp(argv[3], "-graph") == 0)) {
        // -prof B [P] / -graph B [P]: B sequences prefilled with P tokens (default 16), then the profiled steps
        const int B = atoi(argv[4]), graph = strcmp(argv[3], "-graph") == 0, steps = graph ? 34 : 3;
        const int P = argc > 5 ? atoi(argv[5]) : 16;
        if (B < 1 || B > 1024 || P < 1 || (long)B * P > 65536) { // (the prefill reads B·P of the 65,536 tokens)
            fail_with_hint("e.g. -graph 64 1024 (B from 1 to 1024, B·P at most 65,536)",
                           "bad batch %d or prompt length %d", B, P);
        }
        if (!graph) { setenv("M2RNN_NO_GRAPH", "1", 1); }
        model_decode_begin(model, B, P + 48);
        int *pos = (int *)mallocCheck((size_t)B * sizeof(int)), *tok = (int *)mallocCheck((size_t)B * sizeof(int));
        for (int b = 0; b < B; b++) { pos[b] = 0; }
        model_decode_advance(model, 0, B, tokens, P, pos);
        for (int b = 0; b < B; b++) { pos[b] = P; tok[b] = tokens[(P + b) % 65536]; }
        double t0 = 0.0;
#ifdef M2RNN_TRACE
        const unsigned cap = 1u << 20; // records (128 MB; a batch-1 step of the 410M hybrid writes ≈ 15K)
        TraceRec *trace;
        cudaCheck(cudaMalloc(&trace, (size_t)cap * sizeof(TraceRec)));
        cudaCheck(cudaMemset(trace, 0, (size_t)cap * sizeof(TraceRec)));
        cudaCheck(cudaMemcpyToSymbol(g_trace, &trace, sizeof(trace)));
        cudaCheck(cudaMemcpyToSymbol(g_trace_cap, &cap, sizeof(cap)));
#endif
        for (int s = 0; s < steps; s++) {
            if (s == 2) { executor_sync(model); cudaCheck(cudaProfilerStart()); t0 = wall(); }
#ifdef M2RNN_TRACE
            if (s == steps - 6) { // the last 6 steps traced
                executor_sync(model);
                const int on = 1;
                cudaCheck(cudaMemcpyToSymbol(g_trace_on, &on, sizeof(on)));
            }
#endif
            model_decode_step(model, tok, pos);
            for (int b = 0; b < B; b++) { pos[b]++; }
        }
        executor_sync(model);
#ifdef M2RNN_TRACE
        {
            unsigned n = 0;
            cudaCheck(cudaMemcpyFromSymbol(&n, g_trace_n, sizeof(n)));
            n = n < cap ? n : cap;
            TraceRec *h = (TraceRec *)mallocCheck((size_t)n * sizeof(TraceRec));
            cudaCheck(cudaMemcpy(h, trace, (size_t)n * sizeof(TraceRec), cudaMemcpyDeviceToHost));
            const char *path = getenv("M2RNN_TRACE_FILE");
            FILE *f = fopen(path ? path : "trace.bin", "wb");
            if (f == NULL) {
                fail_with_hint("set M2RNN_TRACE_FILE to a writable path", "cannot write the trace to '%s'",
                               path ? path : "trace.bin");
            }
            fwrite(h, sizeof(TraceRec), n, f);
            fclose(f);
            printf("trace: %u records\n", n);
            free(h);
        }
#endif
        const double dt = (wall() - t0) / (steps - 2);
        cudaCheck(cudaProfilerStop());
        printf("profiled %d %s step(s) of %d sequences: %.3f ms a step\n", steps - 2, graph ? "graph" : "eager", B, dt * 1e3);
        free(pos); free(tok); free(tokens);
        model_free(model);
        return 0;
    }
    const int decode_only = argc > 3 && strcmp(argv[3], "-decode") == 0; // the graph decode lines only
    const int sample_only = argc > 3 && strcmp(argv[3], "-sample") == 0;
    std::vector<int> batches;
    for (int i = 4; (decode_only || sample_only) && i < argc; i++) {
        const int B = atoi(argv[i]);
        if (B < 1 || B > 1024) { fail_with_hint("give batch sizes 1..1024 after -decode", "bad batch size %s", argv[i]); }
        batches.push_back(B);
    }
    if (batches.empty()) { batches = sample_only ? std::vector<int>{1, 16, 64} : std::vector<int>{1, 64}; }
    if (sample_only) { // the step with its sampling, a token's cost in a generation loop
        const int V = config.vocab_size, Vp = model->config.padded_vocab_size, P = 1024, steps = 32;
        InferOptions o = infer_options_default();
        o.top_p = 1.0f;
        o.rep_penalty = 1.0f;
        float *row = (float *)mallocCheck((size_t)Vp * sizeof(float));
        Cand *work = (Cand *)mallocCheck((size_t)Vp * sizeof(Cand));
        unsigned char *mark = (unsigned char *)mallocCheck((size_t)Vp);
        const char *names[8] = {"step alone", "GPU greedy", "GPU temp 1", "GPU top-k 50", "host greedy", "host temp 1",
                                "host top-k 50", "GPU temp 1 rp 1.3"};
        for (int B : batches) {
            int *pos = (int *)mallocCheck((size_t)B * sizeof(int)), *tok = (int *)mallocCheck((size_t)B * sizeof(int));
            double *u = (double *)mallocCheck((size_t)B * sizeof(double));
            const int **seen = (const int **)mallocCheck((size_t)B * sizeof(int *));
            int *n_seen = (int *)mallocCheck((size_t)B * sizeof(int));
            for (int b = 0; b < B; b++) { seen[b] = tokens; n_seen[b] = P; } // (every sequence's prompt)
            for (int mode = 0; mode < 8; mode++) {
                o.temperature = mode == 1 || mode == 4 ? 0.0f : 1.0f;
                o.top_k = mode == 3 || mode == 6 ? 50 : 0;
                o.rep_penalty = mode == 7 ? 1.3f : 1.0f;
                model_decode_begin(model, B, P + steps + 8);
                for (int b = 0; b < B; b++) { pos[b] = 0; }
                model_decode_advance(model, 0, B, tokens, P, pos);
                for (int b = 0; b < B; b++) { pos[b] = P; tok[b] = tokens[P + b]; }
                double t0 = 0.0, t1 = 0.0;
                if ((mode >= 1 && mode <= 3) || mode == 7) { // the executor's generation loop, an iteration ahead (infer.h)
                    for (int b = 0; b < B; b++) { pos[b] = P - 1; }
                    model_decode_gen_begin(model, pos, o.temperature, o.top_k, o.top_p, o.rep_penalty, seen, n_seen);
                    for (int b = 0; b < B; b++) { u[b] = rng_uniform(&rng); }
                    model_decode_gen_launch(model, u, 1);
                    for (int s = 0; s < steps + 2; s++) {
                        for (int b = 0; b < B; b++) { u[b] = rng_uniform(&rng); }
                        model_decode_gen_launch(model, u, 1);
                        model_decode_gen_wait(model, tok);
                        if (s == 1) { t0 = wall(); }
                        if (s == steps + 1) { t1 = wall(); }
                    }
                    executor_sync(model);
                } else {
                    for (int s = 0; s < steps + 2; s++) {
                        if (s == 2) { executor_sync(model); t0 = wall(); }
                        for (int b = 0; b < B; b++) { u[b] = rng_uniform(&rng); }
                        if (mode >= 4) {
                            for (int b = 0; b < B; b++) {
                                model_decode_logits(model, b, row);
                                tok[b] = sample_token(row, V, NULL, 0, &o, u[b], work, mark);
                            }
                        }
                        model_decode_step(model, tok, pos);
                        for (int b = 0; b < B; b++) { pos[b]++; }
                    }
                    executor_sync(model);
                    t1 = wall();
                }
                const double dt = (t1 - t0) / steps;
                printf("generate B=%-3d context ~%d  %-14s  %7.3f ms a token  %9.0f tokens/s\n", B, P, names[mode],
                       dt * 1e3, B / dt);
            }
            free(pos); free(tok); free(u); free(seen); free(n_seen);
        }
        free(row); free(work); free(mark); free(tokens);
        model_free(model);
        return 0;
    }
    const size_t param_bytes = param_table_count(&model->table) * sizeof(floatX);
    printf("%s | %s | %zu parameters (%.2f GB of weights read a step: batch 1 bound %.0f tokens/s at 4.8 TB/s)\n",
           model->rt.prop.name, argv[1], param_table_count(&model->table), param_bytes / 1e9, 4.8e12 / param_bytes);
    // prefill: one prompt of P tokens, its chunks alternating between two streams (the default) or on one
    // (M2RNN_ONE_LANE=1), chunks of 2048 tokens (the default) or fewer (M2RNN_PREFILL_ROWS)
    for (int P : {1024, 8192})
    for (int cfg = 0; cfg < 4 && !decode_only; cfg++) {
        const char *rows = cfg == 3 ? "512" : cfg == 2 ? "1024" : "2048";
        setenv("M2RNN_PREFILL_ROWS", rows, 1);
        if (cfg == 1) { setenv("M2RNN_ONE_LANE", "1", 1); } else { unsetenv("M2RNN_ONE_LANE"); }
        model_decode_begin(model, 1, P + 1);
        int zero = 0;
        model_decode_advance(model, 0, 1, tokens, P, &zero); // warm-up
        double best = 1e30;
        for (int r = 0; r < 3; r++) {
            model_decode_begin(model, 1, P + 1);
            executor_sync(model);
            const double t0 = wall();
            model_decode_advance(model, 0, 1, tokens, P, &zero);
            executor_sync(model);
            best = fmin(best, wall() - t0);
        }
        printf("prefill  B=1  P=%5d  %s, chunks of %4s  %8.1f ms  %9.0f tokens/s\n", P,
               cfg == 1 ? "one lane " : "two lanes", rows, best * 1e3, P / best);
    }
    unsetenv("M2RNN_PREFILL_ROWS");
    unsetenv("M2RNN_ONE_LANE");
    // decode: B sequences at a context of 1024 (prefilled), 64 steps, graph and eager
    for (int B : batches) {
        for (int mode = 0; mode < (decode_only ? 1 : 3); mode++) { // graph, graph without programmatic launches, eager
            const int eager = mode == 2;
            if (eager) { setenv("M2RNN_NO_GRAPH", "1", 1); } else { unsetenv("M2RNN_NO_GRAPH"); }
            if (mode == 1) { setenv("M2RNN_NO_PDL", "1", 1); } else { unsetenv("M2RNN_NO_PDL"); }
            const int P = 1024, steps = 64;
            model_decode_begin(model, B, P + steps + 8);
            int *pos = (int *)mallocCheck((size_t)B * sizeof(int)), *tok = (int *)mallocCheck((size_t)B * sizeof(int));
            for (int b = 0; b < B; b++) { pos[b] = 0; }
            model_decode_advance(model, 0, B, tokens, P, pos); // every sequence the same 1024-token prompt
            for (int b = 0; b < B; b++) { pos[b] = P; tok[b] = tokens[P + b]; }
            for (int w = 0; w < 4; w++) { model_decode_step(model, tok, pos); for (int b = 0; b < B; b++) { pos[b]++; } }
            executor_sync(model);
            const double t0 = wall();
            for (int s = 0; s < steps; s++) {
                model_decode_step(model, tok, pos);
                for (int b = 0; b < B; b++) { pos[b]++; }
            }
            executor_sync(model);
            const double dt = wall() - t0;
            printf("decode   B=%-3d context ~%d  %-12s  %7.3f ms a step  %9.0f tokens/s\n", B, P,
                   mode == 0 ? "graph" : mode == 1 ? "graph no PDL" : "eager", dt / steps * 1e3, (double)B * steps / dt);
            free(pos); free(tok);
        }
    }
    unsetenv("M2RNN_NO_GRAPH");
    unsetenv("M2RNN_NO_PDL");
    // the decode state of one sequence against the context
    for (int ctx : {1024, 4096, 16384, 65536}) {
        if (decode_only) { break; }
        model_decode_begin(model, 1, ctx);
        printf("state    context %6d  %9.2f MB a sequence\n", ctx, model_decode_state_size(model) / 1e6);
    }
    model_free(model);
    return 0;
}
