/* Ring attention (parallel.h, "context parallel"): K/V blocks (a ring
 * rank's two chunks) go round the ring; while one travels, the block in
 * hand is attended to and its output merged in with an online softmax
 * (fp32 output and log-sum-exp). Backward goes round again with K/V and
 * their dK/dV accumulators; each row's D = sum(dO * O) over all keys is
 * computed once, so blocks can be handled apart; after a last step every
 * rank holds its own rows' dK/dV.
 *
 * The ring is the CP ranks (ring), or the all-to-all groups of
 * alltoall_ring (cp_ulysses.c), whose rows are the load-balanced layout
 * of the groups: either way `size` ranks of two chunks each, and p->cp's
 * ring steps go to the next one. */
#include <math.h>

#include "parallel/par_internal.h"

/* The four chunk pairs of the local queries against block `src`. */
static void ring_pairs(int size, int rank, int T, int src, hs_att_rows out[4]) {
    int C = T / 2, k = 0;
    for (int c = 0; c < 2; c++)
        for (int d = 0; d < 2; d++)
            out[k++] = hs_cp_chunk_rows(size, rank, T, c, T, d * C, C,
                                        hs_cp_global_position(size, src, T, d * C));
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

void hs_cp_ring_forward(hs_parallel *p, int size, int rank, const hs_attn_io *io) {
    int T = io->T;
    int64_t q = (int64_t)io->NH * io->HD, kvd = (int64_t)io->KVH * io->HD;
    int64_t n = (int64_t)io->B * T * kvd, rows = (int64_t)io->B * io->NH * T;
    size_t es = hs_dtype_size(io->dt);
    hs_device *d = p->d.dev;
    hs_dev_zero(d, p->b.ring_out, (size_t)((int64_t)io->B * T * q) * sizeof(float));
    d->k->fill(d->stream, p->b.ring_lse, -INFINITY, rows);
    ring_own_block(p, io, p->b.ring_kv[0], n);
    for (int s = 0; s < size; s++) {
        void *cur = p->b.ring_kv[s & 1], *next = p->b.ring_kv[(s + 1) & 1];
        bool step = s + 1 < size;
        if (step) hs_cp_ring_start(p->cp, next, cur, 2 * n, io->dt);
        int src = (rank - s + size) % size;
        hs_att_rows r[4];
        ring_pairs(size, rank, T, src, r);
        for (int k = 0; k < 4; k++) {
            hs_cp_att_fwd(p, p->b.ring_bout, HS_DTYPE_F32, p->b.ring_blse, io, cur,
                          (const char *)cur + (size_t)n * es, &r[k]);
            ring_merge(p, io, &r[k]);
        }
        if (step) hs_cp_ring_wait(p->cp);
    }
    hs_dev_convert(d, io->out, io->dt, p->b.ring_out, HS_DTYPE_F32, (int64_t)io->B * T * q);
    hs_dev_copy(d, io->lse, p->b.ring_lse, (size_t)rows * sizeof(float));
}

void hs_cp_ring_backward(hs_parallel *p, int size, int rank, const hs_attn_io *io) {
    int T = io->T;
    int64_t kvd = (int64_t)io->KVH * io->HD, n = (int64_t)io->B * T * kvd;
    size_t es = hs_dtype_size(io->dt);
    ring_own_block(p, io, p->b.ring_kv[0], n);
    hs_dev_zero(p->d.dev, p->b.ring_dkv[0], (size_t)(2 * n) * sizeof(float));
    for (int s = 0; s < size; s++) {
        void *cur = p->b.ring_kv[s & 1], *next = p->b.ring_kv[(s + 1) & 1];
        float *dcur = p->b.ring_dkv[s & 1], *dnext = p->b.ring_dkv[(s + 1) & 1];
        /* K/V travel ahead while this block is worked on; its dK/dV follow
         * once they are complete on this rank */
        bool step = s + 1 < size;
        if (step) hs_cp_ring_start(p->cp, next, cur, 2 * n, io->dt);
        int src = (rank - s + size) % size;
        hs_att_rows r[4];
        ring_pairs(size, rank, T, src, r);
        for (int k = 0; k < 4; k++)
            hs_cp_att_bwd(p, dcur, dcur + n, io, cur, (const char *)cur + (size_t)n * es, &r[k],
                          s > 0 || k > 0);
        if (step) hs_cp_ring_wait(p->cp);
        /* the accumulators move on with their block; the last move brings
         * every rank its own rows' dK/dV */
        hs_cp_ring_start(p->cp, dnext, dcur, 2 * n, HS_DTYPE_F32);
        hs_cp_ring_wait(p->cp);
    }
    float *mine = p->b.ring_dkv[size & 1];
    hs_dev_copy(p->d.dev, io->dk, mine, (size_t)n * sizeof(float));
    hs_dev_copy(p->d.dev, io->dv, mine + n, (size_t)n * sizeof(float));
}
