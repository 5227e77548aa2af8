/* Inference on trained weights: a continuation of a prompt (greedy or
 * sampled with temperature and top-k; each token's logits from the
 * decoder, decoder.c) and the validation loss, through the trainer's model
 * in whatever layout the config gives (train.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/run.h"

/* A trainer with its weights loaded and nothing written, forward only
 * (opt's copy in *fwd says inference: no optimizer, no gradients; and for
 * generate, no_data). */
static hs_status open_trainer(hs_trainer *t, const hs_config *cfg, const hs_topology *topo,
                              hs_comm *comm, const hs_train_options *opt, hs_train_options *fwd,
                              bool no_data, const hs_log *log, hs_error *e) {
    *fwd = *opt;
    fwd->inference = true;
    fwd->no_data = no_data;
    *t = (hs_trainer){.cfg = cfg,
                      .topo = topo,
                      .opt = fwd,
                      .comm = comm,
                      .log = log,
                      .trace = hs_comm_trace(comm),
                      .rank0 = hs_comm_rank(comm) == 0};
    return hs_trainer_open(t, e);
}

/* The next token from one row of logits: argmax at temperature 0, else a
 * draw from softmax(logits / temperature) over the top_k largest. The
 * uniform draw is counter-based (seed, step), the same on every rank. */
static int32_t next_token(const float *logits, int V, const hs_generate_options *g, int step,
                          float *scratch) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (g->temperature <= 0.0) return best;
    float cut = -INFINITY;
    if (g->top_k > 0 && g->top_k < V) { /* the k-th largest: a partial selection */
        for (int i = 0; i < V; i++) scratch[i] = logits[i];
        for (int k = 0; k < g->top_k; k++) {
            int m = k;
            for (int i = k + 1; i < V; i++)
                if (scratch[i] > scratch[m]) m = i;
            float tmp = scratch[k];
            scratch[k] = scratch[m], scratch[m] = tmp;
        }
        cut = scratch[g->top_k - 1];
    }
    double sum = 0.0, inv = 1.0 / g->temperature;
    for (int i = 0; i < V; i++)
        sum += logits[i] >= cut ? exp((double)(logits[i] - logits[best]) * inv) : 0.0;
    double u = (double)hs_rng_uniform(g->seed, 0x67656e, (uint64_t)step) * sum, acc = 0.0;
    for (int i = 0; i < V; i++) {
        if (logits[i] < cut) continue;
        acc += exp((double)(logits[i] - logits[best]) * inv);
        if (acc >= u) return i;
    }
    return best;
}

hs_status hs_train_generate(const hs_config *cfg, const hs_topology *topo, hs_comm *comm,
                            const hs_train_options *opt, const hs_log *log,
                            const hs_generate_options *g, int32_t *out, hs_error *e) {
    hs_trainer t;
    hs_train_options fwd;
    hs_decoder d = {0};
    hs_status s = open_trainer(&t, cfg, topo, comm, opt, &fwd, true, log, e);
    int T = cfg->train.seq_len, V = cfg->model.vocab_size;
    int32_t *seq = calloc((size_t)T, sizeof *seq);
    float *scratch = malloc(sizeof(float) * (size_t)V);
    if (s == HS_OK && (!seq || !scratch))
        s = hs_error_oom(e, "generate: cannot allocate %d tokens", T);
    if (s == HS_OK) s = hs_decoder_open(&d, &t, "generate", !g->no_kv_cache, e);
    /* The window: the prompt's last T - 1 tokens, so one more fits. */
    int len = g->prompt_len < T ? g->prompt_len : T - 1;
    if (s == HS_OK) memcpy(seq, g->prompt + (g->prompt_len - len), sizeof *seq * (size_t)len);
    double t0 = hs_now();
    int made = 0;
    for (int n = 0; s == HS_OK && n < g->max_new_tokens; n++) {
        bool slide = len == T;
        if (slide) { /* drop the oldest token: the positions re-base from 0 */
            memmove(seq, seq + 1, sizeof *seq * (size_t)(T - 1));
            len--;
        }
        const float *logits = NULL;
        s = hs_decoder_next(&d, seq, len, slide, &logits, e);
        if (s != HS_OK) break;
        int32_t tok = next_token(logits, V, g, n, scratch);
        out[n] = seq[len++] = tok;
        if (t.rank0 && g->emit) g->emit(g->emit_ctx, tok);
        made++;
    }
    double dt = hs_now() - t0;
    if (s == HS_OK && t.rank0 && made > 0)
        hs_log_info(log, "generate: %d tokens in %.3f s (%.1f tokens/s)", made, dt,
                    dt > 0 ? made / dt : 0.0);
    hs_decoder_close(&d);
    free(seq);
    free(scratch);
    hs_trainer_close(&t);
    return s;
}

hs_status hs_train_eval(const hs_config *cfg, const hs_topology *topo, hs_comm *comm,
                        const hs_train_options *opt, const hs_log *log, double *val_loss,
                        hs_error *e) {
    hs_trainer t;
    hs_train_options fwd;
    hs_status s = open_trainer(&t, cfg, topo, comm, opt, &fwd, false, log, e);
    if (s == HS_OK && hs_data_num_val(t.data) == 0)
        s = hs_error_set(e, HS_ERR_CONFIG,
                         "eval: the data has no validation sequences; set "
                         "data.val_fraction > 0 (data.source %s)",
                         cfg->data.source);
    if (s == HS_OK) s = hs_evaluate(&t, val_loss, e);
    hs_trainer_close(&t);
    return s;
}
