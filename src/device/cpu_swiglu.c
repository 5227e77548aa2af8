/* SwiGLU gate of the Llama MLP: silu(gate) * up, in fp32. The elements go
 * in chunks split over the GEMM threads (OpenMP) when there are enough of
 * them: every element is computed the same way whatever the split. Each
 * chunk loop is inlined once per storage dtype (the switches below), so
 * that its loads, stores and e^x vectorise. */
#include <math.h>

#include "device/cpu.h"

#define CHUNK 8192

static inline __attribute__((always_inline)) void fwd(void *out, const void *gate, const void *up,
                                                      hs_dtype dt, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        float g = hs_ld(gate, dt, i);
        hs_st(out, dt, i, g / (1.0f + hs_expf(-g)) * hs_ld(up, dt, i));
    }
}

static inline __attribute__((always_inline)) void
fwd_any(void *out, const void *gate, const void *up, hs_dtype dt, int64_t lo, int64_t hi) {
    switch (dt) {
    case HS_DTYPE_F32: fwd(out, gate, up, HS_DTYPE_F32, lo, hi); break;
    case HS_DTYPE_BF16: fwd(out, gate, up, HS_DTYPE_BF16, lo, hi); break;
    default: fwd(out, gate, up, dt, lo, hi); break;
    }
}

/* The chunk loop, and its AVX-512 clone (HS_WIDE): the same bits. */
static void fwd_chunk(void *out, const void *gate, const void *up, hs_dtype dt, int64_t lo,
                      int64_t hi) {
    fwd_any(out, gate, up, dt, lo, hi);
}

HS_WIDE static void fwd_chunk_wide(void *out, const void *gate, const void *up, hs_dtype dt,
                                   int64_t lo, int64_t hi) {
    fwd_any(out, gate, up, dt, lo, hi);
}

void hs_swiglu_forward(void *out /* N,F */, const void *gate /* N,F */, const void *up /* N,F */,
                       hs_dtype dt, int64_t n) {
    int64_t chunks = (n + CHUNK - 1) / CHUNK;
    void (*chunk)(void *, const void *, const void *, hs_dtype, int64_t, int64_t) =
        hs_cpu_wide_vectors() ? fwd_chunk_wide : fwd_chunk;
#pragma omp parallel for schedule(static) if (n >= HS_PAR_MIN)
    for (int64_t c = 0; c < chunks; c++)
        chunk(out, gate, up, dt, c * CHUNK, c * CHUNK + CHUNK < n ? c * CHUNK + CHUNK : n);
}

/* d silu(g)/dg = sig(g) * (1 + g * (1 - sig(g))); added to dgate and dup,
 * or stored over them when set (a constant once inlined). */
static inline __attribute__((always_inline)) void bwd(float *dgate, float *dup, const float *dout,
                                                      const void *gate, const void *up, hs_dtype dt,
                                                      bool set, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        float g = hs_ld(gate, dt, i), u = hs_ld(up, dt, i);
        float sg = 1.0f / (1.0f + hs_expf(-g));
        float dg = dout[i] * u * sg * (1.0f + g * (1.0f - sg)), du = dout[i] * g * sg;
        dgate[i] = set ? dg : dgate[i] + dg;
        dup[i] = set ? du : dup[i] + du;
    }
}

/* The usual dtypes and both modes inlined as constants, so that each loop
 * vectorises (GCC does not unswitch it on a run-time `set`). */
static inline __attribute__((always_inline)) void bwd_any(float *dgate, float *dup,
                                                          const float *dout, const void *gate,
                                                          const void *up, hs_dtype dt, bool set,
                                                          int64_t lo, int64_t hi) {
    if (dt == HS_DTYPE_F32 && set) bwd(dgate, dup, dout, gate, up, HS_DTYPE_F32, true, lo, hi);
    else if (dt == HS_DTYPE_F32) bwd(dgate, dup, dout, gate, up, HS_DTYPE_F32, false, lo, hi);
    else if (dt == HS_DTYPE_BF16 && set)
        bwd(dgate, dup, dout, gate, up, HS_DTYPE_BF16, true, lo, hi);
    else if (dt == HS_DTYPE_BF16) bwd(dgate, dup, dout, gate, up, HS_DTYPE_BF16, false, lo, hi);
    else bwd(dgate, dup, dout, gate, up, dt, set, lo, hi);
}

typedef void bwd_fn(float *, float *, const float *, const void *, const void *, hs_dtype, bool,
                    int64_t, int64_t);

static void bwd_chunk(float *dgate, float *dup, const float *dout, const void *gate, const void *up,
                      hs_dtype dt, bool set, int64_t lo, int64_t hi) {
    bwd_any(dgate, dup, dout, gate, up, dt, set, lo, hi);
}

HS_WIDE static void bwd_chunk_wide(float *dgate, float *dup, const float *dout, const void *gate,
                                   const void *up, hs_dtype dt, bool set, int64_t lo, int64_t hi) {
    bwd_any(dgate, dup, dout, gate, up, dt, set, lo, hi);
}

static bwd_fn *bwd_chunk_fn(void) { return hs_cpu_wide_vectors() ? bwd_chunk_wide : bwd_chunk; }

void hs_swiglu_backward(float *dgate /* N,F */, float *dup /* N,F */, const float *dout /* N,F */,
                        const void *gate, const void *up, hs_dtype dt, int64_t n) {
    hs_swiglu_backward_ex(dgate, dup, false, dout, gate, up, dt, n);
}

void hs_swiglu_backward_ex(float *dgate /* N,F */, float *dup /* N,F */, bool overwrite,
                           const float *dout /* N,F */, const void *gate, const void *up,
                           hs_dtype dt, int64_t n) {
    int64_t chunks = (n + CHUNK - 1) / CHUNK;
    bwd_fn *chunk = bwd_chunk_fn();
#pragma omp parallel for schedule(static) if (n >= HS_PAR_MIN)
    for (int64_t c = 0; c < chunks; c++)
        chunk(dgate, dup, dout, gate, up, dt, overwrite, c * CHUNK,
              c * CHUNK + CHUNK < n ? c * CHUNK + CHUNK : n);
}

/* Each chunk through bwd_chunk into fp32 on the stack, then rounded into
 * dt: the bits of swiglu_bwd and convert, without the fp32 pass through
 * memory. */
void hs_cpu_swiglu_bwd16(hs_stream *s, void *dgate16, void *dup16, const float *dout,
                         const void *gate, const void *up, hs_dtype dt, int64_t n) {
    int64_t chunks = (n + CHUNK - 1) / CHUNK;
    bwd_fn *chunk = bwd_chunk_fn();
#pragma omp parallel for schedule(static) if (n >= HS_PAR_MIN)
    for (int64_t c = 0; c < chunks; c++) {
        float dg[CHUNK], du[CHUNK];
        int64_t lo = c * CHUNK, len = lo + CHUNK < n ? CHUNK : n - lo;
        chunk(dg, du, dout + lo, hs_cat(gate, dt, lo), hs_cat(up, dt, lo), dt, true, 0, len);
        hs_convert(hs_at(dgate16, dt, lo), dt, dg, HS_DTYPE_F32, len);
        hs_convert(hs_at(dup16, dt, lo), dt, du, HS_DTYPE_F32, len);
    }
}

void hs_cpu_swiglu_fwd(hs_stream *s, void *out, const void *gate, const void *up, hs_dtype dt,
                       int64_t n) {
    hs_swiglu_forward(out, gate, up, dt, n);
}

void hs_cpu_swiglu_bwd(hs_stream *s, float *dgate, float *dup, bool overwrite, const float *dout,
                       const void *gate, const void *up, hs_dtype dt, int64_t n) {
    hs_swiglu_backward_ex(dgate, dup, overwrite, dout, gate, up, dt, n);
}
