/* The cuda backend's model kernels on the table: RMSNorm, RoPE, SwiGLU
 * and softmax cross-entropy (whole and vocab-parallel), each entry one or
 * two launches of cuda_nn.cu on its stream. RMSNorm's backward keeps dw's
 * partial sums in the caller's workspace or device scratch, and the two
 * losses reduce into device scratch before they cross to the host. RoPE's tables are the
 * cpu backend's, computed on the host and copied in: its fp32 angles go
 * through glibc's powf, cosf and sinf, which the GPU's own functions (2 ulp)
 * would not reproduce bit for bit. */
#include <stdlib.h>

#include "device/cpu_kernels.h"
#include "device/cuda.h"
#include "device/cuda_nn_launch.h"

void hs_cuda_rmsnorm_fwd(hs_stream *s, void *out, float *rstd, const void *x, hs_dtype xdt,
                         const void *w, hs_dtype dt, int64_t N, int C, float eps) {
    hs_cuda_check(s,
                  hs_cuda_launch_rmsnorm_fwd(hs_cuda_stream(s), out, rstd, x, (int)xdt, w, (int)dt,
                                             N, C, eps),
                  "rmsnorm_fwd");
}

/* dw's partial sums, one row of C doubles per chunk of rows, go in the
 * caller's workspace when it holds them (the model's is device memory of
 * hs_rmsnorm_backward_scratch(N, C) doubles), else in scratch of its own. */
void hs_cuda_rmsnorm_bwd(hs_stream *s, float *dx, void *dw, hs_dtype gdt, const float *dout,
                         const void *x, hs_dtype xdt, const void *w, const float *rstd, hs_dtype dt,
                         int64_t N, int C, double *ws) {
    if (N == 0 || C == 0) return; /* no rows: dw += 0, left as it is (as cpu) */
    int64_t part_n = hs_cuda_rmsnorm_bwd_chunks(N) * C;
    double *part = NULL, *own = NULL;
    if (dw && ws && hs_rmsnorm_backward_scratch(N, C) >= part_n) part = ws;
    else if (dw) {
        part = own =
            hs_cuda_scratch(s, (size_t)part_n * sizeof *part, "rmsnorm_bwd's partial dw sums");
        if (part == NULL) return;
    }
    cudaStream_t st = hs_cuda_stream(s);
    cudaError_t err =
        hs_cuda_launch_rmsnorm_bwd(st, dx, part, dout, x, (int)xdt, w, rstd, (int)dt, N, C);
    if (err == cudaSuccess && dw) err = hs_cuda_launch_rmsnorm_dw(st, dw, (int)gdt, part, N, C);
    hs_cuda_scratch_free(s, own);
    hs_cuda_check(s, err, "rmsnorm_bwd");
}

void hs_cuda_rope_tables(hs_stream *s, float *cos_t, float *sin_t, int T, int HD,
                         const float *inv_freq, float scale) {
    size_t n = (size_t)(T > 0 ? T : 0) * (size_t)(HD / 2 > 0 ? HD / 2 : 0);
    if (n == 0) return;
    float *h = malloc(2 * n * sizeof *h);
    if (h == NULL) {
        hs_kernel_oom(s, "rope_tables: %zu bytes of host staging", 2 * n * sizeof *h);
        return;
    }
    hs_rope_tables_freqs(h, h + n, T, HD, inv_freq, scale);
    cudaStream_t st = hs_cuda_stream(s);
    cudaError_t err = cudaMemcpyAsync(cos_t, h, n * sizeof *h, cudaMemcpyHostToDevice, st);
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(sin_t, h + n, n * sizeof *h, cudaMemcpyHostToDevice, st);
    cudaError_t wait = cudaStreamSynchronize(st); /* h is read until then */
    free(h);
    hs_cuda_check(s, err != cudaSuccess ? err : wait, "rope_tables");
}

void hs_cuda_rope_fwd(hs_stream *s, void *x, hs_dtype dt, const float *cos_t, const float *sin_t,
                      int B, int T, int H, int HD) {
    hs_cuda_check(
        s, hs_cuda_launch_rope(hs_cuda_stream(s), x, (int)dt, cos_t, sin_t, 1.0f, B, T, H, HD),
        "rope_fwd");
}

/* The rotation is orthogonal: its gradient turns by the opposite angle. */
void hs_cuda_rope_bwd(hs_stream *s, float *dx, const float *cos_t, const float *sin_t, int B, int T,
                      int H, int HD) {
    hs_cuda_check(s,
                  hs_cuda_launch_rope(hs_cuda_stream(s), dx, (int)HS_DTYPE_F32, cos_t, sin_t, -1.0f,
                                      B, T, H, HD),
                  "rope_bwd");
}

void hs_cuda_swiglu_fwd(hs_stream *s, void *out, const void *gate, const void *up, hs_dtype dt,
                        int64_t n) {
    hs_cuda_check(s, hs_cuda_launch_swiglu_fwd(hs_cuda_stream(s), out, gate, up, (int)dt, n),
                  "swiglu_fwd");
}

void hs_cuda_swiglu_bwd16(hs_stream *s, void *dgate16, void *dup16, const float *dout,
                          const void *gate, const void *up, hs_dtype dt, int64_t n) {
    hs_cuda_check(
        s,
        hs_cuda_launch_swiglu_bwd16(hs_cuda_stream(s), dgate16, dup16, dout, gate, up, (int)dt, n),
        "swiglu_bwd16");
}

void hs_cuda_swiglu_bwd(hs_stream *s, float *dgate, float *dup, bool overwrite, const float *dout,
                        const void *gate, const void *up, hs_dtype dt, int64_t n) {
    hs_cuda_check(s,
                  hs_cuda_launch_swiglu_bwd(hs_cuda_stream(s), dgate, dup, overwrite, dout, gate,
                                            up, (int)dt, n),
                  "swiglu_bwd");
}

/* The total the launch left in device scratch, into *host; false (the
 * failure recorded on the device) when the launch failed. */
static bool total_to_host(hs_stream *s, cudaError_t err, const char *what,
                          const hs_cuda_loss_total *dev, hs_cuda_loss_total *host) {
    hs_cuda_check(s, err, what);
    if (err != cudaSuccess) return false;
    hs_cuda_to_host(s, host, dev, sizeof *host);
    return true;
}

/* Scratch: the total, then the N row losses it is summed from. */
void hs_cuda_xent(hs_stream *s, double *loss, int64_t *valid, float *dlogits, const float *logits,
                  const int32_t *targets, int64_t N, int V, float scale) {
    hs_cuda_loss_total total = {0.0, 0};
    size_t bytes = sizeof total + (size_t)N * sizeof(double);
    hs_cuda_loss_total *dev = hs_cuda_scratch(s, bytes, "xent's row losses");
    if (dev == NULL) return;
    cudaError_t err = hs_cuda_launch_xent(hs_cuda_stream(s), dev, (double *)(dev + 1), dlogits,
                                          logits, targets, N, V, scale);
    bool ok = total_to_host(s, err, "xent", dev, &total);
    hs_cuda_scratch_free(s, dev);
    if (!ok) return;
    *loss = total.loss;
    if (valid) *valid = total.valid;
}

void hs_cuda_xent_shard_max(hs_stream *s, float *row_max, const float *logits, int64_t N, int V) {
    hs_cuda_check(s, hs_cuda_launch_xent_shard_max(hs_cuda_stream(s), row_max, logits, N, V),
                  "xent_shard_max");
}

void hs_cuda_xent_shard_sums(hs_stream *s, float *row_sumexp, float *row_target,
                             const float *logits, const float *gmax, const int32_t *targets,
                             int64_t N, int V, int64_t v0) {
    hs_cuda_check(s,
                  hs_cuda_launch_xent_shard_sums(hs_cuda_stream(s), row_sumexp, row_target, logits,
                                                 gmax, targets, N, V, v0),
                  "xent_shard_sums");
}

void hs_cuda_xent_shard_grad(hs_stream *s, float *logits, const float *gmax,
                             const float *row_sumexp, const int32_t *targets, int64_t N, int V,
                             int64_t v0, float scale) {
    hs_cuda_check(s,
                  hs_cuda_launch_xent_shard_grad(hs_cuda_stream(s), logits, gmax, row_sumexp,
                                                 targets, N, V, v0, scale),
                  "xent_shard_grad");
}

void hs_cuda_xent_shard_loss(hs_stream *s, double *loss, const float *gmax, const float *row_sumexp,
                             const float *row_target, const int32_t *targets, int64_t N) {
    hs_cuda_loss_total total = {0.0, 0};
    hs_cuda_loss_total *dev = hs_cuda_scratch(s, sizeof total, "xent_shard_loss's sum");
    if (dev == NULL) return;
    cudaError_t err = hs_cuda_launch_xent_shard_loss(hs_cuda_stream(s), dev, gmax, row_sumexp,
                                                     row_target, targets, N);
    bool ok = total_to_host(s, err, "xent_shard_loss", dev, &total);
    hs_cuda_scratch_free(s, dev);
    if (ok) *loss = total.loss;
}
