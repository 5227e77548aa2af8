/* The loader of the cuda backend (cuda builds): its code and CUDA's
 * libraries are the module hypershard-cuda.so beside the executable
 * (CMakeLists.txt), opened on the first use of a cuda device, its kernel
 * table or an nccl group. dlopen counts references to one loaded copy, so
 * every lookup opens it again and nothing is kept here. */
#include <dlfcn.h>
#include <string.h>
#include <unistd.h>

#include "device/device_backend.h"

#define MODULE_NAME "hypershard-cuda.so"

void *hs_device_cuda_module_symbol(const char *name, hs_error *e) {
    char path[4096];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) {
        hs_error_set(e, HS_ERR_CONFIG,
                     "accelerator.device: cuda: cannot find the executable's directory (where "
                     "%s is); set accelerator.device: cpu",
                     MODULE_NAME);
        return NULL;
    }
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash + 1 - path) : 0;
    if (dir + sizeof MODULE_NAME > sizeof path) {
        hs_error_set(e, HS_ERR_CONFIG, "accelerator.device: cuda: the path of %s is too long",
                     MODULE_NAME);
        return NULL;
    }
    memcpy(path + dir, MODULE_NAME, sizeof MODULE_NAME);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        hs_error_set(e, HS_ERR_CONFIG,
                     "accelerator.device: cuda: the CUDA backend cannot be loaded (%s); install "
                     "CUDA's runtime, cuBLASLt and NCCL, keep %s beside the executable, or set "
                     "accelerator.device: cpu",
                     dlerror(), MODULE_NAME);
        return NULL;
    }
    void *f = dlsym(h, name);
    if (!f)
        hs_error_set(e, HS_ERR_CONFIG,
                     "accelerator.device: cuda: %s has no %s (a module of "
                     "another build?); rebuild hypershard",
                     path, name);
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
