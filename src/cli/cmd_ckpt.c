/* `hypershard ckpt`: look into a distributed checkpoint without MPI.
 *   inspect DIR                       the listing (state, files, tensors, chunks)
 *   verify DIR                        read every chunk and check its CRC32
 *   export DIR --safetensors OUT_DIR  the consolidated model in Hugging Face form
 * DIR is a step directory or a checkpoint.dir (its `latest` is followed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "hypershard/ckpt.h"
#include "hypershard/train.h"

static void ckpt_usage(FILE *f) {
    fprintf(f,
            "usage: hypershard ckpt inspect DIR\n"
            "       hypershard ckpt verify DIR\n"
            "       hypershard ckpt export DIR --safetensors OUT_DIR [--dtype DTYPE]\n"
            "  DIR     a checkpoint step directory, or a checkpoint.dir (follows `latest`)\n"
            "  inspect prints the trainer state, the data files and every tensor with its\n"
            "          dtype, shape, size and chunk layout (global offsets, file, bytes, CRC32)\n"
            "  verify  reads every stored chunk and checks its length and CRC32\n"
            "  export  writes OUT_DIR/model.safetensors + config.json from the model's\n"
            "          parameters (DTYPE float32 by default, bfloat16 or float16), as\n"
            "          `hypershard export` does for a finished run\n");
}

static int fail(const hs_error *e) {
    fprintf(stderr, "hypershard ckpt: %s\n", e->msg);
    return hs_status_exit_code(e->code);
}

static int run_inspect(const char *dir, bool verify) {
    hs_error e;
    hs_error_clear(&e);
    hs_ckpt *c = NULL;
    if (hs_ckpt_open(dir, &c, &e) != HS_OK) return fail(&e);
    int rc = 0;
    if (!verify) {
        hs_ckpt_print(c, stdout);
    } else {
        int64_t bytes = 0;
        double t0 = hs_now();
        if (hs_ckpt_verify(c, &bytes, &e) != HS_OK ||
            hs_train_ckpt_config_check(hs_ckpt_path(c), hs_ckpt_get_state(c)->config_hash, &e) !=
                HS_OK)
            rc = fail(&e);
        else
            printf("%s: all %d tensors verified (%lld bytes, CRC32 ok) in %.2f s\n",
                   hs_ckpt_path(c), hs_ckpt_num_tensors(c), (long long)bytes, hs_now() - t0);
    }
    hs_ckpt_close(c);
    return rc;
}

/* ------------------------------------------------------------ export */

typedef struct export_ctx {
    hs_ckpt *ckpt;
    hs_model *model;
} export_ctx;

/* hs_hf_save's getter: the whole parameter, read from the checkpoint (any
 * stored dtype) and widened to fp32. */
static hs_status export_get(void *ctx, int i, float *out, hs_error *e) {
    export_ctx *x = ctx;
    const hs_param *p = hs_model_param(x->model, i);
    int idx = hs_ckpt_find(x->ckpt, p->fqn);
    if (idx < 0)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "checkpoint %s has no parameter '%s' that its "
                            "config.yaml's model needs",
                            hs_ckpt_path(x->ckpt), p->fqn);
    hs_ckpt_info info;
    hs_ckpt_tensor_info(x->ckpt, idx, &info);
    hs_ckpt_tensor t;
    void *buf = info.dtype == HS_DTYPE_F32 ? (void *)out : malloc((size_t)info.bytes + 1);
    hs_ckpt_tensor_full(&t, p->fqn, info.dtype, p->ndim, p->shape, buf);
    hs_status s = hs_ckpt_read(x->ckpt, &t, 1, e);
    if (s == HS_OK && buf != out)
        hs_convert(out, HS_DTYPE_F32, buf, info.dtype, hs_ckpt_tensor_numel(&t));
    if (buf != out) free(buf);
    return s;
}

static hs_status export_run(const char *dir, const char *out, hs_dtype dt, hs_error *e) {
    export_ctx x = {0};
    hs_config cfg;
    hs_status s = hs_config_defaults(&cfg, e);
    if (s == HS_OK) s = hs_ckpt_open(dir, &x.ckpt, e);
    char path[HS_PATH_MAX + 32];
    if (s == HS_OK) {
        snprintf(path, sizeof path, "%s/config.yaml", hs_ckpt_path(x.ckpt));
        FILE *probe = fopen(path, "r");
        if (!probe)
            s = hs_error_set(e, HS_ERR_USAGE,
                             "checkpoint %s has no config.yaml (it was saved "
                             "without the run's config), so its model is unknown; export the "
                             "run's weights with `hypershard export --run`",
                             hs_ckpt_path(x.ckpt));
        else fclose(probe);
    }
    if (s == HS_OK) s = hs_config_load(&cfg, path, NULL, 0, e);
    hs_model_options mo = {.compute_dtype = HS_DTYPE_F32,
                           .grad_dtype = HS_DTYPE_F32,
                           .max_batch = 1,
                           .seq_len = cfg.train.seq_len > 0 ? cfg.train.seq_len : 1,
                           .allocate_params = false};
    if (s == HS_OK) s = hs_model_create(&cfg.model, &mo, &x.model, e);
    if (s == HS_OK)
        s = hs_cli_hf_out_check("--safetensors", out, hs_model_param_count(x.model), dt, e);
    if (s == HS_OK) s = hs_hf_save(x.model, export_get, &x, dt, cfg.train.seq_len, out, true, e);
    if (s == HS_OK)
        printf("exported %d parameters (%.2fM values, %s) of %s (step %lld) to "
               "%s/model.safetensors and %s/config.json\n",
               hs_model_num_params(x.model), (double)hs_model_param_count(x.model) / 1e6,
               hs_dtype_name(dt), hs_ckpt_path(x.ckpt), (long long)hs_ckpt_get_state(x.ckpt)->step,
               out, out);
    if (x.model) hs_model_free(x.model);
    hs_ckpt_close(x.ckpt);
    hs_config_free(&cfg);
    return s;
}

static int run_export(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    hs_dtype dt = HS_DTYPE_F32;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--safetensors") && v) out = v, i++;
        else if (!strcmp(a, "--dtype") && v) {
            if (!hs_cli_dtype_arg("ckpt export", v, &dt)) return 2;
            i++;
        } else if (a[0] != '-' && !dir) dir = a;
        else {
            fprintf(stderr, "hypershard ckpt export: unexpected argument '%s'\n", a);
            return ckpt_usage(stderr), 2;
        }
    }
    if (!dir || !out) {
        fprintf(stderr, "hypershard ckpt export: need DIR and --safetensors OUT_DIR\n");
        return ckpt_usage(stderr), 2;
    }
    if (hs_cli_empty_path("ckpt export", "DIR", dir, HS_CLI_CKPT_DIR)) return 2;
    hs_error e;
    hs_error_clear(&e);
    if (hs_cli_hf_out_check("--safetensors", out, 0, dt, &e) != HS_OK) return fail(&e);
    return export_run(dir, out, dt, &e) == HS_OK ? 0 : fail(&e);
}

int hs_cmd_ckpt(int argc, char **argv) {
    const char *sub = argc >= 2 ? argv[1] : "";
    if (!strcmp(sub, "-h") || !strcmp(sub, "--help")) return ckpt_usage(stdout), 0;
    bool look = !strcmp(sub, "inspect") || !strcmp(sub, "verify");
    if (look && argc == 3)
        return hs_cli_empty_path("ckpt", sub, argv[2], HS_CLI_CKPT_DIR)
                   ? 2
                   : run_inspect(argv[2], !strcmp(sub, "verify"));
    if (!strcmp(sub, "export")) return run_export(argc, argv);
    if (sub[0] && !look && strcmp(sub, "export"))
        fprintf(stderr, "hypershard ckpt: unknown subcommand '%s'\n", sub);
    fprintf(stderr, "hypershard ckpt: expected inspect DIR, verify DIR or export DIR "
                    "--safetensors OUT_DIR\n");
    ckpt_usage(stderr);
    return 2;
}
