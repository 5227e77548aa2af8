#!/usr/bin/env bash
# `hypershard launch --hostfile` across two hosts (the two network
# namespaces of tests/cli/test_multihost.sh, 2 slots each): a 4-rank FSDP
# run loses a rank on hostB (kill -9) at a random step and hostB is taken
# away before the restart (its rsh agent refuses it). The launcher finds it
# gone, says so, goes on with 2 ranks on hostA (--min-ranks 2) from the
# newest checkpoint, and the run finishes on the one-host 4-rank curve
# (every step once, within 1e-5). Skips where namespaces cannot be made.
# HS_MPI_RANKS: 4
# HS_TEST_TIMEOUT: 300
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch launch_multihost
hs_two_hosts

tiny=("${HS_TINY[@]}" train.micro_batch_size=2 train.eval_every=0 fsdp_config.dp_shard_size=4
      optimizer.schedule.decay=constant optimizer.schedule.warmup_steps=2)
steps=16
hs_must_run 4 uninterrupted train.steps=$steps train.out_dir="$work/u"

# The launcher on hostA, the MPI settings in the environment, as a user's;
# mpiexec from PATH: run by its absolute path it would prefix the remote
# command with PATH settings the test's rsh agent cannot exec.
ip netns exec "$a" unshare --uts sh -c 'hostname hostA; exec "$@"' sh \
    env MPIEXEC=mpiexec OMPI_MCA_plm_rsh_agent="$work/agent.sh" OMPI_MCA_btl=self,vader,tcp \
    OMPI_MCA_btl_tcp_if_include=10.77.0.0/24 OMPI_MCA_oob_tcp_if_include=10.77.0.0/24 \
    "$HS_BIN" launch --hostfile "$work/hosts" --min-ranks 2 --max-restarts 2 "${tiny[@]}" \
    train.steps=$steps train.out_dir="$work/run" checkpoint.dir="$work/ck" \
    checkpoint.save_every=2 checkpoint.resume=auto > "$work/run.log" 2>&1 &
bg=$!
# At a random step past the first save's publication: the saves are
# asynchronous, so step-2 may still be on its way at step 3 on a busy
# machine, and the restart must have a checkpoint to resume.
s=$((3 + RANDOM % 6))
for _ in $(seq 1200); do
    n=$(tail -1 "$work/run/metrics.jsonl" 2> /dev/null | grep -o '"step":[0-9]*' | grep -o '[0-9]*$')
    [ "${n:-0}" -ge "$s" ] && [ -e "$work/ck/latest" ] && break
    kill -0 "$bg" 2> /dev/null || die "the run ended before step $s: $(tail -5 "$work/run.log")"
    sleep 0.05
done
victim=$(for p in $(ip netns pids "$b"); do
    grep -qa "^$HS_BIN" "/proc/$p/cmdline" 2> /dev/null && echo "$p"; done | head -1)
[ -n "$victim" ] || die "no rank runs on hostB: $(tail -5 "$work/run.log")"
touch "$work/gone-10.77.0.2"
kill -9 "$victim"
wait "$bg" || fail "launch: exit $?: $(tail -5 "$work/run.log")"
echo "killed a rank on hostB at step >= $s"
grep -q "host 10.77.0.2 is gone" "$work/run.log" || fail "hostB not found gone: $(grep 'launch:' "$work/run.log")"
grep -q "2 ranks instead of 4 (hosts are gone); global batch 8 kept; fsdp_config.dp_shard_size 4 -> 2" \
    "$work/run.log" || fail "the shrink is not named: $(grep 'launch:' "$work/run.log")"
grep -q "host 10.77.0.1 is gone" "$work/run.log" && fail "hostA taken for gone"
grep -q "done on 2 ranks after 1 restart" "$work/run.log" || fail "not done on 2 ranks after 1 restart"
grep -q "resumed from $work/ck/step-[1-9]" "$work/run.log" || fail "the restart did not resume a checkpoint"
close_curve "$work/u/metrics.jsonl" "$work/run/metrics.jsonl" 1 $steps
hs_finish
