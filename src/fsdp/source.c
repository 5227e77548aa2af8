/* The single parameter-kind check of a unit (RFC 000 §4.1, spec 004 §3
 * step 2): all plain or all on one source mesh, never Partial. */
#include <string.h>

#include "hypershard/fsdp.h"

static const char *kind_of(const hs_source_layout *l) { return l ? l->mesh : "plain"; }

static void list_kinds(const char *const *fqns, const hs_source_layout *const *layouts, int n,
                       char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used + 1 < cap; i++) {
        int k = snprintf(buf + used, cap - used, "%s%s:%s", i ? ", " : "", fqns[i],
                         kind_of(layouts[i]));
        if (k < 0) break;
        used += (size_t)k;
    }
}

hs_status hs_fsdp_check_unit_sources(const char *unit_name, const char *const *fqns,
                                     const hs_source_layout *const *layouts, int n, hs_error *e) {
    const char *uname = unit_name && unit_name[0] ? unit_name : "root";
    for (int i = 0; i < n; i++) {
        const hs_source_layout *l = layouts[i];
        if (!l) continue;
        for (int d = 0; d < l->ndim; d++)
            if (l->placements[d].kind == HS_PLACEMENT_PARTIAL)
                return hs_error_set(e, HS_ERR_CONFIG,
                                    "FSDP unit %s: parameter %s has a Partial placement on "
                                    "mesh %s dim %d; FSDP needs Replicate or Shard source "
                                    "placements (reduce the partial tensor before wrapping)",
                                    uname, fqns[i], l->mesh, d);
    }
    bool mixed = false;
    for (int i = 1; i < n && !mixed; i++) {
        const hs_source_layout *a = layouts[0], *b = layouts[i];
        if ((a == NULL) != (b == NULL)) mixed = true;
        else if (a && strcmp(a->mesh, b->mesh) != 0) mixed = true;
    }
    if (!mixed) return HS_OK;
    char list[2048];
    list_kinds(fqns, layouts, n, list, sizeof list);
    return hs_error_set(e, HS_ERR_CONFIG,
                        "FSDP unit %s mixes parameter kinds: all its parameters must be plain "
                        "tensors or all laid out on the same model-parallel mesh; got [%s]. "
                        "Give every parameter of the unit the same source layout or move the "
                        "odd ones to their own unit",
                        uname, list);
}
