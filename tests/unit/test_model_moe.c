/* model/: the decoder with arch moe — Mixtral FQNs, nested expert units,
 * hook order with the expert unit inside its block, the whole-model
 * gradient (aux loss included) against finite differences, recompute. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "hypershard/model.h"

static hs_model_config moe_config(int shared) {
    hs_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.arch, sizeof c.arch, "moe");
    c.vocab_size = 11;
    c.dim = 8;
    c.n_layers = 2;
    c.n_heads = 2;
    c.n_kv_heads = 2;
    c.ffn_dim = 12;
    c.norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.init_std = 0.3;
    c.moe.num_experts = 4;
    c.moe.top_k = 2;
    c.moe.expert_ffn_dim = 6;
    c.moe.shared_expert_ffn_dim = shared;
    c.moe.aux_loss_coef = 0.1;
    return c;
}

static hs_model_options moe_options(bool ckpt) {
    hs_model_options o;
    memset(&o, 0, sizeof o);
    o.compute_dtype = HS_DTYPE_F32;
    o.grad_dtype = HS_DTYPE_F32;
    o.max_batch = 2;
    o.seq_len = 5;
    o.activation_checkpointing = ckpt;
    o.allocate_params = true;
    return o;
}

static hs_model *make(const hs_model_config *c, const hs_model_options *o, uint64_t seed) {
    hs_model *m = NULL;
    hs_error e;
    if (hs_model_create(c, o, &m, &e) != HS_OK) fail_msg("hs_model_create: %s", e.msg);
    hs_model_init_weights(m, seed);
    return m;
}

static const int32_t TOKENS[10] = {1, 5, 2, 9, 3, 0, 10, 4, 4, 7};
static const int32_t TARGETS[10] = {5, 2, 9, 3, 6, 10, 4, -1, 7, 8};

/* Returns the objective the gradient is of: (loss_sum + aux * valid) * scale. */
static double step(hs_model *m, float scale, const hs_model_hooks *hooks) {
    hs_batch b = {TOKENS, TARGETS, 2, 5};
    double loss = 0.0, aux = 0.0;
    hs_error e;
    if (hs_model_forward_backward(m, &b, scale, hooks, &loss, &aux, &e) != HS_OK)
        fail_msg("forward_backward: %s", e.msg);
    return (loss + aux * 9.0) * scale;
}

static int64_t numel(const hs_param *p) {
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

static void test_moe_fqns_are_mixtral_and_experts_form_a_nested_unit(void **state) {
    (void)state;
    hs_model_config c = moe_config(5);
    hs_model_options o = moe_options(false);
    hs_model *m = make(&c, &o, 1);
    assert_int_equal(hs_model_num_units(m), 5);
    assert_string_equal(hs_model_unit(m, 1)->name, "model.layers.0");
    assert_string_equal(hs_model_unit(m, 2)->name, "model.layers.0.block_sparse_moe.experts");
    assert_int_equal(hs_model_unit(m, 2)->parent, 1);
    assert_true(hs_model_unit(m, 2)->is_expert);
    assert_false(hs_model_unit(m, 3)->is_expert);
    hs_param *r =
        hs_model_param(m, hs_model_find_param(m, "model.layers.1.block_sparse_moe.gate.weight"));
    assert_int_equal(r->kind, HS_PARAM_ROUTER);
    assert_int_equal(r->unit, 3);
    hs_param *w2 = hs_model_param(
        m, hs_model_find_param(m, "model.layers.1.block_sparse_moe.experts.w2.weight"));
    assert_int_equal(w2->kind, HS_PARAM_EXPERT);
    assert_int_equal(w2->unit, 4);
    assert_int_equal(w2->ndim, 3);
    assert_int_equal(w2->shape[0], 4);
    assert_int_equal(w2->shape[1], 8);
    assert_int_equal(w2->shape[2], 6);
    hs_param *sh = hs_model_param(
        m,
        hs_model_find_param(m, "model.layers.0.block_sparse_moe.shared_expert.down_proj.weight"));
    assert_int_equal(sh->unit, 1);
    assert_int_equal(sh->shape[0], 8);
    assert_int_equal(sh->shape[1], 5);
    assert_int_equal(hs_model_find_param(m, "model.layers.0.mlp.gate_proj.weight"), -1);
    /* active parameters: routed experts count top_k / E of their size */
    double n = (double)hs_model_param_count(m) - 11 * 8 - 2 * 3 * 4 * 6 * 8 * 0.5;
    assert_float_equal(hs_model_flops_per_token(m, 5), 6 * n + 6.0 * 2 * 5 * 8, 1e-6);
    hs_model_free(m);
}

static double objective_at(hs_model *m, float *w, float v, float scale) {
    w[0] = v;
    return step(m, scale, NULL);
}

static void test_moe_model_gradients_match_finite_differences(void **state) {
    (void)state;
    hs_model_config c = moe_config(5);
    hs_model_options o = moe_options(false);
    hs_model *m = make(&c, &o, 3);
    hs_model *g = make(&c, &o, 3); /* holds the analytic gradient */
    const float scale = 1.0f / 9.0f, h = 2e-3f;
    step(g, scale, NULL);
    double worst = 0.0;
    for (int i = 0; i < hs_model_num_params(m); i++) {
        hs_param *p = hs_model_param(m, i);
        float *w = p->data, *an = hs_model_param(g, i)->grad;
        for (int k = 0; k < 4; k++) {
            int64_t j = (k * 7919 + i * 31) % numel(p);
            float keep = w[j];
            double fd = (objective_at(m, w + j, keep + h, scale) -
                         objective_at(m, w + j, keep - h, scale)) /
                        (2.0 * h);
            w[j] = keep;
            double err = fabs(fd - an[j]) / (fabs(fd) + fabs(an[j]) + 1e-2);
            worst = err > worst ? err : worst;
            if (err > 1e-2)
                fail_msg("%s[%lld]: analytic %.6g vs finite difference %.6g", p->fqn, (long long)j,
                         (double)an[j], fd);
        }
    }
    print_message("moe whole-model FD: worst relative error %.3g\n", worst);
    hs_model_free(m);
    hs_model_free(g);
}

static void test_moe_recompute_is_bitwise_identical(void **state) {
    (void)state;
    hs_model_config c = moe_config(0);
    hs_model_options o = moe_options(false);
    hs_model *a = make(&c, &o, 9);
    o.activation_checkpointing = true;
    hs_model *b = make(&c, &o, 9);
    double la = step(a, 0.1f, NULL), lb = step(b, 0.1f, NULL);
    assert_memory_equal(&la, &lb, sizeof la);
    for (int i = 0; i < hs_model_num_params(a); i++)
        assert_memory_equal(hs_model_param(a, i)->grad, hs_model_param(b, i)->grad,
                            (size_t)numel(hs_model_param(a, i)) * sizeof(float));
    hs_model_free(a);
    hs_model_free(b);
}

typedef struct recorder {
    char log[1024];
    bool in_backward[8];
    hs_model *m;
    hs_model *shadow; /* owns the real buffers; params are NULL outside hooks */
} recorder;

static void rec(recorder *r, const char *what, int u) {
    char buf[16];
    snprintf(buf, sizeof buf, u < 0 ? "%s " : "%s%d ", what, u);
    strncat(r->log, buf, sizeof r->log - strlen(r->log) - 1);
}

/* FSDP-like: a unit's params exist only between its pre and post hooks,
 * and forward hooks re-entered during its backward leave them in place. */
static void bind(recorder *r, int u, bool on) {
    for (int i = 0; i < hs_model_num_params(r->m); i++) {
        hs_param *p = hs_model_param(r->m, i), *s = hs_model_param(r->shadow, i);
        if (p->unit != u) continue;
        p->data = on ? s->data : NULL;
        p->grad = on ? s->grad : NULL;
    }
}
static void h_pre_fwd(void *ctx, int u) { rec(ctx, "F", u), bind(ctx, u, true); }
static void h_post_fwd(void *ctx, int u) {
    recorder *r = ctx;
    rec(r, "f", u);
    if (!r->in_backward[u]) bind(r, u, false);
}
static void h_pre_bwd(void *ctx, int u) {
    recorder *r = ctx;
    rec(r, "B", u), bind(r, u, true);
    r->in_backward[u] = true;
}
static void h_post_bwd(void *ctx, int u) {
    recorder *r = ctx;
    rec(r, "b", u), bind(r, u, false);
    r->in_backward[u] = false;
}
static void h_final(void *ctx) { rec(ctx, "END", -1); }

static void test_moe_expert_unit_hooks_nest_inside_the_block(void **state) {
    (void)state;
    hs_model_config c = moe_config(3);
    for (int ckpt = 0; ckpt < 2; ckpt++) {
        hs_model_options o = moe_options(ckpt);
        hs_model *ref = make(&c, &o, 1);
        recorder r;
        memset(&r, 0, sizeof r);
        r.shadow = make(&c, &o, 1);
        o.allocate_params = false;
        hs_error e;
        assert_int_equal(hs_model_create(&c, &o, &r.m, &e), HS_OK);
        hs_model_hooks hooks = {&r, h_pre_fwd, h_post_fwd, h_pre_bwd, h_post_bwd, h_final};
        double want = step(ref, 1.0f, NULL), got = step(r.m, 1.0f, &hooks);
        assert_string_equal(r.log, ckpt ? "F0 F1 F2 f2 f1 F3 F4 f4 f3 f0 B0 "
                                          "B3 F3 F4 f4 f3 B4 b4 b3 "
                                          "B1 F1 F2 f2 f1 B2 b2 b1 b0 END "
                                        : "F0 F1 F2 f2 f1 F3 F4 f4 f3 f0 B0 "
                                          "B3 B4 b4 b3 B1 B2 b2 b1 b0 END ");
        assert_memory_equal(&want, &got, sizeof want);
        for (int i = 0; i < hs_model_num_params(ref); i++)
            assert_memory_equal(hs_model_param(ref, i)->grad, hs_model_param(r.shadow, i)->grad,
                                (size_t)numel(hs_model_param(ref, i)) * sizeof(float));
        hs_model_free(ref);
        hs_model_free(r.shadow);
        hs_model_free(r.m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_fqns_are_mixtral_and_experts_form_a_nested_unit),
        cmocka_unit_test(test_moe_model_gradients_match_finite_differences),
        cmocka_unit_test(test_moe_recompute_is_bitwise_identical),
        cmocka_unit_test(test_moe_expert_unit_hooks_nest_inside_the_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
