/* hypershard/base.h — the ground floor: status and errors, rank-aware
 * logging, checked libc calls, accounted aligned allocation, counter-based
 * RNG, clocks, a streaming JSON writer, CRC32 and the per-rank trace.
 *
 * Contract of this layer:
 * - Nothing here keeps global mutable state. Every stateful object (log, pool,
 *   trace) is a value the caller owns and passes down, so two trainers can
 *   live in one process.
 * - One error policy (docs/errors.md):
 *   (a) everything a user or the system can cause — a bad config value or
 *       command line, a missing or damaged file, an I/O error, memory the
 *       system or a pool will not give — is returned as an hs_status with an
 *       hs_error whose message names the thing (config path, parameter FQN,
 *       file, pool), the values or bytes, and the fix (hs_error_oom,
 *       hs_pool_oom for memory). Allocators return NULL and the caller
 *       reports; the status travels up to the command, which prints it and
 *       exits 2 for a config or usage error, 1 otherwise.
 *   (b) HS_ASSERT / hs_panic only for a broken invariant (a programming
 *       error): file, line, abort().
 *   (c) code that cannot return a status and must end a distributed run —
 *       a collective failing on the compute path, a communication thread,
 *       an FSDP hook inside the model — calls hs_comm_abort (comm.h), the
 *       one function that ends every rank, with its hs_error. Work that
 *       cannot return a status but need not end the run records its first
 *       failure for a later status instead: a kernel on its device
 *       (hs_device_status), a trace event in the trace (hs_trace_write).
 * - Exit codes: 0 success, 2 configuration or usage error, 3 stopped by a
 *   signal after saving, 1 anything else.
 */
#ifndef HYPERSHARD_BASE_H
#define HYPERSHARD_BASE_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ------------------------------------------------------------------ status */

typedef enum hs_status {
    HS_OK = 0,
    HS_ERR_USAGE,    /* bad command line                       -> exit 2 */
    HS_ERR_CONFIG,   /* bad configuration value or combination -> exit 2 */
    HS_ERR_IO,       /* a file could not be read or written    -> exit 1 */
    HS_ERR_FORMAT,   /* a file has the wrong content / checksum */
    HS_ERR_COMM,     /* a collective failed                    */
    HS_ERR_TIMEOUT,  /* a collective did not finish in time    */
    HS_ERR_OOM,      /* an allocation failed                   */
    HS_ERR_INTERNAL, /* anything else                          */
    HS_STOPPED,      /* stopped by SIGTERM/SIGINT after saving -> exit 3 */
    HS_STATUS_COUNT
} hs_status;

const char *hs_status_name(hs_status s);
/* 0 for HS_OK, 2 for USAGE and CONFIG, 3 for STOPPED, 1 otherwise. */
int hs_status_exit_code(hs_status s);

#define HS_ERROR_MSG_MAX 8192

/* An error report. `msg` may hold several lines (the config layer reports
 * every problem of a file at once); each line is self-contained. */
typedef struct hs_error {
    hs_status code;
    int lines;
    char msg[HS_ERROR_MSG_MAX];
} hs_error;

void hs_error_clear(hs_error *e);
/* Replace the message. Returns `code` so callers can `return hs_error_set(...)`. */
hs_status hs_error_set(hs_error *e, hs_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Append one more line (the first non-OK code is kept). Returns e->code. */
hs_status hs_error_append(hs_error *e, hs_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
hs_status hs_error_vappend(hs_error *e, hs_status code, const char *fmt, va_list ap);

/* Programming errors: print file:line and the message, then abort(). */
_Noreturn void hs_panic_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define hs_panic(...) hs_panic_at(__FILE__, __LINE__, __VA_ARGS__)
/* Memory the system will not give: HS_ERR_OOM with "out of memory: " and
 * the message (what was being allocated and how much), then a line on what
 * makes a run smaller. Returns HS_ERR_OOM. */
hs_status hs_error_oom(hs_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define HS_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) hs_panic_at(__FILE__, __LINE__, "assertion failed: %s", #cond);               \
    } while (0)

/* Checked libc calls for things that cannot fail in a healthy process
 * (e.g. pthread_create). A failure aborts naming file, line, the call,
 * strerror and a hint. For user-caused failures use the status-returning
 * helpers below. */
#define HS_CHECK_ERRNO(call, hint)                                                                 \
    do {                                                                                           \
        if ((call) != 0)                                                                           \
            hs_panic_at(__FILE__, __LINE__, "%s failed: %s (%s)", #call, hs_strerror_errno(),      \
                        (hint));                                                                   \
    } while (0)
#define HS_CHECK_PTHREAD(call)                                                                     \
    do {                                                                                           \
        int hs__rc = (call);                                                                       \
        if (hs__rc != 0) hs_panic_at(__FILE__, __LINE__, "%s failed: error %d", #call, hs__rc);    \
    } while (0)
const char *hs_strerror_errno(void);

/* fopen that reports "cannot open PATH for reading: REASON; HINT". */
FILE *hs_fopen(const char *path, const char *mode, const char *hint, hs_error *e);
/* An input file the user named (what: its config key): HS_ERR_CONFIG
 * "PATH (what) is a FIFO, not a regular file; fix" for a FIFO, device,
 * socket or directory, found without blocking (a FIFO's open would wait
 * for a writer), or "cannot open PATH (what): REASON; fix"; HS_OK for a
 * regular file it can open. */
hs_status hs_regular_file(const char *path, const char *what, const char *fix, hs_error *e);
/* Read a whole file into a malloc'd NUL-terminated buffer. */
hs_status hs_read_file(const char *path, char **out, size_t *len, hs_error *e);
/* mkdir -p. */
hs_status hs_mkdirs(const char *path, hs_error *e);
/* fclose of a file written to: an error "cannot write PATH: REASON; HINT"
 * when any write to f failed (ferror) or the close's own flush did. */
hs_status hs_fclose_written(FILE *f, const char *path, const char *hint, hs_error *e);

/* A directory a command is about to write into. `what` names where the
 * path came from: a flag ("--safetensors") or a config key
 * ("train.out_dir"). `files` are the names the command creates in it
 * (NULL-terminated; may be NULL). `bytes` is about what it writes there
 * (0: not estimated) and `bytes_what` says what that is, for the message
 * ("the final model.safetensors takes about 3.1 MiB"). */
typedef struct hs_out_dir {
    const char *what;
    const char *path;
    const char *const *files;
    int64_t bytes;
    const char *bytes_what;
} hs_out_dir;

/* Before any work, creating nothing: every path is non-empty; it, or its
 * nearest existing ancestor, is a directory this process can create files
 * in (a probe file is made and removed); none of its files is an existing
 * directory; and the dirs on one file system fit in its free space
 * together. Else an error naming the flag or key, the path and a fix:
 * HS_ERR_USAGE for a flag, HS_ERR_CONFIG for a key (both exit 2). */
hs_status hs_out_dirs_check(const hs_out_dir *dirs, int n, hs_error *e);

/* ------------------------------------------------------ checked arithmetic */

/* Every byte count, element count, offset and schedule length derived from a
 * config, a file or the network is computed through these, so a value that
 * does not fit int64 becomes an error naming its inputs instead of a wrapped
 * number. The plain forms return false on overflow and leave *out unset. */
static inline bool hs_mul_i64(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool hs_add_i64(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
/* The product of n factors; false when any partial product overflows. */
bool hs_prod_i64(const int64_t *factors, int n, int64_t *out);

/* A sticky form for long formulas (memory plans, schedule sizes): each call
 * returns the exact result while everything fits and INT64_MAX once anything
 * has overflowed, and sets `overflow`; the caller checks the flag once at the
 * end and reports the inputs. */
typedef struct hs_checked {
    bool overflow;
} hs_checked;
int64_t hs_ck_mul(hs_checked *c, int64_t a, int64_t b);
int64_t hs_ck_add(hs_checked *c, int64_t a, int64_t b);
/* a * b * c ... for n factors. */
int64_t hs_ck_prod(hs_checked *c, const int64_t *factors, int n);

/* ----------------------------------------------------------------- logging */

typedef enum hs_log_level {
    HS_LOG_ERROR = 0,
    HS_LOG_WARN,
    HS_LOG_INFO,
    HS_LOG_DEBUG,
    HS_LOG_LEVEL_COUNT
} hs_log_level;

/* Rank-aware logger. By default only rank 0 prints INFO/DEBUG; WARN and ERROR
 * print on every rank. HS_LOG_LEVEL=error|warn|info|debug sets the level,
 * HS_LOG_RANKS=all makes every rank print (lines are prefixed "[rank r]"). */
typedef struct hs_log {
    int rank;
    int world;
    hs_log_level level;
    bool all_ranks;
    FILE *out;
} hs_log;

void hs_log_init(hs_log *log, int rank, int world);
void hs_logf(const hs_log *log, hs_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define hs_log_error(l, ...) hs_logf((l), HS_LOG_ERROR, __VA_ARGS__)
#define hs_log_warn(l, ...) hs_logf((l), HS_LOG_WARN, __VA_ARGS__)
#define hs_log_info(l, ...) hs_logf((l), HS_LOG_INFO, __VA_ARGS__)
#define hs_log_debug(l, ...) hs_logf((l), HS_LOG_DEBUG, __VA_ARGS__)

/* ------------------------------------------------------------------- pools */

#define HS_ALIGN 64

/* An accounting pool. Allocation goes through malloc-backed 64-byte aligned
 * blocks; the pool counts current and peak bytes (thread safe, the
 * communication thread allocates too). On the cpu device the `device` and
 * `host` pools are both RAM: the accounting is what shows what sharding and
 * offload save. */
typedef struct hs_pool {
    const char *name;
    atomic_llong current;
    atomic_llong peak;
    atomic_llong allocs;
    int64_t limit; /* bytes the pool may hold at once; 0: no limit but the system's */
} hs_pool;

void hs_pool_init(hs_pool *p, const char *name);
/* A cap on the bytes in use at once (0: none), as a device has a size:
 * past it an allocation fails like one the system refuses. */
void hs_pool_set_limit(hs_pool *p, int64_t bytes);
/* Aligned, uninitialised; NULL when the system or the pool's limit refuses
 * (nothing is counted then): the caller reports it with hs_pool_oom. */
void *hs_pool_alloc(hs_pool *p, size_t bytes);
/* Aligned, zero-filled; NULL as hs_pool_alloc. */
void *hs_pool_calloc(hs_pool *p, size_t bytes);
/* The report of a failed allocation from p: HS_ERR_OOM naming the pool,
 * `what` was allocated, the bytes asked for, and the pool's bytes in use,
 * peak and limit. */
hs_status hs_pool_oom(const hs_pool *p, size_t bytes, const char *what, hs_error *e);
/* Counts `bytes` against p as an allocation made elsewhere (a caching
 * allocator over device memory): false, and nothing counted, past p's
 * limit. hs_pool_uncharge gives them back. */
bool hs_pool_charge(hs_pool *p, size_t bytes);
void hs_pool_uncharge(hs_pool *p, size_t bytes);
/* Whether `bytes` more stay within p's limit now (always without one). */
bool hs_pool_fits(const hs_pool *p, size_t bytes);
/* NULL is fine. `ptr` must come from the same pool. */
void hs_pool_free(hs_pool *p, void *ptr);
size_t hs_pool_block_size(const void *ptr);
int64_t hs_pool_current(const hs_pool *p);
int64_t hs_pool_peak(const hs_pool *p);
/* Peak := current; for measuring one phase. */
void hs_pool_reset_peak(hs_pool *p);

/* --------------------------------------------------------------------- RNG */

/* Philox4x32-10. A value depends only on (seed, stream, index), so any slice
 * of a tensor can be filled alone and equals the same slice of the full
 * tensor's fill. Parameters use stream = hs_hash64(FQN). */
void hs_philox4x32(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]);
uint64_t hs_hash64(const char *s); /* FNV-1a 64 */
/* Uniform in [0, 1) from the first 24 bits of word 0. */
float hs_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Standard normal (Box-Muller on words 0 and 1, cos branch). */
float hs_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);
/* out[i] = value at index (offset + i). */
void hs_rng_fill_uniform(float *out, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,
                         float lo, float hi);
void hs_rng_fill_normal(float *out, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,
                        float mean, float std);

/* ------------------------------------------------------------------ clocks */

/* Monotonic seconds. */
double hs_now(void);

/* Bytes the ranks of this node may still allocate: MemAvailable, capped by
 * the cgroup v2 limit; HYPERSHARD_NODE_MEMORY (bytes) overrides both. -1
 * when unknown. */
int64_t hs_memory_available(void);
/* Wall-clock seconds since the epoch (for trace alignment across ranks). */
double hs_wall_now(void);

/* ------------------------------------------------------------------- JSON */

/* A streaming JSON writer. Commas and nesting are tracked; keys and values
 * are escaped. Doubles print with `%.*g` of the given significant digits
 * (non-finite values print as null, since JSON has no NaN). */
#define HS_JSON_MAX_DEPTH 32
typedef struct hs_json {
    FILE *f;
    int depth;
    bool first[HS_JSON_MAX_DEPTH];
    bool after_key;
} hs_json;

void hs_json_init(hs_json *j, FILE *f);
void hs_json_begin_object(hs_json *j);
void hs_json_end_object(hs_json *j);
void hs_json_begin_array(hs_json *j);
void hs_json_end_array(hs_json *j);
void hs_json_key(hs_json *j, const char *key);
void hs_json_string(hs_json *j, const char *s);
void hs_json_int(hs_json *j, int64_t v);
void hs_json_double(hs_json *j, double v, int sig_digits);
void hs_json_bool(hs_json *j, bool v);
void hs_json_null(hs_json *j);
/* key + value shorthands */
void hs_json_kv_string(hs_json *j, const char *key, const char *s);
void hs_json_kv_int(hs_json *j, const char *key, int64_t v);
void hs_json_kv_double(hs_json *j, const char *key, double v, int sig_digits);
void hs_json_kv_bool(hs_json *j, const char *key, bool v);

/* ------------------------------------------------------------------- CRC32 */

/* Standard CRC-32 (zlib). Start with crc = 0; chain calls over pieces. */
uint32_t hs_crc32(uint32_t crc, const void *data, size_t n);

/* ------------------------------------------------------------------- trace */

/* Per-rank Chrome trace (opens in Perfetto / chrome://tracing) and always-on
 * collective counters. Thread safe: the compute thread and the communication
 * thread both record. Recording spans costs nothing when `enabled` is false;
 * counters are kept regardless, so tests can count collectives per step.
 * Spans and samples cannot fail: one that finds no memory is dropped and
 * counted, and hs_trace_serialize / hs_trace_write then return HS_ERR_OOM
 * naming it instead of writing an incomplete trace. */
typedef enum hs_trace_lane {
    HS_LANE_COMPUTE = 0, /* tid 0: compute spans (forward/backward/optimizer) */
    HS_LANE_COMM = 1,    /* tid 1: collectives as executed by the comm thread */
    HS_LANE_COPY = 2,    /* tid 2: H2D / D2H copies                            */
    HS_LANE_COUNT
} hs_trace_lane;

typedef struct hs_trace hs_trace;

/* NULL, with HS_ERR_OOM in e, when there is no memory for it. */
hs_trace *hs_trace_create(int rank, bool enabled, hs_error *e);
void hs_trace_free(hs_trace *t);
bool hs_trace_enabled(const hs_trace *t);
/* A complete span [t0, t1] in hs_now() seconds. `args_json` is either NULL
 * or the inside of a JSON object ("\"bytes\":123,\"group\":\"fsdp_shard\""). */
void hs_trace_span(hs_trace *t, hs_trace_lane lane, const char *name, const char *cat, double t0,
                   double t1, const char *args_json);
/* A counter sample (e.g. pool bytes). */
void hs_trace_counter(hs_trace *t, const char *name, double ts, int64_t value);
/* Sample both pools as counters "device_bytes" / "host_bytes". */
void hs_trace_memory(hs_trace *t, const hs_pool *device, const hs_pool *host);

/* Collective counters, keyed by (op, group). Called by comm/ for every
 * collective it executes. HS_ERR_OOM (nothing counted) when a new (op,
 * group) finds no memory. */
hs_status hs_trace_count(hs_trace *t, const char *op, const char *group, int64_t bytes,
                         hs_error *e);
/* Count / bytes of `op` on `group`; NULL op or group means any. */
int64_t hs_trace_collectives(const hs_trace *t, const char *op, const char *group);
int64_t hs_trace_collective_bytes(const hs_trace *t, const char *op, const char *group);
void hs_trace_reset_counters(hs_trace *t);

/* Serialise this rank's events as a JSON array body (comma-separated event
 * objects, no brackets) with timestamps shifted by `clock_offset_s` and pid
 * = rank. Caller frees *out with free(). */
hs_status hs_trace_serialize(const hs_trace *t, double clock_offset_s, char **out, size_t *len,
                             hs_error *e);
/* Write this rank alone as a complete trace file. */
hs_status hs_trace_write(const hs_trace *t, const char *path, hs_error *e);

#endif
