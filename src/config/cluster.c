/* The cluster file (config.h, docs/plan.md "Cluster files"): libyaml's
 * document tree walked against a fixed key list. Every problem of a file is
 * reported together, each with its line; nothing is kept of a file that has
 * one. */
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "hypershard/config.h"

#define CLUSTER_MAX_BYTES ((size_t)1 << 20)

typedef struct walk {
    yaml_document_t *doc;
    const char *file;
    hs_error *e;
    int errors;
} walk;

static void report(walk *w, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* One problem of the file, at n's line (0 where there is no node). */
static void report(walk *w, const yaml_node_t *n, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    hs_error_append(w->e, HS_ERR_CONFIG, "%s:%zu: %s", w->file, n ? n->start_mark.line + 1 : 0,
                    msg);
    w->errors++;
}

static const char *scalar(const yaml_node_t *n) {
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* The value of `key` in mapping m, or NULL. */
static yaml_node_t *get(walk *w, yaml_node_t *m, const char *key) {
    if (!m || m->type != YAML_MAPPING_NODE) return NULL;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        const char *k = scalar(yaml_document_get_node(w->doc, p->key));
        if (k && !strcmp(k, key)) return yaml_document_get_node(w->doc, p->value);
    }
    return NULL;
}

/* Every key of mapping m must be one of `known` (NULL-terminated). */
static void only(walk *w, yaml_node_t *m, const char *where, const char *const *known) {
    if (!m) return;
    if (m->type != YAML_MAPPING_NODE) {
        report(w, m, "%s: expected a mapping of keys", where);
        return;
    }
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(w->doc, p->key);
        const char *k = scalar(kn);
        bool ok = false;
        for (int i = 0; k && known[i] && !ok; i++) ok = !strcmp(k, known[i]);
        if (ok) continue;
        char list[256] = "";
        for (int i = 0; known[i]; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     known[i]);
        char key[160];
        snprintf(key, sizeof key, "%s%s%s", where, *where ? "." : "", k ? k : "?");
        report(w, kn, "unknown key %s; the keys here are: %s", key, list);
    }
}

/* A number at `key` of m into *out: > 0 (>= 0 with zero_ok); missing is an
 * error when `need`, else *out keeps its default. */
static void number(walk *w, yaml_node_t *m, const char *where, const char *key, bool need,
                   bool zero_ok, double *out) {
    yaml_node_t *n = get(w, m, key);
    char path[160];
    snprintf(path, sizeof path, "%s%s%s", where, *where ? "." : "", key);
    if (!n) {
        if (need) report(w, m, "%s is missing: give it a number", path);
        return;
    }
    const char *s = scalar(n);
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : NAN;
    if (!s || end == s || *end || errno || !isfinite(v) || v < 0 || (!zero_ok && v == 0)) {
        report(w, n, "%s = '%s': expected a number above zero", path, s ? s : "(not a scalar)");
        return;
    }
    *out = v;
}

static void integer(walk *w, yaml_node_t *m, const char *where, const char *key, bool need,
                    int *out) {
    double v = *out;
    number(w, m, where, key, need, false, &v);
    if (v != floor(v) || v > (1 << 30)) {
        char path[160];
        snprintf(path, sizeof path, "%s%s%s", where, *where ? "." : "", key);
        report(w, get(w, m, key), "%s: expected a whole number", path);
        return;
    }
    *out = (int)v;
}

static void text(walk *w, yaml_node_t *m, const char *key, char *out, size_t cap) {
    const char *s = scalar(get(w, m, key));
    if (s) snprintf(out, cap, "%s", s);
}

static void by_dtype(walk *w, yaml_node_t *m, const char *where, double *out) {
    static const char *const keys[] = {"f32", "bf16", "f16", NULL};
    only(w, m, where, keys);
    for (int d = 0; d < 3; d++) number(w, m, where, keys[d], false, true, &out[d]);
}

static void read_link(walk *w, yaml_node_t *m, const char *where, bool need, hs_cluster_link *out) {
    static const char *const keys[] = {"bandwidth", "latency", "by_ranks", NULL};
    static const char *const row_keys[] = {"ranks", "node_ranks", "bandwidth", "latency", NULL};
    if (!m) {
        if (need) report(w, NULL, "%s is missing: give its bandwidth and latency", where);
        return;
    }
    only(w, m, where, keys);
    number(w, m, where, "bandwidth", true, false, &out->bandwidth);
    number(w, m, where, "latency", true, true, &out->latency);
    yaml_node_t *rows = get(w, m, "by_ranks");
    if (!rows) return;
    if (rows->type != YAML_SEQUENCE_NODE) {
        report(w, rows, "%s.by_ranks: expected a list of {ranks, bandwidth, latency}", where);
        return;
    }
    for (yaml_node_item_t *i = rows->data.sequence.items.start; i < rows->data.sequence.items.top;
         i++) {
        yaml_node_t *r = yaml_document_get_node(w->doc, *i);
        if (out->n_by_ranks == HS_CLUSTER_TABLE_MAX) {
            report(w, r, "%s.by_ranks: more than 64 rows", where);
            return;
        }
        char at[96];
        snprintf(at, sizeof at, "%s.by_ranks[%d]", where, out->n_by_ranks);
        hs_cluster_group *g = &out->by_ranks[out->n_by_ranks++];
        only(w, r, at, row_keys);
        integer(w, r, at, "ranks", true, &g->ranks);
        integer(w, r, at, "node_ranks", false, &g->node_ranks);
        number(w, r, at, "bandwidth", true, false, &g->bandwidth);
        number(w, r, at, "latency", true, true, &g->latency);
    }
}

static void gemm_table(walk *w, yaml_node_t *rows, hs_cluster *c) {
    static const char *const keys[] = {"dtype", "m", "n", "k", "flops", NULL};
    if (!rows) return;
    if (rows->type != YAML_SEQUENCE_NODE) {
        report(w, rows, "device.gemm: expected a list of {dtype, m, n, k, flops}");
        return;
    }
    for (yaml_node_item_t *i = rows->data.sequence.items.start; i < rows->data.sequence.items.top;
         i++) {
        yaml_node_t *r = yaml_document_get_node(w->doc, *i);
        if (c->n_gemm == HS_CLUSTER_TABLE_MAX) {
            report(w, r, "device.gemm: more than 64 rows");
            return;
        }
        char at[64];
        snprintf(at, sizeof at, "device.gemm[%d]", c->n_gemm);
        hs_cluster_gemm *g = &c->gemm[c->n_gemm++];
        only(w, r, at, keys);
        const char *dt = scalar(get(w, r, "dtype"));
        if (!dt || !hs_dtype_parse(dt, &g->dtype))
            report(w, r, "%s.dtype: expected float32, bfloat16 or float16, not '%s'", at,
                   dt ? dt : "(missing)");
        int m = 0, n = 0, k = 0;
        integer(w, r, at, "m", true, &m);
        integer(w, r, at, "n", true, &n);
        integer(w, r, at, "k", true, &k);
        g->m = m, g->n = n, g->k = k;
        number(w, r, at, "flops", true, false, &g->flops);
    }
}

static void read_cluster(walk *w, yaml_node_t *root, hs_cluster *c) {
    static const char *const top[] = {"name", "nodes", "node", "device", "links", "overlap", NULL};
    static const char *const node_keys[] = {"devices", "shared", "nics", "lend", NULL};
    static const char *const dev_keys[] = {"name",
                                           "flops",
                                           "gemm_efficiency",
                                           "attention_efficiency",
                                           "elementwise_efficiency",
                                           "attention",
                                           "attention_scores",
                                           "memory_bytes",
                                           "memory_bandwidth",
                                           "routing_bandwidth",
                                           "gemm",
                                           NULL};
    static const char *const link_keys[] = {"intra_node", "inter_node", NULL};
    if (!root || root->type != YAML_MAPPING_NODE) {
        report(w, root, "the file is not a mapping of keys (name, nodes, node, device, links)");
        return;
    }
    only(w, root, "", top);
    text(w, root, "name", c->name, sizeof c->name);
    integer(w, root, "", "nodes", true, &c->nodes);
    number(w, root, "", "overlap", false, true, &c->overlap);
    yaml_node_t *node = get(w, root, "node"), *dev = get(w, root, "device");
    if (!node) report(w, root, "node is missing: give node.devices");
    only(w, node, "node", node_keys);
    integer(w, node, "node", "devices", true, &c->devices_per_node);
    integer(w, node, "node", "nics", false, &c->nics_per_node);
    number(w, node, "node", "lend", false, true, &c->lend);
    if (c->lend > 1) report(w, node, "node.lend: expected a share from 0 to 1");
    const char *sh = scalar(get(w, node, "shared"));
    if (sh && strcmp(sh, "true") && strcmp(sh, "false"))
        report(w, get(w, node, "shared"), "node.shared = '%s': expected true or false", sh);
    c->shared = sh && !strcmp(sh, "true");
    if (!dev) report(w, root, "device is missing: give device.flops and the rest");
    only(w, dev, "device", dev_keys);
    text(w, dev, "name", c->device_name, sizeof c->device_name);
    yaml_node_t *fl = get(w, dev, "flops");
    if (!fl) report(w, dev, "device.flops is missing: give the nominal f32 and bf16 FLOP/s");
    by_dtype(w, fl, "device.flops", c->peak);
    if (fl && c->peak[HS_DTYPE_F32] <= 0)
        report(w, fl, "device.flops.f32 is missing: give the nominal fp32 FLOP/s");
    by_dtype(w, get(w, dev, "attention"), "device.attention", c->attention);
    static const char *const score_keys[] = {"forward", "backward", NULL};
    yaml_node_t *scores = get(w, dev, "attention_scores");
    only(w, scores, "device.attention_scores", score_keys);
    for (int k = 0; k < 2; k++)
        number(w, scores, "device.attention_scores", score_keys[k], scores != NULL, true,
               &c->score_bytes[k]);
    number(w, dev, "device", "gemm_efficiency", false, false, &c->gemm_efficiency);
    number(w, dev, "device", "attention_efficiency", false, false, &c->attention_efficiency);
    number(w, dev, "device", "elementwise_efficiency", false, false, &c->elementwise_efficiency);
    number(w, dev, "device", "memory_bytes", true, false, &c->memory_bytes);
    number(w, dev, "device", "memory_bandwidth", true, false, &c->memory_bandwidth);
    number(w, dev, "device", "routing_bandwidth", false, false, &c->routing_bandwidth);
    gemm_table(w, get(w, dev, "gemm"), c);
    yaml_node_t *links = get(w, root, "links");
    if (!links) report(w, root, "links is missing: give links.intra_node");
    only(w, links, "links", link_keys);
    read_link(w, get(w, links, "intra_node"), "links.intra_node", true, &c->intra);
    read_link(w, get(w, links, "inter_node"), "links.inter_node", c->nodes > 1, &c->inter);
    if (c->nodes > 1 && c->nics_per_node < 1)
        report(w, node, "node.nics is missing: a cluster of more than one node needs its NICs");
    if (c->overlap > 1) report(w, root, "overlap: expected a share from 0 to 1");
    if (c->gemm_efficiency > 1 || c->attention_efficiency > 1 || c->elementwise_efficiency > 1)
        report(w, dev, "device.*_efficiency: expected shares from 0 to 1");
}

hs_status hs_cluster_parse(const char *name, const char *text, size_t len, hs_cluster *out,
                           hs_error *e) {
    hs_error_clear(e);
    *out = (hs_cluster){.gemm_efficiency = 0.7,
                        .attention_efficiency = 0.4,
                        .elementwise_efficiency = 0.7,
                        .lend = 1.0,
                        .overlap = 1.0};
    if (len > CLUSTER_MAX_BYTES)
        return hs_error_set(e, HS_ERR_CONFIG, "--cluster %s: over 1 MiB; a cluster file is small",
                            name);
    yaml_parser_t p;
    yaml_document_t doc;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    hs_status rc = HS_OK;
    if (!yaml_parser_load(&p, &doc)) {
        rc = hs_error_set(e, HS_ERR_CONFIG, "%s:%zu:%zu: YAML syntax: %s", name,
                          p.problem_mark.line + 1, p.problem_mark.column + 1,
                          p.problem ? p.problem : "unreadable");
    } else {
        walk w = {.doc = &doc, .file = name, .e = e};
        read_cluster(&w, yaml_document_get_root_node(&doc), out);
        if (w.errors) rc = HS_ERR_CONFIG;
        yaml_document_delete(&doc);
    }
    yaml_parser_delete(&p);
    return rc;
}

hs_status hs_cluster_load(const char *path, hs_cluster *out, hs_error *e) {
    hs_error_clear(e);
    FILE *f = fopen(path, "rb");
    if (!f)
        return hs_error_set(e, HS_ERR_CONFIG, "--cluster %s: cannot open it (%s)", path,
                            strerror(errno));
    char *buf = malloc(CLUSTER_MAX_BYTES + 1);
    size_t len = buf ? fread(buf, 1, CLUSTER_MAX_BYTES + 1, f) : 0;
    fclose(f);
    if (!buf) return hs_error_oom(e, "the cluster file %s", path);
    hs_status rc = hs_cluster_parse(path, buf, len, out, e);
    free(buf);
    return rc;
}

static void write_link(FILE *f, const char *name, const hs_cluster_link *l) {
    fprintf(f, "  %s:\n    bandwidth: %.4g\n    latency: %.4g\n", name, l->bandwidth, l->latency);
    if (l->n_by_ranks) fprintf(f, "    by_ranks:\n");
    for (int i = 0; i < l->n_by_ranks; i++) {
        const hs_cluster_group *r = &l->by_ranks[i];
        fprintf(f, "      - {ranks: %d, ", r->ranks);
        if (r->node_ranks > 0) fprintf(f, "node_ranks: %d, ", r->node_ranks);
        fprintf(f, "bandwidth: %.4g, latency: %.4g}\n", r->bandwidth, r->latency);
    }
}

/* s as a double-quoted YAML scalar's inside: quotes, backslashes and
 * control bytes become '?'. */
static const char *quoted(const char *s, char *out, size_t cap) {
    size_t n = 0;
    for (; *s && n + 1 < cap; s++)
        out[n++] = *s == '"' || *s == '\\' || (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
    out[n] = '\0';
    return out;
}

void hs_cluster_write(const hs_cluster *c, FILE *f) {
    static const char *const dn[] = {"f32", "bf16", "f16"};
    char q[sizeof c->name];
    fprintf(f, "name: \"%s\"\nnodes: %d\nnode:\n  devices: %d\n  shared: %s\n",
            quoted(c->name, q, sizeof q), c->nodes, c->devices_per_node,
            c->shared ? "true" : "false");
    if (c->nics_per_node) fprintf(f, "  nics: %d\n", c->nics_per_node);
    if (c->shared) fprintf(f, "  lend: %.4g\n", c->lend);
    fprintf(f, "device:\n  name: \"%s\"\n  flops:\n", quoted(c->device_name, q, sizeof q));
    for (int d = 0; d < 3; d++)
        if (c->peak[d] > 0) fprintf(f, "    %s: %.4g\n", dn[d], c->peak[d]);
    fprintf(f,
            "  gemm_efficiency: %.4g\n  attention_efficiency: %.4g\n"
            "  elementwise_efficiency: %.4g\n  memory_bytes: %.4g\n  memory_bandwidth: %.4g\n",
            c->gemm_efficiency, c->attention_efficiency, c->elementwise_efficiency, c->memory_bytes,
            c->memory_bandwidth);
    if (c->routing_bandwidth > 0) fprintf(f, "  routing_bandwidth: %.4g\n", c->routing_bandwidth);
    bool att = false;
    for (int d = 0; d < 3; d++) att |= c->attention[d] > 0;
    if (att) fprintf(f, "  attention:\n");
    for (int d = 0; d < 3; d++)
        if (c->attention[d] > 0) fprintf(f, "    %s: %.4g\n", dn[d], c->attention[d]);
    if (c->score_bytes[0] > 0 || c->score_bytes[1] > 0)
        fprintf(f, "  attention_scores:\n    forward: %.4g\n    backward: %.4g\n",
                c->score_bytes[0], c->score_bytes[1]);
    if (c->n_gemm) fprintf(f, "  gemm:\n");
    for (int i = 0; i < c->n_gemm; i++)
        fprintf(f, "    - {dtype: %s, m: %lld, n: %lld, k: %lld, flops: %.4g}\n",
                hs_dtype_name(c->gemm[i].dtype), (long long)c->gemm[i].m, (long long)c->gemm[i].n,
                (long long)c->gemm[i].k, c->gemm[i].flops);
    fprintf(f, "links:\n");
    write_link(f, "intra_node", &c->intra);
    if (c->inter.bandwidth > 0) write_link(f, "inter_node", &c->inter);
    fprintf(f, "overlap: %.4g\n", c->overlap);
}
