/* Private to src/device/: the launchers of cuda_elementwise.cu (casts,
 * fills, the counter-based normal draw, fp32 element-wise arithmetic, the
 * fp64 sum of squares and the 2-D copy), with plain C types for
 * cuda_elementwise.c: dtypes as hs_dtype's integers (0 fp32, 1 bf16,
 * 2 fp16), element counts int64_t. Each enqueues its work on `st` and
 * returns the launch's error (cudaGetLastError after it). */
#ifndef HS_DEVICE_CUDA_ELEMENTWISE_LAUNCH_H
#define HS_DEVICE_CUDA_ELEMENTWISE_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst = src converted (hs_convert's bits); the same dtype is a copy. */
cudaError_t hs_cu_convert(cudaStream_t st, void *dst, int dst_dt, const void *src, int src_dt,
                          int64_t n);
/* The same on an M x N matrix whose rows are dld and sld elements apart,
 * in one launch (the GEMM's strided C). */
cudaError_t hs_cu_convert_2d(cudaStream_t st, void *dst, int dst_dt, int64_t dld, const void *src,
                             int src_dt, int64_t sld, int64_t M, int64_t N);
/* dst = a * (float)src (no multiply when a == 1, as hs_convert_scaled_f32). */
cudaError_t hs_cu_convert_scaled(cudaStream_t st, float *dst, const void *src, int src_dt, float a,
                                 int64_t n);
cudaError_t hs_cu_fill(cudaStream_t st, float *x, float v, int64_t n);
/* x[i] = mean + stdev * hs_rng_normal(seed, stream, offset + i), in the
 * precisions of hs_rng_fill_normal. */
cudaError_t hs_cu_rng_normal(cudaStream_t st, float *x, int64_t n, uint64_t seed, uint64_t stream,
                             int64_t offset, float mean, float stdev);
cudaError_t hs_cu_axpy(cudaStream_t st, float *y, const float *x, float a, int64_t n);
cudaError_t hs_cu_scale(cudaStream_t st, float *x, float a, int64_t n);
cudaError_t hs_cu_add(cudaStream_t st, float *y, const float *x, int64_t n);
cudaError_t hs_cu_add_to_zero(cudaStream_t st, float *y, const float *x, int64_t n);
/* The bytes of device scratch hs_cu_sumsq needs for n values: the sum of
 * squares (fp64) lands in its first double, the blocks' partial sums
 * after it. */
size_t hs_cu_sumsq_scratch(int64_t n);
cudaError_t hs_cu_sumsq(cudaStream_t st, double *scratch, const float *x, int64_t n);
/* The sums of squares of count tensors in two launches: each tensor's
 * blocks and its final sum exactly as hs_cu_sumsq's (the same bits), into
 * sums[count] (device). The device scratch holds hs_cu_sumsq_many_scratch
 * (n, count) bytes; host is the caller's host memory of the same size, the
 * staging of the tensors' descriptors (it must stay untouched until the
 * stream has passed this call: the caller waits for the sums anyway). */
size_t hs_cu_sumsq_many_scratch(const int64_t *n, int count);
cudaError_t hs_cu_sumsq_many(cudaStream_t st, double *sums, void *scratch, void *host,
                             const float *const *x, const int64_t *n, int count);
cudaError_t hs_cu_round(cudaStream_t st, float *x, int dt, int64_t n);
cudaError_t hs_cu_add_cast(cudaStream_t st, void *out, int odt, const void *a, int adt,
                           const void *b, int bdt, int64_t n);
cudaError_t hs_cu_scale_cast(cudaStream_t st, void *x, int dt, float a, int64_t n);
cudaError_t hs_cu_copy_2d(cudaStream_t st, void *dst, size_t dst_stride, const void *src,
                          size_t src_stride, int64_t rows, size_t row_bytes);
/* The block quantization of tensor.h (fmt: HS_CU_QUANT_INT8, _FP8_E4M3 or
 * _INT4, hs_quant_fmt's values), the bits of hs_quantize_blocks /
 * hs_dequantize_range. */
#define HS_CU_QUANT_INT8 1
#define HS_CU_QUANT_FP8_E4M3 2
#define HS_CU_QUANT_INT4 3
cudaError_t hs_cu_quantize(cudaStream_t st, void *packed, const void *src, int src_dt, int64_t n,
                           int64_t block, int fmt);
cudaError_t hs_cu_dequantize(cudaStream_t st, void *dst, int dst_dt, const void *packed, int64_t n,
                             int64_t first, int64_t count, int64_t block, int fmt);
cudaError_t hs_cu_dequantize_add(cudaStream_t st, float *dst, const void *packed, int64_t n,
                                 int64_t first, int64_t count, int64_t block, int fmt);

#ifdef __cplusplus
}
#endif

#endif
