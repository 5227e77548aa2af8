/* The FSDP engine: the model computes with the unsharded views the FSDP
 * hooks install, the optimizer updates the local shards. With tensor
 * parallelism the model is built with parallel/'s ops table and TP plan
 * first, and FSDP shards the TP-local tensors (spec 004 §3 steps 1-2). */
#include "train/engine_fsdp.h"

#include <stdlib.h>
#include <string.h>

#include "hypershard/fsdp.h"
#include "hypershard/parallel.h"

typedef struct fsdp_engine {
    hs_fsdp *f;
    hs_comm *comm;
    hs_stream *stream; /* the device's compute stream, where the model's buffers live */
    hs_pg *batch;      /* dp x cp: the MoE aux statistics' group, NULL when unneeded */
    hs_tp *tp;         /* NULL without tensor parallelism */
    hs_cp *cp;         /* NULL without context parallelism */
    hs_ep *ep;         /* NULL without expert parallelism */
    hs_model_ops ops;  /* the model's: TP's table with CP's members set */
} fsdp_engine;

static fsdp_engine *eng_of(hs_engine *en) { return en->ctx; }
static hs_fsdp *fsdp_of(hs_engine *en) { return eng_of(en)->f; }

static const hs_model_hooks *fsdp_hooks(hs_engine *en) { return hs_fsdp_hooks(fsdp_of(en)); }

static void fsdp_begin_micro_batch(hs_engine *en, bool sync, bool reshard, bool last) {
    hs_fsdp_set_micro_batch(fsdp_of(en), sync, reshard, last);
}

static int fsdp_optim_params(hs_engine *en, hs_optim_param **out) {
    return hs_fsdp_optim_params(fsdp_of(en), out);
}

static hs_status fsdp_grad_norm(hs_engine *en, double *norm, hs_error *e) {
    return hs_fsdp_grad_norm(fsdp_of(en), norm, e);
}

static hs_status fsdp_after_step(hs_engine *en, hs_error *e) {
    return hs_fsdp_after_step(fsdp_of(en), e);
}

static void fsdp_zero_grads(hs_engine *en) { hs_fsdp_zero_grads(fsdp_of(en)); }

static void fsdp_begin_step(hs_engine *en) { hs_fsdp_begin_step(fsdp_of(en)); }
static void fsdp_drain(hs_engine *en) { hs_fsdp_drain(fsdp_of(en)); }

static hs_tp *fsdp_tp(hs_engine *en) { return eng_of(en)->tp; }
static hs_cp *fsdp_cp(hs_engine *en) { return eng_of(en)->cp; }
static hs_ep *fsdp_ep(hs_engine *en) { return eng_of(en)->ep; }
static void fsdp_write_units(hs_engine *en, FILE *out) { hs_fsdp_write_units(fsdp_of(en), out); }

typedef hs_status (*gather_fn)(hs_fsdp *f, int i, float *out, hs_error *e);

static size_t whole_bytes(const hs_param *p) { return (size_t)hs_param_numel(p) * sizeof(float); }

/* Device buffers for one whole tensor's way across: the TP/EP-local one
 * and, with TP or EP pieces, the whole one. */
typedef struct whole_bufs {
    hs_device *dev;
    float *local, *whole;
} whole_bufs;

static hs_status whole_bufs_get(hs_engine *en, const hs_param *p, bool pieces, whole_bufs *b,
                                hs_error *e) {
    b->dev = hs_model_device(en->model);
    b->local = hs_device_alloc(b->dev, (size_t)hs_param_local_numel(p) * sizeof(float) + 1);
    b->whole = pieces ? hs_device_alloc(b->dev, whole_bytes(p)) : b->local;
    if (b->local && b->whole) return HS_OK;
    return hs_error_set(e, HS_ERR_OOM, "engine: cannot allocate %zu bytes of device memory for %s",
                        whole_bytes(p), p->fqn);
}

static void whole_bufs_put(whole_bufs *b) {
    if (b->whole != b->local) hs_device_free_mem(b->dev, b->whole);
    hs_device_free_mem(b->dev, b->local);
}

/* The whole tensor into the caller's host `out`: FSDP gathers the
 * TP/EP-local one and parallel/ the TP or EP pieces (a routed expert under
 * EP is on the ep mesh only) in device memory; the whole crosses once. */
static hs_status gather_whole(hs_engine *en, gather_fn g, int i, float *out, hs_error *e) {
    fsdp_engine *fe = eng_of(en);
    const hs_param *p = hs_model_param(en->model, i);
    bool on_ep = fe->ep && p->on_ep_mesh, pieces = fe->tp || on_ep;
    whole_bufs b = {0};
    hs_status s = whole_bufs_get(en, p, pieces, &b, e);
    if (s == HS_OK) s = g(fe->f, i, b.local, e);
    if (s == HS_OK && pieces)
        s = on_ep ? hs_ep_gather_full(b.dev, fe->ep, p, b.local, b.whole, e)
                  : hs_tp_gather_full(b.dev, fe->tp, p, b.local, b.whole, e);
    if (s == HS_OK) hs_device_copy(b.dev, out, b.whole, whole_bytes(p), HS_COPY_D2H);
    whole_bufs_put(&b);
    return s;
}

static hs_status fsdp_gather_full(hs_engine *en, int i, float *out, hs_error *e) {
    return gather_whole(en, hs_fsdp_gather_full, i, out, e);
}

static hs_status fsdp_gather_full_grad(hs_engine *en, int i, float *out, hs_error *e) {
    return gather_whole(en, hs_fsdp_gather_full_grad, i, out, e);
}

static hs_status fsdp_set_full(hs_engine *en, int i, const float *full, hs_error *e) {
    fsdp_engine *fe = eng_of(en);
    const hs_param *p = hs_model_param(en->model, i);
    bool on_ep = fe->ep && p->on_ep_mesh, pieces = fe->tp || on_ep;
    whole_bufs b = {0};
    hs_status s = whole_bufs_get(en, p, pieces, &b, e);
    if (s == HS_OK) hs_device_copy(b.dev, b.whole, full, whole_bytes(p), HS_COPY_H2D);
    if (s == HS_OK && on_ep) hs_ep_local_slice(b.dev, p, b.whole, b.local);
    else if (s == HS_OK && pieces) hs_tp_local_slice(b.dev, p, b.whole, b.local);
    if (s == HS_OK) s = hs_fsdp_set_full(fe->f, i, b.local, e);
    whole_bufs_put(&b);
    return s;
}

static void fsdp_ckpt_param(hs_engine *en, int i, hs_engine_ckpt_param *out) {
    hs_fsdp_shard_view v;
    hs_fsdp_shard_view_get(fsdp_of(en), i, &v);
    *out = (hs_engine_ckpt_param){.row_offset = v.row_offset,
                                  .rows = v.rows,
                                  .master = v.master,
                                  .storage_rows = v.storage_rows,
                                  .model_copy = v.model_copy,
                                  .model_dtype = v.model_dtype};
}

static void fsdp_free(hs_engine *en) {
    fsdp_engine *fe = eng_of(en);
    hs_fsdp_free(fe->f);
    hs_model_free(en->model);
    hs_tp_free(fe->tp);
    hs_cp_free(fe->cp);
    hs_ep_free(fe->ep);
    free(fe);
    free(en);
}

/* Context parallelism over the mesh's cp dim, when it is > 1. */
static hs_status cp_create(const hs_engine_env *env, hs_cp **out, hs_error *e) {
    *out = NULL;
    if (env->topo->cp < 2) return HS_OK;
    const char *how = env->cfg->accelerator.cp_rotate_method;
    bool ring = how[0] && !strcmp(how, "ring");
    return hs_cp_create(env->comm, env->dev, hs_mesh_group(env->mesh, HS_DIM_CP), ring, out, e);
}

static void batch_all_reduce(void *ctx, float *buf, int64_t n) {
    fsdp_engine *fe = ctx;
    hs_error e;
    if (hs_pg_all_reduce(fe->batch, fe->stream, buf, n, HS_DTYPE_F32, HS_REDUCE_SUM, &e) != HS_OK)
        hs_comm_abort(fe->comm, &e);
}

/* The model's ops: NULL for plain dense FSDP, else TP's table (or an empty
 * one of tp_size 1) with CP's members and, for MoE over several data
 * ranks, the micro-batch reduction of the load-balancing statistics. */
static const hs_model_ops *ops_for(fsdp_engine *fe) {
    if (!fe->tp && !fe->cp && !fe->ep && !fe->batch) return NULL;
    if (fe->tp) fe->ops = *hs_tp_ops(fe->tp);
    else fe->ops = (hs_model_ops){.tp_size = 1};
    if (fe->cp) hs_cp_fill_ops(fe->cp, &fe->ops);
    if (fe->ep) hs_ep_fill_ops(fe->ep, &fe->ops);
    if (fe->batch) fe->ops.batch_ctx = fe, fe->ops.batch_all_reduce = batch_all_reduce;
    return &fe->ops;
}

/* Tensor parallelism over the mesh's tp dim, when it is > 1. */
static hs_status tp_create(const hs_engine_env *env, hs_tp **out, hs_error *e) {
    *out = NULL;
    const hs_config *cfg = env->cfg; /* config validation refused what TP cannot run */
    if (env->topo->tp < 2) return HS_OK;
    return hs_tp_create(env->comm, env->dev, hs_mesh_group(env->mesh, HS_DIM_TP),
                        cfg->accelerator.sequence_parallel, cfg->accelerator.loss_parallel, out, e);
}

/* Expert parallelism over the mesh's ep dim, when it is > 1. */
static hs_status ep_create(const hs_engine_env *env, hs_ep **out, hs_error *e) {
    *out = NULL;
    if (env->topo->ep < 2) return HS_OK;
    return hs_ep_create(env->comm, env->dev, hs_mesh_group(env->mesh, HS_DIM_EP), out, e);
}

/* The EP plan (experts to the ep mesh), then the TP plan for the rest,
 * which checks the whole layout. */
static hs_status mp_plans(fsdp_engine *fe, hs_model *m, hs_error *e) {
    hs_status s = HS_OK;
    if (fe->ep) s = hs_ep_apply_plan(fe->ep, m, e);
    if (s != HS_OK) return s;
    if (!fe->tp) return fe->ep ? hs_model_check_tp_layout(m, e) : HS_OK;
    int n = 0;
    const hs_tp_rule *rules = hs_tp_default_plan(&n);
    return hs_tp_apply_plan(fe->tp, m, rules, n, e);
}

/* "fsdp", "fsdp+tp", "fsdp+tp+cp+ep", ... */
static const char *engine_name(const fsdp_engine *fe) {
    static const char *names[8] = {"fsdp",    "fsdp+tp",    "fsdp+cp",    "fsdp+tp+cp",
                                   "fsdp+ep", "fsdp+tp+ep", "fsdp+cp+ep", "fsdp+tp+cp+ep"};
    return names[(fe->tp != NULL) | (fe->cp != NULL) << 1 | (fe->ep != NULL) << 2];
}

hs_status hs_engine_fsdp_create(const hs_engine_env *env, hs_engine **out, hs_error *e) {
    *out = NULL;
    const hs_config *cfg = env->cfg;
    hs_model_options mo =
        hs_engine_model_options(cfg, true, env->max_batch, env->stage, env->act_slots);
    mo.dev = env->dev;
    hs_engine *en = calloc(1, sizeof *en);
    fsdp_engine *fe = calloc(1, sizeof *fe);
    if (!en || !fe) {
        free(en);
        free(fe);
        return hs_error_set(e, HS_ERR_OOM, "engine: cannot allocate the FSDP engine");
    }
    hs_status s = tp_create(env, &fe->tp, e);
    if (s == HS_OK) s = cp_create(env, &fe->cp, e);
    if (s == HS_OK) s = ep_create(env, &fe->ep, e);
    fe->comm = env->comm;
    fe->stream = env->dev->stream;
    hs_pg *batch = hs_mesh_group(env->mesh, HS_DIM_DP_CP);
    if (!strcmp(cfg->model.arch, "moe") && batch && hs_pg_size(batch) > 1) fe->batch = batch;
    mo.ops = ops_for(fe);
    hs_model *m = NULL;
    if (s == HS_OK) s = hs_model_create(&cfg->model, &mo, &m, e);
    if (s == HS_OK) s = mp_plans(fe, m, e);
    if (s == HS_OK) hs_train_freeze_apply(cfg, m);
    if (s == HS_OK)
        s = hs_fsdp_wrap(cfg, env->mesh, env->comm, env->dev, m, (uint64_t)cfg->train.seed,
                         env->log, &fe->f, e);
    if (s != HS_OK) {
        hs_fsdp_free(fe->f);
        hs_model_free(m);
        hs_tp_free(fe->tp);
        hs_cp_free(fe->cp);
        hs_ep_free(fe->ep);
        free(fe);
        free(en);
        return s;
    }
    *en = (hs_engine){
        .name = engine_name(fe),
        .ctx = fe,
        .model = m,
        .hooks = fsdp_hooks,
        .begin_micro_batch = fsdp_begin_micro_batch,
        .optim_params = fsdp_optim_params,
        .grad_norm = fsdp_grad_norm,
        .after_step = fsdp_after_step,
        .zero_grads = fsdp_zero_grads,
        .gather_full = fsdp_gather_full,
        .set_full = fsdp_set_full,
        .gather_full_grad = fsdp_gather_full_grad,
        .ckpt_param = fsdp_ckpt_param,
        .tp = fsdp_tp,
        .cp = fsdp_cp,
        .ep = fsdp_ep,
        .write_units = fsdp_write_units,
        .begin_step = fsdp_begin_step,
        .drain = fsdp_drain,
        .free = fsdp_free,
    };
    *out = en;
    return HS_OK;
}
