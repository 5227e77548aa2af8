#!/usr/bin/env bash
# Trainer checkpoints across world sizes and layouts (docs/checkpoint.md,
# "Resume"): a checkpoint saved by 2-rank FSDP resumes on 4-rank FSDP, on
# 2x2 HSDP and on one process, and continues the uninterrupted loss curve
# within 1e-5 relative (fp32; only the reduction order differs); one process
# -> 3-rank FSDP (uneven shards) -> one process leaves every parameter,
# optimizer moment and the trainer state bit for bit equal; a checkpoint
# saved by 2x2 HSDP stores each replicated chunk once and is complete; a
# corrupt chunk on rank 1 is reported, with its reason, by rank 0.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 240
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch resume_reshard

tiny=("${HS_TINY[@]}" train.global_batch_size=8 train.micro_batch_size=1 train.eval_every=0
      optimizer.schedule.decay=constant optimizer.schedule.warmup_steps=2)

chunks_of() { # STEPDIR TENSOR: number of stored chunks
    python3 - "$1" "$2" <<'PY'
import json, sys
m = json.load(open(sys.argv[1] + "/metadata.json"))
print([len(t["chunks"]) for t in m["tensors"] if t["name"] == sys.argv[2]][0])
PY
}

test_fsdp2_checkpoint_resumes_on_fsdp4_hsdp_and_one_process() {
    hs_must_run 2 uninterrupted fsdp_config.dp_shard_size=2 train.steps=5 train.out_dir="$work/u"
    hs_must_run 2 stopped fsdp_config.dp_shard_size=2 train.steps=2 train.out_dir="$work/s" \
        checkpoint.dir="$work/ck"
    local layout
    for layout in "4 fsdp_config.dp_shard_size=4" "4 fsdp_config.dp_shard_size=2" \
                  "1 fsdp_config.dp_shard_size=1"; do
        set -- $layout
        hs_must_run "$1" "resume_$1_${2##*=}" "$2" train.steps=5 \
            train.out_dir="$work/r$1_${2##*=}" \
            checkpoint.dir="$work/ck_$1_${2##*=}" checkpoint.resume="$work/ck/step-2"
        close_curve "$work/u/metrics.jsonl" "$work/r$1_${2##*=}/metrics.jsonl" 3 5
    done
    # The 2x2 HSDP run's final save: replicas write each chunk once (the
    # first replicate group's two ranks), and the result is complete: one
    # process loads it and saves the same bytes.
    local files
    files=$(cd "$work/ck_4_2/step-5" && ls rank-*.bin | tr '\n' ' ')
    [ "$files" = "rank-0.bin rank-1.bin " ] || fail "HSDP 2x2 wrote data files '$files'"
    "$HS_BIN" ckpt verify "$work/ck_4_2" > /dev/null 2>&1 || fail "the HSDP checkpoint does not verify"
    hs_must_run 1 hsdp_to_one train.steps=5 train.out_dir="$work/h1" checkpoint.dir="$work/h1ck" \
        checkpoint.resume="$work/ck_4_2"
    same_global "$work/ck_4_2/step-5" "$work/h1ck/step-5"
}

test_one_process_to_fsdp3_and_back_is_bitwise() {
    local tiny=("${tiny[@]}" train.global_batch_size=6) # a multiple of 3 ranks
    hs_must_run 1 one train.steps=2 train.out_dir="$work/one" checkpoint.dir="$work/a"
    # train.steps equals the checkpoint's step: load, train nothing, save.
    hs_must_run 3 three fsdp_config.dp_shard_size=3 train.steps=2 train.out_dir="$work/three" \
        checkpoint.dir="$work/b" checkpoint.resume="$work/a/step-2"
    hs_must_run 1 back train.steps=2 train.out_dir="$work/back" checkpoint.dir="$work/c" \
        checkpoint.resume="$work/b/step-2"
    local n
    n=$(chunks_of "$work/b/step-2" optim.model.embed_tokens.weight.exp_avg)
    [ "$n" = 3 ] || fail "3-rank checkpoint stores $n chunks of exp_avg, want 3 (86+86+84 rows)"
    same_global "$work/a/step-2" "$work/b/step-2" "$work/c/step-2"
}

# A rank other than 0 that cannot load its part: its reason (the file, the
# tensor, both checksums) reaches the user through rank 0, with its rank.
test_a_corrupt_chunk_on_rank_1_is_reported_with_its_reason() {
    cp -r "$work/ck/step-2" "$work/corrupt"
    python3 -c "
import sys
b = bytearray(open(sys.argv[1], 'rb').read())
b[10] ^= 0x40
open(sys.argv[1], 'wb').write(bytes(b))" "$work/corrupt/rank-1.bin"
    hs_run 2 corrupt fsdp_config.dp_shard_size=2 train.steps=5 train.out_dir="$work/rc" \
        checkpoint.resume="$work/corrupt"
    [ "$rc" -ne 0 ] || fail "a corrupt checkpoint resumed"
    grep -q "checkpoint load failed on rank 1: checkpoint data file $work/corrupt/rank-1.bin is corrupted" \
        "$work/corrupt.log" || fail "rank 1's reason not printed: $(cat "$work/corrupt.log")"
}

test_fsdp2_checkpoint_resumes_on_fsdp4_hsdp_and_one_process
test_a_corrupt_chunk_on_rank_1_is_reported_with_its_reason
test_one_process_to_fsdp3_and_back_is_bitwise
hs_finish
