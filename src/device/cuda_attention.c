/* The cuda backend's attention entries (hs_device_kernels: attention_fwd,
 * attention_bwd, attention_merge). Causal attention over whole sequences
 * in bf16 or fp16 takes cuDNN's fused SDPA on the tensor cores
 * (hypershard-cudnn.so, cudnn_sdpa.h), opened when the device is created;
 * everything else (fp32, document masks, the row ranges of context
 * parallelism, a shape cuDNN refuses, a machine without cuDNN) takes the
 * CUDA-core kernels of cuda_attention.cu. The device's note says which,
 * and why, each time that changes.
 *
 * The caller's workspace (hs_att_work) is a CPU one: its scratch and
 * threads are not used (the kernels hold their tiles in shared memory);
 * its 16-bit dout is cuDNN's input; its delta buffer is computed into, as
 * on cpu, over every row of Tq unless delta_ready, since later calls for
 * other query ranges of the same rows read it. */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/cuda.h"
#include "device/cuda_attention_launch.h"

hs_status hs_cuda_attention_env_check(hs_error *e) {
    const char *want = getenv("HS_CUDA_ATTENTION");
    if (!want || strcmp(want, "cores") == 0 || strcmp(want, "cudnn") == 0) return HS_OK;
    return hs_error_set(e, HS_ERR_CONFIG,
                        "HS_CUDA_ATTENTION=%s: set cores (attention on the CUDA-core kernels) "
                        "or cudnn (cuDNN's fused SDPA where it serves, the default), or unset it",
                        want);
}

void hs_cuda_attention_init(hs_device *d) {
    hs_cuda_ctx *c = (hs_cuda_ctx *)d->ctx;
    const char *want = getenv("HS_CUDA_ATTENTION");
    if (want && strcmp(want, "cores") == 0) {
        hs_device_note(d, "attention runs on the CUDA-core kernels: HS_CUDA_ATTENTION=cores");
        return;
    }
    char why[512] = "";
    void *h = hs_device_module_open(HS_CUDNN_SDPA_MODULE, why, sizeof why);
    void *f = h ? dlsym(h, "hs_cudnn_sdpa_api") : NULL;
    if (h && !f) snprintf(why, sizeof why, "%s has no hs_cudnn_sdpa_api", HS_CUDNN_SDPA_MODULE);
    hs_cudnn_sdpa_api_fn api;
    if (f) {
        memcpy(&api, &f, sizeof api);
        const hs_cudnn_sdpa_ops *ops = api();
        if (ops->create(&c->sdpa, why, sizeof why) == 0) c->sdpa_ops = ops;
    }
    if (c->sdpa_ops)
        hs_device_note(d,
                       "attention runs on the tensor cores through %s's fused SDPA for 16-bit "
                       "causal attention over whole sequences; fp32, document masks and "
                       "context parallelism's row ranges take the CUDA-core kernels",
                       c->sdpa_ops->version(c->sdpa));
    else
        hs_device_note(d,
                       "attention runs on the CUDA-core kernels (no tensor cores): cuDNN's "
                       "fused SDPA is not available (%s)",
                       why);
}

void hs_cuda_attention_free(hs_device *d) {
    hs_cuda_ctx *c = (hs_cuda_ctx *)d->ctx;
    if (c->sdpa_ops) c->sdpa_ops->destroy(c->sdpa);
    c->sdpa_ops = NULL;
    c->sdpa = NULL;
}

/* cuDNN's dims for a call it can serve; false for one the CUDA-core
 * kernels take: 32-bit or mixed dtypes, a row range, document masks, a
 * head dim cuDNN does not tile. */
static bool sdpa_serves(const hs_cuda_ctx *c, hs_dtype dt, hs_dtype odt, int B, int NH, int KVH,
                        int HD, const hs_att_rows *r, hs_cudnn_sdpa_dims *d) {
    if (!c->sdpa_ops || dt == HS_DTYPE_F32 || odt != dt || r->lo) return false;
    if (r->Tq != r->Tk || r->q0 != 0 || r->nq != r->Tq || r->k0 != 0 || r->nk != r->Tk ||
        r->gq != r->gk)
        return false;
    if (HD % 8 != 0 || HD > 256 || NH % KVH != 0) return false;
    *d = (hs_cudnn_sdpa_dims){.B = B, .NH = NH, .KVH = KVH, .T = r->Tq, .HD = HD, .dt = (int)dt};
    return true;
}

/* A call cuDNN would not take, or failed: said in the device's note when
 * it is news, and the CUDA-core kernels take the call. */
static void sdpa_declined(hs_stream *s, const char *what, const char *why) {
    char line[512], now[512];
    snprintf(line, sizeof line, "attention %s runs on the CUDA-core kernels for this shape: %s",
             what, why);
    hs_device_note_read(s->dev, now, sizeof now);
    if (strcmp(now, line) != 0) hs_device_note(s->dev, "%s", line);
}

/* The forward through cuDNN; false (noted) when it did not run. */
static bool sdpa_fwd(hs_stream *s, const hs_cudnn_sdpa_dims *d, void *out, float *lse,
                     const void *q, const void *k, const void *v) {
    hs_cuda_ctx *c = hs_cuda_ctx_of(s);
    char why[512];
    int64_t bytes = 0;
    if (c->sdpa_ops->workspace(c->sdpa, d, 0, &bytes, why, sizeof why) != 0) {
        sdpa_declined(s, "forward", why);
        return false;
    }
    void *ws = bytes > 0 ? hs_cuda_scratch(s, (size_t)bytes, "cuDNN attention's workspace") : NULL;
    if (bytes > 0 && ws == NULL) return true; /* recorded on the device as out of memory */
    int rc =
        c->sdpa_ops->fwd(c->sdpa, hs_cuda_stream(s), d, out, lse, q, k, v, ws, why, sizeof why);
    hs_cuda_scratch_free(s, ws);
    if (rc != 0) sdpa_declined(s, "forward", why);
    return rc == 0;
}

/* The backward through cuDNN: 16-bit gradients into scratch, then added
 * into the fp32 dq, dk, dv; false (noted) when it did not run. */
static bool sdpa_bwd(hs_stream *s, const hs_cudnn_sdpa_dims *d, float *dq, float *dk, float *dv,
                     const float *dout, const void *out, const void *q, const void *k,
                     const void *v, const float *lse, const hs_att_work *w) {
    hs_cuda_ctx *c = hs_cuda_ctx_of(s);
    hs_dtype dt = (hs_dtype)d->dt;
    char why[512];
    int64_t bytes = 0;
    if (c->sdpa_ops->workspace(c->sdpa, d, 1, &bytes, why, sizeof why) != 0) {
        sdpa_declined(s, "backward", why);
        return false;
    }
    int64_t nq = (int64_t)d->B * d->T * d->NH * d->HD, nk = (int64_t)d->B * d->T * d->KVH * d->HD;
    size_t e = hs_dtype_size(dt), q16 = (size_t)nq * e, k16 = (size_t)nk * e;
    bool own_dout = !(w && w->dout16);
    size_t total = (size_t)bytes + q16 + 2 * k16 + (own_dout ? q16 : 0);
    char *buf = hs_cuda_scratch(s, total, "cuDNN attention backward's gradients");
    if (buf == NULL) return true; /* recorded on the device as out of memory */
    void *dq16 = buf, *dk16 = buf + q16, *dv16 = buf + q16 + k16;
    void *ws = bytes > 0 ? buf + q16 + 2 * k16 : NULL;
    const void *dout16 = w && w->dout16 ? w->dout16 : NULL;
    if (own_dout) {
        void *mine = buf + q16 + 2 * k16 + (size_t)bytes;
        hs_cuda_convert(s, mine, dt, dout, HS_DTYPE_F32, nq);
        dout16 = mine;
    }
    int rc = c->sdpa_ops->bwd(c->sdpa, hs_cuda_stream(s), d, dq16, dk16, dv16, q, k, v, out, dout16,
                              lse, ws, why, sizeof why);
    if (rc == 0) {
        hs_cuda_add_cast(s, dq, HS_DTYPE_F32, dq, HS_DTYPE_F32, dq16, dt, nq);
        hs_cuda_add_cast(s, dk, HS_DTYPE_F32, dk, HS_DTYPE_F32, dk16, dt, nk);
        hs_cuda_add_cast(s, dv, HS_DTYPE_F32, dv, HS_DTYPE_F32, dv16, dt, nk);
    }
    hs_cuda_scratch_free(s, buf);
    if (rc != 0) sdpa_declined(s, "backward", why);
    return rc == 0;
}

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
    hs_cudnn_sdpa_dims sd;
    if (sdpa_serves(hs_cuda_ctx_of(s), dt, odt, B, NH, KVH, HD, r, &sd) &&
        sdpa_fwd(s, &sd, out, lse, q, k, v))
        return;
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
    hs_cudnn_sdpa_dims sd;
    if (sdpa_serves(hs_cuda_ctx_of(s), dt, odt, B, NH, KVH, HD, r, &sd)) {
        /* the caller's delta is filled as the contract says (a later call
         * may read it); cuDNN computes its own */
        float *own;
        if (w && w->delta && !w->delta_ready) {
            deltas(s, dout, out, odt, B, NH, HD, r, w, &own);
            hs_cuda_scratch_free(s, own);
        }
        if (sdpa_bwd(s, &sd, dq, dk, dv, dout, out, q, k, v, lse, w)) return;
    }
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
