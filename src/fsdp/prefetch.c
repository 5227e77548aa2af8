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

void hs_fsdp_prefetch_forward(hs_fsdp_ctx *ctx, const hs_fsdp_unit *u) {
    for (int k = 0; k < u->n_fwd_prefetch; k++) {
        hs_fsdp_unit *t = &ctx->units[u->fwd_prefetch[k]];
        /* A target inside its backward already holds what it needs. */
        if (t->state == HS_FSDP_STATE_PRE_BACKWARD || t->state == HS_FSDP_STATE_PRE_FORWARD)
            continue;
        issue_or_fail(ctx, t);
    }
}

void hs_fsdp_prefetch_backward(hs_fsdp_ctx *ctx, const hs_fsdp_unit *u) {
    for (int k = 0; k < u->n_bwd_prefetch; k++) {
        hs_fsdp_unit *t = &ctx->units[u->bwd_prefetch[k]];
        if (t->state == HS_FSDP_STATE_FORWARD) issue_or_fail(ctx, t);
    }
}

void hs_fsdp_prefetch_settle(hs_fsdp_ctx *ctx) {
    if (!ctx->units) return;
    for (int ui = 0; ui < ctx->n_units; ui++) {
        hs_fsdp_unit *u = &ctx->units[ui];
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
