/* Shared set-up of the optimizer tests: a config with the fields every
 * test fixes (beta1 0.9, eps 1e-8, Muon momentum 0.95 with Nesterov and 5
 * Newton-Schulz steps), and creation that must succeed. */
#ifndef TESTS_UNIT_OPTIM_FIXTURE_H
#define TESTS_UNIT_OPTIM_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "hypershard/optim.h"

static inline hs_optim_config of_config(const char *target, double lr, double beta2, double wd,
                                        const char *decay) {
    hs_optim_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.target, sizeof c.target, "%s", target);
    c.lr = lr;
    c.betas[0] = 0.9, c.betas[1] = beta2;
    c.eps = 1e-8;
    c.weight_decay = wd;
    c.muon.momentum = 0.95, c.muon.nesterov = true, c.muon.ns_steps = 5;
    snprintf(c.schedule.decay, sizeof c.schedule.decay, "%s", decay);
    return c;
}

/* hs_optim_create over n params (state from the heap when pool is NULL);
 * the test fails if it is refused. */
static inline hs_optim *of_create(const hs_optim_config *cfg, const hs_optim_param *params, int n,
                                  hs_pool *pool) {
    hs_optim *o = NULL;
    hs_error e;
    assert_int_equal(hs_optim_create(cfg, params, n, NULL, pool, &o, &e), HS_OK);
    return o;
}

#endif
