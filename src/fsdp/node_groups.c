/* The groups FSDP builds inside its shard groups, beyond the mesh's: hpZ's
 * secondary groups (fsdp_config.secondary_shard_size) and grad_reduce's
 * two levels, from where the ranks are (hs_comm_node_of). Every split is
 * collective over the world whenever its key is set, so every rank takes
 * part, with colour -1 where it joins no group. */
#include <stdlib.h>

#include "fsdp/manager.h"

/* hpZ's group inside `shard` (size w, this rank `rank`): shard ranks
 * [k*s, (k+1)*s). A degree s does not divide joins no group. */
static hs_status secondary_group(hs_comm *comm, const char *name, hs_pg *shard, int w, int rank,
                                 int s, hs_pg **out, int *size, int *srank, hs_error *e) {
    *out = NULL, *size = 1, *srank = 0;
    bool on = shard && s > 1 && w > s && w % s == 0;
    int colour = on ? hs_pg_world_rank(shard, 0) * w + rank / s : -1;
    hs_status st = hs_comm_split(comm, name, colour, rank, out, e);
    if (st == HS_OK && *out) *size = hs_pg_size(*out), *srank = hs_pg_rank(*out);
    return st;
}

/* The nodes of `shard`'s w members: node index (in order of first
 * appearance) and index among that node's members, of each; the node
 * count, or 0 when they do not hold the same number of members each. */
static int node_layout(hs_comm *comm, hs_pg *shard, int w, int *node_ix, int *local_ix) {
    int n = 0;
    for (int j = 0; j < w; j++) {
        int node = hs_comm_node_of(comm, hs_pg_world_rank(shard, j));
        node_ix[j] = -1, local_ix[j] = 0;
        for (int k = 0; k < j; k++) {
            if (hs_comm_node_of(comm, hs_pg_world_rank(shard, k)) != node) continue;
            node_ix[j] = node_ix[k];
            local_ix[j]++;
        }
        if (node_ix[j] < 0) node_ix[j] = n++;
    }
    for (int j = 0; j < w; j++)
        if (local_ix[j] >= w / n || w % n) return 0;
    return n;
}

/* grad_reduce's two levels over `shard` (hs_fsdp_levels): where its ranks
 * lie on N > 1 nodes, L > 1 on each. Else one level (lv->node NULL). */
static hs_status level_groups(hs_comm *comm, const char *node_name, const char *cross_name,
                              hs_pg *shard, int w, int rank, hs_fsdp_levels *lv, hs_error *e) {
    *lv = (hs_fsdp_levels){0};
    int *node_ix = shard ? calloc((size_t)w * 2, sizeof(int)) : NULL;
    if (shard && !node_ix)
        return hs_error_oom(e, "fsdp: the nodes of a shard group of %d ranks", w);
    int *local_ix = node_ix ? node_ix + w : NULL;
    int n = shard ? node_layout(comm, shard, w, node_ix, local_ix) : 0;
    bool on = n > 1 && w / n > 1;
    if (on && !(lv->dest = calloc((size_t)w, sizeof(int)))) {
        free(node_ix);
        return hs_error_oom(e, "fsdp: the chunk owners of a shard group of %d ranks", w);
    }
    if (on) {
        lv->N = n, lv->L = w / n;
        /* node rank l's chunks, in cross-rank (shard rank) order */
        int *next = calloc((size_t)lv->L, sizeof(int));
        if (!next) {
            free(node_ix), free(lv->dest), lv->dest = NULL;
            return hs_error_oom(e, "fsdp: %d counters", lv->L);
        }
        for (int j = 0; j < w; j++) lv->dest[local_ix[j] * n + next[local_ix[j]]++] = j;
        free(next);
    }
    int base = shard ? hs_pg_world_rank(shard, 0) * w : 0;
    hs_status st =
        hs_comm_split(comm, node_name, on ? base + node_ix[rank] : -1, rank, &lv->node, e);
    if (st == HS_OK)
        st = hs_comm_split(comm, cross_name, on ? base + local_ix[rank] : -1, rank, &lv->cross, e);
    free(node_ix);
    if (st != HS_OK || !on) {
        free(lv->dest);
        *lv = (hs_fsdp_levels){0};
    }
    return st;
}

hs_status hs_fsdp_node_groups(const hs_fsdp_config *fsdp, hs_comm *comm, hs_fsdp_dp_groups *g,
                              hs_error *e) {
    int s = fsdp->secondary_shard_size;
    hs_status st = HS_OK;
    if (s > 0)
        st = secondary_group(comm, "fsdp_shard_secondary", g->shard, g->shard_size, g->shard_rank,
                             s, &g->secondary, &g->secondary_size, &g->secondary_rank, e);
    if (s > 0 && st == HS_OK)
        st = secondary_group(comm, "edp_shard_secondary", g->edp_shard, g->edp_shard_size,
                             g->edp_shard_rank, s, &g->edp_secondary, &g->edp_secondary_size,
                             &g->edp_secondary_rank, e);
    if (hs_fsdp_config_grad_reduce(fsdp) == HS_QUANT_NONE || st != HS_OK) return st;
    st = level_groups(comm, "fsdp_shard_node", "fsdp_shard_cross", g->shard, g->shard_size,
                      g->shard_rank, &g->levels, e);
    if (st == HS_OK)
        st = level_groups(comm, "edp_shard_node", "edp_shard_cross", g->edp_shard,
                          g->edp_shard_size, g->edp_shard_rank, &g->edp_levels, e);
    if (st != HS_OK) hs_fsdp_node_groups_free(g);
    return st;
}

void hs_fsdp_node_groups_free(hs_fsdp_dp_groups *g) {
    free(g->levels.dest);
    free(g->edp_levels.dest);
    g->levels = g->edp_levels = (hs_fsdp_levels){0};
}
