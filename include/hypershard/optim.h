/* hypershard/optim.h — AdamW, Muon, global grad-norm clipping, LR schedules.
 *
 * Contract of this layer:
 * - The optimizer knows nothing of models or sharding. It updates a list of
 *   hs_optim_param: a parameter buffer `data` (in `dtype`) and its gradient
 *   `grad` (fp32), both of `numel` elements — a full tensor in a
 *   single-process run, the local shard under FSDP.
 * - AdamW follows torch.optim.AdamW (decoupled weight decay applied as
 *   p *= 1 - lr*wd, bias-corrected moments, eps added after the sqrt of the
 *   corrected second moment). `decay` false (norms, biases) skips weight
 *   decay. Moments are fp32.
 * - Muon (see docs/optimizers.md for the exact rule and its source) applies
 *   to params with `muon` true (2-D hidden matrices, rows x cols); all others
 *   use AdamW with the same lr. Newton-Schulz needs the whole matrix: a
 *   param holding only some rows of it (an FSDP shard) sets `gather`; its
 *   momentum stays local, the update direction of its rows is all-gathered
 *   into the whole matrix, orthogonalised there and only its own rows are
 *   applied (hs_optim_gather below).
 * - When `dtype` is 16-bit, the update is computed in fp32 and rounded once
 *   into `data` (round to nearest even). With fp32 main params the caller
 *   passes the fp32 main copy as `data` and its 16-bit model copy as
 *   `copy`, which each step rewrites from the updated values (AdamW in the
 *   same pass over memory): the bits of a convert of `data` afterwards.
 * - Optimizer state is plain arrays reachable through hs_optim_state_* so
 *   that the checkpoint layer can save and load it.
 */
#ifndef HYPERSHARD_OPTIM_H
#define HYPERSHARD_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "hypershard/base.h"
#include "hypershard/config.h"
#include "hypershard/device.h"
#include "hypershard/tensor.h"

/* How a Muon param that holds the box rows [row_offset, row_offset + rows)
 * x columns [col_offset, col_offset + cols) of a full_rows x full_cols
 * matrix sees the whole matrix (full_cols 0: the param's own cols, a row
 * shard). all_gather_rows gets this param's rows x cols `local` values and
 * fills `full` (buffer_rows x full_cols floats, buffer_rows >= full_rows
 * leaving room for the caller's padding and staging) so that its first
 * full_rows rows are the whole matrix, every holder's box in place. It is a collective over the holders: each calls it once
 * per step for the param, zero-row holders included, in the same param
 * order (hs_optim_step walks the list in order on every rank). A failed
 * gather ends the process (hs_panic naming the param): a half-applied step
 * cannot be resumed. all_gather_rows NULL: the param is whole. */
typedef struct hs_optim_gather {
    void *ctx;
    int64_t full_rows, row_offset, buffer_rows;
    int64_t full_cols, col_offset; /* tensor parallelism may split columns */
    hs_status (*all_gather_rows)(void *ctx, const float *local, float *full, hs_error *e);
} hs_optim_gather;

typedef struct hs_optim_param {
    const char *fqn;
    void *data;
    hs_dtype dtype;
    const float *grad;
    int64_t numel;
    int64_t first;          /* flat index of data[0] in the whole (TP-local)
                             * tensor: a dim-0 shard's start, 0 unsharded */
    int64_t rows, cols;     /* Muon matrix shape; numel is a multiple of rows*cols:
                         * numel / (rows*cols) matrices, each orthogonalised
                         * alone (experts [E,out,in]: rows=out, cols=in) */
    bool decay;             /* weight decay applies */
    bool muon;              /* Muon-eligible (hidden 2-D matrix) */
    bool frozen;            /* train.freeze: no state, no update */
    hs_optim_gather gather; /* Muon on a row shard: numel == rows*cols, one
                             * matrix; the scale uses full_rows */
    void *copy;             /* NULL, or numel values in copy_dtype that every
                             * step rewrites from the updated data (FSDP's
                             * 16-bit model shard of an fp32 main param) */
    hs_dtype copy_dtype;
} hs_optim_param;

typedef struct hs_optim hs_optim;

/* The optimizer computes on dev's table (NULL: a cpu device of its own)
 * and takes its states from pool (NULL: a pool of its own): dev's device
 * pool means dev's device memory (hs_device_alloc, the caching allocator),
 * its host pool dev's host memory (offload: the trainer passes one of the
 * two); either way the pool counts the bytes. dev outlives the optimizer. */
hs_status hs_optim_create(const hs_optim_config *cfg, const hs_optim_param *params, int n,
                          hs_device *dev, hs_pool *pool, hs_optim **out, hs_error *e);
void hs_optim_free(hs_optim *o);
/* One step with learning rate lr (step counter increments first). Fails
 * only where a sharded Muon matrix's gather fails (its error in e; e may
 * be NULL where no collective is involved). */
hs_status hs_optim_step(hs_optim *o, double lr, hs_error *e);
int64_t hs_optim_step_count(const hs_optim *o);
void hs_optim_set_step_count(hs_optim *o, int64_t step);

/* State tensors for checkpointing: for param i, named states
 * ("exp_avg", "exp_avg_sq" for AdamW; "momentum_buffer" for Muon), each
 * fp32 of the param's numel. Returns the count; names/arrays are owned. */
int hs_optim_state_count(const hs_optim *o, int param_index);
const char *hs_optim_state_name(const hs_optim *o, int param_index, int k);
float *hs_optim_state_data(hs_optim *o, int param_index, int k);

/* Sum of squares over the given gradients (fp64 accumulation); the norm is
 * its sqrt. Under FSDP the caller all-reduces the sum of squares; this is the
 * local part. */
double hs_grad_sumsq(hs_device *dev, const hs_optim_param *params, int n);
/* Scale all grads by min(1, max_norm / (norm + 1e-6)) (torch semantics);
 * returns the clip coefficient applied. max_norm <= 0: no-op, returns 1.
 * Writes through `grad` (the caller's buffers must be mutable). */
double hs_clip_grads(hs_device *dev, hs_optim_param *params, int n, double norm, double max_norm);

/* LR at 1-based optimizer step `step` of `total`: linear warmup over
 * warmup_steps (lr * step / warmup), then constant / linear / cosine decay
 * from lr to lr * min_lr_ratio at step `total`. */
double hs_lr_at(const hs_optim_config *cfg, int step, int total);

#endif
