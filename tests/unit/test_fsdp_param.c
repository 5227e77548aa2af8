/* Managed parameters on one process: storage layout and padding, the
 * explicit storage owner (an alias is never freed or copied), mesh info per
 * parameter, rule 11 and prefetch order. RFC 000 §5.5–§5.8, §8.3.2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fsdp_fixture.h"

/* What a test builds over its config: the device, a model whose parameters
 * are left to FSDP, and (when wrapped) the manager and its context. */
typedef struct built {
    hs_config cfg;
    hs_device *dev;
    hs_model *m;
    hs_fsdp *f;
    hs_fsdp_ctx *ctx;
} built;

/* Over b->cfg, which the test has filled; wraps with every group of size 1
 * and seed 7 when `wrap`. */
static void build(built *b, hs_dtype compute, bool wrap) {
    b->dev = fx_device();
    b->m = fx_model(&b->cfg, b->dev, false, compute, false);
    b->f = wrap ? fx_wrap(&b->cfg, b->dev, b->m, 7) : NULL;
    b->ctx = wrap ? hs_fsdp_context(b->f) : NULL;
}

static void build_default(built *b) {
    fx_config(&b->cfg);
    build(b, HS_DTYPE_F32, true);
}

static void release(built *b) {
    hs_fsdp_free(b->f);
    hs_model_free(b->m);
    hs_device_free(b->dev);
    hs_config_free(&b->cfg);
}

static void test_shard_size_1_without_cast_aliases_the_sharded_storage(void **s) {
    (void)s;
    built b;
    build_default(&b);
    hs_fsdp_ctx *ctx = b.ctx;
    int64_t before = ctx->mem.current[HS_FSDP_MEM_PARAM];
    int64_t allocs = ctx->mem.allocs[HS_FSDP_MEM_PARAM];
    hs_fsdp_hook_pre_forward(ctx, 1);
    hs_fsdp_unit *u = &ctx->units[1];
    assert_true(u->n_params > 0);
    for (int i = 0; i < u->n_params; i++) {
        hs_fsdp_param *fp = u->params[i];
        assert_false(fp->needs_all_gather);
        assert_int_equal(fp->owner, HS_FSDP_STORAGE_SHARDED);
        assert_ptr_equal(fp->p->data, fp->storage); /* same pointer: no copy */
        assert_null(fp->owned);
    }
    /* nothing allocated for the unsharded view */
    assert_int_equal(ctx->mem.current[HS_FSDP_MEM_PARAM], before);
    assert_int_equal(ctx->mem.allocs[HS_FSDP_MEM_PARAM], allocs);
    float first = u->params[0]->storage[0];
    hs_fsdp_hook_post_forward(ctx, 1); /* reshard: mapping dropped, storage kept */
    for (int i = 0; i < u->n_params; i++) {
        assert_null(u->params[i]->p->data);
        assert_non_null(u->params[i]->storage);
    }
    assert_true(u->params[0]->storage[0] == first);
    assert_int_equal(ctx->mem.current[HS_FSDP_MEM_PARAM], before);
    release(&b);
}

static void test_shard_size_1_with_cast_uses_a_cast_buffer_and_keeps_the_master(void **s) {
    (void)s;
    built b;
    fx_config(&b.cfg);
    b.cfg.fsdp.mix_precision.param_dtype = HS_DTYPE_BF16;
    build(&b, HS_DTYPE_BF16, true);
    hs_fsdp_ctx *ctx = b.ctx;
    int64_t before = ctx->mem.current[HS_FSDP_MEM_PARAM];
    hs_fsdp_hook_pre_forward(ctx, 1);
    hs_fsdp_unit *u = &ctx->units[1];
    int64_t cast_bytes = 0;
    for (int i = 0; i < u->n_params; i++) {
        hs_fsdp_param *fp = u->params[i];
        assert_int_equal(fp->owner, HS_FSDP_STORAGE_CAST);
        assert_ptr_equal(fp->p->data, fp->owned);
        assert_ptr_not_equal(fp->p->data, fp->storage);
        const uint16_t *c = fp->p->data;
        for (int64_t k = 0; k < fp->plan.unpacked_numel; k++)
            assert_int_equal(c[k], hs_f32_to_bf16(fp->storage[k]));
        cast_bytes += fp->plan.unpacked_numel * 2;
    }
    assert_int_equal(ctx->mem.current[HS_FSDP_MEM_PARAM], before + cast_bytes);
    /* A write into the compute copy must never reach the fp32 master. */
    hs_fsdp_param *fp0 = u->params[0];
    float master = fp0->storage[0];
    ((uint16_t *)fp0->p->data)[0] = hs_f32_to_bf16(123.0f);
    hs_fsdp_hook_post_forward(ctx, 1);
    assert_true(fp0->storage[0] == master);
    assert_null(fp0->owned);
    assert_int_equal(ctx->mem.current[HS_FSDP_MEM_PARAM], before);
    release(&b);
}

/* Storage of one rank of a W-way shard, without any collective: init only. */
static void check_storage(hs_model *m, hs_device *dev, int index, int w, int r) {
    hs_fsdp_mem mem;
    hs_fsdp_mem_init(&mem, dev);
    hs_fsdp_mesh_info mi = {
        .kind = HS_FSDP_MESH_FSDP, .shard_size = w, .shard_rank = r, .replicate_size = 1};
    hs_fsdp_param fp;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_fsdp_param_init(&fp, m, index, false, &mi, HS_DTYPE_F32, &mem, 99, &e),
                     HS_OK);
    const hs_fsdp_plan *pl = &fp.plan;
    hs_param *p = hs_model_param(m, index);
    float *full = malloc(sizeof(float) * (size_t)pl->unpacked_numel);
    hs_model_init_param_rows(m, p, 99, full, HS_DTYPE_F32, 0, p->shape[0]);
    /* the actual rows equal the same rows of the single-process init */
    assert_memory_equal(fp.sharded, full + pl->layout.row_offset * pl->row_numel,
                        sizeof(float) * (size_t)pl->actual_sharded_numel);
    if (pl->kind == HS_FSDP_PACK_DIM0_EVEN) {
        assert_int_equal(fp.storage_numel, pl->actual_sharded_numel); /* no padding owner */
    } else {
        assert_int_equal(fp.storage_numel, pl->padded_sharded_numel);
        for (int64_t k = pl->actual_sharded_numel; k < pl->padded_sharded_numel; k++)
            assert_true(fp.storage[k] == 0.0f);
    }
    assert_ptr_equal(fp.sharded, fp.storage); /* the actual view is the prefix */
    free(full);
    hs_fsdp_param_free(&fp);
    assert_int_equal(mem.current[HS_FSDP_MEM_PARAM], 0);
    assert_int_equal(mem.current[HS_FSDP_MEM_GRAD], 0);
}

static void test_uneven_storage_is_padded_with_a_zero_tail_and_even_is_not(void **s) {
    (void)s;
    built b;
    fx_config(&b.cfg);
    build(&b, HS_DTYPE_F32, false);
    int emb = hs_model_find_param(b.m, "model.embed_tokens.weight");            /* [37, 16] */
    int q = hs_model_find_param(b.m, "model.layers.0.self_attn.q_proj.weight"); /* [16, 16] */
    assert_true(emb >= 0 && q >= 0);
    for (int w = 1; w <= 8; w++)
        for (int r = 0; r < w; r++) {
            check_storage(b.m, b.dev, emb, w, r);
            check_storage(b.m, b.dev, q, w, r);
        }
    /* 37 rows over 4: 10/10/10/7, rank 3 pads 3 rows; 16 over 4 is even */
    hs_fsdp_plan pl;
    hs_error e;
    hs_fsdp_plan_build(&pl, "e", 2, hs_model_param(b.m, emb)->shape, 0, 4, 3, &e);
    assert_int_equal(pl.layout.actual_rows, 7);
    assert_int_equal(pl.kind, HS_FSDP_PACK_DIM0_PADDED);
    release(&b);
}

static void test_replicate_params_get_the_ddp_mesh_and_never_all_gather(void **s) {
    (void)s;
    built b;
    fx_config(&b.cfg);
    const char *names[] = {"model.norm.weight", "model.layers.1.input_layernorm.weight"};
    b.cfg.fsdp.n_replicate_params = 2;
    b.cfg.fsdp.replicate_params = malloc(2 * sizeof(char *));
    for (int i = 0; i < 2; i++) b.cfg.fsdp.replicate_params[i] = strdup(names[i]);
    build(&b, HS_DTYPE_F32, true);
    hs_fsdp_ctx *ctx = b.ctx;
    for (int i = 0; i < ctx->n_params; i++) {
        hs_fsdp_param *fp = &ctx->params[i];
        bool rep = strcmp(fp->p->fqn, names[0]) == 0 || strcmp(fp->p->fqn, names[1]) == 0;
        assert_int_equal(fp->replicate, rep);
        assert_int_equal(fp->mi.kind, rep ? HS_FSDP_MESH_DDP : HS_FSDP_MESH_FSDP);
        assert_false(fp->needs_all_gather);
    }
    release(&b);
}

static void test_unknown_replicate_param_fails_rule_11_naming_it(void **s) {
    (void)s;
    built b;
    fx_config(&b.cfg);
    b.cfg.fsdp.n_replicate_params = 1;
    b.cfg.fsdp.replicate_params = malloc(sizeof(char *));
    b.cfg.fsdp.replicate_params[0] = strdup("model.layers.9.mlp.up_proj.weight");
    build(&b, HS_DTYPE_F32, false);
    hs_fsdp_dp_groups g = {.shard_size = 1, .replicate_size = 1, .flat_size = 1};
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_fsdp_wrap_groups(&b.cfg.fsdp, b.cfg.optimizer.fp32_main_params, &g, NULL,
                                         b.dev, b.m, 1, NULL, &b.f, &e),
                     HS_ERR_CONFIG);
    assert_null(b.f);
    assert_non_null(strstr(e.msg, "model.layers.9.mlp.up_proj.weight"));
    for (int i = 0; i < hs_model_num_params(b.m); i++) assert_null(hs_model_param(b.m, i)->data);
    release(&b);
}

static void test_every_param_sits_in_its_deepest_unit_and_only_the_root_skips_reshard(void **s) {
    (void)s;
    built b;
    build_default(&b);
    hs_fsdp_ctx *ctx = b.ctx;
    int seen = 0;
    for (int u = 0; u < ctx->n_units; u++) {
        for (int i = 0; i < ctx->units[u].n_params; i++)
            assert_int_equal(ctx->units[u].params[i]->p->unit, u);
        seen += ctx->units[u].n_params;
        assert_int_equal(ctx->units[u].reshard_after_forward, u != 0);
    }
    assert_int_equal(seen, hs_model_num_params(b.m));
    hs_fsdp_stats st;
    hs_fsdp_get_stats(b.f, &st);
    assert_int_equal(st.blocks_wrapped, b.cfg.model.n_layers);
    release(&b);
}

static void test_prefetch_targets_follow_declaration_order_and_depth_0_sets_none(void **s) {
    (void)s;
    built b;
    fx_config(&b.cfg);
    b.cfg.model.n_layers = 3;
    build(&b, HS_DTYPE_F32, true);
    hs_fsdp_ctx *ctx = b.ctx;
    for (int u = 0; u < ctx->n_units; u++) {
        assert_int_equal(ctx->units[u].n_fwd_prefetch, 0);
        assert_int_equal(ctx->units[u].n_bwd_prefetch, 0);
    }
    hs_fsdp_free(b.f);
    b.cfg.fsdp.forward_prefetch_depth = 2;
    b.cfg.fsdp.backward_prefetch_depth = 1;
    b.f = fx_wrap(&b.cfg, b.dev, b.m, 7);
    ctx = hs_fsdp_context(b.f);
    /* units: 0 root, 1..3 blocks. forward 0,1,2,3; backward 0,3,2,1 */
    assert_int_equal(ctx->units[0].n_fwd_prefetch, 2);
    assert_int_equal(ctx->units[0].fwd_prefetch[0], 1);
    assert_int_equal(ctx->units[0].fwd_prefetch[1], 2);
    assert_int_equal(ctx->units[2].n_fwd_prefetch, 1);
    assert_int_equal(ctx->units[2].fwd_prefetch[0], 3);
    assert_int_equal(ctx->units[3].n_fwd_prefetch, 0);
    assert_int_equal(ctx->units[0].n_bwd_prefetch, 1);
    assert_int_equal(ctx->units[0].bwd_prefetch[0], 3);
    assert_int_equal(ctx->units[3].bwd_prefetch[0], 2);
    assert_int_equal(ctx->units[1].n_bwd_prefetch, 0);
    release(&b);
}

static void test_unit_mixing_plain_and_tp_params_is_rejected_listing_fqns(void **s) {
    (void)s;
    hs_source_layout tp = {.mesh = "tp", .ndim = 1, .placements = {{HS_PLACEMENT_SHARD, 0}}};
    const char *fqns[] = {"a.weight", "b.weight"};
    const hs_source_layout *mixed[] = {&tp, NULL};
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_fsdp_check_unit_sources("model.layers.0", fqns, mixed, 2, &e),
                     HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "a.weight:tp"));
    assert_non_null(strstr(e.msg, "b.weight:plain"));
    assert_non_null(strstr(e.msg, "model.layers.0"));
    const hs_source_layout *same[] = {&tp, &tp};
    assert_int_equal(hs_fsdp_check_unit_sources("u", fqns, same, 2, &e), HS_OK);
    const hs_source_layout *plain[] = {NULL, NULL};
    assert_int_equal(hs_fsdp_check_unit_sources("u", fqns, plain, 2, &e), HS_OK);
    hs_source_layout partial = {.mesh = "tp", .ndim = 1, .placements = {{HS_PLACEMENT_PARTIAL, 0}}};
    const hs_source_layout *part[] = {&partial, &partial};
    hs_error_clear(&e);
    assert_int_equal(hs_fsdp_check_unit_sources("u", fqns, part, 2, &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "Partial"));
    assert_non_null(strstr(e.msg, "a.weight"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_size_1_without_cast_aliases_the_sharded_storage),
        cmocka_unit_test(test_shard_size_1_with_cast_uses_a_cast_buffer_and_keeps_the_master),
        cmocka_unit_test(test_uneven_storage_is_padded_with_a_zero_tail_and_even_is_not),
        cmocka_unit_test(test_replicate_params_get_the_ddp_mesh_and_never_all_gather),
        cmocka_unit_test(test_unknown_replicate_param_fails_rule_11_naming_it),
        cmocka_unit_test(test_every_param_sits_in_its_deepest_unit_and_only_the_root_skips_reshard),
        cmocka_unit_test(test_prefetch_targets_follow_declaration_order_and_depth_0_sets_none),
        cmocka_unit_test(test_unit_mixing_plain_and_tp_params_is_rejected_listing_fqns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
