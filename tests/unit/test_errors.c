/* The error policy (docs/errors.md) where memory runs out: an allocation
 * that a pool's limit or the device refuses comes back NULL with nothing
 * counted, and the report is HS_ERR_OOM (exit 1) naming the pool, what was
 * being allocated and the bytes; a kernel's failure is kept on its device;
 * hs_comm_abort ends the process with the status's exit code. Limits stand
 * in for a full machine, so every case fails for certain and the same way
 * under the sanitizers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "device/device_backend.h"
#include "fsdp/mem.h"
#include "hypershard/comm.h"
#include "hypershard/optim.h"

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (!strstr((hay), (needle))) fail_msg("'%s' not in:\n%s", (needle), (hay));               \
    } while (0)

static void test_pool_refuses_past_its_limit_and_counts_nothing(void **state) {
    (void)state;
    hs_pool p;
    hs_pool_init(&p, "test_pool");
    hs_pool_set_limit(&p, 4096);
    void *a = hs_pool_alloc(&p, 1000);
    assert_non_null(a);
    assert_null(hs_pool_alloc(&p, 3097)); /* 1000 + 3097 = 4097 > 4096 */
    assert_null(hs_pool_calloc(&p, 5000));
    assert_int_equal(hs_pool_current(&p), 1000);
    assert_int_equal(hs_pool_peak(&p), 1000);
    void *b = hs_pool_alloc(&p, 3096); /* exactly the limit */
    assert_non_null(b);
    assert_int_equal(hs_pool_current(&p), 4096);
    hs_pool_free(&p, a);
    hs_pool_free(&p, b);
    assert_int_equal(hs_pool_current(&p), 0);
}

static void test_pool_oom_names_the_pool_what_and_how_much(void **state) {
    (void)state;
    hs_pool p;
    hs_pool_init(&p, "test_pool");
    hs_pool_set_limit(&p, 4096);
    void *a = hs_pool_alloc(&p, 1000);
    assert_null(hs_pool_alloc(&p, 3 << 20));
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_pool_oom(&p, 3 << 20, "the staging buffer of group 'tp'", &e), HS_ERR_OOM);
    assert_int_equal(e.code, HS_ERR_OOM);
    assert_int_equal(hs_status_exit_code(e.code), 1);
    assert_contains(e.msg, "out of memory: the test_pool pool could not allocate 3145728 bytes "
                           "(3.0 MiB) for the staging buffer of group 'tp'; in use 1000 bytes, "
                           "peak 1000, limit 4096");
    assert_contains(e.msg, "\n  `hypershard plan` shows what each rank holds");
    hs_pool_free(&p, a);
}

static void test_device_alloc_past_the_device_pool_limit_is_null_and_reported(void **state) {
    (void)state;
    hs_device *d = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_device_create(HS_DEVICE_CPU, NULL, &d, &e), HS_OK);
    hs_pool_set_limit(&d->device_pool, 1 << 20);
    void *a = hs_device_alloc(d, 512 << 10);
    assert_non_null(a);
    assert_int_equal(hs_device_status(d, NULL), HS_OK);
    assert_null(hs_device_alloc(d, 768 << 10));
    assert_int_equal(hs_pool_current(&d->device_pool), 512 << 10);
    assert_int_equal(hs_pool_peak(&d->device_pool), 512 << 10); /* the refusal left no trace */
    assert_int_equal(hs_device_oom(d, 768 << 10, "the test activations", &e), HS_ERR_OOM);
    assert_contains(e.msg, "out of memory: the device pool of the cpu device could not allocate "
                           "786432 bytes (0.8 MiB) for the test activations; in use 524288 "
                           "bytes, peak 524288");
    assert_contains(e.msg, "limit 1048576");
    /* Kept on the device too, for a caller that drops the NULL. */
    hs_error kept;
    hs_error_clear(&kept);
    assert_int_equal(hs_device_status(d, &kept), HS_ERR_OOM);
    assert_contains(kept.msg, "could not allocate 786432 bytes (0.8 MiB) for a device buffer");
    hs_device_free_mem(d, a);
    assert_int_equal(hs_pool_current(&d->device_pool), 0);
    hs_device_free(d);
}

static void *refuse(void *ctx, size_t bytes) {
    (void)ctx, (void)bytes;
    return NULL;
}
static void release(void *ctx, void *p) { (void)ctx, free(p); }

static void test_caching_allocator_refused_by_its_source_returns_null(void **state) {
    (void)state;
    hs_mem_cache *c = NULL;
    assert_int_equal(hs_mem_cache_create("refusing", refuse, release, NULL, &c, NULL), HS_OK);
    assert_null(hs_mem_cache_alloc(c, 4096));
    hs_mem_cache_stats st = hs_mem_cache_stats_get(c);
    assert_int_equal(st.in_use, 0);
    assert_int_equal(st.reserved, 0);
    hs_mem_cache_free_all(c);
}

static void test_device_keeps_the_first_kernel_failure_for_its_status(void **state) {
    (void)state;
    hs_device *d = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_device_create(HS_DEVICE_REFERENCE, NULL, &d, &e), HS_OK);
    assert_int_equal(hs_device_status(d, &e), HS_OK);
    hs_kernel_oom(d->stream, "attention: %d bytes of scratch", 4096);
    hs_kernel_oom(d->stream, "rmsnorm backward: %d bytes", 8);
    hs_error got;
    hs_error_clear(&got);
    assert_int_equal(hs_device_status(d, &got), HS_ERR_OOM);
    assert_contains(got.msg, "out of memory: attention: 4096 bytes of scratch");
    assert_null(strstr(got.msg, "rmsnorm"));
    assert_int_equal(hs_device_status(d, NULL), HS_ERR_OOM); /* it stays */
    hs_device_free(d);
}

static void test_fsdp_allocation_names_the_parameter_and_its_memory_kind(void **state) {
    (void)state;
    hs_device *d = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_device_create(HS_DEVICE_CPU, NULL, &d, &e), HS_OK);
    hs_fsdp_mem m;
    hs_fsdp_mem_init(&m, d);
    hs_pool_set_limit(&d->device_pool, 4096);
    void *held = hs_fsdp_mem_alloc(&m, HS_FSDP_MEM_PARAM, 1024, "the sharded storage", "w0", &e);
    assert_non_null(held);
    assert_null(hs_fsdp_mem_alloc_uninit(&m, HS_FSDP_MEM_PARAM, 8192, "the all-gather output",
                                         "layers.0.attn.wq.weight", &e));
    assert_int_equal(e.code, HS_ERR_OOM);
    assert_contains(e.msg, "could not allocate 8192 bytes (0.0 MiB) for the all-gather output of "
                           "layers.0.attn.wq.weight (FSDP parameter memory: 1024 bytes held)");
    assert_int_equal(m.current[HS_FSDP_MEM_PARAM], 1024);
    hs_fsdp_mem_free(&m, HS_FSDP_MEM_PARAM, held, 1024);
    hs_device_free(d);
}

static void test_optimizer_state_past_its_pool_limit_is_an_error_naming_the_state(void **state) {
    (void)state;
    enum { N = 256 };
    float w[N] = {0}, g[N] = {0};
    hs_optim_param p = {.fqn = "layers.0.w",
                        .data = w,
                        .dtype = HS_DTYPE_F32,
                        .grad = g,
                        .numel = N,
                        .decay = true};
    hs_optim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.target, sizeof cfg.target, "adamw");
    cfg.lr = 1e-3, cfg.betas[0] = 0.9, cfg.betas[1] = 0.95, cfg.eps = 1e-8;
    snprintf(cfg.schedule.decay, sizeof cfg.schedule.decay, "linear");
    hs_pool pool;
    hs_pool_init(&pool, "optimizer");
    hs_pool_set_limit(&pool, N * sizeof(float) + 16); /* room for exp_avg, not exp_avg_sq */
    hs_optim *o = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_optim_create(&cfg, &p, 1, NULL, &pool, &o, &e), HS_ERR_OOM);
    assert_null(o);
    assert_contains(e.msg, "the optimizer pool could not allocate 1024 bytes");
    assert_contains(e.msg, "for the optimizer's exp_avg_sq of layers.0.w; in use 1024 bytes");
    assert_int_equal(hs_pool_current(&pool), 0); /* what it held was freed */
}

/* hs_comm_abort(NULL, e) in a child without MPI: its exit status. */
static int abort_status(hs_status code) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(99);
        hs_error e;
        hs_error_set(&e, code, "the test's failure");
        hs_comm_abort(NULL, &e);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void test_comm_abort_ends_with_the_exit_code_of_the_status(void **state) {
    (void)state;
    assert_int_equal(abort_status(HS_ERR_OOM), 1);
    assert_int_equal(abort_status(HS_ERR_IO), 1);
    assert_int_equal(abort_status(HS_ERR_CONFIG), 2);
    assert_int_equal(abort_status(HS_ERR_USAGE), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_refuses_past_its_limit_and_counts_nothing),
        cmocka_unit_test(test_pool_oom_names_the_pool_what_and_how_much),
        cmocka_unit_test(test_device_alloc_past_the_device_pool_limit_is_null_and_reported),
        cmocka_unit_test(test_caching_allocator_refused_by_its_source_returns_null),
        cmocka_unit_test(test_device_keeps_the_first_kernel_failure_for_its_status),
        cmocka_unit_test(test_fsdp_allocation_names_the_parameter_and_its_memory_kind),
        cmocka_unit_test(test_optimizer_state_past_its_pool_limit_is_an_error_naming_the_state),
        cmocka_unit_test(test_comm_abort_ends_with_the_exit_code_of_the_status),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
