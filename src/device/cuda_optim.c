/* The cuda backend's optimizer entries: AdamW's and Muon's element updates
 * over the launchers of cuda_optim.cu, the per-step scalars read from the
 * host struct here and passed by value. */
#include <stdlib.h>

#include "device/cuda.h"
#include "device/cuda_optim_launch.h"

static hs_cu_adamw_scalars scalars_of(const hs_adamw_hparams *h) {
    return (hs_cu_adamw_scalars){.beta1 = h->beta1,
                                 .beta2 = h->beta2,
                                 .one_minus_beta1 = h->one_minus_beta1,
                                 .one_minus_beta2 = h->one_minus_beta2,
                                 .step_size = h->step_size,
                                 .bias2_sqrt = h->bias2_sqrt,
                                 .eps = h->eps,
                                 .decay_factor = h->decay_factor};
}

void hs_cuda_adamw(hs_stream *s, void *p, hs_dtype pdt, float *m, float *v, const float *g,
                   const hs_adamw_hparams *h, int64_t n) {
    hs_cuda_check(s, hs_cu_adamw(hs_cuda_stream(s), p, (int)pdt, m, v, g, scalars_of(h), n),
                  "adamw");
}

/* One launch for every tensor; the descriptors go to the device through
 * a copy of a host array freed only once the stream has passed it. */
void hs_cuda_adamw_many(hs_stream *s, const hs_adamw_tensor *t, int count,
                        const hs_adamw_hparams *h) {
    if (count <= 0) return;
    size_t bytes = (size_t)count * sizeof(hs_cu_adamw_item);
    hs_cu_adamw_item *dev = hs_cuda_scratch(s, bytes, "adamw_many's tensor table");
    if (dev == NULL) return;
    hs_cu_adamw_item *host = malloc(bytes);
    if (host == NULL) {
        hs_kernel_oom(s, "adamw_many: %zu bytes of host staging", bytes);
        hs_cuda_scratch_free(s, dev);
        return;
    }
    for (int i = 0; i < count; i++)
        host[i] = (hs_cu_adamw_item){.p = t[i].p,
                                     .m = t[i].m,
                                     .v = t[i].v,
                                     .g = t[i].g,
                                     .copy = t[i].copy,
                                     .n = t[i].n,
                                     .decay_factor = t[i].decay_factor,
                                     .pdt = (int)t[i].pdt,
                                     .copy_dt = (int)t[i].copy_dt};
    cudaStream_t st = hs_cuda_stream(s);
    hs_cuda_check(s, hs_cu_adamw_many(st, dev, host, count, scalars_of(h)), "adamw_many");
    /* the table's host copy is read by the copy engine until st passes it */
    hs_cuda_check(s, cudaStreamSynchronize(st), "adamw_many's wait");
    free(host);
    hs_cuda_scratch_free(s, dev);
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
