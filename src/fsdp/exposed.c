/* Timing of the compute thread's waits on FSDP collectives. */
#include "fsdp/exposed.h"

hs_status hs_fsdp_exposed_wait(hs_fsdp_exposed *x, hs_fsdp_wait_kind k, hs_work *w, hs_error *e) {
    if (!x) return hs_work_wait(w, e);
    HS_ASSERT((unsigned)k < HS_FSDP_WAIT_KIND_COUNT);
    double t0 = hs_now();
    hs_status st = hs_work_wait(w, e);
    double dt = hs_now() - t0;
    x->seconds[k] += dt;
    x->waits[k]++;
    if (x->dev) hs_device_profile_add(x->dev, HS_PROF_COMM_WAIT, dt, 0.0);
    return st;
}

double hs_fsdp_exposed_total(const hs_fsdp_exposed *x) {
    double s = 0.0;
    for (int k = 0; k < HS_FSDP_WAIT_KIND_COUNT; k++) s += x->seconds[k];
    return s;
}
