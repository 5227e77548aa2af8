/* Backends in host RAM (cpu, reference): both are compiled and named,
 * streams and events complete at once, memset and copies on a stream have
 * finished when they return. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hypershard/device.h"

static void test_reference_is_a_compiled_kind_with_its_name(void **state) {
    (void)state;
    hs_device_kind k;
    assert_true(hs_device_kind_parse("reference", &k) && k == HS_DEVICE_REFERENCE);
    assert_string_equal(hs_device_kind_name(HS_DEVICE_REFERENCE), "reference");
    assert_true(hs_device_kind_compiled(HS_DEVICE_CPU));
    assert_true(hs_device_kind_compiled(HS_DEVICE_REFERENCE));
    /* cuda is compiled exactly when its kernel table is there */
    assert_true(hs_device_kind_compiled(HS_DEVICE_CUDA) ==
                (hs_device_kind_kernels(HS_DEVICE_CUDA) != NULL));
    assert_ptr_equal(hs_device_kind_kernels(HS_DEVICE_KIND_COUNT), NULL);
    assert_false(hs_device_kind_compiled(HS_DEVICE_KIND_COUNT));
    hs_device *d = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_device_create(HS_DEVICE_REFERENCE, NULL, &d, &e), HS_OK);
    assert_string_equal(d->name, "reference");
    assert_non_null(d->k->gemm);
    hs_device_free(d);
}

/* Work on one stream, an event recorded after it, a second stream waiting
 * on the event: on these backends every step is done on return. */
static void run_ordered_work(hs_device_kind kind) {
    hs_device *d = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_device_create(kind, NULL, &d, &e), HS_OK);
    hs_stream *s1 = NULL, *s2 = NULL;
    hs_event *ev = NULL;
    assert_int_equal(hs_stream_create(d, &s1, &e), HS_OK);
    assert_int_equal(hs_stream_create(d, &s2, &e), HS_OK);
    assert_int_equal(hs_event_create(d, &ev, &e), HS_OK);
    unsigned char *x = hs_device_alloc(d, 1000), *h = hs_host_alloc(d, 1000);
    hs_device_memset(s1, x, 7, 1000);
    hs_event_record(ev, s1);
    hs_stream_wait(s2, ev);
    hs_device_copy_async(s2, h, x, 1000, HS_COPY_D2H);
    hs_event_synchronize(ev);
    hs_stream_synchronize(s2);
    hs_device_synchronize(d);
    for (int i = 0; i < 1000; i++) assert_int_equal(h[i], 7);
    hs_device_memset(s1, x, 0, 0); /* zero bytes: nothing happens */
    assert_int_equal(x[0], 7);
    hs_device_free_mem(d, x), hs_host_free(d, h);
    hs_event_free(ev), hs_stream_free(s1), hs_stream_free(s2), hs_stream_free(NULL);
    hs_device_free(d);
}

static void test_cpu_stream_work_has_finished_when_each_call_returns(void **state) {
    (void)state;
    run_ordered_work(HS_DEVICE_CPU);
}

static void test_reference_stream_work_has_finished_when_each_call_returns(void **state) {
    (void)state;
    run_ordered_work(HS_DEVICE_REFERENCE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_is_a_compiled_kind_with_its_name),
        cmocka_unit_test(test_cpu_stream_work_has_finished_when_each_call_returns),
        cmocka_unit_test(test_reference_stream_work_has_finished_when_each_call_returns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
