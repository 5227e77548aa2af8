#!/usr/bin/env bash
# RFC 000 §8.5 for tensor parallelism, read from the merged Chrome trace of
# real runs: the TP tail all-reduces exactly the TP-Replicate gradients
# (the 5 norm weights of a 2-block model: never a TP-sharded parameter),
# once per synchronising micro-batch, on the "tp" group, and only after
# every FSDP reduce-scatter and HSDP all-reduce of that backward has
# finished; TP2 x HSDP 2x2 shows RS(S) -> AR(R) -> AR(TP). Pure FSDP/HSDP
# issues no collective on the tp group at all.
# HS_MPI_RANKS: 8
# HS_TEST_TIMEOUT: 180
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch tptrace
# 2 steps x 2 micro-batches per step, each synchronising (the default)
tiny=("${HS_TINY[@]}" model.n_heads=4 model.n_kv_heads=2 train.micro_batch_size=2
      train.global_batch_size=8 train.steps=2 train.eval_every=0 trace.enabled=true)

check() { # RUN SHARD_BYTES_OF_A_NORM tp|none DP_GROUPS_BEFORE_THE_TAIL
    python3 - "$work/$1/trace/trace.json" "$2" "$3" "${4:-}" <<'PY'
import json, sys
path, norm_bytes, expect_tp = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "tp"
want_groups = set(sys.argv[4].split(",")) if sys.argv[4] else set()
t = json.load(open(path))
ev = t["traceEvents"] if isinstance(t, dict) else t
dp = {"fsdp_shard", "fsdp_replicate", "fsdp"}
ranks = sorted({e["pid"] for e in ev if e.get("cat") == "comm"})
for rank in ranks:
    comm = sorted((e for e in ev if e.get("cat") == "comm" and e["pid"] == rank),
                  key=lambda e: e["ts"])
    tp = [e for e in comm if e["args"]["group"] == "tp"]
    if not expect_tp:
        assert not tp, f"rank {rank}: {len(tp)} collectives on the tp group without TP"
        continue
    is_tail = lambda e: (e["name"] == "all_reduce" and e["args"]["group"] == "tp"
                         and e["args"]["bytes"] == norm_bytes)
    tails = [i for i, e in enumerate(comm) if is_tail(e)]
    assert len(tails) == 5 * 4, f"rank {rank}: {len(tails)} TP tail all-reduces, expected 20"
    # bursts of 5 in a row, nothing in between
    bursts = [tails[k:k + 5] for k in range(0, len(tails), 5)]
    for b in bursts:
        assert b == list(range(b[0], b[0] + 5)), f"rank {rank}: TP tail interleaved: {b}"
        first = comm[b[0]]
        # every DP reduction before the tail (since the last forward all-gather) has ended
        j = b[0] - 1
        reds = []
        while j >= 0 and comm[j]["name"] != "all_gather":
            e = comm[j]
            if e["args"]["group"] in dp and e["name"] in ("reduce_scatter", "all_reduce"):
                reds.append(e)
                assert e["ts"] + e["dur"] <= first["ts"], \
                    f"rank {rank}: {e['name']} on {e['args']['group']} ends after the TP tail starts"
            j -= 1
        groups = {e["args"]["group"] for e in reds}
        assert groups == want_groups, f"rank {rank}: DP reductions on {groups} before the tail"
        # after the tail: no DP reduction of this backward (grad norm: <= 12 bytes)
        after = comm[b[-1] + 1] if b[-1] + 1 < len(comm) else None
        assert after is None or after["name"] == "all_gather" or after["args"]["bytes"] <= 12, \
            f"rank {rank}: {after['name']} on {after['args']['group']} after the TP tail"
    print(f"rank {rank}: {len(bursts)} TP tails of 5 norm all-reduces, each after its "
          f"{len(reds)} DP reductions on {sorted(groups)}")
PY
}

hs_train tp2_fsdp2 4 accelerator.tp_size=2 fsdp_config.dp_shard_size=2
check tp2_fsdp2 $((32 / 2 * 4)) tp fsdp_shard
hs_train tp2_hsdp 8 accelerator.tp_size=2 fsdp_config.dp_shard_size=2 train.global_batch_size=16
grep -q "shard degree 2, replicate degree 2" "$work/tp2_hsdp.txt"
check tp2_hsdp $((32 / 2 * 4)) tp fsdp_shard,fsdp_replicate
hs_train hsdp 4 fsdp_config.dp_shard_size=2
check hsdp 0 none
