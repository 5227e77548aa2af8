/* Scalars to typed fields and back: the one converter behind file values,
 * overrides and schema defaults. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

/* At most this much of a bad value is quoted back in a message. */
#define SHOWN 80

static void reason(char *why, size_t cap, const char *expected, hs_cfg_scalar s) {
    int n = s.len > SHOWN ? SHOWN : (int)s.len;
    snprintf(why, cap, "expected %s, got %s%.*s%s%s", expected,
             s.plain ? "'" : "the quoted string \"", n, s.text, s.len > SHOWN ? "..." : "",
             s.plain ? "'" : "\"");
}

static bool is_null(hs_cfg_scalar s) {
    if (!s.plain) return false;
    static const char *const nulls[] = {"", "~", "null", "Null", "NULL"};
    for (size_t i = 0; i < sizeof nulls / sizeof nulls[0]; i++)
        if (s.len == strlen(nulls[i]) && !memcmp(s.text, nulls[i], s.len)) return true;
    return false;
}

static bool equals(hs_cfg_scalar s, const char *w) {
    return s.len == strlen(w) && !memcmp(s.text, w, s.len);
}

/* Copies the scalar into a NUL-terminated buffer; false if it does not fit. */
static bool copy_text(hs_cfg_scalar s, char *buf, size_t cap) {
    if (s.len >= cap) return false;
    memcpy(buf, s.text, s.len);
    buf[s.len] = '\0';
    return true;
}

static bool parse_bool(hs_cfg_scalar s, bool *out) {
    if (!s.plain) return false;
    if (equals(s, "true") || equals(s, "True") || equals(s, "TRUE")) return *out = true, true;
    if (equals(s, "false") || equals(s, "False") || equals(s, "FALSE")) return *out = false, true;
    return false;
}

static bool parse_int(hs_cfg_scalar s, long long lo, long long hi, long long *out) {
    char buf[32];
    if (!s.plain || !copy_text(s, buf, sizeof buf)) return false;
    size_t i = (buf[0] == '-' || buf[0] == '+') ? 1 : 0;
    if (buf[i] == '\0') return false;
    for (; buf[i]; i++)
        if (buf[i] < '0' || buf[i] > '9') return false;
    errno = 0;
    long long v = strtoll(buf, NULL, 10);
    if (errno == ERANGE || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* A plain scalar of an optional sign and digits only (an integer, whatever
 * its size). */
static bool digits_only(hs_cfg_scalar s) {
    if (!s.plain || s.len == 0) return false;
    size_t i = (s.text[0] == '-' || s.text[0] == '+') ? 1 : 0;
    if (i == s.len) return false;
    for (; i < s.len; i++)
        if (s.text[i] < '0' || s.text[i] > '9') return false;
    return true;
}

/* Decimal numbers only: YAML's .inf/.nan and C's hex floats are rejected, a
 * training config has no use for them. */
static bool parse_float(hs_cfg_scalar s, double *out) {
    char buf[64];
    if (!s.plain || !copy_text(s, buf, sizeof buf) || buf[0] == '\0') return false;
    bool digit = false;
    for (size_t i = 0; buf[i]; i++) {
        char ch = buf[i];
        if (ch >= '0' && ch <= '9') digit = true;
        else if (!strchr("+-.eE", ch)) return false;
    }
    if (!digit) return false;
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (*end != '\0' || !isfinite(v)) return false;
    *out = v;
    return true;
}

static bool valid_utf8(const char *text, size_t n) {
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < n;) {
        unsigned b = s[i], cp, min;
        size_t extra;
        if (b < 0x80) {
            i++;
            continue;
        }
        if ((b & 0xE0) == 0xC0) extra = 1, cp = b & 0x1F, min = 0x80;
        else if ((b & 0xF0) == 0xE0) extra = 2, cp = b & 0x0F, min = 0x800;
        else if ((b & 0xF8) == 0xF0) extra = 3, cp = b & 0x07, min = 0x10000;
        else return false;
        if (n - i <= extra) return false;
        for (size_t j = 1; j <= extra; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        /* C1 controls, YAML 1.1 line breaks (NEL, LS, PS), BOM and
         * non-characters cannot be written back into a YAML file as-is. */
        if (cp <= 0x9F || cp == 0x2028 || cp == 0x2029 || cp == 0xFEFF || cp == 0xFFFE ||
            cp == 0xFFFF)
            return false;
        i += extra + 1;
    }
    return true;
}

/* Text values: no NUL bytes, no control characters except tab, valid UTF-8,
 * so that the resolved dump always reads back. */
static bool check_text(hs_cfg_scalar s, char *why, size_t cap) {
    for (size_t i = 0; i < s.len; i++) {
        unsigned char b = (unsigned char)s.text[i];
        if ((b < 0x20 && b != '\t') || b == 0x7f) {
            snprintf(why, cap, "control character 0x%02x at byte %zu is not allowed in a value", b,
                     i);
            return false;
        }
    }
    if (!valid_utf8(s.text, s.len)) {
        snprintf(why, cap, "the value is not valid UTF-8 or holds a control character");
        return false;
    }
    return true;
}

/* The index of `s` in "a|b|c", or -1. */
static int choice_index(const char *choices, hs_cfg_scalar s) {
    int i = 0;
    for (const char *p = choices; *p; i++) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == s.len && !memcmp(p, s.text, n)) return i;
        p += n + (bar ? 1 : 0);
    }
    return -1;
}

static bool choice_ok(const char *choices, hs_cfg_scalar s) {
    return choice_index(choices, s) >= 0;
}

/* The name at `index` of "a|b|c" into out. */
static void choice_name(const char *choices, int index, char *out, size_t cap) {
    const char *p = choices;
    for (int i = 0; i < index && p; i++) {
        p = strchr(p, '|');
        if (p) p++;
    }
    size_t n = p ? strcspn(p, "|") : 0;
    snprintf(out, cap, "%.*s", (int)n, p ? p : "");
}

static void choice_reason(const hs_cfg_key *k, hs_cfg_scalar s, char *why, size_t cap) {
    char expected[160], got[SHOWN + 1], names[8][32];
    const char *cands[8];
    int n = 0;
    size_t used = 0;
    for (const char *p = k->choices; *p && n < 8; n++) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        snprintf(names[n], sizeof names[n], "%.*s", (int)len, p);
        cands[n] = names[n];
        if (used < sizeof expected)
            used += (size_t)snprintf(expected + used, sizeof expected - used, "%s%s",
                                     n ? " | " : "one of ", names[n]);
        p += len + (bar ? 1 : 0);
    }
    reason(why, cap, expected, s);
    snprintf(got, sizeof got, "%.*s", s.len > SHOWN ? SHOWN : (int)s.len, s.text);
    size_t d;
    int best = hs_cfg_nearest(got, cands, n, &d);
    size_t w = strlen(why);
    if (best >= 0 && d <= 2 && w < cap)
        snprintf(why + w, cap - w, "; did you mean %s?", cands[best]);
}

/* An int32 from `s`, or why not: beyond the range (naming it) or not an
 * integer at all. */
static bool scalar_int(hs_cfg_scalar s, long long *out, char *why, size_t cap) {
    if (parse_int(s, INT_MIN, INT_MAX, out)) return true;
    if (digits_only(s))
        snprintf(why, cap, "%.*s is beyond the integer range [%d, %d]",
                 s.len > SHOWN ? SHOWN : (int)s.len, s.text, INT_MIN, INT_MAX);
    else reason(why, cap, "an integer", s);
    return false;
}

static bool set_text(char *field, size_t size, hs_cfg_scalar s, char *why, size_t cap) {
    if (!check_text(s, why, cap)) return false;
    if (!copy_text(s, field, size)) {
        snprintf(why, cap, "the value is %zu bytes long, at most %zu are allowed", s.len, size - 1);
        return false;
    }
    return true;
}

bool hs_cfg_set_scalar(hs_config *c, const hs_cfg_key *k, hs_cfg_scalar s, char *why, size_t cap) {
    void *f = hs_cfg_field(c, k);
    bool null = is_null(s);
    if (memchr(s.text, '\0', s.len)) {
        snprintf(why, cap, "the value holds a NUL byte");
        return false;
    }
    long long iv;
    double dv;
    bool bv;
    switch (k->type) {
    case HS_CFG_INT:
        if (null && k->nullable) return *(int *)f = hs_cfg_int_null(k), true;
        if (!scalar_int(s, &iv, why, cap)) return false;
        if (k->nullable && iv < k->min) { /* the null value: refuse it here */
            snprintf(why, cap, "%lld is out of range: it must be >= %g, or null", iv, k->min);
            return false;
        }
        *(int *)f = (int)iv;
        return true;
    case HS_CFG_INT64:
        if (!parse_int(s, LLONG_MIN, LLONG_MAX, &iv)) break;
        *(long long *)f = iv;
        return true;
    case HS_CFG_FLOAT:
        if (!parse_float(s, &dv)) break;
        *(double *)f = dv;
        return true;
    case HS_CFG_BOOL:
        if (!parse_bool(s, &bv)) break;
        *(bool *)f = bv;
        return true;
    case HS_CFG_TRIBOOL:
        if (null) return *(int *)f = -1, true;
        if (!parse_bool(s, &bv)) break;
        *(int *)f = bv ? 1 : 0;
        return true;
    case HS_CFG_DTYPE: {
        if (null) return *(int *)f = HS_MP_NULL, true;
        char buf[16];
        hs_dtype dt;
        if (!copy_text(s, buf, sizeof buf) || !hs_dtype_parse(buf, &dt)) break;
        *(int *)f = (int)dt;
        return true;
    }
    case HS_CFG_BOOL_OR: {
        /* false and true as every bool is written, or a name */
        int i = parse_bool(s, &bv) ? (int)bv : choice_index(k->choices, s);
        if (i < 0) {
            choice_reason(k, s, why, cap);
            return false;
        }
        *(int *)f = i;
        return true;
    }
    case HS_CFG_ENUM:
        if (!choice_ok(k->choices, s)) {
            choice_reason(k, s, why, cap);
            return false;
        }
        return set_text(f, k->size, s, why, cap);
    case HS_CFG_STRING:
        if (null && k->nullable) return ((char *)f)[0] = '\0', true;
        if (null) {
            snprintf(why, cap, "null is not allowed here; expected a string");
            return false;
        }
        return set_text(f, k->size, s, why, cap);
    case HS_CFG_STRLIST:
    case HS_CFG_INTLIST:
    case HS_CFG_BLEND:
        if (null) return hs_cfg_set_items(c, k, NULL, 0, why, cap) == HS_OK; /* no copy */
        break;
    case HS_CFG_FLOAT_PAIR:
    case HS_CFG_TYPE_COUNT: break;
    }
    reason(why, cap, hs_cfg_type_name(k->type), s);
    return false;
}

static hs_status set_list(hs_config *c, const hs_cfg_key *k, const hs_cfg_scalar *items, int n,
                          char *why, size_t cap) {
    for (int i = 0; i < n; i++) {
        char sub[200];
        if (is_null(items[i]) || items[i].len == 0)
            return snprintf(why, cap, "item %d is empty; list parameter FQNs", i), HS_ERR_CONFIG;
        if (!check_text(items[i], sub, sizeof sub))
            return snprintf(why, cap, "item %d: %s", i, sub), HS_ERR_CONFIG;
    }
    char **list = n > 0 ? calloc((size_t)n, sizeof *list) : NULL;
    for (int i = 0; list && i < n; i++) {
        list[i] = strndup(items[i].text, items[i].len);
        if (list[i]) continue;
        for (int j = 0; j < i; j++) free(list[j]);
        free(list);
        list = NULL;
    }
    if (n > 0 && !list) {
        size_t bytes = (size_t)n * sizeof *list;
        for (int i = 0; i < n; i++) bytes += items[i].len + 1;
        snprintf(why, cap, "a copy of its %d names (%zu bytes)", n, bytes);
        return HS_ERR_OOM;
    }
    char ***field = hs_cfg_field(c, k);
    int *count = (int *)((char *)c + k->count_offset);
    for (int i = 0; i < *count; i++) free((*field)[i]);
    free(*field);
    *field = list;
    *count = n;
    return HS_OK;
}

/* Every item is checked before the field changes, so a bad list leaves the
 * old value; the slots past the count are zeroed. */
static bool set_int_list(hs_config *c, const hs_cfg_key *k, const hs_cfg_scalar *items, int n,
                         char *why, size_t cap) {
    int max = (int)(k->size / sizeof(int));
    if (n > max) return snprintf(why, cap, "at most %d items are allowed, got %d", max, n), false;
    long long v;
    for (int i = 0; i < n; i++) {
        char sub[200];
        if (!scalar_int(items[i], &v, sub, sizeof sub))
            return snprintf(why, cap, "item %d: %s", i, sub), false;
    }
    int *field = hs_cfg_field(c, k);
    memset(field, 0, k->size);
    for (int i = 0; i < n; i++) {
        scalar_int(items[i], &v, why, cap);
        field[i] = (int)v;
    }
    *(int *)((char *)c + k->count_offset) = n;
    return true;
}

static bool set_pair(hs_config *c, const hs_cfg_key *k, const hs_cfg_scalar *items, int n,
                     char *why, size_t cap) {
    double v[2];
    if (n != 2) {
        snprintf(why, cap, "expected %s, got a list of %d", hs_cfg_type_name(k->type), n);
        return false;
    }
    for (int i = 0; i < 2; i++)
        if (!parse_float(items[i], &v[i])) {
            char sub[200];
            reason(sub, sizeof sub, "a number", items[i]);
            snprintf(why, cap, "item %d: %s", i, sub);
            return false;
        }
    memcpy(hs_cfg_field(c, k), v, sizeof v);
    return true;
}

void hs_cfg_blend_free(hs_blend_entry **list, int *n) {
    for (int i = 0; *list && i < *n; i++) free((*list)[i].path);
    free(*list);
    *list = NULL;
    *n = 0;
}

bool hs_cfg_blend_copy(hs_blend_entry **dst, const hs_blend_entry *src, int n) {
    *dst = NULL;
    if (n == 0) return true;
    hs_blend_entry *d = calloc((size_t)n, sizeof *d);
    for (int i = 0; d && i < n; i++) {
        d[i].weight = src[i].weight;
        d[i].path = strdup(src[i].path);
        if (d[i].path) continue;
        int k = i;
        hs_cfg_blend_free(&d, &k);
    }
    *dst = d;
    return d != NULL;
}

/* items: path, weight of entry 0, then of entry 1, ... Each path is a
 * non-empty string, each weight a number (its sign is a rule of the data
 * settings, reported with the others). */
static hs_status set_blend(hs_config *c, const hs_cfg_key *k, const hs_cfg_scalar *items, int n,
                           char *why, size_t cap) {
    int m = n / 2;
    hs_blend_entry *list = m > 0 ? calloc((size_t)m, sizeof *list) : NULL;
    if (m > 0 && !list) return snprintf(why, cap, "a copy of its %d entries", m), HS_ERR_OOM;
    for (int i = 0; i < m; i++) {
        char sub[200];
        hs_cfg_scalar p = items[2 * i], w = items[2 * i + 1];
        hs_status st = HS_ERR_CONFIG;
        if (is_null(p) || p.len == 0)
            snprintf(why, cap, "item %d: path is empty; give the PREFIX of PREFIX.bin/.idx", i);
        else if (!check_text(p, sub, sizeof sub)) snprintf(why, cap, "item %d: path: %s", i, sub);
        else if (p.len >= HS_PATH_MAX)
            snprintf(why, cap, "item %d: path is %zu bytes long, at most %d are allowed", i, p.len,
                     HS_PATH_MAX - 1);
        else if (!parse_float(w, &list[i].weight))
            reason(sub, sizeof sub, "a number", w),
                snprintf(why, cap, "item %d: weight: %s", i, sub);
        else if (!(list[i].path = strndup(p.text, p.len)))
            snprintf(why, cap, "a copy of path %d (%zu bytes)", i, p.len), st = HS_ERR_OOM;
        else continue;
        hs_cfg_blend_free(&list, &m);
        return st;
    }
    hs_blend_entry **field = hs_cfg_field(c, k);
    int *count = (int *)((char *)c + k->count_offset);
    hs_cfg_blend_free(field, count);
    *field = list;
    *count = m;
    return HS_OK;
}

hs_status hs_cfg_set_items(hs_config *c, const hs_cfg_key *k, const hs_cfg_scalar *items, int n,
                           char *why, size_t cap) {
    if (k->type == HS_CFG_STRLIST) return set_list(c, k, items, n, why, cap);
    if (k->type == HS_CFG_INTLIST)
        return set_int_list(c, k, items, n, why, cap) ? HS_OK : HS_ERR_CONFIG;
    if (k->type == HS_CFG_FLOAT_PAIR)
        return set_pair(c, k, items, n, why, cap) ? HS_OK : HS_ERR_CONFIG;
    if (k->type == HS_CFG_BLEND) return set_blend(c, k, items, n, why, cap);
    snprintf(why, cap, "expected %s, got a list", hs_cfg_type_name(k->type));
    return HS_ERR_CONFIG;
}

void hs_cfg_format_double(double v, char *buf, size_t cap) {
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, cap, "%.1f", v);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, cap, "%.*g", p, v);
        if (strtod(buf, NULL) == v) break;
    }
    /* YAML 1.1 readers (PyYAML) take "1e-05" for a string; "1.0e-05" is a
     * float to every reader. */
    char *e = strchr(buf, 'e');
    size_t n = strlen(buf);
    if (e && !strchr(buf, '.') && n + 2 < cap) {
        memmove(e + 2, e, n - (size_t)(e - buf) + 1);
        e[0] = '.', e[1] = '0';
    }
}

/* Double-quoted YAML: the only escapes needed are for '"', '\\' and tab,
 * since set_text admits no other control characters. */
static void write_quoted(const char *s, FILE *f) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f), fputc(*s, f);
        else if (*s == '\t') fputs("\\t", f);
        else fputc(*s, f);
    }
    fputc('"', f);
}

void hs_cfg_write_value(const hs_config *c, const hs_cfg_key *k, FILE *f) {
    const void *p = hs_cfg_cfield(c, k);
    char buf[64];
    switch (k->type) {
    case HS_CFG_INT:
        if (k->nullable && *(const int *)p == hs_cfg_int_null(k)) fputs("null", f);
        else fprintf(f, "%d", *(const int *)p);
        break;
    case HS_CFG_INT64: fprintf(f, "%lld", *(const long long *)p); break;
    case HS_CFG_FLOAT:
        hs_cfg_format_double(*(const double *)p, buf, sizeof buf);
        fputs(buf, f);
        break;
    case HS_CFG_BOOL: fputs(*(const bool *)p ? "true" : "false", f); break;
    case HS_CFG_TRIBOOL: {
        int v = *(const int *)p;
        fputs(v < 0 ? "null" : v ? "true" : "false", f);
        break;
    }
    case HS_CFG_DTYPE: {
        int v = *(const int *)p;
        fputs(v == HS_MP_NULL ? "null" : hs_dtype_name((hs_dtype)v), f);
        break;
    }
    case HS_CFG_ENUM: fputs((const char *)p, f); break;
    case HS_CFG_BOOL_OR:
        choice_name(k->choices, *(const int *)p, buf, sizeof buf);
        fputs(buf, f);
        break;
    case HS_CFG_STRING:
        if (k->nullable && !((const char *)p)[0]) fputs("null", f);
        else write_quoted(p, f);
        break;
    case HS_CFG_STRLIST: {
        char *const *list = *(char *const *const *)p;
        int n = *(const int *)((const char *)c + k->count_offset);
        fputc('[', f);
        for (int i = 0; i < n; i++) {
            if (i) fputs(", ", f);
            write_quoted(list[i], f);
        }
        fputc(']', f);
        break;
    }
    case HS_CFG_INTLIST: {
        const int *v = p;
        int n = *(const int *)((const char *)c + k->count_offset);
        fputc('[', f);
        for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", v[i]);
        fputc(']', f);
        break;
    }
    case HS_CFG_BLEND: {
        const hs_blend_entry *v = *(const hs_blend_entry *const *)p;
        int n = *(const int *)((const char *)c + k->count_offset);
        fputc('[', f);
        for (int i = 0; i < n; i++) {
            fputs(i ? ", {path: " : "{path: ", f);
            write_quoted(v[i].path, f);
            hs_cfg_format_double(v[i].weight, buf, sizeof buf);
            fprintf(f, ", weight: %s}", buf);
        }
        fputc(']', f);
        break;
    }
    case HS_CFG_FLOAT_PAIR: {
        const double *v = p;
        char b2[64];
        hs_cfg_format_double(v[0], buf, sizeof buf);
        hs_cfg_format_double(v[1], b2, sizeof b2);
        fprintf(f, "[%s, %s]", buf, b2);
        break;
    }
    case HS_CFG_TYPE_COUNT: break;
    }
}
