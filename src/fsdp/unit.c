/* A unit's parameters, reduction groups and unshard/reshard. */
#include "fsdp/unit.h"

#include <stdlib.h>
#include <string.h>

#include "fsdp/fusion.h"

static const char *const state_names[] = {"None", "PRE_FORWARD", "FORWARD", "PRE_BACKWARD",
                                          "BACKWARD"};
_Static_assert(sizeof state_names / sizeof state_names[0] == HS_FSDP_STATE_COUNT,
               "state names follow the enum");

const char *hs_fsdp_unit_state_name(hs_fsdp_unit_state s) {
    return (unsigned)s < HS_FSDP_STATE_COUNT ? state_names[s] : "?";
}

static int group_of(hs_fsdp_unit *u, hs_pg *pg, hs_dtype dt) {
    for (int g = 0; g < u->n_groups; g++)
        if (u->groups[g].pg == pg && u->groups[g].dtype == dt) return g;
    return -1;
}

static const char *unit_name(const hs_fsdp_unit *u) { return u->name[0] ? u->name : "the root"; }

hs_status hs_fsdp_unit_build_groups(hs_fsdp_unit *u, hs_fsdp_mem *mem, hs_error *e) {
    size_t n = (size_t)(u->n_params ? u->n_params : 1);
    u->groups = calloc(n, sizeof *u->groups);
    if (!u->groups)
        return hs_error_oom(e, "fsdp unit %s: the reduce groups of %d parameters: %zu bytes",
                            unit_name(u), u->n_params, n * sizeof *u->groups);
    u->n_groups = 0;
    for (int i = 0; i < u->n_params; i++) {
        hs_fsdp_param *fp = u->params[i];
        if (fp->p->frozen) continue; /* no gradient, no reduce slot */
        fp->reduce_numel = fp->needs_all_gather ? fp->plan.padded_sharded_numel
                                                : fp->plan.unpacked_numel;
        hs_pg *pg = fp->mi.replicate_size > 1 ? fp->mi.replicate_pg : NULL;
        int g = group_of(u, pg, fp->reduce_dtype);
        if (g < 0) {
            g = u->n_groups++;
            u->groups[g].pg = pg;
            u->groups[g].op = HS_REDUCE_AVG;
            u->groups[g].dtype = fp->reduce_dtype;
            u->groups[g].params = calloc((size_t)u->n_params, sizeof(hs_fsdp_param *));
            if (!u->groups[g].params)
                return hs_error_oom(e, "fsdp unit %s: a reduce group of %d parameters: %zu bytes",
                                    unit_name(u), u->n_params,
                                    (size_t)u->n_params * sizeof(hs_fsdp_param *));
        }
        hs_fsdp_reduce_group *grp = &u->groups[g];
        grp->params[grp->n_params++] = fp;
        grp->numel += fp->reduce_numel;
    }
    for (int g = 0; g < u->n_groups; g++) {
        hs_fsdp_reduce_group *grp = &u->groups[g];
        size_t es = hs_dtype_size(grp->dtype);
        grp->buf = hs_fsdp_mem_alloc(mem, HS_FSDP_MEM_GRAD, (size_t)grp->numel * es,
                                     "the reduce buffer", unit_name(u), e);
        if (!grp->buf) return HS_ERR_OOM;
        int64_t off = 0;
        for (int i = 0; i < grp->n_params; i++) {
            grp->params[i]->reduce_slot = (char *)grp->buf + (size_t)off * es;
            off += grp->params[i]->reduce_numel;
        }
    }
    return HS_OK;
}

void hs_fsdp_unit_free(hs_fsdp_unit *u, hs_fsdp_mem *mem) {
    hs_fsdp_fusion_free(u);
    for (int g = 0; g < u->n_groups; g++) {
        HS_ASSERT(u->groups[g].ar_work == NULL);
        hs_fsdp_mem_free(mem, HS_FSDP_MEM_GRAD, u->groups[g].buf,
                         (size_t)u->groups[g].numel * hs_dtype_size(u->groups[g].dtype));
        free(u->groups[g].params);
    }
    free(u->groups);
    free(u->params);
    free(u->fwd_prefetch);
    free(u->bwd_prefetch);
    *u = (hs_fsdp_unit){0};
}

hs_status hs_fsdp_unit_unshard_issue(hs_fsdp_unit *u, hs_error *e) {
    /* The fused all-gather marks its parameters in flight, so the
     * per-parameter issue below skips them. */
    hs_status st = u->fusion ? hs_fsdp_fusion_unshard_issue(u->fusion, e) : HS_OK;
    for (int i = 0; i < u->n_params && st == HS_OK; i++)
        st = hs_fsdp_param_unshard_issue(u->params[i], e);
    return st;
}

hs_status hs_fsdp_unit_unshard(hs_fsdp_unit *u, hs_error *e) {
    hs_status st = hs_fsdp_unit_unshard_issue(u, e);
    return st != HS_OK ? st : hs_fsdp_unit_unshard_wait(u, e);
}

hs_status hs_fsdp_unit_unshard_wait(hs_fsdp_unit *u, hs_error *e) {
    hs_status first = u->fusion ? hs_fsdp_fusion_unshard_wait(u->fusion, e) : HS_OK;
    for (int i = 0; i < u->n_params; i++) {
        hs_status st = hs_fsdp_param_unshard_wait(u->params[i], e);
        if (st != HS_OK && first == HS_OK) first = st;
    }
    return first;
}

void hs_fsdp_unit_reshard(hs_fsdp_unit *u) {
    if (u->fusion) hs_fsdp_fusion_reshard(u->fusion);
    for (int i = 0; i < u->n_params; i++) hs_fsdp_param_reshard(u->params[i]);
}

hs_status hs_fsdp_unit_reshard_keep(hs_fsdp_unit *u, hs_error *e) {
    hs_status st = u->fusion ? hs_fsdp_fusion_reshard_keep(u->fusion, e) : HS_OK;
    for (int i = 0; i < u->n_params && st == HS_OK; i++)
        st = hs_fsdp_param_reshard_keep(u->params[i], e);
    return st;
}

bool hs_fsdp_unit_is_unsharded(const hs_fsdp_unit *u) {
    for (int i = 0; i < u->n_params; i++)
        if (u->params[i]->state != HS_FSDP_UNSHARDED) return false;
    return true;
}
