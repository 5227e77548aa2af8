/* Data: a token stream cut into sequences, a fixed validation split, and the
 * deterministic order in which global batches and their per-rank slices read
 * the train split (docs/data.md). */
#include <stdlib.h>
#include <string.h>

#include "hypershard/data.h"

struct hs_dataset {
    uint32_t *tokens; /* the whole stream */
    int64_t n_tokens;
    int seq_len; /* T; a sequence holds T + 1 tokens */
    int64_t n_train, n_val;
    uint64_t seed;
    int64_t *perm; /* order of the train split in epoch perm_epoch */
    int64_t perm_epoch;
};

static hs_status data_load_bytes(const hs_data_config *dc, hs_dataset *ds, hs_error *e) {
    if (!strcmp(dc->source, "builtin")) {
        ds->n_tokens = (int64_t)HS_CORPUS_BUILTIN_BYTES;
        uint8_t *text = malloc(HS_CORPUS_BUILTIN_BYTES);
        if (!text)
            return hs_error_oom(e, "data.source builtin: cannot allocate %zu bytes",
                                HS_CORPUS_BUILTIN_BYTES);
        hs_corpus_builtin(text, HS_CORPUS_BUILTIN_BYTES);
        ds->tokens = malloc(sizeof(uint32_t) * (size_t)ds->n_tokens);
        if (!ds->tokens) {
            free(text);
            return hs_error_oom(e, "data.source builtin: cannot allocate tokens");
        }
        for (int64_t i = 0; i < ds->n_tokens; i++) ds->tokens[i] = text[i];
        free(text);
        return HS_OK;
    }
    if (!dc->path[0])
        return hs_error_set(e, HS_ERR_CONFIG,
                            "data.path: data.source is text but no path is set; set data.path to a "
                            "UTF-8 text file");
    char *text = NULL;
    size_t len = 0;
    hs_status s = hs_read_file(dc->path, &text, &len, e);
    if (s != HS_OK) return s;
    ds->n_tokens = (int64_t)len;
    ds->tokens = malloc(sizeof(uint32_t) * (len ? len : 1));
    if (!ds->tokens) {
        free(text);
        return hs_error_oom(e, "data.path %s: cannot allocate %zu tokens", dc->path, len);
    }
    for (size_t i = 0; i < len; i++) ds->tokens[i] = (uint8_t)text[i];
    free(text);
    return HS_OK;
}

static hs_status data_load_tokens(const hs_data_config *dc, int vocab_size, hs_dataset *ds,
                                  hs_error *e) {
    if (!dc->path[0])
        return hs_error_set(e, HS_ERR_CONFIG,
                            "data.path: data.source is tokens but no path is set; set data.path to "
                            "an HSTK token file");
    hs_status s = hs_tokens_read(dc->path, &ds->tokens, &ds->n_tokens, e);
    if (s != HS_OK) return s;
    for (int64_t i = 0; i < ds->n_tokens; i++)
        if (ds->tokens[i] >= (uint32_t)vocab_size)
            return hs_error_set(
                e, HS_ERR_CONFIG,
                "data.path %s: token %u at position %lld is >= model.vocab_size %d; "
                "raise model.vocab_size or re-tokenise",
                dc->path, ds->tokens[i], (long long)i, vocab_size);
    return HS_OK;
}

static hs_status data_split(const hs_data_config *dc, hs_dataset *ds, hs_error *e) {
    int64_t n_seq = ds->n_tokens / (ds->seq_len + 1);
    int64_t n_val = 0;
    if (dc->val_fraction > 0) {
        n_val = (int64_t)((double)n_seq * dc->val_fraction);
        if (n_val < 1) n_val = 1;
    }
    if (n_seq - n_val < 1)
        return hs_error_set(
            e, HS_ERR_CONFIG,
            "data (%s%s%s): %lld tokens make %lld sequences of train.seq_len + 1 = %d "
            "tokens, %lld of them for validation (data.val_fraction %g), leaving no "
            "train sequence; use more data or a smaller train.seq_len",
            dc->source, dc->path[0] ? " " : "", dc->path, (long long)ds->n_tokens, (long long)n_seq,
            ds->seq_len + 1, (long long)n_val, dc->val_fraction);
    ds->n_val = n_val;
    ds->n_train = n_seq - n_val;
    return HS_OK;
}

hs_status hs_data_open(const hs_data_config *dc, int seq_len, int vocab_size, uint64_t seed,
                       hs_dataset **out, hs_error *e) {
    *out = NULL;
    bool bytes = !strcmp(dc->source, "builtin") || !strcmp(dc->source, "text");
    if (!bytes && strcmp(dc->source, "tokens"))
        return hs_error_set(e, HS_ERR_CONFIG,
                            "data.source: '%s' is not a source; use builtin, text or tokens",
                            dc->source);
    if (bytes && vocab_size < 256)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "model.vocab_size: %d is too small for data.source %s, which uses byte "
                            "tokens; set model.vocab_size >= 256",
                            vocab_size, dc->source);
    if (seq_len < 1)
        return hs_error_set(e, HS_ERR_CONFIG, "train.seq_len: %d must be >= 1", seq_len);
    hs_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return hs_error_oom(e, "data: cannot allocate the dataset");
    ds->seq_len = seq_len;
    ds->seed = seed;
    ds->perm_epoch = -1;
    hs_status s = bytes ? data_load_bytes(dc, ds, e) : data_load_tokens(dc, vocab_size, ds, e);
    if (s == HS_OK) s = data_split(dc, ds, e);
    if (s == HS_OK) {
        ds->perm = malloc(sizeof(int64_t) * (size_t)ds->n_train);
        if (!ds->perm) s = hs_error_oom(e, "data: cannot allocate the epoch order");
    }
    if (s != HS_OK) {
        hs_data_free(ds);
        return s;
    }
    *out = ds;
    return HS_OK;
}

void hs_data_free(hs_dataset *ds) {
    if (!ds) return;
    free(ds->tokens);
    free(ds->perm);
    free(ds);
}

int64_t hs_data_num_tokens(const hs_dataset *ds) { return ds->n_tokens; }
int64_t hs_data_num_train(const hs_dataset *ds) { return ds->n_train; }
int64_t hs_data_num_val(const hs_dataset *ds) { return ds->n_val; }
int hs_data_seq_len(const hs_dataset *ds) { return ds->seq_len; }

/* Fisher-Yates over the train split; the swap partner of position i comes
 * from Philox (seed, stream "data.epoch" + epoch, counter i), so an epoch's
 * order depends only on the seed and the epoch number. */
static void data_shuffle(hs_dataset *ds, int64_t epoch) {
    uint64_t stream = hs_hash64("data.epoch") + (uint64_t)epoch;
    for (int64_t i = 0; i < ds->n_train; i++) ds->perm[i] = i;
    for (int64_t i = ds->n_train - 1; i > 0; i--) {
        uint32_t r[4];
        hs_philox4x32(ds->seed, stream, (uint64_t)i, r);
        uint64_t u = ((uint64_t)r[0] << 32) | r[1];
        int64_t j = (int64_t)(u % (uint64_t)(i + 1));
        int64_t t = ds->perm[i];
        ds->perm[i] = ds->perm[j];
        ds->perm[j] = t;
    }
    ds->perm_epoch = epoch;
}

int64_t hs_data_batch_sequence(hs_dataset *ds, int64_t g, int global_batch, int k) {
    HS_ASSERT(g >= 0 && k >= 0 && k < global_batch);
    /* Global batches read consecutive positions of the endless sequence of
     * epochs; a batch may straddle two epochs when the split is small. */
    int64_t pos = g * global_batch + k;
    int64_t epoch = pos / ds->n_train;
    if (epoch != ds->perm_epoch) data_shuffle(ds, epoch);
    return ds->perm[pos % ds->n_train];
}

void hs_data_sequence(const hs_dataset *ds, int64_t seq, int32_t *tokens, int32_t *targets) {
    HS_ASSERT(seq >= 0 && seq < ds->n_train + ds->n_val);
    int T = ds->seq_len;
    const uint32_t *src = ds->tokens + seq * (T + 1);
    for (int t = 0; t < T; t++) {
        tokens[t] = src[t];
        targets[t] = src[t + 1];
    }
}

void hs_data_micro_batch(hs_dataset *ds, int64_t g, int global_batch, int m, int mbs, int d, int D,
                         int32_t *tokens, int32_t *targets) {
    HS_ASSERT(d >= 0 && d < D && (int64_t)(m + 1) * mbs * D <= global_batch);
    int T = ds->seq_len;
    for (int i = 0; i < mbs; i++) {
        int k = m * mbs * D + d * mbs + i;
        int64_t seq = hs_data_batch_sequence(ds, g, global_batch, k);
        hs_data_sequence(ds, seq, tokens + (size_t)i * T, targets + (size_t)i * T);
    }
}
