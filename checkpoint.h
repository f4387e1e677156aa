/*
checkpoint.h: the versioned checkpoint format, shared by every executor.

One file per checkpoint, DIR/ckpt_%08d.bin (the step), little-endian. Version 2:
  header  4096 bytes: 64 int32 slots (magic, version, element width, the step, the training shape (B, T, grad
          accumulation), the RNG state, payload sizes, the checksums, the config text's length), then from byte 256
          the model config as text, one "name=value" line per field (model_config_to_text: the two layer patterns and
          every kind's sizes by name, so a new kind or field needs no header slot), zero padded
  payload parameters (num_parameters × elem_bytes, parameter-table order), then if has_optimizer the AdamW m and v
          (same size each), then the dataloader state blob (loader_state_bytes)
The checksum (FNV-1a) covers the config text and the payload; the config text has one of its own too, checked
when the header is read, so a damaged config is named as such before anything is built from it. The element width is recorded so a float64 test build
can never load a float32 file by mistake.

Version 1 (a 1024-byte header with the config in fixed slots; M and A layers only, SwiGLU) is still read: its
payload is laid out exactly as version 2 lays out the same model, so it loads as it is.

Writes are atomic: the file is written to DIR/.ckpt_%08d.bin.tmp, flushed, fsync'd and renamed, so a crash leaves
either the old set of checkpoints or the new one, never a torn file. Reads validate magic, version, sizes against the
file's length, the config, and the checksum, and refuse anything else with one line and a hint.
*/
#ifndef M2RNN_CHECKPOINT_H
#define M2RNN_CHECKPOINT_H

#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include "model.h"
#include "utils.h"

#define CKPT_MAGIC 20261122
#define CKPT_VERSION 2
#define CKPT_HEADER_BYTES 4096   // version 2
#define CKPT_CONFIG_OFFSET 256   // version 2: where the config text starts
#define CKPT_V1_HEADER_BYTES 1024

typedef struct {
    ModelConfig config;
    int version;               // of the file read (writes are always CKPT_VERSION)
    int elem_bytes;            // 4 (float) or 8 (double)
    int has_optimizer;         // m and v follow the parameters
    uint64_t num_parameters;
    int step;                  // optimizer steps completed
    int B, T, grad_accum;      // the training shape the loader state belongs to
    uint64_t rng_state;        // the sampler's RNG
    uint32_t loader_state_bytes;
    uint64_t checksum;         // FNV-1a over the config text and the payload
    int header_bytes;          // where the payload starts
    char config_text[CKPT_HEADER_BYTES - CKPT_CONFIG_OFFSET]; // version 2: as stored (checksummed)
} CheckpointHeader;

static inline uint64_t fnv1a_update(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    for (size_t i = 0; i < n; i++) { h = (h ^ p[i]) * 0x100000001B3ULL; }
    return h;
}
#define FNV1A_INIT 0xCBF29CE484222325ULL

static inline void put_u64(int32_t *h, int slot, uint64_t v) { memcpy(&h[slot], &v, 8); }
static inline uint64_t get_u64(const int32_t *h, int slot) { uint64_t v; memcpy(&v, &h[slot], 8); return v; }
static inline float get_f32(const int32_t *h, int slot) { float v; memcpy(&v, &h[slot], 4); return v; }

// the payload size in bytes a header promises
static inline uint64_t checkpoint_payload_bytes(const CheckpointHeader *c) {
    return c->num_parameters * (uint64_t)c->elem_bytes * (c->has_optimizer ? 3u : 1u) + c->loader_state_bytes;
}

// Why a checkpoint cannot be read, and what to do: filled by the checkpoint_try_* functions, which never exit (the
// resume path skips a bad checkpoint for an older one; the fatal readers below turn it into error + HINT).
typedef struct {
    char why[700];
    const char *hint;
} CkptError;

static int ckpt_error(CkptError *e, const char *hint, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int ckpt_error(CkptError *e, const char *hint, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(e->why, sizeof(e->why), fmt, args);
    va_end(args);
    e->hint = hint;
    return 0;
}

#define CKPT_HINT_DAMAGED "the checkpoint is damaged; resume from an earlier ckpt_*.bin (-y 1 skips damaged ones)"

// the version-1 header: the config in fixed slots (written by m2rnn before the layer-kind table)
static int checkpoint_header_from_v1(CheckpointHeader *c, const int32_t *h, const char *path, CkptError *e) {
    ModelConfig *m = &c->config;
    c->elem_bytes = h[2]; c->has_optimizer = h[3];
    m->vocab_size = h[4]; m->d_model = h[6];
    m->m2rnn.heads = h[8]; m->m2rnn.qk_heads = h[9]; m->m2rnn.k = h[10]; m->m2rnn.v = h[11]; m->m2rnn.conv = h[12];
    m->m2rnn.grad_clamp = get_f32(h, 13);
    m->attn.heads = h[14]; m->attn.head_dim = h[15]; m->attn.rope = h[16]; m->attn.rope_theta = get_f32(h, 17);
    m->swiglu.hidden = h[18];
    c->num_parameters = get_u64(h, 20); c->step = h[22]; c->rng_state = get_u64(h, 23);
    c->loader_state_bytes = (uint32_t)h[25]; c->checksum = get_u64(h, 26);
    c->B = h[28]; c->T = h[29]; c->grad_accum = h[30];
    const char *pattern = (const char *)&h[128];
    const size_t len = strnlen(pattern, MAX_LAYERS + 1);
    if (len == 0 || len > MAX_LAYERS || (int)len != h[7] || h[4] <= 0 || h[5] != round_up(h[4], VOCAB_PAD_MULTIPLE)) {
        return ckpt_error(e, CKPT_HINT_DAMAGED, "checkpoint '%s' (version 1) has a malformed layer pattern or vocabulary",
                          path);
    }
    memcpy(m->pattern, pattern, len);
    m->pattern[len] = '\0';
    c->header_bytes = CKPT_V1_HEADER_BYTES;
    return 1;
}

// Reads and validates the header of `path`: 1, or 0 with why in e (foreign, truncated or inconsistent files).
static int checkpoint_try_read_header(const char *path, CheckpointHeader *c, CkptError *e) {
    memset(c, 0, sizeof(*c));
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) { return ckpt_error(e, "check the path", "cannot open checkpoint '%s': %s", path, strerror(errno)); }
    const int64_t size = file_size_of(fp);
    int32_t h[64];
    if (size < (int64_t)sizeof(h) || fread(h, sizeof(int32_t), 64, fp) != 64) {
        fclose(fp);
        return ckpt_error(e, "the file is truncated or not an m2rnn checkpoint; resume from an earlier ckpt_*.bin",
                          "checkpoint '%s' is %lld bytes, shorter than its header", path, (long long)size);
    }
    if (h[0] != CKPT_MAGIC) {
        fclose(fp);
        return ckpt_error(e, "pass a ckpt_*.bin written by train_m2rnn (-e FILE or -o DIR -y 1)",
                          "'%s' is not an m2rnn checkpoint (magic %d, expected %d)", path, h[0], CKPT_MAGIC);
    }
    if (h[1] != 1 && h[1] != CKPT_VERSION) {
        fclose(fp);
        return ckpt_error(e, h[1] > CKPT_VERSION ? "the file was written by a newer m2rnn; use that version to read it"
                                                 : CKPT_HINT_DAMAGED,
                          "checkpoint '%s' has version %d, this build reads versions 1 and %d", path, h[1],
                          CKPT_VERSION);
    }
    c->version = h[1];
    const int header_bytes = c->version == 1 ? CKPT_V1_HEADER_BYTES : CKPT_HEADER_BYTES;
    if (size < header_bytes) {
        fclose(fp);
        return ckpt_error(e, "the file is truncated; resume from an earlier ckpt_*.bin",
                          "checkpoint '%s' is %lld bytes, shorter than its %d-byte header", path, (long long)size,
                          header_bytes);
    }
    if (c->version == 1) {
        int32_t v1[CKPT_V1_HEADER_BYTES / 4];
        const int ok = fseeko(fp, 0, SEEK_SET) == 0 && fread(v1, sizeof(int32_t), CKPT_V1_HEADER_BYTES / 4, fp) ==
                                                            CKPT_V1_HEADER_BYTES / 4;
        fclose(fp);
        if (!ok) { return ckpt_error(e, CKPT_HINT_DAMAGED, "cannot read the header of '%s'", path); }
        if (!checkpoint_header_from_v1(c, v1, path, e)) { return 0; }
    } else {
        c->elem_bytes = h[2]; c->has_optimizer = h[3];
        c->num_parameters = get_u64(h, 4); c->step = h[6]; c->B = h[7]; c->T = h[8]; c->grad_accum = h[9];
        c->rng_state = get_u64(h, 10); c->loader_state_bytes = (uint32_t)h[12]; c->checksum = get_u64(h, 13);
        const int text_bytes = h[15];
        c->header_bytes = h[16];
        if (c->header_bytes != CKPT_HEADER_BYTES || text_bytes <= 0 || text_bytes >= (int)sizeof(c->config_text)) {
            fclose(fp);
            return ckpt_error(e, CKPT_HINT_DAMAGED, "checkpoint '%s' has a malformed header (config text of %d bytes)",
                              path, text_bytes);
        }
        const int ok = fseeko(fp, CKPT_CONFIG_OFFSET, SEEK_SET) == 0 &&
                       fread(c->config_text, 1, (size_t)text_bytes, fp) == (size_t)text_bytes;
        fclose(fp);
        c->config_text[ok ? text_bytes : 0] = '\0';
        if (!ok || fnv1a_update(FNV1A_INIT, c->config_text, (size_t)text_bytes) != get_u64(h, 18)) {
            return ckpt_error(e, CKPT_HINT_DAMAGED, "checkpoint '%s' fails the checksum of its config text", path);
        }
        char why[512] = "";
        if (strlen(c->config_text) != (size_t)text_bytes) {
            return ckpt_error(e, CKPT_HINT_DAMAGED, "checkpoint '%s': its config text is cut short", path);
        }
        if (model_config_from_text(&c->config, c->config_text, why, sizeof(why)) != NULL) {
            return ckpt_error(e, strstr(why, "newer") ? "read it with the m2rnn version that wrote it" : CKPT_HINT_DAMAGED,
                              "checkpoint '%s': %s", path, why);
        }
    }
    if (c->elem_bytes != 4 && c->elem_bytes != 8) {
        return ckpt_error(e, CKPT_HINT_DAMAGED, "checkpoint '%s' has element width %d", path, c->elem_bytes);
    }
    if (c->step < 0 || c->B <= 0 || c->T <= 0 || c->grad_accum <= 0 || c->num_parameters == 0 ||
        c->num_parameters > ((uint64_t)1 << 40) || c->loader_state_bytes > (1u << 20)) {
        return ckpt_error(e, CKPT_HINT_DAMAGED, "checkpoint '%s' has a malformed header (step %d, B %d, T %d)", path,
                          c->step, c->B, c->T);
    }
    const int64_t expected = (int64_t)c->header_bytes + (int64_t)checkpoint_payload_bytes(c);
    if (size != expected) {
        return ckpt_error(e, "the file was cut short or appended to; resume from an earlier ckpt_*.bin",
                          "checkpoint '%s' is %lld bytes, its header promises %lld", path, (long long)size,
                          (long long)expected);
    }
    return 1;
}

// Reads the payload into the given buffers (m, v, loader_state may be NULL to skip them: they are still read, for the
// checksum) and checks the checksum: 1, or 0 with why in e.
static int checkpoint_try_read_payload(const char *path, const CheckpointHeader *c, void *params, void *m, void *v,
                                       void *loader_state, CkptError *e) {
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) { return ckpt_error(e, "check the path", "cannot open checkpoint '%s': %s", path, strerror(errno)); }
    if (fseeko(fp, c->header_bytes, SEEK_SET) != 0) {
        fclose(fp);
        return ckpt_error(e, CKPT_HINT_DAMAGED, "cannot seek in checkpoint '%s'", path);
    }
    const size_t tensor_bytes = (size_t)c->num_parameters * c->elem_bytes;
    uint64_t hash = c->version == 1 ? FNV1A_INIT : fnv1a_update(FNV1A_INIT, c->config_text, strlen(c->config_text));
    void *targets[4] = {params, c->has_optimizer ? m : NULL, c->has_optimizer ? v : NULL, loader_state};
    const size_t sizes[4] = {tensor_bytes, c->has_optimizer ? tensor_bytes : 0, c->has_optimizer ? tensor_bytes : 0,
                             c->loader_state_bytes};
    enum { CHUNK = 1 << 20 };
    uint8_t *chunk = (uint8_t *)mallocCheck(CHUNK);
    int ok = 1;
    for (int i = 0; i < 4 && ok; i++) {
        for (size_t done = 0; done < sizes[i] && ok;) { // a part not wanted is read through a chunk buffer
            const size_t n = targets[i] != NULL ? sizes[i] : (sizes[i] - done < CHUNK ? sizes[i] - done : CHUNK);
            uint8_t *dst = targets[i] != NULL ? (uint8_t *)targets[i] : chunk;
            ok = fread(dst, 1, n, fp) == n;
            if (ok) { hash = fnv1a_update(hash, dst, n); }
            done += n;
        }
    }
    free(chunk);
    fclose(fp);
    if (!ok) { return ckpt_error(e, CKPT_HINT_DAMAGED, "checkpoint '%s' is shorter than its header says", path); }
    if (hash != c->checksum) {
        return ckpt_error(e, "the file is corrupted; resume from an earlier ckpt_*.bin (-y 1 skips damaged ones)",
                          "checkpoint '%s' fails its checksum", path);
    }
    return 1;
}

// the same, refusing with error + HINT
static void checkpoint_read_header(const char *path, CheckpointHeader *c) {
    CkptError e;
    if (!checkpoint_try_read_header(path, c, &e)) { fail_with_hint(e.hint, "%s", e.why); }
}
static void checkpoint_read_payload(const char *path, const CheckpointHeader *c, void *params, void *m, void *v,
                                    void *loader_state) {
    CkptError e;
    if (!checkpoint_try_read_payload(path, c, params, m, v, loader_state, &e)) { fail_with_hint(e.hint, "%s", e.why); }
}

// Writes a checkpoint atomically (temporary file, fsync, rename) in the current version. m, v may be NULL when
// !has_optimizer.
static void checkpoint_write(const char *path, CheckpointHeader *c, const void *params, const void *m, const void *v,
                             const void *loader_state) {
    memset(c->config_text, 0, sizeof(c->config_text));
    const int text_bytes = model_config_to_text(&c->config, c->config_text, sizeof(c->config_text));
    if (text_bytes < 0) { fail_with_hint("report this: the config outgrew the checkpoint header", "checkpoint config text too long"); }
    const size_t tensor_bytes = (size_t)c->num_parameters * c->elem_bytes;
    uint64_t hash = fnv1a_update(FNV1A_INIT, c->config_text, (size_t)text_bytes);
    hash = fnv1a_update(hash, params, tensor_bytes);
    if (c->has_optimizer) { hash = fnv1a_update(fnv1a_update(hash, m, tensor_bytes), v, tensor_bytes); }
    if (c->loader_state_bytes > 0) { hash = fnv1a_update(hash, loader_state, c->loader_state_bytes); }
    c->checksum = hash;
    c->version = CKPT_VERSION;
    c->header_bytes = CKPT_HEADER_BYTES;
    uint8_t header[CKPT_HEADER_BYTES];
    memset(header, 0, sizeof(header));
    int32_t *h = (int32_t *)header;
    h[0] = CKPT_MAGIC; h[1] = CKPT_VERSION; h[2] = c->elem_bytes; h[3] = c->has_optimizer;
    put_u64(h, 4, c->num_parameters); h[6] = c->step; h[7] = c->B; h[8] = c->T; h[9] = c->grad_accum;
    put_u64(h, 10, c->rng_state); h[12] = (int32_t)c->loader_state_bytes; put_u64(h, 13, c->checksum);
    h[15] = text_bytes; h[16] = CKPT_HEADER_BYTES; put_u64(h, 18, fnv1a_update(FNV1A_INIT, c->config_text, (size_t)text_bytes));
    memcpy(header + CKPT_CONFIG_OFFSET, c->config_text, (size_t)text_bytes);
    char tmp[4200];
    if (strlen(path) > 4000) { fail_with_hint("use a shorter output directory", "checkpoint path too long: %s", path); }
    const char *slash = strrchr(path, '/');
    if (slash != NULL) {
        snprintf(tmp, sizeof(tmp), "%.*s/.%s.tmp", (int)(slash - path), path, slash + 1);
    } else {
        snprintf(tmp, sizeof(tmp), ".%s.tmp", path);
    }
    FILE *fp = fopenCheck(tmp, "wb");
    fwriteCheck(header, 1, sizeof(header), fp);
    fwriteCheck(params, 1, tensor_bytes, fp);
    const char *slow = getenv("M2RNN_TEST_SLOW_SAVE"); // tests: STEP:MS (or *:MS) pauses that write half-way
    int slow_step = -1, slow_ms = 0;
    if (slow != NULL && (sscanf(slow, "%d:%d", &slow_step, &slow_ms) == 2 || sscanf(slow, "*:%d", &slow_ms) == 1) &&
        (slow[0] == '*' || slow_step == c->step)) {
        fflush(fp);
        const struct timespec pause = {slow_ms / 1000, (long)(slow_ms % 1000) * 1000000L};
        nanosleep(&pause, NULL);
    }
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

// 1 if name is exactly ckpt_%08d.bin, with its step
static int checkpoint_name_step(const char *name, int *step) {
    char tail[8];
    return sscanf(name, "ckpt_%8d.bi%1[n]", step, tail) == 2 && strlen(name) == 17 && *step >= 0;
}

static int compare_desc(const void *a, const void *b) { return *(const int *)b - *(const int *)a; }

// the steps of the checkpoints in dir, newest first; returns their count (at most max; 0 if dir does not exist)
static int checkpoint_list(const char *dir, int *steps, int max) {
    DIR *d = opendir(dir);
    if (d == NULL) { return 0; }
    int count = 0, step;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && count < max) {
        if (checkpoint_name_step(e->d_name, &step)) { steps[count++] = step; }
    }
    closedir(d);
    qsort(steps, (size_t)count, sizeof(int), compare_desc);
    return count;
}

// Deletes the temporary files of checkpoint writes that never finished (a killed run leaves .ckpt_*.bin.tmp);
// prints each one it removes unless quiet. Returns how many.
static int checkpoint_remove_stale(const char *dir, int quiet) {
    DIR *d = opendir(dir);
    if (d == NULL) { return 0; }
    int removed = 0, step;
    struct dirent *e;
    char path[4400];
    while ((e = readdir(d)) != NULL) {
        const size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' && len == 22 && strcmp(e->d_name + 18, ".tmp") == 0) {
            char name[32];
            memcpy(name, e->d_name + 1, 17);
            name[17] = '\0';
            if (!checkpoint_name_step(name, &step)) { continue; }
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            if (remove(path) == 0) {
                removed++;
                if (!quiet) { printf("removed %s: the temporary file of a checkpoint write that did not finish\n", path); }
            }
        }
    }
    closedir(d);
    return removed;
}

// Keeps the newest `keep` checkpoints at or below step `current` (keep <= 0 keeps all), and every multiple of `major`.
// The checkpoint of `current`, the one just written, is never deleted, and neither is anything newer than it.
static void checkpoint_prune(const char *dir, int keep, int major, int current) {
    if (keep <= 0) { return; }
    int steps[4096];
    const int count = checkpoint_list(dir, steps, 4096);
    int newer = 0; // checkpoints at or below current that are newer than this one
    for (int i = 0; i < count; i++) { // newest first
        if (steps[i] > current) { continue; }
        const int stays = steps[i] == current || newer < keep || (major > 0 && steps[i] % major == 0);
        newer++;
        if (stays) { continue; }
        char path[4096];
        checkpoint_path(path, sizeof(path), dir, steps[i]);
        remove(path);
    }
}

#endif // M2RNN_CHECKPOINT_H
