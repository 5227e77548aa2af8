/* comm/shm.h — the intra-node path of the mpi backend for reduce-scatter,
 * all-reduce and all-gather.
 *
 * When every rank of a group runs on one node, each rank reads its peers'
 * buffers directly (Linux cross-memory attach, process_vm_readv) instead of
 * passing them around a ring: a reduce-scatter reads the W-1 peers' copies
 * of its own chunk in L2-sized tiles and reduces them in one pass, without
 * staging whole chunks in memory and without W-1 dependent steps.
 *
 * Ranks meet in a small segment shared through MPI_Win_allocate_shared: one
 * cache-line slot per rank with its process id, the addresses of the
 * buffers of the current collective and a barrier counter. The counters are
 * C11 atomics with release/acquire ordering, not MPI one-sided atomics
 * (Open MPI 4.1's osc/rdma crashes on those under MPI_THREAD_MULTIPLE). */
#ifndef HYPERSHARD_COMM_SHM_H
#define HYPERSHARD_COMM_SHM_H

#include <stdatomic.h>

#include "comm/group.h"

/* One rank's slot in the shared segment; a cache-line pair of its own so
 * that spinning on one rank's counter never contends with another's. */
typedef struct hs_shm_slot {
    atomic_llong arrived; /* the last barrier epoch this rank entered */
    long long pid;
    uintptr_t addr;      /* the buffer of the current collective */
    atomic_int wake;     /* futex word: raised after each `arrived` */
    atomic_int sleepers; /* peers asleep on `wake` */
    char pad[128 - sizeof(atomic_llong) - sizeof(long long) - sizeof(uintptr_t) -
             2 * sizeof(atomic_int)];
} hs_shm_slot;

typedef struct hs_shm {
    const char *name; /* the group's */
    hs_pool *pool;
    int rank, size;
    MPI_Win win;
    hs_shm_slot **slots; /* [size], each rank's slot as mapped here */
    long long epoch;     /* barriers passed; the same count on every rank */
    /* Reduction tiles, allocated at the first reduction, then reused:
     * `raw` receives a peer's tile, `tmp` widens it, `acc` sums in fp32. */
    void *raw;
    float *tmp, *acc;
} hs_shm;

/* Collective over `coll`. *out NULL (after agreeing with every rank) when
 * the group has one rank, spans nodes, HS_COMM_SHM=0 is set on some rank,
 * or a cross-process read is refused (another PID namespace, ptrace
 * policy); HS_ERR_OOM on every rank when one has no memory for it. */
hs_status hs_shm_create(MPI_Comm coll, hs_pool *pool, const char *name, hs_shm **out, hs_error *e);
/* Collective over the group, like MPI_Win_free. */
void hs_shm_free(hs_shm *s);

/* Publish this rank's buffer of the next collective. Only before its first
 * barrier: peers read the address until its last barrier. */
void hs_shm_publish(hs_shm *s, const void *addr);
/* Wait until every rank of the group has reached the same barrier. */
void hs_shm_barrier(hs_shm *s);
/* Copy `bytes` from address `remote` of group rank `peer` to `dst`. */
hs_status hs_shm_read(hs_shm *s, int peer, void *dst, uintptr_t remote, size_t bytes,
                      const char *op, hs_error *e);

/* shm_coll.c. Same arguments and results as the ring forms, except the
 * rounding of 16-bit reductions (one rounding, docs/comm.md). */
hs_status hs_shm_reduce_scatter(hs_shm *s, void *out, const void *in, int64_t count, hs_dtype dt,
                                hs_reduce_op op, hs_error *e);
hs_status hs_shm_all_reduce(hs_shm *s, void *buf, int64_t count, hs_dtype dt, hs_reduce_op op,
                            hs_error *e);
hs_status hs_shm_all_gather(hs_shm *s, void *out, const void *in, int64_t count, hs_dtype dt,
                            hs_error *e);
/* count elements to and from each rank; in and out must not overlap. */
hs_status hs_shm_all_to_all(hs_shm *s, void *out, const void *in, int64_t count, hs_dtype dt,
                            hs_error *e);
/* MPI_Alltoallv's layout in elements, counts and displacements checked by
 * the caller (none negative); a peer's send count must equal the
 * receiver's recv count (HS_ERR_COMM naming both otherwise). */
hs_status hs_shm_all_to_allv(hs_shm *s, void *out, const int64_t *recv_counts,
                             const int64_t *recv_displs, const void *in, const int64_t *send_counts,
                             const int64_t *send_displs, hs_dtype dt, hs_error *e);

#endif
