/* Checkpoints in the trainer: which tensors a checkpoint holds (each
 * parameter's fp32 master, the model's own 16-bit copy when fp32 main
 * params keep them apart, and the optimizer state), the trainer state
 * record, the save cadence, and resume (docs/checkpoint.md, "Resume").
 *
 * Tensor names: the master is "<fqn>", or "main.<fqn>" when the model holds
 * its own copy (then saved as "<fqn>" in its dtype); optimizer state is
 * "optim.<fqn>.<state>". A load takes the fp32 value from "main.<fqn>" when
 * the checkpoint has it, else from "<fqn>", so a run may switch fp32 main
 * params on or off across a resume. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hypershard/ckpt.h"
#include "train/run.h"

typedef struct ckpt_list {
    hs_ckpt_tensor *t;
    char **names; /* owned, one per tensor */
    int n, cap;
    hs_device *dev; /* where the tensors' data is (NULL: host memory) */
} ckpt_list;

/* The memory the checkpoint's tensors are in. The masters, the model's own
 * copies and the optimizer state are the device's memory, except under
 * offload, where FSDP keeps the shards and the trainer the optimizer state
 * in the host pool (trainer.c): host memory, which the checkpoint reads
 * and writes as it is. */
static ckpt_list list_new(const hs_trainer *t) {
    return (ckpt_list){.dev = t->cfg->fsdp.enable_offload ? NULL : t->dev};
}

static void list_free(ckpt_list *l) {
    for (int i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    free(l->t);
    *l = (ckpt_list){.dev = l->dev};
}

/* Appends this rank's chunk of parameter p (rows of v of its TP-local
 * tensor) under a name built
 * from prefix + fqn + suffix. */
static hs_status list_add(ckpt_list *l, const char *prefix, const hs_param *p, const char *suffix,
                          const hs_engine_ckpt_param *v, hs_dtype dt, void *data,
                          int64_t storage_rows, hs_error *e) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        hs_ckpt_tensor *t = realloc(l->t, sizeof *t * (size_t)cap);
        if (t) l->t = t;
        char **names = t ? realloc(l->names, sizeof *names * (size_t)cap) : NULL;
        if (!names) return hs_error_oom(e, "checkpoint: cannot grow the tensor list");
        l->names = names;
        l->cap = cap;
    }
    size_t len = strlen(prefix) + strlen(p->fqn) + strlen(suffix) + 1;
    char *name = malloc(len);
    if (!name) return hs_error_oom(e, "checkpoint: cannot allocate a tensor name");
    snprintf(name, len, "%s%s%s", prefix, p->fqn, suffix);
    hs_ckpt_tensor *t = &l->t[l->n];
    hs_ckpt_tensor_full(t, name, dt, p->ndim, p->shape, data);
    t->dev = l->dev;
    /* The box of the global tensor this rank holds: its TP-local slice
     * (local_offset / local_shape), of which FSDP keeps dim-0 rows. */
    for (int d = 0; d < p->ndim; d++) {
        t->offset[d] = p->local_offset[d];
        t->size[d] = p->local_shape[d];
    }
    t->offset[0] += v->row_offset;
    t->size[0] = v->rows;
    t->storage_rows = storage_rows > v->rows ? storage_rows : 0;
    l->names[l->n++] = name;
    return HS_OK;
}

static hs_status list_optim_state(ckpt_list *l, hs_trainer *t, int i, const hs_param *p,
                                  const hs_engine_ckpt_param *v, hs_error *e) {
    hs_status s = HS_OK;
    if (!t->optim) return s; /* inference: the weights alone are loaded */
    for (int k = 0; s == HS_OK && k < hs_optim_state_count(t->optim, i); k++) {
        char suffix[80];
        snprintf(suffix, sizeof suffix, ".%s", hs_optim_state_name(t->optim, i, k));
        s = list_add(l, "optim.", p, suffix, v, HS_DTYPE_F32, hs_optim_state_data(t->optim, i, k),
                     0, e);
    }
    return s;
}

/* What this rank saves. */
static hs_status list_for_save(hs_trainer *t, ckpt_list *l, hs_error *e) {
    hs_engine *en = t->engine;
    hs_status s = HS_OK;
    for (int i = 0; s == HS_OK && i < hs_model_num_params(en->model); i++) {
        const hs_param *p = hs_model_param(en->model, i);
        hs_engine_ckpt_param v;
        en->ckpt_param(en, i, &v);
        s = list_add(l, v.model_copy ? "main." : "", p, "", &v, HS_DTYPE_F32, v.master, 0, e);
        if (s == HS_OK && v.model_copy)
            s = list_add(l, "", p, "", &v, v.model_dtype, v.model_copy, 0, e);
        if (s == HS_OK) s = list_optim_state(l, t, i, p, &v, e);
    }
    return s;
}

/* What this rank loads: masters (with their padded storage) and optimizer
 * state; model copies are rebuilt from the masters afterwards. */
static hs_status list_for_load(hs_trainer *t, const hs_ckpt *c, ckpt_list *l, hs_error *e) {
    hs_engine *en = t->engine;
    hs_status s = HS_OK;
    for (int i = 0; s == HS_OK && i < hs_model_num_params(en->model); i++) {
        const hs_param *p = hs_model_param(en->model, i);
        hs_engine_ckpt_param v;
        en->ckpt_param(en, i, &v);
        char main_name[HS_CKPT_NAME_MAX];
        snprintf(main_name, sizeof main_name, "main.%s", p->fqn);
        bool has_main = hs_ckpt_find(c, main_name) >= 0;
        s = list_add(l, has_main ? "main." : "", p, "", &v, HS_DTYPE_F32, v.master, v.storage_rows,
                     e);
        if (s == HS_OK) s = list_optim_state(l, t, i, p, &v, e);
    }
    return s;
}

/* ------------------------------------------------------- compatibility */

/* The settings a checkpoint's tensors depend on, one "key=value" line each:
 * the model's parameter shapes and the optimizer (its state tensors).
 * World size, FSDP layout, precision and the schedule may all change. */
static void compat_lines(const hs_config *c, char *buf, size_t cap) {
    const hs_model_config *m = &c->model;
    int n = snprintf(buf, cap,
                     "model.arch=%s\nmodel.vocab_size=%d\nmodel.dim=%d\nmodel.n_layers=%d\n"
                     "model.n_heads=%d\nmodel.n_kv_heads=%d\nmodel.ffn_dim=%d\n"
                     "model.tie_embeddings=%s\noptimizer._target_=%s\n",
                     m->arch, m->vocab_size, m->dim, m->n_layers, m->n_heads, m->n_kv_heads,
                     m->ffn_dim, m->tie_embeddings ? "true" : "false", c->optimizer.target);
    if (n > 0 && (size_t)n < cap && hs_model_arch_moe(m))
        n += snprintf(buf + n, cap - (size_t)n,
                      "model.moe.num_experts=%d\nmodel.moe.top_k=%d\nmodel.moe.expert_ffn_dim=%d\n"
                      "model.moe.shared_expert_ffn_dim=%d\n",
                      m->moe.num_experts, m->moe.top_k, m->moe.expert_ffn_dim,
                      m->moe.shared_expert_ffn_dim);
    /* Qwen3-MoE's dense blocks, listed only where there are any (the
     * hash of an all-MoE model stays what it was) */
    if (!hs_model_arch_moe(m) || hs_model_dense_layers(m) == 0) return;
    const char *sep = "model.moe.dense_layers=";
    for (int i = 0; i < m->n_layers && n > 0 && (size_t)n < cap; i++)
        if (!hs_model_layer_moe(m, i)) {
            n += snprintf(buf + n, cap - (size_t)n, "%s%d", sep, i);
            sep = ",";
        }
    if (n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "\n");
}

static uint64_t compat_hash(const hs_config *c) {
    char buf[1024];
    compat_lines(c, buf, sizeof buf);
    return hs_hash64(buf);
}

/* The value of `key` in compat_lines text (copied into val), or false. */
static bool compat_value(const char *lines, const char *key, char *val, size_t cap) {
    size_t n = strlen(key);
    for (const char *l = lines; *l;) {
        const char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        if (len > n && !strncmp(l, key, n) && l[n] == '=') {
            snprintf(val, cap, "%.*s", (int)(len - n - 1), l + n + 1);
            return true;
        }
        l += len + (nl ? 1 : 0);
    }
    return false;
}

/* Appends "key: checkpoint X, this run Y" for each key of `a` (the
 * checkpoint's) whose value in `b` (this run's) differs or is absent, and
 * each key only `b` has; returns how many. */
static int compat_diff(const char *a, const char *b, bool a_is_ckpt, hs_error *e) {
    int n = 0;
    for (const char *l = a; *l;) {
        const char *nl = strchr(l, '\n'), *eq = strchr(l, '=');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        char key[128], va[256], vb[256] = "(not set)";
        if (eq && eq < l + len) {
            snprintf(key, sizeof key, "%.*s", (int)(eq - l), l);
            snprintf(va, sizeof va, "%.*s", (int)(len - (size_t)(eq - l) - 1), eq + 1);
            bool in_b = compat_value(b, key, vb, sizeof vb);
            if (a_is_ckpt && (!in_b || strcmp(va, vb) != 0))
                n++, hs_error_append(e, HS_ERR_CONFIG, "  %s: checkpoint %s, this run %s", key, va,
                                     vb);
            else if (!a_is_ckpt && !in_b)
                n++, hs_error_append(e, HS_ERR_CONFIG, "  %s: checkpoint (not set), this run %s",
                                     key, va);
        }
        l += len + (nl ? 1 : 0);
    }
    return n;
}

/* Lists the keys that differ between the checkpoint's config.yaml and this
 * run. config.yaml is only a copy: the hash in the metadata is what the
 * tensors were saved with, so when config.yaml no longer hashes to it, it
 * was edited after the save and the message says so instead of listing
 * nothing (or differences from an edited file) without comment. */
static void compat_explain(const hs_config *mine, const char *step_dir, uint64_t saved_hash,
                           hs_error *e) {
    char path[HS_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.yaml", step_dir);
    hs_config saved; /* set by hs_config_load, whatever it returns */
    hs_error e2;
    hs_error_clear(&e2);
    if (hs_config_load(&saved, path, NULL, 0, &e2) != HS_OK) {
        hs_error_append(e, HS_ERR_CONFIG, "(its config.yaml cannot be read to say which: %s)",
                        e2.msg);
        hs_config_free(&saved);
        return;
    }
    char a[1024], b[1024];
    compat_lines(&saved, a, sizeof a);
    compat_lines(mine, b, sizeof b);
    uint64_t file_hash = compat_hash(&saved);
    hs_config_free(&saved);
    int n = compat_diff(a, b, true, e) + compat_diff(b, a, false, e);
    if (file_hash == saved_hash) return;
    if (n == 0)
        hs_error_append(e, HS_ERR_CONFIG,
                        "  none against %s, which agrees with this run on "
                        "every such key: it was edited after the save (its settings hash to "
                        "0x%016llx, the metadata records 0x%016llx; layout and comments do not "
                        "count). The tensors follow the metadata: resume with the settings the "
                        "checkpoint was trained with, or start fresh",
                        path, (unsigned long long)file_hash, (unsigned long long)saved_hash);
    else
        hs_error_append(e, HS_ERR_CONFIG,
                        "  (against %s, which was edited after the save: its "
                        "settings hash to 0x%016llx, the metadata records 0x%016llx)",
                        path, (unsigned long long)file_hash, (unsigned long long)saved_hash);
}

hs_status hs_train_ckpt_config_check(const char *step_dir, uint64_t saved_hash, hs_error *e) {
    char path[HS_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.yaml", step_dir);
    if (access(path, F_OK) != 0) return HS_OK; /* a checkpoint saved without a config */
    hs_config saved;                           /* set by hs_config_load, whatever it returns */
    hs_error e2;
    hs_error_clear(&e2);
    hs_status s = hs_config_load(&saved, path, NULL, 0, &e2);
    uint64_t file_hash = s == HS_OK ? compat_hash(&saved) : 0;
    hs_config_free(&saved);
    if (s != HS_OK)
        return hs_error_set(e, HS_ERR_FORMAT, "checkpoint %s: its config.yaml cannot be read: %s",
                            step_dir, e2.msg);
    if (file_hash != saved_hash)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "checkpoint %s: config.yaml was edited after the save: its model and "
                            "optimizer settings hash to 0x%016llx, the metadata records "
                            "0x%016llx, so `--ckpt` commands would build another model than the "
                            "tensors were saved from; restore the file (the tensors and "
                            "metadata verify on their own)",
                            path, (unsigned long long)file_hash, (unsigned long long)saved_hash);
    return HS_OK;
}

static hs_status check_state(const hs_trainer *t, const char *path, const hs_ckpt_state *st,
                             hs_error *e) {
    const hs_config *cfg = t->cfg;
    if (st->config_hash != compat_hash(cfg)) {
        hs_error_set(e, HS_ERR_CONFIG,
                     "checkpoint.resume: %s was saved with a different model or optimizer "
                     "(config hash 0x%016llx, this run 0x%016llx); its tensors cannot be loaded "
                     "into this model. Resume with the settings in %s/config.yaml, or start "
                     "fresh with checkpoint.resume: none. Differences:",
                     path, (unsigned long long)st->config_hash,
                     (unsigned long long)compat_hash(cfg), path);
        compat_explain(cfg, path, st->config_hash, e);
        return HS_ERR_CONFIG;
    }
    if (st->step < 0)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "checkpoint %s: step %lld is negative; the checkpoint is damaged "
                            "(resume from another step, or checkpoint.resume: none)",
                            path, (long long)st->step);
    if (st->step > cfg->train.steps)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "checkpoint.resume: %s holds step %lld, beyond train.steps = %d; "
                            "raise train.steps to train further",
                            path, (long long)st->step, cfg->train.steps);
    if (st->data_position != st->step)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "checkpoint %s: data position %lld at step %lld; this trainer reads "
                            "exactly one global batch per step, so they must be equal",
                            path, (long long)st->data_position, (long long)st->step);
    return HS_OK;
}

/* ---------------------------------------------------------------- state */

static hs_ckpt_state trainer_state(const hs_trainer *t, int step) {
    /* The trainer draws no random numbers while it trains: the data order
     * of global batch g is Philox keyed by the data seed at counter g, so
     * (seed, next batch) is the whole RNG state. */
    return (hs_ckpt_state){.step = step,
                           .data_position = step,
                           .optim_step = hs_optim_step_count(t->optim),
                           .rng_seed = t->data_seed,
                           .rng_counter = (uint64_t)step,
                           .config_hash = compat_hash(t->cfg)};
}

/* Every rank gets a failure when any rank has one, with its reason. */
static hs_status agree(hs_trainer *t, hs_status mine, const char *what, hs_error *e) {
    return hs_pg_agree(t->world_group, mine, what, e);
}

/* --------------------------------------------------------------- resume */

/* Open the checkpoint on this rank, check it against this run and note
 * its state. */
static hs_status resume_check(hs_trainer *t, const char *path, hs_ckpt_state *st, hs_error *e) {
    hs_ckpt *c = NULL;
    hs_status s = hs_ckpt_open(path, &c, e);
    if (s == HS_OK) {
        *st = *hs_ckpt_get_state(c);
        s = check_state(t, hs_ckpt_path(c), st, e);
    }
    hs_ckpt_close(c);
    return s;
}

static hs_status resume_load(hs_trainer *t, const char *path, hs_ckpt_state *st, hs_error *e) {
    hs_ckpt *c = NULL;
    ckpt_list l = list_new(t);
    hs_status s = hs_ckpt_open(path, &c, e);
    if (s == HS_OK) s = list_for_load(t, c, &l, e);
    hs_ckpt_close(c);
    s = agree(t, s, "building the checkpoint load list", e);
    if (s == HS_OK) s = hs_ckpt_load(t->comm, path, l.t, l.n, st, e);
    list_free(&l);
    return s;
}

/* The data order continues with the seed the checkpoint was trained on. */
static hs_status resume_data_seed(hs_trainer *t, uint64_t seed, hs_error *e) {
    if (seed == t->data_seed || !t->data) return HS_OK; /* !data: generate opens none */
    hs_log_warn(t->log,
                "train.seed %llu differs from the checkpoint's %llu: the data order "
                "continues with %llu",
                (unsigned long long)t->data_seed, (unsigned long long)seed,
                (unsigned long long)seed);
    hs_data_free(t->data);
    t->data = NULL;
    t->data_seed = seed;
    return hs_data_open(&t->cfg->data, t->T, t->cfg->model.vocab_size, seed, &t->data, e);
}

/* Whether `step_dir` is checkpoint.dir/step-<step>: then the final save of a
 * run that trains nothing more would only rewrite it. */
static bool is_own_step(const hs_trainer *t, const char *step_dir, int64_t step) {
    const char *dir = t->cfg->checkpoint.dir;
    if (!dir[0]) return false;
    char own[HS_PATH_MAX + 32], a[PATH_MAX], b[PATH_MAX];
    snprintf(own, sizeof own, "%s/step-%lld", dir, (long long)step);
    return realpath(own, a) && realpath(step_dir, b) && !strcmp(a, b);
}

/* checkpoint.async: the writer and its staging memory (the plan's estimate,
 * counted in the start-up memory check) before the first step, so no save
 * pays for allocating and faulting it in. */
static hs_status writer_open(hs_trainer *t, hs_error *e) {
    if (!t->cfg->checkpoint.dir[0] || !t->cfg->checkpoint.async || !t->optim) return HS_OK;
    hs_status s = hs_ckpt_writer_create(t->dev, &t->ckpt_writer, e);
    if (s == HS_OK) s = hs_ckpt_writer_reserve(t->ckpt_writer, t->plan_ckpt_staging, e);
    return agree(t, s, "allocating the checkpoint staging memory", e);
}

hs_status hs_train_ckpt_resume(hs_trainer *t, hs_error *e) {
    t->ckpt_step = -1;
    t->data_seed = (uint64_t)t->cfg->train.seed;
    char path[HS_PATH_MAX];
    bool found = false;
    hs_status s = writer_open(t, e);
    if (s != HS_OK) return s;
    s = hs_ckpt_resolve_resume(&t->cfg->checkpoint, path, sizeof path, &found, e);
    s = agree(t, s, "resolving checkpoint.resume", e);
    if (s != HS_OK) return s;
    if (!found) {
        if (!strcmp(t->cfg->checkpoint.resume, "auto"))
            hs_log_info(t->log,
                        "checkpoint.resume = auto: no checkpoint in %s yet; starting "
                        "fresh",
                        t->cfg->checkpoint.dir);
        return HS_OK;
    }
    hs_ckpt_state st;
    s = agree(t, resume_check(t, path, &st, e), "checking the checkpoint", e);
    if (s == HS_OK) s = resume_load(t, path, &st, e);
    if (s != HS_OK) return s;
    if (t->optim) hs_optim_set_step_count(t->optim, st.optim_step);
    s = t->engine->after_step(t->engine, false, e);
    if (s == HS_OK) s = resume_data_seed(t, st.rng_seed, e);
    if (s != HS_OK) return s;
    t->start_step = (int)st.step;
    if (is_own_step(t, path, st.step)) t->ckpt_step = t->start_step;
    hs_log_info(t->log,
                "resumed from %s: step %lld of %d, optimizer step %lld, next global "
                "batch %lld",
                path, (long long)st.step, t->cfg->train.steps, (long long)st.optim_step,
                (long long)st.data_position);
    return HS_OK;
}

/* ------------------------------------------------------------ the dir */

/* The step-<N> directories checkpoint.dir holds already. */
static int ckpt_steps_present(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *de = d ? readdir(d) : NULL; de; de = readdir(d))
        n += !strncmp(de->d_name, "step-", 5) && de->d_name[5] >= '0' && de->d_name[5] <= '9';
    if (d) closedir(d);
    return n;
}

/* How many checkpoints this run adds to the disk at the most: each save
 * writes a new step before pruning to keep_last, so a fresh directory
 * peaks at keep_last + 1 of this run's (fewer when the run saves fewer),
 * and one that holds k already gains keep_last + 1 - k, at least one. */
static int ckpt_new_at_peak(const hs_trainer *t) {
    const hs_ckpt_config *c = &t->cfg->checkpoint;
    int steps = t->cfg->train.steps, saves = c->save_every > 0 ? steps / c->save_every : 0;
    if (c->save_every <= 0 || steps % c->save_every != 0) saves++; /* the final save */
    int room = c->keep_last + 1 - ckpt_steps_present(c->dir);
    if (room < 1) room = 1;
    return saves < room ? saves : room;
}

bool hs_train_ckpt_out_dir(const hs_trainer *t, hs_out_dir *d, char *what, size_t cap) {
    const char *dir = t->cfg->checkpoint.dir;
    if (!dir[0]) return false;
    int n = ckpt_new_at_peak(t);
    int64_t bytes = 0;
    if (!hs_mul_i64(t->plan_ckpt_bytes, n, &bytes)) bytes = INT64_MAX;
    snprintf(what, cap,
             "one checkpoint of this run takes about %.1f MiB (the plan's estimate: "
             "fp32 weights and optimizer state) and the run adds up to %d there at once "
             "(checkpoint.keep_last = %d)",
             (double)t->plan_ckpt_bytes / (1 << 20), n, t->cfg->checkpoint.keep_last);
    *d = (hs_out_dir){.what = "checkpoint.dir", .path = dir, .bytes = bytes, .bytes_what = what};
    return true;
}

/* ----------------------------------------------------------------- save */

static bool ckpt_due(const hs_trainer *t, int step) {
    const hs_ckpt_config *c = &t->cfg->checkpoint;
    return c->dir[0] && c->save_every > 0 && step % c->save_every == 0;
}

/* The background save (writer_open made the writer): a snapshot on this
 * thread, the write on the writer's. */
static hs_status save_async(hs_trainer *t, const ckpt_list *l, const hs_ckpt_save_options *opt,
                            const hs_ckpt_state *st, hs_error *e) {
    return hs_ckpt_save_async(t->ckpt_writer, t->comm, opt, l->t, l->n, st, e);
}

hs_status hs_train_ckpt_save(hs_trainer *t, int step, hs_error *e) {
    double t0 = hs_now();
    ckpt_list l = list_new(t);
    hs_status s = agree(t, list_for_save(t, &l, e), "building the checkpoint", e);
    hs_ckpt_state st = trainer_state(t, step);
    hs_ckpt_save_options opt = {.dir = t->cfg->checkpoint.dir,
                                .keep_last = t->cfg->checkpoint.keep_last,
                                .config = t->cfg,
                                .log = t->log};
    if (s == HS_OK && t->cfg->checkpoint.async) s = save_async(t, &l, &opt, &st, e);
    else if (s == HS_OK) s = hs_ckpt_save(t->comm, &opt, l.t, l.n, &st, NULL, 0, e);
    list_free(&l);
    if (s == HS_OK) t->ckpt_step = step;
    hs_trace_span(t->trace, HS_LANE_COMPUTE, "checkpoint", "checkpoint", t0, hs_now(), NULL);
    return s;
}

hs_status hs_train_ckpt_wait(hs_trainer *t, hs_error *e) {
    return hs_ckpt_writer_wait(t->ckpt_writer, e);
}

hs_status hs_train_ckpt_after_step(hs_trainer *t, int step, hs_error *e) {
    bool busy = hs_ckpt_writer_busy(t->ckpt_writer);
    double t0 = hs_now();
    hs_status s = hs_ckpt_writer_poll(t->ckpt_writer, e);
    /* Every poll with a save in flight is training-thread time the save
     * costs (its all-reduce, and at phase ends the agreements), so each is
     * traced, not only the one that completes the save. */
    if (busy)
        hs_trace_span(t->trace, HS_LANE_COMPUTE,
                      hs_ckpt_writer_busy(t->ckpt_writer) ? "checkpoint poll"
                                                          : "checkpoint publish",
                      "checkpoint", t0, hs_now(), NULL);
    if (s == HS_OK && ckpt_due(t, step)) s = hs_train_ckpt_save(t, step, e);
    return s;
}

hs_status hs_train_ckpt_final(hs_trainer *t, hs_error *e) {
    int last = t->cfg->train.steps;
    if (!t->cfg->checkpoint.dir[0]) return HS_OK;
    hs_status s = t->ckpt_step == last ? HS_OK : hs_train_ckpt_save(t, last, e);
    return s == HS_OK ? hs_train_ckpt_wait(t, e) : s;
}

void hs_train_ckpt_close(hs_trainer *t) {
    hs_ckpt_writer_free(t->ckpt_writer);
    t->ckpt_writer = NULL;
}

/* -------------------------------------------------------------- metrics */

static bool line_past(const char *line, int step) {
    const char *k = strstr(line, "\"step\":");
    return k && atol(k + 7) > step;
}

hs_status hs_train_metrics_keep_until(const char *path, int step, hs_error *e) {
    FILE *in = fopen(path, "r");
    if (!in) return HS_OK;
    char tmp[HS_PATH_MAX + 48];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = hs_fopen(tmp, "w", "check that train.out_dir is writable", e);
    if (!out) return fclose(in), e->code;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, in) > 0)
        if (!line_past(line, step)) fputs(line, out);
    free(line);
    fclose(in);
    hs_status s = hs_fclose_written(out, tmp, "check the free space of train.out_dir", e);
    if (s == HS_OK && rename(tmp, path) != 0)
        s = hs_error_set(e, HS_ERR_IO, "cannot rewrite %s for the resumed run: %s", path,
                         hs_strerror_errno());
    if (s != HS_OK) remove(tmp);
    return s;
}
