#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces joined by a veth pair,
# each with its own hostname (UTS namespace), and mpiexec across them
# (Open MPI over btl tcp between hosts, an rsh agent that enters the other
# host's namespace, 2 ranks per host). FSDP 4 and HSDP 2 x 2 with the
# replicate dimension across the hosts match the one-process run within
# 1e-5 (loss, grad norm, gradients, weights, logits, export); FSDP 4 with
# the secondary shard over each host's two ranks (hpZ) is FSDP 4's run
# bit for bit, its backward gathering inside the hosts; int4 gradients
# reduce in two levels (inside each host, then across) within their bound,
# fused units with the unfused bits. train.reproducibility: layout at HSDP
# 2 x 2, FSDP 4 and DDP 4 across the hosts gives one process's weights
# byte for byte, with its sums traced as canonical.
# Every run's link classes (bytes sent inside a host and across) equal the
# plan's, and the compressed run (int8 gathers, int4 reductions, hpZ)
# sends at most 30% of FSDP 4's bytes across the hosts. The trace
# shows the paths: FSDP 4's shard group spans both hosts and runs the ring;
# under HSDP each host's shard group runs the intra-node path and the
# replicate groups between the hosts run the ring. Skips, saying why, where
# namespaces cannot be made (not root, no iproute2 or unshare): exit 77.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 240
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch multihost
hs_two_hosts

tiny=("${HS_FSDP_TINY[@]}" model.n_kv_heads=2 optimizer.eps=1e-3 train.global_batch_size=8)
files=(model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors
       dump/weights-step2.safetensors dump/logits-step2.safetensors)
hs_train_dump one 1
multi() { # NAME ARGS...: hypershard train on 4 ranks over the two hosts (dumped unless NODUMP)
    local name=$1 dump=(--dump "$work/$1/dump")
    [ -z "${NODUMP:-}" ] || dump=()
    shift
    ip netns exec "$a" unshare --uts sh -c 'hostname hostA; exec "$@"' sh \
        timeout 180 mpiexec --hostfile "$work/hosts" -n 4 --mca plm_rsh_agent "$work/agent.sh" \
        --mca btl self,vader,tcp --mca btl_tcp_if_include 10.77.0.0/24 \
        --mca oob_tcp_if_include 10.77.0.0/24 -x PATH \
        "$HS_BIN" train "${tiny[@]}" "$@" trace.enabled=true train.out_dir="$work/$name" \
        "${dump[@]}" > "$work/$name.txt" 2>&1 ||
        { fail "$name: exit $?: $(grep -v '^ ' "$work/$name.txt" | tail -5)"; return 1; }
}
multi fsdp4 fsdp_config.dp_shard_size=4 && hs_compare_runs one fsdp4 1e-5 "${files[@]}"
multi hsdp fsdp_config.dp_shard_size=2 && hs_compare_runs one hsdp 1e-5 "${files[@]}"
# hpZ: the backward gathers among each host's two ranks
multi hpz fsdp_config.dp_shard_size=4 fsdp_config.secondary_shard_size=2 &&
    hs_compare_runs fsdp4 hpz 0 "${files[@]}"
# int4 gradients in two levels (each host's sum, then across): step 1's
# loss is the exact one's bit for bit, its gradients within 0.25 of the
# exact ones relative to each tensor's largest value. Each level moves a
# value by at most half its block's step, amax / 14, of what it packs:
# four ranks' gradients, then two hosts' sums, averaged over 4: at most
# (4 + 2 x 2) / 14 / 4 = 1/7 of the largest where no ranks' gradients
# cancel, more where they partly do (measured 0.156).
multi int4 fsdp_config.dp_shard_size=4 fsdp_config.grad_reduce=int4 &&
    grep -q "gradients reduced in two levels: the shard group spans 2 nodes of 2 ranks" \
        "$work/int4.txt" || fail "int4: no two levels: $(grep fsdp: "$work/int4.txt")"
python3 - "$work/fsdp4/metrics.jsonl" "$work/int4/metrics.jsonl" <<'PY' || fail "int4: step-1 loss"
import json, sys
a, b = (json.loads(open(p).readline())["loss"] for p in sys.argv[1:])
assert a == b, (a, b)
PY
python3 "$HS_SRC/tests/cli/grads_within.py" "$work/fsdp4" "$work/int4" 0.25 nonzero ||
    fail "int4: gradients"
# a fused unit's two levels: the unfused bits
multi int4_fused fsdp_config.dp_shard_size=4 fsdp_config.grad_reduce=int4 \
    fsdp_config.comm_fusion=true && hs_compare_runs int4 int4_fused 0 "${files[@]}"

paths() { # RUN: group -> the set of paths its all_gather / reduce_scatter / all_reduce took
    python3 - "$work/$1/trace/trace.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"] if isinstance(t, dict) else t
seen = {}
for e in ev:
    a = e.get("args", {})
    if e.get("cat") == "comm" and e["name"] in ("all_gather", "reduce_scatter", "all_reduce") \
            and a.get("bytes", 0) > 12:
        seen.setdefault(a["group"], set()).add(a["path"])
for g in sorted(seen):
    print(g, ",".join(sorted(seen[g])))
PY
}
[ -f "$work/fsdp4/trace/trace.json" ] && {
    paths fsdp4 > "$work/fsdp4.paths"
    grep -qx "fsdp_shard ring" "$work/fsdp4.paths" || fail "FSDP 4 across hosts: $(cat "$work/fsdp4.paths")"
}
[ -f "$work/hsdp/trace/trace.json" ] && {
    paths hsdp > "$work/hsdp.paths"
    grep -qx "fsdp_shard intra-node" "$work/hsdp.paths" ||
        fail "HSDP: the shard group inside a host does not run the intra-node path: $(cat "$work/hsdp.paths")"
    grep -qx "fsdp_replicate ring" "$work/hsdp.paths" ||
        fail "HSDP: the replicate group across hosts does not run the ring: $(cat "$work/hsdp.paths")"
}
[ -f "$work/hpz/trace/trace.json" ] && {
    paths hpz > "$work/hpz.paths"
    grep -qx "fsdp_shard_secondary intra-node" "$work/hpz.paths" ||
        fail "hpZ: the secondary groups do not stay inside a host: $(cat "$work/hpz.paths")"
    grep -qx "fsdp_shard ring" "$work/hpz.paths" || fail "hpZ: $(cat "$work/hpz.paths")"
}
cat "$work"/*.paths 2> /dev/null

# Link classes: the bytes each rank sends inside its host and to the other
# host (trace spans' sent_intra / sent_inter), summed over the 4 ranks for
# step 2, are what `plan --ranks-per-node 2` predicts for FSDP's groups,
# byte for byte; int8 gathers, int4 reductions in two levels and the
# secondary shard send at most 30% of FSDP 4's fp32 bytes across the hosts. (Runs without
# --dump, whose gathers of whole tensors are no part of a step's plan.)
L_FSDP=(fsdp_config.dp_shard_size=4)
L_HSDP=(fsdp_config.dp_shard_size=2)
L_PACKED=(fsdp_config.dp_shard_size=4 fsdp_config.secondary_shard_size=2
          fsdp_config.param_gather=int8 fsdp_config.grad_reduce=int4)
NODUMP=1 multi l_fsdp "${L_FSDP[@]}"
NODUMP=1 multi l_hsdp "${L_HSDP[@]}"
NODUMP=1 multi l_packed "${L_PACKED[@]}"
links() { # RUN ARGS...: the traced and planned link bytes agree; prints the inter-node total
    local run=$1
    shift
    "$HS_BIN" plan --world 4 --ranks-per-node 2 --json "${tiny[@]}" "$@" > "$work/$run.plan.json" ||
        { fail "$run: plan"; return 1; }
    python3 - "$run" "$work/$run.plan.json" "$work/$run/trace/trace.json" <<'PY' || fail "$run: link classes"
import collections, json, sys
run, plan, trace = sys.argv[1:]
p = json.load(open(plan))
d = json.load(open(trace))
ev = d["traceEvents"] if isinstance(d, dict) else d
steps = collections.defaultdict(list)
for e in ev:
    if e.get("name") == "step" and e.get("ph") == "X":
        steps[e["pid"]].append((e["ts"], e["ts"] + e["dur"]))
assert sorted(steps) == [0, 1, 2, 3], sorted(steps)
cls = {("all_gather", "fsdp_shard"): "all_gather",
       ("all_gather", "fsdp_shard_secondary"): "all_gather_secondary",
       ("reduce_scatter", "fsdp_shard"): "reduce_scatter", ("all_to_all", "fsdp_shard"): "reduce_scatter",
       ("all_to_all", "fsdp_shard_node"): "reduce_scatter",
       ("all_to_all", "fsdp_shard_cross"): "reduce_scatter",
       ("all_reduce", "fsdp_replicate"): "all_reduce"}
got = collections.Counter()
for e in ev:
    a = e.get("args", {})
    k = cls.get((e.get("name"), a.get("group")))
    if k is None or e.get("ph") != "X":
        continue
    t0, t1 = sorted(steps[e["pid"]])[1]
    if t0 <= e["ts"] <= t1:
        got[(k, 0)] += a["sent_intra"]
        got[(k, 1)] += a["sent_inter"]
ok, inter = True, 0
for k in sorted(set(c for c, _ in got) | {"all_gather", "reduce_scatter"}):
    c = p["ranks"][0]["comm"][k]
    want = (c["sent_intra"], c["sent_inter"])
    have = (got[(k, 0)], got[(k, 1)])
    print("%-8s %-20s planned intra %9d inter %9d, traced intra %9d inter %9d" % (run, k, *want, *have))
    ok &= want == have
    inter += have[1]
print("%s: %d bytes across the hosts in step 2" % (run, inter))
open(sys.argv[2] + ".inter", "w").write(str(inter))
sys.exit(0 if ok else 1)
PY
}
[ -f "$work/l_fsdp/trace/trace.json" ] && links l_fsdp "${L_FSDP[@]}"
[ -f "$work/l_hsdp/trace/trace.json" ] && links l_hsdp "${L_HSDP[@]}"
[ -f "$work/l_packed/trace/trace.json" ] && links l_packed "${L_PACKED[@]}"

# train.reproducibility: layout across the hosts: HSDP 2 x 2 (the
# replicate dimension across), FSDP 4 and DDP 4 over TCP end with one
# process's weights byte for byte, their fp32 sums ran as canonical sums
# (the trace's path: all-to-alls of the blocks, all-gathers of the whole
# buffer) and the plan's link bytes are the trace's (at 4 ranks these part
# from a ring's: 3 blocks to 3 peers, 3 whole buffers to the next).
"$HS_BIN" train "${tiny[@]}" train.reproducibility=layout train.out_dir="$work/layout_one" \
    > "$work/layout_one.txt" 2>&1 || fail "layout_one: $(tail -3 "$work/layout_one.txt")"
layout() { # NAME SHARD EXPECTED...: the run, its weights, its sums' paths, its link bytes
    local name=$1 shard=$2
    shift 2
    NODUMP=1 multi "$name" fsdp_config.dp_shard_size="$shard" train.reproducibility=layout || return
    cmp -s "$work/layout_one/model.safetensors" "$work/$name/model.safetensors" ||
        fail "$name across the hosts: the weights differ from one process's"
    python3 - "$work/$name/trace/trace.json" "$@" <<'PY' || fail "$name: a sum did not run canonical"
import collections, json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"] if isinstance(t, dict) else t
seen = collections.defaultdict(set)
for e in ev:
    a = e.get("args", {})
    if e.get("cat") == "comm" and e["name"] in ("reduce_scatter", "all_reduce") \
            and a.get("dtype") == "float32" and a.get("group", "").startswith("fsdp"):
        seen[e["name"] + " " + a["group"]].add(a["path"])
print("layout's fp32 sums:", dict(seen))
assert sorted(seen) == sorted(sys.argv[2:]), (sorted(seen), sys.argv[2:])
assert all(p == {"canonical"} for p in seen.values()), seen
PY
    links "$name" fsdp_config.dp_shard_size="$shard" train.reproducibility=layout
}
layout l_layout 2 "reduce_scatter fsdp_shard" "all_reduce fsdp_replicate"
layout l_layout_fsdp4 4 "reduce_scatter fsdp_shard"
layout l_layout_ddp4 1 "all_reduce fsdp_replicate"
if [ -f "$work/l_fsdp.plan.json.inter" ] && [ -f "$work/l_packed.plan.json.inter" ]; then
    python3 - "$(cat "$work/l_fsdp.plan.json.inter")" "$(cat "$work/l_packed.plan.json.inter")" <<'PY' ||
import sys
full, packed = map(int, sys.argv[1:])
print("across the hosts: int8 + int4 + hpZ %d of fp32's %d bytes, %.1f%%" % (packed, full, 100 * packed / full))
sys.exit(0 if packed <= 0.30 * full else 1)
PY
        fail "the compressed run sends over 30% of the fp32 bytes across the hosts"
fi
hs_finish
