/*
checkpoint.h: the versioned checkpoint format, shared by every executor.

One file per checkpoint, DIR/ckpt_%08d.bin (the step), little-endian:
  header  256 × int32 (1024 bytes): magic, version, element width, the full ModelConfig (pattern included), the step,
          the training shape (B, T, grad accumulation), the RNG state, payload sizes and a checksum of the payload
  payload parameters (num_parameters × elem_bytes, parameter-table order), then if has_optimizer the AdamW m and v
          (same size each), then the dataloader state blob (loader_state_bytes)
The element width is recorded so a float64 test build can never load a float32 file by mistake.

Writes are atomic: the file is written to DIR/.ckpt_%08d.bin.tmp, flushed, fsync'd and renamed, so a crash leaves
either the old set of checkpoints or the new one, never a torn file. Reads validate magic, version, sizes against the
file's length, and the payload checksum, and refuse anything else with one line and a hint.
*/
#ifndef M2RNN_CHECKPOINT_H
#define M2RNN_CHECKPOINT_H

#include <dirent.h>
#include <unistd.h>

#include "model.h"
#include "utils.h"

#define CKPT_MAGIC 20261122
#define CKPT_VERSION 1
#define CKPT_HEADER_INTS 256
#define CKPT_PATTERN_SLOT 128 // pattern bytes live in header ints [128, 128 + MAX_LAYERS/4 + 1)

typedef struct {
    ModelConfig config;
    int elem_bytes;            // 4 (float) or 8 (double)
    int has_optimizer;         // m and v follow the parameters
    uint64_t num_parameters;
    int step;                  // optimizer steps completed
    int B, T, grad_accum;      // the training shape the loader state belongs to
    uint64_t rng_state;        // the sampler's RNG
    uint32_t loader_state_bytes;
    uint64_t checksum;         // FNV-1a over the payload
} CheckpointHeader;

static inline uint64_t fnv1a_update(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    for (size_t i = 0; i < n; i++) { h = (h ^ p[i]) * 0x100000001B3ULL; }
    return h;
}
#define FNV1A_INIT 0xCBF29CE484222325ULL

static inline void put_u64(int32_t *h, int slot, uint64_t v) { memcpy(&h[slot], &v, 8); }
static inline uint64_t get_u64(const int32_t *h, int slot) { uint64_t v; memcpy(&v, &h[slot], 8); return v; }
static inline void put_f32(int32_t *h, int slot, float v) { memcpy(&h[slot], &v, 4); }
static inline float get_f32(const int32_t *h, int slot) { float v; memcpy(&v, &h[slot], 4); return v; }

static void checkpoint_header_pack(int32_t *h, const CheckpointHeader *c) {
    memset(h, 0, CKPT_HEADER_INTS * sizeof(int32_t));
    const ModelConfig *m = &c->config;
    h[0] = CKPT_MAGIC; h[1] = CKPT_VERSION; h[2] = c->elem_bytes; h[3] = c->has_optimizer;
    h[4] = m->vocab_size; h[5] = m->padded_vocab_size; h[6] = m->d_model; h[7] = m->n_layer;
    h[8] = m->rnn_heads; h[9] = m->rnn_qk_heads; h[10] = m->rnn_k; h[11] = m->rnn_v; h[12] = m->conv_width;
    put_f32(h, 13, m->rnn_grad_clamp);
    h[14] = m->attn_heads; h[15] = m->attn_head_dim; h[16] = m->use_rope; put_f32(h, 17, m->rope_theta);
    h[18] = m->mlp_hidden;
    put_u64(h, 20, c->num_parameters); h[22] = c->step; put_u64(h, 23, c->rng_state);
    h[25] = (int32_t)c->loader_state_bytes; put_u64(h, 26, c->checksum);
    h[28] = c->B; h[29] = c->T; h[30] = c->grad_accum;
    memcpy(&h[CKPT_PATTERN_SLOT], m->pattern, strlen(m->pattern) + 1);
}

// the payload size in bytes a header promises
static inline uint64_t checkpoint_payload_bytes(const CheckpointHeader *c) {
    return c->num_parameters * (uint64_t)c->elem_bytes * (c->has_optimizer ? 3u : 1u) + c->loader_state_bytes;
}

// Reads and validates the header of `path`; refuses foreign, truncated or inconsistent files.
static void checkpoint_read_header(const char *path, CheckpointHeader *c) {
    FILE *fp = fopenCheck(path, "rb");
    int32_t h[CKPT_HEADER_INTS];
    const int64_t size = file_size_of(fp);
    if (size < (int64_t)sizeof(h)) {
        fail_with_hint("the file is truncated or not an m2rnn checkpoint; resume from an earlier ckpt_*.bin",
                       "checkpoint '%s' is %lld bytes, shorter than its 1024-byte header", path, (long long)size);
    }
    freadCheck(h, sizeof(int32_t), CKPT_HEADER_INTS, fp);
    fcloseCheck(fp);
    if (h[0] != CKPT_MAGIC) {
        fail_with_hint("pass a ckpt_*.bin written by train_m2rnn (-e FILE or -o DIR -y 1)",
                       "'%s' is not an m2rnn checkpoint (magic %d, expected %d)", path, h[0], CKPT_MAGIC);
    }
    if (h[1] != CKPT_VERSION) {
        fail_with_hint("this build reads checkpoint version 1; use the m2rnn version that wrote the file",
                       "checkpoint '%s' has version %d, this build reads version %d", path, h[1], CKPT_VERSION);
    }
    memset(c, 0, sizeof(*c));
    ModelConfig *m = &c->config;
    c->elem_bytes = h[2]; c->has_optimizer = h[3];
    m->vocab_size = h[4]; m->padded_vocab_size = h[5]; m->d_model = h[6]; m->n_layer = h[7];
    m->rnn_heads = h[8]; m->rnn_qk_heads = h[9]; m->rnn_k = h[10]; m->rnn_v = h[11]; m->conv_width = h[12];
    m->rnn_grad_clamp = get_f32(h, 13);
    m->attn_heads = h[14]; m->attn_head_dim = h[15]; m->use_rope = h[16]; m->rope_theta = get_f32(h, 17);
    m->mlp_hidden = h[18];
    c->num_parameters = get_u64(h, 20); c->step = h[22]; c->rng_state = get_u64(h, 23);
    c->loader_state_bytes = (uint32_t)h[25]; c->checksum = get_u64(h, 26);
    c->B = h[28]; c->T = h[29]; c->grad_accum = h[30];
    const char *pattern = (const char *)&h[CKPT_PATTERN_SLOT];
    size_t len = strnlen(pattern, MAX_LAYERS + 1);
    const char *hint = "the checkpoint is damaged; resume from an earlier ckpt_*.bin";
    if (len == 0 || len > MAX_LAYERS || (int)len != m->n_layer) {
        fail_with_hint(hint, "checkpoint '%s' has a malformed layer pattern", path);
    }
    memcpy(m->pattern, pattern, len);
    m->pattern[len] = '\0';
    if (c->elem_bytes != 4 && c->elem_bytes != 8) {
        fail_with_hint(hint, "checkpoint '%s' has element width %d", path, c->elem_bytes);
    }
    if (c->step < 0 || c->B <= 0 || c->T <= 0 || c->grad_accum <= 0) {
        fail_with_hint(hint, "checkpoint '%s' has a malformed header (step %d, B %d, T %d)", path, c->step, c->B, c->T);
    }
    const int64_t expected = (int64_t)sizeof(h) + (int64_t)checkpoint_payload_bytes(c);
    if (size != expected) {
        fail_with_hint("the file was cut short or appended to; resume from an earlier ckpt_*.bin",
                       "checkpoint '%s' is %lld bytes, its header promises %lld", path, (long long)size,
                       (long long)expected);
    }
}

// Reads the payload into the given buffers (m, v, loader_state may be NULL to skip them) and checks the checksum.
static void checkpoint_read_payload(const char *path, const CheckpointHeader *c, void *params, void *m, void *v,
                                    void *loader_state) {
    FILE *fp = fopenCheck(path, "rb");
    fseekCheck(fp, CKPT_HEADER_INTS * sizeof(int32_t), SEEK_SET);
    const size_t tensor_bytes = (size_t)c->num_parameters * c->elem_bytes;
    uint64_t hash = FNV1A_INIT;
    void *scratch = NULL;
    void *targets[4] = {params, c->has_optimizer ? m : NULL, c->has_optimizer ? v : NULL, loader_state};
    size_t sizes[4] = {tensor_bytes, c->has_optimizer ? tensor_bytes : 0, c->has_optimizer ? tensor_bytes : 0,
                       c->loader_state_bytes};
    for (int i = 0; i < 4; i++) {
        if (sizes[i] == 0) { continue; }
        void *dst = targets[i];
        if (dst == NULL) { // still read it: the checksum covers the whole payload
            scratch = scratch == NULL ? mallocCheck(tensor_bytes > sizes[i] ? tensor_bytes : sizes[i]) : scratch;
            dst = scratch;
        }
        freadCheck(dst, 1, sizes[i], fp);
        hash = fnv1a_update(hash, dst, sizes[i]);
    }
    free(scratch);
    fcloseCheck(fp);
    if (hash != c->checksum) {
        fail_with_hint("the file is corrupted; resume from an earlier ckpt_*.bin",
                       "checkpoint '%s' fails its checksum", path);
    }
}

// Writes a checkpoint atomically (temporary file, fsync, rename). m, v may be NULL when !has_optimizer.
static void checkpoint_write(const char *path, CheckpointHeader *c, const void *params, const void *m, const void *v,
                             const void *loader_state) {
    const size_t tensor_bytes = (size_t)c->num_parameters * c->elem_bytes;
    uint64_t hash = fnv1a_update(FNV1A_INIT, params, tensor_bytes);
    if (c->has_optimizer) { hash = fnv1a_update(fnv1a_update(hash, m, tensor_bytes), v, tensor_bytes); }
    if (c->loader_state_bytes > 0) { hash = fnv1a_update(hash, loader_state, c->loader_state_bytes); }
    c->checksum = hash;
    int32_t h[CKPT_HEADER_INTS];
    checkpoint_header_pack(h, c);
    char tmp[4200];
    if (strlen(path) > 4000) { fail_with_hint("use a shorter output directory", "checkpoint path too long: %s", path); }
    const char *slash = strrchr(path, '/');
    if (slash != NULL) {
        snprintf(tmp, sizeof(tmp), "%.*s/.%s.tmp", (int)(slash - path), path, slash + 1);
    } else {
        snprintf(tmp, sizeof(tmp), ".%s.tmp", path);
    }
    FILE *fp = fopenCheck(tmp, "wb");
    fwriteCheck(h, sizeof(int32_t), CKPT_HEADER_INTS, fp);
    fwriteCheck(params, 1, tensor_bytes, fp);
    if (c->has_optimizer) { fwriteCheck(m, 1, tensor_bytes, fp); fwriteCheck(v, 1, tensor_bytes, fp); }
    if (c->loader_state_bytes > 0) { fwriteCheck(loader_state, 1, c->loader_state_bytes, fp); }
    if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) {
        fail_with_hint("is the disk full?", "cannot flush checkpoint '%s': %s", tmp, strerror(errno));
    }
    fcloseCheck(fp);
    if (rename(tmp, path) != 0) {
        fail_with_hint("check the output directory is writable", "cannot rename '%s' to '%s': %s", tmp, path,
                       strerror(errno));
    }
}

static inline void checkpoint_path(char *out, size_t n, const char *dir, int step) {
    snprintf(out, n, "%s/ckpt_%08d.bin", dir, step);
}

// the highest step with a ckpt_%08d.bin in dir, or -1
static int checkpoint_find_latest(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) { return -1; }
    int best = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int step;
        char tail[8];
        if (sscanf(e->d_name, "ckpt_%8d.bi%1[n]", &step, tail) == 2 && strlen(e->d_name) == 17 && step > best) {
            best = step;
        }
    }
    closedir(d);
    return best;
}

// deletes ckpt files older than the newest `keep` (keep <= 0 keeps all); steps that are multiples of `major` stay
static void checkpoint_prune(const char *dir, int keep, int major) {
    if (keep <= 0) { return; }
    int steps[4096], count = 0;
    DIR *d = opendir(dir);
    if (d == NULL) { return; }
    struct dirent *e;
    while ((e = readdir(d)) != NULL && count < 4096) {
        int step;
        char tail[8];
        if (sscanf(e->d_name, "ckpt_%8d.bi%1[n]", &step, tail) == 2 && strlen(e->d_name) == 17) { steps[count++] = step; }
    }
    closedir(d);
    for (int i = 0; i < count; i++) {
        int newer = 0;
        for (int j = 0; j < count; j++) { newer += steps[j] > steps[i]; }
        if (newer >= keep && !(major > 0 && steps[i] % major == 0)) {
            char path[4096];
            checkpoint_path(path, sizeof(path), dir, steps[i]);
            remove(path);
        }
    }
}

#endif // M2RNN_CHECKPOINT_H
