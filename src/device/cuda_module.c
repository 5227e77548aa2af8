/* The loader of the cuda backend (cuda builds): its code and CUDA's
 * libraries are the module hypershard-cuda.so beside the executable
 * (CMakeLists.txt), opened on the first use of a cuda device, its kernel
 * table or an nccl group; the cuda backend opens hypershard-cudnn.so the
 * same way. dlopen counts references to one loaded copy, so
 * every lookup opens it again and nothing is kept here. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "device/device_backend.h"

#define MODULE_NAME "hypershard-cuda.so"

void *hs_device_module_open(const char *file, char *why, size_t why_n) {
    char path[4096];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) {
        snprintf(why, why_n, "cannot find the executable's directory (where %s is)", file);
        return NULL;
    }
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash + 1 - path) : 0;
    size_t len = strlen(file);
    if (dir + len + 1 > sizeof path) {
        snprintf(why, why_n, "the path of %s is too long", file);
        return NULL;
    }
    memcpy(path + dir, file, len + 1);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) snprintf(why, why_n, "%s", dlerror());
    return h;
}

void *hs_device_cuda_module_symbol(const char *name, hs_error *e) {
    char why[512];
    void *h = hs_device_module_open(MODULE_NAME, why, sizeof why);
    if (!h) {
        hs_error_set(e, HS_ERR_CONFIG,
                     "accelerator.device: cuda: the CUDA backend cannot be loaded (%s); install "
                     "CUDA's runtime, cuBLASLt and NCCL, keep %s beside the executable, or set "
                     "accelerator.device: cpu",
                     why, MODULE_NAME);
        return NULL;
    }
    void *f = dlsym(h, name);
    if (!f)
        hs_error_set(e, HS_ERR_CONFIG,
                     "accelerator.device: cuda: %s has no %s (a module of "
                     "another build?); rebuild hypershard",
                     MODULE_NAME, name);
    return f;
}

hs_status hs_device_cuda_module_init(hs_device *d, hs_error *e) {
    void *f = hs_device_cuda_module_symbol("hs_device_cuda_init", e);
    hs_device_init_fn init;
    if (!f) return e->code;
    memcpy(&init, &f, sizeof init);
    return init(d, e);
}

const hs_device_kernels *hs_device_cuda_module_kernels(void) {
    hs_error e;
    hs_error_clear(&e);
    void *f = hs_device_cuda_module_symbol("hs_device_cuda_kernels", &e);
    hs_device_kernels_fn kernels;
    if (!f) return NULL; /* hs_device_create says why */
    memcpy(&kernels, &f, sizeof kernels);
    return kernels();
}
