/* The rank layout arithmetic (mesh.h): coordinates and group members are
 * checked against an independent enumeration over nested loops, for one
 * hand-checked 16-rank layout and for every valid layout of many worlds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hypershard/mesh.h"

/* ------------------------------------------------ independent enumeration */

typedef struct ref_coords {
    int pp, dp, cp, tp, f, frep, fshard, x, ep, edp, erep, eshard;
} ref_coords;

/* Built by walking the nested loops in layout order (pp, dp, cp, tp), so a
 * rank's coordinates come from its position in the walk, never from
 * dividing its number. */
static ref_coords *ref_table(const hs_topology *t) {
    ref_coords *tab = calloc((size_t)t->world, sizeof *tab);
    int r = 0;
    for (int pp = 0; pp < t->pp; pp++)
        for (int dp = 0; dp < t->dp; dp++)
            for (int cp = 0; cp < t->cp; cp++)
                for (int tp = 0; tp < t->tp; tp++, r++) {
                    ref_coords *c = &tab[r];
                    *c = (ref_coords){.pp = pp, .dp = dp, .cp = cp, .tp = tp};
                    c->f = dp * t->cp + cp;
                    c->fshard = c->f % t->dp_shard;
                    c->frep = c->f / t->dp_shard;
                    c->x = c->f * t->tp + tp;
                    c->ep = c->x % t->ep;
                    c->edp = c->x / t->ep;
                    c->eshard = c->edp % t->edp_shard;
                    c->erep = c->edp / t->edp_shard;
                }
    assert_int_equal(r, t->world);
    return tab;
}

/* Two ranks share a `dim` group when they agree on every coordinate except
 * the dim's own (and its pp stage); `key` is the rank within the group. */
static bool ref_same_group(hs_mesh_dim d, const ref_coords *a, const ref_coords *b) {
    switch (d) {
    case HS_DIM_PP: return a->dp == b->dp && a->cp == b->cp && a->tp == b->tp;
    case HS_DIM_DP: return a->pp == b->pp && a->cp == b->cp && a->tp == b->tp;
    case HS_DIM_CP: return a->pp == b->pp && a->dp == b->dp && a->tp == b->tp;
    case HS_DIM_TP: return a->pp == b->pp && a->dp == b->dp && a->cp == b->cp;
    case HS_DIM_DP_CP:
    case HS_DIM_FSDP: return a->pp == b->pp && a->tp == b->tp;
    case HS_DIM_FSDP_REPLICATE: return a->pp == b->pp && a->tp == b->tp && a->fshard == b->fshard;
    case HS_DIM_FSDP_SHARD: return a->pp == b->pp && a->tp == b->tp && a->frep == b->frep;
    case HS_DIM_EDP_REPLICATE: return a->pp == b->pp && a->ep == b->ep && a->eshard == b->eshard;
    case HS_DIM_EDP_SHARD: return a->pp == b->pp && a->ep == b->ep && a->erep == b->erep;
    case HS_DIM_EDP: return a->pp == b->pp && a->ep == b->ep;
    case HS_DIM_EP: return a->pp == b->pp && a->edp == b->edp;
    default: fail_msg("unknown dim %d", (int)d);
    }
    return false;
}

static int ref_key(hs_mesh_dim d, const ref_coords *c) {
    switch (d) {
    case HS_DIM_PP: return c->pp;
    case HS_DIM_DP: return c->dp;
    case HS_DIM_CP: return c->cp;
    case HS_DIM_TP: return c->tp;
    case HS_DIM_DP_CP:
    case HS_DIM_FSDP: return c->f;
    case HS_DIM_FSDP_REPLICATE: return c->frep;
    case HS_DIM_FSDP_SHARD: return c->fshard;
    case HS_DIM_EDP_REPLICATE: return c->erep;
    case HS_DIM_EDP_SHARD: return c->eshard;
    case HS_DIM_EDP: return c->edp;
    case HS_DIM_EP: return c->ep;
    default: fail_msg("unknown dim %d", (int)d);
    }
    return -1;
}

static void check_coords(const hs_topology *t, const ref_coords *ref) {
    for (int r = 0; r < t->world; r++) {
        hs_coords c = hs_topology_coords(t, r);
        const ref_coords *x = &ref[r];
        assert_int_equal(c.pp, x->pp);
        assert_int_equal(c.dp, x->dp);
        assert_int_equal(c.cp, x->cp);
        assert_int_equal(c.tp, x->tp);
        assert_int_equal(c.fsdp_replicate, x->frep);
        assert_int_equal(c.fsdp_shard, x->fshard);
        assert_int_equal(c.edp_replicate, x->erep);
        assert_int_equal(c.edp_shard, x->eshard);
        assert_int_equal(c.ep, x->ep);
    }
}

/* Members of r's group: every s in the same group, placed at its key. */
static void check_group(const hs_topology *t, const ref_coords *ref, hs_mesh_dim d, int r, int *got,
                        int *want) {
    int n_want = 0;
    for (int s = 0; s < t->world; s++) {
        if (!ref_same_group(d, &ref[r], &ref[s])) continue;
        want[ref_key(d, &ref[s])] = s;
        n_want++;
    }
    int n = hs_topology_group_ranks(t, d, r, got);
    assert_int_equal(n, n_want);
    for (int i = 0; i < n; i++) assert_int_equal(got[i], want[i]);
    assert_int_equal(hs_topology_group_rank(t, d, r), ref_key(d, &ref[r]));
    assert_int_equal(n * hs_topology_group_count(t, d), t->world);
}

/* Group indices are dense, and equal exactly when the groups are equal. */
static void check_indices(const hs_topology *t, const ref_coords *ref, hs_mesh_dim d) {
    int count = hs_topology_group_count(t, d);
    for (int r = 0; r < t->world; r++) {
        int ir = hs_topology_group_index(t, d, r);
        assert_true(ir >= 0 && ir < count);
        for (int s = 0; s < t->world; s++)
            assert_int_equal(ir == hs_topology_group_index(t, d, s),
                             ref_same_group(d, &ref[r], &ref[s]));
    }
}

/* hs_topology_groups lists every group at once, as the per-rank calls do. */
static void check_all_groups(const hs_topology *t, hs_mesh_dim d, int *all, int *one) {
    int size = t->world / hs_topology_group_count(t, d);
    for (int r = 0; r < t->world; r++) all[r] = -1;
    hs_topology_groups(t, d, all);
    for (int r = 0; r < t->world; r++) {
        int n = hs_topology_group_ranks(t, d, r, one);
        assert_int_equal(n, size);
        const int *g = all + hs_topology_group_index(t, d, r) * size;
        for (int i = 0; i < n; i++) assert_int_equal(g[i], one[i]);
    }
}

static void check_layout(const hs_topology *t) {
    ref_coords *ref = ref_table(t);
    int *got = calloc((size_t)t->world, sizeof *got);
    int *want = calloc((size_t)t->world, sizeof *want);
    check_coords(t, ref);
    for (int d = 0; d < HS_DIM_COUNT; d++) {
        for (int r = 0; r < t->world; r++) check_group(t, ref, (hs_mesh_dim)d, r, got, want);
        check_indices(t, ref, (hs_mesh_dim)d);
        check_all_groups(t, (hs_mesh_dim)d, got, want);
    }
    free(got);
    free(want);
    free(ref);
}

static hs_topology derive_ok(int world, int tp, int cp, int ep, int pp, int dp_shard,
                             int edp_shard) {
    hs_topology t;
    hs_error e;
    hs_error_clear(&e);
    hs_status s = hs_topology_derive(&t, world, tp, cp, ep, pp, dp_shard, edp_shard, &e);
    if (s != HS_OK) fail_msg("unexpected topology error: %s", e.msg);
    return t;
}

/* ---------------------------------------------------------------- layouts */

static void test_world16_pp2_dp2_cp2_tp2_sizes_and_coords(void **state) {
    (void)state;
    hs_topology t = derive_ok(16, 2, 2, 2, 2, 2, 1);
    assert_int_equal(t.dp, 2);
    assert_int_equal(t.fsdp_dp, 4);
    assert_int_equal(t.dp_replicate, 2);
    assert_int_equal(t.expert_domain, 8);
    assert_int_equal(t.edp, 4);
    assert_int_equal(t.edp_replicate, 4);
    /* rank 13 = ((1*2 + 1)*2 + 0)*2 + 1: pp 1, dp 1, cp 0, tp 1 */
    hs_coords c = hs_topology_coords(&t, 13);
    assert_int_equal(c.pp, 1);
    assert_int_equal(c.dp, 1);
    assert_int_equal(c.cp, 0);
    assert_int_equal(c.tp, 1);
    assert_int_equal(c.fsdp_shard, 0); /* f = 2 */
    assert_int_equal(c.fsdp_replicate, 1);
    assert_int_equal(c.ep, 1); /* x = 5 */
    assert_int_equal(c.edp_replicate, 2);
    check_layout(&t);
}

static void test_world16_groups_of_rank_13_by_hand(void **state) {
    (void)state;
    hs_topology t = derive_ok(16, 2, 2, 2, 2, 2, 1);
    int out[16];
    struct {
        hs_mesh_dim d;
        int n;
        int members[4];
    } cases[] = {
        {HS_DIM_PP, 2, {5, 13}},
        {HS_DIM_DP, 2, {9, 13}},
        {HS_DIM_CP, 2, {13, 15}},
        {HS_DIM_TP, 2, {12, 13}},
        {HS_DIM_DP_CP, 4, {9, 11, 13, 15}},
        {HS_DIM_FSDP, 4, {9, 11, 13, 15}},
        {HS_DIM_FSDP_SHARD, 2, {13, 15}},
        {HS_DIM_FSDP_REPLICATE, 2, {9, 13}},
        {HS_DIM_EP, 2, {12, 13}},
        {HS_DIM_EDP, 4, {9, 11, 13, 15}},
        {HS_DIM_EDP_SHARD, 1, {13}},
        {HS_DIM_EDP_REPLICATE, 4, {9, 11, 13, 15}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int n = hs_topology_group_ranks(&t, cases[i].d, 13, out);
        assert_int_equal(n, cases[i].n);
        for (int k = 0; k < n; k++) assert_int_equal(out[k], cases[i].members[k]);
    }
}

static void test_hsdp_8_ranks_shard_4_is_two_replicas_of_0123_and_4567(void **state) {
    (void)state;
    hs_topology t = derive_ok(8, 1, 1, 1, 1, 4, 1);
    int out[8];
    assert_int_equal(hs_topology_group_ranks(&t, HS_DIM_FSDP_SHARD, 6, out), 4);
    for (int k = 0; k < 4; k++) assert_int_equal(out[k], 4 + k);
    assert_int_equal(hs_topology_group_ranks(&t, HS_DIM_FSDP_REPLICATE, 6, out), 2);
    assert_int_equal(out[0], 2);
    assert_int_equal(out[1], 6);
    check_layout(&t);
}

static void test_cp_never_enlarges_the_shard_degree(void **state) {
    (void)state;
    /* world 8, cp 2: dp×cp = 8 ranks; dp_shard 2 keeps shard groups of 2. */
    hs_topology t = derive_ok(8, 1, 2, 1, 1, 2, 1);
    assert_int_equal(t.dp, 4);
    assert_int_equal(t.fsdp_dp, 8);
    assert_int_equal(t.dp_replicate, 4);
    int out[8];
    assert_int_equal(hs_topology_group_ranks(&t, HS_DIM_FSDP_SHARD, 5, out), 2);
    assert_int_equal(out[0], 4);
    assert_int_equal(out[1], 5);
}

static void test_pp_stages_keep_fsdp_groups_inside_the_stage(void **state) {
    (void)state;
    hs_topology t = derive_ok(8, 1, 1, 1, 2, 4, 1);
    int out[8];
    for (int r = 0; r < 8; r++) {
        int n = hs_topology_group_ranks(&t, HS_DIM_FSDP, r, out);
        assert_int_equal(n, 4);
        for (int k = 0; k < n; k++) assert_int_equal(out[k] / 4, r / 4);
    }
}

/* Every valid combination of sizes for worlds up to 16 (3614 layouts). */
static void test_every_valid_layout_matches_the_enumeration(void **state) {
    (void)state;
    static const int worlds[] = {1, 2, 3, 4, 6, 8, 12, 16};
    int checked = 0;
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
        int W = worlds[w];
        for (int tp = 1; tp <= W; tp++)
            for (int cp = 1; cp * tp <= W; cp++)
                for (int pp = 1; pp * cp * tp <= W; pp++) {
                    if (W % (tp * cp * pp)) continue;
                    int dpcp = W / (tp * pp), expert = dpcp * tp;
                    for (int ep = 1; ep <= expert; ep++)
                        for (int ds = 1; ds <= dpcp; ds++)
                            for (int es = 1; es <= expert; es++) {
                                if (expert % ep || dpcp % ds || (expert / ep) % es) continue;
                                hs_topology t = derive_ok(W, tp, cp, ep, pp, ds, es);
                                check_layout(&t);
                                checked++;
                            }
                }
    }
    assert_int_equal(checked, 3614);
}

/* ------------------------------------------------------------------ rules */

static hs_status derive_err(hs_error *e, int world, int tp, int cp, int ep, int pp, int ds,
                            int es) {
    hs_topology t;
    hs_error_clear(e);
    return hs_topology_derive(&t, world, tp, cp, ep, pp, ds, es, e);
}

static void assert_contains(const char *haystack, const char *needle) {
    if (!strstr(haystack, needle)) fail_msg("'%s' not found in:\n%s", needle, haystack);
}

static void test_rule1_dp_shard_0_names_the_path_and_choices(void **state) {
    (void)state;
    hs_error e;
    assert_int_equal(derive_err(&e, 8, 1, 1, 1, 1, 0, 1), HS_ERR_CONFIG);
    assert_int_equal(e.code, HS_ERR_CONFIG);
    assert_int_equal(e.lines, 1);
    assert_contains(e.msg, "fsdp_config.dp_shard_size=0 must be >= 1");
    assert_contains(e.msg, "1, 2, 4, 8");
}

static void test_rule2_edp_shard_negative_names_the_path(void **state) {
    (void)state;
    hs_error e;
    assert_int_equal(derive_err(&e, 8, 1, 1, 2, 1, 1, -1), HS_ERR_CONFIG);
    assert_int_equal(e.lines, 1);
    assert_contains(e.msg, "fsdp_config.edp_shard_size=-1 must be >= 1");
    assert_contains(e.msg, "1, 2, 4");
}

static void test_rule4_world_6_with_tp2_cp2_is_rejected(void **state) {
    (void)state;
    hs_error e;
    assert_int_equal(derive_err(&e, 6, 2, 2, 1, 1, 1, 1), HS_ERR_CONFIG);
    assert_int_equal(e.lines, 1);
    assert_string_equal(e.msg,
                        "world size 6 is not divisible by accelerator.tp_size × cp_size × "
                        "pp_size = 4 (tp=2, cp=2, pp=1); use a world size that is a multiple "
                        "of 4 or change the sizes");
}

static void test_rule5_dp_shard_3_of_8_lists_divisors(void **state) {
    (void)state;
    hs_error e;
    assert_int_equal(derive_err(&e, 8, 1, 1, 1, 1, 3, 1), HS_ERR_CONFIG);
    assert_int_equal(e.lines, 1);
    assert_string_equal(e.msg, "fsdp_config.dp_shard_size=3 does not divide the DP×CP domain "
                               "of 8 (dp=8, cp=1); use one of 1, 2, 4, 8");
}

static void test_rule6_ep_3_does_not_divide_expert_domain_8(void **state) {
    (void)state;
    hs_error e;
    assert_int_equal(derive_err(&e, 8, 2, 1, 3, 1, 1, 1), HS_ERR_CONFIG);
    assert_int_equal(e.lines, 1);
    assert_contains(e.msg, "accelerator.ep_size=3 does not divide the expert domain "
                           "dp×cp×tp = 8 (dp=4, cp=1, tp=2); use one of 1, 2, 4, 8");
}

static void test_rule7_edp_shard_3_does_not_divide_edp_4(void **state) {
    (void)state;
    hs_error e;
    assert_int_equal(derive_err(&e, 8, 1, 1, 2, 1, 1, 3), HS_ERR_CONFIG);
    assert_int_equal(e.lines, 1);
    assert_contains(e.msg, "fsdp_config.edp_shard_size=3 does not divide the EDP size 4");
    assert_contains(e.msg, "accelerator.ep_size = 2");
    assert_contains(e.msg, "use one of 1, 2, 4");
}

static void test_zero_parallel_size_is_an_error_not_a_crash(void **state) {
    (void)state;
    hs_error e;
    assert_int_equal(derive_err(&e, 4, 0, 1, 1, 1, 1, 1), HS_ERR_CONFIG);
    assert_contains(e.msg, "accelerator.tp_size=0 must be >= 1");
    assert_int_equal(derive_err(&e, 0, 1, 1, 1, 1, 1, 1), HS_ERR_CONFIG);
    assert_contains(e.msg, "world size 0 must be >= 1");
}

static void test_rules_1_5_6_7_fail_together_in_one_report(void **state) {
    (void)state;
    hs_error e;
    /* rule 1 (dp_shard 0) and rule 6 (ep 3 of 8) together */
    assert_int_equal(derive_err(&e, 8, 1, 1, 3, 1, 0, 1), HS_ERR_CONFIG);
    assert_int_equal(e.lines, 2);
    assert_contains(e.msg, "fsdp_config.dp_shard_size=0");
    assert_contains(e.msg, "accelerator.ep_size=3");
    /* rule 5 and rule 7 together, rule 5 reported first */
    assert_int_equal(derive_err(&e, 16, 2, 1, 4, 1, 3, 3), HS_ERR_CONFIG);
    assert_int_equal(e.lines, 2);
    const char *r5 = strstr(e.msg, "fsdp_config.dp_shard_size=3");
    const char *r7 = strstr(e.msg, "fsdp_config.edp_shard_size=3");
    assert_non_null(r5);
    assert_non_null(r7);
    assert_true(r5 < r7);
}

static void test_rule4_and_both_shard_rules_fail_together(void **state) {
    (void)state;
    hs_error e;
    assert_int_equal(derive_err(&e, 6, 4, 1, 1, 1, 0, 0), HS_ERR_CONFIG);
    assert_int_equal(e.lines, 3);
    assert_contains(e.msg, "fsdp_config.dp_shard_size=0");
    assert_contains(e.msg, "fsdp_config.edp_shard_size=0");
    assert_contains(e.msg, "world size 6 is not divisible");
}

static void test_derive_keeps_earlier_lines_of_the_report(void **state) {
    (void)state;
    hs_error e;
    hs_error_clear(&e);
    hs_error_append(&e, HS_ERR_CONFIG, "fsdp_config.forward_prefetch_depth=-1 must be >= 0");
    hs_topology t;
    assert_int_equal(hs_topology_derive(&t, 8, 1, 1, 1, 1, 3, 1, &e), HS_ERR_CONFIG);
    assert_int_equal(e.lines, 2);
    assert_contains(e.msg, "forward_prefetch_depth");
    assert_contains(e.msg, "dp_shard_size=3");
}

static void test_valid_topology_leaves_the_error_untouched(void **state) {
    (void)state;
    hs_error e;
    assert_int_equal(derive_err(&e, 16, 2, 2, 2, 2, 2, 2), HS_OK);
    assert_int_equal(e.code, HS_OK);
    assert_int_equal(e.lines, 0);
}

/* -------------------------------------------------------- FSDP activation */

static void test_fsdp_skipped_on_world_1(void **state) {
    (void)state;
    hs_topology t = derive_ok(1, 1, 1, 1, 1, 1, 1);
    char why[256];
    assert_false(hs_topology_fsdp_active(&t, why, sizeof why));
    assert_string_equal(why, "skipped: world size 1");
}

static void test_fsdp_skipped_when_tp_uses_every_rank(void **state) {
    (void)state;
    hs_topology t = derive_ok(4, 4, 1, 1, 1, 1, 1);
    char why[256];
    assert_false(hs_topology_fsdp_active(&t, why, sizeof why));
    assert_string_equal(why, "skipped: no FSDP domain (dp×cp = 1; tp=4 uses every rank)");
    t = derive_ok(4, 2, 1, 1, 2, 1, 1);
    assert_false(hs_topology_fsdp_active(&t, why, sizeof why));
    assert_contains(why, "tp=2 × pp=2");
}

static void test_fsdp_active_for_hsdp_4_by_2(void **state) {
    (void)state;
    hs_topology t = derive_ok(8, 1, 1, 1, 1, 4, 1);
    char why[256];
    assert_true(hs_topology_fsdp_active(&t, why, sizeof why));
    assert_string_equal(why, "FSDP: shard 4 × replicate 2 over dp×cp = 8");
}

static void test_fsdp_active_for_pure_replication_shard_1(void **state) {
    (void)state;
    /* dp_shard 1 is still an FSDP domain: gradients all-reduce over it. */
    hs_topology t = derive_ok(2, 1, 1, 1, 1, 1, 1);
    char why[256];
    assert_true(hs_topology_fsdp_active(&t, why, sizeof why));
    assert_string_equal(why, "FSDP: shard 1 × replicate 2 over dp×cp = 2");
}

static void test_fsdp_active_for_experts_only_domain(void **state) {
    (void)state;
    /* tp 4 leaves no dense domain, but ep 2 over 4 ranks leaves edp 2. */
    hs_topology t = derive_ok(4, 4, 1, 2, 1, 1, 2);
    char why[256];
    assert_true(hs_topology_fsdp_active(&t, why, sizeof why));
    assert_contains(why, "experts: shard 2 × replicate 1 over edp = 2 (ep=2)");
}

static void test_invalid_topology_is_never_active(void **state) {
    (void)state;
    hs_topology t;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_topology_derive(&t, 8, 1, 1, 1, 1, 3, 1, &e), HS_ERR_CONFIG);
    char why[256];
    assert_false(hs_topology_fsdp_active(&t, why, sizeof why));
    assert_contains(why, "invalid");
}

/* ------------------------------------------------------------ names/table */

static void test_dim_names_follow_the_enum(void **state) {
    (void)state;
    static const char *want[] = {"pp",         "dp",    "cp",
                                 "tp",         "dp_cp", "fsdp_replicate",
                                 "fsdp_shard", "fsdp",  "edp_replicate",
                                 "edp_shard",  "edp",   "ep"};
    for (int d = 0; d < HS_DIM_COUNT; d++)
        assert_string_equal(hs_mesh_dim_name((hs_mesh_dim)d), want[d]);
}

static void test_print_shows_coords_and_members(void **state) {
    (void)state;
    hs_topology t = derive_ok(8, 2, 1, 1, 1, 2, 1);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(hs_topology_print(&t, f, NULL), HS_OK);
    fclose(f);
    assert_contains(buf, "world 8 = pp 1 × dp 4 × cp 1 × tp 2");
    assert_contains(buf, "FSDP: shard 2 × replicate 2 over dp×cp = 4");
    /* fsdp_shard groups of tp rank 0: ranks 0,2 and 4,6 */
    assert_contains(buf, "fsdp_shard          4 × 2    [0 2] [4 6] [1 3] [5 7]");
    assert_contains(buf, "tp                  4 × 2    [0 1] [2 3] [4 5] [6 7]");
    /* rank 5: pp 0, dp 2, cp 0, tp 1, replicate 1, shard 0, edp_rep 5 */
    assert_contains(buf,
                    "    5   0   2   0   1              1          0             5         0   0");
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world16_pp2_dp2_cp2_tp2_sizes_and_coords),
        cmocka_unit_test(test_world16_groups_of_rank_13_by_hand),
        cmocka_unit_test(test_hsdp_8_ranks_shard_4_is_two_replicas_of_0123_and_4567),
        cmocka_unit_test(test_cp_never_enlarges_the_shard_degree),
        cmocka_unit_test(test_pp_stages_keep_fsdp_groups_inside_the_stage),
        cmocka_unit_test(test_every_valid_layout_matches_the_enumeration),
        cmocka_unit_test(test_rule1_dp_shard_0_names_the_path_and_choices),
        cmocka_unit_test(test_rule2_edp_shard_negative_names_the_path),
        cmocka_unit_test(test_rule4_world_6_with_tp2_cp2_is_rejected),
        cmocka_unit_test(test_rule5_dp_shard_3_of_8_lists_divisors),
        cmocka_unit_test(test_rule6_ep_3_does_not_divide_expert_domain_8),
        cmocka_unit_test(test_rule7_edp_shard_3_does_not_divide_edp_4),
        cmocka_unit_test(test_zero_parallel_size_is_an_error_not_a_crash),
        cmocka_unit_test(test_rules_1_5_6_7_fail_together_in_one_report),
        cmocka_unit_test(test_rule4_and_both_shard_rules_fail_together),
        cmocka_unit_test(test_derive_keeps_earlier_lines_of_the_report),
        cmocka_unit_test(test_valid_topology_leaves_the_error_untouched),
        cmocka_unit_test(test_fsdp_skipped_on_world_1),
        cmocka_unit_test(test_fsdp_skipped_when_tp_uses_every_rank),
        cmocka_unit_test(test_fsdp_active_for_hsdp_4_by_2),
        cmocka_unit_test(test_fsdp_active_for_pure_replication_shard_1),
        cmocka_unit_test(test_fsdp_active_for_experts_only_domain),
        cmocka_unit_test(test_invalid_topology_is_never_active),
        cmocka_unit_test(test_dim_names_follow_the_enum),
        cmocka_unit_test(test_print_shows_coords_and_members),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
