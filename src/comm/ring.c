/* comm/ring.c — ring reduce-scatter, all-reduce and all-gather over
 * point-to-point messages, with the group's staging buffers.
 *
 * Chunks: a reduce-scatter has W chunks of `count` elements. An all-reduce
 * of N elements splits N like an uneven scatter: chunk i has
 * N/W + (i < N%W) elements, so any N and any W work.
 *
 * Reduce-scatter: W-1 steps. In step s rank r sends the partial sum of chunk
 * (r-1-s) mod W to rank r+1 and receives the partial of chunk (r-2-s) mod W
 * from rank r-1, adds its own contribution and keeps the result for the next
 * step. After the last step rank r holds chunk r reduced over all ranks, in
 * the order r+1, r+2, ..., r (mod W). All-reduce then runs a ring all-gather
 * of the finished chunks, so every rank ends with identical bits.
 *
 * All-gather: W-1 steps; in step s rank r sends block (r-s) mod W to r+1
 * and receives block (r-s-1) mod W from r-1, straight into the output. */
#include <string.h>

#include "comm/ring.h"

typedef struct ring_layout {
    int64_t base, rem; /* chunk i: base + (i < rem) elements */
} ring_layout;

static int64_t chunk_off(ring_layout l, int i) { return i * l.base + (i < l.rem ? i : l.rem); }
static int64_t chunk_len(ring_layout l, int i) { return l.base + (i < l.rem ? 1 : 0); }
static int ring_mod(int x, int w) { return ((x % w) + w) % w; }

/* The reduce-scatter phase. `in` holds every chunk. Partials go to `work`
 * (in place: the partial of chunk c overwrites in's chunk c, which this rank
 * no longer needs) or to a staging buffer when `work` is NULL. The finished
 * chunk r is written to `out`. */
static hs_status ring_rs_phase(hs_mpi_group *g, void *out, const void *in, char *work,
                               ring_layout l, hs_dtype dt, hs_reduce_op op, hs_error *e,
                               const char *opname) {
    const int w = g->size, r = g->rank;
    const size_t es = hs_dtype_size(dt);
    const char *src = in;
    hs_status st = hs_mpi_group_stage(g, (size_t)chunk_len(l, 0) * es, e);
    if (st != HS_OK) return st;
    char *incoming = g->stage[0], *partial = g->stage[1];
    int c = ring_mod(r - 1, w);
    const char *send = src + chunk_off(l, c) * es;
    int64_t send_len = chunk_len(l, c);
    for (int s = 0; s < w - 1; s++) {
        c = ring_mod(r - 2 - s, w);
        int64_t n = chunk_len(l, c);
        int rc = hs_mpi_sendrecv_bytes(send, (size_t)send_len * es, ring_mod(r + 1, w), incoming,
                                       (size_t)n * es, ring_mod(r - 1, w), g->coll);
        if (rc != MPI_SUCCESS) return hs_mpi_fail(g, e, rc, "MPI_Sendrecv", opname);
        bool last = s == w - 2;
        char *dst = last ? out : work ? work + chunk_off(l, c) * es : partial;
        hs_comm_reduce(dst, incoming, src + chunk_off(l, c) * es, n, dt, op,
                       last && op == HS_REDUCE_AVG ? w : 1);
        send = dst;
        send_len = n;
    }
    return HS_OK;
}

/* Ring all-gather of the chunks of `buf`: rank r owns chunk r. `mine`, when
 * not NULL, holds chunk r outside buf (an out-of-place all-gather): step 0
 * sends it from there and copies it into place afterwards, so the
 * neighbour reads clean source lines instead of ones this rank just wrote. */
static hs_status ring_ag_phase(hs_mpi_group *g, char *buf, const char *mine, ring_layout l,
                               size_t es, hs_error *e, const char *opname) {
    const int w = g->size, r = g->rank;
    for (int s = 0; s < w - 1; s++) {
        int sc = ring_mod(r - s, w), rcv = ring_mod(r - s - 1, w);
        const char *src = s == 0 && mine ? mine : buf + chunk_off(l, sc) * es;
        int rc = hs_mpi_sendrecv_bytes(src, (size_t)chunk_len(l, sc) * es, ring_mod(r + 1, w),
                                       buf + chunk_off(l, rcv) * es, (size_t)chunk_len(l, rcv) * es,
                                       ring_mod(r - 1, w), g->coll);
        if (rc != MPI_SUCCESS) return hs_mpi_fail(g, e, rc, "MPI_Sendrecv", opname);
        if (s == 0 && mine) memcpy(buf + chunk_off(l, r) * es, mine, (size_t)chunk_len(l, r) * es);
    }
    return HS_OK;
}

hs_status hs_ring_reduce_scatter(hs_mpi_group *g, void *out, const void *in, int64_t count,
                                 hs_dtype dt, hs_reduce_op op, hs_error *e) {
    if (count == 0) return HS_OK;
    if (g->size == 1) {
        /* A reduction over one rank: the input itself. */
        if (out != in) memmove(out, in, (size_t)count * hs_dtype_size(dt));
        return HS_OK;
    }
    ring_layout l = {count, 0};
    return ring_rs_phase(g, out, in, NULL, l, dt, op, e, "reduce_scatter");
}

hs_status hs_ring_all_reduce(hs_mpi_group *g, void *buf, int64_t count, hs_dtype dt,
                             hs_reduce_op op, hs_error *e) {
    if (count == 0 || g->size == 1) return HS_OK;
    const size_t es = hs_dtype_size(dt);
    ring_layout l = {count / g->size, count % g->size};
    char *b = buf;
    hs_status st =
        ring_rs_phase(g, b + chunk_off(l, g->rank) * es, buf, buf, l, dt, op, e, "all_reduce");
    if (st != HS_OK) return st;
    return ring_ag_phase(g, b, NULL, l, es, e, "all_reduce");
}

hs_status hs_ring_all_gather(hs_mpi_group *g, void *out, const void *in, int64_t count, hs_dtype dt,
                             hs_error *e) {
    if (count == 0) return HS_OK;
    const size_t es = hs_dtype_size(dt);
    char *slot = (char *)out + (size_t)g->rank * (size_t)count * es;
    const char *mine = slot == (const char *)in ? NULL : in;
    if (g->size == 1) {
        if (mine) memcpy(slot, mine, (size_t)count * es);
        return HS_OK;
    }
    ring_layout l = {count, 0};
    return ring_ag_phase(g, out, mine, l, es, e, "all_gather");
}
