/* fsdp/manager.h — the wrapped model (struct hs_fsdp) as the manager
 * builds it; shared by the manager and the trainer-facing accessors. */
#ifndef HS_FSDP_MANAGER_H
#define HS_FSDP_MANAGER_H

#include "fsdp/context.h"
#include "hypershard/fsdp.h"

/* The data-parallel groups of this rank, picked from the mesh. A group
 * pointer is NULL when its size is 1. */
typedef struct hs_fsdp_dp_groups {
    int shard_size, shard_rank, replicate_size, replicate_rank, flat_size, flat_rank;
    int tp_size, tp_rank;
    hs_pg *shard, *replicate, *flat, *tp;
    /* fsdp_moe_mesh, for routed experts under expert parallelism (ep_size
     * > 1; else unused) */
    int edp_shard_size, edp_shard_rank, edp_replicate_size, edp_replicate_rank, edp_size;
    int ep_size, ep_rank;
    hs_pg *edp_shard, *edp_replicate, *ep;
    /* fsdp_config.secondary_shard_size: consecutive ranks of shard (and of
     * edp_shard) that hold a parameter between its forward and its
     * backward; NULL (size 1) when off or the degree does not divide. */
    int secondary_size, secondary_rank, edp_secondary_size, edp_secondary_rank;
    hs_pg *secondary, *edp_secondary;
    /* fsdp_config.grad_reduce's two levels over shard and edp_shard */
    hs_fsdp_levels levels, edp_levels;
} hs_fsdp_dp_groups;

struct hs_fsdp {
    hs_fsdp_ctx ctx;
    hs_model *model;
    hs_fsdp_dp_groups groups;
    bool owns_node_groups; /* groups' two-level tables (hs_fsdp_wrap's) */
    hs_optim_param *optim; /* one per managed parameter */
    int blocks_wrapped;
    int64_t total_param_bytes;
};

/* The groups inside the shard groups (node_groups.c): hpZ's secondary
 * groups where fsdp->secondary_shard_size is set, grad_reduce's two levels
 * where grad_reduce is; collective over the world. On failure nothing is
 * left to free. */
hs_status hs_fsdp_node_groups(const hs_fsdp_config *fsdp, hs_comm *comm, hs_fsdp_dp_groups *g,
                              hs_error *e);
void hs_fsdp_node_groups_free(hs_fsdp_dp_groups *g);

/* The context, for tests and debugging views. */
hs_fsdp_ctx *hs_fsdp_context(hs_fsdp *f);

/* hs_fsdp_wrap after the groups are chosen: also what single-process tests
 * use, with every size 1 (no collective is ever issued then). `fsdp` and
 * `fp32_main_params` as for hs_fsdp_wrap. */
hs_status hs_fsdp_wrap_groups(const hs_fsdp_config *fsdp, bool fp32_main_params,
                              const hs_fsdp_dp_groups *g, hs_comm *comm, hs_device *dev,
                              hs_model *model, uint64_t seed, const hs_log *log, hs_fsdp **out,
                              hs_error *e);

#endif
