/* comm/: the critical queue progresses independently of the default queue,
 * each queue keeps issue order, the trace counts the collectives of both,
 * groups keep the queue they were created on, and the mesh puts tp, cp and
 * ep on the critical queue.
 * HS_MPI_RANKS: 2 4
 * HS_TEST_TIMEOUT: 120
 *
 * Independence is shown by a causal chain, never by timing. Every rank but
 * LATE issues an all-gather on a default-queue group; LATE does not issue it
 * yet, so it cannot finish anywhere. Then every rank runs an all-reduce on a
 * critical-queue group over the same ranks. On the ranks other than LATE
 * that all-reduce was issued behind the pending all-gather: it completes
 * only because it runs on another queue (with one queue every rank would
 * wait for the other side until the watchdog ends the job). Those ranks
 * then record that their all-gather is still pending, and a second critical
 * all-reduce brings the count to LATE, which issues its all-gather only
 * after that: the pending flags cannot be stale. The same chain runs with
 * the blocking and the async form, on the intra-node and the ring path. */
#include <stdlib.h>
#include <string.h>

#include "hypershard/mesh.h"
#include "mpi_test_util.h"

#define LATE 1 /* the rank that issues the default-queue all-gather last */

/* A default-queue and a critical-queue group over the same ranks (the
 * tensor-parallel case: both dims on one set of ranks). */
typedef struct queue_pair {
    hs_pg *dflt, *crit;
    const char *path;
} queue_pair;

static float ag_value(int r, int64_t i) { return (float)(r * 100) + (float)(i % 17); }

static void split_pair(hs_comm *c, queue_pair *p, const char *dflt, const char *crit,
                       const char *path) {
    hs_error e;
    hs_error_clear(&e);
    int rank = hs_comm_rank(c);
    CHECK(c, hs_comm_split_queue(c, dflt, 0, rank, HS_COMM_QUEUE_DEFAULT, &p->dflt, &e) == HS_OK,
          "%s", e.msg);
    CHECK(c, hs_comm_split_queue(c, crit, 0, rank, HS_COMM_QUEUE_CRITICAL, &p->crit, &e) == HS_OK,
          "%s", e.msg);
    p->path = path;
}

/* Sum over the critical group, blocking (inline on the idle critical queue
 * while the default queue is busy) or async + wait (on its thread). */
static float critical_sum(hs_comm *c, const queue_pair *p, float v, bool blocking) {
    hs_error e;
    hs_error_clear(&e);
    hs_status st =
        blocking
            ? hs_pg_all_reduce(p->crit, NULL, &v, 1, HS_DTYPE_F32, HS_REDUCE_SUM, &e)
            : hs_work_wait(
                  hs_pg_all_reduce_async(p->crit, NULL, &v, 1, HS_DTYPE_F32, HS_REDUCE_SUM), &e);
    CHECK(c, st == HS_OK, "%s", e.msg);
    return v;
}

static void check_critical_overtakes_pending_default(hs_comm *c, const queue_pair *p,
                                                     bool blocking) {
    enum { N = 5000 };
    const int w = hs_comm_size(c), me = hs_comm_rank(c);
    const char *form = blocking ? "blocking" : "async";
    hs_trace *tr = hs_comm_trace(c);
    hs_trace_reset_counters(tr);
    float *in = malloc(sizeof(float) * N), *out = calloc((size_t)N * (size_t)w, sizeof(float));
    for (int64_t i = 0; i < N; i++) in[i] = ag_value(me, i);
    hs_work *ag = me == LATE ? NULL
                             : hs_pg_all_gather_async(p->dflt, NULL, out, in, N, HS_DTYPE_F32);

    float ranks = critical_sum(c, p, 1.0f, blocking);
    CHECK(c, ranks == (float)w, "%s %s critical all_reduce gave %g, want %d", p->path, form, ranks,
          w);
    float pending = me != LATE && !hs_work_test(ag) ? 1.0f : 0.0f;
    float all_pending = critical_sum(c, p, pending, blocking);
    CHECK(c, all_pending == (float)(w - 1),
          "%s %s: %g of the %d ranks that issued the default-queue all_gather saw it pending after "
          "the critical all_reduce; want all of them (rank %d has not issued it yet)",
          p->path, form, all_pending, w - 1, LATE);

    if (me == LATE) ag = hs_pg_all_gather_async(p->dflt, NULL, out, in, N, HS_DTYPE_F32);
    hs_error e;
    hs_error_clear(&e);
    CHECK(c, hs_work_wait(ag, &e) == HS_OK, "%s", e.msg);
    int bad = 0;
    for (int r = 0; r < w; r++)
        for (int64_t i = 0; i < N; i++) bad += out[(int64_t)r * N + i] != ag_value(r, i);
    CHECK(c, bad == 0, "%s %s default-queue all_gather: %d wrong elements", p->path, form, bad);
    CHECK(c, hs_trace_collectives(tr, "all_reduce", hs_pg_name(p->crit)) == 2,
          "%s %s: %lld critical all_reduces counted, want 2", p->path, form,
          (long long)hs_trace_collectives(tr, "all_reduce", hs_pg_name(p->crit)));
    CHECK(c,
          hs_trace_collectives(tr, "all_gather", hs_pg_name(p->dflt)) == 1 &&
              hs_trace_collective_bytes(tr, "all_gather", hs_pg_name(p->dflt)) ==
                  (int64_t)w * N * (int64_t)sizeof(float),
          "%s %s: the default-queue all_gather was not counted with its bytes", p->path, form);
    CHECK(c, hs_trace_collectives(tr, NULL, NULL) == 3, "%s %s: %lld collectives counted, want 3",
          p->path, form, (long long)hs_trace_collectives(tr, NULL, NULL));
    free(in);
    free(out);
}

/* Small integers: SUM and MAX are exact in any order. */
static float order_value(int r, int k, int64_t i) { return (float)(r + k + (int)(i % 3)); }

/* Works alternate between the queues (and between two groups on each);
 * waiting on the last work of a queue must find every earlier work of that
 * queue done, because a queue's thread completes its works one by one in
 * issue order. The critical works reduce with MAX, the default ones with
 * SUM. */
static void check_each_queue_keeps_issue_order(hs_comm *c, const queue_pair *a,
                                               const queue_pair *b) {
    enum { K = 6, M = 20000 };
    const int w = hs_comm_size(c), me = hs_comm_rank(c);
    hs_pg *grp[K] = {a->dflt, a->crit, b->dflt, b->crit, a->dflt, a->crit};
    float *buf[K];
    hs_work *wk[K];
    for (int k = 0; k < K; k++) {
        buf[k] = malloc(sizeof(float) * M);
        for (int64_t i = 0; i < M; i++) buf[k][i] = order_value(me, k, i);
        hs_reduce_op op = k % 2 ? HS_REDUCE_MAX : HS_REDUCE_SUM;
        wk[k] = hs_pg_all_reduce_async(grp[k], NULL, buf[k], M, HS_DTYPE_F32, op);
        CHECK(c, hs_pg_queue(grp[k]) == (k % 2 ? HS_COMM_QUEUE_CRITICAL : HS_COMM_QUEUE_DEFAULT),
              "group '%s' is on the wrong queue", hs_pg_name(grp[k]));
    }
    hs_error e;
    hs_error_clear(&e);
    for (int q = 0; q < 2; q++) { /* the last default work, then the last critical one */
        int last = K - 2 + q;
        CHECK(c, hs_work_wait(wk[last], &e) == HS_OK, "%s", e.msg);
        wk[last] = NULL;
        for (int k = q; k < last; k += 2)
            CHECK(c, hs_work_test(wk[k]),
                  "work %d on '%s' is not done after work %d, issued later "
                  "on the same queue",
                  k, hs_pg_name(grp[k]), last);
    }
    for (int k = 0; k < K; k++)
        if (wk[k]) CHECK(c, hs_work_wait(wk[k], &e) == HS_OK, "%s", e.msg);
    int bad = 0;
    for (int k = 0; k < K; k++) {
        for (int64_t i = 0; i < M; i++) {
            float want = k % 2 ? order_value(w - 1, k, i) : 0.0f;
            for (int r = 0; r < w && k % 2 == 0; r++) want += order_value(r, k, i);
            bad += buf[k][i] != want;
        }
        free(buf[k]);
    }
    CHECK(c, bad == 0, "interleaved queues: %d wrong elements", bad);
}

/* The spans of `group` in the serialised trace, and how many of them carry
 * "queue":"<queue>" in their args (the args of one span hold no '}'). */
static int spans_on_queue(const char *body, const char *group, const char *queue, int *spans) {
    char gkey[96], qkey[64];
    snprintf(gkey, sizeof gkey, "\"group\":\"%s\"", group);
    snprintf(qkey, sizeof qkey, "\"queue\":\"%s\"", queue);
    int on_queue = 0;
    *spans = 0;
    for (const char *at = strstr(body, gkey); at; at = strstr(at + 1, gkey)) {
        const char *end = strchr(at, '}'), *q = strstr(at, qkey);
        (*spans)++;
        on_queue += q && end && q < end;
    }
    return on_queue;
}

static void check_trace_spans_name_the_queue(hs_comm *c, const queue_pair *p) {
    hs_error e;
    hs_error_clear(&e);
    char *body = NULL;
    size_t len = 0;
    CHECK(c, hs_trace_serialize(hs_comm_trace(c), 0.0, &body, &len, &e) == HS_OK, "%s", e.msg);
    int spans = 0, on = spans_on_queue(body, hs_pg_name(p->crit), "critical", &spans);
    CHECK(c, spans > 0 && on == spans, "%d of %d spans of '%s' name the critical queue", on, spans,
          hs_pg_name(p->crit));
    on = spans_on_queue(body, hs_pg_name(p->dflt), "default", &spans);
    CHECK(c, spans > 0 && on == spans, "%d of %d spans of '%s' name the default queue", on, spans,
          hs_pg_name(p->dflt));
    free(body);
}

/* A group keeps its queue for life: the cache returns it on that queue
 * whatever the later call asks; members that disagree get an error each. */
static void check_groups_keep_their_queue(hs_comm *c, const queue_pair *p) {
    const int me = hs_comm_rank(c);
    hs_error e;
    hs_error_clear(&e);
    CHECK(c, hs_pg_queue(hs_comm_world(c)) == HS_COMM_QUEUE_DEFAULT,
          "the world is not on the default queue");
    hs_pg *again = NULL;
    CHECK(c, hs_comm_split(c, hs_pg_name(p->crit), 5, 0, &again, &e) == HS_OK, "%s", e.msg);
    CHECK(c, again == p->crit && hs_pg_queue(again) == HS_COMM_QUEUE_CRITICAL,
          "the cached critical group changed");
    CHECK(c,
          hs_comm_split_queue(c, hs_pg_name(p->dflt), 5, 0, HS_COMM_QUEUE_CRITICAL, &again, &e) ==
              HS_OK,
          "%s", e.msg);
    CHECK(c, again == p->dflt && hs_pg_queue(again) == HS_COMM_QUEUE_DEFAULT,
          "the cached default group changed");
    hs_pg *none = (hs_pg *)1;
    CHECK(c,
          hs_comm_split_queue(c, "q_evens", me % 2 ? -1 : 0, 0, HS_COMM_QUEUE_CRITICAL, &none,
                              &e) == HS_OK,
          "%s", e.msg);
    CHECK(c, (me % 2 != 0) == (none == NULL), "colour < 0 on the critical queue must give NULL");
    CHECK(c, !none || hs_pg_queue(none) == HS_COMM_QUEUE_CRITICAL,
          "q_evens is not on the critical queue");
    hs_pg *mixed = (hs_pg *)1;
    hs_comm_queue mine = me == 0 ? HS_COMM_QUEUE_CRITICAL : HS_COMM_QUEUE_DEFAULT;
    CHECK(c,
          hs_comm_split_queue(c, "q_mixed", 0, me, mine, &mixed, &e) == HS_ERR_INTERNAL && !mixed,
          "members asking for different queues must all get an error");
    CHECK(c, strstr(e.msg, "q_mixed") && strstr(e.msg, "different queues"), "message: %s", e.msg);
    hs_error_clear(&e);
    CHECK(c,
          hs_comm_split_queue(c, "q_bad", 0, me, HS_COMM_QUEUE_COUNT, &mixed, &e) ==
                  HS_ERR_INTERNAL &&
              !mixed,
          "an out-of-range queue must be refused");
}

static void check_mesh_puts_model_parallel_dims_on_critical(hs_comm *c) {
    const int w = hs_comm_size(c);
    hs_topology t;
    hs_error e;
    hs_error_clear(&e);
    CHECK(c, hs_topology_derive(&t, w, 2, 1, w == 4 ? 2 : 1, 1, w / 2, 1, &e) == HS_OK, "%s",
          e.msg);
    hs_mesh *m = NULL;
    CHECK(c, hs_mesh_create(c, &t, &m, &e) == HS_OK, "%s", e.msg);
    for (int i = 0; i < HS_DIM_COUNT; i++) {
        hs_mesh_dim d = (hs_mesh_dim)i;
        hs_comm_queue want = d == HS_DIM_TP || d == HS_DIM_CP || d == HS_DIM_EP
                                 ? HS_COMM_QUEUE_CRITICAL
                                 : HS_COMM_QUEUE_DEFAULT;
        hs_pg *g = hs_mesh_group(m, d);
        CHECK(c, g && hs_pg_queue(g) == want, "mesh dim %s is on queue %d, want %d",
              hs_mesh_dim_name(d), g ? (int)hs_pg_queue(g) : -1, (int)want);
    }
    /* A TP-style step: the max over the tp group, then a sum over fsdp. */
    float v = (float)hs_comm_rank(c);
    CHECK(c,
          hs_pg_all_reduce(hs_mesh_group(m, HS_DIM_TP), NULL, &v, 1, HS_DTYPE_F32, HS_REDUCE_MAX,
                           &e) == HS_OK,
          "%s", e.msg);
    CHECK(c,
          hs_pg_all_reduce(hs_mesh_group(m, HS_DIM_FSDP), NULL, &v, 1, HS_DTYPE_F32, HS_REDUCE_SUM,
                           &e) == HS_OK,
          "%s", e.msg);
    float want = 0;
    for (int r = 1; r < w; r += 2) want += (float)r; /* tp pairs (2k, 2k+1): max is the odd one */
    CHECK(c, v == want, "max over tp then sum over fsdp gave %g, want %g", v, want);
    hs_mesh_free(m);
}

int main(int argc, char **argv) {
    hs_trace *trace = NULL;
    hs_comm *c = mt_traced_init(&argc, &argv, 30, true, &trace);
    queue_pair shm, ring;
    split_pair(c, &shm, "q_default", "q_critical", "intra-node");
    setenv("HS_COMM_SHM", "0", 1);
    split_pair(c, &ring, "q_ring_default", "q_ring_critical", "ring");
    unsetenv("HS_COMM_SHM");
    for (int blocking = 0; blocking < 2; blocking++) {
        check_critical_overtakes_pending_default(c, &shm, blocking);
        check_critical_overtakes_pending_default(c, &ring, blocking);
    }
    check_each_queue_keeps_issue_order(c, &shm, &ring);
    check_trace_spans_name_the_queue(c, &shm);
    check_groups_keep_their_queue(c, &shm);
    check_mesh_puts_model_parallel_dims_on_critical(c);
    if (hs_comm_rank(c) == 0) printf("OK: queues on %d ranks\n", hs_comm_size(c));
    mt_traced_finalize(c, trace);
    return 0;
}
