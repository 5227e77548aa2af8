/* device/datasheet.c: the dense GEMM peak of each GPU the table knows, by
 * the name its driver gives, for 16-bit and fp32 operands; no figure for
 * an unknown GPU or a RAM device (whose MFU takes another peak). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "hypershard/device.h"

/* A device as the cuda backend describes one: an ordinal and a name. */
static double sheet(const char *name, hs_dtype dt, const char **which) {
    hs_device d;
    memset(&d, 0, sizeof d);
    d.ordinal = 0;
    strncpy(d.model, name, sizeof d.model - 1);
    return hs_device_datasheet_flops(&d, dt, which);
}

static void test_known_gpus_by_driver_name(void **state) {
    (void)state;
    const char *w = NULL;
    assert_true(sheet("NVIDIA H100 80GB HBM3", HS_DTYPE_BF16, &w) == 989.5e12);
    assert_string_equal(w, "H100 SXM");
    assert_true(sheet("NVIDIA H100 80GB HBM3", HS_DTYPE_F32, &w) == 67.0e12);
    assert_true(sheet("NVIDIA H100 PCIe", HS_DTYPE_F16, &w) == 756.5e12);
    assert_string_equal(w, "H100 PCIe");
    assert_true(sheet("NVIDIA H100 NVL", HS_DTYPE_BF16, &w) == 835.5e12);
    assert_true(sheet("NVIDIA H200", HS_DTYPE_BF16, &w) == 989.5e12);
    assert_string_equal(w, "H200 SXM");
    assert_true(sheet("NVIDIA H200 NVL", HS_DTYPE_BF16, &w) == 835.5e12);
    assert_string_equal(w, "H200 NVL");
    assert_true(sheet("NVIDIA A100-SXM4-80GB", HS_DTYPE_F32, &w) == 19.5e12);
}

static void test_no_figure_for_an_unknown_gpu_or_a_ram_device(void **state) {
    (void)state;
    const char *w = "x";
    assert_true(sheet("NVIDIA GeForce RTX 4090", HS_DTYPE_BF16, &w) == 0.0);
    assert_null(w);
    hs_device *d = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_device_create(HS_DEVICE_CPU, NULL, &d, &e), HS_OK);
    assert_true(hs_device_datasheet_flops(d, HS_DTYPE_BF16, &w) == 0.0);
    assert_null(w);
    hs_device_free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_gpus_by_driver_name),
        cmocka_unit_test(test_no_figure_for_an_unknown_gpu_or_a_ram_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
