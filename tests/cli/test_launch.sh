#!/usr/bin/env bash
# `hypershard launch` (docs/launch.md, "Restarting failed jobs"): a 4-rank
# FSDP run with one rank killed (kill -9) at a random step, twice, is
# restarted from its newest checkpoint and finishes on the uninterrupted
# run's curve (every step once, within 1e-5); a rank that dies on every
# start (HS_TRAIN_TEST_DIE_RANK) makes the launcher, after two failures
# without a newer checkpoint, go on with 2 ranks (dp_shard_size and the
# null global batch set, named in its output) on the same curve; a
# config error exits 2 without an attempt; a job that keeps failing ends
# after --max-restarts with its status; SIGTERM to the launcher stops the
# job with a checkpoint, exit 3 and no restart, and so does SIGHUP (a
# closed terminal); a second SIGTERM does not make the launcher return
# before its ranks have ended; SIGKILL of the launcher ends its job with a
# checkpoint (PR_SET_PDEATHSIG), so the same command starts again; a
# missing MPIEXEC (127), data.path (2) or a hostfile mpiexec refuses is not
# restarted.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 300
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_signal_grace
hs_scratch launch

# A constant learning rate after warm-up: runs of different train.steps
# share their first steps, so one uninterrupted run is every run's reference.
tiny=("${HS_TINY[@]}" train.micro_batch_size=2 train.eval_every=0 fsdp_config.dp_shard_size=4
      optimizer.schedule.decay=constant optimizer.schedule.warmup_steps=2)
steps=200
hs_must_run 4 uninterrupted train.steps=$steps train.out_dir="$work/u"

# start NAME ARGS...: the launcher in the background on 4 ranks; pid in $bg
start() {
    local name=$1
    shift
    "$HS_BIN" launch -n 4 "$@" "${tiny[@]}" train.out_dir="$work/$name" \
        checkpoint.dir="$work/ck_$name" checkpoint.resume=auto > "$work/$name.log" 2>&1 &
    bg=$!
}
last_step() { tail -1 "$work/$1/metrics.jsonl" 2> /dev/null | grep -o '"step":[0-9]*' | grep -o '[0-9]*$'; }
# until_step NAME S: wait until NAME's metrics.jsonl reaches step S
until_step() {
    for _ in $(seq 1200); do
        [ "$(last_step "$1")" -ge "$2" ] 2> /dev/null && return 0
        kill -0 "$bg" 2> /dev/null || die "$1 ended before step $2: $(tail -5 "$work/$1.log")"
        sleep 0.05
    done
    die "$1 never reached step $2"
}
# kill_rank NAME: kill -9 one rank of NAME's job, chosen at random
kill_rank() {
    local pids
    mapfile -t pids < <(pgrep -f "^$HS_BIN train .*train.out_dir=$work/$1 ")
    [ "${#pids[@]}" -eq 4 ] || die "$1: ${#pids[@]} ranks running, want 4"
    kill -9 "${pids[RANDOM % 4]}"
}

test_two_random_kills_continue_the_curve() {
    start kill --max-restarts 3 train.steps=$steps checkpoint.save_every=4
    local s1=$((5 + RANDOM % 30))
    until_step kill "$s1"
    kill_rank kill
    until_log kill "restart 1 of 3"
    # Past every step the first attempt logged: the kill lands in the second.
    local s2=$(($(last_step kill) + 3 + RANDOM % 20))
    until_step kill "$s2"
    kill_rank kill
    wait "$bg" || fail "kill: exit $?: $(tail -5 "$work/kill.log")"
    echo "killed a rank at steps >= $s1 and >= $s2"
    # each restart names the kill: mpiexec's report of signal 9 or, where a
    # survivor's stop reached the launcher first, the survivor naming the
    # rank that failed
    [ "$(grep -cE "restart [0-9] of 3: .*(exited on signal 9|stopping: rank [0-9] failed)" \
        "$work/kill.log")" -eq 2 ] ||
        fail "kill: not two restarts naming the killed rank: $(grep 'launch:' "$work/kill.log")"
    grep -q "done on 4 ranks after 2 restarts" "$work/kill.log" || fail "kill: not done after 2 restarts"
    # each restart resumed from a checkpoint, rather than starting afresh
    [ "$(grep -c "resumed from $work/ck_kill/step-[1-9]" "$work/kill.log")" -eq 2 ] ||
        fail "kill: not two resumes from a checkpoint"
    close_curve "$work/u/metrics.jsonl" "$work/kill/metrics.jsonl" 1 $steps
}

test_a_rank_that_always_dies_leaves_two_ranks_on_the_same_curve() {
    # 4 steps on 4 ranks, then rank 3 dies at every start: two failures
    # without a newer checkpoint, then 2 ranks (3 cannot keep global batch 8).
    start shrink train.steps=4 checkpoint.save_every=2
    wait "$bg" || die "shrink, first part: $(tail -5 "$work/shrink.log")"
    mv "$work/shrink.log" "$work/shrink_first.log"
    HS_TRAIN_TEST_DIE_RANK=3 start shrink --min-ranks 2 train.steps=12 checkpoint.save_every=2
    wait "$bg" || fail "shrink: exit $?: $(tail -5 "$work/shrink.log")"
    grep -q "2 ranks instead of 4 (two failures without a newer checkpoint); global batch 8 kept; fsdp_config.dp_shard_size 4 -> 2, train.global_batch_size null -> 8" \
        "$work/shrink.log" || fail "shrink: the change is not named: $(grep 'launch:' "$work/shrink.log")"
    grep -q "done on 2 ranks after 2 restarts" "$work/shrink.log" || fail "shrink: not done on 2 ranks"
    grep -q "resumed from $work/ck_shrink/step-4" "$work/shrink.log" || fail "shrink: did not resume step-4"
    close_curve "$work/u/metrics.jsonl" "$work/shrink/metrics.jsonl" 1 12
}

test_errors_and_limits() {
    hs_expect_exit 2 bad_key "unknown key bogus.key" launch -n 4 "${tiny[@]}" bogus.key=1 \
        checkpoint.dir="$work/ck_bad"
    grep -q "attempt" "$work/bad_key.log" && fail "bad_key: a job was started"
    hs_expect_exit 2 no_ckpt "checkpoint.dir is null" launch -n 4 "${tiny[@]}"
    hs_expect_exit 2 min_ranks "exceeds" launch -n 2 --min-ranks 3 "${tiny[@]}" checkpoint.dir="$work/c"
    HS_TRAIN_TEST_DIE_RANK=1 hs_expect_exit 137 give_up "giving up after 1 restart: .*rank 1 .*signal 9" \
        launch -n 4 --max-restarts 1 "${tiny[@]}" train.out_dir="$work/g" checkpoint.dir="$work/ck_g"
}

test_sigterm_stops_with_a_checkpoint_and_no_restart() {
    start term train.steps=100000 checkpoint.save_every=1000
    until_step term 3
    kill -TERM "$bg"
    local rc=0
    wait "$bg" || rc=$?
    [ "$rc" -eq 3 ] || fail "term: exit $rc, want 3: $(tail -5 "$work/term.log")"
    grep -q "attempt 2" "$work/term.log" && fail "term: restarted after SIGTERM"
    local step
    step=$(grep -o "stopped by a signal; the newest checkpoint is step [0-9]*" "$work/term.log" | grep -o '[0-9]*$')
    [ -n "$step" ] && [ -d "$work/ck_term/step-$step" ] || fail "term: no checkpoint named: $(tail -3 "$work/term.log")"
}

# ranks_of NAME: how many ranks of NAME's job are running
ranks_of() { pgrep -c -f "^$HS_BIN train .*train.out_dir=$work/$1 " || true; }
# no_ranks_within NAME SECONDS: every rank of NAME's job has ended in time
no_ranks_within() {
    for _ in $(seq $(($2 * 20))); do
        [ "$(ranks_of "$1")" -eq 0 ] && return 0
        sleep 0.05
    done
    fail "$1: $(ranks_of "$1") ranks still running $2 s after the launcher ended"
}
newest() { ls -d "$work/ck_$1"/step-* 2> /dev/null | sort -t- -k2 -n | tail -1; }

test_signals_end_the_job_with_the_launcher() {
    local rc
    # a closed terminal: SIGHUP stops the job as SIGTERM does
    start hup train.steps=100000 checkpoint.save_every=1000
    until_step hup 3
    kill -HUP "$bg"
    rc=0 && wait "$bg" || rc=$?
    [ "$rc" -eq 3 ] || fail "hup: exit $rc, want 3: $(tail -5 "$work/hup.log")"
    no_ranks_within hup 1
    # a second SIGTERM 0.3 s after the first is not passed on: the launcher
    # returns only after its ranks have saved and ended, and nothing is
    # published after it
    start term2 train.steps=100000 checkpoint.save_every=1000
    until_step term2 3
    kill -TERM "$bg"
    sleep 0.3
    kill -TERM "$bg" 2> /dev/null
    rc=0 && wait "$bg" || rc=$?
    [ "$rc" -eq 3 ] || fail "term2: exit $rc, want 3: $(tail -5 "$work/term2.log")"
    no_ranks_within term2 1
    local before after
    before=$(newest term2)
    sleep 2
    after=$(newest term2)
    [ "$before" = "$after" ] || fail "term2: $after published after the launcher ended ($before)"
    # SIGKILL of the launcher: its mpiexec gets SIGTERM, the ranks stop
    # with a checkpoint and release the lock, so the same command starts
    start killed train.steps=100000 checkpoint.save_every=1000
    until_step killed 3
    kill -KILL "$bg"
    wait "$bg" 2> /dev/null
    no_ranks_within killed 30
    local saved
    saved=$(newest killed)
    [ -n "$saved" ] || fail "killed: no checkpoint after the launcher was killed"
    start killed train.steps=$((${saved##*-} + 3)) checkpoint.save_every=1000
    rc=0 && wait "$bg" || rc=$?
    [ "$rc" -eq 0 ] || fail "killed: the same command again: exit $rc: $(tail -5 "$work/killed.log")"
    # failures a restart cannot heal end at the first attempt
    MPIEXEC=/nonexistent/mpiexec hs_expect_exit 127 no_mpiexec "not restarting: the job could not be started" \
        launch -n 4 "${tiny[@]}" train.out_dir="$work/nm" checkpoint.dir="$work/ck_nm"
    hs_expect_exit 2 no_data "not restarting: a usage or configuration error" \
        launch -n 4 "${tiny[@]}" data.source=text data.path="$work/missing.txt" \
        train.out_dir="$work/nd" checkpoint.dir="$work/ck_nd"
    # a hostfile mpiexec refuses (a key it does not know) while its host answers
    printf 'localhost slots=4 colour=blue\n' > "$work/bad.hosts"
    hs_expect_exit 2 bad_hosts "not restarting: mpiexec refuses to start 4 ranks on the hostfile" \
        launch --hostfile "$work/bad.hosts" "${tiny[@]}" train.out_dir="$work/bh" checkpoint.dir="$work/ck_bh"
    grep -q "attempt 2" "$work/no_data.log" "$work/no_mpiexec.log" "$work/bad_hosts.log" &&
        fail "an unhealable failure was restarted"
}

# A latest that does not verify is passed over before the first attempt,
# as before a restart: attempt 1 resumes from step-2 and finishes.
test_an_unverifiable_latest_is_passed_over_at_the_first_attempt() {
    hs_must_run 4 v0 train.steps=4 checkpoint.save_every=2 train.out_dir="$work/v" \
        checkpoint.dir="$work/ck_v"
    truncate -s 10 "$work/ck_v/step-4/rank-1.bin"
    local rc=0
    "$HS_BIN" launch -n 4 "${tiny[@]}" train.steps=6 train.out_dir="$work/v" \
        checkpoint.dir="$work/ck_v" checkpoint.resume=auto > "$work/v.log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || fail "unverifiable latest: exit $rc: $(tail -5 "$work/v.log")"
    grep -q "attempt 1 resumes from the newest step that does" "$work/v.log" ||
        fail "unverifiable latest: not passed over: $(grep 'launch:' "$work/v.log")"
    grep -q "attempt 1:.*checkpoint.resume=$work/ck_v/step-2" "$work/v.log" ||
        fail "unverifiable latest: attempt 1 did not resume from step-2"
    grep -q "attempt 2" "$work/v.log" && fail "unverifiable latest: a restart was needed"
}

# The cause a restart names is the rank that exited non-zero first, from
# Open MPI's "Process name" block, not a survivor's stop message printed
# as mpiexec ended it (an mpiexec stand-in prints Open MPI's lines).
test_the_cause_is_the_rank_that_exited_first() {
    cat > "$work/fake_mpiexec" <<'SH'
#!/bin/sh
echo "hypershard train: Terminated received: stopping after this step" >&2
echo "mpiexec detected that one or more processes exited with non-zero status, thus causing" >&2
echo "the job to be terminated. The first process to do so was:" >&2
echo "" >&2
echo "  Process name: [[13662,1],1]" >&2
echo "  Exit code:    1" >&2
exit 1
SH
    chmod +x "$work/fake_mpiexec"
    MPIEXEC="$work/fake_mpiexec" hs_expect_exit 1 cause \
        "giving up after 1 restart: world rank 1 exited non-zero first (exit code 1)" \
        launch -n 4 --max-restarts 1 "${tiny[@]}" train.out_dir="$work/cause" checkpoint.dir="$work/ck_cause"
    # srun may report a survivor's exit before the task a signal ended
    cat > "$work/fake_srun" <<'SH'
#!/bin/sh
echo "srun: error: node1: task 0: Exited with exit code 1" >&2
echo "srun: error: node1: task 2: Killed" >&2
exit 1
SH
    chmod +x "$work/fake_srun"
    MPIEXEC="$work/fake_srun" hs_expect_exit 1 srun_cause \
        "giving up after 1 restart: srun: error: node1: task 2: Killed" \
        launch -n 4 --max-restarts 1 "${tiny[@]}" train.out_dir="$work/cause" checkpoint.dir="$work/ck_cause"
}

test_two_random_kills_continue_the_curve
test_the_cause_is_the_rank_that_exited_first
test_an_unverifiable_latest_is_passed_over_at_the_first_attempt
test_signals_end_the_job_with_the_launcher
test_a_rank_that_always_dies_leaves_two_ranks_on_the_same_curve
test_errors_and_limits
test_sigterm_stops_with_a_checkpoint_and_no_restart
hs_finish
