/* Causal grouped-query attention on a row range for the cuda backend,
 * flash-attention style on the CUDA cores: nothing of size T x T exists,
 * the forward keeps each row's running maximum and sum (online softmax)
 * and saves its fp32 log-sum-exp, the backward recomputes probabilities
 * from it.
 *
 * Layout of every kernel: a block of up to four warps, each warp owning
 * kRows rows (query rows in the forward and in the dq pass, key rows in
 * the dk/dv pass); the other side streams through shared memory in tiles
 * of 32 rows, one per lane. A lane computes its tile row's dot products
 * over the whole head dim (shared rows of odd stride: no bank conflicts),
 * and the products with the tile (P V, dS K, P^T dO, dS^T Q) go lane per
 * head dim, each lane holding ceil(HD/32) fp32 accumulators per owned row.
 * Values are read from their dtype into fp32, every sum is fp32, and each
 * stored output is rounded once.
 *
 * The backward is two passes, neither with atomics: one per query tile
 * for dq (as the forward, dS K in place of P V) and one per key tile for
 * dk and dv over every query head of its group, so each output element has
 * one owner and the result is the same bits run after run. Each pass
 * recomputes the scores and dO . V the other one also needs (four dot
 * products per visible (query, key) pair instead of two).
 *
 * Masking follows reference_attention.c: query row i (global position g =
 * gq + i - q0) sees the key rows j of the range with gk + j <= g, and under
 * document masking also gk + j >= lo[b * lo_ld + g]; a row that sees no
 * key gets a zero output and lse -inf and adds nothing backward. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "device/cuda_attention_launch.h"

namespace {

typedef hs_cuda_att_dims Dims;

constexpr unsigned kFull = 0xffffffffu;
constexpr int kTile = 32;    /* rows streamed per step: one per lane */
constexpr int kRows = 4;     /* rows each warp owns */
constexpr int kMaxWarps = 4; /* per block, fewer when shared memory is short */

/* ------------------------------------------------------------- values */

__device__ __forceinline__ float load_f(const void *p, int dt, int64_t i) {
    if (dt == 1) return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    if (dt == 2) return __half2float(static_cast<const __half *>(p)[i]);
    return static_cast<const float *>(p)[i];
}

/* One rounding to dt, tensor/'s bits (hs_f32_to_bf16, hs_f32_to_f16):
 * nearest even, a NaN kept quiet with its top payload. */
__device__ __forceinline__ void store_f(void *p, int dt, int64_t i, float v) {
    uint32_t x = __float_as_uint(v);
    bool nan = (x & 0x7FFFFFFFu) > 0x7F800000u;
    if (dt == 1) {
        uint32_t r = nan ? (x >> 16) | 0x40u : (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
        static_cast<uint16_t *>(p)[i] = (uint16_t)r;
    } else if (dt == 2) {
        __half_raw h = __float2half_rn(v);
        if (nan) h.x = (unsigned short)(((x >> 16) & 0x8000u) | 0x7E00u | ((x >> 13) & 0x3FFu));
        static_cast<uint16_t *>(p)[i] = h.x;
    } else {
        static_cast<float *>(p)[i] = v;
    }
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
    return v;
}

/* ------------------------------------------------------------ masking */

/* The key rows [f, n) of the range (relative to k0) a query sees. */
struct Span {
    int f, n;
};

__device__ Span keys_seen(const Dims &d, int b, int i) {
    int64_t g = d.gq + (i - d.q0), seen = g - d.gk + 1;
    int n = seen < 0 ? 0 : seen > d.nk ? d.nk : (int)seen;
    int64_t first = d.lo ? d.lo[(int64_t)b * d.lo_ld + g] - d.gk : 0;
    Span s = {first < 0 ? 0 : first > n ? n : (int)first, n};
    return s;
}

/* Whether this lane's row of the tile starting at key j0 is in span s. */
__device__ __forceinline__ bool lane_sees(Span s, int j0) {
    int j = j0 + (threadIdx.x & 31);
    return j >= s.f && j < s.n;
}

/* The keys any row of the block sees, from each warp's spans: [f, n), or
 * f >= n when none. */
__device__ Span block_keys(const Span *sp) {
    __shared__ int lo_s, hi_s;
    if (threadIdx.x == 0) lo_s = INT_MAX, hi_s = 0;
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int r = 0; r < kRows; r++)
            if (sp[r].n > sp[r].f) atomicMin(&lo_s, sp[r].f), atomicMax(&hi_s, sp[r].n);
    __syncthreads();
    Span s = {lo_s, hi_s};
    return s;
}

/* ------------------------------------------------------------- tiles */

/* Eight 16-bit values of dt from a 16-byte aligned address, as load_f
 * reads each. */
__device__ __forceinline__ void load8_f(float *v, const void *p, int dt) {
    uint4 w = *static_cast<const uint4 *>(p);
    uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        unsigned short lo = (unsigned short)(u[k] & 0xFFFFu), hi = (unsigned short)(u[k] >> 16);
        v[2 * k] = dt == 1 ? __bfloat162float(__ushort_as_bfloat16(lo))
                           : __half2float(__ushort_as_half(lo));
        v[2 * k + 1] = dt == 1 ? __bfloat162float(__ushort_as_bfloat16(hi))
                               : __half2float(__ushort_as_half(hi));
    }
}

/* rows x HD values into shared dst (row stride ld) from src in dt, row r at
 * element src_off + r * src_ld; rows from `valid` on are zero. A 2-D walk:
 * each thread's (row, item) found by one division, then stepped by the
 * block's stride; an item is eight values through one 16-byte load where
 * dt is 16-bit and every row starts 16-byte aligned, else one value. */
__device__ void load_rows(float *dst, int ld, const void *src, int dt, int64_t src_off,
                          int64_t src_ld, int rows, int valid, int HD) {
    bool vec = dt != 0 && (HD & 7) == 0 && ((src_off | src_ld) & 7) == 0 &&
               ((uintptr_t)src & 15) == 0;
    int per = vec ? HD / 8 : HD; /* items per row */
    int r = threadIdx.x / per, c = threadIdx.x - r * per;
    int dr = blockDim.x / per, dc = blockDim.x - dr * per;
    for (; r < rows; r += dr, c += dc) {
        if (c >= per) c -= per, r++;
        if (r >= rows) break;
        float *out = dst + r * ld;
        if (!vec) {
            out[c] = r < valid ? load_f(src, dt, src_off + r * src_ld + c) : 0.0f;
            continue;
        }
        float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (r < valid)
            load8_f(v, static_cast<const uint16_t *>(src) + src_off + r * src_ld + 8 * c, dt);
#pragma unroll
        for (int k = 0; k < 8; k++) out[8 * c + k] = v[k];
    }
}

/* s[r] = a_r . t over HD for the warp's kRows rows of a (row stride lda,
 * broadcast) against one tile row t (this lane's). */
__device__ __forceinline__ void dots(float *s, const float *a, int lda, const float *t, int HD) {
#pragma unroll
    for (int r = 0; r < kRows; r++) s[r] = 0.0f;
    for (int c = 0; c < HD; c++) {
        float x = t[c];
#pragma unroll
        for (int r = 0; r < kRows; r++) s[r] = fmaf(a[r * lda + c], x, s[r]);
    }
}

/* acc_r += sum over tile rows jj of w_r[jj] * rows[jj] (w_r held by lane
 * jj), each row r over the tile rows of its bit mask only. */
template <int DPL>
__device__ void tile_products(float (*acc)[DPL], const float *w, const unsigned *mask,
                              const float *rows, int ld, int HD) {
    int lane = threadIdx.x & 31;
    unsigned all = 0;
#pragma unroll
    for (int r = 0; r < kRows; r++) all |= mask[r];
    if (all == 0) return;
    for (int jj = __ffs(all) - 1; jj < 32 - __clz(all); jj++) {
        float x[DPL];
#pragma unroll
        for (int c = 0; c < DPL; c++)
            x[c] = lane + 32 * c < HD ? rows[jj * ld + lane + 32 * c] : 0.0f;
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            float wj = __shfl_sync(kFull, w[r], jj);
            if ((mask[r] >> jj) & 1u)
#pragma unroll
                for (int c = 0; c < DPL; c++) acc[r][c] = fmaf(wj, x[c], acc[r][c]);
        }
    }
}

/* out[lane + 32 c] (op) acc[c] for this lane's dims below HD. */
template <int DPL, typename Op> __device__ __forceinline__ void per_lane_dim(int HD, Op op) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int c = 0; c < DPL; c++)
        if (lane + 32 * c < HD) op(lane + 32 * c, c);
}

/* ------------------------------------------------------------ forward */

/* Where a block's owned query rows are and what they see. */
struct QueryBlock {
    int b, h, kvh, i0, nrows; /* rows [i0, i0 + nrows) */
    int64_t qld, kld, kbase;  /* row strides of q and k; element of key row k0, head kvh */
    Span sp[kRows];           /* the warp's rows */
};

__device__ QueryBlock query_block(const Dims &d) {
    QueryBlock qb;
    int rpb = (blockDim.x >> 5) * kRows, w = threadIdx.x >> 5;
    qb.b = blockIdx.z, qb.h = blockIdx.y, qb.kvh = qb.h / (d.NH / d.KVH);
    qb.i0 = d.q0 + blockIdx.x * rpb;
    qb.nrows = min(rpb, d.q0 + d.nq - qb.i0);
    qb.qld = (int64_t)d.NH * d.HD, qb.kld = (int64_t)d.KVH * d.HD;
    qb.kbase = ((int64_t)qb.b * d.Tk + d.k0) * qb.kld + (int64_t)qb.kvh * d.HD;
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        int row = w * kRows + r;
        Span none = {0, 0};
        qb.sp[r] = row < qb.nrows ? keys_seen(d, qb.b, qb.i0 + row) : none;
    }
    return qb;
}

/* Element offset of query row i, head h, dim 0. */
__device__ __forceinline__ int64_t q_at(const Dims &d, const QueryBlock &qb, int i) {
    return ((int64_t)qb.b * d.Tq + i) * qb.qld + (int64_t)qb.h * d.HD;
}

/* One key tile of the online softmax for a row that sees a key of it: s
 * (this lane's score; vis: the row sees this lane's key) to p, the running
 * maximum m and sum l updated, acc rescaled. */
template <int DPL>
__device__ __forceinline__ void online_step(float &p, float &m, float &l, float *acc, float s,
                                            bool vis) {
    float mn = fmaxf(m, warp_max(vis ? s : -INFINITY));
    p = vis ? expf(s - mn) : 0.0f;
    float alpha = expf(m - mn); /* 0 on the first tile a row sees (m = -inf) */
    l = l * alpha + warp_sum(p);
#pragma unroll
    for (int c = 0; c < DPL; c++) acc[c] *= alpha;
    m = mn;
}

template <int DPL>
__global__ void __launch_bounds__(kMaxWarps * 32)
    att_fwd_kernel(Dims d, void *out, int odt, float *lse, const void *q, const void *k,
                   const void *v, int dt) {
    extern __shared__ float smem[];
    const int HD = d.HD, ldt = HD | 1, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const float scale = 1.0f / sqrtf((float)HD);
    float *Ks = smem, *Vs = Ks + kTile * ldt, *Qs = Vs + kTile * HD;
    QueryBlock qb = query_block(d);
    load_rows(Qs, HD, q, dt, q_at(d, qb, qb.i0), qb.qld, (blockDim.x >> 5) * kRows, qb.nrows, HD);
    Span keys = block_keys(qb.sp); /* its barriers order the Q loads too */
    float m[kRows], l[kRows], acc[kRows][DPL];
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        m[r] = -INFINITY, l[r] = 0.0f;
        for (int c = 0; c < DPL; c++) acc[r][c] = 0.0f;
    }
    for (int j0 = keys.f; j0 < keys.n; j0 += kTile) {
        int kn = min(kTile, keys.n - j0);
        __syncthreads();
        load_rows(Ks, ldt, k, dt, qb.kbase + j0 * qb.kld, qb.kld, kTile, kn, HD);
        load_rows(Vs, HD, v, dt, qb.kbase + j0 * qb.kld, qb.kld, kTile, kn, HD);
        __syncthreads();
        float s[kRows], p[kRows];
        unsigned mask[kRows];
        dots(s, Qs + w * kRows * HD, HD, Ks + lane * ldt, HD);
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            bool vis = lane_sees(qb.sp[r], j0);
            mask[r] = __ballot_sync(kFull, vis);
            p[r] = 0.0f;
            if (mask[r]) online_step<DPL>(p[r], m[r], l[r], acc[r], s[r] * scale, vis);
        }
        tile_products<DPL>(acc, p, mask, Vs, HD, HD);
    }
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        int row = w * kRows + r;
        if (row >= qb.nrows) break;
        bool any = qb.sp[r].n > qb.sp[r].f;
        int64_t at = q_at(d, qb, qb.i0 + row);
        per_lane_dim<DPL>(
            HD, [&](int x, int c) { store_f(out, odt, at + x, any ? acc[r][c] / l[r] : 0.0f); });
        if (lane == 0)
            lse[((int64_t)qb.b * d.NH + qb.h) * d.Tq + qb.i0 + row] = any ? m[r] + logf(l[r])
                                                                          : -INFINITY;
    }
}

/* ----------------------------------------------------------- backward */

/* D = dout . out per row, one warp a row. */
__global__ void att_delta_kernel(float *delta, const float *dout, const void *out, int odt, int B,
                                 int NH, int HD, int Tq, int t0, int nt) {
    int64_t rows = (int64_t)B * NH * nt, nw = (int64_t)gridDim.x * (blockDim.x >> 5);
    int lane = threadIdx.x & 31;
    for (int64_t x = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); x < rows;
         x += nw) {
        int64_t bh = x / nt, t = t0 + x % nt, b = bh / NH, h = bh % NH;
        int64_t at = ((b * Tq + t) * NH + h) * HD;
        float sum = 0.0f;
        for (int c = lane; c < HD; c += 32) sum = fmaf(dout[at + c], load_f(out, odt, at + c), sum);
        sum = warp_sum(sum);
        if (lane == 0) delta[bh * Tq + t] = sum;
    }
}

/* dq += scale sum_j dS_j k_j per query row, dS_j = P_j (dO . v_j - D),
 * P_j = exp(scale q . k_j - lse): the forward's loop with dS K for P V. */
template <int DPL>
__global__ void __launch_bounds__(kMaxWarps * 32)
    att_dq_kernel(Dims d, float *dq, const float *dout, const void *q, const void *k, const void *v,
                  const float *lse, const float *delta, int dt) {
    extern __shared__ float smem[];
    const int HD = d.HD, ldt = HD | 1, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int rpb = (blockDim.x >> 5) * kRows;
    const float scale = 1.0f / sqrtf((float)HD);
    float *Ks = smem, *Vs = Ks + kTile * ldt, *Qs = Vs + kTile * ldt, *Os = Qs + rpb * HD;
    QueryBlock qb = query_block(d);
    int64_t at0 = q_at(d, qb, qb.i0);
    load_rows(Qs, HD, q, dt, at0, qb.qld, rpb, qb.nrows, HD);
    load_rows(Os, HD, dout, 0, at0, qb.qld, rpb, qb.nrows, HD);
    Span keys = block_keys(qb.sp);
    float L[kRows], D[kRows], acc[kRows][DPL];
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        int row = min(w * kRows + r, qb.nrows - 1);
        int64_t x = ((int64_t)qb.b * d.NH + qb.h) * d.Tq + qb.i0 + row;
        L[r] = lse[x], D[r] = delta[x];
        for (int c = 0; c < DPL; c++) acc[r][c] = 0.0f;
    }
    for (int j0 = keys.f; j0 < keys.n; j0 += kTile) {
        int kn = min(kTile, keys.n - j0);
        __syncthreads();
        load_rows(Ks, ldt, k, dt, qb.kbase + j0 * qb.kld, qb.kld, kTile, kn, HD);
        load_rows(Vs, ldt, v, dt, qb.kbase + j0 * qb.kld, qb.kld, kTile, kn, HD);
        __syncthreads();
        float s[kRows], dp[kRows], ds[kRows];
        unsigned mask[kRows];
        dots(s, Qs + w * kRows * HD, HD, Ks + lane * ldt, HD);
        dots(dp, Os + w * kRows * HD, HD, Vs + lane * ldt, HD);
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            bool vis = lane_sees(qb.sp[r], j0);
            mask[r] = __ballot_sync(kFull, vis);
            float p = vis ? expf(s[r] * scale - L[r]) : 0.0f;
            ds[r] = vis ? p * (dp[r] - D[r]) * scale : 0.0f;
        }
        tile_products<DPL>(acc, ds, mask, Ks, ldt, HD);
    }
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        int row = w * kRows + r;
        if (row >= qb.nrows) break;
        if (qb.sp[r].n <= qb.sp[r].f) continue; /* saw no key: nothing added */
        float *g = dq + q_at(d, qb, qb.i0 + row);
        per_lane_dim<DPL>(HD, [&](int x, int c) { g[x] += acc[r][c]; });
    }
}

/* A query tile of the dk/dv pass in shared memory: its rows' spans, lse
 * and delta. */
struct QueryTile {
    float *Q, *O, *L, *D;
    int *F, *N;
};

/* Loads query rows [i, i + rows) of head h into t; false (nothing loaded)
 * when none of them sees a key of [j0, j1). Every thread calls it. */
__device__ bool query_tile(const QueryTile &t, const Dims &d, int b, int h, int i, int rows, int j0,
                           int j1, const void *q, const float *dout, const float *lse,
                           const float *delta, int dt) {
    int x = threadIdx.x, HD = d.HD;
    bool meets = false;
    __syncthreads(); /* the previous tile is done with */
    if (x < kTile) {
        Span s = {0, 0};
        if (x < rows) s = keys_seen(d, b, i + x);
        int64_t row = ((int64_t)b * d.NH + h) * d.Tq + i + x;
        t.F[x] = s.f, t.N[x] = s.n;
        t.L[x] = x < rows ? lse[row] : 0.0f;
        t.D[x] = x < rows ? delta[row] : 0.0f;
        meets = s.n > s.f && s.f < j1 && s.n > j0;
    }
    if (!__syncthreads_or(meets)) return false;
    int64_t qld = (int64_t)d.NH * HD, at = ((int64_t)b * d.Tq + i) * qld + (int64_t)h * HD;
    load_rows(t.Q, HD | 1, q, dt, at, qld, kTile, rows, HD);
    load_rows(t.O, HD | 1, dout, 0, at, qld, kTile, rows, HD);
    __syncthreads();
    return true;
}

/* dv_j += sum_i P_ij dO_i and dk_j += scale sum_i dS_ij q_i for the warp's
 * key rows j over every query row i of each query head of the group. */
template <int DPL>
__global__ void __launch_bounds__(kMaxWarps * 32)
    att_dkv_kernel(Dims d, float *dk, float *dv, const float *dout, const void *q, const void *k,
                   const void *v, const float *lse, const float *delta, int dt) {
    extern __shared__ float smem[];
    const int HD = d.HD, ldt = HD | 1, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int rpb = (blockDim.x >> 5) * kRows, b = blockIdx.z, kvh = blockIdx.y;
    const int group = d.NH / d.KVH, j0 = blockIdx.x * rpb, nkeys = min(rpb, d.nk - j0);
    const float scale = 1.0f / sqrtf((float)HD);
    float *Kr = smem, *Vr = Kr + rpb * HD;
    QueryTile t;
    t.Q = Vr + rpb * HD, t.O = t.Q + kTile * ldt, t.L = t.O + kTile * ldt, t.D = t.L + kTile;
    t.F = (int *)(t.D + kTile), t.N = t.F + kTile;
    const int64_t kld = (int64_t)d.KVH * HD;
    const int64_t kbase = ((int64_t)b * d.Tk + d.k0 + j0) * kld + (int64_t)kvh * HD;
    load_rows(Kr, HD, k, dt, kbase, kld, rpb, nkeys, HD);
    load_rows(Vr, HD, v, dt, kbase, kld, rpb, nkeys, HD);
    int j[kRows];
    bool seen[kRows];
    float gk[kRows][DPL], gv[kRows][DPL];
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        j[r] = w * kRows + r < nkeys ? j0 + w * kRows + r : INT_MAX; /* INT_MAX: no row */
        seen[r] = false;
        for (int c = 0; c < DPL; c++) gk[r][c] = gv[r][c] = 0.0f;
    }
    /* queries before global position gk + j0 see none of these keys */
    int64_t first = d.q0 + (d.gk + j0 - d.gq);
    int i_first = first < d.q0 ? d.q0 : first > d.q0 + d.nq ? d.q0 + d.nq : (int)first;
    for (int h = kvh * group; h < (kvh + 1) * group; h++)
        for (int i = i_first; i < d.q0 + d.nq; i += kTile) {
            int rows = min(kTile, d.q0 + d.nq - i);
            if (!query_tile(t, d, b, h, i, rows, j0, j0 + nkeys, q, dout, lse, delta, dt)) continue;
            float s[kRows], dp[kRows], p[kRows], ds[kRows];
            unsigned mask[kRows];
            dots(s, Kr + w * kRows * HD, HD, t.Q + lane * ldt, HD);
            dots(dp, Vr + w * kRows * HD, HD, t.O + lane * ldt, HD);
#pragma unroll
            for (int r = 0; r < kRows; r++) {
                bool vis = lane < rows && j[r] >= t.F[lane] && j[r] < t.N[lane];
                p[r] = vis ? expf(s[r] * scale - t.L[lane]) : 0.0f;
                ds[r] = vis ? p[r] * (dp[r] - t.D[lane]) * scale : 0.0f;
                mask[r] = __ballot_sync(kFull, vis);
                seen[r] = seen[r] || mask[r];
            }
            tile_products<DPL>(gv, p, mask, t.O, ldt, HD);
            tile_products<DPL>(gk, ds, mask, t.Q, ldt, HD);
        }
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        if (j[r] == INT_MAX) break;
        if (!seen[r]) continue; /* no query saw it: nothing added */
        int64_t at = kbase + (int64_t)(w * kRows + r) * kld;
        per_lane_dim<DPL>(HD,
                          [&](int x, int c) { dk[at + x] += gk[r][c], dv[at + x] += gv[r][c]; });
    }
}

/* -------------------------------------------------------------- merge */

/* One warp a row, in fp64 as reference: l = max + log(e^(lse - max) +
 * e^(blse - max)), out = out e^(lse - l) + bout e^(blse - l), lse = l; a
 * row whose blse is -inf is left as it is. */
__global__ void att_merge_kernel(float *out, float *lse, const float *bout, const float *blse,
                                 int B, int NH, int HD, int Tq, int q0, int nq) {
    int64_t rows = (int64_t)B * NH * nq, nw = (int64_t)gridDim.x * (blockDim.x >> 5);
    int lane = threadIdx.x & 31;
    for (int64_t x = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); x < rows;
         x += nw) {
        int64_t bh = x / nq, t = q0 + x % nq, b = bh / NH, h = bh % NH, row = bh * Tq + t;
        float lbf = blse[row];
        if (lbf == -INFINITY) continue;
        double la = lse[row], lb = lbf, mx = la > lb ? la : lb;
        double l = mx + log(exp(la - mx) + exp(lb - mx)), wa = exp(la - l), wb = exp(lb - l);
        int64_t at = ((b * Tq + t) * NH + h) * HD;
        for (int c = lane; c < HD; c += 32)
            out[at + c] = (float)(out[at + c] * wa + bout[at + c] * wb);
        __syncwarp(); /* every lane has read lse[row] */
        if (lane == 0) lse[row] = (float)l;
    }
}

/* ------------------------------------------------------------ launches */

/* fn(std::integral_constant<int, DPL>) for the smallest DPL with 32 DPL >= HD. */
template <typename F> cudaError_t by_head_dim(int HD, F fn) {
    if (HD <= 32) return fn(std::integral_constant<int, 1>());
    if (HD <= 64) return fn(std::integral_constant<int, 2>());
    if (HD <= 128) return fn(std::integral_constant<int, 4>());
    if (HD <= HS_CUDA_ATT_MAX_HD) return fn(std::integral_constant<int, 8>());
    return cudaErrorInvalidValue;
}

/* The most warps (of kMaxWarps, halving) whose shared memory, bytes(warps),
 * fits what a block may opt in to; 0 when not even one fits. */
template <typename F> int warps_fitting(size_t smem_optin, F bytes) {
    for (int nw = kMaxWarps; nw >= 1; nw /= 2)
        if (bytes(nw) <= smem_optin) return nw;
    return 0;
}

/* Launches kernel on a (row blocks, y, B) grid of nw warps a block. */
template <typename K, typename... A>
cudaError_t launch(K kernel, int row_blocks, int y, int B, int nw, size_t smem, cudaStream_t st,
                   A... args) {
    if (smem > 48 * 1024) {
        cudaError_t err =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return err;
    }
    dim3 grid(row_blocks, y, B);
    kernel<<<grid, nw * 32, smem, st>>>(args...);
    return cudaGetLastError();
}

int blocks_of(int rows, int nw) { return (rows + nw * kRows - 1) / (nw * kRows); }

} // namespace

extern "C" cudaError_t hs_cuda_launch_attention_fwd(cudaStream_t st, void *out, int odt, float *lse,
                                                    const void *q, const void *k, const void *v,
                                                    int dt, hs_cuda_att_dims d, size_t smem_optin) {
    if (d.B <= 0 || d.nq <= 0) return cudaSuccess;
    size_t HD = (size_t)d.HD, ldt = HD | 1;
    auto bytes = [&](int nw) { return sizeof(float) * (kTile * (ldt + HD) + nw * kRows * HD); };
    int nw = warps_fitting(smem_optin, bytes);
    if (nw == 0) return cudaErrorInvalidConfiguration;
    return by_head_dim(d.HD, [&](auto dpl) {
        return launch(att_fwd_kernel<decltype(dpl)::value>, blocks_of(d.nq, nw), d.NH, d.B, nw,
                      bytes(nw), st, d, out, odt, lse, q, k, v, dt);
    });
}

extern "C" cudaError_t hs_cuda_launch_attention_delta(cudaStream_t st, float *delta,
                                                      const float *dout, const void *out, int odt,
                                                      int B, int NH, int HD, int Tq, int t0,
                                                      int nt) {
    int64_t rows = (int64_t)B * NH * nt;
    if (rows <= 0) return cudaSuccess;
    int64_t blocks = (rows + 7) / 8;
    att_delta_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, st>>>(
        delta, dout, out, odt, B, NH, HD, Tq, t0, nt);
    return cudaGetLastError();
}

extern "C" cudaError_t hs_cuda_launch_attention_bwd(cudaStream_t st, float *dq, float *dk,
                                                    float *dv, const float *dout, const void *q,
                                                    const void *k, const void *v, const float *lse,
                                                    const float *delta, int dt, hs_cuda_att_dims d,
                                                    size_t smem_optin) {
    if (d.B <= 0 || d.nq <= 0 || d.nk <= 0) return cudaSuccess;
    size_t HD = (size_t)d.HD, ldt = HD | 1;
    auto dq_bytes = [&](int nw) { return sizeof(float) * 2 * (kTile * ldt + nw * kRows * HD); };
    auto dkv_bytes = [&](int nw) {
        return sizeof(float) * 2 * (nw * kRows * HD + kTile * ldt) + 4 * kTile * sizeof(float);
    };
    int nq_w = warps_fitting(smem_optin, dq_bytes), nk_w = warps_fitting(smem_optin, dkv_bytes);
    if (nq_w == 0 || nk_w == 0) return cudaErrorInvalidConfiguration;
    return by_head_dim(d.HD, [&](auto dpl) {
        constexpr int DPL = decltype(dpl)::value;
        cudaError_t err = launch(att_dq_kernel<DPL>, blocks_of(d.nq, nq_w), d.NH, d.B, nq_w,
                                 dq_bytes(nq_w), st, d, dq, dout, q, k, v, lse, delta, dt);
        if (err != cudaSuccess) return err;
        return launch(att_dkv_kernel<DPL>, blocks_of(d.nk, nk_w), d.KVH, d.B, nk_w, dkv_bytes(nk_w),
                      st, d, dk, dv, dout, q, k, v, lse, delta, dt);
    });
}

extern "C" cudaError_t hs_cuda_launch_attention_merge(cudaStream_t st, float *out, float *lse,
                                                      const float *bout, const float *blse, int B,
                                                      int NH, int HD, int Tq, int q0, int nq) {
    int64_t rows = (int64_t)B * NH * nq;
    if (rows <= 0) return cudaSuccess;
    int64_t blocks = (rows + 7) / 8;
    att_merge_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, st>>>(
        out, lse, bout, blse, B, NH, HD, Tq, q0, nq);
    return cudaGetLastError();
}
