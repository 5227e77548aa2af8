/* Forward/backward prefetch (spec 004 §2.4, §5.11): training is bitwise
 * the same with depth 0, 1 and 2 (with and without activation
 * checkpointing); with depth N at most N+1 blocks are unsharded at once in
 * forward and in backward, from the unit states and from the parameter
 * memory accounting (exactly N+1 once the model is deep enough, so the
 * prefetch really happens); the trace shows unit i+1's all-gather starting
 * before unit i's forward compute ends with depth 1, and never with depth 0.
 * HS_MPI_RANKS: 2 4
 * HS_TEST_TIMEOUT: 240 */
#include <math.h>

#include "fsdp_overlap_harness.h"

#define LAYERS 4

/* ------------------------------------------------------------- numerics */

static void same_training_with_depths(hs_comm *c, bool ckpt) {
    ov_opts base_o = {.layers = LAYERS, .fwd = 0, .bwd = 0, .zero_copy = -1, .ckpt = ckpt};
    ov_run r;
    ov_result base;
    ov_setup(&r, c, &base_o);
    ov_train(&r, &base, NULL);
    ov_teardown(&r);
    const int depths[][2] = {{1, 1}, {2, 2}, {1, 0}, {0, 2}};
    for (int k = 0; k < 4; k++) {
        ov_opts o = base_o;
        o.fwd = depths[k][0];
        o.bwd = depths[k][1];
        ov_result got;
        ov_setup(&r, c, &o);
        ov_train(&r, &got, NULL);
        ov_teardown(&r);
        char what[96];
        snprintf(what, sizeof what, "prefetch forward %d backward %d%s vs none", o.fwd, o.bwd,
                 ckpt ? " (checkpointing)" : "");
        ov_expect_identical(c, what, &base, &got);
        ov_result_free(&got);
        if (hs_comm_rank(c) == 0) printf("ok %s: bitwise identical\n", what);
    }
    ov_result_free(&base);
}

/* ---------------------------------------------------------------- memory */

typedef struct mem_probe {
    hs_model_hooks outer;
    const hs_model_hooks *inner;
    hs_fsdp *f;
    int max_fwd, max_bwd; /* blocks (not the root) unsharded or in flight */
} mem_probe;

static int blocks_unsharded(hs_fsdp *f) {
    hs_fsdp_ctx *ctx = hs_fsdp_context(f);
    int n = 0;
    for (int u = 1; u < ctx->n_units; u++) {
        bool any = false;
        for (int i = 0; i < ctx->units[u].n_params; i++)
            any |= ctx->units[u].params[i]->state != HS_FSDP_SHARDED;
        n += any;
    }
    return n;
}

static void mp_pre_forward(void *v, int u) {
    mem_probe *p = v;
    p->inner->pre_forward(p->inner->ctx, u);
    int n = blocks_unsharded(p->f);
    if (n > p->max_fwd) p->max_fwd = n;
}

static void mp_post_forward(void *v, int u) {
    mem_probe *p = v;
    p->inner->post_forward(p->inner->ctx, u);
}

static void mp_pre_backward(void *v, int u) {
    mem_probe *p = v;
    p->inner->pre_backward(p->inner->ctx, u);
    int n = blocks_unsharded(p->f);
    if (n > p->max_bwd) p->max_bwd = n;
}

static void mp_post_backward(void *v, int u) {
    mem_probe *p = v;
    p->inner->post_backward(p->inner->ctx, u);
}

static void mp_final(void *v) {
    mem_probe *p = v;
    p->inner->post_backward_final(p->inner->ctx);
}

/* Bytes of one unit's all-gather outputs. */
static int64_t unit_full_bytes(hs_fsdp *f, int u) {
    hs_fsdp_unit *un = &hs_fsdp_context(f)->units[u];
    int64_t b = 0;
    for (int i = 0; i < un->n_params; i++)
        if (un->params[i]->needs_all_gather) b += un->params[i]->plan.padded_unsharded_numel * 4;
    return b;
}

static void at_most_depth_plus_one_blocks_unsharded(hs_comm *c, int depth) {
    ov_opts o = {.layers = LAYERS, .fwd = depth, .bwd = depth, .zero_copy = -1};
    ov_run r;
    ov_setup(&r, c, &o);
    hs_error e;
    hs_error_clear(&e);
    hs_batch b = ov_batch(&r, 1);
    mem_probe p = {.inner = hs_fsdp_hooks(r.f), .f = r.f};
    p.outer = (hs_model_hooks){.ctx = &p,
                               .pre_forward = mp_pre_forward,
                               .post_forward = mp_post_forward,
                               .pre_backward = mp_pre_backward,
                               .post_backward = mp_post_backward,
                               .post_backward_final = mp_final};
    hs_fsdp_stats st;
    hs_fsdp_get_stats(r.f, &st);
    int64_t at_rest = st.param_bytes; /* the shards alone */
    hs_fsdp_reset_peak(r.f);
    double loss;
    CHECK(c, hs_model_forward(r.m, &b, &p.outer, &loss, NULL, &e) == HS_OK, "%s", e.msg);
    hs_fsdp_get_stats(r.f, &st);
    int want = depth + 1 < LAYERS ? depth + 1 : LAYERS;
    CHECK(c, p.max_fwd == want, "depth %d: %d blocks unsharded at once in forward, want %d", depth,
          p.max_fwd, want);
    /* Equal-sized blocks: the peak is the shards, the root (kept through the
     * step) and exactly `want` blocks. */
    int64_t peak_want = at_rest + unit_full_bytes(r.f, 0) + want * unit_full_bytes(r.f, 1);
    CHECK(c, st.param_peak_bytes == peak_want,
          "depth %d: forward peaked at %lld parameter bytes, want shards %lld + root + %d blocks "
          "= %lld",
          depth, (long long)st.param_peak_bytes, (long long)at_rest, want, (long long)peak_want);
    CHECK(c, hs_fsdp_after_step(r.f, &e) == HS_OK, "%s", e.msg);
    /* and in backward */
    float scale = 1.0f / (float)(r.G * r.T);
    double aux;
    p.max_fwd = p.max_bwd = 0;
    hs_fsdp_reset_peak(r.f);
    CHECK(c, hs_model_forward_backward(r.m, &b, scale, &p.outer, &loss, &aux, &e) == HS_OK, "%s",
          e.msg);
    CHECK(c, p.max_bwd == want, "depth %d: %d blocks unsharded at once in backward, want %d", depth,
          p.max_bwd, want);
    CHECK(c, hs_fsdp_after_step(r.f, &e) == HS_OK, "%s", e.msg);
    if (hs_comm_rank(c) == 0)
        printf("ok depth %d: at most %d blocks unsharded (forward peak %lld bytes)\n", depth, want,
               (long long)st.param_peak_bytes);
    ov_teardown(&r);
}

/* ----------------------------------------------------------------- trace */

typedef struct time_probe {
    hs_model_hooks outer;
    const hs_model_hooks *inner;
    double begin[16], end[16]; /* forward compute of each unit */
    double fwd_end;            /* the first backward hook */
} time_probe;

static void tp_pre_forward(void *v, int u) {
    time_probe *p = v;
    p->inner->pre_forward(p->inner->ctx, u);
    p->begin[u] = hs_now();
}

static void tp_post_forward(void *v, int u) {
    time_probe *p = v;
    p->end[u] = hs_now();
    p->inner->post_forward(p->inner->ctx, u);
}

static void tp_pre_backward(void *v, int u) {
    time_probe *p = v;
    if (p->fwd_end == 0.0) p->fwd_end = hs_now();
    p->inner->pre_backward(p->inner->ctx, u);
}

static void tp_post_backward(void *v, int u) {
    time_probe *p = v;
    p->inner->post_backward(p->inner->ctx, u);
}

static void tp_final(void *v) {
    time_probe *p = v;
    p->inner->post_backward_final(p->inner->ctx);
}

/* Start times (s) of the all-gathers this rank executed in [t0, t1], in
 * execution order, read back from the serialised trace. */
static int all_gather_starts(hs_comm *c, double t0, double t1, double *out, int cap) {
    char *buf;
    size_t len;
    hs_error e;
    hs_error_clear(&e);
    CHECK(c, hs_trace_serialize(hs_comm_trace(c), 0.0, &buf, &len, &e) == HS_OK, "%s", e.msg);
    int n = 0;
    for (const char *s = buf; (s = strstr(s, "{\"name\":\"all_gather\"")) != NULL; s++) {
        const char *ts = strstr(s, "\"ts\":");
        if (!ts) break;
        double t = strtod(ts + 5, NULL) / 1e6;
        if (t >= t0 && t <= t1 && n < cap) out[n++] = t;
    }
    free(buf);
    for (int i = 1; i < n; i++) /* insertion sort: already nearly in order */
        for (int j = i; j > 0 && out[j] < out[j - 1]; j--) {
            double x = out[j];
            out[j] = out[j - 1];
            out[j - 1] = x;
        }
    return n;
}

/* One forward: early[i] says whether block i's successor started its
 * all-gather before block i's compute ended (1 <= i < units - 1); `gap`
 * gets the margin at unit 2. Returns the number of units. */
static int forward_overlaps(ov_run *r, int depth, double *gap, bool *early_out) {
    hs_error e;
    hs_error_clear(&e);
    hs_batch b = ov_batch(r, 1);
    time_probe p = {.inner = hs_fsdp_hooks(r->f)};
    p.outer = (hs_model_hooks){.ctx = &p,
                               .pre_forward = tp_pre_forward,
                               .post_forward = tp_post_forward,
                               .pre_backward = tp_pre_backward,
                               .post_backward = tp_post_backward,
                               .post_backward_final = tp_final};
    float scale = 1.0f / (float)(r->G * r->T);
    double loss, aux, t0 = hs_now();
    CHECK(r->c, hs_model_forward_backward(r->m, &b, scale, &p.outer, &loss, &aux, &e) == HS_OK,
          "%s", e.msg);
    CHECK(r->c, hs_fsdp_after_step(r->f, &e) == HS_OK, "%s", e.msg);
    double starts[64];
    int n = all_gather_starts(r->c, t0, p.fwd_end, starts, 64);
    int units = hs_fsdp_context(r->f)->n_units;
    CHECK(r->c, n == units, "depth %d: %d all-gathers in forward, want one per unit (%d)", depth, n,
          units);
    for (int i = 1; i + 1 < units; i++) {
        bool early = starts[i + 1] < p.end[i];
        early_out[i] = early;
        /* Without prefetch the next all-gather is issued only after this
         * compute ended: it can never start earlier. */
        if (depth == 0)
            CHECK(r->c, !early,
                  "depth 0: unit %d's all-gather started before unit %d's compute "
                  "ended",
                  i + 1, i);
    }
    *gap = (p.end[1] - starts[2]) * 1e6;
    return units;
}

static void next_all_gather_starts_during_compute(hs_comm *c, int depth) {
    /* Fusion makes each unshard one all-gather, so the k-th all-gather of
     * the forward is unit k's (units are all-gathered in declaration order).
     * A block's compute must last well beyond the scheduler's wake-up
     * latency for the comm thread (milliseconds when every core is busy):
     * at seq 256 the faster kernels left it ~1 ms and the check flaked. */
    ov_opts o = {.layers = LAYERS,
                 .dim = 128,
                 .seq = 1024,
                 .fwd = depth,
                 .bwd = 0,
                 .fusion = true,
                 .zero_copy = -1};
    ov_run r;
    ov_setup(&r, c, &o);
    /* With prefetch the all-gather is queued before the compute starts, but
     * it starts only when the comm thread gets a core; on an oversubscribed
     * machine (4 ranks on 2 cores) one forward often misses that for some
     * block on some rank. So each block must be seen overlapped on every
     * rank in at least one of a few forwards; without prefetch it is checked
     * never to overlap, in every forward (forward_overlaps). */
    double gap = 0.0;
    bool seen[64] = {false}, ok = false;
    int tries = 0;
    while (!ok && tries < (depth ? 10 : 1)) {
        bool early[64] = {false};
        int units = forward_overlaps(&r, depth, &gap, early);
        float all[64 * 64], mine[64];
        for (int i = 0; i < units; i++) mine[i] = early[i] ? 1.0f : 0.0f;
        hs_error e;
        hs_error_clear(&e);
        CHECK(c,
              hs_pg_all_gather(hs_comm_world(c), NULL, all, mine, units, HS_DTYPE_F32, &e) == HS_OK,
              "%s", e.msg);
        ok = true;
        for (int i = 1; i + 1 < units; i++) {
            bool everywhere = true;
            for (int k = 0; k < hs_comm_size(c); k++) everywhere &= all[k * units + i] == 1.0f;
            seen[i] |= everywhere;
            ok &= seen[i];
        }
        tries++;
    }
    CHECK(c, ok == (depth > 0),
          "depth %d: after %d forwards, the next unit's all-gather %s started before the current "
          "unit's compute ended (unit 2 margin %.1f us)",
          depth, tries, depth ? "never always" : "", gap);
    if (hs_comm_rank(c) == 0)
        printf("ok depth %d: next all-gather starts %s the current unit's compute ends "
               "(unit 2: %.1f us %s; %d forward%s)\n",
               depth, depth ? "before" : "after", gap < 0 ? -gap : gap,
               gap > 0 ? "before" : "after", tries, tries > 1 ? "s" : "");
    ov_teardown(&r);
}

int main(int argc, char **argv) {
    /* The trace must record spans for the timestamp check. */
    hs_trace *tr = NULL;
    hs_comm *c = mt_traced_init(&argc, &argv, 120, true, &tr);
    same_training_with_depths(c, false);
    same_training_with_depths(c, true);
    for (int d = 0; d <= 2; d++) at_most_depth_plus_one_blocks_unsharded(c, d);
    next_all_gather_starts_during_compute(c, 1);
    next_all_gather_starts_during_compute(c, 0);
    mt_traced_finalize(c, tr);
    return 0;
}
