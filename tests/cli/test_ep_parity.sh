#!/usr/bin/env bash
# Expert parallelism against one process on the same global batch (fp32,
# aux_loss_coef 0.01): EP 2 (W=2), EP 2 x EDP shard 2 (W=4), EP 4 (W=4), EP 2
# with HSDP on the experts (edp_replicate 2), EP 2 with activation
# checkpointing, EP 2 x CP 2, EP 2 x TP 2 with sequence parallel (each TP
# rank routes its own rows), EP 2 with comm_fusion, Muon at EP 2 x EDP
# shard 2 (each expert matrix orthogonalised whole) and, without EP, MoE
# under TP 2 with sequence parallel — loss and grad norm of every step, step-1
# gradients, weights after steps 1-3, logits and the export within 5e-5
# relative; and EP 2 in bf16 within 1e-2 of one bf16 process. The unit
# listing shows every routed expert in an expert unit on
# fsdp_moe_mesh and nowhere else, the dense shard degree equal to
# dp_shard_size and the expert shard degree equal to edp_shard_size, both
# from the shard shapes, and the shared expert on the dense mesh in its
# block's unit; metrics.jsonl carries the per-expert row counts,
# equal to the one-process run's.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 240
# HS_TEST_TIERS: avx2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch ep_parity
tiny=("${HS_FSDP_TINY[@]}" model.n_kv_heads=2 optimizer.eps=1e-3 train.global_batch_size=8
      model.arch=moe model.moe.num_experts=4 model.moe.top_k=2 model.moe.expert_ffn_dim=24
      model.moe.aux_loss_coef=0.01 model.moe.shared_expert_ffn_dim=16)
files=(model.safetensors dump/grads-step1.safetensors dump/weights-step1.safetensors
       dump/weights-step2.safetensors dump/logits-step2.safetensors)
compare() { hs_compare_runs "$1" "$2" 5e-5 "${files[@]}"; }

# units RUN RANKS EP DP_SHARD EDP_SHARD: the listing of every rank
units() {
    python3 - "$work/$1/dump" "$2" "$3" "$4" "$5" <<'PY'
import json, sys
d, ranks, ep, dp_shard, edp_shard = sys.argv[1], *map(int, sys.argv[2:])
E = 4
for r in range(ranks):
    u = json.load(open(f"{d}/units-rank{r}.json"))
    assert u["dense_shard_degree"] == dp_shard, u["dense_shard_degree"]
    assert u["expert_shard_degree"] == edp_shard, u["expert_shard_degree"]
    for unit in u["units"]:
        for p in unit["params"]:
            routed = ".block_sparse_moe.experts." in p["fqn"]
            assert routed == unit["expert"], f"rank {r}: {p['fqn']} in unit {unit['name']}"
            if ".shared_expert." in p["fqn"]:
                assert unit["name"].startswith("model.layers.") and not unit["expert"], unit["name"]
            assert (p["mesh"] == "fsdp_moe_mesh") == routed, p
            want = edp_shard if routed else dp_shard
            assert p["shard_degree"] == want, (p["fqn"], p["shard_degree"], want)
            local0 = p["local_shape"][0]
            if routed:
                assert p["ep_degree"] == ep and local0 == E // ep, p
                assert p["local_offset"][0] == (r % ep) * (E // ep), (r, p["local_offset"])
            # the shard degree from the shapes: torch.chunk rows of dim 0
            chunk = -(-local0 // want)
            rows = p["shard_shape"][0]
            assert rows == max(min(local0 - p["shard_row_offset"], chunk), 0), p
            assert p["shard_row_offset"] % chunk == 0 or rows == 0, p
print(f"{ranks} ranks: experts only in expert units on fsdp_moe_mesh; dense shard degree "
      f"{dp_shard}, expert shard degree {edp_shard}")
PY
}

# tokens REF RUN: per-expert row counts in metrics.jsonl, equal and whole
tokens() {
    python3 - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
for x, y in zip(a, b):
    assert x["expert_tokens"] == y["expert_tokens"], (x["expert_tokens"], y["expert_tokens"])
    for layer in y["expert_tokens"]:
        assert sum(layer) == 8 * 16 * 2, layer  # global rows x top_k
print("expert_tokens equal to one process:", b[-1]["expert_tokens"])
PY
}

hs_train_dump one4 1 train.micro_batch_size=4
hs_train_dump one8 1 train.micro_batch_size=8
hs_train_dump ep2 2 accelerator.ep_size=2 fsdp_config.dp_shard_size=2
compare one4 ep2
units ep2 2 2 2 1
tokens one4 ep2
grep -q "2 expert units on fsdp_moe_mesh (ep 2, expert shard degree 1" "$work/ep2.txt"
hs_train_dump ep2e2 4 accelerator.ep_size=2 fsdp_config.dp_shard_size=4 fsdp_config.edp_shard_size=2
compare one8 ep2e2
units ep2e2 4 2 4 2
hs_train_dump ep4 4 accelerator.ep_size=4 fsdp_config.dp_shard_size=2
compare one8 ep4
units ep4 4 4 2 1
tokens one8 ep4
hs_train_dump ep2hsdp 4 accelerator.ep_size=2 fsdp_config.dp_shard_size=2
compare one8 ep2hsdp
grep -q "replicate degree 2)" "$work/ep2hsdp.txt"
hs_train_dump ep2ac 2 accelerator.ep_size=2 fsdp_config.dp_shard_size=2 train.activation_checkpointing=true
compare one4 ep2ac
hs_train_dump ep2cp2 4 accelerator.ep_size=2 accelerator.cp_size=2 fsdp_config.dp_shard_size=2
compare one4 ep2cp2
hs_train_dump one2 1 train.micro_batch_size=2
hs_train_dump tp2sp 2 accelerator.tp_size=2 accelerator.sequence_parallel=true
compare one2 tp2sp
tokens one2 tp2sp
hs_train_dump ep2tp2 4 accelerator.ep_size=2 accelerator.tp_size=2 accelerator.sequence_parallel=true \
    fsdp_config.dp_shard_size=2
compare one4 ep2tp2
tokens one4 ep2tp2
hs_train_dump ep2fuse 2 accelerator.ep_size=2 fsdp_config.dp_shard_size=2 fsdp_config.comm_fusion=true
compare one4 ep2fuse
hs_train_dump one8muon 1 train.micro_batch_size=8 optimizer._target_=muon
hs_train_dump ep2e2muon 4 accelerator.ep_size=2 fsdp_config.dp_shard_size=4 \
    fsdp_config.edp_shard_size=2 optimizer._target_=muon
compare one8muon ep2e2muon
bf16=(fsdp_config.mix_precision.param_dtype=bfloat16)
hs_train_dump one4bf16 1 train.micro_batch_size=4 "${bf16[@]}"
hs_train_dump ep2bf16 2 accelerator.ep_size=2 fsdp_config.dp_shard_size=2 "${bf16[@]}"
hs_compare_runs one4bf16 ep2bf16 1e-2 "${files[@]}"
echo ok
