/* hypershard/train.h — data, the trainer loop, metrics, and Hugging Face
 * safetensors export / import.
 *
 * Contract of this layer:
 * - Data is a token stream (vocab <= 65536, stored as uint16) from one of
 *   three sources: `builtin` (a synthetic English-like language generated
 *   deterministically, byte tokens), `text` (any file, byte tokens) and
 *   `tokens` (an "HSTK" file, see hs_tokens_write). The stream is cut into
 *   non-overlapping sequences of seq_len + 1 tokens; the last val_fraction
 *   of them are the validation split. Which sequences make global batch g
 *   and which of them a data-parallel rank reads in micro-batch m is pure
 *   arithmetic on (seed, g, m, rank) — docs/data.md is the reference.
 * - The trainer runs on every rank of an initialised hs_comm; rank 0 alone
 *   writes files and prints. Where parameters live (one process, or FSDP
 *   shards) is hidden behind a private engine (src/train/engine.h).
 * - Safetensors files follow the published format: 8-byte little-endian
 *   header length, a JSON header (dtype, shape, data_offsets per tensor,
 *   optional "__metadata__" of string values), raw little-endian data.
 *   Dtypes F32, BF16 and F16. Reading parses the header with Jansson and
 *   checks every offset against the file before any byte is used.
 * - Hugging Face names are the model's FQNs, except stacked routed experts
 *   [E, out, in], which become E tensors "...experts.<j>.<proj>.weight".
 */
#ifndef HYPERSHARD_TRAIN_H
#define HYPERSHARD_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hypershard/base.h"
#include "hypershard/comm.h"
#include "hypershard/config.h"
#include "hypershard/mesh.h"
#include "hypershard/model.h"
#include "hypershard/tensor.h"

/* ------------------------------------------------------------------ data */

/* Bytes of the builtin corpus the data layer generates. */
#define HS_CORPUS_BUILTIN_BYTES ((size_t)2 << 20)

/* Fill out[0..n) with the builtin language; the text depends only on n's
 * prefix (generating more bytes extends, never changes, a shorter text). */
void hs_corpus_builtin(uint8_t *out, size_t n);

typedef struct hs_dataset hs_dataset;

/* Open the data of `dc` for sequences of seq_len (+1) tokens. The builtin
 * and text sources need vocab_size >= 256; every token of a tokens file must
 * be < vocab_size. `seed` (train.seed) drives the per-epoch order. */
hs_status hs_data_open(const hs_data_config *dc, int seq_len, int vocab_size, uint64_t seed,
                       hs_dataset **out, hs_error *e);
void hs_data_free(hs_dataset *ds);
int64_t hs_data_num_tokens(const hs_dataset *ds);
int64_t hs_data_num_train(const hs_dataset *ds); /* train sequences */
int64_t hs_data_num_val(const hs_dataset *ds);   /* validation sequences */
int hs_data_seq_len(const hs_dataset *ds);

/* Train sequence (0..num_train) that is element k of global batch g (0-based)
 * when global batches hold `global_batch` sequences. */
int64_t hs_data_batch_sequence(hs_dataset *ds, int64_t g, int global_batch, int k);
/* Sequence `seq` (0..num_train+num_val; validation ones follow the train
 * ones) as inputs tokens[0..T) and targets[0..T) = the next tokens. */
void hs_data_sequence(const hs_dataset *ds, int64_t seq, int32_t *tokens, int32_t *targets);
/* The `mbs` sequences rank d of D reads in micro-batch m of global batch g:
 * elements [m*mbs*D + d*mbs, +mbs) of it. tokens/targets hold mbs*T. */
void hs_data_micro_batch(hs_dataset *ds, int64_t g, int global_batch, int m, int mbs, int d, int D,
                         int32_t *tokens, int32_t *targets);

/* Token files: "HSTK", uint32 version, uint64 count, then count tokens, all
 * little-endian: version 1 holds uint16 tokens, version 2 uint32 tokens
 * (vocabularies over 65,536, e.g. Llama 3's 128,256). Written atomically
 * (temp file + rename), as version 1 when every token fits 16 bits. */
#define HS_TOKENS_MAGIC "HSTK"
#define HS_TOKENS_VERSION_U16 1
#define HS_TOKENS_VERSION_U32 2
hs_status hs_tokens_write(const char *path, const uint32_t *tokens, int64_t n, hs_error *e);
/* Either version; *out is malloc'd. */
hs_status hs_tokens_read(const char *path, uint32_t **out, int64_t *n, hs_error *e);
/* The same from a whole file's len bytes in memory; path names it in errors. */
hs_status hs_tokens_parse(const char *path, const void *data, size_t len, uint32_t **out,
                          int64_t *n, hs_error *e);

/* The Hugging Face tokenizer of a token file: tokenizer.json (and
 * tokenizer_config.json, special_tokens_map.json) in data.path's
 * directory. check: *vocab = its vocabulary (0 without one), an error
 * naming model.vocab_size when the model's is smaller. find: path =
 * dir/tokenizer.json, whether it exists. dir: data.path's directory when it
 * holds one (false otherwise). copy: the files dir has into out_dir. */
hs_status hs_tokenizer_check(const hs_config *cfg, int64_t *vocab, hs_error *e);
bool hs_tokenizer_find(const char *dir, char *path, size_t cap);
bool hs_tokenizer_dir(const hs_config *cfg, char *out, size_t cap);
hs_status hs_tokenizer_copy(const char *dir, const char *out_dir, int *copied, hs_error *e);
/* One past the largest token id of tokenizer.json's model.vocab and
 * added_tokens, every id checked (an integer in [0, HS_BPE_ID_MAX), no id
 * shared by two vocab tokens); errors name the file and the field. */
hs_status hs_tokenizer_vocab(const char *path, int64_t *n, hs_error *e);

/* A byte-level BPE tokenizer (GPT-2 style tokenizer.json: ByteLevel
 * pre-tokenizer with its regex, BPE model) for text in and text out
 * (bpe.c); other kinds are a config error naming the file. encode: *ids
 * (malloc'd, *n of them) of UTF-8 text, exact for ASCII text (non-ASCII
 * code points are split as letters). decode: the bytes of one token into
 * out (at most cap), their count. */
typedef struct hs_bpe hs_bpe;
/* Token ids at or above this are refused: 16M is 64 times the largest
 * vocabulary in use, and the id -> token table is as long as the largest id. */
#define HS_BPE_ID_MAX (1 << 24)
hs_status hs_bpe_load(const char *path, hs_bpe **out, hs_error *e);
/* The same from len bytes of tokenizer.json text; path names it in errors. */
hs_status hs_bpe_load_text(const char *path, const char *text, size_t len, hs_bpe **out,
                           hs_error *e);
void hs_bpe_free(hs_bpe *b);
int hs_bpe_vocab_size(const hs_bpe *b);
hs_status hs_bpe_encode(const hs_bpe *b, const char *text, int32_t **ids, int *n, hs_error *e);
int hs_bpe_decode(const hs_bpe *b, int32_t id, char *out, int cap);

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
hs_status hs_safetensors_open_mem(const char *path, const void *buf, size_t len,
                                  hs_st_file **out, hs_error *e);
void hs_safetensors_close(hs_st_file *f);
int hs_safetensors_count(const hs_st_file *f);
const hs_st_tensor *hs_safetensors_tensor(const hs_st_file *f, int i);
/* NULL if absent. */
const hs_st_tensor *hs_safetensors_find(const hs_st_file *f, const char *name);
const char *hs_safetensors_meta(const hs_st_file *f, const char *key);
int64_t hs_st_numel(const hs_st_tensor *t);
/* Convert the tensor to fp32 (handles unaligned data). */
void hs_st_to_f32(const hs_st_tensor *t, float *out);

/* ------------------------------------------------------- Hugging Face I/O */

/* The full fp32 tensor of model parameter i: get (gather) or set (scatter).
 * Under FSDP these are collective, so every rank calls them in the same order. */
typedef hs_status (*hs_param_get_fn)(void *ctx, int param_index, float *out, hs_error *e);
typedef hs_status (*hs_param_set_fn)(void *ctx, int param_index, const float *full, hs_error *e);

/* Number of HF tensors parameter p becomes (E for stacked experts, else 1)
 * and the name of the j-th. */
int hs_hf_tensor_count(const hs_param *p);
void hs_hf_tensor_name(const hs_param *p, int j, char *buf, size_t cap);

/* config.json of LlamaForCausalLM (arch llama) / MixtralForCausalLM (moe). */
hs_status hs_hf_config_write(const hs_model_config *mc, int max_position, const char *dtype_name,
                             const char *path, hs_error *e);
/* Fill the model fields of *mc from a config.json written by us or by
 * transformers (other fields of *mc are left as they are). */
hs_status hs_hf_config_read(const char *path, hs_model_config *mc, int *max_position,
                            hs_error *e);
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

/* --------------------------------------------------------------- trainer */

/* Graceful stop on SIGTERM / SIGINT (Slurm preemption, Ctrl-C). Start it
 * before any other thread exists (before MPI_Init): it blocks both signals
 * in the process and waits for them on a thread of its own. The first one
 * requests a stop: the trainer finishes its step, saves a checkpoint when
 * checkpoint.dir is set and returns HS_STOPPED (exit 3); any rank's request
 * stops every rank after the same step. A second signal ends the process
 * at once (exit 128 + the signal's number). */
typedef struct hs_stop hs_stop;

hs_stop *hs_stop_start(void);
/* The signal that requested the stop, or 0. Thread-safe. */
int hs_stop_signal(const hs_stop *s);

typedef struct hs_train_options {
    const char *init_from; /* NULL or a safetensors dir (model.safetensors) */
    const char *dump_dir;  /* NULL, or where --dump writes per-step fp32 weights,
                            * gradients and logits (docs/training.md) */
    const hs_stop *stop;   /* NULL: signals keep their default action */
} hs_train_options;

/* Train cfg (already validated for this world, topology topo) on every rank
 * of comm. Writes <out_dir>/{config.yaml,metrics.jsonl,model.safetensors,
 * config.json} from rank 0. */
hs_status hs_train_run(const hs_config *cfg, const hs_topology *topo, hs_comm *comm,
                       const hs_train_options *opt, const hs_log *log, hs_error *e);

/* A checkpoint's config.yaml is a copy for people and for `--ckpt`
 * commands; the metadata's config_hash is what its tensors were saved with.
 * HS_ERR_FORMAT naming the file and both hashes when config.yaml cannot be
 * read or no longer hashes to `saved_hash` (it was edited after the save);
 * a checkpoint saved without one (the ckpt library alone) passes. */
hs_status hs_train_ckpt_config_check(const char *step_dir, uint64_t saved_hash, hs_error *e);

/* Inference on trained weights (generate.c), on every rank of comm in the
 * layout cfg gives: the weights come from opt->init_from (a run's or an
 * export's model.safetensors) or from cfg->checkpoint.resume (a checkpoint
 * of any layout, resharded on load). Nothing is written. */
typedef struct hs_generate_options {
    const int32_t *prompt; /* tokens (bytes for byte-level data) */
    int prompt_len;        /* >= 1 */
    int max_new_tokens;
    double temperature;    /* 0: greedy */
    int top_k;             /* 0: the whole vocabulary */
    uint64_t seed;         /* of the sampling */
    /* rank 0, each token as it is produced (may be NULL) */
    void (*emit)(void *ctx, int32_t token);
    void *emit_ctx;
} hs_generate_options;

/* The continuation, max_new_tokens of it, into out (on every rank). A
 * prompt longer than train.seq_len keeps its last seq_len - 1 tokens; the
 * context window slides as the text grows. */
hs_status hs_train_generate(const hs_config *cfg, const hs_topology *topo, hs_comm *comm,
                            const hs_train_options *opt, const hs_log *log,
                            const hs_generate_options *g, int32_t *out, hs_error *e);
/* Mean loss per token over the validation sequences the trainer evaluates
 * on (data.* of cfg), the same value as a run's val loss. */
hs_status hs_train_eval(const hs_config *cfg, const hs_topology *topo, hs_comm *comm,
                        const hs_train_options *opt, const hs_log *log, double *val_loss,
                        hs_error *e);

/* ------------------------------------------------------------- the plan */

/* What one rank of a role holds, in bytes (plan.c). The memory model is
 * the code's: the model sizes its buffers with the allocation code
 * (hs_model_options.count_buffers), FSDP's per-parameter sizes follow
 * fsdp/param.c and the unshard / reduce events of one step are replayed in
 * hook order (prefetch, reshard, reduce-scatter waits), as metrics.jsonl's
 * peak_device_bytes counts them: the device pool's peak over a step. */
typedef enum hs_plan_item {
    HS_PLAN_PARAMS = 0,    /* sharded fp32 masters (whole parameters in one process) */
    HS_PLAN_GRADS,         /* sharded fp32 gradients                                  */
    HS_PLAN_MODEL_COPY,    /* fp32 main params: the param_dtype shard the model reads */
    HS_PLAN_OPTIM,         /* optimizer state                                         */
    HS_PLAN_REDUCE,        /* reduce-scatter / all-reduce output slots                */
    HS_PLAN_ACTIVATIONS,   /* activations and scratch at the micro-batch              */
    HS_PLAN_UNSHARDED,     /* all-gathered parameters alive at the peak               */
    HS_PLAN_UNSHARDED_GRADS, /* unsharded gradients and reduce inputs at the peak     */
    HS_PLAN_ITEM_COUNT
} hs_plan_item;

const char *hs_plan_item_name(hs_plan_item k); /* "params", "grads", ... */

/* Per-step communication of one rank, summed over the step's calls. */
typedef enum hs_plan_comm {
    HS_PLAN_AG = 0, /* FSDP all-gather (fsdp_shard / edp_shard)     */
    HS_PLAN_RS,     /* FSDP reduce-scatter                          */
    HS_PLAN_AR,     /* HSDP / DDP all-reduce (fsdp_replicate, flat) */
    HS_PLAN_TP,     /* tensor-parallel activations                  */
    HS_PLAN_CP,     /* context-parallel K/V                         */
    HS_PLAN_EP,     /* expert-parallel all-to-all                   */
    HS_PLAN_PP,     /* pipeline hand-over                           */
    HS_PLAN_COMM_COUNT
} hs_plan_comm;

const char *hs_plan_comm_name(hs_plan_comm k);

#define HS_PLAN_MAX_ROLES 64

typedef struct hs_plan_role {
    char name[48];       /* "every rank", "stage 2" */
    int n_ranks, first_rank;
    int n_blocks;        /* blocks this role's model holds */
    int64_t device[HS_PLAN_ITEM_COUNT];
    int64_t host[HS_PLAN_ITEM_COUNT]; /* enable_offload: masters, grads, state */
    /* activations had activation_checkpointing the other value */
    int64_t activations_other;
    int64_t peak_device_bytes, peak_host_bytes;
    int64_t comm_bytes[HS_PLAN_COMM_COUNT];
    int64_t comm_calls[HS_PLAN_COMM_COUNT];
} hs_plan_role;

typedef struct hs_plan {
    const hs_topology *topo; /* the one it was built for */
    int world, micro_batches;
    const char *engine; /* "local" or "fsdp" (with the model parallel degrees) */
    int n_roles;
    hs_plan_role roles[HS_PLAN_MAX_ROLES];
    int64_t max_peak_device_bytes, max_peak_host_bytes;
    int64_t total_params;     /* of the whole model */
    int64_t checkpoint_bytes; /* one checkpoint of the whole job, estimated */
} hs_plan;

/* The plan of cfg (validated for topo->world) without MPI and without
 * allocating any of it; fast for any world size and depth. */
hs_status hs_plan_build(const hs_config *cfg, const hs_topology *topo, hs_plan *out, hs_error *e);
/* The table a person reads (plan_print.c) and the same as one JSON object. */
void hs_plan_print(const hs_plan *p, const hs_config *cfg, FILE *f);
void hs_plan_json(const hs_plan *p, FILE *f);
/* Exit-2 check before any allocation: the peak of the ranks one node runs
 * (ranks_per_node of the busiest role) must fit `avail_bytes`; else an
 * HS_ERR_CONFIG naming the biggest items and the keys that make it fit. */
hs_status hs_plan_check_fit(const hs_plan *p, const hs_config *cfg, int ranks_per_node,
                            int64_t avail_bytes, hs_error *e);

#endif
