/* The hs_tensor view: shape arithmetic and dim-0 narrowing. */
#include <stdio.h>

#include "hypershard/tensor.h"

hs_tensor hs_tensor_make(void *data, hs_dtype dt, int ndim, const int64_t *shape) {
    HS_ASSERT(ndim >= 0 && ndim <= HS_TENSOR_MAX_DIMS);
    HS_ASSERT(dt >= 0 && dt < HS_DTYPE_COUNT);
    hs_tensor t = {.data = data, .dtype = dt, .ndim = ndim};
    for (int i = 0; i < ndim; i++) {
        HS_ASSERT(shape[i] >= 0);
        t.shape[i] = shape[i];
    }
    return t;
}

int64_t hs_tensor_numel(const hs_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t hs_tensor_bytes(const hs_tensor *t) {
    return (size_t)hs_tensor_numel(t) * hs_dtype_size(t->dtype);
}

int64_t hs_tensor_row_numel(const hs_tensor *t) {
    int64_t n = 1;
    for (int i = 1; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

hs_tensor hs_tensor_narrow0(const hs_tensor *t, int64_t start, int64_t len) {
    HS_ASSERT(t->ndim >= 1);
    HS_ASSERT(start >= 0 && len >= 0 && start + len <= t->shape[0]);
    hs_tensor r = *t;
    size_t row_bytes = (size_t)hs_tensor_row_numel(t) * hs_dtype_size(t->dtype);
    /* char arithmetic on a NULL base would be UB; an empty view of nothing
     * stays NULL. */
    if (t->data != NULL) r.data = (char *)t->data + (size_t)start * row_bytes;
    r.shape[0] = len;
    return r;
}

const char *hs_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    if (cap == 0) return buf;
    size_t used = 0;
    buf[0] = '\0';
    int w = snprintf(buf, cap, "[");
    used = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < ndim && used < cap; i++) {
        w = snprintf(buf + used, cap - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
    if (used < cap) snprintf(buf + used, cap - used, "]");
    return buf;
}
