/* `hypershard mesh --world N [key=value ...]`: print the rank layout a job
 * would get, without starting MPI, so a topology can be checked before a
 * cluster is booked; with pp > 1 also the blocks and ranks of each pipeline
 * stage. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "hypershard/config.h"
#include "hypershard/mesh.h"

typedef struct mesh_args {
    int world, tp, cp, ep, pp, dp_shard, edp_shard, n_layers;
    bool have_world;
} mesh_args;

typedef struct mesh_key {
    const char *short_name;
    const char *config_path;
    size_t offset;
} mesh_key;

static const mesh_key mesh_keys[] = {
    {"tp", "accelerator.tp_size", offsetof(mesh_args, tp)},
    {"cp", "accelerator.cp_size", offsetof(mesh_args, cp)},
    {"ep", "accelerator.ep_size", offsetof(mesh_args, ep)},
    {"pp", "accelerator.pp_size", offsetof(mesh_args, pp)},
    {"dp_shard", "fsdp_config.dp_shard_size", offsetof(mesh_args, dp_shard)},
    {"edp_shard", "fsdp_config.edp_shard_size", offsetof(mesh_args, edp_shard)},
    {"n_layers", "model.n_layers", offsetof(mesh_args, n_layers)},
};
#define MESH_KEY_COUNT ((int)(sizeof(mesh_keys) / sizeof(mesh_keys[0])))

static void mesh_usage(FILE *f) {
    fprintf(f, "usage: hypershard mesh --world N [key=value ...]\n"
               "  keys (default 1): tp cp ep pp dp_shard edp_shard, or their config paths\n"
               "  (accelerator.tp_size, fsdp_config.dp_shard_size, ...); n_layers (default 4)\n"
               "  splits the blocks over the pipeline stages\n"
               "  example: hypershard mesh --world 16 pp=2 cp=2 tp=2 ep=2 dp_shard=2\n");
}

static bool parse_int(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < INT_MIN || v > INT_MAX) return false;
    *out = (int)v;
    return true;
}

static hs_status parse_pair(mesh_args *a, const char *arg, hs_error *e) {
    const char *eq = strchr(arg, '=');
    if (!eq) return hs_error_append(e, HS_ERR_USAGE, "argument '%s' is not key=value", arg);
    size_t klen = (size_t)(eq - arg);
    for (int i = 0; i < MESH_KEY_COUNT; i++) {
        const mesh_key *k = &mesh_keys[i];
        bool hit = (strlen(k->short_name) == klen && !strncmp(arg, k->short_name, klen)) ||
                   (strlen(k->config_path) == klen && !strncmp(arg, k->config_path, klen));
        if (!hit) continue;
        if (!parse_int(eq + 1, (int *)((char *)a + k->offset)))
            return hs_error_append(e, HS_ERR_USAGE, "%s=%s is not an integer", k->config_path,
                                   eq + 1);
        return HS_OK;
    }
    return hs_error_append(e, HS_ERR_USAGE,
                           "unknown key '%.*s'; use tp, cp, ep, pp, dp_shard, edp_shard or "
                           "n_layers",
                           (int)klen, arg);
}

static hs_status parse_args(mesh_args *a, int argc, char **argv, hs_error *e) {
    hs_config d;
    hs_status st = hs_config_defaults(&d, e);
    if (st != HS_OK) return st;
    *a = (mesh_args){.tp = 1,
                     .cp = 1,
                     .ep = 1,
                     .pp = 1,
                     .dp_shard = 1,
                     .edp_shard = 1,
                     .n_layers = d.model.n_layers};
    hs_config_free(&d);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--world") || !strncmp(arg, "--world=", 8)) {
            const char *v = arg[7] == '=' ? arg + 8 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || !parse_int(v, &a->world))
                hs_error_append(e, HS_ERR_USAGE,
                                "--world needs an integer in [1, 2^31), e.g. --world 8; got "
                                "'%s'",
                                v ? v : "nothing");
            a->have_world = true;
        } else {
            parse_pair(a, arg, e);
        }
    }
    if (!a->have_world) hs_error_append(e, HS_ERR_USAGE, "--world N is required");
    return e->code;
}

/* The stages of the even split (hs_config_pp_stages): their blocks and their
 * ranks, which are contiguous because ranks are pp-major. */
static hs_status print_stages(const hs_topology *t, int n_layers, FILE *f, hs_error *e) {
    int *first = malloc(sizeof(int) * (size_t)t->pp), *count = malloc(sizeof(int) * (size_t)t->pp);
    if (!first || !count) {
        free(first);
        free(count);
        return hs_error_oom(e, "printing %d pipeline stages: %zu bytes", t->pp,
                            2 * sizeof(int) * (size_t)t->pp);
    }
    /* One chunk per stage and no accelerator.pp_layers, as the defaults
     * have them: the even split. */
    hs_accel_config a = {.pp_size = t->pp, .pp_virtual_stages = 1};
    hs_config_pp_stages(&a, n_layers, first, count);
    int per = t->world / t->pp;
    fprintf(f,
            "\npipeline: model.n_layers %d over pp %d (even split; accelerator.pp_layers sets "
            "its own)\n",
            n_layers, t->pp);
    for (int s = 0; s < t->pp; s++)
        fprintf(f, "stage %-4d layers [%d, %d)  ranks %d-%d\n", s, first[s], first[s] + count[s],
                s * per, (s + 1) * per - 1);
    free(first);
    free(count);
    return HS_OK;
}

static void print_lines(hs_error *e, const char *kind) {
    fprintf(stderr, "hypershard mesh: %d %s error%s:\n", e->lines, kind, e->lines == 1 ? "" : "s");
    char *save = NULL;
    for (char *line = strtok_r(e->msg, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        fprintf(stderr, "  %s\n", line);
}

int hs_cmd_mesh(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            mesh_usage(stdout);
            return 0;
        }
    hs_error e;
    hs_error_clear(&e);
    mesh_args a;
    if (parse_args(&a, argc, argv, &e) == HS_ERR_OOM) {
        fprintf(stderr, "hypershard mesh: %s\n", e.msg);
        return hs_status_exit_code(e.code);
    }
    if (e.code != HS_OK) {
        print_lines(&e, "usage");
        mesh_usage(stderr);
        return hs_status_exit_code(e.code);
    }
    hs_topology t;
    if (hs_topology_derive(&t, a.world, a.tp, a.cp, a.ep, a.pp, a.dp_shard, a.edp_shard, &e) !=
        HS_OK) {
        print_lines(&e, "configuration");
        return hs_status_exit_code(e.code);
    }
    if (a.pp > 1 && a.n_layers < a.pp) {
        hs_error_append(&e, HS_ERR_CONFIG,
                        "accelerator.pp_size = %d exceeds model.n_layers = %d; every pipeline "
                        "stage needs at least one block (set n_layers=%d or more)",
                        a.pp, a.n_layers, a.pp);
        print_lines(&e, "configuration");
        return hs_status_exit_code(e.code);
    }
    hs_status s = hs_topology_print(&t, stdout, &e);
    if (s == HS_OK && t.pp > 1) s = print_stages(&t, a.n_layers, stdout, &e);
    if (s != HS_OK) fprintf(stderr, "hypershard mesh: %s\n", e.msg);
    return hs_status_exit_code(s);
}
