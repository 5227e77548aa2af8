/* The layout search (train.h hs_plan_search): every layout of `world`
 * ranks the config rules accept for the model and global batch, planned
 * (memory) and timed (plan_time.c) on a cluster; those whose peak does not
 * fit are dropped, the rest ranked by step time.
 *
 * A layout is tp x cp (allgather or ring) x pp (1f1b, interleaved_1f1b
 * and zbv with two chunks a stage, zb1p) x the FSDP shard degree (the
 * whole data-parallel domain, or the ranks of one node) x ep (MoE: the
 * divisors of the experts) x micro-batch (1, 2, 4, 8) x activation
 * checkpointing (none; selective and full only where none does not fit:
 * recompute never makes a step shorter). tp is at most a node's ranks and
 * turns sequence parallelism on. gpipe is left out: 1f1b has its bubble
 * with less memory. */
#include <stdlib.h>
#include <string.h>

#include "hypershard/train.h"

#define MAX_KEYS 16

typedef struct search {
    const char *path;
    const char *const *base;
    int n_base;
    int world;
    long long global;
    const hs_cluster *cl;
    hs_plan_choice *best;
    int top, n_best;
    hs_plan *plan;
    hs_plan_search_counts *counts;
} search;

static bool divides(long long a, long long b) { return b > 0 && a % b == 0; }

/* Keeps the top K by step time. */
static void keep(search *s, const hs_plan_choice *c) {
    int at = s->n_best;
    while (at > 0 && s->best[at - 1].time.step_s > c->time.step_s) at--;
    if (at >= s->top) return;
    int n = s->n_best < s->top ? s->n_best + 1 : s->top;
    memmove(&s->best[at + 1], &s->best[at], sizeof *c * (size_t)(n - 1 - at));
    s->best[at] = *c;
    s->n_best = n;
}

/* One layout: loaded, validated, planned and timed; true when it fits. */
static bool try_layout(search *s, char keys[MAX_KEYS][96], int n_keys, hs_error *e) {
    const char *ov[256 + MAX_KEYS];
    int n = 0;
    for (int i = 0; i < s->n_base && n < 256; i++) ov[n++] = s->base[i];
    for (int i = 0; i < n_keys; i++) ov[n++] = keys[i];
    hs_config cfg;
    hs_topology topo;
    s->counts->tried++;
    bool fits = false;
    if (hs_config_load(&cfg, s->path, ov, n, e) != HS_OK) return false;
    if (hs_config_validate(&cfg, s->world, &topo, NULL, e) == HS_OK &&
        hs_plan_build(&cfg, &topo, s->plan, e) == HS_OK) {
        s->counts->valid++;
        hs_plan_choice c = {0};
        if (hs_plan_time_build(&cfg, &topo, s->plan, s->cl, &c.time, e) == HS_OK && c.time.fits) {
            fits = true;
            s->counts->fit++;
            c.peak_device_bytes = s->plan->max_peak_device_bytes;
            size_t at = 0;
            for (int i = 0; i < n_keys; i++)
                at += (size_t)snprintf(c.overrides + at, sizeof c.overrides - at, "%s%s",
                                       i ? " " : "", keys[i]);
            keep(s, &c);
        }
    }
    hs_config_free(&cfg);
    hs_error_clear(e);
    return fits;
}

#define KEY(...) snprintf(keys[nk++], sizeof keys[0], __VA_ARGS__)

static void layouts(search *s, const hs_config *base, hs_error *e) {
    static const char *const cp_methods[] = {"allgather", "ring"};
    static const struct {
        const char *name;
        int v;
    } schedules[] = {{"1f1b", 1}, {"interleaved_1f1b", 2}, {"zb1p", 1}, {"zbv", 2}};
    static const char *const acs[] = {"false", "selective", "true"};
    const hs_model_config *m = &base->model;
    int W = s->world, node = s->cl->shared ? W : s->cl->devices_per_node;
    bool moe = hs_model_arch_moe(m);
    for (int tp = 1; tp <= W && tp <= node; tp *= 2) {
        if (!divides(W, tp)) continue;
        for (int cp = 1; tp * cp <= W; cp *= 2) {
            if (!divides(W, (long long)tp * cp) || !divides(base->train.seq_len, 2 * cp)) continue;
            for (int pp = 1; tp * cp * pp <= W && pp <= m->n_layers; pp *= 2) {
                int dp = W / (tp * cp * pp);
                if (!divides(W, (long long)tp * cp * pp)) continue;
                int shards[2] = {dp * cp, node / (tp < node ? tp : node)}, n_shards = 1;
                if (shards[1] >= 1 && shards[1] < shards[0] && divides(shards[0], shards[1]))
                    n_shards = 2;
                for (int cm = 0; cm < (cp > 1 ? 2 : 1); cm++)
                    for (int sc = 0; sc < (pp > 1 ? 4 : 1); sc++)
                        for (int ep = 1; ep <= (moe ? m->moe.num_experts : 1); ep *= 2) {
                            if (moe && !divides((long long)dp * cp * tp, ep)) continue;
                            /* Memory only grows with the micro-batch and with
                             * less sharding: the first micro-batch none of
                             * whose checkpointing modes fits ends the loop,
                             * and a shard degree whose smallest micro-batch
                             * does not fit ends the shard degrees. */
                            for (int sh = 0; sh < n_shards; sh++) {
                                bool any = false;
                                for (int mb = 1; mb <= 8; mb *= 2) {
                                    if (!divides(s->global, (long long)mb * dp)) continue;
                                    bool fit = false;
                                    for (int ac = 0; ac < 3 && !fit; ac++) {
                                        char keys[MAX_KEYS][96];
                                        int nk = 0;
                                        KEY("accelerator.tp_size=%d", tp);
                                        KEY("accelerator.sequence_parallel=%s",
                                            tp > 1 ? "true" : "false");
                                        KEY("accelerator.cp_size=%d", cp);
                                        if (cp > 1)
                                            KEY("accelerator.cp_rotate_method=%s", cp_methods[cm]);
                                        KEY("accelerator.pp_size=%d", pp);
                                        if (pp > 1) {
                                            KEY("accelerator.pp_schedule=%s", schedules[sc].name);
                                            KEY("accelerator.pp_virtual_stages=%d",
                                                schedules[sc].v);
                                        }
                                        if (moe) KEY("accelerator.ep_size=%d", ep);
                                        KEY("fsdp_config.dp_shard_size=%d", shards[sh]);
                                        KEY("train.micro_batch_size=%d", mb);
                                        KEY("train.global_batch_size=%lld", s->global);
                                        KEY("train.activation_checkpointing=%s", acs[ac]);
                                        fit = try_layout(s, keys, nk, e);
                                    }
                                    if (!fit) break;
                                    any = true;
                                }
                                if (!any) break;
                            }
                        }
            }
        }
    }
}

hs_status hs_plan_search(const char *path, const char *const *overrides, int n_overrides, int world,
                         const hs_cluster *cl, int top, hs_plan_choice *best, int *n_best,
                         hs_plan_search_counts *counts, hs_error *e) {
    hs_error_clear(e);
    memset(counts, 0, sizeof *counts);
    *n_best = 0;
    hs_config base;
    hs_status rc = hs_config_load(&base, path, overrides, n_overrides, e);
    if (rc != HS_OK) return rc;
    search s = {.path = path,
                .base = overrides,
                .n_base = n_overrides,
                .world = world,
                .cl = cl,
                .best = best,
                .top = top,
                .counts = counts};
    /* the global batch the config has for this world, else one micro-batch
     * of every rank */
    hs_topology topo;
    if (hs_config_validate(&base, world, &topo, NULL, e) == HS_OK)
        s.global = hs_config_global_batch(&base, &topo);
    else
        s.global = base.train.global_batch_size > 0
                       ? base.train.global_batch_size
                       : (long long)base.train.micro_batch_size * world;
    hs_error_clear(e);
    s.plan = calloc(1, sizeof *s.plan);
    if (!s.plan) {
        hs_config_free(&base);
        return hs_error_oom(e, "plan --search: a plan of %zu bytes", sizeof *s.plan);
    }
    layouts(&s, &base, e);
    counts->global_batch = s.global;
    free(s.plan);
    hs_config_free(&base);
    *n_best = s.n_best;
    if (s.n_best == 0)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "plan --search: none of the %d layouts of %d ranks tried fits the "
                            "cluster's %.4g GB a device (%d valid); more ranks, a smaller model "
                            "or a smaller train.seq_len make one fit",
                            counts->tried, world, cl->memory_bytes / 1e9, counts->valid);
    return HS_OK;
}
