/* `hypershard train [CONFIG] [a.b.c=value ...] [--init-from DIR] [--dump DIR]`: load and
 * validate the config on every rank (errors printed once, exit 2), start
 * communication, then train. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "hypershard/comm.h"
#include "hypershard/train.h"

typedef struct train_args {
    const char *config;
    const char **overrides;
    int n_overrides;
    const char *init_from;
    const char *dump_dir;
    const hs_stop *stop; /* SIGTERM / SIGINT: stop after the step (NULL: not watched) */
} train_args;

static void train_usage(FILE *f) {
    fprintf(
        f, "usage: hypershard train [CONFIG] [a.b.c=value ...] [--init-from DIR] [--dump DIR]\n"
           "  CONFIG         YAML file (default: the built-in small Llama on the builtin corpus)\n"
           "  a.b.c=value    override one config key (last one wins)\n"
           "  --init-from D  start from the weights in D/model.safetensors or the shards its\n"
           "                 model.safetensors.index.json lists (Hugging Face names)\n"
           "  --dump D       write D/weights-step0.safetensors and, for every step N,\n"
           "                 D/{logits,grads,weights}-stepN.safetensors (fp32, for parity checks)\n"
           "Writes <train.out_dir>/{config.yaml,metrics.jsonl,model.safetensors,config.json}.\n");
}

static int parse_args(int argc, char **argv, train_args *a) {
    a->overrides = calloc((size_t)argc + 1, sizeof(char *));
    if (!a->overrides) return 1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return train_usage(stdout), -1;
        if (!strcmp(s, "--init-from") && i + 1 < argc) a->init_from = argv[++i];
        else if (!strncmp(s, "--init-from=", 12)) a->init_from = s + 12;
        else if (!strcmp(s, "--dump") && i + 1 < argc) a->dump_dir = argv[++i];
        else if (!strncmp(s, "--dump=", 7)) a->dump_dir = s + 7;
        else if (s[0] == '-') {
            fprintf(stderr, "hypershard train: unknown option '%s'\n", s);
            return train_usage(stderr), 2;
        } else if (strchr(s, '=')) a->overrides[a->n_overrides++] = s;
        else if (!a->config) a->config = s;
        else {
            fprintf(stderr, "hypershard train: a second CONFIG '%s' (the first is '%s')\n", s,
                    a->config);
            return train_usage(stderr), 2;
        }
    }
    if (hs_cli_empty_path("train", "--init-from", a->init_from,
                          "the directory of the model.safetensors to start from (a finished "
                          "run's train.out_dir, or an `import --out` directory)") ||
        hs_cli_empty_path("train", "--dump", a->dump_dir, "the directory to dump into"))
        return 2;
    return 0;
}

/* Config errors are identical on every rank: rank 0 prints them once. An
 * unreadable CONFIG file is a usage error like any other bad argument. */
static int config_failure(int rank, const hs_error *e) {
    if (rank == 0) fprintf(stderr, "hypershard train: %s\n", e->msg);
    hs_comm_boot_end();
    return e->code == HS_ERR_IO ? 2 : hs_status_exit_code(e->code);
}

static int run(int *argc, char ***argv, const hs_config *cfg, const hs_topology *topo,
               const train_args *a, hs_log *log, int rank) {
    hs_error e;
    hs_error_clear(&e);
    hs_trace *trace = hs_trace_create(rank, cfg->trace.enabled, &e);
    hs_comm_options co = {.timeout_s = cfg->comm.timeout_s, .trace = trace, .log = log};
    hs_comm *comm = NULL;
    /* This rank alone may have failed: the others must not wait for it. */
    if (!trace || hs_comm_init(&comm, argc, argv, &co, &e) != HS_OK) hs_comm_abort(NULL, &e);
    hs_comm_balance_blas_threads(comm);
    if (cfg->train.threads > 0) hs_blas_set_threads(cfg->train.threads);
    hs_train_options opt = {.init_from = a->init_from, .dump_dir = a->dump_dir, .stop = a->stop};
    hs_status s = hs_train_run(cfg, topo, comm, &opt, log, &e);
    int code = hs_status_exit_code(s);
    /* Input errors are the same on every rank; anything else may be on one
     * rank only, and must not leave the others waiting in a collective. */
    bool same_everywhere = s == HS_ERR_CONFIG || s == HS_ERR_USAGE || s == HS_ERR_FORMAT ||
                           s == HS_STOPPED;
    if (s != HS_OK && !same_everywhere && hs_comm_size(comm) > 1) hs_comm_abort(comm, &e);
    if (s != HS_OK && rank == 0) fprintf(stderr, "hypershard train: %s\n", e.msg);
    hs_comm_finalize(comm);
    hs_trace_free(trace);
    hs_comm_boot_end();
    return code;
}

/* Test hook (tests/cli/test_launch.sh): rank HS_TRAIN_TEST_DIE_RANK kills
 * itself at start-up, as a rank on a broken device or host would, on every
 * start whose world has that rank. */
static void test_die_at_start(int rank) {
    const char *v = getenv("HS_TRAIN_TEST_DIE_RANK");
    if (v && v[0] && atoi(v) == rank) raise(SIGKILL);
}

int hs_cmd_train(int argc, char **argv) {
    train_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc != 0) {
        free(a.overrides);
        return rc < 0 ? 0 : rc;
    }
    int rank = 0, world = 1;
    /* Before MPI starts any thread, so that every thread inherits the mask. */
    a.stop = hs_stop_start();
    hs_comm_boot(&argc, &argv, &rank, &world);
    test_die_at_start(rank);
    hs_log log;
    hs_log_init(&log, rank, world);
    hs_config cfg;
    hs_topology topo;
    hs_error e;
    hs_error_clear(&e);
    if (hs_config_load(&cfg, a.config, a.overrides, a.n_overrides, &e) != HS_OK) {
        free(a.overrides);
        return config_failure(rank, &e);
    }
    /* The config's warnings follow from the config and the world size alone,
     * the same on every rank: rank 0 prints them once. */
    if (hs_config_validate(&cfg, world, &topo, rank == 0 ? &log : NULL, &e) != HS_OK) {
        hs_config_free(&cfg);
        free(a.overrides);
        return config_failure(rank, &e);
    }
    rc = run(&argc, &argv, &cfg, &topo, &a, &log, rank);
    hs_config_free(&cfg);
    free(a.overrides);
    return rc;
}
