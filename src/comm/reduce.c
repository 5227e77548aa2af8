/* comm/reduce.c — the reduction step of the ring algorithms.
 *
 * 16-bit payloads travel on the wire in their own dtype (half the bytes of
 * fp32); each hop widens the incoming partial and the local chunk to fp32,
 * adds, and rounds once (round to nearest even, hs_convert). AVG divides the
 * fp32 sum by the group size in the last hop, before that hop's rounding, so
 * the average costs no extra rounding. */
#include <string.h>

#include "comm/comm_internal.h"

/* Tiles keep the widened operands in L1 while the whole chunk streams. */
#define TILE 1024

/* Eight lanes per step. Written with vector types because GCC's -O2 cost
 * model does not vectorise a loop of unknown length, and this loop is the
 * reduce-scatter's arithmetic. Lane-wise IEEE add and divide: the same bits
 * as the scalar tail. */
typedef float hs_v8f __attribute__((vector_size(32)));

static void add_f32(float *dst, const float *a, const float *b, int64_t n, int divisor) {
    const float d = (float)divisor;
    const hs_v8f dv = {d, d, d, d, d, d, d, d};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        hs_v8f x, y;
        memcpy(&x, a + i, sizeof x);
        memcpy(&y, b + i, sizeof y);
        x += y;
        if (divisor != 1) x /= dv;
        memcpy(dst + i, &x, sizeof x);
    }
    for (; i < n; i++) dst[i] = divisor == 1 ? a[i] + b[i] : (a[i] + b[i]) / d;
}

static void add_16(void *dst, const void *a, const void *b, int64_t n, hs_dtype dt, int divisor) {
    float ta[TILE], tb[TILE];
    const uint16_t *pa = a, *pb = b;
    uint16_t *pd = dst;
    for (int64_t i = 0; i < n; i += TILE) {
        int64_t m = n - i < TILE ? n - i : TILE;
        hs_convert(ta, HS_DTYPE_F32, pa + i, dt, m);
        hs_convert(tb, HS_DTYPE_F32, pb + i, dt, m);
        add_f32(ta, ta, tb, m, divisor);
        hs_convert(pd + i, dt, ta, HS_DTYPE_F32, m);
    }
}

void hs_comm_reduce_add(void *dst, const void *a, const void *b, int64_t n, hs_dtype dt,
                        int divisor) {
    HS_ASSERT(divisor >= 1 && dst != a);
    if (dt == HS_DTYPE_F32)
        add_f32(dst, a, b, n, divisor);
    else
        add_16(dst, a, b, n, dt, divisor);
}
