/* The plan as a table a person reads, as one JSON object, and the fit
 * check train runs before it allocates (train.h). */
#include <string.h>

#include "hypershard/train.h"

static const char *human(int64_t b, char *buf, size_t cap) {
    double v = (double)b;
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int k = 0;
    while (v >= 1024.0 && k < 5) v /= 1024.0, k++;
    if (k == 0) snprintf(buf, cap, "%lld B", (long long)b);
    else snprintf(buf, cap, "%.1f %s", v, unit[k]);
    return buf;
}

static const char *const item_help[HS_PLAN_ITEM_COUNT] = {"fp32 masters (sharded)",
                                                          "fp32 gradients (sharded)",
                                                          "param_dtype copy (fp32_main_params)",
                                                          "optimizer state",
                                                          "reduce output slots",
                                                          "activations + scratch",
                                                          "unsharded params at the peak",
                                                          "unsharded grads at the peak",
                                                          "checkpoint.async snapshot staging",
                                                          "cuda kernels' scratch (a bound)"};

void hs_plan_print(const hs_plan *p, const hs_config *cfg, FILE *f) {
    char a[32], b[32], c[32];
    fprintf(f, "plan: world %d, engine %s, %d micro-batch%s of %d x %d tokens per rank\n", p->world,
            p->engine, p->micro_batches, p->micro_batches == 1 ? "" : "es",
            cfg->train.micro_batch_size, cfg->train.seq_len);
    const hs_topology *t = p->topo;
    fprintf(f, "layout: pp %d x dp %d x cp %d x tp %d; FSDP shard %d x replicate %d", t->pp, t->dp,
            t->cp, t->tp, t->dp_shard, t->dp_replicate);
    if (t->ep > 1)
        fprintf(f, "; experts ep %d, shard %d x replicate %d", t->ep, t->edp_shard,
                t->edp_replicate);
    fputc('\n', f);
    fprintf(f, "model: %lld parameters (%s fp32)\n", (long long)p->total_params,
            human(p->total_params * 4, a, sizeof a));
    for (int r = 0; r < p->n_roles; r++) {
        const hs_plan_role *ro = &p->roles[r];
        fprintf(f, "\n%s: %d rank%s from rank %d, %d block%s\n", ro->name, ro->n_ranks,
                ro->n_ranks == 1 ? "" : "s", ro->first_rank, ro->n_blocks,
                ro->n_blocks == 1 ? "" : "s");
        fprintf(f, "  %-16s %12s %12s  %s\n", "memory per rank", "device", "host", "");
        for (int i = 0; i < HS_PLAN_ITEM_COUNT; i++) {
            if (!ro->device[i] && !ro->host[i]) continue;
            fprintf(f, "  %-16s %12s %12s  %s\n", hs_plan_item_name((hs_plan_item)i),
                    human(ro->device[i], a, sizeof a), human(ro->host[i], b, sizeof b),
                    item_help[i]);
        }
        fprintf(f, "  %-16s %12s %12s\n", "peak", human(ro->peak_device_bytes, a, sizeof a),
                human(ro->peak_host_bytes, b, sizeof b));
        if (ro->sample_kv_bytes > 0)
            fprintf(f,
                    "  end-of-run sample: a KV cache of %s beside the above, after the last step\n",
                    human(ro->sample_kv_bytes, a, sizeof a));
        fprintf(f, "  activations with train.activation_checkpointing=%s: %s\n",
                cfg->train.activation_checkpointing == HS_AC_FULL ? "false" : "true",
                human(ro->activations_other, a, sizeof a));
        bool links = p->ranks_per_node > 0;
        fprintf(f, "  %-20s %12s %8s", "comm per step", "bytes", "calls");
        if (links)
            fprintf(f, " %14s %14s  (sent by the %d ranks, %d a node)", "inside nodes",
                    "across nodes", ro->n_ranks, p->ranks_per_node);
        fputc('\n', f);
        for (int k = 0; k < HS_PLAN_COMM_COUNT; k++) {
            if (!ro->comm_calls[k]) continue;
            fprintf(f, "  %-20s %12s %8lld", hs_plan_comm_name((hs_plan_comm)k),
                    human(ro->comm_bytes[k], a, sizeof a), (long long)ro->comm_calls[k]);
            bool fsdp = k == HS_PLAN_AG || k == HS_PLAN_RS || k == HS_PLAN_AR ||
                        k == HS_PLAN_AG_SECONDARY;
            if (links && fsdp)
                fprintf(f, " %14s %14s", human(ro->sent[k][0], a, sizeof a),
                        human(ro->sent[k][1], b, sizeof b));
            fputc('\n', f);
        }
    }
    fprintf(f, "\nmax peak per rank: device %s, host %s; one checkpoint about %s\n",
            human(p->max_peak_device_bytes, a, sizeof a),
            human(p->max_peak_host_bytes, b, sizeof b), human(p->checkpoint_bytes, c, sizeof c));
}

static void json_items(hs_json *j, const char *key, const int64_t *v) {
    hs_json_key(j, key);
    hs_json_begin_object(j);
    for (int i = 0; i < HS_PLAN_ITEM_COUNT; i++)
        hs_json_kv_int(j, hs_plan_item_name((hs_plan_item)i), v[i]);
    hs_json_end_object(j);
}

void hs_plan_json(const hs_plan *p, FILE *f) {
    hs_json j;
    hs_json_init(&j, f);
    hs_json_begin_object(&j);
    hs_json_kv_int(&j, "world", p->world);
    hs_json_kv_string(&j, "engine", p->engine);
    hs_json_kv_int(&j, "micro_batches", p->micro_batches);
    hs_json_kv_int(&j, "total_params", p->total_params);
    hs_json_kv_int(&j, "checkpoint_bytes", p->checkpoint_bytes);
    if (p->ranks_per_node > 0) hs_json_kv_int(&j, "ranks_per_node", p->ranks_per_node);
    hs_json_kv_int(&j, "max_peak_device_bytes", p->max_peak_device_bytes);
    hs_json_kv_int(&j, "max_peak_host_bytes", p->max_peak_host_bytes);
    hs_json_key(&j, "ranks");
    hs_json_begin_array(&j);
    for (int r = 0; r < p->n_roles; r++) {
        const hs_plan_role *ro = &p->roles[r];
        hs_json_begin_object(&j);
        hs_json_kv_string(&j, "role", ro->name);
        hs_json_kv_int(&j, "n_ranks", ro->n_ranks);
        hs_json_kv_int(&j, "first_rank", ro->first_rank);
        hs_json_kv_int(&j, "blocks", ro->n_blocks);
        hs_json_kv_int(&j, "peak_device_bytes", ro->peak_device_bytes);
        hs_json_kv_int(&j, "peak_host_bytes", ro->peak_host_bytes);
        json_items(&j, "device", ro->device);
        json_items(&j, "host", ro->host);
        hs_json_kv_int(&j, "activations_other_checkpointing", ro->activations_other);
        hs_json_kv_int(&j, "sample_kv_cache_bytes", ro->sample_kv_bytes);
        hs_json_key(&j, "comm");
        hs_json_begin_object(&j);
        for (int k = 0; k < HS_PLAN_COMM_COUNT; k++) {
            hs_json_key(&j, hs_plan_comm_name((hs_plan_comm)k));
            hs_json_begin_object(&j);
            hs_json_kv_int(&j, "bytes", ro->comm_bytes[k]);
            hs_json_kv_int(&j, "calls", ro->comm_calls[k]);
            if (p->ranks_per_node > 0) { /* summed over the role's ranks */
                hs_json_kv_int(&j, "sent_intra", ro->sent[k][0]);
                hs_json_kv_int(&j, "sent_inter", ro->sent[k][1]);
            }
            hs_json_end_object(&j);
        }
        hs_json_end_object(&j);
        hs_json_end_object(&j);
    }
    hs_json_end_array(&j);
    hs_json_end_object(&j);
    fputc('\n', f);
}

hs_status hs_plan_check_fit(const hs_plan *p, const hs_config *cfg, int ranks_per_node,
                            int64_t avail_bytes, hs_error *e) {
    /* A node's need beyond int64 does not fit any memory: it sticks at INT64_MAX. */
    hs_checked ck = {0};
    bool gpu = strcmp(cfg->accelerator.device, "cuda") == 0;
    int64_t per_rank = gpu ? p->max_peak_host_bytes
                           : hs_ck_add(&ck, p->max_peak_device_bytes, p->max_peak_host_bytes);
    int64_t need = hs_ck_mul(&ck, per_rank, ranks_per_node);
    if (avail_bytes <= 0 || need <= avail_bytes) return HS_OK;
    const hs_plan_role *worst = &p->roles[0];
    for (int r = 1; r < p->n_roles; r++)
        if ((gpu ? p->roles[r].peak_host_bytes > worst->peak_host_bytes
                 : p->roles[r].peak_device_bytes > worst->peak_device_bytes))
            worst = &p->roles[r];
    /* The three biggest items of the busiest role. */
    int64_t v[HS_PLAN_ITEM_COUNT];
    for (int i = 0; i < HS_PLAN_ITEM_COUNT; i++)
        v[i] = (gpu ? 0 : worst->device[i]) + worst->host[i];
    char items[256] = "", a[32], b[32], c[32];
    size_t used = 0;
    for (int n = 0; n < 3; n++) {
        int best = -1;
        for (int i = 0; i < HS_PLAN_ITEM_COUNT; i++)
            if (v[i] > 0 && (best < 0 || v[i] > v[best])) best = i;
        if (best < 0) break;
        int k = snprintf(items + used, sizeof items - used, "%s%s %s", n ? ", " : "",
                         hs_plan_item_name((hs_plan_item)best), human(v[best], c, sizeof c));
        if (k > 0 && (size_t)k < sizeof items - used) used += (size_t)k;
        v[best] = 0;
    }
    return hs_error_set(
        e, HS_ERR_CONFIG,
        "the plan needs %s%s per rank x %d rank%s on this node = %s, and %s is available "
        "(largest: %s, for %s). Make it fit: more ranks or nodes, fsdp_config.dp_shard_size "
        "(shards params, grads and optimizer state), train.activation_checkpointing: true%s, "
        "fsdp_config.mix_precision.param_dtype: bfloat16, fsdp_config.enable_offload: true, "
        "%sa smaller train.micro_batch_size or model; `hypershard plan` shows the items",
        human(per_rank, a, sizeof a), gpu ? " of host memory" : "", ranks_per_node,
        ranks_per_node == 1 ? "" : "s", human(need, b, sizeof b), human(avail_bytes, c, sizeof c),
        items, worst->name,
        cfg->train.activation_checkpointing == HS_AC_FULL ? " (already on)" : "",
        worst->host[HS_PLAN_CKPT_STAGING] ? "checkpoint.async: false (no snapshot staging), " : "");
}

void hs_plan_time_print(const hs_plan_time *t, FILE *f) {
    fprintf(f, "time: %.4g s a step, %.4g tokens/s, MFU %.1f%% of %.4g TFLOP/s a device\n",
            t->step_s, t->tokens_per_s, 100 * t->mfu, t->peak_flops / 1e12);
    fprintf(f, "  compute             %10.4g s\n", t->compute_s);
    fprintf(f, "  exposed fsdp        %10.4g s\n", t->exposed_fsdp_s);
    for (int k = HS_PLAN_TP; k <= HS_PLAN_PP; k++)
        if (t->exposed_s[k] > 0)
            fprintf(f, "  exposed %-11s %10.4g s%s\n", hs_plan_comm_name((hs_plan_comm)k),
                    t->exposed_s[k], k == HS_PLAN_PP ? " (hand-overs, inside the bubble)" : "");
    if (t->bubble > 0)
        fprintf(f, "  pipeline bubble     %9.1f%% of the stages' time\n", 100 * t->bubble);
    fprintf(f, "  optimizer           %10.4g s\n", t->optimizer_s);
    fprintf(f, "  %d ranks a node, %.4g GB of device memory a rank: %s\n", t->ranks_per_node,
            t->memory_per_rank / 1e9, t->fits ? "the peak fits" : "the peak does NOT fit");
}

void hs_plan_time_json(const hs_plan_time *t, FILE *f) {
    hs_json j;
    hs_json_init(&j, f);
    hs_json_begin_object(&j);
    hs_json_kv_double(&j, "step_time_s", t->step_s, 6);
    hs_json_kv_double(&j, "tokens_per_s", t->tokens_per_s, 6);
    hs_json_kv_double(&j, "mfu", t->mfu, 4);
    hs_json_kv_double(&j, "model_flops", t->model_flops, 6);
    hs_json_kv_double(&j, "peak_flops", t->peak_flops, 6);
    hs_json_kv_double(&j, "compute_s", t->compute_s, 6);
    hs_json_kv_double(&j, "exposed_fsdp_s", t->exposed_fsdp_s, 6);
    hs_json_key(&j, "exposed_s");
    hs_json_begin_object(&j);
    for (int k = HS_PLAN_TP; k <= HS_PLAN_PP; k++)
        hs_json_kv_double(&j, hs_plan_comm_name((hs_plan_comm)k), t->exposed_s[k], 6);
    hs_json_end_object(&j);
    hs_json_kv_double(&j, "bubble", t->bubble, 4);
    hs_json_kv_double(&j, "optimizer_s", t->optimizer_s, 6);
    hs_json_kv_int(&j, "ranks_per_node", t->ranks_per_node);
    hs_json_kv_double(&j, "memory_per_rank", t->memory_per_rank, 6);
    hs_json_kv_bool(&j, "fits", t->fits);
    hs_json_kv_int(&j, "tokens_per_step", t->tokens_per_step);
    hs_json_end_object(&j);
    fputc('\n', f);
}
