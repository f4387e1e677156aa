/*
test_dataloader.c: tests of dataloader.h on small synthetic shards written into a scratch folder under build/.
Token i of shard s is s*SHARD_STRIDE + i, so every token read names the exact (shard, position) it came from and
each batch can be checked against where it must come from. Covers sequential batches and targets, epoch wrap and
reset, per-rank interleaving, seeded shuffling (each epoch a fresh permutation without repeats, reproducible,
seed-dependent), exact resume from a saved state at many points (shuffled and sequential), uint32 shards, a shard
past 4 GB (a sparse file, so 64-bit offsets are exercised), and every refusal: each runs in a forked child that must
exit with status 1 after printing an "error:" line and a "---> HINT:" line.
*/
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "utils.h"
#include "dataloader.h"
#include "test/test_common.h"

#define SHARD_STRIDE 10000 // tokens per shard stay below this, so token -> (shard, pos) is unambiguous
#define VOCAB16 65535
#define MAX_BATCHES 4096

static char scratch[256];

static void scratch_path(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", scratch, name); }

// writes an llm.c shard; token i is first + i unless tokens is given
static void write_shard(const char *name, int token_bytes, size_t ntok, uint32_t first, const uint32_t *tokens) {
    char path[512];
    scratch_path(path, sizeof(path), name);
    int32_t header[DATA_SHARD_HEADER_INTS] = {0};
    header[0] = token_bytes == 2 ? DATA_MAGIC_U16 : DATA_MAGIC_U32;
    header[1] = token_bytes == 2 ? DATA_VERSION_U16 : DATA_VERSION_U32;
    header[2] = (int32_t)ntok;
    FILE *fp = fopenCheck(path, "wb");
    fwriteCheck(header, sizeof(int32_t), DATA_SHARD_HEADER_INTS, fp);
    for (size_t i = 0; i < ntok; i++) {
        uint32_t tok = tokens != NULL ? tokens[i] : first + (uint32_t)i;
        if (token_bytes == 2) {
            uint16_t v = (uint16_t)tok;
            fwriteCheck(&v, 2, 1, fp);
        } else {
            fwriteCheck(&tok, 4, 1, fp);
        }
    }
    fcloseCheck(fp);
}

static void glob_of(char *out, size_t n, const char *pattern) { scratch_path(out, n, pattern); }

// FNV-1a over a batch's inputs and targets: a fingerprint for comparing batch sequences
static uint64_t batch_hash(const DataLoader *l) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < l->B * l->T; i++) {
        h = (h ^ (uint64_t)(uint32_t)l->inputs[i]) * 1099511628211ull;
        h = (h ^ (uint64_t)(uint32_t)l->targets[i]) * 1099511628211ull;
    }
    return h;
}

// every row of the batch must be T consecutive tokens of one shard and its targets the same run shifted by one;
// returns 0 on a violation, else writes each row's (shard, row index) to rows_out
static int batch_rows_consistent(const DataLoader *l, size_t *shard_out, size_t *row_out) {
    for (size_t b = 0; b < l->B; b++) {
        const int *in = l->inputs + b * l->T, *tg = l->targets + b * l->T;
        size_t shard = (size_t)in[0] / SHARD_STRIDE, pos = (size_t)in[0] % SHARD_STRIDE;
        if (pos % l->T != 0) { return 0; }
        for (size_t t = 0; t < l->T; t++) {
            if ((size_t)in[t] != shard * SHARD_STRIDE + pos + t) { return 0; }
            if ((size_t)tg[t] != shard * SHARD_STRIDE + pos + t + 1) { return 0; }
        }
        shard_out[b] = shard;
        row_out[b] = pos / l->T;
    }
    return 1;
}

// runs fn in a child; passes when it exits 1 with "error:", "---> HINT:" and `needle` on stderr
static void expect_refusal(const char *name, void (*fn)(void), const char *needle) {
    char errpath[512];
    snprintf(errpath, sizeof(errpath), "%s/stderr_%s.txt", scratch, name);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *e = freopen(errpath, "w", stderr);
        if (e == NULL) { _exit(99); }
        FILE *o = freopen("/dev/null", "w", stdout);
        (void)o;
        fn();
        _exit(0); // reaching here means nothing was refused
    }
    int status = 0;
    waitpid(pid, &status, 0);
    char msg[4096] = {0};
    FILE *fp = fopen(errpath, "r");
    if (fp != NULL) {
        size_t n = fread(msg, 1, sizeof(msg) - 1, fp);
        msg[n] = '\0';
        fclose(fp);
    }
    int exited1 = WIFEXITED(status) && WEXITSTATUS(status) == 1;
    int ok = exited1 && strstr(msg, "error:") != NULL && strstr(msg, "---> HINT:") != NULL && strstr(msg, needle) != NULL;
    char first_line[200] = {0};
    sscanf(msg, "%199[^\n]", first_line);
    test_result(ok, name, "%s", ok ? first_line : (exited1 ? msg : "child did not exit with status 1"));
}

// ----------------------------------------------------------------------------------------------------------------
// fixtures

static size_t seq_ntok[3] = {1000, 1500, 700};

static void make_sequence_shards(void) {
    for (int s = 0; s < 3; s++) {
        char name[64];
        snprintf(name, sizeof(name), "seq_%06d.bin", s);
        write_shard(name, 2, seq_ntok[s], (uint32_t)(s * SHARD_STRIDE), NULL);
    }
}

// ----------------------------------------------------------------------------------------------------------------
// behaviour

static void test_sequential(void) {
    char pattern[512];
    glob_of(pattern, sizeof(pattern), "seq_*.bin");
    size_t B = 2, T = 16;
    DataLoader l;
    dataloader_init(&l, pattern, B, T, 0, 1, 0, 42, VOCAB16);
    size_t expect_batches = 0, expect_tokens = 0;
    for (int s = 0; s < 3; s++) {
        expect_batches += ((seq_ntok[s] - 1) / T) / B;
        expect_tokens += seq_ntok[s];
    }
    test_result(dataloader_num_batches(&l) == expect_batches && l.num_tokens == expect_tokens, "sequential_counts",
                "%zu batches, %zu tokens", dataloader_num_batches(&l), l.num_tokens);
    int ok = 1;
    size_t shard = 0, row = 0, shards[16], rows[16];
    for (size_t k = 0; k < expect_batches && ok; k++) {
        if (row + B > (seq_ntok[shard] - 1) / T) { shard++; row = 0; }
        dataloader_next_batch(&l);
        ok = batch_rows_consistent(&l, shards, rows);
        for (size_t b = 0; b < B && ok; b++) { ok = shards[b] == shard && rows[b] == row + b; }
        row += B;
    }
    test_result(ok, "sequential_order", "every batch is the next B rows in file order, targets shifted by one");
    // the epoch wraps back to the first batch
    dataloader_next_batch(&l);
    ok = batch_rows_consistent(&l, shards, rows) && shards[0] == 0 && rows[0] == 0;
    DataLoaderState st;
    dataloader_get_state(&l, &st);
    test_result(ok && st.epoch == 1, "sequential_epoch_wrap", "epoch %llu starts at shard 0 row 0",
                (unsigned long long)st.epoch);
    // reset returns to the first batch of epoch 0
    dataloader_next_batch(&l);
    dataloader_next_batch(&l);
    dataloader_reset(&l);
    dataloader_next_batch(&l);
    dataloader_get_state(&l, &st);
    ok = batch_rows_consistent(&l, shards, rows) && shards[0] == 0 && rows[0] == 0 && st.epoch == 0;
    test_result(ok, "reset", "first batch of epoch 0 again");
    dataloader_free(&l);
}

// rank k of R with B rows must read exactly rows [k*B, k*B+B) of what one rank with B*R rows reads
static void test_ranks(int shuffle) {
    char pattern[512];
    glob_of(pattern, sizeof(pattern), "seq_*.bin");
    size_t B = 2, T = 8, R = 3;
    DataLoader whole, parts[3];
    dataloader_init(&whole, pattern, B * R, T, 0, 1, shuffle, 7, VOCAB16);
    for (size_t r = 0; r < R; r++) { dataloader_init(&parts[r], pattern, B, T, (int)r, (int)R, shuffle, 7, VOCAB16); }
    int ok = dataloader_num_batches(&whole) == dataloader_num_batches(&parts[0]);
    size_t n = 2 * dataloader_num_batches(&whole) + 3; // past an epoch boundary
    for (size_t k = 0; k < n && ok; k++) {
        dataloader_next_batch(&whole);
        for (size_t r = 0; r < R; r++) {
            dataloader_next_batch(&parts[r]);
            ok = ok && memcmp(parts[r].inputs, whole.inputs + r * B * T, B * T * sizeof(int)) == 0 &&
                 memcmp(parts[r].targets, whole.targets + r * B * T, B * T * sizeof(int)) == 0;
        }
    }
    test_result(ok, shuffle ? "ranks_interleaved_shuffled" : "ranks_interleaved_sequential",
                "%zu ranks x B=%zu tile one B=%zu batch over %zu steps, rows disjoint", R, B, B * R, n);
    dataloader_free(&whole);
    for (size_t r = 0; r < R; r++) { dataloader_free(&parts[r]); }
}

static void run_epoch_rows(DataLoader *l, size_t *ids /* (num_batches*B,) shard*SHARD_STRIDE+row */, int *ok) {
    size_t shards[64], rows[64];
    size_t nb = dataloader_num_batches(l);
    for (size_t k = 0; k < nb; k++) {
        dataloader_next_batch(l);
        if (!batch_rows_consistent(l, shards, rows)) { *ok = 0; return; }
        for (size_t b = 0; b < l->B; b++) {
            if (shards[b] != shards[0]) { *ok = 0; } // one batch = rows of one shard
            ids[k * l->B + b] = shards[b] * SHARD_STRIDE + rows[b];
        }
    }
}

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : (x > y);
}

static void test_shuffle(void) {
    char pattern[512];
    glob_of(pattern, sizeof(pattern), "seq_*.bin");
    size_t B = 3, T = 8;
    DataLoader l;
    dataloader_init(&l, pattern, B, T, 0, 1, 1, 1234, VOCAB16);
    size_t nb = dataloader_num_batches(&l), n = nb * B;
    size_t *e0 = (size_t *)mallocCheck(n * sizeof(size_t)), *e1 = (size_t *)mallocCheck(n * sizeof(size_t));
    size_t *sorted = (size_t *)mallocCheck(n * sizeof(size_t));
    int ok = 1;
    run_epoch_rows(&l, e0, &ok);
    run_epoch_rows(&l, e1, &ok);
    // no row twice within an epoch, every row a real row of its shard
    memcpy(sorted, e0, n * sizeof(size_t));
    qsort(sorted, n, sizeof(size_t), cmp_size);
    int unique = 1;
    for (size_t i = 0; i < n; i++) {
        size_t s = sorted[i] / SHARD_STRIDE, r = sorted[i] % SHARD_STRIDE;
        if (s >= 3 || r >= (seq_ntok[s] - 1) / T || (i > 0 && sorted[i] == sorted[i - 1])) { unique = 0; }
    }
    test_result(ok && unique, "shuffle_epoch_is_permutation", "%zu rows, none repeated, each batch from one shard", n);
    size_t same = 0, in_order = 0;
    for (size_t i = 0; i < n; i++) {
        same += e0[i] == e1[i];
        in_order += i > 0 && e0[i] == e0[i - 1] + 1;
    }
    test_result(same < n / 4 && in_order < n / 4, "shuffle_reshuffles_each_epoch",
                "%zu of %zu positions equal between epochs 0 and 1; %zu sequential neighbours", same, n, in_order);
    dataloader_free(&l);
    // same seed: same sequence; other seed: another one
    DataLoader a, b, c;
    dataloader_init(&a, pattern, B, T, 0, 1, 1, 1234, VOCAB16);
    dataloader_init(&b, pattern, B, T, 0, 1, 1, 1234, VOCAB16);
    dataloader_init(&c, pattern, B, T, 0, 1, 1, 999, VOCAB16);
    int same_ab = 1, diff_ac = 0;
    for (size_t k = 0; k < 2 * nb; k++) {
        dataloader_next_batch(&a);
        dataloader_next_batch(&b);
        dataloader_next_batch(&c);
        same_ab &= batch_hash(&a) == batch_hash(&b);
        diff_ac += batch_hash(&a) != batch_hash(&c);
    }
    test_result(same_ab && diff_ac > (int)nb, "shuffle_seeded", "same seed identical; other seed differs in %d of %zu",
                diff_ac, 2 * nb);
    dataloader_free(&a);
    dataloader_free(&b);
    dataloader_free(&c);
    free(e0);
    free(e1);
    free(sorted);
}

// a state taken after k batches, restored into a fresh loader (initialized with another seed: the state's wins),
// must continue with exactly the uninterrupted run's batches
static void test_resume(int shuffle) {
    char pattern[512];
    glob_of(pattern, sizeof(pattern), "seq_*.bin");
    size_t B = 2, T = 8;
    DataLoader ref;
    dataloader_init(&ref, pattern, B, T, 1, 2, shuffle, 77, VOCAB16);
    size_t nb = dataloader_num_batches(&ref), total = 3 * nb + 5;
    if (total > MAX_BATCHES) { total = MAX_BATCHES; }
    static uint64_t hashes[MAX_BATCHES];
    for (size_t k = 0; k < total; k++) {
        dataloader_next_batch(&ref);
        hashes[k] = batch_hash(&ref);
    }
    dataloader_free(&ref);
    size_t points[] = {0, 1, 2, nb / 2, nb - 1, nb, nb + 1, 2 * nb - 1, 2 * nb, 2 * nb + 3};
    int ok = 1;
    size_t checked = 0;
    for (size_t p = 0; p < sizeof(points) / sizeof(points[0]); p++) {
        size_t k0 = points[p];
        DataLoader first, second;
        dataloader_init(&first, pattern, B, T, 1, 2, shuffle, 77, VOCAB16);
        for (size_t k = 0; k < k0; k++) { dataloader_next_batch(&first); }
        DataLoaderState st;
        dataloader_get_state(&first, &st);
        // round-trip through bytes, as a checkpoint does
        unsigned char bytes[sizeof(DataLoaderState)];
        memcpy(bytes, &st, sizeof(st));
        DataLoaderState back;
        memcpy(&back, bytes, sizeof(back));
        dataloader_free(&first);
        dataloader_init(&second, pattern, B, T, 1, 2, shuffle, 5 /* not 77 */, VOCAB16);
        dataloader_next_batch(&second); // move away from the start so set_state has something to undo
        dataloader_set_state(&second, &back);
        for (size_t k = k0; k < total && k < k0 + nb + 2; k++) {
            dataloader_next_batch(&second);
            ok &= batch_hash(&second) == hashes[k];
            checked++;
        }
        dataloader_free(&second);
    }
    test_result(ok, shuffle ? "resume_exact_shuffled" : "resume_exact_sequential",
                "10 resume points incl. epoch boundaries, %zu batches compared", checked);
}

static void test_uint32(void) {
    // two uint32 shards with ids above 65535 (cl100k-sized vocabulary)
    size_t ntok = 500;
    for (int s = 0; s < 2; s++) {
        char name[64];
        snprintf(name, sizeof(name), "wide_%06d.bin", s);
        write_shard(name, 4, ntok, (uint32_t)(90000 + s * 5000), NULL);
    }
    char pattern[512];
    glob_of(pattern, sizeof(pattern), "wide_*.bin");
    DataLoader l;
    dataloader_init(&l, pattern, 2, 10, 0, 1, 0, 1, 100352);
    int ok = l.token_bytes == 4 && l.num_tokens == 2 * ntok;
    for (size_t k = 0; k < dataloader_num_batches(&l) && ok; k++) {
        dataloader_next_batch(&l);
        for (size_t i = 0; i < 20; i++) { ok &= l.targets[i] == l.inputs[i] + 1 && l.inputs[i] >= 90000; }
    }
    test_result(ok, "uint32_shards", "magic 20240801 v7, ids up to %d read back", l.inputs[19]);
    dataloader_free(&l);
}

// a sparse uint32 shard of 1.1e9 tokens (4.4 GB apparent, a few KB on disk): the last row lies past 4 GB
static void test_huge_offsets(void) {
    char path[512];
    scratch_path(path, sizeof(path), "huge_000000.bin");
    size_t ntok = 1100000000, T = 1 << 16;
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    int32_t header[DATA_SHARD_HEADER_INTS] = {0};
    header[0] = DATA_MAGIC_U32;
    header[1] = DATA_VERSION_U32;
    header[2] = (int32_t)ntok;
    int64_t size = (int64_t)DATA_SHARD_HEADER_BYTES + (int64_t)ntok * 4;
    if (fd < 0 || write(fd, header, sizeof(header)) != (ssize_t)sizeof(header) || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0) { close(fd); }
        unlink(path);
        test_skip("huge_offsets_past_4GB", "cannot create a sparse 4.4 GB file in build/");
        return;
    }
    size_t rows = (ntok - 1) / T, last = rows - 1;
    size_t first_tok = last * T;
    uint32_t *pattern_toks = (uint32_t *)mallocCheck((T + 1) * sizeof(uint32_t));
    for (size_t i = 0; i <= T; i++) { pattern_toks[i] = (uint32_t)(1000 + i); }
    off_t off = (off_t)DATA_SHARD_HEADER_BYTES + (off_t)first_tok * 4;
    ssize_t w = pwrite(fd, pattern_toks, (T + 1) * sizeof(uint32_t), off);
    close(fd);
    if (w != (ssize_t)((T + 1) * sizeof(uint32_t))) {
        unlink(path);
        free(pattern_toks);
        test_skip("huge_offsets_past_4GB", "cannot write into the sparse file");
        return;
    }
    DataLoader l;
    dataloader_init(&l, path, 1, T, 0, 1, 0, 1, 100352);
    DataLoaderState st;
    dataloader_get_state(&l, &st);
    st.batch_in_shard = last; // jump straight to the last batch
    dataloader_set_state(&l, &st);
    dataloader_next_batch(&l);
    int ok = dataloader_num_batches(&l) == rows;
    for (size_t t = 0; t < T && ok; t++) { ok = l.inputs[t] == (int)(1000 + t) && l.targets[t] == (int)(1001 + t); }
    test_result(ok, "huge_offsets_past_4GB", "row %zu at byte offset %lld read correctly", last, (long long)off);
    dataloader_free(&l);
    free(pattern_toks);
    unlink(path);
}

// ----------------------------------------------------------------------------------------------------------------
// refusals (each body runs in a child process)

static char refuse_pattern[512];
static size_t refuse_B = 2, refuse_T = 8;
static int refuse_ranks = 1, refuse_vocab = VOCAB16;

static void open_refuse_pattern(void) {
    DataLoader l;
    dataloader_init(&l, refuse_pattern, refuse_B, refuse_T, 0, refuse_ranks, 1, 1, refuse_vocab);
    size_t nb = dataloader_num_batches(&l);
    for (size_t k = 0; k < nb + 1; k++) { dataloader_next_batch(&l); }
    dataloader_free(&l);
}

static void refuse_case(const char *name, const char *pattern, size_t B, size_t T, int ranks, int vocab,
                        const char *needle) {
    glob_of(refuse_pattern, sizeof(refuse_pattern), pattern);
    refuse_B = B;
    refuse_T = T;
    refuse_ranks = ranks;
    refuse_vocab = vocab;
    expect_refusal(name, open_refuse_pattern, needle);
}

static void write_raw(const char *name, const int32_t *header, size_t payload_bytes) {
    char path[512];
    scratch_path(path, sizeof(path), name);
    FILE *fp = fopenCheck(path, "wb");
    fwriteCheck(header, sizeof(int32_t), DATA_SHARD_HEADER_INTS, fp);
    unsigned char zero[256] = {0};
    while (payload_bytes > 0) {
        size_t n = payload_bytes < sizeof(zero) ? payload_bytes : sizeof(zero);
        fwriteCheck(zero, 1, n, fp);
        payload_bytes -= n;
    }
    fcloseCheck(fp);
}

static DataLoaderState saved_state;
static char state_pattern[512];
static size_t state_B = 2;

static void set_saved_state(void) {
    DataLoader l;
    dataloader_init(&l, state_pattern, state_B, 8, 0, 1, 1, 1, VOCAB16);
    dataloader_set_state(&l, &saved_state);
    dataloader_free(&l);
}

static void test_refusals(void) {
    int32_t h[DATA_SHARD_HEADER_INTS] = {0};
    refuse_case("refuse_no_match", "nothing_here_*.bin", 2, 8, 1, VOCAB16, "no data shards match");

    h[0] = 12345; h[1] = 1; h[2] = 100;
    write_raw("badmagic_000.bin", h, 200);
    refuse_case("refuse_bad_magic", "badmagic_*.bin", 2, 8, 1, VOCAB16, "not a token shard");

    h[0] = DATA_MAGIC_U16; h[1] = 7; h[2] = 100;
    write_raw("badversion_000.bin", h, 200);
    refuse_case("refuse_bad_version", "badversion_*.bin", 2, 8, 1, VOCAB16, "needs version 1");

    h[0] = DATA_MAGIC_U32; h[1] = 1; h[2] = 100;
    write_raw("badversion32_000.bin", h, 400);
    refuse_case("refuse_bad_version_u32", "badversion32_*.bin", 2, 8, 1, VOCAB16, "needs version 7");

    h[0] = DATA_MAGIC_U16; h[1] = 1; h[2] = 1000;
    write_raw("truncated_000.bin", h, 1998);
    refuse_case("refuse_truncated", "truncated_*.bin", 2, 8, 1, VOCAB16, "truncated");

    write_raw("toolong_000.bin", h, 2002);
    refuse_case("refuse_wrong_size", "toolong_*.bin", 2, 8, 1, VOCAB16, "header declares 1000 tokens");

    char path[512];
    scratch_path(path, sizeof(path), "stub_000.bin");
    FILE *fp = fopenCheck(path, "wb");
    fwriteCheck(h, 1, 100, fp);
    fcloseCheck(fp);
    refuse_case("refuse_shorter_than_header", "stub_*.bin", 2, 8, 1, VOCAB16, "shorter than");

    // 1000 tokens: fine for B*T = 16, too small for 4 ranks x 16 x 16 + 1 = 1025
    refuse_case("refuse_shard_too_small", "seq_000000.bin", 16, 16, 4, VOCAB16, "needs 1025 tokens");

    // GPT-2 vocabulary, but a shard holding ids of a larger vocabulary in its first tokens
    refuse_case("refuse_vocab_mismatch_at_init", "seq_*.bin", 2, 8, 1, 5000, "outside the vocabulary");

    // a bad id past the prefix scanned at init is caught when read
    size_t ntok = 48 * 64 * 64 + 1; // > 2 init scans, and every row is used by B=64, T=64
    uint32_t *toks = (uint32_t *)mallocCheck(ntok * sizeof(uint32_t));
    for (size_t i = 0; i < ntok; i++) { toks[i] = (uint32_t)(i % 50000); }
    toks[ntok - 10] = 60000;
    write_shard("latebad_000.bin", 2, ntok, 0, toks);
    free(toks);
    refuse_case("refuse_vocab_mismatch_on_read", "latebad_*.bin", 64, 64, 1, 50257, "token 60000 at position");

    write_shard("mixed_000.bin", 2, 300, 0, NULL);
    write_shard("mixed_001.bin", 4, 300, 0, NULL);
    refuse_case("refuse_mixed_token_widths", "mixed_*.bin", 2, 8, 1, VOCAB16, "-byte tokens");

    // states that do not fit this loader
    glob_of(state_pattern, sizeof(state_pattern), "seq_*.bin");
    DataLoader l;
    dataloader_init(&l, state_pattern, 2, 8, 0, 1, 1, 1, VOCAB16);
    dataloader_next_batch(&l);
    dataloader_get_state(&l, &saved_state);
    dataloader_free(&l);
    state_B = 4;
    expect_refusal("refuse_state_other_batch_size", set_saved_state, "B=2");
    state_B = 2;
    glob_of(state_pattern, sizeof(state_pattern), "seq_00000[01].bin");
    expect_refusal("refuse_state_other_shards", set_saved_state, "shards");
    glob_of(state_pattern, sizeof(state_pattern), "seq_*.bin");
    saved_state.magic = 0;
    expect_refusal("refuse_state_corrupt", set_saved_state, "bad magic");
}

// ----------------------------------------------------------------------------------------------------------------

static void remove_scratch(void) {
    DIR *d = opendir(scratch);
    if (d == NULL) { return; }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') { continue; }
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", scratch, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(scratch);
}

int main(void) {
    create_dir_if_not_exists("build");
    snprintf(scratch, sizeof(scratch), "build/test_dataloader_scratch_%d", (int)getpid());
    create_dir_if_not_exists(scratch);
    make_sequence_shards();
    test_sequential();
    test_ranks(0);
    test_ranks(1);
    test_shuffle();
    test_resume(1);
    test_resume(0);
    test_uint32();
    test_huge_offsets();
    test_refusals();
    remove_scratch();
    return test_summary("test_dataloader");
}
