/* DeepSeek-V3's complementary sequence-wise balance loss
 * (model.moe.seq_aux_loss_coef = alpha), per MoE block and sequence b of
 * T tokens:
 *
 *   s'_te = s_te / sum_j s_tj           (the scores normalised per token)
 *   f_e   = E / (K T) * |{t : e chosen for t}|
 *   P_e   = (1 / T) sum_t s'_te
 *   L_b   = sum_e f_e P_e
 *
 * The objective adds alpha * (1 / S) sum_b L_b over the S sequences of the
 * global batch, each block's term summed. f is a count and carries no
 * gradient; d objective / d s'_te = alpha f_e / (S T), the same for every
 * token of the sequence (coef, kept per block from its first forward for
 * its backward), then through the normalisation and the scores' function
 * into the router's logits. A sequence's rows may sit on several ranks
 * (CP, the row split of sequence parallelism): the counts and sums go over
 * them first (the seam's seq_sum), so every layout computes the same
 * statistics. The arithmetic is on the host, from copies of the router's
 * scores and choices. */
#include "model/moe_layer.h"

/* Host workspace: scores [BT, E], choices [BT, K], the sequences'
 * statistics in fp64 and as the fp32 the seam sums [B, 2E], and the
 * logits' gradient [BT, E]. */
typedef struct seq_host {
    float *p;
    int32_t *sel;
    double *st;
    float *buf;
    float *g;
} seq_host;

static seq_host host_of(void *mem, const hs_moe_shapes *s, int max_batch) {
    const size_t bt = (size_t)s->BT, E = (size_t)s->E, B = (size_t)max_batch;
    char *c = mem;
    seq_host h;
    h.st = (double *)c, c += B * 2 * E * sizeof(double);
    h.p = (float *)c, c += bt * E * sizeof(float);
    h.g = (float *)c, c += bt * E * sizeof(float);
    h.buf = (float *)c, c += B * 2 * E * sizeof(float);
    h.sel = (int32_t *)c;
    return h;
}

size_t hs_moe_seq_host_bytes(const hs_moe_shapes *s, int max_batch) {
    const size_t bt = (size_t)s->BT, E = (size_t)s->E, B = (size_t)max_batch;
    return B * 2 * E * sizeof(double) + 2 * bt * E * sizeof(float) + B * 2 * E * sizeof(float) +
           bt * (size_t)s->K * sizeof(int32_t);
}

/* The sequence of this rank's row r. */
static int seq_of(const hs_moe_seq *q, int64_t r) { return (int)((q->row0 + r) / q->T_local); }

double hs_moe_seq_forward(const hs_moe_act *act, const hs_moe_seq *q, const hs_model_par *par,
                          double alpha, int sequences) {
    const int E = act->cap.E, K = act->cap.K, B = q->B;
    const int64_t BT = act->BT;
    seq_host h = host_of(q->host, &act->cap, q->max_batch);
    HS_ASSERT(B >= 1 && B <= q->max_batch);
    hs_device_copy(act->dev, h.p, act->probs, (size_t)(BT * E) * sizeof(float), HS_COPY_D2H);
    hs_device_copy(act->dev, h.sel, act->sel, (size_t)(BT * K) * sizeof(int32_t), HS_COPY_D2H);
    for (int64_t i = 0; i < (int64_t)B * 2 * E; i++) h.st[i] = 0.0; /* host statistics */
    for (int64_t r = 0; r < BT; r++) {
        double *cnt = h.st + (size_t)seq_of(q, r) * 2 * (size_t)E, *ps = cnt + E;
        const float *p = h.p + r * E;
        double z = 0.0;
        for (int e = 0; e < E; e++) z += p[e];
        for (int k = 0; k < K; k++) cnt[h.sel[r * K + k]] += 1.0;
        for (int e = 0; e < E; e++) ps[e] += p[e] / z;
    }
    for (int64_t i = 0; i < (int64_t)B * 2 * E; i++) h.buf[i] = (float)h.st[i];
    if (par && par->seq_sum) par->seq_sum(par->ctx, h.buf, (int64_t)B * 2 * E);
    const double T = (double)q->T_local * q->cp_size, S = sequences > 0 ? sequences : B;
    double sum = 0.0;
    for (int b = 0; b < B; b++) {
        const float *cnt = h.buf + (size_t)b * 2 * (size_t)E, *ps = cnt + E;
        float *coef = q->coef + (size_t)b * (size_t)E;
        for (int e = 0; e < E; e++) {
            double f = (double)E / ((double)K * T) * cnt[e];
            sum += f * (ps[e] / T);
            coef[e] = (float)(alpha * f / (S * T));
        }
    }
    return alpha * sum / B;
}

void hs_moe_seq_backward(const hs_moe_act *act, const hs_moe_seq *q, float *dp, float *tmp) {
    const int E = act->cap.E;
    const int64_t BT = act->BT;
    seq_host h = host_of(q->host, &act->cap, q->max_batch);
    hs_device_copy(act->dev, h.p, act->probs, (size_t)(BT * E) * sizeof(float), HS_COPY_D2H);
    for (int64_t r = 0; r < BT; r++) {
        const float *p = h.p + r * E, *c = q->coef + (size_t)seq_of(q, r) * (size_t)E;
        float *g = h.g + r * E;
        double z = 0.0, cdot = 0.0;
        for (int e = 0; e < E; e++) z += p[e];
        for (int e = 0; e < E; e++) cdot += (double)c[e] * (p[e] / z);
        /* d / d s_e of sum_j c_j s_j / z, then through the scores */
        if (act->cap.router.sigmoid) {
            for (int e = 0; e < E; e++) g[e] = (float)((c[e] - cdot) / z * p[e] * (1.0 - p[e]));
            continue;
        }
        double pdot = 0.0;
        for (int e = 0; e < E; e++) pdot += (double)p[e] * ((c[e] - cdot) / z);
        for (int e = 0; e < E; e++) g[e] = (float)(p[e] * ((c[e] - cdot) / z - pdot));
    }
    hs_device_copy(act->dev, tmp, h.g, (size_t)(BT * E) * sizeof(float), HS_COPY_H2D);
    hs_dev_add_cast(act->dev, dp, HS_DTYPE_F32, dp, HS_DTYPE_F32, tmp, HS_DTYPE_F32, BT * E);
}
