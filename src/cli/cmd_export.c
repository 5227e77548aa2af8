/* `hypershard export` and `hypershard import`: Hugging Face safetensors out
 * of a finished run, and a check (optionally a conversion) of a safetensors
 * directory against a model config. Both run in one process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "hypershard/ckpt.h"
#include "hypershard/data.h"

/* A model that owns full fp32 weights, for moving tensors in and out. */
typedef struct held_model {
    hs_model *m;
} held_model;

static hs_status held_create(held_model *h, const hs_model_config *mc, int seq_len, hs_error *e) {
    hs_model_options mo = {.compute_dtype = HS_DTYPE_F32,
                           .grad_dtype = HS_DTYPE_F32,
                           .max_batch = 1,
                           .seq_len = seq_len > 0 ? seq_len : 1,
                           .allocate_params = true};
    return hs_model_create(mc, &mo, &h->m, e);
}

static hs_status held_get(void *ctx, int i, float *out, hs_error *e) {
    (void)e;
    hs_model *m = ((held_model *)ctx)->m;
    const hs_param *p = hs_model_param(m, i);
    hs_device_copy(hs_model_device(m), out, p->data, sizeof(float) * (size_t)hs_param_numel(p),
                   HS_COPY_D2H);
    return HS_OK;
}

static hs_status held_set(void *ctx, int i, const float *full, hs_error *e) {
    (void)e;
    hs_model *m = ((held_model *)ctx)->m;
    hs_param *p = hs_model_param(m, i);
    hs_device_copy(hs_model_device(m), p->data, full, sizeof(float) * (size_t)hs_param_numel(p),
                   HS_COPY_H2D);
    return HS_OK;
}

static int fail(const char *cmd, const hs_error *e) {
    fprintf(stderr, "hypershard %s: %s\n", cmd, e->msg);
    return hs_status_exit_code(e->code);
}

/* ------------------------------------------------------------------ export */

static void export_usage(FILE *f) {
    fprintf(f, "usage: hypershard export --safetensors OUT_DIR (--run RUN_DIR | --ckpt DIR) "
               "[--dtype DTYPE]\n"
               "  RUN_DIR  a finished run (train.out_dir): model.safetensors + config.json\n"
               "  DIR      a checkpoint step directory, or a checkpoint.dir (follows `latest`)\n"
               "  DTYPE    float32 (default), bfloat16 or float16\n"
               "Writes OUT_DIR/model.safetensors and a Hugging Face OUT_DIR/config.json.\n");
}

static hs_status export_run(const char *run, const char *out, hs_dtype dt, hs_error *e) {
    hs_config defaults;
    hs_status s = hs_config_defaults(&defaults, e);
    hs_model_config mc = defaults.model;
    int max_pos = 0;
    char path[HS_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", run);
    if (s == HS_OK) s = hs_hf_config_read(path, &mc, &max_pos, e);
    held_model h = {0};
    if (s == HS_OK) s = held_create(&h, &mc, max_pos, e);
    if (s == HS_OK) s = hs_cli_hf_out_check("--safetensors", out, hs_model_param_count(h.m), dt, e);
    if (s == HS_OK) s = hs_hf_load(h.m, run, held_set, &h, e);
    if (s == HS_OK) s = hs_hf_save(h.m, held_get, &h, dt, max_pos, out, true, e);
    int copied = 0; /* the tokenizer the run was trained with, when it has one */
    if (s == HS_OK) s = hs_tokenizer_copy(run, out, &copied, e);
    if (s == HS_OK)
        printf("exported %d parameters (%.2fM values, %s) from %s to %s/model.safetensors and "
               "%s/config.json%s\n",
               hs_model_num_params(h.m), (double)hs_model_param_count(h.m) / 1e6, hs_dtype_name(dt),
               run, out, out, copied ? " with the run's tokenizer" : "");
    hs_model_free(h.m);
    hs_config_free(&defaults);
    return s;
}

/* A checkpoint is consolidated exactly as `hypershard ckpt export` does it. */
static int export_ckpt(const char *ckpt, const char *out, const char *dtype) {
    char *args[] = {"ckpt",      "export",  (char *)ckpt,  "--safetensors",
                    (char *)out, "--dtype", (char *)dtype, NULL};
    return hs_cmd_ckpt(7, args);
}

int hs_cmd_export(int argc, char **argv) {
    const char *out = NULL, *run = NULL, *ckpt = NULL;
    hs_dtype dt = HS_DTYPE_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return export_usage(stdout), 0;
        if (!strcmp(a, "--safetensors") && v) out = v, i++;
        else if (!strcmp(a, "--run") && v) run = v, i++;
        else if (!strcmp(a, "--dtype") && v) {
            if (!hs_cli_dtype_arg("export", v, &dt)) return 2;
            i++;
        } else if (!strcmp(a, "--ckpt") && v) ckpt = v, i++;
        else {
            fprintf(stderr, "hypershard export: unexpected argument '%s'\n", a);
            return export_usage(stderr), 2;
        }
    }
    if (!out || !run == !ckpt) {
        fprintf(stderr, "hypershard export: need --safetensors OUT_DIR and one of --run RUN_DIR "
                        "or --ckpt DIR\n");
        return export_usage(stderr), 2;
    }
    if (hs_cli_empty_path("export", "--run", run, HS_CLI_RUN_DIR) ||
        hs_cli_empty_path("export", "--ckpt", ckpt, HS_CLI_CKPT_DIR))
        return 2;
    hs_error e;
    hs_error_clear(&e);
    if (hs_cli_hf_out_check("--safetensors", out, 0, dt, &e) != HS_OK) return fail("export", &e);
    if (ckpt) return export_ckpt(ckpt, out, hs_dtype_name(dt));
    return export_run(run, out, dt, &e) == HS_OK ? 0 : fail("export", &e);
}

/* ------------------------------------------------------------------ import */

static void import_usage(FILE *f) {
    fprintf(f, "usage: hypershard import DIR [CONFIG] [a.b.c=value ...] [--out RUN_DIR]\n"
               "  Lists DIR/model.safetensors and checks every tensor against a model config:\n"
               "  CONFIG and overrides when given, else DIR/config.json. With --out, writes\n"
               "  RUN_DIR/model.safetensors + config.json (fp32) for `train --init-from` and\n"
               "  `export --run`, and RUN_DIR/config.yaml (that model section) to train with:\n"
               "  hypershard train RUN_DIR/config.yaml --init-from RUN_DIR [a.b.c=value ...]\n");
}

static void import_list(const hs_st_file *f) {
    for (int i = 0; i < hs_safetensors_count(f); i++) {
        const hs_st_tensor *t = hs_safetensors_tensor(f, i);
        char shape[64];
        hs_shape_str(t->ndim, t->shape, shape, sizeof shape);
        printf("  %-60s %-4s %s\n", t->name, hs_st_dtype_name(t->dtype), shape);
    }
}

typedef struct import_args {
    const char *dir, *config, *out;
    const char **overrides;
    int n_overrides;
} import_args;

static hs_status import_model_config(const import_args *a, hs_model_config *mc, int *max_pos,
                                     char *what, size_t cap, hs_error *e) {
    hs_config cfg;
    if (a->config || a->n_overrides > 0) {
        hs_status s = hs_config_load(&cfg, a->config, a->overrides, a->n_overrides, e);
        *mc = cfg.model;
        *max_pos = cfg.train.seq_len;
        snprintf(what, cap, "%s", a->config ? a->config : "the built-in default with overrides");
        hs_config_free(&cfg);
        return s;
    }
    hs_status s = hs_config_defaults(&cfg, e);
    *mc = cfg.model;
    hs_config_free(&cfg);
    if (s != HS_OK) return s;
    char path[HS_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", a->dir);
    snprintf(what, cap, "%s", path);
    return hs_hf_config_read(path, mc, max_pos, e);
}

/* RUN/config.yaml: the model section the weights were checked against,
 * every other section left to its default, so that `train RUN/config.yaml
 * --init-from RUN [a.b.c=value ...]` builds the same network without the
 * Hugging Face config translated by hand. Written whole or not at all. */
static hs_status import_write_yaml(const hs_model_config *mc, const char *what, const char *out,
                                   hs_error *e) {
    hs_config c;
    hs_status s = hs_config_defaults(&c, e);
    if (s != HS_OK) return s;
    c.model = *mc;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f) {
        fprintf(f,
                "# The model of\n#   %s\n# as `hypershard import` read it; every other "
                "section takes its default.\n# Continue training these weights with\n"
                "#   hypershard train %s/config.yaml --init-from %s [a.b.c=value ...]\n",
                what, out, out);
        hs_config_dump_section(&c, "model", f);
    }
    hs_config_free(&c);
    if (!f || fclose(f) != 0 || !text)
        s = hs_error_oom(e, "import: the %zu-byte text of %s/config.yaml", len, out);
    else s = hs_ckpt_write_atomic(out, "config.yaml", text, e);
    free(text);
    return s;
}

static hs_status import_run(const import_args *a, hs_error *e) {
    char path[HS_PATH_MAX + 32], what[HS_PATH_MAX + 32];
    hs_safetensors_dir_path(a->dir, path, sizeof path);
    hs_st_file *f = NULL;
    hs_status s = hs_safetensors_open_dir(a->dir, &f, e);
    if (s != HS_OK) return s;
    printf("%s: %d tensors\n", path, hs_safetensors_count(f));
    import_list(f);
    hs_safetensors_close(f);
    hs_model_config mc;
    int max_pos = 0;
    s = import_model_config(a, &mc, &max_pos, what, sizeof what, e);
    held_model h = {0};
    if (s == HS_OK) s = held_create(&h, &mc, max_pos, e);
    if (s == HS_OK && a->out)
        s = hs_cli_hf_out_check("--out", a->out, hs_model_param_count(h.m), HS_DTYPE_F32, e);
    if (s == HS_OK) s = hs_hf_load(h.m, a->dir, held_set, &h, e);
    if (s == HS_OK)
        printf("matches %s: %s model, %d parameters, %.2fM values\n", what, mc.arch,
               hs_model_num_params(h.m), (double)hs_model_param_count(h.m) / 1e6);
    if (s == HS_OK && a->out) {
        s = hs_hf_save(h.m, held_get, &h, HS_DTYPE_F32, max_pos, a->out, true, e);
        if (s == HS_OK) s = import_write_yaml(&mc, what, a->out, e);
        if (s == HS_OK)
            printf("wrote %s/model.safetensors, %s/config.json and %s/config.yaml\n", a->out,
                   a->out, a->out);
    }
    hs_model_free(h.m);
    return s;
}

int hs_cmd_import(int argc, char **argv) {
    import_args a = {0};
    a.overrides = calloc((size_t)argc + 1, sizeof(char *));
    if (!a.overrides) {
        fprintf(stderr, "hypershard import: out of memory: the list of %d arguments\n", argc);
        return 1;
    }
    int rc = -1;
    for (int i = 1; rc < 0 && i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) import_usage(stdout), rc = 0;
        else if (!strcmp(s, "--out") && i + 1 < argc) a.out = argv[++i];
        else if (s[0] == '-')
            fprintf(stderr, "hypershard import: unknown option '%s'\n", s), rc = 2;
        else if (strchr(s, '=')) a.overrides[a.n_overrides++] = s;
        else if (!a.dir) a.dir = s;
        else if (!a.config) a.config = s;
        else fprintf(stderr, "hypershard import: unexpected argument '%s'\n", s), rc = 2;
    }
    if (rc < 0 && !a.dir) fprintf(stderr, "hypershard import: need a safetensors DIR\n"), rc = 2;
    if (rc < 0 && hs_cli_empty_path("import", "DIR", a.dir,
                                    "the directory of a model.safetensors and its config.json"))
        rc = 2;
    if (rc == 2) import_usage(stderr);
    hs_error e;
    hs_error_clear(&e);
    if (rc < 0 && a.out && hs_cli_hf_out_check("--out", a.out, 0, HS_DTYPE_F32, &e) != HS_OK)
        rc = fail("import", &e);
    if (rc < 0) rc = import_run(&a, &e) == HS_OK ? 0 : fail("import", &e);
    free(a.overrides);
    return rc;
}
