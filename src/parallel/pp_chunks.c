/* Where a pipeline's chunks live (parallel.h): the model chunk each stage
 * runs as its local chunk v, back from a model chunk to its stage, and a
 * stage's blocks. One chunk per stage, interleaved (chunk c on stage
 * c mod pp) or a V (the table's v_shape: hs_config_pp_chunk). */
#include "hypershard/parallel.h"

int hs_pp_model_chunk(hs_pp_schedule_kind kind, int pp, int stage, int v) {
    return hs_pp_schedule_chunk(hs_pp_schedule_info_of(kind), pp, stage, v);
}

void hs_pp_chunk_home(hs_pp_schedule_kind kind, int pp, int c, int *stage, int *v) {
    if (hs_pp_schedule_info_of(kind)->v_shape && c >= pp) *stage = 2 * pp - 1 - c, *v = 1;
    else *stage = c % pp, *v = c / pp;
}

void hs_pp_stage_chunks(const hs_accel_config *accel, int model_layers, int stage,
                        hs_model_stage *out) {
    int pp = accel->pp_size, V = accel->pp_virtual_stages;
    V = V > 1 ? V : 1;
    HS_ASSERT(V <= HS_MODEL_MAX_CHUNKS && stage >= 0 && stage < pp);
    int first[HS_PP_MAX_STAGES], count[HS_PP_MAX_STAGES];
    hs_config_pp_stages(accel, model_layers, first, count);
    *out = (hs_model_stage){.n_chunks = V};
    for (int v = 0; v < V; v++) {
        int c = hs_config_pp_chunk(accel, stage, v);
        out->first_layer[v] = first[c];
        out->n_layers[v] = count[c];
    }
}
