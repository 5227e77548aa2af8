/* hypershard/data.h — token streams, the builtin corpus and tokenizers.
 *
 * Contract of this layer:
 * - Data is a token stream from one of four sources: `builtin` (a
 *   synthetic English-like language generated deterministically, byte
 *   tokens), `text` (any file, byte tokens), `tokens` (an "HSTK" file, see
 *   hs_tokens_write) and `indexed` (Megatron-LM PREFIX.bin/.idx, documents
 *   packed with an optional EOS, several blended by weight). The stream is cut into
 *   non-overlapping sequences of seq_len + 1 tokens; the last val_fraction
 *   of them are the validation split. Which sequences make global batch g
 *   and which of them a data-parallel rank reads in micro-batch m is pure
 *   arithmetic on (seed, g, m, rank) — docs/data.md is the reference.
 * - The Hugging Face tokenizer of a token file is found, checked and copied
 *   here, and a byte-level BPE tokenizer turns text into ids and back.
 */
#ifndef HYPERSHARD_DATA_H
#define HYPERSHARD_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hypershard/base.h"
#include "hypershard/config.h"

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
/* The dataset (0-based index into data.blend; 0 without a blend) that
 * sequence `seq` comes from. With a blend, train ids are the members' train
 * windows one member after another, and validation ids follow the members'
 * validation windows blended by weight (see hs_blend_fill). */
int hs_data_sequence_source(const hs_dataset *ds, int64_t seq);
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

/* Megatron-LM indexed datasets (data.source indexed): PREFIX.idx holds
 * the magic "MMIDIDX\0\0", uint64 version 1, a uint8 dtype code (1 uint8,
 * 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16),
 * uint64 sequence count S, uint64 document-index count D + 1, then int32
 * sequence_lengths[S] (tokens), int64 sequence_pointers[S] (byte offsets
 * into PREFIX.bin) and int64 document_indices[D + 1] (rising from 0 to S:
 * document d is sequences [di[d], di[d+1])), all little-endian. The
 * documents are packed into one stream, an EOS token (eos_id >= 0) between
 * two documents; eos_id < 0 packs them with nothing between. Every field,
 * pointer and token (a whole number < vocab_size) is checked at open: an
 * error names the file and the field (HS_ERR_CONFIG). PREFIX.bin is
 * memory-mapped read-only. */
#define HS_INDEXED_MAGIC "MMIDIDX\0\0"
typedef struct hs_indexed hs_indexed;
hs_status hs_indexed_open(const char *prefix, int vocab_size, int eos_id, hs_indexed **out,
                          hs_error *e);
/* The same from the index's and the data's bytes in memory (borrowed: they
 * must outlive *out); name stands for PREFIX in errors. */
hs_status hs_indexed_parse(const char *name, const void *idx, size_t idx_len, const void *bin,
                           size_t bin_len, int vocab_size, int eos_id, hs_indexed **out,
                           hs_error *e);
void hs_indexed_free(hs_indexed *ix);
int64_t hs_indexed_num_tokens(const hs_indexed *ix); /* of the packed stream, EOS included */
int64_t hs_indexed_num_sequences(const hs_indexed *ix);
int64_t hs_indexed_num_documents(const hs_indexed *ix);
/* Tokens [pos, pos + n) of the packed stream. */
void hs_indexed_read(const hs_indexed *ix, int64_t pos, int64_t n, int32_t *out);

/* Blending datasets by weight (blend.c). Blended sample k (0-based) comes
 * from the member i with the largest w_i * (k + 1) - c_i, c_i the samples
 * member i gave before k and w the weights normalised to sum 1 (the lowest
 * i on ties; a zero weight never draws), so member i's share of any prefix
 * of k samples is within one sample of w_i * k. weights_check: each finite
 * and >= 0, the sum > 0; errors name what[i].weight. at: the member of
 * sample k and *local, its own sample number there (c_i); it advances an
 * internal cursor (earlier k replay from 0), so answers depend on k alone.
 * fill: the first `total` samples with member i giving at most caps[i]
 * (a full member is passed over), into member[] and local[]. */
typedef struct hs_blend hs_blend;
hs_status hs_blend_weights_check(const double *weights, int n, const char *what, hs_error *e);
hs_status hs_blend_create(const double *weights, int n, hs_blend **out, hs_error *e);
void hs_blend_free(hs_blend *b);
int hs_blend_at(hs_blend *b, int64_t k, int64_t *local);
hs_status hs_blend_fill(const double *weights, const int64_t *caps, int n, int32_t *member,
                        int64_t *local, int64_t total, hs_error *e);

/* Whether the data's ids come from a tokenizer (a token file or an
 * indexed dataset), not bytes of text. */
bool hs_data_tokenized(const hs_data_config *dc);
/* The Hugging Face tokenizer of a token file or indexed dataset:
 * tokenizer.json (and tokenizer_config.json, special_tokens_map.json) in
 * data.path's directory (a blend's: its first dataset's that has one). check: *vocab = its vocabulary (0 without one), an error
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

#endif
