/* All-to-all ("Ulysses", as DeepSpeed-Ulysses) context parallelism and its
 * hybrid with the ring (parallel.h, "context parallel").
 *
 * alltoall: each CP rank trades its rows of every local head for all the
 * rows of a2a = cp ranks for heads / cp of the heads. q, k and v go through
 * an all-to-all over the cp group, the blocks received are laid out in
 * global order (hs_cp_blocks_to_whole) and the rank runs the one-device
 * causal attention over the whole sequence on its heads; the output goes
 * back through the reverse all-to-all. Backward mirrors it: q, k, v, the
 * output and dO go over again (nothing whole-sequence is kept per layer),
 * the one-device backward runs, dQ, dK and dV come back.
 *
 * alltoall_ring: the same inside groups of a2a consecutive CP ranks. Group
 * g's rows laid out as the whole of a2a ranks are chunks [g a2a, (g+1) a2a)
 * followed by their mirror [2cp - (g+1) a2a, 2cp - g a2a): the
 * load-balanced layout of cp / a2a ranks with chunks a2a times as long, so
 * ring attention across the groups (ring steps a2a CP ranks apart, between
 * the ranks that hold the same heads) completes it.
 *
 * KV heads: a TP rank's H kv heads split over the group when a2a divides
 * H; when H divides a2a each rank gets the one kv head its query heads
 * read (replicated to a2a / H ranks) and the replicas' dK/dV are summed on
 * the way back. The forward keeps its heads' log-sum-exp over the group's
 * rows in the layer's lse (the same number of elements) for the backward. */
#include "parallel/par_internal.h"

/* The first of the heads (of H) that group rank j computes with. */
static int first_head(int H, int a2a, int j) { return (int)((int64_t)j * H / a2a); }

/* io for this rank's heads over the group's rows, in the a2a buffers. */
static hs_attn_io group_io(const hs_parallel *p, const hs_attn_io *io) {
    int a = p->l.cp_a2a;
    hs_attn_io g = *io;
    g.T = io->T * a;
    g.NH = io->NH / a;
    g.KVH = hs_cp_a2a_heads(io->KVH, a);
    g.q = p->b.a2a_q, g.k = p->b.a2a_k, g.v = p->b.a2a_v;
    g.out = p->b.a2a_out;
    g.dout = p->b.a2a_dout;
    g.dq = p->b.a2a_dq, g.dk = p->b.a2a_dk, g.dv = p->b.a2a_dv;
    return g;
}

/* One tensor of H heads as the exchange moves it: local [B*T, H*HD] rows,
 * n heads per group rank, in dt. */
typedef struct heads_xfer {
    int H, n, a;
    int64_t rows;
    size_t es, head_bytes, ld; /* head_bytes: n heads of a row; ld: a local row */
} heads_xfer;

static heads_xfer xfer_of(const hs_parallel *p, const hs_attn_io *io, int H, hs_dtype dt) {
    heads_xfer x = {.H = H, .a = p->l.cp_a2a, .rows = (int64_t)io->B * io->T};
    x.n = hs_cp_a2a_heads(H, x.a);
    x.es = hs_dtype_size(dt);
    x.head_bytes = (size_t)x.n * io->HD * x.es;
    x.ld = (size_t)H * io->HD * x.es;
    return x;
}

/* local -> group: group rank j gets this rank's rows of its heads, and
 * `whole` ([B, a2a T, n HD]) every member's rows of this rank's heads. */
static void heads_in(hs_parallel *p, void *whole, const void *local, int H, hs_dtype dt,
                     const hs_attn_io *io) {
    hs_device *d = p->d.dev;
    heads_xfer x = xfer_of(p, io, H, dt);
    char *send = p->b.a2a_send;
    for (int j = 0; j < x.a; j++) {
        const char *src = (const char *)local + (size_t)first_head(H, x.a, j) * io->HD * x.es;
        hs_dev_copy_2d(d, send + (size_t)j * x.rows * x.head_bytes, x.head_bytes, src, x.ld, x.rows,
                       x.head_bytes);
    }
    hs_cp_all_to_all(p->cp, p->b.a2a_recv, send, x.rows * x.n * io->HD, dt);
    hs_cp_blocks_to_whole(d, whole, p->b.a2a_recv, x.a, io->B, io->T, (int64_t)x.n * io->HD, x.es);
}

/* group -> local, the inverse; the replicas of a kv head (fp32 gradients)
 * are summed into the first before it is stored. */
static void heads_out(hs_parallel *p, void *local, const void *whole, int H, hs_dtype dt,
                      const hs_attn_io *io) {
    hs_device *d = p->d.dev;
    heads_xfer x = xfer_of(p, io, H, dt);
    char *recv = p->b.a2a_recv;
    int64_t block = x.rows * x.n * io->HD;
    hs_cp_whole_to_blocks(d, p->b.a2a_send, whole, x.a, io->B, io->T, (int64_t)x.n * io->HD, x.es);
    hs_cp_all_to_all(p->cp, recv, p->b.a2a_send, block, dt);
    int reps = H < x.a ? x.a / H : 1;
    HS_ASSERT(reps == 1 || dt == HS_DTYPE_F32);
    for (int j = 0; j < x.a; j += reps) {
        float *first = (float *)(recv + (size_t)j * block * x.es);
        for (int i = 1; i < reps; i++) hs_dev_add(d, first, first + (int64_t)i * block, block);
        char *dst = (char *)local + (size_t)first_head(H, x.a, j) * io->HD * x.es;
        hs_dev_copy_2d(d, dst, x.ld, first, x.head_bytes, x.rows, x.head_bytes);
    }
}

/* The groups: one (alltoall) attends over the whole sequence as one
 * device does; several ring over the groups. */
static int groups(const hs_parallel *p) { return p->l.cp / p->l.cp_a2a; }
static int group_rank(const hs_parallel *p) { return p->l.cp_rank / p->l.cp_a2a; }

void hs_cp_ulysses_forward(hs_parallel *p, const hs_attn_io *io) {
    hs_attn_io g = group_io(p, io);
    heads_in(p, p->b.a2a_q, io->q, io->NH, io->dt, io);
    heads_in(p, p->b.a2a_k, io->k, io->KVH, io->dt, io);
    heads_in(p, p->b.a2a_v, io->v, io->KVH, io->dt, io);
    if (groups(p) == 1) hs_model_one_device_par()->attention_fwd(&p->d, &g);
    else hs_cp_ring_forward(p, groups(p), group_rank(p), &g);
    heads_out(p, io->out, p->b.a2a_out, io->NH, io->dt, io);
}

void hs_cp_ulysses_backward(hs_parallel *p, const hs_attn_io *io) {
    hs_attn_io g = group_io(p, io);
    hs_device *d = p->d.dev;
    heads_in(p, p->b.a2a_q, io->q, io->NH, io->dt, io);
    heads_in(p, p->b.a2a_k, io->k, io->KVH, io->dt, io);
    heads_in(p, p->b.a2a_v, io->v, io->KVH, io->dt, io);
    heads_in(p, p->b.a2a_out, io->out, io->NH, io->dt, io);
    heads_in(p, p->b.a2a_dout, io->dout, io->NH, HS_DTYPE_F32, io);
    int64_t nq = (int64_t)g.B * g.T * g.NH * g.HD, nkv = (int64_t)g.B * g.T * g.KVH * g.HD;
    hs_dev_zero(d, g.dq, (size_t)nq * sizeof(float));
    hs_dev_zero(d, g.dk, (size_t)nkv * sizeof(float));
    hs_dev_zero(d, g.dv, (size_t)nkv * sizeof(float));
    if (groups(p) == 1) hs_model_one_device_par()->attention_bwd(&p->d, &g);
    else hs_cp_ring_backward(p, groups(p), group_rank(p), &g);
    heads_out(p, io->dq, g.dq, io->NH, HS_DTYPE_F32, io);
    heads_out(p, io->dk, g.dk, io->KVH, HS_DTYPE_F32, io);
    heads_out(p, io->dv, g.dv, io->KVH, HS_DTYPE_F32, io);
}
