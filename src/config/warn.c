/* Spec 004 §4.2: settings that are legal but can have no observable effect
 * in this configuration. Each gets one warning naming the key, its value and
 * the missing precondition; a key still at its default is never mentioned. */
#include <string.h>

#include "config/checks.h"

static bool differs(const hs_config *c, const hs_config *d, const char *path) {
    const hs_cfg_key *k = hs_cfg_key_find(path);
    HS_ASSERT(k);
    if (k->type == HS_CFG_STRLIST)
        return *(const int *)((const char *)c + k->count_offset) !=
               *(const int *)((const char *)d + k->count_offset);
    if (k->type == HS_CFG_INTLIST) {
        int n = *(const int *)((const char *)c + k->count_offset);
        return n != *(const int *)((const char *)d + k->count_offset) ||
               memcmp(hs_cfg_cfield(c, k), hs_cfg_cfield(d, k), sizeof(int) * (size_t)n) != 0;
    }
    if (k->type == HS_CFG_STRING || k->type == HS_CFG_ENUM)
        return strcmp(hs_cfg_cfield(c, k), hs_cfg_cfield(d, k)) != 0;
    return memcmp(hs_cfg_cfield(c, k), hs_cfg_cfield(d, k), k->size) != 0;
}

/* Every key under `section` that differs from the default, comma-separated. */
static bool changed_under(const hs_config *c, const hs_config *d, const char *section, char *out,
                          size_t cap) {
    int n;
    const hs_cfg_key *keys = hs_cfg_keys(&n);
    size_t len = strlen(section), used = 0;
    out[0] = '\0';
    for (int i = 0; i < n && used < cap; i++)
        if (!strncmp(keys[i].path, section, len) && keys[i].path[len] == '.' &&
            differs(c, d, keys[i].path))
            used +=
                (size_t)snprintf(out + used, cap - used, "%s%s", used ? ", " : "", keys[i].path);
    return used > 0;
}

/* Those of `keys` that differ from the default, comma-separated. */
static bool changed_among(const hs_config *c, const hs_config *d, const char *const *keys, size_t n,
                          char *out, size_t cap) {
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && used < cap; i++)
        if (differs(c, d, keys[i]))
            used += (size_t)snprintf(out + used, cap - used, "%s%s", used ? ", " : "", keys[i]);
    return used > 0;
}

/* The verb for a list of one or more keys. */
static const char *has_have(const char *list) { return strchr(list, ',') ? "have" : "has"; }

static void warn_fsdp(const hs_config *c, const hs_topology *t, const hs_log *log) {
    const hs_fsdp_config *f = &c->fsdp;
    bool moe = hs_model_arch_moe(&c->model);
    if (f->edp_shard_size != 1 && !(t->ep > 1 && moe))
        hs_log_warn(log,
                    "fsdp_config.edp_shard_size = %d has no effect: it needs "
                    "accelerator.ep_size > 1 (got %d) and a model with routed experts "
                    "(model.arch = %s)",
                    f->edp_shard_size, t->ep, c->model.arch);
    if (!f->mix_precision.cast_forward_inputs && f->mix_precision.param_dtype == HS_MP_NULL)
        hs_log_warn(log, "fsdp_config.mix_precision.cast_forward_inputs = false has no effect: "
                         "it needs fsdp_config.mix_precision.param_dtype to be set (got null)");
    const struct {
        const char *key, *value, *what;
    } wires[] = {{"param_gather", f->param_gather, "nothing is all-gathered"},
                 {"grad_reduce", f->grad_reduce, "no gradient is reduce-scattered"}};
    for (size_t i = 0; i < sizeof wires / sizeof wires[0]; i++)
        if (wires[i].value[0] && t->dp_shard == 1 && t->edp_shard == 1)
            hs_log_warn(log,
                        "fsdp_config.%s = %s has no effect: no parameter is sharded "
                        "(fsdp_config.dp_shard_size = 1, edp_shard_size = 1), so %s",
                        wires[i].key, wires[i].value, wires[i].what);
    if (f->comm_fusion_zero_copy >= 0 && !f->comm_fusion)
        hs_log_warn(log,
                    "fsdp_config.comm_fusion_zero_copy = %s has no effect: it needs "
                    "fsdp_config.comm_fusion = true",
                    f->comm_fusion_zero_copy ? "true" : "false");
    if (hs_config_micro_batches(c, t) == 1) {
        if (!f->reshard_after_backward)
            hs_log_warn(log,
                        "fsdp_config.reshard_after_backward = false has no effect: a step "
                        "has one micro-batch (train.global_batch_size = %lld = "
                        "micro_batch_size %d x dp_size %d), and the last one always reshards",
                        hs_config_global_batch(c, t), c->train.micro_batch_size, t->dp);
        if (!f->requires_grad_sync)
            hs_log_warn(log,
                        "fsdp_config.requires_grad_sync = false has no effect: a step has "
                        "one micro-batch (train.global_batch_size = %lld = micro_batch_size "
                        "%d x dp_size %d), and the last one always syncs",
                        hs_config_global_batch(c, t), c->train.micro_batch_size, t->dp);
    }
}

/* With no FSDP domain the unit mechanics (not the dtypes, which the trainer
 * may still honour) cannot act. */
static void warn_fsdp_skipped(const hs_config *c, const hs_config *d, const hs_topology *t,
                              const hs_log *log) {
    static const char *const unit_keys[] = {
        "fsdp_config.replicate_params",        "fsdp_config.enable_offload",
        "fsdp_config.reshard_after_forward",   "fsdp_config.forward_prefetch_depth",
        "fsdp_config.backward_prefetch_depth", "fsdp_config.comm_fusion",
    };
    char why[256], list[512];
    if (hs_topology_fsdp_active(t, why, sizeof why)) return;
    if (changed_among(c, d, unit_keys, sizeof unit_keys / sizeof unit_keys[0], list, sizeof list))
        hs_log_warn(log, "%s %s no effect: FSDP2Manager is skipped (%s)", list, has_have(list),
                    why);
}

static void warn_trainer(const hs_config *c, const hs_config *d, const hs_topology *t,
                         const hs_log *log) {
    char list[1024];
    bool moe = hs_model_arch_moe(&c->model);
    if (!moe && changed_under(c, d, "model.moe", list, sizeof list))
        hs_log_warn(log, "%s: no effect with model.arch = %s (no routed experts)", list,
                    c->model.arch);
    if (t->cp == 1 && c->accelerator.cp_rotate_method[0])
        hs_log_warn(log,
                    "accelerator.cp_rotate_method = %s has no effect: it needs "
                    "accelerator.cp_size > 1",
                    c->accelerator.cp_rotate_method);
    if (c->accelerator.cp_a2a_size && strcmp(c->accelerator.cp_rotate_method, "alltoall_ring"))
        hs_log_warn(log,
                    "accelerator.cp_a2a_size = %d has no effect: it needs "
                    "accelerator.cp_rotate_method = alltoall_ring",
                    c->accelerator.cp_a2a_size);
    if (t->pp == 1 && strcmp(c->accelerator.pp_schedule, d->accelerator.pp_schedule))
        hs_log_warn(log,
                    "accelerator.pp_schedule = %s has no effect: it needs "
                    "accelerator.pp_size > 1",
                    c->accelerator.pp_schedule);
    if (t->tp == 1 && c->accelerator.sequence_parallel)
        hs_log_warn(log, "accelerator.sequence_parallel = true has no effect: it needs "
                         "accelerator.tp_size > 1");
    if (t->tp == 1 && c->accelerator.loss_parallel)
        hs_log_warn(log, "accelerator.loss_parallel = true has no effect: it needs "
                         "accelerator.tp_size > 1");
    if (strcmp(c->optimizer.target, "muon") &&
        changed_under(c, d, "optimizer.muon", list, sizeof list))
        hs_log_warn(log, "%s: no effect with optimizer._target_ = %s", list, c->optimizer.target);
    if (c->optimizer.schedule.warmup_steps >= c->train.steps)
        hs_log_warn(log,
                    "optimizer.schedule.warmup_steps = %d >= train.steps = %d: the learning "
                    "rate never reaches optimizer.lr",
                    c->optimizer.schedule.warmup_steps, c->train.steps);
    if (strcmp(c->data.source, "indexed") && c->data.eos_id >= 0 && !c->data.document_masking)
        hs_log_warn(log,
                    "data.eos_id = %d has no effect with data.source = %s (only indexed "
                    "datasets have document boundaries, or data.document_masking reads them)",
                    c->data.eos_id, c->data.source);
    if (!strcmp(c->data.source, "builtin") && c->data.path[0])
        hs_log_warn(log, "data.path = %s has no effect with data.source = builtin", c->data.path);
    if (!c->checkpoint.dir[0]) {
        static const char *const ckpt_keys[] = {"checkpoint.save_every", "checkpoint.keep_last",
                                                "checkpoint.async"};
        if (changed_among(c, d, ckpt_keys, sizeof ckpt_keys / sizeof ckpt_keys[0], list,
                          sizeof list))
            hs_log_warn(log, "%s %s no effect: checkpoint.dir is null (no checkpoints are written)",
                        list, has_have(list));
    }
    if (!c->trace.enabled && c->trace.dir[0])
        hs_log_warn(log, "trace.dir = %s has no effect: trace.enabled = false", c->trace.dir);
}

hs_status hs_cfg_warn(const hs_config *c, const hs_topology *t, const hs_log *log, hs_error *e) {
    if (!log) return HS_OK;
    hs_config d;
    hs_status st = hs_config_defaults(&d, e);
    if (st != HS_OK) return st;
    warn_fsdp(c, t, log);
    warn_fsdp_skipped(c, &d, t, log);
    warn_trainer(c, &d, t, log);
    hs_config_free(&d);
    return HS_OK;
}
