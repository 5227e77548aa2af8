/* Global gradient-norm clipping with torch.nn.utils.clip_grad_norm_
 * semantics: coef = max_norm / (norm + 1e-6), clamped to at most 1. A NaN
 * norm gives a NaN coefficient, as in torch (error_if_nonfinite=False), so
 * a broken step is visible instead of silently unclipped. */
#include <math.h>
#include <stdlib.h>

#include "optim/optim_impl.h"

/* One sumsq_many over every trained gradient (a GPU waits once), added in
 * parameter order. */
double hs_grad_sumsq(hs_device *dev, const hs_optim_param *params, int n) {
    const float **x = calloc((size_t)(n > 0 ? n : 1), sizeof *x);
    int64_t *len = calloc((size_t)(n > 0 ? n : 1), sizeof *len);
    double *part = malloc((size_t)(n > 0 ? n : 1) * sizeof *part);
    double s = 0.0;
    if (x == NULL || len == NULL || part == NULL) { /* one at a time, as the sums are the same */
        for (int i = 0; i < n; i++)
            if (params[i].numel > 0 && !params[i].frozen)
                s += hs_dev_sumsq(dev, params[i].grad, params[i].numel);
    } else {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (params[i].numel > 0 && !params[i].frozen)
                x[m] = params[i].grad, len[m++] = params[i].numel;
        hs_dev_sumsq_many(dev, part, x, len, m);
        for (int i = 0; i < m; i++) s += part[i];
    }
    free(x), free(len), free(part);
    return s;
}

double hs_clip_grads(hs_device *dev, hs_optim_param *params, int n, double norm, double max_norm) {
    if (max_norm <= 0.0) return 1.0;
    double coef = max_norm / (norm + 1e-6);
    if (!isnan(coef) && coef >= 1.0) return 1.0;
    for (int i = 0; i < n; i++) {
        if (params[i].numel <= 0 || params[i].frozen) continue;
        /* The optimizer only reads grads; clipping is the one writer, on
         * buffers the caller owns and handed over as mutable memory. */
        hs_dev_scale(dev, (float *)params[i].grad, (float)coef, params[i].numel);
    }
    return coef;
}
