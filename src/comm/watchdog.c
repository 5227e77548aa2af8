/* comm/watchdog.c — ends every rank when a collective or a send / recv
 * hangs, naming who is missing.
 *
 * Each rank runs a watchdog thread with a communicator of its own. It
 *  - answers queries from other ranks: "how far did you get on group slot
 *    s, and what is the oldest operation outstanding on that group's queue
 *    now?" (answered from this rank's published state, so it works while
 *    the program sleeps or computes and while the communication threads are
 *    blocked in MPI);
 *  - arbitrates, on world rank 0 (rank 1 when 0 does not answer), which
 *    timed-out rank gets to report (the first to ask), so a hang prints one
 *    message, not one per rank;
 *  - watches every queue: when its oldest outstanding operation (a running
 *    collective, or a pipeline send / recv in flight) is older than the
 *    timeout, it claims the report, asks the members of the group how far
 *    they got, prints one message, tells every rank to exit and calls
 *    MPI_Abort, all within 2 s;
 *  - on world rank 0 (the next rank when 0 is the one failing or has not
 *    answered a question of this rank's watchdog), prints the one line
 *    that points at a rank ending the job with hs_comm_abort, which waits
 *    for it (hs_watchdog_notify_failure) before MPI_Abort kills everyone.
 * Everything a report needs (the survey's tables, the request list, the
 * message) is allocated when the watchdog starts, so reporting a hang
 * never waits on memory and never fails for want of it.
 * Point-to-point messages are used rather than one-sided windows because
 * Open MPI's osc/rdma over the vader transport crashes on atomics with
 * MPI_THREAD_MULTIPLE, and this design works the same across nodes. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/group.h"

#define TAG_ASK 1
#define TAG_ACK 3
/* Replies to each kind of question carry a tag of their own, so a reply
 * that comes after its asker gave up never answers a later question. */
#define TAG_REPLY(kind) (10 + (kind))
#define ASK_STATE 0
#define ASK_CLAIM 1
#define ASK_FAILED 2 /* "I am ending the job": print the one line pointing at me */
#define ASK_END 3    /* "the job ends with this exit code": exit now, silently */
#define ASK_FP 4     /* "your fingerprint of group slot s" (fingerprint.c) */
#define POLL_S 0.02
/* The job must end within 2 s of the timeout: the claim, the survey and the
 * notice share that budget with MPI_Abort's own teardown. A live watchdog
 * answers within one poll (plus scheduling on a loaded node); a rank that
 * is silent for longer is stopped, dead or starved, and is reported so. */
#define CLAIM_ARBITERS 2
#define CLAIM_WAIT_S 0.25 /* per arbiter */
#define SURVEY_WAIT_S 0.7 /* from the timeout, the claim included */
#define NOTICE_WAIT_S 0.25
#define DENIED_WAIT_S 30.0
#define RESUMED_GAP_S 1.0 /* a watchdog tick this late: the process was frozen */

/* A reply to ASK_STATE: entered seq on the slot, the queue of the slot's
 * group, then that queue's current work. */
enum { R_ENTERED, R_QUEUE, R_BUSY, R_OP, R_SLOT, R_SEQ, R_PEER, R_ELAPSED_MS, R_IN_FLIGHT, R_LEN };
/* A reply to ASK_FP: count (-1: no member), hash, agreed, n, then the last
 * n <= FP_ENTRIES entries of the slot's fingerprint, oldest first. */
#define FP_ENTRIES 16
#define FP_LEN (4 + 4 * FP_ENTRIES)
#define FP_LINES 4 /* groups compared in one report, at most */

struct hs_watchdog {
    hs_comm *c;
    MPI_Comm comm;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    MPI_Request ask_req;
    int64_t ask_buf[2];
    bool claimed;        /* world rank 0: a rank already reports */
    atomic_bool *silent; /* [world size] did not answer this watchdog in time */
    /* The report's memory, [world size] each (a group is never larger). */
    MPI_Request *req;
    int *ranks, *asked;
    int64_t (*rep)[R_LEN], (*asked_rep)[R_LEN];
    bool *answered, *behind, *asked_ok;
    hs_error *report;
    int64_t fp_rep[FP_LEN];
    hs_fp_entry fp_mine[FP_ENTRIES];
};

/* The queue of the group in `slot` on this rank (the default queue when
 * this rank has not created that group yet). Entries below nslots are
 * complete: group_register publishes nslots after writing them. */
static hs_comm_queue slot_queue(const hs_comm *c, int slot) {
    if (slot < 0 || slot >= atomic_load(&c->nslots) || !c->groups[slot].pg)
        return HS_COMM_QUEUE_DEFAULT;
    return hs_pg_queue(c->groups[slot].pg);
}

/* This rank's fingerprint of the group in the slot asked about. */
static void answer_fp(hs_watchdog *wd, int src) {
    hs_comm *c = wd->c;
    int slot = (int)wd->ask_buf[1];
    int64_t reply[FP_LEN] = {-1};
    const hs_pg *g = slot >= 0 && slot < atomic_load(&c->nslots) ? c->groups[slot].pg : NULL;
    if (g) {
        hs_fp_entry mine[FP_ENTRIES];
        pthread_mutex_lock(&g->queue->mu);
        hs_fp_view v = hs_fp_view_of(g, mine, FP_ENTRIES);
        pthread_mutex_unlock(&g->queue->mu);
        reply[0] = v.count, reply[1] = v.hash, reply[2] = v.agreed, reply[3] = v.n;
        memcpy(reply + 4, mine, (size_t)v.n * sizeof *mine);
    }
    /* Under a kilobyte: sent eagerly, never blocks on the asker. */
    MPI_Send(reply, FP_LEN, MPI_INT64_T, src, TAG_REPLY(ASK_FP), wd->comm);
}

static void answer(hs_watchdog *wd, int src) {
    hs_comm *c = wd->c;
    int64_t reply[R_LEN] = {0};
    /* Exit at once rather than wait for MPI_Abort's teardown: it ends ranks
     * with SIGTERM, which a program may take as a request to finish its
     * step (hypershard train does), and then waits a second before
     * SIGKILL. A rank stopped meanwhile exits when it is continued. */
    if (wd->ask_buf[0] == ASK_END) _exit((int)wd->ask_buf[1]);
    if (wd->ask_buf[0] == ASK_FAILED) {
        fprintf(stderr,
                "hypershard: rank %d of %d: stopping: rank %lld failed (its message is "
                "above)\n",
                c->rank, c->size, (long long)wd->ask_buf[1]);
        fflush(stderr);
        MPI_Send(reply, 1, MPI_INT64_T, src, TAG_ACK, wd->comm);
        return;
    }
    if (wd->ask_buf[0] == ASK_FP) {
        answer_fp(wd, src);
        return;
    }
    if (wd->ask_buf[0] == ASK_CLAIM) {
        reply[0] = !wd->claimed;
        wd->claimed = true;
    } else {
        int slot = (int)wd->ask_buf[1];
        hs_comm_queue q = slot_queue(c, slot);
        hs_comm_current cur = hs_comm_current_get(c, q);
        reply[R_ENTERED] = slot >= 0 && slot < HS_COMM_MAX_GROUPS ? atomic_load(&c->entered[slot])
                                                                  : -1;
        reply[R_QUEUE] = q;
        reply[R_BUSY] = cur.busy;
        reply[R_OP] = cur.op;
        reply[R_SLOT] = cur.slot;
        reply[R_SEQ] = cur.seq;
        reply[R_PEER] = cur.peer_world;
        reply[R_ELAPSED_MS] = cur.busy ? (int64_t)((hs_now() - cur.started) * 1000) : 0;
        reply[R_IN_FLIGHT] = cur.in_flight;
    }
    /* A few bytes: sent eagerly, never blocks on the asker. */
    MPI_Send(reply, R_LEN, MPI_INT64_T, src, TAG_REPLY(wd->ask_buf[0]), wd->comm);
}

/* Answer every pending question. */
static void serve(hs_watchdog *wd) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        MPI_Test(&wd->ask_req, &flag, &st);
        if (!flag) return;
        answer(wd, st.MPI_SOURCE);
        MPI_Irecv(wd->ask_buf, 2, MPI_INT64_T, MPI_ANY_SOURCE, TAG_ASK, wd->comm, &wd->ask_req);
    }
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Send `kind` questions to `n` ranks and collect the replies until
 * `deadline`, serving other ranks' questions meanwhile. answered[i] tells
 * who replied in time. */
static void ask_ranks(hs_watchdog *wd, int kind, int slot, const int *ranks, int n, double deadline,
                      int64_t *replies, int len, bool *answered) {
    HS_ASSERT(n <= wd->c->size);
    MPI_Request *req = wd->req;
    int64_t ask[2] = {kind, slot};
    for (int i = 0; i < n; i++) {
        answered[i] = false;
        MPI_Irecv(replies + (size_t)i * (size_t)len, len, MPI_INT64_T, ranks[i], TAG_REPLY(kind),
                  wd->comm, &req[i]);
        MPI_Send(ask, 2, MPI_INT64_T, ranks[i], TAG_ASK, wd->comm);
    }
    int left = n;
    while (left > 0 && hs_now() < deadline) {
        serve(wd);
        for (int i = 0; i < n; i++) {
            int flag = 0;
            if (answered[i]) continue;
            MPI_Test(&req[i], &flag, MPI_STATUS_IGNORE);
            if (flag) answered[i] = true, left--;
        }
        if (left > 0) sleep_s(POLL_S / 4);
    }
    for (int i = 0; i < n; i++)
        if (!answered[i]) {
            atomic_store(&wd->silent[ranks[i]], true);
            MPI_Cancel(&req[i]);
            MPI_Request_free(&req[i]);
        }
}

/* Whether this rank reports the hang. World rank 0 arbitrates; when it
 * does not answer (stopped or dead, often the very rank that hangs), rank 1
 * does, so that hang still gets one message. An arbiter decides its own
 * claim locally. */
static bool claim_report(hs_watchdog *wd) {
    for (int arbiter = 0; arbiter < CLAIM_ARBITERS && arbiter < wd->c->size; arbiter++) {
        if (wd->c->rank == arbiter) {
            bool mine = !wd->claimed;
            wd->claimed = true;
            return mine;
        }
        int64_t reply[1][R_LEN];
        bool answered;
        ask_ranks(wd, ASK_CLAIM, 0, &arbiter, 1, hs_now() + CLAIM_WAIT_S, reply[0], R_LEN,
                  &answered);
        if (answered) return reply[0][0] != 0;
    }
    return true; /* no arbiter answers: report anyway */
}

/* What the asked rank is doing; `cur` is the hung operation on this rank. */
static void describe_rank(const hs_comm *c, char *buf, size_t cap, const int64_t *rep,
                          bool answered, hs_comm_current cur) {
    if (!answered) {
        snprintf(buf, cap, "did not answer the watchdog (stopped, hung inside MPI or dead)");
    } else if (!rep[R_BUSY] && hs_comm_op_is_p2p(cur.op)) {
        snprintf(buf, cap,
                 "its communication thread (%s queue) is idle: the program has not "
                 "issued the matching %s (still computing, or it skipped or reordered a "
                 "hand-over)",
                 hs_comm_queue_name((hs_comm_queue)rep[R_QUEUE]),
                 cur.op == HS_OP_SEND ? "recv" : "send");
    } else if (!rep[R_BUSY]) {
        snprintf(buf, cap,
                 "its communication thread (%s queue) is idle: the program has not "
                 "issued this collective (still computing, or it skipped or reordered a "
                 "collective)",
                 hs_comm_queue_name((hs_comm_queue)rep[R_QUEUE]));
    } else if (rep[R_IN_FLIGHT]) {
        snprintf(buf, cap,
                 "its %s queue has had %s %s world rank %lld on group '%s' (send/recv "
                 "number %lld) in flight for %.1f s",
                 hs_comm_queue_name((hs_comm_queue)rep[R_QUEUE]),
                 hs_comm_op_name((hs_comm_op)rep[R_OP]), rep[R_OP] == HS_OP_SEND ? "to" : "from",
                 (long long)rep[R_PEER], hs_comm_slot_name(c, (int)rep[R_SLOT]),
                 (long long)rep[R_SEQ], (double)rep[R_ELAPSED_MS] / 1000.0);
    } else {
        snprintf(buf, cap,
                 "its communication thread (%s queue) has been in %s on group '%s' "
                 "(sequence %lld) for %.1f s",
                 hs_comm_queue_name((hs_comm_queue)rep[R_QUEUE]),
                 hs_comm_op_name((hs_comm_op)rep[R_OP]), hs_comm_slot_name(c, (int)rep[R_SLOT]),
                 (long long)rep[R_SEQ], (double)rep[R_ELAPSED_MS] / 1000.0);
    }
}

/* What the other ranks of a hung collective answered. */
typedef struct survey {
    int n;      /* ranks asked */
    int *ranks; /* their world ranks */
    int64_t (*rep)[R_LEN];
    bool *answered;
    bool *behind; /* has not arrived at the hung collective */
} survey;

static bool survey_has(const survey *v, int rank) {
    for (int i = 0; i < v->n; i++)
        if (v->ranks[i] == rank) return true;
    return false;
}

/* The index of world rank `rank` in ranks[n], or -1. */
static int index_of(const int *ranks, int n, int rank) {
    for (int i = 0; i < n; i++)
        if (ranks[i] == rank) return i;
    return -1;
}

/* Entry i of v: what world rank v->ranks[i] says about `slot`. The first
 * round (every member asked about the hung slot at once) answers for that
 * slot; a rank silent to this watchdog is not asked again; other slots
 * take one more question. */
static void survey_hop(hs_watchdog *wd, survey *v, int i, int slot, int hung_slot, const int *asked,
                       int nasked, int64_t (*rep)[R_LEN], const bool *ok) {
    int k = index_of(asked, nasked, v->ranks[i]);
    if (slot == hung_slot && k >= 0) {
        memcpy(v->rep[i], rep[k], sizeof v->rep[i]);
        v->answered[i] = ok[k];
    } else if (atomic_load(&wd->silent[v->ranks[i]])) {
        v->answered[i] = false;
    } else {
        ask_ranks(wd, ASK_STATE, slot, &v->ranks[i], 1, hs_now() + CLAIM_WAIT_S, v->rep[i], R_LEN,
                  &v->answered[i]);
    }
}

/* A send / recv. Every other member of the group is asked at once, so the
 * ranks that cannot answer are known by the deadline. The report starts at
 * the peer and, while the rank asked is itself waiting on a send / recv
 * with another rank, goes on to that one: a chain of pipeline stages
 * waiting on each other, up to the rank that holds it up. Members that did
 * not answer and are not on the chain come last, so a stopped or dead
 * stage is named even when the waits the chain follows run in a circle. */
static void survey_p2p(hs_watchdog *wd, survey *v, hs_comm_current cur, const hs_pg *g,
                       double deadline) {
    const int self = wd->c->rank;
    int *asked = wd->asked;
    int64_t(*rep)[R_LEN] = wd->asked_rep;
    bool *ok = wd->asked_ok;
    int nasked = 0;
    for (int i = 0; i < g->size; i++)
        if (g->world_ranks[i] != self) asked[nasked++] = g->world_ranks[i];
    ask_ranks(wd, ASK_STATE, cur.slot, asked, nasked, deadline, rep[0], R_LEN, ok);
    int slot = cur.slot, next = cur.peer_world;
    while (next != self && !survey_has(v, next) && v->n < wd->c->size) {
        int i = v->n++;
        v->ranks[i] = next;
        survey_hop(wd, v, i, slot, cur.slot, asked, nasked, rep, ok);
        const int64_t *r = v->rep[i];
        if (!v->answered[i] || !r[R_BUSY] || !hs_comm_op_is_p2p((hs_comm_op)r[R_OP])) break;
        slot = (int)r[R_SLOT];
        next = (int)r[R_PEER];
    }
    v->behind[0] = true; /* the peer; the rest is context */
    for (int k = 0; k < nasked; k++)
        if (!ok[k] && !survey_has(v, asked[k]) && v->n < wd->c->size) v->ranks[v->n++] = asked[k];
}

static survey survey_take(hs_watchdog *wd, hs_comm_current cur, const hs_pg *g, double deadline) {
    HS_ASSERT(g->size <= wd->c->size);
    survey v = {.ranks = wd->ranks, .rep = wd->rep, .answered = wd->answered, .behind = wd->behind};
    memset(v.answered, 0, (size_t)wd->c->size * sizeof *v.answered);
    memset(v.behind, 0, (size_t)wd->c->size * sizeof *v.behind);
    if (hs_comm_op_is_p2p(cur.op)) {
        survey_p2p(wd, &v, cur, g, deadline);
        return v;
    }
    for (int i = 0; i < g->size; i++)
        if (g->world_ranks[i] != wd->c->rank) v.ranks[v.n++] = g->world_ranks[i];
    ask_ranks(wd, ASK_STATE, cur.slot, v.ranks, v.n, deadline, v.rep[0], R_LEN, v.answered);
    for (int i = 0; i < v.n; i++) v.behind[i] = !v.answered[i] || v.rep[i][R_ENTERED] < cur.seq;
    return v;
}

/* " 1 3 7": the asked ranks whose behind flag equals `which`, in world rank
 * order, with `self` (which has arrived) among the arrived. Returns the count. */
static int survey_list(const survey *v, bool which, int self, char *buf, size_t cap) {
    size_t len = 0;
    int count = 0;
    buf[0] = '\0';
    for (int i = 0; i <= v->n; i++) {
        bool self_here = !which && self >= 0 && (i == v->n || v->ranks[i] > self);
        if (self_here) {
            count++;
            if (len + 16 < cap) len += (size_t)snprintf(buf + len, cap - len, " %d", self);
            self = -1;
        }
        if (i == v->n || v->behind[i] != which) continue;
        count++;
        if (len + 16 < cap) len += (size_t)snprintf(buf + len, cap - len, " %d", v->ranks[i]);
    }
    return count;
}

/* One report line when this rank's fingerprint of `slot` and world rank
 * `rank`'s differ other than by rank being behind. Returns true when it
 * added one. */
static bool fp_line(hs_watchdog *wd, int slot, int rank) {
    const hs_comm *c = wd->c;
    const hs_pg *g = c->groups[slot].pg;
    if (!g || atomic_load(&wd->silent[rank])) return false;
    /* Another instance of the same group name (another stage's 'tp')
     * issues other collectives by design: compare only within ours. */
    bool member = false;
    for (int i = 0; i < g->size && !member; i++) member = g->world_ranks[i] == rank;
    if (!member) return false;
    bool answered = false;
    ask_ranks(wd, ASK_FP, slot, &rank, 1, hs_now() + CLAIM_WAIT_S, wd->fp_rep, FP_LEN, &answered);
    const int64_t *r = wd->fp_rep;
    if (!answered || r[0] < 0 || r[3] < 0 || r[3] > FP_ENTRIES) return false;
    pthread_mutex_lock(&g->queue->mu);
    hs_fp_view mine = hs_fp_view_of(g, wd->fp_mine, FP_ENTRIES);
    pthread_mutex_unlock(&g->queue->mu);
    hs_fp_view theirs = {rank, r[0], r[1], r[2], (const hs_fp_entry *)(r + 4), (int)r[3]};
    char what[768];
    if (!hs_fp_describe(g->name, &mine, &theirs, true, what, sizeof what)) return false;
    hs_error_append(wd->report, HS_ERR_TIMEOUT, "  collective fingerprints differ: %s", what);
    return true;
}

/* The fingerprints of the hung group and of the groups the ranks not
 * arrived are busy on, compared with theirs: a collective skipped or of
 * another size on one side shows as the first entry that differs. */
static void fp_lines(hs_watchdog *wd, const survey *v, int hung_slot) {
    int lines = 0;
    for (int i = 0; i < v->n && lines < FP_LINES; i++) {
        if (!v->behind[i] || !v->answered[i]) continue;
        const int64_t *r = v->rep[i];
        lines += fp_line(wd, hung_slot, v->ranks[i]);
        bool elsewhere = r[R_BUSY] && !hs_comm_op_is_p2p((hs_comm_op)r[R_OP]) &&
                         r[R_SLOT] != hung_slot && r[R_SLOT] >= 0 &&
                         r[R_SLOT] < atomic_load(&wd->c->nslots);
        if (elsewhere && lines < FP_LINES) lines += fp_line(wd, (int)r[R_SLOT], v->ranks[i]);
    }
}

static void report_and_abort(hs_watchdog *wd, hs_comm_current cur, double timeout,
                             double deadline) {
    hs_comm *c = wd->c;
    const bool p2p = hs_comm_op_is_p2p(cur.op);
    const hs_pg *g = c->groups[cur.slot].pg;
    survey v = survey_take(wd, cur, g, deadline);
    hs_error *e = wd->report;
    char missing[1024], arrived[1024], why[512], peer[64] = "";
    int nmissing = survey_list(&v, true, -1, missing, sizeof missing);
    int narrived = survey_list(&v, false, c->rank, arrived, sizeof arrived);
    if (p2p)
        snprintf(peer, sizeof peer, " %s world rank %d", cur.op == HS_OP_SEND ? "to" : "from",
                 cur.peer_world);
    hs_error_clear(e);
    hs_error_set(
        e, HS_ERR_TIMEOUT,
        "comm timeout: %s%s on group '%s' (%s %lld) did not finish within comm.timeout_s = "
        "%g s on world rank %d; not arrived: %s%s",
        hs_comm_op_name(cur.op), peer, g->name, p2p ? "send/recv number" : "sequence",
        (long long)cur.seq, timeout, c->rank, nmissing == 1 ? "world rank" : "world ranks",
        nmissing ? missing : " none");
    for (int i = 0; i < v.n; i++) {
        if (!v.behind[i] && !p2p) continue;
        describe_rank(c, why, sizeof why, v.rep[i], v.answered[i], cur);
        if (v.answered[i] && !p2p)
            hs_error_append(e, HS_ERR_TIMEOUT,
                            "  world rank %d: last entered sequence %lld on '%s'; %s", v.ranks[i],
                            (long long)v.rep[i][R_ENTERED], g->name, why);
        else hs_error_append(e, HS_ERR_TIMEOUT, "  world rank %d: %s", v.ranks[i], why);
    }
    if (!p2p) {
        hs_error_append(e, HS_ERR_TIMEOUT, "  arrived: world rank%s%s", narrived > 1 ? "s" : "",
                        arrived);
        fp_lines(wd, &v, cur.slot);
    }
    hs_error_append(
        e, HS_ERR_TIMEOUT, "  fix: %s; if the wait is legitimate, raise comm.timeout_s",
        p2p ? "every send needs the peer's matching recv (same group, tag and size), "
              "in an order that cannot wait in a cycle"
            : "every rank of a group must issue the same collectives in the same order");
    hs_comm_abort(c, e); /* ends the process */
}

static void on_timeout(hs_watchdog *wd, hs_comm_current cur, double timeout) {
    double now = hs_now();
    if (claim_report(wd)) report_and_abort(wd, cur, timeout, now + SURVEY_WAIT_S);
    /* Another rank reports and aborts the job; keep answering its questions. */
    double until = hs_now() + DENIED_WAIT_S;
    while (hs_now() < until) {
        serve(wd);
        sleep_s(POLL_S);
    }
    hs_error e;
    hs_error_set(&e, HS_ERR_TIMEOUT,
                 "a collective on group '%s' passed its timeout of %.0f s; the rank that took "
                 "the report did not end the job within %.0f s, so this one does",
                 cur.slot >= 0 && cur.slot < atomic_load(&wd->c->nslots)
                     ? wd->c->groups[cur.slot].name
                     : "?",
                 timeout, DENIED_WAIT_S);
    hs_comm_abort(wd->c, &e);
}

static bool wait_tick(hs_watchdog *wd) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)(POLL_S * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&wd->mu);
    if (!wd->stop) pthread_cond_timedwait(&wd->cv, &wd->mu, &ts);
    bool stop = wd->stop;
    pthread_mutex_unlock(&wd->mu);
    return !stop;
}

static void *watchdog_main(void *arg) {
    hs_watchdog *wd = arg;
    hs_comm *c = wd->c;
    MPI_Irecv(wd->ask_buf, 2, MPI_INT64_T, MPI_ANY_SOURCE, TAG_ASK, wd->comm, &wd->ask_req);
    double tick = hs_now(), since = tick;
    while (wait_tick(wd)) {
        serve(wd);
        double now = hs_now(), timeout = atomic_load(&c->timeout_s);
        /* A tick this late means this process was frozen (SIGSTOP, a
         * debugger, a suspended VM): what it waited on meanwhile is not its
         * peers' fault, and when MPI_Abort's teardown continues a stopped
         * rank it must not report a second time. Time from here. */
        if (now - tick > RESUMED_GAP_S) since = now;
        tick = now;
        for (int q = 0; q < HS_COMM_QUEUE_COUNT; q++) {
            hs_comm_current cur = hs_comm_current_get(c, (hs_comm_queue)q);
            double from = cur.started > since ? cur.started : since;
            if (cur.busy && now - from > timeout) on_timeout(wd, cur, timeout);
        }
    }
    MPI_Cancel(&wd->ask_req);
    MPI_Wait(&wd->ask_req, MPI_STATUS_IGNORE);
    return NULL;
}

static void watchdog_free(hs_watchdog *wd) {
    free(wd->silent);
    free(wd->req);
    free(wd->ranks);
    free(wd->asked);
    free(wd->rep);
    free(wd->asked_rep);
    free(wd->answered);
    free(wd->behind);
    free(wd->asked_ok);
    free(wd->report);
    free(wd);
}

/* The watchdog and the memory of its report, or NULL. */
static hs_watchdog *watchdog_alloc(size_t n, size_t *bytes) {
    size_t rep = n * sizeof(int64_t[R_LEN]);
    *bytes = sizeof(hs_watchdog) + sizeof(hs_error) +
             n * (sizeof(atomic_bool) + sizeof(MPI_Request) + 2 * sizeof(int) + 3 * sizeof(bool)) +
             2 * rep;
    hs_watchdog *wd = calloc(1, sizeof *wd);
    if (!wd) return NULL;
    wd->silent = calloc(n, sizeof *wd->silent);
    wd->req = calloc(n, sizeof *wd->req);
    wd->ranks = calloc(n, sizeof *wd->ranks);
    wd->asked = calloc(n, sizeof *wd->asked);
    wd->rep = calloc(n, sizeof *wd->rep);
    wd->asked_rep = calloc(n, sizeof *wd->asked_rep);
    wd->answered = calloc(n, sizeof *wd->answered);
    wd->behind = calloc(n, sizeof *wd->behind);
    wd->asked_ok = calloc(n, sizeof *wd->asked_ok);
    wd->report = malloc(sizeof *wd->report);
    if (wd->silent && wd->req && wd->ranks && wd->asked && wd->rep && wd->asked_rep &&
        wd->answered && wd->behind && wd->asked_ok && wd->report)
        return wd;
    watchdog_free(wd);
    return NULL;
}

hs_status hs_watchdog_start(hs_comm *c, hs_error *e) {
    size_t bytes = 0;
    hs_watchdog *wd = watchdog_alloc((size_t)c->size, &bytes);
    if (!wd)
        return hs_error_oom(e, "starting the comm watchdog: %zu bytes for %d ranks", bytes,
                            c->size);
    wd->c = c;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &wd->comm);
    if (rc != MPI_SUCCESS) {
        watchdog_free(wd);
        return hs_error_set(e, HS_ERR_COMM,
                            "starting the comm watchdog: MPI_Comm_dup failed (code %d)", rc);
    }
    pthread_condattr_t attr;
    HS_CHECK_PTHREAD(pthread_condattr_init(&attr));
    HS_CHECK_PTHREAD(pthread_condattr_setclock(&attr, CLOCK_MONOTONIC));
    HS_CHECK_PTHREAD(pthread_cond_init(&wd->cv, &attr));
    pthread_condattr_destroy(&attr);
    HS_CHECK_PTHREAD(pthread_mutex_init(&wd->mu, NULL));
    rc = pthread_create(&wd->thread, NULL, watchdog_main, wd);
    if (rc != 0) {
        pthread_cond_destroy(&wd->cv);
        pthread_mutex_destroy(&wd->mu);
        MPI_Comm_free(&wd->comm);
        watchdog_free(wd);
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "starting the comm watchdog: pthread_create failed: %s; check the "
                            "limit on threads (ulimit -u)",
                            strerror(rc));
    }
    c->watchdog = wd;
    return HS_OK;
}

void hs_watchdog_stop(hs_comm *c) {
    hs_watchdog *wd = c->watchdog;
    if (!wd) return;
    pthread_mutex_lock(&wd->mu);
    wd->stop = true;
    pthread_cond_signal(&wd->cv);
    pthread_mutex_unlock(&wd->mu);
    HS_CHECK_PTHREAD(pthread_join(wd->thread, NULL));
    pthread_cond_destroy(&wd->cv);
    pthread_mutex_destroy(&wd->mu);
    MPI_Comm_free(&wd->comm);
    watchdog_free(wd);
    c->watchdog = NULL;
}

/* Tell every other rank's watchdog to end its process with exit_code. */
static void tell_end(hs_watchdog *wd, int exit_code) {
    int64_t ask[2] = {ASK_END, exit_code};
    for (int r = 0; r < wd->c->size; r++)
        if (r != wd->c->rank) MPI_Send(ask, 2, MPI_INT64_T, r, TAG_ASK, wd->comm); /* eager */
}

/* Who prints the line pointing at this rank: the lowest other rank that
 * has not been silent to this watchdog (no use waiting on a stopped rank). */
static int notice_target(const hs_watchdog *wd) {
    const hs_comm *c = wd->c;
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && !atomic_load(&wd->silent[r])) return r;
    return c->rank == 0 ? 1 : 0;
}

void hs_watchdog_notify_failure(hs_comm *c, int exit_code) {
    hs_watchdog *wd = c->watchdog;
    if (!wd || c->size < 2) return;
    int to = notice_target(wd);
    int64_t ask[2] = {ASK_FAILED, c->rank}, ack = 0;
    MPI_Request req;
    MPI_Irecv(&ack, 1, MPI_INT64_T, to, TAG_ACK, wd->comm, &req);
    /* Two integers: sent eagerly, so a dead peer does not block it. */
    MPI_Send(ask, 2, MPI_INT64_T, to, TAG_ASK, wd->comm);
    int flag = 0;
    double deadline = hs_now() + NOTICE_WAIT_S;
    while (!flag && hs_now() < deadline) {
        MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
        if (!flag) sleep_s(POLL_S / 4);
    }
    if (!flag) {
        MPI_Cancel(&req);
        MPI_Request_free(&req);
    }
    tell_end(wd, exit_code);
}
