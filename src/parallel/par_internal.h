/* parallel/par_internal.h — the contexts of tensor, context and expert
 * parallelism and the hs_parallel that composes them into the model's
 * seam, shared by parallel.c (the seam, placement, buffers), style.c (the
 * style table), tp_region.c, cp_attention.c and the collectives (tp_ops.c,
 * cp_ops.c, ep.c). */
#ifndef HS_PARALLEL_PAR_INTERNAL_H
#define HS_PARALLEL_PAR_INTERNAL_H

#include "hypershard/parallel.h"

struct hs_tp {
    hs_comm *comm;
    hs_stream *stream; /* the device's compute stream: every collective's */
    hs_pg *group;
    int size, rank;
    bool sequence_parallel;
    hs_parallel_stats stats;
};

/* The tp group's collectives (tp_ops.c). */
hs_status hs_tp_create(hs_comm *comm, hs_device *dev, hs_pg *group, bool sequence_parallel,
                       hs_tp **out, hs_error *e);
void hs_tp_free(hs_tp *t);
/* all-gather of every rank's numel elements into full, in rank order */
void hs_tp_gather(hs_tp *t, void *full, const void *local, int64_t numel, hs_dtype dt);
/* partial sums of all rows (fp32, `full`, numel counts the local rows'
 * elements): all-reduced in place, or reduce-scattered into `local` under
 * sequence parallelism */
void hs_tp_reduce_partial(hs_tp *t, float *local, float *full, int64_t numel);
void hs_tp_all_reduce(hs_tp *t, float *buf, int64_t n, hs_reduce_op op);

/* The cp group's collectives and ring steps (cp_ops.c). a2a: the group of
 * the all-to-all methods (the cp group under alltoall, a group of
 * consecutive CP ranks under alltoall_ring, whose size is then the ring's
 * stride), or NULL. */
hs_status hs_cp_create(hs_comm *comm, hs_device *dev, hs_pg *group, hs_pg *a2a, hs_cp **out,
                       hs_error *e);
void hs_cp_free(hs_cp *c);
void hs_cp_gather(hs_cp *c, void *out, const void *in, int64_t numel, hs_dtype dt);
void hs_cp_reduce_scatter(hs_cp *c, float *out, const float *in, int64_t numel);
/* Block r of `in` (per_rank elements of dt) to rank r of the a2a group,
 * block r of `out` from it. */
void hs_cp_all_to_all(hs_cp *c, void *out, const void *in, int64_t per_rank, hs_dtype dt);
/* Start sending `send` to CP rank + stride and receiving into `recv` from
 * CP rank - stride (numel elements of dt each); the caller computes
 * meanwhile and waits before it reads `recv` or reuses `send`. */
void hs_cp_ring_start(hs_cp *c, void *recv, const void *send, int64_t numel, hs_dtype dt);
void hs_cp_ring_wait(hs_cp *c);

/* The ep group's exchanges (ep.c). */
hs_status hs_ep_create(hs_comm *comm, hs_device *dev, hs_pg *group, hs_ep **out, hs_error *e);
void hs_ep_free(hs_ep *p);
void hs_ep_all_to_all(hs_ep *p, float *out, const float *in, int64_t per_rank);
void hs_ep_all_to_allv(hs_ep *p, void *out, const int64_t *recv_counts, const void *in,
                       const int64_t *send_counts, hs_dtype dt);

/* The buffers of the TP regions and of CP attention, from the model's
 * allocator (hs_model_par.bind); NULL where the layout needs none. */
typedef struct hs_par_bufs {
    /* TP */
    float *part;    /* [rows,C] fp32 partial sums of a row-parallel output */
    float *red;     /* [rows,C] fp32 reduce-scatter output (sequence parallel) */
    void *local_ln; /* [rows,C] a norm's local rows before the all-gather */
    float *dfull;   /* [rows,C] fp32 gradient gathered to all rows */
    float *stats;   /* [3*head_rows] fp32 row max / sum-exp / target logit */
    float *logits;  /* [2*head_rows, Vg] fp32 gathered logits (loss_parallel off) */
    /* CP: the RoPE tables of the local positions; allgather's whole-sequence
     * K/V, their gathered blocks and fp32 dK/dV; ring's [K | V] blocks in
     * hand and arriving, their fp32 [dK | dV], a block's output and the
     * online-softmax state; the all-to-all methods' send and receive
     * staging (fp32-sized), q, k, v and the output of the rank's heads over
     * the a2a group's rows (cp_ulysses.c) and their fp32 gradients */
    float *cos_l, *sin_l;
    void *kf, *vf, *stage;
    float *dkf, *dvf, *fstage;
    void *ring_kv[2];
    float *ring_dkv[2];
    float *ring_bout, *ring_out, *ring_lse, *ring_blse;
    void *a2a_send, *a2a_recv;
    void *a2a_q, *a2a_k, *a2a_v, *a2a_out;
    float *a2a_dout, *a2a_dq, *a2a_dk, *a2a_dv;
} hs_par_bufs;

/* Expert parallelism of the MoE layers (ep_moe.c): the scratch of one call,
 * shared by the layers, and the host copies of a layer's counts, which size
 * its exchange and reorder its rows: the routing's counts [E], its send and
 * receive counts [E] and the received rows' offsets [EL+1]. Fixed-size
 * count arrays bound the EP group and the experts per rank. */
#define HS_EP_MAX_RANKS 256
#define HS_EP_MAX_LOCAL 1024

typedef struct hs_ep_grow { /* device memory that only grows; contents not kept */
    void *p;
    size_t bytes;
} hs_ep_grow;

typedef struct hs_ep_moe {
    hs_ep_grow stage, dy, a, dh1, dh3;
    int64_t *count_h;
    float *send_h, *recv_h;
    int32_t *off_h;
} hs_ep_moe;

struct hs_parallel {
    hs_parallel_layout l;
    const hs_style_rule *rules;
    int n_rules;
    hs_tp *tp; /* NULL: tp 1, or described without groups */
    hs_cp *cp;
    hs_ep *ep;
    hs_comm *comm;
    hs_stream *stream;
    hs_pg *batch; /* MoE: the ranks whose tokens make one micro-batch (dp x cp) */
    hs_pg *seq;   /* MoE: the ranks holding rows of the same sequences (cp) */
    hs_model_par seam;
    hs_model_dims d; /* what the model bound */
    bool bound;
    bool described; /* hs_parallel_describe: no groups */
    hs_par_bufs b;
    hs_ep_moe moe;
};

/* style.c: place p by the rules (TP or EP), errors naming its FQN. */
bool hs_style_place(const hs_parallel *p, hs_param *q, hs_error *e);
/* Tied embedding and head under one placement, else a config error. */
hs_status hs_style_check_tied(const hs_style_rule *rules, int n, bool tied, hs_error *e);

/* tp_region.c: the seam's TP members. */
void hs_tp_region_fill(hs_model_par *seam);
/* cp_attention.c: the seam's rope_tables and attention members, and the
 * attention calls the methods share: query chunk c (of the two of T local
 * rows at CP rank `rank` of cp) against nk keys from row k0 of a [B, Tk]
 * k/v whose row k0 is at global position gk; the device's attention on the
 * rows of r with the model's scratch (backward: io->delta computed on the
 * first call over the local rows, delta_ready false, reused after). */
void hs_cp_attention_fill(hs_model_par *seam);
hs_att_rows hs_cp_chunk_rows(int cp, int rank, int T, int c, int Tk, int k0, int nk, int64_t gk);
void hs_cp_att_fwd(hs_parallel *p, void *out, hs_dtype odt, float *lse, const hs_attn_io *io,
                   const void *k, const void *v, const hs_att_rows *r);
void hs_cp_att_bwd(hs_parallel *p, float *dk, float *dv, const hs_attn_io *io, const void *k,
                   const void *v, const hs_att_rows *r, bool delta_ready);
/* cp_ring.c: ring attention of io's rows, held in the load-balanced layout
 * of `size` ring ranks (this one `rank`), over p->cp's ring steps. */
void hs_cp_ring_forward(hs_parallel *p, int size, int rank, const hs_attn_io *io);
void hs_cp_ring_backward(hs_parallel *p, int size, int rank, const hs_attn_io *io);
/* cp_ulysses.c: alltoall and alltoall_ring (l.cp_a2a ranks a group). */
void hs_cp_ulysses_forward(hs_parallel *p, const hs_attn_io *io);
void hs_cp_ulysses_backward(hs_parallel *p, const hs_attn_io *io);
/* ep_moe.c: the seam's moe_* members, and their shared buffers. */
void hs_ep_moe_fill(hs_model_par *seam);
hs_status hs_ep_moe_bind(hs_parallel *p, hs_model_alloc_fn alloc, void *actx, hs_error *e);
void hs_ep_moe_unbind(hs_parallel *p);

#endif
