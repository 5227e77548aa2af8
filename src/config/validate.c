/* Validation: spec 004 §4.1 rules 1–11 and the trainer's own rules. Every
 * violated rule is reported (not just the first), each naming the config
 * path(s), the values and a fix. Rules that need the topology run only when
 * it could be derived. The topology rules come first, then the pipeline
 * rules that need only the config. */
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"
#include "config/checks.h"

/* ------------------------------------------------------- generic bounds */

static bool in_bounds(const hs_cfg_key *k, double v) {
    bool open_lo = k->bounds & HS_CFG_MIN_OPEN, open_hi = k->bounds & HS_CFG_MAX_OPEN;
    if ((k->bounds & HS_CFG_MIN) && (open_lo ? v <= k->min : v < k->min)) return false;
    if ((k->bounds & HS_CFG_MAX) && (open_hi ? v >= k->max : v > k->max)) return false;
    return true;
}

static void range_text(const hs_cfg_key *k, char *out, size_t cap) {
    bool open_lo = k->bounds & HS_CFG_MIN_OPEN, open_hi = k->bounds & HS_CFG_MAX_OPEN;
    if ((k->bounds & HS_CFG_MIN) && (k->bounds & HS_CFG_MAX))
        snprintf(out, cap, "in %c%g, %g%c", open_lo ? '(' : '[', k->min, k->max,
                 open_hi ? ')' : ']');
    else snprintf(out, cap, "%s %g", open_lo ? ">" : ">=", k->min);
}

/* Each item of an integer list, "path[i] = v is out of range ...". */
static void check_int_list_bounds(const hs_config *c, const hs_cfg_key *k, hs_cfg_report *rep) {
    const int *v = hs_cfg_cfield(c, k);
    int n = *(const int *)((const char *)c + k->count_offset);
    for (int j = 0; j < n; j++) {
        if (in_bounds(k, v[j])) continue;
        char range[96];
        range_text(k, range, sizeof range);
        hs_cfg_report_add(rep, "%s[%d] = %d is out of range: it must be %s (%s)", k->path, j, v[j],
                          range, k->doc);
    }
}

static void check_bounds(const hs_config *c, hs_cfg_report *rep) {
    int n;
    const hs_cfg_key *keys = hs_cfg_keys(&n);
    for (int i = 0; i < n; i++) {
        const hs_cfg_key *k = &keys[i];
        if (!(k->bounds & (HS_CFG_MIN | HS_CFG_MAX)) || (k->bounds & HS_CFG_BY_RULE)) continue;
        if (k->type == HS_CFG_INTLIST) {
            check_int_list_bounds(c, k, rep);
            continue;
        }
        const void *p = hs_cfg_cfield(c, k);
        double v[2];
        int nv = 1;
        if (k->type == HS_CFG_INT && k->nullable && *(const int *)p == hs_cfg_int_null(k))
            continue; /* null */
        if (k->type == HS_CFG_INT) v[0] = *(const int *)p;
        else if (k->type == HS_CFG_INT64) v[0] = (double)*(const long long *)p;
        else if (k->type == HS_CFG_FLOAT) v[0] = *(const double *)p;
        else if (k->type == HS_CFG_FLOAT_PAIR) memcpy(v, p, sizeof v), nv = 2;
        else continue;
        for (int j = 0; j < nv; j++) {
            if (in_bounds(k, v[j])) continue;
            char range[96], val[64];
            range_text(k, range, sizeof range);
            hs_cfg_format_double(v[j], val, sizeof val);
            if (k->type == HS_CFG_INT) snprintf(val, sizeof val, "%d", (int)v[j]);
            hs_cfg_report_add(rep, "%s%s = %s is out of range: it must be %s (%s)", k->path,
                              nv == 2 ? (j ? "[1]" : "[0]") : "", val, range, k->doc);
        }
    }
}

/* ------------------------------------------------------------ spec rules */

static void check_prefetch(const hs_config *c, hs_cfg_report *rep) { /* rule 3 */
    const char *what[2] = {"forward", "backward"};
    int depth[2] = {c->fsdp.forward_prefetch_depth, c->fsdp.backward_prefetch_depth};
    for (int i = 0; i < 2; i++)
        if (depth[i] < 0)
            hs_cfg_report_add(rep,
                              "fsdp_config.%s_prefetch_depth = %d must be >= 0: it is the number "
                              "of units whose all-gather is issued ahead (0 turns %s prefetch "
                              "off) [rule 3]",
                              what[i], depth[i], what[i]);
}

static const char *dtype_text(int dt) {
    return dt == HS_MP_NULL ? "null" : hs_dtype_name((hs_dtype)dt);
}

static void check_precision(const hs_config *c, hs_cfg_report *rep) { /* rules 8, 9 */
    const hs_mix_precision *mp = &c->fsdp.mix_precision;
    if (mp->fp32_main_grad && mp->reduce_dtype != HS_DTYPE_F32)
        hs_cfg_report_add(rep,
                          "fsdp_config.mix_precision.fp32_main_grad = true needs "
                          "fsdp_config.mix_precision.reduce_dtype = float32, got %s; set "
                          "reduce_dtype: float32 (or fp32_main_grad: false) [rule 8]",
                          dtype_text(mp->reduce_dtype));
    if (mp->fp32_main_grad != c->optimizer.fp32_main_params)
        hs_cfg_report_add(rep,
                          "fsdp_config.mix_precision.fp32_main_grad = %s but "
                          "optimizer.fp32_main_params = %s: they must be both true or both "
                          "false; set optimizer.fp32_main_params: %s (or "
                          "fsdp_config.mix_precision.fp32_main_grad: %s) [rule 9]",
                          mp->fp32_main_grad ? "true" : "false",
                          c->optimizer.fp32_main_params ? "true" : "false",
                          mp->fp32_main_grad ? "true" : "false",
                          c->optimizer.fp32_main_params ? "true" : "false");
}

/* The format named s among `allowed` (HS_QUANT_NONE-terminated); NONE
 * for any other. */
static hs_quant_fmt wire_format(const char *s, const hs_quant_fmt *allowed) {
    for (; *allowed != HS_QUANT_NONE; allowed++)
        if (!strcmp(s, hs_quant_fmt_name(*allowed))) return *allowed;
    return HS_QUANT_NONE;
}

hs_quant_fmt hs_fsdp_config_param_gather(const hs_fsdp_config *f) {
    static const hs_quant_fmt fmts[] = {HS_QUANT_INT8, HS_QUANT_FP8_E4M3, HS_QUANT_NONE};
    return wire_format(f->param_gather, fmts);
}

hs_quant_fmt hs_fsdp_config_grad_reduce(const hs_fsdp_config *f) {
    static const hs_quant_fmt fmts[] = {HS_QUANT_INT8, HS_QUANT_INT4, HS_QUANT_NONE};
    return wire_format(f->grad_reduce, fmts);
}

int hs_fsdp_config_grad_block(const hs_fsdp_config *f) {
    if (f->grad_reduce_block > 0) return f->grad_reduce_block;
    return hs_fsdp_config_grad_reduce(f) == HS_QUANT_INT4 ? 32 : 256;
}

static void check_wire_formats(const hs_config *c, hs_cfg_report *rep) {
    const hs_fsdp_config *f = &c->fsdp;
    if (f->param_gather[0] && hs_fsdp_config_param_gather(f) == HS_QUANT_NONE)
        hs_cfg_report_add(rep,
                          "fsdp_config.param_gather = %s is not a wire format; use int8, "
                          "fp8_e4m3 or null (the parameters' own dtype)",
                          f->param_gather);
    if (f->grad_reduce[0] && hs_fsdp_config_grad_reduce(f) == HS_QUANT_NONE)
        hs_cfg_report_add(rep,
                          "fsdp_config.grad_reduce = %s is not a wire format for gradients; "
                          "use int8, int4 or null (reduce_dtype itself)",
                          f->grad_reduce);
    if (hs_fsdp_config_grad_reduce(f) == HS_QUANT_INT4 && f->grad_reduce_block % 2)
        hs_cfg_report_add(rep,
                          "fsdp_config.grad_reduce_block = %d with grad_reduce = int4: two "
                          "values share a byte, so a block must hold an even number of them; "
                          "use %d",
                          f->grad_reduce_block, f->grad_reduce_block + 1);
}

/* hpZ (fsdp_config.secondary_shard_size): a non-trivial divisor of the
 * shard degree, as FSDP2's reshard_after_forward=int. */
static void check_secondary_shard(const hs_config *c, const hs_topology *t, hs_cfg_report *rep) {
    const hs_fsdp_config *f = &c->fsdp;
    int s = f->secondary_shard_size, w = t->dp_shard;
    if (s <= 0) return;
    if (s <= 1 || s >= w || w % s) {
        char choices[160] = "";
        size_t used = 0;
        for (int d = 2; d < w && used + 12 < sizeof choices; d++)
            if (w % d == 0)
                used += (size_t)snprintf(choices + used, sizeof choices - used, "%s%d",
                                         used ? ", " : "", d);
        hs_cfg_report_add(rep,
                          "fsdp_config.secondary_shard_size = %d must divide the shard degree "
                          "(fsdp_config.dp_shard_size = %d) and lie strictly between 1 and it; "
                          "use %s%s",
                          s, w, used ? choices : "null (this shard degree has no such divisor)",
                          used ? " (the shard ranks of one node), or null" : "");
    }
    if (!f->reshard_after_forward)
        hs_cfg_report_add(rep,
                          "fsdp_config.secondary_shard_size = %d with "
                          "fsdp_config.reshard_after_forward = false: the parameters stay whole "
                          "until the backward, so there is no secondary shard to keep; set "
                          "reshard_after_forward: true (or secondary_shard_size: null)",
                          s);
}

static void check_compile(const hs_config *c, const hs_topology *t, const hs_log *log,
                          hs_cfg_report *rep) { /* rule 10 */
    if (!c->compile.fullgraph) return;
    char why[256];
    if (hs_topology_fsdp_active(t, why, sizeof why))
        hs_cfg_report_add(rep,
                          "compile.fullgraph = true is not supported while FSDP is active (%s); "
                          "set compile.fullgraph: false [rule 10]",
                          why);
    else if (log)
        hs_log_warn(log,
                    "compile.fullgraph = true has no effect: FSDP2Manager is skipped (%s) "
                    "and there is no graph compiler",
                    why);
}

/* Copy the topology's error lines into the report, one line each. */
static void add_lines(hs_cfg_report *rep, const char *msg) {
    while (*msg) {
        const char *nl = strchr(msg, '\n');
        int len = nl ? (int)(nl - msg) : (int)strlen(msg);
        if (len) hs_cfg_report_add(rep, "%.*s", len, msg);
        msg += len + (nl ? 1 : 0);
    }
}

/* Whether tp x cp x pp exceeds the world, computed without overflow. */
static bool model_ranks_exceed(const hs_accel_config *a, int world) {
    long long p = 1;
    int sizes[3] = {a->tp_size, a->cp_size, a->pp_size};
    for (int i = 0; i < 3; i++) {
        if (sizes[i] < 1) return false; /* the topology names the bad size */
        p *= sizes[i];
        if (p > world) return true;
    }
    return false;
}

static bool derive_topology(const hs_config *c, int world, hs_topology *t, hs_cfg_report *rep) {
    const hs_accel_config *a = &c->accelerator;
    hs_error te;
    hs_error_clear(&te);
    if (model_ranks_exceed(a, world)) { /* rule 4, before any product can overflow */
        hs_cfg_report_add(rep,
                          "world size %d is smaller than accelerator.tp_size x cp_size x pp_size "
                          "(tp=%d, cp=%d, pp=%d); start tp x cp x pp ranks or a multiple, or "
                          "lower the sizes [rule 4]",
                          world, a->tp_size, a->cp_size, a->pp_size);
        return false;
    }
    if (hs_topology_derive(t, world, a->tp_size, a->cp_size, a->ep_size, a->pp_size,
                           c->fsdp.dp_shard_size, c->fsdp.edp_shard_size, &te) == HS_OK)
        return true;
    add_lines(rep, te.msg);
    if (te.lines == 0 && rep->count == 0)
        hs_cfg_report_add(rep, "the parallel topology of world size %d is invalid", world);
    return false;
}

typedef struct named_item {
    const char *name;
    int index;
} named_item;

typedef struct repeat {
    int index, first; /* replicate_params[index] repeats replicate_params[first] */
} repeat;

static int by_name_then_index(const void *a, const void *b) {
    const named_item *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

static int by_index(const void *a, const void *b) {
    const repeat *x = a, *y = b;
    return (x->index > y->index) - (x->index < y->index);
}

/* Sorting makes this O(n log n): a list of 500k names is checked at once.
 * Each repeat is reported against the first occurrence, in list order. */
static void check_duplicates(const hs_config *c, hs_cfg_report *rep) {
    int n = c->fsdp.n_replicate_params;
    if (n < 2) return;
    named_item *items = malloc(sizeof *items * (size_t)n);
    repeat *reps = malloc(sizeof *reps * (size_t)n);
    if (!items || !reps) {
        free(items);
        free(reps);
        hs_cfg_report_oom(rep, "checking %d replicate_params for repeats: %zu bytes", n,
                          (sizeof *items + sizeof *reps) * (size_t)n);
        return;
    }
    for (int i = 0; i < n; i++) items[i] = (named_item){c->fsdp.replicate_params[i], i};
    qsort(items, (size_t)n, sizeof *items, by_name_then_index);
    int nr = 0;
    for (int i = 1, first = 0; i < n; i++) {
        if (strcmp(items[i].name, items[first].name)) first = i;
        else reps[nr++] = (repeat){items[i].index, items[first].index};
    }
    qsort(reps, (size_t)nr, sizeof *reps, by_index);
    for (int k = 0; k < nr; k++)
        hs_cfg_report_add(rep,
                          "fsdp_config.replicate_params[%d] = '%.200s' repeats item %d; list each "
                          "parameter once",
                          reps[k].index, c->fsdp.replicate_params[reps[k].index], reps[k].first);
    free(items);
    free(reps);
}

hs_status hs_config_validate(const hs_config *c, int world, hs_topology *topo, const hs_log *log,
                             hs_error *e) {
    hs_error_clear(e);
    if (world < 1)
        return hs_error_set(e, HS_ERR_USAGE, "world size %d is invalid; it must be >= 1", world);
    hs_cfg_report rep = {e, 0};
    check_bounds(c, &rep);
    check_prefetch(c, &rep);
    hs_topology t;
    memset(&t, 0, sizeof t);
    bool topo_ok = derive_topology(c, world, &t, &rep);
    hs_cfg_check_pp(c, &rep);
    check_precision(c, &rep);
    check_wire_formats(c, &rep);
    check_duplicates(c, &rep);
    hs_cfg_check_model(c, &rep);
    hs_cfg_check_run(c, &rep);
    hs_cfg_check_sizes(c, topo_ok ? &t : NULL, &rep);
    if (topo_ok) {
        check_compile(c, &t, log, &rep);
        check_secondary_shard(c, &t, &rep);
        hs_cfg_check_parallel(c, &t, &rep);
    }
    hs_cfg_report_finish(&rep);
    if (rep.count) return e->code;
    hs_status st = hs_cfg_warn(c, &t, log, e);
    if (st != HS_OK) return st;
    *topo = t;
    return HS_OK;
}

hs_status hs_config_check_fqns(const hs_fsdp_config *fsdp, const char *const *fqns, int n_fqns,
                               hs_error *e) {
    hs_status st = HS_OK;
    for (int i = 0; i < fsdp->n_replicate_params; i++) {
        const char *name = fsdp->replicate_params[i];
        bool found = false;
        for (int j = 0; j < n_fqns && !found; j++) found = !strcmp(fqns[j], name);
        if (found) continue;
        int best = hs_cfg_nearest(name, fqns, n_fqns, NULL);
        st = hs_error_append(e, HS_ERR_CONFIG,
                             "fsdp_config.replicate_params[%d] = '%.200s' is not a parameter of "
                             "the model%s%s%s; use the parameter FQNs the model registers "
                             "[rule 11]",
                             i, name, best >= 0 ? "; did you mean '" : "",
                             best >= 0 ? fqns[best] : "", best >= 0 ? "'?" : "");
    }
    return st;
}
