/* `hypershard launch`'s layouts: the run's config checked at its world
 * size before any rank starts, and the largest smaller world whose layout
 * keeps the model-parallel sizes (tp, cp, pp, ep) and the global batch,
 * with the data-parallel shard degrees shrunk to fit. The config layer's
 * own validation decides what is valid; nothing here restates its rules. */
#include <stdio.h>
#include <string.h>

#include "cli/launch.h"
#include "hypershard/config.h"

/* Load CONFIG with its overrides and then `extra`, and validate at world. */
static hs_status load_at(const char *config, const char *const *ov, int n_ov,
                         const hs_launch_layout *extra, int world, hs_config *c, hs_topology *t,
                         hs_error *e) {
    hs_status s = hs_config_load(c, config, ov, n_ov, e);
    for (int i = 0; s == HS_OK && extra && i < extra->n_keys; i++)
        s = hs_config_override(c, extra->keys[i], e);
    if (s == HS_OK) s = hs_config_validate(c, world, t, NULL, e);
    return s;
}

hs_status hs_launch_layout_check(const char *config, const char *const *ov, int n_ov, int world,
                                 hs_launch_layout *out, char *ckpt_dir, hs_error *e) {
    hs_config c;
    hs_topology t;
    memset(out, 0, sizeof *out);
    hs_status s = load_at(config, ov, n_ov, NULL, world, &c, &t, e);
    if (s == HS_OK) {
        out->world = world;
        out->global_batch = hs_config_global_batch(&c, &t);
        out->resume_auto = !strcmp(c.checkpoint.resume, "auto");
        snprintf(ckpt_dir, HS_PATH_MAX, "%s", c.checkpoint.dir);
    }
    hs_config_free(&c);
    /* An unreadable CONFIG is a bad argument, as for `train`. */
    return s == HS_ERR_IO ? (e->code = HS_ERR_USAGE) : s;
}

/* The largest divisor of n that is at most cap. */
static int divisor_at_most(int n, int cap) {
    for (int d = cap < n ? cap : n; d > 1; d--)
        if (n % d == 0) return d;
    return 1;
}

static void add_key(hs_launch_layout *l, const char *key, long long from, long long to,
                    bool from_null) {
    int i = l->n_keys++;
    snprintf(l->keys[i], sizeof l->keys[i], "%s=%lld", key, to);
    if (from_null) snprintf(l->changes[i], sizeof l->changes[i], "%s null -> %lld", key, to);
    else snprintf(l->changes[i], sizeof l->changes[i], "%s %lld -> %lld", key, from, to);
}

/* The keys world `w` changes against the original config `c`, or false
 * when tp x cp x pp does not divide it or no micro-batch size keeps the
 * global batch. */
static bool keys_for(const hs_config *c, const hs_launch_layout *orig, int w, hs_launch_layout *l) {
    const hs_accel_config *a = &c->accelerator;
    int model = a->tp_size * a->cp_size * a->pp_size;
    if (w % model) return false;
    int dp = w / model, fsdp_dp = dp * a->cp_size, expert = dp * a->cp_size * a->tp_size;
    memset(l, 0, sizeof *l);
    l->world = w;
    l->global_batch = orig->global_batch;
    int shard = divisor_at_most(fsdp_dp, c->fsdp.dp_shard_size);
    if (shard != c->fsdp.dp_shard_size)
        add_key(l, "fsdp_config.dp_shard_size", c->fsdp.dp_shard_size, shard, false);
    if (a->ep_size > 1 && expert % a->ep_size == 0) {
        int eshard = divisor_at_most(expert / a->ep_size, c->fsdp.edp_shard_size);
        if (eshard != c->fsdp.edp_shard_size)
            add_key(l, "fsdp_config.edp_shard_size", c->fsdp.edp_shard_size, eshard, false);
    }
    if (c->train.global_batch_size <= 0)
        add_key(l, "train.global_batch_size", 0, orig->global_batch, true);
    int mb = c->train.micro_batch_size;
    while (mb > 1 && orig->global_batch % ((long long)mb * dp)) mb--;
    if (orig->global_batch % ((long long)mb * dp)) return false;
    if (mb != c->train.micro_batch_size)
        add_key(l, "train.micro_batch_size", c->train.micro_batch_size, mb, false);
    return true;
}

bool hs_launch_layout_shrink(const char *config, const char *const *ov, int n_ov,
                             const hs_launch_layout *orig, int min_world, int max_world,
                             hs_launch_layout *out) {
    hs_config c;
    hs_topology t;
    hs_error e;
    hs_error_clear(&e);
    hs_status s = load_at(config, ov, n_ov, NULL, orig->world, &c, &t, &e);
    bool found = false;
    for (int w = max_world; s == HS_OK && !found && w >= min_world && w >= 1; w--) {
        if (!keys_for(&c, orig, w, out)) continue;
        hs_config cw;
        hs_topology tw;
        hs_error_clear(&e);
        found = load_at(config, ov, n_ov, out, w, &cw, &tw, &e) == HS_OK &&
                hs_config_global_batch(&cw, &tw) == orig->global_batch;
        hs_config_free(&cw);
    }
    hs_config_free(&c);
    return found;
}
