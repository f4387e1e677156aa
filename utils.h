/*
utils.h: the host-side foundation every program and test includes.
- check macros around every fallible libc call (fopenCheck, freadCheck, ...): on failure they print what failed,
  where, and a hint, then exit(EXIT_FAILURE). Nothing here returns an error code the caller could forget.
- fail_with_hint(): the one way a user mistake is reported: one "error: ..." line, one "---> HINT: ..." line.
  Fuzz builds (-DM2RNN_FUZZ) turn every such exit into a longjmp back to the fuzz target (fuzz_escape), so a
  refusal is an answer, not a crash.
- a tiny CLI helper in llm.c's "-x value" style that refuses malformed numbers instead of reading them as 0.
- 64-bit file offsets everywhere (fseeko), so shards and checkpoints past 2 GB work.
*/
#ifndef M2RNN_UTILS_H
#define M2RNN_UTILS_H

#define _FILE_OFFSET_BITS 64
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

// ----------------------------------------------------------------------------------------------------------------
// user-facing errors

#ifdef M2RNN_FUZZ
#include <setjmp.h>
static jmp_buf *fuzz_escape = NULL; // set by a fuzz target around the code under test
#endif

// every exit on a refusal or a failed libc call goes through here; a parallel run sets the hook (comm.h: MPI_Abort,
// so one rank's failure stops the whole job instead of leaving the others waiting in a collective)
static void (*m2rnn_exit_hook)(int status) = NULL;
static void m2rnn_exit(int status) __attribute__((noreturn));
static void m2rnn_exit(int status) {
#ifdef M2RNN_FUZZ
    if (fuzz_escape != NULL) { longjmp(*fuzz_escape, 1); }
#endif
    if (status != EXIT_SUCCESS && m2rnn_exit_hook != NULL) {
        fflush(stdout);
        fflush(stderr);
        m2rnn_exit_hook(status);
    }
    exit(status);
}

// the program's name for hints ("./train_m2rnn_cpu"): main() sets it from argv[0]
static const char *program_name __attribute__((unused)) = "./train_m2rnn";

// prints "error: <what>" and "---> HINT: <hint>" to stderr and exits with status 1
static void fail_with_hint(const char *hint, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void fail_with_hint(const char *hint, const char *fmt, ...) {
#ifdef M2RNN_FUZZ
    if (fuzz_escape != NULL) { longjmp(*fuzz_escape, 1); }
#endif
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    if (hint != NULL && hint[0] != '\0') { fprintf(stderr, "---> HINT: %s\n", hint); }
    m2rnn_exit(EXIT_FAILURE);
}

// ----------------------------------------------------------------------------------------------------------------
// libc wrappers

static inline FILE *fopen_check(const char *path, const char *mode, const char *file, int line) {
    FILE *fp = fopen(path, mode);
    if (fp == NULL) {
        fprintf(stderr, "error: cannot open '%s' (mode %s): %s  [%s:%d]\n", path, mode, strerror(errno), file, line);
        fprintf(stderr, "---> HINT: check that the path exists and is %s\n",
                mode[0] == 'r' ? "readable" : "in a writable directory");
        m2rnn_exit(EXIT_FAILURE);
    }
    return fp;
}
#define fopenCheck(path, mode) fopen_check(path, mode, __FILE__, __LINE__)

static inline void fread_check(void *ptr, size_t size, size_t nmemb, FILE *stream, const char *file, int line) {
    size_t result = fread(ptr, size, nmemb, stream);
    if (result != nmemb) {
        fprintf(stderr, "error: short read: expected %zu elements of %zu bytes, got %zu (%s)  [%s:%d]\n", nmemb, size,
                result, feof(stream) ? "end of file" : (ferror(stream) ? "read error" : "unknown"), file, line);
        fprintf(stderr, "---> HINT: the file is truncated or not the kind of file this program expects\n");
        m2rnn_exit(EXIT_FAILURE);
    }
}
#define freadCheck(ptr, size, nmemb, stream) fread_check(ptr, size, nmemb, stream, __FILE__, __LINE__)

static inline void fwrite_check(const void *ptr, size_t size, size_t nmemb, FILE *stream, const char *file, int line) {
    size_t result = fwrite(ptr, size, nmemb, stream);
    if (result != nmemb) {
        fprintf(stderr, "error: short write: %zu of %zu elements: %s  [%s:%d]\n", result, nmemb, strerror(errno), file,
                line);
        fprintf(stderr, "---> HINT: is the disk full?\n");
        m2rnn_exit(EXIT_FAILURE);
    }
}
#define fwriteCheck(ptr, size, nmemb, stream) fwrite_check(ptr, size, nmemb, stream, __FILE__, __LINE__)

static inline void fclose_check(FILE *fp, const char *file, int line) {
    if (fclose(fp) != 0) {
        fprintf(stderr, "error: fclose failed: %s  [%s:%d]\n", strerror(errno), file, line);
        m2rnn_exit(EXIT_FAILURE);
    }
}
#define fcloseCheck(fp) fclose_check(fp, __FILE__, __LINE__)

static inline void fseek_check(FILE *fp, int64_t off, int whence, const char *file, int line) {
    if (fseeko(fp, (off_t)off, whence) != 0) {
        fprintf(stderr, "error: fseek to %lld failed: %s  [%s:%d]\n", (long long)off, strerror(errno), file, line);
        m2rnn_exit(EXIT_FAILURE);
    }
}
#define fseekCheck(fp, off, whence) fseek_check(fp, off, whence, __FILE__, __LINE__)

static inline void *malloc_check(size_t size, const char *file, int line) {
    void *ptr = malloc(size == 0 ? 1 : size);
    if (ptr == NULL) {
        fprintf(stderr, "error: out of host memory allocating %zu bytes  [%s:%d]\n", size, file, line);
        fprintf(stderr, "---> HINT: reduce the batch size (-b), the sequence length (-t) or the model size\n");
        m2rnn_exit(EXIT_FAILURE);
    }
    return ptr;
}
#define mallocCheck(size) malloc_check(size, __FILE__, __LINE__)

static inline void *calloc_check(size_t nmemb, size_t size, const char *file, int line) {
    void *ptr = calloc(nmemb == 0 ? 1 : nmemb, size == 0 ? 1 : size);
    if (ptr == NULL) {
        fprintf(stderr, "error: out of host memory allocating %zu x %zu bytes  [%s:%d]\n", nmemb, size, file, line);
        fprintf(stderr, "---> HINT: reduce the batch size (-b), the sequence length (-t) or the model size\n");
        m2rnn_exit(EXIT_FAILURE);
    }
    return ptr;
}
#define callocCheck(nmemb, size) calloc_check(nmemb, size, __FILE__, __LINE__)

// size of an open file in bytes, -1 when it cannot be told
static inline int64_t file_size_of(FILE *fp) {
    struct stat st;
    if (fstat(fileno(fp), &st) != 0) { return -1; }
    return (int64_t)st.st_size;
}

static inline void create_dir_if_not_exists(const char *dir) {
    if (dir == NULL) { return; }
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) { fail_with_hint("pass a directory to -o", "'%s' exists and is not a directory", dir); }
        return;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fail_with_hint("check the parent directory exists and is writable", "cannot create directory '%s': %s", dir,
                       strerror(errno));
    }
}

static inline int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

// ----------------------------------------------------------------------------------------------------------------
// CLI parsing: "-x value" pairs. Each parser takes the flag for its message and refuses trailing junk.

static inline long long parse_int_arg(const char *flag, const char *value, long long min, long long max) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno != 0 || end == value || *end != '\0') {
        fail_with_hint("run with -h to list every flag and its default", "flag %s expects an integer, got '%s'", flag,
                       value);
    }
    if (v < min || v > max) {
        fail_with_hint("run with -h to list every flag and its default", "flag %s must be in [%lld, %lld], got %lld",
                       flag, min, max, v);
    }
    return v;
}

static inline double parse_float_arg(const char *flag, const char *value, double min, double max) {
    char *end = NULL;
    errno = 0;
    double v = strtod(value, &end);
    if (errno != 0 || end == value || *end != '\0' || v != v) {
        fail_with_hint("run with -h to list every flag and its default", "flag %s expects a number, got '%s'", flag,
                       value);
    }
    if (v < min || v > max) {
        fail_with_hint("run with -h to list every flag and its default", "flag %s must be in [%g, %g], got %g", flag,
                       min, max, v);
    }
    return v;
}

#endif // M2RNN_UTILS_H
