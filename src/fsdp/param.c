/* One managed parameter: storage, unshard/reshard and its gradient path. */
#include "fsdp/param.h"

#include <math.h>
#include <string.h>

#include "fsdp/policy.h"

static const char *const mesh_kind_names[] = {"fsdp", "hsdp", "ddp"};
_Static_assert(sizeof mesh_kind_names / sizeof mesh_kind_names[0] == HS_FSDP_MESH_KIND_COUNT,
               "mesh kind names follow the enum");
static const char *const owner_names[] = {"sharded", "cast", "all_gather", "fused"};
_Static_assert(sizeof owner_names / sizeof owner_names[0] == HS_FSDP_STORAGE_OWNER_COUNT,
               "storage owner names follow the enum");

const char *hs_fsdp_mesh_kind_name(hs_fsdp_mesh_kind k) {
    return (unsigned)k < HS_FSDP_MESH_KIND_COUNT ? mesh_kind_names[k] : "?";
}

const char *hs_fsdp_storage_owner_name(hs_fsdp_storage_owner o) {
    return (unsigned)o < HS_FSDP_STORAGE_OWNER_COUNT ? owner_names[o] : "?";
}

static size_t bytes_of(int64_t numel, hs_dtype dt) { return (size_t)numel * hs_dtype_size(dt); }

hs_status hs_fsdp_param_init(hs_fsdp_param *fp, hs_model *model, int index, bool replicate,
                             const hs_fsdp_mesh_info *mi, hs_dtype compute_dtype, hs_fsdp_mem *mem,
                             uint64_t seed, hs_error *e) {
    *fp = (hs_fsdp_param){0};
    hs_status st = HS_OK;
    hs_event **ev[] = {&fp->ag_done, &fp->last_use, &fp->grad_ready, &fp->rs_done};
    for (int i = 0; mem->ag_stream && i < 4 && st == HS_OK; i++)
        st = hs_event_create(mem->dev, ev[i], e);
    if (st != HS_OK) return st;
    hs_param *p = hs_model_param(model, index);
    fp->p = p;
    fp->index = index;
    fp->replicate = replicate;
    fp->mi = *mi;
    fp->compute_dtype = compute_dtype;
    fp->grad_dtype = p->grad_dtype;
    fp->reduce_dtype = HS_DTYPE_F32; /* the manager applies mix_precision */
    fp->offload = mem->offload;
    fp->mem = mem;
    HS_ASSERT(mi->shard_size >= 1 && mi->replicate_size >= 1);
    st = hs_fsdp_plan_build(&fp->plan, p->fqn, p->ndim, p->local_shape, 0, mi->shard_size,
                            mi->shard_rank, e);
    if (st != HS_OK) return st;
    fp->needs_all_gather = mi->shard_size > 1;
    /* RFC §6.2: a TP-Replicate parameter's gradient is all-reduced over tp
     * in the root's TP tail; under sequence parallel each TP rank's part is
     * a summand, which the pre-scale turns into an average's input. */
    fp->tp_all_reduce = mi->tp_size > 1 && p->on_tp_mesh && p->tp.kind == HS_PLACEMENT_REPLICATE;
    fp->grad_factor = fp->tp_all_reduce && p->tp_grad_partial ? (float)mi->tp_size : 1.0f;
    fp->grad_factor *= mi->domain_factor > 0.0f ? mi->domain_factor : 1.0f;

    /* Padding only when uneven: the even shard is its own comm storage. */
    const hs_fsdp_plan *pl = &fp->plan;
    fp->storage_numel = pl->kind == HS_FSDP_PACK_DIM0_EVEN ? pl->actual_sharded_numel
                                                           : pl->padded_sharded_numel;
    fp->storage = hs_fsdp_mem_master_alloc(mem, HS_FSDP_MEM_PARAM,
                                           bytes_of(fp->storage_numel, HS_DTYPE_F32),
                                           "the sharded storage", p->fqn, e);
    if (!fp->storage) return HS_ERR_OOM;
    fp->sharded = fp->storage;
    if (pl->layout.actual_rows > 0)
        hs_model_init_param_rows(model, p, seed, fp->sharded, HS_DTYPE_F32, pl->layout.row_offset,
                                 pl->layout.actual_rows);
    fp->sharded_grad = hs_fsdp_mem_master_alloc(mem, HS_FSDP_MEM_GRAD,
                                                bytes_of(pl->actual_sharded_numel, HS_DTYPE_F32),
                                                "the sharded gradient", p->fqn, e);
    if (!fp->sharded_grad) return HS_ERR_OOM;
    fp->state = HS_FSDP_SHARDED;
    p->data = NULL;
    p->grad = NULL;
    return HS_OK;
}

/* `to` waits for `from`'s work so far (no-op without FSDP's streams). */
static void order(hs_event *e, hs_stream *from, hs_stream *to) {
    if (!e) return;
    hs_event_record(e, from);
    hs_stream_wait(to, e);
}

static void free_events(hs_fsdp_param *fp) {
    hs_event_free(fp->ag_done), hs_event_free(fp->last_use);
    hs_event_free(fp->grad_ready), hs_event_free(fp->rs_done);
    fp->ag_done = fp->last_use = fp->grad_ready = fp->rs_done = NULL;
}

void hs_fsdp_param_free(hs_fsdp_param *fp) {
    if (!fp->p) {
        free_events(fp);
        return;
    }
    HS_ASSERT(fp->ag_work == NULL && fp->rs_work == NULL && fp->ag_packed == NULL &&
              fp->rs_packed == NULL);
    hs_fsdp_param_reshard(fp);
    hs_fsdp_param_grad_release(fp);
    hs_fsdp_canon_free(fp);
    hs_fsdp_main_free(fp);
    hs_fsdp_mem_master_free(fp->mem, HS_FSDP_MEM_PARAM, fp->storage,
                            bytes_of(fp->storage_numel, HS_DTYPE_F32));
    hs_fsdp_mem_master_free(fp->mem, HS_FSDP_MEM_GRAD, fp->sharded_grad,
                            bytes_of(fp->plan.actual_sharded_numel, HS_DTYPE_F32));
    fp->storage = fp->sharded = fp->sharded_grad = NULL;
    fp->p = NULL;
    free_events(fp);
}

/* ---------------------------------------------------------------- unshard */

/* NULL (nothing owned) when the device will not give it. */
static void *own(hs_fsdp_param *fp, hs_fsdp_storage_owner owner, int64_t numel, hs_error *e) {
    size_t bytes = bytes_of(numel, fp->compute_dtype);
    /* Written whole before it is read: the all-gather fills every row of
     * every rank's chunk (padding included), the cast every element. An
     * all-gather output is the all-gather stream's: reshard makes that
     * stream wait for its last read before it goes back to the cache. */
    bool gathered = owner == HS_FSDP_STORAGE_ALL_GATHER;
    void *p = hs_fsdp_mem_alloc_on(
        fp->mem, HS_FSDP_MEM_PARAM, bytes, gathered ? hs_fsdp_mem_ag(fp->mem) : NULL,
        gathered ? "the all-gather output" : "the compute-dtype copy", fp->p->fqn, e);
    if (!p) return NULL;
    fp->owner = owner;
    fp->owned_bytes = bytes;
    fp->owned = p;
    return p;
}

/* The quantized all-gather: this rank's padded shard packed into its
 * block of the packed buffer (straight from the master, or the 16-bit
 * model shard; under offload through this rank's block of the output),
 * the packed blocks gathered in place as bytes, and every rank's block
 * read back into the output at the wait. */
static hs_status unshard_packed(hs_fsdp_param *fp, hs_error *e) {
    const hs_fsdp_plan *pl = &fp->plan;
    int64_t P = pl->padded_sharded_numel;
    int W = fp->mi.shard_size, rank = hs_pg_rank(fp->mi.shard_pg);
    HS_ASSERT(fp->storage_numel == P);
    void *out = own(fp, HS_FSDP_STORAGE_ALL_GATHER, pl->padded_unsharded_numel, e);
    if (!out) return HS_ERR_OOM;
    size_t pb = hs_quant_packed_bytes(P, fp->gather_block, fp->gather_fmt);
    char *packed = hs_fsdp_mem_alloc_uninit(fp->mem, HS_FSDP_MEM_PARAM, pb * (size_t)W,
                                            "the quantized all-gather buffer", fp->p->fqn, e);
    if (!packed) return HS_ERR_OOM;
    fp->ag_packed = packed;
    fp->ag_packed_bytes = pb * (size_t)W;
    hs_dtype src_dt;
    const void *src = hs_fsdp_local_source(fp, &src_dt);
    if (fp->offload) {
        void *slot = (char *)out + bytes_of((int64_t)rank * P, fp->compute_dtype);
        hs_status st = hs_fsdp_offload_to_compute(fp, slot, P, e);
        if (st != HS_OK) return st;
        src = slot;
        src_dt = fp->compute_dtype;
    }
    char *mine = packed + pb * (size_t)rank;
    hs_dev_quantize(fp->mem->dev, mine, src, src_dt, P, fp->gather_block, fp->gather_fmt);
    hs_stream *ag = hs_fsdp_mem_ag(fp->mem);
    hs_fsdp_mem_tie(fp->mem, fp->mem->dev->stream, ag);
    fp->ag_work =
        hs_pg_all_gather_async(fp->mi.shard_pg, ag, packed, mine, (int64_t)pb, HS_DTYPE_U8);
    fp->unsharded = out;
    fp->state = HS_FSDP_UNSHARDING;
    return HS_OK;
}

/* Every rank's packed block into its chunk of the output (compute stream,
 * after the all-gather); the packed buffer goes back to the cache. */
static void unpack_packed(hs_fsdp_param *fp) {
    int64_t P = fp->plan.padded_sharded_numel;
    size_t pb = hs_quant_packed_bytes(P, fp->gather_block, fp->gather_fmt);
    for (int r = 0; r < fp->mi.shard_size; r++)
        hs_dev_dequantize(fp->mem->dev, (char *)fp->unsharded + bytes_of(r * P, fp->compute_dtype),
                          fp->compute_dtype, (const char *)fp->ag_packed + pb * (size_t)r, P, 0, P,
                          fp->gather_block, fp->gather_fmt);
}

/* hpZ: the elements of one secondary piece. */
static int64_t secondary_numel(const hs_fsdp_param *fp) {
    return fp->plan.padded_unsharded_numel / fp->mi.secondary_size;
}

/* The backward's gather among the secondary group, in place of the whole
 * group's: the pieces are the unsharded buffer's bits, so the output is
 * the one the whole group would gather. */
static hs_status unshard_secondary(hs_fsdp_param *fp, hs_error *e) {
    void *out = own(fp, HS_FSDP_STORAGE_ALL_GATHER, fp->plan.padded_unsharded_numel, e);
    if (!out) return HS_ERR_OOM;
    /* the piece was copied on the compute stream */
    hs_stream *ag = hs_fsdp_mem_ag(fp->mem);
    hs_fsdp_mem_tie(fp->mem, fp->mem->dev->stream, ag);
    fp->ag_work = hs_pg_all_gather_async(fp->mi.secondary_pg, ag, out, fp->secondary,
                                         secondary_numel(fp), fp->compute_dtype);
    fp->unsharded = out;
    fp->state = HS_FSDP_UNSHARDING;
    return HS_OK;
}

static void free_secondary(hs_fsdp_param *fp) {
    hs_fsdp_mem_free(fp->mem, HS_FSDP_MEM_PARAM, fp->secondary, fp->secondary_bytes);
    fp->secondary = NULL;
    fp->secondary_bytes = 0;
}

void hs_fsdp_param_drop_secondary(hs_fsdp_param *fp) {
    if (fp->secondary && fp->state == HS_FSDP_SHARDED) free_secondary(fp);
}

static void free_packed(hs_fsdp_param *fp) {
    hs_fsdp_mem_free(fp->mem, HS_FSDP_MEM_PARAM, fp->ag_packed, fp->ag_packed_bytes);
    fp->ag_packed = NULL;
    fp->ag_packed_bytes = 0;
}

hs_status hs_fsdp_param_unshard_issue(hs_fsdp_param *fp, hs_error *e) {
    if (fp->state != HS_FSDP_SHARDED) return HS_OK;
    const hs_fsdp_plan *pl = &fp->plan;
    /* The local source is the fp32 master, or the model's own 16-bit shard
     * under fp32 main params; a copy is made only to cast it or to bring it
     * from the host (offload). */
    hs_dtype src_dt;
    const void *src = hs_fsdp_local_source(fp, &src_dt);
    bool direct = hs_fsdp_local_source_is_compute(fp);
    if (fp->secondary) return unshard_secondary(fp, e);
    if (fp->needs_all_gather && fp->gather_fmt != HS_QUANT_NONE) return unshard_packed(fp, e);
    if (fp->needs_all_gather) {
        /* Copy the padded storage, not the actual view: every rank must send
         * the same element count. */
        const void *in = src;
        void *out = own(fp, HS_FSDP_STORAGE_ALL_GATHER, pl->padded_unsharded_numel, e);
        if (!out) return HS_ERR_OOM;
        if (!direct) {
            /* Cast (or bring from the host) straight into this rank's own
             * block of the output: the all-gather runs in place, with no
             * input copy to allocate and none for the comm thread to copy. */
            HS_ASSERT(fp->storage_numel == pl->padded_sharded_numel);
            void *slot = (char *)out +
                         bytes_of((int64_t)hs_pg_rank(fp->mi.shard_pg) * pl->padded_sharded_numel,
                                  fp->compute_dtype);
            hs_status st = hs_fsdp_offload_to_compute(fp, slot, fp->storage_numel, e);
            if (st != HS_OK) return st;
            in = slot;
        }
        /* The input was written on the compute stream (the cast, or the
         * optimizer's last update of the master). */
        hs_stream *ag = hs_fsdp_mem_ag(fp->mem);
        hs_fsdp_mem_tie(fp->mem, fp->mem->dev->stream, ag);
        fp->ag_work = hs_pg_all_gather_async(fp->mi.shard_pg, ag, out, in, pl->padded_sharded_numel,
                                             fp->compute_dtype);
        fp->unsharded = out; /* rows [0, D0) are the logical tensor */
        fp->state = HS_FSDP_UNSHARDING;
        return HS_OK;
    }
    if (!direct) {
        void *c = own(fp, HS_FSDP_STORAGE_CAST, pl->unpacked_numel, e);
        hs_status st = c ? hs_fsdp_offload_to_compute(fp, c, pl->unpacked_numel, e) : HS_ERR_OOM;
        if (st != HS_OK) return st;
        fp->unsharded = c;
    } else {
        /* No all-gather, no cast, no offload: the compute view is the local
         * storage itself. Nothing is allocated and nothing is copied. */
        fp->owner = HS_FSDP_STORAGE_SHARDED;
        fp->owned = NULL;
        fp->owned_bytes = 0;
        fp->unsharded = (void *)src;
    }
    fp->state = HS_FSDP_UNSHARDING;
    return HS_OK;
}

hs_status hs_fsdp_param_unshard_wait(hs_fsdp_param *fp, hs_error *e) {
    if (fp->state != HS_FSDP_UNSHARDING) return HS_OK;
    if (fp->ag_work) {
        hs_work *w = fp->ag_work;
        fp->ag_work = NULL;
        hs_status st = hs_fsdp_exposed_wait(fp->exposed, HS_FSDP_WAIT_ALL_GATHER, w, e);
        /* the compute stream reads the output only once it is complete */
        order(fp->ag_done, fp->mem->ag_stream, fp->mem->dev->stream);
        if (st == HS_OK && fp->ag_packed) unpack_packed(fp);
        if (fp->ag_packed) free_packed(fp);
        if (fp->secondary) free_secondary(fp);
        if (st != HS_OK) return st;
    }
    fp->state = HS_FSDP_UNSHARDED;
    fp->p->data = fp->unsharded;
    return HS_OK;
}

static void reshard(hs_fsdp_param *fp);

void hs_fsdp_param_reshard(hs_fsdp_param *fp) {
    hs_fsdp_param_drop_secondary(fp);
    reshard(fp);
}

hs_status hs_fsdp_param_reshard_keep(hs_fsdp_param *fp, hs_error *e) {
    if (fp->state == HS_FSDP_UNSHARDED && fp->owner == HS_FSDP_STORAGE_ALL_GATHER &&
        fp->mi.secondary_size > 1 && !fp->secondary) {
        int64_t n = secondary_numel(fp);
        size_t bytes = bytes_of(n, fp->compute_dtype);
        void *piece = hs_fsdp_mem_alloc_uninit(fp->mem, HS_FSDP_MEM_PARAM, bytes,
                                               "the secondary shard", fp->p->fqn, e);
        if (!piece) return HS_ERR_OOM;
        hs_dev_copy(fp->mem->dev, piece,
                    (const char *)fp->unsharded +
                        bytes_of((int64_t)fp->mi.secondary_rank * n, fp->compute_dtype),
                    bytes);
        fp->secondary = piece;
        fp->secondary_bytes = bytes;
    }
    reshard(fp);
    return HS_OK;
}

static void reshard(hs_fsdp_param *fp) {
    if (fp->state == HS_FSDP_SHARDED) return;
    /* Resharding an in-flight all-gather would free its output under the
     * comm thread. */
    HS_ASSERT(fp->ag_work == NULL);
    if (fp->owner == HS_FSDP_STORAGE_SHARDED || fp->owner == HS_FSDP_STORAGE_FUSED) {
        /* Borrowed alias of the master, or a slice of the unit's fused
         * buffer (the unit frees it): drop the mapping only. */
        HS_ASSERT(fp->owned == NULL);
    } else {
        HS_ASSERT(fp->owned != NULL && fp->owned != (void *)fp->storage &&
                  fp->owned != fp->lp_shard);
        /* The buffer goes back to the cache for the next unshard, which
         * writes it on the all-gather stream: that stream waits for the
         * compute stream's last read of it first. */
        order(fp->last_use, fp->mem->dev->stream, fp->mem->ag_stream);
        hs_fsdp_mem_free(fp->mem, HS_FSDP_MEM_PARAM, fp->owned, fp->owned_bytes);
    }
    fp->owned = NULL;
    fp->owned_bytes = 0;
    fp->unsharded = NULL;
    fp->state = HS_FSDP_SHARDED;
    fp->p->data = NULL;
}

/* ------------------------------------------------------------- gradients */

hs_status hs_fsdp_param_grad_begin(hs_fsdp_param *fp, hs_error *e) {
    if (fp->p->frozen) { /* no gradient: nothing allocated, reduced or applied */
        fp->p->grad = NULL;
        return HS_OK;
    }
    if (!fp->unsharded_grad) {
        /* Padded rows: the reduce-scatter input is this buffer as is, and
         * its tail [D0, C*W) stays zero because the model never writes it.
         * A gradient whose first write stores over it is handed out unset
         * (no zero fill) but for that tail. */
        size_t bytes = bytes_of(fp->plan.padded_unsharded_numel, fp->grad_dtype);
        bool first_store = fp->p->grad_first_store;
        void *g = first_store ? hs_fsdp_mem_alloc_uninit(fp->mem, HS_FSDP_MEM_GRAD, bytes,
                                                         "the unsharded gradient", fp->p->fqn, e)
                              : hs_fsdp_mem_alloc(fp->mem, HS_FSDP_MEM_GRAD, bytes,
                                                  "the unsharded gradient", fp->p->fqn, e);
        if (!g) return HS_ERR_OOM;
        fp->unsharded_grad = g;
        fp->unsharded_grad_bytes = bytes;
        if (first_store) {
            size_t used = bytes_of(fp->plan.unpacked_numel, fp->grad_dtype);
            hs_dev_zero(fp->mem->dev, (char *)g + used, bytes - used);
            fp->p->grad_unset = true;
        }
    }
    fp->p->grad = fp->unsharded_grad;
    return HS_OK;
}

void hs_fsdp_param_grad_release(hs_fsdp_param *fp) {
    HS_ASSERT(fp->rs_work == NULL);
    /* rs_input_bytes 0: borrowed (the model's buffer, or the reduce slot) */
    if (fp->rs_input && fp->rs_input_bytes)
        hs_fsdp_mem_free(fp->mem, HS_FSDP_MEM_GRAD, fp->rs_input, fp->rs_input_bytes);
    fp->rs_input = NULL;
    fp->rs_input_bytes = 0;
    hs_fsdp_mem_free(fp->mem, HS_FSDP_MEM_GRAD, fp->acc_grad, fp->acc_grad_bytes);
    fp->acc_grad = NULL;
    fp->acc_grad_bytes = 0;
    hs_fsdp_mem_free(fp->mem, HS_FSDP_MEM_GRAD, fp->unsharded_grad, fp->unsharded_grad_bytes);
    fp->unsharded_grad = NULL;
    fp->unsharded_grad_bytes = 0;
    fp->p->grad = NULL;
    fp->p->grad_unset = false;
}

bool hs_fsdp_param_prescale_cancels(const hs_fsdp_param *fp, float prescale) {
    float domain = fp->mi.domain_factor > 0.0f ? fp->mi.domain_factor : 1.0f;
    double dp = (double)prescale * domain,
           groups = (double)fp->mi.shard_size * fp->mi.replicate_size;
    return fabs(dp - groups) <= 1e-6 * groups; /* small integers, up to the factor's rounding */
}

float hs_fsdp_param_input_scale(const hs_fsdp_param *fp, float prescale) {
    return fp->dp_sum ? 1.0f : prescale * fp->grad_factor;
}

hs_reduce_op hs_fsdp_param_dp_op(const hs_fsdp_param *fp) {
    return fp->dp_sum ? HS_REDUCE_SUM : HS_REDUCE_AVG;
}

hs_reduce_op hs_fsdp_param_tp_op(const hs_fsdp_param *fp) {
    return fp->dp_sum && fp->p->tp_grad_partial ? HS_REDUCE_SUM : HS_REDUCE_AVG;
}

const hs_fsdp_levels *hs_fsdp_param_levels(const hs_fsdp_param *fp) {
    const hs_fsdp_levels *lv = fp->mi.levels;
    return fp->grad_fmt != HS_QUANT_NONE && lv && lv->node ? lv : NULL;
}

size_t hs_fsdp_param_grad_chunk_bytes(const hs_fsdp_param *fp) {
    return hs_quant_packed_bytes(fp->plan.padded_sharded_numel, fp->grad_block, fp->grad_fmt);
}

void hs_fsdp_param_pack_grad_chunk(hs_fsdp_param *fp, void *dst, int r) {
    int64_t P = fp->plan.padded_sharded_numel;
    hs_dev_quantize(fp->mem->dev, dst,
                    (const char *)fp->rs_input + bytes_of(r * P, fp->reduce_dtype),
                    fp->reduce_dtype, P, fp->grad_block, fp->grad_fmt);
}

/* The quantized reduce-scatter (grad_reduce): the reduce input's W chunks
 * packed one each into the first half of a buffer, exchanged by one byte
 * all-to-all into its second half: over the shard group, each chunk to its
 * owner; or (two levels) over the node, each node rank the N chunks it
 * sums for the N ranks of its cross group (hs_fsdp_levels.dest order). */
static hs_status reduce_packed(hs_fsdp_param *fp, hs_error *e) {
    int64_t P = fp->plan.padded_sharded_numel;
    int W = fp->mi.shard_size;
    const hs_fsdp_levels *lv = hs_fsdp_param_levels(fp);
    HS_ASSERT(fp->reduce_numel == P);
    size_t pb = hs_fsdp_param_grad_chunk_bytes(fp), half = pb * (size_t)W;
    char *buf = hs_fsdp_mem_alloc_uninit(fp->mem, HS_FSDP_MEM_GRAD, 2 * half,
                                         "the quantized reduce-scatter buffers", fp->p->fqn, e);
    if (!buf) return HS_ERR_OOM;
    fp->rs_packed = buf;
    fp->rs_packed_bytes = 2 * half;
    for (int k = 0; k < W; k++)
        hs_fsdp_param_pack_grad_chunk(fp, buf + pb * (size_t)k, lv ? lv->dest[k] : k);
    /* the exchange reads the chunks once the compute stream packed them */
    order(fp->grad_ready, fp->mem->dev->stream, fp->mem->rs_stream);
    fp->rs_work = hs_pg_all_to_all_async(lv ? lv->node : fp->mi.shard_pg, hs_fsdp_mem_rs(fp->mem),
                                         buf + half, buf, (int64_t)pb * (lv ? lv->N : 1),
                                         HS_DTYPE_U8);
    return HS_OK;
}

void hs_fsdp_param_sum_chunks(hs_fsdp_param *fp, float *acc, const char *in, size_t stride, int n) {
    hs_device *d = fp->mem->dev;
    int64_t P = fp->plan.padded_sharded_numel;
    hs_dev_dequantize(d, acc, HS_DTYPE_F32, in, P, 0, P, fp->grad_block, fp->grad_fmt);
    for (int k = 1; k < n; k++)
        hs_dev_dequantize_add(d, acc, in + stride * (size_t)k, P, 0, P, fp->grad_block,
                              fp->grad_fmt);
}

/* Two levels, after the node's exchange: each of this rank's N chunks
 * summed over the node, packed again and exchanged over the cross group,
 * which brings this rank the N nodes' sums of its own chunk (packed in
 * `out`, N x pb bytes). */
static hs_status cross_level(hs_fsdp_param *fp, const hs_fsdp_levels *lv, char *out, hs_error *e) {
    int64_t P = fp->plan.padded_sharded_numel;
    int N = lv->N, L = lv->L;
    size_t pb = hs_fsdp_param_grad_chunk_bytes(fp);
    const char *in = (const char *)fp->rs_packed + pb * (size_t)fp->mi.shard_size;
    size_t part_bytes = bytes_of((int64_t)N * P, HS_DTYPE_F32);
    float *part = hs_fsdp_mem_alloc_uninit(fp->mem, HS_FSDP_MEM_GRAD, part_bytes,
                                           "the node's partial sums", fp->p->fqn, e);
    if (!part) return HS_ERR_OOM;
    char *send = out + pb * (size_t)N;
    for (int c = 0; c < N; c++) { /* node rank l's block holds chunk c at c */
        hs_fsdp_param_sum_chunks(fp, part + (size_t)c * (size_t)P, in + pb * (size_t)c,
                                 pb * (size_t)N, L);
        hs_dev_quantize(fp->mem->dev, send + pb * (size_t)c, part + (size_t)c * (size_t)P,
                        HS_DTYPE_F32, P, fp->grad_block, fp->grad_fmt);
    }
    hs_fsdp_mem_free(fp->mem, HS_FSDP_MEM_GRAD, part, part_bytes);
    order(fp->grad_ready, fp->mem->dev->stream, fp->mem->rs_stream);
    hs_work *w = hs_pg_all_to_all_async(lv->cross, hs_fsdp_mem_rs(fp->mem), out, send, (int64_t)pb,
                                        HS_DTYPE_U8);
    hs_status st = hs_fsdp_exposed_wait(fp->exposed, HS_FSDP_WAIT_REDUCE_SCATTER, w, e);
    order(fp->rs_done, fp->mem->rs_stream, fp->mem->dev->stream);
    return st;
}

hs_status hs_fsdp_param_finish_packed(hs_fsdp_param *fp, const char *in, size_t stride, int n,
                                      hs_error *e) {
    hs_device *d = fp->mem->dev;
    int64_t P = fp->plan.padded_sharded_numel;
    bool f32 = fp->reduce_dtype == HS_DTYPE_F32;
    size_t tmp_bytes = f32 ? 0 : bytes_of(P, HS_DTYPE_F32);
    float *acc = f32 ? fp->reduce_slot
                     : hs_fsdp_mem_alloc_uninit(fp->mem, HS_FSDP_MEM_GRAD, tmp_bytes,
                                                "the quantized reduction's sum", fp->p->fqn, e);
    if (!acc) return HS_ERR_OOM;
    hs_fsdp_param_sum_chunks(fp, acc, in, stride, n);
    if (hs_fsdp_param_dp_op(fp) == HS_REDUCE_AVG)
        hs_dev_scale(d, acc, 1.0f / (float)fp->mi.shard_size, P);
    if (!f32) {
        hs_dev_convert(d, fp->reduce_slot, fp->reduce_dtype, acc, HS_DTYPE_F32, P);
        hs_fsdp_mem_free(fp->mem, HS_FSDP_MEM_GRAD, acc, tmp_bytes);
    }
    return HS_OK;
}

/* Every rank's chunk for this one (one level), or every node's sum of it
 * (two levels), read back and summed in fp32 in rank order into the reduce
 * slot (compute stream, after the exchange). */
static hs_status sum_packed(hs_fsdp_param *fp, hs_error *e) {
    int W = fp->mi.shard_size;
    const hs_fsdp_levels *lv = hs_fsdp_param_levels(fp);
    size_t pb = hs_fsdp_param_grad_chunk_bytes(fp);
    const char *in = (const char *)fp->rs_packed + pb * (size_t)W;
    if (!lv) return hs_fsdp_param_finish_packed(fp, in, pb, W, e);
    size_t cross_bytes = 2 * pb * (size_t)lv->N;
    char *cross = hs_fsdp_mem_alloc_uninit(fp->mem, HS_FSDP_MEM_GRAD, cross_bytes,
                                           "the cross-node exchange's buffers", fp->p->fqn, e);
    hs_status st = cross ? cross_level(fp, lv, cross, e) : HS_ERR_OOM;
    if (st == HS_OK) st = hs_fsdp_param_finish_packed(fp, cross, pb, lv->N, e);
    hs_fsdp_mem_free(fp->mem, HS_FSDP_MEM_GRAD, cross, cross_bytes);
    return st;
}

hs_status hs_fsdp_param_reduce_issue(hs_fsdp_param *fp, float prescale, hs_error *e) {
    HS_ASSERT(fp->unsharded_grad != NULL && fp->rs_work == NULL && fp->reduce_slot != NULL);
    const hs_fsdp_plan *pl = &fp->plan;
    /* With no reduce-scatter a cast gradient is written straight into its
     * reduce slot: no buffer of its own and no copy. */
    void *into = !fp->needs_all_gather && fp->reduce_numel == pl->padded_unsharded_numel
                     ? fp->reduce_slot
                     : NULL;
    hs_status st = hs_fsdp_mp_reduce_input(fp, hs_fsdp_param_input_scale(fp, prescale), into, e);
    if (st != HS_OK) return st;
    if (fp->needs_all_gather && fp->grad_fmt != HS_QUANT_NONE) return reduce_packed(fp, e);
    if (fp->needs_all_gather) {
        HS_ASSERT(fp->reduce_numel == pl->padded_sharded_numel);
        /* the reduction reads the gradient once backward has written it */
        order(fp->grad_ready, fp->mem->dev->stream, fp->mem->rs_stream);
        fp->rs_work = hs_pg_reduce_scatter_async(
            fp->mi.shard_pg, hs_fsdp_mem_rs(fp->mem), fp->reduce_slot, fp->rs_input,
            pl->padded_sharded_numel, fp->reduce_dtype, hs_fsdp_param_dp_op(fp));
        return HS_OK;
    }
    HS_ASSERT(fp->reduce_numel == pl->unpacked_numel);
    if (fp->rs_input != fp->reduce_slot)
        hs_dev_copy(fp->mem->dev, fp->reduce_slot, fp->rs_input,
                    bytes_of(pl->unpacked_numel, fp->reduce_dtype));
    hs_fsdp_param_grad_release(fp);
    return HS_OK;
}

hs_status hs_fsdp_param_reduce_wait(hs_fsdp_param *fp, hs_error *e) {
    if (!fp->rs_work) return HS_OK;
    hs_work *w = fp->rs_work;
    fp->rs_work = NULL;
    hs_status st = hs_fsdp_exposed_wait(fp->exposed, HS_FSDP_WAIT_REDUCE_SCATTER, w, e);
    /* its input goes back to the cache once the reduction has read it */
    order(fp->rs_done, fp->mem->rs_stream, fp->mem->dev->stream);
    if (fp->rs_packed) {
        if (st == HS_OK) st = sum_packed(fp, e);
        hs_fsdp_mem_free(fp->mem, HS_FSDP_MEM_GRAD, fp->rs_packed, fp->rs_packed_bytes);
        fp->rs_packed = NULL;
        fp->rs_packed_bytes = 0;
    }
    hs_fsdp_param_grad_release(fp);
    return st;
}

void hs_fsdp_param_zero_sharded_grad(hs_fsdp_param *fp) {
    fp->sharded_grad_unset = true;
    fp->canon_tree.top = 0; /* the micro-batch tree starts again */
    /* A frozen parameter's is never written by a reduction: zero it now. */
    if (fp->p->frozen) hs_fsdp_param_settle_sharded_grad(fp);
}

void hs_fsdp_param_settle_sharded_grad(hs_fsdp_param *fp) {
    if (!fp->sharded_grad_unset) return;
    hs_dev_zero(fp->mem->dev, fp->sharded_grad,
                bytes_of(fp->plan.actual_sharded_numel, HS_DTYPE_F32));
    fp->sharded_grad_unset = false;
}

hs_status hs_fsdp_param_reduce_apply(hs_fsdp_param *fp, hs_error *e) {
    /* The reduce slot is padded; only the actual rows reach the optimizer. */
    return hs_fsdp_offload_apply_grad(fp, e);
}
