/* hypershard-cudnn.so, the module attention takes cuDNN's fused SDPA
 * through (src/device/cudnn_sdpa.cpp): it loads beside the executables
 * with its libraries, exports its one entry point with every member set,
 * and on a machine without a GPU its set-up refuses with a reason and no
 * handle (the cuda backend then notes it and stays on the CUDA cores)
 * rather than crashing. Where a GPU is (/dev/nvidia0) it creates a handle
 * that names cuDNN 9. Without a GPU too, cuDNN's frontend validates the
 * forward and backward graphs the module builds, for Ampere (sm 80) and
 * Hopper (sm 90): the GPU checks' shapes (the 1.1B Llama's GQA at head
 * dim 64, GPT-2 small's MHA, head dim 128 in fp16, MQA at an odd length)
 * pass, and a head dim cuDNN does not tile is refused with its reason.
 * Registered in cuda builds; skips (exit 77) where the build has no module
 * or cuDNN cannot be loaded.
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
    assert_non_null(ops->check);
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

static void test_the_graphs_gpu_runs_use_validate_and_a_bad_head_dim_is_refused(void **state) {
    (void)state;
    void *f = dlsym(module, "hs_cudnn_sdpa_api");
    assert_non_null(f);
    hs_cudnn_sdpa_api_fn api;
    memcpy(&api, &f, sizeof api);
    const hs_cudnn_sdpa_ops *ops = api();
    const hs_cudnn_sdpa_dims ok[] = {
        {.B = 4, .NH = 32, .KVH = 4, .T = 2048, .HD = 64, .dt = 1},  /* 1.1B, bf16 */
        {.B = 8, .NH = 12, .KVH = 12, .T = 1024, .HD = 64, .dt = 1}, /* GPT-2 small */
        {.B = 2, .NH = 16, .KVH = 8, .T = 512, .HD = 128, .dt = 2},  /* fp16, HD 128 */
        {.B = 1, .NH = 4, .KVH = 1, .T = 7, .HD = 8, .dt = 1},       /* MQA, odd T */
    };
    char why[512];
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        for (int bwd = 0; bwd < 2; bwd++)
            for (int sm = 80; sm <= 90; sm += 10) {
                why[0] = '\0';
                int rc = ops->check(&ok[i], bwd, sm, why, sizeof why);
                if (rc != 0)
                    print_message("case %zu %s sm %d: %s\n", i, bwd ? "bwd" : "fwd", sm, why);
                assert_int_equal(rc, 0);
            }
    hs_cudnn_sdpa_dims bad = {.B = 1, .NH = 4, .KVH = 4, .T = 16, .HD = 60, .dt = 1};
    for (int bwd = 0; bwd < 2; bwd++) {
        why[0] = '\0';
        assert_int_not_equal(ops->check(&bad, bwd, 90, why, sizeof why), 0);
        assert_non_null(strstr(why, "head dim 60"));
        assert_non_null(strstr(why, "multiple of 8"));
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
        cmocka_unit_test(test_the_graphs_gpu_runs_use_validate_and_a_bad_head_dim_is_refused),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    dlclose(module);
    return failed;
}
