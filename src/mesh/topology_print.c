/* The table `hypershard mesh` prints: the sizes, every rank's coordinates,
 * then every group's members, so a person can check a layout by eye before
 * starting a job on it. */
#include <stdlib.h>

#include "hypershard/mesh.h"

static void print_sizes(const hs_topology *t, FILE *f) {
    fprintf(f, "world %d = pp %d × dp %d × cp %d × tp %d\n", t->world, t->pp, t->dp, t->cp, t->tp);
    fprintf(f, "dense:   dp×cp = %d = fsdp_replicate %d × fsdp_shard %d (dp_shard_size %d)\n",
            t->fsdp_dp, t->dp_replicate, t->dp_shard, t->dp_shard);
    fprintf(f,
            "experts: dp×cp×tp = %d = edp %d × ep %d; edp = edp_replicate %d × edp_shard %d "
            "(edp_shard_size %d)\n",
            t->expert_domain, t->edp, t->ep, t->edp_replicate, t->edp_shard, t->edp_shard);
    char why[256];
    hs_topology_fsdp_active(t, why, sizeof why);
    fprintf(f, "%s\n", why);
}

static void print_coords(const hs_topology *t, FILE *f) {
    fprintf(f, "\n%5s %3s %3s %3s %3s %14s %10s %13s %9s %3s\n", "rank", "pp", "dp", "cp", "tp",
            "fsdp_replicate", "fsdp_shard", "edp_replicate", "edp_shard", "ep");
    for (int r = 0; r < t->world; r++) {
        hs_coords c = hs_topology_coords(t, r);
        fprintf(f, "%5d %3d %3d %3d %3d %14d %10d %13d %9d %3d\n", r, c.pp, c.dp, c.cp, c.tp,
                c.fsdp_replicate, c.fsdp_shard, c.edp_replicate, c.edp_shard, c.ep);
    }
}

/* One line per dim: its groups in index order, members in group-rank order. */
static void print_dim(const hs_topology *t, hs_mesh_dim d, int *members, FILE *f) {
    int groups = hs_topology_group_count(t, d), size = t->world / groups;
    hs_topology_groups(t, d, members);
    fprintf(f, "%-15s %5d × %-4d", hs_mesh_dim_name(d), groups, size);
    for (int g = 0; g < groups; g++) {
        fputs(" [", f);
        for (int i = 0; i < size; i++) fprintf(f, i ? " %d" : "%d", members[g * size + i]);
        fputc(']', f);
    }
    fputc('\n', f);
}

hs_status hs_topology_print(const hs_topology *t, FILE *f, hs_error *e) {
    int *members = malloc(sizeof(int) * (size_t)t->world);
    if (!members)
        return hs_error_oom(e, "printing the groups of %d ranks: %zu bytes", t->world,
                            sizeof(int) * (size_t)t->world);
    print_sizes(t, f);
    print_coords(t, f);
    fprintf(f, "\n%-15s %s  %s\n", "group", "count × size",
            "members (world ranks, group-rank order)");
    for (int d = 0; d < HS_DIM_COUNT; d++) print_dim(t, (hs_mesh_dim)d, members, f);
    free(members);
    return HS_OK;
}
