/* `hypershard config [CONFIG] [a.b.c=value ...] [--world N]`: load, override
 * and validate a config for a world size, then print the resolved YAML with
 * the derived topology. `hypershard plan` takes the same arguments (and
 * --json) and prints the memory and communication plan instead. Exit 0, or
 * 2 with every error listed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "hypershard/config.h"
#include "hypershard/train.h"

static const char usage_text[] =
    "usage: hypershard config [CONFIG] [a.b.c=value ...] [--world N]\n"
    "       hypershard config --schema-markdown\n"
    "Prints the resolved configuration (every key) and the derived topology for N ranks\n"
    "(default 1). Without CONFIG the built-in default is used. Exit 0 when valid, 2 with\n"
    "every error otherwise.\n";

static const char plan_usage_text[] =
    "usage: hypershard plan [CONFIG] [a.b.c=value ...] [--world N] [--ranks-per-node R] [--json]\n"
    "       hypershard plan --time --cluster FILE [--world N] [--json] [CONFIG] [a.b.c=value ...]\n"
    "       hypershard plan --search --cluster FILE [--world N] [--top K] [CONFIG] [a.b.c=value ...]\n"
    "A dry run without MPI and without allocating: per-rank bytes of parameters, gradients,\n"
    "optimizer state, fp32 main params, activations, communication buffers and the peak\n"
    "(the peak_device_bytes metrics.jsonl reports), and per-step communication per group,\n"
    "for N ranks (default 1). --json prints the same as one JSON object. --ranks-per-node R\n"
    "places the ranks R to a node in order and splits FSDP's bytes into those sent inside a\n"
    "node and across nodes, summed over the ranks (as a trace counts them).\n"
    "--time simulates one step on the cluster FILE describes (docs/plan.md): step time,\n"
    "tokens/s, MFU, exposed communication per dimension, the pipeline bubble, and whether\n"
    "the peak fits. --search ranks the layouts of N ranks that fit by predicted step time\n"
    "and prints the best K (default 5) with the overrides that run them.\n";

typedef struct config_args {
    const char *path;
    const char **overrides;
    int n_overrides;
    int world, top, ranks_per_node;
    const char *cluster;
    bool markdown, json, plan, time, search;
} config_args;

#define MAX_WORLD (1 << 20)

static bool parse_world(const char *s, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < 1 || v > MAX_WORLD) return false;
    *out = (int)v;
    return true;
}

/* Returns -1 to go on, otherwise the exit code. */
static int parse_args(int argc, char **argv, config_args *a) {
    a->world = 1;
    const char *cmd = a->plan ? "hypershard plan" : "hypershard config";
    const char *usage = a->plan ? plan_usage_text : usage_text;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        const char *w = !strncmp(s, "--world=", 8) ? s + 8 : NULL;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return fputs(usage, stdout), 0;
        if (a->plan && !strcmp(s, "--json")) {
            a->json = true;
        } else if (a->plan && !strcmp(s, "--time")) {
            a->time = true;
        } else if (a->plan && !strcmp(s, "--search")) {
            a->search = true;
        } else if (a->plan && (!strcmp(s, "--cluster") || !strcmp(s, "--top") ||
                               !strcmp(s, "--ranks-per-node"))) {
            if (i + 1 == argc) return fprintf(stderr, "%s: %s needs a value\n", cmd, s), 2;
            if (!strcmp(s, "--cluster")) {
                a->cluster = argv[++i];
            } else if (!strcmp(s, "--ranks-per-node")) {
                if (!parse_world(argv[++i], &a->ranks_per_node))
                    return fprintf(stderr,
                                   "%s: --ranks-per-node %s: expected a count from 1 to %d\n", cmd,
                                   argv[i], MAX_WORLD),
                           2;
            } else if (!parse_world(argv[++i], &a->top) || a->top > 1000) {
                return fprintf(stderr, "%s: --top %s: expected a count from 1 to 1000\n", cmd,
                               argv[i]),
                       2;
            }
        } else if (!a->plan && !strcmp(s, "--schema-markdown")) {
            a->markdown = true;
        } else if (!strcmp(s, "--world") || w) {
            if (!w && i + 1 == argc) return fprintf(stderr, "%s: --world needs a value\n", cmd), 2;
            if (!w) w = argv[++i];
            if (!parse_world(w, &a->world))
                return fprintf(stderr, "%s: --world %s: expected a rank count from 1 to %d\n", cmd,
                               w, MAX_WORLD),
                       2;
        } else if (s[0] == '-' && !strchr(s, '=')) {
            return fprintf(stderr, "%s: unknown option %s\n%s", cmd, s, usage), 2;
        } else if (strchr(s, '=')) {
            a->overrides[a->n_overrides++] = s;
        } else if (!a->path) {
            a->path = s;
        } else {
            return fprintf(stderr,
                           "%s: a second config file '%s' (already have '%s'); pass one "
                           "file and key=value overrides\n",
                           cmd, s, a->path),
                   2;
        }
    }
    if ((a->time || a->search) && !a->cluster)
        return fprintf(stderr, "%s: --%s needs --cluster FILE (configs/clusters/ has some)\n", cmd,
                       a->time ? "time" : "search"),
               2;
    if (a->cluster && !a->time && !a->search)
        return fprintf(stderr, "%s: --cluster is for --time or --search\n", cmd), 2;
    if (a->search && a->ranks_per_node)
        return fprintf(stderr, "%s: --ranks-per-node is for the plan and --time\n", cmd), 2;
    if (a->search && a->json)
        return fprintf(stderr, "%s: --search prints a table; --json is for the plan and --time\n",
                       cmd),
               2;
    return -1;
}

static int print_errors(const config_args *a, const char *what, const hs_error *e) {
    fprintf(stderr, "hypershard %s: %d error%s in %s:\n", a->plan ? "plan" : "config", e->lines,
            e->lines == 1 ? "" : "s", what);
    fputs(e->msg, stderr);
    fputc('\n', stderr);
    return hs_status_exit_code(e->code);
}

static int print_time(const config_args *a, const hs_config *c, const hs_topology *topo,
                      const hs_plan *p) {
    hs_cluster cl;
    hs_plan_time t;
    hs_error e;
    if (hs_cluster_load(a->cluster, &cl, &e) != HS_OK) return print_errors(a, a->cluster, &e);
    if (hs_plan_time_build(c, topo, p, &cl, &t, &e) != HS_OK)
        return print_errors(a, "the time", &e);
    if (a->json) {
        hs_plan_time_json(&t, stdout);
        return 0;
    }
    printf("# planned from %s, world size %d, on %s\n", a->path ? a->path : "the built-in default",
           a->world, cl.name[0] ? cl.name : a->cluster);
    hs_plan_print(p, c, stdout);
    hs_plan_time_print(&t, stdout);
    return 0;
}

static int print_search(const config_args *a) {
    hs_cluster cl;
    hs_error e;
    if (hs_cluster_load(a->cluster, &cl, &e) != HS_OK) return print_errors(a, a->cluster, &e);
    int top = a->top > 0 ? a->top : 5, n = 0;
    hs_plan_choice *best = calloc((size_t)top, sizeof *best);
    if (!best) {
        hs_error_oom(&e, "plan --search: %d results", top);
        return print_errors(a, "the search", &e);
    }
    hs_plan_search_counts k;
    double t0 = hs_now();
    if (hs_plan_search(a->path, a->overrides, a->n_overrides, a->world, &cl, top, best, &n, &k,
                       &e) != HS_OK) {
        free(best);
        return print_errors(a, "the search", &e);
    }
    printf("# searched %s, world size %d, on %s: %d layouts tried, %d valid, %d fit (%.2f s); "
           "%lld sequences a step\n",
           a->path ? a->path : "the built-in default", a->world, cl.name[0] ? cl.name : a->cluster,
           k.tried, k.valid, k.fit, hs_now() - t0, k.global_batch);
    printf("%4s %10s %7s %12s %10s %7s  %s\n", "rank", "step s", "MFU", "tokens/s", "peak GiB",
           "bubble", "overrides");
    for (int i = 0; i < n; i++)
        printf("%4d %10.4g %6.1f%% %12.4g %10.2f %6.0f%%  %s\n", i + 1, best[i].time.step_s,
               100 * best[i].time.mfu, best[i].time.tokens_per_s,
               (double)best[i].peak_device_bytes / (1 << 30), 100 * best[i].time.bubble,
               best[i].overrides);
    free(best);
    return 0;
}

static int print_plan(const config_args *a, const hs_config *c, const hs_topology *topo) {
    hs_plan *p = calloc(1, sizeof *p);
    hs_error e;
    int rc = 0;
    if (!p) {
        hs_error_oom(&e, "the plan: %zu bytes", sizeof *p);
        rc = print_errors(a, "the plan", &e);
    } else if (hs_plan_build(c, topo, p, &e) != HS_OK ||
               hs_plan_links(p, c->fsdp.secondary_shard_size, a->ranks_per_node, &e) != HS_OK) {
        rc = print_errors(a, "the plan", &e);
    } else if (a->time) {
        rc = print_time(a, c, topo, p);
    } else if (a->json) {
        hs_plan_json(p, stdout);
    } else {
        printf("# planned from %s, world size %d\n", a->path ? a->path : "the built-in default",
               a->world);
        hs_plan_print(p, c, stdout);
    }
    free(p);
    return rc;
}

static int config_or_plan(int argc, char **argv, bool plan) {
    config_args a = {.plan = plan};
    hs_error e;
    hs_error_clear(&e);
    a.overrides = calloc((size_t)argc + 1, sizeof *a.overrides);
    if (!a.overrides) {
        hs_error_oom(&e, "the list of %d arguments", argc);
        return print_errors(&a, "the command line", &e);
    }
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0 || a.markdown) {
        if (rc < 0 && hs_config_schema_markdown(stdout, &e) != HS_OK)
            rc = print_errors(&a, "the schema", &e);
        else if (rc < 0) rc = 0;
        free(a.overrides);
        return rc;
    }
    if (a.search) {
        rc = print_search(&a);
        free(a.overrides);
        return rc;
    }
    hs_config c;
    hs_topology topo;
    hs_log log;
    hs_log_init(&log, 0, 1);
    if (hs_config_load(&c, a.path, a.overrides, a.n_overrides, &e) != HS_OK) {
        rc = print_errors(&a, a.path ? a.path : "the built-in default", &e);
    } else if (hs_config_validate(&c, a.world, &topo, &log, &e) != HS_OK) {
        char what[HS_PATH_MAX + 64];
        snprintf(what, sizeof what, "%s%s for world size %d",
                 a.path ? a.path : "the built-in default", a.n_overrides ? " with overrides" : "",
                 a.world);
        rc = print_errors(&a, what, &e);
    } else if (plan) {
        rc = print_plan(&a, &c, &topo);
    } else {
        printf("# resolved from %s, world size %d\n", a.path ? a.path : "the built-in default",
               a.world);
        rc = hs_config_dump(&c, &topo, stdout, &e) == HS_OK ? 0 : print_errors(&a, "the dump", &e);
    }
    hs_config_free(&c);
    free(a.overrides);
    return rc;
}

int hs_cmd_config(int argc, char **argv) { return config_or_plan(argc, argv, false); }
int hs_cmd_plan(int argc, char **argv) { return config_or_plan(argc, argv, true); }
