/* The single-process engine: the model allocates full fp32 parameters and
 * gradients, the optimizer updates them in place, hooks do nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/engines.h"

typedef struct local_ctx {
    hs_optim_param *params;
    int n;
    bool inference; /* forward only: nothing writes the parameters */
    hs_model_hooks hooks;
} local_ctx;

static void noop_unit(void *ctx, int unit) { (void)ctx, (void)unit; }
static void noop_final(void *ctx) { (void)ctx; }

static const hs_model_hooks *local_hooks(hs_engine *en) { return &((local_ctx *)en->ctx)->hooks; }

static void local_begin_micro_batch(hs_engine *en, bool sync, bool reshard, bool last) {
    (void)en, (void)sync, (void)reshard, (void)last; /* one process: nothing to sync */
}

static int local_optim_params(hs_engine *en, hs_optim_param **out) {
    local_ctx *c = en->ctx;
    *out = c->params;
    return c->n;
}

static hs_status local_grad_norm(hs_engine *en, double *norm, hs_error *e) {
    local_ctx *c = en->ctx;
    (void)e;
    /* after backward, before the clip and the update read the gradients */
    hs_device *d = hs_model_device(en->model);
    for (int i = 0; i < c->n; i++) hs_param_grad_settle(d, hs_model_param(en->model, i));
    *norm = sqrt(hs_grad_sumsq(d, c->params, c->n));
    return HS_OK;
}

static hs_status local_after_step(hs_engine *en, bool stepped, hs_error *e) {
    (void)en, (void)stepped, (void)e;
    return HS_OK;
}

static void local_zero_grads(hs_engine *en) { hs_model_unset_grads(en->model); }

static hs_status local_gather_full(hs_engine *en, int i, float *out, hs_error *e) {
    (void)e;
    const hs_param *p = hs_model_param(en->model, i);
    hs_device_copy(hs_model_device(en->model), out, p->data,
                   sizeof(float) * (size_t)hs_param_numel(p), HS_COPY_D2H);
    return HS_OK;
}

static hs_status local_gather_full_grad(hs_engine *en, int i, float *out, hs_error *e) {
    (void)e;
    hs_param *p = hs_model_param(en->model, i);
    hs_param_grad_settle(hs_model_device(en->model), p);
    size_t bytes = sizeof(float) * (size_t)hs_param_numel(p);
    if (p->grad) hs_device_copy(hs_model_device(en->model), out, p->grad, bytes, HS_COPY_D2H);
    else memset(out, 0, bytes); /* frozen: no gradient */
    return HS_OK;
}

static hs_status local_set_full(hs_engine *en, int i, const float *full, hs_error *e) {
    (void)e;
    hs_param *p = hs_model_param(en->model, i);
    hs_device_copy(hs_model_device(en->model), p->data, full,
                   sizeof(float) * (size_t)hs_param_numel(p), HS_COPY_H2D);
    return HS_OK;
}

/* Only where nothing will write the parameter: no optimizer step, no load
 * after this one. */
static bool local_borrow_full(hs_engine *en, int i, const float *full) {
    local_ctx *c = en->ctx;
    if (!c->inference || !hs_model_borrow_param(en->model, i, full)) return false;
    c->params[i].data = hs_model_param(en->model, i)->data;
    return true;
}

/* One process holds every parameter whole; the model's fp32 buffer is the
 * optimizer's master. */
static void local_ckpt_param(hs_engine *en, int i, hs_engine_ckpt_param *out) {
    hs_param *p = hs_model_param(en->model, i);
    *out = (hs_engine_ckpt_param){
        .row_offset = 0, .rows = p->shape[0], .master = p->data, .model_dtype = HS_DTYPE_F32};
}

static void local_free(hs_engine *en) {
    local_ctx *c = en->ctx;
    hs_model_free(en->model);
    free(c->params);
    free(c);
    free(en);
}

static void local_fill_params(local_ctx *c, hs_model *m) {
    for (int i = 0; i < c->n; i++) {
        hs_param *p = hs_model_param(m, i);
        hs_optim_param *o = &c->params[i];
        o->fqn = p->fqn;
        o->data = p->data;
        o->dtype = HS_DTYPE_F32;
        o->grad = p->grad;
        o->numel = hs_param_numel(p);
        /* Muon orthogonalises each routed expert's [out, in] matrix on its
         * own (docs/optimizers.md), so its matrix is the last two dims. */
        bool expert = p->kind == HS_PARAM_EXPERT && p->ndim == 3;
        o->rows = expert ? p->shape[1] : p->shape[0];
        o->cols = o->rows ? (expert ? p->shape[2] : o->numel / o->rows) : 0;
        o->decay = p->kind != HS_PARAM_NORM;
        o->muon = (p->kind == HS_PARAM_LINEAR && p->ndim == 2) || expert;
        o->frozen = p->frozen;
    }
}

/* The parameter policies of spec 004 §2.2–§2.3 (a 16-bit param_dtype with
 * its fp32 master, a 16-bit output_dtype at unit boundaries, fp32 main
 * params, offload) are built once, in fsdp/ and the engine over it. One
 * process that asks for them gets the FSDP engine with every group of size
 * 1: no collective is issued, and the run computes with the same dtypes as
 * a multi-rank run of the same config. */
hs_status hs_engine_local_create(const hs_engine_env *env, hs_engine **out, hs_error *e) {
    *out = NULL;
    const hs_config *cfg = env->cfg;
    if (hs_engine_uses_fsdp(cfg, env->topo)) {
        if (env->log)
            hs_log_info(env->log,
                        "fsdp: one process with mix_precision / offload / fp32 main params: the "
                        "FSDP engine holds the parameters with every group of size 1");
        return hs_engine_fsdp_create(env, out, e);
    }
    hs_model_options mo = hs_engine_model_options(cfg, false, env->max_batch, env->stage, 0);
    mo.dev = env->dev;
    mo.weights_from_file = env->weights_from_file;
    mo.no_grad = env->inference;
    hs_model *m = NULL;
    hs_status s = hs_model_create(&cfg->model, &mo, &m, e);
    if (s != HS_OK) return s;
    hs_model_init_weights(m, (uint64_t)cfg->train.seed);
    hs_train_freeze_apply(cfg, m);
    hs_engine *en = calloc(1, sizeof *en);
    local_ctx *c = calloc(1, sizeof *c);
    if (c) c->n = hs_model_num_params(m);
    if (c) c->params = calloc((size_t)c->n + 1, sizeof *c->params);
    if (!en || !c || !c->params) {
        free(en);
        if (c) free(c->params);
        free(c);
        hs_model_free(m);
        return hs_error_oom(e, "engine: cannot allocate the parameter list");
    }
    local_fill_params(c, m);
    c->inference = env->inference;
    c->hooks = (hs_model_hooks){.ctx = c,
                                .pre_forward = noop_unit,
                                .post_forward = noop_unit,
                                .pre_backward = noop_unit,
                                .post_backward = noop_unit,
                                .post_backward_final = noop_final};
    *en = (hs_engine){
        .name = "local",
        .ctx = c,
        .model = m,
        .hooks = local_hooks,
        .begin_micro_batch = local_begin_micro_batch,
        .optim_params = local_optim_params,
        .grad_norm = local_grad_norm,
        .after_step = local_after_step,
        .zero_grads = local_zero_grads,
        .gather_full = local_gather_full,
        .set_full = local_set_full,
        .borrow_full = local_borrow_full,
        .gather_full_grad = local_gather_full_grad,
        .ckpt_param = local_ckpt_param,
        .free = local_free,
    };
    *out = en;
    return HS_OK;
}
