/* The per-parameter AG/RS layout plan (RFC 000 §5.9, §7.6). */
#include "fsdp/plan.h"

static const char *const pack_kind_names[] = {"dim0_even", "dim0_padded"};
_Static_assert(sizeof pack_kind_names / sizeof pack_kind_names[0] == HS_FSDP_PACK_KIND_COUNT,
               "pack kind names follow the enum");

const char *hs_fsdp_pack_kind_name(hs_fsdp_pack_kind k) {
    return (unsigned)k < HS_FSDP_PACK_KIND_COUNT ? pack_kind_names[k] : "?";
}

static hs_status check_shard_dim(const char *fqn, int ndim, const int64_t *shape, int shard_dim,
                                 int world, hs_error *e) {
    char sbuf[96];
    if (ndim < 1)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "parameter %s is a scalar: FSDP shards dim 0 and a 0-d tensor has "
                            "none; keep it out of the model or give it shape [1]",
                            fqn);
    if (ndim > HS_TENSOR_MAX_DIMS)
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "parameter %s has %d dims; at most %d are supported", fqn, ndim,
                            HS_TENSOR_MAX_DIMS);
    if (shard_dim < 0 || shard_dim >= ndim)
        return hs_error_set(e, HS_ERR_INTERNAL, "parameter %s %s: shard dim %d out of range", fqn,
                            hs_shape_str(ndim, shape, sbuf, sizeof sbuf), shard_dim);
    if (shard_dim != 0 && world > 1) {
        if (shape[shard_dim] % world != 0)
            return hs_error_set(e, HS_ERR_CONFIG,
                                "parameter %s %s: uneven sharding of dim %d over %d ranks "
                                "(%lld %% %d != 0) is not supported; only dim 0 may be uneven. "
                                "Shard dim 0 instead or pick a shard degree dividing %lld",
                                fqn, hs_shape_str(ndim, shape, sbuf, sizeof sbuf), shard_dim, world,
                                (long long)shape[shard_dim], world, (long long)shape[shard_dim]);
        return hs_error_set(e, HS_ERR_CONFIG,
                            "parameter %s %s: FSDP shards dim 0 only, dim %d was requested "
                            "(world size %d)",
                            fqn, hs_shape_str(ndim, shape, sbuf, sizeof sbuf), shard_dim, world);
    }
    return HS_OK;
}

hs_status hs_fsdp_plan_build(hs_fsdp_plan *plan, const char *fqn, int ndim, const int64_t *shape,
                             int shard_dim, int world, int rank, hs_error *e) {
    HS_ASSERT(world >= 1 && rank >= 0 && rank < world);
    *plan = (hs_fsdp_plan){0};
    hs_status st = check_shard_dim(fqn, ndim, shape, shard_dim, world, e);
    if (st != HS_OK) return st;

    plan->ndim = ndim;
    plan->row_numel = 1;
    for (int d = 1; d < ndim; d++) plan->row_numel *= shape[d];
    plan->layout = hs_fsdp_layout_make(shape[0], world, rank);
    plan->kind = plan->layout.even ? HS_FSDP_PACK_DIM0_EVEN : HS_FSDP_PACK_DIM0_PADDED;
    for (int d = 0; d < ndim; d++) {
        plan->unpacked_shape[d] = shape[d];
        plan->actual_sharded_shape[d] = shape[d];
        plan->padded_sharded_shape[d] = shape[d];
        plan->padded_unsharded_shape[d] = shape[d];
    }
    /* Zero-length shards keep their other dims: (0, N), never an empty 0-d. */
    plan->actual_sharded_shape[0] = plan->layout.actual_rows;
    plan->padded_sharded_shape[0] = plan->layout.chunk_rows;
    plan->padded_unsharded_shape[0] = plan->layout.padded_rows;
    plan->unpacked_numel = shape[0] * plan->row_numel;
    plan->actual_sharded_numel = plan->layout.actual_rows * plan->row_numel;
    plan->padded_sharded_numel = plan->layout.chunk_rows * plan->row_numel;
    plan->padded_unsharded_numel = plan->layout.padded_rows * plan->row_numel;
    plan->packed_shape[0] = world;
    plan->packed_shape[1] = plan->padded_sharded_numel;
    return HS_OK;
}

void hs_fsdp_plan_zero_tail(hs_device *d, const hs_fsdp_plan *plan, void *padded_unsharded,
                            hs_dtype dt) {
    int64_t tail = plan->padded_unsharded_numel - plan->unpacked_numel;
    if (tail <= 0) return;
    size_t es = hs_dtype_size(dt);
    hs_dev_zero(d, (char *)padded_unsharded + (size_t)plan->unpacked_numel * es, (size_t)tail * es);
}
