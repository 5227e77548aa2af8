/* fp32 elementwise kernels and reductions. Plain loops: at -O2 with
 * -march=x86-64-v3 the compiler vectorises them; sums accumulate in fp64 so
 * that norms over millions of elements do not depend on the order. */
#include <math.h>

#include "hypershard/tensor.h"

void hs_fill_f32(float *x, int64_t n, float v)
{
    for (int64_t i = 0; i < n; i++) x[i] = v;
}

void hs_add_f32(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void hs_axpy_f32(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void hs_scale_f32(float *x, float a, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] *= a;
}

double hs_sum_f32(const float *x, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return s;
}

double hs_sumsq_f32(const float *x, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

float hs_max_abs_f32(const float *x, int64_t n)
{
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        /* A NaN must not vanish behind the comparison. */
        if (isnan(a)) return a;
        if (a > m) m = a;
    }
    return m;
}

/* NaN on either side counts as an infinite difference: a parity check must
 * never pass because a comparison with NaN is false. Equal values (equal
 * infinities included) differ by 0. */
double hs_max_rel_diff_f32(const float *a, const float *b, int64_t n, double floor)
{
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        if (a[i] == b[i]) continue;
        double d = fabs((double)a[i] - (double)b[i]);
        double ref = fabs((double)b[i]);
        double r = d / (ref > floor ? ref : floor);
        if (r > worst) worst = r;
    }
    return worst;
}
