/* YAML → hs_config over libyaml's event stream. The walk follows the schema:
 * a key that names a section descends, a key that names a value is converted
 * by value.c, anything else is reported (removed, unknown, duplicate, wrong
 * type) and its whole subtree skipped, so one pass reports every problem of a
 * file. Recursion only follows schema sections, so input nesting depth costs
 * no stack. Aliases are refused: a config has no use for them, and refusing
 * them keeps the work linear in the input. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "config/config_internal.h"

#define SEEN_MAX 128
#define PATH_CAP 512
/* Input limits, checked before libyaml sees the text (its cost grows
 * faster than linearly with flow nesting): a config needs neither. */
#define HS_CFG_MAX_BYTES ((size_t)64 << 20)
#define HS_CFG_MAX_FLOW_DEPTH 64

typedef struct reader {
    yaml_parser_t p;
    const char *origin; /* file name; NULL for an override value */
    const char *text;   /* the input, to turn byte offsets into line:column */
    size_t len;
    const char *path; /* override: the key being set */
    hs_cfg_report *rep;
    bool broken; /* after a syntax error libyaml cannot go on */
    char seen[SEEN_MAX][96];
    size_t seen_line[SEEN_MAX];
    int n_seen;
} reader;

static void report_at(reader *r, size_t line, size_t col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void report_at(reader *r, size_t line, size_t col, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->origin) hs_cfg_report_add(r->rep, "%s:%zu:%zu: %s", r->origin, line, col, msg);
    else hs_cfg_report_add(r->rep, "override: %s", msg);
}

#define REPORT(r, mark, ...) report_at((r), (mark).line + 1, (mark).column + 1, __VA_ARGS__)

static void offset_to_line(const reader *r, size_t off, size_t *line, size_t *col) {
    *line = 1, *col = 1;
    for (size_t i = 0; i < off && i < r->len; i++) {
        if (r->text[i] == '\n') ++*line, *col = 1;
        else if (((unsigned char)r->text[i] & 0xC0) != 0x80) ++*col;
    }
}

static void syntax_error(reader *r) {
    const yaml_parser_t *p = &r->p;
    const char *problem = p->problem ? p->problem : "malformed input";
    if (!r->origin) { /* an override value: one line, so no position */
        report_at(r, 1, 1, "%s=%.80s: YAML syntax error in the value: %s%s%s", r->path, r->text,
                  problem, p->context ? " " : "", p->context ? p->context : "");
        return;
    }
    if (p->error == YAML_READER_ERROR) {
        size_t line, col;
        offset_to_line(r, p->problem_offset, &line, &col);
        report_at(r, line, col, "YAML syntax error: %s (byte 0x%02x at offset %zu)", problem,
                  (unsigned)(p->problem_value & 0xff), p->problem_offset);
    } else if (p->error == YAML_MEMORY_ERROR) {
        report_at(r, 1, 1, "out of memory while parsing YAML");
    } else if (p->context) {
        REPORT(r, p->problem_mark, "YAML syntax error: %s (%s at line %zu)", problem, p->context,
               p->context_mark.line + 1);
    } else {
        REPORT(r, p->problem_mark, "YAML syntax error: %s", problem);
    }
}

static bool next(reader *r, yaml_event_t *ev) {
    if (r->broken) return false;
    if (yaml_parser_parse(&r->p, ev)) return true;
    syntax_error(r);
    r->broken = true;
    return false;
}

static bool opens(const yaml_event_t *ev) {
    return ev->type == YAML_SEQUENCE_START_EVENT || ev->type == YAML_MAPPING_START_EVENT;
}
static bool closes(const yaml_event_t *ev) {
    return ev->type == YAML_SEQUENCE_END_EVENT || ev->type == YAML_MAPPING_END_EVENT;
}

/* Consume the rest of the node `first` starts (and delete `first`). */
static void skip_node(reader *r, yaml_event_t *first) {
    long depth = opens(first) ? 1 : 0;
    yaml_event_delete(first);
    while (depth > 0) {
        yaml_event_t ev;
        if (!next(r, &ev)) return;
        depth += opens(&ev) ? 1 : closes(&ev) ? -1 : 0;
        yaml_event_delete(&ev);
    }
}

static const char *node_kind(const yaml_event_t *ev) {
    switch (ev->type) {
    case YAML_SEQUENCE_START_EVENT: return "a list";
    case YAML_MAPPING_START_EVENT: return "a mapping";
    case YAML_ALIAS_EVENT: return "an alias";
    default: return "a value";
    }
}

/* The scalar's text and whether it may be a number/bool/null. Core tags
 * (!!int, !!str, ...) are honoured; other tags are refused. */
static bool scalar_of(reader *r, const yaml_event_t *ev, const char *path, hs_cfg_scalar *s) {
    const char *tag = (const char *)ev->data.scalar.tag;
    s->text = (const char *)ev->data.scalar.value;
    s->len = ev->data.scalar.length;
    s->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    if (!tag) return true;
    if (!strcmp(tag, "!") || !strcmp(tag, YAML_STR_TAG)) s->plain = false;
    else if (!strcmp(tag, YAML_INT_TAG) || !strcmp(tag, YAML_FLOAT_TAG) ||
             !strcmp(tag, YAML_BOOL_TAG) || !strcmp(tag, YAML_NULL_TAG))
        s->plain = true;
    else {
        REPORT(r, ev->start_mark, "%s: unsupported tag %.80s; write the plain value", path, tag);
        return false;
    }
    return true;
}

/* A copy of s appended to *items: false (nothing added) without memory. */
static bool item_add(hs_cfg_scalar **items, int *n, int *cap, hs_cfg_scalar s) {
    if (*n == *cap) {
        int grown = *cap ? 2 * *cap : 8;
        hs_cfg_scalar *v = realloc(*items, (size_t)grown * sizeof *v);
        if (!v) return false;
        *items = v, *cap = grown;
    }
    s.text = strndup(s.text, s.len);
    if (!s.text) return false;
    (*items)[(*n)++] = s;
    return true;
}

/* The list read, into key k (whose sequence started at mark). */
static void set_items(reader *r, const hs_cfg_key *k, yaml_mark_t mark, const hs_cfg_scalar *items,
                      int n, hs_config *c) {
    char why[512];
    hs_status st = hs_cfg_set_items(c, k, items, n, why, sizeof why);
    if (st == HS_ERR_OOM) hs_cfg_report_oom(r->rep, "reading %s: %s", k->path, why);
    else if (st != HS_OK) REPORT(r, mark, "%s: %s", k->path, why);
}

static void read_items(reader *r, const hs_cfg_key *k, yaml_event_t *start, hs_config *c) {
    yaml_mark_t mark = start->start_mark;
    yaml_event_delete(start);
    hs_cfg_scalar *items = NULL;
    int n = 0, cap = 0;
    bool ok = true;
    for (;;) {
        yaml_event_t ev;
        if (!next(r, &ev)) break;
        if (ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            if (ok) set_items(r, k, mark, items, n, c);
            break;
        }
        hs_cfg_scalar s;
        if (ev.type != YAML_SCALAR_EVENT) {
            if (ok)
                REPORT(r, ev.start_mark, "%s: list items must be plain values, got %s", k->path,
                       node_kind(&ev));
            ok = false;
            skip_node(r, &ev);
            continue;
        }
        if (ok && scalar_of(r, &ev, k->path, &s)) {
            ok = item_add(&items, &n, &cap, s);
            if (!ok)
                hs_cfg_report_oom(r->rep, "reading %s: item %d (%zu bytes)", k->path, n, s.len);
        } else {
            ok = false;
        }
        yaml_event_delete(&ev);
    }
    for (int i = 0; i < n; i++) free((char *)items[i].text);
    free(items);
}

/* One {path: P, weight: w} entry of a blend (after its mapping start):
 * its two scalars appended to items, path first. False after a reported
 * problem (the rest of the mapping skipped) or without memory. */
static bool read_blend_entry(reader *r, const hs_cfg_key *k, int index, yaml_mark_t mark,
                             hs_cfg_scalar **items, int *n, int *cap) {
    static const char *const names[2] = {"path", "weight"};
    hs_cfg_scalar got[2];
    bool have[2] = {false, false}, ok = true;
    char *held[2] = {NULL, NULL};
    for (;;) {
        yaml_event_t key, val;
        /* a broken document ends the entry; what it held is freed below */
        if (!next(r, &key)) {
            ok = false;
            break;
        }
        if (key.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&key);
            break;
        }
        int which = -1;
        if (key.type == YAML_SCALAR_EVENT)
            for (int j = 0; j < 2; j++)
                if (!strcmp((const char *)key.data.scalar.value, names[j])) which = j;
        if (ok && which < 0)
            REPORT(r, key.start_mark, "%s[%d]: unknown key '%s'; an entry holds path and weight",
                   k->path, index,
                   key.type == YAML_SCALAR_EVENT ? (const char *)key.data.scalar.value
                                                 : node_kind(&key));
        else if (ok && have[which])
            REPORT(r, key.start_mark, "%s[%d].%s given twice; keep one", k->path, index,
                   names[which]);
        ok = ok && which >= 0 && !have[which];
        yaml_mark_t km = key.start_mark;
        skip_node(r, &key);
        if (!next(r, &val)) {
            ok = false;
            break;
        }
        hs_cfg_scalar s;
        char sub[64];
        snprintf(sub, sizeof sub, "%s[%d].%s", k->path, index, which >= 0 ? names[which] : "?");
        if (ok && val.type != YAML_SCALAR_EVENT) {
            REPORT(r, km, "%s: expected a plain value, got %s", sub, node_kind(&val));
            ok = false;
        } else if (ok && scalar_of(r, &val, sub, &s)) {
            held[which] = strndup(s.text, s.len);
            s.text = held[which];
            got[which] = s, have[which] = true;
            if (!held[which]) hs_cfg_report_oom(r->rep, "reading %s (%zu bytes)", sub, s.len);
            ok = held[which] != NULL;
        } else {
            ok = false;
        }
        skip_node(r, &val);
    }
    for (int j = 0; ok && j < 2; j++)
        if (!have[j]) {
            REPORT(r, mark, "%s[%d]: %s is missing; write {path: PREFIX, weight: w}", k->path,
                   index, names[j]);
            ok = false;
        }
    for (int j = 0; ok && j < 2; j++) {
        ok = item_add(items, n, cap, got[j]);
        if (!ok) hs_cfg_report_oom(r->rep, "reading %s[%d]", k->path, index);
    }
    free(held[0]);
    free(held[1]);
    return ok;
}

/* data.blend: a sequence of {path, weight} mappings. */
static void read_blend(reader *r, const hs_cfg_key *k, yaml_event_t *start, hs_config *c) {
    yaml_mark_t mark = start->start_mark;
    yaml_event_delete(start);
    hs_cfg_scalar *items = NULL;
    int n = 0, cap = 0, index = 0;
    bool ok = true;
    for (;; index++) {
        yaml_event_t ev;
        if (!next(r, &ev)) break;
        if (ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            if (ok) set_items(r, k, mark, items, n, c);
            break;
        }
        if (ev.type != YAML_MAPPING_START_EVENT) {
            if (ok)
                REPORT(r, ev.start_mark, "%s[%d]: expected {path: PREFIX, weight: w}, got %s",
                       k->path, index, node_kind(&ev));
            ok = false;
            skip_node(r, &ev);
            continue;
        }
        yaml_mark_t m = ev.start_mark;
        yaml_event_delete(&ev);
        ok = read_blend_entry(r, k, index, m, &items, &n, &cap) && ok;
    }
    for (int i = 0; i < n; i++) free((char *)items[i].text);
    free(items);
}

/* Set key `k` from the node that starts with `ev` (consumed). */
static void read_value(reader *r, const hs_cfg_key *k, yaml_event_t *ev, hs_config *c) {
    char why[512];
    if (ev->type == YAML_SCALAR_EVENT) {
        hs_cfg_scalar s;
        if (scalar_of(r, ev, k->path, &s) && !hs_cfg_set_scalar(c, k, s, why, sizeof why))
            REPORT(r, ev->start_mark, "%s: %s", k->path, why);
        yaml_event_delete(ev);
    } else if (ev->type == YAML_SEQUENCE_START_EVENT &&
               (k->type == HS_CFG_STRLIST || k->type == HS_CFG_FLOAT_PAIR ||
                k->type == HS_CFG_INTLIST)) {
        read_items(r, k, ev, c);
    } else if (ev->type == YAML_SEQUENCE_START_EVENT && k->type == HS_CFG_BLEND) {
        read_blend(r, k, ev, c);
    } else if (ev->type == YAML_ALIAS_EVENT) {
        REPORT(r, ev->start_mark, "%s: aliases (*name) are not supported; write the value out",
               k->path);
        yaml_event_delete(ev);
    } else {
        REPORT(r, ev->start_mark, "%s: expected %s, got %s", k->path, hs_cfg_type_name(k->type),
               node_kind(ev));
        skip_node(r, ev);
    }
}

/* A key (or section) given twice is an error: YAML would silently keep one. */
static bool first_time(reader *r, const char *path, yaml_mark_t mark) {
    for (int i = 0; i < r->n_seen; i++)
        if (!strcmp(r->seen[i], path)) {
            REPORT(r, mark, "duplicate key %s (first given at line %zu); keep one", path,
                   r->seen_line[i]);
            return false;
        }
    if (r->n_seen < SEEN_MAX && strlen(path) < sizeof r->seen[0]) {
        strcpy(r->seen[r->n_seen], path);
        r->seen_line[r->n_seen++] = mark.line + 1;
    }
    return true;
}

/* The dotted path of the key event `ev` (consumed) under `prefix`. */
static bool key_path(reader *r, yaml_event_t *ev, const char *prefix, char *path, size_t cap) {
    if (ev->type != YAML_SCALAR_EVENT) {
        REPORT(r, ev->start_mark, "%s%skeys must be plain names, got %s", prefix ? prefix : "",
               prefix ? ": " : "", node_kind(ev));
        skip_node(r, ev);
        return false;
    }
    const char *key = (const char *)ev->data.scalar.value;
    size_t len = ev->data.scalar.length;
    bool ok = len > 0 && strlen(key) == len && len < 128;
    if (!ok)
        REPORT(r, ev->start_mark, "%s%sinvalid key (empty, too long or holding a NUL byte)",
               prefix ? prefix : "", prefix ? ": " : "");
    else snprintf(path, cap, "%s%s%s", prefix ? prefix : "", prefix ? "." : "", key);
    yaml_event_delete(ev);
    return ok;
}

static void read_mapping(reader *r, const char *prefix, hs_config *c);

static bool is_null_event(const yaml_event_t *ev) {
    if (ev->type != YAML_SCALAR_EVENT || ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE ||
        ev->data.scalar.tag)
        return false;
    const char *v = (const char *)ev->data.scalar.value;
    return !strcmp(v, "") || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") ||
           !strcmp(v, "NULL");
}

static void read_entry(reader *r, const char *path, yaml_mark_t km, yaml_event_t *val, hs_config *c,
                       bool top) {
    const hs_cfg_key *k = hs_cfg_key_find(path);
    if (k) {
        if (first_time(r, path, km)) read_value(r, k, val, c);
        else skip_node(r, val);
    } else if (hs_cfg_is_section(path)) {
        if (!first_time(r, path, km)) {
            skip_node(r, val);
        } else if (val->type == YAML_MAPPING_START_EVENT) {
            yaml_event_delete(val);
            read_mapping(r, path, c);
        } else if (is_null_event(val)) {
            yaml_event_delete(val); /* "model:" with nothing under it: all defaults */
        } else {
            REPORT(r, val->start_mark, "%s is a section; expected a mapping of its keys, got %s",
                   path, node_kind(val));
            skip_node(r, val);
        }
    } else if (top && !strcmp(path, "derived")) {
        /* The `derived:` block of a resolved dump is recomputed, never read. */
        skip_node(r, val);
    } else if (r->rep->count >= HS_CFG_MAX_REPORTED) {
        hs_cfg_report_add(r->rep, "%s", ""); /* only counted: skip the costly suggestion */
        skip_node(r, val);
    } else {
        char why[1400];
        hs_cfg_explain_path(path, why, sizeof why);
        report_at(r, km.line + 1, km.column + 1, "%s", why);
        skip_node(r, val);
    }
}

static void read_mapping(reader *r, const char *prefix, hs_config *c) {
    for (;;) {
        yaml_event_t ev, val;
        if (!next(r, &ev)) return;
        if (ev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            return;
        }
        yaml_mark_t km = ev.start_mark;
        char path[PATH_CAP];
        bool ok = key_path(r, &ev, prefix, path, sizeof path);
        if (!next(r, &val)) return;
        if (ok) read_entry(r, path, km, &val, c, prefix == NULL);
        else skip_node(r, &val);
    }
}

static void read_root(reader *r, hs_config *c) {
    yaml_event_t ev;
    if (!next(r, &ev)) return;
    if (ev.type == YAML_MAPPING_START_EVENT) {
        yaml_event_delete(&ev);
        read_mapping(r, NULL, c);
    } else if (is_null_event(&ev)) {
        yaml_event_delete(&ev); /* an empty document: all defaults */
    } else {
        REPORT(r, ev.start_mark,
               "the top level must be a mapping of sections (model:, fsdp_config:, ...), got %s",
               node_kind(&ev));
        skip_node(r, &ev);
    }
}

/* The byte offset where flow nesting ([ and {) first goes deeper than the
 * limit, or len. Quoted scalars and comments are skipped. */
static size_t too_deep_at(const char *t, size_t len) {
    int depth = 0;
    char quote = 0;
    bool comment = false;
    for (size_t i = 0; i < len; i++) {
        char ch = t[i];
        if (comment) {
            comment = ch != '\n';
        } else if (quote) {
            if (quote == '"' && ch == '\\') i++;
            else if (ch == quote) quote = 0;
        } else if (ch == '#' &&
                   (i == 0 || t[i - 1] == ' ' || t[i - 1] == '\t' || t[i - 1] == '\n')) {
            comment = true;
        } else if (ch == '"' || ch == '\'') {
            quote = ch;
        } else if (ch == '[' || ch == '{') {
            if (++depth > HS_CFG_MAX_FLOW_DEPTH) return i;
        } else if ((ch == ']' || ch == '}') && depth > 0) {
            depth--;
        }
    }
    return len;
}

static bool within_limits(reader *r) {
    if (r->len > HS_CFG_MAX_BYTES) {
        report_at(r, 1, 1, "the input is %zu bytes; a config may hold at most %zu (64 MiB)", r->len,
                  HS_CFG_MAX_BYTES);
        return false;
    }
    size_t at = too_deep_at(r->text, r->len);
    if (at == r->len) return true;
    size_t line, col;
    offset_to_line(r, at, &line, &col);
    report_at(r, line, col,
              "flow collections ([...] and {...}) nest more than %d deep; a config needs a few "
              "levels at most",
              HS_CFG_MAX_FLOW_DEPTH);
    return false;
}

void hs_cfg_read_yaml(hs_config *c, const char *text, size_t len, const char *origin,
                      hs_cfg_report *rep) {
    reader *r = calloc(1, sizeof *r);
    if (!r) {
        hs_cfg_report_oom(rep, "reading %s: %zu bytes for the parser", origin, sizeof *r);
        return;
    }
    r->origin = origin, r->text = text, r->len = len, r->rep = rep;
    if (!within_limits(r)) {
        free(r);
        return;
    }
    if (!yaml_parser_initialize(&r->p)) hs_panic("yaml_parser_initialize failed");
    yaml_parser_set_input_string(&r->p, (const unsigned char *)text, len);
    yaml_event_t ev;
    int docs = 0;
    while (next(r, &ev)) {
        yaml_event_type_t t = ev.type;
        yaml_mark_t mark = ev.start_mark;
        yaml_event_delete(&ev);
        if (t == YAML_STREAM_END_EVENT) break;
        if (t != YAML_DOCUMENT_START_EVENT) continue; /* stream start, document end */
        if (++docs > 1) {
            REPORT(r, mark, "a config file holds one YAML document; remove the second '---'");
            break;
        }
        read_root(r, c);
    }
    yaml_parser_delete(&r->p);
    free(r);
}

/* The value of an override, parsed as YAML so lists and null read exactly as
 * they would in a file. */
static void read_override_value(hs_config *c, const hs_cfg_key *k, const char *value,
                                hs_cfg_report *rep) {
    reader *r = calloc(1, sizeof *r);
    if (!r) {
        hs_cfg_report_oom(rep, "reading the override of %s: %zu bytes for the parser", k->path,
                          sizeof *r);
        return;
    }
    r->text = value, r->len = strlen(value), r->rep = rep, r->path = k->path;
    if (!yaml_parser_initialize(&r->p)) hs_panic("yaml_parser_initialize failed");
    yaml_parser_set_input_string(&r->p, (const unsigned char *)value, r->len);
    yaml_event_t ev;
    bool done = false, at_end = false;
    while (!done && next(r, &ev)) {
        yaml_event_type_t t = ev.type;
        yaml_event_delete(&ev);
        if (t == YAML_DOCUMENT_START_EVENT) {
            if (!next(r, &ev)) break;
            read_value(r, k, &ev, c);
            if (next(r, &ev)) yaml_event_delete(&ev); /* document end */
            done = true;
        } else if (t == YAML_STREAM_END_EVENT) {
            char why[512];
            hs_cfg_scalar empty = {"", 0, true};
            if (!hs_cfg_set_scalar(c, k, empty, why, sizeof why))
                hs_cfg_report_add(rep, "override: %s: %s", k->path, why);
            done = at_end = true; /* an empty value: nothing can follow */
        }
    }
    /* Anything after the first document ("1\n---\n2") is a mistake too. */
    if (done && !at_end && !r->broken && next(r, &ev)) {
        if (ev.type != YAML_STREAM_END_EVENT)
            hs_cfg_report_add(rep, "override: %s: the value holds more than one YAML document",
                              k->path);
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&r->p);
    free(r);
}

void hs_cfg_apply_override(hs_config *c, const char *a, hs_cfg_report *rep) {
    const char *eq = strchr(a, '=');
    size_t plen = eq ? (size_t)(eq - a) : 0;
    if (!eq || plen == 0 || plen >= PATH_CAP) {
        hs_cfg_report_add(rep,
                          "override '%.200s': expected KEY=VALUE, e.g. "
                          "fsdp_config.dp_shard_size=2",
                          a);
        return;
    }
    char path[PATH_CAP];
    memcpy(path, a, plen);
    path[plen] = '\0';
    const hs_cfg_key *k = hs_cfg_key_find(path);
    if (!k) {
        char why[1400];
        if (hs_cfg_is_section(path))
            snprintf(why, sizeof why,
                     "%s is a section; override its keys one by one "
                     "(e.g. %s.<key>=value)",
                     path, path);
        else hs_cfg_explain_path(path, why, sizeof why);
        hs_cfg_report_add(rep, "override: %s", why);
        return;
    }
    if (k->type == HS_CFG_STRING || k->type == HS_CFG_ENUM) {
        /* Names and paths are taken literally: a path may hold '#' or ': '. */
        char why[512];
        hs_cfg_scalar s = {eq + 1, strlen(eq + 1), true};
        if (!hs_cfg_set_scalar(c, k, s, why, sizeof why))
            hs_cfg_report_add(rep, "override: %s: %s", k->path, why);
        return;
    }
    read_override_value(c, k, eq + 1, rep);
}
