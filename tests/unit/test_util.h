/* Helpers the unit tests share: a scratch directory per test program and
 * whole-file writes that fail the test on a short write. Header-only so the
 * test glob (tests/unit/test_*.c) never mistakes it for a test program. */
#ifndef TESTS_UNIT_TEST_UTIL_H
#define TESTS_UNIT_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>

/* Creates /tmp/hs_test_<tag>_XXXXXX into dir; 0 or -1 as a cmocka group
 * setup returns, so a failed mkdtemp stops the group before any test. */
static inline int tu_tmpdir_make(char *dir, size_t cap, const char *tag) {
    snprintf(dir, cap, "/tmp/hs_test_%s_XXXXXX", tag);
    return mkdtemp(dir) ? 0 : -1;
}

/* Removes the scratch directory and all it holds; the status is rm's, as a
 * cmocka group teardown returns it. */
static inline int tu_tmpdir_remove(const char *dir) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static inline void tu_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

#endif
