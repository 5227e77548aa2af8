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

static void copy_counted(hs_fsdp_param *fp, void *dst, const void *src, size_t bytes,
                         hs_copy_kind kind) {
    hs_device *dev = fp->mem->dev;
    hs_device_copy(dev, dst, src, bytes, kind);
    hs_trace_count(dev->trace, kind == HS_COPY_H2D ? "h2d" : "d2h", NULL, (int64_t)bytes);
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

void hs_fsdp_offload_to_compute(hs_fsdp_param *fp, void *dst, int64_t n) {
    hs_dtype sdt;
    const void *src = hs_fsdp_local_source(fp, &sdt);
    size_t sbytes = (size_t)n * hs_dtype_size(sdt);
    if (!fp->offload) {
        hs_dev_convert(fp->mem->dev, dst, fp->compute_dtype, src, sdt, n);
        return;
    }
    if (sdt == fp->compute_dtype) {
        copy_counted(fp, dst, src, sbytes, HS_COPY_H2D);
        return;
    }
    /* Copy as stored, cast on the device: the cast is where the compute is. */
    void *stage = hs_fsdp_mem_alloc(fp->mem, HS_FSDP_MEM_PARAM, sbytes);
    copy_counted(fp, stage, src, sbytes, HS_COPY_H2D);
    hs_dev_convert(fp->mem->dev, dst, fp->compute_dtype, stage, sdt, n);
    hs_fsdp_mem_free(fp->mem, HS_FSDP_MEM_PARAM, stage, sbytes);
}

void hs_fsdp_offload_apply_grad(hs_fsdp_param *fp) {
    int64_t n = fp->plan.actual_sharded_numel;
    /* The first gradient since zero_grads is stored, not added to zeros. */
    bool fresh = fp->sharded_grad_unset;
    fp->sharded_grad_unset = false;
    if (!fp->offload) {
        hs_fsdp_mp_add_to_f32(fp->mem->dev, fp->sharded_grad, fp->reduce_slot, fp->reduce_dtype, n,
                              fresh);
        return;
    }
    size_t bytes = (size_t)n * hs_dtype_size(fp->reduce_dtype);
    void *host = hs_fsdp_mem_host_alloc(fp->mem, HS_FSDP_MEM_GRAD, bytes);
    copy_counted(fp, host, fp->reduce_slot, bytes, HS_COPY_D2H);
    hs_fsdp_mp_add_to_f32(fp->mem->dev, fp->sharded_grad, host, fp->reduce_dtype, n, fresh);
    hs_fsdp_mem_host_free(fp->mem, HS_FSDP_MEM_GRAD, host, bytes);
}
