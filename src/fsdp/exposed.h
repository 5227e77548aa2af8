/* fsdp/exposed.h — exposed communication: the time the compute thread
 * spends blocked in hs_work_wait on FSDP's own collectives. Communication
 * that finished while compute ran costs nothing here; that is what prefetch
 * and the reduction pipeline are for, and this is how they are measured. */
#ifndef HS_FSDP_EXPOSED_H
#define HS_FSDP_EXPOSED_H

#include <stdint.h>

#include "hypershard/comm.h"

typedef enum hs_fsdp_wait_kind {
    HS_FSDP_WAIT_ALL_GATHER = 0,
    HS_FSDP_WAIT_REDUCE_SCATTER,
    HS_FSDP_WAIT_ALL_REDUCE,
    HS_FSDP_WAIT_KIND_COUNT
} hs_fsdp_wait_kind;

typedef struct hs_fsdp_exposed {
    double seconds[HS_FSDP_WAIT_KIND_COUNT]; /* blocked in hs_work_wait */
    int64_t waits[HS_FSDP_WAIT_KIND_COUNT];  /* handles waited on       */
    hs_device *dev; /* whose profile (if any) counts the waits as comm waits */
} hs_fsdp_exposed;

/* hs_work_wait, timed into x (x may be NULL: plain wait). */
hs_status hs_fsdp_exposed_wait(hs_fsdp_exposed *x, hs_fsdp_wait_kind k, hs_work *w, hs_error *e);
double hs_fsdp_exposed_total(const hs_fsdp_exposed *x);

#endif
