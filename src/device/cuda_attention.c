/* The cuda backend's attention entries (hs_device_kernels: attention_fwd,
 * attention_bwd, attention_merge) over cuda_attention.cu's launchers. The
 * caller's workspace (hs_att_work) is a CPU one: its scratch, threads and
 * 16-bit dout are not used (the kernels hold their tiles in shared memory
 * and read the fp32 dout); its delta buffer is, as on cpu: computed into
 * over every row of Tq unless delta_ready, since later calls for other
 * query ranges of the same rows read it. */
#include "device/cuda.h"
#include "device/cuda_attention_launch.h"

static hs_cuda_att_dims dims_of(int B, int NH, int KVH, int HD, const hs_att_rows *r) {
    return (hs_cuda_att_dims){.B = B,
                              .NH = NH,
                              .KVH = KVH,
                              .HD = HD,
                              .Tq = r->Tq,
                              .q0 = r->q0,
                              .nq = r->nq,
                              .Tk = r->Tk,
                              .k0 = r->k0,
                              .nk = r->nk,
                              .gq = r->gq,
                              .gk = r->gk,
                              .lo = r->lo,
                              .lo_ld = r->lo_ld};
}

/* False, recorded on s's device, for a head dim the kernels do not hold. */
static bool head_dim_fits(hs_stream *s, int HD, const char *what) {
    if (HD <= HS_CUDA_ATT_MAX_HD) return true;
    hs_error e;
    hs_error_clear(&e);
    hs_error_set(&e, HS_ERR_CONFIG,
                 "cuda device %d: %s: head dim %d is above the %d the cuda attention kernels "
                 "hold; set model.head_dim to %d or less, or use accelerator.device: cpu",
                 hs_cuda_ctx_of(s)->ordinal, what, HD, HS_CUDA_ATT_MAX_HD, HS_CUDA_ATT_MAX_HD);
    hs_device_fail(s->dev, &e);
    return false;
}

void hs_cuda_attention_fwd(hs_stream *s, void *out, hs_dtype odt, float *lse, const void *q,
                           const void *k, const void *v, hs_dtype dt, int B, int NH, int KVH,
                           int HD, const hs_att_rows *r, const hs_att_work *w) {
    (void)w;
    if (!head_dim_fits(s, HD, "attention_fwd")) return;
    cudaStream_t st = hs_cuda_stream(s);
    cudaError_t err = hs_cuda_launch_attention_fwd(st, out, (int)odt, lse, q, k, v, (int)dt,
                                                   dims_of(B, NH, KVH, HD, r),
                                                   hs_cuda_ctx_of(s)->smem_optin);
    hs_cuda_check(s, err, "attention_fwd");
}

/* Each query row's D = dO . O: into the caller's buffer over every row of
 * Tq (unless it is ready), else into scratch over r's rows; NULL, recorded
 * on the device, when the scratch is refused. *own: the scratch to free. */
static const float *deltas(hs_stream *s, const float *dout, const void *out, hs_dtype odt, int B,
                           int NH, int HD, const hs_att_rows *r, const hs_att_work *w,
                           float **own) {
    *own = NULL;
    cudaStream_t st = hs_cuda_stream(s);
    cudaError_t err = cudaSuccess;
    float *delta = w ? w->delta : NULL;
    if (delta && !w->delta_ready)
        err = hs_cuda_launch_attention_delta(st, delta, dout, out, (int)odt, B, NH, HD, r->Tq, 0,
                                             r->Tq);
    else if (delta == NULL) {
        size_t bytes = (size_t)B * (size_t)NH * (size_t)r->Tq * sizeof(float);
        delta = *own = hs_cuda_scratch(s, bytes, "attention deltas");
        if (delta == NULL) return NULL;
        err = hs_cuda_launch_attention_delta(st, delta, dout, out, (int)odt, B, NH, HD, r->Tq,
                                             r->q0, r->nq);
    }
    hs_cuda_check(s, err, "attention_bwd's deltas");
    return err == cudaSuccess ? delta : NULL;
}

void hs_cuda_attention_bwd(hs_stream *s, float *dq, float *dk, float *dv, const float *dout,
                           const void *out, hs_dtype odt, const void *q, const void *k,
                           const void *v, const float *lse, hs_dtype dt, int B, int NH, int KVH,
                           int HD, const hs_att_rows *r, const hs_att_work *w) {
    if (!head_dim_fits(s, HD, "attention_bwd")) return;
    float *own;
    const float *delta = deltas(s, dout, out, odt, B, NH, HD, r, w, &own);
    if (delta != NULL) {
        cudaError_t err = hs_cuda_launch_attention_bwd(
            hs_cuda_stream(s), dq, dk, dv, dout, q, k, v, lse, delta, (int)dt,
            dims_of(B, NH, KVH, HD, r), hs_cuda_ctx_of(s)->smem_optin);
        hs_cuda_check(s, err, "attention_bwd");
    }
    hs_cuda_scratch_free(s, own);
}

void hs_cuda_attention_merge(hs_stream *s, float *out, float *lse, const float *bout,
                             const float *blse, int B, int NH, int HD, const hs_att_rows *r) {
    cudaError_t err = hs_cuda_launch_attention_merge(hs_cuda_stream(s), out, lse, bout, blse, B, NH,
                                                     HD, r->Tq, r->q0, r->nq);
    hs_cuda_check(s, err, "attention_merge");
}
