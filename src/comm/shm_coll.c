/* comm/shm_coll.c — reduce-scatter, all-reduce and all-gather of the
 * intra-node path (shm.h).
 *
 * Reduce-scatter: rank r reduces chunk r alone, tile by tile: it reads the
 * peers' copies of the tile in the ring's order r+1, r+2, ..., r-1,
 * combines them in fp32 (sum, or max for MAX), combines its own copy last
 * and rounds once. The tile stays in
 * L2 from the read to the add: the peers' data is copied into cache, not
 * into a staging buffer in memory.
 * All-reduce: the same reduction of chunk r in place, a barrier, then every
 * rank reads the finished chunks of the others. All-gather: every rank
 * reads the others' blocks straight into its output. All-to-all: every
 * rank reads its block of each peer's input into that peer's place of its
 * output (MPI_Alltoall's layout); all-to-allv alike, each peer's count
 * and displacement for this rank read from the peer. Each collective opens
 * with a barrier that publishes the buffers and closes with one, after
 * which no peer reads this rank's buffers any more. */
#include <string.h>

#include "comm/shm.h"

/* Elements per tile: the fp32 accumulator, the widened tile and the raw
 * tile (768 KiB in all) fit in L2 together. */
#define TILE ((int64_t)65536)

typedef struct shm_layout {
    int64_t base, rem; /* chunk i: base + (i < rem) elements */
} shm_layout;

static int64_t chunk_off(shm_layout l, int i) { return i * l.base + (i < l.rem ? i : l.rem); }
static int64_t chunk_len(shm_layout l, int i) { return l.base + (i < l.rem ? 1 : 0); }

/* The reduction tiles, at the first reduction: all three or none. */
static hs_status shm_tiles(hs_shm *s, hs_error *e) {
    if (s->acc) return HS_OK;
    const size_t bytes = (size_t)TILE * sizeof(float);
    void *raw = hs_pool_alloc(s->pool, bytes);
    float *tmp = hs_pool_alloc(s->pool, bytes), *acc = hs_pool_alloc(s->pool, bytes);
    if (raw && tmp && acc) {
        s->raw = raw, s->tmp = tmp, s->acc = acc;
        return HS_OK;
    }
    hs_pool_free(s->pool, raw);
    hs_pool_free(s->pool, tmp);
    hs_pool_free(s->pool, acc);
    char what[128];
    snprintf(what, sizeof what, "the reduction tiles of group '%s' (3 of them)", s->name);
    return hs_pool_oom(s->pool, bytes, what, e);
}

/* acc (op)= peer's m elements at `remote`: the first peer sets acc, later
 * peers are combined in fp32 (for F32 the same bits as the ring's hops). */
static hs_status accumulate(hs_shm *s, int peer, uintptr_t remote, int64_t m, hs_dtype dt,
                            hs_reduce_op rop, bool first, const char *op, hs_error *e) {
    const size_t bytes = (size_t)m * hs_dtype_size(dt);
    if (first && dt == HS_DTYPE_F32) return hs_shm_read(s, peer, s->acc, remote, bytes, op, e);
    hs_status st = hs_shm_read(s, peer, s->raw, remote, bytes, op, e);
    if (st != HS_OK) return st;
    if (first) {
        hs_convert(s->acc, HS_DTYPE_F32, s->raw, dt, m);
        return HS_OK;
    }
    const float *add = s->raw;
    if (dt != HS_DTYPE_F32) {
        hs_convert(s->tmp, HS_DTYPE_F32, s->raw, dt, m);
        add = s->tmp;
    }
    hs_comm_reduce(s->acc, add, s->acc, m, HS_DTYPE_F32, rop, 1);
    return HS_OK;
}

/* out = round((acc (op) own) / divisor): the only rounding of a 16-bit
 * reduction. out may alias own. */
static void finish(hs_shm *s, void *out, const void *own, int64_t m, hs_dtype dt, hs_reduce_op op,
                   int divisor) {
    if (dt == HS_DTYPE_F32) {
        hs_comm_reduce(out, s->acc, own, m, dt, op, divisor);
        return;
    }
    hs_convert(s->tmp, HS_DTYPE_F32, own, dt, m);
    hs_comm_reduce(s->tmp, s->acc, s->tmp, m, HS_DTYPE_F32, op, divisor);
    hs_convert(out, dt, s->tmp, HS_DTYPE_F32, m);
}

/* Reduce this rank's chunk: n elements at byte offset `off` of every
 * rank's published buffer; own copy at `own`, result to `out`. */
static hs_status reduce_own_chunk(hs_shm *s, void *out, const void *own, size_t off, int64_t n,
                                  hs_dtype dt, hs_reduce_op op, const char *opname, hs_error *e) {
    const size_t es = hs_dtype_size(dt);
    const int w = s->size, divisor = op == HS_REDUCE_AVG ? w : 1;
    hs_status st = shm_tiles(s, e);
    for (int64_t i = 0; i < n && st == HS_OK; i += TILE) {
        int64_t m = n - i < TILE ? n - i : TILE;
        size_t at = off + (size_t)i * es;
        for (int k = 1; k < w && st == HS_OK; k++) {
            int peer = (s->rank + k) % w;
            st = accumulate(s, peer, s->slots[peer]->addr + at, m, dt, op, k == 1, opname, e);
        }
        if (st == HS_OK)
            finish(s, (char *)out + (size_t)i * es, (const char *)own + (size_t)i * es, m, dt, op,
                   divisor);
    }
    return st;
}

/* Read block q (offset and length from l) of every peer's published
 * buffer into the same place of `buf`. */
static hs_status gather_blocks(hs_shm *s, char *buf, shm_layout l, size_t es, const char *opname,
                               hs_error *e) {
    for (int k = 1; k < s->size; k++) {
        int q = (s->rank + k) % s->size;
        size_t off = (size_t)chunk_off(l, q) * es;
        hs_status st = hs_shm_read(s, q, buf + off, s->slots[q]->addr + off,
                                   (size_t)chunk_len(l, q) * es, opname, e);
        if (st != HS_OK) return st;
    }
    return HS_OK;
}

hs_status hs_shm_reduce_scatter(hs_shm *s, void *out, const void *in, int64_t count, hs_dtype dt,
                                hs_reduce_op op, hs_error *e) {
    if (count == 0) return HS_OK;
    const size_t off = (size_t)s->rank * (size_t)count * hs_dtype_size(dt);
    hs_shm_publish(s, in);
    hs_shm_barrier(s);
    hs_status st =
        reduce_own_chunk(s, out, (const char *)in + off, off, count, dt, op, "reduce_scatter", e);
    /* Even after a failed read: the peers still wait for this rank. */
    hs_shm_barrier(s);
    return st;
}

hs_status hs_shm_all_reduce(hs_shm *s, void *buf, int64_t count, hs_dtype dt, hs_reduce_op op,
                            hs_error *e) {
    if (count == 0) return HS_OK;
    const size_t es = hs_dtype_size(dt);
    shm_layout l = {count / s->size, count % s->size};
    char *mine = (char *)buf + (size_t)chunk_off(l, s->rank) * es;
    hs_shm_publish(s, buf);
    hs_shm_barrier(s);
    /* Peers read only their own chunk of this buffer, never chunk r. */
    hs_status st = reduce_own_chunk(s, mine, mine, (size_t)chunk_off(l, s->rank) * es,
                                    chunk_len(l, s->rank), dt, op, "all_reduce", e);
    hs_shm_barrier(s);
    if (st == HS_OK) st = gather_blocks(s, buf, l, es, "all_reduce", e);
    hs_shm_barrier(s);
    return st;
}

hs_status hs_shm_all_gather(hs_shm *s, void *out, const void *in, int64_t count, hs_dtype dt,
                            hs_error *e) {
    if (count == 0) return HS_OK;
    const size_t es = hs_dtype_size(dt);
    const shm_layout l = {count, 0};
    char *slot = (char *)out + (size_t)s->rank * (size_t)count * es;
    /* Peers read block q at the same offset of `in - q*count`: publish the
     * address that block 0 would have. */
    uintptr_t base = (uintptr_t)in - (uintptr_t)s->rank * (uintptr_t)count * es;
    hs_shm_publish(s, (const void *)base);
    hs_shm_barrier(s);
    hs_status st = gather_blocks(s, out, l, es, "all_gather", e);
    if (slot != (const char *)in) memcpy(slot, in, (size_t)count * es);
    hs_shm_barrier(s);
    return st;
}

hs_status hs_shm_all_to_all(hs_shm *s, void *out, const void *in, int64_t count, hs_dtype dt,
                            hs_error *e) {
    if (count == 0) return HS_OK;
    const size_t bytes = (size_t)count * hs_dtype_size(dt), all = bytes * (size_t)s->size;
    HS_ASSERT((const char *)out + all <= (const char *)in ||
              (const char *)in + all <= (const char *)out);
    hs_shm_publish(s, in);
    hs_shm_barrier(s);
    /* block r of each peer's input, into the peer's place of the output */
    hs_status st = HS_OK;
    for (int k = 1; k < s->size && st == HS_OK; k++) {
        int q = (s->rank + k) % s->size;
        st = hs_shm_read(s, q, (char *)out + (size_t)q * bytes,
                         s->slots[q]->addr + (size_t)s->rank * bytes, bytes, "all_to_all", e);
    }
    memcpy((char *)out + (size_t)s->rank * bytes, (const char *)in + (size_t)s->rank * bytes,
           bytes);
    hs_shm_barrier(s);
    return st;
}

/* What an all-to-allv publishes: where its input is and where its send
 * counts and displacements are, read by each peer for its own block. */
typedef struct a2av_desc {
    uintptr_t in, send_counts, send_displs;
} a2av_desc;

/* Peer q's block for this rank: its count (which must be the one this rank
 * expects) and where it starts, then the elements into place. */
static hs_status read_v_block(hs_shm *s, int q, char *out, const int64_t *recv_counts,
                              const int64_t *recv_displs, size_t es, hs_error *e) {
    a2av_desc d;
    int64_t cnt, disp;
    const size_t me = (size_t)s->rank * sizeof(int64_t);
    hs_status st = hs_shm_read(s, q, &d, s->slots[q]->addr, sizeof d, "all_to_allv", e);
    if (st == HS_OK) st = hs_shm_read(s, q, &cnt, d.send_counts + me, sizeof cnt, "all_to_allv", e);
    if (st == HS_OK)
        st = hs_shm_read(s, q, &disp, d.send_displs + me, sizeof disp, "all_to_allv", e);
    if (st != HS_OK) return st;
    if (cnt != recv_counts[q])
        return hs_error_set(e, HS_ERR_COMM,
                            "all_to_allv on group '%s': rank %d sends %lld elements to rank %d, "
                            "which expects recv_counts[%d] = %lld; the counts of both sides must "
                            "agree",
                            s->name, q, (long long)cnt, s->rank, q, (long long)recv_counts[q]);
    return hs_shm_read(s, q, out + (size_t)recv_displs[q] * es, d.in + (size_t)disp * es,
                       (size_t)cnt * es, "all_to_allv", e);
}

hs_status hs_shm_all_to_allv(hs_shm *s, void *out, const int64_t *recv_counts,
                             const int64_t *recv_displs, const void *in, const int64_t *send_counts,
                             const int64_t *send_displs, hs_dtype dt, hs_error *e) {
    const size_t es = hs_dtype_size(dt);
    hs_status st = HS_OK;
    a2av_desc d = {(uintptr_t)in, (uintptr_t)send_counts, (uintptr_t)send_displs};
    hs_shm_publish(s, &d);
    hs_shm_barrier(s);
    for (int k = 1; k < s->size && st == HS_OK; k++)
        st = read_v_block(s, (s->rank + k) % s->size, out, recv_counts, recv_displs, es, e);
    int me = s->rank;
    if (st == HS_OK && send_counts[me] != recv_counts[me])
        st = hs_error_set(e, HS_ERR_COMM,
                          "all_to_allv on group '%s': rank %d sends itself %lld elements and "
                          "expects %lld",
                          s->name, me, (long long)send_counts[me], (long long)recv_counts[me]);
    if (st == HS_OK)
        memmove((char *)out + (size_t)recv_displs[me] * es,
                (const char *)in + (size_t)send_displs[me] * es, (size_t)recv_counts[me] * es);
    /* Even after a failure: the peers still wait for this rank. */
    hs_shm_barrier(s);
    return st;
}
