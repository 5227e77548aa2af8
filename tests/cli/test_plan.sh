#!/usr/bin/env bash
# hypershard plan: the planned peak per rank is within 10% of the
# peak_device_bytes a real run measures (FSDP, HSDP, mixed precision,
# offload, full and selective recompute, layout-invariant training and the
# model-parallel layouts at W <= 8), and its end-of-run sample KV cache is the one the run logs (none
# where the layout decodes by full forwards); a model that cannot fit is
# refused by train promptly (under 20 s; 0.5 s on a quiet machine) with the
# plan's numbers and nothing written; the plan of 1024 ranks is a readable
# table.
set -u
source "$(dirname "$0")/lib.sh"
hs_scratch plan

tiny=(model.dim=64 model.n_layers=3 model.n_heads=4 model.n_kv_heads=2 model.ffn_dim=136
      train.seq_len=32 train.micro_batch_size=2 train.steps=2 train.eval_every=0)
F2=(fsdp_config.dp_shard_size=2)
BF=(fsdp_config.mix_precision.param_dtype=bfloat16 fsdp_config.mix_precision.reduce_dtype=float32)

# check NAME RANKS ARGS...: plan --json and a 2-step run agree within 10%.
check() {
    local name=$1 n=$2
    shift 2
    "$HS_BIN" plan --world "$n" --json "${tiny[@]}" "$@" > "$work/$name.plan.json" 2> "$work/$name.plan.err" ||
        { fail "$name: plan failed: $(cat "$work/$name.plan.err")"; return; }
    hs_train "$name" "$n" "$@"
    python3 - "$name" "$work/$name.plan.json" "$work/$name/metrics.jsonl" "$work/$name.txt" \
        "${PLAN_TOL:-0.10}" <<'PY' || fail "$1"
import json, re, sys
name, plan, metrics, log, tol = sys.argv[1:]
p = json.load(open(plan))
# the end-of-run sample's KV cache: the bytes rank 0 (stage 0) logged, or
# none where it decoded by full forwards
m = re.search(r"sample: a KV cache of (\d+) bytes", open(log).read())
kv = int(m.group(1)) if m else 0
assert p["ranks"][0]["sample_kv_cache_bytes"] == kv, (p["ranks"][0]["sample_kv_cache_bytes"], kv)
want = p["max_peak_device_bytes"]
assert want == max(r["peak_device_bytes"] for r in p["ranks"])
got = max(json.loads(l)["peak_device_bytes"] for l in open(metrics))
err = want / got - 1
print("%-14s planned %10d measured %10d  %+.2f%%" % (name, want, got, 100 * err))
sys.exit(0 if abs(err) < float(tol) else 1)
PY
}

check one 1
check fsdp2 2 "${F2[@]}"
check ddp2 2
check uneven3 3 fsdp_config.dp_shard_size=3 train.global_batch_size=6
check hsdp4 4 "${F2[@]}" train.global_batch_size=8
check bf16 2 "${F2[@]}" "${BF[@]}"
check main_params 2 "${F2[@]}" "${BF[@]}" optimizer.fp32_main_params=true \
    fsdp_config.mix_precision.fp32_main_grad=true
check offload 2 "${F2[@]}" fsdp_config.enable_offload=true
check offload_bf16 2 "${F2[@]}" "${BF[@]}" fsdp_config.enable_offload=true
check recompute 2 "${F2[@]}" train.activation_checkpointing=true
check selective 2 "${F2[@]}" train.activation_checkpointing=selective
check selective_zb1p 2 accelerator.pp_size=2 accelerator.pp_schedule=zb1p \
    train.global_batch_size=4 train.activation_checkpointing=selective
check prefetch2 4 fsdp_config.dp_shard_size=4 fsdp_config.forward_prefetch_depth=2 \
    fsdp_config.backward_prefetch_depth=2 train.global_batch_size=8
check gather_int8 2 "${F2[@]}" "${BF[@]}" fsdp_config.param_gather=int8
check gather_fp8_fused 2 "${F2[@]}" fsdp_config.param_gather=fp8_e4m3 fsdp_config.comm_fusion=true
check reduce_int8 2 "${F2[@]}" "${BF[@]}" fsdp_config.param_gather=int8 fsdp_config.grad_reduce=int8
check reduce_int4_fused 2 "${F2[@]}" fsdp_config.grad_reduce=int4 fsdp_config.comm_fusion=true
check no_sync 2 "${F2[@]}" "${BF[@]}" train.global_batch_size=8 fsdp_config.requires_grad_sync=false
check tp2_fsdp2 4 "${F2[@]}" accelerator.tp_size=2
check pp2_fsdp2 4 "${F2[@]}" accelerator.pp_size=2 train.global_batch_size=8
check zb1p_fsdp2 4 "${F2[@]}" accelerator.pp_size=2 accelerator.pp_schedule=zb1p \
    train.global_batch_size=8
check zbv_fsdp2 4 "${F2[@]}" accelerator.pp_size=2 accelerator.pp_schedule=zbv \
    accelerator.pp_virtual_stages=2 model.n_layers=4 train.global_batch_size=8
check cp2 2 accelerator.cp_size=2
# train.reproducibility: layout, within 3%: the trees' scratch (tied: each
# sequence's head part, a sixth of this peak) and the micro-batches'
# gradient subtrees
PLAN_TOL=0.03
check layout_tied 1 train.reproducibility=layout model.tie_embeddings=true model.vocab_size=2048
check layout_fsdp2_m4 2 "${F2[@]}" "${BF[@]}" train.reproducibility=layout train.global_batch_size=16
check layout_pp2 2 train.reproducibility=layout accelerator.pp_size=2 train.global_batch_size=8
unset PLAN_TOL
check cp2_a2a 2 accelerator.cp_size=2 accelerator.cp_rotate_method=alltoall
check cp4_a2a_ring 4 accelerator.cp_size=4 accelerator.cp_rotate_method=alltoall_ring \
    accelerator.cp_a2a_size=2
check hpz4 4 fsdp_config.dp_shard_size=4 fsdp_config.secondary_shard_size=2 "${BF[@]}" \
    fsdp_config.param_gather=int8 train.global_batch_size=8
check hpz4_offload 4 fsdp_config.dp_shard_size=4 fsdp_config.secondary_shard_size=2 \
    fsdp_config.enable_offload=true train.global_batch_size=8
check hpz4_fused 4 fsdp_config.dp_shard_size=4 fsdp_config.secondary_shard_size=2 \
    fsdp_config.comm_fusion=true train.global_batch_size=8
check fsdp8 8 fsdp_config.dp_shard_size=8 train.global_batch_size=16 train.activation_checkpointing=true

# The MFU reference is probed by all ranks at once, so no step reads above
# 100% (8 ranks on 2 cores included).
for m in "$work"/*/metrics.jsonl; do
    python3 -c "
import json, sys
bad = [r['mfu'] for r in map(json.loads, open('$m')) if not 0 < r['mfu'] < 1]
sys.exit(1 if bad else 0)" || fail "$m: MFU outside (0, 1)"
done

# The planned FSDP communication is what a step does: the trace of one
# step (rank 0, inside its "step" span) has the plan's all-gathers and
# reduce-scatters on fsdp_shard and all-reduces on fsdp_replicate, call for
# call and byte for byte; so are the all-to-all CP methods' exchanges, and
# a pipeline stage's hand-overs (what it sends on pp_forward and
# pp_backward; under sequence parallel its rows of the residual stream).
# The run's metrics.jsonl measures its exposed communication under plan
# --time's names: time in the TP and CP collectives where the layout has
# them (none where it has not), FSDP's waits, and a bubble in [0, 1)
# under a pipeline only.
comm_check() {
    local name=$1 n=$2
    shift 2
    "$HS_BIN" plan --world "$n" --ranks-per-node "$n" --json "${tiny[@]}" train.steps=1 "$@" \
        > "$work/$name.plan.json"
    hs_train "$name" "$n" train.steps=1 trace.enabled=true "$@"
    python3 - "$work/$name.plan.json" "$work/$name/metrics.jsonl" <<'PY' || fail "$name: metrics"
import json, sys
comm = json.load(open(sys.argv[1]))["ranks"][0]["comm"]
for r in map(json.loads, open(sys.argv[2])):
    x = r["exposed_s"]
    assert sorted(x) == ["cp", "ep", "tp"] and r["exposed_fsdp_s"] >= 0, r
    for k in ("tp", "cp"):
        assert (x[k] > 0) == (comm[k]["calls"] > 0), (k, x, comm[k])
    assert ("bubble" in r) == (comm["pp"]["calls"] > 0), r
    assert "bubble" not in r or 0 <= r["bubble"] < 1, r
PY
    python3 - "$name" "$work/$name.plan.json" "$work/$name/trace/trace.json" "${COMM_RANK:-0}" \
        <<'PY' || fail "$name: comm"
import collections, json, sys
name, plan, trace, pid = sys.argv[1:4] + [int(sys.argv[4])]
# the role (pipeline stage) of rank pid: the last that starts at or before it
role = max((r for r in json.load(open(plan))["ranks"] if r["first_rank"] <= pid),
           key=lambda r: r["first_rank"])
comm = role["comm"]
d = json.load(open(trace))
ev = d["traceEvents"] if isinstance(d, dict) else d
step = [e for e in ev if e.get("name") == "step" and e.get("ph") == "X" and e.get("pid") == pid][0]
t0, t1 = step["ts"], step["ts"] + step["dur"]
calls, nbytes = collections.Counter(), collections.Counter()
for e in ev:
    a = e.get("args", {})
    if e.get("pid") == pid and e.get("ph") == "X" and "group" in a and t0 <= e["ts"] <= t1:
        calls[(e["name"], a["group"])] += 1
        nbytes[(e["name"], a["group"])] += int(a.get("bytes") or 0)
ok = True
# (a quantized reduce-scatter, fsdp_config.grad_reduce, is an all-to-all)
for planned, key in (("all_gather", ("all_gather", "fsdp_shard")),
                     ("all_gather_secondary", ("all_gather", "fsdp_shard_secondary")),
                     ("reduce_scatter", ("reduce_scatter", "fsdp_shard")),
                     ("all_reduce", ("all_reduce", "fsdp_replicate"))):
    want = (comm[planned]["calls"], comm[planned]["bytes"])
    got = (calls[key], nbytes[key])
    if planned == "reduce_scatter":
        got = (got[0] + calls[("all_to_all", "fsdp_shard")],
               got[1] + nbytes[("all_to_all", "fsdp_shard")])
    print("%-10s %-14s planned %4d calls %9d B, traced %4d calls %9d B" % (name, planned, *want, *got))
    ok &= want == got
# the all-to-all CP methods: their exchanges (and the hybrid's ring sends)
# on the cp groups
cp = [k for k in calls if k[1].startswith("cp") and k[0] in ("all_to_all", "send")]
if cp or comm["cp"]["calls"]:
    want = (comm["cp"]["calls"], comm["cp"]["bytes"])
    got = (sum(calls[k] for k in cp), sum(nbytes[k] for k in cp))
    print("%-10s %-14s planned %4d calls %9d B, traced %4d calls %9d B" % (name, "cp", *want, *got))
    ok &= want == got
# link classes on one host: every rank's FSDP bytes (its step's spans)
# are sent inside the node, as many as the plan's sum over the roles
steps = {e["pid"]: (e["ts"], e["ts"] + e["dur"]) for e in ev
         if e.get("name") == "step" and e.get("ph") == "X"}
cls = {("all_gather", "fsdp_shard"): "all_gather",
       ("all_gather", "fsdp_shard_secondary"): "all_gather_secondary",
       ("reduce_scatter", "fsdp_shard"): "reduce_scatter", ("all_to_all", "fsdp_shard"): "reduce_scatter",
       ("all_reduce", "fsdp_replicate"): "all_reduce", ("all_reduce", "fsdp"): "all_reduce"}
sent = collections.Counter()
for e in ev:
    a = e.get("args", {})
    k = cls.get((e.get("name"), a.get("group")))
    if k and e.get("ph") == "X" and steps[e["pid"]][0] <= e["ts"] <= steps[e["pid"]][1]:
        sent[(k, 0)] += a["sent_intra"]
        sent[(k, 1)] += a["sent_inter"]
roles = json.load(open(plan))["ranks"]
for k in ("all_gather", "all_gather_secondary", "reduce_scatter", "all_reduce"):
    want = (sum(r["comm"][k]["sent_intra"] for r in roles), sum(r["comm"][k]["sent_inter"] for r in roles))
    got = (sent[(k, 0)], sent[(k, 1)])
    if want != (0, 0) or got != (0, 0):
        print("%-10s %-14s planned sent %9d B, traced %9d B (+%d across nodes)" % (name, k, want[0], got[0], got[1]))
    ok &= want == got
pp = [k for k in calls if k[0] == "send" and k[1] in ("pp_forward", "pp_backward")]
if pp or comm["pp"]["calls"]:
    want = (comm["pp"]["calls"], comm["pp"]["bytes"])
    got = (sum(calls[k] for k in pp), sum(nbytes[k] for k in pp))
    print("%-10s %-14s planned %4d calls %9d B, traced %4d calls %9d B" % (name, "pp", *want, *got))
    ok &= want == got
sys.exit(0 if ok else 1)
PY
}
comm_check comm_fsdp2 2 "${F2[@]}"
comm_check comm_hsdp4 4 "${F2[@]}" train.global_batch_size=8
comm_check comm_bf16 2 "${F2[@]}" "${BF[@]}"
# the quantized all-gathers: each rank's packed shard (bytes and scales)
comm_check comm_int8 2 "${F2[@]}" "${BF[@]}" fsdp_config.param_gather=int8 \
    fsdp_config.param_gather_block=64
comm_check comm_hsdp4_fp8 4 "${F2[@]}" train.global_batch_size=8 fsdp_config.param_gather=fp8_e4m3 \
    fsdp_config.grad_reduce=int8 fsdp_config.grad_reduce_block=128
# the secondary shard (hpZ): the blocks' backward gathers on its groups
comm_check comm_hpz4 4 fsdp_config.dp_shard_size=4 fsdp_config.secondary_shard_size=2 \
    train.global_batch_size=8 fsdp_config.param_gather=int8
comm_check comm_ddp3 3 train.global_batch_size=6
comm_check comm_cp2_a2a 2 accelerator.cp_size=2 accelerator.cp_rotate_method=alltoall
comm_check comm_cp4_a2a_ring 4 accelerator.cp_size=4 accelerator.cp_rotate_method=alltoall_ring \
    accelerator.cp_a2a_size=2
comm_check comm_pp2 2 accelerator.pp_size=2 train.global_batch_size=8
# ZB-H1's last stage: a unit reduces when its last pending weight pass
# completes, once for the W's it kept back; under layout mode after each W
COMM_RANK=2
comm_check comm_zb1p_last 4 "${F2[@]}" accelerator.pp_size=2 accelerator.pp_schedule=zb1p \
    train.global_batch_size=8 model.n_layers=4
comm_check comm_zb1p_layout_last 4 "${F2[@]}" accelerator.pp_size=2 accelerator.pp_schedule=zb1p \
    train.global_batch_size=8 model.n_layers=4 train.reproducibility=layout
unset COMM_RANK
# Two chunks a stage: a unit prefetches within its own chunk and the
# stage gathers the next action's first units between two actions, so no
# unit is gathered twice for one use; ZB-V's first stage holds the
# embedding's chunk and the head's, each with a root unit of its own that
# reduces once a micro-batch
IL=(accelerator.pp_schedule=interleaved_1f1b accelerator.pp_virtual_stages=2)
ZBV=(accelerator.pp_schedule=zbv accelerator.pp_virtual_stages=2)
for COMM_RANK in 0 2; do
    comm_check "comm_zbv_rank$COMM_RANK" 4 "${F2[@]}" accelerator.pp_size=2 "${ZBV[@]}" \
        train.global_batch_size=8 model.n_layers=4
    comm_check "comm_interleaved_rank$COMM_RANK" 4 "${F2[@]}" accelerator.pp_size=2 "${IL[@]}" \
        train.global_batch_size=8 model.n_layers=4
done
unset COMM_RANK
comm_check comm_pp2_tp2_sp 4 accelerator.pp_size=2 accelerator.tp_size=2 \
    accelerator.sequence_parallel=true train.global_batch_size=8
# DeepSeek-V3 (latent attention, a dense block then DeepSeekMoE): the
# memory plan (its latent KV cache included) and one step's collectives
ds=(model.arch=deepseek_v3 model.n_kv_heads=4 model.mla.q_lora_rank=32 model.mla.kv_lora_rank=32
    model.mla.qk_nope_head_dim=16 model.mla.qk_rope_head_dim=8 model.mla.v_head_dim=12
    model.moe.first_k_dense_replace=1 model.moe.num_experts=8 model.moe.top_k=2
    model.moe.expert_ffn_dim=32 model.moe.shared_expert_ffn_dim=32 model.moe.score_func=sigmoid
    model.moe.n_group=4 model.moe.topk_group=2 model.moe.aux_loss_coef=0
    model.moe.bias_update_speed=0.01)
check ds_fsdp2 2 "${ds[@]}" "${F2[@]}"
check ds_tp2_fsdp2 4 "${ds[@]}" "${F2[@]}" accelerator.tp_size=2
comm_check comm_ds_fsdp2 2 "${ds[@]}" "${F2[@]}"
comm_check comm_ds_pp2_tp2_sp 4 "${ds[@]}" accelerator.pp_size=2 accelerator.tp_size=2 \
    accelerator.sequence_parallel=true train.global_batch_size=8

# The JSON lists each role; under PP one per stage.
python3 - "$work/pp2_fsdp2.plan.json" <<'PY' || fail "pp2_fsdp2: roles"
import json, sys
p = json.load(open(sys.argv[1]))
assert [r["role"] for r in p["ranks"]] == ["stage 0", "stage 1"], p["ranks"]
assert all(r["n_ranks"] == 2 for r in p["ranks"])
assert p["ranks"][0]["comm"]["pp"]["calls"] > 0
PY

# A model that cannot fit: refused before anything is allocated or written,
# and promptly (0.5 s on a quiet 2-core machine; the bound is wide so that a
# loaded machine does not fail it).
t0=$(date +%s.%N)
hs_expect_exit 2 huge "the plan needs .* activations" train model.n_layers=1000000 \
    train.out_dir="$work/huge"
python3 -c "import sys; sys.exit(0 if $(date +%s.%N) - $t0 < 20 else 1)" || fail "huge: took over 20 s"
grep -q "train.activation_checkpointing: true" "$work/huge.log" || fail "huge: no fix named"
[ ! -e "$work/huge" ] || fail "huge: the run left $work/huge behind"
hs_expect_exit 2 wide "the plan needs" train model.dim=100000000 train.out_dir="$work/wide"
hs_expect_exit 2 vocab "the plan needs" train model.vocab_size=2000000000 train.out_dir="$work/vocab"
# On a GPU the device's bytes are the GPU's: the plan holds only the host
# bytes to this host's memory. Activations that no memory here holds (670
# GiB) are refused on cpu, while the same run on cuda goes past the plan
# and stops at the device (no GPU here; on one, the allocation it refuses).
act=(model.dim=512 model.n_layers=8 train.seq_len=8192 train.micro_batch_size=512)
hs_expect_exit 2 act_cpu "the plan needs .* activations" train "${act[@]}" \
    train.out_dir="$work/act_cpu"
rc=0
"$HS_BIN" train accelerator.device=cuda "${act[@]}" train.out_dir="$work/act_cuda" \
    > "$work/act_cuda.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "act_cuda: 670 GiB of activations did not stop the run"
grep -q "the plan needs" "$work/act_cuda.log" &&
    fail "act_cuda: the plan held the GPU's bytes to host memory: $(tail -1 "$work/act_cuda.log")"
grep -qi "cuda" "$work/act_cuda.log" ||
    fail "act_cuda: not stopped at the device: $(tail -2 "$work/act_cuda.log")"
# Sizes whose products overflow int64 are refused by the config rules,
# naming the product, before anything is allocated; no wrapped figure is
# printed. (2^30 x 2^19 tokens wrapped the peak to 0 bytes, which passed the
# memory check, and train died allocating its batch.)
wrap=(train.micro_batch_size=1073741824 train.seq_len=524288 train.activation_checkpointing=true)
hs_expect_exit 2 wrap_train "train.micro_batch_size x train.seq_len x" train "${wrap[@]}" \
    train.out_dir="$work/wrap"
[ ! -e "$work/wrap" ] || fail "wrap_train: the run left $work/wrap behind"
hs_expect_exit 2 wrap_plan "train.micro_batch_size x train.seq_len x" plan "${wrap[@]}"
hs_expect_exit 2 wrap_json "train.micro_batch_size x train.seq_len x" plan --json "${wrap[@]}"
hs_expect_exit 2 wrap_params \
    "model.dim x model.ffn_dim x model.n_layers = 2097152 x 2000000000 x 100000" plan \
    model.dim=2097152 model.n_heads=64 model.ffn_dim=2000000000 model.n_layers=100000
for f in wrap_plan wrap_json wrap_params; do
    ! grep -qE '(^|[ :])-[0-9]' "$work/$f.log" ||
        fail "$f: a negative figure: $(head -3 "$work/$f.log")"
done
# The pipeline schedule (2 x micro-batches x virtual stages actions) is
# bounded: its size wrapped int (-294967296 actions), or the plan spun for
# minutes. Any number of micro-batches otherwise plans in milliseconds.
hs_expect_exit 2 pp_wrap "2 x 2000000000 x 1 = 4000000000 actions per stage" plan \
    accelerator.pp_size=2 train.micro_batch_size=1 train.global_batch_size=2000000000 --world 2
timeout 10 "$HS_BIN" plan accelerator.pp_size=2 train.micro_batch_size=1 \
    train.global_batch_size=100000000 --world 2 > "$work/pp_long.log" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "more than 1048576" "$work/pp_long.log" ||
    fail "pp_long: exit $rc (124: over 10 s): $(head -3 "$work/pp_long.log")"
timeout 10 "$HS_BIN" plan train.micro_batch_size=1 train.global_batch_size=2000000000 --world 2 \
    > "$work/many_mb.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] && grep -q "1000000000 micro-batches" "$work/many_mb.log" ||
    fail "many_mb: exit $rc (124: over 10 s): $(head -3 "$work/many_mb.log")"
# The node's memory as the operator states it; the busiest rank times two.
HYPERSHARD_NODE_MEMORY=1000000 hs_expect_exit 2 node "x 1 rank on this node" train \
    "${tiny[@]}" train.out_dir="$work/node"
need=$(python3 -c "import json; print(json.load(open('$work/fsdp2.plan.json'))['max_peak_device_bytes'])")
HYPERSHARD_NODE_MEMORY=$((2 * need - 1)) timeout 120 "$MPIEXEC" -n 2 "$HS_BIN" train "${tiny[@]}" \
    "${F2[@]}" train.out_dir="$work/node2" > "$work/node2.log" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "x 2 ranks on this node" "$work/node2.log" ||
    fail "node2: exit $rc: $(tail -3 "$work/node2.log")"

# What the plan lets through and the system still refuses (here a 1.5 GB
# address-space limit) is a clear error naming what and how much: exit 1,
# no abort and no core dump.
# (AddressSanitizer reserves its shadow memory beyond any such limit: that
# build cannot run this case.)
if ldd "$HS_BIN" | grep -q libasan; then
    echo "note: $HS_BIN is built with AddressSanitizer; the address-space limit case is skipped"
else
    (ulimit -v 1500000; HYPERSHARD_NODE_MEMORY=100000000000000 "$HS_BIN" train model.dim=2048 \
        model.n_heads=16 model.n_kv_heads=16 model.ffn_dim=8192 train.out_dir="$work/oom") \
        > "$work/oom.log" 2>&1
    rc=$?
    [ "$rc" -eq 1 ] || fail "oom: exit $rc, want 1: $(tail -3 "$work/oom.log")"
    grep -q "out of memory: the device pool of the cpu device could not allocate [0-9]* bytes" \
        "$work/oom.log" ||
        fail "oom: $(tail -3 "$work/oom.log")"
fi

# On cuda the plan adds the kernels' scratch of the backward, at most:
# attention's backward through cuDNN (16-bit dq, dk, dv and dout, and the
# workspace cuDNN is held to: 8 bytes a row, 16 MiB and twice an fp32 dQ),
# for the rank's heads (TP 2 halves them) and sequence part; none on cpu.
scratch=(model.dim=256 model.n_heads=8 model.n_kv_heads=4 train.seq_len=128
         train.micro_batch_size=3 "${BF[@]}")
for tp in 1 2; do
    "$HS_BIN" plan --world "$tp" --json accelerator.device=cuda accelerator.tp_size=$tp \
        "${scratch[@]}" > "$work/scratch_cuda$tp.json" 2>&1 || fail "scratch_cuda$tp: plan failed"
done
"$HS_BIN" plan --json "${scratch[@]}" > "$work/scratch_cpu.json" 2>&1 || fail "scratch_cpu: plan failed"
python3 - "$work" <<'PY' || fail "the cuda plan's kernel_scratch is not the bound"
import json, sys
w = sys.argv[1]
item = lambda f: json.load(open(f"{w}/{f}"))["ranks"][0]["device"]["kernel_scratch"]
assert item("scratch_cpu.json") == 0, item("scratch_cpu.json")
for tp in (1, 2):
    B, T, NH, KVH, HD = 3, 128, 8 // tp, 4 // tp, 256 // 8
    rows = B * NH * T
    q, k = B * T * NH * HD * 2, B * T * KVH * HD * 2
    want = 2 * q + 2 * k + rows * 8 + (16 << 20) + 2 * rows * HD * 4
    got = item(f"scratch_cuda{tp}.json")
    assert got == want, (tp, got, want)
    print(f"tp {tp}: kernel_scratch {got} bytes")
PY

# 1024 ranks, tp 8 x pp 4 of an 8B Llama: a table, in milliseconds.
hs_expect_exit 0 big "stage 3: 256 ranks" plan --world 1024 accelerator.tp_size=8 \
    accelerator.pp_size=4 fsdp_config.dp_shard_size=32 model.n_layers=32 model.dim=4096 \
    model.n_heads=32 model.n_kv_heads=8 model.ffn_dim=14336 model.vocab_size=128256 \
    train.seq_len=8192 train.micro_batch_size=1
for w in "all_gather" "reduce_scatter" "tp " "pp " "optimizer" "activations" "max peak per rank"; do
    grep -q "$w" "$work/big.log" || fail "big: no '$w' in the table"
done
hs_expect_exit 2 bad_world "expected a rank count" plan --world 0
hs_finish
