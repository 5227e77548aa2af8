/* ckpt/box.c — boxes of a global tensor (per-dim offset and size), their
 * element count (a tensor chunk's too), their intersection, and the copy of
 * a box between two row-major chunks. This is the whole of resharding: a
 * target chunk takes from every saved chunk the intersection of the two
 * boxes. */
#include <stdio.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"

int64_t hs_ckpt_box_numel(int ndim, const int64_t *size) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= size[d];
    return n;
}

/* A tensor descriptor's chunk is a box: its element count. */
int64_t hs_ckpt_tensor_numel(const hs_ckpt_tensor *t) {
    return hs_ckpt_box_numel(t->ndim, t->size);
}

bool hs_ckpt_box_intersect(int ndim, const int64_t *a_off, const int64_t *a_size,
                           const int64_t *b_off, const int64_t *b_size, int64_t *out_off,
                           int64_t *out_size) {
    bool any = true;
    for (int d = 0; d < ndim; d++) {
        int64_t lo = a_off[d] > b_off[d] ? a_off[d] : b_off[d];
        int64_t a_hi = a_off[d] + a_size[d], b_hi = b_off[d] + b_size[d];
        int64_t hi = a_hi < b_hi ? a_hi : b_hi;
        out_off[d] = lo;
        out_size[d] = hi > lo ? hi - lo : 0;
        if (hi <= lo) any = false;
    }
    return any;
}

/* Element index of global position `pos` inside the row-major chunk. */
static int64_t chunk_index(int ndim, const int64_t *pos, const int64_t *off, const int64_t *size) {
    int64_t idx = 0;
    for (int d = 0; d < ndim; d++) idx = idx * size[d] + (pos[d] - off[d]);
    return idx;
}

/* The first dim of the runs: every dim after it the box spans whole in
 * both chunks, so for each index of the dims before it the box is one
 * contiguous run in both. */
static int run_dim(int ndim, const int64_t *size, const int64_t *src_size,
                   const int64_t *dst_size) {
    int d = ndim - 1;
    while (d > 0 && size[d] == src_size[d] && size[d] == dst_size[d]) d--;
    return d;
}

void hs_ckpt_box_move(int ndim, const int64_t *off, const int64_t *size, size_t es, const void *src,
                      const int64_t *src_off, const int64_t *src_size, void *dst,
                      const int64_t *dst_off, const int64_t *dst_size, hs_ckpt_move_fn move,
                      void *ctx) {
    HS_ASSERT(ndim >= 1 && ndim <= HS_CKPT_DIMS);
    for (int d = 0; d < ndim; d++) {
        HS_ASSERT(off[d] >= src_off[d] && off[d] + size[d] <= src_off[d] + src_size[d]);
        HS_ASSERT(off[d] >= dst_off[d] && off[d] + size[d] <= dst_off[d] + dst_size[d]);
    }
    if (hs_ckpt_box_numel(ndim, size) == 0) return;
    /* Walk the dims before the runs like an odometer, one run each. */
    int rd = run_dim(ndim, size, src_size, dst_size);
    int64_t pos[HS_CKPT_DIMS];
    memcpy(pos, off, sizeof(int64_t) * (size_t)ndim);
    size_t run = (size_t)hs_ckpt_box_numel(ndim - rd, size + rd) * es;
    for (;;) {
        int64_t si = chunk_index(ndim, pos, src_off, src_size);
        int64_t di = chunk_index(ndim, pos, dst_off, dst_size);
        move(ctx, (char *)dst + (size_t)di * es, (const char *)src + (size_t)si * es, run);
        int d = rd - 1;
        while (d >= 0 && ++pos[d] == off[d] + size[d]) pos[d] = off[d], d--;
        if (d < 0) break;
    }
}

static void host_move(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    memcpy(dst, src, bytes);
}

void hs_ckpt_box_copy(int ndim, const int64_t *off, const int64_t *size, size_t es, const void *src,
                      const int64_t *src_off, const int64_t *src_size, void *dst,
                      const int64_t *dst_off, const int64_t *dst_size) {
    hs_ckpt_box_move(ndim, off, size, es, src, src_off, src_size, dst, dst_off, dst_size, host_move,
                     NULL);
}

const char *hs_ckpt_box_str(int ndim, const int64_t *off, const int64_t *size, char *buf,
                            size_t cap) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap > n ? cap - n : 0, "[");
    /* Also used to name the chunks of a damaged metadata file, whose end
     * may not fit in int64: those print as start:+size. */
    for (int d = 0; d < ndim; d++) {
        int64_t end;
        const char *sep = d ? ", " : "";
        if (hs_add_i64(off[d], size[d], &end))
            n += (size_t)snprintf(buf + n, cap > n ? cap - n : 0, "%s%lld:%lld", sep,
                                  (long long)off[d], (long long)end);
        else
            n += (size_t)snprintf(buf + n, cap > n ? cap - n : 0, "%s%lld:+%lld", sep,
                                  (long long)off[d], (long long)size[d]);
    }
    snprintf(buf + n, cap > n ? cap - n : 0, "]");
    return buf;
}
