/* The reduction pipeline and the root drain of one wrapped model. */
#include "fsdp/context.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/fusion.h"
#include "fsdp/prefetch.h"

hs_status hs_fsdp_ctx_init(hs_fsdp_ctx *ctx, hs_comm *comm, const hs_log *log, hs_error *e) {
    ctx->comm = comm;
    ctx->log = log;
    ctx->sync = true;
    ctx->reshard = true;
    ctx->grad_prescale = 1.0f;
    ctx->prev_unit = -1;
    ctx->next_chunk = -1;
    ctx->n_reduced = 0;
    size_t n = (size_t)(ctx->n_units ? ctx->n_units : 1);
    ctx->reduced = calloc(n, sizeof(int));
    if (!ctx->reduced)
        return hs_error_oom(e, "fsdp: the reduction queue of %zu units: %zu bytes", n,
                            n * sizeof(int));
    ctx->hooks.ctx = ctx;
    ctx->hooks.pre_forward = hs_fsdp_hook_pre_forward;
    ctx->hooks.post_forward = hs_fsdp_hook_post_forward;
    ctx->hooks.pre_backward = hs_fsdp_hook_pre_backward;
    ctx->hooks.post_backward = hs_fsdp_hook_post_backward;
    ctx->hooks.post_backward_final = hs_fsdp_hook_post_backward_final;
    ctx->hooks.weight_grad_deferred = hs_fsdp_hook_weight_grad_deferred;
    ctx->hooks.post_weight_grad = hs_fsdp_hook_post_weight_grad;
    ctx->hooks.next_chunk = hs_fsdp_prefetch_next;
    return HS_OK;
}

void hs_fsdp_ctx_set_prescale(hs_fsdp_ctx *ctx, float prescale) {
    ctx->grad_prescale = prescale;
    for (int i = 0; i < ctx->n_params; i++)
        ctx->params[i].dp_sum = ctx->params[i].p &&
                                hs_fsdp_param_prescale_cancels(&ctx->params[i], prescale);
    /* A reduce group's members share its groups, so they agree. */
    for (int u = 0; u < ctx->n_units; u++) {
        hs_fsdp_unit *un = &ctx->units[u];
        for (int g = 0; g < un->n_groups; g++) {
            hs_fsdp_reduce_group *grp = &un->groups[g];
            grp->op = hs_fsdp_param_dp_op(grp->params[0]);
            for (int j = 1; j < grp->n_params; j++)
                HS_ASSERT(hs_fsdp_param_dp_op(grp->params[j]) == grp->op);
        }
    }
}

void hs_fsdp_ctx_free(hs_fsdp_ctx *ctx) {
    if (hs_fsdp_ctx_pending(ctx)) hs_fsdp_ctx_drain(ctx);
    hs_fsdp_prefetch_settle(ctx);
    for (int u = 0; u < ctx->n_units; u++) hs_fsdp_unit_free(&ctx->units[u], &ctx->mem);
    for (int i = 0; i < ctx->n_params; i++) hs_fsdp_param_free(&ctx->params[i]);
    free(ctx->units);
    free(ctx->params);
    free(ctx->reduced);
    ctx->units = NULL;
    ctx->params = NULL;
    ctx->reduced = NULL;
    hs_fsdp_mem_release(&ctx->mem);
}

_Noreturn void hs_fsdp_ctx_fail(hs_fsdp_ctx *ctx, const hs_error *e) {
    hs_comm_abort(ctx->comm, e);
}

static void wait_reduce_scatters(hs_fsdp_ctx *ctx, hs_fsdp_unit *u) {
    hs_error e;
    hs_error_clear(&e);
    if (u->fusion && hs_fsdp_fusion_reduce_wait(u->fusion, &e) != HS_OK) hs_fsdp_ctx_fail(ctx, &e);
    for (int i = 0; i < u->n_params; i++)
        if (hs_fsdp_param_reduce_wait(u->params[i], &e) != HS_OK) hs_fsdp_ctx_fail(ctx, &e);
}

/* The HSDP all-reduces run on the reduce-scatter stream, after the
 * reduce-scatters that filled their slots; the compute stream wrote the
 * slots of parameters that need none (hs_fsdp_param_reduce_issue). */
static void launch_all_reduces(hs_fsdp_ctx *ctx, hs_fsdp_unit *u) {
    hs_stream *rs = hs_fsdp_mem_rs(&ctx->mem);
    hs_fsdp_mem_tie(&ctx->mem, ctx->mem.dev->stream, rs);
    /* Stable group order, identical on every rank (comm.h ordering rule). */
    for (int g = 0; g < u->n_groups; g++) {
        hs_fsdp_reduce_group *grp = &u->groups[g];
        if (!grp->pg) continue;
        HS_ASSERT(grp->ar_work == NULL);
        grp->ar_work =
            hs_pg_all_reduce_async(grp->pg, rs, grp->buf, grp->numel, grp->dtype, grp->op);
    }
}

void hs_fsdp_ctx_reduce_unit(hs_fsdp_ctx *ctx, int ui) {
    hs_fsdp_unit *u = &ctx->units[ui];
    hs_fsdp_unit *prev = ctx->prev_unit >= 0 ? &ctx->units[ctx->prev_unit] : NULL;
    if (prev) wait_reduce_scatters(ctx, prev);
    hs_error e;
    hs_error_clear(&e);
    if (u->fusion && hs_fsdp_fusion_reduce_issue(u->fusion, ctx->grad_prescale, &e) != HS_OK)
        hs_fsdp_ctx_fail(ctx, &e);
    for (int i = 0; i < u->n_params; i++)
        if (!u->params[i]->fused && !u->params[i]->p->frozen &&
            hs_fsdp_param_reduce_issue(u->params[i], ctx->grad_prescale, &e) != HS_OK)
            hs_fsdp_ctx_fail(ctx, &e);
    if (prev) launch_all_reduces(ctx, prev);
    ctx->prev_unit = ui;
    HS_ASSERT(ctx->n_reduced < ctx->n_units);
    ctx->reduced[ctx->n_reduced++] = ui;
}

bool hs_fsdp_ctx_pending(const hs_fsdp_ctx *ctx) { return ctx->n_reduced > 0; }

/* RFC §6.2 steps 4-6: after every FSDP/HSDP/DP reduction of the step has
 * completed, each TP-Replicate parameter's reduced gradient (its reduce
 * slot, kept alive for this) is all-reduced over tp with the same AVG, no
 * second scaling, and only then added into the optimizer's gradient (and
 * offloaded). Units in reduction order, parameters in unit order: the
 * same sequence on every TP rank. A no-op without TP. */
static void tp_tail(hs_fsdp_ctx *ctx, hs_error *e) {
    /* On the reduce-scatter stream, like the reductions that filled the
     * slots; hs_fsdp_param_reduce_apply reads the result on the compute
     * stream. The compute stream wrote the slots of unsharded parameters. */
    hs_stream *rs = hs_fsdp_mem_rs(&ctx->mem);
    hs_fsdp_mem_tie(&ctx->mem, ctx->mem.dev->stream, rs);
    for (int k = 0; k < ctx->n_reduced; k++) {
        hs_fsdp_unit *u = &ctx->units[ctx->reduced[k]];
        for (int i = 0; i < u->n_params; i++) {
            hs_fsdp_param *fp = u->params[i];
            if (!fp->tp_all_reduce || fp->p->frozen) continue;
            hs_status st = hs_pg_all_reduce(fp->mi.tp_pg, rs, fp->reduce_slot, fp->reduce_numel,
                                            fp->reduce_dtype, hs_fsdp_param_tp_op(fp), e);
            if (st != HS_OK) hs_fsdp_ctx_fail(ctx, e);
            hs_fsdp_mem_tie(&ctx->mem, rs, ctx->mem.dev->stream);
            if (hs_fsdp_param_reduce_apply(fp, e) != HS_OK) hs_fsdp_ctx_fail(ctx, e);
        }
    }
}

void hs_fsdp_ctx_drain(hs_fsdp_ctx *ctx) {
    hs_error e;
    hs_error_clear(&e);
    if (ctx->prev_unit >= 0) {
        hs_fsdp_unit *prev = &ctx->units[ctx->prev_unit];
        wait_reduce_scatters(ctx, prev);
        launch_all_reduces(ctx, prev);
        ctx->prev_unit = -1;
    }
    for (int k = 0; k < ctx->n_reduced; k++) {
        hs_fsdp_unit *u = &ctx->units[ctx->reduced[k]];
        for (int g = 0; g < u->n_groups; g++) {
            hs_fsdp_reduce_group *grp = &u->groups[g];
            if (grp->ar_work) {
                hs_work *w = grp->ar_work;
                grp->ar_work = NULL;
                if (hs_fsdp_exposed_wait(&ctx->exposed, HS_FSDP_WAIT_ALL_REDUCE, w, &e) != HS_OK)
                    hs_fsdp_ctx_fail(ctx, &e);
            }
        }
        /* the compute stream applies what the all-reduces produced */
        hs_fsdp_mem_tie(&ctx->mem, hs_fsdp_mem_rs(&ctx->mem), ctx->mem.dev->stream);
        for (int i = 0; i < u->n_params; i++)
            if (!u->params[i]->tp_all_reduce && !u->params[i]->p->frozen &&
                hs_fsdp_param_reduce_apply(u->params[i], &e) != HS_OK)
                hs_fsdp_ctx_fail(ctx, &e);
    }
    tp_tail(ctx, &e);
    ctx->n_reduced = 0;
    /* A parameter no reduction reached this step (not used in the forward)
     * reads as zeros, as after zero_grads. */
    for (int i = 0; i < ctx->n_params; i++) hs_fsdp_param_settle_sharded_grad(&ctx->params[i]);
}
