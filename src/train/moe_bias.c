/* Aux-loss-free load balancing (DeepSeek-V3, model.moe.bias_update_speed):
 * after each step every MoE block's e_score_correction_bias moves by the
 * speed toward balance, b_e += speed * sign(mean load - load_e), from the
 * step's global loads (the rows each expert received over the whole
 * global batch: hs_step_result's expert_tokens, the same on every rank).
 * Each rank moves the elements it holds (a dim-0 shard under FSDP, the
 * whole bias otherwise) in its fp32 main copy and its 16-bit compute copy,
 * so every layout computes the same bias. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/run.h"

#define BIAS_SUFFIX ".gate.e_score_correction_bias"

/* The block of "model.layers.{i}.<...>.gate.e_score_correction_bias", or
 * -1 for another parameter. */
static int bias_layer(const char *fqn) {
    size_t n = strlen(fqn), k = strlen(BIAS_SUFFIX);
    int layer = -1;
    if (n <= k || strcmp(fqn + n - k, BIAS_SUFFIX) != 0) return -1;
    return sscanf(fqn, "model.layers.%d.", &layer) == 1 ? layer : -1;
}

/* One parameter's elements, b_e += speed * sign(mean - load_e), on the
 * host: its main shard is device memory unless offload keeps it on the
 * host; the 16-bit copy takes the device's rounding, as the optimizer's. */
static hs_status move(hs_trainer *t, const hs_optim_param *o, const double *load, double mean,
                      float speed, hs_error *e) {
    const size_t bytes = (size_t)o->numel * sizeof(float);
    const bool host = t->cfg->fsdp.enable_offload;
    float *b = host ? o->data : malloc(bytes);
    if (!b) return hs_error_oom(e, "moe bias: %zu bytes of %s", bytes, o->fqn);
    if (!host) hs_device_copy(t->dev, b, o->data, bytes, HS_COPY_D2H);
    for (int64_t j = 0; j < o->numel; j++) {
        double d = mean - load[o->first + j];
        b[j] += d > 0 ? speed : d < 0 ? -speed : 0.0f;
    }
    if (!host) hs_device_copy(t->dev, o->data, b, bytes, HS_COPY_H2D), free(b);
    if (o->copy) hs_dev_convert(t->dev, o->copy, o->copy_dtype, o->data, HS_DTYPE_F32, o->numel);
    return HS_OK;
}

hs_status hs_moe_bias_update(hs_trainer *t, const double *loads, hs_error *e) {
    const hs_moe_config *x = &t->cfg->model.moe;
    const int E = x->num_experts, L = t->cfg->model.n_layers;
    hs_status s = HS_OK;
    for (int i = 0; i < t->n_oparams && s == HS_OK; i++) {
        const hs_optim_param *o = &t->oparams[i];
        int l = bias_layer(o->fqn);
        if (l < 0 || o->numel == 0) continue;
        HS_ASSERT(l < L && o->dtype == HS_DTYPE_F32 && o->first + o->numel <= E);
        const double *load = loads + (int64_t)l * E;
        double mean = 0.0;
        for (int k = 0; k < E; k++) mean += load[k];
        s = move(t, o, load, mean / E, (float)x->bias_update_speed, e);
    }
    return s;
}
