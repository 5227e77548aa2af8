/* bench/bench_engine.h — what the benchmarks that drive an engine share
 * (bench_step.c, bench_layouts.c, bench_pp.c, through the engine calls of
 * hypershard/train.h): a random batch and one optimizer step as the
 * trainer runs it. */
#ifndef HS_BENCH_ENGINE_H
#define HS_BENCH_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "hypershard/device.h"
#include "hypershard/optim.h"
#include "hypershard/train.h"

/* Random tokens and targets in [0, vocab): speed does not depend on the
 * text. Ranks that must see the same batch pass the same seed. */
static inline void hs_bench_random_batch(int32_t *tokens, int32_t *targets, size_t n, int vocab,
                                         uint64_t seed) {
    uint64_t x = seed;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        tokens[i] = (int32_t)((x >> 33) % (uint64_t)vocab);
        targets[i] = (int32_t)((x >> 13) % (uint64_t)vocab);
    }
}

/* One optimizer step of one micro-batch as src/train/step.c runs it:
 * forward + backward, grad norm, clipping, the update, after_step, zeroed
 * gradients. *t_fb gets the forward + backward seconds (may be NULL).
 * With a device profile (bench step --breakdown) the part after backward
 * is the optimizer's phase. */
static inline hs_status hs_bench_engine_step(hs_engine *en, hs_optim *optim, hs_optim_param *params,
                                             int n_params, const hs_optim_config *oc,
                                             const hs_batch *b, float grad_scale, double *t_fb,
                                             hs_error *e) {
    double t0 = hs_now(), loss = 0.0, aux = 0.0, norm = 0.0;
    hs_engine_begin_micro_batch(en, true, true, true);
    hs_status s = hs_model_forward_backward(hs_engine_model(en), b, grad_scale, hs_engine_hooks(en),
                                            &loss, &aux, e);
    if (t_fb) *t_fb = hs_now() - t0;
    hs_device *d = hs_model_device(hs_engine_model(en));
    hs_device_profile_set_phase(d, HS_PROF_OPTIMIZER); /* nothing without a profile */
    if (s == HS_OK) s = hs_engine_grad_norm(en, &norm, e);
    if (s == HS_OK) {
        hs_clip_grads(d, params, n_params, norm, oc->clip_grad_norm);
        s = hs_optim_step(optim, oc->lr, e);
        if (s == HS_OK) s = hs_engine_after_step(en, e);
        hs_engine_zero_grads(en);
    }
    hs_device_profile_set_phase(d, -1);
    return s;
}

#endif
