/* Private to src/tensor/: the element loops of each hs_convert path, over
 * one contiguous range (convert.c splits the work and picks the path;
 * convert_x86.c has the vector loops). */
#ifndef HS_TENSOR_CONVERT_KERNELS_H
#define HS_TENSOR_CONVERT_KERNELS_H

#include "hypershard/tensor.h"

typedef struct hs_convert_kernels {
    void (*to_bf16)(uint16_t *dst, const float *src, int64_t n);
    void (*to_f16)(uint16_t *dst, const float *src, int64_t n);
    void (*from_bf16)(float *dst, const uint16_t *src, int64_t n);
    void (*from_f16)(float *dst, const uint16_t *src, int64_t n);
} hs_convert_kernels;

/* The vector loops of path p (AVX2 or AVX-512), or NULL when this build or
 * this CPU does not have them. */
const hs_convert_kernels *hs_convert_vector_kernels(hs_convert_path p);

/* Whether the process's CPU tier (cpu_isa.c: HS_CPU_ISA, or oneDNN's
 * ONEDNN_MAX_CPU_ISA) lets path p run; the CPU's own flags are checked
 * apart. */
bool hs_cpu_isa_allows(hs_convert_path p);

#endif
