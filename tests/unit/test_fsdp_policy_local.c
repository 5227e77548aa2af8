/* FSDP policies in one process (every group of size 1, no collective):
 * reduce dtype resolution, fp32 accumulation of 16-bit gradients across
 * no-sync micro-batches, the fp32 main params' model shard, offload's host
 * placement and copies, and the options still rejected. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "fsdp/policy.h"
#include "fsdp_fixture.h"

typedef struct wrapped {
    hs_config cfg;
    hs_device *dev;
    hs_trace *tr;
    hs_model *m;
    hs_fsdp *f;
} wrapped;

static void wrapped_init(wrapped *w, hs_dtype param, int reduce, bool main_params, bool offload) {
    fx_config(&w->cfg);
    w->cfg.fsdp.mix_precision.param_dtype = param == HS_DTYPE_F32 ? HS_MP_NULL : (int)param;
    w->cfg.fsdp.mix_precision.reduce_dtype = reduce;
    w->cfg.fsdp.mix_precision.fp32_main_grad = main_params;
    w->cfg.optimizer.fp32_main_params = main_params;
    w->cfg.fsdp.enable_offload = offload;
    w->tr = hs_trace_create(0, false, NULL); /* counters are kept regardless */
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_device_create(HS_DEVICE_CPU, w->tr, &w->dev, &e), HS_OK);
    w->m = fx_model(&w->cfg, w->dev, false, param, false);
    w->f = fx_wrap(&w->cfg, w->dev, w->m, 11);
}

static void wrapped_free(wrapped *w) {
    hs_fsdp_free(w->f);
    hs_model_free(w->m);
    hs_device_free(w->dev);
    hs_trace_free(w->tr);
    hs_config_free(&w->cfg);
}

static void micro_batch(wrapped *w, int salt, bool sync, bool last) {
    int32_t tok[FX_B * FX_T], tgt[FX_B * FX_T];
    fx_batch(tok, tgt, w->cfg.model.vocab_size, salt);
    hs_batch b = {.tokens = tok, .targets = tgt, .B = FX_B, .T = FX_T};
    double loss, aux;
    hs_error e;
    hs_error_clear(&e);
    hs_fsdp_set_micro_batch(w->f, sync, true, last);
    assert_int_equal(hs_model_forward_backward(w->m, &b, 1.0f / (FX_B * FX_T), hs_fsdp_hooks(w->f),
                                               &loss, &aux, &e),
                     HS_OK);
}

static void test_null_reduce_dtype_follows_the_compute_dtype(void **s) {
    (void)s;
    hs_mix_precision mp = {.param_dtype = HS_DTYPE_BF16,
                           .reduce_dtype = HS_MP_NULL,
                           .output_dtype = HS_MP_NULL,
                           .cast_forward_inputs = true};
    assert_int_equal(hs_fsdp_mp_reduce_dtype(&mp, HS_DTYPE_BF16), HS_DTYPE_BF16);
    mp.reduce_dtype = HS_DTYPE_F32;
    assert_int_equal(hs_fsdp_mp_reduce_dtype(&mp, HS_DTYPE_BF16), HS_DTYPE_F32);
    mp.reduce_dtype = HS_DTYPE_F16;
    assert_int_equal(hs_fsdp_mp_reduce_dtype(&mp, HS_DTYPE_F32), HS_DTYPE_F16);
}

static void test_reduce_buffers_are_allocated_in_the_reduce_dtype(void **s) {
    (void)s;
    wrapped w;
    wrapped_init(&w, HS_DTYPE_BF16, HS_MP_NULL, false, false);
    hs_fsdp_ctx *ctx = hs_fsdp_context(w.f);
    for (int u = 0; u < ctx->n_units; u++)
        for (int g = 0; g < ctx->units[u].n_groups; g++)
            assert_int_equal(ctx->units[u].groups[g].dtype, HS_DTYPE_BF16);
    for (int i = 0; i < ctx->n_params; i++)
        assert_int_equal(ctx->params[i].reduce_dtype, HS_DTYPE_BF16);
    wrapped_free(&w);
}

/* Synced every micro-batch, each bf16 gradient is widened and summed in
 * fp32; without sync the fp32 accumulator must give exactly that sum, not
 * a bf16 running sum. */
static void test_no_sync_bf16_accumulation_is_bitwise_the_synced_fp32_sum(void **s) {
    (void)s;
    wrapped a, b;
    wrapped_init(&a, HS_DTYPE_BF16, HS_DTYPE_F32, false, false);
    wrapped_init(&b, HS_DTYPE_BF16, HS_DTYPE_F32, false, false);
    micro_batch(&a, 1, true, false);
    micro_batch(&a, 2, true, true);
    micro_batch(&b, 1, false, false);
    hs_fsdp_ctx *cb = hs_fsdp_context(b.f);
    for (int i = 0; i < cb->n_params; i++) {
        assert_non_null(cb->params[i].acc_grad);
        assert_int_equal(cb->params[i].acc_grad_bytes,
                         cb->params[i].plan.padded_unsharded_numel * sizeof(float));
    }
    micro_batch(&b, 2, false, true);
    hs_fsdp_ctx *ca = hs_fsdp_context(a.f);
    int differ_from_zero = 0;
    for (int i = 0; i < ca->n_params; i++) {
        const hs_fsdp_param *pa = &ca->params[i], *pb = &cb->params[i];
        assert_null(pb->acc_grad); /* handed to the reduction, then freed */
        assert_memory_equal(pa->sharded_grad, pb->sharded_grad,
                            (size_t)pa->plan.actual_sharded_numel * sizeof(float));
        differ_from_zero += hs_max_abs_f32(pa->sharded_grad, pa->plan.actual_sharded_numel) > 0;
    }
    assert_true(differ_from_zero > ca->n_params / 2);
    assert_int_equal(ca->mem.current[HS_FSDP_MEM_GRAD], cb->mem.current[HS_FSDP_MEM_GRAD]);
    wrapped_free(&a);
    wrapped_free(&b);
}

static void test_main_params_keep_a_bf16_model_shard_that_the_unshard_aliases(void **s) {
    (void)s;
    wrapped w;
    wrapped_init(&w, HS_DTYPE_BF16, HS_DTYPE_F32, true, false);
    hs_fsdp_ctx *ctx = hs_fsdp_context(w.f);
    hs_fsdp_param *fp = &ctx->params[1];
    assert_non_null(fp->lp_shard);
    int64_t allocs = ctx->mem.allocs[HS_FSDP_MEM_PARAM];
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_fsdp_unit_unshard(&ctx->units[fp->p->unit], &e), HS_OK);
    /* shard size 1: the model computes on its own bf16 shard, no copy */
    assert_ptr_equal(fp->p->data, fp->lp_shard);
    assert_int_equal(fp->owner, HS_FSDP_STORAGE_SHARDED);
    assert_int_equal(ctx->mem.allocs[HS_FSDP_MEM_PARAM], allocs);
    /* the optimizer writes the fp32 main param; after_step rounds it back */
    hs_optim_param *op;
    hs_fsdp_optim_params(w.f, &op);
    assert_ptr_equal(op[1].data, fp->storage);
    assert_int_equal(op[1].dtype, HS_DTYPE_F32);
    for (int64_t k = 0; k < fp->plan.actual_sharded_numel; k++) fp->sharded[k] = 1.0f + k / 3.0f;
    assert_int_equal(hs_fsdp_after_step(w.f, &e), HS_OK);
    assert_null(fp->p->data);
    uint16_t *lp = fp->lp_shard;
    for (int64_t k = 0; k < fp->plan.actual_sharded_numel; k++) {
        uint16_t want;
        hs_convert(&want, HS_DTYPE_BF16, &fp->sharded[k], HS_DTYPE_F32, 1);
        assert_int_equal(lp[k], want);
    }
    wrapped_free(&w);
}

/* The optimizer rewrites the bf16 model shards as it updates the fp32
 * main params (AdamW's copy in its own pass, Muon's by a convert): after
 * the step and before any write-back each shard holds the rounding of its
 * main param, and after_optim_step leaves it so. */
static void optimizer_writes_model_shards(const char *target) {
    wrapped w;
    wrapped_init(&w, HS_DTYPE_BF16, HS_DTYPE_F32, true, false);
    snprintf(w.cfg.optimizer.target, sizeof w.cfg.optimizer.target, "%s", target);
    hs_fsdp_ctx *ctx = hs_fsdp_context(w.f);
    hs_optim_param *op;
    int n = hs_fsdp_optim_params(w.f, &op);
    hs_optim *opt;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_optim_create(&w.cfg.optimizer, op, n, w.dev, NULL, &opt, &e), HS_OK);
    micro_batch(&w, 5, true, true);
    double norm; /* as the trainer does first: every reduction settled */
    assert_int_equal(hs_fsdp_grad_norm(w.f, &norm, &e), HS_OK);
    assert_true(norm > 0.0);
    for (int i = 0; i < n; i++) assert_ptr_equal(op[i].copy, ctx->params[i].lp_shard);
    int changed = 0;
    for (int step = 0; step < 2; step++) {
        uint16_t before = *(uint16_t *)ctx->params[1].lp_shard;
        assert_int_equal(hs_optim_step(opt, 0.05, &e), HS_OK);
        changed += before != *(uint16_t *)ctx->params[1].lp_shard;
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < n; i++) {
                const hs_fsdp_param *fp = &ctx->params[i];
                int64_t k = fp->plan.actual_sharded_numel;
                uint16_t *want = malloc((size_t)(k > 0 ? k : 1) * sizeof *want);
                hs_convert(want, HS_DTYPE_BF16, fp->sharded, HS_DTYPE_F32, k);
                assert_memory_equal(fp->lp_shard, want, (size_t)k * sizeof *want);
                free(want);
            }
            if (pass == 0) assert_int_equal(hs_fsdp_after_optim_step(w.f, &e), HS_OK);
        }
    }
    assert_true(changed > 0);
    hs_optim_free(opt);
    wrapped_free(&w);
}

static void test_adamw_writes_the_bf16_model_shards_with_the_main_params(void **s) {
    (void)s;
    optimizer_writes_model_shards("adamw");
}

static void test_muon_writes_the_bf16_model_shards_with_the_main_params(void **s) {
    (void)s;
    optimizer_writes_model_shards("muon");
}

static void test_offload_keeps_masters_on_the_host_and_copies_around_compute(void **s) {
    (void)s;
    wrapped w;
    wrapped_init(&w, HS_DTYPE_F32, HS_MP_NULL, false, true);
    hs_fsdp_ctx *ctx = hs_fsdp_context(w.f);
    int64_t master = 0, grads = 0;
    for (int i = 0; i < ctx->n_params; i++) {
        assert_true(ctx->params[i].offload);
        master += ctx->params[i].storage_numel * 4;
        grads += ctx->params[i].plan.actual_sharded_numel * 4;
    }
    assert_int_equal(ctx->mem.current[HS_FSDP_MEM_PARAM], 0);
    assert_int_equal(ctx->mem.host_current[HS_FSDP_MEM_PARAM], master);
    assert_int_equal(ctx->mem.host_current[HS_FSDP_MEM_GRAD], grads);
    assert_int_equal(hs_pool_current(&w.dev->host_pool) >= master + grads, true);
    micro_batch(&w, 3, true, true);
    /* blocks unshard for forward and again for backward, the root once */
    int64_t h2d = 0;
    for (int i = 0; i < ctx->n_params; i++) h2d += ctx->params[i].p->unit == 0 ? 1 : 2;
    assert_int_equal(hs_trace_collectives(w.tr, "h2d", NULL), h2d);
    assert_int_equal(hs_trace_collectives(w.tr, "d2h", NULL), ctx->n_params);
    /* shard size 1 without offload would alias the master; here the view
     * is a device copy */
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_fsdp_after_step(w.f, &e), HS_OK);
    assert_int_equal(ctx->mem.current[HS_FSDP_MEM_PARAM], 0);
    wrapped_free(&w);
}

static void test_output_dtype_and_uncast_inputs_are_accepted_by_the_manager(void **s) {
    (void)s;
    hs_config cfg;
    fx_config(&cfg);
    cfg.fsdp.mix_precision.param_dtype = HS_DTYPE_BF16;
    cfg.fsdp.mix_precision.cast_forward_inputs = false;
    cfg.fsdp.mix_precision.output_dtype = HS_DTYPE_F32;
    hs_device *dev = fx_device();
    hs_model *m = fx_model(&cfg, dev, false, HS_DTYPE_BF16, false);
    hs_fsdp_dp_groups g = {.shard_size = 1, .replicate_size = 1, .flat_size = 1};
    hs_fsdp *f = NULL;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_fsdp_wrap_groups(&cfg.fsdp, cfg.optimizer.fp32_main_params, &g, NULL, dev,
                                         m, 1, NULL, &f, &e),
                     HS_OK);
    assert_non_null(f);
    hs_fsdp_free(f);
    hs_model_free(m);
    hs_device_free(dev);
    hs_config_free(&cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_reduce_dtype_follows_the_compute_dtype),
        cmocka_unit_test(test_reduce_buffers_are_allocated_in_the_reduce_dtype),
        cmocka_unit_test(test_no_sync_bf16_accumulation_is_bitwise_the_synced_fp32_sum),
        cmocka_unit_test(test_main_params_keep_a_bf16_model_shard_that_the_unshard_aliases),
        cmocka_unit_test(test_adamw_writes_the_bf16_model_shards_with_the_main_params),
        cmocka_unit_test(test_muon_writes_the_bf16_model_shards_with_the_main_params),
        cmocka_unit_test(test_offload_keeps_masters_on_the_host_and_copies_around_compute),
        cmocka_unit_test(test_output_dtype_and_uncast_inputs_are_accepted_by_the_manager),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
