/* comm/reduce.c — the reduction step of the ring and intra-node algorithms.
 *
 * 16-bit payloads travel on the wire in their own dtype (half the bytes of
 * fp32); each step widens both operands to fp32, combines them and rounds
 * once (round to nearest even, hs_convert).
 * - SUM and AVG add. AVG divides the fp32 sum by the group size in the last
 *   step, before that step's rounding, so the average costs no extra
 *   rounding.
 * - MAX keeps the larger operand. Widening and narrowing a value of the
 *   payload dtype is exact, so MAX never rounds. It is commutative and
 *   associative to the bit (NaN beats everything and comes out as the
 *   default quiet NaN; +0 beats -0), so no order of the ranks shows in the
 *   result and both algorithms give the same bits. */
#include <string.h>

#include "comm/group.h"

/* Tiles keep the widened operands in L1 while the whole chunk streams. */
#define TILE 1024

/* Eight lanes per step. Written with vector types because GCC's -O2 cost
 * model does not vectorise a loop of unknown length, and this loop is the
 * reduce-scatter's arithmetic. Lane-wise IEEE add and divide: the same bits
 * as the scalar tail. */
typedef float hs_v8f __attribute__((vector_size(32)));
typedef int32_t hs_v8i __attribute__((vector_size(32)));

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

/* Lane-wise MAX as described at the top. Comparisons give all-ones lanes
 * where true; the selects are bitwise. */
static hs_v8f max_v8(hs_v8f x, hs_v8f y) {
    const hs_v8i qnan = {0x7FC00000, 0x7FC00000, 0x7FC00000, 0x7FC00000,
                         0x7FC00000, 0x7FC00000, 0x7FC00000, 0x7FC00000};
    const hs_v8i xi = (hs_v8i)x, yi = (hs_v8i)y;
    const hs_v8i gt = x > y, eq = x == y, nan = (x != x) | (y != y);
    hs_v8i r = (xi & gt) | (yi & ~gt);
    r = (xi & yi & eq) | (r & ~eq); /* equal: the same bits, or +0 over -0 */
    r = (qnan & nan) | (r & ~nan);
    return (hs_v8f)r;
}

/* The tail goes through one zero-padded vector: the same bits as the lanes. */
static void max_f32(float *dst, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        hs_v8f x, y;
        memcpy(&x, a + i, sizeof x);
        memcpy(&y, b + i, sizeof y);
        x = max_v8(x, y);
        memcpy(dst + i, &x, sizeof x);
    }
    if (i == n) return;
    const size_t rest = (size_t)(n - i) * sizeof(float);
    hs_v8f x = {0}, y = {0};
    memcpy(&x, a + i, rest);
    memcpy(&y, b + i, rest);
    x = max_v8(x, y);
    memcpy(dst + i, &x, rest);
}

static void reduce_f32(float *dst, const float *a, const float *b, int64_t n, hs_reduce_op op,
                       int divisor) {
    if (op == HS_REDUCE_MAX) max_f32(dst, a, b, n);
    else add_f32(dst, a, b, n, divisor);
}

static void reduce_16(void *dst, const void *a, const void *b, int64_t n, hs_dtype dt,
                      hs_reduce_op op, int divisor) {
    float ta[TILE], tb[TILE];
    const uint16_t *pa = a, *pb = b;
    uint16_t *pd = dst;
    for (int64_t i = 0; i < n; i += TILE) {
        int64_t m = n - i < TILE ? n - i : TILE;
        hs_convert(ta, HS_DTYPE_F32, pa + i, dt, m);
        hs_convert(tb, HS_DTYPE_F32, pb + i, dt, m);
        reduce_f32(ta, ta, tb, m, op, divisor);
        hs_convert(pd + i, dt, ta, HS_DTYPE_F32, m);
    }
}

void hs_comm_reduce(void *dst, const void *a, const void *b, int64_t n, hs_dtype dt,
                    hs_reduce_op op, int divisor) {
    HS_ASSERT(divisor >= 1 && dst != a);
    HS_ASSERT(op >= 0 && op < HS_REDUCE_OP_COUNT && (op == HS_REDUCE_AVG || divisor == 1));
    if (dt == HS_DTYPE_F32) reduce_f32(dst, a, b, n, op, divisor);
    else reduce_16(dst, a, b, n, dt, op, divisor);
}
