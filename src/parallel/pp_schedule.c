/* Pipeline schedules: which chunks each stage holds and which forward and
 * backward it runs when (parallel.h). */
#include <stdlib.h>
#include <string.h>

#include "hypershard/parallel.h"

bool hs_pp_schedule_parse(const char *name, hs_pp_schedule_kind *out) {
    if (!strcmp(name, "gpipe")) return *out = HS_PP_GPIPE, true;
    if (!strcmp(name, "1f1b")) return *out = HS_PP_1F1B, true;
    if (!strcmp(name, "interleaved_1f1b")) return *out = HS_PP_INTERLEAVED, true;
    return false;
}

static int imin(int a, int b) { return a < b ? a : b; }

void hs_pp_stage_chunks(const hs_config *cfg, int stage, hs_model_stage *out) {
    int pp = cfg->accelerator.pp_size, V = cfg->accelerator.pp_virtual_stages;
    V = V > 1 ? V : 1;
    HS_ASSERT(V <= HS_MODEL_MAX_CHUNKS && stage >= 0 && stage < pp);
    int first[HS_PP_MAX_STAGES], count[HS_PP_MAX_STAGES];
    hs_config_pp_stages(cfg, first, count);
    *out = (hs_model_stage){.n_chunks = V};
    for (int v = 0; v < V; v++) {
        out->first_layer[v] = first[v * pp + stage];
        out->n_layers[v] = count[v * pp + stage];
    }
}

/* The k-th forward (or backward) of an interleaved stage: rounds of pp
 * micro-batches go through the chunks in turn, forward in chunk order and
 * backward in reverse (Narayanan et al. 2021; Megatron-LM's schedule). */
static hs_pp_action interleaved_at(hs_pp_kind kind, int pp, int V, int k) {
    int group = k / pp, v = group % V;
    int mb = (group / V) * pp + k % pp;
    return (hs_pp_action){kind, kind == HS_PP_FORWARD ? v : V - 1 - v, mb};
}

void hs_pp_schedule(hs_pp_schedule_kind kind, int pp, int stage, int M, int V, hs_pp_action *out) {
    int n = 0;
    if (kind == HS_PP_GPIPE) {
        for (int i = 0; i < M; i++) out[n++] = (hs_pp_action){HS_PP_FORWARD, 0, i};
        for (int i = 0; i < M; i++) out[n++] = (hs_pp_action){HS_PP_BACKWARD, 0, i};
        return;
    }
    /* 1F1B: pp-1-s forwards fill the pipe; interleaved: 2 (pp-1-s) plus a
     * round per further chunk. Then one forward and one backward in turn,
     * then the remaining backwards. */
    int total = M * (kind == HS_PP_INTERLEAVED ? V : 1);
    int w = kind == HS_PP_INTERLEAVED ? 2 * (pp - 1 - stage) + (V - 1) * pp : pp - 1 - stage;
    w = imin(w, total);
    int f = 0, b = 0;
    for (; f < total; f++) {
        out[n++] = kind == HS_PP_INTERLEAVED ? interleaved_at(HS_PP_FORWARD, pp, V, f)
                                             : (hs_pp_action){HS_PP_FORWARD, 0, f};
        if (f < w) continue;
        out[n++] = kind == HS_PP_INTERLEAVED ? interleaved_at(HS_PP_BACKWARD, pp, V, b)
                                             : (hs_pp_action){HS_PP_BACKWARD, 0, b};
        b++;
    }
    for (; b < total; b++)
        out[n++] = kind == HS_PP_INTERLEAVED ? interleaved_at(HS_PP_BACKWARD, pp, V, b)
                                             : (hs_pp_action){HS_PP_BACKWARD, 0, b};
}

hs_status hs_pp_slots(hs_pp_schedule_kind kind, int pp, int stage, int M, int V, int *slots,
                      hs_error *e) {
    /* hs_config_validate bounds the schedule (HS_PP_MAX_ACTIONS). */
    int64_t actions;
    HS_ASSERT(M >= 1 && V >= 1 && hs_prod_i64((const int64_t[]){2, M, V}, 3, &actions) &&
              actions <= HS_PP_MAX_ACTIONS);
    int n = (int)actions, most = 1;
    hs_pp_action *a = malloc(sizeof *a * (size_t)n);
    int *open = calloc((size_t)V, sizeof *open);
    if (!a || !open) {
        free(a);
        free(open);
        return hs_error_oom(e, "pipeline: a schedule of %d actions", n);
    }
    hs_pp_schedule(kind, pp, stage, M, V, a);
    /* Micro-batches of one chunk forwarded and not yet backwarded. */
    for (int k = 0; k < n; k++) {
        open[a[k].chunk] += a[k].kind == HS_PP_FORWARD ? 1 : -1;
        if (open[a[k].chunk] > most) most = open[a[k].chunk];
    }
    free(a);
    free(open);
    *slots = most;
    return HS_OK;
}
