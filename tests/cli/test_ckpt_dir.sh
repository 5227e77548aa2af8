#!/usr/bin/env bash
# checkpoint.dir is checked at start-up, on every rank, before anything is
# allocated or written: one under a regular file exits 2 naming it, and
# leaves no train.out_dir behind. A save that fails later (here the step
# directory's name is taken by a file) still leaves the run's weights in
# train.out_dir/model.safetensors, says so, and exits non-zero with the
# save's reason. A checkpoint.dir that a live run holds (its .lock names a
# running pid on this host) exits 2 at once naming the holder; the lock of a
# run that is gone is recovered; a finished run leaves no lock.
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 120
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch ckpt_dir
tiny=("${HS_TINY[@]}" train.global_batch_size=4 train.micro_batch_size=2 train.eval_every=0
      train.steps=2)

touch "$work/a_file"
for n in 1 2; do
    hs_run "$n" "under_file_$n" fsdp_config.dp_shard_size="$n" checkpoint.dir="$work/a_file/ck" \
        train.out_dir="$work/never_$n"
    [ "$rc" -eq 2 ] || fail "checkpoint.dir under a file on $n rank(s): exit $rc, want 2"
    grep -q "checkpoint.dir = $work/a_file/ck: $work/a_file is not a directory" \
        "$work/under_file_$n.log" || fail "not named on $n rank(s): $(cat "$work/under_file_$n.log")"
    [ ! -e "$work/never_$n" ] || fail "a refused checkpoint.dir left train.out_dir behind"
done

mkdir -p "$work/ck"
touch "$work/ck/step-2"
hs_run 2 save_fails fsdp_config.dp_shard_size=2 checkpoint.dir="$work/ck" train.out_dir="$work/out"
[ "$rc" -ne 0 ] || fail "a failed final save exited 0"
grep -q "cannot rename $work/ck/.tmp-step-2 to $work/ck/step-2" "$work/save_fails.log" \
    || fail "the save's reason is missing: $(cat "$work/save_fails.log")"
grep -q "the weights after step 2 are in $work/out/model.safetensors" "$work/save_fails.log" \
    || fail "the weights were not announced"
[ -s "$work/out/model.safetensors" ] || fail "no model.safetensors after a failed save"
[ "$(wc -l < "$work/out/metrics.jsonl")" -eq 2 ] || fail "metrics.jsonl lacks steps"
# the lock
sleep 60 &
live=$!
mkdir -p "$work/held"
printf 'pid %d\nhost %s\nstarted 2026-01-01T00:00:00Z\n' "$live" "$(hostname)" > "$work/held/.lock"
hs_run 2 held fsdp_config.dp_shard_size=2 checkpoint.dir="$work/held" train.out_dir="$work/held_out"
[ "$rc" -eq 2 ] || fail "a held checkpoint.dir: exit $rc, want 2"
grep -q "checkpoint.dir = $work/held is in use by another run: pid $live on host $(hostname), started 2026-01-01T00:00:00Z" \
    "$work/held.log" || fail "the holder is not named: $(cat "$work/held.log")"
[ ! -e "$work/held_out" ] || fail "a refused run left train.out_dir behind"
kill "$live" 2> /dev/null
wait "$live" 2> /dev/null
# the same lock, now of a pid that is gone
hs_run 2 stale fsdp_config.dp_shard_size=2 checkpoint.dir="$work/held" train.out_dir="$work/stale_out"
[ "$rc" -eq 0 ] || fail "a stale lock was not recovered: exit $rc: $(cat "$work/stale.log")"
grep -q "removed the stale lock of pid $live" "$work/stale.log" || fail "stale lock recovery not logged"
[ ! -e "$work/held/.lock" ] || fail "a finished run left its lock"
[ -d "$work/held/step-2" ] || fail "the run after recovery saved nothing"
# Room for one checkpoint by the plan's estimate, checked at start-up: a
# 256 KiB file system cannot hold the tiny model's weights and AdamW state.
mkdir -p "$work/small"
if mount -t tmpfs -o size=256k tmpfs "$work/small" 2> /dev/null; then
    hs_run 2 no_room fsdp_config.dp_shard_size=2 checkpoint.dir="$work/small/ck" \
        train.out_dir="$work/no_room"
    umount "$work/small"
    [ "$rc" -eq 2 ] || fail "no room: exit $rc, want 2"
    grep -q "checkpoint.dir = $work/small/ck: $work/small has .* MiB free and one checkpoint" \
        "$work/no_room.log" || fail "no room: $(tail -3 "$work/no_room.log")"
    [ ! -e "$work/no_room" ] || fail "no room: train.out_dir was written"
else
    echo "note: cannot mount a tmpfs here; the free-space check is not exercised"
fi
hs_finish
