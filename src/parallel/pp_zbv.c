/* ZB-V's action lists (parallel.h, "zbv"): every stage simulated together
 * in ticks, each free stage taking the first ready action of B, F (under
 * the memory bound), W; a stage's list is the order it took them in. The
 * runtime keeps that order and lets the real durations decide the timing.
 *
 * The simulation's durations, F 2, B 5, W 2 ticks, are a cost model, not
 * a measurement: here an input pass costs more than its forward
 * (attention's backward and the norms stay in it) and a weight pass about
 * as much. When the model was chosen, replays of the lists with F:B:W
 * from 1:1:1 to 1:2.7:1 (the range bench pp measures) kept their ideal
 * bubble near half of 1F1B's or below for pp 2 to 8, where lists made
 * with equal durations, the paper's assumption, lost that as soon as B
 * outgrew F; bench pp's "theory" column replays them with the measured
 * times (pp 2 and 4). No test holds the bound. */
#include <limits.h>
#include <stdlib.h>

#include "parallel/pp_internal.h"

enum { NOT_DONE = INT_MAX };

/* Ticks of an F, B and W in the simulation (by hs_pp_kind). */
static const int cost[3] = {2, 5, 2};

typedef struct zbv_sim {
    int pp, M;
    int *fin;          /* [3][pp][2][M]: the tick an action finished, NOT_DONE before */
    int *next;         /* [3][pp][2]: each kind's next micro-batch per local chunk */
    int *free_at;      /* [pp]: the tick the stage's running action ends */
    int *held;         /* [pp]: chunk activations forwarded and not yet weight-passed */
    int *n;            /* [pp]: actions listed */
    hs_pp_action *out; /* [pp][6M] */
} zbv_sim;

static int *fin_at(const zbv_sim *z, hs_pp_kind k, int s, int v, int mb) {
    return &z->fin[(((int64_t)k * z->pp + s) * 2 + v) * z->M + mb];
}

static int *next_of(const zbv_sim *z, hs_pp_kind k, int s, int v) {
    return &z->next[((int64_t)k * z->pp + s) * 2 + v];
}

static bool done_by(const zbv_sim *z, hs_pp_kind k, int s, int v, int mb, int t) {
    return *fin_at(z, k, s, v, mb) <= t;
}

/* The input of (k, s, v, mb) from the neighbouring model chunk is there. */
static bool input_in(const zbv_sim *z, hs_pp_kind k, int s, int v, int mb, int t) {
    int c = hs_pp_model_chunk(HS_PP_ZBV, z->pp, s, v), from = k == HS_PP_FORWARD ? c - 1 : c + 1;
    if (from < 0 || from > 2 * z->pp - 1) return true;
    int fs, fv;
    hs_pp_chunk_home(HS_PP_ZBV, z->pp, from, &fs, &fv);
    return done_by(z, k, fs, fv, mb, t);
}

/* What stage s starts at tick t: kind and chunk into *k, *v; false when
 * nothing is ready. */
static bool pick(const zbv_sim *z, int s, int t, hs_pp_kind *k, int *v) {
    int best = -1, mb;
    /* B: the critical path; the lowest micro-batch, chunk 1 first */
    for (int c = 1; c >= 0; c--) {
        mb = *next_of(z, HS_PP_BACKWARD, s, c);
        if (mb < z->M && done_by(z, HS_PP_FORWARD, s, c, mb, t) &&
            input_in(z, HS_PP_BACKWARD, s, c, mb, t) &&
            (best < 0 || mb < *next_of(z, HS_PP_BACKWARD, s, best)))
            best = c;
    }
    if (best >= 0) return *k = HS_PP_BACKWARD, *v = best, true;
    /* F while the stage holds fewer than 2 pp chunk activations: chunk 1
     * first, which brings a micro-batch nearer its loss */
    for (int c = 1; c >= 0 && z->held[s] < 2 * z->pp; c--) {
        mb = *next_of(z, HS_PP_FORWARD, s, c);
        if (mb < z->M && input_in(z, HS_PP_FORWARD, s, c, mb, t))
            return *k = HS_PP_FORWARD, *v = c, true;
    }
    /* W: the one whose B ended first */
    for (int c = 0; c < 2; c++) {
        mb = *next_of(z, HS_PP_WEIGHT, s, c);
        if (mb < z->M && done_by(z, HS_PP_BACKWARD, s, c, mb, t) &&
            (best < 0 ||
             *fin_at(z, HS_PP_BACKWARD, s, c, mb) <
                 *fin_at(z, HS_PP_BACKWARD, s, best, *next_of(z, HS_PP_WEIGHT, s, best))))
            best = c;
    }
    if (best >= 0) return *k = HS_PP_WEIGHT, *v = best, true;
    return false;
}

static void run(zbv_sim *z) {
    int per = 6 * z->M, left = per * z->pp;
    for (int t = 0; left > 0; t++) {
        /* a stage waits only on the others' inputs, and stage 0's first
         * forward is always ready: the loop cannot stall while work is left
         * (the schedule check proves each list runs) */
        HS_ASSERT(t <= 5 * per * z->pp);
        for (int s = 0; s < z->pp; s++) {
            hs_pp_kind k;
            int v;
            if (z->free_at[s] > t || !pick(z, s, t, &k, &v)) continue;
            int *nx = next_of(z, k, s, v), mb = (*nx)++;
            *fin_at(z, k, s, v, mb) = t + cost[k];
            z->free_at[s] = t + cost[k];
            z->held[s] += k == HS_PP_FORWARD ? 1 : k == HS_PP_WEIGHT ? -1 : 0;
            z->out[(int64_t)s * per + z->n[s]++] = (hs_pp_action){k, v, mb};
            left--;
        }
    }
}

hs_status hs_pp_zbv_list(int pp, int stage, int M, hs_pp_action *out, hs_error *e) {
    size_t acts = (size_t)3 * pp * 2 * M;
    zbv_sim z = {.pp = pp,
                 .M = M,
                 .fin = malloc(acts * sizeof(int)),
                 .next = calloc((size_t)3 * pp * 2, sizeof(int)),
                 .free_at = calloc((size_t)pp, sizeof(int)),
                 .held = calloc((size_t)pp, sizeof(int)),
                 .n = calloc((size_t)pp, sizeof(int)),
                 .out = malloc(acts * sizeof(hs_pp_action))};
    hs_status rc = HS_OK;
    if (!z.fin || !z.next || !z.free_at || !z.held || !z.n || !z.out) {
        rc = hs_error_oom(e, "pipeline: the zbv simulation of %d stages x %d micro-batches", pp, M);
    } else {
        for (size_t i = 0; i < acts; i++) z.fin[i] = NOT_DONE;
        run(&z);
        /* stage < 0: every stage's list, one after another */
        int64_t from = stage < 0 ? 0 : (int64_t)stage * 6 * M, n = stage < 0 ? 6LL * M * pp : 6 * M;
        for (int64_t i = 0; i < n; i++) out[i] = z.out[from + i];
    }
    free(z.fin);
    free(z.next);
    free(z.free_at);
    free(z.held);
    free(z.n);
    free(z.out);
    return rc;
}
