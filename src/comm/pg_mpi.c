/* comm/pg_mpi.c — the `mpi` backend of hs_pg.
 *
 * Reduce-scatter, all-reduce and all-gather are hypershard's own (Open
 * MPI's reduce-scatter allocates per call and is several times slower
 * here): the direct-read algorithms of shm_coll.c when the whole group is
 * on one node, else the ring algorithms of ring.c over reused staging
 * buffers. Broadcast, all-to-all(v), send/recv and barrier are the MPI
 * built-ins. Each group owns two communicators: one for collectives, one
 * for send/recv. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi_group.h"
#include "comm/ring.h"

static MPI_Datatype mpi_type(hs_dtype dt) {
    return dt == HS_DTYPE_F32 ? MPI_FLOAT : dt == HS_DTYPE_U8 ? MPI_BYTE : MPI_UINT16_T;
}

static hs_status exec_broadcast(hs_mpi_group *g, const hs_coll_args *a, hs_error *e) {
    const size_t es = hs_dtype_size(a->dt);
    for (int64_t done = 0; done < a->count;) {
        int64_t n = a->count - done < INT_MAX / 2 ? a->count - done : INT_MAX / 2;
        int rc = MPI_Bcast((char *)a->out + done * es, (int)n, mpi_type(a->dt), a->peer, g->coll);
        if (rc != MPI_SUCCESS) return hs_mpi_fail(g, e, rc, "MPI_Bcast", "broadcast");
        done += n;
    }
    return HS_OK;
}

static hs_status exec_all_to_all(hs_mpi_group *g, const hs_coll_args *a, hs_error *e) {
    if (a->count > INT_MAX)
        return hs_error_set(e, HS_ERR_COMM,
                            "all_to_all on group '%s': %lld elements per block exceed the MPI "
                            "limit %d; split the exchange into several calls",
                            g->name, (long long)a->count, INT_MAX);
    int rc = MPI_Alltoall(a->in, (int)a->count, mpi_type(a->dt), a->out, (int)a->count,
                          mpi_type(a->dt), g->coll);
    return rc == MPI_SUCCESS ? HS_OK : hs_mpi_fail(g, e, rc, "MPI_Alltoall", "all_to_all");
}

/* all_to_allv's counts and displacements checked, for either path, and
 * kept as MPI's ints in g->vcounts. */
static hs_status check_v_counts(hs_mpi_group *g, const hs_coll_args *a, hs_error *e) {
    const int64_t *src[4] = {a->send_counts, a->send_displs, a->recv_counts, a->recv_displs};
    static const char *what[4] = {"send_counts", "send_displs", "recv_counts", "recv_displs"};
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < g->size; i++) {
            int64_t v = src[k][i];
            if (v < 0 || v > INT_MAX)
                return hs_error_set(e, HS_ERR_COMM,
                                    "all_to_allv on group '%s': %s[%d] = %lld is outside "
                                    "[0, %d]; split the exchange into several calls",
                                    g->name, what[k], i, (long long)v, INT_MAX);
            g->vcounts[k * g->size + i] = (int)v;
        }
    return HS_OK;
}

static hs_status exec_all_to_allv(hs_mpi_group *g, const hs_coll_args *a, hs_error *e) {
    int *v = g->vcounts, w = g->size;
    int rc = MPI_Alltoallv(a->in, v, v + w, mpi_type(a->dt), a->out, v + 2 * w, v + 3 * w,
                           mpi_type(a->dt), g->coll);
    return rc == MPI_SUCCESS ? HS_OK : hs_mpi_fail(g, e, rc, "MPI_Alltoallv", "all_to_allv");
}

static hs_status exec_p2p(hs_mpi_group *g, const hs_coll_args *a, hs_error *e) {
    const size_t es = hs_dtype_size(a->dt);
    const bool send = a->op == HS_OP_SEND;
    int64_t done = 0;
    do {
        int64_t n = a->count - done < INT_MAX / 2 ? a->count - done : INT_MAX / 2;
        int rc = send ? MPI_Send((const char *)a->in + done * es, (int)n, mpi_type(a->dt), a->peer,
                                 a->tag, g->p2p)
                      : MPI_Recv((char *)a->out + done * es, (int)n, mpi_type(a->dt), a->peer,
                                 a->tag, g->p2p, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return hs_mpi_fail(g, e, rc, send ? "MPI_Send" : "MPI_Recv", send ? "send" : "recv");
        done += n;
    } while (done < a->count);
    return HS_OK;
}

/* train.reproducibility: layout. The ranks' fp32 blocks brought together
 * whole (all-to-all for a reduce-scatter, all-gather for an all-reduce)
 * into blocks[rank][n], then added as a pairwise tree in rank order:
 * (0+1)+(2+3) and so on, the largest power of two on the left, the same
 * order a one-rank run adds the sequences those ranks held
 * (docs/numerics.md "Layout-invariant training"). */
static hs_status canonical_reduce(hs_mpi_group *g, const hs_coll_args *a, hs_error *e) {
    const bool scatter = a->op == HS_OP_REDUCE_SCATTER;
    const int w = g->size;
    const int64_t n = a->count;
    float *blocks = malloc((size_t)w * (size_t)n * sizeof(float) + 1);
    if (!blocks)
        return hs_error_oom(e, "%s on group '%s': %lld bytes of the ranks' blocks",
                            scatter ? "reduce_scatter" : "all_reduce", g->name,
                            (long long)((int64_t)w * n * 4));
    hs_coll_args x = *a;
    x.out = blocks;
    hs_status st;
    if (scatter) {
        x.op = HS_OP_ALL_TO_ALL;
        st = g->shm ? hs_shm_all_to_all(g->shm, blocks, a->in, n, a->dt, e)
                    : exec_all_to_all(g, &x, e);
    } else {
        st = g->shm ? hs_shm_all_gather(g->shm, blocks, a->out, n, a->dt, e)
                    : hs_ring_all_gather(g, blocks, a->out, n, a->dt, e);
    }
    for (int step = 1; st == HS_OK && step < w; step *= 2)
        for (int q = 0; q + step < w; q += 2 * step) /* left += right (addition commutes) */
            hs_comm_reduce(blocks + (int64_t)q * n, blocks + (int64_t)(q + step) * n,
                           blocks + (int64_t)q * n, n, HS_DTYPE_F32, HS_REDUCE_SUM, 1);
    float *out = a->out;
    for (int64_t i = 0; st == HS_OK && i < n; i++)
        out[i] = a->reduce == HS_REDUCE_AVG ? blocks[i] / (float)w : blocks[i];
    free(blocks);
    return st;
}

static hs_status mpi_exec(void *ctx, const hs_coll_args *a, hs_error *e) {
    hs_mpi_group *g = ctx;
    if (hs_comm_canonical_sum(g->comm, g->size, a)) return canonical_reduce(g, a, e);
    switch (a->op) {
    case HS_OP_ALL_GATHER:
        if (g->shm) return hs_shm_all_gather(g->shm, a->out, a->in, a->count, a->dt, e);
        return hs_ring_all_gather(g, a->out, a->in, a->count, a->dt, e);
    case HS_OP_REDUCE_SCATTER:
        if (g->shm)
            return hs_shm_reduce_scatter(g->shm, a->out, a->in, a->count, a->dt, a->reduce, e);
        return hs_ring_reduce_scatter(g, a->out, a->in, a->count, a->dt, a->reduce, e);
    case HS_OP_ALL_REDUCE:
        if (g->shm) return hs_shm_all_reduce(g->shm, a->out, a->count, a->dt, a->reduce, e);
        return hs_ring_all_reduce(g, a->out, a->count, a->dt, a->reduce, e);
    case HS_OP_BROADCAST: return exec_broadcast(g, a, e);
    case HS_OP_ALL_TO_ALL:
        if (g->shm) return hs_shm_all_to_all(g->shm, a->out, a->in, a->count, a->dt, e);
        return exec_all_to_all(g, a, e);
    case HS_OP_ALL_TO_ALLV: {
        hs_status st = check_v_counts(g, a, e);
        if (st != HS_OK || !g->shm) return st != HS_OK ? st : exec_all_to_allv(g, a, e);
        return hs_shm_all_to_allv(g->shm, a->out, a->recv_counts, a->recv_displs, a->in,
                                  a->send_counts, a->send_displs, a->dt, e);
    }
    case HS_OP_SEND:
    case HS_OP_RECV: return exec_p2p(g, a, e);
    case HS_OP_BARRIER: {
        int rc = MPI_Barrier(g->coll);
        return rc == MPI_SUCCESS ? HS_OK : hs_mpi_fail(g, e, rc, "MPI_Barrier", "barrier");
    }
    default: hs_panic("mpi backend: unknown op %d", (int)a->op);
    }
}

static void mpi_destroy(void *ctx) {
    hs_mpi_group *g = ctx;
    for (int i = 0; i < 2; i++) hs_pool_free(g->pool, g->stage[i]);
    hs_shm_free(g->shm);
    free(g->vcounts);
    MPI_Comm_free(&g->coll);
    MPI_Comm_free(&g->p2p);
    free(g);
}

/* One MPI_Isend / MPI_Irecv (a message below INT_MAX / 2 elements; larger
 * ones go through exec). */
static hs_status mpi_p2p_start(void *ctx, const hs_coll_args *a, void **req, hs_error *e) {
    hs_mpi_group *g = ctx;
    *req = NULL;
    if (a->count >= INT_MAX / 2) return HS_OK;
    MPI_Request *r = malloc(sizeof *r);
    if (!r)
        return hs_error_oom(e, "a %s request on group '%s': %zu bytes",
                            a->op == HS_OP_SEND ? "send" : "recv", g->name, sizeof *r);
    bool send = a->op == HS_OP_SEND;
    int rc = send ? MPI_Isend(a->in, (int)a->count, mpi_type(a->dt), a->peer, a->tag, g->p2p, r)
                  : MPI_Irecv(a->out, (int)a->count, mpi_type(a->dt), a->peer, a->tag, g->p2p, r);
    if (rc != MPI_SUCCESS) {
        free(r);
        return hs_mpi_fail(g, e, rc, send ? "MPI_Isend" : "MPI_Irecv", send ? "send" : "recv");
    }
    *req = r;
    return HS_OK;
}

static hs_status mpi_p2p_test(void *ctx, void *req, bool *done, hs_error *e) {
    hs_mpi_group *g = ctx;
    int flag = 0;
    int rc = MPI_Test((MPI_Request *)req, &flag, MPI_STATUS_IGNORE);
    *done = flag || rc != MPI_SUCCESS;
    if (*done) free(req);
    return rc == MPI_SUCCESS ? HS_OK : hs_mpi_fail(g, e, rc, "MPI_Test", "send/recv");
}

/* All-gather, reduce-scatter and all-reduce are hypershard's own: the
 * direct reads of the shared segment on one node, else the ring, or the
 * canonical sum; the rest are MPI's. */
static const char *mpi_path(void *ctx, const hs_coll_args *a) {
    hs_mpi_group *g = ctx;
    if (hs_comm_canonical_sum(g->comm, g->size, a)) return "canonical";
    if (a->op != HS_OP_ALL_GATHER && a->op != HS_OP_REDUCE_SCATTER && a->op != HS_OP_ALL_REDUCE)
        return "mpi";
    return g->shm ? "intra-node" : "ring";
}

static const hs_pg_backend mpi_backend = {.name = "mpi",
                                          .exec = mpi_exec,
                                          .destroy = mpi_destroy,
                                          .p2p_start = mpi_p2p_start,
                                          .p2p_test = mpi_p2p_test,
                                          .path = mpi_path};

/* The group's tables: its members' world ranks, the counts of a v
 * collective, and their translation. */
static hs_status mpi_tables(hs_pg *pg, hs_mpi_group *g, MPI_Comm mc, hs_error *e) {
    g->vcounts = calloc((size_t)4 * (size_t)pg->size, sizeof(int));
    pg->world_ranks = calloc((size_t)pg->size, sizeof(int));
    int *idx = calloc((size_t)pg->size, sizeof(int));
    if (!g->vcounts || !pg->world_ranks || !idx) {
        free(idx);
        return hs_error_oom(e, "creating group '%s': %zu bytes of tables for %d ranks", pg->name,
                            (size_t)6 * (size_t)pg->size * sizeof(int), pg->size);
    }
    /* World rank of each member, from the world communicator's group. */
    MPI_Group mine, world;
    MPI_Comm_group(mc, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    for (int i = 0; i < pg->size; i++) idx[i] = i;
    MPI_Group_translate_ranks(mine, pg->size, idx, world, pg->world_ranks);
    free(idx);
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    return HS_OK;
}

hs_pg *hs_pg_mpi_create(hs_comm *c, MPI_Comm mc, const char *name, int slot, hs_error *e) {
    hs_pg *pg = calloc(1, sizeof *pg);
    hs_mpi_group *g = calloc(1, sizeof *g);
    if (!pg || !g) {
        free(pg);
        free(g);
        MPI_Comm_free(&mc);
        hs_error_oom(e, "creating group '%s': %zu bytes", name, sizeof *pg + sizeof *g);
        return NULL;
    }
    snprintf(pg->name, sizeof pg->name, "%s", name);
    pg->comm = c;
    pg->backend = &mpi_backend;
    pg->ctx = g;
    pg->slot = slot;
    MPI_Comm_rank(mc, &pg->rank);
    MPI_Comm_size(mc, &pg->size);
    g->name = pg->name;
    g->comm = c;
    g->pool = &c->pool;
    g->rank = pg->rank;
    g->size = pg->size;
    g->coll = mc;
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    int rc = MPI_Comm_dup(mc, &g->p2p);
    if (rc != MPI_SUCCESS) {
        hs_error_set(e, HS_ERR_COMM, "creating group '%s': MPI_Comm_dup failed (code %d)", name,
                     rc);
        MPI_Comm_free(&g->coll);
        free(g);
        free(pg);
        return NULL;
    }
    hs_status st = hs_shm_create(mc, g->pool, pg->name, &g->shm, e);
    if (st == HS_OK) st = mpi_tables(pg, g, mc, e);
    if (st != HS_OK) {
        hs_pg_free(pg);
        return NULL;
    }
    return pg;
}

void hs_pg_free(hs_pg *g) {
    if (!g) return;
    if (g->dev_backend) g->dev_backend->destroy(g->dev_ctx);
    g->backend->destroy(g->ctx);
    free(g->world_ranks);
    free(g->fp_all);
    free(g);
}
