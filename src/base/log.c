/* Rank-aware logging: rank 0 speaks for everyone unless asked otherwise. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hypershard/base.h"

static const char *const level_names[] = {"error", "warn", "info", "debug"};
_Static_assert(sizeof(level_names) / sizeof(level_names[0]) == HS_LOG_LEVEL_COUNT,
               "level_names must follow hs_log_level");

void hs_log_init(hs_log *log, int rank, int world) {
    log->rank = rank;
    log->world = world;
    log->level = HS_LOG_INFO;
    log->all_ranks = false;
    log->out = stdout;
    const char *lv = getenv("HS_LOG_LEVEL");
    for (int i = 0; lv && i < HS_LOG_LEVEL_COUNT; i++)
        if (!strcasecmp(lv, level_names[i])) log->level = (hs_log_level)i;
    const char *ranks = getenv("HS_LOG_RANKS");
    if (ranks && !strcasecmp(ranks, "all")) log->all_ranks = true;
}

void hs_logf(const hs_log *log, hs_log_level level, const char *fmt, ...) {
    if (!log || level > log->level) return;
    /* Warnings and errors are per-rank facts: every rank reports its own. */
    bool speaks = log->all_ranks || log->rank == 0 || level <= HS_LOG_WARN;
    if (!speaks) return;
    FILE *f = level <= HS_LOG_WARN ? stderr : (log->out ? log->out : stdout);
    char line[4096];
    int off = 0;
    if (log->world > 1 && (log->all_ranks || level <= HS_LOG_WARN))
        off = snprintf(line, sizeof line, "[rank %d] ", log->rank);
    if (level == HS_LOG_ERROR) off += snprintf(line + off, sizeof line - off, "error: ");
    if (level == HS_LOG_WARN) off += snprintf(line + off, sizeof line - off, "warning: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + off, sizeof line - off, fmt, ap);
    va_end(ap);
    /* One fputs per line keeps lines from different ranks from interleaving mid-line. */
    size_t n = strlen(line);
    if (n + 1 < sizeof line && (n == 0 || line[n - 1] != '\n')) line[n++] = '\n', line[n] = '\0';
    fputs(line, f);
    fflush(f);
}
