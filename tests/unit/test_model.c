/* model/: the dense Llama decoder end to end — registry, init, gradients
 * against finite differences, GQA, tied embeddings, recompute, hooks. */
#include <float.h>
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

static hs_model_config tiny_config(void) { return mf_config("llama", 1); }

static hs_batch tiny_batch(void) {
    hs_batch b = {.tokens = TOKENS, .targets = TARGETS, .B = 2, .T = 5};
    return b;
}

static double step(hs_model *m, float scale, const hs_model_hooks *hooks) {
    double loss, aux;
    mf_step(m, scale, hooks, &loss, &aux);
    return loss;
}

static double eval_loss(hs_model *m) {
    hs_batch b = tiny_batch();
    double loss = 0.0;
    hs_error e;
    if (hs_model_forward(m, &b, NULL, &loss, NULL, &e) != HS_OK) fail_msg("forward: %s", e.msg);
    return loss;
}

static void test_fqns_shapes_and_units_follow_hf_llama(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *m = mf_make(&c, &o, 1);
    const char *expect[] = {"model.embed_tokens.weight",
                            "model.layers.0.self_attn.q_proj.weight",
                            "model.layers.0.self_attn.k_proj.weight",
                            "model.layers.0.self_attn.v_proj.weight",
                            "model.layers.0.self_attn.o_proj.weight",
                            "model.layers.0.mlp.gate_proj.weight",
                            "model.layers.0.mlp.up_proj.weight",
                            "model.layers.0.mlp.down_proj.weight",
                            "model.layers.0.input_layernorm.weight",
                            "model.layers.0.post_attention_layernorm.weight"};
    for (int i = 0; i < 10; i++) assert_string_equal(hs_model_param(m, i)->fqn, expect[i]);
    assert_int_equal(hs_model_num_params(m), 1 + 9 * 2 + 2);
    assert_string_equal(hs_model_param(m, 19)->fqn, "model.norm.weight");
    assert_string_equal(hs_model_param(m, 20)->fqn, "lm_head.weight");
    hs_param *k =
        hs_model_param(m, hs_model_find_param(m, "model.layers.1.self_attn.k_proj.weight"));
    assert_int_equal(k->shape[0], 4); /* KVH * HD = 1 * 4 */
    assert_int_equal(k->shape[1], 8);
    assert_int_equal(k->unit, 2);
    hs_param *d = hs_model_param(m, hs_model_find_param(m, "model.layers.0.mlp.down_proj.weight"));
    assert_int_equal(d->shape[0], 8);
    assert_int_equal(d->shape[1], 12);
    assert_int_equal(d->kind, HS_PARAM_LINEAR);
    assert_int_equal(hs_model_param(m, 20)->kind, HS_PARAM_LM_HEAD);
    assert_int_equal(hs_model_param(m, 20)->unit, 0);
    assert_int_equal(hs_model_num_units(m), 3);
    assert_string_equal(hs_model_unit(m, 0)->name, "");
    assert_int_equal(hs_model_unit(m, 0)->parent, -1);
    assert_string_equal(hs_model_unit(m, 2)->name, "model.layers.1");
    assert_int_equal(hs_model_unit(m, 2)->parent, 0);
    assert_int_equal(hs_model_find_param(m, "model.layers.2.mlp.up_proj.weight"), -1);
    int64_t total = 11 * 8 * 2 + 8 + 2 * (16 * 8 + 2 * 4 * 8 + 3 * 12 * 8 + 2 * 8);
    assert_int_equal(hs_model_param_count(m), total);
    assert_string_equal(hs_param_kind_name(HS_PARAM_NORM), "norm");
    hs_model_free(m);
}

static void test_flops_per_token_is_6_n_plus_6_l_t_c(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *m = mf_make(&c, &o, 1);
    double n = (double)hs_model_param_count(m) - 11 * 8; /* all but the embedding */
    assert_float_equal(hs_model_flops_per_token(m, 5), 6 * n + 6.0 * 2 * 5 * 8, 1e-6);
    hs_model_free(m);
    c.tie_embeddings = true; /* lm_head product still costs 6 * V * C */
    m = mf_make(&c, &o, 1);
    assert_float_equal(hs_model_flops_per_token(m, 5), 6 * n + 6.0 * 2 * 5 * 8, 1e-6);
    hs_model_free(m);
}

static void test_init_rows_3_to_7_equal_the_same_slice_of_the_full_init(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *m = mf_make(&c, &o, 42);
    hs_param *p = hs_model_param(m, hs_model_find_param(m, "model.layers.1.mlp.gate_proj.weight"));
    float part[5 * 8];
    hs_model_init_param_rows(m, p, 42, part, HS_DTYPE_F32, 3, 5);
    assert_memory_equal(part, (float *)p->data + 3 * 8, sizeof part);
    double ss = 0.0; /* std is init_std: sanity, not a statistics test */
    for (int64_t i = 0; i < mf_numel(p); i++) ss += ((float *)p->data)[i] * ((float *)p->data)[i];
    assert_true(fabs(sqrt(ss / mf_numel(p)) - 0.3) < 0.1);
    hs_param *n = hs_model_param(m, hs_model_find_param(m, "model.norm.weight"));
    for (int i = 0; i < 8; i++) assert_float_equal(((float *)n->data)[i], 1.0f, 0.0f);
    uint16_t half[5 * 8];
    hs_model_init_param_rows(m, p, 42, half, HS_DTYPE_BF16, 3, 5);
    for (int i = 0; i < 40; i++)
        assert_int_equal(half[i], hs_f32_to_bf16(((float *)p->data)[3 * 8 + i]));
    hs_model_free(m);
}

/* A model whose weights come from a file draws no init: the load writes
 * every element of its own parameters, so hs_model_init_weights leaves them
 * as they are (here a marker, neither drawn nor zeroed), and the row
 * initialiser (an FSDP shard's) fills zeros, norms included, whatever was
 * in the memory before. */
static void test_weights_from_file_draws_no_init_and_fills_zeros(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    o.weights_from_file = true;
    hs_model *m = mf_make(&c, &o, 42);
    for (int i = 0; i < hs_model_num_params(m); i++) {
        hs_param *p = hs_model_param(m, i);
        for (int64_t j = 0; j < mf_numel(p); j++) ((float *)p->data)[j] = 7.0f;
    }
    hs_model_init_weights(m, 42);
    for (int i = 0; i < hs_model_num_params(m); i++) {
        hs_param *p = hs_model_param(m, i);
        for (int64_t j = 0; j < mf_numel(p); j++) assert_true(((float *)p->data)[j] == 7.0f);
    }
    hs_param *norm = hs_model_param(m, hs_model_find_param(m, "model.norm.weight"));
    float row[64];
    int64_t nn = mf_numel(norm);
    assert_true(norm->ndim == 1 && nn <= 64);
    for (int i = 0; i < nn; i++) row[i] = NAN;
    hs_model_init_param_rows(m, norm, 42, row, HS_DTYPE_F32, 0, nn);
    for (int i = 0; i < nn; i++) assert_true(row[i] == 0.0f);
    hs_param *p = hs_model_param(m, hs_model_find_param(m, "model.layers.1.mlp.gate_proj.weight"));
    float part[5 * 8];
    for (int i = 0; i < 40; i++) part[i] = NAN;
    hs_model_init_param_rows(m, p, 42, part, HS_DTYPE_F32, 3, 5);
    for (int i = 0; i < 40; i++) assert_true(part[i] == 0.0f);
    hs_model_free(m);
}

/* Gradients handed out unset (hs_model_unset_grads; the buffers hold
 * NaN here) end two accumulated micro-batches bit for bit where zeroed
 * ones do: each dense linear's first weight GEMM stores over its buffer.
 * A gradient still unset when it is read settles to zero. */
static void test_unset_gradients_equal_zeroed_ones(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *a = mf_make(&c, &o, 7), *b = mf_make(&c, &o, 7);
    hs_model_zero_grads(a);
    hs_model_unset_grads(b);
    int unset = 0;
    for (int i = 0; i < hs_model_num_params(b); i++) {
        hs_param *p = hs_model_param(b, i);
        if (!p->grad_unset) continue;
        assert_int_equal(p->kind, HS_PARAM_LINEAR);
        memset(p->grad, 0xFF, (size_t)mf_numel(p) * sizeof(float)); /* NaN */
        unset++;
    }
    assert_int_equal(unset, 7 * c.n_layers); /* q, k, v, o, gate, up, down */
    for (int k = 0; k < 2; k++) step(a, 0.5f, NULL), step(b, 0.5f, NULL);
    for (int i = 0; i < hs_model_num_params(b); i++) {
        hs_param *p = hs_model_param(b, i);
        assert_false(p->grad_unset);
        assert_memory_equal(p->grad, hs_model_param(a, i)->grad,
                            (size_t)mf_numel(p) * sizeof(float));
    }
    hs_param *w = hs_model_param(b, hs_model_find_param(b, "model.layers.0.mlp.up_proj.weight"));
    memset(w->grad, 0xFF, (size_t)mf_numel(w) * sizeof(float));
    w->grad_unset = true;
    hs_param_grad_settle(hs_model_device(b), w);
    for (int64_t j = 0; j < mf_numel(w); j++) assert_float_equal(((float *)w->grad)[j], 0.0f, 0.0f);
    hs_model_free(a);
    hs_model_free(b);
}

static double loss_at(hs_model *m, float *w, float v, float scale) {
    w[0] = v;
    return eval_loss(m) * scale;
}

/* Richardson-extrapolated central difference: (4 D(h/2) - D(h)) / 3 cancels
 * the h^2 term, which RMSNorm's curvature makes large at this tiny size. */
static double fd_grad(hs_model *m, float *w, float scale) {
    const float h = 1e-2f;
    float keep = w[0];
    double d1 = (loss_at(m, w, keep + h, scale) - loss_at(m, w, keep - h, scale)) / (2.0 * h);
    double d2 = (loss_at(m, w, keep + h / 2, scale) - loss_at(m, w, keep - h / 2, scale)) / h;
    w[0] = keep;
    return (4.0 * d2 - d1) / 3.0;
}

/* Central differences on a few elements of every tensor, loss as the mean
 * over valid tokens, compared with the analytic gradient: within 1% of
 * their size plus the difference's own rounding. The loss is an fp32 sum
 * (a few ulps of it, 8 taken), and fd_grad's (4 D(h/2) - D(h)) / 3
 * carries 3 ulp-errors / h of it: about 4e-5 at this loss and h, which is
 * what an element whose gradient is 1e-5 shows (a change in attention's
 * summation order moved one such finite difference from -2.3e-5 to
 * -3.0e-5 while its analytic value stayed at -1.6508e-5). */
static void check_model_fd(hs_model *m, int per_tensor) {
    const float scale = 1.0f / 9.0f;
    hs_model_zero_grads(m);
    double loss = step(m, scale, NULL) * scale;
    double noise = 3.0 * 8.0 * (FLT_EPSILON / 2.0) * fabs(loss) / 1e-2;
    double worst = 0.0;
    for (int i = 0; i < hs_model_num_params(m); i++) {
        hs_param *p = hs_model_param(m, i);
        float *w = p->data, *g = p->grad;
        int64_t n = mf_numel(p);
        for (int k = 0; k < per_tensor; k++) {
            int64_t j = (k * 7919 + i * 31) % n;
            double fd = fd_grad(m, w + j, scale), an = g[j];
            double err = fabs(fd - an) / (fabs(fd) + fabs(an) + 1e-3);
            if (err > worst) worst = err;
            if (fabs(fd - an) > 1e-2 * (fabs(fd) + fabs(an) + 1e-3) + noise)
                fail_msg("%s[%lld]: analytic %.6g vs finite difference %.6g", p->fqn, (long long)j,
                         an, fd);
        }
    }
    print_message("whole-model FD: worst relative error %.3g\n", worst);
}

static void test_whole_model_gradients_match_finite_differences(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *m = mf_make(&c, &o, 7);
    check_model_fd(m, 4);
    hs_model_free(m);
}

/* qwen3: q_norm / k_norm [HD] after o_proj in Hugging Face's order, a head
 * size apart from dim / n_heads (2 heads of 6 on dim 8: q_proj [12, 8]),
 * and every gradient, the per-head norms' among them, against finite
 * differences. */
static void test_qwen3_head_norms_and_head_dim_match_fd(void **state) {
    (void)state;
    hs_model_config c = mf_config("qwen3", 1);
    c.head_dim = 6;
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *m = mf_make(&c, &o, 7);
    assert_int_equal(hs_model_num_params(m), 1 + 11 * 2 + 2);
    assert_string_equal(hs_model_param(m, 5)->fqn, "model.layers.0.self_attn.q_norm.weight");
    assert_string_equal(hs_model_param(m, 6)->fqn, "model.layers.0.self_attn.k_norm.weight");
    for (int i = 5; i <= 6; i++) {
        const hs_param *p = hs_model_param(m, i);
        assert_int_equal(p->ndim, 1);
        assert_int_equal(p->shape[0], 6);
        assert_int_equal(p->kind, HS_PARAM_NORM);
        assert_true(p->per_head);
    }
    const hs_param *q = hs_model_param(m, 1), *wo = hs_model_param(m, 4);
    assert_true(q->shape[0] == 12 && q->shape[1] == 8 && wo->shape[0] == 8 && wo->shape[1] == 12);
    /* norm weights away from ones, so a weight applied on the wrong axis shows */
    for (int i = 0; i < hs_model_num_params(m); i++) {
        hs_param *p = hs_model_param(m, i);
        for (int64_t j = 0; p->kind == HS_PARAM_NORM && j < mf_numel(p); j++)
            ((float *)p->data)[j] = 1.0f + 0.1f * (float)((j * 7 + i) % 5 - 2);
    }
    check_model_fd(m, 6);
    hs_model_free(m);
}

static void test_tied_embeddings_have_no_lm_head_and_match_fd(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    c.tie_embeddings = true;
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *m = mf_make(&c, &o, 7);
    assert_int_equal(hs_model_find_param(m, "lm_head.weight"), -1);
    assert_int_equal(hs_model_num_params(m), 1 + 9 * 2 + 1);
    check_model_fd(m, 6);
    hs_model_free(m);
}

/* A tied model is an untied one whose lm_head equals the embedding; its
 * embedding gradient is the sum of the untied model's two gradients. */
static void test_tied_embedding_gradient_is_sum_of_both_uses(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *u = mf_make(&c, &o, 3);
    c.tie_embeddings = true;
    hs_model *t = mf_make(&c, &o, 3);
    hs_param *ue = hs_model_param(u, 0),
             *uh = hs_model_param(u, hs_model_find_param(u, "lm_head.weight"));
    memcpy(uh->data, ue->data, 11 * 8 * sizeof(float));
    double lu = step(u, 1.0f, NULL), lt = step(t, 1.0f, NULL);
    assert_float_equal(lu, lt, 1e-9 * fabs(lu));
    const float *te = hs_model_param(t, 0)->grad;
    float big = hs_max_abs_f32(te, 11 * 8);
    for (int i = 0; i < 11 * 8; i++) {
        float want = ((float *)ue->grad)[i] + ((float *)uh->grad)[i];
        assert_float_equal(te[i], want, 1e-5 * big);
    }
    hs_model_free(u);
    hs_model_free(t);
}

/* GQA with KVH=1 equals MHA (KVH=2) whose two k/v heads are copies. */
static void test_gqa_one_kv_head_equals_mha_with_duplicated_kv_weights(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *g = mf_make(&c, &o, 5);
    c.n_kv_heads = 2;
    hs_model *mha = mf_make(&c, &o, 5);
    for (int i = 0; i < hs_model_num_params(g); i++) {
        hs_param *pg = hs_model_param(g, i), *pm = hs_model_param(mha, i);
        bool kv = strstr(pg->fqn, "k_proj") || strstr(pg->fqn, "v_proj");
        if (!kv) {
            memcpy(pm->data, pg->data, (size_t)mf_numel(pg) * sizeof(float));
            continue;
        }
        assert_int_equal(pm->shape[0], 2 * pg->shape[0]);
        memcpy(pm->data, pg->data, (size_t)mf_numel(pg) * sizeof(float));
        memcpy((float *)pm->data + mf_numel(pg), pg->data, (size_t)mf_numel(pg) * sizeof(float));
    }
    double lg = step(g, 1.0f, NULL), lm = step(mha, 1.0f, NULL);
    assert_float_equal(lg, lm, 1e-6 * fabs(lg));
    for (int i = 0; i < hs_model_num_params(g); i++) {
        hs_param *pg = hs_model_param(g, i), *pm = hs_model_param(mha, i);
        float *gg = pg->grad, *gm = pm->grad;
        bool kv = strstr(pg->fqn, "k_proj") || strstr(pg->fqn, "v_proj");
        float big = hs_max_abs_f32(gm, mf_numel(pm));
        for (int64_t j = 0; j < mf_numel(pg); j++) {
            /* the shared head's gradient is the sum over the heads it serves */
            double want = kv ? (double)gm[j] + gm[j + mf_numel(pg)] : gm[j];
            assert_float_equal(gg[j], want, 1e-5 * big);
        }
    }
    hs_model_free(g);
    hs_model_free(mha);
}

/* Full and selective checkpointing give the loss and gradients of keeping
 * everything bit for bit, full in less memory than selective, selective in
 * less than none. */
static void test_activation_checkpointing_is_bitwise_identical(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    const hs_ac_mode modes[3] = {HS_AC_OFF, HS_AC_SELECTIVE, HS_AC_FULL};
    hs_device *d[3] = {NULL};
    hs_model *m[3];
    double loss[3];
    hs_error e = {0};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(hs_device_create(HS_DEVICE_CPU, NULL, &d[k], &e), HS_OK);
        o.dev = d[k];
        o.activation_checkpointing = modes[k];
        m[k] = mf_make(&c, &o, 9);
        loss[k] = step(m[k], 0.1f, NULL);
    }
    for (int k = 1; k < 3; k++) {
        assert_memory_equal(&loss[0], &loss[k], sizeof loss[0]);
        mf_assert_grads_equal(m[0], m[k]);
        assert_true(hs_pool_peak(&d[k]->device_pool) < hs_pool_peak(&d[k - 1]->device_pool));
    }
    for (int k = 0; k < 3; k++) {
        hs_model_free(m[k]);
        hs_device_free(d[k]);
    }
}

static float grad_at(const hs_param *p, int64_t j) {
    return p->grad_dtype == HS_DTYPE_F32    ? ((float *)p->grad)[j]
           : p->grad_dtype == HS_DTYPE_BF16 ? hs_bf16_to_f32(((uint16_t *)p->grad)[j])
                                            : hs_f16_to_f32(((uint16_t *)p->grad)[j]);
}

/* Same weights (rounded) in compute dtype cdt, gradients in gdt: the loss
 * within 2% and every gradient tensor within 10% (of its norm) of fp32. */
static void check_low_precision(hs_dtype cdt, hs_dtype gdt) {
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *f = mf_make(&c, &o, 11);
    o.compute_dtype = cdt;
    o.grad_dtype = gdt;
    hs_model *h = mf_make(&c, &o, 11);
    for (int i = 0; i < hs_model_num_params(f); i++) {
        hs_param *pf = hs_model_param(f, i), *ph = hs_model_param(h, i);
        hs_convert(ph->data, cdt, pf->data, HS_DTYPE_F32, mf_numel(pf));
    }
    double lf = step(f, 1.0f / 9, NULL), lh = step(h, 1.0f / 9, NULL);
    assert_true(isfinite(lh));
    if (fabs(lh - lf) > 0.02 * fabs(lf))
        fail_msg("%s loss %.6g vs fp32 %.6g", hs_dtype_name(cdt), lh, lf);
    for (int i = 0; i < hs_model_num_params(f); i++) {
        hs_param *pf = hs_model_param(f, i), *ph = hs_model_param(h, i);
        double d2 = 0.0, n2 = 0.0;
        for (int64_t j = 0; j < mf_numel(pf); j++) {
            float gh = grad_at(ph, j), gf = ((float *)pf->grad)[j];
            assert_true(isfinite(gh));
            d2 += (double)(gh - gf) * (gh - gf);
            n2 += (double)gf * gf;
        }
        if (sqrt(d2) > 0.1 * sqrt(n2) + 1e-6)
            fail_msg("%s/%s %s: gradient differs from fp32 by %.3g of its norm", hs_dtype_name(cdt),
                     hs_dtype_name(gdt), pf->fqn, sqrt(d2 / n2));
    }
    hs_model_free(f);
    hs_model_free(h);
}

static void test_bf16_run_is_finite_and_close_to_fp32(void **state) {
    (void)state;
    check_low_precision(HS_DTYPE_BF16, HS_DTYPE_BF16);
}

static void test_bf16_compute_with_fp32_grads_is_close_to_fp32(void **state) {
    (void)state;
    check_low_precision(HS_DTYPE_BF16, HS_DTYPE_F32);
}

static void test_f16_run_is_finite_and_close_to_fp32(void **state) {
    (void)state;
    check_low_precision(HS_DTYPE_F16, HS_DTYPE_F16);
}

/* ------------------------------------------------------------------ hooks */

static void check_hooks(bool ckpt, const char *want) {
    hs_model_config c = tiny_config();
    mf_check_hooks(&c, mf_options(HS_DTYPE_F32, ckpt), 13, 0.5f, want);
}

static void test_hooks_run_in_documented_order_and_params_are_read_after_them(void **state) {
    (void)state;
    check_hooks(false, "F0 F1 f1 F2 f2 f0 B0 B2 b2 B1 b1 b0 END ");
}

static void test_checkpointing_reenters_pre_forward_after_pre_backward(void **state) {
    (void)state;
    check_hooks(true, "F0 F1 f1 F2 f2 f0 B0 B2 F2 f2 b2 B1 F1 f1 b1 b0 END ");
}

/* ----------------------------------------------------------------- misc */

static void test_forward_logits_give_the_same_loss_as_forward_backward(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *m = mf_make(&c, &o, 17);
    float logits[10 * 11];
    hs_batch b = tiny_batch();
    double lf = 0.0;
    hs_error e;
    assert_int_equal(hs_model_forward(m, &b, NULL, &lf, logits, &e), HS_OK);
    double want = 0.0;
    for (int n = 0; n < 10; n++) {
        if (TARGETS[n] < 0) continue;
        double s = 0.0;
        for (int v = 0; v < 11; v++) s += exp(logits[n * 11 + v]);
        want += log(s) - logits[n * 11 + TARGETS[n]];
    }
    assert_float_equal(lf, want, 1e-5 * want);
    assert_float_equal(step(m, 1.0f, NULL), lf, 1e-12);
    hs_model_free(m);
}

/* Causality and short batches: B=1, T=3 gives the first 3 positions' logits
 * of the T=5 run, whatever tokens follow. */
static void test_logits_of_a_prefix_do_not_depend_on_later_tokens(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *m = mf_make(&c, &o, 23);
    float full[10 * 11], part[3 * 11];
    hs_batch b = tiny_batch();
    hs_error e;
    assert_int_equal(hs_model_forward(m, &b, NULL, NULL, full, &e), HS_OK);
    hs_batch p = {.tokens = TOKENS, .targets = NULL, .B = 1, .T = 3};
    assert_int_equal(hs_model_forward(m, &p, NULL, NULL, part, &e), HS_OK);
    for (int i = 0; i < 3 * 11; i++) assert_float_equal(part[i], full[i], 1e-6);
    hs_model_free(m);
}

/* Gradients add over sequences. B=2, T=200 (400 rows: the head runs in a
 * 256-row chunk and a 144-row one) equals the sum of each sequence alone. */
static void test_batch_gradient_is_the_sum_over_its_sequences(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    o.seq_len = 200;
    hs_model *both = mf_make(&c, &o, 29), *each = mf_make(&c, &o, 29);
    int32_t tok[400], tgt[400];
    for (int i = 0; i < 400; i++)
        tok[i] = (i * 7 + 3) % 11, tgt[i] = i % 13 == 0 ? -1 : (i * 5) % 11;
    hs_error e;
    double l2 = 0.0, la = 0.0, lb = 0.0, aux;
    hs_batch b2 = {.tokens = tok, .targets = tgt, .B = 2, .T = 200};
    hs_batch ba = {.tokens = tok, .targets = tgt, .B = 1, .T = 200};
    hs_batch bb = {.tokens = tok + 200, .targets = tgt + 200, .B = 1, .T = 200};
    assert_int_equal(hs_model_forward_backward(both, &b2, 0.01f, NULL, &l2, &aux, &e), HS_OK);
    assert_int_equal(hs_model_forward_backward(each, &ba, 0.01f, NULL, &la, &aux, &e), HS_OK);
    assert_int_equal(hs_model_forward_backward(each, &bb, 0.01f, NULL, &lb, &aux, &e), HS_OK);
    assert_float_equal(l2, la + lb, 1e-6 * l2);
    for (int i = 0; i < hs_model_num_params(both); i++) {
        hs_param *p = hs_model_param(both, i), *q = hs_model_param(each, i);
        float big = hs_max_abs_f32(p->grad, mf_numel(p));
        for (int64_t j = 0; j < mf_numel(p); j++)
            assert_float_equal(((float *)p->grad)[j], ((float *)q->grad)[j], 1e-5 * big);
    }
    hs_model_free(both);
    hs_model_free(each);
}

static void test_ignored_targets_add_no_loss_and_no_gradient(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *m = mf_make(&c, &o, 19);
    const int32_t none[10] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    hs_batch b = {.tokens = TOKENS, .targets = none, .B = 2, .T = 5};
    double loss = 1.0, aux = 1.0;
    hs_error e;
    assert_int_equal(hs_model_forward_backward(m, &b, 1.0f, NULL, &loss, &aux, &e), HS_OK);
    assert_float_equal(loss, 0.0, 0.0);
    assert_float_equal(aux, 0.0, 0.0);
    for (int i = 0; i < hs_model_num_params(m); i++) {
        hs_param *p = hs_model_param(m, i);
        assert_float_equal(hs_max_abs_f32(p->grad, mf_numel(p)), 0.0f, 0.0f);
    }
    hs_model_free(m);
}

static void test_token_outside_vocab_is_an_error_naming_its_position(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *m = mf_make(&c, &o, 1);
    int32_t bad[10];
    memcpy(bad, TOKENS, sizeof bad);
    bad[7] = 11;
    hs_batch b = {.tokens = bad, .targets = TARGETS, .B = 2, .T = 5};
    double loss;
    hs_error e;
    assert_int_equal(hs_model_forward(m, &b, NULL, &loss, NULL, &e), HS_ERR_FORMAT);
    assert_non_null(strstr(e.msg, "tokens[7] (sequence 1, position 2) = 11"));
    assert_non_null(strstr(e.msg, "model.vocab_size=11"));
    b.tokens = TOKENS;
    b.B = 3;
    assert_int_equal(hs_model_forward(m, &b, NULL, &loss, NULL, &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "max_batch=2"));
    hs_model_free(m);
}

static void test_kv_heads_not_dividing_heads_is_a_config_error(void **state) {
    (void)state;
    hs_model_config c = tiny_config();
    c.n_heads = 4;
    c.n_kv_heads = 3;
    hs_model_options o = mf_options(HS_DTYPE_F32, false);
    hs_model *m = (hs_model *)1;
    hs_error e;
    assert_int_equal(hs_model_create(&c, &o, &m, &e), HS_ERR_CONFIG);
    assert_null(m);
    assert_non_null(strstr(e.msg, "model.n_kv_heads=3 must divide model.n_heads=4"));
}

/* RoPE's frequencies against the formulas of transformers'
 * modeling_rope_utils, written out here in double: plain (bit for bit the
 * fp32 1 / theta^(2i/HD)), Llama 3.1's bands (theta 5e5, HD 128, factor 8,
 * 1 / 4, 8192: every band present), and YaRN (HD 64, factor 40, 4096 /
 * 32 / 1, truncated ramp) with its attention factor from factor alone and
 * from mscale / mscale_all_dim; within 2e-6 relative (fp32 rounding). */
static void test_rope_frequencies_follow_transformers_formulas(void **state) {
    (void)state;
    hs_model_config c = {.rope_theta = 500000.0};
    snprintf(c.rope_scaling.type, sizeof c.rope_scaling.type, "none");
    float inv[64], scale = 0.0f;
    hs_model_rope_freqs(&c, 128, inv, &scale);
    assert_true(scale == 1.0f);
    for (int i = 0; i < 64; i++)
        assert_true(inv[i] == 1.0f / powf(500000.0f, (float)(2 * i) / 128.0f));
    snprintf(c.rope_scaling.type, sizeof c.rope_scaling.type, "llama3");
    c.rope_scaling.factor = 8.0, c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0, c.rope_scaling.original_max_position = 8192;
    hs_model_rope_freqs(&c, 128, inv, &scale);
    assert_true(scale == 1.0f);
    int bands[3] = {0};
    for (int i = 0; i < 64; i++) {
        double f = pow(500000.0, -2.0 * i / 128.0), wl = 2.0 * M_PI / f, want;
        if (wl < 8192.0 / 4.0) want = f, bands[0]++;
        else if (wl > 8192.0) want = f / 8.0, bands[2]++;
        else {
            double s = (8192.0 / wl - 1.0) / 3.0;
            want = (1.0 - s) * f / 8.0 + s * f, bands[1]++;
        }
        if (fabs(inv[i] - want) > 2e-6 * want)
            fail_msg("llama3 inv_freq[%d] = %.9g, transformers' %.9g", i, (double)inv[i], want);
    }
    assert_true(bands[0] > 0 && bands[1] > 0 && bands[2] > 0);
    snprintf(c.rope_scaling.type, sizeof c.rope_scaling.type, "yarn");
    c.rope_theta = 10000.0, c.rope_scaling.factor = 40.0;
    c.rope_scaling.original_max_position = 4096, c.rope_scaling.truncate = true;
    c.rope_scaling.beta_fast = 32.0, c.rope_scaling.beta_slow = 1.0;
    hs_model_rope_freqs(&c, 64, inv, &scale);
    assert_float_equal(scale, 0.1 * log(40.0) + 1.0, 1e-6);
    double lo = floor(64 * log(4096 / (32 * 2 * M_PI)) / (2 * log(10000.0))),
           hi = ceil(64 * log(4096 / (1 * 2 * M_PI)) / (2 * log(10000.0)));
    int ramped = 0;
    for (int i = 0; i < 32; i++) {
        double f = pow(10000.0, -2.0 * i / 64.0), r = (i - (lo > 0 ? lo : 0)) / (hi - lo);
        r = r < 0 ? 0 : r > 1 ? 1 : r;
        double want = f / 40.0 * r + f * (1.0 - r);
        ramped += r > 0 && r < 1;
        if (fabs(inv[i] - want) > 2e-6 * want)
            fail_msg("yarn inv_freq[%d] = %.9g, transformers' %.9g", i, (double)inv[i], want);
    }
    assert_true(ramped > 0);
    c.rope_scaling.mscale = 0.707, c.rope_scaling.mscale_all_dim = 1.0;
    hs_model_rope_freqs(&c, 64, inv, &scale);
    assert_float_equal(scale, (0.1 * 0.707 * log(40.0) + 1.0) / (0.1 * log(40.0) + 1.0), 1e-6);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fqns_shapes_and_units_follow_hf_llama),
        cmocka_unit_test(test_rope_frequencies_follow_transformers_formulas),
        cmocka_unit_test(test_flops_per_token_is_6_n_plus_6_l_t_c),
        cmocka_unit_test(test_init_rows_3_to_7_equal_the_same_slice_of_the_full_init),
        cmocka_unit_test(test_weights_from_file_draws_no_init_and_fills_zeros),
        cmocka_unit_test(test_whole_model_gradients_match_finite_differences),
        cmocka_unit_test(test_unset_gradients_equal_zeroed_ones),
        cmocka_unit_test(test_tied_embeddings_have_no_lm_head_and_match_fd),
        cmocka_unit_test(test_qwen3_head_norms_and_head_dim_match_fd),
        cmocka_unit_test(test_tied_embedding_gradient_is_sum_of_both_uses),
        cmocka_unit_test(test_gqa_one_kv_head_equals_mha_with_duplicated_kv_weights),
        cmocka_unit_test(test_activation_checkpointing_is_bitwise_identical),
        cmocka_unit_test(test_bf16_run_is_finite_and_close_to_fp32),
        cmocka_unit_test(test_bf16_compute_with_fp32_grads_is_close_to_fp32),
        cmocka_unit_test(test_f16_run_is_finite_and_close_to_fp32),
        cmocka_unit_test(test_hooks_run_in_documented_order_and_params_are_read_after_them),
        cmocka_unit_test(test_checkpointing_reenters_pre_forward_after_pre_backward),
        cmocka_unit_test(test_forward_logits_give_the_same_loss_as_forward_backward),
        cmocka_unit_test(test_logits_of_a_prefix_do_not_depend_on_later_tokens),
        cmocka_unit_test(test_batch_gradient_is_the_sum_over_its_sequences),
        cmocka_unit_test(test_ignored_targets_add_no_loss_and_no_gradient),
        cmocka_unit_test(test_token_outside_vocab_is_an_error_naming_its_position),
        cmocka_unit_test(test_kv_heads_not_dividing_heads_is_a_config_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
