/* model/layers.h — the dense decoder's layers as forward / backward pairs.
 *
 * llm.c conventions: arguments go outputs, inputs, weights, then dimensions;
 * every backward ACCUMULATES (+=) into its gradient outputs, activation
 * gradients and weight gradients alike, so callers zero what they own.
 *
 * Dimension letters: B batch, T time, C model dim, NH query heads, KVH
 * key/value heads, HD head dim, F MLP hidden dim, V vocabulary, N = B*T rows.
 *
 * Precision: activations and weights are stored in a "compute dtype" (`dt`)
 * and read through hs_ld / written through hs_st; all arithmetic is fp32;
 * each stored output is rounded once. Activation gradients are always fp32.
 * Weight gradients are in their own dtype (`gdt`) and accumulate as
 * read-convert-add-round.
 *
 * The per-layer kernels (embedding, RMSNorm, RoPE, attention, SwiGLU,
 * cross-entropy) and the element helpers (hs_ld, hs_st, hs_expf, ...) live
 * in the device layer (hypershard/device.h, src/device/cpu_*.c), which
 * follows the same conventions; the linear layers stay here.
 */
#ifndef HS_MODEL_LAYERS_H
#define HS_MODEL_LAYERS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "hypershard/device.h"

/* ----------------------------------------------------------------- linear */

/* On device d's table (gemm, convert). out = x @ w^T (+ out when
 * accumulate): w is nn.Linear [OC, IC]. */
void hs_linear_forward(hs_device *d, void *out /* N,OC */, const void *x /* N,IC */,
                       const void *w /* OC,IC */, hs_dtype dt, int64_t N, int IC, int OC,
                       int accumulate);
/* The same with out in its own dtype odt (a residual wider than dt). */
void hs_linear_forward_to(hs_device *d, void *out /* N,OC */, hs_dtype odt,
                          const void *x /* N,IC */, const void *w /* OC,IC */, hs_dtype dt,
                          int64_t N, int IC, int OC, int accumulate);
/* dx += dout @ w; dw += dout^T @ x (dw in gdt, skipped when NULL). */
void hs_linear_backward(hs_device *d, float *dx /* N,IC */, void *dw /* OC,IC */, hs_dtype gdt,
                        const float *dout /* N,OC */, const void *x /* N,IC */,
                        const void *w /* OC,IC */, hs_dtype dt, int64_t N, int IC, int OC);
/* The same, with two savings for the model's own layers: dout rounded to
 * dt once into dout16 (N*OC elements of dt, the caller's scratch) for both
 * GEMMs, where the mixed-dtype GEMM would round it for each (NULL: as
 * hs_linear_backward); and dx or dw overwritten, not accumulated, when
 * overwrite_dx / overwrite_dw (their only or first contribution: no zero
 * fill first). */
void hs_linear_backward_ex(hs_device *d, float *dx /* N,IC */, bool overwrite_dx,
                           void *dw /* OC,IC */, bool overwrite_dw, hs_dtype gdt,
                           const float *dout /* N,OC */, void *dout16, const void *x /* N,IC */,
                           const void *w /* OC,IC */, hs_dtype dt, int64_t N, int IC, int OC);
/* The output gradient as hs_linear_backward_ex's GEMMs read it: rounded
 * to dt into dout16 when that is given and dt is 16-bit, else dout as it
 * is; *ydt its dtype. */
const void *hs_linear_dout(hs_device *d, const float *dout, void *dout16, hs_dtype dt, int64_t n,
                           hs_dtype *ydt);
/* hs_linear_backward_ex's two GEMMs from that gradient (dy in ydt); dx or
 * dw NULL skips its GEMM (the split backward runs them apart). */
void hs_linear_backward_dy(hs_device *d, float *dx /* N,IC */, bool overwrite_dx,
                           void *dw /* OC,IC */, bool overwrite_dw, hs_dtype gdt,
                           const void *dy /* N,OC */, hs_dtype ydt, const void *x /* N,IC */,
                           const void *w /* OC,IC */, hs_dtype dt, int64_t N, int IC, int OC);

#endif
