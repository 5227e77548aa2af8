/* parallel/tp_internal.h — the hs_tp context shared by the plan
 * (tp_plan.c), the region collectives (tp_ops.c) and the layout helpers
 * (tp_layout.c). */
#ifndef HS_PARALLEL_TP_INTERNAL_H
#define HS_PARALLEL_TP_INTERNAL_H

#include "hypershard/parallel.h"

struct hs_tp {
    hs_comm *comm;
    hs_stream *stream; /* the device's compute stream: every collective's */
    hs_pg *group;
    int size, rank;
    hs_model_ops ops; /* ops.ctx == this */
    hs_parallel_stats stats;
};

#endif
