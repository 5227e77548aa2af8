/* comm/select.c — which backend a group's collectives on device memory
 * take. hs_comm_set_device tells the context the device its buffers live
 * on; every rank's GPU (node and ordinal) is gathered once, and each group,
 * those that exist and those made later, gets NCCL for its device
 * collectives when every member offered a GPU of its own (the rule of
 * hs_comm_nccl_fits). Any other group on a device the host cannot address
 * stays on MPI, its buffers staged through host memory (stage.c). The
 * choice comes from gathered facts alone, so every member makes the same
 * one. The one #ifdef of comm/: whether NCCL is built. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/group.h"

#ifdef HS_HAVE_NCCL
static const bool nccl_built = true;
/* hs_pg_nccl_attach, in hypershard-cuda.so with the cuda backend */
static hs_status nccl_attach(hs_pg *g, int ordinal, hs_error *e) {
    void *f = hs_device_cuda_module_symbol("hs_pg_nccl_attach", e);
    hs_status (*attach)(hs_pg *, int, hs_error *);
    if (!f) return e->code;
    memcpy(&attach, &f, sizeof attach);
    return attach(g, ordinal, e);
}
#else
static const bool nccl_built = false;
static hs_status (*const nccl_attach)(hs_pg *, int, hs_error *) = NULL;
#endif

bool hs_comm_nccl_offered(const hs_device *d, bool built, const char *choice) {
    return built && d && d->kind == HS_DEVICE_CUDA && !d->host_visible && d->ordinal >= 0 &&
           !(choice && !strcmp(choice, "mpi"));
}

static bool pipeline_queue(hs_comm_queue q) {
    return q == HS_COMM_QUEUE_PP_FORWARD || q == HS_COMM_QUEUE_PP_BACKWARD;
}

bool hs_comm_nccl_fits(const hs_gpu_id *world, const int *members, int n, hs_comm_queue q) {
    if (pipeline_queue(q)) return false;
    for (int i = 0; i < n; i++) {
        const hs_gpu_id *a = &world[members[i]];
        if (a->ordinal < 0) return false;
        for (int j = 0; j < i; j++) {
            const hs_gpu_id *b = &world[members[j]];
            if (a->host == b->host && a->ordinal == b->ordinal) return false;
        }
    }
    return true;
}

hs_status hs_comm_attach_device(hs_comm *c, hs_pg *g, hs_error *e) {
    if (!c->gpu_ids || g->dev_backend ||
        !hs_comm_nccl_fits(c->gpu_ids, g->world_ranks, g->size, g->queue->id))
        return HS_OK;
    return nccl_attach(g, (int)c->gpu_ids[c->rank].ordinal, e);
}

/* HS_COMM_BACKEND: unset, "auto" or "mpi". */
static hs_status backend_choice(const char **out, hs_error *e) {
    const char *v = getenv("HS_COMM_BACKEND");
    *out = v;
    if (!v || !v[0] || !strcmp(v, "auto") || !strcmp(v, "mpi")) return HS_OK;
    return hs_error_set(e, HS_ERR_USAGE,
                        "HS_COMM_BACKEND='%s' is not a backend: use 'mpi' (GPU buffers staged "
                        "through host memory for MPI) or 'auto' (the default: NCCL for every "
                        "group whose ranks each have a GPU of their own)",
                        v);
}

/* The world's GPUs, gathered over the management communicator. */
static hs_status gather_gpus(hs_comm *c, const hs_device *d, const char *choice, hs_error *e) {
    if (!c->gpu_ids && !(c->gpu_ids = calloc((size_t)c->size, sizeof *c->gpu_ids)))
        return hs_error_oom(e, "the table of the world's GPUs: %zu bytes",
                            (size_t)c->size * sizeof *c->gpu_ids);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    hs_gpu_id mine = {.host = (int64_t)hs_hash64(host),
                      .ordinal = hs_comm_nccl_offered(d, nccl_built, choice) ? d->ordinal : -1};
    _Static_assert(sizeof mine == 2 * sizeof(int64_t), "hs_gpu_id travels as two int64");
    int rc = MPI_Allgather(&mine, 2, MPI_INT64_T, c->gpu_ids, 2, MPI_INT64_T, c->mgmt);
    if (rc == MPI_SUCCESS) return HS_OK;
    char why[MPI_MAX_ERROR_STRING];
    return hs_error_set(e, HS_ERR_COMM, "gathering the world's GPUs: MPI_Allgather failed: %s",
                        hs_mpi_strerror(rc, why, sizeof why));
}

/* The staging buffers and the groups' communicators are the caller's
 * thread's to change only while no collective is outstanding. */
static void check_idle(hs_comm *c) {
    for (int i = 0; i < HS_COMM_QUEUE_COUNT; i++) {
        hs_queue *q = &c->queues[i];
        pthread_mutex_lock(&q->mu);
        bool idle = !q->head && !q->current.busy && !q->inflight;
        pthread_mutex_unlock(&q->mu);
        if (!idle)
            hs_panic("hs_comm_set_device with collectives outstanding on the %s queue; wait for "
                     "every collective first",
                     hs_comm_queue_name(q->id));
    }
}

hs_status hs_comm_set_device(hs_comm *c, hs_device *d, hs_error *e) {
    if (d == c->device) return HS_OK;
    /* the events of collectives still finishing are the old device's */
    hs_comm_settle_detached(c);
    const char *choice = NULL;
    hs_status st = d ? backend_choice(&choice, e) : HS_OK;
    if (st != HS_OK) return st;
    if (d) check_idle(c); /* a release checks only that no staging buffer is lent */
    for (int i = 0; i < HS_COMM_QUEUE_COUNT; i++) hs_stage_bind(&c->queues[i].stage, d);
    c->device = d;
    if (!d) return HS_OK;
    st = gather_gpus(c, d, choice, e);
    for (int i = 0; st == HS_OK && i < c->ngroups; i++)
        if (c->groups[i].pg) st = hs_comm_attach_device(c, c->groups[i].pg, e);
    return st;
}
