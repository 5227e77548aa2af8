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
#include "model_fixture.h"

static hs_model_config moe_config(int shared) {
    hs_model_config c = mf_config("moe", 2);
    c.moe.num_experts = 4;
    c.moe.top_k = 2;
    c.moe.expert_ffn_dim = 6;
    c.moe.shared_expert_ffn_dim = shared;
    c.moe.aux_loss_coef = 0.1;
    return c;
}

/* Returns the objective the gradient is of: (loss_sum + aux * valid) * scale. */
static double step(hs_model *m, float scale, const hs_model_hooks *hooks) {
    double loss, aux;
    mf_step(m, scale, hooks, &loss, &aux);
    return (loss + aux * 9.0) * scale;
}

static void test_moe_fqns_are_mixtral_and_experts_form_a_nested_unit(void **state) {
    (void)state;
    hs_model_config c = moe_config(5);
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *m = mf_make(&c, &o, 1);
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
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *m = mf_make(&c, &o, 3);
    hs_model *g = mf_make(&c, &o, 3); /* holds the analytic gradient */
    const float scale = 1.0f / 9.0f, h = 2e-3f;
    step(g, scale, NULL);
    double worst = 0.0;
    for (int i = 0; i < hs_model_num_params(m); i++) {
        hs_param *p = hs_model_param(m, i);
        float *w = p->data, *an = hs_model_param(g, i)->grad;
        for (int k = 0; k < 4; k++) {
            int64_t j = (k * 7919 + i * 31) % mf_numel(p);
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
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *a = mf_make(&c, &o, 9);
    o.activation_checkpointing = true;
    hs_model *b = mf_make(&c, &o, 9);
    double la = step(a, 0.1f, NULL), lb = step(b, 0.1f, NULL);
    assert_memory_equal(&la, &lb, sizeof la);
    mf_assert_grads_equal(a, b);
    hs_model_free(a);
    hs_model_free(b);
}

static void test_moe_expert_unit_hooks_nest_inside_the_block(void **state) {
    (void)state;
    hs_model_config c = moe_config(3);
    mf_check_hooks(&c, mf_options(HS_DTYPE_F32, false), 1, 1.0f,
                   "F0 F1 F2 f2 f1 F3 F4 f4 f3 f0 B0 B3 B4 b4 b3 B1 B2 b2 b1 b0 END ");
    mf_check_hooks(&c, mf_options(HS_DTYPE_F32, true), 1, 1.0f,
                   "F0 F1 F2 f2 f1 F3 F4 f4 f3 f0 B0 "
                   "B3 F3 F4 f4 f3 B4 b4 b3 "
                   "B1 F1 F2 f2 f1 B2 b2 b1 b0 END ");
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
