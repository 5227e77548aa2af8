/* bench/bench_breakdown.h — `hypershard bench step --breakdown`: the
 * labeller that names each GEMM by the model's parameter it reads or
 * writes, and the table (and JSON) of where a step's wall time goes by op
 * class (hs_prof_class, timed by the device profile, src/device/profile.c). */
#ifndef HS_BENCH_BREAKDOWN_H
#define HS_BENCH_BREAKDOWN_H

#include <stdio.h>

#include "hypershard/device.h"
#include "hypershard/model.h"

/* Each parameter's GEMM class (by its FQN: q/k/v_proj, o_proj, gate/up_proj,
 * down_proj, lm_head or a tied embedding) and the model whose live data
 * and grad pointers a GEMM's operands are matched against. */
typedef struct hs_bench_labels {
    hs_model *m;
    int n;
    hs_prof_class *cls;
} hs_bench_labels;

/* Fills l for m and sets it as d's labeller. HS_ERR_OOM when the class
 * array cannot be allocated. */
hs_status hs_bench_labels_set(hs_bench_labels *l, hs_device *d, hs_model *m, hs_error *e);
void hs_bench_labels_free(hs_bench_labels *l);

/* One model's breakdown: `steps` profiled steps, each right after a plain
 * (unprofiled) one; plain_s and profiled_s are their mean wall times, the
 * _best ones their fastest (on a shared machine, the closest to what the
 * step costs alone), and st the profile's totals over the profiled steps. */
typedef struct hs_bench_breakdown {
    int steps;
    double plain_s, profiled_s;
    double plain_best, profiled_best;
    hs_prof_stats st;
} hs_bench_breakdown;

/* "other": the mean profiled step minus the classes' mean time, seconds. */
double hs_bench_breakdown_other(const hs_bench_breakdown *b);
/* The table: class, ms/step, share of the profiled step, GFLOP/s or GB/s,
 * then other, the total and how it compares with the plain step. */
void hs_bench_breakdown_print(FILE *f, const char *name, const hs_bench_breakdown *b);
/* The same as a JSON object (no trailing newline). */
void hs_bench_breakdown_json(FILE *f, const hs_bench_breakdown *b);

#endif
