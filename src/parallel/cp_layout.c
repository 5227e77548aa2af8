/* The CP sequence layout (parallel.h): causal load balance, chunk r and chunk
 * 2*cp-1-r of 2*cp per CP rank, so every rank has as many attention rows
 * near the end of the sequence as near its start. */
#include "hypershard/device.h"
#include "hypershard/parallel.h"

static int chunk_of(int cp, int rank, int c) { return c == 0 ? rank : 2 * cp - 1 - rank; }

int64_t hs_cp_global_position(int cp, int rank, int T_local, int t) {
    int C = T_local / 2, c = t / C;
    return (int64_t)chunk_of(cp, rank, c) * C + t % C;
}

/* Copy between rank `rank`'s local [B, T_local, row] and the whole
 * [B, T, row], one chunk (C rows) of every sequence at a time (a 2-D copy
 * over the B sequences); to_local picks the direction. */
static void move_rank(hs_device *d, void *local, void *whole, bool to_local, int cp, int rank,
                      int B, int T_local, int64_t row, size_t es) {
    int C = T_local / 2, T = cp * T_local;
    size_t chunk = (size_t)C * (size_t)row * es, rb = (size_t)row * es;
    size_t l_stride = (size_t)T_local * rb, w_stride = (size_t)T * rb;
    for (int c = 0; c < 2; c++) {
        char *l = (char *)local + (size_t)c * C * rb;
        char *w = (char *)whole + (size_t)chunk_of(cp, rank, c) * C * rb;
        if (to_local) hs_dev_copy_2d(d, l, l_stride, w, w_stride, B, chunk);
        else hs_dev_copy_2d(d, w, w_stride, l, l_stride, B, chunk);
    }
}

void hs_cp_take_local_ids(int32_t *local, const int32_t *whole, int cp, int rank, int B,
                          int T_local) {
    int64_t T = (int64_t)cp * T_local;
    for (int64_t b = 0; b < B; b++)
        for (int t = 0; t < T_local; t++)
            local[b * T_local + t] = whole[b * T + hs_cp_global_position(cp, rank, T_local, t)];
}

void hs_cp_blocks_to_whole(hs_device *d, void *whole, const void *blocks, int cp, int B,
                           int T_local, int64_t row, size_t es) {
    size_t block = (size_t)B * T_local * (size_t)row * es;
    for (int r = 0; r < cp; r++)
        move_rank(d, (char *)blocks + r * block, whole, false, cp, r, B, T_local, row, es);
}

void hs_cp_whole_to_blocks(hs_device *d, void *blocks, const void *whole, int cp, int B,
                           int T_local, int64_t row, size_t es) {
    size_t block = (size_t)B * T_local * (size_t)row * es;
    for (int r = 0; r < cp; r++)
        move_rank(d, (char *)blocks + r * block, (void *)whole, true, cp, r, B, T_local, row, es);
}
