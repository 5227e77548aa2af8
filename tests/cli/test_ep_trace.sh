#!/usr/bin/env bash
# The expert-parallel exchanges, read from the merged trace of real runs
# (EP 2 x EDP shard 2 on 4 ranks, 2 blocks, 1 step of 2 micro-batches):
# per block and micro-batch, forward issues one all_to_all of the per-expert
# row counts (E fp32) and two all_to_allv (rows out, outputs back), backward
# two more, all on the "ep" group on the critical queue; what rank a sends
# to b is what b receives from a; the outputs come back exactly as the rows
# went; every rank sends its tokens x top_k rows of dim floats; the grad
# norm sums the expert squares over ep once. Expert
# gradients are reduce-scattered on edp_shard, dense ones on fsdp_shard. A
# MoE run without EP issues nothing on an ep group.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 120
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch eptrace
tiny=("${HS_TINY[@]}" model.n_heads=4 model.n_kv_heads=2 train.micro_batch_size=2
      train.global_batch_size=16 train.steps=1 train.eval_every=0 trace.enabled=true
      model.arch=moe model.moe.num_experts=4 model.moe.top_k=2 model.moe.expert_ffn_dim=24)
hs_train ep 4 accelerator.ep_size=2 fsdp_config.dp_shard_size=4 fsdp_config.edp_shard_size=2
hs_train noep 4 fsdp_config.dp_shard_size=4
python3 - "$work/ep/trace/trace.json" "$work/noep/trace/trace.json" 32 16 <<'PY'
import json, sys
def events(path):
    t = json.load(open(path))
    ev = t["traceEvents"] if isinstance(t, dict) else t
    return [e for e in ev if e.get("cat") == "comm"]
ep_ev, noep_ev, C, T = events(sys.argv[1]), events(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
L, E, K, B, M = 2, 4, 2, 2, 2
assert not [e for e in noep_ev if e["args"]["group"] == "ep"], "ep collectives without EP"
ranks = sorted({e["pid"] for e in ep_ev})
assert len(ranks) == 4, ranks
seqs = {}
for r in ranks:
    ev = sorted((e for e in ep_ev if e["pid"] == r and e["args"]["group"] == "ep"),
                key=lambda e: e["args"]["seq"])
    # the step: up to the grad norm's all_reduce over ep (then the sample,
    # the export's all_gather)
    ev = ev[:[e["name"] for e in ev].index("all_reduce")]
    names = [e["name"] for e in ev]
    fwd = ["all_to_all", "all_to_allv", "all_to_allv"] * L
    bwd = ["all_to_allv", "all_to_allv"] * L
    assert names == (fwd + bwd) * M, f"rank {r}: {names}"
    for e in ev:
        assert e["args"]["queue"] == "critical", e
        if e["name"] == "all_to_all":
            assert e["args"]["bytes"] == E * 4, e
    v = [e for e in ev if e["name"] == "all_to_allv"]
    # forward pairs: rows out, outputs back (mirrored counts)
    for mb in range(M):
        f = v[mb * 4 * L: mb * 4 * L + 2 * L]
        for out, back in zip(f[0::2], f[1::2]):
            assert sum(out["args"]["send_counts"]) == B * T * K * C, out
            assert out["args"]["send_counts"] == back["args"]["recv_counts"], (out, back)
            assert out["args"]["recv_counts"] == back["args"]["send_counts"], (out, back)
    seqs[r] = {e["args"]["seq"]: e for e in v}
    red = {(e["name"], e["args"]["group"]) for e in ep_ev if e["pid"] == r}
    assert ("reduce_scatter", "edp_shard") in red and ("reduce_scatter", "fsdp_shard") in red, red
# what a sends to b is what b receives from a (EP groups: ranks 0,1 and 2,3)
for a in ranks:
    for b in ranks:
        if a // 2 != b // 2: continue
        for s, e in seqs[a].items():
            assert e["args"]["send_counts"][b % 2] == seqs[b][s]["args"]["recv_counts"][a % 2]
print(f"{len(ranks)} ranks: {M * L} count exchanges and {M * L * 4} all_to_allv each on ep; "
      "counts match across peers; expert grads on edp_shard, dense on fsdp_shard")
PY
echo ok
