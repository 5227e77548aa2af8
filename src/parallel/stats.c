/* The accounting every TP / CP collective ends with (parallel.h). */
#include "hypershard/parallel.h"

void hs_parallel_done(hs_comm *comm, hs_parallel_stats *stats, double t0, int64_t bytes,
                      hs_status st, const hs_error *e) {
    if (st != HS_OK) hs_comm_abort(comm, e);
    stats->seconds += hs_now() - t0;
    stats->calls++;
    stats->bytes += bytes;
}
