/* The trainer: build everything a run needs in an order that leaves nothing
 * on disk when any input is wrong, train train.steps optimizer steps, then
 * evaluate, sample, save the weights and write the trace. */
#include <stdlib.h>
#include <string.h>

#include "train/run.h"

/* An allocation the device refused and its caller could not report (the
 * model's buffers) is the cause of whatever failed after it; an
 * out-of-memory error already reported keeps its own, nearer message. */
static hs_status device_cause(hs_trainer *t, hs_status s, hs_error *e) {
    hs_error de;
    if (s == HS_ERR_OOM || hs_device_status(t->dev, &de) == HS_OK) return s;
    *e = de;
    return de.code;
}

/* Whether every parameter will be set from a file before the first step:
 * --init-from, or a checkpoint that checkpoint.resume finds. Only a saving:
 * a rank that answers otherwise draws the random init, which the load
 * overwrites all the same, and a resolution that fails here fails again,
 * with its message, where the checkpoint is loaded. */
static bool weights_from_file(const hs_trainer *t) {
    if (t->opt && t->opt->init_from) return true;
    char path[HS_PATH_MAX];
    bool found = false;
    hs_error e;
    hs_error_clear(&e);
    return hs_ckpt_resolve_resume(&t->cfg->checkpoint, path, sizeof path, &found, &e) == HS_OK &&
           found;
}

static hs_status trainer_build_model(hs_trainer *t, hs_error *e) {
    hs_engine_env env = {.cfg = t->cfg,
                         .topo = t->topo,
                         .comm = t->comm,
                         .mesh = t->mesh,
                         .dev = t->dev,
                         .log = t->log,
                         .max_batch = t->mbs,
                         .stage = t->stage,
                         .act_slots = t->act_slots,
                         .weights_from_file = weights_from_file(t),
                         .inference = t->opt && t->opt->inference};
    hs_status s = hs_engine_create(&env, &t->engine, e);
    if (s != HS_OK) return s;
    hs_model *m = hs_engine_catalog(t->engine);
    int n = hs_model_num_params(m);
    const char **fqns = malloc(sizeof(char *) * (size_t)(n ? n : 1));
    if (!fqns) return hs_error_oom(e, "trainer: cannot allocate");
    for (int i = 0; i < n; i++) fqns[i] = hs_model_param(m, i)->fqn;
    s = hs_config_check_fqns(&t->cfg->fsdp, fqns, n, e);
    free(fqns);
    if (s == HS_OK) s = hs_train_freeze_check(t->cfg, m, e);
    if (s == HS_OK && t->opt && t->opt->init_from) {
        /* a run that only reads its weights takes them where the file maps
         * them (the local engine, fp32: hs_engine_borrow_param) */
        hs_param_borrow_fn borrow = t->opt->inference ? hs_engine_borrow_param : NULL;
        s = hs_hf_load_borrowing(m, t->opt->init_from, hs_engine_set_param, borrow, t->engine,
                                 &t->weights_file, e);
        if (s == HS_OK)
            hs_log_info(t->log, "loaded weights from %s%s", t->opt->init_from,
                        t->weights_file ? " (read where the file maps them)" : "");
    }
    if (s != HS_OK) return s;
    if (t->opt && t->opt->inference) return HS_OK; /* no step: no optimizer */
    t->n_oparams = t->engine->optim_params(t->engine, &t->oparams);
    /* Under offload the optimizer steps on the host copies of the shards,
     * so its state lives in the host pool with them. */
    hs_pool *opool = t->cfg->fsdp.enable_offload ? &t->dev->host_pool : &t->dev->device_pool;
    return hs_optim_create(&t->cfg->optimizer, t->oparams, t->n_oparams, t->dev, opool, &t->optim,
                           e);
}

static hs_status trainer_buffers(hs_trainer *t, hs_error *e) {
    size_t n = (size_t)t->mbs * (size_t)t->T;
    t->tokens = calloc(n, sizeof(int32_t));
    t->targets = calloc(n, sizeof(int32_t));
    t->logits = calloc((size_t)t->T * (size_t)t->cfg->model.vocab_size, sizeof(float));
    if (hs_model_arch_moe(&t->cfg->model))
        t->expert_tokens = calloc(
            (size_t)t->cfg->model.n_layers * (size_t)t->cfg->model.moe.num_experts, sizeof(double));
    if (!t->tokens || !t->targets || !t->logits)
        return hs_error_oom(e, "trainer: cannot allocate batch buffers");
    return HS_OK;
}

/* The plan before anything is allocated: every rank computes the same
 * one, so all refuse together a run whose ranks on a node would not fit. */
static hs_status plan_fits(hs_trainer *t, hs_error *e) {
    hs_plan *p = calloc(1, sizeof *p);
    if (!p) return hs_error_oom(e, "trainer: cannot allocate the plan");
    hs_status s = hs_plan_build(t->cfg, t->topo, p, e);
    if (s == HS_OK)
        s = hs_plan_check_fit(p, t->cfg, hs_comm_local_ranks(t->comm), hs_memory_available(), e);
    t->plan_ckpt_bytes = p->checkpoint_bytes;
    for (int r = 0; r < p->n_roles; r++)
        if (p->roles[r].host[HS_PLAN_CKPT_STAGING] > t->plan_ckpt_staging)
            t->plan_ckpt_staging = p->roles[r].host[HS_PLAN_CKPT_STAGING];
    t->plan_params = p->total_params;
    free(p);
    return s;
}

/* The trace's directory: trace.dir, else <train.out_dir>/trace. */
static void trace_dir(const hs_trainer *t, char *dir, size_t cap) {
    if (t->cfg->trace.dir[0]) snprintf(dir, cap, "%s", t->cfg->trace.dir);
    else snprintf(dir, cap, "%s/trace", t->cfg->train.out_dir);
}

/* Every directory the run writes, before anything is built: rank 0's
 * train.out_dir and trace directory, every rank's checkpoint.dir and
 * --dump, with room for what goes there (hs_out_dirs_check); the ranks
 * agree, so all refuse together. */
static hs_status outputs_check(hs_trainer *t, hs_error *e) {
    static const char *const out_files[] = {
        "config.yaml",    "metrics.jsonl",         "model.safetensors",       "config.json",
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", NULL};
    static const char *const trace_files[] = {"trace.json", NULL};
    const hs_config *cfg = t->cfg;
    hs_out_dir d[4];
    char what[3][256], trace[HS_PATH_MAX + 16];
    int n = 0;
    if (t->rank0) {
        int64_t bytes = 0;
        if (!hs_mul_i64(t->plan_params, 4, &bytes)) bytes = INT64_MAX;
        snprintf(what[0], sizeof what[0],
                 "the final model.safetensors takes about %.1f MiB "
                 "(%lld fp32 values)",
                 (double)bytes / (1 << 20), (long long)t->plan_params);
        d[n++] = (hs_out_dir){.what = "train.out_dir",
                              .path = cfg->train.out_dir,
                              .files = out_files,
                              .bytes = bytes,
                              .bytes_what = what[0]};
        trace_dir(t, trace, sizeof trace);
        if (cfg->trace.enabled)
            d[n++] = (hs_out_dir){.what = "trace.dir", .path = trace, .files = trace_files};
    }
    n += hs_train_ckpt_out_dir(t, &d[n], what[1], sizeof what[1]);
    n += hs_dump_out_dir(t, &d[n], what[2], sizeof what[2]);
    return hs_pg_agree(hs_comm_world(t->comm), hs_out_dirs_check(d, n, e),
                       "checking the output directories", e);
}

/* A backend may lack a family of kernels (an entry of its table is NULL):
 * a model or optimizer that needs one is refused before anything is
 * allocated. */
static hs_status device_provides(const hs_config *cfg, hs_device_kind kind, hs_error *e) {
    const hs_device_kernels *k = hs_device_kind_kernels(kind);
    if (k == NULL) return HS_OK; /* hs_device_create says why the kind is missing */
    const char *dev = cfg->accelerator.device;
    if (hs_model_arch_moe(&cfg->model) && k->moe_route == NULL)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "model.arch: '%s' has routed experts, and accelerator.device: %s does "
                            "not provide the MoE kernels yet; use accelerator.device: cpu",
                            cfg->model.arch, dev);
    if (strcmp(cfg->optimizer.target, "muon") == 0 && k->muon_newton_schulz == NULL)
        return hs_error_set(e, HS_ERR_CONFIG,
                            "optimizer._target_: 'muon' needs Newton-Schulz, which "
                            "accelerator.device: %s does not provide yet; use optimizer._target_: "
                            "adamw or accelerator.device: cpu",
                            dev);
    return HS_OK;
}

/* Everything that can reject the inputs runs before out_dir exists
 * (run.h). */
hs_status hs_trainer_open(hs_trainer *t, hs_error *e) {
    const hs_config *cfg = t->cfg;
    hs_device_kind kind;
    if (!hs_device_kind_parse(cfg->accelerator.device, &kind))
        return hs_error_set(e, HS_ERR_CONFIG, "accelerator.device: unknown device '%s'; use cpu",
                            cfg->accelerator.device);
    hs_status s = device_provides(cfg, kind, e);
    if (s == HS_OK) s = plan_fits(t, e);
    if (s == HS_OK) s = outputs_check(t, e);
    if (s == HS_OK) s = hs_device_create(kind, t->trace, &t->dev, e);
    if (s == HS_OK) t->dev->split_gemm_rows = hs_train_layout_invariant(&t->cfg->train);
    /* The collectives learn where the buffers live (GPU: NCCL or staging). */
    if (s == HS_OK) s = hs_comm_set_device(t->comm, t->dev, e);
    int pd = t->cfg->fsdp.mix_precision.param_dtype;
    hs_dtype compute = pd == HS_MP_NULL ? HS_DTYPE_F32 : (hs_dtype)pd;
    double peak = 0.0;
    /* A GPU's peak is its own GEMM's, measured while its memory is empty:
     * the ranks that share one measure it together. */
    bool gpu = s == HS_OK && t->dev->kind == HS_DEVICE_CUDA;
    bool infer = t->opt && t->opt->inference;
    if (gpu && !infer) {
        s = hs_pg_barrier(hs_comm_world(t->comm), e);
        t->peak_dtype = compute;
        if (s == HS_OK) s = hs_measure_device_peak_flops(t->dev, compute, &peak, e);
    }
    if (s == HS_OK) s = hs_mesh_create(t->comm, t->topo, &t->mesh, e);
    if (s != HS_OK) return s;
    hs_coords c = hs_mesh_coords(t->mesh);
    t->dp_rank = c.dp;
    t->dp_size = t->topo->dp;
    t->batch_group = hs_mesh_group(t->mesh, HS_DIM_DP_CP);
    t->world_group = hs_comm_world(t->comm);
    s = hs_train_ckpt_lock(t, e);
    if (s != HS_OK) return s;
    t->G = (int)hs_config_global_batch(cfg, t->topo);
    t->mbs = cfg->train.micro_batch_size;
    t->T = cfg->train.seq_len;
    t->M = hs_config_micro_batches(cfg, t->topo);
    int64_t tok_vocab = 0;
    s = hs_tokenizer_check(cfg, &tok_vocab, e);
    if (s == HS_OK && !(t->opt && t->opt->no_data))
        s = hs_data_open(&cfg->data, t->T, cfg->model.vocab_size, (uint64_t)cfg->train.seed,
                         &t->data, e);
    if (s == HS_OK) s = trainer_buffers(t, e);
    if (s == HS_OK) s = hs_cp_batch_init(t, e);
    if (s == HS_OK) s = hs_pp_trainer_init(t, e);
    if (s == HS_OK) s = device_cause(t, trainer_build_model(t, e), e);
    if (s == HS_OK) s = hs_dump_check(t, e);
    if (s == HS_OK) s = hs_train_ckpt_resume(t, e);
    if (s != HS_OK) return s;
    t->hooks = hs_trace_hooks_init(&t->th, t->engine->hooks(t->engine), t->trace, t->engine->model,
                                   t->dev);
    t->flops_per_token = hs_model_flops_per_token(hs_engine_catalog(t->engine), t->T);
    /* Every rank probes at once, after a barrier: a rank spinning in a
     * collective while another measures would take the core from it and
     * make the reference too low (an MFU above 100%). generate and eval
     * report no MFU: no probe. */
    if (infer) return HS_OK;
    if (!gpu) {
        s = hs_pg_barrier(t->world_group, e);
        if (s != HS_OK) return s;
        t->peak_dtype = hs_peak_flops_dtype(compute);
        s = hs_measure_peak_flops(t->peak_dtype, &peak, e);
        if (s != HS_OK) return s;
    }
    /* MFU is against a stated peak, which a busy machine cannot lower; the
     * measured rate is reported beside it. A CPU's is its nominal peak; a
     * GPU's its datasheet's dense figure (one GPU per rank: ranks that
     * share one count it each, which reads low, never high), else, for a
     * GPU the table lacks, the GEMM it measured on an idle device. */
    double rates[2] = {peak, peak};
    const char *product = NULL;
    double sheet = gpu ? hs_device_datasheet_flops(t->dev, compute, &product) : 0.0;
    if (!gpu)
        rates[0] = hs_cpu_rank_peak(compute, hs_blas_get_threads(), hs_comm_local_ranks(t->comm),
                                    peak, t->peak_what, sizeof t->peak_what);
    else if (sheet > 0.0) {
        rates[0] = sheet;
        snprintf(t->peak_what, sizeof t->peak_what, "%s datasheet, dense %s: %.1f TFLOP/s", product,
                 hs_dtype_name(compute), sheet / 1e12);
    } else {
        snprintf(t->peak_what, sizeof t->peak_what,
                 "the measured GEMM (no datasheet figure for %s)", t->dev->model);
    }
    s = hs_reduce_sum_f64(t->world_group, rates, 2, e);
    t->peak_flops = rates[0];
    t->gemm_flops = rates[1];
    return s;
}

void hs_trainer_close(hs_trainer *t) {
    hs_train_ckpt_close(t);
    hs_train_ckpt_unlock(t);
    hs_metrics_close(t);
    hs_trace_hooks_free(&t->th);
    hs_optim_free(t->optim);
    hs_engine_free(t->engine);
    hs_safetensors_close(t->weights_file); /* after the engine: its parameters read it */
    hs_data_free(t->data);
    free(t->tokens);
    free(t->targets);
    free(t->logits);
    free(t->expert_tokens);
    hs_canon_free(t);
    hs_cp_batch_free(t);
    hs_pp_trainer_free(t);
    hs_mesh_free(t->mesh);
    if (t->comm) hs_comm_set_device(t->comm, NULL, NULL); /* its staging, before the device */
    hs_device_free(t->dev);
}

/* The device's note (on a GPU: which path attention takes, and why), each
 * new one once. */
static void device_note(hs_trainer *t) {
    char line[512];
    int serial = hs_device_note_read(t->dev, line, sizeof line);
    if (serial == t->device_note_serial) return;
    t->device_note_serial = serial;
    hs_log_info(t->log, "%s device: %s", t->dev->name, line);
}

static void trainer_announce(const hs_trainer *t) {
    const hs_config *cfg = t->cfg;
    hs_model *m = hs_engine_catalog(t->engine);
    hs_log_info(t->log,
                "model %s: %.2fM params, %d layers, dim %d | data %s: %lld train / %lld val "
                "sequences of %d tokens",
                cfg->model.arch, (double)hs_model_param_count(m) / 1e6, cfg->model.n_layers,
                cfg->model.dim, cfg->data.source, (long long)hs_data_num_train(t->data),
                (long long)hs_data_num_val(t->data), t->T);
    /* Which engine multiplies a 16-bit param dtype on a CPU (HS_CPU_GEMM16) */
    int pd = cfg->fsdp.mix_precision.param_dtype;
    hs_dtype low = pd == HS_MP_NULL ? HS_DTYPE_F32 : (hs_dtype)pd;
    const char *engine = low == HS_DTYPE_F32 || t->dev->kind == HS_DEVICE_CUDA ? ""
                         : hs_device_gemm_native(t->dev, low)                  ? ", 16-bit matmul"
                                                              : ", 16-bit products widened to fp32";
    hs_log_info(t->log,
                "engine %s on %d rank(s) | global batch %d = %d micro-batch(es) x %d sequences x "
                "%d data-parallel rank(s) | %d thread(s) per rank, oneDNN %s%s -> %s",
                t->engine->name, t->topo->world, t->G, t->M, t->mbs, t->dp_size,
                hs_blas_get_threads(), hs_gemm_isa(), engine, cfg->train.out_dir);
    hs_log_info(t->log,
                "mfu against %.1f GFLOP/s, all ranks; rank 0's %s | %s GEMM measured %.1f "
                "GFLOP/s, all ranks",
                t->peak_flops / 1e9, t->peak_what, hs_dtype_name(t->peak_dtype),
                t->gemm_flops / 1e9);
}

static bool eval_due(const hs_trainer *t, int step) {
    int every = t->cfg->train.eval_every;
    if (every <= 0 || hs_data_num_val(t->data) == 0) return false;
    return step % every == 0 || step == t->cfg->train.steps;
}

/* The final weights, with the data's tokenizer beside them (rank 0). */
static hs_status save_weights(hs_trainer *t, hs_error *e) {
    hs_status s = hs_hf_save(hs_engine_catalog(t->engine), hs_engine_get_param, t->engine,
                             HS_DTYPE_F32, t->T, t->cfg->train.out_dir, t->rank0, e);
    char dir[HS_PATH_MAX];
    int copied = 0;
    if (s == HS_OK && t->rank0 && hs_tokenizer_dir(t->cfg, dir, sizeof dir))
        s = hs_tokenizer_copy(dir, t->cfg->train.out_dir, &copied, e);
    return s;
}

/* After a step that a signal asked to be the last: keep its work (a
 * checkpoint, or without checkpoint.dir the weights), say where, stop. */
static hs_status trainer_stop(hs_trainer *t, int step, int sig, hs_error *e) {
    const char *dir = t->cfg->checkpoint.dir;
    hs_status s = HS_OK;
    if (dir[0] && t->ckpt_step != step) s = hs_train_ckpt_save(t, step, e);
    else if (!dir[0]) s = save_weights(t, e);
    if (s == HS_OK && dir[0]) s = hs_train_ckpt_wait(t, e);
    if (s != HS_OK) return t->ckpt_failed = dir[0] != '\0', s;
    char where[HS_PATH_MAX + 64];
    if (dir[0]) snprintf(where, sizeof where, "checkpoint %s/step-%d", dir, step);
    else snprintf(where, sizeof where, "weights %s/model.safetensors", t->cfg->train.out_dir);
    return hs_error_set(e, HS_STOPPED, "stopped by %s after step %d of %d; saved the %s%s",
                        strsignal(sig), step, t->cfg->train.steps, where,
                        dir[0] ? " (resume with checkpoint.resume: auto)" : "");
}

/* Every comm.check_every steps the ranks compare the collectives they
 * issued (hs_comm_check); a mismatch ends the run there. */
static bool fingerprint_due(const hs_trainer *t, int step) {
    int every = t->cfg->comm.check_every;
    return every > 0 && step % every == 0;
}

static hs_status trainer_loop(hs_trainer *t, hs_error *e) {
    t->t_start = hs_now();
    if (hs_dump_dir(t)) { /* the weights this run starts from: step 0, or a resumed step */
        hs_status s = hs_dump_weights(t, t->start_step, e);
        if (s == HS_OK) s = hs_dump_units(t, hs_comm_rank(t->comm), e);
        if (s != HS_OK) return s;
    }
    for (int step = t->start_step + 1; step <= t->cfg->train.steps; step++) {
        hs_step_result r;
        hs_status s = hs_train_step(t, step, &r, e);
        if (s == HS_OK && eval_due(t, step)) {
            s = hs_evaluate(t, &r.val_loss, e);
            r.has_val = true;
        }
        if (s == HS_OK && fingerprint_due(t, step)) {
            char when[48];
            snprintf(when, sizeof when, "after step %d", step);
            s = hs_comm_check(t->comm, when, e);
        }
        if (s != HS_OK) return s;
        hs_metrics_write(t, &r);
        hs_metrics_log(t, &r);
        device_note(t);
        t->last_step = step;
        s = hs_train_ckpt_after_step(t, step, e);
        if (s != HS_OK) return t->ckpt_failed = true, s;
        if (r.stop_signal) return trainer_stop(t, step, r.stop_signal, e);
    }
    hs_status s = hs_train_ckpt_final(t, e);
    t->ckpt_failed = s != HS_OK;
    return s;
}

/* The merged trace. Like the metrics, a trace that cannot be written costs
 * the run nothing else (the weights are saved already): rank 0 says why;
 * only a failed collective is an error. Every rank enters the collective
 * even if rank 0 could not make the directory. */
static hs_status trainer_trace(hs_trainer *t, hs_error *e) {
    char dir[HS_PATH_MAX + 16], path[HS_PATH_MAX + 32];
    trace_dir(t, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/trace.json", dir);
    hs_error fe, ce;
    hs_error_clear(&fe);
    hs_error_clear(&ce);
    hs_status fs = t->rank0 ? hs_mkdirs(dir, &fe) : HS_OK;
    hs_status cs = hs_comm_write_merged_trace(t->comm, path, &ce);
    if (cs != HS_OK && cs != HS_ERR_IO) return *e = ce, cs;
    if (fs == HS_OK && cs != HS_OK) fe = ce, fs = cs;
    if (fs == HS_OK) hs_log_info(t->log, "trace: %s", path);
    else if (t->rank0) hs_log_warn(t->log, "trace: %s; the run goes on without it", fe.msg);
    return HS_OK;
}

static hs_status trainer_finish(hs_trainer *t, hs_error *e) {
    hs_status s = hs_sample(t, e);
    if (s == HS_OK) s = save_weights(t, e);
    if (s == HS_OK && hs_trace_enabled(t->trace)) s = trainer_trace(t, e);
    return s;
}

hs_status hs_train_run(const hs_config *cfg, const hs_topology *topo, hs_comm *comm,
                       const hs_train_options *opt, const hs_log *log, hs_error *e) {
    hs_trainer t = {.cfg = cfg,
                    .topo = topo,
                    .opt = opt,
                    .comm = comm,
                    .log = log,
                    .trace = hs_comm_trace(comm),
                    .rank0 = hs_comm_rank(comm) == 0};
    /* comm.check_every = 1: each collective is compared before it runs. */
    hs_comm_set_check_each(comm, cfg->comm.check_every == 1);
    hs_comm_set_canonical_sums(comm, hs_train_layout_invariant(&cfg->train));
    hs_status s = hs_trainer_open(&t, e);
    if (s == HS_OK) {
        trainer_announce(&t);
        device_note(&t);
        s = hs_metrics_open(&t, e);
    }
    if (s == HS_OK) s = trainer_loop(&t, e);
    if (s != HS_OK && t.ckpt_failed) {
        /* The save failed on every rank together; the weights of the last
         * completed step are not lost with it. */
        hs_error fe;
        hs_error_clear(&fe);
        if (trainer_finish(&t, &fe) == HS_OK)
            hs_log_info(log,
                        "the checkpoint save failed (below); the weights after step %d "
                        "are in %s/model.safetensors",
                        t.last_step, cfg->train.out_dir);
    } else if (s == HS_OK) {
        s = trainer_finish(&t, e);
    }
    if (s == HS_OK)
        hs_log_info(log, "done: %d steps in %.1f s; metrics, weights and config in %s",
                    cfg->train.steps, hs_now() - t.t_start, cfg->train.out_dir);
    hs_trainer_close(&t);
    return s;
}
