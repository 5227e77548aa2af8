/* A streaming JSON writer: tracks nesting and commas so callers write
 * values in order and never build strings by hand. */
#include <math.h>
#include <string.h>

#include "hypershard/base.h"

void hs_json_init(hs_json *j, FILE *f) {
    j->f = f;
    j->depth = 0;
    j->first[0] = true;
    j->after_key = false;
}

/* Called before every value or key: a comma unless first in its container. */
static void json_sep(hs_json *j) {
    if (j->after_key) {
        j->after_key = false;
        return;
    }
    if (!j->first[j->depth]) fputc(',', j->f);
    j->first[j->depth] = false;
}

static void json_open(hs_json *j, char c) {
    json_sep(j);
    fputc(c, j->f);
    HS_ASSERT(j->depth + 1 < HS_JSON_MAX_DEPTH);
    j->first[++j->depth] = true;
}

static void json_close(hs_json *j, char c) {
    HS_ASSERT(j->depth > 0);
    j->depth--;
    fputc(c, j->f);
}

void hs_json_begin_object(hs_json *j) { json_open(j, '{'); }
void hs_json_end_object(hs_json *j) { json_close(j, '}'); }
void hs_json_begin_array(hs_json *j) { json_open(j, '['); }
void hs_json_end_array(hs_json *j) { json_close(j, ']'); }

static void json_escaped(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*p < 0x20) fprintf(f, "\\u%04x", *p);
            else fputc(*p, f);
        }
    }
    fputc('"', f);
}

void hs_json_key(hs_json *j, const char *key) {
    json_sep(j);
    json_escaped(j->f, key);
    fputc(':', j->f);
    j->after_key = true;
}

void hs_json_string(hs_json *j, const char *s) {
    json_sep(j);
    json_escaped(j->f, s ? s : "");
}

void hs_json_int(hs_json *j, int64_t v) {
    json_sep(j);
    fprintf(j->f, "%lld", (long long)v);
}

void hs_json_double(hs_json *j, double v, int sig_digits) {
    json_sep(j);
    if (!isfinite(v)) fputs("null", j->f);
    else fprintf(j->f, "%.*g", sig_digits, v);
}

void hs_json_bool(hs_json *j, bool v) {
    json_sep(j);
    fputs(v ? "true" : "false", j->f);
}

void hs_json_null(hs_json *j) {
    json_sep(j);
    fputs("null", j->f);
}

void hs_json_kv_string(hs_json *j, const char *key, const char *s) {
    hs_json_key(j, key);
    hs_json_string(j, s);
}
void hs_json_kv_int(hs_json *j, const char *key, int64_t v) {
    hs_json_key(j, key);
    hs_json_int(j, v);
}
void hs_json_kv_double(hs_json *j, const char *key, double v, int sig_digits) {
    hs_json_key(j, key);
    hs_json_double(j, v, sig_digits);
}
void hs_json_kv_bool(hs_json *j, const char *key, bool v) {
    hs_json_key(j, key);
    hs_json_bool(j, v);
}
