/* fsdp/fusion.h — communication fusion of one unit (spec 004 §2.4, §5.11;
 * RFC 000 §6.3, §8.3.2): one all-gather per unshard and one reduce-scatter
 * per backward for all of the unit's sharded parameters, whatever their
 * number.
 *
 * Flat shard layout: parameter j occupies elements [off_j, off_j + P_j) of
 * an S-element flat shard, where P_j is its *padded* shard numel (C_j rows)
 * and off_j the sum of the P of the parameters before it. Every rank thus
 * sends S elements, and rank r's copy of parameter j lands at r*S + off_j
 * of the rank-major all-gather output. The reduce-scatter input is packed
 * the same way, so its output is the S-element flat shard again: it is the
 * unit's reduce buffer itself, in which each parameter's reduce slot is
 * already the view [off_j, off_j + P_j).
 *
 * Zero-copy (comm_fusion_zero_copy null or true): each parameter's local
 * shard (the fp32 master, or the 16-bit model shard under fp32 main params)
 * is a view into one flat buffer, which is the all-gather input as is; the
 * optimizer writes through those views. Copy-in (false): the parameters keep
 * their own storage and are copied into a flat input before each
 * all-gather. A cast (param_dtype without fp32 main params) or offload makes
 * the input a converted copy anyway, so those run the copy-in path.
 *
 * The model reads each parameter as a contiguous (C_j * W)-row tensor, so
 * the rank-major output is unpacked once into a parameter-major buffer whose
 * slices are the unsharded views (owner FUSED); gradients are packed from
 * their padded unsharded buffers into the rank-major input. Unpacking and
 * packing move whole chunks, never change a value, and the per-element
 * reduction order of the ring depends only on the chunk (rank), so fused
 * and unfused training are bitwise identical.
 *
 * Quantized (fsdp_config.param_gather): each parameter's P_j elements are
 * packed alone (tensor.h: blocks start at its first element), the packed
 * parameters back to back in each rank's chunk of B = sum of their packed
 * bytes, and every (rank, parameter) piece read back straight into its
 * view: the values, and so training, are the unfused quantized run's. The
 * quantized reduction (fsdp_config.grad_reduce) likewise: each
 * parameter's chunk for each rank packed alone, one all-to-all of blocks
 * of C = the sum of their packed bytes (in two levels, one per level), and
 * each parameter summed by the unfused path's own steps (fsdp/param.h). */
#ifndef HS_FSDP_FUSION_H
#define HS_FSDP_FUSION_H

#include <stdbool.h>

#include "fsdp/exposed.h"
#include "fsdp/unit.h"

typedef struct hs_fsdp_fusion {
    hs_pg *pg; /* the shard group of every fused parameter */
    int world;
    hs_fsdp_param **params; /* the unit's all-gathered parameters, unit order */
    int n_params;
    int64_t *offset;   /* padded offset of each in the flat shard (elements) */
    int64_t numel;     /* S */
    hs_dtype ag_dtype; /* compute dtype: the all-gather payload   */
    hs_dtype rs_dtype; /* reduce dtype: the reduce-scatter payload */
    bool zero_copy;

    void *flat_src; /* zero-copy: the local shards, S elements of src_dtype */
    size_t flat_src_bytes;
    hs_dtype src_dtype;

    void *ag_in; /* copy-in / cast input, alive while the all-gather runs */
    size_t ag_in_bytes;
    void *ag_out; /* rank-major output, alive until the wait unpacks it */
    size_t ag_out_bytes;
    /* param_gather: the packed all-gather (ag_out holds world x B bytes) */
    hs_quant_fmt gather_fmt;
    int64_t gather_block;
    size_t *packed_offset; /* of each parameter in a rank's chunk (bytes) */
    size_t packed_bytes;   /* B */
    void *unsharded;       /* parameter-major: the parameters' views */
    size_t unsharded_bytes;
    hs_work *ag_work;
    /* hpZ (secondary_shard_size): this rank's secondary piece of every
     * parameter, piece j (W/s x P_j elements of its view, from secondary
     * rank x W/s chunks on) at W/s x offset j; kept by a reshard whose
     * backward is to come, gathered among the secondary group by the next
     * unshard (ag_secondary) and freed at its wait. */
    void *secondary;
    size_t secondary_bytes;
    bool ag_secondary;

    void *rs_in; /* rank-major packed gradients (grad_reduce: sent, then received) */
    size_t rs_in_bytes;
    /* grad_reduce: each parameter's chunk packed alone at grad_offset[j]
     * of a destination's block of grad_bytes (C), the blocks in the
     * exchange's order (fsdp/param.h, hs_fsdp_param_levels) */
    hs_quant_fmt grad_fmt;
    size_t *grad_offset;
    size_t grad_bytes;
    hs_fsdp_reduce_group *rs_group; /* its buffer is the reduce-scatter output */
    hs_work *rs_work;

    hs_fsdp_mem *mem;
    hs_fsdp_exposed *exposed;
} hs_fsdp_fusion;

/* Fuse the unit's all-gathered parameters (after its reduce groups are
 * built; a unit without any keeps u->fusion NULL). zero_copy asks for the
 * view-backed local shards. Errors name the unit and the parameters that
 * cannot share one collective. */
hs_status hs_fsdp_fusion_build(hs_fsdp_unit *u, bool zero_copy, hs_fsdp_mem *mem,
                               hs_fsdp_exposed *exposed, hs_error *e);
/* Waits nothing: every collective must have been waited on. */
void hs_fsdp_fusion_free(hs_fsdp_unit *u);

/* Issue the one all-gather (no-op while in flight or when unsharded).
 * HS_ERR_OOM when its buffers cannot be allocated. */
hs_status hs_fsdp_fusion_unshard_issue(hs_fsdp_fusion *fu, hs_error *e);
/* Wait it and install every parameter's view. No-op when nothing is in
 * flight. */
hs_status hs_fsdp_fusion_unshard_wait(hs_fsdp_fusion *fu, hs_error *e);
/* Drop the views and free the unsharded buffer (and a kept secondary
 * piece). */
void hs_fsdp_fusion_reshard(hs_fsdp_fusion *fu);
/* The same, first keeping this rank's secondary piece where the unit has
 * a secondary group (hpZ); HS_ERR_OOM when it cannot be had. */
hs_status hs_fsdp_fusion_reshard_keep(hs_fsdp_fusion *fu, hs_error *e);
/* Free a kept secondary piece (not one an unshard in flight reads). */
void hs_fsdp_fusion_drop_secondary(hs_fsdp_fusion *fu);

/* Pack every fused parameter's gradient (scaled by prescale, in the reduce
 * dtype), release the unsharded gradients and issue the one reduce-scatter
 * into the unit's reduce buffer. */
hs_status hs_fsdp_fusion_reduce_issue(hs_fsdp_fusion *fu, float prescale, hs_error *e);
/* Wait the reduce-scatter and free the packed input. */
hs_status hs_fsdp_fusion_reduce_wait(hs_fsdp_fusion *fu, hs_error *e);

#endif
