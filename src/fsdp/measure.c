/* What a benchmark measures FSDP with on its own (bench fsdp): a wrap over
 * one process group without a mesh, each unit's all-gathered size, and the
 * exposed communication time (fsdp/exposed.h). */
#include "fsdp/manager.h"

hs_status hs_fsdp_wrap_group(const hs_fsdp_config *fsdp, bool fp32_main_params, hs_pg *shard,
                             hs_comm *comm, hs_device *dev, hs_model *model, uint64_t seed,
                             const hs_log *log, hs_fsdp **out, hs_error *e) {
    int w = hs_pg_size(shard), r = hs_pg_rank(shard);
    hs_fsdp_dp_groups g = {.shard = shard,
                           .shard_size = w,
                           .shard_rank = r,
                           .replicate_size = 1,
                           .flat = shard,
                           .flat_size = w,
                           .flat_rank = r};
    return hs_fsdp_wrap_groups(fsdp, fp32_main_params, &g, comm, dev, model, seed, log, out, e);
}

int64_t hs_fsdp_unit_gathered_numel(const hs_fsdp *f, int unit) {
    const hs_fsdp_unit *un = &f->ctx.units[unit];
    int64_t n = 0;
    for (int i = 0; i < un->n_params; i++)
        if (un->params[i]->needs_all_gather) n += un->params[i]->plan.unpacked_numel;
    return n;
}

void hs_fsdp_get_exposed(const hs_fsdp *f, hs_fsdp_exposed_stats *out) {
    const hs_fsdp_exposed *x = &f->ctx.exposed;
    *out = (hs_fsdp_exposed_stats){
        .all_gather = x->seconds[HS_FSDP_WAIT_ALL_GATHER],
        .reduce_scatter = x->seconds[HS_FSDP_WAIT_REDUCE_SCATTER],
        .all_reduce = x->seconds[HS_FSDP_WAIT_ALL_REDUCE],
        .total = hs_fsdp_exposed_total(x),
    };
}

void hs_fsdp_reset_exposed(hs_fsdp *f) {
    f->ctx.exposed = (hs_fsdp_exposed){.dev = f->ctx.exposed.dev};
}
