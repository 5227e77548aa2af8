/* comm/pg_nccl.c — the `nccl` backend of hs_pg (HS_CUDA builds): the
 * collectives on a group's GPU buffers, when select.c picks NCCL for the
 * group. Each op is NCCL's own (all-to-all(v) as one group of ncclSend /
 * ncclRecv per peer) on a CUDA stream of the group's, which first waits
 * for the event the issuing stream recorded at issue (collectives.c: the
 * issuing thread does not wait for the GPU). enqueue then records a
 * completion event on that stream, which hs_work_wait_stream makes the
 * consumer's stream wait for (work.c), and complete waits for it on the
 * queue's thread, which stands for the stream as it does for MPI: a
 * finished work item is a finished collective, and the watchdog sees a
 * collective that does not finish. Send and recv between two ranks match
 * in issue order: NCCL has no tags. Host buffers and barriers stay on the group's
 * MPI backend, whose communicator also carries the set-up. */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi_group.h"

typedef struct nccl_group {
    ncclComm_t comm;
    cudaStream_t stream;
    int ordinal; /* the GPU */
    const char *name;
    int rank, size;
} nccl_group;

static ncclDataType_t nccl_type(hs_dtype dt) {
    switch (dt) {
    case HS_DTYPE_F32: return ncclFloat32;
    case HS_DTYPE_BF16: return ncclBfloat16;
    case HS_DTYPE_F16: return ncclFloat16;
    case HS_DTYPE_U8: return ncclUint8;
    default: hs_panic("nccl backend: dtype %d", (int)dt);
    }
}

static ncclRedOp_t nccl_op(hs_reduce_op op) {
    switch (op) {
    case HS_REDUCE_SUM: return ncclSum;
    case HS_REDUCE_AVG: return ncclAvg;
    case HS_REDUCE_MAX: return ncclMax;
    default: hs_panic("nccl backend: reduction %d", (int)op);
    }
}

static hs_status nccl_fail(const nccl_group *g, hs_error *e, ncclResult_t r, const char *call,
                           const char *what) {
    const char *last = g->comm ? ncclGetLastError(g->comm) : NULL;
    return hs_error_set(e, HS_ERR_COMM,
                        "%s on group '%s' (rank %d of %d, GPU %d): %s failed: %s%s%s; check that "
                        "every rank of the group issues the same collectives with the same counts",
                        what, g->name, g->rank, g->size, g->ordinal, call, ncclGetErrorString(r),
                        last && last[0] ? ": " : "", last ? last : "");
}

static hs_status cuda_fail(const nccl_group *g, hs_error *e, cudaError_t err, const char *call,
                           const char *what) {
    return hs_error_set(e, HS_ERR_COMM, "%s on group '%s' (rank %d of %d, GPU %d): %s failed: %s",
                        what, g->name, g->rank, g->size, g->ordinal, call, cudaGetErrorString(err));
}

/* all_to_allv's counts and displacements are elements, never negative. */
static bool v_valid(const hs_coll_args *a, int n) {
    for (int p = 0; p < n; p++)
        if (a->send_counts[p] < 0 || a->send_displs[p] < 0 || a->recv_counts[p] < 0 ||
            a->recv_displs[p] < 0)
            return false;
    return true;
}

/* Block p of in goes to rank p, block p of out comes from it: one group of
 * a send and a receive per peer (itself included). */
static ncclResult_t exchange(nccl_group *g, const hs_coll_args *a, ncclDataType_t t) {
    const size_t es = hs_dtype_size(a->dt);
    const bool v = a->op == HS_OP_ALL_TO_ALLV;
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; r == ncclSuccess && p < g->size; p++) {
        int64_t sn = v ? a->send_counts[p] : a->count, so = v ? a->send_displs[p] : p * a->count;
        int64_t rn = v ? a->recv_counts[p] : a->count, ro = v ? a->recv_displs[p] : p * a->count;
        r = ncclSend((const char *)a->in + (size_t)so * es, (size_t)sn, t, p, g->comm, g->stream);
        if (r == ncclSuccess)
            r = ncclRecv((char *)a->out + (size_t)ro * es, (size_t)rn, t, p, g->comm, g->stream);
    }
    ncclResult_t end = ncclGroupEnd(); /* always, to close the group */
    return r != ncclSuccess ? r : end;
}

/* Enqueues a on the group's stream; *call names the NCCL call. */
static ncclResult_t enqueue(nccl_group *g, const hs_coll_args *a, const char **call) {
    const ncclDataType_t t = nccl_type(a->dt);
    const size_t n = (size_t)a->count;
    switch (a->op) {
    case HS_OP_ALL_GATHER:
        *call = "ncclAllGather";
        return ncclAllGather(a->in, a->out, n, t, g->comm, g->stream);
    case HS_OP_REDUCE_SCATTER:
        *call = "ncclReduceScatter";
        return ncclReduceScatter(a->in, a->out, n, t, nccl_op(a->reduce), g->comm, g->stream);
    case HS_OP_ALL_REDUCE:
        *call = "ncclAllReduce";
        return ncclAllReduce(a->in, a->out, n, t, nccl_op(a->reduce), g->comm, g->stream);
    case HS_OP_BROADCAST:
        *call = "ncclBroadcast";
        return ncclBroadcast(a->in, a->out, n, t, a->peer, g->comm, g->stream);
    case HS_OP_ALL_TO_ALL:
    case HS_OP_ALL_TO_ALLV: *call = "ncclSend/ncclRecv group"; return exchange(g, a, t);
    case HS_OP_SEND: *call = "ncclSend"; return ncclSend(a->in, n, t, a->peer, g->comm, g->stream);
    case HS_OP_RECV: *call = "ncclRecv"; return ncclRecv(a->out, n, t, a->peer, g->comm, g->stream);
    default: hs_panic("nccl backend: %s takes no device buffers", hs_comm_op_name(a->op));
    }
}

/* The NCCL call, ordered after the issuing stream's work up to the issue
 * (a->ready), and with done non-NULL an event recorded behind it on the
 * group's stream (*done; NULL where it could not be made: complete then
 * waits for the stream). */
static hs_status nccl_enqueue(void *ctx, const hs_coll_args *a, hs_event **done, hs_error *e) {
    nccl_group *g = ctx;
    const char *what = hs_comm_op_name(a->op), *call = "";
    const char *cuda_call = "cudaSetDevice";
    if (done) *done = NULL;
    cudaError_t err = cudaSetDevice(g->ordinal);
    if (err == cudaSuccess && a->ready) {
        cuda_call = "cudaStreamWaitEvent";
        err = cudaStreamWaitEvent(g->stream, (cudaEvent_t)a->ready->ctx, 0);
    }
    hs_event_free(a->ready); /* the wait is enqueued: its event may go */
    if (err != cudaSuccess) return cuda_fail(g, e, err, cuda_call, what);
    if (a->op == HS_OP_ALL_TO_ALLV && !v_valid(a, g->size))
        return hs_error_set(e, HS_ERR_COMM,
                            "all_to_allv on group '%s': a count or displacement is negative",
                            g->name);
    ncclResult_t r = enqueue(g, a, &call);
    if (r != ncclSuccess) return nccl_fail(g, e, r, call, what);
    if (!done || !a->dev || hs_event_create(a->dev, done, NULL) != HS_OK) return HS_OK;
    err = cudaEventRecord((cudaEvent_t)(*done)->ctx, g->stream);
    if (err == cudaSuccess) return HS_OK;
    hs_event_free(*done);
    *done = NULL;
    return cuda_fail(g, e, err, "cudaEventRecord", what);
}

/* The host waits for the collective: its event, or the group's stream. */
static hs_status nccl_complete(void *ctx, const hs_coll_args *a, hs_event *done, hs_error *e) {
    nccl_group *g = ctx;
    const char *call = done ? "cudaEventSynchronize" : "cudaStreamSynchronize";
    cudaError_t err = cudaSetDevice(g->ordinal);
    if (err == cudaSuccess)
        err = done ? cudaEventSynchronize((cudaEvent_t)done->ctx)
                   : cudaStreamSynchronize(g->stream);
    return err == cudaSuccess ? HS_OK : cuda_fail(g, e, err, call, hs_comm_op_name(a->op));
}

static hs_status nccl_exec(void *ctx, const hs_coll_args *a, hs_error *e) {
    hs_status st = nccl_enqueue(ctx, a, NULL, e);
    return st == HS_OK ? nccl_complete(ctx, a, NULL, e) : st;
}

/* abort: the peers may not have finished setting up (no waiting on them). */
static void nccl_release(nccl_group *g, bool abort) {
    cudaSetDevice(g->ordinal);
    if (g->comm && abort) ncclCommAbort(g->comm);
    else if (g->comm) ncclCommDestroy(g->comm);
    if (g->stream) cudaStreamDestroy(g->stream);
    free(g);
}

static void nccl_destroy(void *ctx) { nccl_release(ctx, false); }

static const char *nccl_path(void *ctx, const hs_coll_args *a) { return "nccl"; }

static const hs_pg_backend nccl_backend = {.name = "nccl",
                                           .exec = nccl_exec,
                                           .enqueue = nccl_enqueue,
                                           .complete = nccl_complete,
                                           .destroy = nccl_destroy,
                                           .path = nccl_path};

/* This rank's part before the communicator: its GPU, the stream, and on
 * group rank 0 the unique id. */
static hs_status nccl_prepare(nccl_group *g, const hs_pg *pg, int ordinal, ncclUniqueId *id,
                              hs_error *e) {
    g->ordinal = ordinal, g->name = pg->name, g->rank = pg->rank, g->size = pg->size;
    cudaError_t err = cudaSetDevice(ordinal);
    if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) return cuda_fail(g, e, err, "the stream's creation", "nccl set-up");
    ncclResult_t r = pg->rank == 0 ? ncclGetUniqueId(id) : ncclSuccess;
    return r == ncclSuccess ? HS_OK : nccl_fail(g, e, r, "ncclGetUniqueId", "nccl set-up");
}

/* Whether every member reached this point with st == HS_OK. */
static bool agreed(MPI_Comm comm, hs_status st) {
    int mine = st == HS_OK, all = 0;
    return MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm) == MPI_SUCCESS && all;
}

/* Every step is agreed on before the next, so that no rank waits in
 * ncclCommInitRank for a member that already failed. */
hs_status hs_pg_nccl_attach(hs_pg *pg, int ordinal, hs_error *e) {
    hs_mpi_group *m = pg->ctx;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    nccl_group *g = calloc(1, sizeof *g);
    hs_status st =
        g ? nccl_prepare(g, pg, ordinal, &id, e)
          : hs_error_oom(e, "the nccl state of group '%s': %zu bytes", pg->name, sizeof *g);
    int rc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, m->coll);
    if (rc != MPI_SUCCESS && st == HS_OK) st = hs_mpi_fail(m, e, rc, "MPI_Bcast", "nccl set-up");
    bool ok = agreed(m->coll, st);
    if (ok) {
        ncclResult_t r = ncclCommInitRank(&g->comm, pg->size, id, pg->rank);
        if (r != ncclSuccess)
            g->comm = NULL, st = nccl_fail(g, e, r, "ncclCommInitRank", "nccl set-up");
        ok = agreed(m->coll, st);
    }
    if (ok) {
        pg->dev_backend = &nccl_backend;
        pg->dev_ctx = g;
        return HS_OK;
    }
    if (st == HS_OK)
        st = hs_error_set(e, HS_ERR_COMM,
                          "setting up NCCL on group '%s' failed on another of its %d ranks (its "
                          "own message says why); HS_COMM_BACKEND=mpi keeps every group on MPI",
                          pg->name, pg->size);
    if (g) nccl_release(g, true);
    return st;
}
