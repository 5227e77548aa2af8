/* The run's append-only record files (metrics.jsonl, the TensorBoard
 * events): where the last whole record ends, and what a failed write
 * leaves (run.h hs_metrics_lost). */
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/run.h"

int64_t hs_metrics_offset(FILE *f) {
    off_t at = ftello(f);
    return at > 0 ? (int64_t)at : 0;
}

void hs_metrics_lost(hs_trainer *t, FILE **f, const char *path, int64_t good, int err,
                     int64_t step) {
    fclose(*f); /* fails as the write did; what it could not flush is dropped */
    *f = NULL;
    /* The file keeps its whole lines (records), so whatever reads it parses. */
    struct stat st;
    bool cut = stat(path, &st) == 0 && S_ISREG(st.st_mode) && truncate(path, (off_t)good) != 0;
    hs_log_warn(t->log,
                "cannot write %s at step %lld: %s; it keeps the steps before%s, and the "
                "run goes on without it (checkpoints and the final weights are written as usual)",
                path, (long long)step, strerror(err), cut ? " (the last one cut short)" : "");
}
