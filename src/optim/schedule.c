/* Learning-rate schedule: linear warmup, then constant / linear / cosine
 * decay to lr * min_lr_ratio at the last step (docs/optimizers.md). */
#include <math.h>
#include <string.h>

#include "optim/optim_impl.h"

double hs_lr_at(const hs_optim_config *cfg, int step, int total) {
    const hs_schedule_config *s = &cfg->schedule;
    double lr = cfg->lr, min_lr = cfg->lr * s->min_lr_ratio;
    int warmup = s->warmup_steps > 0 ? s->warmup_steps : 0;
    if (step < 1) step = 1;
    if (step <= warmup) return lr * (double)step / (double)warmup;
    if (strcmp(s->decay, "constant") == 0) return lr;
    /* Fraction of the decay phase done: 0 at the end of warmup, 1 at `total`. */
    double progress = total > warmup ? (double)(step - warmup) / (double)(total - warmup) : 1.0;
    if (progress > 1.0) progress = 1.0;
    if (strcmp(s->decay, "linear") == 0) return lr - (lr - min_lr) * progress;
    if (strcmp(s->decay, "cosine") == 0)
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + cos(M_PI * progress));
    hs_panic("optimizer.schedule.decay '%s' reached hs_lr_at unvalidated; use constant, linear "
             "or cosine",
             s->decay);
}
