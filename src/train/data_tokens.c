/* HSTK token files: a 16-byte header (magic, version, count) before the
 * uint16 tokens, so a wrong or truncated file is caught before training. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/train.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token files are little-endian; this build assumes a little-endian host"
#endif

#define HEADER_BYTES 16

hs_status hs_tokens_write(const char *path, const uint16_t *tokens, int64_t n, hs_error *e) {
    char tmp[HS_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = hs_fopen(tmp, "wb", "check that the directory exists and is writable", e);
    if (!f) return e->code;
    uint8_t header[HEADER_BYTES];
    uint32_t version = HS_TOKENS_VERSION;
    uint64_t count = (uint64_t)n;
    memcpy(header, HS_TOKENS_MAGIC, 4);
    memcpy(header + 4, &version, 4);
    memcpy(header + 8, &count, 8);
    bool ok = fwrite(header, 1, HEADER_BYTES, f) == HEADER_BYTES &&
              fwrite(tokens, sizeof(uint16_t), (size_t)n, f) == (size_t)n;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return hs_error_set(e, HS_ERR_IO, "cannot write token file %s: %s", path,
                            hs_strerror_errno());
    }
    return HS_OK;
}

static hs_status tokens_check_header(const char *path, const char *buf, size_t len, int64_t *n,
                                     hs_error *e) {
    if (len < HEADER_BYTES)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "token file %s: %zu bytes is shorter than the %d-byte HSTK header; "
                            "write it with hs_tokens_write",
                            path, len, HEADER_BYTES);
    if (memcmp(buf, HS_TOKENS_MAGIC, 4) != 0)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "token file %s: magic is not \"HSTK\" (not a hypershard token file; "
                            "for plain text use data.source text)",
                            path);
    uint32_t version;
    uint64_t count;
    memcpy(&version, buf + 4, 4);
    memcpy(&count, buf + 8, 8);
    if (version != HS_TOKENS_VERSION)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "token file %s: version %u, this build reads version %d; re-create the "
                            "file",
                            path, version, HS_TOKENS_VERSION);
    uint64_t have = (len - HEADER_BYTES) / sizeof(uint16_t);
    if ((len - HEADER_BYTES) % sizeof(uint16_t) != 0 || have != count)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "token file %s: the header says %llu tokens but the file holds %zu "
                            "bytes of tokens (%llu tokens); the file is truncated or corrupt",
                            path, (unsigned long long)count, len - HEADER_BYTES,
                            (unsigned long long)have);
    *n = (int64_t)count;
    return HS_OK;
}

hs_status hs_tokens_read(const char *path, uint16_t **out, int64_t *n, hs_error *e) {
    *out = NULL;
    *n = 0;
    char *buf = NULL;
    size_t len = 0;
    hs_status s = hs_read_file(path, &buf, &len, e);
    if (s != HS_OK) return s;
    int64_t count = 0;
    s = tokens_check_header(path, buf, len, &count, e);
    if (s == HS_OK) {
        *out = malloc(sizeof(uint16_t) * (size_t)(count ? count : 1));
        if (!*out) s = hs_error_set(e, HS_ERR_OOM, "token file %s: cannot allocate", path);
        else memcpy(*out, buf + HEADER_BYTES, sizeof(uint16_t) * (size_t)count);
        *n = count;
    }
    free(buf);
    return s;
}
