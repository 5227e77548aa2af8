/* model/: the dtypes at unit boundaries (hs_model_options.cast_unit_outputs
 * / unit_output_dtype / keep_unit_inputs, i.e. fsdp_config.mix_precision.
 * output_dtype and cast_forward_inputs as the FSDP engine maps them). Each
 * knob changes exactly what it names: the records of every unit's input and
 * output dtype, the dtype the residual stream is really held in, and the
 * loss. */
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
#include "model/internal.h"

#define B 2
#define T 6

static const int32_t TOKENS[B * T] = {1, 5, 2, 9, 3, 0, 10, 4, 4, 7, 8, 6};
static const int32_t TARGETS[B * T] = {5, 2, 9, 3, 6, 10, 4, -1, 7, 8, 6, 1};

static hs_model_config dense_config(void) {
    hs_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.arch, sizeof c.arch, "llama");
    c.vocab_size = 11, c.dim = 16, c.n_layers = 2, c.n_heads = 2, c.n_kv_heads = 1;
    c.ffn_dim = 24, c.norm_eps = 1e-5, c.rope_theta = 10000.0, c.init_std = 0.3;
    return c;
}

static hs_model_config moe_config(void) {
    hs_model_config c = dense_config();
    snprintf(c.arch, sizeof c.arch, "moe");
    c.moe.num_experts = 4, c.moe.top_k = 2, c.moe.expert_ffn_dim = 8;
    c.moe.aux_loss_coef = 0.01;
    return c;
}

/* The options the FSDP engine derives from mix_precision: output_dtype
 * (-1 = null) and cast_forward_inputs, with param_dtype `param`. */
static hs_model_options policy(hs_dtype param, int output_dtype, bool cast_forward_inputs) {
    hs_model_options o;
    memset(&o, 0, sizeof o);
    o.compute_dtype = o.grad_dtype = param;
    o.max_batch = B, o.seq_len = T, o.allocate_params = true;
    o.cast_unit_outputs = output_dtype >= 0;
    o.unit_output_dtype = output_dtype >= 0 ? (hs_dtype)output_dtype : param;
    o.keep_unit_inputs = !cast_forward_inputs;
    return o;
}

static hs_model *run(const hs_model_config *c, const hs_model_options *o, double *loss) {
    hs_model *m = NULL;
    hs_error e;
    if (hs_model_create(c, o, &m, &e) != HS_OK) fail_msg("hs_model_create: %s", e.msg);
    hs_model_init_weights(m, 42);
    hs_batch b = {TOKENS, TARGETS, B, T, NULL, 0};
    double aux = 0.0;
    if (hs_model_forward_backward(m, &b, 1.0f / 11.0f, NULL, loss, &aux, &e) != HS_OK)
        fail_msg("forward_backward: %s", e.msg);
    assert_true(isfinite(*loss));
    return m;
}

static void expect_unit(const hs_model *m, int u, hs_dtype in_stored, hs_dtype in_read,
                        hs_dtype out_computed, hs_dtype out_stored, int64_t casts) {
    const hs_unit_boundary *r = hs_model_unit_boundary(m, u);
    assert_true(r->float_input);
    assert_int_equal(r->input_stored, in_stored);
    assert_int_equal(r->input_read, in_read);
    assert_int_equal(r->output_computed, out_computed);
    assert_int_equal(r->output_stored, out_stored);
    assert_int_equal(r->forward_casts, casts);
    assert_int_equal(r->backward_casts, casts);
}

static void expect_root_uncast(const hs_model *m) {
    const hs_unit_boundary *r = hs_model_unit_boundary(m, 0);
    assert_false(r->float_input);
    assert_int_equal(r->output_computed, HS_DTYPE_F32);
    assert_int_equal(r->output_stored, HS_DTYPE_F32);
    assert_int_equal(r->forward_casts + r->backward_casts, 0);
}

/* How many of the n fp32 values of x are not bf16 values. */
static int64_t non_bf16_values(const void *x, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = ((const float *)x)[i];
        k += hs_bf16_to_f32(hs_f32_to_bf16(v)) != v;
    }
    return k;
}

static void test_all_null_policy_casts_nothing_in_fp32_or_bf16(void **s) {
    (void)s;
    hs_model_config c = dense_config();
    hs_dtype dts[2] = {HS_DTYPE_F32, HS_DTYPE_BF16};
    for (int k = 0; k < 2; k++) {
        hs_model_options o;
        memset(&o, 0, sizeof o);
        o.compute_dtype = o.grad_dtype = dts[k];
        o.max_batch = B, o.seq_len = T, o.allocate_params = true;
        double loss;
        hs_model *m = run(&c, &o, &loss);
        expect_root_uncast(m);
        for (int u = 1; u < hs_model_num_units(m); u++)
            expect_unit(m, u, dts[k], dts[k], dts[k], dts[k], 0);
        hs_model_free(m);
    }
}

static void test_bf16_output_null_cast_inputs_true_keeps_the_stream_in_bf16(void **s) {
    (void)s;
    hs_model_config c = dense_config();
    hs_model_options o = policy(HS_DTYPE_BF16, -1, true);
    double loss;
    hs_model *m = run(&c, &o, &loss);
    expect_root_uncast(m);
    for (int u = 1; u <= 2; u++)
        expect_unit(m, u, HS_DTYPE_BF16, HS_DTYPE_BF16, HS_DTYPE_BF16, HS_DTYPE_BF16, 0);
    hs_model_free(m);
}

/* Without output_dtype every input already is in param_dtype, so turning
 * the input cast off changes nothing at all. */
static void test_bf16_output_null_cast_inputs_false_is_bitwise_the_cast_run(void **s) {
    (void)s;
    hs_model_config c = dense_config();
    hs_model_options on = policy(HS_DTYPE_BF16, -1, true), off = policy(HS_DTYPE_BF16, -1, false);
    double l_on, l_off;
    hs_model *a = run(&c, &on, &l_on), *b = run(&c, &off, &l_off);
    expect_root_uncast(b);
    for (int u = 1; u <= 2; u++)
        expect_unit(b, u, HS_DTYPE_BF16, HS_DTYPE_BF16, HS_DTYPE_BF16, HS_DTYPE_BF16, 0);
    assert_true(l_on == l_off);
    for (int i = 0; i < hs_model_num_params(a); i++) {
        const hs_param *pa = hs_model_param(a, i), *pb = hs_model_param(b, i);
        int64_t n = 1;
        for (int d = 0; d < pa->ndim; d++) n *= pa->shape[d];
        assert_memory_equal(pa->grad, pb->grad, (size_t)n * 2);
    }
    hs_model_free(a);
    hs_model_free(b);
}

/* output_dtype float32: every block hands on fp32; cast_forward_inputs
 * rounds it back to bf16 at the next block, so the stream keeps bf16
 * values and the forward equals the uncast run bit for bit. */
static void test_bf16_output_f32_cast_inputs_true_widens_outputs_and_narrows_inputs(void **s) {
    (void)s;
    hs_model_config c = dense_config();
    hs_model_options o = policy(HS_DTYPE_BF16, HS_DTYPE_F32, true);
    hs_model_options plain = policy(HS_DTYPE_BF16, -1, true);
    double loss, l_plain;
    hs_model *m = run(&c, &o, &loss), *p = run(&c, &plain, &l_plain);
    expect_root_uncast(m);
    expect_unit(m, 1, HS_DTYPE_BF16, HS_DTYPE_BF16, HS_DTYPE_BF16, HS_DTYPE_F32, 1);
    expect_unit(m, 2, HS_DTYPE_F32, HS_DTYPE_BF16, HS_DTYPE_BF16, HS_DTYPE_F32, 2);
    assert_int_equal(hs_model_chunk_stream_dtype(m, 0, 2), HS_DTYPE_F32);
    assert_int_equal(non_bf16_values(m->resid[2], (int64_t)B * T * 16), 0);
    assert_true(loss == l_plain);
    hs_model_free(m);
    hs_model_free(p);
}

/* output_dtype float32 without the input cast: from block 1 on the
 * residual stream is added and held in fp32 while the GEMMs use bf16
 * weights, so the stream carries values bf16 cannot hold. */
static void test_bf16_output_f32_cast_inputs_false_keeps_an_fp32_residual_stream(void **s) {
    (void)s;
    hs_model_config c = dense_config();
    hs_model_options o = policy(HS_DTYPE_BF16, HS_DTYPE_F32, false);
    hs_model_options plain = policy(HS_DTYPE_BF16, -1, true);
    double loss, l_plain;
    hs_model *m = run(&c, &o, &loss), *p = run(&c, &plain, &l_plain);
    expect_root_uncast(m);
    expect_unit(m, 1, HS_DTYPE_BF16, HS_DTYPE_BF16, HS_DTYPE_BF16, HS_DTYPE_F32, 1);
    expect_unit(m, 2, HS_DTYPE_F32, HS_DTYPE_F32, HS_DTYPE_F32, HS_DTYPE_F32, 0);
    assert_true(non_bf16_values(m->resid[2], (int64_t)B * T * 16) > 0);
    assert_true(loss != l_plain);
    assert_true(fabs(loss - l_plain) < 0.05 * fabs(l_plain));
    hs_model_free(m);
    hs_model_free(p);
}

/* The nested expert unit reads rows of post_attention_layernorm, already
 * in param_dtype; its outputs are handed on in output_dtype. */
static void test_moe_expert_unit_outputs_follow_output_dtype(void **s) {
    (void)s;
    hs_model_config c = moe_config();
    hs_model_options o = policy(HS_DTYPE_BF16, HS_DTYPE_F32, false);
    double loss;
    hs_model *m = run(&c, &o, &loss);
    assert_int_equal(hs_model_num_units(m), 5);
    for (int u = 1; u < 5; u++) {
        if (!hs_model_unit(m, u)->is_expert) continue;
        expect_unit(m, u, HS_DTYPE_BF16, HS_DTYPE_BF16, HS_DTYPE_BF16, HS_DTYPE_F32, 1);
    }
    expect_unit(m, 3, HS_DTYPE_F32, HS_DTYPE_F32, HS_DTYPE_F32, HS_DTYPE_F32, 0);
    hs_model_free(m);
}

/* fp32 params with output_dtype bfloat16: every unit's output, the root's
 * logits included, is rounded to bf16. */
static void test_fp32_output_bf16_rounds_every_unit_output_and_the_logits(void **s) {
    (void)s;
    hs_model_config c = dense_config();
    hs_model_options o = policy(HS_DTYPE_F32, HS_DTYPE_BF16, false);
    double loss;
    hs_model *m = run(&c, &o, &loss);
    const hs_unit_boundary *r = hs_model_unit_boundary(m, 0);
    assert_int_equal(r->output_stored, HS_DTYPE_BF16);
    assert_int_equal(r->forward_casts, 1);
    expect_unit(m, 1, HS_DTYPE_F32, HS_DTYPE_F32, HS_DTYPE_F32, HS_DTYPE_BF16, 1);
    expect_unit(m, 2, HS_DTYPE_BF16, HS_DTYPE_BF16, HS_DTYPE_F32, HS_DTYPE_BF16, 1);
    float logits[B * T * 11];
    hs_batch b = {TOKENS, TARGETS, B, T, NULL, 0};
    hs_error e;
    assert_int_equal(hs_model_forward(m, &b, NULL, NULL, logits, &e), HS_OK);
    assert_int_equal(non_bf16_values(logits, B * T * 11), 0);
    hs_model_free(m);
}

static int64_t numel(const hs_param *p) {
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    return n;
}

/* Recompute re-runs the block forward (full) or its element-wise ops
 * (selective) with its boundary casts: the same loss and gradients as
 * keeping every block's activations. */
static void test_recompute_repeats_the_boundary_casts_bit_for_bit(void **s) {
    (void)s;
    hs_model_config cfgs[2] = {dense_config(), moe_config()};
    for (int r = 0; r < 8; r++) { /* config, input cast, full or selective */
        int k = r & 1, cast_in = (r >> 1) & 1;
        hs_model_options o = policy(HS_DTYPE_BF16, HS_DTYPE_F32, cast_in);
        hs_model_options ac = o;
        ac.activation_checkpointing = r >> 2 ? HS_AC_SELECTIVE : HS_AC_FULL;
        double l, l_ac;
        hs_model *a = run(&cfgs[k], &o, &l), *b = run(&cfgs[k], &ac, &l_ac);
        assert_true(l == l_ac);
        for (int i = 0; i < hs_model_num_params(a); i++)
            assert_memory_equal(hs_model_param(a, i)->grad, hs_model_param(b, i)->grad,
                                (size_t)numel(hs_model_param(a, i)) * 2);
        hs_model_free(a);
        hs_model_free(b);
    }
}

/* A 16-bit output_dtype under fp32 params rounds the expert rows too: the
 * MoE run moves off the uncast fp32 run. */
static void test_moe_fp32_output_bf16_rounds_the_expert_rows(void **s) {
    (void)s;
    hs_model_config c = moe_config();
    hs_model_options o = policy(HS_DTYPE_F32, HS_DTYPE_BF16, true);
    hs_model_options plain = policy(HS_DTYPE_F32, -1, true);
    double loss, l_plain;
    hs_model *m = run(&c, &o, &loss), *p = run(&c, &plain, &l_plain);
    expect_unit(m, 2, HS_DTYPE_F32, HS_DTYPE_F32, HS_DTYPE_F32, HS_DTYPE_BF16, 1);
    expect_unit(m, 3, HS_DTYPE_BF16, HS_DTYPE_F32, HS_DTYPE_F32, HS_DTYPE_BF16, 2);
    const hs_moe_act *a = &m->acts[0].moe, *pa = &p->acts[0].moe;
    int64_t rows = (int64_t)a->BT * a->cap.K * a->cap.C;
    assert_int_equal(non_bf16_values(a->y, rows), 0);
    assert_true(non_bf16_values(pa->y, rows) > 0);
    assert_true(loss != l_plain);
    assert_true(fabs(loss - l_plain) < 0.02 * fabs(l_plain));
    hs_model_free(m);
    hs_model_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_null_policy_casts_nothing_in_fp32_or_bf16),
        cmocka_unit_test(test_bf16_output_null_cast_inputs_true_keeps_the_stream_in_bf16),
        cmocka_unit_test(test_bf16_output_null_cast_inputs_false_is_bitwise_the_cast_run),
        cmocka_unit_test(test_bf16_output_f32_cast_inputs_true_widens_outputs_and_narrows_inputs),
        cmocka_unit_test(test_bf16_output_f32_cast_inputs_false_keeps_an_fp32_residual_stream),
        cmocka_unit_test(test_moe_expert_unit_outputs_follow_output_dtype),
        cmocka_unit_test(test_fp32_output_bf16_rounds_every_unit_output_and_the_logits),
        cmocka_unit_test(test_recompute_repeats_the_boundary_casts_bit_for_bit),
        cmocka_unit_test(test_moe_fp32_output_bf16_rounds_the_expert_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
