/* The pieces of `hypershard launch` (docs/launch.md, "Restarting failed
 * jobs"): the launcher is no MPI process. It runs `mpiexec ... hypershard
 * train` as a child (launch_job.c), decides from the config alone which
 * smaller world keeps the run's layout and global batch (launch_layout.c),
 * tracks the hosts of a hostfile (launch_hosts.c), and loops over attempts
 * (cmd_launch.c). */
#ifndef HYPERSHARD_CLI_LAUNCH_H
#define HYPERSHARD_CLI_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>

#include "hypershard/base.h"

/* ------------------------------------------------------------------ job */

typedef struct hs_launch_result {
    int status;       /* exit code, or 128 + signal when killed by one */
    bool stop;        /* the launcher got SIGTERM / SIGINT and passed it on */
    char reason[512]; /* why the job failed, from its output ("" when it did not say) */
} hs_launch_result;

/* Block SIGTERM, SIGINT and SIGCHLD in the launcher (once, before any
 * child): they are taken synchronously while a job runs. */
void hs_launch_signals_block(void);

/* Run argv (argv[0] found on PATH) with stdin from /dev/null, in a process
 * group of its own, its stderr passed through while scanned for the
 * failure's cause; SIGTERM / SIGINT to the launcher go to the child, and
 * one pending already starts nothing (r->stop, status 128 + signal).
 * timeout_s > 0 kills the child (SIGKILL to its group) after that long.
 * probe: its stderr is read but not shown, and signals stay pending for
 * the next job. Returns false (printing why) only when the child could not
 * be started. */
bool hs_launch_run(char *const *argv, double timeout_s, bool probe, hs_launch_result *r);

/* --------------------------------------------------------------- layout */

enum { HS_LAUNCH_MAX_KEYS = 4 };

/* What a world adds to the run's overrides to keep its layout and global
 * batch: "key=value" strings, and for the message "key old -> new". */
typedef struct hs_launch_layout {
    int world;
    long long global_batch; /* resolved: train.global_batch_size or its null default */
    bool resume_auto;       /* checkpoint.resume is auto */
    int n_keys;
    char keys[HS_LAUNCH_MAX_KEYS][96];
    char changes[HS_LAUNCH_MAX_KEYS][96];
} hs_launch_layout;

/* The config as given (CONFIG and overrides) at `world`: loaded and
 * validated like `hypershard train` does (its errors are HS_ERR_CONFIG /
 * HS_ERR_USAGE); `out` gets world, the global batch, whether
 * checkpoint.resume is auto, and no keys.
 * ckpt_dir (HS_PATH_MAX) gets checkpoint.dir. */
hs_status hs_launch_layout_check(const char *config, const char *const *ov, int n_ov, int world,
                                 hs_launch_layout *out, char *ckpt_dir, hs_error *e);

/* The largest world in [min_world, max_world] whose layout is valid with
 * tp/cp/pp/ep kept, the data-parallel shard degrees shrunk to divide the
 * smaller domain and the global batch of `orig` kept (micro_batch_size
 * shrunk only when the batch needs it); false when there is none. */
bool hs_launch_layout_shrink(const char *config, const char *const *ov, int n_ov,
                             const hs_launch_layout *orig, int min_world, int max_world,
                             hs_launch_layout *out);

/* --------------------------------------------------------------- resume */

/* Where the next attempt starts: the newest checkpoint under checkpoint.dir
 * `dir` whose every chunk verifies (CRC32), `latest` first, then the
 * step-<N> directories newest first. *step gets its step (0: none);
 * `resume` (cap bytes) the checkpoint.resume value: "auto" when it is the
 * one `latest` names, its path for an older one, "none" when nothing
 * verifies (the attempt starts afresh). */
void hs_launch_resume_point(const char *dir, long long *step, char *resume, size_t cap);

/* ---------------------------------------------------------------- hosts */

enum { HS_LAUNCH_MAX_HOSTS = 256 };

typedef struct hs_launch_hosts {
    int n;
    char name[HS_LAUNCH_MAX_HOSTS][256];
    int slots[HS_LAUNCH_MAX_HOSTS]; /* 0: not given (mpiexec decides) */
    bool gone[HS_LAUNCH_MAX_HOSTS];
} hs_launch_hosts;

/* Read an Open MPI hostfile: "name [slots=N] [...]" per line, # comments. */
hs_status hs_launch_hosts_read(const char *path, hs_launch_hosts *h, hs_error *e);
/* Start `true` on every host not gone yet through `mpiexec` (the launch
 * path the job takes); mark those that fail or do not answer within
 * timeout_s gone, printing each. Returns how many were newly marked. */
int hs_launch_hosts_probe(hs_launch_hosts *h, const char *mpiexec, double timeout_s);
/* Slots of the hosts not gone; -1 when one of them has no slot count. */
int hs_launch_hosts_slots(const hs_launch_hosts *h);
/* Write the hosts not gone to `path` (a hostfile for mpiexec). */
hs_status hs_launch_hosts_write(const hs_launch_hosts *h, const char *path, hs_error *e);

#endif
