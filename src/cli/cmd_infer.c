/* `hypershard generate` and `hypershard eval`: inference on the weights of
 * a finished run or of a checkpoint of any layout, on one process or under
 * mpiexec. The run's config (its model, data and seq_len) is loaded, the
 * parallel layout reset to plain data parallelism over the ranks, then the
 * command's a.b.c=value overrides apply (a layout among them). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "hypershard/ckpt.h"
#include "hypershard/comm.h"
#include "hypershard/data.h"
#include "hypershard/train.h"

typedef struct infer_args {
    const char *cmd;
    const char *run, *ckpt;
    const char *prompt;
    int max_new;
    double temperature;
    int top_k;
    long long seed;
    bool no_kv_cache;
    const char **overrides;
    int n_overrides;
} infer_args;

static void usage(const char *cmd, FILE *f) {
    if (!strcmp(cmd, "generate"))
        fprintf(f,
                "usage: hypershard generate (--run RUN_DIR | --ckpt DIR) --prompt TEXT\n"
                "           [--max-new-tokens N] [--temperature T] [--top-k K] [--seed S]\n"
                "           [--no-kv-cache] [a.b.c=value ...]\n"
                "  continues TEXT (bytes) with N tokens (default 64), streamed as they come;\n"
                "  greedy at temperature 0 (the default), else sampled from the top K (0: all);\n"
                "  --no-kv-cache runs the whole window for every token instead of one row\n"
                "  through the per-layer KV cache (the same text, slower)\n");
    else
        fprintf(f, "usage: hypershard eval (--run RUN_DIR | --ckpt DIR) [a.b.c=value ...]\n"
                   "  loss and perplexity on the validation split the trainer evaluates on\n"
                   "  (data.* overrides choose other data)\n");
    fprintf(f, "  RUN_DIR  a finished run (train.out_dir: config.yaml, model.safetensors)\n"
               "  DIR      a checkpoint step directory, or a checkpoint.dir (follows `latest`)\n"
               "  under mpiexec -n N the model runs data parallel over N ranks, or in any layout\n"
               "  the overrides give (accelerator.tp_size=2, accelerator.pp_size=2, ...)\n");
}

static int bad(const infer_args *a, const char *what, const char *value) {
    fprintf(stderr, "hypershard %s: %s '%s'\n", a->cmd, what, value);
    usage(a->cmd, stderr);
    return 2;
}

static int parse(int argc, char **argv, infer_args *a) {
    a->overrides = calloc((size_t)argc + 1, sizeof(char *));
    if (!a->overrides) return 1;
    a->max_new = 64;
    bool gen = !strcmp(a->cmd, "generate");
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return usage(a->cmd, stdout), -1;
        if (!strcmp(s, "--run") && v) a->run = argv[++i];
        else if (!strcmp(s, "--ckpt") && v) a->ckpt = argv[++i];
        else if (gen && !strcmp(s, "--prompt") && v) a->prompt = argv[++i];
        else if (gen && !strcmp(s, "--max-new-tokens") && v) {
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 1000000)
                return bad(a, "--max-new-tokens needs 1..1000000, got", v);
            a->max_new = (int)n;
        } else if (gen && !strcmp(s, "--temperature") && v) {
            a->temperature = strtod(argv[++i], &end);
            if (*end || !(a->temperature >= 0.0))
                return bad(a, "--temperature needs a number >= 0, got", v);
        } else if (gen && !strcmp(s, "--top-k") && v) {
            long k = strtol(argv[++i], &end, 10);
            if (*end || k < 0) return bad(a, "--top-k needs an integer >= 0, got", v);
            a->top_k = (int)k;
        } else if (gen && !strcmp(s, "--no-kv-cache")) {
            a->no_kv_cache = true;
        } else if (gen && !strcmp(s, "--seed") && v) {
            a->seed = strtoll(argv[++i], &end, 10);
            if (*end) return bad(a, "--seed needs an integer, got", v);
        } else if (s[0] == '-') {
            return bad(a, "unknown option or missing value:", s);
        } else if (strchr(s, '=')) {
            a->overrides[a->n_overrides++] = s;
        } else {
            return bad(a, "unexpected argument", s);
        }
    }
    if (!a->run == !a->ckpt) {
        fprintf(stderr, "hypershard %s: give exactly one of --run RUN_DIR or --ckpt DIR\n", a->cmd);
        return usage(a->cmd, stderr), 2;
    }
    if (hs_cli_empty_path(a->cmd, "--run", a->run, HS_CLI_RUN_DIR) ||
        hs_cli_empty_path(a->cmd, "--ckpt", a->ckpt, HS_CLI_CKPT_DIR))
        return 2;
    if (gen && (!a->prompt || !a->prompt[0])) {
        fprintf(stderr, "hypershard generate: --prompt TEXT is required (at least one byte)\n");
        return usage(a->cmd, stderr), 2;
    }
    return 0;
}

/* Before the user's overrides: one process's layout, no run-side effects. */
static const char *const RESET[] = {"accelerator.tp_size=1",
                                    "accelerator.cp_size=1",
                                    "accelerator.ep_size=1",
                                    "accelerator.pp_size=1",
                                    "accelerator.pp_virtual_stages=1",
                                    "accelerator.pp_schedule=1f1b",
                                    "accelerator.pp_layers=[]",
                                    "accelerator.sequence_parallel=false",
                                    "accelerator.loss_parallel=false",
                                    "fsdp_config.dp_shard_size=1",
                                    "fsdp_config.edp_shard_size=1",
                                    "train.global_batch_size=null",
                                    "train.micro_batch_size=1",
                                    "train.steps=1000000000",
                                    "train.activation_checkpointing=false",
                                    "trace.enabled=false",
                                    "checkpoint.dir=null",
                                    "checkpoint.save_every=0"};
#define N_RESET (int)(sizeof RESET / sizeof RESET[0])

/* The run's config path and where the weights come from. */
static hs_status locate(const infer_args *a, char *config, size_t cap, char *resume, size_t rcap,
                        hs_error *e) {
    if (a->run) {
        snprintf(config, cap, "%s/config.yaml", a->run);
        snprintf(resume, rcap, "none");
        FILE *f = fopen(config, "r");
        if (!f)
            return hs_error_set(e, HS_ERR_USAGE,
                                "--run %s: no config.yaml there; give a "
                                "finished run's train.out_dir (config.yaml, model.safetensors)",
                                a->run);
        fclose(f);
        return HS_OK;
    }
    hs_ckpt *c = NULL;
    hs_status s = hs_ckpt_open(a->ckpt, &c, e);
    if (s != HS_OK) {
        hs_error inner = *e;
        return hs_error_set(e, HS_ERR_USAGE, "--ckpt %s: %s", a->ckpt, inner.msg);
    }
    snprintf(config, cap, "%s/config.yaml", hs_ckpt_path(c));
    snprintf(resume, rcap, "%s", hs_ckpt_path(c));
    hs_ckpt_close(c);
    FILE *f = fopen(config, "r");
    if (!f)
        return hs_error_set(e, HS_ERR_USAGE,
                            "--ckpt %s: the checkpoint has no config.yaml, so "
                            "its model is unknown; use the run's --run directory",
                            a->ckpt);
    fclose(f);
    return HS_OK;
}

/* What the text goes out through: bytes (byte-level data), a tokenizer,
 * or token ids (a token file without one). */
typedef struct emitter {
    const char *pending; /* the prompt, printed once the model is loaded */
    const hs_bpe *bpe;
    bool ids;
    int count;
} emitter;

static void emit(void *ctx, int32_t token) {
    emitter *x = ctx;
    if (x->pending) fputs(x->pending, stdout), x->pending = NULL;
    char buf[256];
    if (x->ids) fprintf(stdout, "%s%d", x->count ? " " : "", token);
    else if (x->bpe) fwrite(buf, 1, (size_t)hs_bpe_decode(x->bpe, token, buf, sizeof buf), stdout);
    else if (token >= 0 && token < 256) fputc(token, stdout);
    else fprintf(stdout, "<%d>", token);
    x->count++;
    fflush(stdout);
}

/* The tokenizer the run was trained with: beside its weights (--run), or
 * beside the checkpoint's data.path; false: none. */
static bool tokenizer_path(const infer_args *a, const hs_config *cfg, char *out, size_t cap) {
    char dir[HS_PATH_MAX];
    if (a->run) snprintf(dir, sizeof dir, "%s", a->run);
    else if (!hs_tokenizer_dir(cfg, dir, sizeof dir)) return false;
    return hs_tokenizer_find(dir, out, cap);
}

/* The prompt as token ids: encoded by the tokenizer, else its bytes. */
static hs_status prompt_ids(const infer_args *a, const hs_bpe *bpe, int32_t **ids, int *n,
                            hs_error *e) {
    if (bpe) return hs_bpe_encode(bpe, a->prompt, ids, n, e);
    *n = (int)strlen(a->prompt);
    *ids = malloc(sizeof **ids * (size_t)*n);
    if (!*ids) return hs_error_oom(e, "generate: cannot allocate");
    for (int i = 0; i < *n; i++) (*ids)[i] = (unsigned char)a->prompt[i];
    return HS_OK;
}

static hs_status generate(const infer_args *a, const hs_config *cfg, const hs_topology *topo,
                          hs_comm *comm, const hs_train_options *opt, hs_log *log, int rank,
                          hs_error *e) {
    char path[HS_PATH_MAX + 32];
    hs_bpe *bpe = NULL;
    bool tokens = hs_data_tokenized(&cfg->data);
    hs_status s = tokens && tokenizer_path(a, cfg, path, sizeof path) ? hs_bpe_load(path, &bpe, e)
                                                                      : HS_OK;
    int32_t *prompt = NULL, *out = malloc(sizeof *out * (size_t)a->max_new);
    int n = 0;
    if (s == HS_OK) s = prompt_ids(a, bpe, &prompt, &n, e);
    if (s == HS_OK && !out) s = hs_error_oom(e, "generate: cannot allocate");
    if (s == HS_OK && n < 1)
        s = hs_error_set(e, HS_ERR_USAGE, "generate: --prompt '%s' is no token", a->prompt);
    if (s == HS_OK && bpe)
        hs_log_info(log, "prompt: %d tokens (tokenizer %s, %d tokens)", n, path,
                    hs_bpe_vocab_size(bpe));
    emitter x = {.pending = tokens && !bpe ? NULL : a->prompt, .bpe = bpe, .ids = tokens && !bpe};
    hs_generate_options g = {.prompt = prompt,
                             .prompt_len = n,
                             .max_new_tokens = a->max_new,
                             .temperature = a->temperature,
                             .top_k = a->top_k,
                             .seed = (uint64_t)a->seed,
                             .emit = emit,
                             .emit_ctx = &x,
                             .no_kv_cache = a->no_kv_cache};
    if (s == HS_OK) s = hs_train_generate(cfg, topo, comm, opt, log, &g, out, e);
    if (s == HS_OK && rank == 0) fputc('\n', stdout);
    free(prompt);
    free(out);
    hs_bpe_free(bpe);
    return s;
}

static hs_status run(const infer_args *a, const hs_config *cfg, const hs_topology *topo,
                     const char *init_from, hs_log *log, int rank, hs_error *e) {
    hs_comm_options co = {.timeout_s = cfg->comm.timeout_s, .log = log};
    hs_comm *comm = NULL;
    hs_status s = hs_comm_init(&comm, NULL, NULL, &co, e);
    if (s != HS_OK) return s;
    hs_comm_balance_blas_threads(comm);
    hs_train_options opt = {.init_from = init_from};
    if (!strcmp(a->cmd, "eval")) {
        double loss = 0.0;
        s = hs_train_eval(cfg, topo, comm, &opt, log, &loss, e);
        if (s == HS_OK && rank == 0) printf("val loss %.6f | perplexity %.4f\n", loss, exp(loss));
    } else {
        s = generate(a, cfg, topo, comm, &opt, log, rank, e);
    }
    bool same = s == HS_ERR_CONFIG || s == HS_ERR_USAGE || s == HS_ERR_FORMAT;
    if (s != HS_OK && !same && hs_comm_size(comm) > 1) hs_comm_abort(comm, e);
    hs_comm_finalize(comm);
    return s;
}

static int infer_main(const char *cmd, int argc, char **argv) {
    infer_args a = {.cmd = cmd};
    int rc = parse(argc, argv, &a);
    if (rc != 0) {
        free(a.overrides);
        return rc < 0 ? 0 : rc;
    }
    int rank = 0, world = 1;
    hs_comm_boot(&argc, &argv, &rank, &world);
    hs_log log;
    hs_log_init(&log, rank, world);
    log.out = stderr; /* stdout carries the text (or the loss) alone */
    hs_error e;
    hs_error_clear(&e);
    char config[HS_PATH_MAX + 16], resume[HS_PATH_MAX + 16], resume_ov[HS_PATH_MAX + 48];
    hs_status s = locate(&a, config, sizeof config, resume, sizeof resume, &e);
    const char **ov = calloc((size_t)(N_RESET + 1 + a.n_overrides), sizeof *ov);
    int n = 0;
    for (int i = 0; ov && i < N_RESET; i++) ov[n++] = RESET[i];
    snprintf(resume_ov, sizeof resume_ov, "checkpoint.resume=%s", resume);
    if (ov) ov[n++] = resume_ov;
    for (int i = 0; ov && i < a.n_overrides; i++) ov[n++] = a.overrides[i];
    hs_config cfg;
    hs_topology topo;
    hs_status ds = hs_config_defaults(&cfg, s == HS_OK ? &e : NULL);
    if (s == HS_OK) s = ds;
    if (s == HS_OK && !ov)
        s = hs_error_oom(&e, "%s: the list of %d overrides", cmd, N_RESET + 1 + a.n_overrides);
    if (s == HS_OK) s = hs_config_load(&cfg, config, ov, n, &e);
    if (s == HS_OK) s = hs_config_validate(&cfg, world, &topo, rank == 0 ? &log : NULL, &e);
    if (s == HS_OK) s = run(&a, &cfg, &topo, a.run, &log, rank, &e);
    if (s != HS_OK && rank == 0) fprintf(stderr, "hypershard %s: %s\n", cmd, e.msg);
    hs_config_free(&cfg);
    free(ov);
    free(a.overrides);
    hs_comm_boot_end();
    return s == HS_OK ? 0 : s == HS_ERR_IO ? 2 : hs_status_exit_code(s);
}

int hs_cmd_generate(int argc, char **argv) { return infer_main("generate", argc, argv); }
int hs_cmd_eval(int argc, char **argv) { return infer_main("eval", argc, argv); }

/* `hypershard tokenize TOKENIZER_JSON TEXT`: the ids generate would feed
 * the model, and the text they decode back to (one process, no model). */
int hs_cmd_tokenize(int argc, char **argv) {
    if (argc != 3 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        FILE *f = argc == 2 ? stdout : stderr;
        fprintf(f, "usage: hypershard tokenize TOKENIZER_JSON TEXT\n"
                   "  prints TEXT's token ids (one line) and their decoding (the next line)\n");
        return argc == 2 ? 0 : 2;
    }
    if (hs_cli_empty_path("tokenize", "TOKENIZER_JSON", argv[1],
                          "the path of a Hugging Face tokenizer.json"))
        return 2;
    hs_bpe *b = NULL;
    hs_error e;
    hs_error_clear(&e);
    int32_t *ids = NULL;
    int n = 0;
    hs_status s = hs_bpe_load(argv[1], &b, &e);
    if (s == HS_OK) s = hs_bpe_encode(b, argv[2], &ids, &n, &e);
    if (s != HS_OK) {
        fprintf(stderr, "hypershard tokenize: %s\n", e.msg);
        hs_bpe_free(b);
        return s == HS_ERR_IO ? 2 : hs_status_exit_code(s);
    }
    for (int i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
    putchar('\n');
    char buf[256];
    for (int i = 0; i < n; i++)
        fwrite(buf, 1, (size_t)hs_bpe_decode(b, ids[i], buf, sizeof buf), stdout);
    putchar('\n');
    free(ids);
    hs_bpe_free(b);
    return 0;
}
