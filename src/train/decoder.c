/* The next token's logits for generation and the end-of-run sample: with
 * the model's per-layer KV cache where the layout has one (model.h
 * "generation": one process, TP without sequence parallelism, FSDP, PP),
 * so a window runs once and each new token one row; else, or when asked,
 * the full forward over the window each token. Both give the same text
 * (docs/generate.md "KV cache"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/run.h"

hs_status hs_decoder_open(hs_decoder *d, hs_trainer *t, const char *who, bool use_cache,
                          hs_error *e) {
    *d = (hs_decoder){.t = t};
    hs_model *m = t->engine->model;
    char why[256] = "--no-kv-cache";
    for (int i = 0; i < t->T; i++) t->targets[i] = -1;
    /* the cached rows attend to every earlier row; the full forward keeps
     * the documents apart as training did */
    if (use_cache && t->cfg->data.document_masking) {
        snprintf(why, sizeof why, "data.document_masking: the cache does not keep documents apart");
        use_cache = false;
    }
    if (use_cache && hs_model_kv_supported(m, why, sizeof why)) {
        d->row = malloc(sizeof(float) * (size_t)t->cfg->model.vocab_size);
        if (!d->row) return hs_error_oom(e, "%s: the logits of one row", who);
        hs_status s = hs_kv_cache_create(m, &d->kv, e);
        if (s != HS_OK) return s;
        if (t->rank0)
            hs_log_info(t->log,
                        "%s: a KV cache of %lld bytes (%.2f MiB) on each rank, for up to %d "
                        "positions (%lld bytes a position)",
                        who, (long long)hs_kv_cache_bytes(m),
                        (double)hs_kv_cache_bytes(m) / (1024.0 * 1024.0), t->T,
                        (long long)hs_kv_cache_position_bytes(m));
        return HS_OK;
    }
    d->win = calloc((size_t)t->T, sizeof *d->win);
    if (!d->win) return hs_error_oom(e, "%s: a window of %d tokens", who, t->T);
    if (t->rank0) hs_log_info(t->log, "%s: a full forward per token (%s)", who, why);
    return HS_OK;
}

void hs_decoder_close(hs_decoder *d) {
    hs_kv_cache_free(d->kv);
    free(d->row);
    free(d->win);
    *d = (hs_decoder){0};
}

/* Causal attention: the rows after position len-1 cannot change it, so a
 * forward of the first len rows, rounded up to 64 (a multiple of tp_size
 * for sequence parallel) and at most the whole sequence, gives its logits.
 * Pipeline and context parallel layouts run whole sequences. */
static int window_rows(const hs_trainer *t, int len) {
    if (t->pp || t->cp > 1) return t->T;
    int g = 64 * t->cfg->accelerator.tp_size;
    int rows = (len + g - 1) / g * g;
    return rows < t->T ? rows : t->T;
}

static hs_status full_forward(hs_decoder *d, const int32_t *seq, int len, const float **logits,
                              hs_error *e) {
    hs_trainer *t = d->t;
    memcpy(d->win, seq, sizeof *d->win * (size_t)len);
    memset(d->win + len, 0, sizeof *d->win * (size_t)(t->T - len));
    int rows = window_rows(t, len);
    hs_status s;
    if (rows < t->T) {
        hs_batch b = {.tokens = d->win, .targets = t->targets, .B = 1, .T = rows};
        s = hs_model_forward(t->engine->model, &b, t->hooks, NULL, t->logits, e);
        if (s == HS_OK) s = hs_device_status(t->dev, e);
    } else {
        s = hs_train_forward(t, d->win, t->targets, 1, NULL, t->logits, e);
    }
    *logits = t->logits + (size_t)(len - 1) * t->cfg->model.vocab_size;
    return s;
}

/* The stage and local chunk of the model chunk `step` (+1 or -1) from
 * local chunk v; false past either end of the model. */
static bool home_of(const hs_trainer *t, int v, int step, int *stage, int *chunk) {
    hs_pp_schedule_kind kind = hs_pp_placement(t->pp);
    int c = hs_pp_model_chunk(kind, t->pp_size, t->pp_stage, v) + step;
    if (c < 0 || c >= t->pp_size * t->pp_virtual) return false;
    hs_pp_chunk_home(kind, t->pp_size, c, stage, chunk);
    return true;
}

/* The pipeline's chain on n rows, as hs_pp_forward_only runs it on a
 * batch: each chunk takes the previous one's rows (keyed by the receiving
 * chunk), runs with its blocks' cache and hands n rows on; the head's
 * stage broadcasts the last row's logits. */
static hs_status pp_cached(hs_decoder *d, const int32_t *tokens, int n, hs_error *e) {
    hs_trainer *t = d->t;
    hs_model *m = t->engine->model;
    hs_batch b = {.tokens = tokens, .B = 1, .T = n};
    int64_t numel = hs_model_stage_numel(m, &b);
    int other, ov;
    hs_dtype dt;
    for (int v = 0; v < hs_model_num_chunks(m); v++) {
        (void)hs_model_stage_input(m, v, 0, &dt);
        if (home_of(t, v, -1, &other, &ov)) hs_pp_post_recv_forward(t->pp, v, other, numel, dt, 0);
    }
    hs_status s = HS_OK;
    for (int v = 0; s == HS_OK && v < hs_model_num_chunks(m); v++) {
        if (home_of(t, v, -1, &other, &ov))
            s = hs_pp_take_forward(t->pp, v, hs_model_stage_input(m, v, 0, &dt), NULL, e);
        if (s == HS_OK)
            s = hs_model_stage_forward_cached(m, v, d->kv, tokens, n, t->hooks,
                                              hs_model_chunk_has_head(m, v) ? d->row : NULL, e);
        if (s == HS_OK && home_of(t, v, +1, &other, &ov)) {
            const void *out = hs_model_stage_output(m, v, 0, &dt);
            s = hs_pp_send_forward(t->pp, ov, other, out, numel, dt, NULL, 0, e);
        }
    }
    if (s == HS_OK) s = hs_pp_flush(t->pp, e);
    /* d->row is host memory: no stream */
    if (s == HS_OK)
        s = hs_pg_broadcast(t->pp_group, NULL, d->row, t->cfg->model.vocab_size, HS_DTYPE_F32,
                            hs_pp_head_stage(t), e);
    return s;
}

hs_status hs_decoder_next(hs_decoder *d, const int32_t *seq, int len, bool slid,
                          const float **logits, hs_error *e) {
    hs_trainer *t = d->t;
    HS_ASSERT(len >= 1 && len < t->T);
    if (!d->kv) return full_forward(d, seq, len, logits, e);
    /* positions re-based from 0 change every key: the window runs again */
    if (slid) hs_kv_cache_reset(d->kv);
    int from = hs_kv_cache_len(d->kv);
    HS_ASSERT(from < len);
    hs_status s = t->pp ? pp_cached(d, seq + from, len - from, e)
                        : hs_model_forward_cached(t->engine->model, d->kv, seq + from, len - from,
                                                  t->hooks, d->row, e);
    if (s == HS_OK) s = hs_device_status(t->dev, e);
    *logits = d->row;
    return s;
}
