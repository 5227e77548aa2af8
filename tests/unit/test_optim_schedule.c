/* LR schedule values at the key steps, and global grad-norm clipping. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "hypershard/optim.h"

/* The cpu device clipping computes on, created once for the whole run. */
static hs_device *cpu_dev(void) {
    static hs_device *d;
    hs_error e;
    if (!d && hs_device_create(HS_DEVICE_CPU, NULL, &d, &e) != HS_OK) fail_msg("%s", e.msg);
    return d;
}

static hs_optim_config sched(const char *decay, int warmup, double min_ratio) {
    hs_optim_config c;
    memset(&c, 0, sizeof c);
    strcpy(c.target, "adamw");
    c.lr = 2.0;
    strcpy(c.schedule.decay, decay);
    c.schedule.warmup_steps = warmup;
    c.schedule.min_lr_ratio = min_ratio;
    return c;
}

static void near(double got, double want) { assert_true(fabs(got - want) < 1e-12); }

static void test_warmup_10_rises_from_lr_over_10_to_lr(void **state) {
    (void)state;
    hs_optim_config c = sched("cosine", 10, 0.1);
    near(hs_lr_at(&c, 1, 110), 0.2);
    near(hs_lr_at(&c, 5, 110), 1.0);
    near(hs_lr_at(&c, 10, 110), 2.0);
}

static void test_cosine_halfway_is_mean_of_lr_and_min_and_last_is_min(void **state) {
    (void)state;
    hs_optim_config c = sched("cosine", 10, 0.1);
    near(hs_lr_at(&c, 60, 110), (2.0 + 0.2) / 2);
    near(hs_lr_at(&c, 110, 110), 0.2);
    near(hs_lr_at(&c, 35, 110), 0.2 + 1.8 * 0.5 * (1 + cos(M_PI / 4)));
    near(hs_lr_at(&c, 500, 110), 0.2); /* past the end: stays at the floor */
}

static void test_linear_decay_quarter_and_end(void **state) {
    (void)state;
    hs_optim_config c = sched("linear", 0, 0.0);
    near(hs_lr_at(&c, 25, 100), 1.5);
    near(hs_lr_at(&c, 100, 100), 0.0);
    c = sched("linear", 20, 0.5);
    near(hs_lr_at(&c, 20, 100), 2.0);
    near(hs_lr_at(&c, 60, 100), 1.5);
    near(hs_lr_at(&c, 100, 100), 1.0);
}

static void test_constant_after_warmup_stays_at_lr(void **state) {
    (void)state;
    hs_optim_config c = sched("constant", 4, 0.1);
    near(hs_lr_at(&c, 2, 100), 1.0);
    near(hs_lr_at(&c, 5, 100), 2.0);
    near(hs_lr_at(&c, 100, 100), 2.0);
}

static void test_run_shorter_than_warmup_never_decays_past_min(void **state) {
    (void)state;
    hs_optim_config c = sched("cosine", 10, 0.1);
    near(hs_lr_at(&c, 3, 5), 0.6);
    hs_optim_config d = sched("cosine", 0, 0.1);
    near(hs_lr_at(&d, 1, 1), 0.2);
}

static void test_clip_norm_5_to_1_scales_by_1_over_5(void **state) {
    (void)state;
    float g1[1] = {3}, g2[1] = {4};
    hs_optim_param ps[2] = {{.fqn = "a", .grad = g1, .numel = 1},
                            {.fqn = "b", .grad = g2, .numel = 1}};
    double sumsq = hs_grad_sumsq(cpu_dev(), ps, 2);
    assert_true(sumsq == 25.0);
    double coef = hs_clip_grads(cpu_dev(), ps, 2, sqrt(sumsq), 1.0);
    near(coef, 1.0 / (5.0 + 1e-6));
    assert_true(g1[0] == (float)(3 * (float)coef) && g2[0] == 4 * (float)coef);
    assert_true(fabs(sqrt(hs_grad_sumsq(cpu_dev(), ps, 2)) - 1.0) < 1e-6);
}

static void test_clip_below_max_norm_or_disabled_leaves_grads(void **state) {
    (void)state;
    float g[2] = {3, 4};
    hs_optim_param p = {.fqn = "a", .grad = g, .numel = 2};
    assert_true(hs_clip_grads(cpu_dev(), &p, 1, 5.0, 10.0) == 1.0);
    assert_true(hs_clip_grads(cpu_dev(), &p, 1, 5.0, 0.0) == 1.0);
    assert_true(hs_clip_grads(cpu_dev(), &p, 1, 5.0, -1.0) == 1.0);
    assert_true(g[0] == 3 && g[1] == 4);
    hs_optim_param empty = {.fqn = "e", .grad = NULL, .numel = 0};
    assert_true(hs_grad_sumsq(cpu_dev(), &empty, 1) == 0.0);
}

static void test_clip_with_nan_norm_propagates_nan_like_torch(void **state) {
    (void)state;
    float g[2] = {1, 2};
    hs_optim_param p = {.fqn = "a", .grad = g, .numel = 2};
    assert_true(isnan(hs_clip_grads(cpu_dev(), &p, 1, NAN, 1.0)));
    assert_true(isnan(g[0]) && isnan(g[1]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warmup_10_rises_from_lr_over_10_to_lr),
        cmocka_unit_test(test_cosine_halfway_is_mean_of_lr_and_min_and_last_is_min),
        cmocka_unit_test(test_linear_decay_quarter_and_end),
        cmocka_unit_test(test_constant_after_warmup_stays_at_lr),
        cmocka_unit_test(test_run_shorter_than_warmup_never_decays_past_min),
        cmocka_unit_test(test_clip_norm_5_to_1_scales_by_1_over_5),
        cmocka_unit_test(test_clip_below_max_norm_or_disabled_leaves_grads),
        cmocka_unit_test(test_clip_with_nan_norm_propagates_nan_like_torch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
