/* ckpt/resume.c — what the trainer calls: tensor descriptors for whole and
 * FSDP-sharded tensors, the collective load, and checkpoint.resume. */
#include <string.h>

#include "ckpt/plan.h"
#include "hypershard/fsdp.h"

void hs_ckpt_tensor_full(hs_ckpt_tensor *t, const char *name, hs_dtype dt, int ndim,
                         const int64_t *shape, void *data) {
    HS_ASSERT(ndim >= 1 && ndim <= HS_CKPT_DIMS);
    memset(t, 0, sizeof *t);
    t->name = name;
    t->dtype = dt;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = t->size[d] = shape[d];
    t->data = data;
}

void hs_ckpt_tensor_dim0(hs_ckpt_tensor *t, const char *name, hs_dtype dt, int ndim,
                         const int64_t *shape, int w, int r, void *data) {
    hs_ckpt_tensor_full(t, name, dt, ndim, shape, data);
    t->offset[0] = hs_fsdp_row_offset(shape[0], w, r);
    t->size[0] = hs_fsdp_actual_rows(shape[0], w, r);
}

static hs_status load_local(const char *path, const hs_ckpt_tensor *targets, int n,
                            hs_ckpt_state *state, hs_error *e) {
    hs_ckpt *c = NULL;
    hs_status s = hs_ckpt_open(path, &c, e);
    if (s == HS_OK) s = hs_ckpt_read(c, targets, n, e);
    if (s == HS_OK && state) *state = *hs_ckpt_get_state(c);
    hs_ckpt_close(c);
    return s;
}

hs_status hs_ckpt_load(hs_comm *comm, const char *path, const hs_ckpt_tensor *targets, int n,
                       hs_ckpt_state *state, hs_error *e) {
    hs_status mine = load_local(path, targets, n, state, e);
    return hs_pg_agree(hs_comm_world(comm), mine, "checkpoint load", e);
}

hs_status hs_ckpt_resolve_resume(const hs_ckpt_config *cfg, char *path, size_t cap, bool *found,
                                 hs_error *e) {
    *found = false;
    if (!strcmp(cfg->resume, "none") || !cfg->resume[0]) return HS_OK;
    if (strcmp(cfg->resume, "auto") != 0) {
        hs_ckpt *c = NULL;
        hs_status s = hs_ckpt_open(cfg->resume, &c, e);
        if (s != HS_OK)
            return hs_error_append(e, HS_ERR_CONFIG,
                                   "checkpoint.resume = %s: not a loadable "
                                   "checkpoint (see above); use none, auto or a step directory",
                                   cfg->resume);
        snprintf(path, cap, "%s", hs_ckpt_path(c));
        hs_ckpt_close(c);
        return *found = true, HS_OK;
    }
    if (!cfg->dir[0])
        return hs_error_set(e, HS_ERR_CONFIG,
                            "checkpoint.resume = auto needs checkpoint.dir "
                            "(it is null); set checkpoint.dir or checkpoint.resume: none");
    char name[HS_PATH_MAX];
    bool have = false;
    if (!hs_ckpt_is_dir(cfg->dir)) return HS_OK; /* first run: nothing saved yet */
    if (hs_ckpt_latest_read(cfg->dir, name, sizeof name, &have, e) != HS_OK) return e->code;
    if (!have) return HS_OK;
    int n = snprintf(path, cap, "%s/%s", cfg->dir, name);
    if (n < 0 || (size_t)n >= cap)
        return hs_error_set(e, HS_ERR_CONFIG, "checkpoint.dir %s is too long", cfg->dir);
    char probe[HS_PATH_MAX * 2 + 64];
    snprintf(probe, sizeof probe, "%s/%s", path, HS_CKPT_METADATA);
    if (!hs_ckpt_is_file(probe))
        return hs_error_set(e, HS_ERR_IO,
                            "checkpoint.resume = auto: %s/%s names %s, which has "
                            "no %s; point `latest` at an existing step directory or use "
                            "checkpoint.resume: none",
                            cfg->dir, HS_CKPT_LATEST, path, HS_CKPT_METADATA);
    return *found = true, HS_OK;
}
