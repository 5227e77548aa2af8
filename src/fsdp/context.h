/* fsdp/context.h — everything of one wrapped model: its managed parameters,
 * its units, the reduction pipeline and the root drain. Nothing lives
 * outside this struct, so two wrapped models in one process never see each
 * other's queues (RFC 000 §6.1, §8.2).
 *
 * Reduction pipeline (RFC §6.3), driven from each unit's post_backward:
 *   wait the previous unit's reduce-scatters -> issue this unit's
 *   reduce-scatters -> launch the previous unit's all-reduces.
 * The reduce-scatter of unit i thus overlaps the backward of unit i-1, and
 * an all-reduce never starts before the reduce-scatter it consumes. The root
 * drain (post_backward_final) runs any post_backward that was missed,
 * launches the last all-reduces, waits for everything and adds the reduced
 * shards into the optimizer's gradients. It is unconditional, idempotent
 * and safe on an empty queue. */
#ifndef HS_FSDP_CONTEXT_H
#define HS_FSDP_CONTEXT_H

#include <stdbool.h>

#include "fsdp/unit.h"
#include "hypershard/model.h"

/* Observer of every hook, for debugging and tests: `event` is one of
 * "forward_pre", "forward", "backward_pre", "backward",
 * "root_backward_enter", "root_backward_exit" (RFC §3.3 names). */
typedef void (*hs_fsdp_transition_fn)(void *arg, int unit, const char *event,
                                      hs_fsdp_unit_state from, hs_fsdp_unit_state to);

typedef struct hs_fsdp_ctx {
    hs_fsdp_param *params; /* one per model parameter, model order */
    int n_params;
    hs_fsdp_unit *units; /* indexed by model unit index; 0 is the root */
    int n_units;
    hs_fsdp_mem mem;
    hs_comm *comm; /* NULL only in single-process tests without groups */
    const hs_log *log;

    /* micro-batch flags (spec 004 §2.3) */
    bool sync;           /* reduce gradients in this micro-batch */
    bool reshard;        /* reshard after backward in this micro-batch */
    float grad_prescale; /* applied once, before the first gradient collective */

    int prev_unit; /* reduce-scatters issued, all-reduces not yet: -1 none */
    int *reduced;  /* units whose reductions await the drain, in order */
    int n_reduced;

    /* Time the compute thread spent blocked on FSDP collectives
     * (fsdp/exposed.h): exposed communication, per collective kind. */
    hs_fsdp_exposed exposed;

    int fwd_depth, bwd_depth; /* the prefetch depths */
    /* Each stage chunk's first unit in its forward [0] and backward [1]
     * pass (-1 none; manager.c's set_prefetch). */
    int chunk_first[2][HS_MODEL_MAX_CHUNKS];
    /* The pipeline's next action (hs_fsdp_prefetch_next): its chunk (-1
     * none), direction, and how many of its first units are issued. */
    int next_chunk, next_issued;
    bool next_backward;

    hs_fsdp_transition_fn on_transition;
    void *transition_arg;
    hs_model_hooks hooks;
} hs_fsdp_ctx;

/* Units and params are filled by the caller (the manager or a test); this
 * sets the flags, the queues and the hook table. HS_ERR_OOM when the
 * reduction queue cannot be allocated. */
hs_status hs_fsdp_ctx_init(hs_fsdp_ctx *ctx, hs_comm *comm, const hs_log *log, hs_error *e);
void hs_fsdp_ctx_free(hs_fsdp_ctx *ctx);
/* RFC §6.4's gradient scaling factor (the manager's dp x cp, for the
 * trainer's loss scaled by the global batch). Where it and a parameter's
 * data-parallel average cancel (every parameter of a wrapped model: the
 * group sizes multiply to it), the parameter's reductions SUM instead and
 * its gradient is not scaled: no pass over it, and the same bits where the
 * group sizes are powers of two (scaling by 2^k and dividing by it are
 * exact), one rounding fewer where they are not. */
void hs_fsdp_ctx_set_prescale(hs_fsdp_ctx *ctx, float prescale);

/* A failure inside a hook (a collective that failed, memory the device
 * would not give) cannot be returned through the model: it ends every rank
 * with the message through hs_comm_abort, the one function that ends a run
 * (a half-run collective sequence would leave the others hanging). */
_Noreturn void hs_fsdp_ctx_fail(hs_fsdp_ctx *ctx, const hs_error *e);

/* post_backward's reduction step for unit u (sync micro-batch). */
void hs_fsdp_ctx_reduce_unit(hs_fsdp_ctx *ctx, int u);
/* Wait and apply every pending reduction. Idempotent. */
void hs_fsdp_ctx_drain(hs_fsdp_ctx *ctx);
/* Whether any reduction is queued or in flight. */
bool hs_fsdp_ctx_pending(const hs_fsdp_ctx *ctx);

/* The hooks (fsdp/hooks.c). */
void hs_fsdp_hook_pre_forward(void *ctx, int unit);
void hs_fsdp_hook_post_forward(void *ctx, int unit);
void hs_fsdp_hook_pre_backward(void *ctx, int unit);
void hs_fsdp_hook_post_backward(void *ctx, int unit);
void hs_fsdp_hook_post_backward_final(void *ctx);
void hs_fsdp_hook_weight_grad_deferred(void *ctx, int unit);
void hs_fsdp_hook_post_weight_grad(void *ctx, int unit);

#endif
