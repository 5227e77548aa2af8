/* The layout search (train.h hs_plan_search): every layout of `world`
 * ranks the config rules accept for the model and global batch, planned
 * (memory) and timed (plan_time.c) on a cluster; those whose peak does not
 * fit are dropped, the rest ranked by step time.
 *
 * A layout is tp x cp (allgather or ring) x pp (each schedule the table
 * of schedules marks searched, with its fewest chunks a stage) x the FSDP
 * shard degree (the
 * whole data-parallel domain, or the ranks of one node) x ep (MoE: the
 * divisors of the experts) x micro-batch (1, 2, 4, 8) x activation
 * checkpointing (none; selective and full only where none does not fit:
 * recompute never makes a step shorter). tp is at most a node's ranks and
 * turns sequence parallelism on. */
#include <stdlib.h>
#include <string.h>

#include "hypershard/train.h"

#define MAX_KEYS 16

typedef struct search {
    const char *path;
    const char **ov; /* the caller's overrides, then a layout's keys */
    int n_base;
    int world;
    long long global;
    const hs_cluster *cl;
    hs_plan_choice *best;
    int top, n_best;
    hs_plan *plan;
    hs_plan_search_counts *counts;
} search;

/* One layout: its degrees and the index of each choice in the tables of
 * layout_keys. */
typedef struct layout {
    int tp, cp, cp_method, pp, schedule, ep, shard, mb, ac;
    bool moe;
} layout;

static const char *const cp_methods[] = {"allgather", "ring"};
static const char *const acs[] = {"false", "selective", "true"};

static bool divides(long long a, long long b) { return b > 0 && a % b == 0; }

/* The searched schedule after table row k (k = -1: the first); without a
 * pipeline one pass, whose schedule no key names. */
static int next_schedule(int k, int pp) {
    if (pp == 1) return k < 0 ? 0 : HS_PP_N_SCHEDULES;
    while (++k < HS_PP_N_SCHEDULES && !hs_pp_schedule_info_of((hs_pp_schedule_kind)k)->searched) {
    }
    return k;
}

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

#define KEY(...) snprintf(keys[nk++], sizeof keys[0], __VA_ARGS__)

/* The overrides that run layout l; their count. */
static int layout_keys(const search *s, const layout *l, char keys[MAX_KEYS][96]) {
    int nk = 0;
    KEY("accelerator.tp_size=%d", l->tp);
    KEY("accelerator.sequence_parallel=%s", l->tp > 1 ? "true" : "false");
    KEY("accelerator.cp_size=%d", l->cp);
    if (l->cp > 1) KEY("accelerator.cp_rotate_method=%s", cp_methods[l->cp_method]);
    KEY("accelerator.pp_size=%d", l->pp);
    if (l->pp > 1) {
        const hs_pp_schedule_info *info = hs_pp_schedule_info_of((hs_pp_schedule_kind)l->schedule);
        KEY("accelerator.pp_schedule=%s", info->name);
        KEY("accelerator.pp_virtual_stages=%d", info->min_chunks);
    }
    if (l->moe) KEY("accelerator.ep_size=%d", l->ep);
    KEY("fsdp_config.dp_shard_size=%d", l->shard);
    KEY("train.micro_batch_size=%d", l->mb);
    KEY("train.global_batch_size=%lld", s->global);
    KEY("train.activation_checkpointing=%s", acs[l->ac]);
    return nk;
}

/* One layout: loaded, validated, planned and timed; true when it fits. */
static bool try_layout(search *s, const layout *l, hs_error *e) {
    char keys[MAX_KEYS][96];
    int n_keys = layout_keys(s, l, keys);
    for (int i = 0; i < n_keys; i++) s->ov[s->n_base + i] = keys[i];
    hs_config cfg;
    hs_topology topo;
    s->counts->tried++;
    bool fits = false;
    if (hs_config_load(&cfg, s->path, s->ov, s->n_base + n_keys, e) != HS_OK) return false;
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

/* The shard degrees, micro-batches and checkpointing modes of a layout.
 * Memory only grows with the micro-batch and with less sharding: the
 * first micro-batch none of whose modes fits ends the micro-batches, and a
 * shard degree whose smallest micro-batch does not fit ends the shard
 * degrees; recompute is tried only where none does not fit. */
static void batches(search *s, layout *l, const int *shards, int n_shards, int dp, hs_error *e) {
    for (int sh = 0; sh < n_shards; sh++) {
        l->shard = shards[sh];
        bool any = false;
        for (l->mb = 1; l->mb <= 8; l->mb *= 2) {
            if (!divides(s->global, (long long)l->mb * dp)) continue;
            bool fit = false;
            for (l->ac = 0; l->ac < 3 && !fit; l->ac++) fit = try_layout(s, l, e);
            if (!fit) break;
            any = true;
        }
        if (!any) return;
    }
}

static void layouts(search *s, const hs_config *base, hs_error *e) {
    const hs_model_config *m = &base->model;
    int W = s->world, node = s->cl->shared ? W : s->cl->devices_per_node;
    layout l = {.moe = hs_model_arch_moe(m)};
    for (l.tp = 1; l.tp <= W && l.tp <= node; l.tp *= 2) {
        if (!divides(W, l.tp)) continue;
        for (l.cp = 1; l.tp * l.cp <= W; l.cp *= 2) {
            if (!divides(W, (long long)l.tp * l.cp) || !divides(base->train.seq_len, 2 * l.cp))
                continue;
            for (l.pp = 1; l.tp * l.cp * l.pp <= W && l.pp <= m->n_layers; l.pp *= 2) {
                if (!divides(W, (long long)l.tp * l.cp * l.pp)) continue;
                int dp = W / (l.tp * l.cp * l.pp);
                /* the whole data-parallel domain, or a node's ranks */
                int shards[2] = {dp * l.cp, node / (l.tp < node ? l.tp : node)}, n_shards = 1;
                if (shards[1] >= 1 && shards[1] < shards[0] && divides(shards[0], shards[1]))
                    n_shards = 2;
                for (l.cp_method = 0; l.cp_method < (l.cp > 1 ? 2 : 1); l.cp_method++)
                    for (l.schedule = next_schedule(-1, l.pp); l.schedule < HS_PP_N_SCHEDULES;
                         l.schedule = next_schedule(l.schedule, l.pp))
                        for (l.ep = 1; l.ep <= (l.moe ? m->moe.num_experts : 1); l.ep *= 2)
                            if (!l.moe || divides((long long)dp * l.cp * l.tp, l.ep))
                                batches(s, &l, shards, n_shards, dp, e);
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
    s.ov = calloc((size_t)n_overrides + MAX_KEYS, sizeof *s.ov);
    if (!s.plan || !s.ov) {
        free(s.plan), free(s.ov);
        hs_config_free(&base);
        return hs_error_oom(e, "plan --search: a plan of %zu bytes", sizeof *s.plan);
    }
    for (int i = 0; i < n_overrides; i++) s.ov[i] = overrides[i];
    layouts(&s, &base, e);
    counts->global_batch = s.global;
    free(s.plan), free(s.ov);
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
