/* FSDP2Manager.parallelize (spec 004 §3): from the resolved config and the
 * built model to a wrapped model — replicate_params resolved, every
 * parameter in its deepest unit, blocks wrapped bottom-up, the root last
 * with reshard_after_forward = false, prefetch order by declaration. */
#include "fsdp/manager.h"
#include "fsdp/fusion.h"
#include "fsdp/policy.h"

#include <stdlib.h>
#include <string.h>

static hs_pg *group_or_null(hs_mesh *mesh, hs_mesh_dim d, int *size, int *rank) {
    hs_pg *g = hs_mesh_group(mesh, d);
    *size = g ? hs_pg_size(g) : 1;
    *rank = g ? hs_pg_rank(g) : 0;
    return *size > 1 ? g : NULL;
}

static hs_fsdp_dp_groups dp_groups_of(hs_mesh *mesh) {
    hs_fsdp_dp_groups g = {0};
    g.shard = group_or_null(mesh, HS_DIM_FSDP_SHARD, &g.shard_size, &g.shard_rank);
    g.replicate = group_or_null(mesh, HS_DIM_FSDP_REPLICATE, &g.replicate_size, &g.replicate_rank);
    g.flat = group_or_null(mesh, HS_DIM_FSDP, &g.flat_size, &g.flat_rank);
    g.tp = group_or_null(mesh, HS_DIM_TP, &g.tp_size, &g.tp_rank);
    g.edp_shard = group_or_null(mesh, HS_DIM_EDP_SHARD, &g.edp_shard_size, &g.edp_shard_rank);
    g.edp_replicate =
        group_or_null(mesh, HS_DIM_EDP_REPLICATE, &g.edp_replicate_size, &g.edp_replicate_rank);
    g.edp_size = g.edp_shard_size * g.edp_replicate_size;
    g.ep = group_or_null(mesh, HS_DIM_EP, &g.ep_size, &g.ep_rank);
    return g;
}

/* Sharded over `shard`, replicated over `rep` (HSDP when it is > 1). */
static void set_sharded(hs_fsdp_mesh_info *mi, hs_pg *shard, int shard_size, int shard_rank,
                        hs_pg *rep, int rep_size, int rep_rank) {
    mi->kind = rep_size > 1 ? HS_FSDP_MESH_HSDP : HS_FSDP_MESH_FSDP;
    mi->shard_pg = shard;
    mi->shard_size = shard_size;
    mi->shard_rank = shard_rank;
    mi->replicate_pg = rep;
    mi->replicate_size = rep_size;
    mi->replicate_rank = rep_rank;
}

/* A routed expert under expert parallelism (spec 004 §6): sharded over
 * edp_shard, replicated over edp_replicate, its pieces over ep. Its rank
 * sums the rows of every EP peer's tokens, so the EDP domain's reduction
 * must SUM what the dense domain's pre-scale (x dp*cp) and average would:
 * x edp before averaging over edp, i.e. domain_factor = edp / (dp*cp). */
static hs_fsdp_mesh_info expert_mesh_info(const hs_fsdp_dp_groups *g) {
    hs_fsdp_mesh_info mi = {0};
    set_sharded(&mi, g->edp_shard, g->edp_shard_size, g->edp_shard_rank, g->edp_replicate,
                g->edp_replicate_size, g->edp_replicate_rank);
    mi.tp_size = 1;
    mi.ep_pg = g->ep;
    mi.ep_size = g->ep_size;
    mi.ep_rank = g->ep_rank;
    mi.domain_factor = (float)g->edp_size / (float)(g->flat_size > 0 ? g->flat_size : 1);
    mi.secondary_pg = g->edp_secondary;
    mi.secondary_size = g->edp_secondary_size > 0 ? g->edp_secondary_size : 1;
    mi.secondary_rank = g->edp_secondary_rank;
    mi.levels = &g->edp_levels;
    return mi;
}

/* RFC §5.5: replicate_params all-reduce over the whole flattened R x S
 * domain, never over the R dim alone. */
static hs_fsdp_mesh_info mesh_info_for(const hs_fsdp_dp_groups *g, bool replicate) {
    hs_fsdp_mesh_info mi = {0};
    mi.shard_size = 1;
    mi.tp_pg = g->tp;
    mi.tp_size = g->tp_size > 0 ? g->tp_size : 1;
    mi.tp_rank = g->tp_rank;
    if (replicate) {
        mi.kind = HS_FSDP_MESH_DDP;
        mi.replicate_pg = g->flat;
        mi.replicate_size = g->flat_size;
        mi.replicate_rank = g->flat_rank;
        return mi;
    }
    set_sharded(&mi, g->shard, g->shard_size, g->shard_rank, g->replicate, g->replicate_size,
                g->replicate_rank);
    mi.secondary_pg = g->secondary;
    mi.secondary_size = g->secondary_size > 0 ? g->secondary_size : 1;
    mi.secondary_rank = g->secondary_rank;
    mi.levels = &g->levels;
    return mi;
}

static bool is_replicate_param(const hs_fsdp_config *fsdp, const char *fqn) {
    for (int i = 0; i < fsdp->n_replicate_params; i++)
        if (strcmp(fsdp->replicate_params[i], fqn) == 0) return true;
    return false;
}

/* A pipeline stage holds some of the FQNs only; the trainer checks the
 * names against the whole model's. */
static hs_status check_fqns(const hs_fsdp_config *fsdp, hs_model *model, hs_error *e) {
    if (!hs_model_is_first_stage(model) || !hs_model_is_last_stage(model)) return HS_OK;
    int n = hs_model_num_params(model);
    const char **fqns = calloc((size_t)n + 1, sizeof *fqns);
    if (!fqns)
        return hs_error_oom(e, "fsdp: the names of %d parameters: %zu bytes", n,
                            ((size_t)n + 1) * sizeof *fqns);
    for (int i = 0; i < n; i++) fqns[i] = hs_model_param(model, i)->fqn;
    hs_status st = hs_config_check_fqns(fsdp, fqns, n, e);
    free(fqns);
    return st;
}

/* Chunk c's units in the order its forward (backward) runs them: the root
 * where the chunk calls a root's hooks (hs_unit_desc.chunk; -1: a root
 * several chunks call), then its blocks in declaration order (backward:
 * last to first). Returns how many. */
static int chunk_order(const hs_model *m, int n, int c, bool backward, int *order) {
    int len = 0;
    for (int ui = 0; ui < n; ui++) {
        const hs_unit_desc *d = hs_model_unit(m, ui);
        if (d->root && (d->chunk == c || d->chunk < 0)) order[len++] = ui;
    }
    for (int j = 0; j < n; j++) {
        int ui = backward ? n - 1 - j : j;
        const hs_unit_desc *d = hs_model_unit(m, ui);
        if (!d->root && d->chunk == c) order[len++] = ui;
    }
    return len;
}

/* Each unit prefetches the next `depth` units of its own chunk's pass:
 * which chunk runs next is the pipeline schedule's choice
 * (hs_fsdp_prefetch_next, which starts from each chunk's first unit kept
 * here), and a unit gathered for a chunk that did not come next was
 * gathered again. A root that both of zbv's chunks call (a tied head)
 * prefetches nothing. One chunk: declaration order. */
static hs_status set_prefetch(hs_fsdp_ctx *ctx, const hs_model *m, int fwd_depth, int bwd_depth,
                              hs_error *e) {
    int n = ctx->n_units, chunks = 0, depth[2] = {fwd_depth, bwd_depth};
    ctx->fwd_depth = fwd_depth, ctx->bwd_depth = bwd_depth;
    for (int k = 0; k < n; k++)
        if (hs_model_unit(m, k)->chunk + 1 > chunks) chunks = hs_model_unit(m, k)->chunk + 1;
    HS_ASSERT(chunks <= HS_MODEL_MAX_CHUNKS);
    int *order = malloc(sizeof(int) * (size_t)n);
    hs_status st = order ? HS_OK
                         : hs_error_oom(e, "fsdp: the prefetch order of %d units: %zu bytes", n,
                                        sizeof(int) * (size_t)n);
    for (int k = 0; k < n && st == HS_OK; k++) {
        hs_fsdp_unit *u = &ctx->units[k];
        u->fwd_prefetch = calloc((size_t)(fwd_depth > 0 ? fwd_depth : 1), sizeof(int));
        u->bwd_prefetch = calloc((size_t)(bwd_depth > 0 ? bwd_depth : 1), sizeof(int));
        if (!u->fwd_prefetch || !u->bwd_prefetch)
            st = hs_error_oom(e, "fsdp: the prefetch lists of unit %d", k);
    }
    for (int dir = 0; dir < 2; dir++)
        for (int c = 0; c < HS_MODEL_MAX_CHUNKS; c++) ctx->chunk_first[dir][c] = -1;
    for (int dir = 0; dir < 2 && st == HS_OK; dir++)
        for (int c = 0; c < chunks; c++) {
            int len = chunk_order(m, n, c, dir == 1, order);
            ctx->chunk_first[dir][c] = len > 0 ? order[0] : -1;
            for (int at = 0; at < len; at++) {
                if (hs_model_unit(m, order[at])->chunk != c) continue; /* a shared root */
                hs_fsdp_unit *u = &ctx->units[order[at]];
                int *list = dir ? u->bwd_prefetch : u->fwd_prefetch;
                int *np = dir ? &u->n_bwd_prefetch : &u->n_fwd_prefetch;
                for (int p = at + 1; p < len && *np < depth[dir]; p++) list[(*np)++] = order[p];
            }
        }
    free(order);
    return st;
}

/* The one parameter-kind check per unit (RFC §4.1), on the source layouts
 * the TP planner set (hs_param.on_tp_mesh / tp). */
static hs_status check_unit_sources(hs_fsdp_unit *u, hs_error *e) {
    const char **fqns = calloc((size_t)u->n_params + 1, sizeof *fqns);
    const hs_source_layout **layouts = calloc((size_t)u->n_params + 1, sizeof *layouts);
    hs_source_layout *tp = calloc((size_t)u->n_params + 1, sizeof *tp);
    if (!fqns || !layouts || !tp) {
        free(fqns);
        free(layouts);
        free(tp);
        return hs_error_oom(e, "fsdp unit %s: the source layouts of %d parameters",
                            u->name[0] ? u->name : "root", u->n_params);
    }
    for (int i = 0; i < u->n_params; i++) {
        const hs_param *p = u->params[i]->p;
        fqns[i] = p->fqn;
        if (p->on_ep_mesh) {
            hs_placement s0 = {.kind = HS_PLACEMENT_SHARD, .dim = 0};
            tp[i] = (hs_source_layout){.mesh = "ep", .ndim = 1, .placements = {s0}};
            layouts[i] = &tp[i];
            continue;
        }
        if (!p->on_tp_mesh) continue;
        tp[i] = (hs_source_layout){.mesh = "tp", .ndim = 1, .placements = {p->tp}};
        layouts[i] = &tp[i];
    }
    hs_status st = hs_fsdp_check_unit_sources(u->name, fqns, layouts, u->n_params, e);
    free(fqns);
    free(layouts);
    free(tp);
    return st;
}

static hs_status build_units(hs_fsdp *f, const hs_fsdp_config *fsdp, hs_error *e) {
    hs_fsdp_ctx *ctx = &f->ctx;
    ctx->n_units = hs_model_num_units(f->model);
    ctx->units = calloc((size_t)ctx->n_units, sizeof *ctx->units);
    if (!ctx->units)
        return hs_error_oom(e, "fsdp: %d units: %zu bytes", ctx->n_units,
                            (size_t)ctx->n_units * sizeof *ctx->units);
    for (int ui = 0; ui < ctx->n_units; ui++) {
        hs_fsdp_unit *u = &ctx->units[ui];
        const hs_unit_desc *d = hs_model_unit(f->model, ui);
        u->index = ui;
        snprintf(u->name, sizeof u->name, "%s", d->name);
        u->is_root = d->root;
        u->is_expert = d->is_expert;
        u->chunk = d->chunk;
        u->params = calloc((size_t)ctx->n_params + 1, sizeof *u->params);
        if (!u->params) return hs_error_oom(e, "fsdp unit %s: its parameter list", u->name);
    }
    for (int i = 0; i < ctx->n_params; i++) {
        hs_fsdp_param *fp = &ctx->params[i];
        if (fp->p->unit < 0 || fp->p->unit >= ctx->n_units)
            return hs_error_set(e, HS_ERR_INTERNAL, "parameter %s names unit %d of %d", fp->p->fqn,
                                fp->p->unit, ctx->n_units);
        hs_fsdp_unit *u = &ctx->units[fp->p->unit];
        u->params[u->n_params++] = fp;
    }
    /* Children before parents: nested expert units come after their block
     * in declaration order, so the reverse order is bottom-up and the root
     * (unit 0) is wrapped last. */
    for (int ui = ctx->n_units - 1; ui >= 0; ui--) {
        hs_fsdp_unit *u = &ctx->units[ui];
        hs_status st = check_unit_sources(u, e);
        if (st != HS_OK) return st;
        u->reshard_after_forward = u->is_root ? false : fsdp->reshard_after_forward;
        st = hs_fsdp_unit_build_groups(u, &ctx->mem, e);
        if (st != HS_OK) return st;
        if (!u->is_root && !u->is_expert) f->blocks_wrapped++;
    }
    hs_status pst =
        set_prefetch(ctx, f->model, fsdp->forward_prefetch_depth, fsdp->backward_prefetch_depth, e);
    if (pst != HS_OK) return pst;
    for (int ui = 0; fsdp->comm_fusion && ui < ctx->n_units; ui++) {
        /* null means zero-copy, as PyTorch's default (spec 004 §2.4) */
        hs_status st = hs_fsdp_fusion_build(&ctx->units[ui], fsdp->comm_fusion_zero_copy != 0,
                                            &ctx->mem, &ctx->exposed, e);
        if (st != HS_OK) return st;
    }
    return HS_OK;
}

static hs_status build_params(hs_fsdp *f, const hs_fsdp_config *fsdp, bool fp32_main_params,
                              const hs_fsdp_dp_groups *g, uint64_t seed, hs_error *e) {
    hs_fsdp_ctx *ctx = &f->ctx;
    ctx->n_params = hs_model_num_params(f->model);
    ctx->params = calloc((size_t)ctx->n_params + 1, sizeof *ctx->params);
    if (!ctx->params)
        return hs_error_oom(e, "fsdp: %d managed parameters: %zu bytes", ctx->n_params,
                            ((size_t)ctx->n_params + 1) * sizeof *ctx->params);
    hs_dtype compute = fsdp->mix_precision.param_dtype == HS_MP_NULL
                           ? HS_DTYPE_F32
                           : (hs_dtype)fsdp->mix_precision.param_dtype;
    for (int i = 0; i < ctx->n_params; i++) {
        hs_param *p = hs_model_param(f->model, i);
        if (p->data || p->grad)
            return hs_error_set(e, HS_ERR_INTERNAL,
                                "parameter %s already has storage; create the model with "
                                "allocate_params = false before wrapping it with FSDP",
                                p->fqn);
        bool rep = is_replicate_param(fsdp, p->fqn);
        if (rep && p->on_ep_mesh)
            return hs_error_set(e, HS_ERR_CONFIG,
                                "fsdp_config.replicate_params lists %s, a routed expert that "
                                "expert parallelism places on fsdp_moe_mesh; remove it from "
                                "the list (experts follow fsdp_config.edp_shard_size)",
                                p->fqn);
        hs_fsdp_mesh_info mi = p->on_ep_mesh ? expert_mesh_info(g) : mesh_info_for(g, rep);
        hs_status st =
            hs_fsdp_param_init(&ctx->params[i], f->model, i, rep, &mi, compute, &ctx->mem, seed, e);
        if (st != HS_OK) return st;
        /* Before the units group gradients by reduce dtype. */
        ctx->params[i].reduce_dtype = hs_fsdp_mp_reduce_dtype(&fsdp->mix_precision, compute);
        /* replicate_params never all-gather, so are never quantized */
        ctx->params[i].gather_fmt = rep ? HS_QUANT_NONE : hs_fsdp_config_param_gather(fsdp);
        ctx->params[i].gather_block = fsdp->param_gather_block > 0 ? fsdp->param_gather_block : 1;
        ctx->params[i].grad_fmt = rep ? HS_QUANT_NONE : hs_fsdp_config_grad_reduce(fsdp);
        ctx->params[i].grad_block = hs_fsdp_config_grad_block(fsdp);
        st = hs_fsdp_main_init(&ctx->params[i], fp32_main_params, e);
        if (st != HS_OK) return st;
        ctx->params[i].exposed = &ctx->exposed;
        int64_t numel = ctx->params[i].plan.unpacked_numel; /* TP-local */
        f->total_param_bytes += numel * (int64_t)sizeof(float);
    }
    return HS_OK;
}

/* "int8 in blocks of 256", or `plain` for no wire format. */
static void wire_text(char *buf, size_t cap, hs_quant_fmt f, int block, const char *plain) {
    if (f == HS_QUANT_NONE) snprintf(buf, cap, "%s", plain);
    else snprintf(buf, cap, "%s in blocks of %d", hs_quant_fmt_name(f), block);
}

static void log_wrapped(const hs_fsdp *f, const hs_fsdp_config *fsdp) {
    int experts = 0;
    for (int u = 0; u < f->ctx.n_units; u++) experts += f->ctx.units[u].is_expert;
    if (!f->ctx.log) return;
    char extra[160] = "";
    if (experts && f->groups.ep_size > 1)
        snprintf(extra, sizeof extra,
                 " + %d expert units on fsdp_moe_mesh (ep %d, expert shard degree %d, replicate "
                 "degree %d)",
                 experts, f->groups.ep_size, f->groups.edp_shard_size,
                 f->groups.edp_replicate_size);
    else if (experts) snprintf(extra, sizeof extra, " + %d expert units", experts);
    hs_log_info(f->ctx.log,
                "fsdp: wrapped %d transformer blocks%s and the root (%d units); shard degree "
                "%d, replicate degree %d; %d replicate_params; reshard_after_forward=%s",
                f->blocks_wrapped, extra, f->ctx.n_units, f->groups.shard_size,
                f->groups.replicate_size, fsdp->n_replicate_params,
                fsdp->reshard_after_forward ? "true" : "false");
    const char *fusion = "off";
    for (int u = 0; u < f->ctx.n_units; u++)
        if (f->ctx.units[u].fusion)
            fusion = f->ctx.units[u].fusion->zero_copy ? "on, zero-copy" : "on, copy-in";
    char gather[64], reduce[64];
    wire_text(gather, sizeof gather, hs_fsdp_config_param_gather(fsdp), fsdp->param_gather_block,
              "param_dtype");
    wire_text(reduce, sizeof reduce, hs_fsdp_config_grad_reduce(fsdp),
              hs_fsdp_config_grad_block(fsdp), "reduce_dtype");
    hs_log_info(f->ctx.log,
                "fsdp: prefetch depth forward %d, backward %d; comm_fusion %s; parameters "
                "gathered in %s, gradients reduce-scattered in %s",
                fsdp->forward_prefetch_depth, fsdp->backward_prefetch_depth, fusion, gather,
                reduce);
    if (f->groups.levels.node)
        hs_log_info(f->ctx.log,
                    "fsdp: gradients reduced in two levels: the shard group spans %d nodes of %d "
                    "ranks, each chunk summed inside its node, then across the nodes",
                    f->groups.levels.N, f->groups.levels.L);
    if (fsdp->secondary_shard_size > 0) {
        char experts_too[96] = "";
        if (f->groups.ep_size > 1)
            snprintf(experts_too, sizeof experts_too, "; experts over %d of %d",
                     f->groups.edp_secondary_size, f->groups.edp_shard_size);
        hs_log_info(f->ctx.log,
                    "fsdp: secondary shard: between forward and backward each parameter stays "
                    "sharded over %d of the %d shard ranks, and the backward gathers among "
                    "them%s",
                    f->groups.secondary_size, f->groups.shard_size, experts_too);
    }
}

hs_status hs_fsdp_wrap_groups(const hs_fsdp_config *fsdp, bool fp32_main_params,
                              const hs_fsdp_dp_groups *g, hs_comm *comm, hs_device *dev,
                              hs_model *model, uint64_t seed, const hs_log *log, hs_fsdp **out,
                              hs_error *e) {
    *out = NULL;
    hs_error_clear(e);
    hs_fsdp *f = calloc(1, sizeof *f);
    if (!f) return hs_error_oom(e, "fsdp: the wrapper: %zu bytes", sizeof *f);
    f->model = model;
    f->groups = *g;
    hs_fsdp_mem_init(&f->ctx.mem, dev);
    f->ctx.exposed.dev = dev;
    f->ctx.mem.offload = fsdp->enable_offload;
    hs_status st = hs_fsdp_mem_open_streams(&f->ctx.mem, e);
    if (st == HS_OK) st = check_fqns(fsdp, model, e);
    if (st == HS_OK) st = build_params(f, fsdp, fp32_main_params, &f->groups, seed, e);
    if (st == HS_OK) st = build_units(f, fsdp, e);
    hs_status ist = hs_fsdp_ctx_init(&f->ctx, comm, log, st == HS_OK ? e : NULL);
    if (st == HS_OK) st = ist;
    if (st != HS_OK) {
        hs_fsdp_free(f);
        return st;
    }
    /* The trainer scales the loss by 1 / (tokens in the global batch), so
     * each rank holds a 1/dp share of the gradient; scaling by dp before the
     * first collective lets every stage average (S, then R): the DP average
     * applied once, RFC §6.4. Scale and averages cancel, so the stages sum
     * instead and no pass scales the gradients (hs_fsdp_ctx_set_prescale). */
    hs_fsdp_ctx_set_prescale(&f->ctx, (float)g->flat_size);
    log_wrapped(f, fsdp);
    *out = f;
    return HS_OK;
}

hs_status hs_fsdp_wrap(const hs_fsdp_config *fsdp, bool fp32_main_params, hs_mesh *mesh,
                       hs_comm *comm, hs_device *dev, hs_model *model, uint64_t seed,
                       const hs_log *log, hs_fsdp **out, hs_error *e) {
    *out = NULL;
    hs_error_clear(e);
    const hs_topology *t = hs_mesh_topology(mesh);
    hs_fsdp_dp_groups g = dp_groups_of(mesh);
    HS_ASSERT(g.shard_size == t->dp_shard && g.replicate_size == t->dp_replicate &&
              g.flat_size == t->fsdp_dp);
    hs_status st = hs_fsdp_node_groups(fsdp, comm, &g, e);
    if (st != HS_OK) return st;
    st = hs_fsdp_wrap_groups(fsdp, fp32_main_params, &g, comm, dev, model, seed, log, out, e);
    if (st != HS_OK) hs_fsdp_node_groups_free(&g);
    else (*out)->owns_node_groups = true; /* the tables go with the wrapper */
    return st;
}

void hs_fsdp_free(hs_fsdp *f) {
    if (!f) return;
    hs_fsdp_ctx_free(&f->ctx);
    if (f->owns_node_groups) hs_fsdp_node_groups_free(&f->groups);
    free(f->optim);
    free(f);
}

hs_fsdp_ctx *hs_fsdp_context(hs_fsdp *f) { return &f->ctx; }
