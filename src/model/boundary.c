/* The dtypes at unit boundaries (FSDP2 MixedPrecisionPolicy semantics, spec
 * 004 §2.2; docs/model.md "Unit boundaries"), fixed at create time:
 *
 *   c = compute_dtype (param_dtype), o = unit_output_dtype when set.
 *   block i:  input_stored  = dtype of resid[i] (c for block 0: the
 *                             embedding output, inside the root, is in c)
 *             input_read    = c, or input_stored with keep_unit_inputs
 *             output_computed (the residual dtype of the block: x_mid and
 *                             its output) = input_read when it equals c,
 *                             else fp32 (type promotion of c and input_read)
 *             output_stored = o, or output_computed
 *   experts:  input = the dispatched rows of post_attention_layernorm (c, so
 *             no input cast ever); output = expert rows in c, handed on in o
 *   root:     input = token ids; output = fp32 logits, handed on in o
 *
 * With every option off all of these are c (logits fp32) and no cast runs. */
#include <stdlib.h>

#include "model/internal.h"

static hs_dtype promote(hs_dtype a, hs_dtype b) { return a == b ? a : HS_DTYPE_F32; }

static hs_dtype output_of(const hs_model *m, hs_dtype computed) {
    return m->opt.cast_unit_outputs ? m->opt.unit_output_dtype : computed;
}

static void plan_block(const hs_model *m, hs_unit_boundary *b, hs_dtype stream) {
    b->float_input = true;
    b->input_stored = stream;
    b->input_read = m->opt.keep_unit_inputs ? stream : m->dt;
    b->output_computed = promote(b->input_read, m->dt);
    b->output_stored = output_of(m, b->output_computed);
}

static void plan_experts(hs_model *m, hs_unit_boundary *b) {
    b->float_input = true;
    b->input_stored = b->input_read = m->dt;
    b->output_computed = m->dt;
    b->output_stored = output_of(m, m->dt);
}

hs_status hs_model_boundary_plan(hs_model *m, hs_error *e) {
    if (m->opt.cast_unit_outputs && !hs_dtype_is_float(m->opt.unit_output_dtype))
        return hs_error_set(e, HS_ERR_CONFIG,
                            "model options: unit_output_dtype=%d is not a dtype; use float32, "
                            "bfloat16 or float16 (fsdp_config.mix_precision.output_dtype)",
                            (int)m->opt.unit_output_dtype);
    m->bnd = calloc((size_t)m->n_units, sizeof *m->bnd);
    if (!m->bnd) return hs_error_oom(e, "model: %d unit records", m->n_units);
    hs_unit_boundary *root = &m->bnd[0];
    root->input_stored = root->input_read = m->dt;
    root->output_computed = HS_DTYPE_F32;
    root->output_stored = output_of(m, HS_DTYPE_F32);
    m->bnd[m->head_unit] = *root; /* zbv's head root hands on the logits too */
    /* A chunk's first block receives what the model's block before it hands
     * on; every block has the same plan, so replay it up to there. */
    for (int k = 0; k < m->n_chunks; k++) {
        hs_dtype stream = m->chunk_in_dt[k] = hs_model_stream_dtype_at(m, m->chunk_l0[k]);
        for (int i = m->chunk_begin[k]; i < m->chunk_begin[k] + m->chunk_len[k]; i++) {
            hs_unit_boundary *b = &m->bnd[m->blocks[i].unit];
            plan_block(m, b, stream);
            stream = b->output_stored;
            if (m->blocks[i].expert_unit >= 0) plan_experts(m, &m->bnd[m->blocks[i].expert_unit]);
        }
    }
    return HS_OK;
}

hs_dtype hs_model_stream_dtype_at(const hs_model *m, int layer) {
    hs_dtype stream = m->dt;
    for (int i = 0; i < layer; i++) {
        hs_unit_boundary b;
        plan_block(m, &b, stream);
        stream = b.output_stored;
    }
    return stream;
}

hs_dtype hs_model_chunk_stream_dtype(const hs_model *m, int chunk, int j) {
    if (j == 0) return m->chunk_in_dt[chunk];
    return m->bnd[m->blocks[m->chunk_begin[chunk] + j - 1].unit].output_stored;
}

bool hs_model_root_casts(const hs_model *m) {
    return m->bnd[0].output_stored != m->bnd[0].output_computed;
}

const hs_unit_boundary *hs_model_unit_boundary(const hs_model *m, int u) {
    HS_ASSERT(u >= 0 && u < m->n_units);
    return &m->bnd[u];
}
