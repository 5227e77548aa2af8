/* Shared set-up of the single-process FSDP tests: a tiny model wrapped with
 * every data-parallel group of size 1 (no collective is ever issued), and
 * the same model allocated the single-process way as the reference. */
#ifndef TESTS_UNIT_FSDP_FIXTURE_H
#define TESTS_UNIT_FSDP_FIXTURE_H

#include <stdlib.h>
#include <string.h>

#include "fsdp/manager.h"
#include "hypershard/config.h"
#include "hypershard/device.h"
#include "hypershard/model.h"

#define FX_B 2
#define FX_T 8

static inline void fx_config(hs_config *cfg) {
    hs_config_defaults(cfg, NULL);
    cfg->model.vocab_size = 37; /* odd on purpose: uneven over most W */
    cfg->model.dim = 16;
    cfg->model.n_layers = 2;
    cfg->model.n_heads = 2;
    cfg->model.n_kv_heads = 1;
    cfg->model.ffn_dim = 24;
    cfg->fsdp.forward_prefetch_depth = 0;
    cfg->fsdp.backward_prefetch_depth = 0;
}

static inline hs_model *fx_model(const hs_config *cfg, hs_device *dev, bool allocate,
                                 hs_dtype compute, bool ckpt) {
    hs_model_options mo = {
        .compute_dtype = compute,
        .grad_dtype = compute,
        .max_batch = FX_B,
        .seq_len = FX_T,
        .activation_checkpointing = ckpt,
        .allocate_params = allocate,
        .dev = dev,
    };
    hs_model *m = NULL;
    hs_error e;
    hs_error_clear(&e);
    if (hs_model_create(&cfg->model, &mo, &m, &e) != HS_OK) hs_panic("model: %s", e.msg);
    return m;
}

static inline hs_fsdp *fx_wrap(const hs_config *cfg, hs_device *dev, hs_model *m, uint64_t seed) {
    hs_fsdp_dp_groups g;
    memset(&g, 0, sizeof g);
    g.shard_size = g.replicate_size = g.flat_size = 1;
    hs_fsdp *f = NULL;
    hs_error e;
    hs_error_clear(&e);
    if (hs_fsdp_wrap_groups(&cfg->fsdp, cfg->optimizer.fp32_main_params, &g, NULL, dev, m, seed,
                            NULL, &f, &e) != HS_OK)
        hs_panic("wrap: %s", e.msg);
    return f;
}

static inline hs_device *fx_device(void) {
    hs_device *d = NULL;
    hs_error e;
    hs_error_clear(&e);
    if (hs_device_create(HS_DEVICE_CPU, NULL, &d, &e) != HS_OK) hs_panic("device: %s", e.msg);
    return d;
}

/* Deterministic tokens and next-token targets. */
static inline void fx_batch(int32_t *tok, int32_t *tgt, int V, int salt) {
    for (int i = 0; i < FX_B * FX_T; i++) {
        tok[i] = (int32_t)((i * 7 + salt * 13 + 3) % V);
        tgt[i] = (int32_t)((i * 5 + salt * 11 + 1) % V);
    }
}

#endif
