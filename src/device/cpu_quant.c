/* The cpu backend's block quantization (FSDP's compressed all-gather): the
 * tensor layer's scalar routines, the blocks (or the range) shared out over
 * the threads; each block is one thread's, so the bits are the one-thread
 * bits. */
#include "device/cpu.h"

/* Blocks, or values, a thread takes at least. */
#define QUANT_PAR_MIN (1 << 16)

void hs_cpu_quantize(hs_stream *s, void *packed, const void *src, hs_dtype src_dt, int64_t n,
                     int64_t block, hs_quant_fmt f) {
    int64_t blocks = (n + block - 1) / block, per = (QUANT_PAR_MIN + block - 1) / block;
    int64_t parts = (blocks + per - 1) / per;
#pragma omp parallel for schedule(static) if (parts > 1)
    for (int64_t t = 0; t < parts; t++) {
        int64_t b1 = (t + 1) * per < blocks ? (t + 1) * per : blocks;
        hs_quantize_blocks(packed, src, src_dt, n, block, f, t * per, b1);
    }
}

void hs_cpu_dequantize(hs_stream *s, void *dst, hs_dtype dst_dt, const void *packed, int64_t n,
                       int64_t first, int64_t count, int64_t block, hs_quant_fmt f) {
    int64_t parts = (count + QUANT_PAR_MIN - 1) / QUANT_PAR_MIN;
    size_t es = hs_dtype_size(dst_dt);
#pragma omp parallel for schedule(static) if (parts > 1)
    for (int64_t t = 0; t < parts; t++) {
        int64_t lo = t * QUANT_PAR_MIN, k = count - lo < QUANT_PAR_MIN ? count - lo : QUANT_PAR_MIN;
        hs_dequantize_range((char *)dst + (size_t)lo * es, dst_dt, packed, n, first + lo, k, block,
                            f);
    }
}

void hs_cpu_dequantize_add(hs_stream *s, float *dst, const void *packed, int64_t n, int64_t first,
                           int64_t count, int64_t block, hs_quant_fmt f) {
    int64_t parts = (count + QUANT_PAR_MIN - 1) / QUANT_PAR_MIN;
#pragma omp parallel for schedule(static) if (parts > 1)
    for (int64_t t = 0; t < parts; t++) {
        int64_t lo = t * QUANT_PAR_MIN, k = count - lo < QUANT_PAR_MIN ? count - lo : QUANT_PAR_MIN;
        hs_dequantize_add_f32(dst + lo, packed, n, first + lo, k, block, f);
    }
}
