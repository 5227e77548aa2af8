/* The cuda backend's element-wise entries: casts, fills, normal draws, fp32
 * arithmetic, the fp64 sum of squares, the 2-D copy and the block
 * quantization, each over its launcher in cuda_elementwise.cu on the
 * entry's stream. */
#include <stdlib.h>

#include "device/cuda.h"
#include "device/cuda_elementwise_launch.h"

void hs_cuda_convert(hs_stream *s, void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt,
                     int64_t n) {
    hs_cuda_check(s, hs_cu_convert(hs_cuda_stream(s), dst, (int)dst_dt, src, (int)src_dt, n),
                  "convert");
}

void hs_cuda_convert_scaled(hs_stream *s, float *dst, const void *src, hs_dtype src_dt, float a,
                            int64_t n) {
    hs_cuda_check(s, hs_cu_convert_scaled(hs_cuda_stream(s), dst, src, (int)src_dt, a, n),
                  "convert_scaled");
}

void hs_cuda_fill(hs_stream *s, float *x, float v, int64_t n) {
    hs_cuda_check(s, hs_cu_fill(hs_cuda_stream(s), x, v, n), "fill");
}

void hs_cuda_rng_normal(hs_stream *s, float *x, int64_t n, uint64_t seed, uint64_t stream,
                        int64_t offset, float mean, float std) {
    hs_cuda_check(s, hs_cu_rng_normal(hs_cuda_stream(s), x, n, seed, stream, offset, mean, std),
                  "rng_normal");
}

void hs_cuda_axpy(hs_stream *s, float *y, const float *x, float a, int64_t n) {
    hs_cuda_check(s, hs_cu_axpy(hs_cuda_stream(s), y, x, a, n), "axpy");
}

void hs_cuda_scale(hs_stream *s, float *x, float a, int64_t n) {
    hs_cuda_check(s, hs_cu_scale(hs_cuda_stream(s), x, a, n), "scale");
}

void hs_cuda_add(hs_stream *s, float *y, const float *x, int64_t n) {
    hs_cuda_check(s, hs_cu_add(hs_cuda_stream(s), y, x, n), "add");
}

void hs_cuda_add_to_zero(hs_stream *s, float *y, const float *x, int64_t n) {
    hs_cuda_check(s, hs_cu_add_to_zero(hs_cuda_stream(s), y, x, n), "add_to_zero");
}

/* Reduced on the device into scratch; only the double crosses to the host
 * (and the call waits for it). Without scratch *out is left as it is. */
void hs_cuda_sumsq(hs_stream *s, double *out, const float *x, int64_t n) {
    if (n <= 0) {
        *out = 0.0;
        return;
    }
    cudaStream_t st = hs_cuda_stream(s);
    double *sum = hs_cuda_scratch(s, hs_cu_sumsq_scratch(n), "sumsq");
    if (sum == NULL) return;
    cudaError_t err = hs_cu_sumsq(st, sum, x, n);
    hs_cuda_check(s, err, "sumsq");
    if (err == cudaSuccess) hs_cuda_to_host(s, out, sum, sizeof *out);
    hs_cuda_scratch_free(s, sum);
}

/* Every tensor's sum in two launches, and one copy back: the gradient
 * norm without a wait per parameter. */
void hs_cuda_sumsq_many(hs_stream *s, double *out, const float *const *x, const int64_t *n,
                        int count) {
    if (count <= 0) return;
    size_t work = hs_cu_sumsq_many_scratch(n, count), sums = (size_t)count * sizeof(double);
    char *dev = hs_cuda_scratch(s, sums + work, "sumsq_many");
    if (dev == NULL) return;
    void *host = malloc(work);
    if (host == NULL) {
        hs_kernel_oom(s, "sumsq_many: %zu bytes of host staging", work);
    } else {
        cudaError_t err =
            hs_cu_sumsq_many(hs_cuda_stream(s), (double *)dev, dev + sums, host, x, n, count);
        hs_cuda_check(s, err, "sumsq_many");
        if (err == cudaSuccess) hs_cuda_to_host(s, out, dev, sums);
        else hs_cuda_check(s, cudaStreamSynchronize(hs_cuda_stream(s)), "sumsq_many's wait");
        free(host);
    }
    hs_cuda_scratch_free(s, dev);
}

void hs_cuda_round(hs_stream *s, float *x, hs_dtype dt, int64_t n) {
    hs_cuda_check(s, hs_cu_round(hs_cuda_stream(s), x, (int)dt, n), "round");
}

void hs_cuda_add_cast(hs_stream *s, void *out, hs_dtype odt, const void *a, hs_dtype adt,
                      const void *b, hs_dtype bdt, int64_t n) {
    hs_cuda_check(s, hs_cu_add_cast(hs_cuda_stream(s), out, (int)odt, a, (int)adt, b, (int)bdt, n),
                  "add_cast");
}

void hs_cuda_scale_cast(hs_stream *s, void *x, hs_dtype dt, float a, int64_t n) {
    hs_cuda_check(s, hs_cu_scale_cast(hs_cuda_stream(s), x, (int)dt, a, n), "scale_cast");
}

void hs_cuda_copy_2d(hs_stream *s, void *dst, size_t dst_stride, const void *src, size_t src_stride,
                     int64_t rows, size_t row_bytes) {
    hs_cuda_check(
        s, hs_cu_copy_2d(hs_cuda_stream(s), dst, dst_stride, src, src_stride, rows, row_bytes),
        "copy_2d");
}

_Static_assert(HS_QUANT_INT8 == HS_CU_QUANT_INT8 && HS_QUANT_FP8_E4M3 == HS_CU_QUANT_FP8_E4M3 &&
                   HS_QUANT_INT4 == HS_CU_QUANT_INT4,
               "the kernels' format numbers are hs_quant_fmt's");

void hs_cuda_quantize(hs_stream *s, void *packed, const void *src, hs_dtype src_dt, int64_t n,
                      int64_t block, hs_quant_fmt f) {
    hs_cuda_check(s, hs_cu_quantize(hs_cuda_stream(s), packed, src, (int)src_dt, n, block, (int)f),
                  "quantize");
}

void hs_cuda_dequantize(hs_stream *s, void *dst, hs_dtype dst_dt, const void *packed, int64_t n,
                        int64_t first, int64_t count, int64_t block, hs_quant_fmt f) {
    hs_cuda_check(s,
                  hs_cu_dequantize(hs_cuda_stream(s), dst, (int)dst_dt, packed, n, first, count,
                                   block, (int)f),
                  "dequantize");
}

void hs_cuda_dequantize_add(hs_stream *s, float *dst, const void *packed, int64_t n, int64_t first,
                            int64_t count, int64_t block, hs_quant_fmt f) {
    hs_cuda_check(
        s, hs_cu_dequantize_add(hs_cuda_stream(s), dst, packed, n, first, count, block, (int)f),
        "dequantize_add");
}
