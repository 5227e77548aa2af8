/* The Hugging Face tokenizer that made a token file: its files sit beside
 * the file (data.path's directory, as scripts/tokenize.py leaves them);
 * train checks model.vocab_size against it, and the weights a run writes
 * get a copy of them, so AutoTokenizer loads next to AutoModelForCausalLM
 * (docs/data.md, "Tokenizers"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/data.h"

static const char *const FILES[] = {"tokenizer.json", "tokenizer_config.json",
                                    "special_tokens_map.json"};
#define N_FILES (int)(sizeof FILES / sizeof FILES[0])

/* data.path's directory, or false when the data is not a token file. */
static bool data_dir(const hs_data_config *dc, char *out, size_t cap) {
    if (strcmp(dc->source, "tokens") || !dc->path[0]) return false;
    snprintf(out, cap, "%s", dc->path);
    char *slash = strrchr(out, '/');
    if (slash) *slash = '\0';
    else snprintf(out, cap, ".");
    return true;
}

static bool exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

bool hs_tokenizer_find(const char *dir, char *path, size_t cap) {
    snprintf(path, cap, "%s/tokenizer.json", dir);
    return exists(path);
}

bool hs_tokenizer_dir(const hs_config *cfg, char *out, size_t cap) {
    char path[HS_PATH_MAX + 32];
    return data_dir(&cfg->data, out, cap) && hs_tokenizer_find(out, path, sizeof path);
}

hs_status hs_tokenizer_check(const hs_config *cfg, int64_t *vocab, hs_error *e) {
    *vocab = 0;
    char dir[HS_PATH_MAX], path[HS_PATH_MAX + 32];
    if (!hs_tokenizer_dir(cfg, dir, sizeof dir)) return HS_OK;
    hs_tokenizer_find(dir, path, sizeof path);
    if (hs_tokenizer_vocab(path, vocab, e) != HS_OK)
        return hs_error_append(e, e->code, "(the tokenizer beside data.path %s)", cfg->data.path);
    if (*vocab > cfg->model.vocab_size)
        return hs_error_set(
            e, HS_ERR_CONFIG,
            "model.vocab_size = %d is smaller than the %lld tokens of the tokenizer "
            "%s that made data.path %s; set model.vocab_size: %lld (or more)",
            cfg->model.vocab_size, (long long)*vocab, path, cfg->data.path, (long long)*vocab);
    return HS_OK;
}

static hs_status copy_file(const char *from, const char *to, hs_error *e) {
    char *buf = NULL;
    size_t len = 0;
    hs_status s = hs_read_file(from, &buf, &len, e);
    if (s != HS_OK) return s;
    FILE *f = hs_fopen(to, "wb", "check that the directory is writable", e);
    if (!f) return free(buf), e->code;
    bool ok = fwrite(buf, 1, len, f) == len;
    ok = fclose(f) == 0 && ok;
    free(buf);
    return ok ? HS_OK : hs_error_set(e, HS_ERR_IO, "cannot write %s: %s", to, hs_strerror_errno());
}

hs_status hs_tokenizer_copy(const char *dir, const char *out_dir, int *copied, hs_error *e) {
    *copied = 0;
    char from[HS_PATH_MAX + 32], to[HS_PATH_MAX + 32];
    hs_status s = HS_OK;
    for (int i = 0; s == HS_OK && i < N_FILES; i++) {
        snprintf(from, sizeof from, "%s/%s", dir, FILES[i]);
        snprintf(to, sizeof to, "%s/%s", out_dir, FILES[i]);
        if (!exists(from)) continue;
        s = copy_file(from, to, e);
        *copied += s == HS_OK;
    }
    return s;
}
