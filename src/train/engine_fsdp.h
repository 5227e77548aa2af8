/* train/engine_fsdp.h — the FSDP engine: the trainer's engine seam
 * (train/engine.h) on top of fsdp.h. */
#ifndef HS_TRAIN_ENGINE_FSDP_H
#define HS_TRAIN_ENGINE_FSDP_H

#include "train/engine.h"

/* Build the model without parameter storage and wrap it (FSDP2Manager):
 * parameters are sharded over the mesh's FSDP groups and initialised from
 * train.seed so that every shard equals the same rows of the one-process
 * init. */
hs_status hs_engine_fsdp_create(const hs_engine_env *env, hs_engine **out, hs_error *e);

#endif
