/* `hypershard launch --min-ranks`: the smaller world it picks and the keys
 * it changes (src/cli/launch_layout.c) — the largest valid world, the
 * model-parallel sizes kept, the data-parallel shard degrees and only as
 * much of the micro-batch as the kept global batch needs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli/launch.h"
#include "hypershard/config.h"

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* The built-in config with `ov` at `world`, shrunk into [lo, hi]; the
 * changed keys joined by spaces into `keys` ("" when none). */
static bool shrink(const char *const *ov, int n, int world, int lo, int hi, int *got, char *keys) {
    hs_launch_layout orig, next;
    char dir[HS_PATH_MAX];
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_launch_layout_check(NULL, ov, n, world, &orig, dir, &e), HS_OK);
    if (!hs_launch_layout_shrink(NULL, ov, n, &orig, lo, hi, &next)) return false;
    *got = next.world;
    keys[0] = '\0';
    for (int i = 0; i < next.n_keys; i++) {
        strcat(keys, i ? " " : "");
        strcat(keys, next.keys[i]);
    }
    return true;
}

static void test_fsdp4_to_2_keeps_the_null_global_batch_of_8(void **state) {
    (void)state;
    const char *ov[] = {"fsdp_config.dp_shard_size=4", "train.micro_batch_size=2"};
    int w = 0;
    char keys[512];
    /* 3 ranks cannot split 8 sequences: 2 is the largest. */
    assert_true(shrink(ov, N(ov), 4, 2, 3, &w, keys));
    assert_int_equal(w, 2);
    assert_string_equal(keys, "fsdp_config.dp_shard_size=2 train.global_batch_size=8");
}

static void test_hsdp_2x2_to_2_keeps_the_shard_degree(void **state) {
    (void)state;
    const char *ov[] = {"fsdp_config.dp_shard_size=2", "train.micro_batch_size=2",
                        "train.global_batch_size=8"};
    int w = 0;
    char keys[512];
    assert_true(shrink(ov, N(ov), 4, 1, 3, &w, keys));
    assert_int_equal(w, 2);
    assert_string_equal(keys, "");
}

static void test_explicit_batch_of_24_allows_3_ranks(void **state) {
    (void)state;
    const char *ov[] = {"fsdp_config.dp_shard_size=4", "train.micro_batch_size=2",
                        "train.global_batch_size=24"};
    int w = 0;
    char keys[512];
    assert_true(shrink(ov, N(ov), 4, 1, 3, &w, keys));
    assert_int_equal(w, 3);
    assert_string_equal(keys, "fsdp_config.dp_shard_size=3");
}

static void test_micro_batch_shrinks_only_when_the_batch_needs_it(void **state) {
    (void)state;
    /* 12 = 1 x 4 x 3; on 2 ranks 4 x 2 does not divide 12, 3 x 2 does. */
    const char *ov[] = {"fsdp_config.dp_shard_size=3", "train.micro_batch_size=4",
                        "train.global_batch_size=12"};
    int w = 0;
    char keys[512];
    assert_true(shrink(ov, N(ov), 3, 2, 2, &w, keys));
    assert_int_equal(w, 2);
    assert_string_equal(keys, "fsdp_config.dp_shard_size=2 train.micro_batch_size=3");
}

static void test_tp_is_kept_and_the_world_stays_a_multiple_of_it(void **state) {
    (void)state;
    const char *ov[] = {"accelerator.tp_size=2", "fsdp_config.dp_shard_size=4",
                        "train.micro_batch_size=2", "train.global_batch_size=8"};
    int w = 0;
    char keys[512];
    /* 7 and 5 are no multiple of tp 2; 6 (dp 3) cannot split 8: 4. */
    assert_true(shrink(ov, N(ov), 8, 2, 7, &w, keys));
    assert_int_equal(w, 4);
    assert_string_equal(keys, "fsdp_config.dp_shard_size=2");
}

static void test_no_world_from_min_up_is_valid(void **state) {
    (void)state;
    const char *ov[] = {"fsdp_config.dp_shard_size=4", "train.micro_batch_size=2",
                        "train.global_batch_size=8"};
    int w = 0;
    char keys[512];
    assert_false(shrink(ov, N(ov), 4, 3, 3, &w, keys));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fsdp4_to_2_keeps_the_null_global_batch_of_8),
        cmocka_unit_test(test_hsdp_2x2_to_2_keeps_the_shard_degree),
        cmocka_unit_test(test_explicit_batch_of_24_allows_3_ranks),
        cmocka_unit_test(test_micro_batch_shrinks_only_when_the_batch_needs_it),
        cmocka_unit_test(test_tp_is_kept_and_the_world_stays_a_multiple_of_it),
        cmocka_unit_test(test_no_world_from_min_up_is_valid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
