/*
fuzz_tokenizer.c: libFuzzer harness for tokenizer.h (make fuzz; clang -fsanitize=fuzzer,address,undefined).
For every input of arbitrary bytes (invalid UTF-8 included) and both encodings it checks:
  1. decode(encode(x)) == x, and every id is a valid BPE token;
  2. the heap merge gives the same ids as the rescan merge;
  3. encoding x cut at the shard writer's cut points gives the same ids as encoding it whole;
  4. encode_with_eot(x) decodes back to x (EOT decodes to the literal "<|endoftext|>").
Any violation aborts, and libFuzzer saves the input as a crash file.
*/
#define TESTING
#include "tokenize.c"

static Tokenizer fuzz_toks[2];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    tokenizer_init(&fuzz_toks[0], "dev/data/gpt2_tokenizer.bin");
    tokenizer_init(&fuzz_toks[1], "dev/data/cl100k_tokenizer.bin");
    return 0;
}

static void check_roundtrip(const Tokenizer *t, const TokenBuffer *b, const uint8_t *x, size_t n, int allow_special) {
    size_t o = 0;
    for (size_t k = 0; k < b->len; k++) {
        int id = b->ids[k];
        if (!allow_special && (id < 0 || id >= t->num_ordinary)) { abort(); }
        size_t len;
        const uint8_t *p = tokenizer_decode(t, id, &len);
        if (p == NULL || len == 0 || o + len > n || memcmp(x + o, p, len) != 0) { abort(); }
        o += len;
    }
    if (o != n) { abort(); }
}

int LLVMFuzzerTestOneInput(const uint8_t *x, size_t n) {
    for (int e = 0; e < 2; e++) {
        const Tokenizer *t = &fuzz_toks[e];
        TokenBuffer a = {0}, h = {0}, c = {0}, s = {0};
        tokenizer_heap_threshold = 96;
        tokenizer_encode(t, &a, x, n);
        check_roundtrip(t, &a, x, n, 0);
        tokenizer_heap_threshold = 2;
        tokenizer_encode(t, &h, x, n);
        tokenizer_heap_threshold = 96;
        if (h.len != a.len || memcmp(h.ids, a.ids, a.len * sizeof(int)) != 0) { abort(); }
        size_t start = 0;
        for (size_t p = 1; p < n; p++) {
            if (shard_cut_ok(x, p)) { tokenizer_encode(t, &c, x + start, p - start); start = p; }
        }
        tokenizer_encode(t, &c, x + start, n - start);
        if (c.len != a.len || memcmp(c.ids, a.ids, a.len * sizeof(int)) != 0) { abort(); }
        tokenizer_encode_with_eot(t, &s, x, n);
        check_roundtrip(t, &s, x, n, 1);
        tokbuf_free(&a); tokbuf_free(&h); tokbuf_free(&c); tokbuf_free(&s);
    }
    return 0;
}
