/* The runtime mesh over real process groups: for every dim, the group's
 * members are the ones the arithmetic names, an all-reduce of the world
 * rank over the group sums exactly those members, and groups are built once.
 * HS_MPI_RANKS: 1 2 4 8 16
 * HS_TEST_TIMEOUT: 180 */
#include <mpi.h>
#include <stdlib.h>

#include "hypershard/mesh.h"
#include "mpi_test_util.h"

/* The richest valid layout for each tested world size, so every dim has
 * more than one group or more than one member somewhere. */
static hs_topology layout_for(int world, hs_error *e) {
    hs_topology t;
    hs_status s;
    switch (world) {
    case 2: s = hs_topology_derive(&t, 2, 1, 1, 2, 1, 2, 1, e); break;
    case 4: s = hs_topology_derive(&t, 4, 2, 1, 2, 1, 2, 2, e); break;
    case 8: s = hs_topology_derive(&t, 8, 2, 2, 4, 1, 2, 2, e); break;
    case 16: s = hs_topology_derive(&t, 16, 2, 2, 2, 2, 2, 2, e); break;
    default: s = hs_topology_derive(&t, world, 1, 1, 1, 1, world, 1, e); break;
    }
    if (s != HS_OK) {
        fprintf(stderr, "layout for world %d: %s\n", world, e->msg);
        exit(1);
    }
    return t;
}

static void check_dim(hs_comm *c, const hs_mesh *m, hs_mesh_dim d, int *members) {
    const hs_topology *t = hs_mesh_topology(m);
    int rank = hs_comm_rank(c);
    const char *name = hs_mesh_dim_name(d);
    hs_pg *g = hs_mesh_group(m, d);
    CHECK(c, g != NULL, "dim %s has no group on rank %d", name, rank);
    CHECK(c, g == hs_mesh_group(m, d), "dim %s: two lookups gave two groups", name);
    int n = hs_topology_group_ranks(t, d, rank, members);
    CHECK(c, hs_pg_size(g) == n, "dim %s: group size %d, expected %d", name, hs_pg_size(g), n);
    CHECK(c, hs_pg_rank(g) == hs_topology_group_rank(t, d, rank),
          "dim %s: rank %d in group, "
          "expected %d",
          name, hs_pg_rank(g), hs_topology_group_rank(t, d, rank));
    int want_sum = 0;
    for (int i = 0; i < n; i++) {
        CHECK(c, hs_pg_world_rank(g, i) == members[i],
              "dim %s: group rank %d is world rank %d, "
              "expected %d",
              name, i, hs_pg_world_rank(g, i), members[i]);
        want_sum += members[i];
    }
    float v = (float)rank;
    hs_error e;
    hs_error_clear(&e);
    CHECK(c, hs_pg_all_reduce(g, NULL, &v, 1, HS_DTYPE_F32, HS_REDUCE_SUM, &e) == HS_OK, "%s",
          e.msg);
    CHECK(c, v == (float)want_sum,
          "dim %s on rank %d: all-reduce of world ranks gave %g, "
          "expected %d",
          name, rank, (double)v, want_sum);
    CHECK(c, hs_trace_collectives(hs_comm_trace(c), "all_reduce", name) == 1,
          "dim %s: the all-reduce was not counted under the group's name", name);
}

/* A second mesh over the same layout reuses every cached group. */
static void check_cached(hs_comm *c, const hs_mesh *m) {
    hs_error e;
    hs_error_clear(&e);
    hs_mesh *again = NULL;
    CHECK(c, hs_mesh_create(c, hs_mesh_topology(m), &again, &e) == HS_OK, "%s", e.msg);
    for (int d = 0; d < HS_DIM_COUNT; d++)
        CHECK(c, hs_mesh_group(again, (hs_mesh_dim)d) == hs_mesh_group(m, (hs_mesh_dim)d),
              "dim %s was built twice", hs_mesh_dim_name((hs_mesh_dim)d));
    hs_pg *shard = NULL;
    CHECK(c, hs_comm_split(c, "fsdp_shard", 0, 0, &shard, &e) == HS_OK, "%s", e.msg);
    CHECK(c, shard == hs_mesh_group(m, HS_DIM_FSDP_SHARD), "fsdp_shard is not the cached group");
    hs_mesh_free(again);
}

static void check_wrong_world_is_refused(hs_comm *c) {
    hs_topology t;
    hs_error e;
    hs_error_clear(&e);
    int other = hs_comm_size(c) * 2;
    CHECK(c, hs_topology_derive(&t, other, 1, 1, 1, 1, 1, 1, &e) == HS_OK, "%s", e.msg);
    hs_mesh *m = NULL;
    CHECK(c, hs_mesh_create(c, &t, &m, &e) == HS_ERR_CONFIG && m == NULL,
          "a mesh for world %d was built on %d ranks", other, hs_comm_size(c));
}

int main(int argc, char **argv) {
    hs_trace *trace = NULL;
    hs_comm *c = mt_traced_init(&argc, &argv, 120, false, &trace);
    int rank = hs_comm_rank(c);
    hs_error e;
    hs_error_clear(&e);
    hs_topology t = layout_for(hs_comm_size(c), &e);
    hs_mesh *m = NULL;
    CHECK(c, hs_mesh_create(c, &t, &m, &e) == HS_OK, "%s", e.msg);
    hs_coords want = hs_topology_coords(&t, rank), got = hs_mesh_coords(m);
    CHECK(c,
          got.pp == want.pp && got.tp == want.tp && got.ep == want.ep &&
              got.fsdp_shard == want.fsdp_shard && got.edp_shard == want.edp_shard,
          "mesh coords of rank %d differ from the topology's", rank);
    int *members = malloc(sizeof(int) * (size_t)t.world);
    for (int d = 0; d < HS_DIM_COUNT; d++) check_dim(c, m, (hs_mesh_dim)d, members);
    free(members);
    check_cached(c, m);
    check_wrong_world_is_refused(c);
    if (rank == 0) printf("mesh groups ok on %d ranks\n", t.world);
    hs_mesh_free(m);
    mt_traced_finalize(c, trace);
    return 0;
}
