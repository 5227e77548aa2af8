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
#include <stdlib.h>

#include "model/moe_layer.h"

size_t hs_moe_aux_bytes(int E) { return (size_t)E * (sizeof(int64_t) + sizeof(double)); }

bool hs_moe_aux_init(hs_moe_aux *a, int E, int K, hs_device *dev) {
    HS_ASSERT(E >= 1 && K >= 1 && K <= E);
    a->E = E;
    a->K = K;
    a->dev = dev;
    a->count = hs_device_alloc(dev, (size_t)E * sizeof(int64_t));
    a->prob_sum = hs_device_alloc(dev, (size_t)E * sizeof(double));
    a->host_count = malloc((size_t)E * sizeof(int64_t));
    a->host_prob_sum = malloc((size_t)E * sizeof(double));
    a->host_buf = malloc((2 * (size_t)E + 2) * sizeof(float));
    /* a refused device buffer is the device's to report */
    if (!a->count || !a->prob_sum || !a->host_count || !a->host_prob_sum || !a->host_buf)
        return false;
    hs_moe_aux_reset(a);
    return true;
}

void hs_moe_aux_free(hs_moe_aux *a) {
    hs_device_free_mem(a->dev, a->count);
    hs_device_free_mem(a->dev, a->prob_sum);
    free(a->host_count);
    free(a->host_prob_sum);
    free(a->host_buf);
    a->count = NULL;
    a->prob_sum = NULL;
    a->host_count = NULL;
    a->host_prob_sum = NULL;
    a->host_buf = NULL;
}

void hs_moe_aux_reset(hs_moe_aux *a) {
    hs_dev_zero(a->dev, a->count, (size_t)a->E * sizeof(int64_t));
    hs_dev_zero(a->dev, a->prob_sum, (size_t)a->E * sizeof(double));
    a->rows = 0;
}

/* The totals copied across to the host, where the loss is finished. */
static void fetch(const hs_moe_aux *a) {
    hs_device_copy(a->dev, a->host_count, a->count, (size_t)a->E * sizeof(int64_t), HS_COPY_D2H);
    hs_device_copy(a->dev, a->host_prob_sum, a->prob_sum, (size_t)a->E * sizeof(double),
                   HS_COPY_D2H);
}

static size_t buf_bytes(const hs_moe_aux *a) { return (2 * (size_t)a->E + 2) * sizeof(float); }

/* The layer's sums added to the totals (a sum of per-layer sums, not one
 * sum over every token: the bits the loss has always had). */
void hs_moe_aux_add(hs_moe_aux *a, const hs_moe_act *act) {
    HS_ASSERT(act->cap.E == a->E && act->cap.K == a->K);
    a->dev->k->moe_stats_add(a->dev->stream, a->count, a->prob_sum, act->count, act->prob_sum,
                             a->E);
    a->rows += act->BT;
}

void hs_moe_aux_pack(const hs_moe_aux *a, int64_t valid, float *buf) {
    float *h = a->host_buf;
    fetch(a);
    for (int e = 0; e < a->E; e++) {
        h[e] = (float)a->host_count[e];
        h[a->E + e] = (float)a->host_prob_sum[e];
    }
    h[2 * a->E] = (float)a->rows;
    h[2 * a->E + 1] = (float)valid;
    hs_device_copy(a->dev, buf, h, buf_bytes(a), HS_COPY_H2D);
}

int64_t hs_moe_aux_unpack(hs_moe_aux *a, const float *buf) {
    const float *h = a->host_buf;
    hs_device_copy(a->dev, a->host_buf, buf, buf_bytes(a), HS_COPY_D2H);
    for (int e = 0; e < a->E; e++) {
        a->host_count[e] = (int64_t)h[e];
        a->host_prob_sum[e] = h[a->E + e];
    }
    hs_device_copy(a->dev, a->count, a->host_count, (size_t)a->E * sizeof(int64_t), HS_COPY_H2D);
    hs_device_copy(a->dev, a->prob_sum, a->host_prob_sum, (size_t)a->E * sizeof(double),
                   HS_COPY_H2D);
    a->rows = (int64_t)h[2 * a->E];
    return (int64_t)h[2 * a->E + 1];
}

double hs_moe_aux_value(const hs_moe_aux *a) {
    if (a->rows == 0) return 0.0;
    fetch(a);
    double r = (double)a->rows, sum = 0.0;
    for (int e = 0; e < a->E; e++)
        sum += ((double)a->host_count[e] / r) * (a->host_prob_sum[e] / r);
    return a->E * sum;
}

void hs_moe_aux_prob_grad(const hs_moe_aux *a, double scale, float *g) {
    double r = (double)a->rows;
    float *h = a->host_buf;
    fetch(a);
    for (int e = 0; e < a->E; e++)
        h[e] = a->rows == 0 ? 0.0f : (float)(scale * a->E * (double)a->host_count[e] / (r * r));
    hs_device_copy(a->dev, g, h, (size_t)a->E * sizeof(float), HS_COPY_H2D);
}
