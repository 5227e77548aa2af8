/* Forward and backward prefetch of unit all-gathers. */
#include "fsdp/prefetch.h"

static bool in_flight(const hs_fsdp_unit *u) {
    for (int i = 0; i < u->n_params; i++)
        if (u->params[i]->state == HS_FSDP_UNSHARDING) return true;
    return false;
}

static void issue_or_fail(hs_fsdp_ctx *ctx, hs_fsdp_unit *t) {
    hs_error e;
    hs_error_clear(&e);
    if (hs_fsdp_unit_unshard_issue(t, &e) != HS_OK) hs_fsdp_ctx_fail(ctx, &e);
}

/* Whether a pass in that direction would gather t: a forward not inside
 * its own hooks, a backward whose forward resharded. */
static bool wanted(const hs_fsdp_unit *t, bool backward) {
    if (backward) return t->state == HS_FSDP_STATE_FORWARD;
    return t->state != HS_FSDP_STATE_PRE_BACKWARD && t->state != HS_FSDP_STATE_PRE_FORWARD;
}

/* A unit listing fewer targets than the depth is among the last of its
 * chunk's pass: the rest of its reach goes to the first blocks of the
 * pipeline's next action, its root (held from forward to backward) with
 * them but not counted (each unit's first target is its successor in its
 * chunk's pass, so the lists walk that pass). */
static void top_up(hs_fsdp_ctx *ctx, int listed, int depth) {
    if (ctx->next_chunk < 0 || listed >= depth) return;
    int c = ctx->next_chunk, reach = depth - listed;
    int t = c < HS_MODEL_MAX_CHUNKS ? ctx->chunk_first[ctx->next_backward][c] : -1;
    for (int k = 0; t >= 0 && k < reach;) {
        hs_fsdp_unit *x = &ctx->units[t];
        if (k >= ctx->next_issued && wanted(x, ctx->next_backward)) {
            x->for_next = true;
            issue_or_fail(ctx, x);
        }
        k += !x->is_root;
        int n = ctx->next_backward ? x->n_bwd_prefetch : x->n_fwd_prefetch;
        t = n > 0 ? (ctx->next_backward ? x->bwd_prefetch[0] : x->fwd_prefetch[0]) : -1;
    }
    if (reach > ctx->next_issued) ctx->next_issued = reach;
}

void hs_fsdp_prefetch_forward(hs_fsdp_ctx *ctx, const hs_fsdp_unit *u) {
    for (int k = 0; k < u->n_fwd_prefetch; k++) {
        hs_fsdp_unit *t = &ctx->units[u->fwd_prefetch[k]];
        /* A target inside its backward already holds what it needs. */
        if (wanted(t, false)) issue_or_fail(ctx, t);
    }
    top_up(ctx, u->n_fwd_prefetch, ctx->fwd_depth);
}

void hs_fsdp_prefetch_backward(hs_fsdp_ctx *ctx, const hs_fsdp_unit *u) {
    for (int k = 0; k < u->n_bwd_prefetch; k++) {
        hs_fsdp_unit *t = &ctx->units[u->bwd_prefetch[k]];
        if (wanted(t, true)) issue_or_fail(ctx, t);
    }
    top_up(ctx, u->n_bwd_prefetch, ctx->bwd_depth);
}

void hs_fsdp_prefetch_next(void *vctx, int chunk, bool backward) {
    hs_fsdp_ctx *ctx = vctx;
    ctx->next_chunk = chunk, ctx->next_backward = backward, ctx->next_issued = 0;
}

void hs_fsdp_prefetch_settle(hs_fsdp_ctx *ctx) {
    if (!ctx->units) return;
    for (int ui = 0; ui < ctx->n_units; ui++) {
        hs_fsdp_unit *u = &ctx->units[ui];
        /* gathered for the next action, which waits for it itself */
        if (u->for_next && ctx->next_chunk >= 0) continue;
        u->for_next = false;
        if (!in_flight(u)) continue;
        hs_error e;
        hs_error_clear(&e);
        if (hs_fsdp_unit_unshard_wait(u, &e) != HS_OK) hs_fsdp_ctx_fail(ctx, &e);
        /* Prefetched for a backward that never came: give the memory back
         * as that backward would have. */
        if (ctx->reshard && u->reshard_after_forward && u->state == HS_FSDP_STATE_FORWARD)
            hs_fsdp_unit_reshard(u);
    }
}
