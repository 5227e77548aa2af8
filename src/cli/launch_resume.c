/* Which checkpoint `hypershard launch` restarts from: the newest one that
 * verifies, so that a save cut short (or a file damaged since) costs the
 * steps since the previous checkpoint, not the restart. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/launch.h"
#include "hypershard/ckpt.h"

/* The step of `path` when its every chunk verifies, else -1. */
static long long verified_step(const char *path) {
    hs_ckpt *c = NULL;
    hs_error e;
    hs_error_clear(&e);
    int64_t bytes = 0;
    long long step = -1;
    if (hs_ckpt_open(path, &c, &e) == HS_OK && hs_ckpt_verify(c, &bytes, &e) == HS_OK)
        step = (long long)hs_ckpt_get_state(c)->step;
    else if (c || e.msg[0])
        fprintf(stderr, "hypershard launch: checkpoint %s does not verify: %s\n", path, e.msg);
    hs_ckpt_close(c);
    return step;
}

/* The largest N of a step-<N> directory in dir below `below`, or -1. */
static long long newest_below(const char *dir, long long below) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    long long best = -1;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        long long n = (long long)hs_ckpt_step_of(ent->d_name);
        if (n < below && n > best) best = n;
    }
    closedir(d);
    return best;
}

void hs_launch_resume_point(const char *dir, long long *step, char *resume, size_t cap) {
    char latest[HS_PATH_MAX + 16];
    snprintf(latest, sizeof latest, "%s/%s", dir, HS_CKPT_LATEST);
    FILE *f = fopen(latest, "r");
    *step = 0;
    snprintf(resume, cap, "auto");
    if (!f) return; /* nothing saved yet: auto starts afresh */
    fclose(f);
    long long s = verified_step(dir);
    if (s >= 0) {
        *step = s;
        return;
    }
    for (long long below = newest_below(dir, LLONG_MAX); below >= 0;
         below = newest_below(dir, below)) {
        char path[HS_PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/step-%lld", dir, below);
        if ((s = verified_step(path)) < 0) continue;
        *step = s;
        snprintf(resume, cap, "%s", path);
        return;
    }
    snprintf(resume, cap, "none");
}
