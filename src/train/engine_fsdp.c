/* The FSDP engine: the model computes with the unsharded views the FSDP
 * hooks install, the optimizer updates the local shards. hs_parallelize
 * builds it: TP, CP and EP through parallel/'s seam, the pipeline stage's
 * chunks, then FSDP over the local tensors (spec 004 §3 steps 1-2). */
#include "train/engines.h"

#include <stdlib.h>
#include <string.h>

#include "hypershard/fsdp.h"
#include "hypershard/parallel.h"

typedef struct fsdp_engine {
    hs_parallelized pz; /* the model, its seam and FSDP */
    hs_fsdp *f;         /* pz.fsdp */
    hs_tp *tp;          /* pz.par's, for whole tensors; NULL without TP */
    hs_ep *ep;          /* likewise; NULL without EP */
    char name[32];      /* hs_engine.name */
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

static hs_status fsdp_grad_sumsq_exact(hs_engine *en, hs_xsum *sum, hs_error *e) {
    return hs_fsdp_grad_sumsq_exact(fsdp_of(en), sum, e);
}

static hs_status fsdp_grad_norm(hs_engine *en, double *norm, hs_error *e) {
    return hs_fsdp_grad_norm(fsdp_of(en), norm, e);
}

static hs_status fsdp_after_step(hs_engine *en, bool stepped, hs_error *e) {
    return stepped ? hs_fsdp_after_optim_step(fsdp_of(en), e) : hs_fsdp_after_step(fsdp_of(en), e);
}

static void fsdp_zero_grads(hs_engine *en) { hs_fsdp_zero_grads(fsdp_of(en)); }

static void fsdp_begin_step(hs_engine *en) { hs_fsdp_begin_step(fsdp_of(en)); }
static void fsdp_drain(hs_engine *en) { hs_fsdp_drain(fsdp_of(en)); }

static double fsdp_take_exposed(hs_engine *en) {
    hs_fsdp_exposed_stats x;
    hs_fsdp_get_exposed(fsdp_of(en), &x);
    hs_fsdp_reset_exposed(fsdp_of(en));
    return x.total;
}

static hs_parallel *fsdp_parallel(hs_engine *en) { return eng_of(en)->pz.par; }
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
    return hs_error_oom(e, "engine: %zu bytes of device memory for %s", whole_bytes(p), p->fqn);
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
    hs_parallelized_free(&fe->pz);
    free(fe);
    free(en);
}

/* "fsdp", "fsdp+tp", "fsdp+tp+cp+ep", ...: FSDP and the model-parallel
 * dimensions in use, in hs_parallelize's order. */
static void engine_name(fsdp_engine *fe) {
    const hs_parallel_layout *l = hs_parallel_layout_of(fe->pz.par);
    snprintf(fe->name, sizeof fe->name, "fsdp%s%s%s", l->tp > 1 ? "+tp" : "",
             l->cp > 1 ? "+cp" : "", l->ep > 1 ? "+ep" : "");
}

hs_status hs_engine_fsdp_create(const hs_engine_env *env, hs_engine **out, hs_error *e) {
    *out = NULL;
    hs_engine *en = calloc(1, sizeof *en);
    fsdp_engine *fe = calloc(1, sizeof *fe);
    if (!en || !fe) {
        free(en);
        free(fe);
        return hs_error_oom(e, "engine: the FSDP engine");
    }
    hs_status s = hs_parallelize(env, &fe->pz, e);
    if (s != HS_OK) {
        free(fe);
        free(en);
        return s;
    }
    fe->f = fe->pz.fsdp;
    bool layout = hs_train_layout_invariant(&env->cfg->train);
    if (layout && !env->inference) {
        s = hs_fsdp_canon_micro_batches(fe->f, hs_config_micro_batches(env->cfg, env->topo), e);
        if (s != HS_OK) {
            hs_parallelized_free(&fe->pz);
            free(fe);
            free(en);
            return s;
        }
    }
    fe->tp = hs_parallel_tp(fe->pz.par);
    fe->ep = hs_parallel_ep(fe->pz.par);
    hs_model *m = fe->pz.model;
    engine_name(fe);
    *en = (hs_engine){
        .name = fe->name,
        .ctx = fe,
        .model = m,
        .hooks = fsdp_hooks,
        .begin_micro_batch = fsdp_begin_micro_batch,
        .optim_params = fsdp_optim_params,
        .grad_norm = fsdp_grad_norm,
        .grad_sumsq_exact = layout ? fsdp_grad_sumsq_exact : NULL,
        .after_step = fsdp_after_step,
        .zero_grads = fsdp_zero_grads,
        .gather_full = fsdp_gather_full,
        .set_full = fsdp_set_full,
        .gather_full_grad = fsdp_gather_full_grad,
        .ckpt_param = fsdp_ckpt_param,
        .parallel = fsdp_parallel,
        .write_units = fsdp_write_units,
        .begin_step = fsdp_begin_step,
        .drain = fsdp_drain,
        .take_exposed = fsdp_take_exposed,
        .free = fsdp_free,
    };
    *out = en;
    return HS_OK;
}
