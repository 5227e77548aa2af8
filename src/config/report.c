/* The error report of one load or validation: every problem is appended,
 * past HS_CFG_MAX_REPORTED lines only counted; running out of memory turns
 * the report's status into HS_ERR_OOM. */
#include <stdarg.h>
#include <stdio.h>

#include "config/config_internal.h"

void hs_cfg_report_add(hs_cfg_report *r, const char *fmt, ...) {
    if (++r->count > HS_CFG_MAX_REPORTED) {
        if (r->e->code == HS_OK) r->e->code = HS_ERR_CONFIG;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    hs_error_vappend(r->e, HS_ERR_CONFIG, fmt, ap);
    va_end(ap);
}

void hs_cfg_report_oom(hs_cfg_report *r, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    r->count++;
    hs_error_append(r->e, HS_ERR_OOM, "out of memory: %s", what);
    r->e->code = HS_ERR_OOM;
}

void hs_cfg_report_finish(hs_cfg_report *r) {
    if (r->count > HS_CFG_MAX_REPORTED)
        hs_error_append(r->e, HS_ERR_CONFIG, "... and %d more errors",
                        r->count - HS_CFG_MAX_REPORTED);
}
