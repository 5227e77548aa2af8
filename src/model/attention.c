/* Causal grouped-query attention with every matrix product through BLAS.
 *
 * Queries are processed in blocks of ATT_ROWS rows; a block starting at r0
 * only needs keys 0..r1-1, so the masked upper triangle is (almost) never
 * computed. The forward saves one fp32 log-sum-exp per score row, and the
 * backward recomputes the probabilities from it: O(T) saved state per head
 * instead of O(T^2), for one extra QK^T product. Heads are addressed in
 * place inside the [B, T, H*HD] projections through the GEMM row stride. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "model/layers.h"

#define ATT_ROWS 128

static int att_rows(int T) { return T < ATT_ROWS ? T : ATT_ROWS; }

/* Per thread: P and dP of one block in fp32, then one block of 16-bit
 * values (P, then dS, rounded for the 16-bit GEMMs). */
static int64_t scratch_per_thread(int T) {
    int64_t block = (int64_t)att_rows(T) * T;
    return 2 * block + (block + 1) / 2;
}

int64_t hs_attention_scratch_floats(int T, int threads) {
    return scratch_per_thread(T) * (threads > 1 ? threads : 1);
}

/* Where one head of one sequence starts, and the row stride, of a [B,T,H*HD] buffer. */
typedef struct head_view {
    int64_t off, ld;
} head_view;

static head_view head_of(int b, int T, int h, int H, int HD) {
    head_view v = {((int64_t)b * T) * H * HD + (int64_t)h * HD, (int64_t)H * HD};
    return v;
}

/* S[rows, nk] = scale * Q[r0:r0+rows] K[0:nk]^T. */
static void att_scores(float *S, const void *q, head_view qv, const void *k, head_view kv,
                       hs_dtype dt, int r0, int rows, int nk, int HD, float scale) {
    hs_gemm_ex(false, true, rows, nk, HD, scale, hs_cat(q, dt, qv.off + r0 * qv.ld), dt, qv.ld,
               hs_cat(k, dt, kv.off), dt, kv.ld, 0.0f, S, HS_DTYPE_F32, nk);
}

/* Keys visible to query row i of a block whose first row is at global
 * position gq, when key row 0 is at global position gk: causal, clamped
 * to the nk keys of the block. */
static int visible(int64_t gq, int i, int64_t gk, int nk) {
    int64_t v = gq + i - gk + 1;
    return v < 0 ? 0 : v > nk ? nk : (int)v;
}

/* Row-wise causal softmax of S in place; writes each row's log-sum-exp
 * (-inf, and a zero row, when no key is visible). */
static void att_softmax(float *S, float *lse, int64_t gq, int64_t gk, int rows, int nk) {
    for (int i = 0; i < rows; i++) {
        float *s = S + (int64_t)i * nk;
        int valid = visible(gq, i, gk, nk);
        if (valid == 0) {
            memset(s, 0, (size_t)nk * sizeof(float));
            lse[i] = -INFINITY;
            continue;
        }
        float mx = hs_row_max(s, valid);
        for (int j = 0; j < valid; j++) s[j] = hs_expf(s[j] - mx); /* vectorises */
        double sum = hs_row_sum(s, valid);
        float inv = (float)(1.0 / sum);
        for (int j = 0; j < valid; j++) s[j] *= inv;
        memset(s + valid, 0, (size_t)(nk - valid) * sizeof(float));
        lse[i] = mx + (float)log(sum);
    }
}

/* Keys a block of `rows` queries starting at global position gq needs. */
static int block_keys(int64_t gq, int rows, int64_t gk, int Tk) {
    int64_t n = gq + rows - gk;
    return n < 0 ? 0 : n > Tk ? Tk : (int)n;
}

hs_att_rows hs_att_rows_all(int T) {
    return (hs_att_rows){.Tq = T, .Tk = T, .q0 = 0, .nq = T, .k0 = 0, .nk = T, .gq = 0, .gk = 0};
}

/* One query head of one sequence, every query block. With low (a 16-bit
 * dt whose GEMM is native) P is rounded once into the 16-bit block for
 * P V, the value the mixed-dtype GEMM would round it to, without its
 * allocation. */
static void forward_head(void *out, hs_dtype odt, float *lse, const void *q, const void *k,
                         const void *v, hs_dtype dt, bool low, float *scratch, int b, int h,
                         int NH, int KVH, int HD, const hs_att_rows *r) {
    float scale = 1.0f / sqrtf((float)HD);
    int group = NH / KVH, tb = att_rows(r->nq);
    head_view qv = head_of(b, r->Tq, h, NH, HD), kv = head_of(b, r->Tk, h / group, KVH, HD);
    kv.off += (int64_t)r->k0 * kv.ld;
    float *hl = lse + ((int64_t)b * NH + h) * r->Tq + r->q0;
    void *s16 = scratch + 2 * (int64_t)tb * r->nk;
    for (int r0 = 0; r0 < r->nq; r0 += tb) {
        int rows = r->nq - r0 < tb ? r->nq - r0 : tb, qr = r->q0 + r0;
        int64_t gq = r->gq + r0;
        int nk = block_keys(gq, rows, r->gk, r->nk);
        void *o = hs_at(out, odt, qv.off + qr * qv.ld);
        if (nk == 0) { /* no key visible: a zero output, lse -inf */
            for (int i = 0; i < rows; i++) {
                memset(hs_at(o, odt, i * qv.ld), 0, (size_t)HD * hs_dtype_size(odt));
                hl[r0 + i] = -INFINITY;
            }
            continue;
        }
        att_scores(scratch, q, qv, k, kv, dt, qr, rows, nk, HD, scale);
        att_softmax(scratch, hl + r0, gq, r->gk, rows, nk);
        if (low) hs_convert(s16, dt, scratch, HS_DTYPE_F32, (int64_t)rows * nk);
        hs_gemm_ex(false, false, rows, HD, nk, 1.0f, low ? s16 : (const void *)scratch,
                   low ? dt : HS_DTYPE_F32, nk, hs_cat(v, dt, kv.off), dt, kv.ld, 0.0f, o, odt,
                   qv.ld);
    }
}

void hs_attention_forward_rows(void *out, hs_dtype odt, float *lse, const void *q, const void *k,
                               const void *v, hs_dtype dt, float *scratch, int B, int NH, int KVH,
                               int HD, const hs_att_rows *r) {
    bool low = dt != HS_DTYPE_F32 && hs_gemm_native(dt, odt);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            forward_head(out, odt, lse, q, k, v, dt, low, scratch, b, h, NH, KVH, HD, r);
}

/* With threads > 1 the (sequence, head) pairs go over the threads, each
 * with its own scratch and its GEMMs on one thread: every head is computed
 * exactly as on one thread. */
void hs_attention_forward(void *out /* B,T,NH*HD */, float *lse /* B,NH,T */,
                          const void *q /* B,T,NH*HD */, const void *k /* B,T,KVH*HD */,
                          const void *v /* B,T,KVH*HD */, hs_dtype dt, float *scratch, int threads,
                          int B, int T, int NH, int KVH, int HD) {
    hs_att_rows r = hs_att_rows_all(T);
    int64_t per = scratch_per_thread(T);
    bool low = dt != HS_DTYPE_F32 && hs_gemm_native(dt, dt);
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int t = 0; t < B * NH; t++)
        forward_head(out, dt, lse, q, k, v, dt, low, scratch + per * omp_get_thread_num(),
                     t / NH, t % NH, NH, KVH, HD, &r);
}

/* P = exp(S - lse) on the causal part, 0 above the diagonal. */
static void att_probs(float *S, const float *lse, int64_t gq, int64_t gk, int rows, int nk) {
    for (int i = 0; i < rows; i++) {
        float *s = S + (int64_t)i * nk;
        int valid = visible(gq, i, gk, nk);
        float l = lse[i];
        for (int j = 0; j < valid; j++) s[j] = hs_expf(s[j] - l);
        memset(s + valid, 0, (size_t)(nk - valid) * sizeof(float));
    }
}

/* dS = P * (dP - D), in place over dP: D = sum_j P dP over the block's keys,
 * or the given delta (rows' sum over all keys, when keys come in blocks). */
static void att_softmax_backward(float *dP, const float *P, const float *delta, int rows, int nk) {
    for (int i = 0; i < rows; i++) {
        const float *p = P + (int64_t)i * nk;
        float *d = dP + (int64_t)i * nk;
        float fd = delta ? delta[i] : (float)hs_row_dot(p, d, nk);
        for (int j = 0; j < nk; j++) d[j] = p[j] * (d[j] - fd);
    }
}

/* The GEMMs of one block's backward. With dO16 (dO rounded to dt, the
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

static void att_backward_block(const att_bwd_block *b, float *P, float *dP, void *s16,
                               const float *delta, hs_dtype dt, int rows, int nk, int HD,
                               float scale) {
    bool low = b->dO16 != NULL;
    const void *dO = low ? b->dO16 : (const void *)b->dO;
    hs_dtype odt = low ? dt : HS_DTYPE_F32;
    /* dP = dO V^T;  dV += P^T dO */
    hs_gemm_ex(false, true, rows, nk, HD, 1.0f, dO, odt, b->qld, b->vb, dt, b->kld, 0.0f, dP,
               HS_DTYPE_F32, nk);
    if (low) hs_convert(s16, dt, P, HS_DTYPE_F32, (int64_t)rows * nk);
    hs_gemm_ex(true, false, nk, HD, rows, 1.0f, low ? s16 : (const void *)P, odt, nk, dO, odt,
               b->qld, 1.0f, b->dv, HS_DTYPE_F32, b->kld);
    att_softmax_backward(dP, P, delta, rows, nk);
    if (low) hs_convert(s16, dt, dP, HS_DTYPE_F32, (int64_t)rows * nk);
    const void *dS = low ? s16 : (const void *)dP;
    /* dQ += scale dS K;  dK += scale dS^T Q */
    hs_gemm_ex(false, false, rows, HD, nk, scale, dS, odt, nk, b->kb, dt, b->kld, 1.0f, b->dq,
               HS_DTYPE_F32, b->qld);
    hs_gemm_ex(true, false, nk, HD, rows, scale, dS, odt, nk, b->qb, dt, b->qld, 1.0f, b->dk,
               HS_DTYPE_F32, b->kld);
}

/* One query head of one sequence, every query block; dk/dv are its key
 * head's, shared with the other heads of its group. */
static void backward_head(float *dq, float *dk, float *dv, const float *dout,
                          const void *dout16, const void *q, const void *k, const void *v,
                          const float *lse, const float *delta, hs_dtype dt, float *scratch,
                          int b, int h, int NH, int KVH, int HD, const hs_att_rows *r) {
    float scale = 1.0f / sqrtf((float)HD);
    int group = NH / KVH, tb = att_rows(r->nq);
    float *P = scratch, *dP = scratch + (int64_t)tb * r->nk;
    void *s16 = scratch + 2 * (int64_t)tb * r->nk;
    head_view qv = head_of(b, r->Tq, h, NH, HD), kv = head_of(b, r->Tk, h / group, KVH, HD);
    kv.off += (int64_t)r->k0 * kv.ld;
    int64_t row0 = ((int64_t)b * NH + h) * r->Tq + r->q0;
    const float *hl = lse + row0, *hd = delta ? delta + row0 : NULL;
    if (dt == HS_DTYPE_F32) dout16 = NULL;
    for (int r0 = 0; r0 < r->nq; r0 += tb) {
        int rows = r->nq - r0 < tb ? r->nq - r0 : tb, qr = r->q0 + r0;
        int64_t gq = r->gq + r0, at = qv.off + qr * qv.ld;
        int nk = block_keys(gq, rows, r->gk, r->nk);
        if (nk == 0) continue;
        att_scores(P, q, qv, k, kv, dt, qr, rows, nk, HD, scale);
        att_probs(P, hl + r0, gq, r->gk, rows, nk);
        att_bwd_block blk = {.dO = dout + at, .dO16 = dout16 ? hs_cat(dout16, dt, at) : NULL,
                             .kb = hs_cat(k, dt, kv.off), .vb = hs_cat(v, dt, kv.off),
                             .qb = hs_cat(q, dt, at), .dq = dq + at, .dk = dk + kv.off,
                             .dv = dv + kv.off, .qld = qv.ld, .kld = kv.ld};
        att_backward_block(&blk, P, dP, s16, hd ? hd + r0 : NULL, dt, rows, nk, HD, scale);
    }
}

void hs_attention_backward_rows(float *dq, float *dk, float *dv, const float *dout,
                                const void *dout16, const void *q, const void *k, const void *v,
                                const float *lse, const float *delta, hs_dtype dt, float *scratch,
                                int B, int NH, int KVH, int HD, const hs_att_rows *r) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            backward_head(dq, dk, dv, dout, dout16, q, k, v, lse, delta, dt, scratch, b, h, NH,
                          KVH, HD, r);
}

/* With threads > 1 the (sequence, key head) pairs go over the threads:
 * each owns its dk/dv rows and runs its group's query heads in order, so
 * every sum is accumulated as on one thread. */
void hs_attention_backward(float *dq /* B,T,NH*HD */, float *dk /* B,T,KVH*HD */,
                           float *dv /* B,T,KVH*HD */, const float *dout /* B,T,NH*HD */,
                           const void *dout16, const void *q, const void *k, const void *v,
                           const float *lse, hs_dtype dt, float *scratch, int threads, int B,
                           int T, int NH, int KVH, int HD) {
    hs_att_rows r = hs_att_rows_all(T);
    int64_t per = scratch_per_thread(T);
    int group = NH / KVH;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int t = 0; t < B * KVH; t++)
        for (int h = (t % KVH) * group; h < (t % KVH + 1) * group; h++)
            backward_head(dq, dk, dv, dout, dout16, q, k, v, lse, NULL, dt,
                          scratch + per * omp_get_thread_num(), t / KVH, h, NH, KVH, HD, &r);
}
