/* The pipeline schedules' facts (config.h), one row each, read by the
 * config's checks, the action lists (parallel/pp_schedule.c), the plan's
 * replay and its search. */
#include <string.h>

#include "hypershard/config.h"

static const hs_pp_schedule_info schedules[HS_PP_N_SCHEDULES] = {
    {.kind = HS_PP_GPIPE, .name = "gpipe", .min_chunks = 1, .max_chunks = 1},
    {.kind = HS_PP_1F1B,
     .name = "1f1b",
     .min_chunks = 1,
     .max_chunks = 1,
     .fills_pipe = true,
     .searched = true},
    {.kind = HS_PP_INTERLEAVED,
     .name = "interleaved_1f1b",
     .min_chunks = 2,
     .max_chunks = HS_PP_MAX_VIRTUAL,
     .fills_pipe = true,
     .rounds_of_pp = true,
     .searched = true},
    {.kind = HS_PP_ZB1P,
     .name = "zb1p",
     .min_chunks = 1,
     .max_chunks = 1,
     .splits_backward = true,
     .fills_pipe = true,
     .searched = true},
    {.kind = HS_PP_ZBV,
     .name = "zbv",
     .min_chunks = 2,
     .max_chunks = 2,
     .v_shape = true,
     .splits_backward = true,
     .fills_pipe = true,
     .searched = true},
};

const hs_pp_schedule_info *hs_pp_schedule_info_of(hs_pp_schedule_kind kind) {
    HS_ASSERT((int)kind >= 0 && kind < HS_PP_N_SCHEDULES);
    return &schedules[kind];
}

const hs_pp_schedule_info *hs_pp_schedule_find(const char *name) {
    for (int k = 0; name && k < HS_PP_N_SCHEDULES; k++)
        if (!strcmp(schedules[k].name, name)) return &schedules[k];
    return NULL;
}

int hs_pp_schedule_passes(const hs_pp_schedule_info *info) { return info->splits_backward ? 3 : 2; }

int hs_pp_schedule_chunk(const hs_pp_schedule_info *info, int pp, int stage, int v) {
    if (info && info->v_shape && v == 1) return 2 * pp - 1 - stage;
    return stage + v * pp;
}
