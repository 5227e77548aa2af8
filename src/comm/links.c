/* comm/links.c — which node each rank is on, and the bytes a collective
 * sends inside this rank's node and to other nodes (comm.h, "Link
 * classes"). */
#include <stdlib.h>

#include "comm/group.h"

hs_status hs_comm_nodes_init(hs_comm *c, hs_error *e) {
    MPI_Comm node;
    int leader = c->rank, n = 1;
    c->node_of = calloc((size_t)c->size, sizeof *c->node_of);
    if (!c->node_of)
        return hs_error_oom(e, "the node of each of %d ranks: %zu bytes", c->size,
                            (size_t)c->size * sizeof *c->node_of);
    int rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    if (rc == MPI_SUCCESS) {
        MPI_Comm_size(node, &n);
        /* a node is named by its lowest world rank */
        rc = MPI_Allreduce(&c->rank, &leader, 1, MPI_INT, MPI_MIN, node);
        MPI_Comm_free(&node);
    }
    if (rc == MPI_SUCCESS)
        rc = MPI_Allgather(&leader, 1, MPI_INT, c->node_of, 1, MPI_INT, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        char why[MPI_MAX_ERROR_STRING];
        return hs_error_set(e, HS_ERR_COMM, "finding the node of each rank: %s",
                            hs_mpi_strerror(rc, why, sizeof why));
    }
    c->local_ranks = n;
    return HS_OK;
}

int hs_comm_node_of(const hs_comm *c, int world_rank) {
    HS_ASSERT(world_rank >= 0 && world_rank < c->size);
    return c->node_of[world_rank];
}

/* Whether group rank i is on another node than this rank. */
static bool remote(const hs_pg *g, int i) {
    const int *node = g->comm->node_of;
    return node[g->world_ranks[i]] != node[g->world_ranks[g->rank]];
}

/* The ring's all-reduce chunks: N / W elements, one more for the first
 * N % W (ring.c). */
static int64_t ring_chunk(int64_t n, int w, int i) { return n / w + (i < n % w); }

void hs_comm_sent_bytes(const hs_pg *g, const hs_coll_args *a, int64_t sent[2]) {
    const int w = g->size, r = g->rank;
    const int64_t es = a->op == HS_OP_BARRIER ? 0 : (int64_t)hs_dtype_size(a->dt);
    sent[0] = sent[1] = 0;
    if (w < 2) return;
    int next = (r + 1) % w;
    /* a canonical sum: a reduce-scatter's blocks go to their owners (an
     * all-to-all), an all-reduce's whole buffer round the ring (an
     * all-gather) */
    bool canonical = hs_comm_canonical_sum(g->comm, w, a);
    if (canonical && a->op == HS_OP_REDUCE_SCATTER) {
        for (int i = 0; i < w; i++)
            if (i != r) sent[remote(g, i)] += a->count * es;
        return;
    }
    switch (canonical ? HS_OP_ALL_GATHER : a->op) {
    case HS_OP_ALL_GATHER:
    case HS_OP_REDUCE_SCATTER: sent[remote(g, next)] = (int64_t)(w - 1) * a->count * es; return;
    case HS_OP_ALL_REDUCE:
        /* the reduce-scatter phase sends every chunk but this rank's, the
         * all-gather phase every chunk but the next rank's */
        sent[remote(g, next)] =
            (2 * a->count - ring_chunk(a->count, w, r) - ring_chunk(a->count, w, next)) * es;
        return;
    case HS_OP_ALL_TO_ALL:
    case HS_OP_ALL_TO_ALLV:
        for (int i = 0; i < w; i++)
            if (i != r)
                sent[remote(g, i)] += (a->op == HS_OP_ALL_TO_ALL ? a->count : a->send_counts[i]) *
                                      es;
        return;
    case HS_OP_BROADCAST:
        for (int i = 0; r == a->peer && i < w; i++)
            if (i != r) sent[remote(g, i)] += a->count * es;
        return;
    case HS_OP_SEND: sent[remote(g, a->peer)] = a->count * es; return;
    default: return; /* recv, barrier: nothing of this rank's payload */
    }
}
