/* The style table (parallel/style.c) on a real model without MPI: the
 * default plan's placements and TP-local shapes, the strided init of a
 * TP-local shard, and each error naming the FQN: no matching rule, tied
 * parameters given two placements, a region split in a way the model does
 * not compute; and a region the plan keeps whole. */
#include "model_fixture.h"

#include <stdlib.h>

#include "hypershard/parallel.h"

/* TP rank `rank` of 2 without groups: the placements and the model's
 * shapes only; no collective is called. */
static hs_parallel *tp_of(int rank, bool tie, const hs_style_rule *rules, int n, hs_error *e) {
    hs_config cfg;
    hs_error de;
    if (hs_config_defaults(&cfg, &de) != HS_OK) fail_msg("%s", de.msg);
    cfg.model.tie_embeddings = tie;
    hs_parallel_layout l = {.tp = 2, .tp_rank = rank, .cp = 1, .ep = 1};
    hs_parallel *p = NULL;
    if (hs_parallel_describe(&cfg.model, &cfg.accelerator, &l, rules, n, &p, e) != HS_OK)
        return NULL;
    return p;
}

/* The model a TP rank computes with, or NULL with e set. */
static hs_model *tp_model(hs_parallel *p, bool tie, int n_kv_heads, hs_error *e) {
    hs_model_config c = mf_config("llama", n_kv_heads);
    c.vocab_size = 12;
    c.tie_embeddings = tie;
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    o.allocate_params = false;
    o.par = hs_parallel_seam(p);
    hs_model *m = NULL;
    if (hs_model_create(&c, &o, &m, e) != HS_OK) return NULL;
    return m;
}

/* A model of TP rank `rank` with the default plan applied. */
static hs_model *planned_model(hs_parallel **p, int rank) {
    hs_error e;
    *p = tp_of(rank, false, NULL, 0, &e);
    if (!*p) fail_msg("hs_parallel_describe: %s", e.msg);
    hs_model *m = tp_model(*p, false, 2, &e);
    if (!m) fail_msg("hs_model_create: %s", e.msg);
    return m;
}

static const hs_param *param(hs_model *m, const char *fqn) {
    int i = hs_model_find_param(m, fqn);
    assert_true(i >= 0);
    return hs_model_param(m, i);
}

static void test_default_plan_places_every_parameter(void **state) {
    (void)state;
    hs_parallel *t;
    hs_model *m = planned_model(&t, 1);
    const hs_param *q = param(m, "model.layers.0.self_attn.q_proj.weight");
    assert_true(q->on_tp_mesh && q->tp.kind == HS_PLACEMENT_SHARD && q->tp.dim == 0);
    assert_int_equal(q->local_shape[0], 4); /* 8 rows of 2 heads x HD 4: one head */
    assert_int_equal(q->local_offset[0], 4);
    const hs_param *o = param(m, "model.layers.1.self_attn.o_proj.weight");
    assert_true(o->tp.kind == HS_PLACEMENT_SHARD && o->tp.dim == 1);
    assert_int_equal(o->local_shape[0], 8);
    assert_int_equal(o->local_shape[1], 4);
    assert_int_equal(o->local_offset[1], 4);
    const hs_param *d = param(m, "model.layers.0.mlp.down_proj.weight");
    assert_int_equal(d->local_shape[1], 6);
    const hs_param *nrm = param(m, "model.norm.weight");
    assert_true(nrm->on_tp_mesh && nrm->tp.kind == HS_PLACEMENT_REPLICATE);
    assert_int_equal(nrm->local_shape[0], 8);
    assert_false(nrm->tp_grad_partial); /* no sequence parallel */
    const hs_param *h = param(m, "lm_head.weight");
    assert_int_equal(h->local_shape[0], 6);
    assert_int_equal(h->local_offset[0], 6);
    hs_model_free(m);
    hs_parallel_free(t);
}

/* A row-parallel local tensor is its column slice of the whole init, row
 * by row; a column-parallel one its row slice. */
static void test_local_init_is_the_slice_of_the_whole(void **state) {
    (void)state;
    hs_parallel *t;
    hs_model *m = planned_model(&t, 1);
    const char *names[] = {"model.layers.0.self_attn.o_proj.weight",
                           "model.layers.0.mlp.gate_proj.weight"};
    for (int k = 0; k < 2; k++) {
        hs_param *p = hs_model_param(m, hs_model_find_param(m, names[k]));
        hs_param whole = *p;
        for (int i = 0; i < p->ndim; i++) {
            whole.local_shape[i] = p->shape[i];
            whole.local_offset[i] = 0;
        }
        int64_t nw = p->shape[0] * p->shape[1], nl = hs_param_local_numel(p);
        float *w = calloc((size_t)nw, sizeof(float)), *l = calloc((size_t)nl, sizeof(float));
        float *s = calloc((size_t)nl, sizeof(float));
        hs_model_init_param_rows(m, &whole, 7, w, HS_DTYPE_F32, 0, p->shape[0]);
        hs_model_init_param_rows(m, p, 7, l, HS_DTYPE_F32, 0, p->local_shape[0]);
        hs_tp_local_slice(hs_model_device(m), p, w, s);
        assert_memory_equal(l, s, (size_t)nl * sizeof(float));
        /* rows 1.. of the local tensor alone: the same values */
        hs_model_init_param_rows(m, p, 7, s, HS_DTYPE_F32, 1, p->local_shape[0] - 1);
        assert_memory_equal(l + p->local_shape[1], s,
                            (size_t)(nl - p->local_shape[1]) * sizeof(float));
        free(w);
        free(l);
        free(s);
    }
    hs_model_free(m);
    hs_parallel_free(t);
}

/* The plan `rules` on a model (tied or not) must fail naming `want`. */
static void expect_plan_error(const hs_style_rule *rules, int n, bool tie, const char *want) {
    hs_error e;
    hs_parallel *p = tp_of(0, tie, rules, n, &e);
    hs_model *m = p ? tp_model(p, tie, 2, &e) : NULL;
    assert_null(m);
    assert_int_equal(e.code, HS_ERR_CONFIG);
    if (!strstr(e.msg, want)) fail_msg("'%s' not in: %s", want, e.msg);
    hs_parallel_free(p);
}

static void test_plan_errors_name_the_parameters(void **state) {
    (void)state;
    int n;
    const hs_style_rule *def = hs_style_default_plan(&n);
    hs_style_rule *rules = calloc((size_t)n + 1, sizeof *rules);

    /* no rule for the final norm */
    int k = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(def[i].suffix, "model.norm.weight")) rules[k++] = def[i];
    expect_plan_error(rules, k, false,
                      "model.norm.weight: no rule of the parallel plan matches this parameter");

    /* q_proj made row-parallel: the attention region is neither split nor whole */
    memcpy(rules, def, sizeof *rules * (size_t)n);
    for (int i = 0; i < n; i++)
        if (!strcmp(rules[i].suffix, "self_attn.q_proj.weight")) rules[i].style = HS_STYLE_ROWWISE;
    expect_plan_error(rules, n, false,
                      "model.layers.0.self_attn.q_proj.weight (Shard(1)) and "
                      "model.layers.0.self_attn.o_proj.weight (Shard(1)): a region is split "
                      "together");

    /* tied embedding and lm_head with two placements */
    memcpy(rules, def, sizeof *rules * (size_t)n);
    for (int i = 0; i < n; i++)
        if (!strcmp(rules[i].suffix, "lm_head.weight")) rules[i].style = HS_STYLE_ROWWISE;
    expect_plan_error(rules, n, true,
                      "model.embed_tokens.weight and lm_head.weight are one tied tensor");
    free(rules);
}

/* The plan may keep a region whole: an MLP left replicated computes with
 * every ffn column (the model reads its shapes off the placements), while
 * attention stays split by heads. */
static void test_a_replicated_mlp_is_computed_whole(void **state) {
    (void)state;
    int n;
    const hs_style_rule *def = hs_style_default_plan(&n);
    hs_style_rule *rules = calloc((size_t)n, sizeof *rules);
    memcpy(rules, def, sizeof *rules * (size_t)n);
    for (int i = 0; i < n; i++)
        if (strstr(rules[i].suffix, "mlp.")) rules[i].style = HS_STYLE_REPLICATE;
    hs_error e;
    hs_parallel *p = tp_of(1, false, rules, n, &e);
    assert_non_null(p);
    hs_model *m = tp_model(p, false, 2, &e);
    if (!m) fail_msg("hs_model_create: %s", e.msg);
    const hs_param *g = param(m, "model.layers.0.mlp.gate_proj.weight");
    assert_true(g->tp.kind == HS_PLACEMENT_REPLICATE);
    assert_int_equal(g->local_shape[0], 12);
    assert_int_equal(param(m, "model.layers.0.self_attn.q_proj.weight")->local_shape[0], 4);
    hs_model_free(m);
    hs_parallel_free(p);
    free(rules);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_plan_places_every_parameter),
        cmocka_unit_test(test_local_init_is_the_slice_of_the_whole),
        cmocka_unit_test(test_plan_errors_name_the_parameters),
        cmocka_unit_test(test_a_replicated_mlp_is_computed_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
