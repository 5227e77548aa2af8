/* The load-balancing aux loss of Hugging Face's load_balancing_loss_func
 * (Switch Transformer eqs. 4-6 with top-k), over all MoE layers of one
 * forward at once, without an attention mask:
 *
 *   value = E * sum_e f_e * P_e
 *   f_e   = (top-k selections of e, all layers) / R
 *   P_e   = (sum of p_{t,e} over all tokens of all layers) / R
 *   R     = tokens * layers
 *
 * Hugging Face concatenates the layers' router logits before taking the
 * means, so this is not the sum of per-layer losses; running totals keep it
 * exact. f_e counts selections, so only P carries a gradient. */
#include "model/moe.h"

size_t hs_moe_aux_bytes(int E) { return (size_t)E * (sizeof(int64_t) + sizeof(double)); }

void hs_moe_aux_init(hs_moe_aux *a, int E, int K, hs_device *dev)
{
    HS_ASSERT(E >= 1 && K >= 1 && K <= E);
    a->E = E;
    a->K = K;
    a->dev = dev;
    a->count = hs_device_alloc(dev, (size_t)E * sizeof(int64_t));
    a->prob_sum = hs_device_alloc(dev, (size_t)E * sizeof(double));
    hs_moe_aux_reset(a);
}

void hs_moe_aux_free(hs_moe_aux *a)
{
    hs_device_free_mem(a->dev, a->count);
    hs_device_free_mem(a->dev, a->prob_sum);
    a->count = NULL;
    a->prob_sum = NULL;
}

void hs_moe_aux_reset(hs_moe_aux *a)
{
    hs_dev_zero(a->dev, a->count, (size_t)a->E * sizeof(int64_t));
    hs_dev_zero(a->dev, a->prob_sum, (size_t)a->E * sizeof(double));
    a->rows = 0;
}

void hs_moe_aux_add(hs_moe_aux *a, const hs_moe_act *act)
{
    HS_ASSERT(act->cap.E == a->E && act->cap.K == a->K);
    for (int e = 0; e < a->E; e++) {
        a->count[e] += act->count[e];
        a->prob_sum[e] += act->prob_sum[e];
    }
    a->rows += act->BT;
}

void hs_moe_aux_pack(const hs_moe_aux *a, int64_t valid, float *buf)
{
    for (int e = 0; e < a->E; e++) {
        buf[e] = (float)a->count[e];
        buf[a->E + e] = (float)a->prob_sum[e];
    }
    buf[2 * a->E] = (float)a->rows;
    buf[2 * a->E + 1] = (float)valid;
}

int64_t hs_moe_aux_unpack(hs_moe_aux *a, const float *buf)
{
    for (int e = 0; e < a->E; e++) {
        a->count[e] = (int64_t)buf[e];
        a->prob_sum[e] = buf[a->E + e];
    }
    a->rows = (int64_t)buf[2 * a->E];
    return (int64_t)buf[2 * a->E + 1];
}

double hs_moe_aux_value(const hs_moe_aux *a)
{
    if (a->rows == 0) return 0.0;
    double r = (double)a->rows, sum = 0.0;
    for (int e = 0; e < a->E; e++) sum += ((double)a->count[e] / r) * (a->prob_sum[e] / r);
    return a->E * sum;
}

void hs_moe_aux_prob_grad(const hs_moe_aux *a, double scale, float *g)
{
    double r = (double)a->rows;
    for (int e = 0; e < a->E; e++)
        g[e] = a->rows == 0 ? 0.0f : (float)(scale * a->E * (double)a->count[e] / (r * r));
}
