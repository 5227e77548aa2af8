/* Private to src/device/: every kernel of hs_device_kernels as an X-macro
 * list, for the wrappers that stand in front of a backend's table (guard.c,
 * profile.c). */
#ifndef HS_DEVICE_KERNEL_LIST_H
#define HS_DEVICE_KERNEL_LIST_H

#include "hypershard/device.h"

/* Every kernel of the table, as (name, parameters, arguments, the
 * arguments that are device memory). The others are host values: shapes,
 * hyperparameters and workspaces described by host structs, and the scalar
 * results of reductions (xent's loss and valid count, xent_shard_loss's
 * loss, sumsq's sum), which a backend hands back in host memory.
 * sumsq_many's and adamw_many's device pointers travel in a host array:
 * a first and a last one are named. */
#define HS_DEVICE_KERNEL_LIST(X)                                                                   \
    X(gemm, (hs_stream * s, void *C, const void *A, const void *B, const hs_gemm_shape *g),        \
      (s, C, A, B, g), (C, A, B))                                                                  \
    X(convert,                                                                                     \
      (hs_stream * s, void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt, int64_t n),    \
      (s, dst, dst_dt, src, src_dt, n), (dst, src))                                                \
    X(convert_scaled,                                                                              \
      (hs_stream * s, float *dst, const void *src, hs_dtype src_dt, float a, int64_t n),           \
      (s, dst, src, src_dt, a, n), (dst, src))                                                     \
    X(fill, (hs_stream * s, float *x, float v, int64_t n), (s, x, v, n), (x))                      \
    X(rng_normal,                                                                                  \
      (hs_stream * s, float *x, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,         \
       float mean, float std),                                                                     \
      (s, x, n, seed, stream, offset, mean, std), (x))                                             \
    X(axpy, (hs_stream * s, float *y, const float *x, float a, int64_t n), (s, y, x, a, n),        \
      (y, x))                                                                                      \
    X(scale, (hs_stream * s, float *x, float a, int64_t n), (s, x, a, n), (x))                     \
    X(add, (hs_stream * s, float *y, const float *x, int64_t n), (s, y, x, n), (y, x))             \
    X(add_to_zero, (hs_stream * s, float *y, const float *x, int64_t n), (s, y, x, n), (y, x))     \
    X(sumsq, (hs_stream * s, double *out, const float *x, int64_t n), (s, out, x, n), (x))         \
    X(sumsq_many,                                                                                  \
      (hs_stream * s, double *out, const float *const *x, const int64_t *n, int count),            \
      (s, out, x, n, count), (count > 0 ? x[0] : NULL, count > 1 ? x[count - 1] : NULL))           \
    X(round, (hs_stream * s, float *x, hs_dtype dt, int64_t n), (s, x, dt, n), (x))                \
    X(add_cast,                                                                                    \
      (hs_stream * s, void *out, hs_dtype odt, const void *a, hs_dtype adt, const void *b,         \
       hs_dtype bdt, int64_t n),                                                                   \
      (s, out, odt, a, adt, b, bdt, n), (out, a, b))                                               \
    X(scale_cast, (hs_stream * s, void *x, hs_dtype dt, float a, int64_t n), (s, x, dt, a, n),     \
      (x))                                                                                         \
    X(rmsnorm_fwd,                                                                                 \
      (hs_stream * s, void *out, float *rstd, const void *x, hs_dtype xdt, const void *w,          \
       hs_dtype dt, int64_t N, int C, float eps),                                                  \
      (s, out, rstd, x, xdt, w, dt, N, C, eps), (out, rstd, x, w))                                 \
    X(rmsnorm_bwd,                                                                                 \
      (hs_stream * s, float *dx, void *dw, hs_dtype gdt, const float *dout, const void *x,         \
       hs_dtype xdt, const void *w, const float *rstd, hs_dtype dt, int64_t N, int C, double *ws), \
      (s, dx, dw, gdt, dout, x, xdt, w, rstd, dt, N, C, ws), (dx, dw, dout, x, w, rstd, ws))       \
    X(rope_tables,                                                                                 \
      (hs_stream * s, float *cos_t, float *sin_t, int T, int HD, const float *inv_freq,            \
       float scale),                                                                               \
      (s, cos_t, sin_t, T, HD, inv_freq, scale), (cos_t, sin_t))                                   \
    X(rope_fwd,                                                                                    \
      (hs_stream * s, void *x, hs_dtype dt, const float *cos_t, const float *sin_t, int B, int T,  \
       int H, int HD),                                                                             \
      (s, x, dt, cos_t, sin_t, B, T, H, HD), (x, cos_t, sin_t))                                    \
    X(rope_bwd,                                                                                    \
      (hs_stream * s, float *dx, const float *cos_t, const float *sin_t, int B, int T, int H,      \
       int HD),                                                                                    \
      (s, dx, cos_t, sin_t, B, T, H, HD), (dx, cos_t, sin_t))                                      \
    X(swiglu_fwd,                                                                                  \
      (hs_stream * s, void *out, const void *gate, const void *up, hs_dtype dt, int64_t n),        \
      (s, out, gate, up, dt, n), (out, gate, up))                                                  \
    X(swiglu_bwd,                                                                                  \
      (hs_stream * s, float *dgate, float *dup, bool overwrite, const float *dout,                 \
       const void *gate, const void *up, hs_dtype dt, int64_t n),                                  \
      (s, dgate, dup, overwrite, dout, gate, up, dt, n), (dgate, dup, dout, gate, up))             \
    X(swiglu_bwd16,                                                                                \
      (hs_stream * s, void *dgate16, void *dup16, const float *dout, const void *gate,             \
       const void *up, hs_dtype dt, int64_t n),                                                    \
      (s, dgate16, dup16, dout, gate, up, dt, n), (dgate16, dup16, dout, gate, up))                \
    X(attention_fwd,                                                                               \
      (hs_stream * s, void *out, hs_dtype odt, float *lse, const void *q, const void *k,           \
       const void *v, hs_dtype dt, int B, int NH, int KVH, int HD, const hs_att_rows *r,           \
       const hs_att_work *w),                                                                      \
      (s, out, odt, lse, q, k, v, dt, B, NH, KVH, HD, r, w), (out, lse, q, k, v))                  \
    X(attention_bwd,                                                                               \
      (hs_stream * s, float *dq, float *dk, float *dv, const float *dout, const void *out,         \
       hs_dtype odt, const void *q, const void *k, const void *v, const float *lse, hs_dtype dt,   \
       int B, int NH, int KVH, int HD, const hs_att_rows *r, const hs_att_work *w),                \
      (s, dq, dk, dv, dout, out, odt, q, k, v, lse, dt, B, NH, KVH, HD, r, w),                     \
      (dq, dk, dv, dout, out, q, k, v, lse))                                                       \
    X(attention_merge,                                                                             \
      (hs_stream * s, float *out, float *lse, const float *bout, const float *blse, int B, int NH, \
       int HD, const hs_att_rows *r),                                                              \
      (s, out, lse, bout, blse, B, NH, HD, r), (out, lse, bout, blse))                             \
    X(xent,                                                                                        \
      (hs_stream * s, double *loss, int64_t *valid, float *dlogits, const float *logits,           \
       const int32_t *targets, int64_t N, int V, float scale),                                     \
      (s, loss, valid, dlogits, logits, targets, N, V, scale), (dlogits, logits, targets))         \
    X(xent_shard_max, (hs_stream * s, float *row_max, const float *logits, int64_t N, int V),      \
      (s, row_max, logits, N, V), (row_max, logits))                                               \
    X(xent_shard_sums,                                                                             \
      (hs_stream * s, float *row_sumexp, float *row_target, const float *logits,                   \
       const float *gmax, const int32_t *targets, int64_t N, int V, int64_t v0),                   \
      (s, row_sumexp, row_target, logits, gmax, targets, N, V, v0),                                \
      (row_sumexp, row_target, logits, gmax, targets))                                             \
    X(xent_shard_grad,                                                                             \
      (hs_stream * s, float *logits, const float *gmax, const float *row_sumexp,                   \
       const int32_t *targets, int64_t N, int V, int64_t v0, float scale),                         \
      (s, logits, gmax, row_sumexp, targets, N, V, v0, scale),                                     \
      (logits, gmax, row_sumexp, targets))                                                         \
    X(xent_shard_loss,                                                                             \
      (hs_stream * s, double *loss, const float *gmax, const float *row_sumexp,                    \
       const float *row_target, const int32_t *targets, int64_t N),                                \
      (s, loss, gmax, row_sumexp, row_target, targets, N),                                         \
      (gmax, row_sumexp, row_target, targets))                                                     \
    X(embedding_fwd,                                                                               \
      (hs_stream * s, void *out, hs_dtype odt, const int32_t *tokens, const void *wte,             \
       hs_dtype dt, int64_t N, int C, int64_t v0, int V),                                          \
      (s, out, odt, tokens, wte, dt, N, C, v0, V), (out, tokens, wte))                             \
    X(embedding_bwd,                                                                               \
      (hs_stream * s, void *dwte, hs_dtype gdt, const float *dout, const int32_t *tokens,          \
       int64_t N, int C, int64_t v0, int V),                                                       \
      (s, dwte, gdt, dout, tokens, N, C, v0, V), (dwte, dout, tokens))                             \
    X(moe_route,                                                                                   \
      (hs_stream * s, int32_t * expert, float *weight, float *probs, const float *bias, int64_t N, \
       int E, int K, hs_moe_router r, hs_dtype dt),                                                \
      (s, expert, weight, probs, bias, N, E, K, r, dt), (expert, weight, probs, bias))             \
    X(moe_permute,                                                                                 \
      (hs_stream * s, void *xg, const void *x, const int32_t *row_pair, hs_dtype dt, int64_t N,    \
       int K, int C),                                                                              \
      (s, xg, x, row_pair, dt, N, K, C), (xg, x, row_pair))                                        \
    X(moe_permute_bwd,                                                                             \
      (hs_stream * s, float *dx, const float *dxg, const int32_t *row_pair, int64_t N, int K,      \
       int C),                                                                                     \
      (s, dx, dxg, row_pair, N, K, C), (dx, dxg, row_pair))                                        \
    X(moe_unpermute,                                                                               \
      (hs_stream * s, float *out, const void *y, hs_dtype dt, const int32_t *pair_row,             \
       const float *weight, int64_t N, int K, int C, float *ws),                                   \
      (s, out, y, dt, pair_row, weight, N, K, C, ws), (out, y, pair_row, weight, ws))              \
    X(moe_combine_bwd,                                                                             \
      (hs_stream * s, float *dyg, float *dw, const float *dout, const void *y, hs_dtype dt,        \
       const int32_t *pair_row, const float *weight, int64_t N, int K, int C, float *ws),          \
      (s, dyg, dw, dout, y, dt, pair_row, weight, N, K, C, ws),                                    \
      (dyg, dw, dout, y, pair_row, weight, ws))                                                    \
    X(moe_route_bwd,                                                                               \
      (hs_stream * s, float *dp, const float *probs, const int32_t *expert, const float *dw,       \
       const float *aux_grad, int64_t N, int E, int K, hs_moe_router r),                           \
      (s, dp, probs, expert, dw, aux_grad, N, E, K, r), (dp, probs, expert, dw, aux_grad))         \
    X(moe_stats,                                                                                   \
      (hs_stream * s, int64_t * count, double *prob_sum, const int32_t *expert,                    \
       const float *probs, int64_t N, int E, int K),                                               \
      (s, count, prob_sum, expert, probs, N, E, K), (count, prob_sum, expert, probs))              \
    X(moe_stats_add,                                                                               \
      (hs_stream * s, int64_t * count, double *prob_sum, const int64_t *count_in,                  \
       const double *prob_sum_in, int E),                                                          \
      (s, count, prob_sum, count_in, prob_sum_in, E), (count, prob_sum, count_in, prob_sum_in))    \
    X(moe_dispatch,                                                                                \
      (hs_stream * s, int32_t * offset, int32_t * row_pair, int32_t * pair_row,                    \
       const int32_t *expert, const int64_t *count, int64_t N, int E, int K),                      \
      (s, offset, row_pair, pair_row, expert, count, N, E, K),                                     \
      (offset, row_pair, pair_row, expert, count))                                                 \
    X(adamw,                                                                                       \
      (hs_stream * s, void *p, hs_dtype pdt, float *m, float *v, const float *g,                   \
       const hs_adamw_hparams *h, int64_t n),                                                      \
      (s, p, pdt, m, v, g, h, n), (p, m, v, g))                                                    \
    X(adamw_many, (hs_stream * s, const hs_adamw_tensor *t, int count, const hs_adamw_hparams *h), \
      (s, t, count, h), (count > 0 ? t[0].p : NULL, count > 0 ? t[count - 1].m : NULL))            \
    X(muon_momentum,                                                                               \
      (hs_stream * s, float *dir, float *buf, const float *g, float mu, bool nesterov, int64_t n), \
      (s, dir, buf, g, mu, nesterov, n), (dir, buf, g))                                            \
    X(muon_newton_schulz,                                                                          \
      (hs_stream * s, float *out, const float *g, int64_t rows, int64_t cols, int steps,           \
       float *ws),                                                                                 \
      (s, out, g, rows, cols, steps, ws), (out, g, ws))                                            \
    X(muon_update,                                                                                 \
      (hs_stream * s, void *p, hs_dtype pdt, const float *u, float decay_factor, float step,       \
       int64_t n),                                                                                 \
      (s, p, pdt, u, decay_factor, step, n), (p, u))                                               \
    X(copy_2d,                                                                                     \
      (hs_stream * s, void *dst, size_t dst_stride, const void *src, size_t src_stride,            \
       int64_t rows, size_t row_bytes),                                                            \
      (s, dst, dst_stride, src, src_stride, rows, row_bytes), (dst, src))                          \
    X(quantize,                                                                                    \
      (hs_stream * s, void *packed, const void *src, hs_dtype src_dt, int64_t n, int64_t block,    \
       hs_quant_fmt f),                                                                            \
      (s, packed, src, src_dt, n, block, f), (packed, src))                                        \
    X(dequantize,                                                                                  \
      (hs_stream * s, void *dst, hs_dtype dst_dt, const void *packed, int64_t n, int64_t first,    \
       int64_t count, int64_t block, hs_quant_fmt f),                                              \
      (s, dst, dst_dt, packed, n, first, count, block, f), (dst, packed))                          \
    X(dequantize_add,                                                                              \
      (hs_stream * s, float *dst, const void *packed, int64_t n, int64_t first, int64_t count,     \
       int64_t block, hs_quant_fmt f),                                                             \
      (s, dst, packed, n, first, count, block, f), (dst, packed))

#endif
