/* RoPE's inverse frequencies and the factor its cos and sin take, plain or
 * stretched for a longer context (model.rope_scaling), as transformers'
 * rope init functions compute them (modeling_rope_utils: default, llama3,
 * yarn): the tensor arithmetic in fp32, the Python scalars in double. */
#include <math.h>
#include <string.h>

#include "hypershard/device.h"
#include "hypershard/model.h"

/* Llama 3.1: wavelengths 2 pi / inv below original / high_freq_factor
 * kept, above original / low_freq_factor divided by factor, blended in
 * between. */
static void llama3(const hs_rope_scaling *r, int half, float *inv) {
    const float factor = (float)r->factor, lo = (float)r->low_freq_factor,
                span = (float)(r->high_freq_factor - r->low_freq_factor),
                old = (float)r->original_max_position,
                low_wavelen = (float)(r->original_max_position / r->low_freq_factor),
                high_wavelen = (float)(r->original_max_position / r->high_freq_factor);
    for (int i = 0; i < half; i++) {
        /* a Python scalar over a tensor is the tensor's reciprocal times it */
        float wavelen = (1.0f / inv[i]) * (float)(2.0 * M_PI);
        float scaled = wavelen > low_wavelen ? inv[i] / factor : inv[i];
        float smooth = ((1.0f / wavelen) * old - lo) / span;
        float blended = (1.0f - smooth) * scaled / factor + smooth * scaled;
        bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        inv[i] = medium ? blended : scaled;
    }
}

/* YaRN's mscale: 0.1 m ln(s) + 1 above s = 1. */
static double yarn_mscale(double s, double m) { return s <= 1.0 ? 1.0 : 0.1 * m * log(s) + 1.0; }

/* The dimension (of dim) at which a frequency makes `rotations` turns over
 * the original context. */
static double correction_dim(double rotations, int dim, double base, int max_position) {
    return dim * log(max_position / (rotations * 2.0 * M_PI)) / (2.0 * log(base));
}

/* YaRN: the interpolated frequencies (divided by factor) below the ramp,
 * the original ones above it, linear in between; returns the attention
 * factor. */
static float yarn(const hs_rope_scaling *r, double theta, int HD, float *inv) {
    int half = HD / 2;
    double lo = correction_dim(r->beta_fast, HD, theta, r->original_max_position),
           hi = correction_dim(r->beta_slow, HD, theta, r->original_max_position);
    if (r->truncate) lo = floor(lo), hi = ceil(hi);
    lo = lo > 0.0 ? lo : 0.0;
    hi = hi < HD - 1 ? hi : HD - 1;
    if (lo == hi) hi += 0.001; /* transformers: no singular ramp */
    for (int i = 0; i < half; i++) {
        float pos = powf((float)theta, (float)(2 * i) / (float)HD); /* transformers' pos_freqs */
        float extra = 1.0f / pos, inter = 1.0f / ((float)r->factor * pos);
        float ramp = ((float)i - (float)lo) / (float)(hi - lo);
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float keep = 1.0f - ramp; /* the extrapolation (original frequency) share */
        inv[i] = inter * (1.0f - keep) + extra * keep;
    }
    if (r->attention_factor > 0.0) return (float)r->attention_factor;
    if (r->mscale > 0.0 && r->mscale_all_dim > 0.0)
        return (float)(yarn_mscale(r->factor, r->mscale) /
                       yarn_mscale(r->factor, r->mscale_all_dim));
    return (float)yarn_mscale(r->factor, 1.0);
}

void hs_model_rope_freqs(const hs_model_config *c, int HD, float *inv, float *scale) {
    hs_rope_inv_freq(inv, HD, c->rope_theta);
    *scale = 1.0f;
    const hs_rope_scaling *r = &c->rope_scaling;
    if (!strcmp(r->type, "llama3")) llama3(r, HD / 2, inv);
    else if (!strcmp(r->type, "yarn")) *scale = yarn(r, c->rope_theta, HD, inv);
}
