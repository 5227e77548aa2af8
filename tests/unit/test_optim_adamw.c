/* AdamW: a two-step example worked out by hand in double, weight-decay
 * exclusion, bf16 params rounded once, the state accessors, and config
 * errors that name the key. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "hypershard/optim.h"
#include "optim_fixture.h"

static hs_optim_config adamw_config(double lr, double wd) {
    return of_config("adamw", lr, 0.999, wd, "constant");
}

static hs_optim_param f32_param(const char *fqn, float *data, float *grad, int64_t n, bool decay) {
    hs_optim_param p = {.fqn = fqn,
                        .data = data,
                        .dtype = HS_DTYPE_F32,
                        .grad = grad,
                        .numel = n,
                        .rows = n,
                        .cols = 1,
                        .decay = decay};
    return p;
}

static void assert_close(double got, double want, double rel) {
    if (fabs(got - want) > rel * fmax(fabs(want), 1e-30))
        fail_msg("got %.9g want %.9g (rel tol %g)", got, want, rel);
}

/* lr 0.1, betas (0.9, 0.999), eps 1e-8, wd 0.01; two steps with different
 * grads. Step 1's Adam direction is g/|g| exactly (both corrected moments
 * see one sample); step 2 is written out term by term. */
static void test_two_steps_match_hand_computed_double_values(void **state) {
    (void)state;
    float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.5f, 0.25f, -1.0f};
    hs_optim_config cfg = adamw_config(0.1, 0.01);
    hs_optim_param prm = f32_param("w", p, g, 3, true);
    hs_optim *o = of_create(&cfg, &prm, 1, NULL);

    const double p0[3] = {1.0, -2.0, 0.5}, g1[3] = {0.5, 0.25, -1.0}, g2[3] = {-0.3, 0.25, 2.0};
    double want1[3], want2[3];
    for (int i = 0; i < 3; i++) {
        double shrunk = p0[i] * (1.0 - 0.1 * 0.01);
        want1[i] = shrunk - 0.1 * g1[i] / (fabs(g1[i]) + 1e-8);
    }
    hs_optim_step(o, 0.1, NULL);
    for (int i = 0; i < 3; i++) assert_close(p[i], want1[i], 1e-6);

    for (int i = 0; i < 3; i++) g[i] = (float)g2[i];
    for (int i = 0; i < 3; i++) {
        double m2 = 0.9 * (0.1 * g1[i]) + 0.1 * g2[i];
        double v2 = 0.999 * (0.001 * g1[i] * g1[i]) + 0.001 * g2[i] * g2[i];
        double m_hat = m2 / (1.0 - 0.9 * 0.9);
        double v_hat = v2 / (1.0 - 0.999 * 0.999);
        /* eps goes outside the sqrt of the corrected v (torch). */
        want2[i] = want1[i] * 0.999 - 0.1 * m_hat / (sqrt(v_hat) + 1e-8);
    }
    hs_optim_step(o, 0.1, NULL);
    assert_int_equal(hs_optim_step_count(o), 2);
    for (int i = 0; i < 3; i++) assert_close(p[i], want2[i], 2e-6);
    hs_optim_free(o);
}

/* With |g| == eps the torch rule gives g / (|g| + eps) = 1/2 per unit lr;
 * eps inside the sqrt would give about 1e-4. */
static void test_eps_is_added_after_the_sqrt_of_corrected_v(void **state) {
    (void)state;
    float p[2] = {1.0f, 1.0f}, g[2] = {1e-8f, -1e-8f};
    hs_optim_config cfg = adamw_config(0.1, 0.0);
    hs_optim_param prm = f32_param("w", p, g, 2, true);
    hs_optim *o = of_create(&cfg, &prm, 1, NULL);
    hs_optim_step(o, 0.1, NULL);
    double want = 0.1 * 1e-8 / (1e-8 + 1e-8) * ((double)g[0] / 1e-8);
    assert_close(1.0 - p[0], want, 1e-3);
    assert_close(p[1] - 1.0, want, 1e-3);
    hs_optim_free(o);
}

static void test_no_decay_param_keeps_value_under_zero_grad_while_decayed_shrinks(void **state) {
    (void)state;
    float a[4] = {1, 2, -3, 4}, b[4] = {1, 2, -3, 4}, g[4] = {0};
    hs_optim_config cfg = adamw_config(0.01, 0.1);
    hs_optim_param ps[2] = {f32_param("model.layers.0.self_attn.q_proj.weight", a, g, 4, true),
                            f32_param("model.norm.weight", b, g, 4, false)};
    hs_optim *o = of_create(&cfg, ps, 2, NULL);
    hs_optim_step(o, 0.01, NULL);
    const float orig[4] = {1, 2, -3, 4};
    for (int i = 0; i < 4; i++) {
        assert_true(b[i] == orig[i]);
        assert_true(a[i] == orig[i] * (float)(1.0 - 0.01 * 0.1));
    }
    hs_optim_free(o);
}

/* p = 1 in bf16, lr 1e-3, wd 1: decay alone gives 0.999 and the Adam step
 * another -0.001. Rounded once, 0.998 -> 0.99609375; rounding after the
 * decay would give 1.0 and then 1.0 again. */
static void test_bf16_param_is_updated_in_fp32_and_rounded_once(void **state) {
    (void)state;
    enum { N = 257 };
    uint16_t p[N];
    float g[N], p32[N];
    for (int i = 0; i < N; i++) {
        p32[i] = i == 0 ? 1.0f : hs_round_to(HS_DTYPE_BF16, sinf((float)i) * 3.0f);
        g[i] = i == 0 ? 0.5f : cosf((float)i * 0.7f);
        p[i] = hs_f32_to_bf16(p32[i]);
    }
    hs_optim_config cfg = adamw_config(1e-3, 1.0);
    hs_optim_param prm = {.fqn = "w",
                          .data = p,
                          .dtype = HS_DTYPE_BF16,
                          .grad = g,
                          .numel = N,
                          .rows = N,
                          .cols = 1,
                          .decay = true};
    hs_optim *o = of_create(&cfg, &prm, 1, NULL);
    hs_optim_step(o, 1e-3, NULL);
    assert_int_equal(p[0], hs_f32_to_bf16(0.99609375f));
    for (int i = 1; i < N; i++) {
        double want = (double)p32[i] * (1.0 - 1e-3) - 1e-3 * g[i] / (fabs(g[i]) + 1e-8);
        assert_int_equal(p[i], hs_f32_to_bf16((float)want));
    }
    /* Moments stay fp32 and exact: exp_avg = 0.1 g after one step. */
    assert_int_equal(hs_optim_state_count(o, 0), 2);
    assert_string_equal(hs_optim_state_name(o, 0, 0), "exp_avg");
    assert_string_equal(hs_optim_state_name(o, 0, 1), "exp_avg_sq");
    const float *m = hs_optim_state_data(o, 0, 0);
    for (int i = 0; i < N; i++) assert_true(m[i] == 0.1f * g[i]);
    hs_optim_free(o);
}

/* Restoring moments and the step count reproduces the uninterrupted run. */
static void test_state_restore_continues_bit_identically(void **state) {
    (void)state;
    float a[5] = {1, 2, 3, 4, 5}, b[5], g[5] = {0.1f, -0.2f, 0.3f, -0.4f, 0.5f};
    hs_optim_config cfg = adamw_config(0.05, 0.1);
    hs_optim_param pa = f32_param("a", a, g, 5, true);
    hs_optim *o1 = of_create(&cfg, &pa, 1, NULL);
    hs_optim_step(o1, 0.05, NULL);
    memcpy(b, a, sizeof a);
    hs_optim_param pb = f32_param("a", b, g, 5, true);
    hs_pool pool;
    hs_pool_init(&pool, "test");
    hs_optim *o2 = of_create(&cfg, &pb, 1, &pool);
    assert_int_equal(hs_pool_current(&pool), 2 * 5 * sizeof(float));
    for (int k = 0; k < 2; k++)
        memcpy(hs_optim_state_data(o2, 0, k), hs_optim_state_data(o1, 0, k), sizeof a);
    hs_optim_set_step_count(o2, hs_optim_step_count(o1));
    hs_optim_step(o1, 0.05, NULL);
    hs_optim_step(o2, 0.05, NULL);
    assert_memory_equal(a, b, sizeof a);
    hs_optim_free(o1);
    hs_optim_free(o2);
    assert_int_equal(hs_pool_current(&pool), 0);
}

static void test_bad_config_names_every_key(void **state) {
    (void)state;
    hs_optim_config cfg = adamw_config(-1.0, 0.0);
    cfg.betas[1] = 1.0;
    strcpy(cfg.target, "sgd");
    strcpy(cfg.schedule.decay, "step");
    hs_optim *o = NULL;
    hs_error e;
    assert_int_equal(hs_optim_create(&cfg, NULL, 0, NULL, NULL, &o, &e), HS_ERR_CONFIG);
    assert_null(o);
    assert_non_null(strstr(e.msg, "optimizer.target: 'sgd'"));
    assert_non_null(strstr(e.msg, "optimizer.lr"));
    assert_non_null(strstr(e.msg, "optimizer.betas[1]"));
    assert_non_null(strstr(e.msg, "optimizer.schedule.decay: 'step'"));
}

/* Given a device's device pool, the two moments are device memory: served
 * by its caching allocator (in use: their bytes), counted in the pool the
 * same, zeroed, and handed back on free. */
static void test_states_on_a_device_pool_come_from_the_devices_allocator(void **state) {
    (void)state;
    hs_device *d = NULL;
    hs_error e;
    assert_int_equal(hs_device_create(HS_DEVICE_CPU, NULL, &d, &e), HS_OK);
    hs_optim_config cfg = adamw_config(0.1, 0.1);
    float p[5] = {1, 2, 3, 4, 5}, g[5] = {0};
    hs_optim_param prm = f32_param("w", p, g, 5, true);
    hs_optim *o = NULL;
    assert_int_equal(hs_optim_create(&cfg, &prm, 1, d, &d->device_pool, &o, &e), HS_OK);
    assert_int_equal(hs_device_mem_stats(d).in_use, 2 * 5 * sizeof(float));
    assert_int_equal(hs_pool_current(&d->device_pool), 2 * 5 * sizeof(float));
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 5; i++) assert_true(hs_optim_state_data(o, 0, k)[i] == 0.0f);
    hs_optim_free(o);
    assert_int_equal(hs_device_mem_stats(d).in_use, 0);
    assert_int_equal(hs_pool_current(&d->device_pool), 0);
    hs_device_free(d);
}

static void test_empty_shard_param_is_skipped(void **state) {
    (void)state;
    hs_optim_config cfg = adamw_config(0.1, 0.1);
    hs_optim_param prm = f32_param("w", NULL, NULL, 0, true);
    hs_optim *o = of_create(&cfg, &prm, 1, NULL);
    hs_optim_step(o, 0.1, NULL);
    assert_int_equal(hs_optim_step_count(o), 1);
    hs_optim_free(o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_steps_match_hand_computed_double_values),
        cmocka_unit_test(test_eps_is_added_after_the_sqrt_of_corrected_v),
        cmocka_unit_test(test_no_decay_param_keeps_value_under_zero_grad_while_decayed_shrinks),
        cmocka_unit_test(test_bf16_param_is_updated_in_fp32_and_rounded_once),
        cmocka_unit_test(test_state_restore_continues_bit_identically),
        cmocka_unit_test(test_bad_config_names_every_key),
        cmocka_unit_test(test_states_on_a_device_pool_come_from_the_devices_allocator),
        cmocka_unit_test(test_empty_shard_param_is_skipped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
