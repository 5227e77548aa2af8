/* comm/mpi_group.h — the MPI backend's group state and its helpers
 * (mpi_group.c), shared by the backend (pg_mpi.c) and the ring algorithms
 * (ring.c). */
#ifndef HYPERSHARD_COMM_MPI_GROUP_H
#define HYPERSHARD_COMM_MPI_GROUP_H

#include "comm/group.h"
#include "comm/shm.h"

/* The tag of ring traffic on a group's collective communicator. */
#define HS_RING_TAG 11

typedef struct hs_mpi_group {
    const char *name; /* the hs_pg's name */
    hs_pool *pool;
    MPI_Comm coll; /* collectives */
    MPI_Comm p2p;  /* send/recv, so user tags never meet ring traffic */
    int rank, size;
    /* Ring staging: two buffers of stage_cap bytes each, grown, never
     * shrunk, reused by every collective of the group. */
    void *stage[2];
    size_t stage_cap;
    /* all_to_allv's int counts and displacements: [4][size]. */
    int *vcounts;
    /* The intra-node path of reduce-scatter, all-reduce and all-gather;
     * NULL when the group spans nodes (then the ring runs). */
    hs_shm *shm;
    hs_comm *comm; /* its canonical_sums */
} hs_mpi_group;

/* Grow both staging buffers to at least `bytes`. */
hs_status hs_mpi_group_stage(hs_mpi_group *g, size_t bytes, hs_error *e);

/* An MPI failure as HS_ERR_COMM naming the call, the op and the group. */
hs_status hs_mpi_fail(const hs_mpi_group *g, hs_error *e, int rc, const char *call, const char *op);

/* MPI_Sendrecv of byte ranges of any length (split below INT_MAX). */
int hs_mpi_sendrecv_bytes(const void *sbuf, size_t sbytes, int dst, void *rbuf, size_t rbytes,
                          int src, MPI_Comm comm);

#endif
