/* What train.reproducibility asks, for every layer that acts on it (the
 * model's sums, the comm's reductions, the GEMM rows, FSDP's trees, the
 * trainer and the config rules). */
#include <string.h>

#include "hypershard/config.h"

bool hs_train_layout_invariant(const hs_train_config *t) {
    return !strcmp(t->reproducibility, "layout");
}
