/* Context-parallel attention (parallel.h, "context parallel"). Queries are
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

#include "parallel/par_internal.h"

static void cp_rope_tables(void *ctx, int T_local, const float **cos, const float **sin) {
    hs_parallel *p = ctx;
    int half = p->d.HD / 2;
    for (int t = 0; t < T_local; t++) {
        int64_t g = hs_cp_global_position(p->l.cp, p->l.cp_rank, T_local, t);
        hs_dev_copy(p->d.dev, p->b.cos_l + (int64_t)t * half, p->d.cos_t + g * half,
                    (size_t)half * sizeof(float));
        hs_dev_copy(p->d.dev, p->b.sin_l + (int64_t)t * half, p->d.sin_t + g * half,
                    (size_t)half * sizeof(float));
    }
    *cos = p->b.cos_l, *sin = p->b.sin_l;
}

/* Query chunk c of the local rows against key chunk d of `src`'s rows in
 * a [B, Tk, kvd] tensor holding those rows at k0 (allgather: the whole
 * sequence, k0 = the chunk's global start; ring: the block, local rows). */
static hs_att_rows chunk_rows(const hs_parallel *p, int T, int c, int Tk, int k0, int nk,
                              int64_t gk) {
    int C = T / 2;
    return (hs_att_rows){.Tq = T,
                         .Tk = Tk,
                         .q0 = c * C,
                         .nq = C,
                         .k0 = k0,
                         .nk = nk,
                         .gq = hs_cp_global_position(p->l.cp, p->l.cp_rank, T, c * C),
                         .gk = gk};
}

/* Attention on the rows of r through the device's table, with the model's
 * scratch; backward's per-row D goes to io->delta on the first call over
 * the local rows (delta_ready false) and is reused by the later ones. */
static void att_fwd(hs_parallel *p, void *out, hs_dtype odt, float *lse, const hs_attn_io *io,
                    const void *k, const void *v, const hs_att_rows *r) {
    hs_att_work w = {.scratch = io->scratch, .threads = 1};
    p->d.dev->k->attention_fwd(p->d.dev->stream, out, odt, lse, io->q, k, v, io->dt, io->B, io->NH,
                               io->KVH, io->HD, r, &w);
}

static void att_bwd(hs_parallel *p, float *dk, float *dv, const hs_attn_io *io, const void *k,
                    const void *v, const hs_att_rows *r, bool delta_ready) {
    hs_att_work w = {
        .scratch = io->scratch, .threads = 1, .delta = io->delta, .delta_ready = delta_ready};
    p->d.dev->k->attention_bwd(p->d.dev->stream, io->dq, dk, dv, io->dout, io->out, io->dt, io->q,
                               k, v, io->lse, io->dt, io->B, io->NH, io->KVH, io->HD, r, &w);
}

static void gather_kv(hs_parallel *p, const hs_attn_io *io) {
    int64_t kvd = (int64_t)io->KVH * io->HD, n = (int64_t)io->B * io->T * kvd;
    size_t es = hs_dtype_size(io->dt);
    hs_cp_gather(p->cp, p->b.stage, io->k, n, io->dt);
    hs_cp_blocks_to_whole(p->d.dev, p->b.kf, p->b.stage, p->l.cp, io->B, io->T, kvd, es);
    hs_cp_gather(p->cp, p->b.stage, io->v, n, io->dt);
    hs_cp_blocks_to_whole(p->d.dev, p->b.vf, p->b.stage, p->l.cp, io->B, io->T, kvd, es);
}

/* ------------------------------------------------------------ allgather */

static void allgather_forward(hs_parallel *p, const hs_attn_io *io) {
    gather_kv(p, io);
    int Tw = io->T * p->l.cp;
    for (int c = 0; c < 2; c++) {
        hs_att_rows r = chunk_rows(p, io->T, c, Tw, 0, Tw, 0);
        att_fwd(p, io->out, io->dt, io->lse, io, p->b.kf, p->b.vf, &r);
    }
}

static void allgather_backward(hs_parallel *p, const hs_attn_io *io) {
    gather_kv(p, io);
    int T = io->T, Tw = T * p->l.cp;
    int64_t kvd = (int64_t)io->KVH * io->HD, n = (int64_t)io->B * T * kvd;
    hs_device *d = p->d.dev;
    hs_dev_zero(d, p->b.dkf, (size_t)(n * p->l.cp) * sizeof(float));
    hs_dev_zero(d, p->b.dvf, (size_t)(n * p->l.cp) * sizeof(float));
    for (int c = 0; c < 2; c++) {
        hs_att_rows r = chunk_rows(p, T, c, Tw, 0, Tw, 0);
        att_bwd(p, p->b.dkf, p->b.dvf, io, p->b.kf, p->b.vf, &r, c > 0);
    }
    hs_cp_whole_to_blocks(d, p->b.fstage, p->b.dkf, p->l.cp, io->B, T, kvd, sizeof(float));
    hs_cp_reduce_scatter(p->cp, io->dk, p->b.fstage, n);
    hs_cp_whole_to_blocks(d, p->b.fstage, p->b.dvf, p->l.cp, io->B, T, kvd, sizeof(float));
    hs_cp_reduce_scatter(p->cp, io->dv, p->b.fstage, n);
}

/* ----------------------------------------------------------------- ring */

/* The four chunk pairs of the local queries against block `src`. */
static void ring_pairs(const hs_parallel *p, int T, int src, hs_att_rows out[4]) {
    int C = T / 2, k = 0;
    for (int c = 0; c < 2; c++)
        for (int d = 0; d < 2; d++)
            out[k++] =
                chunk_rows(p, T, c, T, d * C, C, hs_cp_global_position(p->l.cp, src, T, d * C));
}

/* acc (out, lse) := merge of acc and the block's (bout, blse) on the query
 * rows of r the block's attention just wrote. */
static void ring_merge(hs_parallel *p, const hs_attn_io *io, const hs_att_rows *r) {
    p->d.dev->k->attention_merge(p->d.dev->stream, p->b.ring_out, p->b.ring_lse, p->b.ring_bout,
                                 p->b.ring_blse, io->B, io->NH, io->HD, r);
}

/* The block's [K | V] (n elements each) from the local k and v. */
static void ring_own_block(hs_parallel *p, const hs_attn_io *io, void *kv, int64_t n) {
    size_t bytes = (size_t)n * hs_dtype_size(io->dt);
    hs_dev_copy(p->d.dev, kv, io->k, bytes);
    hs_dev_copy(p->d.dev, (char *)kv + bytes, io->v, bytes);
}

static void ring_forward(hs_parallel *p, const hs_attn_io *io) {
    int T = io->T, cp = p->l.cp;
    int64_t q = (int64_t)io->NH * io->HD, kvd = (int64_t)io->KVH * io->HD;
    int64_t n = (int64_t)io->B * T * kvd, rows = (int64_t)io->B * io->NH * T;
    size_t es = hs_dtype_size(io->dt);
    hs_device *d = p->d.dev;
    hs_dev_zero(d, p->b.ring_out, (size_t)((int64_t)io->B * T * q) * sizeof(float));
    d->k->fill(d->stream, p->b.ring_lse, -INFINITY, rows);
    ring_own_block(p, io, p->b.ring_kv[0], n);
    for (int s = 0; s < cp; s++) {
        void *cur = p->b.ring_kv[s & 1], *next = p->b.ring_kv[(s + 1) & 1];
        bool step = s + 1 < cp;
        if (step) hs_cp_ring_start(p->cp, next, cur, 2 * n, io->dt);
        int src = (p->l.cp_rank - s + cp) % cp;
        hs_att_rows r[4];
        ring_pairs(p, T, src, r);
        for (int k = 0; k < 4; k++) {
            att_fwd(p, p->b.ring_bout, HS_DTYPE_F32, p->b.ring_blse, io, cur,
                    (const char *)cur + (size_t)n * es, &r[k]);
            ring_merge(p, io, &r[k]);
        }
        if (step) hs_cp_ring_wait(p->cp);
    }
    hs_dev_convert(d, io->out, io->dt, p->b.ring_out, HS_DTYPE_F32, (int64_t)io->B * T * q);
    hs_dev_copy(d, io->lse, p->b.ring_lse, (size_t)rows * sizeof(float));
}

static void ring_backward(hs_parallel *p, const hs_attn_io *io) {
    int T = io->T, cp = p->l.cp;
    int64_t kvd = (int64_t)io->KVH * io->HD, n = (int64_t)io->B * T * kvd;
    size_t es = hs_dtype_size(io->dt);
    ring_own_block(p, io, p->b.ring_kv[0], n);
    hs_dev_zero(p->d.dev, p->b.ring_dkv[0], (size_t)(2 * n) * sizeof(float));
    for (int s = 0; s < cp; s++) {
        void *cur = p->b.ring_kv[s & 1], *next = p->b.ring_kv[(s + 1) & 1];
        float *dcur = p->b.ring_dkv[s & 1], *dnext = p->b.ring_dkv[(s + 1) & 1];
        /* K/V travel ahead while this block is worked on; its dK/dV follow
         * once they are complete on this rank */
        bool step = s + 1 < cp;
        if (step) hs_cp_ring_start(p->cp, next, cur, 2 * n, io->dt);
        int src = (p->l.cp_rank - s + cp) % cp;
        hs_att_rows r[4];
        ring_pairs(p, T, src, r);
        for (int k = 0; k < 4; k++)
            att_bwd(p, dcur, dcur + n, io, cur, (const char *)cur + (size_t)n * es, &r[k],
                    s > 0 || k > 0);
        if (step) hs_cp_ring_wait(p->cp);
        /* the accumulators move on with their block; the last move brings
         * every rank its own rows' dK/dV */
        hs_cp_ring_start(p->cp, dnext, dcur, 2 * n, HS_DTYPE_F32);
        hs_cp_ring_wait(p->cp);
    }
    float *mine = p->b.ring_dkv[cp & 1];
    hs_dev_copy(p->d.dev, io->dk, mine, (size_t)n * sizeof(float));
    hs_dev_copy(p->d.dev, io->dv, mine + n, (size_t)n * sizeof(float));
}

static void cp_attention_fwd(void *ctx, const hs_attn_io *io) {
    hs_parallel *p = ctx;
    if (p->l.cp_ring) ring_forward(p, io);
    else allgather_forward(p, io);
}

static void cp_attention_bwd(void *ctx, const hs_attn_io *io) {
    hs_parallel *p = ctx;
    if (p->l.cp_ring) ring_backward(p, io);
    else allgather_backward(p, io);
}

void hs_cp_attention_fill(hs_model_par *seam) {
    seam->rope_tables = cp_rope_tables;
    seam->attention_fwd = cp_attention_fwd;
    seam->attention_bwd = cp_attention_bwd;
}
