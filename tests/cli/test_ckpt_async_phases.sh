#!/usr/bin/env bash
# checkpoint.async moves a save's write and rank 0's publish off the
# training thread (docs/checkpoint.md, "Asynchronous save"); the publish
# must stay atomic wherever the process dies. HS_CKPT_TEST_KILL_PHASE
# _exit(9)s one rank at the end of each phase of step-4's background save:
# the snapshot (training thread), the data written and then fsynced (rank
# 1's writer thread), and on rank 0's publish thread the metadata written
# and synced, the rename to step-4, and `latest` replaced. Each time
# `latest` names a complete checkpoint that `ckpt verify` accepts (step-2
# before `latest` was replaced, step-4 after), and resume: auto from it
# ends at the uninterrupted run's loss curve and final weights, bit for
# bit.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 240
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch ckpt_async_phases

# Constant LR after warm-up, as in test_ckpt_async.sh; saves at 2, 4, 6.
tiny=("${HS_TINY[@]}" train.global_batch_size=8 train.micro_batch_size=2 train.eval_every=0
      train.log_every=1 optimizer.schedule.decay=constant optimizer.schedule.warmup_steps=2
      fsdp_config.dp_shard_size=2 train.steps=6 checkpoint.save_every=2 checkpoint.async=true)

# kill_at PHASE RANK LATEST: step-4's save killed on RANK after PHASE leaves
# `latest` at step-LATEST, which verifies and resumes to the uninterrupted run.
kill_at() {
    local phase=$1 rank=$2 want=$3 ck="$work/ck_$1" name="k_$1"
    HS_CKPT_TEST_KILL_STEP=4 HS_CKPT_TEST_KILL_PHASE=$phase HS_CKPT_TEST_KILL_RANK=$rank \
        hs_run 2 "$name" checkpoint.dir="$ck" train.out_dir="$work/$name"
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { fail "$phase: killed run exit $rc"; return; }
    grep -q "HS_CKPT_TEST_KILL_PHASE: exiting after the $phase phase of step-4" "$work/$name.log" \
        || { fail "$phase: the hook did not fire: $(tail -3 "$work/$name.log")"; return; }
    local got
    got=$(cat "$ck/latest" 2>/dev/null)
    [ "$got" = "step-$want" ] || fail "$phase: latest is '$got', want step-$want"
    "$HS_BIN" ckpt verify "$ck" > "$work/verify_$phase.log" 2>&1 \
        || fail "$phase: latest does not verify: $(tail -2 "$work/verify_$phase.log")"
    # Killed after the rename, before `latest`: step-4 is there and complete,
    # but not the latest; the resumed run saves step-4 over it.
    if [ "$phase" = publish ]; then
        "$HS_BIN" ckpt verify "$ck/step-4" > /dev/null 2>&1 || fail "publish: step-4 does not verify"
    elif [ "$want" = 2 ] && [ -e "$ck/step-4" ]; then
        fail "$phase: step-4 was published before every phase before the rename ended"
    fi
    hs_must_run 2 "r_$phase" checkpoint.dir="$ck" checkpoint.resume=auto \
        train.out_dir="$work/$name"
    grep -q "resumed from $ck/step-$want: step $want of 6" "$work/r_$phase.log" \
        || fail "$phase: no resume from step-$want: $(grep -m1 resum "$work/r_$phase.log")"
    same_curve "$work/u/metrics.jsonl" "$work/$name/metrics.jsonl" 1 6
    cmp -s "$work/u/model.safetensors" "$work/$name/model.safetensors" \
        || fail "$phase: final weights differ from the uninterrupted run's"
    [ "$(cat "$ck/latest")" = step-6 ] || fail "$phase: the resumed run did not publish step-6"
    ls -d "$ck"/.tmp-step-* > /dev/null 2>&1 && fail "$phase: a temporary directory is left"
    echo "killed after $phase (rank $rank): latest step-$want, verified, resumed to the same weights"
}

hs_must_run 2 u checkpoint.dir="$work/ck_u" train.out_dir="$work/u"
[ -s "$work/u/model.safetensors" ] || die "the uninterrupted run wrote no weights"

kill_at snapshot 1 2
kill_at write 1 2
kill_at fsync 1 2
kill_at metadata 0 2
kill_at publish 0 2
kill_at latest 0 4
hs_finish
