/* One SwiGLU expert, w2(silu(w1 x) * (w3 x)), over a block of rows: the
 * routed experts run it once per expert on their grouped rows and the
 * shared expert once on every token.
 *
 * Rounding points in a 16-bit compute dtype: w1 x and w3 x are rounded when
 * stored (saved for backward), silu(h1) * h3 is rounded once (Hugging Face
 * also rounds silu(h1) alone), and the output is rounded by the caller's
 * choice of y dtype. Gradients are fp32 throughout. The gate is the
 * device's swiglu_fwd / swiglu_bwd, as in the dense MLP. */
#include "hypershard/model.h"
#include "model/moe_expert.h"

void hs_moe_swiglu_forward(hs_device *d, void *y, hs_dtype y_dt, float beta, void *h1, void *h3,
                           void *a, const void *xin, const void *w1, const void *w3, const void *w2,
                           hs_dtype dt, int64_t n, int C, int F) {
    if (n == 0) return;
    hs_dev_gemm(d, false, true, n, F, C, 1.0f, xin, dt, C, w1, dt, C, 0.0f, h1, dt, F);
    hs_dev_gemm(d, false, true, n, F, C, 1.0f, xin, dt, C, w3, dt, C, 0.0f, h3, dt, F);
    d->k->swiglu_fwd(d->stream, a, h1, h3, dt, n * F);
    hs_dev_gemm(d, false, true, n, C, F, 1.0f, a, dt, F, w2, dt, F, beta, y, y_dt, C);
}

void hs_moe_swiglu_backward(hs_device *d, float *dxin, float dxin_beta, void *dw1, void *dw3,
                            void *dw2, hs_dtype gdt, const float *dy, const void *xin,
                            const void *h1, const void *h3, const void *w1, const void *w3,
                            const void *w2, hs_dtype dt, void *a, float *dh1, float *dh3, int64_t n,
                            int C, int F, const hs_moe_wgrad *wg, const int64_t *first) {
    if (n == 0) return;
    const hs_dtype f32 = HS_DTYPE_F32;
    d->k->swiglu_fwd(d->stream, a, h1, h3, dt, n * F);
    hs_dev_gemm(d, false, false, n, F, C, 1.0f, dy, f32, C, w2, dt, F, 0.0f, dh1, f32, F);
    if (dw2 && wg) wg->fn(wg->ctx, dw2, gdt, dy, f32, a, dt, first, F, C);
    else if (dw2)
        hs_dev_gemm(d, true, false, C, F, n, 1.0f, dy, f32, C, a, dt, F, 1.0f, dw2, gdt, F);
    /* dh1 holds d loss / d a: overwritten by d/d h1, and dh3 set to d/d h3 */
    d->k->swiglu_bwd(d->stream, dh1, dh3, true, dh1, h1, h3, dt, n * F);
    /* dy is dead from here on, so dxin may alias it. */
    hs_dev_gemm(d, false, false, n, C, F, 1.0f, dh1, f32, F, w1, dt, C, dxin_beta, dxin, f32, C);
    hs_dev_gemm(d, false, false, n, C, F, 1.0f, dh3, f32, F, w3, dt, C, 1.0f, dxin, f32, C);
    if (wg) {
        if (dw1) wg->fn(wg->ctx, dw1, gdt, dh1, f32, xin, dt, first, C, F);
        if (dw3) wg->fn(wg->ctx, dw3, gdt, dh3, f32, xin, dt, first, C, F);
        return;
    }
    if (dw1) hs_dev_gemm(d, true, false, F, C, n, 1.0f, dh1, f32, F, xin, dt, C, 1.0f, dw1, gdt, C);
    if (dw3) hs_dev_gemm(d, true, false, F, C, n, 1.0f, dh3, f32, F, xin, dt, C, 1.0f, dw3, gdt, C);
}

void hs_moe_experts_forward(const hs_moe_rows *r, const hs_moe_weights *w, void *a, hs_dtype dt,
                            int C, int F) {
    for (int e = 0; e < r->n; e++) {
        int64_t r0 = r->offset[e], n = r->offset[e + 1] - r0;
        int64_t wo = (int64_t)e * F * C;
        hs_moe_swiglu_forward(r->dev, hs_moe_at(r->y, dt, r0 * C), dt, 0.0f,
                              hs_moe_at(r->h1, dt, r0 * F), hs_moe_at(r->h3, dt, r0 * F),
                              hs_moe_at(a, dt, r0 * F), hs_moe_at(r->x, dt, r0 * C),
                              hs_moe_at(w->w1, dt, wo), hs_moe_at(w->w3, dt, wo),
                              hs_moe_at(w->w2, dt, wo), dt, n, C, F);
    }
}

/* Expert e's rows of each sequence, counted from its first row. */
static const int64_t *first_of(const hs_moe_rows *r, const hs_moe_grads *gr, int e) {
    return r->seq_first + (size_t)e * (size_t)(gr->wgrad->nseq + 1);
}

static void *grad_slice(void *g, hs_dtype gdt, int64_t off) {
    return g ? hs_moe_at(g, gdt, off) : NULL;
}

void hs_moe_experts_backward(const hs_moe_rows *r, float *dy, const hs_moe_grads *gr,
                             const hs_moe_weights *w, void *a, float *dh1, float *dh3, hs_dtype dt,
                             int C, int F) {
    const hs_dtype gdt = gr->dt;
    for (int e = 0; e < r->n; e++) {
        int64_t r0 = r->offset[e], n = r->offset[e + 1] - r0;
        int64_t wo = (int64_t)e * F * C;
        float *d = dy + r0 * C;
        hs_moe_swiglu_backward(
            r->dev, d, 0.0f, grad_slice(gr->w1, gdt, wo), grad_slice(gr->w3, gdt, wo),
            grad_slice(gr->w2, gdt, wo), gdt, d, hs_moe_at(r->x, dt, r0 * C),
            hs_moe_at(r->h1, dt, r0 * F), hs_moe_at(r->h3, dt, r0 * F), hs_moe_at(w->w1, dt, wo),
            hs_moe_at(w->w3, dt, wo), hs_moe_at(w->w2, dt, wo), dt, hs_moe_at(a, dt, r0 * F),
            dh1 + r0 * F, dh3 + r0 * F, n, C, F, r->seq_first ? gr->wgrad : NULL,
            r->seq_first ? first_of(r, gr, e) : NULL);
    }
}
