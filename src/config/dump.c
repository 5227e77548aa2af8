/* The resolved config as YAML (every key, schema order), the derived
 * topology block, the config hash and the docs table — all from the schema. */
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

/* Length of the section part of `path` ("fsdp_config.mix_precision" for
 * "fsdp_config.mix_precision.param_dtype"). */
static size_t section_len(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot ? (size_t)(dot - path) : 0;
}

/* Number of leading section names `a` and `b` share ("x.y" and "x.z": 1). */
static int shared_parts(const char *a, size_t na, const char *b, size_t nb) {
    int shared = 0;
    size_t i = 0;
    while (i < na && i < nb) {
        size_t ea = i, eb = i;
        while (ea < na && a[ea] != '.') ea++;
        while (eb < nb && b[eb] != '.') eb++;
        if (ea != eb || memcmp(a + i, b + i, ea - i)) break;
        shared++;
        i = ea + 1;
    }
    return shared;
}

static void write_indent(FILE *f, int depth) {
    for (int i = 0; i < depth; i++) fputs("  ", f);
}

/* Keys of a section are contiguous in the schema, so a section is opened
 * when its first key is written and never again. `only`: one top-level
 * section's name, or NULL for every key. */
static void dump_keys(const hs_config *c, const char *only, FILE *f) {
    int n;
    const hs_cfg_key *keys = hs_cfg_keys(&n);
    const char *prev = "";
    size_t prev_len = 0, only_len = only ? strlen(only) : 0;
    for (int i = 0; i < n; i++) {
        const char *p = keys[i].path;
        if (only && (strncmp(p, only, only_len) != 0 || p[only_len] != '.')) continue;
        size_t len = section_len(p);
        int shared = shared_parts(prev, prev_len, p, len), depth = 0;
        for (size_t start = 0, j = 0; len && j <= len; j++) {
            if (j < len && p[j] != '.') continue;
            if (depth >= shared) {
                write_indent(f, depth);
                fprintf(f, "%.*s:\n", (int)(j - start), p + start);
            }
            depth++;
            start = j + 1;
        }
        write_indent(f, depth);
        fprintf(f, "%s: ", p + (len ? len + 1 : 0));
        hs_cfg_write_value(c, &keys[i], f);
        fputc('\n', f);
        prev = p, prev_len = len;
    }
}

/* "  name: [[0, 1], [2, 3]]": the world ranks of every `dim` group, the
 * groups in the order of their first ranks. */
static hs_status dump_groups(const hs_topology *t, hs_mesh_dim dim, const char *name, FILE *f,
                             hs_error *e) {
    size_t bytes = sizeof(int) * (size_t)(t->world > 0 ? t->world : 1);
    int *ranks = malloc(bytes);
    if (!ranks)
        return hs_error_oom(e, "dumping the %s of %d ranks: %zu bytes", name, t->world, bytes);
    hs_topology_groups(t, dim, ranks);
    int size = t->world / hs_topology_group_count(t, dim), printed = 0;
    fprintf(f, "  %s: [", name);
    for (int r = 0; r < t->world; r++) {
        if (hs_topology_group_rank(t, dim, r) != 0) continue; /* one group, at its first rank */
        const int *g = ranks + (int64_t)hs_topology_group_index(t, dim, r) * size;
        fprintf(f, "%s[", printed++ ? ", " : "");
        for (int i = 0; i < size; i++) fprintf(f, "%s%d", i ? ", " : "", g[i]);
        fputc(']', f);
    }
    fputs("]\n", f);
    free(ranks);
    return HS_OK;
}

/* "  pp_stages:" then one line per stage: its blocks [first, end) and its
 * world ranks (those whose pp coordinate is the stage, in rank order). The
 * range is quoted so the block stays YAML that loads back. */
/* The stages' lines, from their blocks (first, count: pp x v chunks) and
 * their ranks (stage s: ranks[start[s] .. start[s+1])). */
static void write_stages(const hs_config *c, int pp, int v, const int *first, const int *count,
                         const int *start, const int *ranks, FILE *f) {
    fprintf(f, "  pp_schedule: %s\n", c->accelerator.pp_schedule);
    if (v > 1) fprintf(f, "  pp_virtual_stages: %d\n", v);
    fputs("  pp_stages:\n", f);
    for (int s = 0; s < pp; s++) {
        /* stage s runs chunks s, s + pp, ... (zbv: s, 2 pp - 1 - s): one range each */
        fprintf(f, "    - {stage: %d, layers: \"", s);
        for (int k = 0; k < v; k++) {
            int ch = hs_config_pp_chunk(&c->accelerator, s, k);
            fprintf(f, "%s[%d, %d)", k ? " " : "", first[ch], first[ch] + count[ch]);
        }
        fputs("\", ranks: [", f);
        for (int i = start[s]; i < start[s + 1]; i++)
            fprintf(f, "%s%d", i > start[s] ? ", " : "", ranks[i]);
        fputs("]}\n", f);
    }
}

static hs_status dump_stages(const hs_config *c, const hs_topology *t, FILE *f, hs_error *e) {
    int pp = t->pp, world = t->world;
    int v = c->accelerator.pp_virtual_stages > 1 ? c->accelerator.pp_virtual_stages : 1;
    size_t chunks = (size_t)pp * (size_t)v;
    int *first = malloc(sizeof(int) * chunks), *count = malloc(sizeof(int) * chunks);
    int *start = calloc((size_t)pp + 1, sizeof(int)), *fill = malloc(sizeof(int) * (size_t)pp);
    int *stage = malloc(sizeof(int) * (size_t)world), *ranks = malloc(sizeof(int) * (size_t)world);
    hs_status st = HS_OK;
    if (first && count && start && fill && stage && ranks) {
        hs_config_pp_stages(&c->accelerator, c->model.n_layers, first, count);
        /* Bucket the ranks by stage, keeping rank order: O(world), not O(pp x world). */
        for (int r = 0; r < world; r++) start[(stage[r] = hs_topology_coords(t, r).pp) + 1]++;
        for (int s = 0; s < pp; s++) start[s + 1] += start[s];
        for (int s = 0; s < pp; s++) fill[s] = start[s];
        for (int r = 0; r < world; r++) ranks[fill[stage[r]]++] = r;
        write_stages(c, pp, v, first, count, start, ranks, f);
    } else {
        st = hs_error_oom(e, "dumping %d pipeline stages of %d ranks: %zu bytes", pp, world,
                          sizeof(int) * (2 * chunks + 2 * (size_t)pp + 1 + 2 * (size_t)world));
    }
    free(first);
    free(count);
    free(start);
    free(fill);
    free(stage);
    free(ranks);
    return st;
}

static hs_status dump_derived(const hs_config *c, const hs_topology *t, FILE *f, hs_error *e) {
    char why[512];
    bool active = hs_topology_fsdp_active(t, why, sizeof why);
    fprintf(f, "derived:\n");
    fprintf(f, "  world_size: %d\n", t->world);
    fprintf(f, "  dp_size: %d\n", t->dp);
    fprintf(f, "  fsdp_data_parallel_size: %d\n", t->fsdp_dp);
    fprintf(f, "  dp_replicate_size: %d\n", t->dp_replicate);
    fprintf(f, "  expert_domain: %d\n", t->expert_domain);
    fprintf(f, "  edp_size: %d\n", t->edp);
    fprintf(f, "  edp_replicate_size: %d\n", t->edp_replicate);
    fprintf(f, "  global_batch_size: %lld%s\n", hs_config_global_batch(c, t),
            c->train.global_batch_size > 0 ? ""
            : t->pp > 1                    ? "   # micro_batch_size x dp_size x pp_size"
                                           : "   # micro_batch_size x dp_size");
    fprintf(f, "  micro_batches_per_step: %d\n", hs_config_micro_batches(c, t));
    hs_status st = HS_OK;
    if (t->pp > 1) {
        st = dump_stages(c, t, f, e);
        if (st == HS_OK) st = dump_groups(t, HS_DIM_PP, "pp_groups", f, e);
    }
    if (st == HS_OK) st = dump_groups(t, HS_DIM_TP, "tp_groups", f, e);
    if (st == HS_OK) st = dump_groups(t, HS_DIM_FSDP_SHARD, "fsdp_shard_groups", f, e);
    if (st == HS_OK) st = dump_groups(t, HS_DIM_FSDP_REPLICATE, "fsdp_replicate_groups", f, e);
    if (t->ep > 1) { /* fsdp_moe_mesh */
        if (st == HS_OK) st = dump_groups(t, HS_DIM_EP, "ep_groups", f, e);
        if (st == HS_OK) st = dump_groups(t, HS_DIM_EDP_SHARD, "edp_shard_groups", f, e);
        if (st == HS_OK) st = dump_groups(t, HS_DIM_EDP_REPLICATE, "edp_replicate_groups", f, e);
    }
    if (st != HS_OK) return st;
    fprintf(f, "  fsdp_manager: %s\n", active ? "created" : "skipped");
    fputs("  fsdp_reason: \"", f);
    for (const char *p = why; *p; p++) {
        if (*p == '"' || *p == '\\') fputc('\\', f);
        fputc((unsigned char)*p < 0x20 ? ' ' : *p, f);
    }
    fputs("\"\n", f);
    return HS_OK;
}

hs_status hs_config_dump(const hs_config *c, const hs_topology *topo, FILE *f, hs_error *e) {
    dump_keys(c, NULL, f);
    return topo ? dump_derived(c, topo, f, e) : HS_OK;
}

void hs_config_dump_section(const hs_config *c, const char *section, FILE *f) {
    dump_keys(c, section, f);
}

hs_status hs_config_hash(const hs_config *c, uint64_t *hash, hs_error *e) {
    char *buf = NULL;
    size_t len = 0;
    *hash = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return hs_error_oom(e, "hashing the config: a memory stream");
    hs_config_dump(c, NULL, f, NULL); /* without a topology nothing is allocated */
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return hs_error_oom(e, "hashing the config: its %zu-byte dump", len);
    }
    *hash = hs_hash64(buf);
    free(buf);
    return HS_OK;
}

static void write_allowed(const hs_cfg_key *k, FILE *f) {
    if (k->allowed) {
        for (const char *p = k->allowed; *p; p++) /* a table cell: escape the bars */
            if (*p == '|') fputs("\\|", f);
            else fputc(*p, f);
    } else if (k->choices) {
        for (const char *p = k->choices; *p; p++)
            if (*p == '|') fputs(" \\| ", f);
            else fputc(*p, f);
        if (k->type == HS_CFG_DTYPE) fputs(" \\| null", f);
    } else if (k->type == HS_CFG_STRING) {
        fputs(k->nullable ? "string or null" : "string", f);
    } else if (k->type == HS_CFG_TRIBOOL) {
        fputs("true \\| false \\| null", f);
    } else if (k->type == HS_CFG_BOOL) {
        fputs("true \\| false", f);
    } else if (k->type == HS_CFG_BLEND) {
        fputs("list of mappings", f);
    } else if (k->type == HS_CFG_INTLIST) {
        fprintf(f, "list of at most %zu integers", k->size / sizeof(int));
        if (k->bounds & HS_CFG_MIN)
            fprintf(f, ", each %s %g", k->bounds & HS_CFG_MIN_OPEN ? ">" : "≥", k->min);
    } else {
        fputs(k->type == HS_CFG_INT || k->type == HS_CFG_INT64 ? "integer" : "number", f);
        if (k->type == HS_CFG_FLOAT_PAIR) fputs(" pair, each", f);
        char lo[64], hi[64];
        snprintf(lo, sizeof lo, "%g", k->min);
        snprintf(hi, sizeof hi, "%g", k->max);
        bool open_lo = k->bounds & HS_CFG_MIN_OPEN, open_hi = k->bounds & HS_CFG_MAX_OPEN;
        if ((k->bounds & HS_CFG_MIN) && (k->bounds & HS_CFG_MAX))
            fprintf(f, " in %c%s, %s%c", open_lo ? '(' : '[', lo, hi, open_hi ? ')' : ']');
        else if (k->bounds & HS_CFG_MIN) fprintf(f, " %s %s", open_lo ? ">" : "≥", lo);
        if (k->nullable) fputs(" or null", f);
    }
}

hs_status hs_config_schema_markdown(FILE *f, hs_error *e) {
    int n;
    const hs_cfg_key *keys = hs_cfg_keys(&n);
    hs_config d;
    hs_status st = hs_config_defaults(&d, e);
    if (st != HS_OK) return st;
    fputs("| key | default | allowed | meaning |\n| --- | --- | --- | --- |\n", f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "| `%s` | `", keys[i].path);
        hs_cfg_write_value(&d, &keys[i], f);
        fputs("` | ", f);
        write_allowed(&keys[i], f);
        fprintf(f, " | %s |\n", keys[i].doc);
    }
    hs_config_free(&d);
    int nr;
    const hs_cfg_removed *r = hs_cfg_removed_keys(&nr);
    fputs("\n| removed key | what happened |\n| --- | --- |\n", f);
    for (int i = 0; i < nr; i++) fprintf(f, "| `%s` | %s |\n", r[i].path, r[i].replacement);
    return HS_OK;
}
