/* Private to src/device/: the reference backend's kernels, one file per
 * family (reference_blas.c, reference_nn.c, reference_attention.c,
 * reference_moe.c, reference_optim.c). Plain C, one thread, fp64
 * accumulation, each output rounded once: short enough to check by eye. */
#ifndef HS_DEVICE_REFERENCE_H
#define HS_DEVICE_REFERENCE_H

#include "hypershard/device.h"

void hs_ref_gemm(hs_stream *s, void *C, const void *A, const void *B, const hs_gemm_shape *g);
void hs_ref_convert(hs_stream *s, void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt,
                    int64_t n);
void hs_ref_convert_scaled(hs_stream *s, float *dst, const void *src, hs_dtype src_dt, float a,
                           int64_t n);
void hs_ref_fill(hs_stream *s, float *x, float v, int64_t n);
void hs_ref_rng_normal(hs_stream *s, float *x, int64_t n, uint64_t seed, uint64_t stream,
                       int64_t offset, float mean, float std);
void hs_ref_axpy(hs_stream *s, float *y, const float *x, float a, int64_t n);
void hs_ref_scale(hs_stream *s, float *x, float a, int64_t n);
void hs_ref_add(hs_stream *s, float *y, const float *x, int64_t n);
void hs_ref_add_to_zero(hs_stream *s, float *y, const float *x, int64_t n);
void hs_ref_round(hs_stream *s, float *x, hs_dtype dt, int64_t n);
void hs_ref_add_cast(hs_stream *s, void *out, hs_dtype odt, const void *a, hs_dtype adt,
                     const void *b, hs_dtype bdt, int64_t n);
void hs_ref_sumsq(hs_stream *s, double *out, const float *x, int64_t n);
void hs_ref_sumsq_many(hs_stream *s, double *out, const float *const *x, const int64_t *n,
                       int count);
void hs_ref_copy_2d(hs_stream *s, void *dst, size_t dst_stride, const void *src, size_t src_stride,
                    int64_t rows, size_t row_bytes);

void hs_ref_rmsnorm_fwd(hs_stream *s, void *out, float *rstd, const void *x, hs_dtype xdt,
                        const void *w, hs_dtype dt, int64_t N, int C, float eps);
void hs_ref_rmsnorm_bwd(hs_stream *s, float *dx, void *dw, hs_dtype gdt, const float *dout,
                        const void *x, hs_dtype xdt, const void *w, const float *rstd, hs_dtype dt,
                        int64_t N, int C, double *ws);
void hs_ref_rope_tables(hs_stream *s, float *cos_t, float *sin_t, int T, int HD, double theta);
void hs_ref_rope_fwd(hs_stream *s, void *x, hs_dtype dt, const float *cos_t, const float *sin_t,
                     int B, int T, int H, int HD);
void hs_ref_rope_bwd(hs_stream *s, float *dx, const float *cos_t, const float *sin_t, int B, int T,
                     int H, int HD);
void hs_ref_swiglu_fwd(hs_stream *s, void *out, const void *gate, const void *up, hs_dtype dt,
                       int64_t n);
void hs_ref_swiglu_bwd(hs_stream *s, float *dgate, float *dup, bool overwrite, const float *dout,
                       const void *gate, const void *up, hs_dtype dt, int64_t n);
void hs_ref_xent(hs_stream *s, double *loss, int64_t *valid, float *dlogits, const float *logits,
                 const int32_t *targets, int64_t N, int V, float scale);
void hs_ref_xent_shard_max(hs_stream *s, float *row_max, const float *logits, int64_t N, int V);
void hs_ref_xent_shard_sums(hs_stream *s, float *row_sumexp, float *row_target, const float *logits,
                            const float *gmax, const int32_t *targets, int64_t N, int V,
                            int64_t v0);
void hs_ref_xent_shard_grad(hs_stream *s, float *logits, const float *gmax, const float *row_sumexp,
                            const int32_t *targets, int64_t N, int V, int64_t v0, float scale);
void hs_ref_xent_shard_loss(hs_stream *s, double *loss, const float *gmax, const float *row_sumexp,
                            const float *row_target, const int32_t *targets, int64_t N);
void hs_ref_embedding_fwd(hs_stream *s, void *out, hs_dtype odt, const int32_t *tokens,
                          const void *wte, hs_dtype dt, int64_t N, int C, int64_t v0, int V);
void hs_ref_embedding_bwd(hs_stream *s, void *dwte, hs_dtype gdt, const float *dout,
                          const int32_t *tokens, int64_t N, int C, int64_t v0, int V);

void hs_ref_attention_fwd(hs_stream *s, void *out, hs_dtype odt, float *lse, const void *q,
                          const void *k, const void *v, hs_dtype dt, int B, int NH, int KVH, int HD,
                          const hs_att_rows *r, const hs_att_work *w);
void hs_ref_attention_merge(hs_stream *s, float *out, float *lse, const float *bout,
                            const float *blse, int B, int NH, int HD, const hs_att_rows *r);
void hs_ref_attention_bwd(hs_stream *s, float *dq, float *dk, float *dv, const float *dout,
                          const void *out, hs_dtype odt, const void *q, const void *k,
                          const void *v, const float *lse, hs_dtype dt, int B, int NH, int KVH,
                          int HD, const hs_att_rows *r, const hs_att_work *w);

void hs_ref_moe_route(hs_stream *s, int32_t *expert, float *weight, float *probs, int64_t N, int E,
                      int K, bool renorm, hs_dtype dt);
void hs_ref_moe_permute(hs_stream *s, void *xg, const void *x, const int32_t *row_pair, hs_dtype dt,
                        int64_t N, int K, int C);
void hs_ref_moe_permute_bwd(hs_stream *s, float *dx, const float *dxg, const int32_t *row_pair,
                            int64_t N, int K, int C);
void hs_ref_moe_unpermute(hs_stream *s, float *out, const void *y, hs_dtype dt,
                          const int32_t *pair_row, const float *weight, int64_t N, int K, int C,
                          float *ws);
void hs_ref_moe_combine_bwd(hs_stream *s, float *dyg, float *dw, const float *dout, const void *y,
                            hs_dtype dt, const int32_t *pair_row, const float *weight, int64_t N,
                            int K, int C, float *ws);
void hs_ref_moe_route_bwd(hs_stream *s, float *dp, const float *probs, const int32_t *expert,
                          const float *dw, const float *aux_grad, int64_t N, int E, int K,
                          bool renorm);
void hs_ref_moe_stats(hs_stream *s, int64_t *count, double *prob_sum, const int32_t *expert,
                      const float *probs, int64_t N, int E, int K);
void hs_ref_moe_stats_add(hs_stream *s, int64_t *count, double *prob_sum, const int64_t *count_in,
                          const double *prob_sum_in, int E);
void hs_ref_moe_dispatch(hs_stream *s, int32_t *offset, int32_t *row_pair, int32_t *pair_row,
                         const int32_t *expert, const int64_t *count, int64_t N, int E, int K);

void hs_ref_adamw(hs_stream *s, void *p, hs_dtype pdt, float *m, float *v, const float *g,
                  const hs_adamw_hparams *h, int64_t n);
void hs_ref_muon_momentum(hs_stream *s, float *dir, float *buf, const float *g, float mu,
                          bool nesterov, int64_t n);
void hs_ref_muon_newton_schulz(hs_stream *s, float *out, const float *g, int64_t rows, int64_t cols,
                               int steps, float *ws);
void hs_ref_muon_update(hs_stream *s, void *p, hs_dtype pdt, const float *u, float decay_factor,
                        float step, int64_t n);
void hs_ref_scale_cast(hs_stream *s, void *x, hs_dtype dt, float a, int64_t n);

#endif
