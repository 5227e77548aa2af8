/* The optimizer object: validation, state allocation, the step loop and the
 * state accessors the checkpoint layer uses. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim_impl.h"

static const char *const adamw_state_names[] = {"exp_avg", "exp_avg_sq"};
static const char *const muon_state_names[] = {"momentum_buffer"};

static hs_status check_config(const hs_optim_config *c, hs_error *e) {
    if (strcmp(c->target, "adamw") != 0 && strcmp(c->target, "muon") != 0)
        hs_error_append(e, HS_ERR_CONFIG,
                        "optimizer.target: '%s' is not an optimizer; use 'adamw' or 'muon'",
                        c->target);
    if (!(c->lr >= 0.0) || !isfinite(c->lr))
        hs_error_append(e, HS_ERR_CONFIG, "optimizer.lr: %g must be a finite number >= 0", c->lr);
    for (int i = 0; i < 2; i++)
        if (!(c->betas[i] >= 0.0 && c->betas[i] < 1.0))
            hs_error_append(e, HS_ERR_CONFIG,
                            "optimizer.betas[%d]: %g must be in [0, 1) (typical: 0.9, 0.95)", i,
                            c->betas[i]);
    if (!(c->eps >= 0.0))
        hs_error_append(e, HS_ERR_CONFIG, "optimizer.eps: %g must be >= 0 (typical: 1e-8)", c->eps);
    if (!(c->weight_decay >= 0.0))
        hs_error_append(e, HS_ERR_CONFIG, "optimizer.weight_decay: %g must be >= 0",
                        c->weight_decay);
    if (strcmp(c->target, "muon") == 0) {
        if (!(c->muon.momentum >= 0.0 && c->muon.momentum < 1.0))
            hs_error_append(e, HS_ERR_CONFIG,
                            "optimizer.muon.momentum: %g must be in [0, 1) (typical: 0.95)",
                            c->muon.momentum);
        if (c->muon.ns_steps < 1)
            hs_error_append(e, HS_ERR_CONFIG,
                            "optimizer.muon.ns_steps: %d must be >= 1 (typical: 5)",
                            c->muon.ns_steps);
    }
    const char *d = c->schedule.decay;
    if (strcmp(d, "constant") && strcmp(d, "linear") && strcmp(d, "cosine"))
        hs_error_append(e, HS_ERR_CONFIG,
                        "optimizer.schedule.decay: '%s' is unknown; use constant, linear or cosine",
                        d);
    if (c->schedule.warmup_steps < 0)
        hs_error_append(e, HS_ERR_CONFIG, "optimizer.schedule.warmup_steps: %d must be >= 0",
                        c->schedule.warmup_steps);
    if (!(c->schedule.min_lr_ratio >= 0.0 && c->schedule.min_lr_ratio <= 1.0))
        hs_error_append(e, HS_ERR_CONFIG, "optimizer.schedule.min_lr_ratio: %g must be in [0, 1]",
                        c->schedule.min_lr_ratio);
    return e->code;
}

static void check_gathered(const hs_optim_param *p, int i, const char *fqn, hs_error *e) {
    const hs_optim_gather *g = &p->gather;
    int64_t fc = g->full_cols ? g->full_cols : p->cols;
    if (p->rows < 0 || p->cols <= 0 || g->full_rows < 1 || p->numel != p->rows * p->cols ||
        g->row_offset < 0 || g->row_offset + p->rows > g->full_rows ||
        g->buffer_rows < g->full_rows || g->col_offset < 0 || g->col_offset + p->cols > fc)
        hs_error_append(e, HS_ERR_INTERNAL,
                        "optimizer param %d '%s': Muon on a row shard needs numel (%lld) = rows x "
                        "cols (%lld x %lld) and rows [%lld, +%lld) inside the %lld full rows "
                        "(gather buffer %lld rows); pass the shard's place in the matrix",
                        i, fqn, (long long)p->numel, (long long)p->rows, (long long)p->cols,
                        (long long)g->row_offset, (long long)p->rows, (long long)g->full_rows,
                        (long long)g->buffer_rows);
}

static void check_param(const hs_optim_param *p, int i, bool muon, hs_error *e) {
    const char *fqn = p->fqn ? p->fqn : "(unnamed)";
    if (p->numel < 0 || !hs_dtype_is_float(p->dtype)) {
        hs_error_append(e, HS_ERR_INTERNAL, "optimizer param %d '%s': numel %lld, dtype %d invalid",
                        i, fqn, (long long)p->numel, (int)p->dtype);
        return;
    }
    if (p->numel > 0 && (p->data == NULL || (p->grad == NULL && !p->frozen)))
        hs_error_append(e, HS_ERR_INTERNAL,
                        "optimizer param %d '%s': %lld elements but no %s buffer", i, fqn,
                        (long long)p->numel, p->data == NULL ? "data" : "grad");
    if (muon && p->gather.all_gather_rows) {
        check_gathered(p, i, fqn, e);
        return;
    }
    if (muon && p->numel > 0 &&
        (p->rows <= 0 || p->cols <= 0 || p->numel % (p->rows * p->cols) != 0))
        hs_error_append(e, HS_ERR_INTERNAL,
                        "optimizer param %d '%s': Muon needs numel (%lld) to be a multiple of "
                        "rows x cols (%lld x %lld); pass the matrix shape, or mark it muon=false",
                        i, fqn, (long long)p->numel, (long long)p->rows, (long long)p->cols);
}

/* The states' memory: the device's (its caching allocator) when pool is
 * its device pool, its host allocator when pool is its host pool (offload),
 * else pool itself (a caller counting the bytes, or the optimizer's own).
 * Every way counts the bytes asked for in that pool. */
static void *state_alloc(hs_optim *o, size_t bytes) {
    if (o->pool == &o->dev->device_pool) return hs_device_alloc(o->dev, bytes);
    if (o->pool == &o->dev->host_pool) return hs_host_alloc(o->dev, bytes);
    return hs_pool_alloc(o->pool, bytes);
}

/* The report of a failed state_alloc: `what` of parameter `fqn`. */
static hs_status state_oom(hs_optim *o, size_t bytes, const char *what, const char *fqn,
                           hs_error *e) {
    char buf[384];
    snprintf(buf, sizeof buf, "the optimizer's %s of %s", what, fqn);
    if (o->pool == &o->dev->device_pool) return hs_device_oom(o->dev, bytes, buf, e);
    return hs_pool_oom(o->pool, bytes, buf, e);
}

static void state_free(hs_optim *o, void *p) {
    if (o->pool == &o->dev->device_pool) hs_device_free_mem(o->dev, p);
    else if (o->pool == &o->dev->host_pool) hs_host_free(o->dev, p);
    else hs_pool_free(o->pool, p);
}

/* n_states counts only the states allocated, so hs_optim_free frees a
 * slot that failed half way. */
static hs_status slot_init(hs_optim *o, optim_slot *s, const hs_optim_param *p, bool use_muon,
                           hs_error *e) {
    s->p = *p;
    const char *fqn = p->fqn ? p->fqn : "";
    s->fqn_copy = strdup(fqn);
    if (s->fqn_copy == NULL)
        return hs_error_oom(e, "copying the optimizer's name of %s: %zu bytes", fqn,
                            strlen(fqn) + 1);
    s->p.fqn = s->fqn_copy;
    s->rule = use_muon ? OPTIM_RULE_MUON : OPTIM_RULE_ADAMW;
    int n_states = p->frozen ? 0 : use_muon ? 1 : 2;
    size_t bytes = (size_t)p->numel * sizeof(float);
    for (int k = 0; k < n_states; k++) {
        s->state[k] = state_alloc(o, bytes);
        if (s->state[k] == NULL)
            return state_oom(o, bytes, use_muon ? muon_state_names[k] : adamw_state_names[k], fqn,
                             e);
        s->n_states = k + 1;
        hs_dev_zero(o->dev, s->state[k], bytes);
    }
    return HS_OK;
}

hs_status hs_optim_create(const hs_optim_config *cfg, const hs_optim_param *params, int n,
                          hs_device *dev, hs_pool *pool, hs_optim **out, hs_error *e) {
    *out = NULL;
    hs_error_clear(e);
    if (check_config(cfg, e) != HS_OK) return e->code;
    bool muon = strcmp(cfg->target, "muon") == 0;
    for (int i = 0; i < n; i++) check_param(&params[i], i, muon && params[i].muon, e);
    if (e->code != HS_OK) return e->code;
    hs_optim *o = calloc(1, sizeof *o);
    optim_slot *slots = calloc(n > 0 ? (size_t)n : 1, sizeof *slots);
    hs_adamw_tensor *adamw = calloc(n > 0 ? (size_t)n : 1, sizeof *adamw);
    if (o == NULL || slots == NULL || adamw == NULL) {
        free(o), free(slots), free(adamw);
        return hs_error_oom(e, "cannot allocate the optimizer for %d params", n);
    }
    o->adamw = adamw;
    o->cfg = *cfg;
    if (dev == NULL && hs_device_create(HS_DEVICE_CPU, NULL, &o->own_dev, e) != HS_OK) {
        free(o), free(slots), free(adamw);
        return e->code;
    }
    o->dev = dev ? dev : o->own_dev;
    hs_pool_init(&o->own_pool, "optimizer");
    o->pool = pool ? pool : &o->own_pool;
    o->n = n;
    o->slots = slots;
    int64_t work = 0;
    hs_status st = HS_OK;
    for (int i = 0; i < n && st == HS_OK; i++) {
        /* An empty shard keeps Muon's state names, like its other shards. */
        bool use_muon = muon && params[i].muon && !params[i].frozen;
        st = slot_init(o, &slots[i], &params[i], use_muon, e);
        if (use_muon && hs_muon_work_floats(&params[i]) > work)
            work = hs_muon_work_floats(&params[i]);
    }
    if (st == HS_OK && work > 0) {
        o->muon_work = state_alloc(o, (size_t)work * sizeof(float));
        if (!o->muon_work)
            st = state_oom(o, (size_t)work * sizeof(float), "Muon workspace", "its largest matrix",
                           e);
    }
    if (st != HS_OK) {
        hs_optim_free(o);
        return st;
    }
    *out = o;
    return HS_OK;
}

void hs_optim_free(hs_optim *o) {
    if (o == NULL) return;
    for (int i = 0; i < o->n; i++) {
        for (int k = 0; k < o->slots[i].n_states; k++) state_free(o, o->slots[i].state[k]);
        free(o->slots[i].fqn_copy);
    }
    if (o->muon_work) state_free(o, o->muon_work);
    free(o->slots);
    free(o->adamw);
    hs_device_free(o->own_dev);
    free(o);
}

/* Every AdamW parameter in one adamw_many (a GPU launches once for all),
 * each with its own decay factor; the others as before. */
static void adamw_step_all(hs_optim *o, double lr) {
    hs_adamw_tensor *t = o->adamw;
    adamw_coef decayed = hs_adamw_coef(&o->cfg, o->step, lr, true);
    adamw_coef plain = hs_adamw_coef(&o->cfg, o->step, lr, false);
    int n = 0;
    for (int i = 0; i < o->n; i++) {
        optim_slot *s = &o->slots[i];
        if (s->p.frozen || s->rule == OPTIM_RULE_MUON || s->p.numel == 0) continue;
        adamw_coef *c = s->p.decay ? &decayed : &plain;
        t[n++] = (hs_adamw_tensor){.p = s->p.data,
                                   .pdt = s->p.dtype,
                                   .m = s->state[0],
                                   .v = s->state[1],
                                   .g = s->p.grad,
                                   .n = s->p.numel,
                                   .decay_factor = c->decay_factor,
                                   .copy = s->p.copy,
                                   .copy_dt = s->p.copy_dtype};
    }
    if (n > 0) o->dev->k->adamw_many(o->dev->stream, t, n, &decayed);
}

hs_status hs_optim_step(hs_optim *o, double lr, hs_error *e) {
    hs_error local;
    if (!e) e = &local;
    o->step++;
    for (int i = 0; i < o->n; i++) {
        optim_slot *s = &o->slots[i];
        if (s->p.frozen) continue; /* on every rank alike: no gather to join */
        /* An empty row shard still joins its matrix's gather. */
        if (s->p.numel == 0 && !(s->rule == OPTIM_RULE_MUON && s->p.gather.all_gather_rows))
            continue;
        if (s->rule == OPTIM_RULE_MUON) {
            hs_status st =
                hs_muon_step_param(o->dev, &o->cfg, &s->p, s->state[0], lr, o->muon_work, e);
            if (st != HS_OK) return st;
            if (s->p.copy)
                hs_dev_convert(o->dev, s->p.copy, s->p.copy_dtype, s->p.data, s->p.dtype,
                               s->p.numel);
        }
    }
    adamw_step_all(o, lr);
    return HS_OK;
}

int64_t hs_optim_step_count(const hs_optim *o) { return o->step; }

void hs_optim_set_step_count(hs_optim *o, int64_t step) {
    HS_ASSERT(step >= 0);
    o->step = step;
}

int hs_optim_state_count(const hs_optim *o, int param_index) {
    HS_ASSERT(param_index >= 0 && param_index < o->n);
    return o->slots[param_index].n_states;
}

const char *hs_optim_state_name(const hs_optim *o, int param_index, int k) {
    HS_ASSERT(k >= 0 && k < hs_optim_state_count(o, param_index));
    const optim_slot *s = &o->slots[param_index];
    return s->rule == OPTIM_RULE_MUON ? muon_state_names[k] : adamw_state_names[k];
}

float *hs_optim_state_data(hs_optim *o, int param_index, int k) {
    HS_ASSERT(k >= 0 && k < hs_optim_state_count(o, param_index));
    return o->slots[param_index].state[k];
}
