/* The fused unit layout on one process (RFC 000 §8.3.2, spec 004 §5.11):
 * parameters sharded over 4 ranks (seen from each rank, no collective is
 * issued) are laid out at padded offsets; zero-copy turns their shards into
 * views of one flat buffer holding exactly the same values, padding zero,
 * at no extra memory; copy-in leaves them alone; parameters on different
 * shard groups cannot share one collective and are refused naming both; and
 * with shard size 1 comm_fusion fuses nothing and is accepted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fsdp/fusion.h"
#include "fsdp_fixture.h"

#define W 4

typedef struct sharded_unit {
    hs_config cfg;
    hs_device *dev;
    hs_model *m, *ref;
    hs_fsdp_mem mem;
    hs_fsdp_param params[32];
    hs_fsdp_unit u;
} sharded_unit;

/* Block 0's parameters, each sharded over W ranks as rank `rank` sees it. */
static void su_make(sharded_unit *s, int rank, hs_pg *fake_pg_for_second) {
    memset(s, 0, sizeof *s);
    fx_config(&s->cfg);
    s->cfg.model.ffn_dim = 26; /* 26 rows over 4: 7, 7, 7, 5 — uneven */
    s->dev = fx_device();
    s->m = fx_model(&s->cfg, s->dev, false, HS_DTYPE_F32, false);
    s->ref = fx_model(&s->cfg, s->dev, true, HS_DTYPE_F32, false);
    hs_model_init_weights(s->ref, 7);
    hs_fsdp_mem_init(&s->mem, s->dev);
    s->u.index = 1;
    snprintf(s->u.name, sizeof s->u.name, "%s", hs_model_unit(s->m, 1)->name);
    s->u.params = calloc(32, sizeof *s->u.params);
    for (int i = 0; i < hs_model_num_params(s->m); i++) {
        if (hs_model_param(s->m, i)->unit != 1) continue;
        int k = s->u.n_params;
        assert_true(k < 32);
        hs_fsdp_mesh_info mi = {
            .kind = HS_FSDP_MESH_FSDP, .shard_size = W, .shard_rank = rank, .replicate_size = 1};
        if (k == 1) mi.shard_pg = fake_pg_for_second;
        hs_error e;
        hs_error_clear(&e);
        assert_int_equal(
            hs_fsdp_param_init(&s->params[k], s->m, i, false, &mi, HS_DTYPE_F32, &s->mem, 7, &e),
            HS_OK);
        s->u.params[s->u.n_params++] = &s->params[k];
    }
    assert_int_equal(hs_fsdp_unit_build_groups(&s->u, &s->mem, NULL), HS_OK);
}

static void su_free(sharded_unit *s) {
    hs_fsdp_unit_free(&s->u, &s->mem); /* frees the fusion first */
    for (int k = 0; k < 32; k++) hs_fsdp_param_free(&s->params[k]);
    assert_int_equal(s->mem.current[HS_FSDP_MEM_PARAM], 0);
    assert_int_equal(s->mem.current[HS_FSDP_MEM_GRAD], 0);
    hs_model_free(s->m);
    hs_model_free(s->ref);
    hs_device_free(s->dev);
    hs_config_free(&s->cfg);
}

/* The actual shard equals the same rows of the one-process init and the
 * padding after it is zero. */
static void expect_shard_values(sharded_unit *s, const hs_fsdp_param *fp) {
    const hs_param *rp = hs_model_param(s->ref, fp->index);
    const float *want = (const float *)rp->data + fp->plan.layout.row_offset * fp->plan.row_numel;
    assert_memory_equal(fp->sharded, want, sizeof(float) * (size_t)fp->plan.actual_sharded_numel);
    for (int64_t k = fp->plan.actual_sharded_numel; k < fp->plan.padded_sharded_numel; k++)
        assert_true(fp->storage[k] == 0.0f);
}

static void test_zero_copy_shards_are_views_at_padded_offsets_with_the_same_values(void **st) {
    (void)st;
    for (int rank = 0; rank < W; rank++) {
        sharded_unit s;
        su_make(&s, rank, NULL);
        int64_t before = s.mem.current[HS_FSDP_MEM_PARAM];
        hs_error e;
        hs_error_clear(&e);
        assert_int_equal(hs_fsdp_fusion_build(&s.u, true, &s.mem, NULL, &e), HS_OK);
        hs_fsdp_fusion *fu = s.u.fusion;
        assert_non_null(fu);
        assert_true(fu->zero_copy);
        assert_int_equal(fu->n_params, s.u.n_params);
        int64_t off = 0;
        bool uneven = false;
        for (int j = 0; j < fu->n_params; j++) {
            hs_fsdp_param *fp = fu->params[j];
            assert_true(fp->fused);
            assert_int_equal(fu->offset[j], off);
            assert_ptr_equal(fp->storage, (float *)fu->flat_src + off);
            assert_ptr_equal(fp->sharded, fp->storage);
            expect_shard_values(&s, fp);
            uneven |= fp->plan.kind == HS_FSDP_PACK_DIM0_PADDED;
            off += fp->plan.padded_sharded_numel;
        }
        assert_true(uneven); /* the padded path is exercised */
        assert_int_equal(fu->numel, off);
        /* the reduce-scatter output is the unit's one reduce buffer */
        assert_int_equal(s.u.n_groups, 1);
        assert_ptr_equal(fu->rs_group, &s.u.groups[0]);
        assert_int_equal(s.u.groups[0].numel, fu->numel);
        /* the flat buffer replaces the shards: not one byte more */
        assert_int_equal(s.mem.current[HS_FSDP_MEM_PARAM], before);
        su_free(&s);
    }
}

static void test_copy_in_keeps_each_parameter_its_own_storage(void **st) {
    (void)st;
    sharded_unit s;
    su_make(&s, 3, NULL);
    float *own[32];
    for (int j = 0; j < s.u.n_params; j++) own[j] = s.u.params[j]->storage;
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_fsdp_fusion_build(&s.u, false, &s.mem, NULL, &e), HS_OK);
    hs_fsdp_fusion *fu = s.u.fusion;
    assert_false(fu->zero_copy);
    assert_null(fu->flat_src);
    for (int j = 0; j < fu->n_params; j++) {
        assert_ptr_equal(fu->params[j]->storage, own[j]);
        expect_shard_values(&s, fu->params[j]);
    }
    su_free(&s);
}

static void test_parameters_on_different_shard_groups_are_refused_naming_both(void **st) {
    (void)st;
    sharded_unit s;
    /* any distinct non-NULL pointer stands for another group: the build
     * compares groups and never communicates */
    static int other_group;
    su_make(&s, 0, (hs_pg *)&other_group);
    hs_error e;
    hs_error_clear(&e);
    assert_int_equal(hs_fsdp_fusion_build(&s.u, true, &s.mem, NULL, &e), HS_ERR_CONFIG);
    assert_non_null(strstr(e.msg, "fsdp_config.comm_fusion=true"));
    assert_non_null(strstr(e.msg, s.u.params[0]->p->fqn));
    assert_non_null(strstr(e.msg, s.u.params[1]->p->fqn));
    /* nothing was re-homed: the shards are still the parameters' own */
    for (int j = 0; j < s.u.n_params; j++) assert_false(s.u.params[j]->fused);
    s.u.params[1]->mi.shard_pg = NULL;
    su_free(&s);
}

static void test_comm_fusion_with_shard_size_1_fuses_nothing_and_trains_the_same(void **st) {
    (void)st;
    hs_config cfg;
    fx_config(&cfg);
    hs_device *dev = fx_device();
    hs_model *m[2];
    hs_fsdp *f[2];
    int32_t tok[FX_B * FX_T], tgt[FX_B * FX_T];
    fx_batch(tok, tgt, cfg.model.vocab_size, 1);
    hs_batch b = {.tokens = tok, .targets = tgt, .B = FX_B, .T = FX_T};
    double loss[2];
    for (int k = 0; k < 2; k++) {
        cfg.fsdp.comm_fusion = k == 1;
        m[k] = fx_model(&cfg, dev, false, HS_DTYPE_F32, false);
        f[k] = fx_wrap(&cfg, dev, m[k], 7);
        hs_fsdp_ctx *ctx = hs_fsdp_context(f[k]);
        for (int u = 0; u < ctx->n_units; u++) assert_null(ctx->units[u].fusion);
        double aux;
        hs_error e;
        hs_error_clear(&e);
        assert_int_equal(
            hs_model_forward_backward(m[k], &b, 0.01f, hs_fsdp_hooks(f[k]), &loss[k], &aux, &e),
            HS_OK);
    }
    assert_memory_equal(&loss[0], &loss[1], sizeof(double));
    for (int k = 0; k < 2; k++) {
        hs_fsdp_free(f[k]);
        hs_model_free(m[k]);
    }
    hs_device_free(dev);
    hs_config_free(&cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero_copy_shards_are_views_at_padded_offsets_with_the_same_values),
        cmocka_unit_test(test_copy_in_keeps_each_parameter_its_own_storage),
        cmocka_unit_test(test_parameters_on_different_shard_groups_are_refused_naming_both),
        cmocka_unit_test(test_comm_fusion_with_shard_size_1_fuses_nothing_and_trains_the_same),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
