/* The cpu backend's 2-D copy: rows of row_bytes between strided buffers
 * (FSDP's shard pack and unpack, the model's row gathers), one memcpy when
 * both sides are contiguous. */
#include <string.h>

#include "device/cpu.h"

void hs_cpu_copy_2d(hs_stream *s, void *dst, size_t dst_stride, const void *src, size_t src_stride,
                    int64_t rows, size_t row_bytes) {
    if (rows <= 0 || row_bytes == 0) return;
    if (rows == 1 || (dst_stride == row_bytes && src_stride == row_bytes)) {
        memcpy(dst, src, (size_t)rows * row_bytes);
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        memcpy((char *)dst + (size_t)r * dst_stride, (const char *)src + (size_t)r * src_stride,
               row_bytes);
}
