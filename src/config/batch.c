/* The batch arithmetic the rules and the trainer share: the global batch
 * (its null default resolved) and the micro-batches per step. */
#include "hypershard/config.h"

long long hs_config_global_batch(const hs_config *c, const hs_topology *topo) {
    if (c->train.global_batch_size > 0) return c->train.global_batch_size;
    /* A pipeline needs a micro-batch per stage in flight: null gives one
     * per stage, so the minimal config runs under 1f1b too. */
    int pp = c->accelerator.pp_size > 1 ? c->accelerator.pp_size : 1;
    return (long long)c->train.micro_batch_size * topo->dp * pp;
}

int hs_config_micro_batches(const hs_config *c, const hs_topology *topo) {
    long long denom = (long long)c->train.micro_batch_size * topo->dp;
    return denom > 0 ? (int)(hs_config_global_batch(c, topo) / denom) : 0;
}
