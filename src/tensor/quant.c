/* Block quantization for values on the wire (format in tensor.h): the
 * scalar routines every backend's kernel must match bit for bit. */
#include <math.h>

#include "hypershard/tensor.h"

static const char *const fmt_names[] = {"none", "int8", "fp8_e4m3"};
_Static_assert(sizeof fmt_names / sizeof fmt_names[0] == HS_QUANT_FMT_COUNT,
               "quant format names follow the enum");

const char *hs_quant_fmt_name(hs_quant_fmt f) {
    return (unsigned)f < HS_QUANT_FMT_COUNT ? fmt_names[f] : "?";
}

static int64_t codes_bytes(int64_t n) { return (n + 3) / 4 * 4; }

size_t hs_quant_packed_bytes(int64_t n, int64_t block) {
    HS_ASSERT(n >= 0 && block > 0);
    return (size_t)codes_bytes(n) + sizeof(float) * (size_t)((n + block - 1) / block);
}

uint8_t hs_f32_to_e4m3(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    float a = fabsf(x);
    if (isnan(x)) return (uint8_t)(sign | 0x7Fu);
    if (a >= 448.0f) return (uint8_t)(sign | 0x7Eu);
    if (a < 0x1p-6f) /* subnormal: steps of 2^-9; 8 steps is the smallest normal */
        return (uint8_t)(sign | (uint8_t)rintf(a * 0x1p9f));
    memcpy(&u, &a, sizeof u);
    u += 0x7FFFFu + ((u >> 20) & 1u); /* round the 20 dropped bits to nearest even */
    uint32_t e = (u >> 23) - 127u + 7u, m = (u >> 20) & 7u;
    if (e > 15u || (e == 15u && m == 7u)) return (uint8_t)(sign | 0x7Eu);
    return (uint8_t)(sign | (e << 3) | m);
}

float hs_e4m3_to_f32(uint8_t c) {
    int e = (c >> 3) & 15, m = c & 7;
    float v = e == 15 && m == 7 ? NAN
              : e == 0          ? ldexpf((float)m, -9)
                                : ldexpf((float)(8 + m), e - 10);
    return c & 0x80u ? -v : v;
}

static float *scales_of(void *packed, int64_t n) {
    return (float *)((char *)packed + codes_bytes(n));
}

void hs_quantize_blocks(void *packed, const void *src, hs_dtype src_dt, int64_t n, int64_t block,
                        hs_quant_fmt f, int64_t b0, int64_t b1) {
    HS_ASSERT(f == HS_QUANT_INT8 || f == HS_QUANT_FP8_E4M3);
    uint8_t *q = packed;
    float *scales = scales_of(packed, n);
    const float top = f == HS_QUANT_INT8 ? 127.0f : 448.0f;
    float buf[256];
    for (int64_t b = b0; b < b1; b++) {
        int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
        float amax = 0.0f;
        bool finite = true;
        for (int64_t i = lo; i < hi; i += 256) {
            int64_t k = hi - i < 256 ? hi - i : 256;
            hs_convert(buf, HS_DTYPE_F32, (const char *)src + (size_t)i * hs_dtype_size(src_dt),
                       src_dt, k);
            for (int64_t j = 0; j < k; j++) {
                float a = fabsf(buf[j]);
                finite &= isfinite(a) != 0;
                amax = a > amax ? a : amax;
            }
        }
        float s = !finite ? NAN : amax / top;
        scales[b] = s;
        for (int64_t i = lo; i < hi; i += 256) {
            int64_t k = hi - i < 256 ? hi - i : 256;
            hs_convert(buf, HS_DTYPE_F32, (const char *)src + (size_t)i * hs_dtype_size(src_dt),
                       src_dt, k);
            for (int64_t j = 0; j < k; j++) {
                float y = s > 0.0f ? buf[j] / s : 0.0f; /* NaN and zero scales: code 0 */
                if (f == HS_QUANT_INT8) {
                    float r = rintf(y);
                    r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
                    q[i + j] = (uint8_t)(int8_t)r;
                } else {
                    q[i + j] = hs_f32_to_e4m3(y);
                }
            }
        }
    }
    if (b1 * block >= n) /* the last block's owner zeroes the alignment tail */
        for (int64_t i = n; i < codes_bytes(n); i++) q[i] = 0;
}

void hs_dequantize_range(void *dst, hs_dtype dst_dt, const void *packed, int64_t n, int64_t first,
                         int64_t count, int64_t block, hs_quant_fmt f) {
    HS_ASSERT(f == HS_QUANT_INT8 || f == HS_QUANT_FP8_E4M3);
    HS_ASSERT(first >= 0 && count >= 0 && first + count <= n);
    const uint8_t *q = packed;
    const float *scales = scales_of((void *)packed, n);
    float buf[256];
    for (int64_t i = 0; i < count; i += 256) {
        int64_t k = count - i < 256 ? count - i : 256;
        for (int64_t j = 0; j < k; j++) {
            int64_t at = first + i + j;
            uint8_t c = q[at];
            float v = f == HS_QUANT_INT8 ? (float)(int8_t)c : hs_e4m3_to_f32(c);
            buf[j] = v * scales[at / block];
        }
        hs_convert((char *)dst + (size_t)i * hs_dtype_size(dst_dt), dst_dt, buf, HS_DTYPE_F32, k);
    }
}
