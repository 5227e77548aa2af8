/* Private to src/device/: how device.c reaches each backend. */
#ifndef HS_DEVICE_BACKEND_H
#define HS_DEVICE_BACKEND_H

#include "hypershard/device.h"

/* Fills name/ops/k/ctx of an already zeroed device whose pools are set up;
 * device.c creates the default stream afterwards. */
typedef void (*hs_device_init_fn)(hs_device *d);
void hs_device_cpu_init(hs_device *d);
void hs_device_reference_init(hs_device *d);

/* The memory members of a backend whose device memory is host RAM (cpu,
 * reference): the two accounted pools, memmove copies, and streams and
 * events that complete at once. */
extern const hs_device_ops hs_ram_ops;
/* Sets up d->cache over aligned RAM; the RAM backends' init calls it. */
void hs_ram_memory_init(hs_device *d);

/* The guard (guard.c): wraps d's members and moves its device memory into
 * mappings the host cannot touch outside them. Install right after the
 * backend's init, before anything is allocated; free after the cache. */
void hs_device_guard_install(hs_device *d);
void hs_device_guard_free(hs_device *d);

#endif
