/* Chunk arithmetic and the per-parameter plan: RFC 000 §7.1, the examples
 * of §7.7 and the §8.3.1 table, exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fsdp/layout.h"
#include "fsdp/plan.h"
#include "hypershard/fsdp.h"

static void expect_rows(int64_t d0, int w, const int64_t *rows, const int64_t *offs) {
    for (int r = 0; r < w; r++) {
        assert_int_equal(hs_fsdp_actual_rows(d0, w, r), rows[r]);
        assert_int_equal(hs_fsdp_row_offset(d0, w, r), offs[r]);
    }
}

static void test_uneven_shard_10_rows_4_ranks_is_3_3_3_1(void **s) {
    (void)s;
    assert_int_equal(hs_fsdp_chunk_rows(10, 4), 3);
    expect_rows(10, 4, (int64_t[]){3, 3, 3, 1}, (int64_t[]){0, 3, 6, 9});
}

static void test_chunk_5_rows_2_ranks_is_3_2_offsets_0_3(void **s) {
    (void)s;
    expect_rows(5, 2, (int64_t[]){3, 2}, (int64_t[]){0, 3});
}

static void test_chunk_2_rows_4_ranks_has_empty_shards_at_offset_2(void **s) {
    (void)s;
    expect_rows(2, 4, (int64_t[]){1, 1, 0, 0}, (int64_t[]){0, 1, 2, 2});
}

static void test_chunk_skips_a_rank_when_ceil_overshoots(void **s) {
    (void)s;
    /* 5 rows over 4 ranks: C = 2, so 2/2/1/0 — torch.chunk leaves rank 3
     * empty even though a balanced split would give it a row. */
    expect_rows(5, 4, (int64_t[]){2, 2, 1, 0}, (int64_t[]){0, 2, 4, 5});
}

static void test_actual_rows_sum_to_d0_for_every_shape(void **s) {
    (void)s;
    for (int64_t d0 = 0; d0 <= 40; d0++)
        for (int w = 1; w <= 9; w++) {
            int64_t sum = 0, expect_off = 0;
            for (int r = 0; r < w; r++) {
                int64_t a = hs_fsdp_actual_rows(d0, w, r);
                assert_true(a >= 0 && a <= hs_fsdp_chunk_rows(d0, w));
                assert_int_equal(hs_fsdp_row_offset(d0, w, r), expect_off);
                expect_off += a;
                sum += a;
            }
            assert_int_equal(sum, d0);
        }
}

/* §8.3.1 as a table: shape, W, then per rank actual rows / offset. */
typedef struct table_row {
    int64_t d0, d1;
    int w;
    int64_t actual[4], offset[4];
    int64_t padded_rows;
    hs_fsdp_pack_kind kind;
} table_row;

static const table_row rfc_table[] = {
    {5, 3, 2, {3, 2}, {0, 3}, 3, HS_FSDP_PACK_DIM0_PADDED},
    {2, 3, 4, {1, 1, 0, 0}, {0, 1, 2, 2}, 1, HS_FSDP_PACK_DIM0_PADDED},
    {10, 3, 4, {3, 3, 3, 1}, {0, 3, 6, 9}, 3, HS_FSDP_PACK_DIM0_PADDED},
    {8, 3, 2, {4, 4}, {0, 4}, 4, HS_FSDP_PACK_DIM0_EVEN},
};

static void test_rfc_8_3_1_table_shapes_offsets_and_logical_meta(void **s) {
    (void)s;
    hs_error e;
    for (size_t k = 0; k < sizeof rfc_table / sizeof rfc_table[0]; k++) {
        const table_row *t = &rfc_table[k];
        int64_t shape[2] = {t->d0, t->d1};
        for (int r = 0; r < t->w; r++) {
            hs_fsdp_plan p;
            assert_int_equal(hs_fsdp_plan_build(&p, "w", 2, shape, 0, t->w, r, &e), HS_OK);
            assert_int_equal(p.kind, t->kind);
            /* every rank sees the same logical global shape */
            assert_int_equal(p.unpacked_shape[0], t->d0);
            assert_int_equal(p.unpacked_shape[1], t->d1);
            assert_int_equal(p.actual_sharded_shape[0], t->actual[r]);
            assert_int_equal(p.actual_sharded_shape[1], t->d1); /* kept even when 0 rows */
            assert_int_equal(p.layout.row_offset, t->offset[r]);
            assert_int_equal(p.padded_sharded_shape[0], t->padded_rows);
            assert_int_equal(p.padded_sharded_shape[1], t->d1);
            assert_int_equal(p.padded_unsharded_shape[0], t->padded_rows * t->w);
            assert_int_equal(p.packed_shape[0], t->w);
            assert_int_equal(p.packed_shape[1], t->padded_rows * t->d1);
            assert_int_equal(p.actual_sharded_numel, t->actual[r] * t->d1);
            assert_int_equal(p.padded_sharded_numel, t->padded_rows * t->d1);
        }
    }
}

static void test_even_8x3_over_2_has_actual_equal_padded(void **s) {
    (void)s;
    hs_error e;
    hs_fsdp_plan p;
    assert_int_equal(hs_fsdp_plan_build(&p, "w", 2, (int64_t[]){8, 3}, 0, 2, 1, &e), HS_OK);
    assert_true(p.layout.even);
    assert_int_equal(p.actual_sharded_numel, p.padded_sharded_numel);
    assert_int_equal(p.padded_unsharded_numel, p.unpacked_numel);
}

static void test_non_dim0_uneven_is_rejected_naming_fqn_shape_dim_world(void **s) {
    (void)s;
    hs_error e;
    hs_error_clear(&e);
    hs_fsdp_plan p;
    hs_status st = hs_fsdp_plan_build(&p, "model.layers.0.mlp.up_proj.weight", 2, (int64_t[]){8, 5},
                                      1, 2, 0, &e);
    assert_int_equal(st, HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "model.layers.0.mlp.up_proj.weight"));
    assert_non_null(strstr(e.msg, "[8, 5]"));
    assert_non_null(strstr(e.msg, "dim 1"));
    assert_non_null(strstr(e.msg, "over 2 ranks"));
}

static void test_scalar_parameter_is_rejected(void **s) {
    (void)s;
    hs_error e;
    hs_error_clear(&e);
    hs_fsdp_plan p;
    assert_int_equal(hs_fsdp_plan_build(&p, "scale", 0, (int64_t[]){1}, 0, 2, 0, &e),
                     HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "scale"));
    assert_non_null(strstr(e.msg, "scalar"));
}

static void test_zero_row_parameter_has_a_fixed_empty_contract(void **s) {
    (void)s;
    hs_error e;
    hs_fsdp_plan p;
    assert_int_equal(hs_fsdp_plan_build(&p, "w", 2, (int64_t[]){0, 7}, 0, 4, 3, &e), HS_OK);
    assert_true(p.layout.even);
    assert_int_equal(p.actual_sharded_shape[0], 0);
    assert_int_equal(p.actual_sharded_shape[1], 7);
    assert_int_equal(p.padded_sharded_numel, 0);
}

static void test_zero_tail_clears_only_the_padding_rows(void **s) {
    (void)s;
    hs_error e;
    hs_fsdp_plan p;
    assert_int_equal(hs_fsdp_plan_build(&p, "w", 2, (int64_t[]){5, 3}, 0, 2, 0, &e), HS_OK);
    float buf[18];
    for (int i = 0; i < 18; i++) buf[i] = 1.0f + (float)i;
    hs_device *d = NULL;
    assert_int_equal(hs_device_create(HS_DEVICE_CPU, NULL, &d, &e), HS_OK);
    hs_fsdp_plan_zero_tail(d, &p, buf, HS_DTYPE_F32);
    hs_device_free(d);
    for (int i = 0; i < 15; i++) assert_true(buf[i] == 1.0f + (float)i);
    for (int i = 15; i < 18; i++) assert_true(buf[i] == 0.0f);
}

static void test_tp_then_fsdp_on_dim0_is_strided_example_c(void **s) {
    (void)s;
    /* global (10, 2), tp = 2, fsdp = 2: (dp, tp) -> rows / global offset */
    const int64_t want_rows[2][2] = {{3, 3}, {2, 2}};
    const int64_t want_off[2][2] = {{0, 5}, {3, 8}};
    for (int dp = 0; dp < 2; dp++)
        for (int tp = 0; tp < 2; tp++) {
            int64_t rows;
            assert_int_equal(hs_fsdp_strided_row_offset(10, 2, tp, 2, dp, &rows), want_off[dp][tp]);
            assert_int_equal(rows, want_rows[dp][tp]);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uneven_shard_10_rows_4_ranks_is_3_3_3_1),
        cmocka_unit_test(test_chunk_5_rows_2_ranks_is_3_2_offsets_0_3),
        cmocka_unit_test(test_chunk_2_rows_4_ranks_has_empty_shards_at_offset_2),
        cmocka_unit_test(test_chunk_skips_a_rank_when_ceil_overshoots),
        cmocka_unit_test(test_actual_rows_sum_to_d0_for_every_shape),
        cmocka_unit_test(test_rfc_8_3_1_table_shapes_offsets_and_logical_meta),
        cmocka_unit_test(test_even_8x3_over_2_has_actual_equal_padded),
        cmocka_unit_test(test_non_dim0_uneven_is_rejected_naming_fqn_shape_dim_world),
        cmocka_unit_test(test_scalar_parameter_is_rejected),
        cmocka_unit_test(test_zero_row_parameter_has_a_fixed_empty_contract),
        cmocka_unit_test(test_zero_tail_clears_only_the_padding_rows),
        cmocka_unit_test(test_tp_then_fsdp_on_dim0_is_strided_example_c),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
