/* Communication fusion of one unit: flat buffers, one all-gather and one
 * reduce-scatter (layout and guarantees in fsdp/fusion.h). */
#include "fsdp/fusion.h"

#include <stdlib.h>
#include <string.h>

#include "fsdp/policy.h"

static char *at(void *base, int64_t elems, size_t es) { return (char *)base + (size_t)elems * es; }

static hs_status check_members(const hs_fsdp_unit *u, hs_fsdp_param **ps, int n, hs_error *e) {
    for (int j = 1; j < n; j++) {
        const hs_fsdp_param *a = ps[0], *b = ps[j];
        if (a->mi.shard_pg != b->mi.shard_pg || a->compute_dtype != b->compute_dtype ||
            a->reduce_dtype != b->reduce_dtype || a->offload != b->offload ||
            a->gather_fmt != b->gather_fmt || a->gather_block != b->gather_block ||
            a->grad_fmt != b->grad_fmt || a->grad_block != b->grad_block ||
            a->mi.levels != b->mi.levels)
            return hs_error_set(e, HS_ERR_CONFIG,
                                "fsdp_config.comm_fusion=true: unit %d (%s) holds %s (%s, %s) "
                                "and %s (%s, %s), which cannot share one all-gather; set "
                                "comm_fusion: false",
                                u->index, u->name[0] ? u->name : "root", a->p->fqn,
                                hs_dtype_name(a->compute_dtype), hs_dtype_name(a->reduce_dtype),
                                b->p->fqn, hs_dtype_name(b->compute_dtype),
                                hs_dtype_name(b->reduce_dtype));
    }
    return HS_OK;
}

/* The reduce-scatter writes its S-element output straight into the reduce
 * group whose slots are exactly the fused parameters, in the same order. */
static hs_fsdp_reduce_group *output_group(hs_fsdp_unit *u, hs_fsdp_fusion *fu) {
    for (int g = 0; g < u->n_groups; g++) {
        hs_fsdp_reduce_group *grp = &u->groups[g];
        if (grp->n_params != fu->n_params || grp->numel != fu->numel) continue;
        bool same = true;
        for (int j = 0; j < fu->n_params && same; j++) same = grp->params[j] == fu->params[j];
        if (same) return grp;
    }
    return NULL;
}

/* Zero-copy: move each local shard into one flat buffer and point the
 * parameter at its slice, so the all-gather reads the parameters in place
 * and the optimizer writes the flat buffer through the views. */
static hs_status rehome_sources(hs_fsdp_fusion *fu, const char *unit, hs_error *e) {
    hs_fsdp_param *p0 = fu->params[0];
    fu->src_dtype = p0->lp_shard ? p0->compute_dtype : HS_DTYPE_F32;
    size_t es = hs_dtype_size(fu->src_dtype);
    fu->flat_src = hs_fsdp_mem_alloc(fu->mem, HS_FSDP_MEM_PARAM, (size_t)fu->numel * es,
                                     "the fused local shards", unit, e);
    if (!fu->flat_src) return HS_ERR_OOM;
    fu->flat_src_bytes = (size_t)fu->numel * es;
    for (int j = 0; j < fu->n_params; j++) {
        hs_fsdp_param *fp = fu->params[j];
        void *view = at(fu->flat_src, fu->offset[j], es);
        HS_ASSERT(fp->storage_numel == fp->plan.padded_sharded_numel);
        if (fp->lp_shard) {
            hs_dev_copy(fu->mem->dev, view, fp->lp_shard, fp->lp_shard_bytes);
            hs_fsdp_mem_master_free(fu->mem, HS_FSDP_MEM_PARAM, fp->lp_shard, fp->lp_shard_bytes);
            fp->lp_shard = view;
        } else {
            size_t bytes = (size_t)fp->storage_numel * sizeof(float);
            hs_dev_copy(fu->mem->dev, view, fp->storage, bytes);
            hs_fsdp_mem_master_free(fu->mem, HS_FSDP_MEM_PARAM, fp->storage, bytes);
            fp->storage = fp->sharded = view;
        }
    }
    return HS_OK;
}

hs_status hs_fsdp_fusion_build(hs_fsdp_unit *u, bool zero_copy, hs_fsdp_mem *mem,
                               hs_fsdp_exposed *exposed, hs_error *e) {
    u->fusion = NULL;
    int n = 0;
    for (int i = 0; i < u->n_params; i++) n += u->params[i]->needs_all_gather;
    if (n == 0) return HS_OK;
    hs_fsdp_fusion *fu = calloc(1, sizeof *fu);
    if (!fu)
        return hs_error_oom(e, "fsdp unit %d: the fusion of its %d all-gathers: %zu bytes",
                            u->index, n, sizeof *fu);
    u->fusion = fu; /* from here hs_fsdp_fusion_free cleans up */
    fu->params = calloc((size_t)n, sizeof *fu->params);
    fu->offset = calloc((size_t)n, sizeof *fu->offset);
    fu->packed_offset = calloc((size_t)n, sizeof *fu->packed_offset);
    fu->grad_offset = calloc((size_t)n, sizeof *fu->grad_offset);
    if (!fu->params || !fu->offset || !fu->packed_offset || !fu->grad_offset)
        return hs_error_oom(e, "fsdp unit %d: the fusion tables of %d parameters: %zu bytes",
                            u->index, n,
                            (size_t)n * (sizeof *fu->params + sizeof *fu->offset +
                                         sizeof *fu->packed_offset + sizeof *fu->grad_offset));
    for (int i = 0; i < u->n_params; i++)
        if (u->params[i]->needs_all_gather) fu->params[fu->n_params++] = u->params[i];
    hs_status st = check_members(u, fu->params, n, e);
    if (st != HS_OK) return st;
    for (int j = 0; j < n; j++) {
        fu->offset[j] = fu->numel;
        fu->numel += fu->params[j]->plan.padded_sharded_numel;
    }
    hs_fsdp_param *p0 = fu->params[0];
    fu->gather_fmt = p0->gather_fmt;
    fu->gather_block = p0->gather_block;
    for (int j = 0; j < n && fu->gather_fmt != HS_QUANT_NONE; j++) {
        fu->packed_offset[j] = fu->packed_bytes;
        fu->packed_bytes += hs_quant_packed_bytes(fu->params[j]->plan.padded_sharded_numel,
                                                  fu->gather_block, fu->gather_fmt);
    }
    fu->grad_fmt = p0->grad_fmt;
    for (int j = 0; j < n && fu->grad_fmt != HS_QUANT_NONE; j++) {
        fu->grad_offset[j] = fu->grad_bytes;
        fu->grad_bytes += hs_fsdp_param_grad_chunk_bytes(fu->params[j]);
    }
    fu->pg = p0->mi.shard_pg;
    fu->world = p0->mi.shard_size;
    fu->ag_dtype = p0->compute_dtype;
    fu->rs_dtype = p0->reduce_dtype;
    fu->mem = mem;
    fu->exposed = exposed;
    fu->rs_group = output_group(u, fu);
    if (!fu->rs_group)
        return hs_error_set(e, HS_ERR_INTERNAL,
                            "fsdp unit %d (%s): the sharded parameters do not form one reduce "
                            "group, so one reduce-scatter cannot serve them",
                            u->index, u->name[0] ? u->name : "root");
    /* Offload keeps the masters in the host pool: the input is an H2D copy
     * whatever the layout, so there is nothing to view. */
    fu->zero_copy = zero_copy && !p0->offload;
    if (fu->zero_copy) st = rehome_sources(fu, u->name[0] ? u->name : "the root", e);
    if (st != HS_OK) return st;
    for (int j = 0; j < n; j++) fu->params[j]->fused = true;
    return HS_OK;
}

void hs_fsdp_fusion_free(hs_fsdp_unit *u) {
    hs_fsdp_fusion *fu = u->fusion;
    if (!fu) return;
    HS_ASSERT(fu->ag_work == NULL && fu->rs_work == NULL);
    hs_fsdp_fusion_reshard(fu);
    if (fu->flat_src) {
        /* The parameters' local shards are views of it: detach them so that
         * freeing the parameters frees nothing twice. */
        for (int j = 0; j < fu->n_params; j++) {
            hs_fsdp_param *fp = fu->params[j];
            if (fp->lp_shard) fp->lp_shard = NULL;
            else fp->storage = fp->sharded = NULL;
        }
        hs_fsdp_mem_free(fu->mem, HS_FSDP_MEM_PARAM, fu->flat_src, fu->flat_src_bytes);
    }
    hs_fsdp_mem_free(fu->mem, HS_FSDP_MEM_GRAD, fu->rs_in, fu->rs_in_bytes);
    free(fu->params);
    free(fu->offset);
    free(fu->packed_offset);
    free(fu->grad_offset);
    free(fu);
    u->fusion = NULL;
}

/* ---------------------------------------------------------------- unshard */

/* The fused input; NULL with e set when it cannot be made. */
static const void *all_gather_input(hs_fsdp_fusion *fu, hs_error *e) {
    size_t es = hs_dtype_size(fu->ag_dtype);
    if (fu->zero_copy && fu->src_dtype == fu->ag_dtype) return fu->flat_src;
    fu->ag_in = hs_fsdp_mem_alloc_uninit(fu->mem, HS_FSDP_MEM_PARAM, (size_t)fu->numel * es,
                                         "the fused all-gather input", fu->params[0]->p->fqn, e);
    if (!fu->ag_in) return NULL;
    fu->ag_in_bytes = (size_t)fu->numel * es;
    if (fu->zero_copy) {
        hs_dev_convert(fu->mem->dev, fu->ag_in, fu->ag_dtype, fu->flat_src, fu->src_dtype,
                       fu->numel);
        return fu->ag_in;
    }
    /* Copy-in: each padded local shard (zero tail included) into its slot. */
    for (int j = 0; j < fu->n_params; j++) {
        hs_fsdp_param *fp = fu->params[j];
        if (hs_fsdp_offload_to_compute(fp, at(fu->ag_in, fu->offset[j], es),
                                       fp->plan.padded_sharded_numel, e) != HS_OK)
            return NULL;
    }
    return fu->ag_in;
}

static void free_secondary(hs_fsdp_fusion *fu) {
    hs_fsdp_mem_free(fu->mem, HS_FSDP_MEM_PARAM, fu->secondary, fu->secondary_bytes);
    fu->secondary = NULL;
    fu->secondary_bytes = 0;
}

static void mark_unsharding(hs_fsdp_fusion *fu) {
    for (int j = 0; j < fu->n_params; j++) {
        hs_fsdp_param *fp = fu->params[j];
        fp->state = HS_FSDP_UNSHARDING;
        fp->owner = HS_FSDP_STORAGE_FUSED;
        fp->owned = NULL;
        fp->owned_bytes = 0;
        fp->unsharded = NULL;
    }
}

/* The quantized all-gather (fusion.h): each parameter's local shard packed
 * alone into this rank's chunk from what the unfused path packs it from —
 * its view of the flat source under zero-copy, its own source (the fp32
 * master, or the 16-bit model shard) under copy-in, the copy brought from
 * the host under offload; the chunks gathered in place as bytes. */
static hs_status unshard_packed(hs_fsdp_fusion *fu, hs_error *e) {
    const void *flat = fu->flat_src;
    hs_dtype flat_dt = fu->src_dtype;
    bool staged = !fu->zero_copy && fu->params[0]->offload;
    if (staged) {
        flat = all_gather_input(fu, e);
        if (!flat) return e ? e->code : HS_ERR_OOM;
        flat_dt = fu->ag_dtype;
    }
    size_t B = fu->packed_bytes, es = hs_dtype_size(flat_dt);
    fu->ag_out = hs_fsdp_mem_alloc_uninit(fu->mem, HS_FSDP_MEM_PARAM, B * (size_t)fu->world,
                                          "the fused quantized all-gather buffer",
                                          fu->params[0]->p->fqn, e);
    if (!fu->ag_out) return HS_ERR_OOM;
    fu->ag_out_bytes = B * (size_t)fu->world;
    char *mine = (char *)fu->ag_out + B * (size_t)hs_pg_rank(fu->pg);
    for (int j = 0; j < fu->n_params; j++) {
        hs_dtype dt = flat_dt;
        const void *src = fu->zero_copy || staged ? at((void *)flat, fu->offset[j], es)
                                                  : hs_fsdp_local_source(fu->params[j], &dt);
        hs_dev_quantize(fu->mem->dev, mine + fu->packed_offset[j], src, dt,
                        fu->params[j]->plan.padded_sharded_numel, fu->gather_block, fu->gather_fmt);
    }
    hs_stream *ag = hs_fsdp_mem_ag(fu->mem);
    hs_fsdp_mem_tie(fu->mem, fu->mem->dev->stream, ag);
    fu->ag_work = hs_pg_all_gather_async(fu->pg, ag, fu->ag_out, mine, (int64_t)B, HS_DTYPE_U8);
    mark_unsharding(fu);
    return HS_OK;
}

/* hpZ: the elements of one parameter's piece, and of the unit's. */
static int64_t piece_factor(const hs_fsdp_fusion *fu) {
    return fu->world / fu->params[0]->mi.secondary_size;
}

/* The backward's gather among the secondary group: the pieces, rank-major
 * over its s ranks, into ag_out (the unpack puts them in place). */
static hs_status unshard_secondary(hs_fsdp_fusion *fu, hs_error *e) {
    const hs_fsdp_mesh_info *mi = &fu->params[0]->mi;
    size_t es = hs_dtype_size(fu->ag_dtype);
    int64_t piece = piece_factor(fu) * fu->numel;
    fu->ag_out_bytes = (size_t)(piece * mi->secondary_size) * es;
    fu->ag_out = hs_fsdp_mem_alloc_uninit(fu->mem, HS_FSDP_MEM_PARAM, fu->ag_out_bytes,
                                          "the fused all-gather output", fu->params[0]->p->fqn, e);
    if (!fu->ag_out) return fu->ag_out_bytes = 0, HS_ERR_OOM;
    hs_stream *ag = hs_fsdp_mem_ag(fu->mem);
    hs_fsdp_mem_tie(fu->mem, fu->mem->dev->stream, ag);
    fu->ag_work = hs_pg_all_gather_async(mi->secondary_pg, ag, fu->ag_out, fu->secondary, piece,
                                         fu->ag_dtype);
    fu->ag_secondary = true;
    mark_unsharding(fu);
    return HS_OK;
}

hs_status hs_fsdp_fusion_unshard_issue(hs_fsdp_fusion *fu, hs_error *e) {
    if (fu->ag_work) return HS_OK;
    bool all_sharded = true, all_unsharded = true;
    for (int j = 0; j < fu->n_params; j++) {
        all_sharded &= fu->params[j]->state == HS_FSDP_SHARDED;
        all_unsharded &= fu->params[j]->state == HS_FSDP_UNSHARDED;
    }
    if (all_unsharded) return HS_OK;
    /* Some parameter was resharded alone (set_full): gather them all again. */
    if (!all_sharded) hs_fsdp_fusion_reshard(fu);
    if (fu->secondary) return unshard_secondary(fu, e);
    if (fu->gather_fmt != HS_QUANT_NONE) return unshard_packed(fu, e);
    const void *in = all_gather_input(fu, e);
    if (!in) return e ? e->code : HS_ERR_OOM;
    size_t out_bytes = (size_t)fu->numel * (size_t)fu->world * hs_dtype_size(fu->ag_dtype);
    fu->ag_out = hs_fsdp_mem_alloc_uninit(fu->mem, HS_FSDP_MEM_PARAM, out_bytes,
                                          "the fused all-gather output", fu->params[0]->p->fqn, e);
    if (!fu->ag_out) return HS_ERR_OOM;
    fu->ag_out_bytes = out_bytes;
    /* The all-gather stream waits for the compute stream: it wrote the
     * input, and last read the cached buffers the output reuses. */
    hs_stream *ag = hs_fsdp_mem_ag(fu->mem);
    hs_fsdp_mem_tie(fu->mem, fu->mem->dev->stream, ag);
    fu->ag_work = hs_pg_all_gather_async(fu->pg, ag, fu->ag_out, in, fu->numel, fu->ag_dtype);
    mark_unsharding(fu);
    return HS_OK;
}

/* Rank-major (r, j) chunks to parameter-major: parameter j's padded
 * unsharded tensor is its W chunks back to back. From the secondary
 * group, its s ranks' pieces of W/s chunks each. */
static void unpack(hs_fsdp_fusion *fu) {
    size_t es = hs_dtype_size(fu->ag_dtype);
    int64_t W = fu->world, S = fu->numel, k = fu->ag_secondary ? piece_factor(fu) : 1;
    for (int j = 0; j < fu->n_params; j++) {
        hs_fsdp_param *fp = fu->params[j];
        int64_t P = fp->plan.padded_sharded_numel;
        char *view = at(fu->unsharded, W * fu->offset[j], es);
        if (fu->gather_fmt == HS_QUANT_NONE || fu->ag_secondary) {
            hs_dev_copy_2d(fu->mem->dev, view, (size_t)(k * P) * es,
                           at(fu->ag_out, k * fu->offset[j], es), (size_t)(k * S) * es, W / k,
                           (size_t)(k * P) * es);
        } else {
            const char *piece = (const char *)fu->ag_out + fu->packed_offset[j];
            for (int64_t r = 0; r < W; r++)
                hs_dev_dequantize(fu->mem->dev, at(view, r * P, es), fu->ag_dtype,
                                  piece + fu->packed_bytes * (size_t)r, P, 0, P, fu->gather_block,
                                  fu->gather_fmt);
        }
        fp->unsharded = view; /* rows [0, D0) are the logical tensor */
        fp->state = HS_FSDP_UNSHARDED;
        fp->p->data = view;
    }
}

hs_status hs_fsdp_fusion_unshard_wait(hs_fsdp_fusion *fu, hs_error *e) {
    if (!fu->ag_work) return HS_OK;
    hs_work *w = fu->ag_work;
    fu->ag_work = NULL;
    hs_status st = hs_fsdp_exposed_wait(fu->exposed, HS_FSDP_WAIT_ALL_GATHER, w, e);
    /* the compute stream unpacks the output once it is complete */
    hs_fsdp_mem_tie(fu->mem, hs_fsdp_mem_ag(fu->mem), fu->mem->dev->stream);
    hs_fsdp_mem_free(fu->mem, HS_FSDP_MEM_PARAM, fu->ag_in, fu->ag_in_bytes);
    fu->ag_in = NULL;
    fu->ag_in_bytes = 0;
    size_t bytes = (size_t)fu->numel * (size_t)fu->world * hs_dtype_size(fu->ag_dtype);
    if (st == HS_OK) {
        fu->unsharded = hs_fsdp_mem_alloc_uninit(fu->mem, HS_FSDP_MEM_PARAM, bytes,
                                                 "the unpacked unsharded parameters",
                                                 fu->params[0]->p->fqn, e);
        st = fu->unsharded ? HS_OK : HS_ERR_OOM;
    }
    if (st == HS_OK) {
        fu->unsharded_bytes = bytes;
        unpack(fu);
    }
    hs_fsdp_mem_free(fu->mem, HS_FSDP_MEM_PARAM, fu->ag_out, fu->ag_out_bytes);
    fu->ag_out = NULL;
    fu->ag_out_bytes = 0;
    if (fu->ag_secondary) free_secondary(fu);
    fu->ag_secondary = false;
    return st;
}

static void reshard_views(hs_fsdp_fusion *fu) {
    /* Freeing under an in-flight all-gather would hand its output away. */
    HS_ASSERT(fu->ag_work == NULL);
    for (int j = 0; j < fu->n_params; j++) hs_fsdp_param_reshard(fu->params[j]);
    hs_fsdp_mem_free(fu->mem, HS_FSDP_MEM_PARAM, fu->unsharded, fu->unsharded_bytes);
    fu->unsharded = NULL;
    fu->unsharded_bytes = 0;
}

void hs_fsdp_fusion_drop_secondary(hs_fsdp_fusion *fu) {
    if (fu->secondary && !fu->ag_work) free_secondary(fu);
}

void hs_fsdp_fusion_reshard(hs_fsdp_fusion *fu) {
    hs_fsdp_fusion_drop_secondary(fu);
    reshard_views(fu);
}

hs_status hs_fsdp_fusion_reshard_keep(hs_fsdp_fusion *fu, hs_error *e) {
    const hs_fsdp_mesh_info *mi = &fu->params[0]->mi;
    if (fu->unsharded && mi->secondary_size > 1 && !fu->secondary) {
        size_t es = hs_dtype_size(fu->ag_dtype);
        int64_t k = piece_factor(fu);
        fu->secondary_bytes = (size_t)(k * fu->numel) * es;
        fu->secondary = hs_fsdp_mem_alloc_uninit(fu->mem, HS_FSDP_MEM_PARAM, fu->secondary_bytes,
                                                 "the fused secondary shard", fu->params[0]->p->fqn,
                                                 e);
        if (!fu->secondary) return fu->secondary_bytes = 0, HS_ERR_OOM;
        for (int j = 0; j < fu->n_params; j++) {
            int64_t P = fu->params[j]->plan.padded_sharded_numel;
            hs_dev_copy(
                fu->mem->dev, at(fu->secondary, k * fu->offset[j], es),
                at(fu->unsharded, fu->world * fu->offset[j] + mi->secondary_rank * k * P, es),
                (size_t)(k * P) * es);
        }
    }
    reshard_views(fu);
    return HS_OK;
}

/* ---------------------------------------------------------------- reduce */

/* The same scaled reduce-dtype input the unfused path sends (rs_input). */
static hs_status reduce_input(hs_fsdp_param *fp, float prescale, hs_error *e) {
    HS_ASSERT(fp->unsharded_grad != NULL && fp->rs_work == NULL);
    return hs_fsdp_mp_reduce_input(fp, hs_fsdp_param_input_scale(fp, prescale), NULL, e);
}

/* The quantized reduction (fusion.h): every parameter's chunk for each
 * destination packed into that destination's block, the blocks exchanged
 * by one byte all-to-all (over the node for two levels) into the second
 * half of rs_in. */
static hs_status reduce_packed(hs_fsdp_fusion *fu, float prescale, hs_error *e) {
    const hs_fsdp_levels *lv = hs_fsdp_param_levels(fu->params[0]);
    size_t C = fu->grad_bytes, half = C * (size_t)fu->world;
    fu->rs_in = hs_fsdp_mem_alloc_uninit(fu->mem, HS_FSDP_MEM_GRAD, 2 * half,
                                         "the fused quantized reduction's buffers",
                                         fu->params[0]->p->fqn, e);
    if (!fu->rs_in) return HS_ERR_OOM;
    fu->rs_in_bytes = 2 * half;
    char *send = fu->rs_in;
    for (int j = 0; j < fu->n_params; j++) {
        hs_fsdp_param *fp = fu->params[j];
        hs_status st = reduce_input(fp, prescale, e);
        if (st != HS_OK) return st;
        for (int k = 0; k < fu->world; k++)
            hs_fsdp_param_pack_grad_chunk(fp, send + C * (size_t)k + fu->grad_offset[j],
                                          lv ? lv->dest[k] : k);
        hs_fsdp_param_grad_release(fp);
    }
    hs_stream *rs = hs_fsdp_mem_rs(fu->mem);
    hs_fsdp_mem_tie(fu->mem, fu->mem->dev->stream, rs);
    fu->rs_work = hs_pg_all_to_all_async(lv ? lv->node : fu->pg, rs, send + half, send,
                                         (int64_t)C * (lv ? lv->N : 1), HS_DTYPE_U8);
    return HS_OK;
}

hs_status hs_fsdp_fusion_reduce_issue(hs_fsdp_fusion *fu, float prescale, hs_error *e) {
    HS_ASSERT(fu->rs_work == NULL && fu->rs_in == NULL);
    if (fu->grad_fmt != HS_QUANT_NONE) return reduce_packed(fu, prescale, e);
    size_t es = hs_dtype_size(fu->rs_dtype);
    int64_t W = fu->world, S = fu->numel;
    fu->rs_in = hs_fsdp_mem_alloc_uninit(fu->mem, HS_FSDP_MEM_GRAD, (size_t)(W * S) * es,
                                         "the fused reduce-scatter input", fu->params[0]->p->fqn,
                                         e);
    if (!fu->rs_in) return HS_ERR_OOM;
    fu->rs_in_bytes = (size_t)(W * S) * es;
    for (int j = 0; j < fu->n_params; j++) {
        hs_fsdp_param *fp = fu->params[j];
        hs_status st = reduce_input(fp, prescale, e);
        if (st != HS_OK) return st;
        int64_t P = fp->plan.padded_sharded_numel;
        hs_dev_copy_2d(fu->mem->dev, at(fu->rs_in, fu->offset[j], es), (size_t)S * es, fp->rs_input,
                       (size_t)P * es, W, (size_t)P * es);
        hs_fsdp_param_grad_release(fp);
    }
    /* the reduction reads the input the compute stream packed */
    hs_stream *rs = hs_fsdp_mem_rs(fu->mem);
    hs_fsdp_mem_tie(fu->mem, fu->mem->dev->stream, rs);
    fu->rs_work = hs_pg_reduce_scatter_async(fu->pg, rs, fu->rs_group->buf, fu->rs_in, S,
                                             fu->rs_dtype, fu->rs_group->op);
    return HS_OK;
}

/* Two levels, after the node's exchange: each parameter's N chunks summed
 * over the node and packed again into the cross group's blocks, exchanged
 * into `out` (N blocks of C: every node's sums of this rank's chunks). */
static hs_status cross_level(hs_fsdp_fusion *fu, const hs_fsdp_levels *lv, char *out, hs_error *e) {
    size_t C = fu->grad_bytes;
    const char *in = (const char *)fu->rs_in + C * (size_t)fu->world;
    char *send = out + C * (size_t)lv->N;
    int64_t most = 0;
    for (int j = 0; j < fu->n_params; j++)
        if (fu->params[j]->plan.padded_sharded_numel > most)
            most = fu->params[j]->plan.padded_sharded_numel;
    size_t part_bytes = (size_t)most * sizeof(float);
    float *part = hs_fsdp_mem_alloc_uninit(fu->mem, HS_FSDP_MEM_GRAD, part_bytes,
                                           "the node's partial sums", fu->params[0]->p->fqn, e);
    if (!part) return HS_ERR_OOM;
    for (int c = 0; c < lv->N; c++)
        for (int j = 0; j < fu->n_params; j++) {
            hs_fsdp_param *fp = fu->params[j];
            /* node rank l's block holds destination c's block at c */
            hs_fsdp_param_sum_chunks(fp, part, in + C * (size_t)c + fu->grad_offset[j],
                                     C * (size_t)lv->N, lv->L);
            hs_dev_quantize(fu->mem->dev, send + C * (size_t)c + fu->grad_offset[j], part,
                            HS_DTYPE_F32, fp->plan.padded_sharded_numel, fp->grad_block,
                            fp->grad_fmt);
        }
    hs_fsdp_mem_free(fu->mem, HS_FSDP_MEM_GRAD, part, part_bytes);
    hs_stream *rs = hs_fsdp_mem_rs(fu->mem);
    hs_fsdp_mem_tie(fu->mem, fu->mem->dev->stream, rs);
    hs_work *w = hs_pg_all_to_all_async(lv->cross, rs, out, send, (int64_t)C, HS_DTYPE_U8);
    hs_status st = hs_fsdp_exposed_wait(fu->exposed, HS_FSDP_WAIT_REDUCE_SCATTER, w, e);
    hs_fsdp_mem_tie(fu->mem, rs, fu->mem->dev->stream);
    return st;
}

/* The quantized reduction's end: every parameter summed from what arrived
 * (the W ranks' chunks, or the N nodes' sums) into its reduce slot. */
static hs_status sum_packed(hs_fsdp_fusion *fu, hs_error *e) {
    const hs_fsdp_levels *lv = hs_fsdp_param_levels(fu->params[0]);
    size_t C = fu->grad_bytes, cross_bytes = lv ? 2 * C * (size_t)lv->N : 0;
    const char *in = (const char *)fu->rs_in + C * (size_t)fu->world;
    char *cross = NULL;
    hs_status st = HS_OK;
    if (lv) {
        cross = hs_fsdp_mem_alloc_uninit(fu->mem, HS_FSDP_MEM_GRAD, cross_bytes,
                                         "the cross-node exchange's buffers", fu->params[0]->p->fqn,
                                         e);
        st = cross ? cross_level(fu, lv, cross, e) : HS_ERR_OOM;
        in = cross;
    }
    for (int j = 0; j < fu->n_params && st == HS_OK; j++)
        st = hs_fsdp_param_finish_packed(fu->params[j], in + fu->grad_offset[j], C,
                                         lv ? lv->N : fu->world, e);
    hs_fsdp_mem_free(fu->mem, HS_FSDP_MEM_GRAD, cross, cross_bytes);
    return st;
}

hs_status hs_fsdp_fusion_reduce_wait(hs_fsdp_fusion *fu, hs_error *e) {
    if (!fu->rs_work) return HS_OK;
    hs_work *w = fu->rs_work;
    fu->rs_work = NULL;
    hs_status st = hs_fsdp_exposed_wait(fu->exposed, HS_FSDP_WAIT_REDUCE_SCATTER, w, e);
    /* its input goes back to the cache once the reduction has read it */
    hs_fsdp_mem_tie(fu->mem, hs_fsdp_mem_rs(fu->mem), fu->mem->dev->stream);
    if (st == HS_OK && fu->grad_fmt != HS_QUANT_NONE) st = sum_packed(fu, e);
    hs_fsdp_mem_free(fu->mem, HS_FSDP_MEM_GRAD, fu->rs_in, fu->rs_in_bytes);
    fu->rs_in = NULL;
    fu->rs_in_bytes = 0;
    return st;
}
