/* FSDP's events of one micro-batch in the order the hooks run them
 * (fsdp/hooks.c, prefetch.c, context.c), for the plan's two replays: the
 * memory one (plan.c) and the time one (plan_time.c). Unit 0 is the root
 * (the embedding in forward, the head at the end of forward and first in
 * backward), units 1 .. n-1 the blocks. */
#ifndef HS_TRAIN_PLAN_EVENTS_H
#define HS_TRAIN_PLAN_EVENTS_H

#include <stdbool.h>

#include "hypershard/config.h"

typedef enum plan_ev {
    PLAN_ISSUE,        /* unshard: the all-gather is issued (nothing if unsharded)     */
    PLAN_WAIT,         /* the unit waits for its all-gather                            */
    PLAN_COMPUTE,      /* the unit's forward or backward (root: embedding / head's bwd) */
    PLAN_HEAD,         /* forward's end: the head and the loss                         */
    PLAN_RESHARD,      /* the unsharded parameters are freed                          */
    PLAN_RESHARD_KEEP, /* the same after a forward, each rank keeping its secondary
                        * piece for the backward (secondary_shard_size, hpZ)  */
    PLAN_GRAD,         /* the unit's unsharded gradients come to be                    */
    PLAN_REDUCE,       /* its reduce-scatter / all-reduce are issued                  */
    PLAN_STASH,        /* a no-sync micro-batch accumulates instead                    */
    PLAN_DRAIN         /* the step's last reductions are waited for                   */
} plan_ev;

typedef void (*plan_ev_fn)(void *ctx, plan_ev ev, int unit);

/* Forward over n units, then backward, with the config's prefetch depths
 * and reshard_after_forward; `sync`: the micro-batch reduces;
 * `reshard_bwd`: reshard after backward. */
void plan_walk_forward(const hs_fsdp_config *f, int n, plan_ev_fn on, void *ctx);
void plan_walk_backward(const hs_fsdp_config *f, int n, bool sync, bool reshard_bwd, plan_ev_fn on,
                        void *ctx);

#endif
