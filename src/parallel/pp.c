/* Pipeline parallelism: the schedules (which forward and backward a stage
 * runs when) and the hand-over of activations and gradients between
 * neighbouring stages (parallel.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/parallel.h"

#define PP_FWD_TAG 0x5046 /* "PF" */
#define PP_BWD_TAG 0x5042 /* "PB" */

bool hs_pp_schedule_parse(const char *name, hs_pp_schedule_kind *out) {
    if (!strcmp(name, "gpipe")) return *out = HS_PP_GPIPE, true;
    if (!strcmp(name, "1f1b")) return *out = HS_PP_1F1B, true;
    return false;
}

/* 1F1B warm-up: the forwards stage s runs before its first backward. */
static int warmup(int pp, int stage, int M) {
    int w = pp - 1 - stage;
    return w < M ? w : M;
}

void hs_pp_schedule(hs_pp_schedule_kind kind, int pp, int stage, int M, hs_pp_action *out) {
    int n = 0;
    if (kind == HS_PP_GPIPE) {
        for (int i = 0; i < M; i++) out[n++] = (hs_pp_action){HS_PP_FORWARD, i};
        for (int i = 0; i < M; i++) out[n++] = (hs_pp_action){HS_PP_BACKWARD, i};
        return;
    }
    int w = warmup(pp, stage, M), f = 0, b = 0;
    while (f < w) out[n++] = (hs_pp_action){HS_PP_FORWARD, f++};
    while (f < M) {
        out[n++] = (hs_pp_action){HS_PP_FORWARD, f++};
        out[n++] = (hs_pp_action){HS_PP_BACKWARD, b++};
    }
    while (b < M) out[n++] = (hs_pp_action){HS_PP_BACKWARD, b++};
}

int hs_pp_slots(hs_pp_schedule_kind kind, int pp, int stage, int M) {
    if (kind == HS_PP_GPIPE) return M;
    int s = warmup(pp, stage, M) + 1;
    return s < M ? s : M;
}

/* One direction's receive (one posted ahead) and its two send buffers;
 * each hand-over may carry a second, small fp32 message (x: the MoE
 * statistics forward, their gradient backward), sent right after it. */
typedef struct pp_lane {
    hs_pg *group;
    void *recv_buf;
    float *xrecv_buf;
    hs_work *recv, *xrecv;
    int recv_mb;
    int64_t recv_bytes, xrecv_n;
    void *send_buf[2];
    float *xsend_buf[2];
    hs_work *send[2], *xsend[2];
    int next_send;
} pp_lane;

struct hs_pp {
    hs_comm *comm;
    int stage, size;
    pp_lane fwd, bwd; /* fwd: recv from stage-1, send to stage+1; bwd: the reverse */
    size_t cap;       /* bytes of each staging buffer */
    int64_t xcap;     /* fp32 values of each second-message buffer */
    hs_parallel_stats stats;
    double busy_s; /* inside stage forwards and backwards */
};

static hs_status lane_init(pp_lane *l, hs_comm *c, const char *name, int colour, int key,
                           hs_comm_queue q, size_t cap, int64_t xcap, hs_error *e) {
    *l = (pp_lane){.recv_mb = -1};
    hs_status s = hs_comm_split_queue(c, name, colour, key, q, &l->group, e);
    if (s != HS_OK) return s;
    size_t xb = (size_t)(xcap > 0 ? xcap : 1) * sizeof(float);
    l->recv_buf = malloc(cap);
    l->xrecv_buf = malloc(xb);
    for (int k = 0; k < 2; k++) l->send_buf[k] = malloc(cap), l->xsend_buf[k] = malloc(xb);
    if (!l->recv_buf || !l->send_buf[0] || !l->send_buf[1] || !l->xrecv_buf ||
        !l->xsend_buf[0] || !l->xsend_buf[1])
        return hs_error_set(e, HS_ERR_OOM, "pipeline: cannot allocate 3 x %zu bytes of staging",
                            cap + xb);
    return HS_OK;
}

hs_status hs_pp_create(hs_comm *comm, const hs_topology *t, int world_rank, int64_t max_numel,
                       int64_t max_extra, const char *prefix, hs_pp **out, hs_error *e) {
    *out = NULL;
    hs_pp *p = calloc(1, sizeof *p);
    if (!p) return hs_error_set(e, HS_ERR_OOM, "pipeline: cannot allocate its context");
    int colour = hs_topology_group_index(t, HS_DIM_PP, world_rank);
    p->comm = comm;
    p->stage = hs_topology_coords(t, world_rank).pp;
    p->size = t->pp;
    p->cap = (size_t)(max_numel > 0 ? max_numel : 1) * sizeof(float);
    p->xcap = max_extra;
    char fname[96], bname[96];
    snprintf(fname, sizeof fname, "%spp_forward", prefix ? prefix : "");
    snprintf(bname, sizeof bname, "%spp_backward", prefix ? prefix : "");
    hs_status s = lane_init(&p->fwd, comm, fname, colour, p->stage, HS_COMM_QUEUE_PP_FORWARD,
                            p->cap, p->xcap, e);
    if (s == HS_OK)
        s = lane_init(&p->bwd, comm, bname, colour, p->stage, HS_COMM_QUEUE_PP_BACKWARD, p->cap,
                      p->xcap, e);
    if (s != HS_OK) {
        hs_pp_free(p);
        return s;
    }
    *out = p;
    return HS_OK;
}

static void lane_free(pp_lane *l) {
    free(l->recv_buf);
    free(l->xrecv_buf);
    for (int k = 0; k < 2; k++) free(l->send_buf[k]), free(l->xsend_buf[k]);
}

void hs_pp_free(hs_pp *p) {
    if (!p) return;
    hs_error e;
    hs_error_clear(&e);
    (void)hs_pp_flush(p, &e);
    lane_free(&p->fwd);
    lane_free(&p->bwd);
    free(p);
}

int hs_pp_stage(const hs_pp *p) { return p->stage; }
int hs_pp_size(const hs_pp *p) { return p->size; }

static size_t bytes_of(const hs_pp *p, int64_t numel, hs_dtype dt) {
    size_t n = (size_t)numel * hs_dtype_size(dt);
    HS_ASSERT(numel >= 0 && n <= p->cap);
    return n;
}

static void post_recv(hs_pp *p, pp_lane *l, int peer, int tag, int mb, int64_t numel,
                      hs_dtype dt, int64_t extra) {
    HS_ASSERT(l->recv == NULL && extra >= 0 && extra <= p->xcap);
    l->recv_bytes = (int64_t)bytes_of(p, numel, dt);
    l->recv_mb = mb;
    l->recv = hs_pg_recv_async(l->group, l->recv_buf, numel, dt, peer, tag);
    l->xrecv_n = extra;
    if (extra) l->xrecv = hs_pg_recv_async(l->group, l->xrecv_buf, extra, HS_DTYPE_F32, peer, tag);
}

static hs_status take(hs_pp *p, pp_lane *l, int mb, void *dst, float *xdst, hs_error *e) {
    HS_ASSERT(l->recv != NULL && l->recv_mb == mb && (!l->xrecv_n || xdst));
    double t0 = hs_now();
    hs_work *w = l->recv, *xw = l->xrecv;
    l->recv = l->xrecv = NULL;
    hs_status s = hs_work_wait(w, e);
    if (xw) {
        hs_error xe;
        hs_error_clear(&xe);
        hs_status xs = hs_work_wait(xw, &xe);
        if (s == HS_OK && xs != HS_OK) *e = xe, s = xs;
    }
    if (s == HS_OK) memcpy(dst, l->recv_buf, (size_t)l->recv_bytes);
    if (s == HS_OK && l->xrecv_n) memcpy(xdst, l->xrecv_buf, (size_t)l->xrecv_n * sizeof(float));
    hs_parallel_done(p->comm, &p->stats, t0, l->recv_bytes + l->xrecv_n * 4, s, e);
    return s;
}

static hs_status wait_slot(hs_work **w, hs_status s, hs_error *e) {
    if (!*w) return s;
    hs_error we;
    hs_error_clear(&we);
    hs_status ws = hs_work_wait(*w, &we);
    *w = NULL;
    if (s == HS_OK && ws != HS_OK) *e = we, s = ws;
    return s;
}

/* The send buffer about to be reused must have gone out first. */
static hs_status send(hs_pp *p, pp_lane *l, int peer, int tag, const void *src, int64_t numel,
                      hs_dtype dt, const float *extra, int64_t xn, hs_error *e) {
    HS_ASSERT(xn >= 0 && xn <= p->xcap && (!xn || extra));
    double t0 = hs_now();
    int k = l->next_send;
    l->next_send ^= 1;
    hs_status s = wait_slot(&l->send[k], HS_OK, e);
    s = wait_slot(&l->xsend[k], s, e);
    size_t n = bytes_of(p, numel, dt);
    if (s == HS_OK) {
        memcpy(l->send_buf[k], src, n);
        l->send[k] = hs_pg_send_async(l->group, l->send_buf[k], numel, dt, peer, tag);
        if (xn) {
            memcpy(l->xsend_buf[k], extra, (size_t)xn * sizeof(float));
            l->xsend[k] = hs_pg_send_async(l->group, l->xsend_buf[k], xn, HS_DTYPE_F32, peer, tag);
        }
    }
    hs_parallel_done(p->comm, &p->stats, t0, (int64_t)n + xn * 4, s, e);
    return s;
}

void hs_pp_post_recv_forward(hs_pp *p, int mb, int64_t numel, hs_dtype dt, int64_t extra) {
    HS_ASSERT(p->stage > 0);
    post_recv(p, &p->fwd, p->stage - 1, PP_FWD_TAG, mb, numel, dt, extra);
}

hs_status hs_pp_take_forward(hs_pp *p, int mb, void *dst, float *extra, hs_error *e) {
    return take(p, &p->fwd, mb, dst, extra, e);
}

hs_status hs_pp_send_forward(hs_pp *p, int mb, const void *src, int64_t numel, hs_dtype dt,
                             const float *extra, int64_t extra_n, hs_error *e) {
    (void)mb;
    HS_ASSERT(p->stage + 1 < p->size);
    return send(p, &p->fwd, p->stage + 1, PP_FWD_TAG, src, numel, dt, extra, extra_n, e);
}

void hs_pp_post_recv_backward(hs_pp *p, int mb, int64_t numel, int64_t extra) {
    HS_ASSERT(p->stage + 1 < p->size);
    post_recv(p, &p->bwd, p->stage + 1, PP_BWD_TAG, mb, numel, HS_DTYPE_F32, extra);
}

hs_status hs_pp_take_backward(hs_pp *p, int mb, float *dst, float *extra, hs_error *e) {
    return take(p, &p->bwd, mb, dst, extra, e);
}

hs_status hs_pp_send_backward(hs_pp *p, int mb, const float *src, int64_t numel,
                              const float *extra, int64_t extra_n, hs_error *e) {
    (void)mb;
    HS_ASSERT(p->stage > 0);
    return send(p, &p->bwd, p->stage - 1, PP_BWD_TAG, src, numel, HS_DTYPE_F32, extra, extra_n, e);
}

static hs_status lane_flush(pp_lane *l, hs_error *e) {
    hs_status s = HS_OK;
    for (int k = 0; k < 2; k++) {
        s = wait_slot(&l->send[k], s, e);
        s = wait_slot(&l->xsend[k], s, e);
    }
    HS_ASSERT(l->recv == NULL);
    return s;
}

hs_status hs_pp_flush(hs_pp *p, hs_error *e) {
    hs_status s = lane_flush(&p->fwd, e);
    if (s == HS_OK) s = lane_flush(&p->bwd, e);
    return s;
}

hs_parallel_stats hs_pp_get_stats(const hs_pp *p) { return p->stats; }
double hs_pp_busy_seconds(const hs_pp *p) { return p->busy_s; }
void hs_pp_reset_stats(hs_pp *p) {
    p->stats = (hs_parallel_stats){0};
    p->busy_s = 0.0;
}

/* ------------------------------------------------------------ one step */

static void span(const hs_pp_step_io *io, const hs_pp *p, char kind, int mb, double t0) {
    if (!io->trace || !hs_trace_enabled(io->trace)) return;
    char name[32], args[160];
    snprintf(name, sizeof name, "%c%d", kind, mb);
    snprintf(args, sizeof args, "\"stage\":%d,\"micro_batch\":%d,\"schedule\":\"%s\"", p->stage,
             mb, io->schedule ? io->schedule : "");
    hs_trace_span(io->trace, HS_LANE_COMPUTE, name, kind == 'F' ? "pp_forward" : "pp_backward",
                  t0, hs_now(), args);
}

static hs_status run_forward(hs_pp *p, hs_model *m, const hs_model_hooks *hooks, int mb, int M,
                             float grad_scale, const hs_pp_step_io *io, double *aux,
                             hs_error *e) {
    hs_batch b = io->batch(io->ctx, mb);
    int slot = mb % hs_model_num_slots(m);
    int64_t numel = hs_model_stage_numel(m, &b), xn = hs_model_stage_aux_numel(m);
    hs_status s = HS_OK;
    if (!hs_model_is_first_stage(m)) {
        hs_dtype dt;
        void *in = hs_model_stage_input(m, slot, &dt);
        s = hs_pp_take_forward(p, mb, in, hs_model_stage_aux(m), e);
    }
    double t0 = hs_now();
    if (s == HS_OK)
        s = hs_model_stage_forward(m, slot, &b, hooks, true, grad_scale, NULL, NULL, aux, e);
    p->busy_s += hs_now() - t0;
    span(io, p, 'F', mb, t0);
    if (s == HS_OK && !hs_model_is_last_stage(m)) {
        hs_dtype dt;
        const void *out = hs_model_stage_output(m, slot, &dt);
        s = hs_pp_send_forward(p, mb, out, numel, dt, hs_model_stage_aux(m), xn, e);
    }
    /* The next receive goes behind this send on the queue: a receive ahead
     * of it would hold the send until the previous stage's next forward,
     * which (1F1B) waits for this stage's backward: a cycle. */
    if (s == HS_OK && !hs_model_is_first_stage(m) && mb + 1 < M) {
        hs_dtype dt;
        (void)hs_model_stage_input(m, 0, &dt);
        hs_pp_post_recv_forward(p, mb + 1, numel, dt, xn);
    }
    return s;
}

static hs_status run_backward(hs_pp *p, hs_model *m, const hs_model_hooks *hooks, int mb, int M,
                              float grad_scale, const hs_pp_step_io *io, double *loss,
                              hs_error *e) {
    hs_batch b = io->batch(io->ctx, mb);
    int slot = mb % hs_model_num_slots(m);
    int64_t numel = hs_model_stage_numel(m, &b), xn = hs_model_stage_aux_grad_numel(m);
    float *aux_g = hs_model_stage_aux_grad(m, slot);
    hs_status s = HS_OK;
    if (!hs_model_is_last_stage(m)) {
        s = hs_pp_take_backward(p, mb, hs_model_stage_grad(m), aux_g, e);
    }
    io->before_backward(io->ctx, mb, mb == M - 1);
    double t0 = hs_now();
    if (s == HS_OK) s = hs_model_stage_backward(m, slot, &b, grad_scale, hooks, loss, e);
    p->busy_s += hs_now() - t0;
    span(io, p, 'B', mb, t0);
    if (s == HS_OK && !hs_model_is_first_stage(m))
        s = hs_pp_send_backward(p, mb, hs_model_stage_grad(m), numel, aux_g, xn, e);
    /* behind the send, as in forward */
    if (s == HS_OK && !hs_model_is_last_stage(m) && mb + 1 < M)
        hs_pp_post_recv_backward(p, mb + 1, numel, xn);
    return s;
}

hs_status hs_pp_run_step(hs_pp *p, hs_model *m, const hs_model_hooks *hooks,
                         const hs_pp_action *actions, int M, float grad_scale,
                         const hs_pp_step_io *io, double *loss_sum, double *aux_sum,
                         hs_error *e) {
    hs_batch b0 = io->batch(io->ctx, 0);
    int64_t numel = hs_model_stage_numel(m, &b0);
    if (!hs_model_is_first_stage(m)) {
        hs_dtype dt;
        (void)hs_model_stage_input(m, 0, &dt);
        hs_pp_post_recv_forward(p, 0, numel, dt, hs_model_stage_aux_numel(m));
    }
    if (!hs_model_is_last_stage(m))
        hs_pp_post_recv_backward(p, 0, numel, hs_model_stage_aux_grad_numel(m));
    hs_status s = HS_OK;
    *loss_sum = *aux_sum = 0.0;
    for (int k = 0; s == HS_OK && k < 2 * M; k++) {
        hs_pp_action a = actions[k];
        double loss = 0.0, aux = 0.0;
        s = a.kind == HS_PP_FORWARD
                ? run_forward(p, m, hooks, a.micro_batch, M, grad_scale, io, &aux, e)
                : run_backward(p, m, hooks, a.micro_batch, M, grad_scale, io, &loss, e);
        *loss_sum += loss;
        *aux_sum += aux;
    }
    return s == HS_OK ? hs_pp_flush(p, e) : s;
}

hs_status hs_pp_forward_only(hs_pp *p, hs_model *m, const hs_model_hooks *hooks,
                             const hs_batch *b, double *loss_sum, float *logits, hs_error *e) {
    int64_t numel = hs_model_stage_numel(m, b);
    hs_status s = HS_OK;
    if (!hs_model_is_first_stage(m)) {
        hs_dtype dt;
        void *in = hs_model_stage_input(m, 0, &dt);
        hs_pp_post_recv_forward(p, 0, numel, dt, 0);
        s = hs_pp_take_forward(p, 0, in, NULL, e);
    }
    if (s == HS_OK)
        s = hs_model_stage_forward(m, 0, b, hooks, false, 0.0f, loss_sum, logits, NULL, e);
    if (s == HS_OK && !hs_model_is_last_stage(m)) {
        hs_dtype dt;
        const void *out = hs_model_stage_output(m, 0, &dt);
        s = hs_pp_send_forward(p, 0, out, numel, dt, NULL, 0, e);
    }
    return s == HS_OK ? hs_pp_flush(p, e) : s;
}
