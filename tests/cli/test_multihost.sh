#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces joined by a veth pair,
# each with its own hostname (UTS namespace), and mpiexec across them
# (Open MPI over btl tcp between hosts, an rsh agent that enters the other
# host's namespace, 2 ranks per host). FSDP 4 and HSDP 2 x 2 with the
# replicate dimension across the hosts match the one-process run within
# 1e-5 (loss, grad norm, gradients, weights, logits, export); FSDP 4 with
# the secondary shard over each host's two ranks (hpZ) is FSDP 4's run
# bit for bit, its backward gathering inside the hosts. The trace
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
multi() { # NAME ARGS...: hypershard train on 4 ranks over the two hosts
    local name=$1
    shift
    ip netns exec "$a" unshare --uts sh -c 'hostname hostA; exec "$@"' sh \
        timeout 180 mpiexec --hostfile "$work/hosts" -n 4 --mca plm_rsh_agent "$work/agent.sh" \
        --mca btl self,vader,tcp --mca btl_tcp_if_include 10.77.0.0/24 \
        --mca oob_tcp_if_include 10.77.0.0/24 -x PATH \
        "$HS_BIN" train "${tiny[@]}" "$@" trace.enabled=true train.out_dir="$work/$name" \
        --dump "$work/$name/dump" > "$work/$name.txt" 2>&1 ||
        { fail "$name: exit $?: $(grep -v '^ ' "$work/$name.txt" | tail -5)"; return 1; }
}
multi fsdp4 fsdp_config.dp_shard_size=4 && hs_compare_runs one fsdp4 1e-5 "${files[@]}"
multi hsdp fsdp_config.dp_shard_size=2 && hs_compare_runs one hsdp 1e-5 "${files[@]}"
# hpZ: the backward gathers among each host's two ranks
multi hpz fsdp_config.dp_shard_size=4 fsdp_config.secondary_shard_size=2 &&
    hs_compare_runs fsdp4 hpz 0 "${files[@]}"

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
hs_finish
