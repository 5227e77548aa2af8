/* comm/ring.h — the ring reduce-scatter, all-reduce and all-gather of
 * ring.c over an MPI group's point-to-point messages. */
#ifndef HYPERSHARD_COMM_RING_H
#define HYPERSHARD_COMM_RING_H

#include "comm/mpi_group.h"

/* Counts are in elements of dt. */
hs_status hs_ring_reduce_scatter(hs_mpi_group *g, void *out, const void *in, int64_t count,
                                 hs_dtype dt, hs_reduce_op op, hs_error *e);
hs_status hs_ring_all_reduce(hs_mpi_group *g, void *buf, int64_t count, hs_dtype dt,
                             hs_reduce_op op, hs_error *e);
hs_status hs_ring_all_gather(hs_mpi_group *g, void *out, const void *in, int64_t count, hs_dtype dt,
                             hs_error *e);

#endif
