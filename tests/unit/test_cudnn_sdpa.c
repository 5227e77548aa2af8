/* hypershard-cudnn.so, the module attention takes cuDNN's fused SDPA
 * through (src/device/cudnn_sdpa.cpp): it loads beside the executables
 * with its libraries, exports its one entry point with every member set,
 * and on a machine without a GPU its set-up refuses with a reason and no
 * handle (the cuda backend then notes it and stays on the CUDA cores)
 * rather than crashing. Where a GPU is (/dev/nvidia0) it creates a handle
 * that names cuDNN 9. Registered in cuda builds; skips (exit 77) where the
 * build has no module or cuDNN cannot be loaded.
 * HS_TEST_DEVICES: cuda */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "device/cudnn_sdpa.h"

/* The module beside this executable: dlopen's handle, NULL (why set)
 * when it is not there or does not load. */
static void *open_module(char *why, size_t n) {
    char path[4096];
    ssize_t len = readlink("/proc/self/exe", path, sizeof path - 64);
    if (len <= 0) return snprintf(why, n, "no /proc/self/exe"), NULL;
    path[len] = '\0';
    char *slash = strrchr(path, '/');
    snprintf(slash ? slash + 1 : path, 64, "%s", HS_CUDNN_SDPA_MODULE);
    if (access(path, F_OK) != 0)
        return snprintf(why, n, "this build has no %s", HS_CUDNN_SDPA_MODULE), NULL;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(why, n, "%s", dlerror());
    return h;
}

static void *module;

static void test_module_exports_its_table_and_refuses_without_a_gpu(void **state) {
    (void)state;
    char why[512] = "";
    void *h = module;
    void *f = dlsym(h, "hs_cudnn_sdpa_api");
    assert_non_null(f);
    hs_cudnn_sdpa_api_fn api;
    memcpy(&api, &f, sizeof api);
    const hs_cudnn_sdpa_ops *ops = api();
    assert_non_null(ops);
    assert_non_null(ops->create);
    assert_non_null(ops->destroy);
    assert_non_null(ops->version);
    assert_non_null(ops->workspace);
    assert_non_null(ops->fwd);
    assert_non_null(ops->bwd);
    hs_cudnn_sdpa *c = (hs_cudnn_sdpa *)(uintptr_t)1;
    why[0] = '\0';
    bool gpu = access("/dev/nvidia0", F_OK) == 0;
    int rc = ops->create(&c, why, sizeof why);
    if (!gpu) {
        assert_int_not_equal(rc, 0);
        assert_null(c);
        assert_true(strlen(why) > 0);
        print_message("without a GPU: %s\n", why);
    } else {
        assert_int_equal(rc, 0);
        assert_non_null(c);
        assert_non_null(strstr(ops->version(c), "cuDNN 9."));
        ops->destroy(c);
    }
}

int main(void) {
    char why[512] = "";
    module = open_module(why, sizeof why);
    if (!module) {
        printf("skipped: %s\n", why);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_module_exports_its_table_and_refuses_without_a_gpu),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    dlclose(module);
    return failed;
}
