/*
bench_tokenizer.c: encode throughput of tokenizer.h on one text file, in MB/s of input text.
- single thread: tokenizer_encode over the whole text, best of 3 runs (file already in memory, no output)
- shard writer: the same chunked parallel encode `./tokenize shard` uses, for 1..N threads, to show scaling
Prints one line per measurement: "c <encoding> <mode> <threads> <MB/s> <tokens>" for bench_tokenizer.sh.
usage: build/bench_tokenizer TEXT [max_threads]
*/
#define TESTING
#include "tokenize.c"

static double encode_once(const Tokenizer *t, const uint8_t *text, size_t n, size_t *ntok) {
    TokenBuffer b = {0};
    tokbuf_reserve(&b, n / 2 + 16); // allocation outside the timed region is not what we measure
    double t0 = wall_seconds();
    tokenizer_encode(t, &b, text, n);
    double dt = wall_seconds() - t0;
    *ntok = b.len;
    tokbuf_free(&b);
    return dt;
}

// the shard writer's parallel encode, without the file writes
static double encode_parallel(const Tokenizer *t, const uint8_t *text, size_t n, int threads, size_t *ntok) {
    size_t cap = n / SHARD_CHUNK_BYTES + 16, nchunks = 0;
    ShardChunk *chunks = (ShardChunk *)mallocCheck(cap * sizeof(ShardChunk));
    double t0 = wall_seconds();
    size_t s = 0;
    while (s < n) {
        size_t e = s + SHARD_CHUNK_BYTES;
        if (e >= n) { e = n; } else { while (e < n && !shard_cut_ok(text, e)) { e++; } }
        if (nchunks == cap) { fail_with_hint("", "chunk overflow"); }
        chunks[nchunks++] = (ShardChunk){s, e, s == 0};
        s = e;
    }
    TokenBuffer *bufs = (TokenBuffer *)callocCheck(nchunks, sizeof(TokenBuffer));
    omp_set_num_threads(threads);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t k = 0; k < nchunks; k++) { tokenizer_encode(t, &bufs[k], text + chunks[k].start, chunks[k].end - chunks[k].start); }
    double dt = wall_seconds() - t0;
    *ntok = 0;
    for (size_t k = 0; k < nchunks; k++) { *ntok += bufs[k].len; tokbuf_free(&bufs[k]); }
    free(bufs);
    free(chunks);
    return dt;
}

int main(int argc, char **argv) {
    if (argc < 2) { fail_with_hint("build/bench_tokenizer TEXT [max_threads]", "no text file given"); }
    int max_threads = argc > 2 ? (int)parse_int_arg("max_threads", argv[2], 1, 1024) : omp_get_num_procs();
    size_t n;
    uint8_t *text = read_file(argv[1], &n);
    const char *files[2] = {"dev/data/gpt2_tokenizer.bin", "dev/data/cl100k_tokenizer.bin"};
    for (int e = 0; e < 2; e++) {
        Tokenizer t;
        tokenizer_init(&t, files[e]);
        size_t ntok = 0;
        double best = 1e30;
        for (int r = 0; r < 3; r++) { double dt = encode_once(&t, text, n, &ntok); if (dt < best) { best = dt; } }
        printf("c %s single 1 %.2f %zu\n", encoding_name(t.encoding), n / 1e6 / best, ntok);
        for (int th = 1; th <= max_threads; th *= 2) {
            best = 1e30;
            for (int r = 0; r < 3; r++) { double dt = encode_parallel(&t, text, n, th, &ntok); if (dt < best) { best = dt; } }
            printf("c %s parallel %d %.2f %zu\n", encoding_name(t.encoding), th, n / 1e6 / best, ntok);
        }
        tokenizer_free(&t);
    }
    free(text);
    return 0;
}
