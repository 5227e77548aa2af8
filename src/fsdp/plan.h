/* fsdp/plan.h — the per-parameter all-gather / reduce-scatter layout plan
 * (RFC 000 §5.9). It only describes shapes: how the logical (TP-local) full
 * tensor, the rank's actual shard, the padded communication shard, the
 * padded unsharded buffer and the packed (W, padded shard numel) view relate.
 * It never picks a group, an op or a dtype.
 *
 * Dim-0 sharding makes packing free: rank r's padded chunk occupies rows
 * [r*C, (r+1)*C) of the padded unsharded buffer and every rank but the
 * trailing ones owns a full chunk, so rows [0, D0) of that buffer are exactly
 * the logical tensor. Unpacking an all-gather output is a prefix view and
 * packing a gradient for reduce-scatter is writing it into the prefix of a
 * buffer whose tail rows [D0, C*W) are zero. */
#ifndef HS_FSDP_PLAN_H
#define HS_FSDP_PLAN_H

#include <stdint.h>

#include "fsdp/layout.h"
#include "hypershard/base.h"
#include "hypershard/device.h"
#include "hypershard/tensor.h"

typedef enum hs_fsdp_pack_kind {
    HS_FSDP_PACK_DIM0_EVEN = 0, /* actual == padded: views only, no padding */
    HS_FSDP_PACK_DIM0_PADDED,   /* uneven dim 0: zero tail in comm storage  */
    HS_FSDP_PACK_KIND_COUNT
} hs_fsdp_pack_kind;

const char *hs_fsdp_pack_kind_name(hs_fsdp_pack_kind k);

typedef struct hs_fsdp_plan {
    hs_fsdp_pack_kind kind;
    hs_fsdp_layout layout;
    int ndim;
    int64_t unpacked_shape[HS_TENSOR_MAX_DIMS];         /* logical full      */
    int64_t actual_sharded_shape[HS_TENSOR_MAX_DIMS];   /* optimizer / DCP   */
    int64_t padded_sharded_shape[HS_TENSOR_MAX_DIMS];   /* AG input, RS out  */
    int64_t padded_unsharded_shape[HS_TENSOR_MAX_DIMS]; /* AG output, RS in  */
    int64_t packed_shape[2];                            /* (W, padded numel) */
    int64_t row_numel;                                  /* dims 1.. product  */
    int64_t unpacked_numel;
    int64_t actual_sharded_numel;
    int64_t padded_sharded_numel;
    int64_t padded_unsharded_numel;
} hs_fsdp_plan;

/* Build the plan of parameter `fqn` (logical shape `shape`) sharded on
 * `shard_dim` over `world` ranks, seen from `rank`. Scalars are rejected;
 * only dim 0 is sharded, and a non-dim-0 request that does not divide
 * evenly is reported with the FQN, shape, dim and world size. */
hs_status hs_fsdp_plan_build(hs_fsdp_plan *plan, const char *fqn, int ndim, const int64_t *shape,
                             int shard_dim, int world, int rank, hs_error *e);

/* Zero rows [D0, C*W) of a padded unsharded buffer in d's memory (no-op
 * when even). */
void hs_fsdp_plan_zero_tail(hs_device *d, const hs_fsdp_plan *plan, void *padded_unsharded,
                            hs_dtype dt);

#endif
