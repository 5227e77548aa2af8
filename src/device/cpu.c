/* The cpu backend: host RAM memory (ram.c) and the fast kernels: tensor/'s
 * oneDNN GEMM and vectorised element loops, and the threaded model and
 * optimizer kernels of cpu_*.c. */
#include "device/cpu.h"
#include "device/device_backend.h"

void hs_cpu_gemm(hs_stream *s, void *C, const void *A, const void *B, const hs_gemm_shape *g) {
    hs_error e;
    hs_error_clear(&e);
    hs_gemm_shape w = hs_device_gemm_shape(s->dev, g);
    if (hs_gemm_run(&w, A, B, C, &e) != HS_OK) hs_device_fail(s->dev, &e);
}

/* Casts from 2^17 elements (an unshard's layer of weights, a backward's
 * rounded activation gradient) go over the OpenMP threads in fixed blocks,
 * as the elementwise kernels do; each element gets hs_convert's bits. */
#define CONVERT_PAR_MIN ((int64_t)1 << 17)
#define CONVERT_BLOCK ((int64_t)1 << 14)

void hs_cpu_convert(hs_stream *s, void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt,
                    int64_t n) {
    if (n < CONVERT_PAR_MIN || dst_dt == src_dt) {
        hs_convert(dst, dst_dt, src, src_dt, n);
        return;
    }
    const size_t ds = hs_dtype_size(dst_dt), ss = hs_dtype_size(src_dt);
    const int64_t blocks = (n + CONVERT_BLOCK - 1) / CONVERT_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t i = b * CONVERT_BLOCK, m = n - i < CONVERT_BLOCK ? n - i : CONVERT_BLOCK;
        hs_convert((char *)dst + (size_t)i * ds, dst_dt, (const char *)src + (size_t)i * ss, src_dt,
                   m);
    }
}

void hs_cpu_convert_scaled(hs_stream *s, float *dst, const void *src, hs_dtype src_dt, float a,
                           int64_t n) {
    hs_convert_scaled_f32(dst, src, src_dt, a, n);
}

void hs_cpu_fill(hs_stream *s, float *x, float v, int64_t n) { hs_fill_f32(x, n, v); }

/* Counter-based draws: each block of RNG_BLOCK values is the same slice
 * of the fill whichever thread draws it. */
#define RNG_BLOCK 4096

void hs_cpu_rng_normal(hs_stream *s, float *x, int64_t n, uint64_t seed, uint64_t stream,
                       int64_t offset, float mean, float std) {
    int64_t blocks = (n + RNG_BLOCK - 1) / RNG_BLOCK;
#pragma omp parallel for schedule(static) if (n >= 2 * RNG_BLOCK)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t i = b * RNG_BLOCK, m = n - i < RNG_BLOCK ? n - i : RNG_BLOCK;
        hs_rng_fill_normal(x + i, m, seed, stream, offset + i, mean, std);
    }
}

void hs_cpu_axpy(hs_stream *s, float *y, const float *x, float a, int64_t n) {
    hs_axpy_f32(y, a, x, n);
}

void hs_cpu_scale(hs_stream *s, float *x, float a, int64_t n) { hs_scale_f32(x, a, n); }

void hs_cpu_add(hs_stream *s, float *y, const float *x, int64_t n) { hs_add_f32(y, x, n); }

void hs_cpu_add_to_zero(hs_stream *s, float *y, const float *x, int64_t n) {
    hs_add_to_zero_f32(y, x, n);
}

void hs_cpu_sumsq(hs_stream *s, double *out, const float *x, int64_t n) {
    *out = hs_sumsq_f32(x, n);
}
void hs_cpu_sumsq_many(hs_stream *s, double *out, const float *const *x, const int64_t *n,
                       int count) {
    for (int i = 0; i < count; i++) out[i] = hs_sumsq_f32(x[i], n[i]);
}

void hs_cpu_round(hs_stream *s, float *x, hs_dtype dt, int64_t n) { hs_round_f32(x, dt, n); }

/* The residual adds the model kept before the table had them. */
void hs_cpu_add_cast(hs_stream *s, void *out, hs_dtype odt, const void *a, hs_dtype adt,
                     const void *b, hs_dtype bdt, int64_t n) {
    for (int64_t i = 0; i < n; i++) hs_st(out, odt, i, hs_ld(a, adt, i) + hs_ld(b, bdt, i));
}

/* Every entry of the list, each hs_cpu_<name> (cpu.h). */
#define HS_CPU_ENTRY(name, params, args, devs) .name = hs_cpu_##name,
static const hs_device_kernels cpu_kernels = {HS_DEVICE_KERNEL_LIST(HS_CPU_ENTRY)};
#undef HS_CPU_ENTRY

const hs_device_kernels *hs_device_cpu_kernels(void) { return &cpu_kernels; }

hs_status hs_device_cpu_init(hs_device *d, hs_error *e) {
    d->kind = HS_DEVICE_CPU;
    d->name = "cpu";
    d->ops = &hs_ram_ops;
    d->k = &cpu_kernels;
    d->ctx = NULL;
    return hs_ram_memory_init(d, e);
}
