/* A oneDNN matmul built once and run many times, and a small cache of
 * them owned by the caller.
 *
 * Building a matmul (descriptors, primitive descriptor, primitive) costs
 * about 5 us, more than a small product itself: attention's tiles run
 * thousands of 128 x 64 x 256 products a step, all of a few shapes. A plan
 * holds the built primitive and its memory objects; running it only points
 * the memory objects at the operands. The same descriptor gives the same
 * primitive as hs_gemm_ex builds per call, so a planned product has the
 * same bits. A plan or cache belongs to one thread at a time. */
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/tensor.h"

struct hs_gemm_plan {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
    int64_t M, N, K;
};

static dnnl_data_type_t dnnl_dt(hs_dtype dt) {
    switch (dt) {
    case HS_DTYPE_BF16: return dnnl_bf16;
    case HS_DTYPE_F16: return dnnl_f16;
    default: return dnnl_f32;
    }
}

/* A row-major operand with row stride ld, read transposed or not, as the
 * dims {d0, d1} the matmul sees. */
static dnnl_status_t operand_desc(dnnl_memory_desc_t *md, int64_t d0, int64_t d1, bool trans,
                                  int64_t ld, hs_dtype dt) {
    dnnl_dims_t dims = {d0, d1};
    dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_dt(dt), strides);
}

static bool build(hs_gemm_plan *p, const hs_gemm_shape *s) {
    dnnl_memory_desc_t a, b, c;
    if (operand_desc(&a, s->M, s->K, s->trans_a, s->lda, s->a_dt) != dnnl_success ||
        operand_desc(&b, s->K, s->N, s->trans_b, s->ldb, s->b_dt) != dnnl_success ||
        operand_desc(&c, s->M, s->N, false, s->ldc, s->c_dt) != dnnl_success)
        return false;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t md;
    bool ok = dnnl_engine_create(&p->eng, dnnl_cpu, 0) == dnnl_success &&
              dnnl_stream_create(&p->stream, p->eng, dnnl_stream_default_flags) == dnnl_success &&
              dnnl_primitive_attr_create(&attr) == dnnl_success &&
              dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) == dnnl_success;
    if (ok && s->alpha != 1.0f)
        ok = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &s->alpha) == dnnl_success;
    if (ok && s->beta != 0.0f)
        ok = dnnl_post_ops_create(&post) == dnnl_success &&
             dnnl_post_ops_append_sum(post, s->beta) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, post) == dnnl_success;
    /* Data handles are set by each run; NULL until then. */
    ok = ok && dnnl_primitive_desc_create(&pd, &md, attr, p->eng, NULL) == dnnl_success &&
         dnnl_primitive_create(&p->prim, pd) == dnnl_success &&
         dnnl_memory_create(&p->a, &a, p->eng, NULL) == dnnl_success &&
         dnnl_memory_create(&p->b, &b, p->eng, NULL) == dnnl_success &&
         dnnl_memory_create(&p->c, &c, p->eng, NULL) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(post);
    dnnl_primitive_attr_destroy(attr);
    return ok;
}

hs_status hs_gemm_plan_create(const hs_gemm_shape *s, hs_gemm_plan **out, hs_error *e) {
    HS_ASSERT(s->M > 0 && s->N > 0 && s->K > 0);
    hs_gemm_plan *p = *out = calloc(1, sizeof *p);
    if (!p)
        return hs_error_oom(e, "the plan of a %lldx%lldx%lld GEMM: %zu bytes", (long long)s->M,
                            (long long)s->N, (long long)s->K, sizeof *p);
    p->M = s->M, p->N = s->N, p->K = s->K;
    if (!build(p, s)) {
        hs_gemm_plan_free(p);
        *out = NULL;
    }
    return HS_OK;
}

void hs_gemm_plan_run(hs_gemm_plan *p, const void *A, const void *B, void *C) {
    /* Past creation a failure is a broken call, not a missing kernel. */
    if (dnnl_memory_set_data_handle(p->a, (void *)A) != dnnl_success ||
        dnnl_memory_set_data_handle(p->b, (void *)B) != dnnl_success ||
        dnnl_memory_set_data_handle(p->c, C) != dnnl_success)
        hs_panic("oneDNN matmul %lldx%lldx%lld: cannot set its operands", (long long)p->M,
                 (long long)p->N, (long long)p->K);
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}};
    if (dnnl_primitive_execute(p->prim, p->stream, 3, args) != dnnl_success ||
        dnnl_stream_wait(p->stream) != dnnl_success)
        hs_panic("oneDNN matmul %lldx%lldx%lld failed to execute", (long long)p->M, (long long)p->N,
                 (long long)p->K);
}

void hs_gemm_plan_free(hs_gemm_plan *p) {
    if (!p) return;
    dnnl_memory_destroy(p->a);
    dnnl_memory_destroy(p->b);
    dnnl_memory_destroy(p->c);
    dnnl_primitive_destroy(p->prim);
    dnnl_stream_destroy(p->stream);
    dnnl_engine_destroy(p->eng);
    free(p);
}

/* ------------------------------------------------------------------ cache */

static bool same_shape(const hs_gemm_shape *x, const hs_gemm_shape *y) {
    return x->trans_a == y->trans_a && x->trans_b == y->trans_b && x->M == y->M && x->N == y->N &&
           x->K == y->K && x->lda == y->lda && x->ldb == y->ldb && x->ldc == y->ldc &&
           x->a_dt == y->a_dt && x->b_dt == y->b_dt && x->c_dt == y->c_dt && x->widen == y->widen &&
           /* bitwise: a scale is part of the primitive */
           !memcmp(&x->alpha, &y->alpha, sizeof x->alpha) &&
           !memcmp(&x->beta, &y->beta, sizeof x->beta);
}

void hs_gemm_cache_init(hs_gemm_cache *c) { memset(c, 0, sizeof *c); }

void hs_gemm_cache_free(hs_gemm_cache *c) {
    for (int i = 0; i < c->n; i++) hs_gemm_plan_free(c->plans[i]);
    memset(c, 0, sizeof *c);
}

hs_status hs_gemm_cached(hs_gemm_cache *c, const hs_gemm_shape *s, const void *A, const void *B,
                         void *C, hs_error *e) {
    /* Only two 16-bit operands of one dtype have a plan (hs_gemm_ex's
     * native matmul), unless widened; everything else goes to hs_gemm_run. */
    bool planned = !s->widen && s->a_dt == s->b_dt && s->a_dt != HS_DTYPE_F32 && s->M > 0 &&
                   s->N > 0 && s->K > 0;
    for (int i = 0; planned && i < c->n; i++) {
        if (!same_shape(&c->shapes[i], s)) continue;
        if (c->plans[i]) {
            hs_gemm_plan_run(c->plans[i], A, B, C);
            return HS_OK;
        }
        planned = false; /* no such matmul here: remembered */
    }
    if (planned && c->n < HS_GEMM_CACHE_SIZE) {
        hs_gemm_plan *p = NULL;
        hs_status st = hs_gemm_plan_create(s, &p, e);
        if (st != HS_OK) return st; /* not remembered: a later call tries again */
        int i = c->n++;
        c->shapes[i] = *s;
        c->plans[i] = p;
        if (p) {
            hs_gemm_plan_run(p, A, B, C);
            return HS_OK;
        }
    }
    return hs_gemm_run(s, A, B, C, e);
}
