/* Private to src/device/ (and the tests): the cpu backend's kernels by
 * their own names, which its table entries run (cpu_*.c), and the row
 * helpers they share. The layers above reach them only through the table
 * (hs_device_kernels); the element helpers they share are in device.h. */
#ifndef HS_DEVICE_CPU_KERNELS_H
#define HS_DEVICE_CPU_KERNELS_H

#include "hypershard/device.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

/* ----------------------------------------------------------- helpers */

/* Element counts from which a cpu kernel splits its loop over the GEMM
 * threads (OpenMP; one thread per rank under mpiexec runs it inline). */
#define HS_PAR_MIN 32768
/* The exp-bound loops (SwiGLU, the cross-entropy's rows, attention's
 * softmax steps) have AVX-512 clones (HS_WIDE, tensor.h);
 * tests/unit/test_layers.c holds them to their formulas bit for bit. */

/* Row reductions in HS_LANES independent lanes combined in lane order, so
 * that the loops vectorise (one serial chain would not); the value depends
 * on the row only. Sums and dot products accumulate in fp64. */
#define HS_LANES 8

/* The largest of x[0..n), n >= 1 (a NaN is kept only where the row starts
 * with it, as in the scalar loop; a row with a NaN still gives a NaN loss
 * through its exponentials).
 * With AVX2 the lanes are one vector: VMAXPS(v, acc) is v > acc ? v : acc
 * lane by lane, the scalar loop's own choice (GCC leaves that loop scalar),
 * so both give the same bits, NaNs included. Four chains of lanes, each
 * starting from the row's first HS_LANES values, take the vectors in turn
 * (one chain waits on each VMAXPS's latency) and are folded into the
 * first: a maximum is exact in any order, and a lane's NaN still survives
 * only from its start. */
#define HS_MAX_CHAINS 4
static inline float hs_row_max(const float *x, int n) {
    float mx = x[0];
    int i = 1;
    if (n >= 2 * HS_LANES) {
        float acc[HS_LANES];
#if defined(__AVX2__) && HS_LANES == 8 && HS_MAX_CHAINS == 4
        __m256 a = _mm256_loadu_ps(x), b = a, c = a, d = a;
        for (i = HS_LANES; i + 4 * HS_LANES <= n; i += 4 * HS_LANES) {
            a = _mm256_max_ps(_mm256_loadu_ps(x + i), a);
            b = _mm256_max_ps(_mm256_loadu_ps(x + i + HS_LANES), b);
            c = _mm256_max_ps(_mm256_loadu_ps(x + i + 2 * HS_LANES), c);
            d = _mm256_max_ps(_mm256_loadu_ps(x + i + 3 * HS_LANES), d);
        }
        for (; i + HS_LANES <= n; i += HS_LANES) a = _mm256_max_ps(_mm256_loadu_ps(x + i), a);
        a = _mm256_max_ps(b, a), a = _mm256_max_ps(c, a), a = _mm256_max_ps(d, a);
        _mm256_storeu_ps(acc, a);
#else
        float ch[HS_MAX_CHAINS][HS_LANES];
        for (int k = 0; k < HS_MAX_CHAINS; k++)
            for (int j = 0; j < HS_LANES; j++) ch[k][j] = x[j];
        for (i = HS_LANES; i + HS_MAX_CHAINS * HS_LANES <= n; i += HS_MAX_CHAINS * HS_LANES)
            for (int k = 0; k < HS_MAX_CHAINS; k++)
                for (int j = 0; j < HS_LANES; j++) {
                    float v = x[i + k * HS_LANES + j];
                    ch[k][j] = v > ch[k][j] ? v : ch[k][j];
                }
        for (; i + HS_LANES <= n; i += HS_LANES)
            for (int j = 0; j < HS_LANES; j++) ch[0][j] = x[i + j] > ch[0][j] ? x[i + j] : ch[0][j];
        for (int j = 0; j < HS_LANES; j++) {
            acc[j] = ch[0][j];
            for (int k = 1; k < HS_MAX_CHAINS; k++) acc[j] = ch[k][j] > acc[j] ? ch[k][j] : acc[j];
        }
#endif
        mx = acc[0];
        for (int j = 1; j < HS_LANES; j++) mx = acc[j] > mx ? acc[j] : mx;
    }
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

static inline double hs_row_sum(const float *x, int n) {
    double acc[HS_LANES] = {0.0}, s = 0.0;
    int i = 0;
    for (; i + HS_LANES <= n; i += HS_LANES)
        for (int j = 0; j < HS_LANES; j++) acc[j] += x[i + j];
    for (; i < n; i++) s += x[i];
    for (int j = 0; j < HS_LANES; j++) s += acc[j];
    return s;
}

/* p[i] += v with one rounding to dt. */
static inline void hs_acc(void *p, hs_dtype dt, int64_t i, float v) {
    hs_st(p, dt, i, hs_ld(p, dt, i) + v);
}

/* sum_i x[i] * y[off + i] over i < n, y read in dtype dt, in the fp64
 * lanes of hs_row_sum; inlined per dtype where dt is a constant. */
static inline __attribute__((always_inline)) double hs_row_dot_ld(const float *x, const void *y,
                                                                  hs_dtype dt, int64_t off, int n) {
    double acc[HS_LANES] = {0.0}, s = 0.0;
    int i = 0;
    for (; i + HS_LANES <= n; i += HS_LANES)
        for (int j = 0; j < HS_LANES; j++) acc[j] += (double)x[i + j] * hs_ld(y, dt, off + i + j);
    for (; i < n; i++) s += (double)x[i] * hs_ld(y, dt, off + i);
    for (int j = 0; j < HS_LANES; j++) s += acc[j];
    return s;
}

static inline double hs_row_dot(const float *x, const float *y, int n) {
    return hs_row_dot_ld(x, y, HS_DTYPE_F32, 0, n);
}

/* x[i] := (float)(dt)x[i] for n fp32 values: the value a cast to dt and
 * back would give. A no-op for fp32. */
static inline void hs_round_f32(float *x, hs_dtype dt, int64_t n) {
    if (dt == HS_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++) x[i] = hs_bf16_to_f32(hs_f32_to_bf16(x[i]));
    else if (dt == HS_DTYPE_F16)
        for (int64_t i = 0; i < n; i++) x[i] = hs_f16_to_f32(hs_f32_to_f16(x[i]));
}

/* ----------------------------------------------------------- cpu kernels */

/* The kernels behind the cpu backend's table entries, by their own names
 * (the tests call them too). */

/* ------------------------------------------------------------- embedding */

/* out[n,:] = wte[tokens[n],:]. Tokens must already be checked in [0, V). */
void hs_embedding_forward(void *out /* N,C */, const int32_t *tokens /* N */,
                          const void *wte /* V,C */, hs_dtype dt, int64_t N, int C);
/* dwte[tokens[n],:] += dout[n,:]. */
void hs_embedding_backward(void *dwte /* V,C */, hs_dtype gdt, const float *dout /* N,C */,
                           const int32_t *tokens /* N */, int64_t N, int C);

/* --------------------------------------------------------------- rmsnorm */

/* out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps) per row (fp32, saved). */
void hs_rmsnorm_forward(void *out /* N,C */, float *rstd /* N */, const void *x /* N,C */,
                        const void *w /* C */, hs_dtype dt, int64_t N, int C, float eps);
hs_status hs_rmsnorm_backward(float *dx /* N,C */, void *dw /* C */, hs_dtype gdt,
                              const float *dout /* N,C */, const void *x /* N,C */,
                              const void *w /* C */, const float *rstd /* N */, hs_dtype dt,
                              int64_t N, int C, hs_error *e);
/* The same with the input x in its own dtype xdt (a unit boundary may hand
 * a block its input in another dtype than the compute dtype dt). */
void hs_rmsnorm_forward_x(void *out /* N,C */, float *rstd /* N */, const void *x /* N,C */,
                          hs_dtype xdt, const void *w /* C */, hs_dtype dt, int64_t N, int C,
                          float eps);
/* part: hs_rmsnorm_backward_scratch(N, C) doubles of the caller's scratch
 * (device.h) for dw's partial sums (unused when dw is NULL);
 * hs_rmsnorm_backward allocates its own. */
void hs_rmsnorm_backward_x(float *dx /* N,C */, void *dw /* C */, hs_dtype gdt,
                           const float *dout /* N,C */, const void *x /* N,C */, hs_dtype xdt,
                           const void *w /* C */, const float *rstd /* N */, hs_dtype dt, int64_t N,
                           int C, double *part);

/* ------------------------------------------------------------------ rope */

/* Hugging Face layout: within each head, dims i and i+HD/2 rotate together
 * by angle pos * inv_freq[i] (plain RoPE: hs_rope_inv_freq). Tables are
 * [T, HD/2] fp32, cos and sin times scale. */
void hs_rope_tables_freqs(float *cos_t /* T,HD/2 */, float *sin_t /* T,HD/2 */, int T, int HD,
                          const float *inv_freq, float scale);
/* In place on x [B,T,H*HD] in dtype dt (rounded once per element). */
void hs_rope_forward(void *x /* B,T,H,HD */, hs_dtype dt, const float *cos_t, const float *sin_t,
                     int B, int T, int H, int HD);
/* In place on the fp32 gradient: applies the inverse rotation. */
void hs_rope_backward(float *dx /* B,T,H,HD */, const float *cos_t, const float *sin_t, int B,
                      int T, int H, int HD);

/* -------------------------------------------------------------- attention */

/* Causal grouped-query attention, scale 1/sqrt(HD); query head h reads
 * key/value head h / (NH/KVH). Tiled over query and key blocks with an
 * online softmax; saves the fp32 log-sum-exp of every score row so that
 * backward recomputes probabilities instead of storing [T, T].
 * `scratch` holds hs_attention_scratch_floats(T, HD, threads) floats
 * (device.h). */
/* threads: the (sequence, head) pairs of forward and the (sequence, key
 * head) pairs of backward split over that many threads (OpenMP), each with
 * its own slice of scratch and its GEMMs on one thread, so the result is
 * the one-thread result bit for bit; scratch is sized for them. HS_ERR_OOM
 * (e may be NULL) when a GEMM could not allocate its own scratch: the
 * output is then incomplete. */
hs_status hs_attention_forward(void *out /* B,T,NH*HD */, float *lse /* B,NH,T */,
                               const void *q /* B,T,NH*HD */, const void *k /* B,T,KVH*HD */,
                               const void *v /* B,T,KVH*HD */, hs_dtype dt, float *scratch,
                               int threads, int B, int T, int NH, int KVH, int HD, hs_error *e);
/* Each query row's D = sum over its head dim of dO * O (O the forward's
 * output in dt), which the backward of every key tile needs. */
void hs_attention_delta(float *delta /* B,NH,T */, const float *dout /* B,T,NH*HD */,
                        const void *out /* B,T,NH*HD */, hs_dtype dt, int B, int T, int NH, int HD);
/* delta: from hs_attention_delta. dout16: dout rounded to a 16-bit dt
 * whose GEMM is native, for 16-bit products throughout (P and dS rounded
 * too); NULL: fp32 dout, P and dS go to the mixed-dtype GEMM. */
hs_status hs_attention_backward(float *dq /* B,T,NH*HD */, float *dk /* B,T,KVH*HD */,
                                float *dv /* B,T,KVH*HD */, const float *dout /* B,T,NH*HD */,
                                const void *dout16, const void *q, const void *k, const void *v,
                                const float *lse, const float *delta, hs_dtype dt, float *scratch,
                                int threads, int B, int T, int NH, int KVH, int HD, hs_error *e);

/* The same on a row range, for context parallelism: query rows
 * [q0, q0+nq) of a [B, Tq, NH*HD] q, whose row q0 is at global position gq,
 * against key rows [k0, k0+nk) of a [B, Tk, KVH*HD] k/v, row k0 at global
 * position gk (hs_att_rows);
 * query at position p sees keys at positions <= p. lse is [B, NH, Tq]; a
 * row that sees no key gets a zero output and lse -inf. The output is in
 * odt (fp32 for the ring's online-softmax merge). Backward accumulates dq
 * (local rows) and dk/dv ([B, Tk]); `delta` ([B, NH, Tq]) is each row's
 * sum of dO * O over all keys, so the keys may come in blocks. `native`:
 * whether dt's products run oneDNN's 16-bit matmul (hs_device_gemm_native;
 * the whole-sequence entries take hs_gemm16_native), else widened. */
hs_status hs_attention_forward_rows(void *out, hs_dtype odt, float *lse, const void *q,
                                    const void *k, const void *v, hs_dtype dt, float *scratch,
                                    int B, int NH, int KVH, int HD, const hs_att_rows *r,
                                    bool native, hs_error *e);
hs_status hs_attention_backward_rows(float *dq, float *dk, float *dv, const float *dout,
                                     const void *dout16, const void *q, const void *k,
                                     const void *v, const float *lse, const float *delta,
                                     hs_dtype dt, float *scratch, int B, int NH, int KVH, int HD,
                                     const hs_att_rows *r, bool native, hs_error *e);

/* Attention's fp32 tile products in registers for one ISA tier
 * (cpu_attention_tiles.c), which fp32 attention takes instead of oneDNN's
 * GEMMs: every output element one FMA chain over its inner index in order,
 * the same operations at both tiers. Rows go in groups (r_nt rows for nt,
 * r_pb for pb), each group g over its own inner range, so a causal tile's
 * masked part is skipped group by group.
 *   pack: the n rows of src (ld apart, hd values) as panels of w rows,
 *         each [hd][w] (dst: ceil(n / w) * w * hd floats, zero-padded);
 *   nt:   c[i, j] = alpha * sum_d a[i, d] b[j, d] (b packed), for group g's
 *         columns [c0[g], c1[g]) rounded out to panels, none past ncols;
 *   pb:   c[o, :hd] = alpha * sum_t p[o * sr + t * st] b[t, :hd] over group
 *         g's t in [t0[g], t1[g]), added to c's old value where acc;
 *   exp_sum: s[j] = e^(s[j] - m) for j < n (fused multiply-adds, within
 *         2 ulp; NaN stays NaN) and their sum (fp32 lanes, then in double):
 *         the softmax rows of the tiles these products make. */
#define HS_ATT_TILE_MAX_HD 512
typedef struct hs_att_tiles {
    int w, max_hd, r_nt, r_pb; /* max_hd: the widest head nt takes */
    void (*pack)(float *dst, const float *src, int64_t ld, int n, int hd);
    void (*nt)(float *c, int64_t ldc, const float *a, int64_t lda, const float *bp, int hd,
               int rows, int ncols, const int *c0, const int *c1, float alpha);
    void (*pb)(float *c, int64_t ldc, const float *p, int64_t sr, int64_t st, const float *b,
               int64_t ldb, int hd, int nout, const int *t0, const int *t1, float alpha, bool acc);
    double (*exp_sum)(float *s, int n, float m);
} hs_att_tiles;
/* NULL where the build cannot emit the tier (not x86-64 GCC with AVX2);
 * the AVX-512 table only for a CPU where hs_cpu_wide_vectors(). */
const hs_att_tiles *hs_att_tiles_avx2(void);
const hs_att_tiles *hs_att_tiles_avx512(void);

/* ----------------------------------------------------------------- swiglu */

/* out = silu(gate) * up. */
void hs_swiglu_forward(void *out /* N,F */, const void *gate /* N,F */, const void *up /* N,F */,
                       hs_dtype dt, int64_t n);
void hs_swiglu_backward(float *dgate /* N,F */, float *dup /* N,F */, const float *dout /* N,F */,
                        const void *gate, const void *up, hs_dtype dt, int64_t n);
/* The same, storing over dgate and dup instead when overwrite (their only
 * contribution: no zero fill first). */
void hs_swiglu_backward_ex(float *dgate /* N,F */, float *dup /* N,F */, bool overwrite,
                           const float *dout /* N,F */, const void *gate, const void *up,
                           hs_dtype dt, int64_t n);

/* ---------------------------------------------------------- cross-entropy */

/* Sum over rows with target >= 0 of logsumexp(logits) - logits[target], in
 * fp64. With dlogits == logits (allowed) the logits are replaced, in
 * place, by the gradient (softmax - onehot) * scale on valid rows and 0 on
 * ignored rows. dlogits may be NULL (loss only). *valid counts rows used. */
double hs_xent_forward_backward(float *dlogits /* N,V */, const float *logits /* N,V */,
                                const int32_t *targets /* N */, int64_t N, int V, float scale,
                                int64_t *valid);

/* --------------------------------------------------------------- adamw */

/* AdamW on n fp32 values (torch.optim.AdamW, non-fused):
 * p = p * decay_factor - step_size * m / (sqrt(v) / bias2_sqrt + eps)
 * after m and v take g. */
void hs_adamw_update_f32(float *restrict p, float *restrict m, float *restrict v,
                         const float *restrict g, const hs_adamw_hparams *h, int64_t n);

/* ------------------------------------------------------------------ muon */

/* Muon's orthogonalisation: X <- NS5(G) (rows x cols, fp32), `steps`
 * iterations with coefficients (3.4445, -4.7750, 2.0315), its matmuls on
 * BLAS; the cpu table's muon_newton_schulz. */
hs_status hs_newton_schulz5(float *out, const float *g, int64_t rows, int64_t cols, int steps,
                            float *scratch, hs_error *e);

#endif
