/* The MoE router: logits, fp32 scores (softmax, or DeepSeek-V3's
 * sigmoid), top-k selection (within groups, steered by the correction
 * bias), the weights and the per-layer statistics the aux loss needs; and
 * its backward through the weights and the scores.
 *
 * The routing itself is the device's moe_route, the statistics its
 * moe_stats, the backward (through the renormalisation and the softmax)
 * its moe_route_bwd. Rounding points follow Mixtral in a low-precision
 * run: the logits are rounded to the compute dtype (the gate nn.Linear's
 * output dtype) before the fp32 softmax, and the renormalised weights are
 * rounded to the compute dtype ("routing_weights.to(hidden_states.dtype)").
 * Backward treats both roundings as the identity. */
#include "model/moe_layer.h"

void hs_moe_route_forward(hs_moe_act *act, const void *x, const void *gate, const void *bias,
                          int BT) {
    const int C = act->cap.C, E = act->cap.E, K = act->cap.K;
    const hs_dtype dt = act->dt;
    hs_dev_gemm(act->dev, false, true, BT, E, C, 1.0f, x, dt, C, gate, dt, C, 0.0f, act->probs,
                HS_DTYPE_F32, E);
    hs_dev_zero(act->dev, act->count, (size_t)E * sizeof(int64_t));
    hs_dev_zero(act->dev, act->prob_sum, (size_t)E * sizeof(double));
    /* the bias as its fp32 main value rounded to dt (a 16-bit parameter
     * view), read in fp32 */
    const float *b = bias;
    if (bias && dt != HS_DTYPE_F32)
        hs_dev_convert(act->dev, act->bias32, HS_DTYPE_F32, bias, dt, E), b = act->bias32;
    act->dev->k->moe_route(act->dev->stream, act->sel, act->weight, act->probs, b, BT, E, K,
                           act->cap.router, dt);
    /* the layer's statistics for the load-balancing loss */
    act->dev->k->moe_stats(act->dev->stream, act->count, act->prob_sum, act->sel, act->probs, BT, E,
                           K);
}

void hs_moe_route_backward(float *dx, const hs_moe_grads *gr, const float *dw,
                           const float *aux_grad, const hs_moe_seq *seq, const hs_moe_act *act,
                           const void *x, const void *gate, float *dp, float *tmp,
                           const int64_t *blocks) {
    const int C = act->cap.C, E = act->cap.E, K = act->cap.K, BT = act->BT;
    act->dev->k->moe_route_bwd(act->dev->stream, dp, act->probs, act->sel, dw, aux_grad, BT, E, K,
                               act->cap.router);
    if (seq) hs_moe_seq_backward(act, seq, dp, tmp);
    hs_dev_gemm(act->dev, false, false, BT, C, E, 1.0f, dp, HS_DTYPE_F32, E, gate, act->dt, C, 1.0f,
                dx, HS_DTYPE_F32, C);
    if (gr->gate && gr->wgrad)
        gr->wgrad->fn(gr->wgrad->ctx, gr->gate, gr->dt, dp, HS_DTYPE_F32, x, act->dt, blocks, C, E);
    else if (gr->gate)
        hs_dev_gemm(act->dev, true, false, E, C, BT, 1.0f, dp, HS_DTYPE_F32, E, x, act->dt, C, 1.0f,
                    gr->gate, gr->dt, C);
}
