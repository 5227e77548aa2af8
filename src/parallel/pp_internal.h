/* parallel/pp_internal.h — what the pipeline's step runner (pp_run.c)
 * tells its hand-over context (pp.c). */
#ifndef HS_PARALLEL_PP_INTERNAL_H
#define HS_PARALLEL_PP_INTERNAL_H

#include "hypershard/parallel.h"

/* Time spent inside a stage action of `kind` (hs_pp_busy_seconds). */
void hs_pp_add_busy(hs_pp *p, hs_pp_kind kind, double seconds);

/* ZB-V's list of stage `stage` (pp_zbv.c): 6 M actions over its two
 * chunks, from the simulation hs_pp_schedule describes. */
/* stage < 0: all pp lists, stage after stage (out holds pp x 6 M). */
hs_status hs_pp_zbv_list(int pp, int stage, int M, hs_pp_action *out, hs_error *e);

#endif
