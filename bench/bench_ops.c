/* hypershard bench ops: each kernel of the device table on every compiled
 * backend, on one shape per op: the best time of a few runs, and GFLOP/s
 * (GEMM-like ops, attention, Newton-Schulz) or GB/s (bytes read and written
 * once, for the element and copy ops). An entry a backend lacks is "n/a".
 * Beside each GB/s figure: its share of the machine's streaming rate,
 * STREAM's triad (c = a + s b) over the same element count and the same
 * threads, measured first. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cli/commands.h"
#include "hypershard/base.h"
#include "hypershard/device.h"

typedef struct ops_bufs {
    float *a, *b, *c, *d, *e, *f; /* fp32 scratch, `cap` floats each */
    uint16_t *h1, *h2, *h3;       /* bf16 scratch */
    uint8_t *q;                   /* a packed int8 copy of a (blocks of Q_BLOCK) */
    int32_t *ids;
    int64_t cap;
    bool quick;
} ops_bufs;

typedef struct op_size {
    int64_t N, C, F, V, T, HD, NH, M; /* per-op meaning below */
} op_size;

/* One op: runs once on d; work is its FLOPs (rate in GFLOP/s) or, when
 * `bytes` is set, its bytes moved (GB/s). prep, where set, lays out what
 * the run reads and is not timed (what a step builds once, not per call). */
typedef struct op_def {
    const char *name;
    const char *shape;
    bool (*has)(const hs_device_kernels *k);
    void (*run)(hs_device *d, ops_bufs *b);
    double (*work)(const ops_bufs *b);
    bool bytes;
    void (*prep)(hs_device *d, ops_bufs *b);
} op_def;

#define SZ(b) ((b)->quick ? 1 : 2) /* the full run doubles the sizes */

static int64_t g_n(const ops_bufs *b) { return 256 * SZ(b); }

static bool has_gemm(const hs_device_kernels *k) { return k->gemm != NULL; }
static void run_gemm32(hs_device *d, ops_bufs *b) {
    int64_t n = g_n(b);
    hs_dev_gemm(d, false, true, n, n, n, 1.0f, b->a, HS_DTYPE_F32, n, b->b, HS_DTYPE_F32, n, 0.0f,
                b->c, HS_DTYPE_F32, n);
}
static void run_gemm16(hs_device *d, ops_bufs *b) {
    int64_t n = g_n(b);
    hs_dev_gemm(d, false, true, n, n, n, 1.0f, b->h1, HS_DTYPE_BF16, n, b->h2, HS_DTYPE_BF16, n,
                0.0f, b->h3, HS_DTYPE_BF16, n);
}
static double w_gemm(const ops_bufs *b) { return 2.0 * g_n(b) * g_n(b) * g_n(b); }

static int64_t e_n(const ops_bufs *b) { return (int64_t)1 << (b->quick ? 20 : 22); }
static bool has_convert(const hs_device_kernels *k) { return k->convert != NULL; }
static void run_convert(hs_device *d, ops_bufs *b) {
    hs_dev_convert(d, b->h1, HS_DTYPE_BF16, b->a, HS_DTYPE_F32, e_n(b));
}
static double w_convert(const ops_bufs *b) { return 6.0 * e_n(b); }
static bool has_axpy(const hs_device_kernels *k) { return k->axpy != NULL; }
static void run_axpy(hs_device *d, ops_bufs *b) { hs_dev_axpy(d, b->c, 0.5f, b->a, e_n(b)); }
static double w_axpy(const ops_bufs *b) { return 12.0 * e_n(b); }
static bool has_copy(const hs_device_kernels *k) { return k->copy_2d != NULL; }
static void run_copy(hs_device *d, ops_bufs *b) {
    /* every other 1 KiB row of a into c: FSDP's strided pack */
    int64_t rows = e_n(b) / 512;
    hs_dev_copy_2d(d, b->c, 1024, b->a, 2048, rows, 1024);
}
static double w_copy(const ops_bufs *b) { return 2.0 * (double)(e_n(b) / 512) * 1024; }

static int64_t r_rows(const ops_bufs *b) { return 1024 * SZ(b); }
#define R_C 768
static bool has_rms(const hs_device_kernels *k) { return k->rmsnorm_fwd && k->rmsnorm_bwd; }
static void run_rms_fwd(hs_device *d, ops_bufs *b) {
    d->k->rmsnorm_fwd(d->stream, b->c, b->f, b->a, HS_DTYPE_F32, b->b, HS_DTYPE_F32, r_rows(b), R_C,
                      1e-5f);
}
static void run_rms_bwd(hs_device *d, ops_bufs *b) {
    d->k->rmsnorm_bwd(d->stream, b->d, b->e, HS_DTYPE_F32, b->c, b->a, HS_DTYPE_F32, b->b, b->f,
                      HS_DTYPE_F32, r_rows(b), R_C, NULL);
}
static double w_rms(const ops_bufs *b) { return 8.0 * r_rows(b) * R_C; }
static double w_rms_bwd(const ops_bufs *b) { return 16.0 * r_rows(b) * R_C; }

static bool has_swiglu(const hs_device_kernels *k) { return k->swiglu_fwd && k->swiglu_bwd; }
static void run_swiglu_fwd(hs_device *d, ops_bufs *b) {
    d->k->swiglu_fwd(d->stream, b->c, b->a, b->b, HS_DTYPE_F32, e_n(b));
}
static void run_swiglu_bwd(hs_device *d, ops_bufs *b) {
    d->k->swiglu_bwd(d->stream, b->d, b->e, true, b->c, b->a, b->b, HS_DTYPE_F32, e_n(b));
}
static double w_swiglu(const ops_bufs *b) { return 12.0 * e_n(b); }
static double w_swiglu_bwd(const ops_bufs *b) { return 20.0 * e_n(b); }

static bool has_rope(const hs_device_kernels *k) {
    return k->rope_fwd && k->rope_bwd && k->rope_tables;
}
static int rope_T(const ops_bufs *b) { return 512 * SZ(b); }
/* the tables, built once at the model's creation, in e and f */
static void prep_rope(hs_device *d, ops_bufs *b) {
    float inv[32];
    hs_rope_inv_freq(inv, 64, 10000.0);
    d->k->rope_tables(d->stream, b->e, b->f, rope_T(b), 64, inv, 1.0f);
}
static void run_rope_fwd(hs_device *d, ops_bufs *b) {
    d->k->rope_fwd(d->stream, b->c, HS_DTYPE_F32, b->e, b->f, 1, rope_T(b), 12, 64);
}
static void run_rope_bwd(hs_device *d, ops_bufs *b) {
    d->k->rope_bwd(d->stream, b->c, b->e, b->f, 1, rope_T(b), 12, 64);
}
static double w_rope(const ops_bufs *b) { return 8.0 * rope_T(b) * 12 * 64; }

static int a_T(const ops_bufs *b) { return b->quick ? 256 : 512; }
#define A_NH 8
#define A_HD 64
static bool has_att(const hs_device_kernels *k) { return k->attention_fwd && k->attention_bwd; }
static void run_att_fwd(hs_device *d, ops_bufs *b) {
    hs_att_rows r = hs_att_rows_all(a_T(b));
    d->k->attention_fwd(d->stream, b->c, HS_DTYPE_F32, b->f, b->a, b->b, b->d, HS_DTYPE_F32, 1,
                        A_NH, A_NH, A_HD, &r, NULL);
}
static void run_att_bwd(hs_device *d, ops_bufs *b) {
    hs_att_rows r = hs_att_rows_all(a_T(b));
    d->k->attention_bwd(d->stream, b->e, b->e, b->e, b->c, b->c, HS_DTYPE_F32, b->a, b->b, b->d,
                        b->f, HS_DTYPE_F32, 1, A_NH, A_NH, A_HD, &r, NULL);
}
/* causal: half of the T x T scores, QK^T and PV */
static double w_att(const ops_bufs *b) { return 2.0 * a_T(b) * a_T(b) * A_HD * A_NH; }
static double w_att_bwd(const ops_bufs *b) { return 2.5 * w_att(b); }

static int64_t x_rows(const ops_bufs *b) { return 256 * SZ(b); }
#define X_V 8192
static bool has_xent(const hs_device_kernels *k) { return k->xent != NULL; }
static void run_xent(hs_device *d, ops_bufs *b) {
    double loss;
    int64_t valid;
    d->k->xent(d->stream, &loss, &valid, b->c, b->a, b->ids, x_rows(b), X_V, 1.0f);
}
static double w_xent(const ops_bufs *b) { return 8.0 * x_rows(b) * X_V; }

static bool has_emb(const hs_device_kernels *k) { return k->embedding_fwd != NULL; }
static void run_emb(hs_device *d, ops_bufs *b) {
    d->k->embedding_fwd(d->stream, b->c, HS_DTYPE_F32, b->ids, b->a, HS_DTYPE_F32, x_rows(b) * 4,
                        R_C, 0, X_V);
}
static double w_emb(const ops_bufs *b) { return 8.0 * x_rows(b) * 4 * R_C; }

static bool has_adamw(const hs_device_kernels *k) { return k->adamw != NULL; }
static void adamw_on(hs_device *d, ops_bufs *b, void *p, hs_dtype pdt) {
    hs_adamw_hparams h = {0.9f, 0.95f, 0.1f, 0.05f, 1e-3f, 0.99f, 1e-8f, 1.0f};
    d->k->adamw(d->stream, p, pdt, b->d, b->e, b->a, &h, e_n(b));
}
static void run_adamw(hs_device *d, ops_bufs *b) { adamw_on(d, b, b->c, HS_DTYPE_F32); }
static double w_adamw(const ops_bufs *b) { return 28.0 * e_n(b); }
/* bf16 parameters (h3, the bf16 GEMM's output) with fp32 states */
static void run_adamw16(hs_device *d, ops_bufs *b) { adamw_on(d, b, b->h3, HS_DTYPE_BF16); }
static double w_adamw16(const ops_bufs *b) { return 24.0 * e_n(b); }
static bool has_muon_update(const hs_device_kernels *k) { return k->muon_update != NULL; }
static void run_muon_update(hs_device *d, ops_bufs *b) {
    d->k->muon_update(d->stream, b->h3, HS_DTYPE_BF16, b->a, 0.99f, 1e-3f, e_n(b));
}
static double w_muon_update(const ops_bufs *b) { return 8.0 * e_n(b); }
/* x = -x: the values stay put over the runs */
static bool has_scale_cast(const hs_device_kernels *k) { return k->scale_cast != NULL; }
static void run_scale_cast(hs_device *d, ops_bufs *b) {
    d->k->scale_cast(d->stream, b->h3, HS_DTYPE_BF16, -1.0f, e_n(b));
}
static double w_scale_cast(const ops_bufs *b) { return 4.0 * e_n(b); }

/* FSDP's compressed all-gather: fp32 packed into int8 blocks, and read back
 * into bf16 (the common param_dtype) */
#define Q_BLOCK 256
static bool has_quant(const hs_device_kernels *k) { return k->quantize && k->dequantize; }
static void run_quantize(hs_device *d, ops_bufs *b) {
    hs_dev_quantize(d, b->q, b->a, HS_DTYPE_F32, e_n(b), Q_BLOCK, HS_QUANT_INT8);
}
static double w_quantize(const ops_bufs *b) {
    return 4.0 * e_n(b) + (double)hs_quant_packed_bytes(e_n(b), Q_BLOCK, HS_QUANT_INT8);
}
static void run_dequantize(hs_device *d, ops_bufs *b) {
    hs_dev_dequantize(d, b->h3, HS_DTYPE_BF16, b->q, e_n(b), 0, e_n(b), Q_BLOCK, HS_QUANT_INT8);
}
static double w_dequantize(const ops_bufs *b) {
    return 2.0 * e_n(b) + (double)hs_quant_packed_bytes(e_n(b), Q_BLOCK, HS_QUANT_INT8);
}

static bool has_ns(const hs_device_kernels *k) { return k->muon_newton_schulz != NULL; }
static void run_ns(hs_device *d, ops_bufs *b) {
    int64_t n = 128 * SZ(b);
    d->k->muon_newton_schulz(d->stream, b->c, b->a, n, 3 * n, 5, NULL);
}
/* per step: X X^T (2 n n 3n), A A (2 n^3), P X (2 n n 3n) */
static double w_ns(const ops_bufs *b) {
    double n = 128.0 * SZ(b);
    return 5.0 * (6.0 * n * n * n + 2.0 * n * n * n + 6.0 * n * n * n);
}

static bool has_moe(const hs_device_kernels *k) { return k->moe_route != NULL; }
static void run_moe(hs_device *d, ops_bufs *b) {
    int64_t n = 1024 * SZ(b);
    memcpy(b->e, b->a, (size_t)n * 8 * sizeof(float)); /* the logits become probabilities */
    hs_moe_router r = {.renorm = true, .n_group = 1, .topk_group = 1, .scale = 1.0f};
    d->k->moe_route(d->stream, b->ids, b->f, b->e, NULL, n, 8, 2, r, HS_DTYPE_F32);
    for (int64_t i = 0; i < 2 * n; i++) b->ids[i] = (int32_t)i;
    if (d->k->moe_permute)
        d->k->moe_permute(d->stream, b->c, b->b, b->ids, HS_DTYPE_F32, n, 2, 256);
}
static double w_moe(const ops_bufs *b) { return 2.0 * 2 * 1024 * SZ(b) * 256 * 4; }

/* The router's statistics of 16K|32K tokens over 8 experts, k 2: the
 * selections (ids, i % 8) counted and the probabilities summed. */
static int64_t s_n(const ops_bufs *b) { return 16384 * SZ(b); }
static bool has_moe_stats(const hs_device_kernels *k) { return k->moe_stats != NULL; }
static void run_moe_stats(hs_device *d, ops_bufs *b) {
    memset(b->d, 0, 8 * sizeof(int64_t)); /* the statistics accumulate */
    memset(b->c, 0, 8 * sizeof(double));
    d->k->moe_stats(d->stream, (int64_t *)b->d, (double *)b->c, b->ids, b->a, s_n(b), 8, 2);
}
static double w_moe_stats(const ops_bufs *b) { return (8.0 + 2.0) * 4 * s_n(b); }

static const op_def ops[] = {
    {"gemm fp32", "M=N=K 256|512", has_gemm, run_gemm32, w_gemm, false, NULL},
    {"gemm bf16", "M=N=K 256|512", has_gemm, run_gemm16, w_gemm, false, NULL},
    {"convert f32->bf16", "1M|4M", has_convert, run_convert, w_convert, true, NULL},
    {"axpy", "1M|4M", has_axpy, run_axpy, w_axpy, true, NULL},
    {"copy_2d", "2K|8K rows x 1 KiB", has_copy, run_copy, w_copy, true, NULL},
    {"rmsnorm fwd", "1K|2K x 768", has_rms, run_rms_fwd, w_rms, true, NULL},
    {"rmsnorm bwd", "1K|2K x 768", has_rms, run_rms_bwd, w_rms_bwd, true, NULL},
    {"swiglu fwd", "1M|4M", has_swiglu, run_swiglu_fwd, w_swiglu, true, NULL},
    {"swiglu bwd", "1M|4M", has_swiglu, run_swiglu_bwd, w_swiglu_bwd, true, NULL},
    {"rope fwd", "T 512|1K, 12 x 64", has_rope, run_rope_fwd, w_rope, true, prep_rope},
    {"rope bwd", "T 512|1K, 12 x 64", has_rope, run_rope_bwd, w_rope, true, prep_rope},
    {"attention fwd", "T 256|512, 8 x 64", has_att, run_att_fwd, w_att, false, NULL},
    {"attention bwd", "T 256|512, 8 x 64", has_att, run_att_bwd, w_att_bwd, false, NULL},
    {"xent", "256|512 x 8192", has_xent, run_xent, w_xent, true, NULL},
    {"embedding fwd", "1K|2K x 768", has_emb, run_emb, w_emb, true, NULL},
    {"adamw", "1M|4M", has_adamw, run_adamw, w_adamw, true, NULL},
    {"adamw bf16 param", "1M|4M", has_adamw, run_adamw16, w_adamw16, true, NULL},
    {"muon update bf16", "1M|4M", has_muon_update, run_muon_update, w_muon_update, true, NULL},
    {"scale_cast bf16", "1M|4M", has_scale_cast, run_scale_cast, w_scale_cast, true, NULL},
    {"quantize fp32->int8", "1M|4M", has_quant, run_quantize, w_quantize, true, NULL},
    {"dequant int8->bf16", "1M|4M", has_quant, run_dequantize, w_dequantize, true, NULL},
    {"muon newton-schulz", "128x384|256x768", has_ns, run_ns, w_ns, false, NULL},
    {"moe route(+permute)", "1K|2K x 8, k 2, 256", has_moe, run_moe, w_moe, true, NULL},
    {"moe stats", "16K|32K x 8, k 2", has_moe_stats, run_moe_stats, w_moe_stats, true, NULL},
};

/* n uniform values in [-0.5, 0.5); NULL without memory. */
static float *rnd(int64_t n, uint64_t seed) {
    float *p = malloc((size_t)n * sizeof *p);
    if (!p) return NULL;
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((x >> 40) * (1.0 / (1 << 24))) - 0.5f;
    }
    return p;
}

static int usage(FILE *f, const char *why) {
    if (why) fprintf(f, "hypershard bench ops: %s\n", why);
    fprintf(f, "usage: hypershard bench ops [--quick] [--reps N]\n"
               "  --quick   the smaller shape of each op (the first of the two listed)\n"
               "  --reps N  timed runs per op and backend after one warm-up; the best counts\n"
               "            (default 5, quick 3)\n");
    return 2;
}

static void ops_bufs_free(ops_bufs *b) {
    free(b->a), free(b->b), free(b->c), free(b->d), free(b->e), free(b->f);
    free(b->h1), free(b->h2), free(b->h3), free(b->ids), free(b->q);
}

/* The operands every op reads, `cap` values each. */
static hs_status ops_bufs_alloc(ops_bufs *b, hs_error *e) {
    hs_error_clear(e);
    b->cap = (int64_t)1 << 23;
    b->a = rnd(b->cap, 1), b->b = rnd(b->cap, 2), b->c = rnd(b->cap, 3);
    b->d = rnd(b->cap, 4), b->e = rnd(b->cap, 5), b->f = rnd(b->cap, 6);
    b->h1 = calloc((size_t)b->cap, 2), b->h2 = calloc((size_t)b->cap, 2);
    b->h3 = calloc((size_t)b->cap, 2);
    b->ids = calloc((size_t)b->cap, sizeof *b->ids);
    b->q = malloc(hs_quant_packed_bytes(b->cap, Q_BLOCK, HS_QUANT_INT8));
    if (!b->a || !b->b || !b->c || !b->d || !b->e || !b->f || !b->h1 || !b->h2 || !b->h3 ||
        !b->ids || !b->q)
        return hs_error_oom(e, "bench ops: the operands, %lld elements each (%.0f MiB in all)",
                            (long long)b->cap,
                            (double)b->cap * (6 * 4 + 3 * 2 + 4 + 1) / (1 << 20));
    hs_quantize_blocks(b->q, b->a, HS_DTYPE_F32, b->cap, Q_BLOCK, HS_QUANT_INT8, 0,
                       (b->cap + Q_BLOCK - 1) / Q_BLOCK);
    for (int64_t i = 0; i < b->cap; i++) b->e[i] = b->e[i] * b->e[i]; /* adamw's v >= 0 */
    hs_convert(b->h1, HS_DTYPE_BF16, b->a, HS_DTYPE_F32, b->cap);
    hs_convert(b->h2, HS_DTYPE_BF16, b->b, HS_DTYPE_F32, b->cap);
    return HS_OK;
}

/* The failure of a run: its message, then the exit code. */
static int ops_fail(ops_bufs *b, const hs_error *e) {
    fprintf(stderr, "hypershard bench ops: %s\n", e->msg);
    ops_bufs_free(b);
    return hs_status_exit_code(e->code);
}

/* STREAM's triad over e_n(b) elements in bytes per second (12 a
 * element): the best of `reps` runs after one warm-up, split over the
 * OpenMP threads the kernels use, in static chunks. */
static double stream_rate(ops_bufs *b, int reps) {
    const int64_t n = e_n(b);
    float *x = b->a, *y = b->b, *z = b->f;
    double best = 1e30;
    for (int r = 0; r <= reps; r++) {
        double t0 = hs_now();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) z[i] = x[i] + 0.5f * y[i];
        double t = hs_now() - t0;
        if (r > 0 && t < best) best = t;
    }
    return 12.0 * (double)n / best;
}

/* Best seconds of `reps` timed runs of op on d, after one warm-up; a
 * kernel that could not run fails it. */
static hs_status time_op(const op_def *op, hs_device *d, ops_bufs *b, int reps, double *best,
                         hs_error *e) {
    for (int64_t i = 0; i < b->cap; i++) b->ids[i] = (int32_t)(i % 8);
    if (op->prep) op->prep(d, b);
    op->run(d, b); /* warm-up */
    *best = 1e30;
    for (int r = 0; r < reps; r++) {
        for (int64_t i = 0; i < b->cap; i++) b->ids[i] = (int32_t)(i % 8);
        if (op->prep) op->prep(d, b);
        hs_device_synchronize(d);
        double t0 = hs_now();
        op->run(d, b);
        hs_device_synchronize(d);
        double t = hs_now() - t0;
        *best = t < *best ? t : *best;
    }
    return hs_device_status(d, e);
}

int hs_bench_ops(int argc, char **argv) {
    ops_bufs b = {0};
    int reps = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(stdout, NULL), 0;
        if (!strcmp(argv[i], "--quick")) b.quick = true;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else return usage(stderr, "unknown option or missing value");
    }
    if (reps == 0) reps = b.quick ? 3 : 5;
    if (reps < 1 || reps > 1000) return usage(stderr, "--reps takes a whole number 1..1000");
    hs_error e;
    if (ops_bufs_alloc(&b, &e) != HS_OK) return ops_fail(&b, &e);
    double stream = stream_rate(&b, reps);
    printf("# streaming: %.2f GB/s (STREAM triad, %lld elements, %d threads); %% is a byte "
           "rate's share of it (over 100%%: operands the last-level cache kept)\n",
           stream / 1e9, (long long)e_n(&b), omp_get_max_threads());
    printf("%-20s %-22s %-10s %12s %14s\n", "op", "shape (quick|full)", "backend", "best ms",
           "rate");
    /* The operands are host arrays: a backend whose memory the host cannot
     * address (a GPU), or that cannot open here, is left out, and said. */
    bool usable[HS_DEVICE_KIND_COUNT] = {false};
    for (int k = 0; k < HS_DEVICE_KIND_COUNT; k++) {
        hs_device *d = NULL;
        if (!hs_device_kind_compiled((hs_device_kind)k)) continue;
        if (hs_device_create((hs_device_kind)k, NULL, &d, &e) != HS_OK)
            printf("# %s: not measured: %s\n", hs_device_kind_name((hs_device_kind)k), e.msg);
        else if (!d->host_visible)
            printf("# %s: not measured: bench ops hands kernels host arrays; tests/gpu/run.sh "
                   "times this backend\n",
                   d->name);
        else usable[k] = true;
        hs_device_free(d);
        hs_error_clear(&e);
    }
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        for (int k = 0; k < HS_DEVICE_KIND_COUNT; k++) {
            if (!usable[k]) continue;
            hs_device *d = NULL;
            if (hs_device_create((hs_device_kind)k, NULL, &d, &e) != HS_OK) return ops_fail(&b, &e);
            const op_def *op = &ops[o];
            if (!op->has(d->k)) {
                printf("%-20s %-22s %-10s %12s %14s\n", op->name, op->shape, d->name, "n/a", "");
                hs_device_free(d);
                continue;
            }
            double best = 0.0;
            if (time_op(op, d, &b, reps, &best, &e) != HS_OK) {
                hs_device_free(d);
                return ops_fail(&b, &e);
            }
            double rate = op->work(&b) / best / 1e9;
            printf("%-20s %-22s %-10s %12.3f %9.2f %s", op->name, op->shape, d->name, best * 1e3,
                   rate, op->bytes ? "GB/s" : "GFLOP/s");
            if (op->bytes) printf(" %4.0f%%", 100.0 * rate * 1e9 / stream);
            printf("\n");
            hs_device_free(d);
        }
    }
    ops_bufs_free(&b);
    return 0;
}

double hs_bench_ops_cpu_rate(const char *name, hs_error *e) {
    ops_bufs b = {0};
    hs_device *d = NULL;
    double best = 0.0, rate = 0.0;
    const op_def *op = NULL;
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        if (!strcmp(ops[o].name, name)) op = &ops[o];
    if (op && ops_bufs_alloc(&b, e) == HS_OK &&
        hs_device_create(HS_DEVICE_CPU, NULL, &d, e) == HS_OK && op->has(d->k) &&
        time_op(op, d, &b, 7, &best, e) == HS_OK)
        rate = op->work(&b) / best;
    hs_device_free(d);
    ops_bufs_free(&b);
    return rate;
}
