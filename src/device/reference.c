/* The reference backend: host RAM memory (ram.c) and plain one-thread
 * kernels (reference_*.c), the oracle the conformance suite holds every
 * other backend to. */
#include "device/device_backend.h"
#include "device/reference.h"

/* Every entry of the list, each hs_ref_<name> (reference.h). */
#define HS_REF_ENTRY(name, params, args, devs) .name = hs_ref_##name,
static const hs_device_kernels reference_kernels = {HS_DEVICE_KERNEL_LIST(HS_REF_ENTRY)};
#undef HS_REF_ENTRY

const hs_device_kernels *hs_device_reference_kernels(void) { return &reference_kernels; }

hs_status hs_device_reference_init(hs_device *d, hs_error *e) {
    d->kind = HS_DEVICE_REFERENCE;
    d->name = "reference";
    d->ops = &hs_ram_ops;
    d->k = &reference_kernels;
    d->ctx = NULL;
    return hs_ram_memory_init(d, e);
}
