/* Whole tensors from TP-local ones and back (export, import, dumps): a
 * Shard(d) local tensor is the torch.chunk slice d of the whole one. */
#include <stdlib.h>

#include "parallel/par_internal.h"

/* Rows of the whole tensor and contiguous run per row: the tensor viewed
 * as [outer, tp * run] with the split dim folded into the run. */
static void split_view(const hs_param *p, int64_t *outer, int64_t *run) {
    int d = p->tp.dim;
    *outer = 1;
    for (int i = 0; i < d; i++) *outer *= p->shape[i];
    *run = 1;
    for (int i = d; i < p->ndim; i++) *run *= p->local_shape[i];
}

static bool is_split(const hs_param *p) {
    return p->on_tp_mesh && p->tp.kind == HS_PLACEMENT_SHARD;
}

void hs_tp_local_slice(hs_device *d, const hs_param *p, const float *full, float *local) {
    int64_t n = hs_param_local_numel(p);
    if (!is_split(p)) {
        hs_dev_copy(d, local, full, (size_t)n * sizeof(float));
        return;
    }
    int64_t outer, run;
    split_view(p, &outer, &run);
    int64_t tp = p->shape[p->tp.dim] / p->local_shape[p->tp.dim];
    int64_t rank = p->local_offset[p->tp.dim] / p->local_shape[p->tp.dim];
    size_t rb = (size_t)run * sizeof(float);
    hs_dev_copy_2d(d, local, rb, full + rank * run, (size_t)tp * rb, outer, rb);
}

hs_status hs_tp_gather_full(hs_device *d, hs_tp *t, const hs_param *p, const float *local,
                            float *full, hs_error *e) {
    int64_t n = hs_param_local_numel(p);
    if (!is_split(p)) {
        hs_dev_copy(d, full, local, (size_t)n * sizeof(float));
        return HS_OK;
    }
    int64_t outer, run;
    split_view(p, &outer, &run);
    if (outer == 1) /* Shard(0): the blocks in rank order are the tensor */
        return hs_pg_all_gather(t->group, d->stream, full, local, n, HS_DTYPE_F32, e);
    /* Device memory, as a collective's buffers are on a GPU. */
    float *blocks = hs_device_alloc(d, (size_t)(n * t->size) * sizeof(float));
    if (!blocks) return hs_error_oom(e, "tp: to gather %s", p->fqn);
    hs_status st = hs_pg_all_gather(t->group, d->stream, blocks, local, n, HS_DTYPE_F32, e);
    size_t rb = (size_t)run * sizeof(float);
    for (int r = 0; st == HS_OK && r < t->size; r++)
        hs_dev_copy_2d(d, full + r * run, (size_t)t->size * rb, blocks + (int64_t)r * n, rb, outer,
                       rb);
    hs_device_free_mem(d, blocks);
    return st;
}
