/* hypershard/fsdp.h — fully sharded data parallelism with FSDP2 semantics.
 *
 * Contract of this layer (RFC 000 §3–§7, spec 004 §3; DESIGN.md §3):
 * - Every managed parameter is sharded on dim 0 over its own shard group
 *   with torch.chunk semantics: C = ceil(D0 / W), actual(r) =
 *   max(min(D0 - r*C, C), 0). Padding exists only when uneven, only in the
 *   communication storage, zero-filled. needs_all_gather = shard size > 1.
 *   replicate_params and shard size 1 never all-gather and never copy.
 * - Each parameter carries its mesh info (shard group, replicate group, or
 *   the flattened DP group for replicate_params). A unit's parameters are
 *   driven by the state machine NONE -> PRE_FORWARD -> FORWARD ->
 *   PRE_BACKWARD -> BACKWARD through the model's hooks.
 * - Tensor parallelism: a parameter the TP planner placed on the tp mesh
 *   is sharded as its TP-local tensor (hs_param.local_shape), so TP
 *   Shard(0) then FSDP dim-0 is RFC §7.7's strided shard. The root drain
 *   ends with the TP tail: after every FSDP/HSDP/DP reduction, TP-Replicate
 *   gradients are all-reduced (AVG) over tp before they reach the
 *   optimizer (RFC §6.2); pure FSDP/HSDP issues no TP collective.
 * - The trainer sees only this API: wrap (FSDP2Manager.parallelize), the
 *   hooks to pass to the model, per-micro-batch flags, the optimizer's view
 *   of the local shards, the global grad norm, and the full-tensor gather
 *   used by export and checkpointing.
 */
#ifndef HYPERSHARD_FSDP_H
#define HYPERSHARD_FSDP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "hypershard/base.h"
#include "hypershard/comm.h"
#include "hypershard/config.h"
#include "hypershard/device.h"
#include "hypershard/mesh.h"
#include "hypershard/model.h"
#include "hypershard/optim.h"

/* torch.chunk shard of dim-0 length d0 over w ranks: rows held by rank r. */
int64_t hs_fsdp_chunk_rows(int64_t d0, int w);         /* C = ceil(d0/w) */
int64_t hs_fsdp_actual_rows(int64_t d0, int w, int r); /* actual(r)      */
int64_t hs_fsdp_row_offset(int64_t d0, int w, int r);  /* min(r*C, d0)   */

typedef struct hs_fsdp hs_fsdp;

/* FSDP2Manager.parallelize (spec 004 §3): resolve replicate_params (rule 11
 * errors via hs_config_check_fqns), assign each parameter to its deepest
 * unit, wrap blocks bottom-up, root last with reshard_after_forward = false,
 * prefetch order by declaration; allocate the sharded storage and
 * initialise it deterministically from `seed` (each shard equals the same
 * slice of the single-process init). Logs one line with the number of
 * wrapped transformer blocks and the shard / replicate degrees. The model
 * must have been created with allocate_params = false.
 * `fsdp` is the config's fsdp_config section (replicate_params, mixed
 * precision, offload, resharding, prefetch depths, comm fusion; its shard
 * sizes are already in the mesh) and `fp32_main_params` is
 * optimizer.fp32_main_params (the optimizer steps on fp32 copies of
 * narrower shards). */
hs_status hs_fsdp_wrap(const hs_fsdp_config *fsdp, bool fp32_main_params, hs_mesh *mesh,
                       hs_comm *comm, hs_device *dev, hs_model *model, uint64_t seed,
                       const hs_log *log, hs_fsdp **out, hs_error *e);
void hs_fsdp_free(hs_fsdp *f);

/* The hooks to pass to hs_model_forward_backward / hs_model_forward. */
const hs_model_hooks *hs_fsdp_hooks(hs_fsdp *f);

/* Before each micro-batch: whether this one reduces gradients and reshards
 * after backward (the trainer applies spec 004 §2.3: sync = requires_grad_sync
 * || last; reshard = reshard_after_backward || last). */
void hs_fsdp_set_micro_batch(hs_fsdp *f, bool requires_grad_sync, bool reshard_after_backward,
                             bool is_last);

/* A pipeline schedule's step bracket. begin_step: a training step starts
 * (forgets forwards that no backward followed, e.g. evaluation). drain:
 * finish every gradient reduction issued so far and apply it, as the root
 * does after the last backward; idempotent, so a schedule's forced drain
 * and the natural one never apply a gradient twice. */
void hs_fsdp_begin_step(hs_fsdp *f);
void hs_fsdp_drain(hs_fsdp *f);

/* The optimizer's parameters: local shards (or fp32 main params) with their
 * reduced fp32 gradients. Valid until hs_fsdp_free. */
int hs_fsdp_optim_params(hs_fsdp *f, hs_optim_param **out);
/* Global L2 norm of all gradients (each element counted once across shards
 * and replicas). */
hs_status hs_fsdp_grad_norm(hs_fsdp *f, double *norm, hs_error *e);
/* The sum of the squares hs_fsdp_grad_norm adds, exactly (hs_xsum), added
 * to *sum: every shard's squares, each shard group's ranks merged, so the
 * value is the same for every split of the gradients
 * (train.reproducibility: layout; gradients the host reads). */
hs_status hs_fsdp_grad_sumsq_exact(hs_fsdp *f, hs_xsum *sum, hs_error *e);
/* train.reproducibility: layout with `micro_batches` (a power of two) a
 * step: each parameter's reduced gradients merged as a pairwise tree over
 * the micro-batches instead of accumulated in turn (fsdp/canonical.c); the
 * tree's log2(micro_batches) subtrees of the sharded gradient come from
 * the gradient pool. */
hs_status hs_fsdp_canon_micro_batches(hs_fsdp *f, int micro_batches, hs_error *e);
/* After the masters changed (an update of the caller's, a load): stale
 * unsharded copies dropped, fp32 main params rounded back into the model's
 * 16-bit shards. */
hs_status hs_fsdp_after_step(hs_fsdp *f, hs_error *e);
/* The same after an hs_optim step over hs_fsdp_optim_params, which wrote
 * the 16-bit shards itself (hs_optim_param.copy): nothing is written back. */
hs_status hs_fsdp_after_optim_step(hs_fsdp *f, hs_error *e);
void hs_fsdp_zero_grads(hs_fsdp *f);

/* The full TP-local tensor of model parameter `param_index` (its whole
 * logical tensor without TP; parallel/ assembles TP pieces) as fp32 into
 * `out` (numel of hs_param.local_shape, device memory of the device FSDP
 * wraps on) on every rank of its data-parallel domain. Collective over
 * that domain. */
hs_status hs_fsdp_gather_full(hs_fsdp *f, int param_index, float *out, hs_error *e);

/* Model-parallel source layout of one parameter, as the TP/EP planner sets
 * it before FSDP wraps: the named mesh it lives on and one placement per
 * dim of that mesh. A parameter without one is a plain (full) tensor. */
typedef struct hs_source_layout {
    const char *mesh; /* e.g. "tp", "ep" */
    int ndim;
    hs_placement placements[HS_TENSOR_MAX_DIMS];
} hs_source_layout;

/* The one parameter-kind check of a unit (RFC 000 §4.1): its parameters are
 * either all plain (layouts[i] == NULL) or all laid out on the same source
 * mesh; a Partial placement is rejected. Errors list the FQNs and kinds. */
hs_status hs_fsdp_check_unit_sources(const char *unit_name, const char *const *fqns,
                                     const hs_source_layout *const *layouts, int n, hs_error *e);

/* The full reduced fp32 gradient of parameter `param_index` so far (after
 * the step's last micro-batch, before clipping), on every rank of its
 * data-parallel domain, into device memory. Collective over that domain
 * (train --dump). */
hs_status hs_fsdp_gather_full_grad(hs_fsdp *f, int param_index, float *out, hs_error *e);

/* Inverse of hs_fsdp_gather_full: every rank passes the same full fp32
 * tensor (device memory) and keeps its own rows (checkpoint import,
 * --init-from). */
hs_status hs_fsdp_set_full(hs_fsdp *f, int param_index, const float *full, hs_error *e);

/* This rank's part of parameter `param_index` for distributed checkpoints:
 * dim-0 rows [row_offset, row_offset + rows) of the TP-local tensor, held in
 * the fp32 master the optimizer updates; storage_rows is the row count of
 * the buffer behind it (C when the shard is uneven: padded communication
 * storage whose tail must be zero). With fp32 main params, model_copy is the
 * model's own shard in model_dtype (else NULL). Write the master, then call
 * hs_fsdp_after_step to rebuild what derives from it. */
typedef struct hs_fsdp_shard_view {
    int64_t row_offset, rows, storage_rows;
    float *master;
    void *model_copy;
    hs_dtype model_dtype;
} hs_fsdp_shard_view;

void hs_fsdp_shard_view_get(hs_fsdp *f, int param_index, hs_fsdp_shard_view *out);

/* Bytes FSDP holds on this rank (from its allocation accounting). */
typedef struct hs_fsdp_stats {
    int64_t param_bytes, param_peak_bytes; /* sharded + unsharded copies */
    int64_t grad_bytes, grad_peak_bytes;   /* unsharded + reduced grads  */
    int64_t total_param_bytes;             /* the unsharded model, fp32  */
    int shard_size, replicate_size;        /* dense degrees              */
    int blocks_wrapped, units;
} hs_fsdp_stats;

void hs_fsdp_get_stats(const hs_fsdp *f, hs_fsdp_stats *out);
/* This rank's unit listing as one JSON object: the dense and expert shard
 * degrees, then every unit ("(root)", "model.layers.0", ...) with its
 * parameters: FQN, mesh (fsdp_non_moe_mesh / fsdp_moe_mesh), mesh kind,
 * shard group and degrees, global / local / shard shapes. */
void hs_fsdp_write_units(const hs_fsdp *f, FILE *out);
/* Peak := current, to measure one phase. */
void hs_fsdp_reset_peak(hs_fsdp *f);

/* For measuring FSDP on its own (bench fsdp, measure.c). wrap_group: as
 * hs_fsdp_wrap, pure sharding over the one group `shard` (no replicate
 * group, no model parallelism, no mesh), so a benchmark can wrap over part
 * of the world. unit_gathered_numel: the logical (unpadded) elements of
 * unit `unit`'s parameters that are all-gathered, 0 <= unit <
 * hs_fsdp_stats.units (0 is the root). exposed: the seconds the compute
 * thread sat blocked waiting on FSDP's own collectives since the wrap or
 * the last reset; communication that finished while compute ran is not
 * counted. */
hs_status hs_fsdp_wrap_group(const hs_fsdp_config *fsdp, bool fp32_main_params, hs_pg *shard,
                             hs_comm *comm, hs_device *dev, hs_model *model, uint64_t seed,
                             const hs_log *log, hs_fsdp **out, hs_error *e);
int64_t hs_fsdp_unit_gathered_numel(const hs_fsdp *f, int unit);

typedef struct hs_fsdp_exposed_stats {
    double all_gather, reduce_scatter, all_reduce;
    double total; /* their sum */
} hs_fsdp_exposed_stats;

void hs_fsdp_get_exposed(const hs_fsdp *f, hs_fsdp_exposed_stats *out);
void hs_fsdp_reset_exposed(hs_fsdp *f);

#endif
