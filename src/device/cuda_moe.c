/* The cuda backend's MoE entries: routing, the grouped order, the
 * permutation and its backward, the combine and its backward, the
 * router's backward and its statistics, each over its launcher in
 * cuda_moe.cu on the entry's stream. The workspace hints `ws` of the
 * combine are host sizes for a cpu row buffer: the kernels need none. */
#include "device/cuda.h"
#include "device/cuda_moe_launch.h"

/* Device scratch of `bytes` for the entry `what` (NULL when none is asked
 * for); false when it was refused, which hs_cuda_scratch has recorded. */
static bool scratch_for(hs_stream *s, size_t bytes, const char *what, void **out) {
    *out = bytes ? hs_cuda_scratch(s, bytes, what) : NULL;
    return bytes == 0 || *out != NULL;
}

_Static_assert(HS_CU_MOE_MAX_GROUPS == HS_MOE_MAX_GROUPS, "the kernel's group bound");

static hs_cu_router cu_router(const hs_moe_router *r) {
    return (hs_cu_router){.sigmoid = r->sigmoid,
                          .renorm = r->renorm,
                          .n_group = r->n_group,
                          .topk_group = r->topk_group,
                          .scale = r->scale};
}

/* Mixtral's and Qwen3-MoE's router on its own kernel (the bits it had),
 * every other form on the general one. */
void hs_cuda_moe_route(hs_stream *s, int32_t *expert, float *weight, float *probs,
                       const float *bias, int64_t N, int E, int K, hs_moe_router r, hs_dtype dt) {
    void *ws;
    cudaStream_t st = hs_cuda_stream(s);
    if (hs_moe_router_plain(&r) && bias == NULL) {
        if (!scratch_for(s, hs_cu_moe_route_scratch(N, E, K), "moe_route", &ws)) return;
        hs_cuda_check(s, hs_cu_moe_route(st, expert, weight, probs, ws, N, E, K, r.renorm, (int)dt),
                      "moe_route");
    } else {
        if (!scratch_for(s, hs_cu_moe_route_scored_scratch(N, E, K), "moe_route", &ws)) return;
        hs_cuda_check(s,
                      hs_cu_moe_route_scored(st, expert, weight, probs, bias, ws, N, E, K,
                                             cu_router(&r), (int)dt),
                      "moe_route");
    }
    hs_cuda_scratch_free(s, ws);
}

void hs_cuda_moe_permute(hs_stream *s, void *xg, const void *x, const int32_t *row_pair,
                         hs_dtype dt, int64_t N, int K, int C) {
    hs_cuda_check(s, hs_cu_moe_permute(hs_cuda_stream(s), xg, x, row_pair, (int)dt, N, K, C),
                  "moe_permute");
}

void hs_cuda_moe_permute_bwd(hs_stream *s, float *dx, const float *dxg, const int32_t *row_pair,
                             int64_t N, int K, int C) {
    if (N * K <= 0 || C <= 0) return;
    void *inv;
    if (!scratch_for(s, hs_cu_moe_permute_bwd_scratch(N, K), "moe_permute_bwd", &inv)) return;
    hs_cuda_check(s, hs_cu_moe_permute_bwd(hs_cuda_stream(s), dx, dxg, row_pair, inv, N, K, C),
                  "moe_permute_bwd");
    hs_cuda_scratch_free(s, inv);
}

void hs_cuda_moe_unpermute(hs_stream *s, float *out, const void *y, hs_dtype dt,
                           const int32_t *pair_row, const float *weight, int64_t N, int K, int C,
                           float *ws) {
    (void)ws;
    hs_cuda_check(
        s, hs_cu_moe_unpermute(hs_cuda_stream(s), out, y, (int)dt, pair_row, weight, N, K, C),
        "moe_unpermute");
}

void hs_cuda_moe_combine_bwd(hs_stream *s, float *dyg, float *dw, const float *dout, const void *y,
                             hs_dtype dt, const int32_t *pair_row, const float *weight, int64_t N,
                             int K, int C, float *ws) {
    (void)ws;
    hs_cuda_check(s,
                  hs_cu_moe_combine_bwd(hs_cuda_stream(s), dyg, dw, dout, y, (int)dt, pair_row,
                                        weight, N, K, C),
                  "moe_combine_bwd");
}

void hs_cuda_moe_route_bwd(hs_stream *s, float *dp, const float *probs, const int32_t *expert,
                           const float *dw, const float *aux_grad, int64_t N, int E, int K,
                           hs_moe_router r) {
    hs_cuda_check(s,
                  hs_cu_moe_route_bwd(hs_cuda_stream(s), dp, probs, expert, dw, aux_grad, N, E, K,
                                      cu_router(&r)),
                  "moe_route_bwd");
}

void hs_cuda_moe_stats(hs_stream *s, int64_t *count, double *prob_sum, const int32_t *expert,
                       const float *probs, int64_t N, int E, int K) {
    void *part;
    if (!scratch_for(s, hs_cu_moe_stats_scratch(N, E, prob_sum != NULL), "moe_stats", &part))
        return;
    hs_cuda_check(s,
                  hs_cu_moe_stats(hs_cuda_stream(s), count, prob_sum, expert, probs, part, N, E, K),
                  "moe_stats");
    hs_cuda_scratch_free(s, part);
}

void hs_cuda_moe_stats_add(hs_stream *s, int64_t *count, double *prob_sum, const int64_t *count_in,
                           const double *prob_sum_in, int E) {
    hs_cuda_check(s,
                  hs_cu_moe_stats_add(hs_cuda_stream(s), count, prob_sum, count_in, prob_sum_in, E),
                  "moe_stats_add");
}

void hs_cuda_moe_dispatch(hs_stream *s, int32_t *offset, int32_t *row_pair, int32_t *pair_row,
                          const int32_t *expert, const int64_t *count, int64_t N, int E, int K) {
    hs_cuda_check(
        s,
        hs_cu_moe_dispatch(hs_cuda_stream(s), offset, row_pair, pair_row, expert, count, N, E, K),
        "moe_dispatch");
}
