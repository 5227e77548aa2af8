/* Status codes, error reports, panics and checked libc helpers. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "hypershard/base.h"

static const char *const status_names[] = {
    [HS_OK] = "ok",
    [HS_ERR_USAGE] = "usage error",
    [HS_ERR_CONFIG] = "configuration error",
    [HS_ERR_IO] = "I/O error",
    [HS_ERR_FORMAT] = "format error",
    [HS_ERR_COMM] = "communication error",
    [HS_ERR_TIMEOUT] = "timeout",
    [HS_ERR_OOM] = "out of memory",
    [HS_ERR_INTERNAL] = "internal error",
    [HS_STOPPED] = "stopped by a signal",
};
_Static_assert(sizeof(status_names) / sizeof(status_names[0]) == HS_STATUS_COUNT,
               "status_names must follow hs_status");

const char *hs_status_name(hs_status s) {
    return (s >= 0 && s < HS_STATUS_COUNT) ? status_names[s] : "unknown status";
}

int hs_status_exit_code(hs_status s) {
    if (s == HS_OK) return 0;
    if (s == HS_ERR_USAGE || s == HS_ERR_CONFIG) return 2;
    if (s == HS_STOPPED) return 3;
    return 1;
}

void hs_error_clear(hs_error *e) {
    if (!e) return;
    e->code = HS_OK;
    e->lines = 0;
    e->msg[0] = '\0';
}

hs_status hs_error_vappend(hs_error *e, hs_status code, const char *fmt, va_list ap) {
    if (!e) return code;
    if (e->code == HS_OK) e->code = code;
    size_t used = strlen(e->msg);
    /* Lines are separated by '\n'; a report that no longer fits is cut with a
     * marker rather than overflowing, so the first errors always survive. */
    if (used > 0 && used + 1 < sizeof e->msg) e->msg[used++] = '\n', e->msg[used] = '\0';
    if (used + 1 < sizeof e->msg) {
        int n = vsnprintf(e->msg + used, sizeof e->msg - used, fmt, ap);
        if (n >= 0 && (size_t)n >= sizeof e->msg - used) {
            static const char cut[] = "... (more errors cut)";
            memcpy(e->msg + sizeof e->msg - sizeof cut, cut, sizeof cut);
        }
    }
    e->lines++;
    return e->code;
}

hs_status hs_error_append(hs_error *e, hs_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    hs_status s = hs_error_vappend(e, code, fmt, ap);
    va_end(ap);
    return s;
}

hs_status hs_error_set(hs_error *e, hs_status code, const char *fmt, ...) {
    hs_error_clear(e);
    va_list ap;
    va_start(ap, fmt);
    hs_error_vappend(e, code, fmt, ap);
    va_end(ap);
    if (e) e->code = code;
    return code;
}

_Noreturn void hs_panic_at(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "hypershard: internal error at %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}

/* What makes a run smaller, for every out-of-memory report. */
static const char oom_hint[] =
    "`hypershard plan` shows what each rank holds; more ranks, fsdp_config.dp_shard_size, "
    "train.activation_checkpointing, mixed precision or offload make a run smaller";

hs_status hs_error_oom(hs_error *e, const char *fmt, ...) {
    char what[HS_ERROR_MSG_MAX / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    hs_error_set(e, HS_ERR_OOM, "out of memory: %s", what);
    return hs_error_append(e, HS_ERR_OOM, "  %s", oom_hint);
}

const char *hs_strerror_errno(void) { return strerror(errno); }

FILE *hs_fopen(const char *path, const char *mode, const char *hint, hs_error *e) {
    FILE *f = fopen(path, mode);
    if (!f) {
        const char *what = (mode[0] == 'r') ? "reading" : "writing";
        hs_error_set(e, HS_ERR_IO, "cannot open %s for %s: %s%s%s", path, what, strerror(errno),
                     hint ? "; " : "", hint ? hint : "");
    }
    return f;
}

hs_status hs_regular_file(const char *path, const char *what, const char *fix, hs_error *e) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return hs_error_set(e, HS_ERR_CONFIG, "cannot open %s (%s): %s; %s", path, what,
                            strerror(errno), fix);
    struct stat st;
    bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    close(fd);
    if (regular) return HS_OK;
    const char *kind = S_ISFIFO(st.st_mode)   ? "a FIFO"
                       : S_ISDIR(st.st_mode)  ? "a directory"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "a device";
    return hs_error_set(e, HS_ERR_CONFIG, "%s (%s) is %s, not a regular file; %s", path, what, kind,
                        fix);
}

hs_status hs_read_file(const char *path, char **out, size_t *len, hs_error *e) {
    *out = NULL;
    FILE *f = hs_fopen(path, "rb", NULL, e);
    if (!f) return HS_ERR_IO;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return hs_error_oom(e, "reading %s: a buffer of %zu bytes", path, cap);
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n + 1 < cap) break;
        cap *= 2;
        char *grown = realloc(buf, cap);
        if (!grown) free(buf);
        buf = grown;
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        return hs_error_set(e, HS_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return HS_OK;
}

hs_status hs_mkdirs(const char *path, hs_error *e) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0) return HS_OK;
    if (n >= sizeof buf)
        return hs_error_set(e, HS_ERR_IO, "path too long (%zu bytes): %.64s...", n, path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char saved = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return hs_error_set(e, HS_ERR_IO, "cannot create directory %s: %s", buf,
                                strerror(errno));
        buf[i] = saved;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return hs_error_set(e, HS_ERR_IO, "%s exists and is not a directory", path);
    return HS_OK;
}

hs_status hs_fclose_written(FILE *f, const char *path, const char *hint, hs_error *e) {
    bool bad = ferror(f) != 0;
    int err = errno;
    if (fclose(f) != 0) bad = true, err = errno;
    if (!bad) return HS_OK;
    return hs_error_set(e, HS_ERR_IO, "cannot write %s: %s%s%s", path, strerror(err),
                        hint ? "; " : "", hint ? hint : "");
}

/* ------------------------------------------------------------ output paths */

#define OUT_DIRS_MAX 8

/* What the checks learn of one output dir. */
typedef struct out_at {
    char label[4200];  /* "--flag PATH" or "key = PATH" */
    char anchor[4096]; /* the dir itself, or its nearest existing ancestor */
    dev_t dev;
    bool counted; /* already part of a file system's total */
} out_at;

static hs_status out_fail(const hs_out_dir *d, hs_error *e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static hs_status out_fail(const hs_out_dir *d, hs_error *e, const char *fmt, ...) {
    hs_error_clear(e);
    va_list ap;
    va_start(ap, fmt);
    hs_error_vappend(e, HS_OK, fmt, ap);
    va_end(ap);
    hs_status code = d->what[0] == '-' ? HS_ERR_USAGE : HS_ERR_CONFIG;
    if (e) e->code = code;
    return code;
}

/* The nearest existing ancestor of d->path (the path itself when it
 * exists): a directory this process can create files in. */
static hs_status out_anchor(const hs_out_dir *d, out_at *at, hs_error *e) {
    size_t n = strlen(d->path);
    if (n >= sizeof at->anchor)
        return out_fail(d, e, "%s: the path is %zu bytes long; give a shorter one", at->label, n);
    memcpy(at->anchor, d->path, n + 1);
    struct stat st;
    while (stat(at->anchor, &st) != 0) {
        char *slash = strrchr(at->anchor, '/');
        if (!slash) {
            snprintf(at->anchor, sizeof at->anchor, ".");
            break;
        }
        if (slash == at->anchor) slash[1] = '\0';
        else *slash = '\0';
    }
    if (stat(at->anchor, &st) != 0 || !S_ISDIR(st.st_mode))
        return out_fail(d, e,
                        "%s: %s is not a directory; point %s at a directory (or move %s "
                        "away)",
                        at->label, at->anchor, d->what, at->anchor);
    at->dev = st.st_dev;
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.hs-write-probe-XXXXXX", at->anchor);
    int fd = mkstemp(probe);
    if (fd < 0)
        return out_fail(d, e,
                        "%s: cannot create files in %s (%s); make it writable or choose "
                        "another %s",
                        at->label, at->anchor, strerror(errno), d->what);
    close(fd);
    unlink(probe);
    return HS_OK;
}

/* None of the files the command writes is in the way as a directory. */
static hs_status out_files(const hs_out_dir *d, const out_at *at, hs_error *e) {
    for (int i = 0; d->files && d->files[i]; i++) {
        char path[8300];
        snprintf(path, sizeof path, "%s/%s", d->path, d->files[i]);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
            return out_fail(d, e,
                            "%s: %s is a directory, where this writes the file %s; remove "
                            "or rename it, or choose another %s",
                            at->label, path, d->files[i], d->what);
    }
    return HS_OK;
}

static double mib(int64_t bytes) { return (double)bytes / (1 << 20); }

/* The dirs on at[i]'s file system (those from i on not yet counted) fit
 * in its free space together. */
static hs_status out_space(const hs_out_dir *dirs, out_at *at, int n, int i, hs_error *e) {
    hs_checked ck = {0};
    int64_t need = 0;
    int members[OUT_DIRS_MAX], m = 0;
    for (int k = i; k < n; k++) {
        if (at[k].dev != at[i].dev || at[k].counted) continue;
        at[k].counted = true;
        if (dirs[k].bytes <= 0) continue;
        need = hs_ck_add(&ck, need, dirs[k].bytes);
        members[m++] = k;
    }
    struct statvfs fs;
    if (m == 0 || statvfs(at[i].anchor, &fs) != 0) return HS_OK;
    int64_t room = 0;
    if (!hs_mul_i64((int64_t)fs.f_bavail, (int64_t)fs.f_frsize, &room)) room = INT64_MAX;
    if (!ck.overflow && room >= need) return HS_OK;
    const hs_out_dir *d = &dirs[members[0]];
    out_fail(d, e, "%s: %s has %.1f MiB free and %s", at[members[0]].label, at[i].anchor, mib(room),
             d->bytes_what ? d->bytes_what : "more is written there");
    size_t cap = sizeof e->msg;
    for (int k = 1; k < m; k++) {
        const hs_out_dir *o = &dirs[members[k]];
        size_t used = strlen(e->msg);
        snprintf(e->msg + used, cap - used, "; on the same file system, %s: %s",
                 at[members[k]].label, o->bytes_what ? o->bytes_what : "more is written there");
    }
    size_t used = strlen(e->msg);
    snprintf(e->msg + used, cap - used,
             " (%lld bytes needed%s, %lld available); free space there or %s%s on another "
             "file system",
             ck.overflow ? (long long)INT64_MAX : (long long)need, m > 1 ? " in all" : "",
             (long long)room, m > 1 ? "put one of " : "choose another ", m > 1 ? "these" : d->what);
    return e->code;
}

hs_status hs_out_dirs_check(const hs_out_dir *dirs, int n, hs_error *e) {
    HS_ASSERT(n >= 0 && n <= OUT_DIRS_MAX);
    out_at at[OUT_DIRS_MAX];
    for (int i = 0; i < n; i++) {
        const hs_out_dir *d = &dirs[i];
        const char *path = d->path ? d->path : "";
        snprintf(at[i].label, sizeof at[i].label, d->what[0] == '-' ? "%s %s" : "%s = %s", d->what,
                 path);
        at[i].counted = false;
        if (!path[0])
            return out_fail(d, e,
                            "%s: empty path; give the directory to write into (\".\" "
                            "for the current one)",
                            d->what);
        hs_status s = out_anchor(d, &at[i], e);
        if (s == HS_OK) s = out_files(d, &at[i], e);
        if (s != HS_OK) return s;
    }
    for (int i = 0; i < n; i++) {
        hs_status s = at[i].counted ? HS_OK : out_space(dirs, at, n, i, e);
        if (s != HS_OK) return s;
    }
    return HS_OK;
}
