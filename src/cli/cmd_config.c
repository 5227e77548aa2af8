/* `hypershard config [CONFIG] [a.b.c=value ...] [--world N]`: load, override
 * and validate a config for a world size, then print the resolved YAML with
 * the derived topology. Exit 0, or 2 with every error listed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "hypershard/config.h"

static const char usage_text[] =
    "usage: hypershard config [CONFIG] [a.b.c=value ...] [--world N]\n"
    "       hypershard config --schema-markdown\n"
    "Prints the resolved configuration (every key) and the derived topology for N ranks\n"
    "(default 1). Without CONFIG the built-in default is used. Exit 0 when valid, 2 with\n"
    "every error otherwise.\n";

typedef struct config_args {
    const char *path;
    const char **overrides;
    int n_overrides;
    int world;
    bool markdown;
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
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        const char *w = !strncmp(s, "--world=", 8) ? s + 8 : NULL;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return fputs(usage_text, stdout), 0;
        if (!strcmp(s, "--schema-markdown")) {
            a->markdown = true;
        } else if (!strcmp(s, "--world") || w) {
            if (!w && i + 1 == argc)
                return fputs("hypershard config: --world needs a value\n", stderr), 2;
            if (!w) w = argv[++i];
            if (!parse_world(w, &a->world))
                return fprintf(stderr, "hypershard config: --world %s: expected a rank count "
                                       "from 1 to %d\n", w, MAX_WORLD), 2;
        } else if (s[0] == '-' && !strchr(s, '=')) {
            return fprintf(stderr, "hypershard config: unknown option %s\n%s", s, usage_text), 2;
        } else if (strchr(s, '=')) {
            a->overrides[a->n_overrides++] = s;
        } else if (!a->path) {
            a->path = s;
        } else {
            return fprintf(stderr, "hypershard config: a second config file '%s' (already have "
                                   "'%s'); pass one file and key=value overrides\n", s, a->path), 2;
        }
    }
    return -1;
}

static int print_errors(const char *what, const hs_error *e) {
    fprintf(stderr, "hypershard config: %d error%s in %s:\n", e->lines, e->lines == 1 ? "" : "s",
            what);
    fputs(e->msg, stderr);
    fputc('\n', stderr);
    return hs_status_exit_code(e->code);
}

int hs_cmd_config(int argc, char **argv) {
    config_args a = {0};
    a.overrides = calloc((size_t)argc + 1, sizeof *a.overrides);
    if (!a.overrides) hs_panic("out of memory parsing arguments");
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0 || a.markdown) {
        if (rc < 0) hs_config_schema_markdown(stdout), rc = 0;
        free(a.overrides);
        return rc;
    }
    hs_config c;
    hs_error e;
    hs_topology topo;
    hs_log log;
    hs_log_init(&log, 0, 1);
    if (hs_config_load(&c, a.path, a.overrides, a.n_overrides, &e) != HS_OK) {
        rc = print_errors(a.path ? a.path : "the built-in default", &e);
    } else if (hs_config_validate(&c, a.world, &topo, &log, &e) != HS_OK) {
        char what[HS_PATH_MAX + 64];
        snprintf(what, sizeof what, "%s%s for world size %d",
                 a.path ? a.path : "the built-in default", a.n_overrides ? " with overrides" : "",
                 a.world);
        rc = print_errors(what, &e);
    } else {
        printf("# resolved from %s, world size %d\n", a.path ? a.path : "the built-in default",
               a.world);
        hs_config_dump(&c, &topo, stdout);
        rc = 0;
    }
    hs_config_free(&c);
    free(a.overrides);
    return rc;
}
