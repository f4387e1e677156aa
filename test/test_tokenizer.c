/*
test_tokenizer.c: tests of tokenizer.h and of the shard writer in tokenize.c.
- GPT-2: every vector, divergence case and the EOT example of ../shared/data/gpt2_token_vectors.json, and the
  tinyshakespeare golden run (338,028 tokens, first ids, and the sha256 of llm.c's val/train shards written by our
  shard writer's format code). Skipped with a message when ../shared is absent.
- GPT-2 and cl100k against build/tokenizer_vectors.json, ~3000 strings per encoding encoded by the npm tiktoken
  package (test/test_tokenizer_vectors.js writes it; the Makefile runs it before this test), and cl100k on
  tinyshakespeare (count and FNV hash of all ids).
- decode(encode(x)) == x on random byte strings, invalid UTF-8 included; the heap and the rescan merge agree;
  cutting text at the shard writer's cut points does not change the ids; the shard writer's output is identical
  with 1 and 2 threads and equals EOT + encode(doc) for every document.
*/
#define TESTING
#include "tokenize.c"
#include "dataloader.h"
#include <sys/stat.h>
#include <unistd.h>
#include "test/test_common.h"

#define SHARED_VECTORS "../shared/data/gpt2_token_vectors.json"
#define SHARED_SHAKESPEARE "../shared/data/tinyshakespeare.txt"
#define NODE_VECTORS "build/tokenizer_vectors.json"

// ----------------------------------------------------------------------------------------------------------------
// a small JSON reader: enough for the vector files (objects, arrays, strings with escapes, integers)

typedef enum { J_NULL, J_NUM, J_STR, J_ARR, J_OBJ, J_BOOL } JType;
typedef struct Json {
    JType type;
    double num;
    char *str;          // J_STR: bytes (UTF-8), may contain NUL; strlen is str_len
    size_t str_len;
    struct Json *items; // J_ARR / J_OBJ values
    char **keys;        // J_OBJ keys
    size_t n;
} Json;

typedef struct { const char *s; size_t i, n; int err; } JParser;

static void jskip(JParser *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\n' || p->s[p->i] == '\r' || p->s[p->i] == '\t')) {
        p->i++;
    }
}

static void jput_utf8(char *out, size_t *o, uint32_t cp) {
    if (cp < 0x80) { out[(*o)++] = (char)cp; }
    else if (cp < 0x800) { out[(*o)++] = (char)(0xC0 | (cp >> 6)); out[(*o)++] = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        out[(*o)++] = (char)(0xE0 | (cp >> 12));
        out[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*o)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*o)++] = (char)(0xF0 | (cp >> 18));
        out[(*o)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*o)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static uint32_t jhex4(JParser *p) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->i < p->n ? p->s[p->i++] : 0;
        v <<= 4;
        if (c >= '0' && c <= '9') { v |= (uint32_t)(c - '0'); }
        else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') { v |= (uint32_t)((c | 0x20) - 'a' + 10); }
        else { p->err = 1; }
    }
    return v;
}

static char *jstring(JParser *p, size_t *len) {
    p->i++; // opening quote
    size_t start = p->i;
    while (p->i < p->n && p->s[p->i] != '"') { p->i += p->s[p->i] == '\\' ? 2 : 1; }
    size_t cap = p->i - start + 1;
    p->i = start;
    char *out = (char *)mallocCheck(cap + 4);
    size_t o = 0;
    while (p->i < p->n && p->s[p->i] != '"') {
        char c = p->s[p->i++];
        if (c != '\\') { out[o++] = c; continue; }
        char e = p->s[p->i++];
        switch (e) {
            case 'n': out[o++] = '\n'; break;
            case 't': out[o++] = '\t'; break;
            case 'r': out[o++] = '\r'; break;
            case 'b': out[o++] = '\b'; break;
            case 'f': out[o++] = '\f'; break;
            case 'u': {
                uint32_t cp = jhex4(p);
                if (cp >= 0xD800 && cp <= 0xDBFF && p->i + 1 < p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
                    p->i += 2;
                    uint32_t lo = jhex4(p);
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                jput_utf8(out, &o, cp);
                break;
            }
            default: out[o++] = e; break; // \" \\ \/
        }
    }
    p->i++; // closing quote
    out[o] = 0;
    *len = o;
    return out;
}

static Json jparse(JParser *p) {
    Json v;
    memset(&v, 0, sizeof(v));
    jskip(p);
    if (p->i >= p->n) { p->err = 1; return v; }
    char c = p->s[p->i];
    if (c == '{' || c == '[') {
        v.type = c == '{' ? J_OBJ : J_ARR;
        p->i++;
        size_t cap = 8;
        v.items = (Json *)mallocCheck(cap * sizeof(Json));
        v.keys = v.type == J_OBJ ? (char **)mallocCheck(cap * sizeof(char *)) : NULL;
        jskip(p);
        if (p->i < p->n && p->s[p->i] == (c == '{' ? '}' : ']')) { p->i++; return v; }
        for (;;) {
            if (v.n == cap) {
                cap *= 2;
                v.items = (Json *)realloc(v.items, cap * sizeof(Json));
                if (v.keys) { v.keys = (char **)realloc(v.keys, cap * sizeof(char *)); }
            }
            if (v.type == J_OBJ) {
                jskip(p);
                size_t kl;
                v.keys[v.n] = jstring(p, &kl);
                jskip(p);
                p->i++; // ':'
            }
            v.items[v.n++] = jparse(p);
            jskip(p);
            if (p->i >= p->n || p->err) { p->err = 1; return v; }
            char d = p->s[p->i++];
            if (d == ',') { continue; }
            break;
        }
    } else if (c == '"') {
        v.type = J_STR;
        v.str = jstring(p, &v.str_len);
    } else if (c == 't' || c == 'f' || c == 'n') {
        v.type = c == 'n' ? J_NULL : J_BOOL;
        v.num = c == 't';
        while (p->i < p->n && p->s[p->i] >= 'a' && p->s[p->i] <= 'z') { p->i++; }
    } else {
        v.type = J_NUM;
        char *end;
        v.num = strtod(p->s + p->i, &end);
        p->i = (size_t)(end - p->s);
    }
    return v;
}

static const Json *jget(const Json *o, const char *key) {
    if (o == NULL || o->type != J_OBJ) { return NULL; }
    for (size_t k = 0; k < o->n; k++) { if (strcmp(o->keys[k], key) == 0) { return &o->items[k]; } }
    return NULL;
}

static void jfree(Json *v) {
    free(v->str);
    for (size_t k = 0; k < v->n; k++) {
        jfree(&v->items[k]);
        if (v->keys) { free(v->keys[k]); }
    }
    free(v->items);
    free(v->keys);
}

static int jload(const char *path, Json *out) {
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) { return 0; }
    size_t n;
    uint8_t *text = read_all(fp, &n);
    fclose(fp);
    JParser p = {(const char *)text, 0, n, 0};
    *out = jparse(&p);
    free(text);
    return !p.err;
}

// ----------------------------------------------------------------------------------------------------------------
// sha256 (FIPS 180-4), to check our shards against the hashes of llm.c's

typedef struct { uint32_t h[8]; uint8_t buf[64]; size_t fill; uint64_t total; } Sha256;

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

#define ROR32(x, r) (((x) >> (r)) | ((x) << (32 - (r))))

static void sha256_block(Sha256 *s, const uint8_t *b) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++) {
        w[i] = ((uint32_t)b[4 * i] << 24) | ((uint32_t)b[4 * i + 1] << 16) | ((uint32_t)b[4 * i + 2] << 8) | b[4 * i + 3];
    }
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR32(w[i - 15], 7) ^ ROR32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR32(w[i - 2], 17) ^ ROR32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s->h[0], bb = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROR32(e, 6) ^ ROR32(e, 11) ^ ROR32(e, 25)) + ((e & f) ^ (~e & g)) + sha_k[i] + w[i];
        uint32_t t2 = (ROR32(a, 2) ^ ROR32(a, 13) ^ ROR32(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
        h = g; g = f; f = e; e = d + t1; d = c; c = bb; bb = a; a = t1 + t2;
    }
    s->h[0] += a; s->h[1] += bb; s->h[2] += c; s->h[3] += d; s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}

static void sha256_init(Sha256 *s) {
    const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof(iv));
    s->fill = 0;
    s->total = 0;
}

static void sha256_update(Sha256 *s, const void *data, size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    s->total += n;
    while (n > 0) {
        size_t take = 64 - s->fill < n ? 64 - s->fill : n;
        memcpy(s->buf + s->fill, p, take);
        s->fill += take;
        p += take;
        n -= take;
        if (s->fill == 64) { sha256_block(s, s->buf); s->fill = 0; }
    }
}

static void sha256_hex(Sha256 *s, char out[65]) {
    uint64_t bits = s->total * 8;
    uint8_t pad = 0x80, zero = 0;
    sha256_update(s, &pad, 1);
    while (s->fill != 56) { sha256_update(s, &zero, 1); }
    uint8_t len[8];
    for (int i = 0; i < 8; i++) { len[i] = (uint8_t)(bits >> (56 - 8 * i)); }
    sha256_update(s, len, 8);
    for (int i = 0; i < 8; i++) { sprintf(out + 8 * i, "%08x", s->h[i]); }
}

// ----------------------------------------------------------------------------------------------------------------
// helpers

static int ids_equal_json(const TokenBuffer *b, const Json *ids) {
    if (ids == NULL || ids->type != J_ARR || ids->n != b->len) { return 0; }
    for (size_t k = 0; k < b->len; k++) { if ((int)ids->items[k].num != b->ids[k]) { return 0; } }
    return 1;
}

static int roundtrip_ok(const Tokenizer *t, const TokenBuffer *b, const uint8_t *text, size_t n) {
    size_t o = 0;
    for (size_t k = 0; k < b->len; k++) {
        size_t len;
        const uint8_t *p = tokenizer_decode(t, b->ids[k], &len);
        if (p == NULL || o + len > n || memcmp(text + o, p, len) != 0) { return 0; }
        o += len;
    }
    return o == n;
}

static void print_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n && i < 60; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f) { putchar(c); } else { printf("\\x%02x", c); }
    }
}

static void shard_sha256(const int *ids, size_t n, char out[65]) {
    Sha256 s;
    sha256_init(&s);
    int32_t header[256] = {0};
    header[0] = SHARD_MAGIC_U16;
    header[1] = 1;
    header[2] = (int32_t)n;
    sha256_update(&s, header, sizeof(header));
    for (size_t k = 0; k < n; k++) {
        uint16_t v = (uint16_t)ids[k];
        sha256_update(&s, &v, 2);
    }
    sha256_hex(&s, out);
}

static uint64_t fnv_ids(const int *ids, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t k = 0; k < n; k++) { h = (h ^ (uint64_t)(uint32_t)ids[k]) * 0x100000001b3ull; }
    return h;
}

static uint32_t rng_state = 12345;
static uint32_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

// ----------------------------------------------------------------------------------------------------------------
// tests

static void test_shared_vectors(const Tokenizer *gpt2) {
    Json doc;
    if (access(SHARED_VECTORS, R_OK) != 0) {
        test_skip("gpt2_shared_vectors", "../shared/data/gpt2_token_vectors.json not present (no ../shared)");
        return;
    }
    if (!jload(SHARED_VECTORS, &doc)) {
        test_result(0, "gpt2_shared_vectors", "cannot parse %s", SHARED_VECTORS);
        return;
    }
    const Json *vectors = jget(&doc, "vectors");
    size_t pass = 0, total = 0;
    for (size_t k = 0; vectors != NULL && k < vectors->n; k++) {
        const Json *text = jget(&vectors->items[k], "text");
        TokenBuffer b = {0};
        tokenizer_encode(gpt2, &b, (const uint8_t *)text->str, text->str_len);
        int ok = ids_equal_json(&b, jget(&vectors->items[k], "ids")) &&
                 roundtrip_ok(gpt2, &b, (const uint8_t *)text->str, text->str_len);
        if (!ok) { printf("  mismatch on \""); print_escaped(text->str, text->str_len); printf("\"\n"); }
        pass += ok;
        total++;
        tokbuf_free(&b);
    }
    test_result(total > 0 && pass == total, "gpt2_shared_vectors", "%zu of %zu vectors byte-exact", pass, total);
    const Json *cases = jget(jget(&doc, "unicode_whitespace_divergence"), "cases");
    pass = total = 0;
    for (size_t k = 0; cases != NULL && k < cases->n; k++) {
        const Json *text = jget(&cases->items[k], "text");
        TokenBuffer b = {0};
        tokenizer_encode(gpt2, &b, (const uint8_t *)text->str, text->str_len);
        pass += ids_equal_json(&b, jget(&cases->items[k], "ids"));
        total++;
        tokbuf_free(&b);
    }
    test_result(total > 0 && pass == total, "gpt2_unicode_whitespace_divergence",
                "%zu of %zu follow Rust tiktoken (U+0085 is \\s, U+FEFF is not)", pass, total);
    // the rank file our tokenizer file was written from is the one tiktoken pins
    const Json *rf = jget(jget(&doc, "vocab"), "ranks_file");
    const char *pinned = rf != NULL ? strstr(rf->str, "sha256 ") : NULL;
    const char *ranks = "dev/data/node_tools/node_modules/gpt-tokenizer/data/r50k_base.tiktoken";
    if (pinned != NULL && access(ranks, R_OK) == 0) {
        size_t rn;
        uint8_t *rb = read_file(ranks, &rn);
        Sha256 sh;
        sha256_init(&sh);
        sha256_update(&sh, rb, rn);
        char hex[65];
        sha256_hex(&sh, hex);
        free(rb);
        test_result(strcmp(hex, pinned + 7) == 0, "gpt2_rank_file_sha256", "r50k_base.tiktoken %.16s... (%zu bytes)",
                    hex, rn);
    } else {
        test_skip("gpt2_rank_file_sha256", "no rank file or no pinned hash");
    }
    const Json *ex = jget(&doc, "special_token_example");
    const Json *text = jget(ex, "text");
    TokenBuffer b = {0};
    tokenizer_encode_with_eot(gpt2, &b, (const uint8_t *)text->str, text->str_len);
    test_result(ids_equal_json(&b, jget(ex, "ids")), "gpt2_eot_allowed", "\"hello<|endoftext|>\" -> 31373, 50256");
    tokbuf_free(&b);
    jfree(&doc);
}

static void test_shakespeare_golden(const Tokenizer *gpt2) {
    if (access(SHARED_SHAKESPEARE, R_OK) != 0) {
        test_skip("gpt2_tinyshakespeare_golden", "../shared/data/tinyshakespeare.txt not present (no ../shared)");
        return;
    }
    size_t n;
    uint8_t *raw = read_file(SHARED_SHAKESPEARE, &n);
    // llm.c's recipe: EOT first, and after every blank line
    uint8_t *text = (uint8_t *)mallocCheck(2 * n + 64);
    size_t o = 0;
    memcpy(text, TOKENIZER_EOT_TEXT, 13);
    o = 13;
    for (size_t i = 0; i < n; i++) {
        if (i + 1 < n && raw[i] == '\n' && raw[i + 1] == '\n') {
            text[o++] = '\n';
            text[o++] = '\n';
            memcpy(text + o, TOKENIZER_EOT_TEXT, 13);
            o += 13;
            i++;
        } else {
            text[o++] = raw[i];
        }
    }
    TokenBuffer b = {0};
    tokenizer_encode_with_eot(gpt2, &b, text, o);
    const int first16[16] = {50256, 5962, 22307, 25, 198, 8421, 356, 5120, 597, 2252, 11, 3285, 502, 2740, 13, 628};
    int first_ok = b.len >= 16 && memcmp(b.ids, first16, sizeof(first16)) == 0;
    test_result(b.len == 338028 && first_ok, "gpt2_tinyshakespeare_golden", "%zu tokens (expect 338028), first 16 %s",
                b.len, first_ok ? "match" : "differ");
    Json doc;
    if (jload(SHARED_VECTORS, &doc) && b.len > 32768) {
        const Json *g = jget(&doc, "tinyshakespeare_golden");
        const Json *val = jget(g, "val_bin_sha256"), *train = jget(g, "train_bin_sha256");
        char hv[65], ht[65];
        shard_sha256(b.ids, 32768, hv);
        shard_sha256(b.ids + 32768, b.len - 32768, ht);
        int ok = val != NULL && train != NULL && strcmp(hv, val->str) == 0 && strcmp(ht, train->str) == 0;
        test_result(ok, "gpt2_tinyshakespeare_shard_sha256", "val %.12s..., train %.12s... equal llm.c's shards", hv, ht);
        jfree(&doc);
    }
    tokbuf_free(&b);
    free(text);
    free(raw);
}

static void test_node_vectors(const Tokenizer *gpt2, const Tokenizer *cl100k) {
    Json doc;
    if (!jload(NODE_VECTORS, &doc)) {
        test_skip("tiktoken_vectors", "build/tokenizer_vectors.json missing: run `make test` (it writes it with npm "
                                      "tiktoken) or node test/test_tokenizer_vectors.js");
        return;
    }
    const char *keys[2] = {"gpt2", "cl100k"};
    const Tokenizer *toks[2] = {gpt2, cl100k};
    for (int e = 0; e < 2; e++) {
        char name[64];
        const Json *enc = jget(&doc, keys[e]);
        const Json *cases = jget(enc, "cases");
        size_t pass = 0, total = 0, shown = 0;
        for (size_t k = 0; cases != NULL && k < cases->n; k++) {
            const Json *text = jget(&cases->items[k], "text");
            TokenBuffer b = {0};
            tokenizer_encode(toks[e], &b, (const uint8_t *)text->str, text->str_len);
            int ok = ids_equal_json(&b, jget(&cases->items[k], "ids")) &&
                     roundtrip_ok(toks[e], &b, (const uint8_t *)text->str, text->str_len);
            if (!ok && shown++ < 5) { printf("  %s mismatch on \"", keys[e]); print_escaped(text->str, text->str_len); printf("\"\n"); }
            pass += ok;
            total++;
            tokbuf_free(&b);
        }
        snprintf(name, sizeof(name), "%s_vs_npm_tiktoken", keys[e]);
        test_result(total > 0 && pass == total, name, "%zu of %zu strings byte-exact", pass, total);
        const Json *sh = jget(enc, "shakespeare");
        snprintf(name, sizeof(name), "%s_tinyshakespeare_vs_npm_tiktoken", keys[e]);
        if (sh == NULL || access(SHARED_SHAKESPEARE, R_OK) != 0) {
            test_skip(name, "no tinyshakespeare text (../shared absent)");
            continue;
        }
        size_t n;
        uint8_t *raw = read_file(SHARED_SHAKESPEARE, &n);
        uint8_t *text = (uint8_t *)mallocCheck(2 * n + 64);
        size_t o = 13;
        memcpy(text, TOKENIZER_EOT_TEXT, 13);
        for (size_t i = 0; i < n; i++) {
            if (i + 1 < n && raw[i] == '\n' && raw[i + 1] == '\n') {
                memcpy(text + o, "\n\n" TOKENIZER_EOT_TEXT, 15);
                o += 15;
                i++;
            } else {
                text[o++] = raw[i];
            }
        }
        TokenBuffer b = {0};
        tokenizer_encode_with_eot(toks[e], &b, text, o);
        char hex[17];
        snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)fnv_ids(b.ids, b.len));
        const Json *h = jget(sh, "fnv1a64"), *cnt = jget(sh, "tokens");
        int ok = h != NULL && cnt != NULL && strcmp(hex, h->str) == 0 && (size_t)cnt->num == b.len;
        test_result(ok, name, "%zu tokens, id hash %s", b.len, hex);
        tokbuf_free(&b);
        free(text);
        free(raw);
    }
    jfree(&doc);
}

// random byte strings: mostly text-like, with invalid UTF-8, control bytes and long runs mixed in
static int random_allow_eot = 1; // whether the literal <|endoftext|> may appear
static size_t random_bytes(uint8_t *buf, size_t cap) {
    static const char *frags[] = {"the", " cat", "'s", "'S", "123456", " ", "  ", "\n", "\r\n", "\t", "é", "日本",
                                  "\xc2\x85", "\xe3\x80\x80", "\xef\xbb\xbf", "😀", "\xc3", "\xff", "\x80\x80",
                                  "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf", "<|endoftext|>", "!!", "(x",
                                  "\xe2\x80", "aaaaaaaaaaaaaaaa", "\x00"};
    size_t nf = sizeof(frags) / sizeof(frags[0]);
    size_t n = 0, want = 1 + rng_next() % (cap / 8);
    while (n < want) {
        uint32_t r = rng_next();
        if (r % 5 == 0) {
            buf[n++] = (uint8_t)(r >> 8); // a raw random byte
        } else {
            const char *f = frags[(r >> 8) % nf];
            if (!random_allow_eot && f[0] == '<') { continue; }
            size_t l = f[0] == 0 ? 1 : strlen(f);
            if (n + l > cap) { break; }
            memcpy(buf + n, f, l);
            n += l;
        }
    }
    return n;
}

static void test_roundtrip_and_paths(const Tokenizer *gpt2, const Tokenizer *cl100k) {
    const Tokenizer *toks[2] = {gpt2, cl100k};
    uint8_t *buf = (uint8_t *)mallocCheck(4096);
    size_t rt_ok = 0, path_ok = 0, total = 0;
    for (int it = 0; it < 4000; it++) {
        size_t n = random_bytes(buf, 4096);
        for (int e = 0; e < 2; e++) {
            TokenBuffer a = {0}, b = {0};
            tokenizer_heap_threshold = 96;
            tokenizer_encode(toks[e], &a, buf, n);
            tokenizer_heap_threshold = 2; // every merged piece through the heap
            tokenizer_encode(toks[e], &b, buf, n);
            tokenizer_heap_threshold = 96;
            rt_ok += roundtrip_ok(toks[e], &a, buf, n);
            path_ok += a.len == b.len && memcmp(a.ids, b.ids, a.len * sizeof(int)) == 0;
            total++;
            tokbuf_free(&a);
            tokbuf_free(&b);
        }
    }
    test_result(rt_ok == total, "roundtrip_random_bytes", "decode(encode(x)) == x for %zu of %zu strings (invalid "
                "UTF-8 included)", rt_ok, total);
    test_result(path_ok == total, "heap_merge_equals_rescan", "%zu of %zu strings give identical ids", path_ok, total);
    // long pieces that need many merges
    size_t ok = 0, cases = 0;
    for (int e = 0; e < 2; e++) {
        for (int kind = 0; kind < 3; kind++) {
            size_t n = 2000;
            for (size_t i = 0; i < n; i++) {
                buf[i] = kind == 0 ? 'a' : kind == 1 ? (uint8_t)('a' + rng_next() % 26) : (uint8_t)("ab"[i % 2]);
            }
            TokenBuffer a = {0}, b = {0};
            tokenizer_heap_threshold = 1 << 20; // rescan only
            tokenizer_encode(toks[e], &a, buf, n);
            tokenizer_heap_threshold = 2;
            tokenizer_encode(toks[e], &b, buf, n);
            tokenizer_heap_threshold = 96;
            ok += a.len == b.len && memcmp(a.ids, b.ids, a.len * sizeof(int)) == 0 && roundtrip_ok(toks[e], &a, buf, n);
            cases++;
            tokbuf_free(&a);
            tokbuf_free(&b);
        }
    }
    test_result(ok == cases, "long_pieces_heap_equals_rescan", "%zu of %zu 2000-byte letter runs", ok, cases);
    free(buf);
}

// encoding text cut at every shard_cut_ok point must equal encoding it whole
static void test_cut_points(const Tokenizer *gpt2, const Tokenizer *cl100k) {
    const Tokenizer *toks[2] = {gpt2, cl100k};
    uint8_t *buf = (uint8_t *)mallocCheck(8192);
    size_t ok = 0, total = 0, cuts = 0;
    for (int it = 0; it < 1000; it++) {
        size_t n = random_bytes(buf, 8192);
        for (int e = 0; e < 2; e++) {
            TokenBuffer whole = {0}, parts = {0};
            tokenizer_encode(toks[e], &whole, buf, n);
            size_t s = 0;
            for (size_t p = 1; p < n; p++) {
                if (shard_cut_ok(buf, p)) {
                    tokenizer_encode(toks[e], &parts, buf + s, p - s);
                    s = p;
                    cuts++;
                }
            }
            tokenizer_encode(toks[e], &parts, buf + s, n - s);
            ok += whole.len == parts.len && memcmp(whole.ids, parts.ids, whole.len * sizeof(int)) == 0;
            total++;
            tokbuf_free(&whole);
            tokbuf_free(&parts);
        }
    }
    test_result(ok == total, "shard_cut_points_safe", "%zu of %zu strings identical across %zu cuts", ok, total, cuts);
    free(buf);
}

static uint8_t *read_shard_tokens(const char *path, size_t *ntok, int *magic) {
    size_t n;
    uint8_t *b = read_file(path, &n);
    int32_t header[256];
    memcpy(header, b, sizeof(header));
    *ntok = (size_t)header[2];
    *magic = header[0];
    return b;
}

static void test_shard_writer(const Tokenizer *gpt2, const Tokenizer *cl100k) {
    // a corpus of many documents, some large enough to be cut into several chunks
    create_dir_if_not_exists("build");
    const char *input = "build/test_tokenizer_corpus.txt";
    FILE *fp = fopenCheck(input, "wb");
    size_t ndocs = 0;
    uint8_t *buf = (uint8_t *)mallocCheck(8192);
    random_allow_eot = 0; // documents are delimited only where this test puts a separator
    for (int d = 0; d < 40; d++) {
        if (d > 0) { fwriteCheck(TOKENIZER_EOT_TEXT, 1, 13, fp); }
        if (d == 7) { continue; } // an empty document: skipped, no double EOT
        size_t pieces = d % 10 == 0 ? 1500 : 10; // 1500 pieces of ~0.5 KB: several 256 KB chunks
        for (size_t k = 0; k < pieces; k++) {
            size_t n = random_bytes(buf, 8192);
            fwriteCheck(buf, 1, n, fp);
            fwriteCheck("\nNext line\n", 1, 11, fp);
        }
        ndocs++;
    }
    fcloseCheck(fp);
    free(buf);
    random_allow_eot = 1;
    const Tokenizer *toks[2] = {gpt2, cl100k};
    for (int e = 0; e < 2; e++) {
        char p1[256], p2[256], f1[300], f2[300];
        snprintf(p1, sizeof(p1), "build/test_tokenizer_shard_t1_%d", e);
        snprintf(p2, sizeof(p2), "build/test_tokenizer_shard_t2_%d", e);
        fflush(stdout);
        int saved = dup(1);
        FILE *devnull = freopen("/dev/null", "w", stdout); // the writer's progress lines
        (void)devnull;
        cmd_shard(toks[e], input, p1, 1u << 30, 1);
        cmd_shard(toks[e], input, p2, 1u << 30, 2);
        fflush(stdout);
        dup2(saved, 1);
        close(saved);
        snprintf(f1, sizeof(f1), "%s_000000.bin", p1);
        snprintf(f2, sizeof(f2), "%s_000000.bin", p2);
        size_t n1, n2, nin;
        uint8_t *a = read_file(f1, &n1), *b = read_file(f2, &n2);
        int same = n1 == n2 && memcmp(a, b, n1) == 0;
        // reference: EOT + encode(doc) for each non-empty document, encoded whole on one thread
        uint8_t *text = read_file(input, &nin);
        TokenBuffer ref = {0};
        size_t i = 0, docs = 0, longest = 0;
        while (i <= nin) {
            size_t end = tokenizer_find_eot_text(text, nin, i);
            if (end - i > longest) { longest = end - i; }
            if (end > i) {
                tokbuf_push(&ref, toks[e]->eot_token);
                tokenizer_encode(toks[e], &ref, text + i, end - i);
                docs++;
            }
            if (end == nin) { break; }
            i = end + 13;
        }
        size_t ntok;
        int magic;
        uint8_t *sh = read_shard_tokens(f1, &ntok, &magic);
        int width = magic == SHARD_MAGIC_U16 ? 2 : 4;
        int match = ntok == ref.len && n1 == 1024 + ntok * (size_t)width && docs == ndocs;
        for (size_t k = 0; k < ntok && match; k++) {
            uint32_t v = 0;
            memcpy(&v, sh + 1024 + k * (size_t)width, (size_t)width);
            match = v == (uint32_t)ref.ids[k];
        }
        char name[64];
        snprintf(name, sizeof(name), "shard_writer_%s", e == 0 ? "gpt2_uint16" : "cl100k_uint32");
        test_result(same && match && width == (e == 0 ? 2 : 4) && longest > 2 * SHARD_CHUNK_BYTES, name,
                    "%zu docs (longest %zu KB, cut in chunks) -> %zu tokens; 1 and 2 threads identical; equals "
                    "EOT+encode(doc) per doc", docs, longest >> 10, ntok);
        // the loader reads the writer's shard back: sequential batches are the token stream itself
        DataLoader dl;
        size_t B = 4, T = 64;
        dataloader_init(&dl, f1, B, T, 0, 1, 0, 1, e == 0 ? 50304 : 100352);
        int dl_ok = dl.num_tokens == ntok && dataloader_num_batches(&dl) == ((ntok - 1) / T) / B;
        for (size_t k = 0; k < 3 && dl_ok; k++) {
            dataloader_next_batch(&dl);
            for (size_t i = 0; i < B * T && dl_ok; i++) {
                dl_ok = dl.inputs[i] == ref.ids[k * B * T + i] && dl.targets[i] == ref.ids[k * B * T + i + 1];
            }
        }
        dataloader_free(&dl);
        snprintf(name, sizeof(name), "dataloader_reads_%s_shard", e == 0 ? "gpt2" : "cl100k");
        test_result(dl_ok, name, "first 3 batches of B=%zu T=%zu equal the written stream", B, T);
        free(a); free(b); free(sh); free(text);
        tokbuf_free(&ref);
        unlink(f1);
        unlink(f2);
    }
    // small shards: the same stream split over several files
    {
        fflush(stdout);
        int saved = dup(1);
        FILE *devnull = freopen("/dev/null", "w", stdout);
        (void)devnull;
        cmd_shard(gpt2, input, "build/test_tokenizer_small", 100000, 2);
        fflush(stdout);
        dup2(saved, 1);
        close(saved);
        size_t total = 0, files = 0;
        int ok = 1;
        for (;; files++) {
            char f[300];
            snprintf(f, sizeof(f), "build/test_tokenizer_small_%06zu.bin", files);
            if (access(f, R_OK) != 0) { break; }
            size_t ntok;
            int magic;
            uint8_t *sh = read_shard_tokens(f, &ntok, &magic);
            free(sh);
            total += ntok;
            unlink(f);
        }
        ok = files >= 2;
        test_result(ok, "shard_writer_splits_shards", "%zu shards of <= 100000 tokens, %zu tokens", files, total);
    }
    unlink(input);
}

static void test_misc(const Tokenizer *gpt2, const Tokenizer *cl100k) {
    size_t len;
    int ok = tokenizer_decode(gpt2, -1, &len) == NULL && tokenizer_decode(gpt2, 50257, &len) == NULL &&
             strcmp((const char *)tokenizer_decode(gpt2, 50256, &len), "<|endoftext|>") == 0 && len == 13 &&
             tokenizer_eot(gpt2) == 50256 && tokenizer_vocab_size(gpt2) == 50257 &&
             tokenizer_eot(cl100k) == 100257 && tokenizer_vocab_size(cl100k) == 100277 &&
             cl100k->padded_vocab_size == 100352;
    test_result(ok, "decode_eot_vocab", "eot/vocab: gpt2 50256/50257, cl100k 100257/100277 (padded 100352)");
    FILE *mem = tmpfile();
    tokenizer_safe_print(gpt2, 15496, mem); // "Hello"
    tokenizer_safe_print(gpt2, 188, mem);   // the byte 0x00: dropped
    tokenizer_safe_print(gpt2, 99999, mem); // out of range: <99999>
    rewind(mem);
    char got[64] = {0};
    size_t gl = fread(got, 1, sizeof(got) - 1, mem);
    fclose(mem);
    test_result(gl == 12 && memcmp(got, "Hello<99999>", 12) == 0, "safe_print", "'%s'", got);
    Tokenizer missing;
    test_result(tokenizer_try_init(&missing, "build/no_such_tokenizer.bin") == 0, "missing_file_is_reported",
                "tokenizer_try_init returns 0");
}

int main(void) {
    Tokenizer gpt2, cl100k;
    if (!tokenizer_try_init(&gpt2, "dev/data/gpt2_tokenizer.bin") ||
        !tokenizer_try_init(&cl100k, "dev/data/cl100k_tokenizer.bin")) {
        test_result(0, "load_tokenizers", "dev/data/{gpt2,cl100k}_tokenizer.bin missing: run `make tokenizers`");
        return test_summary("test_tokenizer");
    }
    test_result(1, "load_tokenizers", "gpt2 and cl100k tokenizer files");
    test_shared_vectors(&gpt2);
    test_shakespeare_golden(&gpt2);
    test_node_vectors(&gpt2, &cl100k);
    test_roundtrip_and_paths(&gpt2, &cl100k);
    test_cut_points(&gpt2, &cl100k);
    test_shard_writer(&gpt2, &cl100k);
    test_misc(&gpt2, &cl100k);
    tokenizer_free(&gpt2);
    tokenizer_free(&cl100k);
    return test_summary("test_tokenizer");
}
