/* The pipeline-parallel engine: this rank runs its stage through the inner
 * (FSDP) engine; whole-model operations address every parameter of the
 * model through a describe-only catalog. A parameter's owning stage
 * gathers it (collective over that stage's data-parallel and TP ranks)
 * and the pp group receives it by broadcast, so every rank calls
 * gather_full for every parameter in catalog order, as the one-stage
 * engines require. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "train/engines.h"
#include "train/run.h"

typedef struct pp_engine {
    hs_engine *inner;
    hs_pg *pp; /* the mesh's pp group: group rank = stage */
    int stage;
    int *owner; /* per catalog parameter: its stage */
    int *local; /* per catalog parameter: index in the stage model, -1 elsewhere */
    char name[48];
} pp_engine;

static pp_engine *pe_of(hs_engine *en) { return en->ctx; }
static hs_engine *inner_of(hs_engine *en) { return pe_of(en)->inner; }

static const hs_model_hooks *pp_hooks(hs_engine *en) { return inner_of(en)->hooks(inner_of(en)); }

static void pp_begin_micro_batch(hs_engine *en, bool sync, bool reshard, bool last) {
    inner_of(en)->begin_micro_batch(inner_of(en), sync, reshard, last);
}

static int pp_optim_params(hs_engine *en, hs_optim_param **out) {
    return inner_of(en)->optim_params(inner_of(en), out);
}

/* The stage's exact sum of squares merged over the stages. */
static hs_status pp_grad_sumsq_exact(hs_engine *en, hs_xsum *sum, hs_error *e) {
    hs_xsum mine;
    hs_xsum_init(&mine);
    hs_status s = inner_of(en)->grad_sumsq_exact(inner_of(en), &mine, e);
    if (s == HS_OK) s = hs_pg_all_reduce_xsum(pe_of(en)->pp, &mine, e);
    if (s == HS_OK) hs_xsum_merge(sum, &mine);
    return s;
}

/* The stage's norm, then the squares of every stage summed. */
static hs_status pp_grad_norm(hs_engine *en, double *norm, hs_error *e) {
    double local = 0.0;
    hs_status s = inner_of(en)->grad_norm(inner_of(en), &local, e);
    double sq = local * local;
    if (s == HS_OK) s = hs_reduce_sum_f64(pe_of(en)->pp, &sq, 1, e);
    *norm = sqrt(sq);
    return s;
}

static hs_status pp_after_step(hs_engine *en, bool stepped, hs_error *e) {
    return inner_of(en)->after_step(inner_of(en), stepped, e);
}

static void pp_zero_grads(hs_engine *en) { inner_of(en)->zero_grads(inner_of(en)); }

typedef hs_status (*gather_fn)(hs_engine *en, int i, float *out, hs_error *e);

static hs_status broadcast_from_owner(hs_engine *en, gather_fn inner_g, int i, float *out,
                                      hs_error *e) {
    pp_engine *pe = pe_of(en);
    hs_status s = HS_OK;
    if (pe->local[i] >= 0) s = inner_g(pe->inner, pe->local[i], out, e);
    /* Every rank reaches the broadcast: a failed gather is reported after it. */
    hs_error be;
    hs_error_clear(&be);
    /* `out` is the caller's host array, which the owner's gather filled. */
    hs_status bs = hs_pg_broadcast(pe->pp, NULL, out,
                                   hs_param_numel(hs_model_param(en->catalog, i)), HS_DTYPE_F32,
                                   pe->owner[i], &be);
    if (s == HS_OK && bs != HS_OK) *e = be, s = bs;
    return s;
}

static hs_status pp_gather_full(hs_engine *en, int i, float *out, hs_error *e) {
    return broadcast_from_owner(en, inner_of(en)->gather_full, i, out, e);
}

static hs_status pp_gather_full_grad(hs_engine *en, int i, float *out, hs_error *e) {
    return broadcast_from_owner(en, inner_of(en)->gather_full_grad, i, out, e);
}

/* Every rank holds the whole tensor (it read the file); the owner takes it. */
static hs_status pp_set_full(hs_engine *en, int i, const float *full, hs_error *e) {
    pp_engine *pe = pe_of(en);
    if (pe->local[i] < 0) return HS_OK;
    return pe->inner->set_full(pe->inner, pe->local[i], full, e);
}

static void pp_ckpt_param(hs_engine *en, int i, hs_engine_ckpt_param *out) {
    inner_of(en)->ckpt_param(inner_of(en), i, out);
}

static hs_parallel *pp_parallel(hs_engine *en) { return hs_engine_parallel(inner_of(en)); }
static void pp_write_units(hs_engine *en, FILE *out) {
    inner_of(en)->write_units(inner_of(en), out);
}
static void pp_begin_step(hs_engine *en) { inner_of(en)->begin_step(inner_of(en)); }
static void pp_drain(hs_engine *en) { inner_of(en)->drain(inner_of(en)); }
static double pp_take_exposed(hs_engine *en) { return hs_engine_take_exposed(inner_of(en)); }

static void pp_free(hs_engine *en) {
    pp_engine *pe = pe_of(en);
    hs_engine_free(pe->inner);
    hs_model_free(en->catalog);
    free(pe->owner);
    free(pe->local);
    free(pe);
    free(en);
}

/* The stage each catalog parameter lives on: its block's (layer_stage),
 * the embedding with the first block, the final norm and lm_head with the
 * last (the last stage, or the first under zbv's V). */
static int owner_stage(const int *layer_stage, int n_layers, const hs_param *p) {
    int layer = -1;
    if (sscanf(p->fqn, "model.layers.%d.", &layer) != 1)
        return layer_stage[p->kind == HS_PARAM_EMBEDDING ? 0 : n_layers - 1];
    HS_ASSERT(layer >= 0 && layer < n_layers);
    return layer_stage[layer];
}

hs_status hs_engine_pp_create(const hs_engine_env *env, hs_engine *inner, hs_engine **out,
                              hs_error *e) {
    *out = NULL;
    hs_engine *en = calloc(1, sizeof *en);
    pp_engine *pe = calloc(1, sizeof *pe);
    hs_model_options mo = {.compute_dtype = HS_DTYPE_F32,
                           .grad_dtype = HS_DTYPE_F32,
                           .max_batch = 1,
                           .seq_len = env->cfg->train.seq_len,
                           .describe_only = true};
    hs_model *catalog = NULL;
    hs_status s = en && pe ? hs_model_create(&env->cfg->model, &mo, &catalog, e)
                           : hs_error_oom(e, "engine: cannot allocate the PP engine");
    int n = catalog ? hs_model_num_params(catalog) : 0;
    int pp = env->topo->pp, L = env->cfg->model.n_layers;
    int *layer_stage = NULL;
    if (s == HS_OK) {
        pe->owner = calloc((size_t)n + 1, sizeof *pe->owner);
        pe->local = calloc((size_t)n + 1, sizeof *pe->local);
        layer_stage = calloc((size_t)L + 1, sizeof *layer_stage);
        if (!pe->owner || !pe->local || !layer_stage)
            s = hs_error_oom(e, "engine: the stage map of %d parameters and %d blocks", n, L);
    }
    if (s != HS_OK) {
        free(layer_stage);
        hs_model_free(catalog);
        if (pe) free(pe->owner), free(pe->local);
        free(pe);
        free(en);
        hs_engine_free(inner);
        return s;
    }
    pe->inner = inner;
    pe->pp = hs_mesh_group(env->mesh, HS_DIM_PP);
    pe->stage = hs_mesh_coords(env->mesh).pp;
    /* which stage holds each block, from the stages' chunks */
    for (int st = 0; st < pp; st++) {
        hs_model_stage ch;
        hs_pp_stage_chunks(&env->cfg->accelerator, env->cfg->model.n_layers, st, &ch);
        for (int v = 0; v < ch.n_chunks; v++)
            for (int j = 0; j < ch.n_layers[v]; j++) layer_stage[ch.first_layer[v] + j] = st;
    }
    for (int i = 0; i < n; i++) {
        const hs_param *p = hs_model_param(catalog, i);
        pe->owner[i] = owner_stage(layer_stage, L, p);
        pe->local[i] = pe->owner[i] == pe->stage ? hs_model_find_param(inner->model, p->fqn) : -1;
        HS_ASSERT(pe->owner[i] != pe->stage || pe->local[i] >= 0);
    }
    free(layer_stage);
    snprintf(pe->name, sizeof pe->name, "%s+pp", inner->name);
    *en = (hs_engine){
        .name = pe->name,
        .ctx = pe,
        .model = inner->model,
        .catalog = catalog,
        .hooks = pp_hooks,
        .begin_micro_batch = pp_begin_micro_batch,
        .optim_params = pp_optim_params,
        .grad_norm = pp_grad_norm,
        .grad_sumsq_exact = inner->grad_sumsq_exact ? pp_grad_sumsq_exact : NULL,
        .after_step = pp_after_step,
        .zero_grads = pp_zero_grads,
        .gather_full = pp_gather_full,
        .set_full = pp_set_full,
        .gather_full_grad = inner->gather_full_grad ? pp_gather_full_grad : NULL,
        .ckpt_param = pp_ckpt_param,
        .parallel = pp_parallel,
        .write_units = inner->write_units ? pp_write_units : NULL,
        .begin_step = pp_begin_step,
        .drain = pp_drain,
        .take_exposed = pp_take_exposed,
        .free = pp_free,
    };
    *out = en;
    return HS_OK;
}
