/* fsdp/prefetch.h — all-gathers issued ahead of need (spec 004 §2.4,
 * §5.11). When unit i starts its forward, the all-gathers of its forward
 * targets (the next forward_prefetch_depth units of its chunk's pass) are
 * queued on the communication thread right behind its own, so they run
 * while unit i computes; backward does the same with the previous units.
 * Depth 0 gives no targets and prefetches nothing. Issue order is the same
 * on every rank (it follows the hooks), as the comm ordering rule asks.
 *
 * Memory: with reshard_after_forward, at most depth + 1 units besides the
 * root are unsharded at once (each all-gather output is allocated when it is
 * issued). */
#ifndef HS_FSDP_PREFETCH_H
#define HS_FSDP_PREFETCH_H

#include "fsdp/context.h"

/* Issue the all-gathers of u's forward targets that will still run their
 * forward (not those inside backward). */
/* A prefetch that cannot be issued (no memory) ends the run
 * (hs_fsdp_ctx_fail): it runs inside a hook. */
void hs_fsdp_prefetch_forward(hs_fsdp_ctx *ctx, const hs_fsdp_unit *u);
/* Issue the all-gathers of u's backward targets that have yet to run their
 * backward. */
void hs_fsdp_prefetch_backward(hs_fsdp_ctx *ctx, const hs_fsdp_unit *u);
/* The pipeline's next action (hs_model_hooks.next_chunk): local chunk
 * `chunk`'s forward or backward, -1 none. The units of the current pass
 * that list fewer targets than the depth (its last ones) reach into that
 * chunk's first units instead, as far as the depth goes; those are marked
 * for_next and left in flight by the settle below for that action's own
 * hooks to wait for. Without a pipeline no chunk is named and the lists
 * stay within the model's one chunk. */
void hs_fsdp_prefetch_next(void *ctx, int chunk, bool backward);
/* Wait every all-gather still in flight (a target whose hook never came,
 * e.g. a unit without gradient input) and reshard such units when the
 * micro-batch reshards. Ends every rank on a communication error. */
void hs_fsdp_prefetch_settle(hs_fsdp_ctx *ctx);

#endif
