/* fsdp/unit.h — one FSDP unit (a transformer block, an expert group, or the
 * root): its parameters, its hook state and its reduction groups.
 *
 * States follow RFC 000 §3.2: NONE -> PRE_FORWARD (forward pre: unsharded)
 * -> FORWARD (forward post: resharded if reshard_after_forward) ->
 * PRE_BACKWARD (backward pre: unsharded again) -> BACKWARD (post_backward
 * issued; its reductions may still be in flight). */
#ifndef HS_FSDP_UNIT_H
#define HS_FSDP_UNIT_H

#include <stdbool.h>

#include "fsdp/param.h"

typedef enum hs_fsdp_unit_state {
    HS_FSDP_STATE_NONE = 0,
    HS_FSDP_STATE_PRE_FORWARD,
    HS_FSDP_STATE_FORWARD,
    HS_FSDP_STATE_PRE_BACKWARD,
    HS_FSDP_STATE_BACKWARD,
    HS_FSDP_STATE_COUNT
} hs_fsdp_unit_state;

/* "None", "PRE_FORWARD", ... as the RFC's logs print them. */
const char *hs_fsdp_unit_state_name(hs_fsdp_unit_state s);

/* Gradients of a unit that are all-reduced together: one group per
 * (all-reduce group, op, dtype). The buffer holds every member's reduce slot
 * back to back, so the reduce-scatter outputs land in it directly and the
 * all-reduce runs once over the whole buffer, in place. pg == NULL: the
 * members need no all-reduce (pure FSDP). */
typedef struct hs_fsdp_reduce_group {
    hs_pg *pg;
    hs_reduce_op op;
    hs_dtype dtype;
    void *buf; /* numel elements of dtype */
    int64_t numel;
    hs_fsdp_param **params;
    int n_params;
    hs_work *ar_work;
} hs_fsdp_reduce_group;

typedef struct hs_fsdp_unit {
    int index;
    char name[HS_FQN_MAX];
    bool is_root, is_expert;
    hs_fsdp_param **params;
    int n_params;
    hs_fsdp_unit_state state;
    /* Forwards of this step whose backward has not run yet: a pipeline
     * schedule runs several micro-batches' forwards before their
     * backwards, so backward may follow backward while this is > 0. */
    int fwd_outstanding;
    /* Split backward (zero-bubble pipelines): backwards whose weight
     * gradients are still to come (weight_grad_deferred .. post_weight_grad),
     * and whether one of them was to sync: the unit reduces after the
     * weight pass that brings this to 0. */
    int wgrad_pending;
    bool wgrad_sync;
    int chunk;     /* hs_unit_desc.chunk */
    bool for_next; /* gathered for the pipeline's next action (prefetch.h) */
    bool reshard_after_forward;
    /* Units to all-gather ahead within the unit's chunk (forward: the next
     * forward_prefetch_depth units of its pass; backward: likewise in the
     * backward order). */
    int *fwd_prefetch, n_fwd_prefetch;
    int *bwd_prefetch, n_bwd_prefetch;
    hs_fsdp_reduce_group *groups;
    int n_groups;
    /* comm_fusion: one all-gather / reduce-scatter for all sharded
     * parameters (fsdp/fusion.h); NULL when off or nothing is sharded. */
    struct hs_fsdp_fusion *fusion;
} hs_fsdp_unit;

/* Group the unit's parameters by all-reduce group (first-seen order, the
 * same on every rank) and allocate each group's buffer. */
hs_status hs_fsdp_unit_build_groups(hs_fsdp_unit *u, hs_fsdp_mem *mem, hs_error *e);
void hs_fsdp_unit_free(hs_fsdp_unit *u, hs_fsdp_mem *mem);

/* Issue every parameter's all-gather, then wait for all of them. */
hs_status hs_fsdp_unit_unshard(hs_fsdp_unit *u, hs_error *e);
/* The two halves, for prefetch: issue is a no-op for what is in flight or
 * unsharded; wait installs the views. */
hs_status hs_fsdp_unit_unshard_issue(hs_fsdp_unit *u, hs_error *e);
hs_status hs_fsdp_unit_unshard_wait(hs_fsdp_unit *u, hs_error *e);
void hs_fsdp_unit_reshard(hs_fsdp_unit *u);
/* Reshard where a backward of this unit is still to come: its parameters
 * keep their secondary pieces (hpZ, hs_fsdp_param_reshard_keep). */
hs_status hs_fsdp_unit_reshard_keep(hs_fsdp_unit *u, hs_error *e);
bool hs_fsdp_unit_is_unsharded(const hs_fsdp_unit *u);

#endif
