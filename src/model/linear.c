/* Bias-free nn.Linear through the device's GEMM: W is [OC, IC] so the forward is
 * x @ W^T, and no operand is ever copied or transposed in memory. */
#include "model/layers.h"

void hs_linear_forward(hs_device *d, void *out /* N,OC */, const void *x /* N,IC */,
                       const void *w /* OC,IC */, hs_dtype dt, int64_t N, int IC, int OC,
                       int accumulate) {
    hs_linear_forward_to(d, out, dt, x, w, dt, N, IC, OC, accumulate);
}

void hs_linear_forward_to(hs_device *d, void *out /* N,OC */, hs_dtype odt,
                          const void *x /* N,IC */, const void *w /* OC,IC */, hs_dtype dt,
                          int64_t N, int IC, int OC, int accumulate) {
    hs_dev_gemm(d, false, true, N, OC, IC, 1.0f, x, dt, IC, w, dt, IC, accumulate ? 1.0f : 0.0f,
                out, odt, OC);
}

void hs_linear_backward(hs_device *d, float *dx /* N,IC */, void *dw /* OC,IC */, hs_dtype gdt,
                        const float *dout /* N,OC */, const void *x /* N,IC */,
                        const void *w /* OC,IC */, hs_dtype dt, int64_t N, int IC, int OC) {
    hs_linear_backward_ex(d, dx, false, dw, false, gdt, dout, NULL, x, w, dt, N, IC, OC);
}

const void *hs_linear_dout(hs_device *d, const float *dout, void *dout16, hs_dtype dt, int64_t n,
                           hs_dtype *ydt) {
    if (dout16 && dt != HS_DTYPE_F32) {
        hs_dev_convert(d, dout16, dt, dout, HS_DTYPE_F32, n);
        *ydt = dt;
        return dout16;
    }
    *ydt = HS_DTYPE_F32;
    return dout;
}

void hs_linear_backward_dy(hs_device *d, float *dx /* N,IC */, bool overwrite_dx,
                           void *dw /* OC,IC */, bool overwrite_dw, hs_dtype gdt,
                           const void *dy /* N,OC */, hs_dtype ydt, const void *x /* N,IC */,
                           const void *w /* OC,IC */, hs_dtype dt, int64_t N, int IC, int OC) {
    if (dx)
        hs_dev_gemm(d, false, false, N, IC, OC, 1.0f, dy, ydt, OC, w, dt, IC,
                    overwrite_dx ? 0.0f : 1.0f, dx, HS_DTYPE_F32, IC);
    if (dw)
        hs_dev_gemm(d, true, false, OC, IC, N, 1.0f, dy, ydt, OC, x, dt, IC,
                    overwrite_dw ? 0.0f : 1.0f, dw, gdt, IC);
}

void hs_linear_backward_ex(hs_device *d, float *dx /* N,IC */, bool overwrite_dx,
                           void *dw /* OC,IC */, bool overwrite_dw, hs_dtype gdt,
                           const float *dout /* N,OC */, void *dout16, const void *x /* N,IC */,
                           const void *w /* OC,IC */, hs_dtype dt, int64_t N, int IC, int OC) {
    hs_dtype ydt;
    const void *dy = hs_linear_dout(d, dout, dout16, dt, N * OC, &ydt);
    hs_linear_backward_dy(d, dx, overwrite_dx, dw, overwrite_dw, gdt, dy, ydt, x, w, dt, N, IC, OC);
}
