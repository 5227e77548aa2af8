/* Token dispatch for the routed experts: the BT*K (token, slot) pairs are
 * grouped by expert with a stable counting sort, so each expert runs one
 * GEMM over a contiguous block of rows instead of one matrix-vector product
 * per token. Within an expert the rows keep token order, which makes every
 * sum over them deterministic. */
#include "model/moe_layer.h"

void hs_moe_dispatch_plan(hs_moe_act *act) {
    act->dev->k->moe_dispatch(act->dev->stream, act->offset, act->row_pair, act->pair_row, act->sel,
                              act->count, act->BT, act->cap.E, act->cap.K);
}

const int32_t *hs_moe_dispatch_offsets(const hs_moe_act *act) {
    hs_device_copy(act->dev, act->offset_h, act->offset, ((size_t)act->cap.E + 1) * sizeof(int32_t),
                   HS_COPY_D2H);
    return act->offset_h;
}

void hs_moe_dispatch_gather(void *xg, const void *x, const hs_moe_act *act) {
    act->dev->k->moe_permute(act->dev->stream, xg, x, act->row_pair, act->dt, act->BT, act->cap.K,
                             act->cap.C);
}
