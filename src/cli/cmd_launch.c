/* `hypershard launch [-n N] [--hostfile F] [--max-restarts K] [--min-ranks M]
 * [CONFIG] [a.b.c=value ...]`: run `mpiexec -n N hypershard train ...` and,
 * when the job fails (a rank killed, a host lost, the watchdog), restart it
 * from the newest verified checkpoint, at most K times, saying why; with
 * --min-ranks, on fewer ranks when the same world keeps failing without
 * progress or hosts are gone (docs/launch.md, "Restarting failed jobs").
 * The launcher itself never starts MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/launch.h"
#include "hypershard/config.h"

/* How long a host has to start a process before it counts as gone. */
#define PROBE_TIMEOUT_S 60.0

typedef struct launch_args {
    int n; /* -n; 0: the hostfile's slots */
    const char *hostfile;
    int max_restarts; /* restarts after the first attempt */
    int min_ranks;    /* 0: never fewer ranks */
    const char *config;
    const char **ov;
    int n_ov;
} launch_args;

typedef struct launch_state {
    const launch_args *a;
    const char *mpiexec;
    char self[HS_PATH_MAX];
    char ckpt_dir[HS_PATH_MAX];
    hs_launch_layout orig, cur;
    hs_launch_hosts *hosts;        /* NULL without --hostfile */
    char hostfile[HS_PATH_MAX];    /* the one the next attempt uses */
    char resume[HS_PATH_MAX + 32]; /* checkpoint.resume of the next attempt ("" first) */
    long long step;                /* the step the next attempt resumes at */
    int restarts, stalled;         /* stalled: failures in a row without a newer checkpoint */
} launch_state;

static void launch_usage(FILE *f) {
    fprintf(f,
            "usage: hypershard launch [-n N] [--hostfile F] [--max-restarts K] [--min-ranks M]\n"
            "                         [CONFIG] [a.b.c=value ...]\n"
            "  runs `mpiexec -n N hypershard train CONFIG ...` (mpiexec: $MPIEXEC, else on PATH)\n"
            "  and restarts a failed job from the newest verified checkpoint (checkpoint.dir)\n"
            "  -n N              ranks (default: the hostfile's slots)\n"
            "  --hostfile F      Open MPI hostfile; hosts that stop answering are left out\n"
            "  --max-restarts K  restarts at most (default 3)\n"
            "  --min-ranks M     when the same world fails twice without a newer checkpoint,\n"
            "                    or hosts are gone, restart on the largest world >= M whose\n"
            "                    layout is valid with the same global batch\n"
            "SIGTERM / SIGINT are passed on to the job (its ranks save and stop; no restart).\n"
            "Exit: 0 done; 2 usage or config error (never restarted); 3 stopped by a signal\n"
            "after a save; else the last attempt's failure status.\n");
}

/* The value of flag argv[*i] ("-n 4" or "-n=4"), an integer >= lo. */
static bool int_flag(int argc, char **argv, int *i, const char *flag, int lo, int *out) {
    const char *s = argv[*i], *v = NULL;
    size_t n = strlen(flag);
    if (!strcmp(s, flag) && *i + 1 < argc) v = argv[++*i];
    else if (!strncmp(s, flag, n) && s[n] == '=') v = s + n + 1;
    if (!v) return false;
    char *end;
    long x = strtol(v, &end, 10);
    if (*v && !*end && x >= lo && x <= 1 << 20) *out = (int)x;
    else *out = -1;
    return true;
}

static int parse_flag(int argc, char **argv, int *i, launch_args *a) {
    const char *s = argv[*i];
    int *dst = NULL, lo = 0, v = 0;
    if (int_flag(argc, argv, i, "-n", 1, &v)) dst = &a->n, lo = 1;
    else if (int_flag(argc, argv, i, "--max-restarts", 0, &v)) dst = &a->max_restarts;
    else if (int_flag(argc, argv, i, "--min-ranks", 1, &v)) dst = &a->min_ranks, lo = 1;
    else if (!strcmp(s, "--hostfile") && *i + 1 < argc) return a->hostfile = argv[++*i], 0;
    else if (!strncmp(s, "--hostfile=", 11)) return a->hostfile = s + 11, 0;
    if (!dst) {
        bool known = !strcmp(s, "-n") || !strcmp(s, "--hostfile") || !strcmp(s, "--max-restarts") ||
                     !strcmp(s, "--min-ranks");
        fprintf(stderr, "hypershard launch: %s '%s'\n", known ? "no value for" : "unknown option",
                s);
        return launch_usage(stderr), 2;
    }
    if (v < 0) {
        fprintf(stderr, "hypershard launch: %s: expected an integer >= %d\n", s, lo);
        return 2;
    }
    *dst = v;
    return 0;
}

static int parse_args(int argc, char **argv, launch_args *a) {
    a->max_restarts = 3;
    a->ov = calloc((size_t)argc + 1, sizeof(char *));
    if (!a->ov) return 1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        int rc = 0;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return launch_usage(stdout), -1;
        if (s[0] == '-') rc = parse_flag(argc, argv, &i, a);
        else if (strchr(s, '=')) a->ov[a->n_ov++] = s;
        else if (!a->config) a->config = s;
        else {
            fprintf(stderr, "hypershard launch: a second CONFIG '%s' (the first is '%s')\n", s,
                    a->config);
            rc = 2;
        }
        if (rc) return rc;
    }
    if (hs_cli_empty_path("launch", "--hostfile", a->hostfile, "an Open MPI hostfile")) return 2;
    return 0;
}

/* -n, the hostfile and --min-ranks agree; the config is valid at -n and
 * names a checkpoint.dir. Prints why not; returns the exit code. */
static int prepare(launch_state *st) {
    const launch_args *a = st->a;
    hs_error e;
    hs_error_clear(&e);
    if (st->hosts && hs_launch_hosts_read(a->hostfile, st->hosts, &e) != HS_OK)
        return fprintf(stderr, "hypershard launch: %s\n", e.msg), 2;
    int world = a->n ? a->n : st->hosts ? hs_launch_hosts_slots(st->hosts) : -1;
    if (world < 1)
        return fprintf(stderr, "hypershard launch: give -n N (the ranks to run%s)\n",
                       st->hosts ? "; the hostfile does not give every host's slots" : ""),
               2;
    if (a->min_ranks > world)
        return fprintf(stderr, "hypershard launch: --min-ranks %d exceeds the %d ranks to run\n",
                       a->min_ranks, world),
               2;
    if (hs_launch_layout_check(a->config, a->ov, a->n_ov, world, &st->orig, st->ckpt_dir, &e) !=
        HS_OK)
        return fprintf(stderr, "hypershard launch: %s\n", e.msg), hs_status_exit_code(e.code);
    if (!st->ckpt_dir[0])
        return fprintf(stderr, "hypershard launch: checkpoint.dir is null: a restart resumes "
                               "from a checkpoint; set checkpoint.dir (and "
                               "checkpoint.save_every)\n"),
               2;
    st->cur = st->orig;
    ssize_t n = readlink("/proc/self/exe", st->self, sizeof st->self - 1);
    if (n <= 0) return fprintf(stderr, "hypershard launch: cannot find its own binary\n"), 1;
    st->self[n] = '\0';
    const char *m = getenv("MPIEXEC");
    st->mpiexec = m && m[0] ? m : "mpiexec";
    if (a->hostfile) snprintf(st->hostfile, sizeof st->hostfile, "%s", a->hostfile);
    /* Progress is a newer checkpoint than the one there is now; the first
     * attempt resumes as the config says (st->resume stays ""), except
     * that with resume=auto a `latest` that does not verify is passed
     * over for the newest step that does, as a restart would be. */
    char first[sizeof st->resume];
    hs_launch_resume_point(st->ckpt_dir, &st->step, first, sizeof first);
    if (st->orig.resume_auto && strcmp(first, "auto")) {
        snprintf(st->resume, sizeof st->resume, "%s", first);
        fprintf(stderr, "hypershard launch: the latest checkpoint does not verify; attempt 1 %s\n",
                strcmp(first, "none") ? "resumes from the newest step that does" : "starts afresh");
    }
    return 0;
}

/* mpiexec -n W [--hostfile H] SELF train [CONFIG] OVERRIDES LAYOUT-KEYS [checkpoint.resume=R] */
static char **job_argv(launch_state *st, char *nbuf, char *resume_kv) {
    const launch_args *a = st->a;
    char **v = calloc((size_t)(a->n_ov + st->cur.n_keys + 12), sizeof(char *));
    if (!v) return NULL;
    int k = 0;
    v[k++] = (char *)st->mpiexec;
    v[k++] = "-n";
    v[k++] = nbuf;
    if (st->hostfile[0]) v[k++] = "--hostfile", v[k++] = st->hostfile;
    v[k++] = st->self;
    v[k++] = "train";
    if (a->config) v[k++] = (char *)a->config;
    for (int i = 0; i < a->n_ov; i++) v[k++] = (char *)a->ov[i];
    for (int i = 0; i < st->cur.n_keys; i++) v[k++] = st->cur.keys[i];
    if (st->resume[0]) v[k++] = resume_kv;
    return v;
}

static bool attempt(launch_state *st, hs_launch_result *r) {
    char nbuf[16], resume_kv[HS_PATH_MAX + 64];
    snprintf(nbuf, sizeof nbuf, "%d", st->cur.world);
    snprintf(resume_kv, sizeof resume_kv, "checkpoint.resume=%s", st->resume);
    char **v = job_argv(st, nbuf, resume_kv);
    if (!v) return fprintf(stderr, "hypershard launch: out of memory\n"), false;
    fprintf(stderr, "hypershard launch: attempt %d:", st->restarts + 1);
    for (int i = 0; v[i]; i++) fprintf(stderr, " %s", v[i]);
    fprintf(stderr, "\n");
    bool ok = hs_launch_run(v, 0, false, r);
    free(v);
    return ok;
}

/* The slots of the hosts still answering (-1: no hostfile, or a host
 * without a slot count); a host found gone is left out of the hostfile of
 * the next attempts. */
static int hosts_left(launch_state *st) {
    if (!st->hosts) return -1;
    if (hs_launch_hosts_probe(st->hosts, st->mpiexec, PROBE_TIMEOUT_S) > 0) {
        hs_error e;
        hs_error_clear(&e);
        const char *tmp = getenv("TMPDIR");
        snprintf(st->hostfile, sizeof st->hostfile, "%s/hypershard-launch-%d.hosts",
                 tmp && tmp[0] ? tmp : "/tmp", (int)getpid());
        if (hs_launch_hosts_write(st->hosts, st->hostfile, &e) != HS_OK) {
            fprintf(stderr, "hypershard launch: %s; the next attempt uses %s\n", e.msg,
                    st->a->hostfile);
            snprintf(st->hostfile, sizeof st->hostfile, "%s", st->a->hostfile);
        }
    }
    return hs_launch_hosts_slots(st->hosts);
}

/* The hosts marked gone so far. */
static int hosts_gone(const launch_state *st) {
    int n = 0;
    for (int i = 0; st->hosts && i < st->hosts->n; i++) n += st->hosts->gone[i];
    return n;
}

/* After a failure with every host answering: does mpiexec refuse to start
 * this world on the hostfile at all (a line it cannot parse, slots it
 * rejects)? Then no restart heals it. Probed by starting `true` on the
 * same -n and hostfile as the job. */
static bool hostfile_refused(launch_state *st) {
    if (!st->hostfile[0] || hosts_gone(st)) return false;
    char nbuf[16];
    snprintf(nbuf, sizeof nbuf, "%d", st->cur.world);
    char *argv[] = {(char *)st->mpiexec, "-n", nbuf, "--hostfile", st->hostfile, "true", NULL};
    hs_launch_result r;
    if (hs_launch_run(argv, PROBE_TIMEOUT_S, true, &r) && r.status == 0) return false;
    fprintf(stderr,
            "hypershard launch: not restarting: mpiexec refuses to start %d ranks on the "
            "hostfile %s although every host in it answers (%s, exit %d); fix the hostfile\n",
            st->cur.world, st->hostfile, r.reason[0] ? r.reason : "it gave no reason", r.status);
    return true;
}

/* With --min-ranks: fewer ranks when this world keeps failing without
 * progress or the hosts left have fewer slots. */
static void maybe_shrink(launch_state *st, int slots) {
    const launch_args *a = st->a;
    int w = st->cur.world, cap = w;
    if (slots >= 0 && slots < w) cap = slots;
    if (st->stalled >= 2 && cap == w) cap = w - 1;
    if (!a->min_ranks || cap == w) return;
    hs_launch_layout next;
    if (!hs_launch_layout_shrink(a->config, a->ov, a->n_ov, &st->orig, a->min_ranks, cap, &next)) {
        fprintf(stderr,
                "hypershard launch: no world of %d to %d ranks has a valid layout with the "
                "global batch %lld; staying at %d ranks\n",
                a->min_ranks, cap, st->orig.global_batch, w);
        return;
    }
    fprintf(stderr, "hypershard launch: %d ranks instead of %d (%s); global batch %lld kept;",
            next.world, w,
            slots >= 0 && slots < w ? "hosts are gone" : "two failures without a newer checkpoint",
            next.global_batch);
    for (int i = 0; i < next.n_keys; i++) fprintf(stderr, "%s %s", i ? "," : "", next.changes[i]);
    fprintf(stderr, "%s\n", next.n_keys ? "" : " no key changed");
    st->cur = next;
    st->stalled = 0;
}

/* The job failed: restart (true), or the exit code in *code. */
static bool restart(launch_state *st, const hs_launch_result *r, int *code) {
    long long before = st->step;
    hs_launch_resume_point(st->ckpt_dir, &st->step, st->resume, sizeof st->resume);
    char why[600];
    snprintf(why, sizeof why, "%s (exit %d)", r->reason[0] ? r->reason : "the job failed",
             r->status);
    if (r->stop) {
        *code = st->step > before ? 3 : r->status;
        fprintf(stderr,
                "hypershard launch: stopped by a signal; the newest checkpoint is step %lld "
                "(run the same command to continue)\n",
                st->step);
        return false;
    }
    /* Failures a restart cannot heal: a usage or configuration error
     * (exit 2, data.path included), a stop, and a job that could not be
     * started at all (126 / 127: MPIEXEC is no program that runs). */
    if (r->status == 2 || r->status == 3 || r->status == 126 || r->status == 127) {
        *code = r->status;
        fprintf(stderr, "hypershard launch: not restarting: %s\n",
                r->status == 2   ? "a usage or configuration error does not heal"
                : r->status == 3 ? "the ranks were stopped by a signal (exit 3)"
                                 : "the job could not be started (check MPIEXEC)");
        return false;
    }
    st->stalled = st->step > before ? 0 : st->stalled + 1;
    if (st->restarts == st->a->max_restarts) {
        *code = r->status;
        fprintf(stderr, "hypershard launch: giving up after %d restart%s: %s\n", st->restarts,
                st->restarts == 1 ? "" : "s", why);
        return false;
    }
    /* the hosts are probed only for an attempt that will run */
    int slots = hosts_left(st);
    if (hostfile_refused(st)) return *code = 2, false;
    st->restarts++;
    fprintf(stderr, "hypershard launch: restart %d of %d: %s\n", st->restarts, st->a->max_restarts,
            why);
    maybe_shrink(st, slots);
    fprintf(stderr, "hypershard launch: resuming from %s (step %lld) on %d ranks\n",
            !strcmp(st->resume, "auto") ? "the latest checkpoint" : st->resume, st->step,
            st->cur.world);
    return true;
}

static int launch_loop(launch_state *st) {
    hs_launch_signals_block();
    for (;;) {
        hs_launch_result r;
        if (!attempt(st, &r)) return 1;
        if (r.status == 0) {
            fprintf(stderr, "hypershard launch: done on %d ranks after %d restart%s\n",
                    st->cur.world, st->restarts, st->restarts == 1 ? "" : "s");
            return 0;
        }
        int code = r.status;
        if (!restart(st, &r, &code)) return code;
    }
}

int hs_cmd_launch(int argc, char **argv) {
    launch_args a = {0};
    int rc = parse_args(argc, argv, &a);
    launch_state *st = rc == 0 ? calloc(1, sizeof *st) : NULL;
    if (rc == 0 && st) {
        st->a = &a;
        if (a.hostfile) st->hosts = calloc(1, sizeof *st->hosts);
        rc = a.hostfile && !st->hosts ? 1 : prepare(st);
        if (rc == 0) rc = launch_loop(st);
        if (st->hostfile[0] && a.hostfile && strcmp(st->hostfile, a.hostfile)) unlink(st->hostfile);
        free(st->hosts);
    } else if (rc == 0) {
        rc = 1;
    }
    free(st);
    free(a.ov);
    return rc < 0 ? 0 : rc;
}
