/* train/plan_links.c — the link classes of a plan's FSDP collectives
 * (hs_plan_links): of the bytes each rank sends in a step, which stay
 * inside its node, from the mesh's groups and ranks_per_node consecutive
 * world ranks a node. What a collective sends to whom is comm.h's "Link
 * classes", so a traced step sums to the same figures. */
#include <stdlib.h>
#include <string.h>

#include "hypershard/mesh.h"
#include "hypershard/train.h"

/* The group kinds of hs_plan_role.fsdp_payload: where each kind shards
 * and where it all-reduces (the flat kind, replicate_params, only
 * all-reduces). */
static const hs_mesh_dim shard_dim[3] = {HS_DIM_FSDP_SHARD, HS_DIM_EDP_SHARD, HS_DIM_COUNT};
static const hs_mesh_dim replicate_dim[3] = {HS_DIM_FSDP_REPLICATE, HS_DIM_EDP_REPLICATE,
                                             HS_DIM_FSDP};

typedef struct links {
    const hs_topology *t;
    int rpn;
    int *members[HS_DIM_COUNT]; /* hs_topology_groups of the kinds' dims */
    int *nodes[HS_DIM_COUNT];   /* each group's even_nodes, -1 until known */
} links;

/* Rank q's group of dim d: its members, size and q's index in it. */
static const int *group_of(const links *l, hs_mesh_dim d, int q, int *size, int *index) {
    *size = l->t->world / hs_topology_group_count(l->t, d);
    *index = hs_topology_group_rank(l->t, d, q);
    return l->members[d] + (size_t)hs_topology_group_index(l->t, d, q) * (size_t)*size;
}

static int remote(const links *l, int a, int b) { return a / l->rpn != b / l->rpn; }

/* The nodes a group of w members m spans when each holds the same number
 * of them, else 0 (fsdp/node_groups.c's rule for two levels). */
static int count_even_nodes(const links *l, const int *m, int w) {
    int n = 0;
    for (int j = 0; j < w; j++) {
        bool seen = false;
        for (int k = 0; k < j && !seen; k++) seen = m[k] / l->rpn == m[j] / l->rpn;
        n += !seen;
    }
    for (int j = 0; j < w; j++) {
        int same = 0;
        for (int k = 0; k < w; k++) same += m[k] / l->rpn == m[j] / l->rpn;
        if (same * n != w) return 0;
    }
    return n;
}

/* The same for rank q's group of dim d, once a group. */
static int even_nodes(const links *l, hs_mesh_dim d, int q, const int *m, int w) {
    int *known = &l->nodes[d][hs_topology_group_index(l->t, d, q)];
    if (*known < 0) *known = count_even_nodes(l, m, w);
    return *known;
}

/* The ring's all-reduce chunks (comm/ring.c). */
static int64_t chunk(int64_t n, int w, int i) { return n / w + (i < n % w); }

/* Rank q's sends of its role's per-step payloads of kind g into r->sent. */
static void rank_sends(const links *l, hs_plan_role *r, int g, int q, int secondary) {
    int64_t(*pay)[3] = r->fsdp_payload, (*sent)[2] = r->sent;
    int w, i;
    const int *m = shard_dim[g] == HS_DIM_COUNT ? NULL : group_of(l, shard_dim[g], q, &w, &i);
    if (m && w > 1) {
        int next = m[(i + 1) % w];
        sent[HS_PLAN_AG][remote(l, q, next)] += pay[HS_PLAN_AG][g] / w * (w - 1);
        /* grad_reduce: one all-to-all, or two levels over N even nodes: a
         * node peer gets the N chunks it sums, then each other node the
         * sum of its rank's chunk */
        bool a2a = r->rs_all_to_all || r->canonical_sums;
        int n = r->rs_all_to_all ? even_nodes(l, shard_dim[g], q, m, w) : 0;
        int64_t chunk_bytes = pay[HS_PLAN_RS][g] / w;
        if (n > 1 && w / n > 1) {
            sent[HS_PLAN_RS][0] += chunk_bytes * n * (w / n - 1);
            sent[HS_PLAN_RS][1] += chunk_bytes * (n - 1);
        }
        for (int j = 0; a2a && !(n > 1 && w / n > 1) && j < w; j++)
            if (j != i) sent[HS_PLAN_RS][remote(l, q, m[j])] += chunk_bytes;
        if (!a2a) sent[HS_PLAN_RS][remote(l, q, next)] += pay[HS_PLAN_RS][g] / w * (w - 1);
        int s = secondary;
        if (pay[HS_PLAN_AG_SECONDARY][g] > 0 && s > 1 && w % s == 0) {
            int peer = m[i - i % s + (i % s + 1) % s];
            sent[HS_PLAN_AG_SECONDARY][remote(l, q, peer)] += pay[HS_PLAN_AG_SECONDARY][g] / s *
                                                              (s - 1);
        }
    }
    m = group_of(l, replicate_dim[g], q, &w, &i);
    if (w < 2 || pay[HS_PLAN_AR][g] == 0) return;
    int next = (i + 1) % w;
    if (r->canonical_sums) { /* the whole buffer round the ring */
        sent[HS_PLAN_AR][remote(l, q, m[next])] += pay[HS_PLAN_AR][g] * (w - 1);
        return;
    }
    int64_t elems = 0, bytes = 0;
    for (int k = 0; k < r->n_ar_sizes[g]; k++) elems += r->ar_numel[g][k] * r->ar_calls[g][k];
    int64_t es = elems ? pay[HS_PLAN_AR][g] / elems : 0;
    /* every chunk but its own, then every chunk but the next rank's */
    for (int k = 0; k < r->n_ar_sizes[g]; k++) {
        int64_t n = r->ar_numel[g][k];
        bytes += r->ar_calls[g][k] * (2 * n - chunk(n, w, i) - chunk(n, w, next)) * es;
    }
    /* sizes past HS_PLAN_AR_SIZES: as if their chunks were even */
    bytes += (pay[HS_PLAN_AR][g] - elems * es) / w * 2 * (w - 1);
    sent[HS_PLAN_AR][remote(l, q, m[next])] += bytes;
}

hs_status hs_plan_links(hs_plan *p, int secondary_shard_size, int ranks_per_node, hs_error *e) {
    p->ranks_per_node = 0;
    for (int r = 0; r < p->n_roles; r++) memset(p->roles[r].sent, 0, sizeof p->roles[r].sent);
    if (ranks_per_node < 1 || !p->topo || strcmp(p->engine, "fsdp")) return HS_OK;
    links l = {.t = p->topo, .rpn = ranks_per_node};
    hs_status st = HS_OK;
    for (int g = 0; g < 3 && st == HS_OK; g++) {
        hs_mesh_dim dims[2] = {shard_dim[g], replicate_dim[g]};
        for (int k = 0; k < 2 && st == HS_OK; k++) {
            if (dims[k] == HS_DIM_COUNT || l.members[dims[k]]) continue;
            int groups = hs_topology_group_count(p->topo, dims[k]);
            l.members[dims[k]] = malloc(sizeof(int) * (size_t)p->topo->world);
            l.nodes[dims[k]] = malloc(sizeof(int) * (size_t)groups);
            if (l.members[dims[k]] && l.nodes[dims[k]]) {
                hs_topology_groups(p->topo, dims[k], l.members[dims[k]]);
                for (int i = 0; i < groups; i++) l.nodes[dims[k]][i] = -1;
            } else {
                st = hs_error_oom(e, "plan: the %s groups of %d ranks", hs_mesh_dim_name(dims[k]),
                                  p->topo->world);
            }
        }
    }
    for (int q = 0; st == HS_OK && q < p->topo->world; q++) {
        int role = p->n_roles > 1 ? hs_topology_coords(p->topo, q).pp : 0;
        for (int g = 0; g < 3; g++) rank_sends(&l, &p->roles[role], g, q, secondary_shard_size);
    }
    for (int d = 0; d < HS_DIM_COUNT; d++) free(l.members[d]), free(l.nodes[d]);
    if (st == HS_OK) p->ranks_per_node = ranks_per_node;
    return st;
}
