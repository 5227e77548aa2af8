/* Evaluation on a fixed validation set and a greedy sample, so a person sees
 * both a number and the text the model now produces. */
#include <stdlib.h>
#include <string.h>

#include "train/run.h"

#define EVAL_SEQUENCES 32
#define SAMPLE_PROMPT 24
#define SAMPLE_MAX_NEW 96

/* The set is the first min(V, EVAL_SEQUENCES) validation sequences whatever
 * the number of ranks. Every rank runs the same number of forwards
 * (collectives under FSDP); slots past the set are padded with sequences
 * whose targets are all ignored. */
static void eval_fill(hs_trainer *t, int64_t first, int64_t count) {
    int64_t n_train = hs_data_num_train(t->data);
    for (int i = 0; i < t->mbs; i++) {
        int32_t *tok = t->tokens + (size_t)i * t->T, *tgt = t->targets + (size_t)i * t->T;
        hs_data_sequence(t->data, n_train + (first + i < count ? first + i : 0), tok, tgt);
        if (first + i >= count)
            for (int k = 0; k < t->T; k++) tgt[k] = -1;
    }
}

hs_status hs_evaluate(hs_trainer *t, double *val_loss, hs_error *e) {
    int64_t count = hs_data_num_val(t->data);
    if (count > EVAL_SEQUENCES) count = EVAL_SEQUENCES;
    int64_t per_pass = (int64_t)t->mbs * t->dp_size;
    int64_t passes = (count + per_pass - 1) / per_pass;
    double sums[2] = {0.0, 0.0}; /* CE sum, valid targets */
    for (int64_t p = 0; p < passes; p++) {
        eval_fill(t, p * per_pass + (int64_t)t->dp_rank * t->mbs, count);
        /* the CP ranks of a sequence share its count: counted once */
        for (int i = 0; t->cp_rank == 0 && i < t->mbs * t->T; i++) sums[1] += t->targets[i] >= 0;
        double loss_sum = 0.0;
        hs_status s = hs_train_forward(t, t->tokens, t->targets, t->mbs, &loss_sum, NULL, e);
        if (s != HS_OK) return s;
        sums[0] += loss_sum;
    }
    hs_status s = hs_reduce_sum_f64(t->batch_group, sums, 2, e);
    *val_loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
    return s;
}

/* Start the prompt at a sentence boundary when the text has one nearby. */
static int prompt_start(const int32_t *tok, int T) {
    for (int i = 0; i + 1 < T / 2; i++)
        if ((tok[i] == '.' && tok[i + 1] == ' ') || tok[i] == '\n')
            return i + (tok[i] == '.' ? 2 : 1);
    return 0;
}

static void append_escaped(char *buf, size_t cap, const int32_t *tok, int n, bool bytes,
                           const hs_bpe *bpe) {
    size_t len = strlen(buf);
    for (int i = 0; i < n && len + 8 < cap; i++) {
        int c = tok[i];
        if (bpe) { /* the tokenizer's text, escaped byte by byte */
            char piece[256];
            int k = hs_bpe_decode(bpe, c, piece, sizeof piece);
            int32_t bytes_of[256];
            for (int j = 0; j < k; j++) bytes_of[j] = (unsigned char)piece[j];
            append_escaped(buf, cap, bytes_of, k, true, NULL);
            len = strlen(buf);
        } else if (!bytes) len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? " " : "", c);
        else if (c == '\n') len += (size_t)snprintf(buf + len, cap - len, "\\n");
        else if (c == '"' || c == '\\') len += (size_t)snprintf(buf + len, cap - len, "\\%c", c);
        else if (c >= 32 && c < 127) buf[len++] = (char)c, buf[len] = '\0';
        else len += (size_t)snprintf(buf + len, cap - len, "\\x%02x", c & 0xff);
    }
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Each token's logits from the decoder (decoder.c): the KV cache where
 * the layout has one. The sample stays within seq_len: it never slides. */
static hs_status sample_generate(hs_trainer *t, int32_t *seq, int prompt, int total, hs_error *e) {
    hs_decoder d;
    hs_status s = hs_decoder_open(&d, t, "sample", true, e);
    int V = t->cfg->model.vocab_size;
    for (int len = prompt; s == HS_OK && len < total; len++) {
        const float *logits = NULL;
        s = hs_decoder_next(&d, seq, len, false, &logits, e);
        if (s == HS_OK) seq[len] = argmax(logits, V);
    }
    hs_decoder_close(&d);
    return s;
}

hs_status hs_sample(hs_trainer *t, hs_error *e) {
    int32_t *seq = calloc((size_t)t->T, sizeof(int32_t));
    if (!seq) return hs_error_oom(e, "sample: cannot allocate");
    /* The first validation sequence: text the model was not trained on. */
    int64_t first = hs_data_num_val(t->data) > 0 ? hs_data_num_train(t->data) : 0;
    hs_data_sequence(t->data, first, t->tokens, t->targets);
    int start = prompt_start(t->tokens, t->T);
    int prompt = t->T - start < 2 * SAMPLE_PROMPT ? (t->T - start) / 2 : SAMPLE_PROMPT;
    if (prompt < 1) prompt = 1;
    memcpy(seq, t->tokens + start, sizeof(int32_t) * (size_t)prompt);
    int total = t->T < prompt + SAMPLE_MAX_NEW ? t->T : prompt + SAMPLE_MAX_NEW;
    hs_status s = sample_generate(t, seq, prompt, total, e);
    if (s == HS_OK && t->rank0) {
        /* token data: its tokenizer's text where it has one, else the ids */
        bool bytes = !hs_data_tokenized(&t->cfg->data);
        char dir[HS_PATH_MAX], path[HS_PATH_MAX + 32];
        hs_bpe *bpe = NULL;
        hs_error quiet = {0};
        if (!bytes && hs_tokenizer_dir(t->cfg, dir, sizeof dir) &&
            hs_tokenizer_find(dir, path, sizeof path) && hs_bpe_load(path, &bpe, &quiet) != HS_OK)
            hs_log_warn(t->log, "sample: its tokens as ids: %s", quiet.msg);
        char text[2048] = "";
        append_escaped(text, sizeof text, seq, prompt, bytes, bpe);
        strcat(text, "\" -> \"");
        append_escaped(text, sizeof text, seq + prompt, total - prompt, bytes, bpe);
        hs_log_info(t->log, "sample (greedy): \"%s\"", text);
        hs_bpe_free(bpe);
    }
    free(seq);
    return s;
}
