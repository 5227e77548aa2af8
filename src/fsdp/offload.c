/* CPU offload (spec 004 §2.3 enable_offload, §5.9): the fp32 master (or
 * the model's low-precision shard) and the fp32 sharded gradient live in
 * the host pool between uses. The compute copy is made host->device right
 * before the all-gather (or as the unsharded view when there is none) and
 * the reduced shard comes back device->host before it is added into the
 * sharded gradient, so the optimizer step runs on host memory.
 *
 * On the cpu device both pools are RAM and a copy is a memcpy, but each
 * one is a real copy, traced on the copy lane and counted as "h2d" / "d2h"
 * in the trace counters; a GPU backend makes the same calls physical. */
#include "fsdp/policy.h"

static hs_status copy_counted(hs_fsdp_param *fp, void *dst, const void *src, size_t bytes,
                              hs_copy_kind kind, hs_error *e) {
    hs_device *dev = fp->mem->dev;
    hs_device_copy(dev, dst, src, bytes, kind);
    return hs_trace_count(dev->trace, kind == HS_COPY_H2D ? "h2d" : "d2h", NULL, (int64_t)bytes, e);
}

const void *hs_fsdp_local_source(const hs_fsdp_param *fp, hs_dtype *dt) {
    if (fp->lp_shard) {
        *dt = fp->compute_dtype;
        return fp->lp_shard;
    }
    *dt = HS_DTYPE_F32;
    return fp->storage;
}

bool hs_fsdp_local_source_is_compute(const hs_fsdp_param *fp) {
    hs_dtype dt;
    (void)hs_fsdp_local_source(fp, &dt);
    return !fp->offload && dt == fp->compute_dtype;
}

hs_status hs_fsdp_offload_to_compute(hs_fsdp_param *fp, void *dst, int64_t n, hs_error *e) {
    hs_dtype sdt;
    const void *src = hs_fsdp_local_source(fp, &sdt);
    size_t sbytes = (size_t)n * hs_dtype_size(sdt);
    if (!fp->offload) {
        hs_dev_convert(fp->mem->dev, dst, fp->compute_dtype, src, sdt, n);
        return HS_OK;
    }
    if (sdt == fp->compute_dtype) return copy_counted(fp, dst, src, sbytes, HS_COPY_H2D, e);
    /* Copy as stored, cast on the device: the cast is where the compute is. */
    void *stage = hs_fsdp_mem_alloc(fp->mem, HS_FSDP_MEM_PARAM, sbytes, "the H2D staging copy",
                                    fp->p->fqn, e);
    if (!stage) return HS_ERR_OOM;
    hs_status st = copy_counted(fp, stage, src, sbytes, HS_COPY_H2D, e);
    hs_dev_convert(fp->mem->dev, dst, fp->compute_dtype, stage, sdt, n);
    hs_fsdp_mem_free(fp->mem, HS_FSDP_MEM_PARAM, stage, sbytes);
    return st;
}

hs_status hs_fsdp_offload_apply_grad(hs_fsdp_param *fp, hs_error *e) {
    int64_t n = fp->plan.actual_sharded_numel;
    /* The first gradient since zero_grads is stored, not added to zeros. */
    bool fresh = fp->sharded_grad_unset;
    if (!fp->offload) {
        fp->sharded_grad_unset = false;
        if (fp->canon_slots) hs_fsdp_canon_push(fp, fp->reduce_slot, fp->reduce_dtype);
        else
            hs_fsdp_mp_add_to_f32(fp->mem->dev, fp->sharded_grad, fp->reduce_slot, fp->reduce_dtype,
                                  n, fresh);
        return HS_OK;
    }
    size_t bytes = (size_t)n * hs_dtype_size(fp->reduce_dtype);
    void *host = hs_fsdp_mem_host_alloc(fp->mem, HS_FSDP_MEM_GRAD, bytes,
                                        "the D2H copy of the reduced gradient", fp->p->fqn, e);
    if (!host) return HS_ERR_OOM;
    fp->sharded_grad_unset = false;
    hs_status st = copy_counted(fp, host, fp->reduce_slot, bytes, HS_COPY_D2H, e);
    if (fp->canon_slots) hs_fsdp_canon_push(fp, host, fp->reduce_dtype);
    else hs_fsdp_mp_add_to_f32(fp->mem->dev, fp->sharded_grad, host, fp->reduce_dtype, n, fresh);
    hs_fsdp_mem_host_free(fp->mem, HS_FSDP_MEM_GRAD, host, bytes);
    return st;
}
