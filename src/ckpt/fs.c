/* ckpt/fs.c — the file-system steps of the save protocol: whole writes and
 * reads, fsync of files and directories (a rename is only durable once its
 * directory is synced), the `latest` pointer, and pruning old checkpoints.
 * Directories removed here are flat ones this layer created; anything else
 * inside them (a subdirectory) stops the removal rather than being lost. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"

#define LATEST_MAX 255 /* bytes: "step-<N>\n" is far shorter */

hs_status hs_ckpt_write_all(int fd, const void *buf, size_t n, const char *path, hs_error *e) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return hs_error_set(e, HS_ERR_IO,
                                "cannot write %s: %s; check free space in its "
                                "file system",
                                path, w < 0 ? strerror(errno) : "no progress");
        p += w;
        n -= (size_t)w;
    }
    return HS_OK;
}

hs_status hs_ckpt_pread_all(int fd, void *buf, size_t n, int64_t off, const char *path,
                            int64_t *got, hs_error *e) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + (int64_t)done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return hs_error_set(e, HS_ERR_IO, "cannot read %s: %s", path, strerror(errno));
        if (r == 0) break;
        done += (size_t)r;
    }
    *got = (int64_t)done;
    return HS_OK;
}

hs_status hs_ckpt_fsync_path(const char *path, bool is_dir, hs_error *e) {
    int fd = open(path, is_dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
    if (fd < 0)
        return hs_error_set(e, HS_ERR_IO, "cannot open %s to sync it: %s", path, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0)
        return hs_error_set(e, HS_ERR_IO, "cannot sync %s to disk: %s", path, strerror(err));
    return HS_OK;
}

bool hs_ckpt_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool hs_ckpt_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

hs_status hs_ckpt_remove_dir(const char *path, hs_error *e) {
    DIR *d = opendir(path);
    if (!d) {
        if (errno == ENOENT) return HS_OK;
        return hs_error_set(e, HS_ERR_IO, "cannot open directory %s: %s", path, strerror(errno));
    }
    hs_status s = HS_OK;
    struct dirent *de;
    char child[HS_PATH_MAX + 320];
    while (s == HS_OK && (de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(child, sizeof child, "%s/%s", path, de->d_name);
        if (hs_ckpt_is_dir(child))
            s = hs_error_set(e, HS_ERR_IO,
                             "will not delete %s: it holds a subdirectory %s that "
                             "a checkpoint never has; remove it by hand",
                             path, de->d_name);
        else if (unlink(child) != 0)
            s = hs_error_set(e, HS_ERR_IO, "cannot delete %s: %s", child, strerror(errno));
    }
    closedir(d);
    if (s == HS_OK && rmdir(path) != 0)
        s = hs_error_set(e, HS_ERR_IO, "cannot delete directory %s: %s", path, strerror(errno));
    return s;
}

hs_status hs_ckpt_write_atomic(const char *dir, const char *name, const char *text, hs_error *e) {
    char tmp[HS_PATH_MAX + 64], dst[HS_PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return hs_error_set(e, HS_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    hs_status s = hs_ckpt_write_all(fd, text, strlen(text), tmp, e);
    if (s == HS_OK && fsync(fd) != 0)
        s = hs_error_set(e, HS_ERR_IO, "cannot sync %s: %s", tmp, strerror(errno));
    close(fd);
    if (s == HS_OK && rename(tmp, dst) != 0)
        s = hs_error_set(e, HS_ERR_IO, "cannot rename %s to %s: %s", tmp, dst, strerror(errno));
    if (s == HS_OK) s = hs_ckpt_fsync_path(dir, true, e);
    if (s != HS_OK) unlink(tmp);
    return s;
}

int64_t hs_ckpt_step_of(const char *name) {
    if (strncmp(name, "step-", 5) != 0 || name[5] < '0' || name[5] > '9') return -1;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(name + 5, &end, 10);
    return *end || errno == ERANGE ? -1 : (int64_t)v;
}

/* Bytes that may be shown back in a message: a directory-name-like word. */
static bool name_like(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.')
            return false;
    return n > 0;
}

/* `latest` is a small regular file the save writes. Anything else there (a
 * link, a device, a large file) is refused without reading it, and its
 * content is shown back only when it looks like a directory name: the file
 * may be something other than a checkpoint's, and its bytes are not ours
 * to print. */
hs_status hs_ckpt_latest_read(const char *dir, char *name, size_t cap, bool *found, hs_error *e) {
    char path[HS_PATH_MAX + 64], text[LATEST_MAX + 1];
    snprintf(path, sizeof path, "%s/%s", dir, HS_CKPT_LATEST);
    *found = false;
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return HS_OK;
        return hs_error_set(e, HS_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode) || st.st_size > LATEST_MAX)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s is %s; it should be a small regular file "
                            "holding one step directory name such as step-100 (the save writes "
                            "it): delete it, or write the name of an existing step directory "
                            "into it",
                            path,
                            S_ISLNK(st.st_mode)    ? "a symbolic link"
                            : !S_ISREG(st.st_mode) ? "not a regular file"
                                                   : "too large");
    int fd = open(path, O_RDONLY | O_NOFOLLOW);
    if (fd < 0) return hs_error_set(e, HS_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    int64_t got = 0;
    hs_status s = hs_ckpt_pread_all(fd, text, LATEST_MAX, 0, path, &got, e);
    close(fd);
    if (s != HS_OK) return s;
    size_t len = (size_t)got;
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' ')) len--;
    text[len] = '\0';
    if (len < cap && name_like(text, len) && hs_ckpt_step_of(text) >= 0) {
        memcpy(name, text, len + 1);
        return *found = true, HS_OK;
    }
    if (name_like(text, len))
        return hs_error_set(e, HS_ERR_FORMAT,
                            "%s names '%s'; it should name a step directory "
                            "such as step-100: fix or delete it",
                            path, text);
    return hs_error_set(e, HS_ERR_FORMAT,
                        "%s holds %lld bytes that are not a step directory "
                        "name; it should hold one such as step-100: fix or delete it",
                        path, (long long)got);
}

typedef struct step_dir {
    int64_t step;
    char name[40];
} step_dir;

static int cmp_desc(const void *a, const void *b) {
    int64_t x = ((const step_dir *)a)->step, y = ((const step_dir *)b)->step;
    return (x < y) - (x > y);
}

#define PRUNED ".pruned-"

static hs_status remove_named(const char *dir, const char *name, const hs_log *log, hs_error *e) {
    char path[HS_PATH_MAX + 320];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (log) hs_log_info(log, "checkpoint: deleting %s", path);
    return hs_ckpt_remove_dir(path, e);
}

/* A step leaves in one rename (to .pruned-step-N, made durable), then is
 * deleted: a process killed while deleting leaves a hidden directory the
 * next prune finishes, never a torn step-N. */
static hs_status prune_step(const char *dir, const char *name, const hs_log *log, hs_error *e) {
    char from[HS_PATH_MAX + 320], hidden[64], to[HS_PATH_MAX + 320];
    snprintf(from, sizeof from, "%s/%s", dir, name);
    snprintf(hidden, sizeof hidden, PRUNED "%s", name);
    snprintf(to, sizeof to, "%s/%s", dir, hidden);
    if (rename(from, to) != 0)
        return hs_error_set(e, HS_ERR_IO, "cannot rename %s to %s before deleting it: %s", from, to,
                            strerror(errno));
    hs_status s = hs_ckpt_fsync_path(dir, true, e);
    return s == HS_OK ? remove_named(dir, hidden, log, e) : s;
}

hs_status hs_ckpt_prune(const char *dir, int keep_last, const char *keep, const hs_log *log,
                        hs_error *e) {
    DIR *d = opendir(dir);
    if (!d) return hs_error_set(e, HS_ERR_IO, "cannot list %s: %s", dir, strerror(errno));
    step_dir *steps = NULL;
    int n = 0, cap = 0;
    hs_status s = HS_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!strncmp(de->d_name, ".tmp-step-", 10) ||
            !strncmp(de->d_name, PRUNED, strlen(PRUNED))) {
            if (s == HS_OK) s = remove_named(dir, de->d_name, log, e);
            continue;
        }
        int64_t v = hs_ckpt_step_of(de->d_name);
        if (v < 0 || strlen(de->d_name) >= sizeof steps->name) continue;
        if (n == cap) {
            int grown = cap ? 2 * cap : 16;
            step_dir *grown_steps = realloc(steps, sizeof(step_dir) * (size_t)grown);
            if (!grown_steps) {
                closedir(d);
                free(steps);
                return hs_error_oom(e, "listing the steps of %s: %zu bytes", dir,
                                    sizeof(step_dir) * (size_t)grown);
            }
            steps = grown_steps, cap = grown;
        }
        steps[n].step = v;
        memcpy(steps[n++].name, de->d_name, strlen(de->d_name) + 1);
    }
    closedir(d);
    if (n > 1) qsort(steps, (size_t)n, sizeof(step_dir), cmp_desc);
    for (int i = keep_last > 0 ? keep_last : n; i < n && s == HS_OK; i++)
        if (!keep || strcmp(steps[i].name, keep) != 0) s = prune_step(dir, steps[i].name, log, e);
    free(steps);
    return s;
}
