/*
test_common.h: the few lines every C/CUDA test program shares.
Each test case ends in exactly one test_result() call; a program ends with `return test_summary("name");`, which
prints one line "name: P passed, F failed, S skipped" (test/run_tests.sh adds those lines up) and returns the exit
status: 0 only when nothing failed. A skip always says why, so a skipped GPU test is never mistaken for a pass.
*/
#ifndef M2RNN_TEST_COMMON_H
#define M2RNN_TEST_COMMON_H

#include <stdarg.h>
#include <stdio.h>

static int test_num_passed = 0, test_num_failed = 0, test_num_skipped = 0;

// records one test case: prints "PASS name detail" or "FAIL name detail"
static void test_result(int ok, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void test_result(int ok, const char *name, const char *fmt, ...) {
    printf("%s %-48s ", ok ? "PASS" : "FAIL", name);
    va_list args;
    va_start(args, fmt);
    vprintf(fmt, args);
    va_end(args);
    printf("\n");
    fflush(stdout);
    if (ok) { test_num_passed++; } else { test_num_failed++; }
}

static void test_skip(const char *name, const char *why) {
    printf("SKIP %-48s %s\n", name, why);
    fflush(stdout);
    test_num_skipped++;
}

static int test_summary(const char *suite) {
    printf("%s: %d passed, %d failed, %d skipped\n", suite, test_num_passed, test_num_failed, test_num_skipped);
    fflush(stdout);
    return test_num_failed == 0 ? 0 : 1;
}

#endif // M2RNN_TEST_COMMON_H
