/* comm/mpi_group.c — what the MPI backend (pg_mpi.c) and the ring
 * algorithms (ring.c) share about a group: MPI error text, growing the
 * staging buffers, and send/recv of byte ranges of any length. */
#include <stdio.h>

#include "comm/mpi_group.h"

/* Keep every message below INT_MAX bytes (MPI counts are int). */
#define PIECE_BYTES ((size_t)1 << 30)

const char *hs_mpi_strerror(int rc, char *buf, size_t cap) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", rc);
    snprintf(buf, cap, "%s", text);
    return buf;
}

hs_status hs_mpi_fail(const hs_mpi_group *g, hs_error *e, int rc, const char *call,
                      const char *op) {
    char why[MPI_MAX_ERROR_STRING];
    return hs_error_set(e, HS_ERR_COMM,
                        "%s on group '%s' (rank %d of %d): %s failed: %s; check that every "
                        "rank of the group issues the same collectives with the same counts",
                        op, g->name, g->rank, g->size, call, hs_mpi_strerror(rc, why, sizeof why));
}

hs_status hs_mpi_group_stage(hs_mpi_group *g, size_t bytes, hs_error *e) {
    if (bytes <= g->stage_cap) return HS_OK;
    size_t cap = g->stage_cap ? g->stage_cap : 4096;
    while (cap < bytes) cap *= 2;
    for (int i = 0; i < 2; i++) {
        hs_pool_free(g->pool, g->stage[i]);
        g->stage[i] = hs_pool_alloc(g->pool, cap);
    }
    if (g->stage[0] && g->stage[1]) {
        g->stage_cap = cap;
        return HS_OK;
    }
    for (int i = 0; i < 2; i++) hs_pool_free(g->pool, g->stage[i]), g->stage[i] = NULL;
    g->stage_cap = 0;
    char what[128];
    snprintf(what, sizeof what, "the staging buffers of group '%s' (2 of them)", g->name);
    return hs_pool_oom(g->pool, cap, what, e);
}

/* Pieces are posted round by round; a rank's k-th send piece is its right
 * neighbour's k-th receive piece, so every round completes. */
int hs_mpi_sendrecv_bytes(const void *sbuf, size_t sbytes, int dst, void *rbuf, size_t rbytes,
                          int src, MPI_Comm comm) {
    if (sbytes <= PIECE_BYTES && rbytes <= PIECE_BYTES)
        return MPI_Sendrecv(sbuf, (int)sbytes, MPI_BYTE, dst, HS_RING_TAG, rbuf, (int)rbytes,
                            MPI_BYTE, src, HS_RING_TAG, comm, MPI_STATUS_IGNORE);
    const char *s = sbuf;
    char *r = rbuf;
    size_t ns = (sbytes + PIECE_BYTES - 1) / PIECE_BYTES,
           nr = (rbytes + PIECE_BYTES - 1) / PIECE_BYTES;
    if (ns == 0) ns = 1; /* an empty chunk still travels, as an empty message */
    if (nr == 0) nr = 1;
    for (size_t k = 0; k < ns || k < nr; k++) {
        MPI_Request req[2];
        int n = 0, rc;
        if (k < nr) {
            size_t len = rbytes - k * PIECE_BYTES < PIECE_BYTES ? rbytes - k * PIECE_BYTES
                                                                : PIECE_BYTES;
            if (rbytes == 0) len = 0;
            rc = MPI_Irecv(r + k * PIECE_BYTES, (int)len, MPI_BYTE, src, HS_RING_TAG, comm,
                           &req[n++]);
            if (rc != MPI_SUCCESS) return rc;
        }
        if (k < ns) {
            size_t len = sbytes - k * PIECE_BYTES < PIECE_BYTES ? sbytes - k * PIECE_BYTES
                                                                : PIECE_BYTES;
            if (sbytes == 0) len = 0;
            rc = MPI_Isend(s + k * PIECE_BYTES, (int)len, MPI_BYTE, dst, HS_RING_TAG, comm,
                           &req[n++]);
            if (rc != MPI_SUCCESS) return rc;
        }
        rc = MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return rc;
    }
    return MPI_SUCCESS;
}
