/* fsdp/param.h — one managed parameter (RFC 000 §5.5–§5.8, §7.4–§7.6).
 *
 * A managed parameter owns its sharded storage (the master copy the
 * optimizer updates; padded to C rows only when the shard is uneven) and
 * carries its own mesh info: which group it is sharded over and which group
 * its gradient is all-reduced over. Whether it all-gathers follows from one
 * fact, needs_all_gather = shard_size > 1.
 *
 * The unsharded view the model computes with has an explicit owner:
 *   SHARDED     the view IS the sharded storage (no all-gather, no cast):
 *               reshard only drops the mapping; it is never freed or copied
 *   CAST        a cast copy of the local storage (no all-gather, cast)
 *   ALL_GATHER  the all-gather output (shard size > 1)
 *   FUSED       a slice of a unit-wide fused buffer (comm fusion)
 * The cast and all-gather copies are compute copies: reshard frees them and
 * never writes them back into the master. */
#ifndef HS_FSDP_PARAM_H
#define HS_FSDP_PARAM_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/exposed.h"
#include "fsdp/mem.h"
#include "fsdp/plan.h"
#include "hypershard/comm.h"
#include "hypershard/model.h"

typedef enum hs_fsdp_mesh_kind {
    HS_FSDP_MESH_FSDP = 0, /* shard group only                          */
    HS_FSDP_MESH_HSDP,     /* shard group + replicate group             */
    HS_FSDP_MESH_DDP,      /* replicate_params: the flattened DP group  */
    HS_FSDP_MESH_KIND_COUNT
} hs_fsdp_mesh_kind;

const char *hs_fsdp_mesh_kind_name(hs_fsdp_mesh_kind k);

/* Topology of one parameter: on fsdp_non_moe_mesh (fsdp_replicate,
 * fsdp_shard, tp) its data-parallel groups and the tp group its TP tail
 * all-reduce runs on; a routed expert under expert parallelism is on
 * fsdp_moe_mesh (edp_replicate, edp_shard, ep) instead. A group pointer is
 * NULL exactly when its size is 1 (the collective is then the identity).
 * domain_factor scales the gradient before its first collective, relative
 * to the dense pre-scale: 1 on the dense mesh, edp / (dp*cp) on the expert
 * mesh (docs/moe.md "Gradient scaling"). */
/* grad_reduce's two levels over a shard group that spans N nodes with L of
 * its ranks on each (fsdp/manager.c): `node` the group's L ranks on this
 * node, `cross` the N ranks with this rank's index among its node's, each
 * ordered by shard rank. Chunk dest[l * N + c] (a shard rank) is summed
 * over the node by node rank l and then sent to cross rank c, its owner.
 * node == NULL: one level (an all-to-all over the shard group). */
typedef struct hs_fsdp_levels {
    hs_pg *node, *cross;
    int L, N;
    int *dest; /* [L * N] */
} hs_fsdp_levels;

typedef struct hs_fsdp_mesh_info {
    hs_fsdp_mesh_kind kind;
    hs_pg *shard_pg;
    int shard_size, shard_rank;
    hs_pg *replicate_pg;
    int replicate_size, replicate_rank;
    hs_pg *tp_pg;
    int tp_size, tp_rank;
    hs_pg *ep_pg; /* the expert mesh only */
    int ep_size, ep_rank;
    float domain_factor;
    /* hpZ: shard ranks [k*s, (k+1)*s) of the shard group, this rank
     * secondary_rank among them (fsdp_config.secondary_shard_size) */
    hs_pg *secondary_pg;
    int secondary_size, secondary_rank;
    const hs_fsdp_levels *levels; /* NULL or one level: see hs_fsdp_levels */
} hs_fsdp_mesh_info;

typedef enum hs_fsdp_storage_owner {
    HS_FSDP_STORAGE_SHARDED = 0,
    HS_FSDP_STORAGE_CAST,
    HS_FSDP_STORAGE_ALL_GATHER,
    HS_FSDP_STORAGE_FUSED,
    HS_FSDP_STORAGE_OWNER_COUNT
} hs_fsdp_storage_owner;

const char *hs_fsdp_storage_owner_name(hs_fsdp_storage_owner o);

typedef enum hs_fsdp_sharded_state {
    HS_FSDP_SHARDED = 0,
    HS_FSDP_UNSHARDING, /* all-gather issued, not waited */
    HS_FSDP_UNSHARDED,
} hs_fsdp_sharded_state;

typedef struct hs_fsdp_param {
    hs_param *p; /* the model's registry entry; data/grad are pointed here */
    int index;   /* model parameter index */
    bool replicate;
    hs_fsdp_mesh_info mi;
    hs_fsdp_plan plan;
    bool needs_all_gather;
    bool tp_all_reduce; /* TP-Replicate on a tp mesh > 1: AR(tp) in the root tail */
    float grad_factor;  /* x tp for a TP-partial gradient, else 1; folded into
                         * the one pre-scale before the first collective */
    /* The pre-scale and the data-parallel average cancel
     * (hs_fsdp_ctx_set_prescale): the reductions SUM and nothing scales
     * the gradient; the TP tail sums a partial gradient and averages a
     * whole one. Else the pre-scale pass and AVG everywhere. */
    bool dp_sum;
    hs_dtype compute_dtype; /* what the model reads (param_dtype or fp32) */
    hs_dtype grad_dtype;    /* what the model accumulates into */
    hs_dtype reduce_dtype;  /* of the gradient collectives (fsdp/mixed_precision.c) */
    bool offload;           /* master and sharded grad in the host pool (fsdp/offload.c) */
    /* fsdp_config.param_gather: the all-gather moves the shard quantized
     * in blocks of gather_block (tensor.h), every rank (the owner too)
     * reading back the same dequantized values; HS_QUANT_NONE moves it in
     * compute_dtype. The master is never quantized. */
    hs_quant_fmt gather_fmt;
    int64_t gather_block;
    /* fsdp_config.grad_reduce: the reduce-scatter is an all-to-all of the
     * W chunks of the reduce input, each quantized in blocks of
     * grad_block; the owner reads them back and sums them in fp32 in rank
     * order (then times 1/W for AVG), rounded once to reduce_dtype. */
    hs_quant_fmt grad_fmt;
    int64_t grad_block;
    hs_fsdp_mem *mem;

    /* master: fp32, padded_sharded_numel elements when uneven, else actual */
    float *storage;
    int64_t storage_numel;
    float *sharded; /* the actual shard view: a prefix of storage */
    /* fp32 main params (fsdp/main_params.c): the model's own shard in
     * compute_dtype, padded like storage; `storage` is then the fp32 main
     * param the optimizer updates, written back here after each step. */
    void *lp_shard;
    size_t lp_shard_bytes;

    hs_fsdp_sharded_state state;
    hs_fsdp_storage_owner owner; /* of `unsharded`, valid when not SHARDED */
    void *unsharded;             /* full logical view the model reads      */
    void *owned;                 /* what reshard frees (NULL for an alias) */
    size_t owned_bytes;
    hs_work *ag_work;
    /* hpZ (mi.secondary_size > 1): this rank's piece secondary_rank of the
     * padded unsharded buffer cut in secondary_size, in compute_dtype,
     * kept by a reshard whose backward is still to come; the next unshard
     * gathers the pieces over mi.secondary_pg (the same bits as the whole
     * group's gather: the masters have not changed) and frees it. */
    void *secondary;
    size_t secondary_bytes;
    void *ag_packed; /* the quantized all-gather's buffer, issue to wait */
    size_t ag_packed_bytes;
    /* ag_done: the all-gather's output is complete (ag_stream); last_use:
     * the compute stream's last read of the unsharded buffer, which the
     * all-gather stream waits for before the buffer goes back to the
     * device's cache for the next unshard; grad_ready: backward wrote the
     * gradient (compute stream), which the reduce-scatter waits for;
     * rs_done: the reduction read its input (rs_stream), before the
     * gradient buffers are freed. */
    hs_event *ag_done, *last_use, *grad_ready, *rs_done;

    /* gradients */
    void *unsharded_grad; /* padded unsharded, grad dtype; alive in backward */
    size_t unsharded_grad_bytes;
    void *rs_input; /* reduce_dtype; a copy when the grad dtype differs */
    size_t rs_input_bytes;
    void *acc_grad; /* no-sync accumulator in fp32 for 16-bit grads */
    size_t acc_grad_bytes;
    hs_work *rs_work;
    void *rs_packed; /* grad_reduce: W packed chunks out, then W in */
    size_t rs_packed_bytes;
    void *reduce_slot; /* this param's slice of its unit's reduce buffer */
    int64_t reduce_numel;
    float *sharded_grad; /* fp32 actual shard: what the optimizer reads */
    /* zero_grads left sharded_grad unwritten: the next reduced gradient is
     * stored into it, and a reader before that settles it to zeros. */
    bool sharded_grad_unset;
    /* train.reproducibility: layout over micro-batches (fsdp/canonical.c):
     * the stack of subtrees above sharded_grad (NULL: reduced gradients
     * are accumulated in turn), and the tree's shape */
    float *canon_slots;
    size_t canon_bytes;
    hs_tree_stack canon_tree;

    /* comm_fusion (fsdp/fusion.c): the unit all-gathers and reduce-scatters
     * this parameter together with its others; with zero-copy its local
     * shard (storage, or lp_shard) is a view of the unit's flat buffer. */
    bool fused;
    hs_fsdp_exposed *exposed; /* wait timing (fsdp/exposed.h); may be NULL */
} hs_fsdp_param;

/* Build the plan, allocate the sharded storage and fill it from `seed` so
 * that it equals the same rows of the single-process init. */
hs_status hs_fsdp_param_init(hs_fsdp_param *fp, hs_model *model, int index, bool replicate,
                             const hs_fsdp_mesh_info *mi, hs_dtype compute_dtype, hs_fsdp_mem *mem,
                             uint64_t seed, hs_error *e);
void hs_fsdp_param_free(hs_fsdp_param *fp);

/* Unshard in two phases so that all-gathers of a unit (or of prefetched
 * units) are in flight together. Issue is a no-op unless SHARDED; wait is a
 * no-op unless UNSHARDING, and installs the view into p->data. */
hs_status hs_fsdp_param_unshard_issue(hs_fsdp_param *fp, hs_error *e);
hs_status hs_fsdp_param_unshard_wait(hs_fsdp_param *fp, hs_error *e);
/* Back to SHARDED: frees an owned compute copy, never an alias, and a
 * kept secondary piece. */
void hs_fsdp_param_reshard(hs_fsdp_param *fp);
/* Reshard, first keeping this rank's secondary piece of an all-gathered
 * parameter where it has a secondary group (hpZ). HS_ERR_OOM when the
 * piece cannot be had: the ranks would then gather over different
 * groups, so the caller ends the run. */
hs_status hs_fsdp_param_reshard_keep(hs_fsdp_param *fp, hs_error *e);
/* Free a kept secondary piece (a SHARDED parameter's; an unshard in
 * flight frees its own at the wait). */
void hs_fsdp_param_drop_secondary(hs_fsdp_param *fp);

/* Backward: make p->grad a zeroed padded buffer unless one is still alive
 * (gradient accumulation without sync keeps it). The issue and begin
 * functions here return HS_ERR_OOM when their buffers cannot be had. */
hs_status hs_fsdp_param_grad_begin(hs_fsdp_param *fp, hs_error *e);
/* The reduction of the data-parallel groups (shard, replicate) and of the
 * TP tail for fp (see dp_sum). */
hs_reduce_op hs_fsdp_param_dp_op(const hs_fsdp_param *fp);
hs_reduce_op hs_fsdp_param_tp_op(const hs_fsdp_param *fp);
/* Whether the pre-scale `prescale` and fp's data-parallel average cancel:
 * prescale times its domain factor is the product of its shard and
 * replicate group sizes. */
bool hs_fsdp_param_prescale_cancels(const hs_fsdp_param *fp, float prescale);
/* The factor fp's gradient is scaled by before its first collective: 1
 * where the pre-scale and the averages cancel (dp_sum), else prescale
 * times its grad_factor. */
float hs_fsdp_param_input_scale(const hs_fsdp_param *fp, float prescale);
/* Scale the gradient by `prescale` (none when dp_sum), then issue this
 * parameter's reduce-scatter into its reduce slot (shard size > 1), or copy
 * the full gradient there (no reduce-scatter). */
hs_status hs_fsdp_param_reduce_issue(hs_fsdp_param *fp, float prescale, hs_error *e);
/* grad_reduce's pieces, which a fused unit (fusion.c) arranges its own way:
 * the two levels of fp's shard group (NULL: one level, or no grad_reduce);
 * the packed bytes of one chunk (P values); chunk r of the reduce input
 * (rs_input) packed into dst; acc (P fp32 values) = the sum, in order, of n
 * packed chunks at in + k * stride; and the owner's finish: that sum into
 * the reduce slot, times 1/W where the reduction averages, rounded once to
 * reduce_dtype. */
const hs_fsdp_levels *hs_fsdp_param_levels(const hs_fsdp_param *fp);
size_t hs_fsdp_param_grad_chunk_bytes(const hs_fsdp_param *fp);
void hs_fsdp_param_pack_grad_chunk(hs_fsdp_param *fp, void *dst, int r);
void hs_fsdp_param_sum_chunks(hs_fsdp_param *fp, float *acc, const char *in, size_t stride, int n);
hs_status hs_fsdp_param_finish_packed(hs_fsdp_param *fp, const char *in, size_t stride, int n,
                                      hs_error *e);
/* Wait the reduce-scatter and release the unsharded gradient. */
hs_status hs_fsdp_param_reduce_wait(hs_fsdp_param *fp, hs_error *e);
/* sharded_grad += the actual rows of the reduce slot (stored over it
 * when unset). */
hs_status hs_fsdp_param_reduce_apply(hs_fsdp_param *fp, hs_error *e);
/* zero_grads: sharded_grad reads as zeros from here on (set unset). */
void hs_fsdp_param_zero_sharded_grad(hs_fsdp_param *fp);
/* Zero a sharded_grad still unset, before anything reads it. */
void hs_fsdp_param_settle_sharded_grad(hs_fsdp_param *fp);
/* Drop the unsharded gradient without reducing it. */
void hs_fsdp_param_grad_release(hs_fsdp_param *fp);

/* fsdp/canonical.c: a reduced gradient (the shard's values, of dt) pushed
 * onto the parameter's micro-batch tree, emptied by zero_grads. */
void hs_fsdp_canon_push(hs_fsdp_param *fp, const void *src, hs_dtype dt);
void hs_fsdp_canon_free(hs_fsdp_param *fp);

#endif
