/* hypershard-cudnn.so: causal grouped-query attention on the tensor cores
 * through cuDNN's fused SDPA graphs (cudnn-frontend), forward and the
 * deterministic backward, a graph per shape and direction built on first
 * use and cached on the device's context (cudnn_sdpa.h). Nothing here is
 * global: the context is the caller's, and the cache's lock is its own. */
#include "device/cudnn_sdpa.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include <cudnn.h>
#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;

namespace {

using tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

/* One direction of one shape: its graph and the tensors execute binds,
 * or the reason cuDNN refused it. */
struct plan {
    std::shared_ptr<fe::graph::Graph> graph;
    tensor q, k, v, o, stats, dout, dq, dk, dv;
    int64_t workspace = 0;
    std::string refused;
};

using plan_key = std::tuple<int, int, int, int, int, int, int>; /* bwd B NH KVH T HD dt */

void say(char *why, size_t n, const std::string &s) {
    if (why && n) std::snprintf(why, n, "%s", s.c_str());
}

} // namespace

struct hs_cudnn_sdpa {
    cudnnHandle_t handle = nullptr;
    std::mutex lock; /* the cache and the handle's stream */
    std::map<plan_key, std::unique_ptr<plan>> plans;
    char version[96] = {0};
};

namespace {

fe::DataType_t io_type(int dt) { return dt == 2 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16; }

/* [B, H, T, HD] over a row-major [B, T, H*HD] buffer. */
tensor bshd(fe::graph::Graph &g, const char *name, int64_t B, int64_t H, int64_t T, int64_t HD) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_dim({B, H, T, HD})
                        .set_stride({T * H * HD, HD, H * HD, 1}));
}

void as_bshd(const tensor &t, int64_t B, int64_t H, int64_t T, int64_t HD) {
    t->set_output(true).set_dim({B, H, T, HD}).set_stride({T * H * HD, HD, H * HD, 1});
}

/* d's graph in one direction, its tensors in p: described, not built; for
 * compute capability sm, or (0) the current GPU's. */
std::shared_ptr<fe::graph::Graph> describe(const hs_cudnn_sdpa_dims *d, bool bwd, int sm, plan *p) {
    auto g = std::make_shared<fe::graph::Graph>();
    if (sm > 0) g->set_sm_version(sm); /* before the nodes: they read it */
    g->set_io_data_type(io_type(d->dt))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    int64_t B = d->B, NH = d->NH, KVH = d->KVH, T = d->T, HD = d->HD;
    float scale = 1.0f / std::sqrt((float)HD);
    p->q = bshd(*g, "q", B, NH, T, HD);
    p->k = bshd(*g, "k", B, KVH, T, HD);
    p->v = bshd(*g, "v", B, KVH, T, HD);
    if (!bwd) {
        auto opt = fe::graph::SDPA_attributes()
                       .set_name("hs_sdpa_fwd")
                       .set_generate_stats(true)
                       .set_causal_mask(true)
                       .set_attn_scale(scale);
        auto [o, stats] = g->sdpa(p->q, p->k, p->v, opt);
        p->o = o;
        p->stats = stats;
        as_bshd(o, B, NH, T, HD);
    } else {
        p->o = bshd(*g, "o", B, NH, T, HD);
        p->dout = bshd(*g, "dout", B, NH, T, HD);
        p->stats = g->tensor(fe::graph::Tensor_attributes()
                                 .set_name("stats")
                                 .set_dim({B, NH, T, 1})
                                 .set_stride({NH * T, T, 1, 1})
                                 .set_data_type(fe::DataType_t::FLOAT));
        auto opt = fe::graph::SDPA_backward_attributes()
                       .set_name("hs_sdpa_bwd")
                       .set_causal_mask(true)
                       .set_attn_scale(scale)
                       .set_deterministic_algorithm(true);
        auto [dq, dk, dv] = g->sdpa_backward(p->q, p->k, p->v, p->o, p->dout, p->stats, opt);
        p->dq = dq;
        p->dk = dk;
        p->dv = dv;
        as_bshd(dq, B, NH, T, HD);
        as_bshd(dk, B, KVH, T, HD);
        as_bshd(dv, B, KVH, T, HD);
    }
    if (!bwd) {
        p->stats->set_output(true)
            .set_data_type(fe::DataType_t::FLOAT)
            .set_dim({B, NH, T, 1})
            .set_stride({NH * T, T, 1, 1});
    }
    return g;
}

std::string what_of(const hs_cudnn_sdpa_dims *d, bool bwd) {
    return std::string("cuDNN's ") + (bwd ? "backward" : "forward") + " graph for B " +
           std::to_string(d->B) + ", heads " + std::to_string(d->NH) + "/" +
           std::to_string(d->KVH) + ", T " + std::to_string(d->T) + ", head dim " +
           std::to_string(d->HD);
}

/* Builds d's graph in one direction; p->refused says why when it cannot. */
void build(hs_cudnn_sdpa *c, const hs_cudnn_sdpa_dims *d, bool bwd, plan *p) {
    auto g = describe(d, bwd, 0, p);
    const char *stage = "validate";
    fe::error_t err = g->validate();
    if (err.is_good()) stage = "build_operation_graph", err = g->build_operation_graph(c->handle);
    if (err.is_good())
        stage = "create_execution_plans",
        err = g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    const int64_t cap = hs_cudnn_sdpa_workspace_cap(d, bwd);
    if (err.is_good()) g->deselect_workspace_greater_than(cap);
    if (err.is_good()) stage = "check_support", err = g->check_support(c->handle);
    if (err.is_good()) stage = "build_plans", err = g->build_plans(c->handle);
    if (err.is_good()) stage = "get_workspace_size", err = g->get_workspace_size(p->workspace);
    if (!err.is_good()) {
        p->refused = what_of(d, bwd) + " failed at " + stage + ": " + err.get_message();
        return;
    }
    if (p->workspace > cap) {
        p->refused = what_of(d, bwd) + " wants " + std::to_string(p->workspace) +
                     " bytes of workspace, above its bound of " + std::to_string(cap);
        return;
    }
    p->graph = g;
}

/* The frontend's validation of d's graph for a GPU of compute capability
 * sm (90: Hopper), without a GPU or a handle. */
int check(const hs_cudnn_sdpa_dims *d, int bwd, int sm, char *why, size_t n) {
    try {
        plan p;
        auto g = describe(d, bwd != 0, sm, &p);
        fe::error_t err = g->validate();
        if (err.is_good()) return 0;
        say(why, n, what_of(d, bwd != 0) + " failed at validate: " + err.get_message());
    } catch (const std::exception &ex) {
        say(why, n, std::string("cuDNN graph description threw: ") + ex.what());
    }
    return 1;
}

/* d's plan in one direction, built on first use; NULL with why when cuDNN
 * refused it. Called with c->lock held. */
plan *plan_of(hs_cudnn_sdpa *c, const hs_cudnn_sdpa_dims *d, bool bwd, char *why, size_t n) {
    plan_key key{bwd, d->B, d->NH, d->KVH, d->T, d->HD, d->dt};
    auto it = c->plans.find(key);
    if (it == c->plans.end()) {
        auto p = std::make_unique<plan>();
        try {
            build(c, d, bwd, p.get());
        } catch (const std::exception &ex) {
            p->graph.reset();
            p->refused = std::string("cuDNN graph build threw: ") + ex.what();
        }
        it = c->plans.emplace(key, std::move(p)).first;
    }
    if (!it->second->graph) {
        say(why, n, it->second->refused);
        return nullptr;
    }
    return it->second.get();
}

int run(hs_cudnn_sdpa *c, void *st, plan *p, std::unordered_map<tensor, void *> &bind, void *ws,
        char *why, size_t n) {
    cudnnStatus_t s = cudnnSetStream(c->handle, static_cast<cudaStream_t>(st));
    if (s != CUDNN_STATUS_SUCCESS) {
        say(why, n, std::string("cudnnSetStream: ") + cudnnGetErrorString(s));
        return 1;
    }
    fe::error_t err = p->graph->execute(c->handle, bind, ws);
    if (!err.is_good()) {
        say(why, n, "cuDNN SDPA execute: " + err.get_message());
        return 1;
    }
    return 0;
}

int create(hs_cudnn_sdpa **out, char *why, size_t n) {
    *out = nullptr;
    try {
        auto c = std::make_unique<hs_cudnn_sdpa>();
        size_t v = cudnnGetVersion();
        /* The fused SDPA backward with GQA and the deterministic algorithm
         * need cuDNN 9. */
        if (v < 90000) {
            say(why, n, "cuDNN " + std::to_string(v) + " is older than 9.0");
            return 1;
        }
        cudnnStatus_t s = cudnnCreate(&c->handle);
        if (s != CUDNN_STATUS_SUCCESS) {
            say(why, n, std::string("cudnnCreate: ") + cudnnGetErrorString(s));
            return 1;
        }
        std::snprintf(c->version, sizeof c->version, "cuDNN %zu.%zu.%zu (frontend %d.%d.%d)",
                      v / 10000, v / 100 % 100, v % 100, CUDNN_FRONTEND_MAJOR_VERSION,
                      CUDNN_FRONTEND_MINOR_VERSION, CUDNN_FRONTEND_PATCH_VERSION);
        *out = c.release();
        return 0;
    } catch (const std::exception &ex) {
        say(why, n, std::string("cuDNN set-up threw: ") + ex.what());
        return 1;
    }
}

void destroy(hs_cudnn_sdpa *c) {
    if (!c) return;
    c->plans.clear();
    if (c->handle) cudnnDestroy(c->handle);
    delete c;
}

const char *version(const hs_cudnn_sdpa *c) { return c->version; }

int workspace(hs_cudnn_sdpa *c, const hs_cudnn_sdpa_dims *d, int bwd, int64_t *bytes, char *why,
              size_t n) {
    try {
        std::lock_guard<std::mutex> hold(c->lock);
        plan *p = plan_of(c, d, bwd != 0, why, n);
        if (!p) return 1;
        *bytes = p->workspace;
        return 0;
    } catch (const std::exception &ex) {
        say(why, n, std::string("cuDNN SDPA set-up threw: ") + ex.what());
        return 1;
    }
}

/* The pointers of one call, in the plan's tensor order: q, k, v, o,
 * stats, dout, dq, dk, dv (the forward's last four unused). */
int execute(hs_cudnn_sdpa *c, void *st, const hs_cudnn_sdpa_dims *d, bool bwd,
            void *const (&ptr)[9], void *ws, char *why, size_t n) {
    try {
        std::lock_guard<std::mutex> hold(c->lock);
        plan *p = plan_of(c, d, bwd, why, n);
        if (!p) return 1;
        const tensor *order[9] = {&p->q,    &p->k,  &p->v,  &p->o, &p->stats,
                                  &p->dout, &p->dq, &p->dk, &p->dv};
        std::unordered_map<tensor, void *> bind;
        for (int i = 0; i < 9; i++)
            if (*order[i]) bind.emplace(*order[i], ptr[i]);
        return run(c, st, p, bind, ws, why, n);
    } catch (const std::exception &ex) {
        say(why, n,
            std::string("cuDNN SDPA ") + (bwd ? "backward" : "forward") + " threw: " + ex.what());
        return 1;
    }
}

int fwd(hs_cudnn_sdpa *c, void *st, const hs_cudnn_sdpa_dims *d, void *out, float *stats,
        const void *q, const void *k, const void *v, void *ws, char *why, size_t n) {
    void *const ptr[9] = {const_cast<void *>(q), const_cast<void *>(k), const_cast<void *>(v), out,
                          stats};
    return execute(c, st, d, false, ptr, ws, why, n);
}

int bwd(hs_cudnn_sdpa *c, void *st, const hs_cudnn_sdpa_dims *d, void *dq, void *dk, void *dv,
        const void *q, const void *k, const void *v, const void *out, const void *dout,
        const float *stats, void *ws, char *why, size_t n) {
    void *const ptr[9] = {const_cast<void *>(q),
                          const_cast<void *>(k),
                          const_cast<void *>(v),
                          const_cast<void *>(out),
                          const_cast<float *>(stats),
                          const_cast<void *>(dout),
                          dq,
                          dk,
                          dv};
    return execute(c, st, d, true, ptr, ws, why, n);
}

const hs_cudnn_sdpa_ops api = {create, destroy, version, workspace, fwd, bwd, check};

} // namespace

extern "C" __attribute__((visibility("default"))) const hs_cudnn_sdpa_ops *hs_cudnn_sdpa_api(void) {
    return &api;
}
