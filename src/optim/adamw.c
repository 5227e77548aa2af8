/* AdamW with torch.optim.AdamW semantics (non-amsgrad, non-fused):
 *
 *   p      *= 1 - lr * wd                 (decoupled; skipped when !decay)
 *   m       = beta1 * m + (1 - beta1) * g
 *   v       = beta2 * v + (1 - beta2) * g^2
 *   denom   = sqrt(v) / sqrt(1 - beta2^t) + eps
 *   p      -= lr / (1 - beta1^t) * m / denom
 *
 * The per-step scalars are formed in double and used in fp32, which is what
 * torch's single-tensor path does with its Python-float coefficients. */
#include <math.h>

#include "optim/optim_impl.h"

adamw_coef hs_adamw_coef(const hs_optim_config *cfg, int64_t step, double lr, bool decay) {
    double b1 = cfg->betas[0], b2 = cfg->betas[1];
    double bc1 = 1.0 - pow(b1, (double)step);
    double bc2 = 1.0 - pow(b2, (double)step);
    adamw_coef c = {
        .beta1 = (float)b1,
        .beta2 = (float)b2,
        .one_minus_beta1 = (float)(1.0 - b1),
        .one_minus_beta2 = (float)(1.0 - b2),
        .step_size = (float)(lr / bc1),
        .bias2_sqrt = (float)sqrt(bc2),
        .eps = (float)cfg->eps,
        .decay_factor = decay ? (float)(1.0 - lr * cfg->weight_decay) : 1.0f,
    };
    return c;
}
