/* Token dispatch for the routed experts: the BT*K (token, slot) pairs are
 * grouped by expert with a stable counting sort, so each expert runs one
 * GEMM over a contiguous block of rows instead of one matrix-vector product
 * per token. Within an expert the rows keep token order, which makes every
 * sum over them deterministic. */
#include "model/moe.h"

void hs_moe_dispatch_plan(hs_moe_act *act)
{
    const int E = act->cap.E, K = act->cap.K;
    const int64_t pairs = (int64_t)act->BT * K;
    /* offset[e + 1] first holds the start of expert e and is advanced as
     * its rows are placed, ending at the start of e + 1. */
    int64_t start = 0;
    act->offset[0] = 0;
    for (int e = 0; e < E; e++) {
        act->offset[e + 1] = (int32_t)start;
        start += act->count[e];
    }
    HS_ASSERT(start == pairs);
    for (int64_t pr = 0; pr < pairs; pr++) {
        int32_t row = act->offset[act->sel[pr] + 1]++;
        act->row_pair[row] = (int32_t)pr;
        act->pair_row[pr] = row;
    }
}

void hs_moe_dispatch_gather(void *xg, const void *x, const hs_moe_act *act)
{
    act->dev->k->moe_permute(act->dev->stream, xg, x, act->row_pair, act->dt, act->BT,
                             act->cap.K, act->cap.C);
}
