/* Collective agreement on a status: one rank's failure becomes every rank's,
 * with its message, so a phase that can fail on one rank (a file it reads,
 * a directory it checks) ends on all of them together and the reason is
 * printed by whichever rank reports. */
#include <stdlib.h>
#include <string.h>

#include "hypershard/comm.h"

/* Bytes travel as 2-byte elements of a 16-bit dtype: the collectives move
 * them without looking at the values. */
#define CARRIER HS_DTYPE_BF16

hs_status hs_pg_agree(hs_pg *g, hs_status mine, const char *what, hs_error *e) {
    int w = hs_pg_size(g);
    int64_t *codes = calloc((size_t)w, sizeof(int64_t));
    if (!codes) /* this rank's own failure, when it has one, is the one to report */
        return mine != HS_OK ? mine
                             : hs_error_oom(e, "agreeing on %s over group '%s': %zu bytes", what,
                                            hs_pg_name(g), (size_t)w * sizeof(int64_t));
    int64_t me = (int64_t)mine;
    hs_error ce;
    hs_status s = hs_pg_all_gather(g, NULL, codes, &me, 4, CARRIER, &ce);
    if (s != HS_OK) {
        free(codes);
        if (mine != HS_OK) return mine;
        *e = ce;
        return s;
    }
    int bad = -1;
    for (int r = 0; r < w && bad < 0; r++)
        if (codes[r] != HS_OK) bad = r;
    hs_status out = bad < 0 ? HS_OK : (hs_status)codes[bad];
    free(codes);
    if (bad < 0) return mine;
    char msg[sizeof e->msg];
    memset(msg, 0, sizeof msg);
    if (hs_pg_rank(g) == bad) snprintf(msg, sizeof msg, "%s", e->msg);
    s = hs_pg_broadcast(g, NULL, msg, (int64_t)sizeof msg / 2, CARRIER, bad, &ce);
    msg[sizeof msg - 1] = '\0';
    if (mine != HS_OK) return mine;
    if (s != HS_OK) return hs_error_set(e, out, "%s failed on rank %d", what, bad);
    return hs_error_set(e, out, "%s failed on rank %d: %s", what, bad, msg);
}
