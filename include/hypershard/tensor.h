/* hypershard/tensor.h — dtypes, conversions, a small tensor view and the CPU
 * kernels every layer above computes with.
 *
 * Contract of this layer:
 * - Three dtypes: F32, BF16, F16. 16-bit values are stored as uint16_t bit
 *   patterns. Conversion from f32 rounds to nearest even; NaN stays NaN
 *   (quiet), +-Inf stays Inf, overflow goes to Inf, subnormals are kept.
 * - hs_tensor is a view: it never owns memory. Shapes have at most 4 dims and
 *   are contiguous row-major. Narrowing on dim 0 is the only slicing FSDP
 *   needs (dim-0 sharding).
 * - Kernels are fp32 and single-threaded except GEMM, which goes to BLAS.
 *   Mixed-precision GEMM converts 16-bit operands to fp32 tiles and
 *   accumulates in fp32; the result is rounded once when stored.
 */
#ifndef HYPERSHARD_TENSOR_H
#define HYPERSHARD_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hypershard/base.h"

/* The floating dtypes a tensor is held in, then U8: raw bytes on the wire
 * (a block-quantized all-gather, tensor/quant.c), which only collectives
 * that move data without arithmetic take. */
typedef enum hs_dtype {
    HS_DTYPE_F32 = 0,
    HS_DTYPE_BF16,
    HS_DTYPE_F16,
    HS_DTYPE_U8,
    HS_DTYPE_COUNT
} hs_dtype;

size_t hs_dtype_size(hs_dtype dt);
/* fp32, bf16 or fp16: a dtype tensors hold and arithmetic reads. */
static inline bool hs_dtype_is_float(hs_dtype dt) { return dt >= HS_DTYPE_F32 && dt < HS_DTYPE_U8; }

/* How a tensor lies on one dim of a device mesh (DTensor placements):
 * every rank holds all of it (Replicate), a torch.chunk slice along tensor
 * dim `dim` (Shard), or a summand of it (Partial). The TP planner sets one
 * per parameter; FSDP reads it and never builds one. */
typedef enum hs_placement_kind {
    HS_PLACEMENT_REPLICATE = 0,
    HS_PLACEMENT_SHARD,
    HS_PLACEMENT_PARTIAL,
    HS_PLACEMENT_KIND_COUNT
} hs_placement_kind;

typedef struct hs_placement {
    hs_placement_kind kind;
    int dim; /* tensor dim for SHARD */
} hs_placement;

/* "Replicate()", "Shard(1)", "Partial()" into buf; returns buf. */
const char *hs_placement_str(hs_placement p, char *buf, size_t cap);
/* "float32", "bfloat16", "float16" — the names the YAML uses ("uint8"). */
const char *hs_dtype_name(hs_dtype dt);
/* Parses the YAML names of the floating dtypes (also "fp32"/"bf16"/
 * "fp16"). false if unknown. */
bool hs_dtype_parse(const char *s, hs_dtype *out);

/* bfloat16 <-> fp32 inline, so that element loops over bf16 data
 * vectorise: round to nearest even, NaN kept quiet with its top payload. */
static inline uint16_t hs_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x0040u);
    /* Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even;
     * a carry out of the mantissa lands in the exponent, which is also how
     * the largest finite values overflow to Inf. */
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float hs_bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}
uint16_t hs_f32_to_f16(float f);
float hs_f16_to_f32(uint16_t h);
/* Round a float to the given dtype and back (identity for F32). */
float hs_round_to(hs_dtype dt, float f);

/* dst[i] = convert(src[i]) for n elements; any pair of dtypes; vectorised,
 * on the calling thread. src and dst may be the same pointer only when the
 * dtypes are equal. */
void hs_convert(void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt, int64_t n);
/* dst[i] = a * (float)src[i]: the bits of hs_convert followed by
 * hs_scale_f32, in one pass over memory. */
void hs_convert_scaled_f32(float *dst, const void *src, hs_dtype src_dt, float a, int64_t n);
/* The code paths hs_convert has, slowest first: the scalar routines above,
 * 8 lanes of AVX2 + F16C (built in when the build machine has them), 16
 * lanes of AVX-512 with VCVTNEPS2BF16 (chosen at run time where the CPU has
 * AVX512-BF16). Every path gives the scalar routines' bits. */
typedef enum hs_convert_path {
    HS_CONVERT_SCALAR = 0,
    HS_CONVERT_AVX2,
    HS_CONVERT_AVX512,
    HS_CONVERT_PATH_COUNT
} hs_convert_path;
/* The path hs_convert takes on this CPU, and its name ("avx512_bf16",
 * "avx2_f16c", "scalar"). */
hs_convert_path hs_convert_best_path(void);
const char *hs_convert_path_name(hs_convert_path p);
/* hs_convert on one given path (tests hold every path to the scalar
 * bits); a path this build or CPU lacks falls back to the next slower one. */
void hs_convert_on(hs_convert_path p, void *dst, hs_dtype dst_dt, const void *src, hs_dtype src_dt,
                   int64_t n);

#define HS_TENSOR_MAX_DIMS 4

typedef struct hs_tensor {
    void *data;
    hs_dtype dtype;
    int ndim;
    int64_t shape[HS_TENSOR_MAX_DIMS];
} hs_tensor;

hs_tensor hs_tensor_make(void *data, hs_dtype dt, int ndim, const int64_t *shape);
int64_t hs_tensor_numel(const hs_tensor *t);
size_t hs_tensor_bytes(const hs_tensor *t);
/* Elements in one dim-0 row (product of dims 1..). 1 for a 1-D tensor. */
int64_t hs_tensor_row_numel(const hs_tensor *t);
/* Rows [start, start+len) of dim 0; len may be 0 (data then points at the
 * would-be start, never dereferenced). */
hs_tensor hs_tensor_narrow0(const hs_tensor *t, int64_t start, int64_t len);
/* "[4, 16]" into buf. */
const char *hs_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

/* ------------------------------------------------------------------ BLAS */

/* Row-major C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C.
 * op(X) = X^T when trans is true. lda/ldb/ldc are row strides. HS_ERR_OOM
 * when oneDNN cannot allocate its scratch (e may be NULL). */
hs_status hs_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                   int64_t ldc, hs_error *e);
/* The same with A, B, C each in its own dtype; accumulation in fp32, C
 * rounded once when stored. Two 16-bit operands of one dtype run oneDNN's
 * matmul (native bf16 dot products where the CPU has them); other mixes
 * widen the 16-bit operands into one malloc'd fp32 scratch per call.
 * HS_ERR_OOM, C untouched, when that scratch cannot be allocated. */
hs_status hs_gemm_ex(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const void *A, hs_dtype a_dt, int64_t lda, const void *B, hs_dtype b_dt,
                     int64_t ldb, float beta, void *C, hs_dtype c_dt, int64_t ldc, hs_error *e);
/* One GEMM's fixed part: everything of an hs_gemm_ex call but the
 * operands' addresses. */
typedef struct hs_gemm_shape {
    bool trans_a, trans_b;
    int64_t M, N, K;
    float alpha, beta;
    hs_dtype a_dt, b_dt, c_dt;
    int64_t lda, ldb, ldc;
    /* 16-bit operands widened to fp32 and one sgemm run even where oneDNN
     * has their matmul: where that matmul is the slower engine
     * (hs_gemm16_native false), as on a CPU without it. */
    bool widen;
    /* Rows in calls of one fixed block size, each single-threaded, shared
     * over the calling thread's OpenMP threads (the last block padded): a
     * row of C has the same bits whatever M, the row's place and the
     * thread count (train.reproducibility: layout; tensor/gemm.c). */
    bool split_rows;
} hs_gemm_shape;
/* hs_gemm_ex for one shape, honouring its widen. */
hs_status hs_gemm_run(const hs_gemm_shape *s, const void *A, const void *B, void *C, hs_error *e);
/* oneDNN's matmul for one shape of two 16-bit operands of one dtype
 * (M, N, K > 0), built once: *out NULL (HS_OK) when oneDNN has no such
 * matmul here; HS_ERR_OOM when the plan itself cannot be allocated.
 * Running it computes what hs_gemm_ex computes for that shape, to the bit,
 * without rebuilding the matmul. A plan belongs to one thread at a time. */
typedef struct hs_gemm_plan hs_gemm_plan;
hs_status hs_gemm_plan_create(const hs_gemm_shape *s, hs_gemm_plan **out, hs_error *e);
void hs_gemm_plan_run(hs_gemm_plan *p, const void *A, const void *B, void *C);
void hs_gemm_plan_free(hs_gemm_plan *p);
/* The plans of up to HS_GEMM_CACHE_SIZE shapes, built at first use, owned
 * by the caller (one thread at a time) and freed by it. */
#define HS_GEMM_CACHE_SIZE 16
typedef struct hs_gemm_cache {
    int n;
    hs_gemm_shape shapes[HS_GEMM_CACHE_SIZE];
    hs_gemm_plan *plans[HS_GEMM_CACHE_SIZE]; /* NULL: no such matmul here */
} hs_gemm_cache;
void hs_gemm_cache_init(hs_gemm_cache *c);
void hs_gemm_cache_free(hs_gemm_cache *c);
/* hs_gemm_ex(s, A, B, C) through c's plan for s when it has or can build
 * one; other shapes and dtypes (fp32, mixed) go to hs_gemm_ex. HS_ERR_OOM
 * as hs_gemm_ex, or when a plan cannot be allocated. */
hs_status hs_gemm_cached(hs_gemm_cache *c, const hs_gemm_shape *s, const void *A, const void *B,
                         void *C, hs_error *e);
/* GEMM threads of the calling thread (oneDNN's OpenMP team). */
void hs_blas_set_threads(int n);
int hs_blas_get_threads(void);
/* The instruction set oneDNN's kernels use on this CPU: "avx512_core_amx",
 * "avx512_core_bf16", "avx512_core", "avx2" or "sse41". */
const char *hs_gemm_isa(void);
/* The CPU tier: HS_CPU_ISA = avx2 | avx512 | avx512_bf16 | amx | native
 * caps oneDNN's kernels and hs_convert's paths at that tier (the CPU's own
 * flags still decide below it). Call before any GEMM or conversion;
 * HS_ERR_USAGE naming the variable for an unknown value (of HS_CPU_ISA or
 * HS_CPU_GEMM16). */
hs_status hs_cpu_isa_apply(hs_error *e);
/* Whether the element kernels may take their AVX-512 clones (16 fp32
 * lanes; HS_WIDE in src/device/cpu_kernels.h): the CPU has AVX-512 F, VL,
 * BW and DQ and the tier in force is avx512 or above (HS_CPU_ISA=avx2
 * keeps them off). A clone is the same arithmetic per element as the
 * x86-64-v3 loop, so the choice changes time, not bits. */
bool hs_cpu_wide_vectors(void);
/* HS_WIDE compiles a function a second time for AVX-512 with 512-bit
 * vectors: an element loop's clone, taken where hs_cpu_wide_vectors(). The
 * kernels keep one body (an always_inline function) and two thin wrappers,
 * one of them HS_WIDE; inlined into the clone, the body runs 16 lanes in
 * the same IEEE operations per element (no contraction, nothing
 * reassociated), so both give the same bits. GCC only: elsewhere the
 * clone is the plain function and the choice does nothing. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HS_WIDE                                                                                    \
    __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,prefer-vector-width=512")))
#else
#define HS_WIDE
#endif
/* This CPU's nominal peak for GEMMs of dtype dt at the tier in force:
 * the highest clock the system states x the FLOPs per cycle of the ISA
 * and dtype (cpu_peak.c lists them). dtype is the one the peak is for
 * (fp32 where dt is not multiplied natively); cores are the physical ones
 * online. */
typedef struct hs_cpu_peak {
    double ghz;
    int flops_per_cycle;
    double flops_per_core;
    int cores;
    hs_dtype dtype;
    const char *isa;          /* hs_gemm_isa() */
    const char *clock_source; /* "cpufreq's maximum", "the model name", ... */
} hs_cpu_peak;
hs_cpu_peak hs_cpu_nominal_peak(hs_dtype dt);
/* Whether hs_gemm_ex multiplies operands of 16-bit dtype dt into a C of
 * c_dt natively here (oneDNN has that matmul on this CPU); else the
 * operands are widened to fp32. */
bool hs_gemm_native(hs_dtype dt, hs_dtype c_dt);
/* Whether hypershard multiplies 16-bit dt operands by oneDNN's matmul here
 * (else widened to fp32, one sgemm): where oneDNN has it and it is the
 * faster engine. bf16: with AMX, or AVX512-BF16 on an AMD CPU (Zen 4
 * measured: the bf16 step 1.6x the fp32 one); not on an Intel Xeon
 * without AMX (measured at half sgemm's rate) nor below AVX512-BF16
 * (emulated). f16: wherever oneDNN has it (docs/numerics.md).
 * HS_CPU_GEMM16 = native | widened overrides the choice (auto: unset). A
 * pure function of the CPU, the tier and the environment: every rank of a
 * machine, and the plan, decide alike. */
bool hs_gemm16_native(hs_dtype dt);

/* ------------------------------------------------ block quantization */

/* A wire format for values that only travel (FSDP's compressed parameter
 * all-gather and gradient reduction): n values in blocks of `block`, each
 * block a scale s and one code per value, the value read back as
 * s * decode(code).
 *   INT8      s = amax / 127, byte = round-half-even(x / s) in [-127, 127]
 *   FP8_E4M3  s = amax / 448, byte = x / s in OCP e4m3 (round to nearest
 *             even, 448 the largest finite; 0x7F is NaN)
 *   INT4      s = amax / 7, nibble = round-half-even(x / s) in [-7, 7]
 *             (two's complement), two a byte, value 2k in the low nibble
 *             of byte k; `block` must be even (each byte one block's)
 * A block of zeros has s = 0; a block holding Inf or NaN reads back NaN
 * everywhere (the non-finite check then sees it). The packed buffer is the
 * codes, zero-padded to a multiple of 4 bytes, then the fp32 scales: its size
 * is hs_quant_packed_bytes, a multiple of 4, so packed buffers laid back to
 * back (an all-gather's output) keep their scales aligned. */
typedef enum hs_quant_fmt {
    HS_QUANT_NONE = 0,
    HS_QUANT_INT8,
    HS_QUANT_FP8_E4M3,
    HS_QUANT_INT4,
    HS_QUANT_FMT_COUNT
} hs_quant_fmt;

/* "none", "int8", "fp8_e4m3", "int4" (the YAML names; none is null there). */
const char *hs_quant_fmt_name(hs_quant_fmt f);
size_t hs_quant_packed_bytes(int64_t n, int64_t block, hs_quant_fmt f);
uint8_t hs_f32_to_e4m3(float x); /* saturating: |x| >= 448 gives +-448 */
float hs_e4m3_to_f32(uint8_t c);
/* Blocks [b0, b1) of src (n values of a float dtype) into packed. */
void hs_quantize_blocks(void *packed, const void *src, hs_dtype src_dt, int64_t n, int64_t block,
                        hs_quant_fmt f, int64_t b0, int64_t b1);
/* dst[i] = value first + i of the n packed ones, for i < count, stored in
 * a float dtype (rounded once from the fp32 product s * decode). */
void hs_dequantize_range(void *dst, hs_dtype dst_dt, const void *packed, int64_t n, int64_t first,
                         int64_t count, int64_t block, hs_quant_fmt f);
/* dst[i] += value first + i (fp32: the sum of the rounded product, the bits
 * of hs_dequantize_range into a copy and hs_add_f32): a quantized
 * reduction's accumulation in one pass. */
void hs_dequantize_add_f32(float *dst, const void *packed, int64_t n, int64_t first, int64_t count,
                           int64_t block, hs_quant_fmt f);

/* ----------------------------------------------------- elementwise (fp32) */

void hs_fill_f32(float *x, int64_t n, float v);
void hs_add_f32(float *y, const float *x, int64_t n); /* y += x       */
/* y = 0 + x: the bits of hs_add_f32 into a zeroed y (-0 becomes +0),
 * without the zero fill or reading y. */
void hs_add_to_zero_f32(float *y, const float *x, int64_t n);
void hs_axpy_f32(float *y, float a, const float *x, int64_t n); /* y += a*x     */
void hs_scale_f32(float *x, float a, int64_t n);                /* x *= a       */
double hs_sum_f32(const float *x, int64_t n);                   /* fp64 accum   */
double hs_sumsq_f32(const float *x, int64_t n);                 /* fp64 accum   */

/* The exact sum of squares of fp32 values, held in fixed point
 * (tensor/exact_sum.c): adding, merging and splitting never round, so the
 * value is the same whatever the order and the split of the values among
 * calls, threads or ranks. Merge two by adding their limbs (a rank's limbs
 * travel as int64s). */
#define HS_XSUM_LIMBS 20
typedef struct hs_xsum {
    int64_t limb[HS_XSUM_LIMBS]; /* 32 bits each; the lowest bit is 2^-298 */
    int64_t nonfinite;           /* 1: an infinity was added, 2: a NaN */
} hs_xsum;
void hs_xsum_init(hs_xsum *x);
void hs_xsum_add_squares(hs_xsum *x, const float *v, int64_t n);
void hs_xsum_merge(hs_xsum *into, const hs_xsum *from);
/* The sum as a double: a function of the exact sum alone (NaN, +inf where
 * one was added). */
double hs_xsum_value(const hs_xsum *x);
/* Pairwise trees (tensor/tree.c): the order train.reproducibility: layout
 * adds per-sequence, per-rank and per-micro-batch values in, the largest
 * power of two below n on the left. hs_tree_f64: the tree sum of n >= 1
 * doubles v[0], v[stride], ... */
double hs_tree_f64(const double *v, int n, int stride);
/* The same tree built one part at a time (a binary counter) over buffers
 * the caller keeps in slots 0, 1, ...: write the next part into slot
 * s = top, push, then for k < the merges returned add slot s - k into
 * slot s - k - 1 (left + right); the subtree lies in slot s - merges. */
#define HS_TREE_MAX_LEVELS 31
typedef struct hs_tree_stack {
    int level[HS_TREE_MAX_LEVELS + 1]; /* each slot's subtree holds 2^level parts */
    int top;                           /* slots in use; 0: empty */
} hs_tree_stack;
int hs_tree_stack_push(hs_tree_stack *t);
float hs_max_abs_f32(const float *x, int64_t n);
/* The index of x's first NaN or infinity, -1 if every element is finite;
 * blocks over the threads from 64K elements (the answer does not depend
 * on them). */
int64_t hs_first_nonfinite_f32(const float *x, int64_t n);
/* max_i |a-b| / max(|b|, floor); for tests and parity reports. */
double hs_max_rel_diff_f32(const float *a, const float *b, int64_t n, double floor);

#endif
