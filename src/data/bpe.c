/* A byte-level BPE tokenizer read from a Hugging Face tokenizer.json, for
 * generate's text in and text out (data.h): GPT-2 style (ByteLevel
 * pre-tokenizer with its regex) or Llama 3 style (a Split with Llama 3's
 * pattern, then ByteLevel without a regex), BPE merges, ByteLevel decoder.
 *
 * Encoding: the text is split as the pattern does, GPT-2's
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * or Llama 3's
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * with letters = ASCII letters and every non-ASCII code point, numbers =
 * ASCII digits (exact for ASCII text), each piece's bytes are mapped to
 * GPT-2's printable code points, and the lowest-ranked merge of adjacent
 * symbols is applied until none is left. Decoding maps a token's code
 * points back to bytes. Other tokenizer kinds are refused by name. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/data.h"

/* string -> int, open addressing (keys owned). */
typedef struct smap {
    char **key;
    int *val;
    size_t cap;
} smap;

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h;
}

/* False without memory for the table (smap_free cleans up either way). */
static bool smap_init(smap *m, size_t n) {
    m->cap = 16;
    while (m->cap < 2 * n + 16) m->cap *= 2;
    m->key = calloc(m->cap, sizeof *m->key);
    m->val = calloc(m->cap, sizeof *m->val);
    return m->key && m->val;
}

static size_t smap_slot(const smap *m, const char *k, size_t n) {
    size_t i = (size_t)fnv(k, n) & (m->cap - 1);
    while (m->key[i] && (strlen(m->key[i]) != n || memcmp(m->key[i], k, n)))
        i = (i + 1) & (m->cap - 1);
    return i;
}

/* False when a new key cannot be copied. */
static bool smap_put(smap *m, const char *k, int v) {
    size_t n = strlen(k), i = smap_slot(m, k, n);
    if (!m->key[i] && !(m->key[i] = strdup(k))) return false;
    m->val[i] = v;
    return true;
}

static int smap_get(const smap *m, const char *k, size_t n) {
    size_t i = smap_slot(m, k, n);
    return m->key[i] ? m->val[i] : -1;
}

static void smap_free(smap *m) {
    for (size_t i = 0; m->key && i < m->cap; i++) free(m->key[i]);
    free(m->key);
    free(m->val);
}

#define LLAMA3_PATTERN                                                                                       \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef enum split_kind { SPLIT_GPT2 = 0, SPLIT_LLAMA3 } split_kind;

struct hs_bpe {
    split_kind split;
    smap vocab;    /* token -> id */
    smap merges;   /* "left right" -> rank */
    char **tokens; /* id -> token (code points as UTF-8) */
    int n_tokens;
    int byte_cp[256]; /* GPT-2's bytes_to_unicode */
    int cp_byte[512]; /* its inverse (-1: not a byte) */
};

static void byte_map(hs_bpe *b) {
    int n = 0;
    for (int i = 0; i < 512; i++) b->cp_byte[i] = -1;
    for (int c = 0; c < 256; c++) {
        bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
        b->byte_cp[c] = printable ? c : 256 + n++;
        b->cp_byte[b->byte_cp[c]] = c;
    }
}

static int put_utf8(char *out, int cp) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* The next code point of s (at most 4 bytes), its length in *len. A byte
 * that does not start a well-formed shortest-form sequence stands alone as
 * its own value (>= 0x80, so a letter): every multi-byte code point is then
 * >= 0x80, and only ASCII bytes are spaces, digits or newlines, as the
 * splitters' byte-wise loops assume (C0 20 read as a space made Llama 3's
 * splitter cut a piece of no bytes, and encode looped on it). */
static int next_cp(const unsigned char *s, int *len) {
    static const int shortest[5] = {0, 0, 0x80, 0x800, 0x10000};
    int n = s[0] < 0x80             ? 1
            : (s[0] & 0xE0) == 0xC0 ? 2
            : (s[0] & 0xF0) == 0xE0 ? 3
            : (s[0] & 0xF8) == 0xF0 ? 4
                                    : 0;
    if (n == 1) return *len = 1, s[0];
    int cp = s[0] & (0x7F >> n);
    for (int k = 1; k < n; k++) { /* stops at the NUL: it is no continuation byte */
        if ((s[k] & 0xC0) != 0x80) return *len = 1, s[0];
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if (n == 0 || cp < shortest[n]) return *len = 1, s[0];
    return *len = n, cp;
}

/* A ByteLevel pre-tokenizer: with its own regex (GPT-2) or without. */
static bool byte_level(json_t *pre, bool regex) {
    const char *t = json_string_value(json_object_get(pre, "type"));
    json_t *rx = json_object_get(pre, "use_regex");
    bool uses = !rx || json_is_true(rx);
    return t && !strcmp(t, "ByteLevel") && uses == regex &&
           !json_is_true(json_object_get(pre, "add_prefix_space"));
}

/* Llama 3's: Split(its pattern, isolated) then ByteLevel without a regex. */
static bool llama3_split(json_t *pre) {
    const char *t = json_string_value(json_object_get(pre, "type"));
    json_t *seq = json_object_get(pre, "pretokenizers");
    if (!t || strcmp(t, "Sequence") || json_array_size(seq) != 2) return false;
    json_t *sp = json_array_get(seq, 0);
    const char *st = json_string_value(json_object_get(sp, "type"));
    const char *rx = json_string_value(json_object_get(json_object_get(sp, "pattern"), "Regex"));
    const char *bh = json_string_value(json_object_get(sp, "behavior"));
    return st && !strcmp(st, "Split") && rx && !strcmp(rx, LLAMA3_PATTERN) && bh &&
           !strcmp(bh, "Isolated") && !json_is_true(json_object_get(sp, "invert")) &&
           byte_level(json_array_get(seq, 1), false);
}

static bool supported(json_t *root, split_kind *split, char *why, size_t cap) {
    json_t *model = json_object_get(root, "model"), *pre = json_object_get(root, "pre_tokenizer");
    const char *mt = json_string_value(json_object_get(model, "type"));
    const char *pt = json_string_value(json_object_get(pre, "type"));
    if (!mt || strcmp(mt, "BPE"))
        return snprintf(why, cap, "model type %s, not BPE", mt ? mt : "(none)"), false;
    if (byte_level(pre, true)) return *split = SPLIT_GPT2, true;
    if (llama3_split(pre)) return *split = SPLIT_LLAMA3, true;
    snprintf(why, cap,
             "pre_tokenizer %s is neither ByteLevel (GPT-2's split) nor Llama 3's Split "
             "+ ByteLevel",
             pt ? pt : "(none)");
    return false;
}

static const char *merge_text(json_t *m, char *buf, size_t cap) {
    if (json_is_string(m)) return json_string_value(m);
    const char *a = json_string_value(json_array_get(m, 0)),
               *c = json_string_value(json_array_get(m, 1));
    if (!a || !c || json_array_size(m) != 2) return NULL;
    int n = snprintf(buf, cap, "%s %s", a, c);
    return n >= 0 && (size_t)n < cap ? buf : NULL;
}

/* An id of the file must be an integer in [0, HS_BPE_ID_MAX): the id ->
 * token table is as long as the largest id, and a negative or wrapped id
 * would index outside it. `field` names it as the file spells it. */
static hs_status check_id(json_t *v, const char *path, const char *field, int *id, hs_error *e) {
    if (!json_is_integer(v))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "tokenizer %s: %s is %s; token ids must be integers (re-save the "
                            "tokenizer with transformers)",
                            path, field,
                            json_is_string(v) ? "a string"
                            : v               ? "not a number"
                                              : "missing");
    json_int_t x = json_integer_value(v);
    if (x < 0 || x >= HS_BPE_ID_MAX)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "tokenizer %s: %s is %lld; token ids must lie in [0, %d)", path, field,
                            (long long)x, HS_BPE_ID_MAX);
    *id = (int)x;
    return HS_OK;
}

/* model.vocab (token -> id) and added_tokens ([{id, content}]), checked:
 * *n = one past the largest id, and, when table is given, (*table)[id] =
 * the token's text (owned by root; NULL for ids nobody uses). Two vocab
 * tokens with one id are refused (decode could not tell them apart); an
 * added token may repeat a vocab entry, as Hugging Face files do. */
static hs_status vocab_ids(json_t *root, const char *path, int *n, const char ***table,
                           hs_error *e) {
    *n = 0;
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab"), *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "tokenizer %s: model.vocab is %s; it must be an object of token -> id",
                            path,
                            json_is_array(vocab) ? "a list"
                            : vocab              ? "not an object"
                                                 : "missing");
    if (added && !json_is_array(added))
        return hs_error_set(e, HS_ERR_FORMAT, "tokenizer %s: added_tokens is not a list", path);
    char field[96];
    const char *k;
    json_t *v;
    size_t i;
    int id;
    json_object_foreach(vocab, k, v) {
        snprintf(field, sizeof field, "model.vocab[\"%.60s\"]", k);
        if (check_id(v, path, field, &id, e) != HS_OK) return e->code;
        if (id >= *n) *n = id + 1;
    }
    json_array_foreach(added, i, v) {
        snprintf(field, sizeof field, "added_tokens[%zu].id", i);
        if (check_id(json_object_get(v, "id"), path, field, &id, e) != HS_OK) return e->code;
        if (!json_is_string(json_object_get(v, "content")))
            return hs_error_set(e, HS_ERR_FORMAT,
                                "tokenizer %s: added_tokens[%zu].content is not a "
                                "string",
                                path, i);
        if (id >= *n) *n = id + 1;
    }
    const char **t = calloc((size_t)*n + 1, sizeof *t);
    if (!t)
        return hs_error_oom(e, "tokenizer %s: an id table of %d entries (%zu bytes)", path, *n,
                            ((size_t)*n + 1) * sizeof *t);
    hs_status s = HS_OK;
    json_object_foreach(vocab, k, v) {
        id = (int)json_integer_value(v);
        if (t[id] && s == HS_OK)
            s = hs_error_set(e, HS_ERR_FORMAT,
                             "tokenizer %s: model.vocab[\"%.60s\"] and model.vocab[\"%.60s\"] both "
                             "have id %d; every id names one token",
                             path, t[id], k, id);
        t[id] = k;
    }
    json_array_foreach(added, i, v) {
        id = (int)json_integer_value(json_object_get(v, "id"));
        if (!t[id]) t[id] = json_string_value(json_object_get(v, "content"));
    }
    if (s != HS_OK || !table) free(t);
    else *table = t;
    return s;
}

/* The JSON of tokenizer.json: an object, duplicate keys refused (a second
 * entry would silently replace the first). */
static json_t *load_json(const char *path, const char *text, size_t len, hs_error *e) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        hs_error_set(e, HS_ERR_FORMAT, "tokenizer %s: line %d column %d: %s", path, jerr.line,
                     jerr.column, jerr.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        hs_error_set(e, HS_ERR_FORMAT, "tokenizer %s: not a JSON object", path);
        return NULL;
    }
    return root;
}

hs_status hs_tokenizer_vocab(const char *path, int64_t *n, hs_error *e) {
    *n = 0;
    char *text = NULL;
    size_t len = 0;
    if (hs_read_file(path, &text, &len, e) != HS_OK) return e->code;
    json_t *root = load_json(path, text, len, e);
    free(text);
    if (!root) return e->code;
    int ids = 0;
    hs_status s = vocab_ids(root, path, &ids, NULL, e);
    json_decref(root);
    *n = ids;
    return s;
}

/* As Hugging Face's BPE builder requires: both sides of merge "left right"
 * and the token they make are in the vocabulary; NULL when they are, else
 * the first one missing (in `buf`). */
static const char *merge_missing(const hs_bpe *b, const char *m, char *buf, size_t cap) {
    const char *sp = strchr(m, ' ');
    size_t nl = sp ? (size_t)(sp - m) : strlen(m), nr = sp ? strlen(sp + 1) : 0;
    if (!sp || nl + nr >= cap) return m;
    snprintf(buf, cap, "%.*s", (int)nl, m);
    if (smap_get(&b->vocab, m, nl) < 0) return buf;
    if (smap_get(&b->vocab, sp + 1, nr) < 0) return sp + 1;
    snprintf(buf, cap, "%.*s%s", (int)nl, m, sp + 1);
    return smap_get(&b->vocab, buf, nl + nr) < 0 ? buf : NULL;
}

static hs_status bpe_build(hs_bpe *b, json_t *root, const char *path, hs_error *e) {
    const char **table = NULL;
    if (vocab_ids(root, path, &b->n_tokens, &table, e) != HS_OK) return e->code;
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab"), *v;
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    json_t *added = json_object_get(root, "added_tokens");
    bool ok = smap_init(&b->vocab, json_object_size(vocab) + json_array_size(added)) &&
              smap_init(&b->merges, json_array_size(merges));
    b->tokens = ok ? calloc((size_t)b->n_tokens + 1, sizeof *b->tokens) : NULL;
    ok = b->tokens != NULL;
    for (int id = 0; ok && id < b->n_tokens; id++)
        if (table[id]) ok = (b->tokens[id] = strdup(table[id])) != NULL;
    free(table);
    const char *k;
    json_object_foreach(vocab, k, v) {
        if (ok) ok = smap_put(&b->vocab, k, (int)json_integer_value(v));
    }
    if (!ok)
        return hs_error_oom(e, "tokenizer %s: the tables of %d tokens and %zu merges", path,
                            b->n_tokens, json_array_size(merges));
    if (merges && !json_is_array(merges))
        return hs_error_set(e, HS_ERR_FORMAT, "tokenizer %s: model.merges is not a list", path);
    char buf[512];
    size_t i;
    json_array_foreach(merges, i, v) {
        const char *m = merge_text(v, buf, sizeof buf);
        if (!m)
            return hs_error_set(e, HS_ERR_FORMAT,
                                "tokenizer %s: model.merges[%zu] is neither \"left right\" nor "
                                "[left, right] (of at most %zu bytes)",
                                path, i, sizeof buf - 2);
        char tok[512];
        const char *miss = merge_missing(b, m, tok, sizeof tok);
        if (miss)
            return hs_error_set(e, HS_ERR_FORMAT,
                                "tokenizer %s: model.merges[%zu] (\"%s\") needs token \"%s\", "
                                "which model.vocab lacks; every merge's two sides and its "
                                "result must be in the vocabulary",
                                path, i, m, miss);
        if (i < INT32_MAX && !smap_put(&b->merges, m, (int)i))
            return hs_error_oom(e, "tokenizer %s: the table of %zu merges", path,
                                json_array_size(merges));
    }
    return HS_OK;
}

hs_status hs_bpe_load_text(const char *path, const char *text, size_t len, hs_bpe **out,
                           hs_error *e) {
    *out = NULL;
    json_t *root = load_json(path, text, len, e);
    if (!root) return e->code;
    char why[160];
    split_kind split = SPLIT_GPT2;
    if (!supported(root, &split, why, sizeof why)) {
        json_decref(root);
        return hs_error_set(e, HS_ERR_CONFIG,
                            "tokenizer %s: %s; generate reads byte-level BPE "
                            "tokenizers (GPT-2 or Llama 3 style)",
                            path, why);
    }
    hs_bpe *b = calloc(1, sizeof *b);
    if (!b) {
        json_decref(root);
        return hs_error_oom(e, "tokenizer %s: %zu bytes", path, sizeof *b);
    }
    b->split = split;
    byte_map(b);
    hs_status s = bpe_build(b, root, path, e);
    json_decref(root);
    if (s != HS_OK) {
        hs_bpe_free(b);
        return s;
    }
    *out = b;
    return HS_OK;
}

hs_status hs_bpe_load(const char *path, hs_bpe **out, hs_error *e) {
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    if (hs_read_file(path, &text, &len, e) != HS_OK) return e->code;
    hs_status s = hs_bpe_load_text(path, text, len, out, e);
    free(text);
    return s;
}

void hs_bpe_free(hs_bpe *b) {
    if (!b) return;
    smap_free(&b->vocab);
    smap_free(&b->merges);
    for (int i = 0; b->tokens && i < b->n_tokens; i++) free(b->tokens[i]);
    free(b->tokens);
    free(b);
}

int hs_bpe_vocab_size(const hs_bpe *b) { return b->n_tokens; }

/* Code point classes of the pattern (ASCII-exact; non-ASCII is a letter). */
static bool is_space(int c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
static bool is_num(int c) { return c >= '0' && c <= '9'; }
static bool is_letter(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}

/* Length in bytes of the next piece of the pattern at s. */
static int piece_len(const unsigned char *s) {
    static const char *const contractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    for (int k = 0; k < 7; k++)
        if (!strncmp((const char *)s, contractions[k], strlen(contractions[k])))
            return (int)strlen(contractions[k]);
    int l, c = next_cp(s, &l), i = 0;
    int lead = c == ' ' ? 1 : 0, c1 = lead ? next_cp(s + 1, &l) : c;
    if (!(lead && s[1] == 0)) {
        bool (*cls)(int) = is_letter(c1) ? is_letter : is_num(c1) ? is_num : NULL;
        if (cls || !is_space(c1)) {
            i = lead;
            for (;;) {
                int cc = next_cp(s + i, &l);
                if (!s[i]) break;
                bool in = cls ? cls(cc) : !is_space(cc) && !is_letter(cc) && !is_num(cc);
                if (!in) break;
                i += l;
            }
            if (i > lead) return i;
        }
    }
    /* whitespace: all of it at the end, else all but the last before a non-space */
    i = 0;
    while (s[i] && is_space(s[i])) i++;
    if (s[i] && i > 1) return i - 1;
    return i > 0 ? i : 1;
}

static bool is_other(int c) { return !is_space(c) && !is_letter(c) && !is_num(c); }
static bool is_nl(int c) { return c == '\r' || c == '\n'; }

/* Bytes of the run of letters at s. */
static int letters(const unsigned char *s) {
    int i = 0, l;
    while (s[i] && is_letter(next_cp(s + i, &l))) i += l;
    return i;
}

/* The next piece of Llama 3's pattern at s (see the file comment). */
static int piece_len_llama3(const unsigned char *s) {
    if (s[0] == '\'') {
        int a = s[1] | 0x20, b2 = s[1] ? s[2] | 0x20 : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if ((a == 'r' && b2 == 'e') || (a == 'v' && b2 == 'e') || (a == 'l' && b2 == 'l')) return 3;
    }
    int l0, l1, c0 = next_cp(s, &l0);
    if (is_letter(c0)) return letters(s);
    if (!is_nl(c0) && !is_num(c0) && s[l0] && is_letter(next_cp(s + l0, &l1)))
        return l0 + letters(s + l0);
    if (is_num(c0)) {
        int i = 0;
        while (i < 3 && is_num(s[i])) i++;
        return i;
    }
    int i = c0 == ' ' ? 1 : 0, j = i, l;
    while (s[j] && is_other(next_cp(s + j, &l))) j += l;
    if (j > i) {
        while (is_nl(s[j])) j++;
        return j;
    }
    if (!is_space(c0)) return l0;
    int k = 0, last_nl = -1;
    for (; s[k] && is_space(s[k]); k++)
        if (is_nl(s[k])) last_nl = k;
    if (last_nl >= 0) return last_nl + 1;
    return s[k] && k > 1 ? k - 1 : k;
}

static hs_status piece_oom(int n, hs_error *e) {
    return hs_error_oom(e, "tokenizer: encoding a piece of %d bytes", n);
}

/* Appends id: false when the list cannot grow. */
static bool append_id(int32_t **ids, int *len, int *cap, int id) {
    if (*len == *cap) {
        int grown = *cap ? 2 * *cap : 64;
        int32_t *v = realloc(*ids, sizeof **ids * (size_t)grown);
        if (!v) return false;
        *ids = v, *cap = grown;
    }
    (*ids)[(*len)++] = id;
    return true;
}

/* Merges the pair of sym[0..*ns) with the lowest rank: false when there
 * is none, or (*oom) when the merged symbol cannot be allocated. */
static bool merge_best(const hs_bpe *b, char **sym, int *ns, bool *oom) {
    int best = -1, rank = 0;
    char key[1024];
    for (int i = 0; i + 1 < *ns; i++) {
        int kn = snprintf(key, sizeof key, "%s %s", sym[i], sym[i + 1]);
        int r = kn < (int)sizeof key ? smap_get(&b->merges, key, (size_t)kn) : -1;
        if (r >= 0 && (best < 0 || r < rank)) best = i, rank = r;
    }
    if (best < 0) return false;
    size_t l1 = strlen(sym[best]), l2 = strlen(sym[best + 1]);
    char *m = malloc(l1 + l2 + 1);
    if (!m) return !(*oom = true);
    memcpy(m, sym[best], l1), memcpy(m + l1, sym[best + 1], l2 + 1);
    free(sym[best]), free(sym[best + 1]);
    sym[best] = m;
    memmove(sym + best + 1, sym + best + 2, sizeof *sym * (size_t)(*ns - best - 2));
    --*ns;
    return true;
}

/* BPE over one piece's symbols (each a code point as UTF-8), ids appended. */
static hs_status bpe_piece(const hs_bpe *b, const unsigned char *p, int n, int32_t **ids, int *len,
                           int *cap, hs_error *e) {
    char **sym = calloc((size_t)n + 1, sizeof *sym);
    int ns = 0;
    if (!sym) return piece_oom(n, e);
    bool oom = false;
    for (int i = 0; i < n && !oom; i++) {
        char u[3] = {0};
        put_utf8(u, b->byte_cp[p[i]]);
        if ((sym[ns] = strdup(u))) ns++;
        else oom = true;
    }
    while (!oom && merge_best(b, sym, &ns, &oom)) {
    }
    hs_status s = oom ? piece_oom(n, e) : HS_OK;
    for (int i = 0; i < ns; i++) {
        int id = smap_get(&b->vocab, sym[i], strlen(sym[i]));
        if (id < 0 && s == HS_OK)
            s = hs_error_set(e, HS_ERR_FORMAT, "tokenizer: symbol '%s' is not in the vocabulary",
                             sym[i]);
        if (!oom && !append_id(ids, len, cap, id)) s = piece_oom(n, e), oom = true;
        free(sym[i]);
    }
    free(sym);
    return s;
}

hs_status hs_bpe_encode(const hs_bpe *b, const char *text, int32_t **ids, int *n, hs_error *e) {
    *ids = NULL;
    *n = 0;
    int cap = 0;
    const unsigned char *s = (const unsigned char *)text;
    hs_status st = HS_OK;
    while (*s && st == HS_OK) {
        int l = b->split == SPLIT_LLAMA3 ? piece_len_llama3(s) : piece_len(s);
        st = bpe_piece(b, s, l, ids, n, &cap, e);
        s += l;
    }
    return st;
}

int hs_bpe_decode(const hs_bpe *b, int32_t id, char *out, int cap) {
    if (id < 0 || id >= b->n_tokens || !b->tokens[id]) {
        int n = snprintf(out, (size_t)cap, "<%d>", id);
        return n < cap ? n : cap > 0 ? cap - 1 : 0; /* what was written, not what was cut */
    }
    const unsigned char *t = (const unsigned char *)b->tokens[id];
    int n = 0, l;
    while (*t && n < cap) {
        int cp = next_cp(t, &l);
        int byte = cp < 512 ? b->cp_byte[cp] : -1;
        if (byte >= 0) out[n++] = (char)byte;
        else
            for (int k = 0; k < l && n < cap; k++) out[n++] = (char)t[k]; /* an added token */
        t += l;
    }
    return n;
}
