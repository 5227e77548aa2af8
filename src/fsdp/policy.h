/* fsdp/policy.h — the per-parameter policies on top of the FSDP core
 * (spec 004 §2.2–§2.3, RFC 000 §5.4/§5.8/§5.10):
 *
 *   mixed_precision.c  reduce dtype, gradient casts before the collectives,
 *                      no-sync accumulation of 16-bit gradients in fp32
 *   main_params.c      fp32 main params: the model's shard is kept in
 *                      param_dtype and rewritten from the fp32 main param
 *                      the optimizer updates
 *   offload.c          masters in the host pool: H2D before the all-gather,
 *                      D2H after the reduction
 *
 * param.c calls these at its few decision points; nothing here issues a
 * collective. */
#ifndef HS_FSDP_POLICY_H
#define HS_FSDP_POLICY_H

#include <stdbool.h>

#include "fsdp/param.h"
#include "hypershard/config.h"

/* ------------------------------------------------------ mixed precision */

/* The gradient collective dtype: reduce_dtype, or the compute dtype when
 * it is null (FSDP2 MixedPrecisionPolicy semantics). */
hs_dtype hs_fsdp_mp_reduce_dtype(const hs_mix_precision *mp, hs_dtype compute);
/* x *= a for n elements of any float dtype (16-bit through fp32). */
void hs_fsdp_mp_scale(hs_device *d, void *x, hs_dtype dt, float a, int64_t n);
/* dst += src for n elements, src of any float dtype. With `fresh`, dst is
 * unwritten and becomes what it would be zeroed first: 0 + src. */
void hs_fsdp_mp_add_to_f32(hs_device *d, float *dst, const void *src, hs_dtype dt, int64_t n,
                           bool fresh);
/* No-sync micro-batch: a 16-bit gradient reduced in fp32 is moved into an
 * fp32 accumulator and the model's buffer zeroed, so accumulation over
 * micro-batches loses nothing to 16-bit rounding. Otherwise a no-op (the
 * model keeps accumulating into its own buffer). */
hs_status hs_fsdp_mp_grad_stash(hs_fsdp_param *fp, hs_error *e);
/* Sync micro-batch: set fp->rs_input to the padded unsharded gradient in
 * reduce_dtype (the model's buffer itself when the dtypes match, the fp32
 * accumulator, or a cast copy), scaled by `prescale`. A cast copy is
 * written into `into` when given (reduce_dtype, room for the padded
 * unsharded gradient; borrowed, not freed), else into a buffer of its own. */
hs_status hs_fsdp_mp_reduce_input(hs_fsdp_param *fp, float prescale, void *into, hs_error *e);

/* -------------------------------------------------------- main params */

/* When enabled and the compute dtype is 16-bit: allocate the model's own
 * shard in compute_dtype and fill it from the fp32 main param. */
hs_status hs_fsdp_main_init(hs_fsdp_param *fp, bool enabled, hs_error *e);
/* lp_shard := (compute_dtype) storage, padding included. No-op without. */
void hs_fsdp_main_write_back(hs_fsdp_param *fp);
void hs_fsdp_main_free(hs_fsdp_param *fp);

/* ------------------------------------------------------------ offload */

/* The local shard the compute copy is built from: the low-precision model
 * shard when there is one, else the fp32 master. */
const void *hs_fsdp_local_source(const hs_fsdp_param *fp, hs_dtype *dt);
/* Whether the local source can be read by compute as is (same dtype as the
 * compute dtype and in device memory): then no copy is made. */
bool hs_fsdp_local_source_is_compute(const hs_fsdp_param *fp);
/* dst (device memory, compute_dtype) := the first n elements of the local
 * source: H2D under offload, then a cast when the dtypes differ. */
hs_status hs_fsdp_offload_to_compute(hs_fsdp_param *fp, void *dst, int64_t n, hs_error *e);
/* sharded_grad += the actual rows of the reduce slot (D2H under offload);
 * stored over it when unset. */
hs_status hs_fsdp_offload_apply_grad(hs_fsdp_param *fp, hs_error *e);

#endif
