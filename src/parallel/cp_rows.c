/* Attention on chunk row ranges through the device's table, for every CP
 * method (par_internal.h): a rank's query chunk against a key range by
 * global positions, within each document under document masking. */
#include "parallel/par_internal.h"

hs_att_rows hs_cp_chunk_rows(int cp, int rank, int T, int c, int Tk, int k0, int nk, int64_t gk) {
    int C = T / 2;
    return (hs_att_rows){.Tq = T,
                         .Tk = Tk,
                         .q0 = c * C,
                         .nq = C,
                         .k0 = k0,
                         .nk = nk,
                         .gq = hs_cp_global_position(cp, rank, T, c * C),
                         .gk = gk};
}

/* r within each document under masking: its starts are by global
 * position, as r's are. */
static hs_att_rows doc_rows(const hs_attn_io *io, const hs_att_rows *r) {
    hs_att_rows m = *r;
    m.lo = io->doc_lo, m.lo_ld = io->doc_ld;
    return m;
}

void hs_cp_att_fwd(hs_parallel *p, void *out, hs_dtype odt, float *lse, const hs_attn_io *io,
                   const void *k, const void *v, const hs_att_rows *r) {
    hs_att_work w = {.scratch = io->scratch, .threads = 1};
    hs_att_rows m = doc_rows(io, r);
    p->d.dev->k->attention_fwd(p->d.dev->stream, out, odt, lse, io->q, k, v, io->dt, io->B, io->NH,
                               io->KVH, io->HD, &m, &w);
}

void hs_cp_att_bwd(hs_parallel *p, float *dk, float *dv, const hs_attn_io *io, const void *k,
                   const void *v, const hs_att_rows *r, bool delta_ready) {
    hs_att_work w = {
        .scratch = io->scratch, .threads = 1, .delta = io->delta, .delta_ready = delta_ready};
    hs_att_rows m = doc_rows(io, r);
    p->d.dev->k->attention_bwd(p->d.dev->stream, io->dq, dk, dv, io->dout, io->out, io->dt, io->q,
                               k, v, io->lse, io->dt, io->B, io->NH, io->KVH, io->HD, &m, &w);
}
