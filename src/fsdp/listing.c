/* The unit listing: what FSDP wrapped, as one JSON object per rank — every
 * unit with its parameters, the mesh each is sharded on and the shard
 * shapes actually allocated. Tests read it to check where parameters live
 * (routed experts only in expert units under EP) and the real shard
 * degrees (from the shapes, not the config), and the world ranks of each
 * parameter's shard and replicate groups (a pipeline stage's are its own). */
#include "fsdp/manager.h"

static void shape(hs_json *j, const char *key, int ndim, const int64_t *s) {
    hs_json_key(j, key);
    hs_json_begin_array(j);
    for (int d = 0; d < ndim; d++) hs_json_int(j, s[d]);
    hs_json_end_array(j);
}

/* The world ranks of a group in group-rank order ([] without one). */
static void members(hs_json *j, const char *key, hs_pg *g) {
    hs_json_key(j, key);
    hs_json_begin_array(j);
    for (int r = 0; g && r < hs_pg_size(g); r++) hs_json_int(j, hs_pg_world_rank(g, r));
    hs_json_end_array(j);
}

static void param(hs_json *j, const hs_fsdp_param *fp) {
    const hs_param *p = fp->p;
    hs_json_begin_object(j);
    hs_json_kv_string(j, "fqn", p->fqn);
    hs_json_kv_string(j, "mesh", p->on_ep_mesh ? "fsdp_moe_mesh" : "fsdp_non_moe_mesh");
    hs_json_kv_string(j, "kind", hs_fsdp_mesh_kind_name(fp->mi.kind));
    hs_json_kv_string(j, "shard_group", fp->mi.shard_pg ? hs_pg_name(fp->mi.shard_pg) : "");
    hs_json_kv_int(j, "shard_degree", fp->mi.shard_size);
    hs_json_kv_int(j, "replicate_degree", fp->mi.replicate_size);
    hs_json_kv_int(j, "ep_degree", p->on_ep_mesh ? fp->mi.ep_size : 1);
    members(j, "shard_ranks", fp->mi.shard_pg);
    members(j, "replicate_ranks", fp->mi.replicate_pg);
    shape(j, "shape", p->ndim, p->shape);
    shape(j, "local_shape", p->ndim, p->local_shape);
    shape(j, "local_offset", p->ndim, p->local_offset);
    shape(j, "shard_shape", fp->plan.ndim, fp->plan.actual_sharded_shape);
    hs_json_kv_int(j, "shard_row_offset", fp->plan.layout.row_offset);
    hs_json_end_object(j);
}

void hs_fsdp_write_units(const hs_fsdp *f, FILE *out) {
    hs_json j;
    hs_json_init(&j, out);
    hs_json_begin_object(&j);
    hs_json_kv_int(&j, "dense_shard_degree", f->groups.shard_size);
    hs_json_kv_int(&j, "expert_shard_degree", f->groups.ep_size > 1 ? f->groups.edp_shard_size : 0);
    hs_json_key(&j, "units");
    hs_json_begin_array(&j);
    for (int u = 0; u < f->ctx.n_units; u++) {
        const hs_fsdp_unit *unit = &f->ctx.units[u];
        hs_json_begin_object(&j);
        hs_json_kv_string(&j, "name", unit->index == 0 ? "(root)" : unit->name);
        hs_json_kv_bool(&j, "expert", unit->is_expert);
        hs_json_key(&j, "params");
        hs_json_begin_array(&j);
        for (int i = 0; i < unit->n_params; i++) param(&j, unit->params[i]);
        hs_json_end_array(&j);
        hs_json_end_object(&j);
    }
    hs_json_end_array(&j);
    hs_json_end_object(&j);
    fputc('\n', out);
}
