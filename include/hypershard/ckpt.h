/* hypershard/ckpt.h — distributed checkpoints: an atomic, verified save of
 * sharded tensors plus a small trainer-state record, and a load into any
 * other world size or sharding layout; safetensors files and Hugging Face
 * directories (config.json + model.safetensors) for export and import.
 * docs/checkpoint.md is the reference for the on-disk format.
 *
 * Contract of this layer (RFC 000 §7.8, §8.4):
 * - The caller describes each tensor it holds as an hs_ckpt_tensor: a name
 *   (FQN, or "optim.<fqn>.exp_avg" and the like), the dtype, the logical
 *   global shape (never padded) and this rank's chunk of it as global
 *   offsets and sizes per dim, with the chunk's contiguous row-major data.
 *   Chunks may be empty (size 0 in some dim). How the chunks were made
 *   (FSDP dim-0 torch.chunk shards, HSDP replicas, whole tensors) is not
 *   this layer's business; hs_ckpt_tensor_dim0 fills in the FSDP case.
 * - A checkpoint stores only actual shards: each distinct chunk exactly
 *   once. Chunks several ranks hold with the same (name, offsets, sizes)
 *   — HSDP replicas, replicated parameters — are written by the lowest such
 *   rank only. The distinct chunks of a tensor must tile it exactly (no
 *   overlap, no hole); anything else is an error at save time.
 * - Save is collective over the world of an hs_comm. Every rank writes its
 *   own data file into a temporary directory, rank 0 writes the metadata,
 *   everything is fsynced, the directory is renamed to `step-<N>`, and the
 *   `latest` pointer is replaced last. A process killed at any point leaves
 *   the previous checkpoint and `latest` intact.
 * - Load needs no communication to find data: each rank reads, for every
 *   tensor it asks for, the saved chunks that overlap its target chunk
 *   (per-dimension interval intersection on global offsets), checks each
 *   chunk's length and CRC32, and copies the overlap. A target may also
 *   name a padded storage (storage_rows > rows): its tail is zero-filled,
 *   as RFC §7.4 asks of the communication storage after a load.
 * - Tensor bytes cross the compute seam explicitly (docs/device.md): a
 *   chunk whose `dev` is set is device memory, read and written only
 *   through hs_device_copy / the device's memset; CRCs are computed on the
 *   host copies. The files are the same bytes either way.
 * - Every inconsistency — a missing tensor, a shape or dtype that differs,
 *   a truncated file, a checksum that does not match — is an error that
 *   names the checkpoint file, the tensor and both values. Nothing is ever
 *   loaded silently wrong.
 * - Safetensors files follow the published format: 8-byte little-endian
 *   header length, a JSON header (dtype, shape, data_offsets per tensor,
 *   optional "__metadata__" of string values), raw little-endian data.
 *   Dtypes F32, BF16 and F16. Reading parses the header with Jansson and
 *   checks every offset against the file before any byte is used.
 * - Hugging Face names are the model's FQNs, except stacked routed experts
 *   [E, out, in], which become E tensors "...experts.<j>.<proj>.weight".
 *
 * Test hooks (documented in docs/checkpoint.md): HS_CKPT_TEST_KILL_AFTER_BYTES=N
 * makes the rank HS_CKPT_TEST_KILL_RANK (default 1) _exit(9) after writing N
 * bytes of its data file, to prove the save protocol is atomic; with
 * HS_CKPT_TEST_KILL_STEP=S only in the save of step S.
 * HS_CKPT_TEST_WRITE_DELAY_MS=M makes every data-file write wait M ms
 * before its first byte (a background write held in flight).
 */
#ifndef HYPERSHARD_CKPT_H
#define HYPERSHARD_CKPT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "hypershard/base.h"
#include "hypershard/comm.h"
#include "hypershard/config.h"
#include "hypershard/device.h"
#include "hypershard/model.h"
#include "hypershard/tensor.h"

#define HS_CKPT_FORMAT "hypershard-checkpoint"
#define HS_CKPT_VERSION 1
#define HS_CKPT_METADATA "metadata.json"
#define HS_CKPT_LATEST "latest"
/* A step directory's name step-<N> -> N, else -1. */
int64_t hs_ckpt_step_of(const char *name);
#define HS_CKPT_NAME_MAX 256

/* One tensor as this rank holds it. For save, `data` is read; for load it
 * is written (rows [size[0], storage_rows) of the buffer are zeroed). */
typedef struct hs_ckpt_tensor {
    const char *name;
    hs_dtype dtype;
    int ndim;                           /* 1..HS_TENSOR_MAX_DIMS */
    int64_t shape[HS_TENSOR_MAX_DIMS];  /* logical global shape */
    int64_t offset[HS_TENSOR_MAX_DIMS]; /* this rank's chunk: global start per dim */
    int64_t size[HS_TENSOR_MAX_DIMS];   /* this rank's chunk: extent per dim (0 ok) */
    void *data;                         /* the chunk, contiguous row-major */
    hs_device *dev;                     /* NULL: `data` is host memory; else it is dev's device
                     * memory, which this layer never touches itself: a save
                     * copies it D2H piece by piece into a host bounce buffer,
                     * a load reads into host memory and copies it H2D */
    int64_t storage_rows;               /* load only: dim-0 rows of the buffer behind `data`
                           * (padded communication storage); 0 = size[0] */
} hs_ckpt_tensor;

/* A whole tensor held by this rank (unsharded, or replicated), in host
 * memory (`dev` NULL; set it after for device memory). */
void hs_ckpt_tensor_full(hs_ckpt_tensor *t, const char *name, hs_dtype dt, int ndim,
                         const int64_t *shape, void *data);
/* The torch.chunk dim-0 shard of rank r of w (FSDP): offsets and sizes from
 * hs_fsdp_row_offset / hs_fsdp_actual_rows; `data` holds the actual rows. */
void hs_ckpt_tensor_dim0(hs_ckpt_tensor *t, const char *name, hs_dtype dt, int ndim,
                         const int64_t *shape, int w, int r, void *data);
int64_t hs_ckpt_tensor_numel(const hs_ckpt_tensor *t); /* of the chunk */

/* The trainer's record. `config_hash` is whatever the trainer wants checked
 * on resume (e.g. hs_config_hash over the keys that must not change). */
typedef struct hs_ckpt_state {
    int64_t step;          /* optimizer steps completed */
    int64_t data_position; /* next global batch to read */
    int64_t optim_step;    /* the optimizer's own step counter */
    uint64_t rng_seed;     /* counter-based RNG: seed and next counter */
    uint64_t rng_counter;
    uint64_t config_hash;
} hs_ckpt_state;

typedef struct hs_ckpt_save_options {
    const char *dir;         /* checkpoint.dir: step-<N> and `latest` go here */
    int keep_last;           /* keep this many step-<N> dirs; <= 0 keeps all */
    const hs_config *config; /* NULL, or written as config.yaml (for export) */
    const hs_log *log;       /* NULL: silent */
    int64_t progress_bytes;  /* rank 0 reports progress when the checkpoint is
                              * at least this large; 0: 64 MiB */
} hs_ckpt_save_options;

/* Collective over the world of `comm`. Writes <dir>/step-<state->step>;
 * `saved_path` (may be NULL) gets that path. Every rank returns the same
 * status; a rank that did not cause the failure says which rank did. */
hs_status hs_ckpt_save(hs_comm *comm, const hs_ckpt_save_options *opt,
                       const hs_ckpt_tensor *tensors, int n, const hs_ckpt_state *state,
                       char *saved_path, size_t cap, hs_error *e);

/* The background save (checkpoint.async; writer.c, docs/checkpoint.md
 * "Asynchronous save"): the caller's thread plans the save, makes the
 * temporary directory and snapshots this rank's chunks into a staging
 * buffer kept for the next save (the device's pinned host memory; from
 * device memory through hs_device_copy), then returns; a thread writes,
 * CRCs and fsyncs this rank's data file, and once every rank's file is
 * on disk, a thread on rank 0 writes the metadata and publishes (fsyncs,
 * rename, `latest`, prune). The threads never communicate: the agreements
 * between those phases are collective and stay on the caller's thread
 * (hs_ckpt_writer_poll / _wait), so the writer never runs a collective
 * beside the caller's. At most one save is in flight: a new one, _wait and
 * the end of a run wait for it. The files are the bytes a synchronous save
 * of the same state writes. */
typedef struct hs_ckpt_writer hs_ckpt_writer;

/* dev: whose host memory stages the snapshot (NULL: malloc). */
hs_status hs_ckpt_writer_create(hs_device *dev, hs_ckpt_writer **out, hs_error *e);
/* Allocate the staging buffer now (bytes: the plan's estimate of this
 * rank's file) and touch every page, so the first save's snapshot pays no
 * page faults; a save whose file is larger grows it then. */
hs_status hs_ckpt_writer_reserve(hs_ckpt_writer *w, int64_t bytes, hs_error *e);
/* Joins a write still in flight without publishing it (a run that failed
 * elsewhere: its .tmp-step-N stays, and the next save deletes it); a
 * publish rank 0 had begun runs to its end first. */
void hs_ckpt_writer_free(hs_ckpt_writer *w);
/* Collective over comm's world, as hs_ckpt_save: waits for and publishes
 * the save in flight, then begins this one and returns once the snapshot
 * is taken. opt's strings and objects must live until it is published;
 * the tensors' memory is the caller's again on return. */
hs_status hs_ckpt_save_async(hs_ckpt_writer *w, hs_comm *comm, const hs_ckpt_save_options *opt,
                             const hs_ckpt_tensor *tensors, int n, const hs_ckpt_state *state,
                             hs_error *e);
/* Collective; cheap when nothing is in flight (no communication). With a
 * save in flight, one small all-reduce says whether its current phase has
 * ended everywhere: when every rank's write has, agree on the writes and
 * start rank 0's publish; when rank 0's publish has, agree on it. Else
 * return at once. The status of a failed background write or publish
 * names the failing rank. */
hs_status hs_ckpt_writer_poll(hs_ckpt_writer *w, hs_error *e);
/* Collective: wait for the save in flight, if any, to be written and
 * published. */
hs_status hs_ckpt_writer_wait(hs_ckpt_writer *w, hs_error *e);
bool hs_ckpt_writer_busy(const hs_ckpt_writer *w);
/* The staging buffer's bytes now (0 before the first save). */
int64_t hs_ckpt_writer_staging_bytes(const hs_ckpt_writer *w);

/* ----------------------------------------------------------------- load */

typedef struct hs_ckpt hs_ckpt;

/* Open a checkpoint: `path` is a step directory (holding metadata.json) or
 * a checkpoint.dir (holding `latest`, which is followed). Reads and checks
 * the metadata and the data files' lengths; reads no tensor data. */
hs_status hs_ckpt_open(const char *path, hs_ckpt **out, hs_error *e);
void hs_ckpt_close(hs_ckpt *c);
const char *hs_ckpt_path(const hs_ckpt *c); /* the step directory */
const hs_ckpt_state *hs_ckpt_get_state(const hs_ckpt *c);
int hs_ckpt_saved_world(const hs_ckpt *c);

typedef struct hs_ckpt_info {
    const char *name;
    hs_dtype dtype;
    int ndim;
    int64_t shape[HS_TENSOR_MAX_DIMS];
    int n_chunks;  /* non-empty chunks stored */
    int64_t bytes; /* stored bytes (= numel * dtype size) */
} hs_ckpt_info;

int hs_ckpt_num_tensors(const hs_ckpt *c);
void hs_ckpt_tensor_info(const hs_ckpt *c, int i, hs_ckpt_info *out);
/* Index of `name`, or -1. */
int hs_ckpt_find(const hs_ckpt *c, const char *name);

/* Fill each target chunk from the overlapping saved chunks (see the layer
 * contract). The target's dtype and global shape must equal the saved
 * ones. Local: no communication. */
hs_status hs_ckpt_read(hs_ckpt *c, const hs_ckpt_tensor *targets, int n, hs_error *e);

/* Read every stored chunk once and check its CRC32; *bytes gets the total. */
hs_status hs_ckpt_verify(hs_ckpt *c, int64_t *bytes, hs_error *e);

/* Human-readable listing: trainer state, files, and per tensor its dtype,
 * shape, bytes and chunk layout. */
void hs_ckpt_print(const hs_ckpt *c, FILE *f);

/* Collective over the world: open + read on every rank, then agree. On
 * success *state (may be NULL) gets the saved trainer state. */
hs_status hs_ckpt_load(hs_comm *comm, const char *path, const hs_ckpt_tensor *targets, int n,
                       hs_ckpt_state *state, hs_error *e);

/* checkpoint.resume: "none" -> *found = false; "auto" -> the step directory
 * `latest` names in cfg->dir, or *found = false when there is none yet; any
 * other value is a path that must be a checkpoint (step dir or a dir with
 * `latest`). */
hs_status hs_ckpt_resolve_resume(const hs_ckpt_config *cfg, char *path, size_t cap, bool *found,
                                 hs_error *e);

/* ----------------------------------------------------------- safetensors */

#define HS_ST_NAME_MAX 256

typedef struct hs_st_tensor {
    char name[HS_ST_NAME_MAX];
    hs_dtype dtype;
    int ndim;
    int64_t shape[HS_TENSOR_MAX_DIMS];
    const void *data; /* may be unaligned when read from another writer's file */
    size_t bytes;
} hs_st_tensor;

typedef struct hs_st_meta {
    const char *key;
    const char *value;
} hs_st_meta;

/* "F32", "BF16", "F16". */
const char *hs_st_dtype_name(hs_dtype dt);
/* Write atomically (temp file + rename); the header is padded with spaces to
 * a multiple of 8 bytes so that every tensor of this writer is aligned. */
hs_status hs_safetensors_write(const char *path, const hs_st_tensor *tensors, int n,
                               const hs_st_meta *meta, int n_meta, hs_error *e);

typedef struct hs_st_file hs_st_file;

/* Every tensor is checked: dtype, shape, data_offsets inside the data
 * region and matching the shape, no two tensors sharing bytes, no name
 * twice; errors name the file and the tensor. */
hs_status hs_safetensors_open(const char *path, hs_st_file **out, hs_error *e);
/* The same from a whole file's len bytes in memory; path names it in errors. */
hs_status hs_safetensors_open_mem(const char *path, const void *buf, size_t len, hs_st_file **out,
                                  hs_error *e);
/* A Hugging Face weights directory as one file: DIR/model.safetensors, or
 * the shards DIR/model.safetensors.index.json's weight_map names (files in
 * DIR), every tensor in the shard the map gives and listed there once. */
hs_status hs_safetensors_open_dir(const char *dir, hs_st_file **out, hs_error *e);
/* The path a directory's weights are read from, for messages: its
 * model.safetensors, or its index when the weights are sharded. */
void hs_safetensors_dir_path(const char *dir, char *out, size_t cap);
void hs_safetensors_close(hs_st_file *f);
int hs_safetensors_count(const hs_st_file *f);
const hs_st_tensor *hs_safetensors_tensor(const hs_st_file *f, int i);
/* NULL if absent. */
const hs_st_tensor *hs_safetensors_find(const hs_st_file *f, const char *name);
const char *hs_safetensors_meta(const hs_st_file *f, const char *key);
int64_t hs_st_numel(const hs_st_tensor *t);
/* Convert the tensor to fp32 (handles unaligned data). */
void hs_st_to_f32(const hs_st_tensor *t, float *out);

/* Write `text` to <dir>/<name> atomically: temp file, fsync, rename, fsync dir. */
hs_status hs_ckpt_write_atomic(const char *dir, const char *name, const char *text, hs_error *e);

/* ------------------------------------------------------- Hugging Face I/O */

/* The full fp32 tensor of model parameter i: get (gather) or set (scatter).
 * Under FSDP these are collective, so every rank calls them in the same order. */
typedef hs_status (*hs_param_get_fn)(void *ctx, int param_index, float *out, hs_error *e);
typedef hs_status (*hs_param_set_fn)(void *ctx, int param_index, const float *full, hs_error *e);
/* Takes parameter param_index's values where `full` lies, to read them
 * there until the holder of `full` is closed (hs_model_borrow_param); false
 * where it cannot, set then copies them. */
typedef bool (*hs_param_borrow_fn)(void *ctx, int param_index, const float *full);

/* Number of HF tensors parameter p becomes (E for stacked experts, else 1)
 * and the name of the j-th. */
int hs_hf_tensor_count(const hs_param *p);
void hs_hf_tensor_name(const hs_param *p, int j, char *buf, size_t cap);

/* config.json of LlamaForCausalLM (arch llama) / MixtralForCausalLM (moe). */
hs_status hs_hf_config_write(const hs_model_config *mc, int max_position, const char *dtype_name,
                             const char *path, hs_error *e);
/* Fill the model fields of *mc from a config.json written by us or by
 * transformers (other fields of *mc are left as they are). */
hs_status hs_hf_config_read(const char *path, hs_model_config *mc, int *max_position, hs_error *e);
/* The same from len bytes of config.json text; path names it in errors.
 * Every integer is checked to fit (sizes >= 1), numbers to be finite, the
 * heads to divide; errors name the file and the key. */
hs_status hs_hf_config_parse(const char *path, const char *text, size_t len, hs_model_config *mc,
                             int *max_position, hs_error *e);
/* Write <dir>/model.safetensors and <dir>/config.json from the model's
 * parameters in dtype dt. Every rank calls it (get may be collective); only
 * a rank with write == true creates files. */
hs_status hs_hf_save(hs_model *m, hs_param_get_fn get, void *ctx, hs_dtype dt, int max_position,
                     const char *dir, bool write, hs_error *e);
/* Load <dir>/model.safetensors into the model: every parameter must be
 * present with its shape (errors name the FQN / tensor name, both shapes);
 * tensors the model does not have are errors too. */
hs_status hs_hf_load(hs_model *m, const char *dir, hs_param_set_fn set, void *ctx, hs_error *e);
/* hs_hf_load, where borrow may take a parameter's values in the file (one
 * fp32 tensor of the file's, read in place) instead of a copy. When it
 * took any, *kept is the open file, also after a failure (the caller closes
 * it with hs_safetensors_close once nothing reads those parameters: after
 * freeing the model), else NULL. */
hs_status hs_hf_load_borrowing(hs_model *m, const char *dir, hs_param_set_fn set,
                               hs_param_borrow_fn borrow, void *ctx, hs_st_file **kept,
                               hs_error *e);

#endif
