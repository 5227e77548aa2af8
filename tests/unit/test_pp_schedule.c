/* Pipeline schedules (parallel/pp_schedule.c) without MPI: every schedule
 * passes the simulation check over a range of stage and micro-batch
 * counts; zb1p's first and last stages run the lists of the ZB-H1 figure
 * of Qi et al. 2024 (pp 4, 8 micro-batches); its slots are 1F1B's peak on every stage; and
 * the check refuses broken lists: a W before its B, an action run twice, a
 * missing one, and a pair of lists that wait on each other. The table of
 * schedules (config.h) says what the lists do: the schema's choices are
 * its names, a schedule's lists hold W actions exactly where it splits
 * the backward, and its chunks sit where its placement says. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hypershard/parallel.h"

#define MAX_ACTIONS 512

/* "F0 B0 W0 ..." (interleaved: "F0.1") of one stage's list. */
static void render(const hs_pp_action *a, int n, bool chunks, char *out, size_t cap) {
    static const char kinds[] = {'F', 'B', 'W'};
    size_t used = 0;
    out[0] = '\0';
    for (int k = 0; k < n && used < cap; k++) {
        int w = chunks ? snprintf(out + used, cap - used, "%s%c%d.%d", k ? " " : "",
                                  kinds[a[k].kind], a[k].micro_batch, a[k].chunk)
                       : snprintf(out + used, cap - used, "%s%c%d", k ? " " : "", kinds[a[k].kind],
                                  a[k].micro_batch);
        used += (size_t)w;
    }
}

static void expect_list(hs_pp_schedule_kind kind, int pp, int stage, int M, const char *want) {
    hs_pp_action a[MAX_ACTIONS];
    int n = (int)hs_pp_schedule_length(kind, M, 1);
    hs_error e;
    assert_int_equal(hs_pp_schedule(kind, pp, stage, M, 1, a, &e), HS_OK);
    char got[4096];
    render(a, n, false, got, sizeof got);
    if (strcmp(got, want)) fail_msg("stage %d of %d: got\n  %s\nwant\n  %s", stage, pp, got, want);
}

static void test_every_schedule_passes_the_check(void **state) {
    (void)state;
    const hs_pp_schedule_kind flat[] = {HS_PP_GPIPE, HS_PP_1F1B, HS_PP_ZB1P};
    hs_error e;
    for (int pp = 2; pp <= 8; pp++)
        for (int M = pp; M <= 3 * pp + 1; M++) {
            for (size_t k = 0; k < sizeof flat / sizeof flat[0]; k++)
                if (hs_pp_schedule_check(flat[k], pp, M, 1, &e) != HS_OK)
                    fail_msg("kind %d pp %d M %d: %s", (int)flat[k], pp, M, e.msg);
            for (int V = 2; V <= 3 && M % pp == 0; V++)
                if (hs_pp_schedule_check(HS_PP_INTERLEAVED, pp, M, V, &e) != HS_OK)
                    fail_msg("interleaved pp %d M %d V %d: %s", pp, M, V, e.msg);
            if (hs_pp_schedule_check(HS_PP_ZBV, pp, M, 2, &e) != HS_OK)
                fail_msg("zbv pp %d M %d: %s", pp, M, e.msg);
        }
}

/* The paper's ZB-H1 figure (p = 4): the first stage runs each W right
 * after its B; the last keeps p - 1 of them back and fills the end of the
 * step with them; a middle stage s keeps s back. */
static void test_zb1p_is_the_papers_zb_h1(void **state) {
    (void)state;
    expect_list(HS_PP_ZB1P, 4, 0, 8,
                "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7");
    expect_list(HS_PP_ZB1P, 4, 1, 8,
                "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7");
    expect_list(HS_PP_ZB1P, 4, 3, 8,
                "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7");
    /* without W's it is 1F1B's order */
    expect_list(HS_PP_1F1B, 4, 1, 8, "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
}

/* train.reproducibility: layout's lists: each W moved to right after its
 * B, the rest in order; the last stage of the paper's figure becomes its
 * 1F1B with the W's in place, and every eager list passes the check. */
static void test_eager_weights_follow_their_input_pass(void **state) {
    (void)state;
    hs_pp_action a[MAX_ACTIONS];
    hs_error e;
    int n = (int)hs_pp_schedule_length(HS_PP_ZB1P, 8, 1);
    assert_int_equal(hs_pp_schedule(HS_PP_ZB1P, 4, 3, 8, 1, a, &e), HS_OK);
    hs_pp_weights_eager(a, n);
    char got[4096];
    render(a, n, false, got, sizeof got);
    assert_string_equal(got, "F0 B0 W0 F1 B1 W1 F2 B2 W2 F3 B3 W3 F4 B4 W4 F5 B5 W5 F6 B6 W6 F7 B7 "
                             "W7");
    for (int pp = 2; pp <= 6; pp++)
        for (int M = pp; M <= 2 * pp + 1; M++) {
            if (hs_pp_schedule_check_eager(HS_PP_ZB1P, pp, M, 1, &e) != HS_OK)
                fail_msg("zb1p pp %d M %d: %s", pp, M, e.msg);
            if (hs_pp_schedule_check_eager(HS_PP_ZBV, pp, M, 2, &e) != HS_OK)
                fail_msg("zbv pp %d M %d: %s", pp, M, e.msg);
            for (int s = 0; s < pp; s++) {
                int len = (int)hs_pp_schedule_length(HS_PP_ZB1P, M, 1);
                hs_pp_action b[MAX_ACTIONS];
                assert_int_equal(hs_pp_schedule(HS_PP_ZB1P, pp, s, M, 1, a, &e), HS_OK);
                memcpy(b, a, sizeof *a * (size_t)len);
                hs_pp_weights_eager(b, len);
                int fb = 0;
                for (int k = 0; k < len; k++) {
                    if (b[k].kind == HS_PP_WEIGHT) {
                        assert_true(k > 0 && b[k - 1].kind == HS_PP_BACKWARD &&
                                    b[k - 1].micro_batch == b[k].micro_batch);
                        continue;
                    }
                    /* F's and B's keep their order */
                    while (a[fb].kind == HS_PP_WEIGHT) fb++;
                    assert_int_equal(a[fb].kind, b[k].kind);
                    assert_int_equal(a[fb].micro_batch, b[k].micro_batch);
                    fb++;
                }
            }
        }
}

/* A slot frees at W: every stage holds pp micro-batches at its peak, the
 * first stage's 1F1B peak. */
static void test_zb1p_slots_are_1f1b_peak(void **state) {
    (void)state;
    hs_error e;
    for (int pp = 2; pp <= 4; pp++)
        for (int s = 0; s < pp; s++) {
            int zb = 0, ofb = 0, first = 0;
            assert_int_equal(hs_pp_slots(HS_PP_ZB1P, pp, s, 2 * pp, 1, &zb, &e), HS_OK);
            assert_int_equal(hs_pp_slots(HS_PP_1F1B, pp, s, 2 * pp, 1, &ofb, &e), HS_OK);
            assert_int_equal(hs_pp_slots(HS_PP_1F1B, pp, 0, 2 * pp, 1, &first, &e), HS_OK);
            assert_int_equal(ofb, pp - s);
            assert_int_equal(zb, first);
        }
}

/* Two stages, M = 2, from written lists. */
static hs_status check_two(const char *s0, const char *s1, bool split, hs_error *e) {
    hs_pp_action l[2][16];
    int n[2] = {0, 0};
    const char *src[2] = {s0, s1};
    for (int s = 0; s < 2; s++)
        for (const char *c = src[s]; *c; c++) {
            if (*c == ' ') continue;
            hs_pp_kind k = *c == 'F' ? HS_PP_FORWARD : *c == 'B' ? HS_PP_BACKWARD : HS_PP_WEIGHT;
            l[s][n[s]++] = (hs_pp_action){k, 0, c[1] - '0'};
            c++;
        }
    const hs_pp_action *lists[2] = {l[0], l[1]};
    return hs_pp_actions_check(split ? HS_PP_ZB1P : HS_PP_1F1B, 2, 2, 1, lists, n, e);
}

static void expect_refused(const char *s0, const char *s1, bool split, const char *why) {
    hs_error e;
    hs_error_clear(&e);
    if (check_two(s0, s1, split, &e) == HS_OK)
        fail_msg("[%s] / [%s] passed the check; want: %s", s0, s1, why);
    if (!strstr(e.msg, why)) fail_msg("'%s' not in: %s", why, e.msg);
}

static void test_the_check_refuses_broken_lists(void **state) {
    (void)state;
    hs_error e;
    /* the lists the refusals below break pass */
    assert_int_equal(check_two("F0 F1 B0 W0 B1 W1", "F0 B0 F1 B1 W0 W1", true, &e), HS_OK);
    assert_int_equal(check_two("F0 F1 B0 B1", "F0 B0 F1 B1", false, &e), HS_OK);
    expect_refused("F0 F1 B0 W1 B1 W0", "F0 B0 F1 B1 W0 W1", true, "out of micro-batch order");
    expect_refused("F0 F1 W0 B0 B1 W1", "F0 B0 F1 B1 W0 W1", true,
                   "comes before the action it depends on");
    expect_refused("F0 F1 B0 B1 W0", "F0 B0 F1 B1 W0 W1", true, "runs W of chunk 0 1 times");
    expect_refused("F0 F0 F1 B0 B1", "F0 B0 F1 B1", false, "out of micro-batch order or repeated");
    expect_refused("F0 F1 B0 B1", "F0 B0 F1 B1 W0 W1", false, "out of micro-batch order");
    /* stage 0 waits for B0's gradient, which stage 1 sends only after F1,
     * whose input stage 0 sends after B0 */
    expect_refused("F0 B0 F1 B1", "F0 F1 B0 B1", false, "stage 0 waits forever at its action 1");
}

static void test_the_table_is_what_the_lists_do(void **state) {
    (void)state;
    char names[256] = "";
    for (int k = 0; k < HS_PP_N_SCHEDULES; k++) {
        const hs_pp_schedule_info *info = hs_pp_schedule_info_of((hs_pp_schedule_kind)k);
        assert_int_equal(info->kind, k);
        assert_ptr_equal(hs_pp_schedule_find(info->name), info);
        hs_pp_schedule_kind parsed = HS_PP_N_SCHEDULES;
        assert_true(hs_pp_schedule_parse(info->name, &parsed));
        assert_int_equal(parsed, k);
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? "|" : "",
                 info->name);
        int pp = 3, M = 6, V = info->min_chunks;
        assert_true(V >= 1 && V <= info->max_chunks && info->max_chunks <= HS_PP_MAX_VIRTUAL);
        int n = (int)hs_pp_schedule_length(info->kind, M, V), w = 0;
        assert_int_equal(n, hs_pp_schedule_passes(info) * M * V);
        hs_pp_action a[MAX_ACTIONS];
        hs_error e;
        assert_true(n <= MAX_ACTIONS);
        for (int s = 0; s < pp; s++) {
            assert_int_equal(hs_pp_schedule(info->kind, pp, s, M, V, a, &e), HS_OK);
            for (int i = 0; i < n; i++) w += a[i].kind == HS_PP_WEIGHT;
            for (int v = 0; v < V; v++) {
                int c = hs_pp_model_chunk(info->kind, pp, s, v);
                assert_int_equal(c, info->v_shape && v == 1 ? 2 * pp - 1 - s : s + v * pp);
                int hs = -1, hv = -1;
                hs_pp_chunk_home(info->kind, pp, c, &hs, &hv);
                assert_int_equal(hs, s);
                assert_int_equal(hv, v);
            }
        }
        assert_int_equal(w, info->splits_backward ? pp * M * V : 0);
        assert_int_equal(hs_pp_schedule_splits(info->kind), info->splits_backward);
    }
    assert_string_equal(names, HS_PP_SCHEDULE_CHOICES);
    assert_null(hs_pp_schedule_find("1F1B"));
    assert_null(hs_pp_schedule_find(NULL));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_table_is_what_the_lists_do),
        cmocka_unit_test(test_every_schedule_passes_the_check),
        cmocka_unit_test(test_zb1p_is_the_papers_zb_h1),
        cmocka_unit_test(test_eager_weights_follow_their_input_pass),
        cmocka_unit_test(test_zb1p_slots_are_1f1b_peak),
        cmocka_unit_test(test_the_check_refuses_broken_lists),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
