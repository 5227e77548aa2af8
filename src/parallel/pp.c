/* Pipeline hand-over: activations and gradients between neighbouring
 * stages, one staging buffer per message of a step (parallel.h). The
 * staging buffers are device memory and the sends and receives run on the
 * device's compute stream, which copies messages into and out of them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/pp_internal.h"

#define PP_FWD_TAG 0x1000
#define PP_BWD_TAG 0x2000
#define PP_KEYS_MAX 0x1000 /* tags stay inside each direction's range */

/* One message and its second, small fp32 message (the MoE statistics
 * forward, their gradient backward). A receive from this stage itself
 * (zbv's turn on the last stage) is `local`: the send copies into its
 * buffer and no transfer runs. */
typedef struct pp_msg {
    void *buf;
    float *xbuf;
    hs_work *w, *xw;
    int64_t bytes, xn;
    bool local, arrived;
} pp_msg;

/* One direction: its group and the receives and sends of a step by key. */
typedef struct pp_lane {
    hs_pg *group;
    int tag; /* tag base */
    pp_msg *recv, *send;
} pp_lane;

struct hs_pp {
    hs_comm *comm;
    hs_device *dev; /* owns the staging buffers and copies messages through them */
    int stage, size, keys;
    pp_lane fwd, bwd;
    size_t cap;               /* bytes of each staging buffer */
    int64_t xcap;             /* fp32 values of each second-message buffer */
    double busy_s[3];         /* inside stage F, B and W actions (pp_run.c), by hs_pp_kind */
    hs_pp_schedule_kind kind; /* the chunks' placement (hs_pp_set_schedule) */
};

/* Bytes of one second-message buffer. */
static size_t xbuf_bytes(int64_t xcap) { return (size_t)(xcap > 0 ? xcap : 1) * sizeof(float); }

void hs_pp_message_numel(const hs_model_config *m, int micro_batch_size, int seq_len, int cp,
                         int64_t *numel, int64_t *extra) {
    *numel = (int64_t)micro_batch_size * (seq_len / cp) * m->dim;
    *extra = hs_model_arch_moe(m) ? 2 * (int64_t)m->moe.num_experts + 2 : 0;
}

int64_t hs_pp_staging_bytes(hs_checked *ck, int64_t max_numel, int64_t max_extra, int keys) {
    /* two lanes, each with a receive and a send per key */
    int64_t cap = hs_ck_mul(ck, max_numel > 0 ? max_numel : 1, (int64_t)sizeof(float));
    int64_t one = hs_ck_add(ck, cap, (int64_t)xbuf_bytes(max_extra));
    return hs_ck_prod(ck, (const int64_t[]){4, keys, one}, 3);
}

static hs_status msgs_alloc(hs_device *d, pp_msg **out, int keys, size_t cap, int64_t xcap,
                            hs_error *e) {
    pp_msg *m = *out = calloc((size_t)keys, sizeof *m);
    if (!m) return hs_error_oom(e, "pipeline: %d messages", keys);
    size_t xb = xbuf_bytes(xcap);
    for (int k = 0; k < keys; k++) {
        m[k].buf = hs_device_alloc(d, cap);
        m[k].xbuf = hs_device_alloc(d, xb);
        if (!m[k].buf || !m[k].xbuf)
            return hs_error_oom(e,
                                "pipeline: %d x %zu bytes of "
                                "staging",
                                keys, cap + xb);
    }
    return HS_OK;
}

static hs_status lane_init(hs_pp *p, pp_lane *l, const char *name, int colour, int tag,
                           hs_comm_queue q, hs_error *e) {
    *l = (pp_lane){.tag = tag};
    hs_status s = hs_comm_split_queue(p->comm, name, colour, p->stage, q, &l->group, e);
    if (s == HS_OK) s = msgs_alloc(p->dev, &l->recv, p->keys, p->cap, p->xcap, e);
    if (s == HS_OK) s = msgs_alloc(p->dev, &l->send, p->keys, p->cap, p->xcap, e);
    return s;
}

hs_status hs_pp_create(hs_comm *comm, hs_device *dev, const hs_topology *t, int world_rank,
                       int64_t max_numel, int64_t max_extra, int keys, const char *prefix,
                       hs_pp **out, hs_error *e) {
    *out = NULL;
    if (keys < 1 || keys > PP_KEYS_MAX)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "pipeline: %d messages per step and direction "
                            "(micro-batches x virtual stages) is more than %d; use fewer "
                            "micro-batches per step",
                            keys, PP_KEYS_MAX);
    hs_pp *p = calloc(1, sizeof *p);
    if (!p) return hs_error_oom(e, "pipeline: its context");
    int colour = hs_topology_group_index(t, HS_DIM_PP, world_rank);
    p->comm = comm;
    p->dev = dev;
    p->stage = hs_topology_coords(t, world_rank).pp;
    p->size = t->pp;
    p->keys = keys;
    p->cap = (size_t)(max_numel > 0 ? max_numel : 1) * sizeof(float);
    p->xcap = max_extra;
    p->kind = HS_PP_1F1B;
    char fname[96], bname[96];
    snprintf(fname, sizeof fname, "%spp_forward", prefix ? prefix : "");
    snprintf(bname, sizeof bname, "%spp_backward", prefix ? prefix : "");
    hs_status s = lane_init(p, &p->fwd, fname, colour, PP_FWD_TAG, HS_COMM_QUEUE_PP_FORWARD, e);
    if (s == HS_OK)
        s = lane_init(p, &p->bwd, bname, colour, PP_BWD_TAG, HS_COMM_QUEUE_PP_BACKWARD, e);
    if (s != HS_OK) {
        hs_pp_free(p);
        return s;
    }
    *out = p;
    return HS_OK;
}

static void msgs_free(hs_device *d, pp_msg *m, int keys) {
    for (int k = 0; m && k < keys; k++) {
        if (m[k].buf) hs_device_free_mem(d, m[k].buf);
        if (m[k].xbuf) hs_device_free_mem(d, m[k].xbuf);
    }
    free(m);
}

void hs_pp_free(hs_pp *p) {
    if (!p) return;
    hs_error e;
    hs_error_clear(&e);
    (void)hs_pp_flush(p, &e);
    msgs_free(p->dev, p->fwd.recv, p->keys);
    msgs_free(p->dev, p->fwd.send, p->keys);
    msgs_free(p->dev, p->bwd.recv, p->keys);
    msgs_free(p->dev, p->bwd.send, p->keys);
    free(p);
}

int hs_pp_stage(const hs_pp *p) { return p->stage; }
int hs_pp_size(const hs_pp *p) { return p->size; }
void hs_pp_set_schedule(hs_pp *p, hs_pp_schedule_kind kind) { p->kind = kind; }
hs_pp_schedule_kind hs_pp_placement(const hs_pp *p) { return p->kind; }

static pp_msg *msg_at(const hs_pp *p, pp_msg *m, int key, int64_t numel, hs_dtype dt, int64_t xn) {
    size_t n = (size_t)numel * hs_dtype_size(dt);
    HS_ASSERT(key >= 0 && key < p->keys && numel >= 0 && n <= p->cap && xn >= 0 && xn <= p->xcap);
    m[key].bytes = (int64_t)n;
    m[key].xn = xn;
    return &m[key];
}

static void post_recv(hs_pp *p, pp_lane *l, int key, int from, int64_t numel, hs_dtype dt,
                      int64_t xn) {
    pp_msg *m = msg_at(p, l->recv, key, numel, dt, xn);
    HS_ASSERT(m->w == NULL && !m->local && from >= 0 && from < p->size);
    if (from == p->stage) {
        m->local = true, m->arrived = false;
        return;
    }
    hs_stream *s = p->dev->stream;
    m->w = hs_pg_recv_async(l->group, s, m->buf, numel, dt, from, l->tag + key);
    if (xn) m->xw = hs_pg_recv_async(l->group, s, m->xbuf, xn, HS_DTYPE_F32, from, l->tag + key);
}

/* Wait for *w (if any) on the compute stream; the first failure wins. */
static hs_status wait_work(const hs_pp *p, hs_work **w, hs_status s, hs_error *e) {
    if (!*w) return s;
    hs_error we;
    hs_error_clear(&we);
    hs_status ws = hs_work_wait_stream(*w, p->dev->stream, &we);
    *w = NULL;
    if (s == HS_OK && ws != HS_OK) *e = we, s = ws;
    return s;
}

static hs_status take(hs_pp *p, pp_lane *l, int key, void *dst, float *xdst, hs_error *e) {
    HS_ASSERT(key >= 0 && key < p->keys);
    pp_msg *m = &l->recv[key];
    HS_ASSERT((m->local ? m->arrived : m->w != NULL) && (!m->xn || xdst));
    m->local = m->arrived = false;
    hs_status s = wait_work(p, &m->w, HS_OK, e);
    s = wait_work(p, &m->xw, s, e);
    /* a failed hand-over leaves the neighbours waiting: end every rank */
    if (s != HS_OK) hs_comm_abort(p->comm, e);
    hs_dev_copy(p->dev, dst, m->buf, (size_t)m->bytes);
    if (m->xn) hs_dev_copy(p->dev, xdst, m->xbuf, (size_t)m->xn * sizeof(float));
    return s;
}

/* A message to this stage itself goes straight into the receive's buffer. */
static void send_local(hs_pp *p, pp_lane *l, int key, const void *src, int64_t numel, hs_dtype dt,
                       const float *extra, int64_t xn) {
    pp_msg *m = &l->recv[key];
    HS_ASSERT(m->local && !m->arrived && m->xn == xn &&
              m->bytes == numel * (int64_t)hs_dtype_size(dt));
    hs_dev_copy(p->dev, m->buf, src, (size_t)m->bytes);
    if (xn) hs_dev_copy(p->dev, m->xbuf, extra, (size_t)xn * sizeof(float));
    m->arrived = true;
}

static hs_status send(hs_pp *p, pp_lane *l, int key, int to, const void *src, int64_t numel,
                      hs_dtype dt, const float *extra, int64_t xn, hs_error *e) {
    (void)e;
    HS_ASSERT(!xn || extra);
    HS_ASSERT(to >= 0 && to < p->size);
    if (to == p->stage) {
        send_local(p, l, key, src, numel, dt, extra, xn);
        return HS_OK;
    }
    pp_msg *m = msg_at(p, l->send, key, numel, dt, xn);
    /* a key is sent once per step: its previous send went out at the flush */
    HS_ASSERT(m->w == NULL && m->xw == NULL);
    hs_dev_copy(p->dev, m->buf, src, (size_t)m->bytes);
    hs_stream *s = p->dev->stream;
    m->w = hs_pg_send_async(l->group, s, m->buf, numel, dt, to, l->tag + key);
    if (xn) {
        hs_dev_copy(p->dev, m->xbuf, extra, (size_t)xn * sizeof(float));
        m->xw = hs_pg_send_async(l->group, s, m->xbuf, xn, HS_DTYPE_F32, to, l->tag + key);
    }
    return HS_OK;
}

void hs_pp_post_recv_forward(hs_pp *p, int key, int from, int64_t numel, hs_dtype dt,
                             int64_t extra) {
    post_recv(p, &p->fwd, key, from, numel, dt, extra);
}

hs_status hs_pp_take_forward(hs_pp *p, int key, void *dst, float *extra, hs_error *e) {
    return take(p, &p->fwd, key, dst, extra, e);
}

hs_status hs_pp_send_forward(hs_pp *p, int key, int to, const void *src, int64_t numel, hs_dtype dt,
                             const float *extra, int64_t extra_n, hs_error *e) {
    return send(p, &p->fwd, key, to, src, numel, dt, extra, extra_n, e);
}

void hs_pp_post_recv_backward(hs_pp *p, int key, int from, int64_t numel, int64_t extra) {
    post_recv(p, &p->bwd, key, from, numel, HS_DTYPE_F32, extra);
}

hs_status hs_pp_take_backward(hs_pp *p, int key, float *dst, float *extra, hs_error *e) {
    return take(p, &p->bwd, key, dst, extra, e);
}

hs_status hs_pp_send_backward(hs_pp *p, int key, int to, const float *src, int64_t numel,
                              const float *extra, int64_t extra_n, hs_error *e) {
    return send(p, &p->bwd, key, to, src, numel, HS_DTYPE_F32, extra, extra_n, e);
}

static hs_status lane_flush(const hs_pp *p, pp_lane *l, hs_status s, hs_error *e) {
    for (int k = 0; l->send && k < p->keys; k++) {
        s = wait_work(p, &l->send[k].w, s, e);
        s = wait_work(p, &l->send[k].xw, s, e);
    }
    for (int k = 0; l->recv && k < p->keys; k++)
        HS_ASSERT(l->recv[k].w == NULL && !l->recv[k].local);
    return s;
}

hs_status hs_pp_flush(hs_pp *p, hs_error *e) {
    hs_status s = lane_flush(p, &p->fwd, HS_OK, e);
    return lane_flush(p, &p->bwd, s, e);
}

double hs_pp_busy_seconds(const hs_pp *p) { return p->busy_s[0] + p->busy_s[1] + p->busy_s[2]; }
double hs_pp_busy_seconds_of(const hs_pp *p, hs_pp_kind kind) { return p->busy_s[kind]; }
void hs_pp_reset_stats(hs_pp *p) {
    for (int k = 0; k < 3; k++) p->busy_s[k] = 0.0;
}

void hs_pp_add_busy(hs_pp *p, hs_pp_kind kind, double seconds) { p->busy_s[kind] += seconds; }
