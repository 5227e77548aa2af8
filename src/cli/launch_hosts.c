/* The hosts of `hypershard launch --hostfile`: read from an Open MPI
 * hostfile, probed after a failed attempt by starting `true` on each one
 * through mpiexec (the same ssh / rsh agent path the job takes), and
 * written back without the hosts that are gone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/launch.h"

static hs_status parse_line(char *line, const char *path, int lineno, hs_launch_hosts *h,
                            hs_error *e) {
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *tok = strtok(line, " \t\r\n");
    if (!tok) return HS_OK;
    if (h->n == HS_LAUNCH_MAX_HOSTS)
        return hs_error_set(e, HS_ERR_USAGE, "--hostfile %s: more than %d hosts", path,
                            HS_LAUNCH_MAX_HOSTS);
    int i = h->n++;
    snprintf(h->name[i], sizeof h->name[i], "%s", tok);
    h->slots[i] = 0;
    h->gone[i] = false;
    while ((tok = strtok(NULL, " \t\r\n"))) {
        if (strncmp(tok, "slots=", 6)) continue;
        char *end;
        long v = strtol(tok + 6, &end, 10);
        if (*end || v < 1 || v > 1 << 20)
            return hs_error_set(e, HS_ERR_USAGE,
                                "--hostfile %s line %d: '%s' is not a slot count; write "
                                "slots=N with N >= 1",
                                path, lineno, tok);
        h->slots[i] = (int)v;
    }
    return HS_OK;
}

hs_status hs_launch_hosts_read(const char *path, hs_launch_hosts *h, hs_error *e) {
    h->n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return hs_error_set(e, HS_ERR_USAGE, "--hostfile %s: cannot be read", path);
    char line[1024];
    hs_status s = HS_OK;
    for (int lineno = 1; s == HS_OK && fgets(line, sizeof line, f); lineno++) {
        size_t len = strlen(line);
        if (len + 1 == sizeof line && line[len - 1] != '\n' && !feof(f))
            s = hs_error_set(e, HS_ERR_USAGE,
                             "--hostfile %s line %d is longer than %zu bytes; a line names one "
                             "host and its slots",
                             path, lineno, sizeof line - 2);
        else s = parse_line(line, path, lineno, h, e);
    }
    fclose(f);
    if (s == HS_OK && h->n == 0)
        s = hs_error_set(e, HS_ERR_USAGE, "--hostfile %s names no host", path);
    return s;
}

int hs_launch_hosts_probe(hs_launch_hosts *h, const char *mpiexec, double timeout_s) {
    int marked = 0;
    for (int i = 0; i < h->n; i++) {
        if (h->gone[i]) continue;
        char *argv[] = {(char *)mpiexec, "-n", "1", "--host", h->name[i], "true", NULL};
        hs_launch_result r;
        if (hs_launch_run(argv, timeout_s, true, &r) && r.status == 0) continue;
        h->gone[i] = true;
        marked++;
        fprintf(stderr, "hypershard launch: host %s is gone (%s)\n", h->name[i],
                r.reason[0] ? r.reason : "it did not start a process");
    }
    return marked;
}

int hs_launch_hosts_slots(const hs_launch_hosts *h) {
    int n = 0;
    for (int i = 0; i < h->n; i++) {
        if (h->gone[i]) continue;
        if (h->slots[i] == 0) return -1;
        n += h->slots[i];
    }
    return n;
}

hs_status hs_launch_hosts_write(const hs_launch_hosts *h, const char *path, hs_error *e) {
    FILE *f = fopen(path, "w");
    if (!f) return hs_error_set(e, HS_ERR_IO, "cannot write the hostfile %s", path);
    for (int i = 0; i < h->n; i++) {
        if (h->gone[i]) continue;
        if (h->slots[i]) fprintf(f, "%s slots=%d\n", h->name[i], h->slots[i]);
        else fprintf(f, "%s\n", h->name[i]);
    }
    if (fclose(f) != 0) return hs_error_set(e, HS_ERR_IO, "cannot write the hostfile %s", path);
    return HS_OK;
}
