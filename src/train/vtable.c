/* The public calls of train.h on an engine: its vtable (engines.h), one
 * call each. */
#include "train/engines.h"

#include <math.h>

hs_model *hs_engine_catalog(const hs_engine *en) { return en->catalog ? en->catalog : en->model; }

void hs_engine_free(hs_engine *en) {
    if (en) en->free(en);
}

hs_model *hs_engine_model(hs_engine *en) { return en->model; }
const hs_model_hooks *hs_engine_hooks(hs_engine *en) { return en->hooks(en); }
int hs_engine_optim_params(hs_engine *en, hs_optim_param **out) {
    return en->optim_params(en, out);
}
void hs_engine_begin_micro_batch(hs_engine *en, bool sync, bool reshard, bool last) {
    en->begin_micro_batch(en, sync, reshard, last);
}
/* The root of the exact sum of squares where the engine has one
 * (train.reproducibility: layout), else the engine's own norm. */
hs_status hs_engine_grad_norm(hs_engine *en, double *norm, hs_error *e) {
    if (!en->grad_sumsq_exact) return en->grad_norm(en, norm, e);
    hs_xsum sum;
    hs_xsum_init(&sum);
    hs_status s = en->grad_sumsq_exact(en, &sum, e);
    *norm = sqrt(hs_xsum_value(&sum));
    return s;
}
hs_status hs_engine_after_step(hs_engine *en, hs_error *e) { return en->after_step(en, true, e); }
void hs_engine_zero_grads(hs_engine *en) { en->zero_grads(en); }
void hs_engine_begin_step(hs_engine *en) {
    if (en->begin_step) en->begin_step(en);
}
void hs_engine_drain(hs_engine *en) {
    if (en->drain) en->drain(en);
}
hs_parallel *hs_engine_parallel(hs_engine *en) { return en->parallel ? en->parallel(en) : NULL; }
double hs_engine_take_exposed(hs_engine *en) { return en->take_exposed ? en->take_exposed(en) : 0; }

hs_status hs_engine_get_param(void *ctx, int param_index, float *out, hs_error *e) {
    hs_engine *en = ctx;
    return en->gather_full(en, param_index, out, e);
}

hs_status hs_engine_set_param(void *ctx, int param_index, const float *full, hs_error *e) {
    hs_engine *en = ctx;
    return en->set_full(en, param_index, full, e);
}

bool hs_engine_borrow_param(void *ctx, int param_index, const float *full) {
    hs_engine *en = ctx;
    return en->borrow_full && en->borrow_full(en, param_index, full);
}
