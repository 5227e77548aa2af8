/* The cuda backend's optimizer entries: AdamW's and Muon's element updates
 * over the launchers of cuda_optim.cu, the per-step scalars read from the
 * host struct here and passed by value. */
#include "device/cuda.h"
#include "device/cuda_optim_launch.h"

void hs_cuda_adamw(hs_stream *s, void *p, hs_dtype pdt, float *m, float *v, const float *g,
                   const hs_adamw_hparams *h, int64_t n) {
    hs_cu_adamw_scalars a = {.beta1 = h->beta1,
                             .beta2 = h->beta2,
                             .one_minus_beta1 = h->one_minus_beta1,
                             .one_minus_beta2 = h->one_minus_beta2,
                             .step_size = h->step_size,
                             .bias2_sqrt = h->bias2_sqrt,
                             .eps = h->eps,
                             .decay_factor = h->decay_factor};
    hs_cuda_check(s, hs_cu_adamw(hs_cuda_stream(s), p, (int)pdt, m, v, g, a, n), "adamw");
}

void hs_cuda_muon_momentum(hs_stream *s, float *dir, float *buf, const float *g, float mu,
                           bool nesterov, int64_t n) {
    hs_cuda_check(s, hs_cu_muon_momentum(hs_cuda_stream(s), dir, buf, g, mu, nesterov, n),
                  "muon_momentum");
}

void hs_cuda_muon_update(hs_stream *s, void *p, hs_dtype pdt, const float *u, float decay_factor,
                         float step, int64_t n) {
    hs_cuda_check(s, hs_cu_muon_update(hs_cuda_stream(s), p, (int)pdt, u, decay_factor, step, n),
                  "muon_update");
}
