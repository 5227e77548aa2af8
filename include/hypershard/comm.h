/* hypershard/comm.h — process groups and collectives.
 *
 * Contract of this layer:
 * - hs_comm is the per-process communication context: it initialises MPI
 *   (MPI_THREAD_MULTIPLE), owns the world group, the group cache, the work
 *   queues with one communication thread each, the watchdog and a pointer
 *   to the trace.
 * - A process group (hs_pg) is a struct of function pointers with a ctx
 *   (backend `mpi`, and `nccl` for the buffers of a GPU, with nothing above
 *   this layer changing). Groups are created collectively over the world with a colour
 *   (MPI_Comm_split semantics) and cached by name: asking twice for the same
 *   name returns the same group.
 * - Queues: every group is bound to one queue when it is created
 *   (hs_comm_split: HS_COMM_QUEUE_DEFAULT; hs_comm_split_queue chooses), for
 *   its lifetime, on every member rank. Each queue has its own
 *   communication thread, so a critical-path collective (tensor-parallel
 *   all-reduce) never waits behind prefetched all-gathers on the default
 *   queue. The mesh puts its tp, cp and ep groups on HS_COMM_QUEUE_CRITICAL;
 *   pipeline parallelism its two hand-over groups on the PP queues.
 * - Every collective exists as `_async` returning an hs_work handle and as a
 *   blocking form (async + wait). The collectives of one queue are executed
 *   by that queue's communication thread in issue order and complete in
 *   issue order; queues progress independently of each other.
 *   ORDERING RULE: on every group, all member ranks issue the same
 *   collectives in the same order (as with NCCL). Collectives on different
 *   groups may interleave freely; a queue's thread executes that queue in
 *   issue order, so two ranks that share two groups on the same queue must
 *   also issue the collectives on those groups in one agreed order. Groups
 *   on different queues need no agreed order between them: a collective on
 *   one queue may wait for a peer that first has to finish work on the
 *   other queue.
 * - Streams: every data-moving collective takes the hs_stream its buffers
 *   belong to, right after the group. The collective reads its input only
 *   after all work issued on s before the call, and its result is ordered
 *   before work issued on s after hs_work_wait_stream(w, s). s == NULL
 *   means host memory the host has ready now (control plane: checkpoint
 *   agreement, plans, metrics). barrier and hs_pg_agree take no stream
 *   (host). Blocking forms = async on s + hs_work_wait_stream on s.
 *   On MPI (host-staged or host-visible buffers) issue synchronizes s
 *   before the communication thread may touch the buffers; on NCCL it
 *   records an event on s that NCCL's stream waits for, so the issuing
 *   thread does not wait for the GPU. wait_stream waits on the host.
 * - GPU buffers (a device whose memory the host cannot address,
 *   hs_device.host_visible false): the device must first be given to
 *   hs_comm_set_device. A group then runs the collectives on its buffers
 *   on NCCL when every member has a GPU of its own, the group is not a
 *   pipeline queue's and HS_COMM_BACKEND is not "mpi"; otherwise on MPI,
 *   the communication thread copying the bytes through pinned host
 *   buffers of its queue (docs/comm.md).
 * - Buffers passed to an async collective must stay valid and untouched
 *   until the work completes. Staging buffers are owned by the group or
 *   the queue and reused: no allocation per collective on the hot path.
 * - Reductions: SUM, AVG and MAX on F32, BF16 and F16, for reduce-scatter and
 *   all-reduce. BF16/F16 payloads are converted to fp32 for each reduction
 *   step. SUM/AVG: groups within one node sum in fp32 and round once when
 *   storing; groups that span nodes (ring) round once per hop and once more
 *   when storing (docs/comm.md). MAX is exact (it never rounds) and does not
 *   depend on the order of the ranks: any NaN gives NaN (the default quiet
 *   NaN), +0 counts as larger than -0, so both paths give the same bits.
 *   Whatever the op, every rank gets the same bits.
 * - Failure: a collective, or a send / recv in flight on a pipeline queue,
 *   not finished within timeout_s of its start makes every rank exit
 *   non-zero, within timeout_s + 2 s, with one message naming op, group,
 *   sequence number (send/recv number and peer) and the ranks that had not
 *   arrived. hs_comm_abort() ends all ranks with an error
 *   (MPI_Abort) — an error on one rank never leaves the others hanging. It
 *   is the one function that ends a distributed run (docs/errors.md): a
 *   communication thread that cannot report a failure, an issue that finds
 *   no memory for its work item, a hook inside the model, and a command
 *   whose error may be on its rank alone all go through it.
 * - Fingerprints: every rank folds each collective it issues on a group
 *   (group, op, dtype, reduction or root, element count, sequence number;
 *   not send / recv, and not all_to_allv's per-rank counts) into that
 *   group's running hash, in issue order. hs_comm_check compares them over
 *   every group's members; a difference ends the job (every rank, exit code
 *   of HS_ERR_COMM) with one message naming the first collective that
 *   differs on each side. hs_comm_set_check_each(c, true) also compares each
 *   collective over its group before it runs (a debug mode: one more small
 *   all-gather per collective). A watchdog timeout's message carries the
 *   same comparison for the hung group.
 * - Every executed collective is counted in the trace (hs_trace_count) with
 *   op names "all_gather", "reduce_scatter", "all_reduce", "broadcast",
 *   "all_to_all", "all_to_allv", "send", "recv", "barrier", and recorded as a
 *   span on HS_LANE_COMM with group, bytes, dtype, sequence number and queue
 *   ("default", "critical") when tracing is on, whichever queue ran it.
 * - Link classes: each span also carries sent_intra and sent_inter, the
 *   bytes this rank sends to ranks of its own node and to other nodes (a
 *   node: the ranks MPI_COMM_TYPE_SHARED puts together). All-gather and
 *   reduce-scatter send (W-1) x count elements to the next rank of the
 *   group, all-reduce every chunk but its own and then every chunk but the
 *   next rank's (the ring's schedule; a group inside one node, which reads
 *   shared memory instead, counts the same bytes, all intra-node);
 *   all-to-all(v) and send their payload to each peer, broadcast its root
 *   the payload to every other member; recv and barrier send nothing.
 */
#ifndef HYPERSHARD_COMM_H
#define HYPERSHARD_COMM_H

#include <stdbool.h>
#include <stdint.h>

#include "hypershard/base.h"
#include "hypershard/device.h"
#include "hypershard/tensor.h"

typedef enum hs_reduce_op {
    HS_REDUCE_SUM = 0,
    HS_REDUCE_AVG,
    HS_REDUCE_MAX,
    HS_REDUCE_OP_COUNT
} hs_reduce_op;

/* The queue a group's collectives run on (see Queues above). */
typedef enum hs_comm_queue {
    HS_COMM_QUEUE_DEFAULT = 0,
    HS_COMM_QUEUE_CRITICAL,
    /* Pipeline hand-over, one queue per direction. Their threads start
     * sends and receives and poll them instead of blocking in them, so a
     * send waiting for its receive never holds the queue: issue order is
     * kept, completion follows the peers. */
    HS_COMM_QUEUE_PP_FORWARD,
    HS_COMM_QUEUE_PP_BACKWARD,
    HS_COMM_QUEUE_COUNT
} hs_comm_queue;

typedef struct hs_comm hs_comm;
typedef struct hs_pg hs_pg;
typedef struct hs_work hs_work;

typedef struct hs_comm_options {
    double timeout_s; /* watchdog; <= 0 means the default 600 */
    hs_trace *trace;  /* may be NULL: then a private, disabled trace is used */
    const hs_log *log;
} hs_comm_options;

/* Initialise MPI (if not yet) and the context. Collective over MPI_COMM_WORLD. */
hs_status hs_comm_init(hs_comm **out, int *argc, char ***argv, const hs_comm_options *opt,
                       hs_error *e);
/* Drains every queue, stops the threads, frees groups, finalises MPI.
 * A device given to hs_comm_set_device must be released (NULL) before it
 * is freed, or still be alive here. */
void hs_comm_finalize(hs_comm *c);
int hs_comm_rank(const hs_comm *c);
int hs_comm_size(const hs_comm *c);
/* Ranks of the world on this rank's node (MPI_COMM_TYPE_SHARED). */
int hs_comm_local_ranks(const hs_comm *c);
/* The node of a world rank, named by the lowest world rank on it. */
int hs_comm_node_of(const hs_comm *c, int world_rank);
hs_trace *hs_comm_trace(hs_comm *c);
void hs_comm_set_timeout(hs_comm *c, double timeout_s);
/* The one way to end a distributed run from code that cannot return a
 * status (a collective failing on the compute path, a communication
 * thread, an FSDP hook) or from a command whose error may be on this rank
 * alone: print the error on this rank and end every rank, the exit code
 * from e's status (docs/errors.md). c == NULL (no context yet, or none at
 * all): every rank of MPI_COMM_WORLD when MPI is running, else this
 * process. */
_Noreturn void hs_comm_abort(hs_comm *c, const hs_error *e);

/* The device the collectives' streams belong to, right after it is
 * created; collective over the world (every rank's GPU is gathered). Its
 * host staging buffers are made as needed; the groups that exist and
 * those created later choose their backend for its buffers (see GPU
 * buffers above). HS_ERR_USAGE for an HS_COMM_BACKEND other than "mpi" or
 * "auto"; an NCCL set-up failure is HS_ERR_COMM on every member of the
 * group. d == NULL releases the device's staging buffers, on this rank
 * alone, and never fails: call it before freeing the device. A programming
 * error (the process ends) when a collective is outstanding (d != NULL) or
 * one is in flight on staged buffers (d == NULL). */
hs_status hs_comm_set_device(hs_comm *c, hs_device *d, hs_error *e);

hs_pg *hs_comm_world(hs_comm *c);
/* Collective over the world: ranks with the same colour form one group,
 * ordered by key (then world rank). colour < 0: this rank joins no group and
 * *out is NULL. Cached by name: a second call with the same name returns the
 * cached group without communicating (then it must be called by all or by
 * none, as always). */
hs_status hs_comm_split(hs_comm *c, const char *name, int colour, int key, hs_pg **out,
                        hs_error *e);
/* hs_comm_split with the group bound to queue q. Every member must pass the
 * same q (checked: HS_ERR_INTERNAL on every member otherwise). A cached
 * name returns the cached group, on the queue it was created with, like
 * its colour and key: hs_pg_queue tells which. The world is on the default
 * queue. */
hs_status hs_comm_split_queue(hs_comm *c, const char *name, int colour, int key, hs_comm_queue q,
                              hs_pg **out, hs_error *e);

int hs_pg_rank(const hs_pg *g);
int hs_pg_size(const hs_pg *g);
const char *hs_pg_name(const hs_pg *g);
hs_comm_queue hs_pg_queue(const hs_pg *g);
/* World rank of group rank r. */
int hs_pg_world_rank(const hs_pg *g, int r);

/* ---------------------------------------------------------- collectives
 * `count` is in elements of `dt`. */

/* out[r*count .. ) = in of group rank r. In place when in == out + rank*count. */
hs_work *hs_pg_all_gather_async(hs_pg *g, hs_stream *s, void *out, const void *in, int64_t count,
                                hs_dtype dt);
/* in holds size*count elements (chunk r goes to rank r); out gets count. */
hs_work *hs_pg_reduce_scatter_async(hs_pg *g, hs_stream *s, void *out, const void *in,
                                    int64_t count, hs_dtype dt, hs_reduce_op op);
/* In place. */
hs_work *hs_pg_all_reduce_async(hs_pg *g, hs_stream *s, void *buf, int64_t count, hs_dtype dt,
                                hs_reduce_op op);
hs_work *hs_pg_broadcast_async(hs_pg *g, hs_stream *s, void *buf, int64_t count, hs_dtype dt,
                               int root);
/* Block r of `in` (count elements) goes to rank r; out block r comes from rank r. */
hs_work *hs_pg_all_to_all_async(hs_pg *g, hs_stream *s, void *out, const void *in, int64_t count,
                                hs_dtype dt);
hs_work *hs_pg_all_to_allv_async(hs_pg *g, hs_stream *s, void *out, const int64_t *recv_counts,
                                 const int64_t *recv_displs, const void *in,
                                 const int64_t *send_counts, const int64_t *send_displs,
                                 hs_dtype dt);
hs_work *hs_pg_send_async(hs_pg *g, hs_stream *s, const void *buf, int64_t count, hs_dtype dt,
                          int peer, int tag);
hs_work *hs_pg_recv_async(hs_pg *g, hs_stream *s, void *buf, int64_t count, hs_dtype dt, int peer,
                          int tag);
hs_work *hs_pg_barrier_async(hs_pg *g);

/* Wait for completion and release the handle. Errors on the comm thread
 * (timeouts abort all ranks directly) come back here. */
hs_status hs_work_wait(hs_work *w, hs_error *e);
/* Release the handle like hs_work_wait; afterwards work issued on s sees
 * the result (s == NULL: the same as hs_work_wait). Where the group's
 * collectives complete on a GPU stream of their own (NCCL), s waits for the
 * collective on the device and the host goes on once it is enqueued; a
 * failure found after that ends every rank, as a timeout does. */
hs_status hs_work_wait_stream(hs_work *w, hs_stream *s, hs_error *e);
/* true when done (the handle must still be waited on to be released). */
bool hs_work_test(hs_work *w);

/* Blocking forms: async on s, then hs_work_wait_stream on s. */
hs_status hs_pg_all_gather(hs_pg *g, hs_stream *s, void *out, const void *in, int64_t count,
                           hs_dtype dt, hs_error *e);
hs_status hs_pg_reduce_scatter(hs_pg *g, hs_stream *s, void *out, const void *in, int64_t count,
                               hs_dtype dt, hs_reduce_op op, hs_error *e);
hs_status hs_pg_all_reduce(hs_pg *g, hs_stream *s, void *buf, int64_t count, hs_dtype dt,
                           hs_reduce_op op, hs_error *e);
hs_status hs_pg_broadcast(hs_pg *g, hs_stream *s, void *buf, int64_t count, hs_dtype dt, int root,
                          hs_error *e);
hs_status hs_pg_all_to_all(hs_pg *g, hs_stream *s, void *out, const void *in, int64_t count,
                           hs_dtype dt, hs_error *e);
hs_status hs_pg_send(hs_pg *g, hs_stream *s, const void *buf, int64_t count, hs_dtype dt, int peer,
                     int tag, hs_error *e);
hs_status hs_pg_recv(hs_pg *g, hs_stream *s, void *buf, int64_t count, hs_dtype dt, int peer,
                     int tag, hs_error *e);
hs_status hs_pg_barrier(hs_pg *g, hs_error *e);
/* The group's exact sums (hs_xsum) merged into x on every rank: exact,
 * so no order of the ranks shows (one all-gather of the limbs). */
hs_status hs_pg_all_reduce_xsum(hs_pg *g, hs_xsum *x, hs_error *e);
/* Collective agreement: every rank of g passes its own status (and, when
 * it failed, its message in e). Returns HS_OK on all ranks, or the first
 * failing rank's code everywhere: that rank keeps its message, the others
 * get "<what> failed on rank R: <its message>", so whichever rank reports
 * prints the real reason. */
hs_status hs_pg_agree(hs_pg *g, hs_status mine, const char *what, hs_error *e);

/* Collective over the world: compare every group's collective fingerprint
 * over its members (one all-gather of 24 bytes per group and rank). When
 * they differ the job ends here with a message naming, for the first
 * group that differs, the first collective that differs on each side
 * ("when", e.g. "after step 100", says where the check ran). Returns an
 * error only when the check itself fails. */
hs_status hs_comm_check(hs_comm *c, const char *when, hs_error *e);
/* Compare each collective's fingerprint over its group before it runs
 * (every rank must set the same). */
void hs_comm_set_check_each(hs_comm *c, bool on);
/* fp32 sum and average reductions (reduce-scatter, all-reduce) add the
 * ranks' contributions as a pairwise tree in rank order, whatever the
 * path: train.reproducibility: layout (docs/numerics.md). Every rank must
 * set the same, before the groups' first collective. */
void hs_comm_set_canonical_sums(hs_comm *c, bool on);

/* Gather every rank's trace to world rank 0, align clocks (offsets measured
 * after a barrier) and write one Chrome trace file for all ranks (pid =
 * rank). Collective over the world. */
hs_status hs_comm_write_merged_trace(hs_comm *c, const char *path, hs_error *e);

/* Give each rank max(1, cores / ranks-on-this-node) GEMM threads, unless
 * OMP_NUM_THREADS is set (then it is left as the user set it). */
void hs_comm_balance_blas_threads(hs_comm *c);

/* ---------------------------------------------------------- process start */

/* For a command that must know its rank and the world size before it builds
 * a context (configs are validated for the world first): start MPI with
 * MPI_THREAD_MULTIPLE requested (hs_comm_init checks what was provided) and
 * read this process's world rank and the world size. hs_comm_init then finds
 * MPI started and leaves its end to hs_comm_boot_end, which the command
 * calls last, after hs_comm_finalize. */
void hs_comm_boot(int *argc, char ***argv, int *rank, int *world);
void hs_comm_boot_end(void);

#endif
