/* fp32 main params (spec 004 §5.8, optimizer.fp32_main_params): the
 * model's own sharded parameter is kept in the 16-bit param_dtype, and the
 * optimizer updates an fp32 main copy of it (`storage`) whose reduced
 * gradient is the fp32 main_grad (`sharded_grad`). After every step the
 * main param is rounded back into the model's shard, which is what the
 * all-gather then sends as is: no per-unshard cast. */
#include "fsdp/policy.h"

hs_status hs_fsdp_main_init(hs_fsdp_param *fp, bool enabled, hs_error *e) {
    if (!enabled || fp->compute_dtype == HS_DTYPE_F32) return HS_OK;
    size_t bytes = (size_t)fp->storage_numel * hs_dtype_size(fp->compute_dtype);
    fp->lp_shard = hs_fsdp_mem_master_alloc(fp->mem, HS_FSDP_MEM_PARAM, bytes,
                                            "the 16-bit model shard", fp->p->fqn, e);
    if (!fp->lp_shard) return HS_ERR_OOM;
    fp->lp_shard_bytes = bytes;
    hs_fsdp_main_write_back(fp);
    return HS_OK;
}

void hs_fsdp_main_write_back(hs_fsdp_param *fp) {
    /* The padded tail of storage is zero, so the model shard's is too and
     * every rank sends the same element count. */
    if (fp->lp_shard)
        hs_dev_convert(fp->mem->dev, fp->lp_shard, fp->compute_dtype, fp->storage, HS_DTYPE_F32,
                       fp->storage_numel);
}

void hs_fsdp_main_free(hs_fsdp_param *fp) {
    hs_fsdp_mem_master_free(fp->mem, HS_FSDP_MEM_PARAM, fp->lp_shard, fp->lp_shard_bytes);
    fp->lp_shard = NULL;
    fp->lp_shard_bytes = 0;
}
