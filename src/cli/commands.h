/* The subcommands of `hypershard`. Each returns the process exit code
 * (0 ok, 2 usage/config error, 1 other failure). argv[0] is the subcommand
 * name; MPI, when a command needs it, is initialised by the command itself. */
#ifndef HYPERSHARD_CLI_COMMANDS_H
#define HYPERSHARD_CLI_COMMANDS_H

int hs_cmd_train(int argc, char **argv);    /* src/cli/cmd_train.c  */
int hs_cmd_launch(int argc, char **argv);   /* src/cli/cmd_launch.c */
int hs_cmd_config(int argc, char **argv);   /* src/cli/cmd_config.c */
int hs_cmd_plan(int argc, char **argv);     /* src/cli/cmd_config.c */
int hs_cmd_mesh(int argc, char **argv);     /* src/cli/cmd_mesh.c   */
int hs_cmd_export(int argc, char **argv);   /* src/cli/cmd_export.c */
int hs_cmd_generate(int argc, char **argv); /* src/cli/cmd_infer.c */
int hs_cmd_eval(int argc, char **argv);     /* src/cli/cmd_infer.c */
int hs_cmd_tokenize(int argc, char **argv); /* src/cli/cmd_infer.c */
int hs_cmd_import(int argc, char **argv);   /* src/cli/cmd_export.c */
int hs_cmd_ckpt(int argc, char **argv);     /* src/cli/cmd_ckpt.c   */

#include <stdbool.h>

#include "hypershard/tensor.h"

/* `--dtype V` of an export command: false (after printing why, naming
 * `cmd`) when V is not a dtype name. */
bool hs_cli_dtype_arg(const char *cmd, const char *v, hs_dtype *dt); /* src/cli/args.c */

/* A path argument given as "" would name the current or the root
 * directory's files: true (after printing which flag is empty, naming `cmd`,
 * and `fix`, what to give) when `path` is empty; NULL is not given. */
bool hs_cli_empty_path(const char *cmd, const char *flag, const char *path,
                       const char *fix); /* src/cli/args.c */
#define HS_CLI_RUN_DIR "a finished run's train.out_dir (config.yaml, model.safetensors)"
#define HS_CLI_CKPT_DIR "a checkpoint's step-N directory, or its checkpoint.dir"

/* OUT_DIR of a command that writes Hugging Face weights (`flag` names it:
 * "--safetensors", "--out"), before any work: hs_out_dirs_check with the
 * files such a directory holds, and room for `values` parameter values of
 * dtype dt (0: not known yet, the path alone is checked). */
hs_status hs_cli_hf_out_check(const char *flag, const char *dir, int64_t values, hs_dtype dt,
                              hs_error *e); /* src/cli/args.c */

int hs_bench_comm(int argc, char **argv);      /* bench/bench_comm.c   */
int hs_bench_step(int argc, char **argv);      /* bench/bench_step.c   */
int hs_bench_ops(int argc, char **argv);       /* bench/bench_ops.c    */
int hs_bench_fsdp(int argc, char **argv);      /* bench/bench_fsdp.c   */
int hs_bench_tp(int argc, char **argv);        /* bench/bench_tp.c     */
int hs_bench_cp(int argc, char **argv);        /* bench/bench_cp.c     */
int hs_bench_moe(int argc, char **argv);       /* bench/bench_moe.c    */
int hs_bench_pp(int argc, char **argv);        /* bench/bench_pp.c     */
int hs_bench_calibrate(int argc, char **argv); /* bench/bench_calibrate.c */

#endif
