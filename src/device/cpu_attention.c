/* Causal grouped-query attention tiled as flash attention: queries go in
 * blocks of ATT_ROWS rows and keys in blocks of ATT_KEYS, a query block
 * meets only the key blocks at or before its last row, and the forward
 * keeps each row's running maximum and sum (online softmax) with an fp32
 * output accumulator per query block. The forward saves one fp32
 * log-sum-exp per row; the backward recomputes each tile's probabilities
 * from it and takes each row's D = dO . O from hs_attention_delta. fp32
 * products run in the register tiles (hs_att_tiles, each group of rows
 * over the keys it sees, so the masked triangle is skipped past a
 * micro-tile); 16-bit native ones through oneDNN's GEMMs (the masked
 * triangle computed up to the diagonal tile). Nothing is O(T^2): a
 * thread's scratch is one tile, one query block and, for the tiles, one
 * packed key (and value) head, whatever T. Heads are addressed in place
 * inside the [B, T, H*HD] projections through their row stride. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu.h"
#include "device/device_backend.h"

#define ATT_ROWS 128
#define ATT_KEYS 256

static int att_rows(int T) { return T < ATT_ROWS ? T : ATT_ROWS; }
static int att_keys(int T) { return T < ATT_KEYS ? T : ATT_KEYS; }

/* One thread's scratch for a query block of tb rows and key tiles of kb:
 * each row's running sum (fp64) and maximum, the block's fp32 output
 * accumulator, P and dP of one tile in fp32, then one tile of 16-bit values
 * (P, then dS, rounded for the 16-bit GEMMs). */
typedef struct att_scratch {
    double *l;
    float *mx, *acc, *P, *dP;
    void *s16;
} att_scratch;

static int64_t scratch_floats(int tb, int kb, int HD) {
    int64_t tile = (int64_t)tb * kb;
    int64_t n = 3 * (int64_t)tb + (int64_t)tb * HD + 2 * tile + (tile + 1) / 2;
    return (n + 15) & ~(int64_t)15; /* every thread's slice starts 64-byte aligned */
}

static att_scratch scratch_at(float *base, int tb, int kb, int HD) {
    int64_t tile = (int64_t)tb * kb;
    att_scratch a = {.l = (double *)base};
    a.mx = base + 2 * tb;
    a.acc = a.mx + tb;
    a.P = a.acc + (int64_t)tb * HD;
    a.dP = a.P + tile;
    a.s16 = a.dP + tile;
    return a;
}

static int64_t scratch_per_thread(int T, int HD) {
    return scratch_floats(att_rows(T), att_keys(T), HD);
}

int64_t hs_attention_scratch_floats(int T, int HD, int threads) {
    return scratch_per_thread(T, HD) * (threads > 1 ? threads : 1);
}

/* Where one head of one sequence starts, and the row stride, of a [B,T,H*HD] buffer. */
typedef struct head_view {
    int64_t off, ld;
} head_view;

static head_view head_of(int b, int T, int h, int H, int HD) {
    head_view v = {((int64_t)b * T) * H * HD + (int64_t)h * HD, (int64_t)H * HD};
    return v;
}

/* The calling thread's GEMM plans, and where its first failed product (no
 * memory for a GEMM's scratch) is reported: every product after it is
 * skipped, the result being lost anyway. */
typedef struct att_gemms {
    hs_gemm_cache gc;
    hs_error e;
    bool widen; /* 16-bit operands to fp32 sgemms (hs_gemm_shape.widen) */
    bool wide;  /* the softmax steps' AVX-512 clones (hs_cpu_wide_vectors) */
    /* fp32 products in registers instead of oneDNN's GEMMs (NULL: GEMMs),
     * and the thread's key and value heads packed for them */
    const hs_att_tiles *tiles;
    float *kt, *vt;
    int packed_b, packed_kvh; /* whose key head kt holds (forward), -1: none */
} att_gemms;

/* The register tiles products of dtype dt take on heads of HD (0: any
 * the tiles take), or NULL for oneDNN's GEMMs: fp32 products on a build
 * with AVX2, the AVX-512 table where the CPU and tier allow. */
static const hs_att_tiles *att_tiles_for(hs_dtype dt, int HD) {
    if (dt != HS_DTYPE_F32) return NULL;
    const hs_att_tiles *t = hs_cpu_wide_vectors() ? hs_att_tiles_avx512() : hs_att_tiles_avx2();
    return t && HD <= t->max_hd ? t : NULL;
}

/* native: whether dt's products run oneDNN's 16-bit matmul (the device's
 * choice, hs_device_gemm_native); else they are widened. */
static void att_gemms_init(att_gemms *g, hs_dtype dt, bool native) {
    hs_gemm_cache_init(&g->gc);
    hs_error_clear(&g->e);
    g->widen = dt != HS_DTYPE_F32 && !native;
    g->wide = hs_cpu_wide_vectors();
    g->tiles = att_tiles_for(dt, 0);
    g->kt = g->vt = NULL;
    g->packed_b = g->packed_kvh = -1;
}

/* Room for one key head of nk rows packed (and its value head where
 * both), from the calling thread's heap; false, with g's failure set,
 * without it. Without tiles nothing is needed; heads wider than the
 * tiles take go to the GEMMs. */
static bool att_pack_alloc(att_gemms *g, int nk, int HD, bool both) {
    if (g->tiles && HD > g->tiles->max_hd) g->tiles = NULL; /* GEMMs for wider heads */
    if (!g->tiles) return true;
    int w = g->tiles->w;
    size_t n = (size_t)((nk + w - 1) / w) * (size_t)w * (size_t)HD, bytes = (n ? n : 1) * 4;
    g->kt = malloc(bytes);
    g->vt = both ? malloc(bytes) : NULL;
    if (g->kt && (g->vt || !both)) return true;
    if (g->e.code == HS_OK)
        hs_error_oom(&g->e, "attention: %zu bytes to pack a key head (%d keys of %d)", bytes, nk,
                     HD);
    return false;
}

/* Frees the plans; the first failure goes to *st and e (may be NULL) unless
 * one is there already. */
static void att_gemms_done(att_gemms *g, hs_status *st, hs_error *e) {
    hs_gemm_cache_free(&g->gc);
    free(g->kt), free(g->vt);
    g->kt = g->vt = NULL;
    if (g->e.code == HS_OK || *st != HS_OK) return;
    *st = g->e.code;
    if (e) *e = g->e;
}

/* One product of a tile, through the calling thread's plans: the tiles
 * repeat a few shapes thousands of times a step. */
static void att_gemm(att_gemms *g, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const void *A, hs_dtype a_dt, int64_t lda, const void *B, hs_dtype b_dt,
                     int64_t ldb, float beta, void *C, hs_dtype c_dt, int64_t ldc) {
    hs_gemm_shape s = {.trans_a = ta,
                       .trans_b = tb,
                       .M = M,
                       .N = N,
                       .K = K,
                       .alpha = alpha,
                       .a_dt = a_dt,
                       .lda = lda,
                       .b_dt = b_dt,
                       .ldb = ldb,
                       .beta = beta,
                       .c_dt = c_dt,
                       .ldc = ldc,
                       .widen = g->widen};
    if (g->e.code == HS_OK) hs_gemm_cached(&g->gc, &s, A, B, C, &g->e);
}

/* S[rows, nk] = scale * Q[r0:r0+rows] K[0:nk]^T. */
static void att_scores(att_gemms *g, float *S, const void *q, head_view qv, const void *k,
                       head_view kv, hs_dtype dt, int r0, int rows, int nk, int HD, float scale) {
    att_gemm(g, false, true, rows, nk, HD, scale, hs_cat(q, dt, qv.off + r0 * qv.ld), dt, qv.ld,
             hs_cat(k, dt, kv.off), dt, kv.ld, 0.0f, S, HS_DTYPE_F32, nk);
}

/* Keys visible to query row i of a block whose first row is at global
 * position gq, when key row 0 is at global position gk: causal, clamped
 * to the nk keys of the block. */
static int visible(int64_t gq, int i, int64_t gk, int nk) {
    int64_t v = gq + i - gk + 1;
    return v < 0 ? 0 : v > nk ? nk : (int)v;
}

/* The first of a tile's nk keys (key 0 at global position gk) that a
 * query may see under document masking: its document's start lo (NULL:
 * none), clamped to [0, valid]. */
static int first_visible(const int32_t *lo, int i, int64_t gk, int valid) {
    if (!lo) return 0;
    int64_t f = lo[i] - gk;
    return f < 0 ? 0 : f > valid ? valid : (int)f;
}

/* A tile's inner ranges for the register products (att_gemms.tiles):
 * each group of r_nt query rows' keys (the scores, dP), each group of
 * r_pb rows' keys (P V, dS K), each group of r_pb keys' rows (P^T dO,
 * dS^T Q). A group's keys are the union of its rows' visible ones; a
 * key's rows start at the first that sees it (the later ones may not,
 * under document masking: their P and dS are zeros). */
typedef struct att_groups {
    int c0[ATT_ROWS], c1[ATT_ROWS];
    int p0[ATT_ROWS], p1[ATT_ROWS];
    int k0[ATT_KEYS], k1[ATT_KEYS];
} att_groups;

static void row_groups(int *c0, int *c1, int n, int64_t gq, int64_t gk, const int32_t *lo, int rows,
                       int nk) {
    for (int i = 0, g = 0; i < rows; i += n, g++) {
        int first = nk, end = 0;
        for (int r = i; r < rows && r < i + n; r++) {
            int v = visible(gq, r, gk, nk), f = first_visible(lo, r, gk, v);
            if (f == v) continue;
            first = f < first ? f : first;
            end = v > end ? v : end;
        }
        c0[g] = end > 0 ? first : 0, c1[g] = end;
    }
}

static void att_groups_of(att_groups *a, const hs_att_tiles *t, int64_t gq, int64_t gk,
                          const int32_t *lo, int rows, int nk, bool keys) {
    row_groups(a->c0, a->c1, t->r_nt, gq, gk, lo, rows, nk);
    row_groups(a->p0, a->p1, t->r_pb, gq, gk, lo, rows, nk);
    if (!keys) return;
    for (int j = 0, g = 0; j < nk; j += t->r_pb, g++) {
        int64_t f = gk + j - gq; /* row i sees key j where gq + i >= gk + j */
        a->k0[g] = f < 0 ? 0 : f > rows ? rows : (int)f;
        a->k1[g] = rows;
    }
}

/* One key tile of the online softmax: S (rows x nk, scores) becomes
 * exp(S - m) on each row's visible keys and 0 elsewhere, where m is the
 * row's running maximum; the row's running sum l and its accumulated
 * output acc (from earlier tiles) are rescaled to the new maximum first.
 * A row that sees no key of this tile is left as it was (a zero P row).
 * lo: each row's document start (global position), or NULL. t: the
 * register tiles' exponentials and sum (hs_att_tiles.exp_sum), or NULL
 * for hs_expf and hs_row_sum. */
static inline __attribute__((always_inline)) void
att_online_softmax_any(float *S, att_scratch *a, int64_t gq, int64_t gk, const int32_t *lo,
                       int rows, int nk, int HD, const hs_att_tiles *t) {
    for (int i = 0; i < rows; i++) {
        float *s = S + (int64_t)i * nk;
        int valid = visible(gq, i, gk, nk), f = first_visible(lo, i, gk, valid);
        if (valid == f) {
            memset(s, 0, (size_t)nk * sizeof(float));
            continue;
        }
        float bm = hs_row_max(s + f, valid - f),
              mn = a->l[i] > 0.0 && a->mx[i] > bm ? a->mx[i] : bm;
        double sum = 0.0;
        if (t) sum = t->exp_sum(s + f, valid - f, mn);
        else
            for (int j = f; j < valid; j++) s[j] = hs_expf(s[j] - mn); /* vectorises */
        memset(s, 0, (size_t)f * sizeof(float));
        memset(s + valid, 0, (size_t)(nk - valid) * sizeof(float));
        if (a->l[i] > 0.0 && mn != a->mx[i]) {
            float alpha = hs_expf(a->mx[i] - mn);
            float *o = a->acc + (int64_t)i * HD;
            a->l[i] *= alpha;
            for (int d = 0; d < HD; d++) o[d] *= alpha;
        }
        a->l[i] += t ? sum : hs_row_sum(s + f, valid - f);
        a->mx[i] = mn;
    }
}

/* The softmax steps of a tile, and their AVX-512 clones (HS_WIDE): the
 * same bits, taken where att_gemms.wide. */
static void att_online_softmax(float *S, att_scratch *a, int64_t gq, int64_t gk, const int32_t *lo,
                               int rows, int nk, int HD) {
    att_online_softmax_any(S, a, gq, gk, lo, rows, nk, HD, NULL);
}

HS_WIDE static void att_online_softmax_wide(float *S, att_scratch *a, int64_t gq, int64_t gk,
                                            const int32_t *lo, int rows, int nk, int HD) {
    att_online_softmax_any(S, a, gq, gk, lo, rows, nk, HD, NULL);
}

/* The tiles' own: their exponentials (t->exp_sum). */
static void att_online_softmax_tiles(float *S, att_scratch *a, int64_t gq, int64_t gk,
                                     const int32_t *lo, int rows, int nk, int HD,
                                     const hs_att_tiles *t) {
    att_online_softmax_any(S, a, gq, gk, lo, rows, nk, HD, t);
}

static inline __attribute__((always_inline)) void finish_row(void *o, hs_dtype odt, int64_t off,
                                                             const float *acc, float inv, int HD) {
    for (int d = 0; d < HD; d++) hs_st(o, odt, off + d, acc[d] * inv);
}

/* The query block's output acc / l in odt, and each row's log-sum-exp
 * (-inf, and a zero row, when it saw no key). */
static void att_finish(void *o, hs_dtype odt, int64_t ld, float *lse, const att_scratch *a,
                       int rows, int HD) {
    for (int i = 0; i < rows; i++) {
        const float *acc = a->acc + (int64_t)i * HD;
        if (a->l[i] == 0.0) {
            memset(hs_at(o, odt, i * ld), 0, (size_t)HD * hs_dtype_size(odt));
            lse[i] = -INFINITY;
            continue;
        }
        float inv = (float)(1.0 / a->l[i]);
        switch (odt) { /* a constant dtype in each loop: it vectorises */
        case HS_DTYPE_F32: finish_row(o, HS_DTYPE_F32, i * ld, acc, inv, HD); break;
        case HS_DTYPE_BF16: finish_row(o, HS_DTYPE_BF16, i * ld, acc, inv, HD); break;
        default: finish_row(o, odt, i * ld, acc, inv, HD); break;
        }
        lse[i] = a->mx[i] + (float)log(a->l[i]);
    }
}

/* Keys a block of `rows` queries starting at global position gq needs. */
static int block_keys(int64_t gq, int rows, int64_t gk, int Tk) {
    int64_t n = gq + rows - gk;
    return n < 0 ? 0 : n > Tk ? Tk : (int)n;
}

/* The first key tile (of kb keys) a block of queries needs: under document
 * masking none before its first row's document start (starts never fall
 * along a sequence), else 0. */
static int block_first_tile(const int32_t *lo, int64_t gk, int nk, int kb) {
    if (!lo || lo[0] <= gk) return 0;
    int64_t f = (lo[0] - gk) / kb * kb;
    return f > nk ? nk : (int)f;
}

/* Sequence b's document starts from the block at global position gq on,
 * or NULL without masking. */
static const int32_t *lo_from(const hs_att_rows *r, int b, int64_t gq) {
    return r->lo ? r->lo + (int64_t)b * r->lo_ld + gq : NULL;
}

hs_att_rows hs_att_rows_all(int T) {
    return (hs_att_rows){.Tq = T, .Tk = T, .q0 = 0, .nq = T, .k0 = 0, .nk = T, .gq = 0, .gk = 0};
}

/* Key head kvh's rows of k [k0, k0 + nk) packed for the register
 * products (att_gemms.tiles), into dst. */
static void pack_head(const att_gemms *g, float *dst, const void *k, int b, int kvh, int KVH,
                      int HD, const hs_att_rows *r) {
    head_view kv = head_of(b, r->Tk, kvh, KVH, HD);
    g->tiles->pack(dst, (const float *)k + kv.off + (int64_t)r->k0 * kv.ld, kv.ld, r->nk, HD);
}

/* One query head of one sequence, every query block, each over its key
 * tiles in order. With low (a 16-bit dt whose GEMM is native) each tile's
 * P is rounded once into the 16-bit tile for P V, as a 16-bit attention
 * holds it. */
static void forward_head(att_gemms *g, void *out, hs_dtype odt, float *lse, const void *q,
                         const void *k, const void *v, hs_dtype dt, bool low, float *scratch, int b,
                         int h, int NH, int KVH, int HD, const hs_att_rows *r) {
    float scale = 1.0f / sqrtf((float)HD);
    int group = NH / KVH, tb = att_rows(r->nq), kb = att_keys(r->nk);
    att_scratch a = scratch_at(scratch, tb, kb, HD);
    head_view qv = head_of(b, r->Tq, h, NH, HD), kv = head_of(b, r->Tk, h / group, KVH, HD);
    kv.off += (int64_t)r->k0 * kv.ld;
    if (g->e.code != HS_OK) return;
    if (g->tiles && (g->packed_b != b || g->packed_kvh != h / group)) {
        pack_head(g, g->kt, k, b, h / group, KVH, HD, r); /* the group's heads come in turn */
        g->packed_b = b, g->packed_kvh = h / group;
    }
    float *hl = lse + ((int64_t)b * NH + h) * r->Tq + r->q0;
    att_groups grp;
    for (int r0 = 0; r0 < r->nq; r0 += tb) {
        int rows = r->nq - r0 < tb ? r->nq - r0 : tb, qr = r->q0 + r0;
        int64_t gq = r->gq + r0;
        int nk = block_keys(gq, rows, r->gk, r->nk);
        const int32_t *lo = lo_from(r, b, gq);
        int first = block_first_tile(lo, r->gk, nk, kb);
        for (int i = 0; i < rows; i++) a.l[i] = 0.0, a.mx[i] = -INFINITY;
        for (int j0 = first; j0 < nk; j0 += kb) {
            int kn = nk - j0 < kb ? nk - j0 : kb;
            head_view kj = {kv.off + (int64_t)j0 * kv.ld, kv.ld};
            const hs_att_tiles *t = g->tiles;
            if (t) {
                att_groups_of(&grp, t, gq, r->gk + j0, lo, rows, kn, false);
                t->nt(a.P, kn, (const float *)q + qv.off + (int64_t)qr * qv.ld, qv.ld,
                      g->kt + (int64_t)j0 * HD, HD, rows, kn, grp.c0, grp.c1, scale);
                att_online_softmax_tiles(a.P, &a, gq, r->gk + j0, lo, rows, kn, HD, t);
                t->pb(a.acc, HD, a.P, kn, 1, (const float *)v + kj.off, kv.ld, HD, rows, grp.p0,
                      grp.p1, 1.0f, j0 != first);
                continue;
            }
            att_scores(g, a.P, q, qv, k, kj, dt, qr, rows, kn, HD, scale);
            (g->wide ? att_online_softmax_wide : att_online_softmax)(a.P, &a, gq, r->gk + j0, lo,
                                                                     rows, kn, HD);
            if (low) hs_convert(a.s16, dt, a.P, HS_DTYPE_F32, (int64_t)rows * kn);
            att_gemm(g, false, false, rows, HD, kn, 1.0f, low ? a.s16 : (const void *)a.P,
                     low ? dt : HS_DTYPE_F32, kn, hs_cat(v, dt, kj.off), dt, kv.ld,
                     j0 == first ? 0.0f : 1.0f, a.acc, HS_DTYPE_F32, HD);
        }
        att_finish(hs_at(out, odt, qv.off + qr * qv.ld), odt, qv.ld, hl + r0, &a, rows, HD);
    }
}

hs_status hs_attention_forward_rows(void *out, hs_dtype odt, float *lse, const void *q,
                                    const void *k, const void *v, hs_dtype dt, float *scratch,
                                    int B, int NH, int KVH, int HD, const hs_att_rows *r,
                                    bool native, hs_error *e) {
    bool low = dt != HS_DTYPE_F32 && native;
    att_gemms g;
    att_gemms_init(&g, dt, native);
    if (att_pack_alloc(&g, r->nk, HD, false))
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                forward_head(&g, out, odt, lse, q, k, v, dt, low, scratch, b, h, NH, KVH, HD, r);
    hs_status st = HS_OK;
    att_gemms_done(&g, &st, e);
    return st;
}

/* With threads > 1 the (sequence, head) pairs go over the threads, each
 * with its own scratch, its own plans and its GEMMs on one thread: every
 * head is computed exactly as on one thread. */
static hs_status forward_threads(void *out, hs_dtype odt, float *lse, const void *q, const void *k,
                                 const void *v, hs_dtype dt, float *scratch, int threads, int B,
                                 int NH, int KVH, int HD, const hs_att_rows *rows, bool native,
                                 hs_error *e) {
    hs_att_rows r = *rows;
    int64_t per = scratch_floats(att_rows(r.nq), att_keys(r.nk), HD);
    bool low = dt != HS_DTYPE_F32 && native;
    hs_status st = HS_OK;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        att_gemms g;
        att_gemms_init(&g, dt, native);
        att_pack_alloc(&g, r.nk, HD, false);
        float *mine = scratch + per * omp_get_thread_num();
#pragma omp for schedule(static)
        for (int t = 0; t < B * NH; t++)
            forward_head(&g, out, odt, lse, q, k, v, dt, low, mine, t / NH, t % NH, NH, KVH, HD,
                         &r);
#pragma omp critical(hs_attention_failure)
        att_gemms_done(&g, &st, e);
    }
    return st;
}

hs_status hs_attention_forward(void *out /* B,T,NH*HD */, float *lse /* B,NH,T */,
                               const void *q /* B,T,NH*HD */, const void *k /* B,T,KVH*HD */,
                               const void *v /* B,T,KVH*HD */, hs_dtype dt, float *scratch,
                               int threads, int B, int T, int NH, int KVH, int HD, hs_error *e) {
    hs_att_rows r = hs_att_rows_all(T);
    return forward_threads(out, dt, lse, q, k, v, dt, scratch, threads, B, NH, KVH, HD, &r,
                           hs_gemm16_native(dt), e);
}

void hs_attention_delta(float *delta /* B,NH,T */, const float *dout /* B,T,NH*HD */,
                        const void *out /* B,T,NH*HD */, hs_dtype dt, int B, int T, int NH,
                        int HD) {
    int64_t q = (int64_t)NH * HD, rows = (int64_t)B * T;
#pragma omp parallel for schedule(static) if (rows * q >= HS_PAR_MIN)
    for (int64_t bt = 0; bt < rows; bt++) {
        int64_t b = bt / T, t = bt % T;
        for (int h = 0; h < NH; h++) {
            int64_t off = bt * q + (int64_t)h * HD;
            float *d = delta + (b * NH + h) * T + t;
            const float *g = dout + off; /* the dtype a constant in each call: it vectorises */
            if (dt == HS_DTYPE_BF16) *d = (float)hs_row_dot_ld(g, out, HS_DTYPE_BF16, off, HD);
            else if (dt == HS_DTYPE_F32) *d = (float)hs_row_dot_ld(g, out, HS_DTYPE_F32, off, HD);
            else *d = (float)hs_row_dot_ld(g, out, dt, off, HD);
        }
    }
}

/* P = exp(S - lse) on the causal part (within the row's document under
 * masking), 0 elsewhere; t: the tiles' exponentials, or NULL. */
static inline __attribute__((always_inline)) void att_probs_any(float *S, const float *lse,
                                                                int64_t gq, int64_t gk,
                                                                const int32_t *lo, int rows, int nk,
                                                                const hs_att_tiles *t) {
    for (int i = 0; i < rows; i++) {
        float *s = S + (int64_t)i * nk;
        int valid = visible(gq, i, gk, nk), f = first_visible(lo, i, gk, valid);
        float l = lse[i];
        if (t) t->exp_sum(s + f, valid - f, l);
        else
            for (int j = f; j < valid; j++) s[j] = hs_expf(s[j] - l);
        memset(s, 0, (size_t)f * sizeof(float));
        memset(s + valid, 0, (size_t)(nk - valid) * sizeof(float));
    }
}

static void att_probs(float *S, const float *lse, int64_t gq, int64_t gk, const int32_t *lo,
                      int rows, int nk) {
    att_probs_any(S, lse, gq, gk, lo, rows, nk, NULL);
}

HS_WIDE static void att_probs_wide(float *S, const float *lse, int64_t gq, int64_t gk,
                                   const int32_t *lo, int rows, int nk) {
    att_probs_any(S, lse, gq, gk, lo, rows, nk, NULL);
}

static void att_probs_tiles(float *S, const float *lse, int64_t gq, int64_t gk, const int32_t *lo,
                            int rows, int nk, const hs_att_tiles *t) {
    att_probs_any(S, lse, gq, gk, lo, rows, nk, t);
}

/* dS = P * (dP - D), in place over dP, on each row's visible keys (those
 * att_probs gave a P); 0 elsewhere, whatever dP held there. */
static void att_softmax_backward(float *dP, const float *P, const float *delta, int64_t gq,
                                 int64_t gk, const int32_t *lo, int rows, int nk) {
    for (int i = 0; i < rows; i++) {
        const float *p = P + (int64_t)i * nk;
        float *d = dP + (int64_t)i * nk, fd = delta[i];
        int valid = visible(gq, i, gk, nk), f = first_visible(lo, i, gk, valid);
        for (int j = f; j < valid; j++) d[j] = p[j] * (d[j] - fd);
        memset(d, 0, (size_t)f * sizeof(float));
        memset(d + valid, 0, (size_t)(nk - valid) * sizeof(float));
    }
}

/* The GEMMs of one tile's backward. With dO16 (dO rounded to dt, the
 * 16-bit GEMM native) every product runs in dt: P and dS are rounded once
 * into s16 for their two uses, as a 16-bit autograd holds them; without
 * it the fp32 operands go to the mixed-dtype GEMM as they are. */
typedef struct att_bwd_block {
    const float *dO;          /* fp32 */
    const void *dO16;         /* dt, or NULL */
    const void *kb, *vb, *qb; /* block operands, dt */
    float *dq, *dk, *dv;
    int64_t qld, kld; /* row strides: dO, dO16, qb, dq; kb, vb, dk, dv */
} att_bwd_block;

/* Where a tile's rows and keys lie (global positions of its first query
 * and key, document starts or NULL). */
typedef struct att_tile_at {
    int64_t gq, gk;
    const int32_t *lo;
} att_tile_at;

static void att_backward_block(att_gemms *g, const att_bwd_block *b, const att_scratch *a,
                               const float *delta, hs_dtype dt, att_tile_at at, int rows, int nk,
                               int HD, float scale) {
    bool low = b->dO16 != NULL;
    const void *dO = low ? b->dO16 : (const void *)b->dO;
    hs_dtype odt = low ? dt : HS_DTYPE_F32;
    /* dP = dO V^T;  dV += P^T dO */
    att_gemm(g, false, true, rows, nk, HD, 1.0f, dO, odt, b->qld, b->vb, dt, b->kld, 0.0f, a->dP,
             HS_DTYPE_F32, nk);
    if (low) hs_convert(a->s16, dt, a->P, HS_DTYPE_F32, (int64_t)rows * nk);
    att_gemm(g, true, false, nk, HD, rows, 1.0f, low ? a->s16 : (const void *)a->P, odt, nk, dO,
             odt, b->qld, 1.0f, b->dv, HS_DTYPE_F32, b->kld);
    att_softmax_backward(a->dP, a->P, delta, at.gq, at.gk, at.lo, rows, nk);
    if (low) hs_convert(a->s16, dt, a->dP, HS_DTYPE_F32, (int64_t)rows * nk);
    const void *dS = low ? a->s16 : (const void *)a->dP;
    /* dQ += scale dS K;  dK += scale dS^T Q */
    att_gemm(g, false, false, rows, HD, nk, scale, dS, odt, nk, b->kb, dt, b->kld, 1.0f, b->dq,
             HS_DTYPE_F32, b->qld);
    att_gemm(g, true, false, nk, HD, rows, scale, dS, odt, nk, b->qb, dt, b->qld, 1.0f, b->dk,
             HS_DTYPE_F32, b->kld);
}

/* The same in registers (att_gemms.tiles, fp32): dP over packed V (vt:
 * this tile's values), each product group by group over the keys its
 * rows see (grp, the tile's). a->P holds the tile's probabilities. */
static void att_backward_tiles(const hs_att_tiles *t, const att_bwd_block *b, const att_scratch *a,
                               const att_groups *grp, const float *vt, const float *delta,
                               att_tile_at at, int rows, int nk, int HD, float scale) {
    const float *k = b->kb, *q = b->qb;
    /* dP = dO V^T;  dV += P^T dO */
    t->nt(a->dP, nk, b->dO, b->qld, vt, HD, rows, nk, grp->c0, grp->c1, 1.0f);
    t->pb(b->dv, b->kld, a->P, 1, nk, b->dO, b->qld, HD, nk, grp->k0, grp->k1, 1.0f, true);
    att_softmax_backward(a->dP, a->P, delta, at.gq, at.gk, at.lo, rows, nk);
    /* dQ += scale dS K;  dK += scale dS^T Q */
    t->pb(b->dq, b->qld, a->dP, nk, 1, k, b->kld, HD, rows, grp->p0, grp->p1, scale, true);
    t->pb(b->dk, b->kld, a->dP, 1, nk, q, b->qld, HD, nk, grp->k0, grp->k1, scale, true);
}

/* One query head of one sequence, every query block over its key tiles;
 * dk/dv are its key head's, shared with the other heads of its group
 * (and, with tiles, packed in g's kt and vt). */
static void backward_head(att_gemms *g, float *dq, float *dk, float *dv, const float *dout,
                          const void *dout16, const void *q, const void *k, const void *v,
                          const float *lse, const float *delta, hs_dtype dt, float *scratch, int b,
                          int h, int NH, int KVH, int HD, const hs_att_rows *r) {
    float scale = 1.0f / sqrtf((float)HD);
    int group = NH / KVH, tb = att_rows(r->nq), kb = att_keys(r->nk);
    att_scratch a = scratch_at(scratch, tb, kb, HD);
    head_view qv = head_of(b, r->Tq, h, NH, HD), kv = head_of(b, r->Tk, h / group, KVH, HD);
    kv.off += (int64_t)r->k0 * kv.ld;
    int64_t row0 = ((int64_t)b * NH + h) * r->Tq + r->q0;
    const float *hl = lse + row0, *hd = delta + row0;
    if (dt == HS_DTYPE_F32) dout16 = NULL;
    att_groups grp;
    for (int r0 = 0; r0 < r->nq; r0 += tb) {
        int rows = r->nq - r0 < tb ? r->nq - r0 : tb, qr = r->q0 + r0;
        int64_t gq = r->gq + r0, at = qv.off + qr * qv.ld;
        int nk = block_keys(gq, rows, r->gk, r->nk);
        const int32_t *lo = lo_from(r, b, gq);
        for (int j0 = block_first_tile(lo, r->gk, nk, kb); j0 < nk; j0 += kb) {
            int kn = nk - j0 < kb ? nk - j0 : kb;
            head_view kj = {kv.off + (int64_t)j0 * kv.ld, kv.ld};
            att_tile_at ta = {gq, r->gk + j0, lo};
            const hs_att_tiles *t = g->tiles;
            if (t) {
                att_groups_of(&grp, t, gq, ta.gk, lo, rows, kn, true);
                t->nt(a.P, kn, (const float *)q + at, qv.ld, g->kt + (int64_t)j0 * HD, HD, rows, kn,
                      grp.c0, grp.c1, scale);
                att_probs_tiles(a.P, hl + r0, gq, ta.gk, lo, rows, kn, t);
            } else {
                att_scores(g, a.P, q, qv, k, kj, dt, qr, rows, kn, HD, scale);
                (g->wide ? att_probs_wide : att_probs)(a.P, hl + r0, gq, ta.gk, lo, rows, kn);
            }
            att_bwd_block blk = {.dO = dout + at,
                                 .dO16 = dout16 ? hs_cat(dout16, dt, at) : NULL,
                                 .kb = hs_cat(k, dt, kj.off),
                                 .vb = hs_cat(v, dt, kj.off),
                                 .qb = hs_cat(q, dt, at),
                                 .dq = dq + at,
                                 .dk = dk + kj.off,
                                 .dv = dv + kj.off,
                                 .qld = qv.ld,
                                 .kld = kv.ld};
            if (t)
                att_backward_tiles(t, &blk, &a, &grp, g->vt + (int64_t)j0 * HD, hd + r0, ta, rows,
                                   kn, HD, scale);
            else att_backward_block(g, &blk, &a, hd + r0, dt, ta, rows, kn, HD, scale);
        }
    }
}

/* The query heads of key head kvh of sequence b, in order (its dk and dv
 * rows theirs alone); with tiles its keys and values packed once for
 * them. */
static void backward_pair(att_gemms *g, float *dq, float *dk, float *dv, const float *dout,
                          const void *dout16, const void *q, const void *k, const void *v,
                          const float *lse, const float *delta, hs_dtype dt, float *scratch, int b,
                          int kvh, int NH, int KVH, int HD, const hs_att_rows *r) {
    if (g->e.code != HS_OK) return;
    int group = NH / KVH;
    if (g->tiles) {
        pack_head(g, g->kt, k, b, kvh, KVH, HD, r);
        pack_head(g, g->vt, v, b, kvh, KVH, HD, r);
    }
    for (int h = kvh * group; h < (kvh + 1) * group; h++)
        backward_head(g, dq, dk, dv, dout, dout16, q, k, v, lse, delta, dt, scratch, b, h, NH, KVH,
                      HD, r);
}

hs_status hs_attention_backward_rows(float *dq, float *dk, float *dv, const float *dout,
                                     const void *dout16, const void *q, const void *k,
                                     const void *v, const float *lse, const float *delta,
                                     hs_dtype dt, float *scratch, int B, int NH, int KVH, int HD,
                                     const hs_att_rows *r, bool native, hs_error *e) {
    att_gemms g;
    att_gemms_init(&g, dt, native);
    if (att_pack_alloc(&g, r->nk, HD, true))
        for (int t = 0; t < B * KVH; t++)
            backward_pair(&g, dq, dk, dv, dout, dout16, q, k, v, lse, delta, dt, scratch, t / KVH,
                          t % KVH, NH, KVH, HD, r);
    hs_status st = HS_OK;
    att_gemms_done(&g, &st, e);
    return st;
}

/* With threads > 1 the (sequence, key head) pairs go over the threads:
 * each owns its dk/dv rows and runs its group's query heads in order, so
 * every sum is accumulated as on one thread. */
static hs_status backward_threads(float *dq, float *dk, float *dv, const float *dout,
                                  const void *dout16, const void *q, const void *k, const void *v,
                                  const float *lse, const float *delta, hs_dtype dt, float *scratch,
                                  int threads, int B, int NH, int KVH, int HD,
                                  const hs_att_rows *rows, bool native, hs_error *e) {
    hs_att_rows r = *rows;
    int64_t per = scratch_floats(att_rows(r.nq), att_keys(r.nk), HD);
    hs_status st = HS_OK;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        att_gemms g;
        att_gemms_init(&g, dt, native);
        att_pack_alloc(&g, r.nk, HD, true);
        float *mine = scratch + per * omp_get_thread_num();
#pragma omp for schedule(static)
        for (int t = 0; t < B * KVH; t++)
            backward_pair(&g, dq, dk, dv, dout, dout16, q, k, v, lse, delta, dt, mine, t / KVH,
                          t % KVH, NH, KVH, HD, &r);
#pragma omp critical(hs_attention_failure)
        att_gemms_done(&g, &st, e);
    }
    return st;
}

hs_status hs_attention_backward(float *dq /* B,T,NH*HD */, float *dk /* B,T,KVH*HD */,
                                float *dv /* B,T,KVH*HD */, const float *dout /* B,T,NH*HD */,
                                const void *dout16, const void *q, const void *k, const void *v,
                                const float *lse, const float *delta, hs_dtype dt, float *scratch,
                                int threads, int B, int T, int NH, int KVH, int HD, hs_error *e) {
    hs_att_rows r = hs_att_rows_all(T);
    return backward_threads(dq, dk, dv, dout, dout16, q, k, v, lse, delta, dt, scratch, threads, B,
                            NH, KVH, HD, &r, hs_gemm16_native(dt), e);
}

/* The table's entries: the caller's workspace (hs_att_work) where it gives
 * one, else scratch for this row range and backward's delta from the
 * forward's output. A whole sequence with the caller's scratch goes to
 * the threaded kernels on the caller's threads; other calls whose products
 * take the register tiles too, on the GEMM threads (the tiles run one
 * thread each, where oneDNN's GEMMs would split each product), with
 * scratch of their own; the rest to the row-range kernels. */
static float *rows_scratch(hs_stream *s, const hs_att_rows *r, int HD, int threads) {
    int64_t n = scratch_floats(att_rows(r->nq), att_keys(r->nk), HD) * threads;
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(float);
    float *p = malloc(bytes);
    if (p == NULL) hs_kernel_oom(s, "attention: %zu bytes of scratch", bytes);
    return p;
}

/* q ([B, Tq, NH*HD]), k and v ([B, Tk, KVH*HD]) of a 16-bit dt widened to
 * fp32 once, into one buffer the caller frees, and the pointers moved to
 * it: where dt's products are not the device's engine (widened, not
 * oneDNN's 16-bit matmul) the tiles would widen their operands product by
 * product, thousands of times a step, for the same fp32 products of the
 * same values. NULL, the device's failure set, without the memory. */
static float *widen_qkv(hs_stream *s, const void **q, const void **k, const void **v, hs_dtype dt,
                        int64_t nq, int64_t nk) {
    size_t bytes = (size_t)(nq + 2 * nk) * sizeof(float);
    float *w = malloc(bytes + 1);
    if (w == NULL) {
        hs_kernel_oom(s, "attention: %zu bytes to widen q, k and v", bytes);
        return NULL;
    }
    hs_cpu_convert(s, w, HS_DTYPE_F32, *q, dt, nq);
    hs_cpu_convert(s, w + nq, HS_DTYPE_F32, *k, dt, nk);
    hs_cpu_convert(s, w + nq + nk, HS_DTYPE_F32, *v, dt, nk);
    *q = w, *k = w + nq, *v = w + nq + nk;
    return w;
}

/* The dtype attention's products run in: dt where it is fp32 or the
 * device's 16-bit engine, else fp32 (q, k and v widened). */
static hs_dtype att_products_dtype(hs_stream *s, hs_dtype dt) {
    return dt == HS_DTYPE_F32 || hs_device_gemm_native(s->dev, dt) ? dt : HS_DTYPE_F32;
}

/* q, k, v in att_products_dtype: as they are, or widened into *wide
 * (widen_qkv), *dt set to it. false when they could not be widened. */
static bool att_operands(hs_stream *s, const void **q, const void **k, const void **v, hs_dtype *dt,
                         float **wide, int B, int NH, int KVH, int HD, const hs_att_rows *r) {
    *wide = NULL;
    if (att_products_dtype(s, *dt) == *dt) return true;
    *wide = widen_qkv(s, q, k, v, *dt, (int64_t)B * r->Tq * NH * HD, (int64_t)B * r->Tk * KVH * HD);
    *dt = HS_DTYPE_F32;
    return *wide != NULL;
}

static bool whole(const hs_att_rows *r) {
    return r->Tq == r->Tk && r->q0 == 0 && r->nq == r->Tq && r->k0 == 0 && r->nk == r->Tk &&
           r->gq == r->gk;
}

/* How an entry runs (the comment above rows_scratch): on the caller's
 * workspace and threads (theirs), on the GEMM threads where a call the
 * workspace does not thread takes the register tiles, else on one; and
 * its scratch: the caller's where it fits, else its own (mine, freed by
 * the caller; NULL, the device's failure set, without the memory). */
typedef struct att_run {
    bool theirs, mine;
    int threads;
    float *scratch;
} att_run;

static att_run att_run_of(hs_stream *s, hs_dtype dt, int HD, const hs_att_rows *r,
                          const hs_att_work *w, bool theirs) {
    att_run x = {.theirs = theirs, .threads = 1};
    int n = hs_blas_get_threads();
    if (theirs) x.threads = w->threads > 1 ? w->threads : 1;
    else if (att_tiles_for(att_products_dtype(s, dt), HD) && n > 1) x.threads = n;
    x.mine = !(w && w->scratch && (theirs || x.threads == 1));
    x.scratch = x.mine ? rows_scratch(s, r, HD, x.threads) : w->scratch;
    return x;
}

void hs_cpu_attention_fwd(hs_stream *s, void *out, hs_dtype odt, float *lse, const void *q,
                          const void *k, const void *v, hs_dtype dt, int B, int NH, int KVH, int HD,
                          const hs_att_rows *r, const hs_att_work *w) {
    att_run x = att_run_of(s, dt, HD, r, w, w && w->scratch && whole(r) && odt == dt);
    float *scratch = x.scratch;
    if (scratch == NULL) return;
    hs_error e;
    hs_status st = HS_OK;
    hs_dtype cdt = dt; /* the products' dtype */
    float *wide = NULL;
    bool ok = att_operands(s, &q, &k, &v, &cdt, &wide, B, NH, KVH, HD, r);
    bool native = hs_device_gemm_native(s->dev, cdt);
    if (ok && (x.theirs || x.threads > 1))
        st = forward_threads(out, odt, lse, q, k, v, cdt, scratch, x.threads, B, NH, KVH, HD, r,
                             native, &e);
    else if (ok)
        st = hs_attention_forward_rows(out, odt, lse, q, k, v, cdt, scratch, B, NH, KVH, HD, r,
                                       native, &e);
    if (st != HS_OK) hs_device_fail(s->dev, &e);
    free(wide);
    if (x.mine) free(scratch);
}

void hs_cpu_attention_bwd(hs_stream *s, float *dq, float *dk, float *dv, const float *dout,
                          const void *out, hs_dtype odt, const void *q, const void *k,
                          const void *v, const float *lse, hs_dtype dt, int B, int NH, int KVH,
                          int HD, const hs_att_rows *r, const hs_att_work *w) {
    att_run x = att_run_of(s, dt, HD, r, w, w && w->scratch && whole(r));
    float *scratch = x.scratch;
    if (scratch == NULL) return;
    size_t delta_bytes = (size_t)((int64_t)B * NH * r->Tq + 1) * sizeof(float);
    float *delta = w && w->delta ? w->delta : malloc(delta_bytes);
    hs_error e;
    hs_status st = HS_OK;
    if (delta == NULL)
        st = hs_error_oom(&e, "attention: %zu bytes of deltas (%d x %d x %d)", delta_bytes, B, NH,
                          r->Tq);
    if (st == HS_OK && !(w && w->delta && w->delta_ready))
        hs_attention_delta(delta, dout, out, odt, B, r->Tq, NH, HD);
    const void *dout16 = w ? w->dout16 : NULL;
    float *wide = NULL;
    bool ok = st == HS_OK && att_operands(s, &q, &k, &v, &dt, &wide, B, NH, KVH, HD, r);
    bool native = hs_device_gemm_native(s->dev, dt);
    if (ok && (x.theirs || x.threads > 1))
        st = backward_threads(dq, dk, dv, dout, dout16, q, k, v, lse, delta, dt, scratch, x.threads,
                              B, NH, KVH, HD, r, native, &e);
    else if (ok)
        st = hs_attention_backward_rows(dq, dk, dv, dout, dout16, q, k, v, lse, delta, dt, scratch,
                                        B, NH, KVH, HD, r, native, &e);
    if (st != HS_OK) hs_device_fail(s->dev, &e);
    free(wide);
    if (!(w && w->delta)) free(delta);
    if (x.mine) free(scratch);
}

/* The merge the ring's model code did before the table had it, in fp32
 * with expf / logf. */
void hs_cpu_attention_merge(hs_stream *s, float *out, float *lse, const float *bout,
                            const float *blse, int B, int NH, int HD, const hs_att_rows *r) {
    int T = r->Tq;
    int64_t q = (int64_t)NH * HD;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = r->q0; t < r->q0 + r->nq; t++) {
                int64_t row = ((int64_t)b * NH + h) * T + t;
                float lb = blse[row], la = lse[row];
                if (lb == -INFINITY) continue;
                float mx = la > lb ? la : lb;
                float l = mx + logf(expf(la - mx) + expf(lb - mx));
                float wa = expf(la - l), wb = expf(lb - l);
                float *o = out + ((int64_t)b * T + t) * q + (int64_t)h * HD;
                const float *ob = bout + ((int64_t)b * T + t) * q + (int64_t)h * HD;
                for (int i = 0; i < HD; i++) o[i] = o[i] * wa + ob[i] * wb;
                lse[row] = l;
            }
}
