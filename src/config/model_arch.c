/* What each model.arch builds, asked by every layer that depends on it, so
 * the families are named in one place. */
#include <string.h>

#include "hypershard/config.h"

bool hs_model_arch_moe(const hs_model_config *m) { return !strcmp(m->arch, "moe"); }

bool hs_model_arch_qk_norm(const hs_model_config *m) { return !strcmp(m->arch, "qwen3"); }

int hs_model_head_dim(const hs_model_config *m) {
    if (m->head_dim > 0) return m->head_dim;
    return m->n_heads > 0 ? m->dim / m->n_heads : 0;
}
