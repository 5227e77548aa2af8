/* hypershard/mesh.h — the rank layout and the named meshes.
 *
 * Contract of this layer (spec 004 §2.1, §6; DESIGN.md §4):
 * - Ranks are ordered pp-major, then dp, cp, tp (tp fastest):
 *     world_rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i
 * - dp = world / (tp*cp*pp). The FSDP data-parallel domain of a stage is the
 *   dp*cp ranks with the same (pp_i, tp_i), flattened f = dp_i*cp + cp_i and
 *   split (fsdp_replicate, fsdp_shard) with shard fastest:
 *     fsdp_shard_i = f % dp_shard, fsdp_replicate_i = f / dp_shard,
 *     dp_replicate = (dp*cp) / dp_shard. CP never enlarges the shard degree.
 * - The expert domain of a stage is its dp*cp*tp ranks, flattened
 *   x = (dp_i*cp + cp_i)*tp + tp_i, split (edp, ep) with ep fastest:
 *     ep_i = x % ep, edp_i = x / ep; edp = dp*cp*tp / ep, and edp split
 *     (edp_replicate, edp_shard) with shard fastest.
 * - hs_topology is pure arithmetic (testable without MPI); hs_mesh owns one
 *   process group per dim, created once at hs_mesh_create and cached.
 */
#ifndef HYPERSHARD_MESH_H
#define HYPERSHARD_MESH_H

#include <stdbool.h>

#include "hypershard/base.h"
#include "hypershard/comm.h"

typedef struct hs_topology {
    /* given */
    int world, tp, cp, ep, pp, dp_shard, edp_shard;
    /* derived */
    int dp;            /* world / (tp*cp*pp)             */
    int fsdp_dp;       /* dp * cp                        */
    int dp_replicate;  /* fsdp_dp / dp_shard             */
    int expert_domain; /* dp * cp * tp                   */
    int edp;           /* expert_domain / ep             */
    int edp_replicate; /* edp / edp_shard                */
} hs_topology;

/* Derive and check spec 004 §4.1 rules 1, 2, 4, 5, 6, 7. Every violated
 * rule is appended to `e` (HS_ERR_CONFIG) with the config paths
 * (accelerator.tp_size, fsdp_config.dp_shard_size, ...), the values and the
 * valid choices; returns HS_ERR_CONFIG if any. */
hs_status hs_topology_derive(hs_topology *t, int world, int tp, int cp, int ep, int pp,
                             int dp_shard, int edp_shard, hs_error *e);

/* Whether FSDP2Manager is created, and a one-line reason either way
 * ("world size 1", "no FSDP domain: dp*cp = 1 and ...", "FSDP 2 x HSDP ..."). */
bool hs_topology_fsdp_active(const hs_topology *t, char *why, size_t cap);

typedef enum hs_mesh_dim {
    HS_DIM_PP = 0,
    HS_DIM_DP,
    HS_DIM_CP,
    HS_DIM_TP,
    HS_DIM_DP_CP,          /* flattened dp x cp (loss / batch averaging)   */
    HS_DIM_FSDP_REPLICATE, /* fsdp_non_moe_mesh dims                       */
    HS_DIM_FSDP_SHARD,
    HS_DIM_FSDP,          /* flattened replicate x shard (= DP_CP ranks)  */
    HS_DIM_EDP_REPLICATE, /* fsdp_moe_mesh dims                           */
    HS_DIM_EDP_SHARD,
    HS_DIM_EDP, /* flattened edp_replicate x edp_shard          */
    HS_DIM_EP,
    HS_DIM_COUNT
} hs_mesh_dim;

/* "pp", "dp", "cp", "tp", "dp_cp", "fsdp_replicate", "fsdp_shard", "fsdp",
 * "edp_replicate", "edp_shard", "edp", "ep". */
const char *hs_mesh_dim_name(hs_mesh_dim d);

typedef struct hs_coords {
    int pp, dp, cp, tp;
    int fsdp_replicate, fsdp_shard;
    int edp_replicate, edp_shard, ep;
} hs_coords;

hs_coords hs_topology_coords(const hs_topology *t, int world_rank);
/* The world ranks of the `dim` group that contains `world_rank`, in group
 * rank order; returns the count (out must hold t->world). */
int hs_topology_group_ranks(const hs_topology *t, hs_mesh_dim dim, int world_rank, int *out);
/* Every `dim` group's world ranks in one pass over the world (O(world), where
 * a hs_topology_group_ranks call per group would be O(world^2)):
 * out[index * size + rank in group] = world rank, size = t->world /
 * hs_topology_group_count (out must hold t->world). */
void hs_topology_groups(const hs_topology *t, hs_mesh_dim dim, int *out);
/* This rank's index within its `dim` group. */
int hs_topology_group_rank(const hs_topology *t, hs_mesh_dim dim, int world_rank);
/* Which of the `dim` groups holds `world_rank`: 0 .. hs_topology_group_count-1
 * (the colour hs_mesh_create splits with). */
int hs_topology_group_index(const hs_topology *t, hs_mesh_dim dim, int world_rank);
/* How many `dim` groups the world has (each of t->world / count ranks). */
int hs_topology_group_count(const hs_topology *t, hs_mesh_dim dim);

typedef struct hs_mesh hs_mesh;

/* Collective over the world: builds every dim's group for this rank (names
 * "<dim>" e.g. "fsdp_shard"), each exactly once. */
hs_status hs_mesh_create(hs_comm *c, const hs_topology *t, hs_mesh **out, hs_error *e);
/* The same with groups named "<prefix>.<dim>", so meshes of several layouts
 * live in one process (benchmarks); prefix NULL or "": hs_mesh_create. */
hs_status hs_mesh_create_named(hs_comm *c, const hs_topology *t, const char *prefix, hs_mesh **out,
                               hs_error *e);
void hs_mesh_free(hs_mesh *m);
const hs_topology *hs_mesh_topology(const hs_mesh *m);
hs_coords hs_mesh_coords(const hs_mesh *m);
hs_pg *hs_mesh_group(const hs_mesh *m, hs_mesh_dim d);

/* The table `hypershard mesh` prints: every rank's coordinates and every
 * group's member ranks. HS_ERR_OOM, nothing printed, without memory for
 * the member lists. */
hs_status hs_topology_print(const hs_topology *t, FILE *f, hs_error *e);

#endif
