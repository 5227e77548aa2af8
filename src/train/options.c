/* What the engine's model is created with: whether the FSDP engine holds
 * the parameters, and the model options (dtypes at the unit boundaries,
 * capacity, stage) that follow from the config. */
#include "train/engines.h"

/* Mixed precision, offload and fp32 main params need the FSDP engine's
 * storage even on one process (its groups are then all of size 1). */
static bool wants_policies(const hs_config *cfg) {
    int pd = cfg->fsdp.mix_precision.param_dtype, od = cfg->fsdp.mix_precision.output_dtype;
    return (pd != HS_MP_NULL && pd != HS_DTYPE_F32) || (od != HS_MP_NULL && od != HS_DTYPE_F32) ||
           cfg->fsdp.enable_offload || cfg->optimizer.fp32_main_params;
}

bool hs_engine_uses_fsdp(const hs_config *cfg, const hs_topology *topo) {
    /* train.reproducibility: layout keeps its micro-batch trees in FSDP's
     * sharded gradients, one process included */
    return topo->pp > 1 || hs_topology_fsdp_active(topo, NULL, 0) || topo->tp > 1 || topo->ep > 1 ||
           wants_policies(cfg) || hs_train_layout_invariant(&cfg->train);
}

/* A zero-bubble pipeline schedule: the stage's backwards come in two. */
static bool splits_backward(const hs_config *cfg) {
    hs_pp_schedule_kind kind;
    return cfg->accelerator.pp_size > 1 &&
           hs_pp_schedule_parse(cfg->accelerator.pp_schedule, &kind) && hs_pp_schedule_splits(kind);
}

hs_model_options hs_engine_model_options(const hs_config *cfg, bool fsdp, int max_batch,
                                         hs_model_stage stage, int act_slots) {
    const hs_mix_precision *mp = &cfg->fsdp.mix_precision;
    int pd = mp->param_dtype, od = mp->output_dtype;
    hs_dtype compute = fsdp && pd != HS_MP_NULL ? (hs_dtype)pd : HS_DTYPE_F32;
    hs_model_options mo = {
        .compute_dtype = compute,
        /* layout-invariant training keeps unsharded gradients in fp32: a
         * 16-bit one would round where the micro-batch ends, which the
         * layout decides */
        .grad_dtype = hs_train_layout_invariant(&cfg->train) ? HS_DTYPE_F32 : compute,
        .max_batch = max_batch,
        .seq_len = cfg->train.seq_len,
        .activation_checkpointing = cfg->train.activation_checkpointing,
        .allocate_params = !fsdp, /* one process: the model owns data and grads */
        .stage = stage,
        .act_slots = act_slots,
        .split_backward = splits_backward(cfg),
        .document_masking = cfg->data.document_masking,
        /* the threads this process computes with (train.threads, else the
         * OpenMP team: cmd_train balances it over the node's ranks) */
        .threads = cfg->train.threads > 0 ? cfg->train.threads : hs_blas_get_threads(),
        .canonical_sums = hs_train_layout_invariant(&cfg->train),
    };
    if (fsdp) {
        /* Unit boundaries as FSDP2 places them (docs/fsdp-policies.md):
         * outputs cast when output_dtype is set; inputs cast to param_dtype
         * only when it is set and cast_forward_inputs is on. */
        mo.cast_unit_outputs = od != HS_MP_NULL;
        mo.unit_output_dtype = od != HS_MP_NULL ? (hs_dtype)od : compute;
        mo.keep_unit_inputs = pd == HS_MP_NULL || !mp->cast_forward_inputs;
    }
    return mo;
}
