/* The reference kernels against something other than the cpu backend:
 * Muon's pieces against the optimizer's own Newton-Schulz, MoE routing and
 * permutation and the vocab-parallel loss pieces against hand values and
 * the one-device loss, and the 2-D copy against hand values (the
 * conformance suite holds cpu to these). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device/cpu_kernels.h"
#include "hypershard/device.h"
#include "hypershard/optim.h"

static hs_device *ref(void) {
    hs_device *d = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_device_create(HS_DEVICE_REFERENCE, NULL, &d, &e), HS_OK);
    return d;
}

static float wave(int64_t i) { return sinf(0.7f * (float)i + 0.3f) + 0.1f * (float)(i % 3); }

/* Tall (7 x 5) and wide (4 x 9): the fp64 reference and the optimizer's
 * fp32 NS5 agree to fp32 accuracy after five steps. */
static void test_newton_schulz_matches_the_optimizers_in_both_orientations(void **state) {
    (void)state;
    hs_device *d = ref();
    const int64_t shapes[2][2] = {{7, 5}, {4, 9}};
    for (int s = 0; s < 2; s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
        float g[64], want[64], got[64];
        for (int64_t i = 0; i < n; i++) g[i] = wave(i);
        hs_newton_schulz5(want, g, rows, cols, 5, NULL, NULL);
        d->k->muon_newton_schulz(d->stream, got, g, rows, cols, 5, NULL);
        assert_true(hs_max_rel_diff_f32(got, want, n, 1.0) < 1e-5);
    }
    hs_device_free(d);
}

static void test_muon_momentum_plain_and_nesterov(void **state) {
    (void)state;
    hs_device *d = ref();
    float buf[2] = {1.0f, -2.0f}, g[2] = {0.5f, 0.25f}, dir[2];
    d->k->muon_momentum(d->stream, dir, buf, g, 0.5f, false, 2);
    assert_true(buf[0] == 1.0f && buf[1] == -0.75f); /* 0.5 buf + g */
    assert_true(dir[0] == 1.0f && dir[1] == -0.75f);
    d->k->muon_momentum(d->stream, dir, buf, g, 0.5f, true, 2);
    assert_true(buf[0] == 1.0f && buf[1] == -0.125f);
    assert_true(dir[0] == 1.0f && dir[1] == 0.1875f); /* g + 0.5 buf */
    hs_device_free(d);
}

/* Logits {1, 2, 2, 0}: experts 1 and 2 tie; the lower comes first. */
static void test_route_takes_the_top_k_of_the_softmax_lower_expert_first_on_a_tie(void **state) {
    (void)state;
    hs_device *d = ref();
    const float logits[4] = {1.0f, 2.0f, 2.0f, 0.0f};
    float p[4];
    int32_t ex[2];
    float w[2];
    double z = exp(1.0) + 2 * exp(2.0) + 1.0;
    memcpy(p, logits, sizeof p);
    hs_moe_router r = {.renorm = false, .n_group = 1, .topk_group = 1, .scale = 1.0f};
    d->k->moe_route(d->stream, ex, w, p, NULL, 1, 4, 2, r, HS_DTYPE_F32);
    assert_int_equal(ex[0], 1);
    assert_int_equal(ex[1], 2);
    assert_float_equal(w[0], exp(2.0) / z, 1e-7);
    assert_float_equal(w[1], exp(2.0) / z, 1e-7);
    assert_float_equal(p[3], 1.0 / z, 1e-7); /* the softmax, in place */
    memcpy(p, logits, sizeof p);
    r.renorm = true;
    d->k->moe_route(d->stream, ex, w, p, NULL, 1, 4, 2, r, HS_DTYPE_F32);
    assert_float_equal(w[0], 0.5, 1e-7);
    assert_float_equal(w[1], 0.5, 1e-7);
    hs_device_free(d);
}

/* Two tokens, two slots each: pairs (0,0) (0,1) (1,0) (1,1) in grouped
 * order 2, 0, 3, 1. */
static void test_permute_gathers_token_rows_and_unpermute_sums_slots_in_order(void **state) {
    (void)state;
    hs_device *d = ref();
    const float x[4] = {1, 2, 3, 4}; /* 2 tokens of 2 */
    const int32_t row_pair[4] = {2, 0, 3, 1}, pair_row[4] = {1, 3, 0, 2};
    float xg[8], out[4], ws[2];
    d->k->moe_permute(d->stream, xg, x, row_pair, HS_DTYPE_F32, 2, 2, 2);
    const float want_xg[8] = {3, 4, 1, 2, 3, 4, 1, 2};
    assert_memory_equal(xg, want_xg, sizeof xg);
    const float y[8] = {10, 20, 30, 40, 50, 60, 70, 80}, w[4] = {0.5f, 0.25f, 1.0f, 2.0f};
    d->k->moe_unpermute(d->stream, out, y, HS_DTYPE_F32, pair_row, w, 2, 2, 2, ws);
    const float want_out[4] = {0.5f * 30 + 0.25f * 70, 0.5f * 40 + 0.25f * 80, 10 + 2.0f * 50,
                               20 + 2.0f * 60};
    assert_memory_equal(out, want_out, sizeof out);
    hs_device_free(d);
}

/* Two vocabulary shards (7 + 5 columns): the global max of the shard
 * maxima, the summed shard sums and the one shard's target logit give the
 * one-device loss. */
static void test_vocab_shard_pieces_give_the_one_device_loss(void **state) {
    (void)state;
    hs_device *d = ref();
    enum { N = 5, V = 12, V0 = 7 };
    float l[N * V], s0[N * V0], s1[N * (V - V0)], mx0[N], mx1[N], gmax[N], t0[N], t1[N];
    int32_t tgt[N] = {0, 6, 7, 11, -1};
    for (int i = 0; i < N * V; i++) l[i] = 3.0f * wave(i);
    for (int n = 0; n < N; n++) {
        memcpy(s0 + n * V0, l + n * V, V0 * sizeof(float));
        memcpy(s1 + n * (V - V0), l + n * V + V0, (V - V0) * sizeof(float));
    }
    d->k->xent_shard_max(d->stream, mx0, s0, N, V0);
    d->k->xent_shard_max(d->stream, mx1, s1, N, V - V0);
    for (int n = 0; n < N; n++) gmax[n] = mx0[n] > mx1[n] ? mx0[n] : mx1[n];
    float e0[N], e1[N];
    double loss = 0.0, want = 0.0;
    d->k->xent_shard_sums(d->stream, e0, t0, s0, gmax, tgt, N, V0, 0);
    d->k->xent_shard_sums(d->stream, e1, t1, s1, gmax, tgt, N, V - V0, V0);
    for (int n = 0; n < N; n++)
        if (tgt[n] >= 0) loss += gmax[n] + log((double)e0[n] + e1[n]) - (t0[n] + t1[n]);
    int64_t valid = 0;
    d->k->xent(d->stream, &want, &valid, NULL, l, tgt, N, V, 1.0f);
    assert_int_equal(valid, 4);
    assert_float_equal(loss, want, 1e-6 * fabs(want)); /* the sums travel in fp32 */
    hs_device_free(d);
}

static void test_copy_2d_moves_each_row_between_strides(void **state) {
    (void)state;
    hs_device *d = ref();
    const char src[12] = "abcdefghijk";
    char dst[9];
    memset(dst, '.', sizeof dst);
    d->k->copy_2d(d->stream, dst, 3, src, 4, 3, 2); /* 3 rows of 2 bytes */
    assert_memory_equal(dst, "ab.ef.ij.", 9);
    d->k->copy_2d(d->stream, dst, 3, src, 4, 0, 2); /* no rows */
    assert_memory_equal(dst, "ab.ef.ij.", 9);
    hs_device_free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_newton_schulz_matches_the_optimizers_in_both_orientations),
        cmocka_unit_test(test_muon_momentum_plain_and_nesterov),
        cmocka_unit_test(test_route_takes_the_top_k_of_the_softmax_lower_expert_first_on_a_tie),
        cmocka_unit_test(test_permute_gathers_token_rows_and_unpermute_sums_slots_in_order),
        cmocka_unit_test(test_vocab_shard_pieces_give_the_one_device_loss),
        cmocka_unit_test(test_copy_2d_moves_each_row_between_strides),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
