/* Status codes, error reports, panics and checked libc helpers. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

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

_Noreturn void hs_oom(const char *fmt, ...) {
    fputs("hypershard: out of memory: ", stderr);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n  `hypershard plan` shows what each rank holds; more ranks, "
          "fsdp_config.dp_shard_size, train.activation_checkpointing, mixed precision or "
          "offload make a run smaller\n",
          stderr);
    fflush(stderr);
    fflush(stdout);
    _exit(1);
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

hs_status hs_read_file(const char *path, char **out, size_t *len, hs_error *e) {
    *out = NULL;
    FILE *f = hs_fopen(path, "rb", NULL, e);
    if (!f) return HS_ERR_IO;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) hs_oom("reading %s", path);
    for (;;) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n + 1 < cap) break;
        cap *= 2;
        char *grown = realloc(buf, cap);
        if (!grown) hs_oom("reading %s", path);
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
            return hs_error_set(e, HS_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
        buf[i] = saved;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return hs_error_set(e, HS_ERR_IO, "%s exists and is not a directory", path);
    return HS_OK;
}
