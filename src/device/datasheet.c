/* device/datasheet.c — the dense GEMM peaks NVIDIA's datasheets state,
 * the MFU denominator on a GPU (docs/training.md, "MFU").
 *
 * TFLOP/s, dense (the datasheets print the 16-bit and TF32 tensor-core
 * figures with 2:4 sparsity; dense is half), fp32 on the CUDA cores (the
 * cuda backend's fp32 GEMM does not round through TF32 unless
 * HS_CUDA_TF32=1, and then a step may pass the fp32 figure: the trainer
 * raises its peak to a step's rate, said once, rather than read above
 * 100%). Matched on the name the driver gives, most specific first. */
#include <string.h>

#include "hypershard/device.h"

typedef struct datasheet {
    const char *all[2]; /* substrings the name must hold (NULL: none) */
    const char *product;
    double bf16, fp32; /* TFLOP/s; fp16 = bf16 on these parts */
} datasheet;

static const datasheet table[] = {
    {{"H200", "NVL"}, "H200 NVL", 835.5, 60.0}, {{"H200", NULL}, "H200 SXM", 989.5, 67.0},
    {{"H100", "NVL"}, "H100 NVL", 835.5, 60.0}, {{"H100", "PCIe"}, "H100 PCIe", 756.5, 51.0},
    {{"H100", NULL}, "H100 SXM", 989.5, 67.0},  {{"A100", NULL}, "A100", 312.0, 19.5},
};

static bool matches(const datasheet *t, const char *name) {
    for (int i = 0; i < 2; i++)
        if (t->all[i] && !strstr(name, t->all[i])) return false;
    return true;
}

double hs_device_datasheet_flops(const hs_device *d, hs_dtype dt, const char **which) {
    *which = NULL;
    if (!d || d->ordinal < 0 || !d->model[0]) return 0.0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (!matches(&table[i], d->model)) continue;
        *which = table[i].product;
        return 1e12 * (dt == HS_DTYPE_F32 ? table[i].fp32 : table[i].bf16);
    }
    return 0.0;
}
