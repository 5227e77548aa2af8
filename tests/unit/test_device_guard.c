/* The device guard (HS_DEVICE_GUARD=1, src/device/guard.c): what the host
 * may and may not do with device memory. Each forbidden act runs in a
 * child process, which must die of it: a fault for a read or write of
 * device memory, an abort naming the kernel for host memory handed to one. */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "hypershard/device.h"

static hs_device *make(hs_device_kind kind) {
    setenv("HS_DEVICE_GUARD", "1", 1);
    hs_device *d = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_device_create(kind, NULL, &d, &e), HS_OK);
    assert_non_null(d->guard);
    return d;
}

/* The signal that ended a child running act on a guarded device of kind,
 * or 0 if it exited. */
static int child_signal(void (*act)(hs_device *d), hs_device_kind kind) {
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* the test runner's handlers would catch the fault: the default ends the child */
        signal(SIGSEGV, SIG_DFL), signal(SIGBUS, SIG_DFL), signal(SIGABRT, SIG_DFL);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) dup2(null, 2); /* the abort's message is expected */
        act(make(kind));
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

static void host_reads_device(hs_device *d) {
    volatile float *x = hs_device_alloc(d, 64 * sizeof(float));
    float v = x[3];
    (void)v;
}

static void host_writes_device(hs_device *d) {
    float *x = hs_device_alloc(d, 64 * sizeof(float));
    memset(x, 0, 64 * sizeof(float));
}

static void kernel_gets_host_memory(hs_device *d) {
    float host[8] = {0};
    d->k->fill(d->stream, host, 1.0f, 8);
}

static void h2d_copy_into_host_memory(hs_device *d) {
    float a[8] = {0}, b[8] = {0};
    hs_device_copy(d, a, b, sizeof a, HS_COPY_H2D);
}

static void test_host_read_of_device_memory_faults(void **state) {
    (void)state;
    assert_int_equal(child_signal(host_reads_device, HS_DEVICE_CPU), SIGSEGV);
    assert_int_equal(child_signal(host_reads_device, HS_DEVICE_REFERENCE), SIGSEGV);
}

static void test_host_memset_of_device_memory_faults(void **state) {
    (void)state;
    assert_int_equal(child_signal(host_writes_device, HS_DEVICE_CPU), SIGSEGV);
}

static void test_host_array_passed_to_a_kernel_aborts(void **state) {
    (void)state;
    assert_int_equal(child_signal(kernel_gets_host_memory, HS_DEVICE_CPU), SIGABRT);
}

static void test_copy_whose_ends_contradict_its_kind_aborts(void **state) {
    (void)state;
    assert_int_equal(child_signal(h2d_copy_into_host_memory, HS_DEVICE_CPU), SIGABRT);
}

/* What the seam allows: kernels and copies on device memory, the host's
 * arrays crossing by copies, host-pool memory read by a kernel; the values
 * come back through a D2H copy. */
static void test_kernels_and_copies_work_under_the_guard(void **state) {
    (void)state;
    hs_device *d = make(HS_DEVICE_CPU);
    float host[64], back[64];
    for (int i = 0; i < 64; i++) host[i] = (float)i;
    float *x = hs_device_alloc(d, sizeof host), *y = hs_device_alloc(d, sizeof host);
    float *pinned = hs_host_alloc(d, sizeof host);
    hs_device_copy(d, x, host, sizeof host, HS_COPY_H2D);
    hs_device_copy(d, y, x, sizeof host, HS_COPY_D2D);
    d->k->scale(d->stream, y, 2.0f, 64);
    d->k->fill(d->stream, pinned, 1.0f, 64);
    d->k->add(d->stream, y, pinned, 64);
    hs_device_copy(d, back, y, sizeof back, HS_COPY_D2H);
    for (int i = 0; i < 64; i++) assert_true(back[i] == 2.0f * (float)i + 1.0f);
    hs_host_free(d, pinned);
    hs_device_free_mem(d, x);
    hs_device_free_mem(d, y);
    hs_device_free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_read_of_device_memory_faults),
        cmocka_unit_test(test_host_memset_of_device_memory_faults),
        cmocka_unit_test(test_host_array_passed_to_a_kernel_aborts),
        cmocka_unit_test(test_copy_whose_ends_contradict_its_kind_aborts),
        cmocka_unit_test(test_kernels_and_copies_work_under_the_guard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
