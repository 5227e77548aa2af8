/* Pipeline schedules: which chunks each stage holds and which forward and
 * backward it runs when (parallel.h). */
#include <stdlib.h>

#include "parallel/pp_internal.h"

bool hs_pp_schedule_parse(const char *name, hs_pp_schedule_kind *out) {
    const hs_pp_schedule_info *info = hs_pp_schedule_find(name);
    if (info) *out = info->kind;
    return info != NULL;
}

bool hs_pp_schedule_splits(hs_pp_schedule_kind kind) {
    return hs_pp_schedule_info_of(kind)->splits_backward;
}

int64_t hs_pp_schedule_length(hs_pp_schedule_kind kind, int M, int V) {
    return hs_pp_schedule_passes(hs_pp_schedule_info_of(kind)) * (int64_t)M * V;
}

static int imin(int a, int b) { return a < b ? a : b; }

/* The k-th forward (or backward) of an interleaved stage: rounds of pp
 * micro-batches go through the chunks in turn, forward in chunk order and
 * backward in reverse (Narayanan et al. 2021; Megatron-LM's schedule). */
static hs_pp_action interleaved_at(hs_pp_kind kind, int pp, int V, int k) {
    int group = k / pp, v = group % V;
    int mb = (group / V) * pp + k % pp;
    return (hs_pp_action){kind, kind == HS_PP_FORWARD ? v : V - 1 - v, mb};
}

/* ZB-H1: 1F1B's forwards and input backwards; stage s keeps the weight
 * passes of its last s input backwards for later, so the last stage,
 * which 1F1B leaves idle longest at the end of the step, fills that time
 * with them, and the first runs each W at once (the paper's figure 3). */
static int zb1p(int pp, int stage, int M, hs_pp_action *out) {
    int n = 0, warm = imin(pp - 1 - stage, M), f = 0, b = 0, w = 0;
    for (; f < warm; f++) out[n++] = (hs_pp_action){HS_PP_FORWARD, 0, f};
    while (b < M) {
        if (f < M) out[n++] = (hs_pp_action){HS_PP_FORWARD, 0, f++};
        out[n++] = (hs_pp_action){HS_PP_BACKWARD, 0, b++};
        if (b - w > stage) out[n++] = (hs_pp_action){HS_PP_WEIGHT, 0, w++};
    }
    while (w < M) out[n++] = (hs_pp_action){HS_PP_WEIGHT, 0, w++};
    return n;
}

hs_status hs_pp_schedule_all(hs_pp_schedule_kind kind, int pp, int M, int V, hs_pp_action *out,
                             hs_error *e) {
    if (kind == HS_PP_ZBV) {
        HS_ASSERT(V == 2);
        return hs_pp_zbv_list(pp, -1, M, out, e);
    }
    int64_t n = hs_pp_schedule_length(kind, M, V);
    hs_status rc = HS_OK;
    for (int s = 0; rc == HS_OK && s < pp; s++)
        rc = hs_pp_schedule(kind, pp, s, M, V, out + s * n, e);
    return rc;
}

hs_status hs_pp_schedule(hs_pp_schedule_kind kind, int pp, int stage, int M, int V,
                         hs_pp_action *out, hs_error *e) {
    int n = 0;
    if (kind == HS_PP_ZB1P) {
        HS_ASSERT(V == 1);
        (void)zb1p(pp, stage, M, out);
        return HS_OK;
    }
    if (kind == HS_PP_ZBV) {
        HS_ASSERT(V == 2);
        return hs_pp_zbv_list(pp, stage, M, out, e);
    }
    if (kind == HS_PP_GPIPE) {
        for (int i = 0; i < M; i++) out[n++] = (hs_pp_action){HS_PP_FORWARD, 0, i};
        for (int i = 0; i < M; i++) out[n++] = (hs_pp_action){HS_PP_BACKWARD, 0, i};
        return HS_OK;
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
    return HS_OK;
}

/* The most micro-batches of one chunk forwarded whose slot is not free
 * yet in stage list a: a slot frees at the backward, or at the weight pass
 * of a split one. `open` holds V counters at zero. */
static int most_open(hs_pp_schedule_kind kind, const hs_pp_action *a, int n, int V, int *open) {
    hs_pp_kind frees = hs_pp_schedule_splits(kind) ? HS_PP_WEIGHT : HS_PP_BACKWARD;
    int most = 1;
    for (int k = 0; k < n; k++) {
        open[a[k].chunk] += a[k].kind == HS_PP_FORWARD ? 1 : a[k].kind == frees ? -1 : 0;
        if (open[a[k].chunk] > most) most = open[a[k].chunk];
    }
    return most;
}

/* slots[s] for every stage s < pp (stage < 0), or *slots for one. */
static hs_status slots_of(hs_pp_schedule_kind kind, int pp, int stage, int M, int V, int *slots,
                          hs_error *e) {
    /* hs_config_validate bounds the schedule (HS_PP_MAX_ACTIONS). */
    HS_ASSERT(M >= 1 && V >= 1 && (int64_t)M * V <= HS_PP_MAX_ACTIONS);
    int64_t actions = hs_pp_schedule_length(kind, M, V);
    HS_ASSERT(actions <= HS_PP_MAX_ACTIONS);
    int n = (int)actions, lists = stage < 0 ? pp : 1;
    hs_pp_action *a = malloc(sizeof *a * (size_t)n * (size_t)lists);
    int *open = calloc((size_t)V * (size_t)lists, sizeof *open); /* V a stage */
    hs_status rc = a && open ? HS_OK
                             : hs_error_oom(e, "pipeline: %d schedules of %d actions", lists, n);
    if (rc == HS_OK)
        rc = stage < 0 ? hs_pp_schedule_all(kind, pp, M, V, a, e)
                       : hs_pp_schedule(kind, pp, stage, M, V, a, e);
    for (int s = 0; rc == HS_OK && s < lists; s++)
        slots[s] = most_open(kind, a + (size_t)s * n, n, V, open + (size_t)s * V);
    free(a);
    free(open);
    return rc;
}

hs_status hs_pp_slots(hs_pp_schedule_kind kind, int pp, int stage, int M, int V, int *slots,
                      hs_error *e) {
    HS_ASSERT(stage >= 0);
    return slots_of(kind, pp, stage, M, V, slots, e);
}

hs_status hs_pp_slots_all(hs_pp_schedule_kind kind, int pp, int M, int V, int *slots, hs_error *e) {
    return slots_of(kind, pp, -1, M, V, slots, e);
}

/* ------------------------------------------------------------ the check */

/* One stage's list, with what the check tracks of it. */
typedef struct sim_stage {
    hs_pp_action *a;
    int n, next;
    char *done; /* [3][V][M]: F, B, W of (chunk, micro-batch) ran */
} sim_stage;

static char *done_at(const sim_stage *st, hs_pp_kind k, int v, int mb, int V, int M) {
    return &st->done[((int64_t)k * V + v) * M + mb];
}

static const char *kind_name(hs_pp_kind k) {
    return k == HS_PP_FORWARD ? "F" : k == HS_PP_BACKWARD ? "B" : "W";
}

/* Whether stage s can run a now: its own earlier pass done, and the
 * input from the neighbouring model chunk there. */
static bool ready(const sim_stage *sts, hs_pp_schedule_kind kind, int pp, int s, int M, int V,
                  hs_pp_action a) {
    int c = hs_pp_model_chunk(kind, pp, s, a.chunk), last = pp * V - 1;
    const sim_stage *me = &sts[s];
    if (a.kind == HS_PP_WEIGHT) return *done_at(me, HS_PP_BACKWARD, a.chunk, a.micro_batch, V, M);
    if (a.kind == HS_PP_BACKWARD && !*done_at(me, HS_PP_FORWARD, a.chunk, a.micro_batch, V, M))
        return false;
    int from = a.kind == HS_PP_FORWARD ? c - 1 : c + 1; /* the chunk the input comes from */
    if (from < 0 || from > last) return true;
    int fs, fv;
    hs_pp_chunk_home(kind, pp, from, &fs, &fv);
    return *done_at(&sts[fs], a.kind, fv, a.micro_batch, V, M);
}

/* Each list on its own: every action once, in micro-batch order per chunk
 * and kind, B after F and W after B. */
static hs_status check_list(const sim_stage *st, bool split, int s, int M, int V, hs_error *e) {
    int kinds = split ? 3 : 2;
    int *count = calloc((size_t)3 * V, sizeof *count);
    if (!count) return hs_error_oom(e, "pipeline: the schedule check's counters");
    hs_status rc = HS_OK;
    for (int k = 0; rc == HS_OK && k < st->n; k++) {
        hs_pp_action a = st->a[k];
        bool known = (int)a.kind < kinds && a.chunk >= 0 && a.chunk < V;
        int *c = known ? &count[a.kind * V + a.chunk] : NULL;
        bool in_order = known && a.micro_batch == *c;
        bool after = in_order &&
                     (a.kind == HS_PP_FORWARD || count[(a.kind - 1) * V + a.chunk] > a.micro_batch);
        if (!in_order || !after)
            rc = hs_error_set(e, HS_ERR_INTERNAL,
                              "pipeline schedule: stage %d's action %d, %s of micro-batch %d of "
                              "chunk %d, %s",
                              s, k, kind_name(a.kind), a.micro_batch, a.chunk,
                              !in_order ? "is out of micro-batch order or repeated"
                                        : "comes before the action it depends on");
        else (*c)++;
    }
    for (int k = 0; rc == HS_OK && k < kinds * V; k++)
        if (count[k] != M)
            rc = hs_error_set(e, HS_ERR_INTERNAL,
                              "pipeline schedule: stage %d runs %s of chunk %d %d times, not %d", s,
                              kind_name((hs_pp_kind)(k / V)), k % V, count[k], M);
    free(count);
    return rc;
}

/* Runs the lists of every stage together; sts[s].a and .n filled. */
static hs_status simulate(sim_stage *sts, hs_pp_schedule_kind kind, int pp, int M, int V,
                          bool split, hs_error *e) {
    hs_status rc = HS_OK;
    for (int s = 0; rc == HS_OK && s < pp; s++) {
        sts[s].next = 0;
        sts[s].done = calloc((size_t)3 * V * M, 1);
        if (!sts[s].done) return hs_error_oom(e, "pipeline: the schedule check");
        rc = check_list(&sts[s], split, s, M, V, e);
    }
    /* Every stage runs its next action once its input is there; a round
     * in which none can is a hang. */
    for (bool moved = true; rc == HS_OK && moved;) {
        moved = false;
        for (int s = 0; s < pp; s++) {
            sim_stage *st = &sts[s];
            while (st->next < st->n && ready(sts, kind, pp, s, M, V, st->a[st->next])) {
                hs_pp_action a = st->a[st->next++];
                *done_at(st, a.kind, a.chunk, a.micro_batch, V, M) = 1;
                moved = true;
            }
        }
    }
    for (int s = 0; rc == HS_OK && s < pp; s++)
        if (sts[s].next < sts[s].n) {
            hs_pp_action a = sts[s].a[sts[s].next];
            rc = hs_error_set(e, HS_ERR_INTERNAL,
                              "pipeline schedule: stage %d waits forever at its action %d, %s of "
                              "micro-batch %d of chunk %d: its input never comes",
                              s, sts[s].next, kind_name(a.kind), a.micro_batch, a.chunk);
        }
    return rc;
}

hs_status hs_pp_actions_check(hs_pp_schedule_kind kind, int pp, int M, int V,
                              const hs_pp_action *const *lists, const int *lens, hs_error *e) {
    sim_stage *sts = calloc((size_t)pp, sizeof *sts);
    if (!sts) return hs_error_oom(e, "pipeline: the schedule check");
    for (int s = 0; s < pp; s++) sts[s] = (sim_stage){.a = (hs_pp_action *)lists[s], .n = lens[s]};
    hs_status rc = simulate(sts, kind, pp, M, V, hs_pp_schedule_splits(kind), e);
    for (int s = 0; s < pp; s++) free(sts[s].done);
    free(sts);
    return rc;
}

void hs_pp_weights_eager(hs_pp_action *a, int n) {
    /* in place: walking left to right, a W moves back to sit after its B,
     * shifting what lies between one place right */
    for (int i = 0; i < n; i++) {
        if (a[i].kind != HS_PP_WEIGHT) continue;
        int b = i - 1;
        while (b >= 0 && !(a[b].kind == HS_PP_BACKWARD && a[b].chunk == a[i].chunk &&
                           a[b].micro_batch == a[i].micro_batch))
            b--;
        HS_ASSERT(b >= 0); /* every W comes after its B */
        hs_pp_action w = a[i];
        for (int k = i; k > b + 1; k--) a[k] = a[k - 1];
        a[b + 1] = w;
    }
}

static hs_status check_lists(hs_pp_schedule_kind kind, int pp, int M, int V, bool eager,
                             hs_error *e) {
    int n = (int)hs_pp_schedule_length(kind, M, V);
    hs_pp_action **lists = calloc((size_t)pp, sizeof *lists);
    int *lens = calloc((size_t)pp, sizeof *lens);
    hs_status rc = lists && lens ? HS_OK : hs_error_oom(e, "pipeline: the schedule check");
    for (int s = 0; rc == HS_OK && s < pp; s++) {
        lists[s] = malloc(sizeof *lists[s] * (size_t)n);
        if (!lists[s]) rc = hs_error_oom(e, "pipeline: the schedule check of %d actions", n);
        else rc = hs_pp_schedule(kind, pp, s, M, V, lists[s], e);
        if (rc == HS_OK && eager) hs_pp_weights_eager(lists[s], n);
        lens[s] = n;
    }
    if (rc == HS_OK)
        rc = hs_pp_actions_check(kind, pp, M, V, (const hs_pp_action *const *)lists, lens, e);
    for (int s = 0; lists && s < pp; s++) free(lists[s]);
    free(lists);
    free(lens);
    return rc;
}

hs_status hs_pp_schedule_check(hs_pp_schedule_kind kind, int pp, int M, int V, hs_error *e) {
    return check_lists(kind, pp, M, V, false, e);
}

hs_status hs_pp_schedule_check_eager(hs_pp_schedule_kind kind, int pp, int M, int V, hs_error *e) {
    return check_lists(kind, pp, M, V, true, e);
}
