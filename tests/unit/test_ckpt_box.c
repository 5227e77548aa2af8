/* ckpt/: the resharding math — per-dimension interval intersection of a
 * saved chunk with a target chunk on global offsets, and the copy of that
 * box between two row-major chunks (RFC 000 §7.8: a load reads the
 * overlap of saved and target chunks). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt/ckpt_internal.h"
#include "hypershard/fsdp.h"

static void test_w2_chunks_of_5_rows_against_w4_targets_give_2_2_1_0_rows(void **s) {
    (void)s;
    /* saved: W=2 -> rows [0,3) [3,5); target W=4 -> [0,2) [2,4) [4,5) [5,5) */
    int64_t shape[2] = {5, 3};
    int64_t want[4][2] = {{2, 0}, {1, 1}, {0, 1}, {0, 0}}; /* rows from saved chunk 0, 1 */
    for (int t = 0; t < 4; t++)
        for (int k = 0; k < 2; k++) {
            int64_t so[2] = {hs_fsdp_row_offset(5, 2, k), 0},
                    ss[2] = {hs_fsdp_actual_rows(5, 2, k), 3};
            int64_t to[2] = {hs_fsdp_row_offset(5, 4, t), 0},
                    ts[2] = {hs_fsdp_actual_rows(5, 4, t), 3};
            int64_t oo[2], os[2];
            bool any = hs_ckpt_box_intersect(2, so, ss, to, ts, oo, os);
            assert_int_equal(any, want[t][k] > 0);
            if (any) {
                assert_int_equal(os[0], want[t][k]);
                assert_int_equal(os[1], shape[1]);
            }
        }
}

static void test_zero_length_target_intersects_nothing(void **s) {
    (void)s;
    int64_t so[1] = {0}, ss[1] = {3}, to[1] = {3}, ts[1] = {0}, oo[1], os[1];
    assert_false(hs_ckpt_box_intersect(1, so, ss, to, ts, oo, os));
    int64_t to2[1] = {1}, ts2[1] = {0};
    assert_false(hs_ckpt_box_intersect(1, so, ss, to2, ts2, oo, os));
}

static void test_touching_chunks_do_not_intersect(void **s) {
    (void)s;
    int64_t ao[2] = {0, 0}, as[2] = {3, 4}, bo[2] = {3, 0}, bs[2] = {2, 4}, oo[2], os[2];
    assert_false(hs_ckpt_box_intersect(2, ao, as, bo, bs, oo, os));
}

static void test_2d_boxes_intersect_per_dimension(void **s) {
    (void)s;
    int64_t ao[2] = {1, 2}, as[2] = {4, 5}, bo[2] = {3, 0}, bs[2] = {4, 4}, oo[2], os[2];
    assert_true(hs_ckpt_box_intersect(2, ao, as, bo, bs, oo, os));
    assert_int_equal(oo[0], 3);
    assert_int_equal(os[0], 2); /* [3,5) */
    assert_int_equal(oo[1], 2);
    assert_int_equal(os[1], 2); /* [2,4) */
}

/* Global tensor value at (i, j) of a [R, C] tensor. */
static float g2(int64_t i, int64_t j) { return (float)(i * 100 + j); }

static void test_copy_dim0_overlap_moves_whole_rows(void **s) {
    (void)s;
    /* saved chunk rows [3,5) of [5,3]; target rows [2,4): overlap is row 3 */
    float src[2 * 3], dst[2 * 3];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) src[i * 3 + j] = g2(3 + i, j);
    memset(dst, 0, sizeof dst);
    int64_t so[2] = {3, 0}, ss[2] = {2, 3}, to[2] = {2, 0}, ts[2] = {2, 3}, oo[2], os[2];
    assert_true(hs_ckpt_box_intersect(2, so, ss, to, ts, oo, os));
    hs_ckpt_box_copy(2, oo, os, sizeof(float), src, so, ss, dst, to, ts);
    for (int j = 0; j < 3; j++) {
        assert_true(dst[0 * 3 + j] == 0.0f);     /* row 2 is not in this saved chunk */
        assert_true(dst[1 * 3 + j] == g2(3, j)); /* row 3 is */
    }
}

static void test_copy_interior_2d_block_between_column_chunks(void **s) {
    (void)s;
    /* saved chunk [0:4, 0:5] of a [4, 8] tensor; target chunk [1:3, 2:8] */
    float src[4 * 5], dst[2 * 6];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++) src[i * 5 + j] = g2(i, j);
    for (int k = 0; k < 12; k++) dst[k] = -1.0f;
    int64_t so[2] = {0, 0}, ss[2] = {4, 5}, to[2] = {1, 2}, ts[2] = {2, 6}, oo[2], os[2];
    assert_true(hs_ckpt_box_intersect(2, so, ss, to, ts, oo, os));
    hs_ckpt_box_copy(2, oo, os, sizeof(float), src, so, ss, dst, to, ts);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 6; j++) {
            float want = 2 + j < 5 ? g2(1 + i, 2 + j) : -1.0f;
            assert_true(dst[i * 6 + j] == want);
        }
}

static void test_copy_3d_box_with_16_bit_elements(void **s) {
    (void)s;
    /* [3, 4, 5] tensor; src holds dims0 [1:3] whole; dst holds [0:3, 1:3, 0:5] */
    uint16_t src[2 * 4 * 5], dst[3 * 2 * 5];
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 5; c++)
                src[(a * 4 + b) * 5 + c] = (uint16_t)((1 + a) * 100 + b * 10 + c);
    memset(dst, 0xff, sizeof dst);
    int64_t so[3] = {1, 0, 0}, ss[3] = {2, 4, 5}, to[3] = {0, 1, 0}, ts[3] = {3, 2, 5}, oo[3],
            os[3];
    assert_true(hs_ckpt_box_intersect(3, so, ss, to, ts, oo, os));
    hs_ckpt_box_copy(3, oo, os, sizeof(uint16_t), src, so, ss, dst, to, ts);
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 5; c++) {
                uint16_t want = a == 0 ? 0xffff : (uint16_t)(a * 100 + (1 + b) * 10 + c);
                assert_int_equal(dst[(a * 2 + b) * 5 + c], want);
            }
}

/* Records each run hs_ckpt_box_move hands over, and copies it. */
typedef struct runs {
    int n;
    size_t bytes[8];
} runs;

static void record_run(void *ctx, void *dst, const void *src, size_t bytes) {
    runs *r = ctx;
    if (r->n < 8) r->bytes[r->n] = bytes;
    r->n++;
    memcpy(dst, src, bytes);
}

static void test_move_merges_rows_into_one_run_per_contiguous_block(void **s) {
    (void)s;
    /* a dim-0 overlap of [4, 3, 5] chunks spanning dims 1 and 2: one run */
    uint16_t src[4 * 3 * 5], dst[2 * 3 * 5];
    for (int k = 0; k < 60; k++) src[k] = (uint16_t)k;
    runs r = {0};
    int64_t so[3] = {0, 0, 0}, ss[3] = {4, 3, 5}, to[3] = {1, 0, 0}, ts[3] = {2, 3, 5};
    hs_ckpt_box_move(3, to, ts, sizeof(uint16_t), src, so, ss, dst, to, ts, record_run, &r);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.bytes[0], sizeof dst);
    assert_memory_equal(dst, src + 15, sizeof dst);
    /* a column block [1:3, 2:5] of [4, 8] chunks: one run per row, and the
     * same bytes as hs_ckpt_box_copy */
    float a[4 * 8], b[2 * 3], c[2 * 3];
    for (int k = 0; k < 32; k++) a[k] = (float)k;
    int64_t ao[2] = {0, 0}, as[2] = {4, 8}, bo[2] = {1, 2}, bs[2] = {2, 3};
    r = (runs){0};
    hs_ckpt_box_move(2, bo, bs, sizeof(float), a, ao, as, b, bo, bs, record_run, &r);
    hs_ckpt_box_copy(2, bo, bs, sizeof(float), a, ao, as, c, bo, bs);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.bytes[0], 3 * sizeof(float));
    assert_memory_equal(b, c, sizeof b);
    assert_true(b[0] == 10.0f && b[3] == 18.0f);
}

static void test_box_str_prints_half_open_ranges(void **s) {
    (void)s;
    char buf[64];
    int64_t off[2] = {3, 0}, size[2] = {2, 4};
    assert_string_equal(hs_ckpt_box_str(2, off, size, buf, sizeof buf), "[3:5, 0:4]");
}

static void test_box_str_of_an_end_past_int64_prints_start_and_size(void **s) {
    (void)s;
    char buf[96];
    /* a damaged metadata file's chunk is named in the error, not wrapped */
    hs_ckpt_box_str(2, (int64_t[]){INT64_MAX - 1, 0}, (int64_t[]){2, 3}, buf, sizeof buf);
    assert_string_equal(buf, "[9223372036854775806:+2, 0:3]");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_w2_chunks_of_5_rows_against_w4_targets_give_2_2_1_0_rows),
        cmocka_unit_test(test_zero_length_target_intersects_nothing),
        cmocka_unit_test(test_touching_chunks_do_not_intersect),
        cmocka_unit_test(test_2d_boxes_intersect_per_dimension),
        cmocka_unit_test(test_copy_dim0_overlap_moves_whole_rows),
        cmocka_unit_test(test_copy_interior_2d_block_between_column_chunks),
        cmocka_unit_test(test_copy_3d_box_with_16_bit_elements),
        cmocka_unit_test(test_move_merges_rows_into_one_run_per_contiguous_block),
        cmocka_unit_test(test_box_str_prints_half_open_ranges),
        cmocka_unit_test(test_box_str_of_an_end_past_int64_prints_start_and_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
