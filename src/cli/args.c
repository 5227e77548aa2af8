/* Argument checks shared by the subcommands. */
#include <stdint.h>
#include <stdio.h>

#include "cli/commands.h"

bool hs_cli_empty_path(const char *cmd, const char *flag, const char *path, const char *fix) {
    if (!path || path[0]) return false;
    fprintf(stderr, "hypershard %s: %s: empty path given; give %s\n", cmd, flag, fix);
    return true;
}

bool hs_cli_dtype_arg(const char *cmd, const char *v, hs_dtype *dt) {
    if (hs_dtype_parse(v, dt)) return true;
    fprintf(stderr, "hypershard %s: --dtype %s: expected float32, bfloat16 or float16\n", cmd, v);
    return false;
}

hs_status hs_cli_hf_out_check(const char *flag, const char *dir, int64_t values, hs_dtype dt,
                              hs_error *e) {
    static const char *const files[] = {"model.safetensors",       "config.json",
                                        "tokenizer.json",          "tokenizer_config.json",
                                        "special_tokens_map.json", NULL};
    int64_t bytes = 0;
    if (!hs_mul_i64(values, (int64_t)hs_dtype_size(dt), &bytes)) bytes = INT64_MAX;
    char what[96];
    snprintf(what, sizeof what, "model.safetensors takes about %.1f MiB (%lld %s values)",
             (double)bytes / (1 << 20), (long long)values, hs_dtype_name(dt));
    hs_out_dir d = {.what = flag, .path = dir, .files = files, .bytes = bytes, .bytes_what = what};
    return hs_out_dirs_check(&d, 1, e);
}
