/* comm/group.h — the private structures of the communication layer.
 *
 * hs_comm owns: the world group, the cache of named groups, the work queues
 * (HS_COMM_QUEUE_COUNT of them, each with its communication thread), and
 * the watchdog thread. A group (hs_pg) is a backend vtable plus its ctx and
 * the queue it is bound to; everything above the backend (queues, sequence
 * numbers, trace, watchdog) is backend independent, so an nccl backend only
 * has to fill hs_pg_backend. A group may have a second backend for device
 * memory the host cannot address (nccl, pg_nccl.c); without one such
 * buffers are staged through pinned host memory for the first (stage.c).
 *
 * Threads: the caller's thread issues work (hs_pg_*_async) and waits on it;
 * each queue's communication thread executes that queue in issue order and
 * is the only thread that touches the communicators of the queue's groups
 * (a blocking call that runs inline holds the queue busy meanwhile), so two
 * threads may be inside MPI at once, never on the same communicator; the
 * watchdog thread watches every queue and answers diagnosis queries from
 * other ranks on a communicator of its own.
 */
#ifndef HYPERSHARD_COMM_GROUP_H
#define HYPERSHARD_COMM_GROUP_H

#include <pthread.h>
#include <stdatomic.h>

#include <mpi.h>

#include "hypershard/comm.h"

/* Group slots are numbered in creation order, which every rank agrees on
 * because groups are created collectively over the world. Slot 0 is the
 * world. The watchdog uses slots to ask other ranks how far they got. */
#define HS_COMM_MAX_GROUPS 512
#define HS_COMM_NAME_MAX 64

typedef enum hs_comm_op {
    HS_OP_ALL_GATHER = 0,
    HS_OP_REDUCE_SCATTER,
    HS_OP_ALL_REDUCE,
    HS_OP_BROADCAST,
    HS_OP_ALL_TO_ALL,
    HS_OP_ALL_TO_ALLV,
    HS_OP_SEND,
    HS_OP_RECV,
    HS_OP_BARRIER,
    HS_OP_COUNT
} hs_comm_op;

/* The trace / counter names of comm.h. */
const char *hs_comm_op_name(hs_comm_op op);
/* send and recv involve two ranks, not the whole group. */
bool hs_comm_op_is_p2p(hs_comm_op op);

/* One queued collective: everything the backend needs to execute it. */
typedef struct hs_coll_args {
    hs_comm_op op;
    hs_dtype dt;
    hs_reduce_op reduce;
    void *out;
    const void *in;
    int64_t count;
    int peer; /* broadcast root, send/recv peer (group ranks) */
    int tag;
    const int64_t *recv_counts, *recv_displs, *send_counts, *send_displs;
    hs_device *dev; /* the device of the stream it was issued on (NULL: host buffers) */
    /* Recorded on the issuing stream at issue when the group's device
     * backend runs it (NCCL): that backend's stream waits for it instead of
     * the host waiting for the issuing stream, and frees it. NULL: the host
     * waited. */
    hs_event *ready;
} hs_coll_args;

/* Frees a's ready event where no backend took it (a collective dropped
 * without running). */
static inline void hs_args_ready_free(hs_coll_args *a) {
    hs_event_free(a->ready);
    a->ready = NULL;
}

/* The backend of a group. `exec` runs one collective to completion on the
 * calling (communication) thread. */
typedef struct hs_pg_backend {
    const char *name;
    hs_status (*exec)(void *ctx, const hs_coll_args *a, hs_error *e);
    /* Optional, for a device backend whose collectives complete on a GPU
     * stream of its own (NCCL): enqueue puts a there and records *done on
     * that stream behind it, without waiting (exec = enqueue + complete);
     * complete waits for *done on the host and gives the collective's
     * outcome. The work item owns *done from enqueue on. */
    hs_status (*enqueue)(void *ctx, const hs_coll_args *a, hs_event **done, hs_error *e);
    hs_status (*complete)(void *ctx, const hs_coll_args *a, hs_event *done, hs_error *e);
    void (*destroy)(void *ctx);
    /* Send / recv without blocking (the pipeline queues): start posts it and
     * sets *req (NULL: not possible, exec it instead); test sets *done and
     * releases req once it is. */
    hs_status (*p2p_start)(void *ctx, const hs_coll_args *a, void **req, hs_error *e);
    hs_status (*p2p_test)(void *ctx, void *req, bool *done, hs_error *e);
    /* Which algorithm runs a on this group ("intra-node", "ring", "mpi",
     * "canonical"), for the trace; NULL: not said. */
    const char *(*path)(void *ctx, const hs_coll_args *a);
} hs_pg_backend;

typedef struct hs_queue hs_queue;

/* Whether a's buffers are device memory the host cannot address (a GPU's):
 * they go to the group's device backend, or through host staging. */
static inline bool hs_args_on_device(const hs_coll_args *a) {
    return a->dev && !a->dev->host_visible;
}

/* ------------------------------------------------ fingerprints (fingerprint.c)
 * Every collective (not send / recv) issued on a group is folded, in issue
 * order, into a running hash of (op, dtype, reduction or root, element
 * count, sequence number); the members of a group must end up with the
 * same hash. The last HS_FP_RING collectives are kept to name the first
 * one that differs. */
#define HS_FP_RING 64

typedef struct hs_fp_entry {
    int64_t seq;   /* sequence number on the group */
    int64_t desc;  /* op | dtype << 8 | (reduction or broadcast root + 1) << 16 */
    int64_t count; /* elements; -1 where ranks may differ (all_to_allv) */
    int64_t hash;  /* the group's running hash after this collective */
} hs_fp_entry;

typedef struct hs_fp {
    int64_t hash;                 /* over every collective issued on the group */
    int64_t agreed;               /* collectives the last check found alike on every member */
    hs_fp_entry ring[HS_FP_RING]; /* collective seq at seq % HS_FP_RING */
} hs_fp;

/* What one rank knows of one group's fingerprint: count -1 when it is no
 * member; entries[0 .. n) are its last collectives, oldest first. */
typedef struct hs_fp_view {
    int world_rank;
    int64_t count, hash, agreed;
    const hs_fp_entry *entries;
    int n;
} hs_fp_view;

/* A fault a test asks for (HS_COMM_TEST_FAULT=KIND:RANK:GROUP:SEQ): on
 * world rank RANK, collective SEQ on GROUP is not issued at all (skip),
 * issued with one element fewer (count), or, a reduction, with SUM for
 * another reduction and AVG for SUM (reduce). */
typedef enum hs_fp_fault_kind {
    HS_FP_FAULT_SKIP = 0,
    HS_FP_FAULT_COUNT,
    HS_FP_FAULT_REDUCE
} hs_fp_fault_kind;

typedef struct hs_fp_fault {
    bool armed;
    hs_fp_fault_kind kind;
    int rank;
    char group[HS_COMM_NAME_MAX];
    int64_t seq;
} hs_fp_fault;

struct hs_pg {
    hs_comm *comm;
    hs_queue *queue;              /* the queue its collectives run on, fixed at creation */
    const hs_pg_backend *backend; /* host memory (mpi) */
    void *ctx;
    /* Collectives on device memory the host cannot address (nccl), chosen
     * by select.c; NULL: such buffers are staged for `backend` (stage.c). */
    const hs_pg_backend *dev_backend;
    void *dev_ctx;
    char name[HS_COMM_NAME_MAX];
    int slot;
    int rank, size;
    int *world_ranks; /* [size] */
    int64_t next_seq; /* collectives issued on this group (under queue->mu) */
    int64_t next_p2p; /* send/recv issued on this group (under queue->mu) */
    hs_fp fp;         /* its collectives' fingerprint (under queue->mu) */
    int64_t *fp_all;  /* [size * 4] per-collective comparison (its executing thread) */
};

struct hs_work {
    hs_pg *pg;
    hs_coll_args args;
    int64_t seq;    /* per-group sequence number (collective or p2p counter) */
    hs_fp_entry fp; /* its fingerprint entry (collectives only) */
    hs_status status;
    hs_error *err; /* allocated only when the work fails */
    bool done;
    /* Set (under the queue's mu) once a device backend has enqueued it: a
     * stream that waits for this event sees the result (backend.enqueue). */
    hs_event *done_event;
    /* hs_work_wait_stream made a stream wait on done_event and went on: the
     * communication thread frees the item, and a failure ends the run. */
    bool detached;
    struct hs_work *next;
    /* a started, unfinished send / recv of a pipeline queue */
    void *req;
    struct hs_stage_buf *staged; /* its host copy while in flight (stage.c) */
    double started;
    struct hs_work *next_inflight;
};

/* What a queue's communication thread (or an inline blocking call on that
 * queue) is executing now, or a send / recv it started and still polls
 * (in_flight; read by the watchdog). */
typedef struct hs_comm_current {
    bool busy; /* false: nothing outstanding on the queue */
    bool in_flight;
    hs_comm_op op;
    int slot;
    int64_t seq;
    int peer_world; /* p2p: the other rank; -1 otherwise */
    double started;
} hs_comm_current;

/* A pinned host buffer of a queue's staging. */
typedef struct hs_stage_buf {
    void *p;
    size_t cap;
    struct hs_stage_buf *next;
} hs_stage_buf;

/* A queue's host staging (stage.c): the buffers through which collectives
 * on device memory the host cannot address reach a host backend, reused
 * from one collective to the next; a send / recv in flight on a pipeline
 * queue keeps one until it completes. Its own lock: an inline blocking
 * call and the thread's polling of sends / receives in flight both lend
 * buffers (taken after the queue's mu, never before). */
typedef struct hs_stage {
    pthread_mutex_t mu;
    hs_device *dev;     /* hs_comm_set_device's device: the buffers' owner */
    hs_stream *stream;  /* the copies, on dev; made at the first staged copy */
    hs_stage_buf *idle; /* buffers not lent */
    int lent;
} hs_stage;

/* One queue of work and the communication thread that executes it in issue
 * order. */
struct hs_queue {
    hs_comm *comm;
    hs_comm_queue id;
    pthread_mutex_t mu; /* the list, done flags, current, its groups' counters */
    pthread_cond_t queue_cv;
    pthread_cond_t done_cv;
    hs_work *head, *tail;
    bool stopping;
    pthread_t thread;
    hs_comm_current current;
    /* The pipeline queues start sends and receives and go on (a blocking
     * send there would wait on the peer's matching receive, which may be
     * queued behind work that waits on this rank: a cycle across the ring
     * of stages); their thread polls these until they finish. */
    bool async_p2p;
    hs_work *inflight;
    int detached;      /* items hs_work_wait_stream left to the thread */
    hs_error *scratch; /* the thread's error report, allocated with it */
    bool started;      /* the thread runs (hs_comm_queue_stop joins it) */
    hs_stage stage;
};

typedef struct hs_watchdog hs_watchdog;

/* Where one rank's GPU is, for the choice of NCCL (select.c): its node (a
 * hash of the host name) and the device ordinal, -1 when the rank does not
 * offer its device to NCCL. */
typedef struct hs_gpu_id {
    int64_t host;
    int64_t ordinal;
} hs_gpu_id;

typedef struct hs_group_entry {
    char name[HS_COMM_NAME_MAX];
    hs_pg *pg; /* NULL when this rank joined no group of that name */
} hs_group_entry;

struct hs_comm {
    int rank, size;
    bool owns_mpi;
    MPI_Comm mgmt; /* splits and setup, caller's thread only */
    hs_trace *trace;
    bool owns_trace;
    hs_pool pool; /* staging buffers of every group */
    const hs_log *log;
    hs_log own_log;

    hs_pg *world;
    hs_group_entry groups[HS_COMM_MAX_GROUPS];
    int ngroups;
    /* Slot names, shared with the watchdog thread (published by nslots). */
    atomic_int nslots;
    /* Highest sequence number this rank has entered on each slot. */
    atomic_llong entered[HS_COMM_MAX_GROUPS];

    hs_queue queues[HS_COMM_QUEUE_COUNT];

    _Atomic double timeout_s;
    hs_watchdog *watchdog;
    /* Compare every collective's fingerprint entry over its group before it
     * runs (comm.check_every = 1). */
    atomic_bool fp_each;
    /* Sum reductions add the ranks' contributions as a pairwise tree in
     * rank order (hs_comm_set_canonical_sums). */
    atomic_bool canonical_sums;
    hs_fp_fault fault; /* set at init from the environment, fired once */
    int local_ranks;   /* ranks on this node, for BLAS threads */
    int *node_of;      /* [size]: each world rank's node, named by its lowest rank */
    /* hs_comm_set_device's device (caller's thread) and every world rank's
     * GPU (NULL before a device is set). */
    hs_device *device;
    hs_gpu_id *gpu_ids;
};

/* Whether c runs a on a group of size ranks as a canonical sum
 * (hs_comm_set_canonical_sums): an fp32 sum or mean reduce-scatter or
 * all-reduce, the ranks' blocks brought together whole and added as a
 * pairwise tree in rank order. */
static inline bool hs_comm_canonical_sum(hs_comm *c, int size, const hs_coll_args *a) {
    return (a->op == HS_OP_REDUCE_SCATTER || a->op == HS_OP_ALL_REDUCE) &&
           a->reduce != HS_REDUCE_MAX && a->dt == HS_DTYPE_F32 && size > 1 &&
           atomic_load(&c->canonical_sums);
}

/* ---------------------------------------------------- link classes (links.c) */
/* node_of and local_ranks, collectively over MPI_COMM_WORLD. */
hs_status hs_comm_nodes_init(hs_comm *c, hs_error *e);
/* The bytes this rank sends executing a on g: [0] to ranks of its node,
 * [1] to other nodes (comm.h, "Link classes"). */
void hs_comm_sent_bytes(const hs_pg *g, const hs_coll_args *a, int64_t sent[2]);

/* --------------------------------------------------------- queues (work.c) */
/* Starts every queue's communication thread: HS_ERR_OOM or
 * HS_ERR_INTERNAL (none left running) when one cannot be started. */
hs_status hs_comm_queue_start(hs_comm *c, hs_error *e);
/* Drains every queue and joins every thread that was started. */
void hs_comm_queue_stop(hs_comm *c);
/* Returns once every item hs_work_wait_stream left to a communication
 * thread has finished (their events are the device's). */
void hs_comm_settle_detached(hs_comm *c);
/* "default", "critical" ("?" when out of range). */
const char *hs_comm_queue_name(hs_comm_queue q);
/* Appends to the queue of g. A work item that cannot be allocated ends
 * the run (hs_comm_abort): the other ranks issue the collective anyway. */
hs_work *hs_comm_enqueue(hs_pg *g, const hs_coll_args *a);
/* A blocking collective: inline when g's queue is idle, else queued + waited. */
hs_status hs_comm_run(hs_pg *g, const hs_coll_args *a, hs_error *e);
/* The oldest operation outstanding on queue q: the one executing or a
 * send / recv in flight (busy false: none). */
hs_comm_current hs_comm_current_get(hs_comm *c, hs_comm_queue q);
/* The group name of a slot ("?" when unknown). */
const char *hs_comm_slot_name(const hs_comm *c, int slot);

/* ------------------------------------------------- staging (stage.c) */
/* Runs a on g on the calling thread: on g's device backend when a's
 * buffers are device memory the host cannot address and g has one; staged
 * through g's queue's host buffers for g's backend when g has none; on g's
 * backend directly otherwise (host-visible memory, opened to the host for
 * the call). */
hs_status hs_comm_exec(hs_pg *g, const hs_coll_args *a, hs_error *e);
/* The trace's algorithm name of a on g (NULL: not said). */
const char *hs_comm_exec_path(const hs_pg *g, const hs_coll_args *a);
/* A pipeline queue's send / recv w, about to start on g's backend: *run
 * gets the arguments to start with: a host copy of a device buffer (a
 * send's bytes copied in), or the buffer itself opened to the host. On
 * failure nothing is held. hs_stage_p2p_end, once it is done or did not
 * start, copies a received host copy back (when `arrived`) and gives the
 * buffer back, or closes the host access. */
hs_status hs_stage_p2p_begin(hs_work *w, hs_coll_args *run, hs_error *e);
void hs_stage_p2p_end(hs_work *w, bool arrived);
void hs_stage_init(hs_stage *st);
/* Frees st's buffers and stream (none may be lent) and binds it to d
 * (NULL: none). */
void hs_stage_bind(hs_stage *st, hs_device *d);
void hs_stage_destroy(hs_stage *st);

/* ----------------------------------------- device backend (select.c) */
/* Whether this rank offers device d to NCCL: d is a cuda device (its
 * memory not host visible), NCCL is built, and `choice` (HS_COMM_BACKEND)
 * is not "mpi". */
bool hs_comm_nccl_offered(const hs_device *d, bool nccl_built, const char *choice);
/* Whether a group of n ranks (world ranks members[0 .. n), with world[r]
 * the GPU of world rank r) on queue q runs its device collectives on NCCL:
 * every member offered a GPU, no two of them the same GPU of one node
 * (NCCL needs distinct devices), and q is not a pipeline queue (their
 * sends and receives match by tag, several in flight; NCCL has no tags). */
bool hs_comm_nccl_fits(const hs_gpu_id *world, const int *members, int n, hs_comm_queue q);
/* After a device is set: gives g its device backend when the rule above
 * picks NCCL (collective over g's members, on the caller's thread, with
 * g's queue idle); HS_OK and nothing done otherwise. */
hs_status hs_comm_attach_device(hs_comm *c, hs_pg *g, hs_error *e);

/* ------------------------------------------------ nccl backend (pg_nccl.c) */
/* Collective over g's members: an NCCL communicator over g's ranks on GPU
 * `ordinal` (its unique id broadcast over g's MPI communicator), set as
 * g's device backend. Every member returns the same status. */
hs_status hs_pg_nccl_attach(hs_pg *g, int ordinal, hs_error *e);

/* ------------------------------------------- fingerprints (fingerprint.c) */
/* Reads HS_COMM_TEST_FAULT into c->fault (malformed: HS_ERR_USAGE). */
hs_status hs_fp_fault_init(hs_comm *c, hs_error *e);
/* Under g->queue->mu, before a is numbered: the test fault, when this is
 * its collective. Returns true when a must not be issued at all; may
 * shrink a->count. */
bool hs_fp_fault_apply(hs_pg *g, hs_coll_args *a);
/* Under g->queue->mu: fold collective a, numbered seq, into g's
 * fingerprint; *entry gets its entry. */
void hs_fp_issue(hs_pg *g, const hs_coll_args *a, int64_t seq, hs_fp_entry *entry);
/* On the thread executing w, before it runs, when c->fp_each: compare w's
 * entry with every member's over w's group; a difference ends the job. */
hs_status hs_fp_compare_each(hs_pg *g, const hs_fp_entry *mine, hs_error *e);
/* Under g->queue->mu: g's fingerprint as seen by this rank, with its last
 * `max` entries copied to out (max <= HS_FP_RING). */
hs_fp_view hs_fp_view_of(const hs_pg *g, hs_fp_entry *out, int max);
/* Writes to buf the first collective where a and b differ, as
 * "group 'G', sequence S: world rank A issued OP DT x N; world rank B ...".
 * Returns false when the views agree, or with behind_ok when they differ
 * only in that one side has issued fewer (a rank still on its way). */
bool hs_fp_describe(const char *group, const hs_fp_view *a, const hs_fp_view *b, bool behind_ok,
                    char *buf, size_t cap);

/* ------------------------------------------------ reductions (reduce.c) */
/* dst[i] = round_dt(fp32(a[i]) (op) fp32(b[i])) for n elements: one
 * rounding per call. SUM and AVG add, then divide by `divisor` (1 skips the
 * division; only AVG passes another, in its last step); MAX keeps the
 * larger value, exactly. dst may alias b, never a. */
void hs_comm_reduce(void *dst, const void *a, const void *b, int64_t n, hs_dtype dt,
                    hs_reduce_op op, int divisor);

/* ---------------------------------------------------- mpi backend (pg_mpi.c) */
/* Wraps `mc` (the group takes ownership) into a group. */
hs_pg *hs_pg_mpi_create(hs_comm *c, MPI_Comm mc, const char *name, int slot, hs_error *e);
void hs_pg_free(hs_pg *g);
/* The text of an MPI error code (mpi_group.c). */
const char *hs_mpi_strerror(int rc, char *buf, size_t cap);

/* --------------------------------------------------- watchdog (watchdog.c) */
hs_status hs_watchdog_start(hs_comm *c, hs_error *e);
/* Tell one other rank (world rank 0, or 1) that this rank ends the job, so
 * that it prints the line pointing here (waits at most 0.25 s for it), then
 * every other rank to exit with exit_code. */
void hs_watchdog_notify_failure(hs_comm *c, int exit_code);
void hs_watchdog_stop(hs_comm *c);

/* Before MPI_Init: a process no launcher started asks Open MPI for no
 * helper daemon and no network probing (boot.c). */
void hs_comm_singleton_env(void);

#endif
