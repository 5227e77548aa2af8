/* Global gradient-norm clipping with torch.nn.utils.clip_grad_norm_
 * semantics: coef = max_norm / (norm + 1e-6), clamped to at most 1. A NaN
 * norm gives a NaN coefficient, as in torch (error_if_nonfinite=False), so
 * a broken step is visible instead of silently unclipped. */
#include <math.h>

#include "optim/optim_impl.h"

/* The trained gradients' sums of squares by sumsq_many, NORM_CHUNK a call
 * (a GPU waits once per call, not once per parameter), added in parameter
 * order. */
double hs_grad_sumsq(hs_device *dev, const hs_optim_param *params, int n) {
    enum { NORM_CHUNK = 256 };
    const float *x[NORM_CHUNK];
    int64_t len[NORM_CHUNK];
    double part[NORM_CHUNK], s = 0.0;
    for (int i = 0; i < n;) {
        int m = 0;
        for (; i < n && m < NORM_CHUNK; i++)
            if (params[i].numel > 0 && !params[i].frozen)
                x[m] = params[i].grad, len[m++] = params[i].numel;
        hs_dev_sumsq_many(dev, part, x, len, m);
        for (int k = 0; k < m; k++) s += part[k];
    }
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
