/* Private to src/device/: the cpu backend's table entries, one file per
 * family (cpu_rmsnorm.c, cpu_rope.c, cpu_swiglu.c, ...); each entry runs
 * the kernel that the layers not yet on the table call by its own name
 * (device.h), so both reach the same code. */
#ifndef HS_DEVICE_CPU_H
#define HS_DEVICE_CPU_H

#include "hypershard/device.h"

void hs_cpu_rmsnorm_fwd(hs_stream *s, void *out, float *rstd, const void *x, hs_dtype xdt,
                        const void *w, hs_dtype dt, int64_t N, int C, float eps);
void hs_cpu_rmsnorm_bwd(hs_stream *s, float *dx, void *dw, hs_dtype gdt, const float *dout,
                        const void *x, hs_dtype xdt, const void *w, const float *rstd, hs_dtype dt,
                        int64_t N, int C, double *ws);
void hs_cpu_rope_tables(hs_stream *s, float *cos_t, float *sin_t, int T, int HD, double theta);
void hs_cpu_rope_fwd(hs_stream *s, void *x, hs_dtype dt, const float *cos_t, const float *sin_t,
                     int B, int T, int H, int HD);
void hs_cpu_rope_bwd(hs_stream *s, float *dx, const float *cos_t, const float *sin_t, int B, int T,
                     int H, int HD);
void hs_cpu_swiglu_fwd(hs_stream *s, void *out, const void *gate, const void *up, hs_dtype dt,
                       int64_t n);
void hs_cpu_swiglu_bwd(hs_stream *s, float *dgate, float *dup, bool overwrite, const float *dout,
                       const void *gate, const void *up, hs_dtype dt, int64_t n);
void hs_cpu_embedding_fwd(hs_stream *s, void *out, hs_dtype odt, const int32_t *tokens,
                          const void *wte, hs_dtype dt, int64_t N, int C, int64_t v0, int V);
void hs_cpu_embedding_bwd(hs_stream *s, void *dwte, hs_dtype gdt, const float *dout,
                          const int32_t *tokens, int64_t N, int C, int64_t v0, int V);
void hs_cpu_xent(hs_stream *s, double *loss, int64_t *valid, float *dlogits, const float *logits,
                 const int32_t *targets, int64_t N, int V, float scale);
void hs_cpu_xent_shard_max(hs_stream *s, float *row_max, const float *logits, int64_t N, int V);
void hs_cpu_xent_shard_sums(hs_stream *s, float *row_sumexp, float *row_target, const float *logits,
                            const float *gmax, const int32_t *targets, int64_t N, int V,
                            int64_t v0);
void hs_cpu_xent_shard_grad(hs_stream *s, float *logits, const float *gmax, const float *row_sumexp,
                            const int32_t *targets, int64_t N, int V, int64_t v0, float scale);
void hs_cpu_xent_shard_loss(hs_stream *s, double *loss, const float *gmax, const float *row_sumexp,
                            const float *row_target, const int32_t *targets, int64_t N);
void hs_cpu_adamw(hs_stream *s, void *p, hs_dtype pdt, float *m, float *v, const float *g,
                  const hs_adamw_hparams *h, int64_t n);
void hs_cpu_muon_momentum(hs_stream *s, float *dir, float *buf, const float *g, float mu,
                          bool nesterov, int64_t n);
void hs_cpu_muon_newton_schulz(hs_stream *s, float *out, const float *g, int64_t rows, int64_t cols,
                               int steps, float *ws);
void hs_cpu_muon_update(hs_stream *s, void *p, hs_dtype pdt, const float *u, float decay_factor,
                        float step, int64_t n);
void hs_cpu_scale_cast(hs_stream *s, void *x, hs_dtype dt, float a, int64_t n);
void hs_cpu_moe_route(hs_stream *s, int32_t *expert, float *weight, float *probs, int64_t N, int E,
                      int K, bool renorm, hs_dtype dt);
void hs_cpu_moe_permute(hs_stream *s, void *xg, const void *x, const int32_t *row_pair, hs_dtype dt,
                        int64_t N, int K, int C);
void hs_cpu_moe_permute_bwd(hs_stream *s, float *dx, const float *dxg, const int32_t *row_pair,
                            int64_t N, int K, int C);
void hs_cpu_moe_unpermute(hs_stream *s, float *out, const void *y, hs_dtype dt,
                          const int32_t *pair_row, const float *weight, int64_t N, int K, int C,
                          float *ws);
void hs_cpu_moe_combine_bwd(hs_stream *s, float *dyg, float *dw, const float *dout, const void *y,
                            hs_dtype dt, const int32_t *pair_row, const float *weight, int64_t N,
                            int K, int C, float *ws);
void hs_cpu_moe_route_bwd(hs_stream *s, float *dp, const float *probs, const int32_t *expert,
                          const float *dw, const float *aux_grad, int64_t N, int E, int K,
                          bool renorm);
void hs_cpu_moe_stats(hs_stream *s, int64_t *count, double *prob_sum, const int32_t *expert,
                      const float *probs, int64_t N, int E, int K);
void hs_cpu_moe_stats_add(hs_stream *s, int64_t *count, double *prob_sum, const int64_t *count_in,
                          const double *prob_sum_in, int E);
void hs_cpu_moe_dispatch(hs_stream *s, int32_t *offset, int32_t *row_pair, int32_t *pair_row,
                         const int32_t *expert, const int64_t *count, int64_t N, int E, int K);
void hs_cpu_copy_2d(hs_stream *s, void *dst, size_t dst_stride, const void *src, size_t src_stride,
                    int64_t rows, size_t row_bytes);
void hs_cpu_attention_fwd(hs_stream *s, void *out, hs_dtype odt, float *lse, const void *q,
                          const void *k, const void *v, hs_dtype dt, int B, int NH, int KVH, int HD,
                          const hs_att_rows *r, const hs_att_work *w);
void hs_cpu_attention_merge(hs_stream *s, float *out, float *lse, const float *bout,
                            const float *blse, int B, int NH, int HD, const hs_att_rows *r);
void hs_cpu_attention_bwd(hs_stream *s, float *dq, float *dk, float *dv, const float *dout,
                          const void *out, hs_dtype odt, const void *q, const void *k,
                          const void *v, const float *lse, hs_dtype dt, int B, int NH, int KVH,
                          int HD, const hs_att_rows *r, const hs_att_work *w);

#endif
