/* One run at a time per checkpoint.dir: rank 0 holds `<dir>/.lock` (pid,
 * host, start time) from start-up to exit. A second run on the same
 * directory exits 2 at once naming the holder; the lock of a run that died
 * on this host (its pid is gone) is recovered. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "train/run.h"

typedef struct holder {
    long pid;
    char host[256], started[64];
} holder;

static void this_host(char *host, size_t cap) {
    if (gethostname(host, cap) != 0) snprintf(host, cap, "?");
    host[cap - 1] = '\0';
}

static bool read_holder(const char *path, holder *h) {
    memset(h, 0, sizeof *h);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    int n = fscanf(f, "pid %ld\nhost %255s\nstarted %63[^\n]", &h->pid, h->host, h->started);
    fclose(f);
    return n == 3;
}

/* A zombie (exited, not yet reaped: an aborted rank whose parent is gone
 * can stay one) holds nothing. Linux's /proc; elsewhere nothing is known. */
static bool is_zombie(long pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *close = strrchr(buf, ')'); /* the command name may hold spaces */
    return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

/* Alive unless it ran on this host and its pid is gone (or a zombie). */
static bool holder_alive(const holder *h) {
    char host[256];
    this_host(host, sizeof host);
    if (strcmp(host, h->host) != 0) return true;
    if (h->pid <= 0) return false;
    if (kill((pid_t)h->pid, 0) != 0 && errno != EPERM) return false;
    return !is_zombie(h->pid);
}

static hs_status try_create(hs_trainer *t, bool *exists, hs_error *e) {
    int fd = open(t->lock_path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    *exists = fd < 0 && errno == EEXIST;
    if (fd < 0 && !*exists)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "checkpoint.dir = %s: cannot create its lock %s "
                            "(%s); make the directory writable or choose another checkpoint.dir",
                            t->cfg->checkpoint.dir, t->lock_path, hs_strerror_errno());
    if (fd < 0) return HS_OK;
    char host[256], when[64], text[400];
    this_host(host, sizeof host);
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    int n =
        snprintf(text, sizeof text, "pid %ld\nhost %s\nstarted %s\n", (long)getpid(), host, when);
    bool ok = write(fd, text, (size_t)n) == n;
    ok = close(fd) == 0 && ok;
    if (!ok) {
        unlink(t->lock_path);
        return hs_error_set(e, HS_ERR_IO, "checkpoint.dir = %s: cannot write its lock %s (%s)",
                            t->cfg->checkpoint.dir, t->lock_path, hs_strerror_errno());
    }
    t->lock_held = true;
    return HS_OK;
}

static hs_status acquire(hs_trainer *t, hs_error *e) {
    const char *dir = t->cfg->checkpoint.dir;
    struct stat st;
    t->lock_made_dir = stat(dir, &st) != 0;
    hs_status s = hs_mkdirs(dir, e);
    if (s != HS_OK) return s;
    snprintf(t->lock_path, sizeof t->lock_path, "%s/.lock", dir);
    for (int attempt = 0; attempt < 2; attempt++) {
        bool exists = false;
        s = try_create(t, &exists, e);
        if (s != HS_OK || !exists) return s;
        holder h;
        bool known = read_holder(t->lock_path, &h);
        if (known && holder_alive(&h))
            return hs_error_set(e, HS_ERR_CONFIG,
                                "checkpoint.dir = %s is in use by another run: pid %ld on host %s, "
                                "started %s (lock %s); wait for it to end, or choose another "
                                "checkpoint.dir",
                                dir, h.pid, h.host, h.started, t->lock_path);
        if (!known)
            return hs_error_set(e, HS_ERR_CONFIG,
                                "checkpoint.dir = %s: its lock %s names no run (pid, host, start "
                                "time); if no run uses the directory, remove the lock",
                                dir, t->lock_path);
        hs_log_info(t->log,
                    "checkpoint.dir: removed the stale lock of pid %ld on %s (started "
                    "%s), which is not running",
                    h.pid, h.host, h.started);
        unlink(t->lock_path);
    }
    return hs_error_set(e, HS_ERR_CONFIG,
                        "checkpoint.dir = %s: another run keeps taking its "
                        "lock %s",
                        dir, t->lock_path);
}

hs_status hs_train_ckpt_lock(hs_trainer *t, hs_error *e) {
    if (!t->cfg->checkpoint.dir[0]) return HS_OK;
    hs_status mine = t->rank0 ? acquire(t, e) : HS_OK;
    hs_status s = hs_pg_agree(t->world_group, mine, "locking checkpoint.dir", e);
    if (s != HS_OK) hs_train_ckpt_unlock(t);
    return s;
}

void hs_train_ckpt_unlock(hs_trainer *t) {
    if (!t->lock_held) return;
    unlink(t->lock_path);
    t->lock_held = false;
    /* A directory this run created and never saved into goes too. */
    if (t->lock_made_dir) rmdir(t->cfg->checkpoint.dir);
}
