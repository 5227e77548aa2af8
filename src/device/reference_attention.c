/* Reference causal grouped-query attention on a row range: one score row at
 * a time in fp64, no tiling, no online softmax. */
#include <math.h>
#include <stdlib.h>

#include "device/device_backend.h"
#include "device/reference.h"

typedef struct att_row {
    int64_t qo, ko; /* element offsets of the query row and key row 0 of this (b, kv head) */
    int64_t qs, ks; /* row strides of q/out and k/v */
    int f, n;       /* keys this row sees: key rows k0+f .. k0+n-1 */
} att_row;

/* Query row i (of r's range) of sequence b, head h. */
static att_row row_of(int b, int h, int i, int NH, int KVH, int HD, const hs_att_rows *r) {
    att_row a;
    a.qs = (int64_t)NH * HD, a.ks = (int64_t)KVH * HD;
    a.qo = ((int64_t)b * r->Tq + i) * a.qs + (int64_t)h * HD;
    a.ko = ((int64_t)b * r->Tk + r->k0) * a.ks + (int64_t)(h / (NH / KVH)) * HD;
    int64_t g = r->gq + (i - r->q0), seen = g - r->gk + 1; /* keys at positions <= the query's */
    a.n = seen < 0 ? 0 : seen > r->nk ? r->nk : (int)seen;
    /* and at or after its document's start */
    int64_t first = r->lo ? r->lo[(int64_t)b * r->lo_ld + g] - r->gk : 0;
    a.f = first < 0 ? 0 : first > a.n ? a.n : (int)first;
    return a;
}

/* p[j] = q . k_j / sqrt(HD) for the row's keys. */
static void scores(double *p, const att_row *a, const void *q, const void *k, hs_dtype dt, int HD) {
    for (int j = a->f; j < a->n; j++) {
        double dot = 0.0;
        for (int d = 0; d < HD; d++)
            dot += (double)hs_ld(q, dt, a->qo + d) * hs_ld(k, dt, a->ko + j * a->ks + d);
        p[j] = dot / sqrt((double)HD);
    }
}

/* NULL, with the failure recorded on s's device, when there is no room. */
static double *score_row(hs_stream *s, const hs_att_rows *r) {
    size_t n = (size_t)(r->nk > 0 ? r->nk : 1);
    double *p = malloc(n * sizeof *p);
    if (p == NULL) hs_kernel_oom(s, "reference attention: %zu bytes of scores", n * sizeof *p);
    return p;
}

void hs_ref_attention_fwd(hs_stream *s, void *out, hs_dtype odt, float *lse, const void *q,
                          const void *k, const void *v, hs_dtype dt, int B, int NH, int KVH, int HD,
                          const hs_att_rows *r, const hs_att_work *w) {
    double *p = score_row(s, r);
    if (p == NULL) return;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = r->q0; i < r->q0 + r->nq; i++) {
                att_row a = row_of(b, h, i, NH, KVH, HD, r);
                scores(p, &a, q, k, dt, HD);
                double mx = -INFINITY, sum = 0.0;
                bool any = a.n > a.f;
                for (int j = a.f; j < a.n; j++) mx = p[j] > mx ? p[j] : mx;
                for (int j = a.f; j < a.n; j++) sum += (p[j] = exp(p[j] - mx));
                lse[((int64_t)b * NH + h) * r->Tq + i] = any ? (float)(mx + log(sum)) : -INFINITY;
                for (int d = 0; d < HD; d++) {
                    double o = 0.0;
                    for (int j = a.f; j < a.n; j++) o += p[j] * hs_ld(v, dt, a.ko + j * a.ks + d);
                    hs_st(out, odt, a.qo + d, any ? (float)(o / sum) : 0.0f);
                }
            }
    free(p);
}

/* P_j = exp(S_j - lse), dP_j = dO . v_j, dS_j = P_j (dP_j - D), D = dO . O:
 * dq += dS k / sqrt(HD), dk_j += dS_j q / sqrt(HD), dv_j += P_j dO. */
void hs_ref_attention_bwd(hs_stream *s, float *dq, float *dk, float *dv, const float *dout,
                          const void *out, hs_dtype odt, const void *q, const void *k,
                          const void *v, const float *lse, hs_dtype dt, int B, int NH, int KVH,
                          int HD, const hs_att_rows *r, const hs_att_work *w) {
    double *p = score_row(s, r), sc = 1.0 / sqrt((double)HD);
    if (p == NULL) return;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = r->q0; i < r->q0 + r->nq; i++) {
                att_row a = row_of(b, h, i, NH, KVH, HD, r);
                const float *g = dout + a.qo;
                double D = 0.0, l = lse[((int64_t)b * NH + h) * r->Tq + i];
                for (int d = 0; d < HD; d++) D += (double)g[d] * hs_ld(out, odt, a.qo + d);
                scores(p, &a, q, k, dt, HD);
                for (int j = a.f; j < a.n; j++) {
                    int64_t kj = a.ko + j * a.ks;
                    double P = exp(p[j] - l), dP = 0.0;
                    for (int d = 0; d < HD; d++) dP += (double)g[d] * hs_ld(v, dt, kj + d);
                    double dS = P * (dP - D) * sc;
                    for (int d = 0; d < HD; d++) {
                        dq[a.qo + d] += (float)(dS * hs_ld(k, dt, kj + d));
                        dk[kj + d] += (float)(dS * hs_ld(q, dt, a.qo + d));
                        dv[kj + d] += (float)(P * g[d]);
                    }
                }
            }
    free(p);
}

/* In fp64: both weights from one log-sum-exp, one rounding per output. */
void hs_ref_attention_merge(hs_stream *s, float *out, float *lse, const float *bout,
                            const float *blse, int B, int NH, int HD, const hs_att_rows *r) {
    int T = r->Tq;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = r->q0; t < r->q0 + r->nq; t++) {
                int64_t row = ((int64_t)b * NH + h) * T + t;
                double la = lse[row], lb = blse[row];
                if (blse[row] == -INFINITY) continue;
                double mx = la > lb ? la : lb, l = mx + log(exp(la - mx) + exp(lb - mx));
                for (int i = 0; i < HD; i++) {
                    int64_t at = ((int64_t)b * T + t) * NH * HD + (int64_t)h * HD + i;
                    out[at] = (float)(out[at] * exp(la - l) + bout[at] * exp(lb - l));
                }
                lse[row] = (float)l;
            }
}
