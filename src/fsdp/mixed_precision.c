/* Gradient dtypes around the collectives (spec 004 §2.2 reduce_dtype,
 * RFC 000 §5.10): cast before reduce-scatter / all-reduce, fp32
 * accumulation of 16-bit gradients across no-sync micro-batches. */
#include <string.h>

#include "fsdp/policy.h"

hs_dtype hs_fsdp_mp_reduce_dtype(const hs_mix_precision *mp, hs_dtype compute) {
    return mp->reduce_dtype == HS_MP_NULL ? compute : (hs_dtype)mp->reduce_dtype;
}

void hs_fsdp_mp_scale(hs_device *d, void *x, hs_dtype dt, float a, int64_t n) {
    if (a == 1.0f) return;
    d->k->scale_cast(d->stream, x, dt, a, n);
}

/* dst += src, or dst = 0 + src when fresh (not a copy: -0 becomes +0), src
 * widened exactly to fp32 first: the table's add, add_to_zero and add_cast
 * (fp32 sum of the two values read in their dtypes). */
void hs_fsdp_mp_add_to_f32(hs_device *d, float *dst, const void *src, hs_dtype dt, int64_t n,
                           bool fresh) {
    if (dt == HS_DTYPE_F32) {
        if (fresh) hs_dev_add_to_zero(d, dst, src, n);
        else hs_dev_add(d, dst, src, n);
    } else if (fresh) { /* widened into dst, then 0 + dst in place */
        hs_dev_convert(d, dst, HS_DTYPE_F32, src, dt, n);
        hs_dev_add_to_zero(d, dst, dst, n);
    } else {
        hs_dev_add_cast(d, dst, HS_DTYPE_F32, dst, HS_DTYPE_F32, src, dt, n);
    }
}

static bool stashes(const hs_fsdp_param *fp) {
    return fp->grad_dtype != HS_DTYPE_F32 && fp->reduce_dtype == HS_DTYPE_F32;
}

hs_status hs_fsdp_mp_grad_stash(hs_fsdp_param *fp, hs_error *e) {
    if (!stashes(fp) || !fp->unsharded_grad) return HS_OK;
    hs_param_grad_settle(fp->mem->dev, fp->p);
    int64_t n = fp->plan.padded_unsharded_numel;
    bool fresh = !fp->acc_grad;
    if (fresh) { /* written whole by the first add: no zero fill */
        size_t bytes = (size_t)n * sizeof(float);
        fp->acc_grad = hs_fsdp_mem_alloc_uninit(fp->mem, HS_FSDP_MEM_GRAD, bytes,
                                                "the fp32 gradient accumulator", fp->p->fqn, e);
        if (!fp->acc_grad) return HS_ERR_OOM;
        fp->acc_grad_bytes = bytes;
    }
    hs_fsdp_mp_add_to_f32(fp->mem->dev, fp->acc_grad, fp->unsharded_grad, fp->grad_dtype, n, fresh);
    if (fp->p->grad_first_store) fp->p->grad_unset = true; /* the tail stays zero */
    else hs_dev_zero(fp->mem->dev, fp->unsharded_grad, fp->unsharded_grad_bytes);
    return HS_OK;
}

hs_status hs_fsdp_mp_reduce_input(hs_fsdp_param *fp, float prescale, void *into, hs_error *e) {
    hs_device *d = fp->mem->dev;
    hs_param_grad_settle(d, fp->p);
    int64_t n = fp->plan.padded_unsharded_numel;
    if (fp->acc_grad) {
        /* The accumulator already is fp32 = reduce dtype: add the last
         * micro-batch and hand the accumulator to the collective. */
        hs_fsdp_mp_add_to_f32(fp->mem->dev, fp->acc_grad, fp->unsharded_grad, fp->grad_dtype, n,
                              false);
        fp->rs_input = fp->acc_grad;
        fp->rs_input_bytes = fp->acc_grad_bytes;
        fp->acc_grad = NULL;
        fp->acc_grad_bytes = 0;
    } else if (fp->grad_dtype == fp->reduce_dtype) {
        fp->rs_input = fp->unsharded_grad;
        fp->rs_input_bytes = 0; /* borrowed */
    } else {
        size_t bytes = (size_t)n * hs_dtype_size(fp->reduce_dtype);
        /* every element is written by the conversion below: no zero fill */
        fp->rs_input = into ? into
                            : hs_fsdp_mem_alloc_uninit(fp->mem, HS_FSDP_MEM_GRAD, bytes,
                                                       "the reduce-dtype gradient", fp->p->fqn, e);
        if (!fp->rs_input) return HS_ERR_OOM;
        fp->rs_input_bytes = into ? 0 : bytes; /* 0: borrowed */
        /* Scale in the wider dtype so that narrowing rounds once. */
        if (fp->grad_dtype == HS_DTYPE_F32) {
            hs_dev_scale(d, fp->unsharded_grad, prescale, fp->plan.unpacked_numel);
            hs_dev_convert(d, fp->rs_input, fp->reduce_dtype, fp->unsharded_grad, fp->grad_dtype,
                           n);
            prescale = 1.0f;
        } else if (fp->reduce_dtype == HS_DTYPE_F32) {
            /* Widened and scaled in one pass; the zero tail stays zero. */
            hs_dev_convert_scaled(d, fp->rs_input, fp->unsharded_grad, fp->grad_dtype, prescale, n);
            prescale = 1.0f;
        } else {
            hs_dev_convert(d, fp->rs_input, fp->reduce_dtype, fp->unsharded_grad, fp->grad_dtype,
                           n);
        }
    }
    /* The padded tail is zero and stays zero under scaling. */
    hs_fsdp_mp_scale(d, fp->rs_input, fp->reduce_dtype, prescale, fp->plan.unpacked_numel);
    return HS_OK;
}
