/* config/checks.h — the rule groups of hs_config_validate (rules.c,
 * sizes.c, warn.c), private to config/. */
#ifndef HS_CONFIG_CHECKS_H
#define HS_CONFIG_CHECKS_H

#include "config/config_internal.h"

/* Model shape: heads divide dim, kv heads divide heads, even head dim, top_k. */
void hs_cfg_check_model(const hs_config *c, hs_cfg_report *rep);
/* Data, evaluation and checkpoint settings. */
void hs_cfg_check_run(const hs_config *c, hs_cfg_report *rep);
/* Pipeline rules that need no topology: accelerator.pp_layers against
 * pp_size and model.n_layers, and what stages cannot share yet (MoE
 * statistics, tied embeddings). */
void hs_cfg_check_pp(const hs_config *c, hs_cfg_report *rep);
/* Rules that need the topology: batch split, TP/CP/EP/PP vs model shape,
 * micro-batches for the 1F1B schedule. */
void hs_cfg_check_parallel(const hs_config *c, const hs_topology *t, hs_cfg_report *rep);
/* The products of the sizes (parameters, activations, a step's traffic,
 * the pipeline schedule) against the int64 counts that hold them; `t` NULL
 * when the topology is invalid (the per-step products are then skipped). */
void hs_cfg_check_sizes(const hs_config *c, const hs_topology *t, hs_cfg_report *rep);
/* Spec §4.2: one warning per key that is set but can have no effect
 * (HS_ERR_OOM without memory for the defaults it compares with). */
hs_status hs_cfg_warn(const hs_config *c, const hs_topology *t, const hs_log *log, hs_error *e);

#endif
