/* Private to src/optim/: the optimizer object and the per-rule kernels. */
#ifndef HS_OPTIM_IMPL_H
#define HS_OPTIM_IMPL_H

#include "hypershard/device.h"
#include "hypershard/optim.h"

#define HS_OPTIM_MAX_STATES 2

typedef enum optim_rule { OPTIM_RULE_ADAMW = 0, OPTIM_RULE_MUON } optim_rule;

typedef struct optim_slot {
    hs_optim_param p; /* fqn points at `fqn_copy` */
    char *fqn_copy;
    optim_rule rule;
    int n_states;
    float *state[HS_OPTIM_MAX_STATES]; /* fp32, p.numel each, from the pool */
} optim_slot;

struct hs_optim {
    hs_optim_config cfg;
    hs_device *dev;
    hs_device *own_dev; /* created when the caller passes no device */
    hs_pool *pool;
    hs_pool own_pool; /* used when the caller passes no pool */
    int n;
    optim_slot *slots;
    int64_t step;
    float *muon_work;       /* direction + orthogonalised update + NS scratch */
    hs_adamw_tensor *adamw; /* a step's adamw_many table, room for n */
};

/* Per-step AdamW scalars, computed once per step in double as torch does
 * with Python floats; the element loop is the device layer's. */
typedef hs_adamw_hparams adamw_coef;

adamw_coef hs_adamw_coef(const hs_optim_config *cfg, int64_t step, double lr, bool decay);

/* Floats of work space one Muon step of this param needs. */
int64_t hs_muon_work_floats(const hs_optim_param *p);
hs_status hs_muon_step_param(hs_device *d, const hs_optim_config *cfg, const hs_optim_param *p,
                             float *momentum, double lr, float *work, hs_error *e);

#endif
