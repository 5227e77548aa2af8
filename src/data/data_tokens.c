/* HSTK token files: a 16-byte header (magic, version, count) before the
 * tokens (uint16 in version 1, uint32 in version 2), so a wrong or
 * truncated file is caught before training. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hypershard/data.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token files are little-endian; this build assumes a little-endian host"
#endif

#define HEADER_BYTES 16

static size_t width_of(uint32_t version) { return version == HS_TOKENS_VERSION_U32 ? 4 : 2; }

static bool write_tokens(FILE *f, const uint32_t *tokens, int64_t n, bool wide) {
    if (wide) return fwrite(tokens, sizeof(uint32_t), (size_t)n, f) == (size_t)n;
    uint16_t chunk[4096];
    for (int64_t i = 0; i < n; i += 4096) {
        int64_t k = n - i < 4096 ? n - i : 4096;
        for (int64_t j = 0; j < k; j++) chunk[j] = (uint16_t)tokens[i + j];
        if (fwrite(chunk, sizeof(uint16_t), (size_t)k, f) != (size_t)k) return false;
    }
    return true;
}

hs_status hs_tokens_write(const char *path, const uint32_t *tokens, int64_t n, hs_error *e) {
    bool wide = false;
    for (int64_t i = 0; i < n && !wide; i++) wide = tokens[i] > UINT16_MAX;
    char tmp[HS_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = hs_fopen(tmp, "wb", "check that the directory exists and is writable", e);
    if (!f) return e->code;
    uint8_t header[HEADER_BYTES];
    uint32_t version = wide ? HS_TOKENS_VERSION_U32 : HS_TOKENS_VERSION_U16;
    uint64_t count = (uint64_t)n;
    memcpy(header, HS_TOKENS_MAGIC, 4);
    memcpy(header + 4, &version, 4);
    memcpy(header + 8, &count, 8);
    bool ok = fwrite(header, 1, HEADER_BYTES, f) == HEADER_BYTES &&
              write_tokens(f, tokens, n, wide);
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return hs_error_set(e, HS_ERR_IO, "cannot write token file %s: %s", path,
                            hs_strerror_errno());
    }
    return HS_OK;
}

static hs_status tokens_check_header(const char *path, const char *buf, size_t len, int64_t *n,
                                     size_t *width, hs_error *e) {
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
    if (version != HS_TOKENS_VERSION_U16 && version != HS_TOKENS_VERSION_U32)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "token file %s: version %u, this build reads versions %d (uint16 "
                            "tokens) and %d (uint32 tokens); re-create the file",
                            path, version, HS_TOKENS_VERSION_U16, HS_TOKENS_VERSION_U32);
    *width = width_of(version);
    /* The count is the file's word: check that count * width fits before
     * comparing it with the bytes there are. */
    int64_t want = 0;
    bool fits = count <= (uint64_t)INT64_MAX &&
                hs_mul_i64((int64_t)count, (int64_t)*width, &want) &&
                hs_add_i64(want, HEADER_BYTES, &want);
    if (!fits || (uint64_t)want != len)
        return hs_error_set(e, HS_ERR_FORMAT,
                            "token file %s: the header's count field says %llu tokens (%zu bytes "
                            "each, version %u) but the file holds %zu bytes after the header; the "
                            "file is truncated or corrupt",
                            path, (unsigned long long)count, *width, version, len - HEADER_BYTES);
    *n = (int64_t)count;
    return HS_OK;
}

hs_status hs_tokens_parse(const char *path, const void *data, size_t len, uint32_t **out,
                          int64_t *n, hs_error *e) {
    *out = NULL;
    *n = 0;
    const char *buf = data;
    int64_t count = 0;
    size_t width = 2;
    hs_status s = tokens_check_header(path, buf, len, &count, &width, e);
    if (s != HS_OK) return s;
    *out = malloc(sizeof(uint32_t) * (size_t)(count ? count : 1));
    if (!*out)
        return hs_error_oom(e, "token file %s: cannot allocate %lld tokens", path,
                            (long long)count);
    const char *src = buf + HEADER_BYTES;
    for (int64_t i = 0; i < count; i++) {
        uint16_t h;
        if (width == 4) memcpy(&(*out)[i], src + 4 * i, 4);
        else memcpy(&h, src + 2 * i, 2), (*out)[i] = h;
    }
    *n = count;
    return HS_OK;
}

hs_status hs_tokens_read(const char *path, uint32_t **out, int64_t *n, hs_error *e) {
    *out = NULL;
    *n = 0;
    char *buf = NULL;
    size_t len = 0;
    hs_status s = hs_read_file(path, &buf, &len, e);
    if (s != HS_OK) return s;
    s = hs_tokens_parse(path, buf, len, out, n, e);
    free(buf);
    return s;
}
