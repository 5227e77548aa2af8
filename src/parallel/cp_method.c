/* Which CP attention runs (parallel.h hs_cp_method_of): the configured
 * rotate method, with the all-to-all size it implies; the hybrid's
 * degenerate sizes are the plain methods (docs/cp.md). */
#include <string.h>

#include "hypershard/parallel.h"

hs_cp_method hs_cp_method_of(const hs_accel_config *a, int cp, int *a2a) {
    const char *how = a->cp_rotate_method;
    *a2a = 1;
    if (!strcmp(how, "ring")) return HS_CP_RING;
    if (!strcmp(how, "alltoall")) return *a2a = cp, HS_CP_ALLTOALL;
    if (strcmp(how, "alltoall_ring")) return HS_CP_ALLGATHER;
    int size = a->cp_a2a_size > 0 ? a->cp_a2a_size : 1;
    if (size >= cp) return *a2a = cp, HS_CP_ALLTOALL;
    if (size == 1) return HS_CP_RING;
    return *a2a = size, HS_CP_ALLTOALL_RING;
}

int hs_cp_a2a_heads(int H, int a2a) { return H >= a2a ? H / a2a : 1; }
