/* Reference GEMM, casts, fp32 element-wise kernels and the block
 * quantization (the tensor layer's scalar routines, on one thread). */
#include "device/reference.h"

void hs_ref_gemm(hs_stream *s, void *C, const void *A, const void *B, const hs_gemm_shape *g) {
    for (int64_t i = 0; i < g->M; i++)
        for (int64_t j = 0; j < g->N; j++) {
            double acc = 0.0;
            for (int64_t k = 0; k < g->K; k++) {
                double a = hs_ld(A, g->a_dt, g->trans_a ? k * g->lda + i : i * g->lda + k);
                double b = hs_ld(B, g->b_dt, g->trans_b ? j * g->ldb + k : k * g->ldb + j);
                acc += a * b;
            }
            int64_t o = i * g->ldc + j;
            /* beta == 0 does not read C (BLAS): it may be uninitialised */
            double c = g->beta == 0.0f ? 0.0 : g->beta * (double)hs_ld(C, g->c_dt, o);
            hs_st(C, g->c_dt, o, (float)(g->alpha * acc + c));
        }
}

void hs_ref_convert(hs_stream *s, void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt,
                    int64_t n) {
    for (int64_t i = 0; i < n; i++) hs_st(dst, dst_dt, i, hs_ld(src, src_dt, i));
}

void hs_ref_convert_scaled(hs_stream *s, float *dst, const void *src, hs_dtype src_dt, float a,
                           int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = a * hs_ld(src, src_dt, i);
}

void hs_ref_fill(hs_stream *s, float *x, float v, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = v;
}

void hs_ref_axpy(hs_stream *s, float *y, const float *x, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void hs_ref_scale(hs_stream *s, float *x, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= a;
}

void hs_ref_add(hs_stream *s, float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* The draw is the definition (base/'s Philox and Box-Muller); the affine
 * map in fp64, one rounding. */
void hs_ref_rng_normal(hs_stream *s, float *x, int64_t n, uint64_t seed, uint64_t stream,
                       int64_t offset, float mean, float std) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((double)mean +
                       (double)std * hs_rng_normal(seed, stream, (uint64_t)(offset + i)));
}

void hs_ref_add_to_zero(hs_stream *s, float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = 0.0f + x[i];
}

void hs_ref_round(hs_stream *s, float *x, hs_dtype dt, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (dt == HS_DTYPE_BF16) x[i] = hs_bf16_to_f32(hs_f32_to_bf16(x[i]));
        if (dt == HS_DTYPE_F16) x[i] = hs_f16_to_f32(hs_f32_to_f16(x[i]));
    }
}

void hs_ref_add_cast(hs_stream *s, void *out, hs_dtype odt, const void *a, hs_dtype adt,
                     const void *b, hs_dtype bdt, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        hs_st(out, odt, i, (float)((double)hs_ld(a, adt, i) + hs_ld(b, bdt, i)));
}

void hs_ref_sumsq(hs_stream *s, double *out, const float *x, int64_t n) {
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++) acc += (double)x[i] * x[i];
    *out = acc;
}

void hs_ref_sumsq_many(hs_stream *s, double *out, const float *const *x, const int64_t *n,
                       int count) {
    for (int i = 0; i < count; i++) hs_ref_sumsq(s, &out[i], x[i], n[i]);
}

void hs_ref_copy_2d(hs_stream *s, void *dst, size_t dst_stride, const void *src, size_t src_stride,
                    int64_t rows, size_t row_bytes) {
    for (int64_t r = 0; r < rows && row_bytes; r++)
        memcpy((char *)dst + (size_t)r * dst_stride, (const char *)src + (size_t)r * src_stride,
               row_bytes);
}

void hs_ref_quantize(hs_stream *s, void *packed, const void *src, hs_dtype src_dt, int64_t n,
                     int64_t block, hs_quant_fmt f) {
    hs_quantize_blocks(packed, src, src_dt, n, block, f, 0, (n + block - 1) / block);
}

void hs_ref_dequantize(hs_stream *s, void *dst, hs_dtype dst_dt, const void *packed, int64_t n,
                       int64_t first, int64_t count, int64_t block, hs_quant_fmt f) {
    hs_dequantize_range(dst, dst_dt, packed, n, first, count, block, f);
}

void hs_ref_dequantize_add(hs_stream *s, float *dst, const void *packed, int64_t n, int64_t first,
                           int64_t count, int64_t block, hs_quant_fmt f) {
    hs_dequantize_add_f32(dst, packed, n, first, count, block, f);
}
