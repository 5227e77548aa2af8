/* Context-parallel attention (parallel.h, "context parallel"). Queries are
 * this CP rank's two chunks of each sequence; keys come from every CP rank.
 * The method (hs_cp_method) picks how:
 *
 * allgather: K and V are all-gathered over cp and laid out in global order,
 * each local query chunk attends to the keys up to its position (one call
 * per chunk: the same products as one device); in backward K/V are
 * gathered again (nothing whole-sequence is kept per layer) and the whole
 * dK/dV is reduce-scattered back to the ranks that own the rows.
 *
 * ring (cp_ring.c): K/V blocks go round the CP ring, outputs merged with
 * an online softmax. alltoall and alltoall_ring (cp_ulysses.c): heads are
 * traded for rows by all-to-alls, then whole-sequence attention or the
 * ring across the all-to-all groups. */
#include "parallel/par_internal.h"

static void cp_rope_tables(void *ctx, int T_local, const float **cos, const float **sin) {
    hs_parallel *p = ctx;
    int half = p->d.rope_hd / 2;
    for (int t = 0; t < T_local; t++) {
        int64_t g = hs_cp_global_position(p->l.cp, p->l.cp_rank, T_local, t);
        hs_dev_copy(p->d.dev, p->b.cos_l + (int64_t)t * half, p->d.cos_t + g * half,
                    (size_t)half * sizeof(float));
        hs_dev_copy(p->d.dev, p->b.sin_l + (int64_t)t * half, p->d.sin_t + g * half,
                    (size_t)half * sizeof(float));
    }
    *cos = p->b.cos_l, *sin = p->b.sin_l;
}

/* ------------------------------------------------------------ allgather */

static void gather_kv(hs_parallel *p, const hs_attn_io *io) {
    int64_t kvd = (int64_t)io->KVH * io->HD, n = (int64_t)io->B * io->T * kvd;
    size_t es = hs_dtype_size(io->dt);
    hs_cp_gather(p->cp, p->b.stage, io->k, n, io->dt);
    hs_cp_blocks_to_whole(p->d.dev, p->b.kf, p->b.stage, p->l.cp, io->B, io->T, kvd, es);
    hs_cp_gather(p->cp, p->b.stage, io->v, n, io->dt);
    hs_cp_blocks_to_whole(p->d.dev, p->b.vf, p->b.stage, p->l.cp, io->B, io->T, kvd, es);
}

/* Local query chunk c against the whole gathered sequence. */
static hs_att_rows whole_rows(const hs_parallel *p, int T, int c) {
    int Tw = T * p->l.cp;
    return hs_cp_chunk_rows(p->l.cp, p->l.cp_rank, T, c, Tw, 0, Tw, 0);
}

static void allgather_forward(hs_parallel *p, const hs_attn_io *io) {
    gather_kv(p, io);
    for (int c = 0; c < 2; c++) {
        hs_att_rows r = whole_rows(p, io->T, c);
        hs_cp_att_fwd(p, io->out, io->dt, io->lse, io, p->b.kf, p->b.vf, &r);
    }
}

static void allgather_backward(hs_parallel *p, const hs_attn_io *io) {
    gather_kv(p, io);
    int T = io->T;
    int64_t kvd = (int64_t)io->KVH * io->HD, n = (int64_t)io->B * T * kvd;
    hs_device *d = p->d.dev;
    hs_dev_zero(d, p->b.dkf, (size_t)(n * p->l.cp) * sizeof(float));
    hs_dev_zero(d, p->b.dvf, (size_t)(n * p->l.cp) * sizeof(float));
    for (int c = 0; c < 2; c++) {
        hs_att_rows r = whole_rows(p, T, c);
        hs_cp_att_bwd(p, p->b.dkf, p->b.dvf, io, p->b.kf, p->b.vf, &r, c > 0);
    }
    hs_cp_whole_to_blocks(d, p->b.fstage, p->b.dkf, p->l.cp, io->B, T, kvd, sizeof(float));
    hs_cp_reduce_scatter(p->cp, io->dk, p->b.fstage, n);
    hs_cp_whole_to_blocks(d, p->b.fstage, p->b.dvf, p->l.cp, io->B, T, kvd, sizeof(float));
    hs_cp_reduce_scatter(p->cp, io->dv, p->b.fstage, n);
}

/* --------------------------------------------------------------- the seam */

static void cp_attention_fwd(void *ctx, const hs_attn_io *io) {
    hs_parallel *p = ctx;
    switch (p->l.cp_method) {
    case HS_CP_RING: hs_cp_ring_forward(p, p->l.cp, p->l.cp_rank, io); break;
    case HS_CP_ALLTOALL:
    case HS_CP_ALLTOALL_RING: hs_cp_ulysses_forward(p, io); break;
    default: allgather_forward(p, io);
    }
}

static void cp_attention_bwd(void *ctx, const hs_attn_io *io) {
    hs_parallel *p = ctx;
    switch (p->l.cp_method) {
    case HS_CP_RING: hs_cp_ring_backward(p, p->l.cp, p->l.cp_rank, io); break;
    case HS_CP_ALLTOALL:
    case HS_CP_ALLTOALL_RING: hs_cp_ulysses_backward(p, io); break;
    default: allgather_backward(p, io);
    }
}

void hs_cp_attention_fill(hs_model_par *seam) {
    seam->rope_tables = cp_rope_tables;
    seam->attention_fwd = cp_attention_fwd;
    seam->attention_bwd = cp_attention_bwd;
}
