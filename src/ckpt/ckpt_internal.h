/* ckpt/ private: the in-memory form of a checkpoint's metadata, the chunk
 * overlap math, and the file-system steps of the save protocol. */
#ifndef HS_CKPT_INTERNAL_H
#define HS_CKPT_INTERNAL_H

#include "hypershard/ckpt.h"

#define HS_CKPT_DIMS HS_TENSOR_MAX_DIMS
#define HS_CKPT_WORLD_MAX (1 << 20) /* a larger world_size is a damaged file */

/* One stored chunk: a box of the global tensor, where its bytes are. */
typedef struct hs_ckpt_chunk {
    int64_t offset[HS_CKPT_DIMS];
    int64_t size[HS_CKPT_DIMS];
    int file; /* index into hs_ckpt_meta.files */
    int64_t byte_offset, length;
    uint32_t crc32;
} hs_ckpt_chunk;

typedef struct hs_ckpt_entry {
    char name[HS_CKPT_NAME_MAX];
    hs_dtype dtype;
    int ndim;
    int64_t shape[HS_CKPT_DIMS];
    hs_ckpt_chunk *chunks;
    int n_chunks, cap_chunks;
} hs_ckpt_entry;

typedef struct hs_ckpt_file {
    char name[64]; /* "rank-<r>.bin", relative to the step directory */
    int64_t bytes;
} hs_ckpt_file;

typedef struct hs_ckpt_meta {
    int version;
    int world_size;
    double created_unix;
    hs_ckpt_state state;
    hs_ckpt_file *files;
    int n_files;
    hs_ckpt_entry *tensors;
    int n_tensors, cap_tensors;
} hs_ckpt_meta;

void hs_ckpt_meta_free(hs_ckpt_meta *m);
/* Append a tensor (name copied); returns its index, or -1 (nothing added)
 * when the table cannot grow. */
int hs_ckpt_meta_add_tensor(hs_ckpt_meta *m, const char *name, hs_dtype dt, int ndim,
                            const int64_t *shape);
/* A new zeroed chunk of t, or NULL (nothing added) when the list cannot
 * grow. */
hs_ckpt_chunk *hs_ckpt_entry_add_chunk(hs_ckpt_entry *t);
int64_t hs_ckpt_entry_numel(const hs_ckpt_entry *t);

/* The metadata behind an open checkpoint (load.c owns the handle). */
const hs_ckpt_meta *hs_ckpt_meta_of(const hs_ckpt *c);

/* metadata.json: write (JSON via hs_json) and parse + check (Jansson).
 * `path` names the file in errors. */
hs_status hs_ckpt_meta_write(const hs_ckpt_meta *m, FILE *f, const char *path, hs_error *e);
hs_status hs_ckpt_meta_parse(const char *text, size_t len, const char *path, hs_ckpt_meta *m,
                             hs_error *e);
/* Structural checks shared by save and open: dims, chunk boxes inside the
 * tensor, chunk lengths = numel * dtype size, chunks inside their file,
 * distinct chunks tiling each tensor exactly. `where` prefixes messages. */
hs_status hs_ckpt_meta_check(const hs_ckpt_meta *m, const char *where, hs_error *e);

/* ------------------------------------------------------------- overlap */

int64_t hs_ckpt_box_numel(int ndim, const int64_t *size);
/* Intersection of boxes a and b (global offsets/sizes). false when empty. */
bool hs_ckpt_box_intersect(int ndim, const int64_t *a_off, const int64_t *a_size,
                           const int64_t *b_off, const int64_t *b_size, int64_t *out_off,
                           int64_t *out_size);
/* Copy box (off, size), in global coordinates, from the row-major chunk
 * `src` at src_off/src_size to the row-major chunk `dst` at dst_off/dst_size.
 * The box must lie inside both. `es` is the element size in bytes. */
void hs_ckpt_box_copy(int ndim, const int64_t *off, const int64_t *size, size_t es, const void *src,
                      const int64_t *src_off, const int64_t *src_size, void *dst,
                      const int64_t *dst_off, const int64_t *dst_size);
/* The same, moving each contiguous run with move(ctx, dst, src, bytes):
 * the box's rows, merged into one run per outer index wherever the box
 * spans the trailing dims of both chunks (a dim-0 box: one run). */
typedef void (*hs_ckpt_move_fn)(void *ctx, void *dst, const void *src, size_t bytes);
void hs_ckpt_box_move(int ndim, const int64_t *off, const int64_t *size, size_t es, const void *src,
                      const int64_t *src_off, const int64_t *src_size, void *dst,
                      const int64_t *dst_off, const int64_t *dst_size, hs_ckpt_move_fn move,
                      void *ctx);
/* "[3:5, 0:4]" into buf. */
const char *hs_ckpt_box_str(int ndim, const int64_t *off, const int64_t *size, char *buf,
                            size_t cap);

/* ------------------------------------------------------------ files */

/* write(2) all of buf; error names the path. */
hs_status hs_ckpt_write_all(int fd, const void *buf, size_t n, const char *path, hs_error *e);
/* pread(2) exactly n bytes at off; a short read is a truncation error. */
hs_status hs_ckpt_pread_all(int fd, void *buf, size_t n, int64_t off, const char *path,
                            int64_t *got, hs_error *e);
hs_status hs_ckpt_fsync_path(const char *path, bool is_dir, hs_error *e);
/* Remove a flat directory of our own making (regular files only). Absent is fine. */
hs_status hs_ckpt_remove_dir(const char *path, hs_error *e);
/* The step directory name <dir>/latest holds, without the newline; *found
 * false when there is no `latest`. Anything but a small regular file
 * holding step-<N> is an error naming the path. */
hs_status hs_ckpt_latest_read(const char *dir, char *name, size_t cap, bool *found, hs_error *e);
bool hs_ckpt_is_dir(const char *path);
bool hs_ckpt_is_file(const char *path);
/* Delete step-<N> directories beyond the newest keep_last (never `keep`,
 * the one `latest` names) and leftover temporary directories. */
hs_status hs_ckpt_prune(const char *dir, int keep_last, const char *keep, const hs_log *log,
                        hs_error *e);

/* "0x%016llx" form used in the metadata for 64-bit values. */
void hs_ckpt_hex64(uint64_t v, char *buf, size_t cap);
bool hs_ckpt_parse_hex64(const char *s, uint64_t *out);

/* safetensors.c: one file of the n_parts files' tensors (each still
 * pointing into its part), which it owns and closes with itself; path
 * names it in errors. On failure the parts are closed and NULL returned. */
hs_st_file *hs_st_merge(const char *path, hs_st_file **parts, int n_parts, hs_error *e);

#endif
