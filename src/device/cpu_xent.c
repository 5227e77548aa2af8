/* Softmax cross-entropy over the vocabulary: fp32 exponentials, fp64 sums. */
#include <math.h>
#include <string.h>

#include "device/cpu.h"

double hs_xent_forward_backward(float *dlogits /* N,V */, const float *logits /* N,V */,
                                const int32_t *targets /* N */, int64_t N, int V, float scale,
                                int64_t *valid) {
    double total = 0.0;
    int64_t used = 0;
    for (int64_t n = 0; n < N; n++) {
        const float *l = logits + n * V;
        float *d = dlogits ? dlogits + n * V : NULL;
        int32_t tgt = targets[n];
        if (tgt < 0) {
            if (d) memset(d, 0, (size_t)V * sizeof(float));
            continue;
        }
        float mx = hs_row_max(l, V), lt = l[tgt];
        double sum = 0.0;
        if (d) {
            /* d may alias l: each exponential replaces the logit it came from. */
            for (int i = 0; i < V; i++) d[i] = hs_expf(l[i] - mx); /* vectorises */
            sum = hs_row_sum(d, V);
            float k = (float)(scale / sum);
            for (int i = 0; i < V; i++) d[i] *= k;
            d[tgt] -= scale;
        } else {
            for (int i = 0; i < V; i++) sum += hs_expf(l[i] - mx);
        }
        total += (double)mx + log(sum) - (double)lt;
        used++;
    }
    if (valid) *valid = used;
    return total;
}

void hs_cpu_xent(hs_stream *s, double *loss, int64_t *valid, float *dlogits, const float *logits,
                 const int32_t *targets, int64_t N, int V, float scale) {
    *loss = hs_xent_forward_backward(dlogits, logits, targets, N, V, scale, valid);
}
