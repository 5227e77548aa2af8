/* The cuda backend's MoE kernels: routing (softmax, top-K, renormalised
 * weights), the grouped order of the (token, slot) pairs, the permutation
 * of token rows into it and back, the combine and its backward, the
 * router's backward and its statistics for the load-balancing loss.
 *
 * They follow reference_moe.c, the oracle, operation for operation where
 * the order of a sum decides bits: routing's softmax is in fp64 with its
 * sum taken in expert order by one lane, so the chosen experts are
 * reference's (ties to the lower expert); the combine's slots and the
 * permutation's backward add in the orders the table fixes (dx gathers
 * each token's rows in grouped-row order, no atomics); the grouped order
 * is a stable placement per expert, the same integers as reference. The
 * long reductions that the C code walks in order (the combine backward's
 * dot products, in column order there, the router backward's p . g, the
 * statistics' column sums) are fp64 trees here: reference's fp64 sums but
 * for the last bits of a double, the same run to run. Products the C code
 * rounds before an add use __dmul_rn / __fmul_rn, so nvcc does not fuse
 * them into an FMA that the C build (no contraction) does not do. */
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "device/cuda_moe_launch.h"

enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };

#define FULL_MASK 0xFFFFFFFFu
/* The most blocks of a grid-stride launch. */
#define MAX_BLOCKS 65535
/* Threads of a block that works on one row of C values at a time. */
#define ROW_THREADS 128
/* Dynamic shared memory a kernel takes without opting in. */
#define SMEM_DEFAULT (48 * 1024)

static unsigned grid_for(int64_t items, int64_t per_block, int64_t cap) {
    int64_t b = (items + per_block - 1) / per_block;
    return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

static __device__ __forceinline__ int64_t grid_first(void) {
    return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
static __device__ __forceinline__ int64_t grid_stride(void) {
    return (int64_t)gridDim.x * blockDim.x;
}

/* The warp of this thread, counted over the grid, and the warps of the
 * grid: a grid-stride loop with one warp per item. */
static __device__ __forceinline__ int64_t warp_first(void) {
    return (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
}
static __device__ __forceinline__ int64_t warp_stride(void) {
    return (int64_t)gridDim.x * (blockDim.x >> 5);
}

static __device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

/* ----------------------------------------------------------------- dtypes */

/* Element i of p (dtype DT) as fp32. */
template <int DT> static __device__ __forceinline__ float load_dt(const void *p, int64_t i) {
    if (DT == DT_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (DT == DT_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

/* The value v takes stored in dt and read back (hs_round_to's: round to
 * nearest even; a NaN stays a NaN). */
static __device__ __forceinline__ float round_dt(float v, int dt) {
    if (dt == DT_BF16) return __bfloat162float(__float2bfloat16_rn(v));
    if (dt == DT_F16) return __half2float(__float2half_rn(v));
    return v;
}

/* ---------------------------------------------------------------- routing */

#define ROUTE_WARPS 4
/* Blocks of a routing launch whose workspace is in global memory: it is
 * sized per warp of the grid, so the grid is kept small. */
#define ROUTE_GLOBAL_BLOCKS 128

/* One warp's row of logits l rounded to dt: p[e] = exp(l_e - max) in
 * fp64, and their sum in expert order (lane 0's, every lane gets it). */
static __device__ double warp_exps(const float *l, double *p, int E, int dt) {
    const int lane = threadIdx.x & 31;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) {
        float v = round_dt(l[e], dt);
        p[e] = v;
        mx = v > mx ? v : mx;
    }
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(FULL_MASK, mx, o);
        mx = v > mx ? v : mx;
    }
    for (int e = lane; e < E; e += 32) p[e] = exp(p[e] - (double)mx);
    __syncwarp();
    double sum = 0.0;
    if (lane == 0)
        for (int e = 0; e < E; e++) sum += p[e];
    return __shfl_sync(FULL_MASK, sum, 0);
}

/* One warp per row; ws: E + K doubles of the warp's own (the fp64
 * exponentials, then the chosen probabilities). As reference: logits
 * rounded to dt, p_e = exp(l_e - max) in fp64 summed in expert order, the
 * fp32 softmax stored over the logits, K arg-maxes over the exponentials
 * not yet taken (the lower expert on a tie), and the weights
 * (renormalised over the chosen when renorm) rounded to fp32 and then to
 * dt. A row with fewer than K comparable values (NaN logits) gets expert
 * -1 and a NaN weight for the missing slots. */
static __global__ void route_kernel(int32_t *expert, float *weight, float *probs, double *global_ws,
                                    int64_t N, int E, int K, bool renorm, int dt) {
    extern __shared__ double shared_ws[];
    const int lane = threadIdx.x & 31;
    const int64_t first = warp_first();
    double *p = global_ws ? global_ws + first * (E + K) : shared_ws + (threadIdx.x >> 5) * (E + K);
    double *taken = p + E;
    for (int64_t n = first; n < N; n += warp_stride()) {
        float *l = probs + n * E;
        const double sum = warp_exps(l, p, E, dt);
        for (int e = lane; e < E; e += 32) l[e] = (float)(p[e] / sum);
        double chosen = 0.0;
        for (int j = 0; j < K; j++) {
            /* taken ones hold -1, which no exponential is below */
            double bv = -1.0;
            int bi = INT_MAX;
            for (int e = lane; e < E; e += 32)
                if (p[e] > bv) bv = p[e], bi = e;
            for (int o = 16; o > 0; o >>= 1) {
                double ov = __shfl_xor_sync(FULL_MASK, bv, o);
                int oi = __shfl_xor_sync(FULL_MASK, bi, o);
                if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
            }
            double t = bi == INT_MAX ? (double)NAN : bv / sum;
            chosen += t;
            if (lane == 0) { /* every lane has read p in this round (the shuffles) */
                if (bi != INT_MAX) p[bi] = -1.0;
                taken[j] = t;
                expert[n * K + j] = bi == INT_MAX ? -1 : bi;
            }
            __syncwarp();
        }
        for (int k = lane; k < K; k += 32)
            weight[n * K + k] = round_dt((float)(renorm ? taken[k] / chosen : taken[k]), dt);
        __syncwarp(); /* the next row reuses p and taken */
    }
}

static size_t route_ws_bytes(int E, int K) {
    return ((size_t)E + (size_t)(K > 0 ? K : 0)) * sizeof(double) * ROUTE_WARPS;
}

extern "C" size_t hs_cu_moe_route_scratch(int64_t N, int E, int K) {
    if (N <= 0 || route_ws_bytes(E, K) <= SMEM_DEFAULT) return 0;
    return route_ws_bytes(E, K) * grid_for(N, ROUTE_WARPS, ROUTE_GLOBAL_BLOCKS);
}

extern "C" cudaError_t hs_cu_moe_route(cudaStream_t st, int32_t *expert, float *weight,
                                       float *probs, void *scratch, int64_t N, int E, int K,
                                       bool renorm, int dt) {
    if (N <= 0 || E <= 0) return cudaSuccess;
    size_t ws = route_ws_bytes(E, K);
    if (ws <= SMEM_DEFAULT)
        route_kernel<<<grid_for(N, ROUTE_WARPS, MAX_BLOCKS), ROUTE_WARPS * 32, ws, st>>>(
            expert, weight, probs, NULL, N, E, K, renorm, dt);
    else
        route_kernel<<<grid_for(N, ROUTE_WARPS, ROUTE_GLOBAL_BLOCKS), ROUTE_WARPS * 32, 0, st>>>(
            expert, weight, probs, (double *)scratch, N, E, K, renorm, dt);
    return cudaGetLastError();
}

/* The best of c[lo..hi) on this warp not taken (NaN) nor masked (-inf):
 * every lane gets it, the lower expert on a tie; INT_MAX when none is. */
static __device__ int warp_best(const double *c, int lo, int hi, double *val) {
    const int lane = threadIdx.x & 31;
    double bv = -INFINITY;
    int bi = INT_MAX;
    for (int e = lo + lane; e < hi; e += 32)
        if (c[e] > bv) bv = c[e], bi = e;
    for (int o = 16; o > 0; o >>= 1) {
        double ov = __shfl_xor_sync(FULL_MASK, bv, o);
        int oi = __shfl_xor_sync(FULL_MASK, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    *val = bv;
    return bi;
}

/* One warp per row, as reference computes it in fp64: the scores q (each
 * logit's sigmoid, or the softmax of the logits rounded to dt) stored in
 * fp32 over the logits; the choice scores c = q + bias; with groups, each
 * group scored by its two best c and all but the topk_group best groups
 * masked to -inf (lane 0, in group order: the lower group on a tie); K
 * picks of the best c left (taken ones become NaN); the weights from q,
 * renormalised over the chosen (+1e-20 for sigmoid) and scaled, then
 * rounded to dt. ws: 2E + K doubles of the warp's own (q, c, the chosen
 * q). */
static __global__ void route_scored_kernel(int32_t *expert, float *weight, float *probs,
                                           const float *bias, double *global_ws, int64_t N, int E,
                                           int K, hs_cu_router r, int dt) {
    extern __shared__ double shared_ws[];
    const int lane = threadIdx.x & 31;
    const int64_t first = warp_first();
    const size_t row_ws = 2 * (size_t)E + (size_t)K;
    double *q = global_ws ? global_ws + first * row_ws : shared_ws + (threadIdx.x >> 5) * row_ws;
    double *c = q + E, *taken = c + E;
    const int G = r.n_group > 1 ? r.n_group : 1, n = E / G;
    for (int64_t row = first; row < N; row += warp_stride()) {
        float *l = probs + row * E;
        if (r.sigmoid) {
            for (int e = lane; e < E; e += 32) q[e] = 1.0 / (1.0 + exp(-(double)l[e]));
        } else {
            const double sum = warp_exps(l, q, E, dt);
            for (int e = lane; e < E; e += 32) q[e] /= sum;
        }
        for (int e = lane; e < E; e += 32) {
            l[e] = (float)q[e];
            c[e] = q[e] + (bias ? (double)bias[e] : 0.0);
        }
        __syncwarp();
        if (G > 1 && lane == 0) {
            double gs[HS_CU_MOE_MAX_GROUPS];
            bool keep[HS_CU_MOE_MAX_GROUPS];
            for (int g = 0; g < G; g++) {
                int b = g * n, b2 = -1;
                for (int e = g * n + 1; e < (g + 1) * n; e++) b = c[e] > c[b] ? e : b;
                for (int e = g * n; e < (g + 1) * n; e++)
                    if (e != b && (b2 < 0 || c[e] > c[b2])) b2 = e;
                gs[g] = c[b] + c[b2], keep[g] = false;
            }
            for (int j = 0; j < r.topk_group; j++) {
                int best = -1;
                for (int g = 0; g < G; g++)
                    if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
                keep[best] = true;
            }
            for (int e = 0; e < E; e++)
                if (!keep[e / n]) c[e] = -INFINITY;
        }
        __syncwarp();
        double chosen = 0.0;
        for (int j = 0; j < K; j++) {
            double bv;
            int bi = warp_best(c, 0, E, &bv);
            double t = bi == INT_MAX ? (double)NAN : q[bi];
            chosen += t;
            if (lane == 0) { /* every lane has read c in this round (the shuffles) */
                if (bi != INT_MAX) c[bi] = (double)NAN;
                taken[j] = t;
                expert[row * K + j] = bi == INT_MAX ? -1 : bi;
            }
            __syncwarp();
        }
        if (r.sigmoid) chosen += 1e-20;
        for (int k = lane; k < K; k += 32)
            weight[row * K + k] =
                round_dt((float)((r.renorm ? taken[k] / chosen : taken[k]) * r.scale), dt);
        __syncwarp(); /* the next row reuses the workspace */
    }
}

static size_t route_scored_ws_bytes(int E, int K) {
    return (2 * (size_t)E + (size_t)(K > 0 ? K : 0)) * sizeof(double) * ROUTE_WARPS;
}

extern "C" size_t hs_cu_moe_route_scored_scratch(int64_t N, int E, int K) {
    if (N <= 0 || route_scored_ws_bytes(E, K) <= SMEM_DEFAULT) return 0;
    return route_scored_ws_bytes(E, K) * grid_for(N, ROUTE_WARPS, ROUTE_GLOBAL_BLOCKS);
}

extern "C" cudaError_t hs_cu_moe_route_scored(cudaStream_t st, int32_t *expert, float *weight,
                                              float *probs, const float *bias, void *scratch,
                                              int64_t N, int E, int K, hs_cu_router r, int dt) {
    if (N <= 0 || E <= 0) return cudaSuccess;
    size_t ws = route_scored_ws_bytes(E, K);
    if (ws <= SMEM_DEFAULT)
        route_scored_kernel<<<grid_for(N, ROUTE_WARPS, MAX_BLOCKS), ROUTE_WARPS * 32, ws, st>>>(
            expert, weight, probs, bias, NULL, N, E, K, r, dt);
    else
        route_scored_kernel<<<grid_for(N, ROUTE_WARPS, ROUTE_GLOBAL_BLOCKS), ROUTE_WARPS * 32, 0,
                              st>>>(expert, weight, probs, bias, (double *)scratch, N, E, K, r, dt);
    return cudaGetLastError();
}

/* ------------------------------------------------------------ permutation */

/* xg[r] = x[row_pair[r] / K], rows of `units` words of U. */
template <typename U>
static __global__ void permute_kernel(U *xg, const U *x, const int32_t *row_pair, int64_t rows,
                                      int K, int64_t units) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const U *src = x + (int64_t)(row_pair[r] / K) * units;
        U *dst = xg + r * units;
        for (int64_t u = threadIdx.x; u < units; u += blockDim.x) dst[u] = src[u];
    }
}

template <typename U>
static cudaError_t permute_as(cudaStream_t st, void *xg, const void *x, const int32_t *row_pair,
                              int64_t rows, int K, size_t row_bytes) {
    permute_kernel<U><<<grid_for(rows, 1, MAX_BLOCKS), ROW_THREADS, 0, st>>>(
        (U *)xg, (const U *)x, row_pair, rows, K, (int64_t)(row_bytes / sizeof(U)));
    return cudaGetLastError();
}

/* A byte copy of each row, in the widest word that the row size and both
 * pointers allow. */
extern "C" cudaError_t hs_cu_moe_permute(cudaStream_t st, void *xg, const void *x,
                                         const int32_t *row_pair, int dt, int64_t N, int K, int C) {
    const int64_t rows = N * K;
    const size_t row_bytes = (size_t)(C > 0 ? C : 0) * (dt == DT_F32 ? 4u : 2u);
    if (rows <= 0 || row_bytes == 0) return cudaSuccess;
    const uintptr_t a = (uintptr_t)xg | (uintptr_t)x | (uintptr_t)row_bytes;
    if (a % 16 == 0) return permute_as<uint4>(st, xg, x, row_pair, rows, K, row_bytes);
    if (a % 4 == 0) return permute_as<uint32_t>(st, xg, x, row_pair, rows, K, row_bytes);
    return permute_as<uint16_t>(st, xg, x, row_pair, rows, K, row_bytes);
}

/* pair_row[row_pair[r]] = r. */
static __global__ void invert_kernel(int32_t *pair_row, const int32_t *row_pair, int64_t rows) {
    for (int64_t r = grid_first(); r < rows; r += grid_stride()) pair_row[row_pair[r]] = (int32_t)r;
}

/* One block per token: its K grouped rows put in ascending order (each
 * slot's rank among them; rows are distinct), then each column of dx
 * takes them in that order, one fp32 add each, as reference's loop over
 * grouped rows adds them. */
static __global__ void permute_bwd_kernel(float *dx, const float *dxg, const int32_t *pair_row,
                                          int64_t N, int K, int C) {
    extern __shared__ int32_t rows_in_order[];
    for (int64_t t = blockIdx.x; t < N; t += gridDim.x) {
        const int32_t *slots = pair_row + t * K;
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            int32_t r = slots[k];
            int rank = 0;
            for (int j = 0; j < K; j++) rank += slots[j] < r;
            rows_in_order[rank] = r;
        }
        __syncthreads();
        float *d = dx + t * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = d[c];
            for (int k = 0; k < K; k++) acc += dxg[(int64_t)rows_in_order[k] * C + c];
            d[c] = acc;
        }
        __syncthreads(); /* the next token reuses rows_in_order */
    }
}

extern "C" size_t hs_cu_moe_permute_bwd_scratch(int64_t N, int K) {
    return (size_t)(N * K > 0 ? N * K : 0) * sizeof(int32_t);
}

extern "C" cudaError_t hs_cu_moe_permute_bwd(cudaStream_t st, float *dx, const float *dxg,
                                             const int32_t *row_pair, void *scratch, int64_t N,
                                             int K, int C) {
    const int64_t rows = N * K;
    if (rows <= 0 || C <= 0) return cudaSuccess;
    int32_t *pair_row = (int32_t *)scratch;
    invert_kernel<<<grid_for(rows, 256, MAX_BLOCKS), 256, 0, st>>>(pair_row, row_pair, rows);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    permute_bwd_kernel<<<grid_for(N, 1, MAX_BLOCKS), ROW_THREADS, (size_t)K * sizeof(int32_t),
                         st>>>(dx, dxg, pair_row, N, K, C);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- combine */

/* One block per token: out[t, c] = sum over slots k in order of
 * weight[t, k] * y[pair_row[t, k], c], in fp64 (each product of two fp32
 * values exact) rounded once: reference's bits. */
template <int DT>
static __global__ void unpermute_kernel(float *out, const void *y, const int32_t *pair_row,
                                        const float *weight, int64_t N, int K, int C) {
    for (int64_t t = blockIdx.x; t < N; t += gridDim.x)
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            double acc = 0.0;
            for (int k = 0; k < K; k++)
                acc += (double)weight[t * K + k] *
                       (double)load_dt<DT>(y, (int64_t)pair_row[t * K + k] * C + c);
            out[t * C + c] = (float)acc;
        }
}

extern "C" cudaError_t hs_cu_moe_unpermute(cudaStream_t st, float *out, const void *y, int dt,
                                           const int32_t *pair_row, const float *weight, int64_t N,
                                           int K, int C) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    const unsigned blocks = grid_for(N, 1, MAX_BLOCKS);
    if (dt == DT_BF16)
        unpermute_kernel<DT_BF16>
            <<<blocks, ROW_THREADS, 0, st>>>(out, y, pair_row, weight, N, K, C);
    else if (dt == DT_F16)
        unpermute_kernel<DT_F16><<<blocks, ROW_THREADS, 0, st>>>(out, y, pair_row, weight, N, K, C);
    else
        unpermute_kernel<DT_F32><<<blocks, ROW_THREADS, 0, st>>>(out, y, pair_row, weight, N, K, C);
    return cudaGetLastError();
}

/* One warp per pair p of token t at grouped row r: dyg[r] = weight[p] *
 * dout[t] (one fp32 product: the bits of reference's fp64 product rounded
 * once) and dw[p] = dout[t] . y[r], its exact fp64 products summed in an
 * fp64 tree and rounded once. */
template <int DT>
static __global__ void combine_bwd_kernel(float *dyg, float *dw, const float *dout, const void *y,
                                          const int32_t *pair_row, const float *weight, int64_t P,
                                          int K, int C) {
    const int lane = threadIdx.x & 31;
    for (int64_t p = warp_first(); p < P; p += warp_stride()) {
        const int64_t r = pair_row[p], t = p / K;
        const float w = weight[p];
        const float *g = dout + t * C;
        float *dy = dyg + r * C;
        double dot = 0.0;
        for (int c = lane; c < C; c += 32) {
            const float gc = g[c];
            dy[c] = __fmul_rn(w, gc);
            dot += (double)gc * (double)load_dt<DT>(y, r * C + c);
        }
        dot = warp_sum(dot);
        if (lane == 0) dw[p] = (float)dot;
    }
}

extern "C" cudaError_t hs_cu_moe_combine_bwd(cudaStream_t st, float *dyg, float *dw,
                                             const float *dout, const void *y, int dt,
                                             const int32_t *pair_row, const float *weight,
                                             int64_t N, int K, int C) {
    const int64_t P = N * K;
    if (P <= 0) return cudaSuccess;
    const unsigned blocks = grid_for(P, 8, MAX_BLOCKS);
    if (dt == DT_BF16)
        combine_bwd_kernel<DT_BF16>
            <<<blocks, 256, 0, st>>>(dyg, dw, dout, y, pair_row, weight, P, K, C);
    else if (dt == DT_F16)
        combine_bwd_kernel<DT_F16>
            <<<blocks, 256, 0, st>>>(dyg, dw, dout, y, pair_row, weight, P, K, C);
    else
        combine_bwd_kernel<DT_F32>
            <<<blocks, 256, 0, st>>>(dyg, dw, dout, y, pair_row, weight, P, K, C);
    return cudaGetLastError();
}

/* ------------------------------------------------------ router's backward */

/* d loss / d scores of expert e of one token, in fp64 as reference: the
 * aux-loss gradient plus, for each slot choosing e in slot order, its dw
 * times the scale through the renormalisation (z: the chosen scores' sum,
 * wdot: sum_k dw_k q_k / z). */
static __device__ double route_grad(int e, const float *aux_grad, const int32_t *sel,
                                    const float *d, int K, const hs_cu_router &r, double z,
                                    double wdot) {
    double g = aux_grad ? (double)aux_grad[e] : 0.0;
    for (int k = 0; k < K; k++)
        if (sel[k] == e) g += r.scale * (r.renorm ? ((double)d[k] - wdot) / z : (double)d[k]);
    return g;
}

/* One warp per token: z and wdot by every lane in slot order (reference's
 * sums); for sigmoid scores dp = p (1 - p) g, else p . g as an fp64 tree
 * and dp = p (g - p . g) stored. */
static __global__ void route_bwd_kernel(float *dp, const float *probs, const int32_t *expert,
                                        const float *dw, const float *aux_grad, int64_t N, int E,
                                        int K, hs_cu_router r) {
    const int lane = threadIdx.x & 31;
    for (int64_t t = warp_first(); t < N; t += warp_stride()) {
        const float *p = probs + t * E;
        const int32_t *sel = expert + t * K;
        const float *d = dw + t * K;
        double z = r.sigmoid ? 1e-20 : 0.0, wdot = 0.0, pdot = 0.0;
        for (int k = 0; r.renorm && k < K; k++) z += p[sel[k]];
        for (int k = 0; r.renorm && k < K; k++)
            wdot = __dadd_rn(wdot, __dmul_rn((double)d[k], (double)p[sel[k]] / z));
        if (r.sigmoid) {
            for (int e = lane; e < E; e += 32) {
                double g = route_grad(e, aux_grad, sel, d, K, r, z, wdot);
                dp[t * E + e] = (float)((double)p[e] * (1.0 - (double)p[e]) * g);
            }
            continue;
        }
        for (int e = lane; e < E; e += 32)
            pdot = __dadd_rn(pdot,
                             __dmul_rn((double)p[e], route_grad(e, aux_grad, sel, d, K, r, z, wdot)));
        pdot = warp_sum(pdot);
        for (int e = lane; e < E; e += 32) {
            double g = route_grad(e, aux_grad, sel, d, K, r, z, wdot);
            dp[t * E + e] = (float)__dmul_rn((double)p[e], g - pdot);
        }
    }
}

extern "C" cudaError_t hs_cu_moe_route_bwd(cudaStream_t st, float *dp, const float *probs,
                                           const int32_t *expert, const float *dw,
                                           const float *aux_grad, int64_t N, int E, int K,
                                           hs_cu_router r) {
    if (N <= 0 || E <= 0) return cudaSuccess;
    route_bwd_kernel<<<grid_for(N, 8, MAX_BLOCKS), 256, 0, st>>>(dp, probs, expert, dw, aux_grad, N,
                                                                 E, K, r);
    return cudaGetLastError();
}

/* ------------------------------------------------------------- statistics */

/* count[e] += the selections of e: a block's histogram in shared memory
 * (when E fits) added once per expert, integers, so in any order. An id
 * outside [0, E) (reference asserts there is none) is not counted. */
static __global__ void count_kernel(int64_t *count, const int32_t *expert, int64_t P, int E,
                                    bool in_shared) {
    extern __shared__ unsigned int hist[];
    if (in_shared) {
        for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
        __syncthreads();
    }
    for (int64_t i = grid_first(); i < P; i += grid_stride()) {
        const int32_t e = expert[i];
        if (e < 0 || e >= E) continue;
        if (in_shared) atomicAdd(&hist[e], 1u);
        else atomicAdd((unsigned long long *)&count[e], 1ull);
    }
    if (in_shared) {
        __syncthreads();
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            if (hist[e]) atomicAdd((unsigned long long *)&count[e], (unsigned long long)hist[e]);
    }
}

/* Rows of probs a block of the column sums takes, in SUM_ROWS lanes of 32
 * columns; at most SUM_PARTS blocks down the rows. */
#define SUM_ROWS 8
#define SUM_ROWS_PER_BLOCK 512
#define SUM_PARTS 1024

static int sum_parts(int64_t N) { return (int)grid_for(N, SUM_ROWS_PER_BLOCK, SUM_PARTS); }

/* part[y, e] = the sum in fp64 of probs[t, e] over block row y's rows:
 * threads (x, y) of a block take columns blockIdx.x * 32 + x (coalesced)
 * and every SUM_ROWS-th row, then the block adds its SUM_ROWS lanes in
 * order. */
static __global__ void prob_part_kernel(double *part, const float *probs, int64_t N, int E) {
    __shared__ double lanes[SUM_ROWS][33];
    const int e = blockIdx.x * 32 + threadIdx.x;
    double acc = 0.0;
    if (e < E)
        for (int64_t t = (int64_t)blockIdx.y * SUM_ROWS + threadIdx.y; t < N;
             t += (int64_t)gridDim.y * SUM_ROWS)
            acc += probs[t * E + e];
    lanes[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && e < E) {
        double v = 0.0;
        for (int j = 0; j < SUM_ROWS; j++) v += lanes[j][threadIdx.x];
        part[(int64_t)blockIdx.y * E + e] = v;
    }
}

/* prob_sum[e] += the parts of e in order: one addition into it. */
static __global__ void prob_total_kernel(double *prob_sum, const double *part, int parts, int E) {
    for (int64_t e = grid_first(); e < E; e += grid_stride()) {
        double v = 0.0;
        for (int j = 0; j < parts; j++) v += part[(int64_t)j * E + e];
        prob_sum[e] += v;
    }
}

extern "C" size_t hs_cu_moe_stats_scratch(int64_t N, int E, bool sums) {
    if (!sums || N <= 0 || E <= 0) return 0;
    return (size_t)sum_parts(N) * (size_t)E * sizeof(double);
}

extern "C" cudaError_t hs_cu_moe_stats(cudaStream_t st, int64_t *count, double *prob_sum,
                                       const int32_t *expert, const float *probs, void *scratch,
                                       int64_t N, int E, int K) {
    if (N <= 0 || E <= 0) return cudaSuccess;
    const int64_t P = N * K;
    if (P > 0) {
        const size_t hist = (size_t)E * sizeof(unsigned int);
        const bool in_shared = hist <= SMEM_DEFAULT;
        count_kernel<<<grid_for(P, 256 * 8, 1024), 256, in_shared ? hist : 0, st>>>(
            count, expert, P, E, in_shared);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess || prob_sum == NULL) return err;
    }
    if (prob_sum == NULL) return cudaSuccess;
    const int parts = sum_parts(N);
    double *part = (double *)scratch;
    prob_part_kernel<<<dim3((unsigned)((E + 31) / 32), (unsigned)parts), dim3(32, SUM_ROWS), 0,
                       st>>>(part, probs, N, E);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    prob_total_kernel<<<grid_for(E, 256, MAX_BLOCKS), 256, 0, st>>>(prob_sum, part, parts, E);
    return cudaGetLastError();
}

static __global__ void stats_add_kernel(int64_t *count, double *prob_sum, const int64_t *count_in,
                                        const double *prob_sum_in, int E) {
    for (int64_t e = grid_first(); e < E; e += grid_stride()) {
        count[e] += count_in[e];
        if (prob_sum) prob_sum[e] += prob_sum_in[e];
    }
}

extern "C" cudaError_t hs_cu_moe_stats_add(cudaStream_t st, int64_t *count, double *prob_sum,
                                           const int64_t *count_in, const double *prob_sum_in,
                                           int E) {
    if (E <= 0) return cudaSuccess;
    stats_add_kernel<<<grid_for(E, 256, MAX_BLOCKS), 256, 0, st>>>(count, prob_sum, count_in,
                                                                   prob_sum_in, E);
    return cudaGetLastError();
}

/* --------------------------------------------------------------- dispatch */

#define DISPATCH_THREADS 256
#define DISPATCH_WARPS (DISPATCH_THREADS / 32)
/* Consecutive pairs per thread in one pass over a chunk. */
#define DISPATCH_ITEMS 8

/* The block's sum of v, in every thread. */
static __device__ int64_t block_sum_i64(int64_t v, int64_t *warp_sums) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
    __syncthreads();
    int64_t s = 0;
    for (int w = 0; w < DISPATCH_WARPS; w++) s += warp_sums[w];
    __syncthreads(); /* warp_sums may be written again */
    return s;
}

/* One block per expert e, the stable placement of its pairs: its first
 * row is the sum of the counts before it; the block walks the pairs in
 * order, chunk by chunk, each thread taking DISPATCH_ITEMS consecutive
 * ones, and an exclusive scan of the threads' matches gives each match its
 * row, so an expert's pairs keep pair order (reference's integers). A row
 * past the end (counts that do not match expert) is not written. */
static __global__ void dispatch_kernel(int32_t *offset, int32_t *row_pair, int32_t *pair_row,
                                       const int32_t *expert, const int64_t *count, int64_t P,
                                       int E) {
    __shared__ int64_t warp_sums[DISPATCH_WARPS];
    __shared__ int warp_matches[DISPATCH_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int e = blockIdx.x; e < E; e += gridDim.x) {
        int64_t before = 0;
        for (int j = threadIdx.x; j < e; j += blockDim.x) before += count[j];
        before = block_sum_i64(before, warp_sums);
        if (threadIdx.x == 0) {
            offset[e] = (int32_t)before;
            if (e == E - 1) offset[E] = (int32_t)P;
        }
        int64_t row = before;
        for (int64_t c0 = 0; c0 < P; c0 += DISPATCH_THREADS * DISPATCH_ITEMS) {
            const int64_t first = c0 + (int64_t)threadIdx.x * DISPATCH_ITEMS;
            unsigned hits = 0;
            int n = 0;
            for (int i = 0; i < DISPATCH_ITEMS; i++) {
                const bool hit = first + i < P && expert[first + i] == e;
                hits |= (unsigned)hit << i;
                n += hit;
            }
            int incl = n; /* inclusive scan over the warp */
            for (int o = 1; o < 32; o <<= 1) {
                int v = __shfl_up_sync(FULL_MASK, incl, o);
                if (lane >= o) incl += v;
            }
            if (lane == 31) warp_matches[warp] = incl;
            __syncthreads();
            int64_t r = row + incl - n, chunk = 0;
            for (int w = 0; w < DISPATCH_WARPS; w++) {
                r += w < warp ? warp_matches[w] : 0;
                chunk += warp_matches[w];
            }
            for (int i = 0; i < DISPATCH_ITEMS; i++)
                if (hits >> i & 1u) {
                    if (r < P) {
                        row_pair[r] = (int32_t)(first + i);
                        pair_row[first + i] = (int32_t)r;
                    }
                    r++;
                }
            row += chunk;
            __syncthreads(); /* warp_matches is written again */
        }
    }
}

extern "C" cudaError_t hs_cu_moe_dispatch(cudaStream_t st, int32_t *offset, int32_t *row_pair,
                                          int32_t *pair_row, const int32_t *expert,
                                          const int64_t *count, int64_t N, int E, int K) {
    if (E <= 0) return cudaSuccess;
    const int64_t P = N * K > 0 ? N * K : 0;
    dispatch_kernel<<<grid_for(E, 1, MAX_BLOCKS), DISPATCH_THREADS, 0, st>>>(
        offset, row_pair, pair_row, expert, count, P, E);
    return cudaGetLastError();
}
