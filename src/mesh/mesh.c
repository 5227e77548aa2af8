/* The runtime mesh: one process group per dim, built once over the world
 * from the topology's arithmetic and cached, so every layer above asks for
 * a dim and gets the same group (spec 004 §6: managers select sub-meshes,
 * they never recompute the layout). */
#include <stdio.h>
#include <stdlib.h>

#include "hypershard/mesh.h"

struct hs_mesh {
    hs_topology topo;
    char prefix[48]; /* group names are "<prefix>.<dim>", or "<dim>" */
    int rank;
    hs_coords coords;
    hs_pg *groups[HS_DIM_COUNT]; /* owned by the comm context's cache */
};

/* The model-parallel dims run collectives in the middle of a layer, on the
 * critical path of compute: their groups get the critical queue, so they
 * never wait behind the FSDP all-gathers and reduce-scatters that the data
 * dims prefetch and pipeline on the default queue (comm.h). */
static hs_comm_queue mesh_dim_queue(hs_mesh_dim d) {
    return d == HS_DIM_TP || d == HS_DIM_CP || d == HS_DIM_EP ? HS_COMM_QUEUE_CRITICAL
                                                              : HS_COMM_QUEUE_DEFAULT;
}

/* A cached group of the same name built for another layout would silently
 * route collectives to the wrong ranks, and one built on another queue
 * would put the critical path behind prefetches (or the reverse); catch
 * both here. */
static hs_status mesh_group_check(const hs_mesh *m, hs_mesh_dim d, int key, hs_error *e) {
    const hs_pg *g = m->groups[d];
    int want = m->topo.world / hs_topology_group_count(&m->topo, d);
    if (g && hs_pg_size(g) == want && hs_pg_rank(g) == key) {
        if (hs_pg_queue(g) == mesh_dim_queue(d)) return HS_OK;
        const char *want_q = mesh_dim_queue(d) == HS_COMM_QUEUE_CRITICAL ? "critical" : "default";
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "mesh group '%s' runs on the %s queue, but the mesh puts it on the "
                            "%s queue; a group of that name was created earlier on another "
                            "queue: leave the name to the mesh or create it on the %s queue",
                            hs_mesh_dim_name(d),
                            hs_pg_queue(g) == HS_COMM_QUEUE_CRITICAL ? "critical" : "default",
                            want_q, want_q);
    }
    return hs_error_set(e, HS_ERR_INTERNAL,
                        "mesh group '%s' on rank %d has size %d and rank %d, expected size %d "
                        "and rank %d; a group of that name was created earlier with another "
                        "layout",
                        hs_mesh_dim_name(d), m->rank, g ? hs_pg_size(g) : 0, g ? hs_pg_rank(g) : -1,
                        want, key);
}

/* Every rank calls split for every dim in the same order: each split is
 * collective over the world. */
static hs_status mesh_split_all(hs_comm *c, hs_mesh *m, hs_error *e) {
    for (int i = 0; i < HS_DIM_COUNT; i++) {
        hs_mesh_dim d = (hs_mesh_dim)i;
        int colour = hs_topology_group_index(&m->topo, d, m->rank);
        int key = hs_topology_group_rank(&m->topo, d, m->rank);
        char name[96];
        if (m->prefix[0]) snprintf(name, sizeof name, "%s.%s", m->prefix, hs_mesh_dim_name(d));
        else snprintf(name, sizeof name, "%s", hs_mesh_dim_name(d));
        hs_status s =
            hs_comm_split_queue(c, name, colour, key, mesh_dim_queue(d), &m->groups[d], e);
        if (s == HS_OK) s = mesh_group_check(m, d, key, e);
        if (s != HS_OK) return s;
    }
    return HS_OK;
}

hs_status hs_mesh_create(hs_comm *c, const hs_topology *t, hs_mesh **out, hs_error *e) {
    return hs_mesh_create_named(c, t, NULL, out, e);
}

hs_status hs_mesh_create_named(hs_comm *c, const hs_topology *t, const char *prefix, hs_mesh **out,
                               hs_error *e) {
    *out = NULL;
    int world = hs_comm_size(c);
    if (t->world != world)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "the topology was derived for world size %d but %d ranks are "
                            "running; start the job with mpiexec -n %d or derive it for %d",
                            t->world, world, t->world, world);
    if (t->dp < 1 || t->dp_replicate < 1 || t->edp_replicate < 1)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "the topology (world %d, tp %d, cp %d, ep %d, pp %d, dp_shard %d, "
                            "edp_shard %d) did not pass hs_topology_derive; fix its errors first",
                            t->world, t->tp, t->cp, t->ep, t->pp, t->dp_shard, t->edp_shard);
    hs_mesh *m = calloc(1, sizeof *m);
    if (!m) return hs_error_oom(e, "the mesh: %zu bytes", sizeof *m);
    m->topo = *t;
    snprintf(m->prefix, sizeof m->prefix, "%s", prefix ? prefix : "");
    m->rank = hs_comm_rank(c);
    m->coords = hs_topology_coords(t, m->rank);
    hs_status s = mesh_split_all(c, m, e);
    if (s != HS_OK) {
        free(m);
        return s;
    }
    *out = m;
    return HS_OK;
}

void hs_mesh_free(hs_mesh *m) { free(m); }

const hs_topology *hs_mesh_topology(const hs_mesh *m) { return &m->topo; }

hs_coords hs_mesh_coords(const hs_mesh *m) { return m->coords; }

hs_pg *hs_mesh_group(const hs_mesh *m, hs_mesh_dim d) {
    HS_ASSERT(d >= 0 && d < HS_DIM_COUNT);
    return m->groups[d];
}
