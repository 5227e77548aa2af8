/* Checked int64 arithmetic for sizes that come from outside (base.h). */
#include "hypershard/base.h"

bool hs_prod_i64(const int64_t *factors, int n, int64_t *out) {
    int64_t acc = 1;
    for (int i = 0; i < n; i++)
        if (!hs_mul_i64(acc, factors[i], &acc)) return false;
    *out = acc;
    return true;
}

int64_t hs_ck_mul(hs_checked *c, int64_t a, int64_t b) {
    int64_t r;
    if (c->overflow || !hs_mul_i64(a, b, &r)) {
        c->overflow = true;
        return INT64_MAX;
    }
    return r;
}

int64_t hs_ck_add(hs_checked *c, int64_t a, int64_t b) {
    int64_t r;
    if (c->overflow || !hs_add_i64(a, b, &r)) {
        c->overflow = true;
        return INT64_MAX;
    }
    return r;
}

int64_t hs_ck_prod(hs_checked *c, const int64_t *factors, int n) {
    int64_t acc = 1;
    for (int i = 0; i < n; i++) acc = hs_ck_mul(c, acc, factors[i]);
    return acc;
}
