/* Private to src/device/: the cpu backend's table entries, one file per
 * family (cpu_rmsnorm.c, cpu_rope.c, cpu_swiglu.c, ...); each entry runs
 * the kernel that the layers not yet on the table call by its own name
 * (device.h), so both reach the same code. */
#ifndef HS_DEVICE_CPU_H
#define HS_DEVICE_CPU_H

#include "device/cpu_kernels.h"
#include "device/kernel_list.h"
#include "hypershard/device.h"

/* Every entry of the table (kernel_list.h), hs_cpu_<name> with its
 * signature in hs_device_kernels. */
#define HS_CPU_DECLARE(name, params, args, devs) void hs_cpu_##name params;
HS_DEVICE_KERNEL_LIST(HS_CPU_DECLARE)
#undef HS_CPU_DECLARE

#endif
