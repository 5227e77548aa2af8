/* CRC-32 through zlib: the same polynomial every checksum tool uses, so a
 * checkpoint's checksums can be verified with standard tools. */
#include <limits.h>
#include <zlib.h>

#include "hypershard/base.h"

uint32_t hs_crc32(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    uLong c = crc;
    while (n > 0) { /* zlib takes uInt lengths */
        uInt chunk = n > UINT_MAX ? UINT_MAX : (uInt)n;
        c = crc32(c, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return (uint32_t)c;
}
