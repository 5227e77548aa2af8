/* Private to src/device/: the reference backend's kernels, one file per
 * family (reference_blas.c, reference_nn.c, reference_attention.c,
 * reference_moe.c, reference_optim.c). Plain C, one thread, fp64
 * accumulation, each output rounded once: short enough to check by eye. */
#ifndef HS_DEVICE_REFERENCE_H
#define HS_DEVICE_REFERENCE_H

#include "device/kernel_list.h"
#include "hypershard/device.h"

/* Every entry of the table (kernel_list.h), hs_ref_<name> with its
 * signature in hs_device_kernels. */
#define HS_REF_DECLARE(name, params, args, devs) void hs_ref_##name params;
HS_DEVICE_KERNEL_LIST(HS_REF_DECLARE)
#undef HS_REF_DECLARE

#endif
