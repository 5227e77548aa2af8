/* The Hugging Face tokenizer that made a token file: its files sit beside
 * the file (data.path's directory, as scripts/tokenize.py leaves them, for
 * a token file or an indexed dataset; a blend's first dataset that has
 * them);
 * train checks model.vocab_size against it, and the weights a run writes
 * get a copy of them, so AutoTokenizer loads next to AutoModelForCausalLM
 * (docs/data.md, "Tokenizers"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hypershard/data.h"

static const char *const FILES[] = {"tokenizer.json", "tokenizer_config.json",
                                    "special_tokens_map.json"};
#define N_FILES (int)(sizeof FILES / sizeof FILES[0])

/* The directory of a data file or indexed prefix. */
static void dir_of(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%s", path);
    char *slash = strrchr(out, '/');
    if (slash) *slash = '\0';
    else snprintf(out, cap, ".");
}

bool hs_data_tokenized(const hs_data_config *dc) {
    return !strcmp(dc->source, "tokens") || !strcmp(dc->source, "indexed");
}

/* The data paths a tokenizer may sit beside: data.path of a token file or
 * an indexed dataset, or each dataset of a blend; n of them. */
static int data_paths(const hs_data_config *dc, const char **paths, int cap) {
    bool indexed = !strcmp(dc->source, "indexed");
    int n = 0;
    if (hs_data_tokenized(dc) && dc->path[0] && n < cap) paths[n++] = dc->path;
    for (int i = 0; indexed && i < dc->n_blend && n < cap; i++) paths[n++] = dc->blend[i].path;
    return n;
}

/* A regular file (a FIFO named tokenizer.json would block its reader). */
static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool hs_tokenizer_find(const char *dir, char *path, size_t cap) {
    snprintf(path, cap, "%s/tokenizer.json", dir);
    return exists(path);
}

bool hs_tokenizer_dir(const hs_config *cfg, char *out, size_t cap) {
    char path[HS_PATH_MAX + 32];
    const char *paths[64];
    int n = data_paths(&cfg->data, paths, 64);
    for (int i = 0; i < n; i++) {
        dir_of(paths[i], out, cap);
        if (hs_tokenizer_find(out, path, sizeof path)) return true;
    }
    return false;
}

hs_status hs_tokenizer_check(const hs_config *cfg, int64_t *vocab, hs_error *e) {
    *vocab = 0;
    char dir[HS_PATH_MAX], path[HS_PATH_MAX + 32];
    if (!hs_tokenizer_dir(cfg, dir, sizeof dir)) return HS_OK;
    hs_tokenizer_find(dir, path, sizeof path);
    if (hs_tokenizer_vocab(path, vocab, e) != HS_OK)
        return hs_error_append(e, e->code, "(the tokenizer beside the data: %s)", path);
    if (*vocab > cfg->model.vocab_size)
        return hs_error_set(
            e, HS_ERR_CONFIG,
            "model.vocab_size = %d is smaller than the %lld tokens of the tokenizer "
            "%s beside the data (%s); set model.vocab_size: %lld (or more)",
            cfg->model.vocab_size, (long long)*vocab, path,
            cfg->data.path[0] ? cfg->data.path : "data.blend", (long long)*vocab);
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
