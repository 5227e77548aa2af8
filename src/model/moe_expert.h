/* model/moe_expert.h — one SwiGLU expert over a block of rows, the piece
 * the routed experts (hs_moe_experts_forward, model.h) and the shared
 * expert (moe.c) are made of. Private to src/model/. */
#ifndef HS_MODEL_MOE_EXPERT_H
#define HS_MODEL_MOE_EXPERT_H

#include <stdint.h>

#include "hypershard/device.h"

/* One SwiGLU expert over n rows: h1 = xin @ w1^T, h3 = xin @ w3^T (dt),
 * a = silu(h1) * h3 (dt, scratch), y = beta * y + a @ w2^T (y in y_dt). */
void hs_moe_swiglu_forward(hs_device *d, void *y, hs_dtype y_dt, float beta, void *h1, void *h3,
                           void *a, const void *xin, const void *w1, const void *w3, const void *w2,
                           hs_dtype dt, int64_t n, int C, int F);
/* dxin = dxin_beta * dxin + (gradient w.r.t. xin) (fp32 [n, C]); dxin may
 * be dy itself (dy is dead by then). dw1/dw3/dw2 += (in gdt; NULL skips),
 * through wg over the sequences' rows `first` (relative to these n rows)
 * when wg is not NULL.
 * Scratch: a (dt [n, F]), dh1 and dh3 (fp32 [n, F]). */
void hs_moe_swiglu_backward(hs_device *d, float *dxin, float dxin_beta, void *dw1, void *dw3,
                            void *dw2, hs_dtype gdt, const float *dy, const void *xin,
                            const void *h1, const void *h3, const void *w1, const void *w3,
                            const void *w2, hs_dtype dt, void *a, float *dh1, float *dh3, int64_t n,
                            int C, int F, const hs_moe_wgrad *wg, const int64_t *first);

/* Element i of a buffer of dtype dt. */
static inline void *hs_moe_at(const void *p, hs_dtype dt, int64_t i) {
    return (char *)p + (size_t)i * hs_dtype_size(dt);
}

#endif
