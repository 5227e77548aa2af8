/* config/config_internal.h — what the files of config/ share (private).
 *
 * A value reaches a key as one or more scalars (text + whether it was a plain,
 * unquoted YAML scalar): from the file, from an override, or from the
 * schema's default text. One converter turns them into the field, so all
 * three paths accept and reject exactly the same things.
 */
#ifndef HS_CONFIG_INTERNAL_H
#define HS_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "config/schema.h"
#include "hypershard/config.h"

/* After this many error lines a report only counts the rest. */
#define HS_CFG_MAX_REPORTED 40

typedef struct hs_cfg_scalar {
    const char *text;
    size_t len;
    bool plain; /* unquoted and untagged (or tagged with a non-string core tag) */
} hs_cfg_scalar;

/* Errors of one load: every problem is appended; past HS_CFG_MAX_REPORTED
 * lines only the count grows. */
typedef struct hs_cfg_report {
    hs_error *e;
    int count;
} hs_cfg_report;

void hs_cfg_report_add(hs_cfg_report *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Memory the system would not give while reading: "out of memory: ..." is
 * added and the report's status becomes HS_ERR_OOM (exit 1, not 2: the
 * config is not at fault). */
void hs_cfg_report_oom(hs_cfg_report *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Appends "... and N more errors" when lines were dropped. */
void hs_cfg_report_finish(hs_cfg_report *r);

/* Set a key from one scalar. Leaves `c` untouched and writes a reason
 * ("expected an integer, got 'x'") into `why` on failure. */
bool hs_cfg_set_scalar(hs_config *c, const hs_cfg_key *k, hs_cfg_scalar s, char *why, size_t cap);
/* Set a list or pair key from the items of a YAML sequence: HS_ERR_CONFIG
 * or HS_ERR_OOM (the list's copy) with the reason in `why`. A blend's
 * items are the path and weight scalars of each entry in turn (2n). */
hs_status hs_cfg_set_items(hs_config *c, const hs_cfg_key *k, const hs_cfg_scalar *items, int n,
                           char *why, size_t cap);
/* data.blend's entries: free (the list and its paths; *n = 0) and copy
 * (false, *dst NULL, without memory). */
void hs_cfg_blend_free(hs_blend_entry **list, int *n);
bool hs_cfg_blend_copy(hs_blend_entry **dst, const hs_blend_entry *src, int n);
/* The value as YAML text (a flow list for lists and pairs). */
void hs_cfg_write_value(const hs_config *c, const hs_cfg_key *k, FILE *f);
/* Shortest text that reads back as exactly `v` ("0.003", "10000.0", "1e-05"). */
void hs_cfg_format_double(double v, char *buf, size_t cap);

/* Parse YAML `text` (from `origin`, a file name for messages) into `c`, which
 * holds defaults or earlier values; errors are added to `r`. */
void hs_cfg_read_yaml(hs_config *c, const char *text, size_t len, const char *origin,
                      hs_cfg_report *r);
/* Apply "a.b.c=value"; errors are added to `r`. `c` is unchanged on error. */
void hs_cfg_apply_override(hs_config *c, const char *assignment, hs_cfg_report *r);
/* Why `path` (not a key) is rejected: removed-key text or unknown-key text
 * with the nearest valid path. Writes a whole sentence into `out`. */
void hs_cfg_explain_path(const char *path, char *out, size_t cap);

/* Edit distance; strings longer than 256 bytes compare as very far. */
size_t hs_cfg_levenshtein(const char *a, const char *b);
/* Index of the candidate nearest to `s` (-1 when n == 0). */
int hs_cfg_nearest(const char *s, const char *const *cands, int n, size_t *dist);

/* Load from memory (the fuzz target's entry): like hs_config_load with the
 * text of a file named `origin`. */
hs_status hs_config_load_text(hs_config *c, const char *text, size_t len, const char *origin,
                              const char *const *overrides, int n_overrides, hs_error *e);

#endif
