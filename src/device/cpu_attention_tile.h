/* The body of attention's fp32 tile products for one vector width,
 * included by cpu_attention_tiles.c once per ISA tier with these defined:
 *   TILE(name)        the tier's name for a function (name_avx2, ...)
 *   TW                fp32 lanes of a vector (8, 16)
 *   TR_NT, TR_PB      rows of a score and of a P x B micro-tile
 *   TNV               vectors of a P x B micro-tile's row (its d chunk)
 *   tv, tmask         the vector and lane-mask types
 *   tv_zero(), tv_load(p), tv_bcast(x), tv_fma(a, b, c) = a * b + c once
 *   rounded, tv_mul(a, b), tv_add, tv_sub, tv_min, tv_max, tv_store(p, v),
 *   tv_mask(n) (the first n lanes), tv_loadm(p, m) (zeros outside m),
 *   tv_storem(p, v, m), tv_keep(v, m) (zeros outside m), tv_pow2(n) (2^n
 *   of integral-valued lanes in range), and the comparisons tv_lt, tv_gt,
 *   tv_nan giving a tcmp that tv_sel(c, a, b) (c ? a : b) takes;
 *   tv_transpose(r): TW vectors r[0..TW) transposed in place; tv_sum(v): the
 *   lanes widened to double and added in a fixed tree.
 * Every output element is one chain of fused multiply-adds in the order of
 * its inner index, started from zero, then scaled (and added to the
 * output's old value with one more FMA): the same operations in each
 * tier, so the tiers give the same values (zeros may differ in sign where
 * a chain meets a masked tile's zeros). Rows past a group's end repeat its
 * last row and are never stored. */

_Static_assert(TR_NT <= TW, "a score group is transposed in one TW x TW block");

/* dst: the n keys of src (rows ld apart, hd values each) as panels of TW
 * keys, panel p holding d-major [hd][TW] at dst + p * TW * hd; the last
 * panel's missing keys are zeros. */
static void TILE(pack)(float *dst, const float *src, int64_t ld, int n, int hd) {
    for (int p0 = 0; p0 < n; p0 += TW) {
        float *panel = dst + (int64_t)p0 * hd;
        int d0 = 0;
        if (p0 + TW <= n) /* whole panels: TW x TW blocks transposed in registers */
            for (; d0 + TW <= hd; d0 += TW) {
                tv r[TW];
                for (int l = 0; l < TW; l++) r[l] = tv_load(src + (int64_t)(p0 + l) * ld + d0);
                tv_transpose(r);
                for (int i = 0; i < TW; i++) tv_store(panel + (d0 + i) * TW, r[i]);
            }
        for (int l = 0; l < TW; l++) {
            const float *row = src + (int64_t)(p0 + l) * ld;
            for (int d = d0; d < hd; d++) panel[d * TW + l] = p0 + l < n ? row[d] : 0.0f;
        }
    }
}

/* TR_NT rows (a: packed d-major, a[d * TR_NT + r]) times np (1 or 2, a
 * constant where inlined) panels from bp: columns col .. col + np * TW of
 * c's rows, those at or past ncols not stored. */
static inline __attribute__((always_inline)) void TILE(nt_tile)(float *c, int64_t ldc,
                                                                const float *a, const float *bp,
                                                                int hd, int np, int col, int ncols,
                                                                int nr, float alpha) {
    tv acc[TR_NT][2];
#pragma GCC unroll 16
    for (int r = 0; r < TR_NT; r++) acc[r][0] = tv_zero(), acc[r][1] = tv_zero();
    const float *b1 = bp + (int64_t)TW * hd;
    for (int d = 0; d < hd; d++) {
        tv x0 = tv_load(bp + d * TW), x1 = np > 1 ? tv_load(b1 + d * TW) : tv_zero();
#pragma GCC unroll 16
        for (int r = 0; r < TR_NT; r++) {
            tv y = tv_bcast(a[d * TR_NT + r]);
            acc[r][0] = tv_fma(y, x0, acc[r][0]);
            if (np > 1) acc[r][1] = tv_fma(y, x1, acc[r][1]);
        }
    }
    tv s = tv_bcast(alpha);
#pragma GCC unroll 16
    for (int r = 0; r < TR_NT; r++) {
        if (r >= nr) break;
        for (int p = 0; p < np; p++) {
            int at = col + p * TW, left = ncols - at;
            float *out = c + r * ldc + at;
            if (left >= TW) tv_store(out, tv_mul(s, acc[r][p]));
            else if (left > 0) tv_storem(out, tv_mul(s, acc[r][p]), tv_mask(left));
        }
    }
}

/* c[i, j] = alpha * sum_d a[i, d] b[j, d] for the rows i < rows (lda
 * apart, hd <= HS_ATT_TILE_MAX_HD) and, in each group of TR_NT rows g, the
 * columns [c0[g], c1[g]) rounded out to whole panels (bp: b packed by
 * pack); columns outside them are left as they were. ncols: c's row width,
 * none stored past it. */
static void TILE(nt)(float *c, int64_t ldc, const float *a, int64_t lda, const float *bp, int hd,
                     int rows, int ncols, const int *c0, const int *c1, float alpha) {
    for (int i = 0, g = 0; i < rows; i += TR_NT, g++) {
        if (c0[g] >= c1[g]) continue;
        int nr = rows - i < TR_NT ? rows - i : TR_NT;
        float ar[TR_NT * HS_ATT_TILE_MAX_HD];
        const float *row[TW]; /* TR_NT <= TW; rows past nr repeat the last */
        for (int r = 0; r < TW; r++) row[r] = a + (int64_t)(i + (r < nr ? r : nr - 1)) * lda;
        int d0 = 0;
        for (tmask k = tv_mask(TR_NT); d0 + TW <= hd; d0 += TW) {
            tv x[TW];
            for (int r = 0; r < TW; r++) x[r] = tv_load(row[r] + d0);
            tv_transpose(x);
            for (int e = 0; e < TW; e++) tv_storem(ar + (d0 + e) * TR_NT, x[e], k);
        }
        for (int r = 0; r < TR_NT; r++)
            for (int d = d0; d < hd; d++) ar[d * TR_NT + r] = row[r][d];
        /* the next group's rows on their way in while this one computes */
        for (int r = i + TR_NT; r < rows && r < i + 2 * TR_NT; r++)
            for (int d = 0; d < hd; d += 16) __builtin_prefetch(a + (int64_t)r * lda + d);
        int p1 = (c1[g] + TW - 1) / TW;
        for (int p = c0[g] / TW; p < p1; p += 2) {
            const float *panel = bp + (int64_t)p * TW * hd;
            float *ci = c + (int64_t)i * ldc;
            if (p + 1 < p1) TILE(nt_tile)(ci, ldc, ar, panel, hd, 2, p * TW, ncols, nr, alpha);
            else TILE(nt_tile)(ci, ldc, ar, panel, hd, 1, p * TW, ncols, nr, alpha);
        }
    }
}

/* TR_PB output rows (c[r] their first value, p + poff[r] their first
 * weight) over nv vectors (a constant where inlined; the last masked by m
 * where `masked`) from column d0: c[r] = alpha * sum_t p[t * st + poff[r]]
 * b[t, d0 ..] for t in [t0, t1), added to c[r]'s old value where acc. */
static inline __attribute__((always_inline)) void
TILE(pb_tile)(float *const *c, const float *p, const int64_t *poff, int64_t st, const float *b,
              int64_t ldb, int d0, int nv, bool masked, tmask m, int t0, int t1, int nr,
              float alpha, bool acc) {
    tv sum[TR_PB][TNV];
#pragma GCC unroll 16
    for (int r = 0; r < TR_PB; r++)
#pragma GCC unroll 8
        for (int v = 0; v < TNV; v++) sum[r][v] = tv_zero();
    for (int t = t0; t < t1; t++) {
        const float *bt = b + (int64_t)t * ldb + d0, *pt = p + (int64_t)t * st;
        tv x[TNV];
#pragma GCC unroll 8
        for (int v = 0; v < TNV; v++)
            if (v < nv)
                x[v] = masked && v == nv - 1 ? tv_loadm(bt + v * TW, m) : tv_load(bt + v * TW);
#pragma GCC unroll 16
        for (int r = 0; r < TR_PB; r++) {
            tv y = tv_bcast(pt[poff[r]]);
#pragma GCC unroll 8
            for (int v = 0; v < TNV; v++)
                if (v < nv) sum[r][v] = tv_fma(y, x[v], sum[r][v]);
        }
    }
    tv s = tv_bcast(alpha);
#pragma GCC unroll 16
    for (int r = 0; r < TR_PB; r++) {
        if (r >= nr) break;
#pragma GCC unroll 8
        for (int v = 0; v < TNV; v++) {
            if (v >= nv) break;
            float *out = c[r] + d0 + v * TW;
            bool part = masked && v == nv - 1;
            tv old = acc ? (part ? tv_loadm(out, m) : tv_load(out)) : tv_zero();
            tv val = acc ? tv_fma(s, sum[r][v], old) : tv_mul(s, sum[r][v]);
            if (part) tv_storem(out, val, m);
            else tv_store(out, val);
        }
    }
}

/* One group's d chunk at its vector count (a constant in each case). */
static void TILE(pb_chunk)(float *const *c, const float *p, const int64_t *poff, int64_t st,
                           const float *b, int64_t ldb, int d0, int nv, int tail, int t0, int t1,
                           int nr, float alpha, bool acc) {
    tmask m = tv_mask(tail);
    bool masked = tail < TW;
    switch (nv * 2 + masked) {
#define TILE_PB_CASE(n)                                                                            \
    case 2 * (n):                                                                                  \
        TILE(pb_tile)(c, p, poff, st, b, ldb, d0, n, false, m, t0, t1, nr, alpha, acc);            \
        break;                                                                                     \
    case 2 * (n) + 1:                                                                              \
        TILE(pb_tile)(c, p, poff, st, b, ldb, d0, n, true, m, t0, t1, nr, alpha, acc);             \
        break;
        TILE_PB_CASE(1)
        TILE_PB_CASE(2)
#if TNV >= 3
        TILE_PB_CASE(3)
#endif
#if TNV >= 4
        TILE_PB_CASE(4)
#endif
#undef TILE_PB_CASE
    default: break;
    }
}

/* c[o, :hd] = alpha * sum_t p[o * sr + t * st] b[t, :hd] (+ c's old value
 * where acc) for the output rows o < nout (ldc apart), t over [t0[g],
 * t1[g]) for each group g of TR_PB rows; b's rows ldb apart. sr, st = the
 * row and inner strides of p: (ld, 1) multiplies P by B, (1, ld) P's
 * transpose. A group with an empty range gets zeros (or is left as it was
 * where acc). */
static void TILE(pb)(float *c, int64_t ldc, const float *p, int64_t sr, int64_t st, const float *b,
                     int64_t ldb, int hd, int nout, const int *t0, const int *t1, float alpha,
                     bool acc) {
    for (int o = 0, g = 0; o < nout; o += TR_PB, g++) {
        if (acc && t0[g] >= t1[g]) continue;
        int nr = nout - o < TR_PB ? nout - o : TR_PB;
        float *cr[TR_PB];
        int64_t poff[TR_PB];
        for (int r = 0; r < TR_PB; r++) {
            int rr = r < nr ? r : nr - 1;
            cr[r] = c + (int64_t)(o + rr) * ldc;
            poff[r] = (int64_t)(o + rr) * sr;
        }
        for (int d0 = 0; d0 < hd; d0 += TNV * TW) {
            int left = hd - d0, nv = (left + TW - 1) / TW;
            nv = nv < TNV ? nv : TNV;
            int tail = left - (nv - 1) * TW;
            tail = tail < TW ? tail : TW;
            TILE(pb_chunk)(cr, p, poff, st, b, ldb, d0, nv, tail, t0[g], t1[g], nr, alpha, acc);
        }
    }
}

/* e^x lane by lane: hs_expf's range reduction and Cephes polynomial in
 * fused multiply-adds (within 2 ulp of expf; the unit test sweeps it);
 * below -87.34, 0; above 88.38, +Inf; NaN stays NaN. */
static inline __attribute__((always_inline)) tv TILE(exp)(tv x) {
    tv xc = tv_min(tv_max(x, tv_bcast(-87.3365447f)), tv_bcast(88.3762626f));
    tv shift = tv_bcast(12582912.0f); /* 1.5 * 2^23: round to nearest */
    tv n = tv_sub(tv_fma(xc, tv_bcast(1.44269504089f), shift), shift);
    tv r = tv_fma(n, tv_bcast(-0.693359375f), xc);
    r = tv_fma(n, tv_bcast(2.12194440e-4f), r);
    tv p = tv_bcast(1.9875691500e-4f);
    p = tv_fma(p, r, tv_bcast(1.3981999507e-3f));
    p = tv_fma(p, r, tv_bcast(8.3334519073e-3f));
    p = tv_fma(p, r, tv_bcast(4.1665795894e-2f));
    p = tv_fma(p, r, tv_bcast(1.6666665459e-1f));
    p = tv_fma(p, r, tv_bcast(5.0000001201e-1f));
    p = tv_add(tv_fma(p, tv_mul(r, r), r), tv_bcast(1.0f));
    tv y = tv_mul(p, tv_pow2(n));
    y = tv_sel(tv_lt(x, tv_bcast(-87.3365447f)), tv_zero(), y);
    y = tv_sel(tv_gt(x, tv_bcast(88.3762626f)), tv_bcast(INFINITY), y);
    return tv_sel(tv_nan(x), x, y);
}

/* s[j] = e^(s[j] - m) for j < n, and their sum (in TW fp32 lanes, then
 * the lanes in double, tv_sum): a softmax row's exponentials. */
static double TILE(exp_sum)(float *s, int n, float m) {
    tv mv = tv_bcast(m), sum = tv_zero();
    int j = 0;
    for (; j + TW <= n; j += TW) {
        tv y = TILE(exp)(tv_sub(tv_load(s + j), mv));
        tv_store(s + j, y);
        sum = tv_add(sum, y);
    }
    if (j < n) {
        tmask k = tv_mask(n - j);
        tv y = tv_keep(TILE(exp)(tv_sub(tv_loadm(s + j, k), mv)), k);
        tv_storem(s + j, y, k);
        sum = tv_add(sum, y);
    }
    return tv_sum(sum);
}

static const hs_att_tiles TILE(table) = {.w = TW,
                                         .max_hd = HS_ATT_TILE_MAX_HD,
                                         .r_nt = TR_NT,
                                         .r_pb = TR_PB,
                                         .pack = TILE(pack),
                                         .nt = TILE(nt),
                                         .pb = TILE(pb),
                                         .exp_sum = TILE(exp_sum)};
