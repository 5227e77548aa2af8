/* comm/stage.c: collectives on device memory the host cannot address go
 * through pinned host buffers of the queue, on 2 and 4 ranks.
 * HS_MPI_RANKS: 2 4
 * HS_TEST_TIMEOUT: 120
 *
 * A cpu device stands for a GPU: its host_visible is set false (the public
 * field a GPU backend sets) and it runs under the device guard
 * (HS_DEVICE_GUARD=1), so its memory is PROT_NONE whenever the device is
 * not inside one of its own members: a staged collective that let MPI
 * touch a device buffer would fault, and a copy in the wrong direction is
 * refused. Every op (all-gather out of place and in place, reduce-scatter,
 * all-reduce, broadcast, all-to-all, all-to-allv with gaps between the
 * received blocks, send / recv on the default queue, and sends and
 * receives in flight together on a pipeline queue) in every dtype and
 * reduction gives the bits of the unstaged path (host buffers, NULL
 * stream), leaves what the op does not write untouched, and makes exactly
 * the copies the design says. A second pass allocates nothing; a device
 * not given to hs_comm_set_device is refused; a staging buffer the host
 * pool refuses is an HS_ERR_OOM on every rank. The choice between NCCL and
 * MPI-with-staging picks MPI for this device and follows its rule on
 * made-up GPU tables. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "mpi_test_util.h"
#include "comm/group.h"
#include "hypershard/comm.h"

typedef struct ctx {
    hs_comm *comm;
    hs_pg *world;
    int rank, size;
    int failures;
    hs_device *d;
    hs_stream *s;
} ctx;

static const hs_dtype dtypes[3] = {HS_DTYPE_F32, HS_DTYPE_BF16, HS_DTYPE_F16};

/* ------------------------------------------------ counting the copies */

static atomic_int copies[HS_COPY_KIND_COUNT];
static void (*device_copy)(hs_stream *s, void *dst, const void *src, size_t bytes,
                           hs_copy_kind kind);

static void counting_copy(hs_stream *s, void *dst, const void *src, size_t bytes,
                          hs_copy_kind kind) {
    atomic_fetch_add(&copies[kind], 1);
    device_copy(s, dst, src, bytes, kind);
}

static void copies_reset(void) {
    for (int k = 0; k < HS_COPY_KIND_COUNT; k++) atomic_store(&copies[k], 0);
}

/* ------------------------------------------------------ buffers */

/* Element i of rank r's input for case `salt`, representable in dt. */
static float value(int r, int64_t i, uint64_t salt) {
    return (hs_rng_uniform(77 + salt, (uint64_t)r, (uint64_t)i) * 2.0f - 1.0f) *
           (float)(1 + (i % 37));
}

static void fill(void *buf, hs_dtype dt, int64_t n, int r, uint64_t salt) {
    float *f = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) f[i] = value(r, i, salt);
    hs_convert(buf, dt, f, HS_DTYPE_F32, n);
    free(f);
}

static void *to_device(ctx *t, const void *host, size_t bytes) {
    void *p = hs_device_alloc(t->d, bytes ? bytes : 1);
    hs_device_copy_async(t->s, p, host, bytes, HS_COPY_H2D);
    hs_stream_synchronize(t->s);
    return p;
}

static void *from_device(ctx *t, const void *dev, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    hs_device_copy_async(t->s, h, dev, bytes, HS_COPY_D2H);
    hs_stream_synchronize(t->s);
    return h;
}

/* ------------------------------------------------------ the cases */

/* One collective: its sizes and the copies staging makes for it. In place
 * (all-reduce, broadcast, all-gather's own block): the input lies in the
 * output buffer at in_at. */
typedef struct op_case {
    const char *what;
    hs_comm_op op;
    hs_dtype dt;
    hs_reduce_op red;
    int64_t count;
    size_t in_bytes, out_bytes;
    bool in_place;
    size_t in_at;
    int root;
    const int64_t *sc, *sd, *rc, *rd;
    int d2h, h2d;
} op_case;

static hs_work *issue(hs_pg *g, hs_stream *s, const op_case *c, void *out, const void *in) {
    switch (c->op) {
    case HS_OP_ALL_GATHER: return hs_pg_all_gather_async(g, s, out, in, c->count, c->dt);
    case HS_OP_REDUCE_SCATTER:
        return hs_pg_reduce_scatter_async(g, s, out, in, c->count, c->dt, c->red);
    case HS_OP_ALL_REDUCE: return hs_pg_all_reduce_async(g, s, out, c->count, c->dt, c->red);
    case HS_OP_BROADCAST: return hs_pg_broadcast_async(g, s, out, c->count, c->dt, c->root);
    case HS_OP_ALL_TO_ALL: return hs_pg_all_to_all_async(g, s, out, in, c->count, c->dt);
    case HS_OP_ALL_TO_ALLV:
        return hs_pg_all_to_allv_async(g, s, out, c->rc, c->rd, in, c->sc, c->sd, c->dt);
    default: hs_panic("no case for %s", hs_comm_op_name(c->op));
    }
}

/* The case on host buffers with no stream (the unstaged path), then on
 * device buffers of the guarded, not host-visible device: the same output
 * bytes, sentinel bytes included, and the copies expected. */
static void run_case(ctx *t, hs_pg *g, const op_case *c, uint64_t salt) {
    size_t es = hs_dtype_size(c->dt);
    void *in = malloc(c->in_bytes ? c->in_bytes : 1);
    fill(in, c->dt, (int64_t)(c->in_bytes / es), hs_pg_rank(g), salt);
    unsigned char *init = malloc(c->out_bytes ? c->out_bytes : 1);
    memset(init, 0xA5, c->out_bytes);
    if (c->in_place) memcpy(init + c->in_at, in, c->in_bytes);
    unsigned char *ref = malloc(c->out_bytes ? c->out_bytes : 1);
    memcpy(ref, init, c->out_bytes);
    hs_error e;
    hs_work *w = issue(g, NULL, c, ref, c->in_place ? (void *)(ref + c->in_at) : in);
    CHECK_COUNT(t, hs_work_wait(w, &e) == HS_OK, "%s unstaged: %s", c->what, e.msg);

    char *dout = to_device(t, init, c->out_bytes);
    void *din = c->in_place ? dout + c->in_at : to_device(t, in, c->in_bytes);
    copies_reset();
    w = issue(g, t->s, c, dout, din);
    CHECK_COUNT(t, hs_work_wait_stream(w, t->s, &e) == HS_OK, "%s staged: %s", c->what, e.msg);
    int d2h = atomic_load(&copies[HS_COPY_D2H]), h2d = atomic_load(&copies[HS_COPY_H2D]);
    CHECK_COUNT(
        t, d2h == c->d2h && h2d == c->h2d,
        "%s on group '%s': %d device-to-host and %d host-to-device copies, expected %d and %d",
        c->what, hs_pg_name(g), d2h, h2d, c->d2h, c->h2d);
    unsigned char *got = from_device(t, dout, c->out_bytes);
    CHECK_COUNT(t, memcmp(got, ref, c->out_bytes) == 0,
                "%s on group '%s': the staged output differs from the unstaged one", c->what,
                hs_pg_name(g));
    hs_device_free_mem(t->d, dout);
    if (!c->in_place) hs_device_free_mem(t->d, din);
    free(in), free(init), free(ref), free(got);
}

/* all_to_allv: rank r sends r + j + 1 elements to j; received blocks sit
 * `gap` elements apart (gap 0: packed). */
typedef struct v_layout {
    int64_t sc[8], sd[8], rc[8], rd[8];
    int64_t sn, rn;
} v_layout;

static v_layout v_make(int rank, int w, int64_t gap) {
    HS_ASSERT(w <= 8);
    v_layout v;
    memset(&v, 0, sizeof v);
    for (int j = 0; j < w; j++) {
        v.sc[j] = rank + j + 1, v.sd[j] = v.sn, v.sn += v.sc[j];
        v.rc[j] = j + rank + 1, v.rd[j] = v.rn, v.rn += v.rc[j] + gap;
    }
    return v;
}

/* A case of one copy in and one out. */
static op_case mk(const char *what, hs_comm_op op, hs_dtype dt, int64_t count, size_t in_bytes,
                  size_t out_bytes) {
    return (op_case){.what = what,
                     .op = op,
                     .dt = dt,
                     .count = count,
                     .in_bytes = in_bytes,
                     .out_bytes = out_bytes,
                     .d2h = 1,
                     .h2d = 1};
}

/* Every op on g, with copy counts: one input copy and one output copy
 * each, all-to-allv with gaps one output copy per received block. */
static void run_all_cases(ctx *t, hs_pg *g) {
    const int w = hs_pg_size(g), r = hs_pg_rank(g);
    uint64_t salt = 0;
    for (int k = 0; k < 3; k++) {
        const hs_dtype dt = dtypes[k];
        const size_t es = hs_dtype_size(dt), n = 1001;
        op_case ag = mk("all_gather", HS_OP_ALL_GATHER, dt, n, n * es, w * n * es);
        run_case(t, g, &ag, ++salt);
        ag.what = "all_gather in place", ag.in_place = true, ag.in_at = (size_t)r * n * es;
        run_case(t, g, &ag, ++salt);
        for (int op = 0; op < HS_REDUCE_OP_COUNT; op++) {
            op_case rs = mk("reduce_scatter", HS_OP_REDUCE_SCATTER, dt, n, w * n * es, n * es);
            rs.red = (hs_reduce_op)op;
            run_case(t, g, &rs, ++salt);
            op_case ar = mk("all_reduce", HS_OP_ALL_REDUCE, dt, n, n * es, n * es);
            ar.red = (hs_reduce_op)op, ar.in_place = true;
            run_case(t, g, &ar, ++salt);
        }
        op_case bc = mk("broadcast", HS_OP_BROADCAST, dt, n, n * es, n * es);
        bc.in_place = true, bc.root = w - 1;
        run_case(t, g, &bc, ++salt);
        op_case aa = mk("all_to_all", HS_OP_ALL_TO_ALL, dt, 300, w * 300 * es, w * 300 * es);
        run_case(t, g, &aa, ++salt);
        for (int64_t gap = 0; gap < 2; gap++) {
            v_layout v = v_make(r, w, gap);
            op_case av = mk(gap ? "all_to_allv with gaps" : "all_to_allv packed", HS_OP_ALL_TO_ALLV,
                            dt, 0, (size_t)v.sn * es, (size_t)v.rn * es);
            av.sc = v.sc, av.sd = v.sd, av.rc = v.rc, av.rd = v.rd;
            av.h2d = gap ? w : 1;
            run_case(t, g, &av, ++salt);
        }
    }
    /* Larger than the buffers so far (one grows), and empty (no copies). */
    op_case big =
        mk("all_reduce of 300000", HS_OP_ALL_REDUCE, HS_DTYPE_F32, 300000, 1200000, 1200000);
    big.in_place = true;
    run_case(t, g, &big, ++salt);
    op_case none = mk("empty all_reduce", HS_OP_ALL_REDUCE, HS_DTYPE_BF16, 0, 0, 0);
    none.in_place = true, none.d2h = none.h2d = 0;
    run_case(t, g, &none, ++salt);
}

static void test_every_op_staged_matches_unstaged_bitwise(ctx *t) {
    hs_pg *rev = NULL;
    hs_error e;
    CHECK_COUNT(t, hs_comm_split(t->comm, "reversed", 0, -t->rank, &rev, &e) == HS_OK, "%s", e.msg);
    run_all_cases(t, t->world);
    if (rev) run_all_cases(t, rev);
    /* The second pass reuses the staging buffers: no allocation. */
    long long before = atomic_load(&t->d->host_pool.allocs);
    run_all_cases(t, t->world);
    long long after = atomic_load(&t->d->host_pool.allocs);
    CHECK_COUNT(t, after == before, "a second pass of every op allocated %lld staging buffers",
                after - before);
}

/* The blocking form runs inline on the calling thread when the queue is
 * idle, staged the same way. */
static void test_blocking_all_reduce_is_staged(ctx *t) {
    const int64_t n = 4096;
    float *h = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    fill(h, HS_DTYPE_F32, n, t->rank, 900);
    memcpy(want, h, n * sizeof(float));
    hs_error e;
    CHECK_COUNT(t,
                hs_pg_all_reduce(t->world, NULL, want, n, HS_DTYPE_F32, HS_REDUCE_MAX, &e) == HS_OK,
                "%s", e.msg);
    void *dv = to_device(t, h, n * sizeof(float));
    copies_reset();
    CHECK_COUNT(t,
                hs_pg_all_reduce(t->world, t->s, dv, n, HS_DTYPE_F32, HS_REDUCE_MAX, &e) == HS_OK,
                "%s", e.msg);
    CHECK_COUNT(t, atomic_load(&copies[HS_COPY_D2H]) == 1 && atomic_load(&copies[HS_COPY_H2D]) == 1,
                "blocking all_reduce: %d and %d copies", atomic_load(&copies[HS_COPY_D2H]),
                atomic_load(&copies[HS_COPY_H2D]));
    float *got = from_device(t, dv, n * sizeof(float));
    CHECK_COUNT(t, memcmp(got, want, n * sizeof(float)) == 0, "blocking all_reduce differs");
    hs_device_free_mem(t->d, dv);
    free(h), free(want), free(got);
}

/* Element i of message k from rank r. */
static float msg_value(int r, int k, int64_t i) { return (float)(r * 100000 + k * 1000 + i % 997); }

/* Around the ring on group g: each rank posts `msgs` receives from its
 * left (last tag first), then `msgs` sends to its right, all async, each
 * of n floats (rendezvous-sized, so they are in flight together on a
 * pipeline queue). Every message lands, one copy in per send and one out
 * per receive. */
static void ring_messages(ctx *t, hs_pg *g, int msgs, int64_t n, const char *what) {
    const int w = hs_pg_size(g), me = hs_pg_rank(g);
    const int right = (me + 1) % w, left = (me + w - 1) % w;
    enum { MAX_MSGS = 4 };
    HS_ASSERT(msgs <= MAX_MSGS);
    void *rb[MAX_MSGS], *sb[MAX_MSGS];
    hs_work *rw[MAX_MSGS], *sw[MAX_MSGS];
    float *h = malloc((size_t)n * sizeof(float));
    for (int k = 0; k < msgs; k++) {
        for (int64_t i = 0; i < n; i++) h[i] = msg_value(hs_pg_world_rank(g, me), k, i);
        sb[k] = to_device(t, h, (size_t)n * sizeof(float));
        rb[k] = hs_device_alloc(t->d, (size_t)n * sizeof(float));
    }
    copies_reset();
    bool send_first = msgs == 1 && me % 2 == 0; /* blocking queues: even ranks send first */
    for (int k = 0; send_first && k < msgs; k++)
        sw[k] = hs_pg_send_async(g, t->s, sb[k], n, HS_DTYPE_F32, right, 40 + k);
    for (int k = msgs - 1; k >= 0; k--)
        rw[k] = hs_pg_recv_async(g, t->s, rb[k], n, HS_DTYPE_F32, left, 40 + k);
    for (int k = 0; !send_first && k < msgs; k++)
        sw[k] = hs_pg_send_async(g, t->s, sb[k], n, HS_DTYPE_F32, right, 40 + k);
    hs_error e;
    for (int k = 0; k < msgs; k++) {
        CHECK_COUNT(t, hs_work_wait_stream(sw[k], t->s, &e) == HS_OK, "%s send %d: %s", what, k,
                    e.msg);
        CHECK_COUNT(t, hs_work_wait_stream(rw[k], t->s, &e) == HS_OK, "%s recv %d: %s", what, k,
                    e.msg);
    }
    CHECK_COUNT(
        t, atomic_load(&copies[HS_COPY_D2H]) == msgs && atomic_load(&copies[HS_COPY_H2D]) == msgs,
        "%s: %d and %d copies for %d sends and receives", what, atomic_load(&copies[HS_COPY_D2H]),
        atomic_load(&copies[HS_COPY_H2D]), msgs);
    for (int k = 0; k < msgs; k++) {
        float *got = from_device(t, rb[k], (size_t)n * sizeof(float));
        int bad = 0;
        for (int64_t i = 0; i < n; i++) bad += got[i] != msg_value(hs_pg_world_rank(g, left), k, i);
        CHECK_COUNT(t, bad == 0, "%s: message %d from rank %d: %d wrong elements", what, k, left,
                    bad);
        free(got);
        hs_device_free_mem(t->d, sb[k]);
        hs_device_free_mem(t->d, rb[k]);
    }
    free(h);
}

static void test_send_recv_staged_on_default_and_pipeline_queues(ctx *t) {
    ring_messages(t, t->world, 1, 100000, "default-queue send/recv");
    hs_pg *pp = NULL;
    hs_error e;
    CHECK_COUNT(t,
                hs_comm_split_queue(t->comm, "pp_ring", 0, t->rank, HS_COMM_QUEUE_PP_FORWARD, &pp,
                                    &e) == HS_OK,
                "%s", e.msg);
    if (pp) ring_messages(t, pp, 4, 100000, "pipeline-queue sends and receives in flight");
    if (pp) ring_messages(t, pp, 3, 10, "pipeline-queue small messages");
}

/* A device the context was not given: its buffers would outlive it, so the
 * collective fails, on every rank alike, before any communication. */
static void test_device_not_given_is_refused(ctx *t) {
    hs_device *other = NULL;
    hs_error e;
    CHECK_COUNT(t, hs_device_create(HS_DEVICE_CPU, NULL, &other, &e) == HS_OK, "%s", e.msg);
    if (!other) return;
    other->host_visible = false;
    float x[16] = {0};
    void *dx = hs_device_alloc(other, sizeof x);
    hs_device_copy(other, dx, x, sizeof x, HS_COPY_H2D);
    hs_status st =
        hs_pg_all_reduce(t->world, other->stream, dx, 16, HS_DTYPE_F32, HS_REDUCE_SUM, &e);
    CHECK_COUNT(t, st == HS_ERR_INTERNAL && strstr(e.msg, "hs_comm_set_device"),
                "a collective on a device not given: status %d: %s", (int)st, st ? e.msg : "");
    hs_device_free_mem(other, dx);
    hs_device_free(other);
}

/* A host pool that refuses the staging buffer: HS_ERR_OOM naming it. */
static void test_staging_out_of_memory_is_reported(ctx *t) {
    hs_error e;
    /* Released and given again: no idle buffer left to reuse. */
    CHECK_COUNT(t, hs_comm_set_device(t->comm, NULL, &e) == HS_OK, "%s", e.msg);
    CHECK_COUNT(t, hs_comm_set_device(t->comm, t->d, &e) == HS_OK, "%s", e.msg);
    const int64_t n = 1 << 16;
    float *h = calloc(n, sizeof(float));
    void *dv = to_device(t, h, n * sizeof(float));
    hs_pool_set_limit(&t->d->host_pool, 1024);
    hs_status st = hs_pg_all_reduce(t->world, t->s, dv, n, HS_DTYPE_F32, HS_REDUCE_SUM, &e);
    hs_pool_set_limit(&t->d->host_pool, 0);
    CHECK_COUNT(t, st == HS_ERR_OOM && strstr(e.msg, "staging buffer"),
                "staging refused by the host pool: status %d: %s", (int)st, st ? e.msg : "");
    hs_device_free_mem(t->d, dv);
    free(h);
}

/* ------------------------------------------------------ the choice */

static void test_backend_choice_rule(ctx *t) {
    hs_device cuda = {.kind = HS_DEVICE_CUDA, .host_visible = false, .ordinal = 0};
    CHECK_COUNT(t, hs_comm_nccl_offered(&cuda, true, NULL), "a cuda device offers itself to NCCL");
    CHECK_COUNT(t, hs_comm_nccl_offered(&cuda, true, "auto"), "HS_COMM_BACKEND=auto");
    CHECK_COUNT(t, !hs_comm_nccl_offered(&cuda, true, "mpi"), "HS_COMM_BACKEND=mpi keeps MPI");
    CHECK_COUNT(t, !hs_comm_nccl_offered(&cuda, false, NULL), "no NCCL built: MPI");
    CHECK_COUNT(t, !hs_comm_nccl_offered(NULL, true, NULL), "no device: MPI");
    hs_device visible = cuda;
    visible.host_visible = true;
    CHECK_COUNT(t, !hs_comm_nccl_offered(&visible, true, NULL), "host-visible memory: MPI");
    CHECK_COUNT(t, !hs_comm_nccl_offered(t->d, true, NULL),
                "a cpu device, even not host visible: MPI");
    hs_device no_gpu = cuda;
    no_gpu.ordinal = -1;
    CHECK_COUNT(t, !hs_comm_nccl_offered(&no_gpu, true, NULL), "no ordinal: MPI");

    /* World ranks 0..5: two nodes (hosts 11 and 22), GPUs 0 and 1 on each,
     * rank 4 on node 11's GPU 1 again, rank 5 offering none. */
    const hs_gpu_id world[6] = {{11, 0}, {11, 1}, {22, 0}, {22, 1}, {11, 1}, {22, -1}};
    const int four[4] = {0, 1, 2, 3}, shared[2] = {1, 4}, none[2] = {2, 5}, across[2] = {0, 2};
    CHECK_COUNT(t, hs_comm_nccl_fits(world, four, 4, HS_COMM_QUEUE_DEFAULT), "four distinct GPUs");
    CHECK_COUNT(t, hs_comm_nccl_fits(world, across, 2, HS_COMM_QUEUE_CRITICAL),
                "ordinal 0 on two nodes is two GPUs");
    CHECK_COUNT(t, !hs_comm_nccl_fits(world, shared, 2, HS_COMM_QUEUE_DEFAULT),
                "two ranks on one GPU: MPI");
    CHECK_COUNT(t, !hs_comm_nccl_fits(world, none, 2, HS_COMM_QUEUE_DEFAULT),
                "a rank without a GPU");
    CHECK_COUNT(t,
                !hs_comm_nccl_fits(world, four, 4, HS_COMM_QUEUE_PP_FORWARD) &&
                    !hs_comm_nccl_fits(world, four, 4, HS_COMM_QUEUE_PP_BACKWARD),
                "pipeline queues stay on MPI");
    CHECK_COUNT(t, hs_comm_nccl_fits(world, four, 1, HS_COMM_QUEUE_DEFAULT), "one rank with a GPU");
}

/* The context given this device chose MPI with staging for every group,
 * those made before and after: no rank offered a GPU. */
static void test_groups_on_this_device_stay_on_mpi(ctx *t) {
    hs_pg *later = NULL;
    hs_error e;
    CHECK_COUNT(t, hs_comm_split(t->comm, "after_device", 0, t->rank, &later, &e) == HS_OK, "%s",
                e.msg);
    CHECK_COUNT(t, !t->world->dev_backend && later && !later->dev_backend,
                "a group on a cpu device got a device backend");
    CHECK_COUNT(t, t->comm->gpu_ids != NULL, "the world's GPUs were gathered");
    for (int r = 0; t->comm->gpu_ids && r < t->size; r++)
        CHECK_COUNT(t, t->comm->gpu_ids[r].ordinal == -1, "rank %d offered GPU %lld", r,
                    (long long)t->comm->gpu_ids[r].ordinal);
    setenv("HS_COMM_BACKEND", "nccl2", 1);
    hs_device *before = t->comm->device;
    CHECK_COUNT(t, hs_comm_set_device(t->comm, NULL, &e) == HS_OK, "releasing never fails");
    hs_status st = hs_comm_set_device(t->comm, t->d, &e);
    CHECK_COUNT(t, st == HS_ERR_USAGE && strstr(e.msg, "HS_COMM_BACKEND='nccl2'"),
                "a bad HS_COMM_BACKEND: status %d: %s", (int)st, st ? e.msg : "");
    CHECK_COUNT(t, t->comm->device == NULL, "a refused device is not set");
    unsetenv("HS_COMM_BACKEND");
    CHECK_COUNT(t, hs_comm_set_device(t->comm, before, &e) == HS_OK, "%s", e.msg);
}

int main(int argc, char **argv) {
    ctx t = {0};
    hs_error e;
    hs_comm_options opt = {.timeout_s = 60};
    /* The guard keeps the device's memory closed to the host. */
    setenv("HS_DEVICE_GUARD", "1", 1);
    if (hs_comm_init(&t.comm, &argc, &argv, &opt, &e) != HS_OK) {
        fprintf(stderr, "hs_comm_init: %s\n", e.msg);
        return 1;
    }
    t.world = hs_comm_world(t.comm);
    t.rank = hs_comm_rank(t.comm);
    t.size = hs_comm_size(t.comm);
    mt_cpu_device(&t.d, &t.s);
    CHECK_COUNT(&t, t.d->guard != NULL, "HS_DEVICE_GUARD=1 installs the guard");
    const hs_device_ops *counting_base = t.d->ops;
    hs_device_ops counting = *counting_base;
    device_copy = counting.copy;
    counting.copy = counting_copy;
    t.d->ops = &counting;
    t.d->host_visible = false; /* as a GPU's */
    CHECK_COUNT(&t, hs_comm_set_device(t.comm, t.d, &e) == HS_OK, "%s", e.msg);

    test_backend_choice_rule(&t);
    test_groups_on_this_device_stay_on_mpi(&t);
    test_every_op_staged_matches_unstaged_bitwise(&t);
    test_blocking_all_reduce_is_staged(&t);
    test_send_recv_staged_on_default_and_pipeline_queues(&t);
    test_device_not_given_is_refused(&t);
    test_staging_out_of_memory_is_reported(&t);

    long long held = atomic_load(&t.d->host_pool.current);
    CHECK_COUNT(&t, hs_comm_set_device(t.comm, NULL, &e) == HS_OK, "%s", e.msg);
    CHECK_COUNT(&t, atomic_load(&t.d->host_pool.current) == 0,
                "released staging still holds %lld bytes (%lld before)",
                (long long)atomic_load(&t.d->host_pool.current), held);
    int rc = mt_verdict(t.failures, t.rank, t.size);
    hs_stream_free(t.s);
    t.d->ops = counting_base;
    hs_device_free(t.d);
    hs_comm_finalize(t.comm);
    return rc;
}
