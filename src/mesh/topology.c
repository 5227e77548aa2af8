/* The rank layout as pure arithmetic: derive and check the sizes, map a
 * world rank to its coordinates, and enumerate the members of every group.
 * hs_mesh_create and `hypershard mesh` both read the layout from here, so
 * the groups the runtime builds are the groups the table shows. */
#include <string.h>

#include "hypershard/mesh.h"

static const char *const dim_names[] = {
    [HS_DIM_PP] = "pp",
    [HS_DIM_DP] = "dp",
    [HS_DIM_CP] = "cp",
    [HS_DIM_TP] = "tp",
    [HS_DIM_DP_CP] = "dp_cp",
    [HS_DIM_FSDP_REPLICATE] = "fsdp_replicate",
    [HS_DIM_FSDP_SHARD] = "fsdp_shard",
    [HS_DIM_FSDP] = "fsdp",
    [HS_DIM_EDP_REPLICATE] = "edp_replicate",
    [HS_DIM_EDP_SHARD] = "edp_shard",
    [HS_DIM_EDP] = "edp",
    [HS_DIM_EP] = "ep",
};
_Static_assert(sizeof(dim_names) / sizeof(dim_names[0]) == HS_DIM_COUNT,
               "dim_names must follow hs_mesh_dim");

const char *hs_mesh_dim_name(hs_mesh_dim d) {
    return (d >= 0 && d < HS_DIM_COUNT) ? dim_names[d] : "unknown";
}

/* ------------------------------------------------------------- derivation */

/* "1, 2, 4, 8": the values that would satisfy a divisibility rule. */
static const char *divisors_of(int n, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (int d = 1; d <= n && used + 1 < cap; d++) {
        if (n % d) continue;
        int w = snprintf(buf + used, cap - used, "%s%d", used ? ", " : "", d);
        if (w < 0 || (size_t)w >= cap - used) break;
        used += (size_t)w;
    }
    return buf;
}

static bool check_size(int v, const char *path, const char *fix, hs_error *e) {
    if (v >= 1) return true;
    hs_error_append(e, HS_ERR_CONFIG, "%s=%d must be >= 1; %s", path, v, fix);
    return false;
}

/* The arithmetic alone: fills every size whose inputs divide evenly and
 * leaves the rest 0, so the messages can name what is known. */
static void derive_sizes(hs_topology *t) {
    int model = t->tp * t->cp * t->pp;
    if (t->world % model) return;
    t->dp = t->world / model;
    t->fsdp_dp = t->dp * t->cp;
    t->expert_domain = t->fsdp_dp * t->tp;
    if (t->dp_shard >= 1 && t->fsdp_dp % t->dp_shard == 0)
        t->dp_replicate = t->fsdp_dp / t->dp_shard;
    if (t->expert_domain % t->ep) return;
    t->edp = t->expert_domain / t->ep;
    if (t->edp_shard >= 1 && t->edp % t->edp_shard == 0) t->edp_replicate = t->edp / t->edp_shard;
}

/* Rules 1 and 2. */
static void check_shard_sizes(const hs_topology *t, hs_error *e) {
    char ok[256];
    if (t->dp_shard < 1)
        hs_error_append(e, HS_ERR_CONFIG,
                        "fsdp_config.dp_shard_size=%d must be >= 1; use 1 for pure replication "
                        "or a divisor of the DP×CP domain%s%s",
                        t->dp_shard, t->fsdp_dp ? ": " : "",
                        t->fsdp_dp ? divisors_of(t->fsdp_dp, ok, sizeof ok) : "");
    if (t->edp_shard < 1)
        hs_error_append(e, HS_ERR_CONFIG,
                        "fsdp_config.edp_shard_size=%d must be >= 1; use 1 for no expert "
                        "sharding or a divisor of the EDP size%s%s",
                        t->edp_shard, t->edp ? ": " : "",
                        t->edp ? divisors_of(t->edp, ok, sizeof ok) : "");
}

/* Rules 4 and 5: the dense side. */
static void check_dense(const hs_topology *t, hs_error *e) {
    char ok[256];
    int model = t->tp * t->cp * t->pp;
    if (!t->dp) {
        hs_error_append(e, HS_ERR_CONFIG,
                        "world size %d is not divisible by accelerator.tp_size × cp_size × "
                        "pp_size = %d (tp=%d, cp=%d, pp=%d); use a world size that is a "
                        "multiple of %d or change the sizes",
                        t->world, model, t->tp, t->cp, t->pp, model);
        return;
    }
    if (t->dp_shard >= 1 && !t->dp_replicate)
        hs_error_append(e, HS_ERR_CONFIG,
                        "fsdp_config.dp_shard_size=%d does not divide the DP×CP domain of %d "
                        "(dp=%d, cp=%d); use one of %s",
                        t->dp_shard, t->fsdp_dp, t->dp, t->cp,
                        divisors_of(t->fsdp_dp, ok, sizeof ok));
}

/* Rules 6 and 7: the expert side, once the expert domain is known. */
static void check_expert(const hs_topology *t, hs_error *e) {
    char ok[256];
    if (!t->expert_domain) return;
    if (!t->edp) {
        hs_error_append(e, HS_ERR_CONFIG,
                        "accelerator.ep_size=%d does not divide the expert domain dp×cp×tp = %d "
                        "(dp=%d, cp=%d, tp=%d); use one of %s",
                        t->ep, t->expert_domain, t->dp, t->cp, t->tp,
                        divisors_of(t->expert_domain, ok, sizeof ok));
        return;
    }
    if (t->edp_shard >= 1 && !t->edp_replicate)
        hs_error_append(e, HS_ERR_CONFIG,
                        "fsdp_config.edp_shard_size=%d does not divide the EDP size %d (expert "
                        "domain dp×cp×tp = %d / accelerator.ep_size = %d); use one of %s",
                        t->edp_shard, t->edp, t->expert_domain, t->ep,
                        divisors_of(t->edp, ok, sizeof ok));
}

hs_status hs_topology_derive(hs_topology *t, int world, int tp, int cp, int ep, int pp,
                             int dp_shard, int edp_shard, hs_error *e) {
    *t = (hs_topology){.world = world,
                       .tp = tp,
                       .cp = cp,
                       .ep = ep,
                       .pp = pp,
                       .dp_shard = dp_shard,
                       .edp_shard = edp_shard};
    /* Collected apart from `e` so the caller's earlier lines (other config
     * rules) are kept and this call still knows whether it found anything. */
    hs_error local;
    hs_error_clear(&local);
    bool sizes = world >= 1;
    if (!sizes)
        hs_error_append(&local, HS_ERR_CONFIG,
                        "world size %d must be >= 1; start at least one rank", world);
    sizes &= check_size(tp, "accelerator.tp_size", "use 1 for no tensor parallelism", &local);
    sizes &= check_size(cp, "accelerator.cp_size", "use 1 for no context parallelism", &local);
    sizes &= check_size(ep, "accelerator.ep_size", "use 1 for no expert parallelism", &local);
    sizes &= check_size(pp, "accelerator.pp_size", "use 1 for no pipeline parallelism", &local);
    if (sizes) derive_sizes(t);
    /* In the spec's rule order: 1, 2, 4, 5, 6, 7. */
    check_shard_sizes(t, &local);
    if (sizes) check_dense(t, &local);
    check_expert(t, &local);
    if (local.code == HS_OK) return HS_OK;
    char *save = NULL;
    for (char *line = strtok_r(local.msg, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        hs_error_append(e, HS_ERR_CONFIG, "%s", line);
    return HS_ERR_CONFIG;
}

static bool topology_valid(const hs_topology *t) {
    return t->dp > 0 && t->dp_replicate > 0 && t->edp_replicate > 0;
}

static int expert_active(const hs_topology *t) { return t->ep > 1 && t->edp > 1; }

bool hs_topology_fsdp_active(const hs_topology *t, char *why, size_t cap) {
    char buf[256];
    bool active = false;
    if (!topology_valid(t)) {
        snprintf(buf, sizeof buf, "skipped: the topology is invalid (see the errors above)");
    } else if (t->world == 1) {
        snprintf(buf, sizeof buf, "skipped: world size 1");
    } else if (t->fsdp_dp == 1 && !expert_active(t)) {
        if (t->pp > 1)
            snprintf(buf, sizeof buf,
                     "skipped: no FSDP domain (dp×cp = 1; tp=%d × pp=%d uses every rank)", t->tp,
                     t->pp);
        else
            snprintf(buf, sizeof buf, "skipped: no FSDP domain (dp×cp = 1; tp=%d uses every rank)",
                     t->tp);
    } else {
        active = true;
        int n = snprintf(buf, sizeof buf, "FSDP: shard %d × replicate %d over dp×cp = %d",
                         t->dp_shard, t->dp_replicate, t->fsdp_dp);
        if (expert_active(t) && n > 0 && (size_t)n < sizeof buf)
            snprintf(buf + n, sizeof buf - (size_t)n,
                     "; experts: shard %d × replicate %d over edp = %d (ep=%d)", t->edp_shard,
                     t->edp_replicate, t->edp, t->ep);
    }
    if (why && cap) snprintf(why, cap, "%s", buf);
    return active;
}

/* ------------------------------------------------------------ coordinates */

hs_coords hs_topology_coords(const hs_topology *t, int world_rank) {
    HS_ASSERT(topology_valid(t));
    HS_ASSERT(world_rank >= 0 && world_rank < t->world);
    hs_coords c;
    int r = world_rank;
    c.tp = r % t->tp, r /= t->tp;
    c.cp = r % t->cp, r /= t->cp;
    c.dp = r % t->dp, r /= t->dp;
    c.pp = r;
    int f = c.dp * t->cp + c.cp;
    c.fsdp_shard = f % t->dp_shard;
    c.fsdp_replicate = f / t->dp_shard;
    int x = f * t->tp + c.tp;
    c.ep = x % t->ep;
    int edp_i = x / t->ep;
    c.edp_shard = edp_i % t->edp_shard;
    c.edp_replicate = edp_i / t->edp_shard;
    return c;
}

/* Every group is the set of ranks sharing all coordinates but the dim's own;
 * `index` numbers the groups densely, `key` is the rank within the group. */
typedef struct group_pos {
    int index, key;
} group_pos;

static group_pos group_position(const hs_topology *t, hs_mesh_dim dim, int world_rank) {
    hs_coords c = hs_topology_coords(t, world_rank);
    int f = c.dp * t->cp + c.cp;
    int edp_i = c.edp_replicate * t->edp_shard + c.edp_shard;
    int stage_tp = c.pp * t->tp + c.tp;
    int stage_ep = c.pp * t->ep + c.ep;
    switch (dim) {
    case HS_DIM_PP: return (group_pos){world_rank % (t->dp * t->cp * t->tp), c.pp};
    case HS_DIM_DP: return (group_pos){(c.pp * t->cp + c.cp) * t->tp + c.tp, c.dp};
    case HS_DIM_CP: return (group_pos){(c.pp * t->dp + c.dp) * t->tp + c.tp, c.cp};
    case HS_DIM_TP: return (group_pos){world_rank / t->tp, c.tp};
    case HS_DIM_DP_CP:
    case HS_DIM_FSDP: return (group_pos){stage_tp, f};
    case HS_DIM_FSDP_REPLICATE:
        return (group_pos){stage_tp * t->dp_shard + c.fsdp_shard, c.fsdp_replicate};
    case HS_DIM_FSDP_SHARD:
        return (group_pos){stage_tp * t->dp_replicate + c.fsdp_replicate, c.fsdp_shard};
    case HS_DIM_EDP_REPLICATE:
        return (group_pos){stage_ep * t->edp_shard + c.edp_shard, c.edp_replicate};
    case HS_DIM_EDP_SHARD:
        return (group_pos){stage_ep * t->edp_replicate + c.edp_replicate, c.edp_shard};
    case HS_DIM_EDP: return (group_pos){stage_ep, edp_i};
    case HS_DIM_EP: return (group_pos){c.pp * t->edp + edp_i, c.ep};
    default: hs_panic("unknown mesh dim %d", (int)dim);
    }
}

static int group_size(const hs_topology *t, hs_mesh_dim dim) {
    switch (dim) {
    case HS_DIM_PP: return t->pp;
    case HS_DIM_DP: return t->dp;
    case HS_DIM_CP: return t->cp;
    case HS_DIM_TP: return t->tp;
    case HS_DIM_DP_CP:
    case HS_DIM_FSDP: return t->fsdp_dp;
    case HS_DIM_FSDP_REPLICATE: return t->dp_replicate;
    case HS_DIM_FSDP_SHARD: return t->dp_shard;
    case HS_DIM_EDP_REPLICATE: return t->edp_replicate;
    case HS_DIM_EDP_SHARD: return t->edp_shard;
    case HS_DIM_EDP: return t->edp;
    case HS_DIM_EP: return t->ep;
    default: hs_panic("unknown mesh dim %d", (int)dim);
    }
}

int hs_topology_group_count(const hs_topology *t, hs_mesh_dim dim) {
    HS_ASSERT(topology_valid(t));
    return t->world / group_size(t, dim);
}

int hs_topology_group_index(const hs_topology *t, hs_mesh_dim dim, int world_rank) {
    return group_position(t, dim, world_rank).index;
}

int hs_topology_group_rank(const hs_topology *t, hs_mesh_dim dim, int world_rank) {
    return group_position(t, dim, world_rank).key;
}

int hs_topology_group_ranks(const hs_topology *t, hs_mesh_dim dim, int world_rank, int *out) {
    int index = group_position(t, dim, world_rank).index;
    int n = 0;
    for (int r = 0; r < t->world; r++) {
        group_pos p = group_position(t, dim, r);
        if (p.index != index) continue;
        HS_ASSERT(p.key >= 0 && p.key < group_size(t, dim));
        out[p.key] = r;
        n++;
    }
    HS_ASSERT(n == group_size(t, dim));
    return n;
}

void hs_topology_groups(const hs_topology *t, hs_mesh_dim dim, int *out) {
    int size = group_size(t, dim);
    for (int r = 0; r < t->world; r++) {
        group_pos p = group_position(t, dim, r);
        out[(int64_t)p.index * size + p.key] = r;
    }
}
