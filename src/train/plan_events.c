/* FSDP's hook order of one micro-batch (plan_events.h). */
#include "train/plan_events.h"

void plan_walk_forward(const hs_fsdp_config *f, int n, plan_ev_fn on, void *ctx) {
    for (int k = 0; k < n; k++) {
        on(ctx, PLAN_ISSUE, k);
        for (int j = 1; j <= f->forward_prefetch_depth && k + j < n; j++)
            on(ctx, PLAN_ISSUE, k + j);
        on(ctx, PLAN_WAIT, k);
        on(ctx, PLAN_COMPUTE, k);
        if (k > 0 && f->reshard_after_forward)
            on(ctx, f->secondary_shard_size > 0 ? PLAN_RESHARD_KEEP : PLAN_RESHARD, k);
    }
    on(ctx, PLAN_HEAD, 0);
}

/* The root's head first, then the blocks last to first; the root's own
 * reduction comes at the end. */
void plan_walk_backward(const hs_fsdp_config *f, int n, bool sync, bool reshard_bwd, plan_ev_fn on,
                        void *ctx) {
    for (int pos = 0; pos < n; pos++) {
        int k = pos == 0 ? 0 : n - pos;
        on(ctx, PLAN_ISSUE, k);
        for (int j = 1; j <= f->backward_prefetch_depth && pos + j < n; j++)
            on(ctx, PLAN_ISSUE, n - pos - j);
        on(ctx, PLAN_WAIT, k);
        on(ctx, PLAN_GRAD, k);
        on(ctx, PLAN_COMPUTE, k);
        if (k == 0) continue;
        on(ctx, sync ? PLAN_REDUCE : PLAN_STASH, k);
        if (reshard_bwd) on(ctx, PLAN_RESHARD, k);
    }
    on(ctx, sync ? PLAN_REDUCE : PLAN_STASH, 0);
    if (sync) on(ctx, PLAN_DRAIN, 0);
    if (reshard_bwd) on(ctx, PLAN_RESHARD, 0);
    for (int k = 0; k < n; k++) on(ctx, PLAN_WAIT, k);
}
