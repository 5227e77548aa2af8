/* Megatron-LM indexed datasets (PREFIX.idx + PREFIX.bin): the index is
 * checked field by field against itself and the size of the data file, every
 * token against the vocabulary, and only then is the data read, through a
 * read-only memory map. Documents are packed into one stream, with an EOS
 * token between documents when one is given. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hypershard/data.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "indexed datasets are little-endian; this build assumes a little-endian host"
#endif

#define MAGIC_BYTES 9
#define HEADER_BYTES (MAGIC_BYTES + 8 + 1 + 8 + 8)

struct hs_indexed {
    char name[HS_PATH_MAX + 8]; /* PREFIX, for messages */
    const uint8_t *bin;         /* the data file (mapped or borrowed) */
    size_t bin_len;
    void *bin_map, *idx_map; /* owned maps, NULL when borrowed or empty */
    size_t idx_map_len;
    int dtype;
    size_t width;
    int64_t n_seq, n_doc; /* sequences; documents (entries of the document index - 1) */
    int32_t *len;         /* tokens of each sequence */
    int64_t *ptr;         /* byte offset of each sequence in the data file */
    int64_t *start;       /* [n_seq + 1]: where each sequence starts in the packed stream */
    uint8_t *eos_after;   /* 1 when an EOS follows the sequence (it ends a document) */
    int eos_id;
};

static const struct {
    const char *name;
    size_t width;
} dtypes[] = {
    [1] = {"uint8", 1}, [2] = {"int8", 1},    [3] = {"int16", 2},   [4] = {"int32", 4},
    [5] = {"int64", 8}, [6] = {"float64", 8}, [7] = {"float32", 4}, [8] = {"uint16", 2},
};
#define N_DTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

/* Element i of a sequence as a double (exact for every integer type but
 * int64 beyond 2^53, which no vocabulary reaches and the range check below
 * refuses as too large anyway). */
static double element(const uint8_t *p, int dtype) {
    union {
        uint8_t u8;
        int8_t i8;
        int16_t i16;
        int32_t i32;
        int64_t i64;
        double f64;
        float f32;
        uint16_t u16;
    } v;
    memcpy(&v, p, dtypes[dtype].width);
    switch (dtype) {
    case 1: return v.u8;
    case 2: return v.i8;
    case 3: return v.i16;
    case 4: return v.i32;
    case 5: return (double)v.i64;
    case 6: return v.f64;
    case 7: return v.f32;
    default: return v.u16;
    }
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The header: magic, version, dtype and the two counts, which must account
 * for the index's length exactly. */
static hs_status parse_header(hs_indexed *ix, const uint8_t *idx, size_t len, hs_error *e) {
    const char *n = ix->name;
    if (len < HEADER_BYTES)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "indexed dataset %s.idx: %zu bytes is shorter than the %d-byte header "
                            "(magic, version, dtype, sequence count, document count); the file is "
                            "truncated or not a Megatron index",
                            n, len, HEADER_BYTES);
    if (memcmp(idx, HS_INDEXED_MAGIC, MAGIC_BYTES) != 0)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "indexed dataset %s.idx: magic is not \"MMIDIDX\\0\\0\" (not a "
                            "Megatron-LM index; for an HSTK file use data.source tokens)",
                            n);
    uint64_t version = get_u64(idx + MAGIC_BYTES);
    if (version != 1)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "indexed dataset %s.idx: version field is %llu, this build reads "
                            "version 1; re-create the index with Megatron-LM or "
                            "scripts/tokenize.py --format indexed",
                            n, (unsigned long long)version);
    int code = idx[MAGIC_BYTES + 8];
    if (code < 1 || code >= N_DTYPES)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "indexed dataset %s.idx: dtype code %d is not one of Megatron's 1 "
                            "(uint8) .. 8 (uint16); the index is corrupt",
                            n, code);
    ix->dtype = code;
    ix->width = dtypes[code].width;
    uint64_t n_seq = get_u64(idx + MAGIC_BYTES + 9), n_doc = get_u64(idx + MAGIC_BYTES + 17);
    /* Both counts are the file's word: the product is computed only once
     * each is known to be small enough not to overflow. */
    int64_t want = 0, part = 0;
    bool fits = n_seq <= (uint64_t)INT64_MAX / 16 && n_doc <= (uint64_t)INT64_MAX / 16 &&
                hs_mul_i64((int64_t)n_seq, 4 + 8, &want) && hs_mul_i64((int64_t)n_doc, 8, &part) &&
                hs_add_i64(want, part, &want) && hs_add_i64(want, HEADER_BYTES, &want);
    if (!fits || (uint64_t)want != len)
        return hs_error_set(
            e, HS_ERR_CONFIG,
            "indexed dataset %s.idx: the sequence count field (%llu) and document count field "
            "(%llu) need %s%lld bytes (header + 12 per sequence + 8 per document) but the file "
            "holds %zu; the index is truncated or corrupt",
            n, (unsigned long long)n_seq, (unsigned long long)n_doc, fits ? "" : "more than ",
            fits ? (long long)want : (long long)INT64_MAX, len);
    if (n_doc < 1)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "indexed dataset %s.idx: the document count field is 0, but the "
                            "document index always starts with 0; the index is corrupt",
                            n);
    ix->n_seq = (int64_t)n_seq;
    ix->n_doc = (int64_t)n_doc - 1;
    return HS_OK;
}

/* Lengths, pointers and the document index, each checked before use. */
static hs_status parse_tables(hs_indexed *ix, const uint8_t *idx, hs_error *e) {
    const char *n = ix->name;
    int64_t S = ix->n_seq;
    ix->len = malloc(sizeof(int32_t) * (size_t)(S ? S : 1));
    ix->ptr = malloc(sizeof(int64_t) * (size_t)(S ? S : 1));
    ix->start = malloc(sizeof(int64_t) * (size_t)(S + 1));
    ix->eos_after = calloc((size_t)(S ? S : 1), 1);
    if (!ix->len || !ix->ptr || !ix->start || !ix->eos_after)
        return hs_error_oom(e, "indexed dataset %s: tables of %lld sequences", n, (long long)S);
    const uint8_t *lens = idx + HEADER_BYTES, *ptrs = lens + 4 * S, *docs = ptrs + 8 * S;
    memcpy(ix->len, lens, 4 * (size_t)S);
    memcpy(ix->ptr, ptrs, 8 * (size_t)S);
    for (int64_t s = 0; s < S; s++) {
        int64_t bytes = (int64_t)ix->len[s] * (int64_t)ix->width, end = 0;
        if (ix->len[s] < 0)
            return hs_error_set(e, HS_ERR_CONFIG,
                                "indexed dataset %s.idx: sequence_lengths[%lld] is %d; lengths "
                                "must be >= 0",
                                n, (long long)s, ix->len[s]);
        if (ix->ptr[s] < 0 || !hs_add_i64(ix->ptr[s], bytes, &end) || (uint64_t)end > ix->bin_len)
            return hs_error_set(e, HS_ERR_CONFIG,
                                "indexed dataset %s.idx: sequence_pointers[%lld] is %lld and the "
                                "sequence holds %d %s tokens (%lld bytes), which does not lie "
                                "inside %s.bin's %zu bytes; the .bin and .idx do not belong "
                                "together or one is truncated",
                                n, (long long)s, (long long)ix->ptr[s], ix->len[s],
                                dtypes[ix->dtype].name, (long long)bytes, n, ix->bin_len);
    }
    int64_t prev = 0;
    for (int64_t d = 0; d <= ix->n_doc; d++) {
        int64_t v;
        memcpy(&v, docs + 8 * d, 8);
        bool first_ok = d > 0 || v == 0, last_ok = d < ix->n_doc || v == S;
        if (!first_ok || !last_ok || v < prev || v > S)
            return hs_error_set(e, HS_ERR_CONFIG,
                                "indexed dataset %s.idx: document_indices[%lld] is %lld; the "
                                "document index must rise from 0 to the sequence count %lld",
                                n, (long long)d, (long long)v, (long long)S);
        /* A document with sequences ends with an EOS unless it is the last. */
        if (d > 0 && v > prev && ix->eos_id >= 0) ix->eos_after[v - 1] = 1;
        prev = v;
    }
    if (S > 0) ix->eos_after[S - 1] = 0;
    ix->start[0] = 0;
    for (int64_t s = 0; s < S; s++) ix->start[s + 1] = ix->start[s] + ix->len[s] + ix->eos_after[s];
    return HS_OK;
}

/* Every token a whole number in [0, vocab_size). */
static hs_status check_tokens(const hs_indexed *ix, int vocab_size, hs_error *e) {
    for (int64_t s = 0; s < ix->n_seq; s++) {
        const uint8_t *p = ix->bin + ix->ptr[s];
        for (int32_t i = 0; i < ix->len[s]; i++, p += ix->width) {
            double v = element(p, ix->dtype);
            if (v >= 0 && v < vocab_size && v == floor(v)) continue;
            return hs_error_set(e, HS_ERR_CONFIG,
                                "indexed dataset %s.bin: token %.17g (%s) at sequence %lld, "
                                "position %d (byte %lld) is not an id in [0, model.vocab_size = "
                                "%d); raise model.vocab_size or re-tokenise",
                                ix->name, v, dtypes[ix->dtype].name, (long long)s, i,
                                (long long)(p - ix->bin), vocab_size);
        }
    }
    return HS_OK;
}

static hs_status indexed_build(hs_indexed *ix, const uint8_t *idx, size_t idx_len, int vocab_size,
                               hs_error *e) {
    hs_status s = parse_header(ix, idx, idx_len, e);
    if (s == HS_OK) s = parse_tables(ix, idx, e);
    if (s == HS_OK) s = check_tokens(ix, vocab_size, e);
    return s;
}

static hs_indexed *indexed_new(const char *name, int eos_id) {
    hs_indexed *ix = calloc(1, sizeof *ix);
    if (!ix) return NULL;
    snprintf(ix->name, sizeof ix->name, "%s", name);
    ix->eos_id = eos_id;
    return ix;
}

hs_status hs_indexed_parse(const char *name, const void *idx, size_t idx_len, const void *bin,
                           size_t bin_len, int vocab_size, int eos_id, hs_indexed **out,
                           hs_error *e) {
    *out = NULL;
    hs_indexed *ix = indexed_new(name, eos_id);
    if (!ix) return hs_error_oom(e, "indexed dataset %s: its reader", name);
    ix->bin = bin;
    ix->bin_len = bin_len;
    hs_status s = indexed_build(ix, idx, idx_len, vocab_size, e);
    if (s != HS_OK) {
        hs_indexed_free(ix);
        return s;
    }
    *out = ix;
    return HS_OK;
}

/* A read-only map of a whole file; *map NULL for an empty one. */
static hs_status map_file(const char *path, void **map, size_t *len, hs_error *e) {
    *map = NULL;
    *len = 0;
    /* O_NONBLOCK: a FIFO's open returns at once, to be refused below */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "cannot open %s: %s; data.path (or a data.blend path) names the "
                            "prefix of PREFIX.bin and PREFIX.idx",
                            path, hs_strerror_errno());
    struct stat st;
    hs_status s = HS_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        s = hs_error_set(e, HS_ERR_CONFIG,
                         "%s is not a regular file (a FIFO, device or directory); data.path (or "
                         "a data.blend path) names the prefix of PREFIX.bin and PREFIX.idx",
                         path);
    } else if (st.st_size > 0) {
        *len = (size_t)st.st_size;
        *map = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (*map == MAP_FAILED) {
            *map = NULL;
            s = hs_error_set(e, HS_ERR_IO, "cannot map %s (%zu bytes): %s", path, *len,
                             hs_strerror_errno());
        }
    }
    close(fd);
    return s;
}

hs_status hs_indexed_open(const char *prefix, int vocab_size, int eos_id, hs_indexed **out,
                          hs_error *e) {
    *out = NULL;
    char path[HS_PATH_MAX + 8];
    hs_indexed *ix = indexed_new(prefix, eos_id);
    if (!ix) return hs_error_oom(e, "indexed dataset %s: its reader", prefix);
    snprintf(path, sizeof path, "%s.bin", prefix);
    hs_status s = map_file(path, &ix->bin_map, &ix->bin_len, e);
    ix->bin = ix->bin_map;
    size_t idx_len = 0;
    if (s == HS_OK) {
        snprintf(path, sizeof path, "%s.idx", prefix);
        s = map_file(path, &ix->idx_map, &idx_len, e);
        ix->idx_map_len = idx_len;
    }
    if (s == HS_OK) s = indexed_build(ix, ix->idx_map, idx_len, vocab_size, e);
    if (s != HS_OK) {
        hs_indexed_free(ix);
        return s;
    }
    /* The tables are copied: the index is not needed any more. */
    if (ix->idx_map) munmap(ix->idx_map, ix->idx_map_len);
    ix->idx_map = NULL;
    *out = ix;
    return HS_OK;
}

void hs_indexed_free(hs_indexed *ix) {
    if (!ix) return;
    if (ix->bin_map) munmap(ix->bin_map, ix->bin_len);
    if (ix->idx_map) munmap(ix->idx_map, ix->idx_map_len);
    free(ix->len);
    free(ix->ptr);
    free(ix->start);
    free(ix->eos_after);
    free(ix);
}

int64_t hs_indexed_num_tokens(const hs_indexed *ix) { return ix->start[ix->n_seq]; }
int64_t hs_indexed_num_sequences(const hs_indexed *ix) { return ix->n_seq; }
int64_t hs_indexed_num_documents(const hs_indexed *ix) { return ix->n_doc; }

void hs_indexed_read(const hs_indexed *ix, int64_t pos, int64_t n, int32_t *out) {
    HS_ASSERT(pos >= 0 && n >= 0 && pos + n <= hs_indexed_num_tokens(ix));
    if (n == 0) return;
    /* The last sequence starting at or before pos (empty ones end there). */
    int64_t lo = 0, hi = ix->n_seq - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (ix->start[mid] <= pos) lo = mid;
        else hi = mid - 1;
    }
    int64_t s = lo, off = pos - ix->start[s];
    for (int64_t k = 0; k < n; k++) {
        while (off >= ix->len[s] + ix->eos_after[s]) s++, off = 0;
        out[k] = off < ix->len[s]
                     ? (int32_t)element(ix->bin + ix->ptr[s] + (size_t)off * ix->width, ix->dtype)
                     : ix->eos_id;
        off++;
    }
}
