/* Expert parallelism on the ep group: the exchanges of the MoE layers and
 * whole expert tensors from the EP pieces. The exchanges sit on the
 * compute path, so a failure ends every rank. */
#include <stdlib.h>

#include "parallel/par_internal.h"

struct hs_ep {
    hs_comm *comm;
    hs_stream *stream; /* the device's compute stream: every exchange's */
    hs_pg *group;
    int size, rank;
    hs_parallel_stats stats;
    int64_t *displs; /* [2 * size]: send, then receive displacements of one exchange */
};

static void done(hs_ep *p, double t0, int64_t bytes, hs_status st, const hs_error *e) {
    hs_parallel_done(p->comm, &p->stats, t0, bytes, st, e);
}

void hs_ep_all_to_all(hs_ep *p, float *out, const float *in, int64_t per_rank) {
    hs_error e;
    double t0 = hs_now();
    hs_status st = hs_pg_all_to_all(p->group, p->stream, out, in, per_rank, HS_DTYPE_F32, &e);
    done(p, t0, per_rank * p->size * (int64_t)sizeof(float), st, &e);
}

void hs_ep_all_to_allv(hs_ep *p, void *out, const int64_t *recv_counts, const void *in,
                       const int64_t *send_counts, hs_dtype dt) {
    hs_error e;
    int64_t *d = p->displs;
    int64_t so = 0, ro = 0; /* displacements: prefix sums */
    for (int r = 0; r < p->size; r++) {
        d[r] = so, d[p->size + r] = ro;
        so += send_counts[r], ro += recv_counts[r];
    }
    int64_t sent = so;
    double t0 = hs_now();
    hs_work *w = hs_pg_all_to_allv_async(p->group, p->stream, out, recv_counts, d + p->size, in,
                                         send_counts, d, dt);
    hs_status st = hs_work_wait_stream(w, p->stream, &e);
    done(p, t0, sent * (int64_t)hs_dtype_size(dt), st, &e);
}

hs_status hs_ep_create(hs_comm *comm, hs_device *dev, hs_pg *group, hs_ep **out, hs_error *e) {
    *out = NULL;
    if (!group || hs_pg_size(group) < 2)
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "ep: expert parallelism needs an ep group of >= 2 ranks");
    hs_ep *p = calloc(1, sizeof *p);
    if (!p) return hs_error_oom(e, "ep: the EP context");
    *p = (hs_ep){.comm = comm,
                 .stream = dev->stream,
                 .group = group,
                 .size = hs_pg_size(group),
                 .rank = hs_pg_rank(group)};
    p->displs = malloc(sizeof(int64_t) * 2 * (size_t)p->size);
    if (!p->displs) {
        free(p);
        return hs_error_oom(e, "ep: the EP context");
    }
    *out = p;
    return HS_OK;
}

void hs_ep_free(hs_ep *p) {
    if (p) free(p->displs);
    free(p);
}

/* Shard(0): the EP ranks' blocks in rank order are the whole tensor. */
hs_status hs_ep_gather_full(hs_device *d, hs_ep *p, const hs_param *q, const float *local,
                            float *full, hs_error *e) {
    int64_t n = hs_param_local_numel(q);
    if (!q->on_ep_mesh) {
        hs_dev_copy(d, full, local, (size_t)n * sizeof(float));
        return HS_OK;
    }
    return hs_pg_all_gather(p->group, d->stream, full, local, n, HS_DTYPE_F32, e);
}

void hs_ep_local_slice(hs_device *d, const hs_param *q, const float *full, float *local) {
    int64_t n = hs_param_local_numel(q);
    int64_t row = n / q->local_shape[0];
    hs_dev_copy(d, local, full + (q->on_ep_mesh ? q->local_offset[0] * row : 0),
                (size_t)n * sizeof(float));
}

hs_parallel_stats hs_ep_get_stats(const hs_ep *p) { return p->stats; }
void hs_ep_reset_stats(hs_ep *p) { p->stats = (hs_parallel_stats){0}; }
