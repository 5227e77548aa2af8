/* Model weights <-> a Hugging Face safetensors directory. Names are the
 * model's FQNs; stacked routed experts [E, out, in] are split into E
 * per-expert tensors on save and stacked back on load. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hypershard/ckpt.h"

#define EXPERTS_TAG ".experts."

int hs_hf_tensor_count(const hs_param *p) {
    return p->kind == HS_PARAM_EXPERT ? (int)p->shape[0] : 1;
}

void hs_hf_tensor_name(const hs_param *p, int j, char *buf, size_t cap) {
    const char *tag = p->kind == HS_PARAM_EXPERT ? strstr(p->fqn, EXPERTS_TAG) : NULL;
    if (!tag) {
        snprintf(buf, cap, "%s", p->fqn);
        return;
    }
    /* "...experts.w1.weight" -> "...experts.<j>.w1.weight" */
    int prefix = (int)(tag - p->fqn) + (int)strlen(EXPERTS_TAG);
    snprintf(buf, cap, "%.*s%d.%s", prefix, p->fqn, j, p->fqn + prefix);
}

/* DeepSeek's interleaved RoPE (model.mla.rope_interleave): a file's rope
 * rows rotate pairs (r0, r1), (r2, r3), ...; the model's rotate_half's
 * halves (r0, r2, ... | r1, r3, ...). Which rows of p are rope rows: `runs`
 * runs of R rows, the first at row `first`, one every `step` rows. False:
 * none. */
static bool rope_rows(const hs_model_config *c, const hs_param *p, int *runs, int *first, int *step,
                      int *R) {
    if (!hs_model_arch_mla(c) || !c->mla.rope_interleave || p->ndim != 2) return false;
    const hs_mla_config *a = &c->mla;
    size_t n = strlen(p->fqn);
    const char *q[] = {"self_attn.q_b_proj.weight", "self_attn.q_proj.weight"};
    const char *kv = "self_attn.kv_a_proj_with_mqa.weight";
    bool is_q = false;
    for (int i = 0; i < 2; i++)
        is_q |= n > strlen(q[i]) && !strcmp(p->fqn + n - strlen(q[i]), q[i]);
    bool is_kv = n > strlen(kv) && !strcmp(p->fqn + n - strlen(kv), kv);
    if (!is_q && !is_kv) return false;
    *R = a->qk_rope_head_dim;
    *step = a->qk_nope_head_dim + a->qk_rope_head_dim;
    *first = is_q ? a->qk_nope_head_dim : a->kv_lora_rank;
    *runs = is_q ? c->n_heads : 1;
    return true;
}

/* The file's row order into the model's (to_model), or back, in place. */
static bool rope_reorder(const hs_model_config *c, const hs_param *p, float *w, bool to_model) {
    int runs, first, step, R;
    if (!rope_rows(c, p, &runs, &first, &step, &R)) return true;
    int64_t cols = p->shape[1];
    float *tmp = malloc(sizeof(float) * (size_t)(R * cols));
    if (!tmp) return false;
    for (int h = 0; h < runs; h++) {
        float *rows = w + ((int64_t)h * step + first) * cols;
        for (int i = 0; i < R; i++) {
            /* file row 2j + b is model row j + b R / 2 */
            int file = i, model = i / 2 + (i % 2) * (R / 2);
            int src = to_model ? file : model, dst = to_model ? model : file;
            memcpy(tmp + (int64_t)dst * cols, rows + (int64_t)src * cols, sizeof(float) * cols);
        }
        memcpy(rows, tmp, sizeof(float) * (size_t)(R * cols));
    }
    free(tmp);
    return true;
}

/* One HF tensor's shape: the param's, less the expert dim when split. */
static void hf_tensor_shape(const hs_param *p, int *ndim, int64_t *shape) {
    int skip = p->kind == HS_PARAM_EXPERT ? 1 : 0;
    *ndim = p->ndim - skip;
    for (int d = skip; d < p->ndim; d++) shape[d - skip] = p->shape[d];
}

static int hf_total_tensors(hs_model *m) {
    int total = 0;
    for (int i = 0; i < hs_model_num_params(m); i++)
        total += hs_hf_tensor_count(hs_model_param(m, i));
    return total;
}

static hs_status hf_write_files(hs_model *m, hs_st_tensor *tensors, int n, hs_dtype dt,
                                int max_position, const char *dir, hs_error *e) {
    hs_status s = hs_mkdirs(dir, e);
    if (s != HS_OK) return s;
    char path[HS_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    hs_st_meta meta[] = {{"format", "pt"}};
    s = hs_safetensors_write(path, tensors, n, meta, 1, e);
    if (s != HS_OK) return s;
    snprintf(path, sizeof path, "%s/config.json", dir);
    return hs_hf_config_write(hs_model_config_of(m), max_position, hs_dtype_name(dt), path, e);
}

hs_status hs_hf_save(hs_model *m, hs_param_get_fn get, void *ctx, hs_dtype dt, int max_position,
                     const char *dir, bool write, hs_error *e) {
    int n = hf_total_tensors(m), k = 0;
    hs_st_tensor *tensors = calloc((size_t)n + 1, sizeof *tensors);
    if (!tensors) return hs_error_oom(e, "export %s: cannot allocate", dir);
    hs_status s = HS_OK;
    for (int i = 0; s == HS_OK && i < hs_model_num_params(m); i++) {
        const hs_param *p = hs_model_param(m, i);
        int64_t numel = hs_param_numel(p);
        float *full = malloc(sizeof(float) * (size_t)(numel ? numel : 1));
        if (!full) {
            s = hs_error_oom(e, "export: cannot allocate %s", p->fqn);
            break;
        }
        s = get(ctx, i, full, e);
        if (s == HS_OK && !rope_reorder(hs_model_config_of(m), p, full, false))
            s = hs_error_oom(e, "export: cannot allocate %s's rope rows", p->fqn);
        int parts = hs_hf_tensor_count(p);
        int64_t part_numel = numel / parts;
        for (int j = 0; s == HS_OK && write && j < parts; j++, k++) {
            hs_st_tensor *t = &tensors[k];
            hs_hf_tensor_name(p, j, t->name, sizeof t->name);
            t->dtype = dt;
            hf_tensor_shape(p, &t->ndim, t->shape);
            t->bytes = (size_t)part_numel * hs_dtype_size(dt);
            void *buf = malloc(t->bytes ? t->bytes : 1);
            if (!buf) {
                s = hs_error_oom(e, "export: cannot allocate %s", t->name);
                break;
            }
            hs_convert(buf, dt, full + j * part_numel, HS_DTYPE_F32, part_numel);
            t->data = buf;
        }
        free(full);
    }
    if (s == HS_OK && write) s = hf_write_files(m, tensors, n, dt, max_position, dir, e);
    for (int i = 0; i < n; i++) free((void *)tensors[i].data);
    free(tensors);
    return s;
}

/* ------------------------------------------------------------------ load */

static hs_status hf_check_tensor(const char *path, const hs_param *p, const hs_st_tensor *t,
                                 const char *name, hs_error *e) {
    int ndim;
    int64_t shape[HS_TENSOR_MAX_DIMS];
    hf_tensor_shape(p, &ndim, shape);
    char want[64], have[64];
    hs_shape_str(ndim, shape, want, sizeof want);
    if (!t)
        return hs_error_append(e, HS_ERR_FORMAT,
                               "%s: tensor %s (parameter %s, shape %s) is missing; the file was "
                               "written for a different model config",
                               path, name, p->fqn, want);
    bool same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        hs_shape_str(t->ndim, t->shape, have, sizeof have);
        return hs_error_append(e, HS_ERR_FORMAT,
                               "%s: tensor %s has shape %s but parameter %s needs %s; make the "
                               "model config match the weights (see config.json)",
                               path, name, have, p->fqn, want);
    }
    return HS_OK;
}

/* Every tensor of the file must be claimed by some parameter. */
static void hf_check_unexpected(hs_model *m, const hs_st_file *f, const char *path, hs_error *e) {
    for (int t = 0; t < hs_safetensors_count(f); t++) {
        const char *name = hs_safetensors_tensor(f, t)->name;
        bool known = false;
        char buf[HS_ST_NAME_MAX];
        for (int i = 0; !known && i < hs_model_num_params(m); i++) {
            const hs_param *p = hs_model_param(m, i);
            for (int j = 0; !known && j < hs_hf_tensor_count(p); j++) {
                hs_hf_tensor_name(p, j, buf, sizeof buf);
                known = !strcmp(buf, name);
            }
        }
        /* Tied checkpoints may carry a copy of the embedding as lm_head. */
        if (!known && hs_model_config_of(m)->tie_embeddings && !strcmp(name, "lm_head.weight"))
            known = true;
        if (!known)
            hs_error_append(e, HS_ERR_FORMAT,
                            "%s: tensor %s is not a parameter of this model; the file was written "
                            "for a different model config",
                            path, name);
    }
}

static hs_status hf_check_all(hs_model *m, const hs_st_file *f, const char *path, hs_error *e) {
    hs_error_clear(e);
    char name[HS_ST_NAME_MAX];
    for (int i = 0; i < hs_model_num_params(m); i++) {
        const hs_param *p = hs_model_param(m, i);
        for (int j = 0; j < hs_hf_tensor_count(p); j++) {
            hs_hf_tensor_name(p, j, name, sizeof name);
            hf_check_tensor(path, p, hs_safetensors_find(f, name), name, e);
        }
    }
    hf_check_unexpected(m, f, path, e);
    return e->code;
}

/* Imported weights must be finite: a NaN or Inf would train into NaN
 * everywhere, steps later and far from its cause. */
static hs_status hf_check_finite(const char *path, const char *name, const float *v, int64_t n,
                                 hs_error *e) {
    int64_t i = hs_first_nonfinite_f32(v, n);
    if (i < 0) return HS_OK;
    return hs_error_set(e, HS_ERR_FORMAT,
                        "%s: tensor %s holds %s at element %lld (the first); the weights are "
                        "corrupt or come from a diverged run, so they are not loaded",
                        path, name,
                        isnan(v[i]) ? "NaN"
                        : v[i] > 0  ? "+Inf"
                                    : "-Inf",
                        (long long)i);
}

/* The file's bytes of parameter p when they are its values as set takes
 * them (one fp32 tensor, aligned): read in place, nothing copied. NULL
 * otherwise. */
static const float *hf_in_place(const hs_st_tensor *t, int parts) {
    bool ok = parts == 1 && t->dtype == HS_DTYPE_F32 && (uintptr_t)t->data % sizeof(float) == 0;
    return ok ? (const float *)t->data : NULL;
}

hs_status hs_hf_load(hs_model *m, const char *dir, hs_param_set_fn set, void *ctx, hs_error *e) {
    return hs_hf_load_borrowing(m, dir, set, NULL, ctx, NULL, e);
}

hs_status hs_hf_load_borrowing(hs_model *m, const char *dir, hs_param_set_fn set,
                               hs_param_borrow_fn borrow, void *ctx, hs_st_file **kept,
                               hs_error *e) {
    if (kept) *kept = NULL;
    char path[HS_PATH_MAX + 32];
    struct stat st;
    bool is_dir = stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
    if (is_dir) hs_safetensors_dir_path(dir, path, sizeof path);
    else snprintf(path, sizeof path, "%s", dir);
    hs_st_file *f = NULL;
    hs_status s = is_dir ? hs_safetensors_open_dir(dir, &f, e) : hs_safetensors_open(path, &f, e);
    if (s != HS_OK) return s;
    s = hf_check_all(m, f, path, e);
    char name[HS_ST_NAME_MAX];
    /* One conversion buffer, grown to the largest parameter that needs it:
     * a fresh one per parameter would fault in new pages each time. */
    float *buf = NULL;
    int64_t cap = 0;
    int borrowed = 0;
    for (int i = 0; s == HS_OK && i < hs_model_num_params(m); i++) {
        const hs_param *p = hs_model_param(m, i);
        int64_t numel = hs_param_numel(p);
        int parts = hs_hf_tensor_count(p);
        hs_hf_tensor_name(p, 0, name, sizeof name);
        int runs, first, step, R;
        bool reorder = rope_rows(hs_model_config_of(m), p, &runs, &first, &step, &R);
        const float *full = reorder ? NULL : hf_in_place(hs_safetensors_find(f, name), parts);
        if (full) s = hf_check_finite(path, name, full, numel, e);
        else {
            if (numel > cap) {
                free(buf);
                cap = numel > 0 ? numel : 1;
                buf = malloc(sizeof(float) * (size_t)cap);
                if (!buf) {
                    s = hs_error_oom(e, "%s: cannot allocate %s", path, p->fqn);
                    break;
                }
            }
            for (int j = 0; s == HS_OK && j < parts; j++) {
                hs_hf_tensor_name(p, j, name, sizeof name);
                float *part = buf + j * (numel / parts);
                hs_st_to_f32(hs_safetensors_find(f, name), part);
                s = hf_check_finite(path, name, part, numel / parts, e);
            }
            if (s == HS_OK && !rope_reorder(hs_model_config_of(m), p, buf, true))
                s = hs_error_oom(e, "%s: cannot allocate %s's rope rows", path, p->fqn);
            full = buf;
        }
        if (s == HS_OK && full != buf && borrow && kept && borrow(ctx, i, full)) borrowed++;
        else if (s == HS_OK) s = set(ctx, i, full, e);
    }
    free(buf);
    /* also after a failure: parameters taken before it still point here */
    if (borrowed > 0) *kept = f;
    else hs_safetensors_close(f);
    return s;
}
