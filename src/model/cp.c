/* Context-parallel attention (model.h, "Context parallelism"). Queries are
 * this CP rank's two chunks of each sequence; keys come from every CP rank.
 *
 * allgather: K and V are all-gathered over cp and laid out in global order,
 * each local query chunk attends to the keys up to its position (one call
 * per chunk: the same products as one device); in backward K/V are
 * gathered again (nothing whole-sequence is kept per layer) and the whole
 * dK/dV is reduce-scattered back to the ranks that own the rows.
 *
 * ring: K/V blocks (a rank's two chunks) go round the CP ring; while one
 * travels, the block in hand is attended to and its output merged in with
 * an online softmax (fp32 output and log-sum-exp). Backward goes round
 * again with K/V and their dK/dV accumulators; each row's D = sum(dO * O)
 * over all keys is computed once, so blocks can be handled apart; after a
 * last step every rank holds its own rows' dK/dV. */
#include <math.h>
#include <string.h>

#include "model/layers.h"
#include "model/model_internal.h"

void hs_cp_prepare(hs_model *m, int T_local) {
    if (!m->cp_on) return;
    int half = m->HD / 2;
    for (int t = 0; t < T_local; t++) {
        int64_t g = hs_cp_global_position(m->cp, m->cp_rank, T_local, t);
        hs_dev_copy(m->dev, m->cos_l + (int64_t)t * half, m->cos_t + g * half,
                    (size_t)half * sizeof(float));
        hs_dev_copy(m->dev, m->sin_l + (int64_t)t * half, m->sin_t + g * half,
                    (size_t)half * sizeof(float));
    }
    m->rope_cos = m->cos_l, m->rope_sin = m->sin_l;
}

/* Query chunk c of the local rows against key chunk d of `src`'s rows in
 * a [B, Tk, kvd] tensor holding those rows at k0 (allgather: the whole
 * sequence, k0 = the chunk's global start; ring: the block, local rows). */
static hs_att_rows chunk_rows(const hs_model *m, int T, int c, int Tk, int k0, int nk, int64_t gk) {
    int C = T / 2;
    return (hs_att_rows){.Tq = T,
                         .Tk = Tk,
                         .q0 = c * C,
                         .nq = C,
                         .k0 = k0,
                         .nk = nk,
                         .gq = hs_cp_global_position(m->cp, m->cp_rank, T, c * C),
                         .gk = gk};
}

/* Attention on the rows of r through the device's table, with the model's
 * scratch; backward's per-row D goes to m->att_delta on the first call over
 * the local rows (delta_ready false) and is reused by the later ones. */
static void att_fwd(hs_model *m, void *out, hs_dtype odt, float *lse, const hs_block_acts *a,
                    const void *k, const void *v, int B, const hs_att_rows *r) {
    hs_att_work w = {.scratch = m->att_scratch, .threads = 1};
    m->k->attention_fwd(m->s, out, odt, lse, a->q, k, v, m->dt, B, m->NH, m->KVH, m->HD, r, &w);
}

static void att_bwd(hs_model *m, float *dk, float *dv, const hs_block_acts *a, const void *k,
                    const void *v, int B, const hs_att_rows *r, bool delta_ready) {
    hs_att_work w = {
        .scratch = m->att_scratch, .threads = 1, .delta = m->att_delta, .delta_ready = delta_ready};
    m->k->attention_bwd(m->s, m->dq, dk, dv, m->datt, a->atty, m->dt, a->q, k, v, a->lse, m->dt, B,
                        m->NH, m->KVH, m->HD, r, &w);
}

static void gather_kv(hs_model *m, const hs_block_acts *a, int B, int T) {
    int64_t kvd = (int64_t)m->KVH * m->HD, n = (int64_t)B * T * kvd;
    size_t es = hs_dtype_size(m->dt);
    const hs_model_ops *o = m->ops;
    o->cp_all_gather(o->cp_ctx, m->cp_stage, a->k, n, m->dt);
    hs_cp_blocks_to_whole(m->dev, m->kf, m->cp_stage, m->cp, B, T, kvd, es);
    o->cp_all_gather(o->cp_ctx, m->cp_stage, a->v, n, m->dt);
    hs_cp_blocks_to_whole(m->dev, m->vf, m->cp_stage, m->cp, B, T, kvd, es);
}

/* ------------------------------------------------------------ allgather */

static void allgather_forward(hs_model *m, hs_block_acts *a, int B, int T) {
    gather_kv(m, a, B, T);
    int Tw = T * m->cp;
    for (int c = 0; c < 2; c++) {
        hs_att_rows r = chunk_rows(m, T, c, Tw, 0, Tw, 0);
        att_fwd(m, a->atty, m->dt, a->lse, a, m->kf, m->vf, B, &r);
    }
}

static void allgather_backward(hs_model *m, hs_block_acts *a, int B, int T) {
    gather_kv(m, a, B, T);
    int Tw = T * m->cp;
    int64_t kvd = (int64_t)m->KVH * m->HD, n = (int64_t)B * T * kvd;
    hs_dev_zero(m->dev, m->dkf, (size_t)(n * m->cp) * sizeof(float));
    hs_dev_zero(m->dev, m->dvf, (size_t)(n * m->cp) * sizeof(float));
    for (int c = 0; c < 2; c++) {
        hs_att_rows r = chunk_rows(m, T, c, Tw, 0, Tw, 0);
        att_bwd(m, m->dkf, m->dvf, a, m->kf, m->vf, B, &r, c > 0);
    }
    const hs_model_ops *o = m->ops;
    hs_cp_whole_to_blocks(m->dev, m->cp_fstage, m->dkf, m->cp, B, T, kvd, sizeof(float));
    o->cp_reduce_scatter(o->cp_ctx, m->dk, m->cp_fstage, n);
    hs_cp_whole_to_blocks(m->dev, m->cp_fstage, m->dvf, m->cp, B, T, kvd, sizeof(float));
    o->cp_reduce_scatter(o->cp_ctx, m->dv, m->cp_fstage, n);
}

/* ----------------------------------------------------------------- ring */

/* The four chunk pairs of the local queries against block `src`. */
static void ring_pairs(const hs_model *m, int T, int src, hs_att_rows out[4]) {
    int C = T / 2, k = 0;
    for (int c = 0; c < 2; c++)
        for (int d = 0; d < 2; d++)
            out[k++] =
                chunk_rows(m, T, c, T, d * C, C, hs_cp_global_position(m->cp, src, T, d * C));
}

/* acc (out, lse) := merge of acc and the block's (bout, blse) on the query
 * rows of r the block's attention just wrote. */
static void ring_merge(hs_model *m, int B, const hs_att_rows *r) {
    m->k->attention_merge(m->s, m->ring_out, m->ring_lse, m->ring_bout, m->ring_blse, B, m->NH,
                          m->HD, r);
}

/* The block's [K | V] (n elements each) from the local k and v. */
static void ring_own_block(hs_model *m, const hs_block_acts *a, void *kv, int64_t n) {
    size_t bytes = (size_t)n * hs_dtype_size(m->dt);
    hs_dev_copy(m->dev, kv, a->k, bytes);
    hs_dev_copy(m->dev, (char *)kv + bytes, a->v, bytes);
}

static void ring_forward(hs_model *m, hs_block_acts *a, int B, int T) {
    const hs_model_ops *o = m->ops;
    int64_t q = (int64_t)m->NH * m->HD, kvd = (int64_t)m->KVH * m->HD, n = (int64_t)B * T * kvd;
    size_t es = hs_dtype_size(m->dt);
    hs_dev_zero(m->dev, m->ring_out, (size_t)((int64_t)B * T * q) * sizeof(float));
    m->k->fill(m->s, m->ring_lse, -INFINITY, (int64_t)B * m->NH * T);
    ring_own_block(m, a, m->ring_kv[0], n);
    for (int s = 0; s < m->cp; s++) {
        void *cur = m->ring_kv[s & 1], *next = m->ring_kv[(s + 1) & 1];
        void *step = s + 1 < m->cp ? o->cp_ring_start(o->cp_ctx, next, cur, 2 * n, m->dt) : NULL;
        int src = (m->cp_rank - s + m->cp) % m->cp;
        hs_att_rows r[4];
        ring_pairs(m, T, src, r);
        for (int k = 0; k < 4; k++) {
            att_fwd(m, m->ring_bout, HS_DTYPE_F32, m->ring_blse, a, cur,
                    (const char *)cur + (size_t)n * es, B, &r[k]);
            ring_merge(m, B, &r[k]);
        }
        if (step) o->cp_ring_wait(o->cp_ctx, step);
    }
    hs_dev_convert(m->dev, a->atty, m->dt, m->ring_out, HS_DTYPE_F32, (int64_t)B * T * q);
    hs_dev_copy(m->dev, a->lse, m->ring_lse, (size_t)((int64_t)B * m->NH * T) * sizeof(float));
}

static void ring_backward(hs_model *m, hs_block_acts *a, int B, int T) {
    const hs_model_ops *o = m->ops;
    int64_t kvd = (int64_t)m->KVH * m->HD, n = (int64_t)B * T * kvd;
    size_t es = hs_dtype_size(m->dt);
    ring_own_block(m, a, m->ring_kv[0], n);
    hs_dev_zero(m->dev, m->ring_dkv[0], (size_t)(2 * n) * sizeof(float));
    for (int s = 0; s < m->cp; s++) {
        void *cur = m->ring_kv[s & 1], *next = m->ring_kv[(s + 1) & 1];
        float *dcur = m->ring_dkv[s & 1], *dnext = m->ring_dkv[(s + 1) & 1];
        /* K/V travel ahead while this block is worked on; its dK/dV follow
         * once they are complete on this rank */
        void *step = s + 1 < m->cp ? o->cp_ring_start(o->cp_ctx, next, cur, 2 * n, m->dt) : NULL;
        int src = (m->cp_rank - s + m->cp) % m->cp;
        hs_att_rows r[4];
        ring_pairs(m, T, src, r);
        for (int k = 0; k < 4; k++)
            att_bwd(m, dcur, dcur + n, a, cur, (const char *)cur + (size_t)n * es, B, &r[k],
                    s > 0 || k > 0);
        if (step) o->cp_ring_wait(o->cp_ctx, step);
        /* the accumulators move on with their block; the last move brings
         * every rank its own rows' dK/dV */
        void *dstep = o->cp_ring_start(o->cp_ctx, dnext, dcur, 2 * n, HS_DTYPE_F32);
        o->cp_ring_wait(o->cp_ctx, dstep);
    }
    float *mine = m->ring_dkv[m->cp & 1];
    hs_dev_copy(m->dev, m->dk, mine, (size_t)n * sizeof(float));
    hs_dev_copy(m->dev, m->dv, mine + n, (size_t)n * sizeof(float));
}

void hs_cp_attention_forward(hs_model *m, hs_block_acts *a, int B, int T) {
    if (m->ops->cp_ring) ring_forward(m, a, B, T);
    else allgather_forward(m, a, B, T);
}

void hs_cp_attention_backward(hs_model *m, hs_block_acts *a, int B, int T) {
    if (m->ops->cp_ring) ring_backward(m, a, B, T);
    else allgather_backward(m, a, B, T);
}
