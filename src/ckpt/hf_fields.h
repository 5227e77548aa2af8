/* ckpt/ private: reading config.json fields (hf_fields.c), shared by
 * hf_config.c and the families' own files (hf_deepseek_v3.c). */
#ifndef HS_CKPT_HF_FIELDS_H
#define HS_CKPT_HF_FIELDS_H

#include <jansson.h>

#include "hypershard/base.h"
#include "hypershard/ckpt.h"

/* An integer field in [lo, INT_MAX]; `required` false keeps *out when
 * absent. */
hs_status hs_hf_int(json_t *root, const char *path, const char *key, bool required, int lo,
                    int *out, hs_error *e);
/* An optional number; present, a finite number > 0 (>= 0 when zero_ok). */
hs_status hs_hf_double(json_t *root, const char *path, const char *key, bool zero_ok, double *out,
                       hs_error *e);
/* An optional true or false. */
hs_status hs_hf_bool(json_t *root, const char *path, const char *key, bool *out, hs_error *e);
/* DeepSeek-V3's router fields (scoring_func, n_group, topk_group,
 * routed_scaling_factor, bias_update_speed), each optional. */
hs_status hs_hf_read_router(json_t *root, const char *path, hs_model_config *mc, hs_error *e);

/* hf_deepseek_v3.c */
void hs_hf_write_deepseek_v3(hs_json *j, const hs_model_config *mc);
hs_status hs_hf_read_deepseek_v3(json_t *root, const char *path, hs_model_config *mc, hs_error *e);

#endif
