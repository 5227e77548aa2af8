/* Private to src/device/: how device.c reaches each backend. */
#ifndef HS_DEVICE_BACKEND_H
#define HS_DEVICE_BACKEND_H

#include "hypershard/device.h"

/* Fills name/ops/k/ctx of an already zeroed device whose pools are set up;
 * device.c creates the default stream afterwards. HS_ERR_OOM when the
 * backend's tables cannot be allocated. */
typedef hs_status (*hs_device_init_fn)(hs_device *d, hs_error *e);
hs_status hs_device_cpu_init(hs_device *d, hs_error *e);
hs_status hs_device_reference_init(hs_device *d, hs_error *e);
hs_status hs_device_cuda_init(hs_device *d, hs_error *e); /* in hypershard-cuda.so */
/* Each backend's kernel table, as its init installs it. */
typedef const hs_device_kernels *(*hs_device_kernels_fn)(void);
const hs_device_kernels *hs_device_cpu_kernels(void);
const hs_device_kernels *hs_device_reference_kernels(void);
const hs_device_kernels *hs_device_cuda_kernels(void);
/* The two above as the executables reach them: through the module
 * (cuda_module.c). */
hs_status hs_device_cuda_module_init(hs_device *d, hs_error *e);
const hs_device_kernels *hs_device_cuda_module_kernels(void);
/* Sets d's note for the log (hs_device_note_read): what a backend chose
 * that a user should know, as which path attention takes. */
void hs_device_note(hs_device *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* adamw_many as one call of k's adamw per tensor, and of its convert for
 * the tensor's copy (the reference backend, which has no launch or pass
 * over memory to save). */
void hs_adamw_many_each(hs_stream *s, const hs_adamw_tensor *t, int count,
                        const hs_adamw_hparams *h, const hs_device_kernels *k);
/* dlopen of the module `file` beside the executable (cuda builds): its
 * handle, or NULL with dlerror()'s reason in why. */
void *hs_device_module_open(const char *file, char *why, size_t why_n);

/* The caching allocator's key of stream s on d: NULL for the default
 * stream (and for NULL), and for every stream of a device whose work is
 * done once issued (no event_query: cpu, reference), where any stream may
 * take any freed block at once and one set of free lists keeps the most
 * blocks warm. */
static inline const void *hs_device_stream_key(const hs_device *d, const hs_stream *s) {
    return s == NULL || s == d->stream || !d->ops->event_query ? NULL : s;
}

/* The memory members of a backend whose device memory is host RAM (cpu,
 * reference): the two accounted pools, memmove copies, and streams and
 * events that complete at once. */
extern const hs_device_ops hs_ram_ops;
/* Sets up d->cache over aligned RAM; the RAM backends' init calls it. */
hs_status hs_ram_memory_init(hs_device *d, hs_error *e);

/* The guard (guard.c): wraps d's members and moves its device memory into
 * mappings the host cannot touch outside them; staged also makes d not
 * host visible, so the collectives stage its buffers as a GPU's. Install
 * right after the backend's init, before anything is allocated; free after
 * the cache. */
hs_status hs_device_guard_install(hs_device *d, bool staged, hs_error *e);
void hs_device_guard_free(hs_device *d);
/* The profile's state (profile.c); nothing when none is installed. */
void hs_device_profile_free(hs_device *d);

/* A kernel or copy that cannot run (no memory for its own scratch) writes
 * nothing, records e on its device with this and returns: the first
 * failure is kept, for hs_device_status. Thread safe. */
void hs_device_fail(hs_device *d, const hs_error *e);
/* hs_device_fail of s's device with hs_error_oom's message. */
void hs_kernel_oom(hs_stream *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
