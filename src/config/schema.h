/* config/schema.h — the one table of configuration keys (private to config/).
 *
 * Every key of hs_config is one row: its dotted path, type, default (as the
 * YAML text a user would write), allowed values, bounds, one doc line and
 * where it lives in the struct. Loading, overrides, defaults, validation of
 * bounds, the resolved dump and the docs table all walk this table, so a key
 * exists exactly when it has a row.
 */
#ifndef HS_CONFIG_SCHEMA_H
#define HS_CONFIG_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>

#include "hypershard/config.h"

typedef enum hs_cfg_type {
    HS_CFG_INT = 0,    /* int                                         */
    HS_CFG_INT64,      /* long long                                   */
    HS_CFG_FLOAT,      /* double                                      */
    HS_CFG_BOOL,       /* bool                                        */
    HS_CFG_STRING,     /* char[size]; nullable ones store null as ""  */
    HS_CFG_ENUM,       /* char[size], one of `choices`                */
    HS_CFG_DTYPE,      /* int: HS_MP_NULL or an hs_dtype              */
    HS_CFG_TRIBOOL,    /* int: -1 null, 0 false, 1 true               */
    HS_CFG_STRLIST,    /* char ** at offset, int count at count_offset */
    HS_CFG_FLOAT_PAIR, /* double[2]                                   */
    HS_CFG_INTLIST,    /* int[size / sizeof(int)], int count at count_offset */
    HS_CFG_BLEND,      /* hs_blend_entry * at offset, int count at count_offset */
    HS_CFG_BOOL_OR,    /* int: the index of the value in `choices`, which
                        * start with "false|true" (a YAML bool names those) */
    HS_CFG_TYPE_COUNT
} hs_cfg_type;

/* Bounds on numbers (each element of a float pair or an integer list). */
enum {
    HS_CFG_MIN = 1, /* value >= min (> min with HS_CFG_MIN_OPEN) */
    HS_CFG_MAX = 2, /* value <= max (< max with HS_CFG_MAX_OPEN) */
    HS_CFG_MIN_OPEN = 4,
    HS_CFG_MAX_OPEN = 8,
    /* The bound is checked by a numbered spec rule with its own message
     * (topology rules in mesh/, prefetch depth in validate.c), not by the
     * generic bound check. */
    HS_CFG_BY_RULE = 16,
};

typedef struct hs_cfg_key {
    const char *path;
    hs_cfg_type type;
    const char *def;     /* default, as YAML text ("1", "null", "[]", "[0.9, 0.95]") */
    const char *choices; /* enums: "a|b|c"; NULL otherwise */
    bool nullable;       /* null allowed: strings store it as "", ints as
                          * hs_cfg_int_null (0 when the minimum is >= 1, else
                          * -1 with a minimum of 0) */
    unsigned bounds;
    double min, max;
    size_t offset;       /* offsetof(hs_config, ...) */
    size_t size;         /* bytes of the field (capacity for strings) */
    size_t count_offset; /* string and integer lists: offsetof the int count */
    const char *allowed; /* docs: what the value may be, when the type alone does not say */
    const char *doc;
} hs_cfg_key;

/* A key that no longer exists and what replaced it. */
typedef struct hs_cfg_removed {
    const char *path;
    const char *replacement; /* a full sentence fragment: "renamed to ..." */
} hs_cfg_removed;

const hs_cfg_key *hs_cfg_keys(int *n);
const hs_cfg_key *hs_cfg_key_find(const char *path);
/* Whether `path` names a section (a strict prefix of some key path). */
bool hs_cfg_is_section(const char *path);
const hs_cfg_removed *hs_cfg_removed_keys(int *n);
const char *hs_cfg_type_name(hs_cfg_type t);

/* The int a nullable integer key stores for null. */
static inline int hs_cfg_int_null(const hs_cfg_key *k) { return k->min >= 1 ? 0 : -1; }

/* A pointer to the key's field inside `c`. */
static inline void *hs_cfg_field(hs_config *c, const hs_cfg_key *k) {
    return (char *)c + k->offset;
}
static inline const void *hs_cfg_cfield(const hs_config *c, const hs_cfg_key *k) {
    return (const char *)c + k->offset;
}

#endif
