/*
dataloader.h: reads llm.c token shards into (B, T) batches of inputs and next-token targets.

Shards (llm.c format, little-endian): a header of 256 int32, [0] = magic, [1] = version, [2] = ntok, then ntok tokens:
  magic 20240520 version 1: uint16 tokens (GPT-2 and other vocabularies <= 65535)
  magic 20240801 version 7: uint32 tokens (cl100k and anything larger)
Every shard is validated when the loader opens: magic, version, token width, the exact file size (a truncated copy is
refused, not read as zeros), a shard too small for one batch, and tokens >= vocab_size (checked on a prefix at init
and on every token read, so a shard written with a different tokenizer is refused by name, not trained on).

Sampling. A shard of ntok tokens holds rows = (ntok-1)/T rows; row r is tokens [r*T, r*T+T] (T+1 tokens, the last one
is only a target). One step consumes B*num_ranks rows of one shard: rank k takes rows [k*B, k*B+B) of that group, so
data-parallel ranks always see different rows of the same global batch. Leftover rows of a shard (fewer than
B*num_ranks) are skipped for that epoch.
- shuffle = 0 (validation): shards in glob order, rows in file order. Rank k's rows are then one contiguous run of
  B*T+1 tokens, exactly llm.c's layout.
- shuffle = 1 (training): every epoch draws a new shard order and, per shard, a new row order. Both are pure
  functions of (seed, epoch, shard), so the loader's whole position is four integers: that is what DataLoaderState
  stores, and why a resumed run replays the uninterrupted batch sequence bit for bit without saving permutations.
  Every rank computes the same permutations (same seed), which keeps the ranks' rows disjoint.

All file offsets are 64-bit (utils.h sets _FILE_OFFSET_BITS and fseekCheck takes int64_t): shards past 2 GB work.
*/
#ifndef M2RNN_DATALOADER_H
#define M2RNN_DATALOADER_H

#include <glob.h>
#include <stddef.h>
#include <stdint.h>
#include "utils.h"

#define DATA_SHARD_HEADER_INTS 256
#define DATA_SHARD_HEADER_BYTES (DATA_SHARD_HEADER_INTS * sizeof(int32_t))
#define DATA_MAGIC_U16 20240520
#define DATA_VERSION_U16 1
#define DATA_MAGIC_U32 20240801
#define DATA_VERSION_U32 7
#define DATALOADER_STATE_MAGIC 0x4c44324du // "M2DL"
#define DATALOADER_STATE_VERSION 1u
// tokens checked against vocab_size per shard when the loader opens (the rest is checked as it is read)
#define DATALOADER_INIT_SCAN_TOKENS 65536

// ----------------------------------------------------------------------------------------------------------------
// state saved in checkpoints: fixed size, no pointers, identical on every rank

typedef struct {
    uint32_t magic;                // DATALOADER_STATE_MAGIC
    uint32_t version;              // DATALOADER_STATE_VERSION
    uint64_t seed;                 // permutation seed (adopted on resume)
    uint64_t epoch;                // epochs completed so far
    uint64_t shard_pos;            // position of the next batch's shard in this epoch's shard order
    uint64_t batch_in_shard;       // index of the next batch within that shard
    // the rest identifies the configuration, so a state is refused where it would mean different batches
    uint64_t B, T, num_ranks;
    uint64_t num_shards, num_tokens;
    uint64_t shards_fingerprint;   // hash of every shard's token count and width, in glob order
    int32_t shuffle;
    int32_t token_bytes;
    uint64_t reserved[4];          // zero; room to grow without changing the size
} DataLoaderState;
#ifdef __cplusplus
static_assert(sizeof(DataLoaderState) == 128, "DataLoaderState is copied verbatim into checkpoints");
#else
_Static_assert(sizeof(DataLoaderState) == 128, "DataLoaderState is copied verbatim into checkpoints");
#endif

typedef struct {
    // public
    size_t B, T;              // batch rows, tokens per row
    int *inputs;              // (B, T) token ids of the current batch
    int *targets;             // (B, T) the next tokens
    size_t num_tokens;        // total tokens over all shards matched by the glob
    // configuration
    int rank, num_ranks, vocab_size;
    size_t num_shards;
    char **shard_paths;       // (num_shards,) glob order (sorted)
    size_t *shard_ntok;       // (num_shards,) tokens in each shard
    size_t *shard_batches;    // (num_shards,) batches each shard gives per epoch
    size_t batches_per_epoch;
    int token_bytes;          // 2 or 4, the same for every shard
    DataLoaderState state;    // position of the next batch
    // permutations for the current (epoch, shard)
    size_t *shard_order;      // (num_shards,) for perm_epoch
    uint64_t perm_epoch;      // epoch shard_order belongs to, UINT64_MAX = none yet
    size_t *row_order;        // (rows of the largest shard,) for (row_epoch, row_shard)
    uint64_t row_epoch;
    size_t row_shard;         // shard id (glob index) row_order belongs to, SIZE_MAX = none yet
    // file access
    FILE *fp;                 // the open shard
    size_t fp_shard;          // its glob index, SIZE_MAX = none
    uint8_t *read_buf;        // (B*T+1) * token_bytes raw tokens
    int *scan;                // the vocabulary check's buffer at init (held here so a refusal leaves nothing behind)
} DataLoader;

// ----------------------------------------------------------------------------------------------------------------
// small helpers

// splitmix64: a full-period mixer; permutations hash (seed, epoch, shard, purpose) through it
static inline uint64_t dataloader_mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Fisher-Yates shuffle of order[0..n) = 0..n-1 driven by a counter-mode splitmix64 stream
static inline void dataloader_permutation(size_t *order, size_t n, uint64_t key) {
    for (size_t i = 0; i < n; i++) { order[i] = i; }
    uint64_t ctr = dataloader_mix64(key);
    for (size_t i = n; i > 1; i--) {
        ctr += 0x9E3779B97F4A7C15ull;
        uint64_t r = dataloader_mix64(ctr);
        // modulo bias is at most i / 2^64: immaterial here
        size_t j = (size_t)(r % (uint64_t)i);
        size_t tmp = order[i - 1];
        order[i - 1] = order[j];
        order[j] = tmp;
    }
}

static inline uint64_t dataloader_key(uint64_t seed, uint64_t epoch, uint64_t shard, uint64_t purpose) {
    uint64_t h = dataloader_mix64(seed ^ 0x6D32726E6E5F646Cull);
    h = dataloader_mix64(h ^ epoch);
    h = dataloader_mix64(h ^ (shard * 0x100000001B3ull + purpose));
    return h;
}

// reads and checks one shard's header and size; returns ntok and sets *token_bytes
static inline size_t dataloader_check_shard(const char *path, int *token_bytes) {
    FILE *fp = fopenCheck(path, "rb");
    int64_t size = file_size_of(fp);
    if (size < (int64_t)DATA_SHARD_HEADER_BYTES) {
        fcloseCheck(fp);
        fail_with_hint("re-create the shard (make data); a partial copy or an interrupted write leaves such files",
                       "shard '%s' is %lld bytes, shorter than the %zu-byte header", path, (long long)size,
                       (size_t)DATA_SHARD_HEADER_BYTES);
    }
    int32_t header[DATA_SHARD_HEADER_INTS];
    freadCheck(header, sizeof(int32_t), DATA_SHARD_HEADER_INTS, fp);
    fcloseCheck(fp);
    if (header[0] == DATA_MAGIC_U16) {
        if (header[1] != DATA_VERSION_U16) {
            fail_with_hint("write uint16 shards with version 1 (./tokenize shard and make data do)",
                           "shard '%s': magic %d (uint16 tokens) needs version %d, found %d", path, header[0],
                           DATA_VERSION_U16, header[1]);
        }
        *token_bytes = 2;
    } else if (header[0] == DATA_MAGIC_U32) {
        if (header[1] != DATA_VERSION_U32) {
            fail_with_hint("write uint32 shards with version 7 (./tokenize shard and make data do)",
                           "shard '%s': magic %d (uint32 tokens) needs version %d, found %d", path, header[0],
                           DATA_VERSION_U32, header[1]);
        }
        *token_bytes = 4;
    } else {
        fail_with_hint("the glob must match only llm.c token shards (magic 20240520 or 20240801); check -i / -j",
                       "'%s' is not a token shard: magic %d", path, header[0]);
    }
    // header[2] is an int32 in llm.c's writers, so a negative value is corruption, not a huge shard
    if (header[2] <= 0) {
        fail_with_hint("re-create the shard (make data)", "shard '%s' declares %d tokens", path, header[2]);
    }
    size_t ntok = (size_t)(uint32_t)header[2];
    int64_t expected = (int64_t)DATA_SHARD_HEADER_BYTES + (int64_t)ntok * (int64_t)(*token_bytes);
    if (size != expected) {
        fail_with_hint("the shard is truncated or was overwritten; re-create it (make data)",
                       "shard '%s' is %lld bytes but its header declares %zu tokens of %d bytes = %lld bytes",
                       path, (long long)size, ntok, *token_bytes, (long long)expected);
    }
    return ntok;
}

// converts raw tokens to ints, refusing any id outside the vocabulary; pos is the shard token index of raw[0]
static inline void dataloader_decode_tokens(int *out, const uint8_t *raw, size_t n, int token_bytes, int vocab_size,
                                     const char *path, size_t pos) {
    for (size_t i = 0; i < n; i++) {
        uint32_t tok;
        if (token_bytes == 2) {
            uint16_t v;
            memcpy(&v, raw + 2 * i, 2);
            tok = v;
        } else {
            memcpy(&tok, raw + 4 * i, 4);
        }
        if (tok >= (uint32_t)vocab_size) {
            fail_with_hint("the shard was written with a different tokenizer than the model's vocabulary: re-create "
                           "the shards with the matching --encoding, or fix the model's vocab size",
                           "shard '%s': token %u at position %zu is outside the vocabulary (vocab_size %d)", path,
                           tok, pos + i, vocab_size);
        }
        out[i] = (int)tok;
    }
}

static inline void dataloader_open_shard(DataLoader *loader, size_t shard) {
    if (loader->fp_shard == shard) { return; }
    if (loader->fp != NULL) { fcloseCheck(loader->fp); }
    loader->fp = fopenCheck(loader->shard_paths[shard], "rb");
    loader->fp_shard = shard;
}

// reads n tokens starting at shard token index pos into out[0..n)
static inline void dataloader_read_tokens(DataLoader *loader, int *out, size_t shard, size_t pos, size_t n) {
    dataloader_open_shard(loader, shard);
    int64_t offset = (int64_t)DATA_SHARD_HEADER_BYTES + (int64_t)pos * (int64_t)loader->token_bytes;
    fseekCheck(loader->fp, offset, SEEK_SET);
    freadCheck(loader->read_buf, (size_t)loader->token_bytes, n, loader->fp);
    dataloader_decode_tokens(out, loader->read_buf, n, loader->token_bytes, loader->vocab_size,
                             loader->shard_paths[shard], pos);
}

// the glob index of the shard at position pos of the current epoch's order
static inline size_t dataloader_shard_at(DataLoader *loader, uint64_t epoch, size_t pos) {
    if (!loader->state.shuffle) { return pos; }
    if (loader->perm_epoch != epoch) {
        dataloader_permutation(loader->shard_order, loader->num_shards,
                               dataloader_key(loader->state.seed, epoch, UINT64_MAX, 1));
        loader->perm_epoch = epoch;
    }
    return loader->shard_order[pos];
}

// ----------------------------------------------------------------------------------------------------------------
// public API

void dataloader_init(DataLoader *loader, const char *pattern, size_t B, size_t T, int rank, int num_ranks,
                     int shuffle, uint64_t seed, int vocab_size) {
    memset(loader, 0, sizeof(*loader));
    if (B == 0 || T == 0) { fail_with_hint("pass -b >= 1 and -t >= 1", "batch size B=%zu and T=%zu must be >= 1", B, T); }
    if (num_ranks < 1 || rank < 0 || rank >= num_ranks) {
        fail_with_hint("rank must be in [0, num_ranks)", "dataloader: rank %d of %d ranks", rank, num_ranks);
    }
    if (vocab_size < 1) { fail_with_hint("pass the model's vocabulary size", "dataloader: vocab_size %d", vocab_size); }
    loader->B = B;
    loader->T = T;
    loader->rank = rank;
    loader->num_ranks = num_ranks;
    loader->vocab_size = vocab_size;

    glob_t g;
    memset(&g, 0, sizeof(g));
    int grc = glob(pattern, 0, NULL, &g);
    if (grc != 0 || g.gl_pathc == 0) {
        globfree(&g);
        fail_with_hint("prepare the data first (make data), or fix the -i / -j glob (quote it so the shell leaves "
                       "it alone)",
                       "no data shards match '%s'", pattern);
    }
    loader->num_shards = g.gl_pathc;
    loader->shard_paths = (char **)callocCheck(loader->num_shards, sizeof(char *));
    loader->shard_ntok = (size_t *)mallocCheck(loader->num_shards * sizeof(size_t));
    loader->shard_batches = (size_t *)mallocCheck(loader->num_shards * sizeof(size_t));
    loader->shard_order = (size_t *)mallocCheck(loader->num_shards * sizeof(size_t));
    for (size_t s = 0; s < loader->num_shards; s++) { // every allocation hangs off the loader from here on
        loader->shard_paths[s] = strdup(g.gl_pathv[s]);
        if (loader->shard_paths[s] == NULL) { globfree(&g); fail_with_hint("", "out of memory copying shard paths"); }
    }
    globfree(&g);

    size_t rows_per_batch = B * (size_t)num_ranks;
    size_t need = B * T * (size_t)num_ranks + 1;
    size_t max_rows = 0;
    uint64_t fingerprint = 1469598103934665603ull; // FNV-1a offset basis
    for (size_t s = 0; s < loader->num_shards; s++) {
        int width = 0;
        size_t ntok = dataloader_check_shard(loader->shard_paths[s], &width);
        if (s == 0) {
            loader->token_bytes = width;
        } else if (width != loader->token_bytes) {
            fail_with_hint("match shards of one tokenizer only (one glob per corpus and encoding)",
                           "shard '%s' has %d-byte tokens but '%s' has %d-byte tokens", loader->shard_paths[s], width,
                           loader->shard_paths[0], loader->token_bytes);
        }
        if (ntok < need) {
            char hint[512];
            snprintf(hint, sizeof(hint),
                     "lower the batch size -b or sequence length -t so that B*T*ranks+1 <= %zu, or write larger "
                     "shards (fewer, bigger shards; more text in the validation split)", ntok);
            fail_with_hint(hint, "shard '%s' has %zu tokens, too few for one batch of B=%zu x T=%zu x %d ranks (needs "
                           "%zu tokens)", loader->shard_paths[s], ntok, B, T, num_ranks, need);
        }
        loader->shard_ntok[s] = ntok;
        size_t rows = (ntok - 1) / T;
        loader->shard_batches[s] = rows / rows_per_batch;
        loader->batches_per_epoch += loader->shard_batches[s];
        loader->num_tokens += ntok;
        if (rows > max_rows) { max_rows = rows; }
        fingerprint = (fingerprint ^ (uint64_t)ntok) * 1099511628211ull;
        fingerprint = (fingerprint ^ (uint64_t)width) * 1099511628211ull;
    }

    // catch a shard of another tokenizer at startup, not hours into training
    size_t scan_max = DATALOADER_INIT_SCAN_TOKENS;
    size_t buf_tokens = B * T + 1 > scan_max ? B * T + 1 : scan_max;
    loader->read_buf = (uint8_t *)mallocCheck(buf_tokens * (size_t)loader->token_bytes);
    loader->scan = (int *)mallocCheck(scan_max * sizeof(int));
    loader->fp_shard = SIZE_MAX;
    for (size_t s = 0; s < loader->num_shards; s++) {
        size_t n = loader->shard_ntok[s] < scan_max ? loader->shard_ntok[s] : scan_max;
        dataloader_read_tokens(loader, loader->scan, s, 0, n);
    }
    free(loader->scan);
    loader->scan = NULL;

    loader->inputs = (int *)mallocCheck(B * T * sizeof(int));
    loader->targets = (int *)mallocCheck(B * T * sizeof(int));
    loader->row_order = shuffle ? (size_t *)mallocCheck((max_rows > 0 ? max_rows : 1) * sizeof(size_t)) : NULL;
    loader->perm_epoch = UINT64_MAX;
    loader->row_shard = SIZE_MAX;

    DataLoaderState *st = &loader->state;
    st->magic = DATALOADER_STATE_MAGIC;
    st->version = DATALOADER_STATE_VERSION;
    st->seed = seed;
    st->B = B;
    st->T = T;
    st->num_ranks = (uint64_t)num_ranks;
    st->num_shards = loader->num_shards;
    st->num_tokens = loader->num_tokens;
    st->shards_fingerprint = fingerprint;
    st->shuffle = shuffle ? 1 : 0;
    st->token_bytes = loader->token_bytes;
    // epoch, shard_pos, batch_in_shard start at 0 (memset)
}

// batches per epoch for this rank (every rank gets the same number)
size_t dataloader_num_batches(const DataLoader *loader) { return loader->batches_per_epoch; }

void dataloader_reset(DataLoader *loader) {
    loader->state.epoch = 0;
    loader->state.shard_pos = 0;
    loader->state.batch_in_shard = 0;
}

void dataloader_next_batch(DataLoader *loader) {
    DataLoaderState *st = &loader->state;
    size_t B = loader->B, T = loader->T;
    // step past exhausted shards; every shard gives >= 1 batch (checked at init), so this ends
    size_t shard = dataloader_shard_at(loader, st->epoch, (size_t)st->shard_pos);
    while (st->batch_in_shard >= loader->shard_batches[shard]) {
        st->batch_in_shard = 0;
        st->shard_pos++;
        if (st->shard_pos == loader->num_shards) {
            st->shard_pos = 0;
            st->epoch++;
        }
        shard = dataloader_shard_at(loader, st->epoch, (size_t)st->shard_pos);
    }
    size_t first_row = (size_t)st->batch_in_shard * B * (size_t)loader->num_ranks + (size_t)loader->rank * B;
    if (!st->shuffle) {
        // this rank's rows are contiguous: one read of B*T+1 tokens, inputs and targets offset by one
        size_t n = B * T + 1;
        dataloader_open_shard(loader, shard);
        int64_t offset = (int64_t)DATA_SHARD_HEADER_BYTES + (int64_t)(first_row * T) * loader->token_bytes;
        fseekCheck(loader->fp, offset, SEEK_SET);
        freadCheck(loader->read_buf, (size_t)loader->token_bytes, n, loader->fp);
        dataloader_decode_tokens(loader->inputs, loader->read_buf, B * T, loader->token_bytes, loader->vocab_size,
                                 loader->shard_paths[shard], first_row * T);
        dataloader_decode_tokens(loader->targets, loader->read_buf + loader->token_bytes, B * T,
                                 loader->token_bytes, loader->vocab_size, loader->shard_paths[shard],
                                 first_row * T + 1);
    } else {
        if (loader->row_epoch != st->epoch || loader->row_shard != shard) {
            size_t rows = (loader->shard_ntok[shard] - 1) / T;
            dataloader_permutation(loader->row_order, rows, dataloader_key(st->seed, st->epoch, shard, 2));
            loader->row_epoch = st->epoch;
            loader->row_shard = shard;
        }
        for (size_t b = 0; b < B; b++) {
            size_t row = loader->row_order[first_row + b];
            int *in = loader->inputs + b * T;
            dataloader_open_shard(loader, shard);
            int64_t offset = (int64_t)DATA_SHARD_HEADER_BYTES + (int64_t)(row * T) * loader->token_bytes;
            fseekCheck(loader->fp, offset, SEEK_SET);
            freadCheck(loader->read_buf, (size_t)loader->token_bytes, T + 1, loader->fp);
            dataloader_decode_tokens(in, loader->read_buf, T, loader->token_bytes, loader->vocab_size,
                                     loader->shard_paths[shard], row * T);
            dataloader_decode_tokens(loader->targets + b * T, loader->read_buf + loader->token_bytes, T,
                                     loader->token_bytes, loader->vocab_size, loader->shard_paths[shard], row * T + 1);
        }
    }
    st->batch_in_shard++;
}

void dataloader_get_state(const DataLoader *loader, DataLoaderState *state) { *state = loader->state; }

void dataloader_set_state(DataLoader *loader, const DataLoaderState *state) {
    const DataLoaderState *cur = &loader->state;
    const char *hint = "resume with the same data glob, -t, rows a step (-b times the processes) and shuffle setting as "
                       "the run that wrote the checkpoint (or start without resuming)";
    if (state->magic != DATALOADER_STATE_MAGIC || state->version != DATALOADER_STATE_VERSION) {
        fail_with_hint("the checkpoint is corrupt or from another program version",
                       "dataloader state: bad magic/version %08x/%u", state->magic, state->version);
    }
    // a position counts groups of B · ranks rows: the same rows a group (2 ranks of B=2, or 1 of B=4) keep it valid, so
    // a run may resume at another number of data-parallel processes with the same rows a step
    if (state->B * state->num_ranks != cur->B * cur->num_ranks || state->T != cur->T) {
        fail_with_hint(hint, "dataloader state is for B=%llu T=%llu ranks=%llu, this loader has B=%llu T=%llu ranks=%llu "
                       "(B x ranks must stay the same)",
                       (unsigned long long)state->B, (unsigned long long)state->T,
                       (unsigned long long)state->num_ranks, (unsigned long long)cur->B, (unsigned long long)cur->T,
                       (unsigned long long)cur->num_ranks);
    }
    if (state->num_shards != cur->num_shards || state->num_tokens != cur->num_tokens ||
        state->shards_fingerprint != cur->shards_fingerprint || state->token_bytes != cur->token_bytes) {
        fail_with_hint(hint, "dataloader state is for %llu shards / %llu tokens, the glob now matches %llu shards / %llu "
                       "tokens (or shards of other sizes)",
                       (unsigned long long)state->num_shards, (unsigned long long)state->num_tokens,
                       (unsigned long long)cur->num_shards, (unsigned long long)cur->num_tokens);
    }
    if (state->shuffle != cur->shuffle) {
        fail_with_hint(hint, "dataloader state has shuffle=%d, this loader shuffle=%d", state->shuffle, cur->shuffle);
    }
    if (state->shard_pos >= cur->num_shards) {
        fail_with_hint("the checkpoint is corrupt", "dataloader state: shard position %llu of %llu shards",
                       (unsigned long long)state->shard_pos, (unsigned long long)cur->num_shards);
    }
    uint64_t seed = state->seed;
    loader->state.seed = seed;
    loader->perm_epoch = UINT64_MAX; // the permutations depend on the seed: recompute
    loader->row_shard = SIZE_MAX;
    size_t shard = dataloader_shard_at(loader, state->epoch, (size_t)state->shard_pos);
    if (state->batch_in_shard > loader->shard_batches[shard]) {
        fail_with_hint("the checkpoint is corrupt", "dataloader state: batch %llu of a shard with %zu batches",
                       (unsigned long long)state->batch_in_shard, loader->shard_batches[shard]);
    }
    loader->state = *state;
}

void dataloader_free(DataLoader *loader) {
    if (loader->fp != NULL) { fcloseCheck(loader->fp); }
    for (size_t s = 0; s < loader->num_shards; s++) { free(loader->shard_paths[s]); }
    free(loader->shard_paths);
    free(loader->shard_ntok);
    free(loader->shard_batches);
    free(loader->shard_order);
    free(loader->row_order);
    free(loader->read_buf);
    free(loader->scan);
    free(loader->inputs);
    free(loader->targets);
    memset(loader, 0, sizeof(*loader));
}

#endif // M2RNN_DATALOADER_H
