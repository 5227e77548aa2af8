#!/usr/bin/env bash
# `hypershard generate` and `hypershard eval` on a trained run's weights
# (--run) and on its checkpoint (--ckpt, resharded on load): eval equals the
# run's own last val loss, on one process and at PP 2; the greedy
# continuation is the same on one process, data parallel over 2 ranks,
# PP 2 and TP 2; a seeded sampled continuation (temperature 0.8, top-k 20)
# is the same on one process and at PP 2, and another seed changes it; the
# per-layer KV cache gives the text of the full forward (--no-kv-cache),
# also past seq_len, on one process, TP 2 and PP 2; the
# text is streamed after the prompt on stdout. A run dir or checkpoint that
# does not exist and a missing prompt exit 2 with the path named; weights
# that do not fit the model's config exit 1 naming the tensor.
# generate and eval run forward only: on a model whose weights are most of
# the memory (27M parameters, 110 MiB), neither holds the gradients and
# Adam states a training step would (3x the weights more), nor a copy of
# the fp32 weights, which one process reads where the file maps them (the
# log says so): peak RSS under 1.8x the weights (4.4x before the training
# state was left out, 2.3-2.4x before the copy was).
# HS_MPI_RANKS: 2
# HS_TEST_TIMEOUT: 180
set -u
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
hs_scratch generate
# 200 steps: a model whose text depends on the positions, so a cache that
# got them wrong would show
tiny=("${HS_TINY[@]}" model.n_heads=4 model.n_kv_heads=2 train.steps=200 train.eval_every=200)
hs_must_run 1 train train.out_dir="$work/run" checkpoint.dir="$work/ck"

gen() { # OUT RANKS ARGS...: generate into $work/OUT.txt (stdout only)
    local out=$1 n=$2
    shift 2
    local launch=()
    [ "$n" -gt 1 ] && launch=("$MPIEXEC" -n "$n")
    timeout 120 "${launch[@]}" "$HS_BIN" generate "$@" > "$work/$out.txt" 2> "$work/$out.err" \
        || fail "generate $out: exit $? $(tail -3 "$work/$out.err")"
}
same() { cmp -s "$work/$1.txt" "$work/$2.txt" || fail "$1 and $2 differ: $(cat "$work/$1.txt") | $(cat "$work/$2.txt")"; }

p=(--prompt "The bird " --max-new-tokens 24)
gen g_run 1 --run "$work/run" "${p[@]}"
grep -q "^The bird " "$work/g_run.txt" || fail "the output does not start with the prompt: $(cat "$work/g_run.txt")"
[ "$(wc -c < "$work/g_run.txt")" -eq $((9 + 24 + 1)) ] || fail "not 24 bytes after the prompt: $(cat "$work/g_run.txt")"
gen g_dp2 2 --ckpt "$work/ck" "${p[@]}"
gen g_pp2 2 --ckpt "$work/ck" "${p[@]}" accelerator.pp_size=2
gen g_tp2 2 --ckpt "$work/ck" "${p[@]}" accelerator.tp_size=2
same g_run g_dp2
same g_run g_pp2
same g_run g_tp2
s=(--temperature 0.8 --top-k 20)
gen s_run 1 --run "$work/run" "${p[@]}" "${s[@]}" --seed 7
gen s_pp2 2 --run "$work/run" "${p[@]}" "${s[@]}" --seed 7 accelerator.pp_size=2
gen s_other 1 --run "$work/run" "${p[@]}" "${s[@]}" --seed 8
same s_run s_pp2
cmp -s "$work/s_run.txt" "$work/s_other.txt" && fail "seeds 7 and 8 sampled the same text"

# The per-layer KV cache (the default) and the full forward of every window
# (--no-kv-cache) give the same text: greedy, and sampled for 40 tokens,
# which slides the 16-token window 33 times (the cache runs the re-based
# window again each time), on one process, TP 2, PP 2 and FSDP 2; CP and
# sequence parallelism keep the full forward and say why.
gen g_full 1 --run "$work/run" "${p[@]}" --no-kv-cache
same g_run g_full
grep -q "generate: a KV cache of" "$work/g_run.err" || fail "no KV cache on one process: $(cat "$work/g_run.err")"
grep -q "loaded weights from .* (read where the file maps them)" "$work/g_run.err" \
    || fail "one process copied its fp32 weights: $(cat "$work/g_run.err")"
grep -q "generate: a full forward per token (--no-kv-cache)" "$work/g_full.err" \
    || fail "--no-kv-cache did not run the full forward: $(cat "$work/g_full.err")"
k=(--prompt "The bird " --max-new-tokens 40 "${s[@]}" --seed 5)
gen k_run 1 --run "$work/run" "${k[@]}"
gen k_full 1 --run "$work/run" "${k[@]}" --no-kv-cache
gen k_tp2 2 --ckpt "$work/ck" "${k[@]}" accelerator.tp_size=2
gen k_tp2_full 2 --ckpt "$work/ck" "${k[@]}" --no-kv-cache accelerator.tp_size=2
gen k_pp2 2 --ckpt "$work/ck" "${k[@]}" accelerator.pp_size=2
gen k_pp2_full 2 --ckpt "$work/ck" "${k[@]}" --no-kv-cache accelerator.pp_size=2
gen k_fsdp2 2 --ckpt "$work/ck" "${k[@]}" fsdp_config.dp_shard_size=2
gen k_cp2 2 --ckpt "$work/ck" "${k[@]}" accelerator.cp_size=2
gen k_sp2 2 --ckpt "$work/ck" "${k[@]}" accelerator.tp_size=2 accelerator.sequence_parallel=true
for x in k_full k_tp2 k_tp2_full k_pp2 k_pp2_full k_fsdp2 k_cp2 k_sp2; do same k_run $x; done
[ "$(wc -c < "$work/k_run.txt")" -eq $((9 + 40 + 1)) ] || fail "not 40 bytes after the prompt: $(cat "$work/k_run.txt")"
for x in k_tp2 k_pp2 k_fsdp2; do
    grep -q "generate: a KV cache of" "$work/$x.err" || fail "$x ran without the KV cache: $(cat "$work/$x.err")"
done
grep -q "full forward per token (context parallelism" "$work/k_cp2.err" \
    || fail "CP did not say it keeps the full forward: $(cat "$work/k_cp2.err")"
grep -q "full forward per token (sequence parallelism" "$work/k_sp2.err" \
    || fail "sequence parallelism did not say it keeps the full forward: $(cat "$work/k_sp2.err")"

python3 - "$work/run/metrics.jsonl" "$work" <<'PY' || fail "eval differs from the run's val loss"
import json, subprocess, sys, os
want = [json.loads(l) for l in open(sys.argv[1])][-1]["val_loss"]
work, binary, mpi = sys.argv[2], os.environ["HS_BIN"], os.environ.get("MPIEXEC", "mpiexec")
for cmd in ([binary, "eval", "--run", f"{work}/run"],
            [mpi, "-n", "2", binary, "eval", "--ckpt", f"{work}/ck", "accelerator.pp_size=2"]):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = float(out.stdout.split()[2])
    assert abs(got - want) <= 1e-5 * abs(want), (cmd, got, want)
    print(f"eval {' '.join(cmd[-3:])}: {got} (run: {want})")
PY

# Forward only: no optimizer, no gradients. A 1-step run of 27M
# parameters (110 MiB in fp32); generate and eval from it on one process.
big=(model.dim=512 model.n_layers=6 model.n_heads=8 model.n_kv_heads=8 model.ffn_dim=1536
     model.vocab_size=8192 train.seq_len=64 train.micro_batch_size=1 train.global_batch_size=1
     train.steps=1 train.eval_every=0 data.val_fraction=0.01)
hs_must_run 1 train "${big[@]}" train.out_dir="$work/big"
python3 - "$HS_BIN" "$work/big" <<'PY' || fail "generate or eval held training state"
import os, resource, subprocess, sys
binary, run = sys.argv[1], sys.argv[2]
weights = os.path.getsize(f"{run}/model.safetensors")
for cmd in ([binary, "generate", "--run", run, "--prompt", "a", "--max-new-tokens", "1"],
            [binary, "eval", "--run", run]):
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    assert peak > before * 1024 or before == 0, "ru_maxrss did not move"
    # the weights file's pages, read in place (1x), + buffers; a copy of
    # the params would add 1x, a trainer's gradients and two Adam states 3x
    print(f"{cmd[1]}: peak RSS {peak / 2**20:.0f} MiB for {weights / 2**20:.0f} MiB of weights "
          f"({peak / weights:.2f}x)")
    assert peak < 1.8 * weights, (cmd[1], peak, weights)
    assert "(read where the file maps them)" in out.stderr, out.stderr
PY

hs_expect_exit 2 no_run "--run $work/nope: no config.yaml there" generate --run "$work/nope" --prompt x
hs_expect_exit 2 no_ckpt "--ckpt $work/nope" eval --ckpt "$work/nope"
hs_expect_exit 2 no_prompt "--prompt TEXT is required" generate --run "$work/run"
hs_expect_exit 2 both "exactly one of --run RUN_DIR or --ckpt DIR" eval --run "$work/run" --ckpt "$work/ck"
# weights that do not fit the model: a format error (exit 1), as for train --init-from
hs_expect_exit 1 mismatch "lm_head.weight has shape \[256, 32\] but parameter lm_head.weight needs \[256, 64\]" eval --run "$work/run" model.dim=64
hs_finish
