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
 */
#ifndef HS_MODEL_LAYERS_H
#define HS_MODEL_LAYERS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "hypershard/device.h"

/* -------------------------------------------------------------- attention */

/* Causal grouped-query attention, scale 1/sqrt(HD); query head h reads
 * key/value head h / (NH/KVH). Tiled over query and key blocks with an
 * online softmax; saves the fp32 log-sum-exp of every score row so that
 * backward recomputes probabilities instead of storing [T, T].
 * `scratch` holds hs_attention_scratch_floats(T, HD, threads) floats: one
 * tile and one query block per thread, bounded whatever T. */
int64_t hs_attention_scratch_floats(int T, int HD, int threads);
/* threads: the (sequence, head) pairs of forward and the (sequence, key
 * head) pairs of backward split over that many threads (OpenMP), each with
 * its own slice of scratch and its GEMMs on one thread, so the result is
 * the one-thread result bit for bit; scratch is sized for them. */
void hs_attention_forward(void *out /* B,T,NH*HD */, float *lse /* B,NH,T */,
                          const void *q /* B,T,NH*HD */, const void *k /* B,T,KVH*HD */,
                          const void *v /* B,T,KVH*HD */, hs_dtype dt, float *scratch, int threads,
                          int B, int T, int NH, int KVH, int HD);
/* Each query row's D = sum over its head dim of dO * O (O the forward's
 * output in dt), which the backward of every key tile needs. */
void hs_attention_delta(float *delta /* B,NH,T */, const float *dout /* B,T,NH*HD */,
                        const void *out /* B,T,NH*HD */, hs_dtype dt, int B, int T, int NH,
                        int HD);
/* delta: from hs_attention_delta. dout16: dout rounded to a 16-bit dt
 * whose GEMM is native, for 16-bit products throughout (P and dS rounded
 * too); NULL: fp32 dout, P and dS go to the mixed-dtype GEMM. */
void hs_attention_backward(float *dq /* B,T,NH*HD */, float *dk /* B,T,KVH*HD */,
                           float *dv /* B,T,KVH*HD */, const float *dout /* B,T,NH*HD */,
                           const void *dout16, const void *q, const void *k, const void *v,
                           const float *lse, const float *delta, hs_dtype dt, float *scratch,
                           int threads, int B, int T, int NH, int KVH, int HD);

/* The same on a row range, for context parallelism: query rows
 * [q0, q0+nq) of a [B, Tq, NH*HD] q, whose row q0 is at global position gq,
 * against a [B, Tk, KVH*HD] k/v whose row 0 is at global position gk;
 * query at position p sees keys at positions <= p. lse is [B, NH, Tq]; a
 * row that sees no key gets a zero output and lse -inf. The output is in
 * odt (fp32 for the ring's online-softmax merge). Backward accumulates dq
 * (local rows) and dk/dv ([B, Tk]); `delta` ([B, NH, Tq]) is each row's
 * sum of dO * O over all keys, so the keys may come in blocks. */
hs_att_rows hs_att_rows_all(int T);
void hs_attention_forward_rows(void *out, hs_dtype odt, float *lse, const void *q, const void *k,
                               const void *v, hs_dtype dt, float *scratch, int B, int NH, int KVH,
                               int HD, const hs_att_rows *r);
void hs_attention_backward_rows(float *dq, float *dk, float *dv, const float *dout,
                                const void *dout16, const void *q, const void *k, const void *v,
                                const float *lse, const float *delta, hs_dtype dt, float *scratch,
                                int B, int NH, int KVH, int HD, const hs_att_rows *r);

/* ----------------------------------------------------------------- linear */

/* out = x @ w^T (+ out when accumulate): w is nn.Linear [OC, IC]. */
void hs_linear_forward(void *out /* N,OC */, const void *x /* N,IC */, const void *w /* OC,IC */,
                       hs_dtype dt, int64_t N, int IC, int OC, int accumulate);
/* The same with out in its own dtype odt (a residual wider than dt). */
void hs_linear_forward_to(void *out /* N,OC */, hs_dtype odt, const void *x /* N,IC */,
                          const void *w /* OC,IC */, hs_dtype dt, int64_t N, int IC, int OC,
                          int accumulate);
/* dx += dout @ w; dw += dout^T @ x (dw in gdt, skipped when NULL). */
void hs_linear_backward(float *dx /* N,IC */, void *dw /* OC,IC */, hs_dtype gdt,
                        const float *dout /* N,OC */, const void *x /* N,IC */,
                        const void *w /* OC,IC */, hs_dtype dt, int64_t N, int IC, int OC);
/* The same, with two savings for the model's own layers: dout rounded to
 * dt once into dout16 (N*OC elements of dt, the caller's scratch) for both
 * GEMMs, where the mixed-dtype GEMM would round it for each (NULL: as
 * hs_linear_backward); and dx or dw overwritten, not accumulated, when
 * overwrite_dx / overwrite_dw (their only or first contribution: no zero
 * fill first). */
void hs_linear_backward_ex(float *dx /* N,IC */, bool overwrite_dx, void *dw /* OC,IC */,
                           bool overwrite_dw, hs_dtype gdt, const float *dout /* N,OC */,
                           void *dout16, const void *x /* N,IC */, const void *w /* OC,IC */,
                           hs_dtype dt, int64_t N, int IC, int OC);

#endif
