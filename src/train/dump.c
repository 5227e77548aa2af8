/* `hypershard train --dump DIR`: the full fp32 state of chosen moments of a
 * run, in Hugging Face names, so that any other implementation of the same
 * model can be checked against it tensor by tensor (docs/training.md):
 *
 *   weights-step<S>    the weights the run starts from (S = 0, or the step a
 *                      checkpoint resumed)
 *   logits-step<N>     the logits of the first sequence of global batch N-1,
 *                      computed with the weights step N starts from
 *   grads-step<N>      the gradient of step N's global-batch loss, before
 *                      clipping
 *   weights-step<N>    the weights after step N's optimizer update
 *   units-rank<R>.json rank R's FSDP unit listing (FSDP engine only)
 *
 * Gathering is collective under FSDP, so every rank calls these; rank 0 writes. */
#include <stdlib.h>
#include <string.h>

#include "train/run.h"

typedef hs_status (*dump_get_fn)(hs_engine *en, int param_index, float *out, hs_error *e);

const char *hs_dump_dir(const hs_trainer *t) {
    return t->opt && t->opt->dump_dir && t->opt->dump_dir[0] ? t->opt->dump_dir : NULL;
}

hs_status hs_dump_check(const hs_trainer *t, hs_error *e) {
    if (!hs_dump_dir(t) || t->engine->gather_full_grad) return HS_OK;
    return hs_error_set(e, HS_ERR_CONFIG,
                        "--dump %s: the %s engine cannot gather full gradients; dump from a "
                        "single-process run (mpiexec -n 1) of the same global batch",
                        hs_dump_dir(t), t->engine->name);
}

bool hs_dump_out_dir(const hs_trainer *t, hs_out_dir *d, char *what, size_t cap) {
    if (!hs_dump_dir(t)) return false;
    /* rank 0 writes the tensors: weights-step0, then weights and grads of
     * every step, and one sequence's logits */
    hs_checked ck = {0};
    int64_t steps = t->cfg->train.steps, values = t->plan_params;
    int64_t per_step =
        hs_ck_add(&ck, hs_ck_mul(&ck, 2, values), hs_ck_mul(&ck, t->T, t->cfg->model.vocab_size));
    int64_t bytes = hs_ck_mul(&ck, 4, hs_ck_add(&ck, values, hs_ck_mul(&ck, steps, per_step)));
    snprintf(what, cap, "the fp32 dumps of %lld steps take about %.1f MiB", (long long)steps,
             (double)bytes / (1 << 20));
    *d = (hs_out_dir){.what = "--dump",
                      .path = hs_dump_dir(t),
                      .bytes = t->rank0 ? bytes : 0,
                      .bytes_what = what};
    return true;
}

static int dump_tensor_total(hs_model *m) {
    int n = 0;
    for (int i = 0; i < hs_model_num_params(m); i++) n += hs_hf_tensor_count(hs_model_param(m, i));
    return n;
}

static hs_status dump_write(const hs_trainer *t, const char *kind, int step, hs_st_tensor *ts,
                            int n, const hs_st_meta *meta, int n_meta, hs_error *e) {
    char path[HS_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s-step%d.safetensors", hs_dump_dir(t), kind, step);
    hs_status s = hs_mkdirs(hs_dump_dir(t), e);
    if (s == HS_OK) s = hs_safetensors_write(path, ts, n, meta, n_meta, e);
    return s;
}

/* Parameter i as its Hugging Face tensors (E of them for stacked experts),
 * pointing into `full`. */
static void dump_describe(const hs_param *p, float *full, hs_st_tensor *ts) {
    int parts = hs_hf_tensor_count(p), skip = p->kind == HS_PARAM_EXPERT ? 1 : 0;
    int64_t part = hs_param_numel(p) / parts;
    for (int j = 0; j < parts; j++) {
        hs_st_tensor *x = &ts[j];
        hs_hf_tensor_name(p, j, x->name, sizeof x->name);
        x->dtype = HS_DTYPE_F32;
        x->ndim = p->ndim - skip;
        for (int d = skip; d < p->ndim; d++) x->shape[d - skip] = p->shape[d];
        x->data = full + j * part;
        x->bytes = sizeof(float) * (size_t)part;
    }
}

static hs_status dump_params(hs_trainer *t, const char *kind, int step, dump_get_fn get,
                             hs_error *e) {
    hs_model *m = hs_engine_catalog(t->engine);
    int np = hs_model_num_params(m), nt = dump_tensor_total(m), k = 0;
    hs_st_tensor *ts = calloc((size_t)nt + 1, sizeof *ts);
    float **bufs = calloc((size_t)np + 1, sizeof *bufs);
    hs_status s = ts && bufs ? HS_OK : hs_error_oom(e, "--dump %s: cannot allocate", kind);
    for (int i = 0; s == HS_OK && i < np; i++) {
        const hs_param *p = hs_model_param(m, i);
        bufs[i] = malloc(sizeof(float) * (size_t)(hs_param_numel(p) ? hs_param_numel(p) : 1));
        if (!bufs[i]) {
            s = hs_error_oom(e, "--dump %s: cannot allocate %s", kind, p->fqn);
            break;
        }
        s = get(t->engine, i, bufs[i], e);
        dump_describe(p, bufs[i], ts + k);
        k += hs_hf_tensor_count(p);
    }
    char step_str[24];
    snprintf(step_str, sizeof step_str, "%d", step);
    hs_st_meta meta[] = {{"format", "pt"}, {"step", step_str}};
    if (s == HS_OK && t->rank0) s = dump_write(t, kind, step, ts, nt, meta, 2, e);
    for (int i = 0; bufs && i < np; i++) free(bufs[i]);
    free(bufs);
    free(ts);
    return s;
}

hs_status hs_dump_units(hs_trainer *t, int rank, hs_error *e) {
    if (!hs_dump_dir(t) || !t->engine->write_units) return HS_OK;
    char path[HS_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/units-rank%d.json", hs_dump_dir(t), rank);
    hs_status s = hs_mkdirs(hs_dump_dir(t), e);
    FILE *f = s == HS_OK ? fopen(path, "w") : NULL;
    if (s == HS_OK && !f) return hs_error_set(e, HS_ERR_IO, "--dump: cannot write %s", path);
    if (s != HS_OK) return s;
    t->engine->write_units(t->engine, f);
    return hs_fclose_written(f, path, "check the free space of the --dump directory", e);
}

hs_status hs_dump_weights(hs_trainer *t, int step, hs_error *e) {
    return dump_params(t, "weights", step, t->engine->gather_full, e);
}

hs_status hs_dump_grads(hs_trainer *t, int step, hs_error *e) {
    return dump_params(t, "grads", step, t->engine->gather_full_grad, e);
}

/* One extra forward of a single sequence: the training forward turns its
 * logits into their gradient in place, so they cannot be read from there. */
hs_status hs_dump_logits(hs_trainer *t, int step, hs_error *e) {
    int64_t seq = hs_data_batch_sequence(t->data, step - 1, t->G, 0);
    hs_data_sequence(t->data, seq, t->tokens, t->targets);
    double loss_sum = 0.0;
    hs_status s = hs_train_forward(t, t->tokens, t->targets, 1, &loss_sum, t->logits, e);
    if (s != HS_OK || !t->rank0) return s;
    hs_st_tensor x = {.name = "logits",
                      .dtype = HS_DTYPE_F32,
                      .ndim = 2,
                      .shape = {t->T, t->cfg->model.vocab_size},
                      .data = t->logits};
    x.bytes = sizeof(float) * (size_t)t->T * (size_t)t->cfg->model.vocab_size;
    char seq_str[24], step_str[24];
    snprintf(seq_str, sizeof seq_str, "%lld", (long long)seq);
    snprintf(step_str, sizeof step_str, "%d", step);
    hs_st_meta meta[] = {{"format", "pt"}, {"step", step_str}, {"sequence", seq_str}};
    return dump_write(t, "logits", step, &x, 1, meta, 3, e);
}
