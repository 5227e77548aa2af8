/* Private to src/device/: how device.c reaches each backend. */
#ifndef HS_DEVICE_BACKEND_H
#define HS_DEVICE_BACKEND_H

#include "hypershard/device.h"

/* Fills ops/ctx/name of an already zeroed device whose pools are set up. */
void hs_device_cpu_init(hs_device *d);

#endif
