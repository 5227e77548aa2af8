/* comm/comm.c — the communication context: MPI start and end, the world
 * group, named groups and the queue each is bound to, abort, BLAS thread
 * balancing. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/group.h"

#define DEFAULT_TIMEOUT_S 600.0

static hs_status init_mpi(hs_comm *c, int *argc, char ***argv, hs_error *e) {
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        hs_comm_singleton_env();
        if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return hs_error_set(e, HS_ERR_COMM,
                                "MPI_Init_thread failed; check the MPI installation "
                                "and that the program runs under mpiexec");
        c->owns_mpi = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_MULTIPLE)
        return hs_error_set(e, HS_ERR_COMM,
                            "MPI provides thread level %d but the communication thread needs "
                            "MPI_THREAD_MULTIPLE (%d); use an MPI built with thread support%s",
                            provided, MPI_THREAD_MULTIPLE,
                            inited ? ", or initialise MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE)"
                                   : "");
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    return HS_OK;
}

/* Register a group (or the absence of one) under the next slot. */
static void group_register(hs_comm *c, const char *name, hs_pg *pg) {
    hs_group_entry *g = &c->groups[c->ngroups++];
    snprintf(g->name, sizeof g->name, "%s", name);
    g->pg = pg;
    atomic_store(&c->nslots, c->ngroups);
}

static hs_status create_world(hs_comm *c, hs_error *e) {
    MPI_Comm dup;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(MPI_COMM_WORLD, &c->mgmt);
    if (rc != MPI_SUCCESS)
        return hs_error_set(e, HS_ERR_COMM,
                            "creating the world group: MPI_Comm_dup failed (code %d)", rc);
    MPI_Comm_set_errhandler(c->mgmt, MPI_ERRORS_RETURN);
    c->world = hs_pg_mpi_create(c, dup, "world", 0, e);
    if (!c->world) return e->code;
    c->world->queue = &c->queues[HS_COMM_QUEUE_DEFAULT];
    group_register(c, "world", c->world);
    return HS_OK;
}

hs_status hs_comm_init(hs_comm **out, int *argc, char ***argv, const hs_comm_options *opt,
                       hs_error *e) {
    *out = NULL;
    hs_comm *c = calloc(1, sizeof *c);
    if (!c) return hs_error_oom(e, "the communication context: %zu bytes", sizeof *c);
    hs_status st = init_mpi(c, argc, argv, e);
    if (st != HS_OK) {
        free(c);
        return st;
    }
    hs_comm_options defaults = {0};
    if (!opt) opt = &defaults;
    hs_log_init(&c->own_log, c->rank, c->size);
    c->log = opt->log ? opt->log : &c->own_log;
    c->trace = opt->trace;
    if (!c->trace) {
        c->trace = hs_trace_create(c->rank, false, e);
        c->owns_trace = true;
    }
    hs_pool_init(&c->pool, "comm_staging");
    hs_comm_set_timeout(c, opt->timeout_s);
    st = hs_comm_nodes_init(c, e);
    if (st == HS_OK) st = hs_fp_fault_init(c, e);
    if (st == HS_OK) st = c->trace ? create_world(c, e) : HS_ERR_OOM;
    if (st == HS_OK) st = hs_comm_queue_start(c, e);
    if (st == HS_OK) {
        st = hs_watchdog_start(c, e);
        if (st != HS_OK) hs_comm_queue_stop(c);
    }
    if (st != HS_OK) {
        /* Setup failures are symmetric (every rank fails the same call), so
         * returning lets the caller report the error before exiting. */
        if (c->owns_trace) hs_trace_free(c->trace);
        free(c->node_of);
        free(c);
        return st;
    }
    *out = c;
    return HS_OK;
}

void hs_comm_finalize(hs_comm *c) {
    if (!c) return;
    hs_comm_queue_stop(c);
    hs_watchdog_stop(c);
    for (int i = 0; i < c->ngroups; i++) hs_pg_free(c->groups[i].pg);
    MPI_Comm_free(&c->mgmt);
    free(c->gpu_ids);
    free(c->node_of);
    if (c->owns_trace) hs_trace_free(c->trace);
    bool fin = c->owns_mpi;
    free(c);
    if (fin) MPI_Finalize();
}

int hs_comm_rank(const hs_comm *c) { return c->rank; }
int hs_comm_size(const hs_comm *c) { return c->size; }
int hs_comm_local_ranks(const hs_comm *c) { return c->local_ranks > 0 ? c->local_ranks : 1; }
hs_trace *hs_comm_trace(hs_comm *c) { return c->trace; }
hs_pg *hs_comm_world(hs_comm *c) { return c->world; }

void hs_comm_set_timeout(hs_comm *c, double timeout_s) {
    atomic_store(&c->timeout_s, timeout_s > 0 ? timeout_s : DEFAULT_TIMEOUT_S);
}

void hs_comm_set_canonical_sums(hs_comm *c, bool on) { atomic_store(&c->canonical_sums, on); }

_Noreturn void hs_comm_abort(hs_comm *c, const hs_error *e) {
    hs_status code = e && e->code != HS_OK ? e->code : HS_ERR_INTERNAL;
    int exit_code = hs_status_exit_code(code);
    const char *msg = e && e->msg[0] ? e->msg : "aborted without a message";
    if (!c) { /* no context: every rank when MPI runs, else this process */
        fprintf(stderr, "hypershard: %s\n", msg);
        fflush(stderr);
        int up = 0, down = 0;
        MPI_Initialized(&up);
        MPI_Finalized(&down);
        if (up && !down) MPI_Abort(MPI_COMM_WORLD, exit_code);
        exit(exit_code);
    }
    fprintf(stderr, "hypershard: rank %d of %d: %s\n", c->rank, c->size, msg);
    fflush(stderr);
    hs_watchdog_notify_failure(c, exit_code);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    _Exit(exit_code); /* MPI_Abort does not return; this keeps _Noreturn honest */
}

/* Every member must bind the new group to the same queue: a group whose
 * collectives ran on different threads on different ranks would follow a
 * different ordering rule on each. One small all-reduce of (q, -q) over
 * the new communicator gives every member the same verdict. */
static hs_status queue_agreed(MPI_Comm nc, const char *name, hs_comm_queue q, hs_error *e) {
    int mine[2] = {(int)q, -(int)q}, all[2] = {0, 0};
    int rc = MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, nc);
    if (rc != MPI_SUCCESS) {
        char why[MPI_MAX_ERROR_STRING];
        return hs_error_set(e, HS_ERR_COMM,
                            "creating group '%s': agreeing on its queue: "
                            "MPI_Allreduce failed: %s",
                            name, hs_mpi_strerror(rc, why, sizeof why));
    }
    if (all[0] == -all[1]) return HS_OK;
    return hs_error_set(e, HS_ERR_INTERNAL,
                        "creating group '%s': its members asked for different queues (from %s to "
                        "%s; this rank: %s); every member must create a group on the same queue",
                        name, hs_comm_queue_name((hs_comm_queue)-all[1]),
                        hs_comm_queue_name((hs_comm_queue)all[0]), hs_comm_queue_name(q));
}

hs_status hs_comm_split_queue(hs_comm *c, const char *name, int colour, int key, hs_comm_queue q,
                              hs_pg **out, hs_error *e) {
    *out = NULL;
    if (!name || !name[0] || strlen(name) >= HS_COMM_NAME_MAX)
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "hs_comm_split: group name '%s' must have 1 to %d characters",
                            name ? name : "(null)", HS_COMM_NAME_MAX - 1);
    if (q < 0 || q >= HS_COMM_QUEUE_COUNT)
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "hs_comm_split_queue: group '%s': queue %d is not one of the %d "
                            "hs_comm_queue values",
                            name, (int)q, HS_COMM_QUEUE_COUNT);
    for (int i = 0; i < c->ngroups; i++)
        if (!strcmp(c->groups[i].name, name)) {
            *out = c->groups[i].pg;
            return HS_OK;
        }
    if (c->ngroups == HS_COMM_MAX_GROUPS)
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "hs_comm_split: cannot create group '%s': all %d group slots are used; "
                            "reuse groups by name",
                            name, HS_COMM_MAX_GROUPS);
    MPI_Comm nc = MPI_COMM_NULL;
    int rc = MPI_Comm_split(c->mgmt, colour < 0 ? MPI_UNDEFINED : colour, key, &nc);
    if (rc != MPI_SUCCESS) {
        char why[MPI_MAX_ERROR_STRING];
        return hs_error_set(e, HS_ERR_COMM,
                            "creating group '%s' (colour %d, key %d): "
                            "MPI_Comm_split failed: %s",
                            name, colour, key, hs_mpi_strerror(rc, why, sizeof why));
    }
    hs_pg *pg = NULL;
    if (nc != MPI_COMM_NULL) {
        MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
        hs_status st = queue_agreed(nc, name, q, e);
        if (st != HS_OK) {
            MPI_Comm_free(&nc);
            return st;
        }
        pg = hs_pg_mpi_create(c, nc, name, c->ngroups, e);
        if (!pg) return e->code;
        pg->queue = &c->queues[q];
        st = hs_comm_attach_device(c, pg, e);
        if (st != HS_OK) {
            hs_pg_free(pg);
            return st;
        }
    }
    group_register(c, name, pg);
    *out = pg;
    return HS_OK;
}

hs_status hs_comm_split(hs_comm *c, const char *name, int colour, int key, hs_pg **out,
                        hs_error *e) {
    return hs_comm_split_queue(c, name, colour, key, HS_COMM_QUEUE_DEFAULT, out, e);
}

/* A rank bound to a subset of the cores (mpiexec --bind-to) owns that subset;
 * an unbound rank shares the node's cores with the other ranks there.
 * OMP_NUM_THREADS, when set, is the user's choice and stays. */
void hs_comm_balance_blas_threads(hs_comm *c) {
    const char *env = getenv("OMP_NUM_THREADS");
    if (env && env[0]) return;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) online = 1;
    cpu_set_t set;
    int n;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < online)
        n = CPU_COUNT(&set);
    else n = (int)online / (c->local_ranks > 0 ? c->local_ranks : 1);
    hs_blas_set_threads(n > 1 ? n : 1);
}
