/* The hook state machine of RFC 000 §3.3–§3.5, driven by the model's
 * explicit calls. */
#include <stdio.h>

#include "fsdp/context.h"
#include "fsdp/prefetch.h"
#include "fsdp/policy.h"

static void transition(hs_fsdp_ctx *ctx, hs_fsdp_unit *u, const char *event,
                       hs_fsdp_unit_state to) {
    hs_fsdp_unit_state from = u->state;
    u->state = to;
    if (ctx->log)
        hs_log_debug(ctx->log, "fsdp unit %d%s%s: %s: %s -> %s", u->index, u->name[0] ? " " : "",
                     u->name, event, hs_fsdp_unit_state_name(from), hs_fsdp_unit_state_name(to));
    if (ctx->on_transition) ctx->on_transition(ctx->transition_arg, u->index, event, from, to);
}

static hs_fsdp_unit *unit_at(hs_fsdp_ctx *ctx, int ui) {
    if (ui < 0 || ui >= ctx->n_units) hs_panic("fsdp hook for unit %d of %d", ui, ctx->n_units);
    return &ctx->units[ui];
}

static _Noreturn void bad_order(const hs_fsdp_unit *u, const char *event) {
    hs_panic("fsdp unit %d (%s): hook %s called in state %s; the model must call pre/post "
             "forward and backward in order",
             u->index, u->name[0] ? u->name : "root", event, hs_fsdp_unit_state_name(u->state));
}

/* Issue u's all-gathers, then the prefetched units' behind them on the
 * comm thread (so they run while u computes), then wait for u's. */
static void unshard_or_fail(hs_fsdp_ctx *ctx, hs_fsdp_unit *u,
                            void (*prefetch)(hs_fsdp_ctx *, const hs_fsdp_unit *)) {
    hs_error e;
    hs_error_clear(&e);
    if (hs_fsdp_unit_unshard_issue(u, &e) != HS_OK) hs_fsdp_ctx_fail(ctx, &e);
    prefetch(ctx, u);
    if (hs_fsdp_unit_unshard_wait(u, &e) != HS_OK) hs_fsdp_ctx_fail(ctx, &e);
}

static void reshard_keep(hs_fsdp_ctx *ctx, hs_fsdp_unit *u) {
    hs_error e;
    hs_error_clear(&e);
    if (hs_fsdp_unit_reshard_keep(u, &e) != HS_OK) hs_fsdp_ctx_fail(ctx, &e);
}

void hs_fsdp_hook_pre_forward(void *vctx, int ui) {
    hs_fsdp_ctx *ctx = vctx;
    hs_fsdp_unit *u = unit_at(ctx, ui);
    u->for_next = false; /* its all-gather, if in flight, is waited below */
    if (u->state == HS_FSDP_STATE_PRE_BACKWARD) {
        /* Recompute inside backward (non-reentrant checkpoint): the
         * parameters are already unsharded for backward. */
        transition(ctx, u, "forward_pre", HS_FSDP_STATE_PRE_BACKWARD);
        return;
    }
    if (u->state == HS_FSDP_STATE_PRE_FORWARD) bad_order(u, "forward_pre");
    unshard_or_fail(ctx, u, hs_fsdp_prefetch_forward);
    transition(ctx, u, "forward_pre", HS_FSDP_STATE_PRE_FORWARD);
}

void hs_fsdp_hook_post_forward(void *vctx, int ui) {
    hs_fsdp_ctx *ctx = vctx;
    hs_fsdp_unit *u = unit_at(ctx, ui);
    if (u->state == HS_FSDP_STATE_PRE_BACKWARD) {
        /* The recompute's forward post must not reshard what backward is
         * about to read. */
        transition(ctx, u, "forward", HS_FSDP_STATE_PRE_BACKWARD);
        return;
    }
    if (u->state != HS_FSDP_STATE_PRE_FORWARD) bad_order(u, "forward");
    u->fwd_outstanding++;
    if (u->reshard_after_forward) reshard_keep(ctx, u);
    transition(ctx, u, "forward", HS_FSDP_STATE_FORWARD);
}

void hs_fsdp_hook_pre_backward(void *vctx, int ui) {
    hs_fsdp_ctx *ctx = vctx;
    hs_fsdp_unit *u = unit_at(ctx, ui);
    u->for_next = false;
    if (u->state == HS_FSDP_STATE_PRE_BACKWARD) return; /* several output grads */
    /* After a backward, another one only for a forward still outstanding
     * (micro-batches in flight in a pipeline schedule). */
    bool in_flight = u->state == HS_FSDP_STATE_BACKWARD && u->fwd_outstanding > 0;
    if (u->state != HS_FSDP_STATE_FORWARD && !in_flight) bad_order(u, "backward_pre");
    unshard_or_fail(ctx, u, hs_fsdp_prefetch_backward);
    hs_error e;
    hs_error_clear(&e);
    for (int i = 0; i < u->n_params; i++)
        if (hs_fsdp_param_grad_begin(u->params[i], &e) != HS_OK) hs_fsdp_ctx_fail(ctx, &e);
    transition(ctx, u, "backward_pre", HS_FSDP_STATE_PRE_BACKWARD);
}

/* Without a reduction, each micro-batch's gradient goes into the fp32
 * accumulator where mixed precision keeps one (hs_fsdp_mp_grad_stash). */
static void stash_grads(hs_fsdp_ctx *ctx, hs_fsdp_unit *u) {
    hs_error e;
    hs_error_clear(&e);
    for (int i = 0; i < u->n_params; i++)
        if (!u->params[i]->p->frozen && hs_fsdp_mp_grad_stash(u->params[i], &e) != HS_OK)
            hs_fsdp_ctx_fail(ctx, &e);
}

void hs_fsdp_hook_post_backward(void *vctx, int ui) {
    hs_fsdp_ctx *ctx = vctx;
    hs_fsdp_unit *u = unit_at(ctx, ui);
    if (u->state == HS_FSDP_STATE_BACKWARD) return; /* already run by the root */
    if (u->state != HS_FSDP_STATE_PRE_BACKWARD) bad_order(u, "backward");
    if (u->fwd_outstanding > 0) u->fwd_outstanding--;
    /* Weight gradients still to come: the reduction (if this backward
     * syncs) waits for them (hs_fsdp_hook_post_weight_grad). */
    if (u->wgrad_pending > 0) u->wgrad_sync |= ctx->sync;
    if (ctx->sync && u->wgrad_pending == 0) hs_fsdp_ctx_reduce_unit(ctx, ui);
    else stash_grads(ctx, u);
    /* Without sync the unsharded gradients stay alive and keep
     * accumulating until the micro-batch that syncs. The weight pass
     * needs no parameter: it multiplies kept gradients and inputs. */
    /* A forward whose backward is still to come (pipeline micro-batches)
     * keeps its secondary pieces, as after that forward. */
    if (ctx->reshard && u->fwd_outstanding > 0 && u->reshard_after_forward) reshard_keep(ctx, u);
    else if (ctx->reshard) hs_fsdp_unit_reshard(u);
    transition(ctx, u, "backward", HS_FSDP_STATE_BACKWARD);
}

void hs_fsdp_hook_weight_grad_deferred(void *vctx, int ui) {
    hs_fsdp_ctx *ctx = vctx;
    hs_fsdp_unit *u = unit_at(ctx, ui);
    if (u->state != HS_FSDP_STATE_PRE_BACKWARD) bad_order(u, "weight_grad_deferred");
    u->wgrad_pending++;
}

void hs_fsdp_hook_post_weight_grad(void *vctx, int ui) {
    hs_fsdp_ctx *ctx = vctx;
    hs_fsdp_unit *u = unit_at(ctx, ui);
    if (u->wgrad_pending < 1) bad_order(u, "post_weight_grad");
    if (--u->wgrad_pending == 0 && u->wgrad_sync) {
        u->wgrad_sync = false;
        hs_fsdp_ctx_reduce_unit(ctx, ui);
    } else {
        stash_grads(ctx, u);
    }
    if (ctx->log) hs_log_debug(ctx->log, "fsdp unit %d: weight gradients in", u->index);
}

void hs_fsdp_hook_post_backward_final(void *vctx) {
    hs_fsdp_ctx *ctx = vctx;
    hs_fsdp_unit *root = &ctx->units[0];
    transition(ctx, root, "root_backward_enter", root->state);
    /* Units whose post_backward never came (no differentiable input):
     * reverse declaration order is the backward order on every rank. */
    for (int ui = ctx->n_units - 1; ui >= 0; ui--)
        if (ctx->units[ui].state == HS_FSDP_STATE_PRE_BACKWARD) hs_fsdp_hook_post_backward(ctx, ui);
    /* Unconditional: BACKWARD only means post_backward ran, not that its
     * collectives finished. */
    hs_fsdp_ctx_drain(ctx);
    hs_fsdp_prefetch_settle(ctx);
    transition(ctx, root, "root_backward_exit", root->state);
}
