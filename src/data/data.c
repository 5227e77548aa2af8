/* Data: a token stream cut into sequences, a fixed validation split, and the
 * deterministic order in which global batches and their per-rank slices read
 * the train split (docs/data.md). */
#include <stdlib.h>
#include <string.h>

#include "hypershard/data.h"

/* One dataset of the blend (the only one without data.blend): its token
 * stream, its windows split into train and validation, and its own epoch
 * order. */
typedef struct part {
    uint32_t *tokens; /* builtin, text, tokens: the whole stream */
    hs_indexed *ix;   /* indexed: the mapped files */
    const char *name; /* data.path or the blend path, for messages */
    int64_t n_tokens;
    int64_t n_train, n_val;
    int64_t train_off; /* first global id of its train windows */
    int64_t *perm;     /* order of its train split in epoch perm_epoch */
    int64_t perm_epoch;
} part;

struct hs_dataset {
    part *parts;
    int n_parts;
    int seq_len; /* T; a sequence holds T + 1 tokens */
    int64_t n_train, n_val;
    uint64_t seed;
    hs_blend *blend;    /* NULL with one part */
    int32_t *val_part;  /* with a blend: validation sequence v is window */
    int64_t *val_local; /* n_train + val_local[v] of part val_part[v] */
};

static hs_status data_load_bytes(const hs_data_config *dc, part *ds, hs_error *e) {
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
    hs_status s = hs_regular_file(dc->path, "data.path", "set data.path to a UTF-8 text file", e);
    if (s == HS_OK) s = hs_read_file(dc->path, &text, &len, e);
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

static hs_status data_load_tokens(const hs_data_config *dc, int vocab_size, part *ds, hs_error *e) {
    if (!dc->path[0])
        return hs_error_set(e, HS_ERR_CONFIG,
                            "data.path: data.source is tokens but no path is set; set data.path to "
                            "an HSTK token file");
    hs_status s = hs_regular_file(dc->path, "data.path",
                                  "set data.path to an HSTK token file (scripts/tokenize.py)", e);
    if (s == HS_OK) s = hs_tokens_read(dc->path, &ds->tokens, &ds->n_tokens, e);
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

static hs_status data_split(const hs_data_config *dc, int T, part *p, hs_error *e) {
    int64_t n_seq = p->n_tokens / (T + 1);
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
            dc->source, p->name[0] ? " " : "", p->name, (long long)p->n_tokens, (long long)n_seq,
            T + 1, (long long)n_val, dc->val_fraction);
    p->n_val = n_val;
    p->n_train = n_seq - n_val;
    p->perm = malloc(sizeof(int64_t) * (size_t)p->n_train);
    if (!p->perm)
        return hs_error_oom(e, "data %s: the epoch order of %lld sequences", p->name,
                            (long long)p->n_train);
    return HS_OK;
}

static hs_status data_load_part(const hs_data_config *dc, const char *path, int vocab_size, part *p,
                                hs_error *e) {
    p->name = path;
    p->perm_epoch = -1;
    if (!strcmp(dc->source, "indexed")) {
        if (!path[0])
            return hs_error_set(e, HS_ERR_CONFIG,
                                "data.path: data.source is indexed but neither data.path nor "
                                "data.blend is set; set data.path to the PREFIX of PREFIX.bin "
                                "and PREFIX.idx");
        hs_status s = hs_indexed_open(path, vocab_size, dc->eos_id, &p->ix, e);
        if (s == HS_OK) p->n_tokens = hs_indexed_num_tokens(p->ix);
        return s;
    }
    if (!strcmp(dc->source, "tokens")) return data_load_tokens(dc, vocab_size, p, e);
    return data_load_bytes(dc, p, e);
}

/* The validation sequences of a blend, blended by weight like training
 * samples but in each member's own order and without repeats. */
static hs_status data_val_blend(hs_dataset *ds, const double *w, hs_error *e) {
    int64_t *caps = malloc(sizeof(int64_t) * (size_t)ds->n_parts);
    if (!caps) return hs_error_oom(e, "data.blend: %d counts", ds->n_parts);
    int64_t total = 0;
    for (int i = 0; i < ds->n_parts; i++) {
        caps[i] = w[i] > 0 ? ds->parts[i].n_val : 0;
        total += caps[i];
    }
    ds->n_val = total;
    ds->val_part = malloc(sizeof(int32_t) * (size_t)(total ? total : 1));
    ds->val_local = malloc(sizeof(int64_t) * (size_t)(total ? total : 1));
    hs_status s = ds->val_part && ds->val_local
                      ? hs_blend_fill(w, caps, ds->n_parts, ds->val_part, ds->val_local, total, e)
                      : hs_error_oom(e, "data.blend: the order of %lld validation sequences",
                                     (long long)total);
    free(caps);
    return s;
}

static hs_status data_open_parts(const hs_data_config *dc, int vocab_size, hs_dataset *ds,
                                 hs_error *e) {
    int n = dc->n_blend > 0 ? dc->n_blend : 1;
    ds->parts = calloc((size_t)n, sizeof(part));
    double *w = malloc(sizeof(double) * (size_t)n);
    if (!ds->parts || !w) {
        free(w);
        return hs_error_oom(e, "data: %d datasets", n);
    }
    ds->n_parts = n;
    for (int i = 0; i < n; i++) w[i] = dc->n_blend > 0 ? dc->blend[i].weight : 1.0;
    /* The weights before any file is opened. */
    hs_status s = hs_blend_weights_check(w, dc->n_blend, "data.blend", e);
    for (int i = 0; i < n && s == HS_OK; i++) {
        const char *path = dc->n_blend > 0 ? dc->blend[i].path : dc->path;
        part *p = &ds->parts[i];
        s = data_load_part(dc, path, vocab_size, p, e);
        if (s == HS_OK) s = data_split(dc, ds->seq_len, p, e);
        if (s != HS_OK) break;
        p->train_off = ds->n_train;
        ds->n_train += p->n_train;
        ds->n_val += p->n_val;
    }
    if (s == HS_OK && dc->n_blend > 0) s = hs_blend_create(w, n, &ds->blend, e);
    if (s == HS_OK && dc->n_blend > 0) s = data_val_blend(ds, w, e);
    free(w);
    return s;
}

hs_status hs_data_open(const hs_data_config *dc, int seq_len, int vocab_size, uint64_t seed,
                       hs_dataset **out, hs_error *e) {
    *out = NULL;
    bool bytes = !strcmp(dc->source, "builtin") || !strcmp(dc->source, "text");
    bool indexed = !strcmp(dc->source, "indexed");
    if (!bytes && !indexed && strcmp(dc->source, "tokens"))
        return hs_error_set(e, HS_ERR_CONFIG,
                            "data.source: '%s' is not a source; use builtin, text, tokens or "
                            "indexed",
                            dc->source);
    if (bytes && vocab_size < 256)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "model.vocab_size: %d is too small for data.source %s, which uses byte "
                            "tokens; set model.vocab_size >= 256",
                            vocab_size, dc->source);
    if (seq_len < 1)
        return hs_error_set(e, HS_ERR_CONFIG, "train.seq_len: %d must be >= 1", seq_len);
    if (dc->n_blend > 0 && (!indexed || dc->path[0]))
        return hs_error_set(e, HS_ERR_CONFIG,
                            "data.blend: a blend needs data.source indexed (got %s) and data.path "
                            "null (got '%s'); the blend's paths name the datasets",
                            dc->source, dc->path);
    if (dc->eos_id >= vocab_size)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "data.eos_id: %d is not below model.vocab_size %d; use the "
                            "tokenizer's end-of-text id",
                            dc->eos_id, vocab_size);
    hs_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return hs_error_oom(e, "data: cannot allocate the dataset");
    ds->seq_len = seq_len;
    ds->seed = seed;
    hs_status s = data_open_parts(dc, vocab_size, ds, e);
    if (s != HS_OK) {
        hs_data_free(ds);
        return s;
    }
    *out = ds;
    return HS_OK;
}

void hs_data_free(hs_dataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->n_parts; i++) {
        free(ds->parts[i].tokens);
        hs_indexed_free(ds->parts[i].ix);
        free(ds->parts[i].perm);
    }
    free(ds->parts);
    hs_blend_free(ds->blend);
    free(ds->val_part);
    free(ds->val_local);
    free(ds);
}

int64_t hs_data_num_tokens(const hs_dataset *ds) {
    int64_t n = 0;
    for (int i = 0; i < ds->n_parts; i++) n += ds->parts[i].n_tokens;
    return n;
}
int64_t hs_data_num_train(const hs_dataset *ds) { return ds->n_train; }
int64_t hs_data_num_val(const hs_dataset *ds) { return ds->n_val; }
int hs_data_seq_len(const hs_dataset *ds) { return ds->seq_len; }

/* Fisher-Yates over a part's train split; the swap partner of position i
 * comes from Philox (seed, stream "data.epoch" + epoch + part << 40,
 * counter i), so an epoch's order depends only on the seed, the part and
 * the epoch number (part 0's is that of a run without a blend). */
static void data_shuffle(const hs_dataset *ds, int index, int64_t epoch) {
    part *p = &ds->parts[index];
    uint64_t stream = hs_hash64("data.epoch") + (uint64_t)epoch + ((uint64_t)index << 40);
    for (int64_t i = 0; i < p->n_train; i++) p->perm[i] = i;
    for (int64_t i = p->n_train - 1; i > 0; i--) {
        uint32_t r[4];
        hs_philox4x32(ds->seed, stream, (uint64_t)i, r);
        uint64_t u = ((uint64_t)r[0] << 32) | r[1];
        int64_t j = (int64_t)(u % (uint64_t)(i + 1));
        int64_t t = p->perm[i];
        p->perm[i] = p->perm[j];
        p->perm[j] = t;
    }
    p->perm_epoch = epoch;
}

int64_t hs_data_batch_sequence(hs_dataset *ds, int64_t g, int global_batch, int k) {
    HS_ASSERT(g >= 0 && k >= 0 && k < global_batch);
    /* Global batches read consecutive positions of the endless sequence of
     * samples; a blend deals each to a part, which reads its own endless
     * sequence of epochs (a batch may straddle two when a split is small). */
    int64_t pos = g * global_batch + k, local = pos;
    int index = ds->blend ? hs_blend_at(ds->blend, pos, &local) : 0;
    part *p = &ds->parts[index];
    int64_t epoch = local / p->n_train;
    if (epoch != p->perm_epoch) data_shuffle(ds, index, epoch);
    return p->train_off + p->perm[local % p->n_train];
}

/* The part and its window (train windows first, then validation) of
 * global sequence `seq`. */
static int data_window(const hs_dataset *ds, int64_t seq, int64_t *window) {
    HS_ASSERT(seq >= 0 && seq < ds->n_train + ds->n_val);
    if (seq >= ds->n_train) {
        int64_t v = seq - ds->n_train;
        if (!ds->blend) return *window = ds->parts[0].n_train + v, 0;
        *window = ds->parts[ds->val_part[v]].n_train + ds->val_local[v];
        return ds->val_part[v];
    }
    int i = ds->n_parts - 1;
    while (ds->parts[i].train_off > seq) i--;
    *window = seq - ds->parts[i].train_off;
    return i;
}

int hs_data_sequence_source(const hs_dataset *ds, int64_t seq) {
    int64_t window;
    return data_window(ds, seq, &window);
}

static void part_read(const part *p, int64_t pos, int64_t n, int32_t *out) {
    if (p->ix) {
        hs_indexed_read(p->ix, pos, n, out);
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = (int32_t)p->tokens[pos + i];
}

void hs_data_sequence(const hs_dataset *ds, int64_t seq, int32_t *tokens, int32_t *targets) {
    int64_t window;
    const part *p = &ds->parts[data_window(ds, seq, &window)];
    int T = ds->seq_len;
    int64_t pos = window * (T + 1);
    part_read(p, pos, T, tokens);
    memcpy(targets, tokens + 1, sizeof(int32_t) * (size_t)(T - 1));
    part_read(p, pos + T, 1, targets + T - 1);
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
